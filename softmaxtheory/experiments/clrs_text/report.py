r"""Statistics, tables, CSV and plot of the CLRS-Text experiment (private).

Needs numpy at import; scipy (the paired t-test) and matplotlib are imported
by the functions that use them.

For each algorithm and size the per-seed scores of two variants are compared
by a two-sided paired t-test over seeds (differences :math:`d_s = a_s - b_s`,
:math:`t = \bar d / (s_d/\sqrt S)`, :math:`S - 1` degrees of freedom): the
adaptive temperature trained in against softmax, and the adaptive temperature
at inference only against softmax (the same trained weights).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._command import paired_ttest

__all__ = [
    "CSV_COLUMNS",
    "METRICS",
    "MIN_VERDICT_SEEDS",
    "PAPER_FINDINGS",
    "VARIANTS",
    "findings",
    "format_table",
    "plot_results",
    "summarize",
    "write_csv",
]

#: The three variants: softmax, adaptive in training and inference, adaptive at inference only.
VARIANTS: tuple[str, ...] = ("softmax", "adaptive", "inference_only")

#: Scores per example: answer-token accuracy (the primary score), exact answer
#: (what greedy decoding writes), exact final output (given the true trace).
METRICS: tuple[str, ...] = ("token_acc", "exact", "output_exact")

#: What the paper reports for Gemma 2B fine-tuned on CLRS-Text, per algorithm
#: run here: the adaptive temperature (trained in) helps on nearly all thirty
#: algorithms and is worse on these three; at inference only it did not work.
PAPER_FINDINGS: dict[str, str] = {
    "insertion_sort": "better",
    "bubble_sort": "worse",
    "heapsort": "worse",
    "quicksort": "better",
    "minimum": "better",
    "binary_search": "better",
    "find_maximum_subarray_kadane": "better",
    "mst_kruskal": "worse",
}

#: Columns of the CSV written by :func:`write_csv`, in order.
CSV_COLUMNS: tuple[str, ...] = (
    "algorithm",
    "size",
    "in_distribution",
    "examples",
    "answer_tokens",
    *(f"{v}_{m}_{s}" for m in METRICS for v in VARIANTS for s in ("mean", "std")),
    "p_adaptive",
    "p_adaptive_note",
    "p_inference_only",
    "p_inference_only_note",
)


def _std(x: np.ndarray) -> float:
    return float(np.std(x, ddof=1)) if x.size > 1 else math.nan


def summarize(evaluations: Sequence[Any], train_sizes: Sequence[int]) -> list[dict[str, Any]]:
    """One row per algorithm and size: means and standard deviations over seeds (percent), tests.

    Parameters
    ----------
    evaluations : sequence of ``clrs_text.model.Evaluation``
    train_sizes : sequence of int
        Sizes seen in training (``in_distribution``).
    """
    rows = []
    for ev in evaluations:
        row: dict[str, Any] = {
            "algorithm": ev.algorithm,
            "size": int(ev.size),
            "seeds": int(np.asarray(ev.token_acc["softmax"]).size),
            "in_distribution": int(ev.size) in set(train_sizes),
            "examples": int(ev.examples),
            "answer_tokens": float(ev.answer_tokens),
        }
        for metric in METRICS:
            scores = getattr(ev, metric)
            for v in VARIANTS:
                x = np.asarray(scores[v], dtype=np.float64)
                row[f"{v}_{metric}_mean"] = 100.0 * float(np.mean(x))
                row[f"{v}_{metric}_std"] = 100.0 * _std(x)
        for v in ("adaptive", "inference_only"):
            p, note = paired_ttest(ev.token_acc[v], ev.token_acc["softmax"])
            row[f"p_{v}"] = p
            row[f"p_{v}_note"] = note
        rows.append(row)
    return rows


#: Seeds a size needs before its t-test counts toward a verdict: with two, the test's
#: variance rests on one difference, and two near-equal gains give any p at all (gains
#: of 1.66 and 1.70 points gave p = 0.02, and the row read "better").
MIN_VERDICT_SEEDS = 3


def findings(rows: Sequence[dict[str, Any]], alpha: float = 0.05) -> list[dict[str, Any]]:
    r"""Per algorithm: the out-of-distribution gains beside the paper's finding.

    For each variant ``v`` in (adaptive, inference_only): ``{v}_gain`` is the
    mean over the sizes not seen in training of the difference in
    answer-token accuracy (points) against softmax; ``{v}_better`` and
    ``{v}_worse`` count those sizes where the paired t-test gives
    :math:`p < \alpha` in either direction, over at least
    :data:`MIN_VERDICT_SEEDS` seeds. ``here`` reads ``better`` or ``worse``
    when at least one size is significant in that direction and none in the
    other, ``too few seeds`` when no size has the seeds, else ``no clear
    difference``.
    """
    out = []
    for algo in dict.fromkeys(r["algorithm"] for r in rows):
        ood = [r for r in rows if r["algorithm"] == algo and not r["in_distribution"]]
        item: dict[str, Any] = {
            "algorithm": algo,
            "paper": PAPER_FINDINGS.get(algo, ""),
            "ood_sizes": [r["size"] for r in ood],
        }
        for v in ("adaptive", "inference_only"):
            diffs = [r[f"{v}_token_acc_mean"] - r["softmax_token_acc_mean"] for r in ood]
            tested = [r for r in ood if r.get("seeds", MIN_VERDICT_SEEDS) >= MIN_VERDICT_SEEDS]
            sig = [
                (r[f"{v}_token_acc_mean"] > r["softmax_token_acc_mean"])
                for r in tested
                if not math.isnan(r[f"p_{v}"]) and r[f"p_{v}"] < alpha
            ]
            better, worse = sum(sig), len(sig) - sum(sig)
            item[f"{v}_gain"] = float(np.mean(diffs)) if diffs else math.nan
            item[f"{v}_better"] = better
            item[f"{v}_worse"] = worse
            if ood and not tested:
                item[f"{v}_here"] = "too few seeds"
            elif better and not worse:
                item[f"{v}_here"] = "better"
            elif worse and not better:
                item[f"{v}_here"] = "worse"
            else:
                item[f"{v}_here"] = "no clear difference"
        out.append(item)
    return out


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.6g}"
    return str(value)


def write_csv(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Write the rows of :func:`summarize` to `path` (columns :data:`CSV_COLUMNS`)."""
    path = Path(path)
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(CSV_COLUMNS)
        for row in rows:
            writer.writerow([_cell(row[c]) for c in CSV_COLUMNS])
    return path


def _p(value: float) -> str:
    if math.isnan(value):
        return "  -  "
    if value == 0.0:
        return "0"  # the same non-zero difference in every seed: the t-test's limit
    return f"{value:.0e}" if value < 0.01 else f"{value:.2f}"


def format_table(rows: Sequence[dict[str, Any]], summary: Sequence[dict[str, Any]]) -> str:
    """Answer-token accuracy per algorithm and size, then the findings beside the paper's."""
    head = (
        f"{'algorithm':<28} {'n':>3} {'dist':>4} | {'softmax %':>11} {'adaptive %':>11} "
        f"{'p':>5} | {'inf-only %':>11} {'p':>5} | exact % s/a/i"
    )
    lines = [head, "-" * len(head)]

    def pct(r: dict[str, Any], v: str) -> str:
        std = r[f"{v}_token_acc_std"]
        s = "" if math.isnan(std) else f"±{std:4.1f}"
        return f"{r[f'{v}_token_acc_mean']:5.1f}{s}"

    for r in rows:
        exact = "/".join(f"{r[f'{v}_exact_mean']:.0f}" for v in VARIANTS)
        lines.append(
            f"{r['algorithm']:<28} {r['size']:>3} {'in' if r['in_distribution'] else 'out':>4} | "
            f"{pct(r, 'softmax'):>11} {pct(r, 'adaptive'):>11} {_p(r['p_adaptive']):>5} | "
            f"{pct(r, 'inference_only'):>11} {_p(r['p_inference_only']):>5} | {exact}"
        )
    lines.append("")
    head2 = (
        f"{'algorithm':<28} | {'paper':>6} | {'adaptive: gain':>14} {'+/-':>5} {'here':>8} | "
        f"{'inf-only: gain':>14} {'+/-':>5} {'here':>8}"
    )
    lines += [head2, "-" * len(head2)]
    for f in summary:
        lines.append(
            f"{f['algorithm']:<28} | {f['paper']:>6} | {f['adaptive_gain']:+14.2f} "
            f"{f['adaptive_better']:>2}/{f['adaptive_worse']:<2} {f['adaptive_here'][:8]:>8} | "
            f"{f['inference_only_gain']:+14.2f} {f['inference_only_better']:>2}/"
            f"{f['inference_only_worse']:<2} {f['inference_only_here'][:8]:>8}"
        )
    lines.append(
        "accuracy: answer tokens predicted right given the true prefix (mean ± std over seeds); "
        "p: paired t-test over seeds against softmax; exact: whole answer right (greedy "
        "decoding). gain: mean over out-of-distribution sizes (points); +/-: sizes with "
        "p < 0.05 better/worse; paper: Gemma 2B, adaptive trained in (inference only: no gain)"
    )
    least = MIN_VERDICT_SEEDS
    few = sorted({r["seeds"] for r in rows if r.get("seeds", least) < least})
    if few:
        seeds = f"{few[0]} seed{'' if few[0] == 1 else 's'}"
        lines.append(
            f"{seeds}: too few for a verdict (at least {least}; with two, the t-test's "
            "variance rests on a single difference)"
        )
    return "\n".join(lines)


_COLORS = {"softmax": "C0", "adaptive": "C3", "inference_only": "C2"}
_LABELS = {
    "softmax": "softmax",
    "adaptive": "adaptive (train + inference)",
    "inference_only": "adaptive at inference only",
}


def plot_results(
    rows: Sequence[dict[str, Any]],
    path: str | Path,
    *,
    train_sizes: Sequence[int] = (),
    title: str = "",
) -> Path:
    """One panel per algorithm: accuracy against size for the three variants.

    Solid lines: answer-token accuracy (mean ± std over seeds, bands); dashed:
    exact answers. The sizes seen in training are shaded.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    algos = list(dict.fromkeys(r["algorithm"] for r in rows))
    cols = min(4, len(algos))
    nrows = math.ceil(len(algos) / cols)
    fig = Figure(figsize=(3.6 * cols, 3.0 * nrows + 0.6), dpi=110)
    FigureCanvasAgg(fig)
    axes = np.atleast_1d(fig.subplots(nrows, cols, squeeze=False)).ravel()
    for ax, algo in zip(axes, algos, strict=False):
        sub = [r for r in rows if r["algorithm"] == algo]
        n = np.array([r["size"] for r in sub], dtype=float)
        if train_sizes:
            ax.axvspan(min(train_sizes) - 0.5, max(train_sizes) + 0.5, color="0.9", lw=0)
        for v in VARIANTS:
            mean = np.array([r[f"{v}_token_acc_mean"] for r in sub])
            std = np.nan_to_num(np.array([r[f"{v}_token_acc_std"] for r in sub]))
            ax.plot(n, mean, "o-", color=_COLORS[v], ms=3, label=_LABELS[v])
            ax.fill_between(n, mean - std, mean + std, color=_COLORS[v], alpha=0.12)
            ax.plot(n, [r[f"{v}_exact_mean"] for r in sub], "--", color=_COLORS[v], lw=1, alpha=0.7)
        ax.set_title(algo, fontsize=9)
        ax.set_ylim(-2, 102)
        ax.set_xticks(n)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in axes[len(algos) :]:
        ax.set_visible(False)
    for ax in axes[::cols]:
        ax.set_ylabel("accuracy (%)", fontsize=8)
    for ax in axes[-cols:]:
        ax.set_xlabel("problem size n", fontsize=8)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle(
        (title + "\n" if title else "")
        + "solid: answer-token accuracy (± std over seeds); dashed: exact answers; "
        "shaded: training sizes",
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    path = Path(path)
    fig.savefig(path)
    return path
