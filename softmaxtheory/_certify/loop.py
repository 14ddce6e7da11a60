r"""Ziv's strategy, once: raise the working precision until the result is decided.

Every certified number in the project (the bounds' interval enclosures, the
reference's error balls) is obtained the same way. An *attempt* at working
precision :math:`p` returns the result when its enclosure of the exact value
decides it (both ends round to the same float, or the same decimal string, or
the same integer), and ``None`` otherwise; the loop then tries again at
:math:`2p`, up to a cap. Rounding is monotone, so a decided enclosure gives the
correctly rounded value of the exact one.

When the cap is reached, :class:`CertificationError` says so: the one exception
of the certified code, as mpmath has its one ``NoConvergence``.
:class:`softmaxtheory.reference.PrecisionError` is its subclass raised by the
reference.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

from .environment import default_float_environment

__all__ = ["CertificationError", "certify", "precisions"]

T = TypeVar("T")


class CertificationError(ArithmeticError):
    """A value could not be certified below the precision cap of its Ziv loop."""


def precisions(start: int, cap: int) -> Iterator[int]:
    """Working precisions of Ziv's loop: `start`, doubling, ending at `cap`.

    Parameters
    ----------
    start : int
        The first precision, in bits (positive).
    cap : int
        The last precision, in bits; it is tried even when it is not `start`
        times a power of two. A `start` above `cap` tries `cap` only.

    Raises
    ------
    ValueError
        If `start` or `cap` is not a positive int.

    Examples
    --------
    >>> list(precisions(100, 960))
    [100, 200, 400, 800, 960]
    """
    for name, value in (("start", start), ("cap", cap)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    p = start
    while p < cap:
        yield p
        p *= 2
    yield cap


def certify(
    attempt: Callable[[int], T | None],
    *,
    start: int,
    cap: int,
    what: str = "a value",
    why: str = "",
    error: type[CertificationError] = CertificationError,
) -> T:
    """Ziv's loop: call ``attempt(p)`` for each of :func:`precisions` until it decides.

    Parameters
    ----------
    attempt : callable
        ``attempt(p)`` returns the result decided at working precision ``p``,
        or ``None`` when its enclosure straddles a rounding boundary. It may
        keep state between calls (a closure), for example to drop nothing once
        a first attempt proved that the dropped mass matters.
    start, cap : int
        First and last working precision, in bits.
    what : str, default "a value"
        What is certified, for the error message.
    why : str, default ""
        A likely reason for a failure, appended to the message.
    error : type, default CertificationError
        The exception raised at the cap: :class:`CertificationError` or a
        subclass (the reference raises its ``PrecisionError``).

    Returns
    -------
    object
        The first result that is not ``None``.

    Raises
    ------
    CertificationError
        If no attempt up to `cap` bits decides (an instance of `error`).
    FloatEnvironmentError
        If the thread is not in IEEE's default floating-point environment and it
        cannot be set (:mod:`~softmaxtheory._certify.environment`).
    """
    with default_float_environment(what):  # (the attempts run in it; the caller's is kept)
        for p in precisions(start, cap):
            result = attempt(p)
            if result is not None:
                return result
    raise error(f"could not certify {what} within {cap} bits" + (f": {why}" if why else ""))
