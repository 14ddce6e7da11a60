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
* :func:`attention_inputs`: ``q, k, v`` with an optional mask or causal flag.

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
from typing import Any

import numpy as np
from hypothesis import strategies as st

from .spec import PaperPolynomial

__all__ = [
    "FAMILIES",
    "HALF_MAX_FRACTION",
    "attention_inputs",
    "branch_points",
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

_MAX_FINITE = {"float64": 1.79e308, "float32": 3.4e38, "bfloat16": 3.38e38, "float16": 65504.0}
_TINY = {"float64": 5e-324, "float32": 1e-45, "bfloat16": 1e-40, "float16": 6e-8}


def _np_dtype(dtype: str) -> np.dtype:
    return np.dtype("float32" if dtype == "bfloat16" else dtype)


def _cast(values: Any, dtype: str) -> np.ndarray:
    """Round to `dtype` (bfloat16: nearest even, kept as float32)."""
    from ._testing_model import FORMATS, round_to_format

    a = np.asarray(values, dtype=np.float64)
    with np.errstate(over="ignore"):
        return round_to_format(a, FORMATS[dtype]).astype(_np_dtype(dtype))


def _check_dtype(dtype: str) -> str:
    if dtype not in _MAX_FINITE:
        raise ValueError(f"dtype must be float64, float32, float16 or bfloat16, got {dtype!r}")
    return dtype


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
    """
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
    top = float(np.finfo(_np_dtype(_check_dtype(dtype))).max)
    half = HALF_MAX_FRACTION * top
    mags = sorted({1e4, min(3e4, half), half})
    return tuple((side, m) for side in ("below", "above") for m in mags)


def _translate(row: np.ndarray, side: str, mag: float, dtype: str) -> np.ndarray:
    """Shift `row` so that every finite entry lies beyond `mag` on `side` after rounding.

    The target is ``mag * (1 + 2**-6)``: rounding to any of the four formats
    (relative error at most ``2**-9``) cannot bring an entry back inside `mag`.
    """
    live = row > -np.inf
    vals = row[live]
    edge = mag * (1.0 + 2.0**-6)
    c = -edge - float(np.max(vals)) if side == "below" else edge - float(np.min(vals))
    return np.where(live, _cast(np.where(live, row + c, 0.0), dtype), -np.inf)


def entropy_targets() -> st.SearchStrategy[float]:
    r"""Entropies over :math:`(H_{\mathrm{on}}, H_{\mathrm{off}})` and around each branch point."""
    pts = branch_points()
    near = st.sampled_from(sorted(pts.values())).flatmap(
        lambda h: st.floats(-1e-3, 1e-3).map(lambda e: h + e) | st.just(h)
    )
    window = st.floats(pts["H_on"], pts["H_off"])
    return st.one_of(near, window, st.floats(0.01, 7.0))


@st.composite
def logit_rows(
    draw: Any,
    min_size: int = 1,
    max_size: int = 64,
    dtype: str = "float64",
    families: tuple[str, ...] = FAMILIES,
) -> np.ndarray:
    """One row of logits of `dtype`, from one of :data:`FAMILIES`.

    At least one entry is finite (a regular row in the special-value table);
    rows of the ``entropy`` family may be longer than `max_size` only up to
    ``max(max_size, 8)``.

    Parameters
    ----------
    min_size, max_size : int
        Row length range.
    dtype : str
        ``float64``, ``float32``, ``float16`` or ``bfloat16``.
    families : tuple of str
        The families to draw from.
    """
    dtype = _check_dtype(dtype)
    if not 1 <= min_size <= max_size:
        raise ValueError(f"need 1 <= min_size <= max_size, got {min_size}, {max_size}")
    family = draw(st.sampled_from(families))
    n = draw(st.integers(min_size, max_size))
    big = _MAX_FINITE[dtype]
    if family == "entropy":
        target = draw(entropy_targets())
        need = max(2, math.ceil(math.exp(target)) + 1)
        n = max(n, min(need, max(max_size, 8)))
        k = draw(st.integers(1, max(1, min(3, n - 1))))
        row = row_with_entropy(target, n, k)
        if row is None:
            row = np.zeros(n)
        shift = draw(st.sampled_from([0.0, 1.0, -3.5, 17.25]))
        row = row + shift
        perm = draw(st.permutations(range(n)))
        return _cast(row[list(perm)], dtype)
    if family == "translated":
        base = draw(logit_rows(min_size, max_size, dtype, ("spread", "ties", "entropy")))
        base = base.astype(np.float64)
        if base.shape[0] >= 2 and draw(st.booleans()):
            keep = draw(st.integers(0, base.shape[0] - 1))
            drop = draw(st.sets(st.integers(0, base.shape[0] - 1), min_size=1, max_size=8))
            base[[j for j in drop if j != keep]] = -np.inf
        side, mag = draw(st.sampled_from(translations(dtype)))
        return _cast(_translate(base, side, mag, dtype), dtype)
    if family == "one_hot":
        gap = draw(st.sampled_from([20.0, 40.0, 100.0, 800.0]))
        row = np.full(n, -gap)
        row[draw(st.integers(0, n - 1))] = 0.0
        return _cast(np.clip(row, -big, big), dtype)
    if family == "near_uniform":
        base = draw(st.floats(-10, 10))
        noise = draw(st.lists(st.floats(-1e-3, 1e-3), min_size=n, max_size=n))
        return _cast(base + np.array(noise), dtype)
    if family == "subnormal":
        tiny = _TINY[dtype]
        ks = draw(st.lists(st.integers(-8, 8), min_size=n, max_size=n))
        return _cast(np.array(ks, dtype=np.float64) * tiny, dtype)
    if family == "huge":
        mag = draw(st.sampled_from([1e3, 1e4, 3e4, 1e6, 1e10, 1e30, 1e300]))
        mag = min(mag, HALF_MAX_FRACTION * big)  # beta * x stays finite
        sign = draw(st.sampled_from([1.0, -1.0]))
        spread = draw(st.sampled_from([0.0, 1.0, 10.0, 100.0, 1000.0]))
        offs = draw(st.lists(st.floats(0, 1), min_size=n, max_size=n))
        return _cast(sign * mag + spread * np.array(offs), dtype)
    spread = draw(st.sampled_from([0.5, 2.0, 5.69, 10.0, 30.0]))
    lo = draw(st.floats(-50, 50))
    vals = draw(st.lists(st.floats(0, 1), min_size=n, max_size=n))
    row = lo + spread * np.array(vals)
    if family == "ties" and n >= 2:
        for _ in range(draw(st.integers(1, n))):
            i, j = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
            row[j] = row[i]
    if family == "masked" and n >= 2:
        keep = draw(st.integers(0, n - 1))
        for j in draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=n - 1)):
            if j != keep:
                row[j] = -np.inf
    return _cast(row, dtype)


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


@st.composite
def window_rows(
    draw: Any,
    dtype: str = "float64",
    min_size: int = 256,
    max_size: int = 2048,
    translated: bool = True,
) -> np.ndarray:
    r"""A row of `min_size` to `max_size` items whose entropy lies in :math:`[5, H_{\mathrm{off}}]`.

    There :math:`|P'(H)|` is largest relative to β and the entropy is large, so
    an entropy computed with float16 statistics moves β by several float16
    ulps: the rows that tell such a kernel from a backward-stable one. The
    logits are a scaled Gaussian, uniform or two-cluster sample, scaled
    (bisection) to the drawn entropy; with `translated` the row may also be
    moved far from zero (:func:`translations`).
    """
    dtype = _check_dtype(dtype)
    if not 2 <= min_size <= max_size:
        raise ValueError(f"need 2 <= min_size <= max_size, got {min_size}, {max_size}")
    n = draw(st.integers(min_size, max_size))
    h_off = branch_points()["H_off"]
    top = min(h_off, math.log(n) - 0.05)
    target = draw(st.floats(min(5.0, top), top)) if top > 0.1 else top
    shape = draw(st.sampled_from(["normal", "uniform", "clusters"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if shape == "normal":
        g = rng.standard_normal(n)
    elif shape == "uniform":
        g = rng.random(n)
    else:
        g = np.where(rng.random(n) < 0.2, 1.0, 0.0) + 0.1 * rng.standard_normal(n)
    row = _row_at_entropy(g, target)
    row = row + draw(st.sampled_from([0.0, 0.0, 1.5, -2.25]))
    if translated and draw(st.integers(0, 3)) == 0:
        side, mag = draw(st.sampled_from(translations(dtype)))
        row = _translate(row, side, mag, dtype)
    return _cast(row, dtype)


def shapes(max_dims: int = 3, max_side: int = 3) -> st.SearchStrategy[tuple[int, ...]]:
    """Batch shapes (the leading dimensions of ``(..., n)``), the empty shape included."""
    return st.lists(st.integers(1, max_side), min_size=0, max_size=max_dims).map(tuple)


@st.composite
def logit_batches(
    draw: Any,
    batch_shapes: st.SearchStrategy[tuple[int, ...]] | None = None,
    min_size: int = 1,
    max_size: int = 32,
    dtype: str = "float64",
    families: tuple[str, ...] = FAMILIES,
) -> np.ndarray:
    """An array of shape ``batch + (n,)`` whose rows come from :func:`logit_rows`."""
    batch = draw(batch_shapes if batch_shapes is not None else shapes())
    n = draw(st.integers(min_size, max_size))
    count = int(np.prod(batch, dtype=np.int64)) if batch else 1
    rows = []
    for _ in range(count):
        row = draw(logit_rows(n, n, dtype, families))
        rows.append(_fit(row, n))
    return np.stack(rows).reshape(*batch, n)


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


@st.composite
def chunkings(draw: Any, n: int, max_chunks: int = 8) -> list[int]:
    """Positive chunk sizes summing to `n` (a single chunk when ``n <= 1``)."""
    if n <= 1:
        return [n]
    cuts = draw(st.sets(st.integers(1, n - 1), max_size=max_chunks - 1))
    edges = [0, *sorted(cuts), n]
    return [b - a for a, b in itertools.pairwise(edges)]


@st.composite
def attention_inputs(
    draw: Any,
    dtype: str = "float64",
    max_len: int = 12,
    max_d: int = 8,
    batch: bool = True,
    masks: bool = False,
    causal: bool = False,
) -> dict[str, Any]:
    """Inputs of attention: ``{"q", "k", "v", "mask", "is_causal"}``.

    Shapes ``(..., L, d)``, ``(..., S, d)``, ``(..., S, dv)``; the logit scale
    varies (sharp and flat heads). With ``masks=True`` a boolean mask
    (``True`` attends, every query keeps one key) may be drawn; with
    ``causal=True`` the causal flag may be set (``L == S`` then).
    """
    dtype = _check_dtype(dtype)
    lead = draw(st.lists(st.integers(1, 2), max_size=2).map(tuple)) if batch else ()
    L = draw(st.integers(1, max_len))
    S = draw(st.integers(1, max_len))
    d = draw(st.integers(1, max_d))
    dv = draw(st.integers(1, max_d))
    is_causal = causal and draw(st.booleans())
    if is_causal:
        S = L
    gain = draw(st.sampled_from([0.1, 1.0, 3.0, 8.0]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    q = _cast(gain * rng.standard_normal((*lead, L, d)), dtype)
    k = _cast(rng.standard_normal((*lead, S, d)), dtype)
    v = _cast(rng.standard_normal((*lead, S, dv)), dtype)
    mask = None
    if masks and not is_causal and draw(st.booleans()):
        m = rng.random((L, S)) < draw(st.sampled_from([0.3, 0.7]))
        m[np.arange(L), rng.integers(0, S, L)] = True
        mask = m
    return {"q": q, "k": k, "v": v, "mask": mask, "is_causal": is_causal}
