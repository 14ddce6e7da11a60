"""Array functions of the reference: Ziv's loop around the row engine."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import mpmath
import numpy as np

from softmaxtheory._certify.environment import certifying
from softmaxtheory._certify.loop import CertificationError, certify
from softmaxtheory._formats import Quantity
from softmaxtheory.spec import (
    Constant,
    LogLength,
    Polynomial,
    RowKind,
    Schedule,
    as_logits,
    check_entropy_eps,
    classify_rows,
    resolve_schedule,
)

from . import _engine as eng
from . import _fast, _fast_batch
from ._rational import rational_coefficients
from ._rounding import BinaryFormat, format_for, round_ball

__all__ = [
    "MAX_PRECISION",
    "PrecisionError",
    "adaptive_softmax",
    "adaptive_softmax_mp",
    "beta",
    "beta_mp",
    "certify_row",
    "check_mp_prec",
    "entropy",
    "entropy_mp",
    "evaluate_row",
    "float_acceptor",
    "known_schedule",
    "softmax",
    "softmax_mp",
]

#: Largest working precision (bits) Ziv's loop tries before giving up.
MAX_PRECISION = 960

Acceptor = Callable[[tuple, float, "int | None", bool], Any]


class PrecisionError(CertificationError):
    """The reference could not certify a result below :data:`MAX_PRECISION` bits.

    (:data:`~softmaxtheory.reference.ATTENTION_MAX_PRECISION` for an attention output.)

    This happens only when a value lies (within :math:`2^{-960}`) on a rounding
    boundary that the exact value may or may not cross, for example an entropy
    that equals the threshold of a user schedule with a jump. The reference
    says so rather than guess.
    """


def known_schedule(schedule: Schedule | None, want: str = "beta") -> Schedule:
    """`schedule` resolved, refused up front where the reference cannot compute it.

    The reference evaluates the built-in schedules from their exact parameters; a user
    subclass of :class:`~softmaxtheory.spec.Schedule` has only its float ``beta_float``.
    It was refused at the first regular row, deep in the engine, while empty, fully
    masked and NaN rows answered without a word. The entropy and softmax take no
    schedule (`want` ``"softmax"`` or ``"entropy"``: any is let through).
    """
    schedule = resolve_schedule(schedule)
    if want in ("softmax", "entropy") or isinstance(schedule, Polynomial | Constant | LogLength):
        return schedule
    raise TypeError(
        f"the reference computes the built-in schedules exactly (PaperPolynomial, "
        f"Polynomial, Constant, LogLength), not {schedule!r}: a user schedule's beta_float "
        "is float arithmetic, which the float backends call and nothing can certify"
    )


def float_acceptor(fmt: BinaryFormat) -> Acceptor:
    """Ziv's rounding test to `fmt` (:func:`round_ball`): the `accept` of :func:`evaluate_row`."""

    def accept(mid: tuple, rel: float, extra: int | None, nonneg: bool = False) -> float | None:
        return round_ball(mid, rel, fmt, extra, nonneg=nonneg)

    return accept


def certify_row(
    row: eng.PreparedRow,
    want: Quantity,
    fmt: BinaryFormat,
    schedule: Schedule,
    entropy_eps: float,
) -> Any:
    """The certified `want` of one regular row in `fmt` (:func:`evaluate_row`'s value).

    A guarded entropy (``entropy_eps > 0``) may be negative, so its sign is needed even
    where it rounds to zero; in float32 or float16 the format's dead-item cut-off can
    leave that sign undecided (an item 720 nats below the maximum carries as much mass
    as the value). Then the float64 value decides: float64's cut-off is deeper, and
    when its correctly rounded value lies below half the format's least subnormal, so
    does the exact value (rounding is monotone and that bound is a float64), which
    rounds to a zero of its sign. Under LogLength, an adaptive softmax whose weights
    are all rational is computed as fractions (:mod:`._rational`): a coefficient can be
    exactly a rounding tie, which no Ziv loop decides.

    Raises
    ------
    PrecisionError
        As :func:`evaluate_row`.
    """
    if want == "adaptive_softmax":  # exact rational coefficients (LogLength): ties too
        exact = rational_coefficients(row, schedule, fmt)
        if exact is not None:
            return exact

    def run(f: BinaryFormat) -> Any:
        return evaluate_row(
            row,
            frozenset({want}),
            float_acceptor(f),
            start=f.precision + 40 + row.n.bit_length(),
            qmin=f.qmin,
            schedule=schedule,
            entropy_eps=entropy_eps,
        )[want]

    try:
        return run(fmt)
    except PrecisionError:
        wide = format_for(np.float64)
        if want != "entropy" or not entropy_eps or fmt.qmin <= wide.qmin:
            raise
        value = run(wide)
        if abs(value) < math.ldexp(1.0, fmt.qmin - 1):
            return math.copysign(0.0, value)
        raise


def _mp_acceptor(prec: int) -> Acceptor:
    target = math.ldexp(1.0, -prec)

    def accept(
        mid: tuple, rel: float, extra: int | None, nonneg: bool = False
    ) -> mpmath.mpf | None:
        if mid[1] == 0:  # exactly zero only with no error at all
            return mpmath.mp.make_mpf(mid) if extra is None and rel == 0.0 else None
        if extra is not None and extra - (mid[2] + mid[3] - 1) >= -prec - 1:
            return None
        total = rel + (math.ldexp(1.0, extra - (mid[2] + mid[3] - 1)) if extra is not None else 0)
        return mpmath.mp.make_mpf(mid) if total <= target else None

    return accept


def evaluate_row(
    row: eng.PreparedRow,
    want: frozenset[Quantity],
    accept: Acceptor,
    *,
    start: int,
    qmin: int | None,
    schedule: Schedule,
    entropy_eps: float,
    tempered_cutoff: float = math.inf,
) -> dict[str, Any]:
    r"""Certify the wanted results of one regular row (Ziv's loop).

    Parameters
    ----------
    row : PreparedRow
        The row in exact arithmetic.
    want : frozenset of str
        Any of the quantities ``"softmax"``, ``"entropy"``, ``"beta"``,
        ``"adaptive_softmax"`` (:data:`softmaxtheory._formats.QUANTITIES`).
    accept : callable
        Ziv's rounding test: ``accept(mid, rel, extra_log2, nonneg)`` returns the
        certified value or ``None`` (``nonneg``: the value is known to be >= 0).
    start : int
        First working precision.
    qmin : int or None
        Exponent of the least subnormal of the target format (sets the dead-item
        cutoff); ``None`` keeps every item (exact values).
    schedule : Schedule
        The temperature schedule.
    entropy_eps : float
        The entropy mode.
    tempered_cutoff : float, default ``inf``
        In the pass with an inexact β, items whose scaled logit provably
        satisfies :math:`\beta |z_i| >` `tempered_cutoff` are dropped as dead
        (their coefficient, below :math:`e^{-\mathrm{cutoff}}`, is returned as
        0 and their mass is carried as an error). With ``qmin`` set, the
        format's own cutoff applies when it is smaller.

    Returns
    -------
    dict
        ``"softmax"`` and ``"adaptive_softmax"``: lists of certified values over the
        whole row (masked entries 0); ``"entropy"``, ``"beta"``: certified values.

    Raises
    ------
    PrecisionError
        When :data:`MAX_PRECISION` is reached.
    """
    keep_all = qmin is None
    retried = False

    def attempt(p: int) -> dict[str, Any] | None:
        nonlocal keep_all, retried
        # the first attempt drops items below the format's least subnormal by 40 bits; a
        # retry drops only those p bits further down, so that the dead mass shrinks with p
        # too. (It did not for float64, whose -qmin = 1074 exceeds every p: an entropy of a
        # few subnormal ulps near a midpoint, such as that of (0, -741, -753.25, -783.28),
        # kept an error of 2**-1110 at every precision.)
        C = math.inf if keep_all else eng.cutoff(row.n, p - qmin if retried else p, qmin)
        try:
            out = _attempt(row, want, accept, p, C, schedule, entropy_eps, min(C, tempered_cutoff))
        except eng.Undecided:
            # a jump cannot be decided: drop nothing from now on (the mass of the
            # negligible items may be what separates the entropy from the threshold)
            keep_all = True
            return None
        retried = retried or out is None
        return out

    return certify(
        attempt,
        start=start,
        cap=MAX_PRECISION,
        what=f"the {'/'.join(sorted(want))} of a row of {row.n} items",
        why="a value lies too close to a rounding boundary or to the threshold of a schedule "
        "with a jump",
        error=PrecisionError,
    )


def _row_values(row: eng.PreparedRow, ep: eng.ExpPass, p: int, accept: Acceptor) -> list | None:
    vals, rel, one, one_rel = eng.coefficients(ep, p)
    out: list = [0.0] * row.n
    one_v = accept(one, one_rel, None)
    if one_v is None:
        return None
    for pos in row.index[row.ones].tolist():
        out[pos] = one_v
    positions = row.index[ep.alive].tolist()
    for pos, v, r in zip(positions, vals, rel.tolist(), strict=True):
        c = accept(v, r, None)
        if c is None:
            return None
        out[pos] = c
    return out


def _attempt(
    row: eng.PreparedRow,
    want: frozenset[Quantity],
    accept: Acceptor,
    p: int,
    C: float,
    schedule: Schedule,
    entropy_eps: float,
    C_tempered: float,
) -> dict[str, Any] | None:
    wants_beta = bool(want & {"beta", "adaptive_softmax"})
    need_h = "entropy" in want or (wants_beta and schedule.needs_entropy)
    result: dict[str, Any] = {}
    ep1 = None
    if need_h or "softmax" in want:
        ep1 = eng.exp_pass(row, None, p, C, want_t=need_h)
    H = None
    if need_h:
        assert ep1 is not None
        H = eng.entropy_ball(ep1, p, entropy_eps, row)
        if "entropy" in want:
            # the plain entropy is >= 0, and a guarded one where no p + eps exceeds 1
            h = accept(H.mid, H.rel, H.extra_log2, eng.entropy_nonneg(ep1.c, entropy_eps))
            if h is None:
                return None
            result["entropy"] = h
    if "softmax" in want:
        assert ep1 is not None
        values = _row_values(row, ep1, p, accept)
        if values is None:
            return None
        result["softmax"] = values
    if wants_beta:
        b = eng.beta_ball(schedule, H, row.n_eff, p, entropy_eps)
        if "beta" in want:
            bv = accept(b.mid, b.rel, b.extra_log2)
            if bv is None:
                return None
            result["beta"] = bv
        if "adaptive_softmax" in want:
            if b.mid == mpmath.libmp.fone and b.rel == 0.0:
                if "softmax" in result:
                    result["adaptive_softmax"] = result["softmax"]
                    return result
                ep2 = ep1 or eng.exp_pass(row, None, p, C, want_t=False)
            else:
                ep2 = eng.exp_pass(row, b, p, C_tempered, want_t=False)
            values = _row_values(row, ep2, p, accept)
            if values is None:
                return None
            result["adaptive_softmax"] = values
    return result


#: Operands of at most this many bytes are keyed by their bits for reuse (:func:`content_key`).
_KEYED_BYTES = 1 << 16


def content_key(*arrays: np.ndarray) -> bytes | None:
    """The shapes, dtypes and bits of `arrays`, as one key; None past :data:`_KEYED_BYTES`.

    Equal keys mean equal operands, bit for bit (no hash: the key is the bits), so a
    result computed for one is the result for the other. Larger operands are not
    keyed: their keys would hold a copy of every one of them.
    """
    if sum(a.size * a.itemsize for a in arrays) > _KEYED_BYTES:
        return None
    parts = []
    for a in arrays:
        parts.append(f"{a.shape}{a.dtype.str};".encode())
        parts.append(np.ascontiguousarray(a).tobytes())
    return b"".join(parts)


@certifying("the reference")  # (before the fast pass, which runs no Ziv loop)
def _evaluate(
    x: Any,
    want: Quantity,
    dtype: Any,
    schedule: Schedule | None = None,
    entropy_eps: float = 0.0,
) -> np.ndarray:
    arr = as_logits(x, "x", exact=True)
    fmt = format_for(dtype)
    schedule = known_schedule(schedule, want)
    entropy_eps = check_entropy_eps(entropy_eps)
    vector = want in ("softmax", "adaptive_softmax")
    out = np.zeros(arr.shape if vector else arr.shape[:-1], dtype=fmt.dtype)
    kinds = classify_rows(arr)
    done: dict[bytes, tuple[int, ...]] = {}  # a row's bits -> where its result is
    repeats = []  # (row, the earlier row equal to it)
    regular = []
    for idx in np.ndindex(arr.shape[:-1]):
        # a row equal (bit for bit) to an earlier one has its result: a batch of padded
        # or repeated rows is certified once per distinct row
        key = content_key(arr[idx])
        if key is not None:
            if key in done:
                repeats.append((idx, done[key]))
                continue
            done[key] = idx
        kind = kinds[idx]
        if kind == RowKind.INVALID:
            out[idx] = np.nan
        elif kind != RowKind.REGULAR:
            if not vector:
                out[idx] = 1.0 if want == "beta" else 0.0
        else:
            regular.append(idx)
    # short rows in batches first, then each row left by the one-row pass, then by mpmath
    batch: list = [None] * len(regular)
    if len(regular) > 1 and arr.shape[-1] <= _fast_batch.BATCH_MAX_N:
        # (a few thousand rows at a time: no copy of the whole batch)
        step = max(2, _fast_batch.CHUNK // max(arr.shape[-1], 1))
        for lo in range(0, len(regular), step):
            rows = np.stack([arr[idx] for idx in regular[lo : lo + step]])
            part = _fast_batch.evaluate_rows(rows, want, fmt, schedule, entropy_eps)
            batch[lo : lo + len(part)] = part
    for idx, certified in zip(regular, batch, strict=True):
        if certified is None:
            certified = _fast.evaluate(arr[idx], want, fmt, schedule, entropy_eps)
        if certified is None:
            certified = certify_row(eng.prepare_row(arr[idx]), want, fmt, schedule, entropy_eps)
        out[idx] = certified
    for idx, first in repeats:
        out[idx] = out[first]
    return out


def softmax(x: Any, *, dtype: Any = np.float64) -> np.ndarray:
    r"""Correctly rounded softmax along the last axis.

    .. math:: \operatorname{softmax}(x)_i = e^{x_i - m} / \textstyle\sum_j e^{x_j - m}

    Parameters
    ----------
    x : array_like
        Logits of shape ``(..., n)``; their exact binary values are used.
    dtype : numpy dtype, default float64
        Output format: float64, float32 or float16.

    Returns
    -------
    numpy.ndarray
        Every value is the exact softmax rounded once to nearest-even in `dtype`.

    Examples
    --------
    >>> from softmaxtheory import reference
    >>> reference.softmax([0.0, 0.0, float("-inf"), 0.0, 0.0])
    array([0.25, 0.25, 0.  , 0.25, 0.25])
    """
    return _evaluate(x, "softmax", dtype)


def entropy(x: Any, *, entropy_eps: float = 0.0, dtype: Any = np.float64) -> np.ndarray:
    r"""Correctly rounded entropy (nats) of the softmax of each row.

    .. math:: H = -\textstyle\sum_i p_i \log(p_i + \varepsilon), \quad p = \operatorname{softmax}(x)

    with :math:`\varepsilon` = `entropy_eps` (``0.0``: the exact entropy).

    Parameters
    ----------
    x : array_like
        Logits of shape ``(..., n)``; their exact binary values are used.
    entropy_eps : float, default 0.0
        Entropy mode; ``1e-9`` reproduces the paper's listing.
    dtype : numpy dtype, default float64
        Output format: float64, float32 or float16.

    Returns
    -------
    numpy.ndarray
        Shape ``x.shape[:-1]``: each row's entropy rounded once to `dtype`
        (0 for empty and fully masked rows, NaN for rows with NaN or ``+inf``).

    Examples
    --------
    >>> from softmaxtheory import reference
    >>> float(reference.entropy([1.0, 1.0]))  # log 2
    0.6931471805599453
    """
    return _evaluate(x, "entropy", dtype, entropy_eps=entropy_eps)


def beta(
    x: Any,
    *,
    schedule: Schedule | None = None,
    entropy_eps: float = 0.0,
    dtype: Any = np.float64,
) -> np.ndarray:
    r"""Correctly rounded inverse temperature :math:`\beta` of each row.

    For the default schedule, :math:`\beta = \max(P(H), 1)` if :math:`H > 0.5`
    and 1 otherwise, with the paper's polynomial :math:`P` evaluated exactly.

    Parameters
    ----------
    x : array_like
        Logits of shape ``(..., n)``.
    schedule : Schedule, optional
        Temperature schedule; default :class:`~softmaxtheory.spec.PaperPolynomial`.
    entropy_eps : float, default 0.0
        Entropy mode used by entropy-driven schedules.
    dtype : numpy dtype, default float64
        Output format.

    Returns
    -------
    numpy.ndarray
        Shape ``x.shape[:-1]``: β rounded once to `dtype` (1 for empty and fully
        masked rows, NaN for rows with NaN or ``+inf``).

    Raises
    ------
    PrecisionError
        For a user schedule with a jump, when the entropy lies within
        :math:`2^{-960}` of its threshold.

    Examples
    --------
    >>> from softmaxtheory import reference
    >>> float(reference.beta([3.0, 1.0, 0.0, 0.0, -1.0, 2.0]))
    1.4297950165956688
    """
    return _evaluate(x, "beta", dtype, schedule=schedule, entropy_eps=entropy_eps)


def adaptive_softmax(
    x: Any,
    *,
    schedule: Schedule | None = None,
    entropy_eps: float = 0.0,
    dtype: Any = np.float64,
) -> np.ndarray:
    r"""Correctly rounded adaptive softmax :math:`\operatorname{softmax}(\beta(H(x))\,x)`.

    Parameters
    ----------
    x : array_like
        Logits of shape ``(..., n)``.
    schedule : Schedule, optional
        Temperature schedule; default :class:`~softmaxtheory.spec.PaperPolynomial`.
    entropy_eps : float, default 0.0
        Entropy mode (``1e-9`` reproduces the paper's listing).
    dtype : numpy dtype, default float64
        Output format.

    Returns
    -------
    numpy.ndarray
        The exact values rounded once to `dtype`.
    """
    return _evaluate(x, "adaptive_softmax", dtype, schedule=schedule, entropy_eps=entropy_eps)


def check_mp_prec(prec: object) -> int:
    """Validate the `prec` of the ``*_mp`` functions: an int in [8, 800] bits.

    Raises
    ------
    ValueError
        Otherwise (a bool, a float or a string included).
    """
    if isinstance(prec, bool) or not isinstance(prec, int) or not 8 <= prec <= 800:
        raise ValueError(f"prec must be an int in [8, 800], got {prec!r}")
    return prec


@certifying("the reference")
def _evaluate_mp(
    x: Any, want: Quantity, prec: int, schedule: Schedule | None = None, entropy_eps: float = 0.0
) -> Any:
    arr = as_logits(x, "x", exact=True)
    if arr.ndim != 1:
        raise ValueError(f"x must be one row (1-d) for the mp functions, got shape {arr.shape}")
    check_mp_prec(prec)
    schedule = known_schedule(schedule, want)
    entropy_eps = check_entropy_eps(entropy_eps)
    vector = want in ("softmax", "adaptive_softmax")
    kind = classify_rows(arr)[()]
    if kind == RowKind.INVALID:
        return [mpmath.mpf("nan")] * arr.shape[0] if vector else mpmath.mpf("nan")
    if kind != RowKind.REGULAR:
        if vector:
            return [mpmath.mpf(0)] * arr.shape[0]
        return mpmath.mpf(1 if want == "beta" else 0)
    row = eng.prepare_row(arr)
    res = evaluate_row(
        row,
        frozenset({want}),
        _mp_acceptor(prec),
        start=prec + 20 + row.n.bit_length(),
        qmin=None,
        schedule=schedule,
        entropy_eps=entropy_eps,
        tempered_cutoff=_mp_zero_cutoff(prec),
    )
    value = res[want]
    if vector:
        return [v if isinstance(v, mpmath.mpf) else mpmath.mpf(v) for v in value]
    return value


def _mp_zero_cutoff(prec: int) -> float:
    r"""The scaled logit beyond which the mp functions return a tempered coefficient as 0.

    With an inexact :math:`\beta` (from the entropy, or a decimal that is not a
    dyadic rational), the coefficient :math:`e^{\beta z_i} / s` of an item with
    a huge :math:`|z_i|` cannot be certified to relative precision: the error
    of :math:`\beta` is multiplied by :math:`|z_i|` in the exponent. Such an item
    is certified as an exact zero instead, when a rigorous lower bound of
    :math:`\beta |z_i|` exceeds :math:`C = 2^{\mathrm{MAX\_PRECISION} - \mathrm{prec} - 32}`
    (at least :math:`2^{128}`): its value is below :math:`e^{-C}`, far below
    :math:`2^{-1075}`, half the least subnormal of float64 (and so of float32,
    float16 and bfloat16), so it rounds to 0 in every float format. Every item
    below the cutoff is certifiable at :data:`MAX_PRECISION` bits.
    """
    return math.ldexp(1.0, MAX_PRECISION - prec - 32)


def softmax_mp(x: Any, *, prec: int = 113) -> list[mpmath.mpf]:
    """Softmax of one row as mpf values with relative error at most ``2**-prec``.

    The values are certified by the same error analysis as the rounded results;
    every item is kept (none is dropped as negligible).
    """
    return _evaluate_mp(x, "softmax", prec)


def entropy_mp(x: Any, *, prec: int = 113, entropy_eps: float = 0.0) -> mpmath.mpf:
    """Entropy of one row as an mpf with relative error at most ``2**-prec``."""
    return _evaluate_mp(x, "entropy", prec, entropy_eps=entropy_eps)


def beta_mp(
    x: Any, *, prec: int = 113, schedule: Schedule | None = None, entropy_eps: float = 0.0
) -> mpmath.mpf:
    """Inverse temperature of one row as an mpf with relative error at most ``2**-prec``."""
    return _evaluate_mp(x, "beta", prec, schedule=schedule, entropy_eps=entropy_eps)


def adaptive_softmax_mp(
    x: Any, *, prec: int = 113, schedule: Schedule | None = None, entropy_eps: float = 0.0
) -> list[mpmath.mpf]:
    r"""Adaptive softmax of one row as mpf values with relative error at most ``2**-prec``.

    An item whose scaled logit :math:`\beta |z_i|` exceeds ``2**(MAX_PRECISION - prec - 32)``
    (at least :math:`2^{128}`) is an exact 0: its value, below :math:`e^{-2^{128}}`,
    cannot be certified to relative precision but rounds to 0 in every float format.

    Examples
    --------
    >>> from softmaxtheory.reference import adaptive_softmax_mp
    >>> [float(v) for v in adaptive_softmax_mp([1e308] * 5 + [0.0])]
    [0.2, 0.2, 0.2, 0.2, 0.2, 0.0]
    """
    return _evaluate_mp(x, "adaptive_softmax", prec, schedule=schedule, entropy_eps=entropy_eps)
