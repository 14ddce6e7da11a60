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


#: Tests run first (node id prefixes): those whose module fixture costs half a minute or more
#: (computed once per worker that runs one of the module's tests) and the longest test. Under
#: pytest-xdist the first tests go to one worker in its first batch: the fixtures are then
#: computed once, not once per worker (or waited for on a lock), and no long test is left
#: to the end of the run while the other worker has nothing to do.
FIRST = (
    "tests/test_triton_interpret.py::",
    "tests/test_docs_api.py::",
    "tests/test_docs_browser.py::",
    "tests/test_cpu_regressions.py::test_bits_do_not_depend_on_the_process_history",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Refuse theorem markers that name no theorem of DESIGN §3; put :data:`FIRST` first."""
    for item in items:
        for mark in item.iter_markers("theorem"):
            if len(mark.args) != 1 or mark.args[0] not in THEOREMS:
                raise pytest.UsageError(
                    f"{item.nodeid}: @pytest.mark.theorem takes one of T1..T10, got {mark.args!r}"
                )
    items.sort(key=lambda item: not item.nodeid.startswith(FIRST))  # stable: order kept
