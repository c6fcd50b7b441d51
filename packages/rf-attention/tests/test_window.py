"""The sliding-window hybrid against its plain quadratic reference: outputs, gradients, masks, decoding."""

import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import rf_attention
import rf_features
from rf_attention import rf_attention as rf_attend
from rf_attention import softmax_attention
from rf_attention.ops.naive import naive_rf_attention, naive_softmax_attention
from spectraformer_core.testing import assert_rel_close
from spectraformer_core.testing import seeded_randn as randn

pytestmark = pytest.mark.usefixtures("one_thread")

#: One weight matrix per component family, and the learned FastFood_L.
PAIRS = [
    ("trigrf", "orf"),
    ("posrf", "orf"),
    ("gerf", "orf"),
    ("oprf", "orf"),
    ("saderf", "orf"),
    ("oprf", "fastfoodl"),
]
PAIR_IDS = [f"{c}-{m}" for c, m in PAIRS]
POSITIVE_PAIRS = [p for p in PAIRS if p[0] != "trigrf"]
N, D = 101, 8  # odd; crosses the exact part's blocks (64) and the causal chunks (16 below)


def qkv(n=N, d=D, scale=1.0, seed=0, dtype=torch.float64, b=2, h=2):
    return [randn(b, h, n, d, seed=seed + i, scale=scale, dtype=dtype) for i in range(3)]


def trained_map(component, matrix, d=D, num_features=16, dtype=torch.float64):
    """A causal (running-statistics) map whose statistics moved away from their defaults, in eval."""
    fm = rf_features.create(
        component,
        weight_matrix=matrix,
        num_features=num_features,
        dim=d,
        seed=0,
        statistics_mode="running",
        matrix_options={"dtype": dtype},
    )
    q, k, _ = qkv(d=d, scale=0.7, seed=50, dtype=dtype)
    with torch.no_grad():
        fm(q, k)
    return fm.eval()


def padding(n=N, b=2):
    """Left padding of row 0, right padding of row 1 (its last keys unseen by no query but themselves)."""
    mask = torch.zeros(b, n, dtype=torch.bool)
    mask[0, :9] = True
    mask[1, n - 13 :] = True
    return mask


WINDOWS = [0, 1, 5, N - 1, N, N + 7]


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize(("component", "matrix"), PAIRS, ids=PAIR_IDS)
def test_outputs_equal_the_naive_hybrid(component, matrix, window):
    q, k, v = qkv(scale=1.5)
    fm = trained_map(component, matrix)
    mask = padding()
    out = rf_attend(q, k, v, fm, causal=True, window=window, key_padding_mask=mask, chunk_size=16)
    expected = naive_rf_attention(q, k, v, fm, causal=True, window=window, key_padding_mask=mask)
    # TrigRF's signed normalizer: float64 rounding times its condition number (|phi_q| . sum |phi_k| / |D|)
    assert_rel_close("output", expected, out, 1e-8 if component == "trigrf" else 1e-12)


@pytest.mark.parametrize("chunk_size", [16, None])
def test_lengths_that_fill_whole_chunks_and_blocks_equal_the_naive_hybrid(chunk_size):
    q, k, v = qkv(n=256, scale=1.5)  # 2 x 128 (default chunk) = 16 x 16 = 4 x 64 (exact blocks)
    fm = trained_map("oprf", "orf")
    for window in (3, 64):
        out = rf_attend(q, k, v, fm, causal=True, window=window, chunk_size=chunk_size)
        expected = naive_rf_attention(q, k, v, fm, causal=True, window=window)
        assert_rel_close("output", expected, out, 1e-12)


@pytest.mark.parametrize("window", [1, 5, N - 1])
@pytest.mark.parametrize(("component", "matrix"), PAIRS, ids=PAIR_IDS)
def test_gradients_equal_the_naive_hybrid(component, matrix, window):
    fm = trained_map(component, matrix)
    mask = padding()
    learned = [p for p in fm.parameters() if p.requires_grad]  # FastFood_L's
    grads = []
    for attention in (rf_attend, naive_rf_attention):
        q, k, v = (t.requires_grad_() for t in qkv(scale=1.5))
        fm.zero_grad()
        out = attention(q, k, v, fm, causal=True, window=window, key_padding_mask=mask)
        weight = randn(*out.shape, seed=9, dtype=out.dtype).masked_fill(mask[:, None, :, None], 0.0)
        (out * weight).sum().backward()
        grads.append([t.grad for t in (q, k, v, *learned)])
    names = ["q", "k", "v", *(f"parameter {i}" for i in range(len(learned)))]
    for name, actual, expected in zip(names, *grads, strict=True):
        assert_rel_close(f"grad {name}", expected, actual, 1e-8 if component == "trigrf" else 1e-11)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_window_as_long_as_the_sequence_is_exact_causal_softmax(dtype):
    q, k, v = qkv(scale=3.0, dtype=dtype)
    fm = trained_map("posrf", "orf", dtype=dtype)
    mask = padding()
    expected = softmax_attention(q, k, v, causal=True, key_padding_mask=mask)
    for window in (N, N + 7):
        out = rf_attend(q, k, v, fm, causal=True, window=window, key_padding_mask=mask)
        torch.testing.assert_close(out, expected)


def test_window_zero_is_the_plain_random_feature_path_bit_for_bit():
    q, k, v = qkv(dtype=torch.float32)
    fm = trained_map("oprf", "orf", dtype=torch.float32)
    assert torch.equal(rf_attend(q, k, v, fm, causal=True, window=0), rf_attend(q, k, v, fm, causal=True))


def large_logits(n, scale, seed=0):
    """Peaked inputs: key ``i - 1`` is half query ``i`` (logits up to about ``scale^2 sqrt(D)``)."""
    q, k, v = qkv(n=n, scale=scale, seed=seed)
    k = 0.5 * k + 0.5 * q.roll(-1, dims=-2)
    return q, k, v


@pytest.mark.parametrize("window", [1, 8, 64])
@pytest.mark.parametrize(("component", "matrix"), POSITIVE_PAIRS, ids=PAIR_IDS[1:])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_large_logits_in_low_precision_match_the_float64_reference(component, matrix, window, dtype):
    """Logits up to 60 (exp overflows float32 past 88): one reference for both parts, nothing overflows."""
    q, k, v = (t.to(dtype).double() for t in large_logits(300, scale=3.0))
    assert 30 < float((q @ k.mT).tril().max()) / D**0.5 < 80
    fm = trained_map(component, matrix)
    mask = padding(300)
    expected = naive_rf_attention(q, k, v, fm, causal=True, window=window, key_padding_mask=mask)
    out = rf_attend(*(t.to(dtype) for t in (q, k, v)), fm, causal=True, window=window, key_padding_mask=mask)
    assert out.dtype == dtype
    assert bool(out.isfinite().all())
    # float32: the features' logs (up to ~60) carry a relative 6e-8 each; bfloat16: the output's rounding
    assert_rel_close("output", expected, out.double(), 1e-5 if dtype == torch.float32 else 1e-2)


def test_trigrf_at_large_logits_in_float64_matches_the_reference():
    q, k, v = large_logits(200, scale=2.0)
    fm = trained_map("trigrf", "orf")
    for window in (1, 8):
        out = rf_attend(q, k, v, fm, causal=True, window=window)
        expected = naive_rf_attention(q, k, v, fm, causal=True, window=window)
        assert_rel_close("output", expected, out, 1e-6)


def test_window_logits_near_float32s_exp_limit_stay_finite_and_exact():
    """Window logits above 80 (e^88 overflows float32): the exact weights sit below the shared reference."""
    q, k, v = large_logits(150, scale=4.0, seed=3)
    q, k = q.float(), k.float()
    fm = trained_map("posrf", "orf", dtype=torch.float32)
    out = rf_attend(q, k, v.float(), fm, causal=True, window=4)
    expected = naive_rf_attention(
        q.double(), k.double(), v, trained_map("posrf", "orf"), causal=True, window=4
    )
    assert bool(out.isfinite().all())
    assert_rel_close("output", expected, out.double(), 1e-5)


def test_features_alone_carry_a_query_whose_window_is_padding():
    """Large norms put the features' logs near -170 (e^-170 underflows float32): scaled by their own sum."""
    q, k, v = qkv(n=80, scale=10.0, dtype=torch.float32)
    mask = torch.zeros(2, 80, dtype=torch.bool)
    mask[:, 50:60] = True  # queries 54..59 see padding only in their window of 4, features beyond it
    fm = trained_map("posrf", "orf", dtype=torch.float32)
    out = rf_attend(q, k, v, fm, causal=True, window=4, key_padding_mask=mask)
    reference_map = trained_map("posrf", "orf")
    expected = naive_rf_attention(
        *(t.double() for t in (q, k, v)), reference_map, causal=True, window=4, key_padding_mask=mask
    )
    assert float(expected[..., 54:60, :].abs().amin()) > 0  # the features' part is all these rows have
    # float32 logits up to 600 carry up to 4e-5 of rounding each
    assert_rel_close("output", expected, out.double(), 1e-4)


def test_packed_sequences_equal_each_sequence_alone():
    lengths = [37, 1, 64, 20]
    total = sum(lengths)
    q, k, v = qkv(n=total, b=1, scale=1.5)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    fm = trained_map("saderf", "orf")
    out = rf_attend(q, k, v, fm, causal=True, window=5, cu_seqlens=cu)
    for start, stop in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        part = slice(start, stop)
        alone = naive_rf_attention(
            q[..., part, :], k[..., part, :], v[..., part, :], fm, causal=True, window=5
        )
        assert_rel_close(f"sequence {start}:{stop}", alone, out[..., part, :], 1e-12)


def test_no_matrix_grows_with_the_square_of_the_length():
    """Forward and backward at N = 1024: no tensor above ``N x 128`` (the blocks, the chunk products)."""
    n, window = 1024, 16
    q, k, v = (t.requires_grad_() for t in qkv(n=n, b=1, h=1, dtype=torch.float32))
    fm = trained_map("posrf", "orf", dtype=torch.float32)

    class Largest(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, tuple | list) else (out,):
                if isinstance(t, torch.Tensor):
                    Largest.largest = max(Largest.largest, t.numel())
            return out

    with Largest():
        rf_attend(q, k, v, fm, causal=True, window=window).sum().backward()
    # the exact part's (N / c, c, 2c) scores (c = 64) and the causal kernel's (N / 128, 128, 128) products
    assert Largest.largest <= n * 128 < n * n // 4, Largest.largest


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"window": 4, "causal": False}, "window: the sliding-window hybrid is causal"),
        ({"window": -1, "causal": True}, "window"),
    ],
)
def test_refused_windows_name_the_argument(kwargs, match):
    q, k, v = qkv(n=10)
    with pytest.raises(ValueError, match=match):
        rf_attend(q, k, v, trained_map("posrf", "orf"), **kwargs)


def test_a_gaussian_kernel_is_refused_with_a_window():
    fm = rf_features.create("posrf", weight_matrix="orf", num_features=8, dim=D, seed=0, kernel="gaussian")
    q, k, v = qkv(n=10)
    with pytest.raises(ValueError, match="kernel='softmax'"):
        rf_attend(q, k, v, fm, causal=True, window=3)


# Modules and decoding

DIM, HEADS = 32, 2
MODULE_NAMES = [f"{c}-{m}" for c, m in PAIRS]


def trained_module(name, window, *, logit_gain=2.0):
    """A causal window module whose running statistics moved (three training calls), in eval, float64."""
    module = rf_attention.create(name, DIM, HEADS, num_features=16, causal=True, seed=0, window=window)
    with torch.no_grad():
        module.qkv.weight[: 2 * DIM] *= logit_gain
        module.train()
        for i in range(3):
            module(randn(2, 40, DIM, seed=10 + i, scale=2.0))
    # float64 from here on: steps and the forward sum in other orders, and in float32 their difference is
    # rounding that depends on the CPU's kernels (AVX2 vs AVX-512); in float64 it is far below the default
    # tolerance on any machine
    return module.double().eval()


def randn64(*shape, **kw):
    """``randn`` in float64, for the float64 modules of `trained_module`."""
    return randn(*shape, **kw).double()


@pytest.mark.parametrize("window", [1, 5, 140])
@pytest.mark.parametrize("name", MODULE_NAMES)
def test_token_by_token_steps_equal_the_causal_forward(name, window, decode_steps):
    module = trained_module(name, window, logit_gain=1.0 if name.startswith("trigrf") else 2.0)
    x = randn64(2, 130, DIM, seed=1)  # crosses the causal kernel's chunk (128) and the exact blocks (64)
    with torch.no_grad():
        full = module(x)
        head, state = module.prefill(x[:, :70])
    tail, _ = decode_steps(module, x[:, 70:], state)
    from_start, _ = decode_steps(module, x)
    torch.testing.assert_close(head, full[:, :70])
    torch.testing.assert_close(tail, full[:, 70:])
    torch.testing.assert_close(from_start, full)


def test_prefill_with_left_padding_then_steps_equal_the_masked_forward(decode_steps):
    module = trained_module("oprf-orf", 6)
    x = randn64(3, 30, DIM, seed=2)
    mask = torch.zeros(3, 30, dtype=torch.bool)
    mask[1, :6] = True
    mask[2, :19] = True  # all of the prompt but one token is padding
    with torch.no_grad():
        full = module(x, key_padding_mask=mask)
        head, state = module.prefill(x[:, :20], key_padding_mask=mask[:, :20])
    tail, _ = decode_steps(module, x[:, 20:], state)
    real = ~mask[:, :20]
    torch.testing.assert_close(head[real], full[:, :20][real])
    torch.testing.assert_close(tail, full[:, 20:])


def test_packed_prompts_continue_each_after_its_own_last_token(decode_steps):
    module = trained_module("posrf-orf", 4)
    lengths = [9, 2, 15]
    prompts = [randn64(1, n + 5, DIM, seed=20 + i) for i, n in enumerate(lengths)]
    packed = torch.cat([p[:, :n] for p, n in zip(prompts, lengths, strict=True)], dim=1)
    cu = torch.tensor([0, 9, 11, 26], dtype=torch.int32)
    with torch.no_grad():
        _, state = module.prefill(packed, cu_seqlens=cu)
    tail, _ = decode_steps(
        module, torch.cat([p[:, n:] for p, n in zip(prompts, lengths, strict=True)], dim=0), state
    )
    for i, (prompt, n) in enumerate(zip(prompts, lengths, strict=True)):
        with torch.no_grad():
            alone = module(prompt)
        torch.testing.assert_close(tail[i : i + 1], alone[:, n:])
    assert state.length.tolist() == [n + 5 for n in lengths]


def test_the_decoding_state_does_not_grow_with_the_context(decode_steps):
    module = trained_module("posrf-orf", 8)
    _, short = decode_steps(module, randn64(1, 10, DIM, seed=3))
    _, long = decode_steps(module, randn64(1, 300, DIM, seed=3))
    assert short.nbytes() == long.nbytes()
    m, w = module.feature_map.feature_width, 8
    head_dim = DIM // HEADS
    assert long.keys.shape == (1, HEADS, w, head_dim)
    assert long.sums.shape == (1, HEADS, m, head_dim + 1)


def test_a_state_of_another_window_is_refused():
    _, state = trained_module("posrf-orf", 4).prefill(randn64(1, 6, DIM, seed=4))
    with pytest.raises(ValueError, match="WindowState of window 8"):
        trained_module("posrf-orf", 8).step(randn64(1, 1, DIM, seed=5), state)


def test_a_window_module_shows_its_window():
    assert "causal=True, window=4" in repr(
        rf_attention.create("posrf-orf", DIM, HEADS, causal=True, window=4)
    )


def test_a_window_module_needs_causal_attention():
    with pytest.raises(ValueError, match="window: the sliding-window hybrid needs causal=True"):
        rf_attention.create("posrf-orf", DIM, HEADS, num_features=8, window=4)


def test_a_window_module_equals_softmax_over_a_long_window():
    module = trained_module("posrf-orf", 64)
    x = randn64(2, 50, DIM, seed=6)
    with torch.no_grad():
        q, k, v = module._heads(x, None)
        expected = module._merge(naive_softmax_attention(q, k, v, causal=True))
        torch.testing.assert_close(module(x), expected)


def test_softmax_with_a_window_is_plain_causal_softmax():
    # the hybrid weighs the window exactly and the rest by the attention's estimate: for softmax, exact too
    module = rf_attention.create("softmax", DIM, HEADS, causal=True, window=4, seed=0).double().eval()
    x = randn64(2, 12, DIM, seed=7)
    padding = torch.zeros(2, 12, dtype=torch.bool)
    padding[1, :3] = True
    with torch.no_grad():
        q, k, v = module._heads(x, None)
        expected = module._merge(naive_softmax_attention(q, k, v, causal=True, key_padding_mask=padding))
        torch.testing.assert_close(module(x, padding)[~padding], expected[~padding])
        prompt, state = module.prefill(x[:, :5], padding[:, :5])
        steps = [module.step(x[:, i : i + 1], state)[0] for i in range(5, 12)]
        torch.testing.assert_close(torch.cat([prompt, *steps], dim=1)[~padding], expected[~padding])
    with pytest.raises(ValueError, match="window: the sliding-window hybrid needs causal=True, got window=4"):
        rf_attention.create("softmax", DIM, HEADS, window=4)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")
def test_compiled_window_module_trains_without_recompiling():
    torch._dynamo.reset()
    module = rf_attention.create(
        "oprf-orf", DIM, HEADS, num_features=8, causal=True, seed=0, window=8
    ).train()
    eager = copy.deepcopy(module)
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    # fullgraph: a graph break raises; error_on_recompile: a recompilation raises
    with torch._dynamo.config.patch(error_on_recompile=True):
        for i in range(3):
            x = randn(2, 40, DIM, seed=30 + i)
            module.zero_grad()
            y = compiled(x)
            y.square().sum().backward()
            assert all(p.grad is not None for p in module.qkv.parameters())
            torch.testing.assert_close(y.detach(), eager(x).detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["nystromformer", "linformer"])
def test_a_baseline_with_a_window_is_refused_by_name(name):
    with pytest.raises(ValueError, match=rf"window: '{name}' has no sliding window \(got window=4\)"):
        rf_attention.create(name, DIM, HEADS, causal=True, window=4, seed=0)
