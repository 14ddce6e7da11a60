r"""Sphinx extension: numbers computed by the library while the docs are built.

Every number a page quotes about the theory should come from the library's own
code, run when the page is built, so that the page cannot drift from the code.
This extension provides the means.

Roles
-----

``:computed:`EXPR```
    Evaluates the Python expression ``EXPR`` and inserts ``str(result)`` as
    plain text (wrapped in ``<span class="computed">``). ``EXPR`` is taken as
    written: reST backslash escapes do not apply to it, and it cannot contain a
    backtick. Format explicitly::

        The largest coefficient is :computed:`f"{bounds.max_coefficient(16, 2.0):.6f}"`.

``:computed-math:`EXPR```
    The same, but the result is inline math (TeX), for example
    ``:computed-math:`rf"\beta_{{\max}} = {bounds.adaptive_beta_max():.4f}"```
    (an r-string, so that TeX backslashes stay single; ``{{``/``}}`` are the
    f-string's literal braces).

Directives
----------

``.. computed-setup::``
    A block of Python run once, in order, before the roles and directives that
    follow it on the same page. The names it defines are visible to the later
    roles and directives *of that page only* (every page starts from a fresh
    namespace). It renders nothing::

        .. computed-setup::

           n, spread = 4096, 2.0
           top = bounds.max_coefficient(n, spread)

``.. computed-math::``
    A displayed equation (same options as ``.. math::``) in which every
    ``{{ EXPR }}`` is replaced by ``str(EXPR)``::

        .. computed-math::

           \beta_{\max} = {{ f"{bounds.adaptive_beta_max():.10f}" }}

    A literal ``{{`` in the TeX must be written ``{ {``.

``.. computed-table::``
    A table from a Python expression (the directive's content) that yields rows,
    each a sequence of cells; each cell is ``str(cell)``. Options:
    ``:header-rows:`` (default 1: the first row is the header), ``:widths:``
    (space- or comma-separated integers), ``:rst:`` (flag: parse each cell as
    inline reST, so that a cell may hold ``:math:`...```), ``:class:``,
    ``:name:``, ``:align:``; an optional argument is the caption::

        .. computed-table:: Largest coefficient for spread 2
           :widths: 1 2

           [("n", "max coefficient")] + [
               (n, f"{bounds.max_coefficient(n, 2.0):.6f}") for n in (16, 256, 4096)
           ]

``.. computed-rst::``
    Evaluates the Python expression of its content, which must give a ``str``
    of reStructuredText, and parses that text in place (for lists or
    paragraphs whose shape depends on computed values).

Namespace
---------

Each page's namespace starts with ``math``, ``numpy as np``, ``mpmath``,
``softmaxtheory`` and ``from softmaxtheory import bounds, reference, spec``
(the ``computed_preamble`` configuration value is the code that builds it; the
project's ``docs/conf.py`` adds ``Path`` and ``DOCS``, the docs folder), and
``mpmath.mp`` is set to 53 bits before the page's first value and restored
once the page is read, so a page that raises the precision affects no other.

Errors
------

An expression or block that raises, a ``None`` value, a non-``str`` result of
``computed-rst``, or malformed table rows is a Sphinx warning (type
``computed``) naming the page and line, so a ``-W`` build fails; the output
then shows ``[computed: error]`` in place of the value, never a silent blank.

Pages that use any of these are re-read on every build, since the library can
change without the page changing.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

import mpmath
from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.directives.patches import MathDirective
from sphinx.environment import BuildEnvironment
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective, SphinxRole

logger = logging.getLogger(__name__)

__all__ = [
    "ComputedError",
    "ComputedMathDirective",
    "ComputedMathRole",
    "ComputedRole",
    "ComputedRstDirective",
    "ComputedSetupDirective",
    "ComputedTableDirective",
    "evaluate",
    "setup",
]

DEFAULT_PREAMBLE = """\
import math
import numpy as np
import mpmath
import softmaxtheory
from softmaxtheory import bounds, reference, spec
"""

_NS_KEY = "computed_namespace"
_PREC_KEY = "computed_saved_prec"
_ERROR_TEXT = "[computed: error]"
_PLACEHOLDER = re.compile(r"\{\{(.+?)\}\}", re.DOTALL)


class ComputedError(Exception):
    """An expression or setup block of a page failed; the message says why."""


# -- the per-page namespace ------------------------------------------------------------


def _namespace(env: BuildEnvironment) -> dict[str, Any]:
    """The namespace of the page being read, created on first use."""
    doc = env.current_document
    ns = doc.get(_NS_KEY)
    if ns is None:
        doc[_PREC_KEY] = mpmath.mp.prec
        mpmath.mp.prec = 53
        ns = {"__name__": f"computed:{doc.docname}"}
        exec(compile(env.config.computed_preamble, "<computed_preamble>", "exec"), ns)
        doc[_NS_KEY] = ns
    # the library can change without the page changing: read the page again on every build
    env.note_reread()
    return ns


def evaluate(env: BuildEnvironment, source: str, *, mode: str = "eval", where: str = "") -> Any:
    """Evaluate `source` (``mode="eval"``) or run it (``"exec"``) in the page namespace.

    Raises
    ------
    ComputedError
        If the source does not compile or raises; the message holds the
        exception's type and text.
    """
    ns = _namespace(env)
    code = source.strip() if mode == "eval" else source
    if mode == "eval" and not code:
        raise ComputedError("empty expression")
    try:
        compiled = compile(code, f"<computed {where}>", mode)
        if mode == "eval":
            return eval(compiled, ns)
        exec(compiled, ns)
    except Exception as exc:
        raise ComputedError(f"{type(exc).__name__}: {exc}") from exc
    return None


def _as_text(value: Any) -> str:
    """``str(value)``; ``None`` (a function that printed instead of returning) is an error."""
    if value is None:
        raise ComputedError("the expression gave None")
    return str(value)


def _warn(message: str, location: Any) -> None:
    logger.warning(message, location=location, type="computed", subtype="error")


def _error_node() -> nodes.Node:
    return nodes.inline(_ERROR_TEXT, _ERROR_TEXT, classes=["computed", "computed-error"])


def _docname(env: BuildEnvironment) -> str:
    return env.current_document.docname


# -- roles ------------------------------------------------------------------------------


_RAW_ROLE = re.compile(r"^:[^`]*:`(.*)`$", re.DOTALL)


class ComputedRole(SphinxRole):
    """``:computed:`EXPR``` -- the value of ``EXPR`` as text."""

    def _source(self) -> str:
        """The expression as written: reST backslash escapes are not applied to Python."""
        match = _RAW_ROLE.match(self.rawtext)
        return match.group(1) if match else self.text

    def _value(self) -> str | None:
        where = f"{_docname(self.env)}:{self.lineno}"
        source = self._source()
        try:
            return _as_text(evaluate(self.env, source, where=where))
        except ComputedError as exc:
            _warn(f"{self.name}: {source!r} failed: {exc}", self.get_location())
            return None

    def run(self) -> tuple[list[nodes.Node], list[nodes.system_message]]:
        value = self._value()
        if value is None:
            return [_error_node()], []
        return [nodes.inline(self.rawtext, value, classes=["computed"])], []


class ComputedMathRole(ComputedRole):
    """``:computed-math:`EXPR``` -- the value of ``EXPR`` as inline TeX."""

    def run(self) -> tuple[list[nodes.Node], list[nodes.system_message]]:
        value = self._value()
        if value is None:
            return [_error_node()], []
        return [nodes.math(self.rawtext, value, classes=["computed"])], []


# -- directives -------------------------------------------------------------------------


class ComputedSetupDirective(SphinxDirective):
    """``.. computed-setup::`` -- run Python code in the page namespace; renders nothing."""

    has_content = True

    def run(self) -> list[nodes.Node]:
        where = f"{_docname(self.env)}:{self.lineno}"
        try:
            evaluate(self.env, "\n".join(self.content), mode="exec", where=where)
        except ComputedError as exc:
            _warn(f"computed-setup failed: {exc}", self.get_location())
            return [nodes.paragraph("", "", _error_node())]
        return []


class ComputedMathDirective(MathDirective):
    """``.. computed-math::`` -- a displayed equation with ``{{ EXPR }}`` placeholders."""

    def run(self) -> list[nodes.Node]:
        where = f"{_docname(self.env)}:{self.lineno}"
        failed = False

        def replace(match: re.Match[str]) -> str:
            nonlocal failed
            try:
                return _as_text(evaluate(self.env, match.group(1), where=where))
            except ComputedError as exc:
                failed = True
                _warn(
                    f"computed-math: {match.group(1).strip()!r} failed: {exc}", self.get_location()
                )
                return r"\text{" + _ERROR_TEXT + "}"

        text = _PLACEHOLDER.sub(replace, "\n".join(self.content))
        if self.arguments:
            self.arguments[0] = _PLACEHOLDER.sub(replace, self.arguments[0])
        self.content = StringList(text.split("\n"), self.content.parent)
        result = super().run()
        for node in result:
            if isinstance(node, nodes.math_block):
                node["classes"].append("computed")
        if failed:
            result.append(nodes.paragraph("", "", _error_node()))
        return result


def _widths(argument: str) -> list[int]:
    values = [int(v) for v in argument.replace(",", " ").split()]
    if not values or any(v <= 0 for v in values):
        raise ValueError("widths must be positive integers")
    return values


class ComputedTableDirective(SphinxDirective):
    """``.. computed-table::`` -- a table from a Python expression giving rows."""

    has_content = True
    optional_arguments = 1
    final_argument_whitespace = True
    option_spec: ClassVar[dict[str, Any]] = {
        "header-rows": directives.nonnegative_int,
        "widths": _widths,
        "rst": directives.flag,
        "class": directives.class_option,
        "name": directives.unchanged,
        "align": lambda arg: directives.choice(arg, ("left", "center", "right")),
    }

    def _rows(self) -> list[list[str]]:
        where = f"{_docname(self.env)}:{self.lineno}"
        value = evaluate(self.env, "\n".join(self.content), where=where)
        try:
            rows = [[str(cell) for cell in row] for row in value]
        except TypeError as exc:
            raise ComputedError(f"rows must be an iterable of sequences: {exc}") from exc
        if not rows:
            raise ComputedError("the expression gave no rows")
        ncols = len(rows[0])
        if ncols == 0 or any(len(row) != ncols for row in rows):
            raise ComputedError(
                f"every row needs the same, non-zero number of cells; got {[len(r) for r in rows]}"
            )
        widths = self.options.get("widths")
        if widths is not None and len(widths) != ncols:
            raise ComputedError(f":widths: has {len(widths)} values for {ncols} columns")
        if self.options.get("header-rows", 1) > len(rows):
            raise ComputedError(":header-rows: exceeds the number of rows")
        return rows

    def _cell(self, text: str) -> nodes.entry:
        entry = nodes.entry()
        para = nodes.paragraph()
        if "rst" in self.options:
            inline, messages = self.parse_inline(text, lineno=self.lineno)
            para += inline
            entry += para
            entry += messages
        else:
            para += nodes.Text(text)
            entry += para
        return entry

    def run(self) -> list[nodes.Node]:
        try:
            rows = self._rows()
        except ComputedError as exc:
            _warn(f"computed-table failed: {exc}", self.get_location())
            return [nodes.paragraph("", "", _error_node())]
        ncols = len(rows[0])
        header_rows = self.options.get("header-rows", 1)
        widths = self.options.get("widths", [1] * ncols)

        table = nodes.table(classes=["computed-table", *self.options.get("class", [])])
        if "align" in self.options:
            table["align"] = self.options["align"]
        if self.arguments:
            title, messages = self.parse_inline(self.arguments[0], lineno=self.lineno)
            table += nodes.title(self.arguments[0], "", *title)
            table += messages
        group = nodes.tgroup(cols=ncols)
        table += group
        for width in widths:
            group += nodes.colspec(colwidth=width)
        if header_rows:
            thead = nodes.thead()
            group += thead
            for row in rows[:header_rows]:
                thead += nodes.row("", *(self._cell(c) for c in row))
        tbody = nodes.tbody()
        group += tbody
        for row in rows[header_rows:]:
            tbody += nodes.row("", *(self._cell(c) for c in row))
        self.set_source_info(table)
        self.add_name(table)
        return [table]


class ComputedRstDirective(SphinxDirective):
    """``.. computed-rst::`` -- parse the reST string that an expression gives."""

    has_content = True

    def run(self) -> list[nodes.Node]:
        where = f"{_docname(self.env)}:{self.lineno}"
        try:
            value = evaluate(self.env, "\n".join(self.content), where=where)
            if not isinstance(value, str):
                raise ComputedError(f"the expression gave {type(value).__name__}, not str")
        except ComputedError as exc:
            _warn(f"computed-rst failed: {exc}", self.get_location())
            return [nodes.paragraph("", "", _error_node())]
        return self.parse_text_to_nodes(StringList(value.split("\n"), source=where))


def _restore_precision(app: Sphinx, doctree: nodes.document) -> None:
    """Give mpmath back the precision it had before the page's code ran."""
    doc = app.env.current_document
    if _PREC_KEY in doc:
        mpmath.mp.prec = doc[_PREC_KEY]


def setup(app: Sphinx) -> dict[str, Any]:
    """Register the roles, the directives and ``computed_preamble``."""
    app.add_config_value("computed_preamble", DEFAULT_PREAMBLE, "env", types=[str])
    app.add_role("computed", ComputedRole())
    app.add_role("computed-math", ComputedMathRole())
    app.add_directive("computed-setup", ComputedSetupDirective)
    app.add_directive("computed-math", ComputedMathDirective)
    app.add_directive("computed-table", ComputedTableDirective)
    app.add_directive("computed-rst", ComputedRstDirective)
    app.connect("doctree-read", _restore_precision)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
