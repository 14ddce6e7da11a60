"""The two ways a property ends early: a counterexample, or a kernel it cannot run on (private).

Both are re-exported by :mod:`softmaxtheory._check.runner`, which turns them into a
verdict; they live here so that :mod:`~softmaxtheory._check.target` can raise
:class:`Failed` from its calls without importing the runner.
"""

from __future__ import annotations

__all__ = ["Failed", "Skip"]


class Failed(Exception):
    """A counterexample found by a property: the message is the whole report, repro included."""


class Skip(Exception):
    """The property cannot run on this kernel; the message says why."""
