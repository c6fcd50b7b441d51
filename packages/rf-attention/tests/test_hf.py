"""RF attention inside Hugging Face models built from tiny configs (no download): Llama, GPT-2, ViT."""

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

import rf_attention.hf as rf_hf  # noqa: E402  (registers the names)
from rf_attention import rf_attention, softmax_attention  # noqa: E402
from spectraformer_core.testing import assert_rel_close  # noqa: E402

AttentionInterface = transformers.AttentionInterface
VOCAB = 61


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def llama(tiny_llama):
    """``llama(attn_implementation, **config)``: the tiny Llama over ``VOCAB`` tokens, in eval mode."""
    return lambda name, **overrides: tiny_llama(name, vocab_size=VOCAB, **overrides).eval()


def gpt2(name):
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0
    )
    config._attn_implementation = name
    return transformers.GPT2LMHeadModel(config).eval()


def left_padded_batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (3, 9), generator=g)
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, :3] = 0
    mask[2, :8] = 0
    return ids, mask


@pytest.fixture
def recorder():
    """Wrap a registered attention so that every call's inputs and output are kept."""
    calls = []

    restore = []

    def record(name):
        original = rf_hf.registered(name)

        def recording(module, query, key, value, attention_mask, **kwargs):
            out, weights = original(module, query, key, value, attention_mask, **kwargs)
            calls.append({"module": module, "q": query, "k": key, "v": value, "out": out, **kwargs})
            return out, weights

        AttentionInterface.register(name, recording)
        restore.append((name, original))
        return calls

    yield record
    for name, original in restore:
        AttentionInterface.register(name, original)


def test_every_random_feature_pair_is_an_attn_implementation():
    assert {"rf-posrf-orf", "rf-oprf-fastfoodl", "rf-trigrf-sgq", "rf-performer"} <= set(rf_hf.REGISTERED)
    assert all(name in AttentionInterface() for name in rf_hf.REGISTERED)
    assert "rf-softmax" not in rf_hf.REGISTERED


def expected_causal(call, padding):
    """Our functional attention on the q, k, v HF passed (keys repeated for GQA), heads last."""
    q, k, v = call["q"], call["k"], call["v"]
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    q = q * (call["scaling"] * q.shape[-1] ** 0.5)
    out = rf_attention(
        q,
        k,
        v,
        call["module"].rf_feature_map,
        causal=True,
        key_padding_mask=padding,
        query_padding_mask=padding,
    )
    return out.transpose(1, 2)


@pytest.mark.parametrize(("family", "name"), [("llama", "rf-posrf-orf"), ("gpt2", "rf-oprf-fastfoodl")])
def test_causal_model_with_padding_runs_our_attention_on_its_q_k_v(llama, family, name, recorder):
    model = (llama if family == "llama" else gpt2)(name)
    calls = recorder(name)
    ids, mask = left_padded_batch()
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
    assert torch.isfinite(logits).all()
    assert len(calls) == 2  # one per layer
    for call in calls:
        torch.testing.assert_close(call["out"], expected_causal(call, padding=mask == 0))
    maps = [call["module"].rf_feature_map for call in calls]
    assert not torch.equal(maps[0].weight_matrix.matrix(), maps[1].weight_matrix.matrix())  # seeds per layer


def positions(mask):
    """Position ids that start at 0 on each row's first real token (as ``generate`` computes them).

    Random features are not rotation invariant, so with RoPE the logits of RF attention depend on absolute
    positions a little (softmax only sees relative ones): compare rows at equal positions.
    """
    return (mask.cumsum(-1) - 1).clamp_min(0)


def test_padding_changes_nothing_for_the_real_tokens(llama):
    model = llama("rf-saderf-orf")
    ids, mask = left_padded_batch()
    with torch.no_grad():
        padded = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask)).logits
        alone = model(input_ids=ids[1:2, 3:]).logits  # row 1 without its 3 padding tokens
    torch.testing.assert_close(padded[1:2, 3:], alone, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["rf-posrf-orf", "rf-oprf-orf", "rf-trigrf-orf"])
def test_cached_generation_equals_the_full_forward(llama, name):
    model = llama(name)
    ids, mask = left_padded_batch(seed=1)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=4,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
        full_mask = torch.cat([mask, torch.ones(3, 4, dtype=torch.long)], dim=1)
        full = model(
            input_ids=out.sequences, attention_mask=full_mask, position_ids=positions(full_mask)
        ).logits
    n = ids.shape[1]
    for step, logits in enumerate(out.logits):  # step 0: the prompt; later: one query over the cache
        torch.testing.assert_close(logits, full[:, n - 1 + step], rtol=1e-4, atol=1e-5)


def test_vit_runs_our_non_causal_attention(recorder):
    torch.manual_seed(0)
    config = transformers.ViTConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        image_size=16,
        patch_size=8,
    )
    config._attn_implementation = "rf-posrf-orf"
    model = transformers.ViTModel(config).eval()
    calls = recorder("rf-posrf-orf")
    with torch.no_grad():
        hidden = model(pixel_values=torch.randn(2, 3, 16, 16)).last_hidden_state
    assert torch.isfinite(hidden).all()
    for call in calls:
        expected = rf_attention(call["q"], call["k"], call["v"], call["module"].rf_feature_map)
        torch.testing.assert_close(call["out"], expected.transpose(1, 2))


def test_many_features_approach_the_models_softmax_attention(llama, recorder):
    rf_hf.register(["posrf-orf"], num_features=4096, seed=0)
    try:
        model = llama("rf-posrf-orf")
        calls = recorder("rf-posrf-orf")
        ids, _ = left_padded_batch()
        with torch.no_grad():
            model(input_ids=ids)
        for call in calls:
            k, v = (t.repeat_interleave(2, dim=1) for t in (call["k"], call["v"]))
            exact = softmax_attention(call["q"], k, v, causal=True).transpose(1, 2)
            assert_rel_close("layer output", exact, call["out"], 0.05)
    finally:
        rf_hf.register(["posrf-orf"])


def test_uptraining_recipe_keeps_the_pretrained_weights_and_adds_feature_maps(llama, tmp_path):
    pretrained = llama("sdpa")
    pretrained.save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match=r"drew fresh ones \(seed 0 \+ layer index, 128 features\)"):
        model = transformers.LlamaForCausalLM.from_pretrained(
            tmp_path, attn_implementation="rf-oprf-fastfoodl"
        )
    kept = pretrained.state_dict()
    new = {k for k in model.state_dict() if k not in kept}
    assert new
    assert all(".rf_feature_map." in k for k in new)
    for key, value in kept.items():
        assert torch.equal(model.state_dict()[key], value), key
    learnable = [n for n, p in model.named_parameters() if ".rf_feature_map." in n and p.requires_grad]
    assert learnable  # FastFood_L's scales, seen by an optimizer built now
    model.train()
    ids, mask = left_padded_batch()
    loss = model(input_ids=ids, attention_mask=mask, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for n, p in model.named_parameters() if n in learnable)


def trained_maps(model):
    """Shift every learnable feature-map tensor, as uptraining would."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if ".rf_feature_map." in name:
                parameter.add_(0.3)
    return model


def tensors(model):
    return {k: v for k, v in model.state_dict().items() if torch.is_tensor(v)}


def test_from_pretrained_without_a_name_gives_the_saved_rf_model(llama, tmp_path):
    rf_hf.register(["oprf-fastfoodl"], num_features=16, seed=5)
    try:
        model = trained_maps(llama("rf-oprf-fastfoodl"))
    finally:
        rf_hf.register(["oprf-fastfoodl"])
    model.save_pretrained(tmp_path)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)  # no attn_implementation
    assert reloaded.config._attn_implementation == "rf-oprf-fastfoodl"
    expected = tensors(model)
    assert tensors(reloaded).keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(reloaded.state_dict()[key], value), key


def test_maps_saved_elsewhere_load_with_one_call(llama, tmp_path):
    model = trained_maps(llama("rf-oprf-fastfoodl"))
    model.save_pretrained(tmp_path)
    twin = llama("rf-oprf-fastfoodl")
    assert rf_hf.load_feature_maps(twin, tmp_path) > 0
    for key, value in tensors(model).items():
        assert torch.equal(twin.state_dict()[key], value), key


def test_a_lazily_switched_model_refuses_to_draw_over_saved_maps(llama, tmp_path):
    trained_maps(llama("rf-oprf-fastfoodl")).save_pretrained(tmp_path)
    model = transformers.LlamaForCausalLM.from_pretrained(tmp_path, attn_implementation="sdpa")
    model.config._attn_implementation = "rf-oprf-fastfoodl"  # no hook sees this: the first call would draw
    with torch.no_grad(), pytest.raises(ValueError, match="rf-oprf-fastfoodl: this model was loaded from"):
        model(input_ids=torch.tensor([[1, 2, 3]]))


def test_masks_of_other_patterns_are_refused():
    n = 6
    positions = torch.arange(n)
    window = (positions <= positions[:, None]) & (positions > positions[:, None] - 3)
    with pytest.raises(ValueError, match="attention_mask: RF attention supports causal"):
        rf_hf.key_padding_from_mask(window[None, None], n, n, causal=True)
    causal = (positions <= positions[:, None])[None, None].expand(2, 1, n, n).clone()
    causal[1, :, :, :2] = False  # two padded keys in row 1
    padding = rf_hf.key_padding_from_mask(causal, n, n, causal=True)
    assert padding.tolist() == [[False] * n, [True, True] + [False] * (n - 2)]


def test_unknown_names_are_refused(llama):
    with pytest.raises(ValueError, match="names: unknown random-feature attention 'softmax'"):
        rf_hf.register(["softmax"])
    with pytest.raises(ValueError, match="attn_implementation: expected a registered rf-"):
        rf_hf.attach_feature_maps(llama("sdpa"))


@pytest.fixture
def attached(llama):
    """``attached(attn_implementation, **config)``: a `llama` with its feature maps attached."""

    def build(name, **overrides):
        model = llama(name, **overrides)
        rf_hf.attach_feature_maps(model)
        return model

    return build


def greedy(model, ids, mask, **kw):
    kw = {"max_new_tokens": 8, **kw}
    with torch.no_grad():
        return model.generate(input_ids=ids, attention_mask=mask, do_sample=False, pad_token_id=0, **kw)


@pytest.mark.parametrize("name", ["rf-performer", "rf-oprf-orf", "rf-trigrf-orf", "rf-saderf-fastfoodl"])
def test_generate_keeps_the_recurrent_state_and_gives_the_uncached_greedy_tokens(attached, name):
    model = attached(name)  # GQA: 4 query heads, 2 KV heads
    ids, mask = left_padded_batch(seed=1)
    out = greedy(model, ids, mask, return_dict_in_generate=True)
    cache = out.cache
    assert isinstance(cache, rf_hf.RandomFeatureCache)
    assert all(isinstance(layer, rf_hf.RecurrentCacheLayer) for layer in cache.layers)
    assert cache.get_seq_length() == ids.shape[1] + 7  # the last token is not fed back
    state = cache.layers[0].state
    assert state.numerator.shape[:2] == (3, 4)  # (B, H, m, Dh): a state per query head, no keys
    assert state.numerator.shape[-1] == 8
    assert torch.equal(out.sequences, greedy(model, ids, mask, use_cache=False))


def test_generate_with_hf_key_cache_gives_the_uncached_greedy_tokens(attached):
    model = attached("rf-oprf-orf")
    ids, mask = left_padded_batch(seed=5)
    cache = transformers.DynamicCache(config=model.config)
    out = greedy(model, ids, mask, cache=cache, return_dict_in_generate=True)
    assert type(out.cache) is transformers.DynamicCache  # the keys kept: a state rebuilt at every step
    assert torch.equal(out.sequences, greedy(model, ids, mask, use_cache=False))


def test_gpt2_generate_keeps_the_recurrent_state_too():
    model = gpt2("rf-oprf-fastfoodl")
    rf_hf.attach_feature_maps(model)
    ids, mask = left_padded_batch(seed=7)
    out = greedy(model, ids, mask, return_dict_in_generate=True)
    assert all(isinstance(layer, rf_hf.RecurrentCacheLayer) for layer in out.cache.layers)
    assert torch.equal(out.sequences, greedy(model, ids, mask, use_cache=False))


def test_an_attached_model_still_copies_and_pickles(attached, tmp_path):
    model = attached("rf-performer")
    ids, mask = left_padded_batch(seed=9)
    torch.save(model, tmp_path / "model.pt")
    twin = copy.deepcopy(model)
    out = greedy(twin, ids, mask, return_dict_in_generate=True)
    assert isinstance(out.cache, rf_hf.RandomFeatureCache)
    assert torch.equal(out.sequences, greedy(model, ids, mask))


def test_generate_state_has_the_same_size_for_any_prompt(attached):
    model = attached("rf-performer")
    sizes = []
    for length in (3, 40):
        ids = torch.randint(1, VOCAB, (1, length), generator=torch.Generator().manual_seed(length))
        with torch.no_grad():
            out = model.generate(
                input_ids=ids, max_new_tokens=2, do_sample=False, pad_token_id=0, return_dict_in_generate=True
            )
        sizes.append([layer.state.nbytes() for layer in out.cache.layers])
    assert sizes[0] == sizes[1]


def test_beam_search_reorders_the_states(attached):
    model = attached("rf-oprf-orf")
    ids, mask = left_padded_batch(seed=2)
    beams = greedy(model, ids, mask, num_beams=3, num_return_sequences=2)
    assert torch.equal(beams, greedy(model, ids, mask, num_beams=3, num_return_sequences=2, use_cache=False))


def test_softmax_layers_mixed_with_rf_layers_keep_their_keys(llama):
    model = llama("rf-performer")
    first = model.model.layers[0].self_attn
    first.config = copy.copy(model.config)  # layer 0 runs HF's sdpa, layer 1 RF attention
    first.config._attn_implementation = "sdpa"
    rf_hf.attach_feature_maps(model)
    ids, mask = left_padded_batch(seed=3)
    out = greedy(model, ids, mask, max_new_tokens=6, return_dict_in_generate=True)
    layers = out.cache.layers
    assert isinstance(layers[0], transformers.DynamicLayer)
    assert isinstance(layers[1], rf_hf.RecurrentCacheLayer)
    assert torch.equal(out.sequences, greedy(model, ids, mask, max_new_tokens=6, use_cache=False))


def test_own_decoding_loop_with_the_exported_cache_equals_the_full_forward(attached):
    model = attached("rf-saderf-orf")
    ids = torch.randint(1, VOCAB, (2, 12), generator=torch.Generator().manual_seed(4))
    cache = rf_hf.RandomFeatureCache(model)
    with torch.no_grad():
        full = model(input_ids=ids).logits
        head = model(input_ids=ids[:, :5], cache=cache).logits
        steps = [model(input_ids=ids[:, i : i + 1], cache=cache).logits for i in range(5, 12)]
    torch.testing.assert_close(torch.cat([head, *steps], dim=1), full, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="tokens_to_remove: a RandomFeatureCache cannot drop tokens"):
        cache.crop(-1)


def test_a_cache_layer_given_to_a_softmax_attention_is_refused(attached):
    model = attached("rf-performer")
    cache = rf_hf.RandomFeatureCache(model)
    model.config._attn_implementation = "sdpa"  # every layer now runs sdpa on the RF layers' cache
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([[1, 2, 3]]), cache=cache)  # sdpa ignores the state ...
            with pytest.raises(ValueError, match="cache: the attention of a layer given"):
                model(input_ids=torch.tensor([[4]]), cache=cache)  # ... which the next update notices
    finally:
        model.config._attn_implementation = "rf-performer"


def test_refusals_name_the_attention_the_user_typed(attached):
    model = attached("rf-performer")
    calls = rf_hf.registered("rf-performer")
    q = torch.randn(1, 4, 3, 8)
    with pytest.raises(ValueError, match="softcap: not supported by rf-performer"):
        calls(model.model.layers[0].self_attn, q, q, q, None, softcap=2.0)


def documents(lengths, seed=5):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, VOCAB, (n,), generator=g) for n in lengths]


@pytest.mark.parametrize("name", ["rf-performer", "rf-saderf-orf"])
def test_a_flattened_batch_gives_each_document_its_own_logits(attached, name):
    model = attached(name)
    docs = documents([5, 9, 4])
    collator = transformers.DataCollatorWithFlattening(return_tensors="pt")
    batch = collator([{"input_ids": d.tolist(), "labels": d.tolist()} for d in docs])
    assert batch["position_ids"].tolist()[0][:6] == [0, 1, 2, 3, 4, 0]
    with torch.no_grad():
        packed = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
        alone = torch.cat([model(input_ids=d[None]).logits for d in docs], dim=1)
    torch.testing.assert_close(packed, alone, rtol=1e-4, atol=1e-5)
    model.train()  # and it trains: the loss of the packed batch is the documents' own
    loss = model(**batch).loss
    loss.backward()
    assert torch.isfinite(loss)


def test_one_left_padded_prompt_is_not_taken_for_packed_documents(attached):
    model = attached("rf-performer")
    ids, mask = left_padded_batch(seed=8)
    row = slice(1, 2)  # 3 padding tokens: generate's position ids are [1, 1, 1, 0, 1, ...]
    alone = greedy(model, ids[row, 3:], mask[row, 3:])
    assert torch.equal(greedy(model, ids[row], mask[row])[:, 3:], alone)


def test_flash_attention_kwargs_of_the_collator_are_used(attached):
    model = attached("rf-performer")
    docs = documents([6, 3], seed=6)
    collator = transformers.DataCollatorWithFlattening(return_tensors="pt", return_flash_attn_kwargs=True)
    batch = collator([{"input_ids": d.tolist()} for d in docs])
    with torch.no_grad():
        packed = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
        alone = torch.cat([model(input_ids=d[None]).logits for d in docs], dim=1)
    torch.testing.assert_close(packed, alone, rtol=1e-4, atol=1e-5)
