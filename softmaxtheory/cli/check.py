"""``softmaxtheory check``: run the conformance suite on a user's kernel.

Exit status 0 when the kernel conforms, 1 when a property fails (or the kernel
exits, crashes or times out), 2 for usage errors (bad import path, unknown
kind, bad option value, kernel not callable, missing package).

By default the kernel runs in a child process, a fresh interpreter
(``python -m softmaxtheory check ... --in-process``, never a fork: Numba's
and OpenMP's thread pools are not fork-safe), which streams one JSON line per
event back over its standard output: ``loaded``, then ``start`` and ``result``
for each property, then ``done`` (``loading`` comes first, and ``usage`` reports a usage
error). The kernel's
own prints go to the standard error. The parent enforces the per-property time
limit (``--timeout``), so a kernel that calls ``sys.exit`` or ``os._exit``,
raises ``KeyboardInterrupt``, hangs or aborts fails the property that was
running, named, and the remaining properties run in a new child.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from softmaxtheory._check.report import STOPPED
from softmaxtheory._formats import DTYPES, FRAMEWORKS, KINDS, default_dtype

from . import parse_float, parse_schedule, plural

__all__ = ["DEFAULT_TIMEOUT", "IsolatedRun", "add_parser", "run", "run_isolated", "verdict"]

#: Seconds a property may run before it fails as timed out (ten times this with --thorough).
DEFAULT_TIMEOUT = 300.0
#: After this many timeouts the remaining properties are not run (a kernel that hangs on
#: every call would otherwise cost the limit once per property).
_MAX_TIMEOUTS = 2
#: Seconds a child may take to start (import numpy, Hypothesis, mpmath) before the kernel.
_STARTUP = 120.0


def _eps(text: str) -> float:
    value = parse_float(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from exc
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return value


def _seconds(text: str) -> float:
    value = parse_float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text!r}")
    return value


def _schedule_text(text: str) -> str:
    parse_schedule(text)  # validated here, parsed again where the kernel runs
    return text


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Register the ``check`` subcommand on `sub` and return its parser."""
    p = sub.add_parser(
        "check",
        help="check a kernel against the certified reference",
        description=(
            "Check KERNEL (pkg.mod:func, imported from the current folder first, as python -m "
            "does) against the certified reference: values in ulps of the kernel's dtype, long "
            "rows, batch independence, dtype and shape, the special-value table, invariances, "
            "the temperature cap, schedules; for attention: masks and causal. The kernel runs "
            "in a child process with a time limit per property. Exit 0 when it conforms, 1 "
            "when not (a property fails, or the kernel exits, crashes or times out), 2 for "
            "usage errors."
        ),
    )
    p.add_argument("kernel", metavar="KERNEL", help="the kernel, as pkg.mod:func")
    p.add_argument(
        "--kind",
        choices=KINDS,
        default="softmax",
        help="what the kernel computes (default softmax)",
    )
    p.add_argument(
        "--framework",
        choices=FRAMEWORKS,
        default="numpy",
        help="what the kernel takes and returns: numpy arrays (default) or torch tensors",
    )
    p.add_argument("--device", default="cpu", help="cpu or cuda (torch only)")
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        default=None,
        help="input dtype (default float64 for numpy, float32 for torch)",
    )
    p.add_argument("--entropy-eps", type=_eps, default=0.0, metavar="E",
                   help="the kernel's entropy guard, >= 0 (1e-9: the paper's listing)")  # fmt: skip
    p.add_argument(
        "--schedule",
        type=_schedule_text,
        default=None,
        metavar="SPEC",
        help="schedule the kernel implements: paper (default), constant:BETA, loglength:S, "
        "poly:CK,...,C1,C0[@THETA] (highest degree first; kinds adaptive_softmax and attention)",
    )
    p.add_argument(
        "--kwarg",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra keyword argument for every call (e.g. axis=-1); repeatable",
    )
    p.add_argument("--thorough", action="store_true", help="explore ten times more examples")
    p.add_argument("--examples", type=_positive_int, default=None, metavar="N",
                   help="examples per Hypothesis property (overrides the budget)")  # fmt: skip
    p.add_argument("--only", action="append", metavar="PROPERTY", help="run only this property")
    p.add_argument(
        "--strict",
        action="store_true",
        help="a property that cannot run on the kernel fails instead of being skipped; "
        "16-bit kernels are held to float32-grade statistics",
    )
    p.add_argument(
        "--timeout",
        type=_seconds,
        default=None,
        metavar="S",
        help=f"seconds a property may run before it fails as timed out (default "
        f"{DEFAULT_TIMEOUT:g}, {10 * DEFAULT_TIMEOUT:g} with --thorough)",
    )
    p.add_argument(
        "--in-process",
        action="store_true",
        help="run the kernel in this process (for a debugger): no protection against a kernel "
        "that exits, crashes or hangs, and no --timeout",
    )
    p.add_argument("--protocol", action="store_true", help=argparse.SUPPRESS)
    return p


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Validate the options, run the suite (in a child process), print the report.

    Returns the exit status: 0 conforms, 1 does not, 2 usage error.
    """
    try:
        from .. import conformance as conf
        from .._check.properties import name_width
    except ImportError as exc:  # hypothesis missing
        print(f"softmaxtheory check: {exc}; pip install 'softmaxtheory[check]'", file=sys.stderr)
        return 2
    if args.timeout is not None and args.in_process and not args.protocol:
        parser.error("--timeout needs the child process: drop --in-process")
    dtype = args.dtype or default_dtype(args.framework)
    if args.schedule is not None and args.kind in ("softmax", "entropy"):
        return _usage_error(
            f"--schedule does not apply to kind {args.kind} (a softmax is checked at beta = 1, "
            "an entropy needs none): give --kind adaptive_softmax or attention"
        )
    if args.entropy_eps and args.kind == "softmax":
        return _usage_error("--entropy-eps does not apply to kind softmax, which takes no entropy")
    args.schedule = args.schedule or "paper"
    try:
        conf.check_options(
            kind=args.kind, framework=args.framework, device=args.device, dtype=dtype,
            entropy_eps=args.entropy_eps, examples=args.examples,
        )  # fmt: skip
        for text in args.kwarg:  # validated here, parsed again where the kernel runs
            conf.parse_kwarg(text)
        names = conf.properties_for(args.kind)
        if args.only:
            unknown = sorted(set(args.only) - set(names))
            if unknown:
                raise conf.ConformanceUsageError(
                    f"unknown properties for kind {args.kind}: {', '.join(unknown)} "
                    f"(known: {', '.join(names)})"
                )
            names = [n for n in names if n in args.only]
    except (conf.ConformanceUsageError, ValueError) as exc:
        return _usage_error(str(exc))
    if args.protocol:
        return _child(args, dtype, names)
    out = sys.stdout

    def header() -> None:
        out.write(_header(args, dtype))
        out.flush()

    def write_line(text: str) -> None:
        out.write(text.rstrip() + "\n")
        out.flush()

    start = time.perf_counter()
    if args.in_process:
        try:
            target = _target(args, dtype)
        except (conf.ConformanceUsageError, ValueError) as exc:
            return _usage_error(str(exc))
        header()
        first_call = _first_call(target)
        results = conf.run_conformance(target, only=names, progress=write_line)
        broken = None
    else:
        timeout = args.timeout or (10 * DEFAULT_TIMEOUT if args.thorough else DEFAULT_TIMEOUT)
        width = name_width(args.kind)  # the name column of the kind's report
        try:
            with _terminate_as_exit():
                outcome = run_isolated(
                    _child_argv(args, dtype), names, timeout,
                    progress=lambda res: write_line(res.line(width)), loaded=header,
                )  # fmt: skip
        except KeyboardInterrupt:
            print("softmaxtheory check: interrupted", file=sys.stderr)
            return 130
        if outcome.usage is not None:
            return _usage_error(outcome.usage)
        results, broken, first_call = outcome.results, outcome.broken, outcome.first_call
        if broken is not None:
            header()
    elapsed = time.perf_counter() - start
    notes = [r for r in results if r.status == "pass" and r.message]
    for r in notes:
        out.write(f"\n{r.name}: {r.message}\n")
    for r in results:
        if r.status == "fail":
            what = "stopped" if r.message.startswith(STOPPED) else "counterexample"
            message = r.message.removeprefix(STOPPED)
            out.write(f"\n=== {r.name}: {what} ===\n{message}\n")
    if broken is not None:
        out.write(f"\n{broken}\n")
        text = "DOES NOT CONFORM (the kernel could not be loaded)"
    else:
        text = verdict(results)
    timing = f"{elapsed:.1f} s"
    if first_call is not None and first_call >= 0.5:
        timing += f"; the kernel's first call (compilation) took {first_call:.1f} s of it"
    out.write(f"\n{args.kernel}: {text} [{timing}]\n")
    out.flush()
    failed = broken is not None or any(r.status == "fail" for r in results)
    return 1 if failed else 0


def _first_call(target: Any) -> float | None:
    """Time the kernel's first call on a tiny input (imports, JIT compilation).

    Returns the seconds, or None when that call raises (the properties report it).
    """
    import numpy as np

    from .. import strategies as strat

    start = time.perf_counter()
    try:
        with np.errstate(all="ignore"):
            if target.kind == "attention":
                a = strat.cast(np.array([[0.5, -1.0], [1.0, 0.25]]), target.dtype)
                target.call_attention(a, a, a, None, False)
            else:
                target.call(strat.cast(np.array([[0.0, 1.0, 2.0]]), target.dtype))
    except BaseException:  # the properties report it (run_check: any BaseException)
        return None
    return time.perf_counter() - start


def _usage_error(message: str) -> int:
    """One line on stderr, as the parser's own usage errors write it; exit status 2."""
    print(
        f"softmaxtheory check: error: {message} (see softmaxtheory check --help)", file=sys.stderr
    )
    return 2


def verdict(results: Sequence[Any]) -> str:
    """Word the verdict, ``CONFORMS`` or ``DOES NOT CONFORM``, naming failed and skipped ones.

    Examples
    --------
    >>> from softmaxtheory.conformance import PropertyResult as R
    >>> verdict([R("values", "pass"), R("attention_masks", "skip"), R("attention_causal", "skip")])
    'CONFORMS (2 properties skipped: attention_masks, attention_causal)'
    >>> verdict([R("values", "fail"), R("schedules", "skip")])
    'DOES NOT CONFORM (1 property failed: values; 1 property skipped: schedules)'
    """
    failed = [r.name for r in results if r.status == "fail"]
    skipped = [r.name for r in results if r.status == "skip"]
    parts = []
    if failed:
        parts.append(f"{plural(len(failed), 'property')} failed: {', '.join(failed)}")
    if skipped:
        parts.append(f"{plural(len(skipped), 'property')} skipped: {', '.join(skipped)}")
    head = "DOES NOT CONFORM" if failed else "CONFORMS"
    return f"{head} ({'; '.join(parts)})" if parts else head


def _target(args: argparse.Namespace, dtype: str) -> Any:
    from .. import conformance as conf

    return conf.target_from_options(
        args.kernel, kind=args.kind, framework=args.framework, device=args.device,
        dtype=dtype, entropy_eps=args.entropy_eps, schedule=args.schedule,
        thorough=args.thorough, examples=args.examples, kwargs=args.kwarg, strict=args.strict,
    )  # fmt: skip


def _child_argv(args: argparse.Namespace, dtype: str) -> list[str]:
    """The options of this run, for the child (``--only`` and the mode flags aside)."""
    argv = [
        args.kernel, "--kind", args.kind, "--framework", args.framework, "--device",
        args.device, "--dtype", dtype,
    ]  # fmt: skip
    if args.kind != "softmax":  # the options a kind takes (the parent refused the others)
        argv += ["--entropy-eps", repr(float(args.entropy_eps))]
    if args.kind not in ("softmax", "entropy"):
        argv += ["--schedule", args.schedule]
    for text in args.kwarg:
        argv += ["--kwarg", text]
    if args.thorough:
        argv.append("--thorough")
    if args.examples is not None:
        argv += ["--examples", str(args.examples)]
    if args.strict:
        argv.append("--strict")
    return argv


# ---------------------------------------------------------------------------
# the child: run the properties, stream one JSON line per event
# ---------------------------------------------------------------------------


def _child(args: argparse.Namespace, dtype: str, names: list[str]) -> int:
    from .. import conformance as conf

    sys.stdout.flush()
    channel = os.fdopen(os.dup(1), "w", encoding="utf-8")
    # the parent holds this process's standard input open: when the parent dies (killed by
    # a CI runner), it closes and this process ends instead of running on, orphaned
    threading.Thread(target=_exit_when_orphaned, daemon=True).start()
    os.dup2(2, 1)  # the kernel's prints go to the standard error, never into the channel

    def emit(**event: Any) -> None:
        channel.write(json.dumps(event) + "\n")
        channel.flush()

    emit(event="loading")  # the time limit starts now, not while this interpreter starts
    try:
        target = _target(args, dtype)
    except (conf.ConformanceUsageError, ValueError) as exc:
        emit(event="usage", message=str(exc))
        return 2
    emit(event="loaded")
    for i, name in enumerate(names):
        emit(event="start", name=name)
        if i == 0:  # a crash or hang in the first call is the first property's
            emit(event="first_call", seconds=_first_call(target))
        try:
            res = conf.run_property(name, target)
        except KeyboardInterrupt:  # the parent runs this child in its own session: the kernel
            res = conf.PropertyResult(name, "fail", message="the kernel raised KeyboardInterrupt")
        except Exception as exc:  # the check's own error, not the kernel's exit status 1
            import traceback

            res = conf.PropertyResult(name, "fail", message=(
                f"the check itself raised {type(exc).__name__}: {exc}, an error of "
                "softmaxtheory's, not a verdict on the kernel (please report it):\n"
                + "".join(traceback.format_exception(exc)).rstrip()
            ))  # fmt: skip
        emit(event="result", result=asdict(res))
    emit(event="done")
    channel.close()
    if getattr(sys.stdout, "closed", False):  # by the kernel: nothing of this child's is in it
        sys.stdout = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115
    return 0


@contextlib.contextmanager
def _terminate_as_exit() -> Any:
    """Turn SIGTERM into ``SystemExit(143)`` here, so that the child is killed on the way out.

    The child runs in a session of its own and ends by itself when this process's end
    closes its stdin, unless the kernel holds the GIL (a long C call) and the thread
    that watches stdin never runs: a ``timeout`` or a CI job's stop would then leave it
    running (on a GPU too). Where signals cannot be set (not the main thread, not
    POSIX) nothing changes.
    """
    if os.name != "posix" or threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _exit_when_orphaned() -> None:
    try:
        while os.read(0, 1 << 16):  # the raw descriptor: no lock held at shutdown
            pass
    except (OSError, ValueError):
        pass
    os._exit(3)


# ---------------------------------------------------------------------------
# the parent: start children, enforce the time limit, collect the results
# ---------------------------------------------------------------------------


@dataclass
class IsolatedRun:
    """What :func:`run_isolated` collected.

    Attributes
    ----------
    results : list of PropertyResult
        One per property asked for, in order.
    usage : str or None
        A usage error reported by the child (bad kernel path, ...): exit status 2.
    broken : str or None
        Why the kernel could not even be loaded (its module hung, crashed or
        ended the process while importing).
    first_call : float or None
        Seconds of the kernel's first call on a tiny input (JIT compilation).
    """

    results: list[Any] = field(default_factory=list)
    usage: str | None = None
    broken: str | None = None
    first_call: float | None = None


def _ended(rc: int) -> str:
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        cause = {"SIGABRT": " (os.abort or a failed assertion in native code)",
                 "SIGSEGV": " (a crash in native code)",
                 "SIGKILL": " (out of memory?)"}.get(name, "")  # fmt: skip
        return f"was killed by {name}{cause}"
    return f"exited with status {rc} (the kernel called os._exit or sys.exit in a thread?)"


def _kill(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        try:
            if os.name == "posix":
                os.killpg(proc.pid, signal.SIGKILL)  # the kernel's own children too
            else:  # pragma: no cover - windows
                proc.kill()
        except (ProcessLookupError, PermissionError):
            pass
    with contextlib.suppress(subprocess.TimeoutExpired):  # a process that ignores SIGKILL
        proc.wait(timeout=30)


def run_isolated(
    argv: Sequence[str],
    names: Sequence[str],
    timeout: float,
    *,
    progress: Callable[[Any], None] | None = None,
    loaded: Callable[[], None] | None = None,
    cwd: str | None = None,
    timeout_option: str = "--timeout",
) -> IsolatedRun:
    """Run properties `names` of ``softmaxtheory check ARGV`` in child processes.

    Each child is a fresh interpreter (``python -m softmaxtheory check ARGV --only ...
    --in-process``) that reports its events as JSON lines. A property that
    returns no result within `timeout` seconds, or while which the child ends,
    fails (its message starts with ``"stopped: "``); the properties after it run
    in a new child, unless two properties timed out already (then they are
    reported as skipped, not run).

    Parameters
    ----------
    argv : sequence of str
        The kernel and its options, as for ``softmaxtheory check``.
    names : sequence of str
        The properties, in report order.
    timeout : float
        Seconds for importing the kernel and for each property.
    progress : callable, optional
        Called with each :class:`~softmaxtheory.conformance.PropertyResult` as it arrives.
    loaded : callable, optional
        Called once the first child has loaded the kernel.
    cwd : str, optional
        The folder the child runs in (the kernel is imported from it first).
    timeout_option : str, default ``"--timeout"``
        The option that set `timeout`, as the messages name it.
    """
    from ..conformance import PropertyResult

    outcome = IsolatedRun()
    remaining = list(names)
    timeouts = 0
    announced = False

    def record(res: PropertyResult) -> None:
        outcome.results.append(res)
        remaining.remove(res.name)
        if progress is not None:
            progress(res)

    while remaining:
        if timeouts >= _MAX_TIMEOUTS:
            for name in list(remaining):
                record(PropertyResult(name, "skip", message="not run: two properties timed out"))
            break
        cmd = [sys.executable, "-m", "softmaxtheory", "check", *argv]
        for name in remaining:
            cmd += ["--only", name]
        cmd += ["--in-process", "--protocol"]
        proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, encoding="utf-8",
            cwd=cwd, start_new_session=os.name == "posix",
        )  # fmt: skip
        lines: queue.Queue[str | None] = queue.Queue()

        def read(stream: Any = proc.stdout, sink: queue.Queue[str | None] = lines) -> None:
            with contextlib.suppress(OSError, ValueError):
                for line in stream:
                    sink.put(line)
            sink.put(None)
            stream.close()  # here, by the one thread that reads it

        threading.Thread(target=read, daemon=True).start()
        current: str | None = None
        is_loaded = progressed = False
        # until the child starts importing the kernel it runs only this package's imports
        deadline = time.monotonic() + max(timeout, _STARTUP)
        try:
            while True:
                try:
                    line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    _kill(proc)
                    if current is None:
                        outcome.broken = (
                            f"the kernel was not loaded within {timeout:g} s ({timeout_option}): "
                            "importing its module hangs?"
                        )
                        return outcome
                    timeouts += 1
                    record(PropertyResult(
                        current, "fail",
                        message=f"{STOPPED}timed out: no result within {timeout:g} s "
                        f"({timeout_option}); the process running the kernel was stopped",
                    ))  # fmt: skip
                    break
                if line is None:  # the child closed its channel: it ends
                    try:
                        proc.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        _kill(proc)
                    how = _ended(proc.returncode)
                    if current is not None:
                        record(PropertyResult(
                            current, "fail",
                            message=f"{STOPPED}the process running the kernel {how} while "
                            "this property ran; a kernel must return its result",
                        ))  # fmt: skip
                    elif not is_loaded:
                        outcome.broken = f"the process importing the kernel {how}"
                        return outcome
                    elif not progressed:  # ended between two properties
                        for name in list(remaining):
                            record(PropertyResult(
                                name, "fail",
                                message=f"{STOPPED}the process running the kernel {how} "
                                "before this property started",
                            ))  # fmt: skip
                    break
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                kind = event.get("event")
                if kind == "usage":
                    outcome.usage = str(event.get("message"))
                    return outcome
                if kind == "loaded":
                    is_loaded = True
                    if not announced and loaded is not None:
                        loaded()
                    announced = True
                elif kind == "start":
                    current = str(event["name"])
                    progressed = True
                elif kind == "first_call" and outcome.first_call is None:
                    outcome.first_call = event.get("seconds")
                elif kind == "result":
                    record(PropertyResult(**event["result"]))
                    current = None
                elif kind == "done":
                    for name in list(remaining):  # asked for, never reported: a bug here
                        record(PropertyResult(name, "fail", message=f"{STOPPED}not reported"))
                    break
                deadline = time.monotonic() + timeout
        except BaseException:  # Ctrl-C in this process: the child (its own session) goes too
            _kill(proc)
            raise
        finally:
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
            if proc.poll() is None:
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    _kill(proc)
    return outcome


def _header(args: argparse.Namespace, dtype: str) -> str:
    import numpy as np

    from .. import __version__

    versions = f"softmaxtheory {__version__}, numpy {np.__version__}"
    if args.framework == "torch":
        import torch

        versions += f", torch {torch.__version__}"
    # the schedule and guard only where they apply, named as the failure rows name them
    what = ""
    if args.kind == "softmax":
        what = ", schedule Constant(beta=1) (plain softmax)"
    elif args.kind in ("adaptive_softmax", "attention"):
        what = f", schedule {parse_schedule(args.schedule)!r}"
    if args.kind != "softmax":
        what += f", entropy_eps {float(args.entropy_eps)!r}"
    mode = "in this process" if args.in_process else "in a child process"
    return (
        f"softmaxtheory check {args.kernel}\n"
        f"  kind {args.kind}, framework {args.framework}, device {args.device}, dtype {dtype}"
        f"{what}{', thorough' if args.thorough else ''}{', strict' if args.strict else ''}\n"
        f"  {versions}, Python {platform.python_version()}; the kernel runs {mode}\n"
        f"  errors in ulps of {dtype} against the certified reference (correctly rounded: "
        "double-double first pass, mpmath fallback)\n\n"
    )
