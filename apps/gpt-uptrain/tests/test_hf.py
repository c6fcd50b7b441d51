"""The HF GPT-2 weight mapping, on a tiny randomly initialized GPT-2 built here in HF's own layout.

``transformers`` is not a dependency: the HF-format state dict is written out by hand with the shapes of
``GPT2LMHeadModel`` (``Conv1D`` weights stored ``(in, out)``), and a direct GPT-2 forward pass on those
tensors is the reference the mapped model is checked against.
"""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from gpt_uptrain import GPT, read_state_dict, save_pretrained, write_safetensors

HF_CONFIG = {
    "model_type": "gpt2",
    "vocab_size": 37,
    "n_positions": 12,
    "n_embd": 16,
    "n_layer": 2,
    "n_head": 2,
    "n_inner": None,
    "activation_function": "gelu_new",
    "layer_norm_epsilon": 1e-5,
}


def hf_state_dict(config, seed=0, prefix="transformer."):
    """A random GPT2LMHeadModel state dict (with the causal-mask buffers of older checkpoints)."""
    gen = torch.Generator().manual_seed(seed)
    c, v, p = config["n_embd"], config["vocab_size"], config["n_positions"]

    def rand(*shape):
        return torch.randn(*shape, generator=gen) * 0.3

    sd = {f"{prefix}wte.weight": rand(v, c), f"{prefix}wpe.weight": rand(p, c)}
    for i in range(config["n_layer"]):
        h = f"{prefix}h.{i}."
        sd |= {
            h + "ln_1.weight": 1 + rand(c), h + "ln_1.bias": rand(c),
            h + "attn.bias": torch.tril(torch.ones(p, p)).view(1, 1, p, p),
            h + "attn.masked_bias": torch.tensor(-1e4),
            h + "attn.c_attn.weight": rand(c, 3 * c), h + "attn.c_attn.bias": rand(3 * c),
            h + "attn.c_proj.weight": rand(c, c), h + "attn.c_proj.bias": rand(c),
            h + "ln_2.weight": 1 + rand(c), h + "ln_2.bias": rand(c),
            h + "mlp.c_fc.weight": rand(c, 4 * c), h + "mlp.c_fc.bias": rand(4 * c),
            h + "mlp.c_proj.weight": rand(4 * c, c), h + "mlp.c_proj.bias": rand(c),
        }  # fmt: skip
    sd[f"{prefix}ln_f.weight"], sd[f"{prefix}ln_f.bias"] = 1 + rand(c), rand(c)
    if prefix:
        sd["lm_head.weight"] = sd[f"{prefix}wte.weight"]
    return sd


def reference_logits(sd, config, idx):
    """GPT-2's forward pass written directly on the HF tensors (Conv1D: ``x @ W + b``)."""
    c, nh, eps = config["n_embd"], config["n_head"], config["layer_norm_epsilon"]
    hd = c // nh
    b, t = idx.shape

    def ln(x, name):
        return F.layer_norm(x, (c,), sd[name + ".weight"], sd[name + ".bias"], eps)

    def conv1d(x, name):
        return x @ sd[name + ".weight"] + sd[name + ".bias"]

    x = sd["transformer.wte.weight"][idx] + sd["transformer.wpe.weight"][:t]
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    for i in range(config["n_layer"]):
        h = f"transformer.h.{i}."
        q, k, v = conv1d(ln(x, h + "ln_1"), h + "attn.c_attn").split(c, dim=-1)
        q, k, v = (z.view(b, t, nh, hd).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-1, -2) / math.sqrt(hd)).masked_fill(~mask, float("-inf")).softmax(-1)
        x = x + conv1d((att @ v).transpose(1, 2).reshape(b, t, c), h + "attn.c_proj")
        hidden = F.gelu(conv1d(ln(x, h + "ln_2"), h + "mlp.c_fc"), approximate="tanh")
        x = x + conv1d(hidden, h + "mlp.c_proj")
    return ln(x, "transformer.ln_f") @ sd["transformer.wte.weight"].T


def write_checkpoint(folder, sd, config=HF_CONFIG, weights="pytorch_model.bin"):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    if weights == "pytorch_model.bin":
        torch.save(sd, folder / weights)
    else:
        write_safetensors(folder / weights, {k: v.contiguous() for k, v in sd.items()})
    return folder


@pytest.mark.parametrize("prefix", ["transformer.", ""], ids=["GPT2LMHeadModel", "GPT2Model"])
def test_hf_weights_give_the_reference_gpt2_logits(tmp_path, prefix):
    sd = hf_state_dict(HF_CONFIG, prefix=prefix)
    model = GPT.from_pretrained(write_checkpoint(tmp_path / "hf", sd)).eval()
    idx = torch.randint(0, HF_CONFIG["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(1))
    full = {
        (k if k.startswith(("transformer.", "lm_head")) else "transformer." + k): v for k, v in sd.items()
    }
    logits, _ = model(idx)
    torch.testing.assert_close(logits, reference_logits(full, HF_CONFIG, idx), rtol=1e-4, atol=1e-4)


def test_hf_weight_mapping_round_trips(tmp_path):
    sd = hf_state_dict(HF_CONFIG)
    model = GPT.from_pretrained(write_checkpoint(tmp_path / "hf", sd))
    exported = model.hf_state_dict()
    expected = {k: v for k, v in sd.items() if not k.endswith((".attn.bias", ".attn.masked_bias"))}
    assert set(exported) == set(expected)
    for name, value in expected.items():
        assert torch.equal(exported[name], value), name
    # ... and through the files: save_pretrained -> from_pretrained gives the same model.
    again = GPT.from_pretrained(save_pretrained(model, tmp_path / "saved"))
    for name, value in model.state_dict().items():
        assert torch.equal(again.state_dict()[name], value), name


def test_uptraining_replaces_mlps_after_the_pretrained_weights_are_in(tmp_path):
    sd = hf_state_dict(HF_CONFIG)
    folder = write_checkpoint(tmp_path / "hf", sd, weights="model.safetensors")
    assert set(read_state_dict(folder)) == set(sd)
    model = GPT.from_pretrained(
        folder, layer="ralimp", last_k=1, features=24, block_size=8, attention="performer"
    )
    layer = model.transformer.h[1].mlp.c_fc
    torch.testing.assert_close(layer.weight, sd["transformer.h.1.mlp.c_fc.weight"].T)
    torch.testing.assert_close(
        model.transformer.h[0].mlp.c_fc.weight, sd["transformer.h.0.mlp.c_fc.weight"].T
    )
    torch.testing.assert_close(
        model.transformer.h[1].attn.qkv.weight, sd["transformer.h.1.attn.c_attn.weight"].T
    )
    assert model.config.block_size == 8
    assert model.transformer.wpe.weight.shape == (8, 16)
    with pytest.raises(ValueError, match=r"MLPs transformer\.h\.1\.mlp are replaced"):
        model.hf_state_dict()


def test_bad_hf_checkpoints_are_refused_with_the_reason(tmp_path):
    with pytest.raises(FileNotFoundError, match="no Hugging Face checkpoint folder"):
        GPT.from_pretrained(tmp_path / "nothing")
    sd = hf_state_dict(HF_CONFIG)
    untied = dict(sd, **{"lm_head.weight": sd["lm_head.weight"] + 1})
    with pytest.raises(ValueError, match=r"lm_head\.weight: differs"):
        GPT.from_pretrained(write_checkpoint(tmp_path / "untied", untied))
    missing = {k: v for k, v in sd.items() if k != "transformer.h.1.mlp.c_fc.bias"}
    with pytest.raises(ValueError, match=r"missing 'transformer\.h\.1\.mlp\.c_fc\.bias'"):
        GPT.from_pretrained(write_checkpoint(tmp_path / "missing", missing))
    square = dict(sd, **{"transformer.h.0.mlp.c_fc.weight": sd["transformer.h.0.mlp.c_fc.weight"].T})
    with pytest.raises(ValueError, match=r"has shape \(64, 16\), expected \(64, 16\) \(transposed Conv1D\)"):
        GPT.from_pretrained(write_checkpoint(tmp_path / "linear", square))
    with pytest.raises(ValueError, match="model_type 'llama' is not 'gpt2'"):
        GPT.from_pretrained(
            write_checkpoint(tmp_path / "llama", sd, config={**HF_CONFIG, "model_type": "llama"})
        )
    with pytest.raises(ValueError, match="n_layer are fixed by"):
        GPT.from_pretrained(write_checkpoint(tmp_path / "ok", sd), n_layer=3)
