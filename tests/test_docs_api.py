"""Every public name of every public module is documented in the API reference.

The public modules are discovered on disk: each package of pyproject's
``[tool.setuptools] packages`` and every module inside it whose dotted name has no
component starting with ``_``, except the modules of the packages in :data:`INTERNAL`
(a command or an experiment whose package is its whole public face). The public
names of a module are its ``__all__`` (dunder names aside). What counts as documented
is what Sphinx itself records: the docs pages that hold an autodoc or ``py:``
directive are built (with the real ``docs/conf.py``) into tmp_path, and the Python
domain's objects are read back. A
name is documented under its own module, under another public module that exports
the same object (``softmaxtheory.PaperPolynomial`` is ``softmaxtheory.spec.PaperPolynomial``),
or under its defining module and qualified name.

A new public name without an entry on an API page fails here.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytest.importorskip("sphinx")
pytest.importorskip("docutils")  # docs/_ext imports it at module level

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

# Packages whose absence makes a module unimportable without it being an error here.
OPTIONAL = {"numba", "torch", "triton", "hypothesis", "matplotlib", "scipy", "transformers"}

# Public modules whose names are not documented yet, each with the reason. The test of such
# a module is a strict xfail: once its names are documented, the XPASS fails the run and the
# entry must go.
PENDING: dict[str, str] = {}

# Packages whose own modules implement the package's public face and are not API: the
# package is documented (its __init__), its modules are not discovered. Each with the reason.
INTERNAL: dict[str, str] = {
    "softmaxtheory.cli": "one module per subcommand; the commands are documented by their "
    "--help and the command-line pages",
    "softmaxtheory.experiments.max_retrieval": "data, model and report of the experiment "
    "whose command and run function the package gives",
    "softmaxtheory.experiments.clrs_text": "data, model and report of the experiment whose "
    "command and run function the package gives",
    "softmaxtheory.experiments.minilm": "model, measurements and report of the experiment "
    "whose command and run function the package gives",
}

AUTODOC = re.compile(r"^\s*\.\. (auto[a-z]+|py:[a-z]+)::", re.MULTILINE)


def _packages() -> list[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return list(data["tool"]["setuptools"]["packages"])


def _public(name: str) -> bool:
    return not any(part.startswith("_") for part in name.split("."))


def public_modules() -> list[str]:
    """The public modules on disk, by name (importing only the packages)."""
    found: set[str] = set()
    for package in _packages():
        if not _public(package):
            continue
        found.add(package)
        if package in INTERNAL:
            continue
        pkg = importlib.import_module(package)
        for info in pkgutil.iter_modules(pkg.__path__, package + "."):
            if _public(info.name):
                found.add(info.name)
    return sorted(found)


MODULES = public_modules()


def _import(name: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] in OPTIONAL:
            pytest.skip(f"{name} needs {exc.name}, which is not installed")
        raise


def _public_names(module) -> list[str]:
    return [n for n in module.__all__ if not (n.startswith("__") and n.endswith("__"))]


@pytest.fixture(scope="module")
def documented(tmp_path_factory) -> set[str]:
    """The Python objects that the docs' autodoc / py: pages document."""
    work = tmp_path_factory.mktemp("api-docs")
    src = work / "src"
    pages = []
    for page in sorted(DOCS.rglob("*.rst")):
        rel = page.relative_to(DOCS)
        if rel.parts[0].startswith("_") or not AUTODOC.search(page.read_text(encoding="utf-8")):
            continue
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(page, src / rel)
        pages.append(rel.with_suffix("").as_posix())
    assert "api/index" in pages, pages
    toctree = "\n".join(f"   {p}" for p in pages if p != "index")
    (src / "index.rst").write_text(f"API\n===\n\n.. toctree::\n\n{toctree}\n")
    script = (
        "import io, json, sys\n"
        "from sphinx.application import Sphinx\n"
        "src, conf, work = sys.argv[1:4]\n"
        "app = Sphinx(src, conf, work + '/out', work + '/doctrees', 'dummy',\n"
        "             status=None, warning=io.StringIO(), freshenv=True)\n"
        "app.build()\n"
        "py = app.env.get_domain('py')\n"
        "with open(work + '/objects.json', 'w') as f:\n"
        "    json.dump(sorted(py.objects), f)\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", script, str(src), str(DOCS), str(work)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    return set(json.loads((work / "objects.json").read_text()))


def _candidates(modname: str, module, name: str) -> set[str]:
    obj = getattr(module, name)
    names = {f"{modname}.{name}"}
    owner, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if isinstance(owner, str) and isinstance(qualname, str) and _public(owner):
        names.add(f"{owner}.{qualname}")
    for other in MODULES:
        if other == modname:
            continue
        try:
            other_module = importlib.import_module(other)
        except ImportError:
            continue
        if name in getattr(other_module, "__all__", ()) and getattr(other_module, name) is obj:
            names.add(f"{other}.{name}")
    return names


def test_the_discovery_finds_the_known_modules():
    for name in (
        "softmaxtheory",
        "softmaxtheory.spec",
        "softmaxtheory.bounds",
        "softmaxtheory.testing",
        "softmaxtheory.strategies",
        "softmaxtheory.conformance",
        "softmaxtheory.pytest_plugin",
        "softmaxtheory.reference",
        "softmaxtheory.accelerated",
        "softmaxtheory.accelerated.cpu",
        "softmaxtheory.accelerated.torch",
        "softmaxtheory.cli",
        "softmaxtheory.bench",
        "softmaxtheory.bench.torch",
        "softmaxtheory.bench_torch",
        "softmaxtheory.experiments.minilm",
    ):
        assert name in MODULES


def test_the_modules_of_an_internal_package_are_not_public():
    assert set(INTERNAL) <= set(_packages())
    for name in ("softmaxtheory.cli.check", "softmaxtheory.experiments.minilm.model"):
        assert name not in MODULES


def test_a_name_with_a_private_part_is_not_public():
    assert _public("softmaxtheory.accelerated.cpu")
    for name in ("softmaxtheory.__main__", "softmaxtheory._layout", "_x", "a._b.c"):
        assert not _public(name), name


def _undocumented(modname: str, module, documented: set[str]) -> list[str]:
    return [
        name
        for name in _public_names(module)
        if not (_candidates(modname, module, name) & documented)
    ]


@pytest.mark.parametrize(
    "modname",
    [
        pytest.param(
            m, marks=pytest.mark.xfail(reason=PENDING[m], strict=True) if m in PENDING else ()
        )
        for m in MODULES
    ],
)
def test_every_public_name_is_documented(modname, documented):
    module = _import(modname)
    assert hasattr(module, "__all__"), f"{modname} has no __all__"
    missing = _undocumented(modname, module, documented)
    assert not missing, (
        f"{modname}: public names with no entry on any API page (docs/api/*.rst): "
        + ", ".join(missing)
    )


def test_an_undocumented_name_is_caught(documented):
    """The check itself: a name whose entry is gone is reported, under every module exporting it."""
    bounds = importlib.import_module("softmaxtheory.bounds")
    assert _undocumented("softmaxtheory.bounds", bounds, documented) == []
    less = documented - {"softmaxtheory.bounds.max_coefficient"}
    assert _undocumented("softmaxtheory.bounds", bounds, less) == ["max_coefficient"]
    top = importlib.import_module("softmaxtheory")
    less = documented - {"softmaxtheory.spec.Constant"}
    assert _undocumented("softmaxtheory", top, less) == ["Constant"]
    spec = importlib.import_module("softmaxtheory.spec")
    assert _undocumented("softmaxtheory.spec", spec, less) == ["Constant"]
