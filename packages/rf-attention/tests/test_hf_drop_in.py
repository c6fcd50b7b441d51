"""RF attention as a drop-in ``attn_implementation``: every way of setting it gives the same model.

Tiny Llama, GPT-2, Qwen2, Qwen3 and Mistral built from configs (no download).
"""

import pytest
import torch

transformers = pytest.importorskip("transformers")

import rf_attention.hf as rf_hf  # noqa: E402  (registers the names)

VOCAB = 61
NAME = "rf-oprf-fastfoodl"  # learnable scales and running statistics


pytestmark = pytest.mark.usefixtures("one_thread")


def decoder_config(family):
    """A two-layer config of ``family`` with grouped-query attention where the family has it."""
    common = {"vocab_size": VOCAB, "max_position_embeddings": 64}
    if family == "gpt2":
        return transformers.GPT2Config(
            vocab_size=VOCAB,
            n_embd=32,
            n_layer=2,
            n_head=4,
            n_positions=64,
            bos_token_id=0,
            eos_token_id=0,
            attn_pdrop=0.0,  # random-feature attention has no probabilities to drop (it warns)
        )
    config_class = {
        "llama": transformers.LlamaConfig,
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
        "mistral": transformers.MistralConfig,  # sliding_window=4096 by default
    }[family]
    return config_class(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        **common,
    )


FAMILIES = ["llama", "gpt2", "qwen2", "qwen3", "mistral"]


def built(family, name=NAME):
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(decoder_config(family), attn_implementation=name)


def feature_map_parameters(model):
    return [p for n, p in model.named_parameters() if ".rf_feature_map." in n]


def has_maps(model):
    return all(
        getattr(m, "rf_feature_map", None) is not None
        for m in model.modules()
        if isinstance(getattr(m, "layer_idx", None), int) and hasattr(m, "scaling")
    )


def first_cache(model):
    ids = torch.randint(1, VOCAB, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = model.eval().generate(
            input_ids=ids, max_new_tokens=3, do_sample=False, pad_token_id=0, return_dict_in_generate=True
        )
    return out.cache


@pytest.mark.parametrize("family", FAMILIES)
def test_a_model_built_with_an_rf_name_has_its_maps_before_any_call(family):
    model = built(family)
    assert has_maps(model)
    assert feature_map_parameters(model)  # FastFood_L's scales: an optimizer built now trains them


@pytest.mark.parametrize("family", FAMILIES)
def test_generate_keeps_the_recurrent_state_from_the_first_call(family):
    assert isinstance(first_cache(built(family)), rf_hf.RandomFeatureCache)


def test_set_attn_implementation_attaches_the_maps_and_the_cache():
    model = built("llama", name="sdpa")
    model.set_attn_implementation(NAME)
    assert has_maps(model)
    assert isinstance(first_cache(model), rf_hf.RandomFeatureCache)


def test_switching_back_to_softmax_forgets_the_recorded_name():
    model = built("llama")
    model.set_attn_implementation("sdpa")
    assert getattr(model.config, "attn_implementation", None) is None


def test_from_pretrained_with_an_rf_name_attaches_the_maps_and_the_cache(tmp_path):
    built("qwen2", name="sdpa").save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match=r"seed 0 \+ layer index"):
        model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation=NAME)
    assert has_maps(model)
    assert isinstance(first_cache(model), rf_hf.RandomFeatureCache)


def test_a_reloaded_model_draws_no_fresh_maps_and_says_nothing(tmp_path, recwarn):
    built("mistral").save_pretrained(tmp_path)
    transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert not [w for w in recwarn if "drew fresh ones" in str(w.message)]


def test_a_window_longer_than_the_sequence_is_full_causal_attention():
    # eval: the running statistics stay as they are between the two calls; float64: two code paths compared
    # within its default tolerance
    model = built("mistral").double().eval()
    assert model.config.sliding_window == 4096
    ids = torch.randint(1, VOCAB, (1, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    model.config.sliding_window = None  # the same model without a window
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, logits)


def test_a_window_shorter_than_the_sequence_is_refused():
    config = decoder_config("mistral")
    config.sliding_window = 4
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=NAME)
    with (
        torch.no_grad(),
        pytest.raises(ValueError, match="sliding_window: rf-oprf-fastfoodl attends to every"),
    ):
        model(input_ids=torch.arange(1, 10)[None])


def test_trainer_checkpoints_reload_as_the_trained_rf_model(tmp_path):
    model = built("llama").train()
    g = torch.Generator().manual_seed(3)
    rows = [{"input_ids": ids, "labels": ids} for ids in torch.randint(1, VOCAB, (4, 8), generator=g)]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=2,
        save_steps=2,
        per_device_train_batch_size=2,
        learning_rate=0.1,
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
    )
    before = [p.detach().clone() for p in feature_map_parameters(model)]
    transformers.Trainer(model=model, args=args, train_dataset=rows).train()
    assert any(not torch.equal(a, p) for a, p in zip(before, feature_map_parameters(model), strict=True))
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoint-2")
    for key, value in model.state_dict().items():
        if ".rf_feature_map." in key and torch.is_tensor(value):
            torch.testing.assert_close(reloaded.state_dict()[key], value)


# peft 0.21 calls a transformers 5 alias that warns of its removal
PEFT_WARNING = "ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"


@pytest.mark.filterwarnings(PEFT_WARNING)
def test_a_peft_model_generates_with_the_recurrent_state():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(
        built("qwen3", name="sdpa"), peft.LoraConfig(target_modules=["q_proj", "v_proj"])
    )
    assert rf_hf.attach_feature_maps(model, NAME) == 2
    assert isinstance(first_cache(model), rf_hf.RandomFeatureCache)


def statistics(model):
    return {k: v.clone() for k, v in model.state_dict().items() if ".running_" in k}


def one_training_step(model, **forward):
    ids = torch.randint(1, VOCAB, (2, 9), generator=torch.Generator().manual_seed(4))
    model.train()
    model(input_ids=ids, labels=ids, **forward).loss.backward()
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", ["rf-oprf-orf", "rf-saderf-orf"])
def test_gradient_checkpointing_gives_the_gradients_of_the_plain_pass(name):
    plain, checkpointed = built("llama", name), built("llama", name)
    checkpointed.activation_checkpointing_enable()
    expected = one_training_step(plain)
    grads = one_training_step(checkpointed)
    assert grads.keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(grads[key], value, rtol=1e-5, atol=1e-7)


def test_gradient_checkpointing_updates_the_statistics_once():
    plain, checkpointed = built("llama", "rf-oprf-orf"), built("llama", "rf-oprf-orf")
    checkpointed.activation_checkpointing_enable()
    start = statistics(plain)
    one_training_step(plain)
    one_training_step(checkpointed)
    expected = statistics(plain)
    assert any(not torch.equal(start[k], v) for k, v in expected.items())
    for key, value in statistics(checkpointed).items():
        torch.testing.assert_close(value, expected[key])


def test_statistics_are_fixed_outside_training():
    model = built("llama", "rf-oprf-orf").eval()
    start = statistics(model)
    with torch.no_grad():
        model(input_ids=torch.arange(1, 9)[None])
    for key, value in statistics(model).items():
        assert torch.equal(value, start[key]), key


@pytest.mark.filterwarnings(PEFT_WARNING)
def test_lora_training_leaves_the_statistics_it_does_not_save():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(
        built("llama", "rf-oprf-orf"), peft.LoraConfig(target_modules=["q_proj", "v_proj"])
    )
    start = statistics(model)
    one_training_step(model)
    for key, value in statistics(model).items():
        assert torch.equal(value, start[key]), key


def test_a_compiled_model_traces_whole_at_batch_size_one():
    model = built("llama", "rf-posrf-orf").eval()
    ids = torch.randint(1, VOCAB, (1, 9), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        compiled = torch.compile(model, fullgraph=True, backend="eager")
        torch.testing.assert_close(compiled(input_ids=ids).logits, expected)


CONVERTED = ["llama", "mistral", "qwen2", "gpt2"]


def converted(family, name="posrf-orf", **kw):
    """A "pretrained" softmax model of ``family``, converted in place."""
    model = built(family, name="sdpa")
    assert rf_hf.linearize(model, name, num_features=16, seed=7, **kw) is model
    return model


def attention_modules(model):
    return [m for m in model.modules() if hasattr(m, "rf_feature_map")]


@pytest.mark.parametrize("family", CONVERTED)
def test_linearize_gives_every_attention_layer_its_own_per_head_learnable_map(family):
    model = converted(family)
    modules = attention_modules(model)
    assert len(modules) == 2
    assert model.config._attn_implementation == "rf-posrf-orf"
    for module in modules:
        matrix = module.rf_feature_map.weight_matrix.matrix()
        assert matrix.shape == (4, 16, 8)  # (query heads, features, head dim): GQA's 2 KV heads repeated
        assert all(p.requires_grad for p in module.rf_feature_map.parameters())
    first, second = (m.rf_feature_map.weight_matrix.matrix() for m in modules)
    assert not torch.equal(first, second)  # seed + layer index


@pytest.mark.parametrize("family", CONVERTED)
def test_linearized_cached_generate_gives_the_uncached_greedy_tokens(family):
    model = converted(family).eval()
    ids = torch.randint(1, VOCAB, (2, 7), generator=torch.Generator().manual_seed(6))
    kw = {"input_ids": ids, "max_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
    with torch.no_grad():
        cached = model.generate(**kw, return_dict_in_generate=True)
        uncached = model.generate(**kw, use_cache=False)
    assert isinstance(cached.cache, rf_hf.RandomFeatureCache)
    assert torch.equal(cached.sequences, uncached)


def test_linearize_with_fixed_maps_shares_one_map_by_the_heads():
    model = converted("llama", learnable=False)
    for module in attention_modules(model):
        assert module.rf_feature_map.weight_matrix.matrix().shape == (16, 8)
        assert not any(p.requires_grad for p in module.rf_feature_map.parameters())


@pytest.mark.parametrize("family", ["gpt2", "qwen2"])
def test_a_linearized_model_trains_with_trainer_and_reloads_its_learned_maps(family, tmp_path):
    model = converted(family, "oprf-orf").train()
    g = torch.Generator().manual_seed(8)
    rows = [{"input_ids": ids, "labels": ids} for ids in torch.randint(1, VOCAB, (4, 8), generator=g)]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "run"),
        max_steps=2,
        per_device_train_batch_size=2,
        learning_rate=0.1,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
    )
    drawn = [p.detach().clone() for p in feature_map_parameters(model)]
    transformers.Trainer(model=model, args=args, train_dataset=rows).train()
    assert all(not torch.equal(a, p) for a, p in zip(drawn, feature_map_parameters(model), strict=True))
    model.save_pretrained(tmp_path / "saved")
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "saved")
    for key, value in tensors(model).items():
        torch.testing.assert_close(reloaded.state_dict()[key], value)


def tensors(model):
    return {k: v for k, v in model.state_dict().items() if ".rf_feature_map." in k and torch.is_tensor(v)}


def test_attaching_again_keeps_maps_trained_since_loading(tmp_path):
    built("llama").save_pretrained(tmp_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    with torch.no_grad():
        for parameter in feature_map_parameters(model):
            parameter.add_(0.5)  # trained after loading
    trained = {k: v.clone() for k, v in tensors(model).items()}
    rf_hf.attach_feature_maps(model)
    model.set_attn_implementation(NAME)
    for key, value in trained.items():
        assert torch.equal(model.state_dict()[key], value), key


@pytest.mark.filterwarnings(PEFT_WARNING)
def test_base_plus_reloaded_lora_adapter_gives_the_trained_models_logits(tmp_path):
    peft = pytest.importorskip("peft")
    built("llama", "rf-oprf-orf").save_pretrained(tmp_path / "base")
    base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    model = peft.get_peft_model(
        base, peft.LoraConfig(target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    one_training_step(model)
    model.save_pretrained(tmp_path / "adapter")
    ids = torch.randint(1, VOCAB, (2, 9), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        expected = model.eval()(input_ids=ids).logits
        fresh = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base")
        reloaded = peft.PeftModel.from_pretrained(fresh, tmp_path / "adapter").eval()
        torch.testing.assert_close(reloaded(input_ids=ids).logits, expected)
