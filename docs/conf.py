"""Sphinx configuration for the ladder docs (theme: sphinx_celery, the Celery ecosystem's)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir)))
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "_ext")))

from kombu_ladder import __version__  # noqa: E402 - after the path is set

project = "ladder"
author = "the ladder authors"
copyright = "2026, the ladder authors"  # noqa: A001 - Sphinx's name
release = __version__
version = ".".join(__version__.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "sphinx.ext.todo",
    "myst_parser",
    "ladder_figures",  # docs/_ext: tables built from the code (hops per message, the metrics)
]

#: Pages are reStructuredText; a page may also be Markdown (MyST), e.g. benchmarks.md.
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "diagrams", "_ext"]
templates_path: list[str] = []

html_theme = "sphinx_celery"
html_static_path = ["_static"]
html_css_files = ["ladder.css"]
html_title = f"ladder {release}"
html_show_sphinx = False
html_sidebars = {
    "index": ["globaltoc.html", "sourcelink.html", "searchbox.html"],
    "**": ["globaltoc.html", "relations.html", "sourcelink.html", "searchbox.html"],
}
pygments_style = "colorful"
highlight_language = "python3"

# -- autodoc / napoleon (Google-style docstrings) ---------------------------
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

# -- MyST (Markdown pages) ---------------------------------------------------
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

todo_include_todos = False


def _napoleon_skips_constants() -> None:
    """Keep napoleon off ``#:`` comments on constants and attributes, and off properties.

    It reads a comment such as ``#: Header: the target exchange`` as an attribute
    of type "Header"; those comments are prose, not Google-style sections.
    """
    from sphinx.ext import napoleon

    original = napoleon._process_docstring

    def process(app, what, name, obj, options, lines):  # type: ignore[no-untyped-def]
        if what not in ("data", "attribute", "property"):
            original(app, what, name, obj, options, lines)

    napoleon._process_docstring = process  # connected by napoleon's setup, which runs after this file


_napoleon_skips_constants()
