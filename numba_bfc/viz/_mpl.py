"""matplotlib, imported on first use with a clear message when missing."""

from __future__ import annotations


def pyplot():
    try:
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("numba_bfc.viz needs matplotlib: pip install 'numba_bfc[viz]'") from e
    return plt
