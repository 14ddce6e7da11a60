r"""The fast first attempt for attention: the query rows of a slice in double-double.

The mpmath path of :mod:`.attention` certifies one query row at a time, with one
``mpf_exp`` a key and pass. This pass takes the regular rows of many (batch, head)
slices together, as arrays of shape (rows, keys), each row with its own slice's
values and cutoff, and computes their exponentials
with the rows' vectorised double-double exponential (:func:`._fast.exp_dd`), their
sums exactly, and the outputs :math:`o_{ic} = N_{ic} / s_i`,
:math:`N_{ic} = \sum_j e_{ij} v_{jc}`, each with a rigorous bound. A row whose
every output ball rounds to one float of the target format is certified; any
other row goes to the mpmath path unchanged. So the results are the same floats
(Ziv's strategy: only the error bounds differ, and each is proved here). The
entropy and β of each row are the mpmath engine's scalar steps
(:func:`._engine.entropy_ball`, :func:`._engine.beta_ball`, and
:func:`._fast.guarded_entropy` for a guarded entropy), at :data:`~._fast.P_SCALAR` bits.

Notation as in :mod:`._fast`: :math:`u = 2^{-53}`; its bounds for the exponential
(:data:`~._fast.EXP_REL`), products (:data:`~._fast.PROD_REL`) and quotients
(:data:`~._fast.DIV_REL`); every bound below is multiplied by
:data:`~._engine.SLACK`.

**Shifts.** The exact logits are mpf numbers (:func:`.attention._logit_rows`), and
so are the shifts :math:`z_{ij} = x_{ij} - \max_k x_{ik} \le 0`, of any length.
Each is rounded to a double-double :math:`\tilde z = z_h + z_l`: its mantissa, cut
to 160 bits (relative error below :math:`2^{-159}`), is rounded to a float
:math:`h` (Python's int to float conversion rounds to nearest), the integer
remainder :math:`r` is exact and rounded to a float (an error of :math:`u|r|`,
:math:`|r| \le \mathrm{ulp}(h)/2`), and both are scaled by the mpf's power of two:
for :math:`2^{-900} \le |z| < 2^{990}` the high part exactly, the low part exactly
or, below the normal range, within :math:`2^{-1075} \le 2^{-175}|z|`. So
:math:`|\tilde z - z| \le (2^{-159} + 2^{-106} + 2^{-175})|z| \le 2^{-105}|z|`
(:data:`ZREL`), and :math:`|z_l|` is at most half an ulp of :math:`z_h`. A shift beyond
:math:`2^{990}` is dead (as an overflowed shift of a float row); a row with a
nonzero shift below :math:`2^{-900}` goes to mpmath. The maxima are the exact
zeros.

**The passes** (:class:`._fast_batch.BatchPass`: β = 1 for the entropy, then each
row's β) are those of the batched rows, with the shifts' error: β's relative
bound in :math:`\tilde y = \tilde\beta\tilde z` is
:math:`\rho_\beta + Z + \rho_\beta Z + 2^{-104} + 2^{-100}` (:math:`Z` =
:data:`ZREL`; :math:`Z` alone for β = 1), and each term of the entropy's
:math:`t` carries :math:`Z` more. The cutoff :math:`C` is the rows' plus
:math:`\log(1 + \max|v|)`, as in the mpmath path, so that dead keys with large
values stay negligible; dead and tiny keys (beyond :data:`~._fast.Y_TINY`, whatever
the format) are not computed, and their exponentials' sum is at most
:math:`2^{D_i}`. Sums are exact sums of the computed terms
(:func:`._fast_batch.line_sums`: within :math:`m\,2^{-129-K}`, :math:`2^{K}` the
scaling that puts the largest term in :math:`[1, 2)`).

**Numerators.** The terms of output :math:`(i, c)` are :math:`v_{jc}` for the
maxima (:math:`e = 1` exactly) and the double-double products
:math:`\tilde e_{ij} v_{jc}` (``two_prod`` of the high part, plus :math:`e_l v`),
within :data:`~._fast.PROD_REL` of the product of the computed exponential, which
is within :math:`\rho_{ij}` of :math:`e^{y_{ij}}`; a product below the normal
range costs at most :math:`2^{-1070}`. So

.. math::

    |\tilde N_{ic} - N_{ic}| \le E_{ic} = \Bigl(\max_j \rho_{ij} + 2^{-100}\Bigr) M_{ic}
    + m \bigl(2^{-129 - K_{ic}} + 2^{-1068}\bigr) + 2^{D_i} \max_j |v_{jc}|
    + 2^{-105} |\tilde N_{ic}|,

with :math:`M_{ic} \ge \sum_j |\tilde e_{ij} v_{jc}|` (the float64 sum of the high
parts' magnitudes times :math:`1 + (m + 4) 2^{-52}`), the dead and tiny keys'
share bounded by their exponentials' sum times the column's largest value, and
the last term the rounding of the exact integer sum to a double-double
:math:`\tilde N_{ic}`.

**Outputs.** :math:`o_{ic} = \tilde N_{ic} / \tilde s_i` is a double-double
quotient (:func:`._fast.quotient`); with :math:`r = E_{ic} / |\tilde N_{ic}|` and
:math:`R_s` the sum's bound relative to the computed :math:`\tilde s_i` (as for the
rows' coefficients), its relative error is at most
:math:`r + R_s + r R_s + 2^{-99}`. The rounding test is :func:`._fast.round_vector`
on :math:`|o_{ic}|`, the sign put back after (rounding to nearest is symmetric).
An output with :math:`\tilde N_{ic} = 0` or :math:`|\tilde N_{ic}| < 2^{-900}`, or
whose ball holds a rounding boundary, sends its row to mpmath, which also decides
exact zeros and their signs.
"""

from __future__ import annotations

import math
from typing import Any

import mpmath
import numpy as np

from . import _engine as eng
from . import _fast as fast
from ._fast_batch import MAX_TERMS, BatchPass, line_sums, row_entropy, to_dd
from ._rounding import BinaryFormat

__all__ = ["ZREL", "rows_outputs"]

#: Relative error bound of the double-double shifts.
ZREL = 2.0**-105

_SLACK = eng.SLACK
#: Shifts at or beyond 2**990 in magnitude are dead; nonzero ones below 2**-900 go to mpmath.
_Z_HUGE = 990
_Z_TINY = -900
#: Values at or beyond this are out of Dekker's split (their rows go to mpmath).
_V_MAX = 2.0**990
#: Elements of the (rows, keys, columns) product arrays a chunk of rows may hold.
_CHUNK = 1 << 18


def _dd_shifts(z: list) -> tuple[np.ndarray, np.ndarray] | None:
    """One row's shifts as double-doubles within :data:`ZREL` (``None``: one is too small)."""
    n = len(z)
    zh = np.zeros(n)
    zl = np.zeros(n)
    for k, (sign, man, exp, bc) in enumerate(z):
        if not man:
            continue
        if not sign:  # (a shift is never positive)
            return None
        man, exp, bc = int(man), int(exp), int(bc)
        if exp + bc > _Z_HUGE:
            zh[k] = -math.inf
            continue
        if exp + bc <= _Z_TINY:
            return None
        if bc > 160:
            cut = bc - 160
            man >>= cut
            exp += cut
        h = float(man)
        zh[k] = -math.ldexp(h, exp)
        zl[k] = -math.ldexp(float(man - int(h)), exp)
    return zh, zl


def rows_outputs(
    rows: list[Any],
    values: np.ndarray,
    which: np.ndarray,
    need: np.ndarray,
    fmt: BinaryFormat,
    schedule: Any,
    entropy_eps: float,
) -> list[np.ndarray | None]:
    """Certified outputs of regular query rows (``None``: the mpmath path decides).

    Parameters
    ----------
    rows : list
        The rows' exact shifts (``z``, mpf, over the unmasked keys ``index``; and
        ``n_eff``), all over the same ``S`` keys (masked ones included).
    values : numpy.ndarray
        The values of the slices the rows belong to, shape ``(G, S, dv)``, float64
        (a non-finite entry is read as 0: its outputs are the caller's, see `need`).
    which : numpy.ndarray
        Shape ``(len(rows),)``: each row's slice in `values`.
    need : numpy.ndarray
        Shape ``(len(rows), dv)``: the outputs to certify (a row's others are
        not looked at).
    fmt : BinaryFormat
        Target format.
    schedule : Schedule
        The temperature schedule.
    entropy_eps : float
        The entropy mode.

    Returns
    -------
    list
        Per row, its outputs (float64 array of shape ``(dv,)`` holding values of
        `fmt`; those not in `need` are meaningless) or ``None``.
    """
    R = len(rows)
    result: list[np.ndarray | None] = [None] * R
    if not fast.enabled() or not R:
        return result
    if entropy_eps != 0.0 and not fast.EPS_MIN <= entropy_eps <= fast.EPS_MAX:
        fast.STATS["attention_fallback"] += R
        return result
    G, S, dv = values.shape
    if S > MAX_TERMS:
        fast.STATS["attention_fallback"] += R
        return result
    v0 = np.where(np.isfinite(values), values, 0.0)
    col_max = np.max(np.abs(v0), axis=1) if S else np.zeros((G, dv))  # (G, dv)
    vmax = np.max(col_max, axis=1) if dv else np.zeros(G)
    # the cutoff of each slice: the rows' plus log(1 + max |v|) (values beyond 2**990: mpmath)
    C = eng.cutoff(S, max(fast.P_SCALAR, 2 * fmt.precision + 40), fmt.qmin)
    C = C + np.log1p(np.where(vmax < _V_MAX, vmax, 0.0))
    small = vmax < _V_MAX
    step = max(1, _CHUNK // max(1, S * max(dv, 1)))
    with np.errstate(all="ignore"):  # a non-finite intermediate never certifies (below)
        for lo in range(0, R, step):
            part = [i for i in range(lo, min(R, lo + step)) if small[which[i]]]
            if not part:
                continue
            g = which[part]
            try:
                done = _chunk([rows[i] for i in part], v0[g], col_max[g], need[part], C[g],
                              fmt, schedule, entropy_eps)  # fmt: skip
            except (eng.Undecided, ArithmeticError):
                done = [None] * len(part)
            for i, out in zip(part, done, strict=True):
                result[i] = out
    n_fast = sum(out is not None for out in result)
    fast.STATS["attention_fast"] += n_fast
    fast.STATS["attention_fallback"] += R - n_fast
    return result


def _chunk(
    rows: list[Any],
    v0: np.ndarray,
    col_max: np.ndarray,
    need: np.ndarray,
    C: np.ndarray,
    fmt: BinaryFormat,
    schedule: Any,
    entropy_eps: float,
) -> list[np.ndarray | None]:
    """Rows with their own values ``v0`` (R, S, dv), columns' maxima (R, dv) and cutoffs."""
    R = len(rows)
    S = v0.shape[1]
    zh = np.full((R, S), -np.inf)
    zl = np.zeros((R, S))
    unmasked = np.zeros((R, S), dtype=bool)
    ok = np.ones(R, dtype=bool)
    for i, row in enumerate(rows):
        shifts = _dd_shifts(row.z)
        if shifts is None:
            ok[i] = False
            continue
        zh[i, row.index], zl[i, row.index] = shifts
        unmasked[i, row.index] = True
    ones = unmasked & (zh == 0.0)
    # the entropy pass, then each row's β
    ps1 = None
    if schedule.needs_entropy:
        ps1 = BatchPass(zh, zl, ones, unmasked, C, None, want_t=True, zrel=ZREL)
    bh = np.ones(R)
    bl = np.zeros(R)
    brel = np.zeros(R)
    for i, row in enumerate(rows):
        if not ok[i]:
            continue
        H = None
        if ps1 is not None:
            H = row_entropy(ps1, i, entropy_eps)
            if H is None:
                ok[i] = False
                continue
        b = eng.beta_ball(schedule, H, row.n_eff, fast.P_SCALAR, entropy_eps)
        if b.extra_log2 is not None or mpmath.libmp.mpf_sign(b.mid) <= 0:
            ok[i] = False
            continue
        bh[i], bl[i] = fast.dd_of(b.mid)
        brel[i] = b.rel
    ps = BatchPass(zh, zl, ones, unmasked, C, (bh, bl, brel), want_t=False, zrel=ZREL)
    ok &= ps.ok
    # the numerators: the maxima's values (e = 1) and the live keys' products e v, summed
    # over the keys, by blocks of value columns (a (rows, keys, columns) array of at most
    # about _CHUNK elements at a time)
    eh = np.where(ones, 1.0, ps.eh)[:, None, :]
    el = np.where(ones, 0.0, ps.el)[:, None, :]
    dv = v0.shape[2]
    T = np.empty((R, dv), dtype=object)
    K = np.empty((R, dv), dtype=np.int64)
    sums_ok = np.empty((R, dv), dtype=bool)
    mass = np.empty((R, dv))
    width = max(1, _CHUNK // max(1, R * S))
    for c0 in range(0, dv, width):
        vt = np.swapaxes(v0[:, :, c0 : c0 + width], 1, 2)  # (rows, columns, keys)
        th, pe = fast.two_prod(eh, vt)
        th, tl = fast.fast_two_sum(th, pe + el * vt)
        cols = slice(c0, c0 + width)
        T[:, cols], K[:, cols], sums_ok[:, cols] = line_sums(th, tl)
        mass[:, cols] = np.sum(np.abs(th), axis=2) * (1.0 + (S + 4) * 2.0**-52)
    Nh, Nl = to_dd(T, -130 - K)
    absN = np.abs(Nh)
    dead = np.zeros(R)
    Rs = np.zeros(R)
    sh = np.ones(R)
    sl = np.zeros(R)
    for i, ep in enumerate(ps.eps):
        if ep is None or not ok[i] or not ep.s_rel < 0.25:
            ok[i] = False
            continue
        if ep.dead_log2 is not None:
            dead[i] = math.ldexp(1.0, max(ep.dead_log2, -1074))
        Rs[i] = ep.s_rel / (1.0 - ep.s_rel) * _SLACK
        sh[i], sl[i] = fast.dd_of(ep.s)
    resid = S * (np.ldexp(1.0, -129 - K) + 2.0**-1068)
    E = (
        (ps.max_rel[:, None] + fast.PROD_REL) * mass
        + resid
        + dead[:, None] * col_max
        + 2.0**-105 * absN
    ) * (1.0 + 2.0**-40)
    rN = E / (absN * (1.0 - 2.0**-50))
    rel = (rN + Rs[:, None] + rN * Rs[:, None] + fast.DIV_REL) * _SLACK
    oh, ol = fast.quotient(Nh, Nl, sh[:, None], sl[:, None])
    sign = np.where(oh < 0.0, -1.0, 1.0)
    vals, decided = fast.round_vector(oh * sign, ol * sign, rel, fmt)
    decided &= sums_ok & (absN >= 2.0**-900) & (rN < 2.0**-20)
    ok &= np.all(decided | ~need, axis=1)
    vals = vals * sign
    return [vals[i] if ok[i] else None for i in range(R)]
