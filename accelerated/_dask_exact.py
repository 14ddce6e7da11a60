r"""Exact streaming states of :mod:`softmaxtheory.accelerated.dask`, ``certified=True`` (private).

:class:`ExactState` is the exact T7 state of a set of items: the element of the
monoid that :class:`softmaxtheory.reference.StreamState` represents, held
compactly. A reference state keeps the multiset of exact shifts
:math:`d = x - m` as mpmath numbers; here the multiset of the float values
:math:`x` themselves is kept as two numpy arrays (the sorted distinct finite values
and their multiplicities). The maximum is the last value, every shift is
:math:`x - m` exactly, and ⊕ is the union of multisets — exact, associative and
commutative, so any chunking and merge tree gives the identical state
(:meth:`ExactState.to_stream_state` gives the reference's object, equal to
the one built by the reference's own merges).

The compact form matters at scale: built item by item in mpmath, a reference state
costs microseconds per item and a Python object per distinct value, while
:func:`numpy.unique` builds and merges these in sorted numpy arrays.

Readings (entropy, β, the coefficients) come from the reference, which
certifies them by Ziv's strategy: a coefficient depends on the row only through
this multiset, so the reference evaluates the multiset expanded to a row once, and
each block of the row looks its values up in the resulting table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import reference
from .._formats import ROW_INVALID, ROW_MASKED, ROW_REGULAR
from ..spec import Schedule

__all__: list[str] = []


@dataclass(frozen=True)
class ExactState:
    """The exact multiset of a row's unmasked values, or the invalid state."""

    values: np.ndarray  # sorted distinct finite values (float64, exact)
    counts: np.ndarray  # their multiplicities (int64)
    invalid: bool = False

    @classmethod
    def identity(cls) -> ExactState:
        """The identity of ⊕ (no item)."""
        return cls(np.empty(0), np.empty(0, dtype=np.int64))

    @classmethod
    def of_row(cls, row: np.ndarray) -> ExactState:
        """The state of one block of a row (``-inf`` masked, NaN or ``+inf`` invalid)."""
        arr = np.asarray(row, dtype=np.float64)
        if np.isnan(arr).any() or (arr == np.inf).any():
            return cls(np.empty(0), np.empty(0, dtype=np.int64), True)
        values, counts = np.unique(arr[arr > -np.inf], return_counts=True)
        return cls(values, counts.astype(np.int64))

    def merge(self, other: ExactState) -> ExactState:
        """``self ⊕ other``: the union of the multisets (exact)."""
        if self.invalid or other.invalid:
            return ExactState(np.empty(0), np.empty(0, dtype=np.int64), True)
        if other.values.size == 0:
            return self
        if self.values.size == 0:
            return other
        both = np.concatenate([self.values, other.values])
        # two sorted runs: a stable sort merges them in linear time
        order = np.argsort(both, kind="stable")
        both = both[order]
        counts = np.concatenate([self.counts, other.counts])[order]
        starts = np.flatnonzero(np.concatenate([[True], both[1:] != both[:-1]]))
        return ExactState(both[starts], np.add.reduceat(counts, starts))

    @property
    def kind(self) -> int:
        """0 regular, 2 empty or fully masked, 3 invalid."""
        if self.invalid:
            return ROW_INVALID
        return ROW_REGULAR if self.values.size else ROW_MASKED

    def expanded(self) -> np.ndarray:
        """The multiset as a row (sorted), for the reference."""
        return np.repeat(self.values, self.counts)

    def to_stream_state(self) -> reference.StreamState:
        """The same element of the monoid as a :class:`~softmaxtheory.reference.StreamState`."""
        if self.invalid:
            return reference.StreamState.from_logits(np.array([np.nan]))
        return reference.StreamState.from_logits(self.expanded())


@dataclass(frozen=True)
class CertifiedRow:
    """A row's certified readings: entropy, β, and coefficients per distinct value."""

    kind: int
    entropy: float
    beta: float
    values: np.ndarray
    coefficients: np.ndarray


def read_state(
    state: ExactState,
    want: str,
    schedule: Schedule,
    entropy_eps: float,
    dtype: Any,
) -> CertifiedRow:
    """Certified readings of a merged state (`want`: entropy, beta, softmax or adaptive_softmax)."""
    kind = state.kind
    empty = np.empty(0)
    if kind == ROW_INVALID:
        return CertifiedRow(kind, np.nan, np.nan, empty, empty)
    if kind == ROW_MASKED:
        return CertifiedRow(kind, 0.0, 1.0, empty, empty)
    row = state.expanded()
    h = b = np.nan
    coeffs = empty
    if want == "entropy":
        h = float(reference.entropy(row, entropy_eps=entropy_eps, dtype=dtype))
    elif want == "beta":
        b = float(reference.beta(row, schedule=schedule, entropy_eps=entropy_eps))
    else:
        if want == "softmax":
            full = reference.softmax(row, dtype=dtype)
        else:
            full = reference.adaptive_softmax(
                row, schedule=schedule, entropy_eps=entropy_eps, dtype=dtype
            )
        starts = np.concatenate([[0], np.cumsum(state.counts)[:-1]])
        coeffs = np.asarray(full)[starts]  # equal values have equal coefficients
    return CertifiedRow(kind, h, b, state.values, coeffs)


def write_row(row: np.ndarray, reading: CertifiedRow, out: np.ndarray) -> None:
    """The certified coefficients of one block of a row, looked up by value."""
    if reading.kind == ROW_INVALID:
        out[...] = np.nan
        return
    out[...] = 0.0
    if reading.kind == ROW_MASKED:
        return
    arr = np.asarray(row, dtype=np.float64)
    live = np.flatnonzero(arr > -np.inf)
    keys = arr[live]
    order = np.argsort(keys)  # sorted keys: each binary search starts where the last ended
    idx = np.searchsorted(reading.values, keys[order])
    out[live[order]] = reading.coefficients[idx]
