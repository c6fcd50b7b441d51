"""Random-feature attention: agreement with softmax, causality, padding, gradients, precision, redraws."""

import itertools

import pytest
import torch

import rf_attention
import rf_features
from rf_attention import rf_attention as rf_attend
from rf_attention import softmax_attention
from spectraformer_core.testing import assert_rel_close, relative_error

COMPONENTS = rf_features.names()


def qkv(b=2, h=2, n=24, d=16, scale=1.0, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g, dtype=dtype) * scale for _ in range(3)]


def feature_map(name, num_features, d=16, **kw):
    return rf_features.create(
        name,
        weight_matrix="orf",
        num_features=num_features,
        dim=d,
        seed=0,
        matrix_options={"dtype": torch.float64},
        **kw,
    )


@pytest.mark.parametrize("name", COMPONENTS)
def test_rf_attention_approaches_softmax_as_features_grow(name):
    q, k, v = qkv(scale=0.5)
    exact = softmax_attention(q, k, v)
    errors = []
    for s in (64, 512, 4096):
        runs = []
        for seed in range(3):
            fm = feature_map(name, s)
            fm.redraw(seed=seed)
            runs.append(relative_error(rf_attend(q, k, v, fm), exact))
        errors.append(sum(runs) / len(runs))
    assert errors[0] > errors[1] > errors[2], errors
    assert errors[2] < 0.05, errors


@pytest.mark.parametrize("name", COMPONENTS)
def test_causal_output_ignores_later_tokens_and_equals_the_prefix_output(name):
    q, k, v = qkv(n=40, scale=2.0)
    fm = feature_map(name, 32, statistics_mode="running").eval()
    out = rf_attend(q, k, v, fm, causal=True, chunk_size=8)
    changed = [t.clone() for t in (q, k, v)]
    for t in changed:
        t[..., 25:, :] = torch.randn_like(t[..., 25:, :]) * 50
    out2 = rf_attend(*changed, fm, causal=True, chunk_size=8)
    torch.testing.assert_close(out2[..., :25, :], out[..., :25, :])
    prefix = rf_attend(q[..., :25, :], k[..., :25, :], v[..., :25, :], fm, causal=False)
    torch.testing.assert_close(out[..., 24, :], prefix[..., 24, :])


def test_causal_attention_refuses_sequence_statistics():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="statistics_mode='running'"):
        rf_attend(q, k, v, feature_map("oprf", 16), causal=True)


def test_running_statistics_update_after_use_in_training_only():
    fm = feature_map("oprf", 16, statistics_mode="running")
    q, k, v = qkv(scale=3.0)
    assert float(fm.running_a) == 0.0
    fm.train()
    first = rf_attend(q, k, v, fm, causal=True)
    posrf = feature_map("posrf", 16)
    torch.testing.assert_close(first, rf_attend(q, k, v, posrf, causal=True))  # A = 0 before any update
    updated = float(fm.running_a)
    assert updated < 0.0
    fm.eval()
    rf_attend(q, k, v, fm, causal=True)
    assert float(fm.running_a) == updated


ALL_ATTENTIONS = [
    "softmax",
    "performer",
    *[f"{c}-{m}" for c in COMPONENTS for m in ("orf", "sgq", "fastfoodl")],
]


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("name", ALL_ATTENTIONS)
def test_padded_tokens_change_nothing_in_the_other_outputs(name, causal):
    torch.manual_seed(0)
    # 32 features: sgq's antipodal rule (positive components) needs 2 * head_dim rows
    attn = rf_attention.create(name, 32, 2, num_features=32, seed=0, causal=causal).double().eval()
    x = torch.randn(2, 12, 32, dtype=torch.float64)
    mask = torch.zeros(2, 12, dtype=torch.bool)
    mask[0, 8:] = True
    out = attn(x, key_padding_mask=mask)
    changed = x.clone()
    changed[0, 8:] = torch.randn(4, 32, dtype=torch.float64) * 30
    torch.testing.assert_close(attn(changed, key_padding_mask=mask)[0, :8], out[0, :8])
    torch.testing.assert_close(attn(changed, key_padding_mask=mask)[1], out[1])
    everything = torch.ones(2, 12, dtype=torch.bool)
    assert torch.isfinite(attn(x, key_padding_mask=everything)).all()


@pytest.mark.parametrize("name", ["performer", "oprf-fastfoodl", "saderf-orf", "trigrf-sorf"])
def test_gradients_reach_queries_keys_values_and_learnable_matrices(name):
    q, k, v = (t.float().requires_grad_() for t in qkv(dtype=torch.float32))
    fm = rf_features.create(
        name.replace("performer", "posrf-orf").rsplit("-", 1)[0],
        weight_matrix=name.replace("performer", "posrf-orf").rsplit("-", 1)[1],
        num_features=32,
        dim=16,
        seed=0,
    )
    rf_attend(q, k, v, fm).square().sum().backward()
    for t in (q, k, v):
        assert t.grad is not None
        assert torch.isfinite(t.grad).all()
        assert t.grad.abs().sum() > 0
    for p in fm.parameters():
        assert p.grad is not None
        assert p.grad.abs().sum() > 0


@pytest.mark.parametrize("name", ["performer", *[f"{c}-qmc" for c in COMPONENTS]])
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
def test_bfloat16_outputs_are_finite_and_close_to_float32(name, causal):
    torch.manual_seed(0)
    attn = rf_attention.create(name, 64, 2, num_features=64, seed=0, causal=causal).eval()
    x = torch.randn(2, 256, 64)
    with torch.no_grad():
        full = attn(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = attn(x)
    assert torch.isfinite(low).all()
    assert_rel_close("bfloat16 autocast output", full, low, 0.05)


def test_redraw_happens_exactly_at_the_interval_in_training_and_never_in_eval():
    attn = rf_attention.create("posrf-orf", 32, 2, num_features=16, seed=0, redraw_interval=3)
    x = torch.randn(1, 5, 32)
    seen = []
    for _ in range(7):
        attn(x)
        seen.append(attn.feature_map.weight_matrix.matrix().clone())
    changed = [not torch.equal(a, b) for a, b in itertools.pairwise(seen)]
    assert changed == [False, False, True, False, False, True]  # redrawn before calls 3 and 6
    attn.eval()
    for _ in range(5):
        attn(x)
    assert torch.equal(attn.feature_map.weight_matrix.matrix(), seen[-1])
    never = rf_attention.create("posrf-orf", 32, 2, num_features=16, seed=0)
    before = never.feature_map.weight_matrix.matrix().clone()
    for _ in range(4):
        never(x)
    assert torch.equal(never.feature_map.weight_matrix.matrix(), before)


def test_registry_lists_every_pair_and_refuses_unknown_names():
    names = rf_attention.names()
    for c in COMPONENTS:
        assert f"{c}-fastfoodl" in names
    assert {"softmax", "performer", "posrf-hyp-orf"} <= set(names)
    assert rf_attention.names("oprf-*") == [n for n in names if n.startswith("oprf-")]
    with pytest.raises(
        ValueError, match=r"(?s)unknown attention 'relu-orf'; did you mean .*named: .*softmax"
    ):
        rf_attention.create("relu-orf", 32, 2)
    with pytest.raises(ValueError, match="num_heads: expected a divisor of dim=32, got 3"):
        rf_attention.create("softmax", 32, 3)


def test_module_maps_batch_sequence_width_to_itself_and_checks_its_input():
    attn = rf_attention.create("oprf-fastfoodl", 64, 2, num_features=32, seed=0, dropout=0.1)
    x = torch.randn(3, 50, 64)
    assert attn(x).shape == (3, 50, 64)
    with pytest.raises(ValueError, match=r"x: expected shape \(B, N, 64\)"):
        attn(torch.randn(3, 50, 32))
    with pytest.raises(ValueError, match="key_padding_mask: expected a bool tensor of shape"):
        attn(x, key_padding_mask=torch.zeros(3, 49, dtype=torch.bool))


def test_state_dict_round_trip_keeps_the_features_and_the_redraw_schedule():
    source = rf_attention.create("oprf-sorf", 32, 2, num_features=16, seed=0, redraw_interval=2)
    x = torch.randn(1, 6, 32)
    for _ in range(3):
        source(x)
    target = rf_attention.create("oprf-sorf", 32, 2, num_features=16, seed=5, redraw_interval=2)
    target.load_state_dict(source.state_dict())
    torch.testing.assert_close(target(x), source(x))  # both redraw here (call 4), identically


@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.0, 2.5, 3.0], ids=lambda s: f"sigma{s}")
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("name", COMPONENTS)
def test_stabilized_normalizer_equals_the_plain_formula_at_large_logits(name, causal, sigma):
    """Every row equals ``phi_q (phi_k^T v) / (phi_q phi_k^T 1)`` of the same unstabilized features.

    ``q, k ~ N(0, sigma^2 I)``, ``Dh = 32``, ``N = 256``, ``s = 128``: logits of std ``sigma^2`` (9 at
    ``sigma = 3``), as trained models produce. An absolute floor on the stabilized normalizer (the old
    ``|D| < 1e-6 -> 1e-6``) made up to 22 % of the rows wrong here (OPRF, sigma = 3, max error 2.9).
    """
    q, k, v = qkv(b=1, h=2, n=256, d=32)
    q, k = q * sigma, k * sigma
    fm = feature_map(name, 128, d=32, statistics_mode="running" if causal else "batch")
    if causal and fm.running_statistics_defaults():
        fm.train()
        rf_attend(q, k, v, fm, causal=True)  # one update: data-dependent running statistics
        fm.eval()
    out = rf_attend(q, k, v, fm, causal=causal)
    plain = rf_attention.naive.naive_rf_attention(q, k, v, fm, causal=causal)
    assert torch.isfinite(plain).all()
    row_error = (out - plain).abs().amax(-1)
    assert (row_error <= 1e-9 * (1 + plain.abs().amax(-1))).all(), float(row_error.max())


@pytest.mark.parametrize("function", ["rf_attention", "softmax_attention", "linear_attention"])
def test_functional_api_refuses_integer_queries_and_keys(function):
    q = torch.randint(-3, 3, (1, 2, 5, 16))
    v = torch.randn(1, 2, 5, 16)
    args = (q, q, v, feature_map("posrf", 8)) if function == "rf_attention" else (q, q, v)
    with pytest.raises(ValueError, match=r"q: expected a floating-point tensor .* torch\.int64"):
        getattr(rf_attention, function)(*args)
