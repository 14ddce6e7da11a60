"""docs/_ext/oracle_gallery.py: the "What the oracle catches" page, computed at build time.

The whole gallery runs in the docs build (CI's html build); these tests run its pieces on
the cheap kernels and check the cache that lets the doctest build reuse the verdicts.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytest.importorskip("sphinx")


@pytest.fixture(scope="module")
def gallery():
    spec = importlib.util.spec_from_file_location(
        "oracle_gallery", ROOT / "docs" / "_ext" / "oracle_gallery.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["oracle_gallery"] = module
    spec.loader.exec_module(module)
    return module


def test_the_catalogue_has_the_defect_classes_of_the_page(gallery):
    """At least twelve classes, among them the ones the page's introduction names."""
    names = list(gallery._catalogue().CATALOGUE)
    assert len(names) >= 12
    for name in (
        "coefficients in ascending powers",
        "polynomial used as a clipped temperature",
        "beta silently 1 on masked rows (0 * -inf = NaN entropy)",
        "1e-9 guard vanishing in float16",
        "Horner's rule in bfloat16",
        "logits clamped at +-50",
        "float64 path computed in float32",
        "no max subtraction",
        "online softmax without rescaling",
        "one entropy for the whole batch",
        "softmax along the wrong axis",
    ):
        assert name in names


def test_a_defect_is_caught_with_its_property_and_first_lines(gallery):
    record = gallery._run_defect(gallery._catalogue(), "float64 path returning float32")
    assert record["status"] == "caught"
    assert record["property"] == "values" and record["position"] == 1
    assert record["line"].startswith("FAIL  values")
    assert "dtype float32 for float64 input" in record["failure"][0]
    assert record["doc"].startswith("Defect: a float64 kernel")
    # the code shown is the function without its docstring
    assert record["source"].startswith("def float32_result(x):\n    x = np.asarray(x)")
    assert '"""' not in record["source"]


def test_the_code_shown_includes_the_helpers_that_carry_the_defect(gallery):
    """A kernel whose defect lives in a helper showed a one-line call; the helpers it calls
    come first now, except those the correct building blocks call too (they compute the
    spec)."""
    bk = gallery._catalogue()
    kernel = bk.CATALOGUE["entropy rounded once to bfloat16 on masked rows"][0]
    code = gallery._kernel_code(kernel, bk)
    assert code.startswith("def _torch_bfloat16_entropy_rounded(x, where: str):")
    assert "H.to(torch.bfloat16)" in code and '"""' not in code
    assert code.endswith('return _torch_bfloat16_entropy_rounded(x, "masked rows")')
    plain = bk.CATALOGUE["float64 path returning float32"][0]
    assert gallery._kernel_code(plain, bk) == gallery._code(plain)  # only correct helpers
    assert "def _softmax" not in gallery._kernel_code(bk.CATALOGUE["no max subtraction"][0], bk)


def test_a_docstring_keeps_its_literals_as_code(gallery):
    """Double backquotes were turned into quotes, which the page showed as curly quotes."""
    text = gallery._defect_text("Defect: drops ``scale=`` (see :func:`~m.f`), *not* `x`.")
    assert text == r"Drops ``scale=`` (see ``m.f``), \*not\* 'x'."
    unpaired = gallery._defect_text("Defect: an unpaired `` stays text")
    assert unpaired == "An unpaired " + "'" * 2 + " stays text"


def test_online_softmax_without_rescaling_is_caught(gallery):
    record = gallery._run_defect(gallery._catalogue(), "online softmax without rescaling")
    assert record["status"] == "caught" and record["property"] == "values"
    assert "outside the error model" in record["failure"][0]


def test_a_correct_kernel_conforms(gallery):
    record = gallery._run_correct("numpy softmax", "numpy", "numpy", "float32")
    assert record["status"] == "conforms", record
    assert record["failed"] == [] and record["passed"] >= 5
    assert all(line.startswith(("PASS", "SKIP")) for line in record["lines"])


def test_failure_lines_stop_before_the_repro(gallery):
    message = "values\nsoftmax is outside\n  got 1\n\n  exact 2\nrepro:\nimport numpy as np\n"
    assert gallery._failure_lines(message) == ["softmax is outside", "  got 1", "  exact 2"]
    assert gallery._failure_lines("values: the kernel returned dtype float32") == [
        "values: the kernel returned dtype float32"
    ]


def test_the_command_names_every_option_of_the_entry(gallery):
    d = {"kernel": "k", "kind": "entropy", "framework": "numpy", "dtype": "float16",
         "entropy_eps": 1e-9}  # fmt: skip
    assert gallery._command(d) == (
        "softmaxtheory check tests.support.broken_kernels:k --kind entropy --dtype float16 "
        "--entropy-eps 1e-09"
    )
    d = {"kernel": "t", "kind": "softmax", "framework": "torch", "dtype": "float32"}
    command = "softmaxtheory check tests.support.broken_kernels:t --framework torch"
    assert gallery._command(d) == command


def _data():
    defect = {
        "name": "no max subtraction", "kernel": "no_max_subtraction", "kind": "softmax",
        "dtype": "float64", "framework": "numpy", "entropy_eps": 0.0,
        "doc": "Defect: exp(x) / sum(exp(x)) without *subtracting*.", "source": "def f(x):\n"
        "    return x", "recorded": "values", "status": "caught", "property": "values",
        "position": 1, "line": "FAIL  values", "failure": ["softmax is outside"],
    }  # fmt: skip
    correct = {"label": "torch.softmax", "framework": "torch", "dtype": "bfloat16",
               "lines": ["PASS  values"], "failed": [], "passed": 7, "skipped": 0,
               "status": "conforms"}  # fmt: skip
    return {"defects": [defect], "correct": [correct], "seconds": {"wall": 1.0, "cpu": 1.0}}


def test_the_page_source_has_a_section_per_defect(gallery):
    lines = gallery._defects_rst(_data())
    text = "\n".join(lines)
    assert "Of the 1 defect classes, the default run caught 1" in text
    assert ".. _oracle-no-max-subtraction:\n\nNo max subtraction\n~~~~~~~~~~~~~~~~~~\n" in text
    assert "Exp(x) / sum(exp(x)) without \\*subtracting\\*." in text
    assert "   $ softmaxtheory check tests.support.broken_kernels:no_max_subtraction" in text
    assert "   def f(x):\n       return x" in text
    assert "**Caught by** ``values``, the first property of the run." in text
    text = "\n".join(gallery._correct_rst(_data()))
    assert "     - conforms, 7 properties pass" in text


def test_the_verdicts_are_cached_for_the_next_builder(gallery, tmp_path, monkeypatch):
    """The html build computes; the doctest build after it reads the file (no rerun)."""
    cache = tmp_path / "_build" / "oracle_gallery.json"
    app = SimpleNamespace(
        config=SimpleNamespace(oracle_gallery_cache=str(cache), oracle_gallery_jobs=1),
        confdir=str(tmp_path),
    )
    calls = []

    def fake_compute(jobs=1):
        calls.append(jobs)
        return _data()

    monkeypatch.setattr(gallery, "compute", fake_compute)
    monkeypatch.setattr(gallery, "_MEMO", {})
    assert gallery.gallery(app) == _data()
    assert calls == [1]
    stored = json.loads(cache.read_text())
    assert stored["key"] == gallery._fingerprint() and stored["gallery"] == _data()
    monkeypatch.setattr(gallery, "_MEMO", {})  # a new process: the file is read
    assert gallery.gallery(app) == _data()
    assert calls == [1]
    # a different key (the code changed) computes again
    cache.write_text(json.dumps({"key": "old", "gallery": {}}))
    monkeypatch.setattr(gallery, "_MEMO", {})
    assert gallery.gallery(app) == _data()
    assert calls == [1, 1]
