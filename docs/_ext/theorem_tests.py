"""Sphinx extension: list the tests that check a theorem of DESIGN.md §3.

Usage in a page::

    .. theorem-tests:: T1

The directive reads the test files under ``theorem_tests_dir`` (a ``conf.py``
value, relative to the folder of ``conf.py``; default ``../tests``) with the
:mod:`ast` module -- the tests are never imported -- and finds every test marked
for the theorem:

* ``@pytest.mark.theorem("T1")`` (or ``@mark.theorem("T1")``) on a test
  function, on a test class (all its ``test*`` methods), or on a method;
* a module-level ``pytestmark = pytest.mark.theorem("T1")`` or a list / tuple
  of marks (every test of the module);
* a module-level alias ``t1 = pytest.mark.theorem("T1")`` used as ``@t1``.

It renders a bullet list of ``tests/<file>.py::<test name>`` with the first line
of each test's docstring. A theorem with no test is a Sphinx warning (type
``theorem_tests``, subtype ``empty``), so a ``-W`` build fails; a file that
cannot be parsed is a warning too (subtype ``parse``).

Pages using the directive are re-read on every build, since test files can
change without the page changing.
"""

from __future__ import annotations

import ast
import fnmatch
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)

__all__ = ["TheoremTest", "TheoremTestsDirective", "find_theorem_tests", "setup"]

_THEOREM_RE = re.compile(r"^T[0-9]+$")


@dataclass(frozen=True)
class TheoremTest:
    """One test carrying a theorem marker."""

    path: str  # relative, with forward slashes, e.g. "tests/test_theorems.py"
    name: str  # "test_x" or "TestClass::test_x"
    summary: str  # first docstring line, or ""
    lineno: int

    @property
    def nodeid(self) -> str:
        """The pytest node id ``path::name``."""
        return f"{self.path}::{self.name}"


# -- marker recognition ---------------------------------------------------------------


def _is_mark_attr(node: ast.expr) -> bool:
    """Whether `node` is ``pytest.mark`` / ``mark`` (the object holding the marks)."""
    if isinstance(node, ast.Name):
        return node.id == "mark"
    if isinstance(node, ast.Attribute):
        return node.attr == "mark" and isinstance(node.value, ast.Name)
    return False


def _theorems_of_call(node: ast.expr) -> list[str] | None:
    """Theorem names of a ``<pytest.>mark.theorem(...)`` call; ``None`` if not one."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    if not (
        isinstance(func, ast.Attribute) and func.attr == "theorem" and _is_mark_attr(func.value)
    ):
        return None
    names = [
        arg.value
        for arg in node.args
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
    ]
    for kw in node.keywords:
        if isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
            names.append(kw.value.value)
    return names


def _theorems_of_expr(node: ast.expr, aliases: dict[str, set[str]]) -> set[str]:
    """Theorems named by a mark expression: a call, an alias, or a list of those."""
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        found: set[str] = set()
        for elt in node.elts:
            found |= _theorems_of_expr(elt, aliases)
        return found
    if isinstance(node, ast.Name) and node.id in aliases:
        return set(aliases[node.id])
    names = _theorems_of_call(node)
    return set(names) if names else set()


def _first_line(node: ast.AST) -> str:
    doc = ast.get_docstring(node) if isinstance(node, _DOC_NODES) else None
    if not doc:
        return ""
    for line in doc.strip().splitlines():
        if line.strip():
            return line.strip()
    return ""


_DOC_NODES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)
_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _module_marks(tree: ast.Module) -> tuple[set[str], dict[str, set[str]]]:
    """Module-level ``pytestmark`` theorems and mark aliases, in source order."""
    aliases: dict[str, set[str]] = {}
    module: set[str] = set()
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign):
            targets = [t.id for t in stmt.targets if isinstance(t, ast.Name)]
            value = stmt.value
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            if stmt.value is None:
                continue
            targets, value = [stmt.target.id], stmt.value
        else:
            continue
        found = _theorems_of_expr(value, aliases)
        for name in targets:
            if name == "pytestmark":
                module = found
            elif found:
                aliases[name] = found
    return module, aliases


def _is_test_function(node: ast.stmt) -> bool:
    return isinstance(node, _FUNCS) and node.name.startswith("test")


def _is_test_class(node: ast.stmt) -> bool:
    return isinstance(node, ast.ClassDef) and node.name.startswith("Test")


def _decorator_theorems(node: ast.AST, aliases: dict[str, set[str]]) -> set[str]:
    found: set[str] = set()
    for dec in getattr(node, "decorator_list", []):
        found |= _theorems_of_expr(dec, aliases)
    return found


def _class_marks(cls: ast.ClassDef, aliases: dict[str, set[str]]) -> set[str]:
    found = _decorator_theorems(cls, aliases)
    for stmt in cls.body:
        if isinstance(stmt, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in stmt.targets
        ):
            found |= _theorems_of_expr(stmt.value, aliases)
    return found


def _iter_tests(
    tree: ast.Module, aliases: dict[str, set[str]], inherited: set[str]
) -> Iterator[tuple[str, set[str], ast.AST]]:
    """Yield ``(name, theorems, node)`` for every test function or method."""

    def walk_class(cls: ast.ClassDef, prefix: str, marks: set[str]) -> Iterator[Any]:
        marks = marks | _class_marks(cls, aliases)
        for stmt in cls.body:
            if _is_test_function(stmt):
                yield (
                    f"{prefix}{cls.name}::{stmt.name}",
                    marks | _decorator_theorems(stmt, aliases),
                    stmt,
                )
            elif _is_test_class(stmt):
                yield from walk_class(stmt, f"{prefix}{cls.name}::", marks)

    for stmt in tree.body:
        if _is_test_function(stmt):
            yield stmt.name, inherited | _decorator_theorems(stmt, aliases), stmt
        elif _is_test_class(stmt):
            yield from walk_class(stmt, "", inherited)


_SCAN_CACHE: dict[tuple[str, str, int, int], dict[str, list[TheoremTest]]] = {}


def scan_file(path: Path, display: str) -> dict[str, list[TheoremTest]]:
    """Map each theorem named in one test file to its tests (cached by mtime and size).

    Raises
    ------
    SyntaxError
        If the file does not parse.
    """
    stat = path.stat()
    key = (str(path), display, stat.st_mtime_ns, stat.st_size)
    if key not in _SCAN_CACHE:
        _SCAN_CACHE[key] = _scan_file(path, display)
    return _SCAN_CACHE[key]


def _scan_file(path: Path, display: str) -> dict[str, list[TheoremTest]]:
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source, filename=str(path))
    module, aliases = _module_marks(tree)
    result: dict[str, list[TheoremTest]] = {}
    for name, theorems, node in _iter_tests(tree, aliases, module):
        summary = _first_line(node)
        for theorem in sorted(theorems):
            result.setdefault(theorem, []).append(
                TheoremTest(display, name, summary, getattr(node, "lineno", 0))
            )
    return result


def _test_files(folder: Path, patterns: Iterable[str]) -> list[Path]:
    """Test files under `folder` (recursively) whose name matches a pattern, sorted."""
    if not folder.is_dir():
        return []
    pats = list(patterns)
    return sorted(
        p
        for p in folder.rglob("*.py")
        if any(fnmatch.fnmatch(p.name, pat) for pat in pats)
        and not any(part.startswith(".") or part == "__pycache__" for part in p.parts)
    )


def find_theorem_tests(
    folder: Path, theorem: str, patterns: Iterable[str] = ("test_*.py", "*_test.py")
) -> tuple[list[TheoremTest], list[tuple[Path, Exception]], list[Path]]:
    """Tests marked for `theorem` under `folder`.

    Returns
    -------
    tests, errors, files
        The tests (by file, then source order), the files that failed to parse
        with their exception, and every file read.
    """
    tests: list[TheoremTest] = []
    errors: list[tuple[Path, Exception]] = []
    files = _test_files(folder, patterns)
    for path in files:
        display = f"{folder.name}/{path.relative_to(folder).as_posix()}"
        try:
            found = scan_file(path, display)
        except (SyntaxError, UnicodeDecodeError, OSError) as exc:
            errors.append((path, exc))
            continue
        tests.extend(sorted(found.get(theorem, []), key=lambda t: t.lineno))
    return tests, errors, files


# -- the directive ----------------------------------------------------------------------


class TheoremTestsDirective(SphinxDirective):
    """``.. theorem-tests:: T1`` -- the tests that check a theorem."""

    required_arguments = 1
    optional_arguments = 0
    has_content = False
    option_spec = {"class": directives.class_option}  # noqa: RUF012

    def run(self) -> list[nodes.Node]:
        theorem = self.arguments[0].strip()
        location = self.get_location()
        if not _THEOREM_RE.match(theorem):
            logger.warning(
                "theorem-tests: %r is not a theorem name like T1",
                theorem,
                location=location,
                type="theorem_tests",
                subtype="name",
            )
            return []
        config = self.env.config
        folder = (Path(self.env.app.confdir) / config.theorem_tests_dir).resolve()
        if not folder.is_dir():
            logger.warning(
                "theorem-tests: theorem_tests_dir %s is not a folder",
                folder,
                location=location,
                type="theorem_tests",
                subtype="folder",
            )
        tests, errors, files = find_theorem_tests(folder, theorem, config.theorem_tests_patterns)
        for path in files:
            self.env.note_dependency(str(path))
        _pages(self.env).add(self.env.docname)
        reported = _reported(self.env.app)
        for path, exc in errors:
            if str(path) in reported:
                continue
            reported.add(str(path))
            logger.warning(
                "theorem-tests: cannot parse %s: %s",
                path,
                exc,
                location=location,
                type="theorem_tests",
                subtype="parse",
            )
        if not tests:
            logger.warning(
                "theorem-tests: no test in %s is marked @pytest.mark.theorem(%r)",
                folder,
                theorem,
                location=location,
                type="theorem_tests",
                subtype="empty",
            )
            para = nodes.paragraph()
            para += nodes.emphasis(text=f"No test is marked for theorem {theorem} yet.")
            return [para]

        bullets = nodes.bullet_list(classes=["theorem-tests", *self.options.get("class", [])])
        for test in tests:
            item = nodes.list_item()
            para = nodes.paragraph()
            para += nodes.literal(text=test.nodeid)
            if test.summary:
                para += nodes.Text(" \N{EM DASH} " + test.summary)
            item += para
            bullets += item
        plural = len(tests) != 1
        intro = nodes.paragraph()
        intro += nodes.Text(
            f"{len(tests)} test{'s' if plural else ''} carr{'y' if plural else 'ies'} the marker "
        )
        intro += nodes.literal(text=f'@pytest.mark.theorem("{theorem}")')
        intro += nodes.Text(":")
        return [intro, bullets]


# -- keep the pages fresh ----------------------------------------------------------------


def _reported(app: Sphinx) -> set[str]:
    """Files whose parse error was already reported in this build."""
    if not hasattr(app, "theorem_tests_reported"):
        app.theorem_tests_reported = set()  # type: ignore[attr-defined]
    return app.theorem_tests_reported  # type: ignore[attr-defined]


def _pages(env: BuildEnvironment) -> set[str]:
    if not hasattr(env, "theorem_tests_pages"):
        env.theorem_tests_pages = set()  # type: ignore[attr-defined]
    return env.theorem_tests_pages  # type: ignore[attr-defined]


def _purge(app: Sphinx, env: BuildEnvironment, docname: str) -> None:
    _pages(env).discard(docname)


def _merge(app: Sphinx, env: BuildEnvironment, docnames: set[str], other: BuildEnvironment) -> None:
    _pages(env).update(_pages(other) & set(docnames))


def _outdated(
    app: Sphinx, env: BuildEnvironment, added: set[str], changed: set[str], removed: set[str]
) -> list[str]:
    return sorted(d for d in _pages(env) if d in env.found_docs and d not in removed)


# -- a reader's check of the math ---------------------------------------------------

_DOUBLED_BACKSLASH = re.compile(r"\\\\[A-Za-z]")


def _lint_math(app: Sphinx, doctree: nodes.document) -> None:
    """Warn about ``\\\\name`` in math: a raw docstring that kept doubled backslashes.

    In TeX ``\\\\`` is a line break, so ``\\\\sum`` renders as a break and the
    word "sum" instead of the symbol.
    """
    if not app.config.math_lint:
        return
    for node in doctree.findall(lambda n: isinstance(n, nodes.math | nodes.math_block)):
        text = node.astext()
        match = _DOUBLED_BACKSLASH.search(text)
        if match:
            logger.warning(
                "math has a doubled backslash before a command name (%s): %s -- "
                "a raw docstring must write \\name with one backslash",
                match.group(0),
                text,
                location=node,
                type="math_lint",
                subtype="backslash",
            )


def setup(app: Sphinx) -> dict[str, Any]:
    """Register the directive and its configuration values."""
    app.add_config_value("theorem_tests_dir", "../tests", "env", types=[str])
    app.add_config_value(
        "theorem_tests_patterns", ("test_*.py", "*_test.py"), "env", types=[tuple, list]
    )
    app.add_config_value("math_lint", True, "env", types=[bool])
    app.add_directive("theorem-tests", TheoremTestsDirective)
    app.connect("doctree-read", _lint_math)
    app.connect("env-purge-doc", _purge)
    app.connect("env-merge-info", _merge)
    app.connect("env-get-outdated", _outdated)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
