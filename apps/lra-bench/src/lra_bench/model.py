"""The LRA encoder of Spectraformer Table 6 (after Chen et al. 2021's Skyformer code), with any attention.

Token and learned position embeddings (64), dropout, 2 pre-LayerNorm transformer blocks of width 64 with
2 heads of 32 and a feed-forward of 128, a final LayerNorm, mean pooling over the tokens that are not
padding, and a classifier MLP. Retrieval encodes both documents with the shared encoder and classifies
``[u, v, u * v, u - v]``:

    model = LRAClassifier(config.model, vocab_size=16, num_classes=10, pair=False, max_length=2000, seed=0)
    logits = model(tokens, key_padding_mask)                          # (B, L), (B, L) -> (B, 10)
    logits = model(tokens_0, mask_0, tokens_1, mask_1)                # Retrieval
"""

from __future__ import annotations

import torch
from torch import nn

import rf_attention
from lra_bench.config import ModelConfig


def create_attention(config: ModelConfig, *, seed: int) -> tuple[nn.Module, bool]:
    """The attention of one block and whether it applies attention dropout.

    ``rf_attention.create(config.attention, ...)`` with the output dropout, the feature count and
    ``seed`` (every layer draws its own random features). An attention that computes attention
    probabilities says so (``supports_attention_dropout``, ``SoftmaxAttention``); it gets
    ``config.attention_dropout``. Kernelized attentions have no probabilities to drop.

    Raises:
        ValueError: an unknown attention name or a bad option (from ``rf_attention``).
    """
    attention = rf_attention.create(
        config.attention,
        config.dim,
        config.num_heads,
        num_features=config.attention_features,
        dropout=config.dropout,
        seed=seed,
    )
    applies = getattr(attention, "supports_attention_dropout", False)
    if applies:
        attention.attention_dropout = config.attention_dropout
    return attention, applies and config.attention_dropout > 0


class Block(nn.Module):
    """Pre-LayerNorm transformer block: ``x + attn(LN(x))``, then ``x + mlp(LN(x))``."""

    def __init__(self, config: ModelConfig, *, seed: int) -> None:
        super().__init__()
        self.norm_1 = nn.LayerNorm(config.dim)
        self.attention, self.attention_dropout_applied = create_attention(config, seed=seed)
        self.norm_2 = nn.LayerNorm(config.dim)
        self.mlp = nn.Sequential(
            nn.Linear(config.dim, config.hidden_dim),
            nn.GELU(),
            nn.Dropout(config.dropout),
            nn.Linear(config.hidden_dim, config.dim),
            nn.Dropout(config.dropout),
        )

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor) -> torch.Tensor:
        """``x (B, N, dim)``, ``key_padding_mask (B, N)`` (True = padding) -> ``(B, N, dim)``."""
        x = x + self.attention(self.norm_1(x), key_padding_mask=key_padding_mask)
        return x + self.mlp(self.norm_2(x))


class LRAEncoder(nn.Module):
    """Tokens ``(B, N)`` -> one vector per sequence ``(B, dim)``: the mean over its non-padding tokens.

    Args:
        config: the model rows of Table 6 and the attention.
        vocab_size: token ids ``0 .. vocab_size - 1``, 0 being padding.
        max_length: positions with a learned embedding.
        seed: block ``i``'s attention draws its random features from ``1000 * seed + i``.
    """

    def __init__(self, config: ModelConfig, *, vocab_size: int, max_length: int, seed: int) -> None:
        super().__init__()
        self.max_length = max_length
        self.token_embedding = nn.Embedding(vocab_size, config.embedding_dim, padding_idx=0)
        self.position_embedding = nn.Embedding(max_length, config.embedding_dim)
        nn.init.normal_(self.token_embedding.weight, std=0.02)
        nn.init.normal_(self.position_embedding.weight, std=0.02)
        with torch.no_grad():
            self.token_embedding.weight[0].zero_()
        self.project = (
            nn.Identity()
            if config.embedding_dim == config.dim
            else nn.Linear(config.embedding_dim, config.dim)
        )
        self.dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(
            Block(config, seed=1000 * seed + layer) for layer in range(config.num_layers)
        )
        self.norm = nn.LayerNorm(config.dim)

    def forward(self, tokens: torch.Tensor, key_padding_mask: torch.Tensor) -> torch.Tensor:
        """``tokens (B, N)`` int64, ``key_padding_mask (B, N)`` bool -> pooled ``(B, dim)``."""
        n = tokens.shape[1]
        if n > self.max_length:
            raise ValueError(f"tokens: {n} positions, more than max_length={self.max_length}")
        positions = torch.arange(n, device=tokens.device)
        x = self.dropout(self.project(self.token_embedding(tokens) + self.position_embedding(positions)))
        for block in self.blocks:
            x = block(x, key_padding_mask)
        x = self.norm(x)
        keep = (~key_padding_mask).unsqueeze(-1).to(x.dtype)
        return (x * keep).sum(dim=1) / keep.sum(dim=1).clamp_min(1.0)


class LRAClassifier(nn.Module):
    """The encoder and a classifier MLP ``dim -> hidden_dim -> ReLU -> num_classes``.

    With ``pair=True`` (Retrieval) both documents go through the same encoder and the MLP reads
    ``[u, v, u * v, u - v]`` (width ``4 dim``).
    """

    def __init__(
        self,
        config: ModelConfig,
        *,
        vocab_size: int,
        num_classes: int,
        pair: bool,
        max_length: int,
        seed: int,
    ) -> None:
        super().__init__()
        self.pair = pair
        self.encoder = LRAEncoder(config, vocab_size=vocab_size, max_length=max_length, seed=seed)
        width = 4 * config.dim if pair else config.dim
        self.head = nn.Sequential(
            nn.Linear(width, config.hidden_dim), nn.ReLU(), nn.Linear(config.hidden_dim, num_classes)
        )

    @property
    def attention_dropout_applied(self) -> bool:
        """Whether the attentions apply attention dropout (see `create_attention`)."""
        return all(block.attention_dropout_applied for block in self.encoder.blocks)

    def forward(
        self,
        tokens: torch.Tensor,
        key_padding_mask: torch.Tensor,
        tokens_1: torch.Tensor | None = None,
        key_padding_mask_1: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits ``(B, num_classes)`` of a batch (Retrieval: of a batch of document pairs)."""
        u = self.encoder(tokens, key_padding_mask)
        if not self.pair:
            return self.head(u)
        if tokens_1 is None or key_padding_mask_1 is None:
            raise ValueError("tokens_1, key_padding_mask_1: a pair model needs the second documents")
        v = self.encoder(tokens_1, key_padding_mask_1)
        return self.head(torch.cat([u, v, u * v, u - v], dim=-1))
