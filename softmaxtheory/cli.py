"""The ``softmaxtheory`` command line.

Each subcommand lives in its own module (``softmaxtheory._cmd_<name>``) with
an ``add_parser(subparsers)`` and a ``run(args, parser)``; :data:`COMMANDS`
lists them in the order ``--help`` shows them.

``softmaxtheory reference``
    Evaluate the certified reference on logits given on the command line or in
    a ``.npy`` file; print n, H, β and the correctly rounded coefficients.
``softmaxtheory bench``
    Time the backends and print a table (``--json`` too).
``softmaxtheory reproduce``
    Rerun the paper's experiments (the ``experiments`` extra).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

from . import __version__
from .spec import Constant, LogLength, PaperPolynomial, Polynomial, Schedule

__all__ = ["COMMANDS", "main", "parse_float", "parse_schedule"]

#: The subcommands, each implemented by the module ``softmaxtheory._cmd_<name>``.
COMMANDS: tuple[str, ...] = ("reference", "bounds", "check", "bench", "reproduce")


def parse_schedule(text: str) -> Schedule:
    """Parse a schedule from the command line.

    Accepted forms: ``paper``, ``constant:BETA``, ``loglength:S`` and
    ``poly:C0,C1,...[@THRESHOLD]`` (coefficients highest degree first, exact
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
            coeffs, _, threshold = arg.partition("@")
            parts = tuple(c.strip() for c in coeffs.split(","))
            return Polynomial(parts, threshold.strip() or "0.5")
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(f"bad schedule {text!r}: {exc}") from exc
    raise argparse.ArgumentTypeError(
        f"bad schedule {text!r}: use paper, constant:BETA, loglength:S or poly:C0,C1,...[@THETA]"
    )


def parse_float(text: str) -> float:
    """Parse a float for argparse, with a clear message for bad text."""
    try:
        return float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from exc


def _build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(
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
    return importlib.import_module(f"._cmd_{name}", __package__)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    parser, subparsers = _build_parser()
    args = parser.parse_args(argv)
    return int(_command_module(args.command).run(args, subparsers[args.command]))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
