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

__all__ = ["EXPERIMENTS", "add_parser", "run"]

#: experiment name on the command line -> (module in softmaxtheory.experiments, help line)
EXPERIMENTS: dict[str, tuple[str, str]] = {
    "max-retrieval": (
        "max_retrieval",
        "train the paper's single-head max-retrieval model and evaluate it on larger sets",
    ),
    "minilm-spread": (
        "minilm",
        "measure the logit spread of every attention head of all-MiniLM-L6-v2",
    ),
}


def _module(name: str) -> Any:
    return importlib.import_module(f"softmaxtheory.experiments.{EXPERIMENTS[name][0]}")


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Register the ``reproduce`` subcommand on `sub` and return its parser."""
    parser = sub.add_parser(
        "reproduce",
        help="rerun the paper's experiments (needs the experiments extra)",
        description=(
            "Rerun an experiment of the paper and print its figures beside the paper's. "
            "Needs: pip install 'softmaxtheory[experiments]'."
        ),
    )
    exp = parser.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")
    for name, (_, help_line) in EXPERIMENTS.items():
        sp = exp.add_parser(name, help=help_line, description=help_line)
        _module(name).add_arguments(sp)
    return parser


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run the experiment named by ``args.experiment``; return the exit status."""
    return int(_module(args.experiment).main(args))
