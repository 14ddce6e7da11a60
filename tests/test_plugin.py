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
