"""The reference's fast double-double pass: bit for bit the mpmath path, with sound bounds."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from mpmath.libmp import (
    from_float,
    mpf_abs,
    mpf_add,
    mpf_div,
    mpf_exp,
    mpf_ln2,
    mpf_mul,
    mpf_sub,
    round_nearest,
    to_float,
)

from softmaxtheory import reference
from softmaxtheory import strategies as strat
from softmaxtheory.reference import _fast
from softmaxtheory.reference._rounding import FORMATS
from softmaxtheory.spec import Constant, LogLength, PaperPolynomial, Polynomial

FUNCS = ("softmax", "entropy", "beta", "adaptive_softmax")
DTYPES = (np.float64, np.float32, np.float16)


def _both(fn: str, x: np.ndarray, dtype: object, **kw: object) -> tuple[np.ndarray, np.ndarray]:
    fast = getattr(reference, fn)(x, dtype=dtype, **kw)
    with _fast.pure_mpmath():
        slow = getattr(reference, fn)(x, dtype=dtype, **kw)
    return fast, slow


def _assert_same(fast: np.ndarray, slow: np.ndarray) -> None:
    assert fast.dtype == slow.dtype
    assert np.array_equal(fast, slow, equal_nan=True)
    # the same bits, signed zeros included
    assert np.array_equal(np.signbit(fast), np.signbit(slow))


def _reset() -> None:
    for key in _fast.STATS:
        _fast.STATS[key] = 0


# ---------------------------------------------------------------------------
# the building blocks against mpmath
# ---------------------------------------------------------------------------


def test_ln2_parts_sum_to_ln2() -> None:
    """L1 and L2 have 42 bits (k L1, k L2 exact) and L1 + L2 + L3 is ln 2 within 2**-130.

    Regression: L2 was once left at 53 bits (and L3 = 0), which made the exp error
    about 2**-45 while 2**-88 was claimed; float64 results then differed.
    """
    for part in (_fast._L1, _fast._L2):
        man = from_float(part)[1]
        assert man.bit_length() <= 42
    total = mpf_add(
        mpf_add(from_float(_fast._L1), from_float(_fast._L2), 0), from_float(_fast._L3), 0
    )
    err = to_float(mpf_abs(mpf_sub(total, mpf_ln2(300, round_nearest), 300, round_nearest)))
    assert err < 2.0**-130


def test_exp_table_within_its_bound() -> None:
    """Every table entry hi + lo is within 2**-105 of exp(j 2**-13), and hi is rounded to nearest.

    Regression: the entries were once split by truncation (mpmath's default
    ``to_float``), which left some 2**-105.1 away, above the bound the analysis uses.
    """
    hi, lo, _, _, half = _fast._exp_table()
    for i, j in enumerate(range(-half, half + 1)):
        exact = mpf_exp(mpmath.libmp.from_man_exp(j, -13), 300, round_nearest)
        got = mpf_add(from_float(float(hi[i])), from_float(float(lo[i])), 0)
        err = mpf_div(mpf_abs(mpf_sub(got, exact, 300, round_nearest)), exact, 60, round_nearest)
        assert to_float(err) <= 2.0**-105, j
        assert abs(float(lo[i])) <= 0.5 * math.ulp(float(hi[i])), j


def _exp_errors(yh: np.ndarray, yl: np.ndarray) -> float:
    eh, el = _fast.exp_dd(yh, yl)
    worst = 0.0
    for h, lo, a, b in zip(eh.tolist(), el.tolist(), yh.tolist(), yl.tolist(), strict=True):
        exact = mpf_exp(mpf_add(from_float(a), from_float(b), 0), 200, round_nearest)
        got = mpf_add(from_float(h), from_float(lo), 0)
        rel = mpf_div(mpf_abs(mpf_sub(got, exact, 200, round_nearest)), exact, 60, round_nearest)
        worst = max(worst, to_float(rel))
    return worst


def _adversarial_arguments() -> np.ndarray:
    ln2 = math.log(2.0)
    ys = [0.0, -5e-324, -1e-300, -(2.0**-60), -(2.0**-14), -(2.0**-14) * (1 + 2.0**-40)]
    for k in (1, 2, 3, 100, 500, 865):
        for d in (-1e-17, 0.0, 1e-17):
            ys += [-k * ln2 + d, -(k + 0.5) * ln2 + d]
    for j in (1, 7, 2000, 2838):  # table boundaries (j + 1/2) 2**-13
        ys += [-(j + 0.5) * 2.0**-13, -(j + 0.5) * 2.0**-13 - 1e-17, -0.5 * ln2 - j * 1e-9]
    ys += [-600.0, -599.999999, -153.7, -0.34657359027997264]
    return np.array([y for y in ys if -600.0 <= y <= 0.0])


def test_exp_dd_within_its_bound() -> None:
    """exp_dd's error stays below EXP_REL (derived < 2**-92) on adversarial and random arguments."""
    rng = np.random.default_rng(5)
    yh = np.concatenate(
        [
            _adversarial_arguments(),
            -rng.uniform(0, 1, 3000),
            -rng.uniform(0, 40, 3000),
            -rng.uniform(0, 600, 3000),
            -(10.0 ** rng.uniform(-300, 2.7, 1000)),
        ]
    )
    # low parts as the shifts x - m and the products beta z leave them (half an ulp at most)
    ulp = np.spacing(np.abs(yh))
    yl = np.where(yh < 0, rng.uniform(-0.5, 0.5, yh.size) * ulp, 0.0)
    yh, yl = _fast.two_sum(yh, yl)
    worst = _exp_errors(yh, yl)
    assert worst <= _fast.EXP_REL
    assert worst <= 2.0**-93  # the a-priori analysis gives < 2**-92


@given(st.floats(-600.0, 0.0), st.floats(-0.5, 0.5))
@example(-0.34657359027997264, 0.0)  # half of ln 2: the largest reduced argument
@example(-599.9999999999999, 0.5)
@example(-5e-324, 0.0)
def test_exp_dd_hypothesis(y: float, frac: float) -> None:
    """Any argument in [-600, 0] with any low part: within EXP_REL."""
    yh, yl = _fast.two_sum(np.array([y]), np.array([frac * math.ulp(y)]))
    assert _exp_errors(yh, yl) <= _fast.EXP_REL


def test_exact_sum_is_exact() -> None:
    """The level sums reproduce math.fsum's exact sum (within the stated bound)."""
    rng = np.random.default_rng(3)
    hi = np.concatenate([rng.uniform(0, 1, 50000), 10.0 ** rng.uniform(-300, 0, 50000), [1.999]])
    lo = hi * rng.uniform(-(2.0**-53), 2.0**-53, hi.size)
    total, err = _fast.sum_dd(hi, lo)
    exact = mpmath.mpf(0)
    with mpmath.workprec(4000):
        for v in (*hi.tolist(), *lo.tolist()):
            exact += v
        diff = abs(mpmath.mpf(total) - exact)
    assert diff <= err


def test_exact_sum_by_groups_is_the_same_exact_sum(monkeypatch) -> None:
    """Past 2**26 terms one float no longer holds a level's sum exactly; the level sums are
    then added to the exact total group by group. With groups of one slice (2**14 terms)
    the total is the same number, and within the bound of the exact sum."""
    rng = np.random.default_rng(8)
    hi = np.concatenate([rng.uniform(0, 1, 70000), 10.0 ** rng.uniform(-30, 0, 30000), [1.5]])
    lo = hi * rng.uniform(-(2.0**-53), 2.0**-53, hi.size)
    whole = _fast.sum_dd(hi, lo)
    monkeypatch.setattr(_fast, "_GROUP", _fast._CHUNK)
    grouped = _fast.sum_dd(hi, lo)
    assert grouped == whole
    exact = mpmath.mpf(0)
    with mpmath.workprec(4000):
        for v in (*hi.tolist(), *lo.tolist()):
            exact += v
        assert abs(mpmath.mpf(grouped[0]) - exact) <= grouped[1]


def test_rows_of_several_groups_are_certified_fast(monkeypatch) -> None:
    """Rows longer than 2**26 items went to the mpmath engine (about 60 times slower); the
    fast pass now takes them, its sums added by groups. Groups of 2**14 here, on a 40000-item
    row: the same bits as the mpmath path, with no row handed to it."""
    monkeypatch.setattr(_fast, "_GROUP", _fast._CHUNK)
    assert _fast.MAX_N >= 1 << 40
    rng = np.random.default_rng(9)
    row = rng.normal(0, 3, 40000)
    row[:80] += 12.0  # beta > 1
    row[::101] = -np.inf
    calls = [("softmax", {}), ("adaptive_softmax", {}), ("entropy", {}),
             ("entropy", {"entropy_eps": 1e-9})]  # fmt: skip
    for fn, kw in calls:
        _reset()
        fast = getattr(reference, fn)(row, dtype=np.float32, **kw)
        assert _fast.STATS["row_fallback"] == 0, (fn, kw)
        with _fast.pure_mpmath():
            slow = getattr(reference, fn)(row, dtype=np.float32, **kw)
        _assert_same(fast, slow)


def _log1p_mp(r: tuple) -> tuple:
    """log(1 + r) to 300 bits relative (mpmath raises its precision near r = 0)."""
    with mpmath.workprec(300):
        return mpmath.log1p(mpmath.mpf(r))._mpf_


def _log1p_errors(rh: np.ndarray, rl: np.ndarray) -> list[tuple[float, float]]:
    """(actual error, claimed bound) of log1p_dd for each argument, against mpmath."""
    lh, ll, err = _fast.log1p_dd(rh, rl)
    out = []
    cols = (lh.tolist(), ll.tolist(), rh.tolist(), rl.tolist(), err.tolist())
    for h, lo, a, b, e in zip(*cols, strict=True):
        r = mpf_add(from_float(a), from_float(b), 0)
        exact = _log1p_mp(r)
        got = mpf_add(from_float(h), from_float(lo), 0)
        out.append((to_float(mpf_abs(mpf_sub(got, exact, 300, round_nearest))), e))
    return out


def _log1p_arguments() -> np.ndarray:
    rng = np.random.default_rng(6)
    edge = [2.0**-701, 1e-200, 1e-20, 2.0**-30 * (1 - 2.0**-52), 2.0**-30, 1e-9, 0.5, 1.0,
            math.e - 1.0, 1e10, 1e200, math.exp(600.0) * (1 - 1e-15)]  # fmt: skip
    return np.concatenate([edge, 10.0 ** rng.uniform(-210, 260, 3000), rng.uniform(0, 4, 1000)])


def test_log1p_dd_within_its_bound() -> None:
    """log1p_dd (Newton step and series) is within its claimed bound, and the bound is tight.

    Tight: below 2**-87 absolute for the Newton step and 2**-97 relative for the
    series, so that the guarded entropy certifies (the bound is not ``inf`` anywhere).
    """
    rng = np.random.default_rng(7)
    rh = _log1p_arguments()
    rl = rh * rng.uniform(-(2.0**-53), 2.0**-53, rh.size)
    rh, rl = _fast.fast_two_sum(rh, rl)
    for (actual, bound), r in zip(_log1p_errors(rh, rl), rh.tolist(), strict=True):
        assert actual <= bound, r
        assert bound <= (2.0**-97 * r if r < 2.0**-30 else 2.0**-87 + 2.0**-104 * math.log1p(r))


def test_log1p_dd_refuses_what_it_cannot_bound() -> None:
    """Beyond log(1 + r) = 600 (e^-600 would leave the normal range), and for NaN: inf."""
    rh = np.array([math.exp(601.0), np.nan, 1.0])
    err = _fast.log1p_dd(rh, np.zeros(3))[2]
    assert np.isinf(err[:2]).all() and err[2] < 2.0**-87


@given(st.floats(2.0**-701, 1e260), st.floats(-0.5, 0.5))
@example(2.0**-30, 0.5)  # the switch from the series to the Newton step
@example(2.0**-30 * (1 - 2.0**-52), -0.5)
@example(1e-9, 0.0)  # the paper's guard with p = 1
def test_log1p_dd_hypothesis(r: float, frac: float) -> None:
    """Any argument in [2**-701, 1e260] with any low part: within the claimed bound."""
    rh, rl = _fast.fast_two_sum(np.array([r]), np.array([frac * math.ulp(r)]))
    ((actual, bound),) = _log1p_errors(rh, rl)
    assert actual <= bound < math.inf


def test_guard_terms_within_their_bound() -> None:
    """Each term p log(1 + eps/p) (p = e/s from the pass) is within its claimed bound."""
    rng = np.random.default_rng(9)
    y = np.concatenate([-rng.uniform(0, 580, 600), [0.0, -1e-12, -579.9]])
    eh, el = _fast.exp_dd(y, np.zeros_like(y))
    s = mpf_add(from_float(1.0), from_float(123.456), 0)
    sh, sl = _fast.dd_of(s)
    for eps in (1e-9, 2.0**-690, 0.75, 1e6):
        rho = np.full(y.size, 2.0**-88)
        gh, gl, err = _fast.guard_terms(eh, el, rho, sh, sl, eps)
        assert np.all(err < np.inf)
        cols = (gh.tolist(), gl.tolist(), eh.tolist(), el.tolist(), err.tolist())
        for h, lo, a, b, e in zip(*cols, strict=True):
            # the extreme p within rho of the computed quotient
            for sign in (-1, 1):
                e_mp = mpf_add(from_float(a), from_float(b), 0)
                p = mpf_div(e_mp, s, 300, round_nearest)
                p = mpf_mul(p, from_float(1.0 + sign * 0.99 * 2.0**-88), 300, round_nearest)
                lam = _log1p_mp(mpf_div(from_float(eps), p, 300, round_nearest))
                exact = mpf_mul(p, lam, 300, round_nearest)
                got = mpf_add(from_float(h), from_float(lo), 0)
                assert to_float(mpf_abs(mpf_sub(got, exact, 300, round_nearest))) <= e


# ---------------------------------------------------------------------------
# bit for bit against the mpmath path
# ---------------------------------------------------------------------------


def _pinned_rows() -> list[tuple[str, np.ndarray]]:
    ninf = -np.inf
    rng = np.random.default_rng(11)
    pts = strat.branch_points()
    rows = [
        ("one item", np.array([3.5])),
        ("two equal maxima", np.array([1.0, 1.0, -2.0])),
        ("all equal: p = 1/3", np.zeros(3)),
        ("masked", np.array([0.5, ninf, 2.0, ninf, -1.0])),
        ("one finite", np.array([ninf, 3.0, ninf])),
        ("huge magnitudes", np.array([1e308, -1e308, 1.7e308, 0.0])),
        ("tiny differences", np.array([0.0, -1e-300, 5e-324, -5e-324])),
        ("subnormal float16 outputs", np.array([0.0, -11.0, -15.0, -16.6, -17.3])),
        ("subnormal float32 outputs", np.array([0.0, -88.0, -95.0, -103.0, -104.5])),
        ("subnormal float64 outputs", np.array([0.0, -700.0, -730.0, -744.0, -745.2])),
        ("near the float32 cutoff", np.array([0.0, -150.0, -160.0, -170.0, -1000.0])),
        ("near the float64 cutoff", np.array([0.0, -599.5, -600.5, -780.0, -800.0])),
        ("shifted far from zero", 1e4 + rng.normal(0, 3, 40)),
        ("near half the float maximum", 8.9e307 + np.arange(8.0) * 1e292),
        ("sharp", rng.normal(0, 30, 64)),
        ("flat", rng.normal(0, 0.01, 64)),
        ("one-hot", np.where(np.arange(50) == 7, 0.0, -40.0)),
    ]
    for name in ("threshold", "H_on", "H_star", "H_off"):
        for d in (-1e-9, 0.0, 1e-9):
            row = strat.row_with_entropy(pts[name] + d, 256, 1)
            if row is not None:
                rows.append((f"entropy {name}{d:+g}", row))
    return rows


PINNED = _pinned_rows()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name,row", PINNED, ids=[p[0] for p in PINNED])
def test_pinned_rows_bit_for_bit(name: str, row: np.ndarray, dtype: object) -> None:
    """Adversarial rows: the fast pass (with its fallbacks) equals the mpmath path bit for bit."""
    for fn in FUNCS:
        _assert_same(*_both(fn, row, dtype))


SCHEDULES = [
    Constant("1e-300"),  # shifts of 1e300 are alive: the fast pass declines them
    Constant("0.5"),
    Constant("3"),
    LogLength("0.5"),
    Polynomial(("0.5", "1"), threshold="1"),  # jumps from 1 to 1.5 at H = 1
    PaperPolynomial(),
]


@pytest.mark.parametrize("schedule", SCHEDULES, ids=repr)
def test_schedules_bit_for_bit(schedule: object) -> None:
    """beta < 1 (items beyond the cutoff come back alive), beta > 1, log n, a jump."""
    rows = [
        np.array([0.0, -100.0, -200.0, -300.0, -1e308]),
        np.array([1e300, -1e300, 0.0, 5e299]),
        np.random.default_rng(2).normal(0, 4, 300),
        strat.row_with_entropy(1.0, 64, 1),  # exactly at the jump
        strat.row_with_entropy(1.0 + 1e-12, 64, 1),
    ]
    for row in rows:
        for dtype in DTYPES:
            for fn in ("beta", "adaptive_softmax"):
                _assert_same(*_both(fn, row, dtype, schedule=schedule))


def test_long_row_bit_for_bit_and_certified_fast() -> None:
    """A 20000-item row: equal to the mpmath path, and decided by the fast pass alone."""
    rng = np.random.default_rng(4)
    row = rng.normal(0, 3, 20000)
    row[:60] += 12.0  # entropy inside the adaptive window: beta > 1
    row[::97] = -np.inf
    for fn in ("softmax", "adaptive_softmax"):
        _reset()
        fast = getattr(reference, fn)(row, dtype=np.float32)
        assert _fast.STATS["row_fallback"] == 0
        assert _fast.STATS["fast"] > 19000
        with _fast.pure_mpmath():
            slow = getattr(reference, fn)(row, dtype=np.float32)
        _assert_same(fast, slow)


def test_fast_pass_is_used_on_ordinary_rows() -> None:
    """The bit-for-bit tests are not vacuous: ordinary rows never reach the mpmath engine."""
    rng = np.random.default_rng(8)
    _reset()
    for _ in range(5):
        row = rng.normal(0, 3, 500)
        for dtype in DTYPES:
            for fn in FUNCS:
                getattr(reference, fn)(row, dtype=dtype)
    assert _fast.STATS["row_fallback"] == 0
    assert _fast.STATS["fast"] >= 5 * 3 * 2 * 500


def test_pure_mpmath_restores_the_fast_pass() -> None:
    """The context manager switches the fast pass off and back on, even on error."""
    assert _fast.enabled()
    with pytest.raises(RuntimeError), _fast.pure_mpmath():
        assert not _fast.enabled()
        raise RuntimeError
    assert _fast.enabled()


_DTYPE_NAMES = ("float64", "float32", "float16", "bfloat16")


@given(
    strat.logit_rows(max_size=40, dtype="float64"),
    st.sampled_from(FUNCS),
    st.sampled_from(DTYPES),
    st.sampled_from(_DTYPE_NAMES),
)
@example(np.array([0.0, -1e-300]), "entropy", np.float64, "float64")
@example(np.array([0.0, -745.0, -746.0]), "softmax", np.float64, "float64")
@example(np.array([1e308, -1e308]), "adaptive_softmax", np.float32, "float64")
@example(np.array([0.0, -103.97]), "softmax", np.float32, "float32")
@example(np.array([0.0, -16.6]), "adaptive_softmax", np.float16, "float16")
def test_random_rows_bit_for_bit(row: np.ndarray, fn: str, dtype: object, in_dtype: str) -> None:
    """Rows of every family, in every input format, every function and output format."""
    x = strat.cast(row, in_dtype)
    _assert_same(*_both(fn, x, dtype))


GUARDS = (1e-9, 1e-3, 0.5, 1e-200)


@pytest.mark.parametrize("eps", GUARDS)
def test_guarded_entropy_is_certified_fast(eps: float) -> None:
    """entropy_eps > 0: the fast pass certifies ordinary rows, equal to the mpmath path.

    Regression: the guarded entropy once always went to the mpmath engine (about
    40 s for the conformance suite's row of 2**20 items).
    """
    rng = np.random.default_rng(12)
    rows = [np.array([0.0, -1.0, -3.0]), rng.normal(0, 3, 500), rng.normal(0, 0.01, 64),
            np.where(np.arange(50) == 7, 0.0, -40.0),
            strat.row_with_entropy(5.0, 256, 1)]  # fmt: skip
    for row in rows:
        for dtype in DTYPES:
            for fn in ("entropy", "beta", "adaptive_softmax"):
                _reset()
                fast = getattr(reference, fn)(row, dtype=dtype, entropy_eps=eps)
                assert _fast.STATS["row_fallback"] == 0, (row, dtype, fn)
                with _fast.pure_mpmath():
                    slow = getattr(reference, fn)(row, dtype=dtype, entropy_eps=eps)
                _assert_same(fast, slow)


def test_guarded_entropy_of_a_long_row_is_certified_fast() -> None:
    """A 6000-item row with the paper's guard: the fast pass alone, equal to mpmath."""
    rng = np.random.default_rng(13)
    row = rng.normal(0, 2, 6000)
    row[::89] = -np.inf
    for dtype in (np.float64, np.float32):
        _reset()
        fast = reference.entropy(row, dtype=dtype, entropy_eps=1e-9)
        assert _fast.STATS["row_fallback"] == 0
        with _fast.pure_mpmath():
            slow = reference.entropy(row, dtype=dtype, entropy_eps=1e-9)
        _assert_same(fast, slow)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name,row", PINNED, ids=[p[0] for p in PINNED])
def test_pinned_rows_guarded_bit_for_bit(name: str, row: np.ndarray, dtype: object) -> None:
    """Adversarial rows with the paper's guard: fast pass and mpmath path agree bit for bit."""
    for fn in ("entropy", "beta", "adaptive_softmax"):
        _assert_same(*_both(fn, row, dtype, entropy_eps=1e-9))


@given(
    strat.logit_rows(max_size=40, dtype="float64"),
    st.sampled_from(("entropy", "beta", "adaptive_softmax")),
    st.sampled_from(DTYPES),
    st.sampled_from((1e-9, 2.0**-700, 1e-30, 0.25, 7.0, 2.0**64)),
)
@example(np.array([0.0, -1e-300]), "entropy", np.float64, 1e-9)
@example(np.array([0.0, -600.0, -650.0]), "entropy", np.float64, 7.0)  # log(1 + eps/p) > 600
@example(np.array([0.0, 0.0]), "entropy", np.float16, 2.0**64)  # H = log 2 - log(1 + 2**63)
def test_random_rows_guarded_bit_for_bit(
    row: np.ndarray, fn: str, dtype: object, eps: float
) -> None:
    """Rows of every family with a guard from 2**-700 to 2**64: fast and mpmath agree."""
    _assert_same(*_both(fn, row, dtype, entropy_eps=eps))


def test_guards_out_of_range_go_to_mpmath() -> None:
    """A guard below EPS_MIN or above EPS_MAX is left to the engine (same values)."""
    x = np.array([0.0, -1.0, -3.0])
    fmt = FORMATS["float64"]
    for eps in (5e-324, _fast.EPS_MIN / 2, _fast.EPS_MAX * 2):
        assert _fast.evaluate(x, "entropy", fmt, PaperPolynomial(), eps) is None
        _assert_same(*_both("entropy", x, np.float64, entropy_eps=eps))
    assert _fast.evaluate(x, "entropy", fmt, PaperPolynomial(), 1e-9) is not None


def test_exact_sum_of_tiny_terms() -> None:
    """Terms far below the finest grid are scaled first, never lost.

    Regression: a row [0, -150, -160, -170, -1000] once had its entropy
    (1.08e-63) certified as 0.0 for float64: its sum of e^-150.. fell below
    the fixed grids and was taken for "no item alive".
    """
    hi = np.array([math.exp(-150.0), math.exp(-160.0)])
    lo = np.zeros(2)
    total, err = _fast.sum_dd(hi, lo)
    assert mpmath.mpf(total) == mpmath.mpf(hi[0]) + mpmath.mpf(hi[1])
    assert err < 1e-100


_PAPER_COEFFS = PaperPolynomial().exact_coefficients


def test_slope_bound_is_sound_and_tight() -> None:
    """|P'| over the entropy's ball: above the true slope, far below the absolute-value bound."""
    from softmaxtheory.reference import _engine

    coeffs = [float(c) for c in PaperPolynomial().exact_coefficients]
    d = len(coeffs) - 1
    for H in (0.6, 2.0, 5.318, 7.5, 12.0):
        EH = 1e-6
        bound = _engine._slope_bound(coeffs, H, EH, H + EH)
        with mpmath.workprec(200):
            exact = [mpmath.mpf(c.numerator) / c.denominator for c in _PAPER_COEFFS]
            for h in map(mpmath.mpf, (H - EH, H, H + EH)):
                terms = (c * (d - i) * h ** (d - i - 1) for i, c in enumerate(exact[:-1]))
                slope = abs(sum(terms))
                assert slope <= bound
        plain = sum(abs(c) * (d - i) * (H + EH) ** max(d - i - 1, 0) for i, c in enumerate(coeffs))
        assert bound <= plain
    assert _engine._slope_bound(coeffs, 5.318, 1e-20, 5.318) < 2.0  # the plain bound: 92


def test_bench_reference_section_reports_the_speedup(capsys) -> None:
    """``softmaxtheory bench --section reference``: fast pass against pure mpmath, one run."""
    import json

    from softmaxtheory.cli import main

    assert main(["bench", "--quick", "--section", "reference", "--n", "300", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = doc["reference_speedup"]
    assert {r["function"] for r in rows} == {"softmax", "entropy", "adaptive_softmax"}
    assert {r["dtype"] for r in rows} == {"float32", "float64"}
    for r in rows:
        assert r["n"] == 300 and r["mpmath_n"] == 300 and not r["extrapolated"]
        assert r["speedup"] == pytest.approx(r["mpmath_seconds"] / r["fast_seconds"])
        assert r["undecided_fraction"] == 0.0 and not r["row_fallback"]


@pytest.mark.parametrize(
    ("func", "limit"), [("softmax", 96), ("adaptive_softmax", 96), ("entropy", 80)]
)
def test_the_fast_pass_keeps_few_arrays_of_the_rows_size(func, limit):
    """Peak memory per item of one long row, as numpy allocates it (tracemalloc).

    It was 138 bytes per item for the softmax (2.3 GB for the 2**24 items of ``check
    --thorough``'s long row) and 92 for the entropy: whole-row arrays of a constant
    error bound, of the quotients, of the positions. Now 77 and 68.
    """
    import tracemalloc

    n = 1 << 20
    x = np.random.default_rng(11).normal(size=n) * 3
    getattr(reference, func)(x[:1000])  # (tables built once, outside the measurement)
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        getattr(reference, func)(x)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        if started:
            tracemalloc.stop()
    assert peak / n < limit, f"{peak / n:.0f} bytes per item"


@pytest.mark.parametrize(
    ("row", "schedule"),
    [
        ([0.0, 5e-324], Constant("1e308")),
        ([0.0, 5e-324], Constant("1.4e300")),
        ([-1e308, 0.0, 5e-324, -5e-324], LogLength("1e308")),
        ([0.0, -1e-300, 3e-310], Constant("1.7e308")),
    ],
)
def test_beta_beyond_the_split_limit_is_certified(row, schedule) -> None:
    """beta above 2**995 overflowed Dekker's split of the product beta z ((2**27 + 1) beta):
    NaN, then a table index of -2**63 (IndexError) in the fast pass."""
    x = np.array(row)
    got = reference.adaptive_softmax(x, schedule=schedule)
    want = [float(v) for v in reference.adaptive_softmax_mp(x, schedule=schedule)]
    assert got.tolist() == want
