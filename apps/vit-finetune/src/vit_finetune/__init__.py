"""ViT fine-tuning with the MLPs of the last k blocks replaced by RaLiMP, SNNK or EUGen (``vit-finetune``).

Usage:

    from vit_finetune import ViT, build_model, replace_mlps, swap_attention
    model, spec = build_model("vit_base_patch16_224.augreg_in21k", num_classes=100, weights="model.pth")
    replace_mlps(model, "ralimp", last_k=4, features=32, inputs=images, init="lstsq")  # calibrated start
    swap_attention(model, "performer", last_k=4)                # optional: rf_attention, qkv/proj copied
"""

from vit_finetune.config import QuickConfig, ReportConfig, SweepConfig, TrainConfig, run_name
from vit_finetune.model import ViT, ViTConfig, resample_pos_embed
from vit_finetune.surgery import (
    compressed,
    layer_names,
    replace_mlps,
    swap_attention,
)
from vit_finetune.weights import (
    MODELS,
    ModelSpec,
    build_model,
    hf_to_timm,
    load_pretrained,
    read_checkpoint,
    read_safetensors,
    to_vit_state_dict,
)

__all__ = [
    "MODELS",
    "ModelSpec",
    "QuickConfig",
    "ReportConfig",
    "SweepConfig",
    "TrainConfig",
    "ViT",
    "ViTConfig",
    "build_model",
    "compressed",
    "hf_to_timm",
    "layer_names",
    "load_pretrained",
    "read_checkpoint",
    "read_safetensors",
    "replace_mlps",
    "resample_pos_embed",
    "run_name",
    "swap_attention",
    "to_vit_state_dict",
]
