"""The ``softmaxtheory`` command line.

Each subcommand lives in its own module of this package
(``softmaxtheory.cli.<name>``) with an ``add_parser(subparsers)`` and a
``run(args, parser)``; :data:`COMMANDS` lists them in the order ``--help``
shows them.

``softmaxtheory reference``
    Evaluate the certified reference on logits given on the command line or in
    a ``.npy`` file; print n, H, β and the correctly rounded coefficients.
``softmaxtheory bounds``
    Print the dispersion limits (T1, T2, T3, T6) for a logit spread, or for the
    spread measured in a ``.npy`` of logits (``--json``, ``--plot`` too).
``softmaxtheory check``
    Run the conformance suite on a kernel (``module:function``) in a child
    process and print one line per property, with the largest error measured.
``softmaxtheory bench``
    Time the backends and print a table (``--json`` too).
``softmaxtheory reproduce``
    Rerun the paper's experiments (the ``experiments`` extra).
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import re
import sys
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from .. import __version__
from ..spec import Constant, LogLength, PaperPolynomial, Polynomial, Schedule

__all__ = [
    "COMMANDS",
    "CommandParser",
    "build_parser",
    "check_output_file",
    "load_npy",
    "main",
    "parse_float",
    "parse_nonzero_float",
    "parse_schedule",
    "plural",
]

#: The subcommands, each implemented by the module ``softmaxtheory.cli.<name>``.
COMMANDS: tuple[str, ...] = ("reference", "bounds", "check", "bench", "reproduce")


def parse_schedule(text: str) -> Schedule:
    """Parse a schedule from the command line.

    Accepted forms: ``paper``, ``constant:BETA``, ``loglength:S`` and
    ``poly:CK,...,C1,C0[@THRESHOLD]`` (coefficients highest degree first, exact
    decimals).

    Examples
    --------
    >>> from softmaxtheory.cli import parse_schedule
    >>> parse_schedule("constant:2")
    Constant(beta='2')
    >>> parse_schedule("poly:1,0.5@0.25")
    Polynomial(coefficients=('1', '0.5'), threshold='0.25')
    """
    name, _, arg = text.partition(":")
    name = name.strip().lower()
    try:
        if name == "paper" and not arg:
            return PaperPolynomial()
        if name == "constant" and arg:
            return Constant(arg)
        if name == "loglength" and arg:
            return LogLength(arg)
        if name == "poly" and arg:
            coeffs, at, threshold = arg.partition("@")
            if at and not threshold.strip():
                raise ValueError("the threshold after '@' is missing")
            parts = tuple(c.strip() for c in coeffs.split(","))
            return Polynomial(parts, threshold.strip() or "0.5")
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(f"bad schedule {text!r}: {exc}") from exc
    raise argparse.ArgumentTypeError(
        f"bad schedule {text!r}: use paper, constant:BETA, loglength:S or "
        "poly:CK,...,C1,C0[@THETA] (highest degree first)"
    )


def parse_float(text: str) -> float:
    """Parse a float for argparse, with a clear message for bad text.

    A finite decimal beyond the float64 range is refused: read as ``inf`` it became
    another input (``reference -- 1e400 0``, a row whose softmax is ``[1, 0]``, answered
    NaN as a row holding ``+inf``). ``inf`` itself, spelled so, is taken.
    """
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from exc
    if math.isinf(value) and text.strip().lstrip("+-").lower() not in ("inf", "infinity"):
        raise argparse.ArgumentTypeError(
            f"{text!r} lies beyond the float64 range (its largest value is about 1.8e308)"
        )
    return value


def parse_nonzero_float(text: str) -> float:
    """:func:`parse_float`, refusing a nonzero decimal that rounds to 0 (it changes a mode).

    ``--entropy-eps 1e-400`` became 0.0: the exact entropy, not the guarded one asked for.
    """
    value = parse_float(text)
    if value == 0.0:
        try:
            zero = Decimal(text.strip()) == 0
        except ArithmeticError:
            zero = True
        if not zero:
            raise argparse.ArgumentTypeError(
                f"{text!r} rounds to 0 in float64 (below about 5e-324), which means another mode"
            )
    return value


def _is_number(word: str) -> bool:
    """Whether `word` reads as a float (``-1e308``, ``-inf``, ``-nan``)."""
    try:
        float(word)
    except ValueError:
        return False
    return True


#: A word argparse should read as a negative number: decimals, exponents, inf and nan.
_NEGATIVE_NUMBER = re.compile(
    r"^-(?:\d+\.?\d*(?:e[-+]?\d+)?|\.\d+(?:e[-+]?\d+)?|inf|infinity|nan)$", re.IGNORECASE
)


class CommandParser(argparse.ArgumentParser):
    """The parser of every subcommand: no abbreviated options, one-line errors.

    Options are never abbreviated (``--n`` is not ``--npy``), and a usage
    error prints one line, ``PROG: error: MESSAGE (see PROG --help)``, on
    stderr and exits with status 2. Subparsers inherit both (argparse builds
    them with the parent's class).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        # argparse takes only -2 and -2.5 for negative numbers: -1e308, -inf and -nan
        # were options ("argument --beta: expected one argument"). No option of ours
        # looks like a number, so such words are values (argparse reads this attribute)
        self._negative_number_matcher = _NEGATIVE_NUMBER

    def error(self, message: str) -> Any:  # type: ignore[override]
        """Print one line on stderr and exit with status 2.

        argparse reads ``-1e308`` or ``-inf`` as an option (only plain negative
        numbers such as ``-2`` pass as values); when an unrecognized argument is such
        a number, the line says to put it after ``--``.
        """
        text = " ".join(str(message).split())
        if text.startswith("unrecognized arguments:") and any(
            word.startswith("-") and _is_number(word) for word in text.split(":", 1)[1].split()
        ):
            text += "; numbers that start with '-' go after '--', as in: reference -- -inf 0 1"
        self.exit(2, f"{self.prog}: error: {text} (see {self.prog} --help)\n")


def check_output_file(path: str, option: str, parser: argparse.ArgumentParser) -> None:
    """Refuse an output file that cannot be written, before any work is done.

    A usage error (exit 2) when `path` is a directory, its folder does not exist,
    or neither the folder nor an existing file may be written: found only after the
    work, such a path lost every result to a traceback.
    """
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        parser.error(f"{option} must name a file, got the directory {path!r}")
    if not os.path.isdir(folder):
        parser.error(f"{option}: the folder {folder!r} does not exist")
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        parser.error(f"{option}: {path!r} is not writable")


def plural(n: int, word: str) -> str:
    """``"1 row"``, ``"2 rows"``, ``"2 properties"``: `n` and `word` in its number."""
    if n == 1:
        return f"1 {word}"
    return f"{n} {word[:-1] + 'ies' if word.endswith('y') else word + 's'}"


#: The first bytes of a ``.npy`` file and of a ``.npz`` (zip) archive.
_NPY_MAGIC, _ZIP_MAGIC = b"\x93NUMPY", b"PK\x03\x04"


def load_npy(path: str, parser: argparse.ArgumentParser) -> Any:
    """Read one array from a ``.npy`` file, or stop with a one-line usage error.

    Returns a :class:`numpy.ndarray` with at least one axis.

    An ``.npz`` archive, an empty or truncated file, a file that is no
    ``.npy`` at all, a pickled object array or a 0-d array is refused with a
    message naming the file (exit status 2).
    """
    import numpy as np

    try:
        with open(path, "rb") as f:
            head = f.read(len(_NPY_MAGIC))
        if head and not head.startswith((_NPY_MAGIC, _ZIP_MAGIC)):
            # (np.load would try it as a pickle and say it holds pickled data)
            parser.error(
                f"{path} is not a .npy file (it lacks the .npy header); write it with np.save"
            )
        arr = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        parser.error(f"cannot read {path}: {exc or type(exc).__name__}")
    if not isinstance(arr, np.ndarray):  # an .npz archive holds several arrays
        close = getattr(arr, "close", None)
        if close is not None:
            close()
        parser.error(f"{path} is not a .npy file of one array (an .npz archive?); use np.save")
    if arr.ndim == 0:
        parser.error(f"{path} holds a 0-d array; logits need shape (..., n)")
    return arr


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The ``softmaxtheory`` parser and the parser of each subcommand, by name.

    Builds every subcommand's options (``add_parser`` of each module of
    :data:`COMMANDS`) without running anything; the experiments' modules are
    not imported.
    """
    parser = CommandParser(
        prog="softmaxtheory",
        description="Softmax dispersion and adaptive temperature, certified.",
    )
    parser.add_argument("--version", action="version", version=f"softmaxtheory {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    parsers = {}
    for name in COMMANDS:
        parsers[name] = _command_module(name).add_parser(sub)
    return parser, parsers


def _command_module(name: str) -> Any:
    return importlib.import_module(f".{name}", __package__)


class _OutputError(Exception):
    """The command's output could not be written (a full disk, a closed stdout)."""


class _Output:
    """``sys.stdout`` while a command runs: a write that fails raises :class:`_OutputError`.

    So that a failure to write is told apart from an ``OSError`` of the command's own
    work (reading an input file, which the commands report themselves).
    """

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def _call(self, name: str, *args: Any) -> Any:
        if self.stream is None:
            raise _OutputError("standard output is closed")
        try:
            return getattr(self.stream, name)(*args)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise _OutputError(exc.strerror or str(exc)) from exc
        except ValueError as exc:  # closed by the code the command ran (a checked kernel)
            if getattr(self.stream, "closed", False):
                raise _OutputError("standard output is closed") from exc
            raise

    def write(self, text: str) -> int:
        return self._call("write", text)

    def flush(self) -> None:
        self._call("flush")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status.

    Usage errors exit with status 2 and one line on stderr. When the reader of
    the output goes away (``softmaxtheory reference ... | head``), the command
    stops quietly, as the Python documentation recommends for SIGPIPE: the
    rest of the output goes to ``os.devnull`` and the status is 1. When the
    output cannot be written (a full disk, a closed stdout) the command stops
    with one line on stderr and status 1.
    """
    parser, subparsers = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # the command's parser says so, and points to the command's help
        subparsers[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    stream = sys.stdout
    sys.stdout = _Output(stream)
    try:
        code = int(_command_module(args.command).run(args, subparsers[args.command]))
        sys.stdout.flush()
    except BrokenPipeError:
        _silence_stdout()
        return 1
    except _OutputError as exc:
        _silence_stdout()
        print(f"softmaxtheory {args.command}: error: cannot write the output: {exc}",
              file=sys.stderr)  # fmt: skip
        return 1
    finally:
        sys.stdout = stream
    return code


def _silence_stdout() -> None:
    """Point stdout at ``os.devnull`` so that the interpreter's final flush cannot fail."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (captured output)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
