"""The GPU benchmark under its first import path: :mod:`softmaxtheory.bench.torch`.

``from softmaxtheory.bench_torch import run_device`` keeps working; the code
lives in :mod:`softmaxtheory.bench.torch`, the benchmarks' package.
"""

from __future__ import annotations

from .bench import torch as _impl

__all__ = ["SHAPES", "run_device"]

run_device = _impl.run_device

#: (B, H, L, S, D) cases, bfloat16 (D = 128 at 8192 included).
SHAPES: tuple[tuple[int, int, int, int, int], ...] = _impl.SHAPES
