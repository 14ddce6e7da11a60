r"""What a kernel leaves behind in memory: its inputs and its earlier results (private).

A kernel may compute the right values and still be wrong for its caller: it writes
its result into its input (a caller that uses the input again reads probabilities as
logits), or it returns a buffer that its next call overwrites (a caller that keeps two
results holds one result twice). Neither shows in the values of the call that did it.
:class:`~softmaxtheory._check.target.Target` therefore gives the kernel private copies
of its operands and compares a :func:`snapshot` of each, taken before the call, with
their state after it; the property ``fresh_results`` compares a snapshot of a result
with the same result after a second call. A difference (:func:`changed`) fails.

Snapshots compare bits, not values: a NaN equals itself, and ``-0.0`` differs from
``0.0``.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from .report import is_torch

__all__ = ["Change", "Snapshot", "changed", "private_copy", "snapshot"]


class Snapshot(NamedTuple):
    """A copy of an array's values (numpy) and of their bits (unsigned integers)."""

    values: np.ndarray
    bits: np.ndarray


_NP_WIDTHS = (1, 2, 4, 8)


def private_copy(a: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of `a` that shares no memory with it."""
    return np.array(a, order="C", copy=True)


def snapshot(a: Any, *, copy: bool = True) -> Snapshot | None:
    """A :class:`Snapshot` of numpy array or torch tensor `a`.

    None for anything else, and for arrays whose bits are not compared (complex,
    object or structured dtypes; sparse or quantized tensors). ``copy=False``
    lets the snapshot share memory with `a` where it can (a snapshot of the state
    after a call, compared at once).
    """
    if isinstance(a, np.ndarray):
        if a.dtype.kind not in "biuf" or a.dtype.itemsize not in _NP_WIDTHS:
            return None
        values = a if not copy and a.flags.c_contiguous else private_copy(a)
        bits = values.reshape(-1).view(f"u{values.dtype.itemsize}").reshape(values.shape)
        return Snapshot(values, bits)
    if not is_torch(a):
        return None
    import torch

    if not isinstance(a, torch.Tensor) or a.layout != torch.strided:
        return None
    if a.is_complex() or a.is_quantized:
        return None
    t = a.detach().to("cpu", copy=copy).contiguous()
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    bits = t.reshape(-1).view(ints[t.element_size()]).numpy().reshape(tuple(t.shape))
    if t.is_floating_point() and t.dtype not in (torch.float32, torch.float64):
        t = t.to(torch.float64)  # float16, bfloat16, float8: exact in float64
    return Snapshot(t.numpy(), bits)


class Change(NamedTuple):
    """What differs between two snapshots of one array (its text: :meth:`__str__`)."""

    count: int
    size: int
    index: tuple[int, ...]
    before: float
    after: float
    shapes: tuple[tuple[int, ...], tuple[int, ...]]

    def __str__(self) -> str:
        if self.shapes[0] != self.shapes[1]:
            return f"its shape changed from {self.shapes[0]} to {self.shapes[1]}"
        return (
            f"{self.count} of its {self.size} elements changed (the first at index "
            f"{self.index}: {self.before!r} became {self.after!r})"
        )


def changed(before: Snapshot | None, after: Snapshot | None) -> Change | None:
    """What differs between two snapshots of one array; None if nothing (or no snapshot)."""
    if before is None or after is None:
        return None
    shapes = (tuple(before.bits.shape), tuple(after.bits.shape))
    if shapes[0] != shapes[1]:
        return Change(before.bits.size, before.bits.size, (), math.nan, math.nan, shapes)
    diff = np.argwhere(before.bits != after.bits)
    if not len(diff):
        return None
    idx = tuple(int(i) for i in diff[0])
    return Change(
        len(diff), before.bits.size, idx, before.values[idx].item(), after.values[idx].item(),
        shapes,
    )  # fmt: skip
