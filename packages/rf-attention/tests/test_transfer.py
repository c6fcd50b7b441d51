"""Attention transfer (stage 1) and the stage-2 helpers, on tiny models built here (no download)."""

import copy
import itertools

import pytest
import torch
from torch import nn

import rf_attention
from rf_attention.transfer import (
    attention_transfer,
    attention_weight_divergence,
    feature_map_parameters,
    freeze_statistics,
    learning_rate_factor,
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


@pytest.mark.parametrize("pair", ["posrf-orf", "saderf-orf", "hedgehog"])
def test_every_layers_mse_falls_on_a_teacher_with_peaked_attention(pair):
    report = attention_transfer(rf_model(pair, input_map=True), token_batches(), steps=40)
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


def test_layer_by_layer_transfer_learns_the_joint_transfers_maps():
    # teacher forcing makes each layer's loss depend on its own map only: with the same batches in the same
    # order (and no global clipping to couple them) one layer at a time gives the same maps
    joint, layerwise = rf_model(), rf_model()
    batches = token_batches(3)
    attention_transfer(joint, batches, steps=3, max_grad_norm=None)
    report = attention_transfer(layerwise, batches, steps=3, max_grad_norm=None, layerwise=True)
    assert report.steps == 3 * LAYERS
    for a, b in zip(feature_map_parameters(joint), feature_map_parameters(layerwise), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("layerwise", [False, True])
def test_a_layer_by_layer_step_stops_the_forward_pass_after_the_layer_in_training(layerwise):
    model = rf_model()
    calls = [0] * LAYERS
    for i, mlp in enumerate(model.mlps):
        mlp.register_forward_pre_hook(lambda module, args, i=i: calls.__setitem__(i, calls[i] + 1))
    attention_transfer(model, token_batches(2), steps=2, layerwise=layerwise)
    # the report's two evaluations run every block; a joint step too, a step of layer i the blocks before i
    assert calls == ([2 + 2, 2] if layerwise else [2 + 2, 2 + 2])


def test_cosine_schedule_warms_up_linearly_then_decays_to_zero():
    factors = [learning_rate_factor(step, 10, "cosine", 2) for step in range(10)]
    assert factors[:3] == [0.5, 1.0, 1.0]
    assert all(a > b for a, b in itertools.pairwise(factors[2:]))
    assert factors[-1] < 0.05
    assert [learning_rate_factor(step, 10, "constant", 0) for step in range(3)] == [1.0, 1.0, 1.0]


def naive_divergence(q, k, fm, rows, causal, keep):
    """KL(P || A) from the full N x N matrices in float64 (no stabilization)."""
    scale = q.shape[-1] ** -0.25
    phi_q, phi_k = fm(q * scale, k * scale, key_padding_mask=~keep, query_padding_mask=~keep)
    a = phi_q @ phi_k.mT
    p = torch.exp(q @ k.mT / q.shape[-1] ** 0.5)
    n = q.shape[-2]
    allowed = torch.ones(n, n, dtype=torch.bool)
    if causal:
        allowed = allowed.tril()
    allowed = allowed & keep[:, None, None, :]
    a, p = torch.where(allowed, a, 0.0), torch.where(allowed, p, 0.0)
    a, p = (x / x.sum(-1, keepdim=True).masked_fill(~allowed.any(-1, keepdim=True), 1.0) for x in (a, p))
    a, p = torch.where(allowed, a, 1.0), torch.where(allowed, p, 1.0)  # no log(0), not even masked out
    kl = torch.where(allowed, p * (p.log() - a.log()), 0.0).sum(-1)[..., rows]  # (B, H, r)
    valid = (keep[:, None, rows] & allowed[..., rows, :].any(-1)).expand_as(kl)
    return kl[valid].mean()


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("component", ["posrf", "oprf", "hedgehog"])
def test_attention_weight_divergence_equals_the_plain_formula_with_peaked_logits(component, causal):
    import rf_features

    fm = rf_features.create(
        component, num_features=6, dim=4, seed=0, learnable=True, num_heads=2, statistics_mode="batch"
    ).double()
    g = torch.Generator().manual_seed(0)
    q, k = (4 * torch.randn(2, 2, 9, 4, generator=g, dtype=torch.float64) for _ in range(2))
    keep = torch.ones(2, 9, dtype=torch.bool)
    keep[1, :3] = False  # left padding
    rows = torch.tensor([0, 2, 5, 8])
    got = attention_weight_divergence(q, k, fm, rows, causal=causal, keep=keep)
    want = naive_divergence(q, k, fm, rows, causal, keep)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
    assert float(got.detach()) > 0.1  # peaked logits: far from 0, a real comparison
    (grad,) = torch.autograd.grad(got, [fm.weight_matrix.weight])
    (want_grad,) = torch.autograd.grad(want, [fm.weight_matrix.weight])
    torch.testing.assert_close(grad, want_grad, rtol=1e-7, atol=1e-10)


def test_attention_weight_loss_trains_and_lowers_the_divergence():
    model = rf_model()
    batches = token_batches()
    report = attention_transfer(model, batches, steps=20, attention_weight=1.0, attention_rows=8)
    assert report.losses[-1] < report.losses[0]
    assert all(after < before for before, after in zip(report.mse_before, report.mse_after, strict=True))


def test_trigrf_transfer_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="normalizer can come arbitrarily near 0"):
        attention_transfer(rf_model("trigrf-orf"), token_batches(1), steps=1)
