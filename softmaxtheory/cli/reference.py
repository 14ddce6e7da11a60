"""``softmaxtheory reference``: the certified reference on logits from the command line."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

import numpy as np

from softmaxtheory._formats import NUMPY_DTYPES

from ..spec import PaperPolynomial
from . import load_npy, parse_float, parse_nonzero_float, parse_schedule

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Register the ``reference`` subcommand on `sub` and return its parser."""
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
    ref.add_argument("logits", nargs="*", type=parse_float, help="logits of one row")
    ref.add_argument("--logits", dest="logits_csv", metavar="A,B,...", help="comma-separated")
    ref.add_argument("--npy", metavar="FILE", help="a .npy file of logits, shape (..., n)")
    ref.add_argument(
        "--schedule",
        type=parse_schedule,
        default=PaperPolynomial(),
        metavar="SPEC",
        help=(
            "paper (default), constant:BETA, loglength:S, "
            "poly:CK,...,C1,C0[@THETA] (highest degree first)"
        ),
    )
    ref.add_argument(
        "--entropy-eps",
        type=parse_nonzero_float,
        default=0.0,
        metavar="E",
        help="entropy: 0 (default) the exact one; E > 0 the paper's -sum p log(p + E)",
    )
    ref.add_argument(
        "--dtype",
        choices=NUMPY_DTYPES,
        default="float64",
        help="the format the results are correctly rounded to (the logits are read as "
        "float64, each decimal rounded to the nearest, and taken exactly from there, not "
        "rounded to this format first)",
    )
    ref.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ref.add_argument("--max-items", type=int, default=20, metavar="N", help="items shown per row")
    return ref


def _load_logits(args: argparse.Namespace, parser: argparse.ArgumentParser) -> np.ndarray:
    sources = [bool(args.logits), args.logits_csv is not None, args.npy is not None]
    if sum(sources) != 1:
        parser.error("give the logits once: as arguments, with --logits A,B,C, or with --npy FILE")
    if args.npy is not None:
        return load_npy(args.npy, parser)
    if args.logits_csv is not None:
        items = args.logits_csv.split(",")
        if items and not items[-1].strip():  # a trailing comma: "1,2,"
            items.pop()
        empty = [i + 1 for i, s in enumerate(items) if not s.strip()]
        if empty or not items:
            where = f" (item {empty[0]})" if empty else ""
            parser.error(
                f"--logits has an empty item{where}: {args.logits_csv!r}; write the "
                "logits separated by single commas, as in --logits 1,0,-2"
            )
        try:
            return np.array([parse_float(s) for s in items], dtype=np.float64)
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


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Evaluate the reference and print the table (or JSON); return the exit status."""
    if args.max_items < 0:
        parser.error("--max-items must be >= 0")
    from .. import reference
    from ..spec import RowKind, classify_rows

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
