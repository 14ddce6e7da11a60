"""``softmaxtheory bench``: time the backends and print a table (or JSON)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from typing import Any

from .._formats import WORKING_DTYPES
from . import check_output_file

__all__ = ["add_parser", "run"]

SECTIONS = ("kernels", "reference", "attention")


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Register the ``bench`` subcommand on `sub` and return its parser."""
    bench = sub.add_parser(
        "bench",
        help="time the library's backends",
        description=(
            "Time the Numba CPU kernels against scipy and torch (ratios to torch.softmax, "
            "elements/s, GB/s against a bandwidth measured in the same run): the default "
            "section, kernels. --section reference times the certified reference on one long "
            "row, then its fast pass against pure mpmath on a row of 2**20 items (--n sets "
            "both lengths). A kernel or reference case reports its best time over at least "
            "--repeat runs lasting at least 0.1 s (kernel cases of 2**22 elements or more: "
            "at most 5 runs); the fast pass is the best of --repeat runs and the mpmath path "
            "one run. --section attention times the torch attention paths on CPU tensors "
            "(attention_entropy, adaptive_attention auto, hybrid and chunked) against "
            "scaled_dot_product_attention, forward and forward + backward, causal and not, "
            "each case's best over at least --repeat calls. Prints a table; progress goes to "
            "stderr."
        ),
    )
    bench.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="device to time (default cpu)"
    )
    bench.add_argument(
        "--section",
        action="append",
        choices=SECTIONS,
        help="section to run (repeatable; default: kernels, or reference when only --n is given)",
    )
    bench.add_argument(
        "--n", type=int, default=None, help="row length of the reference section (default 16384)"
    )
    bench.add_argument(
        "--repeat",
        type=int,
        default=None,
        help="runs per case, the best kept (kernel cases of 2**22 elements or more: at most 5)",
    )
    bench.add_argument(
        "--quick",
        action="store_true",
        help="small shapes, few repeats (--device cuda: every case at one small shape)",
    )
    bench.add_argument("--dtype", action="append", choices=WORKING_DTYPES, help="kernel dtypes")
    bench.add_argument("--threads", type=int, default=None, help="Numba and torch threads")
    bench.add_argument("--json", action="store_true", help="print JSON instead of a table")
    bench.add_argument(
        "--tiles",
        action="store_true",
        help="--device cuda: then time every launch configuration of the pass-1 Triton "
        "kernels at the first shape (about a minute)",
    )
    bench.add_argument(
        "--output",
        metavar="PATH",
        default=None,
        help="also write the JSON to PATH (--device cuda rewrites it after every case, so a "
        "run stopped early keeps what it measured)",
    )
    return bench


#: The longest row --n accepts: the reference section holds a few float64 copies of one
#: row (2**28 items are 2 GiB each); beyond it numpy's allocation failed with a traceback.
MAX_N = 1 << 28


def _fmt_kernels(results: list[Any], info: dict[str, Any]) -> list[str]:
    lines = [
        f"threads: {info['threads']} (numba and torch); measured bandwidth "
        f"{info['bandwidth_gb_per_second']:.1f} GB/s (parallel copy, read + write); "
        "GB/s counts 2 reads + 1 write",
        f"{'shape':<14} {'dtype':<8} {'rows':<7} {'backend':<24} {'ms':>9} "
        f"{'x torch':>8} {'Melem/s':>9} {'GB/s':>6} {'%bw':>5}",
    ]
    for r in results:
        ratio = "" if r.ratio_to_torch_softmax is None else f"{r.ratio_to_torch_softmax:.2f}"
        shape = f"{r.shape[0]}x{r.shape[1]}"
        lines.append(
            f"{shape:<14} {r.dtype:<8} {r.rows:<7} {r.backend:<24} {r.seconds * 1e3:>9.3f} "
            f"{ratio:>8} {r.elements_per_second / 1e6:>9.1f} {r.gb_per_second:>6.1f} "
            f"{100 * r.bandwidth_fraction:>5.0f}"
        )
    backends = {r.backend for r in results}
    if results and "torch.softmax" not in backends:
        lines.append(
            "torch is not installed: no torch rows, and no 'x torch' ratios "
            "(pip install 'softmaxtheory[torch]')"
        )
    if results and "scipy.special.softmax" not in backends:
        lines.append("scipy is not installed: no scipy.special.softmax rows (pip install scipy)")
    return lines


def _reference_speedup(args: argparse.Namespace, doc: dict[str, Any], say: Any) -> list[str]:
    """The fast first pass of the reference against its pure mpmath path."""
    from .. import bench

    n = args.n or (4096 if args.quick else 1 << 20)
    mp_n = min(n, 1024 if args.quick else 1 << 14)
    repeat = args.repeat or (1 if args.quick else 3)
    say(f"timing the reference's fast pass against pure mpmath on one row of {n} items ...")
    results = bench.run_reference_speedup(n=n, mpmath_n=mp_n, repeat=repeat, say=say)
    doc["reference_speedup"] = bench.as_dicts(results)
    # the fast pass: best of `repeat` runs, no time floor; the mpmath path: one run
    doc["run"]["reference_speedup_repeat"] = {"fast": repeat, "mpmath": 1, "min_seconds": 0.0}
    note = f" (mpmath timed on the first {mp_n} items, scaled by n / {mp_n})" if mp_n < n else ""
    lines = [
        f"certified reference, fast pass vs pure mpmath, n = {n}{note}",
        f"{'function':<18} {'row':<8} {'dtype':<8} {'fast s':>8} {'mpmath s':>9} "
        f"{'speed-up':>9} {'undecided':>10}",
    ]
    for r in results:
        undecided = "whole row" if r.row_fallback else f"{r.undecided_fraction:.2e}"
        lines.append(
            f"{r.function:<18} {r.row:<8} {r.dtype:<8} {r.fast_seconds:>8.3g} "
            f"{r.mpmath_seconds:>9.3g} {r.speedup:>8.0f}x {undecided:>10}"
        )
    shape = (8, 64, 16, 16) if args.quick else (64, 256, 64, 64)
    say(f"timing the certified attention of one head (L, S, d, dv) = {shape} ...")
    heads = bench.run_reference_attention(shape=shape, repeat=repeat)
    doc["reference_attention"] = bench.as_dicts(heads)
    lines += [
        f"certified adaptive_attention, fast pass vs pure mpmath, (L, S, d, dv) = {shape}",
        f"{'dtype':<8} {'fast s':>8} {'mpmath s':>9} {'speed-up':>9} {'rows undecided':>15}",
    ]
    for h in heads:
        lines.append(
            f"{h.dtype:<8} {h.fast_seconds:>8.3g} {h.mpmath_seconds:>9.3g} "
            f"{h.speedup:>8.1f}x {h.undecided_fraction:>15.2f}"
        )
    return lines


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run the benchmarks and print the results; return the exit status."""
    if args.repeat is not None and args.repeat < 1:
        parser.error("--repeat must be >= 1")
    if args.output is not None:
        check_output_file(args.output, "--output", parser)
    if args.device != "cpu":
        from ..bench.torch import run_device

        cpu_only = [f"--{name}" for name in ("section", "n", "dtype", "threads")
                    if getattr(args, name) is not None]  # fmt: skip
        if cpu_only:
            parser.error(
                f"{', '.join(cpu_only)}: CPU benchmark options; --device {args.device} times "
                "adaptive attention in bfloat16 at fixed shapes (--quick: one small shape)"
            )
        return run_device(args)
    from .. import bench

    if args.tiles:
        parser.error("--tiles times the Triton kernels: it needs --device cuda")
    sections = args.section or (["reference"] if args.n is not None else ["kernels"])
    if args.n is not None and not 1 <= args.n <= MAX_N:
        parser.error(f"--n must be between 1 and {MAX_N:,} (one row in memory), got {args.n:,}")
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be >= 1")
    if "kernels" in sections or "reference" in sections:  # (the attention section: torch only)
        import numba

        if args.threads is not None:
            limit = int(numba.config.NUMBA_NUM_THREADS)
            if args.threads > limit:
                parser.error(
                    f"--threads must be between 1 and {limit} (numba's NUMBA_NUM_THREADS), "
                    f"got {args.threads}"
                )
        if numba.config.DISABLE_JIT:
            msg = "the CPU benchmark times Numba's compiled kernels, and NUMBA_DISABLE_JIT is set"
            print(f"softmaxtheory bench: error: {msg} in this process: unset it", file=sys.stderr)
            return 2
    if "attention" in sections and importlib.util.find_spec("torch") is None:
        print("softmaxtheory bench: error: --section attention times the torch path and needs "
              "torch (pip install 'softmaxtheory[torch]')", file=sys.stderr)  # fmt: skip
        return 2
    if args.n is not None and "reference" not in sections:
        parser.error("--n sets the reference section's row length: add --section reference")
    doc: dict[str, Any] = {
        "machine": bench.machine(),
        "run": {
            "sections": list(sections),
            "quick": bool(args.quick),
            "statistic": "min",
            "min_seconds": bench.MIN_SECONDS,
        },
    }
    lines: list[str] = []

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    if "kernels" in sections:
        shapes = bench.QUICK_SHAPES if args.quick else bench.KERNEL_SHAPES
        repeat = args.repeat or (2 if args.quick else 10)
        dtypes = tuple(args.dtype or WORKING_DTYPES)
        results, info = bench.run_kernels(shapes, dtypes, repeat, args.threads, say)
        doc["kernels"] = bench.as_dicts(results)
        doc["kernel_run"] = {**info, "repeat": repeat, "repeat_large": min(repeat, 5)}
        lines += _fmt_kernels(results, info)
    if "reference" in sections:
        n = args.n or (256 if args.quick else 16384)
        repeat = args.repeat or (1 if args.quick else 3)
        say(f"timing the reference on one row of {n} items ...")
        results = bench.run_reference(n=n, repeat=repeat)
        doc["reference"] = bench.as_dicts(results)
        doc["run"]["reference_repeat"] = repeat
        lines.append(
            f"{'case':<40} {'dtype':<8} {'n':>7} {'beta':>8} {'seconds':>9} {'items/s':>10}"
        )
        for r in results:
            lines.append(
                f"{r.case:<40} {r.dtype:<8} {r.n:>7} {r.beta:>8.4f} {r.seconds:>9.3g} "
                f"{r.items_per_second:>10.0f}"
            )
    if "reference" in sections:
        lines += _reference_speedup(args, doc, say)
    if "attention" in sections:
        from ..bench import attention

        shapes = attention.QUICK_ATTENTION_SHAPES if args.quick else attention.ATTENTION_SHAPES
        repeat = args.repeat or (2 if args.quick else 5)
        doc["attention"] = attention.run_attention(shapes, repeat, args.threads, say)
        doc["run"]["attention_repeat"] = repeat
        lines += attention.format_attention(doc["attention"])
    if args.output:
        bench.save_json(doc, args.output)
    if args.json:
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    info = doc["machine"]
    print(
        f"machine: {info['cpu_model'] or info['processor']}, {info['cpus']} CPUs, "
        f"Python {info['python']}, softmaxtheory {info['softmaxtheory']}, "
        f"mpmath {info['mpmath']} ({info['mpmath_backend']} backend)"
    )
    for line in lines:
        print(line)
    return 0
