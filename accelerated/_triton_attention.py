r"""Triton forward kernels of adaptive attention (private; imports triton).

Two passes over the keys, each a single :func:`triton.language.dot` per block:

1. ``_stats_kernel``: for every query row the running T7 state
   :math:`(m, s, t)` of its logits :math:`x_{ij} = \mathrm{scale}\, q_i \cdot k_j
   (+\ \mathrm{mask}_{ij})`, merged block by block with

   .. math::

       m' = \max(m, \max_j x_j), \quad
       s' = e^{m - m'} s + \sum_j e^{x_j - m'}, \quad
       t' = e^{m - m'}\bigl(t + s\,(m - m')\bigr) + \sum_j e^{x_j - m'} (x_j - m'),

   so :math:`H = \log s - t/s` needs no second matmul (no values pass).
2. ``_attention_kernel``: a flash-attention pass on the logits
   :math:`\beta_i x_{ij}`, with the per-row β read from memory.

Statistics are float32 whatever the input dtype; fp32 inputs use IEEE fp32
products (no TF32). Masked keys (boolean ``False``, additive ``-inf``, causal)
never enter an arithmetic operation; a query with no key gives zeros. The
kernels also run on CPU tensors under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["triton_attention", "triton_stats"]

MASK_NONE = 0
MASK_BOOL = 1
MASK_ADD = 2


@triton.jit
def _logits(
    q,
    K,
    M,
    start_n,
    offs_m,
    offs_n,
    offs_d,
    k_base,
    m_base,
    sks,
    skd,
    sml,
    sms,
    L,
    S,
    D,
    scale,
    MASK_KIND: tl.constexpr,
    CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    cols = start_n + offs_n
    k_ptrs = K + k_base + cols[:, None] * sks + offs_d[None, :] * skd
    k = tl.load(k_ptrs, mask=(cols[:, None] < S) & (offs_d[None, :] < D), other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
        k = k.to(tl.float32)
    x = tl.dot(q, tl.trans(k), input_precision=PRECISION, out_dtype=tl.float32) * scale
    valid = (cols[None, :] < S) & (offs_m[:, None] >= 0)
    if CAUSAL:
        valid = valid & (cols[None, :] <= offs_m[:, None])
    if MASK_KIND != 0:
        m_ptrs = M + m_base + offs_m[:, None] * sml + cols[None, :] * sms
        m_ok = (offs_m[:, None] < L) & (cols[None, :] < S)
        if MASK_KIND == 1:
            keep = tl.load(m_ptrs, mask=m_ok, other=0)
            valid = valid & (keep != 0)
        else:
            add = tl.load(m_ptrs, mask=m_ok, other=0.0).to(tl.float32)
            valid = valid & (add != float("-inf"))
            x = x + tl.where(valid, add, 0.0)
    return x, valid


@triton.jit
def _stats_kernel(
    Q,
    K,
    M,
    OutM,
    OutS,
    OutT,
    sqb,
    sqh,
    sql,
    sqd,
    skb,
    skh,
    sks,
    skd,
    smb,
    smh,
    sml,
    sms,
    H,
    L,
    S,
    D,
    scale,
    MASK_KIND: tl.constexpr,
    CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q_ptrs = Q + b * sqb + h * sqh + offs_m[:, None] * sql + offs_d[None, :] * sqd
    q = tl.load(q_ptrs, mask=(offs_m[:, None] < L) & (offs_d[None, :] < D), other=0.0)
    k_base = b * skb + h * skh
    m_base = b * smb + h * smh
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    s_i = tl.zeros([BLOCK_M], tl.float32)
    t_i = tl.zeros([BLOCK_M], tl.float32)
    for start_n in range(0, S, BLOCK_N):
        x, valid = _logits(
            q, K, M, start_n, offs_m, offs_n, offs_d, k_base, m_base, sks, skd, sml, sms,
            L, S, D, scale, MASK_KIND, CAUSAL, PRECISION, UPCAST,
        )  # fmt: skip
        x = tl.where(valid, x, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(x, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)
        z = tl.where(valid, x - m_safe[:, None], 0.0)
        e = tl.where(valid, tl.exp(z), 0.0)
        dm = tl.where(m_i == float("-inf"), 0.0, m_i - m_safe)
        t_i = alpha * (t_i + s_i * dm) + tl.sum(e * z, 1)
        s_i = alpha * s_i + tl.sum(e, 1)
        m_i = m_new
    row = pid_bh * L + offs_m
    tl.store(OutM + row, m_i, mask=offs_m < L)
    tl.store(OutS + row, s_i, mask=offs_m < L)
    tl.store(OutT + row, t_i, mask=offs_m < L)


@triton.jit
def _attention_kernel(
    Q,
    K,
    V,
    M,
    Beta,
    Out,
    sqb,
    sqh,
    sql,
    sqd,
    skb,
    skh,
    sks,
    skd,
    svb,
    svh,
    svs,
    svd,
    smb,
    smh,
    sml,
    sms,
    sob,
    soh,
    sol,
    sod,
    H,
    L,
    S,
    D,
    DV,
    scale,
    MASK_KIND: tl.constexpr,
    CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    q_ptrs = Q + b * sqb + h * sqh + offs_m[:, None] * sql + offs_d[None, :] * sqd
    q = tl.load(q_ptrs, mask=(offs_m[:, None] < L) & (offs_d[None, :] < D), other=0.0)
    beta = tl.load(Beta + pid_bh * L + offs_m, mask=offs_m < L, other=1.0)
    k_base = b * skb + h * skh
    m_base = b * smb + h * smh
    v_base = b * svb + h * svh
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    for start_n in range(0, S, BLOCK_N):
        x, valid = _logits(
            q, K, M, start_n, offs_m, offs_n, offs_d, k_base, m_base, sks, skd, sml, sms,
            L, S, D, scale, MASK_KIND, CAUSAL, PRECISION, UPCAST,
        )  # fmt: skip
        y = tl.where(valid, beta[:, None] * x, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(y, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)
        p = tl.where(valid, tl.exp(y - m_safe[:, None]), 0.0)
        l_i = alpha * l_i + tl.sum(p, 1)
        cols = start_n + offs_n
        v_ptrs = V + v_base + cols[:, None] * svs + offs_dv[None, :] * svd
        v = tl.load(v_ptrs, mask=(cols[:, None] < S) & (offs_dv[None, :] < DV), other=0.0)
        pv = p.to(v.dtype)
        if UPCAST:
            pv = pv.to(tl.float32)
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(pv, v, input_precision=PRECISION, out_dtype=tl.float32)
        m_i = m_new
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    o_ptrs = Out + b * sob + h * soh + offs_m[:, None] * sol + offs_dv[None, :] * sod
    tl.store(
        o_ptrs, out.to(Out.dtype.element_ty), mask=(offs_m[:, None] < L) & (offs_dv[None, :] < DV)
    )


def _blocks(device: torch.device, d: int, dv: int) -> dict[str, int]:
    bd = max(16, triton.next_power_of_2(d))
    bdv = max(16, triton.next_power_of_2(dv))
    if device.type == "cuda":
        return {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_D": bd, "BLOCK_DV": bdv}
    return {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_D": bd, "BLOCK_DV": bdv}


def _launch_options(device: torch.device, blocks: dict[str, int]) -> dict[str, int]:
    if device.type != "cuda":
        return {}
    warps = 4 if max(blocks["BLOCK_D"], blocks["BLOCK_DV"]) <= 64 else 8
    return {"num_warps": warps, "num_stages": 3}


def _mask_args(mask: torch.Tensor | None, kind: int, q: torch.Tensor) -> tuple:
    if kind == MASK_NONE:
        return q, (0, 0, 0, 0)  # unused pointer
    assert mask is not None
    if kind == MASK_BOOL:
        mask = mask.view(torch.uint8)
    return mask, tuple(mask.stride())


def _precision(q: torch.Tensor) -> dict[str, object]:
    """IEEE fp32 products for fp32 inputs (no TF32); bf16 upcast in the interpreter.

    The interpreter's ``tl.dot`` mishandles bfloat16 operands; products of
    bfloat16 numbers are exact in float32, so upcasting first computes the same
    logits (and ``p`` is still rounded to bfloat16 before the values product).
    """
    upcast = q.device.type != "cuda" and q.dtype == torch.bfloat16
    ieee = q.dtype == torch.float32 or upcast
    return {"PRECISION": "ieee" if ieee else "tf32", "UPCAST": upcast}


def triton_stats(
    q: torch.Tensor,
    k: torch.Tensor,
    mask: torch.Tensor | None,
    mask_kind: int,
    is_causal: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pass 1: the T7 state ``(m, s, t)`` of every query row, float32, shape (B, H, L).

    `q` is (B, H, L, D), `k` (B, H, S, D) (expanded views allowed); `mask` is
    (B, H, L, S) (bool or the dtype of `q`, expanded views allowed) or None.
    """
    B, H, L, D = q.shape
    S = k.shape[-2]
    out = [torch.empty((B, H, L), dtype=torch.float32, device=q.device) for _ in range(3)]
    blocks = _blocks(q.device, D, D)
    blocks.pop("BLOCK_DV")
    m_arg, m_strides = _mask_args(mask, mask_kind, q)
    grid = (triton.cdiv(L, blocks["BLOCK_M"]), B * H)
    _stats_kernel[grid](
        q, k, m_arg, *out,
        *q.stride(), *k.stride(), *m_strides,
        H, L, S, D, float(scale),
        MASK_KIND=mask_kind, CAUSAL=bool(is_causal), **_precision(q),
        **blocks, **_launch_options(q.device, {**blocks, "BLOCK_DV": 16}),
    )  # fmt: skip
    return out[0], out[1], out[2]


def triton_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    mask: torch.Tensor | None,
    mask_kind: int,
    is_causal: bool,
    scale: float,
) -> torch.Tensor:
    """Pass 2: attention on the logits ``beta_i * x_ij``; `beta` is float32 (B, H, L)."""
    B, H, L, D = q.shape
    S, DV = v.shape[-2:]
    out = torch.empty((B, H, L, DV), dtype=q.dtype, device=q.device)
    beta = beta.to(torch.float32).contiguous()
    blocks = _blocks(q.device, D, DV)
    m_arg, m_strides = _mask_args(mask, mask_kind, q)
    grid = (triton.cdiv(L, blocks["BLOCK_M"]), B * H)
    _attention_kernel[grid](
        q, k, v, m_arg, beta, out,
        *q.stride(), *k.stride(), *v.stride(), *m_strides, *out.stride(),
        H, L, S, D, DV, float(scale),
        MASK_KIND=mask_kind, CAUSAL=bool(is_causal), **_precision(q),
        **blocks, **_launch_options(q.device, blocks),
    )  # fmt: skip
    return out
