"""Learnable per-head feature maps, learned input maps, and running statistics under checkpointing."""

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import rf_features
import rf_matrices

H, D, S = 3, 4, 8
COMPONENTS = ["trigrf", "posrf", "posrf-hyp", "gerf", "oprf", "saderf"]


def qk(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, H, 6, D, generator=g, dtype=torch.float64) * 0.7 for _ in range(2))


def per_head_map(component: str, **kw) -> rf_features.FeatureMap:
    return rf_features.create(
        component, num_features=S, dim=D, seed=0, learnable=True, num_heads=H, **kw
    ).double()


@pytest.mark.parametrize("component", COMPONENTS)
def test_per_head_features_equal_each_head_computed_alone_with_its_matrix(component):
    fm = per_head_map(component)
    q, k = qk()
    phi_q, phi_k = fm(q, k)
    for h in range(H):
        alone = rf_features.create(component, num_features=S, dim=D, seed=0, learnable=True).double()
        with torch.no_grad():
            alone.weight_matrix.weight.copy_(fm.weight_matrix.weight[h])
        expected_q, expected_k = alone(q[:, h], k[:, h])
        torch.testing.assert_close(phi_q[:, h], expected_q)
        torch.testing.assert_close(phi_k[:, h], expected_k)


@pytest.mark.parametrize("component", ["oprf", "saderf"])
def test_running_statistics_are_kept_per_head(component):
    fm = per_head_map(component, statistics_mode="running").train()
    q, k = qk()
    k = k * torch.arange(1, H + 1, dtype=k.dtype).view(1, H, 1, 1)  # heads of different scales
    fm(q, k)
    assert fm.running_a.shape == (H,)
    assert len(set(fm.running_a.tolist())) == H


def test_input_map_is_the_identity_at_initialization():
    q, k = qk()
    with_map = per_head_map("posrf", input_map=True)
    without = per_head_map("posrf")
    for a, b in zip(with_map(q, k), without(q, k), strict=True):
        torch.testing.assert_close(a, b)


def test_input_map_gives_the_features_of_the_mapped_inputs():
    fm = per_head_map("saderf", input_map=True)
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        fm.query_map.add_(0.3 * torch.randn(H, D, D, generator=g, dtype=torch.float64))
        fm.key_map.add_(0.3 * torch.randn(H, D, D, generator=g, dtype=torch.float64))
    plain = per_head_map("saderf")
    q, k = qk()
    expected = plain(q @ fm.query_map.detach().mT, k @ fm.key_map.detach().mT)
    for a, b in zip(fm(q, k), expected, strict=True):
        torch.testing.assert_close(a, b)


def test_input_map_has_no_closed_form():
    fm = per_head_map("posrf", input_map=True)
    assert not fm.contract(*qk()).closed


def test_learnable_with_a_weight_matrix_instance_is_refused():
    with pytest.raises(ValueError, match="learnable, num_heads"):
        rf_features.create("posrf", weight_matrix=rf_matrices.create("orf", 8, D), dim=D, learnable=True)


def loss_of(fm: rf_features.FeatureMap, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    phi_q, phi_k = fm(q, k)
    return (phi_q @ phi_k.mT).pow(2).sum()


@pytest.mark.parametrize("use_reentrant", [False, True])
@pytest.mark.parametrize("component", ["oprf", "saderf"])
def test_checkpointed_step_updates_running_statistics_once_and_gives_the_plain_gradients(
    component, use_reentrant
):
    q, k = qk(1)
    plain = per_head_map(component, statistics_mode="running")
    checkpointed = per_head_map(component, statistics_mode="running")
    for fm in (plain, checkpointed):  # a first step moves the statistics off their defaults
        fm.train()
        fm(q, k)
    q1 = q.clone().requires_grad_()
    loss_of(plain, q1, k).backward()
    q2 = q.clone().requires_grad_()
    checkpoint(loss_of, checkpointed, q2, k, use_reentrant=use_reentrant).backward()
    for name in ("running_a", "running_psi") if component == "saderf" else ("running_a",):
        assert torch.equal(getattr(plain, name), getattr(checkpointed, name))
    torch.testing.assert_close(q2.grad, q1.grad)
    torch.testing.assert_close(checkpointed.weight_matrix.weight.grad, plain.weight_matrix.weight.grad)


def test_frozen_statistics_stay_fixed_in_training():
    fm = per_head_map("oprf", statistics_mode="running").train()
    fm.statistics_frozen = True
    q, k = qk()
    fm(q, k)
    assert torch.equal(fm.running_a, torch.zeros(H, dtype=torch.float64))


def test_statistics_stay_fixed_in_eval():
    fm = per_head_map("oprf", statistics_mode="running").eval()
    q, k = qk()
    fm(q, k)
    assert torch.equal(fm.running_a, torch.zeros(H, dtype=torch.float64))
