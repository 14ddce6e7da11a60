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
does) and with the pytest process's ``sys.path`` (``pythonpath`` of the pytest
configuration, entries a ``conftest.py`` added), and the selected properties run
in a child process (a fresh interpreter) with a time limit for the import and for
each property (``--softmax-timeout``): a kernel whose module exits, aborts or
hangs on import fails every test, one that does so while a property runs fails
that property's test, and a bad kernel path ends the session as a usage error
(exit status 4). One child runs every selected property, the suite's tests
imported into another test module included; under pytest-xdist a worker runs
only the properties of the tests it is given, in a child per unit that
``--dist`` hands out (the test, its file or its group), so each property runs
once. The pytest process never imports the kernel.
``--softmax-in-process`` imports it and runs the properties in the pytest process
instead (for ``--pdb``), where a kernel calling ``sys.exit`` still fails its
test, and so does one raising another ``BaseException`` (``pytest.skip`` inside
the kernel does not skip the property).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterator
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
        help="the strict contract: a property that cannot run on the kernel fails instead of "
        "being skipped, 16-bit kernels are held to float32-grade statistics and output, and a "
        "fully masked row must give zeros, not NaN",
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


#: The options of ``softmaxtheory check`` that the messages of the shared validation name.
_CLI_OPTION = re.compile(
    r"(?<![\w-])--(kind|framework|device|dtype|entropy-eps|schedule|thorough|examples|kwarg"
    r"|strict|timeout|in-process)(?![\w-])"
)


def _plugin_words(message: str) -> str:
    """`message` with the options of ``softmaxtheory check`` named as the plugin's.

    Examples
    --------
    >>> _plugin_words("--kwarg takes NAME=VALUE, got 'foo'")
    "--softmax-kwarg takes NAME=VALUE, got 'foo'"
    """
    return _CLI_OPTION.sub(r"--softmax-\1", message)


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
_SELECTED = pytest.StashKey[dict[str, list[str]]]()
_BROKEN = pytest.StashKey[str]()

#: After this many properties timed out, the session runs no more (as one child's run,
#: :func:`softmaxtheory.cli.check.run_isolated`, does): they are skipped.
_MAX_TIMEOUTS = 2


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
        raise pytest.UsageError(f"softmaxtheory conformance: {_plugin_words(str(exc))}") from None


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


def _property_of(item: pytest.Item) -> str | None:
    """The conformance property that `item` runs, or None.

    An item runs one when its function is a test of :mod:`softmaxtheory.conformance`,
    collected there or imported into another test module (under any name).
    """
    conf = sys.modules.get("softmaxtheory.conformance")  # loaded if it holds a collected test
    function = getattr(item, "function", None)
    name = getattr(function, "__name__", "")
    if conf is None or not name.startswith("test_") or getattr(conf, name, None) is not function:
        return None
    return str(name.removeprefix("test_"))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Note which conformance properties were selected, with the node ids of their tests."""
    if not session.config.getoption(_KERNEL):
        return
    selected: dict[str, list[str]] = {}
    for item in session.items:
        name = _property_of(item)
        if name is not None:
            selected.setdefault(name, []).append(item.nodeid)
    session.config.stash[_SELECTED] = selected


#: The key of pytest-xdist's ``workerinput`` that tells a worker the ``--dist`` mode.
_DIST = "softmaxtheory_dist"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist: tell a worker how the tests are split (its own ``--dist`` reads ``no``)."""
    if node.config.getoption(_KERNEL):
        node.workerinput[_DIST] = str(node.config.getoption("dist", "load"))


def _xdist_split(config: pytest.Config) -> str | None:
    """How pytest-xdist splits the tests among workers (``--dist``), or None: not at all.

    None outside xdist, with one worker or with ``--dist each``: this process runs
    every selected test.
    """
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None or int(workerinput.get("workercount", 1)) <= 1:
        return None
    dist = str(workerinput.get(_DIST, "load"))
    return None if dist == "each" else dist


def _scope(dist: str, nodeid: str) -> str:
    """The unit in which pytest-xdist's `dist` mode hands out the test `nodeid`.

    As ``xdist.scheduler``'s ``_split_scope``: ``loadscope`` the module or class,
    ``loadfile`` the file, ``loadgroup`` the ``xdist_group``; otherwise (``load``,
    ``worksteal``) the test itself.
    """
    if dist == "loadscope":
        return nodeid.rsplit("::", 1)[0]
    if dist == "loadfile":
        return nodeid.split("::", 1)[0]
    if dist == "loadgroup" and nodeid.rfind("@") > nodeid.rfind("]"):  # not in a parameter
        return nodeid.split("@")[-1]
    return nodeid


def _batch(config: pytest.Config, name: str) -> list[str]:
    """The properties the next child runs: `name`, and those this process runs with it.

    Every selected property not run yet, unless this is one of several pytest-xdist
    workers: then those whose tests share a scope (:func:`_scope`) with `name`'s, which
    this worker runs too (most often `name` alone), so that no two workers run one.
    """
    from softmaxtheory.conformance import properties_for

    selected = config.stash.get(_SELECTED, {})
    dist = _xdist_split(config)
    if dist is None:
        wanted = {name, *selected}
    else:
        mine = {_scope(dist, nodeid) for nodeid in selected.get(name, [])}
        wanted = {name} | {
            other
            for other, nodeids in selected.items()
            if any(_scope(dist, nodeid) in mine for nodeid in nodeids)
        }
    done = config.stash.get(_RESULTS, {})
    # the kind's properties only: the others' tests skip before asking for a result
    return [n for n in properties_for(config.getoption(_KIND)) if n in wanted and n not in done]


@contextlib.contextmanager
def _child_sys_path() -> Iterator[None]:
    """Hand this process's ``sys.path`` to the children started inside (``PYTHONPATH``).

    pytest's ``pythonpath`` setting, the folders of test modules (``prepend`` import
    mode) and a ``conftest.py`` change ``sys.path`` after the interpreter started: the
    child imports the kernel as this process would. ``PYTHONPATH`` is restored after.
    """
    entries = (os.path.abspath(p) for p in sys.path if isinstance(p, str))
    path = os.pathsep.join(dict.fromkeys(p for p in entries if os.pathsep not in p))
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = path
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before


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
    """The :class:`~softmaxtheory.conformance.PropertyResult` of property `name`.

    With ``--softmax-in-process`` the property runs here (``_run_here``);
    otherwise in a child process (``softmaxtheory check ... --in-process``). The
    first call runs every selected property in one child (``_batch``; under
    pytest-xdist, those of this worker's tests), so the kernel is imported and
    compiled once; later calls read the results, or start a child for a property
    not run yet. None only without ``--softmax-kernel``.
    """
    if not config.getoption(_KERNEL):
        return None
    if config.getoption(_IN_PROCESS):
        return _run_here(config, name)
    from softmaxtheory.conformance import PropertyResult

    results = config.stash.setdefault(_RESULTS, {})
    if name in results:
        return results[name]
    if _BROKEN in config.stash:  # the kernel could not be loaded: not again per property
        return PropertyResult(name, "fail", message=config.stash[_BROKEN])
    if _timeouts(results) >= _MAX_TIMEOUTS:
        return PropertyResult(name, "skip", message="not run: two properties timed out")
    from softmaxtheory.cli import check

    names = _batch(config, name)
    with _child_sys_path():
        outcome = check.run_isolated(
            _child_argv(config), names, _timeout(config), cwd=os.getcwd(), timeout_option=_TIMEOUT
        )
    if outcome.usage is not None:  # a bad kernel path, found by the child's import
        pytest.exit(f"softmaxtheory conformance: {_plugin_words(outcome.usage)}", returncode=4)
    if outcome.broken is not None:  # every property fails with it
        config.stash[_BROKEN] = outcome.broken
        return PropertyResult(name, "fail", message=outcome.broken)
    results.update((r.name, r) for r in outcome.results)
    # run_isolated reports every property it was asked for: none missing but by a bug here
    return results.get(name) or PropertyResult(name, "fail", message="the child sent no result")


def _timeouts(results: dict[str, Any]) -> int:
    """How many of `results` timed out in a child."""
    from softmaxtheory._check.report import STOPPED

    return sum(
        r.status == "fail" and r.message.startswith(f"{STOPPED}timed out") for r in results.values()
    )


def _run_here(config: pytest.Config, name: str) -> Any:
    """Run property `name` in this process (``--softmax-in-process``).

    :func:`~softmaxtheory.conformance.run_property` turns what the kernel raises into
    a verdict, a ``BaseException`` that is not an ``Exception`` included: pytest's
    ``Skipped`` (``pytest.skip`` inside the kernel) used to end the test as a skip, a
    false pass. ``KeyboardInterrupt`` stops the session.
    """
    from softmaxtheory.conformance import run_property

    return run_property(name, stashed_target(config))


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
