"""linear_attention and softmax_attention against their naive quadratic references."""

import pytest
import torch

from rf_attention import linear_attention, naive, softmax_attention


def naive_linear_attention(phi_q, phi_k, v, causal=False, mask=None):
    return naive.naive_linear_attention(phi_q, phi_k, v, causal=causal, key_padding_mask=mask)


def naive_softmax_attention(q, k, v, causal=False, mask=None):
    return naive.naive_softmax_attention(q, k, v, causal=causal, key_padding_mask=mask)


def features(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(*shape, generator=g, dtype=torch.float64) + 0.1


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("chunk_size", [1, 5, 64])
def test_linear_attention_equals_the_naive_quadratic_form(causal, chunk_size):
    phi_q, phi_k, v = features(2, 3, 23, 8), features(2, 3, 23, 8, seed=1), features(2, 3, 23, 4, seed=2)
    out = linear_attention(phi_q, phi_k, v, causal=causal, chunk_size=chunk_size)
    torch.testing.assert_close(out, naive_linear_attention(phi_q, phi_k, v, causal))


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
def test_key_log_scales_multiply_the_key_features(causal):
    phi_q, phi_k, v = features(2, 2, 19, 6), features(2, 2, 19, 6, seed=1), features(2, 2, 19, 3, seed=2)
    scale = torch.randn(2, 2, 19, dtype=torch.float64) * 30  # far beyond exp's float range
    out = linear_attention(phi_q, phi_k, v, causal=causal, key_log_scale=scale, chunk_size=4)
    top = scale.amax(-1, keepdim=True)
    reference = naive_linear_attention(phi_q, phi_k * torch.exp(scale - top)[..., None], v, causal)
    torch.testing.assert_close(out, reference)


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
def test_padded_keys_contribute_nothing_and_all_padding_rows_are_zero(causal):
    phi_q, phi_k, v = features(2, 2, 10, 6), features(2, 2, 10, 6, seed=1), features(2, 2, 10, 3, seed=2)
    mask = torch.zeros(2, 10, dtype=torch.bool)
    mask[0, 6:] = True
    mask[1, :3] = True  # leading padding: causal rows 0..2 see no key
    out = linear_attention(phi_q, phi_k, v, causal=causal, key_padding_mask=mask, chunk_size=4)
    if causal:
        assert (out[1, :, :3] == 0).all()
        torch.testing.assert_close(
            out[1, :, 3:], naive_linear_attention(phi_q, phi_k, v, True, mask)[1, :, 3:]
        )
    else:
        torch.testing.assert_close(out, naive_linear_attention(phi_q, phi_k, v, False, mask))
    changed = phi_k.clone()
    changed[0, :, 6:] = 1e6
    torch.testing.assert_close(
        linear_attention(phi_q, changed, v, causal=causal, key_padding_mask=mask, chunk_size=4), out
    )
    everything = torch.ones(2, 10, dtype=torch.bool)
    assert (linear_attention(phi_q, phi_k, v, causal=causal, key_padding_mask=everything) == 0).all()


def test_low_precision_inputs_are_accumulated_in_float32():
    phi_q, phi_k, v = (
        features(1, 1, 4096, 16),
        features(1, 1, 4096, 16, seed=1),
        features(1, 1, 4096, 8, seed=2),
    )
    exact = linear_attention(phi_q, phi_k, v)
    low = linear_attention(phi_q.bfloat16(), phi_k.bfloat16(), v.bfloat16())
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.double(), exact, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
def test_softmax_attention_equals_the_naive_reference_with_masks(causal):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 9, 8, generator=g, dtype=torch.float64) for _ in range(3))
    mask = torch.zeros(2, 9, dtype=torch.bool)
    mask[0, 5:] = True
    out = softmax_attention(q, k, v, causal=causal, key_padding_mask=mask)
    torch.testing.assert_close(out, naive_softmax_attention(q, k, v, causal, mask))
    everything = torch.ones(2, 9, dtype=torch.bool)
    assert (softmax_attention(q, k, v, causal=causal, key_padding_mask=everything) == 0).all()


def test_shape_errors_name_the_arguments():
    x = torch.randn(1, 2, 5, 4)
    with pytest.raises(ValueError, match="q, k, v: expected shapes"):
        linear_attention(x, x, torch.randn(1, 2, 6, 4))
    with pytest.raises(ValueError, match="causal: needs as many queries as keys"):
        linear_attention(x, torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 4), causal=True)
    with pytest.raises(ValueError, match=r"key_padding_mask: expected a bool tensor of shape \(B, N_k\)"):
        linear_attention(x, x, x, key_padding_mask=torch.zeros(1, 4, dtype=torch.bool))
