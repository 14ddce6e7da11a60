r"""The ``softmaxtheory`` pytest plugin (entry point ``pytest11``): tiny and lazy.

It adds the options of the conformance suite,

.. code-block:: console

    $ pytest --pyargs softmaxtheory.conformance --softmax-kernel pkg.mod:func \\
          [--softmax-kind adaptive_softmax] [--softmax-framework torch] [--softmax-dtype float32]

and the fixtures ``softmax_reference`` (the module :mod:`softmaxtheory.reference`),
``softmax_testing`` (:mod:`softmaxtheory.testing`) and
``softmax_conformance_target`` (the kernel under test). Importing it imports
nothing beyond pytest and the standard library, and a session that does not
pass ``--softmax-kernel`` is left exactly as it was.
"""

from __future__ import annotations

from typing import Any

import pytest

__all__ = [
    "pytest_addoption",
    "pytest_report_header",
    "softmax_conformance_target",
    "softmax_reference",
    "softmax_testing",
]


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add the ``--softmax-*`` options (group ``softmaxtheory``)."""
    group = parser.getgroup("softmaxtheory", "softmaxtheory conformance suite")
    group.addoption(
        "--softmax-kernel",
        metavar="PKG.MOD:FUNC",
        default=None,
        help="the kernel to check with --pyargs softmaxtheory.conformance",
    )
    group.addoption(
        "--softmax-kind",
        default="softmax",
        choices=("softmax", "entropy", "adaptive_softmax", "attention"),
    )
    group.addoption("--softmax-framework", default="numpy", choices=("numpy", "torch"))
    group.addoption("--softmax-device", default="cpu")
    group.addoption(
        "--softmax-dtype", default=None, choices=("float64", "float32", "float16", "bfloat16")
    )
    group.addoption("--softmax-entropy-eps", default="0.0", metavar="E")
    group.addoption("--softmax-schedule", default="paper", metavar="SPEC")
    group.addoption("--softmax-thorough", action="store_true", default=False)
    group.addoption("--softmax-examples", type=int, default=None, metavar="N")
    group.addoption(
        "--softmax-kwarg", action="append", default=[], metavar="NAME=VALUE"
    )  # fmt: skip


def _dtype(config: pytest.Config) -> str:
    dtype = config.getoption("--softmax-dtype")
    if dtype:
        return str(dtype)
    return "float64" if config.getoption("--softmax-framework") == "numpy" else "float32"


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    """Versions and the kernel under test, only when ``--softmax-kernel`` is given."""
    kernel = config.getoption("--softmax-kernel")
    if not kernel:
        return None
    from importlib.metadata import PackageNotFoundError, version

    parts = []
    for name in ("softmaxtheory", "numpy", "mpmath", "hypothesis", "torch"):
        try:
            parts.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            continue
    return [
        "softmaxtheory conformance: " + ", ".join(parts),
        f"kernel {kernel}: kind {config.getoption('--softmax-kind')}, framework "
        f"{config.getoption('--softmax-framework')}, device {config.getoption('--softmax-device')}"
        f", dtype {_dtype(config)}",
    ]


@pytest.fixture(scope="session")
def softmax_reference() -> Any:
    """The certified reference, :mod:`softmaxtheory.reference`."""
    import softmaxtheory.reference

    return softmaxtheory.reference


@pytest.fixture(scope="session")
def softmax_testing() -> Any:
    """The assertions of :mod:`softmaxtheory.testing`."""
    import softmaxtheory.testing

    return softmaxtheory.testing


@pytest.fixture(scope="session")
def softmax_conformance_target(pytestconfig: pytest.Config) -> Any:
    """The kernel under test (a :class:`softmaxtheory.conformance.Target`) from the options."""
    cfg = pytestconfig
    kernel = cfg.getoption("--softmax-kernel")
    if not kernel:
        pytest.fail("pass the kernel to check: --softmax-kernel pkg.mod:func", pytrace=False)
    from softmaxtheory import conformance as conf
    from softmaxtheory.cli import parse_float, parse_schedule

    try:
        fn, name = conf.load_kernel(kernel)
        return conf.Target(
            fn,
            name,
            kind=cfg.getoption("--softmax-kind"),
            framework=cfg.getoption("--softmax-framework"),
            device=cfg.getoption("--softmax-device"),
            dtype=_dtype(cfg),
            entropy_eps=parse_float(cfg.getoption("--softmax-entropy-eps")),
            schedule=parse_schedule(cfg.getoption("--softmax-schedule")),
            thorough=bool(cfg.getoption("--softmax-thorough")),
            examples=cfg.getoption("--softmax-examples"),
            kwargs=dict(conf.parse_kwarg(t) for t in cfg.getoption("--softmax-kwarg")),
        )
    except Exception as exc:  # usage errors: a clear message, no traceback
        pytest.fail(f"softmaxtheory conformance: {exc}", pytrace=False)
