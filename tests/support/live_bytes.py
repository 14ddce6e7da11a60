"""Count what a torch call allocates and reads back, op by op, on any device (CPU included).

:class:`OpLedger` is a ``TorchDispatchMode``: every aten op run under it is
recorded. Each storage an op creates is tracked through weak references to
the tensors that hold it, so the ledger knows, after every op, how many bytes
of storage created inside the mode are still alive; :attr:`OpLedger.peak` is
the largest such total, the peak of the call's own allocations (a fused
kernel's internal workspace is not seen). :attr:`OpLedger.host_reads` counts
the ops that copy a device value to the host for Python (``.item()``,
``bool(t)``, ``float(t)``); ``Tensor.tolist`` reads without an op and is not
counted. An op's output that shares a storage with one of its inputs (a view,
an ``out=`` or in-place op) is not a new allocation.
"""

from __future__ import annotations

import math
import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["OpLedger"]


class OpLedger(TorchDispatchMode):
    """Record the ops, the live bytes they allocate, and the host reads of a call."""

    def __init__(self) -> None:
        super().__init__()
        self._live: dict[int, tuple[int, list[weakref.ref]]] = {}
        self.peak = 0
        self.host_reads = 0
        self.outputs: list[tuple[str, torch.dtype, tuple[int, ...]]] = []

    def _sweep(self) -> None:
        dead = [ptr for ptr, (_, refs) in self._live.items() if all(r() is None for r in refs)]
        for ptr in dead:
            del self._live[ptr]

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten._local_scalar_dense.default:
            self.host_reads += 1
        self._sweep()
        given = {
            t.untyped_storage().data_ptr()
            for t in tree_leaves((args, kwargs))
            if isinstance(t, torch.Tensor)
        }
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            self.outputs.append((str(func), t.dtype, tuple(t.shape)))
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            if ptr in self._live:
                self._live[ptr][1].append(weakref.ref(t))  # a view keeps its storage alive
            elif ptr not in given and storage.nbytes():
                self._live[ptr] = (storage.nbytes(), [weakref.ref(t)])
        self.peak = max(self.peak, sum(n for n, _ in self._live.values()))
        return out

    def largest(self, dtype: torch.dtype) -> int:
        """The most elements of any op output of `dtype` (0 if none)."""
        return max((math.prod(shape) for _, d, shape in self.outputs if d == dtype), default=0)


def attention_fwd_bwd(
    name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad: torch.Tensor, causal: bool
) -> OpLedger:
    """The ledger of one forward + backward: SDPA (``"sdpa"``) or the hybrid (``"hybrid"``).

    Runs on fresh leaf copies of `q`, `k`, `v` that require grad and back-propagates
    `grad` from the output.
    """
    from softmaxtheory.accelerated.torch import adaptive_attention

    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    with OpLedger() as ledger:
        if name == "sdpa":
            out = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
        else:
            out = adaptive_attention(qg, kg, vg, is_causal=causal, backend=name)
        out.backward(grad)
    return ledger
