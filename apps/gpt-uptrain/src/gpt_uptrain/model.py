"""GPT-2 in the style of nanoGPT: one file, a frozen config, a ``from_pretrained`` that maps HF weights.

The model is GPT-2 (pre-LayerNorm blocks, learned positions, tied input/output embeddings, tanh GELU),
with two places where a part can be swapped:

- the attention of every block is ``rf_attention.create(config.attention, ..., causal=True)``: ``"softmax"``
  is exact causal attention (``scaled_dot_product_attention``), any ``"<component>-<matrix>"`` name a causal
  random-feature attention that is O(N) and strictly causal, ``"hedgehog"`` or ``"t2r"`` a learned map;
  ``config.attention_window`` makes it the sliding-window hybrid (exact softmax weights on the last
  ``attention_window`` positions);
- the MLP of the last ``last_k`` blocks becomes a linearized layer of ``ralimp`` (``config.layer``:
  ``"ralimp"``, ``"eugen"``, ``"snnk"``, ``"lowrank"``) made by ``ralimp.create`` at the feature budget
  ``config.features`` from the block's ``c_fc`` (random for training from scratch, pretrained when
  uptraining), fitting GPT-2's tanh GELU, optionally calibrated on the inputs a batch gives it.

Parameter names follow nanoGPT (``transformer.h.3.mlp.c_fc.weight``), except the attention's projections,
which are ``rf_attention``'s ``qkv`` and ``proj`` (HF's ``c_attn`` and ``c_proj``).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import ralimp
import rf_attention
from app_common.fields import RaLiMPFields, option
from app_common.schedules import param_groups
from gpt_uptrain import hf
from rf_attention.registry import feature_pair
from spectraformer_core import check_int

#: The activation of GPT-2's MLP (HF's ``gelu_new``), as ``ralimp`` registers it: the replacements fit it.
GELU_TANH = "gelu_tanh"

#: Options of the replacement layers at any budget, the paper's GPT-2 settings (ralimp.txt, App. "GPT-2"):
#: RaLiMP a degree-2 polynomial and at most one trainable atom ``(A, B, p, q)`` (the variance-aware fit
#: chooses 0 or 1) at 2 Gauss-Laguerre frequencies x
#: ``m = 4`` projections, ``tau = 3``; ``ralimp.create`` spends the rest of the budget on the polynomial.
#: One departure: RaLiMP's and SNNK's ``balance="auto"`` (not in the papers, whose literal value is 1),
#: which rescales ``x`` and ``w`` against each other so that the features' variance starts finite at
#: LayerNorm'd inputs (SNNK at balance 1 does not train: its loss stays at ln(vocab)).
LAYER_OPTIONS: dict[str, dict] = {
    "ralimp": {
        "poly_degree": 2,
        "num_atoms": 1,
        "num_freqs": 2,
        "freq_features": 4,
        "tau": 3.0,
        "balance": "auto",
    },
    "eugen": {"poly_degree": 2},
    "snnk": {"balance": "auto"},
}

#: The `GPTConfig` fields that say how the MLPs are replaced (the rest is the dense architecture).
REPLACEMENT_FIELDS = ("layer", "last_k", "features", "weight_matrix", "fit", "num_atoms")

#: The initializations of a replacement layer: ``lstsq`` (readout fitted on real activations) or ``psi``.
INITS = ("lstsq", "psi")


def has_feature_map(attention: str) -> bool:
    """True for an attention name with a feature map that can be learned.

    A ``"<component>-<matrix>"`` pair, ``performer``, or a learned map (``hedgehog``, ``t2r``: the names
    ``rf_attention.registry.feature_pair`` knows).
    """
    return attention.lower() == "performer" or feature_pair(attention) is not None


@dataclass(frozen=True)
class GPTConfig(RaLiMPFields):
    """The architecture (defaults: GPT-2 small's shape with nanoGPT's padded vocabulary).

    Attributes:
        block_size: context length (learned positions).
        vocab_size: token ids ``0 .. vocab_size - 1``.
        n_layer: blocks.
        n_head: attention heads.
        n_embd: width.
        dropout: dropout on embeddings, attention output and MLP output (0 for pretraining).
        bias: biases in the linear layers and LayerNorms (GPT-2 has them).
        layer_norm_epsilon: LayerNorm epsilon.
        attention: an ``rf_attention`` name, used causally.
        attention_features: random features of an RF attention, rows of a learned map's projection
            (ignored by ``softmax``).
        attention_window: the sliding-window hybrid's window (``rf_attention.create(..., window=w)``): the
            last ``w`` positions weighted by exact softmax weights, earlier ones by the feature map
            (a learned map's two parts mixed by its learned factor); 0: none.
        learnable_attention: an RF attention's feature maps are learned, one weight matrix per head
            (``rf_attention.create(..., learnable=True)``; what attention transfer trains).
        attention_input_map: with learned maps, a learned linear map of the queries and one of the keys per
            head before the features, identity at the start (``rf_attention.create(..., input_map=True)``).
        layer: the MLP replacement: ``"dense"`` (none) or a ``ralimp`` kind (``ralimp``, ``eugen``, ``snnk``,
            ``lowrank``).
        last_k: replace the MLPs of the last ``last_k`` blocks; None: half of them (rounded up).
        features: feature budget of a replacement (128 in the paper), spent by ``ralimp.create``.
        weight_matrix: ``rf_matrices`` name of the replacements' projections; None: the layer's default.
        seed: seed of every random projection (attention features, replacement layers).
        fit: RaLiMP's fit mode (``--fit``, `app_common.fields.RaLiMPFields`).
        num_atoms: RaLiMP's most atoms $J$ (``--num-atoms``).
    """

    block_size: int = field(default=1024, metadata={"help": "context length (crops a pretrained one)"})
    vocab_size: int = field(default=50304, metadata={"help": "token ids 0 .. vocab_size - 1"})
    n_layer: int = field(default=12, metadata={"help": "blocks"})
    n_head: int = field(default=12, metadata={"help": "attention heads"})
    n_embd: int = field(default=768, metadata={"help": "width"})
    dropout: float = option("dropout", 0.0)
    bias: bool = field(default=True, metadata={"help": "biases in linear layers and LayerNorms"})
    layer_norm_epsilon: float = field(default=1e-5, metadata={"help": "LayerNorm epsilon"})
    attention: str = option("attention", "softmax", help="every block's, used causally")
    attention_features: int = option("attention_features", 128)
    attention_window: int = field(
        default=0, metadata={"help": "exact softmax on the last positions of an RF attention (0: none)"}
    )
    learnable_attention: bool = field(
        default=False, metadata={"help": "learned per-head feature maps of an RF attention"}
    )
    attention_input_map: bool = field(
        default=False,
        metadata={"help": "learned per-head linear maps of q and k before the features (identity at start)"},
    )
    layer: str = option("layer", "dense")
    last_k: int | None = option("last_k", None, help="default: half of the blocks")
    features: int = option("features", 128)
    weight_matrix: str | None = option(
        "weight_matrix",
        None,
        help="default: the layer's own",
    )
    seed: int = option("seed", 0)

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd", "attention_features"):
            check_int(name, getattr(self, name), minimum=1)
        check_int("attention_window", self.attention_window, minimum=0)
        if self.learnable_attention and not has_feature_map(self.attention):
            raise ValueError(
                "learnable_attention: needs an attention with a feature map ('<component>-<matrix>', "
                f"'hedgehog', 't2r'), got {self.attention!r}"
            )
        if self.n_embd % self.n_head:
            raise ValueError(f"n_head: expected a divisor of n_embd={self.n_embd}, got {self.n_head}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout: expected a rate in [0, 1), got {self.dropout!r}")
        if self.layer not in ralimp.LAYERS:
            raise ValueError(f"layer: expected one of {', '.join(ralimp.names())}, got {self.layer!r}")
        if self.layer != "dense":
            check_int("features", self.features, minimum=1)
        if self.last_k is not None:
            check_int("last_k", self.last_k, 1, maximum=self.n_layer)  # at most n_layer blocks

    def layer_options(self) -> dict[str, object]:
        """``ralimp.create``'s keywords beside the budget: `LAYER_OPTIONS`, the fit, the projections."""
        options = LAYER_OPTIONS.get(self.layer, {}) | self.ralimp_options(self.layer)
        return options if self.weight_matrix is None else options | {"weight_matrix": self.weight_matrix}

    @property
    def replaced_blocks(self) -> int:
        """How many trailing blocks have their MLP replaced (0 for ``layer="dense"``)."""
        if self.layer == "dense":
            return 0
        return self.last_k if self.last_k is not None else (self.n_layer + 1) // 2

    def num_parameters(self) -> int:
        """Parameters of the dense model (position embedding included), from the shape alone.

        Per block: 12 d^2 weights (qkv 3 d^2, proj d^2, c_fc and c_proj 4 d^2 each) and 13 d vectors
        (9 d of linear biases, 4 d of LayerNorm; 2 d without biases); plus ``(V + T) d`` embeddings (the
        head is tied) and the final LayerNorm.
        """
        d = self.n_embd
        per_block = 12 * d * d + (13 * d if self.bias else 2 * d)
        return (
            self.n_layer * per_block + (self.vocab_size + self.block_size) * d + (2 if self.bias else 1) * d
        )


class MLP(nn.Module):
    """``c_proj(gelu(c_fc(x)))``: nanoGPT's layout, which ``ralimp.replace_mlp`` recognizes."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate="tanh")  # GPT-2's "gelu_new"
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, T, C) -> (B, T, C)``."""
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """Pre-LayerNorm block: ``x + attn(ln_1(x))``, then ``x + mlp(ln_2(x))``."""

    def __init__(self, config: GPTConfig, index: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon, bias=config.bias)
        self.attn = rf_attention.create(
            config.attention,
            config.n_embd,
            config.n_head,
            num_features=config.attention_features,
            causal=True,
            dropout=config.dropout,
            seed=config.seed + index,
            bias=config.bias,
            **({"learnable": True} if config.learnable_attention else {}),
            **({"input_map": True} if config.attention_input_map else {}),
            **({"window": config.attention_window} if config.attention_window else {}),
        )
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, T, C) -> (B, T, C)``."""
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))

    def decode(self, x: torch.Tensor, state: object = None) -> tuple[torch.Tensor, object]:
        """The block on new positions ``x (B, T, C)``, and its attention's decoding state.

        ``state=None``: ``x`` is a prefix (``attn.prefill``); else ``x`` continues the positions ``state``
        holds (``attn.step``: O(1) per token for RF attention, a KV cache for softmax).
        """
        h = self.ln_1(x)
        a, state = self.attn.prefill(h) if state is None else self.attn.step(h, state)
        x = x + a
        return x + self.mlp(self.ln_2(x)), state


class GPT(nn.Module):
    """GPT-2 language model ``idx (B, T) -> logits (B, T, vocab_size)``.

    With ``config.layer`` other than ``"dense"`` the MLPs are replaced at construction, with the paper's
    ``Psi(W)`` start and no calibration (what loading a checkpoint needs); a run replaces them on a dense
    model with `linearize_mlps` instead, calibrated on its data.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(config.vocab_size, config.n_embd),
                "wpe": nn.Embedding(config.block_size, config.n_embd),
                "drop": nn.Dropout(config.dropout),
                "h": nn.ModuleList(Block(config, i) for i in range(config.n_layer)),
                "ln_f": nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon, bias=config.bias),
            }
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying, as GPT-2
        self._init_weights()
        self.replaced: list[str] = []
        self.linearize_mlps()

    @torch.no_grad()
    def _init_weights(self) -> None:
        """GPT-2's init: N(0, 0.02) weights, zero biases, residual projections by ``1/sqrt(2 n_layer)``.

        Only the model's own layers are touched (the attention's ``qkv``/``proj``, the MLP, the embeddings);
        whatever else an attention module holds keeps its own initialization.
        """
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for name, module in self.named_modules():
            leaf = name.rsplit(".", 1)[-1]
            if isinstance(module, nn.Linear) and leaf in ("qkv", "proj", "c_fc", "c_proj", "lm_head"):
                std = residual_std if leaf in ("proj", "c_proj") else 0.02
                nn.init.normal_(module.weight, 0.0, std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, 0.0, 0.02)

    def linearize_mlps(
        self, calibration: torch.Tensor | None = None, *, init: str = "psi", **replacement: object
    ) -> list[str]:
        """Replace the MLPs of the last ``config.replaced_blocks`` blocks by ``config.layer`` layers in place.

        Each ``c_fc`` + tanh GELU becomes ``ralimp.create(layer, c_fc, "gelu_tanh", budget=features,
        **config.layer_options())`` (through ``ralimp.replace_mlp``; block ``i`` of the replaced ones
        gets seed ``config.seed + i``): the replacement fits the activation GPT-2 computes. Nothing for
        ``"dense"``.

        Args:
            calibration: token ids ``(B, T)``; the model runs on them once (eval mode) and each replaced
                layer is calibrated (scales and, with ``init="lstsq"``, its readout) on the inputs its
                ``c_fc`` received, at most 4096 of them.
            init: ``"psi"`` or ``"lstsq"`` (needs ``calibration``).
            **replacement: fields of `REPLACEMENT_FIELDS` to set in ``config`` first (``layer="ralimp"``
                on a dense model).

        Returns:
            The replaced blocks' names (``["transformer.h.10.mlp", "transformer.h.11.mlp"]``), also kept in
            ``self.replaced``.
        """
        unknown = sorted(set(replacement) - set(REPLACEMENT_FIELDS))
        if unknown:
            raise ValueError(
                f"replacement: {', '.join(unknown)} are not among {', '.join(REPLACEMENT_FIELDS)}"
            )
        if self.replaced:
            raise ValueError(f"model: its MLPs {', '.join(self.replaced)} are already replaced")
        self.config = dataclasses.replace(self.config, **replacement)
        if init not in INITS:
            raise ValueError(f"init: expected one of {', '.join(INITS)}, got {init!r}")
        c = self.config
        if c.layer == "dense":
            return []
        self.replaced = ralimp.replace_mlp(
            self,
            c.layer,
            budget=c.features,
            last_k=c.replaced_blocks,
            activation=GELU_TANH,
            inputs=calibration,
            init=init,
            seed=c.seed,
            **c.layer_options(),
        )
        return self.replaced

    def num_parameters(self, *, non_embedding: bool = True) -> int:
        """Parameters (the position embedding excluded by default, as nanoGPT counts)."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.transformer.wpe.weight.numel() if non_embedding else n

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``idx (B, T)`` token ids -> ``(logits (B, T, V), loss)``; loss: mean cross entropy or None."""
        if idx.dim() != 2:
            raise ValueError(f"idx: expected token ids of shape (B, T), got {tuple(idx.shape)}")
        _, t = idx.shape
        if t > self.config.block_size:
            raise ValueError(
                f"idx: sequence of length {t} is longer than block_size={self.config.block_size}"
            )
        pos = torch.arange(t, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(
                logits.float().view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1
            )
        return logits, loss

    # ------------------------------------------------------------------------------------ optimization
    def configure_optimizers(
        self, weight_decay: float, learning_rate: float, betas: tuple[float, float], device_type: str
    ) -> torch.optim.AdamW:
        """AdamW over ``param_groups``: decay on matrices, none on biases, norms, coefficients."""
        groups = param_groups(self, weight_decay)
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=device_type == "cuda")

    # --------------------------------------------------------------------------------------- generation
    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Append ``max_new_tokens`` sampled tokens to ``idx (B, T)`` (context cropped to ``block_size``).

        Token by token through the attention's recurrent form (``step``): the prompt is prefilled once, then
        each new token costs one position (O(1) for RF attention, a KV-cache lookup for softmax). Once the
        sequence outgrows ``block_size``, the positions run out, and each token re-prefills the last
        ``block_size`` tokens, as nanoGPT's cropping does. Equal to rerunning the model on the context.
        The tokens are `stream`'s.
        """
        new = self.stream(idx, max_new_tokens, temperature=temperature, top_k=top_k, generator=generator)
        return torch.cat([idx, *new], dim=1)

    @torch.no_grad()
    def stream(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> Iterator[torch.Tensor]:
        """`generate`'s new tokens one at a time, each ``(B, 1)`` as soon as it is sampled.

        The first comes after the prefill of ``idx``, each later one after one decoding step (so a caller
        can time the steps apart from the prefill).
        """
        if temperature <= 0:
            raise ValueError(f"temperature: expected a value > 0, got {temperature!r}")
        states = None
        for _ in range(max_new_tokens):
            if states is None or idx.shape[1] > self.config.block_size:
                context = idx[:, -self.config.block_size :]
                positions = torch.arange(context.shape[1], device=idx.device)
                logits, states = self.decode(context, positions)
            else:
                position = torch.tensor([idx.shape[1] - 1], device=idx.device)
                logits, states = self.decode(idx[:, -1:], position, states)
            logits = logits[:, -1, :].float() / temperature
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("inf")
            probs = F.softmax(logits, dim=-1)
            token = torch.multinomial(probs, 1, generator=generator)
            idx = torch.cat([idx, token], dim=1)
            yield token

    def decode(
        self, idx: torch.Tensor, positions: torch.Tensor, states: list | None = None
    ) -> tuple[torch.Tensor, list]:
        """Logits ``(B, T, V)`` of tokens ``idx (B, T)`` at ``positions (T,)`` and every block's state.

        ``states=None``: ``idx`` is a prefix starting at position 0; else it continues ``states``.
        """
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(positions))
        new_states = []
        for i, block in enumerate(self.transformer.h):
            x, state = block.decode(x, None if states is None else states[i])
            new_states.append(state)
        return self.lm_head(self.transformer.ln_f(x)), new_states

    @torch.no_grad()
    def crop_block_size(self, block_size: int) -> None:
        """Shorten the context (e.g. GPT-2's 1024 to a smaller ``block_size``) by cropping the positions."""
        if not 1 <= block_size <= self.config.block_size:
            raise ValueError(
                f"block_size: expected an integer in [1, {self.config.block_size}], got {block_size}"
            )
        self.config = dataclasses.replace(self.config, block_size=block_size)
        self.transformer.wpe.weight = nn.Parameter(self.transformer.wpe.weight[:block_size].clone())

    # --------------------------------------------------------------------- Hugging Face GPT-2 weights
    #: Our attention's projections -> HF GPT-2's names.
    HF_RENAMES = ((".attn.qkv", ".attn.c_attn"), (".attn.proj", ".attn.c_proj"))
    #: The modules of HF GPT-2 (after the renames) that hold weights.
    HF_MODULES = re.compile(
        r"transformer\.(wte|wpe|ln_f|h\.\d+\.(ln_1|ln_2|attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj))"
    )
    #: HF GPT-2 stores these as ``Conv1D`` weights, ``(in, out)``: transposed against ``nn.Linear``.
    HF_TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
    #: HF buffers that are no weights (the causal mask of older checkpoints).
    HF_IGNORED = (".attn.bias", ".attn.masked_bias")

    def hf_names(self) -> dict[str, str]:
        """Our parameter name -> its name in an HF ``GPT2LMHeadModel`` state dict (dense GPT-2 parts only).

        Covers the embeddings, norms, the attention's ``qkv``/``proj`` and the MLP layers that are still
        ``nn.Linear``; the tied ``lm_head`` is left out (HF ties it too), and so are the tensors of a
        replacement layer or of an RF attention's feature map.
        """
        names = {}
        for module_name, module in self.named_modules():
            if module_name == "lm_head" or not isinstance(module, nn.Linear | nn.LayerNorm | nn.Embedding):
                continue
            hf_module = module_name
            for old, new in self.HF_RENAMES:
                hf_module = hf_module.replace(old, new)
            if self.HF_MODULES.fullmatch(hf_module):
                for param, _ in module.named_parameters(recurse=False):
                    names[f"{module_name}.{param}"] = f"{hf_module}.{param}"
        return names

    @torch.no_grad()
    def load_hf_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Copy HF GPT-2 weights (``transformer.``-prefixed or not) into this model, transposing ``Conv1D``.

        Raises:
            ValueError: a tensor missing from ``state`` or of the wrong shape (naming it), an HF tensor this
                model has no place for, or an ``lm_head.weight`` that is not tied to ``wte``.
        """
        state = {
            (k if k.startswith(("transformer.", "lm_head.")) else f"transformer.{k}"): v
            for k, v in state.items()
        }
        state = {k: v for k, v in state.items() if not k.endswith(self.HF_IGNORED)}
        head = state.pop("lm_head.weight", None)
        if head is not None and not torch.equal(head, state.get("transformer.wte.weight", head)):
            raise ValueError(
                "lm_head.weight: differs from transformer.wte.weight; GPT-2 ties them and so does this model"
            )
        targets = self.state_dict()
        names = self.hf_names()
        unknown = sorted(set(state) - set(names.values()))
        if unknown:
            raise ValueError(f"HF state dict: no place in this model for {', '.join(unknown[:5])}")
        for ours, theirs in names.items():
            if theirs not in state:
                raise ValueError(f"HF state dict: missing {theirs!r}")
            value = state[theirs]
            if theirs.endswith(self.HF_TRANSPOSED):
                value = value.t()
            if value.shape != targets[ours].shape:
                raise ValueError(
                    f"HF state dict: {theirs!r} has shape {tuple(state[theirs].shape)}, expected "
                    f"{tuple(targets[ours].shape)} (transposed Conv1D)"
                    if theirs.endswith(self.HF_TRANSPOSED)
                    else f"HF state dict: {theirs!r} has shape {tuple(value.shape)}, expected "
                    f"{tuple(targets[ours].shape)}"
                )
            targets[ours].copy_(value)

    @torch.no_grad()
    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """This model's GPT-2 weights in HF ``GPT2LMHeadModel`` layout (``Conv1D`` weights transposed back).

        Raises:
            ValueError: the model has replaced MLPs (no HF GPT-2 layout holds them).
        """
        if self.replaced:
            raise ValueError(
                f"model: MLPs {', '.join(self.replaced)} are replaced ({self.config.layer}); "
                "HF GPT-2 has none"
            )
        state = self.state_dict()
        out = {}
        for ours, theirs in self.hf_names().items():
            value = state[ours]
            out[theirs] = (
                (value.t() if theirs.endswith(self.HF_TRANSPOSED) else value).detach().clone().contiguous()
            )
        out["lm_head.weight"] = out["transformer.wte.weight"].clone()
        return out

    def hf_config(self) -> dict:
        """The ``config.json`` of an HF GPT-2 with this architecture."""
        c = self.config
        return {
            "model_type": "gpt2",
            "architectures": ["GPT2LMHeadModel"],
            "vocab_size": c.vocab_size,
            "n_positions": c.block_size,
            "n_embd": c.n_embd,
            "n_layer": c.n_layer,
            "n_head": c.n_head,
            "n_inner": None,
            "activation_function": "gelu_new",
            "layer_norm_epsilon": c.layer_norm_epsilon,
            "tie_word_embeddings": True,
        }

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        block_size: int | None = None,
        calibration: torch.Tensor | None = None,
        init: str = "psi",
        **overrides: object,
    ) -> GPT:
        """GPT-2 from a local Hugging Face checkpoint folder, replacements applied after the weights are in.

        The folder holds ``config.json`` and ``model.safetensors`` or ``pytorch_model.bin``.

        Args:
            path: the checkpoint folder (``save_pretrained`` output or a downloaded hub snapshot).
            block_size: crop the context to this length.
            calibration: token ids ``(B, T)`` that calibrate the replacement layers (see `GPT`).
            init: ``"psi"`` or ``"lstsq"`` (the calibrated start, needs ``calibration``).
            **overrides: other `GPTConfig` fields (``dropout``, ``attention``, ``layer``, ``last_k``,
                ``features``, ``seed``...); the shape fields come from ``config.json``.

        Raises:
            FileNotFoundError: no checkpoint at ``path``.
            ValueError: a config that is no GPT-2 (or that the overrides contradict), or bad weights.
        """
        shape = hf.gpt2_config_fields(hf.read_config(path))
        clash = sorted(k for k in overrides if k in shape and overrides[k] != shape[k])
        if clash:
            raise ValueError(f"overrides: {', '.join(clash)} are fixed by {path}/config.json ({shape})")
        config = GPTConfig(**{**shape, **overrides})
        model = cls(dataclasses.replace(config, layer="dense"))
        model.load_hf_state_dict(hf.read_state_dict(path))
        if block_size is not None and block_size != config.block_size:
            model.crop_block_size(block_size)
        model.linearize_mlps(calibration, init=init, layer=config.layer)
        return model
