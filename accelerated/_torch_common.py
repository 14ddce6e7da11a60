r"""Shared pieces of the torch path: dtypes, validation, row statistics and β.

Private module of :mod:`softmaxtheory.accelerated.torch`. The statistics of a
row follow theorem T7: with :math:`z_j = x_j - \max x`,

.. math::

    s = \sum_j e^{z_j}, \qquad t = \sum_j e^{z_j} z_j, \qquad H = \log s - t / s,

which has no :math:`0 \cdot \log 0` term (the listing's NaN on one-hot
half-precision rows cannot occur) and is differentiable everywhere the row is
regular. β follows :meth:`softmaxtheory.spec.Schedule.beta_float`: it is
evaluated in float64 from the row's entropy and unmasked count.
"""

from __future__ import annotations

import functools
import math
import numbers
import sys
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import torch
from torch.autograd import forward_ad

from .._formats import DTYPES, FORMATS
from ..spec import Constant, LogLength, Polynomial, Schedule, refuse_dtype

__all__ = [
    "HALF_DTYPES",
    "TailMask",
    "as_flag",
    "as_float_tensor",
    "as_index",
    "as_real",
    "autocast_dtype",
    "beta_bound",
    "beta_floor",
    "beta_from_entropy",
    "broadcast_shapes",
    "compact",
    "constant_under_compile",
    "entropy_from_stats",
    "exact_entropy",
    "fill_where",
    "horner",
    "into",
    "is_compiling",
    "may_reuse",
    "mul_pow2",
    "poly_floats",
    "shifted_logits",
    "stats_dtype",
    "transformed",
    "unwrapped",
    "valueless",
]

#: Input dtypes whose statistics are kept in float32 (those whose working format is float32).
HALF_DTYPES = tuple(getattr(torch, n) for n in DTYPES if FORMATS[n].internal.name != n)

_FLOAT_DTYPES = tuple(getattr(torch, n) for n in DTYPES)


#: torch.compiler.is_compiling (torch 2.3 and later)
is_compiling = getattr(torch.compiler, "is_compiling", lambda: False)


def valueless(t: torch.Tensor) -> bool:
    """Whether `t` has a shape but no values: a meta tensor, or a fake one.

    Shape inference runs a model on the ``meta`` device or under ``FakeTensorMode``
    (memory estimators, sharding planners); SDPA gives results of the right shape
    there, and the host reads of the attention functions could not: a fake tensor's
    device is a real one's, so ``tolist()`` raised ``DataDependentOutputException``.
    False while :func:`torch.compile` traces, whose graph breaks at those reads instead.
    """
    if t.device.type == "meta":
        return True
    if is_compiling():
        return False
    fake = getattr(getattr(torch, "_subclasses", None), "FakeTensor", None)
    return fake is not None and isinstance(t, fake)


def transformed(*tensors: torch.Tensor | None) -> bool:
    """Whether a ``torch.func`` transform wraps one of `tensors`, or forward AD gives it a tangent.

    Under ``vmap``, ``grad``, ``jvp``, ``jacrev``, ``jacfwd`` (and their
    compositions) and ``torch.autograd.forward_ad``, only operations with
    autograd formulas and batching rules may touch the tensors: no Triton
    launch, no ``out=`` kernel, no autograd Function of ours (the paths that
    see this take torch's own operations instead). False while
    :func:`torch.compile` traces (Dynamo cannot call the wrapper test, and
    its graph holds no wrapped tensor).
    """
    if is_compiling():
        return False
    wrapped = torch._C._functorch.is_functorch_wrapped_tensor
    dual = forward_ad._current_level >= 0
    return any(
        t is not None and (wrapped(t) or (dual and forward_ad.unpack_dual(t).tangent is not None))
        for t in tensors
    )


def unwrapped(t: torch.Tensor) -> torch.Tensor:
    """The plain tensor under every ``torch.func`` wrapper of `t` (`t` itself if none).

    Under ``vmap`` it holds every mapped slice at once, so a maximum read from
    it bounds each slice's: the host reads that choose a path (magnitudes,
    "any NaN?") use it, since a mapped tensor has no single value to read.
    """
    if is_compiling():
        return t
    while torch._C._functorch.is_functorch_wrapped_tensor(t):
        t = torch._C._functorch.get_unwrapped(t)
    return t


def autocast_dtype(t: object) -> torch.dtype | None:
    """The dtype autocast casts float32 operands to on the device of tensor `t`; None if off.

    ``scaled_dot_product_attention`` under ``torch.autocast`` computes in that dtype
    (float32 operands cast to it, the output in it); the attention functions do the
    same, then run with autocast off, so that their own products keep the precision
    their error model assumes.
    """
    if not isinstance(t, torch.Tensor):
        return None
    kind = t.device.type
    try:
        on, dtype = torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind)
    except (TypeError, AttributeError):  # torch < 2.4: one function per device type
        if kind == "cuda":
            on, dtype = torch.is_autocast_enabled(), torch.get_autocast_gpu_dtype()
        elif kind == "cpu":
            on, dtype = torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype()
        else:
            return None
    except RuntimeError:  # a device type autocast does not know (meta)
        return None
    return dtype if on else None


def stats_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the statistics of `dtype` inputs are computed in (float32 or float64)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def as_float_tensor(x: object, name: str) -> torch.Tensor:
    """Validate a tensor argument; integer tensors are promoted to float64 (the spec).

    Raises
    ------
    TypeError
        If `x` is not a tensor, is sparse (not ``torch.strided``), or its dtype
        is not real floating or integer.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if isinstance(x, torch.masked.MaskedTensor):
        # (its operators are masked-aware, ours are not: a permute already fails inside it)
        remedy = (
            f"pass {name}.get_data().masked_fill(~{name}.get_mask(), float('-inf')) (-inf "
            "logits are removed)"
            if name == "x"
            else f"pass {name}.get_data() and exclude keys with attn_mask"
        )
        raise TypeError(f"{name} must be a plain tensor, got a MaskedTensor; {remedy}")
    if x.is_nested:
        # (a nested tensor of the strided layout passes the layout test below)
        raise TypeError(
            f"{name} must be a dense (strided) tensor, got a nested tensor; pad it "
            "(torch.nested.to_padded_tensor(x, float('-inf')) for logits: -inf entries are "
            "removed; for attention, pad q, k, v and mask the padded keys)"
        )
    if x.layout != torch.strided:
        raise TypeError(f"{name} must be a dense (strided) tensor, got layout {x.layout}")
    if x.dtype in _FLOAT_DTYPES:
        return x
    if not x.dtype.is_floating_point and not x.dtype.is_complex and x.dtype != torch.bool:
        out = x.to(torch.float64)
        if x.dtype.itemsize >= 8 and x.numel() and not (is_compiling() or transformed(x)):
            _refuse_rounded_integers(x, out, name)
        return out
    raise refuse_dtype(name, x.dtype, "tensor")


def _refuse_rounded_integers(x: torch.Tensor, out: torch.Tensor, name: str) -> None:
    """Refuse a 64-bit integer tensor holding a value float64 does not (beyond 2**53).

    As :func:`softmaxtheory.spec.exact_float64` does for arrays: rounded,
    ``[2**53, 2**53 + 1]`` gave 0.5 each. One read of the tensor and a host
    synchronisation, for integer input only; under ``torch.compile`` and
    ``torch.func`` transforms (which cannot branch on values) it is promoted unchecked.
    """
    limit = 2.0**63 if x.dtype == torch.int64 else 2.0**64
    fits = (out < limit) & (out >= -limit)
    back = torch.where(fits, out, torch.zeros_like(out)).to(x.dtype)
    bad = ~fits | (back != x)
    if bool(bad.any()):
        value = x.reshape(-1)[int(bad.reshape(-1).to(torch.uint8).argmax())].item()
        raise ValueError(
            f"{name} holds the integer {value}, which float64 cannot hold exactly "
            f"(beyond 2**53): the answer would be for another input; convert it "
            f"({name}.double()) to accept the nearest floats"
        )


def as_flag(value: object, name: str) -> bool:
    """A bool argument (Python's or numpy's); anything else is a TypeError naming `name`."""
    if not isinstance(value, bool | np.bool_):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return bool(value)


def as_index(value: object, name: str) -> int:
    """An integer argument (Python's or numpy's, not a bool), as an int."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r}")
    return int(value)


def as_real(value: object, name: str) -> float:
    """A real argument as a float.

    Python's or numpy's int or float, not a bool; or a 0-d real tensor, as SDPA takes
    ``scale=torch.tensor(0.5)`` (its value is read on the host).
    """
    if isinstance(value, torch.Tensor) and value.ndim == 0:
        if value.dtype == torch.bool or value.is_complex():
            raise TypeError(f"{name} must be a float, got a tensor of dtype {value.dtype}")
        return float(value.item())
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a float, got {value!r}")
    return float(value)


def broadcast_shapes(*shapes: tuple[int, ...] | torch.Size) -> tuple[int, ...]:
    """The broadcast of `shapes` (numpy's rule), as :func:`torch.broadcast_shapes`.

    Plain tuples of ints, without the symbolic-shape machinery of
    :func:`torch.broadcast_shapes` (about 25 µs a call on the attention path,
    before any kernel starts). Raises RuntimeError, as torch does, when the
    shapes do not broadcast.
    """
    ndim = 0
    for shape in shapes:  # not max(..., default=0): torch.compile breaks its graph there
        ndim = max(ndim, len(shape))
    out = [1] * ndim
    for shape in shapes:
        for i, n in enumerate(shape, ndim - len(shape)):
            if n != 1 and out[i] != n:
                if out[i] != 1:
                    raise RuntimeError(
                        f"shapes {', '.join(str(tuple(s)) for s in shapes)} do not broadcast "
                        f"(dimension {i - ndim}: {out[i]} and {n})"
                    )
                out[i] = n
    return tuple(out)


def compact(t: torch.Tensor) -> torch.Tensor:
    """`t` without its broadcast dimensions: a view of size 1 wherever the stride is 0.

    An elementwise op on the view touches each stored value once; its result
    broadcasts back to the shape of `t` (a row count expanded over batch and
    heads costs one value per key position, not one per row).
    """
    if all(st or n == 1 for n, st in zip(t.shape, t.stride(), strict=True)):
        return t
    shape = [n if st else 1 for n, st in zip(t.shape, t.stride(), strict=True)]
    return t.as_strided(shape, t.stride())


def into(reuse: bool, t: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """``{"out": t}`` when `reuse` (the op then writes its result over `t`), else ``{}``.

    For intermediates of a call's own that are dead once the op has read them:
    written over only where nothing records them (no autograd graph, no
    ``torch.func`` transform, no compilation; see :func:`may_reuse`). The op
    and its operands are the same either way, so are the bits.
    """
    return {"out": t} if reuse and t is not None else {}


@dataclass(frozen=True)
class TailMask:
    """A boolean mask whose True entries all lie in the columns from `start` on.

    `tail` marks them among those columns (broadcastable to ``t[..., start:]``), as a
    causal mask does in a tile of queries ``i0:i1``: only its columns after ``i0`` hold
    masked entries. :func:`fill_where` then reads and writes those columns alone.
    """

    start: int
    tail: torch.Tensor

    def full(self, like: torch.Tensor) -> torch.Tensor:
        """The whole mask, of `like`'s shape (a boolean tensor)."""
        head = torch.zeros((), dtype=torch.bool, device=like.device)
        head = head.expand(*like.shape[:-1], self.start)
        return torch.cat((head, self.tail.expand(*like.shape[:-1], -1)), dim=-1)


def fill_where(
    t: torch.Tensor, where: torch.Tensor | TailMask | None, value: float, reuse: bool
) -> torch.Tensor:
    """``torch.where(where, value, t)`` for a Python scalar `value`; over `t` when `reuse`.

    In place it is ``masked_fill_`` (``torch.where`` has no ``out=`` form with a
    scalar), which took 0.70 ms against 2.6 ms for the ``where`` on 4096 x 1024
    float32 with nothing masked: no tensor to allocate and fault in. A
    :class:`TailMask` is filled in place over its columns alone; None fills nothing.
    """
    if where is None:
        return t
    if isinstance(where, TailMask):
        if reuse:
            t[..., where.start :].masked_fill_(where.tail, value)
            return t
        where = where.full(t)
    return t.masked_fill_(where, value) if reuse else torch.where(where, value, t)


def may_reuse(x: torch.Tensor) -> bool:
    """Whether intermediates computed from `x` may be written over (:func:`into`).

    Not while autograd records a graph through `x` (its backward reads them), under a
    ``torch.func`` transform or forward-mode AD (no ``out=`` kernels there), or while
    :func:`torch.compile` or ``torch.jit.trace`` traces (the compiler plans the buffers
    itself; a trace must record the same operations whether or not `x` requires grad,
    or its check of the graph fails).
    """
    if is_compiling() or torch.jit.is_tracing() or (torch.is_grad_enabled() and x.requires_grad):
        return False
    return not transformed(x)


def mul_pow2(x: torch.Tensor, exponent: int) -> torch.Tensor:
    """``x * 2**exponent`` with no overflowing power formed (exact unless it over/underflows)."""
    while exponent != 0:
        step = max(-1000, min(exponent, 1000))
        x = x * 2.0**step
        exponent -= step
    return x


def shifted_logits(
    x: torch.Tensor,
    masked: torch.Tensor | TailMask | None,
    log2_unit: int = 0,
    reuse: bool = False,
    own: bool = False,
    invariant: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Overflow-safe shifted logits :math:`z = x - \max x` of rows along the last axis.

    The row maximum :math:`m` is taken over the row (``-inf`` where every
    entry is masked). :math:`z_j = (x_j - m)\,2^{\mathrm{log2\_unit}}`
    is clamped below at the dtype's most negative finite number: for finite
    rows whose spread exceeds the float maximum, :math:`x_j - m` would round to
    ``-inf`` and :math:`e^{z_j} z_j` to ``0 * -inf = NaN``; clamped, the item
    still gets :math:`e^{z_j} = 0` (its exact weight rounds to zero in every
    format) and contributes exactly 0 to every sum. So does :math:`e^{\beta z_j}`
    for any β above :math:`2^{10}` over the float maximum; below it (a tiny
    constant schedule) the adaptive softmax forms that exponent as
    :math:`\beta x_j - \beta m` instead. Masked entries give 0 (`masked` None: the
    caller knows that no entry is ``-inf``, and nothing is filled).
    Both ``where`` branches are finite, so no NaN reaches a gradient. With
    `reuse` (:func:`may_reuse`) one tensor of x's size is formed and written over; `own`
    (`x` is the caller's scratch, dead once shifted) writes the shifted logits over `x`.
    `invariant` (the caller's result does not change when a row is shifted) takes
    :math:`m` without a gradient: its exact gradient is :math:`-\sum_j \bar z_j = 0`,
    which in floats can be ``inf - inf`` (a huge β times the weights' gradients).

    Returns
    -------
    tuple of torch.Tensor
        ``(z, m)``: the shifted logits (masked entries 0) and the row maxima
        (keepdim, ``-inf`` for fully masked rows).
    """
    m = torch.amax(x.detach() if invariant else x, dim=-1, keepdim=True)
    m_safe = torch.where(m == -torch.inf, torch.zeros_like(m), m)
    d = torch.sub(x, m_safe, **into(reuse and own, x))
    d = fill_where(d, masked, 0.0, reuse)  # a scalar branch: no tensor of x's size
    if log2_unit:
        d = mul_pow2(d, log2_unit)
    d = torch.clamp(d, min=-torch.finfo(x.dtype).max, **into(reuse, d))
    return d, m


def entropy_from_stats(s: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    r"""Entropy :math:`H = \log s - t/s` from the T7 statistics (``s = 0`` gives 0).

    The result is clamped below at 0 (the true entropy is never negative; the
    clamp only removes rounding error of one-hot rows).
    """
    empty = s == 0
    s_safe = torch.where(empty, torch.ones_like(s), s)
    h = torch.log(s_safe) - t / s_safe
    h = torch.where(empty, torch.zeros_like(h), h)
    return torch.clamp(h, min=0.0)


def exact_entropy(
    z: torch.Tensor,
    masked: torch.Tensor | TailMask | None,
    reuse: bool,
    scratch: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r"""The weights :math:`e = e^{z}` (0 where masked), :math:`s = \sum e` and the entropy.

    :math:`H` from the T7 statistics (:func:`entropy_from_stats`), :math:`t = \sum e z`.
    With `reuse` the product :math:`e z` is written over `scratch`, or over :math:`e`
    itself when no scratch is given (the weights returned are then spent), and the
    weights into `out` where one is given (a tensor of z's shape).
    """
    e = fill_where(torch.exp(z, **into(reuse, out)), masked, 0.0, reuse)  # (a scalar branch)
    s = e.sum(-1)
    t = torch.mul(e, z, **into(reuse, e if scratch is None else scratch)).sum(-1)
    return e, s, entropy_from_stats(s, t)


def constant_under_compile(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark `fn` as :func:`torch.compiler.assume_constant_result` does, without its import.

    Under :func:`torch.compile`, a call of `fn` is made while tracing and its result
    becomes a constant of the graph (the host-side functions of a schedule below, so
    that their exact arithmetic is no graph break). torch's decorator imports
    ``torch._dynamo`` to set one attribute on `fn`; that import took 3.0 s here, as
    long as ``import torch`` itself (2.7 s), for every user of this module, most of
    whom never compile. ``tests/test_torch_robust.py`` checks that torch's decorator
    still sets exactly this attribute, and that this module's import leaves Dynamo
    unloaded.
    """
    fn._dynamo_marked_constant = True  # type: ignore[attr-defined]
    return fn


def _memo(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Memoize a host-side function of a schedule (parsing its exact parameters is slow).

    Schedules are frozen dataclasses; an unhashable one (a user's subclass)
    is simply not cached.
    """
    cached = functools.lru_cache(maxsize=256)(fn)

    @functools.wraps(fn)
    def call(*args: Any) -> Any:
        try:
            return cached(*args)
        except TypeError:  # unhashable arguments
            return fn(*args)

    return call


@constant_under_compile
@_memo
def poly_floats(schedule: Polynomial) -> tuple[tuple[float, ...], float]:
    """The polynomial's coefficients and threshold as floats (constants under ``torch.compile``)."""
    return tuple(float(c) for c in schedule.exact_coefficients), float(schedule.exact_threshold)


@constant_under_compile
@_memo
def _schedule_float(schedule: Schedule, name: str) -> float:
    """A float parameter of a schedule (a constant under ``torch.compile``)."""
    return float(getattr(schedule, name))


#: Entropies computed in float32 may exceed log n by their rounding: the window of
#: :func:`beta_bound` reaches this far (relatively and absolutely) past it.
_ENTROPY_SLACK = 2.0**-10

#: Pieces of that window in :func:`_polynomial_max`.
_PIECES = 64


def _polynomial_max(coeffs: tuple[float, ...], lo: float, hi: float) -> float:
    """An upper bound of P over ``[lo, hi]``, ``0 <= lo <= hi``, before rounding errors.

    Horner's rule in interval arithmetic over :data:`_PIECES` pieces whose ends are
    computed by one formula (so that they meet exactly and cover the window).
    """
    top = -math.inf
    width = hi - lo
    for j in range(_PIECES):
        a = lo + width * j / _PIECES
        b = hi if j == _PIECES - 1 else lo + width * (j + 1) / _PIECES
        p_lo = p_hi = coeffs[0]
        for c in coeffs[1:]:
            ends = (p_lo * a, p_lo * b, p_hi * a, p_hi * b)
            p_lo, p_hi = min(ends) + c, max(ends) + c
        top = max(top, p_hi)
    return top


@constant_under_compile
@_memo
def beta_bound(schedule: Schedule, n_max: int) -> float | None:
    r"""An upper bound of β over all rows of at most `n_max` unmasked items, on the host.

    A row's entropy lies in :math:`[0, \log n_{\max}]` (widened by
    :data:`_ENTROPY_SLACK` for a computed one). The polynomial schedule gives
    :math:`\beta = 1` below its threshold :math:`\theta` and
    :math:`\max(P(H), 1)` above, so its bound is the largest :math:`P` over
    :math:`[\theta, \log n_{\max}]`, from interval arithmetic over pieces
    (:func:`_polynomial_max`), plus Horner's rounding error
    :math:`(2d + 2)\,2^{-52} \sum_k |c_k|\, h^{d-k}` with
    :math:`h = \max(1, \log n_{\max})`. For the paper's polynomial at
    :math:`n_{\max} = 4096` that gives 3.36 (its largest value there is 2.42), where the
    sum alone gave 651: a tight bound spares reading β back in
    :func:`~._torch_attention._fused_grad_ok`. Scalable-Softmax gives
    :math:`\beta = s \log n \le s \max(1, \log n_{\max})`; a constant is itself. The
    bound is doubled against the rounding of β's float evaluation. None for a
    user's schedule, or when the bound overflows a float (β is then read back
    from the device).
    """
    h = max(1.0, math.log(max(n_max, 1)))
    try:
        if isinstance(schedule, Polynomial):
            coeffs, threshold = poly_floats(schedule)
            d = len(coeffs) - 1
            size = math.fsum(abs(c) * h ** (d - i) for i, c in enumerate(coeffs))
            if not math.isfinite(size):
                return None
            hi = math.log(max(n_max, 1)) * (1.0 + _ENTROPY_SLACK) + _ENTROPY_SLACK
            lo = max(threshold, 0.0)
            bound = 1.0
            if lo < hi:
                bound = _polynomial_max(coeffs, lo, hi) + (2 * d + 2) * 2.0**-52 * size
        elif isinstance(schedule, Constant):
            bound = float(schedule.exact_beta)
        elif isinstance(schedule, LogLength):
            bound = float(schedule.exact_s) * h
        else:
            return None
    except OverflowError:
        return None
    bound = 2.0 * max(1.0, bound)
    return bound if math.isfinite(bound) else None


@constant_under_compile
@_memo
def beta_floor(schedule: Schedule) -> float | None:
    r"""A lower bound of β over rows of at least two unmasked items, on the host.

    A polynomial schedule gives :math:`\max(P(H), 1) \ge 1` (or 1); a constant is
    itself (its float rounded down); Scalable-Softmax gives :math:`s \log n \ge s
    \log 2`. None for a user's schedule. A row of one item has weight 1 whatever β.
    """
    if isinstance(schedule, Polynomial):
        return 1.0
    if isinstance(schedule, Constant):
        return _float_down(schedule.exact_beta)
    if isinstance(schedule, LogLength):
        return _float_down(schedule.exact_s) * 0.6931471805599452  # ln 2, rounded down
    return None


def _float_down(value: Fraction) -> float:
    """A non-negative rational rounded down to a float (0.0 below the subnormals).

    What ``_certify.interval.float_directed(value, -1)`` does, without importing
    mpmath with the torch path (which keeps its import light).
    """
    try:
        f = float(value)
    except OverflowError:
        return sys.float_info.max
    return math.nextafter(f, 0.0) if f > 0 and Fraction(f) > value else f


def horner(h: torch.Tensor, coeffs: tuple[float, ...]) -> torch.Tensor:
    """P(h) by Horner's rule, as numpy.polyval (whose first step 0 * h + c0 is c0)."""
    p = h * coeffs[0] if len(coeffs) > 1 else torch.full_like(h, coeffs[0])
    for i, c in enumerate(coeffs[1:], 2):
        p = p + c if i == len(coeffs) else (p + c) * h
    return p


def beta_from_entropy(
    schedule: Schedule, entropy: torch.Tensor | None, n_eff: torch.Tensor
) -> torch.Tensor:
    r"""β of each row in float64, the semantics of ``Schedule.beta_float``.

    Parameters
    ----------
    schedule : Schedule
        The temperature schedule.
    entropy : torch.Tensor or None
        Row entropies (any float dtype; differentiable). ``None`` when the
        schedule does not read the entropy.
    n_eff : torch.Tensor
        Number of unmasked items of each row (integer), broadcastable to the
        rows; ``n_eff == 0`` gives β = 1.

    Returns
    -------
    torch.Tensor
        float64 β, shape of the rows.
    """
    if isinstance(schedule, Polynomial):
        if entropy is None:
            raise ValueError("the polynomial schedule needs the row entropies")
        h = entropy.to(torch.float64)
        coeffs, threshold = poly_floats(schedule)
        if h.requires_grad and torch.is_grad_enabled() and beta_bound(schedule, 2**63) is None:
            # Horner may overflow for some entropy (every one is below log 2**63): a row whose
            # P(H) overflows has a β that no longer moves with H, but the backward of its
            # steps would form 0 * inf = NaN; its entropy enters detached (a where's backward
            # selects, it does not multiply)
            with torch.no_grad():
                fits = torch.isfinite(horner(h, coeffs))
            h = torch.where(fits, h, h.detach())
        p = horner(h, coeffs)
        beta = torch.where(h > threshold, torch.clamp(p, min=1.0), 1.0)
        beta = torch.where(torch.isnan(h), h, beta)
        if h.shape == n_eff.shape:
            return beta
        return torch.broadcast_to(beta, broadcast_shapes(h.shape, n_eff.shape))
    if isinstance(schedule, Constant):
        value = _schedule_float(schedule, "exact_beta")
        shape = n_eff.shape if entropy is None else broadcast_shapes(entropy.shape, n_eff.shape)
        return torch.full((), value, dtype=torch.float64, device=n_eff.device).expand(shape)
    if isinstance(schedule, LogLength):
        n = compact(n_eff).to(torch.float64)
        s = _schedule_float(schedule, "exact_s")
        beta = s * torch.log(torch.where(n == 0, torch.ones_like(n), n))
        beta = torch.where(n == 0, torch.ones_like(beta), beta)
        shape = n_eff.shape if entropy is None else broadcast_shapes(entropy.shape, n_eff.shape)
        return torch.broadcast_to(beta, shape)
    # A user subclass of Schedule: its float semantics through numpy (rows only), which
    # carries no gradient; refusing beats a gradient that silently treats beta as constant.
    if entropy is not None and entropy.requires_grad and torch.is_grad_enabled():
        raise ValueError(
            f"schedule {schedule!r} is evaluated through numpy (Schedule.beta_float), so no "
            "gradient can flow through beta; pass detach_beta=True (or use Polynomial, "
            "Constant or LogLength)"
        )
    if transformed(entropy, n_eff):
        raise TypeError(
            f"schedule {schedule!r} is evaluated through numpy (Schedule.beta_float), which "
            "cannot run under a torch.func transform (vmap, grad, jacrev, jvp, ...) or "
            "forward-mode AD; use Polynomial, Constant or LogLength there, or call it outside "
            "the transform"
        )
    if valueless(n_eff):
        # meta or fake tensors (shape inference, a model built on the meta device) have no values
        # to copy to the host: β of the rows' shape, as the built-in schedules give there
        shape = n_eff.shape if entropy is None else broadcast_shapes(entropy.shape, n_eff.shape)
        return torch.empty(shape, dtype=torch.float64, device=n_eff.device)
    h_np = entropy.detach().to("cpu", torch.float64).numpy() if entropy is not None else math.nan
    values = schedule.checked_beta(h_np, n_eff.detach().cpu().numpy())
    return torch.as_tensor(values, dtype=torch.float64, device=n_eff.device)
