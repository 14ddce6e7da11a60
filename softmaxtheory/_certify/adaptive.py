r"""Exact analysis of an entropy-driven schedule: its window, its peak, its β over an entropy range.

The adaptive bounds of :mod:`softmaxtheory.bounds` (theorem T6) need three facts
about a :class:`~softmaxtheory.spec.Polynomial` schedule
:math:`\beta(H) = \max(P(H), 1)` for :math:`H > \theta`, all decided in exact
rational arithmetic (:mod:`.polyroots`) or with interval enclosures
(:mod:`.interval`):

* :func:`window_exact`, the entropies where :math:`P > 1`;
* :func:`peak`, the largest β and where it is reached, correctly rounded;
* :func:`beta_sup`, an upper bound on the β of every row of :math:`n` items
  with spread at most :math:`\delta`, whose entropies lie in
  :math:`[\log n - C(\delta), \log n]` (:func:`entropy_gap_upper` bounds
  :math:`C(\delta)`, :func:`log_bounds` brackets :math:`\log n`).

Both :mod:`softmaxtheory.bounds` and the ``bounds`` command import them from here.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction
from functools import lru_cache
from typing import Any

from mpmath import libmp

from ..spec import Constant, LogLength, Polynomial, Schedule, resolve_schedule
from . import floativ as fv
from . import interval as ivl
from . import polyroots as pr

__all__ = [
    "adaptive_beta_up",
    "beta_max_up",
    "beta_sup",
    "beta_up_float",
    "beta_up_on",
    "critical_points",
    "entropy_gap_upper",
    "int_interval",
    "log_bounds",
    "peak",
    "polynomial_schedule",
    "reachable",
    "root_above",
    "round_root",
    "window_exact",
]


def polynomial_schedule(schedule: Schedule | None, name: str = "schedule") -> Polynomial:
    """The schedule (``None``: the paper's) if it is an entropy-driven :class:`Polynomial`.

    Raises
    ------
    ValueError
        If it is another schedule, naming the argument `name`.
    """
    sched = resolve_schedule(schedule)
    if not isinstance(sched, Polynomial):
        raise ValueError(
            f"{name} must be an entropy-driven Polynomial schedule, got {sched!r}: "
            "only those have an entropy window"
        )
    return sched


def root_above(sf: pr.Poly, root: list[Fraction], theta: Fraction) -> bool:
    """Whether the root isolated in ``root = [a, b]`` exceeds `theta`.

    When it does, ``root`` is narrowed in place until ``a > theta``.
    """
    a, b = root
    if b <= theta:
        return False
    if a < theta and pr.count_roots(sf, a, theta) == 1:
        return False
    while a <= theta and a != b:  # the root is above theta: move the left end past it
        a, b = pr.refine(sf, a, b)
    root[0], root[1] = a, b
    return True


@lru_cache(maxsize=64)
def window_exact(schedule: Polynomial) -> tuple[list[tuple[Any, Any]], pr.Poly]:
    r"""The segments of :math:`(\theta, \infty)` where :math:`P > 1`, in increasing order.

    A segment's left end is the threshold (a Fraction) or a root of :math:`P - 1`;
    its right end is a root or ``math.inf``. Roots are mutable isolating intervals
    ``[a, b]`` (the root lies in :math:`(a, b]`) of the returned square-free
    :math:`P - 1`.
    """
    p = schedule.exact_coefficients
    theta = schedule.exact_threshold
    q = (*p[:-1], p[-1] - 1)
    if all(c == 0 for c in q):
        return [], q  # P == 1: beta is 1 everywhere
    sf, intervals = pr.isolate_roots(q)
    roots = [[a, b] for a, b in intervals]
    roots = [r for r in roots if root_above(sf, r, theta)]
    ends: list[Any] = [theta, *roots, math.inf]
    segments = []
    for left, right in itertools.pairwise(ends):
        lo = left if isinstance(left, Fraction) else left[1]
        if isinstance(right, list):
            while right[0] != right[1] and not lo < right[0]:
                right[0], right[1] = pr.refine(sf, right[0], right[1])
            hi = right[0]
            while isinstance(left, list) and left[0] != left[1] and not left[1] < hi:
                left[0], left[1] = pr.refine(sf, left[0], left[1])
                lo = left[1]
            probe = (lo + hi) / 2
        else:
            probe = lo + 1
        if pr.evaluate(q, probe) > 0:
            segments.append((left, right))
    return segments, sf


def round_root(sf: pr.Poly, root: list) -> float:
    """The float nearest the root of `sf` isolated in ``root = [a, b]`` (narrowed in place)."""
    a, b = root
    while float(a) != float(b):
        a, b = pr.refine(sf, a, b)
    root[0], root[1] = a, b
    return float(a)


def _peak_candidates(schedule: Polynomial) -> tuple[pr.Poly, list[list[Any]]]:
    """The places β may peak above the threshold: ``[lo, hi, where]`` with ``P`` in [lo, hi].

    ``where`` is the threshold (a Fraction, with ``lo == hi``) or the isolating
    interval ``[a, b]`` of a critical point of ``P`` (narrowed in place later).
    Returns the square-free derivative (for refining) and the candidates whose
    ``P`` may exceed 1; none when the schedule has no window.
    """
    segments, _ = window_exact(schedule)
    p = schedule.exact_coefficients
    theta = schedule.exact_threshold
    candidates: list[list[Any]] = []
    dsf: pr.Poly = (Fraction(1),)
    if not segments:
        return dsf, candidates
    v = pr.evaluate(p, theta)
    if v > 1:
        candidates.append([v, v, theta])
    if len(p) > 2:
        dsf, crit = pr.isolate_roots(pr.derivative(p))
        for a, b in crit:
            root = [a, b]
            if root_above(dsf, root, theta):
                lo, hi = pr.evaluate_range(p, root[0], root[1])
                if hi > 1:
                    candidates.append([lo, hi, root])
    return dsf, candidates


def _unbounded(schedule: Polynomial) -> bool:
    segments, _ = window_exact(schedule)
    p = schedule.exact_coefficients
    return bool(segments) and segments[-1][1] == math.inf and len(p) > 1 and p[0] > 0


def reachable(schedule: Polynomial) -> Polynomial:
    r"""`schedule` as a row's entropy meets it: a threshold below 0 raised to 0.

    Entropies are at least 0, so β's supremum over them is over :math:`H \ge
    \max(\theta, 0)`; :math:`P` is continuous, so that over :math:`H > 0`
    is the same (approached from the right). A schedule with ``threshold="-1"``
    whose :math:`P` peaks at :math:`H = -1` does not give that peak to any row.
    """
    if schedule.exact_threshold >= 0:
        return schedule
    return Polynomial(schedule.exact_coefficients, threshold=Fraction(0))


@lru_cache(maxsize=64)
def peak(schedule: Polynomial) -> tuple[float, float]:
    r"""(argmax, max) of β over the entropies a row can have, correctly rounded.

    The supremum of :math:`\max(P, 1)` over :math:`H > \theta \ge 0`
    (:func:`reachable`) is 1, or :math:`P(\theta)` (approached from the right),
    or :math:`P` at a critical point above :math:`\theta`, or infinite.
    """
    schedule = reachable(schedule)
    if _unbounded(schedule):
        return math.inf, math.inf
    dsf, candidates = _peak_candidates(schedule)
    p = schedule.exact_coefficients
    if not candidates:
        return math.nan, 1.0
    while True:
        best_lo = max(c[0] for c in candidates)
        best_hi = max(c[1] for c in candidates)
        contenders = [c for c in candidates if c[1] >= best_lo]
        if float(best_lo) == float(best_hi) and len(contenders) == 1:
            where = contenders[0][2]
            arg = float(where) if isinstance(where, Fraction) else round_root(dsf, where)
            return arg, float(best_lo)
        for c in contenders:
            if isinstance(c[2], list) and c[2][0] != c[2][1]:
                c[2][0], c[2][1] = pr.refine(dsf, c[2][0], c[2][1])
                c[0], c[1] = pr.evaluate_range(p, c[2][0], c[2][1])
        if all(c[0] == c[1] for c in contenders):  # exact ties between equal maxima
            where = contenders[0][2]
            arg = float(where) if isinstance(where, Fraction) else round_root(dsf, where)
            return arg, float(contenders[0][0])


def _at_most(p: pr.Poly, dsf: pr.Poly, candidate: list[Any], bound: Fraction) -> bool:
    """Whether ``P`` at the candidate's place is at most `bound`, decided exactly."""
    lo, hi, where = candidate
    if isinstance(where, Fraction):
        return lo <= bound
    a, b = where
    # P(r) == bound exactly iff r is a root of gcd(P - bound, P'): no enclosure decides that
    shifted = (*p[:-1], p[-1] - bound)
    if pr.count_roots(pr.gcd(shifted, dsf), a, b) > 0:
        return True
    while True:
        lo, hi = pr.evaluate_range(p, a, b)
        if hi <= bound or lo > bound:
            return hi <= bound
        a, b = pr.refine(dsf, a, b)


@lru_cache(maxsize=64)
def beta_max_up(poly: Polynomial) -> float:
    r""":math:`\beta_{\max}` rounded upward: the smallest float64 at least its exact value.

    The correctly rounded :func:`peak` is below the exact value for about half
    the schedules (the paper's: 2.421387706631524 < 2.42138770663152427...), and
    T1 evaluated at it may then fall below a row whose β is the exact peak.
    """
    top = peak(poly)[1]
    if not math.isfinite(top) or top == 1.0:
        return top  # unbounded, or no window: beta = 1 exactly
    poly = reachable(poly)
    dsf, candidates = _peak_candidates(poly)
    p = poly.exact_coefficients
    exact = Fraction(top)
    if all(_at_most(p, dsf, c, exact) for c in candidates):
        return top
    return math.nextafter(top, math.inf)


@lru_cache(maxsize=1024)
def entropy_gap_upper(spread: float) -> Fraction:
    r"""An upper bound on :math:`C(\delta) = r - 1 - \log r`, :math:`r = \delta/(1 - e^{-\delta})`.

    :math:`\log n - C(\delta)` is the minimum of the two-level entropy over a
    real number of top logits, so every row of :math:`n` items has entropy at
    least :math:`\log n - C(\delta)`.
    """
    if spread == 0.0:
        return Fraction(0)
    if spread < 2.0**-20:
        return Fraction(spread)  # r - 1 <= delta / (2 - delta) < delta, and -log r <= 0
    prec = 128
    d = ivl.iv_exact(spread)
    one = ivl.iv_exact(1)
    r = ivl.iv_div(d, ivl.iv_sub(one, ivl.iv_exp(ivl.iv_neg(d), prec), prec), prec)
    c = ivl.iv_sub(ivl.iv_sub(r, one, prec), ivl.iv_log(r, prec), prec)
    return ivl.to_fraction(c[1])


def log_bounds(n: int) -> tuple[Fraction, Fraction]:
    """Rational bounds on log n."""
    if n == 1:
        return Fraction(0), Fraction(0)
    iv = ivl.iv_log(ivl.iv_exact(n) if n.bit_length() < 4000 else int_interval(n), 96)
    return ivl.to_fraction(iv[0]), ivl.to_fraction(iv[1])


def int_interval(n: int) -> ivl.Interval:
    """An enclosure of the integer `n` with 96-bit ends (for integers too long to hold exactly)."""
    return (libmp.from_int(n, 96, libmp.round_floor), libmp.from_int(n, 96, libmp.round_ceiling))


@lru_cache(maxsize=64)
def critical_points(schedule: Polynomial) -> tuple[tuple[Fraction, Fraction], ...]:
    """Isolating intervals of the real critical points of P."""
    p = schedule.exact_coefficients
    if len(p) <= 2:
        return ()
    dsf, crit = pr.isolate_roots(pr.derivative(p))
    out = []
    for a, b in crit:  # narrow each to 2**-40 so that the entropy ranges rarely overlap it
        while b - a > Fraction(1, 1 << 40):
            a, b = pr.refine(dsf, a, b)
        out.append((a, b))
    return tuple(out)


def beta_up_on(schedule: Polynomial, a: Fraction, b: Fraction) -> float:
    r"""A float at least :math:`\sup\{\beta(H) : a \le H \le b\}`."""
    theta = schedule.exact_threshold
    if b <= theta:
        return 1.0
    lo = max(a, theta)
    if any(cb >= lo and ca <= b for ca, cb in critical_points(schedule)):
        return beta_max_up(schedule)
    top = max(schedule.polynomial_exact(lo), schedule.polynomial_exact(b), Fraction(1))
    return ivl.float_directed(top, +1)


@lru_cache(maxsize=64)
def _float_enclosures(schedule: Polynomial) -> tuple[fv.FloatInterval, tuple, tuple]:
    """Float enclosures of the threshold, the coefficients and the critical points of P."""

    def enclose(lo: Fraction, hi: Fraction) -> fv.FloatInterval:
        return ivl.float_directed(lo, -1), ivl.float_directed(hi, +1)

    theta = schedule.exact_threshold
    coefficients = tuple(enclose(c, c) for c in schedule.exact_coefficients)
    critical = tuple(enclose(a, b) for a, b in critical_points(schedule))
    return enclose(theta, theta), coefficients, critical


def beta_up_float(schedule: Polynomial, a: float, b: float) -> float:
    r"""A float at least :math:`\sup\{\beta(H) : a \le H \le b\}`, in float interval arithmetic.

    What :func:`beta_up_on` bounds, for float ends and about ten times faster
    (a branch and bound asks it once a box): P is evaluated by Horner's rule on
    outward-rounded float intervals (:mod:`.floativ`) instead of exactly, so the
    bound may exceed :func:`beta_up_on`'s by a few ulps.

    Raises
    ------
    OverflowError
        Where the evaluation leaves the float range (use :func:`beta_up_on`).
    """
    (t_lo, t_hi), coefficients, critical = _float_enclosures(schedule)
    if b <= t_lo or (b <= t_hi and b <= schedule.exact_threshold):
        return 1.0
    # an enclosure of max(a, theta), where P's range on [max(a, theta), b] starts
    lo = (a, a) if a >= t_hi else (max(a, t_lo), t_hi)
    if any(c_hi >= lo[0] and c_lo <= b for c_lo, c_hi in critical):
        return beta_max_up(schedule)
    top = 1.0
    for h in (lo, (b, b)):
        acc = (0.0, 0.0)
        for c in coefficients:
            acc = fv.add(fv.mul(acc, h), c)
        top = max(top, acc[1])
    return top


def adaptive_beta_up(n: int, spread: float, schedule: Polynomial) -> float:
    r"""A float at least the largest β the schedule gives any row of `n` items, spread ≤ `spread`.

    Rows of :math:`n` items have entropies in :math:`[\log n - C(\delta), \log n]`.
    """
    log_lo, log_hi = log_bounds(n)
    return beta_up_on(schedule, max(Fraction(0), log_lo - entropy_gap_upper(spread)), log_hi)


def beta_sup(n: int, spread: float, sched: Schedule) -> float | Fraction:
    """A number at least every β that `sched` gives a row of `n` items with spread ≤ `spread`.

    A float, or for a :class:`~softmaxtheory.spec.Constant` its exact β.

    The β that :func:`softmaxtheory.bounds.adaptive_max_coefficient` puts into T1
    (and that the ``bounds`` command prints its decimal of).

    Raises
    ------
    ValueError
        For a :class:`~softmaxtheory.spec.LogLength` schedule (its β depends on
        `n`, not on the entropy: give it to T1 directly) or a schedule that is
        not entropy-driven.
    """
    if isinstance(sched, Constant):
        return sched.exact_beta  # exact: its float may be below it ("0.3")
    if isinstance(sched, LogLength):
        raise ValueError("LogLength schedules: use max_coefficient(n, spread, beta=s*log(n))")
    return adaptive_beta_up(n, spread, polynomial_schedule(sched))
