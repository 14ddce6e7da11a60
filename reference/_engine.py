r"""Error-bounded evaluation of one row at a given working precision.

Every quantity is computed with mpmath's raw arithmetic (``mpmath.libmp``) at
a working precision of :math:`p` bits, together with a rigorous bound on its
error, so that Ziv's rounding test (:func:`._rounding.round_ball`) can decide
the correctly rounded result. The bounds use:

* basic operations (``+ - * /``) of mpmath are correctly rounded: relative
  error at most :math:`u = 2^{-p}`; with ``prec=0`` they are exact;
* ``exp`` and ``log`` have relative error at most :math:`\kappa u` with
  :math:`\kappa = 8` (mpmath aims at < 1 ulp; eight is a safety margin);
* recursive summation of :math:`n` terms of one sign at :math:`p_s = p +
  \lceil\log_2(n+1)\rceil + 2` bits has relative error at most
  :math:`(n+1) 2^{-p_s} \le u/4`;
* items whose scaled logit :math:`y_i = \beta z_i` lies below :math:`-C` are
  *dead*: their coefficient is below :math:`e^{-C}`, far below half the least
  subnormal of the target format, and their mass is carried as an absolute
  error :math:`n_{\mathrm{dead}} e^{-C}` (and :math:`n_{\mathrm{dead}} C e^{-C}`
  in the entropy).

A bound is a pair (``rel``, ``extra_log2``): :math:`|v - \tilde v| \le
\mathrm{rel}\,|\tilde v| + 2^{\mathrm{extra}}`. Relative bounds never underflow,
so the subnormal range is handled exactly. Float arithmetic on bounds is made
safe by the factor ``SLACK`` applied at every step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
from mpmath.libmp import (
    finf,
    fone,
    from_float,
    from_int,
    from_man_exp,
    from_rational,
    fzero,
    mpf_abs,
    mpf_add,
    mpf_cmp,
    mpf_div,
    mpf_exp,
    mpf_log,
    mpf_mul,
    mpf_neg,
    mpf_sub,
    round_ceiling,
    round_floor,
    round_nearest,
    to_float,
)

from softmaxtheory.spec import Constant, LogLength, Polynomial, Schedule

__all__ = [
    "Ball",
    "ExpPass",
    "PreparedRow",
    "Undecided",
    "beta_ball",
    "coefficients",
    "cutoff",
    "entropy_ball",
    "entropy_nonneg",
    "exp_pass",
    "max_log2",
    "prepare_row",
]

RN = round_nearest
KAPPA = 8.0
SLACK = 1.0 + 2.0**-20


class Undecided(Exception):
    """The working precision cannot decide a branch (raise it and retry)."""


@dataclass(frozen=True)
class Ball:
    """A value with a rigorous error bound ``rel * |mid| + 2**extra_log2``."""

    mid: tuple
    rel: float
    extra_log2: int | None = None

    def abs_bound(self) -> float:
        """An upper bound of the absolute error, as a float (never rounded down)."""
        radius = mpf_mul(mpf_abs(self.mid), from_float(self.rel), 60, round_ceiling)
        if self.extra_log2 is not None:
            radius = mpf_add(radius, from_man_exp(1, self.extra_log2), 60, round_ceiling)
        if radius == fzero:
            return 0.0
        # below the float range, the least subnormal is still an upper bound
        return max(to_float(radius, rnd="u"), 5e-324)


def _mag(x: tuple) -> int:
    """Return ``k`` with ``|x| < 2**k`` (``x`` non-zero mpf tuple)."""
    return x[2] + x[3]


def max_log2(*ks: int | None) -> int | None:
    r"""A ``k`` with :math:`\sum_j 2^{k_j} \le 2^{k}` (``None`` entries skipped; all: ``None``)."""
    vals = [k for k in ks if k is not None]
    if not vals:
        return None
    return max(vals) + len(vals).bit_length()


@dataclass
class PreparedRow:
    r"""A regular row, shifted by its maximum, in exact arithmetic.

    Attributes
    ----------
    n : int
        Length of the row (masked entries included).
    index : numpy.ndarray
        Positions of the unmasked entries.
    z : list of tuple
        Exact shifted logits :math:`z_i = x_i - \max x \le 0` (mpf tuples).
    zabs, zlow : numpy.ndarray
        Upper and lower float bounds of :math:`|z_i|` (``inf`` beyond range).
    ones : numpy.ndarray
        ``z_i == 0`` exactly (the maxima).
    """

    n: int
    index: np.ndarray
    z: list
    zabs: np.ndarray
    zlow: np.ndarray
    ones: np.ndarray

    @property
    def n_eff(self) -> int:
        """Number of unmasked items."""
        return len(self.z)

    @classmethod
    def from_shifts(cls, z: list, n: int, index: np.ndarray) -> PreparedRow:
        """A row from exact shifted logits (mpf tuples, maximum exactly 0)."""
        zf = np.array([-to_float(d) for d in z], dtype=np.float64)  # |z|, rounded down
        with np.errstate(over="ignore"):  # a |z| near the float maximum bounds up to inf
            zabs = zf * (1.0 + 2.0**-50)
        return cls(
            n=n,
            index=index,
            z=z,
            zabs=zabs,
            zlow=zf * (1.0 - 2.0**-50),
            ones=np.array([d == fzero for d in z], dtype=bool),
        )


def prepare_row(x: np.ndarray) -> PreparedRow:
    """Prepare a regular float row (finite values and ``-inf`` only, one finite)."""
    x = np.asarray(x, dtype=np.float64)
    index = np.flatnonzero(x > -np.inf)
    xu = x[index]
    m = float(xu.max())
    fm = from_float(m)
    z = [mpf_sub(from_float(v), fm, 0) for v in xu.tolist()]
    with np.errstate(over="ignore"):
        zf = m - xu  # |z| rounded to nearest (inf on overflow)
        zabs = zf * (1.0 + 2.0**-50)
    return PreparedRow(
        n=x.shape[0], index=index, z=z, zabs=zabs, zlow=zf * (1.0 - 2.0**-50), ones=xu == m
    )


def cutoff(n: int, p: int, qmin: int) -> float:
    r"""The dead-item cutoff :math:`C` for a row of `n` items at precision `p`.

    :math:`n e^{-C} \le 2^{-\max(-q_{\min}, p) - 40}`.
    """
    return math.log(2.0) * (max(-qmin, p) + 40 + n.bit_length()) + 8.0


def _dead_log2(n_dead: int, C: float) -> int | None:
    """Return ``k`` with ``n_dead * max(1, C) * exp(-C) <= 2**k``."""
    if n_dead == 0:
        return None
    return math.ceil(math.log2(n_dead) + math.log2(max(C, 1.0)) - C / math.log(2.0)) + 1


@dataclass
class ExpPass:
    r"""Exponentials of one pass, their sums and error bounds.

    ``e[k]`` approximates :math:`e^{y_k}` for ``alive[k]`` (ones excluded) with
    relative error ``rel_e[k]`` (relative to the computed value);
    ``s = c + sigma`` with ``s_rel``; ``t`` approximates
    :math:`\sum_i e^{z_i} z_i` (entropy passes only).
    """

    alive: np.ndarray
    e: list
    rel_e: np.ndarray
    c: int
    sigma: tuple
    sigma_rel: float
    dead_log2: int | None
    s: tuple
    s_rel: float
    t: tuple | None = None
    t_rel: float = 0.0
    t_dead_log2: int | None = None


#: The least normal float64: a β below it has lost relative precision as a float.
_TINY = 2.2250738585072014e-308


def _scaled_bounds(
    row: PreparedRow, items: np.ndarray, beta: tuple
) -> tuple[np.ndarray, np.ndarray]:
    r"""Lower and upper float bounds of :math:`|\beta|\,|z_i|` for `items`, within :math:`2^{-50}`.

    In floats where both factors are normal floats; otherwise (a shift beyond
    the float range, :math:`|x_i - \max x| > 1.8 \cdot 10^{308}`, or a β below
    the normal floats) each product is formed in mpmath, where neither
    overflows nor loses precision: a float product gave ``inf`` (the item taken
    as negligible) for β = 1e-310 and :math:`|z| = 2 \cdot 10^{308}`, whose
    :math:`\beta|z|` is 0.02, and NaN for a β that is 0 as a float.
    """
    bf = abs(to_float(beta))
    zlow, zabs = row.zlow[items], row.zabs[items]
    if bf >= _TINY and np.all(np.isfinite(zabs)):
        with np.errstate(over="ignore"):
            return bf * zlow, bf * zabs
    b = mpf_abs(beta)
    low = np.empty(items.size)
    high = np.empty(items.size)
    for j, k in enumerate(items.tolist()):
        z = mpf_abs(row.z[k])
        low[j] = to_float(mpf_mul(b, z, 64, round_floor), rnd=round_floor)
        # a product below the normal floats is rounded to nearest by ldexp: 2**-1060 more
        # covers what that rounding may drop
        high[j] = to_float(mpf_mul(b, z, 64, round_ceiling), rnd=round_ceiling) + 2.0**-1060
    return low, high


def exp_pass(row: PreparedRow, beta: Ball | None, p: int, C: float, want_t: bool) -> ExpPass:
    r"""Compute :math:`e^{\beta z_i}`, their sum and (optionally) :math:`\sum e^{z_i} z_i`.

    Parameters
    ----------
    row : PreparedRow
        The row.
    beta : Ball or None
        The inverse temperature; ``None`` means exactly 1.
    p : int
        Working precision in bits.
    C : float
        Dead-item cutoff.
    want_t : bool
        Also accumulate :math:`t = \sum_i e^{z_i} z_i` (requires ``beta=None``).
    """
    u = math.ldexp(1.0, -p)
    n = row.n_eff
    ps = p + (n + 1).bit_length() + 2
    sum_rel = (n + 1) * math.ldexp(1.0, -ps) * SLACK
    nonones = np.flatnonzero(~row.ones)
    c = row.n_eff - nonones.size
    if beta is None:
        ymag_low = row.zlow[nonones]
        a = np.zeros(nonones.size)
    else:
        brel = beta.rel
        if beta.extra_log2 is not None:
            raise ValueError("beta must carry a purely relative bound")
        y_low, y_high = _scaled_bounds(row, nonones, beta.mid)
        with np.errstate(invalid="ignore", over="ignore"):
            ymag_low = (1.0 - brel - 2.0**-50) * y_low
            a = (1.0 + 2.0**-50) * y_high * (u + brel + u * brel) * SLACK
    live = ~(ymag_low > C)
    alive = nonones[live]
    a = a[live]
    n_dead = nonones.size - alive.size
    with np.errstate(over="ignore", invalid="ignore"):
        em1 = np.expm1(a)
        rel_true = em1 + KAPPA * u * (1.0 + em1)
        rel_e = np.where(rel_true < 0.5, rel_true / (1.0 - rel_true), np.inf) * SLACK

    z = row.z
    es = []
    append = es.append
    sigma = fzero
    t = fzero
    if beta is None:
        if want_t:
            for k in alive.tolist():
                zk = z[k]
                ek = mpf_exp(zk, p, RN)
                append(ek)
                sigma = mpf_add(sigma, ek, ps, RN)
                t = mpf_add(t, mpf_mul(ek, zk, p, RN), ps, RN)
        else:
            for k in alive.tolist():
                ek = mpf_exp(z[k], p, RN)
                append(ek)
                sigma = mpf_add(sigma, ek, ps, RN)
    else:
        if want_t:
            raise ValueError("t is only accumulated in the beta = 1 entropy pass")
        b = beta.mid
        for k in alive.tolist():
            ek = mpf_exp(mpf_mul(b, z[k], p, RN), p, RN)
            append(ek)
            sigma = mpf_add(sigma, ek, ps, RN)

    sigma_f = to_float(sigma)
    max_rel = float(rel_e.max()) if rel_e.size else 0.0
    sigma_rel = (max_rel + sum_rel) * SLACK
    dead_log2 = _dead_log2(n_dead, C)
    s_f = c + sigma_f
    # (a dead mass below the float range is bounded by 2**-1070, an over-estimate)
    dead_rel = math.ldexp(1.0, max(dead_log2, -1070)) if dead_log2 is not None else 0.0
    if c and sigma != fzero and -_mag(sigma) > 2 * ps + 64:
        # sigma is far below c's last bit: round the sum instead of holding it exactly
        s = mpf_add(from_int(c), sigma, 2 * ps + 64, RN)
        dead_rel += math.ldexp(1.0, -min(2 * ps + 63, 1070))
    else:
        s = mpf_add(from_int(c), sigma, 0)  # exact
    s_rel = ((sigma_f / s_f) * sigma_rel + dead_rel) * SLACK if s_f > 0 else math.inf
    result = ExpPass(
        alive=alive,
        e=es,
        rel_e=rel_e,
        c=c,
        sigma=sigma,
        sigma_rel=sigma_rel,
        dead_log2=dead_log2,
        s=s,
        s_rel=s_rel,
    )
    if want_t:
        result.t = t
        result.t_rel = (max_rel + u + sum_rel) * SLACK
        result.t_dead_log2 = dead_log2
    return result


def entropy_nonneg(c: int, entropy_eps: float) -> bool:
    r"""Whether the (guarded) entropy of a row with `c` maxima is known to be :math:`\ge 0`.

    Every term :math:`-p_i \log(p_i + \varepsilon)` is :math:`\ge 0` when
    :math:`p_i + \varepsilon \le 1`, and :math:`p_i \le 1/c`: so for
    :math:`\varepsilon \le 1 - 1/c` (the plain entropy, :math:`\varepsilon = 0`,
    included). Then a ball around zero whose upper end rounds to zero decides
    ``+0.0`` (:func:`~softmaxtheory._certify.rounding.round_ball`): with
    :math:`\varepsilon = 1/2` and two tied maxima the maxima contribute nothing
    and the rest, far below them, may be as small as the mass of the dead items.
    """
    return entropy_eps == 0.0 or (c >= 1 and Fraction(entropy_eps) <= 1 - Fraction(1, c))


def entropy_ball(ep: ExpPass, p: int, entropy_eps: float, row: PreparedRow | None = None) -> Ball:
    """Entropy of the row from a ``beta = 1`` pass that accumulated ``t``.

    With a guard, :math:`H - G` may cancel (a row near one where the guarded entropy
    vanishes); where it loses more than half the working precision (or all of it) and
    the `row` is given, the value comes from :func:`._guarded.guarded_entropy_ball`
    instead, which keeps its relative accuracy and its sign there. A smaller loss is
    left to the Ziv loop: doubling the precision is cheaper than the intervals.
    """
    u = math.ldexp(1.0, -p)
    H = _entropy_exact_mode(ep, p, u)
    if entropy_eps == 0.0:
        return H
    guarded, scale = _entropy_eps_mode(ep, p, u, entropy_eps, H)
    if row is not None and scale is not None:
        cancelled = guarded.mid == fzero or scale - _mag(guarded.mid) > p // 2
        if cancelled:
            from ._guarded import guarded_entropy_ball

            better = guarded_entropy_ball(row, p, entropy_eps)
            if better is not None:
                return better
    return guarded


def _entropy_exact_mode(ep: ExpPass, p: int, u: float) -> Ball:
    r"""H = log s - t / s with s = c + sigma >= 1 and t <= 0: two non-negative parts."""
    if ep.c < 1:
        raise ValueError("an exact row has at least one maximum")
    if ep.sigma == fzero:
        # only maxima are alive: H = log c exactly, up to the dead mass
        if ep.c == 1:
            return Ball(fzero, 0.0, max_log2(ep.dead_log2, ep.t_dead_log2))
        log_c = mpf_log(from_int(ep.c), p, RN)
        return Ball(log_c, (KAPPA * u) * SLACK, max_log2(ep.dead_log2, ep.t_dead_log2))
    sigma_f = to_float(ep.sigma)
    # L = log(c + sigma)
    if ep.c == 1:
        mag = _mag(ep.sigma)
        if mag < -p:
            # log1p(sigma) = sigma - sigma^2/2 + ..., |error| <= sigma^2 / 2 < 2**(2 mag - 1)
            L = ep.sigma
            L_rel = ep.sigma_rel
            L_extra = max_log2(ep.dead_log2, 2 * mag - 1)
        else:
            pl = p + 8 + max(0, -mag)
            L = mpf_log(ep.s, pl, RN)
            # |dL| <= |d sigma| and L >= sigma / (1 + sigma)
            L_rel = (ep.sigma_rel * (1.0 + sigma_f) + KAPPA * math.ldexp(1.0, 8 - pl)) * SLACK
            L_extra = ep.dead_log2
    else:
        L = mpf_log(ep.s, p + 8, RN)
        Lf = to_float(L)
        L_rel = (ep.s_rel / (1.0 - ep.s_rel) / (Lf * (1 - 1e-9)) + KAPPA * u) * SLACK
        L_extra = None
    # Q = -t / s >= 0
    Q = mpf_div(ep.t, ep.s, p, RN)
    Q_rel = (ep.t_rel + ep.s_rel + u + 2 * ep.t_rel * ep.s_rel) * (1 + 2 * ep.s_rel) * SLACK
    H = mpf_sub(L, Q, p, RN)
    rel = (max(L_rel, Q_rel) + u) * (1 + u) * SLACK
    return Ball(H, rel, max_log2(L_extra, ep.t_dead_log2))


def _log1p(r: tuple, p: int) -> tuple[tuple, float]:
    r""":math:`\log(1 + r)` for an exact ``r > -1``, with its relative error bound."""
    if r == fzero:
        return fzero, 0.0
    mag = _mag(r)
    if mag < -p:
        # log1p(r) = r (1 - r/2 + ...): relative error below |r| <= 2**-p
        return r, math.ldexp(1.0, -p)
    if mag > p + 8:
        # log(1 + r) = log r + log1p(1/r) with 0 < log1p(1/r) < 1/r < 2**-(p + 7) and
        # log r > 1: the exact 1 + r would have 2**mag bits (r = eps/p for a tiny p)
        return mpf_log(r, p + 8, RN), (KAPPA + 2.0) * math.ldexp(1.0, -p - 8)
    pl = p + 8 + max(0, -mag)
    # 1 + r is exact; the extra -mag bits keep the result's relative accuracy near r = 0
    return mpf_log(mpf_add(fone, r, 0), pl, RN), KAPPA * math.ldexp(1.0, -p - 6)


def _entropy_eps_mode(
    ep: ExpPass, p: int, u: float, eps: float, H: Ball
) -> tuple[Ball, int | None]:
    r"""Guarded entropy :math:`-\sum_i p_i \log(p_i + \varepsilon) = H - G`.

    With :math:`G = \sum_i p_i \log(1 + \varepsilon / p_i) \ge 0`, a sum of positive
    terms, and :math:`H \ge 0` the exact entropy, the only cancellation left is the
    final subtraction, whose relative error the Ziv loop sees directly. Returns the
    ball and the binary magnitude of the larger of :math:`H` and :math:`G` (``None``
    where no subtraction was made), from which the caller sees the cancellation.
    """
    eps_m = from_float(eps)
    if ep.sigma == fzero and ep.dead_log2 is None:
        # every unmasked item is a maximum: p_i = 1/c exactly and H_eps = -log(1/c + eps)
        d = Fraction(1, ep.c) + Fraction(eps) - 1
        if d == 0:
            return Ball(fzero, 0.0), None
        lam, lam_rel = _log1p(from_rational(d.numerator, d.denominator, p + 8, RN), p)
        return Ball(mpf_neg(lam), (lam_rel + math.ldexp(1.0, -p - 7)) * SLACK), None
    Rs = ep.s_rel / (1.0 - ep.s_rel) if ep.s_rel < 0.5 else math.inf
    ps = p + (len(ep.e) + 2).bit_length() + 2
    total = fzero
    worst = 0.0

    def term(e: tuple, rel_e: float) -> tuple[tuple, float]:
        pk = mpf_div(e, ep.s, p, RN)
        Rp = (rel_e + Rs + u + 2 * rel_e * Rs) * SLACK
        lam, lam_rel = _log1p(mpf_div(eps_m, pk, p, RN), p)
        Rr = (Rp + u) / (1.0 - Rp - u) if Rp < 0.25 else math.inf
        return mpf_mul(pk, lam, p, RN), (Rp + Rr + lam_rel + u) * (1 + 4 * Rr) * SLACK

    for e, rel_e in zip(ep.e, ep.rel_e.tolist(), strict=True):
        g, r = term(e, rel_e)
        total = mpf_add(total, g, ps, RN)
        worst = max(worst, r)
    if ep.c:
        g, r = term(fone, 0.0)
        total = mpf_add(total, mpf_mul(g, from_int(ep.c), p, RN), ps, RN)
        worst = max(worst, r + u)
    G_rel = (worst + (len(ep.e) + 2) * math.ldexp(1.0, -ps)) * SLACK
    G_extra = None
    if ep.dead_log2 is not None:
        # a dead item has p <= e**-C: p log(1 + eps/p) <= C e**-C + e**-C log(1 + eps)
        G_extra = ep.dead_log2 + 1 + math.ceil(math.log2(1.0 + math.log1p(eps)))
    mid = mpf_sub(H.mid, total, p, RN)
    scale = max((_mag(x) for x in (H.mid, total) if x != fzero), default=None)
    mass = mpf_add(
        mpf_mul(mpf_abs(H.mid), from_float(H.rel), 60, round_ceiling),
        mpf_mul(total, from_float(G_rel), 60, round_ceiling),
        60,
        round_ceiling,
    )
    if mid == fzero:
        # H and G agree to p bits: the exact value lies within `mass` of zero, an absolute
        # bound (a relative one is meaningless here); the sign stays open
        mass = mpf_add(mass, mpf_mul(mpf_abs(H.mid), from_float(u), 60, round_ceiling), 60)
        mass_log2 = _mag(mass) if mass != fzero else None
        return Ball(fzero, 0.0, max_log2(mass_log2, H.extra_log2, G_extra)), scale
    ratio = to_float(mpf_div(mass, mpf_abs(mid), 60, round_ceiling), rnd="u")
    return Ball(mid, (ratio + u) * SLACK, max_log2(H.extra_log2, G_extra)), scale


def _rational_mpf(value: object, p: int) -> tuple[tuple, float]:
    """A Fraction as an mpf tuple rounded at ``p`` bits, with its relative error."""
    num, den = value.numerator, value.denominator  # type: ignore[attr-defined]
    if den & (den - 1) == 0 and abs(num).bit_length() <= p:
        return from_rational(num, den, p, RN), 0.0
    return from_rational(num, den, p, RN), math.ldexp(1.0, -p)


def beta_ball(
    schedule: Schedule, H: Ball | None, n_eff: int, p: int, entropy_eps: float = 0.0
) -> Ball:
    """Inverse temperature of a regular row, with its relative error bound.

    `entropy_eps` is the mode `H` was computed in: a guarded entropy may be negative,
    so a threshold at or below 0 may be a jump (:meth:`~softmaxtheory.spec.Polynomial.jumps_for`).

    Raises
    ------
    Undecided
        When a schedule with a jump cannot tell on which side of its threshold
        the entropy lies at this precision.
    """
    u = math.ldexp(1.0, -p)
    if isinstance(schedule, Constant):
        mid, rel = _rational_mpf(schedule.exact_beta, p)
        return Ball(mid, rel)
    if isinstance(schedule, LogLength):
        if n_eff == 1:
            return Ball(fzero, 0.0)
        s_mid, s_rel = _rational_mpf(schedule.exact_s, p)
        log_n = mpf_log(from_int(n_eff), p, RN)
        return Ball(mpf_mul(s_mid, log_n, p, RN), (s_rel + KAPPA * u + u) * 1.01)
    if isinstance(schedule, Polynomial):
        if H is None:
            raise ValueError("an entropy schedule needs the entropy")
        return _polynomial_beta(schedule, H, p, u, entropy_eps)
    raise TypeError(f"the reference does not know the schedule {schedule!r}")


def _polynomial_beta(
    schedule: Polynomial, H: Ball, p: int, u: float, entropy_eps: float = 0.0
) -> Ball:
    Hf = to_float(H.mid)
    EH = H.abs_bound()
    theta = schedule.exact_threshold
    # the ball [H_lo, H_hi] and theta in [t_lo, t_hi], compared exactly
    radius = mpf_mul(mpf_abs(H.mid), from_float(H.rel * SLACK), 30, round_ceiling)
    if H.extra_log2 is not None:
        radius = mpf_add(radius, from_man_exp(1, H.extra_log2), 30, round_ceiling)
    h_lo = mpf_sub(H.mid, radius, p + 20, round_floor)
    h_hi = mpf_add(H.mid, radius, p + 20, round_ceiling)
    t_lo = from_rational(theta.numerator, theta.denominator, p + 20, round_floor)
    t_hi = from_rational(theta.numerator, theta.denominator, p + 20, round_ceiling)
    if mpf_cmp(h_hi, t_lo) <= 0 and (mpf_cmp(h_hi, t_lo) < 0 or t_lo == t_hi):
        return Ball(fone, 0.0)  # H <= theta
    straddles = mpf_cmp(h_lo, t_hi) <= 0
    coeffs = schedule.exact_coefficients
    if straddles and schedule.jumps_for(entropy_eps):
        # the entropy straddles the threshold of a schedule that jumps there
        raise Undecided("entropy too close to the threshold of a schedule with a jump")
    exact = _exact_polynomial(coeffs, H, straddles)
    if exact is not None:  # beta = max(P, 1) known exactly: a rounding tie is decided
        mid, rel = _rational_mpf(max(exact, Fraction(1)), p)
        return Ball(mid, rel)
    cm = [from_rational(c.numerator, c.denominator, p, RN) for c in coeffs]
    acc = fzero
    for c in cm:
        acc = mpf_add(mpf_mul(acc, H.mid, p, RN), c, p, RN)
    EPm = _polynomial_error(coeffs, Hf, EH, u)
    # decide max(P, 1) with exact comparisons of the bounds P -/+ EP against 1
    above = mpf_cmp(mpf_sub(acc, EPm, p + 10, round_floor), fone) >= 0
    below = mpf_cmp(mpf_add(acc, EPm, p + 10, round_ceiling), fone) <= 0
    # past the threshold, or straddling it where the rule is continuous (P(theta) <= 1):
    # beta is within EP of max(P, 1) on both sides
    if below:
        return Ball(fone, 0.0)
    if above:
        # EP / (|P| - EP), in mpf: P and EP may lie beyond the float range
        low = mpf_sub(mpf_mul(acc, _ONE_LESS, 60, round_floor), EPm, 60, round_floor)
        if mpf_cmp(low, fzero) <= 0:
            return Ball(acc, math.inf)
        return Ball(acc, to_float(mpf_div(EPm, low, 60, round_ceiling), rnd="u") * SLACK)
    return Ball(acc if mpf_cmp(acc, fone) > 0 else fone, to_float(EPm, rnd="u") * SLACK)


_ONE_LESS = from_float(1 - 1e-9)


def _exact_polynomial(coeffs: tuple[Fraction, ...], H: Ball, straddles: bool) -> Fraction | None:
    r""":math:`P(H)` as an exact rational where it is known exactly, else None.

    A constant polynomial (leading coefficients 0) has one value, and on either side
    of a threshold it does not jump at (the caller's case) :math:`\max(P, 1)` is that
    value's on both sides (:math:`P(\tau) \le 1` there, or :math:`\tau` below every
    entropy). An exact entropy past the threshold (one item: :math:`H = 0`) gives
    :math:`P(H)` exactly. A constant equal to a rounding tie (``1 + 2**-11`` in
    float16) was undecidable from a Horner bound, which is never 0.
    """
    lead = 0
    while lead < len(coeffs) - 1 and coeffs[lead] == 0:
        lead += 1
    if lead == len(coeffs) - 1:
        return coeffs[-1]
    if straddles or H.rel != 0.0 or H.extra_log2 is not None:
        return None
    sign, man, exp, _ = H.mid
    man, exp = int(man), int(exp)  # gmpy2's mpz under mpmath's gmpy backend
    h = Fraction(-man if sign else man) * (Fraction(2) ** exp if exp >= 0 else Fraction(1, 2**-exp))
    acc = Fraction(0)
    for c in coeffs:
        acc = acc * h + c
    return acc


def _polynomial_error(coeffs: tuple[Fraction, ...], Hf: float, EH: float, u: float) -> tuple:
    r"""A bound of :math:`|\tilde P - P(H)|`, as an mpf.

    Horner's error at the working precision plus the slope bound
    (:func:`_slope_bound`) times the entropy's error.

    The bound is evaluated in float64; where that overflows (coefficients near the
    float maximum, a high degree), the same expression is evaluated in exact
    rationals, so that a polynomial beyond the float range is still certified (its
    β rounds to ``inf``) instead of failing at every precision.
    """
    if not math.isfinite(EH):
        return finf
    hmax = abs(Hf) + EH
    d = len(coeffs) - 1
    c = [float(ci) for ci in coeffs]
    try:
        size = sum(abs(ci) * hmax ** (d - i) for i, ci in enumerate(c))
        EP = ((2 * d + 3) * u * size + _slope_bound(c, Hf, EH, hmax) * EH) * 1.01
    except OverflowError:  # a power beyond the float range
        EP = math.inf
    if math.isfinite(EP):
        return from_float(EP)
    # the same expression without rounding: the factor 1.01 then covers only the
    # coefficients' and the entropy's rounding to float64, as it did before
    q = [Fraction(ci) for ci in c]
    qh, qe = Fraction(Hf), Fraction(EH)
    qmax = abs(qh) + qe
    qsize = sum(abs(ci) * qmax ** (d - i) for i, ci in enumerate(q))
    exact = (2 * d + 3) * Fraction(u) * qsize + _slope_bound(q, qh, qe, qmax) * qe
    exact *= Fraction(101, 100)
    return from_rational(exact.numerator, exact.denominator, 60, round_ceiling)


def _slope_bound(c: list, Hf: Any, EH: Any, hmax: Any) -> Any:
    r"""A bound of :math:`|P'(h)|` over the entropy's ball :math:`|h - H| \le E_H`.

    :math:`|P'(h)| \le |P'(\tilde H)| + |h - \tilde H| \max |P''|`, with
    :math:`\tilde H` = `Hf` (within :math:`2^{-52}|\tilde H|` of the ball's centre),
    :math:`P'(\tilde H)` evaluated by Horner's rule in float64 with its error
    :math:`\gamma_{2d+2} \sum_k k|c_k| h_{\max}^{k-1}` (the coefficients rounded to
    float64 too) and :math:`\max|P''| \le \sum_k k(k-1)|c_k| h_{\max}^{k-2}`. The
    plain bound :math:`\sum_k k|c_k|h_{\max}^{k-1}` overestimates the paper's slope
    near :math:`H = 5` about ninety-fold (its coefficients alternate in sign).

    The arguments are all floats or all :class:`~fractions.Fraction` (the exact
    evaluation where floats overflow); the result has their type.
    """
    d = len(c) - 1
    one = hmax**0
    deriv = 0 * one
    for i, ci in enumerate(c[:-1]):
        deriv = deriv * Hf + ci * (d - i)
    abs1 = sum((abs(ci) * (d - i) * hmax ** max(d - i - 1, 0) for i, ci in enumerate(c)), 0 * one)
    abs2 = sum(
        (abs(ci) * (d - i) * (d - i - 1) * hmax ** max(d - i - 2, 0) for i, ci in enumerate(c)),
        0 * one,
    )
    eps = one / 2**53
    gamma = (2 * d + 2) * eps / (1 - (2 * d + 2) * eps)
    bound = abs(deriv) + gamma * abs1 + (EH + 2 * eps * abs(Hf)) * abs2
    return min(bound * type(one)(1.01), abs1)


def coefficients(ep: ExpPass, p: int) -> tuple[list, np.ndarray, tuple, float]:
    """Coefficients :math:`e_i / s` of the alive items and of the maxima.

    Returns
    -------
    alive_values, alive_rel, max_value, max_rel
        mpf tuples and relative error bounds; ``max_value = 1 / s``.
    """
    u = math.ldexp(1.0, -p)
    Rs = ep.s_rel / (1.0 - ep.s_rel) if ep.s_rel < 0.5 else math.inf
    s = ep.s
    vals = [mpf_div(e, s, p, RN) for e in ep.e]
    rel = (ep.rel_e + Rs + u + 2 * ep.rel_e * Rs) * SLACK
    one = mpf_div(fone, s, p, RN)
    return vals, rel, one, (Rs + u) * SLACK
