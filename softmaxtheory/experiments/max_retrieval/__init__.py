r"""The paper's max-retrieval experiment: ``softmaxtheory reproduce max-retrieval``.

A single attention head learns to return the class of the item of largest
priority in a set of items; trained on sets of 5 to 16 items, it is evaluated
on sets of 16 to 16384 items, with the plain softmax and with the paper's
adaptive temperature at inference only (:math:`\beta` from the entropy
:math:`H` of each attention row, the polynomial schedule of
:class:`softmaxtheory.spec.PaperPolynomial`):

.. math::

    \alpha = \operatorname{softmax}(x) \quad\text{vs.}\quad
    \alpha = \operatorname{softmax}\bigl(\beta(H(x))\,x\bigr).

It prints the accuracies beside the paper's, a paired t-test per size, and the
trained head's coefficient on the max item against :math:`n` (the paper's
dispersion effect) beside the T1 bound
:math:`1/(1 + (n-1)e^{-\delta})` at the logit spread :math:`\delta` measured
in the head. It writes ``max_retrieval.csv``, ``max_retrieval.png`` and
``max_retrieval.json`` into ``--out``.

Two configurations: ``quick`` (3 seeds, a CPU in about ten minutes) and
``full`` (10 seeds, meant for a GPU); the flags override them. Torch, scipy and
matplotlib are imported only when the experiment runs.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

__all__ = [
    "CONFIGS",
    "DEFAULT_SIZES",
    "Config",
    "add_arguments",
    "main",
    "resolve_config",
    "run_experiment",
]

#: The paper's evaluation sizes, 16, 32, ..., 16384.
DEFAULT_SIZES: tuple[int, ...] = tuple(16 * 2**k for k in range(11))


@dataclass(frozen=True)
class Config:
    r"""Settings of one run.

    Attributes
    ----------
    name : str
        The named configuration the run starts from (``"quick"`` or ``"full"``).
    seeds : int
        Number of seeds :math:`S` (models ``base_seed .. base_seed + S - 1``).
    steps : int
        AdamW steps.
    eval_sets : int
        Evaluation sets per seed and size (before the item cap).
    eval_items : int or None
        Cap on the items per seed and size: size :math:`n` gets
        :math:`\max(\text{min\_eval\_sets}, \min(\text{eval\_sets},
        \lfloor \text{eval\_items}/n \rfloor))` sets. ``None``: no cap.
    min_eval_sets : int
        Floor of the number of sets under the cap.
    sizes : tuple of int
        Evaluation sizes.
    batch : int
        Training sets per step and seed.
    lr : float
        AdamW learning rate.
    weight_decay : float
        AdamW weight decay.
    width : int
        Width of every layer.
    base_seed : int
        First seed number.
    max_minutes : float or None
        Training time budget (stop early when it runs out).
    """

    name: str
    seeds: int
    steps: int
    eval_sets: int
    eval_items: int | None
    min_eval_sets: int = 16
    sizes: tuple[int, ...] = DEFAULT_SIZES
    batch: int = 128
    lr: float = 1e-3
    weight_decay: float = 1e-3
    width: int = 128
    base_seed: int = 0
    max_minutes: float | None = None

    def sets_for(self, n: int) -> int:
        """Evaluation sets per seed at size `n`."""
        if self.eval_items is None:
            return self.eval_sets
        return max(
            min(self.min_eval_sets, self.eval_sets), min(self.eval_sets, self.eval_items // n)
        )


#: The two named configurations.
CONFIGS: dict[str, Config] = {
    "quick": Config(name="quick", seeds=3, steps=4000, eval_sets=2000, eval_items=1 << 20),
    "full": Config(name="full", seeds=10, steps=20000, eval_sets=2000, eval_items=None),
}


def _number_parser(
    convert: Callable[[str], Any], valid: Callable[[Any], bool], expected: str
) -> Callable[[str], Any]:
    """An argparse ``type=``: `convert` the text, then require `valid` (else "expected ...")."""

    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from exc
        if not valid(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return parse


_positive_int = _number_parser(int, lambda v: v >= 1, "a positive integer")
_nonnegative_int = _number_parser(int, lambda v: v >= 0, "an integer >= 0")
_positive_float = _number_parser(float, lambda v: math.isfinite(v) and v > 0, "a positive number")


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(t) for t in text.split(","))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"sizes must be comma-separated integers, got {text!r}"
        ) from exc
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"sizes must be integers >= 1, got {text!r}")
    return tuple(sorted(set(sizes)))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``softmaxtheory reproduce max-retrieval`` to `parser`."""
    parser.description = (
        "Train the paper's single-head max-retrieval model on sets of 5-16 items (many seeds "
        "batched into one model), evaluate it on sets of 16..16384 items with softmax and with "
        "the adaptive temperature, and print the accuracies beside the paper's, a paired t-test "
        "per size, and the head's coefficient on the max item beside the T1 bound. Writes "
        "max_retrieval.csv/.png/.json into --out."
    )
    parser.add_argument(
        "--config",
        choices=sorted(CONFIGS),
        default="quick",
        help="quick: 3 seeds, 4000 steps, CPU in ~10 minutes; full: 10 seeds, 20000 steps, "
        "for a GPU (default quick)",
    )
    parser.add_argument("--seeds", type=_positive_int, metavar="N", help="number of seeds")
    parser.add_argument("--steps", type=_positive_int, metavar="N", help="training steps")
    parser.add_argument(
        "--sizes", type=_sizes, metavar="N,N,...", help="evaluation sizes (default 16,...,16384)"
    )
    parser.add_argument(
        "--eval-sets", type=_positive_int, metavar="N", help="evaluation sets per seed and size"
    )
    parser.add_argument(
        "--eval-items",
        type=_nonnegative_int,
        metavar="N",
        help="cap on items per seed and size (fewer sets at large n); 0 = no cap",
    )
    parser.add_argument("--seed", type=_nonnegative_int, metavar="S", help="first seed (default 0)")
    parser.add_argument(
        "--max-minutes", type=_positive_float, metavar="M", help="training time budget in minutes"
    )
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="where to run (default auto: cuda when available)",
    )
    parser.add_argument(
        "--chunk-items",
        type=_positive_int,
        metavar="N",
        help="items per seed evaluated at once (default 65536 on CPU, 1048576 on CUDA)",
    )
    parser.add_argument(
        "--out",
        default="max_retrieval_out",
        metavar="DIR",
        help="folder for max_retrieval.csv/.png/.json (default ./max_retrieval_out)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def resolve_config(args: argparse.Namespace) -> Config:
    """The named configuration with the explicit flags applied."""
    cfg = CONFIGS[getattr(args, "config", None) or "quick"]
    changes: dict[str, Any] = {}
    for flag, key in (
        ("seeds", "seeds"),
        ("steps", "steps"),
        ("sizes", "sizes"),
        ("eval_sets", "eval_sets"),
        ("seed", "base_seed"),
        ("max_minutes", "max_minutes"),
    ):
        value = getattr(args, flag, None)
        if value is not None:
            changes[key] = value
    items = getattr(args, "eval_items", None)
    if items is not None:
        changes["eval_items"] = None if items == 0 else items
    if changes:
        cfg = replace(cfg, **changes)
    return cfg


def _error(message: str) -> int:
    sys.stderr.write(f"softmaxtheory reproduce max-retrieval: error: {message}\n")
    return 2


def _resolve_device(name: str) -> Any:
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"--device cuda: CUDA is not available to this torch ({torch.__version__}); "
            "use --device cpu"
        )
    return torch.device(name)


def run_experiment(
    cfg: Config,
    device: Any = "cpu",
    *,
    chunk_items: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Train and evaluate; return the summary rows and the raw measurements.

    Parameters
    ----------
    cfg : Config
        The settings.
    device : :class:`!torch.device` or str, default "cpu"
        Where everything runs.
    chunk_items : int, optional
        Items per seed evaluated at once (default by device).
    progress : bool, default True
        Show progress bars on stderr.

    Returns
    -------
    dict
        ``rows`` (``_max_retrieval_report.summarize()``), ``results``
        (per-seed ``_max_retrieval_model.SizeResult``), ``train``
        (``_max_retrieval_model.TrainLog``), ``timing`` (seconds).
    """
    import torch

    from softmaxtheory.experiments._max_retrieval_model import (
        MaxRetrievalModel,
        evaluate_size,
        train,
    )
    from softmaxtheory.experiments._max_retrieval_report import Progress, summarize

    device = torch.device(device)
    if chunk_items is None:
        chunk_items = 1 << 20 if device.type == "cuda" else 1 << 16
    t0 = time.perf_counter()
    seeds = range(cfg.base_seed, cfg.base_seed + cfg.seeds)
    model = MaxRetrievalModel(seeds, width=cfg.width).to(device)
    bar = Progress(cfg.steps, "train", enabled=progress)

    def on_step(step: int, losses: list[float] | None) -> None:
        extra = None if losses is None else "loss " + "/".join(f"{x:.3f}" for x in losses)
        bar.update(step, extra)

    log = train(
        model,
        cfg.steps,
        batch=cfg.batch,
        lr=cfg.lr,
        weight_decay=cfg.weight_decay,
        max_seconds=None if cfg.max_minutes is None else 60.0 * cfg.max_minutes,
        on_step=on_step,
    )
    bar.close()
    t1 = time.perf_counter()
    total = sum(cfg.sets_for(n) * n for n in cfg.sizes)
    bar = Progress(total, "eval ", enabled=progress)
    results = []
    done = 0
    for n in cfg.sizes:
        results.append(evaluate_size(model, n, cfg.sets_for(n), chunk_items=chunk_items))
        done += cfg.sets_for(n) * n
        r = results[-1]
        bar.update(
            done, f"n={n}: {100 * r.baseline_acc.mean():.1f}% / {100 * r.adaptive_acc.mean():.1f}%"
        )
    bar.close()
    t2 = time.perf_counter()
    return {
        "rows": summarize(results),
        "results": results,
        "train": log,
        "timing": {"train_s": t1 - t0, "eval_s": t2 - t1, "total_s": t2 - t0},
    }


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _device_name(device: Any) -> str:
    import torch

    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def main(args: argparse.Namespace) -> int:
    """Run ``softmaxtheory reproduce max-retrieval``; return the exit status (2: bad usage)."""
    cfg = resolve_config(args)
    try:
        import matplotlib  # noqa: F401
        import scipy  # noqa: F401
        import torch
    except ImportError as exc:
        return _error(
            f"this experiment needs torch, scipy and matplotlib ({exc}); "
            "pip install 'softmaxtheory[experiments]'"
        )
    try:
        device = _resolve_device(getattr(args, "device", "auto") or "auto")
    except ValueError as exc:
        return _error(str(exc))
    out = Path(getattr(args, "out", None) or "max_retrieval_out")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return _error(f"--out {str(out)!r}: cannot create the folder ({exc.strerror or exc})")

    from softmaxtheory.experiments._max_retrieval_report import (
        format_table,
        plot_results,
        write_csv,
    )

    device_name = _device_name(device)
    progress = not getattr(args, "no_progress", False)
    if progress:
        sys.stderr.write(
            f"max retrieval, {cfg.name}: {cfg.seeds} seeds x {cfg.steps} steps, "
            f"sizes {cfg.sizes[0]}..{cfg.sizes[-1]}, on {device_name}\n"
        )
    run = run_experiment(
        cfg, device, chunk_items=getattr(args, "chunk_items", None), progress=progress
    )
    rows = run["rows"]
    log = run["train"]
    title = (
        f"max retrieval ({cfg.name}): {cfg.seeds} seeds, {log.steps} steps, "
        f"batch {cfg.batch}, {device.type}"
    )
    files = {
        "csv": str(write_csv(rows, out / "max_retrieval.csv")),
        "png": str(plot_results(rows, out / "max_retrieval.png", title=title)),
        "json": str(out / "max_retrieval.json"),
    }
    record = _finite(
        {
            "config": asdict(cfg),
            "device": device_name,
            "torch": torch.__version__,
            "train": asdict(log),
            "timing": run["timing"],
            "sizes": rows,
            "per_seed": [r.as_dict() for r in run["results"]],
            "files": files,
        }
    )
    text = json.dumps(record, indent=1) + "\n"
    Path(files["json"]).write_text(text, encoding="utf-8")
    if getattr(args, "json", False):
        sys.stdout.write(text)
        return 0
    timing = run["timing"]
    print(
        f"max retrieval ({cfg.name}), {cfg.seeds} seeds, {log.steps} steps of batch {cfg.batch}, "
        f"{device_name}; train {timing['train_s']:.0f} s, eval {timing['eval_s']:.0f} s; "
        "accuracy % mean ± std over seeds, paper = ten seeds"
    )
    print(format_table(rows))
    print("wrote " + ", ".join(files.values()))
    return 0
