r"""The project's vocabulary, defined once (private; standard library and numpy only).

Every module that names a dtype, a floating-point format, a kind of kernel, a
framework, a special-value row or a theorem imports it from here:

* :data:`DTYPES`, :data:`FRAMEWORKS`, :data:`KINDS` (with the literal types
  :data:`DType`, :data:`Framework`, :data:`Kind`) and :data:`QUANTITIES`, the
  readings the reference certifies;
* :class:`Format`, one record per binary format (float64, float32, float16 and
  bfloat16) in :data:`FORMATS`, with :func:`format_named` to look one up from a
  numpy or torch spelling (the class is named :class:`BinaryFormat`, its public
  name as ``softmaxtheory.reference.BinaryFormat``; ``Format`` is the same class);
* :func:`default_dtype`, the dtype a kernel is checked in when none is given;
* the row codes of the special-value table (:data:`ROW_REGULAR` …), as plain
  integers so that Numba kernels can read them as compile-time constants
  (:class:`softmaxtheory.spec.RowKind` is the public enum over the same codes);
* :data:`THEOREMS`, the theorem labels that tests and the docs link.

A format with :math:`p` significand bits (hidden bit included), smallest normal
exponent :math:`e_{\min}` and largest exponent :math:`e_{\max}` has unit roundoff
:math:`u = 2^{-p}`, smallest normal :math:`2^{e_{\min}}`, smallest subnormal
:math:`2^{q_{\min}}` with :math:`q_{\min} = e_{\min} - p + 1`, and largest finite
value :math:`(2 - 2^{1-p})\,2^{e_{\max}}`.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

__all__ = [
    "DTYPES",
    "FORMATS",
    "FRAMEWORKS",
    "KINDS",
    "NUMPY_DTYPES",
    "QUANTITIES",
    "ROWWISE_KINDS",
    "ROW_EMPTY",
    "ROW_INVALID",
    "ROW_MASKED",
    "ROW_REGULAR",
    "THEOREMS",
    "WORKING_DTYPES",
    "BinaryFormat",
    "DType",
    "Format",
    "Framework",
    "Kind",
    "Quantity",
    "default_dtype",
    "format_named",
]

#: A dtype a kernel may be checked in (numpy has no bfloat16: its values travel
#: as float32 arrays, which hold them exactly).
DType = Literal["float64", "float32", "float16", "bfloat16"]
DTYPES: tuple[DType, ...] = get_args(DType)

#: A framework whose kernels the checking kit can call.
Framework = Literal["numpy", "torch"]
FRAMEWORKS: tuple[Framework, ...] = get_args(Framework)

#: A kind of kernel.
Kind = Literal["softmax", "entropy", "adaptive_softmax", "attention"]
KINDS: tuple[Kind, ...] = get_args(Kind)
#: The kinds whose kernels map a row of logits to a row (or a number): all but attention.
ROWWISE_KINDS: tuple[Kind, ...] = tuple(k for k in KINDS if k != "attention")

#: A reading of one row that the reference certifies (β is a reading, not a kernel).
Quantity = Literal["softmax", "entropy", "beta", "adaptive_softmax"]
QUANTITIES: tuple[Quantity, ...] = get_args(Quantity)

#: Row codes of the special-value table (see :class:`softmaxtheory.spec.RowKind`).
ROW_REGULAR = 0  #: finite values, possibly some ``-inf`` (masked) ones
ROW_EMPTY = 1  #: ``n = 0``
ROW_MASKED = 2  #: every entry is ``-inf``
ROW_INVALID = 3  #: contains NaN or ``+inf``

#: The theorems of the theory pages, T1 to T10.
THEOREMS: tuple[str, ...] = tuple(f"T{i}" for i in range(1, 11))


@dataclass(frozen=True)
class BinaryFormat:
    r"""An IEEE binary floating-point format.

    Attributes
    ----------
    name : str
        ``"float64"``, ``"float32"``, ``"float16"`` or ``"bfloat16"``.
    precision : int
        Significand bits :math:`p`, hidden bit included.
    qmin : int
        Exponent of the smallest positive subnormal, :math:`q_{\min} = e_{\min} - p + 1`.
    emax : int
        The largest finite numbers lie in :math:`[2^{e_{\max}}, 2^{e_{\max}+1})`.

    Raises
    ------
    ValueError
        If `precision` is not an int of at least 2, `emax` not a positive int, or
        `qmin` is not :math:`2 - e_{\max} - p` (IEEE 754's :math:`e_{\min} = 1 - e_{\max}`,
        the rule of every binary format).
    """

    name: str
    precision: int
    qmin: int
    emax: int

    def __post_init__(self) -> None:
        for field, low in (("precision", 2), ("emax", 1)):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{field} must be an int of at least {low}, got {value!r}")
        if self.qmin != 2 - self.emax - self.precision:
            raise ValueError(
                f"qmin must be 2 - emax - precision = {2 - self.emax - self.precision}, "
                f"got {self.qmin!r}"
            )

    @property
    def emin(self) -> int:
        r"""Exponent of the smallest positive normal number, :math:`1 - e_{\max}`."""
        return self.qmin + self.precision - 1

    @property
    def u(self) -> float:
        """Unit roundoff :math:`2^{-p}`."""
        return math.ldexp(1.0, -self.precision)

    @property
    def tiny(self) -> float:
        r"""Smallest positive normal number :math:`2^{e_{\min}}`."""
        return math.ldexp(1.0, self.emin)

    @property
    def smallest_subnormal(self) -> float:
        r"""Smallest positive subnormal number :math:`2^{q_{\min}}`."""
        return math.ldexp(1.0, self.qmin)

    @property
    def max_finite(self) -> float:
        r"""Largest finite number :math:`(2 - 2^{1-p})\,2^{e_{\max}}`."""
        return math.ldexp(2.0 - math.ldexp(1.0, 1 - self.precision), self.emax)

    @property
    def dtype(self) -> np.dtype:
        """The numpy dtype of the format.

        Raises
        ------
        ValueError
            For bfloat16, which numpy lacks (:attr:`storage` holds its values).
        """
        if self.name == "bfloat16":
            raise ValueError("bfloat16 has no numpy dtype: its values are stored as float32")
        return np.dtype(self.name)

    @property
    def internal(self) -> Format:
        """The working format (float32 for the 16-bit formats, the format itself otherwise)."""
        return FORMATS["float32"] if self.precision < 24 else self

    @property
    def storage(self) -> np.dtype:
        """The numpy dtype that holds the format's values exactly (float32 for bfloat16)."""
        return np.dtype("float32" if self.name == "bfloat16" else self.name)


#: The one format record of the package; ``Format`` is its short internal name.
Format = BinaryFormat

FORMATS: dict[str, Format] = {
    "float64": Format("float64", 53, -1074, 1023),
    "float32": Format("float32", 24, -149, 127),
    "float16": Format("float16", 11, -24, 15),
    "bfloat16": Format("bfloat16", 8, -133, 127),
}


#: The dtypes numpy has (all but bfloat16): the reference's output formats, the logits
#: :func:`softmaxtheory.spec.as_logits` keeps.
NUMPY_DTYPES: tuple[DType, ...] = tuple(n for n, f in FORMATS.items() if f.storage.name == n)

#: The dtypes that kernels compute in: the CPU kernels, the benchmarks and the
#: experiments' models (16-bit formats compute in float32, :attr:`BinaryFormat.internal`),
#: narrowest first.
WORKING_DTYPES: tuple[DType, ...] = tuple(
    sorted((n for n, f in FORMATS.items() if f.internal is f), key=lambda n: FORMATS[n].precision)
)


def format_named(name: object, what: str = "dtype") -> Format:
    """Return the :class:`Format` of a dtype, given by name or as a numpy or torch dtype.

    Parameters
    ----------
    name : object
        ``"float32"``, ``numpy.float32``, ``numpy.dtype("float32")``,
        ``torch.float32`` or ``"torch.bfloat16"``, and so on.
    what : str, default "dtype"
        The argument's name, for the error message.

    Raises
    ------
    ValueError
        If the dtype is not one of float64, float32, float16 or bfloat16.
    """
    text = str(name).removeprefix("torch.")
    if text not in FORMATS and name is not None:  # np.dtype(None) would be float64
        with contextlib.suppress(TypeError):
            text = np.dtype(name).name  # type: ignore[call-overload]
    if text not in FORMATS:
        raise ValueError(f"{what} must be float64, float32, float16 or bfloat16, got {name!r}")
    return FORMATS[text]


def default_dtype(framework: str) -> DType:
    """The dtype a kernel is checked in when none is given: float64 for numpy, float32 for torch.

    Raises
    ------
    ValueError
        If `framework` is not one of :data:`FRAMEWORKS`.
    """
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework must be one of {FRAMEWORKS}, got {framework!r}")
    return "float64" if framework == "numpy" else "float32"
