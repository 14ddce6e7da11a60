r"""Adaptive attention in torch: T10 composition, chunked path, Triton path (private).

T10: for the logits :math:`x_{ij} = \mathrm{scale}\; q_i \cdot k_j` (masked keys
removed), with :math:`p_i = \operatorname{softmax}(x_i)`,

.. math::

    H_i = \mathrm{LSE}_i - \sum_j p_{ij} x_{ij}
        = \mathrm{LSE}_i - \mathrm{scale}\; q_i \cdot \operatorname{Attn}(q_i, K, K),

and :math:`\operatorname{softmax}(\beta_i x_i)` has the logits of the query
:math:`\beta_i q_i`. So adaptive attention is two calls of a fused attention
primitive that returns the log-sum-exp: pass 1 with values = keys (entropy),
pass 2 with the queries scaled by β. No :math:`L \times S` matrix is formed.

An additive mask with finite non-zero entries (a bias) adds
:math:`\sum_j p_{ij}\,\mathrm{mask}_{ij}` to the entropy and is scaled by
:math:`\beta_i` in pass 2 (the spec scales the whole logit); such masks, and the
``entropy_eps > 0`` mode, go through the chunked path: blocks of queries, the
full adaptive softmax on a ``(block, S)`` logit tile, memory
:math:`O(\mathrm{block} \cdot S)`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

from ..spec import Polynomial, Schedule
from ._torch_common import (
    HALF_DTYPES,
    TailMask,
    as_flag,
    as_float_tensor,
    as_real,
    beta_bound,
    beta_from_entropy,
    broadcast_shapes,
    compact,
    exact_entropy,
    fill_where,
    into,
    may_reuse,
    mul_pow2,
    shifted_logits,
    stats_dtype,
    transformed,
    unwrapped,
    valueless,
)
from ._torch_softmax import READ, adaptive_softmax_lastdim

__all__ = [
    "BACKENDS",
    "Prepared",
    "attention",
    "attention_entropy",
    "entropy_lse",
    "entropy_lse_backward",
    "entropy_lse_grad",
    "logit_log2_bound",
    "operands_log2_bound",
    "pass1_early",
    "prepare",
    "triton_available",
    "triton_entropy_lse",
]

#: Accepted values of the ``backend`` argument.
BACKENDS = ("auto", "hybrid", "composition", "triton", "chunked")

#: Elements of one logit tile of the chunked path (float32: 8 MiB; a few live per tile).
CHUNK_ELEMENTS = 1 << 21


@dataclass
class Prepared:
    """Validated attention inputs, as 4-D (B, H, L, D) views."""

    q: torch.Tensor
    k: torch.Tensor  # (B, H // group, S, D); (B, Hkv, S, D) for H = 0 (group 0)
    v: torch.Tensor | None  # (B, H // group, S, Dv) as k; None for attention_entropy
    lead: tuple[int, ...]
    scale: float
    is_causal: bool
    keep: torch.Tensor | None  # bool (B, H, L, S) view, True = attend
    add: torch.Tensor | None  # additive mask (B, H, L, S) view, q dtype or float
    bias: bool  # the additive mask has finite non-zero entries
    n_eff: torch.Tensor  # (B, H, L) int64: unmasked keys per query
    bad: torch.Tensor | None  # (B, H, L) bool: rows whose answer is NaN
    group: int = 1  # query heads per key head (grouped-query attention)
    empty: bool = False  # B*H, L or S is zero, or meta tensors: nothing is computed
    log2_bound: float = -math.inf  # log2 of a bound on |logit| (finite entries)
    log2_qmax: float = -math.inf  # log2 of the largest finite |q|
    values_finite: bool = True  # every entry of v is finite (known from the scan)
    log2_vmax: float = -math.inf  # log2 of the largest |v| (finite values; nan: not read)
    # pass 1 queued before the scan was read (see pass1_early); None when not, or void
    pass1: tuple[torch.Tensor, torch.Tensor] | None = None
    # a torch.func transform or forward AD is active (see transformed): torch's own ops only
    transformed: bool = False
    log2_kmax: float = -math.inf  # log2 of the largest finite |k|


def _to4(t: torch.Tensor, lead: tuple[int, ...], heads: int | None = None) -> torch.Tensor:
    """A (B, H, n, d) view of `t` broadcast to `lead` (H replaced by `heads` for GQA)."""
    target = lead if heads is None else (*lead[:-1], heads)
    if t.ndim == 4 and len(target) == 2 and t.shape[:2] == target:
        return t  # already (B, H, n, d): the common case, no view to make
    t = t.expand(*target, *t.shape[-2:])
    if len(target) <= 2:
        return t.reshape((1,) * (2 - len(target)) + tuple(t.shape))
    # flatten, not reshape(-1, ...): with no elements (a zero n or d) -1 is ambiguous
    return t.flatten(0, -4)


def _unbroadcast(t: torch.Tensor) -> torch.Tensor:
    """The smallest view of `t` that expands back to it.

    Each leading dimension of stride 0 (a broadcast, as a mask of shape (L, S) has
    beside a batch of heads) is taken at size 1; the last dimension is kept whole.
    A mask's derived tensors (its additive form, its counts) are then computed once
    per distinct slice, not once per head, and expanded.
    """
    shape, strides = t.shape, t.stride()
    index = tuple(
        slice(0, 1) if strides[i] == 0 and shape[i] > 1 else slice(None) for i in range(t.dim() - 1)
    )
    return t[index]


def _abs_max(t: torch.Tensor) -> float:
    """Largest finite magnitude of `t` (0.0 if none; of every slice under ``vmap``)."""
    t = _unbroadcast(unwrapped(t))
    if t.numel() == 0:
        return 0.0
    with torch.no_grad():
        a = torch.where(torch.isfinite(t), t.abs(), torch.zeros((), dtype=t.dtype, device=t.device))
        return float(a.amax())


def _finite_or_zero(t: torch.Tensor) -> torch.Tensor:
    """`t` with its non-finite entries replaced by 0 (differentiable; 0 gradient there)."""
    return torch.where(torch.isfinite(t), t, torch.zeros((), dtype=t.dtype, device=t.device))


def _log2(x: float) -> float:
    return math.log2(x) if x > 0 else -math.inf


def logit_log2_bound(scale: float, qmax: float, kmax: float, d: int) -> float:
    r"""A bound on :math:`\log_2 |x_{ij}|`: that of :math:`|\mathrm{scale}|\,\max|q|\,\max|k|\,D`.

    A sum of logarithms, so no product overflows.
    """
    return _log2(abs(scale)) + _log2(qmax) + _log2(kmax) + _log2(d)


def operands_log2_bound(q: torch.Tensor, k: torch.Tensor, scale: float) -> float:
    """:func:`logit_log2_bound` of the finite entries of `q` and `k` (one device read each)."""
    return logit_log2_bound(scale, _abs_max(q), _abs_max(k), q.shape[-1])


def _scan(tensors: list[torch.Tensor]) -> torch.Tensor:
    r"""The largest magnitude :math:`\max |t|` of each tensor, on the device.

    One fused reduction per tensor (each tensor is read once, no temporary of its
    size; see :func:`_magnitude`), stacked so that one device-to-host copy
    (``.tolist()``) reads them all; the caller reads it as late as it can, so
    that its own host work overlaps the reductions. NaN where the tensor holds a
    NaN, ``inf`` where it holds an infinity and no NaN, 0.0 for an empty tensor.
    Under ``vmap``, of all slices together (:func:`~._torch_common.unwrapped`).
    """
    tensors = [unwrapped(t) for t in tensors]
    with torch.no_grad():  # the tensors share a dtype, in which each maximum is exact
        norms = [
            _magnitude(t) if t.numel() else torch.zeros((), dtype=t.dtype, device=t.device)
            for t in tensors
        ]
        return torch.stack(norms)


def _magnitude(t: torch.Tensor) -> torch.Tensor:
    r""":math:`\max |t|` of the non-empty `t` as a 0-d tensor of its dtype (NaN propagates).

    On CUDA ``vector_norm`` of order :math:`\infty`; on the CPU the larger of
    ``-min`` and ``max`` from one ``aminmax``, which torch 2.13 runs vectorised
    where its :math:`\infty`-norm is not: on 32 × 4096 × 64 float32 entries, two
    threads, 0.9 ms against 11 ms (6 × faster in float64, 17 × in bfloat16). The
    maximum's magnitude is exact either way, and a NaN or infinity reaches it.
    """
    if t.device.type == "cpu":
        low, high = torch.aminmax(t)
        return torch.maximum(high, -low)
    return torch.linalg.vector_norm(t, math.inf)


def _start_read(t: torch.Tensor) -> Callable[[], list[float]]:
    """Start copying the small tensor `t` to the host; the returned call waits for that copy.

    On CUDA the copy goes to pinned memory without blocking and an event marks its end,
    so kernels queued after this (pass 1 queued early, :func:`pass1_early`) neither delay
    the read nor wait for it: ``t.tolist()`` would wait for everything queued before it
    on the stream. Elsewhere the values are read when asked for.
    """
    if t.device.type != "cuda":
        return t.tolist
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)  # queued on the current stream of t's device
    done = torch.cuda.Event()
    done.record(torch.cuda.current_stream(t.device))  # that stream, whatever device is current

    def wait() -> list[float]:
        done.synchronize()
        return host.tolist()

    return wait


def prepare(
    q: object,
    k: object,
    v: object,
    attn_mask: object,
    is_causal: bool,
    scale: float | None,
    *,
    enable_gqa: bool = False,
    early: Callable[[Prepared], tuple[torch.Tensor, torch.Tensor] | None] | None = None,
) -> Prepared:
    """Validate the SDPA-style arguments and bring them to 4-D views (`v` may be None).

    `early` (see :func:`pass1_early`) is called with the views before the scan of the
    operands is read back, so that its kernels are queued behind the scan's and the
    device has work while the host waits; its result is kept as ``Prepared.pass1``
    only if the scan leaves the views as they were (all of `q` and `k` finite).
    """
    given = [("q", q), ("k", k)] + ([("v", v)] if v is not None else [])
    q = as_float_tensor(q, "q")
    k = as_float_tensor(k, "k")
    named = [("q", q), ("k", k)]
    if v is not None:
        v = as_float_tensor(v, "v")
        named.append(("v", v))
    for name, t in named:
        if t.ndim < 2:
            raise ValueError(
                f"{name} must have shape (..., length, features), got {tuple(t.shape)}"
            )
    if len({t.dtype for _, t in named}) != 1:
        # the dtypes as given: an integer tensor's promotion to float64 is not the user's
        promoted = any(t.dtype != u.dtype for (_, t), (_, u) in zip(given, named, strict=True))
        raise TypeError(
            "q, k and v must share a dtype, got "
            + ", ".join(str(t.dtype) for _, t in given)
            + (" (integer tensors count as float64)" if promoted else "")
        )
    if len({t.device for _, t in named}) != 1:
        raise ValueError(
            "q, k and v must be on one device, got " + ", ".join(str(t.device) for _, t in named)
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must share the feature size, got {tuple(q.shape)} and {tuple(k.shape)}"
        )
    if v is not None and k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"k and v must share the key length, got {tuple(k.shape)} and {tuple(v.shape)}"
        )
    is_causal = as_flag(is_causal, "is_causal")
    enable_gqa = as_flag(enable_gqa, "enable_gqa")
    L, D = q.shape[-2:]
    S = k.shape[-2]
    scale = (1.0 / math.sqrt(D) if D else 1.0) if scale is None else as_real(scale, "scale")
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale!r}")
    group, kv_heads = 1, None
    if enable_gqa and min(q.ndim, k.ndim, q.ndim if v is None else v.ndim) < 3:
        # as the reference (spec.expand_kv_heads) and SDPA: grouping needs a head axis;
        # ignoring the flag on 2-d operands gave a result nothing else would check
        shapes = [tuple(t.shape) for t in (q, k, v) if t is not None]
        raise ValueError(f"enable_gqa needs a head axis (-3) on q, k and v, got shapes {shapes}")
    kv_shapes = [k.shape[:-2]] + ([v.shape[:-2]] if v is not None else [])
    v_heads = v.shape[-3] if v is not None and v.ndim >= 3 else None
    if (
        enable_gqa
        and q.ndim >= 3
        and k.ndim >= 3
        and (q.shape[-3] != k.shape[-3] or v_heads not in (None, q.shape[-3]))
    ):
        hq, hkv = q.shape[-3], k.shape[-3]
        if hkv == 0 or hq % hkv:
            raise ValueError(
                "enable_gqa needs the query heads q.shape[-3] to be a multiple of the key "
                f"heads k.shape[-3], got {hq} and {hkv}"
            )
        # a v without a head dimension broadcasts over the key heads
        hv = hkv if v_heads is None else v_heads
        if hv != hkv:
            if hv == 0 or hq % hv:
                raise ValueError(
                    "enable_gqa needs the query heads q.shape[-3] to be a multiple of the "
                    f"value heads v.shape[-3], got {hq} and {hv}"
                )
            # keys and values with their own head counts (SDPA takes them): each head is
            # repeated for the query heads it serves, as SDPA's own math path does
            assert v is not None
            k = k.repeat_interleave(hq // hkv, dim=-3)
            v = v.repeat_interleave(hq // hv, dim=-3)
            kv_shapes = [k.shape[:-2], v.shape[:-2]]
        else:
            # no query heads (hq = 0) give group 0: an empty problem, whose result is
            # SDPA's empty one; the keys and values keep their own heads
            group, kv_heads = hq // hkv, hkv
            kv_shapes = [(*s[:-1], hq) for s in kv_shapes]
    try:
        lead = broadcast_shapes(q.shape[:-2], *kv_shapes)
    except RuntimeError as exc:
        raise ValueError(f"q, k, v leading dimensions do not broadcast: {exc}") from exc
    mask = None
    if attn_mask is not None:
        if is_causal:
            raise ValueError("pass either attn_mask or is_causal=True, not both")
        if not isinstance(attn_mask, torch.Tensor):
            raise TypeError(f"attn_mask must be a torch.Tensor, got {type(attn_mask).__name__}")
        plain = not isinstance(attn_mask, torch.masked.MaskedTensor)
        if attn_mask.layout != torch.strided or attn_mask.is_nested or not plain:
            got = (
                "a nested tensor" if attn_mask.is_nested
                else f"layout {attn_mask.layout}" if plain
                else "a MaskedTensor"
            )  # fmt: skip
            raise TypeError(f"attn_mask must be a dense (strided) tensor, got {got}")
        if attn_mask.device != q.device:
            raise ValueError(f"attn_mask must be on {q.device}, got {attn_mask.device}")
        if attn_mask.dtype != torch.bool and not attn_mask.dtype.is_floating_point:
            raise TypeError(f"attn_mask must be boolean or floating, got dtype {attn_mask.dtype}")
        if attn_mask.dtype.is_floating_point and attn_mask.dtype.itemsize < 2:
            raise TypeError(
                f"attn_mask of dtype {attn_mask.dtype} is not supported (torch has no "
                "arithmetic for it): pass a boolean mask, or a float16, bfloat16, float32 or "
                "float64 one"
            )
        if attn_mask.requires_grad and torch.is_grad_enabled():
            raise ValueError("attn_mask requires grad: gradients to the mask are not supported")
        try:
            full = broadcast_shapes(attn_mask.shape, (*lead, L, S))
        except RuntimeError as exc:
            raise ValueError(
                f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to {(*lead, L, S)}"
            ) from exc
        if full[-2:] != (L, S):
            raise ValueError(
                f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to "
                f"(..., {L}, {S}) (queries, keys)"
            )
        if tuple(full[:-2]) != tuple(lead):
            raise ValueError(
                f"attn_mask of shape {tuple(attn_mask.shape)} would widen the leading "
                f"dimensions {tuple(lead)} of q, k and v to {tuple(full[:-2])}: the output "
                "follows q, k and v (as SDPA's does), so the mask may only broadcast to them"
            )
        mask = attn_mask.expand(*attn_mask.shape[:-2], L, S)  # a (..., L, 1) mask covers S
    # the reductions start now; their values are read after the views below are made
    read = _start_read(_scan([q, k] if v is None else [q, k, v]))
    q4 = _to4(q, lead)
    k4 = _to4(k, lead, kv_heads)
    v4 = None if v is None else _to4(v, lead, kv_heads)
    keep = add = None
    bias = False
    # meta and fake tensors (shape inference, a model built on the meta device) have no
    # values to read: like an empty problem, they get results of the right shape
    empty = q4.shape[0] * q4.shape[1] == 0 or L == 0 or S == 0 or valueless(q)
    if empty:
        n_eff = torch.zeros((*q4.shape[:2], L), dtype=torch.int64, device=q.device)
        return Prepared(q4, k4, v4, lead, scale, is_causal, None, None, False, n_eff, None,
                        group, True)  # fmt: skip
    if mask is None:
        if is_causal:
            rows = torch.arange(L, device=q.device)
            n_eff = torch.clamp(rows + 1, max=S).expand(*q4.shape[:2], L)
        else:
            n_eff = torch.full((), S, dtype=torch.int64, device=q.device).expand(*q4.shape[:2], L)
    else:
        m4 = _to4(mask, lead)
        base = _unbroadcast(m4)  # a mask of shape (L, S) is read once, not once per head
        if mask.dtype == torch.bool:
            keep = m4
        else:
            add = m4
            finite = torch.isfinite(base)
            bias = bool(torch.any(unwrapped(finite & (base != 0))))
            base = base != -torch.inf
            keep = base.expand(m4.shape)
        n_eff = base.sum(-1).expand(*q4.shape[:2], L)
    early_q, early_k, pass1 = q4, k4, None
    if early is not None:
        pass1 = early(Prepared(q4, k4, v4, lead, scale, is_causal, keep, add, bias, n_eff,
                               None, group))  # fmt: skip
    # one read of each operand and one host sync: all finite (the common case) settles
    # the NaN rows and the overflow guard; otherwise the detailed (slower) scans run
    qmax, kmax, *vmax = read()
    qk_finite = math.isfinite(qmax) and math.isfinite(kmax)
    # an additive -inf removes a key only after its logit is formed: a non-finite query or
    # key under it still makes the logit NaN (the reference's IEEE rule); a boolean False
    # or a causal mask removes the key before any arithmetic
    bad = _bad_rows(q4, k4, None if add is not None else keep, add, is_causal, group, qk_finite)
    if bad is not None and add is not None:
        add = _finite_mask(add)
    # A non-finite entry makes its rows NaN (bad) when its key is unmasked; where the key
    # is masked it must not reach the fused kernels at all (NaN + -inf is NaN there), so
    # the kernels see 0 in its place and the bad rows are overwritten afterwards.
    if not math.isfinite(qmax):
        qmax = _abs_max(q4)
        q4 = _finite_or_zero(q4)
    if not math.isfinite(kmax):
        kmax = _abs_max(k4)
        k4 = _finite_or_zero(k4)
    lq = _log2(qmax)
    lb = logit_log2_bound(scale, qmax, kmax, D)
    if bias:
        lb = max(lb, _log2(_abs_max(add))) + 1.0
    if q4 is not early_q or k4 is not early_k:
        pass1 = None  # computed on operands the scan has since replaced
    if pass1 is not None and lb > _early_log2_bound():
        pass1 = None  # queued as for small logits (RAW); larger ones take another variant
    v_ok = all(map(math.isfinite, vmax))
    return Prepared(q4, k4, v4, lead, scale, is_causal, keep, add, bias, n_eff, bad,
                    group, False, lb, lq, v_ok, _log2(vmax[0]) if vmax and v_ok else math.nan,
                    pass1, transformed(q, k, v, attn_mask), _log2(kmax))  # fmt: skip


def _finite_mask(add: torch.Tensor) -> torch.Tensor:
    """The additive mask with its NaN and ``+inf`` entries 0 (their rows are NaN anyway).

    Those rows are overwritten with NaN after the kernels (:func:`_bad_rows`), which
    stops their gradient; but inside the kernels their NaN weights met every key and
    value in the backward's sums (0 * NaN), and one NaN entry made every key's and
    value's gradient NaN. A ``-inf`` entry (a masked key) stays. Read and written once
    per distinct slice (:func:`_unbroadcast`); `add` itself when it holds none.
    """
    with torch.no_grad():
        base = _unbroadcast(add)
        wrong = torch.isnan(base) | (base == torch.inf)
        if not bool(unwrapped(wrong).any()):
            return add
    return torch.where(wrong, torch.zeros((), dtype=base.dtype, device=base.device), base).expand(
        add.shape
    )


def _bad_rows(
    q: torch.Tensor,
    k: torch.Tensor,
    keep: torch.Tensor | None,
    add: torch.Tensor | None,
    is_causal: bool,
    group: int = 1,
    qk_finite: bool = False,
) -> torch.Tensor | None:
    """Rows whose spec answer is NaN: a non-finite query, unmasked key or mask entry.

    `keep` is the boolean mask (None for an additive one, whose ``-inf`` entries
    do not shield a NaN logit). A query with no key kept by it is never bad (its
    row is zeros, the special-value table's fully masked row), whatever `q`
    holds. With
    `qk_finite` (every entry of q and k is known finite) only the additive
    mask is read.
    """
    with torch.no_grad():
        add = None if add is None else _unbroadcast(add)  # (L, S), not (B, H, L, S)
        mask_bad = add is not None and bool(unwrapped(torch.isnan(add) | (add == torch.inf)).any())
        if qk_finite and not mask_bad:
            return None
        q_bad = ~torch.isfinite(q).all(-1)
        k_bad = ~torch.isfinite(k).all(-1)
        if not mask_bad and not unwrapped(q_bad).any() and not unwrapped(k_bad).any():
            return None
        if group > 1:
            k_bad = k_bad.repeat_interleave(group, dim=1)
        L, S = q.shape[-2], k.shape[-2]
        if keep is not None:
            # a fully masked query never forms a logit: zeros even if q is not finite
            q_bad = q_bad & keep.any(-1)
            row_bad = (keep & k_bad.unsqueeze(-2)).any(-1)
        elif is_causal:
            upto = torch.clamp(torch.arange(L, device=q.device), max=S - 1)
            row_bad = (torch.cumsum(k_bad.to(torch.int64), -1) > 0)[..., upto]
        else:
            row_bad = k_bad.any(-1, keepdim=True)
        bad = q_bad | row_bad
        if add is not None:
            bad = bad | (torch.isnan(add) | (add == torch.inf)).any(-1)
        return bad.expand(*q.shape[:2], L)


# ---------------------------------------------------------------- overflow guard


def _fits(p: Prepared, beta_max: float = 1.0) -> bool:
    r"""Whether the fused kernels and the tiles in the statistics dtype form these logits well.

    The fused kernels form :math:`x_{ij}` and :math:`\beta_i x_{ij}` in the
    statistics dtype and :math:`\beta_i q_i` in the input dtype; with
    :math:`|x_{ij}| \le 2^{\mathrm{log2\_bound}}` (``scale * max|q| * max|k| * D``
    plus the largest bias) they cannot overflow when this holds. Otherwise the
    overflow-safe chunked path runs (float64 logits, scaled by a power of two
    where even float64 would overflow). Each kernel applies the scale in its own
    order, so every order must work, not only the logits' size:

    * the raw products :math:`q_i \cdot k_j` (torch's CPU flash kernel, the Triton
      pass 1) must fit however small the scale: queries and keys of :math:`10^{20}`
      with scale :math:`10^{-40}` (logits near 1) gave 0 and NaN;
    * a scaled operand (``scale * q``, or :math:`\sqrt{\mathrm{scale}}` on both) must
      fit when the scale exceeds 1: queries of 1e308 against keys of 0 with scale 1e308
      (logits 0) gave NaN (inf * 0), and the hybrid 0;
    * the scale must be a normal number of the statistics dtype: a float32 kernel
      rounded :math:`10^{-50}` to 0 (a causal row then lost its weights) and
      :math:`3 \cdot 10^{-45}` to a subnormal 7 % off;
    * a product that underflows loses up to half the smallest subnormal :math:`\tau`,
      so each logit up to :math:`D\,\tau \max(|q|, |k|, 1) \max(\mathrm{scale}, 1)\,\beta`
      in all: that must stay below an eighth of the unit roundoff :math:`u`.
      Queries of :math:`10^{-35}` scaled by :math:`10^{-9}` (subnormal) against keys of
      :math:`2.5\cdot 10^{37}` were 82 ulps off.

    Only operands near the ends of the float range fail these (float32:
    :math:`D \max(|q|,|k|) < 2^{121}` keeps the last one).
    """
    sd = stats_dtype(p.q.dtype)
    fi = torch.finfo(sd)
    lb_beta = _log2(beta_max) if beta_max > 0 else 0.0
    if not math.isfinite(lb_beta) and beta_max > 0:
        return False
    room = math.log2(fi.max) - 3.0
    if p.log2_bound + lb_beta > room:
        return False
    q_room = math.log2(torch.finfo(p.q.dtype).max) - 2.0
    if not (p.log2_qmax + lb_beta <= q_room and (not p.bias or p.log2_bound + lb_beta <= q_room)):
        return False
    lq, lk, ld = p.log2_qmax, p.log2_kmax, _log2(p.q.shape[-1])
    if lq + lk + ld + lb_beta > room:
        return False  # the raw products overflow
    s = abs(p.scale)
    if s != 0.0 and not fi.tiny <= s <= fi.max:
        return False  # the scale is not a normal number of the kernels' dtype
    up = _log2(s) if s else 0.0
    if up > 0.0 and not (lq + lb_beta + up <= q_room and lk + up <= q_room):
        return False  # scale * q or scale * k overflows
    tau = math.log2(fi.smallest_normal * fi.eps)
    lost = ld + max(lq, lk, 0.0) + max(up, 0.0) + max(lb_beta, 0.0) + tau - 1.0
    return lost <= math.log2(fi.eps / 2) - 3.0


def _beta_max(beta: torch.Tensor) -> float:
    with torch.no_grad():
        b = unwrapped(beta)
        b = torch.where(torch.isnan(b), torch.ones_like(b), b)  # NaN rows: bad anyway
        return float(b.amax()) if b.numel() else 1.0


def _beta_fits(p: Prepared, schedule: Schedule, beta: torch.Tensor) -> bool:
    """:func:`_fits` for the β of `schedule`: from its host-side bound, else β read back.

    The bound (:func:`beta_bound`) settles the common case without a device
    sync; only a schedule without one, or logits near the float maximum, read
    the largest β.
    """
    bound = beta_bound(schedule, p.k.shape[-2])
    if bound is not None and _fits(p, bound):
        return True
    return _fits(p, _beta_max(beta))


#: With a gradient, the largest log2 of the logits' bound (β included) for which a fused
#: kernel's backward runs (:func:`_fused_grad_ok`), by the dtype of its log-sum-exp.
FUSED_GRAD_LOG2_BOUND = {torch.float32: 14.0, torch.float64: 26.0}


def _fused_grad_ok(p: Prepared, schedule: Schedule | None, beta: torch.Tensor | None) -> bool:
    r"""Whether a fused kernel's backward (SDPA's, the CPU flash kernel's) is accurate here.

    Those backwards recompute each :math:`p_{ij} = e^{y_{ij} - \mathrm{LSE}_i}` from
    the stored log-sum-exp, whose rounding moves the exponent by about
    :math:`|y|\,2^{-t}` (:math:`t` = 24 for a float32 LSE, 53 for float64): a
    relative error of that size in every weight of the gradient, whatever the
    forward's accuracy. Three tied logits of :math:`10^8` in float32 gave each a
    weight of 1 instead of 1/3 (a value gradient of 2 where the exact one is 4/3).
    So with :math:`|\beta_i x_{ij}| \le 2^b`, the fused backward runs only for
    :math:`b \le` :data:`FUSED_GRAD_LOG2_BOUND` (14 for a float32 LSE: weights
    within about :math:`2^{-9}`; 26 for float64: :math:`2^{-26}`); above, the
    chunked path, whose backward forms the weights as its forward did. `schedule`
    and `beta` give β's bound (the schedule's host-side bound, else β read back);
    both None: pass 1, whose logits are :math:`x_{ij}` themselves.
    """
    limit = FUSED_GRAD_LOG2_BOUND[stats_dtype(p.q.dtype)]
    if schedule is None or beta is None:
        return p.log2_bound <= limit
    bound = beta_bound(schedule, p.k.shape[-2])
    if bound is not None and p.log2_bound + _log2(bound) <= limit:
        return True
    top = _beta_max(beta)
    return top <= 0.0 or p.log2_bound + _log2(top) <= limit


def _triton_interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def refuse_tracing(name: str) -> None:
    """Raise a TypeError under ``torch.jit.trace`` or ``torch.export`` (see *Compilation*).

    The torch page's *Compilation* paragraph says why: the host read of the operands'
    magnitudes is a data-dependent branch.
    """
    if _is_exporting():
        raise TypeError(
            f"{name} cannot be exported by torch.export: it reads its operands' magnitudes "
            "on the host to choose its path (the overflow guard, the NaN rows), which an "
            "exported graph cannot do (a data-dependent branch); use torch.compile, which "
            "breaks the graph there, or call it outside the exported code"
        )
    if torch.jit.is_tracing():
        raise TypeError(
            f"{name} cannot be traced by torch.jit.trace: it reads its operands' magnitudes "
            "on the host to choose its path (the overflow guard, the NaN rows), and a trace "
            "would keep its example inputs' path for every later input; use torch.compile, "
            "or call it outside the traced code"
        )


#: torch.compiler.is_exporting (torch 2.4 and later)
_is_exporting = getattr(torch.compiler, "is_exporting", lambda: False)


def _want_grad(*tensors: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


# ---------------------------------------------------------------- β-scaled queries


def _rowdot(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    r""":math:`\sum_d a_{\ldots d}\, b_{\ldots d}` in `dtype`, keepdim, over blocks of rows.

    The operands are converted to `dtype` a block of rows at a time
    (:data:`CHUNK_ELEMENTS` elements), so no converted copy of a whole
    operand is formed; each row's sum is the same as in one pass.
    """
    rows = max(1, a.shape[-2])
    block = max(1, CHUNK_ELEMENTS // max(1, a.numel() // rows))
    parts = [
        (a[..., i : i + block, :].to(dtype) * b[..., i : i + block, :].to(dtype)).sum(
            -1, keepdim=True
        )
        for i in range(0, rows, block)
    ]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-2)


def _times_rows(x: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """``x * beta`` in one kernel into the dtype of `x` (`beta` broadcast over the last axis)."""
    out = torch.empty_like(x)
    torch.mul(x, beta, out=out)
    return out


class _ScaleRows(torch.autograd.Function):
    r"""The queries :math:`\beta_i q_i`, rounded once to the dtype of `q`.

    One elementwise kernel reads `q` and writes the result in its dtype (the
    product is formed in the statistics dtype of β), so no float32 copy of
    the queries is made, and autograd keeps `q` (the caller's tensor) and
    β, not a converted copy. Backward: :math:`\bar q_i = \beta_i \bar y_i`
    (again one kernel into the dtype of `q`) and
    :math:`\bar\beta_i = \sum_d \bar y_{id} q_{id}` in β's dtype. Under
    ``create_graph=True`` both are recorded, so the gradient is differentiable
    again (second derivatives, gradient penalties).
    """

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx, q: torch.Tensor, beta: torch.Tensor
    ) -> torch.Tensor:
        ctx.save_for_backward(q, beta)
        return _times_rows(q, beta)

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        q, beta = ctx.saved_tensors
        dq = dbeta = None
        if ctx.needs_input_grad[0]:
            # under create_graph the product is recorded (an ``out=`` kernel is not)
            dq = (grad * beta).to(q.dtype) if torch.is_grad_enabled() else _times_rows(grad, beta)
        if ctx.needs_input_grad[1]:
            dbeta = _rowdot(grad, q, beta.dtype)
        return dq, dbeta


def scale_rows(q: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    r"""The β-scaled queries :math:`\beta_i q_i` in the dtype of `q` (differentiable).

    `beta` holds one value per query row (shape of ``q.shape[:-1]``, in the
    statistics dtype); see :class:`_ScaleRows`. Without a graph to record the
    product is formed directly (an autograd Function's call costs some 40 µs of
    host time before the kernel starts).
    """
    beta = beta.unsqueeze(-1)
    if transformed(q, beta):
        return (q * beta).to(q.dtype)  # recorded by the transform (vmap, jvp, ...)
    if torch.is_grad_enabled() and (q.requires_grad or beta.requires_grad):
        return _ScaleRows.apply(q, beta)
    return _times_rows(q, beta)


# ---------------------------------------------------------------- fused primitives


#: Elements the rows of an additive mask are padded to (16 bytes and more in every dtype).
_BIAS_ALIGN = 16


def _additive(p: Prepared) -> torch.Tensor | None:
    """The mask as an additive tensor in the dtype of q (0 / -inf for a boolean mask).

    Built at the mask's own size (:func:`_unbroadcast`) and expanded to (B, H, L, S),
    so a mask of shape (L, S) costs L·S elements, not B·H·L·S. Its rows start at
    multiples of :data:`_BIAS_ALIGN` elements, as SDPA pads a mask before its
    memory-efficient kernel, which refuses (raises) a bias whose row stride is not a
    multiple of its vector width: a key count such as 100 in float16.
    """
    if p.keep is None:
        return None
    src = _unbroadcast(p.keep if p.add is None else p.add)
    S = src.shape[-1]
    padded = -(-S // _BIAS_ALIGN) * _BIAS_ALIGN
    if p.transformed:  # (vmap cannot copy a batched mask into a plain buffer: out of place)
        vals = src if p.add is not None else torch.where(src, 0.0, -torch.inf)
        out = torch.nn.functional.pad(vals.to(p.q.dtype), (0, padded - S))[..., :S]
        return out.expand(p.keep.shape)
    buf = torch.empty((*src.shape[:-1], padded), dtype=p.q.dtype, device=p.q.device)
    out = buf[..., :S]
    if p.add is not None:
        out.copy_(src)
    else:
        out.fill_(0.0).masked_fill_(src.logical_not(), -torch.inf)
    return out.expand(p.keep.shape)


def _unit_last_stride(t: torch.Tensor) -> torch.Tensor:
    """`t`, copied to contiguous memory unless its last dimension has unit stride.

    The fused kernels of :func:`_lse_primitive` read each row as a contiguous vector.
    torch's CPU flash kernel does not check (torch 2.13): a view such as
    ``x.transpose(-1, -2).contiguous().transpose(-1, -2)`` or ``x[..., ::2]`` gave
    wrong numbers, NaN among them. A last dimension of size 1 is read at offset 0
    whatever its stride.
    """
    return t if t.shape[-1] <= 1 or t.stride(-1) == 1 else t.contiguous()


def _positive_scale(q: torch.Tensor, scale: float) -> tuple[torch.Tensor, float]:
    r"""Queries and scale for a fused kernel, with the same logits and a positive scale.

    :math:`s\,(q \cdot k) = |s|\,((-q) \cdot k)` exactly (negation is exact), and
    for :math:`s = 0` every logit of finite operands is 0, as it is for queries
    :math:`0 \cdot q` and scale 1 (the gradient with respect to `q` stays 0). The fused
    kernels assume :math:`s > 0`: torch's CPU flash kernel masks a causal entry after
    scaling, so ``is_causal=True`` with :math:`s \le 0` gave NaN rows (torch 2.13,
    through ``scaled_dot_product_attention`` too), and a flash kernel that takes the
    row maximum of unscaled products exponentiates :math:`s\,(x - \max x) \ge 0`
    when :math:`s < 0`.
    """
    if scale > 0.0:
        return q, scale
    if scale < 0.0:
        return -q, -scale
    return q * 0.0, 1.0


def _cpu_flash_takes(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, add: torch.Tensor | None
) -> bool:
    """Whether torch's CPU flash kernel takes these operands (else it raises).

    It wants four dimensions, one head size for `q`, `k` and `v`, and one dtype, the
    additive mask's included. Eager code could catch its RuntimeError, but a graph
    compiled by ``torch.compile`` raises it when the graph runs, past the caller's
    ``try``: compiled ``adaptive_attention`` with values narrower than the keys
    (``d_v != d``), or a float32 bias beside bfloat16 queries, stopped there.
    """
    return (
        q.dim() == k.dim() == v.dim() == 4
        and q.shape[-1] == k.shape[-1] == v.shape[-1]
        and q.dtype == k.dtype == v.dtype
        and (add is None or add.dtype == q.dtype)
    )


def _cuda_efficient_takes(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, add: torch.Tensor | None
) -> bool:
    """Whether torch's memory-efficient CUDA kernel takes these operands (else it raises).

    It wants four dimensions, one head size for `q` and `k`, one dtype (the additive
    mask's included, float64 excepted) and rows that start at multiples of its vector
    width (8 elements covers every dtype): by torch's source, with a head size such as
    12 the kernel it picks for aligned heads would refuse the queries' row stride. A
    mask from
    :func:`_additive` is padded to that width. As for :func:`_cpu_flash_takes`, the
    test comes first because a graph compiled by ``torch.compile`` raises past the
    caller's ``try``.
    """
    return (
        q.dim() == k.dim() == v.dim() == 4
        and q.shape[-1] == k.shape[-1]
        and q.dtype == k.dtype == v.dtype != torch.float64
        and q.shape[-1] % 8 == 0
        and v.shape[-1] % 8 == 0
        and all(_rows_aligned(t, 8) for t in (q, k, v))
        and (add is None or (add.dtype == q.dtype and _rows_aligned(add, 8)))
    )


def _rows_aligned(t: torch.Tensor, width: int) -> bool:
    """Whether the rows of `t` are aligned to `width` elements.

    That is: `t` starts a multiple of `width` elements into its allocation, its last stride
    is 1 and every other stride is a multiple of `width`.
    """
    strides = t.stride()
    return (
        t.storage_offset() % width == 0
        and (t.shape[-1] <= 1 or strides[-1] == 1)
        and all(s % width == 0 for s in strides[:-1])
    )


def _aligned_rows(t: torch.Tensor) -> torch.Tensor:
    """`t`, copied to contiguous memory unless :func:`_rows_aligned` (8 elements).

    The fused CUDA kernels load rows in 16-byte vectors: a view such as ``x[..., :64]`` of
    rows of 100 elements, or one that starts 4 elements into its buffer, is refused by the
    memory-efficient kernel (or misread by a kernel that does not check). A copy of a head
    size that is a multiple of 8 is aligned (a clone: ``contiguous`` keeps a contiguous
    view that starts unaligned).
    """
    return t if _rows_aligned(t, 8) else t.clone(memory_format=torch.contiguous_format)


#: The calls cuDNN's attention refused in this process, by (device, dtype, L, S, D, Dv,
#: causal): those take the flash kernel. One refusal used to turn cuDNN off for every
#: later call of the process, whatever its shape (about half the speed on an H200).
_CUDNN_REFUSED: set[tuple[object, ...]] = set()


def _cudnn_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The fused attention of cuDNN and its log-sum-exp, or None where cuDNN refuses the call.

    Its refusals depend on the cuDNN version and the shape, and are remembered for the
    call's signature (:data:`_CUDNN_REFUSED`); running out of memory is not a refusal,
    and is raised. A log-sum-exp of another size than the rows' counts as a refusal.
    """
    op = getattr(torch.ops.aten, "_scaled_dot_product_cudnn_attention", None)
    key = (str(q.device), q.dtype, q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1],
           is_causal)  # fmt: skip
    if op is None or key in _CUDNN_REFUSED:
        return None
    lead = q.shape[:-1]
    try:
        res = op(q, k, v, None, True, 0.0, is_causal, False, scale=scale)
    except torch.cuda.OutOfMemoryError:
        raise
    except (RuntimeError, NotImplementedError):
        res = None
    if res is None or res[1].numel() != math.prod(lead):
        _CUDNN_REFUSED.add(key)
        return None
    return res[0], res[1].reshape(lead)


def _lse_primitive(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    add: torch.Tensor | None,
    is_causal: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A fused attention call returning ``(out, lse)`` (``lse`` float32/64 or None).

    ``out`` is differentiable when grad is enabled; ``lse`` is not. A fully
    masked query gives ``out = 0``. ``lse`` is None when no fused kernel is
    available here (the caller then uses the chunked path).
    """
    aten = torch.ops.aten
    q, k, v = (_unit_last_stride(t) for t in (q, k, v))
    q, scale = _positive_scale(q, scale)
    if q.device.type == "cpu":
        if not _cpu_flash_takes(q, k, v, add):
            return q.new_zeros(()), None
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, is_causal, attn_mask=add, scale=scale
        )
        return out, lse
    cuda = q.device.type == "cuda"
    vector_rows = q.shape[-1] % 8 == 0 and v.shape[-1] % 8 == 0  # (else no copy can align)
    if cuda and q.dtype != torch.float64 and vector_rows:
        q, k, v = (_aligned_rows(t) for t in (q, k, v))
    if cuda and _cuda_efficient_takes(q, k, v, add):
        L = q.shape[-2]
        d_ok = q.shape[-1] == v.shape[-1] <= 256  # (multiples of 8: _cuda_efficient_takes)
        # The flash kernel aligns a causal mask to the bottom-right corner when L != S
        # (SDPA's public entry point never sends it such a call); SDPA's is_causal is
        # top-left, which the memory-efficient kernel implements.
        top_left_ok = not is_causal or L == k.shape[-2]
        if add is None and q.dtype in HALF_DTYPES and d_ok and top_left_ok:
            if not torch.compiler.is_compiling():
                # cuDNN's fused attention is what SDPA itself picks on recent GPUs (on one
                # H200 it ran about twice as fast as the flash kernel below); it returns the
                # log-sum-exp on request. Its refusals are caught (:func:`_cudnn_lse`); a
                # compiled graph would raise them past the ``try``, so compiled code takes
                # the flash kernel, whose limits d_ok states.
                res = _cudnn_lse(q, k, v, is_causal, scale)
                if res is not None:
                    return res
            res = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, is_causal, scale=scale)
            return res[0], res[1][..., :L]
        res = aten._scaled_dot_product_efficient_attention(
            q, k, v, add, True, 0.0, is_causal, scale=scale
        )
        return res[0], res[1][..., :L]
    return q.new_zeros(()), None


def _composition_entropy(
    p: Prepared, detach_beta: bool, add: torch.Tensor | None
) -> torch.Tensor | None:
    """Pass 1 of T10: the entropy of every query row, or None if no primitive fits.

    `add` is :func:`_additive` of `p`, built once for both passes.
    """
    q, k = p.q, p.k
    sd = stats_dtype(q.dtype)
    if p.log2_kmax + _log2(k.shape[-2]) > math.log2(torch.finfo(sd).max) - 3.0:
        # the kernel's unnormalised sum of the keys (the values here), up to S max|k|, could
        # overflow (4096 keys of 2e36: inf, an entropy of 0 where it is 8.3)
        return None
    grad = not detach_beta and _want_grad(q, k)
    if grad and not _fused_grad_ok(p, None, None):
        return None  # the primitive's backward would lose the weights: the chunked path
    try:
        with torch.set_grad_enabled(grad):
            a, lse = _lse_primitive(q, k, k, add, p.is_causal, p.scale)
            if lse is None:
                return None
            qa = p.scale * (q.to(sd) * a.to(sd)).sum(-1)
            h = lse.to(sd) - qa
            if grad:
                # the gradient of LSE is E_p[dx]: attention with detached weights, values K
                a_w, _ = _lse_primitive(q.detach(), k.detach(), k, add, p.is_causal, p.scale)
                sur = p.scale * (q.to(sd) * a_w.to(sd)).sum(-1)
                h = h + (sur - sur.detach())
    except (RuntimeError, NotImplementedError):
        return None  # this primitive refuses these shapes / dtypes: chunked path
    upper = torch.log(torch.clamp(compact(p.n_eff), min=1).to(sd))
    return torch.minimum(torch.clamp(h, min=0.0), upper)


def _composition(p: Prepared, schedule: Schedule, detach_beta: bool) -> torch.Tensor | None:
    sd = stats_dtype(p.q.dtype)
    add = _additive(p)
    entropy = None
    if schedule.needs_entropy:
        entropy = _composition_entropy(p, detach_beta, add)
        if entropy is None:
            return None
    beta = beta_from_entropy(schedule, entropy, p.n_eff).to(sd)
    if detach_beta:
        beta = beta.detach()
    if not _beta_fits(p, schedule, beta):
        return None  # beta * q or beta * x could overflow: the chunked path
    grad = _want_grad(p.q, p.k, p.v)
    if grad and not _fused_grad_ok(p, schedule, beta):
        return None  # the primitive's backward would lose the weights: the chunked path
    try:
        with torch.set_grad_enabled(grad):
            qb = scale_rows(p.q, beta)
            out, lse = _lse_primitive(qb, p.k, p.v, add, p.is_causal, p.scale)
    except (RuntimeError, NotImplementedError):
        return None
    return None if lse is None else out


# ---------------------------------------------------------------- chunked path


def _work(p: Prepared, safe: bool) -> tuple[torch.dtype, int, int, int]:
    """Working dtype and power-of-two exponents (of q, k, scale) of the tile logits.

    The normal path computes logits in the statistics dtype. The safe path
    computes them in float64 and, where even float64 would overflow, from
    ``q * 2**-a``, ``k * 2**-b`` and ``scale * 2**-c`` (exact scalings): the
    logits are then ``x' * 2**(a + b + c)``.
    """
    if not safe:
        return stats_dtype(p.q.dtype), 0, 0, 0
    if p.log2_bound + 2.0 < 1000.0:  # (the logits fit: see _scaled_operands for q * scale)
        return torch.float64, 0, 0, 0

    def excess(log2: float, limit: int) -> int:  # 0 for a zero operand (log2 = -inf)
        return max(0, math.ceil(log2) - limit) if math.isfinite(log2) else 0

    # (a bias near the float maximum lands here with q, k or the scale all 0: 0 each)
    a = excess(p.log2_qmax, 400)
    b = excess(_log2(_abs_max(p.k)), 400)
    c = excess(_log2(abs(p.scale)), 100)
    return torch.float64, a, b, c


def _tile_logits(
    p: Prepared,
    i0: int,
    i1: int,
    qs: torch.Tensor,
    kt: torch.Tensor,
    unit: int,
    post: float | None = None,
    scratch: _Scratch | None = None,
) -> torch.Tensor:
    r"""Logits of queries ``i0:i1`` against the keys they can see, masked entries ``-inf``.

    `qs` is the (scaled) query tensor and `kt` the transposed (scaled) keys
    (B, H // group, D, S), both in the working dtype; the logits carry the
    unit :math:`2^{\mathrm{unit}}`. Grouped heads multiply a (B, H/g, g, l, D)
    view of the queries by the shared keys (no repeated K). The tile has
    :func:`_visible_keys` columns: under ``is_causal`` the keys after the block's
    last query, masked for every row, are not formed. With `scratch` (nothing records
    the tile) the products are written into its ``"x"`` tensor.
    """
    qt = qs[..., i0:i1, :]
    n = _visible_keys(p, i1)
    if n < kt.shape[-1]:
        kt = kt[..., :n]
    if p.group > 1:
        qt, kt = qt.unflatten(1, (kt.shape[1], p.group)), kt.unsqueeze(2)
    shape = (*qt.shape[:-1], n)
    x = torch.matmul(qt, kt, **({} if scratch is None else {"out": scratch("x", shape)}))
    if p.group > 1:
        x = x.flatten(1, 2)
    if post is not None:  # (the scale after the products: see _scaled_operands)
        x = torch.mul(x, post, **into(scratch is not None, x))
    # the product is this call's own tensor: the masks go over it unless a graph records it
    own = _reuse(p, x)
    if p.add is not None:
        add = p.add[..., i0:i1, :].to(x.dtype)
        if unit:
            add = mul_pow2(add, -unit)
        x = fill_where(torch.add(x, add, **into(own, x)), ~p.keep[..., i0:i1, :], -torch.inf, own)
    elif p.keep is not None:
        x = fill_where(x, ~p.keep[..., i0:i1, :], -torch.inf, own)
    elif (tail := _causal_tail(p, i0, i1, n, x.device)) is not None:
        x = fill_where(x, tail, -torch.inf, own)
    return x


def _causal_tail(p: Prepared, i0: int, i1: int, n: int, device: torch.device) -> TailMask | None:
    """The causal mask of queries ``i0:i1`` against keys ``:n``: all in the columns after ``i0``.

    None without ``is_causal``, or where no entry of the tile lies above the diagonal.
    """
    if not p.is_causal or i0 + 1 >= n:
        return None
    rows = torch.arange(i0, i1, device=device).unsqueeze(-1)
    return TailMask(i0 + 1, torch.arange(i0 + 1, n, device=device) > rows)


class _Scratch:
    """Tile-sized tensors that every block of one call writes over, one per role.

    Each block's tile used to be a fresh tensor, and so were its shifted logits and
    weights: on the CPU, tensors of a few MiB come from the system and go back to it, and
    faulting their pages in again for every block cost about as much as the operations
    themselves. Only for tiles that nothing records (:func:`may_reuse`).
    """

    def __init__(self, elements: int, dtype: torch.dtype, device: torch.device) -> None:
        self.elements, self.dtype, self.device = elements, dtype, device
        self.tensors: dict[str, torch.Tensor] = {}

    def __call__(self, role: str, shape: tuple[int, ...]) -> torch.Tensor:
        """A tensor of `shape` over the role's storage (formed at the first call)."""
        flat = self.tensors.get(role)
        if flat is None:
            flat = torch.empty(self.elements, dtype=self.dtype, device=self.device)
            self.tensors[role] = flat
        return flat[: math.prod(shape)].view(shape)


def _scratch(p: Prepared, t: _Tiles) -> _Scratch | None:
    """A :class:`_Scratch` for the tiles of `t`, where nothing records them; else None."""
    qs, kt, _ = t.scaled
    if t.plain is not None or not (_reuse(p, qs) and _reuse(p, kt)):
        return None  # (two parts of a tile live at once, or a graph or transform records)
    B, H = p.q.shape[:2]
    return _Scratch(B * H * t.block * p.k.shape[-2], t.wd, qs.device)


def _reuse(p: Prepared, x: torch.Tensor) -> bool:
    """:func:`may_reuse` for a tile of `p`: never under a transform of any operand.

    A tile formed from plain queries and keys is itself plain, but a mask (or value)
    that ``vmap`` batches would then be written into it in place, which vmap refuses
    ("inplace arithmetic ... is not possible"; SDPA takes such a mask).
    """
    return not p.transformed and may_reuse(x)


def _visible_keys(p: Prepared, i1: int) -> int:
    """How many leading keys the queries before `i1` see: every key, or ``min(S, i1)`` if causal."""
    S = p.k.shape[-2]
    return min(S, i1) if p.is_causal else S


def _masks_known(p: Prepared, t: _Tiles) -> bool:
    """Whether the ``-inf`` entries of every logit tile are known without reading the tile.

    With finite operands and no power-of-two unit (then the logits fit the working
    dtype, :func:`_work`) the logits are finite, so they are those of the mask: none
    without one, and under ``is_causal`` the entries above the diagonal
    (:func:`_causal_tail`). The tiles' statistics then take no comparison with
    ``-inf``, and fill only the causal mask's columns.
    """
    return p.keep is None and p.add is None and p.bad is None and t.unit == 0


def _operands(
    p: Prepared, wd: torch.dtype, a: int, b: int, c: int
) -> tuple[torch.Tensor, torch.Tensor, float | None]:
    r"""``(q', k'^T, post)`` in `wd` for the exponents `a`, `b`, `c` of :func:`_work`.

    The scale goes on the queries (``q' = q * scale``) unless that product would
    overflow the working dtype while the logits do not (queries near the float maximum,
    keys near 0, a scale above 1): then the tile's products are formed first and
    multiplied by ``post`` = the scale (``q' = q``). Where the logits fit, one of the two
    orders always fits: if neither did, :math:`\log_2` of the logit bound would exceed
    the sum of the two failing ones less :math:`\log_2 \max|q|`, above the range.
    """
    qs = mul_pow2(p.q.to(wd), -a) if a else p.q.to(wd)
    ks = mul_pow2(p.k.to(wd), -b) if b else p.k.to(wd)
    scale = p.scale * 2.0**-c
    room = math.log2(torch.finfo(wd).max) - 2.0
    post = None
    if (p.log2_qmax - a) + _log2(abs(scale)) <= room:
        qs = qs * scale
    else:
        post = scale
    return qs, ks.transpose(-1, -2), post


@dataclass
class _Tiles:
    """The operands of the tile loop (see :func:`_scaled_operands`)."""

    wd: torch.dtype
    block: int
    unit: int
    scaled: tuple[torch.Tensor, torch.Tensor, float | None]
    plain: tuple[torch.Tensor, torch.Tensor, float | None] | None


def _scaled_operands(p: Prepared, safe: bool) -> _Tiles:
    r"""The tile loop's working dtype, block of queries and operands (see :func:`_work`).

    Where the operands are scaled by powers of two (``unit`` :math:`\ne 0`: the bound
    :math:`|\mathrm{scale}|\max|q|\max|k|D` is beyond float64), the unscaled operands
    come too: the bound can be far above the logits (``q = (0, 1e308, 1)`` against keys
    ``(1e308, 0, 0)`` and ``(0, 0, 1)``: logits 0 and 1), and the scaled products of small
    entries underflow (the logit 1 became 0, an output of 1/3 for 0.523).
    :func:`_tile_parts` keeps the unscaled logits of every row where none overflows.
    """
    wd, a, b, c = _work(p, safe)
    L, S = p.q.shape[-2], p.k.shape[-2]
    B, H = p.q.shape[:2]
    block = max(1, min(L, CHUNK_ELEMENTS // max(1, B * H * S)))
    unit = a + b + c
    plain = _operands(p, wd, 0, 0, 0) if unit else None
    return _Tiles(wd, block, unit, _operands(p, wd, a, b, c), plain)


def _tile_parts(
    p: Prepared, t: _Tiles, i0: int, i1: int, scratch: _Scratch | None = None
) -> list[tuple[torch.Tensor | None, torch.Tensor, int]]:
    """The logits of queries ``i0:i1`` as ``[(rows, x, unit)]``: one part, or two by rows.

    With scaled operands, a row whose unscaled logits fit takes them (unit 0), exact
    where the scaled ones lose small products. They fit unless one overflows upward
    (``+inf`` or NaN where the scaled logit is finite: then the small logits weigh
    nothing beside it) or every unmasked one overflows downward. A logit that overflows
    to ``-inf`` beside finite ones has weight 0 either way, and the small ones keep
    theirs: a row with logits about -1e616, 0 and 0.58 took the scaled ones and lost the
    0.58. Such a row takes the scaled logits. Two parts: ``rows`` marks the first's rows
    (shape (..., l, 1)); the second's hold zeros elsewhere, so that no infinity reaches a
    gradient.
    """
    qs, kt, post = t.scaled
    x = _tile_logits(p, i0, i1, qs, kt, t.unit, post, scratch if t.plain is None else None)
    if t.plain is None:
        return [(None, x, t.unit)]
    qs0, kt0, post0 = t.plain
    x0 = _tile_logits(p, i0, i1, qs0, kt0, 0, post0)
    with torch.no_grad():
        finite = torch.isfinite(x)  # (masked entries are -inf in both)
        up = ((x0 == torch.inf) | torch.isnan(x0)) & finite
        both = torch.isfinite(x0) & finite
        over = (up | (finite & ~both.any(-1, keepdim=True))).any(-1, keepdim=True)
        every = unwrapped(over)  # (of every slice under vmap)
        n_over = int(every.sum())
    if n_over == 0:
        return [(None, x0, 0)]
    if n_over == every.numel():
        return [(None, x, t.unit)]
    return [(over, x, t.unit), (None, torch.where(over, torch.zeros_like(x0), x0), 0)]


def _by_rows(parts: list, fn: Callable[[torch.Tensor, int], Any]) -> Any:
    """``fn(x, unit)`` of each part, merged by rows (a tensor or a tuple of tensors)."""
    (rows, x, unit), *rest = parts
    out = fn(x, unit)
    if not rest:
        return out
    other = fn(rest[0][1], rest[0][2])

    def pick(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        r = rows if a.dim() == rows.dim() else rows.squeeze(-1)
        return torch.where(r, a, b)

    if isinstance(out, tuple):
        return tuple(pick(a, b) for a, b in zip(out, other, strict=True))
    return pick(out, other)


def _chunked(
    p: Prepared, schedule: Schedule, entropy_eps: float, detach_beta: bool, safe: bool = False
) -> torch.Tensor:
    """Exact-semantics path over blocks of queries: ``(block, S)`` logit tiles.

    ``safe=True``: the overflow-safe variant (float64 tiles, power-of-two units).
    """
    t = _scaled_operands(p, safe)
    vs = p.v.to(t.wd)
    outs = []
    known = _masks_known(p, t)
    scratch = _scratch(p, t)

    def probs(x: torch.Tensor, unit: int, i0: int, i1: int) -> torch.Tensor:
        masks = _causal_tail(p, i0, i1, x.shape[-1], x.device) if known else READ
        return adaptive_softmax_lastdim(
            x, schedule, entropy_eps, detach_beta, unit, masks, scratch
        )[0]

    for i0 in range(0, p.q.shape[-2], t.block):
        i1 = min(p.q.shape[-2], i0 + t.block)
        weights = _by_rows(_tile_parts(p, t, i0, i1, scratch), partial(probs, i0=i0, i1=i1))
        outs.append(torch.matmul(weights, vs[..., : weights.shape[-1], :]))
    return torch.cat(outs, dim=-2)


def entropy_lse(p: Prepared, safe: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Pass 1 in torch: each query's entropy and log-sum-exp, differentiable.

    Blocks of queries against every key they see (:func:`_tile_logits`; memory
    :math:`O(\mathrm{block}\cdot S)` forward; autograd keeps the tiles for the backward).
    Tiles whose masks are known (:func:`_masks_known`) are not compared with ``-inf``;
    where nothing records them, every block writes over the same tensors
    (:class:`_Scratch`). Per row, with
    :math:`z_j = x_j - m` (overflow-safe, :func:`shifted_logits`),
    :math:`s = \sum e^{z_j}`, :math:`t = \sum e^{z_j} z_j`:
    :math:`H = \log s - t/s` clamped to :math:`[0, \log n]` and
    :math:`\mathrm{LSE} = m + \log s`. A query with no key gives ``H = 0``,
    ``LSE = -inf``; a NaN row gives NaN.

    Returns
    -------
    tuple of torch.Tensor
        ``(entropy, lse)``, shape (B, H, L), in the statistics dtype.
    """
    sd = stats_dtype(p.q.dtype)
    safe = safe or not _fits(p)
    t = _scaled_operands(p, safe)
    wd = t.wd

    known = _masks_known(p, t)
    scratch = _scratch(p, t)

    def stats(x: torch.Tensor, unit: int, i0: int, i1: int) -> tuple[torch.Tensor, torch.Tensor]:
        reuse = _reuse(p, x)  # (without a graph, a tile's intermediates are written over)
        masked = _causal_tail(p, i0, i1, x.shape[-1], x.device) if known else x == -torch.inf
        # x is this function's own tile: the shifted logits go over it, the weights into
        # the scratch tensor of every block's weights
        z, m = shifted_logits(x, masked, unit, reuse, own=True)
        weights = None if scratch is None else scratch("e", tuple(z.shape))
        _, s, h = exact_entropy(z, masked, reuse, out=weights)
        m = m.squeeze(-1)
        none = s == 0
        m_safe = torch.where(none, torch.zeros_like(m), m)
        s_safe = torch.where(none, torch.ones_like(s), s)
        lse = mul_pow2(m_safe, unit) + torch.log(s_safe)
        return h, torch.where(none, torch.full_like(lse, -torch.inf), lse)

    hs, lses = [], []
    for i0 in range(0, p.q.shape[-2], t.block):
        i1 = min(p.q.shape[-2], i0 + t.block)
        h, lse = _by_rows(_tile_parts(p, t, i0, i1, scratch), partial(stats, i0=i0, i1=i1))
        hs.append(h)
        lses.append(lse)
    upper = torch.log(torch.clamp(compact(p.n_eff), min=1).to(wd))
    h = torch.minimum(torch.cat(hs, dim=-1), upper).to(sd)
    return h, torch.cat(lses, dim=-1).to(sd)


def entropy_lse_backward(
    p: Prepared,
    entropy: torch.Tensor,
    lse: torch.Tensor,
    grad_entropy: torch.Tensor,
    grad_lse: torch.Tensor,
    differentiable: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The backward of pass 1 in torch: ``(dq, dk)`` from the row gradients of ``(H, LSE)``.

    The same formula as the Triton kernel
    (:func:`~._triton_attention.triton_entropy_backward`): blocks of queries
    against every key they see recompute the logits and
    :math:`p_{ij} = e^{x_{ij} - m_i} / \sum_j e^{x_{ij} - m_i}` from each row's maximum
    :math:`m_i` (the Triton kernel from the stored LSE, whose rounding far from 0 is as
    large as the gaps between logits; hence :data:`TRITON_GRAD_LOG2_BOUND`),
    then :math:`\bar x_{ij} = p_{ij}(\bar L_i - \bar H_i (\log p_{ij} + H_i))`,
    :math:`\bar q_i = \mathrm{scale}\sum_j \bar x_{ij} k_j` and
    :math:`\bar k_j = \mathrm{scale}\sum_i \bar x_{ij} q_i` (summed over the
    query heads of a group). Memory :math:`O(\mathrm{block}\cdot S)`; nothing is
    kept from the forward but ``(H, LSE)``. Results in the statistics dtype,
    shapes of ``p.q`` and ``p.k``.

    A row no loss reaches (both row gradients zero) adds nothing, so a NaN row
    that no loss reads gives no NaN. ``differentiable=True`` (the backward
    recorded for a second derivative) keeps such rows, skipping only rows
    whose statistics are not finite: the result's derivative in the row
    gradients is needed at zero too (the double-backward route to a
    Jacobian-vector product starts there).
    """
    t = _scaled_operands(p, False)  # (where the operands fit: no unit, one part)
    wd, block, (qs, kt, post) = t.wd, t.block, t.scaled
    k = p.k.to(wd)
    big = torch.finfo(wd).max
    rows = (entropy, lse, grad_entropy, grad_lse)
    ent, lse, d_ent, d_lse = (t.to(wd).unsqueeze(-1) for t in rows)
    lse = torch.where(lse == -torch.inf, torch.zeros_like(lse), lse)
    known = _masks_known(p, t)
    scratch = _scratch(p, t)
    dqs = []
    dk = torch.zeros(k.shape, dtype=wd, device=k.device)
    g = p.group
    for i0 in range(0, p.q.shape[-2], block):
        i1 = min(p.q.shape[-2], i0 + block)
        x = _tile_logits(p, i0, i1, qs, kt, 0, post, scratch)
        n = x.shape[-1]  # (the keys these queries see: the first n)
        rows_h, rows_dh, rows_dl = ent[..., i0:i1, :], d_ent[..., i0:i1, :], d_lse[..., i0:i1, :]
        if known:
            # every row finite, and no -inf but the causal mask's: the general branch's steps
            # give these bits, with its selects reduced to the fills of that mask (each step
            # written over its spent operand where nothing records them)
            reuse = _reuse(p, x)
            tail = _causal_tail(p, i0, i1, n, x.device)
            m = x.amax(-1, keepdim=True).detach()
            z = torch.sub(x, m, **into(reuse, x))
            # (masked: z = 0, so that log p is finite, then e = 0)
            z = fill_where(z, tail, 0.0, reuse)
            e = torch.exp(z, **into(reuse, None if scratch is None else scratch("e", x.shape)))
            e = fill_where(e, tail, 0.0, reuse)
            s = e.sum(-1, keepdim=True)
            log_p = torch.sub(z, torch.log(s), **into(reuse, z))
            w = torch.add(log_p, rows_h, **into(reuse, log_p))
            w = torch.mul(rows_dh, w, **into(reuse, w))
            w = torch.sub(rows_dl, w, **into(reuse, w))
            dx = torch.mul(torch.div(e, s, **into(reuse, e)), w, **into(reuse, w))
        else:
            if differentiable:
                live = torch.isfinite(rows_h) & torch.isfinite(lse[..., i0:i1, :])
            else:
                live = (rows_dh != 0) | (rows_dl != 0)
            valid = (x != -torch.inf) & live  # rows no loss reaches add nothing (not 0 * NaN)
            # p from the tile's own row maximum, not from the stored LSE: the LSE's rounding
            # is of the order of an ulp of the logits, which far from 0 is a gap between them
            # (three tied logits of 2**20 in float32 gave a gradient 26 % off). A row holds
            # every key here, so its maximum and sum are at hand; p does not depend on the
            # shift (detached)
            m = torch.where(valid, x, -torch.inf).amax(-1, keepdim=True).detach()
            m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
            z = torch.clamp(torch.where(valid, x - m, 0.0), min=-big)
            e = torch.where(valid, torch.exp(z), 0.0)
            s = e.sum(-1, keepdim=True)
            s = torch.where(s > 0, s, torch.ones_like(s))
            log_p = z - torch.log(s)
            dx = (e / s) * (rows_dl - rows_dh * (log_p + rows_h))
            dx = torch.where(valid, dx, 0.0)
        qt = qs[..., i0:i1, :]
        kn = k[..., :n, :]
        if g > 1:
            dxg = dx.unflatten(1, (k.shape[1], g))  # (B, H/g, g, l, n)
            dqs.append(torch.matmul(dxg, kn.unsqueeze(2)).flatten(1, 2))
            dkn = torch.matmul(dxg.transpose(-1, -2), qt.unflatten(1, (k.shape[1], g))).sum(2)
        else:
            dqs.append(torch.matmul(dx, kn))
            dkn = torch.matmul(dx.transpose(-1, -2), qt)
        # (padded, not added in place: under a torch.func transform dk is not batched)
        dk = dk + (dkn if n == k.shape[-2] else F.pad(dkn, (0, 0, 0, k.shape[-2] - n)))
    dq = torch.cat(dqs, dim=-2) * p.scale
    return dq, (dk if post is None else dk * post)  # (q' holds the scale, or post does)


def _pass1_forward(p: Prepared, use_triton: bool) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Pass 1 without a graph: ``(entropy, lse, triton_ran)`` in the statistics dtype."""
    if use_triton:
        from ._triton_config import NoConfig

        try:
            h, lse = triton_entropy_lse(p)
            return h, lse, True
        except NoConfig:
            pass
    with torch.no_grad():
        h, lse = entropy_lse(p)
    return h, lse, False


class _Pass1(torch.autograd.Function):
    """Pass 1 with its own backward (no tile is kept: p is recomputed from the log-sum-exp).

    The backward runs without a graph (the Triton kernel where the forward ran
    there) unless autograd records it (``create_graph=True``): then the torch
    backward's operations are recorded on the saved ``q``, ``k``, ``H`` and
    LSE, so the gradient can be differentiated again.
    """

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        q: torch.Tensor,
        k: torch.Tensor,
        p: Prepared,
        use_triton: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h, lse, ran = _pass1_forward(p, use_triton)
        ctx.prepared = p
        ctx.triton = ran
        ctx.save_for_backward(q, k, h, lse)
        return h, lse

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad_h: torch.Tensor, grad_lse: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        p: Prepared = ctx.prepared
        q, k, h, lse = ctx.saved_tensors
        dq = dk = None
        if torch.is_grad_enabled():
            # create_graph=True: the saved tensors carry their history, so the
            # recorded backward differentiates through q, k, H and LSE alike
            p = replace(p, q=q, k=k)
            dq, dk = entropy_lse_backward(p, h, lse, grad_h, grad_lse, differentiable=True)
        elif ctx.triton:
            from . import _triton_attention as tri
            from ._triton_config import NoConfig

            kind, mask = _triton_mask(p)
            try:
                dq, dk = tri.triton_entropy_backward(
                    p.q, p.k, mask, kind, p.is_causal, p.scale, p.group, h, lse, grad_h, grad_lse
                )
            except NoConfig:
                dq = dk = None
        if dq is None:
            dq, dk = entropy_lse_backward(p, h, lse, grad_h, grad_lse)
        want_q, want_k = ctx.needs_input_grad[:2]
        return (dq.to(p.q.dtype) if want_q else None, dk.to(p.k.dtype) if want_k else None,
                None, None)  # fmt: skip


def entropy_lse_grad(p: Prepared) -> tuple[torch.Tensor, torch.Tensor]:
    """Differentiable pass 1: ``(entropy, lse)`` with the pass-1 backward.

    The Triton kernels (forward and backward) where they run, else the torch
    ones; logits that could overflow take the overflow-safe torch path with
    autograd through its tiles.
    """
    if p.q.shape[-1] == 0 or not _fits(p) or p.transformed:
        return entropy_lse(p)  # autograd (or a torch.func transform) through its tiles
    return _Pass1.apply(p.q, p.k, p, _pass1_triton_ok(p, grad=True))


# ---------------------------------------------------------------- hybrid path


#: torch's SDPA takes ``enable_gqa`` (torch 2.5 and later).
_SDPA_GQA = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 5)

#: Pass 2 without a gradient is split into pieces along batch and heads when the β-scaled
#: queries exceed this many bytes: the pieces of the scaled queries and of SDPA's output are
#: then the only memory beside the result (see :func:`_pieces`).
PASS2_SPLIT_BYTES = 32 << 20

#: Number of pieces pass 2 is split into (about: whole batch entries and head groups).
PASS2_PIECES = 8


def _pieces(B: int, H: int, group: int, pieces: int) -> list[tuple[slice, slice]]:
    """(batch, query-head) slices covering (B, H) in about `pieces` blocks.

    The batch is split first; heads only when the batch has fewer entries than
    `pieces`, and then in whole groups (a block's query heads share its key heads).
    """
    nb = max(1, min(B, pieces))
    groups = H // group
    ng = max(1, min(groups, -(-pieces // nb)))
    out = []
    for i in range(nb):
        b = slice(i * B // nb, (i + 1) * B // nb)
        for j in range(ng):
            out.append((b, slice(j * groups // ng * group, (j + 1) * groups // ng * group)))
    return out


def _sdpa_pass2(
    p: Prepared, qb: torch.Tensor, mask: torch.Tensor | None, gqa: bool
) -> torch.Tensor:
    """SDPA on the β-scaled queries; shared key heads passed as such when `gqa`.

    A mask shared by heads goes in at its own size (:func:`_unbroadcast`): SDPA turns a
    boolean mask into an additive one of the shape it is given, (B, H, L, S) for the
    expanded view.
    """
    extra = {"enable_gqa": True} if gqa else {}
    qb, scale = _positive_scale(qb, p.scale)
    mask = None if mask is None else _unbroadcast(mask)
    return F.scaled_dot_product_attention(
        qb, p.k, p.v, attn_mask=mask, is_causal=p.is_causal, scale=scale, **extra
    )


def _rows_beta(
    p: Prepared,
    schedule: Schedule,
    entropy: torch.Tensor | None,
    detach_beta: bool,
    dtype: torch.dtype,
) -> torch.Tensor:
    """β of each row in `dtype`, detached if `detach_beta` (shape of the rows).

    The polynomial schedule's β in one Triton kernel where no gradient flows
    through it and Triton runs (:func:`~._triton_beta.triton_polynomial_beta`,
    equal bit for bit); otherwise the torch evaluation, differentiable.
    """
    grad = torch.is_grad_enabled() and entropy is not None and entropy.requires_grad
    if (
        isinstance(schedule, Polynomial)
        and entropy is not None
        and (detach_beta or not grad)
        and not p.transformed
        and _pass1_triton_takes(p.q)
    ):
        from ._triton_beta import triton_polynomial_beta

        beta = triton_polynomial_beta(schedule, entropy, dtype)
        return torch.broadcast_to(beta, broadcast_shapes(beta.shape, p.n_eff.shape))
    beta = beta_from_entropy(schedule, entropy, p.n_eff)
    # a β shared by batch entries or heads (constant, log-length under a shared mask) stays
    # shared: converted once, and an additive mask it scales keeps the mask's own shape
    beta = beta.to(dtype) if p.transformed else _unbroadcast(beta).to(dtype).expand(beta.shape)
    return beta.detach() if detach_beta else beta


def _hybrid(
    p: Prepared, schedule: Schedule, detach_beta: bool, entropy: torch.Tensor | None
) -> torch.Tensor | None:
    r"""Pass 2 through SDPA itself, on the β-scaled queries.

    :math:`\operatorname{softmax}(\beta_i x_i)` has the logits of the query
    :math:`\beta_i q_i`; an additive mask with finite non-zero entries is
    scaled by :math:`\beta_i` too (the spec scales the whole logit), a
    boolean, causal or 0/``-inf`` mask is passed as is. SDPA then runs on
    whatever fused kernel it picks (cuDNN, flash, memory-efficient; CPU:
    its own). `entropy` is pass 1 (None when the schedule does not read it).

    Grouped-query attention without a mask passes the shared key heads to
    SDPA's own ``enable_gqa`` (torch 2.5 and later; SDPA's fused kernels take
    it only without a mask); otherwise each key and value head is repeated
    for its group. Without a gradient and above :data:`PASS2_SPLIT_BYTES`,
    pass 2 runs in pieces into one output (:func:`_pass2_pieces`), so neither
    the β-scaled queries nor a β-scaled bias ever exist whole: the memory
    beside the result is a piece of each and a piece of SDPA's output. Returns
    None when β times the logits could overflow (the caller then takes the
    overflow-safe chunked path).
    """
    sd = stats_dtype(p.q.dtype)
    beta = _rows_beta(p, schedule, entropy, detach_beta, sd)
    if not _beta_fits(p, schedule, beta):
        return None
    mask = None if p.bias else p.keep
    same_d = p.k.shape[-1] == p.v.shape[-1] <= 256
    gqa = p.group > 1 and mask is None and not p.bias and _SDPA_GQA and same_d
    if p.group > 1 and not gqa:
        p = _ungrouped(p)
    B, H, L = p.q.shape[:3]
    grad = torch.is_grad_enabled() and (beta.requires_grad or _want_grad(p.q, p.k, p.v))
    if grad and not _fused_grad_ok(p, schedule, beta):
        return None  # SDPA's backward would lose the weights: the chunked path
    pieces = None if grad or p.transformed else _pass2_pieces(p, beta)
    if p.bias and (pieces is None or _bias_bytes(p, beta) <= PASS2_BIAS_BYTES):
        mask = _beta_bias(p.add, beta, p.q.dtype).expand(p.add.shape)  # formed once
    if pieces is None:  # (a transform cannot write into the pieces' output)
        return _sdpa_pass2(p, scale_rows(p.q, beta), mask, gqa)
    out = p.q.new_empty((B, H, L, p.v.shape[-1]))
    for b, h, r in pieces:
        kv = slice(h.start // p.group, h.stop // p.group)
        part = replace(p, q=p.q[b, h, r], k=p.k[b, kv], v=p.v[b, kv])
        if p.bias and mask is None:  # a piece of a per-row β's scaled bias at a time
            m = _beta_bias(p.add[b, h, r], beta[b, h, r], p.q.dtype)
        else:
            m = None if mask is None else mask[b, h, r]
        out[b, h, r] = _sdpa_pass2(part, scale_rows(part.q, beta[b, h, r]), m, gqa)
    return out


#: Bytes of the β-scaled additive mask (in the statistics dtype) one piece of pass 2 forms.
PASS2_BIAS_BYTES = 128 << 20


def _beta_bias(add: torch.Tensor, beta: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    r"""The additive mask scaled by each row's β, :math:`\beta_i b_{ij}`, in `dtype`.

    Formed at the smallest shape that expands to `add` (:func:`_unbroadcast` of
    both): a mask shared by batch entries and heads, scaled by a β that is shared
    too (a constant or log-length schedule), stays one (L, S) slice. Non-finite
    entries pass unscaled, and through safe ``where``\ s: a -inf never meets β,
    whose derivative would be :math:`0 \cdot (-\infty)` there.
    """
    bcol = _unbroadcast(beta).unsqueeze(-1)
    add = _unbroadcast(add).to(bcol.dtype)
    finite = torch.isfinite(add)
    scaled = torch.where(finite, add, torch.zeros_like(add)) * bcol
    return torch.where(finite, scaled, add).to(dtype)


def _bias_bytes(p: Prepared, beta: torch.Tensor) -> int:
    """Bytes of :func:`_beta_bias` in β's dtype, at the shape it is formed."""
    shape = broadcast_shapes(_unbroadcast(p.add).shape, (*_unbroadcast(beta).shape, 1))
    return math.prod(shape) * beta.element_size()


def _pass2_pieces(p: Prepared, beta: torch.Tensor) -> list[tuple[slice, slice, slice]] | None:
    """(batch, query-head, query-row) slices pass 2 runs in; None for one call.

    The work a piece holds beside the result is its share of the β-scaled
    queries and, with a bias, of the β-scaled mask (:func:`_beta_bias`, per
    row of a per-row β). Up to :data:`PASS2_SPLIT_BYTES` of that runs in one
    call; beyond, about :data:`PASS2_PIECES` pieces along batch and heads, more
    where the scaled mask would exceed :data:`PASS2_BIAS_BYTES` a piece, and then
    blocks of query rows too (a bias never comes with ``is_causal``, so each
    row's keys do not depend on where the block starts).
    """
    B, H, L, D = p.q.shape
    work = p.q.element_size() * B * H * L * D
    bias_bytes = _bias_bytes(p, beta) if p.bias else 0
    if max(work, bias_bytes) <= PASS2_SPLIT_BYTES:
        return None
    wanted = max(PASS2_PIECES, -(-bias_bytes // PASS2_BIAS_BYTES))
    heads = _pieces(B, H, p.group, wanted)
    blocks = min(L, -(-wanted // len(heads))) if p.bias else 1
    rows = [slice(i * L // blocks, (i + 1) * L // blocks) for i in range(blocks)]
    return [(b, h, r) for b, h in heads for r in rows]


# ---------------------------------------------------------------- Triton path


def _bias_wider(p: Prepared) -> bool:
    """Whether a bias is given in a wider dtype than the queries (SDPA would round it)."""
    return p.bias and torch.finfo(p.add.dtype).bits > torch.finfo(p.q.dtype).bits


def _triton_mask(p: Prepared) -> tuple[int, torch.Tensor | None]:
    from . import _triton_attention as tri

    if p.add is not None:
        return tri.MASK_ADD, p.add  # read in its own dtype, converted in the kernel
    if p.keep is not None:
        return tri.MASK_BOOL, p.keep
    return tri.MASK_NONE, None


def pass1_early(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor | None,
    schedule: Schedule | None,
    entropy_eps: float = 0.0,
    detach_beta: bool = False,
    backend: str = "auto",
) -> Callable[[Prepared], tuple[torch.Tensor, torch.Tensor] | None] | None:
    r"""What :func:`prepare` may queue before it reads the scan back: the Triton pass 1.

    On a GPU the scan's one read is a host sync; the kernels queued before it run
    while the host waits, and pass 1 queued there starts as soon as the scan ends,
    instead of after the host has finished the checks. Returned only where the
    forward will use pass 1's statistics without a gradient (the hybrid with a
    schedule that reads the entropy and β detached or no gradient wanted, or
    :func:`attention_entropy` without a gradient; `schedule` None) and the
    Triton kernel runs on the device. The result is the one
    :func:`triton_entropy_lse` gives later, so it is used only where that call
    would be made with the same operands (:func:`prepare` drops it otherwise).
    A case the checks then send elsewhere (overflow, a wide bias) wastes one
    pass 1 on the device.
    """
    operands = [q, k] if v is None else [q, k, v]
    if not all(isinstance(t, torch.Tensor) for t in operands) or not _pass1_triton_takes(q):
        return None
    if transformed(*operands):
        return None  # prepare converts (or refuses) other inputs; pass 1 runs late then
    if _want_grad(*operands) and (schedule is None or not detach_beta):
        return None  # pass 1 runs with its own backward (entropy_lse_grad)
    if schedule is not None and (
        backend not in ("auto", "hybrid") or entropy_eps != 0.0 or not schedule.needs_entropy
    ):
        return None

    def launch(p: Prepared) -> tuple[torch.Tensor, torch.Tensor] | None:
        from ._triton_config import NoConfig

        if p.q.shape[-1] == 0 or (backend == "auto" and _bias_wider(p)):
            return None
        try:
            return triton_entropy_lse(p)
        except NoConfig:
            return None

    return launch


def _early_log2_bound() -> float:
    """The largest logit bound whose pass 1 :func:`pass1_early` may queue unseen.

    It launches before the operands' bound is known (``Prepared.log2_bound``
    is ``-inf`` there), so the kernel takes the variant of small logits
    (:func:`~._triton_attention.raw_products`); :func:`prepare` drops the
    result when the bound is larger (recomputing it where that variant was not
    in play gives the same values).
    """
    from . import _triton_attention as tri

    return tri.RAW_LOG2_BOUND


def triton_entropy_lse(p: Prepared) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass 1 with the Triton kernel: ``(entropy, lse)`` float32 (B, H, L), no gradient.

    float64 inputs (only under ``TRITON_INTERPRET=1``, for the float64 gradient
    checks of the kernels) give float64 statistics.
    """
    from . import _triton_attention as tri

    kind, mask = _triton_mask(p)
    with torch.no_grad():
        h, lse = tri.triton_entropy(
            p.q, p.k, mask, kind, p.is_causal, p.scale, p.group, log2_bound=p.log2_bound
        )
        upper = torch.log(torch.clamp(compact(p.n_eff), min=1).to(h.dtype))
    return torch.minimum(h, upper), lse


def _triton(p: Prepared, schedule: Schedule) -> torch.Tensor | None:
    """The all-Triton forward; None when no launch configuration fits or β overflows."""
    from . import _triton_attention as tri
    from ._triton_config import NoConfig

    kind, mask = _triton_mask(p)
    try:
        entropy = triton_entropy_lse(p)[0] if schedule.needs_entropy else None
        beta = _rows_beta(p, schedule, entropy, True, torch.float32)
        if not _beta_fits(p, schedule, beta):
            return None
        beta = beta.expand(*p.q.shape[:2], p.q.shape[-2])
        return tri.triton_attention(p.q, p.k, p.v, beta, mask, kind, p.is_causal, p.scale)
    except NoConfig:
        return None


def triton_available(device: torch.device) -> bool:
    """Whether the Triton kernels can run on `device` here (CUDA, or CPU when interpreting)."""
    if not (device.type == "cuda" or (device.type == "cpu" and _triton_interpreting())):
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


#: Largest log2 of the logits' bound for which pass 1 with a gradient takes the Triton
#: kernels (see :func:`_pass1_triton_ok`).
TRITON_GRAD_LOG2_BOUND = 14.0

#: Route float64 through the Triton pass 1 on CUDA too (the CUDA tests' float64 gradchecks of
#: the kernels; off in normal use, where float64 takes the torch pass 1).
_TRITON_FLOAT64 = False


def _pass1_triton_ok(p: Prepared, grad: bool = False) -> bool:
    r"""Whether the Triton pass 1 (and, with `grad`, its backward) takes these inputs.

    float16, bfloat16 and float32 on CUDA; float64 too on CPU under
    ``TRITON_INTERPRET=1`` (the kernels' float64 gradient checks) or with
    :data:`_TRITON_FLOAT64` set. With `grad`, only logits within
    :math:`2^{14}` (:data:`TRITON_GRAD_LOG2_BOUND`). The backward kernels
    recompute each exponent :math:`x_{ij}\log_2 e - \mathrm{LSE}_i\log_2 e` from
    the products and the stored float32 log-sum-exp: the LSE's rounding, its
    conversion to base 2 and the scaled logit's own (which the compiler may fuse
    into the subtraction) each move it by up to about half an ulp of
    :math:`|x|\log_2 e`, a relative error of that size in every weight: about
    :math:`2^{-9}` at :math:`2^{14}`, the limit of the fused backwards of pass 2
    (:data:`FUSED_GRAD_LOG2_BOUND`). At a bound of :math:`2^{19.3}` three tied keys'
    gradients were 0.5 % off, at :math:`2^{26.7}` two thirds of a gradient was lost,
    and past :math:`2^{30}` a recomputed :math:`p_{ij}` can overflow. The torch pass
    1 takes larger logits: its backward normalises each row by its own maximum and
    sum, as its forward did.
    """
    ok = not p.transformed and _pass1_triton_takes(p.q) and _fits(p)
    return ok and (not grad or p.log2_bound <= TRITON_GRAD_LOG2_BOUND)


def _pass1_triton_takes(q: torch.Tensor) -> bool:
    """Whether the Triton pass 1 runs on the device and in the dtype of `q` (not transformed)."""
    if transformed(q):
        return False
    f64 = _TRITON_FLOAT64 or (q.device.type == "cpu" and _triton_interpreting())
    return (q.dtype != torch.float64 or f64) and triton_available(q.device)


def _hybrid_entropy(p: Prepared, schedule: Schedule, beta_grad: bool) -> torch.Tensor | None:
    """Pass 1 for the hybrid path (Triton where it runs, else torch).

    With a gradient through β, pass 1 carries its own backward
    (:func:`entropy_lse_grad`); without one it records no graph, so
    ``detach_beta=True`` costs SDPA's backward plus the :math:`O(L)` scaling.
    """
    if not schedule.needs_entropy:
        return None
    if beta_grad:
        return entropy_lse_grad(p)[0]
    if p.pass1 is not None:
        return p.pass1[0]
    if _pass1_triton_ok(p):
        from ._triton_config import NoConfig

        try:
            return triton_entropy_lse(p)[0]
        except NoConfig:
            pass
    with torch.no_grad():
        return entropy_lse(p)[0]


# ---------------------------------------------------------------- non-finite values


def _ungrouped(p: Prepared) -> Prepared:
    """`p` with each key and value head repeated for the query heads of its group.

    Pass 2 and the single-pass paths see one key head per query head; the
    gradient of a repeated head sums over its group (``repeat_interleave``'s
    backward). Pass 1 of the hybrid path reads the grouped heads directly.
    """
    if p.group == 1:
        return p
    return replace(
        p,
        k=p.k.repeat_interleave(p.group, dim=1),
        v=p.v.repeat_interleave(p.group, dim=1),
        group=1,
    )


def _finite_values(p: Prepared) -> tuple[Prepared, torch.Tensor | None]:
    """`p` with non-finite values replaced by 0, and the (B, H', S, Dv) non-finite mask.

    The mask is None (and `p` unchanged) when every value is finite, which
    :func:`prepare`'s scan already knows: nothing is read then.
    """
    if p.values_finite:
        return p, None
    with torch.no_grad():
        bad = ~torch.isfinite(p.v)
    zero = torch.zeros((), dtype=p.v.dtype, device=p.v.device)
    return replace(p, v=torch.where(bad, zero, p.v), values_finite=True), bad


def _values_in_range(p: Prepared) -> tuple[Prepared, torch.Tensor | None]:
    r"""`p` with its (finite) values scaled by powers of two so that no sum overflows.

    The fused kernels (SDPA's, the Triton one) sum :math:`\sum_j e^{x_j - m} v_j`
    before dividing by the weights' sum: up to :math:`S \max|v|`, which overflowed
    for values near the float maximum divided by :math:`S` (``inf``, or NaN once a
    later key block rescaled it by :math:`e^{m_{\mathrm{old}} - m_{\mathrm{new}}} = 0`),
    where the answer is finite. Each value column (of each batch entry and head)
    is scaled by its own :math:`2^{-k_c}`, from its own largest magnitude:
    a power of two scales exactly, and a column of small values next to a huge one
    keeps its bits (one scale for all columns pushed it into the subnormals, 78 ulps
    off where the column's error bound is a few). Returns the powers :math:`2^{k_c}`
    (shape (B, H', 1, Dv)) that the output is multiplied back by
    (:func:`_scaled_back`), or None, and nothing is done, in the common case.
    """
    if p.v is None or p.v.numel() == 0:
        return p, None
    lv = p.log2_vmax if not math.isnan(p.log2_vmax) else _log2(_abs_max(p.v))
    room = math.log2(torch.finfo(stats_dtype(p.v.dtype)).max) - 3.0
    S = max(p.k.shape[-2], 1)
    if not lv + math.log2(S) - room > 0.0:
        return p, None
    with torch.no_grad():
        col = p.v.abs().amax(dim=-2, keepdim=True)  # (B, H', 1, Dv); |v| < 2**e
        e = torch.frexp(col).exponent.to(torch.int32)
        k = (e + (math.ceil(math.log2(S)) - math.floor(room))).clamp(min=0)
        one = torch.ones(k.shape, dtype=p.v.dtype, device=p.v.device)
        down, up = torch.ldexp(one, -k), torch.ldexp(one, k)
    return replace(p, v=p.v * down), up


def _scaled_back(
    out: torch.Tensor, up: torch.Tensor, group: int, dtype: torch.dtype
) -> torch.Tensor:
    r"""`out` times the powers of two :func:`_values_in_range` took off the values, in `dtype`.

    Exact, but for one rounding: each output is a weighted mean of finite values, so
    its magnitude is at most the float maximum, yet rounded a few ulps above it
    the product or the cast to `dtype` gave ``inf`` (values all at the maximum).
    Such an element is the float maximum, with its sign.
    """
    if out.numel() == 0:
        return out.to(dtype)
    if group > 1:
        up = up.repeat_interleave(group, dim=1)  # (B, H, 1, Dv): key heads -> query heads
    res = (out * up.to(out.dtype)).to(dtype)
    over = torch.isinf(res) & torch.isfinite(out)
    cap = torch.full_like(res, torch.finfo(dtype).max)
    return torch.where(over, torch.where(out > 0, cap, -cap), res)


def _nonfinite_columns(p: Prepared, v: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    r"""Override the output columns that meet a non-finite value of an unmasked key.

    Every unmasked key has an exactly positive weight :math:`p_{ij} > 0` (even
    where it underflows in floating point), so the output
    :math:`\sum_j p_{ij} v_{jc}` is, in IEEE terms: NaN if an unmasked
    :math:`v_{jc}` is NaN or both :math:`+\infty` and :math:`-\infty` occur,
    else :math:`\pm\infty` if one of them occurs (the reference's rule); other
    columns keep the kernel's value (computed with those values set to 0).
    `v` is the original (B, H', S, Dv) values, `out` is (B, H, L, Dv).
    """
    with torch.no_grad():
        kinds = torch.stack([v == torch.inf, v == -torch.inf, torch.isnan(v)])
        ind = kinds.to(torch.float32)  # (3, B, H', S, Dv)
        if p.group > 1:
            ind = ind.repeat_interleave(p.group, dim=2)
        L, S = p.q.shape[-2], p.k.shape[-2]
        if p.keep is not None:
            w = _unbroadcast(p.keep).to(torch.float32)  # the mask's own footprint
        elif p.is_causal:
            w = torch.ones((L, S), dtype=torch.float32, device=v.device).tril()
        else:
            w = torch.ones((1, S), dtype=torch.float32, device=v.device)
        hits = torch.matmul(w, ind) > 0  # (3, B, H, L or 1, Dv)
        pos, neg, nan = hits[0], hits[1], hits[2]
        nan = nan | (pos & neg)
    inf = torch.full_like(out, torch.inf)
    out = torch.where(pos, inf, out)
    out = torch.where(neg, -inf, out)
    return torch.where(nan, torch.full_like(out, torch.nan), out)


# ---------------------------------------------------------------- dispatch


def _empty_result(out: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
    """`out` (constant: zero-size inputs, no keys) joined to the inputs' autograd graph.

    As SDPA's result, it requires grad when an input does; the gradients are 0.
    """
    if not _want_grad(*inputs):
        return out
    tie = sum(t.sum() for t in inputs if t.requires_grad) * 0
    return out + tie.to(out.dtype)


def attention(
    p: Prepared,
    schedule: Schedule,
    entropy_eps: float,
    detach_beta: bool,
    backend: str,
) -> torch.Tensor:
    """Adaptive attention of prepared inputs; returns (B, H, L, Dv) in the input dtype."""
    q = p.q
    L = q.shape[-2]
    if p.empty or p.v.shape[-1] == 0:
        return _empty_result(q.new_zeros((*q.shape[:2], L, p.v.shape[-1])), p.q, p.k, p.v)
    grad = _want_grad(q, p.k, p.v)
    beta_grad = grad and not detach_beta and schedule.needs_entropy
    out = None
    if backend in ("triton", "hybrid") and entropy_eps != 0.0:
        raise ValueError(f"backend={backend!r} supports entropy_eps=0.0 only")
    if backend == "triton":
        if q.dtype == torch.float64:
            raise TypeError("backend='triton' supports float16, bfloat16 and float32")
        if grad:
            raise ValueError(
                "backend='triton' is forward-only; use backend='composition' for gradients "
                "(or call under torch.no_grad())"
            )
        if not triton_available(q.device):
            raise ValueError(
                "backend='triton' needs a CUDA tensor (or TRITON_INTERPRET=1 for CPU tensors)"
            )
        if p.transformed:
            raise ValueError(
                "backend='triton' cannot run under a torch.func transform (vmap, grad, jvp, "
                "...) or forward-mode AD; use backend='auto', which takes torch's own operations "
                "there"
            )
    # the key heads stay shared (grouped-query attention) for pass 1 and SDPA's own
    # enable_gqa; the other paths repeat them (_ungrouped)
    v_orig = p.v
    p, v_bad = _finite_values(p)
    p, v_up = _values_in_range(p)
    safe = q.shape[-1] == 0 or not _fits(p)
    if safe:
        pass  # the overflow-safe chunked path below (also for an empty feature axis)
    elif backend == "triton":
        out = _triton(_ungrouped(p), schedule)
    elif backend == "hybrid" or (
        backend == "auto" and entropy_eps == 0.0 and _pass1_triton_ok(p) and not _bias_wider(p)
    ):
        out = _hybrid(p, schedule, detach_beta, _hybrid_entropy(p, schedule, beta_grad))
    # under a torch.func transform "auto" takes the chunked path: its operations (matmul,
    # exp, sums) have every batching rule and derivative formula; the fused primitives
    # lack some (vmap falls back to a slow per-slice loop for the CPU one)
    fused = backend != "chunked" and not (p.transformed and backend == "auto")
    if out is None and not safe and fused and entropy_eps == 0.0 and not p.bias:
        out = _composition(_ungrouped(p), schedule, detach_beta)
    if out is None:
        out = _chunked(_ungrouped(p), schedule, entropy_eps, detach_beta, safe=safe)
    out = out.to(q.dtype) if v_up is None else _scaled_back(out, v_up, p.group, q.dtype)
    if v_bad is not None:
        out = _nonfinite_columns(p, v_orig, out)
    # the result is this call's own tensor: without a graph or a transform to record, it is
    # patched in place (no second tensor of the output's size)
    own = not (out.requires_grad or p.transformed)
    if p.keep is not None:
        # a query with no unmasked key gives zeros (causal rows always keep key 0)
        out = fill_where(out, (p.n_eff == 0).unsqueeze(-1), 0.0, own)
    if p.bad is not None:
        out = fill_where(out, p.bad.unsqueeze(-1), torch.nan, own)
    return out


def attention_entropy(p: Prepared) -> tuple[torch.Tensor, torch.Tensor]:
    """Each query's ``(entropy, lse)`` in the statistics dtype, shape (B, H, L).

    The Triton pass-1 kernel on CUDA (and on CPU under ``TRITON_INTERPRET=1``),
    else the torch pass 1; with a gradient, either carries its own backward
    (:func:`entropy_lse_grad`).
    """
    sd = stats_dtype(p.q.dtype)
    B, H, L = p.q.shape[:3]
    if p.empty:
        h = _empty_result(torch.zeros((B, H, L), dtype=sd, device=p.q.device), p.q, p.k)
        return h, _empty_result(torch.full_like(h, -torch.inf), p.q, p.k)
    out = None
    if _want_grad(p.q, p.k):
        out = entropy_lse_grad(p)
    elif p.pass1 is not None and _fits(p):
        out = p.pass1
    elif _pass1_triton_ok(p):
        from ._triton_config import NoConfig

        try:
            out = triton_entropy_lse(p)
        except NoConfig:
            out = None
    if out is None:
        out = entropy_lse(p)
    h, lse = out
    if p.bad is not None:
        nan = torch.full_like(h, torch.nan)
        h = torch.where(p.bad, nan, h)
        lse = torch.where(p.bad, nan, lse)
    return h, lse
