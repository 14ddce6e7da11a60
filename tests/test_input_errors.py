"""Invalid arguments raise clear errors that name the argument; nothing is silently coerced."""

from __future__ import annotations

import math
import re

import mpmath
import numpy as np
import pytest

from softmaxtheory import reference
from softmaxtheory.reference import StreamState
from softmaxtheory.spec import Constant, LogLength, PaperPolynomial, Polynomial

ARRAY_FUNCS = {
    "softmax": reference.softmax,
    "entropy": reference.entropy,
    "beta": reference.beta,
    "adaptive_softmax": reference.adaptive_softmax,
}
MP_FUNCS = {
    "softmax_mp": reference.softmax_mp,
    "entropy_mp": reference.entropy_mp,
    "beta_mp": reference.beta_mp,
    "adaptive_softmax_mp": reference.adaptive_softmax_mp,
}
ALL_FUNCS = {**ARRAY_FUNCS, **MP_FUNCS}


def names(arg: str) -> str:
    """A regex: the message names the argument as a word."""
    return rf"\b{re.escape(arg)}\b"


BAD_DTYPE_INPUTS = {
    "complex": np.array([1.0 + 2.0j, 0.0]),
    "complex-list": [1j, 2.0],
    "object": np.array([1.0, None], dtype=object),
    "object-numbers": np.array([1.0, 2.0], dtype=object),
    "none": None,
    "bool": np.array([True, False]),
    "bool-list": [True, False, True],
    "str": ["1.0", "2.0"],
    "str-scalar": "abc",
    "bytes": np.array([b"1", b"2"]),
    "datetime": np.array(["2024-01-01"], dtype="datetime64[D]"),
    "timedelta": np.array([1, 2], dtype="timedelta64[s]"),
    "structured": np.zeros(2, dtype=[("a", "f8")]),
}


@pytest.mark.parametrize("func", sorted(ALL_FUNCS))
@pytest.mark.parametrize("case", sorted(BAD_DTYPE_INPUTS))
def test_bad_input_dtype_is_a_type_error_naming_x(func, case) -> None:
    with pytest.raises(TypeError, match=names("x")):
        ALL_FUNCS[func](BAD_DTYPE_INPUTS[case])


@pytest.mark.parametrize("func", sorted(ALL_FUNCS))
@pytest.mark.parametrize("value", [1.0, 0, np.float64(2.0), np.array(3.0), np.float32(1.0)])
def test_zero_d_input_is_a_value_error_naming_x(func, value) -> None:
    with pytest.raises(ValueError, match=names("x")):
        ALL_FUNCS[func](value)


@pytest.mark.parametrize("func", sorted(MP_FUNCS))
def test_mp_functions_take_one_row(func) -> None:
    with pytest.raises(ValueError, match=names("x")):
        MP_FUNCS[func](np.zeros((2, 3)))


@pytest.mark.parametrize("func", sorted(MP_FUNCS))
@pytest.mark.parametrize("prec", [0, 4, 7, 100_000, 113.0, "113", True, None])
def test_mp_functions_reject_bad_prec(func, prec) -> None:
    with pytest.raises((ValueError, TypeError), match=names("prec")):
        MP_FUNCS[func]([0.0, 1.0], prec=prec)


@pytest.mark.parametrize("method", ["s_mp", "t_mp"])
@pytest.mark.parametrize("prec", [0, -5, 7, 100_000, 113.0, "113", True, None])
def test_stream_sums_reject_bad_prec(method, prec) -> None:
    # -5 was accepted (a sum to 2**5 relative) and "113" raised a bare TypeError
    state = reference.StreamState.from_logits([0.0, -1.0])
    with pytest.raises(ValueError, match=names("prec")):
        getattr(state, method)(prec)


@pytest.mark.parametrize(
    ("args", "exc", "name"),
    [
        ((-1, 3, 0), ValueError, "sign"),
        ((2, 3, 0), ValueError, "sign"),  # was rounded as a negative value
        ((True, 3, 0), TypeError, "sign"),
        ((0, -3, 0), ValueError, "man"),  # was rounded as if positive
        ((0, 3.0, 0), TypeError, "man"),
        ((0, 3, 0.5), TypeError, "exp"),
    ],
)
def test_round_exact_rejects_bad_arguments(args, exc, name) -> None:
    with pytest.raises(exc, match=names(name)):
        reference.round_exact(*args, reference.FORMATS["float64"])


def test_round_exact_rejects_a_format_that_is_not_one() -> None:
    with pytest.raises(TypeError, match=names("fmt")):  # was an AttributeError
        reference.round_exact(0, 3, 0, "float64")
    assert reference.round_exact(1, np.int64(3), np.int32(-1), reference.FORMATS["float16"]) == -1.5


@pytest.mark.parametrize("func", sorted(ARRAY_FUNCS))
@pytest.mark.parametrize(
    "dtype", ["int32", np.int64, np.uint8, "bogus", np.complex128, object, bool, "float128", "U3"]
)
def test_bad_output_dtype_is_a_value_error_naming_dtype(func, dtype) -> None:
    with pytest.raises(ValueError, match=names("dtype")):
        ARRAY_FUNCS[func]([0.0, 1.0], dtype=dtype)
    # also for rows that never reach the arithmetic
    with pytest.raises(ValueError, match=names("dtype")):
        ARRAY_FUNCS[func](np.zeros((2, 0)), dtype=dtype)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", np.float32, np.dtype("f2")])
def test_valid_output_dtype_spellings(dtype) -> None:
    assert reference.softmax([0.0, 1.0], dtype=dtype).dtype == np.dtype(dtype)


SCHEDULE_FUNCS = {
    "beta": reference.beta,
    "adaptive_softmax": reference.adaptive_softmax,
    "beta_mp": reference.beta_mp,
    "adaptive_softmax_mp": reference.adaptive_softmax_mp,
}


@pytest.mark.parametrize("func", sorted(SCHEDULE_FUNCS))
@pytest.mark.parametrize(
    "schedule", ["paper", 2.0, 1, PaperPolynomial, Constant, ("-0.037", "0.481"), lambda h: 1.0]
)
def test_bad_schedule_is_a_type_error_naming_schedule(func, schedule) -> None:
    for x in ([0.0, 1.0], [float("-inf")], []):
        with pytest.raises(TypeError, match=names("schedule")):
            SCHEDULE_FUNCS[func](x, schedule=schedule)


@pytest.mark.parametrize(
    ("make", "exc", "arg"),
    [
        (lambda: Constant(0), ValueError, "beta"),
        (lambda: Constant(-1), ValueError, "beta"),
        (lambda: Constant("-0.5"), ValueError, "beta"),
        (lambda: Constant("0"), ValueError, "beta"),
        (lambda: Constant(math.nan), ValueError, "beta"),
        (lambda: Constant(math.inf), ValueError, "beta"),
        (lambda: Constant("abc"), ValueError, "beta"),
        (lambda: Constant(True), TypeError, "beta"),
        (lambda: Constant(None), TypeError, "beta"),
        (lambda: LogLength(0), ValueError, "s"),
        (lambda: LogLength(-2.0), ValueError, "s"),
        (lambda: LogLength(math.nan), ValueError, "s"),
        (lambda: LogLength("x"), ValueError, "s"),
        (lambda: Polynomial(()), ValueError, "coefficients"),
        (lambda: Polynomial([]), ValueError, "coefficients"),
        (lambda: Polynomial(("1", "x")), ValueError, "coefficients"),
        (lambda: Polynomial((1.0, math.inf)), ValueError, "coefficients"),
        (lambda: Polynomial((1.0, None)), TypeError, "coefficients"),
        (lambda: Polynomial(("1",), threshold="nan"), ValueError, "threshold"),
        (lambda: Polynomial(("1",), threshold=math.nan), ValueError, "threshold"),
        (lambda: Polynomial(("1",), threshold=None), TypeError, "threshold"),
        # issue 14 item 10: accepted, then every backend raised OverflowError or a bare message
        (lambda: Polynomial(["1e400"]), ValueError, "coefficients"),
        (lambda: Polynomial(["1", "-1e309"]), ValueError, "coefficients"),
        (lambda: Polynomial([10**400]), ValueError, "coefficients"),
        (lambda: Polynomial(["1"], threshold="1e400"), ValueError, "threshold"),
        (lambda: Polynomial(5), TypeError, "coefficients"),
        (lambda: Polynomial(None), TypeError, "coefficients"),
        (lambda: Polynomial("1.5"), TypeError, "coefficients"),
        (lambda: Constant("1e400"), ValueError, "beta"),
        (lambda: LogLength(10**309), ValueError, "s"),
    ],
)
def test_invalid_schedule_parameters(make, exc, arg) -> None:
    with pytest.raises(exc, match=names(arg)):
        make()


EPS_FUNCS = {
    "entropy": reference.entropy,
    "beta": reference.beta,
    "adaptive_softmax": reference.adaptive_softmax,
    "entropy_mp": reference.entropy_mp,
    "beta_mp": reference.beta_mp,
    "adaptive_softmax_mp": reference.adaptive_softmax_mp,
}


@pytest.mark.parametrize("func", sorted(EPS_FUNCS))
@pytest.mark.parametrize(
    ("eps", "exc"),
    [
        (-1e-9, ValueError),
        (-0.5, ValueError),
        (math.nan, ValueError),
        (math.inf, ValueError),
        (-math.inf, ValueError),
        ("1e-9", TypeError),
        (None, TypeError),
        (True, TypeError),
        (np.True_, TypeError),
        (np.int64(-1), ValueError),
        (1e-9j, TypeError),
        ([1e-9], TypeError),
    ],
)
def test_bad_entropy_eps(func, eps, exc) -> None:
    for x in ([0.0, 1.0], [float("-inf")], [], [math.nan]):
        with pytest.raises(exc, match=names("entropy_eps")):
            EPS_FUNCS[func](x, entropy_eps=eps)


# (np.int64(1) was refused where the int 1 is taken)
@pytest.mark.parametrize(
    "eps", [0, 0.0, 1e-9, np.float32(1e-9), np.float64(0.25), 1, np.int64(1), np.uint8(0)]
)
def test_valid_entropy_eps_spellings(eps) -> None:
    h = reference.entropy([0.0, 1.0], entropy_eps=eps)
    assert np.isfinite(h)


def test_keyword_only_options() -> None:
    with pytest.raises(TypeError):
        reference.softmax([0.0, 1.0], np.float32)  # type: ignore[misc]
    with pytest.raises(TypeError):
        reference.beta([0.0, 1.0], Constant(2))  # type: ignore[misc]


# ---------------------------------------------------------------------------
# StreamState
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [np.array([1j]), [True], ["a"], np.array([None], dtype=object)])
def test_stream_bad_chunk_dtype(chunk) -> None:
    with pytest.raises(TypeError, match=names("chunk")):
        StreamState.from_logits(chunk)
    with pytest.raises(TypeError, match=names("chunk")):
        StreamState().update(chunk)


@pytest.mark.parametrize("chunk", [np.zeros((2, 2)), 1.0, np.array(2.0)])
def test_stream_chunk_must_be_one_row(chunk) -> None:
    with pytest.raises(ValueError, match=names("chunk")):
        StreamState.from_logits(chunk)
    with pytest.raises(ValueError, match=names("chunk")):
        StreamState.from_logits([0.0]).normalize(chunk)


@pytest.mark.parametrize("other", [None, 1.0, (0.0, 1.0, 0.0), [0.0]])
def test_stream_merge_with_non_state(other) -> None:
    with pytest.raises(TypeError):
        StreamState().merge(other)
    with pytest.raises(TypeError):
        StreamState.from_logits([1.0]) + other


def test_stream_normalize_refuses_values_never_fed() -> None:
    s = StreamState.from_logits([0.0, 1.0])
    with pytest.raises(ValueError, match=names("chunk")):
        s.normalize([0.5])
    with pytest.raises(ValueError, match=names("chunk")):
        StreamState().normalize([0.0])


STATES = {
    "regular": lambda: StreamState.from_logits([0.0, 1.0]),
    # nothing to compute for these two, but the arguments must still be checked
    "identity": StreamState,
    "invalid": lambda: StreamState.from_logits([math.nan]),
}
READINGS = {
    "entropy-eps-negative": (lambda s: s.entropy(entropy_eps=-1.0), ValueError, "entropy_eps"),
    "beta-eps-string": (lambda s: s.beta(entropy_eps="1e-9"), TypeError, "entropy_eps"),
    "beta-schedule": (lambda s: s.beta(schedule="paper"), TypeError, "schedule"),
    "normalize-schedule": (lambda s: s.normalize([], schedule=2.0), TypeError, "schedule"),
    "normalize-eps": (lambda s: s.normalize([], entropy_eps=math.nan), ValueError, "entropy_eps"),
    "entropy-dtype": (lambda s: s.entropy(dtype="int8"), ValueError, "dtype"),
    "beta-dtype": (lambda s: s.beta(dtype=bool), ValueError, "dtype"),
    "normalize-dtype": (lambda s: s.normalize([], dtype=np.complex64), ValueError, "dtype"),
}


@pytest.mark.parametrize("state", sorted(STATES))
@pytest.mark.parametrize("reading", sorted(READINGS))
def test_stream_readings_validate_their_arguments(state, reading) -> None:
    call, exc, arg = READINGS[reading]
    with pytest.raises(exc, match=names(arg)):
        call(STATES[state]())


# ---------------------------------------------------------------------------
# issue 14 item 10: attention options and the mp functions' far-out items
# ---------------------------------------------------------------------------


def test_huge_but_finite_schedule_parameters_are_accepted() -> None:
    """The float64 range is the limit, not less: the largest float and tiny decimals pass."""
    big = Polynomial([float(np.finfo(np.float64).max), "1e-400"])
    assert big.beta_float(0.75, 3) == 0.75 * np.finfo(np.float64).max
    assert Constant("1e-400").exact_beta > 0


ATT_Q = np.array([[1.0, 0.0], [-1.0, 0.0]])
ATT_V = np.array([[1.0], [2.0]])


@pytest.mark.parametrize("is_causal", ["no", "", 0, 1, None, np.array([True])])
def test_reference_attention_is_causal_must_be_a_bool(is_causal) -> None:
    """``is_causal="no"`` was taken as True (truthy); the CPU kernel already refused it."""
    with pytest.raises(TypeError, match=names("is_causal")):
        reference.adaptive_attention(ATT_Q, ATT_Q, ATT_V, is_causal=is_causal)


@pytest.mark.parametrize("dtype", [np.int8, np.int64, np.uint8])
def test_integer_attention_mask_is_refused_as_torch_does(dtype) -> None:
    """torch refuses an integer attn_mask; the reference took it as additive: one rule now."""
    mask = np.ones((2, 2), dtype=dtype)
    with pytest.raises(TypeError, match=names("mask")):
        reference.adaptive_attention(ATT_Q, ATT_Q, ATT_V, mask=mask)


@pytest.mark.parametrize("mask", [np.array([[1 + 0j, 0], [0, 1]]), np.array([["a", "b"]])])
def test_non_real_attention_mask_is_refused(mask) -> None:
    with pytest.raises(TypeError, match=names("mask")):
        reference.adaptive_attention(ATT_Q, ATT_Q, ATT_V, mask=mask)


def test_split_mask_names_the_argument() -> None:
    from softmaxtheory.spec import split_mask

    with pytest.raises(TypeError, match=names("attn_mask")):
        split_mask(np.zeros((2, 2), dtype=np.int32), (), 2, 2, name="attn_mask")
    with pytest.raises(ValueError, match=names("attn_mask")):
        split_mask(np.zeros((3, 2)), (), 2, 2, name="attn_mask")
    # broadcasting together is not enough: the mask must broadcast to (L, S)
    with pytest.raises(ValueError, match=names("mask")):
        split_mask(np.zeros((1, 3), dtype=bool), (), 0, 1)
    with pytest.raises(ValueError, match=names("mask")):
        reference.adaptive_attention(np.zeros((0, 2)), np.zeros((1, 2)), np.zeros((1, 1)),
                                     mask=np.zeros((1, 3), dtype=bool))  # fmt: skip
    _keep, add, lead = split_mask(np.zeros((2, 2), dtype=np.float32), (), 2, 2)
    assert add.dtype == np.float64 and lead == ()


@pytest.mark.parametrize("prec", [8, 53, 113, 800])
@pytest.mark.parametrize("big", [1e308, 1.7976931348623157e308, 2.0**1000])
def test_mp_tempered_item_beyond_relative_precision_is_certified_zero(prec, big) -> None:
    """``adaptive_softmax_mp([1e308] * 5 + [0.])`` raised PrecisionError.

    The last item is e^(-beta * 1e308): beta's error times 1e308 in the exponent
    forbids any relative bound, but it is provably below e^(-2^128), far below
    2^-1075, so it is returned as an exact zero (what every float format holds).
    """
    row = [big] * 5 + [0.0]
    got = reference.adaptive_softmax_mp(row, prec=prec)
    assert got[-1] == 0
    with mpmath.workprec(prec + 40):
        tol = mpmath.mpf(2) ** -prec
        assert all(abs(v - mpmath.mpf(1) / 5) <= tol / 5 for v in got[:5])
    assert reference.adaptive_softmax(row)[-1] == 0.0


def test_mp_tempered_items_below_the_zero_cutoff_keep_their_relative_precision() -> None:
    """An item with beta * |z| just below 2^128 is still certified to 2^-prec (not zeroed)."""
    row = [0.0] * 5 + [-(2.0**126)]
    got = reference.adaptive_softmax_mp(row, prec=800)
    beta = reference.beta_mp(row, prec=800)
    with mpmath.workprec(1200):
        exact = mpmath.exp(beta * row[-1]) / (5 + mpmath.exp(beta * row[-1]))
        assert got[-1] != 0
        # beta_mp's own error is amplified by 2^126: compare the exponents instead
        assert abs(mpmath.log(got[-1]) - mpmath.log(exact)) <= mpmath.mpf(2) ** -600 * 2.0**126


# ---------------------------------------------------------------- masked arrays

#: Logits with one masked entry: numpy.asarray drops the mask, so every function read the
#: masked 2.0 as a logit (softmax gave 0.245 where the masked entry should have no weight).
MASKED = np.ma.array([[1.0, 2.0, 3.0]], mask=[[False, True, False]])


def _masked_logit_calls():
    from softmaxtheory import bounds, testing
    from softmaxtheory.reference import StreamState as RefState

    calls = {f"reference.{n}": (lambda f=f: f(MASKED)) for n, f in ALL_FUNCS.items()}
    calls["reference.StreamState.update"] = lambda: RefState().update(MASKED[0])
    calls["bounds.empirical_spread"] = lambda: bounds.empirical_spread(MASKED)
    calls["testing.assert_softmax_close(logits)"] = lambda: testing.assert_softmax_close(
        np.zeros((1, 3)), MASKED
    )
    try:
        from softmaxtheory.accelerated import cpu
    except ImportError:  # numba absent: the reference's calls still run
        return calls
    for n in ("softmax", "entropy", "beta", "adaptive_softmax"):
        fn = getattr(cpu, n)
        calls[f"cpu.{n}"] = lambda f=fn: f(MASKED)
    calls["cpu.StreamingSoftmax.update"] = lambda: cpu.StreamingSoftmax().update(MASKED[0])
    return calls


MASKED_LOGIT_CALLS = _masked_logit_calls()


@pytest.mark.parametrize("call", sorted(MASKED_LOGIT_CALLS))
def test_masked_logits_are_refused_with_the_fill_that_removes_them(call):
    with pytest.raises(TypeError, match=r"masked array with masked entries.*filled\(-np\.inf\)"):
        MASKED_LOGIT_CALLS[call]()


def test_the_named_fill_gives_the_removal():
    """What the message proposes is theorem T8's removal: the masked entry gets weight 0
    and the others are the softmax of the rest."""
    got = reference.softmax(MASKED.filled(-np.inf))
    assert got[0, 1] == 0.0
    np.testing.assert_array_equal(got[0, [0, 2]], reference.softmax(np.array([1.0, 3.0])))


def test_a_masked_array_without_masked_entries_is_its_data():
    x = np.ma.array([[1.0, 2.0, 3.0]], mask=[[False, False, False]])
    np.testing.assert_array_equal(reference.softmax(x), reference.softmax(x.data))
    np.testing.assert_array_equal(reference.softmax(np.ma.array(x.data)), reference.softmax(x.data))


def _masked_attention_calls():
    from softmaxtheory import testing

    q, k, v = np.ones((2, 3)), np.ones((4, 3)), np.ones((4, 1))
    mq = np.ma.array(q, mask=np.eye(2, 3, dtype=bool))
    mmask = np.ma.array(np.ones((2, 4), bool), mask=np.eye(2, 4, dtype=bool))
    fns = {"reference": reference.adaptive_attention}
    try:
        from softmaxtheory.accelerated import cpu

        fns["cpu"] = cpu.adaptive_attention
    except ImportError:
        pass
    calls = {}
    for name, f in fns.items():
        calls[f"{name} q"] = (lambda f=f: f(mq, k, v), "q", r"q\.filled\(value\)")
        calls[f"{name} mask"] = (
            lambda f=f: f(q, k, v, mask=mmask),
            "mask",
            r"mask\.filled\(False\)",
        )
    out = np.zeros((2, 1))
    calls["testing actual"] = (
        lambda: testing.assert_attention_close(np.ma.array(out, mask=[[1], [0]]), (q, k, v)),
        "actual",
        "pass a plain array",
    )
    calls["testing mask"] = (
        lambda: testing.assert_attention_close(out, (q, k, v), mask=mmask),
        "mask",
        r"mask\.filled\(False\)",
    )
    return calls


MASKED_ATTENTION_CALLS = _masked_attention_calls()


@pytest.mark.parametrize("call", sorted(MASKED_ATTENTION_CALLS))
def test_masked_attention_arguments_are_refused_by_name(call):
    fn, name, remedy = MASKED_ATTENTION_CALLS[call]
    with pytest.raises(TypeError, match=rf"^{name} is a masked array.*{remedy}"):
        fn()


def test_a_bfloat16_tensor_is_refused_naming_the_argument():
    """numpy holds no bfloat16: torch's refusal ('Got unsupported ScalarType BFloat16')
    named neither the argument nor x.float(), which holds its values exactly."""
    torch = pytest.importorskip("torch")
    from softmaxtheory import reference
    from softmaxtheory.accelerated import cpu

    x = torch.ones(2, 3, dtype=torch.bfloat16)
    for fn in (reference.softmax, reference.entropy, cpu.adaptive_softmax):
        with pytest.raises(TypeError, match=r"x is a bfloat16 tensor.*x\.float\(\)"):
            fn(x)
    with pytest.raises(TypeError, match=r"k is a bfloat16 tensor"):
        reference.adaptive_attention(x.float(), x, x.float())
    f = x.float()
    with pytest.raises(TypeError, match=r"k is a bfloat16 tensor"):
        cpu.adaptive_attention(f, x, f)
    for attention in (cpu.adaptive_attention, reference.adaptive_attention):
        with pytest.raises(TypeError, match=r"mask is a bfloat16 tensor"):
            attention(f, f, f, mask=torch.zeros(2, 2, dtype=torch.bfloat16))
    assert np.allclose(reference.softmax(x.float()), 1 / 3)


def test_a_list_mixing_floats_with_an_int_float64_cannot_hold_is_refused() -> None:
    """numpy rounds [2**53 + 1, 2.0**53] to float64 before any check sees it: softmax 0.5
    each, where the row's are 0.731 and 0.269 (an all-int list was refused)."""
    from softmaxtheory.accelerated import cpu

    for f in (reference.softmax, cpu.softmax):
        with pytest.raises(ValueError, match="9007199254740993, which float64 cannot hold"):
            f([2**53 + 1, 2.0**53])
        with pytest.raises(ValueError, match="9007199254740993, which float64 cannot hold"):
            f([[0.5, 1.5], (2.0, 2**53 + 1)])
    np.testing.assert_array_equal(reference.softmax([2**60, 1.5]), [1.0, 0.0])  # (held)


def test_a_user_schedule_is_refused_by_the_reference_up_front() -> None:
    """The reference computes the built-in schedules exactly; a user Schedule was refused
    deep in the engine at the first regular row, while empty, fully masked and NaN rows
    answered 1 or NaN without a word. Refused at once now, by every reference function
    that reads beta; the softmax and the entropy take any."""
    from softmaxtheory.spec import Schedule

    class Mine(Schedule):
        def beta_float(self, entropy, n_eff):
            return np.full(np.broadcast(entropy, n_eff).shape, 2.0)

    calls = [
        lambda: reference.beta([-np.inf, -np.inf], schedule=Mine()),
        lambda: reference.beta([], schedule=Mine()),
        lambda: reference.adaptive_softmax([np.nan, 1.0], schedule=Mine()),
        lambda: reference.adaptive_attention(
            np.ones((1, 2)), np.ones((2, 2)), np.ones((2, 1)), schedule=Mine()
        ),
        lambda: StreamState().update([1.0]).beta(schedule=Mine()),
    ]
    for call in calls:
        with pytest.raises(TypeError, match="computes the built-in schedules exactly"):
            call()


def test_stream_states_sum_and_refuse_other_operands() -> None:
    x = np.random.default_rng(3).normal(0.0, 1.0, 100)
    states = [StreamState().update(c) for c in np.array_split(x, 4)]
    assert sum(states) == StreamState().update(x)  # (0 + state had no meaning)
    with pytest.raises(TypeError, match="unsupported operand"):
        states[0] + 1  # (merge raised its own TypeError, not NotImplemented)
