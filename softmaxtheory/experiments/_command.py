r"""What the experiments' commands share: options, device, output, progress, t-test (private).

The ``main`` of each training experiment (``softmaxtheory reproduce
max-retrieval``, ``... clrs-text``) parses its options with the checked
argparse types here (:func:`positive_int`, ...), stops on a usage problem with
one line on stderr and status 2 (:func:`usage_error`), checks its packages, the
device and the output folder (:func:`prepare`), names the device, shows a
:class:`Progress` bar and writes its JSON record (:func:`write_json`).

Its report compares two variants over the seeds with :func:`paired_ttest`: the
per-seed scores :math:`a_s` and :math:`b_s`, paired by seed, through the
differences :math:`d_s = a_s - b_s`:

.. math::

    t = \frac{\bar d}{s_d / \sqrt S}, \qquad
    p = 2\, \Pr\bigl(T_{S-1} \ge |t|\bigr),

with :math:`s_d` the sample standard deviation of the :math:`d_s` and
:math:`T_{S-1}` Student's distribution with :math:`S - 1` degrees of freedom.

Needs numpy at import; torch and scipy are imported by the functions that use
them.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np

__all__ = [
    "Progress",
    "UsageError",
    "add_run_options",
    "device_name",
    "finite",
    "nonnegative_int",
    "number_parser",
    "paired_ttest",
    "positive_float",
    "positive_int",
    "prepare",
    "resolve_device",
    "sizes_parser",
    "usage_error",
    "write_json",
]


def number_parser(
    convert: Callable[[str], Any], valid: Callable[[Any], bool], expected: str
) -> Callable[[str], Any]:
    """An argparse ``type=``: `convert` the text, then require `valid` (else "expected ...")."""

    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from exc
        if not valid(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return parse


#: argparse type: an integer >= 1.
positive_int = number_parser(int, lambda v: v >= 1, "a positive integer")
#: argparse type: an integer >= 0.
nonnegative_int = number_parser(int, lambda v: v >= 0, "an integer >= 0")
#: argparse type: a finite number > 0.
positive_float = number_parser(float, lambda v: math.isfinite(v) and v > 0, "a positive number")


def sizes_parser(minimum: int) -> Callable[[str], tuple[int, ...]]:
    """An argparse ``type=``: comma-separated integers ``>= minimum``, sorted, without repeats.

    Examples
    --------
    >>> sizes_parser(2)("8,4,8")
    (4, 8)
    """

    def parse(text: str) -> tuple[int, ...]:
        try:
            sizes = tuple(int(t) for t in text.split(","))
        except ValueError as exc:
            raise argparse.ArgumentTypeError(
                f"sizes must be comma-separated integers, got {text!r}"
            ) from exc
        if not sizes or min(sizes) < minimum:
            raise argparse.ArgumentTypeError(f"sizes must be integers >= {minimum}, got {text!r}")
        return tuple(sorted(set(sizes)))

    return parse


class UsageError(ValueError):
    """A problem with the command's options or environment (exit status 2)."""


def usage_error(command: str, message: str) -> int:
    """Write ``softmaxtheory reproduce COMMAND: error: MESSAGE`` on stderr; return 2."""
    sys.stderr.write(f"softmaxtheory reproduce {command}: error: {message}\n")
    return 2


def resolve_device(name: str) -> Any:
    """The :class:`!torch.device` of ``--device`` `name` (``auto``: cuda when available).

    Raises
    ------
    ValueError
        For ``cuda`` when this torch has no CUDA device.
    """
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"--device cuda: CUDA is not available to this torch ({torch.__version__}); "
            "use --device cpu"
        )
    return torch.device(name)


def device_name(device: Any) -> str:
    """The device as the reports show it: the GPU's name, or the CPU and its threads."""
    import torch

    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def add_run_options(parser: argparse.ArgumentParser, name: str) -> None:
    """Add the options every experiment command shares.

    They are ``--device``, ``--out`` (default ``./{name}_out``), ``--json`` and
    ``--no-progress``.
    """
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="where to run (default auto: cuda when available)",
    )
    parser.add_argument(
        "--out",
        default=f"{name}_out",
        metavar="DIR",
        help=f"folder for {name}.csv/.png/.json (default ./{name}_out)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def prepare(args: argparse.Namespace, default_out: str) -> tuple[Any, Path]:
    """Check the packages, the device and the output folder of an experiment's run.

    Returns the :class:`!torch.device` of ``args.device`` and the folder
    ``args.out`` (default `default_out`), created if missing.

    Raises
    ------
    UsageError
        When torch, scipy or matplotlib is missing, the device is unavailable
        or the folder cannot be created; the message says which.
    """
    try:
        import matplotlib  # noqa: F401
        import scipy  # noqa: F401
        import torch  # noqa: F401
    except ImportError as exc:
        raise UsageError(
            f"this experiment needs torch, scipy and matplotlib ({exc}); "
            "pip install 'softmaxtheory[experiments]'"
        ) from exc
    try:
        device = resolve_device(getattr(args, "device", "auto") or "auto")
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    out = Path(getattr(args, "out", None) or default_out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"--out {str(out)!r}: cannot create the folder ({exc.strerror or exc})"
        ) from exc
    return device, out


def finite(value: Any) -> Any:
    """`value` with every non-finite float replaced by ``None`` (JSON has no NaN), recursively.

    Examples
    --------
    >>> finite({"p": float("nan"), "acc": [0.5, float("inf")]})
    {'p': None, 'acc': [0.5, None]}
    """
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def write_json(record: dict[str, Any], path: str | Path) -> str:
    """Write `record` to `path` as indented JSON (non-finite floats as null); return the text."""
    text = json.dumps(finite(record), indent=1) + "\n"
    Path(path).write_text(text, encoding="utf-8")
    return text


def paired_ttest(adaptive: Sequence[float], baseline: Sequence[float]) -> tuple[float, str]:
    r"""Two-sided paired t-test of per-seed accuracies (:func:`scipy.stats.ttest_rel`).

    Parameters
    ----------
    adaptive, baseline : sequence of float
        One accuracy per seed, paired by seed.

    Returns
    -------
    p_value : float
        The two-sided p-value; NaN where the test is undefined.
    note : str
        Empty, or why the p-value is not the plain test's: fewer than two
        seeds (NaN), every difference zero (NaN: no difference, no variance)
        or every difference the same non-zero value (0.0: the limit
        :math:`|t| \to \infty`, which near-equal differences approach
        continuously; how many seeds a verdict needs is the caller's rule).

    Raises
    ------
    ValueError
        For sequences of different lengths or non-finite values.

    Examples
    --------
    >>> paired_ttest([0.9, 0.8], [0.9, 0.8])
    (nan, 'no difference in any seed')
    """
    a = np.asarray(adaptive, dtype=np.float64)
    b = np.asarray(baseline, dtype=np.float64)
    if a.ndim != 1 or a.shape != b.shape:
        raise ValueError(f"adaptive and baseline must be 1-d of equal length: {a.shape}, {b.shape}")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        raise ValueError("adaptive and baseline must be finite")
    if a.size < 2:
        return math.nan, "fewer than 2 seeds"
    d = a - b
    scale = max(1.0, float(np.max(np.abs(d))))
    if float(np.ptp(d)) <= 1e-12 * scale:
        if float(np.max(np.abs(d))) <= 1e-12:
            return math.nan, "no difference in any seed"
        return 0.0, "same difference in every seed"
    from scipy import stats

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        result = stats.ttest_rel(a, b)
    return float(result.pvalue), ""


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:4.1f}s"
    minutes, sec = divmod(round(seconds), 60)
    return f"{minutes}m{sec:02d}s"


class Progress:
    """A small text progress bar (no dependency).

    On a terminal it redraws one line (at most ten times a second); otherwise
    it writes one line per tenth of the work.

    Parameters
    ----------
    total : int
        Units of work.
    label : str
        Shown before the bar.
    stream : file, optional
        Defaults to ``sys.stderr``.
    enabled : bool, default True
        ``False`` writes nothing.
    """

    def __init__(
        self, total: int, label: str, *, stream: TextIO | None = None, enabled: bool = True
    ) -> None:
        self.total = max(1, int(total))
        self.label = label
        self.stream = sys.stderr if stream is None else stream
        self.enabled = enabled
        self.done = 0
        self.extra = ""
        self.start = time.perf_counter()
        self._last_draw = -1.0
        self._last_decile = -1
        try:
            self._tty = bool(self.stream.isatty())
        except (AttributeError, ValueError):
            self._tty = False

    def line(self) -> str:
        """The current progress line."""
        frac = min(1.0, self.done / self.total)
        width = 24
        filled = round(frac * width)
        elapsed = time.perf_counter() - self.start
        eta = elapsed * (1 - frac) / frac if frac >= 0.01 else math.nan
        eta_text = _duration(eta) if math.isfinite(eta) else "?"
        bar = "#" * filled + "." * (width - filled)
        text = f"{self.label} [{bar}] {100 * frac:5.1f}% {self.done}/{self.total}"
        text += f" {_duration(elapsed)} elapsed, eta {eta_text}"
        return f"{text} {self.extra}".rstrip()

    def update(self, done: int, extra: str | None = None) -> None:
        """Set the amount of work done (and an optional trailing note)."""
        self.done = done
        if extra is not None:
            self.extra = extra
        if not self.enabled:
            return
        if self._tty:
            now = time.perf_counter()
            if now - self._last_draw >= 0.1 or done >= self.total:
                self._last_draw = now
                self.stream.write("\r" + self.line() + "\x1b[K")
                self.stream.flush()
        else:
            decile = int(10 * min(1.0, done / self.total))
            if decile > self._last_decile:
                self._last_decile = decile
                self.stream.write(self.line() + "\n")
                self.stream.flush()

    def close(self) -> None:
        """Finish the line."""
        if self.enabled and self._tty:
            self.stream.write("\r" + self.line() + "\x1b[K\n")
            self.stream.flush()
