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

Every property compares the kernel with the certified reference through
:mod:`softmaxtheory.testing` (the error model) and reports the largest error
in ulps; see :data:`PROPERTIES`. The run is deterministic (derandomized
Hypothesis with a fixed example budget); ``thorough=True`` explores more.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import math
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.reporting import with_reporter

from . import strategies as strat
from . import testing as tst
from .spec import Constant, LogLength, PaperPolynomial, Polynomial, Schedule, resolve_schedule

__all__ = [
    "DTYPES",
    "FRAMEWORKS",
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
]

#: The kinds of kernel the suite checks.
KINDS: tuple[str, ...] = ("softmax", "entropy", "adaptive_softmax", "attention")
#: How the kernel is called (numpy arrays or torch tensors).
FRAMEWORKS: tuple[str, ...] = ("numpy", "torch")
#: The input dtypes.
DTYPES: tuple[str, ...] = ("float64", "float32", "float16", "bfloat16")


class ConformanceUsageError(ValueError):
    """A bad kernel path, kind, framework, dtype or device (exit status 2)."""


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


def _accepts(fn: Callable[..., Any], name: str) -> bool | None:
    """Whether `fn`'s signature takes keyword `name`; None when it cannot be inspected."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


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
    ``mask=``/``attn_mask=``, ``is_causal=``) is read from its signature; when
    the signature cannot be inspected (a builtin such as
    ``torch.nn.functional.scaled_dot_product_attention``), the kernel is
    probed by calling it on a tiny input with and without the keyword.
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
        self._takes: dict[str, bool] = {}

    # -- which keywords the kernel takes ----------------------------------------

    def takes(self, name: str) -> bool:
        """Whether the kernel takes keyword `name` (signature, else a probing call)."""
        if name not in self._takes:
            known = _accepts(self.kernel, name)
            self._takes[name] = self._probe(name) if known is None else known
        return self._takes[name]

    def _probe(self, name: str) -> bool:
        """Probe keyword `name` by calling the kernel on a tiny input with and without it.

        Taken unless only the call with it fails (when both fail, the property
        runs and reports the failure).
        """
        value: Any = {
            "schedule": self.schedule,
            "entropy_eps": self.entropy_eps,
            "is_causal": False,
        }.get(name)
        if self.kind == "attention":
            q = np.array([[0.5, -1.0], [1.0, 0.25]])
            args = [self._to_framework(strat._cast(q, self.dtype)) for _ in range(3)]
            if name in ("mask", "attn_mask"):
                value = self._to_framework(np.ones((2, 2), dtype=bool))
        else:
            args = [self._to_framework(strat._cast(np.array([[0.0, 1.0, 2.0]]), self.dtype))]

        def ok(kw: dict[str, Any]) -> bool:
            try:
                with np.errstate(all="ignore"):
                    self.kernel(*args, **self.kwargs, **kw)
            except Exception:
                return False
            return True

        return ok({name: value}) or not ok({})

    @property
    def takes_schedule(self) -> bool:
        """The kernel takes ``schedule=``."""
        return self.takes("schedule")

    @property
    def takes_eps(self) -> bool:
        """The kernel takes ``entropy_eps=``."""
        return self.takes("entropy_eps")

    @property
    def mask_keyword(self) -> str | None:
        """``mask`` or ``attn_mask``, the keyword the kernel takes a mask by (None if neither)."""
        return next((k for k in ("mask", "attn_mask") if self.takes(k)), None)

    @property
    def takes_causal(self) -> bool:
        """The kernel takes ``is_causal=``."""
        return self.takes("is_causal")

    # -- calling -------------------------------------------------------------

    def _to_framework(self, a: np.ndarray | None) -> Any:
        if a is None or self.framework == "numpy":
            return a
        import torch

        t = torch.from_numpy(np.ascontiguousarray(a))
        if a.dtype != bool:
            t = t.to(getattr(torch, self.dtype))
        return t.to(self.device)

    def _kwargs(self, schedule: Schedule | None) -> dict[str, Any]:
        kw: dict[str, Any] = dict(self.kwargs)
        if schedule is not None:
            kw["schedule"] = schedule
        if self.entropy_eps and self.takes_eps:
            kw["entropy_eps"] = self.entropy_eps
        return kw

    def call(self, x: np.ndarray, schedule: Schedule | None = None, view: Any = None) -> Any:
        """Call the kernel on logits `x` (numpy, converted to the framework); return its output."""
        arg = self._to_framework(x)
        if view is not None:
            arg = view(arg)
        return self.kernel(arg, **self._kwargs(schedule))

    def call_attention(
        self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: Any, is_causal: bool
    ) -> Any:
        """Call an attention kernel."""
        kw = self._kwargs(None)
        if mask is not None:
            kw[self.mask_keyword or "mask"] = self._to_framework(mask)
        if is_causal:
            kw["is_causal"] = True
        return self.kernel(*(self._to_framework(a) for a in (q, k, v)), **kw)

    @property
    def repro(self) -> str:
        """Lines that import the kernel and define ``kernel`` for repro snippets."""
        mod, _, attr = self.name.partition(":")
        if not attr:
            return "kernel = ...  # your kernel"
        head = attr.split(".")[0]
        lines = f"from {mod} import {head}\nkernel = {attr}"
        if self.kwargs:
            args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
            lines = f"import functools\n{lines}\nkernel = functools.partial(kernel, {args})"
        if self.framework == "torch":
            src = "np.float32" if self.dtype == "bfloat16" else f"np.{self.dtype}"
            lines = (
                f"import torch\n{lines}\n"
                f"_kernel = kernel\n\n\ndef kernel(*arrays):  # numpy in, numpy out, via torch\n"
                f"    ts = [torch.from_numpy(np.asarray(a, dtype={src}))"
                f".to(torch.{self.dtype}).to({self.device!r}) for a in arrays]\n"
                f"    return _kernel(*ts).cpu().double().numpy()\n"
            )
        return lines

    def budget(self, default: int) -> int:
        """Number of Hypothesis examples for a property."""
        if self.examples is not None:
            return self.examples
        return default * 10 if self.thorough else default


@dataclass
class PropertyResult:
    """The verdict of one property.

    Attributes
    ----------
    name : str
        The property.
    status : str
        ``pass``, ``fail`` or ``skip`` (not applicable to this kernel).
    max_ulp : float
        The largest error measured, in ulps of the kernel's dtype.
    checks : int
        Number of kernel calls compared.
    message : str
        The counterexample with its repro snippet (``fail``), or why it was
        skipped, or notes.
    """

    name: str
    status: str
    max_ulp: float = 0.0
    checks: int = 0
    message: str = ""

    def line(self) -> str:
        """One line of the report."""
        ulp = f"max {tst._fmt_ulp(self.max_ulp)} ulp" if self.checks else ""
        tail = self.message.splitlines()[0] if self.status == "skip" and self.message else ""
        if self.status == "fail" and self.message.startswith(_STOPPED):
            tail = self.message.splitlines()[0][len(_STOPPED) :]
        checks = f"{self.checks:>5} {'check' if self.checks == 1 else 'checks'}"
        return f"{self.status.upper():<5} {self.name:<20} {ulp:<22} {checks} {tail}".rstrip()


#: How the message of a property stopped from outside (timed out, process ended) begins.
_STOPPED = "stopped: "


class _Failed(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class _Run:
    """Accumulates measurements of one property."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.max_ulp = 0.0
        self.checks = 0

    def output(self, out: Any, x_desc: str) -> tuple[np.ndarray, str]:
        t = self.target
        if t.framework == "torch" and not tst._is_torch(out):
            raise _Failed(
                f"the kernel returned {type(out).__name__}, not a torch tensor ({x_desc})"
            )
        try:
            return tst.to_numpy(out, "output")
        except TypeError as exc:
            raise _Failed(f"the kernel's output has a bad dtype: {exc} ({x_desc})") from exc

    def compare(
        self,
        out: Any,
        x: np.ndarray,
        *,
        schedule: Schedule | None = None,
        source: str | None = None,
        what: str = "",
    ) -> tst.ErrorReport:
        t = self.target
        got, got_dtype = self.output(out, what)
        if got_dtype != t.dtype:
            raise _Failed(
                f"{what}: the kernel returned dtype {got_dtype} for {t.dtype} input "
                "(dtype not preserved)"
            )
        repro = t.repro
        if schedule is not None:
            if "import functools" not in repro:
                repro = "import functools\n" + repro
            repro = (
                f"import softmaxtheory.spec\n{repro}\n"
                f"kernel = functools.partial(kernel, schedule=softmaxtheory.spec.{schedule!r})"
            )
        if source is not None and "softmaxtheory.strategies" in source:
            repro = "import softmaxtheory.strategies\n" + repro
        kw: dict[str, Any] = dict(dtype=t.dtype, repro=repro, source=source, strict=t.strict)
        try:
            if t.kind == "softmax":
                rep = tst.assert_softmax_close(got, x, **kw)
            elif t.kind == "entropy":
                rep = tst.assert_entropy_close(got, x, entropy_eps=t.entropy_eps, **kw)
            else:
                rep = tst.assert_adaptive_softmax_close(
                    got, x, schedule=schedule or t.schedule, entropy_eps=t.entropy_eps, **kw
                )
        except tst.KernelMismatch as exc:
            self.note(exc.report)
            text = f"{what}\n{exc}" if what else str(exc)
            raise _Failed(_with_hint(text, _precision_hint(t.dtype, exc.report))) from exc
        self.note(rep)
        return rep

    def note(self, rep: tst.ErrorReport) -> None:
        self.checks += 1
        if rep.size:
            self.max_ulp = max(self.max_ulp, rep.max_ulp)

    def call(self, x: np.ndarray, **kw: Any) -> Any:
        try:
            return self.target.call(x, **kw)
        except _Failed:
            raise
        except Exception as exc:
            raise _Failed(
                f"the kernel raised {type(exc).__name__}: {exc}\non input of shape {x.shape}, "
                f"dtype {self.target.dtype}:\n{tst._row_literal(x.ravel()[:64], self.target.dtype)}"
                f"\n{''.join(traceback.format_exception_only(exc)).strip()}"
            ) from exc


def _precision_hint(dtype: str, rep: tst.ErrorReport) -> str:
    """Say that the kernel seems to compute in float32 (a float64 run, float32-sized errors).

    Float32's unit roundoff is 6e-8; relative errors between 1e-9 and 1e-5 in
    a float64 run are that size, not float64's (1.1e-16).
    """
    rel = float(getattr(rep, "max_rel_error", math.nan))
    if dtype == "float64" and 1e-9 <= rel <= 1e-5:
        return (
            f"\nhint: the relative errors (up to {rel:.2g}) are of the size of float32's "
            "rounding (6e-8): the kernel seems to compute in float32, not float64"
        )
    return ""


def _with_hint(text: str, hint: str) -> str:
    """Put `hint` before the repro snippet, which stays runnable as it is."""
    head, sep, tail = text.partition("\nrepro:\n")
    return f"{head}{hint}{sep}{tail}" if sep else text + hint


def _hyp_settings(n: int, shrink: bool) -> settings:
    phases = (Phase.explicit, Phase.generate, Phase.shrink) if shrink else (Phase.generate,)
    return settings(
        max_examples=n,
        derandomize=True,
        database=None,
        deadline=None,
        print_blob=False,
        phases=phases,
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
    )


def _run_given(
    target: Target, strategy: st.SearchStrategy[Any], n: int, body: Callable[[Any], None]
) -> None:
    """Run `body` on `n` derandomized examples; raise _Failed with the counterexample.

    The counterexample is shrunk (minimised) when the target is thorough.
    """

    @_hyp_settings(n, target.thorough)
    @given(strategy)
    def prop(example: Any) -> None:
        body(example)

    with with_reporter(lambda _msg: None), _without_local_constants():
        prop()  # Hypothesis re-raises the (minimal) _Failed; anything else is a bug here


@contextlib.contextmanager
def _without_local_constants() -> Iterator[None]:
    """Draw without the literals of whatever "local" modules happen to be imported.

    Hypothesis (6.13x and later) mixes into its draws the constants found in
    the source of every imported module it deems local: the kernel's module,
    and in some installations torch. The same kernel's verdict would then
    depend on what was imported before the run (a property that fails alone
    passed after ``import torch``). The suite's draws use Hypothesis's global
    constants only. Private API: if it changes, the draws merely lose this
    isolation.
    """
    try:
        from hypothesis.internal.conjecture import providers as hp

        empty = type(hp._local_constants)()
        saved = hp._get_local_constants
        cache = hp.CONSTANTS_CACHE.cache
    except (ImportError, AttributeError, TypeError):  # pragma: no cover - other versions
        yield
        return
    cache.clear()
    hp._get_local_constants = lambda: empty
    try:
        yield
    finally:
        hp._get_local_constants = saved
        cache.clear()


def _rng_row(seed: int, n: int, scale: float, dtype: str) -> tuple[np.ndarray, str]:
    src = f"np.random.default_rng({seed}).normal(0.0, {scale}, {n})"
    row = strat._cast(np.random.default_rng(seed).normal(0.0, scale, n), dtype)
    return row, _src_cast(src, dtype)


def _src_cast(src: str, dtype: str) -> str:
    if dtype == "bfloat16":
        return f"softmaxtheory.strategies._cast({src}, 'bfloat16')"
    return f"{src}.astype(np.{dtype})"


# ---------------------------------------------------------------------------
# the properties (row-wise kinds)
# ---------------------------------------------------------------------------


def _p_values(t: Target, run: _Run) -> None:
    """Random batches from every row family against the reference."""
    strategy = strat.logit_batches(
        strat.shapes(max_dims=2, max_side=3), min_size=1, max_size=48, dtype=t.dtype
    )

    def body(x: np.ndarray) -> None:
        run.compare(run.call(x), x, what="values")

    _run_given(t, strategy, t.budget(100), body)


def _p_long_rows(t: Target, run: _Run) -> None:
    """Long rows (4096 and 16384 items): accumulation error against the bound."""
    sizes = [(4096, 1.0), (4096, 4.0), (16384, 2.0)]
    if t.thorough:
        sizes += [(65536, 3.0), (16384, 8.0)]
    for seed, (n, scale) in enumerate(sizes):
        x, src = _rng_row(seed, n, scale, t.dtype)
        run.compare(run.call(x), x, source=src, what=f"long row, n = {n}")
    # a long row whose mass sits on ~e^H items (entropy in the adaptive window)
    x = strat._cast(strat.row_with_entropy(4.0, 8192, 3), t.dtype)
    src = _src_cast("softmaxtheory.strategies.row_with_entropy(4.0, 8192, 3)", t.dtype)
    run.compare(run.call(x), x, source=src, what="long row in the adaptive window, n = 8192")


def _p_million_row(t: Target, run: _Run) -> None:
    """One row of 2**20 items (2**24 with --thorough): accumulation over a million keys."""
    n = 1 << (24 if t.thorough else 20)
    x, src = _rng_row(20, n, 2.0, t.dtype)
    run.compare(run.call(x), x, source=src, what=f"long row, n = 2**{n.bit_length() - 1}")


def _branch_entropies() -> list[float]:
    pts = strat.branch_points()
    centres = [0.3, pts["threshold"], 0.7, pts["H_on"], 2.0, pts["H_star"], 5.0, pts["H_off"]]
    return [h + d for h in [*centres, 6.5, 7.5] for d in (-1e-4, 0.0, 1e-4)]


def _branch_rows(dtype: str) -> tuple[np.ndarray, str]:
    hs = _branch_entropies()
    rows = np.stack([strat._cast(strat.row_with_entropy(h, 2048, 1), dtype) for h in hs])
    src = _src_cast(
        f"np.stack([softmaxtheory.strategies.row_with_entropy(h, 2048, 1) for h in {hs!r}])",
        dtype,
    )
    return rows, src


def _p_branch_points(t: Target, run: _Run) -> None:
    """Rows around 0.5, H_on, H*, H_off and beyond (n = 2048); 256-2048 items at H in [5, H_off].

    The second set (:func:`softmaxtheory.strategies.window_rows`, some translated
    far from zero) is where β reacts most to an entropy error: a kernel whose
    statistics are computed in float16 fails there.
    """
    rows, src = _branch_rows(t.dtype)
    run.compare(run.call(rows), rows, source=src, what="branch-point rows")

    def body(x: np.ndarray) -> None:
        run.compare(run.call(x[None, :]), x[None, :], what=f"{x.shape[0]} items, H in [5, H_off]")

    _run_given(t, strat.window_rows(t.dtype), t.budget(8), body)


def _p_batch_independence(t: Target, run: _Run) -> None:
    """A row's result must not depend on the other rows of the batch."""
    companions = [
        np.zeros(64),  # uniform: H = log 64
        np.where(np.arange(64) == 5, 0.0, -40.0),  # one-hot: H ~ 0
        np.random.default_rng(7).normal(0, 6, 64),
    ]

    def body(row: np.ndarray) -> None:
        n = row.shape[0]
        alone = run.call(row[None, :])
        run.compare(alone, row[None, :], what="row alone")
        for comp in companions:
            c = strat._cast(np.resize(comp, n), t.dtype)
            batch = np.stack([row, c, c])
            got = run.call(batch)
            run.compare(got, batch, what="row next to other rows (batch independence)")

    strategy = strat.logit_rows(max_size=48, dtype=t.dtype).filter(lambda r: r.shape[0] >= 2)
    _run_given(t, strategy, t.budget(30), body)


def _p_dtype_shape(t: Target, run: _Run) -> None:
    """Output dtype equals the input dtype; shapes (n,), (1, n), (2, 3, n), views."""
    base = strat._cast(np.random.default_rng(11).normal(0, 3, (2, 3, 5)), t.dtype)
    cases: list[tuple[str, np.ndarray, Any]] = [
        ("1-d row", base[0, 0], None),
        ("shape (1, n)", base[0, :1], None),
        ("shape (2, 3, n)", base, None),
        ("n = 1", base[..., :1], None),
    ]
    for label, x, view in cases:
        out = run.call(x, view=view)
        got, _ = run.output(out, label)
        want = x.shape if t.kind != "entropy" else x.shape[:-1]
        if got.shape != want:
            raise _Failed(f"{label}: output shape {got.shape}, expected {want}")
        run.compare(out, x, what=label)
    # a non-contiguous input: a transposed view
    xt = np.ascontiguousarray(np.swapaxes(base[0], 0, 1))  # (5, 3): rows are columns
    if t.framework == "numpy":
        view = np.swapaxes(xt, 0, 1)
        out = t.kernel(view, **t._kwargs(None))
    else:
        out = t.call(xt, view=lambda a: a.transpose(0, 1))
    run.compare(out, np.swapaxes(xt, 0, 1).copy(), what="non-contiguous (transposed) input")


def _special_expected(t: Target) -> list[tuple[str, np.ndarray]]:
    ninf, nan, inf = -np.inf, np.nan, np.inf
    return [
        ("partly masked row", np.array([[0.5, ninf, 2.0, ninf, -1.0]])),
        ("one unmasked item", np.array([[ninf, 3.0, ninf]])),
        ("fully masked row", np.array([[ninf, ninf, ninf], [0.0, 1.0, 2.0]])),
        ("row with NaN", np.array([[0.0, nan, 1.0], [0.0, 1.0, 2.0]])),
        ("row with +inf", np.array([[0.0, inf, 1.0], [0.0, 1.0, 2.0]])),
        ("empty rows (n = 0)", np.zeros((2, 0))),
    ]


def _p_special_values(t: Target, run: _Run) -> None:
    """The special-value table: masks exact; NaN/+inf rows NaN; masked rows; n = 0."""
    notes = []
    for label, x64 in _special_expected(t):
        x = strat._cast(x64, t.dtype)
        try:
            out = t.call(x)
        except Exception as exc:
            if label.startswith("empty"):
                notes.append(f"n = 0 refused with {type(exc).__name__}")
                continue
            raise _Failed(f"{label}: the kernel raised {type(exc).__name__}: {exc}") from exc
        got, _ = run.output(out, label)
        if label in ("fully masked row", "row with +inf"):
            # conventions differ (torch and scipy give NaN for a fully masked row, and a
            # NaN at the +inf item): by default a softmax may answer NaN there, never a
            # silent number; strict (and every kind but softmax for a fully masked row)
            # demands the table
            bad = got[0] if got.ndim else got
            ok_table = _matches_table(t, x, got)
            nan_ok = bool(np.any(np.isnan(bad)))
            fully = label.startswith("fully")
            if fully and t.kind == "entropy":
                nan_ok = bool(np.isnan(bad))
            tolerated = not t.strict and (t.kind == "softmax" or not fully)
            table = _table_value(t, label)
            if not ok_table and not (tolerated and nan_ok):
                if nan_ok and not tolerated:
                    why = (
                        "NaN is tolerated only without strict, as torch.softmax's convention"
                        if t.kind == "softmax" or not fully
                        else f"NaN is torch.softmax's convention, not kind {t.kind}'s"
                    )
                else:
                    why = "NaNs are tolerated as a convention, finite numbers are not"
                raise _Failed(f"{label}: got {got[0]!r}; the table gives {table} ({why})")
            if not ok_table:
                notes.append(f"{label}: NaN where the table gives {table}")
            run.compare(out[1:], x[1:], what=label)
            continue
        run.compare(out, x, what=label)
    if notes:
        raise _Note("; ".join(notes))


class _Note(Exception):
    pass


def _table_value(t: Target, label: str) -> str:
    """What the special-value table gives on the first row of case `label`, in words."""
    if label.startswith("fully"):
        return "0" if t.kind == "entropy" else "zeros"
    return "NaN" if t.kind == "entropy" else "NaN at every item"


def _matches_table(t: Target, x: np.ndarray, got: np.ndarray) -> bool:
    from . import reference

    x0 = x[:1].astype(np.float32) if t.dtype == "bfloat16" else x[:1]
    if t.kind == "softmax":
        ref = reference.softmax(x0)
    elif t.kind == "entropy":
        ref = reference.entropy(x0, entropy_eps=t.entropy_eps)
    else:
        ref = reference.adaptive_softmax(x0, schedule=t.schedule, entropy_eps=t.entropy_eps)
    g = np.asarray(got[:1], dtype=np.float64)
    return bool(np.array_equal(g, ref, equal_nan=True))


@st.composite
def _dyadic_rows(draw: Any, dtype: str) -> np.ndarray:
    n = draw(st.integers(2, 24))
    ks = draw(st.lists(st.integers(-512, 512), min_size=n, max_size=n))
    return strat._cast(np.array(ks) / 16.0, dtype)


def _p_invariances(t: Target, run: _Run) -> None:
    """T8: shift (x + c, exact, also far from zero, with masks), permutation, masking = removal."""
    # the far shifts keep the dyadic rows exact: every entry beyond 1e4 from zero
    shifts = {
        "float64": [3.0, -1000.0, 2.0**40, -3.0 * 2.0**14, -(2.0**45)],
        "float32": [3.0, -1000.0, 2.0**16, -3.0 * 2.0**14],
        "bfloat16": [2.0],
        "float16": [3.0, -16.0],
    }[t.dtype]

    def body(args: tuple[np.ndarray, int, list[int]]) -> None:
        x, perm_seed, drop = args
        n = x.shape[0]
        drop = sorted({d % n for d in drop})
        for c in shifts:
            xs = strat._cast(x.astype(np.float64) + c, t.dtype)
            if not np.array_equal(xs.astype(np.float64), x.astype(np.float64) + c):
                continue  # not exact in this dtype
            run.compare(run.call(xs), xs, what=f"shift by {c!r}")
            if abs(c) >= 1e4 and 0 < len(drop) < n:
                xm = xs.copy()
                xm[drop] = -np.inf
                run.compare(run.call(xm), xm, what=f"shift by {c!r}, masked entries")
        perm = np.random.default_rng(perm_seed).permutation(n)
        run.compare(run.call(x[perm]), x[perm], what="permutation")
        if len(drop) < n:
            masked = x.copy()
            masked[drop] = -np.inf
            kept = np.delete(x, drop)
            out_m = run.call(masked)
            run.compare(out_m, masked, what="masked entries")
            run.compare(run.call(kept), kept, what="masked entries removed")

    strategy = st.tuples(
        _dyadic_rows(t.dtype), st.integers(0, 1000), st.lists(st.integers(0, 50), max_size=4)
    )
    _run_given(t, strategy, t.budget(30), body)


def _p_temperature_cap(t: Target, run: _Run) -> None:
    """T5: beta >= 1, so the adaptive max is >= the softmax max (and entropy <= softmax's)."""
    from . import reference

    def body(x: np.ndarray) -> None:
        out = run.call(x)
        got, _ = run.output(out, "temperature cap")
        xr, got = x.reshape(-1, x.shape[-1]), got.reshape(-1, x.shape[-1])
        sm = reference.softmax(xr)
        fmt = tst.model.FORMATS[t.dtype]
        top_sm = np.max(sm, axis=-1)
        top = np.max(got.astype(np.float64), axis=-1)
        slack = 64 * fmt.u * top_sm + fmt.tiny
        if fmt.precision < 24 and not t.strict:
            # the default 16-bit contract: the scaled logits may be rounded once (any beta)
            cond = tst.model.row_conditioning(xr)
            b = np.full(cond.H.shape, tst.model.BETA_MAX)
            rel = tst.model.logit_rounding_rel_error(cond, b, b, fmt)
            with np.errstate(over="ignore"):
                slack = slack + np.expm1(tst.model.SLACK * np.max(rel, axis=-1)) * top_sm
        bad = np.flatnonzero(top < top_sm - slack)
        if bad.size:
            i = int(bad[0])
            raise _Failed(
                f"temperature cap (T5) violated: the largest adaptive coefficient "
                f"{float(top[i])!r} is below the largest softmax coefficient {float(top_sm[i])!r}, "
                f"so beta < 1 on row {i}\nrepro:\nimport numpy as np\n{t.repro}\n"
                f"x = {tst._row_literal(xr[i], t.dtype)}\nprint(kernel(x).max())"
            )
        run.compare(out, x, what="temperature cap")

    strategy = strat.logit_batches(
        strat.shapes(1, 3), max_size=40, dtype=t.dtype, families=("entropy", "translated")
    )
    _run_given(t, strategy, t.budget(40), body)


def _p_schedules(t: Target, run: _Run) -> None:
    """Other schedules passed as ``schedule=``: Constant, LogLength, a polynomial with a jump."""
    if not t.takes_schedule:
        raise _Skip("the kernel takes no schedule= keyword")
    schedules: list[Schedule] = [
        Constant("2"),
        Constant("0.5"),
        LogLength("0.5"),
        Polynomial(("0.5", "1"), threshold="1"),  # beta jumps from 1 to 1.5 at H = 1
    ]
    rows, src = _branch_rows(t.dtype)
    hs = [0.3, 0.9, 1.5, 2.5]
    small = np.stack([strat._cast(strat.row_with_entropy(h, 16, 1), t.dtype) for h in hs])
    small_src = _src_cast(
        f"np.stack([softmaxtheory.strategies.row_with_entropy(h, 16, 1) for h in {hs!r}])",
        t.dtype,
    )
    for sched in schedules:
        for x, xs in ((small, small_src), (rows, src)):
            out = run.call(x, schedule=sched)
            run.compare(out, x, schedule=sched, source=xs, what=f"schedule={sched!r}")


class _Skip(Exception):
    pass


# ---------------------------------------------------------------------------
# attention
# ---------------------------------------------------------------------------


def _attention_compare(run: _Run, inputs: dict[str, Any], what: str) -> None:
    t = run.target
    q, k, v, mask, causal = (inputs[n] for n in ("q", "k", "v", "mask", "is_causal"))
    try:
        out = t.call_attention(q, k, v, mask, causal)
    except Exception as exc:
        raise _Failed(
            f"{what}: the kernel raised {type(exc).__name__}: {exc} (q {q.shape}, k {k.shape}, "
            f"v {v.shape}, mask {None if mask is None else mask.shape}, is_causal {causal})"
        ) from exc
    got, got_dtype = run.output(out, what)
    if got_dtype != t.dtype:
        raise _Failed(f"{what}: the kernel returned dtype {got_dtype} for {t.dtype} input")
    try:
        rep = tst.assert_attention_close(
            got, (q, k, v), mask=mask, is_causal=causal, schedule=t.schedule,
            entropy_eps=t.entropy_eps, dtype=t.dtype, repro=t.repro, strict=t.strict,
        )  # fmt: skip
    except tst.KernelMismatch as exc:
        run.note(exc.report)
        raise _Failed(_with_hint(f"{what}\n{exc}", _precision_hint(t.dtype, exc.report))) from exc
    run.note(rep)


def _p_attention_values(t: Target, run: _Run) -> None:
    """Random q, k, v (sharp and flat heads, batched) against the reference."""
    _run_given(
        t,
        strat.attention_inputs(t.dtype),
        t.budget(50),
        lambda inp: _attention_compare(run, inp, "attention values"),
    )


def _p_attention_masks(t: Target, run: _Run) -> None:
    """Boolean masks (True attends)."""
    if t.mask_keyword is None:
        raise _Skip("the kernel takes no mask= or attn_mask= keyword")
    strategy = strat.attention_inputs(t.dtype, masks=True, batch=False).filter(
        lambda d: d["mask"] is not None
    )
    _run_given(t, strategy, t.budget(25), lambda inp: _attention_compare(run, inp, "masked"))


def _p_attention_causal(t: Target, run: _Run) -> None:
    """``is_causal=True`` (keys j > i masked)."""
    if not t.takes_causal:
        raise _Skip("the kernel takes no is_causal= keyword")
    strategy = strat.attention_inputs(t.dtype, causal=True).filter(lambda d: d["is_causal"])
    _run_given(t, strategy, t.budget(25), lambda inp: _attention_compare(run, inp, "causal"))


def _p_attention_batch(t: Target, run: _Run) -> None:
    """Each batch entry and query row is independent of the others; long key sequences."""
    rng = np.random.default_rng(5)
    cast = lambda a: strat._cast(a, t.dtype)  # noqa: E731
    q = cast(rng.normal(0, 2, (3, 4, 8)))
    k = cast(rng.normal(0, 1, (3, 256, 8)))
    v = cast(rng.normal(0, 1, (3, 256, 4)))
    base = {"mask": None, "is_causal": False}
    _attention_compare(run, {"q": q, "k": k, "v": v, **base}, "batched (3 heads, 256 keys)")
    for i in range(2):
        one = {"q": q[i : i + 1, :1], "k": k[i : i + 1], "v": v[i : i + 1], **base}
        _attention_compare(run, one, f"head {i}, query 0 alone")


# ---------------------------------------------------------------------------


#: Every property in report order, mapping its name to its check and the kinds it applies to.
PROPERTIES: dict[str, tuple[Callable[[Target, _Run], None], tuple[str, ...]]] = {
    "values": (_p_values, ("softmax", "entropy", "adaptive_softmax")),
    "long_rows": (_p_long_rows, ("softmax", "entropy", "adaptive_softmax")),
    "million_row": (_p_million_row, ("softmax", "entropy", "adaptive_softmax")),
    "branch_points": (_p_branch_points, ("entropy", "adaptive_softmax")),
    "batch_independence": (_p_batch_independence, ("softmax", "entropy", "adaptive_softmax")),
    "dtype_shape": (_p_dtype_shape, ("softmax", "entropy", "adaptive_softmax")),
    "special_values": (_p_special_values, ("softmax", "entropy", "adaptive_softmax")),
    "invariances": (_p_invariances, ("softmax", "entropy", "adaptive_softmax")),
    "temperature_cap": (_p_temperature_cap, ("adaptive_softmax",)),
    "schedules": (_p_schedules, ("adaptive_softmax",)),
    "attention_values": (_p_attention_values, ("attention",)),
    "attention_batch": (_p_attention_batch, ("attention",)),
    "attention_masks": (_p_attention_masks, ("attention",)),
    "attention_causal": (_p_attention_causal, ("attention",)),
}


def properties_for(kind: str) -> list[str]:
    """The properties that apply to a kind, in report order."""
    return [name for name, (_, kinds) in PROPERTIES.items() if kind in kinds]


def run_property(name: str, target: Target) -> PropertyResult:
    """Run one property on `target` and return its verdict (never raises for a kernel defect).

    A kernel that raises ``SystemExit`` (calls ``sys.exit``) fails the
    property. A property that cannot run on this kernel is skipped, or fails
    when ``target.strict``.
    """
    fn, kinds = PROPERTIES[name]
    if target.kind not in kinds:
        return PropertyResult(name, "skip", message=f"not a property of kind {target.kind}")
    run = _Run(target)
    try:
        with np.errstate(all="ignore"):
            fn(target, run)
    except SystemExit as exc:
        return PropertyResult(
            name, "fail", run.max_ulp, run.checks,
            f"the kernel raised SystemExit({exc.code!r}) (it called sys.exit): a kernel must "
            "return its result",
        )  # fmt: skip
    except _Skip as exc:
        if target.strict:
            return PropertyResult(
                name, "fail", run.max_ulp, run.checks, f"skipped, a failure under strict: {exc}"
            )
        return PropertyResult(name, "skip", run.max_ulp, run.checks, str(exc))
    except _Note as exc:
        return PropertyResult(name, "pass", run.max_ulp, run.checks, f"note: {exc}")
    except _Failed as exc:
        return PropertyResult(name, "fail", run.max_ulp, run.checks, exc.message)
    return PropertyResult(name, "pass", run.max_ulp, run.checks)


def run_conformance(
    target: Target, only: list[str] | None = None, progress: Callable[[str], None] | None = None
) -> list[PropertyResult]:
    """Run every property of `target`'s kind (or those named in `only`)."""
    results = []
    for name in properties_for(target.kind):
        if only and name not in only:
            continue
        res = run_property(name, target)
        if progress is not None:
            progress(res.line())
        results.append(res)
    return results


# ---------------------------------------------------------------------------
# pytest entry points (``pytest --pyargs softmaxtheory.conformance --softmax-kernel ...``)
# ---------------------------------------------------------------------------


def _pytest_check(target: Target, name: str, config: Any = None) -> None:
    import pytest

    __tracebackhide__ = True
    if target.kind not in PROPERTIES[name][1]:
        pytest.skip(f"{name} is not a property of kind {target.kind}")
    res = None
    if config is not None:
        from .pytest_plugin import conformance_result

        res = conformance_result(config, name)  # from the child process
    if res is None:
        res = run_property(name, target)
    if res.status == "skip":
        pytest.skip(res.message)
    if res.status == "fail":
        pytest.fail(f"{name}: {res.message.removeprefix(_STOPPED)}", pytrace=False)


def _make_test(name: str) -> Callable[..., None]:
    def test(softmax_conformance_target: Target, pytestconfig: Any) -> None:
        __tracebackhide__ = True
        _pytest_check(softmax_conformance_target, name, pytestconfig)

    test.__name__ = f"test_{name}"
    test.__doc__ = PROPERTIES[name][0].__doc__
    return test


for _name in PROPERTIES:
    globals()[f"test_{_name}"] = _make_test(_name)
del _name
