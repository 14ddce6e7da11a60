"""``softmaxtheory bench --quick``: every backend is timed and reported (no timing asserted)."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("numba")

from softmaxtheory import bench
from softmaxtheory.accelerated import cpu
from softmaxtheory.cli import main


def test_quick_json_reports_every_backend(capsys, tmp_path) -> None:
    saved = tmp_path / "bench.json"
    code = main(["bench", "--quick", "--json", "--dtype", "float32", "--output", str(saved)])
    out = capsys.readouterr()
    assert code == 0
    doc = json.loads(out.out)
    assert json.loads(saved.read_text()) == doc  # --output holds what --json prints
    assert [f.name for f in tmp_path.iterdir()] == ["bench.json"]  # no temporary left
    cases = doc["kernels"]
    backends = {c["backend"] for c in cases}
    assert {"cpu.adaptive_softmax", "cpu.softmax"} <= backends
    assert {tuple(c["shape"]) for c in cases} == {tuple(s) for s in bench.QUICK_SHAPES}
    assert all(c["seconds"] > 0 and c["gb_per_second"] > 0 for c in cases)
    assert doc["kernel_run"]["bandwidth_gb_per_second"] > 0
    assert "timing" in out.err and "bandwidth" in out.err
    # the run is dated and the machine described, for the performance page
    import datetime

    info = doc["machine"]
    stamp = datetime.datetime.fromisoformat(info["date"])
    assert stamp.tzinfo is not None
    assert abs((datetime.datetime.now(datetime.UTC) - stamp).total_seconds()) < 3600
    assert info["cpus"] >= 1 and info["cpu_model"]
    assert info["numba"] and info["numpy"] == np.__version__


def test_table_and_reference_section(capsys) -> None:
    code = main(
        ["bench", "--quick", "--section", "reference", "--section", "kernels", "--dtype", "float64"]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "cpu.adaptive_softmax" in out and "reference.adaptive_softmax" in out
    assert "measured bandwidth" in out


@pytest.mark.parametrize("shape", [(64, 64), (8, 1024), (1, 1 << 17), (4096, 64), (64, 16384)])
def test_rows_have_the_beta_they_are_labelled_with(shape) -> None:
    if shape[0] * shape[1] > 1 << 20:
        shape = (4, shape[1])
    sharp = bench.kernel_rows(shape, "beta>1", np.float32)
    flat = bench.kernel_rows(shape, "beta=1", np.float32)
    assert np.all(cpu.beta(sharp) > 1.0)
    assert np.all(cpu.beta(flat) == 1.0)


def test_usage_errors(capsys) -> None:
    for argv in (["bench", "--threads", "0"], ["bench", "--repeat", "0"]):
        with pytest.raises(SystemExit):
            main(argv)
    assert "must be >= 1" in capsys.readouterr().err


def test_device_timer_reports_device_and_host_time() -> None:
    """The GPU benchmark's timer, driven by a stand-in for ``torch.cuda`` (no GPU here): one
    warm-up and one memory call, then `repeat` timed calls, each timed by its events (device
    time, median and best) and on the host until the call returns."""
    import time
    from types import SimpleNamespace

    from softmaxtheory.bench import torch as bench_torch

    clock = {"device": 0.0}

    class Event:
        def __init__(self, enable_timing: bool) -> None:
            assert enable_timing
            self.at = 0.0

        def record(self) -> None:
            self.at = clock["device"]

        def elapsed_time(self, other: Event) -> float:  # milliseconds, as CUDA's events
            return (other.at - self.at) * 1e3

    memory = {"now": 100, "peak": 100}
    cuda = SimpleNamespace(
        Event=Event, synchronize=lambda: None,
        reset_peak_memory_stats=lambda: memory.update(peak=memory["now"]),
        memory_allocated=lambda: memory["now"], max_memory_allocated=lambda: memory["peak"],
    )  # fmt: skip
    durations = iter([0.5, 0.5, 0.003, 0.001, 0.002])  # warm-up, memory call, three timed

    def call() -> None:
        clock["device"] += next(durations)
        memory["peak"] = max(memory["peak"], memory["now"] + 64)
        time.sleep(0.002)  # the host's part

    seconds, peak, best, host = bench_torch._time(call, 3, SimpleNamespace(cuda=cuda))
    assert seconds == pytest.approx(0.002) and best == pytest.approx(0.001)
    assert peak == 64
    assert 0.002 <= host < 0.5


def test_breakdown_lists_a_calls_ops_by_time() -> None:
    """The profile of one call that the GPU benchmark stores per adaptive case (kernels by
    device time there); on CPU the same function lists ops by host time."""
    torch = pytest.importorskip("torch")
    from softmaxtheory.accelerated.torch import adaptive_attention
    from softmaxtheory.bench.torch import breakdown

    q, k, v = (torch.randn(2, 2, 64, 32) for _ in range(3))
    with torch.no_grad():
        adaptive_attention(q, k, v)  # warm-up
        few = breakdown(lambda: adaptive_attention(q, k, v), torch, device_type="cpu", top=3)
        every = breakdown(lambda: adaptive_attention(q, k, v), torch, device_type="cpu", top=999)
    times = [us for _, us, _ in few["entries"]]
    assert len(times) == 3 and times == sorted(times, reverse=True) and times[-1] > 0
    assert few["total_us"] == pytest.approx(sum(times) + few["other_us"])
    assert few["other_us"] > 0  # more ops than the three kept
    names = [n for n, _, _ in every["entries"]]
    assert every["other_us"] == 0 and len(names) > 3
    # the scan's reductions, pass 2 (SDPA) and the scaling of the queries are all there
    for op in ("linalg_vector_norm", "scaled_dot_product", "aten::mul"):
        assert any(op in n for n in names), (op, names)


def test_gpu_plan_puts_the_first_shape_and_its_backward_first() -> None:
    """A GPU run stopped at a time limit keeps the cases measured so far (the JSON is
    rewritten after each), so the most wanted come first: the first shape forward, causal
    and not, then forward + backward, then the larger shapes."""
    from softmaxtheory.bench.torch import BACKWARD_SHAPES, SHAPES, plan_cases

    plan = plan_cases(SHAPES)
    first = SHAPES[0]
    assert plan[:2] == [(first, False), (first, True)]
    assert plan[2:4] == [(b, c, "backward") for b in BACKWARD_SHAPES for c in (False, True)]
    forward = [item for item in plan if len(item) == 2]
    assert forward == [(s, c) for s in SHAPES for c in (False, True)]
    assert len(plan) == 2 * len(SHAPES) + 2 * len(BACKWARD_SHAPES)
    assert plan_cases(()) == [(b, c, "backward") for b in BACKWARD_SHAPES for c in (False, True)]


def test_save_json_replaces_the_file_whole(tmp_path) -> None:
    path = tmp_path / "run.json"
    bench.save_json({"rows": [1]}, str(path))
    bench.save_json({"rows": [1, 2], "complete": True}, str(path))
    assert json.loads(path.read_text()) == {"rows": [1, 2], "complete": True}
    assert sorted(f.name for f in tmp_path.iterdir()) == ["run.json"]
