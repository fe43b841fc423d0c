"""Plots of allocator behaviour (needs matplotlib: ``pip install numba_bfc[viz]``)."""

from .timeline import plot_timeline

__all__ = ["plot_timeline"]
