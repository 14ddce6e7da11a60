"""Benchmarks printed by ``softmaxtheory bench`` (measured, never asserted in tests).

The kernel section (:func:`run_kernels`) times :mod:`softmaxtheory.accelerated.cpu`
against ``scipy.special.softmax``, ``torch.softmax`` and a straightforward torch
adaptive softmax, as ratios to ``torch.softmax``, with elements/s and GB/s
against a memory bandwidth measured in the same run.

The reference section times the certified oracle on one long row whose
entropy lies in the window where the paper's schedule sharpens (β > 1), so
both passes run, and on the same row for plain softmax; then
(:func:`run_reference_speedup`) its fast double-double first pass against the
pure mpmath path, as ratios measured in the same run, with the fraction of
elements the fast pass could not decide.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .._formats import WORKING_DTYPES

__all__ = [
    "MIN_SECONDS",
    "ROW_KINDS",
    "AttentionReferenceSpeedup",
    "BenchResult",
    "KernelResult",
    "ReferenceSpeedup",
    "as_dicts",
    "best_time",
    "kernel_rows",
    "machine",
    "measure_bandwidth",
    "reference_rows",
    "run_kernels",
    "run_reference",
    "run_reference_attention",
    "run_reference_speedup",
    "save_json",
]

#: The shapes of the kernel section: three batches and one long row.
KERNEL_SHAPES: tuple[tuple[int, int], ...] = ((4096, 64), (1024, 1024), (64, 16384), (1, 1 << 24))
#: Small shapes for ``--quick`` (the long row still exceeds one chunk).
QUICK_SHAPES: tuple[tuple[int, int], ...] = ((64, 64), (8, 1024), (1, 1 << 17))


@dataclass(frozen=True)
class KernelResult:
    """One timed kernel case: best wall time, ratio to torch.softmax, throughput."""

    backend: str
    shape: tuple[int, int]
    dtype: str
    rows: str
    beta_gt1_fraction: float
    seconds: float
    ratio_to_torch_softmax: float | None
    elements_per_second: float
    gb_per_second: float
    bandwidth_fraction: float


@dataclass(frozen=True)
class BenchResult:
    """One timed case: best wall time over the repeats, in seconds."""

    case: str
    n: int
    dtype: str
    beta: float
    seconds: float
    items_per_second: float


def reference_rows(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    r"""Rows for the reference benchmark: one with β > 1 and one with β = 1 (paper schedule).

    The β > 1 row of a long row (``n > 300``) has ``n // 300`` items well above a
    Gaussian background, which puts its entropy inside :math:`(H_{on}, H_{off})`;
    the β = 1 row is a plain Gaussian of small spread (entropy close to
    :math:`\log n`, beyond :math:`H_{off}` for long rows). Where such a row's β is
    not what its label says (short rows, whose :math:`\log n` lies inside the
    window), a row that has it takes its place: for β > 1 the Gaussian scaled to
    an entropy inside the window, for β = 1 one item 40 above the Gaussian
    (entropy near 0). No row of 2 items or fewer has β > 1 (:math:`\log 2 <
    H_{on}`): the dict then holds the β = 1 row alone. Each label is checked with
    :func:`softmaxtheory.reference.beta`.
    """
    from .. import reference
    from ..strategies import branch_points

    rng = np.random.default_rng(seed)
    if n <= 300:
        sharp = rng.normal(size=n)
    else:
        sharp = rng.normal(scale=3.0, size=n)
        sharp[: n // 300] += 12.0
    flat = rng.normal(scale=0.5, size=n)
    rows = {}
    h_on, h_off = branch_points()["H_on"], branch_points()["H_off"]
    if math.log(n) > h_on + 0.02:
        if not float(reference.beta(sharp)) > 1.0:
            target = 0.5 * (h_on + min(h_off, math.log(n)))
            sharp = _gaussian_at_entropy(sharp, target)
        rows["beta>1"] = sharp
    if float(reference.beta(flat)) != 1.0:
        flat = flat.copy()
        flat[0] += 40.0
    rows["beta=1"] = flat
    for label, row in rows.items():
        beta = float(reference.beta(row))
        if (beta > 1.0) != (label == "beta>1"):  # never seen: the rows are made for it
            raise AssertionError(f"the {label} row of {n} items has beta {beta}")
    return rows


def _gaussian_at_entropy(g: np.ndarray, target: float) -> np.ndarray:
    """``s * g`` with its softmax entropy at `target` (below log n), by bisection on ``s``."""
    from .. import reference

    lo, hi = 0.0, 1.0
    while float(reference.entropy(hi * g)) > target:
        lo, hi = hi, 2.0 * hi
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if float(reference.entropy(mid * g)) > target else (lo, mid)
    return hi * g


#: Each case is repeated for at least this long (and at least ``repeat`` times): a
#: fast kernel timed only a few times reads the machine before its threads and
#: clocks have settled (measured: 0.18 ms instead of 0.135 ms on 4096×64 rows).
MIN_SECONDS = 0.1


def best_time(fn: Callable[[], Any], repeat: int, min_seconds: float = MIN_SECONDS) -> float:
    """The best wall time of `fn` (s) over at least `repeat` calls lasting `min_seconds` together.

    Parameters
    ----------
    fn : callable
        Called with no arguments.
    repeat : int
        The least number of calls.
    min_seconds : float, optional
        Calls go on until they have lasted this long together (:data:`MIN_SECONDS`), so
        that a fast case is timed after the clocks have settled.
    """
    best = float("inf")
    runs = 0
    begin = time.perf_counter()
    while runs < repeat or time.perf_counter() - begin < min_seconds:
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
        runs += 1
    return best


def run_reference(n: int = 16384, repeat: int = 3, seed: int = 0) -> list[BenchResult]:
    """Time certified reference evaluations of one row of `n` items."""
    from .. import reference

    results = []
    for label, row in reference_rows(n, seed).items():
        beta = float(reference.beta(row))
        for dtype in (np.float64, np.float32):
            for fname in ("adaptive_softmax", "softmax"):
                fn = getattr(reference, fname)

                def call(fn=fn, row=row, dtype=dtype):
                    return fn(row, dtype=dtype)

                seconds = best_time(call, repeat)
                results.append(
                    BenchResult(
                        case=f"reference.{fname} ({label})",
                        n=n,
                        dtype=np.dtype(dtype).name,
                        beta=beta,
                        seconds=seconds,
                        items_per_second=n / seconds,
                    )
                )
    return results


#: The row kinds of the kernel section (:func:`kernel_rows`).
ROW_KINDS: tuple[str, ...] = ("beta>1", "beta=1", "masked")


def kernel_rows(shape: tuple[int, int], kind: str, dtype: Any, seed: int = 0) -> np.ndarray:
    """Random rows whose β under the paper schedule is > 1 (``kind="beta>1"``) or 1.

    Gaussian logits of standard deviation 1/2. β > 1: rows of up to 256 items as
    they are (H ≈ log n − 1/8, below H_off), longer rows with 64 items lifted to
    carry ~90% of the mass (H ≈ 4.5). β = 1: rows of at least 512 items as they
    are (H ≈ log n − 1/8 > H_off = 5.945), shorter rows with one dominant item
    (H < H_on). With a cut at 256 for both, rows of 257 to 438 items labelled
    β = 1 had β up to 1.74. ``kind="masked"``: the β = 1 rows with their last
    ``n // 2`` items ``-inf``, as a padding mask leaves them (β is then whatever the
    schedule gives: 1 at the benchmark's shapes). The exponentials of masked items
    once underflowed, which x86 cores finish in microcode: such rows took 5 to 13
    times as long as dense ones, and no dense row showed it.

    Raises
    ------
    ValueError
        For a `kind` not in :data:`ROW_KINDS`.
    """
    if kind not in ROW_KINDS:
        raise ValueError(f"kind must be one of {ROW_KINDS}, got {kind!r}")
    rows, n = shape
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(size=(rows, n), dtype=np.float64) * 0.5
    if kind == "beta>1" and n > 256:
        x[:, :64] += np.log(10.0 * n / 64)  # 64 items carry ~90% of the mass: H near 4.5
    elif kind != "beta>1" and n < 512:
        x[:, 0] += 30.0  # one dominant item: H < H_on
    if kind == "masked":
        x[:, n - n // 2 :] = -np.inf
    return x.astype(dtype)


def measure_bandwidth(nbytes: int = 1 << 28, repeat: int = 5) -> float:
    """Memory bandwidth (bytes/s) of a parallel copy (read + write counted)."""
    from softmaxtheory.accelerated import _cpu_kernels as k

    src = np.ones(nbytes // 8)
    dst = np.empty_like(src)
    k.kernels.parallel_copy(src, dst)
    return 2 * src.nbytes / best_time(lambda: k.kernels.parallel_copy(src, dst), repeat)


def _torch_adaptive(torch: Any, x: Any) -> Any:
    """The straightforward torch adaptive softmax (the paper's listing, exact entropy)."""
    logp = torch.log_softmax(x, dim=-1)
    p = logp.exp()
    h = -(p * logp).nan_to_num().sum(-1, keepdim=True)
    poly = ((((-0.037 * h) + 0.481) * h - 2.3) * h + 4.917) * h - 1.791
    beta = torch.where(h > 0.5, torch.clamp(poly, min=1.0), torch.ones_like(h))
    return torch.softmax(beta * x, dim=-1)


def run_kernels(
    shapes: tuple[tuple[int, int], ...] = KERNEL_SHAPES,
    dtypes: tuple[str, ...] = WORKING_DTYPES,
    repeat: int = 10,
    threads: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[KernelResult], dict[str, Any]]:
    """Time every backend on every shape, dtype and row kind; return results and run info.

    Raises
    ------
    ValueError
        For a shape that is not two positive integers ``(rows, n)``, or a `repeat` below 1.
    """

    def whole(d: Any) -> bool:
        return isinstance(d, int | np.integer) and not isinstance(d, bool) and d >= 1

    bad = [sh for sh in shapes if len(sh) != 2 or not all(whole(d) for d in sh)]
    if bad:
        raise ValueError(f"shapes must be pairs (rows, n) of integers >= 1, got {bad[0]!r}")
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat!r}")
    import numba

    from softmaxtheory.accelerated import cpu

    try:
        import torch
    except ImportError:  # pragma: no cover - torch is optional
        torch = None
    try:
        from scipy import special
    except ImportError:  # pragma: no cover - scipy is optional
        special = None
    if threads is not None:
        numba.set_num_threads(threads)
    nthreads = numba.get_num_threads()
    if torch is not None:
        torch.set_num_threads(nthreads)
    say = progress or (lambda _msg: None)
    say("measuring memory bandwidth ...")
    bandwidth = measure_bandwidth()
    results: list[KernelResult] = []
    for shape in shapes:
        for dtype in dtypes:
            for kind in ROW_KINDS:
                say(f"timing {shape} {dtype} {kind} ...")
                x = kernel_rows(shape, kind, dtype)
                frac = float(np.mean(cpu.beta(x) > 1.0))
                out = np.empty_like(x)
                cases: dict[str, Callable[[], Any]] = {
                    "cpu.adaptive_softmax": lambda x=x, out=out: cpu.adaptive_softmax(x, out=out),
                    "cpu.softmax": lambda x=x, out=out: cpu.softmax(x, out=out),
                }
                if special is not None:
                    cases["scipy.special.softmax"] = lambda x=x: special.softmax(x, axis=-1)
                if torch is not None:
                    tx = torch.from_numpy(x)
                    cases["torch.softmax"] = lambda tx=tx: torch.softmax(tx, dim=-1)
                    cases["torch adaptive (plain)"] = lambda tx=tx: _torch_adaptive(torch, tx)
                reps = max(1, repeat if x.size < (1 << 22) else min(repeat, 5))
                times = {}
                for name, fn in cases.items():
                    fn()
                    times[name] = best_time(fn, reps)
                base = times.get("torch.softmax")
                nbytes = 3 * x.nbytes  # 2 reads + 1 write
                for name, sec in times.items():
                    results.append(
                        KernelResult(
                            backend=name,
                            shape=shape,
                            dtype=dtype,
                            rows=kind,
                            beta_gt1_fraction=frac,
                            seconds=sec,
                            ratio_to_torch_softmax=None if base is None else sec / base,
                            elements_per_second=x.size / sec,
                            gb_per_second=nbytes / sec / 1e9,
                            bandwidth_fraction=nbytes / sec / bandwidth,
                        )
                    )
    info = {"threads": nthreads, "bandwidth_gb_per_second": bandwidth / 1e9}
    return results, info


@dataclass(frozen=True)
class ReferenceSpeedup:
    """The fast first pass against the pure mpmath path on one row.

    ``mpmath_seconds`` is measured on a row of ``mpmath_n`` items (the first
    ``mpmath_n`` items of the same row) and scaled by ``n / mpmath_n`` when
    ``mpmath_n < n`` (``extrapolated``): the mpmath path is linear in ``n``.
    ``undecided_fraction`` is the fraction of the row's elements the fast pass
    left to mpmath; ``row_fallback`` says the whole row went to mpmath.
    """

    function: str
    row: str
    n: int
    dtype: str
    fast_seconds: float
    mpmath_n: int
    mpmath_seconds: float
    extrapolated: bool
    speedup: float
    undecided_fraction: float
    row_fallback: bool


def run_reference_speedup(
    n: int = 1 << 20,
    mpmath_n: int = 1 << 14,
    repeat: int = 3,
    seed: int = 0,
    dtypes: tuple[str, ...] = WORKING_DTYPES,
    say: Callable[[str], None] | None = None,
) -> list[ReferenceSpeedup]:
    """Time the reference's fast pass and its pure mpmath path (see :class:`ReferenceSpeedup`)."""
    from .. import reference
    from ..reference import _fast

    mpmath_n = min(mpmath_n, n)
    results = []
    for label, row in reference_rows(n, seed).items():
        small = row[:mpmath_n]
        for dtype in dtypes:
            for fname in ("softmax", "entropy", "adaptive_softmax"):
                fn = getattr(reference, fname)
                if say is not None:
                    say(f"  {fname} ({label}), {dtype}, n = {n} ...")
                for key in _fast.STATS:
                    _fast.STATS[key] = 0
                fn(row, dtype=dtype)  # counts of one call (and the exp table built)
                stats = dict(_fast.STATS)
                fast = best_time(
                    lambda fn=fn, dtype=dtype, row=row: fn(row, dtype=dtype), repeat, 0.0
                )
                with _fast.pure_mpmath():
                    small_time = best_time(
                        lambda fn=fn, dtype=dtype, small=small: fn(small, dtype=dtype), 1, 0.0
                    )
                slow = small_time * (n / mpmath_n)
                items = 1 if fname == "entropy" else n
                undecided = items if stats["row_fallback"] else stats["element_fallback"]
                results.append(
                    ReferenceSpeedup(
                        function=fname,
                        row=label,
                        n=n,
                        dtype=dtype,
                        fast_seconds=fast,
                        mpmath_n=mpmath_n,
                        mpmath_seconds=slow,
                        extrapolated=mpmath_n < n,
                        speedup=slow / fast,
                        undecided_fraction=undecided / items,
                        row_fallback=bool(stats["row_fallback"]),
                    )
                )
    return results


@dataclass(frozen=True)
class AttentionReferenceSpeedup:
    """The certified attention with its double-double pass against the pure mpmath path.

    One head of ``shape`` ``(L, S, d, dv)``: Gaussian queries, keys and values
    in `dtype` (the output format too), the paper's schedule. Both timings are
    of the whole head; ``undecided_fraction`` is the fraction of its query rows
    the double-double pass left to mpmath.
    """

    shape: tuple[int, int, int, int]
    dtype: str
    fast_seconds: float
    mpmath_seconds: float
    speedup: float
    undecided_fraction: float


def run_reference_attention(
    shape: tuple[int, int, int, int] = (64, 256, 64, 64),
    repeat: int = 3,
    seed: int = 0,
    dtypes: tuple[str, ...] = WORKING_DTYPES,
) -> list[AttentionReferenceSpeedup]:
    """Time the certified attention both ways (see :class:`AttentionReferenceSpeedup`)."""
    from .. import reference
    from ..reference import _fast

    L, S, d, dv = shape
    rng = np.random.default_rng(seed)
    base = (rng.standard_normal((L, d)), rng.standard_normal((S, d)), rng.standard_normal((S, dv)))
    results = []
    for dtype in dtypes:
        q, k, v = (a.astype(dtype) for a in base)

        def call(q=q, k=k, v=v, dtype=dtype) -> Any:
            return reference.adaptive_attention(q, k, v, dtype=dtype)

        for key in _fast.STATS:
            _fast.STATS[key] = 0
        call()  # counts of one call (and the exp table built)
        undecided = _fast.STATS["attention_fallback"] / L
        fast = best_time(call, repeat, 0.0)
        with _fast.pure_mpmath():
            slow = best_time(call, 1, 0.0)
        results.append(
            AttentionReferenceSpeedup(
                shape=shape,
                dtype=dtype,
                fast_seconds=fast,
                mpmath_seconds=slow,
                speedup=slow / fast,
                undecided_fraction=undecided,
            )
        )
    return results


def _cpu_model() -> str:
    """The processor's model name from ``/proc/cpuinfo``, or ``platform.processor()``."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    """Total memory in GiB from ``/proc/meminfo`` (None where it cannot be read)."""
    try:
        with open("/proc/meminfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _version(dist: str) -> str | None:
    """Installed version of the distribution `dist` (without importing it), or None."""
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def machine() -> dict[str, Any]:
    """A short description of the machine and software the benchmark ran on, dated (UTC)."""
    import datetime

    import mpmath

    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "softmaxtheory": _version("softmaxtheory"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_model": _cpu_model(),
        "cpus": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "numpy": np.__version__,
        "numba": _version("numba"),
        "llvmlite": _version("llvmlite"),
        "torch": _version("torch"),
        "scipy": _version("scipy"),
        "mpmath": mpmath.__version__,
        "mpmath_backend": mpmath.libmp.BACKEND,
    }


def as_dicts(results: list[Any]) -> list[dict[str, Any]]:
    """Results as plain dictionaries (for JSON)."""
    return [asdict(r) for r in results]


def save_json(doc: dict[str, Any], path: str) -> None:
    """Write `doc` to `path` as indented JSON, replacing the file at once (never half written).

    The document goes to a temporary file beside `path`, which then takes its place
    (``os.replace``), so a reader, or a run stopped at a time limit, finds either
    the previous file or the new one.
    """
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2)
            fh.write("\n")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):  # replace failed (path a directory, say): no stray file
            os.remove(tmp)
