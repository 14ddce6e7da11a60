"""softmaxtheory: softmax dispersion and adaptive temperature, computable and checkable.

Implements the theory of Veličković et al., *Softmax is not Enough (for Sharp
Size Generalisation)*, ICML 2025. Subpackages are imported lazily:

* :mod:`softmaxtheory.spec`: the specification and temperature schedules;
* :mod:`softmaxtheory.reference`: the certified mpmath oracle;
* :mod:`softmaxtheory.accelerated`: fast backends.

``import softmaxtheory`` imports neither numba, torch nor hypothesis.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._layout import install_source_tree_finder
from .spec import (
    ENTROPY_THRESHOLD,
    PAPER_COEFFICIENTS,
    Constant,
    LogLength,
    PaperPolynomial,
    Polynomial,
)

__version__ = "0.1.0"

install_source_tree_finder(__file__)

__all__ = [
    "ENTROPY_THRESHOLD",
    "PAPER_COEFFICIENTS",
    "Constant",
    "LogLength",
    "PaperPolynomial",
    "Polynomial",
    "__version__",
]

_SUBMODULES = frozenset({"spec", "bounds", "reference", "accelerated", "cli"})


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(__all__) | _SUBMODULES)
