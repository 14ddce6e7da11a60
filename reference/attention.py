r"""Certified adaptive attention.

For queries :math:`q_i`, keys :math:`k_j` and values :math:`v_j`,

.. math::

    x_{ij} = \mathrm{scale}\; q_i \cdot k_j + \mathrm{mask}_{ij}, \qquad
    \mathrm{out}_i = \sum_j \operatorname{softmax}\bigl(\beta_i x_{i}\bigr)_j\, v_j,

with one :math:`\beta_i = \beta(H(x_i))` per query row. The logits are exact:
products and sums of the floats' exact binary values (the scale is a float; by
default the float64 value of ``1 / math.sqrt(d)``, as fused attention kernels
compute it). Each output is rounded once to the target format.

Values tied in the row (equal :math:`x_{ij}`) share a coefficient, so their
values are first summed exactly; an output whose grouped sums all vanish is an
exact zero, returned as ``+0.0``.
"""

from __future__ import annotations

import math
from functools import cmp_to_key
from typing import Any, NamedTuple

import numpy as np
from mpmath.libmp import (
    fnan,
    from_float,
    from_man_exp,
    fzero,
    mpf_abs,
    mpf_add,
    mpf_cmp,
    mpf_div,
    mpf_mul,
    mpf_sub,
    round_up,
    to_float,
)

from softmaxtheory._certify.environment import certifying
from softmaxtheory._certify.interval import to_fraction
from softmaxtheory._certify.loop import certify
from softmaxtheory._formats import NUMPY_DTYPES
from softmaxtheory._slices import distinct_slices
from softmaxtheory.spec import (
    Schedule,
    attention_layout,
    check_entropy_eps,
    exact_float64,
    expand_kv_heads,
    numpy_array,
    refuse_dtype,
    refuse_masked,
    split_mask,
)

from . import _engine as eng
from . import _fast_attention
from ._api import PrecisionError, known_schedule
from ._attention_interval import FLOAT_BOUND_PRECISION, interval_outputs
from ._rational import loglength_weights
from ._rounding import BinaryFormat, format_for, round_ball, round_exact, round_fraction

__all__ = ["ATTENTION_MAX_PRECISION", "adaptive_attention"]

#: Largest working precision (bits) Ziv's loop tries for an attention output, above
#: :data:`~softmaxtheory.reference.MAX_PRECISION`. Logits that differ by subnormal
#: amounts (a key of 5e-324) put an output with large values far closer than
#: :math:`2^{-960}` to a rounding midpoint: values :math:`2^{53}` and 1 under weights
#: :math:`\tfrac12 \mp 10^{-324}` give :math:`2^{52} + \tfrac12 - 10^{-309}`, which 960
#: bits left undecided (PrecisionError) and the loop's next step, 1520 bits, decides.
#: The exact logits are multiples of :math:`2^{-3222}` at the finest (products of
#: subnormals under a subnormal scale); 8192 bits leave room beyond that, and a
#: PrecisionError beyond them is raised as for the rows. Only such outputs pay for the
#: bits. Above :data:`._attention_interval.FLOAT_BOUND_PRECISION` (960) bits the
#: engine's float error bounds would underflow, so those steps evaluate the row in
#: interval arithmetic instead (:func:`._attention_interval.interval_outputs`).
ATTENTION_MAX_PRECISION = 1 << 13

RN = eng.RN


def _as_float_array(a: Any, name: str) -> np.ndarray:
    refuse_masked(a, name, "operand")
    arr = numpy_array(a, name)
    if arr.dtype.kind in "iu":  # exact values, as the row functions' logits
        arr = exact_float64(arr, name)
    elif arr.dtype.name not in NUMPY_DTYPES:
        raise refuse_dtype(name, arr.dtype)
    if arr.ndim < 2:
        raise ValueError(f"{name} must have shape (..., length, features), got {arr.shape}")
    return arr.astype(np.float64)


def _int_matrix(a: np.ndarray) -> tuple[np.ndarray, int]:
    """``(M, e)``: an object array `M` of Python ints and one exponent with ``a == M * 2**e``.

    `a` is finite. Each float is an integer mantissa of at most 53 bits times a power of
    two; shifted to the least exponent of the array, every entry is an exact integer.
    """
    frac, exp = np.frexp(a)
    mant = (frac * 9007199254740992.0).astype(np.int64)  # |frac| < 1: 53-bit integers, exact
    exp = exp.astype(np.int64) - 53
    nonzero = mant != 0
    if not nonzero.any():
        return np.zeros(a.shape, dtype=object), 0
    least = int(exp[nonzero].min())
    shifts = np.where(nonzero, exp - least, 0)
    return mant.astype(object) << shifts.astype(object), least


#: Bits of each piece :func:`_float_dots` splits the integers into: a product of two
#: pieces is below 2**46, so a sum of :data:`_DOT_BLOCK` of them is an integer below 2**53.
_PIECE_BITS = 23
_DOT_BLOCK = 128
#: Most blocks of features :func:`_float_dots` takes on (four pieces at most each).
_MAX_BLOCKS = 1 << 8
#: Fewer multiply-adds than this go to the integer matrix product (less overhead).
_MIN_FLOAT_DOTS = 1 << 15


def _pieces(a: np.ndarray) -> tuple[list[np.ndarray], int] | None:
    """The integers of :func:`_int_matrix` as 23-bit signed pieces (float64), and `e`.

    ``None`` where they need more than four pieces.
    """
    frac, exp = np.frexp(a)
    nonzero = frac != 0.0
    if not nonzero.any():
        return [np.zeros(a.shape)], 0
    least = int(exp[nonzero].min()) - 53
    bits = int(exp[nonzero].max()) - 53 - least + 53
    count = -(-bits // _PIECE_BITS)
    if count > 4:
        return None
    mag, sign = np.abs(a), np.where(a < 0.0, -1.0, 1.0)
    pieces = []
    for j in range(count):
        # |a| 2**(-least) is the integer; its bits from 23 j on, exactly (powers of two)
        shifted = np.floor(np.ldexp(mag, -least - _PIECE_BITS * j))
        pieces.append(np.fmod(shifted, float(1 << _PIECE_BITS)) * sign)
    return pieces, least


def _float_dots(q: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, int, int] | None:
    r"""``(D, eq, ek)``: the integer dot products of :func:`_int_matrix` (``D`` object).

    Each integer is a sum of signed pieces of 23 bits, :math:`a = \sum_j a_j 2^{23 j}`
    (read off the floats by exact scalings by powers of two, ``floor`` and ``fmod``); a
    piece matrix product is formed in float64 by blocks of :data:`_DOT_BLOCK` features,
    where every product is an integer below :math:`2^{46}` and every partial sum one
    below :math:`2^{53}`, so it is exact in any order of summation, fused or not. It is
    numpy's own sum of products (``einsum`` without ``optimize``), not BLAS, whose
    algorithm is the library's choice (a Strassen-like one would form other sums). The
    blocks and the products of equal shift add in int64 (below :math:`2^{63}`: at most
    :math:`2^{8}` blocks and four products), and the shifts combine as Python integers.
    ``None`` (the caller takes the integer matrix product) for small products and for
    integers of more than four pieces (floats that span over 39 binary orders).
    """
    L, d = q.shape
    S = k.shape[0]
    blocks = -(-d // _DOT_BLOCK)
    if L * S * d < _MIN_FLOAT_DOTS or blocks > _MAX_BLOCKS:
        return None
    qp, kp = _pieces(q), _pieces(k)
    if qp is None or kp is None:
        return None
    by_shift: dict[int, np.ndarray] = {}
    for a, qa in enumerate(qp[0]):
        for b, kb in enumerate(kp[0]):
            acc = by_shift.setdefault(a + b, np.zeros((L, S), np.int64))
            for lo in range(0, d, _DOT_BLOCK):
                # numpy's own loops (optimize=False: no BLAS, whose algorithm is the
                # library's to choose), exact since every partial sum is an integer < 2**53
                block = np.einsum(
                    "ik,jk->ij", qa[:, lo : lo + _DOT_BLOCK], kb[:, lo : lo + _DOT_BLOCK],
                    optimize=False,
                )  # fmt: skip
                acc += block.astype(np.int64)
    total = np.zeros((L, S), dtype=object)
    for shift, acc in by_shift.items():
        total = total + (acc.astype(object) << (_PIECE_BITS * shift))
    return total, qp[1], kp[1]


def _logit_rows(
    q: np.ndarray, k: np.ndarray, scale: float, add_mask: np.ndarray, keep: np.ndarray
) -> list[list]:
    """Exact logits of one batch entry: a list (per query) of mpf tuples or None (masked).

    The dot products are those of integer matrices (:func:`_int_matrix`), exact (formed
    from 23-bit pieces in float64 by :func:`_float_dots` where it can), times the
    scale's integer mantissa: each logit is an integer times one power of two,
    which ``from_man_exp`` normalises without rounding, so it is the very mpf that exact
    ``mpf_mul`` and ``mpf_add`` give, in a fraction of their time (a third or less at
    d = 8 and beyond).
    """
    k_bad = ~np.all(np.isfinite(k), axis=-1)
    q_bad = ~np.all(np.isfinite(q), axis=-1)
    qz = np.where(q_bad[:, None], 0.0, q)
    kz = np.where(k_bad[:, None], 0.0, k)
    frac, se = math.frexp(scale)
    sm = int(frac * 9007199254740992.0)
    in_floats = _float_dots(qz, kz)
    if in_floats is not None:
        D, eq, ek = in_floats
        dots = (D * sm).tolist()
    else:
        qi, eq = _int_matrix(qz)
        ki, ek = _int_matrix(kz)
        if qi.shape[1]:
            dots = ((qi @ ki.T) * sm).tolist()
        else:  # no features: every dot product is 0
            dots = [[0] * k.shape[0] for _ in range(q.shape[0])]
    e0 = eq + ek + se - 53
    keep_rows, add_rows, k_bad_l = keep.tolist(), add_mask.tolist(), k_bad.tolist()
    rows = []
    for i, q_bad_i in enumerate(q_bad.tolist()):
        keep_i, add_i, dots_i = keep_rows[i], add_rows[i], dots[i]
        logits: list = []
        for j, bad in enumerate(k_bad_l):
            if not keep_i[j]:
                logits.append(None)
                continue
            addend = add_i[j]
            if q_bad_i or bad or math.isnan(addend) or addend == math.inf:
                logits.append(fnan)
                continue
            if addend == -math.inf:
                logits.append(None)
                continue
            x = from_man_exp(dots_i[j], e0)
            if addend:
                x = mpf_add(x, from_float(addend), 0)
            logits.append(x)
        rows.append(logits)
    return rows


class _Shifts(NamedTuple):
    """A regular row's exact shifts (mpf) over its unmasked keys, at ``index`` of ``n``."""

    z: list
    n: int
    index: np.ndarray

    @property
    def n_eff(self) -> int:
        return len(self.z)

    def prepared(self) -> eng.PreparedRow:
        """The row as the mpmath engine takes it (its float bounds of the shifts)."""
        return eng.PreparedRow.from_shifts(self.z, self.n, self.index)


def _shifts(logits: list) -> _Shifts:
    index = np.array([j for j, x in enumerate(logits) if x is not None], dtype=np.intp)
    xs = [logits[j] for j in index.tolist()]
    m = max(xs, key=cmp_to_key(mpf_cmp))
    return _Shifts([mpf_sub(x, m, 0) for x in xs], len(logits), index)


def _ieee_sum(values: np.ndarray) -> float:
    """IEEE meaning of a weighted sum with positive weights over non-finite values."""
    if np.any(np.isnan(values)):
        return math.nan
    pos = np.any(values == np.inf)
    neg = np.any(values == -np.inf)
    if pos and neg:
        return math.nan
    return math.inf if pos else -math.inf


def _certify_row(
    row: eng.PreparedRow,
    vcols: np.ndarray,
    vm: list[list[tuple]],
    fmt: BinaryFormat,
    schedule: Schedule,
    entropy_eps: float,
) -> list[float]:
    """Certified outputs of one query row (regular row, finite values).

    `vcols` holds the values of the row's unmasked keys (finite columns only) and `vm`
    the same as mpf tuples, converted once per slice by the caller.
    """
    # group the unmasked keys by exact logit; sum their values exactly per group
    groups: dict = {}
    for pos, d in enumerate(row.z):
        groups.setdefault(d, []).append(pos)
    dv = vcols.shape[1]
    group_sums: dict = {}
    for d, members in groups.items():
        if len(members) == 1:  # no tie: the sums are the values themselves
            group_sums[d] = vm[members[0]]
            continue
        sums = []
        for c in range(dv):
            acc = fzero
            for pos in members:
                acc = mpf_add(acc, vm[pos][c], 0)
            sums.append(acc)
        group_sums[d] = sums
    vmax = float(np.max(np.abs(vcols))) if vcols.size else 0.0
    # each column's own bound on the dead items' values: a column of tiny values is not
    # swamped by another column's huge ones (its output may round to a signed zero)
    col_max = np.max(np.abs(vcols), axis=0).tolist() if vcols.size else [0.0] * vcols.shape[1]
    exact = _rational_outputs(groups, group_sums, dv, row.n_eff, schedule, fmt)
    if exact is not None:
        return exact
    fixed = _common_means(groups, group_sums, dv, fmt)
    keep_all = False

    def attempt(p: int) -> list[float] | None:
        nonlocal keep_all
        if p > FLOAT_BOUND_PRECISION:  # past the engine's float error bounds: intervals
            z = list(groups)
            return interval_outputs(
                z, [len(groups[d]) for d in z], [group_sums[d] for d in z], row.n_eff, fmt,
                schedule, entropy_eps, p, fixed,
            )  # fmt: skip
        C = math.inf if keep_all else eng.cutoff(row.n, p, fmt.qmin) + math.log1p(vmax)
        try:
            H = None
            if schedule.needs_entropy:
                ep1 = eng.exp_pass(row, None, p, C, want_t=True)
                H = eng.entropy_ball(ep1, p, entropy_eps, row)
            b = eng.beta_ball(schedule, H, row.n_eff, p, entropy_eps)
        except eng.Undecided:
            keep_all = True  # see evaluate_row: negligible mass may decide a jump
            return None
        exact_one = b.mid == eng.fone and b.rel == 0.0
        ep = eng.exp_pass(row, None if exact_one else b, p, C, want_t=False)
        vals, rel, one, one_rel = eng.coefficients(ep, p)
        coeff = {eng.fzero: (one, one_rel)}
        for k, v, r in zip(ep.alive.tolist(), vals, rel.tolist(), strict=True):
            coeff[row.z[k]] = (v, r)
        return _combine(coeff, group_sums, dv, p, ep.dead_log2, col_max, fmt, fixed)

    return certify(
        attempt,
        start=fmt.precision + 40 + row.n.bit_length(),
        cap=ATTENTION_MAX_PRECISION,
        what="an attention output",
        error=PrecisionError,
    )


def _rational_outputs(
    groups: dict, group_sums: dict, dv: int, n_eff: int, schedule: Schedule, fmt: BinaryFormat
) -> list[float] | None:
    r"""Outputs computed exactly in rationals, where every weight is rational; else None.

    Under :class:`~softmaxtheory.spec.LogLength` (:mod:`._rational`) an output can be
    exactly 0, or exactly a rounding tie, with no tied keys to show it: keys
    :math:`(0, -1)` with values :math:`(1, -2)` and :math:`s = 1` weigh :math:`2/3` and
    :math:`1/3`, and their output, 0, is no error ball's to decide. It is computed as a
    fraction and rounded once.
    """
    weights = loglength_weights(groups, n_eff, schedule)
    if weights is None:
        return None
    den = sum(w * len(groups[d]) for d, w in weights.items())
    sums = {d: [to_fraction(x) for x in group_sums[d]] for d in groups}
    return [
        round_fraction(sum(w * sums[d][c] for d, w in weights.items()) / den, fmt)
        for c in range(dv)
    ]


def _common_means(groups: dict, group_sums: dict, dv: int, fmt: BinaryFormat) -> dict[int, float]:
    r"""Outputs known exactly: columns where every tie group has the same mean value.

    The output is :math:`\sum_g \alpha_g S_g` with :math:`\sum_g \alpha_g n_g = 1`
    (:math:`S_g` the exact sum of the group's values, :math:`n_g` its size), so
    when every :math:`S_g / n_g` equals one :math:`\mu` the output is exactly
    :math:`\mu`, whatever the coefficients. A dyadic :math:`\mu` may be a
    rounding tie (``v = [1, 1 + 2**-52]`` with equal weights gives
    :math:`1 + 2^{-53}`), which no error ball can decide: it is rounded exactly.
    """
    fixed: dict[int, float] = {}
    members = {d: len(pos) for d, pos in groups.items()}
    for c in range(dv):
        mean = None
        for d, sums in group_sums.items():
            value = to_fraction(sums[c]) / members[d]
            if mean is None:
                mean = value
            elif value != mean:
                break
        else:
            if mean is not None and mean != 0 and mean.denominator & (mean.denominator - 1) == 0:
                k = mean.denominator.bit_length() - 1
                fixed[c] = round_exact(int(mean < 0), abs(mean.numerator), -k, fmt)
    return fixed


#: Widest span of binary exponents (bits) over which :func:`_weighted_sum` adds a
#: column's products exactly in integers; wider spans (coefficients far below the
#: working precision, kept alive when no cutoff may drop them) take the mpf sums.
EXACT_SPAN = 1 << 14


def _weighted_sum(alphas: list[tuple[int, int]], values: list[tuple], ps: int) -> tuple:
    r"""A column's weighted sum and its mass, each exact in integers and rounded once.

    Returns :math:`T = \sum_k \alpha_k v_k` to nearest at `ps` bits and
    :math:`M = \sum_k |\alpha_k v_k|` rounded up at 60 bits, as mpf tuples.
    `alphas` are the positive coefficients as ``(man, exp)``, `values` mpf tuples
    (finite). Each product is an exact integer, and so is each sum once the products
    share the least exponent, so :math:`T` and :math:`M` are rounded once each: their
    errors are at most those of the term-by-term sums :func:`_combine` allows for
    (products rounded to the working precision, then each addition to `ps` bits).
    """
    terms = [
        (am * vm, ae + ve, vs)
        for (am, ae), (vs, vm, ve, _) in zip(alphas, values, strict=True)
        if vm
    ]
    if not terms:
        return fzero, fzero
    least = min(e for _, e, _ in terms)
    top = max(e + m.bit_length() for m, e, _ in terms)
    if top - least > EXACT_SPAN:
        total, mass = fzero, fzero
        for (am, ae), v in zip(alphas, values, strict=True):
            if v[1]:
                alpha = from_man_exp(am, ae)
                total = mpf_add(total, mpf_mul(alpha, v, ps, RN), ps, RN)
                mass = mpf_add(mass, mpf_mul(alpha, mpf_abs(v), 60, round_up), 60, round_up)
        return total, mass
    pos = neg = 0
    for m, e, negative in terms:
        if negative:
            neg += m << (e - least)
        else:
            pos += m << (e - least)
    return from_man_exp(pos - neg, least, ps, RN), from_man_exp(pos + neg, least, 60, round_up)


def _combine(
    coeff: dict,
    group_sums: dict,
    dv: int,
    p: int,
    dead_log2: int | None,
    col_max: list[float],
    fmt: BinaryFormat,
    fixed: dict[int, float] | None = None,
) -> list[float] | None:
    u = math.ldexp(1.0, -p)
    ps = p + (len(coeff) + 1).bit_length() + 2
    live = [(coeff[d], sums) for d, sums in group_sums.items() if d in coeff]
    max_rel = max((r for (_, r), _ in live), default=0.0)
    # the coefficients' own errors, the products' rounding to p bits and the sum's to
    # ps bits (the exact integer sums of _weighted_sum stay within the last two)
    factor = (max_rel + 2 * u + (len(live) + 1) * math.ldexp(1.0, -ps)) * eng.SLACK
    alphas = [(alpha[1], alpha[2]) for (alpha, _), _ in live]
    out = []
    for c in range(dv):
        if fixed and c in fixed:
            out.append(fixed[c])
            continue
        extra = None
        if dead_log2 is not None and col_max[c] > 0:
            extra = dead_log2 + math.frexp(col_max[c])[1] + 1
        total, mass = _weighted_sum(alphas, [sums[c] for _, sums in live], ps)
        if mass == fzero:
            rel = 0.0
        elif total == fzero:
            return None
        else:
            ratio = to_float(mpf_div(mass, mpf_abs(total), 60, round_up), rnd="u")
            rel = ratio * factor * eng.SLACK
        if mass == fzero and extra is not None:
            # every live key's value is 0: the output is the dead keys' tiny sum, whose
            # sign is theirs (a negative one rounds to -0.0) when they share one
            signs = {s[c][0] for d, s in group_sums.items() if d not in coeff and s[c] != fzero}
            if len(signs) > 1 or extra >= fmt.qmin - 1:
                return None  # keep more keys alive (or go to the intervals)
            value = -0.0 if signs == {1} else 0.0
        else:
            value = round_ball(total, rel, fmt, extra)
            if value is None:
                return None
        out.append(value)
    return out


#: Shifts (mpf numbers) the reference holds before it certifies the rows that have them.
_PENDING_ITEMS = 1 << 16


def _certify_rows(
    pending: list[tuple],
    vb: np.ndarray,
    out: np.ndarray,
    fmt: BinaryFormat,
    schedule: Schedule,
    entropy_eps: float,
) -> None:
    """Certify the pending rows into `out`: the double-double pass first, then mpmath."""
    if not pending:
        return
    dv = out.shape[-1]
    groups: dict[tuple, int] = {}
    which = np.array([groups.setdefault(idx, len(groups)) for idx, *_ in pending], dtype=np.intp)
    values = np.stack([vb[idx] for idx in groups])
    need = np.array([~bad for *_, bad in pending]).reshape(len(pending), dv)
    certified_rows = _fast_attention.rows_outputs(
        [row for _, _, row, _, _ in pending], values, which, need, fmt, schedule, entropy_eps
    )
    v_mpf: dict[tuple, list] = {}  # a slice's values as mpf tuples, once for its rows
    for (idx, i, row, vrows, bad_cols), certified in zip(pending, certified_rows, strict=True):
        result = np.zeros(dv)
        good = np.flatnonzero(~bad_cols)
        if good.size and certified is not None:
            result[good] = certified[good]
        elif good.size:
            if idx not in v_mpf:
                v_mpf[idx] = [[from_float(x) for x in vrow] for vrow in vb[idx].tolist()]
            cols = good.tolist()
            vm = [[v_mpf[idx][j][c] for c in cols] for j in row.index.tolist()]
            result[good] = _certify_row(
                row.prepared(), vrows[:, good], vm, fmt, schedule, entropy_eps
            )
        for c in np.flatnonzero(bad_cols).tolist():
            result[c] = _ieee_sum(vrows[:, c])
        out[(*idx, i)] = result


@certifying("the reference")
def adaptive_attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    mask: Any = None,
    scale: float | None = None,
    is_causal: bool = False,
    schedule: Schedule | None = None,
    entropy_eps: float = 0.0,
    dtype: Any = np.float64,
    enable_gqa: bool = False,
) -> np.ndarray:
    r"""Certified adaptive attention, each output correctly rounded.

    Parameters
    ----------
    q : array_like, shape (..., L, d)
        Queries: floats, or integers float64 holds exactly (as the row functions'
        logits: one beyond :math:`2^{53}` that it does not hold is refused with
        :class:`ValueError`; its exact value is what the logits are made of). So are
        `k` and `v`.
    k : array_like, shape (..., S, d)
        Keys.
    v : array_like, shape (..., S, dv)
        Values. Leading dimensions of `q`, `k`, `v` broadcast.
    mask : array_like, optional
        Broadcastable to ``(..., L, S)``. Boolean: ``True`` takes part in
        attention (the SDPA convention). Floating: added to the logits
        (``-inf`` masks). An integer mask is refused (:class:`TypeError`), as
        SDPA refuses it.
    scale : float, optional
        Logit scale; default ``1 / math.sqrt(d)`` evaluated in float64.
    is_causal : bool, default False
        Mask keys ``j > i`` (top-left aligned); cannot be combined with `mask`.
    schedule : Schedule, optional
        Temperature schedule (default :class:`~softmaxtheory.spec.PaperPolynomial`);
        ``Constant(1)`` gives plain attention.
    entropy_eps : float, default 0.0
        Entropy mode.
    dtype : numpy dtype, default float64
        Output format.
    enable_gqa : bool, default False
        Grouped-query attention: `k` and `v` may have fewer heads (axis -3) than
        `q`, each a divisor of its count; query head :math:`h` reads key head
        :math:`\lfloor h / (H_q / H_k) \rfloor` (SDPA's ``enable_gqa``; see
        :func:`~softmaxtheory.spec.expand_kv_heads`).

    Returns
    -------
    numpy.ndarray, shape (..., L, dv)
        Outputs. A query whose keys are all masked gives zeros; a NaN or
        ``+inf`` logit gives a NaN row; a non-finite value propagates as in IEEE
        arithmetic with positive weights.

    Examples
    --------
    >>> import numpy as np
    >>> from softmaxtheory.reference import adaptive_attention
    >>> q = np.array([[1.0, 0.0]]); k = np.array([[1.0, 0.0], [0.0, 1.0]])
    >>> v = np.array([[1.0], [-1.0]])
    >>> adaptive_attention(q, k, v, scale=0.0)
    array([[0.]])
    """
    qa = _as_float_array(q, "q")
    ka = _as_float_array(k, "k")
    va = _as_float_array(v, "v")
    if not isinstance(is_causal, bool | np.bool_):
        raise TypeError(f"is_causal must be a bool, got {is_causal!r}")
    if not isinstance(enable_gqa, bool | np.bool_):
        raise TypeError(f"enable_gqa must be a bool, got {enable_gqa!r}")
    if enable_gqa:
        ka, va = expand_kv_heads(qa, ka, va)
    lead, L, S, scale = attention_layout(qa, ka, va, scale)
    fmt = format_for(dtype)
    schedule = known_schedule(schedule)
    entropy_eps = check_entropy_eps(entropy_eps)
    d = qa.shape[-1]
    dv = va.shape[-1]
    keep = np.ones((L, S), dtype=bool)
    add = np.zeros((L, S))
    if is_causal:
        if mask is not None:
            raise ValueError("pass either mask or is_causal=True, not both")
        keep = np.tril(keep)
    if mask is not None:
        keep, add, lead = split_mask(mask, lead, L, S)
    keep = np.broadcast_to(keep, (*lead, L, S))
    add = np.broadcast_to(add, (*lead, L, S))
    qb = np.broadcast_to(qa, (*lead, L, d))
    kb = np.broadcast_to(ka, (*lead, S, d))
    vb = np.broadcast_to(va, (*lead, S, dv))
    out = np.zeros((*lead, L, dv), dtype=fmt.dtype)
    # a (batch, head) slice equal to an earlier one (q, k, v and mask, bit for bit) has
    # its output: repeated slices are certified once
    first = distinct_slices(lead, [qa, ka, va, keep, add])
    flat = out.reshape(first.size, L, dv)  # (a view: out is new and contiguous)
    repeated = first != np.arange(first.size)
    # the regular rows of several slices at a time (up to about _PENDING_ITEMS shifts held)
    # go to the double-double pass together; what it leaves undecided, to mpmath
    pending: list[tuple] = []  # (slice, query, its shifts, its values, non-finite columns)
    held = 0
    for n in np.flatnonzero(~repeated).tolist():
        idx = np.unravel_index(n, lead) if lead else ()
        rows = _logit_rows(qb[idx], kb[idx], scale, add[idx], keep[idx])
        for i, logits in enumerate(rows):
            live = [x for x in logits if x is not None]
            if not live:
                continue  # fully masked: zeros
            if any(x == fnan for x in live):
                out[(*idx, i)] = np.nan
                continue
            row = _shifts(logits)
            vrows = vb[idx][row.index]
            pending.append((idx, i, row, vrows, ~np.all(np.isfinite(vrows), axis=0)))
            held += row.n_eff * (1 + dv // 16)  # (its values are held too)
        if held >= _PENDING_ITEMS:
            _certify_rows(pending, vb, out, fmt, schedule, entropy_eps)
            pending, held = [], 0
    _certify_rows(pending, vb, out, fmt, schedule, entropy_eps)
    flat[repeated] = flat[first[repeated]]
    return out
