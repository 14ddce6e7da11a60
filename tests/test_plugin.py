"""The pytest11 plugin: tiny, lazy, inert unless asked; runs the conformance suite."""

from __future__ import annotations

import subprocess
import sys

import pytest

from softmaxtheory import conformance as conf

pytest_plugins = ["pytester"]

KERNELS = """
import numpy as np

def softmax(x):
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)

def softmax_bits(x):  # entropy in bits when used as an entropy kernel: wrong
    p = softmax(x)
    with np.errstate(divide="ignore", invalid="ignore"):
        return -np.sum(np.where(p > 0, p * np.log2(p), 0), axis=-1)
"""


def test_plugin_import_is_lazy():
    code = (
        "import sys, softmaxtheory.pytest_plugin\n"
        "bad = ('numba', 'torch', 'hypothesis', 'mpmath', 'softmaxtheory.reference',\n"
        "       'softmaxtheory.conformance', 'softmaxtheory.testing')\n"
        "print(sorted(m for m in bad if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_plugin_is_registered(pytestconfig):
    assert pytestconfig.pluginmanager.has_plugin("softmaxtheory")
    assert pytestconfig.getoption("--softmax-kernel") is None


def test_session_without_options_is_unchanged(pytester):
    pytester.makepyfile(test_plain="def test_ok():\n    assert True\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert "softmaxtheory conformance" not in result.stdout.str()


def test_fixtures(pytester):
    pytester.makepyfile(
        test_fix="""
import numpy as np

def test_reference(softmax_reference, softmax_testing):
    x = np.array([[0.0, 1.0, 2.0]])
    y = softmax_reference.softmax(x)
    assert softmax_testing.assert_softmax_close(y, x).max_ulp == 0
"""
    )
    pytester.runpytest_subprocess().assert_outcomes(passed=1)


def test_conformance_suite_passes_a_correct_kernel(pytester):
    pytester.makepyfile(mykernels=KERNELS)
    result = pytester.runpytest_subprocess(
        "--pyargs", "softmaxtheory.conformance", "--softmax-kernel", "mykernels:softmax",
        "--softmax-dtype", "float32", "--softmax-examples", "10", "-p", "no:cacheprovider",
    )  # fmt: skip
    ran = len(conf.properties_for("softmax"))
    result.assert_outcomes(passed=ran, skipped=len(conf.PROPERTIES) - ran)
    out = result.stdout.str()
    assert "softmaxtheory conformance: softmaxtheory" in out
    assert (
        "kernel mykernels:softmax: kind softmax, framework numpy, device cpu, dtype float32" in out
    )


def test_conformance_suite_fails_a_broken_kernel_naming_the_property(pytester):
    pytester.makepyfile(mykernels=KERNELS)
    result = pytester.runpytest_subprocess(
        "--pyargs", "softmaxtheory.conformance", "--softmax-kernel", "mykernels:softmax_bits",
        "--softmax-kind", "entropy", "--softmax-examples", "10", "-p", "no:cacheprovider",
        "-k", "test_values",
    )  # fmt: skip
    result.assert_outcomes(failed=1, deselected=len(conf.PROPERTIES) - 1)
    out = result.stdout.str()
    assert "test_values" in out and "values: masked row far from 0" in out  # the first row
    assert "repro:" in out and "from mykernels import softmax_bits" in out


def test_missing_kernel_option_is_a_clear_error(pytester):
    result = pytester.runpytest_subprocess(
        "--pyargs", "softmaxtheory.conformance", "-k", "test_values", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(failed=1, deselected=len(conf.PROPERTIES) - 1)
    assert "--softmax-kernel pkg.mod:func" in result.stdout.str()


@pytest.mark.parametrize("path", ["nosuchmod_abc:f", "mykernels:nothing"])
def test_bad_kernel_path_is_one_usage_error(pytester, path):
    pytester.makepyfile(mykernels=KERNELS)
    result = pytester.runpytest_subprocess(
        "--pyargs", "softmaxtheory.conformance", "--softmax-kernel", path,
        "-p", "no:cacheprovider",
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    out = result.stdout.str() + result.stderr.str()  # one message, not one per test
    assert out.count("Exit: softmaxtheory conformance: ") == 1
    assert ("cannot import module" in out) != ("has no attribute" in out)


def test_a_timeout_in_process_is_refused(pytester):
    """--softmax-timeout bounds the child process: with --softmax-in-process it was silently
    ignored, where the CLI refuses --timeout with --in-process."""
    pytester.makepyfile(mykernels=KERNELS)
    result = pytester.runpytest_subprocess(
        "--pyargs", "softmaxtheory.conformance", "--softmax-kernel", "mykernels:softmax",
        "--softmax-kind", "softmax", "--softmax-in-process", "--softmax-timeout", "5",
        "-p", "no:cacheprovider",
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    out = result.stdout.str() + result.stderr.str()
    assert "--softmax-timeout needs the child process: drop --softmax-in-process" in out


@pytest.mark.parametrize(
    ("module", "timeout", "says"),
    [
        ("import os\nos._exit(0)\n", "60", "exited"),  # passed, exit 0: pytest itself ended
        (
            "import time\ntime.sleep(600)\n",
            "3",
            "not loaded within 3 s (--softmax-timeout)",
        ),  # hung pytest
    ],
)
def test_a_kernel_module_that_exits_or_hangs_on_import_fails(pytester, module, timeout, says):
    # the kernel used to be imported into the pytest process at the session's start
    pytester.makepyfile(badimport=module + "def f(x):\n    return x\n")
    result = pytester.runpytest_subprocess(
        "--pyargs", "softmaxtheory.conformance", "--softmax-kernel", "badimport:f",
        "--softmax-timeout", timeout, "-k", "test_values", "-p", "no:cacheprovider",
        timeout=120,
    )  # fmt: skip
    result.assert_outcomes(failed=1, deselected=len(conf.PROPERTIES) - 1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert says in result.stdout.str()


@pytest.mark.parametrize("how", ["ini", "conftest"])
def test_the_child_imports_the_kernel_with_the_sys_path_of_pytest(pytester, how):
    """pytest's pythonpath setting and a conftest's sys.path entries reached only the pytest
    process: the child could not import the kernel (a usage error) where in-process did."""
    folder = "src" if how == "ini" else "lib"
    pytester.mkdir(folder)
    (pytester.path / folder / "pathkernel.py").write_text(KERNELS)
    if how == "ini":
        pytester.makeini("[pytest]\npythonpath = src\n")
    else:
        pytester.makeconftest(
            "import pathlib, sys\nsys.path.insert(0, str(pathlib.Path(__file__).parent / 'lib'))\n"
        )
    result = pytester.runpytest_subprocess(
        "--pyargs", "softmaxtheory.conformance", "--softmax-kernel", "pathkernel:softmax",
        "--softmax-examples", "3", "-k", "test_values", "-p", "no:cacheprovider",
    )  # fmt: skip
    result.assert_outcomes(passed=1, deselected=len(conf.PROPERTIES) - 1)


def _logging_kernel(path):
    """A correct kernel that appends its process id and row length to `path` on every call."""
    return KERNELS + (
        "\nimport os\n\ndef logged(x):\n"
        f"    with open({str(path)!r}, 'a') as f:\n"
        "        f.write(f'{os.getpid()} {x.shape[-1]}\\n')\n"
        "    return softmax(x)\n"
    )


def _calls(path):
    """The (process id, row length) of each call that `_logging_kernel` logged."""
    return [tuple(line.split()) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("dist", ["load", "loadfile"])
def test_under_xdist_each_property_runs_once(pytester, dist):
    """Every pytest-xdist worker's child ran every selected property (each worker collects
    them all): with -n 16 the suite ran 16 times. Where xdist hands out whole files, the
    worker that runs them runs them in one child."""
    pytest.importorskip("xdist")
    log = pytester.path / "calls.log"
    pytester.makepyfile(xkernel=_logging_kernel(log))
    result = pytester.runpytest_subprocess(
        "-n", "2", "--dist", dist, "-v", "--pyargs", "softmaxtheory.conformance",
        "--softmax-kernel", "xkernel:logged", "--softmax-dtype", "float32",
        "--softmax-examples", "3", "-p", "no:cacheprovider",
        "-k", "test_values or test_long_rows or test_special_values or test_invariances",
    )  # fmt: skip
    result.assert_outcomes(passed=4)
    calls = _calls(log)
    # rows of 40963 items: long_rows alone sends them, in one process
    assert len({pid for pid, n in calls if n == "40963"}) == 1
    if dist == "load":
        out = result.stdout.str()
        assert "[gw0]" in out and "[gw1]" in out  # both workers ran tests
    else:
        assert len({pid for pid, _ in calls}) == 1  # one worker, one child


def test_suite_tests_imported_into_a_module_run_in_the_child(pytester):
    """Only items of the module softmaxtheory.conformance were counted: the suite's tests
    imported into the user's module ran in the pytest process (no isolation, no time limit)
    for every property after the first."""
    log = pytester.path / "calls.log"
    pytester.makepyfile(ikernel=_logging_kernel(log))
    pytester.makepyfile(
        test_mine=f"""
import os
from softmaxtheory.conformance import test_values, test_long_rows as test_rows  # noqa: F401

def test_pid():
    with open({str(pytester.path / "pytest.pid")!r}, "w") as f:
        f.write(str(os.getpid()))
"""
    )
    result = pytester.runpytest_subprocess(
        "test_mine.py", "--softmax-kernel", "ikernel:logged", "--softmax-dtype", "float32",
        "--softmax-examples", "3", "-p", "no:cacheprovider",
    )  # fmt: skip
    result.assert_outcomes(passed=3)
    kernel_pids = {pid for pid, _ in _calls(log)}
    assert len(kernel_pids) == 1  # one child ran both properties
    assert (pytester.path / "pytest.pid").read_text() not in kernel_pids


SKIPPING_KERNELS = """
import pytest
from mykernels import softmax

def skip_long(x):  # pytest.skip inside the kernel: not a skip of the property
    if x.shape[-1] > 4096:
        pytest.skip("long rows need a GPU")
    return softmax(x)

def skip_keywords(x, **kw):  # skips the suite's probe of the keywords it takes
    if kw:
        pytest.skip("no keywords here")
    return softmax(x)
"""


@pytest.mark.parametrize(
    ("kernel", "kind", "test"),
    [("skip_long", "softmax", "test_long_rows"), ("skip_keywords", "adaptive_softmax",
                                                  "test_schedules")],
)  # fmt: skip
def test_a_kernel_raising_a_base_exception_in_process_fails(pytester, kernel, kind, test):
    """pytest's Skipped (a BaseException) from the kernel left run_property and the test was
    reported skipped, even with --softmax-strict: a false pass (the child process fails)."""
    pytester.makepyfile(mykernels=KERNELS, skipping=SKIPPING_KERNELS)
    result = pytester.runpytest_subprocess(
        "--pyargs", "softmaxtheory.conformance", "--softmax-kernel", f"skipping:{kernel}",
        "--softmax-kind", kind, "--softmax-dtype", "float32", "--softmax-examples", "3",
        "--softmax-in-process", "--softmax-strict", "-k", test, "-p", "no:cacheprovider",
    )  # fmt: skip
    result.assert_outcomes(failed=1, deselected=len(conf.PROPERTIES) - 1)
    out = result.stdout.str()
    assert "the kernel raised" in out and "Skipped" in out


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (["--softmax-kwarg", "foo"], "--softmax-kwarg takes NAME=VALUE, got 'foo'"),
        (["--softmax-dtype", "bfloat16"], "use --softmax-framework torch"),
    ],
)
def test_usage_errors_name_the_plugins_options(pytester, options, says):
    """The messages of the shared validation named the options of softmaxtheory check."""
    result = pytester.runpytest_subprocess(
        "--pyargs", "softmaxtheory.conformance", "--softmax-kernel", "mykernels:softmax",
        *options, "-p", "no:cacheprovider",
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    out = result.stdout.str() + result.stderr.str()
    assert says in out


def test_strict_option_help_says_what_strict_means(pytester):
    out = pytester.runpytest_subprocess("--help", "-p", "no:cacheprovider").stdout.str()
    strict = " ".join(out[out.index("--softmax-strict") : out.index("--softmax-timeout")].split())
    assert "fails instead of being skipped" in strict
    assert "16-bit kernels are held to float32-grade statistics" in strict
