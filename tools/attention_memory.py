"""Peak memory growth of ``cpu.adaptive_attention`` with a mask, in a fresh process.

Usage::

    python tools/attention_memory.py [--n 16384] [--d 64] [--kind causal bool row none]

For each mask kind a fresh interpreter compiles the kernels on a small problem, resets
the peak resident set size (``/proc/self/clear_refs``), runs one attention of L = S = n,
D = d in float64, and prints the growth of ``VmHWM`` over the RSS before the call,
together with the sizes of the inputs it was given. Linux only.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

CHILD = """
import sys, time
import numpy as np
from softmaxtheory.accelerated import cpu

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
    raise KeyError(key)

kind, n, d = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(0)

def inputs(n):
    q, k, v = (rng.normal(size=(n, d)) for _ in range(3))
    if kind == "bool":
        return q, k, v, dict(mask=np.tril(np.ones((n, n), dtype=bool))[None])
    if kind == "row":
        return q, k, v, dict(mask=np.where(np.arange(n) % 3 == 0, -np.inf, 0.0))
    if kind == "causal":
        return q, k, v, dict(is_causal=True)
    return q, k, v, {}

q, k, v, kw = inputs(64)
cpu.adaptive_attention(q, k, v, **kw)
q, k, v, kw = inputs(n)
given = sum(a.nbytes for a in (q, k, v)) + sum(
    np.asarray(m).nbytes for m in kw.values() if not isinstance(m, bool)
)
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
before = status("VmRSS:")
t0 = time.perf_counter()
cpu.adaptive_attention(q, k, v, **kw)
seconds = time.perf_counter() - t0
print(status("VmHWM:") - before, given, seconds)
"""


def main(argv: list[str] | None = None) -> int:
    """Run the measurement for each mask kind and print one line per kind."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=16384)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--kind", nargs="+", default=["causal", "bool", "row", "none"])
    args = parser.parse_args(argv)
    print(f"L = S = {args.n}, D = {args.d}, float64")
    for kind in args.kind:
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, kind, str(args.n), str(args.d)],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode:
            print(f"{kind:>7}: failed\n{proc.stderr}", file=sys.stderr)
            return 1
        growth, given, seconds = proc.stdout.split()
        print(
            f"{kind:>7}: peak RSS growth {int(growth) / 2**20:8.1f} MiB "
            f"(inputs {int(given) / 2**20:.1f} MiB, {float(seconds):.1f} s)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
