"""replace_mlp on module trees with the attribute layouts of timm, Hugging Face ViT 4.x/5.x and nanoGPT."""

import copy

import pytest
import torch
from torch import nn

import ralimp
from spectraformer_core.testing import relative_error


class TimmMlp(nn.Module):  # timm.layers.Mlp: fc1, act, drop1, norm, fc2, drop2
    def __init__(self, d, h):
        super().__init__()
        self.fc1, self.act, self.drop1 = nn.Linear(d, h), nn.GELU(), nn.Dropout(0.0)
        self.norm, self.fc2, self.drop2 = nn.Identity(), nn.Linear(h, d), nn.Dropout(0.0)

    def forward(self, x):
        return self.drop2(self.fc2(self.norm(self.drop1(self.act(self.fc1(x))))))


class Block(nn.Module):
    def __init__(self, d, h, mlp_cls):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.mlp = mlp_cls(d, h)

    def forward(self, x):
        return x + self.mlp(self.norm(x))


class GELUActivation(nn.Module):  # transformers.activations.GELUActivation
    def forward(self, x):
        return nn.functional.gelu(x)


class ViTIntermediate(nn.Module):  # HF ViT 4.x: layer.intermediate.dense + intermediate_act_fn
    def __init__(self, d, h):
        super().__init__()
        self.dense, self.intermediate_act_fn = nn.Linear(d, h), GELUActivation()

    def forward(self, x):
        return self.intermediate_act_fn(self.dense(x))


class ViTOutput(nn.Module):  # HF ViT 4.x: layer.output.dense, adds the residual
    def __init__(self, d, h):
        super().__init__()
        self.dense, self.dropout = nn.Linear(h, d), nn.Dropout(0.0)

    def forward(self, hidden, residual):
        return self.dropout(self.dense(hidden)) + residual


class ViTLayer4(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.layernorm_after = nn.LayerNorm(d)
        self.intermediate, self.output = ViTIntermediate(d, h), ViTOutput(d, h)

    def forward(self, x):
        return self.output(self.intermediate(self.layernorm_after(x)), x)


class ViTMLP5(nn.Module):  # HF ViT 5.x: layer.mlp with fc1 / activation_fn / fc2
    def __init__(self, d, h):
        super().__init__()
        self.fc1, self.activation_fn, self.fc2 = nn.Linear(d, h), GELUActivation(), nn.Linear(h, d)

    def forward(self, x):
        return self.fc2(self.activation_fn(self.fc1(x)))


class NanoGPTMLP(nn.Module):  # nanoGPT model.py MLP: c_fc, gelu, c_proj, dropout
    def __init__(self, d, h):
        super().__init__()
        self.c_fc, self.gelu, self.c_proj = nn.Linear(d, h), nn.GELU(), nn.Linear(h, d)
        self.dropout = nn.Dropout(0.0)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


def model_of(layout, depth=3, d=8, h=16):
    torch.manual_seed(0)
    if layout == "hf4":
        return nn.Sequential(*[ViTLayer4(d, h) for _ in range(depth)])
    mlp = {"timm": TimmMlp, "hf5": ViTMLP5, "nanogpt": NanoGPTMLP}[layout]
    return nn.Sequential(*[Block(d, h, mlp) for _ in range(depth)])


@pytest.mark.parametrize("layout", ["timm", "hf4", "hf5", "nanogpt"])
@pytest.mark.parametrize("kind", ["ralimp", "eugen", "snnk", "lowrank"])
def test_replace_mlp_swaps_the_last_k_blocks_and_leaves_untouched_blocks_identical(layout, kind):
    model = model_of(layout)
    before = copy.deepcopy(model)
    replaced = ralimp.replace_mlp(model, kind, budget=32, last_k=2, seed=0)
    assert replaced == [b.name for b in ralimp.find_mlp_blocks(before)][-2:]
    # block 0 is untouched: same modules, same parameters
    assert str(model[0]) == str(before[0])
    for (n0, p0), (n1, p1) in zip(model[0].state_dict().items(), before[0].state_dict().items(), strict=True):
        assert n0 == n1
        assert torch.equal(p0, p1)
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        torch.testing.assert_close(model[0](x), before[0](x))
        y = model(x)
    assert y.shape == x.shape
    assert torch.isfinite(y).all()
    cls = ralimp.LAYERS.get(kind)
    assert sum(isinstance(m, cls) for m in model.modules()) == 2


def test_replace_mlp_initializes_from_the_pretrained_weights():
    model = model_of("timm", depth=1)
    fc1 = copy.deepcopy(model[0].mlp.fc1)
    ralimp.replace_mlp(model, "lowrank", budget=8)
    layer = model[0].mlp.fc1
    x = torch.randn(4, 8)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), nn.functional.gelu(fc1(x)), rtol=1e-5, atol=1e-5)
    assert isinstance(model[0].mlp.act, nn.Identity)


def test_replace_mlp_errors_name_the_argument():
    with pytest.raises(ValueError, match="model: found no MLP block"):
        ralimp.replace_mlp(nn.Sequential(nn.Linear(2, 2)), "ralimp", budget=32)
    with pytest.raises(ValueError, match=r"last_k: expected an integer in \[1, 3\]"):
        ralimp.replace_mlp(model_of("timm"), "ralimp", budget=32, last_k=4)
    with pytest.raises(ValueError, match="unknown layer kind 'mlp'"):
        ralimp.replace_mlp(model_of("timm"), "mlp", budget=32)
    with pytest.raises(ValueError, match="inputs: init='lstsq' fits each readout on captured inputs"):
        ralimp.replace_mlp(model_of("timm"), "eugen", budget=32, init="lstsq")


def test_calibration_inputs_are_what_each_up_projection_receives():
    model = model_of("nanogpt", d=8, h=16)
    x = torch.randn(3, 5, 8)
    seen = {}

    def record(index):
        def hook(_module, args, _output):
            seen[index] = args[0].reshape(-1, 8)

        return hook

    handles = [model[i].mlp.c_fc.register_forward_hook(record(i)) for i in range(3)]
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    blocks = ralimp.find_mlp_blocks(model)[1:]
    captured = ralimp.calibration_inputs(model, blocks, x, max_rows=100)
    assert set(captured) == {"1.mlp", "2.mlp"}
    torch.testing.assert_close(captured["1.mlp"], seen[1])
    torch.testing.assert_close(captured["2.mlp"], seen[2])
    assert ralimp.calibration_inputs(model, blocks, x, max_rows=7)["2.mlp"].shape == (7, 8)


@pytest.mark.parametrize("kind", ["eugen", "ralimp"])
def test_replace_mlp_with_a_calibration_batch_and_lstsq_beats_the_psi_start(kind):
    torch.manual_seed(0)
    model = model_of("timm", depth=2, d=8, h=16).double()
    x = torch.randn(64, 6, 8, dtype=torch.float64)
    with torch.no_grad():
        reference = model(x)
    errors = {}
    for init in ("psi", "lstsq"):
        copy_ = copy.deepcopy(model)
        ralimp.replace_mlp(copy_, kind, budget=32, inputs=x, init=init, seed=0)
        with torch.no_grad():
            errors[init] = relative_error(copy_(x), reference) ** 2
    assert errors["lstsq"] < errors["psi"]
    assert errors["lstsq"] < 1e-2
