"""The Triton backend against the float64 PyTorch path: outputs, q/k/v and feature-map gradients, decoding.

Run on CPU tensors under Triton's interpreter (env ``TRITON_INTERPRET=1``, the ``tests-triton`` nox session)
or on a CUDA device; skipped otherwise. Tolerances: the kernels accumulate in float32 (``1e-4`` relative
for outputs, ``1e-3`` for gradients, which go through one more product and the features' VJP), plus the
rounding of a float16/bfloat16 result (half its machine epsilon, relative).
"""

import copy
import os
import subprocess
import sys

import pytest
import torch

import rf_attention
import rf_features
from rf_attention import rf_attention as rf_attend
from rf_attention.ops.features import ClosedForm, qk_scale
from rf_attention.ops.recurrent import RecurrentState
from spectraformer_core.testing import assert_rel_close

INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
if not INTERPRETING and not torch.cuda.is_available():
    pytest.skip(
        "the Triton kernels run on CUDA tensors or under TRITON_INTERPRET=1 (nox -s tests-triton)",
        allow_module_level=True,
    )
triton = pytest.importorskip("triton")

DEVICE = "cpu" if INTERPRETING else "cuda"
OUTPUT_TOLERANCE = 1e-4
GRADIENT_TOLERANCE = 1e-3
#: One of each component, the trigonometric and positive ones with learnable matrices (gradients of the
#: projection itself), OPRF and SADERF with batch or running statistics, FastFood_L's learned scale.
PAIRS = [
    ("trigrf", "orf", {"learnable": True}),
    ("posrf", "orf", {"learnable": True}),
    ("gerf", "orf", {}),
    ("oprf", "orf", {}),
    ("saderf", "orf", {}),
    ("oprf", "fastfoodl", {}),
]
PAIR_IDS = [f"{c}-{m}" + ("-learnable" if kw else "") for c, m, kw in PAIRS]


def feature_maps(component, matrix, causal, d=16, num_features=32, **kw):
    """The map (float32) and a float64 copy with the same draws."""
    fm = rf_features.create(
        component,
        weight_matrix=matrix,
        num_features=num_features,
        dim=d,
        seed=0,
        statistics_mode="running" if causal else "batch",
        **kw,
    ).to(DEVICE)
    return fm, copy.deepcopy(fm).double()


def inputs(b=2, h=1, n=37, d=16, scale=1.5, seed=0):
    """``q, k, v (b, h, n, d)``: unit normals times ``scale`` (logits up to about ``scale^2 sqrt(d)``)."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(b, h, n, d, generator=g) * scale).to(DEVICE) for _ in range(3)]


def padding(b, n, causal):
    """Sequence 1 padded: its first 5 keys when causal (queries before them see none), else its last 6."""
    mask = torch.zeros(b, n, dtype=torch.bool, device=DEVICE)
    if causal:
        mask[1, :5] = True
    else:
        mask[1, -6:] = True
    return mask


def rounding(dtype):
    """Relative rounding of a result stored in ``dtype`` (0 for float32: the kernels' own dtype)."""
    return 0.0 if dtype == torch.float32 else torch.finfo(dtype).eps / 2


def compare(pair, causal, dtype, *, n=37, chunk_size=16, mask=True):
    """Outputs and every gradient (q, k, v, the map's parameters) of the two backends, float64 reference."""
    component, matrix, kw = pair
    fm, fm64 = feature_maps(component, matrix, causal, **kw)
    q, k, v = (x.to(dtype) for x in inputs(n=n))
    key_mask = padding(q.shape[0], n, causal) if mask else None
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = rf_attend(
        *leaves, fm, causal=causal, key_padding_mask=key_mask, chunk_size=chunk_size, backend="triton"
    )
    assert out.dtype == dtype
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE, dtype)
    out.backward(grad)
    ref_leaves = [x.double().requires_grad_() for x in (q, k, v)]
    ref = rf_attend(*ref_leaves, fm64, causal=causal, key_padding_mask=key_mask, backend="torch")
    ref.backward(grad.double())
    assert_rel_close("output", ref, out.double(), OUTPUT_TOLERANCE + rounding(dtype))
    for name, leaf, ref_leaf in zip("qkv", leaves, ref_leaves, strict=True):
        assert_rel_close(f"d{name}", ref_leaf.grad, leaf.grad.double(), GRADIENT_TOLERANCE + rounding(dtype))
    parameters = dict(fm64.named_parameters())
    checked = 0
    for name, p in fm.named_parameters():
        if p.grad is not None:
            # float32 parameters: their gradients are not rounded to the inputs' dtype
            assert_rel_close(f"d{name}", parameters[name].grad, p.grad.double(), GRADIENT_TOLERANCE)
            checked += 1
    assert checked == sum(p.requires_grad for p in fm.parameters()), (
        "every learnable parameter has a gradient"
    )


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("pair", PAIRS, ids=PAIR_IDS)
def test_float32_matches_float64_torch_path(pair, causal):
    # 37 positions: 3 causal chunks of 16 (the last one partial), 2 row blocks of 32
    compare(pair, causal, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("pair", [PAIRS[0], PAIRS[3]], ids=[PAIR_IDS[0], PAIR_IDS[3]])
def test_half_precision_inputs_are_computed_in_float32(pair, causal, dtype):
    compare(pair, causal, dtype)


@pytest.mark.parametrize("n", [16, 17, 48], ids=["one-chunk", "one-chunk-and-one", "three-chunks"])
def test_causal_chunk_boundaries(n):
    # positive features: TrigRF's signed normalizer is ill-conditioned on some short prefixes (at 17
    # positions the float32 PyTorch path is 4e-4 from float64 too)
    compare(PAIRS[1], True, torch.float32, n=n)


def test_causal_default_chunk_without_mask():
    compare(PAIRS[4], True, torch.float32, n=70, chunk_size=None, mask=False)


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
def test_sequence_of_padding_only_gives_zeros(causal):
    fm, _ = feature_maps("trigrf", "orf", causal)
    q, k, v = inputs(n=20)
    mask = torch.zeros(2, 20, dtype=torch.bool, device=DEVICE)
    mask[0] = True
    out = rf_attend(q, k, v, fm, causal=causal, key_padding_mask=mask, chunk_size=16, backend="triton")
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert torch.isfinite(out).all()


def test_packed_sequences_run_on_the_kernels():
    fm, fm64 = feature_maps("posrf", "orf", True)
    q, k, v = inputs(b=1, n=30)
    cu_seqlens = torch.tensor([0, 11, 30], dtype=torch.int32, device=DEVICE)
    out = rf_attend(q, k, v, fm, causal=True, cu_seqlens=cu_seqlens, chunk_size=16, backend="triton")
    ref = rf_attend(
        q.double(), k.double(), v.double(), fm64, causal=True, cu_seqlens=cu_seqlens, backend="torch"
    )
    assert_rel_close("output", ref, out.double(), OUTPUT_TOLERANCE)


@pytest.mark.parametrize("pair", [PAIRS[0], PAIRS[1], PAIRS[3]], ids=[PAIR_IDS[0], PAIR_IDS[1], PAIR_IDS[3]])
def test_fused_recurrent_steps_equal_the_causal_forward(pair):
    from rf_attention.ops.triton.fused_recurrent import fused_recurrent_step

    component, matrix, kw = pair
    fm, fm64 = feature_maps(component, matrix, True, **kw)
    fm.eval(), fm64.eval()
    q, k, v = inputs(n=9)
    mask = torch.zeros(2, 9, dtype=torch.bool, device=DEVICE)
    mask[1, 3] = True  # a padded token in the middle: its key is never added
    scale = qk_scale(q.shape[-1])
    with torch.no_grad():
        closed = ClosedForm.of(fm.contract(q, k, scale=scale), q.shape[:-2], torch.float32)
        lead, width = tuple(q.shape[:2]), closed.query.offset.shape[-1]
        state = RecurrentState.empty(
            lead, width, v.shape[-1], signed=closed.signed, dtype=torch.float32, device=DEVICE
        )
        eps = torch.finfo(torch.float32).eps
        outs = []
        for t in range(q.shape[-2]):
            step = slice(t, t + 1)
            token_mask = mask[:, step].expand(lead)
            out, sums, log_scale, magnitude = fused_recurrent_step(
                q[..., step, :],
                k[..., step, :],
                v[..., step, :],
                token_mask,
                closed,
                state.sums,
                state.log_scale,
                state.magnitude,
                eps,
            )
            state = RecurrentState(sums, log_scale, magnitude, length=state.length + 1)
            outs.append(out)
        ref = rf_attend(
            q.double(), k.double(), v.double(), fm64, causal=True, key_padding_mask=mask, backend="torch"
        )
    assert state.length == q.shape[-2]
    assert_rel_close("outputs", ref, torch.cat(outs, dim=-2).double(), OUTPUT_TOLERANCE)


def test_modules_take_the_backend():
    torch.manual_seed(0)
    x = torch.randn(2, 21, 32, device=DEVICE)
    outs = []
    for backend in ("torch", "triton"):
        attn = rf_attention.create("posrf-orf", 32, 2, num_features=32, seed=0, causal=True, backend=backend)
        outs.append(attn.to(DEVICE)(x))
    assert_rel_close("output", outs[0].double(), outs[1].double(), OUTPUT_TOLERANCE)


def test_unknown_backend_names_the_argument_and_the_choices():
    fm, _ = feature_maps("posrf", "orf", False)
    q, k, v = inputs(n=4)
    with pytest.raises(ValueError, match="backend: expected one of 'auto', 'torch', 'triton', got 'cuda'"):
        rf_attend(q, k, v, fm, backend="cuda")


def test_triton_backend_refuses_what_it_cannot_run(monkeypatch):
    q, k, v = inputs(n=4)
    fm, _ = feature_maps("posrf", "orf", False)
    with pytest.raises(ValueError, match=r"float32/float16/bfloat16 inputs, got torch\.float64"):
        rf_attend(q.double(), k.double(), v.double(), fm.double(), backend="triton")
    no_closed_form = rf_features.create(
        "posrf", weight_matrix="orf", num_features=8, dim=16, input_map=True
    ).to(DEVICE)
    with pytest.raises(ValueError, match="PosRF has none"):
        rf_attend(q, k, v, no_closed_form, backend="triton")
    auto = rf_attend(q, k, v, no_closed_form, backend="auto")  # falls back to PyTorch
    assert_rel_close("output", rf_attend(q, k, v, no_closed_form, backend="torch"), auto, 0.0)
    with pytest.raises(ValueError, match="the Triton kernels compute the features"):
        rf_attention.linear_attention(q.abs(), k.abs(), v, backend="triton")
    with pytest.raises(ValueError, match="chunk_size: the Triton causal kernel takes 16, 32, 64 or 128"):
        rf_attend(q, k, v, fm, causal=True, chunk_size=24, backend="triton")
    if DEVICE == "cpu":
        auto = rf_attend(q, k, v, fm, backend="auto")  # PyTorch on CPU tensors, even under the interpreter
        assert_rel_close("output", rf_attend(q, k, v, fm, backend="torch"), auto, 0.0)
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        with pytest.raises(ValueError, match="got a cpu tensor without TRITON_INTERPRET=1"):
            rf_attend(q, k, v, fm, backend="triton")


def test_import_rf_attention_never_imports_triton():
    code = "import sys, rf_attention; assert 'triton' not in sys.modules, 'triton imported'"
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "TRITON_INTERPRET": "0"})


#: Decoding: a positive family, OPRF with running statistics, TrigRF (signed, the guard), FastFood_L.
DECODE_PAIRS = [PAIRS[1], PAIRS[3], ("trigrf", "orf", {}), PAIRS[5]]
DECODE_IDS = ["posrf-orf", "oprf-orf", "trigrf-orf", "oprf-fastfoodl"]


def decoding_maps(pair):
    """The map after two training batches (running statistics that are not the initial ones), in eval."""
    component, matrix, kw = pair
    fm, _ = feature_maps(component, matrix, True, **kw)
    for seed in (10, 11):
        rf_attend(*inputs(n=12, seed=seed), fm, causal=True, backend="torch")
    fm.eval()
    return fm, copy.deepcopy(fm).double()


def left_padding(b, n):
    """Sequence 1 left-padded by 2 tokens."""
    mask = torch.zeros(b, n, dtype=torch.bool, device=DEVICE)
    mask[1, :2] = True
    return mask


def decode_tokens(q, k, v, fm, mask, backends, state=None):
    """``decode_heads`` token by token, token ``t`` on ``backends[t]``; outputs ``(B, H, N, Dv)``, state."""
    from rf_attention.decoding import decode_heads

    outs = []
    for t, backend in enumerate(backends):
        step = slice(t, t + 1)
        out, state = decode_heads(
            q[..., step, :], k[..., step, :], v[..., step, :], fm, state,
            key_padding_mask=mask[:, step], backend=backend,
        )  # fmt: skip
        outs.append(out)
    return torch.cat(outs, dim=-2), state


class LaunchCounter:
    """Counts the launches of every Triton kernel (``kernel[grid](...)``, interpreted or compiled)."""

    def __init__(self, monkeypatch):
        self.launches = 0
        getitem = triton.runtime.jit.KernelInterface.__getitem__

        def counted(kernel, grid):
            self.launches += 1
            return getitem(kernel, grid)

        monkeypatch.setattr(triton.runtime.jit.KernelInterface, "__getitem__", counted)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("pair", DECODE_PAIRS, ids=DECODE_IDS)
def test_triton_decoding_equals_the_naive_causal_formula(pair, dtype):
    from rf_attention.ops.naive import naive_rf_attention

    fm, fm64 = decoding_maps(pair)
    q, k, v = (x.to(dtype) for x in inputs(h=2, n=7))
    mask = left_padding(2, 7)
    with torch.no_grad():
        out, state = decode_tokens(q, k, v, fm, mask, ["triton"] * 7)
        ref = naive_rf_attention(q.double(), k.double(), v.double(), fm64, causal=True, key_padding_mask=mask)
    assert out.dtype == dtype
    assert isinstance(state, RecurrentState)
    assert state.sums.dtype == torch.float32
    assert state.length == 7
    assert_rel_close("outputs", ref, out.double(), OUTPUT_TOLERANCE + rounding(dtype))


@pytest.mark.parametrize("pair", [DECODE_PAIRS[2], DECODE_PAIRS[3]], ids=[DECODE_IDS[2], DECODE_IDS[3]])
def test_pytorch_and_triton_steps_continue_each_others_states(pair):
    from rf_attention.decoding import decode_heads
    from rf_attention.ops.naive import naive_rf_attention

    fm, fm64 = decoding_maps(pair)
    q, k, v = inputs(h=2, n=8)
    mask = left_padding(2, 8)
    with torch.no_grad():
        _, state = decode_heads(q[..., :3, :], k[..., :3, :], v[..., :3, :], fm, None,
                                key_padding_mask=mask[:, :3], backend="torch")  # fmt: skip
        backends = ["triton", "torch", "triton", "triton", "torch"]
        tail = [x[..., 3:, :] for x in (q, k, v)]
        out, state = decode_tokens(*tail, fm, mask[:, 3:], backends, state)
        ref = naive_rf_attention(q.double(), k.double(), v.double(), fm64, causal=True, key_padding_mask=mask)
    assert state.length == 8
    assert_rel_close("outputs", ref[..., 3:, :], out.double(), OUTPUT_TOLERANCE)


def test_a_decoding_step_is_one_triton_launch_per_layer(monkeypatch):
    counter = LaunchCounter(monkeypatch)
    torch.manual_seed(0)
    x = torch.randn(2, 5, 32, device=DEVICE)
    for backend, launches_per_step in (("triton", 1), ("torch", 0), ("auto", int(DEVICE == "cuda"))):
        attn = rf_attention.create(
            "trigrf-orf", 32, 4, num_features=16, seed=0, causal=True, backend=backend
        ).to(DEVICE)
        attn.eval()
        with torch.no_grad():
            _, state = attn.prefill(x[:, :3])
            counter.launches = 0
            for t in (3, 4):
                _, state = attn.step(x[:, t : t + 1], state)
        assert counter.launches == 2 * launches_per_step, backend


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_a_kept_triton_step_computes_nothing_outside_its_kernel(monkeypatch, dtype):
    from torch.utils._python_dispatch import TorchDispatchMode

    from rf_attention.decoding import decode_heads

    allocations = {torch.ops.aten.empty.memory_format, torch.ops.aten.empty_like.default}

    class ComputeOutsideKernels(TorchDispatchMode):
        """The aten operations that compute (not views, not allocations), outside Triton launches."""

        def __init__(self):
            super().__init__()
            self.ops, self.launching = [], False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not (self.launching or func.is_view or func in allocations):
                self.ops.append(func)
            return func(*args, **(kwargs or {}))

    counting = ComputeOutsideKernels()
    getitem = triton.runtime.jit.KernelInterface.__getitem__

    def launched(kernel, grid):
        def launch(*args, **kwargs):
            counting.launching = True
            try:
                return getitem(kernel, grid)(*args, **kwargs)
            finally:
                counting.launching = False

        return launch

    monkeypatch.setattr(triton.runtime.jit.KernelInterface, "__getitem__", launched)
    fm, _ = decoding_maps(DECODE_PAIRS[2])  # TrigRF: signed, the magnitudes too
    q, k, v = (x.to(dtype) for x in inputs(h=2, n=1))
    mask = torch.zeros(2, 1, dtype=torch.bool, device=DEVICE)
    with torch.no_grad():
        _, state = decode_heads(q, k, v, fm, None, key_padding_mask=mask, backend="triton")  # lays out
        with counting:
            _, state = decode_heads(q, k, v, fm, state, key_padding_mask=mask, backend="triton")
    assert counting.ops == []


def test_triton_decoding_refuses_what_it_cannot_run(monkeypatch):
    from rf_attention.decoding import decode_heads

    q, k, v = inputs(n=1)
    fm, _ = decoding_maps(DECODE_PAIRS[0])
    with pytest.raises(ValueError, match="backend: the Triton kernels have no sliding window"):
        decode_heads(q, k, v, fm, None, window=4, backend="triton")
    no_closed_form = rf_features.create(
        "posrf", weight_matrix="orf", num_features=8, dim=16, input_map=True
    ).to(DEVICE)
    with torch.no_grad(), pytest.raises(ValueError, match="PosRF has none"):
        decode_heads(q, k, v, no_closed_form, None, backend="triton")
    leaf = q.clone().requires_grad_()
    with pytest.raises(ValueError, match="the Triton decoding step has no backward"):
        decode_heads(leaf, k, v, fm, None, backend="triton")
    with pytest.raises(ValueError, match="backend: expected one of 'auto', 'torch', 'triton', got 'cuda'"):
        decode_heads(q, k, v, fm, None, backend="cuda")
    if DEVICE == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        with pytest.raises(ValueError, match="got a cpu tensor without TRITON_INTERPRET=1"):
            decode_heads(q, k, v, fm, None, backend="triton")
