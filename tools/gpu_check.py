#!/usr/bin/env python
r"""One prepared GPU session for the torch path (issue 13, item 7): about 7 minutes on an H200.

Run from the repository root on a machine with a CUDA device::

    python tools/gpu_check.py                 # everything, results under $OUT or gpu_check_out/
    python tools/gpu_check.py --dry-run       # print the steps and their time limits only
    python tools/gpu_check.py --only tests    # one step (repeatable)

On the lent device machine, whose ``$OUT`` folder comes back (at most 8 files), the results
go there by default: ``bench_cuda.json`` is then committed as
``docs/performance/bench_cuda_h200.json``. The output is at most 7 files (a log per step, the
JSON, the summary).

Steps, in this order, each with its own time limit (the limits add up to the budget, 390 s,
leaving half a minute of the 7 for start-up and installing the project):

``env``
    ``nvidia-smi`` and the versions of torch, Triton and CUDA.
``bench``
    ``softmaxtheory bench --device cuda --tiles --output OUT/bench_cuda.json``: forward (``auto``,
    composition, Triton, ``attention_entropy``, each against SDPA's forward) at (B, H, L,
    S, D) = (8, 16, 4096, 4096, 64), (4, 16, 8192, 8192, 128), (2, 16, 16384, 16384, 64),
    and forward + backward (``auto`` with beta attached and with ``detach_beta=True``,
    against SDPA's) at (4, 16, 4096, 4096, 64) and the two larger shapes, causal and not,
    bfloat16, after a second of dense products (clocks); median of 50
    timed calls after a warm-up call, peak memory and host time of one call, and the
    kernels of one profiled call of ``auto``; then the tile sweep, every launch
    configuration of the pass-1 kernels and its backward timed once (median of 10), for
    choosing their order from a measurement; last, the first shape of each pass with a
    boolean key-padding mask (SDPA given the same mask). First, because the table is
    what the session is for; the JSON is rewritten after every case, so a stop at the
    limit keeps the cases measured (the first shape and its backward come first, the
    sweep and the masked cases last).
``tests``
    ``pytest -m cuda tests`` (the CUDA tests; collection works without the docs extra),
    in up to 14 processes with pytest-xdist, which compile the Triton kernels at once
    (a line per test, so a stop at the limit still shows what ran):
    the crash matrix of issue 13 (``test_cuda_every_head_dim_runs``: head dims
    16, 32, 64, 128, 256 x float16, bfloat16, float32 x no mask, causal, boolean,
    additive x L = S, L != S x MHA, GQA, each against the reference), forward + backward
    against float64 autograd with beta attached and detached, float64 gradchecks through
    the Triton pass 1 and its backward, overflow and zero sizes. A run in which no test
    passed (every one skipped: no CUDA device seen) fails.
``conformance``
    ``softmaxtheory check`` on CUDA for ``adaptive_softmax`` and ``adaptive_attention`` in
    float16, bfloat16 and float32 with a reduced example budget, all started at once:
    ``adaptive_softmax`` one run per dtype; ``adaptive_attention`` one run per dtype
    and property (:data:`ATTENTION_PROPERTIES`), so that its Triton compilations run on
    every core (the reference's time, on the CPU too, took 90 s for one run on a loaded
    2-core machine). A stop at the limit sends SIGTERM first: ``check`` then kills the
    process running the kernel, which has a session of its own.
``docs`` (with ``--write-docs``)
    Copies ``OUT/bench_cuda.json`` to ``docs/performance/bench_cuda_h200.json``, the file
    ``docs/performance.rst`` reads (also after a bench step stopped at its limit).

Each step's output is written to ``OUT/<step>.log`` (the conformance runs one after
another in ``conformance.log``), and the end of a failing step's log is printed; a summary
(step, exit status, seconds) to ``OUT/summary.json``, rewritten after every step. The exit
status is 0 only if every step that ran passed. A step that exceeds its limit is stopped,
with every process it started, and counted as failed; later steps still run.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

#: Total wall-clock budget of the script (s): the sum of the step limits (with ``docs``).
BUDGET_S = 390

#: Packages whose versions the env step prints (an absent one explains an empty step:
#: the tests need pytest and Hypothesis, pytest-xdist runs them in processes).
VERSIONS = ("triton", "numpy", "mpmath", "pytest", "hypothesis", "pytest-xdist", "numba")

#: The attention kind's properties, each checked by a process of its own. On CUDA the
#: attention kernel's examples need about 77 Triton compilations per dtype (shapes,
#: flags and the integer arguments Triton specializes on, counted under the
#: interpreter), a few seconds of one core each; one process per dtype compiled them one
#: after another, several times the step's limit. Apart, they compile on every core.
ATTENTION_PROPERTIES = (
    "attention_values", "attention_batch", "attention_masks", "attention_causal",
    "attention_layouts", "attention_special_values", "fresh_results",
)  # fmt: skip

#: Lines of a failing step's log printed at its end.
TAIL_LINES = 30


@dataclass
class Step:
    """One step: commands run in order, with a shared time limit (seconds)."""

    name: str
    limit_s: int
    commands: list[list[str]] = field(default_factory=list)
    stdout_to: Path | None = None  # the first command's stdout goes there too
    parallel: bool = False  # run the commands at once (CPU-bound reference checks)


def _softmaxtheory(*args: str) -> list[str]:
    return [sys.executable, "-m", "softmaxtheory", *args]


def _workers(cpus: int | None = None, xdist: str | None = "") -> list[str]:
    """pytest-xdist options for the CUDA tests: one process per core but two, at most 14.

    The CUDA tests compile about 190 Triton variants (head dims, dtypes, mask kinds;
    counted by running their bodies under the interpreter), about 1,000 s of one core
    on the 2-core development machine by an estimate from timing each kind once
    (float32 kernels take 5 to 22 s each).
    Compiling is CPU work, so it runs on every core but two (the processes share
    Triton's on-disk cache and the one GPU; each runs tiny shapes). With pytest-xdist
    3.2 or later the processes steal work from each other (``--dist worksteal``), so
    a process left with the slow float32 compilations does not hold up the step.
    Without pytest-xdist, or with fewer than four cores, the tests run in one process.
    `xdist` is the installed version (``""``: look it up; None: not installed).
    """
    if cpus is None:
        cpus = os.cpu_count() or 1
    if xdist == "":
        try:
            xdist = importlib.metadata.version("pytest-xdist")
        except importlib.metadata.PackageNotFoundError:
            xdist = None
    if xdist is None or cpus < 4:
        return []
    release = re.match(r"(\d+)\.(\d+)", xdist)
    new = release is not None and tuple(map(int, release.groups())) >= (3, 2)
    steal = ["--dist", "worksteal"] if new else []
    return ["-n", str(min(14, cpus - 2)), *steal]


def build_steps(out: Path, write_docs: bool) -> list[Step]:
    """The steps of the GPU session, in order (their limits sum to :data:`BUDGET_S`)."""
    probe = (
        "import torch, importlib.metadata as m; "
        "print('torch', torch.__version__, 'cuda', torch.version.cuda, "
        "'device', torch.cuda.get_device_name() if torch.cuda.is_available() else None)\n"
        f"for name in {VERSIONS!r}:\n"
        "    try: print(name, m.version(name))\n"
        "    except m.PackageNotFoundError: print(name, 'absent')"
    )
    env = Step("env", 15, [["nvidia-smi"], [sys.executable, "-c", probe]])
    tests = Step(
        "tests",
        150,
        [[sys.executable, "-m", "pytest", "-m", "cuda", "tests", "-v",
          "-p", "no:cacheprovider", "--durations=10", *_workers()]],
    )  # fmt: skip
    conformance = Step("conformance", 70, parallel=True)
    for dtype in ("float16", "bfloat16", "float32"):
        for kernel, kind, only in (
            ("adaptive_softmax", "adaptive_softmax", ()),
            *(("adaptive_attention", "attention", ("--only", name))
              for name in ATTENTION_PROPERTIES),
        ):  # fmt: skip
            conformance.commands.append(
                _softmaxtheory(
                    "check", f"softmaxtheory.accelerated.torch:{kernel}", "--kind", kind,
                    "--framework", "torch", "--device", "cuda", "--dtype", dtype,
                    "--examples", "20", *only,
                )
            )  # fmt: skip
    bench_json = out / "bench_cuda.json"
    bench = Step(
        "bench",
        150,
        [_softmaxtheory("bench", "--device", "cuda", "--tiles", "--output", str(bench_json))],
    )
    # the measured table first: it is what the session is for, and the JSON it rewrites
    # after every case survives a stop at the limit
    steps = [env, bench, tests, conformance]
    if write_docs:
        steps.append(
            Step("docs", 5, [[sys.executable, "-c",
                              "import shutil, sys; shutil.copyfile(sys.argv[1], sys.argv[2])",
                              str(bench_json),
                              str(ROOT / "docs" / "performance" / "bench_cuda_h200.json")]])
        )  # fmt: skip
    assert sum(s.limit_s for s in steps) <= BUDGET_S
    return steps


def _start(cmd: list[str], log: Any, capture: bool = False) -> subprocess.Popen:
    """Start `cmd` in a process group of its own (so a stop reaches every process it starts)."""
    return subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE if capture else log, stderr=log, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True,
    )  # fmt: skip


def _stop(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """Stop `proc`'s process group: SIGTERM, then SIGKILL after `grace_s` seconds.

    The group, because pytest-xdist workers outlived their parent otherwise; SIGTERM
    first, because ``softmaxtheory check`` runs each kernel in a session of its own
    and kills it on SIGTERM, which SIGKILL gives it no chance to do (a kernel holding
    the GIL, a CUDA call or a Triton compilation, then outlives the step).
    """
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            proc.send_signal(sig)
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue
    proc.wait()


def _run_parallel(step: Step, out: Path) -> tuple[int, float]:
    """Start every command of `step` at once; wait under the limit; one log, runs in order."""
    start = time.monotonic()
    status = 0
    with tempfile.TemporaryDirectory() as tmp, (out / f"{step.name}.log").open("w") as log:
        procs = []
        for i, cmd in enumerate(step.commands):
            part = (Path(tmp) / f"{i}.log").open("w")
            part.write(f"$ {shlex.join(cmd)}\n")
            part.flush()
            procs.append((_start(cmd, part), part))
        for i, (proc, part) in enumerate(procs):
            left = max(0.0, step.limit_s - (time.monotonic() - start))
            try:
                rc = proc.wait(timeout=left)
            except subprocess.TimeoutExpired:
                _stop(proc)
                part.write(f"\nstopped: the step's limit of {step.limit_s} s\n")
                rc = 124
            part.write(f"\n[exit {rc}]\n")
            part.close()
            log.write((Path(tmp) / f"{i}.log").read_text() + "\n")
            status = status or rc
    return status, time.monotonic() - start


def _run_step(step: Step, out: Path) -> tuple[int, float]:
    """Run a step's commands under its limit; return (exit status, seconds)."""
    if step.parallel:
        return _run_parallel(step, out)
    start = time.monotonic()
    log = (out / f"{step.name}.log").open("w")
    status = 0
    try:
        for i, cmd in enumerate(step.commands):
            left = step.limit_s - (time.monotonic() - start)
            if left <= 0:
                log.write(f"time limit of {step.limit_s} s reached before: {shlex.join(cmd)}\n")
                return 124, time.monotonic() - start
            log.write(f"$ {shlex.join(cmd)}\n")
            log.flush()
            capture = step.stdout_to is not None and i == 0
            try:
                proc = _start(cmd, log, capture)
            except FileNotFoundError as exc:
                log.write(f"\n{exc}\n[exit 127]\n")
                status = status or 127
                continue
            try:
                stdout, _ = proc.communicate(timeout=left)
            except subprocess.TimeoutExpired:
                _stop(proc)
                log.write(f"\nstopped: the step's limit of {step.limit_s} s\n")
                return 124, time.monotonic() - start
            if capture:
                step.stdout_to.write_text(stdout or "")
                log.write(stdout or "")
            log.write(f"\n[exit {proc.returncode}]\n")
            status = status or proc.returncode
    finally:
        log.close()
    return status, time.monotonic() - start


def _tests_ran(log: Path) -> bool:
    """Whether pytest's summary in `log` counts a passed test (all skipped: no CUDA seen)."""
    text = log.read_text() if log.exists() else ""
    return re.search(r"\b[1-9]\d* passed", text) is not None


def _tail(log: Path, lines: int = TAIL_LINES) -> str:
    return "\n".join(log.read_text().splitlines()[-lines:]) if log.exists() else ""


def main(argv: list[str] | None = None) -> int:
    """Run (or, with ``--dry-run``, print) the GPU session; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument("--dry-run", action="store_true", help="print the steps, run nothing")
    parser.add_argument(
        "--out", type=Path, default=Path(os.environ.get("OUT") or ROOT / "gpu_check_out"),
        help="output folder (default: $OUT where it is set, else gpu_check_out/)",
    )  # fmt: skip
    parser.add_argument(
        "--only", action="append", choices=("env", "bench", "tests", "conformance", "docs"),
        help="run only this step (repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--write-docs", action="store_true",
        help="copy the benchmark JSON to docs/performance/bench_cuda_h200.json",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.only and "docs" in args.only and not args.write_docs:
        parser.error("--only docs copies the benchmark JSON into docs/: add --write-docs")
    steps = build_steps(args.out, args.write_docs)
    if args.only:
        steps = [s for s in steps if s.name in args.only]
    if args.dry_run:
        print(f"# budget {BUDGET_S} s; output under {args.out}")
        for step in steps:
            mode = ", commands in parallel" if step.parallel else ""
            print(f"# step {step.name} (limit {step.limit_s} s{mode})")
            for i, cmd in enumerate(step.commands):
                redirect = f" > {step.stdout_to}" if step.stdout_to and i == 0 else ""
                print(shlex.join(cmd) + redirect)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    summary = []
    for step in steps:
        print(f"== {step.name} (limit {step.limit_s} s)", flush=True)
        if step.name == "bench":  # a JSON of an earlier run must not pass for this one's
            for stale in ("bench_cuda.json", "bench_cuda.json.tmp"):
                (args.out / stale).unlink(missing_ok=True)
        status, seconds = _run_step(step, args.out)
        log = args.out / f"{step.name}.log"
        if step.name == "tests" and status == 0 and not _tests_ran(log):
            status = 3
            with log.open("a") as fh:
                fh.write("\nno CUDA test passed (every one skipped: no CUDA device seen?)\n")
        print(f"   exit {status} in {seconds:.1f} s; log {log}", flush=True)
        if status != 0:
            print(_tail(log), flush=True)
        summary.append({"step": step.name, "status": status, "seconds": round(seconds, 1)})
        (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return 0 if all(s["status"] == 0 for s in summary) else 1


if __name__ == "__main__":
    raise SystemExit(main())
