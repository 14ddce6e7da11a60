"""tools/check_pages.py finds each kind of broken page in headless Chromium, and passes good ones.

A small hand-written site (no Sphinx build) with the offline MathJax of sphinx-mathjax-offline:
one good page and one page per defect. Skips only where /usr/bin/chromium is absent (CI
installs it with apt).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "check_pages.py"
CHROMIUM = Path("/usr/bin/chromium")

needs_chromium = pytest.mark.skipif(not CHROMIUM.exists(), reason="needs /usr/bin/chromium (apt)")


def _mathjax_dir() -> Path:
    try:
        files = importlib.metadata.files("sphinx-mathjax-offline") or []
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("needs sphinx-mathjax-offline (the docs extra)")
    for f in files:
        if f.name == "tex-chtml.js" and f.parent.name == "mathjax":
            return Path(str(f.locate())).resolve().parent
    raise AssertionError("sphinx-mathjax-offline ships no mathjax/tex-chtml.js")


def _png(width: int, height: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    raw = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


MATHJAX = '<script defer src="../_static/mathjax/tex-chtml.js?v=1"></script>'


def _page(body: str, head: str = MATHJAX) -> str:
    return (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>t</title>{head}</head>'
        f"<body>{body}</body></html>"
    )


PAGES = {
    "good": _page(
        '<h1 id="top">Good</h1><p>Inline <span class="math notranslate">\\(x^2 + \\beta\\)</span>'
        ' and <a href="#top">here</a>, <a href="other.html#sec">there</a>,'
        ' <a href="../index.html">home</a>, <a href="https://example.org/x">out</a>.</p>'
        '<div class="math notranslate">\\[\\sum_{k=1}^n \\alpha_k = 1\\]</div>'
        '<img src="../_images/fig.png" alt="a figure"><img src="../_images/fig.svg" alt="svg">'
        "<pre>\\(not math in code\\)</pre>"
    ),
    "other": _page('<h2 id="sec">Section</h2><p>Plain.</p>'),
    "broken_links": _page(
        '<p id="here"><a href="missing.html">a</a> <a href="other.html#nope">b</a>'
        ' <a href="#absent">c</a> <a href="#here">ok</a></p>'
    ),
    "bad_images": _page(
        '<img src="../_images/nothere.png" alt="x"><img src="../_images/corrupt.png" alt="y">'
    ),
    "raw_tex": _page(
        '<p>Unrendered <span class="math">\\(a + b\\)</span> and \\(c\\) and \\beta.</p>', head=""
    ),
    "remote_mathjax": _page(
        '<p><span class="math">\\(a\\)</span></p>',
        head='<script defer src="https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-chtml.js">'
        "</script>",
    ),
    "tex_error": _page(
        '<p><span class="math">\\(\\frac{1}{\\undefinedmacro}\\)</span>'
        '<span class="math">\\(\\frac{1}\\)</span></p>'
    ),
    "computed_error": _page(
        '<p><span class="computed computed-error">[computed: error]</span></p>'
    ),
    "js_error": _page('<p>x</p><script>throw new Error("boom from the page")</script>'),
    # a table of one long unbreakable line: wider than a phone, and the page scrolls sideways
    "overflow": _page(
        '<table id="wide"><tr><td style="white-space: nowrap">'
        + "wide " * 100
        + "</td></tr></table>"
    ),
    # the same table in a box of its own that scrolls: neither problem
    "boxed": _page(
        '<div style="overflow-x: auto"><table><tr><td style="white-space: nowrap">'
        + "wide " * 100
        + "</td></tr></table></div><p>Issue of the journal, Section 4 of the paper, the design"
        " of a kernel, issues of float16, 3 issues.</p>"
    ),
    # a 700 px image with no max-width: fits at 1280 px, not at 390 px
    "wide_image": _page('<img src="../_images/wide.png" alt="w" style="width: 700px">'),
    "internal": _page(
        "<p>Against the targets of issue 4, see DESIGN.md and DESIGN §7; the §4 tier.</p>"
        "<pre>TODO: issue #12</pre>"
    ),
}


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    html = tmp_path_factory.mktemp("site") / "html"
    (html / "theory").mkdir(parents=True)
    (html / "_static").mkdir()
    (html / "_static" / "mathjax").symlink_to(_mathjax_dir(), target_is_directory=True)
    (html / "_images").mkdir()
    (html / "_images" / "fig.png").write_bytes(_png(4, 3))
    (html / "_images" / "wide.png").write_bytes(_png(70, 2))
    (html / "_images" / "fig.svg").write_text(
        '<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10">'
        '<rect width="10" height="10"/></svg>'
    )
    (html / "_images" / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 30)
    (html / "index.html").write_text(_page("<p>Home</p>", head=""))
    for name, text in PAGES.items():
        (html / "theory" / f"{name}.html").write_text(text)
    return html


@pytest.fixture(scope="module")
def report(site) -> tuple[int, dict[str, list[str]], str]:
    res = subprocess.run(
        [sys.executable, str(TOOL), str(site), "--timeout", "20", "-v"],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    problems: dict[str, list[str]] = {}
    for line in res.stdout.splitlines():
        page, sep, rest = line.partition(": [")
        if sep:
            problems.setdefault(page, []).append("[" + rest)
    return res.returncode, problems, res.stdout + res.stderr


@needs_chromium
def test_the_tool_fails_and_passes_the_good_pages(report):
    rc, problems, out = report
    assert rc == 1, out
    assert "theory/good.html" not in problems, out
    assert "theory/other.html" not in problems, out
    assert "theory/good.html: 2 math element(s), MathJax 3." in out
    # its own summary line: bad_images.html has two images as well
    assert re.search(
        r"^theory/good\.html: 2 math element\(s\), MathJax 3\.[^,]*, 2 image\(s\), ", out, re.M
    ), out
    assert f"check_pages: {len(PAGES)} page(s) checked" in out


def _has(problems: dict[str, list[str]], page: str, kind: str, text: str) -> bool:
    return any(p.startswith(f"[{kind}]") and text in p for p in problems.get(f"theory/{page}", []))


@needs_chromium
def test_broken_internal_links(report):
    _, problems, out = report
    assert _has(
        problems, "broken_links.html", "link", "missing.html: theory/missing.html does not"
    ), out
    assert _has(problems, "broken_links.html", "link", "other.html#nope: no id 'nope'"), out
    assert _has(problems, "broken_links.html", "link", "#absent: no id 'absent'"), out
    assert len(problems["theory/broken_links.html"]) == 3, out


@needs_chromium
def test_missing_and_invalid_images(report):
    _, problems, out = report
    assert _has(problems, "bad_images.html", "image", "nothere.png: file is missing"), out
    assert _has(problems, "bad_images.html", "image", "corrupt.png: PNG without an IHDR"), out
    assert _has(problems, "bad_images.html", "image", "nothere.png did not load in the browser"), (
        out
    )
    assert _has(problems, "bad_images.html", "image", "corrupt.png did not load in the browser"), (
        out
    )


@needs_chromium
def test_raw_tex(report):
    _, problems, out = report
    assert _has(problems, "raw_tex.html", "mathjax", "has math but loads no MathJax"), out
    assert _has(
        problems, "raw_tex.html", "math", "math not rendered by MathJax: '\\\\(a + b\\\\)'"
    ), out
    assert _has(problems, "raw_tex.html", "math", "raw TeX left in the text"), out
    assert any("\\\\beta" in p for p in problems["theory/raw_tex.html"]), out


@needs_chromium
def test_mathjax_from_a_url(report):
    _, problems, out = report
    page = "remote_mathjax.html"
    assert _has(problems, page, "remote", "loads https://cdn.jsdelivr.net"), out
    assert _has(problems, page, "mathjax", "not from the local _static folder"), out
    assert _has(problems, page, "network", "request to https://cdn.jsdelivr.net"), out
    assert _has(problems, page, "math", "math not rendered"), out


@needs_chromium
def test_tex_errors_computed_errors_and_javascript_errors(report):
    _, problems, out = report
    assert _has(problems, "tex_error.html", "math", "undefined TeX macro (drawn in red)"), out
    assert any("\\undefinedmacro" in p for p in problems["theory/tex_error.html"]), out
    assert _has(problems, "tex_error.html", "math", "MathJax TeX error: Missing argument"), out
    assert _has(problems, "computed_error.html", "computed", "1 [computed: error]"), out
    assert _has(problems, "js_error.html", "javascript", "boom from the page"), out


def test_usage_errors(tmp_path):
    res = subprocess.run(
        [sys.executable, str(TOOL), str(tmp_path)], capture_output=True, text=True, check=False
    )
    assert res.returncode == 2
    assert "not a built site" in res.stderr
    (tmp_path / "index.html").write_text("<html></html>")
    res = subprocess.run(
        [sys.executable, str(TOOL), str(tmp_path)], capture_output=True, text=True, check=False
    )
    assert res.returncode == 2
    assert "no pages under" in res.stderr


def _tool():
    spec = importlib.util.spec_from_file_location("check_pages", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_pages"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_literal_numbers_are_found_outside_computed_values(tmp_path):
    page = tmp_path / "p.html"
    page.write_text(
        _page(
            '<p>Typed 2.4213877066 and <span class="computed">5.9445</span>, n = 4096,'
            ' version 3.2.2, <span class="math">\\(\\beta = 0.1503125\\)</span>,'
            ' <code>0.12345</code>, <span class="computed math">\\(0.3300\\)</span></p>'
            '<div class="highlight"><pre>&gt;&gt;&gt; 0.330030</pre></div>'
            '<table class="computed-table"><tr><td>7.3775</td></tr></table><p>1.5 and 0.25</p>'
        )
    )
    found = _tool().literal_numbers(page)
    assert len(found) == 2, found
    assert "2.4213877066" in found[0]
    assert "0.1503125" in found[1]


@needs_chromium
def test_literal_numbers_flag_fails_the_check(tmp_path):
    (tmp_path / "theory").mkdir()
    (tmp_path / "index.html").write_text(_page("<p>Home</p>", head=""))
    (tmp_path / "theory" / "n.html").write_text(_page("<p>beta max 2.4213877066</p>", head=""))
    args = [sys.executable, str(TOOL), str(tmp_path)]
    res = subprocess.run(args, capture_output=True, text=True, check=False, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    res = subprocess.run(
        [*args, "--literal-numbers"], capture_output=True, text=True, check=False, timeout=300
    )
    assert res.returncode == 1
    assert "theory/n.html: [number] typed, not computed: ...beta max 2.4213877066..." in res.stdout


@needs_chromium
def test_literal_section_checks_numbers_of_its_pages_only(tmp_path):
    """One run checks every page, and looks for typed numbers under the named folder only."""
    for folder in ("theory", "api"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "n.html").write_text(_page("<p>beta max 2.4213877066</p>", head=""))
    (tmp_path / "index.html").write_text(_page("<p>Home</p>", head=""))
    args = [sys.executable, str(TOOL), str(tmp_path), "--all", "--literal-section", "theory"]
    res = subprocess.run(args, capture_output=True, text=True, check=False, timeout=300)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "theory/n.html: [number] typed, not computed: ...beta max 2.4213877066..." in res.stdout
    assert "api/n.html:" not in res.stdout
    assert "check_pages: 3 page(s) checked, 1 problem(s) on 1 page(s)" in res.stdout


def test_a_literal_section_without_pages_is_an_error(tmp_path):
    (tmp_path / "theory").mkdir()
    (tmp_path / "theory" / "n.html").write_text(_page("<p>x</p>", head=""))
    (tmp_path / "index.html").write_text(_page("<p>Home</p>", head=""))
    res = subprocess.run(
        [sys.executable, str(TOOL), str(tmp_path), "--literal-section", "guides"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 2
    assert f"no pages under {tmp_path.resolve()} in guides" in res.stderr


@needs_chromium
def test_layout_overflow_at_a_laptop_and_a_phone(report):
    """The page scrolling sideways, and a table or image wider than its column, are found."""
    _, problems, out = report
    assert _has(problems, "overflow.html", "layout", "at 1280 px the page scrolls sideways"), out
    assert _has(problems, "overflow.html", "layout", "at 390 px the page scrolls sideways"), out
    assert _has(problems, "overflow.html", "layout", "at 390 px table in #wide:"), out
    assert _has(problems, "wide_image.html", "layout", "at 390 px img ../_images/wide.png"), out
    assert not _has(problems, "wide_image.html", "layout", "at 1280 px"), out
    # a wide table in a box that scrolls is allowed; so are plain words
    assert "theory/boxed.html" not in problems, out


@needs_chromium
def test_internal_words_fail_the_page(report):
    _, problems, out = report
    found = problems["theory/internal.html"]
    assert _has(problems, "internal.html", "internal", "an issue number 'issue 4'"), out
    assert _has(problems, "internal.html", "internal", "the design file 'DESIGN.md'"), out
    assert _has(problems, "internal.html", "internal", "a design-file section sign '§7'"), out
    assert _has(problems, "internal.html", "internal", "a design-file section sign '§4'"), out
    assert _has(problems, "internal.html", "internal", "a work-in-progress marker 'TODO'"), out
    # code is read too: the page has no code exemption for internal words
    assert _has(problems, "internal.html", "internal", "an issue number 'issue #12'"), out
    assert len(found) == 7, found


def test_internal_words_spare_the_papers_words(tmp_path):
    page = tmp_path / "p.html"
    page.write_text(
        _page(
            "<p>An issue of the journal; Section 4 of the paper; the design of the kernel;"
            " numerical issues; Design notes; <code>tissue 4</code>; see #top.</p>"
            "<script>var issue4 = 'issue 4 DESIGN.md';</script>"
            "<style>/* issue 4 */</style>"
        )
    )
    assert _tool().internal_words(page) == []
    page.write_text(_page('<p>x</p><img src="a.png" alt="figure for issue 7">'))
    assert _tool().internal_words(page) == [
        "an issue number 'issue 7': ...t x figure for issue 7..."
    ]
