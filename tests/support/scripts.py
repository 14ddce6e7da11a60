"""Load a file of the checkout that is not in a package (``tools/``, ``docs/_ext/``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

__all__ = ["ROOT", "load_script"]

#: The checkout's root folder.
ROOT = Path(__file__).resolve().parent.parent.parent


def load_script(relative: str, name: str) -> ModuleType:
    """The module of the file `relative` (to the checkout's root), imported as `name`."""
    spec = importlib.util.spec_from_file_location(name, ROOT / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
