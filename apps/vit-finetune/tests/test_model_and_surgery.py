"""The ViT, the MLP replacement, the attention swap and the compressed inference copy."""

import copy
import math

import pytest
import torch

import ralimp
from spectraformer_core.testing import assert_rel_close, relative_error
from vit_finetune import ViT, ViTConfig, compressed, replace_mlps, resample_pos_embed, swap_attention


def tokens_into_block(model, x, index):
    """The residual stream entering block ``index``."""
    h = model.patch_embed(x)
    h = torch.cat([model.cls_token.expand(x.shape[0], -1, -1), h], 1) + model.pos_embed
    for block in model.blocks[:index]:
        h = block(h)
    return h


@pytest.mark.parametrize("kind", ["ralimp", "snnk", "eugen", "lowrank"])
def test_replacing_the_last_k_mlps_leaves_the_first_blocks_untouched_and_the_output_shape_unchanged(
    tiny_config, kind
):
    torch.manual_seed(0)
    model = ViT(tiny_config).eval()
    before = copy.deepcopy(model)
    replaced = replace_mlps(model, kind, last_k=2, features=16, seed=0)
    assert replaced == ["blocks.2.mlp", "blocks.3.mlp"]
    for index in (0, 1):
        old, new = before.blocks[index].state_dict(), model.blocks[index].state_dict()
        assert old.keys() == new.keys()
        assert all(torch.equal(old[k], new[k]) for k in old)
        assert str(model.blocks[index]) == str(before.blocks[index])
    for index in (2, 3):
        assert isinstance(model.blocks[index].mlp.fc1, ralimp.LAYERS.get(kind))
        assert isinstance(model.blocks[index].mlp.act, torch.nn.Identity)
    x = torch.randn(3, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(tokens_into_block(model, x, 2), tokens_into_block(before, x, 2))
        y = model(x)
    assert y.shape == before(x).shape == (3, tiny_config.num_classes)
    assert torch.isfinite(y).all()


def test_the_papers_fit_keeps_one_atom_in_every_replaced_block(tiny_config):
    torch.manual_seed(0)
    model = ViT(tiny_config).eval()
    replace_mlps(model, "ralimp", last_k=2, features=32, seed=0, fit="paper", num_atoms=1)
    layers = [model.blocks[index].mlp.fc1 for index in (2, 3)]
    assert [(layer.num_atoms, layer.options.fit) for layer in layers] == [(1, "paper")] * 2
    assert all(layer.num_random_features == 32 for layer in layers)


def test_dense_layer_changes_nothing(tiny_config):
    model = ViT(tiny_config)
    before = copy.deepcopy(model)
    assert replace_mlps(model, "dense", last_k=4, features=8) == []
    assert str(model) == str(before)


def test_ralimp_block_approximates_the_original_block_at_a_large_budget():
    # Where this holds: the variance of RaLiMP's complex-exponential features grows like
    # exp(s ||x / lambda + lambda w||^2 / q) (Prop. 1, docs/guides/ralimp.md), so the unbiased estimate
    # converges only when ||x|| ||w|| is O(1). Width 8 with LayerNorm gain 1 (||x|| ~ sqrt(8)) and fc1 rows of
    # std 0.25 / sqrt(8) give ||x|| ||w|| ~ 0.7 and pre-activations up to ~1; at width 768 (ViT-B) the same
    # estimate is variance-dominated at any affordable budget and only training makes the layer useful.
    torch.manual_seed(0)
    d = 8
    model = ViT(
        ViTConfig(image_size=8, patch_size=4, dim=d, depth=2, num_heads=2, mlp_dim=4 * d, num_classes=3)
    )
    model.eval()
    mlp = model.blocks[1].mlp
    with torch.no_grad():
        mlp.fc1.weight.normal_(0, 0.25 / math.sqrt(d))
        mlp.fc1.bias.normal_(0, 0.1)
        mlp.fc2.weight.normal_(0, 1 / math.sqrt(4 * d))
        h = tokens_into_block(model, torch.randn(16, 3, 8, 8), 1)
        reference_block = model.blocks[1](h)
        reference_mlp = mlp(model.blocks[1].norm2(h))

    def errors(features):
        replaced = copy.deepcopy(model)
        replace_mlps(replaced, "ralimp", last_k=1, features=features, seed=1)
        replaced.eval()
        with torch.no_grad():
            block = replaced.blocks[1]
            out_mlp = block.mlp(block.norm2(h))
            out_block = block(h)
        return relative_error(out_mlp, reference_mlp), relative_error(out_block, reference_block)

    small_mlp, _ = errors(64)
    large_mlp, large_block = errors(32768)
    assert large_mlp < 0.15
    assert large_mlp < small_mlp / 4
    assert large_block < 0.05


@pytest.mark.parametrize("kind", ["ralimp", "snnk", "eugen"])
def test_compressed_copy_computes_the_same_logits_with_fewer_parameters(tiny_config, kind):
    torch.manual_seed(0)
    model = ViT(tiny_config).eval()
    with torch.no_grad():
        model.head.weight.normal_()
    replace_mlps(model, kind, last_k=3, features=8, seed=0)
    fast = compressed(model).eval()
    x = torch.randn(4, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(fast(x), model(x), rtol=1e-4, atol=1e-4)
    assert all(isinstance(fast.blocks[i].mlp.fc2, torch.nn.Identity) for i in (1, 2, 3))
    assert sum(p.numel() for p in fast.parameters()) < sum(p.numel() for p in model.parameters())


def test_softmax_attention_swap_copies_qkv_and_proj_and_keeps_the_output(tiny_config):
    torch.manual_seed(0)
    model = ViT(tiny_config).eval()
    with torch.no_grad():
        model.head.weight.normal_()
    before = copy.deepcopy(model)
    changed = swap_attention(model, "softmax", last_k=2)
    assert set(changed["copied"]) == {
        f"blocks.{i}.attn.{p}.{k}" for i in (2, 3) for p in ("qkv", "proj") for k in ("weight", "bias")
    }
    assert changed["new"] == []
    assert model.blocks[1].attn is not None
    assert before.blocks[1].attn is not model.blocks[1].attn
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(model(x), before(x))


def test_performer_swap_keeps_pretrained_projections_and_approximates_softmax(tiny_config):
    torch.manual_seed(0)
    model = ViT(tiny_config).eval()
    before = copy.deepcopy(model)
    changed = swap_attention(model, "performer", last_k=1, num_features=4096, seed=0)
    assert "blocks.3.attn.qkv.weight" in changed["copied"]
    torch.testing.assert_close(model.blocks[3].attn.qkv.weight, before.blocks[3].attn.qkv.weight)
    h = tokens_into_block(before, torch.randn(2, 3, 8, 8), 3)
    with torch.no_grad():
        exact = before.blocks[3].attn(before.blocks[3].norm1(h))
        approx = model.blocks[3].attn(model.blocks[3].norm1(h))
    assert approx.shape == exact.shape
    assert_rel_close("attention output", exact, approx, 0.1)


def test_the_calibrated_start_is_closer_to_the_pretrained_block_than_psi(tiny_config):
    # Width 16, GPT-like weights: the Psi(W) start at budget 32 is far off; the readout fitted on the
    # calibration images (ridge least squares) is much closer on other images.
    torch.manual_seed(0)
    model = ViT(tiny_config).eval()
    calibration, held_out = torch.randn(64, 3, 8, 8), torch.randn(16, 3, 8, 8)
    h = tokens_into_block(model, held_out, 3)
    with torch.no_grad():
        reference = model.blocks[3].mlp(model.blocks[3].norm2(h))
    for kind in ("ralimp", "eugen", "snnk"):
        errors = {}
        for init in ("psi", "lstsq"):
            replaced = copy.deepcopy(model)
            replace_mlps(replaced, kind, last_k=1, features=32, seed=0, inputs=calibration, init=init)
            block = replaced.eval().blocks[3]
            with torch.no_grad():
                errors[init] = relative_error(block.mlp(block.norm2(h)), reference)
        assert errors["lstsq"] < 0.5 * errors["psi"], (kind, errors)


def test_surgery_errors_name_the_argument(tiny_config):
    model = ViT(tiny_config)
    with pytest.raises(ValueError, match="layer: unknown 'mlp'"):
        replace_mlps(model, "mlp", last_k=1, features=8)
    with pytest.raises(ValueError, match=r"last_k: expected an integer in \[1, 4\]"):
        replace_mlps(model, "ralimp", last_k=5, features=8)
    with pytest.raises(ValueError, match="inputs: init='lstsq'"):
        replace_mlps(model, "ralimp", last_k=1, features=8, init="lstsq")
    with pytest.raises(ValueError, match=r"last_k: expected an integer in \[1, 4\]"):
        swap_attention(model, "softmax", last_k=0)
    with pytest.raises(ValueError, match="unknown attention"):
        swap_attention(model, "nope", last_k=1)
    with pytest.raises(ValueError, match="x: expected images of shape"):
        model(torch.randn(1, 3, 16, 16))


def test_position_embedding_resampling_keeps_the_class_token_and_a_constant_grid():
    pos = torch.randn(1, 1 + 4, 6)
    pos[:, 1:] = 2.0
    out = resample_pos_embed(pos, 4)
    assert out.shape == (1, 17, 6)
    torch.testing.assert_close(out[:, 0], pos[:, 0])
    torch.testing.assert_close(out[:, 1:], torch.full((1, 16, 6), 2.0))
    assert resample_pos_embed(pos, 2) is pos
