"""``rf_attention.ops.recurrent.decode`` against the plain quadratic formula and the causal forward pass."""

import functools

import pytest
import torch

import rf_features
from rf_attention import naive
from rf_attention import rf_attention as attention
from rf_attention.ops import common
from rf_attention.ops.recurrent import decode
from spectraformer_core.testing import seeded_randn

B, H, N, DH, FEATURES = 2, 2, 40, 8, 16
COMPONENTS = rf_features.names()
MATRICES = ("orf", "fastfoodl")
PAIRS = [f"{c}-{m}" for c in COMPONENTS for m in MATRICES]

pytestmark = pytest.mark.usefixtures("one_thread")
randn = functools.partial(seeded_randn, dtype=torch.float64)


def feature_map(pair, dtype=torch.float64):
    """A causal-mode map whose running statistics (OPRF's A, SADERF's Psi) moved away from their defaults."""
    component, matrix = pair.rsplit("-", 1)
    fm = rf_features.create(
        component,
        weight_matrix=matrix,
        num_features=FEATURES,
        dim=DH,
        seed=0,
        statistics_mode="running",
    ).to(dtype)
    fm.train()
    with torch.no_grad():
        for i in range(3):
            fm(randn(B, H, 20, DH, seed=50 + i, scale=1.5, dtype=dtype), randn(B, H, 20, DH, seed=60 + i))
    return fm.eval()


def qkv(seed=1, n=N, scale=1.5, dtype=torch.float64):
    return (randn(B, H, n, DH, seed=seed + i, scale=scale, dtype=dtype) for i in range(3))


def token_by_token(q, k, v, fm, state=None, padding=None):
    outs = []
    with torch.no_grad():
        for t in range(q.shape[-2]):
            mask = None if padding is None else padding[:, t : t + 1]
            sl = slice(t, t + 1)
            out, state = decode(q[..., sl, :], k[..., sl, :], v[..., sl, :], fm, state, key_padding_mask=mask)
            outs.append(out)
    return torch.cat(outs, dim=-2), state


def plain(q, k, v, fm, padding=None):
    with torch.no_grad():
        return naive.naive_rf_attention(q, k, v, fm, causal=True, key_padding_mask=padding)


@pytest.mark.parametrize("pair", PAIRS)
def test_steps_from_no_state_equal_the_plain_causal_formula_in_float64(pair):
    fm = feature_map(pair)
    q, k, v = qkv()
    steps, _ = token_by_token(q, k, v, fm)
    torch.testing.assert_close(steps, plain(q, k, v, fm), rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("pair", PAIRS)
def test_a_prefill_over_many_chunks_then_steps_equal_the_plain_causal_formula(pair):
    fm = feature_map(pair)
    q, k, v = qkv(seed=4)
    with torch.no_grad():
        head, state = decode(q[..., :29, :], k[..., :29, :], v[..., :29, :], fm, None, chunk_size=4)
    tail, _ = token_by_token(q[..., 29:, :], k[..., 29:, :], v[..., 29:, :], fm, state)
    torch.testing.assert_close(torch.cat((head, tail), dim=-2), plain(q, k, v, fm), rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("pair", PAIRS)
def test_left_padded_prefill_then_steps_equal_the_masked_plain_formula(pair):
    fm = feature_map(pair)
    q, k, v = qkv(seed=7)
    padding = torch.zeros(B, N, dtype=torch.bool)
    padding[1, :13] = True  # this row's prefill is all padding but 2 tokens
    with torch.no_grad():
        head, state = decode(
            q[..., :15, :], k[..., :15, :], v[..., :15, :], fm, None, key_padding_mask=padding[:, :15]
        )
    tail, _ = token_by_token(q[..., 15:, :], k[..., 15:, :], v[..., 15:, :], fm, state)
    expected = plain(q, k, v, fm, padding)
    real = ~padding[:, :15]
    torch.testing.assert_close(head.transpose(1, 2)[real], expected[..., :15, :].transpose(1, 2)[real])
    torch.testing.assert_close(tail, expected[..., 15:, :], rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("pair", ["posrf-orf", "trigrf-orf", "saderf-fastfoodl"])
def test_a_padded_step_changes_nothing_but_the_length(pair):
    fm = feature_map(pair)
    q, k, v = qkv(seed=9, n=6)
    padding = torch.tensor([[False] * 5 + [True]] * B)
    _, with_padded = token_by_token(q, k, v, fm, padding=padding)
    _, without = token_by_token(q[..., :5, :], k[..., :5, :], v[..., :5, :], fm)
    true_sums = (s.sums * s.log_scale.exp() for s in (with_padded, without))
    torch.testing.assert_close(*true_sums, rtol=1e-12, atol=0)
    assert with_padded.length == without.length + 1


@pytest.mark.parametrize("pair", ["posrf-orf", "trigrf-orf", "oprf-fastfoodl", "posrf-hyp-orf"])
def test_steps_equal_the_causal_forward_across_its_chunks_and_groups(pair, monkeypatch):
    monkeypatch.setattr(common, "MIN_GROUP_FEATURE_ELEMENTS", 1)  # groups of a few chunks each
    monkeypatch.setattr(common, "CAUSAL_GROUP_FEATURES_PER_QUERY_ELEMENT", 0.05)
    fm = feature_map(pair)
    q, k, v = qkv(seed=11, n=48, scale=2.5)
    with torch.no_grad():
        forward = attention(q, k, v, fm, causal=True, chunk_size=4)
    steps, _ = token_by_token(q, k, v, fm)
    torch.testing.assert_close(steps, forward, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("pair", ["posrf-orf", "trigrf-orf", "oprf-fastfoodl"])
def test_bfloat16_steps_stay_close_to_float64(pair):
    fm = feature_map(pair)
    q, k, v = (x.to(torch.bfloat16) for x in qkv(seed=13, n=24, scale=1.0))
    exact, _ = token_by_token(q.double(), k.double(), v.double(), fm)  # the same (rounded) inputs
    low, state = token_by_token(q, k, v, fm.to(torch.float32))
    assert low.dtype == torch.bfloat16
    assert state.sums.dtype == torch.float32
    torch.testing.assert_close(low.double(), exact, rtol=1.6e-2, atol=1e-2)  # bfloat16 rounding


class OpenFormPosRF(rf_features.PosRF):
    """PosRF without its closed form: decoding takes the generic path (the contract's callable)."""

    def log_form(self, matrix, stats, is_query):
        return None


def test_a_map_without_a_closed_form_decodes_like_the_plain_formula():
    fm = OpenFormPosRF(DH, weight_matrix="orf", num_features=FEATURES, seed=0).double().eval()
    q, k, v = qkv(seed=19, n=20)
    with torch.no_grad():
        head, state = decode(q[..., :7, :], k[..., :7, :], v[..., :7, :], fm, None)
    tail, last = token_by_token(q[..., 7:, :], k[..., 7:, :], v[..., 7:, :], fm, state)
    assert last.layout is None  # no fused step: each token took the causal kernel
    torch.testing.assert_close(torch.cat((head, tail), dim=-2), plain(q, k, v, fm), rtol=1e-9, atol=1e-10)


def test_large_logits_stay_finite_and_exact():
    fm = feature_map("posrf-orf")
    q, k, v = qkv(seed=15, scale=6.0)  # q . k / sqrt(Dh) up to ~100: exp overflows float32
    steps, state = token_by_token(q.float(), k.float(), v.float(), fm.float())
    assert torch.isfinite(state.sums).all()
    torch.testing.assert_close(steps.double(), plain(q, k, v, fm), rtol=1e-3, atol=1e-4)


def test_the_state_of_a_prefill_continues_like_the_state_of_steps():
    fm = feature_map("oprf-orf")
    q, k, v = qkv(seed=17, n=12)
    with torch.no_grad():
        _, prefilled = decode(q, k, v, fm, None)
    _, stepped = token_by_token(q, k, v, fm)
    true_sums = (s.sums * s.log_scale.exp() for s in (prefilled, stepped))
    torch.testing.assert_close(*true_sums, rtol=1e-12, atol=0)
    assert prefilled.length == stepped.length == 12


def test_decode_refuses_a_map_with_statistics_of_the_whole_sequence():
    fm = rf_features.create("oprf", num_features=FEATURES, dim=DH, seed=0)
    q, k, v = qkv(n=1)
    with pytest.raises(ValueError, match=r"feature_map: .*statistics_mode='running'"):
        decode(q, k, v, fm, None)


def test_decode_refuses_a_state_of_other_inputs():
    fm = feature_map("posrf-orf")
    q, k, v = qkv(n=1)
    _, state = decode(q, k, v, fm, None)
    with pytest.raises(ValueError, match="state: expected a RecurrentState of sums shape"):
        decode(q[:1], k[:1], v[:1], fm, state)


def test_a_step_keeps_the_laid_out_map_until_the_map_changes():
    fm = feature_map("posrf-orf")
    q, k, v = qkv(n=3)
    with torch.no_grad():
        _, state = decode(q[..., :1, :], k[..., :1, :], v[..., :1, :], fm, None)
        first = state.layout
        _, state = decode(q[..., 1:2, :], k[..., 1:2, :], v[..., 1:2, :], fm, state)
        assert state.layout is first
        fm.redraw(seed=3)
        _, state = decode(q[..., 2:, :], k[..., 2:, :], v[..., 2:, :], fm, state)
    assert state.layout is not first
