"""The "Test your kernel" guide's examples really run; docstring examples of the new modules."""

from __future__ import annotations

import doctest
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "docs" / "examples"


def _run(args, cwd=EXAMPLES):
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, check=False
    )


def test_numpy_example_tests_pass():
    res = _run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "my_softmax.py"])
    assert res.returncode == 0, res.stdout + res.stderr
    assert "2 passed" in res.stdout


def test_torch_example_tests_pass():
    pytest.importorskip("torch")
    res = _run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "torch_adaptive.py"])
    assert res.returncode == 0, res.stdout + res.stderr
    assert "2 passed" in res.stdout


def test_guide_commands():
    res = _run(["-m", "softmaxtheory", "check", "my_softmax:softmax", "--dtype", "float32"])
    assert res.returncode == 0, res.stdout + res.stderr
    assert "my_softmax:softmax: CONFORMS" in res.stdout
    guide = (ROOT / "docs" / "testing.rst").read_text()
    for line in res.stdout.splitlines():
        if line.startswith(("PASS", "  errors in ulps")):
            assert line.strip() in guide  # the numbers in the guide are the measured ones
    # the header says what the reference does (it once said "float64, mpmath")
    assert "double-double first pass, mpmath fallback" in res.stdout


def test_guide_torch_defect_command():
    pytest.importorskip("torch")
    res = _run([
        "-m", "softmaxtheory", "check", "torch_adaptive:adaptive_softmax_no_clamp",
        "--framework", "torch", "--kind", "adaptive_softmax", "--dtype", "bfloat16",
        "--only", "values", "--only", "temperature_cap",
    ])  # fmt: skip
    assert res.returncode == 1
    guide = (ROOT / "docs" / "testing.rst").read_text()
    for line in res.stdout.splitlines():
        if line.startswith(("FAIL", "  got ", "  exact ", "  error ", "  row:", "  failing ")):
            assert line.strip() in guide, line
    # the values failure's repro snippet, which the guide shows in full
    lines = res.stdout.splitlines()
    start = lines.index("repro:") + 1
    stop = next(i for i in range(start, len(lines)) if "reference.adaptive_softmax" in lines[i])
    for line in lines[start : stop + 1]:
        assert "   " + line.rstrip() in guide.splitlines() or not line.strip(), line


@pytest.mark.parametrize(
    "name",
    [
        "softmaxtheory.testing",
        "softmaxtheory.strategies",
        "softmaxtheory.conformance",
        "softmaxtheory._check.error_model",
        "softmaxtheory.pytest_plugin",
        "softmaxtheory.cli.check",
        "softmaxtheory._check.report",
        "softmaxtheory._check.target",
        "softmaxtheory._check.runner",
        "softmaxtheory._check.properties",
        "softmaxtheory._check.errors",
        "softmaxtheory._check.memory",
    ],
)
def test_docstring_examples_and_all(name):
    module = importlib.import_module(name)
    assert doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE).failed == 0
    for attr in module.__all__:
        assert hasattr(module, attr)


def test_core_import_does_not_import_hypothesis():
    code = (
        "import sys, softmaxtheory, softmaxtheory.testing\n"
        "print(sorted(m for m in ('numba', 'torch', 'hypothesis') if m in sys.modules))"
    )
    res = _run(["-c", code], cwd="/")
    assert res.stdout.strip() == "[]", res.stderr
