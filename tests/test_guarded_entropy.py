"""The guarded entropy near its zeros, where H - G cancels: relative accuracy and sign.

``reference/_guarded.py`` evaluates :math:`H_\\varepsilon` in a form without the
cancellation of :math:`H - G`. These rows needed more than 960 bits (PrecisionError on
normal float64 values) or rounded a zero midpoint to ``+0.0`` where the value is
negative; each is checked against a direct evaluation at 6000 bits.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from softmaxtheory import reference
from softmaxtheory.reference import StreamState
from tests.support.independent import round_to

DTYPES = (np.float64, np.float32, np.float16)


def _exact(row, eps: float) -> mpmath.mpf:
    with mpmath.workprec(6000):
        xs = [mpmath.mpf(float(v)) for v in row]
        m = max(xs)
        e = [mpmath.exp(v - m) for v in xs]
        s = mpmath.fsum(e)
        return -mpmath.fsum((v / s) * mpmath.log(v / s + mpmath.mpf(eps)) for v in e)


def _same(got: float, want: float) -> bool:
    return got == want and math.copysign(1.0, got) == math.copysign(1.0, want)


def _check(row, eps: float) -> None:
    exact = _exact(row, eps)
    state = StreamState.from_logits(np.array(row))
    for dtype in DTYPES:
        want = round_to(exact, dtype)
        got = float(reference.entropy(row, entropy_eps=eps, dtype=dtype))
        assert _same(got, want), (row, eps, dtype, got, mpmath.nstr(exact, 8))
        h = state.entropy(entropy_eps=eps, dtype=dtype)
        assert _same(h, want), ("stream", row, eps, dtype, h)


@pytest.mark.parametrize(
    ("row", "eps", "value"),
    [
        ([0.0, -1e-10], 0.5, "-9.375e-22"),  # float16 gave +0.0
        ([0.0, -1e-44], 0.5, "-9.375e-90"),  # float32 gave +0.0
        ([0.0, -1e-140], 0.5, "-9.375e-282"),  # PrecisionError
        ([0.0, 0.0, -634.0], 0.5, "2.70995760654700e-276"),  # PrecisionError
        ([0.0, -773.0, 0.0], 0.5, "1.16419564016542e-336"),  # PrecisionError (documented)
        ([0.0, -5e-324], 0.5, "-2.28838345196389e-648"),  # a zero of the right sign
    ],
)
def test_rows_where_h_minus_g_cancelled(row, eps, value):
    exact = _exact(row, eps)
    assert mpmath.almosteq(exact, mpmath.mpf(value), rel_eps=1e-12)
    _check(row, eps)


def test_mp_value_keeps_its_relative_accuracy():
    exact = _exact([0.0, -1e-140], 0.5)
    got = reference.entropy_mp([0.0, -1e-140], entropy_eps=0.5, prec=113)
    assert abs(got - exact) <= mpmath.mpf(2) ** -113 * abs(exact)


_gaps = st.floats(min_value=5e-324, max_value=1e-3, allow_subnormal=True)


@st.composite
def _near_zero_rows(draw) -> tuple[list[float], float]:
    """Rows of near-tied items with the guard that makes H_eps vanish at the tie."""
    n = draw(st.sampled_from([2, 4, 8, 3]))  # 1 - 1/3 is inexact: then a near miss
    row = [0.0] + [-draw(_gaps) for _ in range(n - 1)]
    far = st.floats(min_value=600.0, max_value=1e5)
    row += [-draw(far) for _ in range(draw(st.integers(0, 2)))]
    order = draw(st.permutations(range(len(row))))
    return [row[i] for i in order], 1.0 - 1.0 / n


@settings(max_examples=40, deadline=None)
@given(case=_near_zero_rows())
@example(case=([0.0, -1e-300, -2e-300], 1 / 3))
@example(case=([0.0, -1e-300, -700.0], 0.5))
@example(case=([-3e-200, 0.0, -1e-250, -1e-310], 0.75))
def test_near_tied_rows_are_correctly_rounded_with_their_sign(case):
    row, eps = case
    _check(row, eps)


def _tie_beside_a_far_item(a: float) -> mpmath.mpf:
    """H_eps of (0, 0, -a) at eps = 1/2 in closed form (log1p keeps the e**-a terms)."""
    with mpmath.workprec(200):
        delta = mpmath.exp(-mpmath.mpf(a))
        s = 2 + delta
        maxima = -2 / s * mpmath.log1p(-delta / (4 + 2 * delta))
        return maxima - delta / s * mpmath.log(delta / s + mpmath.mpf(0.5))


@pytest.mark.parametrize("a", [1e5, 3e6, 1e308])
def test_tied_maxima_beside_a_far_item(a):
    # the maxima's d = -q e**-a / s: an exact 1 + d had 1.44 a bits (a hang at 3e6, an
    # OverflowError at 1e308); eps / p_i for the far item likewise in H - G (entropy_mp)
    row = [0.0, 0.0, -a]
    exact = _tie_beside_a_far_item(a)
    assert exact > 0
    for dtype in DTYPES:
        got = reference.entropy(row, entropy_eps=0.5, dtype=dtype)
        assert got == 0.0 and not np.signbit(got)
    got = reference.entropy_mp(row, entropy_eps=0.5, prec=53)
    assert abs(got - exact) <= mpmath.mpf(2) ** -53 * exact
    state = StreamState.from_logits(np.array(row[:2])) + StreamState.from_logits(np.array(row[2:]))
    assert state.entropy(entropy_eps=0.5) == 0.0
    two = reference.entropy_mp([0.0, -a], entropy_eps=0.5, prec=53)
    assert mpmath.almosteq(two, -mpmath.log(1.5), rel_eps=2.0**-50)
