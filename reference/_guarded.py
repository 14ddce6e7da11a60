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

**Rigour.** Everything is evaluated in mpmath's interval arithmetic
(:mod:`mpmath.libmp.libmpi`: outward rounding, unbounded exponents, no item dropped
as negligible; its exponential and logarithm widened by 16 units in the last place,
:func:`~softmaxtheory._certify.interval.iv_exp`, since mpmath rounds its own working
approximation outward, not the exact value), as the attention outputs beyond 960 bits are
(:mod:`._attention_interval`). :math:`g` is monotone on each side of 0, so :math:`g`
over an interval of :math:`d` is bounded by its values at the ends, each evaluated at
a point: with :math:`\log(1 + d)` from the exact :math:`1 + d` at enough extra bits to
keep :math:`g`'s relative accuracy (:math:`q d - (q + d)\log(1 + d) = q(d - \log(1 +
d)) - d \log(1 + d)`, with :math:`q` entering once), or, for
:math:`|d| < 2^{-\mathrm{prec} - 4}`, from its series: the coefficient of :math:`d^k`
in :math:`(q + d)\log(1 + d)` is :math:`(-1)^{k+1}q/k + (-1)^k/(k - 1)`, at most 1 in
magnitude for :math:`k \ge 2`, so

.. math:: g(d) \in -(1 - q/2)\,d^2 + [-2|d|^3, 2|d|^3] \quad (|d| \le 1/2),

a relative enclosure within :math:`4|d|`. (An exact :math:`1 + d` for
:math:`d \approx -e^{-10^{308}}`, tied maxima beside a far item, has
:math:`10^{308}` bits.)
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from mpmath.libmp import (
    fone,
    from_int,
    from_rational,
    fzero,
    mpf_abs,
    mpf_add,
    mpf_cmp,
    mpf_div,
    mpf_mul,
    mpf_neg,
    mpf_shift,
    mpf_sign,
    mpf_sub,
    round_ceiling,
    round_floor,
    round_nearest,
    to_float,
)
from mpmath.libmp.libmpi import mpi_add, mpi_div, mpi_mul, mpi_neg, mpi_sub

from softmaxtheory._certify.interval import iv_exp, iv_log

from ._engine import Ball, PreparedRow

__all__ = ["guarded_entropy_ball"]

#: Extra bits of the intervals over the engine's working precision.
GUARD_BITS = 24

Interval = tuple[tuple, tuple]  # (lower end, upper end), mpf tuples
_ZERO: Interval = (fzero, fzero)
_ONE: Interval = (fone, fone)


def _rational(value: Fraction, prec: int) -> Interval:
    """An interval holding the rational `value`, its ends rounded outward to `prec` bits."""
    num, den = value.numerator, value.denominator
    return (
        from_rational(num, den, prec, round_floor),
        from_rational(num, den, prec, round_ceiling),
    )


def _mag(x: tuple) -> int:
    return int(x[2]) + int(x[3])


def _expm1(z: tuple, prec: int) -> Interval:
    r""":math:`e^{z} - 1` for an exact :math:`z \le 0`, to a relative width near ``2**-prec``."""
    if z == fzero:
        return _ZERO
    wide = prec + max(0, -_mag(z)) + 8
    return mpi_sub(iv_exp((z, z), wide), _ONE, wide)


def _g_at(d: tuple, q: Interval, prec: int) -> Interval | None:
    r""":math:`g(d) = q(d - \log(1 + d)) - d\log(1 + d)` at an exact point `d`.

    ``None`` where :math:`d \le -1` (an interval of :math:`d` too wide for the row).
    """
    if d == fzero:
        return _ZERO
    if _mag(d) < -prec - 4:
        # the series: -(1 - q/2) d**2 within 2|d|**3
        half_q = (mpf_shift(q[0], -1), mpf_shift(q[1], -1))
        c = mpi_sub(_ONE, half_q, prec)
        d2 = mpf_mul(d, d)  # exact
        cube = mpf_shift(mpf_mul(d2, mpf_abs(d), 60, round_ceiling), 1)
        return mpi_add(mpi_mul(mpi_neg(c), (d2, d2), prec), (mpf_neg(cube), cube), prec)
    one_plus = mpf_add(fone, d, 0)  # exact: d is not far below 2**-prec
    if mpf_sign(one_plus) <= 0:
        return None
    # log(1 + d) to a relative 2**-(prec + 8) of d, so that d - log(1 + d) ~ d**2 / 2 keeps it
    wide = prec + max(0, -_mag(d)) + 8
    point = (d, d)
    lg = iv_log((one_plus, one_plus), wide)
    return mpi_sub(mpi_mul(q, mpi_sub(point, lg, wide), wide), mpi_mul(point, lg, wide), wide)


def _g(d: Interval, q: Interval, prec: int) -> Interval | None:
    """:math:`g` over the interval `d` (monotone on each side of 0), or None."""
    lo, hi = d
    g_lo = _g_at(lo, q, prec)
    g_hi = g_lo if hi == lo else _g_at(hi, q, prec)
    if g_lo is None or g_hi is None:
        return None
    if mpf_sign(lo) >= 0:  # decreasing: [g(hi), g(lo)]
        return g_hi[0], g_lo[1]
    if mpf_sign(hi) <= 0:  # increasing: [g(lo), g(hi)]
        return g_lo[0], g_hi[1]
    return (g_lo[0] if mpf_cmp(g_lo[0], g_hi[0]) <= 0 else g_hi[0]), fzero


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
    prec = p + GUARD_BITS
    qf = 1 - Fraction(eps)
    q = _rational(qf, prec)
    # which items go to N: an estimate (any split is exact; this one keeps the terms small)
    with np.errstate(over="ignore", under="ignore"):
        est = np.exp(-row.zabs)
    near = est / float(est.sum()) >= float(qf) / 2.0  # (the maxima share one estimate)
    c = int(row.ones.sum())
    near_max = bool(near[row.ones].any())
    n_near = int(near.sum())

    m: list[Interval] = []
    e: list[Interval] = []
    W = _ZERO
    for k in np.flatnonzero(~row.ones).tolist():
        z = row.z[k]
        if near[k]:
            m.append(_expm1(z, prec))
            W = mpi_add(W, m[-1], prec)
        else:
            e.append(iv_exp((z, z), prec))
            W = mpi_add(W, e[-1], prec)
    groups = [(mk, 1) for mk in m]
    far = [(ek, 1) for ek in e]
    if c:
        (groups if near_max else far).append((_ZERO if near_max else _ONE, c))
        if not near_max:
            W = mpi_add(W, (from_int(c), from_int(c)), prec)
    s = mpi_add((from_int(n_near), from_int(n_near)), W, prec)
    K = 1 - qf * n_near  # exact
    base = mpi_sub(_rational(K, prec), mpi_mul(q, W, prec), prec)  # (1 - q|N|) - qW

    total = _rational(-qf * K, prec)
    for mk, count in groups:
        gk = _g(mpi_div(mpi_add(base, mk, prec), s, prec), q, prec)
        if gk is None:
            return None
        total = mpi_add(total, mpi_mul(gk, _count(count), prec), prec)
    eps_i = _rational(Fraction(eps), prec)
    for ek, count in far:
        pk = mpi_div(ek, s, prec)
        hk = mpi_mul(pk, mpi_sub(q, iv_log(mpi_add(pk, eps_i, prec), prec), prec), prec)
        total = mpi_add(total, mpi_mul(hk, _count(count), prec), prec)
    return _ball(total, prec)


def _count(count: int) -> Interval:
    n = from_int(count)
    return n, n


def _ball(ends: Interval, prec: int) -> Ball:
    """The ball of an interval: its midpoint, with a relative bound (an absolute one across 0)."""
    lo, hi = ends
    if lo == hi:
        return Ball(lo, 0.0)
    # (rounded: ends of very different magnitudes would make an exact sum enormous)
    mid = mpf_shift(mpf_add(lo, hi, prec + 8, round_nearest), -1)
    radius = mpf_sub(hi, mid, 60, round_ceiling)
    other = mpf_sub(mid, lo, 60, round_ceiling)
    if mpf_cmp(other, radius) > 0:
        radius = other
    if mpf_sign(lo) > 0 or mpf_sign(hi) < 0:
        ratio = to_float(mpf_div(radius, mpf_abs(mid), 60, round_ceiling), rnd="u")
        return Ball(mid, max(ratio, 5e-324) * (1.0 + 2.0**-20))
    return Ball(mid, 0.0, _mag(radius) + 1)
