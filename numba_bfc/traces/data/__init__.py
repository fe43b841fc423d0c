"""Small real traces captured from PyTorch workloads on the CPU, shipped with
the package (``tools/capture_traces.py`` made them; see its docstring)."""

from __future__ import annotations

from importlib import resources

from ..trace import Trace

__all__ = ["bundled_names", "load_bundled"]

_SUFFIX = ".csv.gz"


def bundled_names() -> list[str]:
    """Names of the bundled traces, sorted."""
    files = resources.files(__name__).iterdir()
    return sorted(f.name[: -len(_SUFFIX)] for f in files if f.name.endswith(_SUFFIX))


def load_bundled(name: str) -> Trace:
    """A bundled trace by name (see ``bundled_names()``)."""
    names = bundled_names()
    if name not in names:
        raise ValueError(f"no bundled trace {name!r} (available: {', '.join(names) or 'none'})")
    with resources.as_file(resources.files(__name__) / (name + _SUFFIX)) as path:
        return Trace.read(path, "csv", name=name)
