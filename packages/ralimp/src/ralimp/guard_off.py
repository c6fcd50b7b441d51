r"""``python -m ralimp.guard_off MODULE [ARGS ...]``: run ``python -m MODULE ARGS`` with RaLiMP's guard off.

Every `ralimp.RaLiMP` then computes its features whatever `RaLiMP.check_exponent`'s bound says (the paper's
layer), and two numbers are recorded at every forward pass of the run; the first pass's and the largest are
printed at its end:

- the guard's bound: the batch maximum of $2\sigma^2 = (s_k / q') \lVert x / \lambda + \lambda w\rVert^2 /
  \tau^2$ for the largest input aligned with the largest weight row, which is the log of the estimator's
  second moment $\mathbb E|Y_k|^2 = e^{2\sigma^2}$ (Prop. 1, Eq. 13) for that pair;
- the largest exponent the features really compute: $Z_r = \sqrt{s_r / 2}\, \omega_r \cdot u$ of
  $z_r(u) = e^{Z_r} e^{i (Z_r - h_r)}$ (`ralimp.complex_exponential_features`), over the inputs' and the
  weight rows' features; float32 overflows at $Z > 88.7$.

Example (the SIREN quick run at the paper's layout)::

    uv run --frozen --package nerf-pinn python -m ralimp.guard_off nerf_pinn train --family siren \
        --layer ralimp --fit paper --threads 1 --out /tmp/siren-guard-off
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import runpy
import sys
from collections.abc import Iterator

import torch

import ralimp.layer
from ralimp.layer import RaLiMP


@dataclasses.dataclass
class ExponentLog:
    """What `unguarded` saw: per forward pass the guard's bound, per feature computation its exponent."""

    bounds: list[float] = dataclasses.field(default_factory=list)
    exponents: list[float] = dataclasses.field(default_factory=list)
    nonfinite_calls: int = 0

    @property
    def largest_bound(self) -> float:
        """The largest guard bound of the run."""
        return max(self.bounds, default=-math.inf)

    @property
    def largest_exponent(self) -> float:
        """The largest exponent the features computed in the run."""
        return max(self.exponents, default=-math.inf)

    @property
    def feature_calls(self) -> int:
        """How many feature blocks were computed (inputs' and weight rows' separately)."""
        return len(self.exponents)

    def summary(self) -> str:
        """One line for the end of a run: the first forward pass (input and weight sides) and the largest."""
        first_bound = self.bounds[0] if self.bounds else -math.inf
        first_exponent = max(self.exponents[:2], default=-math.inf)
        return (
            "guard off: guard bound 2 sigma^2 (log second moment, worst aligned pair) "
            f"{first_bound:.4g} at the first forward pass, {self.largest_bound:.4g} at most; "
            "largest computed feature exponent "
            f"{first_exponent:.4g} at the first forward pass, {self.largest_exponent:.4g} at most; "
            f"{self.nonfinite_calls} of {self.feature_calls} feature computations not finite"
        )


@contextlib.contextmanager
def unguarded() -> Iterator[ExponentLog]:
    """Within the block no RaLiMP raises on its exponent bound; the yielded `ExponentLog` fills as it runs."""
    log = ExponentLog()
    features = ralimp.layer.complex_exponential_features  # type: ignore[attr-defined]
    check = RaLiMP.check_exponent

    @torch.no_grad()
    def record_bound(layer: RaLiMP, u: torch.Tensor, freqs: torch.Tensor) -> None:
        if u.numel() and freqs.numel() and not torch.compiler.is_compiling():
            log.bounds.append(float(layer.exponent_bound(u, freqs)))

    def record_features(
        u: torch.Tensor, omega: torch.Tensor, freq: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        re, im = features(u, omega, freq)
        if re.numel() and not torch.compiler.is_compiling():
            with torch.no_grad():
                exponent = ((u.detach() @ omega.detach().mT) * (freq.detach() / 2).sqrt()).max()
                log.exponents.append(float(exponent))
                log.nonfinite_calls += int(not bool(torch.isfinite(re).all() & torch.isfinite(im).all()))
        return re, im

    RaLiMP.check_exponent = record_bound  # type: ignore[method-assign,assignment]
    ralimp.layer.complex_exponential_features = record_features  # type: ignore[attr-defined]
    try:
        yield log
    finally:
        RaLiMP.check_exponent = check  # type: ignore[method-assign]
        ralimp.layer.complex_exponential_features = features  # type: ignore[attr-defined]


def main(argv: list[str] | None = None) -> int:
    """Run ``python -m MODULE ARGS`` (``argv = [MODULE, *ARGS]``) unguarded; print the `ExponentLog`."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].startswith("-"):
        print(__doc__.splitlines()[0], file=sys.stderr)
        return 2
    saved = sys.argv
    sys.argv = [argv[0], *argv[1:]]
    code: int | str | None = 0
    with unguarded() as log:
        try:
            runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
        except SystemExit as stop:
            code = stop.code
        finally:
            sys.argv = saved
            print(log.summary(), flush=True)
    return code if isinstance(code, int) else (0 if code is None else 1)


if __name__ == "__main__":
    raise SystemExit(main())
