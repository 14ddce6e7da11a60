"""``softmaxtheory check``: run the conformance suite on a user's kernel.

Exit status 0 when the kernel conforms, 1 when a property fails, 2 for usage
errors (bad import path, unknown kind, kernel not callable, missing package).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from typing import Any

from .cli import parse_float, parse_schedule
from .spec import PaperPolynomial

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Register the ``check`` subcommand on `sub` and return its parser."""
    p = sub.add_parser(
        "check",
        help="prove a softmax / entropy / adaptive-softmax / attention kernel correct",
        description=(
            "Run the conformance suite on KERNEL (pkg.mod:func): values against the certified "
            "reference in ulps of the kernel's dtype, long rows, batch independence, dtype and "
            "shape, the special-value table, invariances, the temperature cap, schedules; for "
            "attention: masks and causal. Exit 0 when it conforms, 1 when not, 2 for usage errors."
        ),
    )
    p.add_argument("kernel", metavar="KERNEL", help="the kernel, as pkg.mod:func")
    p.add_argument(
        "--kind",
        choices=("softmax", "entropy", "adaptive_softmax", "attention"),
        default="softmax",
        help="what the kernel computes (default softmax)",
    )
    p.add_argument("--framework", choices=("numpy", "torch"), default="numpy")
    p.add_argument("--device", default="cpu", help="cpu or cuda (torch only)")
    p.add_argument(
        "--dtype",
        choices=("float64", "float32", "float16", "bfloat16"),
        default=None,
        help="input dtype (default float64 for numpy, float32 for torch)",
    )
    p.add_argument("--entropy-eps", type=parse_float, default=0.0, metavar="E",
                   help="the kernel's entropy guard (1e-9: the paper's listing)")  # fmt: skip
    p.add_argument(
        "--schedule",
        type=parse_schedule,
        default=PaperPolynomial(),
        metavar="SPEC",
        help="schedule the kernel implements: paper (default), constant:BETA, loglength:S, "
        "poly:C0,C1,...[@THETA]",
    )
    p.add_argument(
        "--kwarg",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra keyword argument for every call (e.g. axis=-1); repeatable",
    )
    p.add_argument("--thorough", action="store_true", help="explore ten times more examples")
    p.add_argument("--examples", type=int, default=None, metavar="N",
                   help="examples per Hypothesis property (overrides the budget)")  # fmt: skip
    p.add_argument("--only", action="append", metavar="PROPERTY", help="run only this property")
    return p


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run the suite, print the report and return the exit status."""
    try:
        from . import conformance as conf
    except ImportError as exc:  # hypothesis missing
        print(f"softmaxtheory check: {exc}; pip install 'softmaxtheory[check]'", file=sys.stderr)
        return 2
    if args.examples is not None and args.examples < 1:
        parser.error("--examples must be >= 1")
    dtype = args.dtype or ("float64" if args.framework == "numpy" else "float32")
    try:
        kernel, name = conf.load_kernel(args.kernel)
        kwargs = dict(conf.parse_kwarg(text) for text in args.kwarg)
        target = conf.Target(
            kernel, name, kind=args.kind, framework=args.framework, device=args.device,
            dtype=dtype, entropy_eps=args.entropy_eps, schedule=args.schedule,
            thorough=args.thorough, examples=args.examples, kwargs=kwargs,
        )  # fmt: skip
        if args.only:
            unknown = sorted(set(args.only) - set(conf.properties_for(args.kind)))
            if unknown:
                raise conf.ConformanceUsageError(
                    f"unknown properties for kind {args.kind}: {', '.join(unknown)} "
                    f"(known: {', '.join(conf.properties_for(args.kind))})"
                )
    except (conf.ConformanceUsageError, ValueError) as exc:
        print(f"softmaxtheory check: error: {exc}", file=sys.stderr)
        return 2
    out = sys.stdout
    out.write(_header(target))
    out.flush()
    start = time.perf_counter()

    def progress(line: str) -> None:
        out.write(line.rstrip() + "\n")
        out.flush()

    results = conf.run_conformance(target, only=args.only, progress=progress)
    elapsed = time.perf_counter() - start
    failed = [r for r in results if r.status == "fail"]
    notes = [r for r in results if r.status == "pass" and r.message]
    for r in notes:
        out.write(f"\n{r.name}: {r.message}\n")
    for r in failed:
        out.write(f"\n=== {r.name}: counterexample ===\n{r.message}\n")
    verdict = "CONFORMS" if not failed else f"DOES NOT CONFORM ({len(failed)} properties failed)"
    out.write(f"\n{target.name}: {verdict} [{elapsed:.1f} s]\n")
    return 1 if failed else 0


def _header(t: Any) -> str:
    import numpy as np

    from . import __version__

    versions = f"softmaxtheory {__version__}, numpy {np.__version__}"
    if t.framework == "torch":
        import torch

        versions += f", torch {torch.__version__}"
    return (
        f"softmaxtheory check {t.name}\n"
        f"  kind {t.kind}, framework {t.framework}, device {t.device}, dtype {t.dtype}, "
        f"schedule {t.schedule!r}, entropy_eps {t.entropy_eps!r}"
        f"{', thorough' if t.thorough else ''}\n"
        f"  {versions}, Python {platform.python_version()}\n"
        f"  errors in ulps of {t.dtype} against the certified reference (float64, mpmath)\n\n"
    )
