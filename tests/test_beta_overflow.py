"""A β beyond the float range: certified by the reference, no NaN from any backend.

A schedule can give a β that no float holds: a polynomial with coefficients near
the float maximum, a constant above 3.4e38 on float32 rows, Scalable-Softmax with a
huge ``s``. The exact β is still a finite real number. The reference certifies it
(it rounds to ``inf``) and the adaptive softmax it gives, which is the hard maximum
wherever the gaps below the maximum are not themselves tiny. Before, the reference's
error bound of the polynomial overflowed (``PrecisionError`` at every precision, or an
``OverflowError`` from a high power), and the CPU kernels formed ``inf * 0`` at the
maximum: NaN for every item.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from softmaxtheory import reference
from softmaxtheory.spec import Constant, LogLength, Polynomial

#: Found by the fuzz suite's random profile: P(H) of the row (0, 1, 2) lies 1e-16
#: (relatively) above the overflow threshold of float64.
FUZZ_COEFFICIENT = 9.810617056046503e307


def _cpu():
    """The Numba backend, or None without the ``cpu`` extra (``pytest -m cuda`` collects)."""
    try:
        from softmaxtheory.accelerated import cpu
    except ImportError:
        return None
    return cpu


HUGE = [
    Polynomial((FUZZ_COEFFICIENT, FUZZ_COEFFICIENT)),
    Polynomial((1e308, 1e308, 1e308)),
    LogLength(1.7e308),
    Constant(1e39),  # finite in float64, beyond float32
]

ROWS = [
    [0.0, 1.0, 2.0],
    [2.0, 0.0, 2.0, -np.inf, 1.5],  # ties at the maximum share it; -inf masked
    list(np.linspace(-40.0, 3.0, 5000)),  # longer than a block: the long-row passes
]


def _exact_beta(schedule: Polynomial, row: list[float], prec: int = 4000) -> float:
    """β of `row` by mpmath at `prec` bits, rounded to float64 (``inf`` past the range)."""
    with mpmath.workprec(prec):
        x = [mpmath.mpf(v) for v in row]
        m = max(x)
        e = [mpmath.exp(v - m) for v in x]
        s = mpmath.fsum(e)
        h = mpmath.log(s) - mpmath.fsum(w * (v - m) for w, v in zip(e, x, strict=True)) / s
        p = mpmath.mpf(0)
        for c in schedule.exact_coefficients:
            p = p * h + mpmath.mpf(c.numerator) / c.denominator
        theta = schedule.exact_threshold
        above = h > mpmath.mpf(theta.numerator) / theta.denominator
        beta = max(p, mpmath.mpf(1)) if above else mpmath.mpf(1)
        top = mpmath.mpf(np.finfo(np.float64).max)
        if beta >= top + mpmath.ldexp(1, 1023 - 53):  # the overflow threshold
            return math.inf
        return float(beta)


@pytest.mark.parametrize(
    ("coefficients", "row"),
    [
        ((FUZZ_COEFFICIENT, FUZZ_COEFFICIENT), [0.0, 1.0, 2.0]),
        ((1e308, 1e308, 1e308), [0.0, 1.0, 2.0]),
        ((-1e308, 1e308, 1e308), [0.0, 1.0, 2.0]),  # finite, near the maximum
        # H = log 100: H**500 is beyond the float range, P(H) is 4.2e31
        (("1e-300",) + ("0",) * 499 + ("2",), [0.0] * 100),
    ],
)
def test_reference_certifies_a_polynomial_beta_near_or_past_the_range(coefficients, row) -> None:
    schedule = Polynomial(coefficients)
    want = _exact_beta(schedule, row)
    assert reference.beta(np.array(row), schedule=schedule) == want
    assert reference.beta(np.array(row, dtype=np.float32), schedule=schedule) == want


@pytest.mark.parametrize("schedule", HUGE, ids=repr)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"n={len(r)}")
def test_cpu_and_dask_give_the_reference_hard_maximum(schedule, dtype, row) -> None:
    cpu = _cpu() or pytest.skip("numba (the cpu extra) is not installed")
    x = np.array(row, dtype=dtype)
    want = reference.adaptive_softmax(x, schedule=schedule)
    top = x == x.max()
    np.testing.assert_array_equal(want, np.where(top, 1.0 / top.sum(), 0.0).astype(dtype))
    np.testing.assert_array_equal(cpu.adaptive_softmax(x, schedule=schedule), want)
    batch = np.stack([x, x[::-1]])
    np.testing.assert_array_equal(
        cpu.adaptive_softmax(batch, schedule=schedule), np.stack([want, want[::-1]])
    )

    state = cpu.StreamingSoftmax(schedule=schedule, dtype=dtype)
    parts = np.array_split(x, 3)
    for part in parts:
        state.update(part)
    assert state.needs_tempered_pass
    for part in parts:
        state.update_tempered(part)
    np.testing.assert_array_equal(np.concatenate([state.normalize(p) for p in parts]), want)

    da = pytest.importorskip("dask.array")
    from softmaxtheory.accelerated import dask as sdask

    got = sdask.adaptive_softmax(da.from_array(x, chunks=max(1, x.size // 3)), schedule=schedule)
    np.testing.assert_array_equal(got.compute(), want)


@pytest.mark.parametrize(
    "row",
    [[1e-44, 0.0], [1e-37, 0.0, -1e-38], [3e-45] * 2 + [0.0] * 5000],
    ids=["subnormal gap", "normal gaps", "5002 items"],
)
def test_a_float32_beta_beyond_its_range_keeps_tiny_gaps(row) -> None:
    """Under ``Constant("1e300")`` a float32 row's β was clamped to 3.4e38, so items 1e-44
    apart (β times the gap: 1e256) were weighted nearly alike, [0.50000083, 0.49999917],
    where the exact weights are one-hot; the products now use the float64 β."""
    cpu = _cpu() or pytest.skip("numba (the cpu extra) is not installed")
    schedule = Constant("1e300")
    x = np.array(row, dtype=np.float32)
    want = reference.adaptive_softmax(x, schedule=schedule)
    assert want.max() >= 0.5 and np.count_nonzero(want) <= 2  # the top items only
    np.testing.assert_array_equal(cpu.adaptive_softmax(x, schedule=schedule), want)
    np.testing.assert_array_equal(cpu.adaptive_softmax(np.stack([x, x]), schedule=schedule)[1],
                                  want)  # fmt: skip
    state = cpu.StreamingSoftmax(schedule=schedule, dtype=np.float32).update(x)
    state.update_tempered(x)
    np.testing.assert_array_equal(state.normalize(x), want)
    q = np.array([[1e-22]], np.float32)
    k = np.array([[1e-22], [0.0]], np.float32)
    v = np.array([[1.0], [0.0]], np.float32)
    out = cpu.adaptive_attention(q, k, v, scale=1.0, schedule=schedule)
    np.testing.assert_array_equal(out, reference.adaptive_attention(q, k, v, scale=1.0,
                                                                    schedule=schedule))  # fmt: skip
    assert out.item() == 1.0


@pytest.mark.parametrize("schedule", HUGE, ids=repr)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_torch_gives_the_reference_hard_maximum(schedule, dtype) -> None:
    torch = pytest.importorskip("torch")
    from softmaxtheory.accelerated import torch as storch

    x = np.array([[0.0, 1.0, 2.0], [2.0, 0.0, 2.0]], dtype=dtype)
    want = reference.adaptive_softmax(x, schedule=schedule)
    got = storch.adaptive_softmax(torch.from_numpy(x), schedule=schedule)
    np.testing.assert_array_equal(got.numpy(), want)


@pytest.mark.parametrize("schedule", HUGE, ids=repr)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_attention_gives_the_reference_hard_maximum(schedule, dtype) -> None:
    rng = np.random.default_rng(7)
    q, k = (rng.standard_normal((2, 5, 8)).astype(dtype) for _ in range(2))
    v = rng.standard_normal((2, 5, 3)).astype(dtype)
    want = reference.adaptive_attention(q, k, v, schedule=schedule)
    # every query row picks one key: its output is that key's value, exactly
    assert np.isin(want, v).all()
    cpu = _cpu()
    if cpu is not None:
        np.testing.assert_array_equal(cpu.adaptive_attention(q, k, v, schedule=schedule), want)

    torch = pytest.importorskip("torch")
    from softmaxtheory.accelerated import torch as storch

    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
    for backend in ("composition", "chunked", "hybrid"):
        got = storch.adaptive_attention(tq, tk, tv, schedule=schedule, backend=backend)
        np.testing.assert_array_equal(got.numpy(), want, err_msg=backend)
