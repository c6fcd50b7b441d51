r"""Second moments of the layers' random estimators over their projections (Prop. 1, Prop. 2): pure math.

Every function here takes, per (input, weight row) pair, the pre-activation $t = \tilde x \cdot \tilde w$ and
the squared norms $\lVert\tilde x\rVert^2$, $\lVert\tilde w\rVert^2$ of the vectors the features see, and
returns the covariance of one projection's estimators for that pair (divide by the number of i.i.d.
$\mathcal N(0, I)$ projection rows $m$ for the average of $m$). Inputs broadcast against each other.

- Complex exponentials (Prop. 1, with the cross moment). At frequency $s$, with
  $\xi \sim \mathcal N(0, \sigma^2)$, $\sigma^2 = s \lVert\tilde x + \tilde w\rVert^2 / 2$,
  $H = s (\lVert\tilde x\rVert^2 + \lVert\tilde w\rVert^2) / 2$, $Y^c = e^\xi \cos(\xi - H)$,
  $Y^s = e^\xi \sin(\xi - H)$:
  $\mathbb E[(Y^c)^2] = \tfrac12 (e^{2\sigma^2} + \cos(4\sigma^2 - 2H))$,
  $\mathbb E[(Y^s)^2] = \tfrac12 (e^{2\sigma^2} - \cos(4\sigma^2 - 2H))$ and
  $\mathbb E[Y^c Y^s] = \tfrac12 \sin(4\sigma^2 - 2H)$ ($Y^c Y^s = \tfrac12 e^{2\xi} \sin(2\xi - 2H)$ and
  $\mathbb E\, e^{(2 + 2i) \xi} = e^{4 i \sigma^2}$); the means are $\cos(s t)$ and $\sin(s t)$.
- Product features (EUGen, Prop. 2): per row, $X_n = \prod_{i \le n} (g_i \cdot \tilde x)(g_i \cdot \tilde w)$
  has $\mathbb E[X_n X_{n'}] = M^{\min(n, n')} t^{|n - n'|}$ with
  $M = \lVert\tilde x\rVert^2 \lVert\tilde w\rVert^2 + 2 t^2$ (Isserlis, independent factors), the degrees
  sharing $G^{(1..\min)}$; the means are $t^n$.
"""

from __future__ import annotations

import torch


def node_covariance(
    freq: torch.Tensor | float,
    t: torch.Tensor,
    x_sq: torch.Tensor,
    w_sq: torch.Tensor,
    *,
    max_sigma2: float | None = None,
    log_scale: torch.Tensor | float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r"""$e^{-\ell}$ times the covariance of one projection's $(Y^c, Y^s)$, per pair (Prop. 1).

    $(\operatorname{Var} Y^c, \operatorname{Var} Y^s, \operatorname{Cov}(Y^c, Y^s))$ of the estimators of
    $(\cos(s t), \sin(s t))$ at frequency $s$ = ``freq``.

    Args:
        freq: $s$, broadcast against ``t``.
        t: pre-activations $\tilde x \cdot \tilde w$.
        x_sq: $\lVert\tilde x\rVert^2$.
        w_sq: $\lVert\tilde w\rVert^2$.
        max_sigma2: cap on $\sigma^2$ (float64 overflows at $2\sigma^2 > 709$), or None.
        log_scale: $\ell$, the log of a factor taken out of every entry (0: the covariance itself;
            $2\sigma^2$ from `node_log_growth` keeps it finite for any $\sigma^2$).

    Returns:
        ``(cc, ss, cs)``, broadcast shapes.
    """
    # in-place steps where a value is not needed again: a call on (frequencies x pairs) allocates 10
    # temporaries of that size instead of 30
    norm_sq = x_sq + w_sq
    sigma2 = freq / 2 * (norm_sq + 2 * t)  # a new tensor of the broadcast shape
    if max_sigma2 is not None:
        sigma2.clamp_max_(max_sigma2)
    big_h = freq / 2 * norm_sq
    growth = (2 * sigma2 - log_scale).exp_()
    shrink = torch.exp(-torch.as_tensor(log_scale, dtype=t.dtype))
    phase = sigma2.mul_(4).sub_(2 * big_h)  # 4 sigma^2 - 2 H
    arg = freq * t
    cos, sin = arg.cos(), arg.sin_()
    even = phase.cos().mul_(shrink)
    odd = phase.sin_().mul_(shrink)
    e_cc, e_ss, e_cs = (growth + even).div_(2), growth.sub_(even).div_(2), odd.div_(2)
    cross = (cos * sin).mul_(shrink)
    return e_cc.sub_(cos.pow_(2).mul_(shrink)), e_ss.sub_(sin.pow_(2).mul_(shrink)), e_cs.sub_(cross)


def node_log_growth(
    freq: torch.Tensor | float, t: torch.Tensor, x_sq: torch.Tensor, w_sq: torch.Tensor
) -> torch.Tensor:
    r"""$2\sigma^2 = s \lVert\tilde x + \tilde w\rVert^2$: the log of $\mathbb E|Y|^2$ (Prop. 1), per pair."""
    return freq * (x_sq + w_sq + 2 * t)


def product_covariance(
    t: torch.Tensor, x_sq: torch.Tensor, w_sq: torch.Tensor, degree: int
) -> list[list[torch.Tensor]]:
    r"""$\operatorname{Cov}(X_n, X_{n'})$ for $n, n' = 0..K$, per pair (Prop. 2, shared projections).

    $M^{\min(n, n')} t^{|n - n'|} - t^{n + n'}$ for $n, n' \ge 1$; row and column 0 (the exact $t^0$) are 0.

    Returns:
        a $(K + 1) \times (K + 1)$ nested list of tensors shaped as ``t``.
    """
    big_m = x_sq * w_sq + 2 * t**2
    zero = torch.zeros_like(t)
    return [
        [big_m ** min(n, k) * t ** abs(n - k) - t ** (n + k) if n and k else zero for k in range(degree + 1)]
        for n in range(degree + 1)
    ]
