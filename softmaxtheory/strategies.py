r"""Hypothesis strategies for softmax, entropy and attention inputs.

Needs Hypothesis (``pip install 'softmaxtheory[check]'``). Every strategy
produces numpy arrays of a chosen dtype (``float64``, ``float32``, ``float16``;
for bfloat16 kernels draw ``"bfloat16"``: float32 arrays whose values are
exact bfloat16 numbers).

* :func:`logit_rows`: one row, drawn from families that stress a kernel:
  bounded spread, ties, ``-inf`` masks, huge magnitudes, subnormals, one-hot,
  near-uniform, and rows whose entropy lies in the adaptive window
  :math:`(H_{\mathrm{on}}, H_{\mathrm{off}})` or next to a branch point
  (:func:`branch_points`), and translated rows whose finite entries all lie
  far from zero (below :math:`-10^4`, above :math:`10^4`, or near half the
  largest float), with or without masks;
* :func:`window_rows`: rows of 256 to 2048 items whose entropy lies in
  :math:`[5, H_{\mathrm{off}}]`, where β reacts most to an entropy error;
* :func:`logit_batches`: arrays of shape ``(..., n)`` of such rows;
* :func:`shapes`, :func:`chunkings`: batch shapes and chunkings of a row;
* :func:`attention_inputs`: ``q, k, v`` with an optional mask or causal flag;
* :func:`cast`: rounds values to one of the four dtypes (the last step of every
  strategy, and the one a repro snippet uses to rebuild an input).

A strategy checks its arguments when it is built, earlier than Hypothesis'
own strategies (which raise ``InvalidArgument`` when first drawn from):
``logit_rows(families=["bogus"])`` raises :class:`ValueError` or
:class:`TypeError` at once, naming the argument. Every parameter but the
leading one is keyword-only.

Examples
--------
>>> from hypothesis import HealthCheck, given, settings
>>> from softmaxtheory.strategies import logit_rows
>>> @settings(max_examples=5, derandomize=True, database=None,
...           suppress_health_check=[HealthCheck.too_slow])
... @given(logit_rows(max_size=8))
... def check(x):
...     assert x.ndim == 1 and 1 <= x.shape[0] <= 8
>>> check()
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st
from numpy.typing import ArrayLike

from ._check.error_model import round_to_format
from ._formats import Format, format_named
from .spec import PaperPolynomial

__all__ = [
    "ATTENTION_SCALES",
    "FAMILIES",
    "HALF_MAX_FRACTION",
    "attention_inputs",
    "branch_points",
    "cast",
    "chunkings",
    "entropy_targets",
    "logit_batches",
    "logit_rows",
    "row_with_entropy",
    "shapes",
    "translations",
    "window_rows",
]

#: The families :func:`logit_rows` draws from.
FAMILIES: tuple[str, ...] = (
    "spread",
    "ties",
    "masked",
    "huge",
    "subnormal",
    "one_hot",
    "near_uniform",
    "entropy",
    "translated",
)

#: Largest ``|x|`` of a translated row, as a fraction of the largest finite float: with
#: :math:`\beta \le \beta_{\max} = 2.4214` the scaled logits stay finite (0.4 < 1/2.4214).
HALF_MAX_FRACTION = 0.4


def cast(values: ArrayLike, dtype: Any) -> np.ndarray:
    """Round `values` to `dtype`, to nearest (ties to even).

    Every strategy here ends with it, and the conformance suite's repro
    snippets call it to rebuild an input in the kernel's dtype. Values beyond
    the format's range become infinite. bfloat16 is reached through float32:
    float64 to float32, then to bfloat16, each to nearest, as torch rounds a
    float64 tensor with ``.to(torch.bfloat16)``; so a value within float32's
    rounding of a bfloat16 tie goes to the tie's even side
    (``1 + 2**-8 + 2**-30`` gives 1.0, though 1.0078125 is nearer).

    Parameters
    ----------
    values : array_like
        Real numbers (read as float64 first).
    dtype : str
        ``"float64"``, ``"float32"``, ``"float16"`` or ``"bfloat16"`` (numpy
        and torch spellings are accepted too).

    Returns
    -------
    numpy.ndarray
        An array of `dtype`; bfloat16 values come as a float32 array, which
        holds them exactly.

    Raises
    ------
    ValueError
        If `dtype` is not one of the four.

    Examples
    --------
    >>> from softmaxtheory.strategies import cast
    >>> cast([0.1, 1 + 2**-9, -3.0], "bfloat16")
    array([ 0.10009766,  1.        , -3.        ], dtype=float32)
    """
    fmt = format_named(dtype)
    a = np.asarray(values, dtype=np.float64)
    with np.errstate(over="ignore"):
        return round_to_format(a, fmt).astype(fmt.storage)


# ---------------------------------------------------------------------------
# argument checks, run when a strategy is built (not when it draws)
# ---------------------------------------------------------------------------


def _check_int(value: Any, name: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < least:
        raise ValueError(f"{name} must be >= {least}, got {value!r}")
    return int(value)


def _check_sizes(min_size: Any, max_size: Any, least: int) -> tuple[int, int]:
    lo = _check_int(min_size, "min_size", least)
    hi = _check_int(max_size, "max_size", least)
    if lo > hi:
        raise ValueError(f"min_size must be <= max_size, got min_size={lo}, max_size={hi}")
    return lo, hi


def _check_bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool | np.bool_):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return bool(value)


def _check_families(families: Any) -> tuple[str, ...]:
    if isinstance(families, str) or not isinstance(families, Iterable):
        raise TypeError(f"families must be a sequence of family names, got {families!r}")
    names = tuple(families)
    if not names or any(f not in FAMILIES for f in names):
        raise ValueError(
            f"families must be a non-empty sequence of names from {FAMILIES}, got {families!r}"
        )
    return names


@functools.cache
def branch_points() -> dict[str, float]:
    r"""The entropies (nats) where the paper's :math:`\beta(H)` changes behaviour.

    Returns
    -------
    dict
        ``threshold`` (0.5), ``H_on`` and ``H_off`` (where :math:`P(H) = 1`)
        and ``H_star`` (where :math:`\beta` is largest), as float64 values.

    Examples
    --------
    >>> from softmaxtheory.strategies import branch_points
    >>> pts = branch_points()
    >>> round(pts["H_on"], 6), round(pts["H_off"], 6), round(pts["H_star"], 6)
    (0.848582, 5.944521, 4.412402)
    """
    from . import bounds

    h_on, h_off = bounds.adaptive_window()
    return {
        "threshold": float(PaperPolynomial().exact_threshold),
        "H_on": h_on,
        "H_off": h_off,
        "H_star": bounds.adaptive_beta_argmax(),
    }


def _two_level_entropy(k: int, j: int, d: float) -> float:
    e = math.exp(-d)
    s = k + j * e
    return math.log(s) + j * e * d / s


def row_with_entropy(target: float, n: int, k: int = 1) -> np.ndarray | None:
    r"""The float64 row ``[0]*k + [-d]*(n-k)`` whose entropy is `target` (to ~1e-12).

    Returns ``None`` when no such row exists (`target` outside
    :math:`(\log k, \log n)`).

    Raises
    ------
    ValueError
        If `k` or `n` is not a positive integer.
    """
    for name, value in (("n", n), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    j = n - k
    if j < 1 or not math.log(k) < target < math.log(n):
        return None
    lo, hi = 0.0, 1.0
    while _two_level_entropy(k, j, hi) > target:
        hi *= 2.0
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        if _two_level_entropy(k, j, mid) > target:
            lo = mid
        else:
            hi = mid
    return np.array([0.0] * k + [-0.5 * (lo + hi)] * j)


def translations(dtype: str) -> tuple[tuple[str, float], ...]:
    r"""Where translated rows are put: ``(side, magnitude)`` pairs for `dtype`.

    ``below`` rows have every finite entry at or below ``-magnitude``, ``above``
    rows at or above ``+magnitude``; the magnitudes are :math:`10^4`,
    :math:`3 \cdot 10^4` and :data:`HALF_MAX_FRACTION` of the largest float
    (for float16, whose largest float is 65504, that is 26201.6).
    """
    half = HALF_MAX_FRACTION * format_named(dtype).max_finite
    mags = sorted({1e4, min(3e4, half), half})
    return tuple((side, m) for side in ("below", "above") for m in mags)


def _translate(row: np.ndarray, side: str, mag: float, fmt: Format) -> np.ndarray:
    """Shift `row` so that every finite entry lies beyond `mag` on `side` after rounding.

    The target is ``mag * (1 + 2**-6)``: rounding to any of the four formats
    (relative error at most ``2**-9``) cannot bring an entry back inside `mag`.
    """
    live = row > -np.inf
    vals = row[live]
    edge = mag * (1.0 + 2.0**-6)
    c = -edge - float(np.max(vals)) if side == "below" else edge - float(np.min(vals))
    return np.where(live, cast(np.where(live, row + c, 0.0), fmt.name), -np.inf)


def entropy_targets() -> st.SearchStrategy[float]:
    r"""Entropies over :math:`(H_{\mathrm{on}}, H_{\mathrm{off}})` and around each branch point."""
    pts = branch_points()
    near = st.sampled_from(sorted(pts.values())).flatmap(
        lambda h: st.floats(-1e-3, 1e-3).map(lambda e: h + e) | st.just(h)
    )
    window = st.floats(pts["H_on"], pts["H_off"])
    return st.one_of(near, window, st.floats(0.01, 7.0))


def _reachable(target: float, limit: float) -> float:
    """`target`, or, above `limit`, `target` folded back into ``(H_on, limit]``."""
    if target <= limit:
        return target
    h_on = branch_points()["H_on"]
    return h_on + math.fmod(target - h_on, limit - h_on)


# ---------------------------------------------------------------------------
# the row families: one strategy each, for a length range and a format
# ---------------------------------------------------------------------------


#: Rows longer than this draw their values from a numpy generator seeded by one drawn
#: integer: as ``n`` separate Hypothesis draws, a row of 600 items made the base example
#: too large for Hypothesis' health check (``large_base_example``).
_LIST_LIMIT = 64


def _values(
    draw: Any, n: int, elements: st.SearchStrategy[Any], sample: Callable[[Any, int], Any]
) -> np.ndarray:
    """`n` values: drawn from `elements` each, or ``sample(rng, n)`` past `_LIST_LIMIT`."""
    if n <= _LIST_LIMIT:
        return np.array(draw(st.lists(elements, min_size=n, max_size=n)), dtype=np.float64)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return np.asarray(sample(rng, n), dtype=np.float64)


def _uniform_values(draw: Any, n: int) -> np.ndarray:
    """``lo + spread * U`` with ``n`` draws of ``U`` in [0, 1]: the base of three families."""
    spread = draw(st.sampled_from([0.5, 2.0, 5.69, 10.0, 30.0]))
    lo = draw(st.floats(-50, 50))
    vals = _values(draw, n, st.floats(0, 1), lambda rng, k: rng.random(k))
    return lo + spread * vals


@st.composite
def _spread_rows(draw: Any, min_size: int, max_size: int, fmt: Format) -> np.ndarray:
    n = draw(st.integers(min_size, max_size))
    return cast(_uniform_values(draw, n), fmt.name)


@st.composite
def _tied_rows(draw: Any, min_size: int, max_size: int, fmt: Format) -> np.ndarray:
    n = draw(st.integers(min_size, max_size))
    row = _uniform_values(draw, n)
    if n >= 2:
        for _ in range(draw(st.integers(1, n))):
            i, j = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
            row[j] = row[i]
    return cast(row, fmt.name)


@st.composite
def _masked_rows(draw: Any, min_size: int, max_size: int, fmt: Format) -> np.ndarray:
    n = draw(st.integers(min_size, max_size))
    row = _uniform_values(draw, n)
    if n >= 2:
        keep = draw(st.integers(0, n - 1))
        for j in draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=n - 1)):
            if j != keep:
                row[j] = -np.inf
    return cast(row, fmt.name)


@st.composite
def _huge_rows(draw: Any, min_size: int, max_size: int, fmt: Format) -> np.ndarray:
    n = draw(st.integers(min_size, max_size))
    mag = draw(st.sampled_from([1e3, 1e4, 3e4, 1e6, 1e10, 1e30, 1e300]))
    sign = draw(st.sampled_from([1.0, -1.0]))
    spread = draw(st.sampled_from([0.0, 1.0, 10.0, 100.0, 1000.0]))
    offs = _values(draw, n, st.floats(0, 1), lambda rng, k: rng.random(k))
    # |x| <= mag + spread, and beta * x stays finite (it binds for float16 only)
    mag = min(mag, HALF_MAX_FRACTION * fmt.max_finite - spread)
    return cast(sign * mag + spread * offs, fmt.name)


@st.composite
def _subnormal_rows(draw: Any, min_size: int, max_size: int, fmt: Format) -> np.ndarray:
    n = draw(st.integers(min_size, max_size))
    ks = _values(draw, n, st.integers(-8, 8), lambda rng, k: rng.integers(-8, 9, k))
    return cast(ks * fmt.smallest_subnormal, fmt.name)


@st.composite
def _one_hot_rows(draw: Any, min_size: int, max_size: int, fmt: Format) -> np.ndarray:
    n = draw(st.integers(min_size, max_size))
    gap = draw(st.sampled_from([20.0, 40.0, 100.0, 800.0]))
    row = np.full(n, -gap)
    row[draw(st.integers(0, n - 1))] = 0.0
    return cast(row, fmt.name)


@st.composite
def _near_uniform_rows(draw: Any, min_size: int, max_size: int, fmt: Format) -> np.ndarray:
    n = draw(st.integers(min_size, max_size))
    base = draw(st.floats(-10, 10))
    noise = _values(draw, n, st.floats(-1e-3, 1e-3), lambda rng, k: rng.uniform(-1e-3, 1e-3, k))
    return cast(base + noise, fmt.name)


@st.composite
def _entropy_rows(draw: Any, min_size: int, max_size: int, fmt: Format) -> np.ndarray:
    """A two-level row (:func:`row_with_entropy`) at an entropy of :func:`entropy_targets`.

    A target that ``N = max(max_size, 8)`` items cannot reach (above ``log(N - 1)``) is
    folded back below it (:func:`_reachable`; its row has ``N`` items), a row is
    lengthened (up to ``N``) when its target needs it, and ``k`` (1 to 3 top entries)
    stays below ``exp(target)``: the row always exists, never a constant stand-in.
    The draws are those of the drawn target (``k`` is drawn, then lowered), so every
    example's choices, and the rows that were reachable, are unchanged. Its ``k`` top
    entries go to ``k`` distinct drawn positions: for a two-level row that is the same
    as a random permutation, at ``k <= 3`` draws instead of ``n``.
    """
    n = draw(st.integers(min_size, max_size))
    longest = max(max_size, 8)
    drawn = draw(entropy_targets())
    n = max(n, min(max(2, math.ceil(math.exp(drawn)) + 1), longest))
    k = draw(st.integers(1, max(1, min(3, n - 1))))
    target = _reachable(drawn, math.log(longest - 1) - 1e-9)  # folded: n == longest
    tops_wanted = max(j for j in range(1, k + 1) if math.log(j) < target)
    two_level = row_with_entropy(target, n, tops_wanted)
    if two_level is None:  # pragma: no cover - the target is reachable by construction
        raise AssertionError(f"no two-level row of {n} items has entropy {target}")
    shift = draw(st.sampled_from([0.0, 1.0, -3.5, 17.25]))
    tops = draw(st.lists(st.integers(0, n - 1), min_size=k, max_size=k, unique=True))
    tops = tops[:tops_wanted]
    row = np.full(n, two_level[-1])
    row[tops] = two_level[0]
    return cast(row + shift, fmt.name)


@st.composite
def _translated_rows(draw: Any, base: st.SearchStrategy[np.ndarray], fmt: Format) -> np.ndarray:
    row = draw(base).astype(np.float64)
    if row.shape[0] >= 2 and draw(st.booleans()):
        keep = draw(st.integers(0, row.shape[0] - 1))
        drop = draw(st.sets(st.integers(0, row.shape[0] - 1), min_size=1, max_size=8))
        row[[j for j in drop if j != keep]] = -np.inf
    side, mag = draw(st.sampled_from(translations(fmt.name)))
    return cast(_translate(row, side, mag, fmt), fmt.name)


_Family = Callable[[int, int, Format], st.SearchStrategy[np.ndarray]]

_FAMILY_ROWS: dict[str, _Family] = {
    "spread": _spread_rows,
    "ties": _tied_rows,
    "masked": _masked_rows,
    "huge": _huge_rows,
    "subnormal": _subnormal_rows,
    "one_hot": _one_hot_rows,
    "near_uniform": _near_uniform_rows,
    "entropy": _entropy_rows,
    "translated": lambda lo, hi, fmt: _translated_rows(
        _rows(lo, hi, fmt, ("spread", "ties", "entropy")), fmt
    ),
}


@functools.cache
def _rows(
    min_size: int, max_size: int, fmt: Format, families: tuple[str, ...]
) -> st.SearchStrategy[np.ndarray]:
    """:func:`logit_rows` for checked arguments (cached: batches build one per length)."""
    return st.one_of(*(_FAMILY_ROWS[f](min_size, max_size, fmt) for f in families))


def logit_rows(
    *,
    min_size: int = 1,
    max_size: int = 64,
    dtype: str = "float64",
    families: Iterable[str] = FAMILIES,
) -> st.SearchStrategy[np.ndarray]:
    r"""One row of logits of `dtype`, from one of :data:`FAMILIES`.

    At least one entry is finite (a regular row in the special-value table).
    The strategy is Hypothesis' ``one_of`` over one strategy per family, each
    family equally likely; it draws 1-d numpy arrays of `dtype` (float32 arrays
    holding bfloat16 values).

    Rows of the ``entropy`` family are two-level rows (:func:`row_with_entropy`,
    then rounded to `dtype`) at a target of :func:`entropy_targets` that a row
    of ``N = max(max_size, 8)`` items can reach: a target above
    :math:`L = \log(N - 1)` is folded back into :math:`(H_{\mathrm{on}}, L]`
    (``H_on + fmod(target - H_on, L - H_on)``). A row shorter than its target
    needs is lengthened, up to ``N`` items (the one way a row exceeds
    `max_size`; the ``translated`` family moves such rows too). So with the
    default ``max_size=64`` every entropy is below
    :math:`\log 63 \approx 4.14`, and no row is near :math:`H^*` (4.412) or
    :math:`H_{\mathrm{off}}` (5.945): those need ``max_size >= 84`` and
    ``max_size >= 384`` (``>= 383`` for :math:`H_{\mathrm{off}}` itself).

    Parameters
    ----------
    min_size, max_size : int
        Row length range, ``1 <= min_size <= max_size``.
    dtype : str
        ``float64``, ``float32``, ``float16`` or ``bfloat16``.
    families : sequence of str
        The families to draw from (names from :data:`FAMILIES`).

    Raises
    ------
    ValueError, TypeError
        When the strategy is built, for an argument out of range or of the
        wrong type; the message names the argument.

    Notes
    -----
    How examples shrink: towards an earlier family of `families` (with the
    default order, towards a plain ``spread`` row), a shorter row, the first
    choice of each list of options (the smallest spread or gap, the first
    shift, a translation below :math:`-10^4`), the top entries of an entropy
    row first, and simpler floats (zero, then small integers). A row of more
    than 64 items draws its values from a numpy generator
    seeded by one drawn integer, so they shrink only as that seed does; drawn one
    by one, 600 values made Hypothesis' smallest example too large for its
    health check.
    """
    fmt = format_named(dtype)
    lo, hi = _check_sizes(min_size, max_size, 1)
    return _rows(lo, hi, fmt, _check_families(families))


def _row_at_entropy(g: np.ndarray, target: float) -> np.ndarray:
    """``s * g`` with the scale ``s >= 0`` for which its entropy is `target` (bisection, T4)."""

    def entropy(s: float) -> float:
        z = s * (g - np.max(g))
        e = np.exp(z)
        p = e / np.sum(e)
        return float(-np.sum(np.where(p > 0, p * z, 0.0)) + np.log(np.sum(e)))

    lo, hi = 0.0, 1.0
    while entropy(hi) > target and hi < 1e6:
        hi *= 2.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if entropy(mid) > target else (lo, mid)
    return 0.5 * (lo + hi) * g


def _entropy64(row: np.ndarray) -> float:
    """A finite row's entropy in float64 (its differences to the max exact for 16-bit rows)."""
    z = row.astype(np.float64) - float(np.max(row))
    e = np.exp(z)
    total = float(np.sum(e))
    return math.log(total) - float(np.sum(e * z)) / total


def _ulp(value: float, fmt: Format) -> float:
    """The spacing of `fmt`'s numbers at ``|value|`` (normal range)."""
    exponent = math.frexp(abs(value))[1] if value else fmt.emin + 1
    return math.ldexp(1.0, max(exponent, fmt.emin + 1) - fmt.precision)


def _scaled_row(
    base: float, d: np.ndarray, floor: float, target: float, band: tuple[float, float], fmt: Format
) -> np.ndarray | None:
    """``cast(base + max(s * d, -floor))`` at a scale ``s`` where its entropy lies in `band`.

    The scale is found by bisection on the *rounded* row, so the entropy promised is
    that of the row in `fmt`; ``None`` when no scale is found (the grid too coarse).
    Each entry is monotone in ``s`` (rounding is), so the entropy is monotone but
    for the jumps of single entries, far smaller than `band` in practice.
    """
    spread = float(np.ptp(d))
    if spread == 0.0:
        return None
    # unclamped, s * d stays far inside the format; clamped, s may pass the grid's spacing
    cap = (0.01 * fmt.max_finite if math.isinf(floor) else 2.0**20 * floor) / spread

    def row(s: float) -> np.ndarray:
        return cast(base + np.maximum(s * d, -floor), fmt.name)

    lo, hi = 0.0, max(1.0, _ulp(base, fmt) / spread)
    while _entropy64(row(hi)) > target:
        if hi > cap:
            return None
        lo, hi = hi, 2.0 * hi
    for _ in range(64):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if _entropy64(row(mid)) > target else (lo, mid)
    inside = [r for r in (row(lo), row(hi)) if band[0] <= _entropy64(r) <= band[1]]
    return min(inside, key=lambda r: abs(_entropy64(r) - target)) if inside else None


def _far_row(
    g: np.ndarray, side: str, mag: float, target: float, band: tuple[float, float], fmt: Format
) -> np.ndarray | None:
    r"""A row beyond `mag` on `side` (as :func:`translations`) whose entropy lies in `band`.

    Its top entry ``t`` is a number of `fmt` (``-m`` below, ``m + f`` above, with ``m``
    the least number of `fmt` at or above `mag` and ``f = max(128, 2 ulp)``), and the
    others are ``t + max(s (g - max g), -f)`` rounded to `fmt` (entries more than 128
    below the top weigh nothing). The scale ``s`` is solved on those rounded values,
    so a coarse grid (ulp 16 near 26200 in float16, :math:`2^{971}` near 0.4 times the
    largest float64) gives a row of tied tops, not a flat one. ``None`` when no such row
    keeps :math:`\beta_{\max} |x|` finite.
    """
    from . import bounds

    least = _round_up(mag, fmt)
    floor = max(128.0, 2.0 * _ulp(least, fmt))
    top = -least if side == "below" else _round_up(least + floor, fmt)
    row = _scaled_row(top, g - np.max(g), floor, target, band, fmt)
    if row is None:
        return None
    far = np.all(row <= -mag) if side == "below" else np.all(row >= mag)
    finite = float(np.max(np.abs(row))) * bounds.adaptive_beta_max() < fmt.max_finite
    return row if far and finite else None


def _round_up(value: float, fmt: Format) -> float:
    """The least number of `fmt` at or above `value` (a positive normal number)."""
    near = float(cast([value], fmt.name)[0])
    return near if near >= value else near + _ulp(near, fmt)


def _window_band(n: int) -> tuple[float, float]:
    """The entropies :func:`window_rows` promises for `n` items: ``[5, H_off]`` when it can."""
    high = min(branch_points()["H_off"], math.log(n) - 0.05)
    return min(5.0, high - 0.05), high


def window_rows(
    dtype: str = "float64",
    *,
    min_size: int = 256,
    max_size: int = 2048,
    translated: bool = True,
) -> st.SearchStrategy[np.ndarray]:
    r"""A row of `min_size` to `max_size` items whose entropy lies in :math:`[5, H_{\mathrm{off}}]`.

    There :math:`|P'(H)|` is largest relative to β and the entropy is large, so
    an entropy computed with float16 statistics moves β by several float16
    ulps: the rows that tell such a kernel from a backward-stable one. The
    logits are a scaled Gaussian, uniform or two-cluster sample, scaled
    (bisection) to the drawn entropy; with `translated` the row may also be
    moved far from zero (:func:`translations`).

    The entropy promised is that of the row as drawn, in `dtype` (as
    :func:`softmaxtheory.reference.entropy` computes it): the scale is solved on
    the rounded values. A translated row has its top entry on the format's grid
    at the drawn magnitude and the others at most ``max(128, 2 ulp)`` below it;
    where the grid is coarse (ulp 16 near 26200 in float16, ``2**971`` near
    0.4 times the largest float64) that is a row of tied top entries (about
    :math:`e^H` of them), not a flat one. Should a magnitude give no such row,
    the next smaller one of :func:`translations` is used (none in practice).
    Rows of at most 164 items (none with the default `min_size`) have their
    entropy in :math:`[\log n - 0.1, \log n - 0.05]` instead.

    The arguments are checked when the strategy is built (``2 <= min_size <=
    max_size``). Examples shrink towards shorter rows, a lower entropy and the
    Gaussian shape; the sample itself comes from a numpy generator seeded by a
    drawn integer, so its values shrink only as that seed does.
    """
    fmt = format_named(dtype)
    lo, hi = _check_sizes(min_size, max_size, 2)
    return _window_rows(fmt, lo, hi, _check_bool(translated, "translated"))


@st.composite
def _window_rows(
    draw: Any, fmt: Format, min_size: int, max_size: int, translated: bool
) -> np.ndarray:
    n = draw(st.integers(min_size, max_size))
    low, high = _window_band(n)
    band = (low + 1e-9, high - 1e-9)  # inside, whatever the float64 entropy's error
    target = min(max(draw(st.floats(min(5.0, high), high)), band[0]), band[1])
    shape = draw(st.sampled_from(["normal", "uniform", "clusters"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if shape == "normal":
        g = rng.standard_normal(n)
    elif shape == "uniform":
        g = rng.random(n)
    else:
        g = np.where(rng.random(n) < 0.2, 1.0, 0.0) + 0.1 * rng.standard_normal(n)
    shift = draw(st.sampled_from([0.0, 0.0, 1.5, -2.25]))
    if translated and draw(st.integers(0, 3)) == 0:
        side, mag = draw(st.sampled_from(translations(fmt.name)))
        # the drawn magnitude, else the largest smaller one at which the row keeps its entropy
        for m in sorted((m for sd, m in translations(fmt.name) if sd == side and m <= mag))[::-1]:
            row = _far_row(g, side, m, target, band, fmt)
            if row is not None:
                return row
    row = _scaled_row(shift, g, math.inf, target, band, fmt)
    assume(row is not None)  # the grid near `shift` is fine: never seen to fail
    return row


def shapes(max_dims: int = 3, max_side: int = 3) -> st.SearchStrategy[tuple[int, ...]]:
    """Batch shapes (the leading dimensions of ``(..., n)``), the empty shape included.

    Shapes shrink towards fewer and shorter dimensions, down to ``()``.
    """
    dims = _check_int(max_dims, "max_dims", 0)
    side = _check_int(max_side, "max_side", 1)
    return st.lists(st.integers(1, side), min_size=0, max_size=dims).map(tuple)


def logit_batches(
    batch_shapes: st.SearchStrategy[tuple[int, ...]] | None = None,
    *,
    min_size: int = 1,
    max_size: int = 32,
    dtype: str = "float64",
    families: Iterable[str] = FAMILIES,
) -> st.SearchStrategy[np.ndarray]:
    """An array of shape ``batch + (n,)`` whose rows come from :func:`logit_rows`.

    `batch_shapes` draws the batch shape (default :func:`shapes`); the other
    arguments are those of :func:`logit_rows`, checked when the strategy is
    built. Examples shrink as the batch shape and the rows do.
    """
    if batch_shapes is not None and not isinstance(batch_shapes, st.SearchStrategy):
        raise TypeError(f"batch_shapes must be a Hypothesis strategy or None, got {batch_shapes!r}")
    fmt = format_named(dtype)
    lo, hi = _check_sizes(min_size, max_size, 1)
    names = _check_families(families)
    return _logit_batches(
        batch_shapes if batch_shapes is not None else shapes(), lo, hi, fmt, names
    )


@st.composite
def _logit_batches(
    draw: Any,
    batch_shapes: st.SearchStrategy[tuple[int, ...]],
    min_size: int,
    max_size: int,
    fmt: Format,
    families: tuple[str, ...],
) -> np.ndarray:
    batch = draw(batch_shapes)
    n = draw(st.integers(min_size, max_size))
    count = int(np.prod(batch, dtype=np.int64)) if batch else 1
    rows = _rows(n, n, fmt, families)
    return np.stack([_fit(draw(rows), n) for _ in range(count)]).reshape(*batch, n)


def _fit(row: np.ndarray, n: int) -> np.ndarray:
    """Trim or extend (by repeating its entries) a row to length `n`, keeping one finite entry."""
    if row.shape[0] >= n:
        finite = np.flatnonzero(row > -np.inf)
        out = row[:n].copy()
        if not np.any(out > -np.inf):
            out[0] = row[finite[0]]
        return out
    reps = -(-n // row.shape[0])
    return np.tile(row, reps)[:n]


def chunkings(n: int, *, max_chunks: int = 8) -> st.SearchStrategy[list[int]]:
    """Positive chunk sizes summing to `n` (a single chunk when ``n <= 1``).

    Examples shrink towards fewer cuts, placed earlier.
    """
    n = _check_int(n, "n", 0)
    most = _check_int(max_chunks, "max_chunks", 1)
    if n <= 1:
        return st.just([n])
    return st.sets(st.integers(1, n - 1), max_size=most - 1).map(
        lambda cuts: [b - a for a, b in itertools.pairwise([0, *sorted(cuts), n])]
    )


def attention_inputs(
    dtype: str = "float64",
    *,
    max_len: int = 12,
    max_d: int = 8,
    batch: bool = True,
    masks: bool = False,
    causal: bool = False,
    scales: bool = False,
) -> st.SearchStrategy[dict[str, Any]]:
    r"""Inputs of attention: ``{"q", "k", "v", "mask", "is_causal"}`` (and ``"scale"``).

    Shapes ``(..., L, d)``, ``(..., S, d)``, ``(..., S, dv)``; the logit scale
    varies (sharp and flat heads). With ``masks=True`` a boolean mask
    (``True`` attends, every query keeps one key) may be drawn; with
    ``causal=True`` the causal flag may be set, with ``L == S`` or not (the
    mask is aligned to the top left, as in ``scaled_dot_product_attention``:
    query :math:`i` attends keys :math:`j \le i`; a kernel that aligns it to
    the bottom right, as FlashAttention does when ``L != S``, differs). With
    ``scales=True`` the dict also holds ``"scale"``: ``None`` (the kernel's
    default, :math:`1/\sqrt{d}`) or a scale of either sign or 0, which kernels
    that assume a positive scale get wrong (a causal mask applied before the
    scale gives :math:`0 \cdot (-\infty)` and :math:`-(-\infty)`).

    The arguments are checked when the strategy is built. Examples shrink
    towards smaller shapes and a smaller gain; the values come from a numpy
    generator seeded by a drawn integer, so they shrink only as that seed does.
    """
    fmt = format_named(dtype)
    return _attention_inputs(
        fmt,
        _check_int(max_len, "max_len", 1),
        _check_int(max_d, "max_d", 1),
        _check_bool(batch, "batch"),
        _check_bool(masks, "masks"),
        _check_bool(causal, "causal"),
        _check_bool(scales, "scales"),
    )


#: The scales ``attention_inputs(scales=True)`` draws (None: the kernel's default).
ATTENTION_SCALES = (None, None, 0.25, 2.0, 0.0, -0.5, -3.0)


@st.composite
def _attention_inputs(
    draw: Any,
    fmt: Format,
    max_len: int,
    max_d: int,
    batch: bool,
    masks: bool,
    causal: bool,
    scales: bool = False,
) -> dict[str, Any]:
    lead = draw(st.lists(st.integers(1, 2), max_size=2).map(tuple)) if batch else ()
    L = draw(st.integers(1, max_len))
    S = draw(st.integers(1, max_len))
    d = draw(st.integers(1, max_d))
    dv = draw(st.integers(1, max_d))
    is_causal = causal and draw(st.booleans())
    if is_causal and draw(st.booleans()):
        S = L  # else L != S is likely: the mask is aligned to the top left (keys j > i masked)
    gain = draw(st.sampled_from([0.1, 1.0, 3.0, 8.0]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    q = cast(gain * rng.standard_normal((*lead, L, d)), fmt.name)
    k = cast(rng.standard_normal((*lead, S, d)), fmt.name)
    v = cast(rng.standard_normal((*lead, S, dv)), fmt.name)
    mask = None
    if masks and not is_causal and draw(st.booleans()):
        m = rng.random((L, S)) < draw(st.sampled_from([0.3, 0.7]))
        m[np.arange(L), rng.integers(0, S, L)] = True
        mask = m
    out = {"q": q, "k": k, "v": v, "mask": mask, "is_causal": is_causal}
    if scales:
        out["scale"] = draw(st.sampled_from(ATTENTION_SCALES))
    return out
