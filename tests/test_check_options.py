"""The conformance suite's options and bookkeeping: one target_from_options, notes as data."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import strategies as st

from softmaxtheory import _formats, pytest_plugin
from softmaxtheory import conformance as conf
from softmaxtheory._check.runner import Failed, PropertyResult, Skip, run_check, run_given
from softmaxtheory.spec import Constant, PaperPolynomial
from softmaxtheory.testing import KernelMismatch, assert_softmax_close

pytest_plugins = ["pytester"]

KERNELS = """
import numpy as np

def softmax(x):
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)
"""


def _softmax(x):
    x = np.asarray(x)
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# -- target_from_options ------------------------------------------------------------------


def test_target_from_options_parses_the_command_line_spellings():
    t = conf.target_from_options(
        "numpy:exp", kind="adaptive_softmax", entropy_eps="1e-9", schedule="constant:2",
        kwargs=["casting='same_kind'", "where=True"], examples=7, strict=True,
    )  # fmt: skip
    assert (t.kernel, t.name, t.kind) == (np.exp, "numpy:exp", "adaptive_softmax")
    assert t.entropy_eps == 1e-9 and t.schedule == Constant("2")
    assert t.kwargs == {"casting": "same_kind", "where": True}
    assert (t.examples, t.strict, t.thorough) == (7, True, False)
    assert t.schedule == conf.target_from_options("numpy:exp", schedule=Constant("2")).schedule
    assert conf.target_from_options("numpy:exp").schedule == PaperPolynomial()


@pytest.mark.parametrize("framework", _formats.FRAMEWORKS)
def test_target_from_options_default_dtype(framework):
    pytest.importorskip(framework)
    t = conf.target_from_options("numpy:exp", framework=framework)
    assert t.dtype == _formats.default_dtype(framework)
    assert conf.target_from_options("numpy:exp", framework=framework, dtype="float16").dtype == (
        "float16"
    )


BAD = [
    ({"kind": "logsoftmax"}, "kind must be one of ('softmax', 'entropy', 'adaptive_softmax'"),
    ({"framework": "jax"}, "framework must be one of ('numpy', 'torch'), got 'jax'"),
    ({"dtype": "float8"}, "dtype must be one of ('float64', 'float32', 'float16', 'bfloat16')"),
    ({"framework": "torch", "device": "tpu"}, "device must be cpu or cuda, got 'tpu'"),
    ({"dtype": "bfloat16"}, "numpy has no bfloat16: use --framework torch"),
    ({"device": "cuda"}, "the numpy framework runs on the cpu only"),
    ({"entropy_eps": "abc"}, "entropy_eps must be a finite number >= 0, got 'abc'"),
    ({"entropy_eps": -1.0}, "entropy_eps must be a finite number >= 0, got -1.0"),
    ({"examples": 0}, "examples must be an integer >= 1, got 0"),
    ({"schedule": "bogus"}, "bad schedule 'bogus'"),
    ({"kwargs": ["noequals"]}, "--kwarg takes NAME=VALUE, got 'noequals'"),
    ({"kernel": "nosuchmod_abc:f"}, "cannot import module 'nosuchmod_abc'"),
    ({"kernel": "numpy"}, "kernel must be given as pkg.mod:func, got 'numpy'"),
    ({"kernel": "numpy:pi"}, "numpy:pi is not callable (got float)"),
]


@pytest.mark.parametrize(("options", "message"), BAD)
def test_target_from_options_names_the_bad_option(options, message):
    options = {"kernel": "numpy:exp", **options}
    with pytest.raises(conf.ConformanceUsageError) as info:
        conf.target_from_options(options.pop("kernel"), **options)
    assert message in str(info.value)


def test_options_are_checked_before_the_kernel_is_imported(tmp_path, monkeypatch):
    (tmp_path / "noisy_kernels.py").write_text("raise RuntimeError('imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(conf.ConformanceUsageError, match="numpy framework runs on the cpu only"):
        conf.target_from_options("noisy_kernels:f", device="cuda")
    assert "noisy_kernels" not in sys.modules


# the command line and the plugin both build the Target with target_from_options: a bad
# option is the same message in both (an option each checks before the child starts, one
# the child reports, and the kernel path)
SHARED = [
    (["--device", "tpu"], ["--softmax-device", "tpu"], {"device": "tpu"}),
    (["--kwarg", "noequals"], ["--softmax-kwarg", "noequals"], {"kwargs": ["noequals"]}),
    (["--dtype", "bfloat16"], ["--softmax-dtype", "bfloat16"], {"dtype": "bfloat16"}),
]


@pytest.mark.parametrize(("cli_args", "plugin_args", "options"), SHARED)
def test_cli_and_plugin_give_the_same_usage_error(pytester, cli_args, plugin_args, options):
    pytester.makepyfile(mykernels=KERNELS)
    with pytest.raises(conf.ConformanceUsageError) as info:
        conf.target_from_options("numpy:exp", **options)
    message = str(info.value)
    cli = subprocess.run(
        [sys.executable, "-m", "softmaxtheory", "check", "mykernels:softmax", *cli_args],
        cwd=pytester.path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert cli.returncode == 2
    assert f"softmaxtheory check: error: {message}" in cli.stderr
    result = pytester.runpytest_subprocess(
        "--pyargs", "softmaxtheory.conformance", "--softmax-kernel", "mykernels:softmax",
        *plugin_args, "-p", "no:cacheprovider",
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert result.ret == pytest.ExitCode.USAGE_ERROR  # found by the child, which imports it
    # the same message, naming the plugin's options (--softmax-kwarg for --kwarg)
    said = f"softmaxtheory conformance: {pytest_plugin._plugin_words(message)}"
    assert said in result.stdout.str() + result.stderr.str()


def test_cli_and_plugin_report_a_bad_kernel_path_alike(pytester):
    message = "cannot import module 'nosuchmod_abc'"
    cli = subprocess.run(
        [sys.executable, "-m", "softmaxtheory", "check", "nosuchmod_abc:f", "--in-process"],
        cwd=pytester.path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert cli.returncode == 2 and f"softmaxtheory check: error: {message}" in cli.stderr
    result = pytester.runpytest_subprocess(
        "--pyargs", "softmaxtheory.conformance", "--softmax-kernel", "nosuchmod_abc:f",
        "-p", "no:cacheprovider",
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.USAGE_ERROR  # found by the child, which imports it
    assert f"softmaxtheory conformance: {message}" in result.stdout.str() + result.stderr.str()


def test_plugin_options_are_named_once_with_help_and_the_shared_choices():
    class Group:
        def __init__(self):
            self.options = {}

        def addoption(self, name, **kw):
            self.options[name] = kw

    class Parser:
        group = Group()

        def getgroup(self, name, description=""):
            return self.group

    parser = Parser()
    pytest_plugin.pytest_addoption(parser)
    options = parser.group.options
    assert len(options) == 13 and all(name.startswith("--softmax-") for name in options)
    assert all(kw.get("help") for kw in options.values()), options
    assert options["--softmax-kind"]["choices"] == _formats.KINDS
    assert options["--softmax-framework"]["choices"] == _formats.FRAMEWORKS
    assert options["--softmax-dtype"]["choices"] == _formats.DTYPES


def test_target_bookkeeping_is_a_declared_field():
    fields = {f.name: f for f in dataclasses.fields(conf.Target)}
    assert not fields["_takes"].init and not fields["_takes"].repr
    t = conf.Target(_softmax)
    assert t.takes("schedule") is False and t._takes == {"schedule": False}
    assert t == conf.Target(_softmax) and "_takes" not in repr(t)


# -- notes are data -----------------------------------------------------------------------


def _nan_when_masked(x):  # torch's convention for a fully masked row; refuses n = 0
    return _softmax(x)


def test_notes_are_a_list_on_the_result():
    res = conf.run_property("special_values", conf.Target(_nan_when_masked, dtype="float32"))
    assert res.status == "pass"
    assert res.notes == [
        "fully masked row (3 items, one item, 4099 items): NaN where the table gives zeros",
        "n = 0 refused with ValueError",
    ]
    assert res.message == "note: " + "; ".join(res.notes)


def test_notes_travel_with_a_failure_and_through_json():
    def nan_as_zero(x):  # NaN for a fully masked row (a note), then NaN logits read as 0
        x = np.asarray(x)
        return _softmax(np.where(np.isnan(x), 0.0, x))

    res = conf.run_property("special_values", conf.Target(nan_as_zero, dtype="float32"))
    assert res.status == "fail"
    assert res.notes == [
        "fully masked row (3 items, one item, 4099 items): NaN where the table gives zeros"
    ]
    assert res.message.startswith("row with NaN\n")  # the context note, then the mismatch
    assert "repro:" in res.message
    again = PropertyResult(**json.loads(json.dumps(dataclasses.asdict(res))))  # the child's way
    assert again == res


def _mismatch() -> KernelMismatch:
    x = np.array([[0.0, 1.0, 2.0]])
    try:
        assert_softmax_close(np.full((1, 3), 0.5), x)
    except KernelMismatch as exc:
        return exc
    raise AssertionError("no mismatch")


@pytest.mark.parametrize(
    ("raised", "strict", "status", "message"),
    [
        (Skip("the kernel takes no mask"), False, "skip", "the kernel takes no mask"),
        (Skip("no mask"), True, "fail", "skipped, a failure under strict: no mask"),
        (Failed("counterexample"), False, "fail", "counterexample"),
        (SystemExit(3), False, "fail", "the kernel raised SystemExit(3) (it called sys.exit)"),
    ],
)
def test_each_ending_of_a_property_is_explicit(raised, strict, status, message):
    def check(target, run):
        run.notes.append("seen")
        raise raised

    res = run_check("p", check, conf.Target(_softmax, strict=strict))
    assert (res.status, res.notes) == (status, ["seen"])
    assert res.message.startswith(message)


def test_an_exit_on_some_calls_is_an_exit_not_a_nondeterministic_kernel():
    """Hypothesis replays a failing example; an exit that does not repeat is still an exit."""
    calls = [0]

    def exits_on_some_calls(x):
        calls[0] += 1
        if calls[0] > 6 and calls[0] % 2 == 0:
            sys.exit(3)
        return _softmax(x)

    res = conf.run_property("values", conf.Target(exits_on_some_calls))
    assert res.status == "fail"
    assert res.message.startswith("the kernel raised SystemExit(3) (it called sys.exit)"), (
        res.message
    )


def test_a_mismatch_fails_with_its_context_note_first():
    exc = _mismatch()

    def check(target, run):
        exc.add_note("shift by 3.0")
        raise exc

    res = run_check("invariances", check, conf.Target(_softmax))
    assert res.status == "fail" and res.checks == 0
    assert res.message == f"shift by 3.0\n{exc}"


def test_a_passing_property_without_notes_has_no_message():
    res = run_check("p", lambda target, run: None, conf.Target(_softmax))
    assert (res.status, res.message, res.notes) == ("pass", "", [])


def test_run_given_keeps_the_notes_of_the_body_and_drops_hypothesis_notes():
    target = conf.Target(_softmax)

    def body(n: int) -> None:
        if n >= 0:
            exc = ValueError(f"bad {n}")
            exc.add_note("what was checked")
            raise exc

    with pytest.raises(ValueError) as info:
        run_given(target, st.integers(0, 9), 5, body)
    assert info.value.__notes__ == ["what was checked"]

    def bare(n: int) -> None:
        raise ValueError("bare")

    with pytest.raises(ValueError) as info:
        run_given(target, st.integers(0, 9), 5, bare)
    assert not hasattr(info.value, "__notes__")


def test_temperature_cap_reports_a_wrong_shape_as_such():
    """A kernel returning one number per row (an entropy kernel checked as adaptive_softmax)
    raised ValueError in the property's own reshape: reported as the child exiting."""
    res = conf.run_property(
        "temperature_cap",
        conf.Target(lambda x: np.asarray(x).sum(axis=-1), kind="adaptive_softmax"),
    )
    assert res.status == "fail"
    assert "shape mismatch: the kernel returned shape (1,), expected (1, " in res.message
