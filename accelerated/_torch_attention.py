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
from dataclasses import dataclass

import torch
from softmaxtheory.accelerated._torch_common import (
    HALF_DTYPES,
    as_float_tensor,
    beta_from_entropy,
    entropy_from_stats,
    stats_dtype,
)
from softmaxtheory.accelerated._torch_softmax import adaptive_softmax_lastdim

from softmaxtheory.spec import Schedule

__all__ = ["BACKENDS", "Prepared", "attention", "prepare"]

#: Accepted values of the ``backend`` argument.
BACKENDS = ("auto", "composition", "triton", "chunked")

#: Elements of one logit tile of the chunked path (float32: 8 MiB; about 8 live per tile).
CHUNK_ELEMENTS = 1 << 21


@dataclass
class Prepared:
    """Validated attention inputs, as 4-D (B, H, L, D) views."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    lead: tuple[int, ...]
    scale: float
    is_causal: bool
    keep: torch.Tensor | None  # bool (B, H, L, S) view, True = attend
    add: torch.Tensor | None  # additive mask (B, H, L, S) view, q dtype or float
    bias: bool  # the additive mask has finite non-zero entries
    n_eff: torch.Tensor  # (B, H, L) int64: unmasked keys per query
    bad: torch.Tensor | None  # (B, H, L) bool: rows whose answer is NaN


def _to4(t: torch.Tensor, lead: tuple[int, ...]) -> torch.Tensor:
    t = t.expand(*lead, *t.shape[-2:])
    if len(lead) <= 2:
        return t.reshape((1,) * (2 - len(lead)) + tuple(t.shape))
    return t.reshape(-1, lead[-1], *t.shape[-2:])


def prepare(
    q: object,
    k: object,
    v: object,
    attn_mask: object,
    is_causal: bool,
    scale: float | None,
) -> Prepared:
    """Validate the SDPA-style arguments and bring them to 4-D views."""
    q = as_float_tensor(q, "q")
    k = as_float_tensor(k, "k")
    v = as_float_tensor(v, "v")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.ndim < 2:
            raise ValueError(
                f"{name} must have shape (..., length, features), got {tuple(t.shape)}"
            )
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(
            f"q, k and v must be on one device, got {q.device}, {k.device}, {v.device}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must share the feature size, got {tuple(q.shape)} and {tuple(k.shape)}"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"k and v must share the key length, got {tuple(k.shape)} and {tuple(v.shape)}"
        )
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {is_causal!r}")
    L, D = q.shape[-2:]
    S = k.shape[-2]
    if scale is None:
        scale = 1.0 / math.sqrt(D) if D else 1.0
    elif isinstance(scale, bool) or not isinstance(scale, int | float):
        raise TypeError(f"scale must be a float, got {scale!r}")
    scale = float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale!r}")
    try:
        lead = tuple(torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2]))
    except RuntimeError as exc:
        raise ValueError(f"q, k, v leading dimensions do not broadcast: {exc}") from exc
    mask = None
    if attn_mask is not None:
        if is_causal:
            raise ValueError("pass either attn_mask or is_causal=True, not both")
        if not isinstance(attn_mask, torch.Tensor):
            raise TypeError(f"attn_mask must be a torch.Tensor, got {type(attn_mask).__name__}")
        if attn_mask.device != q.device:
            raise ValueError(f"attn_mask must be on {q.device}, got {attn_mask.device}")
        if attn_mask.dtype != torch.bool and not attn_mask.dtype.is_floating_point:
            raise TypeError(f"attn_mask must be boolean or floating, got dtype {attn_mask.dtype}")
        if attn_mask.requires_grad and torch.is_grad_enabled():
            raise ValueError("attn_mask requires grad: gradients to the mask are not supported")
        try:
            full = tuple(torch.broadcast_shapes(attn_mask.shape, (*lead, L, S)))
        except RuntimeError as exc:
            raise ValueError(
                f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to {(*lead, L, S)}"
            ) from exc
        lead = full[:-2]
        mask = attn_mask
    q4, k4, v4 = (_to4(t, lead) for t in (q, k, v))
    keep = add = None
    bias = False
    if mask is None:
        if is_causal:
            rows = torch.arange(L, device=q.device)
            n_eff = torch.clamp(rows + 1, max=S).expand(*q4.shape[:2], L)
        else:
            n_eff = torch.full((*q4.shape[:2], L), S, dtype=torch.int64, device=q.device)
    else:
        m4 = _to4(mask, lead)
        if mask.dtype == torch.bool:
            keep = m4
        else:
            add = m4
            finite = torch.isfinite(m4)
            bias = bool(torch.any(finite & (m4 != 0)))
            keep = m4 != -torch.inf
        n_eff = keep.sum(-1).expand(*q4.shape[:2], L)
    bad = _bad_rows(q4, k4, keep, add, is_causal)
    return Prepared(q4, k4, v4, lead, scale, is_causal, keep, add, bias, n_eff, bad)


def _bad_rows(
    q: torch.Tensor,
    k: torch.Tensor,
    keep: torch.Tensor | None,
    add: torch.Tensor | None,
    is_causal: bool,
) -> torch.Tensor | None:
    """Rows whose spec answer is NaN: a non-finite query, unmasked key or mask entry."""
    with torch.no_grad():
        q_bad = ~torch.isfinite(q).all(-1)
        k_bad = ~torch.isfinite(k).all(-1)
        mask_bad = add is not None and bool((torch.isnan(add) | (add == torch.inf)).any())
        if not bool(q_bad.any()) and not bool(k_bad.any()) and not mask_bad:
            return None
        L, S = q.shape[-2], k.shape[-2]
        if keep is not None:
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


def _triton_interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _want_grad(*tensors: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


# ---------------------------------------------------------------- fused primitives


def _additive(p: Prepared) -> torch.Tensor | None:
    """The mask as an additive (0 / -inf) tensor in the dtype of q (no bias)."""
    if p.keep is None:
        return None
    if p.add is not None:
        return p.add.to(p.q.dtype)
    zero = torch.zeros((), dtype=p.q.dtype, device=p.q.device)
    return torch.where(p.keep, zero, torch.full_like(zero, -torch.inf))


#: False once cuDNN's attention refused a call in this process (then flash is used).
_CUDNN_OK = True


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
    global _CUDNN_OK
    aten = torch.ops.aten
    if q.device.type == "cpu":
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, is_causal, attn_mask=add, scale=scale
        )
        return out, lse
    if q.device.type == "cuda" and q.dtype != torch.float64:
        L = q.shape[-2]
        d_ok = q.shape[-1] == v.shape[-1] and q.shape[-1] % 8 == 0 and q.shape[-1] <= 256
        # The flash kernel aligns a causal mask to the bottom-right corner when L != S
        # (SDPA's public entry point never sends it such a call); SDPA's is_causal is
        # top-left, which the memory-efficient kernel implements.
        top_left_ok = not is_causal or L == k.shape[-2]
        if add is None and q.dtype in HALF_DTYPES and d_ok and top_left_ok:
            lead = q.shape[:-1]
            if _CUDNN_OK and hasattr(aten, "_scaled_dot_product_cudnn_attention"):
                # cuDNN's fused attention is what SDPA itself picks on recent GPUs (on one
                # H200 it ran about twice as fast as the flash kernel below); it returns the
                # log-sum-exp on request
                try:
                    res = aten._scaled_dot_product_cudnn_attention(
                        q, k, v, None, True, 0.0, is_causal, False, scale=scale
                    )
                    if res[1].numel() == math.prod(lead):
                        return res[0], res[1].reshape(lead)
                except (RuntimeError, NotImplementedError):
                    pass
                _CUDNN_OK = False
            res = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, is_causal, scale=scale)
            return res[0], res[1][..., :L]
        res = aten._scaled_dot_product_efficient_attention(
            q, k, v, add, True, 0.0, is_causal, scale=scale
        )
        return res[0], res[1][..., :L]
    return q.new_zeros(()), None


def _composition_entropy(p: Prepared, detach_beta: bool) -> torch.Tensor | None:
    """Pass 1 of T10: the entropy of every query row, or None if no primitive fits."""
    q, k = p.q, p.k
    sd = stats_dtype(q.dtype)
    add = _additive(p)
    grad = not detach_beta and _want_grad(q, k)
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
    upper = torch.log(torch.clamp(p.n_eff, min=1).to(sd))
    return torch.minimum(torch.clamp(h, min=0.0), upper)


def _composition(p: Prepared, schedule: Schedule, detach_beta: bool) -> torch.Tensor | None:
    sd = stats_dtype(p.q.dtype)
    entropy = None
    if schedule.needs_entropy:
        entropy = _composition_entropy(p, detach_beta)
        if entropy is None:
            return None
    beta = beta_from_entropy(schedule, entropy, p.n_eff).to(sd)
    if detach_beta:
        beta = beta.detach()
    qb = (p.q.to(sd) * beta.unsqueeze(-1)).to(p.q.dtype)
    try:
        with torch.set_grad_enabled(_want_grad(p.q, p.k, p.v)):
            out, lse = _lse_primitive(qb, p.k, p.v, _additive(p), p.is_causal, p.scale)
    except (RuntimeError, NotImplementedError):
        return None
    return None if lse is None else out


# ---------------------------------------------------------------- chunked path


def _chunked(
    p: Prepared, schedule: Schedule, entropy_eps: float, detach_beta: bool
) -> torch.Tensor:
    """Exact-semantics path over blocks of queries: ``(block, S)`` logit tiles."""
    q, k, v = p.q, p.k, p.v
    sd = stats_dtype(q.dtype)
    L, S = q.shape[-2], k.shape[-2]
    B, H = q.shape[:2]
    block = max(1, min(L, CHUNK_ELEMENTS // max(1, B * H * S)))
    kt = k.to(sd).transpose(-1, -2)
    vs = v.to(sd)
    outs = []
    for i0 in range(0, L, block):
        i1 = min(L, i0 + block)
        x = p.scale * torch.matmul(q[..., i0:i1, :].to(sd), kt)
        if p.add is not None:
            add = p.add[..., i0:i1, :].to(sd)
            x = torch.where(p.keep[..., i0:i1, :], x + add, torch.full_like(x, -torch.inf))
        elif p.keep is not None:
            x = x.masked_fill(~p.keep[..., i0:i1, :], -torch.inf)
        elif p.is_causal:
            rows = torch.arange(i0, i1, device=q.device).unsqueeze(-1)
            cols = torch.arange(S, device=q.device)
            x = x.masked_fill(cols > rows, -torch.inf)
        probs, _, _ = adaptive_softmax_lastdim(x, schedule, entropy_eps, detach_beta)
        outs.append(torch.matmul(probs, vs))
    return torch.cat(outs, dim=-2)


# ---------------------------------------------------------------- Triton path


def _triton(p: Prepared, schedule: Schedule) -> torch.Tensor:
    from softmaxtheory.accelerated import _triton_attention as tri

    if p.add is not None:
        kind, mask = tri.MASK_ADD, p.add.to(p.q.dtype)
    elif p.keep is not None:
        kind, mask = tri.MASK_BOOL, p.keep
    else:
        kind, mask = tri.MASK_NONE, None
    entropy = None
    if schedule.needs_entropy:
        _, s, t = tri.triton_stats(p.q, p.k, mask, kind, p.is_causal, p.scale)
        upper = torch.log(torch.clamp(p.n_eff, min=1).to(torch.float32))
        entropy = torch.minimum(entropy_from_stats(s, t), upper)
    beta = beta_from_entropy(schedule, entropy, p.n_eff).to(torch.float32)
    beta = beta.expand(*p.q.shape[:2], p.q.shape[-2])
    return tri.triton_attention(p.q, p.k, p.v, beta, mask, kind, p.is_causal, p.scale)


def _triton_usable(p: Prepared, entropy_eps: float) -> bool:
    if entropy_eps != 0.0 or p.q.dtype == torch.float64:
        return False
    if _want_grad(p.q, p.k, p.v):
        return False
    on_device = p.q.device.type == "cuda" or (p.q.device.type == "cpu" and _triton_interpreting())
    if not on_device:
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


# ---------------------------------------------------------------- dispatch


def attention(
    p: Prepared,
    schedule: Schedule,
    entropy_eps: float,
    detach_beta: bool,
    backend: str,
) -> torch.Tensor:
    """Adaptive attention of prepared inputs; returns (B, H, L, Dv) in the input dtype."""
    q = p.q
    L, S = q.shape[-2], p.k.shape[-2]
    if L == 0 or S == 0:
        out = q.new_zeros((*q.shape[:2], L, p.v.shape[-1]))
    elif backend == "triton":
        if entropy_eps != 0.0:
            raise ValueError("backend='triton' supports entropy_eps=0.0 only")
        if q.dtype == torch.float64:
            raise TypeError("backend='triton' supports float16, bfloat16 and float32")
        if _want_grad(q, p.k, p.v):
            raise ValueError(
                "backend='triton' is forward-only; use backend='composition' for gradients "
                "(or call under torch.no_grad())"
            )
        if q.device.type != "cuda" and not _triton_interpreting():
            raise ValueError(
                "backend='triton' needs a CUDA tensor (or TRITON_INTERPRET=1 for CPU tensors)"
            )
        out = _triton(p, schedule)
    else:
        out = None
        if backend == "auto" and _triton_usable(p, entropy_eps):
            out = _triton(p, schedule)
        elif backend in ("auto", "composition") and entropy_eps == 0.0 and not p.bias:
            out = _composition(p, schedule, detach_beta)
        if out is None:
            out = _chunked(p, schedule, entropy_eps, detach_beta).to(q.dtype)
    out = out.to(q.dtype)
    if p.keep is not None or p.is_causal:
        out = torch.where((p.n_eff == 0).unsqueeze(-1), torch.zeros_like(out), out)
    if p.bad is not None:
        out = torch.where(p.bad.unsqueeze(-1), torch.full_like(out, torch.nan), out)
    return out
