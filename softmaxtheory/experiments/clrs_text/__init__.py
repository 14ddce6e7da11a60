r"""The paper's second experiment at small scale: ``softmaxtheory reproduce clrs-text``.

The paper fine-tunes Gemma 2B on CLRS-Text (CLRS algorithms written out as
text: inputs, execution trace, output) with the adaptive temperature in every
attention head, during training and inference, and reports gains on nearly all
of the thirty algorithms, losses on Heapsort, MST Kruskal and Bubble Sort, and
no gain when the temperature is applied to a model trained without it. This
command reruns that comparison on eight algorithms with small decoder-only
transformers trained from scratch (many seeds batched into one model): for
each seed, one model trained with softmax attention and one with the adaptive
temperature (same initial weights, same data), evaluated on problem sizes seen
in training and larger ones, with three variants:

* ``softmax``: the softmax-trained model, softmax attention
  (``Constant(1)`` schedule);
* ``adaptive``: the adaptive-trained model, adaptive attention
  (:class:`~softmaxtheory.spec.PaperPolynomial`);
* ``inference_only``: the softmax-trained model, adaptive attention.

It writes ``clrs_text.csv``, ``clrs_text.png`` and ``clrs_text.json`` into
``--out`` and prints a table with a paired t-test per algorithm and size over
seeds and the per-algorithm findings beside the paper's. Torch, scipy and
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

__all__ = ["CONFIGS", "Config", "add_arguments", "main", "resolve_config", "run_experiment"]

_ALL = (
    "insertion_sort",
    "bubble_sort",
    "heapsort",
    "quicksort",
    "minimum",
    "binary_search",
    "find_maximum_subarray_kadane",
    "mst_kruskal",
)


@dataclass(frozen=True)
class Config:
    """Settings of one run.

    Attributes
    ----------
    name : str
        The named configuration the run starts from.
    seeds : int
        Seeds :math:`S` (the run trains :math:`2S` models).
    steps : int
        AdamW steps (one algorithm per step, in turn).
    algorithms : tuple of str
        Algorithms trained and evaluated.
    train_sizes : tuple of int
        Problem sizes of training.
    eval_sizes : tuple of int
        Problem sizes of evaluation.
    eval_examples : int
        Evaluation examples per seed, algorithm and size.
    batch : int
        Training examples per step and model.
    width : int
        Transformer width.
    layers : int
        Transformer layers.
    heads : int
        Attention heads per layer.
    lr : float
        Peak AdamW learning rate (linear warm-up, then cosine to a tenth).
    weight_decay : float
        AdamW weight decay (on the weight matrices, not on biases, norms or embeddings).
    warmup : int
        Warm-up steps.
    base_seed : int
        First seed number.
    max_minutes : float or None
        Training time budget (stop early when it runs out).
    """

    name: str
    seeds: int
    steps: int
    train_sizes: tuple[int, ...]
    eval_sizes: tuple[int, ...]
    eval_examples: int
    batch: int
    width: int
    layers: int
    heads: int
    algorithms: tuple[str, ...] = _ALL
    lr: float = 2e-3
    weight_decay: float = 0.01
    warmup: int = 50
    base_seed: int = 0
    max_minutes: float | None = None


#: The two named configurations, ``quick`` for a 2-core CPU in under ten minutes
#: and ``full`` sized (not measured) for one H200 in under eight.
CONFIGS: dict[str, Config] = {
    "quick": Config(
        name="quick",
        seeds=2,
        steps=120,
        train_sizes=(3, 4),
        eval_sizes=(3, 4, 5),
        eval_examples=8,
        batch=8,
        width=32,
        layers=2,
        heads=2,
        max_minutes=6.0,
    ),
    "full": Config(
        name="full",
        seeds=5,
        steps=3000,
        train_sizes=(3, 4, 5),
        eval_sizes=(3, 4, 5, 6, 7, 8),
        eval_examples=64,
        batch=32,
        width=128,
        layers=4,
        heads=4,
        lr=1e-3,
        warmup=200,
        max_minutes=5.0,
    ),
}


_sizes = sizes_parser(2)


def _algorithms(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    bad = [n for n in names if n not in _ALL]
    if not names or bad:
        raise argparse.ArgumentTypeError(
            f"algorithms must be a comma-separated subset of {','.join(_ALL)}, got {text!r}"
        )
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``softmaxtheory reproduce clrs-text`` to `parser`."""
    parser.description = (
        "Train small decoder-only transformers on CLRS-Text (eight algorithms, our own "
        "samplers in the benchmark's format) with softmax and with the adaptive temperature "
        "in every head, evaluate them on larger problem sizes with softmax, adaptive, and "
        "adaptive at inference only, and print the accuracies, a paired t-test per algorithm "
        "and size, and the findings beside the paper's. Writes clrs_text.csv/.png/.json."
    )
    parser.add_argument(
        "--config",
        choices=sorted(CONFIGS),
        default="quick",
        help="quick: 2 seeds, tiny models, a 2-core CPU in under 10 minutes; full: 5 seeds, "
        "larger models and sizes, sized for one H200 (default quick)",
    )
    parser.add_argument(
        "--algorithms", type=_algorithms, metavar="A,B,...", help=f"subset of {','.join(_ALL)}"
    )
    parser.add_argument("--seeds", type=positive_int, metavar="N", help="number of seeds")
    parser.add_argument("--steps", type=positive_int, metavar="N", help="training steps")
    parser.add_argument("--train-sizes", type=_sizes, metavar="N,N,...", help="training sizes")
    parser.add_argument("--eval-sizes", type=_sizes, metavar="N,N,...", help="evaluation sizes")
    parser.add_argument(
        "--eval-examples",
        type=positive_int,
        metavar="N",
        help="examples per seed, algorithm and size",
    )
    parser.add_argument("--batch", type=positive_int, metavar="N", help="examples per step")
    parser.add_argument("--width", type=positive_int, metavar="D", help="model width")
    parser.add_argument("--layers", type=positive_int, metavar="N", help="transformer layers")
    parser.add_argument("--heads", type=positive_int, metavar="N", help="heads per layer")
    parser.add_argument("--seed", type=nonnegative_int, metavar="S", help="first seed (default 0)")
    parser.add_argument(
        "--max-minutes",
        type=positive_float,
        metavar="M",
        help="training time budget in minutes (quick: 6, full: 5)",
    )
    add_run_options(parser, "clrs_text")


def resolve_config(args: argparse.Namespace) -> Config:
    """The named configuration with the explicit flags applied.

    Raises
    ------
    ValueError
        When the model shape is impossible (width not a multiple of heads with
        an even head dimension).
    """
    cfg = CONFIGS[getattr(args, "config", None) or "quick"]
    changes: dict[str, Any] = {}
    for flag, key in (
        ("algorithms", "algorithms"),
        ("seeds", "seeds"),
        ("steps", "steps"),
        ("train_sizes", "train_sizes"),
        ("eval_sizes", "eval_sizes"),
        ("eval_examples", "eval_examples"),
        ("batch", "batch"),
        ("width", "width"),
        ("layers", "layers"),
        ("heads", "heads"),
        ("seed", "base_seed"),
        ("max_minutes", "max_minutes"),
    ):
        value = getattr(args, flag, None)
        if value is not None:
            changes[key] = value
    if changes:
        cfg = replace(cfg, **changes)
    if cfg.width % cfg.heads or (cfg.width // cfg.heads) % 2:
        raise ValueError(
            f"--width must be a multiple of --heads with an even head dimension, "
            f"got width {cfg.width}, heads {cfg.heads}"
        )
    return cfg


def run_experiment(cfg: Config, device: Any = "cpu", *, progress: bool = True) -> dict[str, Any]:
    """Train and evaluate; return the rows, the findings and the raw measurements.

    Returns
    -------
    dict
        ``rows`` (``clrs_text.report.summarize()``), ``findings``,
        ``evaluations`` (per-seed ``Evaluation``), ``train``
        (``TrainLog``), ``timing`` (seconds).
    """
    import torch

    from ...spec import Constant, PaperPolynomial
    from .._command import Progress
    from .model import ClrsTextModel, evaluate, train
    from .report import findings, summarize

    device = torch.device(device)
    t0 = time.perf_counter()
    seeds = range(cfg.base_seed, cfg.base_seed + cfg.seeds)
    model = ClrsTextModel(seeds, copies=2, width=cfg.width, layers=cfg.layers, heads=cfg.heads).to(
        device
    )
    schedules = [Constant(1.0)] * cfg.seeds + [PaperPolynomial()] * cfg.seeds
    bar = Progress(cfg.steps, "train", enabled=progress)

    def on_step(step: int, losses: list[float] | None) -> None:
        extra = None
        if losses is not None:
            s = cfg.seeds
            plain = sum(losses[:s]) / s
            adapt = sum(losses[s:]) / s
            extra = f"loss softmax {plain:.3f} / adaptive {adapt:.3f}"
        bar.update(step, extra)

    log = train(
        model,
        schedules,
        cfg.steps,
        algorithms=cfg.algorithms,
        sizes=cfg.train_sizes,
        batch=cfg.batch,
        lr=cfg.lr,
        weight_decay=cfg.weight_decay,
        warmup=cfg.warmup,
        max_seconds=None if cfg.max_minutes is None else 60.0 * cfg.max_minutes,
        on_step=on_step,
    )
    bar.close()
    t1 = time.perf_counter()
    jobs = [(a, n) for a in cfg.algorithms for n in cfg.eval_sizes]
    bar = Progress(len(jobs), "eval ", enabled=progress)
    evaluations = []
    for i, (algo, n) in enumerate(jobs):
        ev = evaluate(model, algo, n, cfg.eval_examples, chunk=8 if device.type == "cpu" else 32)
        evaluations.append(ev)
        bar.update(
            i + 1,
            f"{algo} n={n}: "
            + "/".join(f"{100 * ev.token_acc[v].mean():.0f}" for v in ev.token_acc)
            + " %",
        )
    bar.close()
    t2 = time.perf_counter()
    rows = summarize(evaluations, cfg.train_sizes)
    return {
        "rows": rows,
        "findings": findings(rows),
        "evaluations": evaluations,
        "train": log,
        "timing": {"train_s": t1 - t0, "eval_s": t2 - t1, "total_s": t2 - t0},
    }


def main(args: argparse.Namespace) -> int:
    """Run ``softmaxtheory reproduce clrs-text``; return the exit status (2: bad usage)."""
    try:
        cfg = resolve_config(args)
    except ValueError as exc:
        return usage_error("clrs-text", str(exc))
    try:
        device, out = prepare(args, "clrs_text_out")
    except UsageError as exc:
        return usage_error("clrs-text", str(exc))
    import torch

    from .report import format_table, plot_results, write_csv

    device_text = device_name(device)
    progress = not getattr(args, "no_progress", False)
    if progress:
        sys.stderr.write(
            f"clrs-text, {cfg.name}: {cfg.seeds} seeds x 2 models x {cfg.steps} steps, "
            f"{len(cfg.algorithms)} algorithms, train sizes {cfg.train_sizes}, eval sizes "
            f"{cfg.eval_sizes}, on {device_text}\n"
        )
    run = run_experiment(cfg, device, progress=progress)
    rows = run["rows"]
    log = run["train"]
    title = (
        f"CLRS-Text ({cfg.name}): {cfg.seeds} seeds, {log.steps} steps, width {cfg.width}, "
        f"{cfg.layers} layers, {device.type}"
    )
    files = {
        "csv": str(write_csv(rows, out / "clrs_text.csv")),
        "png": str(
            plot_results(rows, out / "clrs_text.png", train_sizes=cfg.train_sizes, title=title)
        ),
        "json": str(out / "clrs_text.json"),
    }
    text = write_json(
        {
            "config": asdict(cfg),
            "device": device_text,
            "torch": torch.__version__,
            "train": asdict(log),
            "timing": run["timing"],
            "rows": rows,
            "findings": run["findings"],
            "per_seed": [e.as_dict() for e in run["evaluations"]],
            "files": files,
        },
        files["json"],
    )
    if getattr(args, "json", False):
        sys.stdout.write(text)
        return 0
    timing = run["timing"]
    print(
        f"CLRS-Text ({cfg.name}), {cfg.seeds} seeds x 2 models, {log.steps} steps of "
        f"{cfg.batch} examples, {device_text}; train {timing['train_s']:.0f} s, eval "
        f"{timing['eval_s']:.0f} s"
    )
    print(format_table(rows, run["findings"]))
    print("wrote " + ", ".join(files.values()))
    return 0
