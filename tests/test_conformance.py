"""The conformance suite raises no false alarms; `softmaxtheory check` reports and exits right."""

from __future__ import annotations

import pytest

from softmaxtheory import cli
from softmaxtheory import conformance as conf
from softmaxtheory.spec import Constant
from tests.support import broken_kernels as bk


def _verdict(kernel, name="tests.support.broken_kernels:k", **kw):
    target = conf.Target(kernel, name, **kw)
    results = conf.run_conformance(target)
    failed = [r for r in results if r.status == "fail"]
    assert not failed, "\n\n".join(f"{r.name}: {r.message}" for r in failed)
    return {r.name: r for r in results}


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
def test_numpy_softmax_conforms(dtype):
    res = _verdict(bk.softmax, dtype=dtype)
    assert set(res) == set(conf.properties_for("softmax"))
    assert all(r.status == "pass" and r.checks > 0 for r in res.values())


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_numpy_entropy_and_adaptive_conform(dtype):
    _verdict(bk.entropy, kind="entropy", dtype=dtype)
    res = _verdict(bk.adaptive_softmax, kind="adaptive_softmax", dtype=dtype)
    assert res["schedules"].status == "pass"  # the kernel takes schedule=
    assert res["temperature_cap"].status == "pass"


def test_paper_listing_conforms_with_its_guard_in_float64():
    """The listing with its 1e-9 guard, scaling the shifted logits, conforms."""
    res = _verdict(bk.adaptive_softmax_listing, kind="adaptive_softmax", entropy_eps=1e-9)
    assert res["schedules"].status == "skip"


def test_the_listing_as_printed_fails_only_where_beta_x_overflows():
    """softmax(beta * x) scales before the softmax subtracts the maximum: rows of tied
    logits at 0.5 and 0.9 of the largest float (entropy log 100, beta 2.41) overflow to
    inf - inf = NaN, and tied logits at the lowest float and 0.6 of it (beta 1.42) to
    -inf everywhere, zeros where the weights are uniform (the allowance of scaling first
    covers one rounding of beta x, not its overflow). Nothing else tells it from the
    shifted form: no drawn row pairs such magnitudes with an entropy in the window."""
    target = conf.Target(
        bk.listing_scaling_first, "tests.support.broken_kernels:listing_scaling_first",
        kind="adaptive_softmax", entropy_eps=1e-9,
    )  # fmt: skip
    failed = [r for r in conf.run_conformance(target) if r.status == "fail"]
    assert [r.name for r in failed] == ["values", "branch_points"]
    assert "tied items at the lowest finite float and at 0.6 of it" in failed[0].message
    assert "got      0.0" in failed[0].message
    assert "100 tied items at 0.5 and 0.9 of the largest float" in failed[1].message


def test_guarded_entropy_in_float16_conforms():
    _verdict(bk.entropy_guarded, kind="entropy", dtype="float16", entropy_eps=1e-9)


def test_scipy_softmax_conforms():
    scipy_special = pytest.importorskip("scipy.special")
    for dtype in ("float64", "float32"):
        res = _verdict(scipy_special.softmax, "scipy.special:softmax", dtype=dtype,
                       kwargs={"axis": -1})  # fmt: skip
        assert "NaN where the table gives zeros" in res["special_values"].message


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_torch_softmax_conforms(dtype):
    pytest.importorskip("torch")
    _verdict(bk.torch_softmax, framework="torch", dtype=dtype)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_torch_sdpa_conforms_as_plain_attention(dtype):
    pytest.importorskip("torch")
    res = _verdict(bk.torch_sdpa, kind="attention", framework="torch", dtype=dtype,
                   schedule=Constant(1))  # fmt: skip
    assert {r.status for r in res.values()} == {"pass"}


def test_numpy_attention_conforms():
    _verdict(bk.attention, kind="attention")
    _verdict(bk.softmax_attention, kind="attention", dtype="float32", schedule=Constant(1))


def test_determinism():
    t = conf.Target(bk.softmax, dtype="float32")
    a = [(r.name, r.status, r.max_ulp, r.checks) for r in conf.run_conformance(t)]
    b = [(r.name, r.status, r.max_ulp, r.checks) for r in conf.run_conformance(t)]
    assert a == b


# -- the command line -------------------------------------------------------------


def test_cli_conforms_exit_0(capsys):
    assert cli.main(["check", "tests.support.broken_kernels:softmax", "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    assert "CONFORMS" in out and "errors in ulps of float32" in out
    for name in conf.properties_for("softmax"):
        line = next(ln for ln in out.splitlines() if f" {name} " in ln)
        assert line.startswith("PASS") and "ulp" in line
        assert line.endswith(" 1 check") or line.endswith(" checks")


def test_cli_fails_exit_1_with_property_and_repro(capsys):
    code = cli.main(
        [
            "check",
            "tests.support.broken_kernels:entropy_log2",
            "--kind",
            "entropy",
            "--only",
            "values",
        ]
    )
    out = capsys.readouterr().out
    assert code == 1
    assert "FAIL  values" in out and "DOES NOT CONFORM" in out
    assert "=== values: counterexample ===" in out
    assert "from tests.support.broken_kernels import entropy_log2" in out
    assert "print(float(reference.entropy(x)" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["tests.support.broken_kernels"], "pkg.mod:func"),
        (["no_such_module_xyz:f"], "cannot import"),
        (["tests.support.broken_kernels:nope"], "no attribute"),
        (["tests.support.broken_kernels:PAPER"], "not callable"),
        (["tests.support.broken_kernels:softmax", "--dtype", "bfloat16"], "bfloat16"),
        (["tests.support.broken_kernels:softmax", "--device", "cuda"], "cpu only"),
        (["tests.support.broken_kernels:softmax", "--only", "nonsense"], "unknown properties"),
        (["tests.support.broken_kernels:softmax", "--kwarg", "1x"], "NAME=VALUE"),
    ],
)
def test_cli_usage_errors_exit_2(capsys, argv, message):
    assert cli.main(["check", *argv]) == 2
    assert message in capsys.readouterr().err


def test_cli_unknown_kind_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["check", "tests.support.broken_kernels:softmax", "--kind", "sparsemax"])
    assert info.value.code == 2


def test_parse_kwarg():
    assert conf.parse_kwarg("axis=-1") == ("axis", -1)
    assert conf.parse_kwarg("mode = fast") == ("mode", "fast")
