"""`softmaxtheory check` never passes falsely and never hangs (issue 15, sections 1, 2 and 6).

The misbehaving kernels run for real: each test writes a small kernel module into a
temporary folder and runs ``python -m softmaxtheory check`` there as a child process.
"""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from softmaxtheory import cli, reference
from softmaxtheory import conformance as conf
from softmaxtheory.cli import check as check_command
from softmaxtheory.spec import Constant
from tests.support import broken_kernels as bk

pytest_plugins = ["pytester"]

KERNELS = """
import os
import sys
import threading

import numpy as np


def softmax(x):
    x = np.asarray(x)
    with np.errstate(invalid="ignore", under="ignore"):
        m = np.max(x, axis=-1, keepdims=True, initial=-np.inf)
        e = np.exp(x - np.where(m == -np.inf, 0, m))
        s = e.sum(axis=-1, keepdims=True)
        y = np.where(s > 0, e / np.where(s > 0, s, 1), 0)
        return np.where(np.isnan(s), np.nan, y).astype(x.dtype)  # NaN rows stay NaN


def softmax_in_float32(x):  # a "float64" kernel that computes in float32
    x = np.asarray(x)
    return softmax(x.astype(np.float32)).astype(x.dtype)


def calls_exit(x):
    sys.exit(0)


def raises_interrupt(x):
    raise KeyboardInterrupt


def hangs(x):
    threading.Event().wait()


def cancelled_on_long_rows(x):  # a BaseException that is not an Exception
    import asyncio

    if np.shape(x)[-1] > 4096:
        raise asyncio.CancelledError("worker pool shut down")
    return softmax(x)


def skips_long_rows(x):  # pytest.skip() inside a kernel: pytest's Skipped, a BaseException
    import pytest

    if np.shape(x)[-1] > 4096:
        pytest.skip("long rows need a GPU")
    return softmax(x)


def aborts(x):
    os.abort()


def exits_on_nan(x):  # fine until the special-value table's NaN row
    if np.isnan(np.asarray(x)).any():
        os._exit(0)
    return softmax(x)


_calls = [0]


def sometimes_reversed(x):  # right, except that every seventh call reverses its rows
    _calls[0] += 1  # (the first call's timing and the values property's 3 fixed rows come first)
    y = softmax(x)
    return y[..., ::-1].copy() if _calls[0] % 7 == 0 else y


def holds_the_gil(x):  # writes its process id, then backtracks in C for ever
    import pathlib
    import re

    pathlib.Path("kernel.pid").write_text(str(os.getpid()))
    re.match(r"(a+)+$", "a" * 64 + "b")


def attention(q, k, v):  # takes no mask= and no is_causal=
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    return (softmax(s) @ v).astype(q.dtype)
"""

#: Every child run is bounded: a hang in the code under test fails the test, never the CI job.
LIMIT = 300


def _check(folder: Path, *args: str, python: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *python, "-m", "softmaxtheory", "check", *args],
        cwd=folder, capture_output=True, text=True, timeout=LIMIT, check=False,
    )  # fmt: skip


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "mykernels.py").write_text(KERNELS)
    return tmp_path


@pytest.fixture(scope="module")
def shared_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The kernel module in a folder of its own, for runs that several tests read."""
    path = tmp_path_factory.mktemp("shared")
    (path / "mykernels.py").write_text(KERNELS)
    return path


@pytest.fixture(scope="module")
def hangs_run(shared_folder: Path) -> subprocess.CompletedProcess:
    """One run of a kernel that never returns (each property gets --timeout 1)."""
    return _check(shared_folder, "mykernels:hangs", "--timeout", "1")


@pytest.fixture(scope="module")
def float32_in_float64_run(shared_folder: Path) -> subprocess.CompletedProcess:
    """One run of a "float64" kernel that computes in float32 (dtype_shape only)."""
    return _check(shared_folder, "mykernels:softmax_in_float32", "--only", "dtype_shape")


# -- section 1: never a false pass, never a hang ----------------------------------------


@pytest.mark.parametrize(
    ("kernel", "says"),
    [
        ("calls_exit", "the kernel raised SystemExit(0) (it called sys.exit)"),
        ("raises_interrupt", "the kernel raised KeyboardInterrupt"),
        ("aborts", "was killed by SIGABRT"),
    ],
)
def test_kernel_that_ends_its_process_fails(folder, kernel, says):
    res = _check(folder, f"mykernels:{kernel}", "--only", "values", "--only", "dtype_shape")
    assert res.returncode == 1, res.stdout + res.stderr
    assert says in res.stdout
    assert f"mykernels:{kernel}: DOES NOT CONFORM (2 properties failed: values, dtype_shape)" in (
        res.stdout
    )


def test_a_terminated_check_takes_its_child_along(folder):
    """SIGTERM to ``check`` (a ``timeout``, a CI job's stop) kills the kernel's process.

    The child ends by itself when its stdin closes, but only if its watching thread gets
    the GIL; a kernel in a long C call holds it, and the child outlived the check.
    """
    import os
    import signal
    import time

    proc = subprocess.Popen(
        [sys.executable, "-m", "softmaxtheory", "check", "mykernels:holds_the_gil",
         "--only", "values"],
        cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    pid_file = folder / "kernel.pid"
    child = None
    try:
        deadline = time.monotonic() + LIMIT
        while not pid_file.exists() or not pid_file.read_text():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        child = int(pid_file.read_text())
        time.sleep(0.5)  # in the regular expression
        proc.send_signal(signal.SIGTERM)
        status = proc.wait(timeout=60)  # (check waits for the child it killed: reaped)
        with pytest.raises(ProcessLookupError):
            os.kill(child, 0)
        assert status == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
        if child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)


@pytest.mark.parametrize("kernel", ["cancelled_on_long_rows", "skips_long_rows"])
@pytest.mark.parametrize("mode", ["child", "in-process"])
def test_a_kernel_raising_a_base_exception_fails_the_property(folder, kernel, mode):
    """asyncio's CancelledError ended an in-process check with a traceback, and was reported
    from the child as its exit ("called os._exit?"); pytest.skip() inside a kernel skipped
    the property in the plugin. Both are the kernel raising: a failure, named."""
    extra = ("--in-process",) if mode == "in-process" else ()
    res = _check(folder, f"mykernels:{kernel}", "--dtype", "float32", "--only", "long_rows",
                 *extra)  # fmt: skip
    assert res.returncode == 1, res.stdout + res.stderr
    name = "asyncio.exceptions.CancelledError" if kernel.startswith("cancel") else "Skipped"
    assert "the kernel raised" in res.stdout and name in res.stdout, res.stdout
    assert "a BaseException that is not an Exception" in res.stdout
    assert "Traceback" not in res.stderr
    assert f"mykernels:{kernel}: DOES NOT CONFORM (1 property failed: long_rows)" in res.stdout


def test_exit_in_one_property_names_it_and_the_others_still_run(folder):
    res = _check(
        folder, "mykernels:exits_on_nan", "--dtype", "float32", "--examples", "5",
        "--only", "dtype_shape", "--only", "special_values", "--only", "invariances",
    )  # fmt: skip
    assert res.returncode == 1, res.stdout + res.stderr
    lines = {ln.split()[1]: ln for ln in res.stdout.splitlines() if ln[:4] in ("PASS", "FAIL")}
    assert lines["dtype_shape"].startswith("PASS")
    assert lines["special_values"].startswith("FAIL")
    assert "exited with status 0" in lines["special_values"]
    assert lines["invariances"].startswith("PASS")  # run by a new child
    assert "=== special_values: stopped ===" in res.stdout
    assert "DOES NOT CONFORM (1 property failed: special_values)" in res.stdout


def test_hanging_kernel_times_out(hangs_run):
    res = hangs_run  # the first property is values
    assert res.returncode == 1, res.stdout + res.stderr
    assert "FAIL  values" in res.stdout
    assert "timed out: no result within 1 s (--timeout)" in res.stdout


def test_two_timeouts_stop_the_run_and_name_what_was_not_run(hangs_run):
    res = hangs_run
    assert res.returncode == 1
    rest = [name for name in conf.properties_for("softmax") if name not in ("values", "long_rows")]
    assert (
        "DOES NOT CONFORM (2 properties failed: values, long_rows; "
        f"{len(rest)} properties skipped: {', '.join(rest)})"
    ) in res.stdout
    assert "not run: two properties timed out" in res.stdout


@pytest.mark.parametrize(
    ("module", "code", "says"),
    [
        ("import sys\nsys.exit(0)\n", 2, "importing module 'k' called sys.exit(0)"),
        ("import os\nos._exit(0)\n", 1, "the process importing the kernel exited with status 0"),
        ("import threading\nthreading.Event().wait()\n", 1, "the kernel was not loaded within 1 s"),
    ],
)
def test_module_that_ends_or_hangs_while_imported(tmp_path, module, code, says):
    (tmp_path / "k.py").write_text(module + "def f(x):\n    return x\n")
    res = _check(tmp_path, "k:f", "--timeout", "1")
    assert res.returncode == code, res.stdout + res.stderr
    assert says in res.stdout + res.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["--entropy-eps", "-1"],
        ["--entropy-eps", "nan"],
        ["--entropy-eps", "inf"],
        ["--examples", "0"],
        ["--timeout", "0"],
        ["--timeout", "nan"],
        ["--schedule", "poly:"],
        ["--timeout", "5", "--in-process"],
        ["--schedule", "constant:2"],  # kind softmax: was ignored, the kernel checked at beta 1
        ["--kind", "entropy", "--schedule", "paper"],
        ["--entropy-eps", "1e-9"],  # kind softmax takes no entropy
    ],
)
def test_bad_options_are_usage_errors_before_the_kernel_runs(folder, argv):
    res = _check(folder, "mykernels:aborts", *argv)  # the kernel would abort if it ran
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stdout == ""
    assert res.stderr.startswith("softmaxtheory check: error: ") and res.stderr.count("\n") == 1


def test_bad_entropy_eps_in_the_api_is_a_usage_error():
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(conf.ConformanceUsageError, match="entropy_eps must be"):
            conf.Target(np.exp, kind="entropy", entropy_eps=bad)
    with pytest.raises(conf.ConformanceUsageError, match="examples must be"):
        conf.Target(np.exp, examples=0)


def test_skipped_properties_are_named_and_strict_fails_them(folder):
    common = ("mykernels:attention", "--kind", "attention", "--dtype", "float32",
              "--schedule", "constant:1", "--examples", "3")  # fmt: skip
    res = _check(folder, *common)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (
        "mykernels:attention: CONFORMS (2 properties skipped: attention_masks, attention_causal)"
        in res.stdout
    )
    res = _check(folder, *common, "--strict")
    assert res.returncode == 1
    assert "DOES NOT CONFORM (2 properties failed: attention_masks, attention_causal)" in (
        res.stdout
    )
    assert "skipped, a failure under strict: the kernel takes no mask=" in res.stdout


def test_uninspectable_kernel_is_probed_by_calling():
    """torch's sdpa has no inspectable signature: its keywords are found by calling it.

    That the mask and causal properties then run and pass is checked on the
    command's run below (the same probe, in the child).
    """
    torch = pytest.importorskip("torch")
    sdpa = torch.nn.functional.scaled_dot_product_attention
    name = "torch.nn.functional:scaled_dot_product_attention"
    t = conf.Target(sdpa, name, kind="attention", framework="torch", dtype="float32",
                    schedule=Constant(1), examples=3)  # fmt: skip
    assert t.mask_keyword == "attn_mask" and t.takes_causal and not t.takes_schedule
    assert t.takes_gqa  # found by four query heads over two key heads
    assert not conf.Target(lambda q, k, v, **kw: q, kind="attention").takes_gqa  # **kw: no


def _kw_attention(q, k, v, attn_mask=None, is_causal=False, scale=None, **kwargs):
    """Correct plain attention in SDPA's conventions; other options (dropout_p=...) are
    taken by ``**kwargs`` and ignored."""
    s = q @ np.swapaxes(k, -1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if is_causal:
        s = np.where(np.tri(*s.shape[-2:], dtype=bool), s, -np.inf)
    if attn_mask is not None:
        s = np.where(attn_mask, s, -np.inf) if attn_mask.dtype == bool else s + attn_mask
    with np.errstate(invalid="ignore"):
        e = np.exp(s - np.max(s, axis=-1, keepdims=True))
        return (e / e.sum(axis=-1, keepdims=True)) @ v


def test_a_trailing_kwargs_takes_no_keyword_it_drops():
    """A ``**kwargs`` is not a promise to honour every keyword: the keywords the
    signature names are taken (``attn_mask`` before ``mask``), the others only if a
    call shows their effect. Before, ``mask=`` and ``schedule=`` went into the
    ``**kwargs`` and the kernel failed three properties by 1e10 ulps."""
    t = conf.Target(_kw_attention, kind="attention", schedule=Constant(1))
    assert t.mask_keyword == "attn_mask" and t.takes_causal and t.takes_scale
    assert not t.takes_schedule  # two schedules, one result: dropped
    assert t.takes_eps  # passed (a **kwargs that drops it computes what it would anyway)
    for prop in ("attention_masks", "attention_causal", "attention_layouts"):
        assert conf.run_property(prop, t).status == "pass", prop
    res = conf.run_property("schedules", conf.Target(lambda x, **kw: bk.adaptive_softmax(x),
                                                     kind="adaptive_softmax"))  # fmt: skip
    assert res.status == "skip" and "takes no schedule=" in res.message
    # a **kwargs that forwards the keyword is probed as taking it
    forwards = conf.Target(lambda x, **kw: bk.adaptive_softmax(x, **kw), kind="adaptive_softmax")
    assert forwards.takes_schedule
    assert conf.run_property("schedules", forwards).status == "pass"


def test_a_torch_module_is_read_by_its_forward():
    """``inspect.signature`` of an ``nn.Module`` is ``(*args, **kwargs)``; its forward
    says what it takes. Before, a module got ``scale=`` and ``mask=`` and raised."""
    torch = pytest.importorskip("torch")
    from softmaxtheory.accelerated.torch import adaptive_softmax

    class Attention(torch.nn.Module):
        def forward(self, q, k, v, attn_mask=None, is_causal=False):
            return torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, is_causal=is_causal
            )

    class Adaptive(torch.nn.Module):
        def forward(self, x):
            return adaptive_softmax(x)

    t = conf.Target(Attention(), kind="attention", framework="torch", dtype="float32",
                    schedule=Constant(1))  # fmt: skip
    assert t.mask_keyword == "attn_mask" and t.takes_causal
    assert not t.takes_scale and not t.takes_schedule
    assert conf.run_property("attention_masks", t).status == "pass"
    a = conf.Target(Adaptive(), kind="adaptive_softmax", framework="torch", dtype="float32")
    assert not a.takes_schedule and conf.run_property("schedules", a).status == "skip"


def _guarded_entropy(x, entropy_eps=1e-9):
    """A correct guarded entropy whose guard defaults to the paper's 1e-9."""
    x = np.asarray(x)
    return bk._entropy(bk._work(x), entropy_eps).astype(x.dtype)


def test_entropy_eps_is_passed_when_taken_zero_included():
    """A kernel whose own guard defaults to 1e-9 is checked at the run's entropy_eps:
    0.0 is passed too. Before, only a non-zero entropy_eps was, and the kernel failed
    every property by 1e12 ulps against the unguarded reference."""
    t = conf.Target(_guarded_entropy, "tests.test_check_trust:_guarded_entropy", kind="entropy")
    assert t._kwargs(None) == {"entropy_eps": 0.0}
    assert conf.run_property("values", t).status == "pass"
    assert "entropy_eps=0.0" in t.repro
    # the softmax kind has no entropy: nothing is passed
    assert conf.Target(lambda x, entropy_eps=0.0: bk.softmax(x))._kwargs(None) == {}


def _listing_guard_only(x, *, entropy_eps=1e-9):
    """Defect: takes entropy_eps= and always computes the paper's guarded entropy."""
    return bk.adaptive_softmax(x, entropy_eps=1e-9)


def _adaptive_dropping_eps_in_kwargs(x, **kwargs):
    """A kernel whose **kwargs swallows entropy_eps= (it implements the exact entropy)."""
    return bk.adaptive_softmax(x)


def test_a_kernel_naming_entropy_eps_is_checked_in_both_modes():
    """The spec has two entropy modes, and a kernel whose signature names entropy_eps= is
    checked in both: one that drops the keyword (right at 0, the default run's mode) fails
    at 1e-9, with the mode named, a hint and a repro that binds it; one that implements
    only the guard fails at 0 in a run at 1e-9. Before, a default run passed both."""
    name = "tests.support.broken_kernels:adaptive_ignoring_entropy_eps"
    t = conf.Target(bk.adaptive_ignoring_entropy_eps, name, kind="adaptive_softmax")
    assert conf.run_property("values", t).status == "pass"  # right at the run's mode
    res = conf.run_property("branch_points", t)
    assert res.status == "fail"
    assert "entropy_eps=1e-09 (the spec's other entropy mode" in res.message
    assert "hint: the same input passed at entropy_eps=0.0" in res.message
    assert "seems to compute in float32" not in res.message  # the precision hint's guess
    repro = res.message.split("repro:\n", 1)[1]
    assert "functools.partial(kernel, entropy_eps=1e-09)" in repro
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(repro, "<repro>", "exec"), {})
    got, exact = (float(v) for v in out.getvalue().split())
    assert got != exact  # the repro shows the mismatch
    name = "tests.test_check_trust:_listing_guard_only"
    guarded = conf.Target(_listing_guard_only, name, kind="adaptive_softmax", entropy_eps=1e-9)
    res = conf.run_property("branch_points", guarded)
    assert res.status == "fail" and "entropy_eps=0.0 (the spec's other entropy mode" in res.message


def test_the_other_entropy_mode_passes_a_correct_kernel_and_skips_kwargs():
    """A correct kernel passes both modes, the second mode's rows counted; a **kwargs that
    may drop the keyword is checked in the run's mode alone, and the softmax kind never."""
    named = conf.Target(bk.adaptive_softmax, kind="adaptive_softmax")
    dropped = conf.Target(_adaptive_dropping_eps_in_kwargs, kind="adaptive_softmax")
    assert named.names_eps and dropped.takes_eps and not dropped.names_eps
    both, one = (conf.run_property("branch_points", t) for t in (named, dropped))
    assert both.status == one.status == "pass"
    assert both.checks == one.checks + 7  # the fixed rows again: 2048, tied rows near the
    # largest float, far block (plain and masked), 4099, 1031 rows and 69635 items
    for eps in (0.0, 1e-9):  # the reference itself, in either mode, with the other
        t = conf.Target(reference.adaptive_attention, kind="attention", entropy_eps=eps)
        assert t.names_eps and conf.run_property("attention_batch", t).status == "pass"
    soft = conf.Target(lambda x, entropy_eps=0.0: bk.softmax(x), kind="softmax")
    assert soft.names_eps and conf.run_property("values", soft).status == "pass"


def test_sdpa_passed_directly_runs_every_property():
    """SDPA's keywords are found by probing, so nothing is skipped; every property passes
    but the causal one where torch's CPU flash kernel gives NaN rows.

    ``is_causal=True`` with a scale of 0 or below (the suite draws them for a kernel that
    takes ``scale=``) gives NaN rows in torch 2.13; the failure's repro shows such a call.
    Should a release fix it, the property passes and so does this test.
    """
    pytest.importorskip("torch")
    res = subprocess.run(
        [sys.executable, "-m", "softmaxtheory", "check",
         "torch.nn.functional:scaled_dot_product_attention", "--kind", "attention",
         "--framework", "torch", "--schedule", "constant:1", "--examples", "3"],
        capture_output=True, text=True, timeout=LIMIT, check=False,
    )  # fmt: skip
    assert res.returncode in (0, 1), res.stdout + res.stderr
    assert "SKIP" not in res.stdout
    lines = res.stdout.splitlines()
    for name in conf.properties_for("attention"):
        line = next(ln for ln in lines if f" {name} " in ln)
        if name == "attention_causal" and line.startswith("FAIL"):
            call = next(ln for ln in lines if ln.startswith("print(float(kernel("))
            assert "is_causal=True" in call and re.search(r"scale=(-|0\.0\b)", call), call
            assert "# nan" in call, call
            continue
        assert line.startswith("PASS") and int(line.split()[-2]) > 0, line
    verdict = "CONFORMS [" if res.returncode == 0 else "DOES NOT CONFORM (1 property failed: "
    assert f"scaled_dot_product_attention: {verdict}" in res.stdout


def test_in_process_run_still_fails_a_kernel_that_calls_exit(folder, monkeypatch, capsys):
    monkeypatch.chdir(folder)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, "mykernels", raising=False)
    code = cli.main(["check", "mykernels:calls_exit", "--in-process", "--only", "dtype_shape"])
    assert code == 1
    assert "SystemExit(0)" in capsys.readouterr().out


def test_nondeterministic_kernel_fails_with_its_first_result(folder, monkeypatch, capsys):
    # Hypothesis replays a counterexample; one that passes then raised FlakyFailure, which
    # ended the property as a crash ("the process exited") or, in process, a traceback
    monkeypatch.chdir(folder)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, "mykernels", raising=False)
    code = cli.main(["check", "mykernels:sometimes_reversed", "--in-process", "--only", "values"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "FAIL  values" in out
    assert "the kernel is not deterministic" in out
    assert "softmax is outside the error model" in out and "repro:" in out
    assert "Traceback" not in out and "exited" not in out


@pytest.mark.parametrize(
    ("returns", "says"),
    [
        (lambda y: y.tolist(), "the kernel returned list, not a numpy array"),
        (lambda y: None, "the kernel returned None, not a numpy array"),
    ],
)
def test_numpy_kernel_must_return_an_array(returns, says):
    # a list passed as float64 (it has no dtype to keep), as torch's framework refuses it
    def kernel(x):
        return returns(_np_softmax(x))

    res = conf.run_property("values", conf.Target(kernel, "k"))
    assert res.status == "fail" and says in res.message, res.message


def test_numpy_kernel_returning_a_tensor_is_named():
    torch = pytest.importorskip("torch")
    res = conf.run_property(
        "dtype_shape", conf.Target(lambda x: torch.from_numpy(_np_softmax(x)), "k")
    )
    assert res.status == "fail" and "returned torch.Tensor, not a numpy array" in res.message
    assert "checked with --framework torch" in res.message  # the way out


def _np_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# -- section 2: find the kernel where the user is -----------------------------------------


def test_kernel_is_imported_from_the_current_folder(folder):
    # -P keeps the current folder off sys.path, as for the installed `softmaxtheory` command
    for mode in ((), ("--in-process",)):
        res = _check(folder, "mykernels:softmax", "--only", "dtype_shape", *mode, python=("-P",))
        assert res.returncode == 0, res.stdout + res.stderr
        assert "mykernels:softmax: CONFORMS" in res.stdout


def test_installed_command_imports_from_the_current_folder(folder):
    script = Path(sys.executable).with_name("softmaxtheory")
    if not script.exists():
        pytest.skip("no softmaxtheory script next to this interpreter")
    res = subprocess.run(
        [str(script), "check", "mykernels:softmax", "--only", "dtype_shape"],
        cwd=folder, capture_output=True, text=True, timeout=LIMIT, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr


def test_load_kernel_puts_the_current_folder_first(folder, monkeypatch):
    monkeypatch.chdir(folder)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(folder))])
    monkeypatch.delitem(sys.modules, "mykernels", raising=False)
    fn, name = conf.load_kernel("mykernels:softmax")
    assert name == "mykernels:softmax" and sys.path[0] == str(folder)
    np.testing.assert_allclose(fn(np.zeros(2)), [0.5, 0.5])


def test_plugin_reports_an_import_failure_once(pytester):
    result = pytester.runpytest_subprocess(
        "--pyargs", "softmaxtheory.conformance", "--softmax-kernel", "nosuchmod_abc:f",
        "-p", "no:cacheprovider",
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    # the child process finds the bad path; pytest.exit reports it once, on the terminal
    said = result.stdout.str() + result.stderr.str()
    assert said.count("cannot import module 'nosuchmod_abc'") == 1, said
    assert "softmaxtheory conformance: cannot import module" in said
    result.stdout.no_fnmatch_line("*passed*")


@pytest.mark.parametrize(
    ("option", "says"),
    [
        (("--softmax-entropy-eps", "-1"), "entropy_eps must be a finite number >= 0"),
        # a softmax kernel is checked at beta = 1 whatever the option said: refused
        (("--softmax-schedule", "constant:2"), "--softmax-schedule does not apply to kind softmax"),
    ],
)
def test_plugin_bad_option_is_a_usage_error(pytester, option, says):
    pytester.makepyfile(mykernels=KERNELS)
    result = pytester.runpytest_subprocess(
        "--pyargs", "softmaxtheory.conformance", "--softmax-kernel", "mykernels:softmax",
        *option, "-p", "no:cacheprovider",
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert says in result.stderr.str()


def test_plugin_fails_the_property_whose_kernel_aborts(pytester):
    pytester.makepyfile(mykernels=KERNELS)
    result = pytester.runpytest_subprocess(
        "--pyargs", "softmaxtheory.conformance", "--softmax-kernel", "mykernels:exits_on_nan",
        "--softmax-dtype", "float32", "--softmax-examples", "5", "-p", "no:cacheprovider",
        "-k", "test_dtype_shape or test_special_values or test_invariances",
    )  # fmt: skip
    result.assert_outcomes(passed=2, failed=1, deselected=len(conf.PROPERTIES) - 3)
    out = result.stdout.str()
    assert "special_values: the process running the kernel exited with status 0" in out


def test_plugin_in_process_fails_a_kernel_that_calls_exit(pytester):
    pytester.makepyfile(mykernels=KERNELS)
    result = pytester.runpytest_subprocess(
        "--pyargs", "softmaxtheory.conformance", "--softmax-kernel", "mykernels:calls_exit",
        "--softmax-in-process", "-p", "no:cacheprovider", "-k", "test_dtype_shape",
    )  # fmt: skip
    result.assert_outcomes(failed=1, deselected=len(conf.PROPERTIES) - 1)
    assert "SystemExit(0)" in result.stdout.str()


# -- section 6: messages ------------------------------------------------------------------


def test_one_check_is_singular():
    assert conf.PropertyResult("dtype_shape", "pass", 0.5, 1).line().endswith(" 1 check")
    assert conf.PropertyResult("values", "pass", 0.5, 2).line().endswith(" 2 checks")


@pytest.mark.parametrize("kind", ["softmax", "adaptive_softmax", "attention"])
def test_report_columns_line_up_for_every_kind(kind):
    """attention_special_values (24 characters) overran the name column of 20: its ulps and
    checks stood four places right of every other line's."""
    from softmaxtheory._check.properties import name_width

    width = name_width(kind)
    lines = [
        conf.PropertyResult(name, "pass", 12.5, 7).line(width) for name in conf.properties_for(kind)
    ]
    assert len({line.index("max 12.5 ulp") for line in lines}) == 1
    assert len({line.index("7 checks") for line in lines}) == 1
    if kind != "attention":
        assert width == 20  # the row kinds' reports keep their columns


def test_verdict_wording():
    R = conf.PropertyResult
    assert check_command.verdict([R("values", "pass")]) == "CONFORMS"
    assert check_command.verdict([R("values", "fail"), R("long_rows", "fail")]) == (
        "DOES NOT CONFORM (2 properties failed: values, long_rows)"
    )


def test_float64_kernel_computing_in_float32_is_named(
    float32_in_float64_run, shared_folder, monkeypatch
):
    res = float32_in_float64_run
    assert res.returncode == 1
    assert "the kernel seems to compute in float32, not float64" in res.stdout
    # the hint comes before the repro, which stays runnable; it imports only what it uses
    snippet = res.stdout.split("repro:\n", 1)[1].split("\n\n", 1)[0]
    assert "hint" not in snippet and "softmaxtheory.strategies" not in snippet
    assert "functools" not in snippet
    monkeypatch.syspath_prepend(str(shared_folder))
    monkeypatch.delitem(sys.modules, "mykernels", raising=False)
    exec(compile(snippet, "<repro>", "exec"), {"__name__": "repro"})


def test_header_schedule_agrees_with_the_failure_rows_for_softmax(float32_in_float64_run):
    res = float32_in_float64_run
    header = res.stdout.split("\n\n", 1)[0]
    assert "schedule Constant(beta=1)" in header and "PaperPolynomial" not in header
    assert "(Constant(beta=1))" in res.stdout  # the failure row's schedule


def test_repro_imports_only_what_it_uses():
    t = conf.Target(np.exp, "pkg.mod:f", kwargs={"axis": -1})
    assert t.repro == "import functools\nfrom pkg.mod import f\nkernel = f\n" + (
        "kernel = functools.partial(kernel, axis=-1)"
    )
    assert "strategies" not in conf.Target(np.exp, "pkg.mod:f").repro


def _entropy_guard_added_twice(x, entropy_eps=0.5):
    """Right with its default guard; any other guard is added to the entropy once more."""
    from softmaxtheory import reference

    x = np.asarray(x)
    h = np.asarray(reference.entropy(x, entropy_eps=entropy_eps), dtype=x.dtype)
    return h if entropy_eps == 0.5 else h + entropy_eps


def test_the_repro_passes_the_entropy_guard_the_suite_passed(capsys):
    """With --entropy-eps, the suite calls ``kernel(x, entropy_eps=...)``; the repro called
    ``kernel(x)``, which ran the kernel's default guard and printed the right value."""
    target = conf.Target(
        _entropy_guard_added_twice, f"{__name__}:_entropy_guard_added_twice", kind="entropy",
        entropy_eps=1e-3,
    )  # fmt: skip
    res = conf.run_property("values", target)
    assert res.status == "fail"
    snippet = res.message.split("repro:\n", 1)[1]
    assert "kernel = functools.partial(kernel, entropy_eps=0.001)" in snippet
    exec(compile(snippet, "<repro>", "exec"), {})
    kernel_value, reference_value = capsys.readouterr().out.split()
    assert float(kernel_value) == float(reference_value) + 1e-3


def test_special_value_note_names_the_table_value():
    def nan_when_masked(x):  # torch's convention for a fully masked row
        x = np.asarray(x)
        e = np.exp(x - np.max(x, axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    res = conf.run_property("special_values", conf.Target(nan_when_masked, dtype="float32"))
    assert res.status == "pass"
    assert "fully masked row (3 items, one item, 4099 items): NaN where the table gives zeros" in (
        res.message
    )


def test_help_says_check_not_prove(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "check a kernel against the certified reference" in out
    assert "prove" not in out


class _Uninspectable:
    """Stands in for a compiled kernel (no signature to read): the keywords are probed."""

    __signature__ = "not inspectable"

    def __init__(self, broadcast: bool):
        self.broadcast = broadcast

    def __call__(self, q, k, v, mask=None, is_causal=False, **ignored):
        if not self.broadcast and not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
            raise ValueError("q, k, v must have the same batch shape")
        return conf_reference().adaptive_attention(q, k, v, mask=mask, is_causal=is_causal)


def conf_reference():
    from softmaxtheory import reference

    return reference


@pytest.mark.parametrize("broadcast", [False, True])
def test_a_kernel_that_does_not_group_heads_is_not_probed_as_grouping(broadcast):
    """The enable_gqa probe gave both calls two query heads over one key head: a kernel
    needing equal heads failed both ('both fail: taken'), and a broadcasting one ignoring
    the keyword passed both; either then failed attention_batch on a keyword it never took."""
    t = conf.Target(_Uninspectable(broadcast), "k:k", kind="attention", examples=2)
    assert not t.takes_gqa
    assert conf.run_property("attention_batch", t).status == "pass"


def _entropy_off_on_some_long_rows(x):
    """Defect: rows of 257 to 2047 items but 400 (a path the fixed rows never take) get an
    entropy 1e-6 too large."""
    x = np.asarray(x)
    h = bk.entropy(x)
    n = x.shape[-1]
    return h * (1 + 1e-6) if 256 < n < 2048 and n != 400 else h


def test_a_drawn_long_row_is_written_out_in_the_repro():
    """A failing row that Hypothesis drew has no source text; longer than the helpers
    write out, its repro named ``<your x>``, which does not run. The suite writes it out."""
    name = "tests.test_check_trust:_entropy_off_on_some_long_rows"
    res = conf.run_property("branch_points", conf.Target(_entropy_off_on_some_long_rows, name,
                                                         kind="entropy"))  # fmt: skip
    assert res.status == "fail" and "H in [5, H_off]" in res.message
    snippet = res.message.split("repro:\n", 1)[1]
    assert "<your" not in snippet
    namespace: dict = {}
    exec(compile(snippet, "<repro>", "exec"), namespace)
    x = namespace["x"]
    assert 256 < x.shape[-1] < 2048 and x.shape[-1] != 400
