"""Learnable per-head feature maps through the attention kernels, against ``rf_attention.naive`` (float64)."""

import pytest
import torch

import rf_attention
import rf_features
from rf_attention.naive import naive_rf_attention

B, H, N, DH, S = 2, 3, 11, 4, 8
PAIRS = ["posrf-orf", "oprf-sorf", "trigrf-qmc", "saderf-fastfood", "posrf-hyp-sgq", "gerf-fastfoodl"]


def per_head_map(pair: str, causal: bool, input_map: bool) -> rf_features.FeatureMap:
    component, matrix = rf_attention.split_pair(pair)
    fm = rf_features.create(
        component,
        weight_matrix=matrix,
        num_features=S,
        dim=DH,
        seed=0,
        learnable=True,
        num_heads=H,
        input_map=input_map,
        statistics_mode="running" if causal else "batch",
    ).double()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in fm.parameters():  # off the initialization, every head differently
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
        for name in ("running_a", "running_psi"):
            if hasattr(fm, name):
                getattr(fm, name).copy_(torch.rand(getattr(fm, name).shape, generator=g) * 0.5 + 0.5)
        if hasattr(fm, "running_a"):
            fm.running_a.mul_(-0.1)
    return fm.eval()


def gradients(output: torch.Tensor, fm: rf_features.FeatureMap, grad: torch.Tensor) -> list[torch.Tensor]:
    return list(torch.autograd.grad(output, list(fm.parameters()), grad))


@pytest.mark.parametrize("input_map", [False, True], ids=["closed-form", "input-map"])
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("pair", PAIRS)
def test_per_head_parameter_gradients_match_the_naive_reference(pair, causal, input_map):
    fm = per_head_map(pair, causal, input_map)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, N, DH, generator=g, dtype=torch.float64) for _ in range(3))
    mask = torch.zeros(B, N, dtype=torch.bool)
    mask[1, -3:] = True
    grad = torch.randn(B, H, N, DH, generator=g, dtype=torch.float64)
    masks = {"key_padding_mask": mask, "query_padding_mask": mask}
    out = rf_attention.rf_attention(q, k, v, fm, causal=causal, **masks)
    ref = naive_rf_attention(q, k, v, fm, causal=causal, **masks)
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-10)
    for a, b in zip(gradients(out, fm, grad), gradients(ref, fm, grad), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


def test_closed_form_of_a_per_head_map_has_one_matrix_per_head():
    fm = per_head_map("oprf-orf", causal=False, input_map=False)
    form = fm.contract(*(torch.randn(B, H, N, DH, dtype=torch.float64) for _ in range(2))).query
    assert form is not None
    assert form.matrix.shape == (B, H, S, DH)


def module(pair: str = "oprf-sorf", **kw) -> torch.nn.Module:
    return rf_attention.create(pair, 12, H, num_features=S, causal=True, seed=0, learnable=True, **kw)


def test_learnable_module_has_one_trainable_matrix_per_head():
    shapes = {n: tuple(p.shape) for n, p in module().named_parameters() if n.startswith("feature_map")}
    assert shapes == {"feature_map.weight_matrix.weight": (H, S, 4)}


def test_learnable_module_refuses_periodic_redraws():
    with pytest.raises(ValueError, match="redraw_interval"):
        module(redraw_interval=10)


@pytest.mark.parametrize("input_map", [False, True])
def test_learnable_module_decodes_token_by_token_as_its_causal_forward(input_map):
    m = module("saderf-orf", input_map=input_map).double().eval()
    x = torch.randn(2, 7, 12, dtype=torch.float64)
    full = m(x)
    state, steps = None, []
    for t in range(7):
        y, state = m.step(x[:, t : t + 1], state)
        steps.append(y)
    torch.testing.assert_close(torch.cat(steps, dim=1), full)


def test_learnable_module_parameters_and_gradients_stay_float32_under_bfloat16_autocast():
    m = module("posrf-orf", input_map=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = m(torch.randn(2, 9, 12))
    y.float().sum().backward()
    for p in m.feature_map.parameters():
        assert p.dtype == torch.float32
        assert p.grad is not None
        assert p.grad.dtype == torch.float32


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_checkpointed_causal_oprf_module_updates_statistics_once_with_the_plain_gradients(use_reentrant):
    plain = module("oprf-orf").double().train()
    checkpointed = module("oprf-orf").double().train()
    x = torch.randn(2, 9, 12, dtype=torch.float64)
    plain(x), checkpointed(x)  # the statistics off their defaults
    x = (x * 1.5).requires_grad_()
    plain(x).pow(2).sum().backward()
    torch.utils.checkpoint.checkpoint(checkpointed, x, use_reentrant=use_reentrant).pow(2).sum().backward()
    assert torch.equal(checkpointed.feature_map.running_a, plain.feature_map.running_a)
    for a, b in zip(checkpointed.parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad)
