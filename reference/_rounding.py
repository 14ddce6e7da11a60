r"""The reference's output formats, and its correct rounding (from :mod:`softmaxtheory._certify`).

The reference returns numpy arrays, so its formats are those of the package's one
format table (:data:`softmaxtheory._formats.FORMATS`) that numpy has: float64,
float32 and float16. :func:`round_exact` (one rounding to nearest, ties to even,
subnormals included) and :func:`round_ball` (Ziv's rounding test) are the
certification core's, re-exported here.
"""

from __future__ import annotations

import operator

import numpy as np

from softmaxtheory._certify.rounding import round_ball, round_exact, round_fraction
from softmaxtheory._formats import FORMATS as _ALL_FORMATS
from softmaxtheory._formats import NUMPY_DTYPES, BinaryFormat

__all__ = [
    "FORMATS",
    "BinaryFormat",
    "checked_round_exact",
    "format_for",
    "round_ball",
    "round_exact",
    "round_fraction",
]

#: The output formats of the reference: the formats numpy has (bfloat16 is not one).
FORMATS: dict[str, BinaryFormat] = {name: _ALL_FORMATS[name] for name in NUMPY_DTYPES}


def format_for(dtype: object, name: str = "dtype") -> BinaryFormat:
    """Return the :class:`BinaryFormat` of a numpy floating dtype.

    Raises
    ------
    ValueError
        If `dtype` is not float16, float32 or float64.
    """
    try:
        key = np.dtype(dtype).name  # type: ignore[call-overload]
    except TypeError as exc:
        raise ValueError(f"{name} must be float64, float32 or float16, got {dtype!r}") from exc
    if key not in FORMATS:
        raise ValueError(f"{name} must be float64, float32 or float16, got {key}")
    return FORMATS[key]


def _integer(value: object, name: str) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{name} must be an int, got {value!r}") from None


def checked_round_exact(sign: int, man: int, exp: int, fmt: BinaryFormat) -> float:
    r"""Round :math:`(-1)^{sign} \cdot man \cdot 2^{exp}` to `fmt`, nearest-even.

    The public :func:`softmaxtheory.reference.round_exact`: the certification core's
    rounding with its arguments checked first.

    Parameters
    ----------
    sign : int
        0 for positive, 1 for negative.
    man : int
        Non-negative integer significand (numpy integers are accepted).
    exp : int
        Binary exponent.
    fmt : BinaryFormat
        Target format, one of :data:`FORMATS`.

    Returns
    -------
    float
        The rounded value as a Python float (exactly representable in `fmt`),
        ``±inf`` on overflow, ``±0.0`` on underflow.

    Raises
    ------
    TypeError
        If `sign`, `man` or `exp` is not an integer or `fmt` is not a
        :class:`BinaryFormat`.
    ValueError
        If `sign` is not 0 or 1, or `man` is negative.
    """
    sign = _integer(sign, "sign")
    man = _integer(man, "man")
    exp = _integer(exp, "exp")
    if sign not in (0, 1):
        raise ValueError(f"sign must be 0 or 1, got {sign!r}")
    if man < 0:
        raise ValueError(f"man must be a non-negative integer, got {man!r}")
    if not isinstance(fmt, BinaryFormat):
        raise TypeError(f"fmt must be a BinaryFormat (one of reference.FORMATS), got {fmt!r}")
    return round_exact(sign, man, exp, fmt)
