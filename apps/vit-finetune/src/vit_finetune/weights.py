"""The models by name, and pretrained weights: local checkpoint files, the hub when online, key mappings.

Every model is our [`ViT`][vit_finetune.ViT]; pretrained checkpoints of timm and of Hugging Face are
mapped onto it, so neither library is needed:

    spec = MODELS.get("vit_base_patch16_224.augreg_in21k")
    model = build_model("vit_base_patch16_224.augreg_in21k", num_classes=100, weights="model.safetensors")

- timm's ``VisionTransformer`` names are ours: its state dict loads as it is (the head is dropped).
- Hugging Face ``ViTModel`` / ``ViTForImageClassification`` (``embeddings.*``, ``encoder.layer.{i}.*``, with
  or without the ``vit.`` prefix; also a transformers 5.x model's own ``layers.{i}.*`` names): ``query``,
  ``key``, ``value`` are stacked into ``qkv`` (timm's order), ``layernorm_before``/``after`` become
  ``norm1``/``norm2``, ``intermediate.dense``/``output.dense`` become ``mlp.fc1``/``fc2``; the pooler and
  the classifier are dropped.

Files: ``.safetensors`` (read by ``app_common.safetensors.read_safetensors``: memory-mapped, and the
head's tensors are never read), or anything
``torch.load`` reads with ``weights_only=True`` (``.bin``, ``.pth``, ``.pt``), or a folder holding one of
them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch

from app_common.safetensors import read_safetensors
from spectraformer_core import Registry
from vit_finetune.model import ViT, ViTConfig, resample_pos_embed


@dataclass(frozen=True)
class ModelSpec:
    """A registered model: its shape, where its pretrained weights live, its input normalization.

    Attributes:
        config: the ViT shape (``num_classes`` is replaced by the data set's).
        hub_repo: the hub repository of the pretrained weights, or None for a randomly initialized model.
        hub_files: file names tried in that repository, in order.
        mean: per-channel input mean (after scaling pixels to [0, 1]).
        std: per-channel input standard deviation.
        description: one line for ``vit-finetune models``.
    """

    config: ViTConfig
    hub_repo: str | None = None
    hub_files: tuple[str, ...] = ("model.safetensors", "pytorch_model.bin")
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    description: str = ""


#: Models by name: ``vit-digits`` (random init, the offline default), timm's and HF's ViT-B/16 in21k.
MODELS: Registry[ModelSpec] = Registry("model")
MODELS.register("vit-digits")(
    ModelSpec(
        ViTConfig(image_size=16, patch_size=4, dim=32, depth=12, num_heads=2, mlp_dim=128, num_classes=10),
        description="12 blocks of width 32 (MLP 128, 2 heads), 16 px, patch 4; random init (offline default)",
    )
)
MODELS.register("vit_base_patch16_224.augreg_in21k")(
    ModelSpec(
        ViTConfig(),
        hub_repo="timm/vit_base_patch16_224.augreg_in21k",
        description="ViT-B/16 pretrained on ImageNet-21k (AugReg), timm's checkpoint",
    )
)
MODELS.register("google/vit-base-patch16-224-in21k")(
    ModelSpec(
        ViTConfig(norm_eps=1e-12),
        hub_repo="google/vit-base-patch16-224-in21k",
        description="ViT-B/16 pretrained on ImageNet-21k, Hugging Face's checkpoint (the RaLiMP paper's)",
    )
)


def register(name: str, spec: ModelSpec, *, override: bool = False) -> ModelSpec:
    """Add a model under ``name`` (e.g. another ViT shape or checkpoint)."""
    return MODELS.register(name, override=override)(spec)


def names(pattern: str | None = None) -> list[str]:
    """Registered model names."""
    return MODELS.names(pattern)


# ---------------------------------------------------------------------------------------------- files
#: Key prefixes of a checkpoint's head (classifier, pooler), which no fine-tuning run loads.
HEAD_PREFIXES = ("head.", "head_drop.", "fc_norm.", "pre_logits.", "pooler.", "classifier.")


def is_head_key(name: str) -> bool:
    """True for a tensor of a timm or Hugging Face checkpoint's head (``vit.pooler.dense.weight``)."""
    return name.removeprefix("module.").removeprefix("vit.").startswith(HEAD_PREFIXES)


def read_checkpoint(path: str | Path, *, head: bool = True) -> dict[str, torch.Tensor]:
    """The state dict in a checkpoint file or folder (``.safetensors``, or ``torch.load``-able files).

    ``head=False`` leaves out the head's tensors (``is_head_key``); a
    safetensors file then never reads them.

    A folder is searched for ``model.safetensors``, ``pytorch_model.bin``, then any ``*.safetensors``,
    ``*.pth``, ``*.pt``, ``*.bin``. A file holding ``{"state_dict": ...}`` or ``{"model": ...}`` is unwrapped.

    Raises:
        FileNotFoundError: nothing at ``path``, or a folder without a checkpoint file.
        ValueError: a file that holds no state dict.
    """
    path = Path(path)
    if path.is_dir():
        candidates = [path / "model.safetensors", path / "pytorch_model.bin"]
        for pattern in ("*.safetensors", "*.pth", "*.pt", "*.bin"):
            candidates += sorted(path.glob(pattern))
        found = next((c for c in candidates if c.is_file()), None)
        if found is None:
            raise FileNotFoundError(
                f"weights: no checkpoint file (*.safetensors, *.pth, *.pt, *.bin) in {path}"
            )
        path = found
    if not path.is_file():
        raise FileNotFoundError(f"weights: no such file or folder: {path}")
    if path.suffix == ".safetensors":
        return read_safetensors(path, keys=None if head else lambda name: not is_head_key(name))
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise ValueError(f"{path}: not a readable checkpoint ({type(error).__name__}: {error})") from None
    for key in ("state_dict", "model", "model_state_dict"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
            break
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{path}: expected a state dict of tensors, got {type(state).__name__}")
    return state if head else {k: v for k, v in state.items() if not is_head_key(k)}


# ---------------------------------------------------------------------------------------------- mappings
def is_hf_checkpoint(state: dict[str, torch.Tensor]) -> bool:
    """True for Hugging Face ViT key names.

    Files (``encoder.layer.0.attention.attention.query.weight``) or a transformers 5.x model's own
    ``state_dict()`` (``layers.0.attention.q_proj.weight``).
    """
    return any(".attention.attention.query." in key or ".attention.q_proj." in key for key in state)


#: transformers 5.x in-memory ViT names -> the 4.x names its files keep (``save_pretrained`` writes these).
HF5_TO_HF4 = {
    "attention.q_proj": "attention.attention.query",
    "attention.k_proj": "attention.attention.key",
    "attention.v_proj": "attention.attention.value",
    "attention.o_proj": "attention.output.dense",
    "mlp.fc1": "intermediate.dense",
    "mlp.fc2": "output.dense",
}


def _hf4_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A transformers 5.x ViT ``state_dict()`` under the 4.x names (a 4.x one unchanged)."""
    out = {}
    for key, value in state.items():
        if key.startswith("layers."):
            _, index, rest = key.split(".", 2)
            for new, old in HF5_TO_HF4.items():
                if rest.startswith(new + "."):
                    rest = old + rest[len(new) :]
                    break
            key = f"encoder.layer.{index}.{rest}"
        out[key] = value
    return out


def hf_to_timm(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A Hugging Face ViT state dict (4.x names, as the hub's files) under timm's names, pooler dropped.

    ``qkv`` stacks ``query``, ``key``, ``value`` along the output dimension, the order timm and
    ``rf_attention`` split it in (``view(B, N, 3, H, Dh)``).
    """
    state = _hf4_names({k.removeprefix("vit."): v for k, v in state.items()})
    out = {
        "cls_token": state["embeddings.cls_token"],
        "pos_embed": state["embeddings.position_embeddings"],
        "patch_embed.proj.weight": state["embeddings.patch_embeddings.projection.weight"],
        "patch_embed.proj.bias": state["embeddings.patch_embeddings.projection.bias"],
        "norm.weight": state["layernorm.weight"],
        "norm.bias": state["layernorm.bias"],
    }
    depth = 1 + max(int(k.split(".")[2]) for k in state if k.startswith("encoder.layer."))
    names = {
        "layernorm_before": "norm1",
        "attention.output.dense": "attn.proj",
        "layernorm_after": "norm2",
        "intermediate.dense": "mlp.fc1",
        "output.dense": "mlp.fc2",
    }
    for i in range(depth):
        hf, ours = f"encoder.layer.{i}.", f"blocks.{i}."
        for kind in ("weight", "bias"):
            out[f"{ours}attn.qkv.{kind}"] = torch.cat(
                [state[f"{hf}attention.attention.{p}.{kind}"] for p in ("query", "key", "value")]
            )
            for theirs, mine in names.items():
                out[f"{ours}{mine}.{kind}"] = state[f"{hf}{theirs}.{kind}"]
    return out


def to_vit_state_dict(state: dict[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """A timm or Hugging Face ViT state dict as our [`ViT`][vit_finetune.ViT]'s, without the head.

    Position embeddings of another grid are resampled to ``config.grid_size`` (bicubic).
    """
    state = {k.removeprefix("module."): v for k, v in state.items()}
    if is_hf_checkpoint(state):
        state = hf_to_timm(state)
    state = {k: v for k, v in state.items() if not k.startswith(HEAD_PREFIXES)}
    if "pos_embed" in state:
        state["pos_embed"] = resample_pos_embed(state["pos_embed"], config.grid_size)
    return state


def load_pretrained(model: ViT, state: dict[str, torch.Tensor]) -> None:
    """Load a timm or Hugging Face checkpoint's weights into ``model`` (every parameter but the head).

    Raises:
        ValueError: keys missing from the checkpoint, left over, or of the wrong shape (with the names).
    """
    mapped = to_vit_state_dict(state, model.config)
    own = model.state_dict()
    wrong = [
        f"{k}: {tuple(v.shape)} vs {tuple(own[k].shape)}"
        for k, v in mapped.items()
        if k in own and v.shape != own[k].shape
    ]
    missing = [k for k in own if k not in mapped and not k.startswith("head.")]
    unexpected = [k for k in mapped if k not in own]
    if wrong or missing or unexpected:
        raise ValueError(
            "weights: the checkpoint does not fit the model "
            f"(dim={model.config.dim}, depth={model.config.depth}, patch={model.config.patch_size}): "
            f"shape mismatches {wrong[:5]}, missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    with torch.no_grad():
        for key, value in mapped.items():
            own[key].copy_(value.to(own[key].dtype))


def fetch_weights(name: str, spec: ModelSpec) -> Path:
    """Download ``spec``'s checkpoint from the hub (``huggingface_hub``, the ``hub`` extra).

    Raises:
        ValueError: no hub repository, ``huggingface_hub`` not installed, or the hub unreachable; the
            message says how to get the weights and pass them with ``--weights``.
    """
    if spec.hub_repo is None:
        raise ValueError(f"model {name!r}: has no pretrained weights to fetch")
    how = (
        f"download {' or '.join(spec.hub_files)} of the hub repository {spec.hub_repo!r} on a machine with "
        "network access (e.g. `huggingface-cli download "
        f"{spec.hub_repo} {spec.hub_files[0]}`) and pass it with --weights PATH"
    )
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise ValueError(
            f"model {name!r}: no --weights given and huggingface_hub is not installed to fetch them; "
            f"install `vit-finetune[hub]`, or {how}"
        ) from None
    errors = []
    for filename in spec.hub_files:
        try:
            return Path(hf_hub_download(spec.hub_repo, filename))
        except Exception as error:  # offline, missing file, no access: try the next name, then explain
            errors.append(f"{filename}: {type(error).__name__}: {str(error)[:200]}")
    raise ValueError(
        f"model {name!r}: no --weights given and the hub could not provide them ({'; '.join(errors)}); {how}"
    )


def build_model(
    name: str,
    *,
    num_classes: int,
    image_size: int | None = None,
    weights: str | Path | None = None,
    dropout: float = 0.0,
    pretrained: bool = True,
) -> tuple[ViT, ModelSpec]:
    """The model ``name`` for ``num_classes``, with pretrained weights where it has them, and its spec.

    Args:
        name: a registered model name (`names`).
        num_classes: classes of the (zero-initialized) head.
        image_size: input side; None: the model's (position embeddings are resampled when it differs).
        weights: a local checkpoint file or folder; None: fetch from the hub if the model has weights.
        dropout: dropout rate of the blocks.
        pretrained: False builds the shape only (random weights; e.g. for timing the dense model).

    Raises:
        ValueError: unknown name, weights that cannot be had or do not fit.
    """
    spec = MODELS.get(name)
    changes = {"num_classes": num_classes, "dropout": dropout}
    if image_size is not None:
        changes["image_size"] = image_size
    config = dataclasses.replace(spec.config, **changes)
    model = ViT(config)
    if pretrained and (weights is not None or spec.hub_repo is not None):
        path = Path(weights) if weights is not None else fetch_weights(name, spec)
        load_pretrained(model, read_checkpoint(path, head=False))
        model.reset_head()
    return model, spec
