#!/usr/bin/env python3
r"""Check built documentation pages in headless Chromium, from disk, offline.

Usage::

    python tools/check_pages.py docs/_build/html            # theory/, guides/, experiments/
    python tools/check_pages.py docs/_build/html --all      # every page
    python tools/check_pages.py docs/_build/html --section theory --section api
    python tools/check_pages.py docs/_build/html --all --literal-section theory

Each selected page is opened as a ``file://`` URL in one headless Chromium
(``/usr/bin/chromium`` by default, or ``--chromium`` / ``$CHROMIUM``), driven
over the DevTools protocol on a pipe (``--remote-debugging-pipe``; no port, no
network). After the load event the check waits for MathJax's startup promise
(typesetting done) and for every image, then reads the live page. A page fails
when

* math is left unrendered: an element of class ``math`` holds no
  ``mjx-container``, TeX delimiters (``\(``, ``\)``, ``\[``, ``\]``, ``$$``) or
  common TeX commands (``\beta``, ``\frac`` ...) remain in the text outside
  code, or MathJax reports a TeX error (``mjx-merror``);
* MathJax is not loaded from the site's own ``_static`` folder (a page with math
  needs a local ``mathjax`` script that exists on disk), or any script,
  stylesheet or image is referenced by a remote URL, or the page makes a
  request to anything but ``file:``/``data:``/``blob:``/``about:``;
* an image is missing on disk, is not a valid PNG / JPEG / GIF / SVG file, or
  has no natural size in the browser; any other resource fails to load;
* an internal link is broken: the target file does not exist (or is outside
  the site), or its ``#anchor`` is not an ``id`` (or ``<a name>``) of the target;
* the page raises a JavaScript exception, or shows ``[computed: error]`` (a
  value of docs/_ext/computed.py that failed);
* the layout overflows (``--no-layout`` skips this): at a window 1280 px wide and
  at 390 px (a phone), ``document.documentElement.scrollWidth`` exceeds the
  viewport's width (the page scrolls sideways), or a table, figure or image is
  wider than its column without sitting in a box of its own that scrolls
  (``overflow-x: auto``) inside that column;
* internal words reach the reader: the page's text names how the project is
  organised internally (issue numbers such as "issue 4", the design and style
  files, design-file section signs such as "§4"; see :data:`INTERNAL_WORDS`);
* with ``--literal-numbers`` (every checked page) or ``--literal-section
  FOLDER`` (the pages of that folder; repeatable) only: the page's text or math
  holds a decimal number with three or more digits after the point that was
  typed in the source instead of computed at build time (outside ``.computed``
  / ``.computed-table`` elements, code, literal blocks and doctests).

Exit status: 0 when every page passes, 1 when a problem was found (each is
printed as ``page: [kind] detail``), 2 when the check could not run (no
Chromium, no pages, the browser failed).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import re
import select
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

DEFAULT_SECTIONS = ("theory", "guides", "experiments")
DEFAULT_CHROMIUM = "/usr/bin/chromium"
LOCAL_SCHEMES = ("file:", "data:", "blob:", "about:", "chrome:", "devtools:")
EXTERNAL_SCHEMES = {"http", "https", "mailto", "ftp", "tel", "irc", "news"}


@dataclass(frozen=True)
class Problem:
    """One failure found on one page."""

    page: str
    kind: str
    detail: str

    def __str__(self) -> str:
        return f"{self.page}: [{self.kind}] {self.detail}"


# -- the static HTML -----------------------------------------------------------------------


@dataclass
class StaticPage:
    """What the HTML file on disk references and defines."""

    ids: set[str] = field(default_factory=set)
    links: list[str] = field(default_factory=list)
    images: list[str] = field(default_factory=list)
    scripts: list[str] = field(default_factory=list)
    stylesheets: list[str] = field(default_factory=list)
    has_math: bool = False


class _Parser(HTMLParser):
    def __init__(self, page: StaticPage) -> None:
        super().__init__(convert_charrefs=True)
        self.page = page

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: (v or "") for k, v in attrs}
        if "id" in a:
            self.page.ids.add(a["id"])
        if tag == "a" and "name" in a:
            self.page.ids.add(a["name"])
        if tag == "a" and "href" in a:
            self.page.links.append(a["href"])
        elif tag == "img" and "src" in a:
            self.page.images.append(a["src"])
        elif tag == "script" and a.get("src"):
            self.page.scripts.append(a["src"])
        elif tag == "link" and "stylesheet" in a.get("rel", "").split() and a.get("href"):
            self.page.stylesheets.append(a["href"])
        if "math" in a.get("class", "").split():
            self.page.has_math = True

    handle_startendtag = handle_starttag


_STATIC_CACHE: dict[Path, StaticPage] = {}


def parse_static(path: Path) -> StaticPage:
    """Parse (and cache) one HTML file."""
    path = path.resolve()
    if path not in _STATIC_CACHE:
        page = StaticPage()
        _Parser(page).feed(path.read_text(encoding="utf-8", errors="replace"))
        _STATIC_CACHE[path] = page
    return _STATIC_CACHE[path]


def _is_remote(url: str) -> bool:
    parts = urlsplit(url)
    return bool(parts.netloc) or parts.scheme in {"http", "https", "ftp"}


def _local_target(page: Path, url: str) -> tuple[Path | None, str]:
    """The file a relative URL points at (None: same page) and its fragment."""
    parts = urlsplit(url)
    path = unquote(parts.path)
    if not path:
        return None, unquote(parts.fragment)
    target = (page.parent / path) if not path.startswith("/") else Path(path)
    if path.endswith("/"):
        target = target / "index.html"
    return Path(os.path.normpath(target)), unquote(parts.fragment)


def image_problem(path: Path) -> str | None:
    """Why `path` is not a displayable image file, or None."""
    if not path.is_file():
        return "file is missing"
    data = path.read_bytes()
    if not data:
        return "file is empty"
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        if len(data) < 24 or data[12:16] != b"IHDR":
            return "PNG without an IHDR header"
        width, height = struct.unpack(">II", data[16:24])
        return None if width and height else f"PNG of size {width}x{height}"
    if data.startswith(b"\xff\xd8\xff") or data[:6] in (b"GIF87a", b"GIF89a"):
        return None
    if path.suffix.lower() == ".svg":
        try:
            root = ET.fromstring(data)
        except ET.ParseError as exc:
            return f"SVG does not parse: {exc}"
        return None if root.tag.rsplit("}", 1)[-1] == "svg" else f"root element {root.tag!r}"
    return "not a PNG, JPEG, GIF or SVG file"


def _data_uri_problem(url: str) -> str | None:
    head, _, payload = url.partition(",")
    if ";base64" in head:
        try:
            base64.b64decode(payload, validate=True)
        except ValueError:
            return "data: URI with invalid base64"
    return None if payload else "empty data: URI"


def static_problems(root: Path, page: Path) -> list[Problem]:
    """Links, images and resources of one page, checked on disk."""
    name = page.relative_to(root).as_posix()
    info = parse_static(page)
    problems: list[Problem] = []

    def add(kind: str, detail: str) -> None:
        problems.append(Problem(name, kind, detail))

    for url in info.scripts + info.stylesheets:
        if _is_remote(url):
            add("remote", f"loads {url} from the network")
        elif not url.startswith("data:"):
            target, _ = _local_target(page, url.split("?", 1)[0])
            if target is not None and not target.is_file():
                add("resource", f"{url} is missing")
    if info.has_math:
        mathjax = [s for s in info.scripts if "mathjax" in s.lower()]
        if not mathjax:
            add("mathjax", "the page has math but loads no MathJax script")
        for url in mathjax:
            target, _ = _local_target(page, url.split("?", 1)[0])
            if _is_remote(url) or target is None:
                add("mathjax", f"MathJax is loaded from {url}, not from the local _static folder")
            elif (root / "_static") not in target.parents:
                add("mathjax", f"MathJax {url} is not under {root / '_static'}")
    for url in info.images:
        if url.startswith("data:"):
            problem = _data_uri_problem(url)
            if problem:
                add("image", problem)
            continue
        if _is_remote(url):
            add("remote", f"image {url} is loaded from the network")
            continue
        target, _ = _local_target(page, url)
        problem = image_problem(target) if target is not None else "empty src"
        if problem:
            add("image", f"{url}: {problem}")
    for url in info.links:
        parts = urlsplit(url)
        if parts.scheme in EXTERNAL_SCHEMES or parts.netloc or parts.scheme == "javascript":
            continue
        if parts.scheme:
            add("link", f"{url}: scheme {parts.scheme!r} is not a link within the site")
            continue
        target, fragment = _local_target(page, url)
        if target is None:
            target = page.resolve()
        if root.resolve() not in target.resolve().parents:
            add("link", f"{url}: points outside the built site")
            continue
        if not target.exists():
            add("link", f"{url}: {target.relative_to(root.resolve())} does not exist")
            continue
        if target.is_dir():
            add("link", f"{url}: is a folder without index.html")
            continue
        if fragment and target.suffix == ".html" and fragment not in parse_static(target).ids:
            add("link", f"{url}: no id {fragment!r} in {target.relative_to(root.resolve())}")
    return problems


# -- numbers typed into a page ----------------------------------------------------------------

_NUMBER = re.compile(r"(?<![\w.])\d+\.\d{3,}(?:[eE][-+]?\d+)?(?![\w.])")
_SKIP_TAGS = {"script", "style", "pre", "code", "kbd", "samp", "tt", "textarea", "head"}
_SKIP_CLASSES = {"computed", "computed-table", "computed-error", "highlight", "doctest"}
_VOID = {
    "area",
    "base",
    "br",
    "col",
    "embed",
    "hr",
    "img",
    "input",
    "link",
    "meta",
    "source",
    "track",
    "wbr",
}


class _TextParser(HTMLParser):
    """The text of a page outside code and computed elements."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[bool] = []  # per open element: whether it (or a parent) is skipped
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _VOID:
            return
        classes = set(dict(attrs).get("class", "").split()) if attrs else set()
        skipped = (self.stack[-1] if self.stack else False) or tag in _SKIP_TAGS
        self.stack.append(skipped or bool(classes & _SKIP_CLASSES))

    def handle_endtag(self, tag: str) -> None:
        if tag not in _VOID and self.stack:
            self.stack.pop()

    def handle_data(self, data: str) -> None:
        if not (self.stack and self.stack[-1]):
            self.text.append(data)


def literal_numbers(path: Path) -> list[str]:
    """Decimal numbers (three or more decimals) typed into a page, with some context."""
    parser = _TextParser()
    parser.feed(path.read_text(encoding="utf-8", errors="replace"))
    text = re.sub(r"\s+", " ", " ".join(parser.text))
    return [text[max(0, m.start() - 30) : m.end() + 10].strip() for m in _NUMBER.finditer(text)]


# -- internal words ---------------------------------------------------------------------

#: Words about how the project is organised internally, which no rendered page may hold:
#: (what it is, pattern). The patterns are narrow so that the paper's and the library's
#: own words (an "issue" of a journal, a numbered section of the paper named in words,
#: the ``Design`` of a kernel) never match.
INTERNAL_WORDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("an issue number", re.compile(r"\b[Ii]ssues?\s*#?\d+\b")),
    ("the design file", re.compile(r"\bDESIGN(?:\.md)?\b")),
    ("a project notes file", re.compile(r"\b(?:STYLE|COMMON|NOTES|TODO)\.md\b")),
    ("a design-file section sign", re.compile(r"§\s*\d")),
    ("a work-in-progress marker", re.compile(r"\b(?:TODO|FIXME)\b")),
    ("a git worktree", re.compile(r"\bworktrees?\b", re.I)),
)


class _AllTextParser(HTMLParser):
    """Every text node of a page (code included) and image alt texts; no script or style."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.depth = 0  # inside script/style
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("script", "style"):
            self.depth += 1
        elif tag == "img":
            alt = dict(attrs).get("alt")
            if alt:
                self.text.append(alt)

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style") and self.depth:
            self.depth -= 1

    def handle_data(self, data: str) -> None:
        if not self.depth:
            self.text.append(data)


def internal_words(path: Path) -> list[str]:
    """The internal words of a page: "what: ...context..." for each occurrence."""
    parser = _AllTextParser()
    parser.feed(path.read_text(encoding="utf-8", errors="replace"))
    text = re.sub(r"\s+", " ", " ".join(parser.text))
    found = []
    for what, pattern in INTERNAL_WORDS:
        for m in pattern.finditer(text):
            context = text[max(0, m.start() - 30) : m.end() + 30].strip()
            found.append(f"{what} {m.group(0)!r}: ...{context}...")
    return found


# -- the browser ---------------------------------------------------------------------------


class BrowserError(RuntimeError):
    """Chromium failed or did not answer in time."""


class Chromium:
    """A headless Chromium driven over the DevTools protocol on a pipe."""

    def __init__(self, executable: str, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self.events: list[dict[str, Any]] = []
        self._next = 0
        self._buffer = b""
        self._profile = tempfile.mkdtemp(prefix="check-pages-")
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()

        def wire() -> None:  # in the child: the protocol expects fds 3 (in) and 4 (out)
            os.dup2(to_chrome_r, 3)
            os.dup2(from_chrome_w, 4)

        args = [
            executable,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            "--disable-default-apps",
            "--no-first-run",
            "--no-default-browser-check",
            "--mute-audio",
            f"--user-data-dir={self._profile}",
            "--remote-debugging-pipe",
            "about:blank",
        ]
        self._proc = subprocess.Popen(
            args,
            preexec_fn=wire,
            pass_fds=(3, 4),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self.call("Browser.getVersion")

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError("Chromium did not answer in time")
            ready, _, _ = select.select([self._from_chrome], [], [], left)
            if ready:
                chunk = os.read(self._from_chrome, 1 << 16)
                if not chunk:
                    raise BrowserError(f"Chromium exited (status {self._proc.poll()})")
                self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def call(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        session: str | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Send one command and return its result (events met meanwhile are kept)."""
        self._next += 1
        msg: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error'].get('message')}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str, session: str, timeout: float) -> dict[str, Any]:
        """Wait for an event of `session` (earlier ones included)."""
        deadline = time.monotonic() + timeout
        while True:
            for event in self.events:
                if event.get("method") == method and event.get("sessionId") == session:
                    return event
            self.events.append(self._read(deadline))

    def close(self) -> None:
        """Close the browser and remove its profile."""
        with contextlib.suppress(BrowserError, OSError):
            self.call("Browser.close", timeout=10)
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        for fd in (self._to_chrome, self._from_chrome):
            with contextlib.suppress(OSError):
                os.close(fd)
        shutil.rmtree(self._profile, ignore_errors=True)


# Runs in the page once it has loaded; returns a JSON string.
PAGE_SCRIPT = r"""
(async () => {
  const out = {errors: []};
  const later = (ms) => new Promise(
    (_, reject) => setTimeout(() => reject(new Error('timed out')), ms));
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    try {
      await Promise.race([MathJax.startup.promise, later(__TIMEOUT_MS__)]);
      out.mathjax = MathJax.version || 'loaded';
    } catch (e) { out.errors.push('MathJax did not finish typesetting: ' + e); }
  } else { out.mathjax = null; }
  const imgs = Array.from(document.images);
  await Promise.race([Promise.all(imgs.map((img) => img.complete ? null : new Promise((r) => {
    img.addEventListener('load', r); img.addEventListener('error', r); }))), later(__TIMEOUT_MS__)])
    .catch((e) => out.errors.push('images did not finish loading: ' + e));
  out.images = imgs.map((img) => ({src: img.getAttribute('src'), w: img.naturalWidth,
                                  h: img.naturalHeight, complete: img.complete}));
  const maths = Array.from(document.querySelectorAll('.math'));
  out.math = maths.length;
  out.unrendered = maths.filter((el) => !el.querySelector('mjx-container'))
    .map((el) => el.textContent.trim().slice(0, 100));
  out.merrors = Array.from(document.querySelectorAll('mjx-merror'))
    .map((el) => el.getAttribute('data-mjx-error') || el.textContent.slice(0, 100));
  // an undefined macro is drawn as red text (MathJax's noundefined package)
  out.undefined = Array.from(document.querySelectorAll('mjx-container'))
    .filter((c) => Array.from(c.querySelectorAll('mjx-mtext')).some((t) => t.style.color === 'red'))
    .map((c) => {
      const mml = c.querySelector('mjx-assistive-mml');
      const red = mml && Array.from(mml.querySelectorAll('mtext[mathcolor="red"]'))
        .map((t) => t.textContent).join(' ');
      return red || (c.parentElement ? c.parentElement.textContent.slice(0, 100) : '?');
    });
  const skip = new Set(
    ['SCRIPT', 'STYLE', 'PRE', 'CODE', 'TEXTAREA', 'KBD', 'SAMP', 'TT', 'NOSCRIPT']);
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT, {
    acceptNode(node) {
      for (let p = node.parentElement; p; p = p.parentElement) {
        if (skip.has(p.tagName) || p.tagName.startsWith('MJX-')) return NodeFilter.FILTER_REJECT;
      }
      return NodeFilter.FILTER_ACCEPT;
    }});
  const tex = new RegExp(String.raw`\\\(|\\\)|\\\[|\\\]|\$\$|\\(?:` +
    'frac|sum|prod|int|beta|alpha|delta|varepsilon|epsilon|theta|log|exp|max|min|' +
    'operatorname|mathrm|mathbb|mathcal|left|right|cdot|le|ge|leq|geq|infty|sqrt|' +
    'dots|ldots|text|begin|end' + String.raw`)(?![A-Za-z])`);
  out.raw = [];
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const m = node.textContent.match(tex);
    if (m) {
      const i = Math.max(0, m.index - 40);
      out.raw.push(node.textContent.slice(i, m.index + 60).replace(/\s+/g, ' ').trim());
    }
  }
  out.computed_errors = document.querySelectorAll('.computed-error').length;
  return JSON.stringify(out);
})()
"""


#: The window widths of the layout check, in CSS pixels: a laptop and a phone.
LAYOUT_WIDTHS = (1280, 390)
LAYOUT_HEIGHT = 900

# Runs in the page at one window width; returns a JSON string. "Wider than its column":
# a table, figure or image whose box extends past the page's text column (the theme's
# article, else <main>, else <body>), unless a box between them scrolls sideways
# (overflow-x auto or scroll) and itself fits in the column.
LAYOUT_SCRIPT = r"""
(async () => {
  await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
  const doc = document.documentElement;
  const out = {width: window.innerWidth, scroll: doc.scrollWidth, wide: []};
  const column = document.querySelector('.bd-article') || document.querySelector('article')
    || document.querySelector('[role=main]') || document.querySelector('main') || document.body;
  const col = column.getBoundingClientRect();
  const scrolls = (el) => ['auto', 'scroll'].includes(getComputedStyle(el).overflowX);
  const label = (el) => {
    const id = el.id || (el.closest('[id]') || {}).id || '';
    const what = el.tagName.toLowerCase() + (el.className && typeof el.className === 'string'
      ? '.' + el.className.trim().split(/\s+/).join('.') : '');
    const src = el.tagName === 'IMG' ? ' ' + el.getAttribute('src') : '';
    return what + (id ? ' in #' + id : '') + src;
  };
  for (const el of column.querySelectorAll('table, figure, img, div.figure')) {
    if (el.closest('mjx-container')) continue;
    const r = el.getBoundingClientRect();
    if (r.width === 0 && r.height === 0) continue;
    if (r.left >= col.left - 1 && r.right <= col.right + 1) continue;
    let boxed = false;
    for (let p = el.parentElement; p && p !== column; p = p.parentElement) {
      if (scrolls(p)) {
        const b = p.getBoundingClientRect();
        boxed = b.left >= col.left - 1 && b.right <= col.right + 1;
        break;
      }
    }
    if (!boxed) out.wide.push(label(el) + ': ' + Math.round(r.width) + ' px wide, column '
      + Math.round(col.width) + ' px');
  }
  return JSON.stringify(out);
})()
"""


def layout_problems(
    browser: Chromium, session: str, timeout: float, widths: Iterable[int] = LAYOUT_WIDTHS
) -> list[tuple[str, str]]:
    """(kind, detail) of a loaded page's overflows at each window width."""
    found: list[tuple[str, str]] = []
    for width in widths:
        browser.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": LAYOUT_HEIGHT, "deviceScaleFactor": 1, "mobile": False},
            session=session,
        )
        reply = browser.call(
            "Runtime.evaluate",
            {"expression": LAYOUT_SCRIPT, "awaitPromise": True, "returnByValue": True},
            session=session,
            timeout=timeout,
        )
        if "exceptionDetails" in reply:
            found.append(("script", f"the layout script failed: {reply['exceptionDetails']}"))
            continue
        out = json.loads(reply["result"]["value"])
        if out["scroll"] > out["width"]:
            found.append(
                (
                    "layout",
                    f"at {width} px the page scrolls sideways: scrollWidth {out['scroll']} px "
                    f"> viewport {out['width']} px",
                )
            )
        found.extend(("layout", f"at {width} px {text}") for text in out["wide"])
    return found


def browser_problems(
    browser: Chromium,
    root: Path,
    page: Path,
    timeout: float,
    log: list[str] | None = None,
    layout: bool = True,
) -> list[Problem]:
    """Open one page and check what the browser made of it (a summary line goes to `log`)."""
    name = page.relative_to(root).as_posix()
    problems: list[Problem] = []

    def add(kind: str, detail: str) -> None:
        problems.append(Problem(name, kind, detail))

    target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = browser.call("Target.attachToTarget", {"targetId": target, "flatten": True})[
        "sessionId"
    ]
    try:
        for domain in ("Page", "Runtime", "Network"):
            browser.call(f"{domain}.enable", session=session)
        browser.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": LAYOUT_WIDTHS[0], "height": LAYOUT_HEIGHT, "deviceScaleFactor": 1,
             "mobile": False},
            session=session,
        )  # fmt: skip
        nav = browser.call("Page.navigate", {"url": page.resolve().as_uri()}, session=session)
        if nav.get("errorText"):
            add("load", f"cannot open the page: {nav['errorText']}")
            return problems
        browser.wait_event("Page.loadEventFired", session, timeout)
        script = PAGE_SCRIPT.replace("__TIMEOUT_MS__", str(int(timeout * 1000)))
        reply = browser.call(
            "Runtime.evaluate",
            {"expression": script, "awaitPromise": True, "returnByValue": True},
            session=session,
            timeout=timeout * 3 + 10,
        )
        if "exceptionDetails" in reply:
            add("script", f"the check's own script failed: {reply['exceptionDetails']}")
            return problems
        out = json.loads(reply["result"]["value"])
        for kind, detail in layout_problems(browser, session, timeout) if layout else ():
            add(kind, detail)
    finally:
        events = [e for e in browser.events if e.get("sessionId") == session]
        # only this page's session is read, and only until here: drop every event kept so far
        browser.events.clear()
        browser.call("Target.closeTarget", {"targetId": target})

    if log is not None:
        log.append(
            f"{name}: {out['math']} math element(s), MathJax {out['mathjax']}, "
            f"{len(out['images'])} image(s), {len(events)} browser event(s)"
        )
    for error in out["errors"]:
        add("mathjax" if "MathJax" in error else "load", error)
    if out["math"] and out["mathjax"] is None:
        add("math", f"{out['math']} math elements but MathJax did not load")
    for text in out["unrendered"]:
        add("math", f"math not rendered by MathJax: {text!r}")
    for text in out["merrors"]:
        add("math", f"MathJax TeX error: {text}")
    for text in out["undefined"]:
        add("math", f"undefined TeX macro (drawn in red): {text}")
    for text in out["raw"]:
        add("math", f"raw TeX left in the text: {text!r}")
    for img in out["images"]:
        if not (img["complete"] and img["w"] > 0 and img["h"] > 0):
            add("image", f"{img['src']} did not load in the browser (natural size 0)")
    if out["computed_errors"]:
        add("computed", f"{out['computed_errors']} [computed: error] marker(s) on the page")
    urls: dict[str, str] = {}
    for event in events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Network.requestWillBeSent":
            url = params["request"]["url"]
            urls[params["requestId"]] = url
            if not url.startswith(LOCAL_SCHEMES):
                add("network", f"request to {url}")
        elif method == "Network.loadingFailed" and not params.get("canceled"):
            url = urls.get(params["requestId"], "?")
            add("resource", f"{url} failed to load: {params.get('errorText')}")
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            add("javascript", str(text).splitlines()[0])
    return problems


# -- the command ---------------------------------------------------------------------------


def select_pages(root: Path, sections: Iterable[str], everything: bool) -> list[Path]:
    """The HTML pages to check, sorted."""
    if everything:
        candidates = root.rglob("*.html")
    else:
        candidates = (
            p for s in sections if (root / s).is_dir() for p in (root / s).rglob("*.html")
        )
    return sorted({p for p in candidates if not p.relative_to(root).parts[0].startswith("_")})


def check(
    root: Path,
    pages: list[Path],
    chromium: str,
    timeout: float = 30.0,
    log: list[str] | None = None,
    numbers: bool = False,
    number_pages: Collection[Path] = (),
    layout: bool = True,
) -> list[Problem]:
    """All problems of `pages` (static and in the browser); per-page summaries go to `log`.

    Typed numbers are looked for on every page when `numbers` is true, else on the
    pages that are also in `number_pages`. Internal words are looked for on every
    page; the layout is checked at :data:`LAYOUT_WIDTHS` when `layout` is true.
    """
    problems: list[Problem] = []
    for page in pages:
        problems.extend(static_problems(root, page))
        problems.extend(
            Problem(page.relative_to(root).as_posix(), "internal", detail)
            for detail in internal_words(page)
        )
        if numbers or page in number_pages:
            name = page.relative_to(root).as_posix()
            problems.extend(
                Problem(name, "number", f"typed, not computed: ...{context}...")
                for context in literal_numbers(page)
            )
    browser = Chromium(chromium, timeout=timeout)
    try:
        for page in pages:
            problems.extend(browser_problems(browser, root, page, timeout, log, layout))
    finally:
        browser.close()
    return problems


def main(argv: list[str] | None = None) -> int:
    """Run the check; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("html", type=Path, help="the built HTML folder (sphinx-build -b html)")
    parser.add_argument(
        "--section",
        action="append",
        dest="sections",
        metavar="FOLDER",
        help=f"a folder of pages to check (repeatable; default {', '.join(DEFAULT_SECTIONS)})",
    )
    parser.add_argument("--all", action="store_true", help="check every page of the site")
    parser.add_argument(
        "--chromium",
        default=os.environ.get("CHROMIUM", DEFAULT_CHROMIUM),
        help=f"the Chromium executable (default $CHROMIUM or {DEFAULT_CHROMIUM})",
    )
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="seconds to wait per page (default 30)"
    )
    parser.add_argument(
        "--literal-numbers",
        action="store_true",
        help="also fail on decimal numbers typed into the pages instead of computed",
    )
    parser.add_argument(
        "--literal-section",
        action="append",
        dest="literal_sections",
        default=[],
        metavar="FOLDER",
        help="as --literal-numbers, for the pages of this folder only; they are checked too "
        "(repeatable)",
    )
    parser.add_argument(
        "--no-layout",
        action="store_true",
        help="skip the layout check (overflow at 1280 px and 390 px)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="print a line per page")
    args = parser.parse_args(argv)
    root = args.html.resolve()
    if not (root / "index.html").is_file() and not args.all and not args.sections:
        print(f"check_pages: {root} has no index.html: not a built site", file=sys.stderr)
        return 2
    sections = args.sections or list(DEFAULT_SECTIONS)
    number_pages: set[Path] = set()
    for section in args.literal_sections:
        more = select_pages(root, [section], everything=False)
        if not more:
            print(f"check_pages: no pages under {root} in {section}", file=sys.stderr)
            return 2
        number_pages.update(more)
    pages = sorted(set(select_pages(root, sections, args.all)) | number_pages)
    if not pages:
        print(f"check_pages: no pages under {root} in {', '.join(sections)}", file=sys.stderr)
        return 2
    if not (shutil.which(args.chromium) or Path(args.chromium).is_file()):
        print(
            f"check_pages: no Chromium at {args.chromium} (apt-get install chromium)",
            file=sys.stderr,
        )
        return 2
    log: list[str] = []
    try:
        problems = check(
            root,
            pages,
            args.chromium,
            args.timeout,
            log,
            args.literal_numbers,
            number_pages,
            not args.no_layout,
        )
    except (BrowserError, OSError) as exc:
        print(f"check_pages: the browser failed: {exc}", file=sys.stderr)
        return 2
    if args.verbose:
        print("\n".join(log))
    for problem in problems:
        print(problem)
    failed = len({p.page for p in problems})
    print(
        f"check_pages: {len(pages)} page(s) checked, "
        + (f"{len(problems)} problem(s) on {failed} page(s)" if problems else "all pass")
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
