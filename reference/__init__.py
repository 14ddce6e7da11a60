r"""The oracle: certified, correctly rounded reference values (double-double, then mpmath).

Imported as ``softmaxtheory.reference``. Every function evaluates the exact
mathematics of :mod:`softmaxtheory.spec` on the exact binary values of its
input and returns each value **correctly rounded** (to nearest, ties to even)
to the requested format. Results are certified by Ziv's strategy: each value is
computed at a working precision :math:`p` together with a rigorous error bound;
when the whole error ball rounds to one float, that float is the answer,
otherwise :math:`p` is doubled. mpmath's global context is never touched: all
arithmetic passes its precision explicitly.

The ``*_mp`` functions return mpmath numbers with a certified relative error
(for docs, bounds and tests); :class:`StreamState` is the exact streaming
monoid of theorem T7.

Certification needs IEEE gradual underflow: in a process that flushes
subnormals to zero (``torch.set_flush_denormal(True)``, a library built with
``-ffast-math``) every function raises :class:`FloatEnvironmentError` instead
of returning a subnormal as 0.0.
"""

from softmaxtheory._certify.environment import FloatEnvironmentError

from ._api import (
    MAX_PRECISION,
    PrecisionError,
    adaptive_softmax,
    adaptive_softmax_mp,
    beta,
    beta_mp,
    entropy,
    entropy_mp,
    softmax,
    softmax_mp,
)
from ._rounding import FORMATS, BinaryFormat, round_exact
from .attention import adaptive_attention
from .streaming import StreamState

__all__ = [
    "FORMATS",
    "MAX_PRECISION",
    "BinaryFormat",
    "FloatEnvironmentError",
    "PrecisionError",
    "StreamState",
    "adaptive_attention",
    "adaptive_softmax",
    "adaptive_softmax_mp",
    "beta",
    "beta_mp",
    "entropy",
    "entropy_mp",
    "round_exact",
    "softmax",
    "softmax_mp",
]
