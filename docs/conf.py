"""Sphinx configuration for the softmaxtheory documentation.

Builds offline: MathJax is bundled into the output by ``sphinx-mathjax-offline``
and no extension fetches anything from the network (no intersphinx).
"""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))

project = "softmaxtheory"
author = "softmaxtheory developers"
copyright = "2025, softmaxtheory developers"

try:
    import softmaxtheory

    release = softmaxtheory.__version__
except ImportError:  # pragma: no cover - the docs need the package installed
    release = "unknown"
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    # ships MathJax 3 and points mathjax_path at the bundled copy
    "sphinx-mathjax-offline",
    "sphinx.ext.doctest",
    "sphinx.ext.viewcode",
    # figures drawn by the library's code at build time (Agg, offline)
    "matplotlib.sphinxext.plot_directive",
    "theorem_tests",
    # :computed: values and computed tables, evaluated at build time
    "computed",
    # "What the oracle catches": broken kernels run through the suite at build time
    "oracle_gallery",
]

# -- MathJax, offline ---------------------------------------------------------
# sphinx-mathjax-offline copies its MathJax tree to _static/mathjax; pin the
# path here as well so that no CDN default can ever leak into the pages.
mathjax_path = "mathjax/tex-chtml.js"

# -- theorem-tests directive ---------------------------------------------------
# The folder scanned (with ``ast``) for @pytest.mark.theorem markers; relative
# paths are taken from this file's folder.
theorem_tests_dir = "../tests"
# A theorem with no marked test is a warning of type "theorem_tests.empty"; add
# it to suppress_warnings only while the tests are being written.

# -- computed values (docs/_ext/computed.py) -----------------------------------
# The code that starts each page's namespace for :computed:, computed-setup,
# computed-math, computed-table and computed-rst. DOCS is this folder (a Path),
# for pages that read data kept next to them (e.g. DOCS / "performance" / ...).
computed_preamble = f"""\
import math
from pathlib import Path
import numpy as np
import mpmath
import softmaxtheory
from softmaxtheory import bounds, reference, spec
DOCS = Path({str(DOCS)!r})
"""

# -- the oracle gallery (docs/_ext/oracle_gallery.py) ---------------------------------
# The verdicts are computed once and kept here, keyed by a hash of the code and of the
# versions it runs on. The file is tracked: a build of the same code reuses it (the suite
# over 80 defect classes and the correct kernels costs 140 s on two cores), and a build
# of changed code, or on other versions, computes the verdicts again and rewrites it.
oracle_gallery_cache = str(DOCS / "testing" / "oracle_gallery.json")

# -- figures (matplotlib's plot directive) ---------------------------------------
# ``.. plot::`` runs its code while the page is built; the figure is a PNG in
# the output, and an exception in the code is a warning (so -W fails).
plot_pre_code = f"""\
from pathlib import Path
import numpy as np
import matplotlib.pyplot as plt
from softmaxtheory import bounds, reference, spec
DOCS = Path({str(DOCS)!r})
"""
plot_include_source = False
plot_html_show_source_link = False
plot_html_show_formats = False
# Drawn for the text column (about 720 px wide at a 1280 px window, at most 60em): a
# figure 6.4-7 inches wide at 110 dpi is shown at about its own size, so 12 pt text is
# about 18 px, at least the body's 16 px.
plot_formats = [("png", 110)]
plot_rcparams = {
    "figure.figsize": (6.4, 3.6),
    "figure.dpi": 110,
    "savefig.bbox": "tight",
    "axes.grid": True,
    "grid.alpha": 0.3,
    "font.size": 12,
    "legend.fontsize": 11,
}
plot_apply_rcparams = True

# Warn about "\\name" inside math (an r-string docstring that kept doubled
# backslashes renders as a line break and a word). Override with -D math_lint=0.
math_lint = True

# -- general -------------------------------------------------------------------
root_doc = "index"
exclude_patterns = ["_build"]
primary_domain = "py"
pygments_style = "sphinx"
nitpicky = True

# -- autodoc / napoleon --------------------------------------------------------
autodoc_default_options = {
    "members": True,
    "member-order": "bysource",
}
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_ivar = True
napoleon_use_rtype = True
napoleon_preprocess_types = True
# Bare type names of the numpydoc sections, resolved to their documented target.
napoleon_type_aliases = {
    "Schedule": "softmaxtheory.spec.Schedule",
    "BinaryFormat": "softmaxtheory.reference.BinaryFormat",
    "Fraction": "fractions.Fraction",
}

# -- nitpicky, with targeted exceptions ---------------------------------------------
# There is no intersphinx (the build is offline), so objects of the standard
# library, numpy and mpmath have no target; numpydoc's informal type words
# ("array_like", "sequence", "numpy dtype", "shape (..., n)") have none either.
nitpick_ignore = [
    ("py:class", "array_like"),
    ("py:class", "sequence"),
    ("py:class", "callable"),
    ("py:class", "numpy dtype"),
    ("py:class", "float64"),
    ("py:class", "numpy.ndarray"),
    ("py:class", "numpy.float64"),
    ("py:class", "torch.Tensor"),
    ("py:class", "torch.dtype"),
    ("py:class", "module"),
    ("py:func", "torch.nn.functional.scaled_dot_product_attention"),
    ("py:class", "numpy.dtype"),
    ("py:class", "np.ndarray"),
    ("py:class", "np.dtype"),
    ("py:class", "mpmath.mpf"),
    ("py:class", "mpmath.ctx_mp_python.mpf"),
    ("py:class", "fractions.Fraction"),
    ("py:class", "abc.ABC"),
    ("py:class", "enum.IntEnum"),
    ("py:obj", "False"),
    ("py:obj", "True"),
]
nitpick_ignore_regex = [
    # dask's objects (accelerated.dask): no intersphinx either
    ("py:(class|func|obj)", r"(dask|da)\..*"),
    # the pieces of a numpydoc shape annotation such as "shape (..., L, d)"
    ("py:class", r"shape \(.*"),
    ("py:class", r"[A-Za-z]"),
    ("py:class", r"[A-Za-z_]\w*\)"),
]

# -- doctest -------------------------------------------------------------------
# No doctest_global_setup: every page's examples import what they use, so that a reader
# can copy them as shown; the doctest build fails on a group that leans on a name it does
# not import.

# -- html ----------------------------------------------------------------------
# pydata-sphinx-theme: the theme of numpy, scipy and most of the scientific
# Python stack (light and dark, a page table of contents, the API in the
# ecosystem's style). It bundles its fonts and icons; nothing is fetched.
html_theme = "pydata_sphinx_theme"
html_title = f"softmaxtheory {release}"
html_static_path = ["_static"]
html_css_files = ["softmaxtheory.css"]
templates_path = ["_templates"]
html_theme_options = {
    "navbar_start": ["navbar-logo", "version"],
    "navbar_end": ["paper-link", "theme-switcher"],
    "navbar_persistent": ["search-button"],
    "header_links_before_dropdown": 4,
    "secondary_sidebar_items": ["page-toc"],
    "show_toc_level": 2,
    "navigation_with_keys": False,
    "show_prev_next": True,
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
    "logo": {"text": "softmaxtheory"},
}
# the top-level pages without subpages have no section navigation: no left sidebar
html_sidebars = {
    page: []
    for page in ("index", "testing", "gallery", "error_model", "reference", "torch", "performance")
}
html_last_updated_fmt = None


# -- private bases ---------------------------------------------------------------------
def _public_bases(app, name, obj, options, bases):
    """Show a class's public bases: a private one (``spec._ByValue``) by its own bases."""
    i = 0
    while i < len(bases):
        if bases[i].__name__.startswith("_"):
            bases[i : i + 1] = list(bases[i].__bases__)
        else:
            i += 1


def setup(app):
    app.connect("autodoc-process-bases", _public_bases)
