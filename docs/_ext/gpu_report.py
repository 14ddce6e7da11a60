r"""The GPU run on the docs' pages: reST from the JSON of ``softmaxtheory bench --device cuda``.

Not a Sphinx extension: :doc:`performance` and :doc:`torch` call :func:`report` from a
``computed-rst`` directive (``docs/_ext`` is on ``sys.path`` while the docs build). The
run is the file that ``python tools/gpu_check.py --write-docs`` writes,
``docs/performance/bench_cuda_h200.json`` (:func:`softmaxtheory.bench.torch.measure`'s
document). Every figure is read from it or computed from it here; while the file is
absent, the section says so and gives the command.

Ratios are device times over SDPA's time in the same row (the median of the run's
timed calls, CUDA events): forward cases over ``sdpa``, forward + backward cases over
``sdpa_fwd_bwd``. Peak memory is the growth of ``torch.cuda.max_memory_allocated``
during one call, over SDPA's in the same row.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

__all__ = ["PARTS", "TARGETS", "load", "measured", "report"]

#: The targets of the GPU issue (#13), each ``(key, what, limit)``: a measured ratio
#: must be at most ``limit``; :func:`report` gives each one's worst case in the run.
TARGETS: tuple[tuple[str, str, float], ...] = (
    ("forward", "forward (``auto``) at every shape, causal and not", 1.6),
    ("backward", "forward + backward, β attached", 2.2),
    ("detached", "forward + backward, ``detach_beta=True``", 1.4),
    ("memory", "peak memory of ``auto``, forward and forward + backward", 1.5),
    ("entropy", "``attention_entropy`` against SDPA's forward", 0.7),
)

#: The parts :func:`report` can give, in their order.
PARTS = ("run", "forward", "backward", "masked", "targets", "tiles")

_FORWARD = (("auto", "auto"), ("composition", "composition"), ("triton", "Triton"),
            ("attention_entropy", "entropy"))  # fmt: skip
_BACKWARD = (("auto_fwd_bwd", "auto"), ("auto_fwd_bwd_detached", "detach_beta"))


def load(path: Path) -> dict[str, Any] | None:
    """The run's document, or None when the file does not exist."""
    path = Path(path)
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def _shape(row: dict[str, Any]) -> str:
    return "(" + ", ".join(map(str, row["shape"])) + ")"


def _ratio(row: dict[str, Any], name: str, base: str, key: str = "seconds") -> float | None:
    """`name`'s `key` over `base`'s in `row`: None if either failed, NaN if `base`'s is 0."""
    case, ref = row.get(name, {}), row.get(base, {})
    if key not in case or key not in ref:
        return None
    return case[key] / ref[key] if ref[key] else math.nan


def _cell(row: dict[str, Any], name: str, base: str, key: str = "seconds") -> str:
    """The ratio's table cell: "failed" where a case failed, "–" where none was timed."""
    if "error" in row or any("error" in row.get(n, {}) for n in (name, base)):
        return "failed"
    x = _ratio(row, name, base, key)
    return "–" if x is None or math.isnan(x) else f"{x:.2f}×"


def _table(caption: str, header: list[str], body: list[list[str]]) -> list[str]:
    lines = [f".. list-table:: {caption}", "   :header-rows: 1", ""]
    for row in [header, *body]:
        lines.append(f"   * - {row[0]}")
        lines += [f"     - {cell}" for cell in row[1:]]
    return [*lines, ""]


def _literal(text: str, limit: int = 400) -> str:
    """`text` (an exception's message) as one inline literal: one line, no double backquote."""
    text = " ".join(str(text).split()).replace("``", "'")
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return f"``{text}``" if text else "(no message)"


def _errors(rows: list[dict[str, Any]], names: tuple[str, ...]) -> list[str]:
    """A list of the failures in `rows`: whole rows, and single cases."""
    out = []
    for row in rows:
        where = f"{_shape(row)}, {'causal' if row['causal'] else 'not causal'}"
        if "error" in row:
            out.append(f"- {where}: {_literal(row['error'])}")
        for name in names:
            if "error" in row.get(name, {}):
                out.append(f"- {where}, ``{name}``: {_literal(row[name]['error'])}")
    return [*out, ""] if out else []


def _speed_table(
    caption: str, rows: list[dict[str, Any]], base: str, cases: tuple[tuple[str, str], ...]
) -> list[str]:
    """A table of `rows`: `base`'s (SDPA's) ms, each case's time and ``cases[0]``'s peak
    over `base`'s; then the failures."""
    header = ["(B, H, L, S, D)", "causal", "SDPA ms"] + [f"{t} × SDPA" for _, t in cases]
    header.append(f"peak, {cases[0][1]} × SDPA")
    body = []
    for row in rows:
        sdpa = row.get(base, {}).get("seconds")
        body.append(
            [_shape(row), "yes" if row["causal"] else "no",
             "failed" if sdpa is None else f"{sdpa * 1e3:.3f}"]
            + [_cell(row, name, base) for name, _ in cases]
            + [_cell(row, cases[0][0], base, "peak_bytes")]
        )  # fmt: skip
    names = (base, *(n for n, _ in cases))
    return _table(caption, header, body) + _errors(rows, names)


def _forward(doc: dict[str, Any]) -> list[str]:
    return _speed_table("Forward, bfloat16: time against SDPA's", doc["rows"], "sdpa", _FORWARD)


def _backward(doc: dict[str, Any]) -> list[str]:
    rows = doc.get("backward_rows", [])
    if not rows:
        return []
    caption = "Forward + backward, bfloat16: time against SDPA's"
    return _speed_table(caption, rows, "sdpa_fwd_bwd", _BACKWARD)


def _masked(doc: dict[str, Any]) -> list[str]:
    """The masked rows (``masked_rows``): a sentence on the mask, then a table per pass.

    They are not among the targets' cases, which are the issue's shapes without a mask.
    """
    rows = doc.get("masked_rows", [])
    if not rows:
        return []
    lines = [
        "With a boolean key-padding mask of shape (B, 1, 1, S), SDPA given the same mask: "
        "sequence :math:`b` of the batch attends to its first :math:`S - (b \\bmod 4 + 1)"
        "\\lfloor S/8 \\rfloor` keys "
        "(``softmaxtheory.bench.torch.key_padding_mask``).",
        "",
    ]
    fwd = [r for r in rows if r["pass"] == "forward"]
    bwd = [r for r in rows if r["pass"] != "forward"]
    if fwd:
        lines += _speed_table("Forward with a key-padding mask, bfloat16: time against "
                              "SDPA's", fwd, "sdpa", _FORWARD)  # fmt: skip
    if bwd:
        lines += _speed_table("Forward + backward with a key-padding mask, bfloat16: time "
                              "against SDPA's", bwd, "sdpa_fwd_bwd", _BACKWARD)  # fmt: skip
    return lines


def _worst(doc: dict[str, Any], key: str) -> tuple[float | None, int, int]:
    """(worst ratio, cases measured, cases wanted) of one target over the run."""
    fwd, bwd = doc["rows"], doc.get("backward_rows", [])
    wanted = {
        "forward": [(r, "auto", "sdpa", "seconds") for r in fwd],
        "backward": [(r, "auto_fwd_bwd", "sdpa_fwd_bwd", "seconds") for r in bwd],
        "detached": [(r, "auto_fwd_bwd_detached", "sdpa_fwd_bwd", "seconds") for r in bwd],
        "memory": [(r, "auto", "sdpa", "peak_bytes") for r in fwd]
        + [(r, "auto_fwd_bwd", "sdpa_fwd_bwd", "peak_bytes") for r in bwd],
        "entropy": [(r, "attention_entropy", "sdpa", "seconds") for r in fwd],
    }[key]
    got = [x for x in (_ratio(*w) for w in wanted) if x is not None and not math.isnan(x)]
    return (max(got) if got else None), len(got), len(wanted)


def _targets(doc: dict[str, Any]) -> list[str]:
    lines = []
    for key, what, limit in TARGETS:
        worst, got, wanted = _worst(doc, key)
        if worst is None:
            verdict = "not measured"
        else:
            verdict = f"worst {worst:.2f}× — {'met' if worst <= limit else 'not met'}"
            if got < wanted:
                verdict += f" over the {got} of {wanted} cases measured"
        lines.append(f"- {what}: at most {limit}× SDPA; {verdict}.")
    return [*lines, ""]


def _tiles(doc: dict[str, Any]) -> list[str]:
    """The tile sweep's summary: per kernel, the fastest launch configuration."""
    sweep = doc.get("tiles")
    if not sweep:
        return []
    from softmaxtheory.bench.tiles import summarize

    rows = sweep.get("rows", [])
    if not rows:
        return [f"The tile sweep did not run: {_literal(sweep.get('error', 'no rows'))}.", ""]
    shapes = {r["kernel"]: _shape(r) for r in rows}
    lines = [
        f"The tile sweep: the median of {sweep.get('repeat')} calls of each launch "
        "configuration, written (BLOCK_M, BLOCK_N, warps, stages), of the pass-1 kernel "
        "and its two backward kernels; the launched one is the first that the kernel's "
        "ladder tries.",
        "",
    ]
    body = [f"- {_literal(line)} at {shapes[line.split(':')[0]]}" for line in summarize(rows)]
    return [*lines, *body, ""]


def _run(doc: dict[str, Any]) -> list[str]:
    note = (
        ""
        if doc.get("complete")
        else " The run stopped before its end (its time limit): the tables hold the cases "
        "it measured."
    )
    return [
        f"One run of ``softmaxtheory bench --device cuda`` on {doc['date'][:10]} (UTC): "
        f"{doc['device']}, torch {doc['torch']}, Triton {doc['triton']}, CUDA {doc['cuda']}, "
        f"bfloat16 inputs, the {doc['statistic']} of {doc['repeat']} timed calls after a "
        f"warm-up call (CUDA events), against "
        "``torch.nn.functional.scaled_dot_product_attention`` (SDPA) at the same shape; "
        "peak memory is the growth of ``torch.cuda.max_memory_allocated`` during one call." + note,
        "",
    ]


def measured(path: Path) -> str:
    """One sentence: when and where the run at `path` measured the torch path, if it did."""
    doc = load(path)
    if doc is None:
        return (
            "Speed on a GPU has not been measured for this design yet: it was built and "
            "tested without one."
        )
    return (
        f"Speed on a GPU was measured on {doc['date'][:10]}, on one {doc['device']} "
        f"(torch {doc['torch']}, Triton {doc['triton']})."
    )


def report(path: Path, parts: tuple[str, ...] = PARTS) -> str:
    """reST for the run at `path`: the `parts` of :data:`PARTS` that are asked for.

    While `path` does not exist, one paragraph saying that no run is recorded and how
    to make one.
    """
    unknown = set(parts) - set(PARTS)
    if unknown:
        raise ValueError(f"unknown parts {sorted(unknown)}; choose from {PARTS}")
    doc = load(path)
    if doc is None:
        return (
            "No GPU run of the current kernels is recorded yet. On a machine with a CUDA "
            "device, ``python tools/gpu_check.py --write-docs`` writes "
            f"``docs/performance/{Path(path).name}``, which this section reads.\n"
        )
    out: list[str] = []
    for part in PARTS:
        if part in parts:
            out += {"run": _run, "forward": _forward, "backward": _backward,
                    "masked": _masked, "targets": _targets, "tiles": _tiles}[part](doc)  # fmt: skip
    return "\n".join(out)
