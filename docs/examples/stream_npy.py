"""Adaptive softmax of one row stored in a ``.npy`` file too large for memory.

Usage::

    python stream_npy.py logits.npy probabilities.npy [CHUNK]

The row is read through one memory map per chunk (unmapped after use, so the pages
leave the process), folded into a :class:`softmaxtheory.accelerated.cpu.StreamingSoftmax`
(theorem T7), tempered once more if β > 1, then normalised chunk by chunk into an output
``.npy`` opened as a memory map. Prints H, β, the sum of the probabilities, the time
of each pass and the peak resident memory.
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Iterator

import numpy as np

from softmaxtheory.accelerated import cpu


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def _chunks(path: str, chunk: int) -> Iterator[tuple[int, np.ndarray]]:
    row = np.load(path, mmap_mode="r")
    if row.ndim != 1:
        raise ValueError(f"{path} must hold one row (a 1-d array), got shape {row.shape}")
    offset, dtype, n = row.offset, row.dtype, row.shape[0]
    del row
    for lo in range(0, n, chunk):
        part = np.memmap(path, dtype=dtype, mode="r", offset=offset + lo * dtype.itemsize,
                         shape=(min(chunk, n - lo),))  # fmt: skip
        yield lo, part
        del part


def adaptive_softmax_npy(src: str, dst: str, chunk: int = 1 << 22) -> dict[str, float]:
    """Write the adaptive softmax of the row in `src` to `dst`; return what was measured."""
    n = np.load(src, mmap_mode="r").shape[0]
    dtype = np.load(src, mmap_mode="r").dtype
    times = {}
    start = time.perf_counter()
    state = cpu.StreamingSoftmax(dtype=dtype)
    for _, part in _chunks(src, chunk):
        state.update(part)
    times["state"] = time.perf_counter() - start
    start = time.perf_counter()
    if state.needs_tempered_pass:
        for _, part in _chunks(src, chunk):
            state.update_tempered(part)
    times["tempered"] = time.perf_counter() - start
    start = time.perf_counter()
    header = np.lib.format.open_memmap(dst, mode="w+", dtype=dtype, shape=(n,))
    offset = header.offset
    del header  # the file exists with its header; chunks are written through their own maps
    total = 0.0
    for lo, part in _chunks(src, chunk):
        piece = state.normalize(part)
        target = np.memmap(dst, dtype=dtype, mode="r+", offset=offset + lo * dtype.itemsize,
                           shape=piece.shape)  # fmt: skip
        target[:] = piece
        target.flush()  # written pages go to the file and leave the process with the map
        del target
        total += float(piece.sum(dtype=np.float64))
    times["normalize"] = time.perf_counter() - start
    return {
        "n": n,
        "entropy": float(state.entropy()),
        "beta": float(state.beta()),
        "sum": total,
        **times,
        "peak_rss_mib": _peak_mib(),
    }


def main(argv: list[str]) -> int:
    """Run on the command line: ``SRC DST [CHUNK]``; returns the exit status."""
    usage = "usage: python stream_npy.py logits.npy probabilities.npy [CHUNK]"
    if len(argv) not in (2, 3):
        print(usage, file=sys.stderr)
        return 2
    try:
        chunk = int(argv[2]) if len(argv) > 2 else 1 << 22
    except ValueError:
        chunk = 0
    if chunk < 1:
        print(
            f"{usage}\nCHUNK must be a whole number of items >= 1, got {argv[2]!r}", file=sys.stderr
        )
        return 2
    print(f"peak RSS after import: {_peak_mib():.0f} MiB", flush=True)
    r = adaptive_softmax_npy(argv[0], argv[1], chunk)
    print(
        f"n = {r['n']}, H = {r['entropy']:.6f}, beta = {r['beta']:.6f}, sum = {r['sum']:.9f}\n"
        f"passes: state {r['state']:.2f} s, tempered {r['tempered']:.2f} s, "
        f"normalize {r['normalize']:.2f} s; peak RSS {r['peak_rss_mib']:.0f} MiB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
