"""The special-value table of DESIGN §2, row by row, for every reference function and dtype.

| input row            | softmax / adaptive        | entropy        | beta |
| contains -inf        | masked: 0, rest as absent | of the unmasked| from that H |
| all -inf             | all zeros                 | 0              | 1 |
| contains NaN or +inf | all NaN                   | NaN            | NaN |
| n = 0                | empty                     | 0              | 1 |
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from softmaxtheory import reference
from softmaxtheory.spec import Constant, LogLength, Polynomial
from tests.support.strategies_support import NEG_INF, assert_bitwise_equal

NAN = math.nan
INF = math.inf
DTYPES = (np.float64, np.float32, np.float16)
IN_DTYPES = (np.float64, np.float32, np.float16)
SCHEDULES = (None, Constant("2"), LogLength("1"), Polynomial(("1", "1"), "0.25"))


def run(name: str, x, dtype, schedule=None, entropy_eps=0.0):
    if name == "softmax":
        return reference.softmax(x, dtype=dtype)
    if name == "entropy":
        return reference.entropy(x, entropy_eps=entropy_eps, dtype=dtype)
    if name == "beta":
        return reference.beta(x, schedule=schedule, entropy_eps=entropy_eps, dtype=dtype)
    return reference.adaptive_softmax(x, schedule=schedule, entropy_eps=entropy_eps, dtype=dtype)


VECTOR = ("softmax", "adaptive_softmax")
FUNCS = ("softmax", "entropy", "beta", "adaptive_softmax")


# ---------------------------------------------------------------------------
# row 1: -inf entries are masked
# ---------------------------------------------------------------------------

MASKED_ROWS = [
    ([0.0, NEG_INF, 1.0], [0.0, 1.0]),
    ([NEG_INF, 3.0], [3.0]),
    ([NEG_INF, -2.0, NEG_INF, -2.0, NEG_INF], [-2.0, -2.0]),
    ([1.0, 0.0, -1.0, NEG_INF, 0.5, -0.5, 0.0], [1.0, 0.0, -1.0, 0.5, -0.5, 0.0]),
]


@pytest.mark.parametrize("func", FUNCS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize(("row", "unmasked"), MASKED_ROWS)
def test_minus_inf_is_masked(func, dtype, schedule, row, unmasked) -> None:
    got = run(func, np.array(row), dtype, schedule)
    short = run(func, np.array(unmasked), dtype, schedule)
    assert got.dtype == np.dtype(dtype)
    if func in VECTOR:
        keep = np.array(row) > -np.inf
        assert_bitwise_equal(got[keep], short)
        assert_bitwise_equal(got[~keep], np.zeros(int((~keep).sum()), dtype=dtype))  # +0.0
    else:
        assert_bitwise_equal(got, short)
        assert not np.isnan(got)


def test_masked_rows_known_values() -> None:
    got = reference.softmax([0.0, 0.0, NEG_INF, 0.0, 0.0]).tolist()
    assert got == [0.25, 0.25, 0.0, 0.25, 0.25]
    assert float(reference.entropy([NEG_INF, 5.0, NEG_INF])) == 0.0
    assert float(reference.beta([NEG_INF, 5.0, NEG_INF])) == 1.0
    assert float(reference.entropy([1.0, NEG_INF, 1.0])) == math.log(2)
    # LogLength counts unmasked items only: beta = log 2
    assert float(reference.beta([0.0, NEG_INF, 1.0], schedule=LogLength("1"))) == math.log(2)


# ---------------------------------------------------------------------------
# row 2: fully masked
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("func", FUNCS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("in_dtype", IN_DTYPES)
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("n", [1, 2, 5])
def test_fully_masked(func, dtype, in_dtype, schedule, n) -> None:
    x = np.full(n, NEG_INF, dtype=in_dtype)
    got = run(func, x, dtype, schedule, entropy_eps=1e-9 if n == 2 else 0.0)
    if func in VECTOR:
        assert_bitwise_equal(got, np.zeros(n, dtype=dtype))
    elif func == "entropy":
        assert_bitwise_equal(got, np.asarray(0.0, dtype=dtype))
    else:
        assert_bitwise_equal(got, np.asarray(1.0, dtype=dtype))


# ---------------------------------------------------------------------------
# row 3: NaN or +inf anywhere
# ---------------------------------------------------------------------------

INVALID_ROWS = [
    [NAN],
    [INF],
    [0.0, NAN],
    [INF, 1.0, 2.0],
    [INF, NEG_INF],
    [NAN, NEG_INF, NEG_INF],
    [INF, INF],
    [NAN, INF, 0.0],
    [1e308, -1e308, NAN],
]


@pytest.mark.parametrize("func", FUNCS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("row", INVALID_ROWS)
def test_nan_or_plus_inf_gives_nan(func, dtype, schedule, row) -> None:
    for in_dtype in IN_DTYPES:
        with np.errstate(over="ignore"):  # 1e308 becomes +inf in float16/32: still invalid
            x = np.array(row, dtype=in_dtype)
        got = run(func, x, dtype, schedule)
        assert got.dtype == np.dtype(dtype)
        assert got.shape == ((len(row),) if func in VECTOR else ())
        assert np.all(np.isnan(got)), (row, got)


@pytest.mark.parametrize("row", INVALID_ROWS[:5])
def test_mp_functions_special_rows(row) -> None:
    assert all(mpmath.isnan(v) for v in reference.softmax_mp(row))
    assert all(mpmath.isnan(v) for v in reference.adaptive_softmax_mp(row))
    assert mpmath.isnan(reference.entropy_mp(row))
    assert mpmath.isnan(reference.beta_mp(row))
    assert len(reference.softmax_mp(row)) == len(row)


def test_mp_functions_masked_and_empty() -> None:
    for row in ([NEG_INF], [NEG_INF, NEG_INF, NEG_INF]):
        assert reference.softmax_mp(row) == [0] * len(row)
        assert reference.adaptive_softmax_mp(row, schedule=Constant(3)) == [0] * len(row)
        assert reference.entropy_mp(row) == 0
        assert reference.beta_mp(row) == 1
        assert reference.beta_mp(row, schedule=LogLength("2")) == 1
    assert reference.softmax_mp([]) == []
    assert reference.adaptive_softmax_mp([]) == []
    assert reference.entropy_mp([]) == 0
    assert reference.beta_mp([]) == 1
    # masked entries in a regular row are exact zeros
    vals = reference.softmax_mp([0.0, NEG_INF, 0.0])
    assert vals[1] == 0 and vals[0] == vals[2] == mpmath.mpf(0.5)


# ---------------------------------------------------------------------------
# row 4: n = 0
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("func", FUNCS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(0,), (3, 0), (2, 2, 0), (1, 0)])
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_empty_rows(func, dtype, shape, schedule) -> None:
    got = run(func, np.zeros(shape), dtype, schedule)
    assert got.dtype == np.dtype(dtype)
    if func in VECTOR:
        assert got.shape == shape
    elif func == "entropy":
        assert_bitwise_equal(got, np.zeros(shape[:-1], dtype=dtype))
    else:
        assert_bitwise_equal(got, np.ones(shape[:-1], dtype=dtype))


@pytest.mark.parametrize("func", FUNCS)
def test_no_rows(func) -> None:
    """A batch with no rows at all: shape (0, n)."""
    got = run(func, np.zeros((0, 4)), np.float64)
    assert got.shape == ((0, 4) if func in VECTOR else (0,))


# ---------------------------------------------------------------------------
# batched arrays mixing special and regular rows
# ---------------------------------------------------------------------------

MIXED = np.array(
    [
        [
            [0.0, 1.0, 2.0, 3.0],
            [NEG_INF, NEG_INF, NEG_INF, NEG_INF],
            [0.0, NAN, 1.0, 2.0],
        ],
        [
            [0.5, NEG_INF, 0.5, -1.0],
            [INF, 0.0, 0.0, 0.0],
            [0.0, -0.8, -0.8, -700.0],
        ],
    ]
)


@pytest.mark.parametrize("func", FUNCS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("in_dtype", IN_DTYPES)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_batched_rows_are_independent(func, dtype, in_dtype, schedule) -> None:
    x = MIXED.astype(in_dtype)
    got = run(func, x, dtype, schedule)
    assert got.dtype == np.dtype(dtype)
    assert got.shape == (x.shape if func in VECTOR else x.shape[:-1])
    for idx in np.ndindex(x.shape[:-1]):
        assert_bitwise_equal(got[idx], run(func, x[idx], dtype, schedule), idx)
    # the expected kind of each row
    if func in VECTOR:
        assert_bitwise_equal(got[0, 1], np.zeros(4, dtype=dtype))
        assert np.all(np.isnan(got[0, 2])) and np.all(np.isnan(got[1, 1]))
        assert not np.any(np.isnan(got[0, 0])) and got[1, 0][1] == 0.0
    else:
        assert got[0, 1] == (0.0 if func == "entropy" else 1.0)
        assert np.isnan(got[0, 2]) and np.isnan(got[1, 1])
        assert not np.isnan(got[0, 0]) and not np.isnan(got[1, 2])


def test_batched_equals_rowwise_large_batch() -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(0, 3, (4, 5, 6))
    x[0, 0, :] = NEG_INF
    x[1, 2, 3] = NAN
    x[2, :, 0] = NEG_INF
    x[3, 4, 5] = INF
    got = reference.adaptive_softmax(x, dtype=np.float32)
    for idx in np.ndindex(x.shape[:-1]):
        assert_bitwise_equal(got[idx], reference.adaptive_softmax(x[idx], dtype=np.float32))


# ---------------------------------------------------------------------------
# other edges of the table
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_single_item_row(dtype) -> None:
    for v in (0.0, -5.0, 1e308, -1e308, 5e-324):
        assert_bitwise_equal(reference.softmax([v], dtype=dtype), np.ones(1, dtype=dtype))
        assert_bitwise_equal(reference.adaptive_softmax([v], dtype=dtype), np.ones(1, dtype=dtype))
        assert_bitwise_equal(reference.entropy([v], dtype=dtype), np.asarray(0.0, dtype=dtype))
        assert_bitwise_equal(reference.beta([v], dtype=dtype), np.asarray(1.0, dtype=dtype))


def test_signed_zero_logits_are_equal() -> None:
    assert reference.softmax([-0.0, 0.0]).tolist() == [0.5, 0.5]
    assert float(reference.entropy([-0.0, 0.0])) == math.log(2)


def test_integer_input_is_promoted_to_float64() -> None:
    for int_dtype in (np.int8, np.int32, np.int64, np.uint16):
        xi = np.array([[1, 2, 3], [0, 0, 7]], dtype=int_dtype)
        xf = xi.astype(np.float64)
        for func in FUNCS:
            got = run(func, xi, np.float64)
            assert_bitwise_equal(got, run(func, xf, np.float64))
    assert_bitwise_equal(reference.softmax([1, 2, 3]), reference.softmax([1.0, 2.0, 3.0]))


def test_default_output_dtype_is_float64_whatever_the_input() -> None:
    for in_dtype in IN_DTYPES:
        x = np.array([0.0, 1.0], dtype=in_dtype)
        for func in FUNCS:
            assert run(func, x, np.float64).dtype == np.float64
        assert reference.softmax(x).dtype == np.float64
        assert reference.entropy(x).dtype == np.float64


def test_low_precision_inputs_use_their_exact_values() -> None:
    x16 = np.array([0.1, 0.2, -3.0], dtype=np.float16)  # not the decimals: the float16 values
    assert_bitwise_equal(reference.softmax(x16), reference.softmax(x16.astype(np.float64)))
    x32 = np.array([0.1, 0.2, -3.0], dtype=np.float32)
    assert_bitwise_equal(reference.entropy(x32), reference.entropy(x32.astype(np.float64)))
    assert not np.array_equal(reference.softmax(x32), reference.softmax([0.1, 0.2, -3.0]))
