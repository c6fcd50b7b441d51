"""The sliding-window hybrid in Hugging Face models: ``linearize(..., window=w)``, its cache, saving."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

import rf_attention.hf as rf_hf  # noqa: E402  (registers the names)
from rf_attention.ops.window import WindowState  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 64


def ids(batch=2, length=12, seed=0):
    return torch.randint(1, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_a_window_spanning_the_sequence_gives_the_softmax_models_logits(tiny_llama):
    model = tiny_llama("sdpa").eval()
    tokens = ids(length=20)
    with torch.no_grad():
        expected = model(input_ids=tokens).logits
        rf_hf.linearize(model, "posrf-orf", num_features=16, window=20)
        actual = model(input_ids=tokens).logits
    assert model.config.rf_attention["window"] == 20
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)


def test_a_short_window_changes_the_logits_of_the_plain_rf_model(tiny_llama):
    plain = rf_hf.linearize(tiny_llama("sdpa").eval(), "posrf-orf", num_features=16)
    hybrid = rf_hf.linearize(tiny_llama("sdpa").eval(), "posrf-orf", num_features=16, window=4)
    with torch.no_grad():
        first, second = (m(input_ids=ids()).logits for m in (plain, hybrid))
    assert not torch.allclose(first, second)
    assert "window" not in plain.config.rf_attention


def test_own_decoding_loop_with_the_cache_equals_the_full_forward(tiny_llama):
    model = rf_hf.linearize(tiny_llama("sdpa"), "oprf-orf", num_features=16, window=3).eval()
    tokens = ids(seed=1)
    cache = rf_hf.RandomFeatureCache(model)
    with torch.no_grad():
        full = model(input_ids=tokens).logits
        head = model(input_ids=tokens[:, :5], cache=cache).logits
        steps = [model(input_ids=tokens[:, i : i + 1], cache=cache).logits for i in range(5, 12)]
    assert isinstance(cache.layers[0].state, WindowState)
    torch.testing.assert_close(torch.cat([head, *steps], dim=1), full, rtol=1e-4, atol=1e-5)


def test_generate_with_either_cache_gives_the_uncached_greedy_tokens(tiny_llama):
    model = rf_hf.linearize(tiny_llama("sdpa"), "posrf-orf", num_features=16, window=4).eval()
    kw = {"input_ids": ids(seed=2, length=7), "max_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
    with torch.no_grad():
        uncached = model.generate(**kw, use_cache=False)
        ours = model.generate(**kw, return_dict_in_generate=True)
        keys = model.generate(**kw, cache=transformers.DynamicCache(config=model.config))
    assert isinstance(ours.cache, rf_hf.RandomFeatureCache)
    assert torch.equal(ours.sequences, uncached)
    assert torch.equal(keys, uncached)


def test_the_window_is_saved_and_loaded_with_the_model(tiny_llama, tmp_path):
    model = rf_hf.linearize(tiny_llama("sdpa"), "gerf-orf", num_features=16, window=5).eval()
    model.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids()).logits, model(input_ids=ids()).logits)
    assert loaded.config.rf_attention["window"] == 5


def test_beam_search_reorders_the_window_states(tiny_llama):
    model = rf_hf.linearize(tiny_llama("sdpa"), "posrf-orf", num_features=16, window=3).eval()
    kw = {"input_ids": ids(seed=3, length=6), "max_new_tokens": 8, "num_beams": 4, "pad_token_id": 0}
    kw |= {"return_dict_in_generate": True, "output_scores": True}
    with torch.no_grad():
        cached, uncached = model.generate(**kw), model.generate(**kw, use_cache=False)
    assert torch.equal(cached.sequences, uncached.sequences)
    torch.testing.assert_close(cached.sequences_scores, uncached.sequences_scores)
