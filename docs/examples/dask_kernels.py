"""The dask backend as numpy kernels, for ``softmaxtheory check`` (rows larger than one machine).

The functions of :mod:`softmaxtheory.accelerated.dask` take dask arrays and return lazy ones;
the conformance suite calls a kernel with numpy arrays and reads numpy arrays back. Each
kernel here cuts its input into dask blocks, three along the softmax axis (so every row of
three items or more is merged from several blocks by the streaming states), computes the
dask function's graph and returns its numpy result. Keyword arguments (``entropy_eps``,
``schedule``, ``certified``) pass through; the signatures are the dask functions' own, so
the suite sees which options each one takes.

    $ softmaxtheory check dask_kernels:adaptive_softmax --kind adaptive_softmax
    $ softmaxtheory check dask_kernels:softmax --kwarg certified=True
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import dask
import dask.array as da
import numpy as np

from softmaxtheory.accelerated import dask as dsm

#: Blocks each row is cut into along the softmax axis.
BLOCKS = 3


def _on_numpy(fn: Callable[..., da.Array]) -> Callable[..., np.ndarray]:
    """`fn` with numpy in and numpy out, its rows cut into :data:`BLOCKS` dask blocks."""

    @functools.wraps(fn)
    def kernel(x: Any, axis: int = -1, **kwargs: Any) -> np.ndarray:
        a = np.asarray(x)
        ax = axis % a.ndim if a.ndim else 0
        chunks = tuple(
            max(1, -(-n // BLOCKS)) if i == ax else max(1, n) for i, n in enumerate(a.shape)
        )
        # the synchronous scheduler: no thread pool for the suite's many small calls (the
        # results are the same bits under every scheduler, for a fixed chunking)
        with dask.config.set(scheduler="synchronous"):
            return np.asarray(fn(da.from_array(a, chunks=chunks), axis, **kwargs).compute())

    return kernel


softmax = _on_numpy(dsm.softmax)
entropy = _on_numpy(dsm.entropy)
adaptive_softmax = _on_numpy(dsm.adaptive_softmax)
