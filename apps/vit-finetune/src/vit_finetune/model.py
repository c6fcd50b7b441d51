"""A small, readable Vision Transformer with timm's attribute names (Dosovitskiy et al. 2021).

Patches of ``patch_size`` pixels are embedded by a strided convolution, a class token is prepended, learned
position embeddings are added, ``depth`` pre-LayerNorm blocks follow, and the final LayerNorm of the class
token goes to a linear head:

    config = ViTConfig(image_size=16, patch_size=4, dim=32, depth=12, num_heads=2, mlp_dim=128,
                       num_classes=10)
    model = ViT(config)
    logits = model(images)                           # (B, 3, 16, 16) -> (B, 10)

The parameter names are timm's ``VisionTransformer`` ones (``patch_embed.proj``, ``cls_token``,
``pos_embed``, ``blocks.{i}.norm1``, ``blocks.{i}.attn.qkv``, ``blocks.{i}.attn.proj``, ``blocks.{i}.norm2``,
``blocks.{i}.mlp.fc1``/``act``/``fc2``, ``norm``, ``head``), so a timm checkpoint loads as it is and
``ralimp.replace_mlp`` finds the MLPs; `vit_finetune.weights` maps Hugging Face checkpoints onto them.
The attention is ``rf_attention.create("softmax", ...)``, whose ``qkv``/``proj`` layout is timm's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import rf_attention
from spectraformer_core import check_int


@dataclass(frozen=True)
class ViTConfig:
    """The shape of a ViT.

    Attributes:
        image_size: side of the square input images (pixels).
        patch_size: side of a patch; must divide ``image_size``.
        in_chans: input channels.
        num_classes: classes of the head.
        dim: token width.
        depth: transformer blocks.
        num_heads: attention heads; must divide ``dim``.
        mlp_dim: hidden width of each block's MLP.
        norm_eps: LayerNorm epsilon (timm: 1e-6, Hugging Face: 1e-12).
        dropout: dropout after the position embedding, the attention and MLP outputs.
    """

    image_size: int = 224
    patch_size: int = 16
    in_chans: int = 3
    num_classes: int = 1000
    dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_dim: int = 3072
    norm_eps: float = 1e-6
    dropout: float = 0.0

    def __post_init__(self) -> None:
        for name in ("image_size", "patch_size", "in_chans", "num_classes", "dim", "depth", "num_heads"):
            check_int(name, getattr(self, name), 1)
        if self.image_size % self.patch_size:
            raise ValueError(
                f"patch_size: expected a divisor of image_size={self.image_size}, got {self.patch_size}"
            )
        if self.dim % self.num_heads:
            raise ValueError(f"num_heads: expected a divisor of dim={self.dim}, got {self.num_heads}")

    @property
    def grid_size(self) -> int:
        """Patches along each side."""
        return self.image_size // self.patch_size


class PatchEmbed(nn.Module):
    """``(B, C, H, W)`` -> ``(B, N, dim)``: non-overlapping patches through one strided convolution."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.proj = nn.Conv2d(config.in_chans, config.dim, config.patch_size, stride=config.patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Patch tokens, row-major over the grid."""
        return self.proj(x).flatten(2).transpose(1, 2)


class Mlp(nn.Module):
    """``fc2(act(fc1(x)))`` with GELU, timm's ``Mlp`` layout (what ``ralimp.replace_mlp`` swaps)."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.dim, config.mlp_dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(config.mlp_dim, config.dim)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(..., dim)`` -> ``(..., dim)``."""
        return self.drop(self.fc2(self.act(self.fc1(x))))


class Block(nn.Module):
    """Pre-LayerNorm block: ``x + attn(norm1(x))``, then ``x + mlp(norm2(x))``."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(config.dim, eps=config.norm_eps)
        self.attn = rf_attention.create("softmax", config.dim, config.num_heads, dropout=config.dropout)
        self.norm2 = nn.LayerNorm(config.dim, eps=config.norm_eps)
        self.mlp = Mlp(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, N, dim)`` -> ``(B, N, dim)``."""
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """Vision Transformer classifier on the class token (see the module docstring)."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.config = config
        self.patch_embed = PatchEmbed(config)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, config.dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, config.grid_size**2 + 1, config.dim))
        self.pos_drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.depth))
        self.norm = nn.LayerNorm(config.dim, eps=config.norm_eps)
        self.head = nn.Linear(config.dim, config.num_classes)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Timm's ViT initialization: truncated normal (std 0.02) weights, zero biases, a zero head."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        fan_in = self.patch_embed.proj.in_channels * self.config.patch_size**2
        nn.init.trunc_normal_(self.patch_embed.proj.weight, std=math.sqrt(1 / fan_in))
        nn.init.zeros_(self.patch_embed.proj.bias)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.normal_(self.cls_token, std=1e-6)
        self.reset_head()

    @torch.no_grad()
    def reset_head(self, num_classes: int | None = None) -> None:
        """A zero-initialized head for ``num_classes`` (the fine-tuning start of Dosovitskiy et al.)."""
        if num_classes is not None and num_classes != self.head.out_features:
            self.head = nn.Linear(self.config.dim, num_classes, device=self.head.weight.device)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Images ``(B, C, H, W)`` -> normalized tokens ``(B, 1 + N, dim)``, the class token first."""
        expected = (self.config.in_chans, self.config.image_size, self.config.image_size)
        if x.dim() != 4 or tuple(x.shape[1:]) != expected:
            raise ValueError(
                f"x: expected images of shape (B, {', '.join(map(str, expected))}), got {tuple(x.shape)}"
            )
        x = self.patch_embed(x)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = self.pos_drop(x + self.pos_embed)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Images ``(B, C, H, W)`` -> logits ``(B, num_classes)``."""
        return self.head(self.forward_features(x)[:, 0])


def resample_pos_embed(pos_embed: torch.Tensor, grid_size: int) -> torch.Tensor:
    """Positions ``(1, 1 + g * g, D)`` resampled to a ``grid_size`` grid (bicubic, class token kept).

    What fine-tuning at another resolution than pretraining needs (Dosovitskiy et al., Sec. 3.2).
    """
    cls, grid = pos_embed[:, :1], pos_embed[:, 1:]
    old = math.isqrt(grid.shape[1])
    if old * old != grid.shape[1]:
        raise ValueError(f"pos_embed: expected 1 + a square number of positions, got {pos_embed.shape[1]}")
    if old == grid_size:
        return pos_embed
    grid = grid.reshape(1, old, old, -1).permute(0, 3, 1, 2).float()
    grid = F.interpolate(grid, size=(grid_size, grid_size), mode="bicubic", align_corners=False)
    grid = grid.permute(0, 2, 3, 1).reshape(1, grid_size * grid_size, -1).to(pos_embed.dtype)
    return torch.cat([cls, grid], dim=1)
