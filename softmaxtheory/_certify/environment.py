r"""The floating-point environment the certified code needs: IEEE 754's defaults.

Every certified float the project returns is rounded once from an exact value,
subnormals included (:func:`~softmaxtheory._certify.rounding.round_exact`), and
the reference's double-double pass (:mod:`softmaxtheory.reference._fast`) carries
error terms far below the smallest normal number and assumes rounding to nearest.
A thread can leave those defaults:

* the x86 MXCSR bits FTZ (a subnormal *result* becomes 0) and DAZ (a subnormal
  *operand* is read as 0), or AArch64's FPCR.FZ: ``torch.set_flush_denormal(True)``
  sets them, and so does loading a shared library linked with ``-ffast-math``.
  Then ``math.ldexp(1.0, -1070)`` is 0.0: the reference returned
  ``softmax([0, -740])`` as ``[1, 0]``;
* a directed rounding mode (``fesetround``, from a C extension or ``ctypes``),
  under which the double-double error-free transformations are not error-free.

:func:`ieee_defaults` asks the hardware (a few additions, about 0.2 µs). Every
certification runs inside :func:`default_float_environment`: where the thread
is already at the defaults it does nothing; otherwise, on Linux (glibc or musl,
x86-64 or AArch64), it saves the thread's environment with ``fegetenv``, sets
the default one (``fesetenv(FE_DFL_ENV)``: gradual underflow, rounding to
nearest) for the certified code and restores the caller's afterwards, so the
caller's own arithmetic keeps its modes. Where that cannot be done it raises
:class:`FloatEnvironmentError`. Entry points: the Ziv loop
(:func:`~softmaxtheory._certify.loop.certify`) and :func:`certifying`, which
decorates the reference's, the bounds' and the certified dask blocks' public
functions. The CPU and dask backends are not certified, but their error model
assumes the same environment and their bits must not depend on the thread that
computes a row: their entry points go through :func:`ieee_kernels`.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import platform
import struct
import sys
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import numpy as np

__all__ = [
    "FloatEnvironmentError",
    "certifying",
    "default_float_environment",
    "flushes_subnormals",
    "ieee_defaults",
    "ieee_kernels",
    "restore_gradual_underflow",
    "restore_rounding_to_nearest",
    "rounds_to_nearest",
]

F = TypeVar("F", bound=Callable[..., Any])

#: :math:`2^{-1074}`, the least float64 subnormal, made from its bits (no arithmetic, which
#: DAZ would read as 0).
_LEAST_SUBNORMAL: float = struct.unpack("<d", struct.pack("<Q", 1))[0]

#: Probes of the rounding mode (module globals: CPython folds no expression that reads
#: one): 1 + 2**-60 rounds to 1 only downward, to zero or to nearest; 1 + (2**-53 + 2**-60),
#: above half an ulp, rounds up only upward or to nearest. Written in hexadecimal, which is
#: read exactly in any rounding mode: as ``1.0 + 2.0**-52`` the module compiled while the
#: CPU rounded upward (and its cached bytecode after) held 1 + 2**-51 (``2.0**-52`` came
#: out a little above), and every certified call then raised FloatEnvironmentError.
_ONE = float.fromhex("0x1p+0")
_BELOW_HALF = float.fromhex("0x1p-60")
_ABOVE_HALF = float.fromhex("0x1.02p-53")
_ONE_UP = float.fromhex("0x1.0000000000001p+0")


class FloatEnvironmentError(RuntimeError):
    """The thread's floating-point environment is not IEEE's default, and cannot be set.

    Not an :class:`ArithmeticError`: no handler that falls back from an undecided
    rounding (``CertificationError``, ``PrecisionError``) may catch it, since no
    fallback is correct in this environment.
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
    return _LEAST_SUBNORMAL + _LEAST_SUBNORMAL == 0.0


def rounds_to_nearest() -> bool:
    """Whether this thread rounds to nearest (not upward, downward or toward zero).

    Examples
    --------
    >>> rounds_to_nearest()
    True
    """
    return _ONE + _BELOW_HALF == _ONE and _ONE + _ABOVE_HALF == _ONE_UP


def ieee_defaults() -> bool:
    """Whether this thread has gradual underflow and rounds to nearest."""
    return rounds_to_nearest() and not flushes_subnormals()


def restore_rounding_to_nearest() -> bool:
    """Set rounding to nearest (``fesetround``, Linux x86-64 and AArch64); whether it rounds so.

    Python and numpy have no call that sets the rounding mode; elsewhere it stays as it is.
    """
    if not rounds_to_nearest() and _fenv() is not None:
        libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
        libm.fesetround(0)  # FE_TONEAREST on both
    return rounds_to_nearest()


@functools.cache
def _fenv() -> Any:
    """The ``fegetenv`` and ``fesetenv`` of libm, where ``FE_DFL_ENV`` is ``(fenv_t *) -1``.

    That is glibc's and musl's definition on x86-64 and AArch64 (other ABIs name a
    symbol instead); ``fenv_t`` is 28 or 32 bytes there, and 8 on AArch64.
    """
    machine = platform.machine().lower()
    if not sys.platform.startswith("linux") or machine not in ("x86_64", "amd64", "aarch64"):
        return None
    try:
        libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
        get, put = libm.fegetenv, libm.fesetenv
    except (OSError, AttributeError):  # pragma: no cover - a Linux without libm
        return None
    get.argtypes = put.argtypes = [ctypes.c_void_p]
    get.restype = put.restype = ctypes.c_int
    return get, put


#: glibc's and musl's ``FE_DFL_ENV`` on x86-64 and AArch64.
_FE_DFL_ENV = ctypes.c_void_p(-1)


def _cannot(what: str, consequence: str = "cannot be certified") -> FloatEnvironmentError:
    return FloatEnvironmentError(
        f"{what} {consequence}: this thread flushes subnormal numbers to zero (the "
        "FTZ/DAZ floating-point modes) or rounds in a directed mode, and the default "
        "environment could not be set here (that needs Linux on x86-64 or AArch64). "
        "Something switched them on: torch.set_flush_denormal(True) (undo it with "
        "torch.set_flush_denormal(False)), a shared library built with -ffast-math loaded "
        "into this process, or fesetround"
    )


@contextlib.contextmanager
def default_float_environment(
    what: str, consequence: str = "cannot be certified"
) -> Iterator[None]:
    """Run the block in IEEE's default floating-point environment; restore the caller's.

    Nothing is done where the thread is at the defaults already (the common case:
    one probe). Otherwise the thread's environment is saved (``fegetenv``), the
    default set (``fesetenv(FE_DFL_ENV)``) and, after the block, the saved one
    restored, exceptions included.

    Raises
    ------
    FloatEnvironmentError
        If the environment is not the default and cannot be set (see :func:`_fenv`);
        its message says that `what` then `consequence`.
    """
    if ieee_defaults():
        yield
        return
    fenv = _fenv()
    if fenv is None:
        raise _cannot(what, consequence)
    get, put = fenv
    saved = ctypes.create_string_buffer(256)  # fenv_t is at most 32 bytes here
    if get(saved) != 0:  # pragma: no cover - fegetenv does not fail on these ABIs
        raise _cannot(what, consequence)
    if put(_FE_DFL_ENV) != 0 or not ieee_defaults():  # pragma: no cover - as above
        put(saved)
        raise _cannot(what, consequence)
    try:
        yield
    finally:
        put(saved)


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


def certifying(what: str) -> Callable[[F], F]:
    """Decorate an entry point of certified code: the environment it needs, set for the call.

    The call runs in :func:`default_float_environment` and with numpy's
    floating-point error handling off (``np.errstate(all="ignore")``): the
    certified code bounds its float intermediates itself and treats an
    overflow, an underflow or a NaN as an undecided attempt, so a caller's
    ``np.seterr(all="raise")`` (a common debugging setting) must not turn the
    gradual underflow of a subnormal logit into a ``FloatingPointError``, as it
    did.
    """

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with default_float_environment(what), np.errstate(all="ignore"):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


def ieee_kernels(what: str) -> Callable[[F], F]:
    """Decorate an entry point of the CPU kernels: the call runs in IEEE's default environment.

    The kernels are not certified, but their error model assumes gradual underflow
    and rounding to nearest, and their bits must not depend on the thread count.
    A caller's flush-to-zero mode holds in its own thread only: Numba's worker
    threads keep the environment of the thread that started them, so under
    ``torch.set_flush_denormal(True)`` the rows the calling thread computed lost
    their subnormal coefficients and the workers' rows kept theirs (half of 256
    rows differed from the default environment's on two threads). Unlike
    :func:`certifying`, numpy's error state is the caller's.
    """

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if ieee_defaults():  # the common case: one probe, no context manager
                return fn(*args, **kwargs)
            with default_float_environment(what, "would depend on the thread that runs them"):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate
