r"""A fast first attempt for the reference: vectorised double-double with a-priori bounds.

Ziv's strategy needs, for each result, an approximation and a *rigorous* bound
on its error; it does not need mpmath. This module computes every quantity of
one regular row in double-double arithmetic (a value is an unevaluated sum
``hi + lo`` of two float64 numbers, about 106 bits) with numpy, vectorised over
the row, together with an error bound derived a priori (below). Where the
error ball of a value rounds to one float of the target format, that float is
the correctly rounded result; the few values whose ball holds a rounding
boundary are recomputed by mpmath (one item at a time, against the sums of this
pass), and when that is not enough either — or for anything this pass does not
cover — the row goes to the mpmath engine (:mod:`._engine`) unchanged. The
certification therefore has the same strength as the mpmath path: only the
error bounds differ, and each is proved here.

Notation: :math:`u = 2^{-53}`; ``fl`` is float64 rounding to nearest;
:math:`\gamma_n = nu/(1-nu)`. All results below hold when no intermediate
underflows; the pass keeps every intermediate in the normal range (items too
small for that are *tiny* and handled apart) and adds an absolute
:math:`2^{-1060}` per item where a product may still underflow.

**Error-free transformations.** ``two_sum(a, b)`` (Knuth, 6 flops) returns
:math:`s = \mathrm{fl}(a+b)` and :math:`e` with :math:`s + e = a + b` exactly;
``two_prod(a, b)`` (Dekker's product with Veltkamp's split, 17 flops, no FMA
needed) returns :math:`p = \mathrm{fl}(ab)` and :math:`e` with :math:`p + e = ab`
exactly, for :math:`|a|, |b| < 2^{996}`.

**The exponential** :math:`e^{y}`, :math:`y = y_h + y_l \in [-745, 0]`
(:func:`exp_dd`). Write :math:`\ln 2 = L_1 + L_2 + L_3 + \tau` with :math:`L_1, L_2`
of 42 significant bits, :math:`L_3` a float and :math:`|\tau| < 2^{-137}`. With
:math:`k = \mathrm{rint}(\mathrm{fl}(y_h / \ln 2))` (:math:`|k| \le 1075`, so
:math:`kL_1, kL_2` are exact), two ``two_sum`` give :math:`y_h - kL_1 - kL_2` exactly
as :math:`r_2 + e_1 + e_2`; the remaining terms :math:`e_1 + e_2 + y_l - \mathrm{fl}(kL_3)`
(each below :math:`2^{-43.9}` in sum) are added in float64, an error of at most
:math:`\gamma_3 2^{-43.9} + u|kL_3| + |k\tau| < 2^{-95}`. So :math:`r = y - k\ln 2`
is known as :math:`r_h + r_l` (``two_sum``) within :math:`\delta_r < 2^{-95}`, with
:math:`|r| < 0.35`. Then :math:`a = \mathrm{rint}(2^{13} r_h) 2^{-13}` (exact),
:math:`b = b_h + b_l` with :math:`b_h + b_l = (r_h - a) + r_l` (``two_sum``; the
subtraction is exact), :math:`|b| \le 2^{-14}`. A table holds
:math:`e^{a} = t_h + t_l` within :math:`2^{-105} e^a` (powers of
:math:`e^{\pm 2^{-13}}` at 320 bits, built once).
For :math:`E = e^b - 1 = b + b^2/2 + b^3(1/6 + b/24 + b^2/120 + b^3/720) + R`,
:math:`|R| \le |b|^7/5040 \cdot e^{|b|} < 2^{-110}`: the square is
``two_prod``\ (:math:`b_h, b_h`) plus :math:`2b_hb_l` (dropped :math:`b_l^2 < 2^{-130}`);
the cubic tail (below :math:`2^{-44.5}`) is evaluated in float64 at :math:`b_h`, with
at most :math:`7u` relative rounding error and :math:`|b^3 - b_h^3|/6 < 2^{-96}`
from dropping :math:`b_l`; the five small terms of :math:`E_l` are summed with
:math:`\gamma_3 2^{-44.4} < 2^{-95}`. So :math:`E_h + E_l` is within
:math:`2^{-94}` of :math:`E`. Finally
:math:`e^r = (t_h + t_l)(1 + E_h + E_l)`: ``two_prod``\ (:math:`t_h, E_h`) and
``two_sum``\ (:math:`t_h`, its high part) are exact, the five low terms (below
:math:`2^{-43.4}`) add :math:`\gamma_5 2^{-43.4} < 2^{-93.9}` and the dropped
:math:`t_lE_l < 2^{-97}`; relative to :math:`e^r \ge e^{-0.35}` the whole error is
below :math:`2^{-92}`, and the scaling by :math:`2^k` is exact in the normal
range. We use :data:`EXP_REL` :math:`= 2^{-90}` (a 4-fold margin), and
``tests/test_reference_fast.py`` checks the computed values against mpmath on
adversarial and random arguments (the largest error observed is about :math:`2^{-95.4}`).

**Products and quotients.** A double-double product :math:`(a_h + a_l)(b_h + b_l)`
is ``two_prod``\ (:math:`a_h, b_h`) plus :math:`a_hb_l + a_lb_h` in float64: the
error is below :math:`(3u \cdot 2u + u^2)|ab| < 2^{-100}|ab|` (:data:`PROD_REL`). A
quotient :math:`e / s` is :math:`q_1 = \mathrm{fl}(e_h / s_h)` corrected by
:math:`q_2 = \mathrm{fl}(((e_h - p) - p_e + e_l - q_1 s_l) / s_h)` with
:math:`p + p_e = q_1 s_h` (``two_prod``): :math:`e_h - p` is exact (Sterbenz), the
remainder is :math:`O(u)e` and is rounded with :math:`O(u^2)e`, and
dividing by :math:`s_h` instead of :math:`s` costs :math:`2u^2`: together below
:math:`2^{-100}` (:data:`DIV_REL`).

**Sums** (:func:`sum_dd`). The terms are non-negative high parts below 2 (the
:math:`e^{y_i} \le 1` and :math:`e^{y_i}|y_i| \le 1/e`) and low parts below
:math:`u`. Each high part is split exactly on the grids :math:`2^{-26}, 2^{-52},
\dots, 2^{-130}` (``(a + S) - S`` with :math:`S = 1.5 \cdot 2^{52 - 26j}` rounds to
the grid :math:`\mathrm{ulp}(S)`, and ``a - q`` is exact), each low part on
:math:`2^{-78}, 2^{-104}, 2^{-130}`; for :math:`n \le 2^{26}` terms (longer rows are
summed by groups of :math:`2^{26}`, each group's sums added exactly) every partial
sum of one level is a multiple of its grid below :math:`2^{53}` grid units, so
``numpy.sum`` adds each level *exactly*, in whatever order. What is left of
each term is below :math:`2^{-131}`. All terms are first scaled by the power of
two that puts the largest in :math:`[1, 2)`, so the computed sum is within
:math:`n 2^{-130}` times the largest term of the sum of the computed terms, and
is held exactly as an mpmath number. (A plain ``numpy.sum`` of the low parts would only be known
within Higham's :math:`\gamma_{n-1}\sum_i|l_i| \approx n u^2 \sum_i e_i`, about
:math:`2^{-86}` for :math:`n = 2^{20}`: the limit of the entropy's accuracy, and of β's.)

**Entropy, β, coefficients.** With :math:`s = c + \sigma` (:math:`c` maxima,
:math:`\sigma = \sum_{z_i < 0} e^{z_i}`) and :math:`t = \sum_i e^{z_i} z_i` known
with relative bounds (exp error :data:`EXP_REL`, product error, the summation
terms above divided by the sum, items dropped as dead or tiny carried as an
absolute mass), the entropy :math:`H = \log s - t/s`, β (the schedule's polynomial
with its Lipschitz propagation of the entropy's error) and the error of
:math:`y_i = \beta z_i` (:math:`|\tilde y_i - y_i| \le (\rho_\beta + 2^{-100})|y_i|`,
hence a relative error :math:`\operatorname{expm1}((\rho_\beta + 2^{-100})|y_i|)` in
:math:`e^{y_i}`) are bounded by the same scalar routines as the mpmath path
(:func:`._engine.entropy_ball`, :func:`._engine.beta_ball`), at 120 bits. A
coefficient :math:`e_i / s` has relative error
:math:`\rho_{e,i} + R_s + \rho_{e,i} R_s + 2^{-99}`.

**Rounding test** (:func:`round_vector`). A value :math:`v = v_h + v_l` with
radius :math:`\rho` is certified when it lies strictly inside the rounding
interval of :math:`f = \circ(v_h)`: for float32 and float16 the two midpoints
between :math:`f` and its neighbours are exact float64 numbers, and the gaps
:math:`(v_h - m) + v_l` are computed with their own rounding errors subtracted;
for float64 the half-ulps around the normalised :math:`v_h` are exact. An element
that fails goes to mpmath; ties are never decided here.

**Guarded entropy** (``entropy_eps`` :math:`= \varepsilon > 0`, :func:`guarded_entropy`).
:math:`H_\varepsilon = H - G` with :math:`G = \sum_i p_i \log(1 + \varepsilon/p_i)`,
as in the engine; each logarithm is :func:`log1p_dd`: :math:`y_0` = ``numpy.log1p``
(an uncertified float, used exactly) and one Newton step
:math:`\log(1 + r) = y_0 + \log((1 + r)e^{-y_0})` whose argument is within
:math:`2^{-40}` of 1, where three terms of the series suffice. The bounds are
derived in the two functions' docstrings.

Not covered (the mpmath engine answers): guards outside
[:data:`EPS_MIN`, :data:`EPS_MAX`] and schedules whose β is not positive. Rows of
any length are: rows beyond :math:`2^{26}` items went to the mpmath engine, about 60
times slower and three times the memory (1.5 s and 220 bytes per item for
:math:`2^{17}` items, against 0.026 s), until the exact level sums were added by groups.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

import mpmath
import numpy as np
from mpmath.libmp import (
    fone,
    from_float,
    from_int,
    fzero,
    mpf_abs,
    mpf_add,
    mpf_div,
    mpf_exp,
    mpf_mul,
    mpf_pos,
    mpf_sub,
    round_ceiling,
    round_nearest,
    to_float,
)

from softmaxtheory._formats import Quantity
from softmaxtheory.spec import Schedule

from . import _engine as eng
from ._rounding import BinaryFormat, round_ball

__all__ = [
    "DIV_REL",
    "EPS_MAX",
    "EPS_MIN",
    "EXP_REL",
    "PROD_REL",
    "SERIES_REL",
    "STATS",
    "add_t",
    "dd_of",
    "dead_weight_log2",
    "element_mp",
    "enabled",
    "evaluate",
    "exp_dd",
    "fast_two_sum",
    "guard_terms",
    "guarded_ball",
    "guarded_entropy",
    "log1p_dd",
    "mpf_of",
    "pass_from_sums",
    "pure_mpmath",
    "quotient",
    "round_vector",
    "scaled_exp",
    "sum_dd",
    "two_prod",
    "two_sum",
    "weighted",
]

RN = round_nearest
#: Relative error bound of :func:`exp_dd` (derived below :math:`2^{-92}`; a 4-fold margin).
EXP_REL = 2.0**-90
#: Relative error bound of a double-double product.
PROD_REL = 2.0**-100
#: Relative error bound of a double-double quotient (and of splitting ``s`` into two floats).
DIV_REL = 2.0**-99
#: Working precision (bits) of the scalar steps (entropy, β) done with mpmath.
P_SCALAR = 120
#: Rows longer than this go to the mpmath engine (the counts stay exact in a float64).
MAX_N = 1 << 52
#: Items whose level sums one float64 accumulates (:func:`sum_dd`): every partial sum
#: of a level then stays a multiple of its grid below 2**53 grid units, hence exact.
_GROUP = 1 << 26
#: For float64 targets, items with ``y < -Y_TINY`` are *tiny*: their mass is carried as
#: an absolute error and their coefficients go to mpmath one by one (keeps every
#: double-double intermediate in the normal range).
Y_TINY = 600.0
_U = 2.0**-53
_SLACK = eng.SLACK
_SPLITTER = 134217729.0  # 2**27 + 1
_TABLE_BITS = 13

#: Counters of the last :func:`evaluate` calls (for the benchmark): elements certified
#: by the fast pass, elements recomputed by mpmath one at a time, rows handed to the
#: mpmath engine; rows the batched pass of :mod:`._fast_batch` certified; and attention
#: rows the pass of :mod:`._fast_attention` certified or handed to the mpmath path.
STATS: dict[str, int] = {
    "fast": 0,
    "batch_rows": 0,
    "element_fallback": 0,
    "row_fallback": 0,
    "attention_fast": 0,
    "attention_fallback": 0,
}

_state = {"enabled": True}


def enabled() -> bool:
    """Whether the reference tries this fast pass first (the default)."""
    return _state["enabled"]


@contextlib.contextmanager
def pure_mpmath() -> Iterator[None]:
    """Within the block, the reference uses only the mpmath engine (for tests and benchmarks)."""
    old = _state["enabled"]
    _state["enabled"] = False
    try:
        yield
    finally:
        _state["enabled"] = old


# ---------------------------------------------------------------------------
# error-free transformations (numpy arrays or floats)
# ---------------------------------------------------------------------------


def two_sum(a: Any, b: Any) -> tuple[Any, Any]:
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def fast_two_sum(a: Any, b: Any) -> tuple[Any, Any]:
    """``|a| >= |b|`` (or a = 0): exact ``s + e = a + b``."""
    s = a + b
    return s, b - (s - a)


def _split(a: Any) -> tuple[Any, Any]:
    c = _SPLITTER * a
    h = c - (c - a)
    return h, a - h


def two_prod(a: Any, b: Any) -> tuple[Any, Any]:
    p = a * b
    ah, al = _split(a)
    bh, bl = _split(b)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


# ---------------------------------------------------------------------------
# exp in double-double
# ---------------------------------------------------------------------------


def _ln2_parts() -> tuple[float, float, float]:
    r""":math:`\ln 2 = L_1 + L_2 + L_3 + \tau`: two 42-bit parts and a float."""
    ln2 = mpmath.libmp.mpf_ln2(300, RN)
    l1 = mpf_pos(ln2, 42, RN)
    rest = mpf_sub(ln2, l1, 300, RN)
    l2 = mpf_pos(rest, 42, RN)
    l3 = mpf_sub(rest, l2, 300, RN)
    return to_float(l1), to_float(l2), to_float(l3)


_L1, _L2, _L3 = _ln2_parts()
_INV_LN2 = 1.0 / math.log(2.0)


@lru_cache(maxsize=1)
def _exp_table() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    r"""``exp(j 2**-13)`` as ``hi + lo`` for |j| <= 2900 (within 2**-105).

    The values are powers of :math:`e^{\pm 2^{-13}}` (mpmath at 320 bits, one
    multiplication per entry instead of an exponential): each product rounds
    by :math:`2^{-320}` and the two factors are within :math:`2^{-320}`, so the
    largest power is within :math:`2 \cdot 2900 \cdot 2^{-320} < 2^{-307}` of
    the exponential, and rounding ``lo`` to a float adds :math:`2^{-106}`.
    Also Veltkamp's split of ``hi`` (for Dekker's product).
    """
    half = 2900  # 0.354 * 2**13
    prec = 320
    hi = np.empty(2 * half + 1)
    lo = np.empty(2 * half + 1)
    step = mpmath.libmp.from_man_exp(1, -_TABLE_BITS)
    factors = (mpf_exp(step, prec, RN), mpf_exp(mpmath.libmp.mpf_neg(step), prec, RN))
    for sign, factor in zip((1, -1), factors, strict=True):
        v = fone
        for j in range(half + 1):
            if j:
                v = mpf_mul(v, factor, prec, RN)
            h = to_float(v, rnd=RN)
            hi[half + sign * j] = h
            lo[half + sign * j] = to_float(mpf_sub(v, from_float(h), prec, RN), rnd=RN)
    split_h, split_l = _split(hi)
    return hi, lo, split_h, split_l, half


def exp_dd(yh: np.ndarray, yl: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r""":math:`e^{y_h + y_l}` as ``hi + lo`` within :data:`EXP_REL` (relative).

    Parameters
    ----------
    yh, yl : numpy.ndarray
        A double-double argument, :math:`-745 \le y_h \le 0`, :math:`|y_l| \le`
        half an ulp of :math:`y_h`.

    Returns
    -------
    hi, lo : numpy.ndarray
        The exponential as an unevaluated sum (derivation in the module docstring);
        exact in the normal range of float64 (``y_h >= -708``), with an extra
        absolute error below :math:`2^{-1070}` below it.
    """
    th_tab, tl_tab, th_split_h, th_split_l, half = _exp_table()
    k = np.rint(yh * _INV_LN2)
    r1, e1 = two_sum(yh, -(k * _L1))
    r2, e2 = two_sum(r1, -(k * _L2))
    rl = ((e1 + e2) + yl) - k * _L3
    rh, rl = two_sum(r2, rl)
    j = np.rint(rh * 2.0**_TABLE_BITS)
    bh, bl = two_sum(rh - j * 2.0**-_TABLE_BITS, rl)
    s2h = bh * bh  # Dekker's square: s2h + s2e = bh**2 exactly
    sh_, sl_ = _split(bh)
    s2e = ((sh_ * sh_ - s2h) + 2.0 * (sh_ * sl_)) + sl_ * sl_
    cubic = (s2h * bh) * (1.0 / 6.0 + bh * (1.0 / 24.0 + bh * (1.0 / 120.0 + bh * (1.0 / 720.0))))
    Eh, e3 = two_sum(bh, 0.5 * s2h)
    El = ((e3 + bl) + (0.5 * s2e + bh * bl)) + cubic
    idx = j.astype(np.intp) + half
    th = th_tab[idx]
    tl = tl_tab[idx]
    ph = th * Eh  # Dekker's product with th's split from the table
    eh_, el_ = _split(Eh)
    ah, al = th_split_h[idx], th_split_l[idx]
    pe = ((ah * eh_ - ph) + ah * el_ + al * eh_) + al * el_
    Rh, re = two_sum(th, ph)
    lo = (((re + tl) + pe) + th * El) + tl * Eh
    Rh, lo = fast_two_sum(Rh, lo)
    ki = k.astype(np.int64)
    return np.ldexp(Rh, ki), np.ldexp(lo, ki)


_CHUNK = 1 << 14


def _chunked(
    fn: Any, n_out: int, *arrays: Any, dtypes: tuple[Any, ...] | None = None
) -> tuple[np.ndarray, ...]:
    """Apply an elementwise `fn` on cache-sized slices (same result, far fewer page faults).

    The first argument is an array; a later one may be a float, passed to every slice
    as it is. The outputs are float64 unless `dtypes` names theirs.
    """
    n = arrays[0].shape[0]
    outs = tuple(np.empty(n, dtype=dt) for dt in (dtypes or (np.float64,) * n_out))
    for lo in range(0, n, _CHUNK):
        sl = slice(lo, lo + _CHUNK)
        res = fn(*(a[sl] if isinstance(a, np.ndarray) else a for a in arrays))
        for o, r in zip(outs, res, strict=True):
            o[sl] = r
    return outs


def scaled_exp(zh: np.ndarray, zl: np.ndarray, bh: float, bl: float) -> tuple[Any, Any]:
    r""":math:`e^{\beta z}` with :math:`\beta = b_h + b_l` (the product in double-double)."""
    if bh == 1.0 and bl == 0.0:
        return exp_dd(zh, zl)
    if abs(bh) > _SPLIT_MAX:
        # Dekker's split of bh overflows ((2**27 + 1) bh): split bh / 2**64 instead and
        # scale the product back, exactly (a nonzero z is at least 2**-1074, so the
        # scaled product stays far above the subnormals; a larger one only overflows)
        ph, pe = two_prod(zh, bh * _SPLIT_SCALE_DOWN)
        ph, pe = ph * _SPLIT_SCALE_UP, pe * _SPLIT_SCALE_UP
    else:
        ph, pe = two_prod(zh, bh)
    return exp_dd(*fast_two_sum(ph, pe + (zh * bl + zl * bh)))


#: Above this a float's Dekker split overflows (it multiplies by 2**27 + 1); β beyond it
#: (Constant("1e308")) gave NaN and then a table index of -2**63.
_SPLIT_MAX = 2.0**995
_SPLIT_SCALE_DOWN, _SPLIT_SCALE_UP = 2.0**-64, 2.0**64


def weighted(eh: np.ndarray, el: np.ndarray, zh: np.ndarray, zl: np.ndarray) -> tuple[Any, Any]:
    """:math:`e |z|` in double-double (``z <= 0``)."""
    wh, we = two_prod(eh, -zh)
    return fast_two_sum(wh, we + (eh * -zl + el * -zh))


def quotient(eh: np.ndarray, el: np.ndarray, sh: float, sl: float) -> tuple[Any, Any]:
    """:math:`(e_h + e_l) / (s_h + s_l)` as ``q1 + q2`` (within :data:`DIV_REL`)."""
    q1 = eh / sh
    p, pe = two_prod(q1, sh)
    return q1, ((((eh - p) - pe) + el) - q1 * sl) / sh


# ---------------------------------------------------------------------------
# exact sums
# ---------------------------------------------------------------------------

#: ``(a + S) - S`` rounds ``a`` to the grid ulp(S): high parts (below 2) on the grids
#: 2**-26, 2**-52, ..., 2**-130; low parts (below 2**-53) on 2**-78, 2**-104, 2**-130.
_HI_LEVELS = tuple(1.5 * 2.0 ** (52 - 26 * j) for j in range(1, 6))
_LO_LEVELS = tuple(1.5 * 2.0 ** (52 - 26 * j) for j in range(3, 6))


def _level_sums(a: np.ndarray, levels: tuple[float, ...]) -> list[float]:
    """The exact level sums of one slice (each a float: see :func:`sum_dd`)."""
    sums = []
    rest = a
    for S in levels:
        q = (rest + S) - S
        rest = rest - q
        sums.append(float(np.sum(q)))
    return sums


def sum_dd(hi: np.ndarray, lo: np.ndarray) -> tuple[tuple, float]:
    """``sum(hi + lo)`` as an mpf tuple and an absolute error bound.

    The terms: ``hi >= 0`` and ``|lo|`` at most half an ulp of ``hi``; both are first
    scaled by the power of two that puts the largest ``hi`` in [1, 2).
    Each level is summed by slices; a level's partial sums over any subset of at
    most :data:`_GROUP` (:math:`2^{26}`) terms stay multiples of its grid below
    :math:`2^{53}` grid units, so every sum, and the sum of the slices' sums, is
    exact. The float sums of each group of :math:`2^{26}` terms are added to an
    exact mpmath total before the next group starts, so a row of any length is
    summed exactly. What is left of each term after the last level is below
    :math:`2^{-131}`.
    """
    n = hi.size
    if n == 0:
        return fzero, 0.0
    # scale by a power of two (exact) so that the largest term lies in [1, 2)
    top = float(hi.max())
    if not top > 0.0:
        raise eng.Undecided("a sum of zeros")
    K = 1 - math.frexp(top)[1]
    if K > 1000:
        raise eng.Undecided("terms too small to scale")
    scale = math.ldexp(1.0, K)
    total = fzero
    for arr, levels in ((hi, _HI_LEVELS), (lo, _LO_LEVELS)):
        sums = [0.0] * len(levels)
        for start in range(0, n, _CHUNK):
            if start and start % _GROUP == 0:  # a float holds the sums of _GROUP terms
                for v in sums:
                    total = mpf_add(total, from_float(v), 0)
                sums = [0.0] * len(levels)
            part = arr[start : start + _CHUNK] * scale  # exact: a power of two
            for i, v in enumerate(_level_sums(part, levels)):
                sums[i] += v
        for v in sums:
            total = mpf_add(total, from_float(v), 0)
    if total in (mpmath.libmp.fnan, mpmath.libmp.finf, mpmath.libmp.fninf):
        raise eng.Undecided("a non-finite sum")
    total = mpmath.libmp.mpf_shift(total, -K)
    err = (n * math.ldexp(2.0**-130, -K) + n * 2.0**-1060) * _SLACK
    return total, err


# ---------------------------------------------------------------------------
# the vector rounding test
# ---------------------------------------------------------------------------


def round_vector(
    vh: np.ndarray, vl: np.ndarray, rel: np.ndarray, fmt: BinaryFormat
) -> tuple[np.ndarray, np.ndarray]:
    """Correctly rounded values of positive ``vh + vl`` within ``rel``; and where decided."""
    vh, vl = fast_two_sum(vh, vl)
    radius = (rel * vh) * (1.0 + 2.0**-50) + 2.0**-1074
    if fmt.precision == 53:
        up = np.nextafter(vh, np.inf) - vh
        down = vh - np.nextafter(vh, -np.inf)
        g_hi = 0.5 * up - vl
        g_lo = 0.5 * down + vl
        ok = (
            (g_hi * (1.0 - 2.0**-51) > radius)
            & (g_lo * (1.0 - 2.0**-51) > radius)
            & (vh >= 2.0**-960)
        )
        return vh, ok
    f = vh.astype(fmt.dtype)
    nb_up = np.nextafter(f, fmt.dtype.type(np.inf)).astype(np.float64)
    nb_dn = np.nextafter(f, fmt.dtype.type(-np.inf)).astype(np.float64)
    f64 = f.astype(np.float64)
    m_hi = 0.5 * (f64 + nb_up)  # exact: one more bit than the format
    m_lo = 0.5 * (f64 + nb_dn)
    d_hi = m_hi - vh
    g_hi = d_hi - vl
    d_lo = vh - m_lo
    g_lo = d_lo + vl
    tiny = 2.0**-1072
    ok = (g_hi - 2.0**-52 * (np.abs(d_hi) + np.abs(g_hi)) - tiny > radius) & (
        g_lo - 2.0**-52 * (np.abs(d_lo) + np.abs(g_lo)) - tiny > radius
    )
    return f64, ok


# ---------------------------------------------------------------------------
# one row
# ---------------------------------------------------------------------------


def mpf_of(h: float, lo: float) -> tuple:
    return mpf_add(from_float(h), from_float(lo), 0)


def dd_of(v: tuple) -> tuple[float, float]:
    h = to_float(v)
    return h, to_float(mpf_sub(v, from_float(h), 60, RN))


class _Row:
    """The unmasked items of a regular row, shifted by the maximum, as exact double-doubles."""

    def __init__(self, x: np.ndarray, fmt: BinaryFormat) -> None:
        self.n = x.shape[0]
        self.fmt = fmt
        self.index = np.flatnonzero(x > -np.inf)
        xu = x if self.index.size == self.n else x[self.index]  # (no copy when none is masked)
        self.m = float(xu.max())
        with np.errstate(over="ignore", invalid="ignore"):
            zh, zl = two_sum(xu, -self.m)  # exact z = x - m <= 0 (inf on overflow)
        finite = np.isfinite(zh)
        self.ones = zh == 0.0
        self.c = int(np.count_nonzero(self.ones))
        self.C = eng.cutoff(self.n, max(P_SCALAR, 2 * fmt.precision + 40), fmt.qmin)
        self.y_tiny = Y_TINY if fmt.precision == 53 else math.inf
        # the items of the sums: finite and not a maximum (overflowed shifts are dead)
        self.n_overflow = int(np.count_nonzero(~finite))
        self.cand = np.flatnonzero(finite & ~self.ones)
        self.zh = zh[self.cand]
        self.zl = np.where(np.isfinite(zl[self.cand]), zl[self.cand], 0.0)
        self.xu = xu


def dead_weight_log2(n_dead: int, C: float, n_tiny: int, y_tiny: float) -> int | None:
    """``k`` with ``n_dead C e^-C + n_tiny C e^-y_tiny <= 2**k`` (``None`` for none)."""
    terms = []
    c2 = math.log2(max(C, 1.0))
    if n_dead:
        terms.append(math.log2(n_dead) + c2 - C / math.log(2.0))
    if n_tiny:
        terms.append(math.log2(n_tiny) + c2 - y_tiny / math.log(2.0))
    if not terms:
        return None
    return math.ceil(max(terms)) + 2


class _Pass:
    """Exponentials of one pass (``beta`` a Ball or None), their sums, and an ExpPass."""

    def __init__(self, row: _Row, beta: eng.Ball | None, want_t: bool) -> None:
        zh, zl = row.zh, row.zl
        C = row.C
        if beta is None:
            bh, bl, brel = 1.0, 0.0, 0.0
        else:
            bh, bl = dd_of(beta.mid)
            brel = (beta.rel + 2.0**-104 + PROD_REL) * _SLACK
            if row.n_overflow and bh < 1e-290:
                raise eng.Undecided("an overflowed shift may be alive for this tiny beta")
        with np.errstate(over="ignore"):
            ay = (-zh * bh) * (1.0 + 2.0**-49)  # >= |y|, inf on overflow
        live = ay * (1.0 - brel) * (1.0 - 2.0**-50) <= C
        fast = live & (ay < row.y_tiny)
        n_fast = int(np.count_nonzero(fast))
        if n_fast == fast.size:  # the common case: no copies
            n_dead, self.n_tiny = row.n_overflow, 0
            self.tiny = row.cand[:0]
            self.sel = row.cand
            zs, zls, ays = zh, zl, ay
        else:
            n_dead = int(live.size - np.count_nonzero(live)) + row.n_overflow
            self.n_tiny = int(np.count_nonzero(live & ~fast))
            self.tiny = row.cand[live & ~fast]
            sel = np.flatnonzero(fast)
            self.sel = row.cand[sel]
            zs, zls, ays = zh[sel], zl[sel], ay[sel]
        if zs.size and not -float(zs.min()) < 2.0**990:
            raise eng.Undecided("a live shift too large for Dekker's split (a tiny beta)")
        eh, el = _chunked(lambda a, b: scaled_exp(a, b, bh, bl), 2, zs, zls)
        if brel:
            with np.errstate(over="ignore"):
                em1 = np.expm1(ays * brel * (1.0 + 2.0**-50))
            rel_true = em1 + EXP_REL * (1.0 + em1)
            self.rel_e = np.where(rel_true < 0.5, rel_true / (1.0 - rel_true), np.inf) * _SLACK
            del em1, rel_true
        else:  # one bound for every item: a read-only view of one float, no n-array
            self.rel_e = np.broadcast_to(EXP_REL / (1.0 - EXP_REL) * _SLACK, (self.sel.size,))
        del ay, ays, live, fast  # (not kept while the sums below run)
        self.eh, self.el = eh, el
        max_rel = float(self.rel_e.max()) if self.rel_e.size else 0.0
        sigma, err = sum_dd(eh, el)
        dead_log2 = dead_weight_log2(n_dead, C, self.n_tiny, row.y_tiny)
        self.ep = pass_from_sums(row.c, self.sel.size, sigma, err, max_rel, dead_log2)
        self.ep.alive, self.ep.rel_e = self.sel, self.rel_e
        if want_t:
            # w = e |z| in double-double, then t = -sum(w)
            wh, wl = _chunked(weighted, 2, eh, el, zs, zls)
            add_t(self.ep, self.sel.size, *sum_dd(wh, wl), max_rel)


def pass_from_sums(
    c: int, n_items: int, sigma: tuple, sigma_err: float, max_rel: float, dead_log2: int | None
) -> eng.ExpPass:
    """A row's :class:`._engine.ExpPass` from the exact sum of its computed exponentials.

    `sigma` is the exact sum of the `n_items` computed terms, within `sigma_err` of
    the sum of their values; each term is within `max_rel` (relative to it) of its
    exponential; the `c` maxima weigh 1 each, and the dead and tiny items at most
    ``2**dead_log2`` together. ``alive`` and ``rel_e`` are left empty.
    """
    sigma_f = to_float(sigma)
    if sigma == fzero:
        sigma_rel = 0.0 if not n_items else math.inf
    else:
        sigma_rel = max_rel * (1.0 + 2 * max_rel) + sigma_err / (sigma_f * (1 - 2.0**-40))
        sigma_rel *= _SLACK
    s = mpf_add(from_int(c), sigma, 0)
    s_f = to_float(s)
    dead_rel = math.ldexp(1.0, max(dead_log2, -1070)) if dead_log2 is not None else 0.0
    s_rel = ((sigma_f / s_f) * sigma_rel + dead_rel) * _SLACK
    return eng.ExpPass(
        alive=np.empty(0, dtype=np.intp),
        e=[],
        rel_e=np.empty(0),
        c=c,
        sigma=sigma,
        sigma_rel=sigma_rel,
        dead_log2=dead_log2,
        s=s,
        s_rel=s_rel,
    )


def add_t(
    ep: eng.ExpPass, n_items: int, tsum: tuple, t_err: float, max_rel: float, zrel: float = 0.0
) -> None:
    r"""Attach :math:`t = -\sum e_i |z_i|` to `ep`, from the exact sum of its terms.

    `tsum` is the exact sum of the `n_items` double-double products :math:`e_i|z_i|`,
    within `t_err`; each is within `max_rel` (the exponential), ``PROD_REL`` (the
    product) and `zrel` (the shift) of its value. The dead items' share is `ep`'s.
    """
    if tsum == fzero:
        t_rel = 0.0 if not n_items else math.inf
    else:
        t_rel = (max_rel + PROD_REL + zrel + t_err / (to_float(tsum) * (1 - 2.0**-40))) * _SLACK
    ep.t = mpmath.libmp.mpf_neg(tsum)
    ep.t_rel = t_rel
    ep.t_dead_log2 = ep.dead_log2


def _coefficients(
    row: _Row, ps: _Pass, beta: eng.Ball | None
) -> tuple[np.ndarray, np.ndarray] | None:
    """Certified coefficients over the whole row, and the positions still to decide."""
    fmt = row.fmt
    ep = ps.ep
    if not ep.s_rel < 0.25:
        return None
    Rs = ep.s_rel / (1.0 - ep.s_rel) * _SLACK
    sh, sl = dd_of(ep.s)
    out = np.zeros(row.n, dtype=np.float64)
    undecided = []
    # the maxima: 1 / s
    one_rel = (Rs + DIV_REL) * _SLACK
    one = round_ball(mpf_div(fone, ep.s, P_SCALAR, RN), one_rel + 2.0**-P_SCALAR, fmt)
    if one is None:
        return None
    out[row.index[row.ones]] = one
    # the fast items: e / s in double-double, rounded where its ball allows (one pass over
    # slices: no quotient array of the whole row)
    rel_e = ps.rel_e
    if rel_e.size and rel_e.strides == (0,):  # one bound for every item: rel is one float
        rel_e = float(rel_e[0])
    rel = (rel_e + Rs + rel_e * Rs + DIV_REL) * _SLACK

    def decide(eh: np.ndarray, el: np.ndarray, r: Any) -> tuple[np.ndarray, np.ndarray]:
        return round_vector(*quotient(eh, el, sh, sl), r, fmt)

    vals, ok = _chunked(decide, 2, ps.eh, ps.el, rel, dtypes=(np.float64, bool))
    for lo in range(0, ok.size, _CHUNK):  # by slices: no index arrays of the whole row
        sel, done = ps.sel[lo : lo + _CHUNK], ok[lo : lo + _CHUNK]
        out[row.index[sel[done]]] = vals[lo : lo + _CHUNK][done]
    undecided = np.concatenate([ps.sel[~ok], ps.tiny])
    STATS["fast"] += int(np.count_nonzero(ok)) + row.c
    if undecided.size:
        STATS["element_fallback"] += int(undecided.size)
        for k in undecided.tolist():
            v = element_mp(row, k, ep, Rs, beta)
            if v is None:
                return None
            out[row.index[k]] = v
    return out, undecided


def element_mp(row: _Row, k: int, ep: eng.ExpPass, Rs: float, beta: eng.Ball | None) -> Any:
    """One coefficient by mpmath, against the sum of the fast pass (``None``: undecided)."""
    p = P_SCALAR
    u = 2.0**-p
    z = mpf_sub(from_float(float(row.xu[k])), from_float(row.m), 0)
    zabs = abs(to_float(z)) * (1.0 + 2.0**-50)
    if beta is None:
        y, a = z, 0.0
    else:
        y = mpf_mul(beta.mid, z, p, RN)
        bf = abs(to_float(beta.mid))
        a = bf * (1.0 + 2.0**-50) * zabs * (u + beta.rel + u * beta.rel) * _SLACK
    e = mpf_exp(y, p, RN)
    em1 = math.expm1(a) if a < 700 else math.inf
    rel_true = em1 + eng.KAPPA * u * (1.0 + em1)
    if not rel_true < 0.5:
        return None
    rel_e = rel_true / (1.0 - rel_true) * _SLACK
    v = mpf_div(e, ep.s, p, RN)
    rel = (rel_e + Rs + u + 2 * rel_e * Rs) * _SLACK
    return round_ball(v, rel, row.fmt)


# ---------------------------------------------------------------------------
# the guarded entropy
# ---------------------------------------------------------------------------

#: The guarded pass handles ``entropy_eps`` in ``[EPS_MIN, EPS_MAX]`` (keeps every
#: double-double intermediate in the normal range); other values go to mpmath.
EPS_MIN = 2.0**-700
EPS_MAX = 2.0**64
#: Largest ``log1p(eps / p)`` the guarded pass takes (``e^-600`` is far from underflow).
_LOG_MAX = 600.0
#: Largest ``|d|`` in :func:`log1p_dd` (the series' remainder is then below ``2**-161``).
_D_MAX = 2.0**-40
#: Below this, :func:`log1p_dd` sums the series of ``log1p(r)`` (a relative bound).
_SERIES_MAX = 2.0**-30
#: Relative error bound of :func:`log1p_dd` for arguments below ``2**-30``.
SERIES_REL = 2.0**-98


def log1p_dd(rh: np.ndarray, rl: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r""":math:`\log(1 + r)` for a positive double-double :math:`r = r_h + r_l`, by one Newton step.

    Parameters
    ----------
    rh, rl : numpy.ndarray
        A normalised double-double argument, :math:`2^{-701} \le r_h`, with
        :math:`\log(1 + r_h) \le 600`.

    Returns
    -------
    hi, lo, err : numpy.ndarray
        :math:`\lambda = \log(1 + r)` as ``hi + lo``, and ``err`` with
        :math:`|\lambda - (hi + lo)| \le \mathrm{err}` for the exact argument
        ``rh + rl`` (the caller adds the effect of an error of :math:`r` itself):
        :math:`(\mathrm{EXP\_REL} + \mathrm{PROD\_REL} + 2^{-104})(1 + 2^{-38})
        + 2^{-105}|hi| + 2^{-125}` by the Newton step, :data:`SERIES_REL`
        :math:`\cdot r_h` by the series (:func:`_log1p_series`, used for
        :math:`r_h < 2^{-30}`, where the Newton step's absolute bound would be a
        poor relative one). ``err`` is ``inf`` where :math:`\log(1 + r_h) > 600`
        or the Newton step does not land within :math:`2^{-40}` of 1 (never for a
        finite ``numpy.log1p``).

    Notes
    -----
    With :math:`y_0` = ``numpy.log1p(rh)`` (any float: it is only used exactly),
    :math:`\log(1 + r) = y_0 + \log P` with :math:`P = (1 + r)e^{-y_0}`, exactly.
    :math:`A = 1 + r` is formed by ``two_sum`` within :math:`2^{-105}`;
    :math:`e^{-y_0}` by :func:`exp_dd` within :data:`EXP_REL`; their double-double
    product within :data:`PROD_REL`. So the computed :math:`\tilde P = P(1 + \varepsilon)`
    with :math:`|\varepsilon| \le 2^{-105} + \mathrm{EXP\_REL} + \mathrm{PROD\_REL}`
    (to first order; the constant used, :math:`2^{-104}`, covers the products) and
    :math:`|\log \tilde P - \log P| \le |\varepsilon|/(1 - |\varepsilon|)`.
    :math:`\tilde d = \tilde P - 1 = d_h + d_l` is exact (``two_sum``; :math:`P_h - 1`
    is exact by Sterbenz's lemma). For :math:`|\tilde d| \le 2^{-40}`,
    :math:`\log(1 + \tilde d) = \tilde d - \tilde d^2/2 + \tilde d^3/3 + R` with
    :math:`|R| \le \tilde d^4/(4(1 - \tilde d)) < 2^{-161}`; the correction
    :math:`d_l - d_h^2(1/2 - d_h/3)` is computed with an absolute error below
    :math:`2^{-128}` (four roundings of a term below :math:`2^{-80}`, and the
    dropped :math:`d_hd_l` below :math:`2^{-132}`). The final ``two_sum`` of
    :math:`y_0 + d_h` is exact and adding the correction rounds once:
    :math:`u(u|hi| + 2^{-79})`. Every intermediate is normal: :math:`e^{-y_0} \ge
    e^{-600}`, :math:`A \le e^{600}` and the products are near 1.
    ``tests/test_reference_fast.py`` checks the values against mpmath.
    """
    with np.errstate(over="ignore", invalid="ignore"):  # out-of-range items: err = inf
        y0 = np.log1p(rh)
        bad = ~(y0 <= _LOG_MAX)  # also NaN
        y0 = np.where(bad, 0.0, y0)
        Eh, El = exp_dd(-y0, np.zeros_like(y0))
        Ah, Ae = two_sum(np.ones_like(rh), rh)
        Ah, Al = fast_two_sum(Ah, Ae + rl)  # |Ae + rl| <= 2u(1 + r): one rounding, 2**-105
        Ph, Pe = two_prod(Ah, Eh)
        Ph, Pl = two_sum(Ph, Pe + (Ah * El + Al * Eh))
        dh, dl = two_sum(Ph - 1.0, Pl)
        bad |= ~(np.abs(dh) <= _D_MAX)
        corr = dl - (dh * dh) * (0.5 - dh * (1.0 / 3.0))
        lh, le = two_sum(y0, dh)
        lh, ll = two_sum(lh, le + corr)
        dev = (
            (EXP_REL + PROD_REL + 2.0**-104) * (1.0 + 2.0**-38) + 2.0**-105 * np.abs(lh) + 2.0**-125
        ) * _SLACK
        # small arguments: the series, with a relative bound
        small = rh < _SERIES_MAX
        if np.any(small):
            sh, sl = _log1p_series(rh[small], rl[small])
            lh[small] = sh
            ll[small] = sl
            dev[small] = SERIES_REL * rh[small]
        dev[bad & ~small] = np.inf
    return lh, ll, dev


def _log1p_series(rh: np.ndarray, rl: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r""":math:`\log(1 + r) = r - r^2/2 + r^3/3 - r^4/4 + R` for :math:`0 < r < 2^{-30}`.

    :math:`|R| \le r^5/5 < 2^{-122}r`. :math:`r_h^2 = s + s_e` exactly
    (``two_prod``) and :math:`2r_hr_l` (below :math:`2^{-82}r`) is added with one
    rounding; the dropped :math:`r_l^2` is below :math:`2^{-136}r`. The cubic and
    quartic terms (below :math:`2^{-61}r`) are evaluated in float64 at :math:`r_h`
    (relative error below :math:`5u`, and :math:`|r^3 - r_h^3| \le 3.1ur^3`).
    ``two_sum``\ (:math:`r_h, -s/2`) is exact; the four low terms, each below
    :math:`2u\,r`, are added with an error below :math:`\gamma_4 \cdot 4u\,r <
    2^{-100}r`. Altogether the result is within :data:`SERIES_REL` :math:`\cdot r_h`
    (:math:`2^{-98}r_h`) of :math:`\log(1 + r_h + r_l)`.
    """
    s, se = two_prod(rh, rh)
    sq_low = se + 2.0 * (rh * rl)
    h1, e1 = two_sum(rh, -0.5 * s)
    low = e1 + ((rl - 0.5 * sq_low) + (s * rh) * (1.0 / 3.0 - 0.25 * rh))
    return two_sum(h1, low)


def guard_terms(
    eh: np.ndarray, el: np.ndarray, rho: np.ndarray, sh: float, sl: float, eps: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The terms ``g = p log(1 + eps / p)`` of :func:`guarded_entropy` and their error bounds.

    ``p = e / s`` with relative error ``rho``; the bound is ``inf`` where an
    intermediate leaves the range of the analysis.
    """
    ph, pl = fast_two_sum(*quotient(eh, el, sh, sl))
    rh, rl = fast_two_sum(*quotient(np.full(ph.shape, eps), np.zeros(ph.shape), ph, pl))
    lh, ll, dev = log1p_dd(np.where(rh < 2.0**900, rh, 1.0), np.where(rh < 2.0**900, rl, 0.0))
    rho_r = (rho + DIV_REL) * (1.0 + 2.0**-38) * _SLACK
    weight = np.minimum(1.0, rh * (1.0 + 2.0**-40))
    B = (rho_r * weight * (1.0 + 2.0**-39) + dev) * _SLACK
    gh, ge = two_prod(ph, lh)
    gh, gl = fast_two_sum(gh, ge + (ph * ll + pl * lh))
    err = (gh * (rho + PROD_REL) + ph * B) * (1.0 + 2.0**-38)
    ok = (ph >= 2.0**-900) & (rh < 2.0**900) & (gh >= 2.0**-900) & (err < np.inf)
    return gh, gl, np.where(ok, err, np.inf)


def guarded_entropy(row: _Row, ps: _Pass, H: eng.Ball, eps: float) -> eng.Ball | None:
    r"""The guarded entropy :math:`H - G`, :math:`G = \sum_i p_i \log(1 + \varepsilon / p_i)`.

    The same decomposition as the mpmath engine (:func:`._engine.entropy_ball`):
    :math:`H` from the pass's sums, :math:`G` a sum of positive terms. Here each
    :math:`p_i = e_i / s` is a double-double quotient (relative error
    :math:`\rho_i`, as for the coefficients), :math:`r_i = \varepsilon / p_i` a
    second one (relative error :math:`\rho_i + 2^{-99}` to first order, used
    with a :math:`1 + 2^{-38}` factor), :math:`\lambda_i = \log(1 + r_i)`
    (:func:`log1p_dd`; an error :math:`\delta` of :math:`r_i` moves it by at most
    :math:`\delta r_i/(1 + r_i) \le \delta \min(1, r_i)`) and
    :math:`g_i = p_i\lambda_i` a double-double product. So

    .. math:: |g_i - \tilde g_i| \le \tilde g_i(\rho_i + 2^{-100})(1 + 2^{-38})
              + \tilde p_i (1 + 2^{-38}) B_i

    with :math:`B_i` the absolute error bound of :math:`\lambda_i`; the
    :math:`\tilde g_i` are summed exactly (:func:`sum_dd`), the maxima
    (:math:`p = 1/s`) contribute :math:`c\,\tilde g_{\max}`, and a dead or tiny
    item (:math:`p \le e^{-Y}`, :math:`Y \ge 1`) contributes at most
    :math:`e^{-Y}(\log(1 + \varepsilon) + Y) \le (1 + \log(1 + \varepsilon))\,Y e^{-Y}`:
    the pass's dead bound times :math:`2(1 + \log(1 + \varepsilon))`, as in the
    engine. ``None`` when an argument leaves the covered range.
    """
    ep = ps.ep
    if not (EPS_MIN <= eps <= EPS_MAX) or not ep.s_rel < 2.0**-45:
        return None
    Rs = ep.s_rel / (1.0 - ep.s_rel) * _SLACK
    sh, sl = dd_of(ep.s)
    # the maxima (p = 1 / s) first, then the items of the pass
    eh = np.concatenate([[1.0], ps.eh])
    el = np.concatenate([[0.0], ps.el])
    rel_e = np.concatenate([[0.0], ps.rel_e])
    rho = (rel_e + Rs + rel_e * Rs + DIV_REL) * _SLACK
    if not float(rho.max()) < 2.0**-45:
        return None
    gh, gl, term_err = _chunked(lambda a, b, c: guard_terms(a, b, c, sh, sl, eps), 3, eh, el, rho)
    if not np.all(term_err < np.inf):
        return None  # an argument out of the covered range (also NaN)
    # the maxima: weight c
    g_items, sum_err = sum_dd(gh[1:], gl[1:]) if gh.size > 1 else (fzero, 0.0)
    g_max = mpf_mul(mpf_of(float(gh[0]), float(gl[0])), from_int(row.c), 0)
    G = mpf_add(g_items, g_max, 0)
    # a float sum of m >= 0 terms is within (m - 1)u/(1 - (m - 1)u) of the exact one
    grow = 2.0**-25 if term_err.size <= _GROUP else term_err.size * 2.0**-51
    G_abs = float(np.sum(term_err[1:])) * (1.0 + grow) + row.c * float(term_err[0]) + sum_err
    G_abs *= _SLACK
    return guarded_ball(H, G, G_abs, ep.dead_log2, eps)


def guarded_ball(
    H: eng.Ball, G: Any, G_abs: float, dead_log2: int | None, eps: float
) -> eng.Ball | None:
    r"""The ball of :math:`H - G` from the entropy's ball, the guard sum and its error bound.

    `G_abs` bounds :math:`|G - \tilde G|` for the live items; dead or tiny items
    (the pass's `dead_log2`) add at most :math:`2^{d+1}(1 + \log(1 + \varepsilon))`
    in relative terms, carried as the ball's extra term. ``None`` when the
    difference is zero at :data:`P_SCALAR` bits (its relative error is then unbounded).
    """
    G_extra = None
    if dead_log2 is not None:
        G_extra = dead_log2 + 1 + math.ceil(math.log2(1.0 + math.log1p(eps) * (1.0 + 2.0**-40)))
    mid = mpf_sub(H.mid, G, P_SCALAR, RN)
    if mid == fzero:
        return None
    mass = mpf_add(
        mpf_mul(mpf_abs(H.mid), from_float(H.rel), 60, round_ceiling),
        from_float(G_abs),
        60,
        round_ceiling,
    )
    ratio = to_float(mpf_div(mass, mpf_abs(mid), 60, round_ceiling), rnd="u")
    return eng.Ball(mid, (ratio + 2.0**-P_SCALAR) * _SLACK, eng.max_log2(H.extra_log2, G_extra))


def evaluate(
    x: np.ndarray,
    want: Quantity,
    fmt: BinaryFormat,
    schedule: Schedule,
    entropy_eps: float,
) -> Any:
    """Certify one result of one regular row by the fast pass, or return ``None``.

    Parameters
    ----------
    x : numpy.ndarray
        One regular row (finite values and ``-inf``, at least one finite), float64.
    want : str
        ``"softmax"``, ``"entropy"``, ``"beta"`` or ``"adaptive_softmax"``.
    fmt : BinaryFormat
        Target format.
    schedule : Schedule
        The temperature schedule.
    entropy_eps : float
        The entropy mode (``0.0``, or a guard in [:data:`EPS_MIN`, :data:`EPS_MAX`]).

    Returns
    -------
    numpy.ndarray, float or None
        The certified row (vector results, float64 array holding values of `fmt`)
        or scalar; ``None`` when this pass cannot certify it: the caller then runs
        the mpmath engine.
    """
    if not _state["enabled"] or x.shape[0] > MAX_N:
        return None
    if entropy_eps != 0.0 and not EPS_MIN <= entropy_eps <= EPS_MAX:
        STATS["row_fallback"] += 1
        return None
    try:
        with np.errstate(all="ignore"):  # a non-finite intermediate never certifies (below)
            result = _evaluate(np.asarray(x, dtype=np.float64), want, fmt, schedule, entropy_eps)
    except (eng.Undecided, ArithmeticError):
        result = None
    if result is None:
        STATS["row_fallback"] += 1
    return result


def _evaluate(
    x: np.ndarray, want: Quantity, fmt: BinaryFormat, schedule: Schedule, entropy_eps: float
) -> Any:
    row = _Row(x, fmt)
    needs_beta = want in ("beta", "adaptive_softmax")
    need_h = want == "entropy" or (needs_beta and schedule.needs_entropy)
    ps1 = None
    H = None
    if need_h or want == "softmax":
        ps1 = _Pass(row, None, want_t=need_h)
    if need_h:
        assert ps1 is not None
        H = eng.entropy_ball(ps1.ep, P_SCALAR, 0.0)
        if not H.rel < 2.0**-40:
            return None  # (a tiny t lost in the absolute underflow terms): mpmath decides
        if entropy_eps != 0.0:
            guarded = guarded_entropy(row, ps1, H, entropy_eps)
            if guarded is None or not guarded.rel < 2.0**-40:
                return None
            H = guarded
        if want == "entropy":
            nonneg = eng.entropy_nonneg(ps1.ep.c, entropy_eps)
            return round_ball(H.mid, H.rel, fmt, H.extra_log2, nonneg=nonneg)
    if want == "softmax":
        assert ps1 is not None
        res = _coefficients(row, ps1, None)
        return None if res is None else res[0]
    b = eng.beta_ball(schedule, H, row.index.size, P_SCALAR, entropy_eps)
    if want == "beta":
        return round_ball(b.mid, b.rel, fmt, b.extra_log2)
    if b.extra_log2 is not None or mpmath.libmp.mpf_sign(b.mid) <= 0:
        return None
    if b.mid == fone and b.rel == 0.0:
        ps2 = ps1 if ps1 is not None else _Pass(row, None, want_t=False)
        res = _coefficients(row, ps2, None)
    else:
        res = _coefficients(row, _Pass(row, b, want_t=False), b)
    return None if res is None else res[0]
