"""The command line: ``softmaxtheory reference`` and ``softmaxtheory bench``."""

from __future__ import annotations

import argparse
import json
import os
import shlex
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
        # an empty item was dropped: 1,,2 was the row [1, 2]
        (["reference", "--logits", "1,,2"], "--logits has an empty item (item 2): '1,,2'"),
        (["reference", "--logits", ","], "--logits has an empty item"),
        (["reference", "abc"], "not a number"),
        (["reference", "--schedule", "constant:0", "1"], "beta must be > 0"),
        (["reference", "--schedule", "cubic", "1"], "bad schedule"),
        (["reference", "--entropy-eps", "-1", "1"], "entropy_eps must be finite and >= 0"),
        (["reference", "--npy", "/nonexistent.npy"], "cannot read"),
        (["reference", "--max-items", "-1", "1"], "--max-items must be >= 0"),
        (["bench", "--n", "0"], "--n must be between 1 and"),
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
    assert parse_schedule("poly:1,2") == Polynomial(("1", "2"), "0.5")
    with pytest.raises(argparse.ArgumentTypeError, match="threshold after '@' is missing"):
        parse_schedule("poly:1,2@")  # was the default threshold, silently


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


def one_line_usage_error(capsys, argv):
    """Run `argv`; assert exit status 2 and exactly one line on stderr; return that line."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    captured = capsys.readouterr()
    assert info.value.code == 2, (argv, captured.err)
    lines = captured.err.splitlines()
    assert len(lines) == 1, (argv, captured.err)
    assert "Traceback" not in captured.err
    return lines[0]


@pytest.fixture
def npz_file(tmp_path):
    path = tmp_path / "logits.npz"
    np.savez(path, x=np.zeros(3))
    return str(path)


@pytest.fixture
def empty_file(tmp_path):
    path = tmp_path / "empty.npy"
    path.write_bytes(b"")
    return str(path)


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "logits.npy"
    path.write_text("0.5 1.0 2.0\n")
    return str(path)


@pytest.fixture
def no_rows_file(tmp_path):
    path = tmp_path / "none.npy"
    np.save(path, np.zeros((0, 3)))
    return str(path)


@pytest.fixture
def truncated_file(tmp_path):
    path = tmp_path / "cut.npy"
    np.save(path, np.zeros(100))
    path.write_bytes(path.read_bytes()[:90])
    return str(path)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["reference", "--npy", "{npz}"], "not a .npy file of one array"),
        (["reference", "--npy", "{empty}"], "cannot read"),
        (["reference", "--npy", "/dev/null"], "cannot read /dev/null"),
        (["reference", "--npy", "{cut}"], "cannot read"),
        (["bounds", "--npy", "{npz}"], "not a .npy file of one array"),
        (["bounds", "--npy", "/dev/null"], "cannot read /dev/null"),
        # numpy read a file without the .npy header as a pickle: "This file contains pickled
        # (object) data"; and an array of no rows was said to have every row NaN
        (["reference", "--npy", "{text}"], "is not a .npy file (it lacks the .npy header)"),
        (["bounds", "--npy", "{text}"], "is not a .npy file (it lacks the .npy header)"),
        (["bounds", "--npy", "{none}"], "holds no rows (shape (0, 3))"),
        (["reference", "--schedule", "poly:1e400", "1", "2"], "coefficients[0] must lie within"),
        (["reference", "--schedule", "constant:1e400", "1"], "beta must lie within"),
        (["reference", "--schedule", "poly:1@1e999", "1"], "threshold must lie within"),
        (["bounds", "--beta", "1e300", "--spread", "1"], "too large"),
        (["bounds", "--spread", "1e300", "--beta", "1e300"], "too large"),
        (["bounds", "--spread", "1", "--plot", "/nonexistent/x.png"], "does not exist"),
        (["bounds", "--spread", "1", "--plot", "{dir}"], "must name a file"),
        (["bench", "--threads", "1000", "--quick"], "--threads must be between 1 and"),
        (["bounds", "--n", "0", "--spread", "1"], "unrecognized arguments: --n 0"),
        (["reference", "--lo=1,2"], "unrecognized arguments: --lo=1,2"),
        (["reference", "--json", "--dtype", "int8", "1"], "invalid choice"),
        (["bounds", "--spread", "1", "--digits", "x"], "invalid int value"),
        (["nosuchcommand"], "invalid choice"),
        # it said "required: EXPERIMENT, options", and options are not
        (["reproduce"], "name the experiment to run: one of max-retrieval, clrs-text"),
        # an experiment's own options: five lines of usage, and abbreviations taken
        (["reproduce", "minilm-spread", "--lengths", "x"], "not an integer length: 'x'"),
        (["reproduce", "minilm-spread", "--len", "16"], "unrecognized arguments: --len 16"),
    ],
)
def test_user_errors_are_one_line_and_exit_2(
    capsys, tmp_path, npz_file, empty_file, truncated_file, text_file, no_rows_file, argv, message
):
    """Issue 14 item 9: each of these raised a traceback, or printed the table before failing."""
    subs = {"{npz}": npz_file, "{empty}": empty_file, "{cut}": truncated_file}
    subs |= {"{text}": text_file, "{none}": no_rows_file}
    subs["{dir}"] = str(tmp_path)
    argv = [subs.get(a, a) for a in argv]
    line = one_line_usage_error(capsys, argv)
    assert message in line
    assert line.startswith("softmaxtheory")
    # the hint about '--' only where an unrecognized word is a number that starts with '-'
    hinted = "-1e308" in argv or "-inf" in argv  # not "--n 0": 0 is no option
    assert ("go after '--'" in line) == hinted, line


@pytest.mark.parametrize(
    "argv", [["bounds", "--spread", "1"], ["reference", "1"], ["check", "m:f"], ["bench"]]
)
def test_an_unknown_option_points_to_the_commands_help(capsys, argv):
    """It said "(see softmaxtheory --help)", whose page lists no command's options."""
    command = argv[0]
    line = one_line_usage_error(capsys, [*argv, "--bogus"])
    assert line.startswith(f"softmaxtheory {command}: error: unrecognized arguments: --bogus")
    assert line.endswith(f"(see softmaxtheory {command} --help)")


def test_plot_path_is_checked_before_the_table(capsys):
    """A --plot path that cannot be written stops the command before any output."""
    with pytest.raises(SystemExit):
        main(["bounds", "--spread", "1", "--plot", "/nonexistent/x.png"])
    assert capsys.readouterr().out == ""


def test_options_are_not_abbreviated(capsys):
    """``--n`` was taken as ``--npy`` (prefix matching); it is refused on every parser."""
    from softmaxtheory.cli import build_parser

    parser, subparsers = build_parser()
    assert parser.allow_abbrev is False
    assert all(p.allow_abbrev is False for p in subparsers.values())
    line = one_line_usage_error(capsys, ["reference", "--max", "3", "1"])
    assert "--max" in line


@pytest.mark.parametrize("where", ["full disk", "closed stdout"])
@pytest.mark.parametrize(
    "command", [["reference", "0", "1", "2"], ["bounds", "--spread", "1", "--json"]]
)
def test_output_that_cannot_be_written_is_one_line_and_status_1(where, command):
    """``softmaxtheory bounds --json > out.json`` on a full disk printed a traceback of the
    OSError (and an AttributeError where stdout was closed); now one line, status 1."""
    if where == "full disk" and not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    redirect = "> /dev/full" if where == "full disk" else ">&-"
    line = " ".join([shlex.quote(sys.executable), "-m", "softmaxtheory", *command, redirect])
    proc = subprocess.run(["sh", "-c", line], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    reason = "No space left on device" if where == "full disk" else "standard output is closed"
    assert proc.stderr == (
        f"softmaxtheory {command[0]}: error: cannot write the output: {reason}\n"
    )


_CLOSER = """
import sys
import numpy as np

def softmax(x):
    sys.stdout.close()
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)
"""


@pytest.mark.parametrize("in_process", [False, True])
def test_a_kernel_that_closes_stdout(tmp_path, in_process):
    """The child that ran it printed a ValueError traceback into the report (the verdict was
    right); checked in this process, the report could not be written and a traceback said
    so. Now: no traceback in the child, one line and status 1 in process."""
    (tmp_path / "closer.py").write_text(_CLOSER)
    cmd = [sys.executable, "-m", "softmaxtheory", "check", "closer:softmax", "--only", "values"]
    proc = subprocess.run(
        cmd + ["--in-process"] * in_process, capture_output=True, text=True, timeout=300,
        cwd=tmp_path,
    )  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr
    if in_process:
        assert proc.returncode == 1
        assert proc.stderr.endswith(
            "softmaxtheory check: error: cannot write the output: standard output is closed\n"
        )
    else:
        assert proc.returncode == 0, proc.stderr
        assert "closer:softmax: CONFORMS" in proc.stdout


def test_closed_pipe_exits_quietly(tmp_path):
    """``softmaxtheory reference --npy big.npy --json | head -1``: no BrokenPipeError traceback."""
    path = tmp_path / "big.npy"
    np.save(path, np.linspace(-3.0, 3.0, 4000).reshape(50, 80))  # ~0.5 MB of JSON
    proc = subprocess.Popen(
        [sys.executable, "-m", "softmaxtheory", "reference", "--npy", str(path), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()  # the reader goes away, as `head -1` does
    err = proc.stderr.read().decode()
    code = proc.wait()
    proc.stderr.close()
    assert first.strip() == b"{"
    assert err == ""
    assert code == 1


def test_negative_logits_need_no_double_dash(capsys):
    # they went after '--' (the error said so); the double dash still works
    assert main(["reference", "--json", "-inf", "-1e3", "0"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["rows"][0]["softmax"][0] == 0.0
    assert main(["reference", "--json", "1e308", "-1e308"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"][0]["softmax"] == [1.0, 0.0]
    assert main(["reference", "--json", "--", "0", "-inf"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"][0]["softmax"] == [1.0, 0.0]


@pytest.mark.parametrize("command", ["reference", "check"])
def test_schedule_help_says_the_coefficients_order(capsys, command):
    """``poly:C0,C1,...`` read as the constant term first; the parser takes the highest
    degree first (``poly:1,2`` is H + 2), and the help now says so."""
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "poly:CK,...,C1,C0[@THETA] (highest degree first" in text
    assert parse_schedule("poly:1,2") == Polynomial(["1", "2"])
    beta = float(reference.beta([0.0, 0.0], schedule=parse_schedule("poly:1,2@0")))
    assert beta == pytest.approx(np.log(2) + 2, rel=1e-15)  # 1·H + 2, H = log 2


def test_numbers_beyond_the_float_range_or_rounding_to_zero_are_refused(capsys):
    """`reference -- 1e400 0` read 1e400 as inf, a row holding +inf (NaN everywhere) where
    the softmax is [1, 0]; --entropy-eps 1e-400 became 0.0, the exact-entropy mode."""
    from softmaxtheory.cli import main

    for argv in (["reference", "--", "1e400", "0"],
                 ["reference", "--entropy-eps", "1e-400", "1", "2"],
                 ["bounds", "--spread", "1e999"]):  # fmt: skip
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2
        err = capsys.readouterr().err
        assert "beyond the float64 range" in err or "rounds to 0 in float64" in err
    assert main(["reference", "--", "-inf", "0", "inf"]) == 0  # (spelled inf: taken)
