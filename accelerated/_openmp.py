r"""Which GNU OpenMP runtime torch binds to when Numba starts its threads first (private).

Numba's OpenMP threading layer links the system's ``libgomp.so.1.0.0``; torch's Linux
wheels ship their own copy as ``torch/lib/libgomp.so.1``, and load it only where no
object of that soname is in the process yet. Once Numba has started its threads,
the system's copy is there, and torch, imported after, runs its parallel loops on it.
With the system's GCC 12 runtime, torch's float16 ``scaled_dot_product_attention``
on the CPU then ran about 500 times slower (4096 heads of one query over three keys:
3.3 s instead of 6.7 ms; bfloat16, float32, ``softmax`` and ``matmul`` kept their
speed), and in one pytest process every torch test after a Numba one paid for it.
Importing torch first avoids this; so does :func:`load_torch_openmp`, which the
kernels call before Numba can start a thread: it loads torch's copy with
``RTLD_GLOBAL``, without importing torch, so that the process holds what it holds
when torch is imported first.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
import sys

__all__ = ["load_torch_openmp"]


def load_torch_openmp() -> str | None:
    """Load torch's own ``libgomp`` before Numba's threads start, where that matters.

    Returns
    -------
    str or None
        The path of the library loaded; ``None`` where there is nothing to do: not
        Linux, torch already imported (its runtime is loaded) or not installed (or
        without a bundled ``libgomp``), or Numba's threading layer already started
        (too late: the system's runtime is in the process).
    """
    if not sys.platform.startswith("linux") or "torch" in sys.modules:
        return None
    from numba.np.ufunc import parallel

    if getattr(parallel, "_is_initialized", True):
        return None
    try:
        spec = importlib.util.find_spec("torch")  # finds the package; imports nothing
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        for path in sorted(glob.glob(os.path.join(root, "lib", "libgomp*.so*"))):
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError:
                continue
            return path
    return None
