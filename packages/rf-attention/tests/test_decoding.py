"""Token-by-token decoding (prefill, step) against the causal forward pass and a plain quadratic formula."""

import copy

import pytest
import torch

import rf_attention
import rf_features
from rf_attention import naive
from rf_attention.decoding import KVCache, RecurrentState, decode_heads
from rf_attention.ops.features import qk_scale
from spectraformer_core.testing import assert_rel_close, rounding_tolerance
from spectraformer_core.testing import seeded_randn as randn

DIM, HEADS, FEATURES = 32, 2, 32
RF_NAMES = [f"{c}-{m}" for c in rf_features.names() for m in ("orf", "fastfoodl")]
NAMES = ["softmax", *RF_NAMES]

pytestmark = pytest.mark.usefixtures("one_thread")


def trained(name, *, logit_gain=1.0):
    """A causal module whose running statistics (OPRF's A, SADERF's Psi) were updated by training calls."""
    module = rf_attention.create(name, DIM, HEADS, num_features=FEATURES, causal=True, seed=0)
    with torch.no_grad():
        module.qkv.weight[: 2 * DIM] *= logit_gain  # larger q, k: larger attention logits
        module.train()
        for i in range(3):
            module(randn(2, 40, DIM, seed=10 + i, scale=2.0))
    module.eval()
    fm = getattr(module, "feature_map", None)
    for buffer in fm.running_statistics_defaults() if fm is not None else {}:
        default = fm.running_statistics_defaults()[buffer]
        assert not torch.allclose(getattr(fm, f"running_{buffer}"), default), buffer  # statistics moved
    return module


def float32_gain(name):
    """Logit gain of the float32 comparisons: large logits, except for signed (TrigRF) features.

    TrigRF's normalizer cancels at large logits (its relative variance is unbounded, Section 3.2.2): the
    condition number ``|phi_q| . sum |phi_k| / |D|`` reaches 1e4 at gain 3, and float32 rounding of any
    two summation orders differs by that much. The float64 test below covers large logits for it too.
    """
    return 1.0 if name.startswith("trigrf") else 3.0


def normalizer_condition(module, x, padding=None):
    """``max_i |phi_q_i| . sum_{j <= i} |phi_k_j| / |D_i|``: the causal normalizer's condition, in float64.

    How much the normalizer ``D_i`` cancels: 1 for positive features (and softmax), larger for signed ones.
    ``padding`` (bool ``(B, N)``): those keys are left out, and the rows that see no key.
    """
    fm = getattr(module, "feature_map", None)
    if fm is None or fm.positive:
        return 1.0
    module = copy.deepcopy(module).double()
    b, n, _ = x.shape
    with torch.no_grad():
        q, k, _ = module.qkv(x.double()).view(b, n, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        scale = qk_scale(DIM // HEADS)
        phi_q, phi_k = module.feature_map(q * scale, k * scale, key_padding_mask=padding, stabilize=True)
    normalizer = (phi_q @ phi_k.mT).tril().sum(-1)
    bound = (phi_q.abs() @ phi_k.abs().mT).tril().sum(-1)
    return float((bound / normalizer.abs())[bound > 0].max())


def assert_equal_up_to_float32_rounding(label, module, x, expected, actual, padding=None):
    """``actual`` is ``expected`` summed in other orders: within the module's rounding tolerance on ``x``.

    The sums run over the keys, the features (softmax: the head dimension) and the output projection's
    inputs, conditioned by the normalizer (``normalizer_condition``).
    """
    fm = getattr(module, "feature_map", None)
    length = x.shape[1] + (DIM // HEADS if fm is None else fm.feature_width) + DIM
    condition = normalizer_condition(module, x, padding)
    assert_rel_close(label, expected, actual, rounding_tolerance(torch.float32, length, condition))


@pytest.mark.parametrize("name", NAMES)
def test_token_by_token_outputs_equal_the_causal_forward(name, decode_steps):
    module = trained(name, logit_gain=float32_gain(name))
    x = randn(2, 150, DIM, seed=1)  # crosses the causal forward's chunk boundary (128)
    with torch.no_grad():
        full = module(x)
    steps, _ = decode_steps(module, x)
    assert_equal_up_to_float32_rounding("token by token", module, x, full, steps)


@pytest.mark.parametrize("name", NAMES)
def test_prefill_with_left_padding_then_steps_equal_the_masked_forward(name, decode_steps):
    module = trained(name)
    x = randn(3, 30, DIM, seed=2)
    padding = torch.zeros(3, 30, dtype=torch.bool)
    padding[1, :6] = True
    padding[2, :19] = True  # all of the prefill but one token is padding
    with torch.no_grad():
        full = module(x, key_padding_mask=padding)
        head, state = module.prefill(x[:, :20], key_padding_mask=padding[:, :20])
    tail, _ = decode_steps(module, x[:, 20:], state)
    real = ~padding
    assert_equal_up_to_float32_rounding(
        "prefill", module, x, full[:, :20][real[:, :20]], head[real[:, :20]], padding
    )
    assert_equal_up_to_float32_rounding("steps after prefill", module, x, full[:, 20:], tail, padding)


def plain_causal_reference(module, x):
    """The module's projections around rf_attention.naive's quadratic causal formula (unstabilized)."""
    b, n, _ = x.shape
    q, k, v = module.qkv(x).view(b, n, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
    if isinstance(module, rf_attention.SoftmaxAttention):
        out = naive.naive_softmax_attention(q, k, v, causal=True)
    else:
        out = naive.naive_rf_attention(q, k, v, module.feature_map, causal=True)
    return module.proj(out.transpose(1, 2).reshape(b, n, DIM))


@pytest.mark.parametrize("name", NAMES)
def test_decoding_equals_the_naive_quadratic_formula_in_float64(name, decode_steps):
    module = trained(name, logit_gain=3.0).double()
    x = randn(2, 40, DIM, seed=3, dtype=torch.float64)
    with torch.no_grad():
        head, state = module.prefill(x[:, :13])
        tail, _ = decode_steps(module, x[:, 13:], state)
        expected = plain_causal_reference(module, x)
    torch.testing.assert_close(torch.cat([head, tail], dim=1), expected, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("name", ["softmax", "posrf-orf", "trigrf-orf"])
def test_decoding_in_bfloat16_follows_the_bfloat16_forward(name, decode_steps):
    module = trained(name).to(torch.bfloat16)
    x = randn(2, 24, DIM, seed=4).to(torch.bfloat16)
    with torch.no_grad():
        full = module(x)
    steps, _ = decode_steps(module, x)
    assert steps.dtype == torch.bfloat16
    torch.testing.assert_close(steps.float(), full.float(), rtol=0, atol=3e-2)


def test_the_recurrent_state_has_the_same_size_after_any_number_of_tokens(decode_steps):
    module = trained("oprf-orf")
    _, short = decode_steps(module, randn(1, 4, DIM))
    _, long = decode_steps(module, randn(1, 200, DIM))
    assert isinstance(long, RecurrentState)
    assert long.length == 200
    assert short.nbytes() == long.nbytes()
    assert long.numerator.shape == (1, HEADS, FEATURES, DIM // HEADS)


def test_the_softmax_cache_keeps_every_position(decode_steps):
    module = trained("softmax")
    _, cache = decode_steps(module, randn(1, 40, DIM))
    assert isinstance(cache, KVCache)
    assert cache.length == 40
    assert cache.keys.shape[-2] >= 40


def test_step_needs_a_causal_module():
    module = rf_attention.create("posrf-orf", DIM, HEADS, num_features=8)
    with pytest.raises(ValueError, match=r"step: .*causal=False"):
        module.step(randn(1, 1, DIM))
    with pytest.raises(ValueError, match=r"prefill: .*causal=False"):
        module.prefill(randn(1, 3, DIM))


@pytest.mark.parametrize("name", ["softmax", "posrf-orf"])
def test_step_refuses_a_state_of_another_kind_or_batch(name):
    module = trained(name)
    _, state = module.prefill(randn(2, 5, DIM))
    with pytest.raises(ValueError, match="state: expected"):
        module.step(randn(3, 1, DIM), state)
    with pytest.raises(ValueError, match="state: expected"):
        module.step(randn(2, 1, DIM), "not a state")


def test_a_step_sees_earlier_tokens_only_through_the_state():
    module = trained("saderf-orf")
    x = randn(1, 12, DIM, seed=5)
    _, state = module.prefill(x[:, :11])
    y, _ = module.step(x[:, 11:], state)
    changed = x.clone()
    changed[:, :11] += randn(1, 11, DIM, seed=6)
    _, other_state = module.prefill(changed[:, :11])
    y_other, _ = module.step(x[:, 11:], other_state)
    assert not torch.allclose(y, y_other)  # the state carries the prefix, nothing else does


@pytest.mark.parametrize("name", ["softmax", "oprf-orf", "trigrf-orf"])
def test_a_step_of_several_tokens_equals_the_forward(name, decode_steps):
    module = trained(name)
    x = randn(2, 40, DIM, seed=7)
    with torch.no_grad():
        full = module(x)
        head, state = module.prefill(x[:, :10])
        middle, state = module.step(x[:, 10:33], state)  # one block of 23 positions over the state
        tail, _ = decode_steps(module, x[:, 33:], state)
    assert_equal_up_to_float32_rounding(
        "prefill, block, steps", module, x, full, torch.cat([head, middle, tail], dim=1)
    )


def test_selecting_rows_of_a_state_equals_prefilling_those_rows():
    module = trained("oprf-orf")
    x = randn(3, 9, DIM, seed=8)
    order = torch.tensor([2, 0, 0])  # beam search: rows reordered and repeated
    with torch.no_grad():
        _, state = module.prefill(x)
        _, expected = module.prefill(x[order])
        selected = state.select(order)
        for name in ("sums", "log_scale"):
            torch.testing.assert_close(getattr(selected, name), getattr(expected, name))
        token = randn(3, 1, DIM, seed=9)
        torch.testing.assert_close(module.step(token, selected)[0], module.step(token, expected)[0])


@pytest.mark.parametrize("window", [0, 3])
@pytest.mark.parametrize("component", ["posrf", "oprf"])
def test_one_scale_convention_for_the_forward_and_decoding_in_float64(component, window):
    # scale is the logit scale of q . k: sqrt(scale) on each of q and k, in rf_attention and decode_heads
    scale, d = 0.6, 8
    fm = rf_features.create(
        component, weight_matrix="orf", num_features=16, dim=d, seed=0, statistics_mode="running"
    )
    fm = fm.double().eval()  # running statistics fixed: every call sees the same map
    q, k, v = (randn(2, 2, 9, d, seed=40 + i, scale=2.0, dtype=torch.float64) for i in range(3))
    padding = torch.zeros(2, 9, dtype=torch.bool)
    padding[1, :2] = True
    masks = {"key_padding_mask": padding, "query_padding_mask": padding}
    factor = scale**0.5 * d**0.25  # the reference scales each side by Dh^-1/4 itself
    expected = naive.naive_rf_attention(q * factor, k * factor, v, fm, causal=True, window=window, **masks)
    forward = rf_attention.rf_attention(q, k, v, fm, causal=True, window=window, scale=scale, **masks)
    options = {"window": window, "scale": scale}
    first = (t[..., :4, :] for t in (q, k, v))
    head, state = decode_heads(*first, fm, None, key_padding_mask=padding[:, :4], **options)
    steps = []
    for i in range(4, 9):
        out, state = decode_heads(*(t[..., i : i + 1, :] for t in (q, k, v)), fm, state, **options)
        steps.append(out)
    real = (~padding)[:, None, :, None].expand_as(expected)
    for got in (forward, torch.cat([head, *steps], dim=-2)):
        torch.testing.assert_close(got[real], expected[real], rtol=1e-10, atol=1e-12)
