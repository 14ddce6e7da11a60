#!/usr/bin/env python
"""The CPU kernels timed as compiled (512-bit vectors preferred) and as LLVM's tuning would.

Usage::

    python tools/vector_width.py            # writes docs/performance/bench_cpu.json and
                                            # docs/performance/bench_cpu_llvm_tuning.json
    python tools/vector_width.py --out DIR  # the two files in DIR instead

Runs ``softmaxtheory bench --section kernels --repeat 20`` twice, one child process after
the other, each with an empty Numba cache of its own (``NUMBA_CACHE_DIR``, so that neither
run reads the other's machine code): first with the kernels' functions left unmarked
(``softmaxtheory.accelerated._numba_vectors`` does not add its
``"prefer-vector-width"="512"``, so LLVM's tuning for the host picks the width, 256 bits
on Intel cores with AVX-512), written to ``bench_cpu_llvm_tuning.json``; then as the
library compiles them, written to ``bench_cpu.json``, the run that :doc:`performance`
shows. On a processor without AVX-512 the two builds are the same code.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: The child: the benchmark, with the kernels' mark switched off for ``llvm``; then a
#: check that the kernel it timed most was compiled in this process (the cache was
#: empty) with the attribute exactly in the library's build.
CHILD = """
import sys
import softmaxtheory.accelerated._numba_vectors as vectors
if sys.argv[1] == "llvm":
    vectors._mark = lambda module: None
from softmaxtheory.cli import main
status = main(["bench", "--section", "kernels", "--repeat", "20", "--output", sys.argv[2]])
from softmaxtheory.accelerated import _cpu_kernels
kernel = _cpu_kernels.rows_adaptive
marked = [vectors.ATTRIBUTE in kernel.inspect_llvm(sig) for sig in kernel.signatures]
if not marked or any(m != (sys.argv[1] == "library") for m in marked):
    sys.exit(f"{sys.argv[1]} build: the attribute in rows_adaptive's IR: {marked}")
sys.exit(status)
"""

#: (build, file name) in the order they run.
RUNS = (("llvm", "bench_cpu_llvm_tuning.json"), ("library", "bench_cpu.json"))


def main(argv: list[str] | None = None) -> int:
    """Run both builds' benchmarks; return 0 (a failing run raises)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "performance")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for build, name in RUNS:
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "NUMBA_CACHE_DIR": cache}
            print(f"{build}: {args.out / name}", file=sys.stderr)
            cmd = [sys.executable, "-c", CHILD, build, str(args.out / name)]
            subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
