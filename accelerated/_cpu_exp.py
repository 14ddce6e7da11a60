"""Measure the ulp error of the CPU kernels' exponential (private; used by tests and docs)."""

from __future__ import annotations

import math

import mpmath
import numpy as np

from . import _cpu_kernels as _k

__all__ = ["EXP_DOMAIN", "exp", "ulp_error_float32", "ulp_error_float64"]

#: The inputs on which the kernels call the exponential: x - max <= 0 (NaN too).
EXP_DOMAIN = "(-inf, 0]"


def exp(x: np.ndarray) -> np.ndarray:
    """Apply the kernel exponential element-wise to a float32 or float64 array."""
    arr = np.ascontiguousarray(x)
    if arr.dtype not in (np.float32, np.float64):
        raise TypeError(f"x must be float32 or float64, got {arr.dtype}")
    flat = arr.reshape(-1)
    out = np.empty_like(flat)
    _k.exp_array(flat, out)
    return out.reshape(arr.shape)


def _ulps(got: np.ndarray, exact: np.ndarray, dtype: type) -> np.ndarray:
    spacing = np.spacing(np.abs(exact).astype(dtype)).astype(np.float64)
    return np.abs(got.astype(np.float64) - exact) / spacing


def ulp_error_float32(stride: int = 1, chunk: int = 1 << 24) -> tuple[float, float]:
    """Max ulp error of the float32 exponential over every `stride`-th float32 in [-104, 0].

    The float64 ``numpy.exp`` (error below 1 float64 ulp, i.e. ``2**-29`` float32 ulp)
    stands in for the exact value. Returns (max ulps, the argument where it occurs).
    """
    lo = np.float32(-0.0).view(np.uint32)  # 0x80000000
    hi = np.float32(-104.0).view(np.uint32)
    worst, where = 0.0, 0.0
    for start in range(int(lo), int(hi) + 1, chunk * stride):
        bits = np.arange(start, min(start + chunk * stride, int(hi) + 1), stride, dtype=np.uint32)
        x = bits.view(np.float32)
        got = exp(x)
        err = _ulps(got, np.exp(x.astype(np.float64)), np.float32)
        i = int(np.argmax(err))
        if err[i] > worst:
            worst, where = float(err[i]), float(x[i])
    return worst, where


def ulp_error_float64(samples: int = 20000, seed: int = 0) -> tuple[float, float]:
    """Max ulp error of the float64 exponential against mpmath on random and edge inputs.

    Inputs: uniform on [-746, 0], log-uniform magnitudes down to 1e-300, and the
    neighbourhoods of the reduction's boundaries k ln2 / 2. Returns (max ulps, argument).
    """
    rng = np.random.default_rng(seed)
    x = np.concatenate(
        [
            -rng.uniform(0.0, 746.0, samples // 2),
            -(10.0 ** rng.uniform(-300, 2.8, samples // 4)),
            -(np.arange(samples // 4) % 2150 + 0.5) * math.log(2) / 2
            + rng.integers(-2, 3, samples // 4) * 1e-13,
        ]
    )
    x = x[x >= -745.2]
    got = exp(x)
    spacing = np.spacing(got)
    err = np.empty(x.size)
    with mpmath.workprec(120):
        for j, (v, g, sp) in enumerate(
            zip(x.tolist(), got.tolist(), spacing.tolist(), strict=True)
        ):
            exact = mpmath.exp(mpmath.mpf(v))
            err[j] = float(abs(mpmath.mpf(g) - exact) / mpmath.mpf(sp))
    i = int(np.argmax(err))
    return float(err[i]), float(x[i])
