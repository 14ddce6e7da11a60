"""``softmaxtheory bounds``: every printed decimal is correctly rounded; errors are clear."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from decimal import Decimal

import mpmath
import numpy as np
import pytest

from softmaxtheory import bounds
from softmaxtheory._certify.adaptive import beta_sup
from softmaxtheory.cli import main
from softmaxtheory.spec import PaperPolynomial

MAX = re.compile(r"^\s+(\d+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)$")


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def exact_values(n: int, spread: float, beta: float) -> dict[str, mpmath.mpf]:
    adaptive = beta_sup(n, spread, PaperPolynomial())
    with mpmath.workprec(3000):
        s, b = mpmath.mpf(spread), mpmath.mpf(beta)
        closed = 1 / (1 + (n - 1) * mpmath.exp(-mpmath.mpf(adaptive) * s))
        # where beta can exceed 1 the column is the bracket's upper end (a float), if lower
        top = bounds.adaptive_max_coefficient_bracket(n, spread).upper if adaptive > 1 else 1.0
        # the least entropy: two-level rows of k top logits, k beside the real minimiser
        # (tests/test_bounds.py checks every k of short rows)
        t, e = b * s, mpmath.exp(b * s)
        w = 1 / e
        k_star = int(n * w * (t - 1 + w) / (1 - w) ** 2) if t else 0
        ks = range(max(0, k_star - 3), min(n, k_star + 4) + 1)
        return {
            "max": 1 / (1 + (n - 1) * mpmath.exp(-b * s)),
            "adaptive": min(closed, mpmath.mpf(top)),
            "min": 1 / (1 + (n - 1) * mpmath.exp(b * s)),
            "least": min(mpmath.log(k * e + n - k) - k * t * e / (k * e + n - k) for k in ks),
            "entropy": mpmath.log1p((n - 1) * mpmath.exp(-b * s)),
        }


def assert_correctly_rounded(text: str, exact: mpmath.mpf, digits: int) -> None:
    """`text` has `digits` significant digits and lies within half a unit of its last one."""
    d = Decimal(text)
    sig = d.as_tuple()
    assert len(sig.digits) == digits, text
    half_unit = Decimal(5).scaleb(sig.exponent - 1)
    with mpmath.workprec(3000):
        err = abs(mpmath.mpf(str(d)) - exact)
        assert err <= mpmath.mpf(str(half_unit)), (text, mpmath.nstr(exact, 30))


def assert_rounded_up(text: str, bound: mpmath.mpf, digits: int) -> None:
    """`text` has `digits` significant digits, is at least `bound`, and one unit less is not
    (up to the float the bound was rounded up to first)."""
    d = Decimal(text)
    sig = d.as_tuple()
    assert len(sig.digits) == digits, text
    unit = Decimal(1).scaleb(sig.exponent)
    with mpmath.workprec(3000):
        assert mpmath.mpf(str(d)) >= bound, (text, mpmath.nstr(bound, 30))
        assert mpmath.mpf(str(d - unit)) < bound * (1 + mpmath.mpf(2) ** -50), text


@pytest.mark.parametrize(
    ("spread", "beta", "digits"), [(5.69, 1.0, 6), (2.0, 0.5, 4), (30.0, 1.0, 9)]
)
def test_table_values_are_correctly_rounded(capsys, spread, beta, digits):
    # the table, not the adaptive dispersion bracket (--budget 0: its closed form)
    code, out, _ = run(
        capsys, "bounds", "--spread", str(spread), "--beta", str(beta), "--digits", str(digits),
        "--budget", "0",
    )  # fmt: skip
    assert code == 0
    rows = [MAX.match(line) for line in out.splitlines()]
    rows = [m for m in rows if m]
    assert [int(m.group(1)) for m in rows] == [16 * 2**k for k in range(11)]
    for m in rows:
        exact = exact_values(int(m.group(1)), spread, beta)
        keys = ("max", "adaptive", "min", "least", "entropy")
        for text, key in zip(m.groups()[1:], keys, strict=True):
            if key == "adaptive":  # an upper bound: rounded up, so that it stays one
                assert_rounded_up(text, exact[key], digits)
            else:
                assert_correctly_rounded(text, exact[key], digits)
    # sizes with more digits than shown are rounded up: "from n on" stays true
    up = {"digits": digits, "rounding": "up"}
    assert f"once n >= {bounds.dispersion_size(0.5, spread, beta, **up)} " in out
    assert f"once n >= {bounds.adaptive_switch_off_size(spread, **up)} " in out


def test_gemma_example(capsys):
    code, out, _ = run(capsys, "bounds", "--spread", "5.69", "--eps", "0.5")
    assert code == 0
    assert "every coefficient is < 0.5 once n >= 297" in out
    assert "beta <= 2.4213877066315246" in out
    assert "(0.8485819960098693, 5.944520827905143)" in out
    assert "beta = 1 for every row once n >= 7419 " in out
    # the default budget of branch and bound proves the upper end 1283; the closed form
    # alone (--budget 0) gives 5828
    assert "from some n in [1253, 1283]" in out
    assert "9 at 4.40595" in out
    code, out, _ = run(capsys, "bounds", "--spread", "5.69", "--budget", "0", "--sizes", "16")
    assert code == 0
    assert "from some n in [1253, 5828]" in out


def test_budget(capsys):
    """--budget is the bracket's: its upper end is the library's at that budget, in the JSON too."""
    code, out, _ = run(capsys, "bounds", "--spread", "3", "--budget", "4000", "--json")
    assert code == 0
    doc = json.loads(out)["adaptive_dispersion_bracket"]
    b = bounds.adaptive_dispersion_bracket(0.5, 3.0, budget=4000)
    assert (doc["lower"], doc["upper"], doc["budget"]) == (b.lower, b.upper, 4000)
    assert b.upper < bounds.adaptive_dispersion_bracket(0.5, 3.0).upper
    with pytest.raises(SystemExit) as exc:
        main(["bounds", "--spread", "3", "--budget", "-1"])
    assert exc.value.code == 2
    assert "--budget must be >= 0, got -1" in capsys.readouterr().err


def test_huge_spreads_print_scientific_sizes_at_once(capsys):
    """Issue 14 item 8: spread 10000 printed a traceback after minutes; now scientific text."""
    code, out, _ = run(capsys, "bounds", "--spread", "10000", "--sizes", "16")
    assert code == 0
    assert f"once n >= {bounds.dispersion_size(0.5, 1e4, digits=6, rounding='up')} " in out
    assert "once n >= 8.80682e+4342 " in out
    assert f"once n >= {bounds.adaptive_switch_off_size(1e4, digits=6, rounding='up')} " in out
    code, out, _ = run(capsys, "bounds", "--spread", "1400000", "--sizes", "16", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["dispersion_size"] == bounds.dispersion_size(0.5, 1.4e6, digits=6, rounding="up")
    assert doc["rows"][0]["max_coefficient"] == 1.0


def test_sizes_print_rounded_so_that_their_sentence_holds(capsys):
    """The size 1,088,165 prints as 1.08817e+6 (to nearest 1.08816e+6, false of 1,088,160)."""
    argv = ("bounds", "--spread", "13.90000180000001", "--sizes", "16", "--budget", "0")
    code, out, _ = run(capsys, *argv)
    assert code == 0
    assert bounds.dispersion_size(0.5, 13.90000180000001) == 1088165
    assert "every coefficient is < 0.5 once n >= 1.08817e+6 " in out
    b = bounds.adaptive_dispersion_bracket(0.5, 13.90000180000001)
    assert (b.lower, b.upper) == (1289467, 10282473)
    assert "from some n in [1.28946e+6, 1.02825e+7]" in out  # lower end down, upper up
    assert bounds.adaptive_switch_off_size(13.90000180000001) == 10991614
    assert "beta = 1 for every row once n >= 1.09917e+7 " in out


def test_exact_digits(capsys):
    """--exact-digits prints every digit of the sizes (and says so on stderr while computing)."""
    code, out, err = run(capsys, "bounds", "--spread", "800", "--sizes", "16", "--exact-digits")
    assert code == 0
    assert f"once n >= {bounds.dispersion_size(0.5, 800.0)} " in out
    assert "exactly" in err


def test_json(capsys):
    code, out, _ = run(
        capsys, "bounds", "--spread", "800", "--json", "--sizes", "16,1000000", "--exact-digits"
    )
    assert code == 0
    doc = json.loads(out)
    assert doc["dispersion_size"] == bounds.dispersion_size(0.5, 800.0)  # a 348-digit integer
    assert doc["adaptive_switch_off_size"] == bounds.adaptive_switch_off_size(800.0)
    code, out, _ = run(capsys, "bounds", "--spread", "800", "--json", "--sizes", "16")
    # 2.726375...e+347 rounded up ("from n on" must hold of the printed n)
    assert json.loads(out)["dispersion_size"] == "2.72638e+347"
    assert bounds.dispersion_size(0.5, 800.0, digits=6) == "2.72637e+347"
    assert [r["n"] for r in doc["rows"]] == [16, 1000000]
    row = doc["rows"][1]
    assert row["max_coefficient"] == 1.0
    assert row["min_coefficient"] == bounds.min_coefficient(10**6, 800.0)
    assert row["entropy_lower_bound"] == bounds.entropy_lower_bound(10**6, 800.0)
    assert row["least_entropy"] == bounds.least_entropy(10**6, 800.0) == 0.0


def test_a_npy_of_empty_rows_is_refused(tmp_path, capsys):
    np.save(tmp_path / "empty.npy", np.zeros((3, 0)))
    with pytest.raises(SystemExit) as info:
        main(["bounds", "--npy", str(tmp_path / "empty.npy")])
    assert info.value.code == 2
    assert "rows of 0 items (shape (3, 0)): no spread to measure" in capsys.readouterr().err


def test_measures_a_npy_file(tmp_path, capsys):
    x = np.array([[0.0, 3.0, -np.inf, 1.0], [0.0, 1.0, 2.0, 0.5], [0.0, np.nan, 1.0, 1.0]])
    path = tmp_path / "logits.npy"
    np.save(path, x)
    code, out, _ = run(capsys, "bounds", "--npy", str(path), "--json", "--budget", "0")
    assert code == 0
    doc = json.loads(out)
    assert doc["spread"] == 3.0
    assert doc["measured"]["rows_with_nan_or_inf"] == 1
    assert doc["measured"]["spread_mean"] == 2.5
    argv = ("bounds", "--npy", str(path), "--statistic", "mean", "--budget", "0", "--sizes", "16")
    code, out, _ = run(capsys, *argv)
    assert code == 0
    assert out.startswith("measured 3 rows of 4 items in ")
    assert "; 1 row with NaN or +inf skipped\n" in out  # was "1 rows"
    assert "using the mean: spread 2.5" in out
    assert f"once n >= {bounds.dispersion_size(0.5, 2.5)} " in out


def test_a_measured_spread_too_large_names_the_file(tmp_path, capsys):
    """It said "--beta times the spread = 1.0 * 9.22e+18" to a user who gave neither."""
    path = tmp_path / "logits.npy"
    np.save(path, np.array([[0, 2**63 - 1], [0, 1]], dtype=np.int64))
    with pytest.raises(SystemExit) as info:
        main(["bounds", "--npy", str(path)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"beta times the spread measured in {path} = 1.0 * 9.223372036854776e+18" in err
    assert "--beta" not in err.splitlines()[-1]


@pytest.mark.parametrize(("sizes", "digits", "shown"), [
    ("5120", 6, "0.000195312"),  # 1/5120 = 0.0001953125: a tie, to even
    ("80", 2, "0.012"),  # 0.0125
    ("400", 4, "0.002500"),  # exact at that many digits
    ("1", 3, "1.00"),
])  # fmt: skip
def test_spread_zero_coefficients_on_a_decimal_tie(capsys, sizes, digits, shown):
    """At spread 0 every coefficient is 1/n exactly; where that lies on a decimal tie the
    enclosures never decided it and the command ended in a CertificationError traceback."""
    argv = ("bounds", "--spread", "0", "--sizes", sizes, "--digits", str(digits))
    code, out, _ = run(capsys, *argv)
    assert code == 0
    row = next(line.split() for line in out.splitlines() if line.split()[:1] == [sizes])
    assert row[1] == row[3] == shown  # max coef, min coef


def test_spread_zero_bracket_ends_round_in_their_own_directions(capsys):
    """The lower end was the size rounded up (3.34e+6 for an exact size of 3333334); the
    text's "once n >=" takes the upper end."""
    argv = ("bounds", "--spread", "0", "--eps", "0.0000003", "--digits", "3", "--sizes", "2")
    code, out, _ = run(capsys, *argv, "--json")
    assert code == 0
    doc = json.loads(out)
    assert bounds.dispersion_size(3e-7, 0.0) == 3333334
    assert doc["adaptive_dispersion_bracket"]["lower"] == "3.33e+6"
    assert doc["adaptive_dispersion_bracket"]["upper"] == doc["dispersion_size"] == "3.34e+6"
    code, out, _ = run(capsys, *argv)
    assert "every adaptive coefficient is < 3e-07 once n >= 3.34e+6" in out
    # an exact size shown in full is both ends
    code, out, _ = run(capsys, "bounds", "--spread", "0", "--eps", "0.3", "--json")
    assert json.loads(out)["adaptive_dispersion_bracket"] | {} == {
        "lower": 4, "upper": 4, "witness": None, "budget": 0
    }  # fmt: skip


def test_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = tmp_path / "bounds.png"
    code, _, err = run(capsys, "bounds", "--spread", "5.69", "--budget", "0", "--plot", str(path))
    assert code == 0 and f"wrote {path}" in err
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 10_000


def test_plot_labels_say_which_curves_are_at_beta(capsys):
    """At --beta 2 the T1 curves are at β = 2 but the adaptive ones apply the schedule to
    the logits as given (β = 1), as the table's note says: the plot said only "β = 2.0"
    in its title, so the adaptive curve read as a sharper limit than plain softmax's."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from softmaxtheory.cli.bounds import _figure

    labels = {}
    for beta in ("1", "2"):
        argv = ("bounds", "--spread", "3", "--beta", beta, "--budget", "0", "--json")
        code, out, _ = run(capsys, *argv, "--sizes", "16,4096")
        assert code == 0
        fig = _figure(json.loads(out))
        ax = fig.axes[0]
        labels[beta] = [t.get_text() for t in ax.get_legend().get_texts()] + [ax.get_title()]
        plt.close(fig)
    assert not any("β" in t for t in labels["1"])
    two = labels["2"]
    assert "max coefficient (T1, β = 2.0)" in two and "min coefficient (T1, β = 2.0)" in two
    adaptive = [t for t in two if "adaptive temperature" in t]
    assert len(adaptive) == 2 and all("logits as given (β = 1)" in t for t in adaptive)
    assert two[-1].endswith("spread 3.0, β = 2.0")


def test_plot_without_matplotlib(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    code, _, err = run(capsys, "bounds", "--spread", "1", "--plot", str(tmp_path / "x.png"))
    assert code == 1
    assert "pip install 'softmaxtheory[plot]'" in err
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bounds"], "one of the arguments --spread --npy is required"),
        (["bounds", "--spread", "1", "--npy", "x.npy"], "not allowed with"),
        (["bounds", "--spread", "-1"], "--spread must be finite and >= 0"),
        (["bounds", "--spread", "nan"], "--spread must be finite and >= 0"),
        (["bounds", "--spread", "1", "--eps", "1.5"], "--eps must lie strictly between 0 and 1"),
        (["bounds", "--spread", "1", "--beta", "0"], "--beta must be finite and > 0"),
        (["bounds", "--spread", "1", "--sizes", "0,16"], "sizes must be integers >= 1"),
        (["bounds", "--spread", "1", "--digits", "30"], "--digits must be between 1 and 17"),
        (["bounds", "--spread", "1e7"], "too large"),
        (["bounds", "--npy", "/nonexistent/x.npy"], "cannot read"),
        (["bounds", "--spread", "1", "--statistic", "mean"], "--statistic applies to the rows"),
        # argparse read these as options: "argument --beta: expected one argument"
        (["bounds", "--spread", "1", "--beta", "-1e308"], "--beta must be finite and > 0"),
        (["bounds", "--spread", "-inf"], "--spread must be finite and >= 0, got -inf"),
        (["bounds", "--spread", "1", "--eps", "-nan"], "--eps must lie strictly between 0 and 1"),
    ],
)
def test_usage_errors(capsys, argv, message):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_console_entry_point():
    argv = ["bounds", "--spread", "5.69", "--sizes", "297", "--budget", "0"]
    out = subprocess.run(
        [sys.executable, "-m", "softmaxtheory", *argv], capture_output=True, text=True, check=True
    ).stdout
    assert "once n >= 297" in out


def test_exact_decimal_ties_are_decided(capsys):
    # spread 0: every coefficient is exactly 1/n, and 1/4 = 0.25, 1/16 = 0.0625 are decimal
    # ties at 1 and 3 digits; they round to even
    code, out, _ = run(capsys, "bounds", "--spread", "0", "--sizes", "4,16", "--digits", "1")
    assert code == 0
    assert [line.split()[1] for line in out.splitlines() if MAX.match(line)] == ["0.2", "0.06"]


def test_decimals_ignore_the_callers_decimal_context(capsys):
    """The certified decimals were scaled with Decimal.scaleb in the caller's context: with
    ``decimal.getcontext().prec = 3`` a 9-digit table showed 3 digits, truncated under
    ROUND_DOWN. The table must not depend on the caller's context."""
    import decimal

    argv = ("bounds", "--spread", "5.69", "--digits", "9", "--sizes", "16,1000", "--budget", "0")
    with decimal.localcontext() as ctx:  # first, so that no cached text hides it
        ctx.prec, ctx.rounding = 3, decimal.ROUND_DOWN
        ctx.traps[decimal.Inexact] = True
        code, got, _ = run(capsys, *argv)
    assert code == 0
    from softmaxtheory._certify.enclosures import decimal_up

    # the branch and bound's upper end, rounded up to 9 digits
    adaptive = decimal_up(bounds.adaptive_max_coefficient_bracket(1000, 5.69).upper, 9)
    row = (
        f"    1000     0.228508053           {adaptive}  3.38296450e-06      3.94055699    "
        "1.47618382"
    )
    assert row in got.splitlines()
    code, want, _ = run(capsys, *argv)
    assert code == 0 and got == want


def test_the_adaptive_column_is_an_upper_bound_rounded_up(capsys):
    """The column was the bracket's upper end (or T1 at beta's bound) rounded to nearest:
    'at most 0.0673880' at 4,096 items, below the bound 0.06738801852305... it prints."""
    from softmaxtheory._certify.enclosures import decimal_up

    assert decimal_up(0.99949, 3) == "1.00" and decimal_up(1.0, 3) == "1.00"
    assert decimal_up(0.0673880185230548, 6) == "0.0673881"
    assert decimal_up(5e-324, 3) == "4.95e-324"
    argv = ("bounds", "--spread", "5.69", "--sizes", "4096", "--budget", "0")
    code, out, _ = run(capsys, *argv)
    assert code == 0 and "0.0673880             0.0673881" in out
    code, out, _ = run(capsys, *argv, "--json")
    b = bounds.adaptive_max_coefficient_bracket(4096, 5.69)
    assert b.lower <= json.loads(out)["rows"][0]["adaptive_max_coefficient"] == b.upper


def test_exact_digits_print_the_witness_in_full(capsys):
    """--exact-digits printed the witness's counts in scientific notation (2.72637e+347, as
    large as the lower end it is one item shorter than); --digits did not reach them."""
    code, out, _ = run(
        capsys, "bounds", "--spread", "800", "--budget", "0", "--sizes", "16", "--exact-digits"
    )
    b = bounds.adaptive_dispersion_bracket(0.5, 800.0)
    assert code == 0 and f"at {800.0!r}, {b.witness.counts[-1]} at 0.0)" in out
    argv = ("bounds", "--spread", "5.69", "--digits", "3", "--sizes", "16", "--budget", "0")
    code, out, _ = run(capsys, *argv)
    assert "1 at 5.69, 9 at 4.405952962239583, the rest at 0.0; --exact-digits prints the" in out
    assert "adaptive, at most" in out


def test_a_long_witness_is_never_a_rounded_row(capsys):
    """The count 5184705528587072464087 was printed to nearest, 5.18471e+21: read as printed,
    a row longer than the lower end above it, whose top coefficient is 0.4999998 < 0.5."""
    code, out, _ = run(capsys, "bounds", "--spread", "50", "--budget", "0", "--sizes", "16")
    assert code == 0
    assert "reaches it: 1 at 50.0, the rest at 0.0; --exact-digits prints the counts)" in out
    assert "e+21 at" not in out
    b = bounds.adaptive_dispersion_bracket(0.5, 50.0)
    assert b.witness.counts == (1, b.lower - 2)


def test_spread_zero_states_the_adaptive_dispersion_size(capsys):
    # every row is uniform: the line was left out, with no word why
    code, out, _ = run(capsys, "bounds", "--spread", "0", "--sizes", "16")
    assert code == 0
    assert "every adaptive coefficient is < 0.5 once n >= 3   (adaptive dispersion size" in out


def test_beyond_the_branch_and_bound_the_adaptive_size_has_closed_forms(capsys):
    # at spread 6e5 and --beta 0.5 the JSON gave T2's size at beta 0.5 (2.2e130288) as the
    # adaptive size, below the switch-off size; the schedule's beta is >= 1 on the given logits
    code, out, _ = run(capsys, "bounds", "--spread", "6e5", "--beta", "0.5", "--sizes", "16",
                       "--json")  # fmt: skip
    assert code == 0
    doc = json.loads(out)
    at_one = Decimal(bounds.dispersion_size(0.5, 6e5, digits=6, rounding="up"))
    assert doc["dispersion_size"] == bounds.dispersion_size(0.5, 6e5, 0.5, digits=6, rounding="up")
    assert Decimal(doc["adaptive_dispersion_size"]) >= at_one
    assert Decimal(doc["adaptive_dispersion_size"]) >= Decimal(doc["adaptive_switch_off_size"])
    low = doc["adaptive_dispersion_bracket"]["lower"]
    assert low == bounds.dispersion_size(0.5, 6e5, digits=6, rounding="down") == "4.88812e+260576"
    code, out, _ = run(capsys, "bounds", "--spread", "6e5", "--sizes", "16")
    assert "from some n in [4.88812e+260576, 4.88813e+260576]   (adaptive dispersion size, " in out


def test_json_writes_sizes_beyond_the_int_to_str_limit_as_digits():
    # json.dump raised in the middle of the document for a bracket end of 4,341 digits
    from softmaxtheory.cli.bounds import _json_ready

    big = 7 * 10**4340 + 1
    doc = _json_ready({"a": big, "b": {"lower": big, "upper": 5}, "c": [big, True]})
    text = json.dumps(doc)
    digits = json.loads(text)["b"]["lower"]
    assert digits == doc["a"] == doc["c"][0] and len(digits) == 4341
    assert digits.startswith("70000") and digits.endswith("00001")
    assert doc["b"]["upper"] == 5 and doc["c"][1] is True


@pytest.mark.parametrize(
    ("argv", "flag", "used", "size"),
    [
        # log 20 = 2.99573227355399099...: the decimal typed lies above it, its nearest
        # float below it; at the nearest float 21 items sufficed, for the decimal 22 are needed
        (["--spread", "2.995732273553991"], "spread", 2.9957322735539913, 22),
        # eps 0.1 lies below float(0.1): the size is the one for the float below it
        (["--spread", "5.69", "--eps", "0.1"], "eps", 0.09999999999999999, None),
    ],
)
def test_a_decimal_is_rounded_to_the_float_that_keeps_every_limit_true(
    capsys, argv, flag, used, size
):
    """The arguments were read as their nearest floats, and a size printed for the float of
    --spread 2.995732273553991 (21) is one short for the decimal typed: rows of 21 items of
    that spread have a coefficient of 0.50000000000000000164 (mpmath). Spread and beta are
    now rounded up and eps down when the nearest float lies on the other side, with a note
    on stderr; a decimal whose nearest float is on the safe side is read as before."""
    code = main(["bounds", *argv, "--sizes", "21", "--budget", "0", "--json"])
    out, err = capsys.readouterr()
    assert code == 0
    doc = json.loads(out)
    assert doc[flag] == used
    assert f"--{flag} {argv[argv.index('--' + flag) + 1]}: its nearest float64" in err
    if size is not None:
        assert doc["dispersion_size"] == size
        with mpmath.workdps(60):
            delta = mpmath.mpf("2.995732273553991")  # the decimal, exactly enough
            assert 1 / (1 + 20 * mpmath.exp(-delta)) > mpmath.mpf("0.5")  # 21 items reach it
    main(["bounds", "--spread", "5.69", "--beta", "2", "--sizes", "21", "--budget", "0"])
    assert "note" not in capsys.readouterr().err  # (exact floats, or on the safe side)


def test_the_least_entropy_footnote_says_which_entropy_it_is(capsys):
    """The column is the least entropy of the softmax at --beta; the footnote called it
    "the one beta is read from", which is the entropy at beta = 1 (at --beta 1e-300 and
    n = 2: 0.6931 shown, the schedule reads about 0.022)."""
    _, out, _ = run(capsys, "bounds", "--spread", "5.69", "--sizes", "2", "--budget", "0")
    assert "the one beta is read from" in out
    _, out, _ = run(capsys, "bounds", "--spread", "5.69", "--beta", "2", "--sizes", "2",
                    "--budget", "0")  # fmt: skip
    assert "the one beta is read from" not in out
    assert "of the softmax at this beta" in out
