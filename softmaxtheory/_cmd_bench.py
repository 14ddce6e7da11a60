"""``softmaxtheory bench``: time the backends and print a table (or JSON)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Register the ``bench`` subcommand on `sub` and return its parser."""
    bench = sub.add_parser(
        "bench",
        help="time the library's backends",
        description=(
            "Time the certified reference on one long row (best of --repeat runs) and print "
            "a table; progress goes to stderr."
        ),
    )
    bench.add_argument("--n", type=int, default=16384, help="row length (default 16384)")
    bench.add_argument("--repeat", type=int, default=3, help="runs per case (best is kept)")
    bench.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return bench


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run the benchmarks and print the results; return the exit status."""
    from . import bench

    if args.n < 1:
        parser.error("--n must be >= 1")
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    print(f"timing the reference on one row of {args.n} items ...", file=sys.stderr)
    results = bench.run_reference(n=args.n, repeat=args.repeat)
    if args.json:
        doc = {"machine": bench.machine(), "reference": bench.as_dicts(results)}
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    info = bench.machine()
    print(
        f"machine: {info['processor']}, {info['cpus']} CPUs, Python {info['python']}, "
        f"mpmath {info['mpmath']} ({info['mpmath_backend']} backend)"
    )
    print(f"{'case':<40} {'dtype':<8} {'n':>7} {'beta':>8} {'seconds':>9} {'items/s':>10}")
    for r in results:
        print(
            f"{r.case:<40} {r.dtype:<8} {r.n:>7} {r.beta:>8.4f} {r.seconds:>9.3f} "
            f"{r.items_per_second:>10.0f}"
        )
    return 0
