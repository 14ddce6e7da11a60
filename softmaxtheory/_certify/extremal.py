r"""The largest adaptive-softmax coefficient over all rows of `n` items, bounded from above.

Take a row whose largest logit is :math:`x_1` and write :math:`y_j = x_1 - x_j
\in [0, \delta]`. The row enters through the measure :math:`\nu = \sum_{j \ge 2}
\delta_{y_j}` of mass :math:`n - 1` on :math:`[0, \delta]`: with
:math:`S(t) = 1 + \int e^{-t y}\,d\nu` the top coefficient of the softmax at
inverse temperature :math:`t` is :math:`1/S(t)`, and the entropy of the plain
softmax is

.. math::

    H = \log S(1) + \frac{M}{S(1)}, \qquad M = \int y\, e^{-y}\, d\nu .

So :math:`H`, and with it :math:`\beta = \beta(H)`, depends on :math:`\nu` only
through the three moments :math:`\int 1`, :math:`\int e^{-y}` and
:math:`\int y e^{-y}`, and the adaptive top coefficient :math:`1/S(\beta)` is
largest where :math:`\int e^{-\beta y}\,d\nu` is smallest among the measures
with those moments. The four functions :math:`1, e^{-y}, y e^{-y}, e^{-\beta y}`
(:math:`\beta \ne 1`) form a Chebyshev system on :math:`[0, \delta]`: a
non-zero combination of them has at most three zeros (an exponential polynomial
with exponents :math:`0, -1` (twice) and :math:`-\beta`). By the Markov–Krein
theorem the extremes of :math:`\int e^{-\beta y}\,d\nu` over the measures with
given moments are attained at the two principal representations of the
moments, each one interior point and one end of :math:`[0, \delta]`. Every
row is therefore dominated by a measure (with real, not only integer, weights)
of one of two shapes:

``"bottom"``
    the top item, :math:`w` items at depth :math:`c` and :math:`n - 1 - w` at
    depth :math:`\delta`;
``"top"``
    :math:`n - w` items at the top and :math:`w` at depth :math:`c`.

Over :math:`(c, w) \in [0, \delta] \times [0, n - 1]` the coefficient is
bounded by branch and bound in interval arithmetic: on a box, :math:`H`
is enclosed, :math:`\beta` bounded above on that range of entropies
(:func:`~softmaxtheory._certify.adaptive.beta_up_on`), and :math:`S(\beta)`
bounded below by its value at the corner that minimises it (it decreases in
:math:`\beta` and :math:`c`, and is monotone in :math:`w`). Boxes whose bound
cannot beat the best value found at a box's centre are dropped; the answer is
the largest bound left, or that best value if it is larger.

The same shapes with the counts free, :math:`w` items at the level and
:math:`z` at the bottom (or :math:`z` more at the top), cover every length
:math:`1 + w + z` at once: :func:`below_from` proves that no row of any length
in a range reaches a level, and :func:`dispersion_upper` bisects with it for
the adaptive dispersion size.
"""

from __future__ import annotations

import heapq
import math
from fractions import Fraction
from functools import lru_cache
from typing import NamedTuple

from mpmath import libmp

from ..spec import Polynomial
from . import interval as ivl
from .adaptive import beta_up_on

__all__ = ["FAMILIES", "adaptive_top_upper", "below_from", "dispersion_upper"]

#: The two shapes of rows that dominate every row (see the module docstring).
FAMILIES = ("bottom", "top")

_PREC = 64


class _Box(NamedTuple):
    family: str
    c0: Fraction
    c1: Fraction
    w0: Fraction
    w1: Fraction


def _iv(lo: Fraction, hi: Fraction | None = None) -> ivl.Interval:
    a = ivl.iv_fraction(lo, _PREC)
    b = a if hi is None or hi == lo else ivl.iv_fraction(hi, _PREC)
    return a[0], b[1]


def _exp_neg(c0: Fraction, c1: Fraction) -> ivl.Interval:
    """An enclosure of :math:`e^{-c}` over an interval of c (it decreases in c)."""
    lo = ivl.iv_exp(ivl.iv_neg(_iv(c1)), _PREC)[0]
    hi = ivl.iv_exp(ivl.iv_neg(_iv(c0)), _PREC)[1]
    return lo, hi


def _parts(family: str, n: int, delta: Fraction, c: ivl.Interval) -> tuple[ivl.Interval, ...]:
    r"""``(s0, u, m0, v, du, dv)``: :math:`S = s_0 + w u`, :math:`M = m_0 + w v`, u' and v'."""
    p = _PREC
    e_c = ivl.iv_exp(ivl.iv_neg(c), p)
    ce_c = ivl.iv_mul(c, e_c, p)
    du = ivl.iv_neg(e_c)
    dv = ivl.iv_mul(ivl.iv_sub(ivl.iv_exact(1), c, p), e_c, p)
    if family == "bottom":
        s0, m0, e_d, de_d = _bottom_constants(n, delta)
        return s0, ivl.iv_sub(e_c, e_d, p), m0, ivl.iv_sub(ce_c, de_d, p), du, dv
    u = ivl.iv_sub(e_c, ivl.iv_exact(1), p)
    return _iv(Fraction(n)), u, ivl.iv_exact(0), ce_c, du, dv


@lru_cache(maxsize=64)
def _bottom_constants(n: int, delta: Fraction) -> tuple[ivl.Interval, ...]:
    r"""``(s0, m0, e^-δ, δ e^-δ)`` of the bottom shape: :math:`s_0 = 1 + (n-1)e^{-\delta}`."""
    p = _PREC
    e_d = _exp_neg(delta, delta)
    de_d = ivl.iv_mul(_iv(delta), e_d, p)
    s0 = ivl.iv_add(ivl.iv_exact(1), ivl.iv_mul(_iv(Fraction(n - 1)), e_d, p), p)
    m0 = ivl.iv_mul(_iv(Fraction(n - 1)), de_d, p)
    return s0, m0, e_d, de_d


def _entropy_at(
    family: str, n: int, delta: Fraction, c: ivl.Interval, w: ivl.Interval
) -> tuple[ivl.Interval, ivl.Interval, ivl.Interval]:
    """H, dH/dw and dH/dc enclosed over ``c`` and ``w`` (intervals)."""
    p = _PREC
    s0, u, m0, v, du, dv = _parts(family, n, delta, c)
    s = ivl.iv_add(s0, ivl.iv_mul(w, u, p), p)
    if libmp.mpf_lt(s[0], libmp.fone):  # the top item alone gives S >= 1
        s = (libmp.fone, s[1])
    m = ivl.iv_add(m0, ivl.iv_mul(w, v, p), p)
    q = ivl.iv_div(m, s, p)  # M / S
    h = ivl.iv_add(ivl.iv_log(s, p), q, p)
    # dH/dw = (u + v - q u) / S ; dH/dc = w (du + dv - q du) / S
    h_w = ivl.iv_div(ivl.iv_sub(ivl.iv_add(u, v, p), ivl.iv_mul(q, u, p), p), s, p)
    h_c = ivl.iv_div(
        ivl.iv_mul(w, ivl.iv_sub(ivl.iv_add(du, dv, p), ivl.iv_mul(q, du, p), p), p), s, p
    )
    return h, h_w, h_c


def _entropy(box: _Box, n: int, delta: Fraction) -> tuple[Fraction, Fraction]:
    """Rational bounds on the plain entropy of the rows of a box.

    The natural interval extension, intersected with the mean-value form
    :math:`H(m) + H_w(B)(w - m_w) + H_c(B)(c - m_c)`, whose excess shrinks with
    the square of the box's width.
    """
    p = _PREC
    c = _iv(box.c0, box.c1)
    w = _iv(box.w0, box.w1)
    h, h_w, h_c = _entropy_at(box.family, n, delta, c, w)
    cm, wm = (box.c0 + box.c1) / 2, (box.w0 + box.w1) / 2
    h_m = _entropy_at(box.family, n, delta, _iv(cm), _iv(wm))[0]
    dw = _iv(box.w0 - wm, box.w1 - wm)
    dc = _iv(box.c0 - cm, box.c1 - cm)
    mv = ivl.iv_add(h_m, ivl.iv_add(ivl.iv_mul(h_w, dw, p), ivl.iv_mul(h_c, dc, p), p), p)
    lo = max(ivl.to_fraction(h[0]), ivl.to_fraction(mv[0]))
    hi = min(ivl.to_fraction(h[1]), ivl.to_fraction(mv[1]))
    return lo, hi


def _upper(box: _Box, n: int, delta: Fraction, schedule: Polynomial) -> Fraction:
    """An upper bound on the top coefficient over the rows of a box.

    S at the largest β the box's entropies allow and at the corner of the box
    that minimises S (it decreases in β and c, and is monotone in w).
    """
    h_lo, h_hi = _entropy(box, n, delta)
    beta = Fraction(beta_up_on(schedule, max(h_lo, Fraction(0)), h_hi))
    p = _PREC
    b = _iv(beta)
    e_bc = ivl.iv_exp(ivl.iv_neg(ivl.iv_mul(b, _iv(box.c1), p)), p)
    if box.family == "bottom":
        # S(beta) = 1 + w e^{-beta c} + (n - 1 - w) e^{-beta delta}: least at w0, c1, beta
        e_bd = ivl.iv_exp(ivl.iv_neg(ivl.iv_mul(b, _iv(delta), p)), p)
        s = ivl.iv_add(
            ivl.iv_add(ivl.iv_exact(1), ivl.iv_mul(_iv(box.w0), e_bc, p), p),
            ivl.iv_mul(_iv(Fraction(n - 1) - box.w0), e_bd, p),
            p,
        )
    else:
        # S(beta) = n - w (1 - e^{-beta c}): least at w1, c1, beta
        s = ivl.iv_sub(
            _iv(Fraction(n)), ivl.iv_mul(_iv(box.w1), ivl.iv_sub(ivl.iv_exact(1), e_bc, p), p), p
        )
    low = ivl.to_fraction(s[0])
    return Fraction(1) / max(low, Fraction(1))


def _value(box: _Box, n: int, delta: float, schedule: Polynomial) -> float:
    """The top coefficient at the box's centre, in floats (only guides the search)."""
    w = float((box.w0 + box.w1) / 2)
    y = delta if box.family == "bottom" else 0.0
    return _guide(float((box.c0 + box.c1) / 2), w, n - 1 - w, y, schedule)


def _guide(c: float, w: float, z: float, y: float, schedule: Polynomial) -> float:
    """The adaptive top coefficient of the row (top item, w at depth c, z at depth y), in floats.

    Only guides the searches (no bound rests on it); 0.0 where floats overflow.
    """
    try:
        s1 = 1 + w * math.exp(-c) + z * math.exp(-y)
        h = math.log(s1) + (w * c * math.exp(-c) + z * y * math.exp(-y)) / s1
        beta = 1.0
        if h > schedule.exact_threshold:
            horner = 0.0
            for coefficient in _float_coefficients(schedule):
                horner = horner * h + coefficient
            beta = max(horner, 1.0)
        return 1 / (1 + w * math.exp(-beta * c) + z * math.exp(-beta * y))
    except (OverflowError, ValueError, ZeroDivisionError):  # counts beyond the float range
        return 0.0


def _log_ratio(hi: Fraction, lo: Fraction) -> float:
    r"""About :math:`\log((hi + 1) / (lo + 1))` for counts, in nats."""
    r = (hi + 1) / (lo + 1)
    bits = r.numerator.bit_length() - r.denominator.bit_length()
    return bits * 0.6931471805599453 if abs(bits) > 900 else math.log(float(r))


def _geometric(lo: Fraction, hi: Fraction) -> Fraction:
    """A split point of a count range, near the geometric mean of lo + 1 and hi + 1."""
    mid = Fraction(math.isqrt(int((lo + 1) * (hi + 1)))) - 1
    margin = (hi - lo) / 8
    return min(max(mid, lo + margin), hi - margin)


@lru_cache(maxsize=64)
def _float_coefficients(schedule: Polynomial) -> tuple[float, ...]:
    return tuple(float(c) for c in schedule.exact_coefficients)


def _split(box: _Box, n: int, delta: Fraction) -> tuple[_Box, _Box]:
    """Halve a box along its widest side, measured in nats of the exponents it moves.

    A level moves the exponents by its width; a count by the log of its ratio,
    on whichever side is small: the items at the level, or the others (the
    bottom's or the top's), which set the entropy when they are few.
    """
    c_width = float(box.c1 - box.c0)
    rest = Fraction(n - 1)
    w_ratio = _log_ratio(box.w1, box.w0)
    other_ratio = _log_ratio(rest - box.w0, rest - box.w1)
    if c_width >= max(w_ratio, other_ratio):
        mid = (box.c0 + box.c1) / 2
        return box._replace(c1=mid), box._replace(c0=mid)
    if w_ratio >= other_ratio:
        mid = _geometric(box.w0, box.w1)
    else:
        mid = rest - _geometric(rest - box.w1, rest - box.w0)
    return box._replace(w1=mid), box._replace(w0=mid)


def adaptive_top_upper(
    n: int,
    spread: float,
    schedule: Polynomial,
    *,
    known: float = 0.0,
    rel_tol: float = 1e-4,
    budget: int = 2000,
) -> Fraction:
    r"""An upper bound on the largest adaptive coefficient of any row of `n` items, spread ≤ δ.

    Branch and bound over the two dominating shapes (module docstring) until the
    bound is within `rel_tol` of a value the search reached, or `budget` boxes
    were bounded; either way the result bounds every row.

    Parameters
    ----------
    n : int
        Number of items, at least 2.
    spread : float
        Logit spread :math:`\delta > 0`.
    schedule : Polynomial
        The entropy-driven schedule.
    known : float, optional
        A coefficient some row reaches (the search's), to prune with from the start.
    rel_tol, budget
        When to stop: the bound within `rel_tol` of the best value reached, or
        `budget` boxes bounded.

    Returns
    -------
    Fraction
        The bound (rational; round it upward for a float).
    """
    delta = Fraction(spread)
    heap: list[tuple[Fraction, int, _Box]] = []
    best = float(known)
    count = 0
    for family in FAMILIES:
        box = _Box(family, Fraction(0), delta, Fraction(0), Fraction(n - 1))
        heapq.heappush(heap, (-_upper(box, n, delta, schedule), count, box))
        best = max(best, _value(box, n, spread, schedule))
        count += 1
    while heap:
        top = -heap[0][0]
        if top <= Fraction(best) * (1 + Fraction(rel_tol)) or count >= budget:
            return max(top, Fraction(best))
        _, _, box = heapq.heappop(heap)
        for child in _split(box, n, delta):
            bound = _upper(child, n, delta, schedule)
            best = max(best, _value(child, n, spread, schedule))
            count += 1
            if bound > Fraction(best):
                heapq.heappush(heap, (-bound, count, child))
    return Fraction(best)


# --------------------------------------------------------------------------- every length at once


class _Box3(NamedTuple):
    """Rows of the two shapes with the counts free: ``w`` items at depth c, ``z`` at depth y.

    ``y`` is δ (the bottom shape: z items at the bottom) or 0 (the top shape: z
    more items at the top); the row has ``1 + w + z`` items.
    """

    y: Fraction
    c0: Fraction
    c1: Fraction
    w0: Fraction
    w1: Fraction
    z0: Fraction
    z1: Fraction


def _entropy3(box: _Box3, c: ivl.Interval, w: ivl.Interval, z: ivl.Interval):
    """H and its slopes in (c, w, z), enclosed."""
    p = _PREC
    e_c = ivl.iv_exp(ivl.iv_neg(c), p)
    e_y = _exp_neg(box.y, box.y)
    y_e = ivl.iv_mul(_iv(box.y), e_y, p)
    c_e = ivl.iv_mul(c, e_c, p)
    s = ivl.iv_add(ivl.iv_add(ivl.iv_exact(1), ivl.iv_mul(w, e_c, p), p), ivl.iv_mul(z, e_y, p), p)
    if libmp.mpf_lt(s[0], libmp.fone):
        s = (libmp.fone, s[1])
    m = ivl.iv_add(ivl.iv_mul(w, c_e, p), ivl.iv_mul(z, y_e, p), p)
    q = ivl.iv_div(m, s, p)
    h = ivl.iv_add(ivl.iv_log(s, p), q, p)
    one_q = ivl.iv_sub(ivl.iv_exact(1), q, p)

    def slope(s_x: ivl.Interval, m_x: ivl.Interval) -> ivl.Interval:
        return ivl.iv_div(ivl.iv_add(ivl.iv_mul(s_x, one_q, p), m_x, p), s, p)

    h_w = slope(e_c, c_e)
    h_z = slope(e_y, y_e)
    h_c = slope(
        ivl.iv_neg(ivl.iv_mul(w, e_c, p)),
        ivl.iv_mul(w, ivl.iv_mul(ivl.iv_sub(ivl.iv_exact(1), c, p), e_c, p), p),
    )
    return h, h_w, h_z, h_c


def _entropy3_bounds(box: _Box3) -> tuple[Fraction, Fraction]:
    p = _PREC
    c, w, z = _iv(box.c0, box.c1), _iv(box.w0, box.w1), _iv(box.z0, box.z1)
    h, h_w, h_z, h_c = _entropy3(box, c, w, z)
    cm, wm, zm = (box.c0 + box.c1) / 2, (box.w0 + box.w1) / 2, (box.z0 + box.z1) / 2
    h_m = _entropy3(box, _iv(cm), _iv(wm), _iv(zm))[0]
    terms = (
        ivl.iv_mul(h_w, _iv(box.w0 - wm, box.w1 - wm), p),
        ivl.iv_mul(h_z, _iv(box.z0 - zm, box.z1 - zm), p),
        ivl.iv_mul(h_c, _iv(box.c0 - cm, box.c1 - cm), p),
    )
    mv = h_m
    for t in terms:
        mv = ivl.iv_add(mv, t, p)
    return (
        max(ivl.to_fraction(h[0]), ivl.to_fraction(mv[0])),
        min(ivl.to_fraction(h[1]), ivl.to_fraction(mv[1])),
    )


def _upper3(box: _Box3, least: Fraction, schedule: Polynomial) -> Fraction:
    """An upper bound on the top coefficient over the rows of a box with at least `least` items.

    S = 1 + w e^{-βc} + z e^{-βy} grows with w and z and falls with β and c: its
    least value on the box, cut by w + z >= least - 1, is at a vertex of that
    polygon, at the largest β and c.
    """
    h_lo, h_hi = _entropy3_bounds(box)
    beta = _iv(Fraction(beta_up_on(schedule, max(h_lo, Fraction(0)), h_hi)))
    p = _PREC
    e1 = ivl.to_fraction(ivl.iv_exp(ivl.iv_neg(ivl.iv_mul(beta, _iv(box.c1), p)), p)[0])
    e2 = ivl.to_fraction(ivl.iv_exp(ivl.iv_neg(ivl.iv_mul(beta, _iv(box.y), p)), p)[0])
    need = least - 1
    if box.w0 + box.z0 >= need:
        corners = [(box.w0, box.z0)]
    else:  # the two ends of the segment w + z = need inside the box
        w_a = max(box.w0, need - box.z1)
        z_b = max(box.z0, need - box.w1)
        corners = [(w_a, need - w_a), (need - z_b, z_b)]
    low = min(1 + w * e1 + z * e2 for w, z in corners)
    return 1 / max(low, Fraction(1))


def _value3(box: _Box3, least: Fraction, schedule: Polynomial) -> float:
    """The coefficient at a feasible point near the box's centre, in floats (a guide)."""
    c = float((box.c0 + box.c1) / 2)
    w = float((box.w0 + box.w1) / 2)
    z = float((box.z0 + box.z1) / 2)
    if 1 + w + z < least:  # move onto w + z = least - 1
        extra = float(least) - 1 - w - z
        w, z = w + extra / 2, z + extra / 2
    return _guide(c, w, z, float(box.y), schedule)


def _split3(box: _Box3) -> tuple[_Box3, _Box3]:
    widths = (
        (float(box.c1 - box.c0), "c"),
        (_log_ratio(box.w1, box.w0), "w"),
        (_log_ratio(box.z1, box.z0), "z"),
    )
    _, side = max(widths)
    if side == "c":
        mid = (box.c0 + box.c1) / 2
        return box._replace(c1=mid), box._replace(c0=mid)
    if side == "w":
        mid = _geometric(box.w0, box.w1)
        return box._replace(w1=mid), box._replace(w0=mid)
    mid = _geometric(box.z0, box.z1)
    return box._replace(z1=mid), box._replace(z0=mid)


def below_from(
    least: int, most: int, spread: float, schedule: Polynomial, eps: float, *, budget: int = 3000
) -> tuple[bool, int]:
    r"""Whether every row of `least` to `most` items, spread ≤ δ, stays below `eps` (proven).

    Branch and bound over both shapes with the counts free (rows of
    :math:`1 + w + z` items, :math:`w + z + 1 \in [least, most]`, real counts):
    proven when every box's bound is below `eps`; not when a guide point
    reaches it or the `budget` of boxes runs out (nothing is proven then).

    Returns
    -------
    tuple
        ``(proven, boxes)``: the verdict and the boxes bounded.
    """
    delta = Fraction(spread)
    target = Fraction(eps)
    lo, hi = Fraction(least), Fraction(most)
    stack = [
        _Box3(y, Fraction(0), delta, Fraction(0), hi - 1, Fraction(0), hi - 1)
        for y in (delta, Fraction(0))
    ]
    count = 0
    while stack:
        box = stack.pop()
        if box.w0 + box.z0 > hi - 1 or box.w1 + box.z1 < lo - 1:
            continue  # no length in range
        count += 1
        if count > budget:
            return False, count
        if _upper3(box, lo, schedule) < target:
            continue
        if _value3(box, lo, schedule) >= eps:
            return False, count
        stack.extend(_split3(box))
    return True, count


def dispersion_upper(
    eps: float, spread: float, schedule: Polynomial, lower: int, upper: int, budget: int
) -> int:
    r"""A length from which no row reaches `eps`, at most `upper` (proven from `upper` on).

    Bisects on :math:`\log n` between `lower` (a row one item shorter reaches
    `eps`) and `upper`: a proof that the lengths from `mid` to the current upper
    end stay below `eps` (:func:`below_from`) moves the upper end to `mid`.
    Stops when the two ends are within 1 % or `budget` boxes are spent.
    """
    lo, hi = lower, upper
    spent = 0
    while hi - lo > max(1, lo // 100) and spent < budget:
        mid = min(max(math.isqrt(lo * hi), lo + 1), hi - 1)
        proven, used = below_from(mid, hi, spread, schedule, eps, budget=budget - spent)
        spent += used
        if proven:
            hi = mid
        else:
            lo = mid
    return hi
