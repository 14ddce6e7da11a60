r"""The conformance suite: run every property of the specification on a user's kernel.

Use it from the command line,

.. code-block:: console

    $ softmaxtheory check pkg.mod:func --kind adaptive_softmax --dtype float32

or through pytest (the ``softmaxtheory`` plugin adds the options),

.. code-block:: console

    $ pytest --pyargs softmaxtheory.conformance --softmax-kernel pkg.mod:func

The kernel convention: a callable taking one array of logits ``(..., n)``
(numpy, or torch with ``framework="torch"``) and returning its result along the
last axis (shape ``(..., n)``, or ``(...)`` for kind ``entropy``); attention
kernels take ``q, k, v``. Optional keywords are used when the kernel's
signature has them: ``schedule=`` (then other schedules are tested too),
``entropy_eps=``, ``mask=`` or ``attn_mask=`` and ``is_causal=`` (attention).
A torch kernel is called with gradients on, and again with inputs that require
grad, under ``torch.no_grad()`` and under ``torch.inference_mode()``
(:data:`GRAD_MODES`): a path taken in training or in inference only is checked too.
The kernel gets private copies of its operands and must leave them unchanged;
what it returns must stay unchanged when it is called again (``fresh_results``).

Every property compares the kernel with the certified reference through
:mod:`softmaxtheory.testing` (the error model) and reports the largest error
in ulps; see :data:`PROPERTIES`. The run is deterministic (derandomized
Hypothesis with a fixed example budget); ``thorough=True`` explores more.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# This module is the suite's public face: the names below, run_property, run_conformance and
# the pytest tests it generates. The internals live in the private package softmaxtheory._check:
# target (kernel loading, options, Target), runner (one property's run: bookkeeping, notes,
# verdict, Hypothesis), properties (the checks and PROPERTIES) and report (formatting).
from . import _formats
from ._check import properties as _properties
from ._check import target as _target
from ._check.properties import properties_for
from ._check.report import STOPPED
from ._check.runner import PropertyResult, run_check
from ._check.target import (
    ConformanceUsageError,
    Target,
    check_options,
    load_kernel,
    parse_kwarg,
    target_from_options,
)

__all__ = [
    "DTYPES",
    "FRAMEWORKS",
    "GRAD_MODES",
    "KINDS",
    "PROPERTIES",
    "ConformanceUsageError",
    "PropertyResult",
    "Target",
    "check_options",
    "load_kernel",
    "parse_kwarg",
    "properties_for",
    "run_conformance",
    "run_property",
    "target_from_options",
]

#: The kinds of kernel the suite checks.
KINDS: tuple[str, ...] = _formats.KINDS
#: How the kernel is called (numpy arrays or torch tensors).
FRAMEWORKS: tuple[str, ...] = _formats.FRAMEWORKS
#: The input dtypes.
DTYPES: tuple[str, ...] = _formats.DTYPES
#: How a torch kernel is called besides the default (gradients on, inputs that do not
#: require them), each mode a label mapped to ``(whether q, k, v or x require grad, the
#: torch context manager the call runs in, or None)``: inputs requiring grad, under
#: ``torch.no_grad()``, under ``torch.inference_mode()``. ``dtype_shape`` and
#: ``attention_layouts`` check every mode.
GRAD_MODES: dict[str, tuple[bool, str | None]] = _target.GRAD_MODES
#: Every property in report order, mapping its name to its check and the kinds it applies to.
PROPERTIES = _properties.PROPERTIES


def run_property(name: str, target: Target) -> PropertyResult:
    """Run one property on `target` and return its verdict (never raises for a kernel defect).

    A kernel that raises ``SystemExit`` (calls ``sys.exit``) fails the
    property. A property that cannot run on this kernel is skipped, or fails
    when ``target.strict``.
    """
    check, kinds = PROPERTIES[name]
    if target.kind not in kinds:
        return PropertyResult(name, "skip", message=f"not a property of kind {target.kind}")
    return run_check(name, check, target)


def run_conformance(
    target: Target, only: list[str] | None = None, progress: Callable[[str], None] | None = None
) -> list[PropertyResult]:
    """Run every property of `target`'s kind (or those named in `only`)."""
    results = []
    width = _properties.name_width(target.kind)
    for name in properties_for(target.kind):
        if only and name not in only:
            continue
        res = run_property(name, target)
        if progress is not None:
            progress(res.line(width))
        results.append(res)
    return results


# ---------------------------------------------------------------------------
# pytest entry points (``pytest --pyargs softmaxtheory.conformance --softmax-kernel ...``)
# ---------------------------------------------------------------------------


def _pytest_check(name: str, config: Any) -> None:
    import pytest

    from .pytest_plugin import conformance_result, missing_kernel

    __tracebackhide__ = True
    kind = config.getoption("--softmax-kind")
    if not config.getoption("--softmax-kernel"):
        missing_kernel()
    if kind not in PROPERTIES[name][1]:
        pytest.skip(f"{name} is not a property of kind {kind}")
    res = conformance_result(config, name)  # from a child process, or --softmax-in-process
    if res.status == "skip":
        pytest.skip(res.message)
    if res.status == "fail":
        pytest.fail(f"{name}: {res.message.removeprefix(STOPPED)}", pytrace=False)


def _make_test(name: str) -> Callable[..., None]:
    def test(pytestconfig: Any) -> None:
        __tracebackhide__ = True
        _pytest_check(name, pytestconfig)

    test.__name__ = f"test_{name}"
    test.__doc__ = PROPERTIES[name][0].__doc__
    return test


for _name in PROPERTIES:
    globals()[f"test_{_name}"] = _make_test(_name)
del _name
