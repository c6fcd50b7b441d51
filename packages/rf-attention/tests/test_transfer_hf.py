"""Attention transfer and the LoRA stage on tiny Hugging Face Llamas built from configs (no download)."""

import pytest
import torch

from rf_attention.transfer import attention_transfer, freeze_statistics, teacher_forced

transformers = pytest.importorskip("transformers")
rf_hf = pytest.importorskip("rf_attention.hf")


@pytest.fixture(autouse=True)
def learnable_saderf():
    """``rf-saderf-orf`` with learnable per-head maps here, registered back with its defaults afterwards."""
    rf_hf.register(["saderf-orf"], num_features=16, learnable=True, num_heads=4)
    yield
    rf_hf.register(["saderf-orf"])


@pytest.fixture
def llama(tiny_llama):
    """The tiny Llama with 4x query and key projections (logits large enough to need transfer), on RF."""

    def build():
        model = tiny_llama("sdpa")
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.q_proj.weight.mul_(4)
                layer.self_attn.k_proj.weight.mul_(4)
        model.set_attn_implementation("rf-saderf-orf")
        return model

    return build


def llama_batches() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 64, (3, 20), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0  # left padding
    return [{"input_ids": ids, "attention_mask": mask}]


def test_hf_llama_transfer_lowers_every_layers_mse_and_changes_only_the_feature_maps(llama):
    model = llama()
    before = {n: p.detach().clone() for n, p in model.named_parameters() if "rf_feature_map" not in n}
    report = attention_transfer(model, llama_batches(), steps=30, lr=3e-2)
    assert report.layers == ("model.layers.0.self_attn", "model.layers.1.self_attn")
    assert all(a < 0.6 * b for a, b in zip(report.mse_after, report.mse_before, strict=True))
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters() if n in before)
    assert model.config._attn_implementation == "rf-saderf-orf"


# peft 0.21 reads a transformers attribute that transformers 5 deprecates
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_lora_stage_trains_adapters_on_the_attention_projections_with_trainer(llama, tmp_path):
    peft = pytest.importorskip("peft")
    from rf_attention.transfer import lora_config

    model = llama()
    attention_transfer(model, llama_batches(), steps=2)
    maps = {n: p.detach().clone() for n, p in model.named_parameters() if "rf_feature_map" in n}
    freeze_statistics(model)
    peft_model = peft.get_peft_model(model, lora_config(model, task_type="CAUSAL_LM"))
    trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert trainable
    assert all("lora_" in n and ".self_attn." in n for n in trainable)
    ids = llama_batches()[0]["input_ids"]
    data = [{"input_ids": row, "labels": row} for row in ids]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=3, report_to=[], use_cpu=True,
        save_strategy="no", learning_rate=1e-2,
    )  # fmt: skip
    result = transformers.Trainer(model=peft_model, args=args, train_dataset=data).train()
    assert torch.isfinite(torch.tensor(result.training_loss))
    after = {n.removeprefix("base_model.model."): p for n, p in peft_model.named_parameters()}
    assert all(torch.equal(after[n], p) for n, p in maps.items())


def test_teacher_forcing_after_transfer_keeps_the_trained_maps_of_a_reloaded_model(llama, tmp_path):
    saved = llama()
    rf_hf.attach_feature_maps(saved)  # the folder holds feature maps
    saved.save_pretrained(tmp_path)
    model = transformers.LlamaForCausalLM.from_pretrained(tmp_path, attn_implementation="rf-saderf-orf")
    attention_transfer(model, llama_batches(), steps=2, lr=3e-2)
    trained = {n: p.detach().clone() for n, p in model.named_parameters() if "rf_feature_map" in n}
    with torch.no_grad(), teacher_forced(model):
        model(**llama_batches()[0], use_cache=False)
    assert trained
    assert all(torch.equal(p, trained[n]) for n, p in model.named_parameters() if n in trained)


@pytest.mark.parametrize("layerwise", [False, True])
def test_hf_transfer_with_the_attention_weight_loss_lowers_every_layers_mse(llama, layerwise):
    # grouped-query keys, HF's scaling and left padding all reach the divergence through the HF hook
    model = llama()
    report = attention_transfer(
        model, llama_batches(), steps=30, lr=3e-2, attention_weight=1.0, attention_rows=8, layerwise=layerwise
    )
    assert report.steps == (60 if layerwise else 30)
    assert all(torch.isfinite(torch.tensor(report.losses)))
    assert all(a < 0.6 * b for a, b in zip(report.mse_after, report.mse_before, strict=True))


def test_hf_learned_map_transfers_after_linearize(tiny_llama):
    model = tiny_llama("sdpa")
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(4)
            layer.self_attn.k_proj.weight.mul_(4)
    rf_hf.linearize(model, "hedgehog", num_features=8, seed=0)
    report = attention_transfer(model, llama_batches(), steps=30)
    assert all(a < 0.6 * b for a, b in zip(report.mse_after, report.mse_before, strict=True))


def test_attention_transfer_trains_a_learned_maps_window_factor(tiny_llama):
    model = rf_hf.linearize(tiny_llama("sdpa"), "hedgehog", num_features=8, seed=0, window=4)
    factors = [layer.self_attn.rf_feature_map.window_logit for layer in model.model.layers]
    start = [f.detach().clone() for f in factors]
    report = attention_transfer(model, llama_batches(), steps=10)
    assert all(torch.isfinite(torch.tensor(report.losses)))
    assert all(not torch.equal(f.detach(), s) for f, s in zip(factors, start, strict=True))


def test_attention_transfer_refuses_a_window_that_covers_every_position(tiny_llama):
    model = rf_hf.linearize(tiny_llama("sdpa"), "posrf-orf", num_features=8, seed=0, window=10_000)
    with pytest.raises(ValueError, match="window"):
        attention_transfer(model, llama_batches(), steps=2)
