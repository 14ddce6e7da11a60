"""The certified attention oracle (reference.adaptive_attention)."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from softmaxtheory.reference import adaptive_attention, adaptive_softmax
from softmaxtheory.spec import Constant, PaperPolynomial
from tests.support.independent import PAPER, round_to


def naive_attention(q, k, v, keep, add, scale, adaptive=True, prec=3000):
    """Independent per-row evaluation with plain mpmath formulas."""
    L, S, dv = q.shape[0], k.shape[0], v.shape[1]
    out = []
    with mpmath.workprec(prec):
        for i in range(L):
            xs = []
            for j in range(S):
                if not keep[i, j] or add[i, j] == -np.inf:
                    xs.append(None)
                    continue
                terms = zip(q[i], k[j], strict=True)
                dot = mpmath.fsum(mpmath.mpf(float(a)) * mpmath.mpf(float(b)) for a, b in terms)
                xs.append(dot * mpmath.mpf(scale) + mpmath.mpf(float(add[i, j])))
            live = [x for x in xs if x is not None]
            if not live:
                out.append([0.0] * dv)
                continue
            m = max(live)
            e = [mpmath.exp(x - m) if x is not None else mpmath.mpf(0) for x in xs]
            s = mpmath.fsum(e)
            p = [ei / s for ei in e]
            beta = mpmath.mpf(1)
            if adaptive:
                H = -mpmath.fsum(pi * mpmath.log(pi) for pi in p if pi != 0)
                if H > mpmath.mpf("0.5"):
                    P = mpmath.mpf(0)
                    for c in PAPER:
                        P = P * H + mpmath.mpf(c.numerator) / c.denominator
                    beta = max(P, mpmath.mpf(1))
            ea = [mpmath.exp(beta * (x - m)) if x is not None else mpmath.mpf(0) for x in xs]
            sa = mpmath.fsum(ea)
            out.append(
                [
                    mpmath.fsum(ea[j] / sa * mpmath.mpf(float(v[j, c])) for j in range(S))
                    for c in range(dv)
                ]
            )
    return out


def _check(q, k, v, keep, add, scale, dtype=np.float64, **kw):
    mask = None
    if not keep.all():
        mask = keep
    elif np.any(add != 0):
        mask = add
    got = adaptive_attention(q, k, v, mask=mask, scale=scale, dtype=dtype, **kw)
    want = naive_attention(q, k, v, keep, add, scale, adaptive="schedule" not in kw)
    for i, row in enumerate(want):
        assert got[i].tolist() == [
            round_to(val, dtype) if not isinstance(val, float) else val for val in row
        ], i


arrays = st.integers(min_value=0, max_value=2**32 - 1).map(np.random.default_rng)


@settings(max_examples=25)
@given(
    rng=arrays,
    L=st.integers(1, 4),
    S=st.integers(1, 6),
    d=st.integers(1, 4),
    spread=st.sampled_from([0.5, 3.0, 20.0]),
    masked=st.booleans(),
)
@example(rng=np.random.default_rng(0), L=2, S=5, d=3, spread=3.0, masked=True)
def test_matches_independent_evaluation(rng, L, S, d, spread, masked):
    q = rng.normal(size=(L, d)) * spread
    k = rng.normal(size=(S, d))
    v = rng.normal(size=(S, 2))
    keep = rng.random((L, S)) > 0.3 if masked else np.ones((L, S), dtype=bool)
    _check(q, k, v, keep, np.zeros((L, S)), 1.0 / math.sqrt(d))


def test_float32_output_and_additive_mask():
    rng = np.random.default_rng(3)
    q, k, v = rng.normal(size=(3, 4)) * 4, rng.normal(size=(6, 4)), rng.normal(size=(6, 3))
    add = rng.normal(size=(3, 6))
    add[0, 2] = -np.inf
    _check(q, k, v, np.ones((3, 6), dtype=bool), add, 0.5, dtype=np.float32)


def test_plain_attention_with_constant_one():
    rng = np.random.default_rng(4)
    q, k, v = rng.normal(size=(3, 2)) * 5, rng.normal(size=(5, 2)), rng.normal(size=(5, 2))
    _check(q, k, v, np.ones((3, 5), dtype=bool), np.zeros((3, 5)), 1.0, schedule=Constant(1))


def test_identity_values_give_the_adaptive_softmax():
    rng = np.random.default_rng(5)
    q = rng.integers(-4, 5, size=(4, 3)).astype(float)
    k = rng.integers(-4, 5, size=(7, 3)).astype(float)
    logits = q @ k.T  # exact: small integers
    out = adaptive_attention(q, k, np.eye(7), scale=1.0)
    assert np.array_equal(out, adaptive_softmax(logits))


def test_causal_mask_top_left():
    rng = np.random.default_rng(6)
    q, k, v = rng.normal(size=(4, 2)), rng.normal(size=(4, 2)), rng.normal(size=(4, 2))
    out = adaptive_attention(q, k, v, is_causal=True)
    assert np.array_equal(out[0], v[0])  # the first query sees only the first key
    keep = np.tril(np.ones((4, 4), dtype=bool))
    assert np.array_equal(out, adaptive_attention(q, k, v, mask=keep))


def test_special_rows():
    q = np.array([[1.0, 0.0], [np.nan, 0.0], [0.0, 1.0]])
    k = np.array([[1.0, 0.0], [0.0, 1.0]])
    v = np.array([[1.0, 2.0], [3.0, 4.0]])
    keep = np.array([[True, True], [True, True], [False, False]])
    out = adaptive_attention(q, k, v, mask=keep)
    assert np.all(np.isnan(out[1]))
    assert out[2].tolist() == [0.0, 0.0]  # fully masked query: zeros
    assert np.all(np.isfinite(out[0]))
    # non-finite values propagate like IEEE arithmetic with positive weights
    v2 = np.array([[np.inf, np.nan], [1.0, -np.inf]])
    out2 = adaptive_attention(q[:1], k, v2)
    assert out2[0, 0] == np.inf and np.isnan(out2[0, 1])
    # a masked key's non-finite value does not matter
    out3 = adaptive_attention(q[:1], k, v2, mask=np.array([[False, True]]))
    assert out3[0].tolist() == [1.0, -np.inf]


def test_exact_zero_output():
    q = np.array([[1.0, 1.0]])
    k = np.array([[1.0, 0.0], [0.0, 1.0]])  # tied logits
    v = np.array([[1.0], [-1.0]])
    assert adaptive_attention(q, k, v).tolist() == [[0.0]]


def test_broadcast_leading_dimensions():
    rng = np.random.default_rng(7)
    q = rng.normal(size=(2, 3, 3, 4))
    k = rng.normal(size=(1, 3, 5, 4))
    v = rng.normal(size=(2, 1, 5, 2))
    out = adaptive_attention(q, k, v)
    assert out.shape == (2, 3, 3, 2)
    assert np.array_equal(out[1, 2], adaptive_attention(q[1, 2], k[0, 2], v[1, 0]))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"q": np.zeros(3)}, ValueError, "q must have shape"),
        ({"k": np.zeros((5, 3))}, ValueError, "feature size"),
        ({"v": np.zeros((4, 2))}, ValueError, "key length"),
        ({"q": np.zeros((2, 4), dtype=complex)}, TypeError, "q must be a real"),
        ({"mask": np.zeros((2, 5), dtype=bool), "is_causal": True}, ValueError, "not both"),
        ({"mask": np.zeros((3, 3))}, ValueError, "does not broadcast"),
        ({"mask": np.array([["a"] * 5] * 2)}, TypeError, "mask must be boolean"),
        ({"scale": math.nan}, ValueError, "scale must be finite"),
        ({"scale": "1"}, TypeError, "scale must be a float"),
    ],
)
def test_errors_name_the_argument(kwargs, error, match):
    args = {"q": np.zeros((2, 4)), "k": np.zeros((5, 4)), "v": np.zeros((5, 2))}
    opts = {key: kwargs.pop(key) for key in list(kwargs) if key not in args}
    args.update(kwargs)
    with pytest.raises(error, match=match):
        adaptive_attention(args["q"], args["k"], args["v"], **opts)


@pytest.mark.parametrize(
    ("q", "k", "v", "want"),
    [
        # equal weights: the mean 1 + 2**-53 is a rounding tie (to even: 1.0)
        ([[0.0]], [[0.0], [0.0]], [[1.0], [1.0 + 2.0**-52]], [[1.0]]),
        # -2**-1075, half the least subnormal: rounds to -0.0
        ([[0.0]], [[0.0], [0.0]], [[0.0], [-5e-324]], [[-0.0]]),
        # two tie groups of different weight, each of mean 1 + 2**-53
        (
            [[1.0]],
            [[1.0], [0.0], [1.0], [0.0]],
            [[1.0], [1 + 2.0**-52], [1 + 2.0**-52], [1.0]],
            [[1.0]],
        ),
        # a column with one mean, another without: each certified its own way
        ([[0.0]], [[0.0], [0.0]], [[1.0, 2.0], [1.0 + 2.0**-52, 3.0]], [[1.0, 2.5]]),
    ],
)
def test_outputs_on_a_rounding_tie_are_rounded_exactly(q, k, v, want) -> None:
    """These raised PrecisionError (found by the fuzz test): no error ball decides a tie.

    When every group of equal logits has the same mean value, the output is that
    mean exactly, whatever the coefficients; it is rounded exactly.
    """
    got = adaptive_attention(np.array(q), np.array(k), np.array(v))
    np.testing.assert_array_equal(got, np.array(want))
    assert np.signbit(got).tolist() == np.signbit(np.array(want)).tolist()


def test_a_column_of_tiny_values_is_certified_beside_a_column_of_huge_ones() -> None:
    """Raised PrecisionError (found by the fuzz test): the dead items' error bound used the
    largest value of every column, so a column of tiny values, whose output rounds to a
    signed zero, could never be decided. Each column now uses its own bound."""
    q = np.array([[35.861847, 31.992689]])
    k = np.array([[0.0, 0.0], [0.0, -6.9620767], [-745.0, -11.121573]])
    v = np.array([[31.99, 4.06e16, 0.0], [35.86, 31.99, -6.44e-270], [-4.06e16, 1e300, -3.7e-222]])
    got = adaptive_attention(q, k, v)
    for c in range(3):
        np.testing.assert_array_equal(got[:, c], adaptive_attention(q, k, v[:, c : c + 1])[:, 0])
    assert got[0, 2] == 0.0 and np.signbit(got[0, 2])


@pytest.mark.parametrize("top", [2.0**53, 2.0**53 + 2, 2.0**1000])
def test_subnormal_logit_differences_next_to_a_rounding_midpoint(top):
    """Keys 0 and 5e-324 give logits 0 and about 3.5e-324, weights 1/2 -+ 1e-324: the output
    lies within 1e-309 of a rounding midpoint (for values 2**53 and 1). 960 bits left it
    undecided (PrecisionError); attention outputs now get up to 8192 bits (1520 decide).
    Checked against the sum evaluated by mpmath at 4000 bits and rounded once."""
    from softmaxtheory.reference import ATTENTION_MAX_PRECISION

    assert ATTENTION_MAX_PRECISION >= 4096
    q = np.array([[0.0, 1.0]])
    k = np.array([[0.0, 0.0], [0.0, 5e-324]])
    v = np.array([[top], [1.0]])
    got = adaptive_attention(q, k, v, schedule=Constant(1))
    scale = 1.0 / math.sqrt(2.0)
    with mpmath.workprec(4000):
        x = mpmath.mpf(scale) * mpmath.mpf(5e-324)  # the exact logit of key 1
        p1 = mpmath.exp(x) / (1 + mpmath.exp(x))
        want = (1 - p1) * mpmath.mpf(top) + p1
    assert float(got[0, 0]) == float(want)


@settings(max_examples=30, deadline=None)
@given(
    gap=st.integers(600, 1400),
    ulps=st.integers(0, 2**20),
    w=st.sampled_from([0.0, 0.5, 2.0, -1.0, 3.0]),
    schedule=st.sampled_from([Constant(1), Constant(2), PaperPolynomial()]),
)
@example(gap=1090, ulps=0, w=2.0, schedule=Constant(1))  # returned 1.0; exact 1 + 2**-52
def test_a_far_key_next_to_a_tied_midpoint(gap, ulps, w, schedule):
    """Two tied keys whose values average to a float64 rounding midpoint, and a third key
    `gap` nats below them: the output is the midpoint moved by about e**-gap, which decides
    its rounding. Past about 1074 bits the engine's float error bounds underflowed to 0 and
    Ziv's test accepted the midpoint itself (1.0 where the exact output rounds up). Above
    960 bits the outputs now come from interval arithmetic; checked against mpmath at 6000."""
    a = 1.0 + ulps * 2.0**-52
    b = a + 2.0**-52
    q = np.array([[1.0]])
    k = np.array([[float(gap)], [float(gap)], [0.0]])
    v = np.array([[a], [b], [w]])
    got = adaptive_attention(q, k, v, scale=1.0, schedule=schedule)[0, 0]
    with mpmath.workprec(6000):
        x = [mpmath.mpf(gap), mpmath.mpf(gap), mpmath.mpf(0)]
        m = max(x)
        e = [mpmath.exp(xi - m) for xi in x]
        s = mpmath.fsum(e)
        h = mpmath.log(s) - mpmath.fsum(ei * (xi - m) for ei, xi in zip(e, x, strict=True)) / s
        if isinstance(schedule, Constant):
            beta = mpmath.mpf(schedule.exact_beta.numerator) / schedule.exact_beta.denominator
        else:  # H is log 2 within e**-600, where the paper's polynomial is 0.66: beta = 1
            poly = mpmath.polyval([mpmath.mpf(c.numerator) / c.denominator
                                   for c in schedule.exact_coefficients], h)  # fmt: skip
            assert h > 0.5 and poly < 0.7
            beta = mpmath.mpf(1)
        wts = [mpmath.exp(beta * (xi - m)) for xi in x]
        want = mpmath.fsum(wi * mpmath.mpf(vi) for wi, vi in zip(wts, (a, b, w), strict=True))
        want /= mpmath.fsum(wts)
    assert got == float(want)


@pytest.mark.parametrize(
    ("k1", "v", "want"),
    [
        # 1.5 tanh(d/2) = 0.75 d - d**3/16 + ...: 0.75 d is a midpoint, the value just below
        (-(2**52 + 1) * 2.0**-852, 1.5, 1.1247726104217234e-241),
        # 2**-1075 - 5e-972: below half the least subnormal, so +0.0 (and -0.0 mirrored)
        (-5e-324, 1.0, 0.0),
        (5e-324, 1.0, -0.0),
    ],
)
@pytest.mark.parametrize("schedule", [Constant(1), PaperPolynomial()], ids=repr)
def test_an_output_a_thousand_bits_off_a_midpoint_needs_a_rigorous_exponential(
    k1, v, want, schedule
):
    """Keys 0 and a logit gap below 2**-760, values +-v: deciding the output takes more than
    960 bits, so it comes from interval arithmetic, whose exponential came from mpmath's
    interval context. That rounds its own approximation outward: at 1520 bits the point
    -2**-1074 maps to the point 1 - 2**-1074, which misses e**(-2**-1074), and the output
    was rounded to the far side of the midpoint (one ulp off; 5e-324 for +0.0). The
    exponential and logarithm are now widened. The values were checked with mpmath at 8000
    bits (the series in the first comment)."""
    q = np.array([[1.0]])
    k = np.array([[0.0], [k1]])
    got = adaptive_attention(q, k, np.array([[v], [-v]]), scale=1.0, schedule=schedule)[0, 0]
    assert got == want and math.copysign(1.0, got) == math.copysign(1.0, want), repr(got)
    with mpmath.workprec(8000):  # the exact output: v tanh(-k1 / 2)
        exact = mpmath.mpf(v) * mpmath.tanh(-mpmath.mpf(k1) / 2)
        assert float(exact) == want


@pytest.mark.parametrize("gap", [5000.0, 1e6, 1e300])
@pytest.mark.parametrize("ulps", [0, 1, 12345])
def test_a_key_too_far_for_any_precision_still_decides_a_tied_midpoint(gap, ulps):
    """The same midpoint moved by e**-gap, far beyond any working precision: the output is
    the midpoint plus a term of the sign of w - midpoint, so it rounds up for w above it and
    down below it; without the far key it is the midpoint itself (a tie: nearest even). The
    tied group's own term is exactly zero, so interval arithmetic at 1536 bits gets the sign
    (before: PrecisionError at 8192 bits)."""
    a = 1.0 + ulps * 2.0**-52
    b = a + 2.0**-52
    even = a if ulps % 2 == 0 else b
    q = np.array([[1.0]])
    for w, want in ((a + 1.0, b), (a - 1.0, a)):
        k = np.array([[gap], [gap], [0.0]])
        v = np.array([[a], [b], [w]])
        assert adaptive_attention(q, k, v, scale=1.0, schedule=Constant(1))[0, 0] == want
    two = adaptive_attention(q, np.array([[gap], [gap]]), np.array([[a], [b]]), scale=1.0)
    assert two[0, 0] == even


@pytest.mark.parametrize("far", [1e19, 1e308])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_a_key_beyond_1e18_nats_below_rounds_instead_of_overflowing(far, dtype):
    # column 1 (about 5e-324) is undecided in float bounds, so the row went to the interval
    # path, where column 0's end e**-far was shifted by its exponent: MemoryError at 1e19,
    # OverflowError ("too many digits in integer") at 1e308
    q, k = np.array([[1.0]]), np.array([[-far], [0.0]])
    v = np.array([[1.0, 1.0], [0.0, 5e-324]])
    out = adaptive_attention(q, k, v, scale=1.0, schedule=Constant(1), dtype=dtype)
    assert out.dtype == dtype and out.tolist() == [[0.0, 0.0]]
    wide = adaptive_attention(q, k, v, scale=1.0, schedule=Constant(1))
    assert wide.tolist() == [[0.0, 5e-324]]


@pytest.mark.parametrize(
    ("keys", "values", "negative"),
    [
        ([0.0, -800.0], [0.0, -1.0], True),  # -3.7e-348: -0.0 (was +0.0)
        ([0.0, -2000.0], [0.0, -1.0], True),
        ([0.0, -760.0], [0.0, -1.0], True),  # above the dead-item cut-off: it was right
        ([0.0, -800.0, -900.0], [0.0, -1.0, 1.0], True),  # the nearer key's sign wins
        ([0.0, -900.0, -800.0], [0.0, -1.0, 1.0], False),
        ([0.0, -800.0, -800.0], [0.0, -1.0, 1.0], False),  # exactly 0: +0.0
        ([0.0, -800.0], [0.0, 1.0], False),
    ],
)
def test_an_output_below_the_subnormals_keeps_the_sign_of_its_dead_keys(keys, values, negative):
    # the live keys' values are all 0, so the output is the dead keys' sum alone
    q, k, v = np.array([[1.0]]), np.array(keys)[:, None], np.array(values)[:, None]
    for dtype in (np.float64, np.float32):
        out = adaptive_attention(q, k, v, scale=1.0, schedule=Constant(1), dtype=dtype)
        assert out[0, 0] == 0.0 and bool(np.signbit(out[0, 0])) is negative


def test_loglength_outputs_known_exactly_are_returned():
    """With LogLength, beta = s log n makes a key z below the maximum weigh n**(s z): for an
    integer s z every weight is rational, and an output can be exactly 0 or exactly a rounding
    tie with no tied keys to show it. Both raised PrecisionError after 8192 bits."""
    from softmaxtheory.spec import LogLength
    from softmaxtheory.testing import assert_attention_close

    q, k = np.array([[1.0]]), np.array([[0.0], [-1.0]])
    v = np.array([[1.0], [-2.0]])  # weights 2/3 and 1/3: 2/3 - 2/3 = 0
    for dtype in ("float64", "float32", "float16"):
        got = adaptive_attention(q, k, v, scale=1.0, schedule=LogLength(1), dtype=dtype)
        assert got.tolist() == [[0.0]] and math.copysign(1.0, got[0, 0]) == 1.0
    assert assert_attention_close(
        np.array([[0.0]]), (np.array([[0.0, -1.0]]), v), schedule=LogLength(1)
    ).passed
    # n = 4, beta = log 4, keys 0, 0, -1/2, -1/2 weigh 1, 1, 1/2, 1/2: the output is exactly
    # 1 + 2**-53, half-way between 1 and its successor, so it rounds to even, 1.0
    e = 2.0**-53
    v = np.array([[1 + 4 * e], [1 - e], [1.0], [1.0]])
    k = np.array([[0.0], [0.0], [-0.5], [-0.5]])
    assert adaptive_attention(q, k, v, scale=1.0, schedule=LogLength(1)).tolist() == [[1.0]]
    v[0, 0] = 1 + 6 * e  # now 1 + 1.5 * 2**-53: above the tie
    assert adaptive_attention(q, k, v, scale=1.0, schedule=LogLength(1)).tolist() == [[1 + 2 * e]]
    # s = 1/2 with n = 4: beta z = log 2 * z, weights 2**z, rational for integer z too
    k = np.array([[0.0], [-1.0], [-3.0], [-2.0]])
    v = np.array([[1.0], [2.0], [8.0], [-12.0]])  # 1 + 1 + 1 - 3 = 0
    assert adaptive_attention(q, k, v, scale=1.0, schedule=LogLength("0.5")).tolist() == [[0.0]]


def test_loglength_coefficients_at_an_exact_tie_are_returned():
    """The row functions had no exact path: a LogLength coefficient that is exactly a rounding
    tie raised PrecisionError in reference.adaptive_softmax, StreamState.normalize and the
    oracle (which then refused a correct kernel). Each coefficient is now the fraction
    n**(s z) / sum rounded once; here it is checked against CPython's own correctly rounded
    int / int."""
    from fractions import Fraction

    from softmaxtheory import reference
    from softmaxtheory.accelerated import cpu
    from softmaxtheory.spec import LogLength
    from softmaxtheory.testing import assert_adaptive_softmax_close

    schedule = LogLength("0.5")  # beta z = log(sqrt(n)) z: weights 6**z at n = 36, 10**z at 100
    # 36 items: the last weighs 6**7 = 2187 (12 bits) against a sum of 8192, a float16 tie
    x16 = np.repeat(np.arange(8.0), [4, 0, 3, 0, 5, 8, 15, 1])
    got = reference.adaptive_softmax(x16, schedule=schedule, dtype=np.float16)
    assert got[-1] == np.float16(0.26708984375)  # 2187/8192 to even; 0.26723... the other way
    v = np.zeros((36, 1))
    v[-1] = 1.0
    att = adaptive_attention(np.ones((1, 1)), x16[:, None], v, scale=1.0, schedule=schedule,
                             dtype=np.float16)  # fmt: skip
    assert att[0, 0] == got[-1]
    # 100 items: the last weighs 10**23 = 5**23 * 2**23 over a sum that makes it a float64 tie
    x64 = np.repeat(np.arange(24.0), [4, 4, 5, 6, 7, 6, 3, 9, 2, 7, 5, 6, 3, 0, 9, 4, 5, 4,
                                      1, 3, 2, 2, 0, 3])  # fmt: skip
    weights = [10 ** int(z) for z in x64]
    total = sum(weights)
    assert Fraction(weights[-1], total).denominator == 2**55
    want = np.array([w / total for w in weights])  # CPython: int / int, correctly rounded
    got = reference.adaptive_softmax(x64, schedule=schedule)
    np.testing.assert_array_equal(got, want)
    assert got[-1] == 0.33087224502121104
    state = reference.StreamState.from_logits(x64)
    np.testing.assert_array_equal(state.normalize(x64, schedule=schedule), want)
    kernel = cpu.adaptive_softmax(x64, schedule=schedule)
    assert assert_adaptive_softmax_close(kernel, x64, schedule=schedule).passed
    # masked items keep 0, and the exact path covers rows with -inf entries
    xm = np.concatenate([x64, [-np.inf, -np.inf]])
    np.testing.assert_array_equal(
        reference.adaptive_softmax(xm, schedule=schedule), np.concatenate([want, [0.0, 0.0]])
    )


def test_integer_operands_float64_cannot_hold_are_refused():
    """They were rounded: keys 2**53 + 1 and 2**53 (logits 1 apart) gave 0.5 for
    e / (1 + e); the row functions refuse such logits, whose exact value they use."""
    q, v = np.array([[1]]), np.array([[1.0], [0.0]])
    k = np.array([[2**53 + 1], [2**53]])
    for name, args in (("k", (q, k, v)), ("q", (k.T, q, v[:1])), ("v", (q, q, k[:1]))):
        with pytest.raises(ValueError, match=f"{name} holds the integer 9007199254740993"):
            adaptive_attention(*args, scale=1.0, schedule=Constant(1))
    # integers float64 holds are taken exactly, as before
    got = adaptive_attention(q, np.array([[2**53]]) - np.array([[0], [1]]), v, scale=1.0,
                             schedule=Constant(1))  # fmt: skip
    assert got[0, 0] == 1 / (1 + math.exp(-1))


def test_grouped_query_attention_pairs_query_head_h_with_key_head_h_over_the_group():
    """enable_gqa: k and v with fewer heads; query head h reads head h // (Hq / Hk), as
    SDPA's enable_gqa (each key and value head repeated in place)."""
    rng = np.random.default_rng(3)
    q, k, v = (
        rng.normal(size=(2, 6, 3, 4)),
        rng.normal(size=(2, 2, 5, 4)),
        rng.normal(size=(2, 3, 5, 2)),
    )
    got = adaptive_attention(q, k, v, enable_gqa=True)
    want = adaptive_attention(q, np.repeat(k, 3, axis=-3), np.repeat(v, 2, axis=-3))
    assert np.array_equal(got, want)
    swapped = adaptive_attention(q, k[:, ::-1], np.repeat(v, 2, axis=-3), enable_gqa=True)
    assert not np.array_equal(swapped, want)
    with pytest.raises(ValueError, match="multiple of k's"):
        adaptive_attention(q, rng.normal(size=(2, 4, 5, 4)), v, enable_gqa=True)
    with pytest.raises(ValueError, match="head axis"):
        adaptive_attention(q[0, 0], k[0, 0], v[0, 0], enable_gqa=True)
    with pytest.raises(TypeError, match="enable_gqa must be a bool"):
        adaptive_attention(q, k, v, enable_gqa=1)


def test_an_integer_scale_of_numpy_is_taken():
    """scale=np.int64(2) was refused ('scale must be a float') by the reference and the CPU
    backend, and taken by torch; a bool still is refused."""
    from softmaxtheory.accelerated import cpu

    q = np.array([[1.0, 0.5], [0.0, -1.0]])
    want = adaptive_attention(q, q, q, scale=2.0)
    assert np.array_equal(adaptive_attention(q, q, q, scale=np.int64(2)), want)
    assert np.allclose(cpu.adaptive_attention(q, q, q, scale=np.int64(2)), want, rtol=1e-14)
    for bad in (True, np.bool_(True), "2"):
        with pytest.raises(TypeError, match="scale must be a float"):
            adaptive_attention(q, q, q, scale=bad)


_FINITE = st.floats(allow_nan=False, allow_infinity=False, width=64)


@given(
    st.integers(0, 70).flatmap(
        lambda d: st.tuples(
            st.lists(st.lists(_FINITE, min_size=d, max_size=d), min_size=1, max_size=3),
            st.lists(st.lists(_FINITE, min_size=d, max_size=d), min_size=1, max_size=3),
        )
    ),
    st.sampled_from([1.0, 0.125, 0.0, -3.0, 5e-324, 1e300]),
)
@example(([[1.7976931348623157e308, 5e-324, -0.0]], [[1.7976931348623157e308, -5e-324, 2.0]]), 1.0)
@example(([[1.0, -1.0]], [[3.0, 3.0]]), 1.0)  # exact cancellation to 0
@example(([[0.0, 0.0]], [[3.0, 3.0]]), 1.0)  # a zero query: no exponent to align on
@example(([[]], [[], []]), 0.125)  # no features
@settings(max_examples=200)
def test_logits_are_the_exact_mpf_products(vectors, scale):
    """The logits' dot products are integer matrix products (a third of mpf_add's time at
    d = 8): each logit must be the very mpf that exact mpf_mul and mpf_add give."""
    from mpmath.libmp import from_float, fzero, mpf_add, mpf_mul

    from softmaxtheory.reference import attention as ref_attention

    q, k = (np.array(a, dtype=np.float64).reshape(len(a), -1) for a in vectors)
    keep = np.ones((q.shape[0], k.shape[0]), dtype=bool)
    got = ref_attention._logit_rows(q, k, scale, np.zeros(keep.shape), keep)
    for i, qrow in enumerate(vectors[0]):
        for j, krow in enumerate(vectors[1]):
            want = fzero
            for x, y in zip(qrow, krow, strict=True):
                want = mpf_add(want, mpf_mul(from_float(x), from_float(y), 0), 0)
            assert got[i][j] == mpf_mul(want, from_float(scale), 0), (i, j)


@given(
    st.lists(
        st.tuples(
            st.integers(1, 2**80),  # a coefficient's mantissa (positive)
            st.one_of(st.integers(-400, 4), st.integers(-40000, -20000)),  # its exponent
            _FINITE,  # the value it weighs
        ),
        min_size=1,
        max_size=12,
    ),
    st.integers(54, 300),
)
@example([(1, 0, 1.0), (1, 0, -1.0)], 60)  # exact cancellation: T = 0
@example([(3, -30000, 1.0), (1, 0, 2.0**-1074)], 60)  # a span past EXACT_SPAN: the mpf sums
@example([(1, -20000, 1.0), (44901, 0, 401202612627.0)], 54)  # there, M stays an upper bound
@example([(1, 0, 0.0), (5, -3, -0.0)], 54)  # no term: T = M = 0
@settings(max_examples=200)
def test_weighted_sum_meets_the_combine_allowance(terms, ps):
    """The outputs' sums are exact integers rounded once (the mpf sums past EXACT_SPAN):
    T is within a relative 2**-ps of the exact sum, M an upper bound on the exact mass
    within a relative 2**-59, whichever path ran."""
    from fractions import Fraction

    from mpmath.libmp import from_float, fzero

    from softmaxtheory._certify.interval import to_fraction
    from softmaxtheory.reference import attention as ref_attention

    alphas = [(m, e) for m, e, _ in terms]
    values = [from_float(x) for _, _, x in terms]
    total, mass = ref_attention._weighted_sum(alphas, values, ps)
    exact = [Fraction(m) * Fraction(2) ** e * Fraction(x) for m, e, x in terms]
    want_t, want_m = sum(exact), sum(abs(t) for t in exact)
    if want_m == 0:
        assert total == fzero and mass == fzero
        return
    got_t, got_m = to_fraction(total), to_fraction(mass)
    assert abs(got_t - want_t) <= want_m * Fraction(2 * len(terms) + 1, 2**ps)
    assert want_m <= got_m <= want_m * (1 + Fraction(2 * len(terms) + 1, 2**59))
    spans = [e + m.bit_length() for m, e, _ in terms] + [e for _, e, _ in terms]
    if max(spans) - min(spans) < ref_attention.EXACT_SPAN - 2200:  # surely the integer path
        assert abs(got_t - want_t) <= abs(want_t) / 2**ps  # rounded once


def test_distinct_slices_groups_exactly_the_bitwise_equal_slices():
    """The reference certifies each distinct (batch, head) slice once: the slices it
    groups must be those whose operands are equal bit for bit, whatever their strides
    (-0.0 is not 0.0, and NaNs differ by payload), and each group's representative the
    first of them."""
    from softmaxtheory._slices import distinct_slices

    rng = np.random.default_rng(4)
    lead = (3, 4)
    base = rng.normal(size=(2, 5, 3)).round(0)  # two distinct slices, as small integers
    q = base[rng.integers(0, 2, size=lead)]  # (3, 4, 5, 3): slices repeat
    nan_a, nan_b = np.float64(np.nan), np.frombuffer(b"\x01\x00\x00\x00\x00\x00\xf8\x7f")[0]
    # batch entries 0 and 2 share their keys and mask head by head: their queries decide
    q[2] = q[0]
    q[0, 0, 0, 0], q[2, 0, 0, 0] = 0.0, -0.0  # equal values, other bits: two slices
    q[0, 1, 4, 2] = q[2, 1, 4, 2] = nan_a  # the same NaN: one slice
    q[0, 2, 4, 2], q[2, 2, 4, 2] = nan_a, nan_b  # NaNs with other payloads: two slices
    k = np.broadcast_to(rng.normal(size=(1, 4, 6, 3)).round(0), (3, 4, 6, 3))  # zero strides
    v = rng.normal(size=(6, 2)).round(0)  # no leading axes
    mask = np.where(rng.random((3, 1, 5, 6)) < 0.5, 0.0, -np.inf)  # one per batch entry
    mask[2] = mask[0]
    ops = [q, k, v, mask]
    first = distinct_slices(lead, ops)
    full = [np.broadcast_to(a, (*lead, *a.shape[-2:])).reshape(12, *a.shape[-2:]) for a in ops]
    for n in range(12):
        same = [m for m in range(12) if all(a[m].tobytes() == a[n].tobytes() for a in full)]
        assert first[n] == same[0], (n, first[n], same)
    assert len(set(first.tolist())) > 2  # the case is not degenerate
    assert (first < np.arange(12)).any()  # and some slices repeat


_SPANS = st.integers(0, 45)


@given(
    st.integers(1, 5),
    st.integers(1, 5),
    st.integers(1, 300),
    _SPANS,
    st.integers(0, 2**32 - 1),
    st.sampled_from(["float64", "float32", "float16"]),
)
@example(2, 3, 129, 0, 0, "float64")  # two blocks of features
@example(1, 1, 1, 45, 1, "float64")  # one feature
@settings(max_examples=80)
def test_float_piece_dots_are_the_integer_matrix_products(L, S, d, span, seed, dtype):
    """The dot products from 23-bit pieces in float64 BLAS (:func:`_float_dots`) are the
    integer matrix products of :func:`_int_matrix`, bit for bit, with the same exponents."""
    from softmaxtheory.reference import attention as ref_attention

    rng = np.random.default_rng(seed)
    q = rng.standard_normal((L, d)) * 2.0 ** rng.integers(-span, span + 1, (L, d))
    k = rng.standard_normal((S, d)) * 2.0 ** rng.integers(-span, span + 1, (S, d))
    with np.errstate(over="ignore"):  # (float16 overflows beyond 65504: those become 0)
        q, k = (a.astype(dtype).astype(np.float64) for a in (q, k))
    q[(rng.random(q.shape) < 0.2) | ~np.isfinite(q)] = 0.0
    k[~np.isfinite(k)] = 0.0
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ref_attention, "_MIN_FLOAT_DOTS", 0)
        got = ref_attention._float_dots(q, k)
    (qi, eq), (ki, ek) = ref_attention._int_matrix(q), ref_attention._int_matrix(k)
    if got is None:  # only for integers of more than four 23-bit pieces
        widest = max(int(x).bit_length() for x in (*qi.flat, *ki.flat))
        assert widest > 4 * 23
        return
    D, gq, gk = got
    assert (gq, gk) == (eq, ek)
    assert D.tolist() == (qi @ ki.T).tolist()


def test_float_piece_dots_stay_exact_at_their_int64_limit():
    """Every piece full (2**23 - 1) over the most blocks the path takes (256 of 128
    features), all of one sign: the int64 sums come within a factor 2 of 2**63."""
    from softmaxtheory.reference import attention as ref_attention

    d = ref_attention._MAX_BLOCKS * ref_attention._DOT_BLOCK
    big = float((1 << 53) - 1) * 2.0**-13  # beside 1.0 (the least exponent): 92 bits
    q = np.full((1, d), big)
    q[0, 0] = 1.0
    D, _, _ = ref_attention._float_dots(q, q)
    qi, _ = ref_attention._int_matrix(q)
    assert max(int(x).bit_length() for x in qi.flat) == 92  # four pieces, the top ones full
    assert D.tolist() == (qi @ qi.T).tolist()
    assert ref_attention._float_dots(np.ones((1, d + 1)), np.ones((1, d + 1))) is None  # 257 blocks
