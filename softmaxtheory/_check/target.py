"""The kernel under test: loading it, validating a run's options, calling it (private).

:class:`Target` holds a kernel and how to call it; :func:`target_from_options`
builds one from the options of ``softmaxtheory check`` and of the pytest
plugin, which both call it. The public names are re-exported by
:mod:`softmaxtheory.conformance`.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

import numpy as np

from .. import strategies as strat
from .._certify.environment import (
    flushes_subnormals,
    restore_gradual_underflow,
    restore_rounding_to_nearest,
    rounds_to_nearest,
)
from .._formats import DTYPES, FRAMEWORKS, KINDS, default_dtype
from ..spec import Constant, PaperPolynomial, Schedule, resolve_schedule
from .errors import Failed
from .memory import Change, changed, private_copy, snapshot
from .report import array_literal, np_dtype_literal

__all__ = [
    "GRAD_MODES",
    "TORCH_STATE",
    "ConformanceUsageError",
    "Target",
    "check_options",
    "grad_call_lines",
    "load_kernel",
    "parse_kwarg",
    "target_from_options",
]


class ConformanceUsageError(ValueError):
    """A bad kernel path, kind, framework, dtype or device (exit status 2)."""


#: How else a torch kernel is called, besides the default (gradients on, inputs that do
#: not require them): label -> (whether the float inputs require grad, the ``torch``
#: context manager the call runs in, or None). A kernel may take another path in each: an autograd
#: ``Function`` when an input requires grad, an inference path that reuses its input's
#: memory under ``no_grad``; the suite checks each path's values and that it leaves its
#: inputs as it found them.
GRAD_MODES: dict[str, tuple[bool, str | None]] = {
    "inputs requiring grad": (True, None),
    "under torch.no_grad()": (False, "no_grad"),
    "under torch.inference_mode()": (False, "inference_mode"),
}


def _grad_context(mode: str | None) -> Any:
    """The context a call in :data:`GRAD_MODES` `mode` runs in (a null one for None)."""
    import contextlib

    context = None if mode is None else GRAD_MODES[mode][1]
    if context is None:
        return contextlib.nullcontext()
    import torch

    return getattr(torch, context)()


def _requires_grad(mode: str | None) -> bool:
    """Whether the float inputs of a call in `mode` require grad."""
    return mode is not None and GRAD_MODES[mode][0]


def grad_call_lines(
    mode: str | None, call: str = "kernel(x)", operands: Iterable[str] = ("x",)
) -> list[str]:
    """Repro lines that make `call` in :data:`GRAD_MODES` `mode` (plainly for None).

    In a mode whose inputs require grad, each of the float `operands` (``x``, or ``q``,
    ``k`` and ``v``; never a mask) is made to require it first.
    """
    if mode is None:
        return [call]
    requires_grad, context = GRAD_MODES[mode]
    if context is None:
        return [*([f"{name}.requires_grad_()" for name in operands] if requires_grad else []),
                call]  # fmt: skip
    return [f"with torch.{context}():", f"    {call}"]


#: torch's process-wide settings a kernel must leave as it found them: name -> the
#: ``torch`` function that reads it (the repro prints its call) and what a caller meets
#: when the kernel leaves it changed.
TORCH_STATE = {
    "grad mode": ("is_grad_enabled",
                  "with it off, a model's training silently records no gradients"),
    "inference mode": ("is_inference_mode_enabled",
                       "tensors made there can never enter autograd"),
    "default dtype": ("get_default_dtype",
                      "every tensor made without a dtype takes the new one"),
}  # fmt: skip


def _torch_state() -> dict[str, Any]:
    """The values of :data:`TORCH_STATE` now."""
    import torch

    return {name: getattr(torch, getter)() for name, (getter, _) in TORCH_STATE.items()}


def _restore_torch_state(state: dict[str, Any]) -> None:
    """Set torch's grad mode and default dtype back to `state` (inference mode is scoped)."""
    import torch

    torch.set_grad_enabled(state["grad mode"])
    torch.set_default_dtype(state["default dtype"])


def _float_operands(operands: dict[str, np.ndarray]) -> list[str]:
    """The names of the float operands (those that can require grad): not a mask."""
    return [name for name in operands if name != "mask"]


def _grad_return(call: str, mode: str | None) -> str:
    """The last lines of a repro's torch ``kernel``: `call` in `mode`, returned as numpy."""
    context = None if mode is None else GRAD_MODES[mode][1]
    if context is None:
        detach = ".detach()" if _requires_grad(mode) else ""
        return f"    return {call}{detach}.cpu().double().numpy()\n"
    return (
        f"    with torch.{context}():  # as the suite called it\n"
        f"        out = {call}\n"
        "    return out.cpu().double().numpy()\n"
    )


def _cwd_on_path() -> None:
    """Put the current folder first on ``sys.path`` unless it is there (as ``python -m`` does)."""
    cwd = os.getcwd()
    if not any(os.path.abspath(p or os.curdir) == cwd for p in sys.path):
        sys.path.insert(0, cwd)


def load_kernel(path: str) -> tuple[Callable[..., Any], str]:
    """Import ``pkg.mod:func`` (``func`` may be dotted: ``mod:Class.method``).

    The module is found the way ``python -m`` finds it: the current folder
    comes first on ``sys.path`` (it is added when missing, as it is for an
    installed ``softmaxtheory`` command or a bare ``pytest``), so
    ``mykernels:softmax`` works from the folder that holds ``mykernels.py``.

    Raises
    ------
    ConformanceUsageError
        If the path is malformed, the module cannot be imported (or ends the
        process while importing, ``sys.exit``), the attribute is missing or
        not callable.
    """
    mod_name, sep, attr = path.partition(":")
    if not sep or not mod_name or not attr:
        raise ConformanceUsageError(f"kernel must be given as pkg.mod:func, got {path!r}")
    _cwd_on_path()
    try:
        obj: Any = importlib.import_module(mod_name)
    except SystemExit as exc:
        raise ConformanceUsageError(
            f"importing module {mod_name!r} called sys.exit({exc.code!r})"
        ) from exc
    except Exception as exc:
        raise ConformanceUsageError(f"cannot import module {mod_name!r}: {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise ConformanceUsageError(f"{mod_name!r} has no attribute {attr!r}") from exc
    if not callable(obj):
        raise ConformanceUsageError(f"{path} is not callable (got {type(obj).__name__})")
    return obj, path


def parse_kwarg(text: str) -> tuple[str, Any]:
    """Parse ``NAME=VALUE`` (VALUE a Python literal, else a string) for ``--kwarg``.

    Examples
    --------
    >>> from softmaxtheory.conformance import parse_kwarg
    >>> parse_kwarg("axis=-1")
    ('axis', -1)
    """
    import ast

    name, sep, value = text.partition("=")
    if not sep or not name.strip().isidentifier():
        raise ConformanceUsageError(f"--kwarg takes NAME=VALUE, got {text!r}")
    try:
        parsed: Any = ast.literal_eval(value.strip())
    except (ValueError, SyntaxError):
        parsed = value.strip()
    return name.strip(), parsed


def _parameters(fn: Callable[..., Any]) -> Mapping[str, inspect.Parameter] | None:
    """The parameters of `fn`'s signature; None when it cannot be inspected.

    A ``torch.nn.Module`` is called through ``__call__(*args, **kwargs)``, which says
    nothing: its ``forward`` is what the call reaches, so its signature is read.
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(fn, torch.nn.Module):
        fn = fn.forward
    try:
        return inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None


def _accepts(fn: Callable[..., Any], name: str) -> bool | None:
    """Whether `fn`'s signature takes keyword `name`.

    True when it names it (not positional-only), False when it does not and has no
    ``**kwargs``; None when it cannot be inspected, or when only a ``**kwargs`` could
    take it: such a kernel may forward the keyword or drop it, which only a call tells
    (:meth:`Target._probe`).
    """
    params = _parameters(fn)
    if params is None:
        return None
    if name in params:
        return params[name].kind is not inspect.Parameter.POSITIONAL_ONLY
    return None if any(p.kind is p.VAR_KEYWORD for p in params.values()) else False


def _same_result(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two probing calls gave the same numbers (False when either gave none)."""
    return a.size > 0 and a.shape == b.shape and np.array_equal(a, b, equal_nan=True)


def check_options(
    *,
    kind: str = "softmax",
    framework: str = "numpy",
    device: str = "cpu",
    dtype: str = "float64",
    entropy_eps: float = 0.0,
    examples: int | None = None,
) -> None:
    """Validate the options of a run before any kernel is imported or called.

    Raises
    ------
    ConformanceUsageError
        Naming the option: an unknown kind, framework, dtype or device, numpy
        with bfloat16 or a GPU, ``entropy_eps`` negative or not finite,
        ``examples`` below 1, torch (or the device) not available.
    """
    if kind not in KINDS:
        raise ConformanceUsageError(f"kind must be one of {KINDS}, got {kind!r}")
    if framework not in FRAMEWORKS:
        raise ConformanceUsageError(f"framework must be one of {FRAMEWORKS}, got {framework!r}")
    if dtype not in DTYPES:
        raise ConformanceUsageError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if not (isinstance(entropy_eps, int | float) and math.isfinite(entropy_eps)) or (
        entropy_eps < 0
    ):
        raise ConformanceUsageError(
            f"entropy_eps must be a finite number >= 0, got {entropy_eps!r}"
        )
    if examples is not None and (isinstance(examples, bool) or int(examples) != examples
                                 or examples < 1):  # fmt: skip
        raise ConformanceUsageError(f"examples must be an integer >= 1, got {examples!r}")
    if framework == "numpy" and dtype == "bfloat16":
        raise ConformanceUsageError("numpy has no bfloat16: use --framework torch")
    if framework == "numpy" and device != "cpu":
        raise ConformanceUsageError("the numpy framework runs on the cpu only")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise ConformanceUsageError(f"device must be cpu or cuda, got {device!r}")
    if framework == "torch":
        try:
            import torch
        except ImportError as exc:
            raise ConformanceUsageError("--framework torch needs torch installed") from exc
        if device != "cpu" and not torch.cuda.is_available():
            raise ConformanceUsageError(f"device {device} is not available")


def _ignore_numpy_error(kind: str, flag: int) -> None:
    """The callback of numpy's error handling around a kernel call: errors pass, as ignored."""


@dataclass
class Target:
    """A kernel under test and how to call it.

    Parameters
    ----------
    kernel : callable
        The kernel.
    kwargs : dict
        Extra keyword arguments passed on every call (``axis=-1``).
    name : str
        ``pkg.mod:func`` (used in repro snippets).
    kind, framework, device, dtype : str
        See :data:`KINDS`, :data:`FRAMEWORKS`, :data:`DTYPES`.
    entropy_eps : float
        The entropy mode the kernel implements.
    schedule : Schedule
        The schedule the kernel implements (adaptive softmax, attention).
    thorough : bool
        Explore more examples.
    examples : int, optional
        Override the example budget of the Hypothesis properties.
    strict : bool
        A property that cannot run (a keyword the kernel does not take) fails
        instead of being skipped, and the contract is the strict one: float16
        and bfloat16 kernels must have float32-grade statistics and output (by
        default one rounding of the scaled logits to the kernel's dtype is
        accepted), and every kind must give the special-value table's zeros for
        a fully masked row (by default the softmax kind may give NaN,
        ``torch.softmax``'s convention).

    Notes
    -----
    Which optional keywords the kernel takes (``schedule=``, ``entropy_eps=``,
    ``mask=``/``attn_mask=``, ``is_causal=``, ``scale=``) is read from its
    signature (a ``torch.nn.Module``'s ``forward``); when the signature cannot be
    inspected (a builtin such as
    ``torch.nn.functional.scaled_dot_product_attention``) or only a ``**kwargs``
    could take the keyword, the kernel is probed by calling it on a tiny input
    (a dropped keyword is not taken). ``entropy_eps`` is passed whenever the kernel takes it
    (not to the softmax kind), ``0.0`` included; a kernel whose signature names it
    (:attr:`names_eps`) is checked at the spec's other entropy mode as well.
    """

    kernel: Callable[..., Any]
    name: str = "kernel"
    kind: str = "softmax"
    framework: str = "numpy"
    device: str = "cpu"
    dtype: str = "float64"
    entropy_eps: float = 0.0
    schedule: Schedule = field(default_factory=PaperPolynomial)
    thorough: bool = False
    examples: int | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    strict: bool = False
    #: Which keywords the kernel takes, as found by :meth:`takes` (filled on demand).
    _takes: dict[str, bool] = field(init=False, default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_options(
            kind=self.kind, framework=self.framework, device=self.device, dtype=self.dtype,
            entropy_eps=self.entropy_eps, examples=self.examples,
        )  # fmt: skip
        if not callable(self.kernel):
            raise ConformanceUsageError(f"{self.name} is not callable")
        if not isinstance(self.strict, bool):
            raise ConformanceUsageError(f"strict must be a bool, got {self.strict!r}")
        self.schedule = resolve_schedule(self.schedule)

    # -- which keywords the kernel takes ----------------------------------------

    def takes(self, name: str) -> bool:
        """Whether the kernel takes keyword `name` (signature, else a probing call)."""
        if name not in self._takes:
            known = _accepts(self.kernel, name)
            self._takes[name] = self._probe(name) if known is None else known
        return self._takes[name]

    def _probe(self, name: str) -> bool:
        """Probe keyword `name` by calling the kernel on a tiny input with and without it.

        Taken when the calls with it run and, for a keyword that changes the result
        (``schedule=``, a mask, ``is_causal=``, ``scale=``), two values of it give two
        results: a ``**kwargs`` that drops the keyword would otherwise be checked
        against a result it never computed. Also taken when every call fails, with
        the keyword and without (the property runs and reports the failure).
        """
        if self.kind == "attention":
            q = np.array([[0.5, -1.0], [1.0, 0.25]])
            args = [self._to_framework(strat.cast(q, self.dtype)) for _ in range(3)]
            if name == "enable_gqa":
                # four query heads over two key and value heads, which plain broadcasting
                # cannot pair: only a kernel that groups heads runs it
                q4, k2 = np.stack([q, -q, 0.5 * q, q.T]), np.stack([q, q.T])
                grouped = [self._to_framework(strat.cast(a, self.dtype)) for a in (q4, k2, k2)]
                return self._runs(grouped, {name: True}) is not None
        else:
            args = [self._to_framework(strat.cast(np.array([[0.0, 1.0, 2.0]]), self.dtype))]
        one_key = np.array([[True, False], [True, False]])  # both queries see key 0 alone
        values: tuple[Any, ...] = {
            "schedule": (Constant(beta="1"), Constant(beta="2")),
            "is_causal": (False, True),
            "scale": (0.5, 2.0),
            "mask": (np.ones((2, 2), dtype=bool), one_key),
            "attn_mask": (np.ones((2, 2), dtype=bool), one_key),
        }.get(name, (self.entropy_eps,))
        values = tuple(self._to_framework(v) if isinstance(v, np.ndarray) else v for v in values)
        results = [self._runs(args, {name: value}) for value in values]
        if any(r is None for r in results):
            return self._runs(args, {}) is None
        return len(results) == 1 or not _same_result(*results)

    def _runs(self, args: list[Any], kw: dict[str, Any]) -> np.ndarray | None:
        """The kernel's result on `args` with keywords `kw`, as a float64 array.

        None when the call raises; an empty array when the result is no array of numbers.
        """
        try:
            with np.errstate(all="ignore"):
                out = self.kernel(*args, **self.kwargs, **kw)
        except Exception:
            return None
        try:
            if self.framework == "torch" and hasattr(out, "detach"):
                out = out.detach().cpu().double().numpy()
            return np.asarray(out, dtype=np.float64)
        except Exception:
            return np.empty(0)

    @property
    def takes_schedule(self) -> bool:
        """The kernel takes ``schedule=``."""
        return self.takes("schedule")

    @property
    def takes_eps(self) -> bool:
        """The kernel takes ``entropy_eps=``."""
        return self.takes("entropy_eps")

    @property
    def names_eps(self) -> bool:
        """The kernel's signature names ``entropy_eps=`` (a ``**kwargs`` alone does not).

        Such a kernel is checked in both of the spec's entropy modes; one that takes
        the keyword through ``**kwargs`` only, or cannot be inspected, may drop it, and
        is checked in the run's mode alone.
        """
        return _accepts(self.kernel, "entropy_eps") is True

    @functools.cached_property
    def mask_keyword(self) -> str | None:
        """``mask`` or ``attn_mask``, the keyword the kernel takes a mask by (None if neither).

        One its signature names comes first: ``attn_mask=None, **kwargs`` takes
        ``attn_mask``, whatever its ``**kwargs`` would do with ``mask=``.
        """
        names = ("mask", "attn_mask")
        named = next((k for k in names if _accepts(self.kernel, k)), None)
        return named or next((k for k in names if self.takes(k)), None)

    @property
    def takes_causal(self) -> bool:
        """The kernel takes ``is_causal=``."""
        return self.takes("is_causal")

    @property
    def takes_scale(self) -> bool:
        """The kernel takes ``scale=`` (the logit scale of attention)."""
        return self.takes("scale")

    @property
    def takes_gqa(self) -> bool:
        """The kernel takes ``enable_gqa=`` (grouped-query attention).

        Only a signature that names it counts, or, uninspectable, a call with four
        query heads over two key heads that runs (broadcasting cannot pair them;
        with one key head a broadcasting kernel that ignores unknown keywords passed):
        a ``**kwargs`` that forwards nothing would fail every grouped call of a
        kernel that never claimed to group heads.
        """
        if "enable_gqa" not in self._takes:
            params = _parameters(self.kernel)
            if params is None:
                self._takes["enable_gqa"] = self._probe("enable_gqa")
            else:
                self._takes["enable_gqa"] = "enable_gqa" in params
        return self._takes["enable_gqa"]

    # -- calling -------------------------------------------------------------

    def _to_framework(self, a: np.ndarray | None, requires_grad: bool = False) -> Any:
        """`a` in the target's framework, dtype and device.

        With `requires_grad`, a float tensor is a leaf that requires grad (as a model's
        parameters are).
        """
        if a is None or self.framework == "numpy":
            return a
        import torch

        t = torch.from_numpy(np.ascontiguousarray(a))
        if a.dtype != bool:
            t = t.to(getattr(torch, self.dtype))
        t = t.to(self.device)
        return t.requires_grad_() if requires_grad and a.dtype != bool else t

    def _kwargs(self, schedule: Schedule | None) -> dict[str, Any]:
        kw: dict[str, Any] = dict(self.kwargs)
        if schedule is not None:
            kw["schedule"] = schedule
        if self.kind != "softmax" and self.takes_eps:
            # always, 0.0 too: a kernel whose own default guard is 1e-9 is checked at
            # the run's entropy_eps, not at its default
            kw["entropy_eps"] = self.entropy_eps
        return kw

    def _checked_call(
        self,
        args: dict[str, Any],
        originals: dict[str, np.ndarray],
        call: Callable[[], Any],
        literal: dict[str, np.ndarray] | None = None,
        grad_mode: str | None = None,
        call_text: str = "kernel(x)",
    ) -> Any:
        """Run `call` (the kernel on `args`, private copies); fail if it wrote to one of them.

        `originals` are the numpy arrays `args` were copied from, which the kernel never
        sees: for a numpy kernel (same dtype, same bits) they are the state before the
        call, so no further copy is made. `literal`, when given, holds small operands of
        a call with no views, made as `call_text` says, in `grad_mode` (a label of
        :data:`GRAD_MODES`, or None): a write or a flush is reported with a repro.

        Raises
        ------
        Failed
            If an element of one of `args` changed (bits compared: see
            :mod:`~softmaxtheory._check.memory`), or the kernel left flush-to-zero on,
            or (torch) left torch's grad mode, inference mode or default dtype changed
            (:data:`TORCH_STATE`; restored before the failure is raised).
        """
        if self.framework == "numpy":
            before = {name: snapshot(originals[name], copy=False) for name in args}
        else:
            before = {name: snapshot(a) for name, a in args.items()}
        flushing = flushes_subnormals()
        nearest = rounds_to_nearest()
        state = _torch_state() if self.framework == "torch" else None
        # numpy's error handling set to "call" (a callback that does nothing: errors pass
        # as under "ignore") is a state no kernel sets by itself: one that calls
        # numpy.seterr and leaves it, even to "ignore", is seen
        with np.errstate(all="call", call=_ignore_numpy_error):
            errors = np.geterr()
            out = call()
            left = np.geterr()
        if left != errors:
            self._numpy_errors_left(errors, left, literal, grad_mode, call_text)
        if state is not None and (after := _torch_state()) != state:
            self._state_changed(state, after, literal, grad_mode, call_text)
        if not flushing and flushes_subnormals():
            restored = restore_gradual_underflow()
            self._environment_left(
                "the kernel switched on flush-to-zero (the FTZ/DAZ floating-point modes) and "
                "left it on: every later float operation of its thread (and of the threads "
                "that thread starts), its caller's included, reads and returns subnormals as "
                "0. A kernel must leave the floating-point environment as it found it (torch: "
                "no torch.set_flush_denormal(True) left on)"
                + ("" if restored else "; the oracle could not switch it off again"),
                ("tiny = 5e-324  # the least subnormal", "tiny + tiny", "1e-323",
                 "0.0: the kernel left flush-to-zero on"),
                literal, grad_mode, call_text,
            )  # fmt: skip
        if nearest and not rounds_to_nearest():
            restored = restore_rounding_to_nearest()
            self._environment_left(
                "the kernel switched the rounding mode to a directed one (upward, downward or "
                "toward zero: fesetround) and left it so: every later float operation of its "
                "thread, its caller's included, rounds that way. A kernel must leave the "
                "floating-point environment as it found it"
                + ("" if restored else "; the oracle could not set rounding to nearest again"),
                ("below, above = 2.0**-60, 2.0**-53 + 2.0**-60  # under and over half an ulp of 1",
                 "1.0 + below == 1.0 and 1.0 + above > 1.0", "True",
                 "False: the kernel left a directed rounding mode on"),
                literal, grad_mode, call_text,
            )  # fmt: skip
        for name, a in args.items():
            change = changed(before[name], snapshot(a, copy=False))
            if change is None:
                continue
            text = (
                f"the kernel wrote to its input {name} (shape {tuple(a.shape)}): {change}. "
                "A kernel must leave its inputs as it found them (its caller may use them again)"
            )
            if literal is not None and change.index:
                repro = self._write_repro(literal, name, change, grad_mode, call_text)
                text += f"\nrepro:\n{repro}"
            raise Failed(text)
        return out

    def _state_changed(
        self,
        before: dict[str, Any],
        after: dict[str, Any],
        literal: dict[str, np.ndarray] | None,
        grad_mode: str | None,
        call_text: str,
    ) -> None:
        """Fail a call that left torch's global settings (:data:`TORCH_STATE`) changed.

        Restores them first, so that the suite and the caller go on as before.
        """
        _restore_torch_state(before)
        name = next(n for n in TORCH_STATE if before[n] != after[n])
        getter, effect = TORCH_STATE[name]
        expr = f"torch.{getter}()"
        text = (
            f"the kernel left torch's {name} changed ({expr} was {before[name]} before the "
            f"call, {after[name]} after it): every later torch operation of its thread, its "
            f"caller's included, runs so ({effect}). A kernel must leave torch's global "
            "settings as it found them (a context manager, not torch.set_grad_enabled or "
            "torch.set_default_dtype)"
        )
        if literal is not None:
            lines = [
                *self.operand_lines(literal, call_text),
                f"print({expr})  # {before[name]}",
                *grad_call_lines(grad_mode, call_text, _float_operands(literal)),
                f"print({expr})  # {after[name]}: the kernel left it changed",
            ]
            text += "\nrepro:\n" + "\n".join(lines)
        raise Failed(text)

    def _numpy_errors_left(
        self,
        before: dict[str, str],
        after: dict[str, str],
        literal: dict[str, np.ndarray] | None,
        grad_mode: str | None,
        call_text: str,
    ) -> NoReturn:
        """Fail a call that left numpy's floating-point error handling changed.

        (The settings themselves were restored on leaving the kernel's ``errstate``.)

        A ``numpy.seterr`` left behind makes later numpy code of the caller raise where it
        did not (``all="raise"``: the oracle's own strategies then met a
        FloatingPointError, reported as the child process exiting) or stay silent where it
        warned (``all="ignore"``).
        """
        which = ", ".join(f"{k}={after[k]!r}" for k in before if before[k] != after[k])
        self._environment_left(
            f"the kernel set numpy's floating-point error handling (numpy.seterr: {which}) "
            "and left it so: every later numpy operation of its thread, its caller's "
            "included, raises, warns or stays silent on overflow, underflow, division by "
            "zero and invalid operations accordingly. A kernel must leave it as it found it "
            "(numpy.errstate, a context manager, not numpy.seterr)",
            ("", "np.geterr()", "numpy's settings before the call",
             f"{which}: the kernel left these"),
            literal, grad_mode, call_text,
        )  # fmt: skip

    def _environment_left(
        self,
        text: str,
        probe: tuple[str, str, str, str],
        literal: dict[str, np.ndarray] | None,
        grad_mode: str | None,
        call_text: str,
    ) -> NoReturn:
        """Fail a call that left the floating-point environment changed, with a repro.

        `probe` is ``(setup, expression, before, after)``: the snippet makes the call
        between two prints of the expression, whose values before and after it are those.
        """
        if literal is not None:
            setup, expr, before, after = probe
            lines = [
                *self.operand_lines(literal, call_text),
                *([setup] if setup else []),
                f"print({expr})  # {before}",
                *grad_call_lines(grad_mode, call_text, _float_operands(literal)),
                f"print({expr})  # {after}",
            ]
            text += "\nrepro:\n" + "\n".join(lines)
        raise Failed(text)

    def repro_lines(self, x: np.ndarray) -> list[str]:
        """Import lines, the kernel as ``kernel`` and the logits `x` in its framework."""
        return self.operand_lines({"x": x})

    def operand_lines(self, operands: dict[str, np.ndarray], call_text: str = "") -> list[str]:
        """Import lines, the kernel as ``kernel`` and `operands` in its framework.

        Each operand is written out as the suite passed it: for torch, converted to the
        target's dtype and device (a float mask too, a boolean one kept boolean). A
        `call_text` that names ``softmaxtheory.spec`` has it imported.
        """
        head = self._repro_head() or "kernel = ...  # your kernel"
        lines = ["import numpy as np"]
        if self.framework == "torch":
            lines.append("import torch")
        if "softmaxtheory.spec" in call_text:
            lines.append("import softmaxtheory.spec")
        lines.append(head)
        for name, a in operands.items():
            if a.dtype == bool:
                text = f"np.array({a.tolist()!r})"
                if self.framework == "torch":
                    text = f"torch.from_numpy({text}).to({self.device!r})"
            elif self.framework == "numpy":
                text = array_literal(a, self.dtype if name != "mask" else a.dtype.name)
            else:
                text = (f"torch.from_numpy({array_literal(a, 'float64')})"
                        f".to(torch.{self.dtype}).to({self.device!r})")  # fmt: skip
            lines.append(f"{name} = {text}")
        return lines

    def _write_repro(
        self,
        operands: dict[str, np.ndarray],
        name: str,
        change: Change,
        grad_mode: str | None,
        call_text: str,
    ) -> str:
        """A snippet that makes the call and prints the element of `name` it overwrote."""
        lines = self.operand_lines(operands, call_text)
        where = ", ".join(map(str, change.index))
        lines += [
            *grad_call_lines(grad_mode, call_text, _float_operands(operands)),
            f"# {name}[{where}] was {change.before!r} before the call; after it:",
            f"print({name}[{where}].item())  # {change.after!r}",
        ]
        return "\n".join(lines)

    def call(
        self,
        x: np.ndarray,
        schedule: Schedule | None = None,
        view: Any = None,
        grad_mode: str | None = None,
    ) -> Any:
        """Call the kernel on logits `x` (a private copy, in the framework); return its output.

        `x` itself is never handed to the kernel; the call fails if the kernel writes to its
        copy (``Failed``, with a repro when the call is plain and x is small). `grad_mode`
        (torch), a label of :data:`~softmaxtheory.conformance.GRAD_MODES`, makes `x`
        require grad or runs the call under ``no_grad`` or ``inference_mode``.
        """
        arg = self._to_framework(private_copy(x), _requires_grad(grad_mode))
        viewed = arg if view is None else view(arg)
        plain = view is None and schedule is None

        def call() -> Any:
            with _grad_context(grad_mode):
                return self.kernel(viewed, **self._kwargs(schedule))

        literal = {"x": x} if plain and x.size <= 64 else None
        return self._checked_call({"x": arg}, {"x": x}, call, literal, grad_mode)

    def call_attention(
        self,
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        mask: Any,
        is_causal: bool,
        *,
        scale: float | None = None,
        views: dict[str, Any] | None = None,
        schedule: Schedule | None = None,
        enable_gqa: bool = False,
        grad_mode: str | None = None,
    ) -> Any:
        """Call an attention kernel on numpy operands (converted to the framework).

        `scale` and `schedule` are passed only when given, ``enable_gqa=True`` only
        when set; `views` maps an operand's name (``"q"``, ``"k"``, ``"v"``, ``"mask"``) to
        a function applied to it once converted (a strided view, say); `grad_mode` (torch), a
        label of :data:`~softmaxtheory.conformance.GRAD_MODES`, makes q, k and v
        require grad or runs the call under ``no_grad`` or ``inference_mode``.
        """
        kw = self._kwargs(schedule)
        originals = {"q": q, "k": k, "v": v}
        if mask is not None:
            originals["mask"] = np.asarray(mask)
        operands = {
            name: self._to_framework(private_copy(a), _requires_grad(grad_mode) and name != "mask")
            for name, a in originals.items()
        }
        views = views or {}
        passed = {n: views[n](a) if n in views else a for n, a in operands.items()}
        if mask is not None:
            kw[self.mask_keyword or "mask"] = passed["mask"]
        if is_causal:
            kw["is_causal"] = True
        if scale is not None:
            kw["scale"] = scale
        if enable_gqa:
            kw["enable_gqa"] = True
        args = [passed[n] for n in "qkv"]

        def call() -> Any:
            with _grad_context(grad_mode):
                return self.kernel(*args, **kw)

        # the call as a repro writes it (the target's own keywords are bound in its head)
        parts = ["q", "k", "v"]
        parts += [f"{self.mask_keyword or 'mask'}=mask"] if mask is not None else []
        parts += ["is_causal=True"] if is_causal else []
        parts += [f"scale={scale!r}"] if scale is not None else []
        parts += ["enable_gqa=True"] if enable_gqa else []
        parts += [f"schedule=softmaxtheory.spec.{schedule!r}"] if schedule is not None else []
        text = f"kernel({', '.join(parts)})"
        small = not views and all(a.size <= 3 * 64 for a in originals.values())
        return self._checked_call(
            operands, originals, call, originals if small else None, grad_mode, text
        )

    def _repro_head(self) -> str | None:
        """Lines that import the kernel as ``kernel`` (None without a ``module:function``).

        ``kernel`` is bound to the keywords every call passes: the target's own and
        ``entropy_eps`` when the kernel takes it (:meth:`_kwargs`), so that the repro's
        ``kernel(x)`` is the suite's call.
        """
        mod, _, attr = self.name.partition(":")
        if not attr:
            return None
        head = attr.split(".")[0]
        lines = f"from {mod} import {head}\nkernel = {attr}"
        bound = self._kwargs(None)
        if bound:
            args = ", ".join(f"{k}={v!r}" for k, v in bound.items())
            lines = f"import functools\n{lines}\nkernel = functools.partial(kernel, {args})"
        return lines

    @property
    def repro(self) -> str:
        """Lines that import the kernel and define ``kernel`` for repro snippets."""
        return self.repro_in(None)

    def repro_in(self, grad_mode: str | None) -> str:
        """:attr:`repro` for a call in `grad_mode`, a label of :data:`GRAD_MODES` or None.

        The ``kernel`` of the lines makes its torch inputs require grad, or calls the
        kernel under ``no_grad`` or ``inference_mode``, as the suite did.
        """
        if self.kind == "attention":
            return self.attention_repro(None, grad_mode)
        lines = self._repro_head()
        if lines is None:
            return "kernel = ...  # your kernel"
        if self.framework == "torch":
            src = np_dtype_literal(self.dtype)
            grad = ".requires_grad_()" if _requires_grad(grad_mode) else ""
            lines = (
                f"import torch\n{lines}\n"
                f"_kernel = kernel\n\n\n"
                "def kernel(*arrays, **kw):  # numpy in, numpy out, via torch\n"
                f"    ts = [torch.from_numpy(np.asarray(a, dtype={src}))"
                f".to(torch.{self.dtype}).to({self.device!r}){grad} for a in arrays]\n"
                + _grad_return("_kernel(*ts, **kw)", grad_mode)
            )
        return lines

    def attention_repro(self, views: dict[str, str] | None, grad_mode: str | None = None) -> str:
        """:attr:`repro` for an attention call whose operands were views.

        `views` maps ``"q"``, ``"k"`` or ``"v"`` to the source of the view the suite
        applied to it (``{x}`` standing for the operand, once in the framework); the
        ``kernel`` of the lines applies the same views, and calls the kernel in
        `grad_mode` (see :meth:`repro_in`).
        """
        head = self._repro_head()
        if head is None:
            return "kernel = ...  # your kernel"
        return head + self._attention_wrapper(views, grad_mode)

    def _attention_wrapper(self, views: dict[str, str] | None, grad_mode: str | None) -> str:
        """Lines that make ``kernel`` take the repro's call as the suite made it.

        The repro calls ``kernel(q, k, v, mask=..., is_causal=..., scale=...)`` on numpy
        arrays; the lines pass the mask by the kernel's keyword, apply `views` (see
        :meth:`attention_repro`) and, for torch, convert and set `grad_mode`.
        """
        key = self.mask_keyword or "mask"
        view_lines = "".join(
            f"    {name} = {src.format(x=name)}  # as the suite passed it\n"
            for name, src in (views or {}).items()
        )
        if self.framework == "numpy":
            if key == "mask" and not view_lines:
                return ""
            return (
                "\n_kernel = kernel\n\n\ndef kernel(q, k, v, mask=None, **kw):\n"
                + view_lines
                + f"    if mask is not None:\n        kw[{key!r}] = mask\n"
                "    return _kernel(q, k, v, **kw)\n"
            )
        src = np_dtype_literal(self.dtype)
        put = f".to({self.device!r})"
        grad = ".requires_grad_()" if _requires_grad(grad_mode) else ""
        return (
            "\nimport torch\n_kernel = kernel\n\n\n"
            "def kernel(q, k, v, mask=None, **kw):  # numpy in, numpy out, via torch\n"
            f"    q, k, v = (torch.from_numpy(np.asarray(a, dtype={src}))"
            f".to(torch.{self.dtype}){put}{grad}\n               for a in (q, k, v))\n"
            + view_lines
            + "    if mask is not None:\n"
            "        m = torch.from_numpy(np.asarray(mask))\n"
            f"        m = m if m.dtype == torch.bool else m.to(torch.{self.dtype})\n"
            f"        kw[{key!r}] = m{put}\n" + _grad_return("_kernel(q, k, v, **kw)", grad_mode)
        )

    def budget(self, default: int) -> int:
        """Number of Hypothesis examples for a property."""
        if self.examples is not None:
            return self.examples
        return default * 10 if self.thorough else default


def target_from_options(
    kernel: str,
    *,
    kind: str = "softmax",
    framework: str = "numpy",
    device: str = "cpu",
    dtype: str | None = None,
    entropy_eps: float | str = 0.0,
    schedule: Schedule | str = "paper",
    thorough: bool = False,
    examples: int | None = None,
    kwargs: Iterable[str] = (),
    strict: bool = False,
    load: bool = True,
) -> Target | None:
    """Build the :class:`Target` of a run from its options, as given on a command line.

    ``softmaxtheory check`` and the pytest plugin (``--softmax-*``) both call
    it, so a bad option is the same error in both. The options are validated
    before the kernel is imported.

    Parameters
    ----------
    kernel : str
        ``pkg.mod:func``, imported with :func:`load_kernel`.
    kind : str
        One of :data:`KINDS`.
    framework : str
        One of :data:`FRAMEWORKS`.
    device : str
        ``cpu``, ``cuda`` or ``cuda:N`` (torch only).
    dtype : str, optional
        One of :data:`DTYPES`; by default float64 for numpy, float32 for torch.
    entropy_eps : float or str
        The kernel's entropy guard, >= 0 (text is parsed as a float).
    schedule : Schedule or str
        The schedule the kernel implements, or its command-line spelling
        (``paper``, ``constant:BETA``, ``loglength:S``, ``poly:CK,...,C1,C0[@THETA]``).
    thorough : bool
        Explore ten times more examples.
    examples : int, optional
        Examples per Hypothesis property (overrides the budget).
    kwargs : sequence of str
        Extra keyword arguments for every call, each ``NAME=VALUE``
        (:func:`parse_kwarg`).
    strict : bool
        See :class:`Target`.
    load : bool, default True
        Import the kernel and return the target; ``False`` validates the options
        only and returns ``None`` (the kernel is then imported elsewhere: the pytest
        plugin leaves it to its child process).

    Raises
    ------
    ConformanceUsageError
        Naming the option or the kernel path that is wrong (see
        :func:`check_options` and :func:`load_kernel`).

    Examples
    --------
    >>> from softmaxtheory.conformance import target_from_options
    >>> t = target_from_options("numpy:exp", framework="numpy", kwargs=["casting='same_kind'"])
    >>> t.name, t.dtype, t.kwargs
    ('numpy:exp', 'float64', {'casting': 'same_kind'})
    >>> try:
    ...     target_from_options("numpy:exp", dtype="bfloat16")
    ... except ValueError as exc:
    ...     print(exc)
    numpy has no bfloat16: use --framework torch
    """
    if dtype is None and framework in FRAMEWORKS:
        dtype = default_dtype(framework)
    if isinstance(entropy_eps, str):
        try:
            entropy_eps = float(entropy_eps)
        except ValueError:
            raise ConformanceUsageError(
                f"entropy_eps must be a finite number >= 0, got {entropy_eps!r}"
            ) from None
    check_options(
        kind=kind, framework=framework, device=device, dtype=str(dtype),
        entropy_eps=entropy_eps, examples=examples,
    )  # fmt: skip
    if isinstance(schedule, str):
        from argparse import ArgumentTypeError

        from ..cli import parse_schedule

        try:
            schedule = parse_schedule(schedule)
        except ArgumentTypeError as exc:  # "bad schedule 'x': ..."
            raise ConformanceUsageError(str(exc)) from None
    parsed = dict(parse_kwarg(text) for text in kwargs)
    if not load:
        return None
    fn, name = load_kernel(kernel)
    return Target(
        fn, name, kind=kind, framework=framework, device=device, dtype=str(dtype),
        entropy_eps=entropy_eps, schedule=schedule, thorough=thorough, examples=examples,
        kwargs=parsed, strict=strict,
    )  # fmt: skip
