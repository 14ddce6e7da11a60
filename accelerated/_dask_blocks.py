r"""Block functions of :mod:`softmaxtheory.accelerated.dask` (private).

Each function here runs inside one dask task on one block of rows: a numpy array
of shape ``(rows, nk)`` whose last axis is a slice of the softmax axis. They call
the Numba kernels of :mod:`softmaxtheory.accelerated._cpu_kernels` (through the
kernel table, so a forked worker uses the serial twins) and never look at other
blocks: everything that crosses blocks travels as a small per-row record.

Records
-------
:data:`STATE` is the float state of theorem T7 of a row's block, as the CPU kernels
keep it: the maximum :math:`m`, the count :math:`c` of items at the maximum, the
number of unmasked items, :math:`r = \sum_{x<m} e^{x-m}`,
:math:`t = \sum e^{x-m}(x-m)`, and a flag for a NaN or ``+inf`` seen. States merge
with the kernels' ``merge_state`` (the ⊕ that stays finite when two maxima are
further apart than the float range), always left to right.

:data:`SUM` is a compensated partial sum ``(s, comp)`` (Neumaier): the tempered
sums and the sums of the ``entropy_eps`` mode are added with it, in a fixed order.

:data:`INFO` is what the normalising pass needs of a row: its kind (0 regular,
2 empty or fully masked, 3 NaN or ``+inf``), :math:`m`, the entropy, β and
:math:`1/s`.
"""

from __future__ import annotations

import math

import numpy as np

from .._formats import ROW_INVALID, ROW_MASKED, ROW_REGULAR
from ._cpu_kernels import chunk_state_arrays, entropy_from_state, long_row_state, merge_state
from ._cpu_kernels import kernels as _k
from ._numba_cache import njit  # numba.njit with a cache safe between processes

__all__: list[str] = []

CHUNK = _k.CHUNK


STATE = np.dtype(
    [
        ("bad", np.bool_),
        ("m", np.float64),
        ("c", np.int64),
        ("n", np.int64),
        ("r", np.float64),
        ("t", np.float64),
    ]
)
SUM = np.dtype([("s", np.float64), ("comp", np.float64)])
INFO = np.dtype(
    [
        ("kind", np.int64),
        ("m", np.float64),
        ("n", np.int64),
        ("h", np.float64),
        ("beta", np.float64),
        ("inv", np.float64),
    ]
)


def identity_states(rows: int) -> np.ndarray:
    r"""``rows`` identity states :math:`(-\infty, 0, 0)`."""
    out = np.zeros(rows, dtype=STATE)
    out["m"] = -math.inf
    return out


def rows2d(block: np.ndarray, work: np.dtype) -> np.ndarray:
    """The block as C-contiguous, writeable ``(rows, nk)`` of the working dtype."""
    arr = np.ascontiguousarray(block, dtype=work)
    if not arr.flags.writeable:  # the kernels are compiled for writeable arrays
        arr = arr.copy()
    return arr.reshape(math.prod(arr.shape[:-1]), arr.shape[-1])


def block_states(x2: np.ndarray) -> np.ndarray:
    """The T7 state of every row of a ``(rows, nk)`` block.

    A row of at most :data:`CHUNK` items is one kernel chunk (all rows in one
    parallel call); a longer one is split into chunks of :data:`CHUNK` items
    merged left to right, as :mod:`~softmaxtheory.accelerated.cpu` does.
    """
    rows, nk = x2.shape
    out = identity_states(rows)
    if rows == 0 or nk == 0:
        return out
    if nk <= CHUNK:
        m, nnan, c, ne, r, t = chunk_state_arrays(x2.reshape(-1), nk, rows)
        bad = (nnan > 0) | (m == np.inf)
        ok = ~bad
        out["bad"] = bad
        out["m"][ok] = m[ok]
        out["c"][ok] = c[ok]
        out["n"][ok] = ne[ok]
        out["r"][ok] = r[ok]
        out["t"][ok] = t[ok]
        return out
    for i in range(rows):
        bad, M, C, N, R, T = long_row_state(x2[i])
        if bad:
            out["bad"][i] = True
        else:
            out[i] = (False, M, C, N, R, T)
    return out


@njit(cache=True)
def _merge_into(bad, m, c, n, r, t, bad2, m2, c2, n2, r2, t2):  # pragma: no cover - jitted
    for i in range(m.size):
        if bad2[i]:
            bad[i] = True
        if bad[i]:
            m[i] = -np.inf
            c[i] = 0
            n[i] = 0
            r[i] = 0.0
            t[i] = 0.0
            continue
        m[i], c[i], n[i], r[i], t[i] = merge_state(
            m[i], c[i], n[i], r[i], t[i], m2[i], c2[i], n2[i], r2[i], t2[i]
        )


def merge_states(parts: list[np.ndarray]) -> np.ndarray:
    """Fold equally shaped state arrays left to right by ⊕ (a new array)."""
    acc = np.ascontiguousarray(parts[0]).reshape(-1).copy()
    for part in parts[1:]:
        p = np.ascontiguousarray(part).reshape(-1)
        _merge_into(
            acc["bad"], acc["m"], acc["c"], acc["n"], acc["r"], acc["t"],
            p["bad"], p["m"], p["c"], p["n"], p["r"], p["t"],
        )  # fmt: skip
    return acc.reshape(parts[0].shape)


def add_sums(parts: list[np.ndarray]) -> np.ndarray:
    """Neumaier-add equally shaped :data:`SUM` arrays left to right (a new array)."""
    acc = np.array(parts[0], dtype=SUM, copy=True)
    total = acc["s"]
    comp = acc["comp"]
    for part in parts[1:]:
        value = part["s"]
        t = total + value
        big = np.abs(total) >= np.abs(value)
        comp += np.where(big, (total - t) + value, (value - t) + total) + part["comp"]
        total[...] = t
    return acc


def info_from_states(states: np.ndarray, need_h: bool) -> np.ndarray:
    """Kinds, maxima, counts, entropies and :math:`1/s` of merged states (β = 1)."""
    flat = states.reshape(-1)
    info = np.zeros(flat.shape, dtype=INFO)
    bad = flat["bad"]
    empty = ~bad & (flat["m"] == -math.inf)
    regular = ~bad & ~empty
    info["kind"][bad] = ROW_INVALID
    info["kind"][empty] = ROW_MASKED
    info["m"] = flat["m"]
    info["n"] = flat["n"]
    info["beta"] = 1.0
    info["beta"][bad] = math.nan
    info["h"][bad] = math.nan
    c = np.ascontiguousarray(flat["c"][regular])
    r = np.ascontiguousarray(flat["r"][regular])
    info["inv"][regular] = 1.0 / (c + r)
    if need_h:
        h = np.empty(c.size)
        _entropies(c, r, np.ascontiguousarray(flat["t"][regular]), h)
        info["h"][regular] = h
    return info.reshape(states.shape)


@njit(cache=True)
def _entropies(c, r, t, out):  # pragma: no cover - jitted
    # the kernels' own formula, per row (libm's log, as in the CPU backend)
    for i in range(out.size):
        out[i] = entropy_from_state(c[i], r[i], t[i])


def block_entropy_eps(x2: np.ndarray, info: np.ndarray, eps: float) -> np.ndarray:
    r""":math:`\sum p \log(p + \varepsilon)` over the block, per row (a :data:`SUM`)."""
    rows, nk = x2.shape
    flat = info.reshape(-1)
    out = np.zeros(rows, dtype=SUM)
    nchunk = max(1, -(-nk // CHUNK))
    acc = np.empty(nchunk)
    for i in range(rows):
        if flat["kind"][i] != ROW_REGULAR or nk == 0:
            continue
        _k.chunks_entropy_eps(x2[i], CHUNK, x2.dtype.type(flat["m"][i]), flat["inv"][i], eps, acc)
        out["s"][i] = _k.fold_sum(acc)
    return out


def block_tempered(x2: np.ndarray, info: np.ndarray) -> np.ndarray:
    r""":math:`\sum e^{\beta(x - m)}` over the block for each row with β ≠ 1 (a :data:`SUM`)."""
    rows, nk = x2.shape
    flat = info.reshape(-1)
    out = np.zeros(rows, dtype=SUM)
    nchunk = max(1, -(-nk // CHUNK))
    cb = np.zeros(nchunk, dtype=np.int64)
    rb = np.zeros(nchunk)
    for i in range(rows):
        b = flat["beta"][i]
        if flat["kind"][i] != ROW_REGULAR or b == 1.0 or nk == 0:
            continue
        m = x2.dtype.type(flat["m"][i])
        _k.chunks_tempered(x2[i], CHUNK, m, b, x2[i], False, cb, rb)
        out["s"][i] = _k.fold_sum(rb)
    return out


def block_write(x2: np.ndarray, info: np.ndarray, total: np.ndarray | None) -> np.ndarray:
    r"""The probabilities of the block: :math:`e^{\beta(x-m)} / s_\beta` per row."""
    rows, nk = x2.shape
    flat = info.reshape(-1)
    out = np.empty_like(x2)
    nchunk = -(-nk // CHUNK)
    if nk == 0:
        return out
    for i in range(rows):
        kind = flat["kind"][i]
        if kind == ROW_INVALID:
            out[i] = np.nan
            continue
        if kind == ROW_MASKED:
            out[i] = 0.0
            continue
        b = float(flat["beta"][i])
        m = x2.dtype.type(flat["m"][i])
        if b == 1.0:
            inv = float(flat["inv"][i])
        else:
            z = total.reshape(-1)[i]
            inv = 1.0 / (float(z["s"]) + float(z["comp"]))
        _k.chunks_write(x2[i], CHUNK, m, b, inv, out[i], nchunk)
    return out
