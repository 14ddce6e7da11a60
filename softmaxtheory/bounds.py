r"""Dispersion limits of softmax over :math:`n` items with bounded logits.

Every function here evaluates a closed form from the theory pages (T1, T2, T3,
T6, T9) and returns it **correctly rounded** to float64 (to nearest), or, for
sizes, as an exact Python ``int``. Spreads are the exception: the functions that
return one (:func:`empirical_spread`, :func:`spread_from_norms`,
:func:`spread_from_weights`) round it upward, since a spread is an argument of
the other bounds, and those hold at any spread at least the row's. Values are
certified by rigorous interval arithmetic at increasing precision (Ziv's
strategy), so they neither overflow nor lose digits for huge spreads: the size
at spread 800 is a 1,155-bit integer, computed exactly.

Rounded to nearest, a bound's float may lie up to half an ulp on the inner side
of the exact bound. The comparison it is made for still holds: rounding to
nearest is monotone, so a row's coefficient correctly rounded to float64 never
exceeds :func:`max_coefficient`, nor falls below :func:`min_coefficient`. Where
the float itself must hold of the exact value, the function rounds outward and
says so (:func:`adaptive_max_coefficient`, the brackets, the spreads, the ends
of :func:`adaptive_window`). Sizes are decided exactly, never from a rounded
float: at spread :math:`\log 2` and :math:`\varepsilon = 1/2`,
:func:`dispersion_size` is 3, while ``max_coefficient(3, log 2)`` rounds
:math:`0.49999999999999999420\ldots` to 0.5.

Notation: :math:`n` items, logit spread :math:`\delta` (the width of an
interval holding every logit of the row), inverse temperature :math:`\beta`.

Scalars give Python scalars; arrays broadcast against each other and give
numpy arrays (float64, or ``object`` arrays of Python ``int`` for sizes, which
can exceed 64 bits). Invalid arguments raise :class:`ValueError` naming the
argument. A real argument is taken at its exact value, so it must be one a
float64 holds: ``Fraction(1, 2)`` and ``Decimal("0.5")`` are 0.5, while
``Fraction(1, 3)``, ``Decimal("0.1")``, a long double that no float64 equals
or an integer beyond :math:`2^{53}` that none holds is refused (rounding it
to the nearest float would answer for another argument, possibly one on the
wrong side: a smaller spread).

Examples
--------
>>> from softmaxtheory import bounds
>>> bounds.dispersion_size(0.5, 5.69)  # Gemma 2B's mean spread, in the paper
297
>>> bounds.max_coefficient(297, 5.69) < 0.5 <= bounds.max_coefficient(296, 5.69)
True
>>> bounds.adaptive_beta_max()
2.4213877066315246
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any

import numpy as np
from mpmath import libmp

from ._certify import adaptive as adp
from ._certify import enclosures as enc
from ._certify import extremal as ext
from ._certify import interval as ivl
from ._certify import polyroots as pr
from ._certify.environment import certifying
from .spec import Constant, LogLength, Polynomial, Schedule, refuse_masked, resolve_schedule

__all__ = [
    "MAX_EXPONENT",
    "Bracket",
    "LevelRow",
    "adaptive_beta_argmax",
    "adaptive_beta_max",
    "adaptive_dispersion_bracket",
    "adaptive_dispersion_size",
    "adaptive_max_coefficient",
    "adaptive_max_coefficient_bracket",
    "adaptive_switch_off_size",
    "adaptive_window",
    "dispersion_size",
    "empirical_spread",
    "entropy_lower_bound",
    "least_entropy",
    "max_coefficient",
    "min_coefficient",
    "min_entropy_switch_off_size",
    "size_text",
    "spread_from_norms",
    "spread_from_weights",
]


# --------------------------------------------------------------------------- validation


def _shown(value: Any) -> str:
    """`value` for a message: a numpy scalar as its Python value, a huge number shortened."""
    if isinstance(value, np.generic):
        value = value.item()
    text = repr(value)
    if len(text) > 40:
        digits = len(str(abs(value))) if isinstance(value, int) else None
        return f"an integer of {digits} digits" if digits else f"{text[:30]}..."
    return text


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool | np.bool_):
        raise TypeError(f"{name} must be a real number, got a bool")
    if isinstance(value, str | bytes | np.str_ | np.bytes_):
        # (float("0.1") would take the nearest float, another argument: as for a Decimal)
        raise TypeError(f"{name} must be a real number, got the text {_shown(value)}")
    try:
        out = float(value)
    except OverflowError:  # an int or a Fraction beyond the float range
        raise ValueError(f"{name}={_shown(value)} lies beyond the float64 range") from None
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a real number, got {_shown(value)}") from exc
    if isinstance(value, complex | np.complexfloating):
        raise TypeError(f"{name} must be a real number, got {_shown(value)}")
    if math.isnan(out):
        raise ValueError(f"{name} must not be NaN")
    if math.isfinite(out) and not isinstance(value, float) and _inexact(value, out):
        # a Fraction, a Decimal, a long double or an int past 2**53: the bounds are exact
        # functions of their arguments, and the nearest float is another argument
        raise ValueError(
            f"{name}={_shown(value)} is not a float64 value, and the bounds are exact functions of "
            f"their arguments; pass float({name}) to use the nearest float, {out!r}"
        )
    return out


def _inexact(value: Any, out: float) -> bool:
    """Whether `value` (an integer, or with an exact ``as_integer_ratio``) differs from `out`."""
    if isinstance(value, int | np.integer):
        return int(value) != Fraction(out)
    ratio = getattr(value, "as_integer_ratio", None)
    if ratio is None:
        return False
    try:
        num, den = ratio()
    except (OverflowError, ValueError):  # an infinite Decimal (out is then not finite)
        return False
    return Fraction(num, den) != Fraction(out)


def _size(value: Any, name: str = "n") -> int:
    if isinstance(value, bool | np.bool_):
        raise TypeError(f"{name} must be an integer, got a bool")
    whole_fraction = isinstance(value, Fraction) and value.denominator == 1
    if isinstance(value, int | np.integer) or whole_fraction:  # exact, whatever its size
        n = int(value)
    else:
        x = _number(value, name)
        if not (math.isfinite(x) and x == math.floor(x)):
            raise ValueError(f"{name} must be a whole number, got {_shown(value)}")
        n = int(x)
    if n < 1:
        raise ValueError(f"{name} must be >= 1, got {n}")
    return n


def _spread(value: Any, name: str = "spread") -> float:
    x = _number(value, name)
    if not math.isfinite(x) or x < 0:
        raise ValueError(f"{name} must be finite and >= 0, got {_shown(value)}")
    return x


def _positive(value: Any, name: str) -> float:
    x = _number(value, name)
    if not math.isfinite(x) or x <= 0:
        raise ValueError(f"{name} must be finite and > 0, got {_shown(value)}")
    return x


def _probability(value: Any, name: str = "eps") -> float:
    x = _number(value, name)
    if not 0.0 < x < 1.0:
        raise ValueError(f"{name} must lie strictly between 0 and 1, got {_shown(value)}")
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
    if out.size == 0:  # no element to compute: still, every argument given must be valid
        for k, a in arrays.items():  # (beta=None beside an empty n returned an empty array)
            for idx in np.ndindex(a.shape):
                checks[k](a[idx], k)
        return out
    b = {k: np.broadcast_to(a, shape) for k, a in arrays.items()}
    for idx in np.ndindex(shape):
        out[idx] = func(**{k: checks[k](a[idx], k) for k, a in b.items()})
    return out


# --------------------------------------------------------------------------- T1 and T3


#: Largest :math:`\beta\delta` for which sizes are computed: the size then has about
#: 630,000 decimal digits.
MAX_EXPONENT = 1.45e6


@lru_cache(maxsize=4096)
def _max_coefficient(n: int, spread: float, beta: float) -> float:
    return ivl.certify(enc.coefficient_enclosure(n, spread, beta, -1), ivl.float_of)


@lru_cache(maxsize=4096)
def _min_coefficient(n: int, spread: float, beta: float) -> float:
    return ivl.certify(enc.coefficient_enclosure(n, spread, beta, +1), ivl.float_of)


@certifying("a bound")
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
        The bound, correctly rounded to float64 (0.0 only where the exact value
        is at most half the smallest subnormal, as from :math:`2^{1075}` items
        at spread 0).

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


@certifying("a bound")
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
        The bound, correctly rounded to float64 (0.0 only where the exact value
        is at most half the smallest subnormal).

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


@lru_cache(maxsize=4096)
def _entropy_lower_bound(n: int, spread: float, beta: float) -> float:
    return ivl.certify(enc.entropy_floor_enclosure(n, spread, beta), ivl.float_of)


@certifying("a bound")
def entropy_lower_bound(n: Any, spread: Any, beta: Any = 1.0) -> Any:
    r"""A floor on the entropy (nats) of a softmax over `n` items with logit spread `spread` (T3).

    .. math::

        H(\alpha) \;\ge\; -\log \max_k \alpha_k \;\ge\; \log\bigl(1 + (n-1)\,e^{-\beta\delta}\bigr)
        \;\ge\; \log n - \beta\delta .

    The floor is the least *min-entropy* :math:`-\log\max_k\alpha_k` (attained by
    T1's extremal row); the entropy itself stays above it: its least value over
    admissible rows is :func:`least_entropy` (T6, see :doc:`/theory/entropy_floor`),
    5.35 against this floor's 2.70 at 4096 items and spread 5.69.

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


@lru_cache(maxsize=4096)
def _least_entropy(n: int, spread: float, beta: float) -> float:
    return ivl.certify(enc.least_entropy_enclosure(n, spread, beta), ivl.float_of)


@certifying("a bound")
def least_entropy(n: Any, spread: Any, beta: Any = 1.0) -> Any:
    r"""The least entropy (nats) of a softmax over `n` items with logit spread `spread` (T6).

    Over rows of :math:`n` logits in an interval of width :math:`\delta`, the entropy
    of :math:`\operatorname{softmax}(\beta x)` is smallest on a two-level row, with
    :math:`k` logits at the top and the rest at the bottom, so its least value is

    .. math::

        m(n) = \min_{0 \le k \le n} \Bigl[\log\bigl(k e^{\beta\delta} + n - k\bigr)
        - \frac{k\,\beta\delta\,e^{\beta\delta}}{k e^{\beta\delta} + n - k}\Bigr],

    attained (:doc:`/theory/no_escape`, part 3). It lies between the floor of
    :func:`entropy_lower_bound` (a floor on the min-entropy, well below it) and
    :math:`\log n`, and it is the entropy that decides the adaptive temperature:
    :func:`adaptive_switch_off_size` is the least :math:`n` with
    :math:`m(n) \ge H_{\mathrm{off}}`. At 4096 items and spread 5.69 it is 5.35 nats,
    against the min-entropy floor's 2.70.

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
        :math:`m(n)`, correctly rounded to float64 (the minimum is over the one or
        two integer counts next to the real minimiser
        :math:`k^\ast = n w (\beta\delta - 1 + w)/(1 - w)^2`, :math:`w =
        e^{-\beta\delta}`, evaluated in interval arithmetic).

    Examples
    --------
    >>> from softmaxtheory import bounds
    >>> bounds.least_entropy(4096, 0.0)  # log 4096: every row is uniform
    8.317766166719343
    >>> bounds.least_entropy([16, 4096], 5.69)
    array([0.323982  , 5.35058016])
    >>> bounds.entropy_lower_bound([16, 4096], 5.69)  # T3's min-entropy floor
    array([0.0494508 , 2.69728804])
    """
    return _elementwise(
        _least_entropy,
        {"n": n, "spread": spread, "beta": beta},
        {"n": _size, "spread": _spread, "beta": _positive},
        dtype=np.float64,
    )


# --------------------------------------------------------------------------- T2


def _exponent_factor(schedule: Polynomial) -> float:
    r"""The factor of the spread in the exponents of the adaptive sizes: :math:`\beta_{\max}`.

    At least 2.5 (the paper's :math:`\beta_{\max} = 2.42`); a user polynomial whose β
    reaches :math:`2 \cdot 10^6` makes sizes of millions of digits at spread 1, and
    ``Polynomial(("1e300",))`` failed to converge instead of being refused as
    ``Constant("1e300")`` is. An unbounded β is refused by the sizes themselves.
    """
    top = adp.beta_max_up(schedule)
    return max(2.5, top) if math.isfinite(top) else 2.5


def _check_exponent(value: float, what: str, factor: float = 1.0) -> None:
    """Refuse `value` when ``value * factor`` (the exponent a size depends on) is too large."""
    if value * factor > MAX_EXPONENT:
        raise ValueError(
            f"{what} = {value!r} is too large: it must be at most {MAX_EXPONENT / factor:.6g}, "
            "where the size has 630,000 digits"
        )


def _floor_size(scale: Fraction, spread: float, beta: float) -> int:
    r""":math:`\lfloor \text{scale} \cdot e^{\beta\delta} \rfloor + 2`, certified."""

    def enclose(prec: int) -> ivl.Interval:
        e = enc.exp_enclosure(spread, beta, prec, +1)
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


def _dispersion_text(eps: float, spread: float, beta: float, digits: int, rounding: str) -> str:
    scale = 1 / Fraction(eps) - 1
    if spread == 0.0:
        return size_text(math.floor(scale) + 2, digits, rounding=rounding)
    _check_exponent(spread * beta, "spread * beta")
    extra = max(8, int(spread * beta).bit_length() + 8)

    def enclose(prec: int) -> ivl.Interval:
        p = prec + extra
        return ivl.iv_mul(ivl.iv_fraction(scale, p), enc.exp_enclosure(spread, beta, p, +1), p)

    return _size_text_of(
        enclose, "floor2", digits, rounding, lambda: _dispersion_size(eps, spread, beta)
    )


@certifying("a bound")
def dispersion_size(
    eps: Any, spread: Any, beta: Any = 1.0, *, digits: int | None = None, rounding: str = "nearest"
) -> Any:
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

    digits : int, optional
        Return :math:`n^\ast` as text instead: all its digits when it has at
        most `digits`, else scientific, correctly rounded to `digits`
        significant digits (see :func:`size_text`). Fast for every spread up
        to :data:`MAX_EXPONENT`; the exact integer of a spread near that limit
        has hundreds of thousands of digits and takes minutes.
    rounding : {'nearest', 'up', 'down'}, default 'nearest'
        How the text is rounded (see :func:`size_text`): ``'up'`` keeps "no
        coefficient reaches eps from n on" true of the printed n.

    Returns
    -------
    int, str or numpy.ndarray
        :math:`n^\ast`; arrays have dtype ``object`` and hold Python ints (or str).

    Examples
    --------
    >>> from softmaxtheory import bounds
    >>> bounds.dispersion_size(0.5, 5.69)
    297
    >>> bounds.dispersion_size(0.5, 0.0)  # uniform rows: 1/n < 1/2 from n = 3 on
    3
    >>> bounds.dispersion_size(0.5, 800.0).bit_length()
    1155
    >>> bounds.dispersion_size(0.5, 1e6, digits=6)
    '3.03322e+434294'
    """
    nd = _digits_option(digits)
    mode = _rounding_option(rounding)
    if nd is not None:
        return _elementwise(
            lambda eps, spread, beta: _dispersion_text(eps, spread, beta, nd, mode),
            {"eps": eps, "spread": spread, "beta": beta},
            {"eps": _probability, "spread": _spread, "beta": _positive},
            dtype=object,
        )
    return _elementwise(
        _dispersion_size,
        {"eps": eps, "spread": spread, "beta": beta},
        {"eps": _probability, "spread": _spread, "beta": _positive},
        dtype=object,
    )


# --------------------------------------------------------------------------- T6


def _end_value(end: Any, sf: pr.Poly, direction: int) -> float:
    """A window end (the threshold, a root of P - 1 or inf) rounded down (-1) or up (+1)."""
    if end == math.inf:
        return math.inf
    if isinstance(end, Fraction):
        return ivl.float_directed(end, direction)
    a, b = end
    while True:
        if a == b or pr.evaluate(sf, b) == 0:  # the root is b itself
            return ivl.float_directed(b, direction)
        lo, hi = ivl.float_directed(a, direction), ivl.float_directed(b, direction)
        if lo == hi:
            return lo
        a, b = pr.refine(sf, a, b)


@certifying("a bound")
def adaptive_window(schedule: Schedule | None = None) -> tuple[float, float]:
    r"""The entropy window :math:`(H_{\mathrm{on}}, H_{\mathrm{off}})` where the schedule sharpens.

    For a polynomial schedule, :math:`\beta(H) > 1` only for entropies strictly
    inside the window (for the published polynomial, exactly there: the ends
    are the roots of :math:`P(H) = 1`); outside it :math:`\beta = 1`. The ends
    are found by exact root isolation and rounded outward (the lower end down,
    the upper end up), so that this holds of the floats returned: to nearest,
    :math:`H_{\mathrm{off}}` was 5.9445208279051425, below the root
    5.94452082790514286..., and entropies between them have β > 1.

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
    (0.8485819960098693, 5.944520827905143)
    """
    sched = adp.polynomial_schedule(schedule)
    segments, sf = adp.window_exact(sched)
    if not segments:
        raise ValueError(f"schedule {sched!r} never raises beta above 1: it has no window")
    return _end_value(segments[0][0], sf, -1), _end_value(segments[-1][1], sf, +1)


@certifying("a bound")
def adaptive_beta_max(schedule: Schedule | None = None) -> float:
    r"""The largest inverse temperature the schedule can produce (T6).

    For the paper's polynomial, :math:`\beta_{\max} = P(H^\ast)` at the unique
    critical point :math:`H^\ast` of :math:`P`; adaptive coefficients then obey
    T1 with :math:`\beta = \beta_{\max}`: ``max_coefficient(n, spread,
    adaptive_beta_max())`` bounds them. That is why the value is rounded upward:
    the nearest float, 2.421387706631524 for the paper's polynomial, is below
    :math:`\beta_{\max} = 2.42138770663152427\ldots`, and T1 at it fell one
    unit in the last place below rows whose entropy is near :math:`H^\ast`.

    Parameters
    ----------
    schedule : softmaxtheory.spec.Schedule, optional
        Defaults to the paper's schedule. ``Constant(b)`` gives ``b``;
        ``LogLength`` gives ``inf`` (its β grows with the length).

    Returns
    -------
    float
        :math:`\sup_{H \ge 0} \beta(H)` rounded upward (the smallest float64 at
        least as large; ``Constant("0.3")`` gives 0.30000000000000004, since 0.3 is
        below 3/10); ``inf`` when unbounded. Only the entropies a row can have
        count: a threshold below 0 lets no row reach :math:`P` there.

    Examples
    --------
    >>> from softmaxtheory import bounds
    >>> bounds.adaptive_beta_max()
    2.4213877066315246
    """
    sched = resolve_schedule(schedule)
    if isinstance(sched, Constant):
        return _float_up(sched.exact_beta)
    if isinstance(sched, LogLength):
        return math.inf
    return adp.beta_max_up(adp.polynomial_schedule(sched))


def _float_up(value: Fraction) -> float:
    """The smallest float64 at least `value` (``inf`` beyond the float range)."""
    return ivl.float_directed(value, +1)


@certifying("a bound")
def adaptive_beta_argmax(schedule: Schedule | None = None) -> float:
    r"""The entropy :math:`H^\ast \ge 0` at which the schedule's β is largest.

    Over the entropies a row can have, as :func:`adaptive_beta_max`: where
    :math:`P` is largest at a threshold below 0, :math:`H^\ast` is 0 (the
    supremum approached from the right of a threshold at 0).

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
    return adp.peak(adp.polynomial_schedule(schedule))[0]


# --------------------------------------------------------------------------- T6: high precision


def _integer_poly(p: pr.Poly) -> tuple[int, ...]:
    den = 1
    for c in p:
        den = den * c.denominator // math.gcd(den, c.denominator)
    return tuple(int(c * den) for c in p)


def _sign_at_dyadic(p_int: tuple[int, ...], x: Fraction) -> int:
    """The sign of the integer polynomial `p_int` at the dyadic rational `x`, exactly."""
    m, s = x.numerator, x.denominator.bit_length() - 1
    acc = 0
    for i, c in enumerate(p_int):  # sum c_i m^(d-i) 2^(s i): the value times 2^(s d)
        acc = acc * m + (c << (s * i))
    return (acc > 0) - (acc < 0)


def _raw_poly(p: pr.Poly, x: Any, prec: int) -> tuple[Any, Any]:
    """p(x) and p'(x) at an mpmath raw float, rounded to `prec` bits (Newton's step)."""
    val = libmp.fzero
    der = libmp.fzero
    for c in p:
        der = libmp.mpf_add(libmp.mpf_mul(der, x, prec), val, prec)
        cv = libmp.from_rational(c.numerator, c.denominator, prec)
        val = libmp.mpf_add(libmp.mpf_mul(val, x, prec), cv, prec)
    return val, der


_ROOT_CACHE: dict[tuple[Any, ...], ivl.Interval] = {}


def _root_interval(sf: pr.Poly, root: tuple[Fraction, Fraction], prec: int) -> ivl.Interval:
    r"""An enclosure of width about :math:`2^{-prec}` relative of the root isolated in `root`.

    Newton's iteration at doubling precision gives an approximation; the
    enclosure is then proven by the exact signs of `sf` (integer arithmetic)
    at two dyadic points inside the isolating interval, which holds one root.
    """
    key = (sf, root, prec)
    hit = _ROOT_CACHE.get(key)
    if hit is not None:
        return hit
    a, b = root
    while b - a > Fraction(1, 1 << 24):
        a, b = pr.refine(sf, a, b)
    if a == b:
        out = (ivl.iv_fraction(a, prec)[0], ivl.iv_fraction(a, prec)[1])
        _ROOT_CACHE[key] = out
        return out
    p_int = _integer_poly(sf)
    x = libmp.from_rational((a + b).numerator, (a + b).denominator * 2, 60)
    # x is within 2**-24 of the root: each step at twice the precision about doubles the
    # correct bits, and at the final precision the steps go on until one is below
    # 2**-(prec + 8) of x. (Two fixed steps there, behind a precision that had started at
    # 120 bits, left 1536 of the 1838 bits that prec = 1806 needed: the bisection
    # fallback then took minutes.)
    cur, final = 24, prec + 32
    for _ in range(64):
        cur = min(2 * cur, final)
        val, der = _raw_poly(sf, x, cur)
        if der == libmp.fzero:
            break
        step = libmp.mpf_div(val, der, cur)
        x = libmp.mpf_sub(x, step, cur)
        size = libmp.mpf_abs(x) if libmp.mpf_gt(libmp.mpf_abs(x), libmp.fone) else libmp.fone
        if cur == final and (
            step == libmp.fzero
            or libmp.mpf_lt(libmp.mpf_abs(step), libmp.mpf_shift(size, -(prec + 8)))
        ):
            break
    xf = ivl.to_fraction(x)
    step = Fraction(1, 1 << prec) * max(1, abs(math.floor(xf)) + 1)
    for _ in range(8):
        lo, hi = max(a, xf - step), min(b, xf + step)
        s_lo, s_hi = _sign_at_dyadic(p_int, lo), _sign_at_dyadic(p_int, hi)
        if s_lo * s_hi < 0:
            break
        step *= 256
    else:  # Newton did not land inside: bisect (slow; not seen since Newton runs to convergence)
        lo, hi = a, b
        while hi - lo > Fraction(1, 1 << prec):
            lo, hi = pr.refine(sf, lo, hi)
    out = (ivl.iv_fraction(lo, prec)[0], ivl.iv_fraction(hi, prec)[1])
    if len(_ROOT_CACHE) > 256:
        _ROOT_CACHE.clear()
    _ROOT_CACHE[key] = out
    return out


def _off_root(schedule: Polynomial) -> tuple[pr.Poly, tuple[Fraction, Fraction]] | None:
    r"""The isolated root :math:`H_{\mathrm{off}}` of :math:`P - 1` (``None``: β is never > 1)."""
    segments, sf = adp.window_exact(schedule)
    if not segments:
        return None
    end = segments[-1][1]
    if end == math.inf:
        raise ValueError(f"schedule {schedule!r} never switches off: beta > 1 for all large H")
    return sf, (end[0], end[1])


def _solve_t(lam: ivl.Interval, prec: int) -> ivl.Interval | None:
    r"""An enclosure of the :math:`t` with :math:`t + e^t = \Lambda` for every Λ in `lam`.

    :math:`w = e^t` is the Lambert function :math:`W(e^\Lambda)`, computed
    without forming :math:`e^\Lambda`. Newton's iteration on the increasing
    convex :math:`t + e^t` gives an approximation; the enclosure is proven by
    evaluating :math:`t + e^t` on its two ends in interval arithmetic.
    """
    lam_mid = libmp.mpf_shift(libmp.mpf_add(lam[0], lam[1], prec + 32), -1)
    lf = libmp.to_float(lam_mid)
    tf = lf if lf <= 1.0 else math.log(lf)
    for _ in range(100):  # float Newton from the right: monotone, quadratic
        step = (math.exp(tf) + tf - lf) / (math.exp(tf) + 1.0)
        tf -= step
        if abs(step) <= 1e-15 * max(1.0, abs(tf)):
            break
    t = libmp.from_float(tf)
    cur = 53
    while True:
        cur = min(2 * cur, prec + 32)
        for _ in range(1):  # quadratic convergence: one step per doubling
            e = libmp.mpf_exp(t, cur)
            g = libmp.mpf_sub(libmp.mpf_add(e, t, cur), lam_mid, cur)
            t = libmp.mpf_sub(t, libmp.mpf_div(g, libmp.mpf_add(e, libmp.fone, cur), cur), cur)
        if cur == prec + 32:
            break
    tf = ivl.to_fraction(t)
    step = Fraction(1, 1 << prec) * (abs(math.floor(tf)) + 1)
    for _ in range(6):
        lo = ivl.iv_fraction(tf - step, prec + 32)[0]
        hi = ivl.iv_fraction(tf + step, prec + 32)[1]
        g_lo = ivl.iv_add(ivl.iv_exp((lo, lo), prec), (lo, lo), prec)
        g_hi = ivl.iv_add(ivl.iv_exp((hi, hi), prec), (hi, hi), prec)
        if libmp.mpf_le(g_lo[1], lam[0]) and libmp.mpf_ge(g_hi[0], lam[1]):
            return lo, hi
        step *= 256
    return None


_INF = (libmp.fninf, libmp.finf)


def _finite(iv: ivl.Interval) -> bool:
    return libmp.mpf_gt(iv[0], libmp.fninf) and libmp.mpf_lt(iv[1], libmp.finf)


def _peak_count(spread: float, h: ivl.Interval, prec: int) -> ivl.Interval:
    r"""An enclosure of the peak count :math:`\hat k` (see :func:`adaptive_switch_off_size`)."""
    d = ivl.iv_exact(spread)
    e_neg = ivl.iv_exp(ivl.iv_neg(d), prec)  # 1/E
    one = ivl.iv_exact(1)
    em1_over = ivl.iv_sub(one, e_neg, prec)  # (E - 1)/E = 1 - 1/E
    ratio = ivl.iv_div(one, em1_over, prec)  # E/(E-1)
    first = ivl.iv_sub(ratio, ivl.iv_div(one, d, prec), prec)
    # delta/(E-1) = delta * e^-delta / (1 - e^-delta)
    frac = ivl.iv_div(ivl.iv_mul(d, e_neg, prec), em1_over, prec)
    expo = ivl.iv_sub(ivl.iv_add(h, frac, prec), one, prec)
    return ivl.iv_mul(first, ivl.iv_exp(expo, prec), prec)


def _nu(k: int, spread: float, h: ivl.Interval, big_e: ivl.Interval, prec: int) -> ivl.Interval:
    r"""An enclosure of :math:`\nu(k)`: the real n at which k top logits reach H_off.

    :math:`\nu(k) = k\bigl(1 + E\,(H_{\mathrm{off}} + t - \log k\delta)/e^t\bigr)` with
    :math:`t + e^t = \log(k\delta) + \delta - H_{\mathrm{off}}`.
    """
    if k == 0:
        return ivl.iv_exp(h, prec)
    d = ivl.iv_exact(spread)
    log_kd = ivl.iv_log(ivl.iv_mul(ivl.iv_exact(k), d, prec), prec)
    lam = ivl.iv_sub(ivl.iv_add(log_kd, d, prec), h, prec)
    t = _solve_t(lam, prec)
    if t is None:
        return _INF
    w = ivl.iv_exp(t, prec)
    x = ivl.iv_sub(ivl.iv_add(h, t, prec), log_kd, prec)
    inner = ivl.iv_div(ivl.iv_mul(big_e, x, prec), w, prec)
    return ivl.iv_mul(ivl.iv_exact(k), ivl.iv_add(ivl.iv_exact(1), inner, prec), prec)


def _switch_off_value(spread: float, schedule: Polynomial) -> Callable[[int], ivl.Interval] | None:
    r"""Enclosures of :math:`V = \max_k \nu(k)`, or None where V <= 1.

    :math:`\lceil V\rceil` is the least n with :math:`m(n) \ge H_{\mathrm{off}}`.
    """
    found = _off_root(schedule)
    if found is None:
        return None
    return _level_value(spread, *found)


def _level_value(
    spread: float, sf: pr.Poly, root: tuple[Fraction, Fraction]
) -> Callable[[int], ivl.Interval] | None:
    r"""As :func:`_switch_off_value` for the level `h`, the root of `sf` isolated in `root`."""
    if not adp.root_above(sf, list(root), Fraction(0)):
        return None  # h <= 0: every entropy is at least h

    def enclose(prec: int) -> ivl.Interval:
        h = _root_interval(sf, root, prec)
        if spread == 0.0:
            return ivl.iv_exp(h, prec)
        k_hat = _peak_count(spread, h, prec)
        if not _finite(k_hat):
            return _INF
        k_lo = max(0, math.floor(ivl.to_fraction(k_hat[0])))
        k_hi = math.ceil(ivl.to_fraction(k_hat[1]))
        if k_hi - k_lo > 64:
            return _INF
        big_e = enc.exp_enclosure(spread, 1.0, prec, +1)
        value = _nu(k_lo, spread, h, big_e, prec)
        for k in range(k_lo + 1, k_hi + 1):
            value = ivl.iv_max(value, _nu(k, spread, h, big_e, prec))
        return value

    return enclose


def _ceil_of(iv: ivl.Interval) -> int | None:
    if not _finite(iv):
        return None
    lo, hi = math.ceil(ivl.to_fraction(iv[0])), math.ceil(ivl.to_fraction(iv[1]))
    return lo if lo == hi else None


def _floor2_of(iv: ivl.Interval) -> int | None:
    if not _finite(iv):
        return None
    lo, hi = math.floor(ivl.to_fraction(iv[0])), math.floor(ivl.to_fraction(iv[1]))
    return lo + 2 if lo == hi else None


# --------------------------------------------------------------------------- sizes as text


#: How each rounding mode takes a real to an integer (nearest: ties to even).
_ROUND_INT: dict[str, Callable[[Fraction], int]] = {
    "nearest": round,
    "up": math.ceil,
    "down": math.floor,
}


def _rounding_option(rounding: Any) -> str:
    if not isinstance(rounding, str) or rounding not in _ROUND_INT:
        raise ValueError(f"rounding must be 'nearest', 'up' or 'down', got {rounding!r}")
    return rounding


def _scientific(
    x: Any, digits: int, prec: int, rounding: str = "nearest"
) -> tuple[str, int] | None:
    """`x` (a positive raw float) rounded to `digits` significant digits: (mantissa, exponent)."""
    est = libmp.to_float(
        libmp.mpf_div(libmp.mpf_log(x, 64), libmp.mpf_log(libmp.from_int(10), 64), 64)
    )
    e = math.floor(est)
    for _ in range(3):
        shift = e - digits + 1
        ten = libmp.from_int(10)
        if shift >= 0:
            lo_p = libmp.mpf_pow_int(ten, shift, prec, libmp.round_floor)
            hi_p = libmp.mpf_pow_int(ten, shift, prec, libmp.round_ceiling)
            y = libmp.mpi_div((x, x), (lo_p, hi_p), prec)
        else:
            lo_p = libmp.mpf_pow_int(ten, -shift, prec, libmp.round_floor)
            hi_p = libmp.mpf_pow_int(ten, -shift, prec, libmp.round_ceiling)
            y = libmp.mpi_mul((x, x), (lo_p, hi_p), prec)
        y_lo, y_hi = ivl.to_fraction(y[0]), ivl.to_fraction(y[1])
        if y_hi < 10 ** (digits - 1):
            e -= 1
            continue
        if y_lo >= 10**digits:
            e += 1
            continue
        to_int = _ROUND_INT[rounding]
        m_lo, m_hi = to_int(y_lo), to_int(y_hi)
        if m_lo != m_hi or not (10 ** (digits - 1) <= y_lo and y_hi < 10**digits):
            return None
        if m_lo == 10**digits:
            return str(10 ** (digits - 1)), e + 1
        return str(m_lo), e
    return None


def _format_scientific(mantissa: str, exponent: int) -> str:
    body = mantissa[0] + ("." + mantissa[1:] if len(mantissa) > 1 else "")
    return f"{body}e+{exponent:d}"


@certifying("a bound")
def size_text(n: int, digits: int = 6, *, rounding: str = "nearest") -> str:
    r"""An exact size as text: all its digits when it has at most `digits`, else scientific.

    The scientific form is correctly rounded (to nearest, ties to even) to
    `digits` significant digits, so ``size_text(10**400 + 1)`` is
    ``'1.00000e+400'``. No conversion of the whole integer to decimal is made,
    so sizes of hundreds of thousands of digits print at once.

    Rounded to nearest, the text of a threshold may lie below it: "from
    1.08816e+6 items on" is false of 1,088,160 when the size is 1,088,165.
    ``rounding='up'`` gives the least text at least `n` (a statement "from n
    on" stays true), ``'down'`` the greatest at most `n` (for a lower end).

    Parameters
    ----------
    n : int
        A positive integer.
    digits : int, default 6
        Significant digits shown.
    rounding : {'nearest', 'up', 'down'}, default 'nearest'
        The direction of the scientific form's rounding.

    Returns
    -------
    str

    Examples
    --------
    >>> from softmaxtheory import bounds
    >>> bounds.size_text(7419), bounds.size_text(1234567, digits=3)
    ('7419', '1.23e+6')
    >>> bounds.size_text(1088165), bounds.size_text(1088165, rounding="up")
    ('1.08816e+6', '1.08817e+6')
    """
    if isinstance(n, bool) or not isinstance(n, int | np.integer):
        raise TypeError(f"n must be an int, got {type(n).__name__}")
    n = int(n)
    if not isinstance(digits, int | np.integer) or isinstance(digits, bool) or digits < 1:
        raise ValueError(f"digits must be an integer >= 1, got {digits!r}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    mode = _rounding_option(rounding)
    if n < 10**digits:
        return str(n)
    raw = libmp.from_int(n)
    prec = max(n.bit_length(), 64) + 8  # exact: the raw float holds n
    found = _scientific(raw, int(digits), prec, mode)
    if found is None:  # cannot happen for an exact argument
        raise ivl.CertificationError("size_text could not round")
    return _format_scientific(*found)


def _size_text_of(
    enclose: Any, kind: str, digits: int, rounding: str, exact: Callable[[], int]
) -> str:
    """The size defined by an enclosure of its real part, as text, at low precision."""

    def accept(iv: ivl.Interval) -> str | None:
        if not _finite(iv):
            return None
        # the integer lies in [lo + 1, hi + 2] (floor + 2) or [lo, hi + 1] (ceiling)
        add_lo, add_hi = (1, 2) if kind == "floor2" else (0, 1)
        p = 64 + 4 * digits
        lo = libmp.mpf_add(iv[0], libmp.from_int(add_lo), p, libmp.round_floor)
        hi = libmp.mpf_add(iv[1], libmp.from_int(add_hi), p, libmp.round_ceiling)
        if libmp.mpf_lt(hi, libmp.from_int(10**digits)):
            return size_text(exact(), digits, rounding=rounding)  # few digits: exact
        if not libmp.mpf_gt(lo, libmp.fzero):
            return None
        a = _scientific(lo, digits, p + 64, rounding)
        b = _scientific(hi, digits, p + 64, rounding)
        if a is not None and a == b:
            return _format_scientific(*a)
        # The real range [lo + 1, hi + 2] has width above 1, so it holds a rounding
        # boundary whenever the size is one: an integer (m + 1/2) 10**k, a size of
        # digits + 1 digits ending in 5 (one in ten of them). No precision narrows
        # the range past it; the integer itself, once its floor (ceiling) is
        # decided, rounds (ties to even).
        size = (_floor2_of if kind == "floor2" else _ceil_of)(iv)
        return None if size is None else size_text(size, digits, rounding=rounding)

    return ivl.certify(enclose, accept)


def _digits_option(digits: Any) -> int | None:
    if digits is None:
        return None
    if isinstance(digits, bool) or not isinstance(digits, int | np.integer) or digits < 1:
        raise ValueError(f"digits must be None or an integer >= 1, got {digits!r}")
    return int(digits)


# --------------------------------------------------------------------------- T6: switch-off


def _level_size(spread: float, sf: pr.Poly, root: tuple[Fraction, Fraction]) -> int:
    r"""The least n with :math:`m(n) \ge h`, h the root of `sf` isolated in `root`."""
    enclose = _level_value(spread, sf, root)
    if enclose is None:
        return 1
    _check_exponent(spread, "spread")
    return ivl.certify(_with_magnitude(enclose, spread + 8.0), _ceil_of)


def _end_interval(end: Any, sf: pr.Poly, prec: int) -> ivl.Interval:
    """An enclosure of a window end: the threshold (a Fraction) or a root of `sf`."""
    if isinstance(end, Fraction):
        return ivl.iv_fraction(end, prec)
    return _root_interval(sf, (end[0], end[1]), prec)


def _log_above(n: int, end: Any, sf: pr.Poly) -> bool:
    r"""Whether :math:`\log n` exceeds the window end `end`, decided exactly.

    :math:`\log n` is transcendental for :math:`n \ge 2` (Lindemann) and the
    end is algebraic, so they differ and a precise enough enclosure decides;
    for :math:`n = 1` it is the sign of the end.
    """
    if n == 1:
        if isinstance(end, Fraction):
            return end < 0
        a, b = end
        while a < 0 < b and pr.evaluate(sf, Fraction(0)) != 0:
            a, b = pr.refine(sf, a, b)
        return b < 0 or (b == 0 and a < 0 and pr.evaluate(sf, Fraction(0)) != 0)

    def enclose(prec: int) -> ivl.Interval:
        return ivl.iv_sub(ivl.iv_log(adp.int_interval(n), prec), _end_interval(end, sf, prec), prec)

    def accept(iv: ivl.Interval) -> bool | None:
        if libmp.mpf_gt(iv[0], libmp.fzero):
            return True
        if libmp.mpf_lt(iv[1], libmp.fzero):
            return False
        return None

    return ivl.certify(enclose, accept)


@lru_cache(maxsize=4096)
def _switch_off(spread: float, schedule: Polynomial) -> int:
    """The least N such that no row of N items or more gets beta > 1 (see the public docstring)."""
    if _off_root(schedule) is None:  # (it raises where beta never switches off)
        return 1
    segments, sf = adp.window_exact(schedule)
    # The entropies of rows of n items fill [m(n), log n], both ends increasing
    # with n; they meet the segment (a, b) of the window exactly when
    # log n > a and n < N_b, the least n with m(n) >= b. Segments further right
    # have larger N_b: the last one met decides, nearly always the last.
    for i in range(len(segments) - 1, -1, -1):
        left, right = segments[i]
        n_b = _level_size(spread, sf, (right[0], right[1]))
        if n_b >= 2 and _log_above(n_b - 1, left, sf):
            return n_b
    return 1


@lru_cache(maxsize=4096)
def _switch_off_text(spread: float, schedule: Polynomial, digits: int, rounding: str) -> str:
    enclose = _switch_off_value(spread, schedule)
    if enclose is None:
        return "1"
    _check_exponent(spread, "spread")
    extra = max(8, int(spread).bit_length() + 8)

    def wrapped(prec: int) -> ivl.Interval:
        return enclose(prec + extra)

    segments, sf = adp.window_exact(schedule)
    left = segments[-1][0]

    def meets_last(iv: ivl.Interval) -> bool | None:
        # rows of ceil(V) - 1 >= V - 1 items reach the last segment (a, H_off) if V - 1 > e^a
        if not _finite(iv):
            return None
        e_a = ivl.iv_exp(_end_interval(left, sf, 64), 64)[1]
        return bool(libmp.mpf_gt(ivl.iv_sub(iv, ivl.iv_exact(1), 64)[0], e_a))

    if spread <= _EXACT_SWITCH_OFF_SPREAD or not ivl.certify(wrapped, meets_last):
        # the exact integer costs milliseconds here: round it (correctly) instead;
        # so also where the size may be another segment's (never seen at such spreads)
        return size_text(_switch_off(spread, schedule), digits, rounding=rounding)

    return _size_text_of(wrapped, "ceil", digits, rounding, lambda: _switch_off(spread, schedule))


#: Up to this spread the exact switch-off size (an integer of at most ~440 digits)
#: is computed and rounded for ``digits=``; beyond it the enclosure is rounded.
_EXACT_SWITCH_OFF_SPREAD = 1000.0


@certifying("a bound")
def adaptive_switch_off_size(
    spread: Any,
    schedule: Schedule | None = None,
    *,
    digits: int | None = None,
    rounding: str = "nearest",
) -> Any:
    r"""The exact length from which the adaptive temperature is 1 on every row (T6).

    Every row of :math:`n` items with logit spread at most :math:`\delta` has
    entropy at least the two-level minimum (theorem T6, part 3: the minimum
    over a box is at a row with :math:`k` logits at the top and the rest at the
    bottom),

    .. math::

        m(n) = \min_{0 \le k \le n} \Bigl[\log\bigl(k e^\delta + n - k\bigr)
        - \frac{k\delta e^\delta}{k e^\delta + n - k}\Bigr],

    which increases with :math:`n`. The result is one more than the longest
    length some row of which gets :math:`\beta > 1` (1 if none does): from there
    on β = 1 and adaptive softmax is plain softmax. For the paper's schedule it
    is the least :math:`n` with :math:`m(n) \ge H_{\mathrm{off}}`, rows of one
    item fewer reaching into the window below :math:`H_{\mathrm{off}}`; for a
    user's polynomial, rows that short may miss the window (or the segment of
    it that ends at :math:`H_{\mathrm{off}}`), and the same construction at the
    window's other ends decides (see :doc:`/theory/no_escape`). The least
    :math:`n` with :math:`m(n) \ge H_{\mathrm{off}}` is
    :math:`\lceil \max_k \nu(k) \rceil`, where
    :math:`\nu(k)` is the real length at which :math:`k` top logits reach
    :math:`H_{\mathrm{off}}`; :math:`\nu` is unimodal in :math:`k` with its
    peak next to

    .. math::

        \hat k = \Bigl(\frac{e^\delta}{e^\delta - 1} - \frac1\delta\Bigr)
        e^{H_{\mathrm{off}} + \delta/(e^\delta - 1) - 1} \;\le\; e^{H_{\mathrm{off}}},

    so two or three values of :math:`k` decide. Each :math:`\nu(k)` is a
    Lambert-function expression, enclosed in interval arithmetic and certified
    (Ziv's strategy), so the integer is exact. (Entropies computed with
    ``entropy_eps > 0`` are slightly smaller; the guarantee is for the exact
    entropy.)

    Parameters
    ----------
    spread : float or array_like
        Logit spread :math:`\delta \ge 0` of the logits given to the adaptive softmax.
    schedule : softmaxtheory.spec.Polynomial, optional
        Defaults to the paper's schedule.
    digits : int, optional
        Return the size as text instead: all its digits when it has at most
        `digits`, else scientific, correctly rounded to `digits` significant
        digits (see :func:`size_text`). Fast for every spread up to
        :data:`MAX_EXPONENT`, where the exact integer (hundreds of thousands of
        digits) takes minutes.
    rounding : {'nearest', 'up', 'down'}, default 'nearest'
        How the text is rounded (see :func:`size_text`): ``'up'`` keeps "β = 1
        from n on" true of the printed n.

    Returns
    -------
    int, str or numpy.ndarray
        The size (``object`` arrays for array input).

    Raises
    ------
    ValueError
        If the schedule is not a polynomial one, or never switches off.

    See Also
    --------
    min_entropy_switch_off_size : the simpler, looser length from T3's floor.

    Examples
    --------
    >>> from softmaxtheory import bounds
    >>> bounds.adaptive_switch_off_size(0.0)  # uniform rows: log n >= H_off from n = 382
    382
    >>> bounds.adaptive_switch_off_size(5.69)
    7419
    >>> bounds.adaptive_switch_off_size(1e5, digits=6)
    '3.94064e+43426'
    """
    sched = adp.polynomial_schedule(schedule)
    nd = _digits_option(digits)
    mode = _rounding_option(rounding)
    if nd is None:
        return _elementwise(
            lambda spread: _switch_off(spread, sched),
            {"spread": spread},
            {"spread": _spread},
            dtype=object,
        )
    return _elementwise(
        lambda spread: _switch_off_text(spread, sched, nd, mode),
        {"spread": spread},
        {"spread": _spread},
        dtype=object,
    )


def _min_entropy_off_value(spread: float, schedule: Polynomial) -> Any:
    found = _off_root(schedule)
    if found is None:
        return None
    sf, root = found
    if not adp.root_above(sf, list(root), Fraction(0)):
        return None  # H_off <= 0: every entropy is at least H_off, so beta is 1 from n = 1

    def enclose(prec: int) -> ivl.Interval:
        h = _root_interval(sf, root, prec)
        grow = ivl.iv_sub(ivl.iv_exp(h, prec), ivl.iv_exact(1), prec)
        return ivl.iv_mul(grow, enc.exp_enclosure(spread, 1.0, prec, +1), prec)

    return enclose


@lru_cache(maxsize=1024)
def _min_entropy_off(spread: float, schedule: Polynomial) -> int:
    enclose = _min_entropy_off_value(spread, schedule)
    if enclose is None:
        return 1
    _check_exponent(spread, "spread")
    return ivl.certify(_with_magnitude(enclose, spread + 8.0), _floor2_of)


@certifying("a bound")
def min_entropy_switch_off_size(
    spread: Any,
    schedule: Schedule | None = None,
    *,
    digits: int | None = None,
    rounding: str = "nearest",
) -> Any:
    r"""A simpler, looser length from which the adaptive temperature is 1: T3's min-entropy floor.

    The entropy is at least the min-entropy :math:`-\log\max_k\alpha_k \ge
    \log(1 + (n-1)e^{-\delta})` (T3), which reaches :math:`H_{\mathrm{off}}` once

    .. math::

        n \;\ge\; \bigl\lfloor (e^{H_{\mathrm{off}}} - 1)\, e^{\delta} \bigr\rfloor + 2 .

    The entropy's true minimum is higher, so this is far above the exact
    :func:`adaptive_switch_off_size` for spreads beyond a few units (about
    :math:`e\,\delta` times as large).

    Parameters
    ----------
    spread : float or array_like
        Logit spread :math:`\delta \ge 0`.
    schedule : softmaxtheory.spec.Polynomial, optional
        Defaults to the paper's schedule.
    digits : int, optional
        Return text instead, as in :func:`adaptive_switch_off_size`.
    rounding : {'nearest', 'up', 'down'}, default 'nearest'
        How the text is rounded, as in :func:`adaptive_switch_off_size`.

    Returns
    -------
    int, str or numpy.ndarray

    Examples
    --------
    >>> from softmaxtheory import bounds
    >>> bounds.min_entropy_switch_off_size(5.69)
    112635
    """
    sched = adp.polynomial_schedule(schedule)
    nd = _digits_option(digits)
    mode = _rounding_option(rounding)

    def one(spread: float) -> Any:
        if nd is None:
            return _min_entropy_off(spread, sched)
        enclose = _min_entropy_off_value(spread, sched)
        if enclose is None:
            return "1"
        _check_exponent(spread, "spread")
        return _size_text_of(enclose, "floor2", nd, mode, lambda: _min_entropy_off(spread, sched))

    return _elementwise(one, {"spread": spread}, {"spread": _spread}, dtype=object)


# --------------------------------------------------------------------------- T6: adaptive bounds


@certifying("a bound")
def adaptive_max_coefficient(n: Any, spread: Any, schedule: Schedule | None = None) -> Any:
    r"""A certified upper bound on the largest coefficient of an adaptive softmax over `n` items.

    The schedule gives each row a β from its entropy; the rows of :math:`n`
    items with spread at most :math:`\delta` have entropies in
    :math:`[\log n - C(\delta), \log n]` (the two-level minimum of T6 over a
    real number of top logits, :math:`C(\delta) = r - 1 - \log r`,
    :math:`r = \delta/(1 - e^{-\delta})`), so their β is at most
    :math:`\bar\beta(n) = \sup\{\beta(H) : \log n - C(\delta) \le H \le \log n\}`
    and T1 with :math:`\bar\beta(n)` bounds every coefficient:

    .. math::

        \max_k \alpha_k \le \frac{1}{1 + (n-1)e^{-\bar\beta(n)\,\delta}} .

    :math:`\bar\beta(n)` is :math:`\beta_{\max}` while :math:`H^\ast` lies in
    that range, less on longer rows, and 1 once :math:`\log n - C(\delta) \ge
    H_{\mathrm{off}}`. It enters rounded upward. The largest coefficient a
    row is *known* to reach is the lower end of
    :func:`adaptive_max_coefficient_bracket`, whose upper end is often far
    below this closed form (at 4,096 items and spread 5.69: 0.0674, exact,
    against 0.961), at about a second of branch and bound.

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
        T1 at :math:`\bar\beta(n)` rounded up to a float, correctly rounded
        *upward* to float64: the least float at least T1 at that β, so that
        it holds of the exact coefficients (the nearest float lies below the
        bound about half the time, and a row of :math:`10^{400}` items would
        get 0.0). Where :math:`\bar\beta(n) > 1` is not itself a float, the
        result may lie some ulps (growing with :math:`\delta`) above the
        least float at least the bound at the exact :math:`\bar\beta(n)`.

    Examples
    --------
    Past the switch-off size :math:`\bar\beta(n) = 1`, and the bound is T1's,
    attained by one logit :math:`\delta` above the rest (β = 1 there too):

    >>> from softmaxtheory import bounds
    >>> bounds.adaptive_max_coefficient(16384, 5.69)
    0.017740602426668726
    >>> bounds.max_coefficient(16384, 5.69)  # the same bound, to nearest: below it
    0.017740602426668722
    """
    sched = resolve_schedule(schedule)

    def one(n: int, spread: float) -> float:
        return enc.max_coefficient_up(n, spread, adp.beta_sup(n, spread, sched))

    return _elementwise(
        one, {"n": n, "spread": spread}, {"n": _size, "spread": _spread}, dtype=np.float64
    )


def _round_up_coarse(x: Fraction) -> int:
    """An integer >= x with at most 62 significant bits (exact when x < 2**62)."""
    n = math.ceil(x)
    s = max(0, n.bit_length() - 62)
    return -((-n) >> s) << s


def _t1_below(n: int, spread: float, beta: float, eps: float) -> bool:
    r"""Whether :math:`1/(1 + (n-1)e^{-\beta\delta}) < \varepsilon`, proven (False if undecided)."""
    if n <= 1:
        return False
    prec = 96
    lhs = ivl.iv_mul(adp.int_interval(n - 1), enc.exp_enclosure(spread, beta, prec, -1), prec)
    rhs = ivl.iv_fraction(1 / Fraction(eps) - 1, prec)
    return bool(libmp.mpf_gt(lhs[0], rhs[1]))


def _last_not_below(a: int, b: int, spread: float, sched: Polynomial, eps: float) -> int | None:
    r"""The largest n in [a, b] at which T1 with :math:`\bar\beta(n)` does not prove eps.

    None if every length there is proven. Below the last critical point of
    :math:`P`, :math:`\bar\beta(n)` need not be monotone, so no bisection
    applies; a block :math:`[a', b']` is proven at once by T1 at :math:`n = a'`
    with the largest β of any entropy in :math:`[\log a' - C, \log b']`
    (T1 falls with :math:`n` at fixed β). Blocks that fail are split, the upper
    half searched first, until a single length fails.
    """
    gap = adp.entropy_gap_upper(spread)
    stack = [(a, b)] if a <= b else []
    while stack:
        lo, hi = stack.pop()
        # for a single length this is adaptive_beta_up(lo, spread, sched)
        log_lo, log_hi = adp.log_bounds(lo)[0], adp.log_bounds(hi)[1]
        beta = adp.beta_up_on(sched, max(Fraction(0), log_lo - gap), log_hi)
        if _t1_below(lo, spread, beta, eps):
            continue
        if lo == hi:
            return lo
        mid = math.isqrt(lo * hi) if hi > 2 * lo else (lo + hi) // 2
        mid = min(max(mid, lo), hi - 1)
        stack.append((lo, mid))  # popped after the upper half
        stack.append((mid + 1, hi))
    return None


def _adaptive_upper_size(eps: float, spread: float, sched: Polynomial) -> int:
    r"""A certified n from which :func:`adaptive_max_coefficient` stays below `eps`.

    Raises
    ------
    ValueError
        If β grows without bound (P's leading coefficient is positive): then
        :math:`\bar\beta(n)` grows with :math:`n`, T1 with it proves nothing from
        any length on, and rows of every length may reach `eps` (β = 2H at
        spread 1 reaches 0.9 with ten items and more).
    """
    top = adp.beta_max_up(sched)
    if not math.isfinite(top):
        raise ValueError(
            f"schedule {sched!r} grows without bound (beta -> inf as the entropy grows): "
            "no length from which every adaptive coefficient stays below eps can be proven"
        )
    gap = adp.entropy_gap_upper(spread)
    crit = adp.critical_points(sched)
    last = max((cb for _, cb in crit), default=Fraction(-(10**9)))
    last = max(last, sched.exact_threshold)
    # region A: log n - C >= last, where beta-bar(n) = max(P(log n - C), 1) decreases
    start = ivl.iv_exp(ivl.iv_fraction(last + gap, 96), 96) if last + gap > -50 else None
    n_a = max(2, _round_up_coarse(ivl.to_fraction(start[1])) if start else 2)

    def below(n: int) -> bool:
        return _t1_below(n, spread, adp.adaptive_beta_up(n, spread, sched), eps)

    # T1 at beta_max: no row of this length or more reaches eps
    t_top = (1 / Fraction(eps) - 1) * ivl.to_fraction(enc.exp_enclosure(spread, top, 96, +1)[1])
    if below(n_a):
        start = min(n_a, _round_up_coarse(t_top + 2))
        last = _last_not_below(2, start - 1, spread, sched, eps)
        return 2 if last is None else last + 1
    segments = adp.window_exact(sched)[0]
    if segments and segments[-1][1] == math.inf:
        # beta never returns to 1 but stays at most beta_max (P is constant far out)
        hi = max(n_a, _round_up_coarse(t_top + 2) + 1)
    else:
        # beyond e^(H_off + C) beta-bar is 1, and T2 at beta = 1 applies
        found = _off_root(sched)
        h_top = found[1][1] if found is not None else Fraction(0)
        off = ivl.iv_exp(ivl.iv_fraction(max(h_top, Fraction(0)) + gap, 96), 96)[1]
        t2 = (1 / Fraction(eps) - 1) * ivl.to_fraction(enc.exp_enclosure(spread, 1.0, 96, +1)[1])
        hi = max(n_a, _round_up_coarse(max(ivl.to_fraction(off), t2 + 2)) + 1)
    for _ in range(64):
        if below(hi):
            break
        hi *= 2
    else:
        raise ivl.CertificationError("adaptive size search did not converge")
    # Bisect over integers of at most 62 significant bits between n_a (not
    # proven) and hi (proven; so is every longer length, the bound falls with n).
    # Geometric midpoints while the ends are more than a factor 2 apart: hi may
    # lie hundreds of binary orders above the answer, and a grid of multiples of
    # 2**(hi's bits - 62) would then start above n_a and never come down to it.
    lo, hi = n_a, _round_up_coarse(Fraction(hi))
    while True:
        mid = _round_up_coarse(Fraction(math.isqrt(lo * hi) if hi > 2 * lo else (lo + hi) // 2))
        if not lo < mid < hi:
            mid = _round_up_coarse(Fraction(lo + 1))
        if mid >= hi:
            return hi
        if below(mid):
            hi = mid
        else:
            lo = mid


@dataclass(frozen=True)
class LevelRow:
    r"""A row of logits described by levels and counts: ``counts[i]`` logits equal ``levels[i]``.

    Rows with a few distinct levels are where the extremes of T1, T3 and T6
    are found; this describes one without storing :math:`n` numbers.

    Attributes
    ----------
    levels : tuple of float
        The distinct logit values, highest first.
    counts : tuple of int
        How many logits take each value.
    """

    levels: tuple[float, ...]
    counts: tuple[int, ...]

    @property
    def n(self) -> int:
        """The number of items."""
        return sum(self.counts)

    @property
    def spread(self) -> float:
        """The spread of the row (levels with a zero count do not count)."""
        used = [lv for lv, c in zip(self.levels, self.counts, strict=True) if c > 0]
        return max(used) - min(used)

    def logits(self) -> np.ndarray:
        """The row as a float64 array, highest levels first.

        Raises
        ------
        ValueError
            If the row has more than 10**8 items.
        """
        if self.n > 10**8:
            raise ValueError(f"the row has {self.n} items: too many to build")
        return np.repeat(np.array(self.levels, dtype=np.float64), self.counts)

    def __str__(self) -> str:
        # the counts exactly: 295893620344 written 2.95894e+11 was another, longer row,
        # which need not reach the level the witness reaches
        parts = [
            f"{_int_repr(c)} at {lv!r}" for lv, c in zip(self.levels, self.counts, strict=True) if c
        ]
        return ", ".join(parts)

    def __repr__(self) -> str:
        counts = ", ".join(map(_int_repr, self.counts)) + ("," if len(self.counts) == 1 else "")
        return f"LevelRow(levels={self.levels!r}, counts=({counts}))"


def _int_repr(v: Any) -> str:
    """``repr(v)``, but a size too long for Python's integer-to-text limit as its leading digits.

    (Python refuses to write integers of more than ``sys.get_int_max_str_digits()``
    digits, 4300 by default: the repr of a bracket at spread 10**4 raised a ValueError.)
    """
    if isinstance(v, int) and not isinstance(v, bool) and v > 0 and v.bit_length() > 14000:
        limit = sys.get_int_max_str_digits()
        if limit and v.bit_length() * math.log10(2) >= limit - 1:
            return f"<int about {size_text(v, 6)}>"
    return repr(v)


@dataclass(frozen=True)
class Bracket:
    r"""A certified bracket :math:`\text{lower} \le \text{truth} \le \text{upper}`.

    Attributes
    ----------
    lower : float or int
        Attained: the `witness` row reaches it.
    upper : float or int
        Proven: no admissible row goes beyond it.
    witness : LevelRow
        An admissible row attaining `lower`.
    """

    lower: Any
    upper: Any
    witness: LevelRow

    @property
    def ratio(self) -> float:
        """``upper / lower``: how wide the bracket is."""
        return float(Fraction(self.upper) / Fraction(self.lower))

    def __repr__(self) -> str:
        return (
            f"Bracket(lower={_int_repr(self.lower)}, upper={_int_repr(self.upper)}, "
            f"witness={self.witness!r})"
        )


def _p_float(coeffs: np.ndarray, h: np.ndarray) -> np.ndarray:
    return np.polyval(coeffs, h)


def _search_rows(
    log_n: float, n_exact: int | None, spread: float, sched: Polynomial, fine: bool = True
) -> tuple[float, int, float]:
    r"""The best row found of shape (1 at δ, j at c, the rest at 0): (top coefficient, j, c).

    Float64 arithmetic in log space (a search, not a proof: the caller certifies).
    """
    coeffs = np.array([float(c) for c in sched.exact_coefficients])
    theta = float(sched.exact_threshold)
    d = spread
    js = np.arange(0, 401, dtype=np.float64)[:, None]
    cs = np.linspace(0.0, d, 97 if fine else 49)[None, :]

    def top(j: np.ndarray, c: np.ndarray) -> np.ndarray:
        rest = (
            np.maximum(np.exp(log_n) - 1 - j, 0.0) if n_exact is None or n_exact < 2**52 else None
        )
        if n_exact is not None and n_exact < 2**52:
            rest = np.maximum(float(n_exact) - 1 - j, 0.0)
            log_rest = np.log(np.where(rest > 0, rest, 1.0)) + np.where(rest > 0, 0.0, -np.inf)
        else:
            log_rest = log_n + np.log1p(-(1 + j) * np.exp(-log_n))
        valid = np.exp(log_rest) >= 0
        # weights relative to the top item: 1, j e^(c-d), rest e^(-d)
        wm = j * np.exp(c - d)
        wb = np.exp(log_rest - d)
        z = 1.0 + wm + wb
        ent = np.log(z) + d - (d + wm * c) / z
        beta = np.where(ent > theta, np.maximum(_p_float(coeffs, ent), 1.0), 1.0)
        denom = 1.0 + j * np.exp(beta * (c - d)) + np.exp(log_rest - beta * d)
        return np.where(valid, 1.0 / denom, 0.0)

    if n_exact is not None and n_exact < 2**52:
        js = js[js[:, 0] <= n_exact - 1]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        vals = np.nan_to_num(top(js, cs), nan=0.0)
        i, k = np.unravel_index(int(np.argmax(vals)), vals.shape)
        best_j = int(js[i, 0])
        best_c = float(cs[0, k])
        best = float(vals[i, k])
        if fine and d > 0:
            lo, hi = max(0.0, best_c - d / 96), min(d, best_c + d / 96)
            grid = np.linspace(lo, hi, 257)[None, :]
            jj = np.arange(max(0, best_j - 3), best_j + 4, dtype=np.float64)[:, None]
            if n_exact is not None and n_exact < 2**52:
                jj = jj[jj[:, 0] <= n_exact - 1]
            v2 = np.nan_to_num(top(jj, grid), nan=0.0)
            i2, k2 = np.unravel_index(int(np.argmax(v2)), v2.shape)
            if v2[i2, k2] > best:
                best, best_j, best_c = float(v2[i2, k2]), int(jj[i2, 0]), float(grid[0, k2])
    return best, best_j, best_c


def _poly_iv(sched: Polynomial, h: ivl.Interval, prec: int) -> ivl.Interval:
    acc = ivl.iv_exact(0)
    for c in sched.exact_coefficients:
        acc = ivl.iv_add(ivl.iv_mul(acc, h, prec), ivl.iv_fraction(c, prec), prec)
    return acc


def _witness_top(
    row: tuple[int, int, float], spread: float, sched: Polynomial
) -> Callable[[int], ivl.Interval]:
    r"""Enclosures of the top adaptive coefficient of the row (1 at δ, j at c, n - 1 - j at 0)."""
    n, j, c = row

    def enclose(prec: int) -> ivl.Interval:
        d = ivl.iv_exact(spread)
        one = ivl.iv_exact(1)
        cm = ivl.iv_sub(ivl.iv_exact(c), d, prec)  # c - delta <= 0
        wm = ivl.iv_mul(ivl.iv_exact(j), ivl.iv_exp(cm, prec), prec)
        wb = ivl.iv_mul(
            adp.int_interval(n - 1 - j) if n.bit_length() > 60 else ivl.iv_exact(n - 1 - j),
            ivl.iv_exp(ivl.iv_neg(d), prec),
            prec,
        )
        z = ivl.iv_add(ivl.iv_add(one, wm, prec), wb, prec)
        # H = log z + delta - (delta + wm c) / z   (weights relative to the top item)
        s1 = ivl.iv_add(d, ivl.iv_mul(wm, ivl.iv_exact(c), prec), prec)
        h = ivl.iv_sub(ivl.iv_add(ivl.iv_log(z, prec), d, prec), ivl.iv_div(s1, z, prec), prec)
        theta = ivl.iv_fraction(sched.exact_threshold, prec)
        if libmp.mpf_le(h[1], theta[0]):
            beta = one
        elif libmp.mpf_gt(h[0], theta[1]):
            beta = ivl.iv_max(_poly_iv(sched, h, prec), one)
        else:
            return _INF
        em = ivl.iv_mul(ivl.iv_exact(j), ivl.iv_exp(ivl.iv_mul(beta, cm, prec), prec), prec)
        eb = ivl.iv_mul(
            adp.int_interval(n - 1 - j) if n.bit_length() > 60 else ivl.iv_exact(n - 1 - j),
            ivl.iv_exp(ivl.iv_neg(ivl.iv_mul(beta, d, prec)), prec),
            prec,
        )
        return ivl.iv_div(one, ivl.iv_add(ivl.iv_add(one, em, prec), eb, prec), prec)

    return enclose


def _certified_lower(row: tuple[int, int, float], spread: float, sched: Polynomial) -> float:
    """The witness's top coefficient, rounded down to a float64 (never above the exact value)."""

    def accept(iv: ivl.Interval) -> float | None:
        if not _finite(iv):
            return None
        f = ivl.float_of(iv)
        if f is None:
            return None
        return f if Fraction(f) <= ivl.to_fraction(iv[0]) else math.nextafter(f, -math.inf)

    return ivl.certify(_witness_top(row, spread, sched), accept)


def _witness(n: int, j: int, c: float, spread: float) -> LevelRow:
    if j == 0 or c == 0.0:
        return LevelRow((spread, 0.0), (1, n - 1))
    if c == spread:
        return LevelRow((spread, 0.0), (1 + j, n - 1 - j))
    return LevelRow((spread, c, 0.0), (1, j, n - 1 - j))


@certifying("a bound")
def adaptive_max_coefficient_bracket(
    n: Any, spread: Any, schedule: Schedule | None = None
) -> Bracket:
    r"""The largest adaptive-softmax coefficient over `n` items, bracketed (T6).

    ``lower`` is reached by an explicit row, found by a search over rows with
    one logit at the top of the interval, :math:`j` at a level :math:`c` and
    the rest at the bottom (:math:`0 \le j \le 400`, :math:`c` on a grid, then
    refined), and evaluated in certified interval arithmetic (rounded down).
    ``upper`` is the smaller of :func:`adaptive_max_coefficient` and a branch
    and bound over the two shapes of rows that dominate every row (one item at
    the top, some at a level :math:`c` and the rest at the bottom; or some at
    the top and the rest at a level :math:`c`, with real counts: the
    Markov–Krein theorem for the Chebyshev system :math:`1, e^{-y}, ye^{-y},
    e^{-\beta y}`), certified in interval arithmetic and rounded upward. At
    4,096 items and spread 5.69 the bracket is exact to the float (0.0674),
    where :func:`adaptive_max_coefficient` gives 0.961; the search stops after
    10,000 boxes (about 0.5 s), so near the adaptive dispersion size it can stay
    wider (at 1,252 items: [0.5006, 0.5051], rounded outward).

    Parameters
    ----------
    n : int
        Number of items, :math:`n \ge 2`.
    spread : float
        Logit spread :math:`\delta > 0`.
    schedule : softmaxtheory.spec.Polynomial, optional
        Defaults to the paper's schedule.

    Returns
    -------
    Bracket
        ``lower``, ``upper`` (floats) and the ``witness`` row.

    Examples
    --------
    >>> from softmaxtheory import bounds
    >>> b = bounds.adaptive_max_coefficient_bracket(1252, 5.69)
    >>> b.lower >= 0.5, b.witness.n
    (True, 1252)
    >>> 0.5006 <= b.lower and b.upper <= 0.5051
    True
    """
    n = _size(n)
    if n < 2:
        raise ValueError(f"n must be >= 2, got {n}")
    spread = _spread(spread)
    if spread == 0.0:
        raise ValueError("spread must be > 0: at spread 0 every coefficient is 1/n")
    sched = adp.polynomial_schedule(schedule)
    _check_exponent(spread, "spread", _exponent_factor(sched))
    return _max_coefficient_bracket(n, spread, sched)


@lru_cache(maxsize=1024)
def _max_coefficient_bracket(n: int, spread: float, sched: Polynomial) -> Bracket:
    log_n = float(adp.log_bounds(n)[0])
    _, j, c = _search_rows(log_n, n, spread, sched)
    lower = _certified_lower((n, j, c), spread, sched)
    # upward: the bracket's upper end must not be below the exact bound
    upper = enc.max_coefficient_up(n, spread, adp.beta_sup(n, spread, sched))
    if upper > lower:
        upper = min(upper, _float_up(ext.adaptive_top_upper(n, spread, sched, known=lower)))
    return Bracket(lower=lower, upper=upper, witness=_witness(n, j, c, spread))


def _dispersion_witness(
    eps: float, spread: float, sched: Polynomial, upper: int
) -> tuple[int, int, float] | None:
    """The longest row found whose top adaptive coefficient reaches eps (searched in log n)."""

    def ok(log_n: float, n_exact: int | None) -> tuple[float, int, float]:
        return _search_rows(log_n, n_exact, spread, sched, fine=False)

    lo_l = math.log(2.0)
    if ok(lo_l, 2)[0] < eps:
        # β is not monotone in n: longer rows may reach eps where two items do not
        # (a schedule that sharpens only entropies above log 2); start from one
        for m in _ladder(3, upper):
            log_m = float(adp.log_bounds(m)[0])
            if ok(log_m, m)[0] >= eps:
                lo_l = log_m
                break
        else:
            return None
    hi_l = float(adp.log_bounds(upper)[1])
    for _ in range(48):  # bisection on log n: the best value falls with n
        mid = 0.5 * (lo_l + hi_l)
        n_mid = _exp_int(mid)
        if ok(mid, n_mid)[0] >= eps:
            lo_l = mid
        else:
            hi_l = mid
        if hi_l - lo_l < 1e-9 * max(1.0, hi_l):
            break
    n = _exp_int(lo_l)
    for _ in range(64):
        best, j, c = _search_rows(float(adp.log_bounds(n)[0]), n, spread, sched)
        if best >= eps:
            row = (n, j, c)
            try:
                if _certified_lower(row, spread, sched) >= eps:
                    return row
            except ivl.CertificationError:
                pass
        n = max(2, n - max(1, n >> 20))
    return None


def _ladder(start: int, stop: int) -> list[int]:
    """Lengths from `start` to `stop` (exclusive), each about 1.25 times the last."""
    out, m = [], start
    while m < stop:
        out.append(m)
        m = max(m + 1, m + (m >> 2))
    return out


def _exp_int(log_n: float) -> int:
    """An integer near e**log_n (at least 2), with at most 53 significant bits."""
    if log_n < 700:  # (the shift below was negative for log n in [36, 36.7))
        return max(2, math.floor(math.exp(log_n)))
    bits = log_n / math.log(2.0)
    whole = math.floor(bits)
    mant = math.floor(2.0 ** (bits - whole + 52))
    return mant << (whole - 52)


@certifying("a bound")
def adaptive_dispersion_bracket(
    eps: Any, spread: Any, schedule: Schedule | None = None, *, budget: int = 0
) -> Bracket:
    r"""The adaptive dispersion size, bracketed: the length from which no coefficient reaches `eps`.

    ``lower`` is one more than the length of an explicit row whose largest
    adaptive coefficient reaches `eps` (the ``witness``, found by the search of
    :func:`adaptive_max_coefficient_bracket` at each length, bisecting on
    :math:`\log n`), so the truth is at least ``lower``; and at least
    :func:`dispersion_size` at :math:`\beta = 1`, since every adaptive β is at
    least 1 (the witness is then T1's extreme row, the spread on one item).
    ``upper`` is
    :func:`adaptive_dispersion_size`: from there on
    :func:`adaptive_max_coefficient` stays below `eps`.

    With a `budget`, ``upper`` is lowered further by proofs that every length
    from a smaller :math:`n` on stays below `eps`: a branch and bound over the
    two shapes of rows that dominate every row (see
    :func:`adaptive_max_coefficient_bracket`) with the number of items free,
    bisecting on :math:`\log n` until the ends are within 1 % or the budget is
    spent. At spread 5.69 and :math:`\varepsilon = 0.5`, 30,000 boxes (about
    2 s, the ``bounds`` command's default) bring :math:`[1253, 5828]` to
    :math:`[1253, 1283]`, and 60,000 (about 4 s) to :math:`[1253, 1267]`.

    Parameters
    ----------
    eps : float
        The level :math:`0 < \varepsilon < 1`.
    spread : float
        Logit spread :math:`\delta > 0`.
    schedule : softmaxtheory.spec.Polynomial, optional
        Defaults to the paper's schedule.
    budget : int, default 0
        Boxes of branch and bound to spend lowering ``upper`` (0: none, fast).

    Returns
    -------
    Bracket
        ``lower``, ``upper`` (ints) and the ``witness`` row (of ``lower - 1`` items).

    Raises
    ------
    ValueError
        For a bad argument, or a schedule whose β grows without bound (a positive
        leading coefficient): no length from which every coefficient stays below
        `eps` can be proven, and rows of every length may reach it.

    Examples
    --------
    >>> from softmaxtheory import bounds
    >>> b = bounds.adaptive_dispersion_bracket(0.5, 5.69)
    >>> b.lower <= b.upper <= bounds.adaptive_switch_off_size(5.69)
    True
    """
    eps = _probability(eps)
    spread = _spread(spread)
    if spread == 0.0:
        raise ValueError("spread must be > 0: at spread 0 the size is dispersion_size(eps, 0)")
    sched = adp.polynomial_schedule(schedule)
    if isinstance(budget, bool) or not isinstance(budget, int | np.integer) or budget < 0:
        raise ValueError(f"budget must be an integer >= 0, got {budget!r}")
    _check_exponent(spread, "spread", _exponent_factor(sched))
    upper = _adaptive_upper_size(eps, spread, sched)
    row = _dispersion_witness(eps, spread, sched, upper)
    if row is None:  # no longer row found that reaches eps: one item does (its coefficient is 1)
        lower, witness = 2, LevelRow((0.0,), (1,))
    else:
        n, j, c = row
        lower, witness = n + 1, _witness(n, j, c, spread)
    # beta >= 1, so the row of T1's extreme (the spread on one item, the rest at
    # 0) reaches eps with one item fewer than the plain dispersion size: the
    # search above stops within a relative 1e-9 of its end, and below this
    plain = _dispersion_size(eps, spread, 1.0)
    if plain > lower:
        lower, witness = plain, LevelRow((spread, 0.0), (1, plain - 2))
    upper = max(upper, lower)
    if budget and upper > lower:
        upper = ext.dispersion_upper(eps, spread, sched, lower, upper, int(budget))
    return Bracket(lower=lower, upper=upper, witness=witness)


@certifying("a bound")
def adaptive_dispersion_size(eps: Any, spread: Any, schedule: Schedule | None = None) -> Any:
    r"""A certified length from which no adaptive-softmax coefficient can reach `eps`.

    The least :math:`n` from which :func:`adaptive_max_coefficient` stays
    below :math:`\varepsilon` (above :math:`2^{62}`, the least among integers
    with at most 62 significant bits). Beyond the last critical point of
    :math:`P`, :math:`\bar\beta(n)` falls with :math:`n`, so the bound does
    too and a bisection finds the point, geometric while its ends are more than
    a factor 2 apart. Before it :math:`\bar\beta(n)` need not be monotone:
    blocks of lengths are proven at once by T1 at the largest β any of their
    entropies gets, and split where that fails, down to single lengths. The
    truth lies between the lower end of :func:`adaptive_dispersion_bracket` and
    this.

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

    Raises
    ------
    ValueError
        For a :class:`~softmaxtheory.spec.LogLength` schedule, or a polynomial
        whose β grows without bound (no such size can be proven). A β that
        stays above 1 but bounded (``Polynomial(("2",))``) has one: T1 at
        :math:`\beta_{\max}`.

    Examples
    --------
    >>> from softmaxtheory import bounds
    >>> bounds.adaptive_dispersion_size(0.5, 5.69) < bounds.adaptive_switch_off_size(5.69)
    True
    """
    sched = resolve_schedule(schedule)

    def one(eps: float, spread: float) -> int:
        if isinstance(sched, Constant):
            return _dispersion_size(eps, spread, sched.exact_beta)  # exact: "0.3" is 3/10
        if isinstance(sched, LogLength):
            raise ValueError("LogLength schedules need not disperse: there is no such size")
        poly = adp.polynomial_schedule(sched)
        if spread == 0.0:
            return _dispersion_size(eps, 0.0, 1.0)
        _check_exponent(spread, "spread", _exponent_factor(poly))
        return _adaptive_upper_size(eps, spread, poly)

    return _elementwise(
        one, {"eps": eps, "spread": spread}, {"eps": _probability, "spread": _spread}, dtype=object
    )


# --------------------------------------------------------------------------- T9


def _nonnegative(value: Any, name: str) -> float:
    x = _number(value, name)
    if not math.isfinite(x) or x < 0:
        raise ValueError(f"{name} must be finite and >= 0, got {_shown(value)}")
    return x


def _product_bound(*factors: float) -> float:
    """The product of non-negative floats, exact, then rounded upward to float64."""
    raw = libmp.from_int(1)
    for f in factors:
        raw = libmp.mpf_mul(raw, libmp.from_float(f))  # exact: no precision given
    return _float_up(ivl.to_fraction(raw))


@certifying("a bound")
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
        :math:`2 s \lVert q\rVert K`, rounded upward to float64 (the
        smallest float64 at least as large; ``inf`` beyond the float range),
        so that the bounds of this module evaluated at it hold for the row.

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


def _float64(value: Any, name: str) -> np.ndarray:
    """`value` as a float64 array, refused where an entry is not a float64 value.

    float16/32/64 and bool convert exactly; integers beyond :math:`2^{53}`, long
    doubles and objects (Fractions, Decimals) are checked entry by entry, as
    :func:`_number` checks a scalar.
    """
    arr = np.asarray(value)
    if arr.dtype.kind not in "biufO":
        raise TypeError(f"{name} must be numeric, got dtype {arr.dtype}")
    try:
        out = arr.astype(np.float64)
    except OverflowError:
        raise ValueError(f"{name} holds a value beyond the float64 range") from None
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be numeric: {exc}") from exc
    if arr.dtype.kind == "b" or (arr.dtype.kind == "f" and arr.dtype.itemsize <= 8):
        return out
    given, got = arr.ravel(), out.ravel()
    if arr.dtype.kind in "iu":
        far = (given > 2**53) | (given < -(2**53))
        given, got = given[far], got[far]
    for v, o in zip(given.tolist() if arr.dtype.kind in "iu" else given, got, strict=True):
        if math.isfinite(o) and _inexact(v, float(o)):
            raise ValueError(
                f"{name} holds {v!r}, which is not a float64 value, and the bounds are exact "
                f"functions of their arguments; convert {name} to float64 to use the nearest "
                "floats"
            )
    return out


def _matrix(w: Any, name: str) -> np.ndarray:
    arr = np.asarray(w)
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"{name} must be a real matrix, got dtype {arr.dtype}")
    arr = _float64(arr, name)
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


def _bias_vector(b: Any, name: str) -> np.ndarray | None:
    if b is None:
        return None
    arr = np.asarray(b)
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"{name} must be real, got dtype {arr.dtype}")
    arr = _float64(arr, name)
    if arr.ndim < 1 or not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be a finite vector (…, d), got shape {arr.shape}")
    return arr


_GAMMA = 1.01 * 2.0**-53  # unit roundoff with room for the accumulated factor

#: The least subnormal: the most any one gradual underflow can move a value, times two.
_SUB = 2.0**-1074


def _power_scaled(w: np.ndarray, axes: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    r"""``(w', e)`` with :math:`w = w' \cdot 2^{e}` and :math:`\max|w'| < 1` over `axes`.

    The scaling is exact except for entries that fall below the normal range
    (each then moves by at most :math:`2^{-1075}`, which the callers' bounds
    cover); it keeps the products of :func:`_product_norm_parts` and
    :func:`_mat_vec_norm_parts` within the float range, where weights near
    :math:`10^{200}` overflowed (the bound came out NaN) and weights near
    :math:`10^{-200}` underflowed to 0 (a "bound" below the exact value).
    """
    top = np.max(np.abs(w), axis=axes) if w.size else np.zeros(np.delete(w.shape, axes))
    e = np.frexp(top)[1]  # top = f 2**e, 1/2 <= f < 1 (e = 0 for zero)
    return np.ldexp(w, -np.expand_dims(e, axes)), e


def _product_norm_parts(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r"""Upper bounds on :math:`\lVert a^\top b\rVert_2` over the last two axes, as ``(x, e)``.

    The bound is :math:`x\,2^{e}` (kept apart: it may pass the float range).
    Computed on the power-of-two scaled matrices (:func:`_power_scaled`),
    whose entries are below 1. The computed product differs from the exact
    one by at most :math:`\gamma_r |a|^\top |b|` entrywise (:math:`r` rows
    summed) plus :math:`(2r + 4)\,2^{-1074}` for gradual underflow (of the
    scaled entries, the products and the sums), whose Frobenius norm bounds
    the spectral norm of the difference (Weyl).
    """
    if a.size == 0 or b.size == 0:  # an empty product: norm 0
        shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        return np.zeros(shape), np.zeros(shape, dtype=int)
    r = a.shape[-2]
    a1, ea = _power_scaled(a, (-2, -1))
    b1, eb = _power_scaled(b, (-2, -1))
    at = np.swapaxes(a1, -1, -2)
    m = at @ b1
    err = (r + 2) * _GAMMA * (np.abs(at) @ np.abs(b1)) + (2 * r + 4) * _SUB
    x = _spectral_upper(m) + _norm_upper(err, (-2, -1), 1e-12)
    return np.nextafter(x, np.inf), ea + eb  # (the sum's rounding)


def _norm_upper(x: np.ndarray, axes: tuple[int, ...], rel: float) -> np.ndarray:
    r"""An upper bound on the 2-norm of the non-negative `x` over `axes` (Frobenius for two).

    The squares are taken of :math:`x_i / \max x`, so none overflows and those
    that underflow are below :math:`2^{-1022}` against a sum of at least 1;
    `rel` covers the rounding of the sum and the root, and :math:`2^{-1074}`
    more the rounding of a subnormal product. (Squares of the raw values
    underflowed to 0 for tiny ones, and overflowed to ``inf`` for weights
    near :math:`10^{90}`.)
    """
    top = np.max(x, axis=axes, keepdims=True)
    ratio = x / np.where(top > 0, top, 1.0)
    total = np.sum(ratio * ratio, axis=axes)
    return np.squeeze(top, axis=axes) * np.sqrt(total) * (1 + rel) + _SUB


def _mat_vec_norm_parts(w: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r"""Upper bounds on :math:`\lVert w^\top b\rVert` as ``(x, e)``, the bound :math:`x\,2^{e}`.

    `w` of shape (..., r, c), `b` of (..., r); on power-of-two scaled operands, as
    :func:`_product_norm_parts`.
    """
    if w.size == 0 or b.size == 0:
        shape = np.broadcast_shapes(w.shape[:-2], b.shape[:-1])
        return np.zeros(shape), np.zeros(shape, dtype=int)
    r = w.shape[-2]
    w1, ew = _power_scaled(w, (-2, -1))
    b1, eb = _power_scaled(b, (-1,))
    wt = np.swapaxes(w1, -1, -2)
    v = (wt @ b1[..., :, None])[..., 0]
    err = (r + 2) * _GAMMA * (np.abs(wt) @ np.abs(b1)[..., :, None])[..., 0] + (2 * r + 4) * _SUB
    total = np.abs(v) + err
    return _norm_upper(total, (-1,), 4.0 * total.shape[-1] * 2.0**-52), ew + eb


def _layouts(wq: np.ndarray, wk: np.ndarray, layout: str) -> list[str]:
    rq, cq = wq.shape[-2:]
    rk, ck = wk.shape[-2:]
    possible = []
    if rq == rk:
        possible.append("out_in")
    if cq == ck:
        possible.append("in_out")
    if layout == "auto":
        if not possible:
            raise ValueError(
                f"w_q {wq.shape} and w_k {wk.shape} share neither their rows nor their columns"
            )
        return possible
    if layout not in ("out_in", "in_out"):
        raise ValueError(f"layout must be 'auto', 'out_in' or 'in_out', got {layout!r}")
    if layout not in possible:
        axis = "rows" if layout == "out_in" else "columns"
        raise ValueError(
            f"layout {layout!r} needs w_q {wq.shape} and w_k {wk.shape} to share their {axis}"
        )
    return [layout]


@certifying("a bound")
def spread_from_weights(
    w_q: Any,
    w_k: Any,
    input_norm: Any,
    *,
    bias_q: Any = None,
    bias_k: Any = None,
    key_input_norm: Any = None,
    scale: Any = 1.0,
    layout: str = "auto",
) -> Any:
    r"""The largest spread an attention head's logits can have, from its projection weights (T9).

    With queries :math:`q = W_Q x + b_Q`, keys :math:`k_j = W_K y_j + b_K`
    and inputs :math:`\lVert x\rVert \le B_Q`, :math:`\lVert y_j\rVert \le B_K`,
    the logits are :math:`s\,q\cdot k_j`; the key bias adds :math:`s\,q\cdot b_K`
    to every logit of the row and so cancels in the spread (T8), and

    .. math::

        \max_j x_j - \min_j x_j \;\le\; 2\,s\,B_K\bigl(\lVert W_Q^\top W_K\rVert_2\,B_Q
        + \lVert W_K^\top b_Q\rVert\bigr).

    Without a query bias this is the exact supremum over such inputs
    (theorem T9); with one it is within a factor :math:`\sqrt2` of it, and
    exact when :math:`W_K^\top b_Q` lies along the top left singular vector of
    :math:`W_K^\top W_Q`. Leading axes (heads, layers) broadcast.

    Parameters
    ----------
    w_q, w_k : array_like, shape (..., r, c)
        Query and key projection matrices.
    input_norm : float or array_like
        :math:`B_Q`, a bound on the norm of the inputs the queries are computed
        from (and of the keys' inputs unless `key_input_norm` is given).
    bias_q : array_like, shape (..., d), optional
        The query projection's bias.
    bias_k : array_like, shape (..., d), optional
        The key projection's bias: validated, and without effect on the spread.
    key_input_norm : float or array_like, optional
        :math:`B_K` when it differs from :math:`B_Q` (cross-attention).
    scale : float, default 1.0
        The logit scale (``1/sqrt(d_head)`` in scaled dot-product attention).
    layout : {'auto', 'out_in', 'in_out'}, default 'auto'
        How the matrices are stored: ``'out_in'`` as ``torch.nn.Linear``
        weights, :math:`q = W x` (shape ``(d_head, d_model)``); ``'in_out'``
        as :math:`q = x W` (shape ``(d_model, d_head)``). ``'auto'`` takes the
        larger bound of the layouts the shapes allow, which is valid for either.

    Returns
    -------
    float or numpy.ndarray
        An upper bound on the spread, rounded upward to float64 (``inf``
        where it exceeds the float range). The product's spectral norm comes
        from LAPACK on the matrices scaled by powers of two (exactly, so that
        no product overflows or underflows: weights near :math:`10^{90}`
        gave ``inf``, near :math:`10^{200}` NaN), inflated to cover the
        rounding of the product and LAPACK's backward error.

    Examples
    --------
    >>> import numpy as np
    >>> from softmaxtheory import bounds
    >>> w = np.diag([2.0, 1.0])
    >>> bounds.spread_from_weights(w, w, 1.0)  # 2 * ||W^T W|| = 2 * 4, rounded up
    8.000000000000034
    """
    wq = _matrix(w_q, "w_q")
    wk = _matrix(w_k, "w_k")
    bq_in = _float64(input_norm, "input_norm")
    if np.any(~np.isfinite(bq_in)) or np.any(bq_in < 0):
        raise ValueError(f"input_norm must be finite and >= 0, got {input_norm!r}")
    if key_input_norm is None:
        bk_in = bq_in
    else:
        bk_in = _float64(key_input_norm, "key_input_norm")
        if np.any(~np.isfinite(bk_in)) or np.any(bk_in < 0):
            raise ValueError(f"key_input_norm must be finite and >= 0, got {key_input_norm!r}")
    s = _positive(scale, "scale")
    heads = np.broadcast_shapes(wq.shape[:-2], wk.shape[:-2])
    for name, norm in (("input_norm", bq_in), ("key_input_norm", bk_in)):
        try:
            np.broadcast_shapes(heads, np.shape(norm))
        except ValueError:
            raise ValueError(
                f"{name} of shape {np.shape(norm)} does not broadcast with the leading axes "
                f"{heads} of w_q and w_k (one bound per head, or one for all)"
            ) from None
    bq = _bias_vector(bias_q, "bias_q")
    _bias_vector(bias_k, "bias_k")  # validated: it cancels in the spread
    best: Any = None
    for lay in _layouts(wq, wk, layout):
        # in the out_in layout q.k_j = (W_K^T q) . y_j; in_out transposes both matrices
        a, b = (wq, wk) if lay == "out_in" else (np.swapaxes(wq, -1, -2), np.swapaxes(wk, -1, -2))
        if bq is not None and bq.shape[-1] != a.shape[-2]:
            if layout == "auto":
                continue  # the bias rules this layout out
            raise ValueError(
                f"bias_q has {bq.shape[-1]} entries, the {lay} layout needs {a.shape[-2]}"
            )
        # the norms as x * 2**e, combined with the input norms and the scale in exact
        # rationals: formed in floats, 1e308 * 0 gave NaN and 1e308 * 1e-300 inf
        terms = [(*_product_norm_parts(a, b), bq_in)]
        if bq is not None:
            terms.append((*_mat_vec_norm_parts(b, bq), 1.0))
        per = _exact_sum(terms)
        best = per if best is None else np.maximum(best, per)
    if best is None:
        raise ValueError(f"bias_q of shape {bq.shape} fits neither layout of w_q {wq.shape}")
    factor, best = np.broadcast_arrays(np.asarray(bk_in, dtype=np.float64), best)
    two_s = 2 * Fraction(s)
    bound = np.empty(best.shape)
    for idx in np.ndindex(best.shape):
        bound[idx] = _float_up(two_s * Fraction(float(factor[idx])) * best[idx])
    return float(bound) if np.ndim(bound) == 0 else bound


def _exact_sum(terms: list[tuple[np.ndarray, np.ndarray, Any]]) -> np.ndarray:
    r""":math:`\sum_t x_t 2^{e_t} c_t` elementwise, as an object array of exact Fractions."""
    arrays = np.broadcast_arrays(*(np.asarray(v) for t in terms for v in t))
    out = np.empty(arrays[0].shape, dtype=object)
    for idx in np.ndindex(out.shape):
        total = Fraction(0)
        for k in range(len(terms)):
            x, e, c = (arrays[3 * k + j][idx] for j in range(3))
            total += Fraction(float(x)) * Fraction(2) ** int(e) * Fraction(float(c))
        out[idx] = total
    return out


# --------------------------------------------------------------------------- measurement


def _as_real_array(logits: Any) -> np.ndarray:
    """`logits` as a numpy array that holds their exact values.

    Floats of at most 64 bits and booleans become float64 (exactly); integers and
    wider floats keep their dtype, which float64 may not hold.
    """
    if hasattr(logits, "detach") and hasattr(logits, "float"):  # a torch tensor
        t = logits.detach()
        if t.is_complex():
            raise TypeError("logits must be real, got a complex tensor")
        if t.is_floating_point() and t.element_size() < 4:
            t = t.float()  # float16 / bfloat16: exact in float32
        logits = t.cpu().numpy()
    arr = np.asarray(logits)
    if arr.dtype.kind == "c":
        raise TypeError("logits must be real, got complex values")
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"logits must be numeric, got dtype {arr.dtype}")
    if arr.dtype.kind in "iu" or (arr.dtype.kind == "f" and arr.dtype.itemsize > 8):
        return arr
    return arr.astype(np.float64)


def _difference_up(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """:math:`hi - lo` rounded upward, for float64 arrays with ``hi >= lo`` finite.

    The rounded difference and its error are exact (Knuth's two-sum, in the
    default rounding to nearest); where the error is positive the difference
    rounded down, and the next float is the upward rounding.
    """
    with np.errstate(invalid="ignore", over="ignore"):
        s = hi - lo
        b = s - hi
        err = (hi - (s - b)) + (-lo - b)
    up = np.isfinite(s) & (err > 0)
    return np.where(up, np.nextafter(s, np.inf), s)


def _exact_difference_up(hi: Any, lo: Any) -> float:
    """:math:`hi - lo` for exact scalars (ints, long doubles), rounded upward to float64."""
    return _float_up(Fraction(*hi.as_integer_ratio()) - Fraction(*lo.as_integer_ratio()))


@certifying("a bound")
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
        The spreads, with `axis` removed: each the exact difference rounded
        upward to float64 (the smallest float64 at least as large, ``inf``
        beyond the float range), so that the row's logits lie within it and
        every bound of this module evaluated at it holds for the row. Rounded
        to nearest, half the inexact differences came out below the row's
        spread, and :func:`max_coefficient` at such a spread was one unit in
        the last place below the row's correctly rounded largest coefficient.

    Examples
    --------
    >>> from softmaxtheory import bounds
    >>> bounds.empirical_spread([[0.0, 2.5, -float("inf")], [1.0, -1.0, 0.5]])
    array([2.5, 2. ])
    >>> bounds.empirical_spread([1.0, -2.0**-60])  # 1 + 2**-60 rounded up
    np.float64(1.0000000000000002)

    A ``numpy.ma.MaskedArray`` with masked entries is refused (its mask
    would be dropped); ``logits.filled(-np.inf)`` gives the spread of the
    unmasked items.
    """
    refuse_masked(logits, "logits")
    x = _as_real_array(logits)
    if x.ndim == 0:
        raise ValueError("logits must have at least one dimension (the items)")
    try:
        axes = _normalize_axis_tuple(axis, x.ndim)
    except (np.exceptions.AxisError, TypeError) as exc:
        raise ValueError(f"axis {axis!r} is out of range for logits of shape {x.shape}") from exc
    if x.dtype.kind in "iu":  # exact integers, never masked
        if x.size == 0:
            x = x.astype(np.float64)  # every row empty: spread 0 below
        else:
            hi, lo = np.max(x, axis=axes), np.min(x, axis=axes)
            out = np.array(
                [
                    _exact_difference_up(int(a), int(b))
                    for a, b in zip(hi.ravel(), lo.ravel(), strict=True)
                ],
                dtype=np.float64,
            ).reshape(hi.shape)
            return out[()] if out.ndim == 0 else out
    masked = x == -np.inf
    bad = np.any(np.isnan(x) | (x == np.inf), axis=axes)
    hi = np.max(np.where(masked, -np.inf, x), axis=axes, initial=-np.inf)
    lo = np.min(np.where(masked, np.inf, x), axis=axes, initial=np.inf)
    finite = np.isfinite(hi) & np.isfinite(lo)
    if x.dtype == np.float64:
        spread = np.where(
            finite, _difference_up(np.where(finite, hi, 0.0), np.where(finite, lo, 0.0)), 0.0
        )
    else:  # a long double: its exact values, one row at a time
        spread = np.zeros(hi.shape, dtype=np.float64)
        for i in np.ndindex(hi.shape):
            if finite[i]:
                spread[i] = _exact_difference_up(hi[i], lo[i])
    spread = np.where(bad, np.nan, spread)
    return spread[()] if spread.ndim == 0 else spread
