"""Benchmarks printed by ``softmaxtheory bench`` (measured, never asserted in tests).

The reference section times the certified mpmath oracle on one long row whose
entropy lies in the window where the paper's schedule sharpens (β > 1), so
both passes run, and on the same row for plain softmax.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

__all__ = ["BenchResult", "as_dicts", "machine", "reference_rows", "run_reference"]


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
    """Rows for the reference benchmark: one with β > 1 and one with β = 1.

    The β > 1 row (for long rows) has a few dozen items well above a Gaussian
    background, which puts its entropy inside (H_on, H_off); the β = 1 row is a plain Gaussian of
    small spread (entropy close to log n, beyond H_off for long rows).
    """
    rng = np.random.default_rng(seed)
    if n <= 300:
        sharp = rng.normal(size=n)  # entropy about log(n) - 1/2: inside the window
    else:
        sharp = rng.normal(scale=3.0, size=n)
        sharp[: n // 300] += 12.0
    flat = rng.normal(scale=0.5, size=n)
    return {"beta>1": sharp, "beta=1": flat}


def _best_time(fn: Callable[[], Any], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def run_reference(n: int = 16384, repeat: int = 3, seed: int = 0) -> list[BenchResult]:
    """Time certified reference evaluations of one row of `n` items."""
    from . import reference

    results = []
    for label, row in reference_rows(n, seed).items():
        beta = float(reference.beta(row))
        for dtype in (np.float64, np.float32):
            for fname in ("adaptive_softmax", "softmax"):
                fn = getattr(reference, fname)

                def call(fn=fn, row=row, dtype=dtype):
                    return fn(row, dtype=dtype)

                seconds = _best_time(call, repeat)
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


def machine() -> dict[str, Any]:
    """A short description of the machine the benchmark ran on."""
    import os

    import mpmath

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "numpy": np.__version__,
        "mpmath": mpmath.__version__,
        "mpmath_backend": mpmath.libmp.BACKEND,
    }


def as_dicts(results: list[BenchResult]) -> list[dict[str, Any]]:
    """Results as plain dictionaries (for JSON)."""
    return [asdict(r) for r in results]
