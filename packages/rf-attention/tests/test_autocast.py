"""Every registered attention runs under ``torch.autocast`` (CPU bfloat16), as in mixed-precision training."""

from __future__ import annotations

import pytest
import torch

import rf_attention

DIM, HEADS, N = 16, 2, 12
BASELINES = ["nystromformer", "skyformer", "linformer", "bigbird", "reformer", "informer"]


@pytest.mark.parametrize("name", rf_attention.names())
def test_every_attention_gives_finite_outputs_of_the_input_shape_under_bfloat16_autocast(name):
    # 16 features for head dimension 8: the smallest count every matrix honours (SGQ's positive rule: 2 d).
    module = rf_attention.create(name, DIM, HEADS, num_features=16, seed=0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, N, DIM, generator=g)
    mask = torch.zeros(2, N, dtype=torch.bool)
    mask[1, 9:] = True
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = module(x, key_padding_mask=mask)
    assert y.shape == x.shape
    assert torch.isfinite(y).all()


@pytest.mark.parametrize("name", BASELINES)
def test_baselines_compute_in_float32_under_autocast(name):
    """Only the projections run in bfloat16: the attention itself matches float32 up to the rounding of
    its output to bfloat16 (relative 2^-8; computed in bfloat16 under autocast, some entries were off by
    more than 100 %)."""
    module = rf_attention.create(name, DIM, HEADS, num_features=8, seed=0).eval()
    x = torch.randn(2, 40, DIM, generator=torch.Generator().manual_seed(1))
    b, n = x.shape[:2]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        q, k, v = module.qkv(x).float().view(b, n, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        out = module.attend(q.bfloat16(), k.bfloat16(), v.bfloat16(), None)
    assert out.dtype == torch.bfloat16
    exact = module.attend(q.bfloat16().float(), k.bfloat16().float(), v.bfloat16().float(), None)
    torch.testing.assert_close(out.float(), exact, rtol=2**-7, atol=1e-5 * exact.abs().max().item())
