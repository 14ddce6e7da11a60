"""Every defect class is caught, and the report names the property that caught it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from softmaxtheory import conformance as conf
from softmaxtheory import strategies as strat
from softmaxtheory._check import properties as conf_properties
from softmaxtheory._check.runner import run_given
from softmaxtheory.spec import Constant
from tests.support import broken_kernels as bk

SCORE = json.loads((Path(__file__).resolve().parent.parent / bk.SCORE_FILE).read_text())


def _needs(opts):
    if opts.get("framework") == "torch":
        pytest.importorskip("torch")


@pytest.mark.parametrize("case", list(bk.CATALOGUE))
def test_defect_is_caught_by_the_default_run(case):
    """Each defect class of the catalogue fails a property of the default run, with a repro.

    The properties are independent and deterministic, so the property that
    catches a defect in the default run catches it alone; the docs' mutation
    score is the record checked here.
    """
    kernel, opts, prop = bk.CATALOGUE[case]
    _needs(opts)
    target = conf.Target(kernel, f"tests.support.broken_kernels:{kernel.__name__}", **opts)
    assert prop in conf.properties_for(target.kind)
    assert target.examples is None and not target.thorough and not target.strict
    res = conf.run_property(prop, target)
    assert res.status == "fail", f"{case}: {prop} did not catch it"
    assert res.message
    assert f"from tests.support.broken_kernels import {kernel.__name__}" in res.message or (
        "dtype" in res.message or "table gives" in res.message
    )
    line = res.line()
    assert line.startswith("FAIL") and prop in line
    assert SCORE["defects"][case] == bk.score_entry(case, prop, "fail")


@pytest.mark.parametrize(
    ("case", "first"),
    [
        ("-inf replaced by -1e4", "masked row far from 0"),
        ("beta below 1 (no max(P, 1))", "temperature cap (T5) violated"),
        # (the rows near H_off of KINK_OFFSETS catch it before the far-block rows do)
        ("entropy rounded once to bfloat16", "branch-point rows"),
    ],
)
def test_fixed_rows_catch_what_the_sample_found_by_luck(case, first):
    """These classes were caught only when the derandomized sample happened to hold a
    suitable row (a change to a strategy's draws once let the first two pass; no draw held
    the third's): fixed rows, checked before the drawn ones, catch them with a single drawn
    example."""
    kernel, opts, prop = bk.CATALOGUE[case]
    _needs(opts)
    target = conf.Target(
        kernel, f"tests.support.broken_kernels:{kernel.__name__}", examples=1, **opts
    )
    res = conf.run_property(prop, target)
    assert res.status == "fail" and first in res.message


def test_the_mutation_score_records_every_class():
    """docs/testing/mutation_score.json lists exactly the catalogue and the correct kernels."""
    assert list(SCORE["defects"]) == list(bk.CATALOGUE)
    assert list(SCORE["correct"]) == list(bk.CORRECT)
    assert all(v["failed"] == [] for v in SCORE["correct"].values())
    named = {
        "coefficients in ascending powers", "polynomial used as a clipped temperature",
        "beta silently 1 on masked rows (0 * -inf = NaN entropy)",
        "1e-9 guard vanishing in float16", "Horner's rule in bfloat16", "logits clamped at +-50",
        "float64 path computed in float32", "statistics accumulated in float16",
        "-inf replaced by -1e4",
    }  # fmt: skip
    assert named <= set(bk.CATALOGUE)  # every class the issue names


@pytest.mark.parametrize("name", list(bk.CORRECT))
def test_correct_kernel_passes_the_default_run(name):
    """The examples of docs/examples/ and 16-bit kernels rounding their scaled logits once pass."""
    _, _, opts = bk.CORRECT[name]
    _needs(opts)
    kernel, path = bk.correct_kernel(name)
    results = conf.run_conformance(conf.Target(kernel, path, **opts))
    failed = [r for r in results if r.status == "fail"]
    assert not failed, "\n\n".join(f"{r.name}: {r.message}" for r in failed)
    assert SCORE["correct"][name]["failed"] == []


def _torch_ops_adaptive_softmax(x):
    """A correct adaptive softmax of plain torch operations, in x's dtype."""
    import torch

    z = x - x.amax(dim=-1, keepdim=True)
    H = torch.special.entr(torch.softmax(z, dim=-1)).sum(dim=-1, keepdim=True)
    P = torch.zeros_like(H)
    for c in bk.PAPER:
        P = P * H + c
    beta = torch.where(H > 0.5, P.clamp(min=1.0), torch.ones_like(H))
    return torch.softmax(beta * z, dim=-1)


def test_a_float64_torch_adaptive_softmax_passes_the_long_fixed_rows():
    """The row of 69635 items held 69385 items all at -18: torch's CPU softmax sums them
    one after another, each addition rounding the same way, and was 1.1e-12 off on every
    coefficient (10185 u) where the model's probabilistic sum allows 2112 u. The far
    items now differ by a little, as the model assumes (docs/error_model.rst)."""
    pytest.importorskip("torch")
    target = conf.Target(_torch_ops_adaptive_softmax, kind="adaptive_softmax",
                         framework="torch", dtype="float64")  # fmt: skip
    res = conf.run_property("branch_points", target)
    assert res.status == "pass", res.message


def test_threshold_ignored_is_invisible_with_the_paper_schedule_alone():
    """P < 1 on [0, 0.5] (T5): only a schedule with a jump exposes the dropped threshold."""
    target = conf.Target(bk.threshold_ignored, kind="adaptive_softmax")
    assert conf.run_property("values", target).status == "pass"


def test_plain_attention_passes_as_plain_attention():
    """The catalogue's "plain attention checked as adaptive" is right with Constant(1)."""
    target = conf.Target(bk.softmax_attention, kind="attention", schedule=Constant(1))
    assert conf.run_property("attention_values", target).status == "pass"


def test_a_kernel_that_refuses_broadcasting_passes_with_a_note():
    """Equal leading dimensions only is a kernel's choice (FlashAttention's): k and v that
    broadcast over q's heads are noted when refused, and checked when taken."""

    def same_shapes_only(q, k, v, mask=None, is_causal=False):
        if np.shape(q)[:-2] != np.shape(k)[:-2]:
            raise ValueError("q, k and v must have the same leading dimensions")
        return bk.attention(q, k, v, mask=mask, is_causal=is_causal)

    target = conf.Target(same_shapes_only, kind="attention")
    res = conf.run_property("attention_layouts", target)
    assert res.status == "pass", res.message
    assert res.notes == ["leading dimensions that broadcast refused with ValueError"]
    taken = conf.run_property("attention_layouts", conf.Target(bk.attention, kind="attention"))
    assert taken.status == "pass" and taken.checks == res.checks + 1 and not taken.notes


def test_a_kernel_that_refuses_float_masks_passes_with_a_note():
    """Boolean masks only is a kernel's choice: the additive cases are noted, not failed."""

    def boolean_only(q, k, v, mask=None, is_causal=False):
        if mask is not None and np.asarray(mask).dtype != bool:
            raise TypeError("mask must be boolean")
        return bk.attention(q, k, v, mask=mask, is_causal=is_causal)

    res = conf.run_property("attention_masks", conf.Target(boolean_only, kind="attention"))
    assert res.status == "pass", res.message
    assert res.notes == ["float (additive) masks refused with TypeError"]

    def both(q, k, v, mask=None, is_causal=False):  # no schedule=: the same calls but two
        return bk.attention(q, k, v, mask=mask, is_causal=is_causal)

    full = conf.run_property("attention_masks", conf.Target(both, kind="attention"))
    # the additive cases: a (5, 7) bias, key padding, a bias over 300 keys, the far keys,
    # the masked queries and the queries at the lowest float
    assert full.status == "pass" and full.checks == res.checks + 6 and not full.notes
    # a kernel that takes schedule= is also called with the suite's other schedules, on
    # the boolean key padding and the (5, 7) bias
    sched = conf.run_property("attention_masks", conf.Target(bk.attention, kind="attention"))
    n_other = 2 * len(conf_properties.OTHER_SCHEDULES)  # (10: five schedules, two cases)
    assert sched.status == "pass" and sched.checks == full.checks + n_other and not sched.notes


def _promised(snippet):
    """The values a repro snippet's ``print(...)  # value`` lines promise, in order."""
    return [ln.split("# ", 1)[1].strip() for ln in snippet.splitlines()
            if "# " in ln and ln.startswith("print(")]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "framework"),
    [("coefficients in ascending powers", "numpy"), ("entropy in bits", "numpy"),
     ("no max subtraction, float32", "numpy"), ("-inf replaced by -1e4", "numpy"),
     ("online softmax losing the scale of its last, partial block", "numpy"),
     ("polynomial used as a clipped temperature", "numpy")],
)  # fmt: skip
def test_repro_snippet_reproduces_the_counterexample(case, framework, capsys):
    kernel, opts, prop = bk.CATALOGUE[case]
    target = conf.Target(kernel, f"tests.support.broken_kernels:{kernel.__name__}",
                         framework=framework, **opts)  # fmt: skip
    res = conf.run_property(prop, target)
    snippet = res.message.split("repro:\n", 1)[1]
    exec(compile(snippet, "<repro>", "exec"), {})
    promised = _promised(snippet)
    assert capsys.readouterr().out.split() == promised


def float32_last_item_off(x):
    """Right in float64; in float32 the last item of rows of 5 or more is 1e-5 too large."""
    x = np.asarray(x)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    out = (e / e.sum(axis=-1, keepdims=True)).astype(x.dtype)
    if x.dtype == np.float32 and x.shape[-1] >= 5:
        out[..., -1] *= np.float32(1 + 1e-5)
    return out


def test_many_rows_repro_casts_the_whole_planted_batch(capsys):
    """The planted batches' source is a sum (``a + b``): ``.astype`` cast its last term only,
    so the snippet's x stayed float64 and printed the right value where the report said
    the kernel's was wrong."""
    target = conf.Target(float32_last_item_off,
                         "tests.test_conformance_broken:float32_last_item_off",
                         dtype="float32")  # fmt: skip
    res = conf.run_property("many_rows", target)
    assert res.status == "fail"
    snippet = res.message.split("repro:\n", 1)[1]
    exec(compile(snippet, "<repro>", "exec"), {})
    promised = _promised(snippet)
    assert capsys.readouterr().out.split() == promised
    assert len(promised) == 2 and promised[0] != promised[1]


@pytest.mark.parametrize(
    "case",
    ["attention ignoring is_causal", "attention ignoring the mask",
     "attention reading views as contiguous memory",
     "torch attention reading views as contiguous memory",
     "causal mask applied before the scale",
     "blocked attention losing the scale of its last, partial key block",
     "batched mask read at its first entry", "additive mask read as a boolean one"],
)  # fmt: skip
def test_attention_repro_calls_the_kernel_as_the_suite_did(case, capsys):
    """The snippet calls the kernel with the mask, is_causal, scale and operand views it got.

    It printed ``kernel(q, k, v)`` for every attention failure, so a causal, masked or
    scaled counterexample printed a value other than the one the report promised.
    """
    kernel, opts, prop = bk.CATALOGUE[case]
    _needs(opts)
    target = conf.Target(kernel, f"tests.support.broken_kernels:{kernel.__name__}", **opts)
    res = conf.run_property(prop, target)
    assert res.status == "fail"
    snippet = res.message.split("repro:\n", 1)[1].split("\n\n=== ", 1)[0]
    exec(compile(snippet, "<repro>", "exec"), {})
    promised = _promised(snippet)
    assert capsys.readouterr().out.split() == promised
    assert len(promised) == 2 and promised[0] != promised[1]


def test_attention_repro_of_given_logits_calls_kernel_with_them(capsys):
    """``assert_attention_close((logits, v))``: the snippet calls ``kernel(x, v)``."""
    from softmaxtheory import testing as tst

    x = np.array([[0.5, -np.inf, 0.2, 0.1, 0.0], [0.3, 0.2, 0.1, 0.0, -0.1]])
    v = np.array([[1.0], [2.0], [3.0], [4.0], [5.0]])

    def kernel(x, v):  # plain softmax: the paper's beta dropped
        e = np.exp(x - x.max(-1, keepdims=True))
        return (e / e.sum(-1, keepdims=True)) @ v

    with pytest.raises(tst.KernelMismatch) as info:
        tst.assert_attention_close(kernel(x, v), (x, v), repro="")
    snippet = str(info.value).split("repro:\n", 1)[1]
    assert "print(float(kernel(x, v)" in snippet
    exec(compile(snippet, "<repro>", "exec"), {"kernel": kernel})
    promised = _promised(snippet)
    assert capsys.readouterr().out.split() == promised


def test_torch_repro_snippet_runs(capsys):
    torch = pytest.importorskip("torch")

    target = conf.Target(bk.torch_softmax, "tests.support.broken_kernels:torch_softmax",
                         framework="torch", dtype="bfloat16")  # fmt: skip
    x = torch.tensor([[0.0, 1.0, 2.0]], dtype=torch.bfloat16)
    ns: dict = {}
    exec("import numpy as np\n" + target.repro, ns)
    got = ns["kernel"](x.float().numpy())
    assert got.dtype.name == "float64" and abs(got.sum() - 1) < 1e-2


def torch_constant_beta_off(x, schedule=None):
    """A torch adaptive softmax that takes ``schedule=`` and applies a Constant's β + 0.01."""
    import torch

    from softmaxtheory.accelerated.torch import adaptive_softmax
    from softmaxtheory.spec import Constant

    if isinstance(schedule, Constant):
        out = torch.softmax((float(schedule.exact_beta) + 0.01) * x.double(), -1)
        return torch.nan_to_num(out, nan=0.0).to(x.dtype)
    return adaptive_softmax(x, schedule=schedule)


def test_torch_repro_passes_the_schedule(capsys):
    """The torch snippet's wrapper was ``kernel(*arrays)``, and the schedules property's
    snippet calls it with ``schedule=``: it raised a TypeError instead of reproducing."""
    pytest.importorskip("torch")
    target = conf.Target(torch_constant_beta_off,
                         "tests.test_conformance_broken:torch_constant_beta_off",
                         framework="torch", kind="adaptive_softmax", dtype="float32")  # fmt: skip
    res = conf.run_property("schedules", target)
    assert res.status == "fail"
    snippet = res.message.split("repro:\n", 1)[1]
    assert "schedule=" in snippet
    exec(compile(snippet, "<repro>", "exec"), {})
    promised = _promised(snippet)
    assert capsys.readouterr().out.split() == promised
    assert len(promised) == 2 and promised[0] != promised[1]


# -- contracts in the suite (issue 15, section 3) ------------------------------------------


def test_fully_masked_rows_by_kind_and_contract():
    """NaN for a fully masked row: a softmax's convention by default; strict wants zeros."""

    def nan_softmax(x):
        x = np.asarray(x)
        e = np.exp(x - np.max(x, axis=-1, keepdims=True))
        return e / np.sum(e, axis=-1, keepdims=True)

    res = conf.run_property("special_values", conf.Target(nan_softmax, dtype="float32"))
    assert res.status == "pass" and "NaN where the table gives zeros" in res.message
    res = conf.run_property(
        "special_values", conf.Target(nan_softmax, dtype="float32", strict=True)
    )
    assert res.status == "fail" and "the table gives zeros" in res.message
    assert "tolerated only without strict" in res.message

    def nan_adaptive(x):
        out = bk.adaptive_softmax(x)
        return np.where(np.all(np.asarray(x) == -np.inf, axis=-1, keepdims=True), np.nan, out)

    res = conf.run_property("special_values", conf.Target(nan_adaptive, kind="adaptive_softmax"))
    assert res.status == "fail" and "not kind adaptive_softmax's" in res.message
    res = conf.run_property("special_values", conf.Target(bk.adaptive_softmax, strict=True,
                                                          kind="adaptive_softmax"))  # fmt: skip
    assert res.status == "pass" and not res.message


def test_strict_failure_says_the_default_contract_passes():
    # (scaling x itself rounds larger logits than the shifted form: values fails strict)
    target = conf.Target(bk.listing_native_16bit_unshifted,
                         "tests.support.broken_kernels:listing_native_16bit_unshifted",
                         kind="adaptive_softmax", dtype="float16", strict=True)  # fmt: skip
    res = conf.run_property("values", target)
    assert res.status == "fail"
    assert "passes under the default 16-bit contract" in res.message


def test_strict_must_be_a_bool():
    with pytest.raises(conf.ConformanceUsageError, match="strict"):
        conf.Target(bk.softmax, strict="yes")


def test_draws_do_not_depend_on_imported_modules(tmp_path, monkeypatch):
    """Hypothesis mixes literals of imported local modules into its draws; the suite does not."""
    mod = tmp_path / "lots_of_constants.py"
    mod.write_text("C = [" + ", ".join(f"{1.0 + k / 7.0!r}" for k in range(400)) + "]\n")
    target = conf.Target(bk.softmax, dtype="float32")

    def drawn():
        seen = []
        run_given(target, strat.logit_rows(max_size=8, dtype="float32"), 40,
                        lambda x: seen.append(x.tobytes()))  # fmt: skip
        return seen

    before = drawn()
    monkeypatch.syspath_prepend(str(tmp_path))
    import lots_of_constants  # noqa: F401

    assert drawn() == before


def test_a_kernel_raising_on_a_view_fails_with_the_exception():
    """A kernel that refuses a non-contiguous input fails dtype_shape with what it raised;
    the view cases called the kernel outside the suite's wrapper, and the check reported
    a crashed process (in process: the exception escaped run_property)."""

    def contiguous_only(x):
        if not x.flags.c_contiguous:
            raise ValueError("x must be contiguous")
        return bk.softmax(x)

    res = conf.run_property("dtype_shape", conf.Target(contiguous_only, dtype="float32"))
    assert res.status == "fail"
    assert "the kernel raised ValueError: x must be contiguous" in res.message


def test_a_cache_keyed_by_shape_alone_is_caught_and_its_repro_calls_the_other_dtype_first(
    capsys,
):
    """Every call of a run was in one dtype: a kernel whose compiled variants are cached by
    shape, the dtype left out of the key, passed. The repro makes the float16 call first."""
    pytest.importorskip("torch")
    kernel, opts, prop = bk.CATALOGUE[
        "a compiled variant cached by shape, the dtype left out of the key"
    ]
    bk._VARIANTS.clear()
    target = conf.Target(kernel, f"tests.support.broken_kernels:{kernel.__name__}", **opts)
    res = conf.run_property(prop, target)
    assert res.status == "fail" and "shape (2, 6007), called in float16 first" in res.message
    snippet = res.message.split("repro:\n", 1)[1]
    assert "# the suite's call in float16 first, same shape" in snippet
    got = res.message.split("  got      ", 1)[1].split("\n", 1)[0]
    bk._VARIANTS.clear()  # the repro's own first call makes the variant
    exec(compile(snippet, "<repro>", "exec"), {})
    kernel_value, reference_value = capsys.readouterr().out.split()
    assert float(kernel_value) == float(got) != float(reference_value)
    bk._VARIANTS.clear()


def test_a_long_rows_nan_convention_note_is_short():
    """The note of a special row answered with NaN at the +inf items and 0 elsewhere wrote
    every item: 4099 of them, 20 kB on one line. A long row is given by where its NaNs are
    and what the rest holds; a short one is written out as before."""
    from softmaxtheory._check.properties import _nan_text

    assert _nan_text(np.array([0.0, np.nan, 0.0])) == "NaN at 1 of 3 items ([0.0, nan, 0.0])"
    row = np.zeros(4099)
    row[[7, 100]] = np.nan
    assert _nan_text(row) == "NaN at 2 of 4099 items (at 7, 100; the others 0.0)"
    assert _nan_text(np.full(4099, np.nan)) == "NaN"


def padded_keys_off(q, k, v, mask=None, is_causal=False):
    """Right but with a key-padding mask over 20 keys: then its last output is 0.1 % off."""
    out = bk.attention(q, k, v, mask=mask, is_causal=is_causal)
    if mask is not None and np.shape(mask)[-1] == 20 and out.size:
        out = out.copy()
        out.flat[-1] *= 1.001
    return out


def test_the_model_shapes_masked_repro_writes_its_mask(capsys):
    """At the shapes of real models, the masked case's repro wrote
    ``mask = np.asarray(<your mask>)``: the mask's source was not passed along."""
    target = conf.Target(padded_keys_off, "tests.test_conformance_broken:padded_keys_off",
                         kind="attention")  # fmt: skip
    res = conf.run_property("attention_values", target)
    assert res.status == "fail" and "the last 7 keys masked" in res.message
    snippet = res.message.split("repro:\n", 1)[1].split("\n\n=== ", 1)[0]
    assert "<your" not in snippet
    exec(compile(snippet, "<repro>", "exec"), {})
    promised = _promised(snippet)
    assert capsys.readouterr().out.split() == promised
    assert len(promised) == 2 and promised[0] != promised[1]


def one_row_for_none(x):
    """Right, but a batch of no rows gets one row of zeros."""
    x = np.asarray(x)
    if x.ndim >= 2 and x.shape[0] == 0:
        return np.zeros((1, x.shape[-1]), x.dtype)
    return bk.softmax(x)


def test_a_batch_of_no_rows_is_checked():
    """``special_values`` sent rows of no items but never a batch of no rows: a kernel that
    answered one row of zeros there conformed. A kernel that raises there gets a note."""
    res = conf.run_property("special_values", conf.Target(one_row_for_none, "m:one_row_for_none"))
    assert res.status == "fail" and "returned shape (1, 5), expected (0, 5)" in res.message

    def refuses(x):
        if np.asarray(x).shape[0] == 0:
            raise ValueError("no rows")
        return bk.softmax(x)

    res = conf.run_property("special_values", conf.Target(refuses, "m:refuses"))
    assert res.status == "pass" and "a batch of 0 rows refused with ValueError" in res.notes
