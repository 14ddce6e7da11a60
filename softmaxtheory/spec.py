r"""The specification: the one source of truth every backend reads.

Every backend of :mod:`softmaxtheory` computes the same mathematical functions
along the last axis of an ``(..., n)`` array :math:`x`:

.. math::

    \operatorname{softmax}(x)_i = \frac{e^{x_i - m}}{\sum_j e^{x_j - m}},
    \qquad m = \max_j x_j,

    H(x) = -\sum_i p_i \log p_i \quad (p = \operatorname{softmax}(x),\ 0 \log 0 = 0),

    \operatorname{adaptive\_softmax}(x) = \operatorname{softmax}\bigl(\beta(H(x))\, x\bigr).

The inverse temperature :math:`\beta` comes from a *schedule*. Schedules are
values (frozen dataclasses), not code paths: each backend interprets them.

* :class:`PaperPolynomial` (the default): the published schedule
  :math:`\beta(H) = \max(P(H), 1)` if :math:`H > 0.5`, else :math:`1`, with
  :math:`P(H) = -0.037H^4 + 0.481H^3 - 2.3H^2 + 4.917H - 1.791`.
* :class:`Polynomial`: the same rule with user coefficients and threshold.
* :class:`Constant`: a fixed :math:`\beta`.
* :class:`LogLength`: Scalable-Softmax, :math:`\beta = s \log n_{\mathrm{eff}}`
  where :math:`n_{\mathrm{eff}}` counts the unmasked items of the row.

Decimal parameters are kept as exact decimal strings; the mpmath reference uses
their exact values and float backends use the nearest float.

Special values (every backend, every function):

=================================  ==========================  ==============  =====
input row                          softmax / adaptive          entropy         β
=================================  ==========================  ==============  =====
contains ``-inf`` (some finite)    ``-inf`` entries exactly    of the          from
                                   0, the rest as if absent    unmasked items  that H
all ``-inf`` (fully masked)        all zeros                   0               1
contains NaN or ``+inf``           all NaN                     NaN             NaN
``n = 0``                          empty                       0               1
=================================  ==========================  ==============  =====
"""

from __future__ import annotations

import abc
import enum
import functools
import math
import numbers
from collections.abc import Mapping, Set
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np

from ._formats import NUMPY_DTYPES, ROW_EMPTY, ROW_INVALID, ROW_MASKED, ROW_REGULAR

__all__ = [
    "ENTROPY_THRESHOLD",
    "PAPER_COEFFICIENTS",
    "PAPER_ENTROPY_EPS",
    "Constant",
    "LogLength",
    "PaperPolynomial",
    "Polynomial",
    "RowKind",
    "Schedule",
    "as_logits",
    "attention_layout",
    "check_entropy_eps",
    "check_mask_dtype",
    "classify_rows",
    "exact_float64",
    "exact_value",
    "expand_kv_heads",
    "numpy_array",
    "refuse_dtype",
    "refuse_masked",
    "resolve_schedule",
    "split_mask",
]

#: Coefficients of the paper's polynomial :math:`P(H)`, highest degree first
#: (``numpy.polyval`` order), as exact decimal strings.
PAPER_COEFFICIENTS: tuple[str, ...] = ("-0.037", "0.481", "-2.3", "4.917", "-1.791")

#: The entropy (nats) at or below which the paper's schedule leaves β = 1.
ENTROPY_THRESHOLD: str = "0.5"

#: The numerical guard of the paper's listing, ``H = -sum p log(p + 1e-9)``.
PAPER_ENTROPY_EPS: float = 1e-9

Number = str | float | int | Fraction

_FLOAT_MAX = float(np.finfo(np.float64).max)


def _plain_number(value: Any) -> Any:
    """`value` as a Python number where it is a numpy scalar or a :class:`~decimal.Decimal`.

    numpy integers become ints, numpy floats their exact value (a float, or a
    Fraction for a ``longdouble`` no float holds), finite Decimals their decimal
    string; anything else is returned as it is, for :func:`exact_value` to judge.
    """
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        if not np.isfinite(value):
            return float(value)
        as_float = float(value)
        exact = Fraction(*value.as_integer_ratio())
        return as_float if Fraction(as_float) == exact else exact
    if isinstance(value, Decimal):
        return str(value) if value.is_finite() else float(value)
    return value


#: The largest decimal exponent (of either sign) of a parameter given as text: the float
#: range ends near 1e308 and its subnormals near 1e-324, and reading "1e-9999999" exactly
#: takes seconds (Fraction forms 10**9999999), "1e99999999" minutes.
_MAX_DECIMAL_EXPONENT = 4000


def _check_decimal_exponent(text: str, name: str) -> None:
    """Refuse decimal text whose exponent is beyond :data:`_MAX_DECIMAL_EXPONENT`, at once."""
    try:
        d = Decimal(text.strip().replace("_", ""))
    except ArithmeticError:  # (not a decimal: Fraction's own error follows)
        return
    if d.is_finite() and d != 0 and abs(d.adjusted()) > _MAX_DECIMAL_EXPONENT:
        raise ValueError(
            f"{name}={text[:30]!r}{'...' if len(text) > 30 else ''} has a decimal exponent "
            f"beyond +-{_MAX_DECIMAL_EXPONENT} (the float64 range ends near 1e308, its "
            "subnormals near 1e-324); pass a Fraction for an exact value that small"
        )


def exact_value(value: Number, name: str) -> Fraction:
    """Return the exact rational value of a schedule parameter.

    Parameters
    ----------
    value : str, float, int or Fraction
        A decimal string is read exactly (``"0.1"`` is one tenth); a float is
        taken at its exact binary value. numpy scalars and ``decimal.Decimal``
        values are read as the number they hold.
    name : str
        The parameter's name, used in error messages.

    Returns
    -------
    Fraction
        The exact value.

    Raises
    ------
    TypeError
        If `value` is not a number or a decimal string.
    ValueError
        If `value` is not finite, not a valid decimal, or beyond the float64
        range (float backends need its nearest float).
    """
    value = _plain_number(value)
    if isinstance(value, bool) or not isinstance(value, str | float | int | Fraction):
        raise TypeError(f"{name} must be a decimal string or a real number, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if isinstance(value, str):
        _check_decimal_exponent(value, name)
    try:
        exact = Fraction(value)
    except (ValueError, ZeroDivisionError) as exc:
        raise ValueError(f"{name} must be a finite decimal, got {value!r}") from exc
    try:
        float(exact)  # float backends use the nearest float: it must exist
    except OverflowError:
        raise ValueError(
            f"{name} must lie within the float64 range (|value| <= {_FLOAT_MAX!r}), got {value!r}"
        ) from None
    return exact


class Schedule(abc.ABC):
    """Base class of temperature schedules (values, interpreted by each backend).

    Subclasses define :attr:`needs_entropy` and :meth:`beta_float`. The three built-in
    schedules compare (and hash) by the exact values they compute, not by their text:
    ``Constant("2.0") == Constant(2)``, and ``PaperPolynomial()`` equals
    ``Polynomial(PAPER_COEFFICIENTS)`` (streaming states made with either merge).
    """

    #: Whether β depends on the row's entropy (so the entropy pass is needed).
    needs_entropy: bool = False

    @abc.abstractmethod
    def beta_float(self, entropy: Any, n_eff: Any) -> np.ndarray:
        """Evaluate β in float64 from a row's entropy and unmasked count.

        This is the float semantics that float backends reproduce; NaN entropies
        give NaN and ``n_eff == 0`` gives 1 (the special-value table).

        Parameters
        ----------
        entropy : array_like
            Row entropies :math:`H` in nats.
        n_eff : array_like of int
            Number of unmasked items of each row.

        Returns
        -------
        numpy.ndarray
            float64 values of β, broadcast over the inputs.
        """

    def checked_beta(self, entropy: Any, n_eff: Any) -> np.ndarray:
        r""":meth:`beta_float`, checked: what the float backends call.

        A user's schedule is honoured whatever it computes, but not whatever it returns:
        a negative β made every kernel's output silently uniform (where the softmax of
        :math:`\beta x` is another row), and a list, a Python float or an integer array
        failed deep inside a kernel. A scalar is broadcast over the rows. β = 0 is kept:
        it is the float value of any β below the smallest subnormal (a
        :class:`LogLength` of :math:`s = 10^{-400}`), whose softmax rounds to uniform.

        Returns
        -------
        numpy.ndarray
            float64 β of the rows' shape (that of `entropy` and `n_eff` broadcast), a
            fresh array.

        Raises
        ------
        TypeError
            If :meth:`beta_float` returns something other than real numbers.
        ValueError
            If it returns another shape, or a negative β (NaN is kept: the row is
            invalid).
        """
        shape = np.broadcast(np.asarray(entropy), np.asarray(n_eff)).shape
        raw = self.beta_float(entropy, n_eff)
        where = f"{self!r}.beta_float"
        try:
            arr = np.asarray(raw)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{where} returned {type(raw).__name__}, not an array of β") from exc
        if arr.dtype.kind not in "fiu":
            raise TypeError(f"{where} returned values of dtype {arr.dtype}, not real numbers")
        try:
            beta = np.broadcast_to(arr.astype(np.float64), shape).copy()
        except ValueError:
            raise ValueError(
                f"{where} returned shape {arr.shape} for rows of shape {shape}"
            ) from None
        bad = beta < 0
        if np.any(bad):
            value = float(beta[np.unravel_index(int(np.argmax(bad)), beta.shape)])
            raise ValueError(f"{where} returned beta = {value!r}; beta must be positive")
        return beta


class _ByValue(Schedule):
    """A built-in schedule: equal to, and hashed as, the schedules of the same exact values.

    Subclasses define ``_key`` (:func:`_value_key`) and are dataclasses with ``eq=False``
    (a generated ``__eq__`` and ``__hash__`` would compare the fields' text).
    """

    _key: tuple[tuple, tuple]

    def __eq__(self, other: object) -> Any:
        if not isinstance(other, Schedule):
            return NotImplemented
        key = getattr(other, "_key", None)
        return self is other or (key is not None and self._key[0] == key[0])

    def __hash__(self) -> int:
        return hash(self._key[1])


def _value_key(schedule: Schedule, exact: tuple) -> tuple[tuple, tuple]:
    """``(exact key, float key)`` of a built-in schedule: its kind and `exact` values.

    The exact key decides equality; the hash is that of the float key (equal values give
    equal floats): hashing the Fractions took 3 µs, on every call of a kernel whose
    helpers cache by schedule. A user's subclass, which may compute something else, is
    a kind of its own; PaperPolynomial is a Polynomial.
    """
    kind = Polynomial if type(schedule) is PaperPolynomial else type(schedule)
    floats = tuple(tuple(map(float, v)) if isinstance(v, tuple) else float(v) for v in exact)
    return (kind, *exact), (kind, *floats)


@dataclass(frozen=True, eq=False)
class Polynomial(_ByValue):
    r"""Entropy-driven polynomial schedule.

    .. math::

        \beta(H) = \begin{cases} \max(P(H), 1) & H > \tau \\ 1 & H \le \tau \end{cases},
        \qquad P(H) = \sum_{k=0}^{d} c_k H^{d-k}.

    Parameters
    ----------
    coefficients : sequence of str or float
        :math:`c_0, \dots, c_d`, highest degree first. Decimal strings are exact.
    threshold : str or float, default ``"0.5"``
        :math:`\tau`, in nats.

    Notes
    -----
    The rule is continuous at :math:`\tau` exactly when :math:`P(\tau) \le 1`
    (see :attr:`jumps_at_threshold`); the published polynomial has
    :math:`P(0.5) = 0.1503125`.
    """

    coefficients: tuple[Number, ...]
    threshold: Number = ENTROPY_THRESHOLD

    needs_entropy = True

    def __post_init__(self) -> None:
        raw = self.coefficients
        # (a set or a dict has no order: another polynomial in each process)
        unordered = isinstance(raw, Set | Mapping)
        if isinstance(raw, str | bytes) or unordered or not hasattr(raw, "__iter__"):
            raise TypeError(
                "coefficients must be a sequence of decimal strings or numbers (highest degree "
                f"first), got {raw!r}"
            )
        coefficients = tuple(raw)
        if not coefficients:
            raise ValueError("coefficients must hold at least one value")
        coefficients = tuple(_plain_number(c) for c in coefficients)
        exact = tuple(exact_value(c, f"coefficients[{i}]") for i, c in enumerate(coefficients))
        object.__setattr__(self, "coefficients", coefficients)
        object.__setattr__(self, "threshold", _plain_number(self.threshold))
        # read once, here (their errors at construction): the cached properties' values
        object.__setattr__(self, "exact_coefficients", exact)
        object.__setattr__(self, "exact_threshold", exact_value(self.threshold, "threshold"))

    @functools.cached_property
    def exact_coefficients(self) -> tuple[Fraction, ...]:
        """The coefficients as exact rationals, highest degree first."""
        return tuple(exact_value(c, "coefficient") for c in self.coefficients)

    @functools.cached_property
    def exact_threshold(self) -> Fraction:
        """The threshold as an exact rational."""
        return exact_value(self.threshold, "threshold")

    @functools.cached_property
    def _key(self) -> tuple[tuple, tuple]:
        # the exact coefficients without leading zeros, and the threshold: ("1.0", "2") is
        # ("1", "2.00"), and PaperPolynomial() is Polynomial(PAPER_COEFFICIENTS)
        c = self.exact_coefficients
        lead = next((i for i, v in enumerate(c) if v != 0), len(c) - 1)
        return _value_key(self, (c[lead:], self.exact_threshold))

    def polynomial_exact(self, h: Fraction) -> Fraction:
        """Evaluate :math:`P` exactly at a rational point (Horner)."""
        acc = Fraction(0)
        for c in self.exact_coefficients:
            acc = acc * h + c
        return acc

    @property
    def jumps_at_threshold(self) -> bool:
        r"""Whether β jumps at the threshold, that is :math:`\tau > 0` and :math:`P(\tau) > 1`.

        With :math:`\tau \le 0` nothing is discontinuous: an entropy is never
        negative, and it is 0 only for rows with one unmasked item, whose
        softmax is 1 whatever β is; every other row has :math:`H > 0 \ge \tau`
        and gets :math:`\max(P(H), 1)`, a continuous function of the logits.
        This is the exact entropy's answer; see :meth:`jumps_for` for a guarded one.
        """
        return self.jumps_for(0.0)

    def jumps_for(self, entropy_eps: float) -> bool:
        r"""Whether β jumps at the threshold for entropies of mode `entropy_eps`.

        A guarded entropy :math:`H_\eta = -\sum_i p_i \log(p_i + \eta)`
        can be negative: each :math:`p_i + \eta \le 1 + \eta`, so
        :math:`H_\eta \ge -\log(1 + \eta)`, with equality only for a
        row of one item (whose softmax is 1 whatever β is); every row of two or
        more unmasked items lies strictly above. So β is discontinuous exactly
        when :math:`\tau > -\log(1 + \eta)` and :math:`P(\tau) > 1`.
        The comparison is exact: for a rational :math:`\tau \ne 0`,
        :math:`e^{-\tau}` is irrational and never equals :math:`1 + \eta`.
        With :math:`\eta = 0` this is :attr:`jumps_at_threshold`.

        Parameters
        ----------
        entropy_eps : float
            The entropy mode (``0.0``: exact).

        Examples
        --------
        >>> from softmaxtheory.spec import Polynomial
        >>> jump = Polynomial(("3",), threshold="-0.25")
        >>> jump.jumps_at_threshold, jump.jumps_for(1.0), jump.jumps_for(0.25)
        (False, True, False)

        With :math:`\eta = 1` the floor is :math:`-\log 2 \approx -0.693`, so
        a threshold of -0.8 lies below every guarded entropy:

        >>> Polynomial(("3",), threshold="-0.8").jumps_for(1.0)
        False
        """
        theta, eps = self.exact_threshold, float(entropy_eps)
        above = theta > 0 if not eps else _above_guarded_floor(theta, eps)
        return above and self.polynomial_exact(theta) > 1

    def beta_float(self, entropy: Any, n_eff: Any) -> np.ndarray:  # noqa: D102
        h = np.asarray(entropy, dtype=np.float64)
        coeffs = np.array([float(c) for c in self.exact_coefficients])
        with np.errstate(invalid="ignore", over="ignore"):
            p = np.polyval(coeffs, h)
            beta = np.where(h > float(self.exact_threshold), np.maximum(p, 1.0), 1.0)
        beta = np.where(np.isnan(h), np.nan, beta)
        n = np.asarray(n_eff)
        return np.broadcast_to(np.where(n == 0, 1.0, beta), np.broadcast(h, n).shape).copy()


class PaperPolynomial(Polynomial):
    """The published schedule: :data:`PAPER_COEFFICIENTS` above :data:`ENTROPY_THRESHOLD`.

    Examples
    --------
    >>> from softmaxtheory.spec import PaperPolynomial
    >>> schedule = PaperPolynomial()
    >>> schedule.coefficients
    ('-0.037', '0.481', '-2.3', '4.917', '-1.791')
    >>> float(schedule.polynomial_exact(schedule.exact_threshold))
    0.1503125
    """

    def __init__(self) -> None:
        super().__init__(PAPER_COEFFICIENTS, ENTROPY_THRESHOLD)

    def __repr__(self) -> str:
        return "PaperPolynomial()"


@dataclass(frozen=True, eq=False)
class Constant(_ByValue):
    r"""A fixed inverse temperature :math:`\beta > 0` (``Constant(1)`` is plain softmax).

    Parameters
    ----------
    beta : str or float
        The inverse temperature; a decimal string is exact.
    """

    beta: Number

    needs_entropy = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "beta", _plain_number(self.beta))
        if self.exact_beta <= 0:
            raise ValueError(f"beta must be > 0, got {self.beta!r}")

    @functools.cached_property
    def exact_beta(self) -> Fraction:
        """β as an exact rational."""
        return exact_value(self.beta, "beta")

    @functools.cached_property
    def _key(self) -> tuple[tuple, tuple]:
        return _value_key(self, (self.exact_beta,))

    def beta_float(self, entropy: Any, n_eff: Any) -> np.ndarray:  # noqa: D102
        n = np.asarray(n_eff)
        shape = np.broadcast(np.asarray(entropy), n).shape
        beta = float(self.exact_beta)
        return np.broadcast_to(np.where(n == 0, 1.0, beta), shape).copy()


@dataclass(frozen=True, eq=False)
class LogLength(_ByValue):
    r"""Scalable-Softmax: :math:`\beta = s \log n_{\mathrm{eff}}`.

    :math:`n_{\mathrm{eff}}` is the number of unmasked items in the row.

    Parameters
    ----------
    s : str or float
        The scale :math:`s > 0`.
    """

    s: Number

    needs_entropy = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "s", _plain_number(self.s))
        if self.exact_s <= 0:
            raise ValueError(f"s must be > 0, got {self.s!r}")

    @functools.cached_property
    def exact_s(self) -> Fraction:
        """The scale :math:`s` as an exact rational."""
        return exact_value(self.s, "s")

    @functools.cached_property
    def _key(self) -> tuple[tuple, tuple]:
        return _value_key(self, (self.exact_s,))

    def beta_float(self, entropy: Any, n_eff: Any) -> np.ndarray:  # noqa: D102
        n = np.asarray(n_eff, dtype=np.float64)
        shape = np.broadcast(np.asarray(entropy), n).shape
        # an overflow rounds to inf; n = 0 (log 0 = -inf, and 0 * -inf when s rounds to 0)
        # is replaced by 1 below
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            beta = float(self.exact_s) * np.log(n)
        return np.broadcast_to(np.where(n == 0, 1.0, beta), shape).copy()


def _constructed_eagerly(*classes: type) -> None:
    """Have ``torch.compile`` run the constructors of `classes` as Python, not trace them.

    Dynamo traced a schedule built inside a compiled function (``schedule=Constant(2.0)``
    in the call) and handed the functions that read its exact parameters an object
    whose ``__post_init__`` had not run ("'Constant' object has no attribute 'beta'").
    The attribute set here is the one ``torch.compiler.disable`` sets (checked by
    ``tests/test_torch_robust.py``), without importing torch: Dynamo breaks the graph
    at the construction, runs it, and goes on with the schedule it made.
    """
    for cls in classes:
        for name in ("__init__", "__post_init__"):
            fn = cls.__dict__.get(name)
            if fn is not None:
                fn._torchdynamo_disable = True


_constructed_eagerly(Polynomial, PaperPolynomial, Constant, LogLength)

#: The default schedule, one shared instance (schedules are immutable), made at import:
#: built inside a function traced by ``torch.compile``, its construction was traced too,
#: and Dynamo failed on it (an AttributeError inside Dynamo).
_PAPER_SCHEDULE = PaperPolynomial()


def resolve_schedule(schedule: Schedule | None) -> Schedule:
    """Return `schedule`, or :class:`PaperPolynomial` when it is ``None``.

    Raises
    ------
    TypeError
        If `schedule` is not a :class:`Schedule`.
    """
    if schedule is None:
        return _PAPER_SCHEDULE
    if not isinstance(schedule, Schedule):
        raise TypeError(
            "schedule must be a softmaxtheory.spec.Schedule (PaperPolynomial(), "
            f"Constant(beta), LogLength(s) or Polynomial(...)), got {schedule!r}"
        )
    for base in (Polynomial, Constant, LogLength):
        if isinstance(schedule, base) and type(schedule).beta_float is not base.beta_float:
            # the backends evaluate a built-in schedule from its exact parameters (the
            # kernels inside, the reference exactly): an override was honoured by some
            # paths and not others, so adaptive_softmax(x) != softmax(beta(x) * x)
            raise TypeError(
                f"schedule {type(schedule).__name__} overrides {base.__name__}.beta_float, "
                f"which the backends do not call for a {base.__name__} (they evaluate its "
                "exact parameters): a schedule of your own subclasses "
                "softmaxtheory.spec.Schedule (its beta_float may call "
                f"{base.__name__}'s)"
            )
    return schedule


def check_entropy_eps(entropy_eps: float) -> float:
    r"""Validate the entropy mode: ``0.0`` (exact) or a guard ``eps > 0``.

    With ``eps > 0`` the entropy is :math:`-\sum_i p_i \log(p_i + \eta)`,
    the paper's listing uses ``1e-9`` (:data:`PAPER_ENTROPY_EPS`).

    Raises
    ------
    TypeError
        If `entropy_eps` is not a real number.
    ValueError
        If it is negative, NaN or infinite.
    """
    numeric = int | float | np.integer | np.floating  # (np.int64(1) as the int 1 is taken)
    if isinstance(entropy_eps, bool | np.bool_) or not isinstance(entropy_eps, numeric):
        raise TypeError(f"entropy_eps must be a float, got {entropy_eps!r}")
    eps = float(entropy_eps)
    # (eps - eps == 0 is isfinite(eps); it also holds for the symbolic float that
    # torch.compile(dynamic=True) passes, where math.isfinite stopped the trace)
    if not eps - eps == 0.0 or eps < 0:
        raise ValueError(f"entropy_eps must be finite and >= 0, got {entropy_eps!r}")
    return eps


_FLOAT_KINDS = tuple(np.dtype(name).type for name in NUMPY_DTYPES)


def refuse_masked(x: Any, name: str, role: str = "logits") -> None:
    """Refuse a ``numpy.ma.MaskedArray`` with masked entries.

    ``numpy.asarray`` drops a masked array's mask, so the masked entries would be
    read as if they were not masked: a wrong number, silently. A masked array
    whose mask is all False passes (its data are the values).

    Parameters
    ----------
    x : object
        The argument.
    name : str
        Its name, for the message.
    role : {"logits", "mask", "operand", "result"}, default "logits"
        What `x` is, which decides the remedy the message names: logits are
        filled with ``-inf`` (removed, theorem T8); an attention mask with
        False or ``-inf``; attention operands with the values they hold; a
        kernel's result is checked entry by entry, so a plain array is asked
        for.

    Raises
    ------
    TypeError
        If `x` is a masked array with at least one masked entry.
    """
    if not (isinstance(x, np.ma.MaskedArray) and np.ma.is_masked(x)):
        return
    remedy = {
        "logits": f"pass {name}.filled(-np.inf) to remove them (a -inf logit takes no part, "
        f"theorem T8), or {name}.data to keep them",
        "mask": f"pass {name}.filled(False) for a boolean mask (masked entries take no part) "
        f"or {name}.filled(-np.inf) for an additive one",
        "operand": f"pass {name}.filled(value) with the values the entries hold, and exclude "
        "keys with the attention mask",
        "result": "every entry of a result is checked: pass a plain array (a masked entry "
        "has no value to check)",
    }[role]
    raise TypeError(
        f"{name} is a masked array with masked entries, which would be read as if unmasked; "
        + remedy
    )


def _rounded_integer(name: str, value: int, convert: str) -> ValueError:
    """The error for an integer `value` of `name` that float64 does not hold."""
    return ValueError(
        f"{name} holds the integer {value}, which float64 cannot hold exactly (beyond "
        f"2**53): the answer would be for another input; convert it ({convert}) to accept "
        "the nearest floats"
    )


def exact_float64(arr: np.ndarray, name: str) -> np.ndarray:
    """An integer array as float64, refused where float64 does not hold a value.

    Rounded, ``[2**53 + 1, 2**53]`` became ``[2**53, 2**53]``: softmax 0.5 each,
    for a row whose coefficients are 0.731 and 0.269. The reference, the CPU kernels,
    the streaming softmax, dask and the torch functions all refuse such input.

    Raises
    ------
    ValueError
        For an integer of magnitude above :math:`2^{53}` that float64 does not hold.
    """
    out = arr.astype(np.float64)
    if arr.dtype.itemsize >= 8:
        limit = 2.0**63 if arr.dtype.kind == "i" else 2.0**64
        fits = (out < limit) & (out >= -limit)
        bad = ~fits | (np.where(fits, out, 0.0).astype(arr.dtype) != arr)
        if np.any(bad):
            value = int(arr[np.unravel_index(int(np.argmax(bad)), arr.shape)])
            raise _rounded_integer(name, value, f"{name}.astype(numpy.float64)")
    return out


def _refuse_rounded_list_ints(x: list | tuple, name: str) -> None:
    """Refuse a Python int float64 does not hold in a (nested) list that also holds floats.

    ``numpy.asarray([2**53 + 1, 2.0**53])`` is a float64 array, rounded before any check
    sees it: softmax 0.5 each where the row's are 0.731 and 0.269 (all-int lists are
    refused by :func:`exact_float64`).
    """
    stack = [x]
    while stack:
        for v in stack.pop():
            if isinstance(v, list | tuple):
                stack.append(v)
            elif isinstance(v, int) and not isinstance(v, bool) and int(float(v)) != v:
                raise _rounded_integer(name, v, f"float({v})")


def numpy_array(x: Any, name: str) -> np.ndarray:
    """``numpy.asarray(x)``, with a :class:`TypeError` naming `name` for a bfloat16 tensor.

    numpy has no bfloat16, and torch's own refusal ("Got unsupported ScalarType
    BFloat16") names neither the argument nor the way out: ``x.float()``, which
    holds every bfloat16 value exactly.
    """
    try:
        return np.asarray(x)
    except TypeError as exc:
        if "BFloat16" not in str(exc):
            raise
        raise TypeError(
            f"{name} is a bfloat16 tensor, which numpy cannot hold: pass {name}.float() "
            "(exact for every bfloat16 value)"
        ) from exc


def refuse_dtype(name: str, dtype: Any, container: str = "array") -> TypeError:
    """The :class:`TypeError` for an operand whose dtype has no format here.

    It names the dtypes that are taken (float16, float32, float64 and integers,
    and bfloat16 in a tensor), so that a floating dtype outside them (numpy's
    ``longdouble``, torch's float8 formats) is not told that it is not floating,
    and it says how such a float gets in: converted (``longdouble`` rounded to
    float64; a float8 tensor's values are all float32 values).

    Parameters
    ----------
    name : str
        The argument's name, as the caller knows it.
    dtype : numpy.dtype or torch.dtype
        The refused dtype.
    container : {"array", "tensor"}
        A numpy array (`dtype` a numpy dtype) or a torch tensor (a torch dtype).

    Returns
    -------
    TypeError
        To be raised by the caller.
    """
    tensor = container == "tensor"
    floats = "float16, bfloat16, float32, float64" if tensor else "float16, float32, float64"
    msg = f"{name} must be a real floating ({floats}) or integer {container}, got dtype {dtype}"
    if tensor and dtype.is_floating_point:
        msg += f" (convert it: {name}.float())"
    elif not tensor and np.dtype(dtype).kind == "f":
        msg += f" (convert it: {name}.astype(numpy.float64) rounds it to float64)"
    return TypeError(msg)


def as_logits(x: Any, name: str = "x", *, exact: bool = False) -> np.ndarray:
    """Validate and convert logits to a floating array with a last axis.

    Integer input is promoted to float64 (with `exact`, which every backend
    passes, an integer that float64 does not hold is refused); float16, float32 and
    float64 are kept, in the machine's byte order (a big-endian array is converted,
    exactly). Anything else (bool, complex, object, strings, 0-d) is refused.

    Parameters
    ----------
    x : array_like
        Logits of shape ``(..., n)``.
    name : str
        The argument's name, for error messages.
    exact : bool, default False
        Refuse integers that float64 does not hold (:func:`exact_float64`)
        instead of rounding them: for the certified reference, which uses
        its inputs' exact values.

    Returns
    -------
    numpy.ndarray
        The logits, float16/32/64.

    Raises
    ------
    TypeError
        For a dtype that is not real floating or integer, or a masked array
        with masked entries (:func:`refuse_masked`).
    ValueError
        For a 0-d input (there is no axis to normalise along), or with `exact`
        an integer beyond :math:`2^{53}` that float64 does not hold.
    """
    refuse_masked(x, name)
    try:
        arr = numpy_array(x, name)
    except ValueError as exc:  # ragged nested sequences
        raise ValueError(f"{name} must be a rectangular array of shape (..., n): {exc}") from exc
    if exact and arr.dtype.kind == "f" and isinstance(x, list | tuple):
        _refuse_rounded_list_ints(x, name)  # (numpy rounded them, mixed with floats)
    if arr.dtype.kind in "iu":
        arr = exact_float64(arr, name) if exact else arr.astype(np.float64)
    elif arr.dtype.type not in _FLOAT_KINDS:
        raise refuse_dtype(name, arr.dtype)
    if not arr.dtype.isnative:  # a big-endian file, say: the same values in native order
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if arr.ndim == 0:
        raise ValueError(f"{name} must have at least one axis (shape (..., n)), got a 0-d array")
    return arr


class RowKind(enum.IntEnum):
    """Which row of the special-value table a row falls in."""

    REGULAR = ROW_REGULAR  #: finite values, possibly some ``-inf`` (masked) ones
    EMPTY = ROW_EMPTY  #: ``n = 0``
    MASKED = ROW_MASKED  #: every entry is ``-inf``
    INVALID = ROW_INVALID  #: contains NaN or ``+inf``


def classify_rows(x: np.ndarray) -> np.ndarray:
    """Classify each row of `x` (last axis) by the special-value table.

    Parameters
    ----------
    x : numpy.ndarray
        Floating logits of shape ``(..., n)``.

    Returns
    -------
    numpy.ndarray
        Integer array of :class:`RowKind` values, shape ``x.shape[:-1]``.
    """
    kinds = np.full(x.shape[:-1], RowKind.REGULAR, dtype=np.int8)
    if x.shape[-1] == 0:
        kinds[...] = RowKind.EMPTY
        return kinds
    invalid = np.any(np.isnan(x) | (x == np.inf), axis=-1)
    masked = np.all(x == -np.inf, axis=-1)
    kinds[masked] = RowKind.MASKED
    kinds[invalid] = RowKind.INVALID
    return kinds


def check_mask_dtype(dtype: Any, name: str = "mask") -> None:
    """Refuse a mask dtype (numpy's or torch's) that is neither boolean nor floating.

    An integer mask is ambiguous (a 0/1 keep mask, or a term added to the
    logits?), so every backend and :mod:`softmaxtheory.testing` refuse it alike.

    Raises
    ------
    TypeError
        For an integer, complex or other non-floating, non-boolean dtype.
    """
    if hasattr(dtype, "is_floating_point"):  # a torch dtype
        ok = str(dtype) == "torch.bool" or dtype.is_floating_point
        integer = not ok and not dtype.is_complex
    else:
        dtype = np.dtype(dtype)
        ok, integer = dtype.kind in "bf", dtype.kind in "iu"
    if not ok:
        hint = (
            " (an integer mask is ambiguous: use a boolean keep mask or a floating additive one)"
            if integer
            else ""
        )
        raise TypeError(f"{name} must be boolean or floating, got dtype {dtype}{hint}")


def split_mask(
    mask: Any, lead: tuple[int, ...], L: int, S: int, name: str = "mask"
) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    r"""Split an attention mask into a keep mask and an additive term (the SDPA conventions).

    A boolean mask keeps the ``True`` entries (``False`` acts as :math:`-\infty`);
    a floating mask is added to the logits. An integer mask is refused, as
    ``torch.nn.functional.scaled_dot_product_attention`` refuses it: it is
    ambiguous (a 0/1 keep mask or an additive term?), so every backend raises
    the same :class:`TypeError`.

    Parameters
    ----------
    mask : array_like
        Broadcastable to ``(*lead, L, S)``.
    lead : tuple of int
        The batch dimensions of the queries and keys.
    L, S : int
        Numbers of queries and keys.
    name : str, default ``"mask"``
        The argument's name, for error messages.

    Returns
    -------
    keep : numpy.ndarray of bool
        ``True`` where a logit is kept (all ``True`` for an additive mask).
    add : numpy.ndarray of float64
        The additive term (zeros for a boolean mask).
    lead : tuple of int
        The batch dimensions after broadcasting with the mask.

    Raises
    ------
    ValueError
        If the mask does not broadcast.
    TypeError
        If the mask is neither boolean nor floating (integer masks included),
        or a masked array with masked entries.
    """
    refuse_masked(mask, name, "mask")
    marr = numpy_array(mask, name)
    check_mask_dtype(marr.dtype, name)
    shape = (*lead, L, S)
    try:
        target = np.broadcast_shapes(marr.shape, shape)
    except ValueError as exc:
        raise ValueError(f"{name} of shape {marr.shape} does not broadcast to {shape}") from exc
    if target[-2:] != (L, S):  # e.g. a (1, 3) mask with L = 0, S = 1 broadcasts to (0, 3)
        raise ValueError(f"{name} of shape {marr.shape} does not broadcast to {shape}")
    if marr.dtype == bool:
        return marr, np.zeros((1, 1)), target[:-2]
    return np.ones((1, 1), dtype=bool), marr.astype(np.float64), target[:-2]


def attention_layout(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: Any
) -> tuple[tuple[int, ...], int, int, float]:
    r"""Check the shapes of attention inputs and resolve the logit scale.

    Parameters
    ----------
    q, k, v : numpy.ndarray
        Shapes ``(..., L, d)``, ``(..., S, d)``, ``(..., S, dv)``; the leading
        dimensions broadcast.
    scale : float or None
        The logit scale; ``None`` gives :math:`1/\sqrt{d}` (1 when :math:`d = 0`).

    Returns
    -------
    lead : tuple of int
        The broadcast leading dimensions.
    L, S : int
        Numbers of queries and keys.
    scale : float
        The resolved scale.

    Raises
    ------
    ValueError
        For mismatched feature sizes or key lengths, leading dimensions that do
        not broadcast, or a non-finite scale.
    TypeError
        For a scale that is not a real number.
    """
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share the feature size, got {q.shape} and {k.shape}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must share the key length, got {k.shape} and {v.shape}")
    d = q.shape[-1]
    if scale is None:
        scale = 1.0 / math.sqrt(d) if d else 1.0
    elif isinstance(scale, bool | np.bool_) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a float, got {scale!r}")
    scale = float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale!r}")
    try:
        lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except ValueError as exc:
        raise ValueError(f"q, k, v leading dimensions do not broadcast: {exc}") from exc
    return lead, q.shape[-2], k.shape[-2], scale


def expand_kv_heads(q: Any, k: Any, v: Any) -> tuple[Any, Any]:
    r"""Grouped-query attention's keys and values, one head per query head.

    With ``enable_gqa=True`` (``torch.nn.functional.scaled_dot_product_attention``'s
    convention) `q` has :math:`H_q` heads on axis -3 and `k`, `v` have :math:`H_k`
    and :math:`H_v` heads, each dividing :math:`H_q`; query head :math:`h` reads key
    head :math:`\lfloor h / (H_q / H_k) \rfloor` and value head
    :math:`\lfloor h / (H_q / H_v) \rfloor`. This repeats each key and value head
    in place (numpy's ``repeat``, torch's ``repeat_interleave``), so that plain
    broadcasting then gives that pairing.

    Parameters
    ----------
    q, k, v : numpy.ndarray
        Shapes ``(..., Hq, L, d)``, ``(..., Hk, S, d)``, ``(..., Hv, S, dv)``.

    Returns
    -------
    k, v : numpy.ndarray
        Shapes ``(..., Hq, S, d)`` and ``(..., Hq, S, dv)``.

    Raises
    ------
    ValueError
        When an operand has no head axis (fewer than 3 dimensions) or a head count
        that does not divide :math:`H_q`.

    Examples
    --------
    >>> import numpy as np
    >>> from softmaxtheory.spec import expand_kv_heads
    >>> q, k = np.zeros((4, 1, 2)), np.arange(2.0).reshape(2, 1, 1) * np.ones((2, 1, 2))
    >>> k2, v2 = expand_kv_heads(q, k, k)
    >>> k2[:, 0, 0].tolist()
    [0.0, 0.0, 1.0, 1.0]
    """
    if min(np.ndim(q), np.ndim(k), np.ndim(v)) < 3:
        raise ValueError(
            "enable_gqa needs a head axis (-3) on q, k and v, got shapes "
            f"{np.shape(q)}, {np.shape(k)}, {np.shape(v)}"
        )
    hq = np.shape(q)[-3]
    out = []
    for name, a in (("k", k), ("v", v)):
        h = np.shape(a)[-3]
        if h == 0 or hq % h:
            raise ValueError(
                f"enable_gqa: the number of query heads ({hq}) must be a multiple of {name}'s ({h})"
            )
        out.append(np.repeat(a, hq // h, axis=-3))
    return out[0], out[1]


def _above_guarded_floor(theta: Fraction, eps: float) -> bool:
    r"""Whether :math:`\tau > -\log(1 + \eta)`, exactly (:math:`\eta > 0`)."""
    if theta >= 0:
        return True
    if theta <= -Fraction(eps):  # -eps < -log(1 + eps)
        return False
    from softmaxtheory._certify.interval import iv_exp, iv_fraction, to_fraction

    # theta in (-eps, 0): compare e^(-theta) with 1 + eps in intervals until they separate,
    # which they do (e^(-theta) is irrational for a rational theta != 0); iv_exp widens
    # mpmath's exponential, whose outward rounding is of its own approximation
    one_eps = Fraction(1) + Fraction(eps)
    prec = 64
    while True:
        lo, hi = (to_fraction(end) for end in iv_exp(iv_fraction(-theta, prec), prec))
        if hi < one_eps:
            return True
        if lo > one_eps:
            return False
        prec *= 2
