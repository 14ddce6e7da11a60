"""The reference's arithmetic assumptions and its independence from mpmath's global state."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mpmath.libmp import from_float, mpf_exp, mpf_log, mpf_sub, round_nearest, to_float

from softmaxtheory import reference
from softmaxtheory.reference import PrecisionError, _engine, _fast
from softmaxtheory.spec import Constant, Polynomial


@settings(max_examples=200)
@given(
    x=st.floats(min_value=-800.0, max_value=0.0, allow_subnormal=True),
    p=st.sampled_from([60, 93, 120, 200, 400]),
)
def test_mpmath_exp_and_log_within_the_assumed_bound(x, p):
    """The error analysis assumes exp and log within KAPPA units of 2**-p (relative)."""
    fx = from_float(x)
    for fn, arg in ((mpf_exp, fx), (mpf_log, mpf_exp(fx, 2 * p + 64, round_nearest))):
        if fn is mpf_log and x == 0.0:
            continue
        approx = fn(arg, p, round_nearest)
        better = fn(arg, 2 * p + 64, round_nearest)
        err = mpf_sub(approx, better, 2 * p + 64, round_nearest)
        if better[1] == 0:
            assert approx[1] == 0
            continue
        rel = abs(to_float(err)) / abs(to_float(better)) if to_float(better) else 0.0
        if to_float(better) == 0.0:  # below float range: compare exponents instead
            rel = math.ldexp(1.0, (err[2] + err[3]) - (better[2] + better[3]) + 1) if err[1] else 0
        assert rel <= _engine.KAPPA * math.ldexp(1.0, -p) / 4  # two bits of margin left


def test_results_do_not_depend_on_mpmath_global_precision():
    rng = np.random.default_rng(11)
    x = rng.normal(size=(3, 50)) * 3
    want = reference.adaptive_softmax(x), reference.entropy(x), reference.beta(x)
    saved = mpmath.mp.prec
    try:
        for prec in (8, 53, 3000):
            mpmath.mp.prec = prec
            got = reference.adaptive_softmax(x), reference.entropy(x), reference.beta(x)
            for g, w in zip(got, want, strict=True):
                assert np.array_equal(g, w)
            assert mpmath.mp.prec == prec  # never changed behind the user's back
    finally:
        mpmath.mp.prec = saved


def _spy_precisions(monkeypatch):
    calls = []
    original = _engine.exp_pass
    # these tests watch the mpmath engine's Ziv loop: the fast first pass stays out
    monkeypatch.setitem(_fast._state, "enabled", False)

    def spy(row, beta, p, C, want_t):
        calls.append(p)
        return original(row, beta, p, C, want_t)

    monkeypatch.setattr(_engine, "exp_pass", spy)
    return calls


def test_ziv_loop_retries_at_higher_precision(monkeypatch):
    """When the rounding test refuses, the loop doubles p and the answer is unchanged."""
    from softmaxtheory.reference import _api

    x = np.array([0.0, math.log(3.0), -2.5])
    want = reference.softmax(x)
    calls = _spy_precisions(monkeypatch)
    refusals = iter([True, True])  # refuse the first two rounding tests
    original = _api.round_ball

    def flaky(mid, rel, fmt, extra=None, *, nonneg=False):
        return None if next(refusals, False) else original(mid, rel, fmt, extra, nonneg=nonneg)

    monkeypatch.setattr(_api, "round_ball", flaky)
    got = reference.softmax(x)
    assert np.array_equal(got, want)
    assert calls == [calls[0], 2 * calls[0], 4 * calls[0]]  # one attempt per refusal, doubling


def test_jump_decided_by_raising_precision(monkeypatch):
    """H = log 2 exactly against a threshold 1e-37 below it: decided only past 120 bits."""
    jump = Polynomial(("2",), "0.693147180559945309417232121458176568")  # < log 2
    calls = _spy_precisions(monkeypatch)
    assert float(reference.beta([0.0, 0.0], schedule=jump)) == 2.0
    assert max(calls) > 120
    above = Polynomial(("2",), "0.693147180559945309417232121458176569")  # > log 2
    assert float(reference.beta([0.0, 0.0], schedule=above)) == 1.0


def test_precision_error_when_a_jump_is_beyond_the_cap():
    """A threshold within 2**-1000 of the entropy: the oracle says so rather than guess."""
    with mpmath.workprec(1400):
        log2 = mpmath.nstr(mpmath.log(2), 400, strip_zeros=False)
    jump = Polynomial(("2",), log2)
    with pytest.raises(PrecisionError, match="could not certify the beta"):
        reference.beta([0.0, 0.0], schedule=jump)
    # a continuous schedule never needs the decision
    assert float(reference.beta([0.0, 0.0], schedule=Polynomial(("1",), log2))) == 1.0


def test_exact_zero_entropy_decides_a_jump_at_zero():
    # one item: H = 0 exactly, so "H > 0" is false without any precision issue
    assert float(reference.beta([5.0], schedule=Polynomial(("2",), "0"))) == 1.0
    # [0, -10000]: H = 10000 e**-10000 > 0, below every float, yet the jump is decided
    assert float(reference.beta([0.0, -10000.0], schedule=Polynomial(("2",), "0"))) == 2.0


ENTROPY_BELOW_THE_SUBNORMALS = [[0.0, -781.0, -903.0], [0.0, -781.0, -785.0], [0.0, -781.0, -790.0]]


@pytest.mark.parametrize("row", ENTROPY_BELOW_THE_SUBNORMALS)
def test_entropy_below_the_subnormals_with_dead_items(row):
    """An entropy near 2**-1116 whose dead items' mass (near 2**-1117) is as large as itself:
    the ball held zero at every precision and the reference raised PrecisionError. An entropy
    is >= 0, so a ball whose upper end rounds to 0 decides +0.0."""
    exact = reference.entropy_mp(row, prec=200)
    assert 0 < exact < mpmath.mpf(2) ** -1100
    for dtype in (np.float64, np.float32, np.float16):
        got = reference.entropy(row, dtype=dtype)
        assert got == 0.0 and not np.signbit(got)
    assert reference.StreamState.from_logits(row).entropy() == 0.0
    # the next row's entropy is a subnormal: still decided, not flushed to zero
    assert float(reference.entropy([0.0, -745.0, -903.0])) == 2.105e-321


def test_round_ball_decides_a_ball_around_zero_only_for_a_known_sign():
    from mpmath.libmp import from_man_exp

    from softmaxtheory._certify.rounding import round_ball
    from softmaxtheory._formats import FORMATS

    f64 = FORMATS["float64"]
    tiny = from_man_exp(1, -1117)  # the ball [-2**-1116, 3 * 2**-1117] holds zero
    assert round_ball(tiny, 0.0, f64, -1116) is None  # the sign of the zero is unknown
    assert round_ball(tiny, 0.0, f64, -1116, nonneg=True) == 0.0
    # an upper end at the least subnormal does not round to zero: undecided either way
    assert round_ball(from_man_exp(1, -1075), 0.0, f64, -1075, nonneg=True) is None
    assert round_ball(from_man_exp(-1, -1117), 0.0, f64, -1116, nonneg=True) is None


def _exact_adaptive(x, beta: mpmath.mpf) -> list[float]:
    from tests.support.independent import round_to

    with mpmath.workprec(400):
        xs = [mpmath.mpf(v) for v in x]
        m = max(xs)
        e = [mpmath.exp(beta * (v - m)) for v in xs]
        total = mpmath.fsum(e)
        return [round_to(v / total, np.float64) for v in e]


@pytest.mark.parametrize(
    ("x", "beta"),
    [
        ([1e308, -1e308], "1e-310"),  # beta |z| = 0.02: was [1, 0], the item taken as dead
        ([1e308, -1e308, 0.0, -1.7976931348623157e308], "3e-309"),
        ([1e308, -1e308], "1e-400"),  # beta is 0 as a float: was PrecisionError
        ([1.7976931348623157e308, -1.7976931348623157e308], "2.5e-307"),
        ([1e308, -1e308], "1e-300"),  # beta |z| = 2e8: the second item is negligible
    ],
)
def test_tiny_beta_times_an_overflowing_shift(x, beta):
    """A shift x_i - max beyond the float range with a β below the normal floats: the float
    product β|z| overflowed to inf or was NaN; it is now formed in mpmath."""
    from softmaxtheory.spec import Constant

    with mpmath.workprec(400):
        want = _exact_adaptive(x, mpmath.mpf(beta))
    got = reference.adaptive_softmax(x, schedule=Constant(beta))
    np.testing.assert_array_equal(got, want)
    state = reference.StreamState.from_logits(x)
    np.testing.assert_array_equal(state.normalize(x, schedule=Constant(beta)), want)


@pytest.mark.parametrize("row", [[0.0, -773.0, 0.0], [0.0, -700.053, -700.071, 0.0]])
def test_guard_that_cancels_the_maxima(row):
    """entropy_eps = 1/2 with two tied maxima: the maxima's terms vanish and H_eps is the
    tiny rest (about 2**-1010 to 2**-1115). H - G cancelled to exactly 0 at some precision,
    which the mpmath acceptor returned as a certified 0 (the value is positive); a float64
    result needed more than the 960 bits the loop allows and was refused. The form without
    the cancellation (reference/_guarded.py) certifies every format."""
    with mpmath.workprec(3000):
        xs = [mpmath.mpf(v) for v in row]
        e = [mpmath.exp(v) for v in xs]
        s = mpmath.fsum(e)
        exact = -mpmath.fsum(v / s * mpmath.log(v / s + mpmath.mpf(0.5)) for v in e)
        assert 0 < exact < mpmath.mpf(2) ** -1000
    from tests.support.independent import round_to

    got = reference.entropy_mp(row, entropy_eps=0.5)
    assert abs(got - exact) <= mpmath.mpf(2) ** -113 * exact
    for dtype in (np.float64, np.float32, np.float16):
        want = round_to(exact, dtype)
        assert reference.entropy(row, entropy_eps=0.5, dtype=dtype) == want


def _guarded_two_item_entropy() -> mpmath.mpf:
    with mpmath.workprec(400):
        e = [mpmath.mpf(1), mpmath.exp(-1)]
        p = [ei / sum(e) for ei in e]
        return -sum(pi * mpmath.log(pi + 1) for pi in p)  # eps = 1: -0.4652...


@pytest.mark.parametrize(("side", "beta"), [(1, 1.0), (-1, 3.0)])
def test_a_jump_below_zero_is_decided_for_a_guarded_entropy(side, beta):
    # with eps = 1 the row [0, -1] has H = -0.465...; theta 1e-60 above it (H <= theta: beta 1)
    # or below it (beta = P = 3). Read as continuous, beta was 3 on both sides
    from softmaxtheory.reference.streaming import StreamState

    h = _guarded_two_item_entropy()
    with mpmath.workprec(400):
        theta = mpmath.nstr(h + side * mpmath.mpf(10) ** -60, 80)
    sched = Polynomial(("3",), threshold=theta)
    x = np.array([0.0, -1.0])
    want = reference.softmax(beta * x)
    assert float(reference.beta(x, schedule=sched, entropy_eps=1.0)) == beta
    np.testing.assert_array_equal(
        reference.adaptive_softmax(x, schedule=sched, entropy_eps=1.0), want
    )
    state = StreamState.from_logits(x[:1]) + StreamState.from_logits(x[1:])
    assert state.beta(schedule=sched, entropy_eps=1.0) == beta
    out = reference.adaptive_attention(
        np.array([[1.0]]), np.array([[0.0], [-1.0]]), np.array([[1.0], [0.0]]),
        scale=1.0, schedule=sched, entropy_eps=1.0,
    )  # fmt: skip
    assert out[0, 0] == want[0]


@pytest.mark.parametrize(
    ("row", "eps", "negative"),
    [
        ([0.0, -720.0], 5e-324, False),  # H = +1.5e-310
        ([-1.0, -1e5], 5e-324, True),  # H = -4.9e-324
        ([0.0, -720.0], 2.0**-1000, True),  # H = -9.3e-302
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_a_tiny_guarded_entropy_rounds_to_a_zero_of_its_sign(row, eps, negative, dtype):
    # the narrow format's dead-item cut-off (about 702 nats) left the sign of a value far
    # below its subnormals undecided at every precision: PrecisionError
    from softmaxtheory.reference.streaming import StreamState

    with mpmath.workprec(3000):
        x = [mpmath.mpf(v) for v in row]
        e = [mpmath.exp(v - max(x)) for v in x]
        p = [ei / sum(e) for ei in e]
        exact = -sum(pi * mpmath.log(pi + mpmath.mpf(eps)) for pi in p)
    assert (exact < 0) is negative
    got = reference.entropy(np.array(row), entropy_eps=eps, dtype=dtype)
    assert got == 0.0 and bool(np.signbit(got)) is negative
    state = StreamState.from_logits(np.array(row))
    h = state.entropy(entropy_eps=eps, dtype=dtype)
    assert h == 0.0 and math.copysign(1.0, h) == (-1.0 if negative else 1.0)


TIE16 = "1.00048828125"  # 1 + 2**-11: the float16 midpoint of 1 and 1 + 2**-10
TIE64 = "1.00000000000000011102230246251565404236316680908203125"  # 1 + 2**-53


@pytest.mark.parametrize(
    ("coefficients", "threshold", "row", "dtype"),
    [
        ((TIE16,), "-1", [0.0, 1.0], np.float16),
        (("0", "0", TIE16), "-1", [0.0, 1.0], np.float16),
        ((TIE64,), "-1", [0.0, 1.0], np.float64),
        ((TIE64,), "0.5", [0.0, 1.0], np.float64),
        (("3", TIE64), "-1", [2.5], np.float64),  # one item: H = 0, P(0) the tie
    ],
)
def test_a_polynomial_whose_beta_is_a_rounding_tie_rounds_to_even(
    coefficients, threshold, row, dtype
):
    # a Horner bound is never 0, so an exact tie raised PrecisionError; ties go to even (1)
    sched = Polynomial(coefficients, threshold=threshold)
    assert float(reference.beta(np.array(row), schedule=sched, dtype=dtype)) == 1.0
    want = reference.adaptive_softmax(
        np.array(row), schedule=Constant(coefficients[-1]), dtype=dtype
    )
    got = reference.adaptive_softmax(np.array(row), schedule=sched, dtype=dtype)
    np.testing.assert_array_equal(got, want)


def test_a_subnormal_entropy_near_a_midpoint_is_decided():
    """The dead items' mass was dropped with a cutoff that, for float64 (-qmin = 1074 above
    every precision), never grew: an entropy 23142.4999... subnormal ulps raised
    PrecisionError at 960 bits. A retry now drops only what lies p bits further down."""
    from softmaxtheory import reference

    row = [0.0, -741.0, -753.2491177425314, -783.2750544017315]
    with mpmath.workprec(4000):
        x = [mpmath.mpf(v) for v in row]
        w = [mpmath.exp(v) for v in x]
        s = mpmath.fsum(w)
        exact = -mpmath.fsum(wi / s * (xi - mpmath.log(s)) for wi, xi in zip(w, x, strict=True))
        ulps = exact / mpmath.mpf(2) ** -1074
        assert 23142.4999 < ulps < 23142.5
    assert reference.entropy(row) == 23142 * 2.0**-1074


def test_integers_float64_does_not_hold_are_refused_not_rounded():
    """[2**53 + 1, 2**53] was softmaxed as [2**53, 2**53]: 0.5 each, for 0.731 and 0.269."""
    from softmaxtheory import reference

    with pytest.raises(ValueError, match="9007199254740993, which float64 cannot hold"):
        reference.softmax(np.array([2**53 + 1, 2**53]))
    with pytest.raises(ValueError, match="cannot hold"):
        reference.StreamState.from_logits(np.array([2**60 + 1], dtype=np.int64))
    held = np.array([2**60, 2**60 - 2**8, -(2**63)])
    assert np.array_equal(reference.softmax(held), reference.softmax(held.astype(np.float64)))
