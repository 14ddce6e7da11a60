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

Certification needs IEEE 754's default floating-point environment (gradual
underflow, rounding to nearest). In a thread that flushes subnormals to zero
(``torch.set_flush_denormal(True)``, a library built with ``-ffast-math``) or
rounds in a directed mode, every function computes in the default environment
and restores the thread's afterwards (Linux on x86-64 or AArch64), or raises
:class:`FloatEnvironmentError` where that cannot be done, instead of returning
a subnormal as 0.0.
"""

from softmaxtheory._certify.environment import FloatEnvironmentError, certifying

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
from ._rounding import FORMATS, BinaryFormat
from ._rounding import checked_round_exact as _round_exact
from .attention import ATTENTION_MAX_PRECISION, adaptive_attention
from .streaming import StreamState

#: :func:`~softmaxtheory._certify.rounding.round_exact`, its arguments checked, in IEEE's
#: default environment (the reference's own calls run inside its entry points, which set it)
round_exact = certifying("round_exact")(_round_exact)
round_exact.__name__ = round_exact.__qualname__ = "round_exact"

__all__ = [
    "ATTENTION_MAX_PRECISION",
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
