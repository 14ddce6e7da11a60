r"""Outward-rounded interval arithmetic on pairs of float64s, for searches that bound many boxes.

An interval is a pair ``(lo, hi)`` of finite floats with ``lo <= hi`` that
contains the exact value. It is the fast companion of :mod:`.interval` (mpmath,
any precision): a branch and bound that evaluates tens of thousands of boxes
spends about 0.4 ms on each in mpmath and a few µs here, and falls back to
:mod:`.interval` for a box where floats overflow.

Soundness rests on IEEE 754 alone, without trusting the C library:

* **the basic operations.** Under IEEE 754's default environment (rounding to
  nearest, gradual underflow: every caller runs inside
  :func:`~softmaxtheory._certify.environment.certifying`) the float result of
  :math:`a \circ b` is within half an ulp of the exact one, so one step of
  :func:`math.nextafter` away from it bounds the exact value from below or
  above, in every range, subnormals included;
* **exp and log are our own** (:func:`exp_approx`, :func:`log_approx`: a
  range reduction by :math:`\ln 2` and a short series, in float64), with a
  relative error below :math:`2^{-46}` proved in their docstrings; the ends are
  widened by :math:`2^{-44}` relative, which covers it four times over.
  Arguments whose exponential would be subnormal never reach ``exp``: below
  :math:`-700` the enclosure is :math:`[0, e^{-700}]`.

Every function raises :class:`ArithmeticError` (``OverflowError`` or
``ZeroDivisionError``) or :class:`ValueError` where it cannot enclose in
floats; the callers catch these and redo the box in mpmath.
"""

from __future__ import annotations

import math
import sys
from fractions import Fraction

__all__ = [
    "FloatInterval",
    "add",
    "div",
    "exp",
    "exp_approx",
    "log",
    "log_approx",
    "mul",
    "neg",
    "point",
    "span",
    "sub",
]

FloatInterval = tuple[float, float]

_INF = math.inf
#: The relative widening of exp's and log's ends: four times their proven error.
_WIDEN = 2.0**-44
_SLACK_DOWN = 1.0 - _WIDEN
_SLACK_UP = 1.0 + _WIDEN
#: Below this argument ``exp`` is enclosed by [0, e^_EXP_FLOOR] (its result would be tiny).
_EXP_FLOOR = -700.0
#: Integers up to this magnitude are floats exactly.
_EXACT_INT = 1 << 53


_next = math.nextafter
#: The largest finite float: an end beyond it (an infinity) or a NaN is refused.
_MAX = sys.float_info.max


def _down(x: float) -> float:
    return _next(x, -_INF)


def _up(x: float) -> float:
    return _next(x, _INF)


def _finite(lo: float, hi: float) -> FloatInterval:
    if lo >= -_MAX and hi <= _MAX:  # False for a NaN too
        return lo, hi
    raise OverflowError("an interval end left the float range")


def point(value: int | Fraction | float) -> FloatInterval:
    """An enclosure of an exact number (the float itself where it is one exactly).

    Raises
    ------
    OverflowError
        Beyond the float range.
    """
    if isinstance(value, float):
        return _finite(value, value)
    if isinstance(value, int) or value.denominator == 1:
        whole = int(value)
        f = float(whole)  # OverflowError beyond the range
        return (f, f) if -_EXACT_INT <= whole <= _EXACT_INT else (_down(f), _up(f))
    f = float(value)  # numerator / denominator, correctly rounded; OverflowError beyond
    return _finite(_down(f), _up(f))


def span(lo: int | Fraction | float, hi: int | Fraction | float) -> FloatInterval:
    """An enclosure of the real interval ``[lo, hi]`` of exact numbers."""
    return point(lo)[0], point(hi)[1]


def neg(a: FloatInterval) -> FloatInterval:
    """``-a`` (exact)."""
    return -a[1], -a[0]


def add(a: FloatInterval, b: FloatInterval) -> FloatInterval:
    """Outward-rounded ``a + b``."""
    return _finite(_next(a[0] + b[0], -_INF), _next(a[1] + b[1], _INF))


def sub(a: FloatInterval, b: FloatInterval) -> FloatInterval:
    """Outward-rounded ``a - b``."""
    return _finite(_next(a[0] - b[1], -_INF), _next(a[1] - b[0], _INF))


def mul(a: FloatInterval, b: FloatInterval) -> FloatInterval:
    """Outward-rounded ``a * b``."""
    a0, a1 = a
    b0, b1 = b
    if a0 >= 0.0 and b0 >= 0.0:
        return _finite(_next(a0 * b0, -_INF), _next(a1 * b1, _INF))
    products = (a0 * b0, a0 * b1, a1 * b0, a1 * b1)
    return _finite(_next(min(products), -_INF), _next(max(products), _INF))


def div(a: FloatInterval, b: FloatInterval) -> FloatInterval:
    """Outward-rounded ``a / b``.

    Raises
    ------
    ZeroDivisionError
        If `b` contains 0.
    """
    a0, a1 = a
    b0, b1 = b
    if b0 <= 0.0 <= b1:
        raise ZeroDivisionError("interval division by an interval that holds 0")
    quotients = (a0 / b0, a0 / b1, a1 / b0, a1 / b1)
    return _finite(_down(min(quotients)), _up(max(quotients)))


def exp(a: FloatInterval) -> FloatInterval:
    """An enclosure of ``exp(a)`` (``OverflowError`` past :math:`e^{709}`)."""
    a0, a1 = a
    top = exp_approx(max(a1, _EXP_FLOOR))
    # below -700, e^a0 is positive and below e^-700: 0 bounds it (even for a point)
    low = 0.0 if a0 < _EXP_FLOOR else (top if a0 == a1 else exp_approx(a0))
    return _finite(max(_next(low * _SLACK_DOWN, -_INF), 0.0), _next(top * _SLACK_UP, _INF))


def log(a: FloatInterval) -> FloatInterval:
    """An enclosure of ``log(a)`` for an interval of positive numbers."""
    a0, a1 = a
    if not a0 > 0.0:
        raise ValueError("log needs a positive argument")
    l1 = log_approx(a1)
    l0 = l1 if a0 == a1 else log_approx(a0)
    return _finite(_next(l0 - abs(l0) * _WIDEN, -_INF), _next(l1 + abs(l1) * _WIDEN, _INF))


# ------------------------------------------------------------------ exp and log in float64

#: ln 2 in two parts: the first has 32 significant bits, so k * _LN2_HI is exact for
#: |k| < 2**21; the second is ln 2 - _LN2_HI rounded to float64 (within 2**-86 of it).
_LN2_HI = 0.6931471803691238
_LN2_LO = 1.9082149292705877e-10
_INV_LN2 = 1.4426950408889634
#: 1/j! for j = 13, ..., 0 (each correctly rounded), Horner's order.
_EXP_SERIES = tuple(float(Fraction(1, math.factorial(j))) for j in range(13, -1, -1))
#: 1/(2j + 1) for j = 10, ..., 0, Horner's order.
_ATANH_SERIES = tuple(float(Fraction(1, 2 * j + 1)) for j in range(10, -1, -1))
_SQRT_HALF = 0.7071067811865476


def exp_approx(x: float) -> float:
    r""":math:`e^x` for :math:`-700 \le x \le 709.78`, within :math:`2^{-46}` relative.

    With :math:`k = \operatorname{round}(x / \ln 2)`, :math:`e^x = 2^k e^r` and
    :math:`r = x - k\ln 2`, :math:`|r| \le 0.3466`:

    * :math:`k L_1` is exact (:math:`L_1` has 32 bits, :math:`|k| \le 1075`), and so
      is :math:`t = x - kL_1` (Sterbenz: :math:`x` and :math:`kL_1` are within a
      factor 2 for :math:`k \ne 0`; :math:`t = x` for :math:`k = 0`);
    * :math:`\hat r = t \ominus k L_2` differs from :math:`r` by at most
      :math:`u|r| + 2^{-74}` (:math:`u = 2^{-53}`; :math:`L_2` and its product carry
      :math:`1075 \cdot 2^{-85}`), which moves :math:`e^r` by under :math:`2^{-54}`
      relative;
    * the Taylor polynomial of degree 13 leaves :math:`0.35^{14}/14!\,e^{0.35} <
      2^{-56}`, relative to :math:`e^r \ge 0.7`;
    * Horner's rule with correctly rounded coefficients errs by at most
      :math:`\gamma_{28}\sum_j |r|^j/j! + u\,e^{|r|} \le 29.1u\,e^{0.35}`, under
      :math:`60u < 2^{-47}` relative to :math:`e^r \ge 0.7`;
    * scaling by :math:`2^k` is exact while the result is normal (``ldexp``), as
      it is from :math:`x = -700` on (the callers never go below).

    The sum is below :math:`2^{-46}`; ``tests/test_float_intervals.py`` measures
    the error against mpmath. Past :math:`e^{709.78}` ``ldexp`` raises
    ``OverflowError``.
    """
    k = round(x * _INV_LN2)
    r = (x - k * _LN2_HI) - k * _LN2_LO
    acc = 0.0
    for c in _EXP_SERIES:
        acc = acc * r + c
    return math.ldexp(acc, k)


def log_approx(x: float) -> float:
    r""":math:`\log x` for a positive finite float (subnormals too), within :math:`2^{-46}`.

    ``frexp`` writes :math:`x = m\,2^e` exactly, with :math:`m` moved into
    :math:`[1/\sqrt 2, \sqrt 2)`; then :math:`\log m = 2\operatorname{atanh} s =
    2\sum_j s^{2j+1}/(2j+1)`, :math:`s = (m - 1)/(m + 1)`, :math:`|s| \le 0.1716`:

    * :math:`m - 1` is exact (Sterbenz), so :math:`\hat s` is within :math:`2u` of
      :math:`s`, relative (:math:`u = 2^{-53}`);
    * eleven terms leave :math:`s^{23}/(23(1 - s^2)) < 2^{-60}|s|`;
    * the sum in :math:`z = \hat s^2 \le 0.0295` by Horner's rule errs by under
      :math:`24u` relative (every term is positive and the sum is below 1.011), and
      the product with :math:`2\hat s` adds :math:`u`: :math:`\log m` is within
      :math:`28u` relative;
    * :math:`e L_1` is exact (:math:`|e| \le 1075`), :math:`eL_2 + \log m` rounds
      once and the total once more; the two parts never cancel by more than a
      factor 2 (for :math:`e = \pm 1` the result is at least :math:`\ln 2 -
      0.3466`), so the relative error stays below :math:`2(28u + 2u) + 2^{-80}
      < 2^{-46}`.
    """
    m, e = math.frexp(x)
    if m < _SQRT_HALF:
        m, e = m * 2.0, e - 1
    s = (m - 1.0) / (m + 1.0)
    z = s * s
    acc = 0.0
    for c in _ATANH_SERIES:
        acc = acc * z + c
    return e * _LN2_HI + (e * _LN2_LO + 2.0 * s * acc)
