r"""Formatting shared by the checking kit: numbers in ulps, repro literals, failure texts.

Standard library and numpy only: :mod:`softmaxtheory.testing` imports it, and
so does the conformance suite (:mod:`softmaxtheory._check.runner`).

Examples
--------
>>> import numpy as np
>>> from softmaxtheory._check.report import fmt_ulp, row_literal
>>> fmt_ulp(0.8624), fmt_ulp(123456.0)
('0.862', '1.235e+05')
>>> row_literal(np.array([0.5, -np.inf, np.nan]), "bfloat16")
'np.array([0.5, -np.inf, np.nan], dtype=np.float32)'
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ..spec import Schedule
    from ..testing import ErrorReport, KernelMismatch

__all__ = [
    "STOPPED",
    "array_literal",
    "entropy_mode_hint",
    "fmt_ulp",
    "is_torch",
    "mismatch_text",
    "np_dtype_literal",
    "precision_hint",
    "row_literal",
    "with_hint",
    "with_schedule",
]

#: How the message of a property stopped from outside (timed out, process ended) begins.
STOPPED = "stopped: "


def fmt_ulp(v: float) -> str:
    """An error in ulps for a report: three significant digits, scientific from 1e4 on."""
    if not math.isfinite(v):
        return str(v)
    return f"{v:.3g}" if v < 1e4 else f"{v:.3e}"


def is_torch(a: Any) -> bool:
    """Whether `a` is a torch tensor (without importing torch)."""
    return type(a).__module__.split(".")[0] == "torch" and hasattr(a, "detach")


def np_dtype_literal(dtype_name: str) -> str:
    """The numpy dtype that holds `dtype_name`'s values, as source text (``np.float32``).

    numpy has no bfloat16: its values are exact in float32.
    """
    return "np.float32" if dtype_name == "bfloat16" else f"np.{dtype_name}"


def array_literal(a: np.ndarray, dtype_name: str) -> str:
    """Source text that rebuilds `a` exactly, its shape kept: ``np.array([[...]], dtype=...)``.

    Each value is Python's shortest repr, which reads back to the same float;
    numpy's print options play no part (``np.array2string`` follows a global
    ``formatter``, ``suppress`` or ``legacy`` set by the caller, or by the
    kernel under test, and its legacy mode failed outright). An empty array
    becomes ``np.empty(shape, ...)``, which keeps its shape.
    """
    arr = np.asarray(a, dtype=np.float64)
    dtype = np_dtype_literal(dtype_name)
    if arr.size == 0:
        return f"np.empty({arr.shape!r}, dtype={dtype})"
    return f"np.array({_nested(arr, 1)}, dtype={dtype})"


def _nested(a: np.ndarray, depth: int) -> str:
    """The nested-list text of `a`: one line per innermost row, indented by depth."""
    if a.ndim == 0:
        return _num(float(a))
    if a.ndim == 1:
        return "[" + ", ".join(_num(float(v)) for v in a) + "]"
    return "[" + (",\n" + " " * depth).join(_nested(sub, depth + 1) for sub in a) + "]"


def row_literal(row: np.ndarray, dtype_name: str) -> str:
    """Source text that rebuilds `row` exactly: ``np.array([...], dtype=np.float32)``."""
    vals = ", ".join(_num(float(v)) for v in np.asarray(row, dtype=np.float64).ravel())
    return f"np.array([{vals}], dtype={np_dtype_literal(dtype_name)})"


def _num(v: float) -> str:
    if math.isnan(v):
        return "np.nan"
    if math.isinf(v):
        return "np.inf" if v > 0 else "-np.inf"
    return repr(v)


def precision_hint(dtype: str, rep: ErrorReport) -> str:
    """Say that the kernel seems to compute in float32 (a float64 run, float32-sized errors).

    Float32's unit roundoff is 6e-8; relative errors between 1e-9 and 1e-5 in
    a float64 run are that size, not float64's (1.1e-16). Returns ``""``
    otherwise.
    """
    rel = float(getattr(rep, "max_rel_error", math.nan))
    if dtype == "float64" and 1e-9 <= rel <= 1e-5:
        return (
            f"\nhint: the relative errors (up to {rel:.2g}) are of the size of float32's "
            "rounding (6e-8): the kernel seems to compute in float32, not float64"
        )
    return ""


def entropy_mode_hint(run_eps: float, eps: float) -> str:
    """Say that an input which passed at the run's entropy mode `run_eps` fails at `eps`."""
    return (
        f"\nhint: the same input passed at entropy_eps={run_eps!r}; at entropy_eps={eps!r} the "
        f"spec's entropy is -sum p log(p + {eps!r}), which a kernel misses when it drops "
        "entropy_eps= or applies it otherwise (a clamp, log(max(p, eps)))"
    )


def with_hint(text: str, hint: str) -> str:
    """Put `hint` before the repro snippet of `text`, which stays runnable as it is."""
    head, sep, tail = text.partition("\nrepro:\n")
    return f"{head}{hint}{sep}{tail}" if sep else text + hint


def mismatch_text(exc: KernelMismatch, dtype: str) -> str:
    """The failure message of a property for a :class:`~softmaxtheory.testing.KernelMismatch`.

    The exception's notes (``exc.add_note``: what was being checked, such as
    ``"shift by 3.0"``) come first, one a line, then its message, with the
    :func:`precision_hint` put before the repro snippet, or, for a failure at the
    spec's other entropy mode (the exception's ``entropy_modes``, the run's mode and
    that one), the :func:`entropy_mode_hint`.
    """
    text = "\n".join([*getattr(exc, "__notes__", ()), str(exc)])
    modes = getattr(exc, "entropy_modes", None)
    hint = precision_hint(dtype, exc.report) if modes is None else entropy_mode_hint(*modes)
    return with_hint(text, hint)


def with_schedule(repro: str, schedule: Schedule | None) -> str:
    """`repro` (lines defining ``kernel``) with ``kernel`` bound to ``schedule=schedule``.

    Unchanged when `schedule` is None (the call passed none).
    """
    if schedule is None:
        return repro
    if "import functools" not in repro:
        repro = "import functools\n" + repro
    return (
        f"import softmaxtheory.spec\n{repro}\n"
        f"kernel = functools.partial(kernel, schedule=softmaxtheory.spec.{schedule!r})"
    )
