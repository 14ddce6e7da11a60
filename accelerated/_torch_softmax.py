r"""Adaptive softmax along the last axis of a torch tensor (private).

The row is shifted by its maximum, :math:`z = x - \max x`, the entropy is read
from the T7 statistics (or, with ``entropy_eps > 0``, as the paper's listing
:math:`-\sum p \log(p + \varepsilon)`), β from the schedule, and the output is
:math:`\operatorname{softmax}(\beta z) = \operatorname{softmax}(\beta x)`.
Masked (``-inf``) entries never enter an arithmetic operation, so gradients
stay finite on masked and fully masked rows.

Where nothing records the intermediates (:func:`~._torch_common.may_reuse`), those
of x's size are written over once read: two tensors of that size are formed (the
shifted logits and the weights, which then hold the result) where each operation
would form one, a peak of about 2.25 times a float32 input rather than 5.3. The
same operations run on the same operands, so the bits are the same.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..spec import Constant, LogLength, Polynomial, Schedule
from ._torch_common import (
    TailMask,
    beta_bound,
    beta_floor,
    beta_from_entropy,
    exact_entropy,
    fill_where,
    horner,
    into,
    is_compiling,
    may_reuse,
    mul_pow2,
    poly_floats,
    shifted_logits,
    stats_dtype,
    transformed,
)

__all__ = ["adaptive_softmax_lastdim", "adaptive_softmax_rows"]


#: The default of :func:`adaptive_softmax_lastdim`'s `masks`: read them from the logits.
READ = object()


def adaptive_softmax_lastdim(
    x: torch.Tensor,
    schedule: Schedule,
    entropy_eps: float,
    detach_beta: bool,
    log2_unit: int = 0,
    masks: TailMask | object | None = READ,
    scratch: Callable[[str, tuple[int, ...]], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Adaptive softmax of rows along the last axis, in the statistics dtype of `x`.

    float16 and bfloat16 rows are converted to float32 (:func:`stats_dtype`) only
    for the shift, the one operation that reads them whole. The logits are
    ``x * 2**log2_unit`` (``log2_unit > 0`` for logits that would overflow the
    dtype, pre-scaled by the caller); the shifted logits are overflow-safe
    (:func:`shifted_logits`), so a finite row never gives NaN.

    Callers that know which entries of `x` are ``-inf`` say so in `masks`: None (no
    entry) or a :class:`TailMask` (exactly its entries); by default they are read from
    `x`. A caller whose `x` is its own scratch, dead after this call, passes `scratch`
    (``scratch(role, shape)`` gives a tensor to write over): where nothing records the
    operations, the shifted logits then go over `x` and the weights into
    ``scratch("e", ...)``, which holds the probabilities returned.

    Returns
    -------
    tuple of torch.Tensor
        ``(probabilities, entropy, beta)``; entropy and β have the row shape,
        probabilities and β in the statistics dtype of `x` (``n = 0`` rows are
        handled by the caller).
    """
    reuse = may_reuse(x)
    sd = stats_dtype(x.dtype)
    if masks is READ:
        masked = x == -torch.inf
        n_eff = x.shape[-1] - masked.sum(-1)  # (no pass over a negated mask)
    else:
        masked = masks
        n_eff = torch.full(x.shape[:-1], x.shape[-1], dtype=torch.int64, device=x.device)
        if masked is not None:
            n_eff = n_eff - masked.tail.sum(-1)
    tiny = _beta_may_be_tiny(schedule, sd)  # (then x and z are read again below)
    own = scratch is not None and x.dtype == sd and not tiny  # (x.to(sd) is x itself)
    # (a copy lives for the shift; the result is shift-invariant, so m needs no gradient)
    z, m = shifted_logits(x.to(sd), masked, log2_unit, reuse, own, invariant=True)
    entropy = None
    spare = None  # with `reuse`, a dead tensor of x's size and dtype
    if schedule.needs_entropy and entropy_eps == 0.0:
        out = None if scratch is None else scratch("e", tuple(z.shape))
        e, _, entropy = exact_entropy(z, masked, reuse, out=out)  # (with `reuse`, e is spent)
        spare = e if reuse else None
    elif schedule.needs_entropy:
        e = fill_where(torch.exp(z), masked, 0.0, reuse)
        s = e.sum(-1)  # the paper's listing: -sum p log(p + eps)
        s_safe = torch.where(s == 0, torch.ones_like(s), s)
        p = e / s_safe.unsqueeze(-1)
        entropy = -(p * torch.log(p + entropy_eps)).sum(-1)
        entropy = torch.where(s == 0, torch.zeros_like(entropy), entropy)
    h_beta = entropy.detach() if detach_beta and entropy is not None else entropy
    beta = beta_from_entropy(schedule, h_beta, n_eff)
    # β above the float maximum of x (a huge constant, say) would round to inf, and inf * 0
    # is NaN: then β z is formed in float64 (β's dtype), where β is finite
    # under torch.compile the bound over every row length, which holds for this one: the
    # length may be symbolic (a second shape), and a symbolic argument cannot be folded
    # into the graph ("assume_constant_result argument conversion failed")
    wide = _beta_wide(schedule, sd, 2**63 if is_compiling() else x.shape[-1])
    beta = beta if wide else beta.to(sd)
    # a β that overflowed float64 (a schedule evaluated beyond the range) stands for a
    # finite exact β: at the maximum β z is 0, not inf * 0; clamped, it still underflows
    # every exponential whose z is not itself of the order of the least normal number
    beta = beta.clamp(max=torch.finfo(beta.dtype).max)
    if detach_beta:
        beta = beta.detach()
    zb = z.to(beta.dtype) if wide else z
    if reuse and not wide and (spare is not None or not tiny):
        y = torch.mul(beta.unsqueeze(-1), zb, out=z if spare is None else spare)
    else:
        y = beta.unsqueeze(-1) * zb
    y = fill_where(y, masked, -torch.inf, reuse)
    if tiny:
        if not isinstance(masked, torch.Tensor):  # (a mask the caller knew: the whole of it)
            masked = x == -torch.inf if masked is None else masked.full(x)
        y = _overflowed_shifts(x, z, m, masked, beta, log2_unit, y)
    e2 = torch.exp(y, **into(reuse, y))
    s2 = e2.sum(-1, keepdim=True)
    s2 = torch.where(s2 == 0, torch.ones_like(s2), s2)
    beta = beta.to(sd)
    if entropy is None:
        entropy = torch.full_like(beta, torch.nan)
    return torch.div(e2, s2, **into(reuse, e2)).to(sd), entropy, beta


def adaptive_softmax_rows(
    x: torch.Tensor, schedule: Schedule, entropy_eps: float, detach_beta: bool
) -> torch.Tensor:
    """The probabilities of :func:`adaptive_softmax_lastdim`, with a lean backward.

    Where autograd records a graph through `x` and the row's β is formed in the
    statistics dtype (:func:`_lean_backward_applies`), the forward runs as
    :class:`_AdaptiveSoftmax`, which keeps `x` and the result for the backward
    instead of every intermediate; elsewhere autograd records the forward's own
    operations.
    """
    if _lean_backward_applies(x, schedule, entropy_eps):
        return _AdaptiveSoftmax.apply(x, schedule, detach_beta)
    return adaptive_softmax_lastdim(x, schedule, entropy_eps, detach_beta)[0]


def _lean_backward_applies(x: torch.Tensor, schedule: Schedule, entropy_eps: float) -> bool:
    """Whether :class:`_AdaptiveSoftmax` takes the call (settled on the host).

    A graph is recorded through `x`; no ``torch.func`` transform, compilation or
    ``torch.jit.trace`` (they record the operations themselves); the exact entropy (``entropy_eps ==
    0``); a built-in schedule; and neither a β too large for the statistics dtype
    (formed in float64 then) nor one small enough for the overflowed shifts' path.
    """
    if not (torch.is_grad_enabled() and x.requires_grad) or entropy_eps != 0.0:
        return False
    if is_compiling() or torch.jit.is_tracing() or transformed(x):
        return False  # (a trace must record the same operations with and without a graph)
    if not isinstance(schedule, Polynomial | Constant | LogLength):
        return False
    sd = stats_dtype(x.dtype)
    return not (_beta_wide(schedule, sd, x.shape[-1]) or _beta_may_be_tiny(schedule, sd))


class _AdaptiveSoftmax(torch.autograd.Function):
    r"""The adaptive softmax of rows, keeping the logits and the result for the backward.

    With :math:`u = \beta z`, :math:`q = \operatorname{softmax}(u)` and upstream
    gradient :math:`g`: :math:`\bar u = q \odot (g - \langle g, q\rangle)`, so
    :math:`\bar x = \beta\,\bar u + \bar\beta\,\beta'(H)\,\partial H/\partial x`
    with :math:`\bar\beta = \langle \bar u, z\rangle` and, for the plain weights
    :math:`p = \operatorname{softmax}(x)`,
    :math:`\partial H / \partial x_j = -p_j(\log p_j + H)`. The backward recomputes
    :math:`z`, :math:`p`, :math:`H` and β from the logits with the forward's operations
    (one exponential of the row), so autograd keeps two tensors of its size (the
    logits, which are the caller's, and the result) where the recorded forward kept
    about seven; written in torch operations, it is itself differentiable (double
    backward).
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, schedule: Schedule, detach_beta: bool) -> torch.Tensor:
        probs = adaptive_softmax_lastdim(x, schedule, 0.0, detach_beta)[0]
        ctx.save_for_backward(x, probs)
        ctx.schedule, ctx.detach_beta = schedule, detach_beta
        return probs

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:
        x, q = ctx.saved_tensors
        gx = _adaptive_softmax_backward(x, q, grad, ctx.schedule, ctx.detach_beta)
        return gx.to(x.dtype), None, None


def _adaptive_softmax_backward(
    x: torch.Tensor, q: torch.Tensor, grad: torch.Tensor, schedule: Schedule, detach_beta: bool
) -> torch.Tensor:
    r""":math:`\bar x` of :class:`_AdaptiveSoftmax`, in the statistics dtype (see there).

    Unless the backward is itself recorded (``create_graph=True``), its intermediates of
    the row's size are written over once read (:func:`~._torch_common.into`): beside the
    result, the shifted logits, the weights and one buffer.
    """
    reuse = not torch.is_grad_enabled()
    sd = q.dtype
    masked = x == -torch.inf
    n_eff = x.shape[-1] - masked.sum(-1)
    z, _ = shifted_logits(x.to(sd), masked, 0, reuse)  # 0 where masked
    lean = schedule.needs_entropy and not detach_beta  # β moves with H
    g = grad.to(sd)
    buf = torch.empty_like(z) if reuse else None  # e z, then g q, then ū
    entropy = e = s = None
    if schedule.needs_entropy:
        e, s, entropy = exact_entropy(z, masked, reuse, buf)
    buf = torch.mul(g, q, **into(reuse, buf))
    h_beta = entropy.detach() if detach_beta and entropy is not None else entropy  # (as forward)
    beta = beta_from_entropy(schedule, h_beta, n_eff).to(sd).clamp(max=torch.finfo(sd).max)
    # ū = q (g - <g, q>): 0 where masked (q = 0 there)
    gu = torch.sub(g, buf.sum(-1, keepdim=True), **into(reuse, buf))
    gu = torch.mul(gu, q, **into(reuse, gu))
    if not lean:
        return beta.unsqueeze(-1) * gu
    gx = torch.mul(gu, z)  # <ū, z> first; the buffer then holds x̄
    gh = gx.sum(-1) * _beta_slope(schedule, entropy)
    gx = torch.mul(beta.unsqueeze(-1), gu, **into(reuse, gx))
    s_safe = torch.where(s == 0, torch.ones_like(s), s).unsqueeze(-1)
    p = torch.div(e, s_safe, **into(reuse, e))
    # log p + H, with log p finite where masked (p = 0 there, and so the term)
    dh = torch.sub(z, torch.log(s_safe), **into(reuse, z))
    dh = torch.add(dh, entropy.unsqueeze(-1), **into(reuse, dh))
    dh = torch.mul(dh, p, **into(reuse, dh))
    dh = torch.mul(dh, gh.unsqueeze(-1), **into(reuse, dh))
    return torch.sub(gx, dh, **into(reuse, gx))


def _beta_slope(schedule: Polynomial, h: torch.Tensor) -> torch.Tensor:
    r""":math:`d\beta/dH` of the polynomial schedule at the entropies `h`, in their dtype.

    :math:`P'(H)` where β is :math:`P(H)` (above the threshold, :math:`P(H) \ge 1` and
    finite, as ``clamp``'s derivative counts the bound), else 0; evaluated in float64
    by Horner's rule on the derivative's coefficients.
    """
    coeffs, threshold = poly_floats(schedule)
    hd = h.to(torch.float64)
    p = horner(hd, coeffs)
    d = len(coeffs) - 1
    slope = horner(hd, tuple((d - k) * c for k, c in enumerate(coeffs[:-1]))) if d else hd * 0
    live = (hd > threshold) & (p >= 1.0) & torch.isfinite(p)
    return torch.where(live, slope, torch.zeros_like(slope)).to(h.dtype)


def _beta_wide(schedule: Schedule, sd: torch.dtype, n: int) -> bool:
    """Whether β z is formed in float64 (on the host).

    So it is where β may exceed a quarter of `sd`'s maximum over rows of up to `n`
    items (a huge constant, say): β rounded to inf would make inf * 0 NaN.
    """
    if sd == torch.float64:
        return False
    bound = beta_bound(schedule, n)
    return bound is None or bound > torch.finfo(sd).max / 4


def _beta_may_be_tiny(schedule: Schedule, dtype: torch.dtype) -> bool:
    r"""Whether β may be small enough that a clamped shift's weight is not 0 (on the host).

    :func:`shifted_logits` clamps a shift :math:`x_j - m` beyond the float range to
    the dtype's most negative value :math:`-M`; its weight :math:`e^{-\beta M}` is 0
    while :math:`\beta M > 745`, that is for β above :math:`2^{10}/M` (about
    :math:`5.7 \cdot 10^{-306}` in float64). Only a constant or Scalable-Softmax
    schedule, or a user's, goes below.
    """
    floor = beta_floor(schedule)
    return floor is None or floor < 1024.0 / torch.finfo(dtype).max


def _overflowed_shifts(
    x: torch.Tensor,
    z: torch.Tensor,
    m: torch.Tensor,
    masked: torch.Tensor,
    beta: torch.Tensor,
    log2_unit: int,
    y: torch.Tensor,
) -> torch.Tensor:
    r"""`y` (:math:`\beta z`) with each clamped shift's exponent as :math:`\beta x - \beta m`.

    A shift beyond the float range has :math:`x_j < 0 < m`, so
    :math:`\beta' x_j - \beta' m` (:math:`\beta' = \beta\,2^{\mathrm{log2\_unit}}`)
    is two terms of one sign: each rounded once, no cancellation. For β = 1e-310,
    ``[1e308, -1e308]`` has exponents 0 and -0.02; the clamped shift gave -0.018.
    `m` is the rows' maxima from :func:`shifted_logits` (keepdim, ``-inf`` for a
    fully masked row).
    """
    clamped = (z == -torch.finfo(z.dtype).max) & ~masked
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m)).to(beta.dtype)
    b = mul_pow2(beta, log2_unit).unsqueeze(-1)
    exact = b * x.to(beta.dtype) - b * m
    return torch.where(clamped, exact.to(y.dtype), y)
