"""The efficient-attention baselines: exactness limits against exact attention, masks, gradients, dtypes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import rf_attention
from rf_attention import softmax_attention
from rf_attention.baselines import (
    BigBirdAttention,
    InformerAttention,
    LinformerAttention,
    NystromformerAttention,
    ReformerAttention,
    SkyformerAttention,
    gaussian_kernel_attention,
)
from rf_attention.baselines._common import iterative_pinv
from rf_attention.baselines.nystromformer import segment_means

DIM, HEADS, HEAD_DIM = 16, 2, 8

#: Small budgets, so that every module approximates (no exactness limit reached) at N = 30.
APPROXIMATE = {
    "nystromformer": {"num_features": 4},
    "skyformer": {"num_features": 6},
    "linformer": {"num_features": 5, "max_seq_len": 32},
    "bigbird": {"block_size": 4, "random_blocks": 1},
    "reformer": {"chunk_length": 4, "n_hashes": 2},
    "informer": {"num_features": 3},
}
CLASSES = {
    "nystromformer": NystromformerAttention,
    "skyformer": SkyformerAttention,
    "linformer": LinformerAttention,
    "bigbird": BigBirdAttention,
    "reformer": ReformerAttention,
    "informer": InformerAttention,
}
NAMES = list(APPROXIMATE)


def make(name: str, **kw) -> torch.nn.Module:
    return rf_attention.create(name, DIM, HEADS, **{"seed": 0, **APPROXIMATE[name], **kw})


def heads(n: int, *, batch: int = 2, seed: int = 0, scale: float = 1.0) -> tuple[torch.Tensor, ...]:
    """float64 ``q, k, v (batch, HEADS, n, HEAD_DIM)``."""
    g = torch.Generator().manual_seed(seed)
    return tuple(
        scale * torch.randn(batch, HEADS, n, HEAD_DIM, generator=g, dtype=torch.float64) for _ in range(3)
    )


def padding(n: int, *, padded: dict[int, list[int]]) -> torch.Tensor:
    """A ``(2, n)`` padding mask with True at ``padded[b]``."""
    mask = torch.zeros(2, n, dtype=torch.bool)
    for b, positions in padded.items():
        mask[b, positions] = True
    return mask


def reseed(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Restart the module's draws (landmarks, random blocks, hashes, key samples) from ``seed``."""
    if hasattr(module, "generator"):
        module.generator.manual_seed(seed)
    return module


def dense_reference(scores: torch.Tensor, allowed: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``softmax(scores)`` restricted to ``allowed`` times ``v``, with rows of nothing allowed giving 0."""
    weights = torch.softmax(scores.masked_fill(~allowed, -torch.inf), dim=-1)
    return torch.nan_to_num(weights, nan=0.0) @ v


# ----------------------------------------------------------------------------------------------------
# Properties every baseline has


def test_every_baseline_is_registered_under_its_name():
    for name, cls in CLASSES.items():
        assert name in rf_attention.names()
        assert isinstance(rf_attention.create(name, DIM, HEADS), cls)


@pytest.mark.parametrize("name", NAMES)
def test_output_has_the_input_shape_and_dtype(name):
    x = torch.randn(3, 30, DIM)
    y = make(name)(x)
    assert y.shape == x.shape
    assert y.dtype == x.dtype
    assert torch.isfinite(y).all()


@pytest.mark.parametrize("name", NAMES)
def test_changing_padded_tokens_changes_no_real_output(name):
    module = make(name).double()
    n = 30
    mask = padding(n, padded={0: [3, 4, 17, 29], 1: list(range(21, 30))})
    x = torch.randn(2, n, DIM, dtype=torch.float64)
    y = reseed(module)(x, key_padding_mask=mask)
    x2 = torch.where(mask[..., None], 100 * torch.randn_like(x), x)
    y2 = reseed(module)(x2, key_padding_mask=mask)
    torch.testing.assert_close(y2[~mask], y[~mask], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", NAMES)
def test_a_sequence_of_padding_only_gives_zeros(name):
    module = make(name).double()
    q, k, v = heads(30)
    mask = padding(30, padded={0: list(range(30)), 1: [0, 5]})
    out = reseed(module).attend(q, k, v, mask)
    assert torch.isfinite(out).all()
    if name == "nystromformer":
        module.conv.data.zero_()  # the skip convolution of zero values is zero too; check the attention
        out = reseed(module).attend(q, k, v, mask)
    torch.testing.assert_close(out[0], torch.zeros_like(out[0]))


@pytest.mark.parametrize("name", NAMES)
def test_gradients_reach_every_parameter_and_are_finite(name):
    module = make(name)
    x = torch.randn(2, 30, DIM, requires_grad=True)
    mask = padding(30, padded={1: list(range(20, 30))})
    module(x, key_padding_mask=mask).square().sum().backward()
    assert torch.isfinite(x.grad).all()
    assert x.grad.abs().sum() > 0
    for pname, p in module.named_parameters():
        assert p.grad is not None, pname
        assert torch.isfinite(p.grad).all(), pname
        assert p.grad.abs().sum() > 0, pname


@pytest.mark.parametrize("name", NAMES)
def test_bfloat16_modules_give_finite_bfloat16_outputs(name):
    module = make(name).to(torch.bfloat16)
    x = torch.randn(2, 30, DIM, dtype=torch.bfloat16)
    mask = padding(30, padded={0: list(range(30)), 1: list(range(25, 30))})
    y = module(x, key_padding_mask=mask)
    assert y.dtype == torch.bfloat16
    assert torch.isfinite(y).all()


@pytest.mark.parametrize("name", NAMES)
def test_causal_is_refused_with_a_clear_error(name):
    with pytest.raises(ValueError, match=r"causal: \w+ has no causal form"):
        rf_attention.create(name, DIM, HEADS, causal=True)


RANDOM = ["skyformer", "bigbird", "reformer", "informer"]


@pytest.mark.parametrize("name", NAMES)
def test_modules_with_the_same_seed_are_equal_whatever_the_global_seed(name):
    x = torch.randn(2, 30, DIM)
    torch.manual_seed(1)
    a = make(name, seed=3)
    torch.manual_seed(2)
    b = make(name, seed=3)
    state_a, state_b = a.state_dict(), b.state_dict()
    assert state_a.keys() == state_b.keys()
    for key, value in state_a.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, state_b[key]), key
    torch.testing.assert_close(a(x), b(x), rtol=0, atol=0)
    torch.testing.assert_close(a.eval()(x), b.eval()(x), rtol=0, atol=0)


@pytest.mark.parametrize("name", RANDOM)
def test_another_seed_gives_other_draws(name):
    x = torch.randn(2, 30, DIM)
    a, c = make(name, seed=0), make(name, seed=1)
    c.load_state_dict({k: v for k, v in a.state_dict().items() if k != "_extra_state"}, strict=False)
    assert not torch.allclose(a.eval()(x), c.eval()(x))


@pytest.mark.parametrize("name", RANDOM)
def test_eval_output_is_the_same_on_every_call(name):
    module = make(name).eval()
    x = torch.randn(2, 30, DIM)
    mask = padding(30, padded={1: list(range(24, 30))})
    first = module(x, key_padding_mask=mask)
    for _ in range(3):
        torch.testing.assert_close(module(x, key_padding_mask=mask), first, rtol=0, atol=0)


@pytest.mark.parametrize("name", RANDOM)
def test_training_steps_draw_afresh_and_eval_reuses_the_last_steps_draws(name):
    module = make(name)
    x = torch.randn(2, 30, DIM)
    steps = [module(x) for _ in range(3)]
    assert not torch.allclose(steps[0], steps[1])
    assert not torch.allclose(steps[1], steps[2])
    torch.testing.assert_close(module.eval()(x), steps[-1], rtol=0, atol=0)


@pytest.mark.parametrize("name", RANDOM)
def test_a_restored_state_dict_repeats_eval_and_the_next_training_draws(name):
    x = torch.randn(2, 30, DIM)
    a, b = make(name), make(name, seed=5)
    a(x)
    b.load_state_dict(a.state_dict())
    torch.testing.assert_close(b.eval()(x), a.eval()(x), rtol=0, atol=0)
    torch.testing.assert_close(b.train()(x), a.train()(x), rtol=0, atol=0)


@pytest.mark.parametrize("name", NAMES)
def test_approximate_budgets_differ_from_exact_attention(name):
    """The exactness tests below would pass vacuously if the small budgets were exact too."""
    module = make(name).double()
    if name == "nystromformer":
        module.conv = None
    q, k, v = heads(30)
    if name == "reformer":
        k = q
    exact = gaussian_kernel_attention(q, k, v) if name == "skyformer" else softmax_attention(q, k, v)
    assert (reseed(module).attend(q, k, v, None) - exact).abs().max() > 1e-3


# ----------------------------------------------------------------------------------------------------
# Nystromformer


def test_iterative_pinv_converges_to_the_moore_penrose_pseudo_inverse():
    g = torch.Generator().manual_seed(0)
    a = torch.softmax(torch.randn(3, 6, 6, generator=g, dtype=torch.float64), dim=-1)
    a[2, :, 5] = a[2, :, 4]  # a singular one
    torch.testing.assert_close(iterative_pinv(a, 40), torch.linalg.pinv(a), rtol=1e-7, atol=1e-7)


def test_segment_means_average_the_real_tokens_of_each_segment():
    x = torch.arange(7.0, dtype=torch.float64).view(1, 1, 7, 1)
    valid = torch.tensor([[True, True, False, True, True, True, True]])
    # m = 3 of N = 7: segments {0, 1, 2}, {3, 4}, {5, 6}; of N = 6: {0, 1}, {2, 3}, {4, 5}. 2 is padding.
    assert segment_means(x, valid, 3).flatten().tolist() == [0.5, 3.5, 5.5]
    assert segment_means(x[..., :6, :], valid[:, :6], 3).flatten().tolist() == [0.5, 3.0, 4.5]


def test_nystromformer_with_a_landmark_per_token_equals_softmax():
    module = NystromformerAttention(DIM, HEADS, num_features=12, pinv_iterations=40, conv_kernel_size=None)
    q, k, v = heads(12, scale=0.7)
    mask = padding(12, padded={1: [2, 9, 10, 11]})
    torch.testing.assert_close(module.attend(q, k, v, None), softmax_attention(q, k, v))
    out = module.attend(q, k, v, mask)
    exact = softmax_attention(q, k, v, key_padding_mask=mask)
    torch.testing.assert_close(out[:, :, ~mask.any(0)], exact[:, :, ~mask.any(0)])


def test_nystromformer_skip_convolution_is_a_depthwise_convolution_of_the_values():
    module = NystromformerAttention(DIM, HEADS, num_features=12, pinv_iterations=40, conv_kernel_size=3)
    q, k, v = heads(12, scale=0.7)
    w = module.conv.detach().double()  # (H, 1, 3, 1)
    padded = F.pad(v, (0, 0, 1, 1))
    conv = sum(w[None, :, 0, t, 0, None, None] * padded[:, :, t : t + 12] for t in range(3))
    torch.testing.assert_close(module.attend(q, k, v, None), softmax_attention(q, k, v) + conv)


def test_nystromformer_refuses_an_even_convolution():
    with pytest.raises(ValueError, match="conv_kernel_size: expected an odd integer"):
        NystromformerAttention(DIM, HEADS, conv_kernel_size=4)


# ----------------------------------------------------------------------------------------------------
# Skyformer


def test_gaussian_kernel_attention_sums_the_gaussian_kernel_over_real_keys():
    q, k, v = heads(5)
    mask = padding(5, padded={0: [1]})
    scaled = HEAD_DIM**-0.25
    kernel = torch.exp(-0.5 * torch.cdist(q * scaled, k * scaled) ** 2).masked_fill(mask[:, None, None], 0)
    torch.testing.assert_close(gaussian_kernel_attention(q, k, v, key_padding_mask=mask), kernel @ v)


def test_skyformer_with_every_query_and_key_a_landmark_equals_gaussian_kernel_attention():
    module = SkyformerAttention(DIM, HEADS, num_features=24, ridge=0.0, pinv_iterations=30)
    q, k, v = heads(12)
    mask = padding(12, padded={1: [0, 7, 11]})
    exact = gaussian_kernel_attention(q, k, v, key_padding_mask=mask)
    out = module.attend(q, k, v, mask)
    torch.testing.assert_close(out[:, :, ~mask.any(0)], exact[:, :, ~mask.any(0)])


def test_skyformer_draws_landmarks_among_real_tokens_half_queries_half_keys():
    module = SkyformerAttention(DIM, HEADS, num_features=6, seed=0)
    valid = ~padding(10, padded={0: [0, 1, 2, 3, 4, 5], 1: []})
    index = module.landmark_indices(valid, torch.Generator().manual_seed(0))
    assert index.shape == (2, 6)
    assert ((index[:, :3] >= 0) & (index[:, :3] < 10)).all()
    assert (index[:, 3:] >= 10).all()
    assert valid[0, index[0] % 10].all()
    assert all(len(set(row.tolist())) == 6 for row in index)


# ----------------------------------------------------------------------------------------------------
# Linformer


def test_linformer_with_identity_projections_equals_softmax():
    module = LinformerAttention(DIM, HEADS, num_features=12, max_seq_len=12)
    with torch.no_grad():
        module.E.copy_(torch.eye(12))
        module.F.copy_(torch.eye(12))
    q, k, v = heads(12)
    torch.testing.assert_close(module.attend(q, k, v, None), softmax_attention(q, k, v))


def test_linformer_with_shared_projections_uses_one_matrix():
    module = LinformerAttention(DIM, HEADS, num_features=12, max_seq_len=12, share_kv=True)
    assert module.F is None
    assert sorted(n for n, _ in module.named_parameters()) == [
        "E",
        "proj.bias",
        "proj.weight",
        "qkv.bias",
        "qkv.weight",
    ]
    with torch.no_grad():
        module.E.copy_(torch.eye(12))
    q, k, v = heads(12)
    torch.testing.assert_close(module.attend(q, k, v, None), softmax_attention(q, k, v))


def test_linformer_refuses_sequences_longer_than_max_seq_len():
    module = rf_attention.create("linformer", DIM, HEADS, num_features=4, max_seq_len=16)
    module(torch.randn(1, 16, DIM))
    with pytest.raises(ValueError, match="sequence length 17 exceeds max_seq_len=16"):
        module(torch.randn(1, 17, DIM))


# ----------------------------------------------------------------------------------------------------
# BigBird


def test_bigbird_with_a_window_covering_the_sequence_equals_softmax():
    module = BigBirdAttention(DIM, HEADS, block_size=4, window_blocks=15, random_blocks=3, seed=0)
    q, k, v = heads(30)  # 8 blocks, the last one half padding
    mask = padding(30, padded={0: [3], 1: list(range(20, 30))})
    torch.testing.assert_close(
        module.attend(q, k, v, mask), softmax_attention(q, k, v, key_padding_mask=mask)
    )


def test_bigbird_with_every_block_drawn_at_random_equals_softmax():
    module = BigBirdAttention(DIM, HEADS, block_size=4, window_blocks=1, global_blocks=0, random_blocks=8)
    q, k, v = heads(32)
    torch.testing.assert_close(module.attend(q, k, v, None), softmax_attention(q, k, v))


def test_bigbird_attends_to_window_global_and_distinct_random_blocks():
    module = BigBirdAttention(DIM, HEADS, block_size=4, window_blocks=3, global_blocks=2, random_blocks=2)
    index, ok = module.key_blocks(10, torch.device("cpu"), torch.Generator().manual_seed(0))
    assert index.shape == ok.shape == (HEADS, 10, 7)
    for h in range(HEADS):
        for i in range(10):
            blocks = index[h, i][ok[h, i]].tolist()
            assert len(blocks) == len(set(blocks))
            assert {max(i - 1, 0), i, min(i + 1, 9), 0, 9} <= set(blocks)
            assert len(blocks) == len({max(i - 1, 0), i, min(i + 1, 9), 0, 9}) + 2


def test_bigbird_global_queries_attend_to_every_key():
    module = BigBirdAttention(DIM, HEADS, block_size=4, random_blocks=0, seed=0)
    q, k, v = heads(32)
    exact = softmax_attention(q, k, v)
    out = module.attend(q, k, v, None)
    torch.testing.assert_close(out[:, :, :4], exact[:, :, :4])
    torch.testing.assert_close(out[:, :, -4:], exact[:, :, -4:])
    assert (out[:, :, 8:24] - exact[:, :, 8:24]).abs().max() > 1e-3


def test_bigbird_block_size_is_half_the_feature_budget():
    assert rf_attention.create("bigbird", DIM, HEADS, num_features=128).block_size == 64


# ----------------------------------------------------------------------------------------------------
# Reformer


def shared_qk_softmax_without_self(q: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Exact shared-QK attention: logits ``q_i . q_j / ||q_j||`` (HF ``LSHSelfAttention``: keys of unit
    length, no further scaling), no attention to self unless no other key is real."""
    n = q.shape[-2]
    scores = q @ F.normalize(q, dim=-1).mT
    real = ~mask[:, None, None, :]
    eye = torch.eye(n, dtype=torch.bool)
    others = real & ~eye
    allowed = torch.where(others.any(-1, keepdim=True), others, real & eye)
    return dense_reference(scores, allowed, v)


def test_reformer_with_a_single_bucket_equals_shared_qk_softmax_without_self():
    module = ReformerAttention(DIM, HEADS, chunk_length=16, n_buckets=1, n_hashes=3)
    q, _, v = heads(12)
    mask = padding(12, padded={0: [4], 1: list(range(1, 12))})  # batch 1: one real token, alone
    expected = shared_qk_softmax_without_self(q, v, mask)
    out = module.attend(q, None, v, mask)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(out[1, :, 0], v[1, :, 0])  # alone: attends to itself


def lsh_reference(q: torch.Tensor, v: torch.Tensor, buckets: torch.Tensor, size: int) -> torch.Tensor:
    """Plain float64 LSH attention of given buckets ``(B, H, R, N)``, one query at a time.

    Round ``r`` sorts the positions by (bucket, position); the rounds' sorted lists are concatenated and cut
    into chunks of ``size``; a query attends to the keys of its chunk and of the chunk before it (cyclically
    over all rounds' chunks), with logits ``q_i . q_j / ||q_j||`` and ``-1e5`` at its own position; rounds
    are combined with weights ``softmax_r(lse_r)``. Kitaev et al. 2020, Section 2; HF ``LSHSelfAttention``.
    """
    b, h, rounds, n = buckets.shape
    keys = F.normalize(q, dim=-1)
    out = torch.zeros_like(v)
    for bi in range(b):
        for hi in range(h):
            order = [
                (r, i)
                for r in range(rounds)
                for i in sorted(range(n), key=lambda i: (buckets[bi, hi, r, i], i))
            ]
            chunks = len(order) // size
            per_round = torch.zeros(n, rounds, v.shape[-1], dtype=v.dtype)
            lse = torch.zeros(n, rounds, dtype=v.dtype)
            for slot, (r, i) in enumerate(order):
                chunk = slot // size
                context = [order[chunk * size + t][1] for t in range(size)]
                if chunks > 1:
                    context += [order[((chunk - 1) % chunks) * size + t][1] for t in range(size)]
                logits = torch.stack(
                    [q[bi, hi, i] @ keys[bi, hi, j] if j != i else q.new_tensor(-1e5) for j in context]
                )
                per_round[i, r] = torch.softmax(logits, 0) @ v[bi, hi, context]
                lse[i, r] = torch.logsumexp(logits, 0)
            out[bi, hi] = (torch.softmax(lse, dim=-1)[..., None] * per_round).sum(1)
    return out


@pytest.mark.parametrize("rounds", [1, 3])
def test_reformer_chunked_attention_equals_the_plain_lsh_reference(rounds):
    module = ReformerAttention(DIM, HEADS, chunk_length=4, n_hashes=rounds)
    q, _, v = heads(12, seed=3, scale=2.0)
    buckets = torch.randint(0, 4, (2, HEADS, rounds, 12), generator=torch.Generator().manual_seed(0))
    valid = torch.ones(2, 12, dtype=torch.bool)
    out = module.sorted_chunk_attention(q, v, buckets, valid, 4)
    torch.testing.assert_close(out, lsh_reference(q, v, buckets, 4), rtol=1e-12, atol=1e-12)


def test_reformer_hashes_each_head_with_its_own_rotations():
    module = ReformerAttention(DIM, HEADS, n_hashes=2)
    q = torch.randn(1, 1, 40, HEAD_DIM, dtype=torch.float64).expand(1, HEADS, 40, HEAD_DIM)
    buckets = module.buckets(q, 8, torch.Generator().manual_seed(0))
    assert buckets.shape == (1, HEADS, 2, 40)
    assert not torch.equal(buckets[:, 0], buckets[:, 1])


def test_reformer_bucket_count_follows_hf():
    module = ReformerAttention(DIM, HEADS, chunk_length=64)
    # 2 N / c rounded down to a power of two, N = chunks * c: 4096 / 64 = 64 chunks -> 128 buckets.
    assert [module.bucket_count(c) for c in (1, 2, 3, 16, 63, 64)] == [2, 4, 4, 32, 64, 128]


def test_reformer_shares_one_projection_for_queries_and_keys():
    module = rf_attention.create("reformer", DIM, HEADS)
    assert module.qkv.linear.weight.shape == (2 * DIM, DIM)
    q, k, _ = module.qkv(torch.randn(2, 5, DIM)).chunk(3, dim=-1)
    torch.testing.assert_close(q, k)


def test_reformer_attends_within_own_and_previous_chunk_only():
    """With 2 buckets of all-equal queries sorted by position, chunk c sees chunks c and c - 1."""
    module = ReformerAttention(DIM, HEADS, chunk_length=4, n_buckets=1, n_hashes=1)
    q = torch.ones(1, HEADS, 12, HEAD_DIM, dtype=torch.float64)
    v = torch.arange(12, dtype=torch.float64).view(1, 1, 12, 1).expand(1, HEADS, 12, HEAD_DIM)
    out = module.attend(q, None, v, None)[0, 0, :, 0]
    # Chunk 0 (0..3) sees chunk 2 (8..11) cyclically; equal scores give the mean of the other keys.
    expected = [(sum(range(4)) + sum(range(8, 12)) - i) / 7 for i in range(4)]
    expected += [(sum(range(8)) - i) / 7 for i in range(4, 8)]
    expected += [(sum(range(4, 12)) - i) / 7 for i in range(8, 12)]
    torch.testing.assert_close(out, torch.tensor(expected, dtype=torch.float64))


# ----------------------------------------------------------------------------------------------------
# Informer


def test_informer_with_u_equal_to_n_equals_softmax():
    module = InformerAttention(DIM, HEADS, num_active_queries=12, seed=0)
    q, k, v = heads(12)
    mask = padding(12, padded={0: [4], 1: list(range(7, 12))})
    torch.testing.assert_close(
        module.attend(q, k, v, mask), softmax_attention(q, k, v, key_padding_mask=mask)
    )


def test_informer_budget_is_the_paper_codes_factor_times_ceil_log_n():
    # factor = ceil(s / ln(max_seq_len)), u = U = factor * ceil(ln N), capped at N.
    module = InformerAttention(DIM, HEADS, num_features=128, max_seq_len=4096)
    assert module.factor == 16
    assert [module.active_queries(n) for n in (4096, 4000, 1024, 100, 20, 2, 1)] == [
        144,
        144,
        112,
        80,
        20,
        2,
        1,
    ]
    assert [module.sampled_keys(n) for n in (4096, 1024, 20)] == [144, 112, 20]
    assert InformerAttention(DIM, HEADS, num_features=128, max_seq_len=1024).active_queries(1024) == 133
    fixed = InformerAttention(DIM, HEADS, num_active_queries=5, num_sampled_keys=7)
    assert (fixed.active_queries(4096), fixed.sampled_keys(4096), fixed.active_queries(3)) == (5, 7, 3)


def test_informer_attends_fully_with_factor_times_ceil_log_n_queries():
    module = InformerAttention(
        DIM, HEADS, num_features=6, max_seq_len=12, seed=0
    )  # factor 3, u = 9 at N = 12
    q, k, v = heads(12)
    out = module.attend(q, k, v, None)
    exact = softmax_attention(q, k, v)
    active = (out - exact).abs().amax(-1) < 1e-12
    assert (active.sum(-1) == 9).all()


def test_informer_lazy_queries_output_the_mean_of_the_real_values():
    module = InformerAttention(DIM, HEADS, num_active_queries=2, num_sampled_keys=5, seed=0)
    q, k, v = heads(12)
    mask = padding(12, padded={1: list(range(7, 12))})
    out = module.attend(q, k, v, mask)
    exact = softmax_attention(q, k, v, key_padding_mask=mask)
    for b, count in ((0, 12), (1, 7)):
        mean = v[b, :, :count].mean(dim=-2, keepdim=True)
        active = (out[b] - exact[b]).abs().amax(-1) < 1e-12
        lazy = (out[b] - mean).abs().amax(-1) < 1e-12
        assert (active.sum(-1) == 2).all()
        assert (active | lazy).all()
        assert not active[:, count:].any()  # padded queries never take an active slot


def test_informer_measurement_is_max_minus_mean_of_sampled_scores():
    module = InformerAttention(DIM, HEADS, num_sampled_keys=12, seed=0)  # U = N = 12: 12 draws per query
    q, k, _ = heads(12)
    valid = torch.ones(2, 12, dtype=torch.bool)
    measured = module.sparsity_measurement(q, k, valid, torch.Generator().manual_seed(0))
    scores = q @ k.mT
    # The draws are with replacement: the measurement lies between bounds set by all scores.
    assert (measured <= scores.amax(-1) - scores.amin(-1) + 1e-12).all()
    assert (measured >= 0).all()
