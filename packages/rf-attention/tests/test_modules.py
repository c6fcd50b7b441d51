"""The attention modules' contract: input dtypes refused by name, seeds that fix every random draw."""

import pytest
import torch

import rf_attention

SOME = ["softmax", "posrf-orf", "oprf-fastfoodl", "nystromformer", "reformer"]


@pytest.mark.parametrize("name", SOME)
@pytest.mark.parametrize("dtype", [torch.float64, torch.int64, torch.bfloat16])
def test_forward_refuses_an_input_dtype_other_than_the_modules_and_names_it(name, dtype):
    module = rf_attention.create(name, 16, 2, num_features=8, seed=0)
    x = torch.ones(2, 8, 16, dtype=dtype)
    with pytest.raises(ValueError, match=rf"x: expected .*float32.*got {dtype}"):
        module(x)


def test_forward_accepts_the_modules_own_dtype_and_autocast():
    module = rf_attention.create("posrf-orf", 16, 2, num_features=8, seed=0)
    x = torch.randn(2, 8, 16)
    assert module.double()(x.double()).dtype == torch.float64
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.isfinite(module.float()(x.bfloat16())).all()


def test_step_refuses_an_integer_input_by_name():
    module = rf_attention.create("posrf-orf", 16, 2, num_features=8, causal=True, seed=0)
    with pytest.raises(ValueError, match=r"x: expected a floating-point tensor.*torch.int64"):
        module.step(torch.ones(1, 1, 16, dtype=torch.int64))


def _created_under_global_seed(name, global_seed, seed):
    torch.manual_seed(global_seed)
    return rf_attention.create(name, 16, 2, num_features=16, seed=seed).eval()


@pytest.mark.parametrize("name", rf_attention.names())
def test_the_same_seed_gives_equal_modules_under_different_global_seeds(name):
    first, second = (_created_under_global_seed(name, g, seed=5) for g in (0, 1))
    a, b = first.state_dict(), second.state_dict()
    assert a.keys() == b.keys()
    for key, value in a.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, b[key]), key
    x = torch.randn(2, 12, 16, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(first(x), second(x), rtol=0, atol=0)


@pytest.mark.parametrize("name", ["softmax", "posrf-orf", "reformer"])
def test_projections_follow_the_seed_and_the_global_rng_without_one(name):
    seeded = [_created_under_global_seed(name, 0, seed=s).proj.weight for s in (5, 6)]
    assert not torch.equal(*seeded)
    unseeded = [_created_under_global_seed(name, g, seed=None).proj.weight for g in (0, 1)]
    assert not torch.equal(*unseeded)


def test_seeded_projections_are_pytorchs_default_initialization():
    module = rf_attention.create("softmax", 64, 2, seed=0)
    bound = 64**-0.5
    for layer in (module.qkv, module.proj):
        for p in (layer.weight.detach(), layer.bias.detach()):
            assert float(p.abs().max()) <= bound
            assert float(p.abs().max()) > 0.9 * bound  # uniform on (-bound, bound), not a narrower law
