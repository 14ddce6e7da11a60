r"""Numba kernels of :mod:`softmaxtheory.accelerated.cpu` (private).

Everything numerical lives in this one module so that Numba's on-disk cache
(``cache=True``), which is keyed on the source file of each function, can never
mix code from two versions.

Floating-point discipline
-------------------------
* The exponentials :func:`exp64` and :func:`exp32` are compiled with
  ``fastmath={"contract"}`` only: fused multiply-adds are allowed (they make the
  Cody-Waite reduction and the polynomial *more* accurate), reassociation is not,
  so the round-to-integer trick ``(y + 1.5·2^52) − 1.5·2^52`` and the two-part
  reduction ``(y − k·ln2_hi) − k·ln2_lo`` are kept as written.
* The loops that call them are compiled with ``{"reassoc", "contract", "arcp",
  "nsz"}``: sums may be reordered (that is what lets them vectorise), NaN and
  infinities keep their IEEE meaning (no ``nnan``/``ninf``). Fast-math flags are
  attached per instruction, so after inlining the exponential's instructions still
  carry none of the loop's flags.
* Every function with fast-math flags is compiled with ``forceinline=True``: LLVM
  inlines it into each caller, so no kernel calls it through a symbol. Through a symbol
  a kernel ran whichever copy the process had loaded first (the helper's own, or the
  copy inside the kernel's cached code, optimised again and with its reassociated sums
  ordered otherwise), and a program's first run gave other bits than its later runs
  (``tests/test_cpu_regressions.py::test_bits_do_not_depend_on_the_process_history``).
* A row's maximum is taken without counting its NaNs (:func:`row_max`, classified by
  :func:`max_kind`): a NaN reaches the row's sums (the clamps before an exponential
  keep it) and makes them NaN, the kernels' test for an invalid row; a row whose
  maximum is ``-inf`` is scanned with :func:`any_nan`, since a NaN with its sign bit
  set orders below ``-inf``.
* Sums are blocked: :data:`BLOCK` items are summed by the vectorised loop, and the
  block sums are added with Neumaier's compensated summation in a flag-free
  helper.
* The β of a polynomial schedule is evaluated with the same Horner recurrence,
  from zero and without contraction, as :func:`numpy.polyval`, so it is bitwise
  what :meth:`softmaxtheory.spec.Polynomial.beta_float` gives for the same
  entropy.
"""

from __future__ import annotations

import functools
import math
import os
import threading
import types as _pytypes
from typing import Any

import numba
import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.extending import intrinsic, overload

from .._formats import ROW_EMPTY, ROW_INVALID, ROW_MASKED, ROW_REGULAR
from ._numba_cache import njit  # numba.njit with a cache safe between processes
from ._openmp import load_torch_openmp

__all__: list[str] = []

#: torch's own OpenMP runtime, loaded before any kernel can start Numba's threads (the
#: path; None where that does not apply): see :mod:`._openmp`
TORCH_OPENMP = load_torch_openmp()


BLOCK = 1024
CHUNK = 1 << 16

_EXP_FLAGS = {"contract"}
_LOOP_FLAGS = {"reassoc", "contract", "arcp", "nsz"}

# schedule codes
SCHED_POLY = 0
SCHED_CONST = 1


@intrinsic
def _bits64(typingctx, x):
    sig = types.int64(types.float64)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))

    return sig, codegen


@intrinsic
def _float64_from_bits(typingctx, x):
    sig = types.float64(types.int64)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return sig, codegen


@intrinsic
def _bits32(typingctx, x):
    sig = types.int32(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return sig, codegen


@intrinsic
def _float32_from_bits(typingctx, x):
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


# ---------------------------------------------------------------------------
# exponentials on (-inf, 0] (and NaN)
# ---------------------------------------------------------------------------

_SHIFT64 = 6755399441055744.0  # 1.5 * 2**52
_LOG2E64 = 1.4426950408889634
_LN2HI64 = 6.93147180369123816490e-01  # 0x3FE62E42FEE00000: 21 trailing zero bits
_LN2LO64 = 1.90821492927058770002e-10
_SHIFT_BITS64 = 0x4338000000000000
_TWO_M64 = 5.421010862427522e-20  # 2**-64
#: Lower end of exp64's domain: e^-746 is below half the least subnormal, exp64 gives 0 there.
_LO64 = -746.0
#: What an argument below the domain is replaced by: -1087 ln 2, where the reduction's
#: k is -1087 and the scale 2^(k + 1087) is built from all-zero bits, +0, so that the
#: result is +0 with no product underflowing. Evaluated at _LO64 instead, the last multiply
#: underflowed, which costs a microcode assist on x86 (flush-to-zero is off): rows half
#: of whose items were masked (-inf) took 5 to 13 times as long as dense ones.
_FLOOR64 = -1087 * 0.6931471805599453


@njit(fastmath=_EXP_FLAGS, forceinline=True, cache=True)
def exp64(x: float) -> float:
    r""":math:`e^x` for float64 ``x <= 0`` (NaN in, NaN out; ``-inf`` gives 0).

    Cody-Waite reduction :math:`x = k \ln 2 + r`, :math:`|r| \le \ln 2 / 2`,
    degree-13 Taylor polynomial, scaling by :math:`2^{k+64}` then
    :math:`2^{-64}` (one rounding for subnormal results). Positive ``x`` is
    outside the domain and clamped to 0; below it (``-inf`` too) ``x`` is replaced
    by :data:`_FLOOR64`, where the result is 0 with no underflow.
    """
    y = _FLOOR64 if x < _LO64 else x
    y = 0.0 if y > 0.0 else y
    return exp64_core(y)


@njit(fastmath=_EXP_FLAGS, forceinline=True, cache=True)
def exp64_core(y: float) -> float:
    """:func:`exp64` of ``y`` in ``[_FLOOR64, 0]`` (or NaN), without clamping it there."""
    z = y * _LOG2E64 + _SHIFT64
    k = z - _SHIFT64
    r = (y - k * _LN2HI64) - k * _LN2LO64
    p = 1.6059043836821613e-10  # 1/13!
    p = p * r + 2.08767569878681e-09
    p = p * r + 2.505210838544172e-08
    p = p * r + 2.755731922398589e-07
    p = p * r + 2.755731922398589e-06
    p = p * r + 2.48015873015873e-05
    p = p * r + 0.0001984126984126984
    p = p * r + 0.001388888888888889
    p = p * r + 0.008333333333333333
    p = p * r + 0.041666666666666664
    p = p * r + 0.16666666666666666
    p = p * r + 0.5
    p = p * r + 1.0
    p = p * r + 1.0
    ki = _bits64(z) - _SHIFT_BITS64
    scale = _float64_from_bits((ki + (1023 + 64)) << 52)
    return (p * scale) * _TWO_M64


_SHIFT32 = np.float32(12582912.0)  # 1.5 * 2**23
_LOG2E32 = np.float32(1.4426950408889634)
_LN2HI32 = np.float32(0.693359375)  # 355/512, 9 significant bits
_LN2LO32 = np.float32(-2.12194440e-4)
_SHIFT_BITS32 = 0x4B400000
_TWO_M32 = np.float32(2.3283064365386963e-10)  # 2**-32
#: Coefficients of q in e^r ~ 1 + r + r^2 q(r), |r| <= ln2/2 (q of degree 4, lowest first),
#: fitted here by iteratively reweighted least squares on Chebyshev nodes to minimise
#: the relative error (3.1e-9, 0.05 float32 ulp, before rounding), then rounded to float32.
_Q32 = (
    np.float32(0.49999994),
    np.float32(0.16666521),
    np.float32(0.04166839),
    np.float32(0.00836875),
    np.float32(0.00138145),
)
#: Lower end of exp32's domain: e^-104 is below half the least subnormal, exp32 gives 0 there.
_LO32 = np.float32(-104.0)
#: As :data:`_FLOOR64`: -159 ln 2, where the scale 2^(k + 159) is +0
_FLOOR32 = np.float32(-159 * 0.6931471805599453)
_ZERO32 = np.float32(0.0)
_ONE32 = np.float32(1.0)


@njit(fastmath=_EXP_FLAGS, forceinline=True, cache=True)
def exp32(x: np.float32) -> np.float32:
    r""":math:`e^x` for float32 ``x <= 0``, computed in float32.

    Same scheme as :func:`exp64` with a two-part :math:`\ln 2` of 9 + 24 bits and
    a degree-6 polynomial :math:`1 + r + r^2 q(r)` whose quartic :math:`q` was fitted
    for the least relative error (:data:`_Q32`).
    """
    y = _FLOOR32 if x < _LO32 else x
    y = _ZERO32 if y > _ZERO32 else y
    return exp32_core(y)


@njit(fastmath=_EXP_FLAGS, forceinline=True, cache=True)
def exp32_core(y: np.float32) -> np.float32:
    """:func:`exp32` of ``y`` in ``[_FLOOR32, 0]`` (or NaN), without clamping it there."""
    z = y * _LOG2E32 + _SHIFT32
    k = z - _SHIFT32
    r = (y - k * _LN2HI32) - k * _LN2LO32
    q = _Q32[4]
    q = q * r + _Q32[3]
    q = q * r + _Q32[2]
    q = q * r + _Q32[1]
    q = q * r + _Q32[0]
    p = q * r + _ONE32
    p = p * r + _ONE32  # 1 + r + r^2 q(r)
    ki = _bits32(z) - np.int32(_SHIFT_BITS32)
    scale = _float32_from_bits((ki + np.int32(127 + 32)) << np.int32(23))
    return (p * scale) * _TWO_M32


def fexp(x):  # pragma: no cover - replaced by the overload in jitted code
    """Dtype-preserving exponential (the overload picks :func:`exp32`/:func:`exp64`)."""
    raise NotImplementedError


@overload(fexp)
def _ol_fexp(x):
    if x == types.float32:
        return lambda x: exp32(x)
    if x == types.float64:
        return lambda x: exp64(x)
    return None


def fexp_core(y):  # pragma: no cover - replaced by the overload in jitted code
    """:func:`fexp` of ``y`` in ``[floor, 0]`` (:func:`exp_bounds_like`) or NaN (no clamps)."""
    raise NotImplementedError


@overload(fexp_core)
def _ol_fexp_core(y):
    if y == types.float32:
        return lambda y: exp32_core(y)
    if y == types.float64:
        return lambda y: exp64_core(y)
    return None


def exp_bounds_like(v):  # pragma: no cover - replaced by the overload in jitted code
    """``(low, floor)`` of the exponential in the type of `v`.

    `low` is the lower end of its domain (its result is 0 there), `floor` what an
    argument below it is replaced by (:data:`_FLOOR64`).
    """
    raise NotImplementedError


@overload(exp_bounds_like)
def _ol_exp_bounds_like(v):
    if v == types.float32:
        return lambda v: (_LO32, _FLOOR32)
    return lambda v: (_LO64, _FLOOR64)


def as_like(v, like):  # pragma: no cover - replaced by the overload in jitted code
    """Convert the float64 `v` to the type of `like`."""
    raise NotImplementedError


@overload(as_like)
def _ol_as_like(v, like):
    if like == types.float32:
        return lambda v, like: np.float32(v)
    return lambda v, like: np.float64(v)


_F32_MAX = float(np.finfo(np.float32).max)
_F64_MAX = float(np.finfo(np.float64).max)


def beta_like(beta, like):  # pragma: no cover - replaced by the overload in jitted code
    r"""Convert the float64 β to the type of `like`, at most that type's largest finite value.

    A β beyond the range (a float64 β that overflowed to ``inf``, a float32 row's
    β above 3.4e38) stands for a finite exact β: :math:`\beta\,(x_i - m)` must be 0
    at the maximum, not ``inf * 0 = NaN``, and below it the clamped product still
    underflows :math:`e^{\beta(x_i-m)}` to 0 wherever :math:`x_i - m` is not itself
    of the order of the least normal number.
    """
    raise NotImplementedError


@overload(beta_like)
def _ol_beta_like(beta, like):
    if like == types.float32:
        return lambda beta, like: np.float32(min(beta, _F32_MAX))
    return lambda beta, like: np.float64(min(beta, _F64_MAX))


@njit(cache=True)
def exp_array(x, out):
    """Apply the kernel exponential element-wise (for tests and measurement)."""
    for i in range(x.size):
        out[i] = fexp(x[i])


#: β below these bounds takes the careful tempered passes (:func:`small_beta_like`)
_SMALL_BETA64 = 2.0**-1010
_SMALL_BETA32 = 2.0**-120


def small_beta_like(arr):  # pragma: no cover - replaced by the overload in jitted code
    r"""The β below which a tempered pass over `arr` takes the careful path.

    The vectorised passes form :math:`\beta\,(x - m)` in the row's dtype and give weight
    0 to an item whose shift ``x - m`` is ``-inf``: a masked item, or a finite one whose
    shift overflowed (``x = -1e308``, ``m = 1e308``). For β at least this bound both
    are exact: an overflowed shift has :math:`|x - m|` above the format's largest value
    (about :math:`2^{1024}`, :math:`2^{128}`), so :math:`\beta\,|x - m| \ge 2^{14}`
    (:math:`2^{8}` in float32) and the weight underflows to 0 in any case; and β is a
    normal number of the row's format (no precision lost converting a float32 row's β).
    Below it -- a β that rounded to 0 or is subnormal (``Constant("1e-400")``) -- the
    product :math:`0 \cdot (-\infty)` would be NaN and an overflowed shift's weight is
    not 0 (:math:`\beta = 10^{-310}`: :math:`e^{-0.02}`), so :func:`tempered_small` and
    :func:`write_small` compute each exponent with :func:`tempered_exponent` instead.
    """
    raise NotImplementedError


@overload(small_beta_like)
def _ol_small_beta_like(arr):
    if arr.dtype == types.float32:
        return lambda arr: _SMALL_BETA32
    return lambda arr: _SMALL_BETA64


def careful_beta(beta, arr):  # pragma: no cover - replaced by the overload in jitted code
    r"""Whether a tempered pass over `arr` with `beta` takes the careful float64 path.

    Below :func:`small_beta_like`, and for a float32 row above its largest finite value:
    there the vectorised passes form :math:`\beta\,(x - m)` with β clamped to 3.4e38,
    which is exact only where :math:`|x - m|` is not itself tiny. A float32 row with
    items :math:`10^{-44}` apart under ``Constant("1e300")`` came out near uniform where
    the exact weights are one-hot (:math:`\beta\,(x_0 - x_1) = 10^{256}`); the careful
    path forms the product with the float64 β. (A float64 β that overflowed enters as
    the largest float64: exact wherever :math:`1.8 \cdot 10^{308}\,|x - m|` and the exact
    product both exceed 745, that is, unless the gap is subnormal.)
    """
    raise NotImplementedError


@overload(careful_beta)
def _ol_careful_beta(beta, arr):
    if arr.dtype == types.float32:
        return lambda beta, arr: beta < small_beta_like(arr) or beta > _F32_MAX
    return lambda beta, arr: beta < small_beta_like(arr)


@njit(cache=True)
def tempered_exponent(x, m, beta):
    r""":math:`\beta\,(x - m)` in float64 for an item `x` of a row of finite maximum `m`.

    ``-inf`` for a masked item (``x = -inf``) whatever β, 0 included (a masked item
    has weight 0: ``0 * -inf`` would be NaN). An unmasked item whose shift ``x - m``
    overflows (so :math:`x < 0 < m`) gets :math:`\beta x - \beta m`: two terms of one
    sign, no cancellation, finite for :math:`\beta \le 1`; 0 when β is 0. Flag-free:
    no fast-math reassociation folds it back into ``β * (x - m)``. For ``β >= 0``;
    the result is at most 0.
    """
    if x == -np.inf:
        return -np.inf
    d = x - m
    if d > -np.inf:
        return beta * d
    return beta * x - beta * m


@njit(cache=True)
def tempered_small(x, lo, hi, m, beta, out, store):
    r""":math:`\sum e^{\beta(x-m)}` over ``x[lo:hi]`` for a β of :func:`careful_beta`.

    Every exponent from :func:`tempered_exponent`, the float64 β (not rounded to a
    float32 row's format) and the exponential in float64, summed with Neumaier's
    compensation; stored in `out` (in its dtype) if asked. A slow path: only a β that
    is 0 or nearly so (a rounded-to-0 ``Constant``), or beyond a float32 row's range,
    takes it.
    """
    m64 = np.float64(m)
    s = 0.0
    sc = 0.0
    for i in range(lo, hi):
        e = exp64(tempered_exponent(np.float64(x[i]), m64, beta))
        if store:
            out[i] = like_array(e, out)
        s, sc = _neumaier(s, sc, e)
    return s + sc


@njit(cache=True)
def write_small(x, lo, hi, m, beta, inv, out):
    r"""``out = e^(β(x-m)) * inv`` over ``[lo, hi)`` for a β of :func:`careful_beta`.

    The exponents of :func:`tempered_small`; each product formed in float64 and
    rounded once to the dtype of `out`.
    """
    m64 = np.float64(m)
    for i in range(lo, hi):
        e = exp64(tempered_exponent(np.float64(x[i]), m64, beta))
        out[i] = like_array(e * inv, out)


# ---------------------------------------------------------------------------
# flag-free helpers
# ---------------------------------------------------------------------------


@njit(cache=True)
def _neumaier(total, comp, value):
    """One step of Neumaier's compensated summation: return (total, comp)."""
    t = total + value
    if abs(total) >= abs(value):
        comp += (total - t) + value
    else:
        comp += (value - t) + total
    return t, comp


@njit(cache=True)
def beta_poly(h, coeffs, threshold):
    """β of a polynomial schedule, bitwise as ``Polynomial.beta_float``."""
    if h != h:
        return np.nan
    p = 0.0
    for c in coeffs:
        p = p * h + c
    if h > threshold:
        return p if p > 1.0 else (1.0 if p == p else p)
    return 1.0


@njit(cache=True)
def entropy_from_state(c, r, t):
    r"""Entropy :math:`H = \log c + \operatorname{log1p}(r/c) - t/s`, :math:`s = c + r`.

    `c` counts the items at the maximum, `r` sums :math:`e^{x-m}` over the others and
    `t \le 0` sums :math:`e^{x-m}(x-m)`: three non-negative terms, no cancellation.
    """
    s = c + r
    return math.log(c) + math.log1p(r / c) - t / s


# ---------------------------------------------------------------------------
# passes over x[lo:hi] (vectorised, reassociating)
# ---------------------------------------------------------------------------


def order_key(v):  # pragma: no cover - replaced by the overload in jitted code
    """A signed integer with the order of the float `v` (its bits, negatives flipped)."""
    raise NotImplementedError


@overload(order_key)
def _ol_order_key(v):
    if v == types.float32:

        def key32(v):
            b = _bits32(v)
            return np.int32(b ^ ((b >> np.int32(31)) & np.int32(0x7FFFFFFF)))

        return key32
    if v == types.float64:

        def key64(v):
            b = _bits64(v)
            return b ^ ((b >> 63) & 0x7FFFFFFFFFFFFFFF)

        return key64
    return None


@njit(cache=True)
def _unkey32(k):
    k = np.int32(k)
    return _float32_from_bits(np.int32(k ^ ((k >> np.int32(31)) & np.int32(0x7FFFFFFF))))


@njit(cache=True)
def _unkey64(k):
    return _float64_from_bits(k ^ ((k >> 63) & 0x7FFFFFFFFFFFFFFF))


def unkey(k, arr):  # pragma: no cover - replaced by the overload in jitted code
    """Inverse of :func:`order_key`."""
    raise NotImplementedError


@overload(unkey)
def _ol_unkey(k, arr):
    if arr.dtype == types.float32:
        return lambda k, arr: _unkey32(k)
    return lambda k, arr: _unkey64(k)


def like_array(v, arr):  # pragma: no cover - replaced by the overload in jitted code
    """Convert the scalar `v` to the dtype of `arr`.

    The row maximum arrives as float64 from tuples that also carry ``-inf``/NaN;
    converting it back (exactly: it is a value of the array) keeps the passes of a
    float32 row in float32, twice the vector width of float64.
    """
    raise NotImplementedError


@overload(like_array)
def _ol_like_array(v, arr):
    if arr.dtype == types.float32:
        return lambda v, arr: np.float32(v)
    return lambda v, arr: np.float64(v)


def _neg_inf_like(arr):  # pragma: no cover - replaced by the overload in jitted code
    raise NotImplementedError


@overload(_neg_inf_like)
def _ol_neg_inf_like(arr):
    if arr.dtype == types.float32:
        return lambda arr: np.float32(-np.inf)
    return lambda arr: -np.inf


@njit(fastmath=_LOOP_FLAGS, forceinline=True, cache=True)
def _row_nonfinite(x, i, j):
    # the sum of x * 0 over the row: ±0 if every entry is finite, else NaN (whatever
    # the order of summation; without nnan/ninf neither the product nor the test goes)
    zero = like_array(0.0, x)
    acc = zero
    for k in range(x.shape[2]):
        acc += x[i, j, k] * zero
    return acc != acc


@njit(parallel=True, cache=True)
def rows_nonfinite(x, out):
    """``out[i, j]``: whether the row ``x[i, j, :]`` holds a NaN or an infinity.

    One pass over `x` with no temporary (numpy's ``~isfinite(x).all(axis=2)`` writes a
    bool array the size of `x` first: for the keys and values of a decoding step, 2048
    slices of 128 × 64, it took longer than the attention kernels). A finite entry times
    0 is ±0 and a NaN or infinite one gives NaN, so the sum of ``x * 0`` over a row is
    NaN exactly when one of its entries is not finite, in any order of summation: the
    reassociating flags of :func:`_row_nonfinite`, without ``nnan``/``ninf``, drop
    neither the product nor the NaN test.
    """
    rows, cols = out.shape
    for p in prange(rows * cols):
        i = p // cols
        j = p - i * cols
        out[i, j] = _row_nonfinite(x, i, j)


@njit(cache=True)
def pass_max(x, lo, hi):
    """Return (maximum, number of NaNs) of ``x[lo:hi]``, ``-inf`` when empty.

    The maximum is taken over integer order keys of the bits (an integer
    reduction vectorises without fast-math flags); a NaN with the sign bit
    clear would be the maximum, a negative one is below ``-inf``: both are
    counted separately, and the caller treats any NaN as an invalid row.
    """
    xs = x[lo:hi]
    k = order_key(_neg_inf_like(xs))
    nnan = 0
    for i in range(xs.size):
        v = xs[i]
        kv = order_key(v)
        k = kv if kv > k else k
        nnan += 1 if v != v else 0
    return unkey(k, xs), nnan


@njit(forceinline=True, cache=True)
def row_max(xs):
    """Return the maximum of `xs` (``-inf`` when empty), counting no NaNs.

    :func:`pass_max` without its NaN count, which cost as much again as the
    maximum on 64-item rows. A NaN with the sign bit clear is the maximum; one with
    it set is below ``-inf`` and missed: a caller finds it in its sums (a NaN item
    makes :math:`x - m`, its exponential and the sum NaN) or, for a row whose
    maximum is ``-inf``, with :func:`any_nan`.
    """
    k = order_key(_neg_inf_like(xs))
    for i in range(xs.size):
        kv = order_key(xs[i])
        k = kv if kv > k else k
    return unkey(k, xs)


@njit(forceinline=True, cache=True)
def any_nan(xs):
    """Whether `xs` holds a NaN (for the rare rows :func:`row_max` cannot settle)."""
    found = False
    for i in range(xs.size):
        found = found or xs[i] != xs[i]
    return found


@njit(forceinline=True, cache=True)
def max_kind(m, xs):
    """The row code of `xs` from its :func:`row_max` `m`, before its sums are formed.

    ``ROW_MASKED`` for a maximum of ``-inf`` with no NaN below it (only these rows
    are scanned, with :func:`any_nan`), ``ROW_INVALID`` for a NaN or ``+inf``
    maximum or a NaN below ``-inf``, else ``ROW_REGULAR``: a NaN whose sign bit is
    set may still be in that row, and the caller's sums find it.
    """
    if m == -np.inf:
        return ROW_INVALID if any_nan(xs) else ROW_MASKED
    return ROW_REGULAR if m == m and m != np.inf else ROW_INVALID


@njit(fastmath=_LOOP_FLAGS, forceinline=True, cache=True)
def _block_stats(x, lo, hi, m, out, store):
    # accumulate in the input's precision within a block (float32 keeps 16 lanes)
    m = like_array(m, x)
    zero = as_like(0.0, m)
    one = as_like(1.0, m)
    c = zero  # counts kept as floats (exact below 2**24): integer lanes would halve the width
    n_eff = zero
    r = zero
    t = zero
    xs = x[lo:hi]
    os = out[lo:hi]
    # an item is unmasked when x > -inf; its shift d = x - m may still overflow to -inf
    # (x = -1e308, m = 1e308): e = 0 and its term of t is 0, but it counts in n_eff
    ninf = as_like(-np.inf, m)
    if store:
        for i in range(xs.size):
            d = xs[i] - m
            e = fexp(d)
            os[i] = e
            r += zero if d == zero else e  # d <= 0; a NaN item makes r NaN
            t += e * (d if d > ninf else zero)
            c += one if d == zero else zero
            n_eff += one if xs[i] > ninf else zero
    else:
        for i in range(xs.size):
            d = xs[i] - m
            e = fexp(d)
            r += zero if d == zero else e
            t += e * (d if d > ninf else zero)
            c += one if d == zero else zero
            n_eff += one if xs[i] > ninf else zero
    return np.int64(c), np.int64(n_eff), np.float64(r), np.float64(t)


@njit(cache=True)
def pass_stats(x, lo, hi, m, out, store):
    """Return (c, n_eff, r, t) of ``x[lo:hi]`` about `m`; optionally store e^(x-m) in `out`.

    `c`: items equal to `m`; `n_eff`: items above ``-inf``; `r`: sum of e^(x-m) over
    items below `m`; `t`: sum of e^(x-m)(x-m). Blocks of :data:`BLOCK` are summed
    vectorised; block sums are added with Neumaier's compensation. A NaN item makes
    `r` NaN (the callers' test for a NaN that :func:`row_max` missed).
    """
    c = 0
    n_eff = 0
    r = 0.0
    rc = 0.0
    t = 0.0
    tc = 0.0
    for b in range(lo, hi, BLOCK):
        bc, bn, br, bt = _block_stats(x, b, min(b + BLOCK, hi), m, out, store)
        c += bc
        n_eff += bn
        r, rc = _neumaier(r, rc, br)
        t, tc = _neumaier(t, tc, bt)
    return c, n_eff, r + rc, t + tc


@njit(fastmath=_LOOP_FLAGS, forceinline=True, cache=True)
def _block_st(x, lo, hi, m, out):
    # the lean statistics of the adaptive kernel: s = sum e, t = sum e*(x-m), e stored
    m = like_array(m, x)
    zero = as_like(0.0, m)
    s = zero
    t = zero
    xs = x[lo:hi]
    os = out[lo:hi]
    for i in range(xs.size):
        d = xs[i] - m
        e = fexp(d)
        os[i] = e
        s += e
        t += e * (d if d > -np.inf else zero)
    return np.float64(s), np.float64(t)


@njit(cache=True)
def pass_st(x, lo, hi, m, out):
    r"""Return (s, t) of ``x[lo:hi]`` about `m` and store :math:`e^{x-m}` in `out`.

    :math:`s = \sum e^{x-m}` and :math:`t = \sum e^{x-m}(x-m)`, blocked like
    :func:`pass_stats`; the maximum's own terms are not separated out, which the
    adaptive kernel can afford (see :func:`rows_adaptive`).
    """
    if hi - lo <= BLOCK:
        return _block_st(x, lo, hi, m, out)
    s = 0.0
    sc = 0.0
    t = 0.0
    tc = 0.0
    for b in range(lo, hi, BLOCK):
        bs, bt = _block_st(x, b, min(b + BLOCK, hi), m, out)
        s, sc = _neumaier(s, sc, bs)
        t, tc = _neumaier(t, tc, bt)
    return s + sc, t + tc


@njit(fastmath=_LOOP_FLAGS, forceinline=True, cache=True)
def _block_tempered(x, lo, hi, m, beta, out, store):
    m = like_array(m, x)
    zero = as_like(0.0, m)
    s = zero
    xs = x[lo:hi]
    os = out[lo:hi]
    b = beta_like(beta, m)
    ninf = as_like(-np.inf, m)
    # a masked item stays -inf whatever β: with β = 0 (LogLength on a row with one
    # unmasked item) the product 0 * -inf would be NaN
    if store:
        for i in range(xs.size):
            d = xs[i] - m
            e = fexp(b * d if d > ninf else ninf)
            os[i] = e
            s += e
    else:
        for i in range(xs.size):
            d = xs[i] - m
            s += fexp(b * d if d > ninf else ninf)
    return np.float64(s)


@njit(cache=True)
def pass_tempered(x, lo, hi, m, beta, out, store):
    """Return (0, s): s sums the tempered exponentials e^(β(x-m)) (stored in `out` if asked).

    A β of :func:`careful_beta` takes :func:`tempered_small`.
    """
    if careful_beta(beta, x):
        return 0, tempered_small(x, lo, hi, m, min(beta, _F64_MAX), out, store)
    if hi - lo <= BLOCK:
        return 0, _block_tempered(x, lo, hi, m, beta, out, store)
    s = 0.0
    sc = 0.0
    for b in range(lo, hi, BLOCK):
        s, sc = _neumaier(s, sc, _block_tempered(x, b, min(b + BLOCK, hi), m, beta, out, store))
    return 0, s + sc


@njit(fastmath=_LOOP_FLAGS, forceinline=True, cache=True)
def pass_scale(out, lo, hi, inv):
    """``out[lo:hi] *= inv``, the product formed in float64 and rounded once."""
    os = out[lo:hi]
    for i in range(os.size):
        os[i] = as_like(np.float64(os[i]) * inv, os[i])


@njit(fastmath=_LOOP_FLAGS, forceinline=True, cache=True)
def pass_write(x, lo, hi, m, beta, inv, out):
    """``out = e^(β(x-m)) * inv`` over ``[lo, hi)`` (β = 1 skips the product)."""
    m = like_array(m, x)
    xs = x[lo:hi]
    os = out[lo:hi]
    if beta == 1.0:
        for i in range(xs.size):
            e = fexp(xs[i] - m)
            os[i] = as_like(np.float64(e) * inv, e)
    else:
        ninf = as_like(-np.inf, m)
        b = beta_like(beta, m)
        for i in range(xs.size):
            d = xs[i] - m
            e = fexp(b * d if d > ninf else ninf)  # masked: 0 for any β
            os[i] = as_like(np.float64(e) * inv, e)


@njit(fastmath=_LOOP_FLAGS, forceinline=True, cache=True)
def pass_fill(out, lo, hi, value):
    """``out[lo:hi] = value``."""
    os = out[lo:hi]
    for i in range(os.size):
        os[i] = as_like(value, os[i])


@njit(cache=True)
def pass_entropy_eps(x, lo, hi, m, inv_s, eps):
    r"""Return :math:`\sum p \log(p + \varepsilon)` over ``[lo, hi)``, :math:`p = e^{x-m}/s`."""
    m = like_array(m, x)
    acc = 0.0
    comp = 0.0
    for i in range(lo, hi):
        p = np.float64(fexp(x[i] - m)) * inv_s
        acc, comp = _neumaier(acc, comp, p * math.log(p + eps))
    return acc + comp


# ---------------------------------------------------------------------------
# one row, in memory
# ---------------------------------------------------------------------------


@njit(cache=True)
def row_entropy(x, lo, hi, out, store, eps):
    """Return (kind, m, c, n_eff, r, t, H) of the row ``x[lo:hi]``.

    kind: a row code of :mod:`softmaxtheory._formats` (``ROW_REGULAR``, ``ROW_EMPTY``,
    ``ROW_MASKED``, ``ROW_INVALID``: NaN or +inf).
    """
    if hi == lo:
        return ROW_EMPTY, -np.inf, 0, 0, 0.0, 0.0, 0.0
    m = row_max(x[lo:hi])
    kind = max_kind(m, x[lo:hi])
    if kind == ROW_MASKED:
        return ROW_MASKED, m, 0, 0, 0.0, 0.0, 0.0
    if kind == ROW_INVALID:
        return ROW_INVALID, np.nan, 0, 0, 0.0, 0.0, np.nan
    c, n_eff, r, t = pass_stats(x, lo, hi, m, out, store)
    if r != r:  # a NaN item that row_max missed
        return ROW_INVALID, np.nan, 0, 0, 0.0, 0.0, np.nan
    if eps > 0.0:
        h = -pass_entropy_eps(x, lo, hi, m, 1.0 / (c + r), eps)
    else:
        h = entropy_from_state(c, r, t)
    return ROW_REGULAR, m, c, n_eff, r, t, h


@njit(cache=True)
def row_finish(x, lo, hi, out, kind, m, c, r, beta, have_e):
    """Write the (adaptive) softmax of the row given its statistics and β."""
    if kind == ROW_INVALID:
        pass_fill(out, lo, hi, np.nan)
        return
    if kind != ROW_REGULAR:
        pass_fill(out, lo, hi, 0.0)
        return
    if beta == 1.0:
        inv = 1.0 / (c + r)
        if have_e:
            pass_scale(out, lo, hi, inv)
        else:
            pass_write(x, lo, hi, m, 1.0, inv, out)
        return
    cb, rb = pass_tempered(x, lo, hi, m, beta, out, True)
    pass_scale(out, lo, hi, 1.0 / (cb + rb))


# ---------------------------------------------------------------------------
# batches of rows (parallel over rows)
# ---------------------------------------------------------------------------


@njit(parallel=True, cache=True)
def rows_softmax(x, out):
    """Softmax of each row of the 2-d C-contiguous `x` (n <= CHUNK)."""
    nrow, n = x.shape
    xf = x.reshape(-1)
    of = out.reshape(-1)
    for i in prange(nrow):
        lo = i * n
        kind, m, c, _, r, _, _ = row_entropy(xf, lo, lo + n, of, True, 0.0)
        row_finish(xf, lo, lo + n, of, kind, m, c, r, 1.0, True)


@njit(parallel=True, cache=True)
def rows_entropy(x, eps, h_out, neff_out):
    """Entropy and unmasked count of each row."""
    nrow, n = x.shape
    xf = x.reshape(-1)
    for i in prange(nrow):
        lo = i * n
        _, _, _, n_eff, _, _, h = row_entropy(xf, lo, lo + n, xf, False, eps)
        h_out[i] = h
        neff_out[i] = n_eff


@njit(cache=True)
def entropy_upper_bound(s, t, n):
    r"""A cheap upper bound on :math:`H = \log s - t/s`, without a logarithm.

    :math:`\log s \le s - 1`; the rounding errors of the float32 sums behind `s`
    and `t` (at most :math:`n` additions each) are covered by adding
    :math:`(n + 4)\,2^{-23}(s + |t|)`. Tight on nearly one-hot rows, where it is used.
    """
    return (s - 1.0) - t / s + (n + 4.0) * 2.0**-23 * (s + abs(t))


#: Rows handled together by one thread: all their statistics are computed before any of
#: them is normalised, so the latency chain of one row (sums, logarithm, β) overlaps
#: with the work on the others.
ROW_GROUP = 16


@njit(parallel=True, cache=True)
def rows_adaptive(x, out, eps, kind_of_schedule, coeffs, threshold, const, h_cut, beta_out, buf):
    r"""Adaptive softmax of each row, β from a polynomial or constant schedule.

    Rows are processed in groups of :data:`ROW_GROUP`: phase 1 computes each row's
    maximum, :math:`s = \sum e^{x-m}` and :math:`t = \sum e^{x-m}(x-m)` (storing the
    exponentials) and β; phase 2 normalises. The entropy :math:`\log s - t/s` is
    evaluated only when needed: a row whose :func:`entropy_upper_bound` is at most
    `h_cut` -- an entropy below which the schedule's float β is exactly 1 -- gets
    β = 1 directly. β = 1 rows are normalised from the stored exponentials (one exp
    per item); the others recompute :math:`e^{\beta(x-m)}`. `buf` (rows, 3) holds
    (kind, m, s) between the phases.
    """
    nrow, n = x.shape
    xf = x.reshape(-1)
    of = out.reshape(-1)
    ngroup = (nrow + ROW_GROUP - 1) // ROW_GROUP
    for g in prange(ngroup):
        r0 = g * ROW_GROUP
        r1 = min(r0 + ROW_GROUP, nrow)
        for i in range(r0, r1):
            # phase 1, written out here: through a helper returning a tuple, the same
            # code measured twice as slow on 64-item rows
            lo = i * n
            hi = lo + n
            s = 0.0
            beta = 1.0
            m = row_max(xf[lo:hi])
            kind = ROW_EMPTY if hi == lo else max_kind(m, xf[lo:hi])
            if kind == ROW_INVALID:
                beta = np.nan
            elif kind == ROW_REGULAR:
                s, t = pass_st(xf, lo, hi, m, of)
                if s != s:  # a NaN item that row_max missed
                    kind = ROW_INVALID
                    beta = np.nan
                    s = 0.0
                elif kind_of_schedule == SCHED_CONST:
                    beta = const
                elif eps > 0.0:
                    h = -pass_entropy_eps(xf, lo, hi, m, 1.0 / s, eps)
                    beta = beta_poly(h, coeffs, threshold)
                elif entropy_upper_bound(s, t, n) > h_cut:
                    h = math.log(s) - t / s  # two non-negative terms: no cancellation
                    beta = beta_poly(h, coeffs, threshold)
            beta_out[i] = beta
            buf[i, 0] = kind
            buf[i, 1] = m
            buf[i, 2] = s
        for i in range(r0, r1):
            lo = i * n
            hi = lo + n
            kind = buf[i, 0]
            beta = beta_out[i]
            if kind == ROW_REGULAR and beta == 1.0:
                pass_scale(of, lo, hi, 1.0 / buf[i, 2])
            elif kind == ROW_REGULAR:
                _, s2 = pass_tempered(xf, lo, hi, buf[i, 1], beta, of, True)
                pass_scale(of, lo, hi, 1.0 / s2)
            else:
                pass_fill(of, lo, hi, np.nan if kind == ROW_INVALID else 0.0)


# ---------------------------------------------------------------------------
# short rows (n <= BLOCK): lean loops, rows in groups
# ---------------------------------------------------------------------------

#: Rows up to this length take the short-row kernels: one block, no compensated
#: block sums, and lean loops whose per-row cost was measured to dominate 64-item rows.
SHORT_ROW = BLOCK


@njit(fastmath=_LOOP_FLAGS, forceinline=True, cache=True)
def _short_st(xs, m, os):
    # e = exp(x - m) stored; s = sum e; t = sum e*(x - m), accumulated in the row's dtype, for
    # a row whose maximum m is finite (x - m <= 0). An item below the exponential's domain (a
    # masked -inf among them) is replaced by the exponential's floor, where it is exactly
    # 0 with no underflow (see _FLOOR64): its term is 0 * floor = 0. The test keeps a NaN
    # (NaN < low is false): a NaN item that row_max missed makes s NaN.
    zero = as_like(0.0, m)
    low, floor = exp_bounds_like(m)
    s = zero
    t = zero
    for i in range(xs.size):
        d = xs[i] - m
        d = floor if d < low else d
        e = fexp_core(d)
        os[i] = e
        s += e
        t += e * d
    return s, t


@njit(fastmath=_LOOP_FLAGS, forceinline=True, cache=True)
def _short_s(xs, m, os):
    # the sum of _short_st without t (NaN in, NaN sum)
    zero = as_like(0.0, m)
    low, floor = exp_bounds_like(m)
    s = zero
    for i in range(xs.size):
        d = xs[i] - m
        e = fexp_core(floor if d < low else d)
        os[i] = e
        s += e
    return np.float64(s)


@njit(fastmath=_LOOP_FLAGS, forceinline=True, cache=True)
def _short_tempered(xs, m, beta, os):
    # beta (x - m) <= 0 for a valid row and a beta of at least small_beta_like
    zero = as_like(0.0, m)
    low, floor = exp_bounds_like(m)
    s = zero
    for i in range(xs.size):
        d = beta * (xs[i] - m)
        e = fexp_core(floor if d < low else d)
        os[i] = e
        s += e
    return np.float64(s)


@njit(fastmath=_LOOP_FLAGS, forceinline=True, cache=True)
def _short_scale(os, f):
    # f is already in the row's dtype: one multiplication per item
    for i in range(os.size):
        os[i] = os[i] * f


@njit(fastmath=_LOOP_FLAGS, forceinline=True, cache=True)
def _short_fill(os, value):
    for i in range(os.size):
        os[i] = value


@njit(parallel=True, cache=True)
def rows_softmax_short(x, out):
    """Softmax of each row of the 2-d C-contiguous `x` with ``n <= SHORT_ROW``."""
    nrow, n = x.shape
    if n == 0:
        return
    for i in prange(nrow):
        xs = x[i]
        os = out[i]
        m = row_max(xs)
        kind = max_kind(m, xs)
        s = np.nan if kind == ROW_INVALID else 0.0
        if kind == ROW_REGULAR:
            s = _short_s(xs, m, os)
        if s != s:
            _short_fill(os, like_array(np.nan, xs))
        elif s == 0.0:
            _short_fill(os, like_array(0.0, xs))
        else:
            _short_scale(os, like_array(1.0 / s, xs))


@njit(inline="always")
def _short_row_first(x, out, i, eps, kind_of_schedule, coeffs, threshold, const, h_cut, c):
    # Phase 1 of one row of rows_adaptive_short; returns (β, m, needs a second pass).
    xs = x[i]
    os = out[i]
    n = xs.size
    m = row_max(xs)
    kind = max_kind(m, xs)
    if kind == ROW_MASKED:  # every item masked
        _short_fill(os, like_array(0.0, xs))
        return 1.0, m, 0
    s = like_array(np.nan, xs)
    t = s
    if kind == ROW_REGULAR:
        s, t = _short_st(xs, m, os)
    if s != s:  # a NaN item
        _short_fill(os, like_array(np.nan, xs))
        return np.nan, m, 0
    sd = np.float64(s)
    td = np.float64(t)
    beta = 1.0
    if kind_of_schedule == SCHED_CONST:
        beta = const
    elif eps > 0.0:
        h = -pass_entropy_eps(xs, 0, n, m, 1.0 / sd, eps)
        beta = beta_poly(h, coeffs, threshold)
    # entropy_upper_bound(s, t, n) > h_cut, multiplied through by s > 0: no division on
    # the path of a row whose β is 1
    elif (sd - 1.0) * sd - td + c * sd * (sd + abs(td)) > h_cut * sd:
        h = math.log(sd) - td / sd  # two non-negative terms: no cancellation
        beta = beta_poly(h, coeffs, threshold)
    if beta == 1.0:
        _short_scale(os, as_like(1.0, s) / s)
        return beta, m, 0
    return beta, m, 1


@njit(inline="always")
def _short_row_second(x, out, i, beta_out, m_buf):
    beta = beta_out[i]
    if beta == beta and beta != 1.0:
        xs = x[i]
        os = out[i]
        if careful_beta(beta, xs):  # 0 * -inf, overflowed shifts: see small_beta_like
            s2 = tempered_small(xs, 0, xs.size, m_buf[i], min(beta, _F64_MAX), os, True)
        else:
            s2 = _short_tempered(xs, m_buf[i], beta_like(beta, like_array(0.0, xs)), os)
        _short_scale(os, like_array(1.0 / s2, xs))


@njit(parallel=True, cache=True)
def rows_adaptive_short(
    x, out, eps, kind_of_schedule, coeffs, threshold, const, h_cut, beta_out, m_buf
):
    r"""Adaptive softmax of rows with ``n <= SHORT_ROW`` (β from a polynomial or constant).

    The same computation as :func:`rows_adaptive` with lean loops, in two parallel
    sweeps. The first computes each row's maximum, :math:`s`, :math:`t` and β with
    the exponentials stored; a row whose β is 1 is scaled at once (the one-exp
    path), a masked or invalid row filled. The second sweep, run only when some
    row needs it, computes :math:`e^{\beta(x-m)}` and scales. `m_buf` (dtype of
    `x`) carries each row's maximum between the sweeps.

    On 4096 rows of 64 float32 items this layout was faster, for β = 1 rows and for
    β > 1 rows, than handling the rows in groups of 16 with both phases per group.
    """
    nrow, n = x.shape
    if n == 0:
        for i in range(nrow):
            beta_out[i] = 1.0
        return
    c = (n + 4.0) * 2.0**-23
    more = 0
    for i in prange(nrow):
        beta, m, again = _short_row_first(
            x, out, i, eps, kind_of_schedule, coeffs, threshold, const, h_cut, c
        )
        beta_out[i] = beta
        m_buf[i] = m
        more += again
    if more > 0:
        _rows_short_second(x, out, beta_out, m_buf)


@njit(parallel=True, cache=True)
def _rows_short_second(x, out, beta_out, m_buf):
    for i in prange(x.shape[0]):
        _short_row_second(x, out, i, beta_out, m_buf)


@njit(parallel=True, cache=True)
def rows_stats(x, out, eps, kind_out, m_out, c_out, neff_out, r_out, h_out):
    """First half of :func:`rows_adaptive` for any schedule: statistics, e^(x-m) stored."""
    nrow, n = x.shape
    xf = x.reshape(-1)
    of = out.reshape(-1)
    for i in prange(nrow):
        lo = i * n
        kind, m, c, n_eff, r, _, h = row_entropy(xf, lo, lo + n, of, True, eps)
        kind_out[i] = kind
        m_out[i] = m
        c_out[i] = c
        neff_out[i] = n_eff
        r_out[i] = r
        h_out[i] = h


@njit(parallel=True, cache=True)
def rows_finish(x, out, kind, m, c, r, beta):
    """Second half of :func:`rows_adaptive` given β per row."""
    nrow, n = x.shape
    xf = x.reshape(-1)
    of = out.reshape(-1)
    for i in prange(nrow):
        lo = i * n
        row_finish(xf, lo, lo + n, of, kind[i], m[i], c[i], r[i], beta[i], True)


# ---------------------------------------------------------------------------
# one long row in fixed chunks (parallel over chunks, merged in a fixed order)
# ---------------------------------------------------------------------------


@njit(parallel=True, cache=True)
def chunk_states(x, chunk, m_out, nnan_out, c_out, neff_out, r_out, t_out):
    """Streaming state (m, c, n_eff, r, t) of every chunk of the 1-d `x`.

    ``nnan_out[k]`` is 1 where chunk ``k`` holds a NaN, else 0.
    """
    n = x.size
    nchunk = m_out.size
    for k in prange(nchunk):
        lo = k * chunk
        hi = min(lo + chunk, n)
        m = row_max(x[lo:hi])
        kind = max_kind(m, x[lo:hi])
        nan = kind == ROW_INVALID and m != np.inf
        c, n_eff, r, t = 0, 0, 0.0, 0.0
        if kind == ROW_REGULAR:
            c, n_eff, r, t = pass_stats(x, lo, hi, m, x, False)
            if r != r:  # a NaN item that row_max missed
                nan = True
                c, n_eff, r, t = 0, 0, 0.0, 0.0
        m_out[k] = m
        nnan_out[k] = 1 if nan else 0
        c_out[k] = c
        neff_out[k] = n_eff
        r_out[k] = r
        t_out[k] = t


@njit(cache=True)
def merge_state(m1, c1, n1, r1, t1, m2, c2, n2, r2, t2):
    r"""The ⊕ of theorem T7 on states (m, c, n_eff, r, t); ``m = -inf`` is the identity.

    With :math:`M = \max(m_1, m_2)` and :math:`s_k = c_k + r_k`, a state whose maximum
    is below :math:`M` contributes :math:`s_k e^{m_k-M}` to `r` and
    :math:`(t_k + s_k (m_k - M)) e^{m_k - M}` to `t` (every term :math:`\le 0`); when
    :math:`e^{m_k - M}` underflows to 0 (:math:`m_k - M` may even overflow to ``-inf``)
    both contributions are exactly 0, so the state stays finite.

    For :math:`-1 < m_k - M < 0` the factor is applied as :math:`a + a\,
    \operatorname{expm1}(m_k - M)`: its error is then :math:`|m_k - M|\,u` rather
    than :math:`u`. A row fed an item at a time whose maximum rises by one small
    step each time (an ALiBi bias row streamed token by token) rescales its sums by
    the same rounded factor once per item, so that error adds up over the merges to
    :math:`n u`; with ``expm1`` to about the steps' total (the row's spread) times
    :math:`u`. 20,000 steps of :math:`2^{-16}` put the softmax 2,980 ulps off with
    ``exp`` and 18 with ``expm1``; :math:`10^5` steps of :math:`10^{-5}`, 15,700 and 54.
    Below :math:`-1` each merge shrinks the older mass by :math:`e` or more, and the
    rounded factors' errors sum to about :math:`u`.
    """
    if m1 == -np.inf:
        return m2, c2, n2, r2, t2
    if m2 == -np.inf:
        return m1, c1, n1, r1, t1
    if m1 == m2:
        return m1, c1 + c2, n1 + n2, r1 + r2, t1 + t2
    if m1 < m2:
        m1, c1, n1, r1, t1, m2, c2, n2, r2, t2 = m2, c2, n2, r2, t2, m1, c1, n1, r1, t1
    delta = m2 - m1  # may overflow to -inf (m1 = 1e308, m2 = -1e308)
    if delta > -1.0:
        em = math.expm1(delta)
        s2 = c2 + r2
        u2 = t2 + s2 * delta
        return m1, c1, n1 + n2, r1 + (s2 + s2 * em), t1 + (u2 + u2 * em)
    w = math.exp(delta)
    if w == 0.0:
        # the smaller state's mass underflows to exactly 0; (t2 + s2 delta) * 0 could be
        # (-inf) * 0 = NaN, so it is left out rather than multiplied
        return m1, c1, n1 + n2, r1, t1
    s2 = c2 + r2
    return m1, c1, n1 + n2, r1 + s2 * w, t1 + (t2 + s2 * delta) * w


@njit(cache=True)
def merge_chunks(m, nnan, c, neff, r, t):
    """Fold the chunk states left to right; return (invalid, m, c, n_eff, r, t)."""
    bad = False
    M = -np.inf
    C = 0
    N = 0
    R = 0.0
    T = 0.0
    for k in range(m.size):
        if nnan[k] > 0 or m[k] == np.inf:
            bad = True
        M, C, N, R, T = merge_state(M, C, N, R, T, m[k], c[k], neff[k], r[k], t[k])
    return bad, M, C, N, R, T


@njit(parallel=True, cache=True)
def chunks_tempered(x, chunk, m, beta, out, store, c_out, r_out):
    """Tempered sums of every chunk (e^(β(x-m)) stored in `out` if asked)."""
    n = x.size
    for k in prange(c_out.size):
        lo = k * chunk
        hi = min(lo + chunk, n)
        c, r = pass_tempered(x, lo, hi, m, beta, out, store)
        c_out[k] = c
        r_out[k] = r


@njit(parallel=True, cache=True)
def chunks_write(x, chunk, m, beta, inv, out, nchunk):
    """``out = e^(β(x-m)) * inv`` chunk by chunk (:func:`write_small` for a tiny β)."""
    n = x.size
    small = careful_beta(beta, x)
    b64 = min(beta, _F64_MAX)
    for k in prange(nchunk):
        lo = k * chunk
        if small:
            write_small(x, lo, min(lo + chunk, n), m, b64, inv, out)
        else:
            pass_write(x, lo, min(lo + chunk, n), m, beta, inv, out)


@njit(parallel=True, cache=True)
def chunks_scale(out, chunk, inv, nchunk):
    """``out *= inv`` chunk by chunk."""
    n = out.size
    for k in prange(nchunk):
        lo = k * chunk
        pass_scale(out, lo, min(lo + chunk, n), inv)


@njit(parallel=True, cache=True)
def chunks_entropy_eps(x, chunk, m, inv_s, eps, acc_out):
    r""":math:`\sum p\log(p+\varepsilon)` of every chunk."""
    n = x.size
    for k in prange(acc_out.size):
        lo = k * chunk
        acc_out[k] = pass_entropy_eps(x, lo, min(lo + chunk, n), m, inv_s, eps)


_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_NAN_KEY = np.uint64(0x7FF8000000000000)


@njit(cache=True)
def _mix64(z):
    # the splitmix64 finaliser: a bijection of uint64 that scatters nearby keys
    z = (z + _GOLDEN) & np.uint64(0xFFFFFFFFFFFFFFFF)
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


@njit(cache=True)
def _digest_range(x, lo, hi):
    # sum of _mix64(bits) mod 2**64 over x[lo:hi] (-0.0 as +0.0, every NaN alike)
    h = np.uint64(0)
    zero = like_array(0.0, x)
    for i in range(lo, hi):
        v = x[i] + zero  # -0.0 + 0.0 = +0.0: equal values hash alike
        key = _NAN_KEY if v != v else np.uint64(order_key(v))
        h += _mix64(key)
    return h


@njit(parallel=True, cache=True)
def chunk_digests(x, chunk, h_out):
    r"""A multiset digest of every chunk of the 1-d `x`.

    The digest is :math:`\sum_i \mathrm{mix}(x_i) \bmod 2^{64}`: the sum over items of
    a 64-bit mix of each value's bits does not depend on the order or the chunking of
    the items, and states merge by adding digests. Two different multisets of the same
    size collide with probability about :math:`2^{-64}` for unrelated data.
    """
    n = x.size
    for k in prange(h_out.size):
        lo = k * chunk
        h_out[k] = _digest_range(x, lo, min(lo + chunk, n))


@njit(cache=True)
def fold_sum(values):
    """Neumaier sum of `values` left to right (a fixed order)."""
    acc = 0.0
    comp = 0.0
    for v in values:
        acc, comp = _neumaier(acc, comp, np.float64(v))
    return acc + comp


# ---------------------------------------------------------------------------
# attention, streaming over key blocks
# ---------------------------------------------------------------------------

KEY_BLOCK = 128

#: Row kinds of the attention kernels: those of :func:`row_entropy` (``ROW_REGULAR``,
#: ``ROW_MASKED``, ``ROW_INVALID``) and this one, a row with a logit beyond the float
#: range, finished by :func:`attention_wide_stats` and :func:`attention_wide_apply`.
KIND_WIDE = 4

_FLOAT64_MAX = 1.7976931348623157e308


def lowest_like(arr):  # pragma: no cover - replaced by the overload in jitted code
    """The most negative finite value of the dtype of `arr`."""
    raise NotImplementedError


@overload(lowest_like)
def _ol_lowest_like(arr):
    if arr.dtype == types.float32:
        return lambda arr: np.float32(-3.4028234663852886e38)
    return lambda arr: -_FLOAT64_MAX


#: Queries whose logits are formed together: each key row is read once for all of them
QUERY_BLOCK = 4


@njit(fastmath=_LOOP_FLAGS, forceinline=True, cache=True)
def _dot1(q, i, kr):
    # q[i] . kr in the inputs' precision; the order of the sum is free (the documented
    # logit error (d + 2) u sum |q_f k_f| holds for any order), so it vectorises
    acc = like_array(0.0, q)
    for f in range(kr.shape[0]):
        acc += q[i, f] * kr[f]
    return acc


@njit(fastmath=_LOOP_FLAGS, forceinline=True, cache=True)
def _dot4(q, i0, i1, i2, i3, kr):
    # the dot products of four query rows with one key row, which is loaded once for the
    # four: twice the throughput of four calls of _dot1 at d = 64 and 128
    a0 = like_array(0.0, q)
    a1 = a0
    a2 = a0
    a3 = a0
    for f in range(kr.shape[0]):
        x = kr[f]
        a0 += q[i0, f] * x
        a1 += q[i1, f] * x
        a2 += q[i2, f] * x
        a3 += q[i3, f] * x
    return a0, a1, a2, a3


@njit(fastmath=_LOOP_FLAGS, forceinline=True, cache=True)
def _dots(q, k, i0, nq, j0, j1, buf):
    # buf[a, j - j0] = q[i0 + a] . k[j]: one query, or four at a time (rows past the
    # block repeat its last query; their dot products are not read)
    if nq == 1:
        for j in range(j0, j1):
            buf[0, j - j0] = _dot1(q, i0, k[j])
        return
    r1 = min(i0 + 1, i0 + nq - 1)
    r2 = min(i0 + 2, i0 + nq - 1)
    r3 = min(i0 + 3, i0 + nq - 1)
    for j in range(j0, j1):
        d0, d1, d2, d3 = _dot4(q, i0, r1, r2, r3, k[j])
        buf[0, j - j0] = d0
        buf[1, j - j0] = d1
        buf[2, j - j0] = d2
        buf[3, j - j0] = d3


@njit(fastmath=_LOOP_FLAGS, forceinline=True, cache=True)
def _scale_row(row, scale):
    # row <- scale * row, each product in float64 rounded once to the row's dtype; whether
    # one of them is not finite (no reduction over NaN flags: max of 0/1 values)
    out = 0
    for c in range(row.size):
        x = like_array(scale * np.float64(row[c]), row)
        row[c] = x
        out = max(out, 0 if abs(x) < np.inf else 1)
    return out


@njit(forceinline=True, cache=True)
def _mask_row(row, keeprow, addrow, scale):
    # row <- scale * row + mask in float64, rounded once to the row's dtype (flag-free: no
    # contraction into a fused multiply-add), -inf where the boolean mask drops the key or
    # the additive term is -inf; whether another logit is not finite (a non-finite query
    # or key, an additive NaN or +inf, or a logit beyond the float range). A non-finite
    # query or key under an additive -inf is the caller's to find.
    out = 0
    ninf = like_array(-np.inf, row)
    for c in range(row.size):
        a = np.float64(addrow[c])
        x = like_array(scale * np.float64(row[c]) + a, row)
        dropped = not keeprow[c] or a == -np.inf
        row[c] = ninf if dropped else x
        out = max(out, 0 if dropped or abs(x) < np.inf else 1)
    return out


@njit(cache=True)
def _logits_tile(q, k, addmask, keep, plain, causal, qbad, kbad, i0, nq, j0, j1, scale, buf):
    """Logits of queries ``[i0, i0 + nq)`` against keys ``[j0, j1)`` into ``buf[a, j - j0]``.

    Each logit is ``scale * (q_i . k_j) + mask`` in float64 rounded once to the dtype of
    `q`; ``-inf`` for a masked key (boolean mask, additive ``-inf``, or `causal` and
    ``j > i``) whatever the dot product; NaN for a kept key when the query or the key
    has a non-finite component (as in the reference). `plain` says that the mask is
    neither boolean nor additive (all kept, nothing added), and the mask is not read.
    Each row is finished in one vectorised loop; the rare rows with a kept non-finite
    logit are then sorted out entry by entry. A block of more than one query is
    computed four rows at a time (:func:`_dot4`), so that a query's logits come from
    the same operations in both passes and in every call with the same query length.
    Returns a bit mask of the block's rows with a logit of finite inputs beyond the
    float range (they go to the wide kernels).
    """
    _dots(q, k, i0, nq, j0, j1, buf)
    wide = 0
    bad_key = False
    for j in range(j0, j1):
        bad_key |= kbad[j]
    for a in range(nq):
        i = i0 + a
        row = buf[a, : j1 - j0]
        if plain:
            flag = _scale_row(row, scale)
        else:
            flag = _mask_row(row, keep[i, j0:j1], addmask[i, j0:j1], scale)
        if flag or qbad[i] or bad_key:
            # a kept logit that is not finite, or a non-finite query or key: NaN for the
            # latter (an additive -inf does not hide it: -inf + NaN is NaN, as in the
            # reference), else a logit beyond the float range (a wide row) where the
            # additive term is finite, else (an additive NaN or +inf) left as it is
            for j in range(j0, j1):
                x = row[j - j0]
                if not plain and not keep[i, j]:
                    continue  # dropped by the boolean mask
                if qbad[i] or kbad[j]:
                    row[j - j0] = np.nan
                elif (
                    not math.isfinite(x)
                    and not (causal and j > i)
                    and (plain or abs(np.float64(addmask[i, j])) <= _FLOAT64_MAX)
                ):
                    wide |= 1 << a
        if causal:
            for j in range(max(j0, i + 1), j1):
                row[j - j0] = -np.inf
    return wide


@njit(cache=True)
def _slice_operands(qs, ks, addmasks, keeps, qbads, kbads, slices, n):
    """Slice `n`'s queries, keys, mask terms and non-finite flags (views of the stacks)."""
    at = slices[n]
    return qs[at[0]], ks[at[1]], addmasks[at[3]], keeps[at[4]], qbads[at[0]], kbads[at[1]]


@njit(cache=True)
def _query_blocks(L):
    """The blocks of :data:`QUERY_BLOCK` queries of a slice of `L` queries."""
    return (L + QUERY_BLOCK - 1) // QUERY_BLOCK


@njit(cache=True)
def _query_block(job, L):
    """``(n, i0, nq)``: the attention kernels' job `job` is slice `n`'s queries [i0, i0 + nq)."""
    nb = _query_blocks(L)
    n = job // nb
    i0 = (job - n * nb) * QUERY_BLOCK
    return n, i0, min(QUERY_BLOCK, L - i0)


@njit(cache=True)
def _key_end(causal, S, i0, nq):
    """The keys a block of queries ``[i0, i0 + nq)`` can attend to end here."""
    return min(S, i0 + nq) if causal else S


@njit(parallel=True, cache=True)
def attention_stats(
    qs, ks, addmasks, keeps, slices, plain, causal, qbads, kbads, scale, eps,
    kind_out, m_out, neff_out, h_out,
):  # fmt: skip
    """Pass 1 of adaptive attention for every query row of every (batch, head) slice.

    Slice ``n`` reads queries ``qs[slices[n, 0]]`` (L, d), keys ``ks[slices[n, 1]]``
    (S, d), and the mask's ``addmasks[slices[n, 3]]`` and ``keeps[slices[n, 4]]``, (L,
    S) views read in place (broadcast strides allowed); ``qbads`` and ``kbads`` flag
    the non-finite queries and keys of each stack entry. The (slice, block of
    :data:`QUERY_BLOCK` queries) pairs are shared out among the threads, so that many
    small slices make one parallel loop. The streaming state of each query's logits
    over key blocks (T7), then its entropy, go to row ``(n, i)`` of the outputs; at
    most ``KEY_BLOCK`` logits per query are held at once, in the dtype of `qs`.
    `causal` keeps keys ``j <= i`` only (later key blocks are not visited). A row with
    a logit beyond the float range gets kind :data:`KIND_WIDE`.
    """
    L = qs.shape[1]
    S = ks.shape[1]
    for job in prange(slices.shape[0] * _query_blocks(L)):
        n, i0, nq = _query_block(job, L)
        q, k, addmask, keep, qbad, kbad = _slice_operands(
            qs, ks, addmasks, keeps, qbads, kbads, slices, n
        )
        buf = np.empty((QUERY_BLOCK, KEY_BLOCK), q.dtype)
        # per row of the block: the state (m, c, n_eff, r, t) and whether it is done
        # (an invalid or wide row: its later key blocks are not looked at)
        Ms = np.full(QUERY_BLOCK, -np.inf)
        Cs = np.zeros(QUERY_BLOCK, np.int64)
        Ns = np.zeros(QUERY_BLOCK, np.int64)
        Rs = np.zeros(QUERY_BLOCK)
        Ts = np.zeros(QUERY_BLOCK)
        codes = np.zeros(QUERY_BLOCK, np.int64)  # 0, ROW_INVALID or KIND_WIDE
        S1 = _key_end(causal, S, i0, nq)
        for j0 in range(0, S1, KEY_BLOCK):
            j1 = min(j0 + KEY_BLOCK, S1)
            wide = _logits_tile(
                q, k, addmask, keep, plain, causal, qbad, kbad, i0, nq, j0, j1, scale, buf
            )
            live = 0
            for a in range(nq):
                if codes[a] != 0:
                    continue
                if wide & (1 << a):
                    codes[a] = KIND_WIDE
                    continue
                row = buf[a, : j1 - j0]
                m = row_max(row)
                kind = max_kind(m, row)
                if kind == ROW_INVALID:
                    codes[a] = ROW_INVALID
                    continue
                live += 1
                if kind == ROW_MASKED:
                    continue
                c, n_eff, r, t = pass_stats(row, 0, j1 - j0, m, row, False)
                if r != r:  # a NaN logit that row_max missed
                    codes[a] = ROW_INVALID
                    continue
                Ms[a], Cs[a], Ns[a], Rs[a], Ts[a] = merge_state(
                    Ms[a], Cs[a], Ns[a], Rs[a], Ts[a], np.float64(m), c, n_eff, r, t
                )
            if live == 0:
                break
        regular_eps = False
        for a in range(nq):
            i = i0 + a
            m_out[n, i] = Ms[a]
            neff_out[n, i] = Ns[a]
            if codes[a] != 0:
                kind_out[n, i] = codes[a]
                h_out[n, i] = np.nan
            elif Ms[a] == -np.inf:
                kind_out[n, i] = ROW_MASKED
                h_out[n, i] = 0.0
            else:
                kind_out[n, i] = ROW_REGULAR
                h_out[n, i] = entropy_from_state(Cs[a], Rs[a], Ts[a])
                regular_eps = eps > 0.0
        if regular_eps:
            # the paper's entropy, -sum p log(p + eps), in a second sweep over the keys
            hs = np.zeros(QUERY_BLOCK)
            for j0 in range(0, S1, KEY_BLOCK):
                j1 = min(j0 + KEY_BLOCK, S1)
                _logits_tile(
                    q, k, addmask, keep, plain, causal, qbad, kbad, i0, nq, j0, j1, scale, buf
                )
                for a in range(nq):
                    if kind_out[n, i0 + a] == ROW_REGULAR:
                        inv_s = 1.0 / (Cs[a] + Rs[a])
                        hs[a] += pass_entropy_eps(buf[a], 0, j1 - j0, Ms[a], inv_s, eps)
            for a in range(nq):
                if kind_out[n, i0 + a] == ROW_REGULAR:
                    h_out[n, i0 + a] = -hs[a]


@njit(fastmath=_LOOP_FLAGS, forceinline=True, cache=True)
def _accumulate1(acc, w, vr):
    # acc += w v_j in float64, w > 0
    for f in range(vr.shape[0]):
        acc[f] += w * np.float64(vr[f])


@njit(fastmath=_LOOP_FLAGS, forceinline=True, cache=True)
def _accumulate4(acc, w0, w1, w2, w3, vr):
    # four rows of acc += w v_j in float64, the value row loaded once for the four
    for f in range(vr.shape[0]):
        x = np.float64(vr[f])
        acc[0, f] += w0 * x
        acc[1, f] += w1 * x
        acc[2, f] += w2 * x
        acc[3, f] += w3 * x


@njit(fastmath=_LOOP_FLAGS, forceinline=True, cache=True)
def _weights(row, M, b, low, w):
    # w = e^(b (x - M)) in float64 for b at least small_beta_like: a masked logit
    # (-inf) and a finite one whose shift overflowed are clamped to `low`, and their
    # weight underflows to 0 (see small_beta_like); returns the sum of the weights
    total = 0.0
    for j in range(row.size):
        d = row[j] - M
        d = d if d >= low else low
        e = np.float64(fexp(b * d))
        w[j] = e
        total += e
    return total


@njit(parallel=True, cache=True)
def attention_apply(
    qs, ks, vs, addmasks, keeps, slices, plain, causal, qbads, kbads, scale, kind, m, beta, out
):
    """Pass 2 of adaptive attention: tempered weights accumulated into `out` (N, L, dv).

    The slices, stacks and query blocks are those of :func:`attention_stats`, the values
    of slice ``n`` ``vs[slices[n, 2]]`` (S, dv). Logits and exponentials in the dtype of
    `qs`, the weighted sums in float64 (a block's four rows read each value row once).
    Rows of kind :data:`KIND_WIDE` are left alone.
    """
    L = qs.shape[1]
    S = ks.shape[1]
    dv = vs.shape[2]
    for job in prange(slices.shape[0] * _query_blocks(L)):
        n, i0, nq = _query_block(job, L)
        q, k, addmask, keep, qbad, kbad = _slice_operands(
            qs, ks, addmasks, keeps, qbads, kbads, slices, n
        )
        v = vs[slices[n, 2]]
        regular = 0
        for a in range(nq):
            ka = kind[n, i0 + a]
            if ka == ROW_REGULAR:
                regular += 1
            elif ka != KIND_WIDE:
                fill = np.nan if ka == ROW_INVALID else 0.0
                for f in range(dv):
                    out[n, i0 + a, f] = fill
        if regular == 0:
            continue
        buf = np.empty((QUERY_BLOCK, KEY_BLOCK), q.dtype)
        w = np.zeros((QUERY_BLOCK, KEY_BLOCK))  # rows not regular keep weight 0
        acc = np.zeros((QUERY_BLOCK, dv))
        totals = np.zeros(QUERY_BLOCK)
        low = lowest_like(buf)
        S1 = _key_end(causal, S, i0, nq)
        for j0 in range(0, S1, KEY_BLOCK):
            j1 = min(j0 + KEY_BLOCK, S1)
            nk = j1 - j0
            _logits_tile(q, k, addmask, keep, plain, causal, qbad, kbad, i0, nq, j0, j1, scale, buf)
            for a in range(nq):
                if kind[n, i0 + a] == ROW_REGULAR:
                    ba = beta[n, i0 + a]
                    b64 = min(ba, _F64_MAX)
                    if careful_beta(b64, buf):
                        totals[a] += tempered_small(buf[a], 0, nk, m[n, i0 + a], b64, w[a], True)
                    else:
                        M = like_array(m[n, i0 + a], buf)
                        b = beta_like(ba, like_array(0.0, buf))
                        totals[a] += _weights(buf[a, :nk], M, b, low, w[a])
            if nq == 1:
                for j in range(nk):
                    if w[0, j] != 0.0:
                        _accumulate1(acc[0], w[0, j], v[j0 + j])
            else:
                for j in range(nk):
                    w0, w1, w2, w3 = w[0, j], w[1, j], w[2, j], w[3, j]
                    if w0 != 0.0 or w1 != 0.0 or w2 != 0.0 or w3 != 0.0:
                        _accumulate4(acc, w0, w1, w2, w3, v[j0 + j])
        for a in range(nq):
            if kind[n, i0 + a] == ROW_REGULAR:
                inv = 1.0 / totals[a]
                for f in range(dv):
                    out[n, i0 + a, f] = acc[a, f] * inv


@njit(cache=True)
def _exponent(v):
    # e with |v| < 2**e (0 for v = 0): math.frexp's exponent
    return math.frexp(v)[1]


@njit(cache=True)
def _wide_exponent(addmask, keep, causal, i, S, qe, ke, se):
    # G of row i: every scaled logit x 2**-G has magnitude below d + 1
    ae = -1074
    for j in range(S):
        if (causal and j > i) or not keep[i, j]:
            continue
        a = np.float64(addmask[i, j])
        if abs(a) <= _FLOAT64_MAX and a != 0.0:
            ae = max(ae, _exponent(a))
    return max(qe + ke + se, ae)


@njit(cache=True)
def _wide_logit(q, k, addmask, keep, causal, qbad, kbad, i, j, qe, ke, se, sn, g):
    r"""The logit of (i, j) times :math:`2^{-G}`, in float64 (``-inf`` masked, NaN invalid).

    :math:`x 2^{-G} = s_n \sum_f (q_f 2^{-q_e})(k_f 2^{-k_e})\, 2^{q_e+k_e+s_e-G}
    + a\, 2^{-G}` with :math:`s_n = \mathrm{scale}\, 2^{-s_e}`: every factor is scaled
    by a power of two, so nothing overflows; what underflows is below the rounding
    error of the float logit.
    """
    if (causal and j > i) or not keep[i, j]:
        return -np.inf
    if qbad or kbad[j]:
        return np.nan
    a = np.float64(addmask[i, j])
    if a == -np.inf:
        return -np.inf
    acc = 0.0
    for f in range(q.shape[1]):
        acc += math.ldexp(np.float64(q[i, f]), -qe) * math.ldexp(np.float64(k[j, f]), -ke)
    return math.ldexp(sn * acc, qe + ke + se - g) + math.ldexp(a, -g)


@njit(cache=True)
def _wide_shift(y, m, g):
    # (y - m) 2**g for pass 1's e^d, clamped to a finite value (e^d = 0 there, and e^d d = 0,
    # not 0 * -inf); pass 2's β (y - m) 2**g is _wide_tempered_exponent, not β times this
    d = math.ldexp(y - m, g) if g <= 2000 else (y - m) * math.inf
    if y == m:
        d = 0.0
    return d if d >= -1e300 else -1e300


@njit(cache=True)
def _wide_tempered_exponent(b, y, m, g):
    r""":math:`\beta\,(y - m)\,2^{g}` for scaled logits `y` <= `m`, β = `b` finite >= 0.

    Formed from the binary mantissas and exponents of β and :math:`y - m`, so neither
    the shift :math:`(y - m) 2^g` (beyond the float range) nor the product overflows or
    underflows on the way: a tiny β (``1e-305``) times a shift of ``-1e400`` is
    :math:`-10^{95}` (β times the shift clamped to ``-1e300`` would be ``-1e-5``,
    weight 1). 0 at the maximum and for β = 0; ``-inf`` once the product is at least
    1024 in magnitude (weight 0 in float64).
    """
    fb, eb = math.frexp(b)
    fd, ed = math.frexp(y - m)
    p = fb * fd  # |p| in [1/4, 1) unless 0
    if p == 0.0:
        return 0.0
    e = eb + ed + g
    if e >= 12:  # |p| 2**e >= 2**10
        return -np.inf
    return math.ldexp(p, max(e, -1100))  # below 2**-1100 it rounds to 0 either way


@njit(parallel=True, cache=True)
def attention_wide_stats(
    q, k, addmask, keep, causal, qbad, kbad, scale, ke, eps, rows,
    kind_out, m_out, g_out, neff_out, h_out,
):  # fmt: skip
    r"""Pass 1 of the rows in `rows` whose logits leave the float range.

    Each logit is formed scaled by a power of two :math:`2^{-G}` chosen per row
    (:func:`_wide_logit`), so none overflows; the shifts :math:`x_j - m` are the scaled
    differences times :math:`2^G`, clamped to a finite value. The statistics are
    summed in float64 over the whole row (a slow path, three scans of the keys).
    `ke` is the exponent of the largest finite key component; `m_out` receives the
    scaled maximum and `g_out` the exponent :math:`G`.
    """
    S = k.shape[0]
    se = _exponent(scale)
    sn = math.ldexp(scale, -se)
    for r in prange(rows.size):
        i = rows[r]
        qe = -1074
        for f in range(q.shape[1]):
            if q[i, f] != 0.0:
                qe = max(qe, _exponent(np.float64(q[i, f])))
        g = _wide_exponent(addmask, keep, causal, i, S, qe, ke, se)
        M = -np.inf
        bad = False
        for j in range(S):
            y = _wide_logit(q, k, addmask, keep, causal, qbad[i], kbad, i, j, qe, ke, se, sn, g)
            if y != y or y == np.inf:
                bad = True
            elif y > M:
                M = y
        g_out[i] = g
        m_out[i] = M
        if bad:
            kind_out[i] = ROW_INVALID
            neff_out[i] = 0
            h_out[i] = np.nan
            continue
        if M == -np.inf:
            kind_out[i] = ROW_MASKED
            neff_out[i] = 0
            h_out[i] = 0.0
            continue
        c = 0
        n_eff = 0
        rs = 0.0
        t = 0.0
        for j in range(S):
            y = _wide_logit(q, k, addmask, keep, causal, qbad[i], kbad, i, j, qe, ke, se, sn, g)
            if y == -np.inf:
                continue
            d = _wide_shift(y, M, g)
            n_eff += 1
            if d == 0.0:
                c += 1
            else:
                e = math.exp(d)
                rs += e
                t += e * d
        kind_out[i] = ROW_REGULAR
        neff_out[i] = n_eff
        if eps > 0.0:
            inv_s = 1.0 / (c + rs)
            acc = 0.0
            for j in range(S):
                y = _wide_logit(q, k, addmask, keep, causal, qbad[i], kbad, i, j, qe, ke, se, sn, g)
                if y != -np.inf:
                    p = math.exp(_wide_shift(y, M, g)) * inv_s
                    acc += p * math.log(p + eps)
            h_out[i] = -acc
        else:
            h_out[i] = entropy_from_state(c, rs, t)


@njit(parallel=True, cache=True)
def attention_wide_apply(
    q, k, v, addmask, keep, causal, qbad, kbad, scale, ke, rows, kind, m, g_in, beta, out
):
    """Pass 2 of the rows of :func:`attention_wide_stats` (same scaled logits)."""
    S = k.shape[0]
    dv = v.shape[1]
    se = _exponent(scale)
    sn = math.ldexp(scale, -se)
    for r in prange(rows.size):
        i = rows[r]
        if kind[i] != ROW_REGULAR:
            fill = np.nan if kind[i] == ROW_INVALID else 0.0
            for f in range(dv):
                out[i, f] = fill
            continue
        qe = -1074
        for f in range(q.shape[1]):
            if q[i, f] != 0.0:
                qe = max(qe, _exponent(np.float64(q[i, f])))
        g = g_in[i]
        M = m[i]
        b = min(beta[i], _F64_MAX)  # an overflowed β: 0 at the maximum, not inf * 0
        acc = np.zeros(dv)
        total = 0.0
        for j in range(S):
            y = _wide_logit(q, k, addmask, keep, causal, qbad[i], kbad, i, j, qe, ke, se, sn, g)
            if y == -np.inf:
                continue
            w = math.exp(_wide_tempered_exponent(b, y, M, g))
            if w != 0.0:
                total += w
                for f in range(dv):
                    acc[f] += w * np.float64(v[j, f])
        inv = 1.0 / total
        for f in range(dv):
            out[i, f] = acc[f] * inv


@njit(parallel=True, cache=True)
def parallel_copy(src, dst):
    """``dst[:] = src`` in parallel blocks (the bandwidth probe of the benchmark)."""
    n = src.size
    nblock = (n + CHUNK - 1) // CHUNK
    for b in prange(nblock):
        lo = b * CHUNK
        hi = min(lo + CHUNK, n)
        s = src[lo:hi]
        d = dst[lo:hi]
        for i in range(s.size):
            d[i] = s[i]


# ---------------------------------------------------------------------------
# fork safety: serial twins of the parallel kernels in a forked child
# ---------------------------------------------------------------------------


class KernelTable:
    """The kernels as :mod:`softmaxtheory.accelerated.cpu` calls them.

    An attribute is this module's global of the same name, except in a process
    forked from one whose active threading layer is GNU OpenMP: there
    :meth:`use_serial` has replaced every ``parallel=True`` kernel by its serial
    twin, the same Python function compiled with ``parallel=False`` and the same
    other options (``prange`` becomes ``range``). GNU OpenMP's pool does not
    survive ``fork()``: Numba terminates a child that starts a parallel region
    ("fork() called from a process already using GNU OpenMP"). The kernels split
    the work into rows or fixed chunks and merge in a fixed order, so a twin's
    result is the parallel kernel's bit for bit.

    Numba's ``workqueue`` threading layer (the one left where neither TBB nor
    OpenMP is installed) is not thread-safe: two Python threads in parallel
    kernels at once make Numba terminate the process ("Concurrent access has
    been detected"), which a threaded dask scheduler or a thread pool of
    requests does. Until the first parallel kernel has returned, the layer is
    not known, and every parallel kernel runs under :attr:`lock`; then, on
    ``workqueue``, they keep running under it, one at a time (:class:`_Locked`),
    and on TBB or OpenMP the table holds the kernels themselves again.
    """

    def __init__(self) -> None:
        self.serial = False
        self.lock = threading.Lock()
        self.layer: str | None = None  # the threading layer, once a parallel kernel ran

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name not in globals():
            raise AttributeError(name)
        value = globals()[name]
        if callable(value) and numba.config.DISABLE_JIT:
            raise RuntimeError(
                "the CPU kernels need Numba's compiler, and NUMBA_DISABLE_JIT is set in this "
                "process (the kernels' intrinsics and overloads have no Python version): unset "
                "it, or compute with softmaxtheory.reference or the torch backend"
            )
        if self.layer != "safe" and not self.serial and name in _parallel_names():
            value = _Locked(self, value)
        setattr(self, name, value)  # cached: later look-ups are plain attributes
        return value

    def settle(self) -> None:
        """After a parallel kernel ran: keep the lock on ``workqueue``, else drop it."""
        try:
            layer = numba.threading_layer()
        except ValueError:  # pragma: no cover - a parallel kernel has run
            return
        self.layer = "workqueue" if layer == "workqueue" else "safe"
        if self.layer == "safe":
            for name, value in list(vars(self).items()):
                if isinstance(value, _Locked):
                    setattr(self, name, value.kernel)

    def use_serial(self) -> None:
        """Route every parallel kernel to its serial twin (compiled on first call)."""
        if self.serial:
            return
        self.serial = True
        for name in parallel_kernel_names():
            setattr(self, name, _LazyTwin(name))


class _Locked:
    """A parallel kernel called under the table's lock (see :class:`KernelTable`)."""

    __slots__ = ("kernel", "table")

    def __init__(self, table: KernelTable, kernel: Any) -> None:
        self.table = table
        self.kernel = kernel

    def __call__(self, *args: Any) -> Any:
        with self.table.lock:
            out = self.kernel(*args)
        if self.table.layer is None:
            self.table.settle()
        return out


@functools.cache
def _parallel_names() -> frozenset[str]:
    return frozenset(parallel_kernel_names())


def parallel_kernel_names() -> list[str]:
    """Names of this module's kernels compiled with ``parallel=True``."""
    return sorted(
        name
        for name, value in globals().items()
        if isinstance(value, numba.core.registry.CPUDispatcher)
        and value.targetoptions.get("parallel")
    )


_TWINS: dict[str, Any] = {}


def serial_twins() -> dict[str, Any]:
    """Serial twins of the parallel kernels, created once (each compiled lazily).

    A twin is a copy of the kernel's Python function under the qualified name
    ``<name>__serial`` (so Numba's on-disk cache keeps it apart from the
    parallel version) whose globals map every parallel kernel to its twin, so a
    parallel kernel calling another (``rows_adaptive_short``) stays serial.
    """
    if not _TWINS:
        names = parallel_kernel_names()
        scope = dict(globals())
        for name in names:
            disp = globals()[name]
            f = disp.py_func
            twin_f = _pytypes.FunctionType(
                f.__code__, scope, f.__name__, f.__defaults__, f.__closure__
            )
            twin_f.__qualname__ = f"{f.__qualname__}__serial"
            twin_f.__doc__ = f.__doc__
            opts = {
                k: v
                for k, v in disp.targetoptions.items()
                if k not in ("parallel", "cache", "nopython")
            }
            _TWINS[name] = njit(parallel=False, cache=True, **opts)(twin_f)
        scope.update(_TWINS)
    return _TWINS


class _LazyTwin:
    """Calls the serial twin of one kernel, creating the twins on first use."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *args: Any) -> Any:
        twin = serial_twins()[self.name]
        setattr(kernels, self.name, twin)
        return twin(*args)


def fork_unsafe_layer_active() -> bool:
    """Whether this process runs parallel kernels on GNU OpenMP (unsafe across ``fork``).

    ``False`` before any parallel kernel has run (no layer is started yet: a
    child starts its own) and for TBB, ``workqueue`` and Intel OpenMP.
    """
    try:
        layer = numba.threading_layer()
    except ValueError:  # no parallel function has run in this process
        return False
    if layer != "omp":
        return False
    try:
        from numba.np.ufunc import omppool

        return str(omppool.openmp_vendor) == "GNU"
    except (ImportError, AttributeError):  # pragma: no cover - unknown build: be safe
        return True


def _after_fork_in_child() -> None:
    # a thread of the parent may have held the lock at the fork: the child's copy would
    # stay locked, and no thread of the child would ever release it
    kernels.lock = threading.Lock()
    if fork_unsafe_layer_active():
        kernels.use_serial()


#: The table :mod:`softmaxtheory.accelerated.cpu` calls the kernels through.
kernels = KernelTable()


def chunk_state_arrays(x: np.ndarray, chunk: int, nchunk: int) -> tuple[np.ndarray, ...]:
    """The T7 states of the `nchunk` consecutive chunks of `chunk` items of the flat `x`.

    Returns the arrays ``(m, nnan, c, neff, r, t)``: per chunk its maximum, 1 where
    it holds a NaN (else 0), the count at the maximum, the unmasked count and the
    shifted and weighted sums (:func:`chunk_states`).
    """
    m = np.empty(nchunk, dtype=x.dtype)
    nnan = np.empty(nchunk, dtype=np.int64)
    c = np.empty(nchunk, dtype=np.int64)
    neff = np.empty(nchunk, dtype=np.int64)
    r = np.empty(nchunk)
    t = np.empty(nchunk)
    kernels.chunk_states(x, chunk, m, nnan, c, neff, r, t)
    return m, nnan, c, neff, r, t


def long_row_state(row: np.ndarray) -> tuple[bool, float, int, int, float, float]:
    """The T7 state ``(bad, M, C, N, R, T)`` of one row of any length.

    Its chunks of :data:`CHUNK` items are merged left to right, the fixed order
    every caller shares.
    """
    m, nnan, c, neff, r, t = chunk_state_arrays(row, CHUNK, -(-row.size // CHUNK))
    bad, M, C, N, R, T = kernels.merge_chunks(m.astype(np.float64), nnan, c, neff, r, t)
    return bool(bad), float(M), int(C), int(N), float(R), float(T)


os.register_at_fork(after_in_child=_after_fork_in_child)
