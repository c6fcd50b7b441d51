"""``linearize(..., softmax_layers=[...])``: the named layers stay softmax attention, the others convert."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

import rf_attention.hf as rf_hf  # noqa: E402  (registers the names)
from rf_attention.hf import RandomFeatureCache, RecurrentCacheLayer  # noqa: E402
from rf_attention.transfer import feature_map_parameters  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

IDS = torch.tensor([[5, 9, 2, 40, 17, 3, 8, 11, 29, 6]])


def attention_outputs(model, ids):
    """Each layer's attention output on ``ids`` (forward hooks on ``self_attn``)."""
    found = {}
    hooks = [
        layer.self_attn.register_forward_hook(lambda _m, _i, out, i=i: found.__setitem__(i, out[0].detach()))
        for i, layer in enumerate(model.model.layers)
    ]
    with torch.no_grad():
        model(input_ids=ids, use_cache=False)
    for hook in hooks:
        hook.remove()
    return found


@pytest.fixture
def models(tiny_llama):
    teacher = tiny_llama("sdpa").eval()
    mixed = tiny_llama("sdpa").eval()
    rf_hf.linearize(mixed, "posrf-orf", num_features=16, seed=3, softmax_layers=[0])
    return teacher, mixed


def test_a_kept_layer_computes_the_teachers_attention_and_has_no_map(models):
    teacher, mixed = models
    expected, got = attention_outputs(teacher, IDS), attention_outputs(mixed, IDS)
    torch.testing.assert_close(got[0], expected[0], rtol=1e-5, atol=1e-6)  # the same sdpa call
    # the converted layer estimates it (its first position, which sees only itself, is exact)
    assert float((got[1] - expected[1]).norm() / expected[1].norm()) > 1e-2
    assert not hasattr(mixed.model.layers[0].self_attn, "rf_feature_map")
    assert hasattr(mixed.model.layers[1].self_attn, "rf_feature_map")
    trained = {id(p) for p in feature_map_parameters(mixed)}
    assert trained == {id(p) for p in mixed.model.layers[1].self_attn.rf_feature_map.parameters()}


def test_generate_keeps_a_kv_cache_for_kept_layers_and_the_state_for_the_others(models):
    _, mixed = models
    cache = RandomFeatureCache(mixed)
    assert not isinstance(cache.layers[0], RecurrentCacheLayer)
    assert isinstance(cache.layers[1], RecurrentCacheLayer)
    kw = {"max_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
    with torch.no_grad():
        cached = mixed.generate(input_ids=IDS, **kw)
        plain = mixed.generate(input_ids=IDS, use_cache=False, **kw)
    assert torch.equal(cached, plain)


def test_the_kept_layers_survive_save_and_load(models, tmp_path):
    _, mixed = models
    mixed.save_pretrained(tmp_path / "mixed")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "mixed").eval()
    assert not hasattr(loaded.model.layers[0].self_attn, "rf_feature_map")
    torch.testing.assert_close(
        loaded(input_ids=IDS, use_cache=False).logits, mixed(input_ids=IDS, use_cache=False).logits
    )


@pytest.mark.parametrize("kept", [[2], [0, 1], [-1]])
def test_softmax_layers_must_name_some_layers_of_the_model_and_leave_one(tiny_llama, kept):
    model = tiny_llama("sdpa")
    with pytest.raises(ValueError, match="softmax_layers"):
        rf_hf.linearize(model, "posrf-orf", num_features=16, softmax_layers=kept)
    assert model.config._attn_implementation == "sdpa"  # unchanged
