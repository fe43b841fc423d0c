"""The manual builds and its examples run as written.

``docs/`` is a Sphinx site (MyST Markdown pages and an API reference from the
docstrings); it must build with warnings as errors. Every ``python`` block of
the README and of the pages runs (those starting ``# GPU only`` need a GPU and
are only compiled). A block that ends in a ``# Prints:`` comment must print
the comment lines after it; in a block without one, where the top-level
``print(...)`` lines end in a ``# comment``, the comments are what it must print.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_PRINT = re.compile(r"^print\(.*\)\s+#\s?(.*)$")


def _blocks():
    for page in PAGES:
        for k, code in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), re.S)):
            yield pytest.param(code, id=f"{page.stem}-{k}")


def expected_output(code: str) -> list[str] | None:
    """The lines the block must print: the comment lines after a ``# Prints:``
    line, else its top-level prints' comments, or None when some print has
    none (or sits in a loop or function)."""
    lines = code.splitlines()
    stripped = [line.strip() for line in lines]
    if "# Prints:" in stripped:
        tail = stripped[stripped.index("# Prints:") + 1:]
        return [line[2:] if line.startswith("# ") else line[1:] for line in tail if line]
    prints = [line for line in lines if line.lstrip().startswith("print(")]
    if not prints or any(p != p.lstrip() for p in prints):
        return None
    expected = [_PRINT.match(p) for p in prints]
    if not all(expected):
        return None
    return [m.group(1).strip() for m in expected]


@pytest.mark.parametrize("code", list(_blocks()))
def test_example_runs_and_prints_what_it_says(code, tmp_path):
    compile(code, "example", "exec")
    if code.startswith("# GPU only"):
        return
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    expected = expected_output(code)
    if expected is not None:
        assert [line.strip() for line in done.stdout.splitlines()] == expected


def test_the_readme_test_command_is_what_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert f"```bash\n{ci}\n```" in (ROOT / "README.md").read_text()


def test_the_readme_is_a_landing_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    for link in re.findall(r"\]\((docs/[^)]+)\)", readme):
        path, _, anchor = link.partition("#")
        assert (ROOT / path).is_file(), link
        if anchor:  # a heading of that page, as the manual's build names it (GitHub's slugs)
            headings = re.findall(r"^#{1,3} (.+)$", (ROOT / path).read_text(), re.MULTILINE)
            slugs = {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-")
                     for h in headings}
            assert anchor in slugs, link


def test_the_manual_builds_without_warnings(tmp_path):
    done = subprocess.run([sys.executable, "-m", "sphinx", "-W", "-q", "-b", "html",
                           str(ROOT / "docs"), str(tmp_path / "html")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "html" / "api.html").read_text().count("allocate_raw") > 3
