"""Periodic redraws of the random features: one operator, counted by a buffer, per module."""

import copy

import torch

import rf_attention


def test_a_deep_copy_redraws_its_own_features_and_leaves_the_original_alone():
    original = rf_attention.create("posrf-orf", 32, 2, num_features=16, seed=0, redraw_interval=1).train()
    before = original.feature_map.weight_matrix.matrix().clone()
    twin = copy.deepcopy(original)
    x = torch.randn(1, 5, 32)
    for _ in range(3):
        twin(x)
    assert torch.equal(original.feature_map.weight_matrix.matrix(), before)
    assert not torch.equal(twin.feature_map.weight_matrix.matrix(), before)
    assert int(original.training_calls) == 0
    assert int(twin.training_calls) == 3


def test_learned_matrices_ignore_the_redraw_interval():
    attn = rf_attention.create("oprf-fastfoodl", 32, 2, num_features=16, seed=0, redraw_interval=1).train()
    before = [p.detach().clone() for p in attn.feature_map.parameters()]
    x = torch.randn(1, 5, 32)
    for _ in range(3):
        attn(x)
    for a, b in zip(attn.feature_map.parameters(), before, strict=True):
        assert torch.equal(a, b)
    assert int(attn.training_calls) == 3


def test_cross_attention_calls_count_towards_redraws():
    attn = rf_attention.create("posrf-orf", 32, 2, num_features=16, seed=0, redraw_interval=2).train()
    x, context = torch.randn(1, 5, 32), torch.randn(1, 7, 32)
    before = attn.feature_map.weight_matrix.matrix().clone()
    attn(x, context=context)
    attn(x)
    assert torch.equal(attn.feature_map.weight_matrix.matrix(), before)
    attn(x, context=context)  # call 2: redrawn first
    assert not torch.equal(attn.feature_map.weight_matrix.matrix(), before)
