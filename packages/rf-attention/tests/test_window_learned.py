"""LoLCATs' sliding-window hybrid over the learned maps (Hedgehog, T2R) against its plain reference."""

import copy

import pytest
import torch

import rf_attention
import rf_features
from rf_attention import rf_attention as rf_attend
from rf_attention.ops.naive import naive_rf_attention, naive_softmax_attention
from spectraformer_core.testing import assert_rel_close
from spectraformer_core.testing import seeded_randn as randn

pytestmark = pytest.mark.usefixtures("one_thread")

NAMES = ["hedgehog", "t2r"]
B, H, N, D = 2, 3, 101, 8  # N odd: crosses the exact part's blocks (64) and the causal chunks (16 below)
LOGITS = torch.tensor([-2.0, 0.5, 1.5])  # one window factor per head: sigmoid = 0.12, 0.62, 0.82


def learned_map(name):
    """A per-head learned map off its start (every head differently), its window factors apart, float64."""
    fm = rf_features.create(
        name, num_features=6, dim=D, seed=0, num_heads=H, input_map=True, window_factor=True
    ).double()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in fm.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
        fm.window_logit.copy_(LOGITS.view(H, 1, 1))
        if name == "t2r":
            fm.bias.add_(1.0)  # no query with every feature 0 (the formula's 0 / 0)
    return fm


def qkv(n=N, scale=1.0, seed=0, dtype=torch.float64):
    return [randn(B, H, n, D, seed=seed + i, scale=scale, dtype=dtype) for i in range(3)]


def left_padding(n=N):
    mask = torch.zeros(B, n, dtype=torch.bool)
    mask[1, :9] = True
    return mask


@pytest.mark.parametrize("window", [1, 5, 40])
@pytest.mark.parametrize("name", NAMES)
def test_outputs_and_every_gradient_equal_the_naive_hybrid(name, window):
    fm = learned_map(name)
    mask = left_padding()
    q, k, v = (t.requires_grad_() for t in qkv(scale=1.5))
    masks = {"key_padding_mask": mask, "query_padding_mask": mask}
    out = rf_attend(q, k, v, fm, causal=True, window=window, chunk_size=16, **masks)
    grads = torch.autograd.grad(out.square().sum(), [q, k, v, *fm.parameters()])
    expected = naive_rf_attention(q, k, v, fm, causal=True, window=window, **masks)
    expected_grads = torch.autograd.grad(expected.square().sum(), [q, k, v, *fm.parameters()])
    torch.testing.assert_close(out, expected)  # float64: rtol 1e-7
    names = ["q", "k", "v", *(n for n, _ in fm.named_parameters())]
    for label, got, want in zip(names, grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, msg=lambda m, label=label: f"{label}: {m}")
    factor_grad = dict(zip(names, grads, strict=True))["window_logit"]
    assert bool(factor_grad.isfinite().all())
    assert bool((factor_grad != 0).all())  # every head's factor trains


@pytest.mark.parametrize("name", NAMES)
def test_a_window_as_long_as_the_sequence_is_causal_softmax_whatever_the_factor(name):
    """No key beyond the window: the factor multiplies every weight and cancels in the normalizer."""
    fm = learned_map(name)
    q, k, v = qkv(scale=1.5)
    expected = naive_softmax_attention(q, k, v, causal=True)
    for window in (N, N + 30):
        torch.testing.assert_close(rf_attend(q, k, v, fm, causal=True, window=window), expected)


@pytest.mark.parametrize("name", NAMES)
def test_the_factor_moves_the_output_only_where_keys_lie_beyond_the_window(name):
    fm = learned_map(name)
    q, k, v = qkv()
    with torch.no_grad():
        before = rf_attend(q, k, v, fm, causal=True, window=4)
        fm.window_logit.add_(1.0)
        after = rf_attend(q, k, v, fm, causal=True, window=4)
    torch.testing.assert_close(after[..., :4, :], before[..., :4, :])  # the first 4 queries: window only
    assert float((after - before)[..., 4:, :].norm(dim=-1).min()) > 1e-6  # every later row moves


@pytest.mark.parametrize("window", [1, 8, 64])
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_inputs_match_the_float64_reference(name, window, dtype):
    """Peaked logits (up to about 35): the window's shift by its maximum keeps every weight at most f."""
    q, k, v = (t.to(dtype).double() for t in qkv(n=200, scale=2.5, seed=3))
    fm = learned_map(name)
    mask = left_padding(200)
    expected = naive_rf_attention(q, k, v, fm, causal=True, window=window, key_padding_mask=mask)
    fm = fm.float()
    out = rf_attend(*(t.to(dtype) for t in (q, k, v)), fm, causal=True, window=window, key_padding_mask=mask)
    assert out.dtype == dtype
    assert bool(out.isfinite().all())
    # float32: the map's parameters rounded to float32 (relative 6e-8) through logits of ~35; bfloat16:
    # the output's rounding (relative 2^-8)
    assert_rel_close("output", expected, out.double(), 1e-5 if dtype == torch.float32 else 1e-2)


def test_packed_sequences_equal_each_sequence_alone():
    lengths = [37, 1, 64, 20]
    q, k, v = (t[:1] for t in qkv(n=sum(lengths), scale=1.5))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    fm = learned_map("hedgehog")
    out = rf_attend(q, k, v, fm, causal=True, window=5, cu_seqlens=cu)
    for start, stop in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        part = slice(start, stop)
        alone = naive_rf_attention(
            q[..., part, :], k[..., part, :], v[..., part, :], fm, causal=True, window=5
        )
        assert_rel_close(f"sequence {start}:{stop}", alone, out[..., part, :], 1e-12)


# Modules and decoding

DIM, HEADS = 24, 3


def window_module(name, window):
    module = rf_attention.create(name, DIM, HEADS, num_features=6, causal=True, seed=0, window=window)
    with torch.no_grad():
        module.feature_map.window_logit.copy_(LOGITS.view(HEADS, 1, 1))
        module.qkv.weight[: 2 * DIM] *= 2.0  # peaked attention
    return module.double().eval()


@pytest.mark.parametrize("window", [1, 5, 140])
@pytest.mark.parametrize("name", NAMES)
def test_token_by_token_steps_equal_the_causal_forward(name, window, decode_steps):
    module = window_module(name, window)
    x = randn(2, 130, DIM, seed=1, dtype=torch.float64)  # crosses the chunk (128) and the blocks (64)
    with torch.no_grad():
        full = module(x)
        head, state = module.prefill(x[:, :70])
    tail, _ = decode_steps(module, x[:, 70:], state)
    from_start, _ = decode_steps(module, x)
    torch.testing.assert_close(head, full[:, :70])
    torch.testing.assert_close(tail, full[:, 70:])
    torch.testing.assert_close(from_start, full)


def test_prefill_with_left_padding_then_steps_equal_the_masked_forward(decode_steps):
    module = window_module("hedgehog", 6)
    x = randn(3, 30, DIM, seed=2, dtype=torch.float64)
    mask = torch.zeros(3, 30, dtype=torch.bool)
    mask[1, :6] = True
    mask[2, :19] = True
    with torch.no_grad():
        full = module(x, key_padding_mask=mask)
        head, state = module.prefill(x[:, :20], key_padding_mask=mask[:, :20])
    tail, _ = decode_steps(module, x[:, 20:], state)
    torch.testing.assert_close(torch.cat([head, tail], dim=1)[~mask], full[~mask])


def test_the_module_saves_and_trains_its_window_factor():
    module = rf_attention.create("hedgehog", DIM, HEADS, num_features=6, causal=True, seed=0, window=4)
    assert module.state_dict()["feature_map.window_logit"].shape == (HEADS, 1, 1)
    module(randn(2, 20, DIM, seed=5)).square().sum().backward()
    grad = module.feature_map.window_logit.grad
    assert grad is not None
    assert bool(grad.isfinite().all())
    assert bool((grad != 0).all())
    copy = rf_attention.create("hedgehog", DIM, HEADS, num_features=6, causal=True, seed=1, window=4)
    with torch.no_grad():
        module.feature_map.window_logit.fill_(0.7)
    copy.load_state_dict(module.state_dict())
    assert torch.equal(copy.feature_map.window_logit, module.feature_map.window_logit)


@pytest.mark.parametrize("name", NAMES)
def test_a_learned_map_without_its_window_factor_is_refused_with_a_window_and_holds_none_without(name):
    fm = rf_features.create(name, num_features=6, dim=D, seed=0, num_heads=H).double()
    assert fm.window_logit is None
    assert "window_logit" not in fm.state_dict()
    q, k, v = qkv(n=10)
    with pytest.raises(ValueError, match="window_factor=True"):
        rf_attend(q, k, v, fm, causal=True, window=3)
    plain = rf_attention.create(name, DIM, HEADS, num_features=6, causal=True, seed=0)
    assert plain.feature_map.window_logit is None


def test_the_triton_backend_is_refused_with_a_window():
    q, k, v = qkv(n=10)
    with pytest.raises(ValueError, match="no sliding window"):
        rf_attend(q, k, v, learned_map("hedgehog"), causal=True, window=3, backend="triton")


def test_hf_linearize_takes_a_learned_map_with_a_window_and_saves_its_factor(tiny_llama, tmp_path):
    rf_hf = pytest.importorskip("rf_attention.hf")
    model = rf_hf.linearize(tiny_llama("sdpa"), "hedgehog", num_features=8, seed=0, window=4).eval()
    fm = model.model.layers[0].self_attn.rf_feature_map
    with torch.no_grad():
        fm.window_logit.fill_(1.3)
    tokens = torch.randint(1, 64, (2, 9), generator=torch.Generator().manual_seed(4))
    kw = {"input_ids": tokens, "max_new_tokens": 5, "do_sample": False, "pad_token_id": 0}
    with torch.no_grad():
        cached = model.generate(**kw)
        uncached = model.generate(**kw, use_cache=False)
        logits = model(input_ids=tokens).logits
    assert torch.equal(cached, uncached)
    model.save_pretrained(tmp_path)
    loaded = type(model).from_pretrained(tmp_path).eval()
    loaded_fm = loaded.model.layers[0].self_attn.rf_feature_map
    assert torch.equal(loaded_fm.window_logit, fm.window_logit)
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=tokens).logits, logits)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")
def test_compiled_hedgehog_window_module_trains_its_factor_without_recompiling():
    torch._dynamo.reset()
    module = rf_attention.create("hedgehog", DIM, HEADS, num_features=6, causal=True, seed=0, window=8)
    eager = copy.deepcopy(module)
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    with torch._dynamo.config.patch(error_on_recompile=True):
        for i in range(3):
            x = randn(2, 40, DIM, seed=30 + i)
            module.zero_grad()
            y = compiled(x)
            y.square().sum().backward()
            assert module.feature_map.window_logit.grad is not None
            torch.testing.assert_close(y.detach(), eager(x).detach(), rtol=1e-5, atol=1e-6)
