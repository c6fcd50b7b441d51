"""One way into attention: HF's ``scaling`` is the logit scale of the modules' ``scale`` everywhere.

The HF attention, its cache and attention transfer take ``scale`` as the logit scale of ``q . k`` applied as
``sqrt(scale)`` to each of ``q`` and ``k`` (as ``decode`` and ``rf_attention``); checked against the plain
formula in float64 and decode against the forward pass, at a scaling other than ``Dh ** -0.5``.
"""

import math

import pytest
import torch

transformers = pytest.importorskip("transformers")

import rf_attention.hf as rf_hf  # noqa: E402  (registers the names)
from rf_attention.ops.naive import naive_rf_attention  # noqa: E402
from rf_attention.transfer import teacher_forced  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

#: Not the default ``Dh ** -0.5`` (0.354 for the tiny Llama's ``Dh = 8``): the convention shows.
SCALING = 0.6
VOCAB = 64


def with_scaling(model, scaling=SCALING):
    """``model`` with every attention module's ``scaling`` set (Gemma's and Granite's are not Dh^-1/2)."""
    for layer in model.model.layers:
        layer.self_attn.scaling = scaling
    return model


def heads(seed, b=2, h=4, n=7, d=8, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g, dtype=dtype) * 2 for _ in range(3)]


@pytest.mark.parametrize("window", [0, 3])
def test_an_attention_call_equals_the_plain_formula_with_sqrt_scaling_on_q_and_k(tiny_llama, window):
    model = tiny_llama("rf-posrf-orf").double().eval()
    module = model.model.layers[0].self_attn
    module.rf_window = window
    q, k, v = heads(0)
    padding = torch.zeros(2, 7, dtype=torch.bool)
    padding[1, :2] = True  # left padding of row 1
    allowed = torch.ones(7, 7, dtype=torch.bool).tril() & ~padding[:, None, None, :]  # HF's 4D bool mask
    function = rf_hf.registered("rf-posrf-orf")
    with torch.no_grad():
        out, _ = function(module, q, k, v, allowed, scaling=SCALING)
        factor = math.sqrt(SCALING) * 8**0.25  # naive_rf_attention scales each side by Dh^-1/4 itself
        expected = naive_rf_attention(
            q * factor,
            k * factor,
            v,
            module.rf_feature_map,
            causal=True,
            key_padding_mask=padding,
            query_padding_mask=padding,
            window=window,
        )
    real = ~padding  # padded query rows attend to nothing real
    torch.testing.assert_close(out[real], expected.transpose(1, 2)[real], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("window", [0, 4])
def test_decoding_with_either_cache_equals_the_forward_at_a_scaling_other_than_the_default(
    tiny_llama, window
):
    model = with_scaling(tiny_llama("rf-saderf-orf", vocab_size=VOCAB)).eval()
    if window:
        for layer in model.model.layers:
            layer.self_attn.rf_window = window
    ids = torch.randint(1, VOCAB, (2, 11), generator=torch.Generator().manual_seed(1))
    cache = rf_hf.RandomFeatureCache(model)
    keys = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        full = model(input_ids=ids).logits
        stepped, keyed = (
            [model(input_ids=ids[:, :5], cache=cache).logits],
            [model(input_ids=ids[:, :5], cache=keys).logits],
        )
        for i in range(5, 11):
            stepped.append(model(input_ids=ids[:, i : i + 1], cache=cache).logits)
            keyed.append(model(input_ids=ids[:, i : i + 1], cache=keys).logits)
    torch.testing.assert_close(torch.cat(stepped, dim=1), full, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(torch.cat(keyed, dim=1), full, rtol=1e-4, atol=1e-5)


def test_decoding_in_bfloat16_follows_the_bfloat16_forward_at_a_scaling_other_than_the_default(tiny_llama):
    model = with_scaling(tiny_llama("rf-posrf-orf", vocab_size=VOCAB)).eval().to(torch.bfloat16)
    ids = torch.randint(1, VOCAB, (2, 9), generator=torch.Generator().manual_seed(2))
    cache = rf_hf.RandomFeatureCache(model)
    with torch.no_grad():
        full = model(input_ids=ids).logits.float()
        stepped = [model(input_ids=ids[:, :4], cache=cache).logits]
        stepped += [model(input_ids=ids[:, i : i + 1], cache=cache).logits for i in range(4, 9)]
    got = torch.cat(stepped, dim=1).float()
    # bfloat16 keeps 8 bits: the two summation orders differ by a few of its ulps of the logits' scale
    assert (got - full).abs().max() <= 4 * 2**-8 * full.abs().max()


def test_teacher_forcing_passes_on_softmax_with_the_models_scaling(tiny_llama):
    teacher = with_scaling(tiny_llama("sdpa", vocab_size=VOCAB)).eval()
    student = with_scaling(tiny_llama("rf-posrf-orf", vocab_size=VOCAB)).eval()
    ids = torch.randint(1, VOCAB, (2, 10), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, :3] = 0
    with torch.no_grad():
        expected = teacher(input_ids=ids, attention_mask=mask).logits
        with teacher_forced(student) as losses:
            assert student.config._attn_implementation == "rf-posrf-orf"  # the hook, not another attention
            got = student(input_ids=ids, attention_mask=mask, use_cache=False).logits
    real = mask.bool()
    torch.testing.assert_close(got[real], expected[real], rtol=1e-5, atol=1e-6)
    assert all(value is not None and float(value) > 0 for value in losses.values)
    assert not any(hasattr(layer.self_attn, "rf_teacher") for layer in student.model.layers)
