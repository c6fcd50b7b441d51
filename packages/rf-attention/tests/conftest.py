"""Fixtures shared by the rf-attention tests."""

import pytest
import torch

from spectraformer_core.testing import torch_threads


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for the module's tests (tiny models and token loops: threads only add overhead)."""
    with torch_threads(1):
        yield


@pytest.fixture
def decode_steps():
    """``decode_steps(module, x, state=None)``: ``module.step`` over the tokens of ``x`` one by one (no_grad).

    Returns ``(outputs (B, T, dim), state)``, the state after the last token.
    """

    def run(module, x, state=None):
        outs = []
        with torch.no_grad():
            for t in range(x.shape[1]):
                y, state = module.step(x[:, t : t + 1], state)
                outs.append(y)
        return torch.cat(outs, dim=1), state

    return run


@pytest.fixture
def tiny_llama():
    """``build(attn_implementation, **config)``: a Llama built from a config (no download), in train mode.

    Two layers of width 32, 4 query and 2 key/value heads (grouped-query attention), 64 positions, vocabulary
    64 unless ``config`` says otherwise; the global torch seed is set to 0 first, so equal arguments give
    equal weights.
    """
    transformers = pytest.importorskip("transformers")

    def build(name, **config):
        torch.manual_seed(0)
        options = {
            "vocab_size": 64,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 64,
        }
        llama_config = transformers.LlamaConfig(**{**options, **config})
        llama_config._attn_implementation = name
        return transformers.LlamaForCausalLM(llama_config)

    return build
