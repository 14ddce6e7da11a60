"""CPU benchmark of the torch attention paths: ``softmaxtheory bench --section attention``.

Times :func:`softmaxtheory.accelerated.torch.attention_entropy` and
:func:`~softmaxtheory.accelerated.torch.adaptive_attention` (``auto``, which is the T10
composition on the CPU; the hybrid, whose pass 1 there is the torch one; the chunked
path) against :func:`torch.nn.functional.scaled_dot_product_attention` on CPU tensors,
causal and not, forward and forward + backward, each as its best wall time and its ratio
to SDPA's time in the same pass, measured in the same run. A case that fails is
recorded with its error and the run goes on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = [
    "ATTENTION_SHAPES",
    "FORWARD_CASES",
    "QUICK_ATTENTION_SHAPES",
    "attention_cases",
    "format_attention",
    "run_attention",
]

#: (B, H, L, S, D) of the section's cases.
ATTENTION_SHAPES: tuple[tuple[int, int, int, int, int], ...] = ((1, 8, 2048, 2048, 64),)

#: ``--quick``: one small shape.
QUICK_ATTENTION_SHAPES: tuple[tuple[int, int, int, int, int], ...] = ((1, 2, 128, 128, 32),)

#: The cases of each row, forward or forward + backward, in the order they are timed (SDPA
#: first: the base of the row's ratios).
FORWARD_CASES = ("sdpa", "attention_entropy", "auto", "hybrid", "chunked")


def attention_cases(torch: Any, q: Any, k: Any, v: Any, causal: bool, backward: bool) -> dict:
    """The timed calls of one row: name to a function of no arguments.

    Forward + backward cases run the backward of the sum of the outputs weighted by
    fixed random tensors (for ``attention_entropy``, of both its entropy and its
    log-sum-exp), with the gradients of ``q``, ``k`` and ``v`` dropped after each call.
    """
    from softmaxtheory.accelerated.torch import adaptive_attention, attention_entropy

    sdpa = torch.nn.functional.scaled_dot_product_attention
    calls: dict[str, Callable[..., Any]] = {
        "sdpa": lambda a, b, c: sdpa(a, b, c, is_causal=causal),
        "attention_entropy": lambda a, b, c: attention_entropy(a, b, is_causal=causal),
        "auto": lambda a, b, c: adaptive_attention(a, b, c, is_causal=causal),
        "hybrid": lambda a, b, c: adaptive_attention(a, b, c, is_causal=causal, backend="hybrid"),
        "chunked": lambda a, b, c: adaptive_attention(a, b, c, is_causal=causal, backend="chunked"),
    }
    calls = {name: calls[name] for name in FORWARD_CASES}  # (the documented order)
    if not backward:
        return {name: (lambda f=f: f(q, k, v)) for name, f in calls.items()}
    g = torch.Generator().manual_seed(1)
    weights = torch.randn(q.shape[:-1] + v.shape[-1:], generator=g, dtype=q.dtype)
    row_weights = torch.randn(2, *q.shape[:-1], generator=g, dtype=torch.float32)
    leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))

    def step(f: Callable[..., Any]) -> Callable[[], None]:
        def run() -> None:
            try:
                out = f(*leaves)
                if isinstance(out, tuple):  # attention_entropy: (entropy, lse)
                    loss = sum(((o * w).sum() for o, w in zip(out, row_weights, strict=True)))
                else:
                    loss = (out * weights).sum()
                loss.backward()
            finally:  # the next call starts with no gradients held
                for t in leaves:
                    t.grad = None

        return run

    return {name: step(f) for name, f in calls.items()}


def run_attention(
    shapes: tuple[tuple[int, int, int, int, int], ...],
    repeat: int,
    threads: int | None = None,
    say: Callable[[str], None] = lambda msg: None,
) -> list[dict[str, Any]]:
    """Time every case at every shape, causal and not, forward and forward + backward.

    Parameters
    ----------
    shapes : tuple of tuple of int
        (B, H, L, S, D) of each row's float32 inputs (standard normal, seeded).
    repeat : int
        Each case's time is its best over at least `repeat` calls lasting at least
        :data:`softmaxtheory.bench.MIN_SECONDS` together.
    threads : int, optional
        ``torch.set_num_threads`` for the run (restored after it).
    say : callable, optional
        Progress messages.

    Returns
    -------
    list of dict
        One row per (shape, causal, pass): ``shape``, ``dtype``, ``causal``, ``pass``,
        ``threads`` and ``cases``, name to ``{"seconds", "ratio_to_sdpa"}`` or
        ``{"error"}``.
    """
    import torch

    from . import best_time

    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    rows: list[dict[str, Any]] = []
    try:
        for shape in shapes:
            B, H, L, S, D = shape
            g = torch.Generator().manual_seed(0)
            q, k, v = (torch.randn(B, H, n, D, generator=g) for n in (L, S, S))
            for backward in (False, True):
                for causal in (False, True):
                    row = {
                        "shape": list(shape), "dtype": "float32", "causal": causal,
                        "pass": "forward+backward" if backward else "forward",
                        "threads": torch.get_num_threads(), "cases": {},
                    }  # fmt: skip
                    context = torch.enable_grad() if backward else torch.no_grad()
                    with context:
                        for name, fn in attention_cases(torch, q, k, v, causal, backward).items():
                            say(f"timing {name} ({row['pass']}) at {shape}"
                                f"{' causal' if causal else ''} ...")  # fmt: skip
                            try:
                                row["cases"][name] = {"seconds": best_time(fn, repeat)}
                            except Exception as exc:  # one case failing must not stop the run
                                row["cases"][name] = {"error": f"{type(exc).__name__}: {exc}"}
                    base = row["cases"]["sdpa"].get("seconds")
                    for case in row["cases"].values():
                        if "seconds" in case and base:
                            case["ratio_to_sdpa"] = case["seconds"] / base
                    rows.append(row)
    finally:
        torch.set_num_threads(before)
    return rows


def format_attention(rows: list[dict[str, Any]]) -> list[str]:
    """The text table of :func:`run_attention`'s rows."""
    lines = [
        "adaptive attention on CPU tensors, float32: best time, and its ratio to SDPA's in the "
        "same pass",
        f"{'(B, H, L, S, D)':<24} {'mask':<7} {'pass':<17} {'case':<18} {'ms':>9} {'x SDPA':>7}",
    ]
    for row in rows:
        mask = "causal" if row["causal"] else "none"
        for name, case in row["cases"].items():
            head = f"{tuple(row['shape'])!s:<24} {mask:<7} {row['pass']:<17} {name:<18}"
            if "error" in case:
                lines.append(f"{head} failed: {case['error']}")
            else:
                ratio = case.get("ratio_to_sdpa")
                ratio_text = "" if ratio is None else f"{ratio:.2f}"
                lines.append(f"{head} {case['seconds'] * 1e3:>9.2f} {ratio_text:>7}")
    return lines
