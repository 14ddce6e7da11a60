r"""Tables, CSV files, JSON and plots of a :class:`~.measure.Experiment`.

Written by :func:`write_outputs` into one folder:

``heads.csv``
    Every head at every length, full precision (one row per length, layer, head).
``table.csv``
    The per-head table at the largest length, rounded for reading (the docs show it).
``summary.csv``
    Statistics over the heads beside the paper's Gemma 2B figures.
``lengths.csv``
    Statistics over the heads at each length (rounded for reading).
``layers.csv``
    Each layer's input-norm bound :math:`B_l` beside the largest norm measured
    (rounded for reading; ``results.json`` has full precision).
``results.json``
    All of the above with the run's settings (also printed by ``--json``).
``spread_per_head.png``, ``max_coefficient.png``, ``spread_histogram.png``, ``spread_vs_length.png``
    The plots.
"""

from __future__ import annotations

import csv
import json
import math
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ... import bounds
from .measure import EPS, PAPER_GEMMA_2B, Experiment, LengthResult, summarize
from .model import MAX_POSITIONS, PACKAGE, require

__all__ = [
    "FILES",
    "PLOTS",
    "format_report",
    "format_size",
    "head_rows",
    "summary_rows",
    "t1_log_gap",
    "to_json",
    "write_outputs",
    "write_plots",
]

#: The CSV and JSON files :func:`write_outputs` writes.
FILES = ("heads.csv", "table.csv", "summary.csv", "lengths.csv", "layers.csv", "results.json")

#: The PNG files :func:`write_plots` writes.
PLOTS = (
    "spread_per_head.png",
    "max_coefficient.png",
    "spread_histogram.png",
    "spread_vs_length.png",
)

_TABLE_HEADER = (
    "Layer",
    "Head",
    "Spread (max)",
    "Spread (mean)",
    "T9 bound (B)",
    "T9 bound (folded)",
    "Max coef.",
    "T1 bound",
    "n* (eps=0.5)",
)


def format_size(n: int) -> str:
    """A dispersion size for reading: exact up to :math:`10^9`, else 3 significant digits.

    Rounded up (:func:`softmaxtheory.bounds.size_text` with ``rounding="up"``): the
    size is a length from which no coefficient reaches ε, and "from 1.44e+21 items
    on" would be false of the lengths between 1.44e21 and 1,441,282,107,237,970,579,163.

    Examples
    --------
    >>> format_size(297), format_size(1441282107237970579163)
    ('297', '1.45e+21')
    """
    n = int(n)
    if n <= 10**9:
        return str(n)
    mantissa, exponent = bounds.size_text(n, 3, rounding="up").split("e+")
    return f"{mantissa}e+{int(exponent):02d}"


def _heads(exp: Experiment) -> list[tuple[int, int]]:
    return [(layer, head) for layer in range(exp.layers) for head in range(exp.heads)]


def head_rows(exp: Experiment, result: LengthResult, *, rounded: bool) -> list[list[Any]]:
    """One row per head of `result`, columns as in :data:`_TABLE_HEADER`.

    Parameters
    ----------
    exp : Experiment
        The run (for the weight bounds).
    result : LengthResult
        One length.
    rounded : bool
        Strings rounded for reading (True) or full-precision numbers.

    Returns
    -------
    list of list
    """
    rows = []
    hb = exp.bounds
    for layer, head in _heads(exp):
        i = (layer, head)
        values = [
            float(result.spread_max[i]),
            float(result.spread_mean[i]),
            float(hb.weight[i]),
            float(hb.folded[i]),
            float(result.max_coefficient[i]),
            float(result.t1_bound[i]),
            int(result.dispersion_size[i]),
        ]
        gap_obs = float(result.log_gap[i])
        gap_t1 = t1_log_gap(result.length, values[0])
        if rounded:
            text = [
                f"{values[0]:.2f}",
                f"{values[1]:.2f}",
                f"{values[2]:.0f}",
                f"{values[3]:.0f}",
                _coef(values[4], gap_obs),
                _coef(values[5], gap_t1),
                format_size(values[6]),
            ]
            rows.append([layer, head, *text])
        else:
            rows.append([layer, head, *values])
    return rows


def _coef(x: float, log_gap: float | None = None) -> str:
    r"""A coefficient in [0, 1] with 4 decimals, or as ``1-g`` when it is within 5e-5 of 1.

    `log_gap` is :math:`\log(1 - x)` when known more accurately than from `x`.
    """
    if log_gap is None:
        log_gap = math.log1p(-x) if x < 1.0 else -math.inf
    if log_gap > math.log(5e-5):
        return f"{x:.4f}"
    if log_gap == -math.inf:
        return "1"
    t = log_gap / math.log(10)
    e = math.floor(t)
    mant = 10 ** (t - e)
    if f"{mant:.1f}" == "10.0":
        mant, e = 1.0, e + 1
    return f"1-{mant:.1f}e{e:+03d}"


def t1_log_gap(n: int, spread: float) -> float:
    r""":math:`\log(1 - \mathrm{T1})`, T1 :math:`= 1/(1 + (n-1)e^{-\delta})`, in float64.

    :math:`1 - \mathrm{T1} = (n-1)e^{-\delta} / (1 + (n-1)e^{-\delta})`, so the log
    is :math:`\log(n-1) - \delta - \log(1 + (n-1)e^{-\delta})`: finite for any
    spread (used for display only; the checks use the certified bound).

    Examples
    --------
    >>> round(t1_log_gap(2, 0.0), 12) == round(math.log(0.5), 12)
    True
    """
    if n < 2:
        return -math.inf
    return math.log(n - 1) - spread - math.log1p((n - 1) * math.exp(-spread))


def summary_rows(exp: Experiment) -> list[list[str]]:
    """The summary beside the paper's Gemma 2B figures, as rows of strings.

    Columns: statistic, this run, the paper.
    """
    last = exp.last
    s_max = summarize(last, "max")
    s_mean = summarize(last, "mean")
    s_glob = summarize(last, "global")
    s_text = summarize(last, "text")
    ratio = last.spread_max / exp.bounds.folded
    p = PAPER_GEMMA_2B
    return [
        [
            "model",
            f"all-MiniLM-L6-v2 ({exp.layers} layers x {exp.heads} heads, d = 384, bidirectional)",
            "Gemma 2B (decoder)",
        ],
        ["text", f"{last.length} tokens: {exp.text.source}", f"~{p['tokens']} tokens of code"],
        ["heads", str(s_max.heads), "-"],
        [
            "spread, mean ± std (per head: max over rows)",
            f"{s_max.mean:.2f} ± {s_max.std:.2f}",
            f"{p['mean']} ± {p['std']}",
        ],
        [
            "spread, range (per head: max over rows)",
            f"{s_max.min:.2f} – {s_max.max:.2f}",
            f"{p['min']} – {p['max']} (secondary source)",
        ],
        ["spread, median (per head: max over rows)", f"{s_max.median:.2f}", "-"],
        [
            "spread, mean ± std (per head: mean over rows)",
            f"{s_mean.mean:.2f} ± {s_mean.std:.2f} (range {s_mean.min:.2f} – {s_mean.max:.2f})",
            "-",
        ],
        [
            "spread, mean ± std (per head: all logits pooled)",
            f"{s_glob.mean:.2f} ± {s_glob.std:.2f} (range {s_glob.min:.2f} – {s_glob.max:.2f})",
            "-",
        ],
        [
            "spread, mean ± std (per head: max over rows, [CLS] and [SEP] left out)",
            f"{s_text.mean:.2f} ± {s_text.std:.2f} (range {s_text.min:.2f} – {s_text.max:.2f})",
            "-",
        ],
        [
            "n* (eps = 0.5) at the mean spread",
            format_size(s_max.dispersion_size),
            str(int(bounds.dispersion_size(EPS, p["mean"]))),
        ],
        [
            "T9 weight bound (B), mean over heads",
            f"{float(np.mean(exp.bounds.weight)):.0f}",
            "-",
        ],
        [
            "T9 weight bound (folded), mean over heads",
            f"{float(np.mean(exp.bounds.folded)):.0f}",
            "-",
        ],
        [
            "T9 weight bound (folded), range over heads",
            f"{float(np.min(exp.bounds.folded)):.0f} – {float(np.max(exp.bounds.folded)):.0f}",
            "-",
        ],
        [
            "spread / folded T9 bound, median (largest)",
            f"{float(np.median(ratio)):.3f} ({float(np.max(ratio)):.3f})",
            "-",
        ],
        [
            "n* (eps = 0.5) at the smallest folded T9 bound",
            format_size(bounds.dispersion_size(EPS, float(np.min(exp.bounds.folded)))),
            "-",
        ],
    ]


def _length_rows(exp: Experiment) -> list[list[Any]]:
    rows = []
    for r in exp.results:
        st = summarize(r, "max")
        rows.append(
            [
                r.length,
                st.mean,
                st.std,
                st.min,
                st.median,
                st.max,
                float(np.min(r.max_coefficient)),
                float(np.median(r.max_coefficient)),
                int(np.sum(r.max_coefficient >= EPS)),
            ]
        )
    return rows


_LENGTH_HEADER = (
    "n",
    "spread mean",
    "spread std",
    "spread min",
    "spread median",
    "spread max",
    "max coef. (smallest head)",
    "max coef. (median head)",
    "heads with max coef. >= 0.5",
)


def _layer_rows(exp: Experiment) -> list[list[Any]]:
    rows = []
    for layer in range(exp.layers):
        y = max(float(r.input_norm_max[layer]) for r in exp.results)
        z = max(float(r.normalized_norm_max[layer]) for r in exp.results)
        rows.append([layer, float(exp.bounds.input_norm[layer]), y, exp.bounds.normalized_norm, z])
    return rows


def _length_rows_text(exp: Experiment) -> list[list[str]]:
    """:func:`_length_rows` rounded for reading."""
    return [
        [str(r[0]), *(f"{v:.2f}" for v in r[1:6]), _coef(r[6]), _coef(r[7]), str(r[8])]
        for r in _length_rows(exp)
    ]


def _layer_rows_text(exp: Experiment) -> list[list[str]]:
    """:func:`_layer_rows` rounded for reading (norms of z to 6 decimals: they touch sqrt(d))."""
    return [
        [str(r[0]), f"{r[1]:.4f}", f"{r[2]:.4f}", f"{r[3]:.6f}", f"{r[4]:.6f}"]
        for r in _layer_rows(exp)
    ]


_LAYER_HEADER = ("layer", "B_l", "largest norm of y", "sqrt(d)", "largest norm of z")


def format_report(exp: Experiment) -> str:
    """The text printed by the command: per-head table, per-length and per-layer lines, summary.

    Parameters
    ----------
    exp : Experiment
        A finished run.

    Returns
    -------
    str
    """
    last = exp.last
    lines = [
        f"all-MiniLM-L6-v2: {exp.layers * exp.heads} attention heads, n = {last.length} tokens "
        f"(context limit {MAX_POSITIONS}), {exp.dtype}",
        f"text: {exp.text.source} (sha256 {exp.text.sha256[:12]}...)",
        "spread = max over query rows of (max_j x_ij - min_j x_ij); T1 bound at (n, spread); "
        f"n* = dispersion_size(eps={EPS}, spread)",
        "",
    ]
    rows = [[str(c) for c in row] for row in head_rows(exp, last, rounded=True)]
    lines += _table(list(_TABLE_HEADER), rows)
    lines += ["", "Per length (statistics over the heads of the per-head spread):"]
    lines += _table(list(_LENGTH_HEADER), _length_rows_text(exp))
    lines += ["", "Layer inputs (LayerNorm outputs y = gamma*z + beta) against their bounds:"]
    lines += _table(list(_LAYER_HEADER), _layer_rows_text(exp))
    lines += ["", f"Summary over the heads at n = {last.length}, beside the paper:"]
    lines += _table(["statistic", "this run", "paper (Gemma 2B)"], summary_rows(exp))
    worst = max(float(np.max(r.t1_ratio)) for r in exp.results)
    lines += [
        "",
        "checks passed: every coefficient <= its row's T1 bound "
        f"(largest ratio {worst:.10f}); every spread <= both T9 weight bounds; "
        "every layer input <= B_l",
    ]
    return "\n".join(lines)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if j else c.ljust(w)
            for j, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return [line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def _write_csv(path: Path, header: list[str] | tuple[str, ...], rows: list[list[Any]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(header)
        for row in rows:
            w.writerow([repr(c) if isinstance(c, float) else c for c in row])


def to_json(exp: Experiment, command: str | None = None) -> dict[str, Any]:
    """Everything measured, with the settings, as JSON-ready data (sizes as exact ints).

    Parameters
    ----------
    exp : Experiment
        A finished run.
    command : str, optional
        The command line, recorded as given.

    Returns
    -------
    dict
    """
    torch = require("torch", "torch")
    per_length = []
    for r in exp.results:
        per_length.append(
            {
                "n": r.length,
                "heads": [
                    {
                        "layer": layer,
                        "head": head,
                        "spread_max": float(r.spread_max[layer, head]),
                        "spread_mean": float(r.spread_mean[layer, head]),
                        "spread_global": float(r.spread_global[layer, head]),
                        "spread_text": float(r.spread_text[layer, head]),
                        "norm_bound": float(r.norm_bound[layer, head]),
                        "max_coefficient": float(r.max_coefficient[layer, head]),
                        "log_one_minus_max_coefficient": float(r.log_gap[layer, head]),
                        "t1_bound": float(r.t1_bound[layer, head]),
                        "t1_ratio": float(r.t1_ratio[layer, head]),
                        "dispersion_size": int(r.dispersion_size[layer, head]),
                    }
                    for layer, head in _heads(exp)
                ],
                "input_norm_max": [float(v) for v in r.input_norm_max],
                "normalized_norm_max": [float(v) for v in r.normalized_norm_max],
            }
        )
    summary = {st: vars(summarize(exp.last, st)) for st in ("max", "mean", "global", "text")}
    return {
        "experiment": "minilm-spread",
        "command": command,
        "model": {"package": PACKAGE[0], "layers": exp.layers, "heads": exp.heads},
        "context_limit": MAX_POSITIONS,
        "dtype": exp.dtype,
        "text": {"source": exp.text.source, "sha256": exp.text.sha256},
        "lengths": list(exp.lengths),
        "eps": EPS,
        "bounds": {
            "input_norm": [float(v) for v in exp.bounds.input_norm],
            "normalized_norm": exp.bounds.normalized_norm,
            "weight": exp.bounds.weight.tolist(),
            "folded": exp.bounds.folded.tolist(),
        },
        "results": per_length,
        "summary": summary,
        "paper_gemma_2b": dict(PAPER_GEMMA_2B),
        "versions": {"python": platform.python_version(), "torch": torch.__version__},
    }


def write_outputs(
    exp: Experiment,
    out: Path,
    *,
    command: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[Path]:
    """Write the CSV files, ``results.json`` and the plots into `out` (created if needed).

    Returns
    -------
    list of pathlib.Path
        The files written.
    """
    out.mkdir(parents=True, exist_ok=True)
    written = []
    all_rows = []
    for r in exp.results:
        for row in head_rows(exp, r, rounded=False):
            layer, head = row[0], row[1]
            all_rows.append(
                [
                    r.length,
                    *row,
                    float(r.spread_global[layer, head]),
                    float(r.spread_text[layer, head]),
                    float(r.norm_bound[layer, head]),
                    float(r.t1_ratio[layer, head]),
                    float(r.log_gap[layer, head]),
                ]
            )
    header = [
        "n",
        "layer",
        "head",
        "spread_max",
        "spread_mean",
        "weight_bound",
        "folded_bound",
        "max_coefficient",
        "t1_bound",
        "dispersion_size",
        "spread_global",
        "spread_text",
        "norm_bound",
        "t1_ratio",
        "log_one_minus_max_coefficient",
    ]
    files = {
        "heads.csv": (header, all_rows),
        "table.csv": (list(_TABLE_HEADER), head_rows(exp, exp.last, rounded=True)),
        "summary.csv": (["statistic", "this run", "paper (Gemma 2B)"], summary_rows(exp)),
        "lengths.csv": (list(_LENGTH_HEADER), _length_rows_text(exp)),
        "layers.csv": (list(_LAYER_HEADER), _layer_rows_text(exp)),
    }
    for name, (head, rows) in files.items():
        _write_csv(out / name, head, rows)
        written.append(out / name)
    (out / "results.json").write_text(
        json.dumps(to_json(exp, command), indent=1) + "\n", encoding="utf-8"
    )
    written.append(out / "results.json")
    written += write_plots(exp, out, progress=progress)
    return written


def write_plots(
    exp: Experiment, out: Path, *, progress: Callable[[str], None] | None = None
) -> list[Path]:
    """Draw the four PNG plots of :data:`PLOTS` into `out`.

    Returns
    -------
    list of pathlib.Path
    """
    mpl = require("matplotlib", "matplotlib")
    mpl.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    # drawn for a text column of 650-800 px: 7.2 in wide, text at 11-12 pt, legends
    # below the axes (never over the data)
    style = {"font.size": 12, "legend.fontsize": 11, "axes.titlesize": 12}
    with plt.rc_context(style):
        say = progress or (lambda _line: None)
        last = exp.last
        p = PAPER_GEMMA_2B
        colors = plt.get_cmap("viridis")(np.linspace(0, 0.9, exp.layers))
        paths = [out / name for name in PLOTS]

        # 1. spread per head, with the bounds
        say(f"plotting {paths[0].name}")
        fig, ax = plt.subplots(figsize=(7.2, 6.4))
        idx = np.arange(exp.layers * exp.heads)
        ax.semilogy(
            idx, exp.bounds.weight.ravel(), "v", ms=4, color="tab:red", label="T9 bound (B)"
        )
        ax.semilogy(
            idx, exp.bounds.folded.ravel(), "^", ms=4, color="tab:orange", label="T9 bound (folded)"
        )
        ax.semilogy(
            idx,
            last.norm_bound.ravel(),
            "s",
            ms=3,
            color="tab:purple",
            label=r"$2s\,\max\|q\|\max\|k\|$ (measured norms)",
        )
        ax.semilogy(
            idx,
            last.spread_max.ravel(),
            "o",
            ms=4,
            color="tab:blue",
            label="spread (max over rows)",
        )
        ax.semilogy(
            idx,
            last.spread_mean.ravel(),
            ".",
            ms=4,
            color="tab:cyan",
            label="spread (mean over rows)",
        )
        ax.axhline(
            p["mean"], ls="--", color="gray", lw=1, label=f"Gemma 2B mean spread {p['mean']}"
        )
        for layer in range(1, exp.layers):
            ax.axvline(layer * exp.heads - 0.5, color="lightgray", lw=0.8)
        ax.set_xticks(np.arange(exp.layers) * exp.heads + (exp.heads - 1) / 2)
        ax.set_xticklabels([f"L{layer}" for layer in range(exp.layers)])
        ax.set_xlim(-1, exp.layers * exp.heads)
        ax.set_ylabel("logit spread")
        ax.set_xlabel("head, grouped by layer")
        ax.set_title(f"Spread of each head at n = {last.length} and its bounds")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
        fig.savefig(paths[0], dpi=110, bbox_inches="tight")
        plt.close(fig)

        # 2. max coefficient against T1: per head (left), and as a function of n (right)
        say(f"plotting {paths[1].name}")
        fig, (ax0, ax) = plt.subplots(2, 1, figsize=(7.2, 13), layout="constrained")
        ns = np.array(exp.lengths)
        ln10 = math.log(10)
        lcolors = plt.get_cmap("plasma")(np.linspace(0, 0.85, len(exp.results)))
        floor = -16.0  # log10 gaps below this are drawn at the edge (one head saturates)
        clipped = 0
        lo_all = 0.0
        for r, color in zip(exp.results, lcolors, strict=True):
            obs = r.log_gap.ravel() / ln10
            t1 = np.array([t1_log_gap(r.length, float(d)) for d in r.spread_max.ravel()]) / ln10
            out_x, out_y = t1 < floor, obs < floor
            clipped += int(np.sum(out_x | out_y))
            lo_all = min(lo_all, float(np.min(np.maximum(t1, floor))), float(np.min(obs)))
            ax0.scatter(
                np.maximum(t1, floor),
                np.maximum(obs, floor),
                s=9,
                color=color,
                alpha=0.8,
                marker="o",
                label=f"n = {r.length}",
            )
        lo_all = max(lo_all, floor) - 0.5
        ax0.plot([lo_all, 0], [lo_all, 0], color="k", lw=0.8, label="observed = T1 bound")
        ax0.set_xlim(lo_all, 0.3)
        ax0.set_ylim(lo_all, 0.3)
        if clipped:
            ax0.text(
                0.97,
                0.04,
                f"{clipped} point(s) below {floor:.0f} drawn on the edge",
                fontsize=11,
                ha="right",
                transform=ax0.transAxes,
            )
        ax0.set_xlabel(r"$\log_{10}(1 - \mathrm{T1\ bound})$ at the head's spread")
        ax0.set_ylabel(r"$\log_{10}(1 - \max_{ij}\alpha_{ij})$ observed")
        ax0.set_title(
            "Each head: largest coefficient vs its T1 bound\n"
            "(T1 holds: every point on or above the line)",
        )
        ax0.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3, frameon=False)
        for layer in range(exp.layers):
            for head in range(exp.heads):
                mc = [r.max_coefficient[layer, head] for r in exp.results]
                ax.plot(
                    ns,
                    mc,
                    "-o",
                    ms=2,
                    lw=0.5,
                    alpha=0.5,
                    color=colors[layer],
                    label=f"layer {layer}" if head == 0 else None,
                )
        st = summarize(last, "max")
        grid = np.unique(np.round(np.logspace(math.log10(2), 9, 160)).astype(np.int64))
        curves = [
            (st.min, "k", "-", f"T1 bound at the smallest head spread {st.min:.2f}"),
            (st.median, "k", "--", f"T1 bound at the median head spread {st.median:.2f}"),
            (p["mean"], "tab:red", ":", f"T1 bound at Gemma 2B's mean spread {p['mean']}"),
        ]
        for spread, color, ls, label in curves:
            ax.plot(
                grid, bounds.max_coefficient(grid, spread), ls=ls, color=color, lw=1.3, label=label
            )
        ax.plot(grid, 1.0 / grid, color="gray", lw=0.8, label="1/n (uniform)")
        ax.axhline(EPS, color="lightgray", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("n (tokens)")
        ax.set_ylabel("largest attention coefficient")
        ax.set_ylim(0, 1.02)
        ax.set_title(
            "Largest coefficient of each head at the lengths measured,\n"
            "beside T1 bound curves (each head obeys its own curve)",
        )
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
        fig.savefig(paths[1], dpi=110, bbox_inches="tight")
        plt.close(fig)

        # 3. histogram of spreads, Gemma 2B marked
        say(f"plotting {paths[2].name}")
        fig, ax = plt.subplots(figsize=(7.2, 5.6))
        s = last.spread_max.ravel()
        lo = min(float(s.min()), p["min"]) * 0.9
        hi = max(float(s.max()), p["max"]) * 1.1
        ax.hist(
            s,
            bins=np.geomspace(lo, hi, 30),
            color="tab:blue",
            alpha=0.75,
            label=f"MiniLM heads (n = {last.length})",
        )
        ax.axvspan(st.mean - st.std, st.mean + st.std, color="tab:blue", alpha=0.12)
        ax.axvline(
            st.mean,
            color="tab:blue",
            lw=1.5,
            label=f"MiniLM mean ± std {st.mean:.2f} ± {st.std:.2f}",
        )
        ax.axvspan(p["mean"] - p["std"], p["mean"] + p["std"], color="tab:red", alpha=0.15)
        ax.axvline(
            p["mean"],
            color="tab:red",
            lw=1.5,
            label=f"Gemma 2B mean ± std {p['mean']} ± {p['std']}",
        )
        ax.axvline(
            p["min"], color="tab:red", lw=0.8, ls=":", label=f"Gemma 2B range {p['min']}–{p['max']}"
        )
        ax.axvline(p["max"], color="tab:red", lw=0.8, ls=":")
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(ticker.ScalarFormatter())
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        ax.yaxis.set_major_locator(ticker.MaxNLocator(integer=True))
        ax.set_xlabel("per-head logit spread (max over rows)")
        ax.set_ylabel("heads")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=1, frameon=False)
        fig.savefig(paths[2], dpi=110, bbox_inches="tight")
        plt.close(fig)

        # 4. spread vs length
        say(f"plotting {paths[3].name}")
        fig, ax = plt.subplots(figsize=(7.2, 6.4))
        per_n = np.array([r.spread_max.ravel() for r in exp.results])  # (lengths, heads)
        for layer in range(exp.layers):
            for head in range(exp.heads):
                ax.plot(
                    ns,
                    [r.spread_max[layer, head] for r in exp.results],
                    lw=0.5,
                    alpha=0.45,
                    color=colors[layer],
                    label=f"layer {layer}" if head == 0 else None,
                )
        q25, q50, q75 = np.percentile(per_n, [25, 50, 75], axis=1)
        ax.fill_between(
            ns, q25, q75, color="k", alpha=0.12, label="25th–75th percentile over heads"
        )
        ax.plot(ns, q50, "k--", lw=1.2, label="median over heads")
        ax.plot(ns, per_n.mean(axis=1), "k-o", ms=3, lw=1.5, label="mean over heads")
        ax.axhline(
            p["mean"],
            ls="--",
            color="tab:red",
            lw=1,
            label=f"Gemma 2B mean {p['mean']} (~{p['tokens']} tokens)",
        )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(ns)
        ax.xaxis.set_major_formatter(ticker.ScalarFormatter())
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        ax.yaxis.set_major_formatter(ticker.ScalarFormatter())
        ax.yaxis.set_minor_formatter(ticker.NullFormatter())
        ax.set_xlabel("n (tokens, prefixes of one text)")
        ax.set_ylabel("per-head spread (max over rows)")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
        fig.savefig(paths[3], dpi=110, bbox_inches="tight")
        plt.close(fig)
        return paths
