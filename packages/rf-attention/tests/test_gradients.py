"""The chunked, recomputing attention kernels against ``rf_attention.naive``: outputs and gradients.

Also the causal scan against its dense form, many chunks and groups, state continuation, large logits and
bfloat16.

Grid: (B, H, N, Dh, m), dtype, causal, key padding, chunk size (N never a multiple of it), and the
components with their matrices, including the learnable FastFood_L whose parameters must receive the
reference's gradients. The reference runs in float64 on the same feature map (same draws, same
statistics), so every difference is the fast path's rounding.
"""

import copy

import pytest
import torch

import rf_attention.ops.common as kernels
import rf_features
from rf_attention import linear_attention, softmax_attention
from rf_attention import rf_attention as rf_attend
from rf_attention.naive import naive_linear_attention, naive_rf_attention, naive_softmax_attention
from rf_attention.ops.causal import CausalState, causal_attention, causal_block, chunk_prefix
from spectraformer_core.testing import assert_rel_close, relative_error

SHAPES = [(1, 1, 9, 4, 3), (2, 3, 13, 8, 6)]  # (B, H, N, Dh, s)
NAMES = ["posrf-orf", "trigrf-sorf", "oprf-fastfoodl", "saderf-qmc", "posrf-hyp-base", "gerf-orf"]
TOLERANCE = {torch.float64: 1e-10, torch.float32: 2e-4}


def make_feature_map(name: str, dim: int, s: int, causal: bool, dtype: torch.dtype):
    component, matrix = name.rsplit("-", 1)
    fm = rf_features.create(
        component,
        weight_matrix=matrix,
        num_features=s,
        dim=dim,
        seed=0,
        matrix_options={"dtype": dtype} if matrix != "fastfoodl" else {},
        statistics_mode="running" if causal else "batch",
    ).to(dtype)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in fm.parameters():  # move learnable matrices off their initialization
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
        if hasattr(fm, "running_a"):
            fm.running_a.fill_(-0.05)
        if hasattr(fm, "running_psi"):
            fm.running_psi.copy_(torch.rand(dim, generator=g, dtype=dtype) + 0.5)
    return fm.eval()


def inputs(b, h, n, d, dtype, masked, causal):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, generator=g, dtype=torch.float64) * 1.5 for _ in range(3))
    mask = None
    if masked:
        mask = torch.zeros(b, n, dtype=torch.bool)
        mask[0, n - 3 :] = True
        if b > 1:
            mask[1, :2] = True  # leading padding: causal rows 0, 1 see no key
    weights = torch.randn(b, h, n, d, generator=g, dtype=torch.float64)
    return [t.to(dtype).requires_grad_() for t in (q, k, v)], mask, weights.to(dtype)


def grads(out, weights, tensors):
    return torch.autograd.grad((out * weights).sum(), tensors, allow_unused=True)


def assert_equals_naive(fm, reference_map, qkv, mask, weights, *, causal, chunk_size, tolerance):
    """``rf_attention`` through ``fm`` against ``naive_rf_attention`` through ``reference_map`` (float64).

    The output (in the inputs' dtype) and the gradients of ``sum(out * weights)`` in q, k, v and the map's
    parameters, each within relative error ``tolerance``; q, k, v ``(B, H, N, Dh)``, ``mask`` ``(B, N)`` pads
    keys and queries.
    """
    q, k, v = qkv
    out = rf_attend(
        q, k, v, fm, causal=causal, key_padding_mask=mask, query_padding_mask=mask, chunk_size=chunk_size
    )
    got = grads(out, weights, [q, k, v, *fm.parameters()])
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in qkv)
    expected_out = naive_rf_attention(
        q64, k64, v64, reference_map, causal=causal, key_padding_mask=mask, query_padding_mask=mask
    )
    expected = grads(expected_out, weights.double(), [q64, k64, v64, *reference_map.parameters()])
    assert out.dtype == q.dtype
    assert_rel_close("output", expected_out, out, tolerance)
    labels = ["dq", "dk", "dv", *(f"d{p}" for p, _ in fm.named_parameters())]
    for label, g, e in zip(labels, got, expected, strict=True):
        assert (g is None) == (e is None), label
        if e is not None:
            assert_rel_close(label, e, g, tolerance)


def without_closed_form(fm):
    """``fm`` as a feature map with no closed form: the kernels run their generic (autograd) path."""
    contract = fm.contract
    fm.contract = lambda *args, **kwargs: contract(*args, **{**kwargs, "closed_form": False})
    return fm


@pytest.mark.parametrize("strategy", ["closed", "generic"])
@pytest.mark.parametrize("chunk_size", [4, None], ids=["chunk4", "chunkdefault"])
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "padded"])
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}H{}N{}D{}s{}".format(*s))
@pytest.mark.parametrize("name", NAMES)
def test_outputs_and_gradients_equal_the_naive_reference(
    name, shape, dtype, causal, masked, chunk_size, strategy
):
    b, h, n, d, s = shape
    fm = make_feature_map(name, d, s, causal, dtype)
    reference_map = copy.deepcopy(fm).double()
    if strategy == "generic":
        fm = without_closed_form(fm)
    tolerance = TOLERANCE[dtype]
    if name.startswith("trigrf") and dtype == torch.float32:
        # signed features: D cancels, float32 rounding grows by |phi_q| . sum |phi_k| / |D| (about 10 here)
        tolerance *= 10
    qkv, mask, weights = inputs(b, h, n, d, dtype, masked, causal)
    assert_equals_naive(
        fm, reference_map, qkv, mask, weights, causal=causal, chunk_size=chunk_size, tolerance=tolerance
    )


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("chunk_size", [1, 5, None], ids=["chunk1", "chunk5", "chunkdefault"])
def test_linear_attention_gradients_equal_the_naive_quadratic_form(causal, chunk_size):
    g = torch.Generator().manual_seed(0)
    phi_q, phi_k = (torch.rand(2, 2, 11, 6, generator=g, dtype=torch.float64) + 0.1 for _ in range(2))
    phi_q[..., 0] = -phi_q[..., 0]  # signed features
    v = torch.randn(2, 2, 11, 3, generator=g, dtype=torch.float64)
    mask = torch.zeros(2, 11, dtype=torch.bool)
    mask[1, 7:] = True
    tensors = [t.requires_grad_() for t in (phi_q, phi_k, v)]
    weights = torch.randn(2, 2, 11, 3, generator=g, dtype=torch.float64)
    out = linear_attention(*tensors, causal=causal, key_padding_mask=mask, chunk_size=chunk_size)
    expected = naive_linear_attention(*tensors, causal=causal, key_padding_mask=mask)
    assert relative_error(out, expected) < 1e-12
    for got, want in zip(grads(out, weights, tensors), grads(expected, weights, tensors), strict=True):
        assert relative_error(got, want) < 1e-10


@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "padded"])
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
def test_softmax_attention_and_its_gradients_equal_the_naive_softmax(causal, masked):
    (q, k, v), mask, weights = inputs(2, 2, 10, 8, torch.float64, masked, causal)
    out = softmax_attention(q, k, v, causal=causal, key_padding_mask=mask)
    expected = naive_softmax_attention(q, k, v, causal=causal, key_padding_mask=mask)
    assert relative_error(out, expected) < 1e-12
    for got, want in zip(grads(out, weights, [q, k, v]), grads(expected, weights, [q, k, v]), strict=True):
        assert relative_error(got, want) < 1e-10


@pytest.mark.parametrize("name", ["oprf", "saderf"])
def test_data_dependent_statistics_are_detached_so_gradients_hold_them_fixed(name):
    """OPRF's ``A`` and SADERF's ``Psi`` are computed from the batch without gradient, on purpose.

    For every fixed ``(A, Psi)`` the features are an unbiased estimator of the softmax kernel, so the
    gradient of the estimate with those parameters held fixed is an unbiased estimate of the kernel's
    gradient; differentiating through the statistics would add a term that only changes the variance
    choice, not the target. This test states the choice: our gradients equal the reference's with the
    statistics fixed, and differ from the gradient that flows through them.
    """
    d, s = 8, 16
    fm = rf_features.create(
        name, weight_matrix="orf", num_features=s, dim=d, seed=0, matrix_options={"dtype": torch.float64}
    )
    (q, k, v), _, weights = inputs(1, 2, 12, d, torch.float64, False, False)
    ours = grads(rf_attend(q, k, v, fm), weights, [q, k])
    fixed = grads(naive_rf_attention(q, k, v, fm), weights, [q, k])
    scale = d**-0.25
    stats = fm.statistics(q * scale, k * scale, None, None)  # with gradient this time
    phi = [
        torch.exp(fm._weighted_log_features(x * scale, stats, is_query, None)[0])
        for x, is_query in ((q, True), (k, False))
    ]
    through = grads(naive_linear_attention(*phi, v), weights, [q, k])
    for got, want, other in zip(ours, fixed, through, strict=True):
        assert relative_error(got, want) < 1e-10
        assert relative_error(got, other) > 1e-3


def test_a_learned_matrix_is_built_once_per_call(monkeypatch):
    # FastFood_L's W carries a gradient; it used to be rebuilt for every chunk, forward and backward
    fm = rf_features.create("posrf", dim=8, num_features=16, weight_matrix="fastfoodl", seed=0)
    builds = []
    original = type(fm.weight_matrix).matrix
    monkeypatch.setattr(type(fm.weight_matrix), "matrix", lambda self: builds.append(1) or original(self))
    q, k, v = (torch.randn(1, 1, 300, 8, requires_grad=True) for _ in range(3))
    rf_attend(q, k, v, fm, chunk_size=64).sum().backward()
    assert len(builds) == 1
    assert all(p.grad is not None for p in fm.weight_matrix.parameters())


# The grid's sizes fit in one group; here the group rules are shrunk so that every call runs in several
# groups (and, causal, several chunks per group): key groups combined, states passed between causal groups.


@pytest.fixture
def small_groups(monkeypatch):
    monkeypatch.setattr(kernels, "GROUP_FEATURES_PER_QUERY_ELEMENT", 0.1)
    monkeypatch.setattr(kernels, "CAUSAL_GROUP_FEATURES_PER_QUERY_ELEMENT", 0.1)
    monkeypatch.setattr(kernels, "MIN_GROUP_FEATURE_ELEMENTS", 1)


@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "padded"])
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize(
    "name", ["posrf-orf", "trigrf-sorf", "oprf-fastfoodl", "saderf-qmc", "posrf-hyp-base"]
)
def test_many_groups_equal_the_naive_reference(small_groups, name, causal, masked):
    b, h, n, d, s = 2, 2, 37, 8, 6
    fm = make_feature_map(name, d, s, causal, torch.float64)
    width = fm.feature_width
    if causal:
        rows = kernels.causal_group_rows(n, d, width, 4, b * h)
    else:
        rows = kernels.group_rows(n, d, width, batch=b * h)
    assert -(-n // rows) >= 3, "several groups"
    qkv, mask, weights = inputs(b, h, n, d, torch.float64, masked, causal)
    assert_equals_naive(
        fm, copy.deepcopy(fm), qkv, mask, weights, causal=causal, chunk_size=4, tolerance=1e-10
    )


def dense_prefix(x, log_ref):
    """``y_r = sum_{u <= r} exp(e_u - e_r) x_u`` by an explicit lower-triangular matrix."""
    e = log_ref.squeeze(-1)
    factors = torch.exp(e.unsqueeze(-2) - e.unsqueeze(-1)).tril()  # (g, r, u)
    return factors @ x


@pytest.mark.parametrize("length", [1, 2, 7, 8, 33])
def test_chunk_prefix_equals_the_dense_decayed_prefix_sum(length):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, length, 5, generator=g, dtype=torch.float64)
    log_ref = torch.cummax(torch.randn(3, length, generator=g, dtype=torch.float64) * 20, dim=-1).values
    log_ref = log_ref.unsqueeze(-1)
    torch.testing.assert_close(chunk_prefix(x, log_ref), dense_prefix(x, log_ref), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("length", [1, 6, 17])
def test_reverse_chunk_prefix_is_the_transpose(length):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, length, 4, generator=g, dtype=torch.float64)
    log_ref = torch.cummax(torch.randn(2, length, generator=g, dtype=torch.float64) * 5, dim=-1).values
    log_ref = log_ref.unsqueeze(-1)
    e = log_ref.squeeze(-1)
    transpose = torch.exp(e.unsqueeze(-2) - e.unsqueeze(-1)).tril().mT
    expected = transpose @ x
    torch.testing.assert_close(chunk_prefix(x, log_ref, reverse=True), expected, rtol=1e-12, atol=1e-12)


@pytest.fixture
def small_causal_groups(monkeypatch):
    monkeypatch.setattr(kernels, "CAUSAL_GROUP_FEATURES_PER_QUERY_ELEMENT", 0.05)
    monkeypatch.setattr(kernels, "MIN_GROUP_FEATURE_ELEMENTS", 1)


@pytest.mark.parametrize(
    "name", ["posrf-orf", "trigrf-sorf", "oprf-fastfoodl", "saderf-qmc", "posrf-hyp-base"]
)
def test_causal_many_chunks_and_groups_equal_the_naive_quadratic_form(small_causal_groups, name):
    b, h, n, d, s, chunk = 2, 2, 301, 8, 6, 8
    rows = kernels.causal_group_rows(
        n, d, make_feature_map(name, d, s, True, torch.float64).feature_width, chunk, 4
    )
    assert n // chunk >= 30, "many chunks"
    assert -(-n // rows) >= 4, "several groups"
    fm = make_feature_map(name, d, s, True, torch.float64)
    qkv, mask, weights = inputs(b, h, n, d, torch.float64, True, True)
    assert_equals_naive(
        fm, copy.deepcopy(fm), qkv, mask, weights, causal=True, chunk_size=chunk, tolerance=1e-10
    )


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("name", ["posrf-orf", "trigrf-sorf", "posrf-hyp-base", "gerf-orf"])
def test_large_logits_equal_the_naive_reference_in_float64(name, causal):
    b, h, n, d, s = 1, 2, 70, 8, 6
    fm = make_feature_map(name, d, s, causal, torch.float64)
    g = torch.Generator().manual_seed(3)
    direction = torch.randn(d, generator=g, dtype=torch.float64)
    direction = direction / direction.norm()
    # q . k / sqrt(d) between about 30 and 60: exp overflows float32, not float64
    base = direction * (30 * d**0.5) ** 0.5
    q, k = (base * (1 + torch.rand(b, h, n, 1, generator=g, dtype=torch.float64)) ** 0.5 for _ in range(2))
    v = torch.randn(b, h, n, d, generator=g, dtype=torch.float64)
    logits = (q @ k.mT) / d**0.5
    assert float(logits.min()) >= 30
    assert float(logits.max()) <= 60
    out = rf_attend(q, k, v, fm, causal=causal, chunk_size=16)
    expected = naive_rf_attention(q, k, v, copy.deepcopy(fm), causal=causal)
    assert torch.isfinite(out).all()
    assert relative_error(out, expected) < 1e-8


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("name", ["posrf-orf", "trigrf-sorf", "oprf-fastfoodl"])
def test_bfloat16_inputs_are_accumulated_close_to_the_float64_reference(name, causal):
    b, h, n, d, s = 2, 2, 150, 8, 16
    fm = make_feature_map(name, d, s, causal, torch.float32)
    (q, k, v), mask, weights = inputs(b, h, n, d, torch.float64, True, causal)
    low = [t.detach().to(torch.bfloat16).requires_grad_() for t in (q, k, v)]
    out = rf_attend(*low, fm, causal=causal, key_padding_mask=mask, query_padding_mask=mask, chunk_size=16)
    exact = [t.detach().to(torch.bfloat16).double().requires_grad_() for t in (q, k, v)]
    expected = naive_rf_attention(*exact, copy.deepcopy(fm).double(), causal=causal, key_padding_mask=mask)
    assert out.dtype == torch.bfloat16
    assert relative_error(out, expected) < 2e-2
    got = grads(out.float(), weights.float(), low)
    wanted = grads(expected, weights, exact)
    for g, e in zip(got, wanted, strict=True):
        assert relative_error(g, e) < 5e-2


@pytest.mark.parametrize("signed", [False, True], ids=["positive", "signed"])
def test_causal_attention_continued_from_a_state_equals_one_pass(signed):
    g = torch.Generator().manual_seed(4)
    n, m, split = 40, 6, 23
    phi_q, phi_k = (torch.rand(2, 3, n, m, generator=g, dtype=torch.float64) + 0.1 for _ in range(2))
    if signed:
        phi_q = phi_q - 0.3
    v = torch.randn(2, 3, n, 5, generator=g, dtype=torch.float64)
    log_scale = torch.randn(2, 3, n, generator=g, dtype=torch.float64) * 10

    def features(x, is_query):
        return (x.new_zeros(*x.shape[:-1], 1), x) if is_query else (x[..., -1:], x[..., :-1])

    keys = torch.cat((phi_k, log_scale.unsqueeze(-1)), dim=-1)
    run = {"width": m, "chunk": 4, "eps": 1e-12}
    whole, final = causal_attention(phi_q, keys, v, None, features, **run)
    first, state = causal_attention(
        phi_q[..., :split, :], keys[..., :split, :], v[..., :split, :], None, features, **run
    )
    second, after = causal_attention(
        phi_q[..., split:, :], keys[..., split:, :], v[..., split:, :], None, features, state=state, **run
    )
    torch.testing.assert_close(torch.cat((first, second), dim=-2), whole, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(after.sums, final.sums, rtol=1e-10, atol=1e-12)
    assert isinstance(after, CausalState)
    expected = naive_linear_attention(phi_q, phi_k * log_scale.exp().unsqueeze(-1), v, causal=True)
    torch.testing.assert_close(whole, expected, rtol=1e-10, atol=1e-12)


def underflowing_block(dtype):
    """Features of two sequences (3 positions, 2 features) for ``causal_block``; in the second, query 0's
    normalizer is ``1e-39`` (subnormal in float32): its only key lies where its features have underflowed."""
    phi_q = torch.tensor([[[1.0, 0.5], [0.25, 1.0], [1.0, 1.0]], [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]])
    phi_k = torch.tensor([[[1.0, 0.5], [0.5, 1.0], [1.0, 0.25]], [[1e-39, 1.0], [1.0, 1.0], [1.0, 0.0]]])
    g = torch.Generator().manual_seed(0)
    v, weights = torch.randn(2, 3, 4, generator=g), torch.randn(2, 3, 4, generator=g)
    leaves = [t.to(dtype).requires_grad_() for t in (phi_q, phi_k, v)]
    return leaves, weights.to(dtype)


def test_an_underflowed_normalizer_is_guarded_and_every_gradient_finite():
    """The generic causal block's ``y / D`` where ``D`` underflows: finite gradients, row 0 guarded.

    Elsewhere outputs and gradients equal the float64 formula's; the second sequence's gradients are
    compared on its later rows only (row 0's weight is 0), whose normalizers are normal.
    """
    (phi_q, phi_k, v), weights = underflowing_block(torch.float32)
    (phi_q64, phi_k64, v64), weights64 = underflowing_block(torch.float64)
    eps = torch.finfo(torch.float32).eps
    scale = torch.zeros(2, 3)

    def block(q, k, values):
        return causal_block(
            q, k, scale.to(q.dtype), values, None, None, None, chunk=2, eps=eps, signed=False
        )[0]

    out = block(phi_q, phi_k, v)
    expected = block(phi_q64, phi_k64, v64)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[0], expected[0].float())
    torch.testing.assert_close(out[1, 1:], expected[1, 1:].float())
    assert out[1, 0].abs().max() < 1e-37  # guarded: no key's weight is representable
    got = grads(out, weights, [phi_q, phi_k, v])
    assert all(torch.isfinite(g).all() for g in got)
    weights[1, 0] = 0.0
    weights64[1, 0] = 0.0
    got = grads(block(phi_q, phi_k, v), weights, [phi_q, phi_k, v])
    want = grads(expected, weights64, [phi_q64, phi_k64, v64])
    for label, g, e in zip(["dphi_q", "dphi_k", "dv"], got, want, strict=True):
        assert_rel_close(label, e, g, 1e-5)
