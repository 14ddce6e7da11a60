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
    assert {c["rows"] for c in cases} == {"beta>1", "beta=1", "masked"}
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
    # and the run says how it measured: the package's version, the repeats, the statistic
    from importlib import metadata

    assert info["softmaxtheory"] == metadata.version("softmaxtheory")
    assert doc["run"] == {
        "sections": ["kernels"], "quick": True, "statistic": "min",
        "min_seconds": bench.MIN_SECONDS,
    }  # fmt: skip
    assert doc["kernel_run"]["repeat"] == 2  # --quick's default


def test_n_without_the_reference_section_is_refused(capsys) -> None:
    """--n sets the reference row's length: with only the kernels section it was ignored."""
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--section", "kernels", "--n", "100", "--quick"])
    assert exc.value.code == 2
    assert "--n sets the reference section's row length" in capsys.readouterr().err


@pytest.mark.parametrize(
    "shapes", [((2, 0),), ((0, 5),), ((3,),), ((2, 2.5),), ((2.0, 8),), ((True, 8),)]
)
def test_run_kernels_refuses_empty_or_malformed_shapes(shapes) -> None:
    with pytest.raises(ValueError, match="shapes must be pairs"):
        bench.run_kernels(shapes, ("float64",), 1)


def test_table_and_reference_section(capsys) -> None:
    code = main(
        ["bench", "--quick", "--section", "reference", "--section", "kernels", "--dtype", "float64"]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "cpu.adaptive_softmax" in out and "reference.adaptive_softmax" in out
    assert "measured bandwidth" in out
    assert "certified adaptive_attention, fast pass vs pure mpmath" in out


def test_reference_attention_times_both_paths_on_the_same_head() -> None:
    (head,) = bench.run_reference_attention(shape=(3, 20, 4, 2), repeat=1, dtypes=("float32",))
    assert head.shape == (3, 20, 4, 2) and head.dtype == "float32"
    assert head.fast_seconds > 0 and head.mpmath_seconds > 0
    assert head.speedup == head.mpmath_seconds / head.fast_seconds
    assert head.undecided_fraction == 0.0  # Gaussian rows: every one certified by the fast pass


@pytest.mark.parametrize("shape", [(64, 64), (8, 1024), (1, 1 << 17), (4096, 64), (64, 16384)])
def test_rows_have_the_beta_they_are_labelled_with(shape) -> None:
    if shape[0] * shape[1] > 1 << 20:
        shape = (4, shape[1])
    sharp = bench.kernel_rows(shape, "beta>1", np.float32)
    flat = bench.kernel_rows(shape, "beta=1", np.float32)
    assert np.all(cpu.beta(sharp) > 1.0)
    assert np.all(cpu.beta(flat) == 1.0)


@pytest.mark.parametrize("shape", [(64, 64), (8, 1024), (1, 1 << 17), (4, 16384), (3, 1)])
def test_masked_rows_are_the_beta_one_rows_with_their_second_half_masked(shape) -> None:
    """A padding mask's rows: the last n // 2 items -inf, the others those of the β = 1
    rows, and β still 1 at the benchmark's shapes (so that a masked case times the same
    passes as its dense one)."""
    n = shape[1]
    masked = bench.kernel_rows(shape, "masked", np.float32)
    flat = bench.kernel_rows(shape, "beta=1", np.float32)
    assert np.array_equal(masked[:, : n - n // 2], flat[:, : n - n // 2])
    assert np.all(masked[:, n - n // 2 :] == -np.inf)
    assert np.all(cpu.beta(masked) == 1.0)
    with pytest.raises(ValueError, match="kind must be one of"):
        bench.kernel_rows(shape, "beta<1", np.float32)


def test_beta_one_rows_of_every_length_have_beta_one() -> None:
    """The beta = 1 rows were long rows as they are from 257 items on, but a Gaussian row's
    entropy, log n - 1/8, passes H_off only near 438: lengths 257 to 438 had beta up to 1.74."""
    lengths = [*range(2, 64), *range(250, 520, 3), 1024]
    assert all(np.all(cpu.beta(bench.kernel_rows((2, n), "beta=1", np.float64)) == 1.0)
               for n in lengths)  # fmt: skip
    assert all(np.all(cpu.beta(bench.kernel_rows((2, n), "beta>1", np.float64)) > 1.0)
               for n in (*range(8, 64), *range(250, 520, 3), 1024))  # fmt: skip


@pytest.mark.parametrize("n", [1, 2, 3, 16, 256, 300, 301, 1000])
def test_reference_rows_have_the_beta_they_are_labelled_with(n) -> None:
    """At 256 items the "beta=1" row had beta 1.94 (log 256 lies inside the window), at 301
    the "beta>1" row beta 1; no row of 2 items or fewer has beta > 1, and none is given."""
    from softmaxtheory import reference

    rows = bench.reference_rows(n)
    assert set(rows) == ({"beta=1"} if n <= 2 else {"beta>1", "beta=1"})
    for label, row in rows.items():
        assert row.shape == (n,)
        assert (float(reference.beta(row)) > 1.0) == (label == "beta>1"), label


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--output", "{tmp}"], "--output must name a file, got the directory"),
        (["--output", "{tmp}/no/such/folder/x.json"], "does not exist"),
        (["--section", "reference", "--n", "100000000000"], "--n must be between 1 and"),
        (["--section", "reference", "--n", "0"], "--n must be between 1 and"),
    ],
)
def test_unusable_arguments_are_refused_before_the_run(argv, message, tmp_path, capsys) -> None:
    """A bad --output path was found after every case was timed (a traceback, the results
    lost, a stray .tmp file beside a directory); --n 1e11 failed allocating 745 GiB."""
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    with pytest.raises(SystemExit) as exc:
        main(["bench", *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_usage_errors(capsys) -> None:
    for argv in (["bench", "--threads", "0"], ["bench", "--repeat", "0"]):
        with pytest.raises(SystemExit):
            main(argv)
    assert "must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "--tiles"])  # the sweep times GPU kernels: not on the CPU
    assert "--tiles times the Triton kernels: it needs --device cuda" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "--device", "cuda", "--repeat", "0"])
    assert "--repeat must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # CPU options are refused, not ignored, on a device
        main(["bench", "--device", "cuda", "--dtype", "float32", "--threads", "2"])
    assert "--dtype, --threads: CPU benchmark options" in capsys.readouterr().err


def test_no_cuda_device_is_a_one_line_error_that_names_the_command(capsys) -> None:
    """Without a GPU, ``bench --device cuda`` says so in the form of the other commands'
    errors (it printed a bare "error: ..." line)."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert main(["bench", "--device", "cuda"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    assert err[0].startswith("softmaxtheory bench: error: --device cuda: no CUDA device")


def test_device_timer_reports_device_and_host_time(monkeypatch) -> None:
    """The GPU benchmark's timer, driven by a stand-in for ``torch.cuda`` (no GPU here): one
    warm-up and one memory call, then `repeat` timed calls, each timed by its events (device
    time, median and best) and on the host until the call returns."""
    from types import SimpleNamespace

    from softmaxtheory.bench import torch as bench_torch

    clock = {"device": 0.0, "host": 0.0}
    monkeypatch.setattr(bench_torch, "time", SimpleNamespace(perf_counter=lambda: clock["host"]))

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
        clock["host"] += 0.002  # the host's part

    seconds, peak, best, host = bench_torch._time(call, 3, SimpleNamespace(cuda=cuda))
    assert seconds == pytest.approx(0.002) and best == pytest.approx(0.001)
    assert peak == 64
    assert 0.002 <= host < 0.5


def test_device_breakdown_counts_a_kernel_once() -> None:
    """On CUDA an op that launched a kernel has that kernel's time as its own device time;
    the kernel's event has it too. The rows are the device's events only: 150 us of
    kernels (one under an aten op, one Triton launch under none) were 250 us before."""
    pytest.importorskip("torch")
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import EventList, FunctionEvent

    from softmaxtheory.bench.torch import self_time_rows

    def event(i, name, device_type, start, end):
        return FunctionEvent(
            id=i, name=name, thread=0, start_us=start, end_us=end, input_shapes=[], stack=[],
            use_device="cuda", device_type=device_type,
        )  # fmt: skip

    op = event(1, "aten::_flash_attention_forward", DeviceType.CPU, 0, 10)
    kernel = event(2, "flash_fwd_kernel", DeviceType.CUDA, 5, 105)
    op.append_kernel(kernel.name, 0, 100)  # as torch's parser links a kernel to its op
    triton = event(3, "_entropy_kernel", DeviceType.CUDA, 110, 160)
    events = EventList([op, kernel, triton], use_device="cuda")
    events._build_tree()
    rows = self_time_rows(events.key_averages(), device=True)
    assert rows == [["flash_fwd_kernel", 100.0, 1], ["_entropy_kernel", 50.0, 1]]
    host = self_time_rows(events.key_averages(), device=False)
    assert [r[0] for r in host] == ["aten::_flash_attention_forward"]


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
    # the scan's reductions (aminmax on the CPU), pass 2 (SDPA) and the scaling of the queries
    for op in ("aminmax", "scaled_dot_product", "aten::mul"):
        assert any(op in n for n in names), (op, names)


def test_gpu_plan_puts_the_first_shape_and_its_backward_first() -> None:
    """A GPU run stopped at a time limit keeps the cases measured so far (the JSON is
    rewritten after each), so the most wanted come first: the first shape forward, causal
    and not, then its forward + backward, then the larger shapes forward, then their
    forward + backward; last the two masked cases, which no target reads."""
    from softmaxtheory.bench.torch import BACKWARD_SHAPES, SHAPES, plan_cases

    plan = plan_cases(SHAPES)
    first = SHAPES[0]
    assert plan[:2] == [(first, False), (first, True)]
    assert plan[2:4] == [(BACKWARD_SHAPES[0], c, "backward") for c in (False, True)]
    forward = [item for item in plan if len(item) == 2]
    assert forward == [(s, c) for s in SHAPES for c in (False, True)]
    later = [(b, c, "backward") for b in BACKWARD_SHAPES[1:] for c in (False, True)]
    masked = [(first, False, "masked"), (BACKWARD_SHAPES[0], False, "masked backward")]
    assert plan[-2:] == masked
    assert plan[-2 - len(later) : -2] == later and plan[4:6] == [(SHAPES[1], False),
                                                                 (SHAPES[1], True)]  # fmt: skip
    assert len(plan) == 2 * len(SHAPES) + 2 * len(BACKWARD_SHAPES) + 2
    assert plan_cases(()) == [(b, c, "backward") for b in BACKWARD_SHAPES for c in (False, True)
                              ] + [(BACKWARD_SHAPES[0], False, "masked backward")]  # fmt: skip


def test_key_padding_mask_keeps_a_prefix_of_every_sequence() -> None:
    """The masked cases' mask: (B, 1, 1, S), sequence b keeps its first S - (b % 4 + 1)·S/8
    keys, so every sequence has padding and the lengths differ across the batch."""
    torch = pytest.importorskip("torch")
    from softmaxtheory.bench.torch import key_padding_mask

    mask = key_padding_mask(torch, 6, 16, "cpu")
    assert mask.shape == (6, 1, 1, 16) and mask.dtype == torch.bool
    assert mask.sum(-1).flatten().tolist() == [14, 12, 10, 8, 14, 12]
    for b in range(6):  # a prefix: every kept key before every padded one
        row = mask[b, 0, 0].tolist()
        assert row == sorted(row, reverse=True)


def test_save_json_replaces_the_file_whole(tmp_path) -> None:
    path = tmp_path / "run.json"
    bench.save_json({"rows": [1]}, str(path))
    bench.save_json({"rows": [1, 2], "complete": True}, str(path))
    assert json.loads(path.read_text()) == {"rows": [1, 2], "complete": True}
    assert sorted(f.name for f in tmp_path.iterdir()) == ["run.json"]


def test_tile_candidates_start_with_the_launched_configuration() -> None:
    """The sweep's configurations per kernel: the one ``configs`` launches first, the rest of
    its ladder, then the wider tiles and warp counts of ``EXTRA`` that fit, none twice."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    from softmaxtheory.accelerated._triton_config import configs, smem_estimate
    from softmaxtheory.bench import tiles

    h200 = 232448
    for kernel, backward in tiles.KERNELS.items():
        cands = tiles.candidates(kernel, 64, torch.bfloat16, h200)
        ladder = configs(torch.device("cuda"), 64, 0, torch.bfloat16, 0, h200,
                         backward=backward, kernel=kernel)  # fmt: skip
        assert cands[: len(ladder)] == ladder
        keys = [tuple(c[k] for k in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"))
                for c in cands]  # fmt: skip
        assert len(set(keys)) == len(keys)
        assert set(tiles.EXTRA[kernel]) <= set(keys)  # all fit at D = 64
        for c in cands:
            est = smem_estimate(c["BLOCK_M"], c["BLOCK_N"], c["num_stages"], 64, 0, 2, 0)
            assert est <= h200 and c["BLOCK_D"] == 64
    # a small budget leaves out the extras that do not fit
    small = tiles.candidates("_entropy_kernel", 256, torch.bfloat16, 64 * 1024)
    assert all(smem_estimate(c["BLOCK_M"], c["BLOCK_N"], c["num_stages"], 256, 0, 2, 0)
               <= 64 * 1024 for c in small[1:])  # fmt: skip


def test_tile_sweep_times_each_configuration_and_notes_refusals() -> None:
    """``sweep`` times every configuration through the launcher it is given, records a
    configuration Triton refuses, reports after each kernel; ``summarize`` names the
    fastest and how far the launched one trails."""
    pytest.importorskip("triton")
    from softmaxtheory.accelerated._triton_config import NoConfig
    from softmaxtheory.bench import tiles

    def cfg(bm, bn):
        return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_D": 64, "num_warps": 4, "num_stages": 2}

    cost = {(128, 64): 2e-3, (64, 64): 1e-3, (32, 32): None}
    ran = []

    def run(c):
        ran.append((c["BLOCK_M"], c["BLOCK_N"]))
        if cost[ran[-1]] is None:
            raise NoConfig("too much shared memory")
        return cost[ran[-1]]

    reports = []
    rows = tiles.sweep(
        lambda fn: fn(), {"_entropy_kernel": ((1, 2, 3, 4, 64), run)},
        {"_entropy_kernel": [cfg(128, 64), cfg(64, 64), cfg(32, 32)]},
        on_kernel=lambda r: reports.append(len(r)),
    )  # fmt: skip
    # saved after each configuration: a stop at the time limit keeps each one timed
    assert ran == [(128, 64), (64, 64), (32, 32)] and reports == [1, 2, 3]
    assert [r.get("seconds") for r in rows] == [2e-3, 1e-3, None]
    assert [r["first"] for r in rows] == [True, False, False]
    assert rows[2]["error"].startswith("refused") and rows[0]["config"] == [128, 64, 4, 2]
    assert rows[0]["kernel"] == "entropy_kernel" and rows[0]["shape"] == [1, 2, 3, 4, 64]
    (line,) = tiles.summarize(rows)
    assert "fastest (64, 64, 4, 2) 1.000 ms of 2" in line and "(2.00x)" in line


def test_tile_sweep_launchers_run_the_kernels_in_the_given_tile() -> None:
    """The sweep's launchers on CPU tensors under ``TRITON_INTERPRET=1`` (a child process):
    each configuration reaches the kernel (a tile that does not divide the lengths still
    gives the default tile's statistics and gradients)."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    import os
    import subprocess
    import sys

    code = """
import json, torch
from softmaxtheory.bench import tiles
from softmaxtheory.accelerated import _triton_attention as tri
seen = []
real = tri.launch
def spy(kernel, grid, args, constexprs, cands):
    seen.append((kernel.__name__, [c["BLOCK_M"] for c in cands]))
    return real(kernel, grid, args, constexprs, cands)
tri.launch = spy
launch = tiles.launchers(torch, "cpu", (1, 2, 40, 24, 16), (1, 2, 24, 40, 16))
del seen[:]
cfgs = [{"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_D": 16, "num_warps": 4, "num_stages": 1}
        for bm, bn in ((16, 16), (32, 16))]
out = {}
for name, (shape, run) in launch.items():
    first, second = (run(c) for c in cfgs)
    out[name] = max(float((a - b).abs().max()) for a, b in zip(first, second))
rows = tiles.sweep(lambda fn: (fn(), 1.0)[1], launch, {k: cfgs for k in launch})
out["rows"] = len(rows)
out["seen"] = seen
# the benchmark's step: the sweep of every kernel, saved after each configuration
from softmaxtheory.bench import torch as bt
tiles.candidates = lambda kernel, d, dtype: cfgs
bt._time = lambda fn, repeat, torch: (fn(), 0.5, 0, 0.5, 0.1)[1:]
found, saves = {}, []
bt._tile_sweep(torch, "cpu", True, found, (1, 2, 40, 24, 16), (1, 2, 24, 40, 16),
               lambda: saves.append(len(found.get("rows", []))))
out["step"] = [found["repeat"], [r["seconds"] for r in found["rows"]], saves]
print(json.dumps(out))
"""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out.pop("rows") == 6
    assert out.pop("step") == [10, [0.5] * 6, [1, 2, 3, 4, 5, 6, 6]]
    # each kernel got the swept tile alone; in the backward, the other kernel its default
    seen = [(name, tuple(blocks)) for name, blocks in out.pop("seen")]
    assert seen[:2] == [("_entropy_kernel", (16,)), ("_entropy_kernel", (32,))]
    assert ("_entropy_bwd_dq_kernel", (32,)) in seen and ("_entropy_bwd_dk_kernel", (32,)) in seen
    assert ("_entropy_bwd_dk_kernel", (16,)) in seen  # dk's CPU default while dq is swept
    assert set(out) == set(__import__("softmaxtheory.bench.tiles").bench.tiles.KERNELS)
    for name, diff in out.items():
        assert diff <= 1e-5, name


def _stand_in_for_cuda(monkeypatch, torch) -> None:
    """``torch.cuda``'s timing and memory calls, on the CPU: events read the host clock."""
    import time

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            self.at = 0.0

        def record(self) -> None:
            self.at = time.perf_counter()

        def elapsed_time(self, other: Event) -> float:  # milliseconds, as CUDA's events
            return (other.at - self.at) * 1e3

    for name, value in {
        "Event": Event, "synchronize": lambda: None, "reset_peak_memory_stats": lambda: None,
        "memory_allocated": lambda: 0, "max_memory_allocated": lambda: 0,
        "get_device_name": lambda: "stand-in", "empty_cache": lambda: None,
    }.items():  # fmt: skip
        monkeypatch.setattr(torch.cuda, name, value)


def test_device_run_records_every_case_and_each_failure_alone(monkeypatch, tmp_path) -> None:
    """The GPU benchmark's whole run, on CPU tensors with a stand-in for ``torch.cuda``'s
    timers: every forward case (``auto``, composition, ``attention_entropy`` against
    SDPA) and every forward + backward case is timed at each shape, and again with the
    key-padding mask at the first shape of each pass (apart from the unmasked rows, which
    the targets read); the JSON written to
    `output` is the document returned, and a case that fails (here the Triton backend,
    which refuses CPU tensors outside the interpreter) is recorded with its error while
    the cases after it still run. The text report shows each ratio to SDPA and the error."""
    torch = pytest.importorskip("torch")
    from softmaxtheory.bench import torch as bench_torch

    _stand_in_for_cuda(monkeypatch, torch)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(bench_torch, "_have_triton", lambda: True)  # the backend is tried
    path = tmp_path / "run.json"
    forward, backward = ((1, 2, 40, 24, 16),), ((1, 2, 24, 40, 16),)
    doc = bench_torch.measure(torch, "cpu", forward, backward, 2, output=str(path))
    assert json.loads(path.read_text()) == doc
    assert doc["complete"] and doc["device"] == "stand-in" and doc["repeat"] == 2
    assert doc["softmaxtheory"] and doc["statistic"] == "median"
    assert doc["warmup_seconds"] == 0.0  # (CUDA only)
    assert [(r["shape"], r["causal"]) for r in doc["rows"]] == [
        ([1, 2, 40, 24, 16], False), ([1, 2, 40, 24, 16], True)]  # fmt: skip
    assert [(r["shape"], r["causal"]) for r in doc["backward_rows"]] == [
        ([1, 2, 24, 40, 16], False), ([1, 2, 24, 40, 16], True)]  # fmt: skip
    assert all("mask" not in r for r in doc["rows"] + doc["backward_rows"])
    assert [(r["shape"], r["causal"], r["pass"], r["mask"]) for r in doc["masked_rows"]] == [
        ([1, 2, 40, 24, 16], False, "forward", bench_torch.MASK_KIND),
        ([1, 2, 24, 40, 16], False, "forward+backward", bench_torch.MASK_KIND)]  # fmt: skip
    forward = doc["rows"] + doc["masked_rows"][:1]
    timed = ("seconds", "peak_bytes", "best_seconds", "host_seconds")
    for row in forward:
        for name in ("sdpa", "auto", "composition", "attention_entropy"):
            assert sorted(row[name]) == sorted(timed) and row[name]["seconds"] > 0, name
        assert "TRITON_INTERPRET" in row["triton"]["error"]  # recorded, and the row went on
        assert row["breakdown"]["auto"]["total_us"] > 0
    for row in doc["backward_rows"] + doc["masked_rows"][1:]:
        for name in ("sdpa_fwd_bwd", "auto_fwd_bwd", "auto_fwd_bwd_detached"):
            assert row[name]["seconds"] > 0, name
    lines = bench_torch.format_run(doc)
    assert lines[0].startswith("device: stand-in, torch ") and "median of 2" in lines[0]
    sdpa = [ln for ln in lines if " sdpa " in ln]
    assert len(sdpa) == 3 and all(ln.split()[4] == "1.00" for ln in sdpa)  # SDPA against itself
    assert [ln.split()[1] for ln in sdpa] == ["none", "causal", "padding"]
    assert sum("triton" in ln and "TRITON_INTERPRET" in ln for ln in lines) == 3
    assert sum(" auto_fwd_bwd_detached " in ln for ln in lines) == 3
    assert sum("auto kernels:" in ln for ln in lines) == 3


def test_tile_sweep_runs_after_the_unmasked_cases_and_before_the_masked(monkeypatch) -> None:
    """A run stopped at its limit loses the cases after it: the tile sweep, for tuning the
    kernels the targets time, comes before the masked cases, which no target reads."""
    torch = pytest.importorskip("torch")
    from softmaxtheory.bench import torch as bench_torch

    _stand_in_for_cuda(monkeypatch, torch)
    order = []

    def row(torch, device, res, *rest):
        order.append(("mask" in res, res["pass"]))

    monkeypatch.setattr(bench_torch, "_measure_row", row)
    monkeypatch.setattr(bench_torch, "_tile_sweep", lambda *a: order.append("sweep"))
    bench_torch.measure(torch, "cpu", ((1, 1, 8, 8, 8),), ((1, 1, 8, 8, 8),), 1, tiles=True)
    unmasked = [(False, "forward")] * 2 + [(False, "forward+backward")] * 2
    assert order == [*unmasked, "sweep", (True, "forward"), (True, "forward+backward")]


def test_masked_cases_pass_the_mask_to_every_call() -> None:
    """Each masked case calls its function with the key-padding mask (SDPA too, so the
    ratio compares like with like): its output is that of the call with the mask, and
    differs from the unmasked one."""
    torch = pytest.importorskip("torch")
    from softmaxtheory.accelerated.torch import adaptive_attention, attention_entropy
    from softmaxtheory.bench import torch as bench_torch

    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, n, 8, generator=g) for n in (5, 16, 16))
    mask = bench_torch.key_padding_mask(torch, 2, 16, "cpu")
    sdpa = torch.nn.functional.scaled_dot_product_attention
    cases = bench_torch._forward_cases(torch, q, k, v, False, False, mask)
    want = {
        "sdpa": sdpa(q, k, v, attn_mask=mask),
        "auto": adaptive_attention(q, k, v, attn_mask=mask),
        "composition": adaptive_attention(q, k, v, attn_mask=mask, backend="composition"),
        "attention_entropy": attention_entropy(q, k, attn_mask=mask)[0],
    }
    plain = bench_torch._forward_cases(torch, q, k, v, False, False)
    assert sorted(cases) == sorted(want)
    for name, expected in want.items():
        got, unmasked = cases[name](), plain[name]()
        got, unmasked = (x[0] if isinstance(x, tuple) else x for x in (got, unmasked))
        torch.testing.assert_close(got, expected, rtol=0, atol=0, msg=name)
        assert not torch.allclose(got, unmasked), name


def test_device_run_keeps_a_row_whose_inputs_fail(monkeypatch) -> None:
    """A row whose tensors cannot be made (as out of memory would) holds its error; the
    rows after it are measured, and the report prints the error in the row's place."""
    torch = pytest.importorskip("torch")
    from softmaxtheory.bench import torch as bench_torch

    _stand_in_for_cuda(monkeypatch, torch)
    real = torch.randn

    def randn(*size, **kwargs):
        if size[3] == 8:  # the first shape's D
            raise torch.cuda.OutOfMemoryError("no room for D = 8")
        return real(*size, **kwargs)

    monkeypatch.setattr(torch, "randn", randn)
    doc = bench_torch.measure(torch, "cpu", ((1, 1, 24, 8, 8), (1, 1, 8, 24, 16)), (), 1)
    first, second = doc["rows"][:2], doc["rows"][2:]
    assert all(r["error"] == "out of memory: no room for D = 8" for r in first)
    assert all("error" not in r and r["auto"]["seconds"] > 0 for r in second)
    lines = bench_torch.format_run(doc)
    assert doc["masked_rows"][0]["error"] == "out of memory: no room for D = 8"
    assert sum(ln.startswith("1,1,24,8,8") and ln.endswith("no room for D = 8")
               for ln in lines) == 3  # fmt: skip


def _gpu_report():
    from tests.support.scripts import load_script

    return load_script("docs/_ext/gpu_report.py", "gpu_report")


def _rst_problems(text: str) -> list[str]:
    """docutils' messages (warnings and errors) on `text`."""
    import io

    from docutils.core import publish_doctree

    stream = io.StringIO()
    publish_doctree(text, settings_overrides={"warning_stream": stream, "report_level": 2})
    return [line for line in stream.getvalue().splitlines() if line.strip()]


def test_docs_report_of_a_device_run(monkeypatch, tmp_path) -> None:
    """The docs' section on the GPU run (``docs/_ext/gpu_report.py``) reads the JSON that
    the benchmark writes: here a whole run on CPU tensors with a stand-in for CUDA's
    timers. Its reST parses cleanly; the forward table has a row per measured row with
    the ratios to SDPA computed from the JSON; the failed Triton case is named; each
    target gives the worst ratio of its cases and whether it is met; the masked rows
    have tables of their own and count for no target."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("docutils")
    from softmaxtheory.bench import torch as bench_torch

    gpu_report = _gpu_report()
    _stand_in_for_cuda(monkeypatch, torch)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(bench_torch, "_have_triton", lambda: True)
    path = tmp_path / "bench_cuda_h200.json"
    doc = bench_torch.measure(torch, "cpu", ((1, 2, 40, 24, 16),), ((1, 2, 24, 40, 16),), 1,
                              output=str(path))  # fmt: skip
    # a real device's peak memory is never 0: give SDPA and auto a peak each
    for row in doc["rows"]:
        row["sdpa"]["peak_bytes"], row["auto"]["peak_bytes"] = 1000, 1200
    for row in doc["backward_rows"]:
        row["sdpa_fwd_bwd"]["peak_bytes"], row["auto_fwd_bwd"]["peak_bytes"] = 1000, 2000
    masked, masked_bwd = doc["masked_rows"]  # far slower than any target allows
    masked["auto"]["seconds"] = 37.0 * masked["sdpa"]["seconds"]
    masked["sdpa"]["peak_bytes"], masked["auto"]["peak_bytes"] = 1000, 9000
    # (a ratio no CPU timing of the unmasked rows reaches: 41 once came up by chance)
    masked_bwd["auto_fwd_bwd_detached"]["seconds"] = 4321.0 * masked_bwd["sdpa_fwd_bwd"]["seconds"]
    path.write_text(json.dumps(doc))
    text = gpu_report.report(path)
    assert _rst_problems(text) == [], text
    assert "stand-in, torch" in text and f"the median of {doc['repeat']} timed" in text
    for row in doc["rows"]:
        auto = row["auto"]["seconds"] / row["sdpa"]["seconds"]
        assert f"     - {auto:.2f}×\n" in text
    failed = "``triton``: ``ValueError: backend='triton' needs a CUDA tensor"
    assert text.count(failed) == 3  # the masked row's too
    assert "     - 1.20×\n" in text and "     - 2.00×\n" in text  # the peak ratios
    worst = max(r["auto"]["seconds"] / r["sdpa"]["seconds"] for r in doc["rows"])
    verdict = "met" if worst <= 1.6 else "not met"
    assert f"at most 1.6× SDPA; worst {worst:.2f}× — {verdict}." in text
    assert "at most 1.5× SDPA; worst 2.00× — not met." in text  # memory: 1.2 and 2.0
    assert "at most 1.4× SDPA; worst 4321" not in text
    masked_part = gpu_report.report(path, ("masked",))
    assert masked_part.startswith("With a boolean key-padding mask of shape (B, 1, 1, S)")
    assert "Forward with a key-padding mask" in masked_part and "     - 37.00×\n" in masked_part
    assert "     - 9.00×\n" in masked_part  # the masked peak ratio
    assert "Forward + backward with a key-padding mask" in masked_part
    assert "     - 4321.00×\n" in masked_part and masked_part in text
    assert gpu_report.measured(path).startswith("Speed on a GPU was measured on 20")
    assert gpu_report.measured(path).endswith(f"one stand-in (torch {torch.__version__}, "
                                              f"Triton {doc['triton']}).")  # fmt: skip
    forward_only = gpu_report.report(path, ("forward",))
    assert forward_only.startswith(".. list-table:: Forward") and "backward" not in forward_only
    with pytest.raises(ValueError, match="unknown parts"):
        gpu_report.report(path, ("forward", "plots"))


def test_docs_report_without_a_run_says_so(tmp_path) -> None:
    pytest.importorskip("docutils")
    gpu_report = _gpu_report()
    text = gpu_report.report(tmp_path / "bench_cuda_h200.json")
    assert text.startswith("No GPU run of the current kernels is recorded yet.")
    assert "python tools/gpu_check.py --write-docs" in text and _rst_problems(text) == []
    assert gpu_report.measured(tmp_path / "bench_cuda_h200.json").startswith(
        "Speed on a GPU has not been measured for this design yet"
    )


def test_docs_report_of_a_run_stopped_early(tmp_path) -> None:
    """A run stopped at its time limit (``complete`` false, the backward rows and a forward
    case missing): the report says it stopped, and the targets count what was measured."""
    pytest.importorskip("docutils")
    gpu_report = _gpu_report()

    def case(ms: float, peak: int = 100) -> dict:
        return {"seconds": ms / 1e3, "peak_bytes": peak, "best_seconds": ms / 1e3,
                "host_seconds": 1e-4}  # fmt: skip

    row = {"shape": [8, 16, 4096, 4096, 64], "dtype": "bfloat16", "pass": "forward"}
    doc = {
        "device": "NVIDIA H200", "torch": "2.11.0", "triton": "3.6.0", "cuda": "13.0",
        "repeat": 50, "statistic": "median", "date": "2026-12-01T10:00:00Z",
        "complete": False, "backward_rows": [],
        "rows": [
            {**row, "causal": False, "sdpa": case(1.0), "auto": case(1.25, 120),
             "composition": case(3.0), "attention_entropy": case(0.5), "triton": case(2.0)},
            {**row, "causal": True, "sdpa": case(0.5), "auto": {"error": "OutOfResources: x"}},
            {**row, "shape": [1, 1, 8, 8, 8], "causal": False,
             "error": "RuntimeError: two\nlines with ``quotes``"},
        ],
        "tiles": {"repeat": 10, "rows": [
            {"kernel": "entropy_kernel", "shape": [8, 16, 4096, 4096, 64], "first": True,
             "config": [128, 64, 4, 2], "seconds": 2e-3},
            {"kernel": "entropy_kernel", "shape": [8, 16, 4096, 4096, 64], "first": False,
             "config": [64, 64, 4, 2], "seconds": 1e-3},
            {"kernel": "entropy_bwd_dq_kernel", "shape": [4, 16, 4096, 4096, 64],
             "first": True, "config": [64, 64, 4, 2], "error": "refused: too much"},
        ]},
    }  # fmt: skip
    path = tmp_path / "run.json"
    path.write_text(json.dumps(doc))
    text = gpu_report.report(path)
    assert _rst_problems(text) == [], text
    assert "on 2026-12-01 (UTC): NVIDIA H200, torch 2.11.0, Triton 3.6.0, CUDA 13.0" in text
    assert "The run stopped before its end" in text
    assert "worst 1.25× — met over the 1 of 3 cases measured." in text
    assert "- forward + backward, β attached: at most 2.2× SDPA; not measured." in text
    assert "worst 0.50× — met over the 1 of 3 cases measured." in text  # attention_entropy
    assert "(8, 16, 4096, 4096, 64), causal, ``auto``: ``OutOfResources: x``" in text
    # the causal row: auto failed (time and peak), the cases after it were not timed;
    # the last row failed whole (SDPA and five ratios)
    assert text.count("     - failed\n") == 2 + 6 and text.count("     - –\n") == 3
    # a whole row's error, on one line and without the double backquote of reST literals
    assert "- (1, 1, 8, 8, 8), not causal: ``RuntimeError: two lines with 'quotes'``" in text
    assert "the median of 10 calls of each launch configuration" in text
    assert ("- ``entropy_kernel: fastest (64, 64, 4, 2) 1.000 ms of 2; launched (128, 64, 4, 2)"
            " 2.000 ms (2.00x)`` at (8, 16, 4096, 4096, 64)") in text  # fmt: skip
    assert "- ``entropy_bwd_dq_kernel: no configuration ran`` at (4, 16, 4096, 4096, 64)" in text


def test_kernel_table_says_which_comparison_is_missing():
    # without torch or scipy (not in the cpu extra) their rows and the ratio column were
    # blank with no word why
    from softmaxtheory.cli.bench import _fmt_kernels

    def row(backend):
        return bench.KernelResult(backend, (4, 8), "float64", "beta>1", 0.5, 1e-3, None, 1, 1, 0.1)

    info = {"threads": 2, "bandwidth_gb_per_second": 10.0}
    alone = "\n".join(_fmt_kernels([row("cpu.softmax")], info))
    assert "torch is not installed" in alone and "scipy is not installed" in alone
    both = "\n".join(
        _fmt_kernels([row("cpu.softmax"), row("torch.softmax"), row("scipy.special.softmax")], info)
    )
    assert "not installed" not in both
