r"""The exact streaming monoid of theorem T7.

A row's streaming state is :math:`S(x) = (m, s, t)` with :math:`m = \max x`,
:math:`s = \sum_i e^{x_i - m}` and :math:`t = \sum_i e^{x_i - m}(x_i - m)`.
Two states merge by

.. math::

    M = \max(m_1, m_2), \quad
    s = \sum_{k} s_k e^{m_k - M}, \quad
    t = \sum_{k} \bigl(t_k + s_k (m_k - M)\bigr) e^{m_k - M},

and the entropy is :math:`H = \log s - t/s`.

:class:`StreamState` keeps :math:`s` and :math:`t` in closed form, as the
multiset of exact dyadic shifts :math:`d_i = x_i - m` (a map from shift to
multiplicity): :math:`s = \sum c_d e^{d}` and :math:`t = \sum c_d\, d\, e^{d}`.
Rescaling by :math:`e^{m_k - M}` is then the exact shift
:math:`d \mapsto d + (m_k - M)`, so merges are exact, associative and
commutative, and any chunking or merge tree yields the identical state. Numbers
are produced only when read, with the reference's certified rounding.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import mpmath
import numpy as np
from mpmath.libmp import from_float, fzero, mpf_add, mpf_sub

from softmaxtheory._certify.environment import certifying
from softmaxtheory._certify.loop import certify
from softmaxtheory._formats import Quantity
from softmaxtheory.spec import Schedule, as_logits, check_entropy_eps

from . import _engine as eng
from ._api import MAX_PRECISION, PrecisionError, certify_row, check_mp_prec, known_schedule
from ._rounding import format_for

__all__ = ["StreamState"]


class StreamState:
    r"""Exact streaming state :math:`(m, s, t)` of a row fed in chunks.

    ``StreamState()`` is the identity :math:`(-\infty, 0, 0)`. States are
    immutable: :meth:`update`, :meth:`merge` and ``+`` return new states.

    Examples
    --------
    >>> import numpy as np
    >>> from softmaxtheory.reference import StreamState, entropy
    >>> x = np.array([0.5, -1.0, 2.0, 2.0, float("-inf"), 0.25])
    >>> left = StreamState.from_logits(x[:2])
    >>> right = StreamState().update(x[2:4]).update(x[4:])
    >>> whole = left + right
    >>> whole == StreamState.from_logits(x)
    True
    >>> whole.entropy() == float(entropy(x))
    True
    >>> whole.normalize(x[2:4]).tolist() == whole.normalize(x)[2:4].tolist()
    True
    """

    __slots__ = ("_cache", "_invalid", "_m", "_terms")

    def __init__(self) -> None:
        self._m = -math.inf
        self._terms: Counter = Counter()
        self._invalid = False
        self._cache: dict = {}

    @classmethod
    def _make(cls, m: float, terms: Counter, invalid: bool) -> StreamState:
        state = cls()
        state._m = m + 0.0  # a zero maximum is +0.0, whichever zero came first
        state._terms = terms
        state._invalid = invalid
        return state

    @classmethod
    @certifying("the reference")
    def from_logits(cls, chunk: Any) -> StreamState:
        """The state :math:`S(x)` of one chunk (a 1-d array of logits).

        ``-inf`` entries are masked (ignored); NaN or ``+inf`` make the state
        invalid, and every reading of it NaN.
        """
        arr = as_logits(chunk, "chunk", exact=True)
        if arr.ndim != 1:
            raise ValueError(f"chunk must be 1-d, got shape {arr.shape}")
        arr = arr.astype(np.float64)
        if np.any(np.isnan(arr) | (arr == np.inf)):
            return cls._make(math.nan, Counter(), True)
        live = arr[arr > -np.inf]
        if live.size == 0:
            return cls()
        values, counts = np.unique(live, return_counts=True)
        m = float(values[-1])
        fm = from_float(m)
        terms = Counter(
            {
                mpf_sub(from_float(v), fm, 0): int(c)
                for v, c in zip(values.tolist(), counts.tolist(), strict=True)
            }
        )
        return cls._make(m, terms, False)

    def update(self, chunk: Any) -> StreamState:
        """Return ``self ⊕ S(chunk)``."""
        return self.merge(StreamState.from_logits(chunk))

    @certifying("the reference")
    def merge(self, other: StreamState) -> StreamState:
        """Return ``self ⊕ other`` (exact; associative and commutative)."""
        if not isinstance(other, StreamState):
            raise TypeError(f"can only merge with a StreamState, got {type(other).__name__}")
        if self._invalid or other._invalid:
            return StreamState._make(math.nan, Counter(), True)
        if not other._terms:
            return self
        if not self._terms:
            return other
        M = max(self._m, other._m)
        fM = from_float(M)
        terms: Counter = Counter()
        for state in (self, other):
            shift = mpf_sub(from_float(state._m), fM, 0)
            for d, c in state._terms.items():
                terms[mpf_add(d, shift, 0) if shift != fzero else d] += c
        return StreamState._make(M, terms, False)

    def __add__(self, other: object) -> StreamState:
        """``self ⊕ other`` (:meth:`merge`); another type is not added to a state."""
        if not isinstance(other, StreamState):
            return NotImplemented
        return self.merge(other)

    def __radd__(self, other: object) -> StreamState:
        """``0 + state``: the state, so that ``sum(states)`` merges them all (0 is ⊕'s identity)."""
        if isinstance(other, int) and not isinstance(other, bool) and other == 0:
            return self
        return NotImplemented

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StreamState):
            return NotImplemented
        if self._invalid or other._invalid:
            return self._invalid and other._invalid
        return self._m == other._m and self._terms == other._terms

    def __hash__(self) -> int:
        if self._invalid:  # every invalid state is equal (its NaN m hashes by identity)
            return hash((StreamState, "invalid"))
        return hash((self._m, frozenset(self._terms.items())))

    def __repr__(self) -> str:
        if self._invalid:
            return "StreamState(invalid: NaN or +inf seen)"
        return f"StreamState(m={self._m!r}, count={self.count})"

    @property
    def m(self) -> float:
        """The running maximum (``-inf`` for the identity, NaN if invalid)."""
        return self._m

    @property
    def count(self) -> int:
        """Number of unmasked items fed (:attr:`n_eff`).

        :class:`softmaxtheory.accelerated.cpu.StreamingSoftmax` counts masked items
        in its ``count`` too; its ``n_eff`` is this number.
        """
        return sum(self._terms.values())

    @property
    def n_eff(self) -> int:
        """Number of unmasked items fed, as ``StreamingSoftmax.n_eff`` names it."""
        return self.count

    @property
    def invalid(self) -> bool:
        """Whether a NaN or ``+inf`` was fed."""
        return self._invalid

    @certifying("the reference")
    def _row(self) -> eng.PreparedRow:
        row = self._cache.get("row")
        if row is None:
            z = [d for d, c in self._terms.items() for _ in range(c)]
            row = eng.PreparedRow.from_shifts(z, len(z), np.arange(len(z)))
            self._cache["row"] = row
        return row

    @certifying("the reference")
    def _sums_mp(self, which: str, prec: int) -> mpmath.mpf:
        check_mp_prec(prec)
        if self._invalid:
            return mpmath.mpf("nan")
        if not self._terms:
            return mpmath.mpf(0)
        row = self._row()
        target = math.ldexp(1.0, -prec)

        def attempt(p: int) -> mpmath.mpf | None:
            ep = eng.exp_pass(row, None, p, math.inf, want_t=True)
            mid, rel = (ep.s, ep.s_rel) if which == "s" else (ep.t, ep.t_rel)
            return mpmath.mp.make_mpf(mid) if rel <= target else None

        return certify(
            attempt,
            start=prec + 20 + row.n.bit_length(),
            cap=MAX_PRECISION,
            what=f"{which} to {prec} bits",
            error=PrecisionError,
        )

    def s_mp(self, prec: int = 113) -> mpmath.mpf:
        r""":math:`s = \sum e^{x_i - m}` with relative error at most ``2**-prec``.

        Raises
        ------
        ValueError
            If `prec` is not an int in [8, 800], as for
            :func:`~softmaxtheory.reference.softmax_mp`.
        """
        return self._sums_mp("s", prec)

    def t_mp(self, prec: int = 113) -> mpmath.mpf:
        r""":math:`t = \sum e^{x_i - m}(x_i - m)` with relative error at most ``2**-prec``.

        Raises
        ------
        ValueError
            If `prec` is not an int in [8, 800], as for
            :func:`~softmaxtheory.reference.softmax_mp`.
        """
        return self._sums_mp("t", prec)

    @certifying("the reference")
    def _read(
        self, want: Quantity, schedule: Schedule | None, entropy_eps: float, dtype: Any, empty: Any
    ) -> Any:
        """Validate the options, then the certified reading (cached) or its special value."""
        fmt = format_for(dtype)
        schedule = known_schedule(schedule, want)
        entropy_eps = check_entropy_eps(entropy_eps)
        if self._invalid:
            return math.nan
        if not self._terms:
            return empty
        key = (want, schedule, entropy_eps, fmt.name)
        if key not in self._cache:
            self._cache[key] = certify_row(self._row(), want, fmt, schedule, entropy_eps)
        return self._cache[key]

    def entropy(self, *, entropy_eps: float = 0.0, dtype: Any = np.float64) -> float:
        """Correctly rounded entropy of everything fed (``log s - t/s``)."""
        return self._read("entropy", None, entropy_eps, dtype, 0.0)

    def beta(
        self,
        *,
        schedule: Schedule | None = None,
        entropy_eps: float = 0.0,
        dtype: Any = np.float64,
    ) -> float:
        """Correctly rounded inverse temperature of everything fed."""
        return self._read("beta", schedule, entropy_eps, dtype, 1.0)

    @certifying("the reference")
    def normalize(
        self,
        chunk: Any,
        *,
        schedule: Schedule | None = None,
        entropy_eps: float = 0.0,
        dtype: Any = np.float64,
    ) -> np.ndarray:
        """Second pass: adaptive-softmax coefficients of a chunk that was fed.

        Returns the coefficients of the chunk's items relative to the whole row,
        correctly rounded; pass ``schedule=Constant(1)`` for plain softmax.

        Raises
        ------
        ValueError
            If the chunk holds a value that was never fed to this state.
        """
        arr = as_logits(chunk, "chunk", exact=True)
        if arr.ndim != 1:
            raise ValueError(f"chunk must be 1-d, got shape {arr.shape}")
        values = self._read("adaptive_softmax", schedule, entropy_eps, dtype, [])
        out = np.zeros(arr.shape, dtype=format_for(dtype).dtype)
        if self._invalid:
            out[...] = np.nan
            return out
        row = self._row()
        table = dict(zip(row.z, values, strict=True))
        fm = from_float(self._m) if self._terms else None
        for i, v in enumerate(arr.astype(np.float64).tolist()):
            if v == -math.inf:
                continue
            d = mpf_sub(from_float(v), fm, 0) if fm is not None else None
            if d not in table:
                raise ValueError(f"chunk[{i}] = {v!r} was never fed to this state")
            out[i] = table[d]
        return out
