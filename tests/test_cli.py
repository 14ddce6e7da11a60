"""The command line: ``softmaxtheory reference`` and ``softmaxtheory bench``."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from softmaxtheory import reference
from softmaxtheory.cli import main, parse_schedule
from softmaxtheory.spec import Constant, LogLength, PaperPolynomial, Polynomial


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_table_shows_certified_values(capsys):
    code, out, _ = run(capsys, "reference", "3", "1", "0", "0", "-1", "2")
    assert code == 0
    x = np.array([3.0, 1.0, 0.0, 0.0, -1.0, 2.0])
    assert f"H = {reference.entropy(x)[()]!s} nats" in out
    assert f"beta = {reference.beta(x)[()]!s}" in out
    for value in (*reference.softmax(x), *reference.adaptive_softmax(x)):
        assert str(value) in out
    assert "n = 6 (6 unmasked, regular)" in out


def test_json_with_masks_and_float32(capsys):
    code, out, _ = run(capsys, "reference", "--json", "--dtype", "float32", "--logits=-inf,0,1")
    assert code == 0
    doc = json.loads(out)
    row = doc["rows"][0]
    assert doc["dtype"] == "float32"
    assert row["logits"][0] == "-inf" and row["unmasked"] == 2
    want = reference.adaptive_softmax([-np.inf, 0.0, 1.0], dtype=np.float32)
    assert row["adaptive_softmax"] == [float(v) for v in want]
    assert row["entropy"] == float(reference.entropy([-np.inf, 0.0, 1.0], dtype=np.float32))


def test_npy_batch_and_truncation(tmp_path, capsys):
    x = np.random.default_rng(0).normal(size=(2, 30))
    x[1, :] = -np.inf
    path = tmp_path / "logits.npy"
    np.save(path, x)
    code, out, _ = run(capsys, "reference", "--npy", str(path), "--max-items", "5")
    assert code == 0
    assert "row (0,)" in out and "row (1,)" in out
    assert "25 more items" in out
    assert "masked" in out
    code, out, _ = run(capsys, "reference", "--npy", str(path), "--json")
    rows = json.loads(out)["rows"]
    assert rows[0]["softmax"] == reference.softmax(x[0]).tolist()
    assert rows[1]["softmax"] == [0.0] * 30 and rows[1]["beta"] == 1.0


def test_invalid_row_is_reported_as_nan(capsys):
    _code, out, _ = run(capsys, "reference", "--json", "1", "nan")
    row = json.loads(out)["rows"][0]
    assert row["kind"] == "invalid" and row["entropy"] == "nan" and row["softmax"] == ["nan"] * 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["reference"], "give the logits once"),
        (["reference", "1", "--logits", "2"], "give the logits once"),
        (["reference", "abc"], "not a number"),
        (["reference", "--schedule", "constant:0", "1"], "beta must be > 0"),
        (["reference", "--schedule", "cubic", "1"], "bad schedule"),
        (["reference", "--entropy-eps", "-1", "1"], "entropy_eps must be finite and >= 0"),
        (["reference", "--npy", "/nonexistent.npy"], "cannot read"),
        (["reference", "--max-items", "-1", "1"], "--max-items must be >= 0"),
        (["bench", "--n", "0"], "--n must be >= 1"),
    ],
)
def test_usage_errors_exit_2(capsys, argv, message):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_parse_schedule_forms():
    assert parse_schedule("paper") == PaperPolynomial()
    assert parse_schedule("constant:2.5") == Constant("2.5")
    assert parse_schedule("loglength:0.4") == LogLength("0.4")
    assert parse_schedule("poly:1,2,3@0.75") == Polynomial(("1", "2", "3"), "0.75")


def test_schedule_option_changes_beta(capsys):
    _, out, _ = run(capsys, "reference", "--json", "--schedule", "constant:2", "1", "2")
    row = json.loads(out)["rows"][0]
    assert row["beta"] == 2.0
    assert row["adaptive_softmax"] == reference.softmax([2.0, 4.0]).tolist()


def test_bench_json_reports_measurements(capsys):
    code, out, err = run(capsys, "bench", "--n", "64", "--repeat", "1", "--json")
    assert code == 0
    doc = json.loads(out)
    cases = doc["reference"]
    assert {c["case"] for c in cases} >= {"reference.adaptive_softmax (beta>1)"}
    sharp = next(c for c in cases if "beta>1" in c["case"])
    assert sharp["beta"] > 1.0 and sharp["seconds"] > 0 and sharp["n"] == 64
    assert "timing the reference" in err


def test_console_script_and_module_entry_point():
    out = subprocess.run(
        [sys.executable, "-m", "softmaxtheory", "--version"], capture_output=True, text=True
    )
    assert out.returncode == 0 and out.stdout.startswith("softmaxtheory ")
