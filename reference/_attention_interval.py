r"""Attention outputs by interval arithmetic, for precisions past the float error bounds.

The engine (:mod:`._engine`) carries its relative error bounds as float64 numbers,
with :math:`u = 2^{-p}` among them. Past about a thousand bits those underflow:
:math:`u` becomes 0, a bound of 0 claims an exact result, and Ziv's test then
accepted a working value that lay on the wrong side of a rounding midpoint. Keys
with logits :math:`1090, 1090, 0` and values :math:`1, 1 + 2^{-52}, 2` have the
output :math:`1 + 2^{-53} + 2^{-1574}` or so, which rounds up; the engine at 1520
bits returned 1.0. The rows stop at :data:`~softmaxtheory.reference.MAX_PRECISION`
(960 bits) and never get there; attention outputs may need more (ties at the
maximum make exact dyadic means, and a far key moves them off a midpoint by
:math:`e^{-\Delta}`).

So beyond :data:`FLOAT_BOUND_PRECISION` bits an attention row is evaluated again in
mpmath's interval arithmetic (:class:`mpmath.ctx_iv.MPIntervalContext`, outward
rounding, unbounded exponents; its exponential and logarithm widened, see
:func:`_exp`): the entropy, β, every weight
:math:`e^{\beta z_g}` of a group of tied keys, and each output
:math:`\sum_g e^{\beta z_g} S_g / \sum_g n_g e^{\beta z_g}`. An output is accepted
only when both ends of its interval round to the same float (rounding to nearest is
monotone, so the exact value does too), sign of zero included. Nothing is dropped:
far keys are kept, their exponentials are tiny intervals, not zeros.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

from mpmath import mp
from mpmath.ctx_iv import MPIntervalContext
from mpmath.libmp import (
    fone,
    from_float,
    from_man_exp,
    mpf_add,
    mpf_cmp,
    mpf_shift,
    mpf_sign,
    mpf_sub,
)

from softmaxtheory._certify.interval import iv_exp, iv_log
from softmaxtheory.spec import Constant, LogLength, Polynomial, Schedule

from ._api import MAX_PRECISION
from ._rounding import BinaryFormat, round_exact

__all__ = ["FLOAT_BOUND_PRECISION", "interval_outputs"]

#: Working precisions above this many bits take :func:`interval_outputs`: below it
#: every error unit :math:`2^{-p}` of the engine is a normal float64 with room for
#: its safety factors (the rows' :data:`~softmaxtheory.reference.MAX_PRECISION`).
FLOAT_BOUND_PRECISION = MAX_PRECISION


def _rational(ctx: MPIntervalContext, value: Fraction) -> Any:
    return ctx.mpf(value.numerator) / ctx.mpf(value.denominator)


def _exp(ctx: MPIntervalContext, x: Any) -> Any:
    r"""An enclosure of :math:`e^x`: mpmath's own interval exponential is not one.

    ``ctx.exp`` rounds its own working approximation outward, and one that its precision
    represents exactly stays as it is: at 1520 bits the point :math:`-2^{-1074}` maps to
    the point :math:`1 - 2^{-1074}`, which excludes
    :math:`e^{-2^{-1074}} = 1 - 2^{-1074} + 2^{-2149} - \dots`, and an output was
    rounded to the wrong side of a midpoint from it.
    :func:`~softmaxtheory._certify.interval.iv_exp` widens by 16 units in the last place.
    """
    lo, hi = iv_exp(x._mpi_, ctx.prec)
    return ctx.mpf([mp.make_mpf(lo), mp.make_mpf(hi)])


def _log(ctx: MPIntervalContext, x: Any) -> Any:
    r"""An enclosure of :math:`\log x` (as :func:`_exp`)."""
    lo, hi = iv_log(x._mpi_, ctx.prec)
    return ctx.mpf([mp.make_mpf(lo), mp.make_mpf(hi)])


def _entropy(ctx: MPIntervalContext, z: list, counts: list[int], entropy_eps: float) -> Any:
    r"""The row's entropy: :math:`\log s - t/s`, or :math:`-\sum p \log(p + \varepsilon)`."""
    e = [_exp(ctx, zg) for zg in z]
    s = sum((n * eg for n, eg in zip(counts, e, strict=True)), ctx.mpf(0))
    if entropy_eps == 0.0:
        t = sum((n * eg * zg for n, eg, zg in zip(counts, e, z, strict=True)), ctx.mpf(0))
        return _log(ctx, s) - t / s
    eps = ctx.mpf(entropy_eps)
    h = ctx.mpf(0)
    for n, eg in zip(counts, e, strict=True):
        pg = eg / s
        h -= n * pg * _log(ctx, pg + eps)
    return h


def _beta(
    ctx: MPIntervalContext, schedule: Schedule, h: Any, n_eff: int, entropy_eps: float
) -> Any | None:
    """β as an interval; None where a jump of the schedule cannot be decided (or unknown)."""
    if isinstance(schedule, Constant):
        return _rational(ctx, schedule.exact_beta)
    if isinstance(schedule, LogLength):
        if n_eff == 1:
            return ctx.mpf(0)
        return _rational(ctx, schedule.exact_s) * _log(ctx, ctx.mpf(n_eff))
    if not isinstance(schedule, Polynomial):
        return None
    t_lo, t_hi = _rational(ctx, schedule.exact_threshold)._mpi_
    lo, hi = h._mpi_
    if mpf_cmp(hi, t_lo) <= 0 and (mpf_cmp(hi, t_lo) < 0 or t_lo == t_hi):
        return ctx.mpf(1)  # H <= theta
    straddles = mpf_cmp(lo, t_hi) <= 0
    if straddles and schedule.jumps_for(entropy_eps):
        return None
    poly = ctx.mpf(0)
    for c in schedule.exact_coefficients:
        poly = poly * h + _rational(ctx, c)
    p_lo, p_hi = poly._mpi_
    top = p_hi if mpf_cmp(p_hi, fone) > 0 else fone
    # past theta beta = max(P, 1); straddling a continuous threshold (P(theta) <= 1) it lies
    # in [1, max(P, 1)]
    bottom = p_lo if not straddles and mpf_cmp(p_lo, fone) > 0 else fone
    return ctx.mpf([mp.make_mpf(bottom), mp.make_mpf(top)])


def _ends(x: Any, fmt: BinaryFormat) -> tuple[float, float]:
    """The ends of the interval `x`, each rounded to `fmt` (nearest even)."""
    lo, hi = (round_exact(*_parts(end), fmt) for end in x._mpi_)
    return lo, hi


def _same(a: float, b: float) -> bool:
    """Whether two floats are the same, sign of zero included."""
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


def interval_outputs(
    z: list,
    counts: list[int],
    sums: list[list[tuple]],
    n_eff: int,
    fmt: BinaryFormat,
    schedule: Schedule,
    entropy_eps: float,
    p: int,
    fixed: dict[int, float],
) -> list[float] | None:
    r"""Certified outputs of one query row at `p` bits of interval arithmetic, or None.

    Parameters
    ----------
    z : list of mpf tuples
        Exact shifted logits of the groups of tied keys (:math:`z_g \le 0`).
    counts : list of int
        Keys per group.
    sums : list of list of mpf tuples
        Exact sum of each group's values, per output column.
    n_eff : int
        Unmasked keys.
    fmt, schedule, entropy_eps
        As for :func:`~softmaxtheory.reference.adaptive_attention`.
    p : int
        Working precision of the intervals.
    fixed : dict
        Columns already known exactly (``_common_means`` of :mod:`.attention`).
    """
    ctx = MPIntervalContext()
    ctx.prec = p
    zi = [_point(ctx, zg) for zg in z]
    h = _entropy(ctx, zi, counts, entropy_eps) if schedule.needs_entropy else None
    beta = _beta(ctx, schedule, h, n_eff, entropy_eps)
    if beta is None:
        return None
    w = [_exp(ctx, beta * zg) for zg in zi]
    s = sum((n * wg for n, wg in zip(counts, w, strict=True)), ctx.mpf(0))
    out = []
    for c in range(len(sums[0]) if sums else 0):
        if c in fixed:
            out.append(fixed[c])
            continue
        num = sum((wg * _point(ctx, sg[c]) for wg, sg in zip(w, sums, strict=True)), ctx.mpf(0))
        lo, hi = _ends(num / s, fmt)
        # both ends round alike: so does the exact value (rounding is monotone)
        value = lo
        if not _same(lo, hi):
            value = _across(ctx, lo, hi, w, counts, [sg[c] for sg in sums], fmt)
        if value is None:
            return None
        out.append(value)
    return out


def _across(
    ctx: MPIntervalContext,
    lo: float,
    hi: float,
    w: list,
    counts: list[int],
    sums: list[tuple],
    fmt: BinaryFormat,
) -> float | None:
    r"""Round an output whose interval holds one rounding boundary :math:`\mu`, or None.

    `lo` and `hi` are the roundings of its ends. Ties at the maximum make exact dyadic
    means, and a far key moves the output off such a mean by :math:`e^{-\Delta}`: no
    precision short of :math:`\Delta \log_2 e` bits separates the interval from
    :math:`\mu`. But :math:`o - \mu = \sum_g w_g (S_g - n_g \mu) / \sum_g n_g w_g`,
    and a group whose mean is :math:`\mu` contributes exactly 0, so the sign of the
    numerator is known at any precision: the far key's term alone, a tiny interval
    that excludes 0. (A numerator of exactly 0 would need every group's mean to be
    :math:`\mu`: such a column is one of ``fixed``, rounded exactly beforehand.)
    """
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo == hi:
        return None  # (a boundary at zero separates signed zeros: left to the engine)
    mu = mpf_shift(mpf_add(from_float(lo), from_float(hi), 0), -1)  # exact
    # mu is the one boundary between lo and hi when just below it rounds to lo, above to hi
    nudge = from_man_exp(1, mu[2] + mu[3] - 2 * fmt.precision - 8)
    below = round_exact(*_parts(mpf_sub(mu, nudge, 0)), fmt)
    above = round_exact(*_parts(mpf_add(mu, nudge, 0)), fmt)
    if below != lo or above != hi:
        return None
    m = _point(ctx, mu)
    d = sum(
        (wg * (_point(ctx, sg) - n * m) for wg, n, sg in zip(w, counts, sums, strict=True)),
        ctx.mpf(0),
    )
    d_lo, d_hi = d._mpi_
    if mpf_sign(d_lo) > 0:
        return hi
    if mpf_sign(d_hi) < 0:
        return lo
    return None


def _parts(x: tuple) -> tuple[int, int, int]:
    sign, man, exp, _ = x
    return sign, int(man), int(exp)  # ints also under mpmath's gmpy backend (mpz)


def _point(ctx: MPIntervalContext, x: tuple) -> Any:
    """An exact mpf tuple as a point interval (the conversion keeps every bit)."""
    return ctx.mpf(mp.make_mpf(x))
