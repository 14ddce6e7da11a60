r"""The floating-point environment the certified code needs: gradual underflow.

Every certified float the project returns is rounded once from an exact value,
subnormals included (:func:`~softmaxtheory._certify.rounding.round_exact`), and
the reference's double-double pass (:mod:`softmaxtheory.reference._fast`) carries
error terms far below the smallest normal number. Both assume IEEE 754 gradual
underflow. A process can switch it off for every thread's later arithmetic:
the x86 MXCSR bits FTZ (a subnormal *result* becomes 0) and DAZ (a subnormal
*operand* is read as 0), or AArch64's FPCR.FZ. ``torch.set_flush_denormal(True)``
sets them, and so does loading a shared library linked with ``-ffast-math``.
Then ``math.ldexp(1.0, -1070)`` is 0.0: a certified subnormal would come back as
0.0, and the double-double error terms would vanish, so a rounding decision
could rest on a wrong enclosure.

:func:`flushes_subnormals` asks the hardware (one addition of two subnormals,
about 0.1 µs); :func:`require_gradual_underflow` raises
:class:`FloatEnvironmentError` where it flushes. Every certification checks it
before it starts: the Ziv loop (:func:`~softmaxtheory._certify.loop.certify`),
which the bounds and the reference's mpmath engine share, and the reference's
entry points (whose fast pass runs before any loop).
"""

from __future__ import annotations

import functools
import struct
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

__all__ = [
    "FloatEnvironmentError",
    "certifying",
    "flushes_subnormals",
    "require_gradual_underflow",
    "restore_gradual_underflow",
]

F = TypeVar("F", bound=Callable[..., Any])

#: :math:`2^{-1074}`, the least float64 subnormal, made from its bits (no arithmetic, which
#: DAZ would read as 0).
_LEAST_SUBNORMAL: float = struct.unpack("<d", struct.pack("<Q", 1))[0]


class FloatEnvironmentError(RuntimeError):
    """The process flushes subnormal numbers to zero, so nothing can be certified.

    Not an :class:`ArithmeticError`: no handler that falls back from an undecided
    rounding (``CertificationError``, ``PrecisionError``) may catch
    it, since no fallback is correct in this environment.
    """


def flushes_subnormals() -> bool:
    """Whether this thread's arithmetic flushes subnormals to zero (FTZ or DAZ).

    :math:`2^{-1074} + 2^{-1074} = 2^{-1073}` exactly under gradual underflow;
    FTZ flushes that subnormal sum to 0, DAZ reads each operand as 0.

    Examples
    --------
    >>> flushes_subnormals()
    False
    """
    # (a module global: CPython folds no constant expression that reads one)
    return _LEAST_SUBNORMAL + _LEAST_SUBNORMAL == 0.0


def restore_gradual_underflow() -> bool:
    """Switch FTZ/DAZ off through torch, if torch is loaded; whether subnormals work now.

    Python and numpy have no call that sets the modes; ``torch.set_flush_denormal``
    does (on x86 with SSE3). Nothing is imported here: without torch loaded, the
    modes stay as they are.
    """
    torch = sys.modules.get("torch")
    if flushes_subnormals() and torch is not None:
        torch.set_flush_denormal(False)
    return not flushes_subnormals()


def require_gradual_underflow(what: str) -> None:
    """Raise :class:`FloatEnvironmentError` if subnormals are flushed to zero.

    Parameters
    ----------
    what : str
        What cannot be certified, for the message ("the reference", "a bound").

    Raises
    ------
    FloatEnvironmentError
        If :func:`flushes_subnormals`.
    """
    if flushes_subnormals():
        raise FloatEnvironmentError(
            f"{what} cannot be certified: this process flushes subnormal numbers to zero "
            "(the FTZ/DAZ floating-point modes), so a subnormal result would be returned as "
            "0.0 and the error analysis does not hold. Something switched them on: "
            "torch.set_flush_denormal(True) (undo it with torch.set_flush_denormal(False)), "
            "or a shared library built with -ffast-math, loaded into this process"
        )


def certifying(what: str) -> Callable[[F], F]:
    """Decorate an entry point of certified code: the environment it needs, checked and set.

    The call first requires gradual underflow (:func:`require_gradual_underflow`),
    then runs with numpy's floating-point error handling off
    (``np.errstate(all="ignore")``): the certified code bounds its float
    intermediates itself and treats an overflow, an underflow or a NaN as an
    undecided attempt, so a caller's ``np.seterr(all="raise")`` (a common
    debugging setting) must not turn the gradual underflow of a subnormal
    logit into a ``FloatingPointError``, as it did.
    """

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            require_gradual_underflow(what)
            with np.errstate(all="ignore"):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate
