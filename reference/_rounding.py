r"""The reference's output formats, and its correct rounding (from :mod:`softmaxtheory._certify`).

The reference returns numpy arrays, so its formats are those of the package's one
format table (:data:`softmaxtheory._formats.FORMATS`) that numpy has: float64,
float32 and float16. :func:`round_exact` (one rounding to nearest, ties to even,
subnormals included) and :func:`round_ball` (Ziv's rounding test) are the
certification core's, re-exported here.
"""

from __future__ import annotations

import numpy as np

from softmaxtheory._certify.rounding import round_ball, round_exact
from softmaxtheory._formats import FORMATS as _ALL_FORMATS
from softmaxtheory._formats import NUMPY_DTYPES, BinaryFormat

__all__ = ["FORMATS", "BinaryFormat", "format_for", "round_ball", "round_exact"]

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
