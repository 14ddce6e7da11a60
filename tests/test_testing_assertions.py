"""softmaxtheory.testing: the assertions accept correct kernels and name the worst element."""

from __future__ import annotations

import math

import numpy as np
import pytest

from softmaxtheory import reference, testing
from softmaxtheory.spec import Constant, LogLength, Polynomial
from softmaxtheory.testing import (
    ErrorReport,
    KernelMismatch,
    assert_adaptive_softmax_close,
    assert_attention_close,
    assert_entropy_close,
    assert_softmax_close,
)
from tests.support import broken_kernels as bk

RNG = np.random.default_rng(20250601)


def _rows(dtype, shape=(3, 40), scale=3.0):
    return (RNG.normal(0, scale, shape)).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
def test_correct_numpy_kernels_pass_and_report(dtype):
    x = _rows(dtype)
    rep = assert_softmax_close(bk.softmax(x), x)
    assert isinstance(rep, ErrorReport) and rep.passed
    assert rep.dtype == np.dtype(dtype).name and rep.size == x.size
    assert 0 <= rep.max_ulp < 64 and rep.worst_ratio <= 1
    assert assert_entropy_close(bk.entropy(x), x).passed
    assert assert_adaptive_softmax_close(bk.adaptive_softmax(x), x).passed


def test_reference_itself_measures_at_most_half_an_ulp():
    x = _rows(np.float32)
    rep = assert_softmax_close(reference.softmax(x, dtype=np.float32), x)
    assert rep.max_ulp <= 0.5
    rep = assert_softmax_close(reference.softmax(x), x, mode="ulps", max_ulps=0)
    assert rep.max_ulp == 0


def test_failure_names_worst_element_row_h_beta_and_repro():
    x = _rows(np.float64, (2, 12), 1.0)
    with pytest.raises(KernelMismatch) as info:
        assert_adaptive_softmax_close(bk.reversed_coefficients(x), x)
    msg = str(info.value)
    rep = info.value.report
    assert not rep.passed and rep.worst_ratio > 1
    assert f"index {rep.worst_index}" in msg
    for word in ("got", "exact", "ulp of float64", "H = ", "beta = ", "repro:", "kernel(x)"):
        assert word in msg
    # the snippet really reproduces the exact value it prints
    snippet = msg.split("repro:\n", 1)[1]
    ns = {"kernel": bk.reversed_coefficients}
    exec_lines = [ln for ln in snippet.splitlines() if not ln.startswith("print")]
    exec("\n".join(exec_lines), ns)
    i = rep.worst_index
    assert float(reference.adaptive_softmax(ns["x"])[i]) == float(reference.adaptive_softmax(x)[i])


@pytest.mark.parametrize(
    "options",
    [
        {"legacy": "1.13"},  # numpy's own array2string raised TypeError under it
        {"formatter": {"float": lambda v: f"{v:.3f}"}},  # the literal kept 3 decimals
        {"suppress": True, "precision": 2, "sign": "+"},
    ],
    ids=["legacy", "formatter", "suppress"],
)
def test_repro_literals_ignore_numpys_print_options(options):
    """The arrays of a repro are written out exactly whatever print options the caller (or
    the kernel under test) has set, and read back to the same bits."""
    x = _rows(np.float64, (2, 12), 1.0)
    x[0, 3], x[1, 0] = -np.inf, 1e-20
    with np.printoptions(**options), pytest.raises(KernelMismatch) as info:
        assert_adaptive_softmax_close(bk.reversed_coefficients(x), x)
    snippet = str(info.value).split("repro:\n", 1)[1]
    ns = {"kernel": bk.reversed_coefficients}
    exec("\n".join(ln for ln in snippet.splitlines() if not ln.startswith("print")), ns)
    assert ns["x"].shape == x.shape
    assert ns["x"].tobytes() == x.tobytes()


def test_modes():
    x = _rows(np.float32)
    y = bk.softmax(x)
    rep_b = assert_softmax_close(y, x, mode="bound")
    assert rep_b.max_ulp == assert_softmax_close(y, x).max_ulp
    rep_n = assert_softmax_close(reference.softmax(x, dtype=np.float32), x, mode="baseline")
    assert rep_n.max_ulp <= 0.5
    bumped = y.copy()
    bumped[0, 0] = np.nextafter(np.nextafter(y[0, 0], np.float32(1)), np.float32(1))
    bumped[0, 0] = bumped[0, 0] * np.float32(1 + 2**-20)
    with pytest.raises(KernelMismatch):
        assert_softmax_close(bumped, x, mode="ulps", max_ulps=4)
    with pytest.raises(ValueError, match="mode"):
        assert_softmax_close(y, x, mode="loose")
    with pytest.raises(ValueError, match="max_ulps"):
        assert_softmax_close(y, x, mode="ulps")


def test_shape_mismatch_and_bad_dtype():
    x = _rows(np.float64)
    with pytest.raises(KernelMismatch, match="shape"):
        assert_softmax_close(bk.softmax(x)[:, :-1], x)
    with pytest.raises(KernelMismatch, match="shape"):
        assert_entropy_close(bk.softmax(x), x)
    with pytest.raises(TypeError, match="actual"):
        assert_softmax_close(bk.softmax(x).astype(complex), x)


def test_nan_where_a_number_is_due_fails_and_special_rows_pass():
    x = np.array([[0.0, -np.inf, 1.0], [np.nan, 0.0, 0.0], [-np.inf, -np.inf, -np.inf]])
    y = reference.softmax(x)
    assert assert_softmax_close(y, x).max_ulp == 0
    y2 = y.copy()
    y2[0, 0] = np.nan
    with pytest.raises(KernelMismatch, match="nan"):
        assert_softmax_close(y2, x)
    y3 = y.copy()
    y3[0, 1] = 1e-300  # a masked entry must be exactly 0
    with pytest.raises(KernelMismatch):
        assert_softmax_close(y3, x)


def test_long_float64_row_hundreds_of_ulps_is_not_a_defect():
    """DESIGN §7: a correct float64 kernel is hundreds of ulps off on tiny coefficients."""
    x = RNG.normal(0, 6, (1, 4096))
    rep = assert_adaptive_softmax_close(bk.adaptive_softmax(x), x)
    assert rep.passed and rep.max_ulp > 16  # measured, not hidden
    with pytest.raises(KernelMismatch):
        assert_adaptive_softmax_close(bk.adaptive_softmax(x), x, mode="ulps", max_ulps=8)


@pytest.mark.parametrize("schedule", [Constant("2"), LogLength("0.5"), Polynomial(("0.5", "1"), 1)])
def test_other_schedules(schedule):
    x = _rows(np.float32, (4, 10), 1.0)
    rep = assert_adaptive_softmax_close(
        bk.adaptive_softmax(x, schedule=schedule), x, schedule=schedule
    )
    assert rep.passed
    with pytest.raises(KernelMismatch):
        assert_adaptive_softmax_close(bk.adaptive_softmax(x), x, schedule=Constant("3"))


def test_either_side_of_a_jump_is_accepted():
    from softmaxtheory.strategies import row_with_entropy

    jump = Polynomial(("0.5", "1"), threshold="1")  # beta: 1 for H <= 1, 1 + H/2 above
    x = row_with_entropy(1.0, 12, 1)[None, :]
    H = float(reference.entropy(x)[0])
    assert abs(H - 1.0) < 1e-12
    left = reference.adaptive_softmax(x, schedule=Constant(1))
    right = reference.adaptive_softmax(x, schedule=Polynomial(("0.5", "1"), threshold="-1"))
    assert np.max(np.abs(left - right)) > 1e-3
    for side in (left, right):
        assert assert_adaptive_softmax_close(side, x, schedule=jump).passed
    far = _rows(np.float64, (1, 12), 0.1)  # H ~ log 12, far from the jump
    with pytest.raises(KernelMismatch):
        assert_adaptive_softmax_close(
            reference.adaptive_softmax(far, schedule=Constant(1)), far, schedule=jump
        )


def test_a_computed_entropy_below_a_threshold_no_exact_entropy_reaches_is_accepted():
    """Threshold 0 with P(0) = 3: no row of two items has an exact entropy at or below 0,
    but a sound kernel's entropy of (0, -40), exactly 1.7e-16, may come out as -2.3e-16
    (the entropy check grants that error) and take beta = 1; that side was rejected
    (4.6e+50 ulp) because the rule's jump was looked for only where exact entropies lie."""
    sched = Polynomial(("3",), threshold="0")
    x = np.array([0.0, -40.0])
    p = np.exp(x) / np.exp(x).sum()
    computed = -(p * np.log(p)).sum() - 4e-16
    assert computed < 0 < float(reference.entropy(x))
    assert assert_entropy_close(np.array(computed), x).passed
    for side in (Constant(1), Polynomial(("3",), threshold="-1")):
        assert assert_adaptive_softmax_close(
            reference.adaptive_softmax(x, schedule=side), x, schedule=sched
        ).passed
    far = np.array([0.0, -1.0])  # entropy 0.58: beta = 3 only
    with pytest.raises(KernelMismatch):
        assert_adaptive_softmax_close(
            reference.adaptive_softmax(far, schedule=Constant(1)), far, schedule=sched
        )


def test_attention_accepts_either_side_of_a_jump():
    """assert_attention_close had no jump rule: a float32 query whose entropy is 8e-8 above
    the threshold (within a float32 entropy's error) failed with beta = 1."""
    from softmaxtheory.strategies import row_with_entropy

    jump = Polynomial(("0.5", "1"), threshold="1")
    v = (np.linspace(-1.0, 1.0, 16)[:, None] * np.ones((1, 3))).astype(np.float32)
    sides = (Constant(1), Polynomial(("0.5", "1"), threshold="-1"))

    def output(x, side):
        q = np.where(np.isneginf(x), 0.0, x).astype(np.float64)
        out = reference.adaptive_attention(q, np.eye(16), v, scale=1.0, schedule=side)
        return out.astype(np.float32)

    for dh in (1e-7, -1e-7):
        x = row_with_entropy(1.0 + dh, 16, 1)[None, :].astype(np.float32)
        assert abs(float(reference.entropy(x)[0]) - 1.0) < 3e-7
        for side in sides:
            assert assert_attention_close(output(x, side), (x, v), schedule=jump).passed
    x = row_with_entropy(1.001, 16, 1)[None, :].astype(np.float32)  # beyond the error
    assert assert_attention_close(output(x, sides[1]), (x, v), schedule=jump).passed
    with pytest.raises(KernelMismatch):
        assert_attention_close(output(x, sides[0]), (x, v), schedule=jump)


def test_entropy_eps_mode():
    x = np.array([[0.0, -30.0, -30.0], [0.0, 0.0, 1.0]], dtype=np.float32)
    assert assert_entropy_close(bk.entropy_guarded(x), x, entropy_eps=1e-9).passed
    with pytest.raises(KernelMismatch):
        assert_entropy_close(bk.entropy_log2(x), x)


def test_attention_assertion():
    q = RNG.normal(0, 2, (2, 5, 4))
    k = RNG.normal(0, 1, (2, 7, 4))
    v = RNG.normal(0, 1, (2, 7, 3))
    rep = assert_attention_close(bk.attention(q, k, v), (q, k, v))
    assert rep.passed and rep.kind == "attention"
    rep = assert_attention_close(bk.softmax_attention(q, k, v), (q, k, v), schedule=Constant(1))
    assert rep.passed
    with pytest.raises(KernelMismatch, match="attention output"):
        assert_attention_close(bk.softmax_attention(q, k, v), (q, k, v))
    mask = RNG.random((5, 7)) < 0.6
    mask[:, 0] = True
    out = bk.attention(q, k, v, mask=mask)
    assert assert_attention_close(out, (q, k, v), mask=mask).passed
    qc = q[:, :, :]
    kc, vc = k[:, :5], v[:, :5]
    out = bk.attention(qc, kc, vc, is_causal=True)
    assert assert_attention_close(out, (qc, kc, vc), is_causal=True).passed
    with pytest.raises(TypeError, match="tuple"):
        assert_attention_close(out, q)


def test_torch_inputs_bfloat16():
    torch = pytest.importorskip("torch")
    x = torch.randn(3, 50, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    rep = assert_softmax_close(torch.softmax(x, dim=-1), x)
    assert rep.dtype == "bfloat16" and rep.max_ulp <= 1
    bad = torch.softmax(x.float() * 1.05, dim=-1).to(torch.bfloat16)
    with pytest.raises(KernelMismatch, match="bfloat16"):
        assert_softmax_close(bad, x)


def test_works_without_hypothesis():
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['hypothesis'] = None\n"
        "import numpy as np\n"
        "from softmaxtheory.testing import assert_softmax_close\n"
        "x = np.array([[0.0, 1.0]]); e = np.exp(x - 1.0)\n"
        "print(assert_softmax_close(e / e.sum(-1, keepdims=True), x).passed)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


def test_attention_close_accepts_given_logits():
    """``(logits, v)``: a kernel handed its logits, masks as -inf, checked like (q, k, v)."""
    rng = np.random.default_rng(11)
    logits = rng.normal(scale=3.0, size=(2, 5, 7))
    logits[0, 1, 3] = -np.inf
    logits[1, 4, :] = -np.inf  # a fully masked query row: zeros
    v = rng.normal(size=(2, 7, 3))

    def kernel(x, v):  # the paper's adaptive attention from given logits, plain float64 numpy
        m = np.max(x, axis=-1, keepdims=True)
        m = np.where(np.isfinite(m), m, 0.0)
        e = np.exp(x - m)
        p = e / np.maximum(e.sum(-1, keepdims=True), 1e-300)
        with np.errstate(divide="ignore", invalid="ignore"):
            h = -np.sum(np.where(p > 0, p * np.log(p), 0.0), axis=-1, keepdims=True)
        beta = np.where(
            h > 0.5, np.maximum(np.polyval([-0.037, 0.481, -2.3, 4.917, -1.791], h), 1), 1
        )
        e = np.exp(beta * (x - m))
        return (e / np.maximum(e.sum(-1, keepdims=True), 1e-300)) @ v

    report = testing.assert_attention_close(kernel(logits, v), (logits, v))
    assert report.max_ulp < 64
    broken = kernel(logits, v)
    broken[0, 2, 1] *= 1 + 1e-9  # far outside the error model of a float64 kernel
    with pytest.raises(testing.KernelMismatch, match="index"):
        testing.assert_attention_close(broken, (logits, v))
    with pytest.raises(ValueError, match="scale"):
        testing.assert_attention_close(kernel(logits, v), (logits, v), scale=0.5)
    with pytest.raises(TypeError, match="logits"):
        testing.assert_attention_close(kernel(logits, v), (logits,))


def test_attention_repro_rebuilds_large_inputs_from_their_source(capsys):
    """``source=``: inputs too large to write out are rebuilt from their text, not ``<your q>``."""
    src = {
        "q": "np.random.default_rng(1).normal(0.0, 2.0, (2, 3, 8))",
        "k": "np.random.default_rng(2).normal(0.0, 1.0, (2, 300, 8))",
        "v": "np.random.default_rng(3).normal(0.0, 1.0, (2, 300, 4))",
    }
    q, k, v = (eval(src[n], {"np": np}) for n in "qkv")
    out = reference.adaptive_attention(q, k, v, dtype=np.float64)
    out[1, 2, 3] += 1e-6
    with pytest.raises(testing.KernelMismatch) as info:
        testing.assert_attention_close(out, (q, k, v), repro="", source=src)
    snippet = str(info.value).split("repro:\n", 1)[1]
    assert "<your" not in snippet and src["k"] in snippet
    namespace = {"kernel": lambda q, k, v: out}
    exec(compile(snippet, "<repro>", "exec"), namespace)
    printed = capsys.readouterr().out.split()
    promised = [ln.rsplit("# ", 1)[1] for ln in snippet.splitlines() if ln.startswith("print")]
    assert printed == promised
    with pytest.raises(testing.KernelMismatch) as info:  # without source: placeholders
        testing.assert_attention_close(out, (q, k, v), repro="")
    assert "k = np.asarray(<your k>)" in str(info.value)
    with pytest.raises(TypeError, match="source must be a dict"):
        testing.assert_attention_close(out, (q, k, v), source="q = ...")


# -- the 16-bit contract (issue 15, section 3) ------------------------------------------


def _window_row(n, h, seed, dtype):
    from softmaxtheory.strategies import _row_at_entropy

    g = np.random.default_rng(seed).standard_normal(n)
    return _row_at_entropy(g, h).astype(dtype)[None, :]


@pytest.mark.parametrize(("n", "h", "seed"), [(1024, 5.5, 0), (1024, 5.5, 5)])
def test_one_rounding_of_the_scaled_logits_passes_by_default_and_fails_strict(n, h, seed):
    """beta exact, beta * x rounded once to float16, a correct softmax: backward stable.

    The default contract accepts it; strict (float32-grade output) rejects it and
    says that the default contract passes it. (These logits are far below the
    range where beta * x overflows float16.)
    """
    x = _window_row(n, h, seed, np.float16)
    out = bk.listing_native_16bit_unshifted(x)
    rep = assert_adaptive_softmax_close(out, x)
    assert rep.passed and rep.contract == "default" and rep.other_contract_passed is False
    with pytest.raises(KernelMismatch, match="passes under the default 16-bit contract") as info:
        assert_adaptive_softmax_close(out, x, strict=True)
    assert info.value.report.contract == "strict"
    assert info.value.report.other_contract_passed is True


def test_beta_by_horner_in_float16_fails_both_contracts():
    """A beta computed in 16-bit arithmetic is not a rounding of the input: rejected by both."""
    x = _window_row(256, 5.2, 3, np.float16)
    out = bk.horner_float16(x)
    with pytest.raises(KernelMismatch, match="fails under strict too"):
        assert_adaptive_softmax_close(out, x)
    with pytest.raises(KernelMismatch, match="fails under the default 16-bit contract too"):
        assert_adaptive_softmax_close(out, x, strict=True)


def test_beta_by_horner_in_bfloat16_fails_both_contracts():
    torch = pytest.importorskip("torch")
    x = torch.from_numpy(_window_row(2048, 5.9, 4, np.float32)).to(torch.bfloat16)
    out = bk.torch_horner_bfloat16(x)
    for strict in (False, True):
        with pytest.raises(KernelMismatch):
            assert_adaptive_softmax_close(out, x, strict=strict)
    ok = bk.torch_listing_native_16bit(x)
    assert assert_adaptive_softmax_close(ok, x).passed


def test_float16_statistics_fail_the_default_contract_on_window_rows():
    """Entropy and normaliser accumulated in float16: beta off by many float16 ulps."""
    x = _window_row(1024, 5.8, 5, np.float16)
    with pytest.raises(KernelMismatch, match="adaptive softmax"):
        assert_adaptive_softmax_close(bk.float16_statistics(x), x)


def test_float16_softmax_and_entropy_contracts():
    """Softmax and entropy kinds: one rounding of the shifted logits x - max x is accepted."""
    x = _window_row(300, 5.3, 6, np.float16)
    with np.errstate(all="ignore"):
        z = (x.astype(np.float32) - x.max(axis=-1, keepdims=True)).astype(np.float16)
    sm = bk.softmax(z)  # softmax of the once-rounded shifted logits
    assert assert_softmax_close(sm, x).passed
    ent = bk.entropy(z)
    assert assert_entropy_close(ent, x).passed
    # both contracts are the same for float32 kernels
    x32 = x.astype(np.float32)
    rep = assert_softmax_close(bk.softmax(x32), x32, strict=True)
    assert rep.passed and rep.other_contract_passed is None


def test_strict_must_be_a_bool():
    x = _rows(np.float32)
    with pytest.raises(TypeError, match="strict"):
        assert_softmax_close(bk.softmax(x), x, strict="yes")


def test_attention_strict_contract_for_16_bit_logits():
    """Attention on float16 logits far from zero: beta * x rounded once passes by default only."""
    logits = (1000 + RNG.normal(0, 1, (3, 40))).astype(np.float16)
    v = RNG.normal(0, 1, (40, 8)).astype(np.float16)

    def kernel(logits, v):  # beta in float32, beta * x rounded to float16, the rest in float32
        x = logits.astype(np.float32)
        b = bk._beta32(bk._entropy(x - x.max(axis=-1, keepdims=True)))
        scaled = (b[:, None] * x).astype(np.float16).astype(np.float32)
        return (bk._softmax(scaled) @ v.astype(np.float32)).astype(np.float16)

    assert assert_attention_close(kernel(logits, v), (logits, v)).passed
    with pytest.raises(KernelMismatch, match="passes under the default 16-bit contract"):
        assert_attention_close(kernel(logits, v), (logits, v), strict=True)


@pytest.mark.parametrize(
    ("x", "dtype"),
    [
        ([3.4028235e38], np.float32),  # the fuzz test's counterexample (issue 14)
        ([-3.4028235e38], np.float32),
        ([1.7e308], np.float64),
        ([3.4e38, -np.inf, -np.inf], np.float32),  # one unmasked item
        ([3.4e38, 0.0], np.float32),  # the other item is e^(-3.4e38) however rounded
    ],
)
def test_a_dominant_item_far_from_zero_is_held_to_its_exact_value(x, dtype):
    """A row whose answer is 1 (and 0) is checked to a few ulps, not to |x| * u.

    The first-order logit-perturbation term u * beta * (|x_i| + |max x|) made the
    allowance infinite near the float maximum: 1.25 passed for 1.0 (2.1e6 ulp).
    """
    x = np.array(x, dtype=dtype)
    exact = reference.adaptive_softmax(x, dtype=dtype)
    assert assert_adaptive_softmax_close(exact, x).passed
    assert assert_softmax_close(reference.softmax(x, dtype=dtype), x).passed
    wrong = exact.copy()
    wrong[0] = dtype(1.25)
    with pytest.raises(KernelMismatch):
        assert_adaptive_softmax_close(wrong, x)
    with pytest.raises(KernelMismatch):
        assert_softmax_close(wrong, x)
    if x.size == 1:
        wrong[0] = np.nextafter(dtype(1), dtype(2)) * 1.0001
        with pytest.raises(KernelMismatch):
            assert_adaptive_softmax_close(wrong, x)


def test_exact_perturbation_bound_is_sound_for_perturbed_logits():
    """perturbed_logits_rel_error bounds |log y~ - log y| for random logit perturbations."""
    from softmaxtheory._check import error_model as model

    for _ in range(200):
        n = int(RNG.integers(1, 6))
        x = RNG.normal(0, float(RNG.choice([1.0, 30.0])), n)
        d = np.abs(RNG.normal(0, float(RNG.choice([1e-8, 1e-2, 1.0])), n))
        cond = model.row_conditioning(x)
        b = np.ones((1,))
        q = model._softmax_beta(cond, b)
        bound = model.perturbed_logits_rel_error(cond, b, q, d, np.full(n, np.inf))
        w = x + d * RNG.uniform(-1, 1, n)
        y = np.exp(x - x.max()) / np.sum(np.exp(x - x.max()))
        yt = np.exp(w - w.max()) / np.sum(np.exp(w - w.max()))
        err = np.abs(np.log(yt) - np.log(y))
        assert np.all(err <= bound * (1 + 1e-9) + 1e-15), (x, d, err, bound)


@pytest.mark.parametrize(
    "bad", [[(0, 0)], [(0, 3), (1, 7), (2, 39)], [(r, c) for r in range(3) for c in range(40)]]
)
def test_failure_counts_the_failing_elements(bad):
    """A failure reports k / N, numpy style; k is ErrorReport.n_failed and N its size."""
    x = _rows(np.float32)
    y = reference.softmax(x, dtype=np.float32)
    assert assert_softmax_close(y, x).n_failed == 0
    for i in bad:
        y[i] *= np.float32(1.01)  # some 10^5 ulps off
    with pytest.raises(KernelMismatch) as info:
        assert_softmax_close(y, x)
    rep = info.value.report
    assert (rep.n_failed, rep.size) == (len(bad), 120)
    pct = f"{100 * len(bad) / 120:.3g}%"
    assert f"  failing elements: {len(bad)} / 120 ({pct})\n" in str(info.value)


def test_failure_counts_for_entropy_and_attention():
    x = _rows(np.float64, shape=(5, 16))
    h = reference.entropy(x)
    h[[1, 4]] += 1e-6
    with pytest.raises(KernelMismatch, match=r"failing elements: 2 / 5 \(40%\)") as info:
        assert_entropy_close(h, x)
    assert info.value.report.n_failed == 2
    q, k, v = RNG.normal(0, 1, (4, 3)), RNG.normal(0, 1, (6, 3)), RNG.normal(0, 1, (6, 2))
    out = bk.attention(q, k, v)
    out[2, 1] += 1e-3
    with pytest.raises(KernelMismatch, match=r"failing elements: 1 / 8 \(12.5%\)") as info:
        assert_attention_close(out, (q, k, v))
    assert (info.value.report.n_failed, info.value.report.size) == (1, 8)


_ASSERTS = {
    "softmax": lambda **kw: assert_softmax_close(np.zeros(1), np.zeros(1), **kw),
    "entropy": lambda **kw: assert_entropy_close(np.zeros(()), np.zeros(1), **kw),
    "adaptive": lambda **kw: assert_adaptive_softmax_close(np.zeros(1), np.zeros(1), **kw),
    "attention": lambda **kw: assert_attention_close(np.zeros((1, 1)), "not a tuple", **kw),
}


@pytest.mark.parametrize("check", _ASSERTS.values(), ids=_ASSERTS.keys())
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"mode": "loose"}, ValueError, "mode must be one of"),
        ({"mode": "ulps"}, ValueError, "max_ulps"),
        ({"mode": "ulps", "max_ulps": -1.0}, ValueError, "max_ulps"),
        ({"baseline_factor": -1.0}, ValueError, "baseline_factor"),
        ({"floor_ulps": float("nan")}, ValueError, "floor_ulps"),
        ({"strict": 1}, TypeError, "strict must be a bool"),
    ],
)
def test_every_assertion_validates_its_tolerance_first(check, kwargs, error, match):
    """One tolerance object validates the keywords of all four assertions, before the inputs."""
    with pytest.raises(error, match=match):
        check(**kwargs)


def test_tolerance_is_frozen_and_shares_the_public_defaults():
    import dataclasses
    import inspect

    from softmaxtheory.testing import _Tolerance

    tol = _Tolerance(strict=np.True_)
    assert tol.strict is True and tol.contract == "strict"
    with pytest.raises(dataclasses.FrozenInstanceError):
        tol.mode = "bound"  # type: ignore[misc]
    for fn in (assert_softmax_close, assert_entropy_close, assert_adaptive_softmax_close,
               assert_attention_close):  # fmt: skip
        params = inspect.signature(fn).parameters
        for f in dataclasses.fields(_Tolerance):
            assert params[f.name].kind is inspect.Parameter.KEYWORD_ONLY
            assert params[f.name].default == f.default, (fn.__name__, f.name)
    # absolute errors, at spacings 1 and 0.5; a naive algorithm that overflowed (inf) or gave
    # NaN grants the floor only (it granted everything: an infinite allowance)
    bound, naive = np.array([1.0, 10.0, 1.0, 1.0]), np.array([3.0, 0.0, np.inf, np.nan])
    sp = np.array([1.0, 0.5, 1.0, 1.0])
    assert _Tolerance().allowed(bound, naive, sp).tolist() == [14.0, 10.0, 2.0, 2.0]
    assert _Tolerance(mode="bound").allowed(bound, naive, sp).tolist() == [1.0, 10.0, 1.0, 1.0]
    assert _Tolerance(mode="baseline").allowed(bound, naive, sp).tolist() == [14.0, 1.0, 2, 2]
    assert _Tolerance(mode="ulps", max_ulps=3).allowed(bound, naive, sp).tolist() == [3, 1.5, 3, 3]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"baseline_factor": math.inf},
        {"floor_ulps": math.inf},
        {"baseline_factor": math.nan},
        {"mode": "ulps", "max_ulps": math.inf},
    ],
)
def test_a_tolerance_that_cannot_fail_is_refused(kwargs):
    """``baseline_factor=inf`` allowed every error (an entropy 0.25 off passed, as the fuzz
    suite's random profile found): an infinite tolerance makes the assertion vacuous."""
    x = np.zeros(3)
    wrong = reference.entropy(x) + 0.25
    name = next(iter(k for k in kwargs if k != "mode"))
    with pytest.raises(ValueError, match=name):
        testing.assert_entropy_close(wrong, x, **kwargs)


@pytest.mark.parametrize("got", [1.0, -1.0, 0.7, 0.0])
def test_attention_check_allows_a_tie_broken_by_the_dot_products_error(got):
    """Two keys tie at logits near 2**31 in float32, a third lies 8e8 below. The model lets a
    float32 dot product of 16 terms err by 18 u |q||k|, about 1e4 here, so a kernel may split
    the tie any way (SDPA on β-scaled queries took one key: the fuzzer's case); only the far
    key stays out. The bound formed 0 * inf = NaN for that key (its weight underflows to 0,
    its logit's error bound overflows e**r), and the check fell back to a floor of 2 ulps,
    rejecting everything but the exact 0."""
    q = np.array([[3.0, 3.0] + [0.0] * 14], dtype=np.float32) * 2**15
    k = np.zeros((3, 16), dtype=np.float32)
    k[0, 0] = k[1, 1] = 3 * 2**15
    k[2, 0] = 2 * 2**15
    v = np.array([[1.0], [-1.0], [0.5]], dtype=np.float32)
    assert_attention_close(np.array([[got]], dtype=np.float32), (q, k, v), schedule=Constant(1))
    with pytest.raises(KernelMismatch):  # outside every mix of the values
        assert_attention_close(np.array([[5.0]], dtype=np.float32), (q, k, v), schedule=Constant(1))


@pytest.mark.parametrize("far", [-1e300, -1e308, -1.7e308])
@pytest.mark.parametrize("kind", ["softmax", "adaptive_softmax"])
def test_an_item_near_minus_1e308_leaves_the_others_bounds_alone(far, kind):
    # beta |z| of the far item overflowed to inf and its weight was 0: 0 * inf made every
    # item's bound NaN, read as 0, so a correct kernel 1 ulp off anywhere in the row failed
    # (mode="bound": the a-priori bound alone, without the naive algorithm's baseline)
    x = np.array([far, 1.4010897706987802, -0.8895349113655682, -2.1528116802016153, 0.0522])
    exact = getattr(reference, kind)(x)
    check = getattr(testing, f"assert_{kind}_close")
    off = exact.copy()
    off[3] = np.nextafter(off[3], 1.0)
    assert check(off, x, mode="bound").max_ulp == 1.0
    off[1] *= 1.001  # an error of 4.5e12 ulps is still one
    with pytest.raises(testing.KernelMismatch, match="index \\(1,\\)"):
        check(off, x, mode="bound")


def test_an_item_near_minus_1e308_leaves_the_entropy_bound_alone():
    x = np.array([-1e308, 1.4010897706987802, -0.8895349113655682, -2.1528116802016153])
    exact = float(reference.entropy(x))
    assert testing.assert_entropy_close(np.nextafter(exact, 2.0), x, mode="bound").max_ulp == 1
    with pytest.raises(testing.KernelMismatch):
        testing.assert_entropy_close(exact * 1.001, x, mode="bound")


def test_a_one_dimensional_row_at_a_jump_gets_a_verdict() -> None:
    """A 1-d row whose entropy sits at a schedule's jump raised 'Calling nonzero on 0d
    arrays' (its jump flag is 0-d); as a (1, n) batch it passed. Either side is accepted."""
    jump = Polynomial(("3",), threshold="0.5")
    lo, hi = 1.0, 2.0  # the entropy of [t, 0] falls with t: the last float t with H > 0.5
    while math.nextafter(lo, hi) < hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if float(reference.entropy(np.array([mid, 0.0]))) > 0.5 else (lo, mid)
    x = np.array([lo, 0.0])  # entropy 0.5000000000000001, a hair above the threshold
    for side in (Constant(1), Polynomial(("3",), threshold="-1")):
        got = reference.adaptive_softmax(x, schedule=side)
        report = testing.assert_adaptive_softmax_close(got, x, schedule=jump)
        batched = testing.assert_adaptive_softmax_close(got[None], x[None], schedule=jump)
        assert report.passed and batched.passed
    with pytest.raises(AssertionError):
        testing.assert_adaptive_softmax_close(np.array([0.5, 0.5]), x, schedule=jump)


# -- impossible outputs at large logits (the sound windows) ---------------------------------


@pytest.mark.parametrize(
    ("x", "dtype", "strict"),
    [
        ((1e6 + np.array([[0, 1, 2, 3, 3.5]])).astype(np.float32), "float32", True),
        (np.full((1, 4), 1e30), "float64", False),  # ties: 0.25 each
        (np.full((1, 3), 3e16), "float64", True),
    ],
)
def test_a_negative_coefficient_never_passes(x, dtype, strict):
    """The log-error bound was applied as a symmetric window y(e^r - 1): once r >= log 2 the
    negated exact row passed (worst ratio 0.635, strict), and [1e30, -1e30, 7, -5] for four
    ties at 1e30. Below the exact value the window is y(1 - e^-r) < y; above it, 1 - y."""
    exact = reference.adaptive_softmax(x, dtype=dtype)
    with pytest.raises(KernelMismatch, match="outside the error model"):
        assert_adaptive_softmax_close(-exact, x, strict=strict)
    wrong = np.zeros_like(exact)
    wrong[..., 0] = 1.0 + 2.0**-10  # above 1
    with pytest.raises(KernelMismatch):
        assert_adaptive_softmax_close(wrong, x, strict=strict)
    if x.shape[-1] == 4:
        with pytest.raises(KernelMismatch):
            assert_adaptive_softmax_close(np.array([[1e30, -1e30, 7.0, -5.0]]), x)
    assert_adaptive_softmax_close(exact, x, strict=strict)


def test_bfloat16_negated_row_fails_and_the_exact_one_passes():
    torch = pytest.importorskip("torch")
    x = (100 + torch.tensor([[0.0, 1.0, 2.0, 3.0, 3.5]])).to(torch.bfloat16)
    exact = reference.adaptive_softmax(x.float().numpy())
    with pytest.raises(KernelMismatch):
        assert_adaptive_softmax_close(torch.from_numpy(-exact).to(torch.bfloat16), x)
    assert_adaptive_softmax_close(torch.from_numpy(exact).to(torch.bfloat16), x)


@pytest.mark.parametrize("out", [60000.0, -1000.0, 3.0])
def test_an_attention_output_outside_the_values_range_never_passes(out):
    """float16, logits 40000 and 39800: the weights may move by anything under the default
    contract, yet the output is a weighting of v = 1, 2. 60000 passed (ratio 8e-64)."""
    q = np.array([[200.0]], np.float16)
    k = np.array([[200.0], [199.0]], np.float16)
    v = np.array([[1.0], [2.0]], np.float16)
    with pytest.raises(KernelMismatch, match="outside the error model"):
        assert_attention_close(np.array([[out]], np.float16), (q, k, v), scale=1.0,
                               schedule=Constant(1))  # fmt: skip
    for inside in (1.0, 2.0):  # the weights may move anywhere in [0, 1] here
        assert_attention_close(np.array([[inside]], np.float16), (q, k, v), scale=1.0,
                               schedule=Constant(1))  # fmt: skip


@pytest.mark.parametrize("mode", ["auto", "baseline"])
def test_a_naive_overflow_grants_the_floor_not_everything(mode):
    """The naive float32 softmax of [1e39, 0] overflows (NaN): its error was infinite, and so
    was the baseline's allowance; [0.5, 0.5] passed for [1, 0]."""
    x = np.array([[1e39, 0.0]])  # (float64: 1e39 is beyond float32, the kernel's format)
    with pytest.raises(KernelMismatch, match="outside the error model"):
        assert_softmax_close(np.array([[0.5, 0.5]], np.float32), x, mode=mode, dtype="float32")
    assert_softmax_close(np.array([[1.0, 0.0]], np.float32), x, mode=mode, dtype="float32")


def test_a_result_narrower_than_its_input_needs_its_dtype_named():
    """The tolerance comes from the result's format: a float32 softmax rounded to float16,
    or a float64 one to bfloat16, passed at half an ulp of the narrower format whatever
    its error had been. Without ``dtype=`` such a result now fails; naming the format
    checks it there, and a wider result, or integer logits, need nothing."""
    x = np.random.default_rng(5).normal(0.0, 2.0, (3, 9)).astype(np.float32)
    p16 = reference.softmax(x, dtype=np.float16)
    with pytest.raises(KernelMismatch, match="returned float16 for float32 input, a narrower"):
        assert_softmax_close(p16, x)
    assert_softmax_close(p16, x, dtype="float16")
    assert_softmax_close(reference.softmax(x.astype(np.float16)).astype(np.float64),
                         x.astype(np.float16), dtype="float16")  # fmt: skip
    assert_softmax_close(reference.softmax(np.arange(6.0)).astype(np.float32), np.arange(6))
    q = x[:, None, :4]
    with pytest.raises(KernelMismatch, match="returned float16 for float32 input"):
        assert_attention_close(np.zeros((3, 1, 4), np.float16), (q, q, q))


def test_integers_float64_cannot_hold_are_refused():
    """[2**53 + 1, 2**53] became [2**53, 2**53]: "exact 0.5" for 0.731 and 0.269."""
    x = np.array([[2**53 + 1, 2**53]])
    with pytest.raises(ValueError, match="9007199254740993, which float64 cannot hold exactly"):
        assert_softmax_close(np.array([[0.5, 0.5]]), x)
    for fine in (np.array([[2**53, 2**60]]), np.array([[-(2**63), 0]]), np.array([[2**63]], "u8")):
        assert_softmax_close(reference.softmax(fine.astype(np.float64)), fine)
    with pytest.raises(ValueError, match="18446744073709551615"):
        assert_softmax_close(np.zeros((1, 1)), np.array([[2**64 - 1]], dtype=np.uint64))


def test_an_entropy_of_exactly_zero_is_judged_in_absolute_terms():
    """At H = 0 the ulp is the smallest subnormal: 1e-15 and its allowance (4e-15) both
    overflowed to inf ulps, and inf / inf failed a result the neighbouring row passes."""
    x = np.array([0.0, -800.0])
    for got in (5e-16, 1e-15, -1e-15):
        assert assert_entropy_close(np.array(got), x).worst_ratio < 1
    with pytest.raises(KernelMismatch):
        assert_entropy_close(np.array(1e-13), x)


@pytest.mark.parametrize(
    ("kwargs", "error", "says"),
    [
        ({"max_ulps": 2}, ValueError, "max_ulps applies to mode='ulps' only"),
        ({"mode": "bound", "max_ulps": 2}, ValueError, "max_ulps applies to mode='ulps' only"),
        ({"mode": "ulps", "max_ulps": "3"}, TypeError, "max_ulps must be a real number"),
        ({"floor_ulps": "2"}, TypeError, "floor_ulps must be a real number"),
        ({"repro": 3}, TypeError, "repro must be a str of Python source, got int"),
        ({"source": 3}, TypeError, "source must be a str of Python source, got int"),
    ],
)
def test_arguments_that_would_be_ignored_are_refused(kwargs, error, says):
    """max_ulps=2 was ignored outside mode='ulps' (a 10-ulp error passed); repro=3 raised
    AttributeError only when a check failed."""
    x = np.array([[0.0, 1.0]])
    with pytest.raises(error, match=says):
        assert_softmax_close(reference.softmax(x), x, **kwargs)


def test_attention_check_takes_grouped_heads():
    """assert_attention_close refused grouped k and v ("leading dimensions do not broadcast"):
    a kernel with enable_gqa could not be checked. The repro passes enable_gqa=True on."""
    rng = np.random.default_rng(4)
    q, k, v = (
        rng.normal(size=s).astype(np.float32) for s in ((1, 4, 3, 8), (1, 2, 5, 8), (1, 2, 5, 3))
    )
    right = reference.adaptive_attention(q, np.repeat(k, 2, 1), np.repeat(v, 2, 1))
    assert assert_attention_close(right.astype(np.float32), (q, k, v), enable_gqa=True).passed
    modulo = reference.adaptive_attention(q, k[:, [0, 1, 0, 1]], v[:, [0, 1, 0, 1]])
    with pytest.raises(KernelMismatch) as exc:
        assert_attention_close(modulo.astype(np.float32), (q, k, v), enable_gqa=True)
    assert "enable_gqa=True" in str(exc.value)
    with pytest.raises(ValueError, match="not to given logits"):
        assert_attention_close(right[0, :, :, :2], (q[0, :, :, :5], v[0]), enable_gqa=True)


def test_a_masked_nan_value_is_not_blamed_for_a_failure():
    """The failure text named 'value column 0 holds NaN' when the NaN sat at a masked key."""
    rng = np.random.default_rng(6)
    q, k, v = rng.normal(size=(3, 4)), rng.normal(size=(5, 4)), rng.normal(size=(5, 2))
    v[0, 0] = np.nan
    mask = np.ones((3, 5), dtype=bool)
    mask[:, 0] = False
    out = reference.adaptive_attention(q, k, v, mask=mask, schedule=Constant(1))
    assert np.all(np.isfinite(out))
    out[1, 0] *= 1.01
    with pytest.raises(KernelMismatch) as exc:
        assert_attention_close(out, (q, k, v), mask=mask, schedule=Constant(1))
    assert "holds NaN" not in str(exc.value) and "keys attended" in str(exc.value)
    v[1, 0] = np.inf  # an attended key's infinite value is named
    with pytest.raises(KernelMismatch, match="value column 0 holds NaN or an infinity"):
        assert_attention_close(np.zeros((3, 2)), (q, k, v), mask=mask, schedule=Constant(1))


def test_an_integer_mask_is_refused_as_every_backend_refuses_it():
    """An integer mask was read as additive (0/1 added to the logits): a kernel reading 1 as
    'attend' failed, and one adding the mask passed. The backends refuse it as ambiguous."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    q, k, v = rng.normal(size=(3, 4)), rng.normal(size=(5, 4)), rng.normal(size=(5, 2))
    keep = np.array([[1, 0, 1, 1, 0], [1, 1, 1, 1, 1], [0, 0, 1, 0, 0]])
    out = reference.adaptive_attention(q, k, v, mask=keep.astype(bool))
    for mask in (keep, torch.from_numpy(keep).to(torch.uint8)):
        with pytest.raises(TypeError, match="an integer mask is ambiguous"):
            assert_attention_close(out, (q, k, v), mask=mask)
    with pytest.raises(TypeError, match="mask"):
        reference.adaptive_attention(q, k, v, mask=keep)
    assert assert_attention_close(out, (q, k, v), mask=keep.astype(bool)).passed


def test_the_flushing_allowance_is_toward_zero_and_float32s_for_float16():
    """Every element was granted float16's smallest normal (6.1e-5) either way: an all-zero
    float16 row of 40,000 items passed (strict too), and so did 6e-5 for coefficients of
    6e-6 to 1e-7. A flush lowers a coefficient: the allowance is granted toward zero, and
    for float16 it is float32's (no float16 kernel flushes). A float32 kernel that flushes
    its subnormal results still passes."""
    x = np.zeros((1, 40000), np.float16)
    x[0, ::2] = 0.5
    for strict in (False, True):
        with pytest.raises(AssertionError, match="outside the error model"):
            testing.assert_softmax_close(np.zeros_like(x), x, strict=strict)
    right = reference.softmax(x, dtype=np.float16)
    assert testing.assert_softmax_close(right, x).passed
    small = np.array([[0.0, -12.0, -14.0, -16.0]], np.float16)
    with pytest.raises(AssertionError, match="outside the error model"):
        testing.assert_softmax_close(np.array([[1.0, 6e-5, 6e-5, 6e-5]], np.float16), small)
    x32 = np.array([[0.0, -90.0, -95.0, -100.0]], np.float32)
    exact = reference.softmax(x32, dtype=np.float64)
    flushed = np.where(exact < np.finfo(np.float32).tiny, 0.0, exact).astype(np.float32)
    assert testing.assert_softmax_close(flushed, x32).passed
    above = np.where(exact < np.finfo(np.float32).tiny, 1e-38, exact).astype(np.float32)
    with pytest.raises(AssertionError, match="outside the error model"):
        testing.assert_softmax_close(above, x32)  # (away from zero: no flush does that)


def test_strict_demands_the_shifted_form_of_the_adaptive_softmax_in_every_dtype():
    """Logits near 1e10 in float32: scaling x before the shift may move each scaled logit
    by beta (|x| + |m|) u, about 2000, so the default contract passes any coefficients (a
    one-hot row for a uniform one). strict, which changed nothing for float32 and float64,
    drops that allowance: the shifted form loses nothing there."""
    x = np.full((1, 8), 1e10, np.float32)
    one_hot = np.zeros((1, 8), np.float32)
    one_hot[0, 3] = 1.0
    assert testing.assert_adaptive_softmax_close(one_hot, x).passed  # (backward stable)
    with pytest.raises(AssertionError, match="outside the error model"):
        testing.assert_adaptive_softmax_close(one_hot, x, strict=True)
    right = reference.adaptive_softmax(x, dtype=np.float32)
    assert testing.assert_adaptive_softmax_close(right, x, strict=True).passed


def test_given_logits_with_minus_inf_and_is_causal_are_checked(capsys):
    """Given logits with a -inf entry and is_causal=True raised "pass either mask or
    is_causal=True, not both": the -inf entries make a mask the caller never passed. The
    causal triangle now joins that mask; a non-causal result fails, and its repro calls
    the kernel with is_causal=True and the reference with both masks in one."""
    rng = np.random.default_rng(0)
    x = rng.normal(0.0, 1.0, (4, 4))
    x[3, 2] = -np.inf
    v = rng.normal(0.0, 1.0, (4, 2))
    keep = np.tril(np.ones((4, 4), dtype=bool)) & (x > -np.inf)
    q = np.where(keep, x, 0.0)
    right = reference.adaptive_attention(q, np.eye(4), v, mask=keep, scale=1.0)
    assert testing.assert_attention_close(right, (x, v), is_causal=True).passed
    wrong = reference.adaptive_attention(q, np.eye(4), v, mask=x > -np.inf, scale=1.0)
    with pytest.raises(AssertionError) as info:
        testing.assert_attention_close(wrong, (x, v), is_causal=True)
    message = str(info.value)
    assert "kernel(x, v, is_causal=True)" in message
    assert "keep = ~np.isneginf(x) & np.tril(" in message
    snippet = message[message.index("repro:\n") + 7 :]
    # with the right result in the kernel's place, the snippet's two lines print one number
    exec(snippet, {"np": np, "kernel": lambda x, v, is_causal: right, "reference": reference})
    got, exact = capsys.readouterr().out.split()
    assert float(got) == float(exact)


def test_queries_at_the_lowest_float_must_attend_their_keys():
    """Every key of a query at the lowest finite float (a Hugging Face mask value): the
    weights are about uniform. The baseline, the paper's listing, scales first and its β x
    overflows to -inf; it counted that row as masked (zeros), which allowed a kernel that
    reads the lowest float as a mask to answer 0 for the paper's schedule, under strict too.
    The listing's answer there is NaN, no allowance."""
    from softmaxtheory._check import error_model as model
    from softmaxtheory._formats import FORMATS

    low = np.finfo(np.float64).min
    rows = np.array([[low, low, low], [-np.inf, -np.inf, -np.inf]])
    naive = model.naive_softmax(rows, FORMATS["float64"], beta=np.array([2.0, 2.0]))
    assert np.isnan(naive[0]).all() and (naive[1] == 0).all()  # overflowed, masked
    g = np.random.default_rng(3)
    q, k = g.normal(size=(1, 2, 4)), g.normal(size=(1, 6, 4))
    v = 100.0 + 0.1 * g.normal(size=(1, 6, 3))
    mask = np.zeros((2, 6))
    mask[0] = low
    dropped = bk.attention(q, k, v, mask=np.where(mask == low, -np.inf, mask))
    assert (dropped[0, 0] == 0).all()
    for strict in (False, True):
        with pytest.raises(testing.KernelMismatch, match="attention output is outside"):
            testing.assert_attention_close(dropped, (q, k, v), mask=mask, strict=strict)
    testing.assert_attention_close(bk.attention(q, k, v, mask=mask), (q, k, v), mask=mask)
