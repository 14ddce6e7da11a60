"""Attention cases with a tiny β and logit shifts beyond the float32 range.

With logits ``±3e38`` the shift :math:`x_j - m` of the low key is ``-6e38``, past the
float32 maximum; under β from ``1e-37`` down to ``1e-46`` (below the least float32
subnormal) the exponent :math:`\\beta (x_j - m)` is of order one, or so small that the
outputs are those of uniform weights. A kernel that forms ``x - m`` in float32 before scaling
(``-inf`` times β), flushes a subnormal β to zero, or clamps the shift gives other
weights. Shared by the interpreter tests (CI) and the CUDA tests (device runs).
"""

from __future__ import annotations

from typing import Any

from softmaxtheory.spec import Constant, LogLength, Schedule

__all__ = ["TINY_BETA_ROWS", "TINY_BETA_SCHEDULES", "tiny_beta_inputs"]

#: Schedules with a tiny β: a normal one, subnormal ones, one below the least
#: subnormal (float32 β is 0: uniform weights), and a length-dependent one.
TINY_BETA_SCHEDULES: dict[str, Schedule] = {
    "1e-37": Constant("1e-37"),
    "3e-39": Constant("3e-39"),
    "1e-40": Constant("1e-40"),
    "1e-46": Constant("1e-46"),
    "loglength-1e-40": LogLength("1e-40"),
}

#: The keys' first components (the logits of a query (1, 0, ...) at scale 1).
TINY_BETA_ROWS: dict[str, tuple[float, ...]] = {
    "two": (3e38, -3e38),
    "four": (3e38, -3e38, 0.0, 1.0),
}


def tiny_beta_inputs(row: str, device: Any = "cpu") -> tuple[Any, Any, Any]:
    """``(q, k, v)`` in float32, shapes (1, 1, 3, 16), (1, 1, n, 16), (1, 1, n, 4):
    three equal queries (1, 0, ...), keys whose first component is the row, values
    ``1, ..., n`` in every column."""
    import torch

    logits = TINY_BETA_ROWS[row]
    n = len(logits)
    q = torch.zeros(1, 1, 3, 16)
    q[..., 0] = 1.0
    k = torch.zeros(1, 1, n, 16)
    k[0, 0, :, 0] = torch.tensor(logits)
    v = torch.arange(1.0, n + 1).reshape(1, 1, n, 1).repeat(1, 1, 1, 4)
    return q.to(device), k.to(device), v.to(device)
