r"""Dispersion limits of softmax over :math:`n` items with bounded logits.

Every function here evaluates a closed form from the theory pages (T1, T2, T3,
T6, T9) and returns it **correctly rounded** to float64 (to nearest), or, for
sizes, as an exact Python ``int``. Values are certified by rigorous interval
arithmetic at increasing precision (Ziv's strategy), so they neither overflow
nor lose digits for huge spreads: the size at spread 800 is a 1,155-bit
integer, computed exactly.

Notation: :math:`n` items, logit spread :math:`\delta` (the width of an
interval holding every logit of the row), inverse temperature :math:`\beta`.

Scalars give Python scalars; arrays broadcast against each other and give
numpy arrays (float64, or ``object`` arrays of Python ``int`` for sizes, which
can exceed 64 bits). Invalid arguments raise :class:`ValueError` naming the
argument.

Examples
--------
>>> from softmaxtheory import bounds
>>> bounds.dispersion_size(0.5, 5.69)  # Gemma 2B's mean spread, in the paper
297
>>> bounds.max_coefficient(297, 5.69) < 0.5 <= bounds.max_coefficient(296, 5.69)
True
>>> bounds.adaptive_beta_max()
2.421387706631524
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from fractions import Fraction
from functools import lru_cache
from typing import Any

import numpy as np
from mpmath import libmp

from . import _interval as ivl
from . import _polyroots as pr
from .spec import Constant, LogLength, Polynomial, Schedule, resolve_schedule

__all__ = [
    "MAX_EXPONENT",
    "adaptive_beta_argmax",
    "adaptive_beta_max",
    "adaptive_dispersion_size",
    "adaptive_max_coefficient",
    "adaptive_switch_off_size",
    "adaptive_window",
    "dispersion_size",
    "empirical_spread",
    "entropy_lower_bound",
    "max_coefficient",
    "min_coefficient",
    "spread_from_norms",
    "spread_from_weights",
]


# --------------------------------------------------------------------------- validation


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool | np.bool_):
        raise TypeError(f"{name} must be a real number, got a bool")
    try:
        out = float(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a real number, got {value!r}") from exc
    if isinstance(value, complex | np.complexfloating):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    if math.isnan(out):
        raise ValueError(f"{name} must not be NaN")
    return out


def _size(value: Any, name: str = "n") -> int:
    if isinstance(value, bool | np.bool_):
        raise TypeError(f"{name} must be an integer, got a bool")
    if isinstance(value, int | np.integer):
        n = int(value)
    else:
        x = _number(value, name)
        if not (math.isfinite(x) and x == math.floor(x)):
            raise ValueError(f"{name} must be a whole number, got {value!r}")
        n = int(x)
    if n < 1:
        raise ValueError(f"{name} must be >= 1, got {n}")
    return n


def _spread(value: Any, name: str = "spread") -> float:
    x = _number(value, name)
    if not math.isfinite(x) or x < 0:
        raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
    return x


def _positive(value: Any, name: str) -> float:
    x = _number(value, name)
    if not math.isfinite(x) or x <= 0:
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    return x


def _probability(value: Any, name: str = "eps") -> float:
    x = _number(value, name)
    if not 0.0 < x < 1.0:
        raise ValueError(f"{name} must lie strictly between 0 and 1, got {value!r}")
    return x


try:
    from numpy.lib.array_utils import normalize_axis_tuple as _normalize_axis_tuple
except ImportError:  # numpy < 2
    from numpy.core.numeric import normalize_axis_tuple as _normalize_axis_tuple


def _elementwise(func: Any, args: dict[str, Any], checks: dict[str, Any], *, dtype: Any) -> Any:
    """Apply a scalar `func` over broadcast arguments, validating each element."""
    arrays = {}
    for name, value in args.items():
        arr = np.asarray(value)  # Python ints beyond 64 bits give an object array
        if arr.dtype.kind == "c":
            raise TypeError(f"{name} must be real, got complex values")
        if arr.dtype.kind not in "biufO":
            raise TypeError(f"{name} must be numeric, got dtype {arr.dtype}")
        arrays[name] = arr
    try:
        shape = np.broadcast_shapes(*(a.shape for a in arrays.values()))
    except ValueError as exc:
        raise ValueError(
            "arguments do not broadcast: " + ", ".join(f"{k} {a.shape}" for k, a in arrays.items())
        ) from exc
    if shape == ():
        values = {k: checks[k](a[()], k) for k, a in arrays.items()}
        return func(**values)
    out = np.empty(shape, dtype=dtype)
    b = {k: np.broadcast_to(a, shape) for k, a in arrays.items()}
    for idx in np.ndindex(shape):
        out[idx] = func(**{k: checks[k](a[idx], k) for k, a in b.items()})
    return out


# --------------------------------------------------------------------------- T1 and T3


#: Largest :math:`\beta\delta` for which sizes are computed: the size then has about
#: 630,000 decimal digits.
MAX_EXPONENT = 1.45e6


def _exponent(spread: float, beta: float, prec: int, sign: int) -> ivl.Interval:
    r"""An enclosure of :math:`e^{\pm\beta\delta}`."""
    t = ivl.iv_mul(ivl.iv_exact(beta), ivl.iv_exact(spread), prec)
    if sign < 0:
        t = (libmp.mpf_neg(t[1]), libmp.mpf_neg(t[0]))
    return ivl.iv_exp(t, prec)


def _coefficient_bound(n: int, spread: float, beta: float, sign: int) -> Callable[[int], Any]:
    r"""Enclosures of :math:`1 / (1 + (n-1) e^{\mp\beta\delta})` at a given precision."""

    def enclose(prec: int) -> ivl.Interval:
        e = _exponent(spread, beta, prec, sign)
        denom = ivl.iv_add(ivl.iv_exact(1), ivl.iv_mul(ivl.iv_exact(n - 1), e, prec), prec)
        return ivl.iv_div(ivl.iv_exact(1), denom, prec)

    return enclose


@lru_cache(maxsize=4096)
def _max_coefficient(n: int, spread: float, beta: float) -> float:
    return ivl.certify(_coefficient_bound(n, spread, beta, -1), ivl.float_of)


@lru_cache(maxsize=4096)
def _min_coefficient(n: int, spread: float, beta: float) -> float:
    return ivl.certify(_coefficient_bound(n, spread, beta, +1), ivl.float_of)


def max_coefficient(n: Any, spread: Any, beta: Any = 1.0) -> Any:
    r"""The largest coefficient any row of `n` items with logit spread `spread` can have (T1).

    .. math::

        \max_k \alpha_k \;\le\; \frac{1}{1 + (n-1)\,e^{-\beta\delta}},

    attained by one logit at the top of the interval and all others at the
    bottom, so no smaller bound holds.

    Parameters
    ----------
    n : int or array_like of int
        Number of items, :math:`n \ge 1`.
    spread : float or array_like
        Logit spread :math:`\delta \ge 0`.
    beta : float or array_like, default 1.0
        Inverse temperature :math:`\beta > 0`.

    Returns
    -------
    float or numpy.ndarray
        The bound, correctly rounded to float64.

    Examples
    --------
    >>> from softmaxtheory import bounds
    >>> bounds.max_coefficient(8, 2.0)
    0.5135191667978681
    >>> bounds.max_coefficient([16, 1024, 10**6], 5.69)
    array([9.51751985e-01, 2.24349876e-01, 2.95806389e-04])
    """
    return _elementwise(
        _max_coefficient,
        {"n": n, "spread": spread, "beta": beta},
        {"n": _size, "spread": _spread, "beta": _positive},
        dtype=np.float64,
    )


def min_coefficient(n: Any, spread: Any, beta: Any = 1.0) -> Any:
    r"""The smallest coefficient any row of `n` items with logit spread `spread` can have (T1).

    .. math::

        \min_k \alpha_k \;\ge\; \frac{1}{1 + (n-1)\,e^{\beta\delta}},

    attained by one logit at the bottom of the interval and all others at the
    top.

    Parameters
    ----------
    n : int or array_like of int
        Number of items, :math:`n \ge 1`.
    spread : float or array_like
        Logit spread :math:`\delta \ge 0`.
    beta : float or array_like, default 1.0
        Inverse temperature :math:`\beta > 0`.

    Returns
    -------
    float or numpy.ndarray
        The bound, correctly rounded to float64 (it underflows to 0.0 only when
        the exact value is below half the smallest subnormal).

    Examples
    --------
    >>> from softmaxtheory import bounds
    >>> bounds.min_coefficient(8, 2.0)
    0.018966912957063476
    >>> bounds.min_coefficient(2, 700.0)
    9.85967654375977e-305
    """
    return _elementwise(
        _min_coefficient,
        {"n": n, "spread": spread, "beta": beta},
        {"n": _size, "spread": _spread, "beta": _positive},
        dtype=np.float64,
    )


def _entropy_floor(n: int, spread: float, beta: float) -> Callable[[int], Any]:
    r"""Enclosures of :math:`\log(1 + (n-1) e^{-\beta\delta})` at a given precision."""

    def enclose(prec: int) -> ivl.Interval:
        e = _exponent(spread, beta, prec, -1)
        return ivl.iv_log1p(ivl.iv_mul(ivl.iv_exact(n - 1), e, prec), prec)

    return enclose


@lru_cache(maxsize=4096)
def _entropy_lower_bound(n: int, spread: float, beta: float) -> float:
    return ivl.certify(_entropy_floor(n, spread, beta), ivl.float_of)


def entropy_lower_bound(n: Any, spread: Any, beta: Any = 1.0) -> Any:
    r"""The lowest entropy (nats) a softmax over `n` items with logit spread `spread` can have (T3).

    .. math::

        H(\alpha) \;\ge\; -\log \max_k \alpha_k \;\ge\; \log\bigl(1 + (n-1)\,e^{-\beta\delta}\bigr)
        \;\ge\; \log n - \beta\delta .

    Parameters
    ----------
    n : int or array_like of int
        Number of items, :math:`n \ge 1`.
    spread : float or array_like
        Logit spread :math:`\delta \ge 0`.
    beta : float or array_like, default 1.0
        Inverse temperature :math:`\beta > 0`.

    Returns
    -------
    float or numpy.ndarray
        :math:`\log(1 + (n-1)e^{-\beta\delta})`, correctly rounded to float64.

    Examples
    --------
    >>> from softmaxtheory import bounds
    >>> bounds.entropy_lower_bound(1, 3.0)
    0.0
    >>> bounds.entropy_lower_bound(4096, 0.0)  # log 4096: every row is uniform
    8.317766166719343
    """
    return _elementwise(
        _entropy_lower_bound,
        {"n": n, "spread": spread, "beta": beta},
        {"n": _size, "spread": _spread, "beta": _positive},
        dtype=np.float64,
    )


def _certified_text(n: int, spread: float, beta: float, kind: str, digits: int) -> str:
    """A T1/T3 quantity as a decimal string, correctly rounded to `digits` significant digits.

    Used by the command line, which prints decimals: rounding the float64 result
    again to fewer digits could be off by one in the last digit shown.
    """
    if kind == "max":
        enclose = _coefficient_bound(n, spread, beta, -1)
    elif kind == "min":
        enclose = _coefficient_bound(n, spread, beta, +1)
    elif kind == "entropy":
        enclose = _entropy_floor(n, spread, beta)
    else:
        raise ValueError(f"kind must be 'max', 'min' or 'entropy', got {kind!r}")
    return ivl.certify(enclose, lambda iv: ivl.decimal_of(iv, digits))


# --------------------------------------------------------------------------- T2


def _check_exponent(exponent: float, what: str) -> None:
    if exponent > MAX_EXPONENT:
        raise ValueError(
            f"{what} = {exponent!r} is too large: the size would have more than 630,000 digits "
            f"(the limit is {MAX_EXPONENT!r})"
        )


def _floor_size(scale: Fraction, spread: float, beta: float) -> int:
    r""":math:`\lfloor \text{scale} \cdot e^{\beta\delta} \rfloor + 2`, certified."""

    def enclose(prec: int) -> ivl.Interval:
        e = _exponent(spread, beta, prec, +1)
        return ivl.iv_mul(ivl.iv_fraction(scale, prec), e, prec)

    def accept(iv: ivl.Interval) -> int | None:
        lo = ivl.to_fraction(iv[0])
        hi = ivl.to_fraction(iv[1])
        return math.floor(lo) + 2 if math.floor(lo) == math.floor(hi) else None

    return ivl.certify(_with_magnitude(enclose, spread * beta), accept)


def _with_magnitude(enclose: Any, exponent: float) -> Any:
    extra = ivl.magnitude_bits(exponent)

    def wrapped(prec: int) -> ivl.Interval:
        return enclose(prec + extra)

    return wrapped


@lru_cache(maxsize=4096)
def _dispersion_size(eps: float, spread: float, beta: float) -> int:
    scale = 1 / Fraction(eps) - 1
    if spread == 0.0:
        return math.floor(scale) + 2
    # scale * e^(beta*spread) is irrational (Lindemann), so the floor is decidable
    _check_exponent(spread * beta, "spread * beta")
    return _floor_size(scale, spread, beta)


def dispersion_size(eps: Any, spread: Any, beta: Any = 1.0) -> Any:
    r"""The number of items beyond which no coefficient can reach `eps` (T2).

    Every row of :math:`n` items with logit spread :math:`\delta` has
    :math:`\max_k \alpha_k < \varepsilon` if and only if
    :math:`n \ge n^\ast`, where

    .. math::

        n^\ast = \bigl\lfloor (1/\varepsilon - 1)\, e^{\beta\delta} \bigr\rfloor + 2 .

    The floor is computed exactly (never from a rounded float), so the answer
    is right at integer boundaries and for spreads whose :math:`n^\ast` has
    hundreds of digits.

    Parameters
    ----------
    eps : float or array_like
        The level :math:`0 < \varepsilon < 1`.
    spread : float or array_like
        Logit spread :math:`\delta \ge 0`.
    beta : float or array_like, default 1.0
        Inverse temperature :math:`\beta > 0`.

    Returns
    -------
    int or numpy.ndarray
        :math:`n^\ast`; arrays have dtype ``object`` and hold Python ints.

    Examples
    --------
    >>> from softmaxtheory import bounds
    >>> bounds.dispersion_size(0.5, 5.69)
    297
    >>> bounds.dispersion_size(0.5, 0.0)  # uniform rows: 1/n < 1/2 from n = 3 on
    3
    >>> bounds.dispersion_size(0.5, 800.0).bit_length()
    1155
    """
    return _elementwise(
        _dispersion_size,
        {"eps": eps, "spread": spread, "beta": beta},
        {"eps": _probability, "spread": _spread, "beta": _positive},
        dtype=object,
    )


# --------------------------------------------------------------------------- T6


def _polynomial(schedule: Schedule | None, name: str = "schedule") -> Polynomial:
    sched = resolve_schedule(schedule)
    if not isinstance(sched, Polynomial):
        raise ValueError(
            f"{name} must be an entropy-driven Polynomial schedule, got {sched!r}: "
            "only those have an entropy window"
        )
    return sched


def _above(sf: pr.Poly, root: list[Fraction], theta: Fraction) -> bool:
    """Whether the root isolated in ``root = [a, b]`` exceeds `theta`.

    When it does, ``root`` is narrowed in place until ``a > theta``.
    """
    a, b = root
    if b <= theta:
        return False
    if a < theta and pr.count_roots(sf, a, theta) == 1:
        return False
    while a <= theta and a != b:  # the root is above theta: move the left end past it
        a, b = pr.refine(sf, a, b)
    root[0], root[1] = a, b
    return True


@lru_cache(maxsize=64)
def _window_exact(schedule: Polynomial) -> tuple[list[tuple[Any, Any]], pr.Poly]:
    r"""The segments of :math:`(\theta, \infty)` where :math:`P > 1`, in increasing order.

    A segment's left end is the threshold (a Fraction) or a root of :math:`P - 1`;
    its right end is a root or ``math.inf``. Roots are mutable isolating intervals
    ``[a, b]`` (the root lies in :math:`(a, b]`) of the returned square-free
    :math:`P - 1`.
    """
    p = schedule.exact_coefficients
    theta = schedule.exact_threshold
    q = (*p[:-1], p[-1] - 1)
    if all(c == 0 for c in q):
        return [], q  # P == 1: beta is 1 everywhere
    sf, intervals = pr.isolate_roots(q)
    roots = [[a, b] for a, b in intervals]
    roots = [r for r in roots if _above(sf, r, theta)]
    ends: list[Any] = [theta, *roots, math.inf]
    segments = []
    for left, right in itertools.pairwise(ends):
        lo = left if isinstance(left, Fraction) else left[1]
        if isinstance(right, list):
            while right[0] != right[1] and not lo < right[0]:
                right[0], right[1] = pr.refine(sf, right[0], right[1])
            hi = right[0]
            while isinstance(left, list) and left[0] != left[1] and not left[1] < hi:
                left[0], left[1] = pr.refine(sf, left[0], left[1])
                lo = left[1]
            probe = (lo + hi) / 2
        else:
            probe = lo + 1
        if pr.evaluate(q, probe) > 0:
            segments.append((left, right))
    return segments, sf


def _round_root(sf: pr.Poly, root: list) -> float:
    a, b = root
    while float(a) != float(b):
        a, b = pr.refine(sf, a, b)
    root[0], root[1] = a, b
    return float(a)


def _end_value(end: Any, sf: pr.Poly) -> float:
    if isinstance(end, Fraction):
        return float(end)
    if end == math.inf:
        return math.inf
    return _round_root(sf, end)


def adaptive_window(schedule: Schedule | None = None) -> tuple[float, float]:
    r"""The entropy window :math:`(H_{\mathrm{on}}, H_{\mathrm{off}})` where the schedule sharpens.

    For a polynomial schedule, :math:`\beta(H) > 1` only for entropies strictly
    inside the window (for the published polynomial, exactly there: the ends
    are the roots of :math:`P(H) = 1`); outside it :math:`\beta = 1`. The ends
    are found by exact root isolation and correctly rounded.

    Parameters
    ----------
    schedule : softmaxtheory.spec.Polynomial, optional
        Defaults to the paper's schedule.

    Returns
    -------
    tuple of float
        :math:`(H_{\mathrm{on}}, H_{\mathrm{off}})`; :math:`H_{\mathrm{off}}` is
        ``inf`` for a schedule that never switches off.

    Raises
    ------
    ValueError
        If `schedule` is not a polynomial schedule, or never raises β above 1.

    Examples
    --------
    >>> from softmaxtheory import bounds
    >>> bounds.adaptive_window()
    (0.8485819960098693, 5.9445208279051425)
    """
    sched = _polynomial(schedule)
    segments, sf = _window_exact(sched)
    if not segments:
        raise ValueError(f"schedule {sched!r} never raises beta above 1: it has no window")
    return _end_value(segments[0][0], sf), _end_value(segments[-1][1], sf)


@lru_cache(maxsize=64)
def _peak(schedule: Polynomial) -> tuple[float, float]:
    r"""(argmax, max) of β over entropies above the threshold, correctly rounded.

    The supremum of :math:`\max(P, 1)` over :math:`H > \theta` is 1, or
    :math:`P(\theta)` (approached from the right), or :math:`P` at a critical
    point above :math:`\theta`, or infinite.
    """
    segments, _ = _window_exact(schedule)
    p = schedule.exact_coefficients
    theta = schedule.exact_threshold
    if not segments:
        return math.nan, 1.0
    if segments[-1][1] == math.inf and len(p) > 1 and p[0] > 0:
        return math.inf, math.inf
    # candidates: [P-enclosure lo, hi, location]; a location is theta or an isolating interval
    candidates: list[list[Any]] = []
    v = pr.evaluate(p, theta)
    if v > 1:
        candidates.append([v, v, theta])
    dsf: pr.Poly = (Fraction(1),)
    if len(p) > 2:
        dsf, crit = pr.isolate_roots(pr.derivative(p))
        for a, b in crit:
            root = [a, b]
            if _above(dsf, root, theta):
                lo, hi = pr.evaluate_range(p, root[0], root[1])
                if hi > 1:
                    candidates.append([lo, hi, root])
    if not candidates:
        return math.nan, 1.0
    while True:
        best_lo = max(c[0] for c in candidates)
        best_hi = max(c[1] for c in candidates)
        contenders = [c for c in candidates if c[1] >= best_lo]
        if float(best_lo) == float(best_hi) and len(contenders) == 1:
            where = contenders[0][2]
            arg = float(where) if isinstance(where, Fraction) else _round_root(dsf, where)
            return arg, float(best_lo)
        for c in contenders:
            if isinstance(c[2], list) and c[2][0] != c[2][1]:
                c[2][0], c[2][1] = pr.refine(dsf, c[2][0], c[2][1])
                c[0], c[1] = pr.evaluate_range(p, c[2][0], c[2][1])
        if all(c[0] == c[1] for c in contenders):  # exact ties between equal maxima
            where = contenders[0][2]
            arg = float(where) if isinstance(where, Fraction) else _round_root(dsf, where)
            return arg, float(contenders[0][0])


def adaptive_beta_max(schedule: Schedule | None = None) -> float:
    r"""The largest inverse temperature the schedule can produce (T6).

    For the paper's polynomial, :math:`\beta_{\max} = P(H^\ast)` at the unique
    critical point :math:`H^\ast` of :math:`P`; adaptive coefficients then obey
    T1 with :math:`\beta = \beta_{\max}`.

    Parameters
    ----------
    schedule : softmaxtheory.spec.Schedule, optional
        Defaults to the paper's schedule. ``Constant(b)`` gives ``b``;
        ``LogLength`` gives ``inf`` (its β grows with the length).

    Returns
    -------
    float
        :math:`\sup_H \beta(H)`, correctly rounded; ``inf`` when unbounded.

    Examples
    --------
    >>> from softmaxtheory import bounds
    >>> bounds.adaptive_beta_max()
    2.421387706631524
    """
    sched = resolve_schedule(schedule)
    if isinstance(sched, Constant):
        return float(sched.exact_beta)
    if isinstance(sched, LogLength):
        return math.inf
    return _peak(_polynomial(sched))[1]


def adaptive_beta_argmax(schedule: Schedule | None = None) -> float:
    r"""The entropy :math:`H^\ast` at which the schedule's β is largest.

    Parameters
    ----------
    schedule : softmaxtheory.spec.Polynomial, optional
        Defaults to the paper's schedule.

    Returns
    -------
    float
        :math:`H^\ast`, correctly rounded (``nan`` when β never exceeds 1,
        ``inf`` when it grows without bound).

    Examples
    --------
    >>> from softmaxtheory import bounds
    >>> bounds.adaptive_beta_argmax()
    4.412401865965671
    """
    return _peak(_polynomial(schedule))[0]


@lru_cache(maxsize=4096)
def _switch_off(spread: float, schedule: Polynomial) -> int:
    segments, sf = _window_exact(schedule)
    if not segments:
        return 1
    end = segments[-1][1]
    if end == math.inf:
        raise ValueError(f"schedule {schedule!r} never switches off: beta > 1 for all large H")
    _check_exponent(spread, "spread")
    root = end

    def enclose(prec: int) -> ivl.Interval:
        while root[1] - root[0] > Fraction(1, 1 << (prec + 8)):
            root[0], root[1] = pr.refine(sf, root[0], root[1])
        h = (ivl.iv_fraction(root[0], prec)[0], ivl.iv_fraction(root[1], prec)[1])
        grow = ivl.iv_sub(ivl.iv_exp(h, prec), ivl.iv_exact(1), prec)
        return ivl.iv_mul(grow, _exponent(spread, 1.0, prec, +1), prec)

    def accept(iv: ivl.Interval) -> int | None:
        lo, hi = ivl.to_fraction(iv[0]), ivl.to_fraction(iv[1])
        return math.floor(lo) + 2 if math.floor(lo) == math.floor(hi) else None

    return ivl.certify(_with_magnitude(enclose, spread + 8.0), accept)


def adaptive_switch_off_size(spread: Any, schedule: Schedule | None = None) -> Any:
    r"""The length from which the adaptive temperature is guaranteed to be 1 (T6).

    A row of :math:`n` items with logit spread :math:`\delta` has entropy at
    least :math:`\log(1 + (n-1)e^{-\delta})` (T3), which reaches
    :math:`H_{\mathrm{off}}` once

    .. math::

        n \;\ge\; n_{\mathrm{off}} = \bigl\lfloor (e^{H_{\mathrm{off}}} - 1)\, e^{\delta}
        \bigr\rfloor + 2 ;

    from there on :math:`\beta = 1` and adaptive softmax is plain softmax.
    (Entropies computed with ``entropy_eps > 0`` are slightly smaller; the
    guarantee is for the exact entropy.)

    Parameters
    ----------
    spread : float or array_like
        Logit spread :math:`\delta \ge 0` of the logits given to the adaptive softmax.
    schedule : softmaxtheory.spec.Polynomial, optional
        Defaults to the paper's schedule.

    Returns
    -------
    int or numpy.ndarray
        :math:`n_{\mathrm{off}}` (``object`` arrays of Python ints for array input).

    Raises
    ------
    ValueError
        If the schedule is not a polynomial one, or never switches off.

    Examples
    --------
    >>> from softmaxtheory import bounds
    >>> bounds.adaptive_switch_off_size(0.0)  # uniform rows: log n >= H_off from n = 382
    382
    >>> bounds.adaptive_switch_off_size(5.69)
    112635
    """
    sched = _polynomial(schedule)
    return _elementwise(
        lambda spread: _switch_off(spread, sched),
        {"spread": spread},
        {"spread": _spread},
        dtype=object,
    )


def _beta_max_up(poly: Polynomial) -> float:
    """The float just above the correctly rounded β_max: never below the exact value."""
    top = _peak(poly)[1]
    return math.nextafter(top, math.inf) if top > 1.0 else 1.0


def _beta_sup(n: int, spread: float, sched: Schedule) -> float:
    if isinstance(sched, Constant):
        return float(sched.exact_beta)
    if isinstance(sched, LogLength):
        raise ValueError("LogLength schedules: use max_coefficient(n, spread, beta=s*log(n))")
    poly = _polynomial(sched)
    if n >= _switch_off(spread, poly):
        return 1.0
    return _beta_max_up(poly)


def adaptive_max_coefficient(n: Any, spread: Any, schedule: Schedule | None = None) -> Any:
    r"""The largest coefficient an adaptive softmax over `n` items can have (T1 with T6).

    The schedule picks a β in :math:`[1, \beta_{\max}]` for each row, so T1
    holds with :math:`\beta_{\max}`; from :func:`adaptive_switch_off_size` on,
    β is 1 and the plain bound applies:

    .. math::

        \max_k \alpha_k \le \frac{1}{1 + (n-1)e^{-\bar\beta\delta}}, \qquad
        \bar\beta = \begin{cases} \beta_{\max} & n < n_{\mathrm{off}} \\ 1 & n \ge n_{\mathrm{off}}
        \end{cases}.

    :math:`\beta_{\max}` enters as the float just above it (one unit in the
    last place over the correctly rounded value), so the bound is never below the
    exact one.

    Parameters
    ----------
    n : int or array_like of int
        Number of items.
    spread : float or array_like
        Logit spread of the logits given to the adaptive softmax.
    schedule : softmaxtheory.spec.Polynomial or softmaxtheory.spec.Constant, optional
        Defaults to the paper's schedule.

    Returns
    -------
    float or numpy.ndarray
        The bound, correctly rounded to float64.

    Examples
    --------
    >>> from softmaxtheory import bounds
    >>> bounds.adaptive_max_coefficient(16384, 5.69)
    0.9832702685146243
    >>> bounds.adaptive_max_coefficient(200000, 5.69) == bounds.max_coefficient(200000, 5.69)
    True
    """
    sched = resolve_schedule(schedule)

    def one(n: int, spread: float) -> float:
        return _max_coefficient(n, spread, _beta_sup(n, spread, sched))

    return _elementwise(
        one, {"n": n, "spread": spread}, {"n": _size, "spread": _spread}, dtype=np.float64
    )


def adaptive_dispersion_size(eps: Any, spread: Any, schedule: Schedule | None = None) -> Any:
    r"""The number of items beyond which no adaptive-softmax coefficient can reach `eps`.

    With :math:`n^\ast(\beta)` of :func:`dispersion_size` and
    :math:`n_{\mathrm{off}}` of :func:`adaptive_switch_off_size`, the bound of
    :func:`adaptive_max_coefficient` stays below :math:`\varepsilon` from

    .. math::

        n^\ast_{\mathrm{adaptive}} = \begin{cases}
            n^\ast(\beta_{\max}) & n^\ast(\beta_{\max}) < n_{\mathrm{off}} \\
            \max\bigl(n_{\mathrm{off}}, n^\ast(1)\bigr) & \text{otherwise}
        \end{cases}

    on (the bound drops at :math:`n_{\mathrm{off}}`, where β returns to 1).
    As in :func:`adaptive_max_coefficient`, :math:`\beta_{\max}` is taken as
    the float just above it.

    Parameters
    ----------
    eps : float or array_like
        The level :math:`0 < \varepsilon < 1`.
    spread : float or array_like
        Logit spread of the logits given to the adaptive softmax.
    schedule : softmaxtheory.spec.Polynomial or softmaxtheory.spec.Constant, optional
        Defaults to the paper's schedule.

    Returns
    -------
    int or numpy.ndarray
        The size (``object`` arrays of Python ints for array input).

    Examples
    --------
    >>> from softmaxtheory import bounds
    >>> bounds.adaptive_dispersion_size(0.5, 5.69)
    112635
    """
    sched = resolve_schedule(schedule)

    def one(eps: float, spread: float) -> int:
        if isinstance(sched, Constant):
            return _dispersion_size(eps, spread, float(sched.exact_beta))
        if isinstance(sched, LogLength):
            raise ValueError("LogLength schedules need not disperse: there is no such size")
        poly = _polynomial(sched)
        top = _beta_max_up(poly)
        off = _switch_off(spread, poly)
        sharp = _dispersion_size(eps, spread, top)
        if sharp < off:
            return sharp
        return max(off, _dispersion_size(eps, spread, 1.0))

    return _elementwise(
        one, {"eps": eps, "spread": spread}, {"eps": _probability, "spread": _spread}, dtype=object
    )


# --------------------------------------------------------------------------- T9


def _nonnegative(value: Any, name: str) -> float:
    x = _number(value, name)
    if not math.isfinite(x) or x < 0:
        raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
    return x


def _product_bound(*factors: float) -> float:
    """The product of non-negative floats, exact, then rounded to nearest float64."""
    from mpmath import libmp

    raw = libmp.from_int(1)
    for f in factors:
        raw = libmp.mpf_mul(raw, libmp.from_float(f))  # exact: no precision given
    return ivl.float_of((raw, raw))  # type: ignore[return-value]


def spread_from_norms(query_norm: Any, key_norm: Any, scale: Any = 1.0) -> Any:
    r"""Spread bound of one attention row from the norms of its query and keys (T9).

    Cauchy–Schwarz gives :math:`|s\, q \cdot k_j| \le s\,\lVert q\rVert \lVert k_j\rVert`,
    so every logit of the row lies in
    :math:`[-s\lVert q\rVert K, s\lVert q\rVert K]` with
    :math:`K = \max_j \lVert k_j\rVert`, and

    .. math::

        \delta \le 2\, s\, \lVert q\rVert\, \max_j \lVert k_j\rVert .

    Parameters
    ----------
    query_norm : float or array_like
        :math:`\lVert q\rVert \ge 0`.
    key_norm : float or array_like
        :math:`\max_j \lVert k_j\rVert \ge 0`.
    scale : float or array_like, default 1.0
        The logit scale :math:`s > 0` (``1/sqrt(d)`` in scaled dot-product attention).

    Returns
    -------
    float or numpy.ndarray
        :math:`2 s \lVert q\rVert K`, correctly rounded to float64.

    Examples
    --------
    >>> from softmaxtheory import bounds
    >>> bounds.spread_from_norms(4.0, 3.0, scale=0.125)
    3.0
    """
    return _elementwise(
        lambda query_norm, key_norm, scale: _product_bound(2.0, scale, query_norm, key_norm),
        {"query_norm": query_norm, "key_norm": key_norm, "scale": scale},
        {"query_norm": _nonnegative, "key_norm": _nonnegative, "scale": _positive},
        dtype=np.float64,
    )


def _matrix(w: Any, name: str) -> np.ndarray:
    arr = np.asarray(w)
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"{name} must be a real matrix, got dtype {arr.dtype}")
    arr = arr.astype(np.float64)
    if arr.ndim < 2:
        raise ValueError(f"{name} must have at least 2 dimensions (…, rows, cols), got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite")
    return arr


def _spectral_upper(w: np.ndarray) -> np.ndarray:
    r"""Upper bounds on the spectral norms of the matrices in the last two axes.

    LAPACK's singular values are exact for a perturbation :math:`E` with
    :math:`\lVert E\rVert_2 \le c\,\max(r, c)\,u\,\lVert W\rVert_2`
    (a small constant :math:`c`), so by Weyl's inequality inflating the computed
    largest singular value by :math:`8 \max(r, c)\,2^{-52}` relative bounds
    the exact one from above.
    """
    if w.shape[-1] == 0 or w.shape[-2] == 0:
        return np.zeros(w.shape[:-2])
    sigma = np.linalg.svd(w, compute_uv=False)[..., 0]
    margin = 1.0 + 8.0 * max(w.shape[-2:]) * 2.0**-52
    return sigma * margin


def _bias_norm(b: Any, name: str, lead: tuple[int, ...]) -> np.ndarray:
    if b is None:
        return np.zeros(lead)
    arr = np.asarray(b)
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"{name} must be real, got dtype {arr.dtype}")
    arr = arr.astype(np.float64)
    if arr.ndim < 1 or not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be a finite vector (…, d), got shape {arr.shape}")
    return np.linalg.norm(arr, axis=-1) * (1.0 + 4.0 * arr.shape[-1] * 2.0**-52)


def spread_from_weights(
    w_q: Any,
    w_k: Any,
    input_norm: Any,
    *,
    bias_q: Any = None,
    bias_k: Any = None,
    key_input_norm: Any = None,
    scale: Any = 1.0,
) -> Any:
    r"""Spread bound of an attention head from its projection weights (T9).

    With queries :math:`q = W_Q x + b_Q` and keys :math:`k = W_K y + b_K` of
    inputs with :math:`\lVert x\rVert \le B_Q`, :math:`\lVert y\rVert \le B_K`,

    .. math::

        \lVert q\rVert \le \lVert W_Q\rVert_2 B_Q + \lVert b_Q\rVert, \qquad
        \lVert k\rVert \le \lVert W_K\rVert_2 B_K + \lVert b_K\rVert,

    and :func:`spread_from_norms` turns these into a bound on every row's
    spread. Matrices may be stored either way round (the spectral norm of
    :math:`W` and :math:`W^\top` agree); leading axes (heads, layers) broadcast.

    Parameters
    ----------
    w_q, w_k : array_like, shape (..., r, c)
        Query and key projection matrices.
    input_norm : float or array_like
        :math:`B_Q`, a bound on the norm of the inputs the queries are computed
        from (and of the keys' inputs unless `key_input_norm` is given).
    bias_q, bias_k : array_like, shape (..., d), optional
        Projection biases.
    key_input_norm : float or array_like, optional
        :math:`B_K` when it differs from :math:`B_Q` (cross-attention).
    scale : float, default 1.0
        The logit scale (``1/sqrt(d_head)`` in scaled dot-product attention).

    Returns
    -------
    float or numpy.ndarray
        An upper bound on the spread, rounded upward to float64. The spectral
        norms come from LAPACK and are inflated by a relative margin of
        :math:`8\max(r, c)\,2^{-52}` that covers its backward error.

    Examples
    --------
    >>> import numpy as np
    >>> from softmaxtheory import bounds
    >>> w = np.diag([2.0, 1.0])
    >>> bounds.spread_from_weights(w, w, 1.0)  # 2 * (2 * 1) * (2 * 1), rounded up
    8.00000000000006
    """
    wq = _matrix(w_q, "w_q")
    wk = _matrix(w_k, "w_k")
    bq_in = np.asarray(input_norm, dtype=np.float64)
    if np.any(~np.isfinite(bq_in)) or np.any(bq_in < 0):
        raise ValueError(f"input_norm must be finite and >= 0, got {input_norm!r}")
    if key_input_norm is None:
        bk_in = bq_in
    else:
        bk_in = np.asarray(key_input_norm, dtype=np.float64)
        if np.any(~np.isfinite(bk_in)) or np.any(bk_in < 0):
            raise ValueError(f"key_input_norm must be finite and >= 0, got {key_input_norm!r}")
    s = _positive(scale, "scale")
    q_norm = _spectral_upper(wq) * bq_in + _bias_norm(bias_q, "bias_q", wq.shape[:-2])
    k_norm = _spectral_upper(wk) * bk_in + _bias_norm(bias_k, "bias_k", wk.shape[:-2])
    bound = 2.0 * s * q_norm * k_norm
    bound = np.nextafter(bound, np.inf)  # cover the float rounding of the lines above
    bound = np.nextafter(bound, np.inf)
    return float(bound) if np.ndim(bound) == 0 else bound


# --------------------------------------------------------------------------- measurement


def _as_real_array(logits: Any) -> np.ndarray:
    if hasattr(logits, "detach") and hasattr(logits, "float"):  # a torch tensor
        t = logits.detach()
        if t.is_complex():
            raise TypeError("logits must be real, got a complex tensor")
        if not t.is_floating_point():
            t = t.double()
        elif t.element_size() < 4:
            t = t.float()  # float16 / bfloat16: exact in float32
        logits = t.cpu().numpy()
    arr = np.asarray(logits)
    if arr.dtype.kind == "c":
        raise TypeError("logits must be real, got complex values")
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"logits must be numeric, got dtype {arr.dtype}")
    return arr.astype(np.float64)


def empirical_spread(logits: Any, axis: int | tuple[int, ...] = -1) -> Any:
    r"""The measured spread :math:`\max_j x_j - \min_j x_j` of each row of logits.

    Masked items (:math:`-\infty`) are ignored, as the softmax ignores them. A
    row with at most one unmasked item has spread 0; a row holding NaN or
    :math:`+\infty` gives NaN.

    Parameters
    ----------
    logits : array_like or torch.Tensor
        Pre-softmax logits.
    axis : int or tuple of int, default -1
        The item axis (or axes).

    Returns
    -------
    numpy.float64 or numpy.ndarray
        The spreads, float64 (a single rounding of the exact difference), with
        `axis` removed.

    Examples
    --------
    >>> from softmaxtheory import bounds
    >>> bounds.empirical_spread([[0.0, 2.5, -float("inf")], [1.0, -1.0, 0.5]])
    array([2.5, 2. ])
    """
    x = _as_real_array(logits)
    if x.ndim == 0:
        raise ValueError("logits must have at least one dimension (the items)")
    try:
        axes = _normalize_axis_tuple(axis, x.ndim)
    except (np.exceptions.AxisError, TypeError) as exc:
        raise ValueError(f"axis {axis!r} is out of range for logits of shape {x.shape}") from exc
    masked = x == -np.inf
    bad = np.any(np.isnan(x) | (x == np.inf), axis=axes)
    hi = np.max(np.where(masked, -np.inf, x), axis=axes, initial=-np.inf)
    lo = np.min(np.where(masked, np.inf, x), axis=axes, initial=np.inf)
    with np.errstate(invalid="ignore", over="ignore"):
        spread = np.where(np.isfinite(hi) & np.isfinite(lo), hi - lo, 0.0)
    spread = np.where(bad, np.nan, spread)
    return spread[()] if spread.ndim == 0 else spread
