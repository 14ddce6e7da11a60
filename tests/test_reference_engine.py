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
from softmaxtheory.spec import Polynomial


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

    def flaky(mid, rel, fmt, extra=None):
        return None if next(refusals, False) else original(mid, rel, fmt, extra)

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
