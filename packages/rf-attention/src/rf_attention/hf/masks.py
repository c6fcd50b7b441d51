"""HF's attention masks read back as causality, key padding and packed ``cu_seqlens``."""

from __future__ import annotations

from typing import Any

import torch


def packed_cu_seqlens(kwargs: dict[str, Any], batch: int, n: int) -> torch.Tensor | None:
    """``cu_seqlens`` of packed sequences in one row, from ``cu_seq_lens_q`` or restarting ``position_ids``.

    As HF's flash-attention path: a single row whose position ids restart (every position equal to the
    first one starts a sequence); None for anything else (one sequence, several rows, a decoding step).
    Under ``torch.compile`` only ``cu_seq_lens_q`` is read (``DataCollatorWithFlattening(...,
    return_flash_attn_kwargs=True)``): telling packed ``position_ids`` from a left-padded prompt's reads
    their values on the host, which a traced graph cannot do.
    """
    given = kwargs.get("cu_seq_lens_q")
    if given is not None:
        if batch != 1:
            raise ValueError(f"cu_seq_lens_q: expected sequences packed into one row, got a batch of {batch}")
        return given if given.numel() > 2 else None
    positions = kwargs.get("position_ids")
    if positions is None or batch != 1 or n == 1 or positions.shape[-1] != n:
        return None
    if torch.compiler.is_compiling():
        return None
    positions = positions.reshape(-1)
    if bool(positions[0] != positions.min()):  # e.g. a left-padded prompt's positions: not packed
        return None
    starts = (positions == positions[0]).nonzero().view(-1)
    if starts.numel() < 2:
        return None
    end = torch.tensor([n], device=starts.device)
    return torch.cat([starts, end]).to(torch.int32)


def mask_allows_packing(
    attention_mask: torch.Tensor | None, cu_seqlens: torch.Tensor, n: int, causal: bool
) -> bool:
    """Whether HF's mask is plain (causal or full, no padding) or blocks per packed sequence.

    A mask with padding means the restarting positions are padding's (a left-padded prompt's position ids
    restart at its first token), as HF's flash-attention path reads them: not packed documents.
    """
    if attention_mask is None:
        return True
    if attention_mask.dim() != 4 or tuple(attention_mask.shape[-2:]) != (n, n):
        return False
    allowed = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
    allowed = allowed[0, 0]
    positions = torch.arange(n, device=allowed.device)
    plain = positions <= positions.unsqueeze(-1) if causal else torch.ones_like(allowed)
    sequence = torch.searchsorted(cu_seqlens[1:].to(positions.device).long(), positions, right=True)
    blocks = plain & (sequence == sequence.unsqueeze(-1))
    return torch.equal(allowed, plain) or torch.equal(allowed, blocks)


def key_padding_from_mask(
    attention_mask: torch.Tensor | None, n_q: int, n_k: int, causal: bool
) -> torch.Tensor | None:
    """HF's 4D mask ``(B, 1 or H, N_q, N_k)`` (bool, True = attend; or additive) as a key padding mask.

    The mask must be what causality (query ``i`` at position ``N_k - N_q + i``) and padded keys give;
    query rows that attend to nothing (padded queries) are not checked.

    Returns:
        bool ``(B, N_k)``, True at padded keys, or None where no key is padding.

    Raises:
        ValueError: another pattern (sliding window, packed sequences, per-head masks, additive biases).
    """
    if attention_mask is None:
        return None
    if attention_mask.dim() != 4 or tuple(attention_mask.shape[-2:]) != (n_q, n_k):
        raise ValueError(
            f"attention_mask: expected a 4D mask (B, 1, {n_q}, {n_k}), got {tuple(attention_mask.shape)}"
        )
    if attention_mask.dtype == torch.bool:
        allowed = attention_mask
    else:
        allowed = attention_mask > torch.finfo(attention_mask.dtype).min / 2
        if bool((attention_mask[allowed] != 0).any()):
            raise ValueError("attention_mask: additive biases other than 0 / -inf are not supported")
    if allowed.shape[1] != 1 and not bool((allowed == allowed[:, :1]).all()):
        raise ValueError("attention_mask: per-head masks are not supported")
    allowed = allowed[:, 0]  # (B, N_q, N_k)
    valid = allowed[:, -1, :] if causal else allowed.any(dim=-2)
    expected = valid.unsqueeze(-2).expand(-1, n_q, -1)
    if causal:
        positions = torch.arange(n_k, device=allowed.device)
        expected = expected & (positions <= positions[n_k - n_q :].unsqueeze(-1))
    rows_match = (allowed == expected).all(dim=-1) | ~allowed.any(dim=-1)
    if not bool(rows_match.all()):
        kind = "causal" if causal else "full"
        raise ValueError(
            f"attention_mask: RF attention supports {kind} attention with padded keys only; this mask has "
            "another pattern (sliding window, packed sequences with padding, or a static cache's offset?)"
        )
    return None if bool(valid.all()) else ~valid
