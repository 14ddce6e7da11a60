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

It renders a table of ``tests/<file>.py::<test name>`` with the first line
of each test's docstring; a marked test without a docstring is a warning too
(subtype ``summary``), so that column is never empty.

Every one of these is a Sphinx warning of type ``theorem_tests`` (so a ``-W``
build fails), with its subtype:

* ``empty`` -- a theorem listed on a page has no marked test;
* ``name`` -- the directive names no theorem of ``theorem_tests_theorems``
  (the conf value; default ``T1`` .. ``T10``);
* ``unlisted`` -- a theorem of ``theorem_tests_theorems`` is listed by no page
  (checked once all pages are read; the message says whether it has tests);
* ``marker`` -- a ``mark.theorem(...)`` call anywhere in a test file names no
  theorem of ``theorem_tests_theorems`` (``"T11"``, ``"t1"``, a non-literal
  argument, no argument), or sits where the docs cannot attach it to a test
  (for example inside ``pytest.param``); the warning names the file, the line
  and the enclosing test;
* ``parse`` -- a test file cannot be parsed (reported once, after all pages are read);
* ``folder`` -- ``theorem_tests_dir`` is not a folder.

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
from typing import Any, NamedTuple

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

# the theorems of DESIGN.md section 3, defined once; the default of ``theorem_tests_theorems``
from softmaxtheory._formats import THEOREMS

logger = logging.getLogger(__name__)

__all__ = [
    "TEST_PATTERNS",
    "THEOREMS",
    "FileScan",
    "MarkerCall",
    "MarkerProblem",
    "TheoremTest",
    "TheoremTestsDirective",
    "find_marker_problems",
    "find_theorem_tests",
    "scan_file",
    "setup",
]

_THEOREM_RE = re.compile(r"^T[0-9]+$")

#: The names of the test files read; the default of ``theorem_tests_patterns``.
TEST_PATTERNS: tuple[str, ...] = ("test_*.py", "*_test.py")


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


def _theorems_of_call(node: ast.AST) -> list[str] | None:
    """Theorem names of a ``<pytest.>mark.theorem(...)`` call; ``None`` if not one."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    if not (
        isinstance(func, ast.Attribute) and func.attr == "theorem" and _is_mark_attr(func.value)
    ):
        return None
    names = []
    for arg in [*node.args, *(kw.value for kw in node.keywords)]:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            names.append(arg.value)
        else:  # not a literal: it can never match a theorem name, and is reported
            names.append(f"<{ast.unparse(arg)}>")
    return names or ["<no argument>"]


class _Marks(NamedTuple):
    """The theorems of a mark expression and the ``id()`` of the theorem-mark calls behind them."""

    theorems: frozenset[str] = frozenset()
    calls: frozenset[int] = frozenset()

    def __or__(self, other: object) -> _Marks:
        if not isinstance(other, _Marks):
            return NotImplemented
        return _Marks(self.theorems | other.theorems, self.calls | other.calls)


def _marks_of_expr(node: ast.expr, aliases: dict[str, _Marks]) -> _Marks:
    """The marks of an expression: a call, an alias, or a list / tuple / set of those."""
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        found = _Marks()
        for elt in node.elts:
            found |= _marks_of_expr(elt, aliases)
        return found
    if isinstance(node, ast.Name) and node.id in aliases:
        return aliases[node.id]
    names = _theorems_of_call(node)
    return _Marks(frozenset(names), frozenset({id(node)})) if names else _Marks()


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


def _is_test_function(node: ast.stmt) -> bool:
    return isinstance(node, _FUNCS) and node.name.startswith("test")


def _is_test_class(node: ast.stmt) -> bool:
    return isinstance(node, ast.ClassDef) and node.name.startswith("Test")


class _Reader:
    """One pass over a parsed test file: its tests and the theorems that reach each.

    Every theorem-mark call whose theorems reach a test (or a ``pytestmark``) is
    recorded in `used` by ``id()``; a call left out of `used` is a marker the
    docs cannot attach to a test.
    """

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.used: set[int] = set()
        self.aliases: dict[str, _Marks] = {}
        module = _Marks()
        for stmt in tree.body:  # module-level pytestmark and mark aliases, in source order
            if isinstance(stmt, ast.Assign):
                targets = [t.id for t in stmt.targets if isinstance(t, ast.Name)]
                value = stmt.value
            elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                if stmt.value is None:
                    continue
                targets, value = [stmt.target.id], stmt.value
            else:
                continue
            found = _marks_of_expr(value, self.aliases)
            for name in targets:
                if name == "pytestmark":
                    module = found
                elif found.theorems:
                    self.aliases[name] = found
        self.module = self._take(module)

    def _take(self, marks: _Marks) -> set[str]:
        """The theorems of marks that apply to tests; their calls are used."""
        self.used |= marks.calls
        return set(marks.theorems)

    def _decorators(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> set[str]:
        found: set[str] = set()
        for dec in node.decorator_list:
            found |= self._take(_marks_of_expr(dec, self.aliases))
        return found

    def _class_marks(self, cls: ast.ClassDef) -> set[str]:
        found = self._decorators(cls)
        for stmt in cls.body:
            if isinstance(stmt, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "pytestmark" for t in stmt.targets
            ):
                found |= self._take(_marks_of_expr(stmt.value, self.aliases))
        return found

    def tests(self) -> Iterator[tuple[str, set[str], ast.FunctionDef | ast.AsyncFunctionDef]]:
        """Yield ``(name, theorems, node)`` for every test function or method."""

        def walk_class(cls: ast.ClassDef, prefix: str, marks: set[str]) -> Iterator[Any]:
            marks = marks | self._class_marks(cls)
            for stmt in cls.body:
                if _is_test_function(stmt):
                    yield f"{prefix}{cls.name}::{stmt.name}", marks | self._decorators(stmt), stmt
                elif _is_test_class(stmt):
                    yield from walk_class(stmt, f"{prefix}{cls.name}::", marks)

        for stmt in self.tree.body:
            if _is_test_function(stmt):
                yield stmt.name, self.module | self._decorators(stmt), stmt
            elif _is_test_class(stmt):
                yield from walk_class(stmt, "", self.module)


def _owners(tree: ast.Module) -> dict[int, str]:
    """``id()`` of each node to the ``Class::function`` path that encloses it."""
    owners: dict[int, str] = {}

    def visit(node: ast.AST, owner: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = owner
            # a decorator is a child of what it decorates, so it gets that owner
            if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                inner = child.name if owner == "<module>" else f"{owner}::{child.name}"
            owners[id(child)] = inner
            visit(child, inner)

    visit(tree, "<module>")
    return owners


@dataclass(frozen=True)
class MarkerCall:
    """One ``mark.theorem(...)`` call of a test file, wherever it is."""

    lineno: int
    owner: str  # the enclosing test / class / function, or "<module>"
    names: tuple[str, ...]  # its arguments; "<expr>" for a non-literal, "<no argument>"
    attached: bool  # whether its theorems reach a test (or a pytestmark)


@dataclass(frozen=True)
class FileScan:
    """What one test file says about theorems."""

    tests: dict[str, list[TheoremTest]]  # theorem name to its tests, in source order
    markers: tuple[MarkerCall, ...]  # every theorem-mark call of the file


_SCAN_CACHE: dict[tuple[str, str, int, int], FileScan] = {}


def scan_file(path: Path, display: str) -> FileScan:
    """The tests and theorem markers of one test file (cached by mtime and size).

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


def _scan_file(path: Path, display: str) -> FileScan:
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source, filename=str(path))
    reader = _Reader(tree)
    tests: dict[str, list[TheoremTest]] = {}
    for name, theorems, node in reader.tests():
        summary = _first_line(node)
        for theorem in sorted(theorems):
            tests.setdefault(theorem, []).append(TheoremTest(display, name, summary, node.lineno))
    # read after the tests, so that `reader.used` holds every call that reached a test
    owners = _owners(tree)
    markers = tuple(
        MarkerCall(
            getattr(node, "lineno", 0),
            owners.get(id(node), "<module>"),
            tuple(names),
            id(node) in reader.used,
        )
        for node in ast.walk(tree)
        if (names := _theorems_of_call(node)) is not None
    )
    return FileScan(tests, markers)


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


def _scans(
    folder: Path, patterns: Iterable[str]
) -> Iterator[tuple[Path, str, FileScan | Exception]]:
    """``(path, display, scan)`` per test file; the exception in place of a file that fails."""
    for path in _test_files(folder, patterns):
        display = f"{folder.name}/{path.relative_to(folder).as_posix()}"
        try:
            scan = scan_file(path, display)
        except (SyntaxError, UnicodeDecodeError, OSError) as exc:
            yield path, display, exc
            continue
        yield path, display, scan


def find_theorem_tests(
    folder: Path, theorem: str, patterns: Iterable[str] = TEST_PATTERNS
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
    files: list[Path] = []
    for path, _, scan in _scans(folder, patterns):
        files.append(path)
        if isinstance(scan, Exception):
            errors.append((path, scan))
            continue
        tests.extend(sorted(scan.tests.get(theorem, []), key=lambda t: t.lineno))
    return tests, errors, files


# -- markers naming no theorem ------------------------------------------------------------


@dataclass(frozen=True)
class MarkerProblem:
    """A theorem marker the docs reject: a wrong name, or a place no test reaches."""

    path: str  # relative, with forward slashes, e.g. "tests/test_theorems.py"
    lineno: int
    owner: str  # the enclosing test / class / function, or "<module>"
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.lineno} ({self.owner}): {self.message}"


def _marker_problems(scan: FileScan, display: str, theorems: frozenset[str]) -> list[MarkerProblem]:
    problems: list[MarkerProblem] = []
    known = ", ".join(sorted(theorems, key=_theorem_key))
    for call in scan.markers:
        for name in call.names:
            if name not in theorems:
                shown = name if name.startswith("<") else repr(name)
                problems.append(
                    MarkerProblem(
                        display,
                        call.lineno,
                        call.owner,
                        f"the marker theorem({shown}) names no theorem of {known}",
                    )
                )
        if not call.attached:
            problems.append(
                MarkerProblem(
                    display,
                    call.lineno,
                    call.owner,
                    "this theorem marker is not on a test function, a test class or the "
                    "module's pytestmark, so the docs cannot list its test",
                )
            )
    return sorted(problems, key=lambda p: (p.lineno, p.message))


def _theorem_key(name: str) -> tuple[int, str]:
    return (int(name[1:]), name) if _THEOREM_RE.match(name) else (10**9, name)


def find_marker_problems(
    folder: Path,
    theorems: Iterable[str] = THEOREMS,
    patterns: Iterable[str] = TEST_PATTERNS,
) -> tuple[list[MarkerProblem], list[tuple[Path, Exception]]]:
    """Theorem markers under `folder` that name no theorem of `theorems`, or are unreachable.

    Every ``mark.theorem(...)`` call in a test file is checked, wherever it is.

    Returns
    -------
    problems, errors
        The problems (by file, then line) and the files that failed to parse.
    """
    allowed = frozenset(theorems)
    problems: list[MarkerProblem] = []
    errors: list[tuple[Path, Exception]] = []
    for path, display, scan in _scans(folder, patterns):
        if isinstance(scan, Exception):
            errors.append((path, scan))
            continue
        problems.extend(_marker_problems(scan, display, allowed))
    return problems, errors


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
        config = self.env.config
        if theorem not in config.theorem_tests_theorems:
            logger.warning(
                "theorem-tests: %r is not a theorem of theorem_tests_theorems (%s)",
                theorem,
                ", ".join(config.theorem_tests_theorems),
                location=location,
                type="theorem_tests",
                subtype="name",
            )
            return []
        _listed(self.env).setdefault(self.env.current_document.docname, set()).add(theorem)
        folder = _folder(self.env)
        if not folder.is_dir():
            logger.warning(
                "theorem-tests: theorem_tests_dir %s is not a folder",
                folder,
                location=location,
                type="theorem_tests",
                subtype="folder",
            )
        tests, _, files = find_theorem_tests(folder, theorem, config.theorem_tests_patterns)
        for path in files:
            self.env.note_dependency(str(path))
        # a new test file changes the list without changing the page, or any file it reads
        self.env.note_reread()
        # a file that fails to parse is reported once, by _check_all
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

        for test in tests:
            if not test.summary:
                logger.warning(
                    "theorem-tests: %s is marked for %s but has no docstring (its first line is "
                    "the table's 'What it checks')",
                    test.nodeid,
                    theorem,
                    location=location,
                    type="theorem_tests",
                    subtype="summary",
                )
        table = nodes.table(classes=["theorem-tests", *self.options.get("class", [])])
        group = nodes.tgroup(cols=2)
        table += group
        for width in (45, 55):
            group += nodes.colspec(colwidth=width)
        head = nodes.thead()
        group += head
        body = nodes.tbody()
        group += body

        def row(cells: list[nodes.Node], into: nodes.Element) -> None:
            r = nodes.row()
            for cell in cells:
                entry = nodes.entry()
                para = nodes.paragraph()
                para += cell
                entry += para
                r += entry
            into += r

        row([nodes.Text("Test"), nodes.Text("What it checks")], head)
        for test in tests:
            row([nodes.literal(text=test.nodeid), nodes.Text(test.summary or "")], body)
        plural = len(tests) != 1
        intro = nodes.paragraph()
        intro += nodes.Text(
            f"{len(tests)} test{'s' if plural else ''} carr{'y' if plural else 'ies'} the marker "
        )
        intro += nodes.literal(text=f'@pytest.mark.theorem("{theorem}")')
        intro += nodes.Text(" (read from the test files when this page was built):")
        return [intro, table]


# -- what the pages list, and the checks once all are read -----------------------------


def _listed(env: BuildEnvironment) -> dict[str, set[str]]:
    """Docname to the theorems that page lists."""
    if not hasattr(env, "theorem_tests_listed"):
        env.theorem_tests_listed = {}  # type: ignore[attr-defined]
    return env.theorem_tests_listed  # type: ignore[attr-defined]


def _folder(env: BuildEnvironment) -> Path:
    """The tests folder (``theorem_tests_dir``, made absolute at config-inited)."""
    return Path(env.config.theorem_tests_dir)


def _resolve_dir(app: Sphinx, config: Any) -> None:
    """Make ``theorem_tests_dir`` absolute, relative to the folder of ``conf.py``."""
    config.theorem_tests_dir = str((Path(app.confdir) / config.theorem_tests_dir).resolve())


def _purge(app: Sphinx, env: BuildEnvironment, docname: str) -> None:
    _listed(env).pop(docname, None)


def _merge(app: Sphinx, env: BuildEnvironment, docnames: set[str], other: BuildEnvironment) -> None:
    for docname, theorems in _listed(other).items():
        if docname in docnames:
            _listed(env)[docname] = set(theorems)


def _check_all(app: Sphinx, env: BuildEnvironment) -> None:
    """After reading: every theorem listed by a page; every marker names a theorem."""
    config = env.config
    theorems = tuple(config.theorem_tests_theorems)
    folder = _folder(env)
    listed = set().union(*_listed(env).values()) if _listed(env) else set()
    for theorem in theorems:
        if theorem in listed:
            continue
        tests, _, _ = find_theorem_tests(folder, theorem, config.theorem_tests_patterns)
        logger.warning(
            "theorem-tests: theorem %s is listed by no page (add '.. theorem-tests:: %s' to "
            "its theory page); %s",
            theorem,
            theorem,
            f"{len(tests)} test(s) carry its marker"
            if tests
            else f"and no test in {folder} is marked @pytest.mark.theorem({theorem!r})",
            type="theorem_tests",
            subtype="unlisted",
        )
    problems, errors = find_marker_problems(folder, theorems, config.theorem_tests_patterns)
    for path, exc in errors:
        logger.warning(
            "theorem-tests: cannot parse %s: %s",
            path,
            exc,
            type="theorem_tests",
            subtype="parse",
        )
    for problem in problems:
        logger.warning(
            "theorem-tests: %s (test %s)",
            problem.message,
            problem.owner,
            location=str(folder.parent / problem.path) + f":{problem.lineno}",
            type="theorem_tests",
            subtype="marker",
        )


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
    app.add_config_value("theorem_tests_patterns", TEST_PATTERNS, "env", types=[tuple, list])
    app.add_config_value("theorem_tests_theorems", THEOREMS, "env", types=[tuple, list])
    app.add_config_value("math_lint", True, "env", types=[bool])
    app.add_directive("theorem-tests", TheoremTestsDirective)
    app.connect("doctree-read", _lint_math)
    app.connect("env-purge-doc", _purge)
    app.connect("env-merge-info", _merge)
    app.connect("env-check-consistency", _check_all)
    app.connect("config-inited", _resolve_dir)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
