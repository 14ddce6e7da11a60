"""Every defect class is caught, and the report names the property that caught it."""

from __future__ import annotations

import pytest

from softmaxtheory import conformance as conf
from softmaxtheory.spec import Constant
from tests import broken_kernels as bk

# (kernel, options, a property that must fail)
CASES = {
    # PAPER.md: known port errors of the adaptive temperature
    "reversed coefficients": (bk.reversed_coefficients, {"kind": "adaptive_softmax"}, "values"),
    "polynomial used as a temperature": (
        bk.polynomial_as_temperature, {"kind": "adaptive_softmax"}, "temperature_cap"),
    "batch-global entropy": (
        bk.batch_global_entropy, {"kind": "adaptive_softmax"}, "batch_independence"),
    "beta below 1": (bk.beta_below_one, {"kind": "adaptive_softmax"}, "temperature_cap"),
    "fp16 guard vanishing": (
        bk.fp16_guard_vanishing,
        {"kind": "entropy", "dtype": "float16", "entropy_eps": 1e-9},
        "special_values"),
    # classic softmax defects
    "no max subtraction": (bk.no_max_subtraction, {"kind": "softmax"}, "values"),
    "no max subtraction, float32": (
        bk.no_max_subtraction, {"kind": "softmax", "dtype": "float32"}, "invariances"),
    "wrong log base (entropy)": (bk.entropy_log2, {"kind": "entropy"}, "values"),
    "wrong log base (adaptive)": (
        bk.adaptive_log2_entropy, {"kind": "adaptive_softmax"}, "branch_points"),
    "threshold ignored": (bk.threshold_ignored, {"kind": "adaptive_softmax"}, "schedules"),
    "float32 accumulation in a float64 kernel": (
        bk.float32_accumulation, {"kind": "softmax"}, "long_rows"),
    "float16 accumulation on long rows": (
        bk.half_accumulation, {"kind": "softmax", "dtype": "float16"}, "long_rows"),
    "dtype not preserved": (bk.float32_result, {"kind": "softmax"}, "dtype_shape"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_defect_is_caught(case):
    kernel, opts, prop = CASES[case]
    target = conf.Target(kernel, f"tests.broken_kernels:{kernel.__name__}", **opts)
    res = conf.run_property(prop, target)
    assert res.status == "fail", f"{case}: {prop} did not catch it"
    assert res.message
    assert f"from tests.broken_kernels import {kernel.__name__}" in res.message or (
        "dtype" in res.message
    )
    line = res.line()
    assert line.startswith("FAIL") and prop in line


def test_threshold_ignored_is_invisible_with_the_paper_schedule_alone():
    """P < 1 on [0, 0.5] (T5): only a schedule with a jump exposes the dropped threshold."""
    target = conf.Target(bk.threshold_ignored, kind="adaptive_softmax")
    assert conf.run_property("values", target).status == "pass"


def test_attention_defects_are_caught():
    # plain attention checked as adaptive attention: wrong temperature
    target = conf.Target(bk.softmax_attention, kind="attention")
    assert conf.run_property("attention_values", target).status == "fail"

    # a kernel ignoring the causal flag
    def no_causal(q, k, v, mask=None, is_causal=False):
        return bk.attention(q, k, v, mask=mask)

    target = conf.Target(no_causal, kind="attention")
    assert conf.run_property("attention_causal", target).status == "fail"

    # a kernel ignoring the mask
    def no_mask(q, k, v, mask=None, is_causal=False):
        return bk.attention(q, k, v, is_causal=is_causal)

    target = conf.Target(no_mask, kind="attention")
    assert conf.run_property("attention_masks", target).status == "fail"
    target = conf.Target(bk.softmax_attention, kind="attention", schedule=Constant(1))
    assert conf.run_property("attention_values", target).status == "pass"


@pytest.mark.parametrize(
    ("case", "framework"),
    [("reversed coefficients", "numpy"), ("wrong log base (entropy)", "numpy"),
     ("no max subtraction, float32", "numpy")],
)  # fmt: skip
def test_repro_snippet_reproduces_the_counterexample(case, framework, capsys):
    kernel, opts, prop = CASES[case]
    target = conf.Target(kernel, f"tests.broken_kernels:{kernel.__name__}", framework=framework,
                      **opts)  # fmt: skip
    res = conf.run_property(prop, target)
    snippet = res.message.split("repro:\n", 1)[1]
    exec(compile(snippet, "<repro>", "exec"), {})
    printed = capsys.readouterr().out.split()
    promised = [ln.split("# ", 1)[1].strip() for ln in snippet.splitlines() if "# " in ln
                and ln.startswith("print(")]  # fmt: skip
    assert printed == promised


def test_torch_repro_snippet_runs(capsys):
    torch = pytest.importorskip("torch")

    target = conf.Target(bk.torch_softmax, "tests.broken_kernels:torch_softmax", framework="torch",
                      dtype="bfloat16")  # fmt: skip
    x = torch.tensor([[0.0, 1.0, 2.0]], dtype=torch.bfloat16)
    ns: dict = {}
    exec("import numpy as np\n" + target.repro, ns)
    got = ns["kernel"](x.float().numpy())
    assert got.dtype.name == "float64" and abs(got.sum() - 1) < 1e-2
