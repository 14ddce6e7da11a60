r"""Correct rounding of exact values to binary formats, and Ziv's rounding test.

A binary format (:class:`softmaxtheory._formats.BinaryFormat`) is described by its
precision :math:`P` (bits of significand, hidden bit included), the exponent
:math:`q_{\min}` of its smallest subnormal :math:`2^{q_{\min}}` and the exponent
:math:`e_{\max}` of its largest binade. A real :math:`v = M \cdot 2^{E}`
(integer :math:`M`) is rounded to nearest, ties to even, on the grid :math:`2^{q}`
with :math:`q = \max(\lfloor\log_2|v|\rfloor - P + 1,\ q_{\min})`. This handles
the subnormal range with one rounding, where ``math.ldexp`` of an already rounded
significand would round twice.

The rounding test: an approximation :math:`\tilde v` with :math:`|v - \tilde v|
\le r` determines the correctly rounded value when both ends of
:math:`[\tilde v - r, \tilde v + r]` round to the same float, because rounding is
monotone. It is the ``accept`` step of the reference's Ziv loop
(:mod:`softmaxtheory._certify.loop`).
"""

from __future__ import annotations

import math
from fractions import Fraction

from .._formats import BinaryFormat

__all__ = ["round_ball", "round_exact", "round_fraction"]


def round_exact(sign: int, man: int, exp: int, fmt: BinaryFormat) -> float:
    r"""Round :math:`(-1)^{sign} \cdot man \cdot 2^{exp}` to `fmt`, nearest-even.

    Parameters
    ----------
    sign : int
        0 for positive, 1 for negative.
    man : int
        Non-negative integer significand.
    exp : int
        Binary exponent.
    fmt : BinaryFormat
        Target format.

    Returns
    -------
    float
        The rounded value as a Python float (exactly representable in `fmt`),
        ``±inf`` on overflow, ``±0.0`` on underflow.
    """
    if man == 0:
        return -0.0 if sign else 0.0
    top = exp + man.bit_length()  # 2**(top-1) <= value < 2**top
    # far outside the format, decided without shifting by the exponent (an end of
    # e**-1e308 has an exponent of -1.4e308: 1 << shift would not fit in memory)
    if top < fmt.qmin:  # below half the smallest subnormal, 2**(qmin - 1)
        return -0.0 if sign else 0.0
    if top > fmt.emax + 2:  # at least 2**(emax + 1), beyond the largest finite value
        return -math.inf if sign else math.inf
    q = max(top - fmt.precision, fmt.qmin)
    shift = q - exp
    if shift <= 0:
        rounded = man << -shift
    else:
        rounded = man >> shift
        rem = man & ((1 << shift) - 1)
        half = 1 << (shift - 1)
        if rem > half or (rem == half and rounded & 1):
            rounded += 1
    if rounded and rounded.bit_length() + q > fmt.emax + 1:
        value = math.inf
    else:
        value = math.ldexp(rounded, q)
    return -value if sign else value


def round_fraction(value: Fraction, fmt: BinaryFormat) -> float:
    r"""Round the rational `value` to `fmt`, nearest-even (``+0.0`` for 0).

    The quotient is taken to at least :math:`P + 2` bits and its remainder kept as a
    sticky bit, which no rounding boundary of the format can separate from the
    exact value: a tie is a tie only when the division is exact.
    """
    if value == 0:
        return 0.0
    sign = int(value < 0)
    a, b = abs(value.numerator), value.denominator
    k = fmt.precision + 2 + b.bit_length() - a.bit_length() + 1
    man, rem = divmod(a << k if k >= 0 else a, b if k >= 0 else b << -k)
    return round_exact(sign, 2 * man + (rem != 0), -k - 1, fmt)


def round_ball(
    mpf: tuple,
    rel: float,
    fmt: BinaryFormat,
    extra_log2: int | None = None,
    *,
    nonneg: bool = False,
) -> float | None:
    r"""Ziv's rounding test for a value known within a relative and an absolute bound.

    Parameters
    ----------
    mpf : tuple
        mpmath raw value ``(sign, man, exp, bc)`` approximating the exact value
        :math:`v`.
    rel : float
        Bound on :math:`|v - \tilde v| / |\tilde v|` (non-negative).
    fmt : BinaryFormat
        Target format.
    extra_log2 : int, optional
        An extra absolute error :math:`2^{k}` (for contributions too small to be
        represented as floats); ``None`` for none.
    nonneg : bool, default False
        The exact value is known to be :math:`\ge 0` (an entropy, a
        coefficient). A ball that holds zero is then decided where its upper end
        rounds to zero: every value in :math:`[0, \tilde v + \mathrm{err}]` does,
        to ``+0.0``. Without it such a ball is undecided (the sign of the zero is
        not known).

    Returns
    -------
    float or None
        The correctly rounded value of every real in the ball, hence of the exact
        value, or ``None`` when the ball contains a rounding boundary or zero
        itself (the sign of a zero result is then open), except where `nonneg`
        decides it. An exactly zero approximation with no error gives ``+0.0``.
    """
    sign, man, exp, _ = mpf
    man, exp = int(man), int(exp)  # gmpy2's mpz under mpmath's gmpy backend
    if not (rel >= 0.0 and math.isfinite(rel)):
        return None
    if man == 0:
        if extra_log2 is None:
            return 0.0
        # every value within 2**extra of zero rounds to a zero, but of which sign is known
        # only for a value that cannot be negative
        return 0.0 if nonneg and extra_log2 < fmt.qmin - 1 else None
    if rel == 0.0 and extra_log2 is None:
        return round_exact(sign, man, exp, fmt)
    # widen the significand so that one unit lies far below the error bound
    widen = max(0, 64 + 53 - man.bit_length())
    man <<= widen
    exp -= widen
    err = 1
    if rel:
        frac, e = math.frexp(rel)
        prod = man * math.ceil(math.ldexp(frac, 53))
        k = e - 53
        err += prod << k if k >= 0 else ((prod - 1) >> -k) + 1
    if extra_log2 is not None:
        err += 1 << (extra_log2 - exp) if extra_log2 >= exp else 1
    if err >= man:
        # the ball holds zero: the sign of the result is not decided, unless it cannot be
        # negative and the ball's upper end already rounds to zero (an entropy below the
        # subnormals, whose dead items' mass is as large as the value itself)
        if nonneg and sign == 0 and round_exact(0, man + err, exp, fmt) == 0.0:
            return 0.0
        return None
    lo = round_exact(sign, man - err, exp, fmt)
    hi = round_exact(sign, man + err, exp, fmt)
    return hi if lo == hi else None
