import copy

import pytest
import torch

import ralimp
from gpt_uptrain import GPT, GPTConfig
from gpt_uptrain.model import GELU_TANH, LAYER_OPTIONS
from spectraformer_core.testing import relative_error

TINY = {
    "block_size": 16,
    "vocab_size": 23,
    "n_layer": 3,
    "n_head": 2,
    "n_embd": 32,
    "features": 24,
    "seed": 0,
}

CASES = [
    pytest.param({"layer": "dense"}, id="dense"),
    pytest.param({"layer": "ralimp", "last_k": 2}, id="ralimp"),
    pytest.param({"layer": "eugen", "last_k": 2}, id="eugen"),
    pytest.param({"layer": "snnk", "last_k": 2}, id="snnk"),
    pytest.param({"layer": "lowrank", "last_k": 3}, id="lowrank"),
    pytest.param({"layer": "ralimp", "last_k": 1, "attention": "performer"}, id="ralimp+performer"),
    pytest.param({"layer": "dense", "attention": "oprf-orf"}, id="dense+oprf-orf"),
    pytest.param({"layer": "snnk", "last_k": 1, "attention": "saderf-fastfoodl"}, id="snnk+saderf-fastfoodl"),
]


def _perturbed_after(idx, t, vocab, seed=1):
    other = idx.clone()
    gen = torch.Generator().manual_seed(seed)
    other[:, t + 1 :] = (
        idx[:, t + 1 :] + torch.randint(1, vocab, other[:, t + 1 :].shape, generator=gen)
    ) % vocab
    return other


@pytest.mark.parametrize("options", CASES)
@pytest.mark.parametrize("mode", ["eval", "train"])
def test_logits_at_position_t_do_not_depend_on_later_tokens(options, mode):
    model = GPT(GPTConfig(**TINY, **options))
    model.train(mode == "train")
    gen = torch.Generator().manual_seed(0)
    idx = torch.randint(0, TINY["vocab_size"], (2, TINY["block_size"]), generator=gen)
    for t in (0, 5, TINY["block_size"] - 2):
        other = _perturbed_after(idx, t, TINY["vocab_size"])
        # A fresh copy per forward pass: in training, running statistics (OPRF, SADERF) change with each call.
        logits, _ = copy.deepcopy(model)(idx)
        logits_other, _ = copy.deepcopy(model)(other)
        torch.testing.assert_close(logits_other[:, : t + 1], logits[:, : t + 1], rtol=0, atol=1e-5)
        # ... while the changed token does change the logits from t + 1 on (the check can fail).
        assert (logits_other[:, t + 1] - logits[:, t + 1]).abs().max() > 1e-4


def test_replacement_swaps_exactly_the_mlps_of_the_last_k_blocks():
    model = GPT(GPTConfig(**{**TINY, "n_layer": 4}, layer="ralimp", last_k=2))
    assert model.replaced == ["transformer.h.2.mlp", "transformer.h.3.mlp"]
    kinds = [type(block.mlp.c_fc) for block in model.transformer.h]
    assert kinds == [torch.nn.Linear, torch.nn.Linear, ralimp.RaLiMP, ralimp.RaLiMP]
    assert all(isinstance(block.mlp.gelu, torch.nn.Identity) for block in model.transformer.h[2:])
    assert all(isinstance(block.mlp.c_proj, torch.nn.Linear) for block in model.transformer.h)


def test_default_last_k_is_half_of_the_blocks_rounded_up():
    assert GPTConfig(**{**TINY, "n_layer": 5}, layer="eugen").replaced_blocks == 3
    assert GPTConfig(**TINY).replaced_blocks == 0


def test_ralimp_at_budget_128_spends_exactly_128_features_with_at_most_the_papers_one_atom():
    model = GPT(GPTConfig(**{**TINY, "features": 128}, layer="ralimp", last_k=1))
    layer = model.transformer.h[-1].mlp.c_fc
    assert isinstance(layer, ralimp.RaLiMP)
    assert layer.activation_name == "gelu_tanh"  # GPT-2's activation, not the exact GELU
    assert layer.poly_degree == 2
    assert layer.num_atoms in (0, 1)  # the variance-aware fit chooses J <= the paper's 1
    assert layer.num_random_features == 128
    assert ralimp.fit_summary(model)  # the choice is what the results line records


def test_the_papers_gpt2_layer_without_the_choice_of_atoms_has_exactly_128_features():
    linear = torch.nn.Linear(32, 128)
    options = {**LAYER_OPTIONS["ralimp"], "fit": "discretized"}  # the fit that keeps J as given
    layer = ralimp.create("ralimp", linear, GELU_TANH, budget=128, seed=0, **options)
    assert layer.num_atoms == 1
    assert layer.num_freqs == 2
    assert [m.num_features for m in layer.freq_matrices] == [4, 4]  # 2 frequencies x m = 4 projections
    # App. D.1's count (2 J n_freq m = 16 for the rational block) leaves 112 polynomial features.
    assert [m.num_features for m in layer.poly_matrices] == [112, 112]
    assert layer.num_random_features == 128
    assert float(layer.tau) == 3.0
    trainable = {name for name, p in layer.named_parameters() if p.requires_grad}
    assert {"atom_a", "atom_b", "atom_p", "atom_q_raw"} <= trainable


def test_fit_and_num_atoms_reach_ralimp_only_and_the_papers_fit_keeps_the_atom():
    config = GPTConfig(**TINY, layer="ralimp", last_k=2, fit="paper")
    assert config.layer_options() == {**LAYER_OPTIONS["ralimp"], "fit": "paper", "num_atoms": 1}
    model = GPT(config)
    layers = [block.mlp.c_fc for block in model.transformer.h[-2:]]
    assert [(layer.num_atoms, layer.options.fit) for layer in layers] == [(1, "paper")] * 2
    assert GPTConfig(**TINY, layer="eugen", fit="paper").layer_options() == LAYER_OPTIONS["eugen"]
    with pytest.raises(ValueError, match="--num-atoms: expected an integer >= 0, got -1"):
        GPTConfig(**TINY, num_atoms=-1)


@pytest.mark.parametrize("layer", ["ralimp", "eugen", "snnk", "lowrank"])
def test_every_kind_spends_the_budget_exactly(layer):
    model = GPT(GPTConfig(**{**TINY, "features": 128}, layer=layer, last_k=1))
    assert model.transformer.h[-1].mlp.c_fc.num_random_features == 128


def test_the_calibrated_start_is_closer_to_the_dense_model_than_psi():
    # GPT-2's initialization; calibrated on 64 sequences, measured on 8 others (logits about their mean).
    dense = GPT(GPTConfig(**{**TINY, "features": 64})).eval()
    gen = torch.Generator().manual_seed(0)
    calibration = torch.randint(0, TINY["vocab_size"], (64, TINY["block_size"]), generator=gen)
    held_out = torch.randint(0, TINY["vocab_size"], (8, TINY["block_size"]), generator=gen)
    with torch.no_grad():
        reference = dense(held_out)[0]
    for layer in ("ralimp", "eugen", "snnk"):
        errors = {}
        for init in ("psi", "lstsq"):
            model = copy.deepcopy(dense)
            model.linearize_mlps(calibration, init=init, layer=layer, last_k=2)
            with torch.no_grad():
                logits = model.eval()(held_out)[0]
            # ||logits - reference|| / ||reference - its mean||: both taken about the reference's mean.
            errors[init] = relative_error(logits - reference.mean(), reference - reference.mean())
        assert errors["lstsq"] < 0.5 * errors["psi"], (layer, errors)


def test_a_dense_model_is_replaced_once():
    model = GPT(GPTConfig(**TINY, layer="ralimp", last_k=1))
    with pytest.raises(ValueError, match="already replaced"):
        model.linearize_mlps(layer="eugen")
    with pytest.raises(ValueError, match="block_size are not among"):
        GPT(GPTConfig(**TINY)).linearize_mlps(block_size=8)
    with pytest.raises(ValueError, match="inputs: init='lstsq'"):
        GPT(GPTConfig(**TINY)).linearize_mlps(init="lstsq", layer="ralimp")


def test_parameter_count_from_the_shape_matches_the_dense_model():
    for bias in (True, False):
        config = GPTConfig(**TINY, bias=bias)
        assert config.num_parameters() == GPT(config).num_parameters(non_embedding=False)


def test_generation_appends_tokens_with_an_rf_attention():
    model = GPT(GPTConfig(**TINY, attention="oprf-orf", layer="ralimp", last_k=1)).eval()
    start = torch.zeros(2, 3, dtype=torch.long)
    out = model.generate(start, 20, temperature=1.0, top_k=5, generator=torch.Generator().manual_seed(0))
    assert out.shape == (2, 23)  # longer than block_size: the context is cropped
    assert torch.equal(out[:, :3], start)
    assert int(out.max()) < TINY["vocab_size"]


def test_weight_decay_goes_to_matrices_not_to_biases_norms_or_coefficients():
    model = GPT(GPTConfig(**TINY, layer="ralimp", last_k=1))
    optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
    decayed = {id(p) for p in optimizer.param_groups[0]["params"]}
    names = {name for name, p in model.named_parameters() if id(p) in decayed}
    assert "transformer.h.2.mlp.c_fc.weight" in names
    assert "transformer.h.0.attn.qkv.weight" in names
    assert not any(n.endswith(("bias", "node_cos", "node_sin", "poly_coef")) or ".ln_" in n for n in names)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"layer": "mystery"}, "layer: expected one of"),
        ({"layer": "ralimp", "last_k": 9}, r"last_k: expected an integer in \[1, 3\]"),
        ({"n_head": 5}, "n_head: expected a divisor of n_embd=32"),
        ({"layer": "ralimp", "last_k": 1, "features": 8}, "budget: 8 leaves"),
    ],
)
def test_bad_settings_name_the_argument(options, message):
    with pytest.raises(ValueError, match=message):
        GPT(GPTConfig(**{**TINY, **options}))


def test_too_long_input_is_refused():
    model = GPT(GPTConfig(**TINY))
    with pytest.raises(ValueError, match="longer than block_size=16"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_input_maps_start_at_the_identity_and_only_with_learned_maps_asked_for():
    shape = {
        "block_size": 16,
        "vocab_size": 11,
        "n_layer": 1,
        "n_head": 2,
        "n_embd": 16,
        "attention": "posrf-orf",
    }
    plain = GPT(GPTConfig(**shape, learnable_attention=True))
    mapped = GPT(GPTConfig(**shape, learnable_attention=True, attention_input_map=True))
    mapped.load_state_dict(plain.state_dict(), strict=False)
    names = {n for n, _ in mapped.named_parameters()} - {n for n, _ in plain.named_parameters()}
    assert names
    assert all("query_map" in n or "key_map" in n for n in names)
    tokens = torch.randint(0, 11, (2, 16))
    torch.testing.assert_close(mapped(tokens)[0], plain(tokens)[0], rtol=1e-5, atol=1e-6)
