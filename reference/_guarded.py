r"""The guarded entropy where :math:`H - G` cancels, in a form that does not.

The engine computes the guarded entropy :math:`H_\varepsilon = -\sum_i p_i
\log(p_i + \varepsilon)` as :math:`H - G` (:func:`._engine.entropy_ball`). Near
the rows where :math:`H_\varepsilon` vanishes, that difference loses every bit: for
the row :math:`(0, -a)` with :math:`\varepsilon = 1/2`, :math:`H_\varepsilon \approx
-3a^2/32` while :math:`H` and :math:`G` are both near :math:`\log 2`, so
:math:`a = 10^{-140}` needed more than the reference's 960 bits, and at
:math:`a = 10^{-10}` a zero midpoint was rounded to ``+0.0`` where the exact value
is negative (float16's ``-0.0``).

**The form used here.** With :math:`q = 1 - \varepsilon`, each term
:math:`f(p) = -p \log(p + \varepsilon)` vanishes at :math:`p = q`. Split the items
into a set :math:`N` (those with :math:`p_i \ge q/2`, a choice that only affects
accuracy) and the rest :math:`F`, write :math:`d_i = p_i - q` and use
:math:`\sum_i p_i = 1`:

.. math::

   H_\varepsilon = q\,(q|N| - 1) + \sum_{i \in F} p_i\,\bigl(q - \log(p_i + \varepsilon)\bigr)
                   + \sum_{i \in N} g(d_i),
   \qquad g(d) = q d - (q + d)\log(1 + d).

Every term of the middle sum is positive (:math:`p_i + \varepsilon < 1` on
:math:`F`), and :math:`g \le 0` with :math:`g(0) = 0`
(:math:`g'(d) = -\log(1 + d) - d(1 - q)/(1 + d)` has the sign of :math:`-d`), with
:math:`g(d) \approx -(1 - q/2)\,d^2` near 0. When :math:`q|N| = 1` (:math:`c` tied
maxima and :math:`\varepsilon = 1 - 1/c`, or :math:`|N|` near-tied items) the
constant vanishes and no sum cancels against another: the result keeps its relative
accuracy however small it is, and its sign.

That needs each :math:`d_i` to an error small against the largest :math:`|d_j|`.
With :math:`m_i = e^{z_i} - 1` (an ``expm1``, accurate near 0) for the items of
:math:`N`, :math:`W = \sum_N m_j + \sum_F e^{z_j}` and :math:`s = |N| + W`,

.. math:: d_i\,s = (1 - q|N|) + m_i - qW,

whose terms are each within a few :math:`s \max_j |d_j|` when :math:`q|N| = 1`
(:math:`m_i - m_j = s(d_i - d_j)` and :math:`qF = -\sum_N d_j s / |N|`).

**Rigour.** Everything is evaluated in mpmath's interval arithmetic (outward
rounding, unbounded exponents, no item dropped as negligible), as the attention
outputs beyond 960 bits are (:mod:`._attention_interval`). :math:`g` is monotone on
each side of 0, so :math:`g` over an interval of :math:`d` is bounded by its values
at the ends, each evaluated at a point with :math:`\log(1 + d)` taken from the exact
:math:`1 + d` at enough extra bits to keep :math:`g`'s relative accuracy
(:math:`q d - (q + d)\log(1 + d) = q(d - \log(1 + d)) - d \log(1 + d)`, with
:math:`q` entering once).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np
from mpmath import mp
from mpmath.ctx_iv import MPIntervalContext
from mpmath.libmp import (
    fone,
    fzero,
    mpf_add,
    mpf_cmp,
    mpf_div,
    mpf_neg,
    mpf_shift,
    mpf_sign,
    mpf_sub,
    round_ceiling,
    to_float,
)

from ._engine import Ball, PreparedRow

__all__ = ["guarded_entropy_ball"]

#: Extra bits of the intervals over the engine's working precision.
GUARD_BITS = 24


def _point(ctx: MPIntervalContext, x: tuple) -> Any:
    """An exact mpf tuple as a point interval."""
    return ctx.mpf(mp.make_mpf(x))


def _rational(ctx: MPIntervalContext, value: Fraction) -> Any:
    """An interval holding the rational `value` (a point where it is a short dyadic)."""
    return ctx.mpf(value.numerator) / ctx.mpf(value.denominator)


def _mag(x: tuple) -> int:
    return int(x[2]) + int(x[3])


def _expm1(ctx: MPIntervalContext, z: tuple, prec: int) -> Any:
    r""":math:`e^{z} - 1` for an exact :math:`z \le 0`, to a relative width near ``2**-prec``."""
    if z == fzero:
        return ctx.mpf(0)
    saved = ctx.prec
    ctx.prec = prec + max(0, -_mag(z)) + 8
    try:
        return ctx.exp(_point(ctx, z)) - 1
    finally:
        ctx.prec = saved


def _g_at(ctx: MPIntervalContext, d: tuple, q: Any, prec: int) -> Any | None:
    r""":math:`g(d) = q(d - \log(1 + d)) - d\log(1 + d)` at an exact point `d`.

    ``None`` where :math:`d \le -1` (an interval of :math:`d` too wide for the row).
    """
    if d == fzero:
        return ctx.mpf(0)
    one_plus = mpf_add(fone, d, 0)  # exact
    if mpf_sign(one_plus) <= 0:
        return None
    saved = ctx.prec
    # log(1 + d) to a relative 2**-(prec + 8) of d, so that d - log(1 + d) ~ d**2 / 2 keeps it
    ctx.prec = prec + max(0, -_mag(d)) + 8
    try:
        dd = _point(ctx, d)
        lg = ctx.log(_point(ctx, one_plus))
        return q * (dd - lg) - dd * lg
    finally:
        ctx.prec = saved


def _g(ctx: MPIntervalContext, d: Any, q: Any, prec: int) -> Any | None:
    """:math:`g` over the interval `d` (monotone on each side of 0), or None."""
    lo, hi = d._mpi_
    g_lo = _g_at(ctx, lo, q, prec)
    g_hi = _g_at(ctx, hi, q, prec)
    if g_lo is None or g_hi is None:
        return None
    if mpf_sign(lo) >= 0:  # decreasing: [g(hi), g(lo)]
        return ctx.mpf([mp.make_mpf(g_hi._mpi_[0]), mp.make_mpf(g_lo._mpi_[1])])
    if mpf_sign(hi) <= 0:  # increasing: [g(lo), g(hi)]
        return ctx.mpf([mp.make_mpf(g_lo._mpi_[0]), mp.make_mpf(g_hi._mpi_[1])])
    low = g_lo._mpi_[0] if mpf_cmp(g_lo._mpi_[0], g_hi._mpi_[0]) <= 0 else g_hi._mpi_[0]
    return ctx.mpf([mp.make_mpf(low), mp.mpf(0)])


def guarded_entropy_ball(row: PreparedRow, p: int, eps: float) -> Ball | None:
    r"""The guarded entropy of `row` as a ball, from the cancellation-free form above.

    Parameters
    ----------
    row : PreparedRow
        The row, in exact arithmetic (every unmasked item is used; none is dropped).
    p : int
        The engine's working precision; the intervals carry :data:`GUARD_BITS` more.
    eps : float
        The guard :math:`\varepsilon \in (0, 1]`.

    Returns
    -------
    Ball or None
        A ball holding :math:`H_\varepsilon` (relative bound where the interval
        excludes 0, absolute where it holds 0), or ``None`` when an interval of some
        :math:`d_i` is too wide to evaluate (a precision too low for the row).
    """
    ctx = MPIntervalContext()
    prec = p + GUARD_BITS
    ctx.prec = prec
    qf = 1 - Fraction(eps)
    q = _rational(ctx, qf)
    # which items go to N: an estimate (any split is exact; this one keeps the terms small)
    with np.errstate(over="ignore", under="ignore"):
        est = np.exp(-row.zabs)
    est_p = est / float(est.sum())
    near = est_p >= float(qf) / 2.0  # (the maxima share one estimate)
    c = int(row.ones.sum())
    near_max = bool(near[row.ones].any())
    n_near = int(near.sum())

    items = [k for k in range(row.n_eff) if not row.ones[k]]
    m = {k: _expm1(ctx, row.z[k], prec) for k in items if near[k]}
    e = {k: ctx.exp(_point(ctx, row.z[k])) for k in items if not near[k]}
    W = sum(m.values(), ctx.mpf(0)) + sum(e.values(), ctx.mpf(0))
    if c and not near_max:
        W += c
    s = n_near + W
    K = 1 - qf * n_near  # exact
    Kq = _rational(ctx, K)
    qW = q * W

    total = _rational(ctx, -qf * K)
    groups: list[tuple[Any, int]] = [(m[k], 1) for k in m]
    if near_max:
        groups.append((ctx.mpf(0), c))
    for mk, count in groups:
        gk = _g(ctx, (Kq + mk - qW) / s, q, prec)
        if gk is None:
            return None
        total += count * gk
    eps_i = ctx.mpf(eps)
    far = [(ek, 1) for ek in e.values()]
    if c and not near_max:
        far.append((ctx.mpf(1), c))
    for ek, count in far:
        pk = ek / s
        total += count * (pk * (q - ctx.log(pk + eps_i)))
    return _ball(total._mpi_)


def _ball(ends: tuple[tuple, tuple]) -> Ball:
    """The ball of an interval: its midpoint, with a relative bound (an absolute one across 0)."""
    lo, hi = ends
    if lo == hi:
        return Ball(lo, 0.0)
    mid = mpf_shift(mpf_add(lo, hi, 0), -1)  # exact
    radius = mpf_shift(mpf_sub(hi, lo, 0), -1)
    if mpf_sign(lo) > 0 or mpf_sign(hi) < 0:
        size = mid if mpf_sign(mid) > 0 else mpf_neg(mid)
        ratio = to_float(mpf_div(radius, size, 60, round_ceiling), rnd="u")
        return Ball(mid, max(ratio, 5e-324) * (1.0 + 2.0**-20))
    return Ball(mid, 0.0, _mag(radius) + 1)
