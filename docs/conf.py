"""Sphinx configuration: the manual (Markdown pages, MyST), the notebooks and the
API reference (autodoc with numpydoc) of numba_bfc. Build: ``sphinx-build -W -b html docs OUT``
(``tests/test_docs.py`` builds it, warnings as errors)."""

project = "numba_bfc"
author = "numba_bfc developers"
extensions = [
    "myst_nb",  # MyST Markdown pages and the notebooks (docs/notebooks -> ../notebooks)
    "sphinx.ext.autodoc",
    "numpydoc",
]
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "notebooks/README.md"]
# The notebooks are stored without outputs and run by tests/test_notebooks.py;
# the manual shows their code and prose.
nb_execution_mode = "off"
root_doc = "index"
myst_heading_anchors = 3
# The manual's code blocks are checked by the tests, not highlighted strictly.
highlight_language = "none"
suppress_warnings = ["misc.highlighting_failure"]
numpydoc_show_class_members = False
numpydoc_validation_checks: set[str] = set()
autodoc_typehints = "none"
html_theme = "alabaster"
