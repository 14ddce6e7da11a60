"""The (batch, head) slices of attention operands, as stacks of the distinct ones (private).

An operand of attention broadcasts to ``(*lead, r, c)``; most hold fewer slices than
``prod(lead)`` (keys shared by the heads, a mask broadcast over the batch). The CPU
kernels and the reference both work on the slices an operand has, found here.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["distinct_slices", "slice_stack"]


def slice_stack(
    a: np.ndarray, lead: tuple[int, ...], dtype: Any = None
) -> tuple[np.ndarray, np.ndarray]:
    """`a`, broadcastable to ``(*lead, r, c)``, as a stack of its own slices.

    Returns
    -------
    stack : numpy.ndarray, shape (K, r', c')
        `a`'s slices along the leading axes where it varies (an axis of length 1 or
        stride 0 is one slice: a broadcast view is not copied out), converted to
        `dtype` (C-contiguous) where one is given; ``(r', c')`` are `a`'s own last two
        lengths.
    at : numpy.ndarray of int64, shape (prod(lead),)
        ``at[n]`` is the entry of `stack` that the ``n``-th slice of `lead` (C order) reads.
    """
    a = a.reshape((1,) * (len(lead) + 2 - a.ndim) + a.shape)
    lead_axes = zip(a.shape[:-2], a.strides[:-2], strict=True)
    own = tuple(1 if n == 1 or s == 0 else n for n, s in lead_axes)
    a = a[tuple(slice(None) if n > 1 else slice(0, 1) for n in own)]
    if dtype is not None:
        a = np.ascontiguousarray(a, dtype=dtype)
    stack = a.reshape(math.prod(own), *a.shape[-2:])  # (no -1: a slice may be empty)
    at = np.broadcast_to(np.arange(stack.shape[0]).reshape(own), lead).reshape(-1)
    return stack, at


def _content_ids(stack: np.ndarray) -> np.ndarray:
    """For each entry of `stack`, the least index of an entry with the same bits."""
    k = stack.shape[0]
    flat = np.ascontiguousarray(stack).reshape(k, -1)
    if flat.shape[1] == 0:
        return np.zeros(k, dtype=np.int64)
    rows = flat.view(np.dtype((np.void, flat.shape[1] * flat.itemsize))).reshape(k)
    _, first, inverse = np.unique(rows, return_index=True, return_inverse=True)
    return first[inverse.reshape(k)]


def distinct_slices(lead: tuple[int, ...], operands: list[np.ndarray]) -> np.ndarray:
    """For each of the ``prod(lead)`` slices, the first slice whose operands equal its own.

    Parameters
    ----------
    lead : tuple of int
        The leading shape every operand broadcasts to.
    operands : list of numpy.ndarray
        Each broadcastable to ``(*lead, r, c)``.

    Returns
    -------
    numpy.ndarray of int64
        ``first[n] <= n`` is the least slice index (C order) whose operands are all, bit
        for bit, those of slice ``n`` (``-0.0`` differs from ``0.0``, NaNs by their
        payload), so that a result computed for it is the result for slice ``n``.
    """
    n = math.prod(lead)
    if n <= 1:
        return np.zeros(n, dtype=np.int64)
    ids = []
    for a in operands:
        stack, at = slice_stack(a, lead)
        ids.append(_content_ids(stack)[at])
    _, first, inverse = np.unique(np.stack(ids, axis=1), axis=0, return_index=True,
                                  return_inverse=True)  # fmt: skip
    return first[inverse.reshape(n)]
