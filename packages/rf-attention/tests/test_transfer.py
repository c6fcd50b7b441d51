"""Attention transfer (stage 1) and the stage-2 helpers, on tiny models built here (no download)."""

import copy

import pytest
import torch
from torch import nn

import rf_attention
from rf_attention.transfer import (
    attention_transfer,
    feature_map_parameters,
    freeze_statistics,
    teacher_forced,
)

VOCAB, DIM, HEADS, LAYERS, N = 32, 16, 2, 2, 24


class TinyLM(nn.Module):
    """Embedding, ``LAYERS`` blocks of causal attention + MLP, a linear head; q and k scaled by ``peak``."""

    def __init__(self, pair: str, peak: float = 3.0, **attention_options) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, DIM)
        self.attns = nn.ModuleList(
            [
                rf_attention.create(
                    pair, DIM, HEADS, num_features=16, causal=True, seed=i, **attention_options
                )
                for i in range(LAYERS)
            ]
        )
        self.mlps = nn.ModuleList(
            [
                nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))
                for _ in range(LAYERS)
            ]
        )
        self.head = nn.Linear(DIM, VOCAB)
        with torch.no_grad():
            for attn in self.attns:
                attn.qkv.weight[: 2 * DIM].mul_(peak)  # peaked attention: large q . k

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embed(input_ids)
        padding = None if attention_mask is None else attention_mask == 0
        for attn, mlp in zip(self.attns, self.mlps, strict=True):
            x = x + attn(x, key_padding_mask=padding)
            x = x + mlp(x)
        return self.head(x)


def rf_model(pair: str = "posrf-orf", **kw) -> TinyLM:
    return TinyLM(pair, learnable=True, **kw)


def token_batches(count: int = 4, batch: int = 4) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, VOCAB, (batch, N), generator=g) for _ in range(count)]


def test_transfer_changes_only_the_feature_maps():
    model = rf_model("saderf-orf")
    trained = {id(p) for p in feature_map_parameters(model)}
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    attention_transfer(model, token_batches(), steps=3, lr=1e-2)
    for name, p in model.named_parameters():
        if id(p) in trained:
            assert not torch.equal(p, before[name]), name
        else:
            assert torch.equal(p, before[name]), name


def test_transfer_restores_requires_grad_and_train_modes():
    model = rf_model()
    model.train()
    model.head.weight.requires_grad_(False)
    attention_transfer(model, token_batches(1), steps=1)
    assert all(m.training for m in model.modules())
    assert not model.head.weight.requires_grad
    assert model.embed.weight.requires_grad
    assert "attend" not in vars(model.attns[0])


@pytest.mark.parametrize("pair", ["posrf-orf", "saderf-orf"])
def test_every_layers_mse_falls_on_a_teacher_with_peaked_attention(pair):
    report = attention_transfer(rf_model(pair), token_batches(), steps=40, lr=3e-2)
    for before, after in zip(report.mse_before, report.mse_after, strict=True):
        assert after < 0.6 * before


def test_report_has_one_mse_per_attention_layer_and_the_steps_taken():
    report = attention_transfer(rf_model(), token_batches(2), steps=5)
    assert report.layers == ("attns.0", "attns.1")
    assert len(report.mse_before) == len(report.mse_after) == LAYERS
    assert report.steps == 5
    assert len(report.losses) == 5


def test_transfer_stops_when_a_one_shot_iterator_runs_out():
    report = attention_transfer(rf_model(), iter(token_batches(3)), steps=10)
    assert report.steps == 3


def test_teacher_forced_model_outputs_equal_the_softmax_model():
    model = rf_model().eval()
    teacher = copy.deepcopy(model)
    for i, attn in enumerate(teacher.attns):
        softmax = rf_attention.create("softmax", DIM, HEADS, causal=True)
        softmax.load_state_dict({k: v for k, v in attn.state_dict().items() if k.startswith(("qkv", "proj"))})
        teacher.attns[i] = softmax
    ids = token_batches(1)[0]
    with torch.no_grad(), teacher_forced(model):
        forced = model(ids)
    torch.testing.assert_close(forced, teacher(ids))


def test_padded_positions_are_excluded_from_the_loss():
    model = rf_model().eval()
    ids = token_batches(1)[0]
    mask = torch.ones_like(ids)
    mask[1, -6:] = 0
    other = ids.clone()
    other[1, -6:] = (other[1, -6:] + 7) % VOCAB  # only padded tokens differ
    results = []
    with torch.no_grad(), teacher_forced(model) as losses:
        for batch in (ids, other):
            losses.keep = mask.bool()
            model(batch, attention_mask=mask)
            results.append(losses.floats())
    assert results[0] == results[1]


def test_dict_batches_take_their_attention_mask_into_the_loss():
    model = rf_model()
    ids = token_batches(1)[0]
    mask = torch.ones_like(ids)
    mask[0, -5:] = 0
    report = attention_transfer(model, [{"input_ids": ids, "attention_mask": mask}], steps=0)
    with torch.no_grad(), teacher_forced(model) as losses:
        losses.keep = mask.bool()
        model(ids, attention_mask=mask)
    assert report.mse_before == losses.floats()


def test_a_model_without_learnable_maps_is_refused():
    with pytest.raises(ValueError, match="learnable=True"):
        attention_transfer(TinyLM("posrf-orf"), token_batches(1), steps=1)


def test_frozen_statistics_stay_fixed_in_training():
    model = rf_model("oprf-orf").train()
    freeze_statistics(model)
    model(token_batches(1)[0])
    assert all(float(attn.feature_map.running_a.abs().max()) == 0.0 for attn in model.attns)
