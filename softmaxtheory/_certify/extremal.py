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

The formulas are written once against an interval arithmetic (:class:`_Mp`
or :class:`_Float`): a box is bounded in outward-rounded float intervals
(:mod:`.floativ`, about 60 µs a box where mpmath takes 450 µs), and in mpmath
where floats overflow. Box coordinates are floats (exact numbers, split at
float points; the top count rounded up, so the boxes cover it) up to
:math:`2^{1000}` items, and rationals beyond; whatever must be exact (the
corners of a length constraint, :math:`n - 1 - w`) is formed in rationals.
Float bounds are looser than mpmath's by about :math:`10^{-13}` relative, so
the boxes that decide the per-length answer are bounded again in mpmath
(:data:`_REFINE` at most): at 4,096 items and spread 5.69 the bracket stays
exact to the float.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from fractions import Fraction
from functools import lru_cache, partial
from typing import NamedTuple

from mpmath import libmp

from ..spec import Polynomial
from . import floativ as fv
from . import interval as ivl
from .adaptive import beta_up_float, beta_up_on

__all__ = ["FAMILIES", "adaptive_top_upper", "below_from", "dispersion_upper"]

#: The two shapes of rows that dominate every row (see the module docstring).
FAMILIES = ("bottom", "top")

_PREC = 64


#: A box's coordinates: floats (exact numbers, cheap to split) while the counts are well
#: inside the float range, else rationals.
Coordinate = float | Fraction

#: At most this many boxes of a final answer are bounded again in mpmath.
_REFINE = 200

#: Counts below this take float coordinates; beyond it, rational ones (hundreds of digits:
#: tens of milliseconds a box).
_FLOAT_COUNTS = 1 << 1000

#: Integers up to this are floats exactly.
_EXACT_INTS = 1 << 53


class _Box(NamedTuple):
    family: str
    c0: Coordinate
    c1: Coordinate
    w0: Coordinate
    w1: Coordinate


def _coordinate(most: int) -> type[float] | type[Fraction]:
    """The coordinate type of boxes whose counts reach `most`."""
    return float if most <= _FLOAT_COUNTS else Fraction


def _count_up(kind: type[float] | type[Fraction], count: int) -> Coordinate:
    """`count` as a coordinate at least it: the top of the boxes covers it.

    (A float past :math:`2^{53}` may round below the integer; boxes reaching past a
    length are then cut by the length test, not lost.)
    """
    if kind is Fraction:
        return Fraction(count)
    f = float(count)
    return math.nextafter(f, math.inf) if f < count else f


class _Mp:
    """Interval arithmetic at :data:`_PREC` bits (:mod:`.interval`): any magnitude, slow."""

    one = ivl.iv_exact(1)
    zero = ivl.iv_exact(0)
    neg = staticmethod(ivl.iv_neg)

    @staticmethod
    def point(value: Coordinate) -> ivl.Interval:
        if isinstance(value, float):
            return ivl.iv_exact(value)
        return ivl.iv_fraction(value, _PREC)

    @staticmethod
    def span(lo: Coordinate, hi: Coordinate | None = None) -> ivl.Interval:
        a = _Mp.point(lo)
        b = a if hi is None or hi == lo else _Mp.point(hi)
        return a[0], b[1]

    # the operations of .interval at this module's precision
    add = staticmethod(partial(ivl.iv_add, prec=_PREC))
    sub = staticmethod(partial(ivl.iv_sub, prec=_PREC))
    mul = staticmethod(partial(ivl.iv_mul, prec=_PREC))
    div = staticmethod(partial(ivl.iv_div, prec=_PREC))
    exp = staticmethod(partial(ivl.iv_exp, prec=_PREC))
    log = staticmethod(partial(ivl.iv_log, prec=_PREC))

    @staticmethod
    def ends(a: ivl.Interval) -> tuple[Fraction, Fraction]:
        return ivl.to_fraction(a[0]), ivl.to_fraction(a[1])

    @staticmethod
    def beta_up(schedule: Polynomial, lo: Fraction, hi: Fraction) -> float:
        return beta_up_on(schedule, max(lo, Fraction(0)), hi)

    @staticmethod
    def at_least_one(s: ivl.Interval) -> ivl.Interval:
        return (libmp.fone, s[1]) if libmp.mpf_lt(s[0], libmp.fone) else s

    @staticmethod
    def reciprocal_up(low: Fraction) -> Fraction:
        return 1 / max(low, Fraction(1))


class _Float:
    """The same operations on float pairs (:mod:`.floativ`): fast, within the float range."""

    one = (1.0, 1.0)
    zero = (0.0, 0.0)
    neg = staticmethod(fv.neg)
    add = staticmethod(fv.add)
    sub = staticmethod(fv.sub)
    mul = staticmethod(fv.mul)
    div = staticmethod(fv.div)
    exp = staticmethod(fv.exp)
    log = staticmethod(fv.log)

    @staticmethod
    def span(lo: Coordinate, hi: Coordinate | None = None) -> fv.FloatInterval:
        return fv.point(lo) if hi is None else fv.span(lo, hi)

    @staticmethod
    def ends(a: fv.FloatInterval) -> fv.FloatInterval:
        return a

    @staticmethod
    def beta_up(schedule: Polynomial, lo: float, hi: float) -> float:
        return beta_up_float(schedule, max(lo, 0.0), hi)

    @staticmethod
    def at_least_one(s: fv.FloatInterval) -> fv.FloatInterval:
        return (1.0, s[1]) if s[0] < 1.0 else s

    @staticmethod
    def reciprocal_up(low: float) -> float:
        # a coefficient is at most 1 (S >= 1): keep the bound there, not an ulp above
        return min(math.nextafter(1.0 / max(low, 1.0), math.inf), 1.0)


_Arith = type[_Mp] | type[_Float]


def _bounded(
    evaluate: Callable[[_Arith], Fraction | float], *, fine: bool = False
) -> Fraction | float:
    """`evaluate` in floats where they suffice, else (past the float range) in mpmath.

    ``fine=True`` asks for mpmath: its bounds are tighter than the floats' by about
    :math:`10^{-13}` relative, which matters only for the last digits of a final answer.
    """
    if not fine:
        try:
            return evaluate(_Float)
        except (OverflowError, ZeroDivisionError, ValueError):
            pass  # a magnitude beyond the floats: the same bound in mpmath
    return evaluate(_Mp)


def _exp_neg(ar: _Arith, c0: Fraction, c1: Fraction):
    """An enclosure of :math:`e^{-c}` over an interval of c (it decreases in c)."""
    return ar.exp(ar.neg(ar.span(c1)))[0], ar.exp(ar.neg(ar.span(c0)))[1]


def _parts(ar: _Arith, family: str, n: int, delta: Fraction, c):
    r"""``(s0, u, m0, v, du, dv)``: :math:`S = s_0 + w u`, :math:`M = m_0 + w v`, u' and v'."""
    e_c = ar.exp(ar.neg(c))
    ce_c = ar.mul(c, e_c)
    du = ar.neg(e_c)
    dv = ar.mul(ar.sub(ar.one, c), e_c)
    if family == "bottom":
        s0, m0, e_d, de_d = _bottom_constants(ar, n, delta)
        return s0, ar.sub(e_c, e_d), m0, ar.sub(ce_c, de_d), du, dv
    return ar.span(Fraction(n)), ar.sub(e_c, ar.one), ar.zero, ce_c, du, dv


@lru_cache(maxsize=64)
def _bottom_constants(ar: _Arith, n: int, delta: Fraction):
    r"""``(s0, m0, e^-δ, δ e^-δ)`` of the bottom shape: :math:`s_0 = 1 + (n-1)e^{-\delta}`."""
    e_d = _exp_neg(ar, delta, delta)
    de_d = ar.mul(ar.span(delta), e_d)
    rest = ar.span(Fraction(n - 1))
    return ar.add(ar.one, ar.mul(rest, e_d)), ar.mul(rest, de_d), e_d, de_d


def _entropy_at(ar: _Arith, family: str, n: int, delta: Fraction, c, w):
    """H, dH/dw and dH/dc enclosed over ``c`` and ``w`` (intervals)."""
    s0, u, m0, v, du, dv = _parts(ar, family, n, delta, c)
    s = ar.at_least_one(ar.add(s0, ar.mul(w, u)))  # the top item alone gives S >= 1
    m = ar.add(m0, ar.mul(w, v))
    q = ar.div(m, s)  # M / S
    h = ar.add(ar.log(s), q)
    # dH/dw = (u + v - q u) / S ; dH/dc = w (du + dv - q du) / S
    h_w = ar.div(ar.sub(ar.add(u, v), ar.mul(q, u)), s)
    h_c = ar.div(ar.mul(w, ar.sub(ar.add(du, dv), ar.mul(q, du))), s)
    return h, h_w, h_c


def _entropy(ar: _Arith, box: _Box, n: int, delta: Fraction) -> tuple[Fraction, Fraction]:
    """Rational bounds on the plain entropy of the rows of a box.

    The natural interval extension, intersected with the mean-value form
    :math:`H(m) + H_w(B)(w - m_w) + H_c(B)(c - m_c)`, whose excess shrinks with
    the square of the box's width.
    """
    c = ar.span(box.c0, box.c1)
    w = ar.span(box.w0, box.w1)
    h, h_w, h_c = _entropy_at(ar, box.family, n, delta, c, w)
    cm, wm = (box.c0 + box.c1) / 2, (box.w0 + box.w1) / 2
    h_m = _entropy_at(ar, box.family, n, delta, ar.span(cm), ar.span(wm))[0]
    dw = ar.sub(ar.span(box.w0, box.w1), ar.span(wm))
    dc = ar.sub(ar.span(box.c0, box.c1), ar.span(cm))
    mv = ar.add(h_m, ar.add(ar.mul(h_w, dw), ar.mul(h_c, dc)))
    (h_lo, h_hi), (mv_lo, mv_hi) = ar.ends(h), ar.ends(mv)
    return max(h_lo, mv_lo), min(h_hi, mv_hi)


def _upper(
    box: _Box, n: int, delta: Fraction, schedule: Polynomial, *, fine: bool = False
) -> Fraction | float:
    """An upper bound on the top coefficient over the rows of a box (:func:`_upper_in`)."""
    return _bounded(lambda ar: _upper_in(ar, box, n, delta, schedule), fine=fine)


def _upper_in(
    ar: _Arith, box: _Box, n: int, delta: Fraction, schedule: Polynomial
) -> Fraction | float:
    """An upper bound on the top coefficient over the rows of a box, in the arithmetic `ar`.

    S at the largest β the box's entropies allow and at the corner of the box
    that minimises S (it decreases in β and c, and is monotone in w).
    """
    h_lo, h_hi = _entropy(ar, box, n, delta)
    b = ar.span(ar.beta_up(schedule, h_lo, h_hi))
    e_bc = ar.exp(ar.neg(ar.mul(b, ar.span(box.c1))))
    if box.family == "bottom":
        # S(beta) = 1 + w e^{-beta c} + (n - 1 - w) e^{-beta delta}: least at w0, c1, beta
        e_bd = ar.exp(ar.neg(ar.mul(b, ar.span(delta))))
        s = ar.add(
            ar.add(ar.one, ar.mul(ar.span(box.w0), e_bc)),
            ar.mul(ar.span((n - 1) - Fraction(box.w0)), e_bd),  # exact: w0 may be near n - 1
        )
    else:
        # S(beta) = n - w (1 - e^{-beta c}): least at w1, c1, beta
        s = ar.sub(ar.span(Fraction(n)), ar.mul(ar.span(box.w1), ar.sub(ar.one, e_bc)))
    return ar.reciprocal_up(ar.ends(s)[0])


def _value(box: _Box, n: int, delta: float, schedule: Polynomial) -> float:
    """The top coefficient at the box's centre, in floats (only guides the search).

    0.0 where the counts are beyond the float range (a guide value no row is below).
    """
    try:
        w = float((box.w0 + box.w1) / 2)
        rest = float(n - 1) - w
    except OverflowError:
        return 0.0
    y = delta if box.family == "bottom" else 0.0
    return _guide(float((box.c0 + box.c1) / 2), w, rest, y, schedule)


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


def _log_ratio(hi: Coordinate, lo: Coordinate) -> float:
    r"""About :math:`\log((hi + 1) / (lo + 1))` for counts, in nats."""
    if isinstance(hi, float):
        return math.log((hi + 1.0) / (lo + 1.0))
    r = (hi + 1) / (lo + 1)
    bits = r.numerator.bit_length() - r.denominator.bit_length()
    return bits * 0.6931471805599453 if abs(bits) > 900 else math.log(float(r))


def _geometric(lo: Coordinate, hi: Coordinate) -> Coordinate:
    """A split point of a count range, near the geometric mean of lo + 1 and hi + 1."""
    if isinstance(lo, float):  # (the product may pass the float range)
        mid = math.sqrt(lo + 1.0) * math.sqrt(hi + 1.0) - 1.0
    else:
        mid = Fraction(math.isqrt(int((lo + 1) * (hi + 1)))) - 1
    margin = (hi - lo) / 8
    return _within(min(max(mid, lo + margin), hi - margin), lo, hi)


def _within(mid: Coordinate, lo: Coordinate, hi: Coordinate) -> Coordinate:
    """`mid` moved into ``[lo, hi]`` (float rounding may leave it a little outside)."""
    return min(max(mid, lo), hi)


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
    rest = type(box.w1)(n - 1)
    w_ratio = _log_ratio(box.w1, box.w0)
    other_ratio = _log_ratio(rest - box.w0, rest - box.w1)
    if c_width >= max(w_ratio, other_ratio):
        mid = (box.c0 + box.c1) / 2
        return box._replace(c1=mid), box._replace(c0=mid)
    if w_ratio >= other_ratio:
        mid = _geometric(box.w0, box.w1)
    else:
        mid = _within(rest - _geometric(rest - box.w1, rest - box.w0), box.w0, box.w1)
    return box._replace(w1=mid), box._replace(w0=mid)


def adaptive_top_upper(
    n: int,
    spread: float,
    schedule: Polynomial,
    *,
    known: float = 0.0,
    rel_tol: float = 1e-4,
    budget: int = 10_000,
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
    kind = _coordinate(n)
    # entries (-bound, order, box, fine): `fine` where the bound is mpmath's
    heap: list[tuple[Fraction | float, int, _Box, bool]] = []
    best = float(known)
    count = refined = 0
    for family in FAMILIES:
        box = _Box(family, kind(0), kind(spread), kind(0), _count_up(kind, n - 1))
        heapq.heappush(heap, (-_upper(box, n, delta, schedule), count, box, False))
        best = max(best, _value(box, n, spread, schedule))
        count += 1
    while heap:
        top, order, box, fine = heap[0]
        top = -top
        if count >= budget:
            return Fraction(max(top, best))
        if top <= Fraction(best) * (1 + Fraction(rel_tol)):
            if fine or refined >= _REFINE:
                return Fraction(max(top, best))
            # the answer is the top bound: tighten it in mpmath (lazily, top box first)
            heapq.heappop(heap)
            refined += 1
            bound = _upper(box, n, delta, schedule, fine=True)
            if bound > best:
                heapq.heappush(heap, (-bound, order, box, True))
            continue
        heapq.heappop(heap)
        for child in _split(box, n, delta):
            bound = _upper(child, n, delta, schedule)
            best = max(best, _value(child, n, spread, schedule))
            count += 1
            if bound > best:
                heapq.heappush(heap, (-bound, count, child, False))
    return Fraction(best)


# --------------------------------------------------------------------------- every length at once


class _Box3(NamedTuple):
    """Rows of the two shapes with the counts free: ``w`` items at depth c, ``z`` at depth y.

    ``y`` is δ (the bottom shape: z items at the bottom) or 0 (the top shape: z
    more items at the top); the row has ``1 + w + z`` items.
    """

    y: Coordinate
    c0: Coordinate
    c1: Coordinate
    w0: Coordinate
    w1: Coordinate
    z0: Coordinate
    z1: Coordinate


@lru_cache(maxsize=64)
def _level_constants(ar: _Arith, y: Coordinate):
    r"""``(e^-y, y e^-y)`` of the items at depth y (0 or δ: the same for every box)."""
    e_y = _exp_neg(ar, y, y)
    return e_y, ar.mul(ar.span(y), e_y)


def _entropy3(ar: _Arith, box: _Box3, c, w, z):
    """H and its slopes in (c, w, z), enclosed."""
    e_c = ar.exp(ar.neg(c))
    e_y, y_e = _level_constants(ar, box.y)
    c_e = ar.mul(c, e_c)
    s = ar.at_least_one(ar.add(ar.add(ar.one, ar.mul(w, e_c)), ar.mul(z, e_y)))
    m = ar.add(ar.mul(w, c_e), ar.mul(z, y_e))
    q = ar.div(m, s)
    h = ar.add(ar.log(s), q)
    one_q = ar.sub(ar.one, q)

    def slope(s_x, m_x):
        return ar.div(ar.add(ar.mul(s_x, one_q), m_x), s)

    h_w = slope(e_c, c_e)
    h_z = slope(e_y, y_e)
    h_c = slope(ar.neg(ar.mul(w, e_c)), ar.mul(w, ar.mul(ar.sub(ar.one, c), e_c)))
    return h, h_w, h_z, h_c


def _entropy3_bounds(ar: _Arith, box: _Box3) -> tuple[Fraction, Fraction]:
    c, w, z = ar.span(box.c0, box.c1), ar.span(box.w0, box.w1), ar.span(box.z0, box.z1)
    h, h_w, h_z, h_c = _entropy3(ar, box, c, w, z)
    cm, wm, zm = (box.c0 + box.c1) / 2, (box.w0 + box.w1) / 2, (box.z0 + box.z1) / 2
    mv = _entropy3(ar, box, ar.span(cm), ar.span(wm), ar.span(zm))[0]
    sides = ((h_w, box.w0, box.w1, wm), (h_z, box.z0, box.z1, zm), (h_c, box.c0, box.c1, cm))
    for slope, lo, hi, mid in sides:
        mv = ar.add(mv, ar.mul(slope, ar.sub(ar.span(lo, hi), ar.span(mid))))
    (h_lo, h_hi), (mv_lo, mv_hi) = ar.ends(h), ar.ends(mv)
    return max(h_lo, mv_lo), min(h_hi, mv_hi)


def _upper3(box: _Box3, least: int, schedule: Polynomial) -> Fraction | float:
    """An upper bound on the top coefficient over the rows of a box (:func:`_upper3_in`)."""
    return _bounded(lambda ar: _upper3_in(ar, box, least, schedule))


def _upper3_in(ar: _Arith, box: _Box3, least: int, schedule: Polynomial) -> Fraction | float:
    """An upper bound on the top coefficient over the rows of a box with at least `least` items.

    S = 1 + w e^{-βc} + z e^{-βy} grows with w and z and falls with β and c: its
    least value on the box, cut by w + z >= least - 1, is at a vertex of that
    polygon, at the largest β and c. (w0, z0) bounds S below on the whole box;
    where w0 + z0 < least - 1 so do the two ends of the segment w + z = least - 1
    inside it, whose coordinates are formed exactly (in rationals: at counts near
    :math:`10^{17}` a float ``need - w0`` lost the few hundred items it leaves).
    """
    need = least - 1
    if box.w0 + box.z0 >= need:
        corners = [(box.w0, box.z0)]
    else:
        w0, w1, z0, z1 = (Fraction(v) for v in (box.w0, box.w1, box.z0, box.z1))
        w_a = max(w0, need - z1)
        z_b = max(z0, need - w1)
        corners = [(w_a, need - w_a), (need - z_b, z_b)]
    h_lo, h_hi = _entropy3_bounds(ar, box)
    beta = ar.span(ar.beta_up(schedule, h_lo, h_hi))
    e1 = ar.exp(ar.neg(ar.mul(beta, ar.span(box.c1))))
    e2 = ar.exp(ar.neg(ar.mul(beta, ar.span(box.y))))
    low = min(
        ar.ends(ar.add(ar.one, ar.add(ar.mul(ar.span(w), e1), ar.mul(ar.span(z), e2))))[0]
        for w, z in corners
    )
    return ar.reciprocal_up(low)


def _value3(box: _Box3, least: int, schedule: Polynomial) -> float:
    """The coefficient at a feasible point near the box's centre, in floats (a guide).

    0.0 where the counts are beyond the float range.
    """
    c = float((box.c0 + box.c1) / 2)
    try:
        w = float((box.w0 + box.w1) / 2)
        z = float((box.z0 + box.z1) / 2)
        float(least)
    except OverflowError:
        return 0.0
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


def _sum_compare(a: Coordinate, b: Coordinate, total: int) -> int:
    """The sign of ``a + b - total``, exactly."""
    if isinstance(a, float) and total <= _EXACT_INTS:
        # fsum rounds the exact sum once, which keeps its sign (total is a float exactly)
        diff = math.fsum((a, b, -float(total)))
    else:
        diff = Fraction(a) + Fraction(b) - total
    return (diff > 0) - (diff < 0)


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
    kind = _coordinate(most)
    delta, zero, top = kind(spread), kind(0), _count_up(kind, most - 1)
    stack = [_Box3(y, zero, delta, zero, top, zero, top) for y in (delta, zero)]
    count = 0
    while stack:
        box = stack.pop()
        if (
            _sum_compare(box.w0, box.z0, most - 1) > 0
            or _sum_compare(box.w1, box.z1, least - 1) < 0
        ):
            continue  # no length in range
        count += 1
        if count > budget:
            return False, count
        if _upper3(box, least, schedule) < eps:
            continue
        if _value3(box, least, schedule) >= eps:
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
    Stops when the two ends are within 1 % or `budget` boxes are spent. Lengths
    past :math:`2^{1000}` are left alone (`upper` is returned): their boxes would
    need rational counts of hundreds of digits, tens of milliseconds a box.
    """
    if upper > _FLOAT_COUNTS:
        return upper
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
