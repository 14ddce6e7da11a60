"""Kernels for the conformance suite's own tests: correct ones and deliberately broken ones.

Each broken kernel reproduces one defect class (PAPER.md's known port errors and
classic softmax bugs); tests/test_conformance_broken.py checks that the suite
catches each one and names the property that caught it.
"""

from __future__ import annotations

import numpy as np

from softmaxtheory.spec import PAPER_ENTROPY_EPS, PaperPolynomial, resolve_schedule

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


def adaptive_softmax(x, *, schedule=None, entropy_eps=0.0):
    """A correct adaptive softmax following the spec (max subtracted, then scaled)."""
    x = np.asarray(x)
    w = _work(x)
    schedule = resolve_schedule(schedule)
    H = _entropy(w, entropy_eps)
    b = _beta(H, np.sum(w > -np.inf, axis=-1), schedule, w.dtype)
    with np.errstate(invalid="ignore"):
        m = np.max(w, axis=-1, keepdims=True, initial=-np.inf)
        z = w - np.where(m == -np.inf, 0, m)
    return _softmax(b[..., None] * z).astype(x.dtype)


def adaptive_softmax_listing(x):
    """The paper's listing, softmax(beta * x), with its 1e-9 guard (correct with eps=1e-9)."""
    x = np.asarray(x)
    w = _work(x)
    H = _entropy(w, PAPER_ENTROPY_EPS)
    P = np.polyval(PAPER.astype(w.dtype), H)
    b = np.where(H > 0.5, np.maximum(P, 1), 1).astype(w.dtype)
    return _softmax(b[..., None] * w).astype(x.dtype)


def attention(q, k, v, mask=None, is_causal=False):
    """A correct adaptive attention (paper schedule), numpy."""
    q, k, v = (np.asarray(a) for a in (q, k, v))
    dt = q.dtype
    q, k, v = _work(q), _work(k), _work(v)
    logits = (q @ np.swapaxes(k, -1, -2)) * q.dtype.type(1 / np.sqrt(q.shape[-1]))
    L, S = logits.shape[-2:]
    keep = np.ones((L, S), bool)
    if is_causal:
        keep = np.tril(keep)
    if mask is not None:
        keep = keep & np.asarray(mask, bool)
    logits = np.where(keep, logits, -np.inf)
    a = adaptive_softmax(logits)
    return (a @ v).astype(dt)


def softmax_attention(q, k, v, mask=None, is_causal=False):
    """Plain attention (schedule constant:1)."""
    q, k, v = (np.asarray(a) for a in (q, k, v))
    logits = (q @ np.swapaxes(k, -1, -2)) / np.sqrt(q.shape[-1]).astype(q.dtype)
    if is_causal:
        logits = np.where(np.tril(np.ones(logits.shape[-2:], bool)), logits, -np.inf)
    if mask is not None:
        logits = np.where(np.asarray(mask, bool), logits, -np.inf)
    return (softmax(logits) @ v).astype(q.dtype)


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
