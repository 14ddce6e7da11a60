"""softmaxtheory.bounds: T1, T2, T3, T6 and T9 as computable, correctly rounded limits."""

from __future__ import annotations

import itertools
import math
import warnings
from decimal import Decimal
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from softmaxtheory import bounds, reference
from softmaxtheory.spec import Constant, LogLength, PaperPolynomial, Polynomial
from tests.support.independent import PAPER, round_to

POW2_BETAS = (0.25, 0.5, 1.0, 2.0, 4.0)


def exact_max(n: int, spread: float, beta: float, prec: int = 3000) -> mpmath.mpf:
    with mpmath.workprec(prec):
        return 1 / (1 + (n - 1) * mpmath.exp(-mpmath.mpf(beta) * mpmath.mpf(spread)))


def exact_min(n: int, spread: float, beta: float, prec: int = 3000) -> mpmath.mpf:
    with mpmath.workprec(prec):
        return 1 / (1 + (n - 1) * mpmath.exp(mpmath.mpf(beta) * mpmath.mpf(spread)))


def exact_floor_size(eps: float, exponent: float, prec: int = 4000) -> int:
    """floor((1/eps - 1) e^exponent) + 2 at `prec` bits (eps and exponent are exact floats)."""
    with mpmath.workprec(prec):
        scale = 1 / mpmath.mpf(eps) - 1
        return int(mpmath.floor(scale * mpmath.exp(mpmath.mpf(exponent)))) + 2


def paper_poly(h):
    acc = mpmath.mpf(0)
    for c in PAPER:
        acc = acc * h + mpmath.mpf(c.numerator) / c.denominator
    return acc


spreads = st.floats(0.0, 40.0, allow_nan=False)
sizes = st.integers(1, 10**6)


# ---------------------------------------------------------------- T1: values and violations


@pytest.mark.theorem("T1")
@given(n=sizes, spread=spreads, beta=st.sampled_from(POW2_BETAS) | st.floats(0.01, 8.0))
@example(n=1, spread=3.0, beta=1.0)
@example(n=10**6, spread=0.0, beta=1.0)
def test_coefficient_bounds_are_correctly_rounded(n, spread, beta):
    """max_coefficient and min_coefficient equal the exact T1 bounds, correctly rounded."""
    assert bounds.max_coefficient(n, spread, beta) == round_to(exact_max(n, spread, beta), "f8")
    assert bounds.min_coefficient(n, spread, beta) == round_to(exact_min(n, spread, beta), "f8")


@st.composite
def boxed_rows(draw, max_size=40):
    """A row of logits inside [a, a + spread], with the spread rounded up to a float."""
    a = draw(st.floats(-50.0, 50.0))
    width = draw(st.floats(0.0, 20.0))
    n = draw(st.integers(1, max_size))
    fracs = draw(st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n))
    corners = draw(st.booleans())
    if corners:  # many items on the two ends of the box
        fracs = [float(round(f)) for f in fracs]
    x = np.array([a + f * width for f in fracs])
    lo, hi = Fraction(float(x.min())), Fraction(float(x.max()))
    spread = float(hi - lo)
    if Fraction(spread) < hi - lo:
        spread = math.nextafter(spread, math.inf)
    return x, spread


@pytest.mark.theorem("T1")
@given(boxed_rows())
@example((np.array([0.0]), 0.0))
@example((np.array([2.0, 0.0, 0.0, 0.0]), 2.0))
def test_no_reference_coefficient_escapes_the_sandwich(case):
    """Every reference coefficient of a random row lies inside the T1 sandwich for its spread."""
    x, spread = case
    alpha = reference.softmax(x)
    n = x.shape[0]
    # correctly rounded values on both sides: rounding is monotone, so the exact
    # inequality survives it
    assert alpha.max() <= bounds.max_coefficient(n, spread)
    assert alpha.min() >= bounds.min_coefficient(n, spread)


@pytest.mark.theorem("T1")
@given(n=st.integers(1, 5000), k=st.integers(0, 200), beta=st.sampled_from(POW2_BETAS))
@example(n=8, k=32, beta=1.0)
def test_bounds_are_attained_by_the_extremal_rows(n, k, beta):
    """One item beta*spread above (below) all others gets exactly the T1 max (min) coefficient."""
    spread = k / 16  # dyadic: beta * spread is exact
    top = np.zeros(n)
    top[0] = beta * spread
    bottom = np.full(n, beta * spread)
    bottom[0] = 0.0
    assert reference.softmax(top)[0] == bounds.max_coefficient(n, spread, beta)
    assert reference.softmax(bottom)[0] == bounds.min_coefficient(n, spread, beta)


# ---------------------------------------------------------------- T3


@pytest.mark.theorem("T3")
@given(boxed_rows())
@example((np.zeros(7), 0.0))
def test_entropy_never_below_the_floor(case):
    """A random row's entropy lies in [T3 floor, log n], and the floor is >= log n - spread."""
    x, spread = case
    n = x.shape[0]
    h = float(reference.entropy(x))
    floor = bounds.entropy_lower_bound(n, spread)
    assert floor <= h <= float(reference.entropy(np.zeros(n)))
    assert floor >= math.log(n) - spread - 1e-12 * max(1.0, math.log(n))


@pytest.mark.theorem("T3")
@given(n=sizes, spread=spreads, beta=st.floats(0.01, 8.0))
@example(n=10**6, spread=40.0, beta=8.0)  # (n-1) e^{-320}: the log1p branch
def test_entropy_floor_is_correctly_rounded(n, spread, beta):
    """entropy_lower_bound is log1p((n - 1) e^(-beta spread)), correctly rounded."""
    with mpmath.workprec(3000):
        exact = mpmath.log1p((n - 1) * mpmath.exp(-mpmath.mpf(beta) * mpmath.mpf(spread)))
    assert bounds.entropy_lower_bound(n, spread, beta) == round_to(exact, "f8")


@pytest.mark.theorem("T3")
@pytest.mark.parametrize("n", [1, 2, 3, 1000, 4096])
def test_entropy_floor_is_attained_by_uniform_rows(n):
    """At spread 0 the entropy floor equals the reference entropy of a uniform row (log n)."""
    assert bounds.entropy_lower_bound(n, 0.0) == float(reference.entropy(np.zeros(n)))


# ---------------------------------------------------------------- T2


@pytest.mark.theorem("T2")
@given(
    eps=st.floats(1e-6, 1.0, exclude_max=True, exclude_min=True),
    spread=st.floats(0.0, 30.0),
    beta=st.floats(0.05, 4.0),
)
@example(eps=0.5, spread=5.69, beta=1.0)
@example(eps=0.25, spread=0.0, beta=1.0)
def test_dispersion_size_is_the_exact_threshold(eps, spread, beta):
    """The exact T1 max bound is below eps at n = dispersion_size and at least eps at n - 1."""
    n_star = bounds.dispersion_size(eps, spread, beta)
    assert isinstance(n_star, int) and n_star >= 2
    e = Fraction(eps)
    with mpmath.workprec(3000):
        below = exact_max(n_star, spread, beta)
        above = exact_max(n_star - 1, spread, beta)
        eps_mp = mpmath.mpf(e.numerator) / e.denominator
        assert below < eps_mp <= above  # n* disperses, n* - 1 does not


def boundary_cases():
    """Spreads that put (1/eps - 1) e^spread within a few ulps of an integer."""
    cases = []
    for eps in (0.5, 0.25, 0.1):
        scale = 1 / eps - 1
        for target in (2, 3, 10, 297, 1000, 65536, 10**6, 2**40):
            centre = math.log(target / scale)
            if centre < 0:
                continue
            spread = centre
            for _ in range(3):
                spread = math.nextafter(spread, -math.inf)
            for _ in range(7):
                if spread >= 0:
                    cases.append((eps, spread))
                spread = math.nextafter(spread, math.inf)
    return cases


@pytest.mark.theorem("T2")
def test_dispersion_size_at_integer_boundaries():
    """dispersion_size is exact within ulps of integer thresholds, where a float formula errs."""
    naive_wrong = 0
    for eps, spread in boundary_cases():
        expected = exact_floor_size(eps, spread)
        got = bounds.dispersion_size(eps, spread)
        assert got == expected, (eps, spread)
        naive = math.floor((1 / eps - 1) * math.exp(spread)) + 2
        naive_wrong += naive != expected
    # the cases are hard: a float evaluation of the formula gets some of them wrong
    assert naive_wrong > 0


@pytest.mark.theorem("T2")
@pytest.mark.parametrize(("eps", "expected"), [(0.5, 3), (0.25, 5), (0.2, 5), (0.75, 2)])
def test_dispersion_size_of_uniform_rows(eps, expected):
    # 1/n < eps  <=>  n > 1/eps, decided in exact rationals: 0.5 and 0.25 are exact, so
    # n = 2 and n = 4 tie and do not count; the float 0.2 is 0.2000000000000000111..., so
    # 1/5 < eps already
    """At spread 0, dispersion_size(eps) is the least n with 1/n < eps, decided exactly."""
    assert bounds.dispersion_size(eps, 0.0) == expected


@pytest.mark.theorem("T2")
def test_gemma_worked_example():
    """Gemma example: n* = 297 for eps = 1/2, spread 5.69; the T1 bound is still >= 1/2 at 296."""
    assert bounds.dispersion_size(0.5, 5.69) == 297
    assert bounds.max_coefficient(297, 5.69) < 0.5 <= bounds.max_coefficient(296, 5.69)


def test_huge_spreads_stay_finite_and_exact():
    assert bounds.max_coefficient(10, 800.0) == 1.0
    assert bounds.min_coefficient(10, 800.0) == 0.0  # e^-800 / 9 is below half the least subnormal
    assert bounds.min_coefficient(2, 700.0) == round_to(exact_min(2, 700.0, 1.0), "f8")
    with mpmath.workprec(4000):
        expected = int(mpmath.floor(mpmath.exp(800))) + 2
    assert bounds.dispersion_size(0.5, 800.0) == expected
    assert bounds.entropy_lower_bound(10**6, 700.0) > 0.0
    assert bounds.adaptive_switch_off_size(800.0) > 10**340


@pytest.mark.parametrize(
    ("n", "spread"),
    [
        (2 ** (2**22), 2.9e6),  # (n - 1) e^-spread = e^7270: never returned
        (2 ** (2**22), 2907411.0),  # e^-140: the coefficient a hair below 1
        (10**1263000, 2908180.0),  # e^-15: every bound a number well inside its range
        (2 ** (2**22), 1e300),
    ],
    ids=["2**2**22-e7270", "2**2**22-e-140", "10**1263000-e-15", "2**2**22-1e300"],
)
def test_huge_counts_against_exponents_beyond_the_cap(n, spread):
    """Past EXP_CAP (2**21) the exponential was enclosed by [0, e^-cap] alone, which a
    count near e^(2**21) or more cancels: no precision decided, and the bounds never
    returned. The exponent log(n - 1) - spread is formed first now."""
    with mpmath.workprec(400):
        x = mpmath.log(n - 1) - mpmath.mpf(spread)
        top = 1 / (1 + mpmath.exp(x))
        floor = mpmath.log1p(mpmath.exp(x))
    assert bounds.max_coefficient(n, spread) == round_to(top, "f8")
    assert bounds.entropy_lower_bound(n, spread) == round_to(floor, "f8")
    assert bounds.min_coefficient(n, spread) == 0.0


def test_size_limit_is_a_clear_error():
    with pytest.raises(ValueError, match="spread \\* beta"):
        bounds.dispersion_size(0.5, 1e7)


# ---------------------------------------------------------------- T6


def independent_constants():
    with mpmath.workprec(600):
        h_star = mpmath.findroot(lambda h: mpmath.diff(paper_poly, h), mpmath.mpf("4.4"))
        h_on = mpmath.findroot(lambda h: paper_poly(h) - 1, mpmath.mpf("0.85"))
        h_off = mpmath.findroot(lambda h: paper_poly(h) - 1, mpmath.mpf("5.9"))
        return h_star, paper_poly(h_star), h_on, h_off


@pytest.mark.theorem("T6")
def test_adaptive_constants_are_correctly_rounded():
    """H* is correctly rounded; beta_max is rounded upward and the window outward."""
    h_star, beta_max, h_on, h_off = independent_constants()
    top = bounds.adaptive_beta_max()
    assert mpmath.mpf(math.nextafter(top, 0.0)) < beta_max <= mpmath.mpf(top)
    assert top == math.nextafter(round_to(beta_max, "f8"), 3.0)  # the nearest is below
    assert bounds.adaptive_beta_argmax() == round_to(h_star, "f8")
    lo, hi = bounds.adaptive_window()
    assert mpmath.mpf(lo) <= h_on < mpmath.mpf(math.nextafter(lo, 9.0))
    assert mpmath.mpf(math.nextafter(hi, 0.0)) < h_off <= mpmath.mpf(hi)
    assert lo == round_to(h_on, "f8")  # the nearest is below H_on
    assert hi == math.nextafter(round_to(h_off, "f8"), 9.0)  # the nearest is below H_off
    assert str(bounds.adaptive_beta_max()).startswith("2.4213877066")
    assert str(bounds.adaptive_window()[0]).startswith("0.8485819960")
    assert str(bounds.adaptive_window()[1]).startswith("5.9445208279")


@pytest.mark.theorem("T6")
@given(boxed_rows(max_size=60))
@example((np.array([3.0, 0.0, 0.0, 0.0, 0.0]), 3.0))
# entropy near H*: T1 at the nearest float of beta_max was one ulp below the row
@example((np.r_[2.5962206525940714, np.zeros(99)], 2.5962206525940714))
@example((np.r_[2.5962206525940843, np.zeros(99)], 2.5962206525940843))
def test_adaptive_coefficients_obey_t1_with_beta_max(case):
    """Adaptive beta lies in [1, beta_max], and adaptive coefficients obey T1 with beta_max."""
    x, spread = case
    n = x.shape[0]
    beta = float(reference.beta(x))
    assert 1.0 <= beta <= bounds.adaptive_beta_max()
    alpha = reference.adaptive_softmax(x)
    assert alpha.max() <= bounds.max_coefficient(n, spread, bounds.adaptive_beta_max())
    assert alpha.max() <= bounds.adaptive_max_coefficient(n, spread)
    assert alpha.min() >= bounds.min_coefficient(n, spread, bounds.adaptive_beta_max())


@pytest.mark.theorem("T6")
@given(spread=st.floats(0.0, 1.0), seed=st.integers(0, 2**32 - 1))
@example(spread=0.0, seed=0)
@example(spread=1.0, seed=1)
def test_beta_is_one_from_the_switch_off_size(spread, seed):
    """Random rows using the whole spread get beta = 1 from adaptive_switch_off_size items on."""
    n = bounds.adaptive_switch_off_size(spread)
    rng = np.random.default_rng(seed)
    for size in (n, n + 17):
        x = rng.uniform(0.0, spread, size=size)
        x[0], x[-1] = 0.0, spread  # use the whole spread
        assert float(reference.beta(x)) == 1.0


@pytest.mark.theorem("T6")
def test_switch_off_size_is_tight_for_uniform_rows():
    """At spread 0 the switch-off size is 382: uniform rows get beta 1 at 382 items, > 1 at 381."""
    n = bounds.adaptive_switch_off_size(0.0)
    h_off = independent_constants()[3]
    with mpmath.workprec(600):
        assert n == int(mpmath.floor(mpmath.exp(h_off) - 1)) + 2 == 382
    assert float(reference.beta(np.zeros(n))) == 1.0
    assert float(reference.beta(np.zeros(n - 1))) > 1.0


@pytest.mark.theorem("T6")
@given(spread=st.floats(0.0, 30.0))
@example(spread=5.69)
def test_min_entropy_switch_off_size_matches_the_formula(spread):
    """The loose T3 form is floor((e^H_off - 1) e^spread) + 2, computed exactly."""
    h_off = independent_constants()[3]
    with mpmath.workprec(2000):
        y = (mpmath.exp(h_off) - 1) * mpmath.exp(mpmath.mpf(spread))
        expected = int(mpmath.floor(y)) + 2
    assert bounds.min_entropy_switch_off_size(spread) == expected
    assert bounds.adaptive_switch_off_size(spread) <= expected


@pytest.mark.parametrize("prec", [1806, 3500, 7000, 14000])
def test_switch_off_root_is_refined_by_newton_at_every_precision(prec, monkeypatch):
    """At some precisions (1806 bits, as spread 9100 asks) Newton's two fixed steps, behind a
    precision that had started too high, left a sixth of the bits wrong, and the bisection
    fallback took minutes (``adaptive_switch_off_size(9100.0)``: 155 s). Bisection now only
    isolates the root to 2**-24 (about 26 steps), Newton does the rest, and the enclosure
    is as narrow as asked."""
    sf, root = bounds._off_root(PaperPolynomial())
    calls = []
    refine = bounds.pr.refine
    monkeypatch.setattr(bounds.pr, "refine", lambda *a: calls.append(1) or refine(*a))
    monkeypatch.setattr(bounds, "_ROOT_CACHE", {})
    lo, hi = bounds._root_interval(sf, root, prec)
    assert len(calls) < 64
    with mpmath.workprec(prec + 64):
        a, b = mpmath.mpf(lo), mpmath.mpf(hi)
        assert 0 < b - a <= mpmath.mpf(2) ** (5 - prec)  # (2**-prec relative, |H_off| < 8)
        h_off = mpmath.findroot(lambda h: paper_poly(h) - 1, mpmath.mpf("5.9"))
        assert a <= h_off <= b


def two_level_entropy(k, n, spread):
    """Entropy of k logits at spread and n - k at 0 (mpmath, current precision)."""
    e = mpmath.exp(mpmath.mpf(spread))
    z = k * e + (n - k)
    return mpmath.log(z) - k * mpmath.mpf(spread) * e / z


def two_level_minimum(n, spread):
    """min over k in [0, n] of the two-level entropy: a float scan, then mpmath near its minimum."""
    k = np.arange(0, n + 1, dtype=np.float64)
    e = math.exp(spread)
    z = k * e + (n - k)
    h = np.log(z) - k * spread * e / z
    best = int(np.argmin(h))
    near = range(max(0, best - 3), min(n, best + 3) + 1)
    values = {j: two_level_entropy(j, n, spread) for j in near}
    k_min = min(values, key=values.get)
    return values[k_min], k_min


@pytest.mark.theorem("T6")
@given(spread=st.floats(0.0, 9.0))
@example(spread=5.69)
@example(spread=0.0)
@example(spread=1e-6)
def test_switch_off_size_is_the_least_n_with_two_level_minimum_above_h_off(spread):
    """adaptive_switch_off_size is the least n whose two-level minimum entropy is >= H_off."""
    n = bounds.adaptive_switch_off_size(spread)
    h_off = independent_constants()[3]
    with mpmath.workprec(200):
        assert two_level_minimum(n, spread)[0] >= h_off
        assert two_level_minimum(n - 1, spread)[0] < h_off


@pytest.mark.theorem("T6")
@given(n=st.integers(1, 120), spread=st.floats(0.0, 60.0), beta=st.sampled_from([1.0, 0.5, 3.0]))
@example(n=1, spread=3.0, beta=1.0)
@example(n=2, spread=0.0, beta=1.0)
@example(n=120, spread=1e-300, beta=1.0)  # every row nearly uniform: log n
@example(n=97, spread=5.69, beta=1.0)
@example(n=2, spread=11.313397024131955, beta=3.0)  # the test's own β δ, rounded at 53 bits
def test_least_entropy_is_the_two_level_minimum(n, spread, beta):
    """least_entropy is min over every count k of the two-level entropy, correctly rounded
    (mpmath over all n + 1 counts; the library tries the counts beside its real minimiser)."""
    with mpmath.workprec(2400):  # (β δ exact: 53 bits held 11.313397024131955 * 3 rounded)
        t = mpmath.mpf(spread) * mpmath.mpf(beta)
        e = mpmath.exp(t)
        want = min(mpmath.log(k * e + n - k) - k * t * e / (k * e + n - k) for k in range(n + 1))
        assert bounds.least_entropy(n, spread, beta) == round_to(want, "f8")


@pytest.mark.theorem("T6")
@pytest.mark.parametrize(("n", "spread"), [(4096, 5.69), (20000, 2.0), (7419, 5.69), (300, 12.0)])
def test_least_entropy_is_attained_by_a_reference_row(n, spread):
    """The reference's certified entropy of the best two-level row is least_entropy, bit for bit,
    and no count near it does better."""

    def row_entropy(k):
        return float(reference.entropy(np.r_[np.full(k, spread), np.zeros(n - k)]))

    with mpmath.workprec(200):
        w = mpmath.exp(-mpmath.mpf(spread))
        k_star = int(mpmath.floor(n * w * (spread - 1 + w) / (1 - w) ** 2))
    near = {k: row_entropy(k) for k in range(max(0, k_star - 2), min(n, k_star + 3) + 1)}
    assert min(near.values()) == bounds.least_entropy(n, spread)
    assert bounds.entropy_lower_bound(n, spread) < bounds.least_entropy(n, spread) < math.log(n)


@pytest.mark.theorem("T6")
@pytest.mark.parametrize("spread", [0.0, 0.5, 2.0, 5.0, 5.69, 12.0])
def test_least_entropy_crosses_h_off_at_the_switch_off_size(spread):
    """m(n_off - 1) < H_off <= m(n_off): the bounds table's column agrees with T6's size."""
    n = bounds.adaptive_switch_off_size(spread)
    h_off = independent_constants()[3]
    below, above = bounds.least_entropy([n - 1, n], spread)
    assert below < h_off <= above


@pytest.mark.theorem("T6")
@given(boxed_rows(max_size=60))
@example((np.array([5.0, 0.0, 0.0]), 5.0))
@example((np.array([2.0, 2.0, 0.0, 0.0, 0.0, 0.0]), 2.0))
def test_no_row_has_less_than_the_least_entropy(case):
    """The reference entropy of a random row (many on the ends of its box) is at least
    least_entropy at its spread, which is at least T3's floor; and the same at beta = 2."""
    x, spread = case
    n = x.shape[0]
    least = bounds.least_entropy(n, spread)
    assert float(reference.entropy(x)) >= least >= bounds.entropy_lower_bound(n, spread)
    if math.isfinite(2.0 * spread):
        assert float(reference.entropy(2.0 * x)) >= bounds.least_entropy(n, spread, 2.0)


def test_least_entropy_scales_with_beta_and_falls_with_the_spread():
    """m depends on beta * spread alone, decreases in it, and increases in n."""
    n = np.array([1, 2, 16, 297, 4096, 10**6])
    assert np.array_equal(bounds.least_entropy(n, 1.5, 2.0), bounds.least_entropy(n, 3.0))
    assert np.array_equal(bounds.least_entropy(n, 0.0), np.log(n.astype(float)))
    m = bounds.least_entropy(n[1:, None], np.array([0.5, 2.0, 5.69, 40.0]))
    assert np.all(np.diff(m, axis=1) < 0) and np.all(np.diff(m, axis=0) > 0)
    assert np.all(bounds.least_entropy(n, 800.0) == 0.0)  # (n - 1) 801 e^-800 < 2**-1075
    assert bounds.least_entropy(10**30, 1e7) == 0.0  # e^-1e7: every row is one-hot
    with pytest.raises(ValueError, match="n must be"):
        bounds.least_entropy(0, 1.0)


def window_segments(schedule):
    """The segments (a, b) above the threshold where P > 1, from mpmath's roots of P - 1."""
    coeffs = [mpmath.mpf(c.numerator) / c.denominator for c in schedule.exact_coefficients]
    coeffs[-1] -= 1
    theta = mpmath.mpf(schedule.exact_threshold.numerator) / schedule.exact_threshold.denominator
    roots = sorted(
        r.real for r in mpmath.polyroots(coeffs, maxsteps=200, extraprec=200) if abs(r.imag) < 1e-40
    )
    ends = [theta, *(r for r in roots if r > theta), mpmath.inf]
    segments = []
    for a, b in itertools.pairwise(ends):
        probe = (a + b) / 2 if b != mpmath.inf else a + 1
        if mpmath.polyval(coeffs, probe) > 0:
            segments.append((a, b))
    return segments


def rows_reach(n, spread, segments):
    """Whether a row of n items and spread <= `spread` has its entropy in a segment: the
    entropies fill [m(n), log n], m the two-level minimum."""
    low = two_level_minimum(n, spread)[0]
    return any(mpmath.log(n) > a and low < b for a, b in segments)


TWO_SEGMENTS = Polynomial(("-1", "5.63", "-11.107", "8.9124", "-1.4354"), "0.5")


@pytest.mark.theorem("T6")
@pytest.mark.parametrize(
    ("schedule", "spread", "size"),
    [
        # window (0.7, 0.75): rows of two items stay below 0.7, of three above 0.75 (was 3)
        (Polynomial(("-100", "145", "-51.5"), "0"), 1.0, 1),
        # window (0.078, 0.32): one item has entropy 0, two at least 0.58 (was 2)
        (Polynomial(("-40", "16", "0"), "0"), 0.1, 1),
        (Polynomial(("-40", "16", "0"), "0"), 1.0, 1),
        # beta > 1 on (0.6, 1) and (1.98, 2.05): uniform rows of 7 and 8 items miss the second,
        # 2 items reach the first (was 8)
        (TWO_SEGMENTS, 0.0, 3),
        (TWO_SEGMENTS, 0.3, 3),
        (TWO_SEGMENTS, 1.0, 9),  # rows of 8 items reach (1.98, 2.05) at spread 1
        (PaperPolynomial(), 5.69, 7419),
    ],
)
def test_switch_off_size_when_short_rows_miss_the_window(schedule, spread, size):
    """The switch-off size is one more than the longest length some row of which gets
    beta > 1. It was the least n with m(n) >= H_off, which is that only when rows of one
    item fewer reach the window's last segment; short rows may miss it, or all of it."""
    n = bounds.adaptive_switch_off_size(spread, schedule)
    assert n == size
    segments = window_segments(schedule)
    with mpmath.workprec(200):
        if n > 1:
            assert rows_reach(n - 1, spread, segments)
        for m in range(n, n + 40):
            assert not rows_reach(m, spread, segments), m
    if spread == 0.0 and n > 1:
        assert float(reference.beta(np.zeros(n - 1), schedule=schedule)) > 1.0
        assert float(reference.beta(np.zeros(n), schedule=schedule)) == 1.0


@pytest.mark.theorem("T6")
def test_switch_off_size_at_gemma_spread():
    """At spread 5.69 the switch-off is 7,419: n = 7,418 with k = 118 top logits is below H_off."""
    h_off = independent_constants()[3]
    assert bounds.adaptive_switch_off_size(5.69) == 7419
    with mpmath.workprec(200):
        low, k = two_level_minimum(7418, 5.69)
        assert k == 118
        assert low < h_off
        assert mpmath.nstr(low, 7) == "5.94447"
        assert mpmath.nstr(two_level_minimum(7419, 5.69)[0], 7) == "5.944606"
    row = np.r_[np.full(118, 5.69), np.zeros(7418 - 118)]
    assert float(reference.beta(row)) > 1.0
    assert bounds.min_entropy_switch_off_size(5.69) == 112635


@pytest.mark.theorem("T6")
@given(
    spread=st.floats(0.0, 12.0),
    n=st.integers(1, 40),
    seed=st.integers(0, 2**32 - 1),
    vertex=st.booleans(),
)
@example(spread=5.69, n=12, seed=0, vertex=True)
@example(spread=3.0, n=2, seed=1, vertex=False)
def test_no_row_has_entropy_below_the_two_level_minimum(spread, n, seed, vertex):
    """Random rows in [0, spread] (some at the box's corners) stay above the two-level minimum."""
    rng = np.random.default_rng(seed)
    row = rng.choice([0.0, spread], size=n) if vertex else rng.uniform(0.0, spread, size=n)
    with mpmath.workprec(200):
        floor = min(two_level_entropy(k, n, spread) for k in range(n + 1))
        assert reference.entropy_mp(row, prec=200) >= floor - mpmath.mpf(2) ** -150


@pytest.mark.theorem("T6")
def test_max_coefficient_bracket_at_gemma_spread():
    """The bracket's lower row, evaluated by the reference, attains the stated lower end."""
    b = bounds.adaptive_max_coefficient_bracket(1252, 5.69)
    assert b.witness.n == 1252 and b.witness.spread == 5.69
    got = float(np.max(reference.adaptive_softmax(b.witness.logits())))
    assert got >= b.lower >= 0.5
    assert got <= math.nextafter(b.lower, 1.0)
    assert got <= b.upper < bounds.adaptive_max_coefficient(1252, 5.69)
    b4096 = bounds.adaptive_max_coefficient_bracket(4096, 5.69)
    got = float(np.max(reference.adaptive_softmax(b4096.witness.logits())))
    assert b4096.lower <= got <= math.nextafter(b4096.lower, 1.0)
    # the bracket is exact to the float: the closed form gave 0.961, T1 at beta_max 0.996
    assert b4096.lower <= b4096.upper <= math.nextafter(b4096.lower, 1.0)
    assert bounds.adaptive_max_coefficient(4096, 5.69) > 0.96


@pytest.mark.theorem("T6")
@pytest.mark.parametrize(
    ("n", "spread", "schedule"),
    [
        (6, 3.0, None),
        (40, 3.0, None),
        (300, 5.69, None),
        (12, 3.0, Polynomial(("-1", "4", "-2"), "0.5")),
        (40, 1.0, Polynomial(("-20", "48", "-18.8"), "0.7")),
    ],
)
def test_max_coefficient_bracket_upper_bounds_every_row(n, spread, schedule):
    """No row, random or with few levels, has an adaptive coefficient above the upper end.

    The upper end comes from two shapes of rows that dominate every row; rows of
    other shapes (uniform draws, four levels) check that reduction.
    """
    b = bounds.adaptive_max_coefficient_bracket(n, spread, schedule)
    rng = np.random.default_rng(n)
    worst = 0.0
    for k in range(120):
        if k % 3 == 0:
            row = rng.uniform(0.0, spread, n)
        elif k % 3 == 1:
            row = rng.choice(np.r_[spread, rng.uniform(0.0, spread, 2), 0.0], n)
        else:
            j = int(rng.integers(0, n))
            row = np.r_[spread, np.full(j, rng.uniform(0.0, spread)), np.zeros(n - 1 - j)]
        worst = max(worst, float(reference.adaptive_softmax(row, schedule=schedule).max()))
    assert worst <= b.upper
    assert b.lower <= b.upper <= bounds.adaptive_max_coefficient(n, spread, schedule)


@pytest.mark.theorem("T6")
@pytest.mark.parametrize("spread", [5.69, 2.0, 12.0])
def test_dispersion_bracket(spread):
    """The witness row (lower - 1 items) reaches eps; from upper on the certified bound is < eps."""
    b = bounds.adaptive_dispersion_bracket(0.5, spread)
    assert b.witness.n == b.lower - 1
    got = float(np.max(reference.adaptive_softmax(b.witness.logits())))
    assert got >= 0.5
    assert b.lower <= b.upper <= bounds.min_entropy_switch_off_size(spread)
    assert b.upper == bounds.adaptive_dispersion_size(0.5, spread)
    assert bounds.adaptive_max_coefficient(b.upper, spread) < 0.5
    if spread == 5.69:
        assert (b.lower, b.upper) == (1253, 5828)


@pytest.mark.theorem("T6")
@pytest.mark.parametrize(
    ("eps", "spread", "schedule"),
    [
        (0.8, 1.0, None),  # two items stay below 0.8: the bracket was [2, 2], upper 5 certified
        (0.8, 0.5, Polynomial(("-20", "48", "-18.8"), "0.7")),  # three items reach 0.984
        (0.8, 0.3390956478509337, Polynomial(("-1", "1", "1.75"), "0.5")),
        (0.3, 2.0, Polynomial(("-1", "4", "-2"), "0.5")),
    ],
)
def test_dispersion_bracket_when_two_items_stay_below_eps(eps, spread, schedule):
    """The witness (lower - 1 items) reaches eps, and upper is the certified size.

    Where no row of two items reached eps the bracket claimed [2, 2] with a
    two-item witness below eps; adaptive β grows with the entropy, so a longer
    row may reach eps (here a three-item row of spread 0.5 reaches 0.984).
    """
    b = bounds.adaptive_dispersion_bracket(eps, spread, schedule)
    assert b.witness.n == b.lower - 1 and b.witness.spread <= spread
    assert reference.adaptive_softmax(b.witness.logits(), schedule=schedule).max() >= eps
    assert b.upper == bounds.adaptive_dispersion_size(eps, spread, schedule) >= b.lower
    # the old answer, size 2, was false: three items reach 0.98
    if schedule == Polynomial(("-20", "48", "-18.8"), "0.7"):
        assert reference.adaptive_softmax([0.5, 0.0, 0.0], schedule=schedule).max() > 0.98
        assert b.lower == b.upper == 6


@pytest.mark.theorem("T6")
@pytest.mark.parametrize(
    ("coefficients", "threshold", "eps", "spread", "n"),
    [
        (("2", "0"), "0.5", 0.9, 1.0, 10),  # beta = 2H: the bracket was [2, 2]
        (("1", "0", "-3", "0"), "0", 0.5, 1.0, 20),  # was [3, 3]; 20 items reach 0.99999
        (("1", "-2", "1.5"), "0", 0.5, 1.0, 40),  # the size was 2, below the bracket's 3
    ],
)
def test_schedules_without_bound_have_no_dispersion_size(coefficients, threshold, eps, spread, n):
    """Past its last critical point such a P grows, so beta-bar(n) does: T1 with it proves
    no length, and rows longer than the size once returned reach eps."""
    sched = Polynomial(coefficients, threshold)
    row = np.zeros(n)
    row[0] = spread
    assert reference.adaptive_softmax(row, schedule=sched).max() >= eps
    for func in (bounds.adaptive_dispersion_bracket, bounds.adaptive_dispersion_size):
        with pytest.raises(ValueError, match="grows without bound"):
            func(eps, spread, sched)


def test_brackets_of_any_size_have_a_repr():
    """At spread 10**4 the sizes have 4343 digits, past Python's limit for writing an
    integer: ``repr`` of the bracket raised a ValueError. Such sizes are shown by their
    leading digits; smaller ones stay exact, so the repr rebuilds the bracket."""
    big = bounds.adaptive_dispersion_bracket(0.5, 1e4, budget=0)
    text = repr(big)
    assert text.count("<int about 8.80682e+4342>") == 3 and str(big) == text
    small = bounds.adaptive_dispersion_bracket(0.5, 10.0)
    namespace = {"Bracket": bounds.Bracket, "LevelRow": bounds.LevelRow}
    assert eval(repr(small), namespace) == small
    row = bounds.LevelRow((1.0,), (3,))
    assert eval(repr(row), namespace) == row


@pytest.mark.theorem("T6")
def test_a_schedule_that_stays_above_one_still_disperses():
    """beta = 2 above H = 0.5 never switches off, yet beta <= 2 everywhere: T1 at 2 gives
    the size (it raised 'never switches off'). 404 items reach 1/2, 405 do not."""
    sched = Polynomial(("2",), "0.5")
    b = bounds.adaptive_dispersion_bracket(0.5, 3.0, sched)
    assert b.lower == b.upper == bounds.adaptive_dispersion_size(0.5, 3.0, sched) == 405
    assert bounds.max_coefficient(404, 3.0, 2.0) >= 0.5 > bounds.max_coefficient(405, 3.0, 2.0)
    assert reference.adaptive_softmax(b.witness.logits(), schedule=sched).max() >= 0.5


@pytest.mark.theorem("T6")
@pytest.mark.parametrize(("n", "spread"), [(100000, 5.69), (2**53, 5.69), (10**400, 5.69)])
def test_bracket_upper_end_is_never_below_the_exact_maximum(n, spread):
    """Where beta is 1 at every row of the length the bracket is T1's value: its upper end was
    that value rounded to nearest, below the exact one for about half the lengths (and 0.0 at
    10**400 items, whose maximum is 3e-398)."""
    b = bounds.adaptive_max_coefficient_bracket(n, spread)
    with mpmath.workprec(600):
        exact = 1 / (1 + (n - 1) * mpmath.exp(-mpmath.mpf(spread)))
        assert mpmath.mpf(b.lower) <= exact <= mpmath.mpf(b.upper)
    assert b.upper <= math.nextafter(math.nextafter(float(exact), 1.0), 1.0)


@pytest.mark.theorem("T6")
@pytest.mark.parametrize(
    ("n", "spread"), [(16384, 5.69), (100000, 5.69), (2**53, 5.69), (10**400, 5.69), (7419, 5.69)]
)
def test_closed_form_adaptive_bound_is_the_exact_one_rounded_upward(n, spread):
    """Past the switch-off size the closed form is T1 at beta = 1, attained by one logit
    `spread` above the rest. It was that value rounded to nearest, called "a certified upper
    bound": below the attained maximum at 16384 items, 0.0 at 10**400."""
    assert bounds.adaptive_switch_off_size(spread) <= n
    got = bounds.adaptive_max_coefficient(n, spread)
    with mpmath.workprec(600):
        exact = 1 / (1 + (n - 1) * mpmath.exp(-mpmath.mpf(spread)))
        assert mpmath.mpf(math.nextafter(got, 0.0)) < exact <= mpmath.mpf(got)
    if n == 16384:  # the attained value, a row the reference computes at beta = 1
        x = np.zeros(n)
        x[0] = spread
        assert reference.beta(x) == 1.0
        assert reference.adaptive_softmax(x)[0] <= got


@pytest.mark.theorem("T1")
@pytest.mark.parametrize("n", [3, 5, 16384, 10**18])
def test_t1_bounds_are_the_exact_ones_to_nearest(n):
    """max_coefficient, min_coefficient and entropy_lower_bound round to nearest (the module's
    contract: monotone, so a correctly rounded coefficient never passes them)."""
    spread = math.log(2)
    with mpmath.workprec(400):
        e = (n - 1) * mpmath.exp(-mpmath.mpf(spread))
        big = (n - 1) * mpmath.exp(mpmath.mpf(spread))
        exact = {
            bounds.max_coefficient: 1 / (1 + e),
            bounds.min_coefficient: 1 / (1 + big),
            bounds.entropy_lower_bound: mpmath.log1p(e),
        }
        for func, value in exact.items():
            got = func(n, spread)
            assert got == float(value), func.__name__  # mpmath's float() rounds to nearest
    # sizes are exact: at 3 items and spread log 2, T1 is 0.4999999999999999942 < 1/2
    assert bounds.dispersion_size(0.5, spread) == 3
    assert bounds.max_coefficient(3, spread) == 0.5


@pytest.mark.theorem("T6")
def test_dispersion_bracket_with_a_budget_is_proven_length_by_length():
    """With a budget the upper end falls from 128 to 122 at spread 2; each length between
    is checked again by the per-length branch and bound, and a row of 120 items reaches 1/2."""
    from softmaxtheory._certify.extremal import adaptive_top_upper

    plain = bounds.adaptive_dispersion_bracket(0.5, 2.0)
    tight = bounds.adaptive_dispersion_bracket(0.5, 2.0, budget=20000)
    assert (plain.lower, plain.upper) == (121, 128)
    assert (tight.lower, tight.upper) == (121, 122)
    assert reference.adaptive_softmax(tight.witness.logits()).max() >= 0.5
    for n in range(tight.upper, plain.upper):
        assert adaptive_top_upper(n, 2.0, PaperPolynomial()) < Fraction(1, 2), n
    with pytest.raises(ValueError, match="budget"):
        bounds.adaptive_dispersion_bracket(0.5, 2.0, budget=-1)


@pytest.mark.theorem("T6")
@pytest.mark.parametrize(
    ("coefficients", "eps", "spread", "size", "lower"),
    [
        (("-0.04", "3"), 0.5, 3.0, 3443, 3095),  # was 2**32
        (("-0.001", "3"), 0.5, 3.0, 7913, 7889),  # was about 3e871, and so the bracket's end
    ],
)
def test_dispersion_size_when_the_window_ends_far_out(coefficients, eps, spread, size, lower):
    """beta = 3 - 0.04 H switches off at H = 50: the search's upper end starts near e**50, and
    its last bisection ran on a grid of multiples of 2**(bits - 62) that began above the
    answer. The size is the least length whose bound is below eps; a row of lower - 1 items
    reaches eps."""
    sched = Polynomial(coefficients)
    n = bounds.adaptive_dispersion_size(eps, spread, sched)
    assert n == size
    assert bounds.adaptive_max_coefficient(n - 1, spread, sched) >= eps
    assert bounds.adaptive_max_coefficient(n, spread, sched) < eps
    b = bounds.adaptive_dispersion_bracket(eps, spread, sched, budget=30000)
    assert b.lower == lower <= b.upper <= size
    assert reference.adaptive_softmax(b.witness.logits(), schedule=sched).max() >= eps


@given(
    eps=st.floats(0.01, 0.99),
    spread=st.floats(0.0, 6.0),
    schedule=st.sampled_from(
        [
            None,
            Polynomial(("-0.04", "3")),
            Polynomial(("2",), "0.5"),
            Polynomial(("-1", "4", "-2"), "0.5"),
        ]
    ),
)
@example(eps=0.8212127935128151, spread=0.38132851715513205, schedule=None)  # was 3
@example(eps=0.8810986009044778, spread=2.606527913605865, schedule=None)  # was 77
@example(eps=0.5, spread=2.0, schedule=None)  # was 129
def test_adaptive_dispersion_size_is_the_least_proven_length(eps, spread, schedule):
    """One item fewer and T1 with beta-bar does not prove eps (or the size is 2): below the
    last critical point of P, where beta-bar need not fall with n, the size was the first
    length of the region after it, or T1's size at beta_max, not the least."""
    n = bounds.adaptive_dispersion_size(eps, spread, schedule)
    assert n == 2 or bounds.adaptive_max_coefficient(n - 1, spread, schedule) >= eps


@given(eps=st.floats(0.01, 0.99), spread=st.floats(0.0, 12.0))
@example(eps=0.5, spread=5.69)
@example(eps=0.99, spread=0.0)
@example(eps=0.01, spread=0.0)
def test_adaptive_dispersion_size_bound_stays_below(eps, spread):
    """From adaptive_dispersion_size on, adaptive_max_coefficient is below eps (a few probes)."""
    n = bounds.adaptive_dispersion_size(eps, spread)
    for m in (n, n + 1, 2 * n, 10 * n):
        # <=: the exact bound is below eps, its rounding to float64 may equal it
        assert bounds.adaptive_max_coefficient(m, spread) <= eps


@pytest.mark.parametrize("spread", [1e4, 1e5, 1.4e6 / 2.5])
def test_huge_spreads_answer_as_text(spread):
    """Issue 14 item 8: sizes at huge spreads, as correctly rounded text (minutes before)."""
    text = bounds.dispersion_size(0.5, spread, digits=6)
    with mpmath.workprec(200):
        mant, exp10 = mpmath.nstr(
            mpmath.exp(mpmath.mpf(spread)), 6, min_fixed=1, max_fixed=0
        ).split("e")
        assert text == f"{mant}e+{int(exp10)}"
    assert "e+" in bounds.adaptive_switch_off_size(spread, digits=6)
    b = bounds.adaptive_dispersion_bracket(0.5, spread)
    assert b.lower <= b.upper


def test_size_text():
    assert bounds.size_text(7419) == "7419"
    assert bounds.size_text(10**400 + 1) == "1.00000e+400"
    assert bounds.size_text(1234567, digits=3) == "1.23e+6"
    assert bounds.size_text(9999999, digits=3) == "1.00e+7"
    assert bounds.dispersion_size(0.5, 800.0, digits=6) == bounds.size_text(
        bounds.dispersion_size(0.5, 800.0)
    )
    assert bounds.adaptive_switch_off_size(30.0, digits=4) == bounds.size_text(
        bounds.adaptive_switch_off_size(30.0), 4
    )
    with pytest.raises(ValueError, match="digits"):
        bounds.dispersion_size(0.5, 1.0, digits=0)


@pytest.fixture
def low_precision_cap(monkeypatch):
    """Certification stops at 4096 bits: a size text that is not decided by then fails fast.

    Before the fix, a size of seven digits ending in 5 (a tie at six) climbed to
    2**21 bits and more (minutes per call) and never decided.
    """
    import softmaxtheory._certify.interval as ivl

    monkeypatch.setattr(ivl, "MAX_PRECISION", 4096)


@pytest.mark.parametrize(
    ("func", "args", "size", "text"),
    [
        (bounds.dispersion_size, (0.5, 13.90000180000001), 1088165, "1.08816e+6"),
        (bounds.dispersion_size, (0.5, 14.000008), 1202615, "1.20262e+6"),
        (bounds.dispersion_size, (0.01, 10.000006), 2180635, "2.18064e+6"),
        (bounds.min_entropy_switch_off_size, (8.000002,), 1134725, "1.13472e+6"),
    ],
)
def test_size_text_of_a_size_at_a_rounding_tie(low_precision_cap, func, args, size, text):
    """A size on a rounding boundary of its text is rounded to even, at low precision.

    The text was decided from the real range [v + 1, v + 2] around the size, which
    holds the boundary at every precision; ``softmaxtheory bounds --spread
    13.90000180000001`` printed nothing for minutes.
    """
    assert func(*args) == size
    assert func(*args, digits=6) == bounds.size_text(size, 6) == text
    assert func(*args, digits=7) == str(size)
    # directed: the least six-digit text at least the size, the greatest at most it
    up, down = func(*args, digits=6, rounding="up"), func(*args, digits=6, rounding="down")
    hi, lo = str(size // 10 + 1), str(size // 10)  # six digits each (no carry here)
    assert (up, down) == (f"{hi[0]}.{hi[1:]}e+6", f"{lo[0]}.{lo[1:]}e+6")


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    eps=st.sampled_from([0.5, 0.1]),
    spread=st.floats(13.9, 16.0),
    rounding=st.sampled_from(["nearest", "up", "down"]),
)
@example(eps=0.5, spread=13.90000180000001, rounding="nearest")
@example(eps=0.5, spread=13.90000180000001, rounding="up")
def test_size_text_is_the_exact_size_rounded(low_precision_cap, eps, spread, rounding):
    """dispersion_size's text is size_text of its exact integer (sizes of 7 and 8 digits)."""
    exact = bounds.dispersion_size(eps, spread)
    text = bounds.dispersion_size(eps, spread, digits=6, rounding=rounding)
    assert text == bounds.size_text(exact, 6, rounding=rounding)


@given(n=st.integers(1, 10**40), digits=st.integers(1, 8))
@example(n=1088165, digits=6)
@example(n=999999999, digits=6)
@example(n=1000000, digits=6)
@example(n=10**400 + 1, digits=6)
def test_size_text_directed_rounding(n, digits):
    """'up' gives the least text at least n, 'down' the greatest at most n, with digits digits."""
    up, down = (
        bounds.size_text(n, digits, rounding="up"),
        bounds.size_text(n, digits, rounding="down"),
    )
    near = bounds.size_text(n, digits)
    if n < 10**digits:
        assert up == down == near == str(n)
        return
    value = {t: Fraction(Decimal(t)) for t in (up, down, near)}
    assert value[down] <= n <= value[up]
    ulp = Fraction(10) ** (len(str(n)) - digits)  # one unit in the last digit shown
    assert value[up] - value[down] in (0, ulp) and value[up] - n < ulp and n - value[down] < ulp
    assert value[near] in (value[up], value[down])
    assert abs(value[near] - n) <= ulp / 2


def test_size_text_rounding_is_checked():
    with pytest.raises(ValueError, match="rounding"):
        bounds.size_text(5, rounding="ceil")
    with pytest.raises(ValueError, match="rounding"):
        bounds.dispersion_size(0.5, 1.0, digits=6, rounding="UP")


@pytest.mark.theorem("T5")
def test_threshold_at_or_below_zero_never_jumps():
    """T5 part 3 needs theta > 0: with theta <= 0 nothing is discontinuous."""
    assert not Polynomial(("1", "2"), threshold="0").jumps_at_threshold
    assert not Polynomial(("1", "2"), threshold="-1").jumps_at_threshold
    assert Polynomial(("1", "2"), threshold="0.5").jumps_at_threshold


@given(
    beta=st.sampled_from(["0.3", "0.7", "1.1", "0.1", "2"]),
    top=st.floats(1.0, 40.0),
    n=st.sampled_from([2, 3, 10]),
)
@example(beta="0.3", top=2.5788907490503243, n=10)  # one ulp above the bound before
@example(beta="0.3", top=4.923693288427752, n=2)
def test_constant_decimal_schedules_bound_their_rows(beta, top, n):
    """A Constant's decimal beta enters the adaptive bounds exactly, not as its float.

    float("0.3") is below 3/10, which the reference uses: T1 at it fell one ulp
    below the reference's largest coefficient (19 of 1,200 random rows).
    """
    sched = Constant(beta)
    row = np.r_[top, np.zeros(n - 1)]
    alpha = reference.adaptive_softmax(row, schedule=sched).max()
    spread = float(bounds.empirical_spread(row))
    assert alpha <= bounds.adaptive_max_coefficient(n, spread, sched)
    assert alpha <= bounds.max_coefficient(n, spread, bounds.adaptive_beta_max(sched))
    assert Fraction(bounds.adaptive_beta_max(sched)) >= sched.exact_beta


def test_adaptive_beta_max_is_rounded_upward_and_decides_exact_peaks():
    """The smallest float at least the peak, also where the peak is a float at an irrational H."""
    assert bounds.adaptive_beta_max(Constant("0.3")) == math.nextafter(0.3, 1.0)
    assert bounds.adaptive_beta_max(Constant("0.5")) == 0.5
    # -9 H^2 + 6 H + 1 peaks at exactly 2 at H = 1/3: no enclosure of P(1/3) excludes 2
    assert bounds.adaptive_beta_max(Polynomial(("-9", "6", "1"), "0.1")) == 2.0
    # -H^2 + 3 H peaks at 9/4 = 2.25 (a float) at H = 3/2
    assert bounds.adaptive_beta_max(Polynomial(("-1", "3", "0"), "0.1")) == 2.25
    # -H^2 + H + 2.06 decreases beyond the threshold 0.6: the sup is P(0.6) = 2.3 > float(2.3)
    assert Fraction(2.3) < Fraction("2.3")
    decreasing = Polynomial(("-1", "1", "2.06"), "0.6")
    assert bounds.adaptive_beta_max(decreasing) == math.nextafter(2.3, 3.0)


@pytest.mark.theorem("T6")
@pytest.mark.parametrize(
    ("schedule", "beta_max", "argmax", "sizes"),
    [
        # beta = max(-H - 1, 1) > 1 only for H in (-5, -2): no row gets it (min-entropy: -19044)
        (Polynomial(("-1", "-1"), threshold="-5"), 1.0, math.nan, (1, 1, 1)),
        # P = 3 - H peaks at the threshold -1 (4); rows reach at most P(0) = 3
        (Polynomial(("-1", "3"), threshold="-1"), 3.0, 0.0, None),
        # H_off = 0 exactly (P = 1 - H): beta is 1 from one item on
        (Polynomial(("-1", "1"), threshold="-1"), 1.0, math.nan, (1, 1, 1)),
    ],
)
def test_a_threshold_below_zero_counts_only_entropies_a_row_can_have(
    schedule, beta_max, argmax, sizes
):
    """Entropies are at least 0. beta_max was the supremum over every H above the
    threshold (4.0 where rows get at most 3), and the min-entropy switch-off size,
    (e**H_off - 1) e**spread + 2 floored, went negative for H_off < 0 (-19044)."""
    assert bounds.adaptive_beta_max(schedule) == beta_max
    got = bounds.adaptive_beta_argmax(schedule)
    assert got == argmax or (math.isnan(got) and math.isnan(argmax))
    with mpmath.workprec(200):  # beta_max is reached (or approached) by rows: a uniform row's
        hs = [mpmath.log(n) for n in range(1, 60)]  # entropy is log n
        poly = [mpmath.mpf(c.numerator) / c.denominator for c in schedule.exact_coefficients]
        reached = max(max(mpmath.polyval(poly, h), 1) for h in hs)
        assert reached <= beta_max
    for spread in (1.0, 3.0, 10.0):
        n_min = bounds.min_entropy_switch_off_size(spread, schedule)
        assert n_min >= bounds.adaptive_switch_off_size(spread, schedule) >= 1
        text = bounds.min_entropy_switch_off_size(spread, schedule, digits=3)
        assert text == bounds.size_text(n_min, 3)
    if sizes is not None:
        assert tuple(bounds.min_entropy_switch_off_size(d, schedule) for d in (1, 3, 10)) == sizes


def test_window_ends_are_rounded_outward():
    """beta = 1 at every float entropy outside the window, also for user polynomials."""
    # -H^2 + 4H - 2 = 1 at exactly 1 and 3 (floats): kept
    assert bounds.adaptive_window(Polynomial(("-1", "4", "-2"), "0.5")) == (1.0, 3.0)
    # 2 + 2**-53 - H = 1 at 1 + 2**-53, a midpoint: the upper end goes up, not to even
    exact_mid = "2.00000000000000011102230246251565404236316680908203125"
    assert bounds.adaptive_window(Polynomial(("-1", exact_mid), "0.5")) == (0.5, 1 + 2.0**-52)
    # the window opens at the threshold 0.7, whose float is below 7/10: kept, rounded down
    lo, hi = bounds.adaptive_window(Polynomial(("-1", "3"), "0.7"))
    assert Fraction(lo) <= Fraction("0.7") and hi == 2.0


def test_constant_and_loglength_schedules():
    assert bounds.adaptive_beta_max(Constant(2)) == 2.0
    assert bounds.adaptive_beta_max(LogLength(1)) == math.inf
    assert bounds.adaptive_dispersion_size(0.5, 3.0, Constant(2)) == bounds.dispersion_size(
        0.5, 3.0, 2.0
    )
    with pytest.raises(ValueError, match="schedule"):
        bounds.adaptive_window(Constant(2))
    with pytest.raises(ValueError, match="schedule"):
        bounds.adaptive_switch_off_size(1.0, LogLength(1))


def test_user_polynomials():
    # beta = max(H, 1) above 0.5: window (1, inf), unbounded
    linear = Polynomial(("1", "0"), "0.5")
    assert bounds.adaptive_window(linear) == (1.0, math.inf)
    assert bounds.adaptive_beta_max(linear) == math.inf
    with pytest.raises(ValueError, match="never switches off"):
        bounds.adaptive_switch_off_size(1.0, linear)
    # a jump at the threshold: P = 3 - H, theta = 1 -> beta = 2 just above 1, window (1, 2)
    jump = Polynomial(("-1", "3"), "1")
    assert bounds.adaptive_window(jump) == (1.0, 2.0)
    assert bounds.adaptive_beta_max(jump) == 2.0
    assert bounds.adaptive_switch_off_size(0.0, jump) == math.floor(math.e**2 - 1) + 2
    # a peak at a rational point: P = 2 - (H - 3)^2 -> peak 2 at H = 3, window (2, 4)
    peak = Polynomial(("-1", "6", "-7"), "0.5")
    assert bounds.adaptive_window(peak) == (2.0, 4.0)
    assert (bounds.adaptive_beta_argmax(peak), bounds.adaptive_beta_max(peak)) == (3.0, 2.0)
    # a polynomial whose maximum lies below the threshold does not count there
    low = Polynomial(("-1", "0", "5"), "3")  # 5 - H^2: above 1 only for H < 2 <= theta
    with pytest.raises(ValueError, match="no window"):
        bounds.adaptive_window(low)
    assert bounds.adaptive_beta_max(low) == 1.0
    assert bounds.adaptive_window(PaperPolynomial()) == bounds.adaptive_window()


# ---------------------------------------------------------------- T9


@pytest.mark.theorem("T9")
@given(q=st.floats(0.0, 1e6), k=st.floats(0.0, 1e6), scale=st.floats(1e-3, 10.0, exclude_min=False))
@example(q=1.0 + 2.0**-52, k=1.5, scale=1.0)  # 3 + 3 * 2**-52: a tie, to even is below
@example(q=0.1, k=0.1, scale=1.0)  # to nearest is below the exact product
def test_spread_from_norms_is_rounded_upward(q, k, scale):
    """spread_from_norms is 2 * scale * |q| * |k| rounded upward (exact rationals).

    It is a spread the bounds are evaluated at: rounded to nearest, half the
    inexact products came out below the bound of T9.
    """
    exact = 2 * Fraction(scale) * Fraction(q) * Fraction(k)
    got = bounds.spread_from_norms(q, k, scale)
    assert Fraction(got) >= exact
    assert got == 0.0 or Fraction(math.nextafter(got, 0.0)) < exact


def exact_vec(v):
    return [Fraction(float(t)) for t in v]


def exact_dot(a, b):
    return sum((x * y for x, y in zip(a, b, strict=True)), Fraction(0))


def exact_matvec(w, x):
    return [exact_dot(exact_vec(row), x) for row in w]


@pytest.mark.theorem("T9")
@given(
    seed=st.integers(0, 2**32 - 1),
    d_model=st.integers(1, 6),
    d_head=st.integers(1, 4),
    input_norm=st.floats(0.1, 10.0),
    biased=st.booleans(),
)
@example(seed=0, d_model=4, d_head=2, input_norm=1.0, biased=False)
def test_logits_from_weights_never_exceed_the_bound(seed, d_model, d_head, input_norm, biased):
    """Exact logit spreads of inputs in the ball, extremal ones included, stay within T9's bound."""
    rng = np.random.default_rng(seed)
    wq = rng.normal(size=(d_head, d_model))
    wk = rng.normal(size=(d_head, d_model))
    bq = rng.normal(size=d_head) if biased else None
    bk = rng.normal(size=d_head) if biased else None
    scale = 1 / math.sqrt(d_head)
    bound = Fraction(
        bounds.spread_from_weights(wq, wk, input_norm, bias_q=bq, bias_k=bk, scale=scale)
    )
    # inputs inside the ball, some on its sphere along the top singular directions
    inputs = rng.normal(size=(6, d_model))
    inputs /= np.linalg.norm(inputs, axis=1, keepdims=True)
    inputs *= rng.uniform(0, input_norm, size=(6, 1))
    _, _, vt_q = np.linalg.svd(wq)
    _, _, vt_k = np.linalg.svd(wk)
    extremal = [vt_q[0], -vt_q[0], vt_k[0], -vt_k[0]]
    inputs = np.vstack([inputs, *(v * input_norm * (1 - 1e-15) for v in extremal)])
    xs = [exact_vec(x) for x in inputs]
    zero = [Fraction(0)] * d_head
    queries = [
        [a + b for a, b in zip(exact_matvec(wq, x), exact_vec(bq) if biased else zero, strict=True)]
        for x in xs
    ]
    keys = [
        [a + b for a, b in zip(exact_matvec(wk, x), exact_vec(bk) if biased else zero, strict=True)]
        for x in xs
    ]
    s = Fraction(scale)
    for q in queries:
        logits = [s * exact_dot(q, k) for k in keys]
        assert max(logits) - min(logits) <= bound


@pytest.mark.theorem("T9")
@given(seed=st.integers(0, 2**32 - 1), d_model=st.integers(1, 8), d_head=st.integers(1, 4))
@example(seed=0, d_model=64, d_head=16)
def test_aligned_inputs_attain_the_sharp_weight_bound(seed, d_model, d_head):
    """With zero biases, x = B u1 and keys from +-B v1 attain 2 s B^2 ||W_Q^T W_K|| to 1e-9."""
    rng = np.random.default_rng(seed)
    wq = rng.normal(size=(d_head, d_model))
    wk = rng.normal(size=(d_head, d_model))
    big_b, scale = 1.7, 0.25
    bound = bounds.spread_from_weights(wq, wk, big_b, scale=scale, layout="out_in")
    u, _, vt = np.linalg.svd(wq.T @ wk)
    x, y = big_b * u[:, 0], big_b * vt[0]
    q = exact_matvec(wq, x)
    keys = [exact_matvec(wk, y), exact_matvec(wk, -y)]
    logits = [Fraction(scale) * exact_dot(q, k) for k in keys]
    attained = float(max(logits) - min(logits))
    assert attained <= bound <= attained * (1 + 1e-9)


@pytest.mark.theorem("T9")
def test_key_bias_cancels_and_query_bias_is_bounded():
    """A key bias leaves the bound unchanged (T8); a query bias adds 2 s B ||W_K^T b_Q|| at most."""
    rng = np.random.default_rng(3)
    wq, wk = rng.normal(size=(2, 3, 5))
    bq, bk = rng.normal(size=(2, 3))
    plain = bounds.spread_from_weights(wq, wk, 1.0, layout="out_in")
    assert bounds.spread_from_weights(wq, wk, 1.0, bias_k=bk * 1e6, layout="out_in") == plain
    biased = bounds.spread_from_weights(wq, wk, 1.0, bias_q=bq, layout="out_in")
    sigma = np.linalg.norm(wq.T @ wk, 2)
    c = np.linalg.norm(wk.T @ bq)
    assert biased == pytest.approx(2 * (sigma + c), rel=1e-12)
    # the supremum is at least 2 sqrt(sigma^2 + |c|^2): the bound is within sqrt 2 of it
    assert biased <= math.sqrt(2) * 2 * math.hypot(sigma, c) * (1 + 1e-12)


@pytest.mark.theorem("T9")
def test_spread_from_weights_is_nearly_attained():
    """Inputs along the top singular vector attain the T9 weight bound to within 1e-12."""
    rng = np.random.default_rng(1)
    w = rng.normal(size=(3, 5))
    _, sv, vt = np.linalg.svd(w)
    bound = bounds.spread_from_weights(w, w, 2.0, layout="out_in")
    # query and keys along the top right singular vector: logits +-|q||k|
    q = w @ (2.0 * vt[0])
    k_plus, k_minus = w @ (2.0 * vt[0]), w @ (-2.0 * vt[0])
    attained = float(q @ k_plus - q @ k_minus)
    assert attained <= bound <= attained * (1 + 1e-12)
    assert bound == pytest.approx(2 * (2 * sv[0]) ** 2, rel=1e-13)


@pytest.mark.theorem("T9")
@pytest.mark.parametrize("e", [-600, -560, -530, -300, 0, 300, 500, 520, 600])
def test_spread_from_weights_across_the_float_range(e):
    """Weights scaled by 2**e: the bound stays an upper bound of an attained spread (exact
    arithmetic), as tight as at e = 0 while it is a normal float, and inf beyond the range.
    Weights near 1e200 gave NaN (their product overflowed inside the SVD)."""
    rng = np.random.default_rng(4)
    wq, wk = rng.normal(size=(2, 3, 5))
    big_b, scale = 1.5, 0.5
    u, _, vt = np.linalg.svd(wq.T @ wk)
    x, y = big_b * u[:, 0] * (1 - 2**-40), big_b * vt[0] * (1 - 2**-40)
    wq_e, wk_e = np.ldexp(wq, e), np.ldexp(wk, e)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow or invalid warning either
        bound = bounds.spread_from_weights(wq_e, wk_e, big_b, scale=scale, layout="out_in")
    q = exact_matvec(wq_e, exact_vec(x))
    keys = [exact_matvec(wk_e, exact_vec(y)), exact_matvec(wk_e, exact_vec(-y))]
    attained = Fraction(scale) * (exact_dot(q, keys[0]) - exact_dot(q, keys[1]))
    if attained > Fraction(np.finfo(np.float64).max):
        assert bound == math.inf
        return
    assert attained <= Fraction(bound)
    if float(attained) >= np.finfo(np.float64).tiny:
        assert bound <= float(attained) * (1 + 1e-9)


def test_spread_from_weights_zero_input_norm_with_overflowing_weights():
    """0 * inf: with inputs of norm 0 and no bias the logits are 0 whatever the weights."""
    huge = np.eye(2) * 1e200
    assert bounds.spread_from_weights(huge, huge, 0.0) < 1e-300
    assert bounds.spread_from_weights(huge, huge, 1.0, key_input_norm=0.0) < 1e-300
    assert bounds.spread_from_weights(huge, huge, 1e10, bias_q=np.ones(2)) == math.inf


def test_spread_from_weights_per_head_and_layout():
    rng = np.random.default_rng(2)
    w_q = rng.normal(size=(4, 8, 2))  # 4 heads, (d_model, d_head) layout
    w_k = rng.normal(size=(4, 8, 2))
    per_head = bounds.spread_from_weights(w_q, w_k, 1.5, scale=0.5, layout="in_out")
    assert per_head.shape == (4,)
    for h in range(4):
        # the transposed (d_head, d_model) layout of nn.Linear gives the same bound
        transposed = bounds.spread_from_weights(w_q[h].T, w_k[h].T, 1.5, scale=0.5, layout="out_in")
        assert transposed == pytest.approx(per_head[h], rel=1e-14)
        assert bounds.spread_from_weights(w_q[h], w_k[h], 1.5, scale=0.5) >= per_head[h]
    with pytest.raises(ValueError, match="layout"):
        bounds.spread_from_weights(w_q, w_k, 1.5, layout="rows")


# ---------------------------------------------------------------- measurement


def test_empirical_spread_ignores_masks_and_reports_bad_rows():
    x = np.array(
        [
            [0.0, 2.5, -np.inf, 1.0],
            [-np.inf, -np.inf, -np.inf, -np.inf],
            [3.0, -np.inf, -np.inf, -np.inf],
            [0.0, np.nan, 1.0, 2.0],
            [0.0, np.inf, 1.0, 2.0],
        ]
    )
    out = bounds.empirical_spread(x)
    assert out[:3].tolist() == [2.5, 0.0, 0.0]
    assert np.isnan(out[3]) and np.isnan(out[4])


def test_empirical_spread_axes_and_dtypes():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(3, 5, 7)).astype(np.float32)
    for axis in (0, 1, 2, -1, (1, 2)):
        expected = np.ptp(x.astype(np.float64), axis=axis)
        np.testing.assert_array_equal(bounds.empirical_spread(x, axis=axis), expected)
    assert bounds.empirical_spread([1, 5, 3]) == 4.0  # integers
    # the exact difference 2e308 overflows float64
    assert bounds.empirical_spread(np.array([-1e308, 1e308])) == math.inf
    with pytest.raises(ValueError, match="axis"):
        bounds.empirical_spread(x, axis=3)
    with pytest.raises(TypeError, match="complex"):
        bounds.empirical_spread(np.array([1j, 2.0]))
    with pytest.raises(ValueError, match="dimension"):
        bounds.empirical_spread(3.0)


def _exact_spread(row) -> Fraction:
    finite = [Fraction(v) for v in np.asarray(row, dtype=np.float64).tolist() if v != -math.inf]
    return max(finite) - min(finite) if finite else Fraction(0)


rows_of_floats = st.lists(
    st.one_of(st.floats(-1e6, 1e6), st.floats(-1e-300, 1e-300), st.just(-math.inf)),
    min_size=1,
    max_size=6,
)


@given(row=rows_of_floats, dtype=st.sampled_from([np.float64, np.float32]))
@example(row=[0.7981434307915531, -0.049460755213309296], dtype=np.float64)
@example(row=[1.0, -(2.0**-60)], dtype=np.float64)
@example(row=[5e-324, -5e-324, -math.inf], dtype=np.float64)
def test_empirical_spread_is_the_exact_spread_rounded_upward(row, dtype):
    """The smallest float64 at least the exact max - min of the unmasked items."""
    x = np.asarray(row, dtype=dtype)
    exact = _exact_spread(x)
    got = float(bounds.empirical_spread(x))
    assert Fraction(got) >= exact
    assert got == 0.0 or Fraction(math.nextafter(got, 0.0)) < exact


@pytest.mark.theorem("T1")
@given(row=st.lists(st.floats(-30, 30), min_size=2, max_size=6))
@example(row=[0.7981434307915531, -0.049460755213309296])  # 1 ulp above T1 before
@example(row=[0.6104146356581587, -0.058818775708404374])
@example(row=[0.8707871887053318, -0.04771130551690931])
def test_the_bounds_at_the_measured_spread_hold_for_the_row(row):
    """T1 and T3 at empirical_spread(row) bound the row's correctly rounded softmax and entropy.

    The measured spread was rounded to nearest: below the row's spread for half the
    inexact differences, and max_coefficient there fell one ulp below the row's
    largest coefficient, as reference.softmax rounds it.
    """
    n, delta = len(row), float(bounds.empirical_spread(row))
    alpha = reference.softmax(row)
    assert alpha.max() <= bounds.max_coefficient(n, delta)
    assert alpha.min() >= bounds.min_coefficient(n, delta)
    assert float(reference.entropy(row)) >= bounds.entropy_lower_bound(n, delta)


def test_empirical_spread_of_exact_integers_and_long_doubles():
    """Integers beyond 2**53 and long doubles are differenced exactly, then rounded upward."""
    assert bounds.empirical_spread(np.array([0, 2**53 + 1])) == 2.0**53 + 2
    assert bounds.empirical_spread(np.array([-(2**63), 2**63 - 1])) == 2.0**64
    assert bounds.empirical_spread(np.array([[1, 2], [3, 9]], dtype=np.uint8)).tolist() == [1, 6]
    assert bounds.empirical_spread(np.zeros((2, 0), dtype=np.int64)).tolist() == [0.0, 0.0]
    wide = np.array([np.longdouble(1) + np.longdouble(2) ** -60, 0.0], dtype=np.longdouble)
    if wide[0] != 1:  # a platform whose long double is wider than float64
        assert bounds.empirical_spread(wide) == math.nextafter(1.0, 2.0)
    big = np.array([-np.inf, np.longdouble(3), np.longdouble(1)], dtype=np.longdouble)
    assert bounds.empirical_spread(big) == 2.0


def test_empirical_spread_of_torch_tensors():
    torch = pytest.importorskip("torch")
    x = torch.tensor([[0.0, 1.5, float("-inf")], [2.0, -2.0, 0.0]], dtype=torch.bfloat16)
    np.testing.assert_array_equal(bounds.empirical_spread(x), [1.5, 4.0])
    y = torch.randn(2, 3, requires_grad=True)
    assert bounds.empirical_spread(y).shape == (2,)


# ---------------------------------------------------------------- API shape and errors


def test_broadcasting_matches_scalar_calls():
    n = np.array([[1], [16], [4096]])
    spread = np.array([0.0, 2.0, 5.69, 40.0])
    out = bounds.max_coefficient(n, spread)
    assert out.shape == (3, 4) and out.dtype == np.float64
    for i in range(3):
        for j in range(4):
            assert out[i, j] == bounds.max_coefficient(int(n[i, 0]), float(spread[j]))
    sizes_ = bounds.dispersion_size([0.5, 0.1], 5.69)
    assert sizes_.dtype == object and sizes_.tolist() == [297, bounds.dispersion_size(0.1, 5.69)]
    big = bounds.max_coefficient(10**30, 1.0)  # beyond int64
    assert big == round_to(exact_max(10**30, 1.0, 1.0), "f8")


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: bounds.max_coefficient(0, 1.0), "n"),
        (lambda: bounds.max_coefficient(2.5, 1.0), "n"),
        (lambda: bounds.min_coefficient(3, -1.0), "spread"),
        (lambda: bounds.min_coefficient(3, math.nan), "spread"),
        (lambda: bounds.entropy_lower_bound(3, math.inf), "spread"),
        (lambda: bounds.max_coefficient(3, 1.0, beta=0.0), "beta"),
        (lambda: bounds.max_coefficient(3, 1.0, beta=-2.0), "beta"),
        (lambda: bounds.dispersion_size(0.0, 1.0), "eps"),
        (lambda: bounds.dispersion_size(1.0, 1.0), "eps"),
        (lambda: bounds.dispersion_size(math.nan, 1.0), "eps"),
        (lambda: bounds.dispersion_size([0.5, 1.5], 1.0), "eps"),
        (lambda: bounds.adaptive_switch_off_size(-1.0), "spread"),
        (lambda: bounds.spread_from_norms(-1.0, 1.0), "query_norm"),
        (lambda: bounds.spread_from_norms(1.0, 1.0, scale=0.0), "scale"),
        (lambda: bounds.spread_from_weights(np.eye(2), np.eye(2), -1.0), "input_norm"),
        (lambda: bounds.spread_from_weights(np.ones(2), np.eye(2), 1.0), "w_q"),
        (lambda: bounds.spread_from_weights(np.eye(2), np.eye(2) * np.nan, 1.0), "w_k"),
        (lambda: bounds.max_coefficient([1, 2], [1.0, 2.0, 3.0]), "broadcast"),
    ],
)
def test_invalid_arguments_name_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()


@pytest.mark.parametrize(
    "call",
    [
        lambda: bounds.max_coefficient(True, 1.0),
        lambda: bounds.max_coefficient(3, 1j),
        lambda: bounds.max_coefficient("3", 1.0),
    ],
)
def test_wrong_types_are_type_errors(call):
    with pytest.raises(TypeError):
        call()


def test_switch_off_size_as_text_is_the_rounded_exact_size():
    """adaptive_switch_off_size(12.0, digits=6) never returned (its enclosure did not converge
    for spreads of about 9.5 to 14.5); the text is the exact size, correctly rounded."""
    for spread in (9.3, 12.0, 14.4, 999.0):
        exact = bounds.adaptive_switch_off_size(spread)
        assert bounds.adaptive_switch_off_size(spread, digits=6) == bounds.size_text(exact, 6)


# ---------------------------------------------------------------- arguments that no float holds

NOT_FLOATS = [
    Fraction(1, 3),
    Decimal("0.1"),
    np.longdouble(1) / np.longdouble(3),
    2**53 + 1,
]
EXACT_FLOATS = [(Fraction(1, 4), 0.25), (Decimal("0.5"), 0.5),
                (np.float32(0.1), float(np.float32(0.1))), (2**53, 2.0**53)]  # fmt: skip


@pytest.mark.parametrize("value", NOT_FLOATS, ids=repr)
def test_an_argument_no_float_holds_is_refused(value):
    """The bounds are exact functions of float arguments: Fraction(1, 3) was rounded to the
    nearest float, a smaller spread, so max_coefficient could come out below the exact value
    for the spread given. Such an argument is refused, naming the float to pass instead."""
    if np.longdouble(1) / np.longdouble(3) == 1 / 3 and isinstance(value, np.longdouble):
        pytest.skip("long double is float64 on this platform")
    for call in (
        lambda: bounds.max_coefficient(10, value),
        lambda: bounds.entropy_lower_bound(10, 1.0, beta=value),
        lambda: bounds.spread_from_norms(value, 1.0),
        lambda: bounds.spread_from_weights(np.eye(2), np.eye(2), value),
    ):
        with pytest.raises(ValueError, match=r"not a float64 value.*float64|pass float\("):
            call()


@pytest.mark.parametrize(("value", "as_float"), EXACT_FLOATS, ids=repr)
def test_an_argument_a_float_holds_is_that_float(value, as_float):
    assert bounds.max_coefficient(10, value) == bounds.max_coefficient(10, as_float)
    assert bounds.spread_from_weights(np.eye(2), np.eye(2), value) == (
        bounds.spread_from_weights(np.eye(2), np.eye(2), as_float)
    )


def test_weights_no_float_holds_are_refused():
    with pytest.raises(ValueError, match=r"w_q holds 1152921504606846977"):
        bounds.spread_from_weights(np.array([[2**60 + 1, 0], [0, 1]]), np.eye(2), 1.0)
    third = np.eye(2, dtype=np.longdouble) / 3
    if third[0, 0] != np.float64(third[0, 0]):  # (long double is float64 on some platforms)
        with pytest.raises(ValueError, match="w_k holds"):
            bounds.spread_from_weights(np.eye(2), third, 1.0)
    assert bounds.spread_from_weights(np.array([[2, 0], [0, 1]]), np.eye(2), 1.0) > 4.0


@pytest.mark.theorem("T6")
def test_dispersion_bracket_between_2_53_and_2_1000_items():
    """Spread 36 (sizes near 2**52) raised 'negative shift count' in the witness search (the
    bounds command exited 2); spread 40 (2.4e17 items) was left at the closed form's 8.2e17:
    boxes of counts past 2**53 took rationals, and the segment's corner need - w0 rounded away
    the few hundred items it leaves. Floats now, with the corner formed exactly."""
    plain = bounds.adaptive_dispersion_bracket(0.5, 36.0)
    assert plain.lower <= plain.upper
    b = bounds.adaptive_dispersion_bracket(0.5, 40.0, budget=30000)
    assert b.lower == 235385266837019987 and b.upper <= 1.02 * b.lower
    assert bounds.adaptive_dispersion_bracket(0.5, 40.0).upper > 3 * b.lower  # the closed form
    assert b.witness.n == b.lower - 1


@pytest.mark.theorem("T6")
@pytest.mark.parametrize("spread", [20.0, 30.0, 40.0])
def test_dispersion_bracket_lower_end_is_at_least_the_plain_size(spread):
    """beta >= 1, so T1's extreme row at beta = 1 reaches eps with dispersion_size - 1 items:
    the lower end was below that (485165189 against 485165197 at spread 20, 10686474539733
    against 10686474581526 at 30), the witness search stopping within 1e-9 of its end."""
    b = bounds.adaptive_dispersion_bracket(0.5, spread)
    plain = bounds.dispersion_size(0.5, spread)
    assert b.lower == plain
    assert b.witness == bounds.LevelRow((spread, 0.0), (1, plain - 2))
    assert bounds.max_coefficient(plain - 1, spread) >= 0.5


def test_spread_from_weights_never_overflows_midway():
    # formed in floats: 2 * 1e308 * 0 was NaN, and 1e308 * 1e-300 or weights of 1e160 inf
    w = np.diag([2.0, 1.0])  # ||W^T W||_2 = 4: the bound is 8 s B_K B_Q
    assert bounds.spread_from_weights(w, w, 1.0, key_input_norm=0.0, scale=1e308) == 0.0
    got = bounds.spread_from_weights(w, w, 1.0, key_input_norm=1e-300, scale=1e308)
    assert 8e8 <= got <= 8e8 * (1 + 1e-12)
    got = bounds.spread_from_weights(w * 1e160, w * 1e160, 1e-100)
    assert 8e120 <= got <= 8e120 * (1 + 1e-12)
    assert bounds.spread_from_weights(w * 1e200, w * 1e200, 1.0) == math.inf  # 8e400


@pytest.mark.parametrize("shape", [(0, 0), (0, 3), (3, 0)])
def test_spread_from_weights_of_empty_matrices_is_zero(shape):
    z = np.zeros(shape)
    assert bounds.spread_from_weights(z, z, 1.0) == 0.0


def test_spread_from_weights_names_a_mismatched_input_norm():
    w = np.diag([2.0, 1.0])
    with pytest.raises(ValueError, match=r"input_norm of shape \(3,\) does not broadcast"):
        bounds.spread_from_weights(np.stack([w, w]), w, [1.0, 2.0, 3.0])


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: bounds.max_coefficient(2, 10**400), "spread=an integer of 401 digits lies beyond"),
        (lambda: bounds.max_coefficient(2, 1.0, Fraction(10**400)), r"beta=Fraction\("),
        (lambda: bounds.spread_from_norms(10**400, 1.0), "query_norm=an integer of 401 digits"),
        (lambda: bounds.spread_from_weights([[1.0]], [[1.0]], 10**400), "input_norm holds a value"),
        (lambda: bounds.adaptive_switch_off_size(10**400), "spread=an integer of 401 digits"),
        (lambda: bounds.max_coefficient(2, np.int64(-1)), "got -1$"),  # not np.int64(-1)
    ],
)
def test_arguments_beyond_the_float_range_are_named(call, message):
    # a bare OverflowError ("int too large to convert to float") named no argument
    with pytest.raises(ValueError, match=message):
        call()


def test_a_whole_fraction_is_a_size_of_any_magnitude():
    assert bounds.max_coefficient(Fraction(10**400), 1.0) == bounds.max_coefficient(10**400, 1.0)


def test_text_inside_an_object_array_is_refused_as_a_scalar_text_is():
    """'0.1' in an object array went through float() to the nearest float, another argument
    (a Decimal('0.1') is refused for that reason), and was answered for it."""
    with pytest.raises(TypeError, match=r"spread must be a real number, got the text '0\.1'"):
        bounds.max_coefficient(8, np.array(["0.1"], dtype=object))
    with pytest.raises(TypeError, match=r"eps must be a real number, got the text '0\.5'"):
        bounds.dispersion_size(np.array(["0.5"], dtype=object), 5.69)


def test_a_witness_prints_its_counts_exactly():
    """str() wrote 295893620344 as 2.95894e+11: a row of 295894000000 items, another row,
    which need not reach the level the witness reaches."""
    assert str(bounds.LevelRow((1.0, 0.0), (1, 1234567))) == "1 at 1.0, 1234567 at 0.0"
    w = bounds.adaptive_dispersion_bracket(1e-9, 5.69).witness
    assert str(w) == ", ".join(
        f"{c} at {lv!r}" for lv, c in zip(w.levels, w.counts, strict=True) if c
    )


@pytest.mark.parametrize("top", ["1e300", "2000000"])
def test_adaptive_sizes_refuse_a_polynomial_whose_beta_makes_them_too_long(top):
    """The spread's limit took beta_max = 2.5: Polynomial(("1e300",)) at spread 1 failed to
    converge (CertificationError) and Polynomial(("2000000",)) ran 515 s for a size of
    870,000 digits, where Constant of the same beta is refused at once."""
    schedule = Polynomial((top,))
    for f in (bounds.adaptive_dispersion_size, bounds.adaptive_dispersion_bracket):
        with pytest.raises(ValueError, match=r"spread = 1.0 is too large"):
            f(0.5, 1.0, schedule)
    with pytest.raises(ValueError, match=r"spread = 1.0 is too large"):
        bounds.adaptive_max_coefficient_bracket(10, 1.0, schedule)
