r"""The double-double pass over many rows at once.

:mod:`._fast` certifies one row at a time; for the short rows of a batch most of
its cost is numpy's per-call overhead (about 1 ms a row of 64 items). Here the
rows of a batch, or the query rows of an attention slice
(:mod:`._fast_attention`), are arrays of shape (rows, items) and every step runs
once over all of them. The arithmetic and its bounds are those of :mod:`._fast`
(notation there: :data:`~._fast.EXP_REL`, :data:`~._fast.PROD_REL`,
:data:`~._fast.DIV_REL`, every bound times :data:`~._engine.SLACK`); what
differs is proved here. A row this pass cannot certify whole goes to the
one-row pass, then to mpmath, unchanged, so the results are the same floats.

**Exact sums of a line** (:func:`line_sums`). The terms of one line (a row's
exponentials, or an attention output's products) are scaled by the power of two
:math:`2^{K}` that puts the largest high part in :math:`[1, 2)` and split on the
grids :math:`2^{-26}, \dots, 2^{-130}` (high parts) and :math:`2^{-78},
2^{-104}, 2^{-130}` (low parts, at most half an ulp of their high part), as
:func:`._fast.sum_dd` does. Signed terms split the same way: a level's terms are
multiples of its grid below 2 (the first level) or at most half the previous
grid (the others), so for :math:`m \le 2^{26}` terms every partial sum of a
level is a multiple of its grid below :math:`2^{53}` grid units, and numpy's sum
along the line is exact in any order. Each level sum times :math:`2^{26 l}` is
then an exact int64, and the levels combine exactly as Python integers: the
line's sum is :math:`T\, 2^{-130-K}`. What is left of a term is below
:math:`2^{-131}` (scaled), and a term that underflows in the scaling loses at
most :math:`2^{-1074}` (scaled): the sum is within :math:`m\,2^{-129-K}` of the
sum of the terms.

**A pass** (:class:`BatchPass`; β = 1, or one β per row). Each row's shifts
:math:`z \le 0` are double-doubles, exact for float rows and within a relative
``zrel`` for attention (:data:`._fast_attention.ZREL`). With β known as
:math:`b_h + b_l` within :math:`\rho` (the caller's bound: β's ball, its split,
the product and ``zrel``), :math:`\tilde y = \tilde\beta\tilde z` is a
double-double product and :math:`e^{\tilde y}` is within
:math:`\mathrm{expm1}(\rho|\tilde y|(1 + 2^{-50})) + \mathrm{EXP\_REL}(1 + \ldots)`
of :math:`e^{y}`, relative to the computed value, as in :class:`._fast._Pass`
(for β = 1, :math:`\rho` = ``zrel``). An item with
:math:`|\tilde y|(1 - \rho) > C` is dead, one beyond :data:`~._fast.Y_TINY` tiny
(whatever the format); :func:`._fast.dead_weight_log2` bounds their exponentials'
sum. The sums :math:`\sigma_i` (live items that are not maxima) and, for the
entropy, :math:`t_i = -\sum e_{ij}|\tilde z_{ij}|` are line sums; their relative
bounds are those of :class:`._fast._Pass`, with :math:`m\,2^{-129-K}` for the
grids' remainder and ``zrel`` added to each term of :math:`t`.

**Rows** (:func:`evaluate_rows`). The entropy, β and the maxima's coefficient
:math:`1/s` are the mpmath engine's scalar steps at
:data:`~._fast.P_SCALAR` bits, one row at a time, as in :func:`._fast.evaluate`;
the other coefficients are double-double quotients
(:math:`\rho_{ij} + R_s + \rho_{ij}R_s + 2^{-99}`, as there) through the
vectorised rounding test. A row with a tiny item, or with a coefficient the test
leaves open, goes to the one-row pass, which recomputes those with mpmath.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import mpmath
import numpy as np
from mpmath.libmp import fone, from_man_exp, mpf_div

from softmaxtheory.spec import Schedule

from . import _engine as eng
from . import _fast as fast
from ._rounding import BinaryFormat, round_ball

__all__ = [
    "BATCH_MAX_N",
    "CHUNK",
    "MAX_TERMS",
    "BatchPass",
    "evaluate_rows",
    "line_sums",
    "row_entropy",
]

_SLACK = eng.SLACK
#: The level grids of :func:`line_sums`: high parts on 2**-26 ... 2**-130, low parts on
#: 2**-78 ... 2**-130; and each level's grid exponent.
_HI_LEVELS = tuple(1.5 * 2.0 ** (52 - 26 * j) for j in range(1, 6))
_LO_LEVELS = tuple(1.5 * 2.0 ** (52 - 26 * j) for j in range(3, 6))
_GRID_BITS = tuple(26 * j for j in range(1, 6)) + tuple(26 * j for j in range(3, 6))
#: Lines of more terms than this are not summed here (the level sums stay exact below it).
MAX_TERMS = 1 << 26
#: Rows longer than this are certified one at a time (:func:`._fast.evaluate`): the
#: per-call overhead this pass saves is small beside their own work.
BATCH_MAX_N = 1 << 12
#: Elements of the (rows, items) arrays of one chunk of rows.
CHUNK = 1 << 18


def line_sums(hi: np.ndarray, lo: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""Exact sums over the last axis of the terms ``hi + lo``, as integers.

    Parameters
    ----------
    hi, lo : numpy.ndarray
        Terms of the same shape ``(..., m)``, :math:`m \le 2^{26}`, finite;
        ``|lo|`` at most half an ulp of ``hi``.

    Returns
    -------
    T : numpy.ndarray of int (object)
        Per line, an integer with :math:`\sum (h + l) = T\,2^{-130-K}` up to
        :math:`m\,2^{-129-K}` (see the module docstring).
    K : numpy.ndarray of int64
        The scaling exponents.
    ok : numpy.ndarray of bool
        False where the line's terms are too small to scale (:math:`K > 1000`).
    """
    top = np.max(np.abs(hi), axis=-1) if hi.shape[-1] else np.zeros(hi.shape[:-1])
    K = np.where(top > 0.0, 1 - np.frexp(top)[1], 0).astype(np.int64)
    ok = K <= 1000
    K = np.where(ok, K, 0)
    scale = np.ldexp(1.0, K)[..., None]
    ints = []
    for arr, grids, bits in (
        (hi, _HI_LEVELS, _GRID_BITS[:5]),
        (lo, _LO_LEVELS, _GRID_BITS[5:]),
    ):
        rest = arr * scale
        for S, b in zip(grids, bits, strict=True):
            q = (rest + S) - S
            rest = rest - q
            # a multiple of 2**-b below 2**53 of them: an exact int64 after scaling
            ints.append((np.ldexp(np.sum(q, axis=-1), b).astype(np.int64), b))
    T = np.zeros(hi.shape[:-1], dtype=object)
    for level, b in ints:
        T = T + (level.astype(object) << (130 - b))
    return T, K, ok


def to_dd(T: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``T 2**e`` (object ints, int exponents) as double-doubles, within 2**-106 where normal."""
    h = T.astype(np.float64)  # Python's int to float: rounded to nearest
    r = (T - np.frompyfunc(int, 1, 1)(h)).astype(np.float64)
    return np.ldexp(h, e), np.ldexp(r, e)


def _as_mpf(T: Any, e: int) -> tuple:
    return from_man_exp(int(T), int(e))


def _sum_err(m: int, K: int) -> float:
    """The bound of a line sum of `m` terms scaled by ``2**K`` (:func:`line_sums`)."""
    return (m * math.ldexp(2.0**-129, -K) + m * 2.0**-1060) * _SLACK


class BatchPass:
    r"""Exponentials of one pass over a chunk of rows, their sums and error bounds.

    Parameters
    ----------
    zh, zl : numpy.ndarray
        Shape (rows, items): the shifts as double-doubles (``-inf`` beyond the
        float range; masked items anything).
    ones, unmasked : numpy.ndarray
        The maxima (``z = 0`` exactly) and the unmasked items.
    C : float or numpy.ndarray
        The dead-item cutoff (one, or one per row).
    beta : tuple of numpy.ndarray or None
        ``None`` (β = 1) or per row ``(bh, bl, rel)``: β's double-double and its
        ball's relative bound; the pass adds the split's, the product's and `zrel`.
    want_t : bool
        Also sum :math:`t`.
    zrel : float
        Relative bound of the shifts (0: exact).

    Attributes
    ----------
    eh, el, rel_e : numpy.ndarray
        The exponentials of the computed items (0 elsewhere) and their bounds.
    fast, n_tiny, max_rel, ok
        Which items were computed; per row, the tiny items, the largest bound and
        whether the pass bounds its results.
    eps : list
        Per row, an :class:`._engine.ExpPass` (``None`` where not ``ok``).
    """

    def __init__(
        self,
        zh: np.ndarray,
        zl: np.ndarray,
        ones: np.ndarray,
        unmasked: np.ndarray,
        C: float,
        beta: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
        want_t: bool,
        zrel: float,
    ) -> None:
        R = zh.shape[0]
        Cs = np.broadcast_to(np.asarray(C, dtype=np.float64), (R,))
        if beta is None:
            bh, bl = np.ones(R), np.zeros(R)
            brel = np.full(R, zrel * _SLACK)
        else:
            bh, bl, rel = beta
            # ỹ = β̃ z̃: β's ball, its double-double split, the shift and the product
            brel = (rel + zrel + rel * zrel + 2.0**-104 + fast.PROD_REL) * _SLACK
        ok = (bh > 0.0) & (bh <= 2.0**995)
        bh_ = np.where(ok, bh, 1.0)[:, None]
        bl_ = np.where(ok, bl, 0.0)[:, None]
        brel_ = brel[:, None]
        overflow = unmasked & np.isinf(zh)
        # an overflowed shift may be alive for a tiny beta (as in the rows' pass)
        ok &= ~(overflow.any(axis=1) & (bh < 1e-290))
        cand = unmasked & ~ones & ~overflow
        with np.errstate(over="ignore", invalid="ignore"):
            ay = (-np.where(cand, zh, 0.0) * bh_) * (1.0 + 2.0**-49)  # >= |y|
        live = cand & (ay * (1.0 - brel_) * (1.0 - 2.0**-50) <= Cs[:, None])
        fast_ = live & (ay < fast.Y_TINY)
        n_dead = np.count_nonzero(cand & ~live, axis=1) + np.count_nonzero(overflow, axis=1)
        n_tiny = np.count_nonzero(live & ~fast_, axis=1)
        zs = np.where(fast_, zh, 0.0)
        zls = np.where(fast_, zl, 0.0)
        ok &= np.max(-zs, axis=1) < 2.0**990
        zs = np.where(ok[:, None], zs, 0.0)
        zls = np.where(ok[:, None], zls, 0.0)
        if beta is None:
            eh, el = fast.exp_dd(zs, zls)
        else:
            ph, pe = fast.two_prod(zs, bh_)
            eh, el = fast.exp_dd(*fast.fast_two_sum(ph, pe + (zs * bl_ + zls * bh_)))
        eh = np.where(fast_, eh, 0.0)
        el = np.where(fast_, el, 0.0)
        with np.errstate(over="ignore"):
            em1 = np.expm1(np.where(fast_, ay, 0.0) * brel_ * (1.0 + 2.0**-50))
        rel_true = em1 + fast.EXP_REL * (1.0 + em1)
        rel_e = np.where(rel_true < 0.5, rel_true / (1.0 - rel_true), np.inf) * _SLACK
        rel_e = np.where(fast_, rel_e, 0.0)
        max_rel = np.max(rel_e, axis=1)
        ok &= max_rel < 2.0**-40
        n_fast = np.count_nonzero(fast_, axis=1)
        T, K, sums_ok = line_sums(eh, el)
        ok &= sums_ok
        c = np.count_nonzero(ones, axis=1)
        ok &= c >= 1  # (a regular row has a maximum; a row cleared before has none)
        if want_t:
            wh, wl = fast.weighted(eh, el, zs, zls)
            Tt, Kt, t_ok = line_sums(wh, wl)
            ok &= t_ok
        self.eh, self.el, self.rel_e, self.fast = eh, el, rel_e, fast_
        self.n_tiny, self.max_rel, self.ok = n_tiny, max_rel, ok
        self.eps: list[eng.ExpPass | None] = []
        for i in range(R):
            if not ok[i]:
                self.eps.append(None)
                continue
            m = int(n_fast[i])
            mr = float(max_rel[i])
            dead_log2 = fast.dead_weight_log2(
                int(n_dead[i]), float(Cs[i]), int(n_tiny[i]), fast.Y_TINY
            )
            ep = fast.pass_from_sums(
                int(c[i]), m, _as_mpf(T[i], -130 - int(K[i])), _sum_err(m, int(K[i])), mr,
                dead_log2,
            )  # fmt: skip
            if want_t:
                tsum = _as_mpf(Tt[i], -130 - int(Kt[i]))
                fast.add_t(ep, m, tsum, _sum_err(m, int(Kt[i])), mr, zrel)
            self.eps.append(ep)


def row_entropy(ps: BatchPass, i: int, entropy_eps: float) -> eng.Ball | None:
    """Row `i`'s entropy ball from a β = 1 pass with `t` (``None``: not accurate enough here)."""
    ep = ps.eps[i]
    if ep is None:
        return None
    H = eng.entropy_ball(ep, fast.P_SCALAR, 0.0)
    if not H.rel < 2.0**-40:
        return None
    if entropy_eps == 0.0:
        return H
    sel = ps.fast[i]
    items = SimpleNamespace(ep=ep, eh=ps.eh[i, sel], el=ps.el[i, sel], rel_e=ps.rel_e[i, sel])
    guarded = fast.guarded_entropy(SimpleNamespace(c=ep.c), items, H, entropy_eps)
    if guarded is None or not guarded.rel < 2.0**-40:
        return None
    return guarded


def evaluate_rows(
    x: np.ndarray,
    want: str,
    fmt: BinaryFormat,
    schedule: Schedule,
    entropy_eps: float,
) -> list[Any]:
    r"""Certify one result of each of many regular rows, or leave it (``None``).

    Parameters
    ----------
    x : numpy.ndarray
        Shape ``(rows, n)``: regular rows (finite values and ``-inf``, at least
        one finite), float64, :math:`n \le` :data:`BATCH_MAX_N`.
    want : str
        ``"softmax"``, ``"entropy"``, ``"beta"`` or ``"adaptive_softmax"``.
    fmt : BinaryFormat
        Target format.
    schedule : Schedule
        The temperature schedule.
    entropy_eps : float
        The entropy mode.

    Returns
    -------
    list
        Per row, the certified result (as :func:`._fast.evaluate` returns it) or
        ``None``: the caller then certifies that row by itself.
    """
    R, n = x.shape
    results: list[Any] = [None] * R
    if not fast.enabled() or n > BATCH_MAX_N:
        return results
    if entropy_eps != 0.0 and not fast.EPS_MIN <= entropy_eps <= fast.EPS_MAX:
        return results
    step = max(1, CHUNK // max(n, 1))
    with np.errstate(all="ignore"):  # a non-finite intermediate never certifies (below)
        for lo in range(0, R, step):
            rows = np.asarray(x[lo : lo + step], dtype=np.float64)
            try:
                part = _rows(rows, want, fmt, schedule, entropy_eps)
            except (eng.Undecided, ArithmeticError):
                part = [None] * rows.shape[0]
            results[lo : lo + rows.shape[0]] = part
    certified = sum(r is not None for r in results)
    fast.STATS["batch_rows"] += certified
    fast.STATS["fast"] += certified * (1 if want in ("entropy", "beta") else n)
    return results


def _rows(
    x: np.ndarray, want: str, fmt: BinaryFormat, schedule: Schedule, entropy_eps: float
) -> list[Any]:
    R, n = x.shape
    unmasked = x > -np.inf
    m = np.max(x, axis=1)
    zh, zl = fast.two_sum(x, -m[:, None])  # exact z = x - m <= 0 (inf on overflow)
    zh = np.where(unmasked, zh, -np.inf)
    zl = np.where(np.isfinite(zl), zl, 0.0)
    ones = unmasked & (zh == 0.0)
    n_eff = np.count_nonzero(unmasked, axis=1)
    C = eng.cutoff(n, max(fast.P_SCALAR, 2 * fmt.precision + 40), fmt.qmin)
    needs_beta = want in ("beta", "adaptive_softmax")
    need_h = want == "entropy" or (needs_beta and schedule.needs_entropy)
    ps1 = None
    if need_h or want == "softmax":
        ps1 = BatchPass(zh, zl, ones, unmasked, C, None, want_t=need_h, zrel=0.0)
    if want == "softmax":
        assert ps1 is not None
        return _coefficients(ps1, ones, fmt, np.ones(R, dtype=bool))
    out: list[Any] = [None] * R
    ok = np.ones(R, dtype=bool)
    bh, bl, brel = np.ones(R), np.zeros(R), np.zeros(R)
    for i in range(R):
        H = None
        if need_h:
            assert ps1 is not None
            H = row_entropy(ps1, i, entropy_eps)
            if H is None:
                ok[i] = False
                continue
            if want == "entropy":
                nonneg = eng.entropy_nonneg(ps1.eps[i].c, entropy_eps)
                out[i] = round_ball(H.mid, H.rel, fmt, H.extra_log2, nonneg=nonneg)
                continue
        b = eng.beta_ball(schedule, H, int(n_eff[i]), fast.P_SCALAR, entropy_eps)
        if want == "beta":
            out[i] = round_ball(b.mid, b.rel, fmt, b.extra_log2)
            continue
        if b.extra_log2 is not None or mpmath.libmp.mpf_sign(b.mid) <= 0:
            ok[i] = False
            continue
        bh[i], bl[i] = fast.dd_of(b.mid)
        brel[i] = b.rel
    if want in ("entropy", "beta"):
        return out
    ps2 = BatchPass(zh, zl, ones, unmasked, C, (bh, bl, brel), want_t=False, zrel=0.0)
    return _coefficients(ps2, ones, fmt, ok)


def _coefficients(ps: BatchPass, ones: np.ndarray, fmt: BinaryFormat, ok: np.ndarray) -> list:
    """Each row's certified coefficients from its pass (``None``: one is left open)."""
    R = ones.shape[0]
    ok = ok & ps.ok & (ps.n_tiny == 0)  # a tiny item's coefficient is mpmath's
    one = np.zeros(R)
    Rs = np.zeros(R)
    sh, sl = np.ones(R), np.zeros(R)
    for i, ep in enumerate(ps.eps):
        if not ok[i] or ep is None or not ep.s_rel < 0.25:
            ok[i] = False
            continue
        Rs[i] = ep.s_rel / (1.0 - ep.s_rel) * _SLACK
        sh[i], sl[i] = fast.dd_of(ep.s)
        v = round_ball(
            mpf_div(fone, ep.s, fast.P_SCALAR, fast.RN),
            (Rs[i] + fast.DIV_REL) * _SLACK + 2.0**-fast.P_SCALAR,
            fmt,
        )
        if v is None:
            ok[i] = False
            continue
        one[i] = v
    rel = (ps.rel_e + Rs[:, None] + ps.rel_e * Rs[:, None] + fast.DIV_REL) * _SLACK
    vals, decided = fast.round_vector(*fast.quotient(ps.eh, ps.el, sh[:, None], sl[:, None]),
                                      rel, fmt)  # fmt: skip
    ok &= np.all(decided | ~ps.fast, axis=1)
    vals = np.where(ps.fast, vals, 0.0)
    vals = np.where(ones, one[:, None], vals)
    return [vals[i] if ok[i] else None for i in range(R)]
