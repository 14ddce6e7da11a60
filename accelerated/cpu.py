r"""Numba CPU kernels: softmax, entropy, adaptive softmax and attention, streaming.

The functions compute the specification of :mod:`softmaxtheory.spec` in
floating point along any axis of float32 or float64 arrays (integers are
promoted to float64, and one beyond 2**53 that float64 does not hold is refused, as
the reference refuses it; float16 is computed in float32 and returned as float16;
a big-endian array is read in the machine's byte order, and so is the result).
Every special value of the spec's table is handled: ``-inf`` entries are
masked, a fully masked row gives zeros (entropy 0, β = 1), a row with NaN or
``+inf`` gives NaN, an empty row gives an empty result (entropy 0, β = 1).

How it computes
---------------
A row of :math:`n` items takes two passes when β = 1 and three when β ≠ 1:

1. the maximum :math:`m`, then the streaming state of theorem T7 — the count
   :math:`c` of items at the maximum, :math:`r = \sum_{x_i<m} e^{x_i-m}` and
   :math:`t = \sum_i e^{x_i-m}(x_i-m)` — while :math:`e^{x_i-m}` is stored in the
   output. The entropy is :math:`H = \log c + \operatorname{log1p}(r/c) - t/s`,
   :math:`s = c + r`: three non-negative terms, so no cancellation even for
   one-hot rows;
2. β from the schedule; if β = 1 the stored exponentials are scaled by
   :math:`1/s` (one exponential per item), else :math:`e^{\beta(x_i-m)}` is
   written, summed, and scaled. A β that is 0 or nearly so (below
   :math:`2^{-1010}`, :math:`2^{-120}` for a float32 row: a ``Constant("1e-400")``
   that rounded to 0) takes a slower path with each exponent in float64: a masked
   item keeps weight 0 (not ``0 * -inf``) and a finite item whose shift
   :math:`x_i - m` overflows (``-1e308`` against ``1e308``) gets
   :math:`\beta x_i - \beta m`, not weight 0. A float32 row's β above 3.4e38 takes
   that path too, its products formed with the float64 β (clamped to 3.4e38, items
   :math:`10^{-44}` apart were weighted nearly alike where the exact weights are
   one-hot). A float64 β that overflowed enters the product as the largest float64:
   0 at the maximum, not ``inf * 0``, and exact unless an item lies a subnormal gap
   below the maximum; the returned β stays ``inf``.

Rows are processed in parallel (``numba.prange``). A row longer than
:data:`CHUNK` items is split into fixed chunks whose states are merged by
⊕ in a fixed left-to-right order, so results are identical bit for bit for any
thread count. The exponential is the kernel's own (no SVML in this llvmlite):
Cody-Waite reduction and a short polynomial, vectorised; see
:doc:`/performance` for its measured error.

Processes
---------
The kernels use Numba's default threading layer (or the one chosen with
``NUMBA_THREADING_LAYER`` / ``numba.config.THREADING_LAYER``; nothing is
forced). Without TBB that is GNU OpenMP, whose thread pool does not survive
``fork()``: a forked child that starts a parallel region is terminated
("fork() called from a process already using GNU OpenMP"). So a handler
registered with ``os.register_at_fork`` checks, in every forked child,
whether the parent's active layer is GNU OpenMP (``numba.threading_layer()``
after a parallel kernel has run; before that no pool exists and the child starts
its own). If so, the child calls serial twins of the parallel kernels: the same
Python functions compiled with ``parallel=False`` and the same fast-math flags,
compiled on first use (and cached on disk). The work is split into rows and fixed
chunks merged in a fixed order, so a child's results equal the parent's bit for
bit; a ``multiprocessing`` pool with the ``fork`` start method (the Linux
default, pytest-xdist's workers) works after kernel calls, running one thread per
worker. TBB, ``workqueue`` and Intel OpenMP are fork-safe and keep running in
parallel in the child.

Threads
-------
Every function may be called from several Python threads at once (a threaded
dask scheduler, a server's thread pool). TBB and OpenMP take that; Numba's
``workqueue`` layer, the one left where neither is installed, does not: it
terminated the process ("Concurrent access has been detected"). The parallel
kernels therefore run under a lock until the first of them has returned and the
layer is known; on ``workqueue`` they keep running under it, one call at a time
(each call still uses every core), and elsewhere the lock is dropped.

A call with less work than :data:`GRAIN` logits, or with one row, one chunk or one
query to share out, runs its kernels on one thread: a parallel region costs more
than such a call's work, and where other processes keep the cores busy, GNU OpenMP's
workers spin while the thread they wait for is descheduled (see :doc:`/performance`,
"Threads on a busy machine"). A process that shares its cores with others (test
workers, a pool of data loaders) runs large calls best with one thread each
(:func:`set_num_threads`) or with ``OMP_WAIT_POLICY=PASSIVE`` set before it starts.

Floating-point environment
--------------------------
Every function (and every method of :class:`StreamingSoftmax` that computes) runs
in IEEE's default floating-point environment, gradual underflow and rounding to
nearest, which the error model assumes. A caller's flush-to-zero mode
(``torch.set_flush_denormal(True)``, a library built with ``-ffast-math``) holds in
its own thread only, not in Numba's workers: the rows the calling thread computed
lost their subnormal coefficients and the others kept them, so a row's bits
depended on the thread that took it. Where the caller's thread is not at the
defaults, the call saves its environment, sets the default one and restores the
caller's afterwards (Linux on x86-64 and AArch64; elsewhere it raises
:class:`~softmaxtheory.reference.FloatEnvironmentError`). The probe costs about
0.2 µs a call.

Examples
--------
>>> import numpy as np
>>> from softmaxtheory.accelerated import cpu
>>> x = np.array([[0.0, 1.0, 2.0], [0.0, -np.inf, 0.0]])
>>> p = cpu.softmax(x)
>>> bool(np.allclose(p.sum(axis=-1), 1.0)), p[1].tolist()
(True, [0.5, 0.0, 0.5])
>>> float(cpu.entropy(x)[1]) == float(np.log(2))
True
"""

from __future__ import annotations

import copy
import functools
import math
import numbers
import os
from collections.abc import Callable
from typing import Any

import numba
import numpy as np

from .._certify.environment import ieee_kernels
from .._formats import NUMPY_DTYPES, ROW_EMPTY, ROW_INVALID, ROW_MASKED, ROW_REGULAR, Quantity
from .._slices import slice_stack
from ..spec import (
    Constant,
    Polynomial,
    Schedule,
    as_logits,
    attention_layout,
    check_entropy_eps,
    exact_float64,
    expand_kv_heads,
    numpy_array,
    refuse_dtype,
    refuse_masked,
    resolve_schedule,
)
from ._cpu_kernels import chunk_state_arrays, long_row_state
from ._cpu_kernels import kernels as _k

#: every entry point runs in IEEE's default floating-point environment (see
#: :func:`softmaxtheory._certify.environment.ieee_kernels`)
_ieee = ieee_kernels("the CPU backend's results")

__all__ = [
    "CHUNK",
    "GRAIN",
    "StreamingSoftmax",
    "adaptive_attention",
    "adaptive_softmax",
    "beta",
    "entropy",
    "set_num_threads",
    "softmax",
]

#: Rows longer than this are processed in chunks of this many items (fixed, so
#: the result does not depend on the thread count).
CHUNK: int = _k.CHUNK


#: A call whose kernels have less work than this, counted in logits, runs them on one
#: thread, whatever :func:`set_num_threads` says; so does a call whose kernels have one
#: row, one group of rows, one chunk or one query to share out. For attention a logit
#: counts :math:`(d + d_v)/16` times (its two dot products). See
#: :doc:`/performance`, "Threads on a busy machine".
GRAIN: int = 1 << 12


def set_num_threads(n: int) -> None:
    """Set the number of threads the kernels use (``numba.set_num_threads``).

    Calls with less work than :data:`GRAIN` use one thread whatever this says.

    Raises
    ------
    TypeError
        If `n` is not an integer (``2.7`` became 2).
    ValueError
        If `n` is not between 1 and ``numba.config.NUMBA_NUM_THREADS`` (Numba's own).
    """
    if isinstance(n, bool | np.bool_) or not isinstance(n, numbers.Integral):
        raise TypeError(f"n must be an int, got {n!r}")
    numba.set_num_threads(int(n))


def _chunk_threads(method: Callable[..., Any]) -> Callable[..., Any]:
    """Run a :class:`StreamingSoftmax` method under :func:`_threads_for` its chunk's size."""

    @functools.wraps(method)
    def wrapper(self: Any, chunk: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            items = chunk.size if isinstance(chunk, np.ndarray) else len(chunk)
        except TypeError:  # no length: the method refuses it
            items = 0
        # the chunk kernels share out chunks of CHUNK items
        with _threads_for(items, -(-items // CHUNK)):
            return method(self, chunk, *args, **kwargs)

    return wrapper


@functools.cache
def _thread_count() -> tuple[Callable[[], int], Callable[[int], None]]:
    """Numba's getter and setter of the calling thread's thread count.

    The public pair checks and launches the threading layer at every call (6 µs for a
    get and two sets, against 1.7 µs for the functions the layer's launch binds, which
    it calls): after the launch, the bound ones, where this Numba has them.
    """
    numba.get_num_threads()  # launches the threading layer, once
    from numba.np.ufunc import parallel

    get = getattr(parallel, "_get_num_threads", None)
    put = getattr(parallel, "_set_num_threads", None)
    if callable(get) and callable(put) and get() == numba.get_num_threads():
        return get, put
    return numba.get_num_threads, numba.set_num_threads


class _threads_for:  # noqa: N801 (used as a function: ``with _threads_for(...)``)
    """Run a call's kernels on one thread when their `work` is small or has one piece.

    `work` is counted in logits (see :data:`GRAIN`); `pieces` is what the kernels share
    out among the threads (rows, groups of rows, chunks, queries). A parallel region
    costs more than a small call's work, and far more where the machine's cores are
    busy with other processes (pytest-xdist's workers, a data loader's): GNU OpenMP's
    workers spin at every barrier (``GOMP_SPINCOUNT``) while the thread they wait for
    is descheduled (:doc:`/performance` has the figures). On an idle machine two
    threads gained nothing below about 4096 items of an adaptive softmax and 25 % at
    8192. Below that the call sets Numba's thread count to 1 for its own thread (the
    setting is thread-local) and restores it after. The kernels split rows and chunks
    the same way for any thread count, so the bits do not change. (A class, not a
    generator context manager: it is entered on every call, small ones included.)
    """

    __slots__ = ("before", "serial")

    def __init__(self, work: int, pieces: int) -> None:
        self.serial = work < GRAIN or pieces < 2
        self.before = 0  # the caller's count to restore (0: none)

    def __enter__(self) -> None:
        if self.serial:
            get, put = _thread_count()
            before = get()
            if before > 1:
                put(1)
                self.before = before

    def __exit__(self, *exc: object) -> None:
        if self.before:
            _thread_count()[1](self.before)


# ---------------------------------------------------------------------------
# argument handling
# ---------------------------------------------------------------------------


def _prepare(x: Any, axis: int) -> tuple[np.ndarray, np.dtype, int]:
    arr = as_logits(x, "x", exact=True)  # (an integer float64 cannot hold is refused)
    if isinstance(axis, bool) or not isinstance(axis, int | np.integer):
        raise TypeError(f"axis must be an int, got {axis!r}")
    if not -arr.ndim <= axis < arr.ndim:
        raise ValueError(f"axis {axis} is out of range for x of shape {arr.shape}")
    axis = int(axis) % arr.ndim
    in_dtype = arr.dtype
    if arr.dtype == np.float16:
        arr = arr.astype(np.float32)
    if axis != arr.ndim - 1:
        arr = np.moveaxis(arr, axis, -1)
    work = np.ascontiguousarray(arr)
    if not work.flags.writeable:  # one compiled signature: the kernels take writeable arrays
        work = work.copy()
    return work, in_dtype, axis


def _check_out(out: Any, shape: tuple[int, ...], dtype: np.dtype, name: str = "out") -> None:
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(out).__name__}")
    if out.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {out.shape}")
    if out.dtype.newbyteorder("=") != np.dtype(dtype).newbyteorder("="):  # any byte order
        raise TypeError(f"{name} must have dtype {dtype}, got {out.dtype}")
    if not out.flags.writeable:
        raise ValueError(f"{name} must be writeable, got a read-only array")


@functools.lru_cache(maxsize=64)
def _schedule_args(schedule: Schedule) -> tuple[int, np.ndarray, float, float] | None:
    """Kernel encoding of a polynomial or constant schedule; None for any other."""
    if isinstance(schedule, Polynomial):
        coeffs = np.array([float(c) for c in schedule.exact_coefficients])
        return _k.SCHED_POLY, coeffs, float(schedule.exact_threshold), 1.0
    if isinstance(schedule, Constant):
        return _k.SCHED_CONST, np.zeros(1), 0.0, float(schedule.exact_beta)
    return None


#: The highest degree of a polynomial schedule whose β = 1 range :func:`_beta_one_below`
#: isolates exactly (degree 20 took 0.4 s).
_CUT_DEGREE = 16


@functools.lru_cache(maxsize=64)
def _beta_one_below(schedule: Schedule) -> float:
    r"""An entropy :math:`h` such that the schedule's float β is 1 for every :math:`H \le h`.

    For a polynomial schedule: the threshold :math:`\theta` (β is 1 at or below it by
    definition) or, when :math:`P < 1` just above :math:`\theta`, a point a little
    below the first entropy where :math:`P` reaches :math:`1 - 10^{-9}`, verified
    exactly with a Sturm count, so that float evaluation of :math:`P` (error far below
    :math:`10^{-9}`) cannot reach 1 on :math:`(\theta, h]`. ``-inf`` for other schedules.
    Past degree :data:`_CUT_DEGREE` the threshold itself: the exact root isolation, only a
    shortcut here, took 5.7 s for degree 30 and 47 s for degree 45 (once per schedule).
    """
    from fractions import Fraction

    from .._certify import polyroots as pr

    if not isinstance(schedule, Polynomial):
        return -math.inf
    p = schedule.exact_coefficients
    theta = schedule.exact_threshold
    if len(p) > _CUT_DEGREE + 1:
        return float(theta)
    q = (*p[:-1], p[-1] - 1 + Fraction(1, 10**9))  # P - (1 - 1e-9)
    if all(c == 0 for c in q) or pr.evaluate(q, theta) >= 0:
        return float(theta)
    if len(p) == 1:  # a constant below 1 - 1e-9: beta is 1 everywhere
        return math.inf
    sf, roots = pr.isolate_roots(q)
    cut = None
    for a, b in roots:
        if b <= theta or (a < theta and pr.count_roots(sf, a, theta) == 1):
            continue  # this root is at or below the threshold
        while (a < theta or b - a > Fraction(1, 2**20)) and a != b:
            a, b = pr.refine(sf, a, b)
        cut = a  # the first root above theta lies in (a, b]
        break
    if cut is None:
        return math.inf
    # no root of P - (1 - 1e-9) in (theta, cut]: P < 1 - 1e-9 there
    if cut > theta and pr.count_roots(pr.squarefree(q), theta, cut) != 0:
        return float(theta)
    h = float(cut)
    return h if Fraction(h) <= cut else math.nextafter(h, -math.inf)


def _rows2d(work: np.ndarray) -> np.ndarray:
    n = work.shape[-1]
    rows = math.prod(work.shape[:-1])
    return work.reshape(rows, n)


# ---------------------------------------------------------------------------
# long rows (chunked, fixed merge order)
# ---------------------------------------------------------------------------


def _long_row_entropy(row: np.ndarray, state: tuple, eps: float) -> tuple[int, float]:
    bad, M, C, _, R, T = state
    if bad:
        return ROW_INVALID, math.nan
    if M == -math.inf:
        return ROW_MASKED, 0.0
    if eps > 0.0:
        nchunk = -(-row.size // CHUNK)
        acc = np.empty(nchunk)
        _k.chunks_entropy_eps(row, CHUNK, row.dtype.type(M), 1.0 / (C + R), eps, acc)
        return ROW_REGULAR, -float(_k.fold_sum(acc))
    return ROW_REGULAR, float(_k.entropy_from_state(C, R, T))


def _long_row_write(row: np.ndarray, out: np.ndarray, kind: int, state: tuple, beta: float):
    _, M, C, _, R, _ = state
    nchunk = -(-row.size // CHUNK)
    if kind != ROW_REGULAR:
        out[...] = np.nan if kind == ROW_INVALID else 0.0
        return
    m = row.dtype.type(M)
    if beta == 1.0:
        _k.chunks_write(row, CHUNK, m, 1.0, 1.0 / (C + R), out, nchunk)
        return
    cb = np.empty(nchunk, dtype=np.int64)
    rb = np.empty(nchunk)
    _k.chunks_tempered(row, CHUNK, m, beta, out, True, cb, rb)
    _k.chunks_scale(out, CHUNK, 1.0 / (int(cb.sum()) + float(_k.fold_sum(rb))), nchunk)


# ---------------------------------------------------------------------------
# public functions
# ---------------------------------------------------------------------------


def _stats_and_beta(
    x2: np.ndarray, eps: float, schedule: Schedule
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Statistics of short rows with e^(x-m) stored; β from ``schedule.beta_float``."""
    rows = x2.shape[0]
    out = np.empty_like(x2)
    kind = np.empty(rows, dtype=np.int64)
    m = np.empty(rows, dtype=x2.dtype)
    c = np.empty(rows, dtype=np.int64)
    neff = np.empty(rows, dtype=np.int64)
    r = np.empty(rows)
    h = np.empty(rows)
    _k.rows_stats(x2, out, eps, kind, m, c, neff, r, h)
    beta = schedule.checked_beta(h, neff)
    beta[kind == ROW_INVALID] = np.nan
    beta[(kind == ROW_EMPTY) | (kind == ROW_MASKED)] = 1.0
    return out, kind, m, c, r, h, beta


#: Bytes after an input row within which an output row makes the kernels' loops run scalar.
#: LLVM vectorises a loop that reads a row of `x` and writes a row of `out` behind a run-time
#: check that `out` does not start less than a vector footprint after `x` (vector width x
#: unroll x item size: 256 bytes with AVX-512); there the scalar copy of the loop runs, and
#: its sums, reassociated in the vector loop, come out in another order. An output 64 bytes
#: after its input gave an adaptive softmax 65 ulps from the usual bits (both within the
#: error model), and ``out=None`` did so at random, wherever numpy's allocator put the
#: result. 4096 leaves room for wider vectors and unrolling.
_ALIAS_WINDOW = 4096


def _apart(out: np.ndarray, x: np.ndarray) -> bool:
    """Whether `out` starts before `x` or at least :data:`_ALIAS_WINDOW` bytes after it."""
    gap = out.__array_interface__["data"][0] - x.__array_interface__["data"][0]
    return gap <= 0 or gap >= _ALIAS_WINDOW


def _output_for(x: np.ndarray) -> np.ndarray:
    """An uninitialised C-contiguous array like `x`, :func:`_apart` from it (same bits always)."""
    out = np.empty_like(x)
    if _apart(out, x):
        return out
    pad = -(-_ALIAS_WINDOW // x.itemsize)
    buf = np.empty(x.size + pad, dtype=x.dtype)
    start = 0 if buf.__array_interface__["data"][0] < x.__array_interface__["data"][0] else pad
    return buf[start : start + x.size].reshape(x.shape)


def _run(
    x: Any,
    axis: int,
    want: Quantity,
    schedule: Schedule | None,
    entropy_eps: float,
    out: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.dtype, int, tuple[int, ...]]:
    """Compute along `axis`; return (values, entropy, beta, input dtype, axis, moved shape).

    When `out` is given it is checked; if it is C-contiguous, of the working dtype
    and `axis` is the last one, the kernels write into it directly.
    """
    schedule = resolve_schedule(schedule)
    eps = check_entropy_eps(entropy_eps)
    work, in_dtype, axis = _prepare(x, axis)
    moved_shape = work.shape
    x2 = _rows2d(work)
    rows, n = x2.shape
    vector = want in ("softmax", "adaptive_softmax")
    values = None
    if out is not None:
        lead = moved_shape[:-1]
        _check_out(out, (*lead[:axis], moved_shape[-1], *lead[axis:]), in_dtype)
        # the kernels overwrite a row's output before they have read all of its input
        # (the exponentials are stored, then the row is read again for β ≠ 1): an `out`
        # overlapping the input they read gets a fresh buffer, copied into `out` at the end
        # (numpy's ufunc semantics). Both are C-contiguous here, so overlapping bounds
        # mean shared memory; the non-aliasing path allocates nothing.
        direct = (
            axis == work.ndim - 1
            and out.flags.c_contiguous
            and out.flags.writeable
            and out.dtype == work.dtype
            and not np.may_share_memory(out, work)
            and _apart(out, work)
        )
        if direct:
            values = out.reshape(rows, n)
    if vector and values is None:
        values = _output_for(x2)
    # the per-row statistics are allocated only where they are computed: at 4096 rows
    # two needless arrays cost microseconds, against a kernel of tens of microseconds
    h = np.zeros(rows if want == "entropy" or n > CHUNK else 0)
    short_adaptive = want in ("adaptive_softmax", "beta") and 0 < n <= _k.SHORT_ROW
    beta = np.ones(0 if short_adaptive or (want == "softmax" and n <= CHUNK) else rows)
    # small calls run on one thread (see _threads_for): the kernels share out rows, groups
    # of rows (rows_adaptive) or a long row's chunks
    grouped = want in ("adaptive_softmax", "beta") and _k.SHORT_ROW < n <= CHUNK
    grouped = grouped and _schedule_args(schedule) is not None
    pieces = 2 if n > CHUNK else -(-rows // _k.ROW_GROUP) if grouped else rows
    with _threads_for(rows * n, pieces):
        if rows == 0:
            pass
        elif n > CHUNK:
            neff = np.zeros(rows, dtype=np.int64)
            states = []
            kinds = []
            for i in range(rows):
                state = long_row_state(x2[i])
                kind, hi = _long_row_entropy(x2[i], state, eps)
                states.append(state)
                kinds.append(kind)
                h[i] = hi
                neff[i] = state[3]
            kinds_a = np.array(kinds)
            if want in ("adaptive_softmax", "beta"):
                beta = schedule.checked_beta(h, neff)
            beta[kinds_a == ROW_INVALID] = np.nan
            beta[kinds_a == ROW_MASKED] = 1.0
            if vector:
                for i in range(rows):
                    b = float(beta[i]) if want == "adaptive_softmax" else 1.0
                    _long_row_write(x2[i], values[i], kinds[i], states[i], b)
        elif want == "softmax":
            if n <= _k.SHORT_ROW:
                _k.rows_softmax_short(x2, values)
            else:
                _k.rows_softmax(x2, values)
        elif want == "entropy":
            neff = np.empty(rows, dtype=np.int64)
            _k.rows_entropy(x2, eps, h, neff)
        else:
            args = _schedule_args(schedule)
            if args is not None:
                sched, coeffs, threshold, const = args
                h_cut = _beta_one_below(schedule)
                if n <= _k.SHORT_ROW:
                    m_buf = np.empty(rows, dtype=x2.dtype)
                    beta = np.empty(rows)  # every entry written by the kernel
                    _k.rows_adaptive_short(
                        x2, values, eps, sched, coeffs, threshold, const, h_cut, beta, m_buf
                    )
                else:
                    buf = np.empty((rows, 3))
                    _k.rows_adaptive(
                        x2, values, eps, sched, coeffs, threshold, const, h_cut, beta, buf
                    )
            else:
                tmp, kind, m, c, r, h, beta = _stats_and_beta(x2, eps, schedule)
                values[...] = tmp
                _k.rows_finish(x2, values, kind, m, c, r, beta)
    return values, h, beta, in_dtype, axis, moved_shape


def _deliver(
    values: np.ndarray,
    in_dtype: np.dtype,
    axis: int,
    moved_shape: tuple[int, ...],
    out: np.ndarray | None,
) -> np.ndarray:
    if out is not None and np.may_share_memory(values, out):
        return out  # the kernel wrote into out itself (values is a view of it)
    result = values.reshape(moved_shape)
    if axis != len(moved_shape) - 1:
        result = np.moveaxis(result, -1, axis)
    if in_dtype == np.float16:
        result = result.astype(np.float16)
    if out is None:
        return result
    out[...] = result
    return out


@_ieee
def softmax(x: Any, axis: int = -1, *, out: np.ndarray | None = None) -> np.ndarray:
    r"""Softmax along `axis`: :math:`e^{x_i - m} / \sum_j e^{x_j - m}`.

    Parameters
    ----------
    x : array_like
        Logits (float16/32/64 or integer; integers become float64).
    axis : int, default -1
        The axis to normalise along.
    out : numpy.ndarray, optional
        Destination of the same shape and dtype as the result (any strides). It may
        be `x` itself or overlap it: the result is then that of a separate output.

    Returns
    -------
    numpy.ndarray
        The probabilities, in the dtype of `x`.
    """
    values, _, _, in_dtype, axis, moved = _run(x, axis, "softmax", None, 0.0, out)
    return _deliver(values, in_dtype, axis, moved, out)


@_ieee
def entropy(x: Any, axis: int = -1, *, entropy_eps: float = 0.0) -> np.ndarray:
    r"""Entropy :math:`-\sum_i p_i \log p_i` (nats) of the softmax along `axis`.

    Parameters
    ----------
    x : array_like
        Logits.
    axis : int, default -1
        The axis the distributions lie along (removed from the result).
    entropy_eps : float, default 0.0
        ``0`` for the exact entropy, ``eps > 0`` for
        :math:`-\sum_i p_i \log(p_i + \varepsilon)` (the paper's listing).

    Returns
    -------
    numpy.ndarray
        Entropies in the dtype of `x` (computed in float64 from the row's
        state), shape of `x` without `axis`.
    """
    _, h, _, in_dtype, axis, moved = _run(x, axis, "entropy", None, entropy_eps)
    return h.reshape(moved[:-1]).astype(in_dtype)


@_ieee
def beta(
    x: Any, axis: int = -1, *, schedule: Schedule | None = None, entropy_eps: float = 0.0
) -> np.ndarray:
    """The inverse temperature β of each row, from its entropy and the schedule.

    Returns
    -------
    numpy.ndarray
        float64, shape of `x` without `axis`.
    """
    schedule = resolve_schedule(schedule)
    check_entropy_eps(entropy_eps)
    work, _, _ = _prepare(x, axis)
    x2 = _rows2d(work)
    if x2.shape[0] == 0:
        return np.ones(work.shape[:-1])
    if x2.shape[1] > CHUNK:
        _, _, b, _, _, moved = _run(x, axis, "beta", schedule, entropy_eps)
        return b.reshape(moved[:-1])
    _, _, _, _, _, _, b = _stats_and_beta(x2, check_entropy_eps(entropy_eps), schedule)
    return b.reshape(work.shape[:-1])


@_ieee
def adaptive_softmax(
    x: Any,
    axis: int = -1,
    *,
    schedule: Schedule | None = None,
    entropy_eps: float = 0.0,
    out: np.ndarray | None = None,
) -> np.ndarray:
    r"""Adaptive-temperature softmax :math:`\operatorname{softmax}(\beta(H(x))\,x)` along `axis`.

    Parameters
    ----------
    x : array_like
        Logits.
    axis : int, default -1
        The axis to normalise along.
    schedule : Schedule, optional
        Default :class:`~softmaxtheory.spec.PaperPolynomial`. Polynomial and
        constant schedules are evaluated inside the kernel (bitwise as their
        ``beta_float``); any other schedule through its ``beta_float`` between
        the passes.
    entropy_eps : float, default 0.0
        The entropy mode (see :func:`entropy`).
    out : numpy.ndarray, optional
        Destination (same shape and dtype as the result; any strides). It may be `x`
        itself (in place) or overlap it: the result is that of a separate output.

    Returns
    -------
    numpy.ndarray
        The probabilities, in the dtype of `x`.

    Examples
    --------
    >>> import numpy as np
    >>> from softmaxtheory.accelerated import cpu
    >>> x = np.array([3.0, 1.0, 0.0, 0.0, -1.0, 2.0])
    >>> p = cpu.adaptive_softmax(x)
    >>> bool(p[0] > cpu.softmax(x)[0])
    True
    """
    values, _, _, in_dtype, axis, moved = _run(
        x, axis, "adaptive_softmax", schedule, entropy_eps, out
    )
    return _deliver(values, in_dtype, axis, moved, out)


# ---------------------------------------------------------------------------
# attention
# ---------------------------------------------------------------------------


def _native(arr: np.ndarray) -> np.ndarray:
    """`arr` in the machine's byte order (a big-endian file, say: the same values)."""
    return arr if arr.dtype.isnative else arr.astype(arr.dtype.newbyteorder("="))


def _attn_array(a: Any, name: str) -> np.ndarray:
    refuse_masked(a, name, "operand")
    arr = numpy_array(a, name)
    if arr.dtype.kind in "iu":
        arr = exact_float64(arr, name)
    elif arr.dtype.name not in NUMPY_DTYPES:
        raise refuse_dtype(name, arr.dtype)
    arr = _native(arr)
    if arr.ndim < 2:
        raise ValueError(f"{name} must have shape (..., length, features), got {arr.shape}")
    return arr


def _grouped(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray, Any, int | None]:
    """Grouped-query operands as ordinary ones: ``(q, k, v, mask, Hq)``.

    With :math:`g = H_q / H_k` query heads per key head, `q` is viewed as
    ``(..., Hk, g, L, d)`` and `k`, `v` as ``(..., Hk, 1, S, d)`` (a view: the kernels
    read a broadcast slice once, not g times), the mask's head axis split likewise;
    the caller folds the result's two head axes back into ``Hq`` (returned). Where
    `k` and `v` have different head counts they are repeated
    (:func:`~softmaxtheory.spec.expand_kv_heads`), and ``Hq`` is None.
    """
    if min(q.ndim, k.ndim, v.ndim) < 3 or q.shape[-3] == 0:
        return q, *expand_kv_heads(q, k, v), mask, None  # (its errors, or no heads at all)
    hq, hk, hv = q.shape[-3], k.shape[-3], v.shape[-3]
    if hk == 0 or hv == 0 or hq % hk or hq % hv:
        expand_kv_heads(q[..., :0, :], k[..., :0, :], v[..., :0, :])  # (its error: no data)
    if hk != hv:
        return q, *expand_kv_heads(q, k, v), mask, None
    g = hq // hk
    if g == 1:
        return q, k, v, mask, None
    qg = q.reshape(*q.shape[:-3], hk, g, *q.shape[-2:])
    kg, vg = k[..., :, None, :, :], v[..., :, None, :, :]
    if mask is not None:
        refuse_masked(mask, "mask", "mask")
        m = numpy_array(mask, "mask")
        if m.ndim >= 3 and m.shape[-3] == hq:
            mask = m.reshape(*m.shape[:-3], hk, g, *m.shape[-2:])
        elif m.ndim >= 3 and m.shape[-3] == 1:
            mask = m[..., None, :, :]
        else:
            mask = m  # (no head axis: it broadcasts; another head count is refused below)
    return qg, kg, vg, mask, hq


def _attn_mask(
    mask: Any, lead: tuple[int, ...], L: int, S: int
) -> tuple[np.ndarray | None, np.ndarray | None, tuple[int, ...]]:
    """(keep, add, lead): the mask as it is, for the kernels to read in place.

    A boolean mask is the keep mask, a floating one the additive term (float16 is
    widened to float32, any other float read as given); neither is broadcast or
    copied here. An integer mask is refused, as torch refuses it.
    """
    refuse_masked(mask, "mask", "mask")
    marr = numpy_array(mask, "mask")
    if marr.dtype.kind in "iu":
        raise TypeError(
            f"mask must be boolean (True attends) or floating (added to the logits), "
            f"got integer dtype {marr.dtype}: pass mask.astype(bool) or a float mask"
        )
    if marr.dtype != bool and marr.dtype.name not in NUMPY_DTYPES:
        raise TypeError(f"mask must be boolean or floating, got dtype {marr.dtype}")
    marr = _native(marr)
    shape = (*lead, L, S)
    try:
        target = np.broadcast_shapes(marr.shape, shape)
    except ValueError:
        target = None
    if target is None or target[-2:] != (L, S):  # it must broadcast to (L, S), not only with it
        raise ValueError(f"mask of shape {marr.shape} does not broadcast to {shape}")
    if marr.dtype == bool:
        return marr, None, target[:-2]
    if marr.dtype == np.float16:
        marr = marr.astype(np.float32)
    return None, marr, target[:-2]


@_ieee
def adaptive_attention(
    q: Any,
    k: Any,
    v: Any,
    mask: Any = None,
    scale: float | None = None,
    *,
    is_causal: bool = False,
    schedule: Schedule | None = None,
    entropy_eps: float = 0.0,
    enable_gqa: bool = False,
) -> np.ndarray:
    r"""Adaptive attention, streaming over key blocks (two passes, never the n×n matrix).

    .. math::

        x_{ij} = \mathrm{scale}\; q_i \cdot k_j + \mathrm{mask}_{ij}, \qquad
        \mathrm{out}_i = \sum_j \operatorname{softmax}(\beta_i x_i)_j\, v_j .

    Pass 1 folds each query's logits, one block of keys at a time, into the
    streaming state of theorem T7 (its entropy, hence β); pass 2 recomputes the
    logits block by block and accumulates the tempered weights times `v`.
    The queries of every (batch, head) slice run in one parallel loop, four at a
    time (each key and value row is read once for the four; a causal block stops at
    its last query's keys). Memory is
    the output, a few floats per query, and `q`, `k` and `v` in the working dtype,
    each at its own size (a key tensor shared by the heads is not repeated per
    head); the mask is read in place, by key block, through its broadcast strides
    (a boolean mask as booleans), and ``is_causal`` builds no mask at all.

    Logits and exponentials are computed in float32 when every input is float32
    (or float16), else in float64; the weighted sums of `v` in float64. A query
    whose logits leave the float range (``q, k ~ 1e200``, ``scale = 1e308``) is
    recomputed on a slower path that scales each logit by a power of two
    :math:`2^{-G}` chosen for its row, so its outputs are those of the exact
    logits up to the usual rounding of the float logits.

    Parameters
    ----------
    q, k, v : array_like
        Shapes ``(..., L, d)``, ``(..., S, d)``, ``(..., S, dv)``; leading
        dimensions broadcast.
    mask : array_like, optional
        Broadcastable to ``(..., L, S)``: boolean (``True`` takes part) or
        floating (added to the logits, ``-inf`` masks). Integer masks are refused
        (as in torch).
    scale : float, optional
        Default ``1 / sqrt(d)``.
    is_causal : bool, default False
        Query ``i`` attends to keys ``j <= i`` only (the lower triangle, as in
        ``torch.nn.functional.scaled_dot_product_attention``); not together with `mask`.
    schedule : Schedule, optional
        Default :class:`~softmaxtheory.spec.PaperPolynomial`.
    entropy_eps : float, default 0.0
        The entropy mode.
    enable_gqa : bool, default False
        Grouped-query attention: `k` and `v` may have fewer heads (axis -3) than `q`,
        each a divisor of its count; query head :math:`h` reads key head
        :math:`\lfloor h / (H_q / H_k) \rfloor` (SDPA's ``enable_gqa``). Where `k` and
        `v` have as many heads, they are read in place, not repeated.

    Returns
    -------
    numpy.ndarray
        ``(..., L, dv)`` in the inputs' common dtype (``numpy.result_type``):
        float16 if every input is float16 (computed in float32, as the row
        functions do), float32 if every input is float32 or float16, else
        float64. A query whose keys are all masked gives zeros; a NaN or
        ``+inf`` logit, or a non-finite component of the query or of a key it
        attends to, gives NaN (as in the reference).

    Raises
    ------
    TypeError
        For an integer or non-numeric `mask`, a non-bool `is_causal`.
    ValueError
        For shapes that do not match or broadcast, `mask` together with `is_causal`.
    """
    qa, ka, va = _attn_array(q, "q"), _attn_array(k, "k"), _attn_array(v, "v")
    if not isinstance(enable_gqa, bool | np.bool_):
        raise TypeError(f"enable_gqa must be a bool, got {enable_gqa!r}")
    if enable_gqa:
        qg, kg, vg, mg, heads = _grouped(qa, ka, va, mask)
        out = adaptive_attention(qg, kg, vg, mg, scale, is_causal=is_causal,
                                 schedule=schedule, entropy_eps=entropy_eps)  # fmt: skip
        return out if heads is None else out.reshape(*out.shape[:-4], heads, *out.shape[-2:])
    if not isinstance(is_causal, bool | np.bool_):
        raise TypeError(f"is_causal must be a bool, got {is_causal!r}")
    causal = bool(is_causal)
    if causal and mask is not None:
        raise ValueError("pass either mask or is_causal=True, not both")
    lead, L, S, scale = attention_layout(qa, ka, va, scale)
    schedule = resolve_schedule(schedule)
    eps = check_entropy_eps(entropy_eps)
    d = qa.shape[-1]
    dv = va.shape[-1]
    low = all(a.dtype in (np.float16, np.float32) for a in (qa, ka, va))
    work = np.float32 if low else np.float64
    out_dtype = np.result_type(qa, ka, va)  # float16 only where every operand is
    keep, add = np.ones((1, 1), dtype=bool), np.zeros((1, 1), dtype=work)
    plain = mask is None  # the kernels then read neither mask term
    if mask is not None:
        keep_m, add_m, lead = _attn_mask(mask, lead, L, S)
        keep = keep if keep_m is None else keep_m
        add = add if add_m is None else add_m
    N = math.prod(lead)
    if N == 0:
        return np.zeros((*lead, L, dv), dtype=out_dtype)
    # each operand as a stack of its distinct (batch, head) slices, and each slice's entry
    # in every stack: the kernels run all the (slice, block of queries) pairs in one
    # parallel loop (a loop over slices here cost 34 µs a slice: 2.2 s for 65537 slices
    # of one query)
    qs, q_at = slice_stack(qa, lead, work)
    ks, k_at = slice_stack(ka, lead, work)
    vs, v_at = slice_stack(va, lead, work)
    adds, a_at = slice_stack(add, lead)
    keeps, p_at = slice_stack(keep, lead)
    adds = np.broadcast_to(adds, (adds.shape[0], L, S))
    keeps = np.broadcast_to(keeps, (keeps.shape[0], L, S))
    slices = np.stack([q_at, k_at, v_at, a_at, p_at], axis=1)
    # per query row of every slice: its kind, maximum, unmasked count, entropy and wide
    # shift; β for all of them in one call; then the outputs
    kinds = np.empty((N, L), dtype=np.int64)
    ms = np.empty((N, L))
    neffs = np.empty((N, L), dtype=np.int64)
    hs = np.empty((N, L))
    gs = np.zeros((N, L), dtype=np.int64)
    out = np.zeros((N, L, dv), dtype=np.float64)

    def operands(n: int) -> tuple[np.ndarray, ...]:
        at = slices[n]
        return qs[at[0]], ks[at[1]], adds[at[3]], keeps[at[4]], qbads[at[0]], kbads[at[1]]

    # the kernels share out the (slice, block of queries) pairs: one pair, or little work,
    # runs on one thread (see _threads_for)
    with _threads_for(N * L * S * (d + dv) // 16, N * -(-L // _k.QUERY_BLOCK)):
        qbads, kbads = _nonfinite_rows(qs), _nonfinite_rows(ks)
        _k.attention_stats(qs, ks, adds, keeps, slices, plain, causal, qbads, kbads, scale, eps,
                           kinds, ms, neffs, hs)  # fmt: skip
        wide = kinds == _k.KIND_WIDE
        kexps: dict[int, int] = {}
        for n in np.flatnonzero(wide.any(axis=1)).tolist():
            qi, ki, ai, ke, qbad, kbad = operands(n)
            finite = np.abs(ki[np.isfinite(ki)]) if ki.size else ki
            kexp = math.frexp(float(finite.max()))[1] if finite.size and finite.max() else -1074
            kexps[n] = kexp
            _k.attention_wide_stats(qi, ki, ai, ke, causal, qbad, kbad, scale, kexp, eps,
                                    np.flatnonzero(wide[n]), kinds[n], ms[n], gs[n], neffs[n],
                                    hs[n])  # fmt: skip
        betas = schedule.checked_beta(hs, neffs)
        betas[kinds == ROW_INVALID] = np.nan
        betas[kinds == ROW_MASKED] = 1.0
        apply_kinds = np.where(wide, _k.KIND_WIDE, kinds)
        _k.attention_apply(qs, ks, vs, adds, keeps, slices, plain, causal, qbads, kbads, scale,
                           apply_kinds, ms, betas, out)  # fmt: skip
        for n, kexp in kexps.items():
            qi, ki, ai, ke, qbad, kbad = operands(n)
            _k.attention_wide_apply(qi, ki, vs[slices[n, 2]], ai, ke, causal, qbad, kbad, scale,
                                    kexp, np.flatnonzero(wide[n]), kinds[n], ms[n], gs[n],
                                    betas[n], out[n])  # fmt: skip
        vbads = _nonfinite_rows(vs)
        for n in np.flatnonzero(vbads[slices[:, 2]].any(axis=1)).tolist():
            _, _, ai, ke, _, _ = operands(n)
            vbad = np.flatnonzero(vbads[slices[n, 2]])
            _non_finite_values(out[n], vs[slices[n, 2]][vbad], vbad, ai, ke, causal, kinds[n])
    # one rounding of the float64 sums to the output's format
    return out.reshape(*lead, L, dv).astype(out_dtype)


def _nonfinite_rows(x: np.ndarray) -> np.ndarray:
    """Whether each row ``x[i, j, :]`` of a 3-d stack holds a NaN or an infinity."""
    out = np.empty(x.shape[:2], dtype=np.bool_)
    _k.rows_nonfinite(x, out)
    return out


def _non_finite_values(
    o: np.ndarray,
    vj: np.ndarray,
    cols: np.ndarray,
    add: np.ndarray,
    keep: np.ndarray,
    causal: bool,
    kind: np.ndarray,
) -> None:
    r"""Set the outputs that meet a non-finite value of a key they attend to, in place.

    Every unmasked key has a weight :math:`e^{\beta x_{ij}} / Z > 0` in exact
    arithmetic, however small its float value: one ``±inf`` value makes the
    output column ``±inf``, a NaN or both signs make it NaN. The kernels'
    weights can underflow to 0, so the rule is applied here, only to the keys
    `cols` whose values `vj` are not finite (``O(L · len(cols))`` work).
    """
    L = o.shape[0]
    live = np.asarray(keep[:, cols], dtype=bool) & (np.asarray(add[:, cols]) > -np.inf)
    if causal:
        live &= cols[None, :] <= np.arange(L)[:, None]
    # only regular rows (kind 0): NaN rows (kind 3) stay NaN, fully masked rows zeros
    live &= (kind == ROW_REGULAR)[:, None]
    for c in range(o.shape[1]):
        col = vj[:, c]
        bad = ~np.isfinite(col)
        if not bad.any():
            continue
        hit = live[:, bad]
        vals = col[bad]
        pos = (hit & (vals == np.inf)).any(axis=1)
        neg = (hit & (vals == -np.inf)).any(axis=1)
        nan = (hit & np.isnan(vals)).any(axis=1) | (pos & neg)
        o[pos, c] = np.inf
        o[neg, c] = -np.inf
        o[nan, c] = np.nan


# ---------------------------------------------------------------------------
# streaming object
# ---------------------------------------------------------------------------

_MASK64 = (1 << 64) - 1


def _digest(arr: np.ndarray) -> int:
    """Multiset digest of a 1-d chunk (order- and chunking-independent, mod 2**64)."""
    parts = np.empty(max(1, -(-arr.size // CHUNK)), dtype=np.uint64)
    _k.chunk_digests(arr, CHUNK, parts)
    return int(parts.sum(dtype=np.uint64))


class StreamingSoftmax:
    r"""Adaptive softmax of one row too long for memory, fed in chunks.

    The row is read in two or three passes over its chunks (in any chunking
    and any order within a pass):

    1. :meth:`update` with every chunk builds the streaming state
       :math:`(m, c, r, t)` of theorem T7; states of separately fed parts
       combine with :meth:`merge` (or ``+``). Then :meth:`entropy` and
       :meth:`beta` are available.
    2. Only when β ≠ 1 (:attr:`needs_tempered_pass`): :meth:`update_tempered`
       with every chunk sums :math:`e^{\beta(x - m)}`, relative to the maximum
       :math:`m` and the β of the *whole* row, so pass 1 must be complete (every
       part merged) before pass 2 starts. In parallel: give each worker a copy of
       the merged pass-1 state (``copy.deepcopy``, or the state pickled to another
       process), feed each chunk of the row to one copy (every copy calls
       :meth:`update_tempered`, with an empty chunk if it has none), and merge
       the copies: copies in pass 2 keep that pass 1 once and add their tempered
       sums (see the second example).
    3. :meth:`normalize` returns each chunk's probabilities.

    Parameters
    ----------
    schedule : Schedule, optional
        Default :class:`~softmaxtheory.spec.PaperPolynomial`; ``Constant(1)``
        gives the plain softmax (always two passes).
    dtype : numpy dtype, default float64
        float32 or float64: chunks are converted to it, results returned in it (a
        finite value beyond its range is refused with a ValueError).

    Notes
    -----
    Only the exact entropy mode is streamable (:math:`-\sum p\log(p+\varepsilon)`
    needs the normaliser before the sum). Merging is the fixed-order float ⊕ of
    T7; different chunkings give results equal within the documented error, and
    the same chunking gives identical bits for any thread count.

    :meth:`merge` of two states in pass 1 is the ⊕ of T7, for states of two
    parts of the row (a state merged with itself, or a copy of itself, is the
    row twice). Once either side is in pass 2 (:meth:`update_tempered` was
    called on it, even with an empty chunk or where β = 1), the merge is accepted
    only between copies of one pass-1 state (made by ``copy.deepcopy``,
    ``copy.copy`` or pickling, with no :meth:`update` since: each state carries a
    random 64-bit tag of its pass-1 state, renewed by every change of it), which
    keep that pass 1 once and add their tempered sums; any other raises
    :class:`ValueError`, since tempered sums are relative to the maximum and β of
    the state they were taken in. So every worker of a parallel pass 2 calls
    :meth:`update_tempered`, with an empty chunk if it has none.

    Misuse is detected where it is cheap. Each pass keeps a multiset digest of its
    items (a sum of 64-bit hashes, independent of order and chunking, added on
    merge): a tempered pass that reaches the item count of pass 1 with other items
    raises :class:`ValueError`, as does one fed more items, and :meth:`normalize`
    or :meth:`update_tempered` of a value above the row's maximum (NaN, ``+inf``
    included) — such a value was never fed. Not detected: :meth:`normalize` of a
    value below the maximum that was never fed (it gets the probability it would
    have, without being part of the row; the reference's
    :class:`~softmaxtheory.reference.StreamState` raises), chunks normalised twice
    or not at all, and a digest collision (about :math:`2^{-64}` for unrelated
    data, not a guarantee against crafted input).

    Examples
    --------
    >>> import numpy as np
    >>> from softmaxtheory.accelerated import cpu
    >>> x = np.linspace(-3.0, 3.0, 10)
    >>> chunks = [x[:4], x[4:]]
    >>> state = cpu.StreamingSoftmax()
    >>> for c in chunks:
    ...     _ = state.update(c)
    >>> if state.needs_tempered_pass:
    ...     for c in chunks:
    ...         _ = state.update_tempered(c)
    >>> p = np.concatenate([state.normalize(c) for c in chunks])
    >>> bool(np.allclose(p, cpu.adaptive_softmax(x)))
    True

    Each pass in parallel (the states pickle, so the workers may be processes):
    pass 1 on the parts, merged; pass 2 on copies of the merged state, merged.

    >>> import copy
    >>> merged = cpu.StreamingSoftmax().update(chunks[0]) + cpu.StreamingSoftmax().update(
    ...     chunks[1]
    ... )
    >>> merged.needs_tempered_pass
    True
    >>> copies = [copy.deepcopy(merged) for _ in chunks]
    >>> for cp, c in zip(copies, chunks):
    ...     _ = cp.update_tempered(c)  # a no-op when β = 1
    >>> final = copies[0] + copies[1]
    >>> final.count
    10
    >>> p = np.concatenate([final.normalize(c) for c in chunks])
    >>> bool(np.allclose(p, cpu.adaptive_softmax(x)))
    True
    """

    def __init__(self, schedule: Schedule | None = None, dtype: Any = np.float64) -> None:
        self.schedule = resolve_schedule(schedule)
        try:
            dt = np.dtype(dtype)
        except TypeError as exc:
            raise TypeError(f"dtype must be float32 or float64, got {dtype!r}") from exc
        if dt not in (np.float32, np.float64):
            raise TypeError(f"dtype must be float32 or float64, got {dt}")
        self.dtype = dt
        self._bad = False
        self._m = -math.inf
        self._c = 0
        self._n = 0
        self._r = 0.0
        self._t = 0.0
        self._count = 0
        self._tb_c = 0
        self._tb_r = 0.0
        self._tb_count = 0
        self._digest = 0  # multiset digests (mod 2**64) of the items of each pass
        self._tb_digest = 0
        self._beta: float | None = None
        # a random tag of the pass-1 state, renewed by every change of it (None while
        # nothing was folded in): copies share it, and merge() keeps their pass 1 once
        # when they are pass-2 workers
        self._lineage: int | None = None
        # whether update_tempered() was called (even with nothing, even where β = 1), and
        # the items it was given
        self._in_pass2 = False
        self._tempered_fed = 0
        # whether normalize() was called: the row is complete from then on (where β = 1
        # no tempered pass closes pass 1, and a later update() made the values written
        # before it sum with the rest to more than 1)
        self._normalized = False

    # -- pass 1 ------------------------------------------------------------
    def _chunk(self, chunk: Any) -> np.ndarray:
        arr = as_logits(chunk, "chunk", exact=True)
        if arr.ndim != 1:
            raise ValueError(f"chunk must be 1-d, got shape {arr.shape}")
        given = arr
        with np.errstate(over="ignore"):
            arr = np.ascontiguousarray(arr, dtype=self.dtype)
        if arr is not given and arr.size and not np.isfinite(arr).all():
            beyond = np.isinf(arr) & np.isfinite(given)
            if beyond.any():
                # rounded to infinity, the item made the row NaN (as +inf) or masked it
                value = given[int(np.argmax(beyond))].item()
                raise ValueError(
                    f"chunk holds {value!r}, beyond the range of this {self.dtype.name} "
                    "state (it would round to infinity); make a float64 state"
                )
        # the kernels are compiled for writeable arrays only (a read-only memory map is copied)
        return arr if arr.flags.writeable else arr.copy()

    @_ieee
    @_chunk_threads
    def update(self, chunk: Any) -> StreamingSoftmax:
        """Fold a chunk of logits into the state (pass 1); returns self."""
        if self._in_pass2:
            raise RuntimeError("update() after the tempered pass started: make a new state")
        if self._normalized:
            raise RuntimeError(
                "update() after normalize(): the values written so far are of the row fed "
                "before; make a new state"
            )
        arr = self._chunk(chunk)
        if arr.size == 0:
            return self
        self._digest = (self._digest + _digest(arr)) & _MASK64
        if arr.size > CHUNK:
            bad, M, C, N, R, T = long_row_state(arr)
        else:
            m, nnan, c, ne, r, t = chunk_state_arrays(arr, CHUNK, 1)
            bad = bool(nnan[0] > 0 or m[0] == np.inf)
            M, C, N, R, T = float(m[0]), int(c[0]), int(ne[0]), float(r[0]), float(t[0])
        self._fold(bad, M, C, N, R, T, arr.size)
        return self

    def _fold(self, bad: bool, M: float, C: int, N: int, R: float, T: float, count: int) -> None:
        self._bad = self._bad or bad
        if not bad:
            self._m, self._c, self._n, self._r, self._t = _k.merge_state(
                self._m, self._c, self._n, self._r, self._t, M, C, N, R, T
            )
        self._count += count
        self._beta = None
        self._lineage = int.from_bytes(os.urandom(8), "little")

    def _pass1(self) -> tuple:
        """The pass-1 state with its tag: equal for copies of one pass-1 state only."""
        return (
            self._lineage, self._bad, self._m, self._c, self._n, self._r, self._t,
            self._count, self._digest,
        )  # fmt: skip

    @_ieee
    def merge(self, other: StreamingSoftmax) -> StreamingSoftmax:
        """Return a new state ``self ⊕ other`` (also ``self + other``).

        States in pass 1 (different parts of the row) are merged by the ⊕ of T7.
        Once either is in pass 2 (:meth:`update_tempered` was called), both must be
        copies of one pass-1 state (``copy.deepcopy``, ``copy.copy``, pickling, or
        the same object): the merge keeps that pass 1 once and adds the tempered
        sums each was fed, which is pass 2 run in parallel on copies of the merged
        pass-1 state.

        Parameters
        ----------
        other : StreamingSoftmax
            A state with the same schedule and dtype.

        Returns
        -------
        StreamingSoftmax
            A new state; `self` and `other` are left as they are.

        Raises
        ------
        TypeError
            If `other` is not a :class:`StreamingSoftmax`.
        ValueError
            If the schedules or dtypes differ; if either state is in pass 2
            (:meth:`update_tempered`) and the two are not copies of one pass-1 state
            (tempered sums are relative to the maximum and β of the state that was
            fed them, not of the merged row); if copies together were fed more items
            in pass 2 than pass 1 saw or, once as many, other items.
        """
        if not isinstance(other, StreamingSoftmax):
            raise TypeError(f"can only merge with a StreamingSoftmax, got {type(other).__name__}")
        if other.schedule != self.schedule or other.dtype != self.dtype:
            raise ValueError("cannot merge states with different schedules or dtypes")
        if self._normalized or other._normalized:
            raise RuntimeError(
                "merge() after normalize(): the row of a normalised state is complete (the "
                "values written from it are of that row, and a merged row makes them sum "
                "with the rest to more than 1); merge first, then normalise"
            )
        if self._in_pass2 or other._in_pass2:
            # (a state fed no items has no lineage: any two are copies of the empty row)
            copies = self._lineage is not None or self._count == 0
            if copies and self._pass1() == other._pass1():
                return self._merge_copies(other)
            raise self._tempered_merge_error(other)
        new = StreamingSoftmax(self.schedule, self.dtype)
        new._fold(self._bad, self._m, self._c, self._n, self._r, self._t, self._count)
        new._fold(other._bad, other._m, other._c, other._n, other._r, other._t, other._count)
        new._digest = (self._digest + other._digest) & _MASK64
        return new

    def _merge_copies(self, other: StreamingSoftmax) -> StreamingSoftmax:
        """Merge two copies of one pass-1 state: pass 1 once, the tempered sums added."""
        new = StreamingSoftmax(self.schedule, self.dtype)
        new._bad, new._m, new._c, new._n = self._bad, self._m, self._c, self._n
        new._r, new._t, new._count, new._digest = self._r, self._t, self._count, self._digest
        new._lineage, new._beta = self._lineage, self._beta
        new._in_pass2 = True
        fed = self._tempered_fed + other._tempered_fed
        if fed > self._count:
            raise ValueError(
                f"copies of one pass-1 state were fed {fed} items in update_tempered() "
                f"({self._tempered_fed} + {other._tempered_fed}), more than the {self._count} "
                "fed to update(): feed each chunk of the row to one copy only"
            )
        new._tempered_fed = fed
        tb_count = self._tb_count + other._tb_count
        new._tb_c = self._tb_c + other._tb_c
        new._tb_r = self._tb_r + other._tb_r
        new._tb_count = tb_count
        new._tb_digest = (self._tb_digest + other._tb_digest) & _MASK64
        new._check_passes_agree()
        return new

    def _tempered_merge_error(self, other: StreamingSoftmax) -> ValueError:
        """The error of a merge of tempered sums that are not relative to one state."""

        def describe(s: StreamingSoftmax) -> str:
            if not s._in_pass2:
                return "in pass 1"
            if not s.needs_tempered_pass:
                return f"in pass 2 at β = 1 (no tempered sums needed), max {s._m!r}"
            return f"tempered sums of {s._tb_count} items for max {s._m!r} and β {s.beta()!r}"

        if not (self._in_pass2 and other._in_pass2):
            why = "one is in pass 2 and the other is not a copy of its pass-1 state"
        elif (self._m, self.beta()) != (other._m, other.beta()):
            why = "the tempered sums were computed for different maxima or β"
        elif self._pass1()[1:] == other._pass1()[1:]:
            why = (
                "their pass-1 states are equal but were computed separately, which makes "
                "them two parts of a row, not copies of one pass-1 state"
            )
        else:
            why = "they are not copies of one pass-1 state"
        return ValueError(
            f"cannot merge these states ({describe(self)}; {describe(other)}): {why}. "
            "Tempered sums are relative to the maximum and β of the whole row: merge the "
            "pass-1 states of every part first, then feed update_tempered() the merged state, "
            "or copies of it (copy.deepcopy, pickle) that each get part of the row, and merge "
            "those copies"
        )

    __add__ = merge

    def __radd__(self, other: object) -> StreamingSoftmax:
        """``0 + state``: a copy of the state, so that ``sum(states)`` merges them all.

        The states are the parts' pass-1 states, or pass-2 copies of one merged state.
        """
        if isinstance(other, int) and not isinstance(other, bool) and other == 0:
            if self._normalized:
                return self.merge(self)  # (the RuntimeError of a merge after normalize())
            return copy.copy(self)
        return NotImplemented

    @property
    def count(self) -> int:
        """Items seen in pass 1 (masked included; :attr:`n_eff` leaves them out).

        The reference's :class:`~softmaxtheory.reference.StreamState` counts only
        unmasked items in its ``count``, this :attr:`n_eff`.
        """
        return self._count

    @property
    def n_eff(self) -> int:
        """Unmasked items seen in pass 1."""
        return self._n

    @property
    def max(self) -> float:
        """The running maximum (``-inf`` when empty or fully masked, NaN if invalid)."""
        return math.nan if self._bad else self._m

    @_ieee
    def entropy(self) -> float:
        """Entropy of the row seen so far (nats); 0 if empty/masked, NaN if invalid."""
        if self._bad:
            return math.nan
        if self._m == -math.inf:
            return 0.0
        return float(_k.entropy_from_state(self._c, self._r, self._t))

    @_ieee
    def beta(self) -> float:
        """β of the row from the schedule (1 if empty or masked, NaN if invalid)."""
        if self._beta is None:
            if self._bad:
                self._beta = math.nan
            elif self._m == -math.inf:
                self._beta = 1.0
            else:
                self._beta = float(self.schedule.checked_beta(self.entropy(), self._n))
        return self._beta

    @property
    def needs_tempered_pass(self) -> bool:
        """Whether pass 2 (:meth:`update_tempered`) is needed before :meth:`normalize`."""
        b = self.beta()
        return b == b and b != 1.0 and self._m != -math.inf

    # -- pass 2 ------------------------------------------------------------
    @_ieee
    @_chunk_threads
    def update_tempered(self, chunk: Any) -> StreamingSoftmax:
        r"""Add :math:`\sum e^{\beta(x-m)}` of a chunk (pass 2); returns self.

        Raises
        ------
        ValueError
            If the chunk holds a value above the maximum of pass 1 (never fed), if
            pass 2 is fed more items than pass 1, or if, once it has as many, its
            items are not those of pass 1 (their multiset digests differ).
        """
        arr = self._chunk(chunk)
        b = self.beta()
        tempered = self.needs_tempered_pass
        # every check before any change: a refused chunk leaves the state as it was
        self._check_fed(arr)
        fed = (self._tb_count if tempered else self._tempered_fed) + arr.size
        if fed > self._count:
            raise ValueError(
                f"update_tempered() was fed {fed} items, more than the {self._count} fed to "
                "update(): feed each chunk of the row once"
            )
        digest = (self._tb_digest + _digest(arr)) & _MASK64 if tempered else self._tb_digest
        if tempered:
            self._check_passes_agree(fed, digest)
        self._in_pass2 = True  # pass 1 is closed from here on
        self._tempered_fed += arr.size
        if not tempered:
            return self
        nchunk = max(1, -(-arr.size // CHUNK))
        cb = np.zeros(nchunk, dtype=np.int64)
        rb = np.zeros(nchunk)
        if arr.size:
            _k.chunks_tempered(arr, CHUNK, self.dtype.type(self._m), b, arr, False, cb, rb)
        self._tb_c += int(cb.sum())
        self._tb_r += float(_k.fold_sum(rb))
        self._tb_count = fed
        self._tb_digest = digest
        return self

    def _check_fed(self, arr: np.ndarray) -> None:
        """Refuse a chunk holding a value that cannot have been fed to pass 1.

        Only values above the maximum (NaN and ``+inf`` included, in a valid state)
        are certainly new; a value below it is not looked up.
        """
        if arr.size == 0 or self._bad:
            return
        top, nnan = _k.pass_max(arr, 0, arr.size)
        if nnan or top > self._m:
            bad = arr[np.isnan(arr) | (arr > self._m)][0]
            raise ValueError(
                f"chunk holds {float(bad)!r}, above the maximum {self._m!r} of every chunk "
                f"fed to update(): it was never fed to this state"
            )

    def _check_passes_agree(self, count: int | None = None, digest: int | None = None) -> None:
        """Refuse a tempered pass of as many items as pass 1 but other values.

        `count` and `digest` are the tempered pass's (its current ones by default).
        """
        count = self._tb_count if count is None else count
        digest = self._tb_digest if digest is None else digest
        if count == self._count and digest != self._digest:
            raise ValueError(
                "the chunks fed to update_tempered() are not those fed to update() (same "
                f"number of items, {self._count}, different values): feed every chunk of "
                "the row once to each pass"
            )

    # -- pass 3 ------------------------------------------------------------
    @_ieee
    @_chunk_threads
    def normalize(self, chunk: Any, out: np.ndarray | None = None) -> np.ndarray:
        """The (adaptive) softmax values of a chunk of the row, given the complete state.

        Parameters
        ----------
        chunk : array_like
            Items of the row, 1-d (any chunk of it, once every chunk has been fed).
        out : numpy.ndarray, optional
            Where to write the values: C-contiguous, of the chunk's shape and the
            state's dtype (any byte order). It may be the chunk itself; one that
            overlaps the chunk otherwise gets the values of the chunk as it was.

        Returns
        -------
        numpy.ndarray
            The values, `out` when given.

        Raises
        ------
        ValueError
            If the chunk holds a value above the row's maximum, NaN or ``+inf`` (never
            fed to a valid state), or if the tempered pass saw other items than pass 1.
        RuntimeError
            If β ≠ 1 and the tempered pass is incomplete.
        """
        arr = self._chunk(chunk)
        if out is None:
            out = np.empty(arr.shape, dtype=self.dtype)
        else:
            _check_out(out, arr.shape, self.dtype)
            if not out.flags.c_contiguous:
                raise ValueError("out must be C-contiguous")
            # the kernel reads item i and then writes item i: the chunk itself is a safe
            # `out`, a shifted view of it is not (a write would land on an unread item)
            shifted = np.may_share_memory(out, arr) and (
                out.__array_interface__["data"][0] != arr.__array_interface__["data"][0]
            )
            if shifted or not out.dtype.isnative:  # the kernels write native byte order
                out[...] = self.normalize(arr.copy() if shifted else arr)
                return out
        self._check_fed(arr)
        if self._bad or self._m == -math.inf:
            self._normalized = True
            out[...] = np.nan if self._bad else 0.0
            return out
        b = self.beta()
        if b != 1.0:
            if self._tb_count != self._count:
                raise RuntimeError(
                    f"β = {b} ≠ 1: feed every chunk to update_tempered() before normalize() "
                    f"({self._tb_count} of {self._count} items seen)"
                )
            self._check_passes_agree()
            inv = 1.0 / (self._tb_c + self._tb_r)
        else:
            inv = 1.0 / (self._c + self._r)
        self._normalized = True
        nchunk = -(-arr.size // CHUNK)
        if arr.size:
            _k.chunks_write(arr, CHUNK, self.dtype.type(self._m), b, inv, out, nchunk)
        return out

    def __repr__(self) -> str:
        return (
            f"StreamingSoftmax(count={self._count}, max={self.max}, "
            f"schedule={self.schedule!r}, dtype={self.dtype.name})"
        )
