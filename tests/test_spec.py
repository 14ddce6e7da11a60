"""The specification: constants, schedules, validation and row classification."""

from __future__ import annotations

import re
import warnings
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from softmaxtheory import reference
from softmaxtheory.spec import (
    ENTROPY_THRESHOLD,
    PAPER_COEFFICIENTS,
    PAPER_ENTROPY_EPS,
    Constant,
    LogLength,
    PaperPolynomial,
    Polynomial,
    RowKind,
    as_logits,
    check_entropy_eps,
    classify_rows,
    exact_value,
    resolve_schedule,
)


def test_fixed_constants():
    assert PAPER_COEFFICIENTS == ("-0.037", "0.481", "-2.3", "4.917", "-1.791")
    assert ENTROPY_THRESHOLD == "0.5"
    assert PAPER_ENTROPY_EPS == 1e-9


def test_paper_polynomial_exact_values():
    sched = PaperPolynomial()
    assert sched.exact_coefficients == tuple(Fraction(c) for c in PAPER_COEFFICIENTS)
    assert sched.polynomial_exact(Fraction(1, 2)) == Fraction("0.1503125")
    assert not sched.jumps_at_threshold
    assert sched == PaperPolynomial() and repr(sched) == "PaperPolynomial()"
    assert resolve_schedule(None) == sched
    assert sched.needs_entropy


def test_user_polynomial_with_a_jump():
    jump = Polynomial(("2",), "0.5")  # P = 2 above the threshold
    assert jump.jumps_at_threshold
    assert not Polynomial(("1",), "0.5").jumps_at_threshold  # continuous: P(theta) = 1


@given(st.floats(min_value=0.0, max_value=12.0))
def test_float_beta_follows_the_rule(h):
    got = float(PaperPolynomial().beta_float(h, 10))
    p = np.polyval([float(c) for c in PAPER_COEFFICIENTS], h)
    assert got == (max(p, 1.0) if h > 0.5 else 1.0)
    assert got >= 1.0


def test_float_beta_of_each_schedule_and_special_values():
    assert np.isnan(PaperPolynomial().beta_float(np.nan, 3))
    assert Constant(2).beta_float(np.array([0.1, 5.0]), 3).tolist() == [2.0, 2.0]
    assert LogLength("0.5").beta_float(0.0, np.array([0, 1, 4])).tolist() == [
        1.0,
        0.0,
        0.5 * np.log(4),
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # s rounding to 0 formed 0 * log 0 = NaN, warned
        assert LogLength("1e-400").beta_float(0.0, np.array([0, 4])).tolist() == [1.0, 0.0]


def test_checked_beta_reads_a_users_values_and_refuses_bad_ones():
    """What the float backends call: a scalar or a list broadcast and read as float64, a
    negative β or another shape refused with the schedule's name; NaN and 0 are kept."""

    class Given(Constant):
        def __init__(self, value):
            super().__init__(1)
            object.__setattr__(self, "given", value)

        def beta_float(self, entropy, n_eff):
            return self.given

        def __repr__(self) -> str:
            return "Given()"

    h, n = np.array([0.5, 1.0]), np.array([3, 4])
    for value, want in [(2, [2.0, 2.0]), ([1.5, np.nan], [1.5, np.nan]), (0.0, [0.0, 0.0])]:
        got = Given(value).checked_beta(h, n)
        assert got.dtype == np.float64
        np.testing.assert_array_equal(got, want)
    for value, exc, match in [
        (np.array([1.0, -2.0]), ValueError, r"Given\(\)\.beta_float returned beta = -2\.0"),
        ([1.0, 2.0, 3.0], ValueError, r"returned shape \(3,\) for rows of shape \(2,\)"),
        ("2", TypeError, "dtype <U1, not real numbers"),
        (np.array([1j, 1]), TypeError, "complex128, not real numbers"),
    ]:
        with pytest.raises(exc, match=match):
            Given(value).checked_beta(h, n)


def test_float_beta_is_one_on_rows_without_items():
    """n_eff == 0 gives 1 for every schedule, as the docstring and the special-value table
    say: the polynomial gave P(0) or 2.25 (its value at the entropy), a Constant its beta."""
    h = np.array([0.0, 3.0, np.nan])
    for schedule in (PaperPolynomial(), Polynomial(("5",), "-1"), Constant(2), LogLength("2")):
        assert schedule.beta_float(h, np.array([0, 0, 0])).tolist() == [1.0, 1.0, 1.0]
    assert PaperPolynomial().beta_float(3.0, np.array([0, 4]))[1] > 2.0


@pytest.mark.parametrize(
    ("given", "stored"),
    [
        (np.int64(2), 2),
        (np.float32(0.5), 0.5),
        (np.float64(1.25), 1.25),
        (Decimal("0.3"), "0.3"),
        (np.longdouble(2) ** -3, 0.125),
    ],
)
def test_numpy_scalars_and_decimals_are_numbers(given, stored):
    """They raised 'must be a decimal string or a real number, got np.int64(2)'. They are
    stored as the plain number of the same exact value, so schedules compare, hash and
    print as if given that number."""
    for make in (Constant, LogLength, lambda v: Polynomial((v, "1"), v)):
        schedule = make(given)
        assert schedule == make(stored) and hash(schedule) == hash(make(stored))
        assert repr(schedule) == repr(make(stored))
    assert Constant(given).exact_beta == Fraction(stored)
    with pytest.raises(ValueError, match="finite"):
        Constant(Decimal("NaN"))
    with pytest.raises(ValueError, match="finite"):
        Constant(np.float32("inf"))


def test_float_beta_is_close_to_the_certified_beta():
    rng = np.random.default_rng(2)
    for scale in (0.3, 1.0, 2.0, 4.0):
        x = rng.normal(size=(8, 40)) * scale
        h = reference.entropy(x)
        n = np.full(8, 40)
        np.testing.assert_allclose(
            PaperPolynomial().beta_float(h, n), reference.beta(x), rtol=1e-13
        )
        np.testing.assert_allclose(
            LogLength("0.3").beta_float(h, n), reference.beta(x, schedule=LogLength("0.3"))
        )


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: Constant(0), ValueError, "beta must be > 0"),
        (lambda: Constant(float("nan")), ValueError, "beta must be finite"),
        (lambda: Constant("abc"), ValueError, "beta must be a finite decimal"),
        (lambda: Constant(True), TypeError, "beta must be"),
        (lambda: LogLength(-1), ValueError, "s must be > 0"),
        (lambda: Polynomial(()), ValueError, "at least one"),
        (lambda: Polynomial(("1", None)), TypeError, r"coefficients\[1\]"),
        (lambda: Polynomial(("1",), float("inf")), ValueError, "threshold must be finite"),
        (lambda: resolve_schedule("paper"), TypeError, "schedule must be"),
        (lambda: check_entropy_eps(-1e-9), ValueError, "entropy_eps"),
        (lambda: check_entropy_eps("1e-9"), TypeError, "entropy_eps"),
    ],
)
def test_invalid_parameters(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_exact_value_reads_decimals_exactly():
    assert exact_value("0.1", "x") == Fraction(1, 10)
    assert exact_value(0.1, "x") == Fraction(0.1)
    assert exact_value(3, "x") == 3


def test_as_logits_dtypes():
    assert as_logits([1, 2]).dtype == np.float64
    assert as_logits(np.zeros(3, dtype=np.float16)).dtype == np.float16
    assert as_logits(np.zeros(3, dtype=np.float32)).dtype == np.float32
    for bad in (np.array([True]), np.array([1j]), np.array(["a"]), np.array([None], dtype=object)):
        with pytest.raises(TypeError, match="x must be a real"):
            as_logits(bad)
    with pytest.raises(ValueError, match="at least one axis"):
        as_logits(3.0)
    with pytest.raises(ValueError, match="x must be a rectangular array"):
        as_logits([[1.0, 2.0], [3.0]])


def test_classify_rows():
    x = np.array([[0.0, -np.inf], [-np.inf, -np.inf], [np.nan, 0.0], [np.inf, 0.0], [1.0, 2.0]])
    assert classify_rows(x).tolist() == [
        RowKind.REGULAR,
        RowKind.MASKED,
        RowKind.INVALID,
        RowKind.INVALID,
        RowKind.REGULAR,
    ]
    assert classify_rows(np.zeros((3, 0))).tolist() == [RowKind.EMPTY] * 3


def test_a_threshold_at_or_below_zero_jumps_for_a_guarded_entropy():
    # -sum p log(p + eps) >= -log(1 + eps) > -eps can be negative: theta in (-eps, 0] splits rows
    jump = Polynomial(("3",), threshold="-0.25")
    assert not jump.jumps_at_threshold and not jump.jumps_for(0.0)
    assert jump.jumps_for(1.0) and not jump.jumps_for(0.25) and not jump.jumps_for(0.1)
    assert Polynomial(("3",), threshold="0").jumps_for(1e-9)
    assert not Polynomial(("1",), threshold="-0.25").jumps_for(1.0)  # P(theta) = 1: continuous


def test_a_guarded_entropy_jumps_only_above_minus_log_one_plus_eps():
    """H_eps >= -log(1 + eps), attained by one item only: a threshold in (-eps, -log(1+eps)]
    lies below every row of two items, and was reported as a jump."""
    assert not Polynomial(("3",), threshold="-0.8").jumps_for(1.0)  # -log 2 = -0.6931...
    assert Polynomial(("3",), threshold="-0.6").jumps_for(1.0)
    # decided exactly on either side of -log 2 = -0.69314718055994530941...
    assert Polynomial(("3",), threshold="-0.6931471805599453094").jumps_for(1.0)
    assert not Polynomial(("3",), threshold="-0.6931471805599453095").jumps_for(1.0)
    assert not Polynomial(("3",), threshold="-1").jumps_for(1.0)
    assert not Polynomial(("1",), threshold="-0.6").jumps_for(1.0)  # P(theta) = 1
    # numpy scalars, as check_entropy_eps accepts them
    assert Polynomial(("3",), threshold="-0.5").jumps_for(np.float32(1.0))
    assert not Polynomial(("3",), threshold="-0.8").jumps_for(np.float16(1.0))


def _numpy_entry_points() -> dict[str, Any]:
    from softmaxtheory import reference, testing

    calls: dict[str, Any] = {
        "reference.softmax": lambda a: reference.softmax(a),
        "reference.adaptive_attention": lambda a: reference.adaptive_attention(a, a, a),
        "testing.assert_softmax_close": lambda a: testing.assert_softmax_close(a, a),
    }
    try:
        from softmaxtheory.accelerated import cpu
    except ImportError:  # numba absent
        return calls
    calls["cpu.adaptive_softmax"] = lambda a: cpu.adaptive_softmax(a)
    calls["cpu.adaptive_attention"] = lambda a: cpu.adaptive_attention(a, a, a)
    return calls


NUMPY_CALLS = _numpy_entry_points()


@pytest.mark.parametrize("call", list(NUMPY_CALLS.values()), ids=list(NUMPY_CALLS))
def test_a_float_without_a_format_is_named_and_given_a_way_in(call) -> None:
    # numpy's extended precision is floating: the refusal must not say otherwise, and it
    # names the dtypes taken and the conversion
    x = np.ones((2, 3), dtype=np.longdouble)
    if np.finfo(np.longdouble).bits == 64:  # longdouble is float64 on this platform
        pytest.skip("numpy's longdouble is float64 here")
    want = re.escape(
        "must be a real floating (float16, float32, float64) or integer array, got dtype "
        f"{x.dtype} (convert it: "
    )
    with pytest.raises(TypeError, match=want):
        call(x)


def test_a_float8_tensor_is_named_and_given_a_way_in() -> None:
    torch = pytest.importorskip("torch")
    from softmaxtheory import testing
    from softmaxtheory.accelerated import torch as sttorch

    x = torch.ones(2, 3).to(torch.float8_e4m3fn)

    def want(name: str) -> str:
        return re.escape(
            f"{name} must be a real floating (float16, bfloat16, float32, float64) or integer "
            f"tensor, got dtype torch.float8_e4m3fn (convert it: {name}.float())"
        )

    with pytest.raises(TypeError, match=want("x")):
        sttorch.adaptive_softmax(x)
    with pytest.raises(TypeError, match=want("logits")):
        testing.assert_softmax_close(torch.ones(2, 3), x)


def test_schedules_compare_by_the_values_they_compute():
    """``PaperPolynomial()`` and ``Polynomial(PAPER_COEFFICIENTS)`` were unequal (the
    dataclass compared classes and texts), so streaming states made with one and the
    other refused to merge as "different schedules"; ``Constant(2)`` and
    ``Constant("2.0")`` were unequal too. Equal values now compare and hash equal; other
    kinds, other values and a user's subclass do not."""
    same = [
        (PaperPolynomial(), Polynomial(PAPER_COEFFICIENTS, "0.5")),
        (Polynomial(("1.0", "2")), Polynomial(("1", "2.00"))),
        (Polynomial(("0", "1", "2"), "0.25"), Polynomial((1, 2), 0.25)),
        (Constant(2), Constant("2.0")),
        (LogLength("0.5"), LogLength(0.5)),
    ]
    for a, b in same:
        assert a == b and b == a and hash(a) == hash(b)
        assert len({a, b}) == 1

    class Mine(Polynomial):
        def beta_float(self, entropy, n_eff):  # another rule on the same coefficients
            return 2 * super().beta_float(entropy, n_eff)

    different = [
        (Polynomial(("1", "2"), "0.5"), Polynomial(("1", "2"), "0.6")),
        (Constant(2), LogLength(2)),
        (Polynomial(("2",)), Constant(2)),
        (Mine(("1", "2")), Polynomial(("1", "2"))),
    ]
    for a, b in different:
        assert a != b and b != a
    assert Constant(2) != 2


def test_streaming_states_of_equal_schedules_merge():
    pytest.importorskip("numba")
    from softmaxtheory.accelerated import cpu

    x = np.linspace(-3.0, 3.0, 10)
    a = cpu.StreamingSoftmax(PaperPolynomial()).update(x[:4])
    b = cpu.StreamingSoftmax(Polynomial(PAPER_COEFFICIENTS)).update(x[4:])
    assert (a + b).entropy() == cpu.StreamingSoftmax().update(x).entropy()


def test_a_built_in_schedule_with_its_own_beta_float_is_refused_by_name():
    """A PaperPolynomial subclass capping beta_float at 1.2: cpu.adaptive_softmax and the
    reference evaluated the polynomial's exact coefficients (beta 1.43), cpu.beta, the
    streaming softmax, dask and CPU attention called the override (1.2), so that
    adaptive_softmax(x) != softmax(beta(x) * x) within one backend. Refused now, with the
    way out: a Schedule subclass, which every backend calls."""
    import numpy as np

    from softmaxtheory import reference
    from softmaxtheory.spec import PaperPolynomial, Schedule, resolve_schedule

    class Capped(PaperPolynomial):
        def beta_float(self, entropy, n_eff):
            return np.minimum(super().beta_float(entropy, n_eff), 1.2)

    with pytest.raises(TypeError, match=r"Capped overrides Polynomial\.beta_float"):
        resolve_schedule(Capped())
    x = np.random.default_rng(0).normal(0.0, 1.0, (2, 50))
    with pytest.raises(TypeError, match=r"subclasses softmaxtheory\.spec\.Schedule"):
        reference.adaptive_softmax(x, schedule=Capped())

    class Mine(Schedule):  # the way out
        needs_entropy = True

        def beta_float(self, entropy, n_eff):
            return np.minimum(PaperPolynomial().beta_float(entropy, n_eff), 1.2)

    assert resolve_schedule(Mine()).beta_float(np.array([4.0]), np.array([50]))[0] == 1.2

    class Renamed(PaperPolynomial):  # a subclass that computes the same is taken
        pass

    same = Renamed()
    assert resolve_schedule(same) is same
    np.testing.assert_array_equal(
        reference.adaptive_softmax(x, schedule=same), reference.adaptive_softmax(x)
    )


def test_decimal_text_with_a_huge_exponent_is_refused_at_once():
    """Fraction("1e-9999999") forms 10**9999999: Constant of it took 8.4 s and was accepted
    (and every beta_float call re-read it: 0.2 s a call for "1e-999999"); "1e99999999" ran
    for minutes before its range error. Exponents beyond +-4000 are refused by reading the
    text as a Decimal first; a Fraction still gives any exact value, and 1e-400 is taken."""
    import time

    from softmaxtheory.spec import Constant, LogLength, Polynomial

    start = time.perf_counter()
    for make in (Constant, LogLength, lambda t: Polynomial((t, "1"))):
        for text in ("1e99999999", "1e-9999999", "-1e-5000"):
            with pytest.raises(ValueError, match=r"decimal exponent beyond \+-4000"):
                make(text)
    assert time.perf_counter() - start < 5.0  # (each refusal reads no power of ten)
    tiny = LogLength("1e-400")
    assert tiny.exact_s == Fraction(1, 10**400)
    assert tiny.exact_s is tiny.exact_s  # read once, kept
    assert Constant(Fraction(1, 10**5000)).exact_beta == Fraction(1, 10**5000)


@pytest.mark.parametrize("coefficients", [{"2", "-1"}, {"2": 1, "-1": 0}, frozenset({"1"})])
def test_coefficients_in_an_unordered_container_are_refused(coefficients):
    """A set gave another polynomial in each process (its order follows the hash seed), and
    a dict gave its keys."""
    from softmaxtheory.spec import Polynomial

    with pytest.raises(TypeError, match="coefficients must be a sequence"):
        Polynomial(coefficients)
