r"""Softmax, entropy and adaptive softmax of dask arrays: rows larger than one machine.

The functions take a :class:`dask.array.Array` chunked along any axis — the
softmax axis included — and return dask arrays (lazy; nothing runs until
``compute``, ``store`` or ``persist``). They follow the specification of
:mod:`softmaxtheory.spec` and its special-value table, like every backend:
``-inf`` entries are masked, a fully masked or empty row gives zeros
(entropy 0, β = 1), a row with NaN or ``+inf`` gives NaN. Integer input is
promoted to float64 (a block holding an integer float64 does not hold, beyond
2**53, raises a ValueError when computed); float16 is computed in float32 and
returned as float16.

How it computes
---------------
Theorem T7 (:doc:`/theory/streaming`) splits the work. Write each row as the
concatenation of its blocks :math:`x = x^{(1)} \mathbin{+\!\!+} \cdots
\mathbin{+\!\!+} x^{(B)}` (dask's chunks along the softmax axis). Then

1. each block's state :math:`S(x^{(k)})` — maximum, count at the maximum,
   :math:`r = \sum_{x<m} e^{x-m}`, :math:`t = \sum e^{x-m}(x-m)` — is computed by the
   Numba kernels of :mod:`~softmaxtheory.accelerated.cpu`, a few numbers per row;
2. a tree reduction (:func:`dask.array.reduction`, :data:`SPLIT_EVERY` states per
   node, in the blocks' order) merges them by ⊕ into :math:`S(x)`, hence
   :math:`H = \log c + \operatorname{log1p}(r/c) - t/s` and β, per row;
3. where β ≠ 1, a blockwise map sums :math:`e^{\beta(x-m)}` per block and a second
   tree adds the sums (compensated, in the same fixed order);
4. a blockwise map writes :math:`e^{\beta(x-m)}/s_\beta` block by block.

A task holds one block and a few numbers per row, and each pass reads (or
recomputes) the blocks of `x` afresh (:func:`dask.graph_manipulation.clone`)
rather than keeping them from the first pass, so a worker's memory is a small
multiple of one block, whatever the length of the row. (If `x` is expensive to
compute and fits in the cluster's memory, ``x.persist()`` it first.) Every merge and every sum
is done in an order fixed by the chunking alone, so for a fixed chunking the
result is identical bit for bit under any scheduler (threads, processes,
``dask.distributed``) and any number of workers of one kind of CPU (Numba compiles
for the worker's CPU, whose vector width and fused multiply-add can change the last
bits: workers of different CPUs give results within the error model, not identical
bits; ``certified=True`` is identical everywhere); a different chunking gives a
result within the error model of the CPU kernels. Every task runs in IEEE's
default floating-point environment, as the CPU functions do, whatever its
thread's (a synchronous scheduler runs the tasks in the caller's thread, which
may flush subnormals).

``certified=True`` gives the correctly rounded results of the reference
(:mod:`softmaxtheory.reference`), bit for bit, by the same passes with rigorous
enclosures in place of float sums: after the maxima, each block returns per row
its sums :math:`\sum e^{\beta(x-m)}` (and :math:`\sum e^{x-m}|x-m|` for the
entropy) computed in double-double arithmetic, held exactly, with a bound on
their error; the tree adds them exactly, the reference's own scalar routines
certify the entropy, β and :math:`1/s` from the merged sums, a check pass rounds
every coefficient block by block against them, and the last pass writes them. A
task still holds one block and a few numbers per row. A row the enclosures cannot
decide (a value within about :math:`2^{-88}` of a rounding boundary, a guard
outside the reference's fast range, …) falls back alone to the exact path: the
multiset of its values merged in the tree and read by the reference, which holds
the row's distinct values in one task (see
:doc:`/guides/rows_larger_than_one_machine`).

Examples
--------
>>> import dask.array as da
>>> import numpy as np
>>> from softmaxtheory.accelerated import cpu
>>> from softmaxtheory.accelerated import dask as dsm
>>> x = np.linspace(-4.0, 4.0, 1000).reshape(2, 500)
>>> p = dsm.adaptive_softmax(da.from_array(x, chunks=(1, 120)))
>>> p.chunks
((1, 1), (120, 120, 120, 120, 20))
>>> bool(np.allclose(p.compute(), cpu.adaptive_softmax(x), rtol=1e-12, atol=0))
True
>>> float(dsm.entropy(da.from_array(x[0], chunks=77)).compute()) == float(cpu.entropy(x[0]))
True
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import dask.array as da
import numpy as np
from dask.graph_manipulation import clone

from .._certify.environment import ieee_kernels
from .._formats import ROW_REGULAR
from ..spec import Schedule, as_logits, check_entropy_eps, exact_float64, resolve_schedule
from . import _dask_blocks as _b

#: every task that computes runs in IEEE's default floating-point environment, whatever
#: its thread's (see :func:`softmaxtheory._certify.environment.ieee_kernels`)
_ieee = ieee_kernels("the dask backend's results")

__all__ = ["SPLIT_EVERY", "adaptive_softmax", "beta", "entropy", "softmax"]

#: How many consecutive states each node of the merge trees folds, in order. Fixed
#: (not read from dask's configuration) so that the merge tree, hence every bit of
#: the result, depends on the chunking alone.
SPLIT_EVERY: int = 8


# ---------------------------------------------------------------------------
# argument handling
# ---------------------------------------------------------------------------


def _prepare(x: Any, axis: Any) -> tuple[da.Array, np.dtype, np.dtype, int]:
    """(x with `axis` moved last, input dtype, working dtype, axis)."""
    if not isinstance(x, da.Array):
        raise TypeError(
            f"x must be a dask.array.Array, got {type(x).__name__} "
            "(wrap numpy input with dask.array.from_array, or use accelerated.cpu; to run "
            "softmaxtheory check on this backend, see 'A dask kernel' in the testing guide)"
        )
    if isinstance(getattr(x, "_meta", None), np.ma.MaskedArray):
        # its mask cannot be seen without computing it, and the blocks' would be dropped
        raise TypeError(
            "x has masked-array chunks, whose masks would be read as if unmasked; pass "
            "dask.array.ma.filled(x, -np.inf) to remove the masked entries (a -inf logit "
            "takes no part, theorem T8), or dask.array.ma.getdata(x) to keep them"
        )
    # the dtype and rank rules of every backend (as_logits names the argument)
    in_dtype = as_logits(np.empty((0,) * max(x.ndim, 1), dtype=x.dtype), "x").dtype
    if x.ndim == 0:
        raise ValueError("x must have at least one axis (shape (..., n)), got a 0-d array")
    if isinstance(axis, bool) or not isinstance(axis, int | np.integer):
        raise TypeError(f"axis must be an int, got {axis!r}")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis {axis} is out of range for x of shape {x.shape}")
    axis = int(axis) % x.ndim
    if not x.dtype.isnative:  # a big-endian store, say: the same values in native order
        x = x.astype(in_dtype)
    if x.dtype.kind in "iu" and x.dtype.itemsize >= 8:
        # each block refuses (at compute) an integer float64 cannot hold, as the reference
        # and every backend do: rounded, [2**53, 2**53 + 1] gave 0.5 each (certified too)
        x = x.map_blocks(partial(exact_float64, name="x"), dtype=np.float64)
    work = np.dtype(np.float32) if in_dtype == np.float16 else in_dtype
    xm = x if axis == x.ndim - 1 else da.moveaxis(x, axis, -1)
    if any(math.isnan(c) for c in xm.shape):
        raise ValueError(
            f"x must have known chunk sizes, got shape {x.shape} (call x.compute_chunk_sizes())"
        )
    return xm, in_dtype, work, axis


def _check_certified(certified: Any) -> bool:
    if not isinstance(certified, bool | np.bool_):
        raise TypeError(f"certified must be a bool, got {certified!r}")
    return bool(certified)


def _reread(xm: da.Array) -> da.Array:
    """`xm` computed afresh for another pass (:func:`dask.graph_manipulation.clone`).

    Without it dask would keep every block of the first pass in memory until the last
    pass has used it — the whole array; with it a pass reads (or recomputes) its blocks
    itself and drops each one once used. dask's ``clone`` can corrupt a graph whose
    layers hold task objects (dask/dask#12455): ``da.stack`` of two differently
    chunked arrays gave "Cannot fuse tasks with multiple outputs" at compute. Such a
    graph is optimized once here, and where its clone fails the pass reads `xm`
    itself (the blocks are then kept, as without a clone).
    """
    cloned = clone(xm)
    if _holds_tasks(xm):
        import dask

        try:
            dask.optimize(cloned)
        except ValueError:
            return xm
    return cloned


def _holds_tasks(xm: da.Array) -> bool:
    """Whether a materialized layer of `xm`'s graph holds dask task objects."""
    try:
        from dask._task_spec import GraphNode
        from dask.highlevelgraph import MaterializedLayer
    except ImportError:  # pragma: no cover - a dask without task objects
        return False
    layers = xm.__dask_graph__().layers.values()
    return any(
        isinstance(v, GraphNode)
        for layer in layers
        if isinstance(layer, MaterializedLayer)
        for v in layer.values()
    )


def _lead(xm: da.Array) -> tuple[tuple[int, ...], ...]:
    return xm.chunks[:-1]


# ---------------------------------------------------------------------------
# the float path: states, reductions, blockwise maps
# ---------------------------------------------------------------------------


@_ieee
def _chunk_state(block: np.ndarray, axis: Any = None, keepdims: bool = True, work: Any = None):
    x2 = _b.rows2d(block, work)
    return _b.block_states(x2).reshape((*block.shape[:-1], 1))


@_ieee
def _merge_state_parts(parts: Any, axis: Any = None, keepdims: bool = True) -> np.ndarray:
    if not isinstance(parts, list):
        return parts
    return _b.merge_states([_merge_state_parts(p) for p in parts])


@_ieee
def _add_sum_parts(parts: Any, axis: Any = None, keepdims: bool = True) -> np.ndarray:
    if not isinstance(parts, list):
        return parts
    return _b.add_sums([_add_sum_parts(p) for p in parts])


def _identity_part(block: np.ndarray, axis: Any = None, keepdims: bool = True) -> np.ndarray:
    return block


def _tree(
    arr: da.Array, chunk: Any, merge: Any, dtype: np.dtype, name: str, aggregate: Any = None
) -> da.Array:
    """Fold the last axis of `arr` block by block, in order, by a tree of fan-in SPLIT_EVERY."""
    last = arr.ndim - 1
    return da.reduction(
        arr,
        chunk=chunk,
        combine=merge,
        aggregate=merge if aggregate is None else aggregate,
        axis=last,
        keepdims=True,
        dtype=dtype,
        split_every={last: SPLIT_EVERY},
        concatenate=False,
        meta=np.empty((0,) * arr.ndim, dtype=dtype),
        name=name,
    )


def _states(xm: da.Array, work: np.dtype) -> da.Array:
    """Merged T7 states, shape ``(..., 1)`` (a structured record per row)."""
    chunk = _FixedWork(_chunk_state, work)
    return _tree(xm, chunk, _merge_state_parts, _b.STATE, "softmaxtheory-t7-states")


class _FixedWork:
    """A chunk function with the working dtype bound (picklable, unlike a lambda)."""

    def __init__(self, fn: Any, work: np.dtype) -> None:
        self.fn = fn
        self.work = work

    def __call__(self, block: np.ndarray, axis: Any = None, keepdims: bool = True) -> Any:
        return self.fn(block, axis, keepdims, work=self.work)

    def __dask_tokenize__(self) -> tuple[str, str, str]:
        # deterministic: graphs built from the same x share their state pass
        return (self.fn.__module__, self.fn.__qualname__, str(self.work))


@_ieee
def _info_block(states: np.ndarray, need_h: bool) -> np.ndarray:
    return _b.info_from_states(states, need_h)


def _per_block(fn: Any, xm: da.Array, info: da.Array, work: np.dtype, *args: Any) -> da.Array:
    """``fn(block, info)`` per block: one :data:`~_b.SUM` per row and block, shape (..., B)."""
    nblocks = len(xm.chunks[-1])

    @_ieee
    def run(block: np.ndarray, inf: np.ndarray, *rest: Any) -> np.ndarray:
        x2 = _b.rows2d(block, work)
        return fn(x2, inf, *rest).reshape((*block.shape[:-1], 1))

    return da.map_blocks(
        run,
        xm,
        info,
        *args,
        dtype=_b.SUM,
        chunks=(*_lead(xm), (1,) * nblocks),
        meta=np.empty((0,) * xm.ndim, dtype=_b.SUM),
        token=f"softmaxtheory-{fn.__name__}",
    )


def _sum_tree(partials: da.Array, name: str) -> da.Array:
    return _tree(partials, _identity_part, _add_sum_parts, _b.SUM, name)


def _with_entropy(xm: da.Array, work: np.dtype, eps: float) -> tuple[da.Array, da.Array]:
    """(info with the entropy filled in, per row (..., 1); the states)."""
    states = _states(xm, work)
    info = states.map_blocks(_info_block, True, dtype=_b.INFO, meta=np.empty((0,), _b.INFO))
    if eps > 0.0:
        sums = _sum_tree(
            _per_block(_b.block_entropy_eps, _reread(xm), info, work, eps),
            "softmaxtheory-entropy-eps",
        )
        info = da.map_blocks(_entropy_eps_info, info, sums, dtype=_b.INFO)
    return info, states


@_ieee
def _entropy_eps_info(info: np.ndarray, sums: np.ndarray) -> np.ndarray:
    out = info.copy()
    regular = out["kind"] == ROW_REGULAR
    out["h"][regular] = -(sums["s"][regular] + sums["comp"][regular])
    return out


@_ieee
def _beta_info(info: np.ndarray, schedule: Schedule) -> np.ndarray:
    out = info.copy()
    flat = out.reshape(-1)
    regular = flat["kind"] == ROW_REGULAR
    if regular.any():
        flat["beta"][regular] = schedule.checked_beta(flat["h"][regular], flat["n"][regular])
    return out


def _deliver(y: da.Array, in_dtype: np.dtype, axis: int, ndim: int) -> da.Array:
    if y.dtype != in_dtype:
        y = y.astype(in_dtype)
    return y if axis == ndim - 1 else da.moveaxis(y, -1, axis)


def _field(info: da.Array, name: str, dtype: Any) -> da.Array:
    return info.map_blocks(_take_field, name, dtype, dtype=dtype, drop_axis=info.ndim - 1)


@_ieee
def _take_field(block: np.ndarray, name: str, dtype: Any) -> np.ndarray:
    return np.array(block[name][..., 0], dtype=dtype)  # a copy; 0-d for a single row


@_ieee
def _write_block(
    block: np.ndarray, info: np.ndarray, total: Any, work: np.dtype, out: np.dtype
) -> np.ndarray:
    x2 = _b.rows2d(block, work)
    return _b.block_write(x2, info, total).reshape(block.shape).astype(out, copy=False)


def _vector(
    x: Any, axis: int, schedule: Schedule | None, entropy_eps: float, adaptive: bool
) -> da.Array:
    eps = check_entropy_eps(entropy_eps)
    schedule = resolve_schedule(schedule)
    xm, in_dtype, work, axis = _prepare(x, axis)
    if adaptive:
        info, _ = _with_entropy(xm, work, eps)
        info = info.map_blocks(_beta_info, schedule, dtype=_b.INFO)
        total = _sum_tree(
            _per_block(_b.block_tempered, _reread(xm), info, work), "softmaxtheory-tempered-sums"
        )
    else:
        states = _states(xm, work)
        info = states.map_blocks(_info_block, False, dtype=_b.INFO)
        total = None
    y = da.map_blocks(
        _write_block,
        _reread(xm),
        info,
        total,
        work,
        in_dtype,
        dtype=in_dtype,
        meta=np.empty((0,) * xm.ndim, dtype=in_dtype),
        token="softmaxtheory-normalise",
    )
    return _deliver(y, in_dtype, axis, x.ndim)


# ---------------------------------------------------------------------------
# the certified path: merged enclosures, the reference's readings
# ---------------------------------------------------------------------------


def _cert_map(fn: Any, xm: da.Array, rows: da.Array, *args: Any, name: str) -> da.Array:
    """``fn(block, rows)`` per block: one record per row and block, shape (..., B)."""
    nblocks = len(xm.chunks[-1])
    return da.map_blocks(
        _CertBlock(fn),
        _reread(xm),
        rows,
        *args,
        dtype=object,
        chunks=(*_lead(xm), (1,) * nblocks),
        meta=np.empty((0,) * xm.ndim, dtype=object),
        token=name,
    )


class _CertBlock:
    """A certified block function on ``(rows, nk)`` float64 and the rows' readings."""

    def __init__(self, fn: Any, per_row: bool = True) -> None:
        self.fn = fn
        self.per_row = per_row

    def __call__(self, block: np.ndarray, rows: np.ndarray, *args: Any) -> np.ndarray:
        lead = block.shape[:-1]
        x2 = np.asarray(block, dtype=np.float64).reshape(math.prod(lead), block.shape[-1])
        out = self.fn(x2, rows.reshape(-1), *args)
        return out.reshape((*lead, 1) if self.per_row else block.shape)

    def __dask_tokenize__(self) -> tuple[str, str, bool]:
        return (self.fn.__module__, self.fn.__qualname__, self.per_row)


def _cert_tree(records: da.Array, stage: str, cfg: Any) -> da.Array:
    """Merge a pass's records in the fixed tree; read each row in the last node."""
    from . import _dask_cert as ce

    return _tree(
        records,
        _identity_part,
        _fold_parts,
        np.dtype(object),
        f"softmaxtheory-certified-{stage}",
        aggregate=ce.Reader(stage, cfg),
    )


def _fold_parts(parts: Any, axis: Any = None, keepdims: bool = True) -> np.ndarray:
    from . import _dask_cert as ce

    return ce.fold(parts)


def _certified_rows(
    x: Any, axis: int, want: str, schedule: Schedule | None, entropy_eps: float
) -> tuple[da.Array, da.Array, Any, np.dtype, int]:
    """(x with `axis` last, the final per-row readings (..., 1), the config, dtype, axis)."""
    from . import _dask_cert as ce

    eps = check_entropy_eps(entropy_eps)
    schedule = resolve_schedule(schedule)
    xm, in_dtype, work, axis = _prepare(x, axis)
    out_dtype = np.dtype(np.float64) if want == "beta" else in_dtype
    cfg = ce.Config(want, schedule, eps, out_dtype, int(xm.shape[-1]))
    states = _states(xm, work)
    if cfg.need_h or want == "softmax":
        rows = _cert_tree(
            _cert_map(ce.block_sums, xm, states, cfg, "entropy", name="softmaxtheory-cert-sums"),
            "entropy",
            cfg,
        )
        if cfg.need_h and eps != 0.0:
            rows = _cert_tree(
                _cert_map(ce.block_guard, xm, rows, cfg, name="softmaxtheory-cert-guard"),
                "guard",
                cfg,
            )
    else:
        rows = states.map_blocks(ce.rows_from_states, cfg, dtype=object)
    if want == "adaptive_softmax":
        rows = _cert_tree(
            _cert_map(ce.block_sums, xm, rows, cfg, "tempered", name="softmaxtheory-cert-tempered"),
            "tempered",
            cfg,
        )
    if cfg.vector:
        rows = _cert_tree(
            _cert_map(ce.block_check, xm, rows, cfg, name="softmaxtheory-cert-check"), "check", cfg
        )
    rows = _cert_tree(
        _cert_map(ce.block_exact, xm, rows, name="softmaxtheory-cert-exact"), "exact", cfg
    )
    return xm, rows, cfg, in_dtype, axis


def _certified(
    x: Any, axis: int, want: str, schedule: Schedule | None, entropy_eps: float
) -> da.Array:
    from . import _dask_cert as ce

    xm, rows, cfg, in_dtype, axis = _certified_rows(x, axis, want, schedule, entropy_eps)
    if not cfg.vector:
        return rows.map_blocks(ce.scalar, want, dtype=np.float64, drop_axis=rows.ndim - 1).astype(
            cfg.dtype
        )
    y = da.map_blocks(
        _CertBlock(ce.block_write, per_row=False),
        _reread(xm),
        rows,
        cfg,
        dtype=np.float64,
        meta=np.empty((0,) * xm.ndim, dtype=np.float64),
        token="softmaxtheory-certified-normalise",
    )
    return _deliver(y, in_dtype, axis, x.ndim)


# ---------------------------------------------------------------------------
# public functions
# ---------------------------------------------------------------------------


def softmax(x: Any, axis: int = -1, *, certified: bool = False) -> da.Array:
    r"""Softmax along `axis` of a dask array: :math:`e^{x_i - m} / \sum_j e^{x_j - m}`.

    Parameters
    ----------
    x : dask.array.Array
        Logits (float16/32/64 or integer; integers become float64), chunked in any
        way, the softmax axis included.
    axis : int, default -1
        The axis to normalise along.
    certified : bool, default False
        ``True``: the correctly rounded values of the reference, from enclosures
        merged exactly (slower; see the module notes).

    Returns
    -------
    dask.array.Array
        The probabilities, lazily, in the dtype of `x` and its chunks.
    """
    if _check_certified(certified):
        return _certified(x, axis, "softmax", None, 0.0)
    return _vector(x, axis, None, 0.0, adaptive=False)


def entropy(
    x: Any, axis: int = -1, *, entropy_eps: float = 0.0, certified: bool = False
) -> da.Array:
    r"""Entropy :math:`-\sum_i p_i \log p_i` (nats) of the softmax along `axis`.

    Parameters
    ----------
    x : dask.array.Array
        Logits.
    axis : int, default -1
        The axis the distributions lie along (removed from the result).
    entropy_eps : float, default 0.0
        ``0`` for the exact entropy, ``eps > 0`` for
        :math:`-\sum_i p_i \log(p_i + \varepsilon)` (one more pass over `x`).
    certified : bool, default False
        ``True``: the correctly rounded entropy, from the merged enclosures.

    Returns
    -------
    dask.array.Array
        The entropies, in the dtype of `x` (computed in float64), shape of `x`
        without `axis`.
    """
    certified = _check_certified(certified)
    if certified:
        return _certified(x, axis, "entropy", None, entropy_eps)
    eps = check_entropy_eps(entropy_eps)
    xm, in_dtype, work, _ = _prepare(x, axis)
    info, _ = _with_entropy(xm, work, eps)
    return _field(info, "h", in_dtype)


def beta(
    x: Any,
    axis: int = -1,
    *,
    schedule: Schedule | None = None,
    entropy_eps: float = 0.0,
    certified: bool = False,
) -> da.Array:
    """The inverse temperature β of each row, from its entropy and the schedule.

    Parameters
    ----------
    x : dask.array.Array
        Logits.
    axis : int, default -1
        The axis the rows lie along.
    schedule : Schedule, optional
        Default :class:`~softmaxtheory.spec.PaperPolynomial`.
    entropy_eps : float, default 0.0
        The entropy mode (see :func:`entropy`).
    certified : bool, default False
        ``True``: the correctly rounded β of the exact entropy (merged enclosures).

    Returns
    -------
    dask.array.Array
        float64, shape of `x` without `axis`.
    """
    certified = _check_certified(certified)
    if certified:
        return _certified(x, axis, "beta", schedule, entropy_eps)
    eps = check_entropy_eps(entropy_eps)
    schedule = resolve_schedule(schedule)
    xm, _, work, _ = _prepare(x, axis)
    info, _ = _with_entropy(xm, work, eps)
    info = info.map_blocks(_beta_info, schedule, dtype=_b.INFO)
    return _field(info, "beta", np.float64)


def adaptive_softmax(
    x: Any,
    axis: int = -1,
    *,
    schedule: Schedule | None = None,
    entropy_eps: float = 0.0,
    certified: bool = False,
) -> da.Array:
    r"""Adaptive-temperature softmax :math:`\operatorname{softmax}(\beta(H(x))\,x)` along `axis`.

    Parameters
    ----------
    x : dask.array.Array
        Logits, chunked in any way, the softmax axis included.
    axis : int, default -1
        The axis to normalise along.
    schedule : Schedule, optional
        Default :class:`~softmaxtheory.spec.PaperPolynomial`.
    entropy_eps : float, default 0.0
        The entropy mode (see :func:`entropy`).
    certified : bool, default False
        ``True``: the reference's correctly rounded coefficients, from enclosures
        merged exactly.

    Returns
    -------
    dask.array.Array
        The probabilities, lazily, in the dtype of `x` and its chunks. Computing
        them reads `x` three times: the states, the tempered sums (where β ≠ 1;
        rows with β = 1 skip the arithmetic) and the normalisation.

    Examples
    --------
    >>> import dask.array as da
    >>> import numpy as np
    >>> from softmaxtheory.accelerated import dask as dsm
    >>> x = da.from_array(np.array([3.0, 1.0, 0.0, 0.0, -1.0, 2.0]), chunks=4)
    >>> p = dsm.adaptive_softmax(x).compute()
    >>> q = dsm.adaptive_softmax(x, certified=True).compute()
    >>> bool(np.allclose(p, q, rtol=1e-14, atol=0)), float(dsm.beta(x).compute()) > 1
    (True, True)
    """
    if _check_certified(certified):
        return _certified(x, axis, "adaptive_softmax", schedule, entropy_eps)
    return _vector(x, axis, schedule, entropy_eps, adaptive=True)
