"""Batching: pad token sequences and return the key padding mask (True = padding)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from lra_data.tokenizers import PAD_ID


class Batch(NamedTuple):
    """A padded batch of single-document examples.

    Attributes:
        tokens: ``int64`` ``(B, L)``, padded with 0 on the right.
        key_padding_mask: ``bool`` ``(B, L)``, True where ``tokens`` is padding (as in
            ``torch.nn.MultiheadAttention``).
        labels: ``int64`` ``(B,)``.
    """

    tokens: torch.Tensor
    key_padding_mask: torch.Tensor
    labels: torch.Tensor


class PairBatch(NamedTuple):
    """A padded batch of two-document examples (Retrieval); each document padded on its own.

    Attributes:
        tokens_0: ``int64`` ``(B, L0)``, the first documents.
        key_padding_mask_0: ``bool`` ``(B, L0)``, True = padding.
        tokens_1: ``int64`` ``(B, L1)``, the second documents.
        key_padding_mask_1: ``bool`` ``(B, L1)``, True = padding.
        labels: ``int64`` ``(B,)``.
    """

    tokens_0: torch.Tensor
    key_padding_mask_0: torch.Tensor
    tokens_1: torch.Tensor
    key_padding_mask_1: torch.Tensor
    labels: torch.Tensor


def pad(sequences: Sequence[torch.Tensor], *, length: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad 1-d token tensors with 0 to ``length`` (default: the longest).

    Returns:
        ``(tokens (B, L) int64, key_padding_mask (B, L) bool)`` with True where padding.

    Raises:
        ValueError: no sequences, a sequence that is not 1-d, or one longer than ``length``.
    """
    if not sequences:
        raise ValueError("sequences: expected at least one sequence, got none")
    sizes = []
    for i, seq in enumerate(sequences):
        if not isinstance(seq, torch.Tensor) or seq.dim() != 1:
            shape = tuple(seq.shape) if isinstance(seq, torch.Tensor) else type(seq).__name__
            raise ValueError(f"sequences[{i}]: expected a 1-d token tensor, got {shape}")
        sizes.append(seq.numel())
    longest = max(sizes)
    if length is None:
        length = longest
    elif longest > length:
        i = sizes.index(longest)
        raise ValueError(f"length: sequences[{i}] has {longest} tokens, more than the fixed length {length}")
    tokens = torch.full((len(sequences), length), PAD_ID, dtype=torch.int64)
    for i, seq in enumerate(sequences):
        tokens[i, : sizes[i]] = seq
    positions = torch.arange(length)
    mask = positions[None, :] >= torch.tensor(sizes)[:, None]
    return tokens, mask


def collate(batch: Sequence[tuple[Any, int]], *, length: int | None = None) -> Batch | PairBatch:
    """Pad a list of dataset items into a `Batch` (or a `PairBatch` for Retrieval).

    Use as ``DataLoader(dataset, collate_fn=collate)``, or
    ``collate_fn=functools.partial(collate, length=1024)`` for a fixed length.

    Args:
        batch: items ``(tokens, label)`` or ``((tokens_0, tokens_1), label)`` as
            [`lra_data.load`][lra_data.load] returns them.
        length: pad to this length instead of the batch's longest sequence (Retrieval: each document).

    Raises:
        ValueError: an empty batch, a mix of single and paired items, or a sequence longer than ``length``.
    """
    if not batch:
        raise ValueError("batch: expected at least one item, got none")
    pair = isinstance(batch[0][0], tuple | list)
    if any(isinstance(item[0], tuple | list) != pair for item in batch):
        raise ValueError("batch: expected items all with one token tensor or all with a pair, got a mix")
    labels = torch.tensor([int(item[1]) for item in batch], dtype=torch.int64)
    if not pair:
        tokens, mask = pad([item[0] for item in batch], length=length)
        return Batch(tokens, mask, labels)
    tokens_0, mask_0 = pad([item[0][0] for item in batch], length=length)
    tokens_1, mask_1 = pad([item[0][1] for item in batch], length=length)
    return PairBatch(tokens_0, mask_0, tokens_1, mask_1, labels)
