"""The float interval arithmetic behind the fast branch and bound (``_certify.floativ``).

Every operation must enclose the exact result (checked against rationals and
mpmath at 200 bits), and the branch and bound of ``_certify.extremal`` must give
bounds that hold whichever arithmetic (floats or mpmath) a box was bounded in.
"""

from __future__ import annotations

import math
import operator
import sys
from fractions import Fraction

import mpmath
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from softmaxtheory import bounds
from softmaxtheory._certify import adaptive as adp
from softmaxtheory._certify import extremal as ext
from softmaxtheory._certify import floativ as fv
from softmaxtheory.spec import PaperPolynomial, Polynomial

finite = st.floats(allow_nan=False, allow_infinity=False)
moderate = st.floats(-1e150, 1e150, allow_nan=False) | st.floats(-4.0, 4.0)


def interval(a: float, b: float) -> tuple[float, float]:
    return (a, b) if a <= b else (b, a)


def inside(value: Fraction, iv: tuple[float, float]) -> bool:
    return Fraction(iv[0]) <= value <= Fraction(iv[1])


OPS = {"add": (fv.add, operator.add), "sub": (fv.sub, operator.sub), "mul": (fv.mul, operator.mul)}


@given(name=st.sampled_from(sorted(OPS)), a=finite, b=finite, c=finite, d=finite)
@example(a=0.1, b=0.1, c=0.2, d=0.2, name="add")  # 0.1 + 0.2 is not a float
@example(a=1e308, b=1e308, c=1e308, d=1e308, name="add")  # overflows: refused
@example(a=5e-324, b=5e-324, c=0.5, d=0.5, name="mul")  # a subnormal halved
@example(a=-3.0, b=2.0, c=-1e-300, d=7.0, name="mul")  # signs mixed
def test_arithmetic_encloses_the_exact_result(name, a, b, c, d):
    """The exact result at every pair of ends lies inside; an overflow is refused, never inf."""
    fast, exact = OPS[name]
    x, y = interval(a, b), interval(c, d)
    try:
        got = fast(x, y)
    except OverflowError:
        ends = [abs(exact(Fraction(p), Fraction(q))) for p in x for q in y]
        assert max(ends) > Fraction(sys.float_info.max) / 2
        return
    assert all(math.isfinite(e) for e in got) and got[0] <= got[1]
    for p in x:
        for q in y:
            assert inside(exact(Fraction(p), Fraction(q)), got), (p, q, got)


def test_inexact_results_are_widened():
    """The float nearest to 0.1 + 0.2 is above it; the enclosure holds both sides."""
    exact = Fraction(0.1) + Fraction(0.2)
    lo, hi = fv.add((0.1, 0.1), (0.2, 0.2))
    assert Fraction(lo) < exact < Fraction(hi)
    assert Fraction(0.1 + 0.2) > exact  # rounding to nearest alone would miss it


@given(a=moderate, b=moderate, c=moderate, d=moderate)
@example(a=1.0, b=1.0, c=3.0, d=3.0)
@example(a=-1.0, b=2.0, c=-3.0, d=-3.0)
def test_division_encloses_the_exact_quotient(a, b, c, d):
    x, y = interval(a, b), interval(c, d)
    if y[0] <= 0.0 <= y[1]:
        with pytest.raises(ZeroDivisionError):
            fv.div(x, y)
        return
    try:
        got = fv.div(x, y)
    except OverflowError:
        return
    for p in x:
        for q in y:
            assert inside(Fraction(p) / Fraction(q), got)


def mp_exact(func, x: float) -> mpmath.mpf:
    with mpmath.workprec(200):
        return func(mpmath.mpf(x))


def mp_inside(value: mpmath.mpf, iv: tuple[float, float]) -> bool:
    with mpmath.workprec(200):
        return mpmath.mpf(iv[0]) <= value <= mpmath.mpf(iv[1])


@given(a=st.floats(-800.0, 709.0), b=st.floats(-800.0, 709.0))
@example(a=-745.5, b=-700.5)  # below e^-700: enclosed by [0, e^-700]
@example(a=-800.0, b=-800.0)  # a point below -700: its lower end was e^-700, above e^-800
@example(a=0.0, b=0.0)
@example(a=709.0, b=709.78)
def test_exp_encloses(a, b):
    x = interval(a, b)
    try:
        got = fv.exp(x)
    except OverflowError:
        assert x[1] > 709.0
        return
    assert got[0] >= 0.0
    assert mp_inside(mp_exact(mpmath.exp, x[0]), got)
    assert mp_inside(mp_exact(mpmath.exp, x[1]), got)


@given(a=st.floats(5e-324, 1e308), b=st.floats(5e-324, 1e308))
@example(a=5e-324, b=1.0)
@example(a=1.0, b=1.0)  # log 1 = 0 exactly
@example(a=0.9999999999999999, b=1.0000000000000002)
def test_log_encloses(a, b):
    x = interval(a, b)
    got = fv.log(x)
    assert mp_inside(mp_exact(mpmath.log, x[0]), got)
    assert mp_inside(mp_exact(mpmath.log, x[1]), got)


def test_refusals():
    with pytest.raises(ValueError, match="positive"):
        fv.log((0.0, 1.0))
    with pytest.raises(OverflowError):
        fv.exp((0.0, 710.0))
    with pytest.raises(OverflowError):
        fv.point(Fraction(10) ** 400)
    with pytest.raises(OverflowError):
        fv.point(math.inf)
    assert fv.point(2**53) == (2.0**53, 2.0**53)  # exact
    lo, hi = fv.point(2**53 + 1)  # not a float: enclosed
    assert lo < 2**53 + 1 < hi
    lo, hi = fv.point(Fraction(1, 3))
    assert Fraction(lo) < Fraction(1, 3) < Fraction(hi)


def relative_error(got: float, exact: mpmath.mpf) -> mpmath.mpf:
    with mpmath.workprec(200):
        return abs(mpmath.mpf(got) - exact) / abs(exact)


EXP_HARD = [
    0.0, 5e-324, -5e-324, 1e-300, 0.34657359027997264, -0.34657359027997264,
    0.34657359027997275, 0.6931471805599453, -0.6931471805599453, 1.0, -1.0, 100.5,
    -700.0, -699.9, 709.0, 709.782712893384, 2.0**-30, -(2.0**-30), 354.891356446692,
]  # fmt: skip
LOG_HARD = [
    5e-324, 2.2250738585072014e-308, 1.0, math.nextafter(1.0, 0.0), math.nextafter(1.0, 2.0),
    0.7071067811865476, 0.7071067811865475, 1.4142135623730951, 2.0, 0.5, 1.9999999999999998,
    1.7976931348623157e308, 1e-5, 3.0, 1.5,
]  # fmt: skip


@given(x=st.floats(-700.0, 709.78) | st.sampled_from(EXP_HARD) | st.floats(-1e-3, 1e-3))
@example(x=0.34657359027997264)  # the edge of the reduction
def test_exp_approx_is_within_its_proven_bound(x):
    """Within 2**-46 relative (the docstring's proof); the widening covers 2**-44."""
    got = fv.exp_approx(x)
    assert relative_error(got, mp_exact(mpmath.exp, x)) < mpmath.mpf(2) ** -46


@given(x=st.floats(5e-324, 1.7976931348623157e308) | st.sampled_from(LOG_HARD))
@example(x=math.nextafter(1.0, 2.0))  # log near 0: relative accuracy kept
@example(x=5e-324)
def test_log_approx_is_within_its_proven_bound(x):
    got = fv.log_approx(x)
    exact = mp_exact(mpmath.log, x)
    if x == 1.0:
        assert got == 0.0
    else:
        assert relative_error(got, exact) < mpmath.mpf(2) ** -46


def test_series_and_constants():
    """ln 2's parts: the first has 32 significant bits (its products are exact), and the
    two sum to ln 2 within 2**-86; the series' reductions keep |r| <= 0.3466, |s| <= 0.1716."""
    hi, lo = Fraction(fv._LN2_HI), Fraction(fv._LN2_LO)
    assert (hi * 2**32).denominator == 1
    with mpmath.workprec(300):
        err = abs(
            mpmath.mpf(hi.numerator) / hi.denominator + mpmath.mpf(fv._LN2_LO) - mpmath.log(2)
        )
        assert err < mpmath.mpf(2) ** -86
    assert lo > 0
    worst = max(abs(fv.exp_approx(x) / math.exp(x) - 1) for x in EXP_HARD[:-1] if x > -700)
    assert worst < 1e-13
    s = (math.sqrt(2) - 1) / (math.sqrt(2) + 1)
    assert s < 0.1716


# ------------------------------------------------------------------ the branch and bound


SCHEDULES = [
    PaperPolynomial(),
    Polynomial(("-1", "4", "-2"), "0.5"),
    Polynomial(("-20", "48", "-18.8"), "0.7"),  # jumps at its threshold
]


@given(schedule=st.sampled_from(SCHEDULES), a=st.floats(0.0, 9.0), width=st.floats(0.0, 3.0))
@example(a=0.0, width=0.5, schedule=PaperPolynomial())  # below the threshold: 1
@example(a=2.0, width=0.1, schedule=PaperPolynomial())  # across the peak: beta_max
def test_float_beta_bound_is_above_the_exact_one(schedule, a, width):
    """beta_up_float bounds the same supremum as beta_up_on (exact), a few ulps above at most."""
    b = a + width
    exact = adp.beta_up_on(schedule, Fraction(a), Fraction(b))
    fast = adp.beta_up_float(schedule, a, b)
    assert exact <= fast <= exact * (1 + 1e-12)


def as_mp(value: Fraction | float) -> mpmath.mpf:
    value = Fraction(value)
    with mpmath.workprec(200):
        return mpmath.mpf(value.numerator) / value.denominator


def true_top(c: float, w: float, z: float, y: float, schedule) -> mpmath.mpf:
    """The adaptive top coefficient of the row (top item, w at depth c, z at depth y), exactly."""
    with mpmath.workprec(200):
        c, w, z, y = (mpmath.mpf(v) for v in (c, w, z, y))
        s1 = 1 + w * mpmath.exp(-c) + z * mpmath.exp(-y)
        h = mpmath.log(s1) + (w * c * mpmath.exp(-c) + z * y * mpmath.exp(-y)) / s1
        beta = mpmath.mpf(1)
        theta = schedule.exact_threshold
        if h > mpmath.mpf(theta.numerator) / theta.denominator:
            acc = mpmath.mpf(0)
            for coefficient in schedule.exact_coefficients:
                acc = acc * h + mpmath.mpf(coefficient.numerator) / coefficient.denominator
            beta = max(acc, mpmath.mpf(1))
        return 1 / (1 + w * mpmath.exp(-beta * c) + z * mpmath.exp(-beta * y))


@given(
    c0=st.floats(0.0, 5.69),
    c_width=st.floats(0.0, 1.0),
    w0=st.floats(0.0, 2000.0),
    w_width=st.floats(0.0, 500.0),
    z0=st.floats(0.0, 2000.0),
    z_width=st.floats(0.0, 500.0),
    bottom=st.booleans(),
)
@example(c0=4.4, c_width=0.01, w0=9.0, w_width=0.5, z0=1240.0, z_width=2.0, bottom=True)
def test_box_bounds_hold_in_both_arithmetics(c0, c_width, w0, w_width, z0, z_width, bottom):
    """On a box of rows, the float bound and the mpmath bound are both above every row's
    coefficient (corners and centre, exact), and agree to 1e-9."""
    spread, schedule = 5.69, PaperPolynomial()
    c1 = min(c0 + c_width, spread)
    y = spread if bottom else 0.0
    box = ext._Box3(y, c0, c1, w0, w0 + w_width, z0, z0 + z_width)
    least = 1 + int(w0 + z0)
    fast = ext._upper3(box, least, schedule)
    fine = ext._upper3_in(ext._Mp, box, least, schedule)
    assert abs(fast - fine) <= 1e-9 * fine
    for c in (c0, c1, (c0 + c1) / 2):
        for w, z in ((box.w0, box.z1), (box.w1, box.z1), (box.w1, box.z0)):
            if w + z >= least - 1:
                truth = true_top(c, w, z, y, schedule)
                assert truth <= as_mp(fast) and truth <= as_mp(fine), (c, w, z)


def test_per_length_bracket_is_exact_to_the_float_after_refinement():
    """The float bounds are ~1e-13 loose; the final answer is bounded again in mpmath."""
    b = bounds.adaptive_max_coefficient_bracket(4096, 5.69)
    assert b.lower <= b.upper <= math.nextafter(b.lower, 1.0)


def test_overflowing_floats_fall_back_to_mpmath(monkeypatch):
    """P(H) = 2 - 1e307 (H - 1)^2 overflows floats on most boxes: mpmath bounds those, and
    the bracket still holds its witness row."""
    big = 10**307
    schedule = Polynomial((str(-big), str(2 * big), str(2 - big)), "0.5")
    calls = {"mp": 0}
    real = ext._Mp.exp

    def counting(a):
        calls["mp"] += 1
        return real(a)

    monkeypatch.setattr(ext._Mp, "exp", staticmethod(counting))
    b = bounds.adaptive_max_coefficient_bracket(30, 3.0, schedule)
    assert calls["mp"] > 0
    assert b.lower <= b.upper <= bounds.adaptive_max_coefficient(30, 3.0, schedule)


def test_long_rows_take_rational_boxes():
    """Counts past 2**1000 take rational coordinates; below, floats (rounded up at the top
    of the boxes: a float past 2**53 may be below the integer)."""
    assert ext._coordinate(2**1000) is float
    assert ext._coordinate(2**1000 + 1) is Fraction
    top = ext._count_up(float, 2**60 + 1)
    assert Fraction(top) >= 2**60 + 1 and top == math.nextafter(2.0**60, math.inf)
    n = 2**1001 + 1
    fast = ext.adaptive_top_upper(n, 800.0, PaperPolynomial(), budget=50)
    assert Fraction(1, n) < fast <= 1


@pytest.mark.parametrize(
    ("call", "args"),
    [
        ("adaptive_max_coefficient_bracket", (10**309, 720.0)),
        ("adaptive_max_coefficient_bracket", (2**1024, 720.0)),
        ("adaptive_dispersion_bracket", (0.9, 720.0)),
    ],
)
def test_counts_beyond_the_float_range(call, args):
    """Guide values took float() of counts past 1.8e308: OverflowError from valid input
    (the bounds command at --spread 720 --eps 0.9 printed a traceback)."""
    kwargs = {"budget": 2000} if call == "adaptive_dispersion_bracket" else {}
    b = getattr(bounds, call)(*args, **kwargs)
    assert b.lower <= b.upper
