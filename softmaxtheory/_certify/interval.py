r"""Rigorous interval arithmetic on mpmath raw numbers, and certified rounding.

An interval is a pair ``(lo, hi)`` of mpmath raw floats (``_mpf_`` tuples) with
``lo <= hi`` that contains the exact value. Arithmetic uses mpmath's ``mpi_*``
primitives at an explicit precision (mpmath's global contexts are never read or
changed). Additions, multiplications and divisions are rounded outward by
mpmath itself. The results of ``exp`` and ``log`` are further widened by
:math:`2^{4-p}` relative, so the enclosure holds as long as mpmath's directed
``exp`` and ``log`` are within 16 units of :math:`2^{-p}` of the exact value,
the same kind of assumption the reference makes (and tests) for its own
evaluation.

A value is *certified* by Ziv's strategy (:func:`certify`, the loop of
:mod:`softmaxtheory._certify.loop`): evaluate the enclosure at precision
:math:`p`; if both ends round to the same float (or the same decimal string),
that is the correctly rounded result, by monotonicity of rounding; otherwise
double :math:`p`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from decimal import MAX_EMAX, MAX_PREC, MIN_EMIN, Context, Decimal
from fractions import Fraction
from typing import TypeVar

from mpmath import libmp

from .._formats import FORMATS
from . import loop
from .loop import CertificationError
from .rounding import round_exact

__all__ = [
    "CertificationError",
    "Interval",
    "certify",
    "decimal_of",
    "decimal_of_fraction",
    "float_directed",
    "float_of",
    "float_up_of",
    "iv_add",
    "iv_div",
    "iv_exact",
    "iv_exp",
    "iv_fraction",
    "iv_log",
    "iv_log1p",
    "iv_max",
    "iv_min",
    "iv_mul",
    "iv_neg",
    "iv_sub",
    "magnitude_bits",
    "to_fraction",
]

Raw = tuple
Interval = tuple[Raw, Raw]
T = TypeVar("T")

#: Precision at which certification starts, and the cap after which it gives up.
START_PRECISION = 64
MAX_PRECISION = 1 << 22


def iv_exact(value: int | float) -> Interval:
    """The point interval of an int or a float (exact: mpmath floats are unbounded)."""
    raw = libmp.from_int(value) if isinstance(value, int) else libmp.from_float(value)
    return (raw, raw)


def iv_fraction(value: Fraction, prec: int) -> Interval:
    """An enclosure of a rational number."""
    num = iv_exact(value.numerator)
    if value.denominator == 1:
        return num
    return libmp.mpi_div(num, iv_exact(value.denominator), prec)


def iv_add(a: Interval, b: Interval, prec: int) -> Interval:
    """Outward-rounded ``a + b``."""
    return libmp.mpi_add(a, b, prec)


def iv_sub(a: Interval, b: Interval, prec: int) -> Interval:
    """Outward-rounded ``a - b``."""
    return libmp.mpi_sub(a, b, prec)


def iv_mul(a: Interval, b: Interval, prec: int) -> Interval:
    """Outward-rounded ``a * b``."""
    return libmp.mpi_mul(a, b, prec)


def iv_div(a: Interval, b: Interval, prec: int) -> Interval:
    """Outward-rounded ``a / b`` (`b` must not contain zero)."""
    return libmp.mpi_div(a, b, prec)


def _widen(iv: Interval, prec: int) -> Interval:
    lo, hi = iv
    slack = libmp.from_man_exp(1, 4 - prec)
    lo = libmp.mpf_sub(lo, libmp.mpf_mul(libmp.mpf_abs(lo), slack), prec, libmp.round_floor)
    hi = libmp.mpf_add(hi, libmp.mpf_mul(libmp.mpf_abs(hi), slack), prec, libmp.round_ceiling)
    return lo, hi


def iv_exp(a: Interval, prec: int) -> Interval:
    """An enclosure of ``exp(a)`` (exact for the point 0, whose exponential is 1)."""
    if a[0] == libmp.fzero and a[1] == libmp.fzero:
        return iv_exact(1)
    return _widen(libmp.mpi_exp(a, prec), prec)


def iv_log(a: Interval, prec: int) -> Interval:
    """An enclosure of ``log(a)`` for an interval of positive numbers."""
    if not libmp.mpf_gt(a[0], libmp.fzero):
        raise ValueError("iv_log needs a positive argument")
    return _widen(libmp.mpi_log(a, prec), prec)


def iv_neg(a: Interval) -> Interval:
    """``-a`` (exact)."""
    return libmp.mpf_neg(a[1]), libmp.mpf_neg(a[0])


def iv_max(a: Interval, b: Interval) -> Interval:
    """An enclosure of ``max(x, y)`` for ``x`` in `a` and ``y`` in `b` (exact)."""
    return (
        a[0] if libmp.mpf_ge(a[0], b[0]) else b[0],
        a[1] if libmp.mpf_ge(a[1], b[1]) else b[1],
    )


def iv_min(a: Interval, b: Interval) -> Interval:
    """An enclosure of ``min(x, y)`` for ``x`` in `a` and ``y`` in `b` (exact)."""
    return (
        a[0] if libmp.mpf_le(a[0], b[0]) else b[0],
        a[1] if libmp.mpf_le(a[1], b[1]) else b[1],
    )


def iv_log1p(a: Interval, prec: int) -> Interval:
    r"""An enclosure of :math:`\log(1 + a)` for :math:`a \ge 0`.

    Small arguments use :math:`a - a^2/2 \le \log(1+a) \le a`, which keeps the
    relative accuracy that ``log(1 + a)`` would lose when :math:`1 + a` rounds
    to 1.
    """
    lo, hi = a
    if libmp.mpf_lt(lo, libmp.fzero):
        raise ValueError("iv_log1p needs a non-negative argument")
    if libmp.mpf_lt(hi, libmp.from_man_exp(1, -prec // 2)):
        half = (libmp.from_man_exp(1, -1),) * 2
        low = iv_sub((lo, lo), iv_mul(iv_mul((lo, lo), (lo, lo), prec), half, prec), prec)[0]
        # log1p is increasing and log1p(t) >= t - t**2/2 for t >= 0
        return (low if libmp.mpf_gt(low, libmp.fzero) else libmp.fzero, hi)
    one = iv_exact(1)
    return _widen(libmp.mpi_log(iv_add(one, a, prec), prec), prec)


def to_fraction(raw: Raw) -> Fraction:
    """The exact rational value of an mpmath raw float."""
    sign, man, exp, _ = raw
    man, exp = int(man), int(exp)  # gmpy2's mpz under mpmath's gmpy backend
    if man == 0:
        return Fraction(0)
    value = Fraction(man << exp) if exp >= 0 else Fraction(man, 1 << -exp)
    return -value if sign else value


def _round_float(raw: Raw) -> float:
    sign, man, exp, _ = raw
    return round_exact(sign, int(man), int(exp), FORMATS["float64"])


def float_directed(value: Fraction, direction: int) -> float:
    """A rational rounded to float64 downward (`direction` < 0) or upward (> 0).

    The float itself where `value` is one; beyond the float range, the largest
    finite float or an infinity, as the direction asks.
    """
    try:
        out = float(value)  # to nearest
    except OverflowError:
        top = math.inf if (value > 0) == (direction > 0) else 1.7976931348623157e308
        return top if value > 0 else -top
    if direction > 0 and Fraction(out) < value:
        return math.nextafter(out, math.inf)
    if direction < 0 and Fraction(out) > value:
        return math.nextafter(out, -math.inf)
    return out


def float_of(iv: Interval) -> float | None:
    """The float64 both ends of `iv` round to (nearest, ties to even), else ``None``."""
    lo, hi = _round_float(iv[0]), _round_float(iv[1])
    return lo if lo == hi else None


def float_up_of(iv: Interval) -> float | None:
    """The float64 both ends of `iv` round upward to, else ``None``.

    For an upper bound: the least float at least the exact value, whichever side of
    it the nearest float lies. (An exact value that is a float is decided only by an
    enclosure of width 0, which the exact cases, such as :math:`1/2^k`, give.)
    """
    lo, hi = (float_directed(to_fraction(end), +1) for end in iv)
    return lo if lo == hi else None


#: A decimal context that rounds nothing this module forms (scaling by powers of ten).
_EXACT = Context(prec=MAX_PREC, Emax=MAX_EMAX, Emin=MIN_EMIN)


def _decimal(value: Fraction, digits: int) -> str:
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    value = abs(value)
    # an estimate from the bit lengths (no conversion of huge integers to decimal), then exact
    bits = value.numerator.bit_length() - value.denominator.bit_length()
    e = math.floor(bits * 0.30102999566398120) + 1
    while value >= Fraction(10) ** e:
        e += 1
    while value < Fraction(10) ** (e - 1):
        e -= 1
    # now 10**(e-1) <= value < 10**e
    scale = Fraction(10) ** (digits - e)
    scaled = value * scale
    m = round(scaled)  # half to even
    if m == 10**digits:
        m //= 10
        e += 1
    sci = e - 1  # value = m * 10**(e - digits) = d.ddd * 10**sci
    if -4 <= sci < digits:
        # in a context of its own: scaleb rounds to the context's precision, and the
        # caller's (decimal.getcontext().prec = 3, say) cut the certified digits
        text = format(Decimal(m).scaleb(e - digits, context=_EXACT), "f")
    else:
        mant = str(m)
        body = mant[0] + ("." + mant[1:] if digits > 1 else "")
        text = f"{body}e{sci:+03d}"
    return sign + text


def _decimal_far(raw: Raw, digits: int) -> str | None:
    """`_decimal` for a raw float far from 1 (huge or tiny), without huge rationals.

    The exact value times a power of ten is enclosed with directed roundings;
    ``None`` if that enclosure straddles a rounding boundary (the caller then
    falls back to exact rationals). Ties cannot occur: the scaled value is a
    dyadic rational times a power of 5 whose binary exponent is far from -1.
    """
    sign, _, exp, bc = raw
    e10 = math.floor((exp + bc) * 0.30102999566398120)  # near log10 of the value
    for _ in range(3):
        k = digits - 1 - e10  # value * 10**k should lie in [10**(digits-1), 10**digits)
        prec = bc + 64 + 4 * digits + abs(k).bit_length()
        ten = libmp.from_int(10)
        p_lo = libmp.mpf_pow_int(ten, abs(k), prec, libmp.round_floor)
        p_hi = libmp.mpf_pow_int(ten, abs(k), prec, libmp.round_ceiling)
        x = (libmp.mpf_abs(raw), libmp.mpf_abs(raw))
        y = libmp.mpi_mul(x, (p_lo, p_hi), prec) if k >= 0 else libmp.mpi_div(x, (p_lo, p_hi), prec)
        y_lo, y_hi = to_fraction(y[0]), to_fraction(y[1])
        if y_hi < 10 ** (digits - 1):
            e10 -= 1
            continue
        if y_lo >= 10**digits:
            e10 += 1
            continue
        m_lo, m_hi = round(y_lo), round(y_hi)
        if m_lo != m_hi or y_lo < 10 ** (digits - 1) or y_hi >= 10**digits:
            return None
        sci = e10
        if m_lo == 10**digits:
            m_lo //= 10
            sci += 1
        mant = str(m_lo)
        body = mant[0] + ("." + mant[1:] if digits > 1 else "")
        return ("-" if sign else "") + f"{body}e{sci:+03d}"
    return None


def _decimal_raw(raw: Raw, digits: int) -> str:
    if raw[1] != 0 and abs(raw[2] + raw[3]) > 4000:
        text = _decimal_far(raw, digits)
        if text is not None:
            return text
    return _decimal(to_fraction(raw), digits)


def decimal_of(iv: Interval, digits: int) -> str | None:
    """The decimal string, `digits` significant digits, both ends of `iv` round to, else ``None``.

    Rounding is to nearest, ties to even, applied to the exact values of the ends.
    """
    lo = _decimal_raw(iv[0], digits)
    hi = _decimal_raw(iv[1], digits)
    return lo if lo == hi else None


def decimal_of_fraction(value: Fraction, digits: int) -> str:
    """The decimal string of an exact rational, `digits` significant digits.

    Rounding is to nearest, ties to even, as in :func:`decimal_of`; for values known
    exactly, which may lie on a tie that no enclosure decides (1/5120 = 0.0001953125
    to six digits).
    """
    return _decimal(Fraction(value), digits)


def certify(enclose: Callable[[int], Interval], accept: Callable[[Interval], T | None]) -> T:
    """Ziv's loop (:func:`softmaxtheory._certify.loop.certify`) over interval enclosures.

    Parameters
    ----------
    enclose : callable
        ``enclose(prec)`` returns an interval containing the exact value, whose
        width shrinks as ``prec`` grows.
    accept : callable
        Returns the decided result for an interval, or ``None``.

    Raises
    ------
    CertificationError
        If no decision is reached below :data:`MAX_PRECISION` bits.
    """
    return loop.certify(
        lambda prec: accept(enclose(prec)), start=START_PRECISION, cap=MAX_PRECISION, what="a bound"
    )


def magnitude_bits(x: float) -> int:
    """A generous estimate of the bits needed to hold :math:`e^{x}` as an integer."""
    return max(0, math.ceil(x * 1.4426950408889634)) + 8
