r"""Separable feature blocks: EUGen product features and complex-exponential estimators.

Product features estimate $(x \cdot w)^n$ (Sec. 2.2); the complex exponentials estimate $\cos(s t)$ and
$\sin(s t)$ (Secs. 2.3-2.4, Lemma 1).

Shapes: ``u`` is ``(..., D)`` (an augmented input $[x; 1]$ or weight row $[w; b]$), projections
``omega`` are ``(R, D)``, frequencies ``(R,)``.
"""

from __future__ import annotations

import torch


def complex_exponential_features(
    u: torch.Tensor, omega: torch.Tensor, freq: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""$z_r(u) = e^{Z_r} e^{i (Z_r - h_r)}$, $Z_r = \sqrt{s_r/2}\, \omega_r \cdot u$, $h_r = s_r \|u\|^2/2$.

    Lemma 1: for $\omega_r \sim \mathcal N(0, I)$, $\mathbb E[z_r(x) z_r(w)] = \exp(i s_r\, x \cdot w)$. With
    the complex $a = (1 + i) \sqrt{s/2}$ this is $\exp(a\, \omega \cdot u - a^2 \lVert u\rVert^2 / 2)$, the
    positive random feature of the softmax kernel $\exp(a^2 x \cdot w)$ continued to $a^2 = i s$.

    Args:
        u: ``(..., D)``.
        omega: ``(R, D)`` projections.
        freq: ``(R,)`` frequencies $s_r \ge 0$.

    Returns:
        ``(Re z, Im z)``, each ``(..., R)``.
    """
    z = (u @ omega.mT) * (freq / 2).sqrt()
    h = (freq / 2) * u.pow(2).sum(-1, keepdim=True)
    magnitude = z.exp()
    return magnitude * torch.cos(z - h), magnitude * torch.sin(z - h)


def cos_sin_estimate(
    x: torch.Tensor, w: torch.Tensor, omega: torch.Tensor, freq: float, weights: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Estimators $C \approx \cos(s\, x \cdot w)$, $S \approx \sin(s\, x \cdot w)$ (Eqs. 8-9), all row pairs.

    $C = \operatorname{Re} \sum_r a_r z_r(x) z_r(w)$, $S = \operatorname{Im}$ of the same, written with real
    features:

    $$
    \begin{aligned}
    C &= [\operatorname{Re} z(x), \operatorname{Im} z(x)]
      \cdot [\operatorname{Re} z(w), -\operatorname{Im} z(w)], \\
    S &= [\operatorname{Re} z(x), \operatorname{Im} z(x)]
      \cdot [\operatorname{Im} z(w), \operatorname{Re} z(w)].
    \end{aligned}
    $$

    Args:
        x: ``(N, D)``.
        w: ``(L, D)``.
        omega: ``(m, D)`` projections (rows $\sim \mathcal N(0, I)$).
        freq: the frequency $s$.
        weights: ``(m,)`` row weights $a_r$ (default $1/m$).

    Returns:
        ``(C, S)``, each ``(N, L)``.
    """
    m = omega.shape[0]
    a = torch.full((m,), 1.0 / m, dtype=x.dtype, device=x.device) if weights is None else weights
    s = torch.full((m,), float(freq), dtype=x.dtype, device=x.device)
    xr, xi = complex_exponential_features(x, omega, s)
    wr, wi = complex_exponential_features(w, omega, s)
    phi = torch.cat([xr, xi], -1)
    cos = phi @ torch.cat([a * wr, -a * wi], -1).mT
    sin = phi @ torch.cat([a * wi, a * wr], -1).mT
    return cos, sin


def product_features(u: torch.Tensor, projections: list[torch.Tensor]) -> list[torch.Tensor]:
    r"""EUGen product features $\phi_n(u)_r = \prod_{i \le n} (G^{(i)}_r \cdot u)$ for $n = 1..K$ (Sec. 2.2).

    With independent $G^{(i)}$ whose rows have $\mathbb E[g g^\top] = I$,
    $\frac1m \langle\phi_n(x), \phi_n(w)\rangle$ is unbiased for $(x \cdot w)^n$: the expectation of a product
    of independent factors is the product of the expectations $\mathbb E[(g \cdot x)(g \cdot w)] = x \cdot w$.

    Args:
        u: ``(..., D)``.
        projections: ``K`` matrices ``(m, D)``.

    Returns:
        ``[phi_1(u), ..., phi_K(u)]``, each ``(..., m)``.
    """
    out, running = [], None
    for g in projections:
        factor = u @ g.mT
        running = factor if running is None else running * factor
        out.append(running)
    return out
