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
import sys
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

from .._command import (
    UsageError,
    add_run_options,
    device_name,
    nonnegative_int,
    positive_float,
    positive_int,
    prepare,
    sizes_parser,
    usage_error,
    write_json,
)

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


_sizes = sizes_parser(1)


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
    parser.add_argument("--seeds", type=positive_int, metavar="N", help="number of seeds")
    parser.add_argument("--steps", type=positive_int, metavar="N", help="training steps")
    parser.add_argument(
        "--sizes", type=_sizes, metavar="N,N,...", help="evaluation sizes (default 16,...,16384)"
    )
    parser.add_argument(
        "--eval-sets", type=positive_int, metavar="N", help="evaluation sets per seed and size"
    )
    parser.add_argument(
        "--eval-items",
        type=nonnegative_int,
        metavar="N",
        help="cap on items per seed and size (fewer sets at large n); 0 = no cap",
    )
    parser.add_argument("--seed", type=nonnegative_int, metavar="S", help="first seed (default 0)")
    parser.add_argument(
        "--max-minutes", type=positive_float, metavar="M", help="training time budget in minutes"
    )
    parser.add_argument(
        "--chunk-items",
        type=positive_int,
        metavar="N",
        help="items per seed evaluated at once (default 65536 on CPU, 1048576 on CUDA)",
    )
    add_run_options(parser, "max_retrieval")


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
        ``rows`` (``max_retrieval.report.summarize()``), ``results``
        (per-seed ``max_retrieval.model.SizeResult``), ``train``
        (``max_retrieval.model.TrainLog``), ``timing`` (seconds).
    """
    import torch

    from .model import MaxRetrievalModel, evaluate_size, train
    from .report import Progress, summarize

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


def main(args: argparse.Namespace) -> int:
    """Run ``softmaxtheory reproduce max-retrieval``; return the exit status (2: bad usage)."""
    cfg = resolve_config(args)
    try:
        device, out = prepare(args, "max_retrieval_out")
    except UsageError as exc:
        return usage_error("max-retrieval", str(exc))
    import torch

    from .report import format_table, plot_results, write_csv

    device_text = device_name(device)
    progress = not getattr(args, "no_progress", False)
    if progress:
        sys.stderr.write(
            f"max retrieval, {cfg.name}: {cfg.seeds} seeds x {cfg.steps} steps, "
            f"sizes {cfg.sizes[0]}..{cfg.sizes[-1]}, on {device_text}\n"
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
    text = write_json(
        {
            "config": asdict(cfg),
            "device": device_text,
            "torch": torch.__version__,
            "train": asdict(log),
            "timing": run["timing"],
            "sizes": rows,
            "per_seed": [r.as_dict() for r in run["results"]],
            "files": files,
        },
        files["json"],
    )
    if getattr(args, "json", False):
        sys.stdout.write(text)
        return 0
    timing = run["timing"]
    print(
        f"max retrieval ({cfg.name}), {cfg.seeds} seeds, {log.steps} steps of batch {cfg.batch}, "
        f"{device_text}; train {timing['train_s']:.0f} s, eval {timing['eval_s']:.0f} s; "
        "accuracy % mean ± std over seeds, paper = ten seeds"
    )
    print(format_table(rows))
    print("wrote " + ", ".join(files.values()))
    return 0
