"""One property's run: its bookkeeping, notes, verdict and Hypothesis settings (private).

A property is a function ``check(target, run)`` that calls the kernel through
:meth:`Run.call`, compares its output with :meth:`Run.compare` and adds notes
to :attr:`Run.notes` (a tolerated convention: the property passes, with the
note). It ends in one of three ways, each explicit:

* it returns: the property passes (with its notes, if any);
* it raises :class:`Skip`: it cannot run on this kernel (a failure under
  ``strict``);
* it raises :class:`Failed` (a counterexample found by the property itself) or
  lets a :class:`~softmaxtheory.testing.KernelMismatch` through (the kernel's
  output is outside the error model; what was being checked is on the
  exception as a note, ``exc.add_note``): the property fails.

:func:`run_check` turns that into a :class:`PropertyResult`.
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import FlakyFailure
from hypothesis.reporting import with_reporter

from .. import testing as tst
from .._certify.environment import FloatEnvironmentError, default_float_environment
from ..spec import Schedule
from .errors import Failed, Skip
from .report import (
    STOPPED,
    array_literal,
    fmt_ulp,
    is_torch,
    mismatch_text,
    row_literal,
    with_schedule,
)
from .target import Target

__all__ = [
    "Failed",
    "PropertyResult",
    "Run",
    "Skip",
    "run_check",
    "run_given",
    "without_local_constants",
]


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
    notes : list of str
        What the property tolerated (a convention such as NaN for a fully
        masked row); a passing property's `message` is ``"note: "`` and these
        joined by ``"; "``.
    """

    name: str
    status: str
    max_ulp: float = 0.0
    checks: int = 0
    message: str = ""
    notes: list[str] = field(default_factory=list)

    def line(self, width: int = 20) -> str:
        """One line of the report, the property's name in a column of `width` characters.

        The report of a kind passes the width of its longest property name, so that
        the columns after it line up.
        """
        ulp = f"max {fmt_ulp(self.max_ulp)} ulp" if self.checks else ""
        tail = self.message.splitlines()[0] if self.status == "skip" and self.message else ""
        if self.status == "fail" and self.message.startswith(STOPPED):
            tail = self.message.splitlines()[0][len(STOPPED) :]
        checks = f"{self.checks:>5} {'check' if self.checks == 1 else 'checks'}"
        return f"{self.status.upper():<5} {self.name:<{width}} {ulp:<22} {checks} {tail}".rstrip()


@dataclass
class Run:
    """What one property measured: the largest error, the checks, the notes.

    Attributes
    ----------
    target : Target
        The kernel under test.
    max_ulp : float
        The largest error of any compared output, in ulps.
    checks : int
        Number of outputs compared.
    notes : list of str
        Conventions the property tolerated (reported with a pass).
    """

    target: Target
    max_ulp: float = 0.0
    checks: int = 0
    notes: list[str] = field(default_factory=list)

    def output(self, out: Any, x_desc: str) -> tuple[np.ndarray, str]:
        """The kernel's output `out` as numpy and its dtype name; :class:`Failed` if bad."""
        t = self.target
        if t.framework == "torch" and not is_torch(out):
            raise Failed(f"the kernel returned {type(out).__name__}, not a torch tensor ({x_desc})")
        if t.framework == "numpy" and not isinstance(out, (np.ndarray, np.generic)):
            # a list or None has no dtype to keep; a tensor is another framework's result
            hint = (
                ": a torch kernel is checked with --framework torch (framework='torch'), "
                "which passes it tensors"
                if is_torch(out)
                else ""
            )
            raise Failed(
                f"the kernel returned {_type_name(out)}, not a numpy array (framework numpy; "
                f"{x_desc}){hint}"
            )
        if t.framework == "torch" and out.device.type != t.device.split(":")[0]:
            raise Failed(
                f"the kernel returned a tensor on {out.device} for input on {t.device} "
                f"(device not preserved; {x_desc})"
            )
        try:
            return tst.to_numpy(out, "output")
        except TypeError as exc:
            raise Failed(f"the kernel's output cannot be checked: {exc} ({x_desc})") from exc

    def compare(
        self,
        out: Any,
        x: np.ndarray,
        *,
        schedule: Schedule | None = None,
        source: str | None = None,
        what: str = "",
        grad_mode: str | None = None,
        prelude: str | None = None,
    ) -> tst.ErrorReport:
        """Check the kernel's output `out` on logits `x` against the reference; record it.

        `grad_mode`, the :data:`~softmaxtheory._check.target.GRAD_MODES` label the call
        was made in, makes the repro call the kernel so; `prelude`, lines the repro runs
        after defining ``kernel`` (the calls the suite made before this one, where they
        matter).

        Raises
        ------
        Failed
            If the output is not an array of the input's dtype.
        KernelMismatch
            If it is outside the error model, with `what` added as a note.
        """
        t = self.target
        got, got_dtype = self.output(out, what)
        if got_dtype != t.dtype:
            raise Failed(
                f"{what}: the kernel returned dtype {got_dtype} for {t.dtype} input "
                "(dtype not preserved)"
            )
        repro = with_schedule(t.repro_in(grad_mode), schedule)
        if prelude:
            repro = f"{repro.rstrip()}\n{prelude}"
        if source is not None and "softmaxtheory.strategies" in source:
            repro = "import softmaxtheory.strategies\n" + repro
        kw: dict[str, Any] = dict(dtype=t.dtype, repro=repro, source=source, strict=t.strict)

        def check() -> tst.ErrorReport:
            if t.kind == "softmax":
                return tst.assert_softmax_close(got, x, **kw)
            if t.kind == "entropy":
                return tst.assert_entropy_close(got, x, entropy_eps=t.entropy_eps, **kw)
            return tst.assert_adaptive_softmax_close(
                got, x, schedule=schedule or t.schedule, entropy_eps=t.entropy_eps, **kw
            )

        try:
            try:
                rep = check()
            except tst.KernelMismatch:
                size = np.asarray(x).size
                if source is not None or not 4 * tst.REPRO_ITEMS < size <= WRITTEN_OUT_LIMIT:
                    raise
                # a drawn input too large for the helpers to write out without a source:
                # written out here, so that the repro runs (checked again, for its message)
                kw["source"] = array_literal(np.asarray(x), t.dtype)
                rep = check()
        except tst.KernelMismatch as exc:
            self.record(exc.report)
            if what:
                exc.add_note(what)
            raise
        self.record(rep)
        return rep

    def record(self, rep: tst.ErrorReport) -> None:
        """Count one compared output and its largest error."""
        self.checks += 1
        if rep.size:
            self.max_ulp = max(self.max_ulp, rep.max_ulp)

    def call(self, x: np.ndarray, **kw: Any) -> Any:
        """Call the kernel on `x` (see :meth:`Target.call`); :class:`Failed` if it raises."""
        try:
            return self.target.call(x, **kw)
        except Failed:
            raise
        except Exception as exc:
            raise Failed(
                f"the kernel raised {type(exc).__name__}: {exc}\non input of shape {x.shape}, "
                f"dtype {self.target.dtype}{_input_text(x, self.target.dtype)}"
                f"\n{''.join(traceback.format_exception_only(exc)).strip()}"
            ) from exc

    def result(self, name: str, status: str, message: str = "") -> PropertyResult:
        """The :class:`PropertyResult` of this run."""
        return PropertyResult(name, status, self.max_ulp, self.checks, message, list(self.notes))


#: Inputs up to this many values are written out whole in a failure message.
LITERAL_LIMIT = 64

#: A failing input of the suite that has no source text (drawn by Hypothesis) is written
#: out in its repro up to this many values; above, the repro names ``<your x>``.
WRITTEN_OUT_LIMIT = 16384


def _input_text(x: np.ndarray, dtype: str) -> str:
    """``:`` and source text that rebuilds `x` (its shape kept), or its first values, said so."""
    if x.size <= LITERAL_LIMIT:
        return f":\n{array_literal(x, dtype)}"
    return (
        f"; its first {LITERAL_LIMIT} of {x.size} values, flattened (not a repro):\n"
        f"{row_literal(x.ravel()[:LITERAL_LIMIT], dtype)}"
    )


def _type_name(obj: Any) -> str:
    """``None``, or the qualified type name of `obj` (``torch.Tensor``, ``list``)."""
    if obj is None:
        return "None"
    cls = type(obj)
    mod = cls.__module__.split(".")[0]
    return cls.__name__ if mod == "builtins" else f"{mod}.{cls.__name__}"


def run_check(name: str, check: Callable[[Target, Run], None], target: Target) -> PropertyResult:
    """Run property `name` (the function `check`) on `target` and return its verdict.

    Never raises for a kernel defect: a kernel that raises ``SystemExit``, or any
    ``BaseException`` that is not an ``Exception`` (``KeyboardInterrupt`` aside),
    fails the property; :class:`Skip` skips it (fails it under ``strict``);
    :class:`Failed` and :class:`~softmaxtheory.testing.KernelMismatch` fail it,
    and so does a thread whose floating-point environment is not IEEE's default
    and cannot be set (:class:`~softmaxtheory.reference.FloatEnvironmentError`).
    The property runs in the default environment (gradual underflow, rounding
    to nearest), whatever the caller's; the caller's is restored after it.
    A property that returns passes, with its notes as the message.
    """
    run = Run(target)
    try:
        # before any draw: Hypothesis itself refuses to draw subnormals in a flushing thread
        with default_float_environment("the check"), np.errstate(all="ignore"):
            check(target, run)
    except SystemExit as exc:
        return run.result(name, "fail", _exit_text(exc))
    except (KeyboardInterrupt, GeneratorExit):
        raise
    except Skip as exc:
        if target.strict:
            return run.result(name, "fail", f"skipped, a failure under strict: {exc}")
        return run.result(name, "skip", str(exc))
    except Failed as exc:
        return run.result(name, "fail", str(exc))
    except FloatEnvironmentError as exc:  # a flushing thread where the default cannot be set
        return run.result(name, "fail", f"{exc}; nothing the kernel returns can be checked here")
    except tst.KernelMismatch as exc:
        return run.result(name, "fail", mismatch_text(exc, target.dtype))
    except Exception:
        raise  # the check's own error (a kernel's exceptions are the properties' to report)
    except BaseException as exc:  # from the kernel where no call of the target wrapped it
        return run.result(name, "fail", (
            f"the kernel raised {type(exc).__module__}.{type(exc).__qualname__}: {exc} (a "
            "BaseException that is not an Exception, as pytest.skip() or asyncio's "
            "CancelledError raise); a kernel must return its result"
        ))  # fmt: skip
    return run.result(name, "pass", f"note: {'; '.join(run.notes)}" if run.notes else "")


def _exit_text(exc: SystemExit) -> str:
    return (
        f"the kernel raised SystemExit({exc.code!r}) (it called sys.exit): a kernel must "
        "return its result"
    )


class _KernelExited(Failed):
    """A ``SystemExit`` from the kernel inside a Hypothesis property (which wraps it)."""


def _hyp_settings(n: int, shrink: bool) -> settings:
    """Derandomized, no database, no deadline, quiet: `n` examples, shrunk when `shrink`."""
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


def run_given(
    target: Target, strategy: st.SearchStrategy[Any], n: int, body: Callable[[Any], None]
) -> None:
    """Run `body` on `n` derandomized examples; re-raise what it raised on the counterexample.

    The counterexample is shrunk (minimised) when the target is thorough.
    Hypothesis reports nothing (the property's message has its own repro),
    and the notes it adds to the exception (the falsifying example) are
    removed: the exception leaves with the notes `body` gave it.
    """
    last: list[tuple[BaseException, list[str]]] = []
    body = _remembering_notes(body, last)

    # Derandomized Hypothesis seeds its draws from the source of `prop`, its decorators
    # included (a nested function's source does not parse alone): a change to these four
    # lines changes the examples of every property.
    @_hyp_settings(n, target.thorough)
    @given(strategy)
    def prop(example: Any) -> None:
        body(example)

    with with_reporter(lambda _msg: None), without_local_constants():
        try:
            prop()  # Hypothesis re-raises the (minimal) failure; anything else is a bug here
        except FlakyFailure as exc:  # the failing example passed when Hypothesis replayed it
            first = exc.exceptions[0] if exc.exceptions else exc
            if isinstance(first, _KernelExited):  # an exit, not a wrong value: say so
                raise first from None
            if last and last[0][0] is first:
                _set_notes(first, last[0][1])
            raise Failed(_flaky_text(first, target.dtype)) from exc
        except Exception as exc:
            if last and last[0][0] is exc:
                _set_notes(exc, last[0][1])
            raise


def _flaky_text(first: BaseException, dtype: str) -> str:
    """The failure message of a property whose counterexample did not fail again.

    The property's checks are deterministic functions of the example (the
    exact value is the reference's), so a failure that does not repeat on the
    same input is the kernel's: it returned different results for equal calls.
    `first` is the failure as it was first seen.
    """
    if isinstance(first, tst.KernelMismatch):
        detail = mismatch_text(first, dtype)
    elif isinstance(first, Failed):
        detail = str(first)
    else:
        detail = "".join(traceback.format_exception_only(first)).strip()
    return (
        "the kernel is not deterministic: called again on the same input, it returned a "
        "different result (this failure did not repeat); a kernel must return the same "
        f"result for the same input. The first call:\n{detail}"
    )


def _remembering_notes(
    body: Callable[[Any], None], last: list[tuple[BaseException, list[str]]]
) -> Callable[[Any], None]:
    """Wrap `body` so that `last` holds the exception it last raised, with its notes then."""

    def remembering(example: Any) -> None:
        try:
            body(example)
        except SystemExit as exc:  # Hypothesis would wrap it and call the kernel flaky
            raise _KernelExited(_exit_text(exc)) from exc
        except Exception as exc:
            last[:] = [(exc, list(getattr(exc, "__notes__", ())))]
            raise

    return remembering


def _set_notes(exc: BaseException, notes: list[str]) -> None:
    if notes:
        exc.__notes__ = notes
    elif hasattr(exc, "__notes__"):
        del exc.__notes__


@contextlib.contextmanager
def without_local_constants() -> Iterator[None]:
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
