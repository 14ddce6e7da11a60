"""Hypothesis strategies and small helpers shared by the reference test files."""

from __future__ import annotations

import math

import mpmath
import numpy as np
from hypothesis import strategies as st

NEG_INF = float("-inf")

#: Exactly representable inverse temperatures (dyadic), for Constant schedules.
DYADIC_BETAS = (0.125, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0)


def dyadic_values(bound: int = 2**10, shift: int = 4) -> st.SearchStrategy[float]:
    """Floats ``k / 2**shift`` with ``|k| <= bound``: few significant bits, exact arithmetic."""
    return st.integers(-bound, bound).map(lambda k: math.ldexp(float(k), -shift))


def dyadic_rows(
    min_size: int = 1, max_size: int = 10, bound: int = 2**10, shift: int = 4
) -> st.SearchStrategy[list[float]]:
    """Rows of :func:`dyadic_values`."""
    return st.lists(dyadic_values(bound, shift), min_size=min_size, max_size=max_size)


@st.composite
def logit_rows(
    draw,
    min_size: int = 1,
    max_size: int = 10,
    lo: float = -40.0,
    hi: float = 40.0,
    ties: bool = True,
    masks: bool = True,
) -> list[float]:
    """Regular rows: finite floats in [lo, hi], optional ties and ``-inf`` masks.

    At least one entry stays finite.
    """
    values = st.floats(lo, hi, allow_nan=False, allow_infinity=False)
    row = draw(st.lists(values, min_size=min_size, max_size=max_size))
    n = len(row)
    if ties and n >= 2 and draw(st.booleans()):
        # copy some entries onto others: exact ties
        for _ in range(draw(st.integers(1, n))):
            i, j = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
            row[j] = row[i]
    if masks and n >= 2 and draw(st.booleans()):
        keep = draw(st.integers(0, n - 1))
        for j in draw(st.sets(st.integers(0, n - 1), max_size=n - 1)):
            if j != keep:
                row[j] = NEG_INF
    return row


def ulps_away(value: float, k: int) -> float:
    """The float64 ``k`` steps from `value` (negative `k` goes down)."""
    direction = math.inf if k > 0 else -math.inf
    for _ in range(abs(k)):
        value = math.nextafter(value, direction)
    return value


def bits(a) -> np.ndarray:
    """The raw bit patterns of a float array (bitwise comparison, signed zeros and NaNs)."""
    a = np.asarray(a)
    view = {2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    return a.view(view)


def assert_bitwise_equal(got, expected, context: object = "") -> None:
    """Assert two float arrays of the same dtype and shape are identical bit for bit."""
    got = np.asarray(got)
    expected = np.asarray(expected)
    assert got.dtype == expected.dtype, (got.dtype, expected.dtype, context)
    assert got.shape == expected.shape, (got.shape, expected.shape, context)
    same = bits(got) == bits(expected)
    if not np.all(same):
        bad = np.flatnonzero(~same.ravel())
        i = int(bad[0])
        raise AssertionError(
            f"{len(bad)} value(s) differ; first at flat index {i}: got "
            f"{got.ravel()[i]!r}, expected {expected.ravel()[i]!r} ({context})"
        )


# ---------------------------------------------------------------------------
# the paper polynomial, exactly, in mpmath
# ---------------------------------------------------------------------------

PAPER_DECIMALS = ("-0.037", "0.481", "-2.3", "4.917", "-1.791")


def paper_P(h):
    """P(h) in mpmath at the current working precision (exact decimal coefficients)."""
    acc = mpmath.mpf(0)
    for c in PAPER_DECIMALS:
        acc = acc * h + mpmath.mpf(c)
    return acc


def paper_dP(h):
    """P'(h) in mpmath."""
    d = len(PAPER_DECIMALS) - 1
    acc = mpmath.mpf(0)
    for i, c in enumerate(PAPER_DECIMALS[:-1]):
        acc = acc * h + (d - i) * mpmath.mpf(c)
    return acc


def paper_constants(dps: int = 50) -> dict[str, mpmath.mpf]:
    """H*, beta_max, H_on, H_off computed here by root finding (not read from the library)."""
    with mpmath.workdps(dps):
        h_star = mpmath.findroot(paper_dP, 4.4)
        return {
            "H_star": +h_star,
            "beta_max": paper_P(h_star),
            "H_on": mpmath.findroot(lambda h: paper_P(h) - 1, 0.85),
            "H_off": mpmath.findroot(lambda h: paper_P(h) - 1, 5.9),
        }


def two_level_entropy(k: int, j: int, d):
    """Entropy of the row ``[0]*k + [-d]*j`` (mpmath, current precision)."""
    e = mpmath.exp(-d)
    s = k + j * e
    # H = log s - t/s, t = j e (-d)
    return mpmath.log(s) + j * e * d / s


def two_level_row_for_entropy(k: int, j: int, target, guess: float | None = None) -> float:
    """A float64 d (within an ulp or so) solving H([0]*k + [-d]*j) = target.

    H decreases from log(k + j) at d = 0 to log k as d grows: bisection.
    """
    with mpmath.workprec(300):
        target = mpmath.mpf(target)
        if not mpmath.log(k) < target < mpmath.log(k + j):
            raise ValueError("target entropy out of reach of this row shape")
        lo, hi = mpmath.mpf(0), mpmath.mpf(1)
        while two_level_entropy(k, j, hi) > target:
            hi *= 2
        for _ in range(120):
            mid = (lo + hi) / 2
            if two_level_entropy(k, j, mid) > target:
                lo = mid
            else:
                hi = mid
        return float(lo)
