r"""Interval enclosures of the T1, T3 and T6 quantities, and their certified decimals.

For :math:`n` items with logit spread :math:`\delta` at inverse temperature
:math:`\beta`, theorem T1 bounds every coefficient between
:math:`1/(1 + (n-1)e^{\beta\delta})` and :math:`1/(1 + (n-1)e^{-\beta\delta})`,
T3 bounds the entropy below by :math:`\log(1 + (n-1)e^{-\beta\delta})`, and T6's
two-level minimum is the entropy's least value itself. Each
function here returns ``enclose(prec)``, an interval containing the exact value
whose width shrinks with ``prec``, for Ziv's loop (:func:`.interval.certify`).
:mod:`softmaxtheory.bounds` rounds them to float64; the ``bounds`` command prints
:func:`certified_text`, their correctly rounded decimals.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from decimal import MAX_EMAX, MIN_EMIN, ROUND_CEILING, Context, Decimal
from fractions import Fraction
from typing import Any

from mpmath import libmp

from . import interval as ivl

__all__ = [
    "EXP_CAP",
    "certified_text",
    "coefficient_enclosure",
    "count_times_exp",
    "decimal_up",
    "entropy_floor_enclosure",
    "exp_enclosure",
    "least_entropy_enclosure",
    "max_coefficient_up",
]


#: Beyond this exponent :math:`e^{\pm t}` is enclosed by :math:`[e^{C}, \infty]` or
#: :math:`[0, e^{-C}]` instead of being evaluated (a million-bit exponential,
#: ``beta * spread = 1e300`` has no float answer other than 0 or 1 anyway).
EXP_CAP = 1 << 21


def _exponent(spread: float, beta: float | Fraction, prec: int) -> ivl.Interval:
    r"""An enclosure of :math:`\beta\delta` (`beta` a float or an exact rational)."""
    b = ivl.iv_fraction(beta, prec) if isinstance(beta, Fraction) else ivl.iv_exact(beta)
    return ivl.iv_mul(b, ivl.iv_exact(spread), prec)


def _capped_exp(t: ivl.Interval, prec: int) -> ivl.Interval:
    """An enclosure of :math:`e^t`, with the end 0 or ∞ where `t` passes :data:`EXP_CAP`."""
    big = libmp.from_int(EXP_CAP)
    small = libmp.mpf_neg(big)
    lo, hi = t

    def clamp(a: Any) -> Any:
        return small if libmp.mpf_lt(a, small) else big if libmp.mpf_gt(a, big) else a

    e_lo, e_hi = ivl.iv_exp((clamp(lo), clamp(hi)), prec)
    if libmp.mpf_lt(lo, small):
        e_lo = libmp.fzero
    if libmp.mpf_gt(hi, big):
        e_hi = libmp.finf
    return e_lo, e_hi


def exp_enclosure(spread: float, beta: float | Fraction, prec: int, sign: int) -> ivl.Interval:
    r"""An enclosure of :math:`e^{\pm\beta\delta}` (endpoints 0 or ∞ beyond :data:`EXP_CAP`).

    `beta` is a float or an exact rational (a ``Constant`` schedule's decimal).
    """
    t = _exponent(spread, beta, prec)
    return _capped_exp(t if sign > 0 else ivl.iv_neg(t), prec)


def count_times_exp(count: int, spread: float, beta: float, prec: int, sign: int) -> ivl.Interval:
    r"""An enclosure of :math:`c\,e^{\pm\beta\delta}` for an integer :math:`c \ge 1`.

    Formed as a product while :math:`\beta\delta \le` :data:`EXP_CAP`. Beyond it
    :func:`exp_enclosure` gives only 0 or ∞ as one end, which the count may cancel
    (:math:`c \approx 2^{2^{22}}` against :math:`\beta\delta = 2.9 \cdot 10^6`:
    the product is :math:`e^{7411}`, and no precision decided it): there it is
    :math:`e^{\log c \pm \beta\delta}`, the exponent formed first and only that
    capped.
    """
    t = _exponent(spread, beta, prec)
    if libmp.mpf_le(t[1], libmp.from_int(EXP_CAP)):
        return ivl.iv_mul(ivl.iv_exact(count), exp_enclosure(spread, beta, prec, sign), prec)
    c = (
        libmp.from_int(count, prec + 8, libmp.round_floor),
        libmp.from_int(count, prec + 8, libmp.round_ceiling),
    )
    d = ivl.iv_log(c, prec + 8)
    return _capped_exp(ivl.iv_add(d, t, prec + 8) if sign > 0 else ivl.iv_sub(d, t, prec + 8), prec)


def coefficient_enclosure(n: int, spread: float, beta: float, sign: int) -> Callable[[int], Any]:
    r"""Enclosures of :math:`1 / (1 + (n-1) e^{\mp\beta\delta})` at a given precision."""

    def enclose(prec: int) -> ivl.Interval:
        if n == 1:  # one item: the coefficient is 1 (and 0 * inf must not enter)
            return ivl.iv_exact(1)
        e = count_times_exp(n - 1, spread, beta, prec, sign)
        denom = ivl.iv_add(ivl.iv_exact(1), e, prec)
        return ivl.iv_div(ivl.iv_exact(1), denom, prec)

    return enclose


def max_coefficient_up(n: int, spread: float, beta: float | Fraction) -> float:
    """T1's largest coefficient correctly rounded upward to float64 (a bound that holds).

    The value rounded to nearest is below the exact one about half the time.
    """
    return ivl.certify(coefficient_enclosure(n, spread, beta, -1), ivl.float_up_of)


def decimal_up(value: float, digits: int) -> str:
    """The least decimal of `digits` significant digits at least `value`, as printed.

    The format of :func:`certified_text`; for a column of upper bounds, whose
    decimals rounded to nearest could fall below what they bound.
    """
    ctx = Context(prec=digits, rounding=ROUND_CEILING, Emax=MAX_EMAX, Emin=MIN_EMIN)
    q = Fraction(ctx.plus(Decimal(value)))  # the float's exact value, rounded up
    lo = libmp.from_rational(q.numerator, q.denominator, 256, libmp.round_floor)
    hi = libmp.from_rational(q.numerator, q.denominator, 256, libmp.round_ceiling)
    text = ivl.decimal_of((lo, hi), digits)
    assert text is not None  # both ends are within 2**-250 of a decimal of `digits` digits
    return text


def entropy_floor_enclosure(n: int, spread: float, beta: float) -> Callable[[int], Any]:
    r"""Enclosures of :math:`\log(1 + (n-1) e^{-\beta\delta})` at a given precision."""

    def enclose(prec: int) -> ivl.Interval:
        if n == 1:
            return ivl.iv_exact(0)
        return ivl.iv_log1p(count_times_exp(n - 1, spread, beta, prec, -1), prec)

    return enclose


def certified_text(n: int, spread: float, beta: float, kind: str, digits: int) -> str:
    r"""A T1/T3 quantity as a decimal string, correctly rounded to `digits` significant digits.

    Used by the ``bounds`` command, which prints decimals: rounding the float64
    result again to fewer digits could be off by one in the last digit shown.

    Parameters
    ----------
    n : int
        Number of items.
    spread, beta : float
        Logit spread :math:`\delta` and inverse temperature :math:`\beta`.
    kind : {"max", "min", "entropy", "least_entropy"}
        The largest coefficient's upper bound, the smallest coefficient's lower
        bound (T1), the entropy's lower bound (T3), or the entropy's least value
        (T6's two-level minimum).
    digits : int
        Significant digits.

    Raises
    ------
    ValueError
        If `kind` is not one of the four.
    """
    if kind in ("max", "min") and (n == 1 or spread == 0):
        # every coefficient is 1/n, exactly: a decimal tie (1/5120 to six digits, 1/80 to
        # two) that the enclosures of a rational with no binary form never decide
        return ivl.decimal_of_fraction(Fraction(1, n), digits)
    if kind == "max":
        enclose = coefficient_enclosure(n, spread, beta, -1)
    elif kind == "min":
        enclose = coefficient_enclosure(n, spread, beta, +1)
    elif kind == "entropy":
        enclose = entropy_floor_enclosure(n, spread, beta)
    elif kind == "least_entropy":
        enclose = least_entropy_enclosure(n, spread, beta)
    else:
        raise ValueError(f"kind must be 'max', 'min', 'entropy' or 'least_entropy', got {kind!r}")
    return ivl.certify(enclose, lambda iv: ivl.decimal_of(iv, digits))


#: The most integer counts :func:`least_entropy_enclosure` tries around the real
#: minimiser; a wider enclosure of it waits for more precision.
_LEAST_CANDIDATES = 64


def least_entropy_enclosure(n: int, spread: float, beta: float) -> Callable[[int], Any]:
    r"""Enclosures of T6's two-level minimum, the least entropy of a row, at a given precision.

    With :math:`t = \beta\delta` and :math:`w = e^{-t}`, a row of :math:`k` logits at
    the top of the interval and :math:`n - k` at the bottom has the entropy

    .. math::

        f(k) = \log k + \log(1 + r) + \frac{t\,r}{1 + r}, \qquad
        r = \frac{(n - k)\,w}{k} \quad (0 < k < n),

    and :math:`f(0) = f(n) = \log n`: the form of :math:`\log(k e^t + n - k) -
    k t e^t / (k e^t + n - k)` whose terms are all non-negative. Its derivative in a
    real :math:`k` has the sign of :math:`(1 - w)^2 k - n w (t - 1 + w)`, so
    :math:`f` decreases up to

    .. math::

        k^\ast = \frac{n\,w\,(t - 1 + w)}{(1 - w)^2} \;\in\; [0, n/2]

    and increases after it; the least value over integer counts is at
    :math:`\lfloor k^\ast\rfloor` or :math:`\lceil k^\ast\rceil`. Every integer in
    the enclosure of :math:`k^\ast`, widened to integers, is tried; where that
    enclosure holds more than :data:`_LEAST_CANDIDATES` of them (too little
    precision for :math:`t - 1 + w` at a tiny :math:`t`), the enclosure returned is
    :math:`[0, \log n]`, which Ziv's loop refines at a higher precision.
    """

    def enclose(prec: int) -> ivl.Interval:
        log_n = ivl.iv_log(ivl.iv_exact(n), prec) if n > 1 else ivl.iv_exact(0)
        t = _exponent(spread, beta, prec)
        if n == 1 or t[1] == libmp.fzero:
            return log_n  # one item, or a spread of 0: every row is uniform
        w = exp_enclosure(spread, beta, prec, -1)
        one = ivl.iv_exact(1)
        gap = ivl.iv_sub(one, w, prec)  # 1 - w
        slack = ivl.iv_add(ivl.iv_sub(t, one, prec), w, prec)  # t - 1 + w >= 0
        if not libmp.mpf_gt(gap[0], libmp.fzero):
            return libmp.fzero, log_n[1]  # 1 - w not yet apart from 0
        nw = count_times_exp(n, spread, beta, prec, -1)  # n w, in log space if it must be
        k_star = ivl.iv_div(ivl.iv_mul(nw, slack, prec), ivl.iv_mul(gap, gap, prec), prec)
        lo = max(0, math.floor(ivl.to_fraction(k_star[0])))
        hi = min(n, math.ceil(ivl.to_fraction(k_star[1])))
        if hi - lo > _LEAST_CANDIDATES:
            return libmp.fzero, log_n[1]
        best = None
        for k in range(lo, hi + 1):
            f = log_n if k in (0, n) else _two_level(k, n, spread, beta, t, prec)
            best = f if best is None else ivl.iv_min(best, f)
        return best

    return enclose


def _two_level(k: int, n: int, spread: float, beta: float, t: ivl.Interval, prec: int) -> Any:
    """The entropy of k logits at the top and n - k at the bottom (0 < k < n), enclosed."""
    r = ivl.iv_div(count_times_exp(n - k, spread, beta, prec, -1), ivl.iv_exact(k), prec)
    one_r = ivl.iv_add(ivl.iv_exact(1), r, prec)
    out = ivl.iv_add(ivl.iv_log(ivl.iv_exact(k), prec), ivl.iv_log1p(r, prec), prec)
    return ivl.iv_add(out, ivl.iv_div(ivl.iv_mul(t, r, prec), one_r, prec), prec)
