"""``torch.compile`` of the attention modules: whole graphs, no recompilation, and the eager results.

Graph breaks and recompilations are decided by Dynamo, whatever the backend. Every component and matrix
family, causal and not, with learned features and OPRF's and SADERF's running statistics updated in the step,
trains through AOT autograd (``backend="aot_eager"``: Dynamo's graphs and AOT's forward and backward graphs,
run by eager kernels), and five of them through inductor (CPU, C++): two training steps give eager's outputs
within 1e-4 and every parameter's gradient within 1e-3 (relative errors). Slow (tracing takes seconds per
module, inductor's C++ a minute): marked ``slow``, run by the ``tests-all`` nox session only.
"""

import copy
import shutil

import pytest
import torch

import rf_attention
from spectraformer_core.testing import assert_rel_close

needs_compiler = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None,
    reason="torch.compile's CPU backend (inductor) needs a C compiler (cc or gcc); none on this platform",
)

pytestmark = [
    pytest.mark.slow,
    # Dynamo's notice that it traces through rf_matrices' lru_cache'd Hadamard factor (a constant; safe)
    pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`"),
]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Every test starts from an empty Dynamo cache (its own compilations only) and torch seed 0."""
    torch._dynamo.reset()
    torch.manual_seed(0)


#: Every component family and every matrix family, each in at least one pair: learnable maps (FastFood_L its
#: own parameters, the others one dense learned matrix); OPRF's and SADERF's running statistics move in every
#: training step. Each causal (where the running statistics live); not causal, the pairs with batch
#: statistics (OPRF, SADERF) and one without (the suite's time: each case traces for tens of seconds).
PAIRS = [
    "trigrf-sorf",
    "posrf-base",
    "posrf-hyp-qmc",
    "gerf-sgq",
    "oprf-fastfoodl",
    "oprf-mm",
    "saderf-orf",
    "saderf-fastfood",
]
CASES = [(name, True) for name in PAIRS] + [
    ("oprf-mm", False),
    ("saderf-fastfood", False),
    ("gerf-sgq", False),
]
#: Inductor compiles C++ for a minute per case: both kinds of running statistics (causal), FastFood_L's
#: learned diagonals among them.
INDUCTOR_CASES = [
    ("oprf-fastfoodl", True),
    ("saderf-orf", True),
]


def case_ids(cases: list[tuple[str, bool]]) -> list[str]:
    """Test ids ``<pair>-causal`` / ``<pair>-full``."""
    return [f"{name}-{'causal' if causal else 'full'}" for name, causal in cases]


#: The goals: compiled outputs and every parameter's gradient equal eager's within these relative errors.
OUTPUT_TOLERANCE, GRADIENT_TOLERANCE = 1e-4, 1e-3


def learnable_module(name: str, causal: bool) -> torch.nn.Module:
    """A small module with learned features, in training mode (32 rows: sgq's least at head dimension 16).

    FastFood_L learns its own diagonals (``S``, ``G`` and ``B``); every other matrix is one dense learned
    matrix initialized by its draw.
    """
    learned = {"matrix_options": {"learn_gb": True}} if name.endswith("-fastfoodl") else {"learnable": True}
    return rf_attention.create(name, 32, 2, num_features=32, causal=causal, seed=0, **learned).train()


def train_steps(
    module: torch.nn.Module, x: torch.Tensor, steps: int
) -> tuple[list[torch.Tensor], list[dict[str, torch.Tensor]]]:
    """Outputs and every parameter's gradient (by name) of ``steps`` training steps (cleared before each)."""
    parameters = getattr(module, "_orig_mod", module).named_parameters  # a compiled module's: unprefixed
    outputs, gradients = [], []
    for _ in range(steps):
        module.zero_grad()
        y = module(x)
        y.square().sum().backward()
        outputs.append(y.detach())
        gradients.append({n: p.grad.clone() for n, p in parameters() if p.grad is not None})
    return outputs, gradients


def assert_steps_equal_eager(compiled: torch.nn.Module, eager: torch.nn.Module, x: torch.Tensor) -> None:
    """Two training steps of ``compiled`` give eager's outputs, gradients of every parameter and buffers."""
    with torch._dynamo.config.patch(error_on_recompile=True):  # a recompilation raises
        outputs, gradients = train_steps(compiled, x, steps=2)
    expected_outputs, expected_gradients = train_steps(eager, x, steps=2)
    for step, (got, expected) in enumerate(zip(outputs, expected_outputs, strict=True)):
        assert_rel_close(f"output, step {step}", expected, got, OUTPUT_TOLERANCE)
    for step, (got, expected) in enumerate(zip(gradients, expected_gradients, strict=True)):
        assert got.keys() == dict(eager.named_parameters()).keys()  # every parameter has a gradient
        for name, gradient in expected.items():
            assert_rel_close(f"gradient of {name}, step {step}", gradient, got[name], GRADIENT_TOLERANCE)
    for (name, expected), got in zip(eager.named_buffers(), compiled.buffers(), strict=True):
        assert_rel_close(f"buffer {name}", expected, got, OUTPUT_TOLERANCE)


@pytest.mark.parametrize(("name", "causal"), CASES, ids=case_ids(CASES))
def test_aot_training_steps_compile_to_one_graph_and_give_eager_gradients(name, causal):
    module = learnable_module(name, causal)
    eager = copy.deepcopy(module)
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")  # fullgraph: a graph break raises
    assert_steps_equal_eager(compiled, eager, torch.randn(2, 40, 32))


@needs_compiler
@pytest.mark.parametrize(("name", "causal"), INDUCTOR_CASES, ids=case_ids(INDUCTOR_CASES))
def test_inductor_training_steps_give_eager_gradients(name, causal):
    module = learnable_module(name, causal)
    eager = copy.deepcopy(module)
    assert_steps_equal_eager(torch.compile(module, fullgraph=True), eager, torch.randn(2, 40, 32))


@needs_compiler
@pytest.mark.parametrize("name", ["oprf-fastfoodl", "nystromformer"])
def test_compiled_module_equals_eager(name):
    attn = rf_attention.create(name, 32, 2, num_features=16, seed=0).eval()
    x = torch.randn(2, 40, 32)
    mask = torch.zeros(2, 40, dtype=torch.bool)
    mask[1, 30:] = True
    with torch.no_grad():
        eager = attn(x, key_padding_mask=mask)
        compiled = torch.compile(attn)(x, key_padding_mask=mask)
    assert_rel_close("output", eager, compiled, OUTPUT_TOLERANCE)


def matrix_after_each_step(module: torch.nn.Module, x: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """The feature map's dense weight matrix after each of ``steps`` training steps."""
    matrices = []
    for _ in range(steps):
        train_steps(module, x, steps=1)
        matrices.append(module.feature_map.weight_matrix.matrix().detach().clone())
    return matrices


@pytest.mark.parametrize("name", ["posrf-orf", "trigrf-sorf", "saderf-qmc"])
def test_training_with_periodic_redraws_compiles_to_one_graph_and_redraws_as_eager(name):
    module = rf_attention.create(name, 32, 2, num_features=16, seed=0, redraw_interval=2).train()
    eager = copy.deepcopy(module)
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    x = torch.randn(2, 40, 32)
    with torch._dynamo.config.patch(error_on_recompile=True):
        got = matrix_after_each_step(compiled, x, steps=5)
    expected = matrix_after_each_step(eager, x, steps=5)
    # redrawn before calls 2 and 4 (counting from 0), from the same generator as eager's
    changed = [not torch.equal(got[i], got[i + 1]) for i in range(len(got) - 1)]
    assert changed == [False, True, False, True]
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert_rel_close("output", eager(x), compiled(x), OUTPUT_TOLERANCE)
