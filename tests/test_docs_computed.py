"""The docs' build-time values (docs/_ext/computed.py) and figures (the plot directive).

Each test builds a tiny Sphinx project into tmp_path with ``-W`` in a subprocess, the way
the real docs are built, and reads the HTML.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("sphinx")
pytest.importorskip("docutils")  # docs/_ext imports it at module level

from softmaxtheory import bounds

ROOT = Path(__file__).resolve().parent.parent
EXT = ROOT / "docs" / "_ext"

CONF = f"""
import sys
sys.path.insert(0, {str(EXT)!r})
extensions = ["sphinx.ext.mathjax", "matplotlib.sphinxext.plot_directive", "computed"]
root_doc = "index"
nitpicky = True
html_theme = "basic"
plot_pre_code = (
    "import numpy as np\\nimport matplotlib.pyplot as plt\\nfrom softmaxtheory import bounds"
)
plot_formats = [("png", 60)]
plot_html_show_source_link = False
plot_html_show_formats = False
"""


def _sphinx(src: Path, out: Path, builder: str = "html") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", builder, src, out],
        capture_output=True,
        text=True,
        check=False,
    )


def _build(tmp_path: Path, pages: dict[str, str], builder: str = "html"):
    src = tmp_path / "src"
    src.mkdir()
    (src / "conf.py").write_text(CONF)
    for name, text in pages.items():
        (src / f"{name}.rst").write_text(textwrap.dedent(text))
    out = tmp_path / "out"
    return _sphinx(src, out, builder), out


def _text(html: str) -> str:
    return re.sub(r"<[^>]+>", "", html)


GOOD = """
Page
====

.. computed-setup::

   n, spread = 16, 2.0
   top = bounds.max_coefficient(n, spread)

The top coefficient is :computed:`f"{top:.6f}"` for :computed:`n` items,
pi is :computed:`f"{math.pi:.4f}"`, numpy says :computed:`int(np.sum(np.arange(4)))`,
and as math :computed-math:`rf"\\alpha_{{\\max}} = {top:.3f}"`.

.. computed-math::

   \\beta_{\\max} = {{ f"{bounds.adaptive_beta_max():.6f}" }}

.. computed-table:: Largest coefficients
   :widths: 1 2

   [("n", "max")] + [(m, f"{bounds.max_coefficient(m, spread):.5f}") for m in (4, 64)]

.. computed-rst::

   "\\n".join(f"* item {k}" for k in range(3))

.. plot::

   xs = np.arange(2, 50)
   plt.plot(xs, bounds.max_coefficient(xs, 2.0))
"""


def test_values_tables_math_and_figures_are_computed(tmp_path):
    res, out = _build(tmp_path, {"index": GOOD})
    assert res.returncode == 0, res.stdout + res.stderr
    html = (out / "index.html").read_text()
    text = _text(html)
    top = bounds.max_coefficient(16, 2.0)
    assert f"The top coefficient is {top:.6f} for 16 items" in text
    assert "pi is 3.1416" in text
    assert "numpy says 6" in text
    assert f"\\alpha_{{\\max}} = {top:.3f}" in html
    assert f"\\beta_{{\\max}} = {bounds.adaptive_beta_max():.6f}" in html
    assert "{{" not in html
    assert "Largest coefficients" in text
    for m in (4, 64):
        assert f"{bounds.max_coefficient(m, 2.0):.5f}" in text
    assert text.count("item ") >= 3
    pngs = list((out / "_images").glob("*.png"))
    assert pngs, "the plot directive wrote no figure"
    assert pngs[0].read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert 'src="_images/' in html
    assert "[computed: error]" not in html


def test_setup_names_are_private_to_a_page(tmp_path):
    pages = {
        "index": """
            Index
            =====

            .. toctree::

               other

            .. computed-setup::

               secret = 41

            Here :computed:`secret + 1`.
            """,
        "other": """
            Other
            =====

            There :computed:`secret`.
            """,
    }
    res, out = _build(tmp_path, pages)
    assert res.returncode != 0
    assert "other.rst:5" in res.stderr
    assert "NameError" in res.stderr and "secret" in res.stderr
    assert "Here 42." in _text((out / "index.html").read_text())
    assert "[computed: error]" in (out / "other.html").read_text()


def test_mpmath_precision_does_not_leak_between_pages(tmp_path):
    pages = {
        "index": """
            Index
            =====

            .. toctree::

               other

            .. computed-setup::

               mpmath.mp.dps = 50

            Digits :computed:`mpmath.mp.dps`, third :computed:`mpmath.mpf(1) / 3`.
            """,
        "other": """
            Other
            =====

            Bits :computed:`mpmath.mp.prec`.
            """,
    }
    res, out = _build(tmp_path, pages)
    assert res.returncode == 0, res.stderr
    assert "Digits 50, third 0." + "3" * 50 + "." in _text((out / "index.html").read_text())
    assert "Bits 53." in _text((out / "other.html").read_text())


def test_a_page_with_computed_values_is_read_again_on_every_build(tmp_path):
    """Only the value changes between two builds into the same folder, not the page."""
    value = tmp_path / "value.txt"
    value.write_text("first")
    page = (
        "Title\n=====\n\n"
        f"The value is :computed:`__import__('pathlib').Path({str(value)!r}).read_text()`.\n"
    )
    res, out = _build(tmp_path, {"index": page})
    assert res.returncode == 0, res.stdout + res.stderr
    assert "The value is first." in _text((out / "index.html").read_text())
    value.write_text("second")
    res = _sphinx(tmp_path / "src", out)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "The value is second." in _text((out / "index.html").read_text())


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (":computed:`1 / 0`", "ZeroDivisionError"),
        (":computed:`bounds.no_such_function(3)`", "AttributeError"),
        (":computed:`f'{1.5:.2q}'`", "ValueError"),
        (":computed:`(`", "SyntaxError"),
        (":computed:`print(3)`", "gave None"),
        (":computed-math:`undefined_name`", "NameError"),
        (".. computed-setup::\n\n   raise RuntimeError('boom')", "RuntimeError: boom"),
        (".. computed-math::\n\n   x = {{ 1 / 0 }}", "ZeroDivisionError"),
        (".. computed-table::\n\n   [(1, 2), (3,)]", "same, non-zero number of cells"),
        (".. computed-table::\n\n   5", "iterable of sequences"),
        (".. computed-table::\n   :widths: 1 2 3\n\n   [(1, 2)]", ":widths: has 3 values"),
        (".. computed-rst::\n\n   42", "not str"),
        (".. plot::\n\n   plt.plot(bounds.max_coefficient(0, 1.0))", "Exception occurred"),
    ],
)
def test_a_failing_expression_fails_the_build_with_page_and_line(tmp_path, body, message):
    page = "Title\n=====\n\nSome text.\n\n" + body + "\n"
    res, out = _build(tmp_path, {"index": page})
    assert res.returncode != 0, res.stdout + res.stderr
    assert message in res.stderr, res.stderr
    assert re.search(r"index\.rst:\d+", res.stderr), res.stderr
    if "plot::" not in body:
        assert "[computed: error]" in (out / "index.html").read_text()


def test_the_real_conf_registers_the_machinery():
    conf = (ROOT / "docs" / "conf.py").read_text()
    for ext in ('"computed"', '"matplotlib.sphinxext.plot_directive"', '"theorem_tests"'):
        assert ext in conf
    namespace: dict = {"__file__": str(ROOT / "docs" / "conf.py")}
    exec(compile(conf, "conf.py", "exec"), namespace)
    assert namespace["plot_include_source"] is False
    assert namespace["plot_html_show_source_link"] is False
    ns: dict = {}
    exec(namespace["computed_preamble"], ns)
    exec(namespace["plot_pre_code"], ns)
    for name in ("math", "np", "mpmath", "softmaxtheory", "bounds", "reference", "spec", "plt"):
        assert name in ns
    assert ns["DOCS"] == ROOT / "docs"
    # math offline: MathJax from the bundled copy, never a URL
    assert "sphinx-mathjax-offline" in namespace["extensions"]
    assert "://" not in namespace["mathjax_path"]
    assert namespace["nitpicky"] is True
