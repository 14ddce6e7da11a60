"""Certification runs in IEEE's default floating-point environment, whatever the caller's.

``torch.set_flush_denormal(True)`` (or a library built with ``-ffast-math``) sets the
FTZ/DAZ modes for the thread's later arithmetic. Before these tests the certified
reference then returned ``softmax([0, -730])`` as ``[1, 0]`` where the correctly rounded
answer is ``[1, 9.226315e-318]``, and the oracle passed a kernel that left the modes on.
"""

from __future__ import annotations

import struct
import subprocess
import sys
import warnings

import numpy as np
import pytest

from softmaxtheory import bounds, reference
from softmaxtheory._certify import environment
from softmaxtheory._certify.environment import (
    FloatEnvironmentError,
    flushes_subnormals,
    restore_gradual_underflow,
)

torch = pytest.importorskip("torch")

#: A row whose second coefficient is subnormal in float64 (9.226315e-318).
ROW = np.array([0.0, -730.0])


@pytest.fixture
def flushing():
    """This thread flushes subnormals for the test's duration (skip where torch cannot)."""
    if not torch.set_flush_denormal(True):
        pytest.skip("torch.set_flush_denormal is not supported on this CPU")
    try:
        assert flushes_subnormals()
        yield
    finally:
        torch.set_flush_denormal(False)
    assert not flushes_subnormals()


def test_gradual_underflow_by_default():
    assert not flushes_subnormals()
    got = reference.softmax(ROW)
    assert 0.0 < got[1] < np.finfo(np.float64).tiny
    assert struct.pack("<d", got[1]).hex() == struct.pack("<d", 9.226315e-318).hex()


def _dask_certified():
    da = pytest.importorskip("dask.array")
    from softmaxtheory.accelerated import dask as sd

    return sd.softmax(da.from_array(ROW), certified=True).compute(scheduler="sync")


CERTIFIED_CALLS = {
    "reference.softmax": lambda: reference.softmax(ROW),
    "reference.entropy": lambda: reference.entropy(ROW),
    "reference.beta": lambda: reference.beta(ROW),
    "reference.adaptive_softmax float16": lambda: reference.adaptive_softmax(ROW, dtype="f2"),
    "reference.softmax_mp": lambda: reference.softmax_mp(ROW),
    "reference.adaptive_attention": lambda: reference.adaptive_attention(
        np.ones((1, 2)), np.ones((2, 2)), np.ones((2, 1))
    ),
    "reference.StreamState": lambda: reference.StreamState().update(ROW).entropy(),
    # (arguments no other test computes: the bounds keep a cache of their values)
    "bounds.min_coefficient": lambda: bounds.min_coefficient(11, 719.25),
    "bounds.dispersion_size": lambda: bounds.dispersion_size(0.375, 3.125),
    "dask certified softmax": _dask_certified,
}


def _clear_bound_caches() -> None:
    """Forget the bounds' cached values (so that a value is computed, not looked up)."""
    for value in vars(bounds).values():
        getattr(value, "cache_clear", lambda: None)()


def _bits(value) -> list[str]:
    """The bits of each value, read without arithmetic (a conversion under DAZ reads a
    subnormal as 0)."""
    arr = np.asarray(value)
    if arr.dtype.kind == "f":
        return [arr.dtype.str, arr.tobytes().hex()]
    return [struct.pack("<d", float(v)).hex() for v in np.ravel(arr)]  # mpf values


@pytest.mark.parametrize("call", sorted(CERTIFIED_CALLS))
def test_every_certification_is_right_in_a_flushing_thread(call, flushing):
    """Certified code runs in IEEE's default environment and gives the values it gives there,
    bit for bit (the reference gave softmax([0, -730]) as [1, 0]); the caller's thread
    flushes again afterwards."""
    _clear_bound_caches()
    got = CERTIFIED_CALLS[call]()
    assert flushes_subnormals(), "the caller's modes were not restored"
    torch.set_flush_denormal(False)
    _clear_bound_caches()
    want = CERTIFIED_CALLS[call]()
    torch.set_flush_denormal(True)
    assert _bits(got) == _bits(want)


def test_without_fenv_a_flushing_thread_gets_the_error(flushing, monkeypatch):
    """Where the default environment cannot be set (not Linux x86-64 or AArch64), every
    certification raises FloatEnvironmentError instead of returning a flushed value."""
    monkeypatch.setattr(environment, "_fenv", lambda: None)
    _clear_bound_caches()
    for name, call in CERTIFIED_CALLS.items():
        if name.startswith("dask"):
            continue  # (the dask blocks are decorated as the rest; their import is optional)
        with pytest.raises(FloatEnvironmentError, match="flushes subnormal numbers to zero"):
            call()
    _clear_bound_caches()


#: fesetround's FE_UPWARD, per architecture (glibc)
_FE_UPWARD = {"x86_64": 0x800, "amd64": 0x800, "aarch64": 0x400000}


def test_every_certification_is_right_in_a_thread_rounding_upward():
    """A directed rounding mode (fesetround) breaks the double-double transformations;
    certified code and the kernels run rounding to nearest, and the thread rounds upward
    again after."""
    if environment._fenv() is None:
        pytest.skip("fesetenv is used on Linux x86-64 and AArch64 only")
    import ctypes
    import ctypes.util
    import platform

    libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
    calls = {**CERTIFIED_CALLS, **KERNEL_CALLS}
    want = {name: _bits(call()) for name, call in calls.items()}
    _clear_bound_caches()
    assert libm.fesetround(_FE_UPWARD[platform.machine().lower()]) == 0
    try:
        assert not environment.ieee_defaults()
        got = {name: _bits(call()) for name, call in calls.items()}
        assert not environment.ieee_defaults(), "the caller's rounding mode was not restored"
    finally:
        libm.fesetround(0)  # FE_TONEAREST
    assert environment.ieee_defaults()
    assert got == want


_COMPILED_UPWARD = """
import ctypes, ctypes.util, platform, sys
libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
assert libm.fesetround(int(sys.argv[1])) == 0
import softmaxtheory._certify.environment as env  # compiled now, rounding upward
libm.fesetround(0)
from softmaxtheory import reference
assert env.ieee_defaults()
print(reference.softmax([0.0, 1.0]).tolist())
"""


def test_the_environment_probes_hold_when_compiled_rounding_upward(tmp_path):
    """The probes of the rounding mode were folded by CPython at compile time: compiled
    while the CPU rounded upward, ``1.0 + 2.0**-52`` held 1 + 2**-51 (``2.0**-52`` came out
    a little above), in the module and in its cached bytecode, and every certified call
    raised FloatEnvironmentError ever after. They are written in hexadecimal now."""
    if environment._fenv() is None:
        pytest.skip("fesetenv is used on Linux x86-64 and AArch64 only")
    import os
    import platform

    env = {**os.environ, "PYTHONPYCACHEPREFIX": str(tmp_path)}  # a fresh compilation
    proc = subprocess.run(
        [sys.executable, "-c", _COMPILED_UPWARD, str(_FE_UPWARD[platform.machine().lower()])],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == str(reference.softmax([0.0, 1.0]).tolist())


#: 256 rows with subnormal coefficients in float64 and in float32, enough for every thread
#: to take some: half were computed by the calling thread (flushed) and half by Numba's
#: workers (not).
_BATCH = np.tile(np.array([0.0, -720.0, -730.0, -740.0, 1.5, -700.0, -90, -95, -100]), (256, 1))
_BATCH[::2] += np.random.default_rng(7).normal(0.0, 0.5, (128, 9))  # β > 1 on some rows
#: (inputs made here, not in the calls: a cast in a thread rounding upward rounds upward)
_BATCHES = {d: _BATCH.astype(d) for d in ("float64", "float32")}


def _stream():
    from softmaxtheory.accelerated import cpu

    s = cpu.StreamingSoftmax().update(_BATCH[1]).update(_BATCH[3, :3])
    if s.needs_tempered_pass:
        s.update_tempered(_BATCH[1]).update_tempered(_BATCH[3, :3])
    return [s.entropy(), s.beta(), *s.normalize(_BATCH[1])]


def _attention():
    from softmaxtheory.accelerated import cpu

    qk = np.ones((2, 8, 3))
    mask = np.tile([0.0, -720.0, -730.0, -740.0], (8, 2))
    v = np.zeros((2, 8, 2))
    v[:, mask[0] < 0] = 1e300  # values only where the weight is subnormal: outputs 2e-13
    return cpu.adaptive_attention(qk, qk, v, mask=mask)


def _dask(func, scheduler):
    def call():
        da = pytest.importorskip("dask.array")
        from softmaxtheory.accelerated import dask as sd

        x = da.from_array(_BATCHES["float32"], chunks=(64, 4))
        return getattr(sd, func)(x).compute(scheduler=scheduler)

    return call


def _cpu(func, dtype):
    def call():
        pytest.importorskip("numba")
        from softmaxtheory.accelerated import cpu

        return getattr(cpu, func)(_BATCHES[dtype])

    return call


_CPU_FUNCS = ("softmax", "entropy", "beta", "adaptive_softmax")
_DASK_FUNCS = ("softmax", "entropy", "adaptive_softmax")
KERNEL_CALLS = {
    **{f"cpu.{f} {d}": _cpu(f, d) for f in _CPU_FUNCS for d in ("float64", "float32")},
    "cpu.adaptive_attention": _attention,
    "cpu.StreamingSoftmax": _stream,
    **{f"dask {f} {s}": _dask(f, s) for f in _DASK_FUNCS for s in ("sync", "threads")},
}


@pytest.mark.parametrize("call", sorted(KERNEL_CALLS))
def test_the_kernels_give_the_default_environments_bits_in_a_flushing_thread(call, flushing):
    """The CPU and dask backends run in IEEE's default environment too: their bits do not
    depend on the thread that computes a row. A caller's flush-to-zero mode holds in its own
    thread only, so half the rows of a batch lost their subnormal coefficients and half
    kept them; the caller's thread flushes again afterwards."""
    got = KERNEL_CALLS[call]()
    assert flushes_subnormals(), "the caller's modes were not restored"
    torch.set_flush_denormal(False)
    want = KERNEL_CALLS[call]()
    torch.set_flush_denormal(True)
    if "softmax" in call and "Streaming" not in call:
        assert (want < np.finfo(want.dtype).tiny).any()  # subnormals to flush
    if "attention" in call:
        assert (want > 1e-13).all()
    assert _bits(got) == _bits(want)


def test_the_kernels_say_why_where_the_environment_cannot_be_set(flushing, monkeypatch):
    monkeypatch.setattr(environment, "_fenv", lambda: None)
    for name in ("cpu.softmax float64", "cpu.StreamingSoftmax", "dask softmax sync"):
        with pytest.raises(FloatEnvironmentError, match="would depend on the thread"):
            KERNEL_CALLS[name]()


def test_the_error_is_no_arithmetic_error():
    """The fallbacks from an undecided rounding catch ArithmeticError; none may catch this."""
    assert not issubclass(FloatEnvironmentError, ArithmeticError)
    assert reference.FloatEnvironmentError is FloatEnvironmentError


def test_restore_switches_flushing_off(flushing):
    assert restore_gradual_underflow()
    assert not flushes_subnormals()
    assert reference.softmax(ROW)[1] > 0.0


def test_a_check_in_a_flushing_thread_runs_in_the_default_environment(flushing, monkeypatch):
    """A correct kernel, checked while the thread flushes (its module set the modes at
    import, say): the properties run in the default environment and pass; where that
    environment cannot be set, they fail naming the cause."""
    from softmaxtheory import conformance as conf
    from tests.support.broken_kernels import softmax

    res = conf.run_property("values", conf.Target(softmax, "softmax"))
    assert res.status == "pass", res.message
    assert flushes_subnormals()
    monkeypatch.setattr(environment, "_fenv", lambda: None)
    res = conf.run_property("values", conf.Target(softmax, "softmax"))
    assert res.status == "fail"
    assert "flushes subnormal numbers to zero" in res.message


def test_the_flush_to_zero_repro_reproduces():
    """The repro the oracle prints for the catalogue's kernel shows the flush, in a process
    of its own (it leaves the modes on)."""
    from softmaxtheory import conformance as conf
    from tests.support.broken_kernels import torch_flush_to_zero

    target = conf.Target(
        torch_flush_to_zero,
        "tests.support.broken_kernels:torch_flush_to_zero",
        framework="torch",
        dtype="float32",
    )
    res = conf.run_property("values", target)
    assert not flushes_subnormals(), "the oracle switched the modes off again"
    assert res.status == "fail" and "switched on flush-to-zero" in res.message
    repro = res.message.split("repro:\n", 1)[1]
    out = subprocess.run(
        [sys.executable, "-c", repro], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    assert out.split() == ["1e-323", "0.0"]


def softmax_leaving_rounding_upward(x):
    """A right softmax that leaves the thread rounding upward (fesetround, not restored)."""
    import ctypes
    import ctypes.util
    import platform

    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    out = e / e.sum(axis=-1, keepdims=True)
    libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
    libm.fesetround(_FE_UPWARD[platform.machine().lower()])
    return out


def test_a_kernel_that_leaves_a_directed_rounding_mode_fails():
    """The check caught flush-to-zero left on but not a rounding mode left upward, which
    harms the caller alike (every later operation of the thread rounds up); it conformed.
    The oracle sets rounding to nearest again, and the repro shows the change."""
    if environment._fenv() is None:
        pytest.skip("fesetround is reached on Linux x86-64 and AArch64 only")
    from softmaxtheory import conformance as conf

    target = conf.Target(
        softmax_leaving_rounding_upward,
        "tests.test_float_environment:softmax_leaving_rounding_upward",
    )
    res = conf.run_property("values", target)
    assert environment.rounds_to_nearest(), "the oracle set rounding to nearest again"
    assert res.status == "fail" and "rounding mode to a directed one" in res.message
    repro = res.message.split("repro:\n", 1)[1]
    out = subprocess.run(
        [sys.executable, "-c", repro], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    assert out.split() == ["True", "False"]


#: A row with a subnormal logit: gradual underflow in the reference's float bounds.
SUBNORMAL_ROW = np.array([5e-324, 0.0, -1e-310])

RAISING_CALLS = {
    "reference.entropy": lambda: reference.entropy(SUBNORMAL_ROW),
    "reference.beta": lambda: reference.beta(SUBNORMAL_ROW),
    "reference.adaptive_softmax": lambda: reference.adaptive_softmax(SUBNORMAL_ROW),
    "reference.entropy_mp": lambda: reference.entropy_mp(SUBNORMAL_ROW),
    "reference.StreamState": lambda: reference.StreamState().update(SUBNORMAL_ROW).entropy(),
    "reference.adaptive_attention": lambda: reference.adaptive_attention(
        np.full((1, 2), 1e-160), np.full((3, 2), 1e-160), np.ones((3, 1))
    ),
    "bounds.spread_from_weights": lambda: bounds.spread_from_weights(
        np.eye(2) * 1e200, np.eye(2) * 1e200, 1e10
    ),
    "bounds.spread_from_weights, mixed magnitudes": lambda: bounds.spread_from_weights(
        np.array([[1e300, 1e-300], [1e-300, 1.0]]),
        np.array([[1e-300, 1.0], [1.0, 1e-310]]),
        1e-300,
        bias_q=np.array([1e-320, 1e-200]),
    ),
}


@pytest.mark.parametrize("call", sorted(RAISING_CALLS))
def test_a_callers_raising_error_state_changes_nothing(call):
    """``np.seterr(all="raise")`` (a common debugging setting) made the reference raise
    FloatingPointError on the gradual underflow of a subnormal logit's bound; the certified
    code now sets its own error state, and gives the same values."""
    want = RAISING_CALLS[call]()
    with np.errstate(all="raise"), warnings.catch_warnings():
        warnings.simplefilter("error")
        got = RAISING_CALLS[call]()
    np.testing.assert_array_equal(np.asarray(got, dtype=object), np.asarray(want, dtype=object))
