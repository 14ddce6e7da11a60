"""The reference's batched double-double pass: many rows at once, bit for bit the one-row path."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from softmaxtheory import reference
from softmaxtheory import strategies as strat
from softmaxtheory.reference import _fast, _fast_batch
from tests.test_reference_fast import DTYPES, FUNCS, PINNED, SCHEDULES, _assert_same, _reset

# ---------------------------------------------------------------------------
# exact line sums against exact arithmetic
# ---------------------------------------------------------------------------


def _dd_terms(values: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """Each value and a low part within half its ulp (a term of a double-double)."""
    hi = np.array(values, dtype=np.float64)
    lo = np.array([math.ulp(h) * 0.375 * (-1) ** j for j, h in enumerate(values)])
    return hi, np.where(hi == 0.0, 0.0, lo)


magnitudes = st.one_of(
    st.floats(-2.0, 2.0),
    st.floats(-1e300, 1e300),
    st.floats(-1e-300, 1e-300),
    st.sampled_from([5e-324, -5e-324, 2.0**989, -(2.0**-900)]),
)


@given(st.lists(magnitudes, min_size=1, max_size=40))
@example([0.0, 0.0])  # no term: T = 0
@example([1.0, -1.0])  # exact cancellation
@example([2.0**900, 2.0**-900, -(2.0**900)])  # a tiny term beside cancelling huge ones
@example([5e-324, 5e-324, -1e-320])  # subnormals only
@example([1.5, 1.5 * 2**-60, -(2.0**-131)])
def test_line_sums_are_exact_up_to_their_residual(values) -> None:
    hi, lo = _dd_terms(values)
    T, K, ok = _fast_batch.line_sums(hi[None, :], lo[None, :])
    exact = sum((Fraction(h) + Fraction(lo_) for h, lo_ in zip(hi, lo, strict=True)), Fraction(0))
    if not ok[0]:  # every term below 2**-1000: too small to scale
        assert np.max(np.abs(hi)) < 2.0**-999
        return
    k = int(K[0])
    got = Fraction(int(T[0])) * Fraction(2) ** (-130 - k)
    assert abs(got - exact) <= len(values) * Fraction(2) ** (-129 - k)


def test_line_sums_of_many_lines_are_each_lines_own() -> None:
    rng = np.random.default_rng(7)
    hi = rng.standard_normal((5, 3, 17)) * 10.0 ** rng.integers(-200, 200, (5, 3, 1))
    lo = hi * 2.0**-60
    T, K, ok = _fast_batch.line_sums(hi, lo)
    assert ok.all()
    for idx in np.ndindex(5, 3):
        t1, k1, _ = _fast_batch.line_sums(hi[idx][None], lo[idx][None])
        assert (int(T[idx]), int(K[idx])) == (int(t1[0]), int(k1[0]))


# ---------------------------------------------------------------------------
# batches of rows: the same bits as one row at a time and as mpmath
# ---------------------------------------------------------------------------


def _three_paths(fn: str, x: np.ndarray, dtype: object, **kw: object) -> np.ndarray:
    """The result with the batched pass; checked against the one-row pass and mpmath."""
    batched = getattr(reference, fn)(x, dtype=dtype, **kw)
    with _fast.pure_mpmath():
        slow = getattr(reference, fn)(x, dtype=dtype, **kw)
    one_by_one = np.stack([getattr(reference, fn)(row, dtype=dtype, **kw) for row in x])
    _assert_same(batched, slow)
    _assert_same(batched, one_by_one)
    return batched


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name,row", PINNED, ids=[p[0] for p in PINNED])
def test_pinned_rows_in_a_batch_bit_for_bit(name: str, row: np.ndarray, dtype: object) -> None:
    """Each adversarial row of the one-row tests beside two rearrangements of itself."""
    batch = np.stack([row, row[::-1], np.roll(row, 1)])
    for fn in FUNCS:
        _three_paths(fn, batch, dtype)


@pytest.mark.parametrize("schedule", SCHEDULES, ids=repr)
def test_schedules_in_a_batch_bit_for_bit(schedule: object) -> None:
    rng = np.random.default_rng(9)
    batch = np.stack([
        np.array([0.0, -100.0, -200.0, -300.0, -1e308]),
        np.array([1e300, -1e300, 0.0, 5e299, 1.0]),
        rng.normal(0, 4, 5),
        rng.normal(0, 0.01, 5),
    ])  # fmt: skip
    for dtype in DTYPES:
        for fn in ("beta", "adaptive_softmax"):
            _three_paths(fn, batch, dtype, schedule=schedule)


@given(
    strat.logit_batches(st.tuples(st.integers(2, 6)), max_size=30),
    st.sampled_from(FUNCS),
    st.sampled_from(DTYPES),
    st.sampled_from([0.0, 0.0, 1e-9, 0.5, 1e-300]),
)
def test_random_batches_bit_for_bit(x: np.ndarray, fn: str, dtype: object, eps: float) -> None:
    kw = {} if fn == "softmax" else {"entropy_eps": eps}
    _three_paths(fn, x, dtype, **kw)


@pytest.mark.parametrize("fn", FUNCS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_ordinary_batches_are_certified_by_the_batched_pass(fn: str, dtype: object) -> None:
    """The bit-for-bit tests are not vacuous: every row of a Gaussian batch is the batch's."""
    x = np.random.default_rng(3).normal(0, 3, (40, 50))
    x[::7, ::5] = -np.inf
    _reset()
    getattr(reference, fn)(x, dtype=dtype)
    assert _fast.STATS["batch_rows"] == 40
    assert _fast.STATS["row_fallback"] == 0 and _fast.STATS["element_fallback"] == 0


def test_a_row_with_tiny_items_goes_to_the_one_row_pass() -> None:
    """Items beyond -600 in a float64 softmax are computed by mpmath one at a time."""
    x = np.array([[0.0, -1.0, -2.0], [0.0, -1.0, -700.0], [0.0, -3.0, -5.0]])
    _reset()
    got = _three_paths("softmax", x, np.float64)
    assert got[1, 2] > 0.0  # exp(-700) / s, a normal float64
    _reset()
    reference.softmax(x)
    assert _fast.STATS["batch_rows"] == 2 and _fast.STATS["element_fallback"] == 1


def test_rows_chunked_one_at_a_time_give_the_same_bits(monkeypatch) -> None:
    x = np.random.default_rng(6).normal(0, 2, (9, 33))
    whole = reference.adaptive_softmax(x, dtype=np.float32)
    monkeypatch.setattr(_fast_batch, "CHUNK", 1)  # (the caller's chunks too)
    _reset()
    _assert_same(reference.adaptive_softmax(x, dtype=np.float32), whole)
    assert _fast.STATS["batch_rows"] == 9
