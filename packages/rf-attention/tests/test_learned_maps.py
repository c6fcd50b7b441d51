"""The learned-map baselines (``hedgehog``, ``t2r``) through the attention kernels, decoding and HF names."""

import pytest
import torch

import rf_attention
import rf_features
from rf_attention.naive import naive_linear_attention

B, H, N, DH, S = 2, 3, 13, 4, 6
SCALE = DH**-0.25  # rf_attention's factor of q and of k


def learned_map(name: str) -> rf_features.FeatureMap:
    fm = rf_features.create(name, num_features=S, dim=DH, seed=0, num_heads=H, input_map=True).double()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in fm.parameters():  # off the start, every head differently
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
        if name == "t2r":
            fm.bias.add_(1.0)  # some features 0, but no query with all of them 0 (the formula's 0 / 0)
    return fm


def plain_features(name: str, fm: rf_features.FeatureMap, x: torch.Tensor, is_query: bool) -> torch.Tensor:
    """The map's formula written out: ``x`` through its input map and ``W`` (float64, no stabilization)."""
    x = x @ (fm.query_map if is_query else fm.key_map).mT
    projection = x @ fm.weight_matrix.weight.mT
    if name == "hedgehog":
        return torch.cat((projection.softmax(-1), (-projection).softmax(-1)), dim=-1)
    return torch.relu(projection + fm.bias)


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("name", ["hedgehog", "t2r"])
def test_outputs_and_gradients_equal_the_quadratic_formula(name, causal):
    fm = learned_map(name)
    g = torch.Generator().manual_seed(2)
    q, k, v = (3 * torch.randn(B, H, N, DH, generator=g, dtype=torch.float64) for _ in range(3))
    q.requires_grad_(True), k.requires_grad_(True), v.requires_grad_(True)
    padding = torch.zeros(B, N, dtype=torch.bool)
    padding[1, :4] = True
    grad = torch.randn(B, H, N, DH, generator=g, dtype=torch.float64)
    tensors = [q, k, v, *fm.parameters()]

    out = rf_attention.rf_attention(q, k, v, fm, causal=causal, key_padding_mask=padding, chunk_size=4)
    phi_q = plain_features(name, fm, q * SCALE, True)
    phi_k = plain_features(name, fm, k * SCALE, False)
    expected = naive_linear_attention(phi_q, phi_k, v, causal=causal, key_padding_mask=padding)
    assert bool((phi_q > 0).any(-1).all())
    assert name == "hedgehog" or bool((phi_q == 0).any())
    rows = ~padding[:, None, :, None] if causal else torch.ones(B, 1, N, 1, dtype=torch.bool)
    expected, out = expected * rows, out * rows  # a padded query in causal mode may see no key at all
    torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-12)
    for got, want in zip(
        torch.autograd.grad(out, tensors, grad), torch.autograd.grad(expected, tensors, grad), strict=True
    ):
        torch.testing.assert_close(got, want, rtol=1e-8, atol=1e-11)


@pytest.mark.parametrize("name", ["hedgehog", "t2r"])
def test_decoding_token_by_token_equals_the_causal_forward(name):
    module = rf_attention.create(name, 12, 3, num_features=5, causal=True, seed=0).eval()
    x = torch.randn(2, 9, 12, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = module(x)
        out, state = module.prefill(x[:, :4])
        steps = [out]
        for t in range(4, 9):
            y, state = module.step(x[:, t : t + 1], state)
            steps.append(y)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-6)


def test_learned_maps_are_attention_names_with_trainable_per_head_projections():
    assert {"hedgehog", "t2r"} <= set(rf_attention.names())
    module = rf_attention.create("hedgehog", 12, 3, num_features=4)
    assert module.feature_map.weight_matrix.weight.shape == (3, 4, 4)
    assert module.feature_map.weight_matrix.weight.requires_grad
    with pytest.raises(ValueError, match="learnable"):
        rf_attention.create("hedgehog", 12, 3, learnable=False)


def test_hf_linearize_and_attn_implementation_take_a_learned_map(tiny_llama):
    rf_hf = pytest.importorskip("rf_attention.hf")
    assert {"rf-hedgehog", "rf-t2r"} <= set(rf_hf.REGISTERED)
    model = tiny_llama("sdpa").eval()
    ids = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(4))
    rf_hf.linearize(model, "hedgehog", num_features=8, seed=0)
    fm = model.model.layers[0].self_attn.rf_feature_map
    assert isinstance(fm, rf_features.HedgehogFeatureMap)
    assert (fm.num_features, fm.feature_width) == (8, 16)
    with torch.no_grad():
        cached = model.generate(ids, max_new_tokens=4, do_sample=False)
        uncached = model.generate(ids, max_new_tokens=4, do_sample=False, use_cache=False)
    assert torch.equal(cached, uncached)


def test_a_t2r_query_whose_features_are_all_zero_gets_a_zero_output():
    fm = rf_features.create("t2r", num_features=S, dim=DH, seed=0).double()
    with torch.no_grad():
        fm.bias.fill_(-100.0)  # every feature of every input is 0
    q, k, v = (torch.randn(1, 1, 5, DH, dtype=torch.float64) for _ in range(3))
    out = rf_attention.rf_attention(q, k, v, fm)
    assert torch.equal(out, torch.zeros_like(out))
