r"""Numba's on-disk cache without its race between processes (private).

Numba keeps one index file per function, mapping each compiled signature (its key) to
a data file of machine code, and names a new entry's data file after the first number
the index does not use (``f.1.nbc``, ``f.2.nbc``, ...). Two processes that compile
different signatures of one function at once (a process pool, pytest-xdist, dask
workers, the first time the kernels run) can both read the index before either writes
it: both then take number 1, and when their writes interleave (index A, index B, data
B, data A) the index pairs B's signature with A's machine code. Every later process
runs that code for B's arguments, unchecked: with another array layout it computes
other bits (reassociated sums vectorise differently), with another dtype it cannot
unbox its arguments and raises ``TypeError`` (both seen here by rewriting an index into
that state; ``tests/test_cpu_regressions.py`` replays the interleaving).

:func:`njit` is ``numba.njit`` whose cached dispatchers name each data file after its
key instead (:class:`KeyedIndexDataCacheFile`): two entries never share a file, so an
index, however stale, never pairs a signature with another one's code; a lost entry
(the last writer of the index wins) costs one compilation later, nothing else.

Where Numba finds no writable cache location at all (neither beside the installed
package nor in the user's cache directory, nor ``NUMBA_CACHE_DIR``), :func:`njit`
compiles without the disk cache after one :class:`NoDiskCacheWarning`, instead of
letting ``cache=True`` fail the import.
"""

from __future__ import annotations

import hashlib
import warnings
from typing import Any

import numba
from numba.core.caching import FunctionCache, IndexDataCacheFile

from ._numba_vectors import PIPELINE, PIPELINE_KEY

__all__ = [
    "KeyedIndexDataCacheFile",
    "NoDiskCacheWarning",
    "PipelineKeyedCache",
    "keyed_cache",
    "njit",
]


class KeyedIndexDataCacheFile(IndexDataCacheFile):
    """Numba's index and data files, each data file named after its key."""

    def keyed_name(self, key: Any) -> str:
        """The data file of `key`: the index's base name and a hash of the key's text.

        The key is ``(signature, codegen magic tuple, code hashes)``, whose ``repr`` is
        the same in every process (Numba types print their parameters).
        """
        digest = hashlib.sha256(repr(key).encode()).hexdigest()[:24]
        return self._index_name[: -len(".nbi")] + f".{digest}.nbc"

    def save(self, key: Any, data: Any) -> None:
        """Write the data file of `key`, then (if it changed) the index entry.

        Data first: a reader that finds the entry finds its file.
        """
        name = self.keyed_name(key)
        self._save_data(name, data)
        overloads = self._load_index()
        if overloads.get(key) != name:
            overloads[key] = name
            self._save_index(overloads)


class PipelineKeyedCache(FunctionCache):
    """Numba's function cache whose index key also names the kernels' pipeline.

    Numba keys a cached signature by the machine, the bytecode and the closure, and
    the whole index by its source file's time stamp, not by the compiler pipeline. A
    checkout whose ``_cpu_kernels.py`` kept its stamp across the change to
    :data:`~softmaxtheory.accelerated._numba_vectors.PIPELINE` would go on loading the
    machine code compiled before it (256-bit vectors on Intel cores with AVX-512).
    With :data:`~softmaxtheory.accelerated._numba_vectors.PIPELINE_KEY` in the key such
    an entry is not found, and the kernel is compiled once more.
    """

    def _index_key(self, sig: Any, codegen: Any) -> tuple:
        return (*super()._index_key(sig, codegen), PIPELINE_KEY)


def keyed_cache(dispatcher: Any) -> Any:
    """Give a cached Numba `dispatcher` the keyed data files; return it.

    A dispatcher compiled by the kernels' pipeline also gets :class:`PipelineKeyedCache`.
    A dispatcher without Numba's cache file (``cache=False``, or another Numba whose
    internals differ) is returned as it is.
    """
    cache = getattr(dispatcher, "_cache", None)
    cache_file = getattr(cache, "_cache_file", None)
    if type(cache_file) is IndexDataCacheFile:
        cache_file.__class__ = KeyedIndexDataCacheFile
        pipeline = getattr(getattr(dispatcher, "_compiler", None), "pipeline_class", None)
        if type(cache) is FunctionCache and pipeline is PIPELINE:
            cache.__class__ = PipelineKeyedCache
    return dispatcher


class NoDiskCacheWarning(UserWarning):
    """Numba finds no writable place for its cache: every process compiles the kernels."""


_warned: list[str] = []


def _no_disk_cache(func: Any, exc: RuntimeError) -> None:
    if _warned:  # once per process: every kernel of the module is in the same place
        return
    _warned.append(func.__qualname__)
    warnings.warn(
        f"{exc}. Numba can write its cache neither beside the installed package nor in "
        "the user's cache directory, so softmaxtheory's CPU kernels are compiled afresh "
        "in every process (seconds for each kernel and dtype on first use). Set "
        "NUMBA_CACHE_DIR to a writable directory to keep them.",
        NoDiskCacheWarning,
        stacklevel=4,
    )


def _cached(decorate: Any, func: Any, kwargs: dict[str, Any]) -> Any:
    """``decorate(func)``, keyed; where no cache location is writable, without the cache.

    A read-only installation run by a user without a writable home directory (a
    container's non-root user, a serverless function) has no cache locator:
    ``cache=True`` then raised ``RuntimeError`` at import and the backend could not
    be imported at all. It now compiles in memory, once per process, after one
    :class:`NoDiskCacheWarning`.
    """
    try:
        return keyed_cache(decorate(func))
    except RuntimeError as exc:
        if not kwargs.get("cache") or "no locator available" not in str(exc):
            raise
        _no_disk_cache(func, exc)
        return numba.njit(**{**kwargs, "cache": False})(func)


def njit(*args: Any, **kwargs: Any) -> Any:
    """``numba.njit`` with :func:`keyed_cache` and 512-bit vectors (both decorator forms).

    The dispatchers use :func:`keyed_cache` and are compiled by
    :data:`~softmaxtheory.accelerated._numba_vectors.PIPELINE` (512-bit vectors where the
    processor has them), unless `kwargs` name another ``pipeline_class``.
    """
    if args and callable(args[0]):
        func, args = args[0], args[1:]
        return njit(*args, **kwargs)(func)
    kwargs = {"pipeline_class": PIPELINE, **kwargs}
    return lambda func: _cached(numba.njit(*args, **kwargs), func, kwargs)
