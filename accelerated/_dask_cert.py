r"""Certified enclosures of :mod:`softmaxtheory.accelerated.dask`, ``certified=True`` (private).

The reference certifies a row by a fast double-double pass with a-priori error
bounds (:mod:`softmaxtheory.reference._fast`) and, where that cannot decide, by
mpmath. Its sums are the only quantities that involve the whole row, and they
split over blocks: here each block of a row returns a few numbers per pass, these
merge exactly, and the row's readings are made from the merged numbers by the
reference's own scalar routines — so no task ever holds more than one block.

Passes (one dask task per block, then a tree of exact merges)
--------------------------------------------------------------
Let :math:`m` be the row's maximum (exact: the T7 states of the float path),
:math:`z_i = x_i - m` (exact as a double-double) and, for a pass with inverse
temperature β, :math:`e_i \approx e^{\beta z_i}` computed by
:func:`~softmaxtheory.reference._fast.exp_dd` (relative error ``rel_i``). A block
:math:`k` returns a :class:`Sums`:

* :math:`\sigma_k` — the sum of its computed :math:`e_i` (maxima excluded), *exactly*,
  as an mpmath number (the reference's exact level sums,
  :func:`~softmaxtheory.reference._fast.sum_dd`, over slices of :data:`SLICE` items
  added exactly), with the absolute bound :math:`\epsilon_k` of what those level
  sums leave out;
* :math:`\tau_k` likewise for :math:`e_i|z_i|` (the entropy pass);
* :math:`\max_i \mathrm{rel}_i`, and the numbers of items dropped as dead
  (:math:`\beta|z_i| > C`) or tiny (:math:`\beta|z_i| > 600`, float64 targets).

Merging adds the :math:`\sigma_k` and :math:`\tau_k` exactly (mpmath at unbounded
precision: associative, so the merged sums do not depend on the chunking or the
tree), adds the bounds :math:`\epsilon_k` rounding upward, takes the maximum of
the relative errors and adds the counts. Hence

.. math:: \Bigl|\sum_i e^{\beta z_i} - \sum_k \sigma_k\Bigr|
          \le \max_i \mathrm{rel}_i\,(1 + 2\max_i \mathrm{rel}_i) \sum_k\sigma_k
          + \sum_k \epsilon_k + (\text{dead and tiny mass}),

the bound the reference derives for one whole row (each :math:`\epsilon_k` is at
most :math:`n_k 2^{-130}` times the block's largest term, hence the sum at most
:math:`n 2^{-130}\sigma`). From the merged sums the reference's routines give the
entropy (:func:`~softmaxtheory.reference._engine.entropy_ball`), β
(:func:`~softmaxtheory.reference._engine.beta_ball`) and :math:`1/s`, with their
rounding tests. The ``entropy_eps`` mode adds one pass for
:math:`G = \sum_i p_i \log(1 + \varepsilon/p_i)` (terms and bounds from
:func:`~softmaxtheory.reference._fast.guard_terms`), the adaptive softmax one for
the tempered sums.

The coefficients :math:`e_i/s` are then rounded block by block, each with its own
error bound; one whose ball holds a rounding boundary is recomputed by mpmath
against the merged :math:`s`. A *check* pass does this first and counts, per row,
what is still undecided, so that the writing pass knows the outcome in advance.

Fallback
--------
A row falls back to the exact path (:mod:`._dask_exact`: the multiset of its
values merged in the same tree, read by the reference) when the reference's fast
pass would give up on it: an entropy, β or :math:`1/s` whose ball holds a
rounding boundary, a schedule that cannot tell on which side of its jump the
entropy lies, β ≤ 0, a guard outside the fast pass's range, a coefficient left
undecided by mpmath at 120 bits, and the rare arguments outside the analysis
(:class:`~softmaxtheory.reference._engine.Undecided`). The exact path holds a
whole row's distinct values in one task, so it must be rare; every other row is
certified from a few numbers per block.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any

import numpy as np
from mpmath.libmp import (
    fone,
    from_int,
    fzero,
    mpf_add,
    mpf_div,
    mpf_mul,
    mpf_neg,
    mpf_sign,
    to_float,
)

from .._certify.environment import certifying
from .._formats import QUANTITIES, ROW_INVALID, ROW_MASKED, ROW_REGULAR
from ..reference import _engine as eng
from ..reference import _fast as fast
from ..reference._rounding import BinaryFormat, format_for, round_ball
from ..spec import Schedule
from . import _dask_exact as ex

__all__: list[str] = []


P = fast.P_SCALAR
SLACK = eng.SLACK
#: Items of a block handled at once. Small, so that numpy's temporaries (32 KiB) are
#: reused from the heap: ``dask.distributed`` starts its workers with
#: ``MALLOC_TRIM_THRESHOLD_=65536``, under which every larger temporary is a fresh
#: ``mmap`` whose pages fault in one by one (slices of 2**14 items ran five times slower
#: in a worker than in the client). The reference's exact sums take up to 2**26 terms.
SLICE = 1 << 12
_UP = 1.0 + 2.0**-50  # float additions of non-negative bounds, rounded upward


def _up(a: float, b: float) -> float:
    return (a + b) * _UP


# ---------------------------------------------------------------------------
# configuration and per-row readings
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """What a certified graph computes, and the constants of its passes."""

    want: str  # "softmax", "entropy", "beta" or "adaptive_softmax"
    schedule: Schedule
    eps: float
    dtype: np.dtype  # the result's dtype (β: float64)
    n: int  # the row's length (masked entries included): sets the dead cutoff

    def __post_init__(self) -> None:
        if self.want not in QUANTITIES:
            raise ValueError(f"want must be one of {QUANTITIES}, got {self.want!r}")

    @property
    def fmt(self) -> BinaryFormat:
        """The target format."""
        return format_for(self.dtype)

    @property
    def cutoff(self) -> float:
        r"""Items with :math:`\beta|z| > C` are dead (the reference's fast pass's C)."""
        fmt = self.fmt
        return eng.cutoff(self.n, max(P, 2 * fmt.precision + 40), fmt.qmin)

    @property
    def y_tiny(self) -> float:
        """Items beyond this are tiny (float64 targets): mass as error, mpmath one by one."""
        return fast.Y_TINY if self.fmt.precision == 53 else math.inf

    @property
    def need_h(self) -> bool:
        """The entropy is needed."""
        return self.want == "entropy" or (
            self.want in ("beta", "adaptive_softmax") and self.schedule.needs_entropy
        )

    @property
    def vector(self) -> bool:
        """The result has one value per item."""
        return self.want in ("softmax", "adaptive_softmax")

    def __dask_tokenize__(self) -> tuple:
        return ("softmaxtheory-certified-config", self.want, repr(self.schedule), self.eps,
                str(self.dtype), self.n)  # fmt: skip


@dataclass(frozen=True)
class Row:
    """What is known of one row; each pass's reading adds to it.

    ``fallback`` names why the row goes to the exact path (empty: it does not).
    ``s``, ``s_rel`` and ``beta`` describe the pass whose coefficients are written;
    ``one`` is the certified :math:`1/s` of the maxima.
    """

    kind: int
    m: float = -math.inf
    c: int = 0
    n_eff: int = 0
    fallback: str = ""
    ep: Any = None  # eng.ExpPass of the β = 1 pass
    H: Any = None  # eng.Ball
    beta: Any = None  # eng.Ball (None: β = 1 exactly)
    entropy: float = math.nan
    beta_value: float = math.nan
    s: Any = None
    s_rel: float = math.inf
    one: float = math.nan
    undecided: int = 0
    exact: Any = None  # ex.CertifiedRow of a fallback row

    @property
    def live(self) -> bool:
        """A regular row still certified by the enclosures."""
        return self.kind == ROW_REGULAR and not self.fallback

    def fail(self, why: str) -> Row:
        """The row, sent to the exact path."""
        return self if self.fallback else replace(self, fallback=why)


def row_from_state(state: Any) -> Row:
    """The :class:`Row` of a merged float T7 state (kind, maximum and counts are exact)."""
    if state["bad"]:
        return Row(ROW_INVALID)
    if state["m"] == -math.inf:
        return Row(ROW_MASKED)
    return Row(ROW_REGULAR, float(state["m"]), int(state["c"]), int(state["n"]))


def rows_from_states(states: np.ndarray, cfg: Config) -> np.ndarray:
    """Readings straight from the states (β or the adaptive softmax of schedules without H)."""
    flat = states.reshape(-1)
    out = np.empty(flat.size, dtype=object)
    for i in range(flat.size):
        out[i] = after_entropy(row_from_state(flat[i]), cfg)
    return out.reshape(states.shape)


def after_entropy(row: Row, cfg: Config) -> Row:
    """Once the entropy is known (or not needed): its value, β, or the coefficients' setup."""
    if not row.live:
        return row
    fmt = cfg.fmt
    if cfg.want == "entropy":
        H = row.H
        nonneg = eng.entropy_nonneg(row.ep.c, cfg.eps)
        h = round_ball(H.mid, H.rel, fmt, H.extra_log2, nonneg=nonneg)
        return row.fail("the entropy is undecided") if h is None else replace(row, entropy=h)
    if cfg.want == "softmax":
        return coefficients_setup(row, row.ep, None, fmt)
    try:
        b = eng.beta_ball(cfg.schedule, row.H, row.n_eff, P, cfg.eps)
    except eng.Undecided:
        return row.fail("the entropy is at the schedule's jump")
    if cfg.want == "beta":
        v = round_ball(b.mid, b.rel, fmt, b.extra_log2)
        return row.fail("beta is undecided") if v is None else replace(row, beta_value=v)
    if b.extra_log2 is not None or mpf_sign(b.mid) <= 0:
        return row.fail("beta is not positive")
    one = b.mid == fone and b.rel == 0.0
    return replace(row, beta=None if one else b)


def coefficients_setup(row: Row, ep: eng.ExpPass, beta: Any, fmt: BinaryFormat) -> Row:
    """The sum of a pass and the certified :math:`1/s` (the reference's ``_coefficients``)."""
    if not ep.s_rel < 0.25:
        return row.fail("the sum is too uncertain")
    Rs = ep.s_rel / (1.0 - ep.s_rel) * SLACK
    one_rel = (Rs + fast.DIV_REL) * SLACK
    one = round_ball(mpf_div(fone, ep.s, P, fast.RN), one_rel + 2.0**-P, fmt)
    if one is None:
        return row.fail("1/s is undecided")
    return replace(row, s=ep.s, s_rel=ep.s_rel, beta=beta, one=one)


# ---------------------------------------------------------------------------
# one block of one row: the items of a pass
# ---------------------------------------------------------------------------


def _beta_parts(beta: Any) -> tuple[float, float, float]:
    """(high, low, relative bound) of β for :func:`_items` (``None``: exactly 1)."""
    if beta is None:
        return 1.0, 0.0, 0.0
    bh, bl = fast.dd_of(beta.mid)
    return bh, bl, (beta.rel + 2.0**-104 + fast.PROD_REL) * SLACK


def _items(x: np.ndarray, m: float, beta: Any, cfg: Config) -> SimpleNamespace:
    """The items of one block of one row in a pass with `beta` (the reference's ``_Pass``).

    Positions are into the block; ``fast`` items get their exponentials ``eh + el``
    with relative bounds ``rel``; ``tiny`` items (float64 targets) only count.
    """
    idx = np.flatnonzero(x > -np.inf)
    xu = x[idx]
    zh, zl = fast.two_sum(xu, -m)  # exact z = x - m <= 0 (inf on overflow)
    finite = np.isfinite(zh)
    ones = idx[zh == 0.0]
    n_overflow = int(np.count_nonzero(~finite))
    cand = np.flatnonzero(finite & (zh != 0.0))
    zh = zh[cand]
    zl = np.where(np.isfinite(zl[cand]), zl[cand], 0.0)
    bh, bl, brel = _beta_parts(beta)
    if n_overflow and bh < 1e-290:
        raise eng.Undecided("an overflowed shift may be alive for this tiny beta")
    ay = (-zh * bh) * (1.0 + 2.0**-49)
    live = ay * (1.0 - brel) * (1.0 - 2.0**-50) <= cfg.cutoff
    sel = live & (ay < cfg.y_tiny)
    zs, zls, ays = zh[sel], zl[sel], ay[sel]
    if zs.size and not -float(zs.min()) < 2.0**990:
        raise eng.Undecided("a live shift too large for Dekker's split (a tiny beta)")
    eh, el = fast.scaled_exp(zs, zls, bh, bl)
    if brel:
        em1 = np.expm1(ays * brel * (1.0 + 2.0**-50))
        rel_true = em1 + fast.EXP_REL * (1.0 + em1)
        rel = np.where(rel_true < 0.5, rel_true / (1.0 - rel_true), np.inf) * SLACK
    else:
        rel = np.full(zs.size, fast.EXP_REL / (1.0 - fast.EXP_REL) * SLACK)
    n_live = int(np.count_nonzero(live))
    return SimpleNamespace(
        idx=idx,
        xu=xu,
        ones=ones,
        fast=idx[cand[sel]],
        fast_u=cand[sel],  # positions among the unmasked items
        tiny_u=cand[live & ~sel],
        n_dead=cand.size - n_live + n_overflow,
        n_tiny=n_live - zs.size,
        zs=zs,
        zls=zls,
        eh=eh,
        el=el,
        rel=rel,
    )


def _slices(n: int) -> range:
    return range(0, n, SLICE)


# ---------------------------------------------------------------------------
# records of one block of one row, and their merges
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Sums:
    """A pass's sums over some blocks of a row: exact values, bounds and counts."""

    row: Row
    sigma: tuple = fzero
    sigma_err: float = 0.0
    t: tuple = fzero
    t_err: float = 0.0
    max_rel: float = 0.0
    n_fast: int = 0
    n_dead: int = 0
    n_tiny: int = 0
    bad: str = ""

    def merge(self, o: Sums) -> Sums:
        """``self ⊕ o``: exact sums, upward bounds, maxima and counts (keeps ``self.row``)."""
        return replace(
            self,
            sigma=mpf_add(self.sigma, o.sigma, 0),
            sigma_err=_up(self.sigma_err, o.sigma_err),
            t=mpf_add(self.t, o.t, 0),
            t_err=_up(self.t_err, o.t_err),
            max_rel=max(self.max_rel, o.max_rel),
            n_fast=self.n_fast + o.n_fast,
            n_dead=self.n_dead + o.n_dead,
            n_tiny=self.n_tiny + o.n_tiny,
            bad=self.bad or o.bad,
        )


@dataclass(frozen=True)
class Count:
    """Coefficients left undecided in some blocks of a row (the check pass)."""

    row: Row
    undecided: int = 0
    bad: str = ""

    def merge(self, o: Count) -> Count:
        """Add the counts."""
        return replace(self, undecided=self.undecided + o.undecided, bad=self.bad or o.bad)


@dataclass(frozen=True)
class Exact:
    """The exact state of some blocks of a fallback row (identity for the others)."""

    row: Row
    state: ex.ExactState

    def merge(self, o: Exact) -> Exact:
        """The union of the multisets."""
        return replace(self, state=self.state.merge(o.state))


def fold(parts: Any) -> np.ndarray:
    """Merge nested lists of equally shaped record arrays left to right (a new array)."""
    if not isinstance(parts, list):
        return parts
    parts = [fold(p) for p in parts]
    acc = parts[0].reshape(-1).copy()
    for part in parts[1:]:
        flat = part.reshape(-1)
        for i in range(acc.size):
            acc[i] = acc[i].merge(flat[i])
    return acc.reshape(parts[0].shape)


def _guarded_call(fn: Any, *args: Any) -> Any:
    """``fn(*args)``, or ``None`` with the reason where the analysis does not cover it."""
    try:
        with np.errstate(all="ignore"):  # a non-finite intermediate never certifies
            return fn(*args), ""
    except (eng.Undecided, ArithmeticError) as exc:
        return None, f"{type(exc).__name__}: {exc}"


# ---------------------------------------------------------------------------
# the block functions (one task: one block of rows)
# ---------------------------------------------------------------------------


def _slice_sums(x: np.ndarray, row: Row, beta: Any, cfg: Config, want_t: bool) -> Sums:
    it = _items(x, row.m, beta, cfg)
    rec = Sums(row, n_fast=it.zs.size, n_dead=it.n_dead, n_tiny=it.n_tiny)
    if not it.zs.size:
        return rec
    sigma, err = fast.sum_dd(it.eh, it.el)  # exact, with the bound of what it leaves out
    rec = replace(rec, sigma=sigma, sigma_err=err, max_rel=float(it.rel.max()))
    if want_t:
        t, terr = fast.sum_dd(*fast.weighted(it.eh, it.el, it.zs, it.zls))
        rec = replace(rec, t=t, t_err=terr)
    return rec


def _block_sums(x: np.ndarray, row: Row, beta: Any, cfg: Config, want_t: bool) -> Sums:
    """The sums of one block of one row: its slices' sums, merged in order."""
    rec = Sums(row)
    for a in _slices(x.size):
        rec = rec.merge(_slice_sums(x[a : a + SLICE], row, beta, cfg, want_t))
    return rec


@certifying("a certified dask result")  # (in the worker: its own environment)
def block_sums(x2: np.ndarray, rows: np.ndarray, cfg: Config, stage: str) -> np.ndarray:
    r"""One :class:`Sums` per row of a ``(rows, nk)`` block.

    `stage` ``"entropy"``: the β = 1 pass (with :math:`\tau` where the entropy is
    needed), `rows` are merged float states; ``"tempered"``: the pass at each row's β.
    """
    out = np.empty(x2.shape[0], dtype=object)
    for i in range(x2.shape[0]):
        row = row_from_state(rows[i]) if stage == "entropy" else rows[i]
        if stage == "entropy" and cfg.eps != 0.0 and not fast.EPS_MIN <= cfg.eps <= fast.EPS_MAX:
            row = row.fail("entropy_eps outside the fast pass's range")
        if not row.live or x2.shape[1] == 0:
            out[i] = Sums(row)
            continue
        if stage == "entropy":
            args = (None, cfg, cfg.need_h)
        elif row.beta is None and row.ep is not None:
            out[i] = Sums(row)  # β = 1: the entropy pass's sums serve
            continue
        else:
            args = (row.beta, cfg, False)
        rec, why = _guarded_call(_block_sums, x2[i], row, *args)
        out[i] = rec if rec is not None else Sums(row, bad=why)
    return out


def _expass(S: Sums, cfg: Config, want_t: bool) -> eng.ExpPass:
    """The merged sums as the reference's :class:`~._engine.ExpPass` (its ``_Pass``)."""
    row = S.row
    C, y_tiny = cfg.cutoff, cfg.y_tiny
    sigma_f = to_float(S.sigma)
    if S.sigma == fzero:
        sigma_rel = 0.0 if not S.n_fast else math.inf
    else:
        sigma_rel = (
            S.max_rel * (1.0 + 2 * S.max_rel) + S.sigma_err / (sigma_f * (1 - 2.0**-40))
        ) * SLACK
    dead_log2 = fast.dead_weight_log2(S.n_dead, C, S.n_tiny, y_tiny)
    s = mpf_add(from_int(row.c), S.sigma, 0)
    s_f = to_float(s)
    dead_rel = math.ldexp(1.0, max(dead_log2, -1070)) if dead_log2 is not None else 0.0
    s_rel = ((sigma_f / s_f) * sigma_rel + dead_rel) * SLACK
    empty = np.empty(0)
    ep = eng.ExpPass(empty, [], empty, row.c, S.sigma, sigma_rel, dead_log2, s, s_rel)
    if want_t:
        t_f = to_float(S.t)
        if S.t == fzero:
            t_rel = 0.0 if not S.n_fast else math.inf
        else:
            t_rel = (S.max_rel + fast.PROD_REL + S.t_err / (t_f * (1 - 2.0**-40))) * SLACK
        ep.t = mpf_neg(S.t)
        ep.t_rel = t_rel
        ep.t_dead_log2 = dead_log2
    return ep


class Reader:
    """The last merge of a pass's tree, then each row's reading (one task per row block).

    Reading in the reduction's last node (not in a blockwise map after it) keeps it
    one task: dask fuses a blockwise map into each block of its consumer.
    """

    def __init__(self, stage: str, cfg: Config) -> None:
        self.stage = stage
        self.cfg = cfg

    def __call__(self, parts: Any, axis: Any = None, keepdims: bool = True) -> np.ndarray:
        merged = fold(parts)
        flat = merged.reshape(-1)
        out = np.empty(flat.size, dtype=object)
        read = getattr(self, "_" + self.stage)
        for i in range(flat.size):
            rec = flat[i]
            row = rec.row
            if self.stage == "exact":
                out[i] = read(row, rec)  # the reference's PrecisionError propagates
            elif row.live and getattr(rec, "bad", ""):
                out[i] = row.fail(rec.bad)
            elif row.live:
                out[i], why = _guarded_call(read, row, rec)
                if out[i] is None:
                    out[i] = row.fail(why)
            else:
                out[i] = row
        return out.reshape(merged.shape)

    def __dask_tokenize__(self) -> tuple:
        return ("softmaxtheory-certified-reader", self.stage, self.cfg.__dask_tokenize__())

    def _entropy(self, row: Row, S: Sums) -> Row:
        cfg = self.cfg
        ep = _expass(S, cfg, cfg.need_h)
        row = replace(row, ep=ep)
        if cfg.need_h:
            H = eng.entropy_ball(ep, P, 0.0)
            if not H.rel < 2.0**-40:
                return row.fail("the entropy's bound is too wide")
            row = replace(row, H=H)
            if cfg.eps != 0.0:
                return row  # the guard's pass follows
        return after_entropy(row, cfg)

    def _guard(self, row: Row, S: Sums) -> Row:
        H = guarded_entropy(row, S, self.cfg.eps)
        if H is None or not H.rel < 2.0**-40:
            return row.fail("the guarded entropy is undecided")
        return after_entropy(replace(row, H=H), self.cfg)

    def _tempered(self, row: Row, S: Sums) -> Row:
        one = row.beta is None and row.ep is not None  # β = 1: the entropy pass's sums
        ep = row.ep if one else _expass(S, self.cfg, False)
        return coefficients_setup(row, ep, row.beta, self.cfg.fmt)

    def _check(self, row: Row, rec: Count) -> Row:
        if rec.undecided:
            return row.fail(f"{rec.undecided} coefficients undecided")
        return row

    def _exact(self, row: Row, rec: Exact) -> Row:
        if not row.fallback:
            return row
        cfg = self.cfg
        reading = ex.read_state(rec.state, cfg.want, cfg.schedule, cfg.eps, cfg.dtype)
        return replace(row, exact=reading)


def _block_guard(x: np.ndarray, row: Row, cfg: Config) -> Sums:
    r"""The guard's terms :math:`p_i\log(1 + \varepsilon/p_i)` of one block (``_guarded``)."""
    ep = row.ep
    Rs = ep.s_rel / (1.0 - ep.s_rel) * SLACK
    sh, sl = fast.dd_of(ep.s)
    rec = Sums(row)
    for a in _slices(x.size):
        rec = rec.merge(_slice_guard(x[a : a + SLICE], row, cfg, Rs, sh, sl))
    return rec


def _slice_guard(x: np.ndarray, row: Row, cfg: Config, Rs: float, sh: float, sl: float) -> Sums:
    it = _items(x, row.m, None, cfg)
    if not it.zs.size:
        return Sums(row)
    rho = (it.rel + Rs + it.rel * Rs + fast.DIV_REL) * SLACK
    if not float(rho.max()) < 2.0**-45:
        raise eng.Undecided("a probability's bound is too wide for the guard")
    gh, gl, term_err = fast.guard_terms(it.eh, it.el, rho, sh, sl, cfg.eps)
    if not np.all(term_err < np.inf):
        raise eng.Undecided("a guard term out of the covered range")
    g, err = fast.sum_dd(gh, gl)
    # sigma: the terms' exact sum and its bound; t_err: the terms' own bounds
    return Sums(row, sigma=g, sigma_err=err, t_err=float(np.sum(term_err)) * (1.0 + 2.0**-25))


@certifying("a certified dask result")  # (in the worker: its own environment)
def block_guard(x2: np.ndarray, rows: np.ndarray, cfg: Config) -> np.ndarray:
    """One guard :class:`Sums` per row of a block."""
    out = np.empty(x2.shape[0], dtype=object)
    for i in range(x2.shape[0]):
        row = rows[i]
        if not row.live or x2.shape[1] == 0:
            out[i] = Sums(row)
            continue
        rec, why = _guarded_call(_block_guard, x2[i], row, cfg)
        out[i] = rec if rec is not None else Sums(row, bad=why)
    return out


def guarded_entropy(row: Row, S: Sums, eps: float) -> eng.Ball | None:
    r"""The guarded entropy :math:`H - G` from the merged guard sums (the tail of ``_guarded``)."""
    ep = row.ep
    H = row.H
    if not (fast.EPS_MIN <= eps <= fast.EPS_MAX) or not ep.s_rel < 2.0**-45:
        return None
    Rs = ep.s_rel / (1.0 - ep.s_rel) * SLACK
    sh, sl = fast.dd_of(ep.s)
    rho0 = np.array([(Rs + fast.DIV_REL) * SLACK])  # the maxima: p = 1/s
    gh0, gl0, err0 = fast.guard_terms(np.ones(1), np.zeros(1), rho0, sh, sl, eps)
    if not err0[0] < np.inf:
        return None
    g_max = mpf_mul(fast.mpf_of(float(gh0[0]), float(gl0[0])), from_int(row.c), 0)
    G = mpf_add(S.sigma, g_max, 0)
    G_abs = (S.t_err + row.c * float(err0[0]) + S.sigma_err) * SLACK
    return fast.guarded_ball(H, G, G_abs, ep.dead_log2, eps)


def _coefficients(x: np.ndarray, row: Row, cfg: Config) -> tuple[np.ndarray, int]:
    """The certified coefficients of one block of one row, and how many stay undecided."""
    out = np.zeros(x.shape[0])
    Rs = row.s_rel / (1.0 - row.s_rel) * SLACK
    sh, sl = fast.dd_of(row.s)
    left = 0
    for a in _slices(x.size):
        left += _slice_coefficients(x[a : a + SLICE], row, cfg, Rs, sh, sl, out[a : a + SLICE])
    return out, left


def _slice_coefficients(
    x: np.ndarray, row: Row, cfg: Config, Rs: float, sh: float, sl: float, out: np.ndarray
) -> int:
    fmt = cfg.fmt
    it = _items(x, row.m, row.beta, cfg)
    out[it.ones] = row.one
    undecided = it.tiny_u
    if it.zs.size:
        q1, q2 = fast.quotient(it.eh, it.el, sh, sl)
        rel = (it.rel + Rs + it.rel * Rs + fast.DIV_REL) * SLACK
        vals, ok = fast.round_vector(q1, q2, rel, fmt)
        out[it.fast[ok]] = vals[ok]
        undecided = np.concatenate([it.fast_u[~ok], it.tiny_u])
    left = 0
    if undecided.size:
        ctx = SimpleNamespace(xu=it.xu, m=row.m, fmt=fmt)
        ep = SimpleNamespace(s=row.s)
        for k in undecided.tolist():
            v = fast.element_mp(ctx, k, ep, Rs, row.beta)
            if v is None:
                left += 1
            else:
                out[it.idx[k]] = v
    return left


@certifying("a certified dask result")  # (in the worker: its own environment)
def block_check(x2: np.ndarray, rows: np.ndarray, cfg: Config) -> np.ndarray:
    """One :class:`Count` per row of a block: the coefficients the enclosures cannot round."""
    out = np.empty(x2.shape[0], dtype=object)
    for i in range(x2.shape[0]):
        row = rows[i]
        if not row.live or x2.shape[1] == 0:
            out[i] = Count(row)
            continue
        res, why = _guarded_call(_coefficients, x2[i], row, cfg)
        out[i] = Count(row, undecided=res[1]) if res is not None else Count(row, bad=why)
    return out


@certifying("a certified dask result")  # (in the worker: its own environment)
def block_exact(x2: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """One :class:`Exact` per row of a block: the multiset of a fallback row's block."""
    out = np.empty(x2.shape[0], dtype=object)
    for i in range(x2.shape[0]):
        row = rows[i]
        if row.kind == ROW_REGULAR and row.fallback:
            out[i] = Exact(row, ex.ExactState.of_row(x2[i]))
        else:
            out[i] = Exact(row, ex.ExactState.identity())
    return out


@certifying("a certified dask result")  # (in the worker: its own environment)
def block_write(x2: np.ndarray, rows: np.ndarray, cfg: Config) -> np.ndarray:
    """The certified values of a ``(rows, nk)`` block, as float64 holding values of `cfg.dtype`."""
    out = np.zeros(x2.shape)
    for i in range(x2.shape[0]):
        row = rows[i]
        if row.kind == ROW_INVALID:
            out[i] = np.nan
        elif row.kind == ROW_REGULAR and x2.shape[1]:
            if row.fallback:
                ex.write_row(x2[i], row.exact, out[i])
            else:
                with np.errstate(all="ignore"):
                    vals, left = _coefficients(x2[i], row, cfg)
                if left:  # the check pass counted these: never reached
                    raise AssertionError("a coefficient left undecided after the check pass")
                out[i] = vals
    return out


@certifying("a certified dask result")  # (in the worker: its own environment)
def scalar(rows: np.ndarray, want: str) -> np.ndarray:
    """The certified entropy or β of each row (``rows``: final readings, shape ``(..., 1)``)."""
    flat = rows.reshape(-1)
    vals = np.empty(flat.size)
    for i, row in enumerate(flat):
        if row.kind == ROW_INVALID:
            vals[i] = math.nan
        elif row.kind == ROW_MASKED:
            vals[i] = 0.0 if want == "entropy" else 1.0
        elif row.fallback:
            vals[i] = row.exact.entropy if want == "entropy" else row.exact.beta
        else:
            vals[i] = row.entropy if want == "entropy" else row.beta_value
    return vals.reshape(rows.shape[:-1])


def fallbacks(rows: np.ndarray) -> np.ndarray:
    """Why each row went to the exact path (``""``: it did not), shape without the last axis."""
    flat = rows.reshape(-1)
    return np.array([r.fallback for r in flat], dtype=object).reshape(rows.shape[:-1])
