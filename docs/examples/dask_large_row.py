"""Adaptive softmax of a row of 10⁹ items stored on disk, on a dask LocalCluster.

Usage::

    nice -n 10 python docs/examples/dask_large_row.py [--n N] [--chunk C] [--workers 1 2]
        [--certified-n M] [--dir DIR] [--json PATH] [--certified-only]

1. Writes a float32 row of ``N`` logits (default 10⁹: 4 GB) to ``DIR/logits.npy``,
   ``scale · z`` with ``z`` standard normal (default scale 6).
2. For each worker count: starts a ``LocalCluster`` of worker processes with one
   thread each (Numba also on one thread), reads the row as a dask array of blocks of
   ``C`` items (each block read from the file by the task that needs it), and stores
   :func:`softmaxtheory.accelerated.dask.adaptive_softmax` block by block into
   ``DIR/probabilities.npy``. Measures the wall time, and each worker's peak
   resident memory: the kernel's high-water mark ``VmHWM`` of the worker process,
   reset (``/proc/self/clear_refs``) just before the run and read just after.
3. On a row of ``M`` items (default 10⁷) held in memory: the certified adaptive
   softmax (``certified=True``) on dask's threaded scheduler in this process and on
   the two-worker cluster, compared with the float path and with the reference
   evaluated in one process (``--certified-only``: only this step, its figures
   replacing those in the JSON at ``PATH``).
4. Writes the figures to ``PATH`` (JSON) and deletes the files of ``DIR``.

The same code runs on a real cluster: replace the ``LocalCluster`` by
``Client("tcp://scheduler:8786")`` and put the row where every worker can read it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

HEADER_BYTES = 128  # numpy's .npy header of a 1-d array, version 1.0


class NpyRow:
    """A 1-d ``.npy`` file as an array-like for :func:`dask.array.from_array`.

    Each slice is read with one ``numpy.fromfile`` at its offset (no memory map,
    so no page of the file stays in the process after the read).
    """

    def __init__(self, path: str) -> None:
        arr = np.load(path, mmap_mode="r")
        self.path = path
        self.shape = arr.shape
        self.dtype = arr.dtype
        self.ndim = 1
        self.offset = arr.offset
        del arr

    def __getitem__(self, key: tuple[slice, ...] | slice) -> np.ndarray:
        k = key[0] if isinstance(key, tuple) else key
        lo, hi, _ = k.indices(self.shape[0])
        return np.fromfile(
            self.path,
            dtype=self.dtype,
            count=hi - lo,
            offset=self.offset + lo * self.dtype.itemsize,
        )

    def __setitem__(self, key: tuple[slice, ...] | slice, value: np.ndarray) -> None:
        k = key[0] if isinstance(key, tuple) else key
        lo, _, _ = k.indices(self.shape[0])
        with open(self.path, "r+b") as f:
            f.seek(self.offset + lo * self.dtype.itemsize)
            f.write(np.ascontiguousarray(value, dtype=self.dtype).tobytes())


def create_npy(path: str, n: int, dtype: np.dtype) -> None:
    """An ``.npy`` file of shape ``(n,)`` (contents unset: a sparse file)."""
    arr = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=(n,))
    del arr


def write_row(path: str, n: int, scale: float, seed: int, part: int = 1 << 24) -> None:
    """Write ``scale * z`` (float32, z standard normal) to the ``.npy`` at `path`."""
    create_npy(path, n, np.dtype(np.float32))
    rng = np.random.default_rng(seed)
    offset = NpyRow(path).offset
    with open(path, "r+b") as f:
        f.seek(offset)
        for lo in range(0, n, part):
            z = rng.standard_normal(min(part, n - lo), dtype=np.float32)
            z *= np.float32(scale)
            f.write(z.tobytes())


# -- run inside the workers ----------------------------------------------------------


def _warm_up() -> bool:
    """Load the compiled kernels (float32 blocks longer than a kernel chunk), the reference."""
    import dask.array as da

    from softmaxtheory.accelerated import cpu
    from softmaxtheory.accelerated import dask as dsm

    x = np.linspace(-3, 3, 3 * cpu.CHUNK, dtype=np.float32) * 4
    y = dsm.adaptive_softmax(da.from_array(x, chunks=2 * cpu.CHUNK)).compute(scheduler="sync")
    # and the reference (its tables are built on first use), for the certified run
    z = dsm.adaptive_softmax(da.from_array(x[:1000], chunks=300), certified=True)
    return bool(np.isfinite(y).all() and np.isfinite(z.compute(scheduler="sync")).all())


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> int:
    """Reset this process's peak resident set (VmHWM); return the current one (KiB)."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_kib("VmRSS")


def _peak() -> int:
    return _status_kib("VmHWM")


# -- measurement -------------------------------------------------------------------


def _cluster(workers: int):
    from distributed import Client, LocalCluster

    cluster = LocalCluster(
        n_workers=workers,
        threads_per_worker=1,
        processes=True,
        dashboard_address=None,
        silence_logs=40,
    )
    return cluster, Client(cluster)


def _per_worker(result: dict) -> list[float]:
    return [round(v / 1024, 1) for _, v in sorted(result.items())]


def run_large(src: str, dst: str, chunk: int, workers: int) -> dict:
    """One timed run: the adaptive softmax of the row in `src` stored into `dst`."""
    import dask
    import dask.array as da

    from softmaxtheory.accelerated import dask as dsm

    reader = NpyRow(src)
    n = reader.shape[0]
    create_npy(dst, n, reader.dtype)
    cluster, client = _cluster(workers)
    try:
        assert all(client.run(_warm_up).values())
        x = da.from_array(reader, chunks=chunk, meta=np.empty(0, dtype=reader.dtype))
        p = dsm.adaptive_softmax(x)
        store = da.store(p, NpyRow(dst), lock=False, compute=False)
        h, b = dsm.entropy(x), dsm.beta(x)
        load_before = os.getloadavg()
        baseline = client.run(_reset_peak)
        start = time.perf_counter()
        _, hv, bv = dask.compute(store, h, b)
        seconds = time.perf_counter() - start
        peaks = client.run(_peak)
        load_after = os.getloadavg()
        out = da.from_array(NpyRow(dst), chunks=chunk, meta=np.empty(0, dtype=reader.dtype))
        total = float(out.sum(dtype=np.float64).compute())
        top = float(out.max().compute())
    finally:
        client.close()
        cluster.close()
    return {
        "workers": workers,
        "threads_per_worker": 1,
        "seconds": round(seconds, 2),
        "items_per_second": n / seconds,
        "input_gb_per_second": n * reader.dtype.itemsize / seconds / 1e9,
        # the row is read three times (states, tempered sums, normalisation; the
        # tempered tasks skip their arithmetic where beta = 1) and written once
        "bytes_moved_gb": 4 * n * reader.dtype.itemsize / 1e9,
        "peak_rss_mib": _per_worker(peaks),
        "rss_before_run_mib": _per_worker(baseline),
        "entropy": float(hv),
        "beta": float(bv),
        "sum_of_probabilities": total,
        "largest_probability": top,
        "load_average_before": [round(v, 2) for v in load_before],
        "load_average_after": [round(v, 2) for v in load_after],
    }


def run_certified(n: int, chunk: int, workers: int, scale: float, seed: int) -> dict:
    """The certified adaptive softmax of an in-memory row: threads, then the cluster."""
    import dask.array as da

    from softmaxtheory import reference
    from softmaxtheory.accelerated import _dask_cert
    from softmaxtheory.accelerated import dask as dsm

    rng = np.random.default_rng(seed)
    row = rng.standard_normal(n, dtype=np.float32) * np.float32(scale)
    x = da.from_array(row, chunks=chunk)
    assert _warm_up()
    # dask's threaded scheduler in this process (two threads: the machine's cores)
    threads_load = os.getloadavg()
    threads_base = _reset_peak()
    start = time.perf_counter()
    q_threads = dsm.adaptive_softmax(x, certified=True).compute(scheduler="threads", num_workers=2)
    threads_seconds = time.perf_counter() - start
    threads_peak = _peak()
    readings = dsm._certified_rows(x, -1, "adaptive_softmax", None, 0.0)[1]
    fallback = str(_dask_cert.fallbacks(readings.compute(scheduler="threads"))[()])
    cluster, client = _cluster(workers)
    try:
        assert all(client.run(_warm_up).values())
        load_before = os.getloadavg()
        baseline = client.run(_reset_peak)
        start = time.perf_counter()
        q = dsm.adaptive_softmax(x, certified=True).compute()
        seconds = time.perf_counter() - start
        peaks = client.run(_peak)
        load_after = os.getloadavg()
        hq = float(dsm.entropy(x, certified=True).compute())
        bq = float(dsm.beta(x, certified=True).compute())
        start = time.perf_counter()
        p = dsm.adaptive_softmax(x).compute()
        float_seconds = time.perf_counter() - start
    finally:
        client.close()
        cluster.close()
    ref_load = os.getloadavg()
    start = time.perf_counter()
    ref = reference.adaptive_softmax(row, dtype=np.float32)
    ref_seconds = time.perf_counter() - start
    ulps = np.abs(p.view(np.int32).astype(np.int64) - q.view(np.int32).astype(np.int64))
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "n": n,
        "chunk": chunk,
        "workers": workers,
        "scale": scale,
        "seconds": round(seconds, 2),
        "peak_rss_mib": _per_worker(peaks),
        "rss_before_run_mib": _per_worker(baseline),
        "threads_seconds": round(threads_seconds, 2),
        "threads_peak_rss_mib": round(threads_peak / 1024, 1),
        "threads_rss_before_run_mib": round(threads_base / 1024, 1),
        "load_average_before_threads": [round(v, 2) for v in threads_load],
        "same_bits_threads_and_cluster": bool(q.tobytes() == q_threads.tobytes()),
        "exact_fallback": fallback,
        "entropy": hq,
        "beta": bq,
        "equals_reference_bit_for_bit": bool(np.array_equal(q, ref)),
        "reference_one_process_seconds": round(ref_seconds, 2),
        "float_path_seconds": round(float_seconds, 2),
        "float_path_max_ulps": int(ulps.max()),
        "float_path_share_exact": float(np.mean(ulps == 0)),
        "load_average_before": [round(v, 2) for v in load_before],
        "load_average_after": [round(v, 2) for v in load_after],
        "load_average_before_reference": [round(v, 2) for v in ref_load],
    }


def machine(nice: int) -> dict:
    """What ran the measurement."""
    import dask
    import distributed
    import numba

    cpu_model = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu_model = line.split(":", 1)[1].strip()
            break
    mem_kib = int(Path("/proc/meminfo").read_text().split()[1])
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu_model": cpu_model,
        "cpus": os.cpu_count(),
        "memory_gib": round(mem_kib / 2**20, 1),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numba": numba.__version__,
        "dask": dask.__version__,
        "distributed": distributed.__version__,
        "nice": nice,
        "cores_shared": True,
    }


def main(argv: list[str] | None = None) -> dict:
    """Run every measurement and write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10**9)
    ap.add_argument("--chunk", type=int, default=1 << 25)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--scale", type=float, default=6.0)
    ap.add_argument("--certified-n", type=int, default=10**7)
    ap.add_argument("--certified-chunk", type=int, default=10**6)
    ap.add_argument("--certified-scale", type=float, default=5.0)
    ap.add_argument("--dir", default="/tmp/softmaxtheory-dask-row")
    ap.add_argument("--json", default="dask_large_row.json")
    ap.add_argument("--shared-note", default="")
    ap.add_argument(
        "--large-runs",
        default=None,
        help="a file of the JSON lines an earlier invocation printed for the large runs: "
        "reuse them instead of measuring again (the certified run is measured)",
    )
    ap.add_argument(
        "--certified-only",
        action="store_true",
        help="measure only the certified run and replace its figures in the JSON at --json, "
        "keeping the machine, row and large-run figures there",
    )
    args = ap.parse_args(argv)
    # one core per worker: Numba's threads would otherwise compete with the other worker
    os.environ["NUMBA_NUM_THREADS"] = "1"
    os.environ["OMP_NUM_THREADS"] = "1"
    if args.certified_only:
        result = json.loads(Path(args.json).read_text())
        result["certified"] = _certified(args)
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
        return result
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    result = {"machine": machine(os.nice(0))}
    if args.shared_note:
        result["machine"]["note"] = args.shared_note
    result["row"] = {
        "n": args.n,
        "dtype": "float32",
        "file_gb": (HEADER_BYTES + 4 * args.n) / 1e9,
        "chunk": args.chunk,
        "chunk_mib": args.chunk * 4 / 2**20,
        "blocks": -(-args.n // args.chunk),
        "logits": f"{args.scale:g} · standard normal (seed 1)",
    }
    if args.large_runs:
        lines = Path(args.large_runs).read_text().splitlines()
        result["runs"] = [_earlier_run(json.loads(line), args.n) for line in lines if line]
        result["machine"]["large_runs_from"] = "an earlier invocation (its printed JSON lines)"
    else:
        result["runs"] = _measure_large(args, folder)
    result["certified"] = _certified(args)
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return result


def _certified(args: argparse.Namespace) -> dict:
    cert = run_certified(
        args.certified_n, args.certified_chunk, max(args.workers), args.certified_scale, seed=2
    )
    cert["nice"] = os.nice(0)
    print(json.dumps(cert), flush=True)
    return cert


def _earlier_run(run: dict, n: int) -> dict:
    """A run printed by an earlier version: drop its wrong pass count, recompute the bytes."""
    run.pop("passes_over_input", None)  # it counted 2 where beta = 1; the row is read 3 times
    run["bytes_moved_gb"] = 4 * n * 4 / 1e9
    return run


def _measure_large(args: argparse.Namespace, folder: Path) -> list[dict]:
    src, dst = str(folder / "logits.npy"), str(folder / "probabilities.npy")
    runs = []
    try:
        start = time.perf_counter()
        write_row(src, args.n, args.scale, seed=1)
        print(f"wrote {args.n:,} items in {time.perf_counter() - start:.1f} s", flush=True)
        for w in args.workers:
            run = run_large(src, dst, args.chunk, w)
            print(json.dumps(run), flush=True)
            runs.append(run)
    finally:
        for path in (src, dst):
            Path(path).unlink(missing_ok=True)
    return runs


if __name__ == "__main__":
    main()
