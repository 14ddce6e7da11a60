"""Correct rounding to binary formats and Ziv's rounding test (_certify.rounding)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from mpmath import mp
from mpmath.libmp import from_man_exp

from softmaxtheory.reference import FORMATS, round_exact
from softmaxtheory.reference._rounding import format_for, round_ball, round_fraction
from tests.support.independent import round_to

F64, F32, F16 = FORMATS["float64"], FORMATS["float32"], FORMATS["float16"]


def _cpython_f64(man: int, exp: int) -> float:
    try:
        return float(Fraction(man) * Fraction(2) ** exp)  # int/int division: correctly rounded
    except OverflowError:
        return math.inf


mans = st.integers(min_value=1, max_value=2**120)
exps = st.integers(min_value=-1250, max_value=1000)


@given(mans, exps, st.booleans())
@example(1, -1075, False)  # exactly half the least subnormal: ties to even (0)
@example(3, -1076, False)  # 0.75 of the least subnormal: rounds up
@example(2**53 - 1, 971, False)  # the largest float
@example(2**54 - 1, 970, False)  # just below max + half ulp: max
@example(2**54 - 1, 971, True)  # overflows to -inf
@example(2**52 + 1, -1075 - 51, False)  # subnormal / normal boundary region
def test_round_exact_float64_matches_cpython(man, exp, negative):
    got = round_exact(int(negative), man, exp, F64)
    want = _cpython_f64(man, exp)
    assert got == (-want if negative else want)


@pytest.mark.parametrize("fmt", [F32, F16])
@given(man=st.integers(min_value=1, max_value=2**60), exp=st.integers(min_value=-200, max_value=80))
@example(man=1, exp=-150)  # float32: half the least subnormal ties to 0
@example(man=3, exp=-151)
@example(man=2**25 - 1, exp=-25)  # float32: rounds up to the next binade
@example(man=2**12 - 1, exp=5)  # float16: beyond max + half ulp, so inf
@example(man=2**60 - 2**35, exp=68)  # float32: max + half ulp exactly, a tie: to inf
@example(man=1_152_921_470_247_108_544, exp=68)  # float32: past max + half ulp, below 2**128
@example(man=1_152_921_401_527_631_937, exp=68)  # float32: rounds to max (its neighbour is inf)
def test_round_exact_narrow_formats_match_independent(fmt, man, exp):
    got = round_exact(0, man, exp, fmt)
    value = mp.make_mpf(from_man_exp(man, exp))
    if abs(Fraction(man) * Fraction(2) ** exp) >= Fraction(2) ** (fmt.emax + 1):
        assert got == math.inf
    else:
        want = round_to(value, fmt.dtype)
        assert got == want
    assert float(fmt.dtype.type(got)) == got  # representable in the format


@pytest.mark.parametrize("fmt", [F64, F32, F16])
def test_round_exact_far_outside_the_format_is_immediate(fmt):
    # an interval end of e**-1e308 has an exponent near -1.4e308: the shift by it raised
    # OverflowError ("too many digits") or MemoryError in adaptive_attention
    big = 10**20
    assert math.copysign(1.0, round_exact(1, 2**70 + 1, -big, fmt)) == -1.0
    assert round_exact(0, 2**70 + 1, -big, fmt) == 0.0
    assert round_exact(0, 3, big, fmt) == math.inf and round_exact(1, 3, big, fmt) == -math.inf
    # the cut-offs themselves: below half the least subnormal, and 2**(emax + 2)
    assert round_exact(0, 2**40 - 1, fmt.qmin - 41, fmt) == 0.0
    assert round_exact(0, 1, fmt.qmin - 1, fmt) == 0.0  # exactly half: ties to even
    assert round_exact(0, 3, fmt.qmin - 2, fmt) == math.ldexp(1.0, fmt.qmin)
    assert round_exact(0, 1, fmt.emax + 1, fmt) == math.inf


def test_round_exact_zero_keeps_sign():
    assert math.copysign(1.0, round_exact(1, 0, 0, F64)) == -1.0
    assert round_exact(0, 0, 5, F32) == 0.0


def test_formats_describe_numpy():
    for name, fmt in FORMATS.items():
        info = np.finfo(name)
        assert fmt.precision == info.nmant + 1
        assert math.ldexp(1.0, fmt.qmin) == float(info.smallest_subnormal)
        assert fmt.emax == info.maxexp - 1
        assert format_for(name) is fmt
    with pytest.raises(ValueError, match="dtype must be float64, float32 or float16"):
        format_for(np.int32)
    with pytest.raises(ValueError, match="dtype"):
        format_for("not-a-dtype")


@given(
    man=st.integers(min_value=2**70, max_value=2**71),
    exp=st.integers(min_value=-200, max_value=0),
    rel_exp=st.integers(min_value=-70, max_value=-20),
)
@example(man=(2**53 + 1) << 17, exp=-70, rel_exp=-70)  # exactly a float64 midpoint
def test_round_ball_is_sound(man, exp, rel_exp):
    """A certified value is the rounding of every point of the ball; else the ball straddles."""
    rel = math.ldexp(1.0, rel_exp)
    mid = from_man_exp(man, exp)
    got = round_ball(mid, rel, F64)
    radius = Fraction(man) * Fraction(2) ** exp * Fraction(rel)
    centre = Fraction(man) * Fraction(2) ** exp
    ends = [float(centre - radius), float(centre + radius), float(centre)]
    if got is None:
        # refusing is allowed only when a slightly wider ball really straddles a boundary
        wide = radius * (1 + Fraction(1, 2**40))
        assert float(centre - wide) != float(centre + wide)
    else:
        assert all(e == got for e in ends)


def test_round_ball_refuses_straddling_and_accepts_zero():
    half = from_man_exp(2**53 + 1, -53)  # 1 + 2**-53: the midpoint between 1 and 1 + 2**-52
    assert round_ball(half, 0.0, F64) == 1.0  # exact midpoint: ties to even
    assert round_ball(half, 2.0**-80, F64) is None  # either side possible
    assert round_ball(from_man_exp(0, 0), 0.0, F64) == 0.0
    # a zero midpoint with an error: which zero only where the value cannot be negative
    assert round_ball(from_man_exp(0, 0), 0.5, F64, extra_log2=-1200) is None
    assert round_ball(from_man_exp(0, 0), 0.5, F64, extra_log2=-1200, nonneg=True) == 0.0
    assert round_ball(from_man_exp(0, 0), 0.0, F64, extra_log2=-1074, nonneg=True) is None
    assert round_ball(from_man_exp(1, 0), math.inf, F64) is None


def _nearest(value: Fraction, dtype) -> float:
    """The float of `dtype` nearest `value`, ties to even, by exact comparison."""
    t = np.dtype(dtype).type
    inf = math.inf if value > 0 else -math.inf  # (copysign would take float(value) first)
    with np.errstate(over="ignore"):
        c = t(float(value)) if abs(value) < 2**1000 else t(inf)
    cands = [
        x for x in (np.nextafter(c, t(-np.inf)), c, np.nextafter(c, t(np.inf))) if np.isfinite(x)
    ]
    top = np.finfo(t).max
    if abs(value) >= Fraction(float(top)) + Fraction(float(top - np.nextafter(top, t(0)))) / 2:
        return inf
    bits = np.uint16 if t is np.float16 else np.uint32
    best = min(cands, key=lambda x: (abs(Fraction(float(x)) - value), int(x.view(bits)) & 1))
    return float(best) if best != 0 or value >= 0 else -0.0


@given(st.integers(-(2**130), 2**130), st.integers(1, 2**130), st.integers(-1100, 1100))
@example(3, 2, -1075)  # 1.5 least subnormals: a tie, to even (2 of them)
@example(1, 3, 0)  # a quotient that never ends
@example(2**53 + 1, 1, 0)  # an exact tie in the normal range: to even
@example(-1, 1, -1080)  # below half the least subnormal: -0.0
@example(3, 2, -150)  # float32: 1.5 least subnormals, to even
@example(2**11 + 1, 1, 0)  # float16: an exact tie, to even
@example(1, 1, 1024)  # 2**1024: past float64's range (the helper once overflowed in float())
def test_round_fraction_matches_cpython_and_the_narrow_formats(num, den, shift):
    """round_fraction: a rational's one correct rounding (CPython's float() of a Fraction
    is correctly rounded; float32 and float16 by exact comparison with their neighbours)."""
    value = Fraction(num, den) * Fraction(2) ** shift
    try:
        want = float(value)
    except OverflowError:
        want = math.inf if value > 0 else -math.inf
    got = round_fraction(value, F64)
    assert got == want and math.copysign(1.0, got) == math.copysign(1.0, want)
    for fmt in (F32, F16):
        got, want = round_fraction(value, fmt), _nearest(value, fmt.dtype)
        assert got == want and math.copysign(1.0, got) == math.copysign(1.0, want)
