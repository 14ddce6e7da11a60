"""Kernels for the conformance suite's own tests: correct ones and a catalogue of defects.

Each broken kernel reproduces one defect class, a realistic mistake: the port
errors found in public adaptive-softmax implementations (coefficients in
ascending powers, the polynomial read as a temperature, β silently 1 on masked
rows, the 1e-9 guard vanishing in float16, Horner's rule in 16 bits, clamped
logits, float64 paths that are only float32-accurate, float16 statistics, -inf
replaced by -1e4) and classic softmax bugs. :data:`CATALOGUE` lists them with
the options they are checked under; tests/test_conformance_broken.py checks
that the default run catches each one (the mutation score of the docs) and
that the correct kernels, :data:`CORRECT`, raise no false alarm.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from softmaxtheory.spec import (
    PAPER_ENTROPY_EPS,
    Constant,
    PaperPolynomial,
    Polynomial,
    resolve_schedule,
)

PAPER = np.array([-0.037, 0.481, -2.3, 4.917, -1.791])


def _work(x):
    x = np.asarray(x)
    return x.astype(np.float32) if x.dtype == np.float16 else x


def _softmax(w):
    with np.errstate(invalid="ignore", under="ignore"):
        m = np.max(w, axis=-1, keepdims=True, initial=-np.inf)
        m = np.where(m == -np.inf, 0, m)
        e = np.exp(w - m)
        s = np.sum(e, axis=-1, keepdims=True)
        return np.where(s == 0, 0, e / np.where(s == 0, 1, s))


def _entropy(w, eps=0.0):
    p = _softmax(w)
    t = w.dtype.type
    with np.errstate(divide="ignore", invalid="ignore"):
        if eps:
            terms = -p * np.log(p + t(eps))
        else:
            terms = np.where(p > 0, -p * np.log(np.where(p > 0, p, 1)), np.where(p == 0, 0, p))
    return np.sum(terms, axis=-1)


# -- correct kernels ----------------------------------------------------------


def softmax(x):
    """A correct softmax (numpy, float16 computed in float32)."""
    x = np.asarray(x)
    return _softmax(_work(x)).astype(x.dtype)


def entropy(x):
    """A correct entropy (nats)."""
    x = np.asarray(x)
    return _entropy(_work(x)).astype(x.dtype)


def entropy_guarded(x):
    """The paper's guarded entropy, -sum p log(p + 1e-9), computed in float32 for float16."""
    x = np.asarray(x)
    return _entropy(_work(x), PAPER_ENTROPY_EPS).astype(x.dtype)


def _beta(H, n_eff, schedule, dtype):
    return schedule.beta_float(H, n_eff).astype(dtype)


def adaptive_softmax(x, *, schedule=None, entropy_eps=0.0, _count_masked=False):
    """A correct adaptive softmax following the spec (max subtracted, then scaled)."""
    x = np.asarray(x)
    w = _work(x)
    schedule = resolve_schedule(schedule)
    H = _entropy(w, entropy_eps)
    n_eff = np.full(w.shape[:-1], w.shape[-1]) if _count_masked else np.sum(w > -np.inf, axis=-1)
    b = _beta(H, n_eff, schedule, w.dtype)
    with np.errstate(invalid="ignore"):
        m = np.max(w, axis=-1, keepdims=True, initial=-np.inf)
        z = w - np.where(m == -np.inf, 0, m)
        # masked items stay masked at beta = 0 (LogLength with one item left): 0 * -inf
        bz = np.where(np.isneginf(z), -np.inf, b[..., None] * z)
    return _softmax(bz).astype(x.dtype)


def adaptive_softmax_listing(x):
    """The paper's listing, softmax(beta * x), with its 1e-9 guard, the maximum subtracted first.

    Correct with ``entropy_eps=1e-9``: scaling the shifted logits, ``beta * (x - m)``,
    keeps them finite; the listing as printed, which scales ``x`` itself, is
    :func:`listing_scaling_first` (NaN once ``|x| > max / beta``).
    """
    x = np.asarray(x)
    w = _work(x)
    H = _entropy(w, PAPER_ENTROPY_EPS)
    P = np.polyval(PAPER.astype(w.dtype), H)
    b = np.where(H > 0.5, np.maximum(P, 1), 1).astype(w.dtype)
    with np.errstate(invalid="ignore"):
        m = np.max(w, axis=-1, keepdims=True, initial=-np.inf)
        z = w - np.where(m == -np.inf, 0, m)
    return _softmax(b[..., None] * z).astype(x.dtype)


def listing_scaling_first(x):
    """Defect: the paper's listing as printed, softmax(beta * x): beta * x overflows.

    The softmax subtracts the maximum of the scaled logits, but ``beta * x`` is
    formed first: past ``max / beta`` (7.4e307 in float64 at beta = 2.42) it is
    ``inf``, and ``inf - inf`` makes the row NaN where every logit is finite.
    """
    x = np.asarray(x)
    w = _work(x)
    H = _entropy(w, PAPER_ENTROPY_EPS)
    P = np.polyval(PAPER.astype(w.dtype), H)
    b = np.where(H > 0.5, np.maximum(P, 1), 1).astype(w.dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        return _softmax(b[..., None] * w).astype(x.dtype)


def _apply_mask(logits, mask, is_causal):
    """The logits with a causal mask, a boolean mask (True attends) or an additive one."""
    if is_causal:
        logits = np.where(np.tril(np.ones(logits.shape[-2:], bool)), logits, -np.inf)
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype == bool:
            logits = np.where(mask, logits, -np.inf)
        else:
            logits = logits + mask.astype(logits.dtype)
    return logits


def attention(q, k, v, mask=None, is_causal=False, schedule=None, _count_masked=False):
    """A correct adaptive attention (the paper's schedule by default), numpy; masks boolean
    or additive."""
    q, k, v = (np.asarray(a) for a in (q, k, v))
    dt = q.dtype
    q, k, v = _work(q), _work(k), _work(v)
    logits = (q @ np.swapaxes(k, -1, -2)) * q.dtype.type(1 / np.sqrt(q.shape[-1]))
    a = adaptive_softmax(
        _apply_mask(logits, mask, is_causal), schedule=schedule, _count_masked=_count_masked
    )
    return (a @ v).astype(dt)


def softmax_attention(q, k, v, mask=None, is_causal=False):
    """Plain attention (schedule constant:1)."""
    q, k, v = (np.asarray(a) for a in (q, k, v))
    logits = (q @ np.swapaxes(k, -1, -2)) / np.sqrt(q.shape[-1]).astype(q.dtype)
    return (softmax(_apply_mask(logits, mask, is_causal)) @ v).astype(q.dtype)


# -- broken kernels -------------------------------------------------------------


def _adaptive_with_beta(x, beta_fn):
    x = np.asarray(x)
    w = _work(x)
    H = _entropy(w)
    b = beta_fn(H, w).astype(w.dtype)
    with np.errstate(invalid="ignore"):
        m = np.max(w, axis=-1, keepdims=True, initial=-np.inf)
        z = w - np.where(m == -np.inf, 0, m)
    return _softmax(b[..., None] * z).astype(x.dtype)


def reversed_coefficients(x):
    """Defect: the polynomial's coefficients evaluated in ascending order."""

    def beta(H, w):
        P = np.polyval(PAPER[::-1], H)
        return np.where(H > 0.5, np.maximum(P, 1), 1)

    return _adaptive_with_beta(x, beta)


def polynomial_as_temperature(x):
    """Defect: P(H) read as a temperature theta and divided by (beta = 1/theta)."""

    def beta(H, w):
        P = np.polyval(PAPER, H)
        return 1 / np.where(H > 0.5, np.maximum(P, 1), 1)

    return _adaptive_with_beta(x, beta)


def batch_global_entropy(x):
    """Defect: one entropy over the whole batch instead of one per row."""

    def beta(H, w):
        Hg = np.full_like(H, np.mean(H)) if H.size else H
        P = np.polyval(PAPER, Hg)
        return np.where(Hg > 0.5, np.maximum(P, 1), 1)

    return _adaptive_with_beta(x, beta)


def beta_below_one(x):
    """Defect: beta = P(H) above the threshold, without max(P, 1)."""

    def beta(H, w):
        P = np.polyval(PAPER, H)
        return np.where(H > 0.5, np.maximum(P, 1e-3), 1)

    return _adaptive_with_beta(x, beta)


def threshold_ignored(x, *, schedule=None):
    """Defect: beta = max(P(H), 1) at every entropy (the threshold is dropped)."""
    schedule = resolve_schedule(schedule)

    def beta(H, w):
        if hasattr(schedule, "coefficients"):
            c = np.array([float(v) for v in schedule.exact_coefficients])
            return np.maximum(np.polyval(c, H), 1)
        return schedule.beta_float(H, np.sum(w > -np.inf, axis=-1))

    return _adaptive_with_beta(x, beta)


def fp16_guard_vanishing(x):
    """Defect: the paper's entropy computed in float16, where the 1e-9 guard rounds to 0."""
    x = np.asarray(x)
    p = _softmax(x.astype(np.float32)).astype(x.dtype)
    with np.errstate(divide="ignore", invalid="ignore"):
        H = -np.sum(p * np.log(p + x.dtype.type(PAPER_ENTROPY_EPS)), axis=-1)
    return H.astype(x.dtype)


def no_max_subtraction(x):
    """Defect: exp(x) / sum(exp(x)) without subtracting the max (overflow, 0/0)."""
    x = np.asarray(x)
    w = _work(x)
    with np.errstate(all="ignore"):
        e = np.exp(w)
        return (e / np.sum(e, axis=-1, keepdims=True)).astype(x.dtype)


def entropy_log2(x):
    """Defect: entropy in bits (log base 2) instead of nats."""
    x = np.asarray(x)
    return (_entropy(_work(x)) / np.log(2)).astype(x.dtype)


def adaptive_log2_entropy(x):
    """Defect: adaptive softmax whose schedule reads the entropy in bits."""

    def beta(H, w):
        Hb = H / np.log(2)
        P = np.polyval(PAPER, Hb)
        return np.where(Hb > 0.5, np.maximum(P, 1), 1)

    return _adaptive_with_beta(x, beta)


def beta_one_near_the_kinks(x):
    """Defect: beta taken as 1 while P(H) < 1 + 1e-4, a "fast path" skipping the rescaling.

    Off by about 5e-4 relative for entropies within 5e-5 of H_on and of H_off, and
    right everywhere else.
    """

    def beta(H, w):
        P = np.polyval(PAPER, H)
        return np.where((H > 0.5) & (P >= 1 + 1e-4), np.maximum(P, 1), 1)

    return _adaptive_with_beta(x, beta)


def sharper_just_below_h_off(x):
    """Defect: beta 0.1 % too large for entropies in (5.90, 5.944), just below H_off = 5.9445."""

    def beta(H, w):
        P = np.polyval(PAPER, H)
        b = np.where(H > 0.5, np.maximum(P, 1), 1)
        return np.where((H > 5.90) & (H < 5.944), b * 1.001, b)

    return _adaptive_with_beta(x, beta)


def terms_below_e100_dropped(x):
    """Defect: the exponentials of shifts below -100 taken as 0 (weights of 3.7e-44 and less)."""
    x = np.asarray(x)
    w = _work(x)
    with np.errstate(invalid="ignore", under="ignore"):
        m = np.max(w, axis=-1, keepdims=True, initial=-np.inf)
        z = w - np.where(m == -np.inf, 0, m)
        e = np.where(z < -100, 0, np.exp(z))
        s = np.sum(e, axis=-1, keepdims=True)
        return np.where(s == 0, 0, e / np.where(s == 0, 1, s)).astype(x.dtype)


def wrong_at_powers_of_two(x):
    """Defect: rows of exactly 256, 512, 1024 or 2048 items take a path whose last item is
    scaled by 1.5 (a ``<`` written for ``<=`` where the kernel switches block sizes)."""
    x = np.asarray(x)
    out = _softmax(_work(x))
    if x.shape[-1] in (256, 512, 1024, 2048):
        out = out.copy()
        out[..., -1] *= 1.5
    return out.astype(x.dtype)


def online_without_rescaling(x):
    """Defect: an online (blockwise) softmax that forgets to rescale its running sum.

    When a later block raises the running maximum from m to m', the sum so far must be
    multiplied by exp(m - m'); without it, rows whose maximum is not in the first block
    are normalised by too large a sum.
    """
    x = np.asarray(x)
    w = _work(x)
    m = np.full((*w.shape[:-1], 1), -np.inf, dtype=w.dtype)
    s = np.zeros((*w.shape[:-1], 1), dtype=w.dtype)
    with np.errstate(invalid="ignore", under="ignore"):
        for start in range(0, w.shape[-1], 4):  # blocks of 4 items
            block = w[..., start : start + 4]
            m_new = np.maximum(m, np.max(block, axis=-1, keepdims=True))
            shift = np.where(m_new == -np.inf, 0, m_new)
            s = s + np.sum(np.exp(block - shift), axis=-1, keepdims=True)  # s not rescaled
            m = m_new
        e = np.exp(w - np.where(m == -np.inf, 0, m))
        return np.where(s > 0, e / np.where(s > 0, s, 1), 0).astype(x.dtype)


def float32_accumulation(x):
    """Defect: a float64 softmax whose normaliser is accumulated in float32."""
    x = np.asarray(x)
    with np.errstate(invalid="ignore", under="ignore"):
        m = np.max(x, axis=-1, keepdims=True, initial=-np.inf)
        e = np.exp(x - np.where(m == -np.inf, 0, m))
        s = np.cumsum(e.astype(np.float32), axis=-1)[..., -1:].astype(x.dtype)
        return np.where(s > 0, e / np.where(s > 0, s, 1), 0).astype(x.dtype)


def half_accumulation(x):
    """Defect: a float16 softmax that accumulates its sum in float16 (sequentially)."""
    x = np.asarray(x)
    w = _work(x)
    with np.errstate(invalid="ignore", under="ignore"):
        m = np.max(w, axis=-1, keepdims=True, initial=-np.inf)
        e = np.exp(w - np.where(m == -np.inf, 0, m)).astype(x.dtype)
        s = np.cumsum(e, axis=-1, dtype=x.dtype)[..., -1:]
        return np.where(s > 0, e / np.where(s > 0, s, 1), 0).astype(x.dtype)


def float32_result(x):
    """Defect: a float64 kernel that computes and returns float32."""
    x = np.asarray(x)
    return _softmax(x.astype(np.float32))


def masked_nan_entropy(x):
    """Defect: -sum p log p with p = 0 at masked items: 0 * (-inf) = NaN, so beta is silently 1."""
    x = np.asarray(x)
    w = _work(x)
    p = _softmax(w)
    with np.errstate(divide="ignore", invalid="ignore"):
        H = -np.sum(p * np.log(p), axis=-1)  # NaN on every row with a masked item
    P = np.polyval(PAPER.astype(w.dtype), H)
    b = np.where(H > 0.5, np.maximum(P, 1), 1).astype(w.dtype)  # NaN > 0.5 is False
    with np.errstate(invalid="ignore"):
        m = np.max(w, axis=-1, keepdims=True, initial=-np.inf)
        z = w - np.where(m == -np.inf, 0, m)
    return _softmax(b[..., None] * z).astype(x.dtype)


def clamped_logits(x):
    """Defect: the logits clamped to [-50, 50] "for stability" before the softmax."""
    x = np.asarray(x)
    with np.errstate(invalid="ignore"):
        w = np.where(x == -np.inf, x, np.clip(_work(x), -50, 50))
    return _softmax(w).astype(x.dtype)


def lowest_float_as_mask(x):
    """Defect: the lowest finite float read as a mask (-inf), as Hugging Face-style
    additive masks write one: a row of tied items there answers NaN, not uniform."""
    x = np.asarray(x)
    return softmax(np.where(x == np.finfo(x.dtype).min, -np.inf, x))


def below_half_the_lowest_float_as_mask(x):
    """Defect: every item at or below half the lowest finite float read as a mask."""
    x = np.asarray(x)
    return softmax(np.where(x <= np.finfo(x.dtype).min / 2, -np.inf, x))


def refuses_negative_and_zero_strides(x):
    """Defect: a kernel (a C extension's wrapper) that refuses views of negative or zero
    strides, which numpy hands it for ``x[::-1]`` and ``np.broadcast_to``."""
    x = np.asarray(x)
    if any(st <= 0 for st, n in zip(x.strides, x.shape, strict=True) if n > 1):
        raise ValueError("negative or zero strides are not supported")
    return softmax(x)


def rows_reversed_under_a_negative_stride(x):
    """Defect: the row stride taken as unsigned: rows of ``x[::-1]`` come back in the order
    of the buffer (the reverse of the view's)."""
    x = np.asarray(x)
    out = softmax(np.ascontiguousarray(x))
    if x.ndim >= 2 and x.strides[-2] < 0:
        out = out[..., ::-1, :].copy()
    return out


def mask_as_minus_1e4(x):
    """Defect: -inf replaced by -1e4 (a "finite mask"), then a correct softmax."""
    x = np.asarray(x)
    w = np.where(x == -np.inf, -1e4, _work(x)).astype(_work(x).dtype)
    return _softmax(w).astype(x.dtype)


def float32_internal(x):
    """Defect: a float64 softmax computed in float32 and returned as float64."""
    x = np.asarray(x)
    return _softmax(x.astype(np.float32)).astype(x.dtype)


def entropy_without_normaliser(x):
    """Defect: H = -sum p (x - max x), the log of the normaliser forgotten."""
    x = np.asarray(x)
    w = _work(x)
    p = _softmax(w)
    with np.errstate(invalid="ignore"):
        m = np.max(w, axis=-1, keepdims=True, initial=-np.inf)
        z = np.where(p > 0, w - np.where(m == -np.inf, 0, m), 0)
    return (-np.sum(p * z, axis=-1)).astype(x.dtype)


def wrong_axis(x):
    """Defect: the softmax taken along the first axis instead of the last."""
    x = np.asarray(x)
    return _softmax(np.swapaxes(_work(x), 0, -1)).swapaxes(0, -1).astype(x.dtype)


def epsilon_in_denominator(x):
    """Defect: e / (sum e + 1e-12), a "safe" division that biases every coefficient."""
    x = np.asarray(x)
    w = _work(x)
    with np.errstate(invalid="ignore", under="ignore"):
        m = np.max(w, axis=-1, keepdims=True, initial=-np.inf)
        e = np.exp(w - np.where(m == -np.inf, 0, m))
        return (e / (np.sum(e, axis=-1, keepdims=True) + 1e-12)).astype(x.dtype)


def _beta32(H):
    P = np.polyval(PAPER.astype(np.float32), H.astype(np.float32))
    return np.where(H > 0.5, np.maximum(P, 1), 1).astype(np.float32)


def float16_statistics(x):
    """Defect: the normaliser and the entropy accumulated in float16 (a 16-bit kernel's stats)."""
    x = np.asarray(x)
    w = x.astype(np.float16)
    with np.errstate(all="ignore"):
        m = np.max(w, axis=-1, keepdims=True, initial=-np.inf)
        e = np.exp(w - np.where(m == -np.inf, 0, m).astype(np.float16))
        s = np.cumsum(e, axis=-1, dtype=np.float16)[..., -1:] if w.shape[-1] else e
        p = np.where(s > 0, e / np.where(s > 0, s, 1), 0).astype(np.float16)
        terms = np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0).astype(np.float16)
        H = -np.cumsum(terms, axis=-1, dtype=np.float16)[..., -1] if w.shape[-1] else m[..., 0]
        w32 = x.astype(np.float32)
        m32 = np.max(w32, axis=-1, keepdims=True, initial=-np.inf)
        z = w32 - np.where(m32 == -np.inf, 0, m32)
    return _softmax(_beta32(H)[..., None] * z).astype(x.dtype)


def horner_float16(x):
    """Defect: beta by Horner's rule in float16 (entropy exact in float32)."""
    x = np.asarray(x)
    w = x.astype(np.float32)
    H = _entropy(w).astype(np.float16)
    P = np.zeros_like(H)
    with np.errstate(all="ignore"):
        for c in PAPER.astype(np.float16):
            P = P * H + c
    b = np.where(H > np.float16(0.5), np.maximum(P, np.float16(1)), np.float16(1))
    with np.errstate(invalid="ignore"):
        m = np.max(w, axis=-1, keepdims=True, initial=-np.inf)
        z = w - np.where(m == -np.inf, 0, m)
    return _softmax(b.astype(np.float32)[..., None] * z).astype(x.dtype)


def listing_native_16bit(x, *, shift=True):
    """Correct under the default 16-bit contract: beta in float32, beta (x - m) rounded once.

    The paper's listing run natively in float16, the maximum subtracted first: the
    softmax of the once-rounded scaled logits (backward stable at float16's precision);
    strict rejects it. Without `shift` (:func:`listing_native_16bit_unshifted`) it
    rounds ``beta * x`` itself, which overflows float16 once ``|x| > 65504 / beta``.
    """
    x = np.asarray(x)
    w = _work(x)
    b = _beta32(_entropy(w.astype(np.float32)))
    with np.errstate(invalid="ignore", over="ignore"):
        w = w.astype(np.float32)
        if shift:
            m = np.max(w, axis=-1, keepdims=True, initial=-np.inf)
            w = w - np.where(m == -np.inf, 0, m)
        scaled = (b[..., None] * w).astype(x.dtype)  # the one rounding
    return _softmax(scaled.astype(np.float32)).astype(x.dtype)


def listing_native_16bit_unshifted(x):
    """Defect: the listing natively in float16, beta * x rounded to float16: it overflows.

    100 tied logits at 0.5 of float16's largest value (entropy log 100, beta 2.41)
    scale to 79,000: ``inf`` in float16, and the row is NaN.
    """
    return listing_native_16bit(x, shift=False)


def torch_listing_native_16bit(x, *, shift=True):
    """The same in torch: beta in float32, beta (x - m) rounded once to the input dtype."""
    import torch

    xf = x.float()
    p = torch.softmax(xf, dim=-1)
    H = -(p * torch.log(p)).nan_to_num(nan=0.0).sum(dim=-1, keepdim=True)
    P = torch.zeros_like(H)
    for c in PAPER:
        P = P * H + float(c)
    beta = torch.where(H > 0.5, torch.clamp(P, min=1.0), torch.ones_like(H))
    if shift:
        m = xf.amax(-1, keepdim=True)
        xf = xf - torch.where(m == -torch.inf, 0.0, m)
    scaled = (beta * xf).to(x.dtype)  # the one rounding
    out = torch.softmax(scaled.float(), dim=-1)
    return torch.where(torch.isneginf(x.float()).all(-1, keepdim=True), 0.0, out).to(x.dtype)


def torch_listing_native_16bit_unshifted(x):
    """Defect: the listing natively in bfloat16 (torch), beta * x rounded: it overflows."""
    return torch_listing_native_16bit(x, shift=False)


def torch_horner_bfloat16(x):
    """Defect: beta by Horner's rule in bfloat16 (the entropy in float32)."""
    import torch

    xf = x.float()
    p = torch.softmax(xf, dim=-1)
    H = -(p * torch.log(p)).nan_to_num(nan=0.0).sum(dim=-1, keepdim=True)
    Hb = H.to(torch.bfloat16)
    P = torch.zeros_like(Hb)
    for c in PAPER:
        P = P * Hb + float(c)  # every step rounded to bfloat16
    beta = torch.where(Hb > 0.5, torch.clamp(P, min=1.0), torch.ones_like(Hb)).float()
    out = torch.softmax(beta * xf, dim=-1)
    return torch.where(torch.isneginf(xf).all(-1, keepdim=True), 0.0, out).to(x.dtype)


def attention_ignores_causal(q, k, v, mask=None, is_causal=False):
    """Defect: an adaptive attention that accepts is_causal= and ignores it."""
    return attention(q, k, v, mask=mask)


def attention_ignores_mask(q, k, v, mask=None, is_causal=False):
    """Defect: an adaptive attention that accepts mask= and ignores it."""
    return attention(q, k, v, is_causal=is_causal)


def attention_assuming_contiguous(q, k, v, mask=None, is_causal=False):
    """Defect: reads each operand's memory as C-contiguous, as a kernel handed only a
    pointer does (a view with other strides is read wrongly; the suite's views stay
    within their buffers)."""
    ops = []
    for a in (q, k, v):
        a = np.asarray(a)
        step = np.cumprod((*a.shape[1:], 1)[::-1])[::-1] * a.itemsize
        ops.append(np.lib.stride_tricks.as_strided(a, a.shape, tuple(int(s) for s in step)))
    return attention(*ops, mask=mask, is_causal=is_causal)


def torch_attention_assuming_contiguous(q, k, v, attn_mask=None, is_causal=False):
    """Defect: the same in torch: each operand's storage read with C-contiguous strides."""
    import torch

    from softmaxtheory.accelerated.torch import adaptive_attention

    ops = [torch.as_strided(a, a.shape, torch.empty(a.shape).stride(), a.storage_offset())
           for a in (q, k, v)]  # fmt: skip
    return adaptive_attention(*ops, attn_mask=attn_mask, is_causal=is_causal)


def attention_masking_before_scale(q, k, v, mask=None, is_causal=False, scale=None):
    """Defect: masks the products with -inf, then scales them (0 * -inf is NaN, and a
    negative scale turns -inf into +inf), as a kernel assuming a positive scale does."""
    q, k, v = (np.asarray(a) for a in (q, k, v))
    dt = q.dtype
    q, k, v = _work(q), _work(k), _work(v)
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    dots = q @ np.swapaxes(k, -1, -2)
    L, S = dots.shape[-2:]
    keep = np.tril(np.ones((L, S), bool)) if is_causal else np.ones((L, S), bool)
    if mask is not None:
        keep = keep & np.asarray(mask, bool)
    with np.errstate(invalid="ignore"):
        logits = np.where(keep, dots, -np.inf) * q.dtype.type(scale)
    return (adaptive_softmax(logits) @ v).astype(dt)


def attention_causal_bottom_right(q, k, v, mask=None, is_causal=False):
    """Defect: the causal mask aligned to the bottom right when L != S (query i attends keys
    j <= i + S - L, FlashAttention's convention) where the spec aligns it to the top left."""
    q = np.asarray(q)
    if not is_causal:
        return attention(q, k, v, mask=mask)
    L, S = q.shape[-2], np.asarray(k).shape[-2]
    keep = np.tril(np.ones((L, S), bool), k=S - L)
    if mask is not None:
        keep = keep & np.asarray(mask, bool)
    return attention(q, k, v, mask=keep)


def attention_first_mask_for_every_entry(q, k, v, mask=None, is_causal=False):
    """Defect: a mask with batch dimensions read at batch entry 0 for every entry (right for
    a 2-d mask, wrong for a key-padding mask of shape (B, 1, S))."""
    if mask is not None:
        mask = np.asarray(mask)
        mask = mask.reshape(-1, *mask.shape[-2:])[0]
    return attention(q, k, v, mask=mask, is_causal=is_causal)


def attention_additive_mask_as_boolean(q, k, v, mask=None, is_causal=False):
    """Defect: a float mask read as a boolean one (nonzero attends), where it is added to
    the logits: its 0 entries remove keys and its -inf entries keep them."""
    if mask is not None:
        mask = np.asarray(mask).astype(bool)
    return attention(q, k, v, mask=mask, is_causal=is_causal)


#: The block of the blocked kernels below (items of a row, keys of attention).
TAIL_BLOCK = 128


def _blocked_state(w, lo_hi, tail_unscaled):
    """The running (max, sum) of a 1-d row over blocks; the last, partial block's sum is
    left at its own max when `tail_unscaled` (the defect)."""
    m, s = -np.inf, 0.0
    for lo, hi in lo_hi:
        blk = w[lo:hi]
        partial = hi - lo < TAIL_BLOCK
        m_blk = blk.max()
        if partial and tail_unscaled and m > -np.inf:
            s = s + np.sum(np.exp(blk - m_blk))
            continue
        m2 = max(m, m_blk)
        s = s * np.exp(m - m2) + np.sum(np.exp(blk - m2))
        m = m2
    return m, s


def _blocks(n):
    return [(lo, min(lo + TAIL_BLOCK, n)) for lo in range(0, n, TAIL_BLOCK)]


def online_tail_unscaled(x):
    """Defect: an online softmax in blocks of 128 items whose last, partial block is summed
    against its own max, not rescaled to the running one (rows of whole blocks are right)."""
    x = np.asarray(x)
    w = _work(x)
    flat = w.reshape(-1, w.shape[-1])
    out = np.empty_like(flat)
    for r, row in enumerate(flat):
        if not np.all(np.isfinite(row)):
            out[r] = _softmax(row)  # the special values as the correct kernel gives them
            continue
        m, s = _blocked_state(row, _blocks(row.size), tail_unscaled=True)
        out[r] = np.exp(row - m) / s
    return out.reshape(x.shape).astype(x.dtype)


def attention_tail_unscaled(q, k, v, mask=None, is_causal=False):
    """Defect: an adaptive attention over key blocks of 128 whose last, partial block's
    normaliser is summed against its own max (the same slip, in the key loop)."""
    q, k, v = (np.asarray(a) for a in (q, k, v))
    dt = q.dtype
    q, k, v = _work(q), _work(k), _work(v)
    logits = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    S = logits.shape[-1]
    if mask is not None or is_causal or S <= TAIL_BLOCK or not np.all(np.isfinite(logits)):
        return attention(q, k, v, mask=mask, is_causal=is_causal).astype(dt)
    flat = logits.reshape(-1, S)
    probs = np.empty_like(flat)
    for r, row in enumerate(flat):
        H = _entropy(row[None, :])[0]
        beta = float(_beta(np.array([H]), np.array([S]), resolve_schedule(None), np.float64)[0])
        z = beta * row
        m, s = _blocked_state(z, _blocks(S), tail_unscaled=True)
        probs[r] = np.exp(z - m) / s
    return (probs.reshape(logits.shape) @ v).astype(dt)


#: The block of the split kernels below.
SPLIT_BLOCK = 64


def _split_softmax(row, block=SPLIT_BLOCK):
    """Softmax of a 1-d row from each block's (max, sum), merged by ``exp(m_block - m)``:
    a fully masked block has ``m_block = -inf`` and gives ``exp(-inf - (-inf))``, NaN (the
    defect). Rows of special values are left to the correct softmax."""
    if not np.any(row > -np.inf) or np.any(np.isnan(row)) or np.any(np.isposinf(row)):
        return _softmax(row)
    starts = range(0, row.size, block)
    maxima = [row[lo : lo + block].max() for lo in starts]
    m = max(maxima)
    with np.errstate(invalid="ignore"):
        s = sum(np.sum(np.exp(row[lo : lo + block] - mb)) * np.exp(mb - m)
                for lo, mb in zip(starts, maxima, strict=True))  # fmt: skip
        return np.exp(row - m) / s


def split_softmax_nan_on_masked_block(x, block=SPLIT_BLOCK):
    """Defect: a split softmax over blocks of 64 items (each block's max and sum, then
    merged) that gives NaN rows when a whole block is masked, as padding does."""
    x = np.asarray(x)
    w = _work(x)
    flat = w.reshape(-1, w.shape[-1])
    out = np.empty_like(flat)
    for r, row in enumerate(flat):
        out[r] = _split_softmax(row, block)
    return out.reshape(x.shape).astype(x.dtype)


def split_softmax_8192_nan_on_masked_block(x):
    """Defect: the same over blocks of 8192 items: only rows padded over 8192 items or more
    give NaN (padding of up to 3072 in 4099 items fills no such block)."""
    return split_softmax_nan_on_masked_block(x, block=8192)


def attention_nan_on_masked_key_block(q, k, v, mask=None, is_causal=False, block=SPLIT_BLOCK):
    """Defect: an adaptive attention whose normaliser is split over key blocks of 64 the same
    way: NaN rows where a whole block of keys is masked (key padding, causal rows)."""
    q, k, v = (np.asarray(a) for a in (q, k, v))
    dt = q.dtype
    q, k, v = _work(q), _work(k), _work(v)
    logits = (q @ np.swapaxes(k, -1, -2)) * q.dtype.type(1 / np.sqrt(q.shape[-1]))
    logits = _apply_mask(logits, mask, is_causal)
    H = _entropy(logits)
    b = _beta(H, np.sum(logits > -np.inf, axis=-1), resolve_schedule(None), logits.dtype)
    with np.errstate(invalid="ignore"):
        m = np.max(logits, axis=-1, keepdims=True, initial=-np.inf)
        z = b[..., None] * (logits - np.where(m == -np.inf, 0, m))
    flat = z.reshape(-1, z.shape[-1])
    probs = np.stack([_split_softmax(row, block) for row in flat]) if flat.size else flat
    return (probs.reshape(z.shape) @ v).astype(dt)


def attention_nan_on_masked_key_chunk_1024(q, k, v, mask=None, is_causal=False):
    """Defect: the same over key chunks of 1024 (memory-efficient attention's chunking):
    every key of a sequence of at most 1024 lies in one chunk, so only longer padded
    sequences give NaN."""
    return attention_nan_on_masked_key_block(q, k, v, mask, is_causal, block=1024)


def loglength_counting_masked(x, *, schedule=None):
    """Defect: the schedule given the row's length, where LogLength's n_eff counts the
    unmasked items (right on rows without masks)."""
    return adaptive_softmax(x, schedule=schedule, _count_masked=True)


def attention_loglength_counting_masked(q, k, v, mask=None, is_causal=False, schedule=None):
    """Defect: the same in attention: LogLength given the number of keys, masked ones too."""
    return attention(q, k, v, mask=mask, is_causal=is_causal, schedule=schedule,
                     _count_masked=True)  # fmt: skip


_CALLS = [0]


def every_fifth_call_reversed(x):
    """Defect: right, except that every fifth call returns its rows reversed (a result that
    changes from call to call, as a race does)."""
    _CALLS[0] += 1
    y = softmax(x)
    return y[..., ::-1].copy() if _CALLS[0] % 5 == 0 else y


#: Rows (or attention's (batch, head) slices) given to each program of the grouped kernels.
GROUP = 8


def softmax_grouped_rows(x):
    """Defect: rows computed GROUP to a program on a grid of ``rows // GROUP`` programs (at
    least 1), the count rounded down: with more than GROUP rows, the rows of a partial last
    group are never written and stay zero."""
    x = np.asarray(x)
    flat = _work(x).reshape(-1, x.shape[-1])
    out = np.zeros_like(flat)
    for pid in range(max(1, flat.shape[0] // GROUP)):
        rows = slice(pid * GROUP, (pid + 1) * GROUP)
        out[rows] = _softmax(flat[rows])
    return out.reshape(x.shape).astype(x.dtype)


def attention_grouped_slices(q, k, v, mask=None, is_causal=False):
    """Defect: the (batch, head) slices computed GROUP to a program on a grid of
    ``slices // GROUP`` programs (at least 1): the slices of a partial last group stay zero."""
    full = attention(q, k, v, mask=mask, is_causal=is_causal)
    lead = full.shape[:-2]
    flat = full.reshape(-1, *full.shape[-2:])
    out = np.zeros_like(flat)
    done = max(1, flat.shape[0] // GROUP) * GROUP
    out[:done] = flat[:done]
    return out.reshape(*lead, *full.shape[-2:])


def softmax_in_place(x):
    """Defect: the softmax written into the input array, which is returned (values right)."""
    x = np.asarray(x)
    x[...] = _softmax(_work(x)).astype(x.dtype)
    return x


#: The buffers of the kernels below that reuse one output buffer per shape and dtype.
_BUFFERS = {}


def _reused(key, result, copy_into):
    buf = _BUFFERS.setdefault(key, result)
    if buf is not result:
        copy_into(buf, result)
    return buf


def reused_output_buffer(x):
    """Defect: each result written into one buffer per shape and dtype, kept between calls
    (its values right when it is returned; the next call of that shape overwrites it)."""
    x = np.asarray(x)
    r = _softmax(_work(x)).astype(x.dtype)
    return _reused(("numpy", r.shape, r.dtype.str), r, np.copyto)


def torch_reused_output_buffer(x):
    """Defect: the same in torch (one result tensor per shape, dtype and device)."""
    import torch

    r = torch.softmax(x.double(), dim=-1).to(x.dtype)
    return _reused(("torch", tuple(r.shape), r.dtype, r.device), r, torch.Tensor.copy_)


def attention_reused_output_buffer(q, k, v, mask=None, is_causal=False):
    """Defect: an adaptive attention whose result goes into a buffer kept between calls."""
    r = attention(q, k, v, mask=mask, is_causal=is_causal)
    return _reused(("attention", r.shape, r.dtype.str), r, np.copyto)


def softmax_last_item_dropped_mid_lengths(x):
    """Defect: for rows of 49 to 4095 items the last item is left out of the normaliser (a
    kernel specialised for mid lengths); drawn rows have at most 48 items, long ones 4096+."""
    x = np.asarray(x)
    w = _work(x)
    n = x.shape[-1]
    if not 48 < n < 4096:
        return _softmax(w).astype(x.dtype)
    m = np.max(w, axis=-1, keepdims=True)
    e = np.exp(w - m)
    return (e / np.sum(e[..., :-1], axis=-1, keepdims=True)).astype(x.dtype)


def softmax_partial_block_dropped(x):
    """Defect: the normaliser sums whole blocks of 2**20 items only (a partial last block of
    a million-key row is left out; rows of at most 2**20 items are right)."""
    x = np.asarray(x)
    w = _work(x)
    n = x.shape[-1]
    whole = n - n % (1 << 20) if n > (1 << 20) else n
    m = np.max(w, axis=-1, keepdims=True)
    e = np.exp(w - m)
    return (e / np.sum(e[..., :whole], axis=-1, keepdims=True)).astype(x.dtype)


#: The ring of :func:`output_pool_of_two`: two buffers per shape and dtype, used in turn.
_POOL = {}


def output_pool_of_two(x):
    """Defect: results written into a pool of two buffers per shape and dtype, used in
    turn (the third call overwrites the first result)."""
    x = np.asarray(x)
    r = _softmax(_work(x)).astype(x.dtype)
    ring = _POOL.setdefault((r.shape, r.dtype.str), [np.empty_like(r), np.empty_like(r), 0])
    buf = ring[ring[2]]
    ring[2] = 1 - ring[2]
    np.copyto(buf, r)
    return buf


def numbers_beside_nan(x):
    """Defect: a NaN or +inf item gives NaN at that item only, the rest softmaxed as if it
    were absent (numbers beside a NaN); a fully masked row gives 1/n."""
    x = np.asarray(x)
    w = _work(x)
    bad = np.isnan(w) | (w == np.inf)
    w = np.where(bad, -np.inf, w)
    dead = np.all(w == -np.inf, axis=-1, keepdims=True)
    w = np.where(dead, 0.0, w)
    r = _softmax(w)
    return np.where(bad, np.nan, r).astype(x.dtype)


def attention_mask_as_minus_1e4(q, k, v, mask=None, is_causal=False):
    """Defect: an adaptive attention whose boolean mask is applied as -1e4 (a "finite mask"):
    a fully masked query averages the values, and a masked key 1e4 above the rest wins."""
    if mask is not None and np.asarray(mask).dtype == bool:
        mask = np.where(mask, 0.0, -1e4)
    return attention(q, k, v, mask=mask, is_causal=is_causal)


def attention_nan_zeroed(q, k, v, mask=None, is_causal=False):
    """Defect: NaN in the output replaced by 0 (nan_to_num on the result)."""
    return np.nan_to_num(attention(q, k, v, mask=mask, is_causal=is_causal), nan=0.0)


def attention_nan_keys_dropped(q, k, v, mask=None, is_causal=False):
    """Defect: keys holding a NaN silently masked instead of making the rows NaN."""
    k = np.asarray(k)
    finite = ~np.isnan(k).any(axis=-1)[..., None, :]  # (..., 1, S)
    if mask is None:
        mask = finite
    elif np.asarray(mask).dtype == bool:
        mask = np.asarray(mask) & finite
    else:
        mask = np.where(finite, mask, -np.inf)
    return attention(q, np.nan_to_num(k, nan=0.0), v, mask=mask, is_causal=is_causal)


def attention_gqa_heads_modulo(q, k, v, mask=None, is_causal=False, enable_gqa=False):
    """Defect: grouped-query heads paired h -> h % Hk instead of h // (Hq / Hk)."""
    if enable_gqa:
        idx = np.arange(np.shape(q)[-3])
        k = np.take(k, idx % np.shape(k)[-3], axis=-3)
        v = np.take(v, idx % np.shape(v)[-3], axis=-3)
    return attention(q, k, v, mask=mask, is_causal=is_causal)


def _torch_bfloat16_entropy_rounded(x, where: str):
    """The paper's adaptive softmax in float32 whose entropy is rounded once to bfloat16
    before β is formed: on every row (`where` ``"all"``) or on rows with a masked item."""
    import torch

    xf = x.float()
    p = torch.softmax(xf, dim=-1)
    H = -(p * torch.log(p)).nan_to_num(nan=0.0).sum(dim=-1, keepdim=True)
    rounded = H.to(torch.bfloat16).float()  # the one rounding of a statistic
    H = rounded if where == "all" else torch.where(torch.isneginf(xf).any(-1, keepdim=True),
                                                   rounded, H)  # fmt: skip
    P = torch.zeros_like(H)
    for c in PAPER:
        P = P * H + float(c)
    beta = torch.where(H > 0.5, torch.clamp(P, min=1.0), torch.ones_like(H))
    out = torch.softmax(beta * xf, dim=-1)
    return torch.where(torch.isneginf(xf).all(-1, keepdim=True), 0.0, out).to(x.dtype)


def torch_entropy_rounded_bfloat16(x):
    """Defect: the entropy computed in float32, then stored in bfloat16 before beta is formed."""
    return _torch_bfloat16_entropy_rounded(x, "all")


def torch_masked_entropy_rounded_bfloat16(x):
    """Defect: the entropy computed in float32, then stored in bfloat16 before beta is
    formed, on rows with a masked item alone (a masked path of its own; right on every
    unmasked row)."""
    return _torch_bfloat16_entropy_rounded(x, "masked rows")


def torch_flush_to_zero(x):
    """Defect: a torch softmax that switches on flush-to-zero for speed and leaves it on
    (its values within the model: flushing moves a result by less than the least normal)."""
    import torch

    torch.set_flush_denormal(True)
    return torch.softmax(x, dim=-1)


def numpy_errors_raised_and_left(x):
    """Defect: a debugging ``numpy.seterr(all="raise")`` left in the kernel: the caller's
    numpy code then raises on every underflow (the oracle's own strategies met it, and
    the report blamed an exit of the child process)."""
    np.seterr(all="raise")
    return softmax(x)


def numpy_errors_silenced_and_left(x):
    """Defect: ``numpy.seterr(all="ignore")`` left in the kernel, silencing the caller's
    overflow and invalid-operation warnings (conformed: the suite runs with errors ignored)."""
    np.seterr(all="ignore")
    return softmax(x)


def torch_softmax_in_place_under_no_grad(x):
    """Defect: an inference path that saves a buffer: under ``torch.no_grad()`` the
    softmax is computed in the input's memory (``x.sub_(m).exp_()``); with gradients on,
    out of place."""
    import torch

    if torch.is_grad_enabled():
        return torch.softmax(x, dim=-1)
    m = x.amax(dim=-1, keepdim=True)
    e = x.sub_(torch.where(torch.isneginf(m), 0.0, m)).exp_()
    return e / e.sum(dim=-1, keepdim=True)


def _float32_softmax_function():
    """A softmax autograd ``Function`` whose forward computes in float32 (made on first use)."""
    import torch

    class Float32Softmax(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = torch.softmax(x.float(), dim=-1).to(x.dtype)
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, g):
            (y,) = ctx.saved_tensors
            return y * (g - (g * y).sum(dim=-1, keepdim=True))

    return Float32Softmax


def torch_softmax_float32_when_training(x):
    """Defect: a float64 softmax whose training path (an autograd ``Function``, taken when
    the input requires grad) computes in float32; the inference path is right."""
    import torch

    if x.requires_grad:
        return _float32_softmax_function().apply(x)
    return torch.softmax(x, dim=-1)


def torch_attention_scaling_q_in_place_under_no_grad(q, k, v, attn_mask=None, is_causal=False,
                                                     scale=None):  # fmt: skip
    """Defect: adaptive attention that, under ``torch.no_grad()``, scales the queries in
    their own memory (``q.mul_(scale)``) to save a copy at inference."""
    import torch

    from softmaxtheory.accelerated.torch import adaptive_attention

    scale = q.shape[-1] ** -0.5 if scale is None else scale
    q = q * scale if torch.is_grad_enabled() else q.mul_(scale)
    return adaptive_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=1.0)


def torch_attention_float32_when_training(q, k, v, attn_mask=None, is_causal=False,
                                          scale=None):  # fmt: skip
    """Defect: float64 adaptive attention whose path for operands requiring grad runs in
    float32 (a training path written for float32 models)."""
    from softmaxtheory.accelerated.torch import adaptive_attention

    kw = {"attn_mask": attn_mask, "is_causal": is_causal, "scale": scale}
    if q.requires_grad:
        return adaptive_attention(q.float(), k.float(), v.float(), **kw).to(q.dtype)
    return adaptive_attention(q, k, v, **kw)


def attention_exp_without_max(q, k, v, mask=None, is_causal=False):
    """Defect: plain attention whose softmax exponentiates the logits as they are (no
    maximum subtracted): past a logit of 709 float64's exp is inf, and inf / inf NaN."""
    q, k, v = (np.asarray(a) for a in (q, k, v))
    logits = _apply_mask((q @ np.swapaxes(k, -1, -2)) / np.sqrt(q.shape[-1]), mask, is_causal)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        e = np.exp(logits)
        total = e.sum(axis=-1, keepdims=True)
        w = np.where(total == 0, 0.0, e / np.where(total == 0, 1.0, total))
    return (w @ v).astype(q.dtype)


def torch_attention_first_block_maximum(q, k, v, attn_mask=None, is_causal=False):
    """Defect: plain attention over blocks of 64 keys that fixes its maximum from the first
    block holding an unmasked key and never rescales (a "unified maximum" without its
    overflow fallback): a later key far above that maximum overflows exp."""
    import torch

    logits = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    L, S = logits.shape[-2:]
    if is_causal:
        logits = logits.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(), -torch.inf)
    if attn_mask is not None:
        logits = (logits.masked_fill(~attn_mask, -torch.inf) if attn_mask.dtype == torch.bool
                  else logits + attn_mask)  # fmt: skip
    pad = -S % 64
    blocks = torch.nn.functional.pad(logits, (0, pad), value=-torch.inf)
    block_max = blocks.unflatten(-1, (-1, 64)).amax(dim=-1)  # (..., L, blocks)
    finite = torch.isfinite(block_max)
    first = finite.int().argmax(dim=-1, keepdim=True)
    m = torch.where(finite.any(-1, keepdim=True), block_max.gather(-1, first), 0.0)
    e = torch.exp(logits - m)
    total = e.sum(dim=-1, keepdim=True)
    w = torch.where(total == 0, 0.0, e / total)
    return w @ v


def rows_past_the_grid_limit_unwritten(x):
    """Defect: one program per row on the second axis of a CUDA launch grid, which ends at
    65535: the rows past it are never written (zeros here)."""
    out = softmax(x)
    out.reshape(-1, out.shape[-1])[65535:] = 0
    return out


def attention_slices_past_the_grid_limit_unwritten(q, k, v, mask=None, is_causal=False):
    """Defect: one program per (batch, head) slice on the second axis of a CUDA launch grid
    (it ends at 65535): the slices past it are never written (zeros here)."""
    out = attention(q, k, v, mask=mask, is_causal=is_causal)
    out.reshape(-1, *out.shape[-2:])[65535:] = 0
    return out


#: The variants of :func:`torch_variant_cached_by_shape`, by shape (the dtype left out).
_VARIANTS: dict = {}


def torch_variant_cached_by_shape(x):
    """Defect: one compiled variant per input shape, the dtype left out of the cache key (a
    variant here computes in the dtype of the call that made it): a float32 call after a
    float16 call of the same shape computes in float16."""
    import torch

    if x.shape not in _VARIANTS:
        dtype = x.dtype
        _VARIANTS[x.shape] = lambda t: torch.softmax(t.to(dtype), dim=-1)
    return _VARIANTS[x.shape](x).to(x.dtype)


def softmax_warp_rows_first_64(x):
    """Defect: a "warp per row" path for rows of 65 to 128 items whose normaliser load is
    guarded by ``col < 64`` where ``col < n`` was meant: the sum covers the first 64 items."""
    x = np.asarray(x)
    w = _work(x)
    if not 64 < x.shape[-1] <= 128:
        return _softmax(w).astype(x.dtype)
    m = np.max(w, axis=-1, keepdims=True)
    e = np.exp(w - np.where(m == -np.inf, 0, m))
    return (e / np.sum(e[..., :64], axis=-1, keepdims=True)).astype(x.dtype)


def softmax_one_row_stride(x):
    """Defect: the wrapper of a row kernel handed a pointer and one row stride: it copies the
    input only when its last axis is strided, then reads row r of the flattened batch at
    ``r * strides[-2]`` (right for 2-d inputs and contiguous batches, not for ``x[:, :3]``)."""
    x = np.asarray(x)
    if x.ndim < 2:
        return softmax(x)
    if x.strides[-1] != x.itemsize:
        x = np.ascontiguousarray(x)
    rows = int(np.prod(x.shape[:-1]))
    flat = np.lib.stride_tricks.as_strided(x, (rows, x.shape[-1]), (x.strides[-2], x.itemsize))
    return _softmax(_work(flat)).astype(x.dtype).reshape(x.shape)


def _workspace(key, result, large):
    """`result` itself, or when `large` a copy in the workspace kept for `key`."""
    if not large:
        return result
    buf = _BUFFERS.setdefault(("workspace", *key), np.empty_like(result))
    np.copyto(buf, result)
    return buf


def workspace_for_large_results(x):
    """Defect: results of 4096 elements or more go into a workspace kept per shape and dtype
    (a caching allocator's large pool); smaller results are fresh."""
    x = np.asarray(x)
    r = _softmax(_work(x)).astype(x.dtype)
    return _workspace((r.shape, r.dtype.str), r, r.size >= 4096)


def attention_workspace_for_long_keys(q, k, v, mask=None, is_causal=False):
    """Defect: the same in attention, for 64 keys or more."""
    r = attention(q, k, v, mask=mask, is_causal=is_causal)
    return _workspace(("attention", r.shape, r.dtype.str), r, np.shape(k)[-2] >= 64)


def attention_query_tiles_floor(q, k, v, mask=None, is_causal=False):
    """Defect: queries in tiles of 256 on a grid of ``L // 256`` tiles (at least 1): beyond
    256 queries, those of a partial last tile stay zero."""
    full = attention(q, k, v, mask=mask, is_causal=is_causal)
    out = np.zeros_like(full)
    done = max(1, full.shape[-2] // 256) * 256
    out[..., :done, :] = full[..., :done, :]
    return out


def attention_mask_head_0(q, k, v, mask=None, is_causal=False):
    """Defect: a 4-d mask ``(B, H, L, S)`` read at head 0 for every head (right for masks
    without a head axis, or of one head)."""
    if mask is not None and np.ndim(mask) == 4:
        mask = np.broadcast_to(np.asarray(mask)[:, :1], np.shape(mask))
    return attention(q, k, v, mask=mask, is_causal=is_causal)


def attention_decode_ignores_causal(q, k, v, mask=None, is_causal=False):
    """Defect: a single-query path (a decoding step) that drops ``is_causal``: with one
    query over several keys it attends every key, where the top-left mask keeps key 0."""
    if np.shape(q)[-2] == 1:
        is_causal = False
    return attention(q, k, v, mask=mask, is_causal=is_causal)


def _attention_with(q, k, v, mask=None, is_causal=False, scale=None, enable_gqa=False):
    """A correct adaptive attention taking ``scale=`` and ``enable_gqa=`` (numpy)."""
    q, k, v = (np.asarray(a) for a in (q, k, v))
    dt = q.dtype
    q, k, v = _work(q), _work(k), _work(v)
    if enable_gqa:  # query head h reads key head h // (Hq / Hk), as SDPA's
        group = q.shape[-3] // k.shape[-3]
        k, v = np.repeat(k, group, axis=-3), np.repeat(v, group, axis=-3)
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    logits = (q @ np.swapaxes(k, -1, -2)) * q.dtype.type(scale)
    return (adaptive_softmax(_apply_mask(logits, mask, is_causal)) @ v).astype(dt)


def attention_masked_path_default_scale(q, k, v, mask=None, is_causal=False, scale=None):
    """Defect: a separate path for masked calls that drops ``scale=`` (always 1/sqrt(d))."""
    if mask is not None:
        scale = None
    return _attention_with(q, k, v, mask, is_causal, scale)


def attention_gqa_path_drops_mask_and_scale(q, k, v, mask=None, is_causal=False, scale=None,
                                            enable_gqa=False):  # fmt: skip
    """Defect: the grouped-query branch forwards neither the mask nor the scale."""
    if enable_gqa and np.shape(k)[-3] != np.shape(q)[-3]:
        return _attention_with(q, k, v, None, is_causal, None, enable_gqa=True)
    return _attention_with(q, k, v, mask, is_causal, scale)


def attention_additive_mask_clamped(q, k, v, mask=None, is_causal=False):
    """Defect: a float mask clamped at -1e4 "to avoid inf" (boolean masks handled right):
    masked keys far above the others keep weight, and a fully masked query gets the mean
    of the values."""
    if mask is not None and np.asarray(mask).dtype != bool:
        mask = np.maximum(np.asarray(mask), -1e4).astype(np.asarray(mask).dtype)
    return attention(q, k, v, mask=mask, is_causal=is_causal)


def attention_lowest_float_mask_dropped(q, k, v, mask=None, is_causal=False):
    """Defect: float mask entries at or below half the lowest finite float read as -inf (a
    wrapper turning Hugging Face masks into boolean ones), in plain attention: a query
    whose every key carries the lowest float gets 0 where the values' mean is right."""
    if mask is not None and np.asarray(mask).dtype != bool:
        m = np.asarray(mask)
        mask = np.where(m <= np.finfo(m.dtype).min / 2, -np.inf, m).astype(m.dtype)
    return softmax_attention(q, k, v, mask=mask, is_causal=is_causal)


def attention_no_keys_unwritten(q, k, v, mask=None, is_causal=False):
    """Defect: a flash-style loop whose output is written after the last key block: with
    no keys there is no block and the buffer is returned as allocated (0.5 here, standing
    for the memory's old contents)."""
    if np.shape(k)[-2] == 0:
        shape = (*np.broadcast_shapes(np.shape(q)[:-2], np.shape(v)[:-2]), np.shape(q)[-2],
                 np.shape(v)[-1])  # fmt: skip
        return np.full(shape, 0.5, dtype=np.asarray(q).dtype)
    return attention(q, k, v, mask=mask, is_causal=is_causal)


def torch_storage_offset_dropped(x):
    """Defect: a torch wrapper that addresses its operand from the storage's start
    (``untyped_storage().data_ptr()`` for ``data_ptr()``): a slice such as ``x[1:]`` is
    read from its buffer's first element."""
    import torch

    base = torch.empty(0, dtype=x.dtype, device=x.device).set_(x.untyped_storage())
    y = base.as_strided(x.shape, x.stride(), 0)
    return torch.softmax(y.double(), dim=-1).to(x.dtype)


def torch_attention_heads_viewed(q, k, v, attn_mask=None, is_causal=False):
    """Defect: (batch, head) slices flattened with ``view(-1, L, d)``, which refuses heads
    of a ``(B, L, H, d)`` projection (right for contiguous operands)."""
    import torch.nn.functional as nnf

    lead = q.shape[:-2]
    q2, k2, v2 = (t.view(-1, *t.shape[-2:]) for t in (q, k, v))
    mask = attn_mask
    out = nnf.scaled_dot_product_attention(q2, k2, v2, attn_mask=mask, is_causal=is_causal)
    return out.view(*lead, *out.shape[-2:])


def unused_paper():  # pragma: no cover - keeps the import used for readers
    return PaperPolynomial()


def torch_softmax(x):
    """torch.softmax along the last axis (a correct third-party kernel)."""
    import torch

    return torch.softmax(x, dim=-1)


def torch_sdpa(q, k, v, attn_mask=None, is_causal=False):
    """torch's scaled_dot_product_attention (plain attention: schedule constant:1)."""
    import torch.nn.functional as nnf

    return nnf.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)


# -- round four: maxima, special rows and schedules the default run left out ---------


def _normalised(w, m):
    """exp(w - m) / its sum, with m as given (a kernel's own maximum), 0/0 as 0."""
    with np.errstate(all="ignore"):
        e = np.exp(w - np.where(m == -np.inf, 0, m))
        s = np.sum(e, axis=-1, keepdims=True)
        return np.where(s == 0, 0, e / np.where(s == 0, 1, s))


def softmax_first_block_max(x):
    """Defect: the maximum of the first 1024-item block that has an unmasked item is used
    for the whole row and never rescaled (an online softmax without its correction)."""
    x = np.asarray(x)
    w = _work(x)
    n = w.shape[-1]
    padded = np.concatenate([w, np.full((*w.shape[:-1], -n % 1024), -np.inf, w.dtype)], -1)
    blocks = padded.reshape(*w.shape[:-1], -1, 1024).max(axis=-1)
    first = np.argmax(blocks > -np.inf, axis=-1)[..., None]
    return _normalised(w, np.take_along_axis(blocks, first, -1)).astype(x.dtype)


def softmax_tail_left_out_of_max(x):
    """Defect: the maximum is taken by a loop over groups of 8 items; the last n % 8 items
    (the tail) are left out of it (a row shorter than 8 is reduced whole)."""
    x = np.asarray(x)
    w = _work(x)
    main = w.shape[-1] - w.shape[-1] % 8 or w.shape[-1]
    return _normalised(w, np.max(w[..., :main], axis=-1, keepdims=True, initial=-np.inf)).astype(
        x.dtype
    )


def softmax_one_item_fast_path(x):
    """Defect: a row of one item returns 1 without looking at it (-inf, NaN or +inf too)."""
    x = np.asarray(x)
    return np.ones_like(x) if x.shape[-1] == 1 else softmax(x)


def entropy_long_rows_without_guard(x):
    """Defect: rows of more than 1024 items take a second path without the 0/0 guard, so a
    fully masked long row (a padded batch entry) gives NaN instead of 0."""
    x = np.asarray(x)
    w = _work(x)
    if w.shape[-1] <= 1024:
        return entropy(x)
    with np.errstate(all="ignore"):
        z = w - np.max(w, axis=-1, keepdims=True)
        e = np.exp(z)
        s = np.sum(e, axis=-1)
        return (np.log(s) - np.sum(np.where(e > 0, e * z, 0), axis=-1) / s).astype(x.dtype)


def adaptive_scales_masked_items(x, *, schedule=None):
    """Defect: beta * (x - max) is computed over every item, masked ones included: where
    beta = 0 (LogLength on a row with one unmasked item) 0 * -inf is NaN."""
    x = np.asarray(x)
    w = _work(x)
    schedule = resolve_schedule(schedule)
    n_eff = np.sum(w > -np.inf, axis=-1)
    beta = np.asarray(schedule.beta_float(_entropy(w), n_eff), dtype=w.dtype)
    with np.errstate(invalid="ignore"):
        m = np.max(w, axis=-1, keepdims=True, initial=-np.inf)
        z = beta[..., None] * (w - np.where(m == -np.inf, 0, m))
    return _softmax(z).astype(x.dtype)


def adaptive_polynomial_without_clamp(x, *, schedule=None):
    """Defect: a user's Polynomial schedule is evaluated as P(H) above its threshold,
    without max(P, 1) (the paper's polynomial, built in, keeps it)."""
    schedule = resolve_schedule(schedule)
    if type(schedule) is not Polynomial:
        return adaptive_softmax(x, schedule=schedule)
    x = np.asarray(x)
    w = _work(x)
    H = _entropy(w)
    c = np.array([float(a) for a in schedule.coefficients])
    beta = np.where(H > float(schedule.threshold), np.polyval(c, H), 1.0).astype(w.dtype)
    with np.errstate(invalid="ignore"):
        m = np.max(w, axis=-1, keepdims=True, initial=-np.inf)
        z = w - np.where(m == -np.inf, 0, m)
        z = np.where(z == -np.inf, -np.inf, beta[..., None] * z)
    return _softmax(z).astype(x.dtype)


def softmax_second_template_half_sum(x):
    """Defect: rows of 32769 to 65536 items (a second launch template) are normalised by
    the sum of their first 32768 items only, its loop bound left at the first template's."""
    x = np.asarray(x)
    w = _work(x)
    if not 32768 < w.shape[-1] <= 65536:
        return softmax(x)
    with np.errstate(all="ignore"):
        e = np.exp(w - np.max(w, axis=-1, keepdims=True))
        return (e / np.sum(e[..., :32768], axis=-1, keepdims=True)).astype(x.dtype)


def adaptive_ignoring_entropy_eps(x, *, schedule=None, entropy_eps=0.0):
    """Defect: takes entropy_eps= and drops it (always the exact entropy): right at the
    default entropy_eps=0, wrong for a user of the paper's 1e-9 guard."""
    return adaptive_softmax(x, schedule=schedule)


def entropy_guard_as_clamp(x, *, entropy_eps=0.0):
    """Defect: the guard written as a clamp, -p log(max(p, eps)) (0 log 0 = 0 kept), not
    the spec's -p log(p + eps): exact for every p >= eps, so the guard is lost."""
    x = np.asarray(x)
    p = _softmax(_work(x))
    t = p.dtype.type
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, -p * np.log(np.maximum(p, t(entropy_eps))), p * 0)
    return np.sum(terms, axis=-1).astype(x.dtype)


def attention_ignoring_entropy_eps(q, k, v, mask=None, is_causal=False, entropy_eps=0.0):
    """Defect: an adaptive attention that takes entropy_eps= and drops it."""
    return attention(q, k, v, mask=mask, is_causal=is_causal)


# round five: paths chosen by size or by call, and inputs the fixed cases lacked


def attention_long_causal_bottom_right(q, k, v, mask=None, is_causal=False):
    """Defect: long key sequences (more than 64 keys) go to a path whose causal mask is
    aligned to the bottom right, as a wrapper sending them to FlashAttention does."""
    if np.asarray(k).shape[-2] > 64:
        return attention_causal_bottom_right(q, k, v, mask=mask, is_causal=is_causal)
    return attention(q, k, v, mask=mask, is_causal=is_causal)


def attention_loglength_boolean_keys(q, k, v, mask=None, is_causal=False, schedule=None):
    """Defect: LogLength's n_eff counts the keys a boolean mask keeps, so the keys an
    additive mask removes (-inf) are still counted."""
    q, k, v = (np.asarray(a) for a in (q, k, v))
    dt = q.dtype
    q, k, v = _work(q), _work(k), _work(v)
    logits = _apply_mask((q @ np.swapaxes(k, -1, -2)) / np.sqrt(q.shape[-1]), mask, is_causal)
    kept = np.ones(logits.shape, bool)
    if is_causal:
        kept &= np.tril(np.ones(logits.shape[-2:], bool))
    if mask is not None and np.asarray(mask).dtype == bool:
        kept &= np.asarray(mask)
    schedule = resolve_schedule(schedule)
    beta = schedule.beta_float(_entropy(logits), kept.sum(-1)).astype(logits.dtype)
    with np.errstate(invalid="ignore"):
        z = logits - np.max(logits, axis=-1, keepdims=True, initial=-np.inf)
        z = np.where(np.isneginf(z), -np.inf, beta[..., None] * z)
    return (_softmax(z) @ v).astype(dt)


def adaptive_long_rows_paper_schedule(x, *, schedule=None):
    """Defect: rows of 4096 items or more take a path with the paper's schedule built in,
    whatever schedule= says."""
    long = np.asarray(x).shape[-1] >= 4096
    return adaptive_softmax(x, schedule=None if long else schedule)


def entropy_long_rows_drop_eps(x, *, entropy_eps=0.0):
    """Defect: rows of 4096 items or more take a path that computes the exact entropy,
    whatever entropy_eps= says."""
    x = np.asarray(x)
    eps = 0.0 if x.shape[-1] >= 4096 else entropy_eps
    return _entropy(_work(x), eps).astype(x.dtype)


def softmax_many_rows_no_max(x):
    """Defect: batches of 512 rows or more take a path (a row per warp) that exponentiates
    without subtracting the maximum."""
    x = np.asarray(x)
    if np.prod(x.shape[:-1]) < 512:
        return softmax(x)
    with np.errstate(all="ignore"):
        e = np.exp(_work(x))
        s = np.sum(e, axis=-1, keepdims=True)
        return np.where(s == 0, 0, e / np.where(s == 0, 1, s)).astype(x.dtype)


def softmax_many_rows_mask_as_minus_1e4(x):
    """Defect: batches of 512 rows or more take a path that writes -inf as -1e4."""
    x = np.asarray(x)
    if np.prod(x.shape[:-1]) < 512:
        return softmax(x)
    return softmax(np.where(np.isneginf(x), x.dtype.type(-1e4), x))


def _attention_no_max(q, k, v, mask=None, is_causal=False):
    q, k, v = (np.asarray(a) for a in (q, k, v))
    dt = q.dtype
    q, k, v = _work(q), _work(k), _work(v)
    logits = _apply_mask((q @ np.swapaxes(k, -1, -2)) / np.sqrt(q.shape[-1]), mask, is_causal)
    beta = PaperPolynomial().beta_float(_entropy(logits), np.sum(logits > -np.inf, -1))
    with np.errstate(all="ignore"):
        e = np.exp(beta.astype(logits.dtype)[..., None] * logits)
        s = np.sum(e, axis=-1, keepdims=True)
        return (np.where(s == 0, 0, e / np.where(s == 0, 1, s)) @ v).astype(dt)


def attention_many_slices_no_max(q, k, v, mask=None, is_causal=False):
    """Defect: 64 (batch, head) slices or more take a path that exponentiates without
    subtracting the maximum."""
    if np.prod(np.broadcast_shapes(np.shape(q)[:-2], np.shape(k)[:-2])) < 64:
        return attention(q, k, v, mask=mask, is_causal=is_causal)
    return _attention_no_max(q, k, v, mask=mask, is_causal=is_causal)


def attention_long_keys_mask_finiteness(q, k, v, mask=None, is_causal=False):
    """Defect: with 256 keys or more, a float mask is read as where it is finite: its -inf
    removes keys, but its real values are dropped."""
    if mask is not None and np.asarray(k).shape[-2] >= 256:
        mask = np.isfinite(np.asarray(mask))
    return attention(q, k, v, mask=mask, is_causal=is_causal)


_TUNED = set()


def attention_autotuned_no_max(q, k, v, mask=None, is_causal=False):
    """Defect: an autotuner runs the safe variant on a shape's first call and, on later
    calls, the variant it chose, which exponentiates without subtracting the maximum."""
    key = (np.shape(q), np.shape(k), np.shape(v), np.shape(mask), is_causal)
    if key in _TUNED:
        return _attention_no_max(q, k, v, mask=mask, is_causal=is_causal)
    _TUNED.add(key)
    return attention(q, k, v, mask=mask, is_causal=is_causal)


def attention_broadcast_modulo(q, k, v, mask=None, is_causal=False):
    """Defect: the (batch, head) slices are flattened and k and v read at slice i % (their
    number of slices), which pairs heads wrongly when k and v broadcast over heads."""
    q, k, v = (np.asarray(a) for a in (q, k, v))
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    qf = np.broadcast_to(q, (*lead, *q.shape[-2:])).reshape(-1, *q.shape[-2:])
    kf, vf = k.reshape(-1, *k.shape[-2:]), v.reshape(-1, *v.shape[-2:])
    if mask is not None:
        full = (*lead, q.shape[-2], k.shape[-2])
        mask = np.broadcast_to(np.asarray(mask), full).reshape(-1, *full[-2:])
    out = [
        attention(qf[i], kf[i % len(kf)], vf[i % len(vf)],
                  mask=None if mask is None else mask[i], is_causal=is_causal)
        for i in range(len(qf))
    ]  # fmt: skip
    return np.stack(out).reshape(*lead, q.shape[-2], v.shape[-1])


# round six: more paths chosen by size, each dropping or misreading one argument


def _slices(q, k):
    return int(np.prod(np.broadcast_shapes(np.shape(q)[:-2], np.shape(k)[:-2])))


def attention_many_slices_drop_causal(q, k, v, mask=None, is_causal=False):
    """Defect: 64 (batch, head) slices or more take a batched path that drops is_causal."""
    causal = is_causal and _slices(q, k) < 64
    return attention(q, k, v, mask=mask, is_causal=causal)


def attention_many_slices_first_mask(q, k, v, mask=None, is_causal=False):
    """Defect: 64 slices or more take a path that reads the first slice's mask for every
    slice (the mask's batch stride left out)."""
    if mask is not None and _slices(q, k) >= 64:
        mask = np.asarray(mask)
        mask = mask.reshape(-1, *mask.shape[-2:])[0]
    return attention(q, k, v, mask=mask, is_causal=is_causal)


def attention_query_tiles_mask_offset(q, k, v, mask=None, is_causal=False):
    """Defect: queries in tiles of 64, every tile reading the mask rows of the first (the
    tile's row offset into the mask forgotten)."""
    q = np.asarray(q)
    if mask is None or np.ndim(mask) < 2 or np.shape(mask)[-2] == 1 or q.shape[-2] <= 64:
        return attention(q, k, v, mask=mask, is_causal=is_causal)
    mask = np.asarray(mask)
    tiles = []
    for start in range(0, q.shape[-2], 64):
        rows = min(64, q.shape[-2] - start)
        tile_mask = mask[..., :rows, :]  # should be start : start + rows
        tiles.append(attention(q[..., start : start + rows, :], k, v, mask=tile_mask))
    return np.concatenate(tiles, axis=-2)


def attention_head_dim_block_64(q, k, v, mask=None, is_causal=False):
    """Defect: a fixed block of 64 over the head dim, with no loop: q.k leaves out the
    dims past 64 (the scale still 1/sqrt(d)), and the output's columns past 64 stay 0."""
    q, k, v = (np.asarray(a) for a in (q, k, v))
    if q.shape[-1] <= 64 and v.shape[-1] <= 64:
        return attention(q, k, v, mask=mask, is_causal=is_causal)
    d = q.shape[-1]
    qs = q[..., :64] * np.sqrt(min(d, 64) / d).astype(q.dtype)
    out = np.zeros((*np.broadcast_shapes(q.shape[:-2], v.shape[:-2]), q.shape[-2], v.shape[-1]),
                   dtype=q.dtype)  # fmt: skip
    out[..., :64] = attention(qs, k[..., :64], v[..., :64], mask=mask, is_causal=is_causal)
    return out


def attention_long_keys_drop_scale(q, k, v, mask=None, is_causal=False, scale=None):
    """Defect: unmasked calls with 128 keys or more take a flash path never passed scale=."""
    if mask is None and not is_causal and np.shape(k)[-2] >= 128:
        scale = None
    return _attention_with(q, k, v, mask, is_causal, scale)


def attention_gqa_long_keys_modulo(q, k, v, mask=None, is_causal=False, enable_gqa=False):
    """Defect: with 128 keys or more, query head h reads key head h % Hk, not h // (H/Hk)."""
    q, k, v = (np.asarray(a) for a in (q, k, v))
    if enable_gqa and q.shape[-3] != k.shape[-3]:
        heads = q.shape[-3]
        if k.shape[-2] >= 128:
            pick = np.arange(heads) % k.shape[-3]
        else:
            pick = np.arange(heads) // (heads // k.shape[-3])
        k, v = k[..., pick, :, :], v[..., pick, :, :]
    return attention(q, k, v, mask=mask, is_causal=is_causal)


def attention_one_key_returns_value(q, k, v, mask=None, is_causal=False):
    """Defect: with one key, a fast path returns its value (softmax over one item is 1),
    whatever the mask and whatever NaN the query holds."""
    q, v = np.asarray(q), np.asarray(v)
    if np.shape(k)[-2] == 1:
        shape = (*np.broadcast_shapes(q.shape[:-2], v.shape[:-2]), q.shape[-2], v.shape[-1])
        return np.broadcast_to(v, shape).copy()
    return attention(q, k, v, mask=mask, is_causal=is_causal)


_DECODE_BUFFERS = {}


def attention_decode_static_buffer(q, k, v, mask=None, is_causal=False):
    """Defect: one query (a decoding step) is written into a buffer kept per shape, as a
    replayed CUDA graph's static output is, and that buffer is returned."""
    out = attention(q, k, v, mask=mask, is_causal=is_causal)
    if np.shape(q)[-2] != 1:
        return out
    buf = _DECODE_BUFFERS.setdefault((out.shape, out.dtype.str), np.empty_like(out))
    buf[...] = out
    return buf


def adaptive_many_rows_paper_schedule(x, *, schedule=None):
    """Defect: batches of 512 rows or more take a path with the paper's schedule built in."""
    many = np.prod(np.shape(x)[:-1]) >= 512
    return adaptive_softmax(x, schedule=None if many else schedule)


def adaptive_split_rows_paper_schedule(x, *, schedule=None):
    """Defect: rows of 65536 items or more, split across programs, take the paper's schedule."""
    split = np.shape(x)[-1] >= 65536
    return adaptive_softmax(x, schedule=None if split else schedule)


def attention_long_keys_paper_schedule(q, k, v, mask=None, is_causal=False, schedule=None):
    """Defect: unmasked calls with 256 keys or more take a path with the paper's schedule."""
    if mask is None and not is_causal and np.shape(k)[-2] >= 256:
        schedule = None
    return attention(q, k, v, mask=mask, is_causal=is_causal, schedule=schedule)


def entropy_split_rows_drop_eps(x, *, entropy_eps=0.0):
    """Defect: rows of 65536 items or more take a path that computes the exact entropy."""
    x = np.asarray(x)
    eps = 0.0 if x.shape[-1] >= 65536 else entropy_eps
    return _entropy(_work(x), eps).astype(x.dtype)


def adaptive_many_rows_drop_eps(x, *, schedule=None, entropy_eps=0.0):
    """Defect: batches of 512 rows or more take a path that drops entropy_eps=."""
    eps = 0.0 if np.prod(np.shape(x)[:-1]) >= 512 else entropy_eps
    return adaptive_softmax(x, schedule=schedule, entropy_eps=eps)


# round seven: torch kernels with a path of their own for inference or training, and
# torch's global settings


def torch_softmax_inference_no_rescale(x):
    """Defect: under no_grad or inference_mode, an online softmax over blocks of 64 items
    whose running sum is never rescaled when the maximum grows."""
    import torch

    if torch.is_grad_enabled():
        return torch.softmax(x, dim=-1)
    xf = x.float()
    m = torch.full(xf.shape[:-1], -torch.inf)
    total = torch.zeros(xf.shape[:-1])
    for start in range(0, xf.shape[-1], 64):
        block = xf[..., start : start + 64]
        m = torch.maximum(m, block.amax(dim=-1))
        total = total + torch.exp(block - m[..., None]).sum(dim=-1)  # no exp(m_old - m)
    return (torch.exp(xf - m[..., None]) / total[..., None]).to(x.dtype)


_STATIC = {}


def torch_softmax_inference_static_buffer(x):
    """Defect: under no_grad or inference_mode, the result is written into a buffer kept
    per shape (a replayed CUDA graph's static output) and that buffer is returned."""
    import torch

    out = torch.softmax(x, dim=-1)
    if torch.is_grad_enabled():
        return out
    key = (tuple(out.shape), out.dtype)
    if key not in _STATIC:
        with torch.inference_mode(False):
            _STATIC[key] = torch.empty_like(out)
    _STATIC[key].copy_(out)
    return _STATIC[key]


def torch_attention_inference_bottom_right(q, k, v, attn_mask=None, is_causal=False,
                                           scale=None):  # fmt: skip
    """Defect: the inference path (a KV cache's) aligns a causal mask to the bottom right
    when L < S; with gradients on it is aligned to the top left, as the spec says."""
    import torch

    from softmaxtheory.accelerated.torch import adaptive_attention

    if is_causal and not torch.is_grad_enabled():
        L, S = q.shape[-2], k.shape[-2]
        attn_mask = torch.ones(L, S, dtype=torch.bool).tril(S - L)
        is_causal = False
    return adaptive_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale)


def torch_attention_inference_drops_scale(q, k, v, attn_mask=None, is_causal=False,
                                          scale=None):  # fmt: skip
    """Defect: the inference path is never passed scale= (always 1/sqrt(d))."""
    import torch

    from softmaxtheory.accelerated.torch import adaptive_attention

    if not torch.is_grad_enabled():
        scale = None
    return adaptive_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale)


def torch_softmax_training_finfo_min(x):
    """Defect: when x requires grad, a training path masks with finfo.min instead of -inf,
    so a fully masked row gets the uniform distribution."""
    import torch

    if not x.requires_grad:
        return torch.softmax(x, dim=-1)
    return torch.softmax(x.clamp_min(torch.finfo(x.dtype).min), dim=-1)


def torch_softmax_leaves_grad_disabled(x):
    """Defect: switches torch's grad mode off to save memory and never switches it back."""
    import torch

    torch.set_grad_enabled(False)
    return torch.softmax(x, dim=-1)


def torch_softmax_leaves_default_dtype(x):
    """Defect: sets torch's default dtype to float64 for an accurate sum and leaves it so."""
    import torch

    torch.set_default_dtype(torch.float64)
    return torch.softmax(x, dim=-1)


# -- round eight: operands updated in place between two calls ------------------------

#: what :func:`softmax_memoised_by_identity` and :func:`torch_attention_mask_cached_by_pointer`
#: keep: the operand itself (so that its id or address cannot be reused while the entry
#: stands) and what was derived from it; eight entries, the oldest dropped first
_BY_IDENTITY: dict[tuple, tuple] = {}


def _derived_by_identity(key: tuple, operand: Any, derive: Callable[[], Any]) -> Any:
    if key not in _BY_IDENTITY:
        if len(_BY_IDENTITY) >= 8:
            del _BY_IDENTITY[next(iter(_BY_IDENTITY))]
        _BY_IDENTITY[key] = (operand, derive())
    return _BY_IDENTITY[key][1]


def softmax_memoised_by_identity(x):
    """Defect: memoises its result by the logits' object identity (for a caller that asks
    twice), so logits updated in place get the old values."""
    x = np.asarray(x)

    def compute():
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    return _derived_by_identity(("softmax", id(x), x.shape, x.dtype.str), x, compute).copy()


def torch_attention_mask_cached_by_pointer(q, k, v, attn_mask=None, is_causal=False):
    """Defect: converts a boolean mask to an additive one once per mask buffer (its address),
    so a decoding loop's mask updated in place keeps its first keys."""
    import torch
    import torch.nn.functional as nnf

    if attn_mask is not None and attn_mask.dtype == torch.bool:
        mask = attn_mask
        key = ("mask", mask.data_ptr(), tuple(mask.shape), q.dtype)

        def bias():
            return torch.zeros(mask.shape, dtype=q.dtype).masked_fill(~mask, float("-inf"))

        attn_mask = _derived_by_identity(key, mask, bias)
    return nnf.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)


# -- round eight: the shapes production kernels pick their fast paths on ---------------


def _fused_dispatch(x) -> bool:
    """Megatron's ``FusedScaleMaskSoftmax`` condition, for rows: 16 < n <= 4096 items and
    the number of rows a multiple of 4 (the fused kernel's rows per block)."""
    rows = int(np.prod(np.shape(x)[:-1]))
    return 16 < np.shape(x)[-1] <= 4096 and rows > 0 and rows % 4 == 0


def softmax_fused_without_max(x):
    """Defect: on the shapes a fused kernel is dispatched for, it exponentiates the logits
    without subtracting the row maximum (overflow past about 88 in float32)."""
    x = np.asarray(x)
    if not _fused_dispatch(x):
        return softmax(x)
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(x)
        return (e / e.sum(axis=-1, keepdims=True)).astype(x.dtype)


def adaptive_fused_without_temperature(x, *, schedule=None, entropy_eps=0.0):
    """Defect: the adaptive temperature was added to the fallback path only; the fused
    path, taken on evenly divided batches, is a plain softmax (β = 1)."""
    if _fused_dispatch(x):
        return softmax(x)
    return adaptive_softmax(x, schedule=schedule, entropy_eps=entropy_eps)


def attention_tuned_head_dims_plain(q, k, v, mask=None, is_causal=False, schedule=None):
    """Defect: the tuned path for the head dims of real models (64, 128) is a plain
    attention kernel (β = 1); other head dims take the adaptive one."""
    if np.shape(q)[-1] in (64, 128):
        return attention(q, k, v, mask=mask, is_causal=is_causal, schedule=Constant(1))
    return attention(q, k, v, mask=mask, is_causal=is_causal, schedule=schedule)


def attention_tuned_head_dims_drop_mask(q, k, v, mask=None, is_causal=False, schedule=None):
    """Defect: the tuned path for head dims 64 and 128 never applies mask=."""
    if np.shape(q)[-1] in (64, 128):
        mask = None
    return attention(q, k, v, mask=mask, is_causal=is_causal, schedule=schedule)


# -- the catalogue ------------------------------------------------------------------

_A = {"kind": "adaptive_softmax"}


#: Defect class -> (kernel, Target options, the property of the default run that catches it).
CATALOGUE = {
    # port errors found in public adaptive-softmax implementations
    "coefficients in ascending powers": (reversed_coefficients, _A, "values"),
    "polynomial used as a clipped temperature": (polynomial_as_temperature, _A, "temperature_cap"),
    "beta silently 1 on masked rows (0 * -inf = NaN entropy)": (masked_nan_entropy, _A, "values"),
    "1e-9 guard vanishing in float16": (
        fp16_guard_vanishing, {"kind": "entropy", "dtype": "float16", "entropy_eps": 1e-9},
        "special_values"),
    "Horner's rule in bfloat16": (
        torch_horner_bfloat16, {**_A, "dtype": "bfloat16", "framework": "torch"}, "values"),
    "Horner's rule in float16": (
        horner_float16, {**_A, "dtype": "float16"}, "branch_points"),
    "beta = 1 while P(H) is below 1 + 1e-4 (a fast path near the kinks)": (
        beta_one_near_the_kinks, _A, "branch_points"),
    "beta 0.1 % too large just below H_off": (sharper_just_below_h_off, _A, "branch_points"),
    "terms below e**-100 dropped in float64": (terms_below_e100_dropped, {}, "values"),
    "wrong at exactly 256, 512, 1024 and 2048 items": (wrong_at_powers_of_two, {}, "long_rows"),
    "the paper's listing as printed (beta * x overflows past max / beta)": (
        listing_scaling_first, {**_A, "entropy_eps": 1e-9}, "branch_points"),
    "the listing natively in float16, beta * x rounded (overflows past 27,000)": (
        listing_native_16bit_unshifted, {**_A, "dtype": "float16"}, "branch_points"),
    "the listing natively in bfloat16 (torch), beta * x rounded (overflows)": (
        torch_listing_native_16bit_unshifted,
        {**_A, "dtype": "bfloat16", "framework": "torch"}, "branch_points"),
    "logits clamped at +-50": (clamped_logits, {"dtype": "float32"}, "values"),
    "float64 path computed in float32": (float32_internal, {}, "values"),
    "float64 path accumulating in float32": (float32_accumulation, {}, "long_rows"),
    "float64 path returning float32": (float32_result, {}, "dtype_shape"),
    "statistics accumulated in float16": (
        float16_statistics, {**_A, "dtype": "float16"}, "branch_points"),
    "entropy rounded once to bfloat16": (
        torch_entropy_rounded_bfloat16, {**_A, "dtype": "bfloat16", "framework": "torch"},
        "branch_points"),
    "entropy rounded once to bfloat16 on masked rows": (
        torch_masked_entropy_rounded_bfloat16,
        {**_A, "dtype": "bfloat16", "framework": "torch"}, "branch_points"),
    "-inf replaced by -1e4": (mask_as_minus_1e4, {"dtype": "float32"}, "values"),
    "the lowest finite float read as a mask": (lowest_float_as_mask, {}, "values"),
    "items below half the lowest float read as masked": (
        below_half_the_lowest_float_as_mask, {"dtype": "float16"}, "values"),
    "negative and zero strides refused": (refuses_negative_and_zero_strides, {}, "dtype_shape"),
    "rows of a negative-stride view returned reversed": (
        rows_reversed_under_a_negative_stride, {"dtype": "float32"}, "dtype_shape"),
    "float mask entries below half the lowest float read as -inf": (
        attention_lowest_float_mask_dropped, {"kind": "attention", "schedule": Constant(1)},
        "attention_masks"),
    # classic mistakes
    "one entropy for the whole batch": (batch_global_entropy, _A, "batch_independence"),
    "beta below 1 (no max(P, 1))": (beta_below_one, _A, "temperature_cap"),
    "threshold dropped": (threshold_ignored, _A, "schedules"),
    "entropy in bits": (entropy_log2, {"kind": "entropy"}, "values"),
    "schedule fed the entropy in bits": (adaptive_log2_entropy, _A, "branch_points"),
    "entropy without the log-normaliser": (entropy_without_normaliser, {"kind": "entropy"},
                                           "values"),
    "no max subtraction": (no_max_subtraction, {"kind": "softmax"}, "values"),
    "no max subtraction, float32": (no_max_subtraction, {"dtype": "float32"}, "invariances"),
    "online softmax without rescaling": (online_without_rescaling, {"dtype": "float32"},
                                         "values"),
    "softmax along the wrong axis": (wrong_axis, {"dtype": "float32"}, "values"),
    "epsilon added to the normaliser": (epsilon_in_denominator, {}, "values"),
    "float16 accumulation on long rows": (half_accumulation, {"dtype": "float16"}, "long_rows"),
    "attention ignoring is_causal": (attention_ignores_causal, {"kind": "attention"},
                                     "attention_causal"),
    "attention ignoring the mask": (attention_ignores_mask, {"kind": "attention"},
                                    "attention_masks"),
    "plain attention checked as adaptive": (softmax_attention, {"kind": "attention"},
                                            "attention_values"),
    "attention reading views as contiguous memory": (
        attention_assuming_contiguous, {"kind": "attention"}, "attention_layouts"),
    "torch attention reading views as contiguous memory": (
        torch_attention_assuming_contiguous,
        {"kind": "attention", "framework": "torch", "dtype": "float32"}, "attention_layouts"),
    "causal mask applied before the scale": (
        attention_masking_before_scale, {"kind": "attention"}, "attention_causal"),
    "additive mask read as a boolean one": (
        attention_additive_mask_as_boolean, {"kind": "attention"}, "attention_masks"),
    "batched mask read at its first entry": (
        attention_first_mask_for_every_entry, {"kind": "attention"}, "attention_masks"),
    "causal mask aligned to the bottom right": (
        attention_causal_bottom_right, {"kind": "attention"}, "attention_causal"),
    "rows in groups, the partial last group never computed": (
        softmax_grouped_rows, {"dtype": "float32"}, "many_rows"),
    "attention slices in groups, the partial last group never computed": (
        attention_grouped_slices, {"kind": "attention"}, "attention_batch"),
    "online softmax losing the scale of its last, partial block": (
        online_tail_unscaled, {"dtype": "float32"}, "long_rows"),
    "blocked attention losing the scale of its last, partial key block": (
        attention_tail_unscaled, {"kind": "attention"}, "attention_batch"),
    "split softmax giving NaN on a fully masked block": (
        split_softmax_nan_on_masked_block, {"dtype": "float32"}, "long_rows"),
    "split attention giving NaN on a fully masked block of keys": (
        attention_nan_on_masked_key_block, {"kind": "attention"}, "attention_masks"),
    "LogLength given the row's length, masked items counted": (
        loglength_counting_masked, _A, "schedules"),
    "attention's LogLength given every key, masked ones counted": (
        attention_loglength_counting_masked, {"kind": "attention"}, "attention_masks"),
    "a result that changes from call to call": (every_fifth_call_reversed, {}, "values"),
    "last item dropped from the normaliser for 49 to 4095 items": (
        softmax_last_item_dropped_mid_lengths, {"dtype": "float32"}, "long_rows"),
    "partial last block of a million keys dropped from the normaliser": (
        softmax_partial_block_dropped, {"dtype": "float32"}, "million_row"),
    "numbers beside a NaN in a special row": (numbers_beside_nan, {}, "special_values"),
    "attention mask applied as -1e4": (
        attention_mask_as_minus_1e4, {"kind": "attention"}, "attention_masks"),
    "attention output with NaN replaced by 0": (
        attention_nan_zeroed, {"kind": "attention"}, "attention_special_values"),
    "attention keys holding NaN silently dropped": (
        attention_nan_keys_dropped, {"kind": "attention"}, "attention_special_values"),
    "grouped-query heads paired h % Hk, not h // (Hq / Hk)": (
        attention_gqa_heads_modulo, {"kind": "attention"}, "attention_batch"),
    "split softmax over blocks of 8192, NaN on a fully masked block": (
        split_softmax_8192_nan_on_masked_block, {"dtype": "float32"}, "long_rows"),
    "chunked attention over 1024 keys, NaN on a fully masked chunk": (
        attention_nan_on_masked_key_chunk_1024, {"kind": "attention"}, "attention_masks"),
    "rows of 65 to 128 items normalised over their first 64": (
        softmax_warp_rows_first_64, {"dtype": "float32"}, "long_rows"),
    "rows of a batch view read at one row stride": (
        softmax_one_row_stride, {"dtype": "float32"}, "dtype_shape"),
    "query tiles of 256, the partial last tile never computed": (
        attention_query_tiles_floor, {"kind": "attention"}, "attention_batch"),
    "a per-head mask read at head 0": (
        attention_mask_head_0, {"kind": "attention"}, "attention_masks"),
    "one query (a decoding step) ignoring is_causal": (
        attention_decode_ignores_causal, {"kind": "attention"}, "attention_causal"),
    "a masked path that drops scale=": (
        attention_masked_path_default_scale, {"kind": "attention"}, "attention_masks"),
    "the grouped-query path dropping the mask and the scale": (
        attention_gqa_path_drops_mask_and_scale, {"kind": "attention"}, "attention_batch"),
    "a float mask clamped at -1e4": (
        attention_additive_mask_clamped, {"kind": "attention"}, "attention_masks"),
    "no keys: the output returned unwritten": (
        attention_no_keys_unwritten, {"kind": "attention"}, "attention_special_values"),
    "torch operand read from its storage's start": (
        torch_storage_offset_dropped, {"framework": "torch", "dtype": "float32"},
        "dtype_shape"),
    "torch heads flattened with view(-1, L, d)": (
        torch_attention_heads_viewed,
        {"kind": "attention", "framework": "torch", "dtype": "float32",
         "schedule": Constant(1)}, "attention_layouts"),
    "attention exponentiating logits without subtracting the maximum": (
        attention_exp_without_max, {"kind": "attention", "schedule": Constant(1)},
        "attention_batch"),
    "attention keeping the maximum of its first key block (no rescaling)": (
        torch_attention_first_block_maximum,
        {"kind": "attention", "framework": "torch", "dtype": "float32", "schedule": Constant(1)},
        "attention_batch"),
    "rows past CUDA's grid limit of 65535 never written": (
        rows_past_the_grid_limit_unwritten, {"dtype": "float32"}, "many_rows"),
    "attention slices past CUDA's grid limit of 65535 never written": (
        attention_slices_past_the_grid_limit_unwritten, {"kind": "attention"}, "attention_batch"),
    "a compiled variant cached by shape, the dtype left out of the key": (
        torch_variant_cached_by_shape, {"framework": "torch", "dtype": "float32"},
        "dtype_shape"),
    # kernels whose values are right but whose memory is not
    "result written into the input": (softmax_in_place, {"dtype": "float32"}, "values"),
    "output buffer reused between calls": (reused_output_buffer, {}, "fresh_results"),
    "torch output buffer reused between calls": (
        torch_reused_output_buffer, {"framework": "torch", "dtype": "float32"}, "fresh_results"),
    "attention output buffer reused between calls": (
        attention_reused_output_buffer, {"kind": "attention"}, "fresh_results"),
    "a pool of two output buffers used in turn": (output_pool_of_two, {}, "fresh_results"),
    "a workspace reused for results of 4096 elements or more": (
        workspace_for_large_results, {}, "fresh_results"),
    "attention's workspace reused from 64 keys on": (
        attention_workspace_for_long_keys, {"kind": "attention"}, "fresh_results"),
    # paths a torch kernel takes only in training (inputs requiring grad) or inference
    "torch softmax in the input's memory under no_grad": (
        torch_softmax_in_place_under_no_grad, {"framework": "torch", "dtype": "float32"},
        "dtype_shape"),
    "torch softmax in float32 when the input requires grad": (
        torch_softmax_float32_when_training, {"framework": "torch", "dtype": "float64"},
        "dtype_shape"),
    "torch attention scaling q in place under no_grad": (
        torch_attention_scaling_q_in_place_under_no_grad,
        {"kind": "attention", "framework": "torch", "dtype": "float32"}, "attention_layouts"),
    "torch attention in float32 when q, k, v require grad": (
        torch_attention_float32_when_training,
        {"kind": "attention", "framework": "torch", "dtype": "float64"}, "attention_layouts"),
    # round four: maxima, special rows and schedules the default run left out
    "maximum of the first block, never rescaled": (
        softmax_first_block_max, {"dtype": "float32"}, "long_rows"),
    "tail items left out of the maximum": (softmax_tail_left_out_of_max, {}, "long_rows"),
    "a fast path for one-item rows": (
        softmax_one_item_fast_path, {"dtype": "float32"}, "special_values"),
    "fully masked long rows without the 0/0 guard": (
        entropy_long_rows_without_guard, {"kind": "entropy"}, "special_values"),
    "beta times masked items (0 * -inf at beta = 0)": (
        adaptive_scales_masked_items, _A, "schedules"),
    "user polynomial without max(P, 1)": (adaptive_polynomial_without_clamp, _A, "schedules"),
    "rows of 32769 to 65536 items normalised by half their sum": (
        softmax_second_template_half_sum, {"dtype": "float32"}, "long_rows"),
    # round five: the spec's other entropy mode, entropy_eps= taken but not honoured
    "entropy_eps taken and dropped": (adaptive_ignoring_entropy_eps, _A, "branch_points"),
    "entropy guard written as a clamp": (
        entropy_guard_as_clamp, {"kind": "entropy"}, "branch_points"),
    "attention taking entropy_eps and dropping it": (
        attention_ignoring_entropy_eps, {"kind": "attention"}, "attention_batch"),
    # round five: a path chosen by size or by call, and inputs the fixed cases lacked
    "causal mask aligned bottom right on a long-key path": (
        attention_long_causal_bottom_right, {"kind": "attention"}, "attention_causal"),
    "LogLength counting the keys of boolean masks alone": (
        attention_loglength_boolean_keys, {"kind": "attention"}, "attention_masks"),
    "long rows with the paper's schedule built in": (
        adaptive_long_rows_paper_schedule, _A, "schedules"),
    "long rows dropping entropy_eps": (
        entropy_long_rows_drop_eps, {"kind": "entropy"}, "branch_points"),
    "no max subtraction for large batches": (
        softmax_many_rows_no_max, {"dtype": "float32"}, "many_rows"),
    "-inf as -1e4 for large batches": (softmax_many_rows_mask_as_minus_1e4, {}, "many_rows"),
    "no max subtraction for many slices": (
        attention_many_slices_no_max, {"kind": "attention"}, "attention_batch"),
    "a float mask's values dropped on long keys": (
        attention_long_keys_mask_finiteness, {"kind": "attention"}, "attention_masks"),
    "an autotuned variant without the max, from a shape's second call": (
        attention_autotuned_no_max, {"kind": "attention"}, "attention_batch"),
    "k and v read at slice i % n when they broadcast": (
        attention_broadcast_modulo, {"kind": "attention"}, "attention_layouts"),
    # round six: more paths chosen by size, each dropping or misreading one argument
    "is_causal dropped for many slices": (
        attention_many_slices_drop_causal, {"kind": "attention"}, "attention_batch"),
    "the first slice's mask for many slices": (
        attention_many_slices_first_mask, {"kind": "attention"}, "attention_batch"),
    "query tiles reading the first tile's mask rows": (
        attention_query_tiles_mask_offset, {"kind": "attention"}, "attention_masks"),
    "a head-dim block of 64 with no loop": (
        attention_head_dim_block_64, {"kind": "attention"}, "attention_batch"),
    "scale= dropped on long unmasked keys": (
        attention_long_keys_drop_scale, {"kind": "attention"}, "attention_batch"),
    "grouped heads paired modulo on long keys": (
        attention_gqa_long_keys_modulo, {"kind": "attention"}, "attention_batch"),
    "one key returning its value": (
        attention_one_key_returns_value, {"kind": "attention"}, "attention_masks"),
    "a decoding step returning a static buffer": (
        attention_decode_static_buffer, {"kind": "attention"}, "fresh_results"),
    "the paper's schedule for large batches": (
        adaptive_many_rows_paper_schedule, _A, "schedules"),
    "the paper's schedule for rows split past 65536 items": (
        adaptive_split_rows_paper_schedule, _A, "schedules"),
    "the paper's schedule on long unmasked keys": (
        attention_long_keys_paper_schedule, {"kind": "attention"}, "attention_batch"),
    "entropy_eps dropped for rows split past 65536 items": (
        entropy_split_rows_drop_eps, {"kind": "entropy"}, "branch_points"),
    "entropy_eps dropped for large batches": (adaptive_many_rows_drop_eps, _A, "branch_points"),
    # round seven: torch paths for inference or training, and torch's global settings
    "an inference path without the running sum's rescaling": (
        torch_softmax_inference_no_rescale, {"framework": "torch", "dtype": "float32"},
        "dtype_shape"),
    "an inference path returning a static buffer": (
        torch_softmax_inference_static_buffer, {"framework": "torch", "dtype": "float32"},
        "fresh_results"),
    "a causal mask aligned bottom right at inference": (
        torch_attention_inference_bottom_right,
        {"kind": "attention", "framework": "torch", "dtype": "float32"}, "attention_layouts"),
    "scale= dropped at inference": (
        torch_attention_inference_drops_scale,
        {"kind": "attention", "framework": "torch", "dtype": "float32"}, "attention_layouts"),
    "a training path masking with finfo.min": (
        torch_softmax_training_finfo_min, {"framework": "torch", "dtype": "float32"},
        "dtype_shape"),
    "torch's grad mode switched off and left off": (
        torch_softmax_leaves_grad_disabled, {"framework": "torch", "dtype": "float32"},
        "values"),
    "torch's default dtype changed and left so": (
        torch_softmax_leaves_default_dtype, {"framework": "torch", "dtype": "float32"},
        "values"),
    # kernels whose values are right but which change the process around them
    "flush-to-zero switched on and left on": (
        torch_flush_to_zero, {"framework": "torch", "dtype": "float32"}, "values"),
    "numpy.seterr(all='raise') left set": (numpy_errors_raised_and_left, {}, "values"),
    "numpy.seterr(all='ignore') left set": (numpy_errors_silenced_and_left, {}, "values"),
    # round eight: the shapes production kernels pick their fast paths on
    "a fused path without the maximum, for evenly divided batches": (
        softmax_fused_without_max, {"dtype": "float32"}, "many_rows"),
    "the temperature left out of the fused path for evenly divided batches": (
        adaptive_fused_without_temperature, _A, "many_rows"),
    "a plain tuned path for head dims 64 and 128": (
        attention_tuned_head_dims_plain, {"kind": "attention"}, "attention_values"),
    "a tuned path for head dims 64 and 128 dropping mask=": (
        attention_tuned_head_dims_drop_mask, {"kind": "attention"}, "attention_values"),
    # round eight: what a kernel derived from an operand, kept by the operand's identity
    "a softmax memoised by its logits' identity": (
        softmax_memoised_by_identity, {}, "fresh_results"),
    "a boolean mask's additive form cached by its address": (
        torch_attention_mask_cached_by_pointer,
        {"kind": "attention", "framework": "torch", "dtype": "float32", "schedule": Constant(1)},
        "fresh_results"),
}  # fmt: skip


def example(module, func):
    """A kernel of docs/examples/ (imported from its file)."""
    import importlib.util
    import pathlib
    import sys

    if module not in sys.modules:
        path = pathlib.Path(__file__).resolve().parents[2] / "docs" / "examples" / f"{module}.py"
        spec = importlib.util.spec_from_file_location(module, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[module] = mod
        spec.loader.exec_module(mod)
    return getattr(sys.modules[module], func)


#: Correct kernels (name -> (module, function, Target options)): the default run raises no
#: alarm. The examples of docs/examples/ and the 16-bit kernels that round their scaled logits
#: once; tests/test_conformance.py runs numpy, scipy and torch kernels in every dtype.
CORRECT = {
    "docs/examples my_softmax.softmax, float32": ("my_softmax", "softmax", {"dtype": "float32"}),
    "docs/examples my_softmax.entropy, float64": ("my_softmax", "entropy", {"kind": "entropy"}),
    "docs/examples torch_adaptive.adaptive_softmax, bfloat16": (
        "torch_adaptive", "adaptive_softmax", {**_A, "dtype": "bfloat16", "framework": "torch"}),
    "the paper's listing natively in float16, the maximum subtracted first": (
        "tests.support.broken_kernels", "listing_native_16bit", {**_A, "dtype": "float16"}),
    "the paper's listing natively in bfloat16 (torch), the maximum subtracted first": (
        "tests.support.broken_kernels", "torch_listing_native_16bit",
        {**_A, "dtype": "bfloat16", "framework": "torch"}),
}  # fmt: skip


def correct_kernel(name):
    """The kernel of a :data:`CORRECT` entry and its ``pkg.mod:func`` name."""
    module, func, _ = CORRECT[name]
    if module == "tests.support.broken_kernels":
        return globals()[func], f"{module}:{func}"
    return example(module, func), f"{module}:{func}"


# -- the mutation score of the docs ---------------------------------------------------

#: Where the measured mutation score is kept (read by docs/testing.rst, checked by the tests).
SCORE_FILE = "docs/testing/mutation_score.json"


def _options(opts):
    return {
        "kind": opts.get("kind", "softmax"),
        "dtype": opts.get("dtype", "float64"),
        "framework": opts.get("framework", "numpy"),
    }


def score_entry(name, prop, status):
    """The record of one catalogue entry in :data:`SCORE_FILE`."""
    kernel, opts, _ = CATALOGUE[name]
    return {"kernel": kernel.__name__, **_options(opts), "property": prop, "status": status}


def measure_score():
    """Run the catching property of every defect and the default run of every correct kernel."""
    from softmaxtheory import conformance as conf

    defects = {}
    for name, (kernel, opts, prop) in CATALOGUE.items():
        target = conf.Target(kernel, f"tests.support.broken_kernels:{kernel.__name__}", **opts)
        defects[name] = score_entry(name, prop, conf.run_property(prop, target).status)
    correct = {}
    for name, (_, _, opts) in CORRECT.items():
        kernel, path = correct_kernel(name)
        target = conf.Target(kernel, path, **opts)
        failed = [r.name for r in conf.run_conformance(target) if r.status == "fail"]
        correct[name] = {"kernel": path, **_options(opts), "failed": failed}
    return {"defects": defects, "correct": correct}


if __name__ == "__main__":  # python -m tests.support.broken_kernels: rewrite SCORE_FILE
    import json
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[2] / SCORE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(measure_score(), indent=1) + "\n")
    print(f"wrote {path}")
