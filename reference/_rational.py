r"""Exact rational weights under :class:`~softmaxtheory.spec.LogLength`.

With :math:`\beta = s \log n` (:math:`n` the unmasked items) the weight of an item
:math:`z \le 0` below the maximum is :math:`e^{\beta z} = n^{s z}`. It is rational when
:math:`n` is a perfect :math:`b`-th power for :math:`s z = a / b` in lowest terms (an
integer :math:`s z` above all). Then a coefficient, or an attention output, is a
fraction that can be exactly a rounding tie (:math:`2187 / 8192` in float16, from
:math:`6^7` over a sum of powers of 6) or exactly 0; no error ball decides either,
so such rows are computed as fractions and rounded once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from fractions import Fraction

from softmaxtheory._certify.interval import to_fraction
from softmaxtheory.spec import LogLength, Schedule

from . import _engine as eng
from ._rounding import BinaryFormat, round_fraction

__all__ = ["RATIONAL_BITS", "integer_root", "loglength_weights", "rational_coefficients"]

#: The largest weight the exact path forms, in bits of its numerator or denominator.
RATIONAL_BITS = 4096


def integer_root(n: int, b: int) -> int | None:
    """The integer ``c`` with ``c**b == n``, or None."""
    if b == 1:
        return n
    if n.bit_length() < b:  # c >= 2 has c**b >= 2**b > n
        return None
    c = round(n ** (1.0 / b))
    return next((r for r in (c - 1, c, c + 1) if r >= 2 and r**b == n), None)


def loglength_weights(
    shifts: Iterable, n_eff: int, schedule: Schedule
) -> dict[tuple, Fraction] | None:
    r"""Each distinct exact shift's weight :math:`n^{s z}` as a fraction, or None.

    Parameters
    ----------
    shifts : iterable of mpf tuples
        The distinct shifts :math:`z \le 0` (the maximum's is 0).
    n_eff : int
        The number of unmasked items, :math:`n`.
    schedule : Schedule
        None unless a :class:`~softmaxtheory.spec.LogLength`.

    Returns
    -------
    dict or None
        None where the schedule is not LogLength, a weight is irrational, or a weight
        would take more than :data:`RATIONAL_BITS` bits.
    """
    if not isinstance(schedule, LogLength):
        return None
    s = schedule.exact_s
    weights = {}
    for d in shifts:
        r = s * to_fraction(d) if n_eff > 1 else Fraction(0)
        c = integer_root(n_eff, r.denominator)
        if c is None or abs(r.numerator) * c.bit_length() > RATIONAL_BITS:
            return None
        weights[d] = Fraction(c) ** r.numerator
    return weights


def rational_coefficients(
    row: eng.PreparedRow, schedule: Schedule, fmt: BinaryFormat
) -> list[float] | None:
    """The adaptive softmax of `row` in `fmt`, each coefficient a fraction rounded once.

    Over the whole row (masked entries 0), or None where :func:`loglength_weights` is.
    """
    counts = Counter(row.z)
    weights = loglength_weights(counts, row.n_eff, schedule)
    if weights is None:
        return None
    den = sum(w * counts[d] for d, w in weights.items())
    values = {d: round_fraction(w / den, fmt) for d, w in weights.items()}
    out: list = [0.0] * row.n
    for pos, d in zip(row.index.tolist(), row.z, strict=True):
        out[pos] = values[d]
    return out
