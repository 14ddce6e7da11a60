"""The reference's double-double pass for attention: bit for bit the mpmath path, sound bounds."""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from mpmath.libmp import from_man_exp, mpf_neg

from softmaxtheory import reference
from softmaxtheory import strategies as strat
from softmaxtheory.reference import _fast, _fast_attention
from softmaxtheory.reference import attention as attention_module
from softmaxtheory.spec import Constant, LogLength, PaperPolynomial

SCHEDULES = (PaperPolynomial(), Constant(1), Constant(2.5), LogLength(1.0))


def _reset() -> None:
    for key in _fast.STATS:
        _fast.STATS[key] = 0


def _both(q, k, v, **kw) -> tuple[np.ndarray, np.ndarray]:
    fast = reference.adaptive_attention(q, k, v, **kw)
    with _fast.pure_mpmath():
        slow = reference.adaptive_attention(q, k, v, **kw)
    return fast, slow


def _assert_same_bits(fast: np.ndarray, slow: np.ndarray) -> None:
    assert fast.dtype == slow.dtype
    np.testing.assert_array_equal(fast, slow)
    assert np.array_equal(np.signbit(fast), np.signbit(slow))


# ---------------------------------------------------------------------------
# the building blocks against exact arithmetic
# ---------------------------------------------------------------------------


@given(
    man=st.integers(1, 2**400),
    top=st.integers(-899, 989),
)
@example(man=1, top=-899)
@example(man=2**160 + 1, top=0)  # one bit past the 160 kept: the cut
@example(man=2**53 + 1, top=5)  # a remainder of one unit
@example(man=(1 << 300) - 1, top=989)
def test_shifts_are_double_doubles_within_zrel(man, top) -> None:
    bc = man.bit_length()
    z = mpf_neg(from_man_exp(man, top - bc))
    got = _fast_attention._dd_shifts([z])
    assert got is not None
    zh, zl = float(got[0][0]), float(got[1][0])
    exact = -Fraction(man) * Fraction(2) ** (top - bc)
    assert abs(Fraction(zh) + Fraction(zl) - exact) <= Fraction(_fast_attention.ZREL) * abs(exact)
    assert abs(zl) <= math.ulp(zh) / 2  # (the exponential's argument is normalised)


def test_shifts_beyond_the_range_are_dead_or_go_to_mpmath() -> None:
    huge = mpf_neg(from_man_exp(3, 989))  # 1.5 * 2**990
    zh, zl = _fast_attention._dd_shifts([(0, 0, 0, 0), huge])
    assert zh.tolist() == [0.0, -math.inf] and zl.tolist() == [0.0, 0.0]
    assert _fast_attention._dd_shifts([mpf_neg(from_man_exp(1, -901))]) is None
    assert _fast_attention._dd_shifts([from_man_exp(1, 0)]) is None  # a positive shift


# ---------------------------------------------------------------------------
# whole slices: the same bits as the mpmath path
# ---------------------------------------------------------------------------


@given(
    inputs=st.sampled_from(["float64", "float32", "float16"]).flatmap(
        lambda dt: st.tuples(
            st.just(dt),
            strat.attention_inputs(dt, max_len=9, max_d=4, masks=True, causal=True, scales=True),
        )
    ),
    schedule=st.sampled_from(SCHEDULES),
    entropy_eps=st.sampled_from([0.0, 0.0, 1e-3, 0.5, 1e-300]),
    poke=st.sampled_from([None, np.inf, -np.inf, np.nan, 0.0, 1e300, 5e-324]),
)
def test_slices_bit_for_bit_with_the_mpmath_path(inputs, schedule, entropy_eps, poke) -> None:
    """Every output the fast pass certifies is the mpmath path's (non-finite values too)."""
    dtype, kw = inputs
    v = kw.pop("v").astype(np.float64)
    if poke is not None:  # one value replaced: a non-finite column, a zero, a huge value
        v.reshape(-1)[v.size // 2] = poke
    fast, slow = _both(
        kw.pop("q"), kw.pop("k"), v, schedule=schedule, entropy_eps=entropy_eps, dtype=dtype, **kw
    )
    _assert_same_bits(fast, slow)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
@pytest.mark.parametrize("schedule", [PaperPolynomial(), Constant(1)])
@pytest.mark.parametrize("entropy_eps", [0.0, 1e-3])
def test_the_fast_pass_decides_typical_slices(dtype, schedule, entropy_eps) -> None:
    """Random heads in every dtype: each row is certified without mpmath, and correctly."""
    rng = np.random.default_rng(11)
    q = rng.standard_normal((2, 9, 6)).astype(dtype)
    k = (3.0 * rng.standard_normal((2, 21, 6))).astype(dtype)
    v = rng.standard_normal((2, 21, 5)).astype(dtype)
    _reset()
    fast, slow = _both(q, k, v, schedule=schedule, entropy_eps=entropy_eps, dtype=dtype)
    assert _fast.STATS["attention_fast"] == 18 and _fast.STATS["attention_fallback"] == 0
    _assert_same_bits(fast, slow)


def test_rows_chunked_one_at_a_time_give_the_same_bits(monkeypatch) -> None:
    rng = np.random.default_rng(5)
    q, k, v = (
        rng.standard_normal((7, 4)),
        rng.standard_normal((30, 4)),
        rng.standard_normal((30, 3)),
    )
    whole = reference.adaptive_attention(q, k, v)
    monkeypatch.setattr(_fast_attention, "_CHUNK", 1)
    _reset()
    one_by_one = reference.adaptive_attention(q, k, v)
    assert _fast.STATS["attention_fast"] == 7
    _assert_same_bits(one_by_one, whole)


def test_slices_certified_together_keep_their_own_values_and_cutoffs(monkeypatch) -> None:
    """Rows of several slices share one pass; each reads its own slice's values, and a
    slice with a value beyond 2**990 sends only its own rows to mpmath."""
    rng = np.random.default_rng(12)
    q, k = rng.standard_normal((3, 4, 2)), rng.standard_normal((3, 6, 2))
    v = rng.standard_normal((3, 6, 2)) * np.array([1.0, 1e-200, 1e200])[:, None, None]
    v[2, 0, 0] = 2.0**1000
    _reset()
    fast, slow = _both(q, k, v)
    assert _fast.STATS["attention_fast"] == 8 and _fast.STATS["attention_fallback"] == 4
    _assert_same_bits(fast, slow)
    monkeypatch.setattr(attention_module, "_PENDING_ITEMS", 1)  # one slice at a time
    _assert_same_bits(reference.adaptive_attention(q, k, v), fast)


def test_dead_keys_with_large_values_keep_their_row_off_the_fast_pass() -> None:
    """A live key's value 1e-70 and a key 210 nats below it (dead for the float32 cutoff,
    about 209.5 here) with value -1e30: the exact output is about -6e-62, -0.0 in float32.
    Without the dead keys' share of the error bound the fast pass certified +0.0."""
    q, k, v = np.array([[1.0]]), np.array([[0.0], [-210.0]]), np.array([[1e-70], [-1e30]])
    _reset()
    fast, slow = _both(q, k, v, scale=1.0, schedule=Constant(1), dtype=np.float32)
    assert _fast.STATS["attention_fallback"] == 1
    assert fast[0, 0] == 0.0 and np.signbit(fast[0, 0])
    _assert_same_bits(fast, slow)
    with mpmath.workprec(300):
        e = mpmath.exp(-210)
        assert (mpmath.mpf(1e-70) - e * mpmath.mpf(1e30)) / (1 + e) < 0


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_rounding_midpoint_is_left_to_mpmath(dtype) -> None:
    """Two tied keys whose values average to a midpoint of the format: no ball decides it
    (ties to even do), so the row goes to mpmath."""
    fmt_eps = float(np.finfo(dtype).eps)
    q, k = np.array([[1.0]]), np.array([[0.0], [0.0]])
    v = np.array([[1.0], [1.0 + fmt_eps]])
    _reset()
    fast, slow = _both(q, k, v, dtype=dtype)
    assert _fast.STATS["attention_fallback"] == 1
    assert fast[0, 0] == 1.0
    _assert_same_bits(fast, slow)


def test_the_mpmath_only_switch_turns_the_pass_off() -> None:
    rng = np.random.default_rng(2)
    q, k, v = rng.standard_normal((3, 2)), rng.standard_normal((4, 2)), rng.standard_normal((4, 1))
    _reset()
    with _fast.pure_mpmath():
        reference.adaptive_attention(q, k, v)
    assert _fast.STATS["attention_fast"] == 0
