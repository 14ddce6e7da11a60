"""``softmaxtheory reproduce``: rerun the paper's experiments.

Each experiment is a module of :mod:`softmaxtheory.experiments` listed in
:data:`EXPERIMENTS`, with an ``add_arguments(parser)`` and a ``main(args) -> int``.
Those modules import torch and the model packages only when they run, so
``softmaxtheory --help`` works without the ``experiments`` extra.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

__all__ = ["EXPERIMENTS", "add_parser", "experiment_parser", "run"]

#: experiment name on the command line -> (module in softmaxtheory.experiments, help line)
EXPERIMENTS: dict[str, tuple[str, str]] = {
    "max-retrieval": (
        "max_retrieval",
        "train the paper's single-head max-retrieval model and evaluate it on larger sets",
    ),
    "clrs-text": (
        "clrs_text",
        "train small transformers on CLRS-Text with and without the adaptive temperature",
    ),
    "minilm-spread": (
        "minilm",
        "measure the logit spread of every attention head of all-MiniLM-L6-v2",
    ),
}


def _module(name: str) -> Any:
    return importlib.import_module(f"softmaxtheory.experiments.{EXPERIMENTS[name][0]}")


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Register the ``reproduce`` subcommand on `sub` and return its parser.

    The experiment modules are not imported here, only when one runs: building
    the command line for ``softmaxtheory check`` must not load them (Hypothesis
    draws on the numeric constants of every local module loaded, so an import
    would change the examples ``check`` tries).
    """
    listing = "\n".join(f"  {name:<15} {help_line}" for name, (_, help_line) in EXPERIMENTS.items())
    parser = sub.add_parser(
        "reproduce",
        help="rerun the paper's experiments (needs the experiments extra)",
        usage="%(prog)s [-h] EXPERIMENT [options ...]",
        description=(
            "Rerun an experiment of the paper and print its figures beside the paper's.\n"
            "Needs: pip install 'softmaxtheory[experiments]'."
        ),
        epilog=f"experiments:\n{listing}\n\n'softmaxtheory reproduce EXPERIMENT --help' "
        "lists the options of one experiment.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(  # optional to argparse only: run() names the choices when it is missing
        "experiment",
        nargs="?",
        choices=tuple(EXPERIMENTS),
        metavar="EXPERIMENT",
        help="the experiment to run",
    )
    parser.add_argument(
        "options", nargs=argparse.REMAINDER, help="the experiment's own options (see its --help)"
    )
    return parser


def experiment_parser(name: str) -> argparse.ArgumentParser:
    """The argument parser of the experiment `name` (imports its module)."""
    from . import CommandParser  # the other commands' parser: one-line errors, no abbreviations

    help_line = EXPERIMENTS[name][1]
    parser = CommandParser(
        prog=f"softmaxtheory reproduce {name}", description=help_line[0].upper() + help_line[1:]
    )
    _module(name).add_arguments(parser)
    return parser


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run the experiment named by ``args.experiment``; return the exit status."""
    if args.experiment is None:  # argparse said "required: EXPERIMENT, options" (options are not)
        parser.error(f"name the experiment to run: one of {', '.join(EXPERIMENTS)}")
    options = experiment_parser(args.experiment).parse_args(args.options)
    return int(_module(args.experiment).main(options))
