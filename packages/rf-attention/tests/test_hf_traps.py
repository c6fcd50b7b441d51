"""Hugging Face routes a power user takes: each one right, or refused with its reason.

Tiny Llama, GPT-NeoX and Falcon built from configs (no download).
"""

import copy
import json
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

import rf_attention.hf as rf_hf  # noqa: E402  (registers the names)
from rf_attention.transfer import attention_transfer, feature_map_parameters  # noqa: E402

VOCAB = 61
PEFT_WARNING = "ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def llama(tiny_llama):
    """``llama(name="sdpa", **options)``: the tiny Llama, converted to ``name`` (not sdpa) by linearize."""

    def build(name="sdpa", **options):
        model = tiny_llama("sdpa", vocab_size=VOCAB)
        if name != "sdpa":
            rf_hf.linearize(model, name, num_features=16, seed=3, **options)
        return model

    return build


def gpt_neox():
    """A "pretrained" GPT-NeoX: its config names the head width ``head_size``, its attention ``head_size``."""
    torch.manual_seed(0)
    config = transformers.GPTNeoXConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    return transformers.GPTNeoXForCausalLM(config)


def documents(lengths, seed=5):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, VOCAB, (n,), generator=g) for n in lengths]


def flattened(docs):
    """``DataCollatorWithFlattening``'s batch of ``docs``: one row, position ids restarting at each one."""
    collator = transformers.DataCollatorWithFlattening(return_tensors="pt")
    return collator([{"input_ids": d.tolist(), "labels": d.tolist()} for d in docs])


def greedy(model, ids, **kw):
    with torch.no_grad():
        return model.generate(input_ids=ids, max_new_tokens=5, do_sample=False, pad_token_id=0, **kw)


# packed batches --------------------------------------------------------------------------------------------


def test_a_packed_batch_without_the_cache_gives_each_document_its_own_logits(llama):
    model = llama("performer").eval()
    docs = documents([5, 9, 4])
    batch = flattened(docs)
    with torch.no_grad():
        packed = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False)
        alone = torch.cat([model(input_ids=d[None], use_cache=False).logits for d in docs], dim=1)
    torch.testing.assert_close(packed.logits, alone, rtol=1e-4, atol=1e-5)


def gradients(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_a_packed_batch_under_gradient_checkpointing_gives_the_documents_loss_and_gradients(llama):
    model = llama("posrf-orf").train()  # learnable maps, no running statistics: train() changes nothing else
    docs = documents([6, 3, 7])
    predicted = sum(len(d) - 1 for d in docs)  # the first token of each document is no label
    total = sum(model(input_ids=d[None], labels=d[None], use_cache=False).loss * (len(d) - 1) for d in docs)
    (total / predicted).backward()
    alone = gradients(model)
    model.zero_grad(set_to_none=True)
    model.activation_checkpointing_enable()
    loss = model(**flattened(docs)).loss
    loss.backward()
    torch.testing.assert_close(loss, total / predicted, rtol=1e-5, atol=1e-6)
    packed = gradients(model)
    assert packed.keys() == alone.keys()
    assert any(".rf_feature_map." in name for name in packed)
    for name, grad in alone.items():
        torch.testing.assert_close(packed[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_trainer_trains_a_converted_model_on_flattened_batches(llama, tmp_path):
    model = llama("posrf-orf").train()
    g = torch.Generator().manual_seed(2)
    rows = [{"input_ids": torch.randint(1, VOCAB, (n,), generator=g).tolist()} for n in (5, 7, 4, 6)]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=2,
        per_device_train_batch_size=2,
        learning_rate=0.1,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
    )
    drawn = [p.detach().clone() for p in feature_map_parameters(model)]
    collator = transformers.DataCollatorWithFlattening(return_tensors="pt")
    result = transformers.Trainer(model=model, args=args, train_dataset=rows, data_collator=collator).train()
    assert result.global_step == 2
    assert all(not torch.equal(a, p) for a, p in zip(drawn, feature_map_parameters(model), strict=True))


def test_attention_transfer_on_a_packed_batch_measures_each_document_alone(llama):
    model = llama("posrf-orf")
    docs = documents([5, 9, 4], seed=7)
    batch = flattened(docs)
    packed = attention_transfer(
        model, [{"input_ids": batch["input_ids"], "position_ids": batch["position_ids"]}], steps=0
    )
    alone = [attention_transfer(model, [d[None]], steps=0).mse_before for d in docs]
    for layer, mse in enumerate(packed.mse_before):  # the mean over every token: weighted by length
        expected = (
            sum(len(d) * doc[layer] for d, doc in zip(docs, alone, strict=True)) / batch["input_ids"].numel()
        )
        assert mse == pytest.approx(expected, rel=1e-4)
    assert attention_transfer(model, [batch], steps=2).steps == 2  # and it trains on it


# GPT-NeoX and Falcon ---------------------------------------------------------------------------------------


def test_gpt_neox_is_converted_with_learnable_maps_before_any_call():
    model = gpt_neox()
    rf_hf.linearize(model, "posrf-orf", num_features=16, seed=3)
    modules = [layer.attention for layer in model.gpt_neox.layers]
    for module in modules:
        matrix = module.rf_feature_map.weight_matrix.matrix()
        assert matrix.shape == (4, 16, 8)  # (heads, features, head_size)
        assert all(p.requires_grad for p in module.rf_feature_map.parameters())
    assert len(feature_map_parameters(model)) >= 2  # an optimizer built now trains them


def test_a_converted_gpt_neox_generates_with_the_recurrent_state():
    model = gpt_neox()
    rf_hf.linearize(model, "oprf-orf", num_features=16)
    ids = torch.randint(1, VOCAB, (2, 7), generator=torch.Generator().manual_seed(6))
    cached = greedy(model.eval(), ids, return_dict_in_generate=True)
    assert isinstance(cached.cache, rf_hf.RandomFeatureCache)
    assert torch.equal(cached.sequences, greedy(model, ids, use_cache=False))


def test_a_converted_gpt_neox_saves_and_reloads_its_trained_maps(tmp_path):
    model = gpt_neox()
    rf_hf.linearize(model, "posrf-orf", num_features=16)
    with torch.no_grad():
        for parameter in feature_map_parameters(model):
            parameter.add_(0.25)  # as trained
    model.save_pretrained(tmp_path)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.randint(1, VOCAB, (1, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids).logits, model.eval()(input_ids=ids).logits)


def test_a_model_whose_class_does_not_flag_the_attention_backend_is_converted_too():
    torch.manual_seed(0)
    config = transformers.BioGptConfig(  # _supports_attention_backend is unset; it calls the interface
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    model = rf_hf.linearize(transformers.BioGptForCausalLM(config), "posrf-orf", num_features=16).eval()
    ids = torch.randint(1, VOCAB, (2, 7), generator=torch.Generator().manual_seed(6))
    cached = greedy(model, ids, return_dict_in_generate=True)
    assert isinstance(cached.cache, rf_hf.RandomFeatureCache)
    assert torch.equal(cached.sequences, greedy(model, ids, use_cache=False))


def test_a_gpt_neox_built_with_an_rf_name_has_its_maps_before_any_call():
    model = transformers.AutoModelForCausalLM.from_config(
        gpt_neox().config, attn_implementation="rf-posrf-orf"
    )
    assert all(hasattr(layer.attention, "rf_feature_map") for layer in model.gpt_neox.layers)


def test_falcon_is_refused_by_name_with_the_reason(tmp_path):
    torch.manual_seed(0)
    config = transformers.FalconConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
    )
    model = transformers.FalconForCausalLM(config)
    with pytest.raises(ValueError, match=r"FalconForCausalLM.*AttentionInterface"):
        rf_hf.linearize(model, "posrf-orf")
    with pytest.raises(ValueError, match=r"FalconForCausalLM.*AttentionInterface"):
        rf_hf.attach_feature_maps(model, "rf-posrf-orf")
    assert model.config._attn_implementation == "sdpa"
    model.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"FalconForCausalLM.*AttentionInterface"):
        transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="rf-posrf-orf")
    # built from its config with an rf-* name: refused before Falcon's own lookup raises a KeyError
    with pytest.raises(ValueError, match=r"FalconForCausalLM.*AttentionInterface"):
        transformers.AutoModelForCausalLM.from_config(config, attn_implementation="rf-posrf-orf")
    config._attn_implementation = "rf-posrf-orf"
    with pytest.raises(ValueError, match=r"FalconForCausalLM.*AttentionInterface"):
        transformers.FalconForCausalLM(config)


# an atomic linearize --------------------------------------------------------------------------------------


def snapshot(model):
    """Everything ``linearize`` may change: the config's entries, the modules and their tensors."""
    config = model.config.to_dict()
    modules = {name: type(module) for name, module in model.named_modules()}
    state = {k: v.clone() for k, v in model.state_dict().items() if torch.is_tensor(v)}
    return config, modules, state, model.config._attn_implementation


def assert_unchanged(model, before):
    config, modules, state, implementation = snapshot(model)
    assert config == before[0]
    assert modules == before[1]
    assert state.keys() == before[2].keys()
    assert all(torch.equal(state[k], v) for k, v in before[2].items())
    assert implementation == before[3]


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("posrf-orf", {"num_features": 0}, "num_features"),
        ("posrf-orf", {"seed": 1.5}, "seed"),
        ("posrf-orz", {}, "posrf-orf"),
    ],
)
@pytest.mark.parametrize("start", ["sdpa", "saderf-orf"])
def test_a_failing_linearize_leaves_the_model_unchanged(llama, start, name, options, message):
    model = llama(start)
    before = snapshot(model)
    with pytest.raises(ValueError, match=message):
        rf_hf.linearize(model, name, **options)
    assert_unchanged(model, before)


@pytest.mark.parametrize("start", ["sdpa", "saderf-orf"])
def test_a_linearize_failing_at_its_last_layer_leaves_the_model_unchanged(llama, start, monkeypatch):
    model = llama(start)
    before = snapshot(model)
    build = rf_hf.HFRandomFeatureAttention.new_feature_map
    calls = []

    def second_fails(self, module, *args):
        calls.append(module)
        if len(calls) == 2:
            raise RuntimeError("out of memory")
        return build(self, module, *args)

    monkeypatch.setattr(rf_hf.HFRandomFeatureAttention, "new_feature_map", second_fails)
    with pytest.raises(RuntimeError, match="out of memory"):
        rf_hf.linearize(model, "posrf-orf", num_features=8)
    assert len(calls) == 2
    assert_unchanged(model, before)


# peft, pickling -------------------------------------------------------------------------------------------


@pytest.mark.filterwarnings(PEFT_WARNING)
def test_linearize_on_a_peft_model_is_refused_with_the_reason(llama):
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(llama(), peft.LoraConfig(target_modules=["q_proj", "v_proj"]))
    before = snapshot(model.base_model.model)
    with pytest.raises(ValueError, match=r"peft model.*adapter.*linearize the base model"):
        rf_hf.linearize(model, "posrf-orf")
    assert_unchanged(model.base_model.model, before)


@pytest.mark.filterwarnings(PEFT_WARNING)
def test_linearize_then_peft_reloads_as_trained(llama, tmp_path):
    """The route the refusal names: convert and train the maps, save, then wrap; base + adapter reload."""
    peft = pytest.importorskip("peft")
    base = llama("posrf-orf")
    with torch.no_grad():
        for parameter in feature_map_parameters(base):
            parameter.add_(0.25)  # as attention transfer leaves them
    base.save_pretrained(tmp_path / "base")
    lora = peft.LoraConfig(target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = peft.get_peft_model(base, lora)
    assert not any(p.requires_grad for p in feature_map_parameters(model))  # peft freezes them
    ids = torch.randint(1, VOCAB, (2, 9), generator=torch.Generator().manual_seed(9))
    model(input_ids=ids, labels=ids).loss.backward()
    torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1).step()
    model.save_pretrained(tmp_path / "adapter")
    fresh = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    reloaded = peft.PeftModel.from_pretrained(fresh, tmp_path / "adapter").eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids).logits, model.eval()(input_ids=ids).logits)


def test_a_pickled_model_generates_with_its_random_feature_cache(llama, tmp_path):
    model = llama("oprf-orf").eval()
    torch.save(model, tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    ids = torch.randint(1, VOCAB, (2, 6), generator=torch.Generator().manual_seed(4))
    out = greedy(loaded, ids, return_dict_in_generate=True)
    assert isinstance(out.cache, rf_hf.RandomFeatureCache)
    assert torch.equal(out.sequences, greedy(model, ids))
    twin = copy.deepcopy(loaded)
    assert isinstance(greedy(twin, ids, return_dict_in_generate=True).cache, rf_hf.RandomFeatureCache)


# smaller ones ---------------------------------------------------------------------------------------------


def test_switching_pairs_warns_when_trained_maps_are_dropped(llama):
    model = llama("posrf-orf")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # maps as drawn: nothing is lost
        model.set_attn_implementation("rf-saderf-orf")
        model.set_attn_implementation("rf-posrf-orf")
    with torch.no_grad():
        for parameter in feature_map_parameters(model):
            parameter.add_(0.1)  # as trained
    with pytest.warns(UserWarning, match=r"rf-posrf-orf.*2 attention layers.*trained"):
        model.set_attn_implementation("rf-saderf-orf")


def test_register_refuses_keywords_the_feature_maps_do_not_take():
    with pytest.raises(ValueError, match="redraw_interval"):
        rf_hf.register(["posrf-orf"], redraw_interval=5)
    with pytest.raises(ValueError, match="num_features"):
        rf_hf.register(["posrf-orf"], num_features=0)
    assert rf_hf.registered("rf-posrf-orf").feature_options == {}


@pytest.mark.parametrize(
    "call",
    [
        lambda model: rf_hf.linearize(model, "posrf-orz"),
        lambda model: rf_hf.attach_feature_maps(model, "rf-posrf-orz"),
        lambda model: rf_hf.register(["posrf-orz"]),
        lambda model: type(model).from_pretrained(model.name_or_path, attn_implementation="rf-posrf-orz"),
        lambda model: transformers.AutoModelForCausalLM.from_config(
            model.config, attn_implementation="rf-posrf-orz"
        ),
    ],
    ids=["linearize", "attach", "register", "from_pretrained", "from_config"],
)
def test_an_unknown_name_gets_the_known_ones_and_a_suggestion(llama, call, tmp_path):
    model = llama()
    model.save_pretrained(tmp_path)
    model.name_or_path = str(tmp_path)
    with pytest.raises(ValueError, match=r"posrf-orz'.*did you mean '(rf-)?posrf-orf'.*known: .*saderf-qmc'"):
        call(model)


def test_a_saved_rf_config_says_which_import_loads_it(llama, tmp_path):
    llama("posrf-orf").save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["attn_implementation"] == "rf-posrf-orf"
    assert "import rf_attention.hf" in config["rf_attention_requires"]


def test_transfer_on_a_model_without_random_feature_layers_says_how_to_convert(llama):
    with pytest.raises(ValueError, match=r"no random-feature attention layer.*rf_attention\.hf\.linearize"):
        attention_transfer(llama(), [torch.tensor([[1, 2, 3]])], steps=1)


def test_the_import_changes_nothing_for_a_softmax_model(llama, tmp_path):
    model = llama()
    model.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    for each in (model, loaded):
        assert "_prepare_cache_for_generation" not in vars(each)
        assert not any(hasattr(m, "rf_feature_map") for m in each.modules())
        assert not {"rf_attention", "rf_attention_requires"} & set(each.config.to_dict())
    config = json.loads((tmp_path / "config.json").read_text())
    assert not {"attn_implementation", "rf_attention", "rf_attention_requires"} & set(config)
