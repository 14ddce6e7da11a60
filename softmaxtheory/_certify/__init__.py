"""The certification core (private): proofs by exact and interval arithmetic.

* :mod:`.environment`: the gradual underflow every certification needs, and
  :class:`~.environment.FloatEnvironmentError` where the process flushes
  subnormals to zero;
* :mod:`.loop`: Ziv's strategy, the one loop that raises a working precision
  until a result is decided, and :class:`~.loop.CertificationError`, the one
  exception when it is not;
* :mod:`.rounding`: correct rounding of exact binary values to a format, and
  Ziv's rounding test (re-exported by :mod:`softmaxtheory.reference`);
* :mod:`.interval`: outward-rounded interval arithmetic on mpmath raw numbers;
* :mod:`.floativ`: the same on float64 pairs, with exp and log of its own (proven
  within :math:`2^{-46}`), for branch and bound over many boxes;
* :mod:`.polyroots`: exact real-root isolation for rational polynomials;
* :mod:`.enclosures` and :mod:`.adaptive`: the certified quantities that
  :mod:`softmaxtheory.bounds` and the ``bounds`` command both print;
* :mod:`.extremal`: the upper end of the adaptive coefficient's bracket, by
  branch and bound over the two shapes of rows that dominate every row.

Nothing here touches mpmath's global context: every operation is given its
precision; :mod:`.floativ` needs IEEE 754's default environment, which
:mod:`.environment` guarantees.
"""

from .environment import FloatEnvironmentError
from .loop import CertificationError

__all__ = ["CertificationError", "FloatEnvironmentError"]
