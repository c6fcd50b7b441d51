"""The chunked, recomputing attention kernels against ``rf_attention.naive``: outputs and gradients.

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

SHAPES = [(1, 1, 9, 4, 3), (2, 3, 13, 8, 6)]  # (B, H, N, Dh, s)
NAMES = ["posrf-orf", "trigrf-sorf", "oprf-fastfoodl", "saderf-qmc", "posrf-hyp-base", "gerf-orf"]
TOLERANCE = {torch.float64: 1e-10, torch.float32: 2e-4}


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``||actual - expected|| / ||expected||`` in float64 (0 when both are 0)."""
    actual, expected = actual.detach().double(), expected.detach().double()
    scale = expected.norm()
    return float((actual - expected).norm() / scale) if scale > 0 else float(actual.norm())


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


@pytest.mark.parametrize("chunk_size", [4, None], ids=["chunk4", "chunkdefault"])
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "padded"])
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}H{}N{}D{}s{}".format(*s))
@pytest.mark.parametrize("name", NAMES)
def test_outputs_and_gradients_equal_the_naive_reference(name, shape, dtype, causal, masked, chunk_size):
    b, h, n, d, s = shape
    fm = make_feature_map(name, d, s, causal, dtype)
    reference_map = copy.deepcopy(fm).double()
    (q, k, v), mask, weights = inputs(b, h, n, d, dtype, masked, causal)
    out = rf_attend(
        q, k, v, fm, causal=causal, key_padding_mask=mask, query_padding_mask=mask, chunk_size=chunk_size
    )
    params = list(fm.parameters())
    got = grads(out, weights, [q, k, v, *params])
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    expected_out = naive_rf_attention(
        q64, k64, v64, reference_map, causal=causal, key_padding_mask=mask, query_padding_mask=mask
    )
    expected = grads(expected_out, weights.double(), [q64, k64, v64, *reference_map.parameters()])
    tolerance = TOLERANCE[dtype]
    if name.startswith("trigrf") and dtype == torch.float32:
        # signed features: D cancels, float32 rounding grows by |phi_q| . sum |phi_k| / |D| (about 10 here)
        tolerance *= 10
    assert out.dtype == dtype
    assert relative_error(out, expected_out) < tolerance
    labels = ["dq", "dk", "dv", *(f"d{p}" for p, _ in fm.named_parameters())]
    for label, g, e in zip(labels, got, expected, strict=True):
        assert (g is None) == (e is None), label
        if e is not None:
            assert relative_error(g, e) < tolerance, (label, relative_error(g, e))


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
        torch.exp(fm.weighted_log_features(x * scale, stats, is_query=is_query)[0])
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
    width = fm.num_features
    per_element = kernels.CAUSAL_GROUP_FEATURES_PER_QUERY_ELEMENT if causal else None
    rows = kernels.group_rows(n, d, width, 4 if causal else 1, per_element, batch=b * h)
    assert -(-n // rows) >= 3, "several groups"
    reference_map = copy.deepcopy(fm)
    (q, k, v), mask, weights = inputs(b, h, n, d, torch.float64, masked, causal)
    out = rf_attend(q, k, v, fm, causal=causal, key_padding_mask=mask, query_padding_mask=mask, chunk_size=4)
    got = grads(out, weights, [q, k, v, *fm.parameters()])
    q64, k64, v64 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    expected_out = naive_rf_attention(
        q64, k64, v64, reference_map, causal=causal, key_padding_mask=mask, query_padding_mask=mask
    )
    expected = grads(expected_out, weights, [q64, k64, v64, *reference_map.parameters()])
    assert relative_error(out, expected_out) < 1e-10
    for g, e in zip(got, expected, strict=True):
        assert relative_error(g, e) < 1e-10
