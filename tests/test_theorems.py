"""Property tests of theorems T1, T3, T4, T5, T6 and T8 (DESIGN §3) on the reference.

Two kinds of check:

* in mpmath, against the certified ``*_mp`` values (relative error ``2**-prec``),
  with a tolerance of a few times that certified error;
* on the correctly rounded floats, exactly: rounding to nearest is monotone, so an
  exact inequality ``u <= v`` implies ``RN(u) <= RN(v)``, and equal exact values
  round to the same float.
"""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from softmaxtheory import reference
from softmaxtheory.spec import (
    Constant,
    LogLength,
    PaperPolynomial,
    Polynomial,
)
from tests.support.independent import round_to
from tests.support.strategies_support import (
    DYADIC_BETAS,
    NEG_INF,
    assert_bitwise_equal,
    dyadic_rows,
    dyadic_values,
    logit_rows,
    paper_constants,
    paper_dP,
    paper_P,
    two_level_entropy,
    two_level_row_for_entropy,
    ulps_away,
)

F64 = np.float64
HP = 320  # bits for the bounds computed in the tests
PREC = 120  # certified precision asked of the *_mp functions
TOL = mpmath.mpf(2) ** (-PREC + 4)  # relative slack: a few certified errors

CONST = paper_constants()

BETA_CHOICES = (*DYADIC_BETAS, "0.1", "0.3", "2.5")


def exact(v) -> mpmath.mpf:
    """The exact value of a float or decimal string, as an mpf at HP bits."""
    with mpmath.workprec(HP):
        f = Fraction(v)
        return mpmath.mpf(f.numerator) / f.denominator


def spread(hi: float, lo: float) -> mpmath.mpf:
    """hi - lo exactly (at HP bits)."""
    with mpmath.workprec(HP):
        return exact(hi) - exact(lo)


def rn(v, dtype=F64) -> float:
    """Correct rounding of an mpf, independently of the library."""
    return round_to(v, dtype)


# ---------------------------------------------------------------------------
# T1: dispersion sandwich
# ---------------------------------------------------------------------------


def t1_bounds(n: int, beta, delta):
    """(lower, upper, loose_lower, loose_upper) at HP bits."""
    with mpmath.workprec(HP):
        bd = beta * delta
        lower = 1 / (1 + (n - 1) * mpmath.exp(bd))
        upper = 1 / (1 + (n - 1) * mpmath.exp(-bd))
        return lower, upper, mpmath.exp(-bd) / n, mpmath.exp(bd) / n


@st.composite
def bounded_rows(draw, max_size: int = 10):
    """(a, b, row) with every entry of the row in [a, b] (a, b need not be attained)."""
    a = draw(st.floats(-60, 60, allow_nan=False))
    b = draw(st.floats(a, a + 100, allow_nan=False))
    row = draw(st.lists(st.floats(a, b), min_size=1, max_size=max_size))
    return a, b, row


@pytest.mark.theorem("T1")
@settings(max_examples=2 * settings.default.max_examples)
@given(case=bounded_rows(), beta=st.sampled_from(BETA_CHOICES))
@example(case=(0.0, 0.0, [0.0, 0.0, 0.0]), beta=1.0)
@example(case=(-1.0, 5.69, [5.69, -1.0, 2.0]), beta="0.1")
def test_t1_every_coefficient_in_sandwich(case, beta) -> None:
    """Every coefficient under Constant(beta) lies in the T1 sandwich, in mpmath and rounded."""
    a, b, row = case
    n = len(row)
    sched = Constant(beta)
    lower, upper, loose_lo, loose_hi = t1_bounds(n, exact(beta), spread(b, a))
    alphas_mp = reference.adaptive_softmax_mp(row, prec=PREC, schedule=sched)
    alphas = reference.adaptive_softmax(row, schedule=sched)
    for k, (amp, af) in enumerate(zip(alphas_mp, alphas.tolist(), strict=True)):
        with mpmath.workprec(HP):
            assert amp * (1 + TOL) >= lower, (k, amp, lower)
            assert amp * (1 - TOL) <= upper, (k, amp, upper)
            assert loose_lo <= lower and upper <= loose_hi  # the loose form is implied
        # monotone rounding: the exact inequality carries over to the floats
        assert rn(lower) <= af <= rn(upper), (k, af, rn(lower), rn(upper))
        assert rn(loose_lo) <= af <= rn(loose_hi)


@pytest.mark.theorem("T1")
@given(
    n=st.integers(1, 300),
    a=st.floats(-60, 60),
    delta=st.floats(0, 60),
    beta=st.sampled_from(BETA_CHOICES),
)
@example(n=297, a=0.0, delta=5.69, beta=1.0)
@example(n=2, a=2.4706752313214776e-12, delta=1.0, beta=0.5)  # b - a inexact in float64
@example(n=2, a=-3.0, delta=1.5, beta="0.3")
def test_t1_bounds_attained(n, a, delta, beta) -> None:
    """One item at b, the rest at a attains the upper bound; one at a, rest at b the lower."""
    b = a + delta
    sched = Constant(beta)
    lower, upper, _, _ = t1_bounds(n, exact(beta), spread(b, a))
    x_hi = [b] + [a] * (n - 1)
    x_lo = [a] + [b] * (n - 1)
    # correctly rounded: exactly the rounded bound
    assert reference.adaptive_softmax(x_hi, schedule=sched)[0] == rn(upper)
    assert reference.adaptive_softmax(x_lo, schedule=sched)[0] == rn(lower)
    assert reference.adaptive_softmax(x_lo, schedule=sched, dtype=np.float32)[0] == rn(
        lower, np.float32
    )
    # certified: within the certified precision of the bound
    hi_mp = reference.adaptive_softmax_mp(x_hi, prec=PREC, schedule=sched)[0]
    lo_mp = reference.adaptive_softmax_mp(x_lo, prec=PREC, schedule=sched)[0]
    with mpmath.workprec(HP):
        assert abs(hi_mp - upper) <= TOL * upper
        assert abs(lo_mp - lower) <= TOL * lower


# ---------------------------------------------------------------------------
# T3: entropy floor
# ---------------------------------------------------------------------------


@pytest.mark.theorem("T3")
@given(row=logit_rows(max_size=12, lo=-30, hi=30))
@example(row=[0.0])
@example(row=[1.0, 1.0, 1.0, 1.0])
@example(row=[0.0, -800.0, NEG_INF])
@example(row=[3.0, 0.0, 0.0, 0.0])
def test_t3_entropy_chain(row) -> None:
    """log n >= H >= -log max alpha >= T3 floor >= log n - spread, in mpmath and rounded."""
    live = [v for v in row if v != NEG_INF]
    n = len(live)
    H = reference.entropy_mp(row, prec=PREC)
    amax = max(reference.softmax_mp(row, prec=PREC))
    with mpmath.workprec(HP):
        delta = spread(max(live), min(live))
        log_n = mpmath.log(n)
        neg_log_max = -mpmath.log(amax)
        floor = mpmath.log(1 + (n - 1) * mpmath.exp(-delta))
        slack = TOL * (1 + abs(log_n) + delta)
        assert log_n >= H - slack
        assert H >= neg_log_max - slack
        assert neg_log_max >= floor - slack
        assert floor >= log_n - delta - slack
        assert H >= 0
    # the same chain on the correctly rounded entropy (monotone rounding)
    h = float(reference.entropy(row))
    assert rn(floor) <= h <= rn(log_n)
    h32 = float(reference.entropy(row, dtype=np.float32))
    assert rn(floor, np.float32) <= h32 <= rn(log_n, np.float32)


# ---------------------------------------------------------------------------
# T4: temperature monotonicity
# ---------------------------------------------------------------------------


@pytest.mark.theorem("T4")
@given(
    row=dyadic_rows(min_size=1, max_size=10),
    betas=st.lists(st.sampled_from(DYADIC_BETAS), min_size=2, max_size=2, unique=True),
)
@example(row=[0.0, -1.0, 1.0, 1.0], betas=[0.5, 4.0])
@example(row=[2.0, 2.0], betas=[1.0, 3.0])
def test_t4_entropy_and_max_monotone(row, betas) -> None:
    """A larger beta never raises the entropy or lowers the max coefficient, and keeps the order."""
    b1, b2 = sorted(betas)
    x = np.array(row)
    x1, x2 = b1 * x, b2 * x  # exact: few significant bits on both sides
    assert all(
        Fraction(float(v)) == Fraction(b1) * Fraction(float(w)) for v, w in zip(x1, x, strict=True)
    )
    H1 = reference.entropy_mp(x1, prec=PREC)
    H2 = reference.entropy_mp(x2, prec=PREC)
    with mpmath.workprec(HP):
        assert H2 <= H1 + TOL * (1 + H1)
    # rounded entropies keep the order, and so do the max coefficients
    assert reference.entropy(x2) <= reference.entropy(x1)
    p1, p2 = reference.softmax(x1), reference.softmax(x2)
    assert p2.max() >= p1.max()
    # softmax(beta x) is what a Constant(beta) schedule computes, bit for bit
    assert_bitwise_equal(reference.adaptive_softmax(x, schedule=Constant(b2)), p2)
    # the order of the coefficients is the order of the logits, at every beta
    for p in (p1, p2):
        for i in range(len(row)):
            for j in range(len(row)):
                if row[i] < row[j]:
                    assert p[i] <= p[j]
                elif row[i] == row[j]:
                    assert p[i] == p[j]


def entropy_at(x: np.ndarray, beta: Fraction) -> mpmath.mpf:
    """H(softmax(beta x)) from the reference, with beta x checked to be exact."""
    y = x * float(beta)
    assert all(Fraction(float(v)) == beta * Fraction(float(w)) for v, w in zip(y, x, strict=True))
    return reference.entropy_mp(y, prec=240)


@pytest.mark.theorem("T4")
@given(
    row=dyadic_rows(min_size=2, max_size=8, bound=128, shift=4),
    beta=st.sampled_from((0.5, 1.0, 1.5, 2.0)),
)
@example(row=[0.0, -1.0, 2.5], beta=1.0)
@example(row=[8.0, -8.0], beta=0.5)
def test_t4_derivative_identity(row, beta) -> None:
    """dH/dbeta = -beta Var_alpha(x), against a five-point finite difference."""
    x = np.array(row)
    b = Fraction(beta)
    h = Fraction(1, 2**14)
    with mpmath.workprec(240):
        f = {k: entropy_at(x, b + k * h) for k in (-2, -1, 1, 2)}
        fd = (f[-2] - 8 * f[-1] + 8 * f[1] - f[2]) / (12 * mpmath.mpf(h.numerator) / h.denominator)
        alpha = reference.softmax_mp(x * beta, prec=240)
        xs = [exact(v) for v in row]
        mean = mpmath.fsum(a * v for a, v in zip(alpha, xs, strict=True))
        var = mpmath.fsum(a * (v - mean) ** 2 for a, v in zip(alpha, xs, strict=True))
        expected = -beta * var
        assert expected <= 0
        assert abs(fd - expected) <= mpmath.mpf("1e-8") * (1 + abs(expected)), (fd, expected)


# ---------------------------------------------------------------------------
# T5: temperature cap
# ---------------------------------------------------------------------------


def mp_entropy_of(coefficients) -> mpmath.mpf:
    with mpmath.workprec(HP):
        return -mpmath.fsum(a * mpmath.log(a) for a in coefficients if a != 0)


@pytest.mark.theorem("T5")
@given(row=logit_rows(max_size=12, lo=-8, hi=8))
@example(row=[0.0, -1.0, -1.0, -2.0, 0.5, -0.5])  # H inside (H_on, H_off): beta > 1
@example(row=[0.0])
@example(row=[0.0, 0.0, 0.0])  # uniform: beta > 1 but nothing to sharpen
def test_t5_adaptive_never_increases_entropy(row) -> None:
    """beta >= 1, and adaptive softmax has no higher entropy and no lower max than softmax."""
    beta = reference.beta(row)
    assert beta >= 1.0
    p = reference.softmax(row)
    a = reference.adaptive_softmax(row)
    assert a.max() >= p.max()
    H = reference.entropy_mp(row, prec=PREC)
    Ha = mp_entropy_of(reference.adaptive_softmax_mp(row, prec=PREC))
    with mpmath.workprec(HP):
        assert Ha <= H + TOL * (1 + H) * len(row)


@pytest.mark.theorem("T5")
def test_t5_paper_polynomial_exact_facts() -> None:
    """The paper's P is < 1 and rising on [0, 1/2], so no jump; jumps_at_threshold is right."""
    sched = PaperPolynomial()
    half = Fraction(1, 2)
    assert sched.polynomial_exact(half) == Fraction("0.1503125")
    assert sched.exact_threshold == half
    # P < 1 on [0, 1/2]: bound each monomial by its largest value on the interval
    bound = Fraction(0)
    coeffs = sched.exact_coefficients
    d = len(coeffs) - 1
    for i, c in enumerate(coeffs):
        bound += max(c * half ** (d - i), c * 0 ** (d - i))
    assert bound < 1
    # and P is increasing there: P'(h) >= 4.917 - 4.6 h - 0.148 h^3 > 0
    assert Fraction("4.917") - Fraction("4.6") * half - Fraction("0.148") * half**3 > 0
    assert sched.jumps_at_threshold is False
    assert Polynomial(("1", "1")).jumps_at_threshold is True  # P(0.5) = 1.5
    assert Polynomial(("2",), threshold="3").jumps_at_threshold is True
    assert Polynomial(("1",)).jumps_at_threshold is False  # P(theta) = 1: continuous
    assert Polynomial(("2", "0"), threshold="0.5").jumps_at_threshold is False


def rows_either_side(target: float, k: int, j: int, guess: float):
    """Two-level rows whose entropy lies just below and just above ``target``."""
    d = two_level_row_for_entropy(k, j, target, guess)
    below = above = None
    for step in range(-6, 7):
        dd = ulps_away(d, step)
        with mpmath.workprec(HP):
            H = two_level_entropy(k, j, exact(dd))
        if H < target and (below is None or dd < below):
            below = dd  # larger d gives a lower entropy: keep the one nearest the target
        if H > target and (above is None or dd > above):
            above = dd
    assert below is not None and above is not None
    return [0.0] * k + [-below] * j, [0.0] * k + [-above] * j


@pytest.mark.theorem("T5")
def test_t5_threshold_changes_nothing_for_paper_but_jumps_for_user_polynomial() -> None:
    """Across H = 0.5 the paper's beta stays 1, while P(H) = H + 1 jumps from 1 to about 1.5."""
    below, above = rows_either_side(0.5, 1, 1, 1.5)
    assert reference.entropy_mp(below) < mpmath.mpf("0.5") < reference.entropy_mp(above)
    # published schedule: beta = 1 on both sides (P(0.5) < 1): continuous
    assert reference.beta(below) == 1.0 and reference.beta(above) == 1.0
    assert_bitwise_equal(reference.adaptive_softmax(above), reference.softmax(above))
    # P(H) = H + 1 has P(0.5) = 1.5: a true jump of 0.5 across the threshold
    jump = Polynomial(("1", "1"), threshold="0.5")
    assert reference.beta(below, schedule=jump) == 1.0
    H = reference.entropy_mp(above, prec=200)
    assert reference.beta(above, schedule=jump) == rn(H + 1)
    assert reference.beta(above, schedule=jump) > 1.49


# ---------------------------------------------------------------------------
# T6: no escape
# ---------------------------------------------------------------------------


@pytest.mark.theorem("T6")
def test_t6_constants_match_paper() -> None:
    """H*, beta_max, H_on and H_off are the unique real roots and match PAPER.md's decimals."""
    with mpmath.workdps(50):
        # one real critical point, two real solutions of P = 1 (numpy counts them: the
        # complex roots are far from the real axis; the real ones match findroot's)
        crit = [r.real for r in np.roots([-0.148, 1.443, -4.6, 4.917]) if abs(r.imag) < 1e-6]
        assert len(crit) == 1
        assert abs(crit[0] - CONST["H_star"]) < 1e-9
        ones = sorted(
            r.real for r in np.roots([-0.037, 0.481, -2.3, 4.917, -2.791]) if abs(r.imag) < 1e-6
        )
        assert len(ones) == 2
        assert abs(ones[0] - CONST["H_on"]) < 1e-9
        assert abs(ones[1] - CONST["H_off"]) < 1e-9
        assert abs(paper_P(CONST["H_on"]) - 1) < mpmath.mpf(10) ** -45
        assert abs(paper_P(CONST["H_off"]) - 1) < mpmath.mpf(10) ** -45
        assert paper_dP(CONST["H_star"]) == 0 or abs(paper_dP(CONST["H_star"])) < 1e-40
        # the decimals printed in PAPER.md (truncated after 15 significant digits)
        for key, printed in (
            ("H_star", "4.41240186596567"),
            ("beta_max", "2.42138770663152"),
            ("H_on", "0.84858199600986"),
            ("H_off", "5.94452082790514"),
        ):
            value = CONST[key]
            assert mpmath.mpf(printed) <= value < mpmath.mpf(printed) + mpmath.mpf("1e-14"), key
        e_off = mpmath.exp(CONST["H_off"]) - 1
        assert mpmath.mpf("380.656438360298") <= e_off < mpmath.mpf("380.656438360299")
        # P is a maximum at H*: beta_max is a global maximum of max(P, 1) on [0, inf)
        assert paper_P(CONST["H_star"] + 1) < CONST["beta_max"]
        assert paper_P(CONST["H_star"] - 1) < CONST["beta_max"]


@pytest.mark.theorem("T6")
@given(row=logit_rows(max_size=12, lo=-6, hi=6))
@example(row=[0.0, -1.0, -1.0, -2.0, 0.5, -0.5])
@example(row=[1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
def test_t6_beta_capped_and_window(row) -> None:
    """beta is in [1, beta_max], is 1 outside (H_on, H_off), > 1 inside; T1 holds with beta_max."""
    b = float(reference.beta(row))
    assert 1.0 <= b <= rn(CONST["beta_max"])
    H = reference.entropy_mp(row, prec=PREC)
    with mpmath.workprec(HP):
        margin = TOL * 4
        if H <= CONST["H_on"] - margin or H >= CONST["H_off"] + margin:
            assert b == 1.0
        elif CONST["H_on"] + 1e-12 <= H <= CONST["H_off"] - 1e-12:
            assert b > 1.0  # P(H) - 1 > 1e-13 there: it survives rounding
    # adaptive coefficients still obey T1 with beta_max
    live = [v for v in row if v != NEG_INF]
    n = len(live)
    lower, upper, _, _ = t1_bounds(n, CONST["beta_max"], spread(max(live), min(live)))
    a = reference.adaptive_softmax(row)
    for v, av in zip(row, a.tolist(), strict=True):
        if v != NEG_INF:
            assert rn(lower) <= av <= rn(upper)
        else:
            assert av == 0.0


@pytest.mark.theorem("T6")
@given(
    delta=st.floats(0, 1.5),
    a=st.floats(-10, 10),
    extra=st.integers(0, 50),
    seed=st.integers(0, 2**32 - 1),
)
@example(delta=0.0, a=0.0, extra=0, seed=0)
@example(delta=1.5, a=-3.0, extra=0, seed=1)
def test_t6_switch_off_size(delta, a, extra, seed) -> None:
    """n > 1 + (e^{H_off} - 1) e^delta guarantees H >= H_off, hence beta = 1."""
    with mpmath.workprec(HP):
        delta_exact = exact(a + delta) - exact(a)
        n_star = mpmath.floor(1 + (mpmath.exp(CONST["H_off"]) - 1) * mpmath.exp(delta_exact)) + 1
    n = int(n_star) + extra
    rng = np.random.default_rng(seed)
    row = rng.uniform(a, a + delta, n)
    row[0], row[-1] = a, a + delta  # spread exactly delta
    H = reference.entropy_mp(row, prec=PREC)
    assert H >= CONST["H_off"]
    assert reference.beta(row) == 1.0
    assert reference.beta(row, dtype=np.float32) == 1.0
    assert_bitwise_equal(reference.adaptive_softmax(row), reference.softmax(row))


@pytest.mark.theorem("T6")
@pytest.mark.parametrize(("k", "j"), [(1, 200), (3, 120), (10, 400)])
def test_t6_rows_at_h_star_reach_beta_max(k, j) -> None:
    """Two-level rows with entropy H* get beta = beta_max, correctly rounded (float64, float32)."""
    d = two_level_row_for_entropy(k, j, CONST["H_star"], 1.0)
    row = [0.0] * k + [-d] * j
    H = reference.entropy_mp(row, prec=200)
    beta = reference.beta_mp(row, prec=200)
    with mpmath.workprec(HP):
        dH = abs(H - CONST["H_star"])
        assert dH < 1e-14
        # P'(H*) = 0, |P''| < 2 near H*: beta_max - beta <= (H - H*)^2 (+ certified errors)
        assert CONST["beta_max"] - beta <= dH**2 + TOL * 4
        assert beta <= CONST["beta_max"] * (1 + TOL)
    assert reference.beta(row) == rn(CONST["beta_max"])
    assert reference.beta(row, dtype=np.float32) == rn(CONST["beta_max"], np.float32)


# ---------------------------------------------------------------------------
# T8: invariances
# ---------------------------------------------------------------------------

SCHEDULES = (None, Constant("0.75"), LogLength("0.5"), Polynomial(("0.1", "0.5", "1"), "0.25"))


def all_outputs(x, schedule, dtype, entropy_eps=0.0):
    return (
        reference.softmax(x, dtype=dtype),
        reference.entropy(x, entropy_eps=entropy_eps, dtype=dtype),
        reference.beta(x, schedule=schedule, entropy_eps=entropy_eps, dtype=dtype),
        reference.adaptive_softmax(x, schedule=schedule, entropy_eps=entropy_eps, dtype=dtype),
    )


@pytest.mark.theorem("T8")
@settings(max_examples=2 * settings.default.max_examples)
@given(
    row=dyadic_rows(min_size=1, max_size=9, bound=2**12, shift=6),
    c=st.one_of(dyadic_values(2**14, 6), st.integers(-40, 40).map(lambda k: math.ldexp(1.0, k))),
    schedule=st.sampled_from(SCHEDULES),
    dtype=st.sampled_from((np.float64, np.float32, np.float16)),
    eps=st.sampled_from((0.0, 1e-9)),
)
@example(row=[0.0, -1.0], c=2.0**40, schedule=None, dtype=np.float64, eps=0.0)
def test_t8_shift_invariance(row, c, schedule, dtype, eps) -> None:
    """Adding a constant to every logit changes no bit of softmax, entropy, beta or adaptive."""
    x = np.array(row)
    y = x + c
    assert all(
        Fraction(float(u)) == Fraction(float(v)) + Fraction(c) for u, v in zip(y, x, strict=True)
    )
    outputs = zip(
        all_outputs(y, schedule, dtype, eps), all_outputs(x, schedule, dtype, eps), strict=True
    )
    for got, want in outputs:
        assert_bitwise_equal(got, want, (row, c))


@pytest.mark.theorem("T8")
@settings(max_examples=2 * settings.default.max_examples)
@given(
    row=logit_rows(max_size=9, lo=-50, hi=50),
    data=st.data(),
    schedule=st.sampled_from(SCHEDULES),
    dtype=st.sampled_from((np.float64, np.float32)),
)
def test_t8_permutation_equivariance(row, data, schedule, dtype) -> None:
    """Permuting the logits permutes the coefficients and keeps entropy and beta bit for bit."""
    perm = data.draw(st.permutations(range(len(row))))
    x = np.array(row)
    y = x[list(perm)]
    sx, hx, bx, ax = all_outputs(x, schedule, dtype)
    sy, hy, by, ay = all_outputs(y, schedule, dtype)
    assert_bitwise_equal(sy, sx[list(perm)])
    assert_bitwise_equal(ay, ax[list(perm)])
    assert_bitwise_equal(hy, hx)
    assert_bitwise_equal(by, bx)


@pytest.mark.theorem("T8")
@settings(max_examples=2 * settings.default.max_examples)
@given(
    row=logit_rows(max_size=8, lo=-50, hi=50, masks=False),
    data=st.data(),
    schedule=st.sampled_from(SCHEDULES),
    dtype=st.sampled_from((np.float64, np.float32, np.float16)),
    eps=st.sampled_from((0.0, 1e-9)),
)
def test_t8_masking_is_removal(row, data, schedule, dtype, eps) -> None:
    """Inserting -inf items changes no bit of the other outputs and gives them coefficient 0."""
    n_mask = data.draw(st.integers(1, 5))
    positions = sorted(
        data.draw(st.lists(st.integers(0, len(row)), min_size=n_mask, max_size=n_mask))
    )
    masked = list(row)
    for offset, pos in enumerate(positions):
        masked.insert(pos + offset, NEG_INF)
    keep = np.array([v != NEG_INF for v in masked])
    s0, h0, b0, a0 = all_outputs(np.array(row), schedule, dtype, eps)
    s1, h1, b1, a1 = all_outputs(np.array(masked), schedule, dtype, eps)
    assert_bitwise_equal(h1, h0)
    assert_bitwise_equal(b1, b0)
    for full, short in ((s1, s0), (a1, a0)):
        assert_bitwise_equal(full[keep], short)
        assert_bitwise_equal(full[~keep], np.zeros(n_mask, dtype=dtype))
