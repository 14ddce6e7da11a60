r"""Statistics, tables, CSV and plot of the max-retrieval experiment.

Needs numpy only at import; scipy (the paired t-test) and matplotlib
(the plot) are imported inside the functions that use them.

At each size, the per-seed accuracies :math:`a_s` (adaptive) and :math:`b_s`
(baseline) are compared by the paired t-test of :func:`paired_ttest` (shared
with the CLRS-Text experiment); :class:`Progress` is the experiments' progress
bar.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._command import Progress, paired_ttest

__all__ = [
    "CSV_COLUMNS",
    "PAPER_ADAPTIVE",
    "PAPER_BASELINE",
    "PAPER_P_VALUES",
    "Progress",
    "format_table",
    "paired_ttest",
    "plot_results",
    "summarize",
    "write_csv",
]

#: The paper's baseline accuracy (%, mean of ten seeds) at each evaluation size.
PAPER_BASELINE: dict[int, float] = {
    16: 98.6,
    32: 97.1,
    64: 94.3,
    128: 89.7,
    256: 81.3,
    512: 70.1,
    1024: 53.8,
    2048: 35.7,
    4096: 22.6,
    8192: 15.7,
    16384: 12.4,
}

#: The paper's accuracy (%) with the adaptive temperature (none reported at 8192).
PAPER_ADAPTIVE: dict[int, float | None] = {
    16: 98.6,
    32: 97.1,
    64: 94.5,
    128: 89.9,
    256: 82.1,
    512: 72.5,
    1024: 57.7,
    2048: 39.4,
    4096: 24.9,
    8192: None,
    16384: 14.0,
}

#: Paired t-test p-values of the paper at the sizes where they are reported
#: (from summaries of the paper, not its text).
PAPER_P_VALUES: dict[int, float] = {
    16: 0.4,
    64: 2e-3,
    256: 2e-4,
    1024: 1e-4,
    4096: 2e-2,
    16384: 4e-3,
}

#: Columns of the CSV written by :func:`write_csv`, in order.
CSV_COLUMNS: tuple[str, ...] = (
    "n",
    "eval_sets",
    "baseline_mean",
    "baseline_std",
    "adaptive_mean",
    "adaptive_std",
    "p_value",
    "p_note",
    "paper_baseline",
    "paper_adaptive",
    "paper_p_value",
    "max_item_coef",
    "max_item_coef_adaptive",
    "max_item_coef_largest",
    "t1_bound",
    "t6_adaptive_bound",
    "spread",
    "spread_mean",
    "entropy_mean",
    "beta_mean",
)


def _std(x: np.ndarray) -> float:
    return float(np.std(x, ddof=1)) if x.size > 1 else math.nan


def summarize(results: Sequence[Any]) -> list[dict[str, Any]]:
    """One row per size: means over seeds, the t-test, the paper's numbers and the bounds.

    Parameters
    ----------
    results : sequence of SizeResult
        Per-seed measurements (:class:`.model.SizeResult`).

    Returns
    -------
    list of dict
        Keys :data:`CSV_COLUMNS`; accuracies in percent; ``spread`` is the
        largest row spread over every seed and evaluation row, ``t1_bound``
        the T1 bound at it (the largest of the per-seed bounds);
        ``max_item_coef_largest`` the largest baseline coefficient seen.
    """
    rows = []
    for r in results:
        p, note = paired_ttest(r.adaptive_acc, r.baseline_acc)
        spread = float(np.max(r.spread_max))
        adaptive_bound = np.asarray(r.adaptive_bound, dtype=np.float64)
        rows.append(
            {
                "n": int(r.n),
                "eval_sets": int(r.sets),
                "baseline_mean": 100.0 * float(np.mean(r.baseline_acc)),
                "baseline_std": 100.0 * _std(np.asarray(r.baseline_acc)),
                "adaptive_mean": 100.0 * float(np.mean(r.adaptive_acc)),
                "adaptive_std": 100.0 * _std(np.asarray(r.adaptive_acc)),
                "p_value": p,
                "p_note": note,
                "paper_baseline": PAPER_BASELINE.get(int(r.n)),
                "paper_adaptive": PAPER_ADAPTIVE.get(int(r.n)),
                "paper_p_value": PAPER_P_VALUES.get(int(r.n)),
                "max_item_coef": float(np.mean(r.baseline_coef_mean)),
                "max_item_coef_adaptive": float(np.mean(r.adaptive_coef_mean)),
                "max_item_coef_largest": float(np.max(r.baseline_coef_max)),
                # the bound is increasing in the spread and correctly rounded: the largest
                # per-seed bound is the bound at the largest spread
                "t1_bound": float(np.max(r.bound)),
                "t6_adaptive_bound": float(np.max(adaptive_bound)),
                "spread": spread,
                "spread_mean": float(np.mean(r.spread_mean)),
                "entropy_mean": float(np.mean(r.entropy_mean)),
                "beta_mean": float(np.mean(r.beta_mean)),
            }
        )
    return rows


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.6g}"
    return str(value)


def write_csv(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Write the rows of :func:`summarize` to `path` (columns :data:`CSV_COLUMNS`).

    Missing paper values are empty cells; undefined p-values are ``nan``.
    """
    path = Path(path)
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(CSV_COLUMNS)
        for row in rows:
            writer.writerow([_cell(row[c]) for c in CSV_COLUMNS])
    return path


def _pct(mean: float, std: float) -> str:
    return f"{mean:5.1f} ± {std:4.1f}" if not math.isnan(std) else f"{mean:5.1f}       "


def _paper(value: float | None) -> str:
    return "  n/a" if value is None else f"{value:5.1f}"


def _p(value: float | None) -> str:
    if value is None:
        return "     "
    if math.isnan(value):
        return "  nan"
    return f"{value:.1g}" if value < 0.01 else f"{value:.2f}"


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """The results beside the paper's, as a fixed-width text table."""
    head = (
        f"{'n':>6} {'sets':>5} | {'baseline %':>12} {'paper':>5} | {'adaptive %':>12} "
        f"{'paper':>5} | {'p':>5} {'paper':>5} | {'coef':>7} {'T1 bound':>8} {'spread':>7} "
        f"{'beta':>5}"
    )
    lines = [head, "-" * len(head)]
    notes = []
    for r in rows:
        lines.append(
            f"{r['n']:>6} {r['eval_sets']:>5} | {_pct(r['baseline_mean'], r['baseline_std']):>12} "
            f"{_paper(r['paper_baseline']):>5} | "
            f"{_pct(r['adaptive_mean'], r['adaptive_std']):>12} "
            f"{_paper(r['paper_adaptive']):>5} | {_p(r['p_value']):>5} "
            f"{_p(r['paper_p_value']):>5} | {r['max_item_coef']:7.4f} {r['t1_bound']:8.4g} "
            f"{r['spread']:7.2f} {r['beta_mean']:5.2f}"
        )
        if r["p_note"]:
            notes.append(f"n={r['n']}: p {r['p_note']}")
    lines.append(
        "coef: mean softmax coefficient on the max-priority item; T1 bound: "
        "max_coefficient(n, spread); spread: largest row logit spread; beta: mean adaptive beta"
    )
    lines.extend(notes)
    return "\n".join(lines)


def plot_results(rows: Sequence[dict[str, Any]], path: str | Path, *, title: str = "") -> Path:
    """Write a two-panel PNG: accuracy against n, and the max-item coefficient with the T1 bound.

    Parameters
    ----------
    rows : sequence of dict
        Rows of :func:`summarize`.
    path : str or Path
        The PNG file.
    title : str, optional
        Figure title.
    """
    from matplotlib import ticker
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    n = np.array([r["n"] for r in rows], dtype=float)
    # drawn for a text column 650-800 px wide: the panels stacked, text at 12 pt, each
    # legend below its panel (never over the data), powers of two on the n axis
    fig = Figure(figsize=(6.4, 9.0), dpi=130, layout="constrained")
    FigureCanvasAgg(fig)
    ax, bx = fig.subplots(2, 1)
    for key, label, color in (
        ("baseline", "softmax (this run)", "C0"),
        ("adaptive", "adaptive (this run)", "C3"),
    ):
        mean = np.array([r[f"{key}_mean"] for r in rows])
        std = np.nan_to_num(np.array([r[f"{key}_std"] for r in rows]))
        ax.plot(n, mean, "o-", color=color, label=label)
        ax.fill_between(n, mean - std, mean + std, color=color, alpha=0.15)
        paper = [(r["n"], r[f"paper_{key}"]) for r in rows if r[f"paper_{key}"] is not None]
        if paper:
            px, py = zip(*paper, strict=True)
            name = "softmax" if key == "baseline" else key
            ax.plot(px, py, "s--", color=color, alpha=0.6, mfc="none", label=f"{name} (paper)")
    ax.set_ylabel("accuracy (%)")
    ax.set_title("Accuracy (mean ± std over seeds)")
    bx.plot(n, [r["max_item_coef"] for r in rows], "o-", color="C0", label="softmax, mean")
    bx.plot(
        n, [r["max_item_coef_adaptive"] for r in rows], "o-", color="C3", label="adaptive, mean"
    )
    bx.plot(
        n,
        [r["max_item_coef_largest"] for r in rows],
        "v:",
        color="C0",
        alpha=0.6,
        label="softmax, largest",
    )
    bx.plot(n, [r["t1_bound"] for r in rows], "k-", lw=2, label="T1 bound, measured spread")
    bx.plot(n, 1.0 / n, color="gray", ls="--", label="uniform 1/n")
    bx.set_yscale("log")
    bx.yaxis.set_major_locator(ticker.LogLocator(base=10, numticks=8))
    bx.yaxis.set_minor_formatter(ticker.NullFormatter())
    bx.set_ylabel("coefficient on the max item")
    bx.set_title("Dispersion of the trained head")
    for axis in (ax, bx):
        axis.set_xscale("log", base=2)
        axis.set_xticks(n, [f"{int(v) // 1024}k" if v >= 1024 else f"{int(v)}" for v in n])
        axis.xaxis.set_minor_locator(ticker.NullLocator())
        axis.set_xlabel("items per set n")
        axis.grid(alpha=0.3)
        axis.tick_params(labelsize=12)
        axis.xaxis.label.set_size(12)
        axis.yaxis.label.set_size(12)
        axis.title.set_size(13)
        axis.legend(
            fontsize=12, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False
        )
    if title:
        fig.suptitle(title.replace(": ", ":\n", 1), fontsize=12)  # two lines: never clipped
    path = Path(path)
    fig.savefig(path)
    return path
