"""Shared test configuration: Hypothesis profiles and the theorem marker."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from softmaxtheory._formats import THEOREMS

settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=60,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=25, deadline=None, print_blob=True)
settings.register_profile(
    "thorough",
    max_examples=1000,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Refuse theorem markers that name no theorem of DESIGN §3."""
    for item in items:
        for mark in item.iter_markers("theorem"):
            if len(mark.args) != 1 or mark.args[0] not in THEOREMS:
                raise pytest.UsageError(
                    f"{item.nodeid}: @pytest.mark.theorem takes one of T1..T10, got {mark.args!r}"
                )
