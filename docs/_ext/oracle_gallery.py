"""Sphinx extension: the gallery of what the conformance oracle catches, computed at build time.

``.. oracle-gallery::`` runs every broken kernel of the test suite's catalogue
(``tests/support/broken_kernels.py``, :data:`CATALOGUE`) through the conformance suite
while the page is built, the way ``softmaxtheory check`` runs a kernel: the
properties of its kind in report order, with their default (derandomized)
example budgets, stopping at the first failure (``check``'s fail-fast). For each
defect class the page shows the kernel's code, the property that caught it and
the first lines of the failure. ``.. oracle-gallery-correct::`` runs the whole
default suite on correct kernels (numpy, scipy, torch in each dtype) and shows
their verdicts.

Running the suite takes tens of seconds, so the verdicts are kept in a JSON file
(``oracle_gallery_cache``, by default ``docs/_build/oracle_gallery.json``) keyed
by a hash of the code they depend on (the library's sources, the catalogue,
this file) and of the versions of numpy, scipy, torch and hypothesis: a second
builder (``-b doctest`` after ``-b html``) reuses them; any change of the code
recomputes them.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import importlib.util
import inspect
import json
import multiprocessing
import os
import re
import resource
import sys
import textwrap
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
CATALOGUE_FILE = ROOT / "tests" / "support" / "broken_kernels.py"
#: The code the verdicts depend on (hashed for the cache).
SOURCES = ("softmaxtheory", "reference", "accelerated")
VERSIONED = ("numpy", "scipy", "torch", "hypothesis", "mpmath")
#: Lines of a failure message shown (the message up to its repro snippet).
MESSAGE_LINES = 7

#: The correct kernels of the gallery: (label, module it needs, framework, dtypes).
CORRECT = (
    ("numpy, max subtracted", "numpy", "numpy", ("float64", "float32")),
    ("scipy.special.softmax", "scipy", "numpy", ("float64",)),
    ("torch.softmax", "torch", "torch", ("float64", "float32", "float16", "bfloat16")),
)


def _catalogue() -> ModuleType:
    """tests/support/broken_kernels.py, imported from its file (not as the ``tests`` package)."""
    name = "_oracle_gallery_broken_kernels"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, CATALOGUE_FILE)
        if spec is None or spec.loader is None:  # pragma: no cover - the file is in the repo
            raise ImportError(f"cannot import {CATALOGUE_FILE}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _have(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _fingerprint() -> str:
    digest = hashlib.sha256()
    files = [Path(__file__).resolve(), CATALOGUE_FILE]
    for folder in SOURCES:
        files.extend(sorted((ROOT / folder).rglob("*.py")))
    for path in files:
        digest.update(path.relative_to(ROOT).as_posix().encode())
        digest.update(path.read_bytes())
    for dist in VERSIONED:
        try:
            digest.update(f"{dist}={importlib.metadata.version(dist)}".encode())
        except importlib.metadata.PackageNotFoundError:
            digest.update(f"{dist}=absent".encode())
    return digest.hexdigest()


def _failure_lines(message: str) -> list[str]:
    """The first lines of a failure message: what failed, before the repro snippet."""
    head = message.split("\nrepro:", 1)[0].splitlines()
    if len(head) > 1 and " " not in head[0].strip():
        head = head[1:]  # the property's own name
    lines = [ln.rstrip() for ln in head if ln.strip()][:MESSAGE_LINES]
    return lines or [message.splitlines()[0] if message else "(no message)"]


def _code(fn: Any) -> str:
    """The source of a function without its docstring (the page shows that as text)."""
    source = textwrap.dedent(inspect.getsource(fn))
    tree = ast.parse(source)
    func = tree.body[0]
    lines = source.splitlines()
    first = func.body[0] if isinstance(func, ast.FunctionDef) and func.body else None
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
        and first.end_lineno is not None
    ):
        del lines[first.lineno - 1 : first.end_lineno]
    return "\n".join(lines).rstrip()


#: The catalogue's correct building blocks: the private helpers they call are shown
#: nowhere (they compute the spec), the others before the kernels that call them.
CORRECT_BLOCKS = ("softmax", "entropy", "adaptive_softmax", "attention", "softmax_attention")


def _helpers(fn: Any, bk: ModuleType) -> list[Any]:
    """The private functions of `bk` that `fn` calls and no correct building block does."""

    def called(f: Any) -> list[Any]:
        found = (f.__globals__.get(n) for n in f.__code__.co_names if n.startswith("_"))
        return [g for g in found if inspect.isfunction(g) and g.__module__ == bk.__name__]

    correct = {g for block in CORRECT_BLOCKS for g in called(getattr(bk, block))}
    return [g for g in dict.fromkeys(called(fn)) if g not in correct]


def _kernel_code(fn: Any, bk: ModuleType) -> str:
    """The kernel's source after that of the defect-carrying helpers it calls."""
    return "\n\n\n".join(_code(g) for g in [*_helpers(fn, bk), fn])


def _run_defect(bk: ModuleType, name: str) -> dict[str, Any]:
    from softmaxtheory import conformance as conf
    from softmaxtheory._check.properties import name_width

    kernel, opts, recorded = bk.CATALOGUE[name]
    record: dict[str, Any] = {
        "name": name,
        "kernel": kernel.__name__,
        "kind": opts.get("kind", "softmax"),
        "dtype": opts.get("dtype", "float64"),
        "framework": opts.get("framework", "numpy"),
        "entropy_eps": opts.get("entropy_eps", 0.0),
        "doc": inspect.getdoc(kernel) or "",
        "source": _kernel_code(kernel, bk),
        "recorded": recorded,
    }
    if record["framework"] == "torch" and not _have("torch"):
        record["status"] = "not run: torch is not installed"
        return record
    target = conf.Target(kernel, f"tests.support.broken_kernels:{kernel.__name__}", **opts)
    ran = []
    for prop in conf.properties_for(target.kind):
        res = conf.run_property(prop, target)
        ran.append(res.status)
        if res.status == "fail":
            record.update(
                status="caught",
                property=prop,
                position=len(ran),
                line=res.line(name_width(target.kind)),
                failure=_failure_lines(res.message),
            )
            return record
    record["status"] = "missed"
    return record


def _correct_kernel(module: str) -> tuple[Any, str, dict[str, Any]]:
    """The kernel, its ``pkg.mod:func`` name and its keyword arguments."""
    if module == "numpy":
        return _catalogue().softmax, "tests.support.broken_kernels:softmax", {}
    if module == "scipy":
        import scipy.special

        return scipy.special.softmax, "scipy.special:softmax", {"axis": -1}
    import torch

    return torch.softmax, "torch:softmax", {"dim": -1}


def _run_correct(label: str, module: str, framework: str, dtype: str) -> dict[str, Any]:
    from softmaxtheory import conformance as conf

    record: dict[str, Any] = {"label": label, "framework": framework, "dtype": dtype}
    if not _have(module):
        record["status"] = f"not run: {module} is not installed"
        return record
    fn, name, kwargs = _correct_kernel(module)
    target = conf.Target(fn, name, framework=framework, dtype=dtype, kwargs=kwargs)
    results = conf.run_conformance(target)
    record["lines"] = [r.line() for r in results]
    record["failed"] = [r.name for r in results if r.status == "fail"]
    record["passed"] = sum(r.status == "pass" for r in results)
    record["skipped"] = sum(r.status == "skip" for r in results)
    record["status"] = "fails" if record["failed"] else "conforms"
    return record


def _one_thread() -> None:
    """In a worker: one thread for numpy's and torch's kernels (the workers share the CPUs)."""
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[name] = "1"


def _task(what: str, args: tuple[Any, ...]) -> dict[str, Any]:
    """One defect class or one correct kernel (run in a worker process)."""
    if what == "defect":
        return _run_defect(_catalogue(), *args)
    return _run_correct(*args)


def compute(jobs: int = 1) -> dict[str, Any]:
    """Run the whole gallery: every defect class (fail-fast) and every correct kernel.

    With ``jobs`` > 1 the runs are shared among that many fresh worker processes (the
    runs are deterministic, so the verdicts do not depend on it).
    """
    tasks = [("defect", (name,)) for name in _catalogue().CATALOGUE]
    tasks += [
        ("correct", (label, module, framework, dtype))
        for label, module, framework, dtypes in CORRECT
        for dtype in dtypes
    ]
    start, cpu = time.perf_counter(), time.process_time()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    if jobs > 1:
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(
            max_workers=jobs, mp_context=context, initializer=_one_thread
        ) as pool:
            # the long runs (the correct kernels) first, so that the workers finish together
            futures = {i: pool.submit(_task, *tasks[i]) for i in reversed(range(len(tasks)))}
            results = [futures[i].result() for i in range(len(tasks))]
    else:
        results = [_task(*t) for t in tasks]
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    child_cpu = (after.ru_utime + after.ru_stime) - (children.ru_utime + children.ru_stime)
    return {
        "defects": [r for (what, _), r in zip(tasks, results, strict=True) if what == "defect"],
        "correct": [r for (what, _), r in zip(tasks, results, strict=True) if what != "defect"],
        "seconds": {
            "wall": time.perf_counter() - start,
            "cpu": time.process_time() - cpu + child_cpu,
            "jobs": jobs,
        },
    }


_MEMO: dict[str, dict[str, Any]] = {}


def gallery(app: Sphinx) -> dict[str, Any]:
    """The gallery's verdicts: from memory, the cache file, or computed now."""
    key = _fingerprint()
    if key in _MEMO:
        return _MEMO[key]
    cache = Path(app.config.oracle_gallery_cache)
    if not cache.is_absolute():
        cache = Path(app.confdir) / cache
    data = None
    if cache.is_file():
        try:
            stored = json.loads(cache.read_text())
        except (OSError, ValueError):
            stored = None
        if isinstance(stored, dict) and stored.get("key") == key:
            data = stored["gallery"]
            logger.info("oracle gallery: verdicts reused from %s", cache)
    if data is None:
        jobs = app.config.oracle_gallery_jobs or min(2, os.cpu_count() or 1)
        data = compute(jobs)
        took = data["seconds"]
        logger.info(
            "oracle gallery: %d defect classes and %d correct kernels in %.1f s "
            "(%.1f s of CPU, %d process(es))",
            len(data["defects"]),
            len(data["correct"]),
            took["wall"],
            took["cpu"],
            jobs,
        )
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps({"key": key, "gallery": data}, indent=1) + "\n")
        except OSError as exc:  # a read-only tree still builds
            logger.info("oracle gallery: cache not written (%s)", exc)
    _MEMO[key] = data
    return data


def _ordinal(n: int) -> str:
    return {1: "first", 2: "second", 3: "third", 4: "fourth", 5: "fifth"}.get(n, f"{n}th")


def _title(name: str) -> str:
    return name[0].upper() + name[1:]


def _anchor(name: str) -> str:
    return "oracle-" + nodes.make_id(name)


def _literal(text: str) -> str:
    return "``" + text.replace("`", "'") + "``"


def _defect_text(doc: str) -> str:
    """A kernel's docstring as one paragraph of text (its literal bits as code).

    ````x```` and a role's target (``:func:`name```) become inline literals; the rest is
    plain text (asterisks and stray backquotes escaped).
    """
    text = " ".join(doc.split())
    text = text.removeprefix("Defect: ")
    text = text[0].upper() + text[1:] if text else text
    text = re.sub(r":\w+:`~?([^`]+)`", r"``\1``", text)
    parts = text.split("``")
    if len(parts) % 2 == 0:  # an unpaired ``: all plain text
        parts = [text]
    return "".join(
        _literal(part) if i % 2 else part.replace("*", "\\*").replace("`", "'")
        for i, part in enumerate(parts)
    )


def _command(d: dict[str, Any]) -> str:
    """The ``softmaxtheory check`` command line that checks a catalogue kernel."""
    words = ["softmaxtheory check", f"tests.support.broken_kernels:{d['kernel']}"]
    if d["kind"] != "softmax":
        words.append(f"--kind {d['kind']}")
    if d["framework"] != "numpy":
        words.append(f"--framework {d['framework']}")
    default = "float32" if d["framework"] == "torch" else "float64"
    if d["dtype"] != default:
        words.append(f"--dtype {d['dtype']}")
    if d.get("entropy_eps"):
        words.append(f"--entropy-eps {d['entropy_eps']:g}")
    return " ".join(words)


def _defects_rst(data: dict[str, Any]) -> list[str]:
    defects = data["defects"]
    caught = [d for d in defects if d["status"] == "caught"]
    out = [
        f"Of the {len(defects)} defect classes, the default run caught {len(caught)} "
        "when these pages were built:",
        "",
        ".. list-table::",
        "   :header-rows: 1",
        "   :widths: auto",
        "   :class: oracle-summary",
        "",
        "   * - Defect",
        "     - Caught by",
        "     - Kernel",
    ]
    for d in defects:
        verdict = _literal(d["property"]) if d["status"] == "caught" else d["status"]
        out += [
            # (a "<" in the title would end it: docutils reads "title <target>")
            f"   * - :ref:`{_title(d['name']).replace('<', chr(92) + '<')} <{_anchor(d['name'])}>`",
            f"     - {verdict}",
            f"     - {d['kind']}, {d['dtype']}, {d['framework']}",
        ]
    out.append("")
    for d in defects:
        title = _title(d["name"])
        out += [f".. _{_anchor(d['name'])}:", "", title, "~" * len(title), ""]
        out += [_defect_text(d["doc"]), ""]
        out += [
            "From the repository's root:",
            "",
            ".. code-block:: console",
            "",
            "   $ " + _command(d),
            "",
        ]
        out += [".. code-block:: python", ""]
        out += ["   " + ln if ln else "" for ln in d["source"].splitlines()]
        out.append("")
        if d["status"] != "caught":
            out += [f"**Verdict:** {d['status']}.", ""]
            continue
        out += [
            f"**Caught by** {_literal(d['property'])}, the {_ordinal(d['position'])} property "
            "of the run. The first lines of its report:",
            "",
            ".. code-block:: text",
            "   :class: oracle-verdict",
            "",
            "   " + d["line"],
        ]
        out += ["   " + ln for ln in d["failure"]]
        out.append("")
    return out


def _correct_rst(data: dict[str, Any]) -> list[str]:
    out = [
        ".. list-table::",
        "   :header-rows: 1",
        "   :widths: auto",
        "   :class: oracle-correct",
        "",
        "   * - Kernel",
        "     - dtype",
        "     - Default run",
    ]
    for c in data["correct"]:
        if c["status"] == "conforms":
            verdict = f"conforms, {c['passed']} properties pass"
            if c["skipped"]:
                verdict += f", {c['skipped']} skipped"
        elif c["status"] == "fails":
            verdict = "fails: " + ", ".join(_literal(n) for n in c["failed"])
        else:
            verdict = c["status"]
        out += [f"   * - {c['label']}", f"     - {c['dtype']}", f"     - {verdict}"]
    out.append("")
    shown = next((c for c in data["correct"] if c.get("lines")), None)
    if shown is not None:
        out += [
            f"The report of the first, {shown['label']} in {shown['dtype']}, property by property:",
            "",
            ".. code-block:: text",
            "   :class: oracle-verdict oracle-pass",
            "",
        ]
        out += ["   " + ln for ln in shown["lines"]]
        out.append("")
    return out


class _GalleryDirective(SphinxDirective):
    has_content = False

    def lines(self, data: dict[str, Any]) -> list[str]:  # pragma: no cover - abstract
        raise NotImplementedError

    def run(self) -> list[nodes.Node]:
        self.env.note_dependency(str(CATALOGUE_FILE))
        self.env.note_dependency(__file__)
        try:
            data = gallery(self.env.app)
        except Exception as exc:  # the build warns (and fails under -W)
            logger.warning(
                "oracle gallery: running the suite failed: %s: %s",
                type(exc).__name__,
                exc,
                location=self.get_location(),
            )
            return []
        # inserted into the page's own input, so that the gallery's sections are sections
        # of the page (and of its table of contents)
        source = self.get_source_info()[0] or "<oracle-gallery>"
        self.state_machine.insert_input(StringList(self.lines(data), source), source)
        return []


class OracleGalleryDirective(_GalleryDirective):
    """The broken kernels of the catalogue, each with the property that caught it."""

    def lines(self, data: dict[str, Any]) -> list[str]:
        return _defects_rst(data)


class OracleCorrectDirective(_GalleryDirective):
    """The correct kernels and the verdicts of their default runs."""

    def lines(self, data: dict[str, Any]) -> list[str]:
        return _correct_rst(data)


def setup(app: Sphinx) -> dict[str, Any]:
    """Register the directives and ``oracle_gallery_cache``."""
    app.add_config_value(
        "oracle_gallery_cache", "_build/oracle_gallery.json", "env", types=[str, Path]
    )
    # worker processes of the run; 0: min(2, the number of CPUs)
    app.add_config_value("oracle_gallery_jobs", 0, "", types=[int])
    app.add_directive("oracle-gallery", OracleGalleryDirective)
    app.add_directive("oracle-gallery-correct", OracleCorrectDirective)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
