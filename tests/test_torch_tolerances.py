"""Derived a-priori error bounds for the torch path (helpers + checks of the helpers).

The derivation is written out in docs/torch.rst ("Derived tolerances"). Every
quantity is evaluated in float64 from the exact inputs (the tensors' binary
values) and the certified reference; the bound is first order, doubled to cover
the second-order terms.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from softmaxtheory.spec import Polynomial, Schedule, resolve_schedule  # noqa: E402

UNIT_ROUNDOFF = {
    torch.float64: 2.0**-53,
    torch.float32: 2.0**-24,
    torch.float16: 2.0**-11,
    torch.bfloat16: 2.0**-8,
}
SMALLEST_SUBNORMAL = {
    torch.float64: 2.0**-1074,
    torch.float32: 2.0**-149,
    torch.float16: 2.0**-24,
    torch.bfloat16: 2.0**-133,
}


def units(dtype: torch.dtype) -> tuple[float, float]:
    """(u of the input/output dtype, u of the statistics dtype)."""
    u = UNIT_ROUNDOFF[dtype]
    return u, (u if dtype == torch.float64 else 2.0**-24)


def beta_slope(schedule: Schedule, h: np.ndarray) -> np.ndarray:
    """|dβ/dH| (an upper bound at the kinks): |P'(H)| above the threshold, else 0."""
    schedule = resolve_schedule(schedule)
    if not isinstance(schedule, Polynomial):
        return np.zeros_like(h)
    coeffs = np.array([float(c) for c in schedule.exact_coefficients])
    slope = np.abs(np.polyval(np.polyder(coeffs), h)) if coeffs.size > 1 else np.zeros_like(h)
    return np.where(h > float(schedule.exact_threshold), slope, 0.0)


def _row_stats(x: np.ndarray, beta: np.ndarray):
    """Entropy of each row and the adaptive probabilities (float64, -inf masked)."""
    finite = np.isfinite(x)
    m = np.max(np.where(finite, x, -np.inf), axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    z = np.where(finite, x - m, 0.0)
    e = np.where(finite, np.exp(z), 0.0)
    s = np.maximum(e.sum(-1, keepdims=True), 1e-300)
    p = e / s
    h = -(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)).sum(-1)
    e2 = np.where(finite, np.exp(beta[..., None] * z), 0.0)
    pb = e2 / np.maximum(e2.sum(-1, keepdims=True), 1e-300)
    return z, h, pb, finite


def softmax_tolerance(
    x: np.ndarray, ref: np.ndarray, beta: np.ndarray, dtype: torch.dtype, schedule=None
) -> np.ndarray:
    r"""Absolute bound per element of adaptive_softmax (rows on the last axis).

    Relative error of :math:`e^{\beta z_j}`: :math:`\varepsilon_j = u_s(3 + 2|\beta z_j|)
    + |z_j|\,\delta\beta`, :math:`\delta\beta = |\beta'(H)|\,\gamma_n u_s (2 + \max|z|)`;
    output :math:`\le |y_i|\,2(\varepsilon_i + \max_j \varepsilon_j + \gamma_n u_s + u)
    + 2\,\mathrm{subnormal}`.
    """
    u, us = units(dtype)
    n = x.shape[-1]
    z, h, _, finite = _row_stats(x, beta)
    zmax = np.max(np.abs(z), axis=-1, keepdims=True)
    dh = n * us * (2.0 + zmax)
    dbeta = beta_slope(schedule, h)[..., None] * dh
    eps = us * (3.0 + 2.0 * np.abs(beta[..., None] * z)) + np.abs(z) * dbeta
    eps = np.where(finite, eps, 0.0)
    rel = eps + eps.max(-1, keepdims=True) + n * us + u
    return 2.0 * np.abs(ref) * rel + 2.0 * SMALLEST_SUBNORMAL[dtype]


def attention_tolerance(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    ref: np.ndarray,
    dtype: torch.dtype,
    *,
    keep: np.ndarray | None = None,
    add: np.ndarray | None = None,
    scale: float | None = None,
    schedule=None,
) -> np.ndarray:
    r"""Absolute bound per output element of adaptive attention (float64 arrays).

    Terms (first order, see docs/torch.rst): output rounding :math:`u|o|`; the
    weights rounded to the input dtype before the values product :math:`u V`;
    the scaled query :math:`\beta q` rounded to the input dtype and the logits'
    accumulation :math:`2(u + D u_s)\beta a V`; an additive mask's bias stored in the
    input dtype and added in the statistics, :math:`2(u + u_s)\beta \max|b| V`; the
    entropy's error
    :math:`\delta H \le 2u\,\mathrm{scale}\sum_d |q_d|\, E_p|k_d| +
    \gamma_S u_s(2 + \max|x|)` through :math:`|\beta'(H)|` and
    :math:`|\mathrm{Cov}_p(x, v)| \le \sqrt{\mathrm{Var}_p x\, \mathrm{Var}_p v}`; the softmax in
    statistics precision :math:`\gamma_S u_s(3 + 2\beta \max|z|) V`. Doubled. Underflow:
    :math:`S` smallest subnormals of the statistics dtype and two of the input dtype's.
    """
    u, us = units(dtype)
    d = q.shape[-1]
    S = k.shape[-2]
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    L = q.shape[-2]
    x = scale * np.einsum("...ld,...sd->...ls", q, k)
    a = abs(scale) * np.einsum("...ld,...sd->...ls", np.abs(q), np.abs(k))
    mask_keep = np.ones(x.shape[-2:], dtype=bool) if keep is None else keep
    if add is not None:
        x = x + add
        mask_keep = mask_keep & np.isfinite(add)
    mask_keep = np.broadcast_to(mask_keep, x.shape)
    x = np.where(mask_keep, x, -np.inf)
    # the largest bias of a query's unmasked keys: stored in the input dtype and added in the
    # statistics, it moves a logit by (u + u_s)|b| (a constant -1e4 on a row cancels
    # exactly, yet float32's s + b is a multiple of 2**-10)
    bias = 0.0 if add is None else np.abs(np.where(np.isfinite(add), add, 0.0))
    bmax = np.max(np.where(mask_keep, bias, 0.0), axis=-1)
    z, h, p, finite = _row_stats(x, np.ones(x.shape[:-1]))
    from softmaxtheory.spec import LogLength

    sched = resolve_schedule(schedule)
    n_eff = finite.sum(-1)
    beta = sched.beta_float(h, n_eff)
    if isinstance(sched, LogLength):
        beta = np.where(n_eff == 0, 1.0, beta)
    vabs = np.abs(v)
    vmax = np.max(np.where(finite[..., None], vabs[..., None, :, :], 0.0), axis=-2)
    amax = np.max(np.where(finite, a, 0.0), axis=-1)
    fm = np.where(finite, x, 0.0)
    spread = np.where(
        finite.any(-1),
        np.max(np.where(finite, x, -np.inf), -1) - np.min(np.where(finite, x, np.inf), -1),
        0.0,
    )
    xabs = np.max(np.abs(fm), -1)
    # pass 1: A = E_p[k] rounded to the input dtype, p rounded before the product
    ek = np.einsum("...ls,...sd->...ld", p, np.abs(k))
    dh = 2.0 * u * abs(scale) * np.sum(np.abs(q) * ek, -1) + S * us * (2.0 + xabs)
    dbeta = beta_slope(sched, h) * dh
    # |d out / d beta| = |Cov_pb(x, v)| <= sqrt(Var_pb(x) Var_pb(v)) (Cauchy-Schwarz)
    _, _, pb, _ = _row_stats(x, beta)
    zf = np.where(finite, z, 0.0)
    var_x = np.maximum((pb * zf**2).sum(-1) - (pb * zf).sum(-1) ** 2, 0.0)
    ev = np.einsum("...ls,...sc->...lc", pb, v)
    var_v = np.maximum(np.einsum("...ls,...sc->...lc", pb, v**2) - ev**2, 0.0)
    cov = np.sqrt(var_x[..., None] * var_v)
    terms = (
        u * np.abs(ref)
        + u * vmax
        + 2.0 * (u + d * us) * (beta * amax)[..., None] * vmax
        + 2.0 * (u + us) * (beta * bmax)[..., None] * vmax
        + dbeta[..., None] * cov
        + S * us * (3.0 + 2.0 * beta * spread)[..., None] * vmax
    )
    del L
    # underflow: each of the S products p_j v_jc rounds to the statistics' subnormal grid
    # (half its step at most, doubled as the rest), the output to the input dtype's
    stats = torch.float64 if dtype == torch.float64 else torch.float32
    return 2.0 * terms + S * SMALLEST_SUBNORMAL[stats] + 2.0 * SMALLEST_SUBNORMAL[dtype]


def test_softmax_tolerance_tightens_with_precision():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 32)) * 3
    ref = np.exp(x) / np.exp(x).sum(-1, keepdims=True)
    beta = np.ones(4)
    t16 = softmax_tolerance(x, ref, beta, torch.float16)
    t32 = softmax_tolerance(x, ref, beta, torch.float32)
    t64 = softmax_tolerance(x, ref, beta, torch.float64)
    assert np.all(t64 < t32) and np.all(t32 < t16)
    # the bound is a few hundred ulps at most here, never vacuous
    assert np.all(t32 < 1e-3 * ref + 1e-30)


def test_attention_tolerance_is_not_vacuous():
    rng = np.random.default_rng(1)
    q, k, v = (rng.normal(size=(2, 8, 16)) for _ in range(3))
    ref = np.zeros((2, 8, 16))
    tol = attention_tolerance(q, k, v, ref, torch.bfloat16)
    assert np.all(tol > 0)
    assert np.all(tol < 0.5 * np.abs(v).max())  # smaller than the values' size
    tol32 = attention_tolerance(q, k, v, ref, torch.float32)
    assert np.all(tol32 < 1e-3)


def test_attention_tolerance_covers_a_constant_bias():
    """A constant -1e4 on one row of an additive mask cancels exactly, but float32 rounds
    s + b to a multiple of 2**-10: every backend, plain attention included, was 4.7 times
    the bound on that row, which had no term for the bias."""
    from softmaxtheory import reference
    from softmaxtheory.accelerated.torch import adaptive_attention
    from softmaxtheory.spec import Constant

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, n, d, generator=gen) for n, d in ((5, 16), (7, 16), (7, 3)))
    mask = torch.zeros(5, 7)
    mask[2] = -1e4
    q64, k64, v64, m64 = (t.double().numpy() for t in (q, k, v, mask))
    for schedule in (Constant(1), None):
        ref = reference.adaptive_attention(q64, k64, v64, mask=m64, schedule=schedule)
        tol = attention_tolerance(q64, k64, v64, ref, torch.float32, add=m64, schedule=schedule)
        out = adaptive_attention(q, k, v, mask, schedule=schedule, backend="composition")
        err = np.abs(out.double().numpy() - ref)
        assert np.all(err <= tol)
        assert err[0, 0, 2].max() > 1e-5  # the row is off by more than float32's usual error
        assert tol[0, 0, 2].max() < 0.05 * np.abs(v64).max()  # and the bound is not vacuous
