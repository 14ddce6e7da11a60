"""``softmaxtheory bounds``: dispersion limits for a logit spread (a table, JSON or a plot)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from fractions import Fraction
from typing import Any

import numpy as np

from softmaxtheory._certify.adaptive import beta_sup
from softmaxtheory._certify.enclosures import certified_text, decimal_up, max_coefficient_up
from softmaxtheory._certify.interval import float_directed

from ..spec import PaperPolynomial
from . import check_output_file, load_npy, parse_float, plural

__all__ = ["DEFAULT_BUDGET", "DEFAULT_SIZES", "add_parser", "compute", "run"]

#: The lengths of the table: 16, 32, ..., 16384 (the paper's evaluation sizes).
DEFAULT_SIZES: tuple[int, ...] = tuple(16 * 2**k for k in range(11))

STATISTICS = ("max", "mean", "median")

#: Boxes of branch and bound the command spends on the adaptive dispersion size's upper
#: end (``--budget``): 4 to 5 s of one core at spreads 3 to 12 (0.4 s at 2), measured on
#: the CI machine; the bracket is then within 7 % at spreads 2 to 40 (spread 5.69:
#: [1253, 1283], where the closed form alone gives 5828).
DEFAULT_BUDGET = 30_000


def _parse_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"sizes must be integers, got {text!r}") from exc
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"sizes must be integers >= 1, got {text!r}")
    return sizes


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Register the ``bounds`` subcommand on `sub` and return its parser."""
    p = sub.add_parser(
        "bounds",
        help="dispersion limits for a logit spread (T1, T2, T3, T6)",
        description=(
            "Print the dispersion limits of softmax for logits of a given spread: the size "
            "from which every coefficient is below EPS, the largest and smallest coefficient, "
            "the least entropy (T6: attained by a row with its logits at the two ends of the "
            "spread; the adaptive temperature reads this entropy) and T3's min-entropy floor "
            "(-log of the largest coefficient, below the entropy) at each length, with and "
            "without the paper's adaptive temperature, and the length from which that "
            "temperature is 1. "
            "Give the spread, or a .npy of logits to measure it (-inf entries are masks). "
            "Every decimal shown is correctly rounded to the digits shown, except where "
            "rounding in a direction keeps a statement true: sizes in scientific notation (a "
            "length from which something holds upward, the bracket's lower end downward), "
            "beta's bound (the float at or above it), the window (outward) and the adaptive "
            "column (upward, also where it equals max coef). That column, and the JSON's "
            "adaptive_max_coefficient and adaptive_dispersion_size, are upper bounds: where "
            "beta can exceed 1 the upper end of a proven bracket."
        ),
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--spread", type=_outward(+1), metavar="DELTA", help="the logit spread")
    src.add_argument("--npy", metavar="FILE", help="a .npy of logits (..., n) to measure")
    p.add_argument(
        "--statistic",
        choices=STATISTICS,
        default=None,
        help="with --npy: which row spread to use (default max, the worst case)",
    )
    p.add_argument("--eps", type=_outward(-1), default=0.5, help="coefficient level (default 0.5)")
    p.add_argument("--beta", type=_outward(+1), default=1.0, help="inverse temperature (default 1)")
    p.add_argument(
        "--sizes",
        type=_parse_sizes,
        default=DEFAULT_SIZES,
        metavar="N,N,...",
        help="lengths of the table (default 16,32,...,16384)",
    )
    p.add_argument("--digits", type=int, default=6, help="significant digits shown (default 6)")
    p.add_argument(
        "--exact-digits",
        action="store_true",
        help=(
            "print every size with all its digits (default: sizes with more digits than "
            "--digits are shown in scientific notation, rounded so that their sentences "
            "stay true; exact digits of a huge spread's sizes take long: the fast "
            "extra, gmpy2, makes them about 10 times faster)"
        ),
    )
    p.add_argument(
        "--budget",
        type=int,
        default=DEFAULT_BUDGET,
        metavar="N",
        help=(
            "boxes of branch and bound spent proving the adaptive dispersion size's upper end "
            f"(default {DEFAULT_BUDGET:,}, a few seconds; 0: the closed form alone, at once)"
        ),
    )
    p.add_argument(
        "--json",
        action="store_true",
        help=(
            "print JSON instead: float64 values, sizes as integers (as text in scientific "
            "notation when they have more digits than --digits)"
        ),
    )
    p.add_argument("--plot", metavar="FILE", help="also write a PNG of the bounds against n")
    return p


def _measure(path: str, statistic: str, parser: argparse.ArgumentParser) -> dict[str, Any]:
    from ..bounds import empirical_spread

    arr = load_npy(path, parser)
    try:
        spreads = np.atleast_1d(empirical_spread(arr))
    except (TypeError, ValueError) as exc:
        parser.error(f"{path}: {exc}")
    bad = int(np.sum(np.isnan(spreads)))
    good = spreads[~np.isnan(spreads)]
    if spreads.size == 0:
        parser.error(f"{path} holds no rows (shape {arr.shape})")
    if arr.shape[-1] == 0:
        parser.error(f"{path} holds rows of 0 items (shape {arr.shape}): no spread to measure")
    if good.size == 0:
        parser.error(f"{path}: no row has a finite spread (every row holds NaN or +inf)")
    if not np.all(np.isfinite(good)):
        parser.error(f"{path}: a row's spread overflows float64")
    value = {"max": np.max, "mean": np.mean, "median": np.median}[statistic](good)
    return {
        "file": path,
        "rows": int(spreads.size),
        "rows_with_nan_or_inf": bad,
        "items_per_row": int(arr.shape[-1]) if arr.ndim else 0,
        "spread_mean": float(np.mean(good)),
        "spread_std": float(np.std(good)),
        "spread_min": float(np.min(good)),
        "spread_max": float(np.max(good)),
        "statistic": statistic,
        "spread": float(value),
    }


def compute(
    spread: float,
    eps: float,
    beta: float,
    sizes: tuple[int, ...],
    digits: int = 6,
    exact: bool = False,
    budget: int = DEFAULT_BUDGET,
) -> dict[str, Any]:
    """Every number the command prints, as a dict (floats and sizes, plus decimal strings).

    Sizes are exact ints when `exact` is true or when they have at most
    `digits` digits; otherwise they are strings in scientific notation,
    rounded to `digits` significant digits in the direction that keeps what is
    printed of them true: upward for a length from which something holds (a
    dispersion size, the switch-off size, the bracket's upper end), downward
    for the bracket's lower end. The adaptive column is the upper end of
    :func:`~softmaxtheory.bounds.adaptive_max_coefficient_bracket` where the
    adaptive temperature can exceed 1 (0.0674 at 4,096 items and spread 5.69,
    where the closed form :func:`~softmaxtheory.bounds.adaptive_max_coefficient`
    gives 0.961), else the closed form, which is then exact. The adaptive
    dispersion size is :func:`~softmaxtheory.bounds.adaptive_dispersion_bracket`
    with `budget` boxes of branch and bound.
    """
    from .. import bounds

    beta_max = bounds.adaptive_beta_max()
    h_on, h_off = bounds.adaptive_window()

    def size(func: Any, *args: Any, rounding: str = "up") -> int | str:
        text = func(*args, digits=digits, rounding=rounding)
        if exact or ("e" not in text):
            if exact and "e" in text:
                print(
                    f"softmaxtheory bounds: computing a size of about {text} exactly...",
                    file=sys.stderr,
                    flush=True,
                )
            return func(*args)
        return text

    n_off = size(bounds.adaptive_switch_off_size, spread)
    n_star = size(bounds.dispersion_size, eps, spread, beta)
    # the adaptive column applies the schedule to the logits as given (beta = 1 under it)
    n_one = n_star if beta == 1.0 else size(bounds.dispersion_size, eps, spread, 1.0)
    bracket: dict[str, Any] | None = None
    if spread == 0:
        # every row is uniform, whatever beta: T2's size, exactly (as text, each end rounded
        # in its own direction)
        lower = size(bounds.dispersion_size, eps, spread, 1.0, rounding="down")
        bracket = {"lower": lower, "upper": n_one, "witness": None, "budget": 0}
    elif spread * 2.5 > bounds.MAX_EXPONENT:
        # beyond the branch and bound's range, closed forms: beta >= 1 reaches at least
        # T2's coefficient at beta = 1, and from the switch-off size on beta = 1
        upper = n_off if _as_decimal(n_off) > _as_decimal(n_one) else n_one
        lower = size(bounds.dispersion_size, eps, spread, 1.0, rounding="down")
        bracket = {"lower": lower, "upper": upper, "witness": None, "budget": 0}
    else:
        b = bounds.adaptive_dispersion_bracket(eps, spread, budget=budget)
        bracket = {
            "lower": b.lower
            if exact or b.lower < 10**digits
            else bounds.size_text(b.lower, digits, rounding="down"),
            "upper": b.upper
            if exact or b.upper < 10**digits
            else bounds.size_text(b.upper, digits, rounding="up"),
            "witness": _witness_text(b.witness, digits, exact),
            "budget": budget,
        }

    def adaptive_top(n: int) -> tuple[float, str]:
        # an upper bound, rounded upward (float and decimal): the closed form (T1 at the
        # largest beta of the entropy range), or where it is loose (beta can exceed 1) the
        # bracket's upper end, from the dominating rows
        adaptive_beta = beta_sup(n, spread, PaperPolynomial())
        upper = max_coefficient_up(n, spread, adaptive_beta)
        bracketable = n >= 2 and 0.0 < spread * 2.5 <= bounds.MAX_EXPONENT
        if bracketable and adaptive_beta > 1.0:
            upper = min(upper, bounds.adaptive_max_coefficient_bracket(n, spread).upper)
        return upper, decimal_up(upper, digits)

    rows = []
    for n in sizes:
        adaptive, adaptive_text = adaptive_top(n)
        rows.append(
            {
                "n": n,
                "max_coefficient": bounds.max_coefficient(n, spread, beta),
                "adaptive_max_coefficient": adaptive,
                "min_coefficient": bounds.min_coefficient(n, spread, beta),
                "least_entropy": bounds.least_entropy(n, spread, beta),
                "entropy_lower_bound": bounds.entropy_lower_bound(n, spread, beta),
                "text": {
                    "max_coefficient": certified_text(n, spread, beta, "max", digits),
                    "adaptive_max_coefficient": adaptive_text,
                    "min_coefficient": certified_text(n, spread, beta, "min", digits),
                    "least_entropy": certified_text(n, spread, beta, "least_entropy", digits),
                    "entropy_lower_bound": certified_text(n, spread, beta, "entropy", digits),
                },
            }
        )
    return {
        "spread": spread,
        "eps": eps,
        "beta": beta,
        "dispersion_size": n_star,
        "adaptive_dispersion_size": bracket["upper"],
        "adaptive_dispersion_bracket": bracket,
        "adaptive_switch_off_size": n_off,
        "adaptive_beta_max": beta_max,
        "adaptive_window": [h_on, h_off],
        "rows": rows,
    }


def _witness_text(witness: Any, digits: int, exact: bool) -> str:
    """The witness row as its levels and counts, exact.

    Counts of more than `digits` digits are not rounded (a row with a rounded count is
    another row, which need not reach eps): the largest is written as "the rest" (the
    row's length is the lower end less one), any other as an exact integer.
    """
    counts = [c for c in witness.counts if c]
    in_full = exact or max(counts) < 10**digits
    rest = None if in_full else witness.counts.index(max(counts))
    parts = []
    for i, (level, count) in enumerate(zip(witness.levels, witness.counts, strict=True)):
        if count:
            parts.append(f"{'the rest' if i == rest else _show(count)} at {level!r}")
    text = ", ".join(parts)
    return text if rest is None else f"{text}; --exact-digits prints the counts"


class _Rounded(float):
    """A float argument that is not the decimal typed: `typed`, rounded outward to it."""

    typed: str
    direction: str


def _outward(direction: int) -> Any:
    """An argparse type: the float next to the decimal typed, in `direction` (+1 up, -1 down).

    ``--spread 2.995732273553991`` rounded to nearest is a float just below the decimal
    (and below log 20), and the size printed for it, 21, is one short for the decimal.
    Rounded up, every line of the table holds for the value typed: a larger spread or β
    and a smaller level only loosen each bound (a maximum coefficient up, a minimum and
    the entropies down, the sizes up).
    """

    def parse(text: str) -> float:
        value = parse_float(text)
        if not math.isfinite(value):
            return value  # (refused by the checks, with the text)
        try:
            exact = Fraction(text.strip())
        except ValueError:  # a spelling Fraction does not read ("1_000", say)
            return value
        if (Fraction(value) - exact) * direction >= 0:
            return value  # the nearest float already lies on the side that keeps them true
        out = _Rounded(float_directed(exact, direction))
        out.typed, out.direction = text.strip(), "above" if direction > 0 else "below"
        return out

    return parse


def _rounding_notes(args: argparse.Namespace) -> list[str]:
    """One line per argument that was rounded outward (:func:`_outward`)."""
    notes = []
    for flag in ("spread", "eps", "beta"):
        value = getattr(args, flag)
        if isinstance(value, _Rounded):
            notes.append(
                f"--{flag} {value.typed}: its nearest float64 lies on the wrong side of it, so "
                f"the limits are computed for the float just {value.direction} it, "
                f"{float(value)!r}; they hold for {value.typed} too, but for the adaptive "
                "bracket's lower end and its witness row, which are that float's"
            )
    return notes


def _check(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    if not 0.0 < args.eps < 1.0:
        parser.error(f"--eps must lie strictly between 0 and 1, got {args.eps!r}")
    if not (math.isfinite(args.beta) and args.beta > 0):
        parser.error(f"--beta must be finite and > 0, got {args.beta!r}")
    if args.spread is not None and not (math.isfinite(args.spread) and args.spread >= 0):
        parser.error(f"--spread must be finite and >= 0, got {args.spread!r}")
    if not 1 <= args.digits <= 17:
        parser.error(f"--digits must be between 1 and 17, got {args.digits}")
    if args.budget < 0:
        parser.error(f"--budget must be >= 0, got {args.budget}")


def _json_ready(value: Any) -> Any:
    """`value` with every int beyond Python's int-to-str limit (4300 digits) as its digits.

    ``json.dump`` raised ``ValueError`` midway through such an int (a bracket end at
    spread 10,000 with ``--exact-digits``), leaving half a document on stdout.
    """
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_ready(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**4000:
        return _show(value)
    return value


def _as_decimal(size: int | str) -> Any:
    """A size (an exact int, or its text in scientific notation) as an exact Decimal."""
    import decimal

    return decimal.Decimal(size) if isinstance(size, str) else decimal.Decimal(int(size))


def _show(size: int | str) -> str:
    """A size as printed: an exact int in full (Python's digit limit lifted), or its text."""
    if isinstance(size, str):
        return size
    if size < 10**4000:
        return str(size)
    import decimal

    with decimal.localcontext() as ctx:
        ctx.prec = decimal.MAX_PREC
        return format(decimal.Decimal(size), "f")


def _check_range(
    spread: float, beta: float, parser: argparse.ArgumentParser, measured: str | None = None
) -> None:
    """Refuse a spread and beta whose sizes would be too large to compute (exit 2).

    `measured` names the file the spread was measured in, when it was.
    """
    from ..bounds import MAX_EXPONENT

    if spread * beta > MAX_EXPONENT:
        source = f"the spread measured in {measured}" if measured else "the spread"
        parser.error(
            f"beta times {source} = {beta!r} * {spread!r} is too large: it must be at "
            f"most {MAX_EXPONENT:.3g}, where the sizes have 630,000 digits"
        )


def _print_table(doc: dict[str, Any], measured: dict[str, Any] | None) -> None:
    out = sys.stdout
    if measured is not None:
        out.write(
            f"measured {plural(measured['rows'], 'row')} of "
            f"{plural(measured['items_per_row'], 'item')} in "
            f"{measured['file']}: spread mean {measured['spread_mean']:.4g} ± "
            f"{measured['spread_std']:.4g}, range [{measured['spread_min']:.4g}, "
            f"{measured['spread_max']:.4g}]"
        )
        if measured["rows_with_nan_or_inf"]:
            skipped = plural(measured["rows_with_nan_or_inf"], "row")
            out.write(f"; {skipped} with NaN or +inf skipped")
        out.write(f"\nusing the {measured['statistic']}: spread {doc['spread']!r}\n\n")
    beta = doc["beta"]
    bt = "" if beta == 1.0 else f" at beta = {beta!r}"
    out.write(f"dispersion limits for logit spread {doc['spread']!r}{bt}\n")
    out.write(
        f"  every coefficient is < {doc['eps']!r} once n >= {_show(doc['dispersion_size'])}"
        "   (dispersion size, T2)\n"
    )
    h_on, h_off = doc["adaptive_window"]
    out.write(
        f"  adaptive temperature (the paper's polynomial): beta <= {doc['adaptive_beta_max']!r},"
        f" > 1 only for entropies in ({h_on!r}, {h_off!r})\n"
    )
    out.write(
        f"    beta = 1 for every row once n >= {_show(doc['adaptive_switch_off_size'])}"
        "   (switch-off size, T6)\n"
    )
    bracket = doc["adaptive_dispersion_bracket"]
    low, high = _show(bracket["lower"]), _show(bracket["upper"])
    if bracket["witness"] is not None:
        out.write(
            f"    every adaptive coefficient is < {doc['eps']!r} from some n in [{low}, {high}]"
            "   (adaptive dispersion size, bracketed)\n"
            f"      (a row one item shorter than the lower end reaches it: "
            f"{bracket['witness']})\n\n"
        )
    elif doc["spread"] == 0:
        out.write(
            f"    every adaptive coefficient is < {doc['eps']!r} once n >= {high}"
            "   (adaptive dispersion size: every row is uniform, beta changes nothing)\n\n"
        )
    else:
        out.write(
            f"    every adaptive coefficient is < {doc['eps']!r} from some n in [{low}, {high}]"
            "   (adaptive dispersion size, closed forms: T2 at beta = 1, the switch-off "
            "size)\n\n"
        )
    headers = ("n", "max coef", "adaptive, at most", "min coef", "least entropy", "T3 floor")
    widths = [max([8, *(len(str(r["n"])) for r in doc["rows"])]), 14, 20, 14, 14, 12]
    out.write("  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True)) + "\n")
    for r in doc["rows"]:
        t = r["text"]
        cells = (
            str(r["n"]),
            t["max_coefficient"],
            t["adaptive_max_coefficient"],
            t["min_coefficient"],
            t["least_entropy"],
            t["entropy_lower_bound"],
        )
        out.write("  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True)) + "\n")
    if beta == 1.0:
        out.write(
            "(least entropy: the smallest entropy, in nats, of a row of n logits of this "
            "spread,\n the one beta is read from; T3 floor: -log max coef, the least "
            "min-entropy)\n"
        )
    else:  # the columns are the softmax's at --beta; the schedule reads the logits as given
        out.write(
            "(least entropy: the smallest entropy, in nats, of the softmax at this beta of a "
            "row of n logits\n of this spread, not the one the adaptive beta is read from "
            "(at beta = 1); T3 floor: -log max coef,\n the least min-entropy)\n"
        )
    if beta != 1.0:
        out.write("(the adaptive column applies the schedule to the logits as given, beta = 1)\n")


def _plot(doc: dict[str, Any], path: str) -> None:
    import matplotlib.pyplot as plt

    fig = _figure(doc)
    fig.savefig(path, format="png")
    plt.close(fig)


def _figure(doc: dict[str, Any]) -> Any:
    """The limits of `doc` (the JSON document) drawn against n, as a matplotlib figure.

    The T1 curves and the dispersion size are at the document's β; the adaptive
    temperature's curves apply the schedule to the logits as given (as the table's
    column does), and say so when β is not 1.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .. import bounds

    def capped(size: int | str) -> int:  # sizes shown as text are beyond any axis drawn
        return size if isinstance(size, int) else 10**15

    n_star = capped(doc["dispersion_size"])
    n_off = capped(doc["adaptive_switch_off_size"])
    top = max(max(r["n"] for r in doc["rows"]), 4 * min(n_star, 10**12), 4 * min(n_off, 10**12))
    ns = np.unique(np.geomspace(2, top, 300).astype(np.int64))
    spread, beta = doc["spread"], doc["beta"]
    at = "" if beta == 1.0 else f", β = {beta}"
    given = "" if beta == 1.0 else ", logits as given (β = 1)"
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=120)
    ax.loglog(ns, bounds.max_coefficient(ns, spread, beta), label=f"max coefficient (T1{at})")
    ax.loglog(
        ns,
        bounds.adaptive_max_coefficient(ns, spread),
        label=f"max coefficient, adaptive temperature{given}: closed form (T6)",
    )
    ax.loglog(  # the table's column: tighter where beta can exceed 1 (branch and bound)
        [r["n"] for r in doc["rows"]],
        [r["adaptive_max_coefficient"] for r in doc["rows"]],
        linestyle="none",
        marker="o",
        markersize=3.5,
        color="tab:orange",
        label=f"max coefficient, adaptive temperature{given}: bracket's upper end",
    )
    ax.loglog(ns, bounds.min_coefficient(ns, spread, beta), label=f"min coefficient (T1{at})")
    ax.loglog(ns, 1.0 / ns, color="grey", linewidth=0.8, linestyle=":", label="1/n")
    ax.axhline(doc["eps"], color="black", linewidth=0.8, linestyle="--", label=f"ε = {doc['eps']}")
    if n_star <= top:
        ax.axvline(n_star, color="tab:red", linewidth=0.8, label=f"dispersion size {n_star}{at}")
    if n_off <= top:
        ax.axvline(n_off, color="tab:purple", linewidth=0.8, label=f"switch-off size {n_off}")
    ax.set_xlabel("number of items n")
    ax.set_ylabel("coefficient bound")
    ax.set_title(f"Softmax dispersion limits for logit spread {spread}{at}")
    ax.grid(True, which="both", linewidth=0.3)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    return fig


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Compute the limits and print them; return the exit status."""
    _check(args, parser)
    for note in _rounding_notes(args):
        print(f"softmaxtheory bounds: note: {note}", file=sys.stderr)
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print(
                "softmaxtheory bounds: --plot needs matplotlib, which is not installed; "
                "install it with: pip install 'softmaxtheory[plot]'",
                file=sys.stderr,
            )
            return 1
    measured = None
    spread = args.spread
    if args.statistic is not None and args.npy is None:
        parser.error("--statistic applies to the rows of --npy; with --spread there is one spread")
    if args.npy is not None:
        measured = _measure(args.npy, args.statistic or "max", parser)
        spread = measured["spread"]
    _check_range(spread, args.beta, parser, args.npy)
    if args.plot is not None:
        check_output_file(args.plot, "--plot", parser)
    try:
        doc = compute(
            spread, args.eps, args.beta, args.sizes, args.digits, args.exact_digits, args.budget
        )
    except ValueError as exc:
        parser.error(str(exc))
    if args.json:
        out = {k: v for k, v in doc.items() if k != "rows"}
        out["rows"] = [{k: v for k, v in r.items() if k != "text"} for r in doc["rows"]]
        if measured is not None:
            out["measured"] = measured
        json.dump(_json_ready(out), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print_table(doc, measured)
    if args.plot is not None:
        try:
            _plot(doc, args.plot)
        except OSError as exc:
            parser.error(f"--plot: cannot write {args.plot}: {exc.strerror or exc}")
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0
