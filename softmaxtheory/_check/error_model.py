r"""The error model of :mod:`softmaxtheory.testing` (private; numpy only).

Everything here is derived in the documentation page *The error model*:

* the kernel's output format (bfloat16 too) and its internal working precision
  are a :class:`softmaxtheory._formats.Format` (``fmt.internal``);
* :func:`ulp` and :func:`ulp_error` measure errors in units in the last place;
* ``*_bound`` compute the a-priori bound of each output element from the input
  alone (conditioning of the element, length of the row, schedule);
* ``naive_*`` compute the naive same-precision algorithm (the baseline rule).

The bounds are first order in the unit roundoff :math:`u` and are turned into
relative errors with :math:`e^{r} - 1` (so that a large :math:`r` stays an
upper bound).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .._formats import NUMPY_DTYPES, Format
from ..spec import Constant, LogLength, Polynomial, Schedule

__all__ = [
    "BETA_MAX",
    "C_EXP",
    "LAMBDA",
    "SLACK",
    "RowConditioning",
    "abs_error",
    "adaptive_rel_error",
    "attention_bound",
    "attention_entropy_error",
    "beta_error",
    "entropy_abs_error",
    "logit_rounding_entropy_error",
    "logit_rounding_rel_error",
    "naive_adaptive_softmax",
    "naive_attention",
    "naive_beta",
    "naive_entropy",
    "naive_softmax",
    "near_jump",
    "perturbed_logits_rel_error",
    "round_to_format",
    "row_conditioning",
    "rule_jumps",
    "softmax_rel_error",
    "summation_factor",
    "ulp",
    "ulp_error",
]

#: An upper bound of the paper schedule's largest β (2.4213877..., theorem T6).
BETA_MAX = 2.4214

#: Error allowed in an ``exp`` or ``log`` evaluation, in units of :math:`u`.
C_EXP = 4.0
#: Confidence parameter of the probabilistic summation bound (Higham and Mary).
LAMBDA = 8.0
#: Safety factor applied to every first-order bound.
SLACK = 2.0


def ulp(ref: np.ndarray, fmt: Format) -> np.ndarray:
    r"""Spacing of `fmt` at each value of `ref`: :math:`2^{\max(e, e_{\min}) - p + 1}`.

    For zero, the smallest subnormal. Infinite or NaN values give NaN.
    """
    ref = np.asarray(ref, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        _, e = np.frexp(np.where(np.isfinite(ref), ref, 1.0))
        expo = np.maximum(e.astype(np.int64) - 1, fmt.emin) - fmt.precision + 1
        expo = np.where(ref == 0, fmt.qmin, expo)
        out = np.ldexp(1.0, expo)
    return np.where(np.isfinite(ref), out, np.nan)


def abs_error(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """``|got - ref|``; 0 for identical specials, inf for mismatches.

    Two NaNs, or two equal infinities, count as equal; any other pair with a
    non-finite member is an infinite error.
    """
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    same = (got == ref) | (np.isnan(got) & np.isnan(ref))
    finite = np.isfinite(got) & np.isfinite(ref)
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(got - ref)
    return np.where(same, 0.0, np.where(finite, d, np.inf))


def ulp_error(got: np.ndarray, ref: np.ndarray, fmt: Format) -> np.ndarray:
    """:func:`abs_error` in ulps of `fmt` at `ref` (0 and inf kept as they are)."""
    d = abs_error(got, ref)
    with np.errstate(invalid="ignore", over="ignore"):
        err = d / ulp(ref, fmt)
    return np.where(d == 0, 0.0, np.where(np.isfinite(d), err, np.inf))


def round_to_format(a: np.ndarray, fmt: Format) -> np.ndarray:
    """Round float64 values to `fmt` (nearest even) and return them as float64."""
    a = np.asarray(a, dtype=np.float64)
    if fmt.name in NUMPY_DTYPES:
        with np.errstate(over="ignore"):
            return a.astype(fmt.name).astype(np.float64)
    # bfloat16: round the float32 value to 8 significant bits, nearest even
    with np.errstate(over="ignore"):
        f = a.astype(np.float32)
    bits = f.view(np.uint32).astype(np.uint64)
    finite = np.isfinite(f)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    out = np.where(finite, rounded, bits).astype(np.uint32).view(np.float32)
    return out.astype(np.float64)


def summation_factor(n: np.ndarray | int) -> np.ndarray:
    r"""Growth factor :math:`\sigma(n)` of a sum of :math:`n` positive terms, in units of :math:`u`.

    :math:`\sigma(n) = \min(n - 1, \lambda\sqrt{n}) + 1`: the worst case of any
    summation order for short sums, the probabilistic bound of Higham and Mary
    (2019) with :math:`\lambda` = :data:`LAMBDA` for long ones.
    """
    n = np.maximum(np.asarray(n, dtype=np.float64), 1.0)
    return np.minimum(n - 1.0, LAMBDA * np.sqrt(n)) + 1.0


@dataclass
class RowConditioning:
    """Float64 quantities of each row that the bounds depend on (shape ``(..., n)`` or ``(...)``).

    Computed from the input only, never from the kernel's output.
    """

    z: np.ndarray  #: x - max x (0 at masked items)
    absx: np.ndarray  #: |x| (0 at masked items)
    absm: np.ndarray  #: |max x| per row
    p: np.ndarray  #: softmax
    H: np.ndarray  #: entropy per row
    n_eff: np.ndarray  #: unmasked items per row
    live: np.ndarray  #: False at masked items
    regular: np.ndarray  #: row is regular (finite, at least one unmasked item)
    entropy_eps: float = 0.0  #: the mode of `H` (a guarded entropy may be negative)


def row_conditioning(x: np.ndarray, entropy_eps: float = 0.0) -> RowConditioning:
    """Compute :class:`RowConditioning` of float64 logits `x` of shape ``(..., n)``."""
    x = np.asarray(x, dtype=np.float64)
    live = x > -np.inf
    finite = ~np.any(np.isnan(x) | (x == np.inf), axis=-1)
    n_eff = np.sum(live, axis=-1)
    regular = finite & (n_eff > 0)
    xs = np.where(live & regular[..., None], x, 0.0)
    m = np.max(np.where(live, xs, -np.inf), axis=-1, initial=-np.inf)
    m = np.where(regular, m, 0.0)
    z = np.where(live, xs - m[..., None], 0.0)
    with np.errstate(under="ignore"):
        e = np.where(live & regular[..., None], np.exp(z), 0.0)
    s = np.sum(e, axis=-1)
    p = e / np.where(s > 0, s, 1.0)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        if entropy_eps:
            terms = -p * np.log(p + entropy_eps)
        else:
            terms = np.where(p > 0, -p * np.log(np.where(p > 0, p, 1.0)), 0.0)
    H = np.where(regular, np.sum(terms, axis=-1), 0.0)
    return RowConditioning(z, np.abs(xs), np.abs(m), p, H, n_eff, live, regular, entropy_eps)


def softmax_rel_error(
    cond: RowConditioning, beta: np.ndarray, u: float, scale_first: bool, fmax: float = math.inf
) -> np.ndarray:
    r"""Relative error bound (in units of 1) of :math:`\operatorname{softmax}(\beta x)_i`, β exact.

    .. math::

        r_i = u\,\bigl(a_i + \textstyle\sum_j q_j a_j + 2C_{\exp} + \sigma(n) + 2\bigr),
        \qquad a_i = 2\beta|z_i| \;(+\,2\beta(|x_i| + |m|) \text{ if scaled first})

    where :math:`q = \operatorname{softmax}(\beta x)`. Scaling first is allowed for a
    row only where :math:`\beta \max_j |x_j| \le` `fmax`: beyond, :math:`\beta x`
    overflows, which is no rounding (the listing gives NaN, or zeros at the bottom of
    the range, where the weights of tied logits are uniform).
    """
    b = np.asarray(beta, dtype=np.float64)[..., None]
    with np.errstate(over="ignore", invalid="ignore"):
        a = 2.0 * b * np.abs(cond.z)
        if scale_first:
            fits = _scaled_fits(cond, b, fmax)
            a = a + np.where(fits, 2.0 * b * (cond.absx + cond.absm[..., None]), 0.0)
        q = _softmax_beta(cond, b)
        mean_a = _weighted(q, a)
        sigma = summation_factor(cond.n_eff)[..., None]
        d = u * a
        # |x_j| <= |z_j| + |m|: d_j <= 4u (beta |z_j| + beta |m|) either way
        top = _moved_logits(cond, b, d, 4.0 * u)
        shift = perturbed_logits_rel_error(cond, b, q, d, u * (a + mean_a), top)
    return shift + u * (2.0 * C_EXP + sigma + 2.0)


def _scaled_fits(cond: RowConditioning, b: np.ndarray, fmax: float) -> np.ndarray:
    r"""Whether :math:`\beta x_j` stays within `fmax` for every live item (shape ``(..., 1)``)."""
    with np.errstate(over="ignore", invalid="ignore"):
        top = np.max(np.where(cond.live, cond.absx, 0.0), axis=-1, keepdims=True, initial=0.0)
        return b * top <= fmax


def _weighted(q: np.ndarray, v: np.ndarray) -> np.ndarray:
    r""":math:`\sum_j q_j v_j` along the last axis (shape ``(..., 1)``), a term of weight 0 being 0.

    A weight that underflows to 0 belongs to an item at least 745 nats below the row's
    maximum, where :math:`q_j v_j \le s e^{-s}` with :math:`s \ge 745` is below every
    float; its :math:`v_j` may be infinite there (a logit near :math:`-10^{308}` makes
    :math:`\beta|z_j|` overflow), and :math:`0 \cdot \infty` must not make the sum NaN.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        return np.sum(np.where(q > 0, q * v, 0.0), axis=-1, keepdims=True)


def _moved_logits(
    cond: RowConditioning, b: np.ndarray, d: np.ndarray, c: float, eta: float = 0.0
) -> np.ndarray:
    r"""An upper bound on each moved logit :math:`\beta z_j + d_j`, finite where it can be.

    Where the sum overflows (:math:`\beta|z_j|` beyond the float range, so
    :math:`d_j = \infty`), the callers' form of the perturbation, :math:`d_j \le
    c(\beta|z_j| + \beta|m|) + \eta` (:math:`z_j \le 0`), gives :math:`\beta z_j + d_j
    \le -\beta|z_j|(1 - c) + c\beta|m| + \eta`: :math:`-\infty` for such an item
    when :math:`\beta|m|` is finite, :math:`+\infty` (nothing known) otherwise.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        top = b * cond.z + d
        s = b * np.abs(cond.z)
        bm = b * cond.absm[..., None]
        safe = -s * (1.0 - c) + (c * bm + eta)
        top = np.where(np.isfinite(top), top, safe)
    return np.where(np.isnan(top), np.inf, top)


def perturbed_logits_rel_error(
    cond: RowConditioning,
    b: np.ndarray,
    q: np.ndarray,
    d: np.ndarray,
    first: np.ndarray,
    top: np.ndarray | None = None,
) -> np.ndarray:
    r"""Bound on :math:`|\Delta \log y_i|` when each logit :math:`w_j` moves by at most :math:`d_j`.

    With :math:`y = \operatorname{softmax}(w)`, :math:`q = y` unperturbed and
    :math:`c_j = \delta_j - \delta_i`, :math:`|c_j| \le d_i + d_j`,

    .. math::

        \Delta \log y_i = -\log\Bigl(q_i + \sum_{j \ne i} q_j e^{c_j}\Bigr),
        \qquad |\Delta \log y_i| \le -\log(1 - T_i),
        \quad T_i = e^{d_i} \sum_{j \ne i} q_j e^{d_j}

    (the sum lies in :math:`[1 - T_i, 1 + T_i]`; exact, not first-order). The
    result is the smaller of that and the first-order bound `first`
    (:math:`d_i + \sum_j q_j d_j`). It matters where one item dominates: a row
    with a single unmasked item is exactly 1 however its logit is perturbed
    (:math:`T = 0`), while the first-order terms grow with :math:`|x|` (a
    row ``[3.4e38]`` in float32 was allowed any answer).

    :math:`\sum_{j \ne i}` is formed in the log domain, excluding the row's
    largest term (a sum of the others, no cancellation) and bounded by the full
    sum for the other items; a non-finite intermediate gives
    :math:`T = \infty` (the first-order bound). `top`, when given, is an upper
    bound on :math:`\beta z_j + d_j` that stays finite where that sum overflows
    (:func:`_moved_logits`).
    """
    live = cond.live & cond.regular[..., None]
    with np.errstate(all="ignore"):
        if top is None:
            top = b * cond.z + d
        # log q_j from the logits: q_j may underflow where q_j e^{d_j} does not
        g = np.where(live, top - _log_sum(cond, b), -np.inf)
        m = np.max(g, axis=-1, keepdims=True, initial=-np.inf)
        t = np.where(live, np.exp(g - m), 0.0)
        is_top = np.zeros(g.shape, dtype=bool)
        if g.shape[-1]:
            is_top = np.arange(g.shape[-1]) == np.argmax(g, axis=-1)[..., None]
        # sums of positive terms: relative rounding error below sigma(n) * 2^-53
        grow = 1.0 + (summation_factor(cond.n_eff)[..., None] + 2.0) * 2.0**-52
        total = np.sum(t, axis=-1, keepdims=True) * grow
        others = np.sum(np.where(is_top, 0.0, t), axis=-1, keepdims=True) * grow
        log_r = m + np.log(np.where(is_top, others, total))
        big_t = np.exp(d + log_r)
        exact = -np.log1p(-np.minimum(big_t, 1.0))
        exact = np.where(np.isnan(exact), np.inf, exact)
    # one unmasked item: y = 1 exactly for any finite perturbation (no sum to form)
    exact = np.where((cond.n_eff == 1)[..., None] & live, 0.0, exact)
    return np.where(cond.live, np.minimum(first, exact), first)


def _log_sum(cond: RowConditioning, b: np.ndarray) -> np.ndarray:
    """``log sum_j exp(b z_j)`` over the unmasked items (shape ``(..., 1)``)."""
    live = cond.live & cond.regular[..., None]
    with np.errstate(all="ignore"):
        e = np.where(live, np.exp(b * cond.z), 0.0)
        s = np.sum(e, axis=-1, keepdims=True)
    return np.log(np.where(s > 0, s, 1.0))


def _softmax_beta(cond: RowConditioning, b: np.ndarray) -> np.ndarray:
    with np.errstate(under="ignore", invalid="ignore"):
        e = np.where(cond.live & cond.regular[..., None], np.exp(b * cond.z), 0.0)
    s = np.sum(e, axis=-1, keepdims=True)
    return e / np.where(s > 0, s, 1.0)


def entropy_abs_error(cond: RowConditioning, u: float, entropy_eps: float = 0.0) -> np.ndarray:
    r"""Absolute error bound of a row's entropy computed in unit roundoff `u`.

    .. math::

        \delta H = u\Bigl[\textstyle\sum_j p_j\, E_j\, \bigl(1 + |\log(p_j + \varepsilon)|\bigr)
        + (\sigma(n) + C_{\exp} + 2)(1 + H)\Bigr]

    with :math:`E_j = r_j / u` the softmax bound of item :math:`j` (β = 1).
    """
    r = softmax_rel_error(cond, np.ones(cond.H.shape), 1.0, scale_first=False)
    with np.errstate(divide="ignore"):
        lg = np.abs(np.log(np.where(cond.p + entropy_eps > 0, cond.p + entropy_eps, 1.0)))
    first = _weighted(cond.p, r * (1.0 + lg))[..., 0]
    sigma = summation_factor(cond.n_eff)
    return u * (first + (sigma + C_EXP + 2.0) * (1.0 + np.abs(cond.H)))


def _poly_parts(schedule: Polynomial) -> tuple[np.ndarray, float]:
    coeffs = np.array([float(c) for c in schedule.exact_coefficients])
    return coeffs, float(schedule.exact_threshold)


def beta_error(
    schedule: Schedule, cond: RowConditioning, dH: np.ndarray, u: float
) -> tuple[np.ndarray, np.ndarray]:
    r"""β of each row and the bound on the error of a computed β.

    :math:`\delta\beta = \max_\pm |\beta(H \pm 2\delta H) - \beta(H)|` (propagation of
    the entropy's error, jumps excluded) plus the evaluation error of β in
    unit roundoff `u`: :math:`(2d + 2)\,u \sum_k |c_k| H^{d-k}` for a degree-`d`
    polynomial, :math:`3u\beta` for the other schedules.

    Returns
    -------
    beta, dbeta : numpy.ndarray
        Shape ``(...)`` each.
    """
    H = cond.H
    beta = schedule.beta_float(H, cond.n_eff)
    if not schedule.needs_entropy:
        return beta, 3.0 * u * beta
    assert isinstance(schedule, Polynomial)
    coeffs, theta = _poly_parts(schedule)

    def smooth(h: np.ndarray) -> np.ndarray:
        # the branch of max(P, 1) without the threshold (a jump is handled by the caller)
        with np.errstate(over="ignore", invalid="ignore"):
            return np.maximum(np.polyval(coeffs, h), 1.0)

    hi = smooth(H + 2.0 * dH)
    # no entropy lies below 0, nor a guarded one below -log(1 + eps) > -eps
    lo = smooth(np.maximum(H - 2.0 * dH, -cond.entropy_eps))
    mid = smooth(H)
    prop = np.maximum(np.abs(hi - mid), np.abs(lo - mid))
    above = H + 2.0 * dH > theta
    prop = np.where(above, prop, 0.0)
    d = len(coeffs) - 1
    with np.errstate(over="ignore", invalid="ignore"):
        absval = np.polyval(np.abs(coeffs), np.abs(H) + 2.0 * dH)
        reach = np.maximum(np.polyval(coeffs, H + 2.0 * dH), np.polyval(coeffs, H)) > 1.0
    evaluation = np.where(above & (reach | (hi > 1.0)), (2 * d + 2) * u * absval, 0.0)
    return beta, prop + evaluation


def rule_jumps(schedule: Schedule) -> bool:
    """Whether `schedule`'s rule jumps at its threshold (a polynomial with P(τ) > 1)."""
    return isinstance(schedule, Polynomial) and (
        schedule.polynomial_exact(schedule.exact_threshold) > 1
    )


def near_jump(schedule: Schedule, H: np.ndarray, dH: np.ndarray) -> np.ndarray:
    r"""Rows whose entropy lies within its error bound of a threshold where the rule jumps.

    The rule jumps where :math:`P(\tau) > 1`, whether or not an exact entropy can
    reach :math:`\tau` (:meth:`~softmaxtheory.spec.Polynomial.jumps_for`): a
    kernel's computed entropy may fall on the other side of :math:`\tau` by its
    rounding error, as one of about :math:`-2 \cdot 10^{-16}` does for the row
    :math:`(0, -40)`, whose exact entropy :math:`1.7 \cdot 10^{-16}` is above a
    threshold of 0.
    """
    if not rule_jumps(schedule):
        return np.zeros(np.shape(H), dtype=bool)
    theta = float(schedule.exact_threshold)
    return np.abs(H - theta) <= 2.0 * dH + 4.0 * np.spacing(theta)


def adaptive_rel_error(
    cond: RowConditioning,
    beta: np.ndarray,
    dbeta: np.ndarray,
    u: float,
    scale_first: bool = True,
    fmax: float = math.inf,
) -> np.ndarray:
    r"""Relative error bound of each adaptive-softmax element.

    The softmax bound at the row's β (with `scale_first`, the allowance of a kernel
    that forms :math:`\beta x` before subtracting :math:`\beta m`, where that stays
    within `fmax`: the ``strict`` contract drops it) plus
    :math:`|z_i - \bar z_q|\,\delta\beta` with :math:`\bar z_q = \sum_j q_j z_j`.
    """
    r = softmax_rel_error(cond, beta, u, scale_first=scale_first, fmax=fmax)
    q = _softmax_beta(cond, np.asarray(beta)[..., None])
    zbar = _weighted(q, cond.z)
    with np.errstate(over="ignore", invalid="ignore"):
        return r + np.abs(cond.z - zbar) * np.asarray(dbeta)[..., None]


def logit_rounding_rel_error(
    cond: RowConditioning,
    beta: np.ndarray,
    dbeta: np.ndarray,
    fmt: Format,
) -> np.ndarray:
    r"""Relative error of :math:`\operatorname{softmax}(\beta x)_i` from one rounding of its logits.

    The default contract of 16-bit kernels: the logits of the final softmax,
    :math:`w_j = \beta x_j` or :math:`w_j = \beta (x_j - m)`, may be rounded once
    to `fmt`, :math:`\tilde w_j = w_j(1 + \epsilon_j) + \eta_j` with
    :math:`|\epsilon_j| \le u` and :math:`|\eta_j| \le 2^{q_{\min} - 1}`. Since
    :math:`\partial \log y_i / \partial w_j = [i = j] - q_j`,

    .. math::

        |\Delta \log y_i| \le u\Bigl(|w_i| + \sum_j q_j |w_j|\Bigr) + 2\eta,

    the larger of the two forms of :math:`w`. The unshifted form
    :math:`\beta x` counts only where the kernel's β may differ from 1 (``beta > 1``
    or ``dbeta > 0``): with β exactly 1 the logits are the input, exact in `fmt`.

    Parameters
    ----------
    cond : RowConditioning
        The rows.
    beta, dbeta : numpy.ndarray
        β of each row and the bound on its error, shape ``(...)``.
    fmt : Format
        The kernel's format.

    Returns
    -------
    numpy.ndarray
        Shape ``(..., n)``, in units of 1 (0 at masked items).
    """
    b = np.asarray(beta, dtype=np.float64)[..., None]
    q = _softmax_beta(cond, b)
    with np.errstate(over="ignore", invalid="ignore"):
        wz = b * np.abs(cond.z)
        shifted = wz + _weighted(q, wz)
        wx = b * cond.absx
        unshifted = wx + _weighted(q, wx)
    # (the unshifted form only where beta x does not overflow the format: no rounding there)
    scaled = ((np.asarray(beta) != 1.0) | (np.asarray(dbeta) > 0))[..., None]
    scaled = scaled & _scaled_fits(cond, b, fmt.max_finite)
    worst = np.where(scaled, np.maximum(shifted, unshifted), shifted)
    eta = math.ldexp(1.0, fmt.qmin - 1)
    with np.errstate(over="ignore", invalid="ignore"):
        d = fmt.u * np.where(scaled, np.maximum(wz, wx), wz) + eta
        # |x_j| <= |z_j| + |m|: d_j <= u (beta |z_j| + beta |m|) + eta
        top = _moved_logits(cond, b, d, fmt.u, eta)
        rel = perturbed_logits_rel_error(cond, b, q, d, fmt.u * worst + 2.0 * eta, top)
    return np.where(cond.live, rel, 0.0)


def logit_rounding_entropy_error(cond: RowConditioning, fmt: Format) -> np.ndarray:
    r"""Absolute error of a row's entropy from one rounding of its shifted logits to `fmt`.

    :math:`\partial H / \partial x_j = -p_j (z_j - \bar z)` with
    :math:`\bar z = \sum_k p_k z_k`, so rounding :math:`z_j = x_j - m` once
    (:math:`|\delta z_j| \le u|z_j| + 2^{q_{\min} - 1}`) moves :math:`H` by at most

    .. math::

        \sum_j p_j\, |z_j - \bar z|\, \bigl(u|z_j| + 2^{q_{\min} - 1}\bigr).

    (The unshifted logits are the input itself, exact in `fmt`.)
    """
    zbar = _weighted(cond.p, cond.z)
    eta = math.ldexp(1.0, fmt.qmin - 1)
    with np.errstate(over="ignore", invalid="ignore"):
        dz = fmt.u * np.abs(cond.z) + eta
        terms = np.abs(cond.z - zbar) * dz
    return _weighted(np.where(cond.live, cond.p, 0.0), terms)[..., 0]


def attention_entropy_error(
    logits: np.ndarray, logit_err: np.ndarray, entropy_eps: float, u: float
) -> tuple[RowConditioning, np.ndarray, np.ndarray]:
    r"""Each query's conditioning, its logits' errors and its entropy's error bound.

    The entropy of computed logits moves by at most :math:`\delta H` of
    :func:`entropy_abs_error` plus :math:`\sum_j p_j\, 2 e_j |z_j - \bar z|`, the
    first-order effect of logit errors :math:`e_j` (masked keys' errors count 0).

    Returns
    -------
    cond : RowConditioning
        The float64 conditioning of each query row of `logits`.
    ex : numpy.ndarray, shape (..., L, S)
        `logit_err` with 0 at the masked keys.
    dH : numpy.ndarray, shape (..., L)
        The entropy's absolute error bound.
    """
    cond = row_conditioning(logits, entropy_eps)
    ex = np.where(cond.live, logit_err, 0.0)
    with np.errstate(over="ignore", invalid="ignore"):
        spread = np.abs(cond.z - _weighted(cond.p, cond.z)) * 2 * ex
    dH = entropy_abs_error(cond, u, entropy_eps) + _weighted(cond.p, spread)[..., 0]
    return cond, ex, dH


def attention_bound(
    logits: np.ndarray,
    logit_err: np.ndarray,
    v: np.ndarray,
    schedule: Schedule,
    entropy_eps: float,
    fmt: Format,
) -> np.ndarray:
    r"""Absolute error bound of each attention output (before the final rounding).

    Parameters
    ----------
    logits : numpy.ndarray, shape (..., L, S)
        Float64 logits (``-inf`` masked).
    logit_err : numpy.ndarray, shape (..., L, S)
        Bound on the absolute error of each computed logit.
    v : numpy.ndarray, shape (..., S, dv)
        Values.

    Returns
    -------
    numpy.ndarray, shape (..., L, dv)
        :math:`\sum_j a_j |v_j| (r_j + \beta(e_j + \max_k e_k) + \sigma(S)u + u_{\text{out}})`.
    """
    ui = fmt.internal.u
    cond, ex, dH = attention_entropy_error(logits, logit_err, entropy_eps, ui)
    emax = np.max(ex, axis=-1, initial=0.0)
    beta, dbeta = beta_error(schedule, cond, dH, ui)
    r = adaptive_rel_error(cond, beta, dbeta, ui, fmax=fmt.internal.max_finite)
    r = SLACK * (r + 2.0 * beta[..., None] * (ex + emax[..., None]) + fmt.u)
    b = np.asarray(beta)[..., None]
    a = _softmax_beta(cond, b)
    sigma = summation_factor(cond.n_eff)[..., None]
    # a weight's error is a (e**r - 1). A key whose weight underflows to 0 (a = 0) may still
    # get a weight near 1 when its logit may move by more than its gap (r huge): there
    # 0 * inf was NaN, and the check fell back to a floor of 2 ulps. Such weights take the
    # bound from log a = β z - log s instead, at most 1 (both weights lie in [0, 1])
    live = cond.live & cond.regular[..., None]
    with np.errstate(over="ignore", invalid="ignore", under="ignore", divide="ignore"):
        moved = a * np.expm1(r)
        bz = np.where(live, b * cond.z, -np.inf)
        log_s = np.log(np.sum(np.exp(bz), axis=-1, keepdims=True))
        far = np.minimum(np.exp(bz - log_s + r), 1.0 + sigma * ui)
    moved = np.where(np.isfinite(moved) & (a > 0), moved, np.where(live, far, 0.0))
    # a computed weight lies in [0, 1] too: it moves by at most 1
    moved = np.minimum(moved, 1.0 + sigma * ui)
    weight = moved + a * (sigma * ui + fmt.u)
    finite = np.isfinite(v)
    absv = np.abs(np.where(finite, v, 0.0))
    bound = np.einsum("...ls,...sd->...ld", weight, absv)
    # and the output is a weighting of the values, computed or exact: both lie in the values'
    # range, up to the rounding of the weighted sum (a weighting of the live keys' values, which
    # the range of all of them holds). Where logits may move by more than their gaps, the sum
    # above exceeds the range: a float16 output of 60000 passed for values 1 and 2
    with np.errstate(invalid="ignore"):
        lo = np.min(np.where(finite, v, np.inf), axis=-2, keepdims=True, initial=np.inf)
        hi = np.max(np.where(finite, v, -np.inf), axis=-2, keepdims=True, initial=-np.inf)
    width = np.where(hi >= lo, hi - lo, 0.0)
    top = np.max(absv, axis=-2, keepdims=True, initial=0.0)
    hull = width * (1.0 + fmt.u) + (2.0 * sigma * ui + fmt.u) * top
    return np.minimum(bound, hull)


# ---------------------------------------------------------------------------
# the naive same-precision algorithms (the baseline rule)
# ---------------------------------------------------------------------------


def _work(x: np.ndarray, fmt: Format) -> np.ndarray:
    return np.asarray(x, dtype=np.float64).astype(fmt.internal.name)


def naive_softmax(x: np.ndarray, fmt: Format, beta: np.ndarray | None = None) -> np.ndarray:
    """Textbook softmax in the working precision: scale, subtract the max, exp, sequential sum.

    A row whose items are all masked (``-inf`` before scaling) gives zeros, as the table
    says; one whose finite logits all overflow to ``-inf`` when scaled (β x below the
    lowest float) gives NaN, as the listing does, and so no allowance: its zeros had let
    a kernel answer 0 for tied logits at the lowest float, whose weights are uniform.
    """
    w = _work(x, fmt)
    with np.errstate(all="ignore"):
        masked = np.all(w == -np.inf, -1, keepdims=True)
        if beta is not None:
            w = w * np.asarray(beta, dtype=w.dtype)[..., None]
        m = np.max(w, axis=-1, keepdims=True, initial=-np.inf)
        e = np.exp(w - m)
        s = np.cumsum(e, axis=-1)[..., -1:] if w.shape[-1] else np.zeros_like(m)
        y = e / s
        y = np.where(np.isnan(y) & masked, 0.0, y)
    return round_to_format(y, fmt)


def naive_entropy(x: np.ndarray, fmt: Format, entropy_eps: float = 0.0) -> np.ndarray:
    """Textbook entropy in the working precision, as float64 (not rounded to `fmt`)."""
    w = _work(x, fmt)
    t = w.dtype.type
    with np.errstate(all="ignore"):
        m = np.max(w, axis=-1, keepdims=True, initial=-np.inf)
        e = np.exp(w - m)
        s = np.cumsum(e, axis=-1)[..., -1:] if w.shape[-1] else np.ones_like(m)
        p = e / s
        if entropy_eps:
            terms = -p * np.log(p + t(entropy_eps))
        else:
            terms = np.where(p > 0, -p * np.log(np.where(p > 0, p, t(1))), t(0))
        H = np.cumsum(terms, axis=-1)[..., -1] if w.shape[-1] else np.zeros(w.shape[:-1], t)
        H = np.where(np.all(w == -np.inf, -1), t(0), H)
    return H.astype(np.float64)


def naive_beta(
    x: np.ndarray, fmt: Format, schedule: Schedule, entropy_eps: float = 0.0
) -> np.ndarray:
    """β in the working precision (Horner for polynomials)."""
    w = _work(x, fmt)
    t = w.dtype.type
    n_eff = np.sum(w > -np.inf, axis=-1)
    if isinstance(schedule, Polynomial):
        H = naive_entropy(x, fmt, entropy_eps).astype(t)
        coeffs, theta = _poly_parts(schedule)
        acc = np.zeros_like(H)
        with np.errstate(all="ignore"):
            for c in coeffs:
                acc = acc * H + t(c)
            return np.where(H > t(theta), np.maximum(acc, t(1)), t(1)).astype(np.float64)
    if isinstance(schedule, Constant):
        return np.full(w.shape[:-1], float(t(float(schedule.exact_beta))))
    if isinstance(schedule, LogLength):
        with np.errstate(divide="ignore"):
            b = t(float(schedule.exact_s)) * np.log(n_eff.astype(t))
        return np.where(n_eff == 0, 1.0, b).astype(np.float64)
    return schedule.beta_float(naive_entropy(x, fmt, entropy_eps), n_eff)


def naive_adaptive_softmax(
    x: np.ndarray, fmt: Format, schedule: Schedule, entropy_eps: float = 0.0
) -> np.ndarray:
    """The paper's listing in the working precision: ``softmax(beta * x)``."""
    return naive_softmax(x, fmt, naive_beta(x, fmt, schedule, entropy_eps))


def naive_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    keep: np.ndarray,
    add: np.ndarray,
    scale: float,
    schedule: Schedule,
    entropy_eps: float,
    fmt: Format,
) -> np.ndarray:
    """Attention as two matmuls in the working precision; logits and weights stored in `fmt`."""
    wt = fmt.internal.name
    with np.errstate(all="ignore"):
        logits = (_work(q, fmt) @ np.swapaxes(_work(k, fmt), -1, -2)) * np.asarray(scale, wt)
        logits = round_to_format(logits, fmt) + add
        logits = np.where(keep, logits, -np.inf)
        a = naive_adaptive_softmax(logits, fmt, schedule, entropy_eps)
        out = a.astype(wt) @ _work(v, fmt)
    return round_to_format(out, fmt)
