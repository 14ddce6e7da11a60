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

The options are checked at the start of the session: a bad option value is one
usage error (exit status 4), not an error per test. As with ``softmaxtheory
check``, the kernel is imported, from the current folder first (as ``python -m``
does), and the selected properties run in one child process (a fresh
interpreter) with a time limit for the import and for each property
(``--softmax-timeout``): a kernel whose module exits, aborts or hangs on import
fails every test, one that does so while a property runs fails that property's
test, and a bad kernel path ends the session as a usage error (exit status 4).
The pytest process never imports the kernel. ``--softmax-in-process`` imports it
and runs the properties in the pytest process instead (for ``--pdb``), where a
kernel calling ``sys.exit`` still fails its test.
"""

from __future__ import annotations

from typing import Any

import pytest

from ._formats import DTYPES, FRAMEWORKS, KINDS, default_dtype

__all__ = [
    "conformance_result",
    "pytest_addoption",
    "pytest_collection_finish",
    "pytest_report_header",
    "pytest_sessionstart",
    "softmax_conformance_target",
    "softmax_reference",
    "softmax_testing",
]


# The options, named once (as Hypothesis's plugin does).
_KERNEL = "--softmax-kernel"
_KIND = "--softmax-kind"
_FRAMEWORK = "--softmax-framework"
_DEVICE = "--softmax-device"
_DTYPE = "--softmax-dtype"
_ENTROPY_EPS = "--softmax-entropy-eps"
_SCHEDULE = "--softmax-schedule"
_THOROUGH = "--softmax-thorough"
_EXAMPLES = "--softmax-examples"
_KWARG = "--softmax-kwarg"
_STRICT = "--softmax-strict"
_TIMEOUT = "--softmax-timeout"
_IN_PROCESS = "--softmax-in-process"


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add the ``--softmax-*`` options (group ``softmaxtheory``)."""
    group = parser.getgroup("softmaxtheory", "softmaxtheory conformance suite")
    group.addoption(
        _KERNEL,
        metavar="PKG.MOD:FUNC",
        default=None,
        help="the kernel to check with --pyargs softmaxtheory.conformance",
    )
    group.addoption(
        _KIND, default="softmax", choices=KINDS, help="what the kernel computes (default softmax)"
    )
    group.addoption(
        _FRAMEWORK,
        default="numpy",
        choices=FRAMEWORKS,
        help="how the kernel is called: numpy arrays or torch tensors (default numpy)",
    )
    group.addoption(_DEVICE, default="cpu", help="cpu or cuda (torch only; default cpu)")
    group.addoption(
        _DTYPE,
        default=None,
        choices=DTYPES,
        help="input dtype (default float64 for numpy, float32 for torch)",
    )
    group.addoption(
        _ENTROPY_EPS,
        default="0.0",
        metavar="E",
        help="the kernel's entropy guard, >= 0 (1e-9: the paper's listing; default 0)",
    )
    group.addoption(
        _SCHEDULE,
        default=None,
        metavar="SPEC",
        help="schedule the kernel implements: paper (default), constant:BETA, loglength:S, "
        "poly:CK,...,C1,C0[@THETA] (highest degree first; kinds adaptive_softmax and attention)",
    )
    group.addoption(
        _THOROUGH, action="store_true", default=False, help="explore ten times more examples"
    )
    group.addoption(
        _EXAMPLES,
        type=int,
        default=None,
        metavar="N",
        help="examples per Hypothesis property (overrides the budget)",
    )
    group.addoption(
        _KWARG,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra keyword argument for every call (e.g. axis=-1); repeatable",
    )
    group.addoption(
        _STRICT,
        action="store_true",
        default=False,
        help="a property that cannot run on the kernel fails instead of being skipped",
    )
    group.addoption(
        _TIMEOUT,
        default=None,
        metavar="S",
        help="seconds a property may run before its test fails as timed out (default 300, "
        "3000 with --softmax-thorough)",
    )
    group.addoption(
        _IN_PROCESS,
        action="store_true",
        default=False,
        help="run the kernel in the pytest process (no time limit, no protection against a "
        "kernel that exits, aborts or hangs)",
    )


def _dtype(config: pytest.Config) -> str:
    return str(config.getoption(_DTYPE) or default_dtype(config.getoption(_FRAMEWORK)))


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    """Versions and the kernel under test, only when ``--softmax-kernel`` is given."""
    kernel = config.getoption(_KERNEL)
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
        f"kernel {kernel}: kind {config.getoption(_KIND)}, framework "
        f"{config.getoption(_FRAMEWORK)}, device {config.getoption(_DEVICE)}"
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


_TARGET = pytest.StashKey[Any]()
_RESULTS = pytest.StashKey[dict[str, Any]]()
_SELECTED = pytest.StashKey[list[str]]()


def _timeout(cfg: pytest.Config) -> float:
    text = cfg.getoption(_TIMEOUT)
    if text is None:
        return 3000.0 if cfg.getoption(_THOROUGH) else 300.0
    from softmaxtheory.cli import parse_float

    value = parse_float(text)
    if not 0 < value < float("inf"):
        raise ValueError(f"--softmax-timeout must be a finite number of seconds > 0, got {text!r}")
    return value


def pytest_sessionstart(session: pytest.Session) -> None:
    """With ``--softmax-kernel``: check the options (and import the kernel if in-process)."""
    cfg = session.config
    kernel = cfg.getoption(_KERNEL)
    if not kernel:
        return
    try:
        _target(cfg, load=bool(cfg.getoption(_IN_PROCESS)))
    except Exception as exc:  # usage errors: one clear message, no traceback
        raise pytest.UsageError(f"softmaxtheory conformance: {exc}") from None


def _target(cfg: pytest.Config, load: bool) -> Any:
    """Validate the options; with `load`, then import the kernel and stash its target."""
    from softmaxtheory import conformance as conf

    _timeout(cfg)
    if cfg.getoption(_TIMEOUT) is not None and cfg.getoption(_IN_PROCESS):
        # the timeout is the child process's: in-process it would be silently ignored
        raise ValueError(f"{_TIMEOUT} needs the child process: drop {_IN_PROCESS}")
    kind = cfg.getoption(_KIND)
    options = {
        "kind": kind,
        "framework": cfg.getoption(_FRAMEWORK),
        "device": cfg.getoption(_DEVICE),
        "dtype": _dtype(cfg),
        "entropy_eps": cfg.getoption(_ENTROPY_EPS),
        "schedule": cfg.getoption(_SCHEDULE) or "paper",
        "thorough": bool(cfg.getoption(_THOROUGH)),
        "examples": cfg.getoption(_EXAMPLES),
        "kwargs": cfg.getoption(_KWARG),
        "strict": bool(cfg.getoption(_STRICT)),
    }
    conf.target_from_options(cfg.getoption(_KERNEL), load=False, **options)
    # options the kind would ignore (a tempered softmax checked at beta = 1 passed)
    if cfg.getoption(_SCHEDULE) is not None and kind in ("softmax", "entropy"):
        raise ValueError(f"{_SCHEDULE} does not apply to kind {kind}")
    if kind == "softmax" and float(cfg.getoption(_ENTROPY_EPS)):
        raise ValueError(f"{_ENTROPY_EPS} does not apply to kind softmax")
    if not load:
        return None
    target = conf.target_from_options(cfg.getoption(_KERNEL), **options)
    cfg.stash[_TARGET] = target
    return target


def pytest_collection_finish(session: pytest.Session) -> None:
    """Note which conformance properties were selected (they run together in one child)."""
    if not session.config.getoption(_KERNEL):
        return
    names = []
    for item in session.items:
        module = getattr(getattr(item, "module", None), "__name__", "")
        if module == "softmaxtheory.conformance" and item.name.startswith("test_"):
            names.append(item.name.removeprefix("test_"))
    session.config.stash[_SELECTED] = names


def _child_argv(cfg: pytest.Config) -> list[str]:
    argv = [
        cfg.getoption(_KERNEL),
        "--kind", cfg.getoption(_KIND),
        "--framework", cfg.getoption(_FRAMEWORK),
        "--device", cfg.getoption(_DEVICE),
        "--dtype", _dtype(cfg),
    ]  # fmt: skip
    kind = cfg.getoption(_KIND)
    if kind != "softmax":  # the options the kind takes (the others are refused)
        argv += ["--entropy-eps", str(cfg.getoption(_ENTROPY_EPS))]
    if kind not in ("softmax", "entropy"):
        argv += ["--schedule", str(cfg.getoption(_SCHEDULE) or "paper")]
    for text in cfg.getoption(_KWARG):
        argv += ["--kwarg", text]
    if cfg.getoption(_THOROUGH):
        argv.append("--thorough")
    if cfg.getoption(_EXAMPLES) is not None:
        argv += ["--examples", str(cfg.getoption(_EXAMPLES))]
    if cfg.getoption(_STRICT):
        argv.append("--strict")
    return argv


def conformance_result(config: pytest.Config, name: str) -> Any:
    """The result of property `name` from the child process, or None to run it in-process.

    The first call runs every selected property of the target's kind in one
    child (``softmaxtheory check ... --in-process``), so the kernel is imported
    and compiled once; later calls read the results.
    """
    if config.getoption(_IN_PROCESS) or not config.getoption(_KERNEL):
        return None
    if _RESULTS not in config.stash:
        import os

        from softmaxtheory.cli import check
        from softmaxtheory.conformance import properties_for

        selected = set(config.stash.get(_SELECTED, [name])) | {name}
        names = [n for n in properties_for(config.getoption(_KIND)) if n in selected]
        outcome = check.run_isolated(
            _child_argv(config), names, _timeout(config), cwd=os.getcwd(), timeout_option=_TIMEOUT
        )
        if outcome.usage is not None:  # a bad kernel path, found by the child's import
            pytest.exit(f"softmaxtheory conformance: {outcome.usage}", returncode=4)
        results = {r.name: r for r in outcome.results}
        why = outcome.broken
        if why is not None:  # every selected property fails with it
            from softmaxtheory.conformance import PropertyResult

            results = {n: PropertyResult(n, "fail", message=why) for n in names}
        config.stash[_RESULTS] = results
    return config.stash[_RESULTS].get(name)


def missing_kernel() -> None:
    """Fail the calling test: the conformance suite runs only with ``--softmax-kernel``."""
    pytest.fail("pass the kernel to check: --softmax-kernel pkg.mod:func", pytrace=False)


def stashed_target(config: pytest.Config) -> Any:
    """The :class:`~softmaxtheory.conformance.Target` of the options, imported on first use."""
    if not config.getoption(_KERNEL):
        missing_kernel()
    if _TARGET not in config.stash:
        _target(config, load=True)
    return config.stash[_TARGET]


@pytest.fixture(scope="session")
def softmax_conformance_target(pytestconfig: pytest.Config) -> Any:
    """The kernel under test (a :class:`softmaxtheory.conformance.Target`) from the options.

    It imports the kernel into the pytest process; the suite's own tests do not use it
    (they run the kernel in a child process, unless ``--softmax-in-process``).
    """
    return stashed_target(pytestconfig)
