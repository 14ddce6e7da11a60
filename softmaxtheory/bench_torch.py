"""GPU benchmark of adaptive attention: ``softmaxtheory bench --device cuda``.

Times :func:`softmaxtheory.accelerated.torch.adaptive_attention` (the T10
composition and the Triton kernel) against
:func:`torch.nn.functional.scaled_dot_product_attention` and prints the ratios
and the peak memory (``torch.cuda.max_memory_allocated``) of each.
"""

from __future__ import annotations

import json
import sys
from typing import Any

__all__ = ["SHAPES", "run_device"]

#: (B, H, L, S, D) cases, bfloat16.
SHAPES: tuple[tuple[int, int, int, int, int], ...] = (
    (8, 16, 4096, 4096, 64),
    (2, 16, 16384, 16384, 64),
    (1, 16, 32768, 32768, 64),
)


def _time(fn: Any, repeat: int, torch: Any) -> tuple[float, int]:
    """Best wall time (s) over `repeat` runs, and the peak memory (bytes) of one call."""
    fn()  # warm-up (compiles the Triton kernel)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    best = float("inf")
    for _ in range(repeat):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return best, peak


def run_device(args: Any) -> int:
    """Run the GPU benchmark for ``args.device``; print a table (or JSON with ``args.json``)."""
    device = str(getattr(args, "device", "cuda"))
    repeat = max(1, int(getattr(args, "repeat", 3) or 3))
    try:
        import torch
    except ImportError:
        print("error: the GPU benchmark needs torch (pip install softmaxtheory[torch])",
              file=sys.stderr)  # fmt: skip
        return 2
    if not device.startswith("cuda") or not torch.cuda.is_available():
        msg = f"error: --device {device}: no CUDA device is available here"
        print(f"{msg} (torch {torch.__version__}, cuda {torch.version.cuda})", file=sys.stderr)
        return 2
    from softmaxtheory.accelerated.torch import adaptive_attention

    try:
        import triton  # noqa: F401

        have_triton = True
    except ImportError:
        have_triton = False
    F = torch.nn.functional
    rows = []
    for B, H, L, S, D in getattr(args, "shapes", None) or SHAPES:
        g = torch.Generator(device=device).manual_seed(0)
        q, k, v = (
            torch.randn(B, H, n, D, device=device, dtype=torch.bfloat16, generator=g)
            for n in (L, S, S)
        )
        cases = {
            "sdpa": lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v),
            "composition": lambda q=q, k=k, v=v: adaptive_attention(q, k, v, backend="composition"),
        }
        if have_triton:
            cases["triton"] = lambda q=q, k=k, v=v: adaptive_attention(q, k, v, backend="triton")
        res: dict[str, Any] = {"shape": [B, H, L, S, D], "dtype": "bfloat16"}
        try:
            with torch.no_grad():
                for name, fn in cases.items():
                    print(f"timing {name} at {(B, H, L, S, D)} ...", file=sys.stderr)
                    res[name] = dict(
                        zip(("seconds", "peak_bytes"), _time(fn, repeat, torch), strict=False)
                    )
        except torch.cuda.OutOfMemoryError as exc:
            res["error"] = f"out of memory: {exc}"
        rows.append(res)
        del q, k, v
        torch.cuda.empty_cache()
    if getattr(args, "json", False):
        doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, bfloat16, "
          f"best of {repeat}")  # fmt: skip
    print(f"{'B,H,L,S,D':<24} {'backend':<12} {'ms':>9} {'x SDPA':>8} {'peak MiB':>10}")
    for res in rows:
        shape = ",".join(map(str, res["shape"]))
        if "error" in res:
            print(f"{shape:<24} {res['error']}")
            continue
        base = res["sdpa"]["seconds"]
        for name in ("sdpa", "composition", "triton"):
            if name in res:
                r = res[name]
                print(f"{shape:<24} {name:<12} {r['seconds'] * 1e3:>9.3f} "
                      f"{r['seconds'] / base:>8.2f} {r['peak_bytes'] / 2**20:>10.1f}")  # fmt: skip
    return 0
