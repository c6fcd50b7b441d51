"""RaLiMP and the baselines: approximation, gradients, caching, compression, errors."""

import pytest
import torch
import torch.nn.functional as F

import ralimp
import rf_matrices
from ralimp import SNNK, EUGen, LowRank, RaLiMP
from ralimp.features import complex_exponential_features
from ralimp.fits import Sizes
from spectraformer_core.testing import relative_error


def test_ralimp_at_a_large_budget_approximates_gelu_and_the_error_falls_with_the_budget(small_layer_data):
    linear, x = small_layer_data
    target = F.gelu(linear(x)).detach()
    errors = []
    for m in (16, 256, 4096):
        runs = []
        for seed in range(3):
            layer = RaLiMP.from_linear(
                linear, "gelu", poly_features=m, freq_features=m, seed=seed, sample=x, tau=1.0
            )
            with torch.no_grad():
                runs.append(relative_error(layer(x), target) ** 2)
        errors.append(sum(runs) / len(runs))
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] < 0.1


@pytest.mark.parametrize(
    ("name", "atoms", "freqs"), [("gelu", 1, 3), ("gelu_tanh", 2, 2), ("tanh", 2, 3), ("softsign", 3, 3)]
)
def test_expected_output_of_a_fresh_layer_is_its_fit_on_the_whole_interval(name, atoms, freqs):
    # a node-by-node discretization of the continuous fit misses gelu by 0.32 on [-4, 4] at 3 nodes (fit
    # error 2.4e-3), tanh J=2 by 0.23, softsign J=3 by 0.42; the least-squares fit in the layer's basis
    # does not
    layer = RaLiMP.from_linear(
        torch.nn.Linear(4, 3, dtype=torch.float64),
        name,
        num_atoms=atoms,
        num_freqs=freqs,
        seed=0,
        fit="discretized",
        interval=(-4.0, 4.0),
    )
    t = torch.linspace(-4, 4, 4001, dtype=torch.float64)
    with torch.no_grad():
        expected = layer.expected_output(t)
    torch.testing.assert_close(expected, layer.fit(t), rtol=0, atol=1e-10)
    error = float((expected - ralimp.ACTIVATIONS.get(name)(t)).abs().max())
    assert error == pytest.approx(layer.fit.max_error, rel=1e-6)
    assert error < 0.02


def test_many_features_and_small_preactivations_reach_the_fits_accuracy():
    # d = 16, weights and inputs of norm ~0.4, biases in [-1, 0.5]; one Gauss-Laguerre node, so that the fit's
    # own error (3.5e-2 on [-4, 4]) is visible. 16 layers of 2048 projections average to one of 32768; the
    # exact variance (ralimp.analysis) bounds how far the average may stray from the fit.
    gen = torch.Generator().manual_seed(0)
    linear = torch.nn.Linear(16, 4, dtype=torch.float64)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(4, 16, generator=gen, dtype=torch.float64) * 0.1)
        linear.bias.copy_(torch.linspace(-1.0, 0.5, 4, dtype=torch.float64))
    x = torch.randn(50, 16, generator=gen, dtype=torch.float64) * 0.1
    with torch.no_grad():
        t = linear(x)
    target = F.gelu(t)
    layers = 16
    runs = []
    for seed in range(layers):
        layer = RaLiMP.from_linear(
            linear, "gelu", num_freqs=1, poly_features=2048, freq_features=2048, seed=seed
        )
        with torch.no_grad():
            runs.append(layer(x))
    fit_error = relative_error(layer.fit(t), target) ** 2
    noise = float(ralimp.analysis.ralimp_log_variance(layer, x).exp().mean() / target.pow(2).mean()) / layers
    assert noise < fit_error  # enough features for the fit's bias to show
    error = relative_error(sum(runs) / layers, target) ** 2
    cross = 4 * (fit_error * noise) ** 0.5  # |2 <bias, noise>| at 4 standard deviations
    assert fit_error - cross <= error <= fit_error + 4 * noise + cross


@pytest.mark.parametrize("tau", [1.0, 3.0])
def test_tau_dilates_a_given_atom_as_the_paper_does(tau, small_layer_data):
    # App. C.1: features at u / tau estimate cos(s t / tau^2), so the layer realizes a(t / tau^2); with
    # fit="paper" the nodes carry the Gauss-Laguerre weights, whose quadrature of the centered atom
    # 1 / (1 + v^2) is checked against the plain integral, not against the layer
    linear, _ = small_layer_data
    atom = ralimp.RationalFunction([0.0], [(1.0, 0.0, 0.0, 1.0)])
    layer = RaLiMP.from_linear(linear, atom, tau=tau, fit="paper", num_freqs=8, seed=0)
    t = torch.linspace(-6, 6, 601, dtype=torch.float64)
    v = t / tau**2
    nodes, gammas = ralimp.gauss_laguerre(8)
    quadrature = (gammas * torch.cos(nodes * v.unsqueeze(-1))).sum(-1)
    with torch.no_grad():
        torch.testing.assert_close(layer.expected_output(t), quadrature, rtol=0, atol=1e-10)
        assert float(layer.pole_widths()) == pytest.approx(1.0)  # the atom's width stays in v units
    near = v.abs() <= 1  # where 8 nodes resolve the atom (the quadrature error grows with |v|)
    assert float((quadrature - 1 / (1 + v**2))[near].abs().max()) < 0.01


def test_tau_auto_puts_the_dilated_preactivations_at_one_over_c(small_layer_data):
    linear, x = small_layer_data
    for c in (0.5, 2.0):
        layer = RaLiMP.from_linear(linear, "gelu", tau_c=c, sample=x, seed=0)
        with torch.no_grad():
            v = linear(x) / layer.tau**2
        assert float(v.pow(2).mean().sqrt()) == pytest.approx(1 / c, rel=1e-6)


def test_the_fit_covers_the_range_the_sample_has(small_layer_data):
    linear, x = small_layer_data
    for scale in (0.1, 1.0, 5.0):
        layer = RaLiMP.from_linear(linear, "gelu", sample=scale * x, seed=0, fit="discretized")
        t = linear(scale * x).detach()
        lo, hi = layer.fit.interval
        inside = ((t >= lo) & (t <= hi)).double().mean()
        assert float(inside) >= 0.99
        assert hi - lo <= float(t.max() - t.min()) + 1e-12
        # the fit is accurate where the data is, at every scale (relative to the activation's size there)
        with torch.no_grad():
            expected = layer.expected_output(t)
        error = relative_error(expected, F.gelu(t)) ** 2
        assert error < 2e-3, (scale, error)


def test_without_a_sample_standard_normal_inputs_are_assumed(small_layer_data):
    linear, _ = small_layer_data
    layer = RaLiMP.from_linear(linear, "gelu", seed=0)
    w, b = linear.weight.detach(), linear.bias.detach()
    rms = float((w.pow(2).sum(-1) + b**2).mean().sqrt())  # of t for x ~ N(0, I)
    lo, hi = layer.fit.interval
    assert layer.fit_record()["calibration"] == "standard-normal inputs"
    assert 2.0 * rms < hi - lo < 8.0 * rms


def test_gradients_reach_poles_node_coefficients_weights_and_bias(small_layer_data):
    linear, x = small_layer_data
    layer = RaLiMP.from_linear(linear, "gelu", num_atoms=2, seed=0, fit="discretized")
    layer.train()
    layer(x).pow(2).mean().backward()
    for name in (
        "atom_a",
        "atom_b",
        "atom_p",
        "atom_q_raw",
        "node_cos",
        "node_sin",
        "poly_coef",
        "weight",
        "bias",
    ):
        grad = getattr(layer, name).grad
        assert grad is not None, name
        assert torch.isfinite(grad).all(), name
        assert grad.abs().sum() > 0, name


def test_fixed_poles_are_buffers_without_gradients(small_layer_data):
    linear, _ = small_layer_data
    layer = RaLiMP.from_linear(linear, "gelu", learn_poles=False, seed=0)
    names = {n for n, _ in layer.named_parameters()}
    assert "atom_p" not in names
    assert "atom_p" in dict(layer.named_buffers())


def test_psi_is_cached_in_eval_mode_and_refreshed_when_weights_change(small_layer_data):
    linear, _x = small_layer_data
    layer = RaLiMP.from_linear(linear, "gelu", seed=0).eval()
    first = layer.psi()
    assert layer.psi() is first
    with torch.no_grad():
        layer.weight.mul_(1.1)
    assert layer.psi() is not first
    layer.train()
    assert layer.psi() is not layer.psi()


@pytest.mark.parametrize("kind", ["ralimp", "eugen", "snnk"])
def test_compress_equals_the_uncompressed_chain(kind, small_layer_data):
    linear, x = small_layer_data
    layer = ralimp.LAYERS.get(kind).from_linear(linear, "gelu", seed=0)
    following = torch.nn.Linear(6, 5, dtype=torch.float64)
    compressed = layer.compress(following)
    with torch.no_grad():
        torch.testing.assert_close(compressed(x), following(layer(x)), rtol=1e-10, atol=1e-10)
    assert compressed.weight.shape == (5, layer.feature_map(x).shape[-1])


def test_num_random_features_counts_as_the_paper():
    layer = RaLiMP(16, 8, seed=0)  # K=2, m=8; J=1, 3 nodes, 4 projections each
    assert layer.num_random_features == 8 + 2 * 1 * 3 * 4 == 32
    assert layer.feature_dim == 1 + 2 * 8 + 24 == layer.feature_map(torch.zeros(2, 16)).shape[-1]


@pytest.mark.parametrize("name", ["orf", "qmc", "sgq", "sorf"])
def test_any_registered_weight_matrix_draws_the_projections(name, small_layer_data):
    linear, x = small_layer_data
    # 10 rows: sgq's degree-3 rules need at least d (2d with antipodal pairs) rows, d = 4 + 1 here
    layer = RaLiMP.from_linear(linear, "gelu", weight_matrix=name, poly_features=10, freq_features=10, seed=0)
    assert all(type(m).__name__.lower() == name for m in layer.freq_matrices)
    with torch.no_grad():
        assert torch.isfinite(layer(x)).all()


def test_sgq_frequency_blocks_keep_both_nodes_of_each_antipodal_pair(small_layer_data):
    # z_r(x) z_r(w) is not even in omega: the folded rule (one node per pair) leaves its odd moments in
    linear, _ = small_layer_data
    layer = RaLiMP.from_linear(
        linear, "gelu", weight_matrix="sgq", poly_features=5, freq_features=10, seed=0, fit="discretized"
    )
    assert all(m.antipodal for m in layer.freq_matrices)
    assert not any(m.antipodal for m in layer.poly_matrices)  # products of (omega . u) pairs: even
    with pytest.raises(ValueError, match="antipodal=True"):  # 2 (d + 1) rows at least
        RaLiMP.from_linear(
            linear, "gelu", weight_matrix="sgq", poly_features=5, freq_features=9, seed=0, fit="discretized"
        )
    d, gen = 5, torch.Generator().manual_seed(0)
    x, w = (0.3 * F.normalize(torch.randn(d, generator=gen, dtype=torch.float64), dim=0) for _ in "xw")
    exact = torch.exp(1j * torch.dot(x, w))
    errors = {}
    for antipodal in (False, True):
        total = 0.0
        for seed in range(20):
            omega = rf_matrices.create("sgq", 10, d, seed=seed, antipodal=antipodal, dtype=torch.float64)
            (rx, ix), (rw, iw) = (
                complex_exponential_features(u, omega.matrix(), torch.ones(10)) for u in (x, w)
            )
            total += float(abs(((rx + 1j * ix) * (rw + 1j * iw)).mean() - exact))
        errors[antipodal] = total / 20
    assert errors[True] < errors[False] / 100  # measured 8.8e-5 against 5.8e-2 over 50 seeds


def test_same_seed_gives_the_same_layer(small_layer_data):
    linear, x = small_layer_data
    with torch.no_grad():
        a = RaLiMP.from_linear(linear, "silu", seed=5)(x)
        b = RaLiMP.from_linear(linear, "silu", seed=5)(x)
        c = RaLiMP.from_linear(linear, "silu", seed=6)(x)
    torch.testing.assert_close(a, b)
    assert not torch.allclose(a, c)


def test_float32_and_bfloat16_inputs_give_outputs_of_their_dtype():
    torch.manual_seed(0)
    layer = RaLiMP.from_linear(torch.nn.Linear(8, 4), "gelu", seed=0)
    for dtype in (torch.float32, torch.bfloat16):
        y = layer(torch.randn(3, 8).to(dtype))
        assert y.dtype == dtype
        assert torch.isfinite(y.float()).all()


def test_eugen_starts_unbiased_for_the_polynomial_fit(small_layer_data):
    linear, x = small_layer_data
    t = linear(x).detach()
    runs = []
    for seed in range(4):
        layer = EUGen.from_linear(linear, "gelu", num_features=4096, seed=seed)
        with torch.no_grad():
            runs.append(layer(x))
    poly = ralimp.activation_fit("gelu", poly_degree=2, num_atoms=0)
    assert relative_error(sum(runs) / 4, poly(t)) ** 2 < 0.02
    assert isinstance(layer.psi_weight, torch.nn.Parameter)


def test_eugen_with_a_sample_fits_its_polynomial_on_the_samples_range(small_layer_data):
    linear, x = small_layer_data
    t = linear(x).detach()
    layer = EUGen.from_linear(linear, "gelu", num_features=8, sample=x, seed=0)
    lo, hi = layer.fit.interval
    assert float(((t >= lo) & (t <= hi)).double().mean()) >= 0.99
    assert layer.fit_record()["fit_range"] == [round(lo, 6), round(hi, 6)]
    poly = torch.tensor(layer.fit.poly, dtype=t.dtype)
    on_range = sum(c * t**n for n, c in enumerate(poly))
    fixed = ralimp.activation_fit("gelu", poly_degree=2, num_atoms=0)  # [-4, 4], without a sample
    assert relative_error(on_range, F.gelu(t)) ** 2 < 2e-3 < relative_error(fixed(t), F.gelu(t)) ** 2
    # an interval given by the caller still wins over the sample's range
    given = EUGen.from_linear(linear, "gelu", num_features=8, sample=x, seed=0, interval=(-4.0, 4.0))
    assert given.fit.interval == (-4.0, 4.0)


def test_a_ralimp_without_atoms_is_its_polynomial_fit_in_expectation(small_layer_data):
    # num_atoms=0 (the polynomial block only) with an activation fitted on the fly, as nerf-pinn's SIREN asks
    linear, x = small_layer_data
    t = linear(x).detach()
    runs = []
    for seed in range(4):
        layer = RaLiMP.from_linear(linear, torch.sin, num_atoms=0, poly_features=4096, seed=seed, sample=x)
        assert layer.fit.atoms == []
        with torch.no_grad():
            runs.append(layer(x))
    poly = torch.tensor(layer.fit.poly, dtype=t.dtype)
    expected = sum(c * t**n for n, c in enumerate(poly))
    assert relative_error(sum(runs) / 4, expected) ** 2 < 0.02


def test_snnk_fourier_variant_is_unbiased_for_the_activations_fourier_series(small_layer_data):
    linear, x = small_layer_data
    t = linear(x).detach()
    xi, amp = SNNK.fourier_representation(F.gelu, (-4.0, 4.0), 12)
    grid = torch.linspace(-4, 4, 801, dtype=torch.float64)
    series = (amp * torch.exp(1j * grid[:, None] * xi)).real.sum(-1)
    # gelu reflected across t = 4 has a kink there (slope 1 against -1): the series converges like 1/j^2,
    # with its largest error (0.14) at the end of the interval
    assert float((series - F.gelu(grid)).pow(2).mean().sqrt()) < 0.02
    xi, amp = SNNK.fourier_representation(F.gelu, (-4.0, 4.0), 3)
    target = (amp * torch.exp(1j * t.unsqueeze(-1) * xi)).real.sum(-1)
    runs = []
    for seed in range(4):
        layer = SNNK.from_linear(linear, "gelu", num_features=8192, num_terms=3, seed=seed, sample=x)
        with torch.no_grad():
            runs.append(layer(x))
    assert relative_error(sum(runs) / 4, target) ** 2 < 0.05


def test_snnk_fourier_series_of_tanh_is_well_conditioned():
    # every random feature carries sum |F| as its weight: the series must not cancel large coefficients
    xi, amp = SNNK.fourier_representation(torch.tanh, (-4.0, 4.0), 12)
    grid = torch.linspace(-4, 4, 801, dtype=torch.float64)
    series = (amp * torch.exp(1j * grid[:, None] * xi)).real.sum(-1)
    assert float((series - torch.tanh(grid)).abs().max()) < 1e-3
    assert float(amp.abs().sum()) < 2.0


def test_snnk_estimates_the_exact_layer_at_large_m(small_layer_data):
    # the bias enters as the phase exp(i xi b), the features see x and w alone: with the 12-term series
    # (error < 1e-3) the average over draws approaches tanh(W x + b) itself
    linear, x = small_layer_data
    target = torch.tanh(linear(x)).detach()
    runs = []
    for seed in range(4):
        layer = SNNK.from_linear(linear, "tanh", num_features=8192, seed=seed, sample=x)
        assert layer.psi_weight.dtype == torch.float64
        with torch.no_grad():
            runs.append(layer(x))
    assert relative_error(sum(runs) / 4, target) ** 2 < 0.02  # 0.0069 measured; 2.3e5 with the earlier series


def test_snnk_relu_variant_has_width_m_and_a_trainable_psi(small_layer_data):
    linear, x = small_layer_data
    layer = SNNK.from_linear(linear, "relu", variant="relu", num_features=16, seed=0)
    assert layer.feature_map(x).shape == (500, 16)
    assert layer.psi_weight.requires_grad
    assert (layer(x) >= 0).all()


def test_lowrank_at_full_rank_is_exact_and_truncates_by_svd(small_layer_data):
    linear, x = small_layer_data
    full = LowRank.from_linear(linear, "gelu", rank=4)
    with torch.no_grad():
        torch.testing.assert_close(full(x), F.gelu(linear(x)))
        low = LowRank.from_linear(linear, "gelu", rank=2)
        product = low.up.weight @ low.down.weight
        s = torch.linalg.svdvals(linear.weight)
        assert float(torch.linalg.matrix_norm(product - linear.weight)) == pytest.approx(float(s[2:].norm()))


def test_layer_errors_name_the_argument():
    with pytest.raises(ValueError, match="in_features: expected an integer >= 1, got 0"):
        RaLiMP(0, 3)
    with pytest.raises(ValueError, match="tau: expected 'auto' or a positive number, got -1"):
        RaLiMP.from_linear(torch.nn.Linear(3, 3), "gelu", tau=-1)
    with pytest.raises(ValueError, match="num_freqs: expected an integer >= 1, got 0"):
        RaLiMP(3, 3, sizes=Sizes(num_freqs=0))
    with pytest.raises(ValueError, match="x: expected last dimension 3"):
        RaLiMP(3, 2, seed=0)(torch.zeros(2, 4))
    with pytest.raises(ValueError, match="unknown weight matrix 'nope'"):
        RaLiMP(3, 2, weight_matrix="nope")
    with pytest.raises(ValueError, match=r"next_linear: expected an nn\.Linear with in_features=2"):
        RaLiMP(3, 2, seed=0).compress(torch.nn.Linear(3, 3))


def test_a_plain_callable_is_fitted_in_the_layers_basis():
    def softsign(t):
        return t / (1 + t.abs())

    layer = RaLiMP.from_linear(
        torch.nn.Linear(3, 2),
        softsign,
        num_atoms=2,
        num_freqs=1,
        interval=(-4.0, 4.0),
        seed=0,
        fit="discretized",
    )
    t = torch.linspace(-4, 4, 4001, dtype=torch.float64)
    with torch.no_grad():
        error = float((layer.expected_output(t.float()).double() - softsign(t)).abs().max())
    assert error == pytest.approx(layer.fit.max_error, rel=1e-3, abs=1e-6)
    assert layer.fit.continuous is not None
    assert layer.fit.max_error < 0.05


@pytest.mark.parametrize("radius", [8.0, 16.0, 64.0])
def test_features_that_would_overflow_raise_instead_of_returning_nan(radius):
    # a 64 -> 64 relu layer fed one direction, with the narrow pole of a least-squares fit on [-4, 4] at
    # tau = 1: the exponent (s/q) ||x/lambda + lambda w||^2 / tau^2 is far above float32's ~80
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 64)
    direction = F.normalize(torch.randn(64), dim=0)
    layer = RaLiMP.from_linear(linear, "relu", seed=0, fit="discretized", interval=(-4.0, 4.0), tau=1.0)
    layer.name = "trunk.1"
    with pytest.raises(ValueError, match=r"layer trunk\.1, .* reaches .* \(limit 80\.7; .*Remedies"):
        layer(radius * direction[None])
    # the variance-aware default fit of the same layer stays finite (its choice avoids narrow poles)
    default = RaLiMP.from_linear(linear, "relu", seed=0)
    with torch.no_grad():
        y = default(radius * direction[None])
    assert torch.isfinite(y).all()


def test_float64_carries_larger_exponents_than_float32():
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 64)
    x = 8 * F.normalize(torch.randn(1, 64), dim=-1)
    layer = RaLiMP.from_linear(linear, "relu", seed=0, fit="discretized", interval=(-4.0, 4.0), tau=1.0)
    with pytest.raises(ValueError, match=r"overflow torch\.float32"):
        layer(x)
    with torch.no_grad():
        assert torch.isfinite(layer.double()(x.double())).all()  # exponent ~440 < 701.8


def test_without_the_exponent_guard_the_bound_is_not_the_computed_exponent():
    # the guard's number bounds the log second moment of the estimator (Prop. 1) for the worst aligned
    # pair; the features' own exponent is far smaller, so with the guard off the same batch is finite
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 64)
    x = 8 * F.normalize(torch.randn(1, 64), dim=-1)
    kw = {"seed": 0, "fit": "discretized", "interval": (-4.0, 4.0), "tau": 1.0}
    guarded = RaLiMP.from_linear(linear, "relu", **kw)
    with pytest.raises(ValueError, match="reaches"):
        guarded(x)
    unguarded = RaLiMP.from_linear(linear, "relu", exponent_guard=False, **kw)
    with torch.no_grad():
        assert torch.isfinite(unguarded(x)).all()


def test_the_overflow_check_keeps_a_compiled_graph_whole(small_layer_data):
    # the guard reads no Python float while torch.compile traces (fullgraph=True fails on a graph break)
    linear, x = small_layer_data
    linear, x = linear.float(), x.float()
    layer = RaLiMP.from_linear(linear, "gelu", fit="discretized", sample=x, seed=0)
    assert layer.num_atoms == 1
    torch._dynamo.reset()
    compiled = torch.compile(layer, backend="eager", fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), layer(x))


def test_the_exponent_bound_is_the_largest_input_and_weight_row_aligned():
    # float64 reference: (max_k s_k / q) (max ||[x; 1]|| / lambda + lambda max ||[w; b]||)^2 / tau^2
    torch.manual_seed(0)
    linear = torch.nn.Linear(8, 5, dtype=torch.float64)
    x = torch.randn(7, 8, dtype=torch.float64)
    layer = RaLiMP.from_linear(linear, "gelu", fit="discretized", sample=x, seed=0, balance="auto")
    u = torch.cat([x, torch.ones(7, 1, dtype=torch.float64)], -1)
    wb = torch.cat([linear.weight, linear.bias[:, None]], -1).detach()
    lam, tau = float(layer.scale), float(layer.tau)
    freq = float(layer.nodes.max() / layer.pole_widths().detach().min())
    side = float(u.norm(dim=-1).max()) / lam + lam * float(wb.norm(dim=-1).max())
    expected = freq * side**2 / tau**2
    freqs = layer._projections(torch.float64)[3]
    assert float(layer.exponent_bound(u, freqs)) == pytest.approx(expected, rel=1e-12)


def test_from_linear_calibrates_once_and_only_the_pretrained_weights(monkeypatch, small_layer_data):
    # the choice of J and the layer's own fit share one calibration; the random init is never calibrated
    linear, x = small_layer_data
    calibrated = []
    original = ralimp.layer.calibrate

    def spy(weight, *args, **kw):
        calibrated.append(torch.equal(weight, linear.weight))
        return original(weight, *args, **kw)

    monkeypatch.setattr(ralimp.layer, "calibrate", spy)
    RaLiMP.from_linear(linear, "gelu", sample=x, seed=0, num_atoms=2)
    assert calibrated == [True]


def test_from_linear_keeps_the_single_calibration_of_the_pretrained_weights(small_layer_data):
    linear, x = small_layer_data
    layer = RaLiMP.from_linear(linear, "gelu", sample=x, seed=0, num_atoms=2, tau="auto")
    once = RaLiMP.calibrate(linear.weight.detach(), linear.bias.detach(), x, layer.options)
    assert (layer.calibration.tau, layer.calibration.balance) == (once.tau, once.balance)
    assert torch.equal(layer.calibration.t, once.t)
    assert float(layer.tau) == pytest.approx(once.tau, rel=1e-12)
