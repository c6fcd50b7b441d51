r"""Column-scaled ridge least squares: the one solver of every fit with a quadratic penalty."""

from __future__ import annotations

import torch


def scaled_ridge_solve(
    basis: torch.Tensor,
    target: torch.Tensor,
    *,
    penalty: torch.Tensor | None = None,
    diagonal: torch.Tensor | None = None,
    ridge: float = 0.0,
    jitter: float = 1e-12,
) -> torch.Tensor:
    r"""$\arg\min_c \frac1N \lVert B c - y\rVert^2 + c^\top \Sigma c + \sum_i (d_i + r D_i^2) c_i^2$.

    $B$ = ``basis`` ``(..., N, F)``, $y$ = ``target`` ``(N,)`` or ``(N, O)`` (one problem per column),
    $\Sigma$ = ``penalty`` ``(..., F, F)``, $d$ = ``diagonal`` ``(F,)``, $r$ = ``ridge`` relative to $D_i$,
    the RMS of column $i$. Solved on the normal equations of the unit-RMS columns $B / D$, with ``jitter``
    added to their diagonal; by least squares (`torch.linalg.lstsq`, for a singular system) when there is no
    penalty at all (then ``basis`` is one ``(N, F)`` matrix). Leading dimensions of ``basis`` and ``penalty``
    are a batch of problems on the same ``target``.

    Returns:
        $c$, shaped ``(..., F)`` or ``(..., F, O)`` as ``target``.
    """
    n = basis.shape[-2]
    scale = basis.pow(2).mean(-2).sqrt().clamp_min(1e-300)
    scaled = basis / scale.unsqueeze(-2)
    gram = scaled.mT @ scaled / n
    if penalty is not None:
        gram = gram + penalty / (scale.unsqueeze(-1) * scale.unsqueeze(-2))
    extra = ridge + jitter
    gram.diagonal(dim1=-2, dim2=-1).add_(extra if diagonal is None else diagonal / scale**2 + extra)
    rhs = scaled.mT @ target / n
    unpenalized = penalty is None and diagonal is None and ridge == 0
    solution = torch.linalg.lstsq(gram, rhs).solution if unpenalized else torch.linalg.solve(gram, rhs)
    return solution / (scale if target.dim() == 1 else scale.unsqueeze(-1))
