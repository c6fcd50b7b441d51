"""Cross-attention: queries from ``x``, keys and values from ``context``, against the plain references."""

import pytest
import torch
import torch.nn.functional as F

import rf_features
from rf_attention import create, naive

DIM, HEADS = 16, 2
NAMES = ["softmax", "performer", *(f"{c}-{m}" for c in rf_features.names() for m in ("orf", "fastfoodl"))]


def inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 5, DIM, generator=g, dtype=torch.float64)
    context = torch.randn(2, 9, DIM, generator=g, dtype=torch.float64)
    context_padding = torch.zeros(2, 9, dtype=torch.bool)
    context_padding[1, 6:] = True  # row 1's context has 6 tokens
    query_padding = torch.zeros(2, 5, dtype=torch.bool)
    query_padding[0, 4] = True
    return x, context, context_padding, query_padding


def reference(module, x, context, context_padding, query_padding):
    """Projections by hand, then ``rf_attention.naive`` (queries from x, keys and values from context)."""
    w, b = module.qkv.weight, module.qkv.bias
    q, k, v = (
        F.linear(t, w[i * DIM : (i + 1) * DIM], b[i * DIM : (i + 1) * DIM])
        for i, t in enumerate((x, context, context))
    )
    q, k, v = (t.view(t.shape[0], t.shape[1], HEADS, DIM // HEADS).transpose(1, 2) for t in (q, k, v))
    fm = getattr(module, "feature_map", None)
    if fm is None:
        out = naive.naive_softmax_attention(q, k, v, key_padding_mask=context_padding)
    else:
        out = naive.naive_rf_attention(
            q, k, v, fm, key_padding_mask=context_padding, query_padding_mask=query_padding
        )
    return module.proj(out.transpose(1, 2).reshape(x.shape))


@pytest.mark.parametrize("name", NAMES)
def test_cross_attention_equals_the_naive_reference(name):
    module = create(name, DIM, HEADS, num_features=16, seed=0).double().eval()
    x, context, context_padding, query_padding = inputs()
    with torch.no_grad():
        out = module(x, query_padding, context=context, context_padding_mask=context_padding)
        expected = reference(module, x, context, context_padding, query_padding)
    real = ~query_padding  # padded queries' rows are not compared
    torch.testing.assert_close(out[real], expected[real], rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("name", ["softmax", "oprf-orf"])
def test_padded_context_tokens_change_nothing(name):
    module = create(name, DIM, HEADS, num_features=16, seed=0).double().eval()
    x, context, context_padding, _ = inputs()
    changed = context.clone()
    changed[1, 6:] += 10.0
    with torch.no_grad():
        a = module(x, context=context, context_padding_mask=context_padding)
        b = module(x, context=changed, context_padding_mask=context_padding)
    torch.testing.assert_close(a, b)


def test_gradients_reach_queries_context_and_projections():
    module = create("saderf-fastfoodl", DIM, HEADS, num_features=16, seed=0).double()
    x, context, context_padding, _ = inputs()
    x.requires_grad_()
    context.requires_grad_()
    module(x, context=context, context_padding_mask=context_padding).sum().backward()
    assert x.grad.abs().sum() > 0
    assert context.grad.abs().sum() > 0
    assert context.grad[1, 6:].abs().sum() == 0  # padding gets no gradient
    assert module.qkv.weight.grad.abs().sum() > 0


def test_cross_attention_refusals_name_the_argument():
    x, context, context_padding, _ = inputs()
    causal = create("performer", DIM, HEADS, num_features=16, causal=True).double()
    with pytest.raises(ValueError, match=r"context: .*causal=True"):
        causal(x, context=context)
    module = create("performer", DIM, HEADS, num_features=16).double()
    with pytest.raises(ValueError, match=r"context_padding_mask: expected a bool tensor of shape \(2, 9\)"):
        module(x, context=context, context_padding_mask=context_padding[:, :4])
    with pytest.raises(ValueError, match="context: expected batch 2"):
        module(x, context=context[:1])
    with pytest.raises(ValueError, match="context_padding_mask: given without a context"):
        module(x, context_padding_mask=context_padding)
    with pytest.raises(NotImplementedError, match="LinformerAttention has no cross-attention form"):
        create("linformer", DIM, HEADS, max_seq_len=16).double()(x, context=context)


def test_the_guides_encoder_decoder_block_runs_and_ignores_padded_source_tokens():
    """The example of docs/guides/packing-and-cross-attention.md."""
    from torch import nn

    class DecoderBlock(nn.Module):
        def __init__(self, dim, heads, attention="oprf-fastfoodl"):
            super().__init__()
            self.self_attn = create(attention, dim, heads, num_features=64, causal=True)
            self.cross_attn = create(attention, dim, heads, num_features=64)
            self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(3))
            self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

        def forward(self, y, memory, target_padding=None, memory_padding=None):
            y = y + self.self_attn(self.norms[0](y), target_padding)
            y = y + self.cross_attn(
                self.norms[1](y), target_padding, context=memory, context_padding_mask=memory_padding
            )
            return y + self.mlp(self.norms[2](y))

    torch.manual_seed(0)
    encoder = create("oprf-fastfoodl", 64, 4, num_features=64).eval()
    block = DecoderBlock(64, 4).eval()
    source, target = torch.randn(2, 30, 64), torch.randn(2, 12, 64)
    source_padding = torch.zeros(2, 30, dtype=torch.bool)
    source_padding[1, 20:] = True
    with torch.no_grad():
        out = block(target, source + encoder(source, source_padding), memory_padding=source_padding)
        changed = source.clone()
        changed[1, 20:] = 5.0
        other = block(target, changed + encoder(changed, source_padding), memory_padding=source_padding)
    assert out.shape == (2, 12, 64)
    torch.testing.assert_close(out, other)
