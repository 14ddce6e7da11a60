"""Test helpers that watch a library function without changing what it does."""

from __future__ import annotations

from typing import Any

__all__ = ["record_results"]


def record_results(monkeypatch: Any, owner: Any, name: str) -> list:
    """Wrap ``owner.name`` (through `monkeypatch`) so that each call's result is recorded.

    Returns the list the results are appended to, in the order of the calls.
    """
    results: list = []
    original = getattr(owner, name)

    def spy(*args: Any, **kwargs: Any) -> Any:
        results.append(original(*args, **kwargs))
        return results[-1]

    monkeypatch.setattr(owner, name, spy)
    return results
