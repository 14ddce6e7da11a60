r"""Triton kernels of adaptive attention (private; imports triton).

Pass 1, its backward, and pass 2 of the all-Triton forward:

1. ``_entropy_kernel`` (pass 1): for every query row the running T7 state
   :math:`(m, s, t)` of its logits :math:`x_{ij} = \mathrm{scale}\, q_i \cdot k_j
   (+\ \mathrm{mask}_{ij})`, merged block by block with

   .. math::

       m' = \max(m, \max_j x_j), \quad
       s' = e^{m - m'} s + \sum_j e^{x_j - m'}, \quad
       t' = e^{m - m'}\bigl(t + s\,(m - m')\bigr) + \sum_j e^{x_j - m'} (x_j - m'),

   written out as :math:`\mathrm{LSE} = m + \log s` and :math:`H = \log s - t/s`
   (float32, :math:`O(B H L)` memory). It reads no values and forms no
   :math:`PV` product: its cost is :math:`QK^\top` alone, about half an
   attention. A causal query block stops at the last key block it can see;
   boolean and additive masks are read tile by tile; grouped-query attention
   reads key head ``h // group`` for query head ``h`` (no repeated K).
   The kernels take logits within the callers' overflow guard,
   :math:`|x_{ij}| \le 2^{125}` (beyond it the overflow-safe torch path
   runs instead): there no base-2 logit :math:`x_{ij}\log_2 e` and no
   difference :math:`x_j - m'` overflows, so the kernels spend no
   instruction per entry on clamps.
2. ``_entropy_bwd_dq_kernel`` and ``_entropy_bwd_dk_kernel`` (the backward of
   pass 1): from the row gradients :math:`\bar H_i, \bar L_i` and the stored
   :math:`(H, \mathrm{LSE})`, they recompute each logit tile and
   :math:`p_{ij} = e^{x_{ij} - \mathrm{LSE}_i}`, form
   :math:`\bar x_{ij} = p_{ij}(\bar L_i - \bar H_i(x_{ij} - \mathrm{LSE}_i + H_i))`
   and accumulate :math:`\bar q = \mathrm{scale}\,\bar X K` per query block and
   :math:`\bar k = \mathrm{scale}\,\bar X^\top Q` per key block (over the
   query heads of its group). No values are read here either.
3. ``_attention_kernel`` (pass 2 of ``backend="triton"``): a flash-attention
   pass on the logits :math:`\beta_i x_{ij}`, with the per-row β read from
   memory.

Inside the kernels the logits are in base 2, :math:`x_{ij}\log_2 e` (the
scale multiplied by :math:`\log_2 e` once per program), and every
exponential is an ``exp2``: the hardware's exponential is base 2, and ``exp``
would multiply each argument by :math:`\log_2 e` again. The stored
statistics are in natural units.

Statistics are float32 whatever the input dtype (float64 for float64 inputs,
which only the tests send); fp32 inputs use IEEE fp32 products (no TF32).
A masked key (boolean ``False``, additive ``-inf``, causal, past the
sequence) has the logit ``-inf``, set once as its tile is formed, and so the
weight exactly 0; the one product that would meet it,
:math:`0 \cdot \infty`, takes an exponent raised to a floor first. The
callers send finite queries and keys only, so no NaN enters through a masked
key. A query with no key gives zeros (pass 2), ``H = 0`` and ``LSE = -inf``
(pass 1). Pointer offsets are int64
(a ``(B, H, L, S)`` mask may exceed :math:`2^{31}` elements). Launch
configurations come from :mod:`._triton_config` (smaller tiles when the
shared memory does not hold the largest). The kernels also run on CPU
tensors under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._triton_config import configs, launch

__all__ = [
    "MASK_ADD",
    "MASK_BOOL",
    "MASK_NONE",
    "RAW_LOG2_BOUND",
    "raw_products",
    "tile_grid",
    "triton_attention",
    "triton_entropy",
    "triton_entropy_backward",
]

#: Mask kinds (the ``MASK_KIND`` compile-time argument).
MASK_NONE = 0
MASK_BOOL = 1
MASK_ADD = 2

#: Largest :math:`\log_2` of a bound on :math:`|x_{ij}|` for which pass 1 scales the raw
#: products in its step (``RAW``, :func:`raw_products`).
RAW_LOG2_BOUND = 29.0

#: Arguments the JIT compiles as plain integers: the query heads per key head enter the
#: pass-1 kernels only through one division per program, and a variant per group size
#: (1, the JIT's constant, or more) would double their compilations for nothing.
_GROUP = ["group"]

_MASK_BOOL = tl.constexpr(MASK_BOOL)
_MASK_ADD = tl.constexpr(MASK_ADD)
_FLT_MAX = tl.constexpr(3.4028234663852886e38)
_LOG2E = tl.constexpr(1.4426950408889634)
_LN2 = tl.constexpr(0.6931471805599453)


def tile_grid(n_tiles: int, heads: int) -> tuple[int]:
    """The launch grid of `n_tiles` tiles (of rows or of keys) for each of `heads` batch-heads.

    One axis, tiles fastest (the order of a ``(n_tiles, heads)`` grid): CUDA's second and
    third grid axes end at 65535, so a batch-head axis there could not launch B·H beyond
    that (a batch of 4096 sequences with 16 heads); the first ends at :math:`2^{31} - 1`.
    :func:`_tile_and_head` reads a program's place back.
    """
    return (n_tiles * heads,)


@triton.jit
def _tile_and_head(n_tiles):
    """The tile and batch-head of the running program, in a :func:`tile_grid` of `n_tiles` tiles."""
    pid = tl.program_id(0)
    return pid % n_tiles, pid // n_tiles


@triton.jit
def _load_block(
    Base,
    base,
    start,
    offs,
    cols,
    stride_row,
    stride_col,
    n_rows,
    n_cols,
    ROWS_IN: tl.constexpr = False,
    SCALAR_START: tl.constexpr = True,
):
    """The block of rows ``start + offs`` and `cols` at ``Base + base`` (int64 offsets).

    Zero outside ``n_rows × n_cols``. ``SCALAR_START=True``: the row offset is the
    scalar ``start * stride_row`` plus the loop-invariant ``offs * stride_row``, so
    that in a loop over blocks each address costs one add (LLVM does not find that
    form itself in pass 1's pipelined loop). ``False``: the offsets of the rows
    ``start + offs``, for the dq kernel, where LLVM reduces them to increments itself
    and ptxas serializes the loop's wgmma (C7515) on the scalar form. ``ROWS_IN=True``:
    the caller knows every row is below `n_rows` (an interior block), so only the
    columns are masked: no compare and select per row.
    """
    rows = start + offs
    if SCALAR_START:
        ptrs = (
            Base
            + (base + tl.cast(start, tl.int64) * stride_row)
            + offs[:, None].to(tl.int64) * stride_row
            + cols[None, :].to(tl.int64) * stride_col
        )
    else:
        ptrs = (
            Base
            + base
            + rows[:, None].to(tl.int64) * stride_row
            + cols[None, :].to(tl.int64) * stride_col
        )
    if ROWS_IN:
        return tl.load(ptrs, mask=cols[None, :] < n_cols, other=0.0)
    return tl.load(ptrs, mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols), other=0.0)


@triton.jit
def _far(ACC: tl.constexpr):
    """A dead row's ``lse2``: above every base-2 logit the overflow guard admits."""
    return 2.0**1023 if ACC == tl.float64 else 2.0**127


@triton.jit
def _row_coefficients(Lse, Ent, DEnt, DLse, row, in_rows, ACC: tl.constexpr):
    r"""Per row of pass 1's backward: ``(lse2, a, b)`` of :func:`_grad_logits`.

    From pass 1's statistics and their incoming gradients, with
    :math:`\lambda_i = \mathrm{LSE}_i \log_2 e` (0 for a fully masked row),
    :math:`a_i = \bar L_i - \bar H_i H_i` and :math:`b_i = \bar H_i \ln 2`, the
    gradient of a base-2 logit is :math:`2^{z}(a_i - b_i z)`, :math:`z = x - \lambda_i`.
    The row is first scaled by the power of two :math:`g_i = 2^{e_i} >
    \max(1, |a_i|, |b_i|)`, folded into the exponent:
    :math:`2^{z}(a_i - b_i z) = 2^{z'}(a'_i - b'_i z')` with :math:`z' = z + e_i`,
    ``lse2`` :math:`= \lambda_i - e_i`, ``b`` :math:`= b_i / g_i` and ``a``
    :math:`= a_i / g_i + b'_i e_i`. Then :math:`|b'_i| < 1` and :math:`|a'_i| < 1 + e_i`,
    so within the callers' overflow guard (:math:`|z'| < 2^{127}`) the factor
    :math:`a'_i - b'_i z'` is finite for every entry, also where :math:`2^{z'}`
    underflows to 0 (unscaled, :math:`b_i z` overflows there for :math:`|b_i| > 2`
    and the product is :math:`0 \cdot \infty`). It costs a few operations per row
    and none per entry.

    A row no loss reaches (:math:`\bar H_i = \bar L_i = 0`; a NaN row's ``where``
    sends it 0) must add nothing, not :math:`0 \cdot \mathrm{NaN}`: it gets
    :math:`a_i = b_i = 0` and ``lse2`` far above every base-2 logit
    (:math:`2^{127}`, :math:`2^{1023}` in float64; within the guard
    :math:`|x \log_2 e| < 2^{126}`, or :math:`2^{1022}`), so its :math:`2^{z'}` is
    exactly 0 and its :math:`z'` finite: a few operations per row instead of a
    select per entry (a select after the 16-bit rounding of the tile, as compiled).
    Rows outside `in_rows` load zeros (dead rows).
    """
    lse = tl.load(Lse + row, mask=in_rows, other=0.0)
    ent = tl.load(Ent + row, mask=in_rows, other=0.0)
    d_ent = tl.load(DEnt + row, mask=in_rows, other=0.0)
    d_lse = tl.load(DLse + row, mask=in_rows, other=0.0)
    live = (d_ent != 0.0) | (d_lse != 0.0)
    a = tl.where(live, d_lse - d_ent * ent, 0.0)
    b = tl.where(live, d_ent * _LN2, 0.0)
    # e = floor(log2 max(1, |a|, |b|)) + 1 from the exponent bits, at most 126 (so that
    # 2^-e is a normal number); g = 2^e and its inverse are exact
    big = tl.maximum(tl.maximum(tl.abs(a), tl.abs(b)), 1.0)
    if ACC == tl.float64:
        e = tl.minimum((big.to(tl.int64, bitcast=True) >> 52) - 1022, 1022)
        inv_g = ((1023 - e) << 52).to(tl.float64, bitcast=True)
    else:
        e = tl.minimum((big.to(tl.int32, bitcast=True) >> 23) - 126, 126)
        inv_g = ((127 - e) << 23).to(tl.float32, bitcast=True)
    e = e.to(ACC)
    b = b * inv_g
    a = a * inv_g + b * e
    lse2 = tl.where(live, tl.where(lse == float("-inf"), 0.0, lse * _LOG2E) - e, _far(ACC))
    return lse2, a, b


@triton.jit
def _z_floor(dtype: tl.constexpr):
    r"""The floor of the kernels' base-2 exponents :math:`z`: :math:`2^z` is 0 below it.

    -256 in float32 (:math:`2^{-256}` is below the least subnormal, :math:`2^{-149}`),
    -2048 in float64 (below :math:`2^{-1074}`). Raising ``-inf`` or any lower exponent
    to it leaves :math:`2^z = 0` and makes :math:`z` finite, so that a product
    :math:`2^z \cdot c\,z` is 0, not NaN, for every coefficient :math:`|c| < 10^{36}`.
    """
    return -2048.0 if dtype == tl.float64 else -256.0


@triton.jit
def _inside(offs_m, cols, S, CAUSAL: tl.constexpr):
    """Which entries of an edge tile exist: keys below `S` and, when causal, not after the row."""
    inside = (cols[None, :] < S) & (offs_m[:, None] >= 0)
    if CAUSAL:
        inside = inside & (cols[None, :] <= offs_m[:, None])
    return inside


@triton.jit
def _tile(
    q,
    k,
    Mask,
    offs_m,
    cols,
    mask_base,
    stride_mask_q,
    stride_mask_k,
    L,
    S,
    qk_scale,
    MASK_KIND: tl.constexpr,
    CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
    ACC: tl.constexpr,
    EDGE: tl.constexpr,
    KT: tl.constexpr = False,
    MASK_ROWS: tl.constexpr = True,
):
    r"""Base-2 logits of the (BLOCK_M, BLOCK_N) tile of loaded `q` and `k`; ``-inf`` where masked.

    The tile is :math:`x_{ij} \log_2 e` with ``qk_scale`` :math:`= \mathrm{scale}\,\log_2 e`
    (an additive mask is scaled by :math:`\log_2 e` too), so that the kernels' exponentials
    are ``exp2`` of differences: one multiply per entry fewer than ``exp``, which scales
    its argument itself (pass 1 with a positive scale passes ``qk_scale=1.0``, which
    folds away, and scales the raw products itself: ``RAW`` in :func:`_entropy_step`).
    An entry that takes no part (a masked key, a key past `S`, a causal key after the
    row) is ``-inf``, set once as the tile is formed (a boolean mask adds 0 or ``-inf``,
    an additive one is added, an edge takes a select); the callers then need no
    per-entry predicate (which the compiler keeps as packed bits, unpacked at each use):
    their exponentials give exactly 0 there, and they clamp the one difference that
    would meet a 0 in a product. ``EDGE=False``: the caller knows the tile lies inside
    the keys and, when causal, wholly on or below the diagonal, so only a mask can
    exclude entries. ``KT=True``: `k` is passed transposed, (BLOCK_D, BLOCK_N) (the dk
    kernel transposes its fixed key block once, where Triton would store the transpose
    to shared memory per tile). ``MASK_ROWS=False``: the mask is the same for every
    query (its query stride is 0, a key-padding mask broadcast from ``(B, 1, 1, S)``,
    say), so one row of it is loaded, a value per key, and broadcast over the rows:
    no two-dimensional byte tile to bring to the product's layout and unpack entry by
    entry.
    """
    x = tl.dot(q, k if KT else tl.trans(k), input_precision=PRECISION, out_dtype=ACC) * qk_scale
    if MASK_KIND != 0:
        if MASK_ROWS:
            m_ptrs = (
                Mask
                + mask_base
                + offs_m[:, None].to(tl.int64) * stride_mask_q
                + cols[None, :].to(tl.int64) * stride_mask_k
            )
            m_ok = (offs_m[:, None] < L) & (cols[None, :] < S)
        else:  # one value per key, the same for every row
            m_ptrs = Mask + mask_base + cols[None, :].to(tl.int64) * stride_mask_k
            m_ok = cols[None, :] < S
        if MASK_KIND == _MASK_BOOL:
            # a key past S loads False (and a row past L: no caller reads its logits); in
            # an edge tile the keys are also checked against S: redundant, but without it
            # ptxas serializes pass 2's wgmma at D = 128
            keep = tl.load(m_ptrs, mask=m_ok, other=0) != 0
            if EDGE:
                keep = keep & _inside(offs_m, cols, S, CAUSAL)
            if MASK_ROWS:
                # an add of 0 or -inf, not a select of x (130 instructions fewer in pass
                # 1's loop)
                x = x + tl.where(keep, 0.0, float("-inf"))
            else:
                # a select: with the add, ptxas waits between the two halves of pass 1's
                # product (4 warps, 128 rows)
                x = tl.where(keep, x, float("-inf"))
        else:
            # an additive -inf (or a key past S, which loads -inf) makes the logit -inf
            # itself: x is finite (the callers' overflow guard) and the mask holds no NaN
            # or +inf
            x = x + tl.load(m_ptrs, mask=m_ok, other=float("-inf")).to(ACC) * _LOG2E
            if EDGE and CAUSAL:
                x = tl.where(_inside(offs_m, cols, S, CAUSAL), x, float("-inf"))
    elif EDGE:
        x = tl.where(_inside(offs_m, cols, S, CAUSAL), x, float("-inf"))
    return x


@triton.jit
def _logits(
    q,
    K,
    Mask,
    start_n,
    offs_m,
    offs_n,
    offs_d,
    k_base,
    mask_base,
    stride_k_seq,
    stride_k_dim,
    stride_mask_q,
    stride_mask_k,
    L,
    S,
    D,
    qk_scale,
    MASK_KIND: tl.constexpr,
    CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    ACC: tl.constexpr,
    EDGE: tl.constexpr,
    SCALAR_START: tl.constexpr = True,
    MASK_ROWS: tl.constexpr = True,
):
    """Load the key block at `start_n`; the tile's base-2 logits (:func:`_tile`) and the keys.

    `SCALAR_START`: the address form of the key loads (see :func:`_load_block`);
    `MASK_ROWS`: see :func:`_tile`.
    """
    cols = start_n + offs_n
    k = _load_block(
        K, k_base, start_n, offs_n, offs_d, stride_k_seq, stride_k_dim, S, D, not EDGE,
        SCALAR_START,
    )  # fmt: skip
    if UPCAST:
        q = q.to(tl.float32)
        k = k.to(tl.float32)
    x = _tile(
        q, k, Mask, offs_m, cols, mask_base, stride_mask_q, stride_mask_k, L, S, qk_scale,
        MASK_KIND, CAUSAL, PRECISION, ACC, EDGE, False, MASK_ROWS,
    )  # fmt: skip
    return x, k


@triton.jit
def _entropy_step(m_i, s_i, t_i, x, c, MASKED: tl.constexpr, RAW: tl.constexpr):
    r"""Merge one tile of base-2 logits into the rows' T7 states ``(m, s, t)``.

    The state is in base 2 (``m`` and ``t`` are :math:`\log_2 e` times the
    natural ones, ``s`` is the same), so each entry costs one ``exp2``.
    Within the callers' overflow guard (:math:`|x| \le 2^{125}`, so
    :math:`|x \log_2 e - m'| < 2^{127}`) no difference :math:`x_j - m'`
    overflows. ``MASKED=True``: the tile may hold ``-inf`` (:func:`_tile`), whose
    difference is ``-inf``: it is raised to :func:`_z_floor` (one ``max`` per
    entry, no predicate), where its exponential is still exactly 0 and its product
    with it 0, not :math:`0 \cdot \infty`. A difference that low in a live entry
    has an exponential that rounds to 0 as well, so nothing else changes.

    ``RAW=True``: `x` holds the products :math:`q_i \cdot k_j` themselves and
    `c` :math:`= \mathrm{scale}\log_2 e > 0` (no additive mask). Then
    :math:`\max_j c\,x_j = c \max_j x_j`, so the row maximum is taken on the
    products and each difference is one fused multiply-add,
    :math:`c\,x_j - m'`, where scaling first costs a multiply per entry more.
    The maximum's own difference is then not 0 but the rounding error of
    :math:`m' = \mathrm{fl}(c \max_j x_j)`, up to half an ulp of :math:`m'`, and
    its exponential overflows once that reaches 128 (:math:`|m'| \ge 2^{31}` in
    float32). The callers take ``RAW`` only for logits within
    :math:`2^{29}` (:func:`raw_products`): there :math:`|m'| < 2^{30}`, every
    difference is at most :math:`2^5` and each exponential at most
    :math:`2^{32}`; the state stays exact, :math:`\sum_j 2^{c x_j} = 2^{m} s`.
    """
    m_new = tl.maximum(m_i, c * tl.max(x, 1) if RAW else tl.max(x, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    z = tl.fma(x, c, -m_safe[:, None]) if RAW else x - m_safe[:, None]
    if MASKED:
        z = tl.maximum(z, _z_floor(z.dtype))
    e = tl.exp2(z)
    dm = tl.where(m_i == float("-inf"), 0.0, tl.maximum(m_i - m_safe, -_FLT_MAX))
    t_i = tl.where(alpha > 0.0, alpha * (t_i + s_i * dm), 0.0) + tl.sum(e * z, 1)
    s_i = alpha * s_i + tl.sum(e, 1)
    return m_new, s_i, t_i


@triton.jit(do_not_specialize=_GROUP)
def _entropy_kernel(
    Q,
    K,
    Mask,
    OutLse,
    OutEntropy,
    stride_q_batch,
    stride_q_head,
    stride_q_seq,
    stride_q_dim,
    stride_k_batch,
    stride_k_head,
    stride_k_seq,
    stride_k_dim,
    stride_mask_batch,
    stride_mask_head,
    stride_mask_q,
    stride_mask_k,
    num_heads,
    group,
    L,
    S,
    D,
    Scale,
    MASK_KIND: tl.constexpr,
    CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    RAW: tl.constexpr = False,
    MASK_ROWS: tl.constexpr = True,
):
    pid_m, pid_bh = _tile_and_head(tl.cdiv(L, BLOCK_M))
    qk_scale = tl.load(Scale) * _LOG2E
    # RAW (scale > 0, no additive mask): the steps scale the products themselves
    tile_scale = 1.0 if RAW else qk_scale
    batch = (pid_bh // num_heads).to(tl.int64)
    head = (pid_bh % num_heads).to(tl.int64)
    kv_head = head // group
    rows = tl.arange(0, BLOCK_M)
    offs_m = pid_m * BLOCK_M + rows
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q_base = batch * stride_q_batch + head * stride_q_head
    q = _load_block(Q, q_base, pid_m * BLOCK_M, rows, offs_d, stride_q_seq, stride_q_dim, L, D)
    k_base = batch * stride_k_batch + kv_head * stride_k_head
    mask_base = batch * stride_mask_batch + head * stride_mask_head
    m_i = tl.full([BLOCK_M], float("-inf"), ACC)
    s_i = tl.zeros([BLOCK_M], ACC)
    t_i = tl.zeros([BLOCK_M], ACC)
    hi = S
    # interior key blocks: inside S and, when causal, visible to every row of this block
    inner = S // BLOCK_N * BLOCK_N
    if CAUSAL:
        hi = tl.minimum(S, (pid_m + 1) * BLOCK_M)  # later key blocks are fully masked
        inner = tl.minimum(inner, (pid_m * BLOCK_M + 1) // BLOCK_N * BLOCK_N)
    for start_n in range(0, inner, BLOCK_N):
        x, _k = _logits(
            q, K, Mask, start_n, offs_m, offs_n, offs_d, k_base, mask_base,
            stride_k_seq, stride_k_dim, stride_mask_q, stride_mask_k,
            L, S, D, tile_scale, MASK_KIND, CAUSAL, PRECISION, UPCAST, ACC, False, True,
            MASK_ROWS,
        )  # fmt: skip
        m_i, s_i, t_i = _entropy_step(m_i, s_i, t_i, x, qk_scale, MASK_KIND != 0, RAW)
    for start_n in range(inner, hi, BLOCK_N):
        x, _k = _logits(
            q, K, Mask, start_n, offs_m, offs_n, offs_d, k_base, mask_base,
            stride_k_seq, stride_k_dim, stride_mask_q, stride_mask_k,
            L, S, D, tile_scale, MASK_KIND, CAUSAL, PRECISION, UPCAST, ACC, True, True,
            MASK_ROWS,
        )  # fmt: skip
        m_i, s_i, t_i = _entropy_step(m_i, s_i, t_i, x, qk_scale, True, RAW)
    # back to natural units: LSE = ln 2 (m + log2 s), H = ln 2 (log2 s - t / s)
    has = s_i > 0.0
    s_safe = tl.where(has, s_i, 1.0)
    log2_s = tl.log2(s_safe)
    lse = tl.where(has, (m_i + log2_s) * _LN2, float("-inf"))
    entropy = tl.where(has, tl.maximum(log2_s - t_i / s_safe, 0.0) * _LN2, 0.0)
    row = pid_bh.to(tl.int64) * L + offs_m
    tl.store(OutLse + row, lse, mask=offs_m < L)
    tl.store(OutEntropy + row, entropy, mask=offs_m < L)


@triton.jit
def _grad_logits(x, lse2, a, b, MASKED: tl.constexpr):
    r"""The gradient of a loss with respect to the tile's logits (masked entries 0).

    :math:`\partial \mathrm{LSE}_i/\partial x_{ij} = p_{ij}` and
    :math:`\partial H_i/\partial x_{ij} = -p_{ij}(\log p_{ij} + H_i)` with
    :math:`\log p_{ij} = x_{ij} - \mathrm{LSE}_i`, so
    :math:`\bar x_{ij} = p_{ij}\,(\bar L_i - \bar H_i\,(x_{ij} - \mathrm{LSE}_i + H_i))`.
    `x` holds base-2 logits (:func:`_tile`): with
    :math:`z_{ij} = \log_2 p_{ij} = x_{ij}\log_2 e - \mathrm{LSE}_i \log_2 e`,
    :math:`\bar x_{ij} = 2^{z_{ij}}\,(a_i - b_i z_{ij})` where
    :math:`a_i = \bar L_i - \bar H_i H_i` and :math:`b_i = \bar H_i \ln 2` are
    formed once per row, scaled so that no product overflows
    (:func:`_row_coefficients`, which also makes the rows no loss reaches add exactly
    0): an ``exp2``, a fused multiply-add and a multiply per entry. ``MASKED=True``:
    the tile may hold ``-inf``; its exponent is raised to :func:`_z_floor` (one ``max``
    per entry), where :math:`2^z` is still 0 and the factor finite.
    """
    z = x - lse2[:, None]
    if MASKED:
        z = tl.maximum(z, _z_floor(z.dtype))
    return tl.exp2(z) * (a[:, None] - b[:, None] * z)


@triton.jit
def _grad_dot(dx, other, PRECISION: tl.constexpr, ACC: tl.constexpr):
    r"""``dx @ other`` for the pass-1 backward: the logits' gradients times keys or queries.

    The gradient of a logit, :math:`\bar x_{ij} = p_{ij}(\overline{\mathrm{LSE}}_i +
    \dots)`, is rounded to the operands' dtype for the tensor cores. bfloat16 has the
    range of float32; float16 has not (:math:`6\cdot10^{-8}` to 65504), and a gradient of
    :math:`10^6` on the log-sum-exp (a loss scaler's :math:`2^{16}` on a peaked row) made
    :math:`\bar x` infinite, or :math:`2^{-16}` on a long row made it 0, where
    :math:`\bar q` and :math:`\bar k` are ordinary float16 numbers. float16 operands are
    therefore widened and multiplied in TF32, whose 10-bit significand is float16's and
    whose exponent is float32's: the same rounding of :math:`\bar x`, without its range.
    """
    if other.dtype == tl.float16:
        return tl.dot(dx, other.to(tl.float32), input_precision="tf32", out_dtype=ACC)
    return tl.dot(dx.to(other.dtype), other, input_precision=PRECISION, out_dtype=ACC)


@triton.jit(do_not_specialize=_GROUP)
def _entropy_bwd_dq_kernel(
    Q,
    K,
    Mask,
    Scale,
    Lse,
    Ent,
    DEnt,
    DLse,
    DQ,
    CoefLse2,
    CoefA,
    CoefB,
    stride_q_batch,
    stride_q_head,
    stride_q_seq,
    stride_q_dim,
    stride_k_batch,
    stride_k_head,
    stride_k_seq,
    stride_k_dim,
    stride_mask_batch,
    stride_mask_head,
    stride_mask_q,
    stride_mask_k,
    num_heads,
    group,
    L,
    S,
    D,
    MASK_KIND: tl.constexpr,
    CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    MASK_ROWS: tl.constexpr = True,
):
    pid_m, pid_bh = _tile_and_head(tl.cdiv(L, BLOCK_M))
    scale = tl.load(Scale)
    qk_scale = scale * _LOG2E
    batch = (pid_bh // num_heads).to(tl.int64)
    head = (pid_bh % num_heads).to(tl.int64)
    kv_head = head // group
    rows = tl.arange(0, BLOCK_M)
    offs_m = pid_m * BLOCK_M + rows
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q_base = batch * stride_q_batch + head * stride_q_head
    q = _load_block(Q, q_base, pid_m * BLOCK_M, rows, offs_d, stride_q_seq, stride_q_dim, L, D)
    row = pid_bh.to(tl.int64) * L + offs_m
    lse2, a, b = _row_coefficients(Lse, Ent, DEnt, DLse, row, offs_m < L, ACC)
    # for the dk kernel, which needs them once per query block it visits
    tl.store(CoefLse2 + row, lse2, mask=offs_m < L)
    tl.store(CoefA + row, a, mask=offs_m < L)
    tl.store(CoefB + row, b, mask=offs_m < L)
    k_base = batch * stride_k_batch + kv_head * stride_k_head
    mask_base = batch * stride_mask_batch + head * stride_mask_head
    acc = tl.zeros([BLOCK_M, BLOCK_D], ACC)
    hi = S
    inner = S // BLOCK_N * BLOCK_N  # interior key blocks, as in the forward
    if CAUSAL:
        hi = tl.minimum(S, (pid_m + 1) * BLOCK_M)
        inner = tl.minimum(inner, (pid_m * BLOCK_M + 1) // BLOCK_N * BLOCK_N)
    for start_n in range(0, inner, BLOCK_N):
        x, k = _logits(
            q, K, Mask, start_n, offs_m, offs_n, offs_d, k_base, mask_base,
            stride_k_seq, stride_k_dim, stride_mask_q, stride_mask_k,
            L, S, D, qk_scale, MASK_KIND, CAUSAL, PRECISION, UPCAST, ACC, False, False,
            MASK_ROWS,
        )  # fmt: skip
        dx = _grad_logits(x, lse2, a, b, MASK_KIND != 0)
        acc += _grad_dot(dx, k, PRECISION, ACC)
    for start_n in range(inner, hi, BLOCK_N):
        x, k = _logits(
            q, K, Mask, start_n, offs_m, offs_n, offs_d, k_base, mask_base,
            stride_k_seq, stride_k_dim, stride_mask_q, stride_mask_k,
            L, S, D, qk_scale, MASK_KIND, CAUSAL, PRECISION, UPCAST, ACC, True, False,
            MASK_ROWS,
        )  # fmt: skip
        dx = _grad_logits(x, lse2, a, b, True)
        acc += _grad_dot(dx, k, PRECISION, ACC)
    dq_ptrs = DQ + pid_bh.to(tl.int64) * L * D + offs_m[:, None].to(tl.int64) * D + offs_d[None, :]
    dq = (acc * scale).to(DQ.dtype.element_ty)  # the input dtype: rounded once, here
    tl.store(dq_ptrs, dq, mask=(offs_m[:, None] < L) & (offs_d[None, :] < D))


@triton.jit
def _stored_coefficients(
    CoefLse2, CoefA, CoefB, row, in_rows, ACC: tl.constexpr, ROWS_IN: tl.constexpr
):
    """The rows' ``(lse2, a, b)`` as the dq kernel stored them (:func:`_row_coefficients`).

    A row outside `in_rows` (past `L`) loads a dead row's: ``lse2`` far above every
    logit and :math:`a = b = 0`, so it adds exactly 0 whatever its tile holds.
    """
    if ROWS_IN:
        return tl.load(CoefLse2 + row), tl.load(CoefA + row), tl.load(CoefB + row)
    lse2 = tl.load(CoefLse2 + row, mask=in_rows, other=_far(ACC))
    a = tl.load(CoefA + row, mask=in_rows, other=0.0)
    b = tl.load(CoefB + row, mask=in_rows, other=0.0)
    return lse2, a, b


@triton.jit
def _dk_tile(
    Q,
    Mask,
    CoefLse2,
    CoefA,
    CoefB,
    k,
    cols,
    offs_d,
    start_m,
    q_base,
    mask_base,
    row_base,
    stride_q_seq,
    stride_q_dim,
    stride_mask_q,
    stride_mask_k,
    L,
    S,
    D,
    qk_scale,
    MASK_KIND: tl.constexpr,
    CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    EDGE: tl.constexpr,
    ROWS_IN: tl.constexpr,
    MASK_ROWS: tl.constexpr,
):
    r"""One query block's contribution :math:`\bar X^\top Q` to a key block's gradient.

    ``EDGE=False``: every key of the block takes part for every row (see :func:`_tile`);
    ``ROWS_IN=True``: every row of the block is below `L`, so no load is masked by rows.
    """
    rows = tl.arange(0, BLOCK_M)
    offs_m = start_m + rows
    q = _load_block(Q, q_base, start_m, rows, offs_d, stride_q_seq, stride_q_dim, L, D, ROWS_IN)
    if UPCAST:
        q = q.to(tl.float32)
    lse2, a, b = _stored_coefficients(
        CoefLse2, CoefA, CoefB, row_base + offs_m, offs_m < L, ACC, ROWS_IN
    )
    x = _tile(
        q, k, Mask, offs_m, cols, mask_base, stride_mask_q, stride_mask_k, L, S, qk_scale,
        MASK_KIND, CAUSAL, PRECISION, ACC, EDGE, True, MASK_ROWS,
    )  # fmt: skip
    dx = _grad_logits(x, lse2, a, b, EDGE or MASK_KIND != 0)
    return _grad_dot(tl.trans(dx), q, PRECISION, ACC)


@triton.jit
def _entropy_bwd_dk_kernel(
    Q,
    K,
    Mask,
    Scale,
    CoefLse2,
    CoefA,
    CoefB,
    DK,
    stride_q_batch,
    stride_q_head,
    stride_q_seq,
    stride_q_dim,
    stride_k_batch,
    stride_k_head,
    stride_k_seq,
    stride_k_dim,
    stride_mask_batch,
    stride_mask_head,
    stride_mask_q,
    stride_mask_k,
    num_heads,
    group,
    L,
    S,
    D,
    MASK_KIND: tl.constexpr,
    CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    MASK_ROWS: tl.constexpr = True,
):
    pid_n, pid_bh = _tile_and_head(tl.cdiv(S, BLOCK_N))  # over batch * key heads
    scale = tl.load(Scale)
    qk_scale = scale * _LOG2E
    kv_heads = num_heads // group
    batch = (pid_bh // kv_heads).to(tl.int64)
    kv_head = (pid_bh % kv_heads).to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    k_base = batch * stride_k_batch + kv_head * stride_k_head
    k = _load_block(
        K, k_base, pid_n * BLOCK_N, tl.arange(0, BLOCK_N), offs_d, stride_k_seq, stride_k_dim, S, D
    )
    if UPCAST:
        k = k.to(tl.float32)
    k = tl.trans(k)  # once: the tiles take it transposed
    acc = tl.zeros([BLOCK_N, BLOCK_D], ACC)
    lo = 0
    inner = lo  # query blocks from here on see every key of this block (rows past L are dead)
    if CAUSAL:
        lo = (pid_n * BLOCK_N // BLOCK_M) * BLOCK_M  # earlier query blocks see none of these keys
        inner = (pid_n * BLOCK_N + BLOCK_N - 1 + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    if (pid_n + 1) * BLOCK_N > S:
        inner = L  # the last key block is partly outside S: every tile is an edge tile
    inner = tl.minimum(inner, L)
    full = tl.maximum(inner, L // BLOCK_M * BLOCK_M)  # the query blocks from here are partial
    for g in range(0, group):
        head = kv_head * group + g
        q_base = batch * stride_q_batch + head * stride_q_head
        mask_base = batch * stride_mask_batch + head * stride_mask_head
        row_base = (batch * num_heads + head) * L
        for start_m in range(lo, inner, BLOCK_M):
            acc += _dk_tile(
                Q, Mask, CoefLse2, CoefA, CoefB, k, cols, offs_d, start_m, q_base, mask_base,
                row_base, stride_q_seq, stride_q_dim, stride_mask_q, stride_mask_k, L, S, D,
                qk_scale, MASK_KIND, CAUSAL, PRECISION, UPCAST, ACC, BLOCK_M, True, False,
                MASK_ROWS,
            )  # fmt: skip
        for start_m in range(inner, full, BLOCK_M):
            acc += _dk_tile(
                Q, Mask, CoefLse2, CoefA, CoefB, k, cols, offs_d, start_m, q_base, mask_base,
                row_base, stride_q_seq, stride_q_dim, stride_mask_q, stride_mask_k, L, S, D,
                qk_scale, MASK_KIND, CAUSAL, PRECISION, UPCAST, ACC, BLOCK_M, False, True,
                MASK_ROWS,
            )  # fmt: skip
        for start_m in range(full, L, BLOCK_M):  # the last, partial query block
            acc += _dk_tile(
                Q, Mask, CoefLse2, CoefA, CoefB, k, cols, offs_d, start_m, q_base, mask_base,
                row_base, stride_q_seq, stride_q_dim, stride_mask_q, stride_mask_k, L, S, D,
                qk_scale, MASK_KIND, CAUSAL, PRECISION, UPCAST, ACC, BLOCK_M, False, False,
                MASK_ROWS,
            )  # fmt: skip
    dk_ptrs = DK + pid_bh.to(tl.int64) * S * D + cols[:, None].to(tl.int64) * D + offs_d[None, :]
    dk = (acc * scale).to(DK.dtype.element_ty)  # the input dtype: rounded once, here
    tl.store(dk_ptrs, dk, mask=(cols[:, None] < S) & (offs_d[None, :] < D))


@triton.jit
def _attention_kernel(
    Q,
    K,
    V,
    Mask,
    Beta,
    Out,
    stride_q_batch,
    stride_q_head,
    stride_q_seq,
    stride_q_dim,
    stride_k_batch,
    stride_k_head,
    stride_k_seq,
    stride_k_dim,
    stride_v_batch,
    stride_v_head,
    stride_v_seq,
    stride_v_dim,
    stride_mask_batch,
    stride_mask_head,
    stride_mask_q,
    stride_mask_k,
    stride_o_batch,
    stride_o_head,
    stride_o_seq,
    stride_o_dim,
    num_heads,
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
    MASK_ROWS: tl.constexpr = True,
):
    pid_m, pid_bh = _tile_and_head(tl.cdiv(L, BLOCK_M))
    qk_scale = scale * _LOG2E
    batch = (pid_bh // num_heads).to(tl.int64)
    head = (pid_bh % num_heads).to(tl.int64)
    rows = tl.arange(0, BLOCK_M)
    offs_m = pid_m * BLOCK_M + rows
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    rows64 = offs_m[:, None].to(tl.int64)
    q_base = batch * stride_q_batch + head * stride_q_head
    q = _load_block(Q, q_base, pid_m * BLOCK_M, rows, offs_d, stride_q_seq, stride_q_dim, L, D)
    beta = tl.load(Beta + pid_bh.to(tl.int64) * L + offs_m, mask=offs_m < L, other=1.0)
    k_base = batch * stride_k_batch + head * stride_k_head
    mask_base = batch * stride_mask_batch + head * stride_mask_head
    v_base = batch * stride_v_batch + head * stride_v_head
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    hi = S
    if CAUSAL:
        hi = tl.minimum(S, (pid_m + 1) * BLOCK_M)
    # beta scales the products with qk_scale, before any entry is set to -inf (whatever
    # beta's sign); an additive mask is scaled by beta too, so there it scales the sum
    tile_scale = qk_scale if MASK_KIND == _MASK_ADD else qk_scale * beta[:, None]
    for start_n in range(0, hi, BLOCK_N):
        y, _k = _logits(
            q, K, Mask, start_n, offs_m, offs_n, offs_d, k_base, mask_base,
            stride_k_seq, stride_k_dim, stride_mask_q, stride_mask_k,
            L, S, D, tile_scale, MASK_KIND, CAUSAL, PRECISION, UPCAST, tl.float32, True, True,
            MASK_ROWS,
        )  # fmt: skip
        if MASK_KIND == _MASK_ADD:
            y = tl.where(y == float("-inf"), y, beta[:, None] * y)  # base 2, as m_i
        m_new = tl.maximum(m_i, tl.max(y, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(y - m_safe[:, None])  # 0 where masked: m_safe is finite
        l_i = alpha * l_i + tl.sum(p, 1)
        v = _load_block(V, v_base, start_n, offs_n, offs_dv, stride_v_seq, stride_v_dim, S, DV)
        pv = p.to(v.dtype)
        if UPCAST:
            pv = pv.to(tl.float32)
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(pv, v, input_precision=PRECISION, out_dtype=tl.float32)
        m_i = m_new
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    o_ptrs = (
        Out
        + batch * stride_o_batch
        + head * stride_o_head
        + rows64 * stride_o_seq
        + offs_dv[None, :].to(tl.int64) * stride_o_dim
    )
    tl.store(
        o_ptrs, out.to(Out.dtype.element_ty), mask=(offs_m[:, None] < L) & (offs_dv[None, :] < DV)
    )


def _mask_args(mask: torch.Tensor | None, kind: int, q: torch.Tensor) -> tuple:
    if kind == MASK_NONE:
        return q, (0, 0, 0, 0)  # unused pointer
    assert mask is not None
    if kind == MASK_BOOL:
        mask = mask.view(torch.uint8)
    return mask, tuple(mask.stride())


def _mask_rows(mask: torch.Tensor | None, kind: int) -> bool:
    """False when the mask is one row per query head broadcast over the queries (stride 0).

    The kernels then load one value per key (``MASK_ROWS`` of :func:`_tile`).
    """
    return not (kind != MASK_NONE and mask is not None and mask.stride(-2) == 0)


def _mask_elem(mask: torch.Tensor | None, kind: int) -> int:
    return 0 if kind == MASK_NONE or mask is None else mask.element_size()


def _precision(q: torch.Tensor) -> dict[str, object]:
    """IEEE fp32 products for fp32 inputs (no TF32); bf16 upcast in the interpreter.

    The interpreter's ``tl.dot`` mishandles bfloat16 operands; products of
    bfloat16 numbers are exact in float32, so upcasting first computes the same
    logits (and ``p`` is still rounded to bfloat16 before the values product).
    """
    upcast = q.device.type != "cuda" and q.dtype == torch.bfloat16
    ieee = q.dtype in (torch.float32, torch.float64) or upcast
    return {"PRECISION": "ieee" if ieee else "tf32", "UPCAST": upcast}


def raw_products(scale: float, mask_kind: int, log2_bound: float) -> bool:
    r"""Whether pass 1 scales the raw products in its step (``RAW`` of :func:`_entropy_step`).

    It does for a positive scale without an additive mask, where the row
    maximum of :math:`c\,x_j` is :math:`c \max_j x_j`, and logits within
    :math:`2^{\mathrm{RAW\_LOG2\_BOUND}}` (`log2_bound` bounds
    :math:`\log_2 |x_{ij}|`): beyond it the rounding error of the scaled row
    maximum, which the step's differences keep, could overflow an
    exponential, and the kernel scales each product first.
    """
    return scale > 0 and mask_kind != MASK_ADD and log2_bound <= RAW_LOG2_BOUND


def _acc(q: torch.Tensor) -> tuple[torch.dtype, object]:
    """The statistics dtype of pass 1: float64 for float64 inputs (interpreter), else float32."""
    if q.dtype == torch.float64:
        return torch.float64, tl.float64
    return torch.float32, tl.float32


def triton_entropy(
    q: torch.Tensor,
    k: torch.Tensor,
    mask: torch.Tensor | None,
    mask_kind: int,
    is_causal: bool,
    scale: float,
    group: int = 1,
    candidates: dict[str, list[dict]] | None = None,
    log2_bound: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Pass 1: ``(entropy, lse)`` of every query row, shape (B, H, L).

    float32 (float64 for float64 inputs, which only the interpreter's tests
    send). `q` is (B, H, L, D), `k` (B, H // group, S, D) (expanded views
    allowed); `mask` is (B, H, L, S) (bool or the dtype of `q`, expanded views
    allowed) or None. `candidates` maps ``"_entropy_kernel"`` to the launch
    configurations to try instead of :func:`~._triton_config.configs`' (the
    benchmark's tile sweep). `log2_bound` bounds :math:`\log_2` of the
    logits' magnitude (plus any bias) and selects the kernel's variant
    (:func:`raw_products`); None reads it from `q` and `k` (one host sync,
    :func:`~._torch_attention.operands_log2_bound`).
    Raises :class:`~._triton_config.NoConfig` when no launch configuration
    fits the device.
    """
    B, H, L, D = q.shape
    S = k.shape[-2]
    acc, acc_tl = _acc(q)
    if log2_bound is None:
        from ._torch_attention import operands_log2_bound

        log2_bound = operands_log2_bound(q, k, scale)
    lse = torch.empty((B, H, L), dtype=acc, device=q.device)
    entropy = torch.empty_like(lse)
    scale_t = torch.full((1,), scale, dtype=acc, device=q.device)
    m_arg, m_strides = _mask_args(mask, mask_kind, q)
    cands = (candidates or {}).get("_entropy_kernel") or configs(
        q.device, D, 0, q.dtype, _mask_elem(mask, mask_kind), kernel="entropy_kernel",
        causal=bool(is_causal),
    )  # fmt: skip
    args = (
        q, k, m_arg, lse, entropy, *q.stride(), *k.stride(), *m_strides,
        H, group, L, S, D, scale_t,
    )  # fmt: skip
    constexprs = {
        "MASK_KIND": mask_kind, "CAUSAL": bool(is_causal), "ACC": acc_tl, **_precision(q),
        "RAW": raw_products(scale, mask_kind, log2_bound),
        "MASK_ROWS": _mask_rows(mask, mask_kind),
    }  # fmt: skip
    launch(
        _entropy_kernel,
        lambda cfg: tile_grid(triton.cdiv(L, cfg["BLOCK_M"]), B * H),
        args,
        constexprs,
        cands,
    )
    return entropy, lse


def triton_entropy_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    mask: torch.Tensor | None,
    mask_kind: int,
    is_causal: bool,
    scale: float,
    group: int,
    entropy: torch.Tensor,
    lse: torch.Tensor,
    grad_entropy: torch.Tensor,
    grad_lse: torch.Tensor,
    candidates: dict[str, list[dict]] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The backward of pass 1: ``(dq, dk)`` from the row gradients of ``(H, LSE)``.

    With :math:`p_{ij} = e^{x_{ij} - \mathrm{LSE}_i}` recomputed from the
    stored log-sum-exp (no values read, no :math:`L \times S` matrix kept),

    .. math::

        \bar x_{ij} = p_{ij}\bigl(\bar L_i - \bar H_i\,(x_{ij} - \mathrm{LSE}_i + H_i)\bigr),
        \quad
        \bar q_i = \mathrm{scale}\sum_j \bar x_{ij} k_j, \quad
        \bar k_j = \mathrm{scale}\sum_{h \in \mathrm{group}}\sum_i \bar x_{ij} q_i.

    One kernel per query block accumulates ``dq`` over the key blocks, one per
    key block accumulates ``dk`` over the query blocks of every query head of
    its group (grouped-query attention: the sum over the group, no repeated
    K). Causal blocks skip the fully masked tiles. The statistics `entropy`,
    `lse` and the gradients are (B, H, L); the results are accumulated in
    float32 (float64 for float64 inputs) and stored in the dtype of `q`, shapes
    of `q` and `k`: for 16-bit inputs no float32 gradient the size of `q` and
    `k` is allocated, and the one rounding is the kernel's (bfloat16 under
    Triton's interpreter, which truncates: float32, rounded by the caller).
    `candidates` maps ``"_entropy_bwd_dq_kernel"`` or ``"_entropy_bwd_dk_kernel"``
    to the launch configurations to try for that kernel (the benchmark's tile
    sweep). Raises :class:`~._triton_config.NoConfig` when no launch
    configuration fits.
    """
    B, H, L, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    acc, acc_tl = _acc(q)
    stats = [t.to(acc).contiguous() for t in (lse, entropy, grad_entropy, grad_lse)]
    # Triton's interpreter (the kernels on CPU tensors) rounds float32 to bfloat16 toward
    # zero, where a GPU's store rounds to nearest even as torch does: there the kernel
    # stores float32 and torch rounds, so both give the GPU's bits
    out = acc if q.dtype == torch.bfloat16 and q.device.type == "cpu" else q.dtype
    dq = torch.empty((B, H, L, D), dtype=out, device=q.device)
    dk = torch.empty((B, Hkv, S, D), dtype=out, device=q.device)
    scale_t = torch.full((1,), scale, dtype=acc, device=q.device)
    m_arg, m_strides = _mask_args(mask, mask_kind, q)
    elem = _mask_elem(mask, mask_kind)
    causal = bool(is_causal)
    cands_dq, cands_dk = (
        (candidates or {}).get(f"_{name}")
        or configs(q.device, D, 0, q.dtype, elem, backward=True, kernel=name, causal=causal)
        for name in ("entropy_bwd_dq_kernel", "entropy_bwd_dk_kernel")
    )
    constexprs = {
        "MASK_KIND": mask_kind, "CAUSAL": bool(is_causal), "ACC": acc_tl, **_precision(q),
        "MASK_ROWS": _mask_rows(mask, mask_kind),
    }  # fmt: skip
    common = (*q.stride(), *k.stride(), *m_strides, H, group, L, S, D)
    # the rows' coefficients, formed by the dq kernel and read by the dk kernel after it
    coef = torch.empty((3, B * H * L), dtype=acc, device=q.device)
    launch(
        _entropy_bwd_dq_kernel,
        lambda cfg: tile_grid(triton.cdiv(L, cfg["BLOCK_M"]), B * H),
        (q, k, m_arg, scale_t, *stats, dq, *coef, *common),
        constexprs,
        cands_dq,
    )
    launch(
        _entropy_bwd_dk_kernel,
        lambda cfg: tile_grid(triton.cdiv(S, cfg["BLOCK_N"]), B * Hkv),
        (q, k, m_arg, scale_t, *coef, dk, *common),
        constexprs,
        cands_dk,
    )
    return dq, dk


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
    """Pass 2: attention on the logits ``beta_i * x_ij``; `beta` is float32 (B, H, L).

    Raises :class:`~._triton_config.NoConfig` when no launch configuration
    fits the device.
    """
    B, H, L, D = q.shape
    S, DV = v.shape[-2:]
    out = torch.empty((B, H, L, DV), dtype=q.dtype, device=q.device)
    beta = beta.to(torch.float32).contiguous()
    m_arg, m_strides = _mask_args(mask, mask_kind, q)
    cands = configs(q.device, D, DV, q.dtype, _mask_elem(mask, mask_kind),
                    kernel="attention_kernel", causal=bool(is_causal))  # fmt: skip
    args = (
        q, k, v, m_arg, beta, out,
        *q.stride(), *k.stride(), *v.stride(), *m_strides, *out.stride(),
        H, L, S, D, DV, float(scale),
    )  # fmt: skip
    constexprs = {
        "MASK_KIND": mask_kind, "CAUSAL": bool(is_causal), **_precision(q),
        "MASK_ROWS": _mask_rows(mask, mask_kind),
    }  # fmt: skip
    launch(
        _attention_kernel,
        lambda cfg: tile_grid(triton.cdiv(L, cfg["BLOCK_M"]), B * H),
        args,
        constexprs,
        cands,
    )
    return out
