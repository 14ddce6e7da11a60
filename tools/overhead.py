#!/usr/bin/env python
"""What the hybrid attention path costs beside its kernels, measured on CPU (no GPU needed).

Usage::

    python tools/overhead.py host      # host time per call, by phase (pass 1's launch stubbed)
    python tools/overhead.py memory    # peak bytes of forward + backward against SDPA's

``host``: tiny float16 tensors, so that the ops cost their dispatch only; the Triton pass 1
and β kernels are replaced by stubs that return at once (the launches' own host cost is not
measured) and the path is told Triton runs here, so the
order of the calls is the GPU path's (pass 1 queued before the scan is read). It prints
the medians, best of ``--runs`` runs of ``--calls`` calls, of: the call's start to its first
kernel (the scan's reductions), that kernel to pass 1's launch, pass 1's launch to pass 2's
(work a GPU overlaps with pass 1), and the whole call.

``memory``: the op ledger of ``tests/support/live_bytes.py`` counts the storage each op
creates and how long it lives, with the Triton kernels run by Triton's interpreter
(``TRITON_INTERPRET=1``, set here before Triton is imported), float16, β attached, a row
block of the β gradient an eighth of the queries, as at the GPU benchmark's shape.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: (B, H, L, D) of ``memory``: the β gradient's row block is an eighth of the queries there.
MEMORY_SHAPE = (8, 2, 64, 32)


def host(calls: int, runs: int) -> dict[str, float]:
    """Median host microseconds of each phase of a hybrid call (best of `runs`)."""
    import torch

    from softmaxtheory.accelerated import _torch_attention as A  # noqa: N812
    from softmaxtheory.accelerated import _triton_attention as tri
    from softmaxtheory.accelerated import _triton_beta as TB  # noqa: N812
    from softmaxtheory.accelerated.torch import adaptive_attention

    torch.set_num_threads(1)
    q, k, v = (torch.randn(1, 1, 16, 16).half() for _ in range(3))
    marks: dict[str, float] = {}
    magnitude, sdpa = A._magnitude, A.F.scaled_dot_product_attention

    def first_kernel(t):
        marks.setdefault("first", time.perf_counter())
        return magnitude(t)

    def pass1(q4, *args, **kwargs):
        marks["pass1"] = time.perf_counter()
        empty = torch.zeros(q4.shape[:3])
        return empty, empty.clone()

    def pass2(*args, **kwargs):
        marks["pass2"] = time.perf_counter()
        return sdpa(*args, **kwargs)

    A.triton_available = lambda device: True
    tri.triton_entropy = pass1
    # the β kernel's launch, stubbed like pass 1's (its host cost on a GPU is not seen here)
    TB.triton_polynomial_beta = lambda schedule, h, dtype: torch.ones(h.shape, dtype=dtype)
    A._magnitude = first_kernel
    A.F = type("F", (), {"scaled_dot_product_attention": staticmethod(pass2)})
    phases = ("call to first kernel", "first kernel to pass 1", "pass 1 to pass 2", "call")
    best = dict.fromkeys(phases, float("inf"))
    with torch.no_grad():
        for _ in range(runs):
            seen: dict[str, list[float]] = {name: [] for name in phases}
            for _ in range(calls):
                marks.clear()
                start = time.perf_counter()
                adaptive_attention(q, k, v, backend="hybrid")
                end = time.perf_counter()
                seen[phases[0]].append(marks["first"] - start)
                seen[phases[1]].append(marks["pass1"] - marks["first"])
                seen[phases[2]].append(marks["pass2"] - marks["pass1"])
                seen[phases[3]].append(end - start)
            for name, values in seen.items():
                best[name] = min(best[name], statistics.median(values) * 1e6)
    return best


def memory_ledgers() -> dict[str, object]:
    """The op ledgers of forward + backward, SDPA and the hybrid, causal and not.

    Keys ``"sdpa"``, ``"hybrid"``, ``"sdpa causal"``, ``"hybrid causal"``; each an
    ``OpLedger`` (its ``peak`` and ``outputs``). ``tests/test_triton_interpret.py``
    reads these same ledgers for the memory target.
    """
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, str(ROOT))
    import torch

    from softmaxtheory.accelerated import _torch_attention as A  # noqa: N812
    from tests.support.live_bytes import attention_fwd_bwd

    B, H, L, D = MEMORY_SHAPE
    A.CHUNK_ELEMENTS = B * H * L * D // 8
    g = torch.Generator().manual_seed(0)
    ledgers = {}
    for causal in (False, True):
        q, k, v, grad = (torch.randn(B, H, L, D, generator=g).half() for _ in range(4))
        for name in ("sdpa", "hybrid"):
            ledgers[f"{name}{' causal' if causal else ''}"] = attention_fwd_bwd(
                name, q, k, v, grad, causal
            )
    return ledgers


def memory_report(peaks: dict[str, int]) -> list[str]:
    """The lines ``memory`` prints: each mask's peaks and the hybrid's ratio to SDPA's."""
    lines = []
    for causal in ("", " causal"):
        hybrid, sdpa = peaks[f"hybrid{causal}"], peaks[f"sdpa{causal}"]
        lines.append(f"forward + backward{causal or ' full'}: hybrid {hybrid} bytes, "
                     f"SDPA {sdpa} bytes, {hybrid / sdpa:.2f}x")  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> int:
    """Measure what is asked for and print it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("host", "memory"))
    parser.add_argument("--calls", type=int, default=1500, help="calls per run (host)")
    parser.add_argument("--runs", type=int, default=5, help="runs, the best kept (host)")
    args = parser.parse_args(argv)
    if args.what == "host":
        for name, us in host(args.calls, args.runs).items():
            print(f"{name:<24} {us:8.0f} us")
    else:
        peaks = {name: ledger.peak for name, ledger in memory_ledgers().items()}
        print("\n".join(memory_report(peaks)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
