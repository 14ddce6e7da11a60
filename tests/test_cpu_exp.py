"""The CPU kernels' own exponential: ulp error against mpmath, special inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("numba")

from softmaxtheory.accelerated import _cpu_exp

# measured over every float32 in [-104, 0] and 200000 float64 samples (docs/performance.rst)
FLOAT32_BOUND = 1.0
FLOAT64_BOUND = 1.0


def test_float64_ulp_error_against_mpmath() -> None:
    worst, where = _cpu_exp.ulp_error_float64(samples=4000, seed=1)
    assert worst <= FLOAT64_BOUND, (worst, where)


def test_float32_ulp_error_on_a_lattice_of_every_float32() -> None:
    worst, where = _cpu_exp.ulp_error_float32(stride=4099)
    assert worst <= FLOAT32_BOUND, (worst, where)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_special_inputs(dtype) -> None:
    x = np.array([0.0, -0.0, -np.inf, np.nan, -1e-30, -2000.0], dtype=dtype)
    got = _cpu_exp.exp(x)
    assert got[0] == 1.0 and got[1] == 1.0
    assert got[2] == 0.0 and np.isnan(got[3])
    assert got[4] == 1.0 and got[5] == 0.0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_below_the_domain_the_result_is_plus_zero(dtype) -> None:
    """Below the lower end of the domain (``-inf`` too) the argument is replaced by the
    floor, where the reduction's scale is built from all-zero bits: +0, as the evaluation
    at the lower end gave, with no product underflowing (an underflow costs x86 a
    microcode assist). Just above the lower end: the rounded value."""
    from softmaxtheory.accelerated import _cpu_kernels as k

    lo = dtype(k._LO32 if dtype == np.float32 else k._LO64)
    floor = dtype(k._FLOOR32 if dtype == np.float32 else k._FLOOR64)
    kmin = 127 + 32 if dtype == np.float32 else 1023 + 64  # the scale is 2^(k + kmin)
    assert round(float(floor) / math.log(2)) == -kmin and floor < lo
    below = np.array([lo, np.nextafter(lo, dtype(-np.inf)), floor, 2 * lo, -1e30, -np.inf], dtype)
    got = _cpu_exp.exp(below)
    assert got.tolist() == [0.0] * 6 and not np.signbit(got).any()
    tiny = np.float32(1.4e-45) if dtype == np.float32 else 5e-324  # least subnormal
    x = np.array([-103.9, -87.5] if dtype == np.float32 else [-744.4, -708.5], dtype)
    got = _cpu_exp.exp(x)
    exact = np.exp(x.astype(np.float64)).astype(dtype)
    assert np.all(np.abs(got - exact) <= tiny) and np.all(got > 0)


def test_subnormal_results_are_rounded_once() -> None:
    x = np.array([-740.0, -744.0, -745.1])
    got = _cpu_exp.exp(x)
    for g, v in zip(got.tolist(), x.tolist(), strict=True):
        exact = math.exp(v)  # glibc: correctly rounded here
        assert abs(g - exact) <= 5e-324


def test_range_reduction_is_not_folded() -> None:
    """Near k ln2 / 2 a folded reduction (x - k ln2 in one step) loses bits: the
    two-part reduction keeps the error below one ulp there."""
    k = np.arange(1, 1070)
    x = -(k * math.log(2) / 2)
    got = _cpu_exp.exp(x)
    exact = np.exp(x)  # numpy's exp: below 1 ulp
    assert np.max(np.abs(got - exact) / np.spacing(exact)) <= 2.0


def test_rejects_other_dtypes() -> None:
    with pytest.raises(TypeError, match="float32 or float64"):
        _cpu_exp.exp(np.zeros(3, dtype=np.float16))
