"""Packed sequences (``cu_seqlens``): each sequence gets what it gets alone, outputs and gradients."""

import pytest
import torch

import rf_features
from rf_attention import RecurrentState, create, linear_attention, naive, rf_attention, softmax_attention
from rf_attention.varlen import PackedLayout

LENGTHS = [5, 11, 1, 7]
CU = torch.tensor([0, 5, 16, 17, 24], dtype=torch.int32)


def packed(dim=8, seed=0, scale=1.0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(1, 2, 24, dim, generator=g, dtype=dtype) * scale).requires_grad_() for _ in range(3)]


def pieces(x):
    return [x[..., a:b, :] for a, b in zip(CU[:-1].tolist(), CU[1:].tolist(), strict=True)]


def per_sequence(reference, q, k, v, **kw):
    """``reference`` run on each sequence alone (a plain loop: this is the test's side)."""
    return torch.cat(
        [reference(a, b, c, **kw) for a, b, c in zip(pieces(q), pieces(k), pieces(v), strict=True)], -2
    )


def assert_same_outputs_and_gradients(fast, slow, inputs, **tol):
    torch.testing.assert_close(fast, slow, **tol)
    weights = torch.randn_like(fast)
    grads_fast = torch.autograd.grad((fast * weights).sum(), inputs, retain_graph=True)
    grads_slow = torch.autograd.grad((slow * weights).sum(), inputs)
    for a, b in zip(grads_fast, grads_slow, strict=True):
        torch.testing.assert_close(a, b, **tol)


def feature_map(component, causal):
    fm = rf_features.create(
        component,
        weight_matrix="orf",
        num_features=16,
        dim=8,
        seed=0,
        statistics_mode="running" if causal else "batch",
        matrix_options={"dtype": torch.float64},
    )
    return fm.double().eval()  # eval: running statistics are not moved by the calls being compared


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("component", rf_features.names())
def test_rf_attention_of_packed_sequences_equals_each_naive_run_alone(component, causal):
    q, k, v = packed(scale=1.5)
    fm = feature_map(component, causal)
    fast = rf_attention(q, k, v, fm, causal=causal, cu_seqlens=CU)
    slow = per_sequence(naive.naive_rf_attention, q, k, v, feature_map=fm, causal=causal)
    assert_same_outputs_and_gradients(fast, slow, (q, k, v), rtol=1e-9, atol=1e-10)


def test_batch_statistics_are_per_sequence():
    q, k, v = packed()
    k.data[..., 16:, :] *= 4.0  # a sequence with much larger keys: OPRF's A depends on them
    fm = feature_map("oprf", causal=False)
    together = rf_attention(q, k, v, fm, cu_seqlens=torch.tensor([0, 24], dtype=torch.int32))
    apart = rf_attention(q, k, v, fm, cu_seqlens=CU)
    first = naive.naive_rf_attention(*(x[..., :5, :] for x in (q, k, v)), fm)
    torch.testing.assert_close(apart[..., :5, :], first)
    assert not torch.allclose(together[..., :5, :], first)


@pytest.mark.parametrize("causal", [False, True])
def test_linear_and_softmax_attention_of_packed_sequences(causal):
    q, k, v = packed()
    phi_q, phi_k = q.exp(), k.exp()
    fast = linear_attention(phi_q, phi_k, v, causal=causal, cu_seqlens=CU)
    slow = per_sequence(naive.naive_linear_attention, phi_q, phi_k, v, causal=causal)
    assert_same_outputs_and_gradients(fast, slow, (q, k, v), rtol=1e-9, atol=1e-10)
    fast = softmax_attention(q, k, v, causal=causal, cu_seqlens=CU)
    slow = per_sequence(naive.naive_softmax_attention, q, k, v, causal=causal)
    assert_same_outputs_and_gradients(fast, slow, (q, k, v), rtol=1e-9, atol=1e-10)


def test_linear_attention_with_key_scales_of_packed_sequences():
    q, k, v = packed(scale=3.0)
    fm = feature_map("posrf", causal=True)
    phi_q, phi_k, log_scale = fm.forward_with_key_scales(q, k)
    fast = linear_attention(phi_q, phi_k, v, causal=True, key_log_scale=log_scale, cu_seqlens=CU)
    slow = per_sequence(
        naive.naive_linear_attention, phi_q, phi_k * log_scale.exp().unsqueeze(-1), v, causal=True
    )
    torch.testing.assert_close(fast, slow, rtol=1e-9, atol=1e-10)


def test_large_logits_in_bfloat16_stay_finite_and_close_to_float32():
    q, k, v = (x.detach().bfloat16().float() for x in packed(scale=4.0))  # the same inputs in both
    fm = feature_map("posrf", causal=True).float()
    full = rf_attention(q, k, v, fm, causal=True, cu_seqlens=CU)
    half = rf_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), fm, causal=True, cu_seqlens=CU)
    assert torch.isfinite(half).all()
    torch.testing.assert_close(half.float(), full, rtol=8e-3, atol=1e-2)  # bfloat16 output rounding


def test_layout_is_index_arithmetic_that_round_trips():
    layout = PackedLayout.from_cu_seqlens(CU, 24)
    assert layout.lengths.tolist() == LENGTHS
    assert layout.padding.sum(-1).tolist() == [11 - n for n in LENGTHS]
    x = torch.arange(24.0).view(1, 1, 24, 1)
    padded = layout.unpack(x)
    assert padded.shape == (4, 1, 11, 1)
    assert padded[1, 0, :, 0].tolist() == list(range(5, 16))
    assert torch.equal(layout.pack(padded), x)


@pytest.mark.parametrize(
    ("cu", "message"),
    [
        (torch.tensor([0, 5, 20]), "cu_seqlens: expected increasing starts from 0 to the 24"),
        (torch.tensor([0, 5, 5, 24]), "cu_seqlens: expected increasing starts"),
        (torch.tensor([0.0, 24.0]), "cu_seqlens: expected a 1D integer tensor"),
    ],
)
def test_bad_cu_seqlens_are_refused(cu, message):
    q, k, v = packed()
    with pytest.raises(ValueError, match=message):
        softmax_attention(q, k, v, cu_seqlens=cu)


def test_packed_inputs_need_one_row_and_no_padding_mask():
    q, k, v = packed()
    with pytest.raises(ValueError, match=r"q: with cu_seqlens, expected packed sequences of shape \(1,"):
        softmax_attention(
            q.expand(2, -1, -1, -1), k.expand(2, -1, -1, -1), v.expand(2, -1, -1, -1), cu_seqlens=CU
        )
    with pytest.raises(ValueError, match="key_padding_mask: not supported with cu_seqlens"):
        softmax_attention(q, k, v, cu_seqlens=CU, key_padding_mask=torch.zeros(1, 24, dtype=torch.bool))


@pytest.mark.parametrize("name", ["softmax", "performer", "oprf-orf", "trigrf-fastfoodl"])
def test_prefill_of_packed_prompts_then_steps_equals_each_prompt_decoded_alone(name):
    torch.manual_seed(0)
    module = create(name, 16, 2, num_features=16, causal=True, seed=0).double().eval()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 24, 16, generator=g, dtype=torch.float64)
    tokens = torch.randn(4, 3, 16, generator=g, dtype=torch.float64)
    with torch.no_grad():
        head, state = module.prefill(x, cu_seqlens=CU)
        steps = []
        for t in range(3):
            y, state = module.step(tokens[:, t : t + 1], state)
            steps.append(y)
        for b, prompt in enumerate(pieces(x.unsqueeze(1))):
            alone = module(torch.cat([prompt[:, 0], tokens[b : b + 1]], dim=1))
            n = prompt.shape[-2]
            torch.testing.assert_close(head[:, CU[b] : CU[b + 1]], alone[:, :n])
            torch.testing.assert_close(torch.cat([s[b : b + 1] for s in steps], dim=1), alone[:, n:])
    if isinstance(state, RecurrentState):
        assert state.length.tolist() == [n + 3 for n in LENGTHS]
