"""Import ``softmaxtheory.reference`` and ``.accelerated`` from a source checkout.

The distribution maps the top-level folders ``reference/`` and
``accelerated/`` into the ``softmaxtheory`` namespace (setuptools'
``package-dir``). An installed wheel holds them inside the package; a checkout
does not, so running Python in the repository root (where the folder
``softmaxtheory/`` shadows the installed package) would fail to find them. When
the package is imported from a checkout, this finder maps the two names to
their folders, exactly as ``package-dir`` does.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from importlib.machinery import ModuleSpec
from pathlib import Path

__all__ = ["SUBPACKAGE_FOLDERS", "install_source_tree_finder"]

#: Subpackages of ``softmaxtheory`` kept in top-level folders of the checkout.
SUBPACKAGE_FOLDERS = {
    "softmaxtheory.reference": "reference",
    "softmaxtheory.accelerated": "accelerated",
}


class _SourceTreeFinder(importlib.abc.MetaPathFinder):
    def __init__(self, root: Path) -> None:
        self.root = root

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> ModuleSpec | None:
        folder = SUBPACKAGE_FOLDERS.get(fullname)
        if folder is None:
            return None
        init = self.root / folder / "__init__.py"
        return importlib.util.spec_from_file_location(
            fullname, init, submodule_search_locations=[str(init.parent)]
        )


def install_source_tree_finder(package_file: str) -> bool:
    """Map the subpackage folders when `package_file` lies in a source checkout.

    Returns whether the finder was installed (only in a checkout, only once).
    """
    root = Path(package_file).resolve().parent.parent
    if not (root / "pyproject.toml").is_file():
        return False
    if not all((root / f / "__init__.py").is_file() for f in SUBPACKAGE_FOLDERS.values()):
        return False
    if any(isinstance(f, _SourceTreeFinder) for f in sys.meta_path):
        return False
    sys.meta_path.append(_SourceTreeFinder(root))
    return True
