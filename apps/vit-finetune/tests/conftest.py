"""A tiny registered ViT (4 blocks of width 16 on 8-pixel images) so that runs take seconds."""

import pytest

from vit_finetune import MODELS, ModelSpec, ViTConfig

TINY = ViTConfig(image_size=8, patch_size=4, dim=16, depth=4, num_heads=2, mlp_dim=32, num_classes=10)

if "vit-tiny-test" not in MODELS:
    MODELS.register("vit-tiny-test")(ModelSpec(TINY, description="tests only"))


@pytest.fixture
def tiny_config():
    return TINY
