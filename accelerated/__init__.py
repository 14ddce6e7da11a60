"""Fast backends (imported as ``softmaxtheory.accelerated``).

The backends compute the specification of :mod:`softmaxtheory.spec` in
floating point and are checked against :mod:`softmaxtheory.reference`. They
depend on optional packages (Numba for the CPU kernels, torch for the GPU
path), so nothing here imports them at load time; :func:`available` reports
which of them this environment can import.
"""

from __future__ import annotations

import importlib.util

__all__ = ["OPTIONAL_PACKAGES", "available"]

#: The optional packages the accelerated backends build on.
OPTIONAL_PACKAGES: tuple[str, ...] = ("numba", "torch", "triton")


def available() -> dict[str, bool]:
    """Report which optional backend packages are installed, without importing them.

    Returns
    -------
    dict
        ``{package: installed}`` for every name in :data:`OPTIONAL_PACKAGES`.

    Examples
    --------
    >>> from softmaxtheory import accelerated
    >>> sorted(accelerated.available())
    ['numba', 'torch', 'triton']
    """
    return {name: importlib.util.find_spec(name) is not None for name in OPTIONAL_PACKAGES}
