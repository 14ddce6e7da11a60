"""Every reference output equals an independent evaluation rounded once: 0 ulp, bit for bit.

The expectation comes from ``tests/support/independent.py`` (naive mpmath formulas at
very high precision, its own rounding through exact rationals) or, for the
Constant and LogLength schedules, from the same naive formulas written here.
"""

from __future__ import annotations

from fractions import Fraction

import mpmath
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from softmaxtheory import reference
from softmaxtheory.spec import Constant, LogLength, Polynomial
from tests.support.independent import exact_row, round_to
from tests.support.strategies_support import (
    NEG_INF,
    assert_bitwise_equal,
    logit_rows,
    paper_constants,
    two_level_entropy,
    two_level_row_for_entropy,
    ulps_away,
)

DTYPES = (np.float64, np.float32, np.float16)
CONST = paper_constants()


def rounded(values, dtype) -> np.ndarray:
    return np.array([round_to(v, dtype) for v in values], dtype=dtype)


def rounded_scalar(value, dtype) -> np.ndarray:
    return np.asarray(round_to(value, dtype), dtype=dtype)


def check_against_independent(
    x,
    *,
    dtypes=DTYPES,
    prec: int = 2600,
    schedule=None,
    coeffs=None,
    threshold=None,
    entropy_eps: float = 0.0,
) -> None:
    """All four reference functions against ``exact_row``, for each dtype."""
    kwargs = {"entropy_eps": entropy_eps}
    if coeffs is not None:
        kwargs["schedule_coeffs"] = [Fraction(c) for c in coeffs]
        kwargs["threshold"] = Fraction(threshold)
    p, H, beta, ada = exact_row(x, prec=prec, **kwargs)
    for dtype in dtypes:
        ctx = (list(np.asarray(x).tolist())[:8], np.dtype(dtype).name, entropy_eps, schedule)
        assert_bitwise_equal(reference.softmax(x, dtype=dtype), rounded(p, dtype), ctx)
        assert_bitwise_equal(
            reference.entropy(x, entropy_eps=entropy_eps, dtype=dtype),
            rounded_scalar(H, dtype),
            ctx,
        )
        assert_bitwise_equal(
            reference.beta(x, schedule=schedule, entropy_eps=entropy_eps, dtype=dtype),
            rounded_scalar(beta, dtype),
            ctx,
        )
        assert_bitwise_equal(
            reference.adaptive_softmax(x, schedule=schedule, entropy_eps=entropy_eps, dtype=dtype),
            rounded(ada, dtype),
            ctx,
        )


# ---------------------------------------------------------------------------
# adversarial rows
# ---------------------------------------------------------------------------

LN2 = 0.6931471805599453
ADVERSARIAL = {
    "one-hot-700": [0.0, -700.0],
    "one-hot-745": [0.0, -745.0],
    "one-hot-800": [0.0, -800.0],
    "least-subnormal-64": [0.0, -744.4400719213812],  # e^z ~ 2**-1074
    "half-least-subnormal-64": [0.0, -745.1332191019412],  # e^z ~ 2**-1075: rounds to 0 or up
    "min-normal-64": [0.0, -708.3964185322641],
    "least-subnormal-32": [0.0, -103.27892990343184],
    "half-least-subnormal-32": [0.0, -103.97207708399179],
    "least-subnormal-16": [0.0, -16.635532333438686],
    "half-least-subnormal-16": [0.0, -17.328679513998633],
    "min-normal-16": [0.0, -9.704060527839234],
    "ties-3": [1.0, 1.0, 1.0],
    "ties-mixed": [2.0, 2.0, 0.0, 0.0, -1.0, -1.0],
    "uniform-7": [0.0] * 7,
    "masked": [0.0, NEG_INF, 1.0],
    "masked-single": [NEG_INF, 3.0, NEG_INF],
    "single": [42.0],
    "huge-1e300": [1e300, -1e300, 1e300 * (1 - 2**-52)],
    "huge-max": [1.7976931348623157e308, -1.7976931348623157e308],
    "huge-close": [1e308, 1e308, -1e308],
    "huge-ulp-apart": [-1e300, -1e300 * (1 + 2**-52)],
    "big-exact-ints": [2.0**53, 2.0**53 + 2, 2.0**53 - 1],
    "big-offset": [1e16 + 2, 1e16, 1e16 - 2, 1e16 + 4],
    "subnormal-diffs": [0.0, 5e-324, -1e-310],
    "subnormal-pair": [5e-324, 0.0],
    "subnormal-symmetric": [-5e-324, 5e-324],
    "tiny-spread": [0.0, 1e-17, -1e-17, 2e-17, 0.0],
    "negative-tiny": [-1e-300, -2e-300, -3e-300],
    "wide-mixed": [30.0, 29.5, 0.0, -50.0, -700.0, -1e10, 28.0],
    "paper-doc-example": [3.0, 1.0, 0.0, 0.0, -1.0, 2.0],
    "beta-window": [0.0, -1.0, -1.0, -2.0, 0.5, -0.5],
}


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_adversarial_rows(name) -> None:
    check_against_independent(ADVERSARIAL[name])


@pytest.mark.parametrize("name", ["one-hot-800", "ties-mixed", "beta-window", "least-subnormal-16"])
def test_adversarial_rows_given_in_low_precision(name) -> None:
    for in_dtype in (np.float32, np.float16):
        x = np.array(ADVERSARIAL[name], dtype=in_dtype)
        check_against_independent(x)


def two_level_rows_around(target, k: int, j: int, steps: int = 4):
    """Rows [0]*k + [-d]*j with d a few ulps either side of the entropy-`target` solution."""
    d = two_level_row_for_entropy(k, j, target)
    return [[0.0] * k + [-ulps_away(d, s)] * j for s in range(-steps, steps + 1)]


@pytest.mark.parametrize(
    ("label", "target", "k", "j", "prec"),
    [
        ("threshold-0.5", "0.5", 1, 1, 2600),
        ("threshold-0.5-wide", "0.5", 1, 4, 2600),
        ("H_on", CONST["H_on"], 1, 2, 2600),
        ("H_on-many", CONST["H_on"], 2, 30, 2600),
        ("H_star", CONST["H_star"], 1, 200, 1200),
        ("H_off", CONST["H_off"], 1, 500, 800),
        ("H_off-ties", CONST["H_off"], 40, 700, 800),
    ],
)
def test_entropies_either_side_of_the_schedule_landmarks(label, target, k, j, prec) -> None:
    rows = two_level_rows_around(target, k, j)
    with mpmath.workprec(300):
        Hs = [two_level_entropy(k, j, mpmath.mpf(-r[-1])) for r in rows]
        t = mpmath.mpf(target)
    assert min(Hs) < t < max(Hs), label  # the rows straddle the landmark
    for r in rows:
        check_against_independent(r, prec=prec)


def test_beta_rounding_boundaries_near_h_on() -> None:
    """beta = P(H) just above 1: the float64 beta is 1, 1 + 2**-52 or more, never off by one."""
    seen = set()
    d = two_level_row_for_entropy(1, 2, CONST["H_on"])
    for s in range(-12, 13):
        row = [0.0, -ulps_away(d, s), -ulps_away(d, s)]
        _, _, beta, _ = exact_row(row)
        got = float(reference.beta(row))
        assert got == round_to(beta, np.float64), (s, got)
        seen.add(got)
    assert len(seen) >= 3  # the sweep crosses several float64 rounding boundaries of beta


def test_long_row_16384() -> None:
    rng = np.random.default_rng(2025)
    x = rng.uniform(-2.0, 2.0, 16384)
    x[rng.integers(0, x.size, 64)] = NEG_INF
    x[5] = x[9000]
    check_against_independent(x, prec=300, dtypes=(np.float64, np.float32))


# ---------------------------------------------------------------------------
# random rows
# ---------------------------------------------------------------------------

JUMP = ("0.5", "1")  # P(H) = H/2 + 1 above 0.25: jumps at the threshold
USER = Polynomial(JUMP, "0.25")


@settings(max_examples=4 * settings.default.max_examples)
@given(
    row=logit_rows(max_size=12, lo=-60, hi=60),
    eps=st.sampled_from((0.0, 1e-9)),
    user=st.booleans(),
)
@example(row=[0.0, -800.0], eps=1e-9, user=False)
@example(row=[0.0, -1.4472192998188345, -1.4472192998188345], eps=0.0, user=False)  # beta 1 + ulp
@example(row=[0.0, -20.0, -20.0], eps=1e-9, user=True)
def test_random_rows(row, eps, user) -> None:
    if user:
        check_against_independent(
            row, schedule=USER, coeffs=JUMP, threshold="0.25", entropy_eps=eps
        )
    else:
        check_against_independent(row, entropy_eps=eps)


@given(
    row=st.lists(st.floats(allow_nan=False, allow_infinity=False, width=64), min_size=1, max_size=6)
)
@example(row=[1.7976931348623157e308, 0.0, -1.7976931348623157e308])
@example(row=[2.2250738585072014e-308, -2.2250738585072014e-308, 0.0])
def test_random_rows_full_float_range(row) -> None:
    check_against_independent(row)


# ---------------------------------------------------------------------------
# modes and schedules
# ---------------------------------------------------------------------------

EPS_ROWS = [
    [0.0, -800.0],  # one-hot: H = -log(1 + eps) < 0
    [0.0],
    [0.0, -20.0, -20.0],  # p ~ 2e-9 ~ eps
    [0.0, -21.0, -19.0, -25.0, NEG_INF],
    [1.0, 1.0, 1.0, 1.0],
    ADVERSARIAL["beta-window"],
    [0.0, -1e-12, -1e-10],
]


@pytest.mark.parametrize("row", EPS_ROWS)
def test_entropy_eps_mode(row) -> None:
    check_against_independent(row, entropy_eps=1e-9)
    check_against_independent(row, entropy_eps=2.0**-20)


@pytest.mark.parametrize(
    ("row", "eps"),
    [
        ([0.0], 1e-300),  # H = -log(1 + 1e-300) = -1e-300: a normal float64
        ([0.0, -800.0], 1e-300),
        ([0.0], 5e-324),  # H = -log(1 + 2**-1074): rounds to -2**-1074
        ([0.0, 0.0], 0.5),  # p + eps = 1 for every item: H = 0 exactly
        ([3.0, 3.0, 3.0, 3.0], 0.75),
    ],
)
def test_entropy_eps_mode_extremes(row, eps) -> None:
    """Valid (finite, >= 0) guards at the ends of the range: the value is well defined."""
    check_against_independent(row, entropy_eps=eps)


@pytest.mark.parametrize(
    ("coeffs", "threshold"),
    [
        (("0.5", "1"), "0.25"),  # jump at the threshold
        (("-0.1", "1", "0.3"), "0"),
        (("3",), "1.5"),  # constant 3 above 1.5: a jump from 1 to 3
        (("0.001", "0", "0", "0", "0", "0", "1.2"), "-1"),
    ],
)
@pytest.mark.parametrize(
    "row",
    [
        ADVERSARIAL["beta-window"],
        ADVERSARIAL["ties-mixed"],
        [0.0, -3.0, -3.0, -1.0, -2.5],
        [5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0],
        [0.0, -700.0],
    ],
)
def test_user_polynomial(coeffs, threshold, row) -> None:
    check_against_independent(
        row, schedule=Polynomial(coeffs, threshold), coeffs=coeffs, threshold=threshold
    )


@pytest.mark.parametrize("d", [760.0, 1e4])
def test_jump_schedule_zero_threshold_tiny_positive_entropy(d) -> None:
    """A row with two items has H > 0 exactly, so beta = P(H) = 2 above a threshold of 0.

    H is below the least float64 subnormal here; the answer is still decidable.
    """
    row = [0.0, -d]
    check_against_independent(
        row, schedule=Polynomial(("2",), "0"), coeffs=("2",), threshold="0", dtypes=DTYPES
    )


def exact_fixed_beta(x, beta_of_neff, prec: int = 2600):
    """Adaptive softmax with beta = beta_of_neff(n_eff) (mpf), naive formulas."""
    with mpmath.workprec(prec):
        xs = [mpmath.mpf(float(v)) for v in np.asarray(x, dtype=np.float64)]
        live = [v for v in xs if v != -mpmath.inf]
        m = max(live)
        beta = beta_of_neff(len(live))
        ea = [mpmath.exp(beta * (v - m)) if v != -mpmath.inf else mpmath.mpf(0) for v in xs]
        sa = mpmath.fsum(ea)
        return beta, [e / sa for e in ea]


FIXED_ROWS = [
    ADVERSARIAL["beta-window"],
    ADVERSARIAL["ties-mixed"],
    ADVERSARIAL["masked"],
    ADVERSARIAL["single"],
    [0.0, -100.0, -1.0, NEG_INF, -0.25],
    [1e300, -1e300, 1e300 * (1 - 2**-52)],
    [0.0, 5e-324, -1e-310],
    list(np.linspace(-3.0, 3.0, 64)),
]


def mp_fraction(v: str) -> mpmath.mpf:
    f = Fraction(v)
    return mpmath.mpf(f.numerator) / f.denominator


@pytest.mark.parametrize("b", ["1", "0.1", "2.5", "3", "1e-3", "40"])
@pytest.mark.parametrize("row", FIXED_ROWS)
def test_constant_schedule(b, row) -> None:
    beta, ada = exact_fixed_beta(row, lambda n: mp_fraction(b))
    for dtype in DTYPES:
        got_b = reference.beta(row, schedule=Constant(b), dtype=dtype)
        assert_bitwise_equal(got_b, rounded_scalar(beta, dtype), (b, row))
        got = reference.adaptive_softmax(row, schedule=Constant(b), dtype=dtype)
        assert_bitwise_equal(got, rounded(ada, dtype), (b, row))


@pytest.mark.parametrize("s", ["1", "0.3", "2"])
@pytest.mark.parametrize("row", FIXED_ROWS)
def test_loglength_schedule(s, row) -> None:
    beta, ada = exact_fixed_beta(row, lambda n: mp_fraction(s) * mpmath.log(n))
    for dtype in DTYPES:
        got_b = reference.beta(row, schedule=LogLength(s), dtype=dtype)
        assert_bitwise_equal(got_b, rounded_scalar(beta, dtype), (s, row))
        got = reference.adaptive_softmax(row, schedule=LogLength(s), dtype=dtype)
        assert_bitwise_equal(got, rounded(ada, dtype), (s, row))


def test_mp_functions_are_within_their_certified_error() -> None:
    rows = [ADVERSARIAL[k] for k in ("beta-window", "one-hot-800", "huge-1e300", "masked")]
    rows.append([0.0, -1e300, -1.0])  # huge spread: no exact huge-mantissa sums
    for row in rows:
        p, H, beta, ada = exact_row(row)
        for prec in (53, 113, 300):
            with mpmath.workprec(prec + 40):
                tol = mpmath.mpf(2) ** -prec
                for got, want in zip(reference.softmax_mp(row, prec=prec), p, strict=True):
                    assert abs(got - want) <= tol * abs(want)
                got_ada = reference.adaptive_softmax_mp(row, prec=prec)
                for got, want in zip(got_ada, ada, strict=True):
                    assert abs(got - want) <= tol * abs(want)
                assert abs(reference.entropy_mp(row, prec=prec) - H) <= tol * abs(H)
                assert abs(reference.beta_mp(row, prec=prec) - beta) <= tol * abs(beta)


@pytest.mark.parametrize("d", [1e4, 1e7, 1e300])
def test_mp_functions_two_items_with_huge_spread(d) -> None:
    """[0, -d]: H = log1p(e) + d e / (1 + e), e = exp(-d), far below any float.

    (tests/support/independent.py loses the log1p part here: at 2600 bits 1 + e rounds to 1.)
    """
    with mpmath.workprec(300):
        e = mpmath.exp(-mpmath.mpf(d))
        H = mpmath.log1p(e) + mpmath.mpf(d) * e / (1 + e)
        p = [1 / (1 + e), e / (1 + e)]
    for prec in (53, 200):
        with mpmath.workprec(prec + 40):
            tol = mpmath.mpf(2) ** -prec
            assert abs(reference.entropy_mp([0.0, -d], prec=prec) - H) <= tol * H
            for got, want in zip(reference.softmax_mp([0.0, -d], prec=prec), p, strict=True):
                assert abs(got - want) <= tol * want
