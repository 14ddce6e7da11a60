"""The ``softmaxtheory`` command line.

Subcommands:

``softmaxtheory reference``
    Evaluate the certified reference on logits given on the command line or in
    a ``.npy`` file; print n, H, β and the correctly rounded coefficients.
``softmaxtheory bench``
    Time the backends and print a table (``--json`` too).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import __version__
from .spec import Constant, LogLength, PaperPolynomial, Polynomial, Schedule

__all__ = ["main", "parse_schedule"]


def parse_schedule(text: str) -> Schedule:
    """Parse a schedule from the command line.

    Accepted forms: ``paper``, ``constant:BETA``, ``loglength:S`` and
    ``poly:C0,C1,...[@THRESHOLD]`` (coefficients highest degree first, exact
    decimals).

    Examples
    --------
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


def _parse_float(text: str) -> float:
    try:
        return float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from exc


def _load_logits(args: argparse.Namespace, parser: argparse.ArgumentParser) -> np.ndarray:
    sources = [bool(args.logits), args.logits_csv is not None, args.npy is not None]
    if sum(sources) != 1:
        parser.error("give the logits once: as arguments, with --logits A,B,C, or with --npy FILE")
    if args.npy is not None:
        try:
            arr = np.load(args.npy, allow_pickle=False)
        except (OSError, ValueError) as exc:
            parser.error(f"cannot read {args.npy}: {exc}")
        if arr.ndim == 0:
            parser.error(f"{args.npy} holds a 0-d array; logits need shape (..., n)")
        return arr
    if args.logits_csv is not None:
        items = [s for s in args.logits_csv.split(",") if s.strip()]
        try:
            return np.array([_parse_float(s) for s in items], dtype=np.float64)
        except argparse.ArgumentTypeError as exc:
            parser.error(str(exc))
    return np.array(args.logits, dtype=np.float64)


def _fmt(value: float, dtype: np.dtype) -> str:
    v = dtype.type(value)
    if np.isnan(v) or np.isinf(v):
        return str(float(v))
    return str(v)


def _json_number(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)


def _reference_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from . import reference
    from .spec import RowKind, classify_rows

    x = _load_logits(args, parser)
    dtype = np.dtype(args.dtype)
    try:
        sm = reference.softmax(x, dtype=dtype)
        H = reference.entropy(x, entropy_eps=args.entropy_eps, dtype=dtype)
        b = reference.beta(x, schedule=args.schedule, entropy_eps=args.entropy_eps, dtype=dtype)
        ad = reference.adaptive_softmax(
            x, schedule=args.schedule, entropy_eps=args.entropy_eps, dtype=dtype
        )
    except (TypeError, ValueError) as exc:
        parser.error(str(exc))
    kinds = classify_rows(np.asarray(x, dtype=np.float64))
    rows: list[dict[str, Any]] = []
    for idx in np.ndindex(x.shape[:-1]):
        xr = np.asarray(x[idx], dtype=np.float64)
        rows.append(
            {
                "row": list(idx),
                "n": int(xr.shape[0]),
                "unmasked": int(np.sum(xr > -np.inf)),
                "kind": RowKind(int(kinds[idx])).name.lower(),
                "entropy": float(H[idx]),
                "beta": float(b[idx]),
                "logits": xr.tolist(),
                "softmax": sm[idx].astype(np.float64).tolist(),
                "adaptive_softmax": ad[idx].astype(np.float64).tolist(),
            }
        )
    if args.json:
        doc = {
            "dtype": dtype.name,
            "schedule": repr(args.schedule),
            "entropy_eps": args.entropy_eps,
            "rows": [
                {
                    key: (
                        [_json_number(v) for v in val]
                        if isinstance(val, list) and key != "row"
                        else _json_number(val)
                        if isinstance(val, float)
                        else val
                    )
                    for key, val in r.items()
                }
                for r in rows
            ],
        }
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    out = sys.stdout
    out.write(
        f"certified reference, every value correctly rounded to {dtype.name} "
        f"(schedule {args.schedule!r}, entropy_eps {args.entropy_eps!r})\n"
    )
    for r in rows:
        label = f"row {tuple(r['row'])}: " if x.ndim > 1 else ""
        out.write(
            f"\n{label}n = {r['n']} ({r['unmasked']} unmasked, {r['kind']})   "
            f"H = {_fmt(r['entropy'], dtype)} nats   beta = {_fmt(r['beta'], dtype)}\n"
        )
        if r["n"] == 0:
            continue
        width = 26
        out.write(f"{'i':>6}  {'x_i':>{width}}  {'softmax_i':>{width}}  {'adaptive_i':>{width}}\n")
        shown = min(r["n"], args.max_items)
        for i in range(shown):
            out.write(
                f"{i:>6}  {r['logits'][i]!r:>{width}}  {_fmt(r['softmax'][i], dtype):>{width}}  "
                f"{_fmt(r['adaptive_softmax'][i], dtype):>{width}}\n"
            )
        if shown < r["n"]:
            out.write(f"{'':>6}  ... {r['n'] - shown} more items (--max-items N or --json)\n")
    return 0


def _build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(
        prog="softmaxtheory",
        description="Softmax dispersion and adaptive temperature, certified.",
    )
    parser.add_argument("--version", action="version", version=f"softmaxtheory {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    ref = sub.add_parser(
        "reference",
        help="evaluate the certified reference on logits",
        description=(
            "Evaluate the certified mpmath reference along the last axis and print n, the "
            "entropy H, the inverse temperature beta and the correctly rounded softmax and "
            "adaptive-softmax coefficients. Put logits that start with '-' after '--' "
            "(softmaxtheory reference -- -inf 0 1) or use --logits=-inf,0,1."
        ),
    )
    ref.add_argument("logits", nargs="*", type=_parse_float, help="logits of one row")
    ref.add_argument("--logits", dest="logits_csv", metavar="A,B,...", help="comma-separated")
    ref.add_argument("--npy", metavar="FILE", help="a .npy file of logits, shape (..., n)")
    ref.add_argument(
        "--schedule",
        type=parse_schedule,
        default=PaperPolynomial(),
        metavar="SPEC",
        help="paper (default), constant:BETA, loglength:S, poly:C0,C1,...[@THETA]",
    )
    ref.add_argument("--entropy-eps", type=_parse_float, default=0.0, metavar="E")
    ref.add_argument("--dtype", choices=("float64", "float32", "float16"), default="float64")
    ref.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ref.add_argument("--max-items", type=int, default=20, metavar="N", help="items shown per row")
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
    return parser, {"reference": ref, "bench": bench}


def _bench_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
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


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    parser, subparsers = _build_parser()
    args = parser.parse_args(argv)
    sub = subparsers[args.command]
    if args.command == "bench":
        return _bench_command(args, sub)
    if args.max_items < 0:
        sub.error("--max-items must be >= 0")
    return _reference_command(args, sub)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
