"""Plots of allocator behaviour (needs matplotlib: ``pip install numba_bfc[viz]``)."""

from .bins import plot_bin_occupancy
from .lifetime import plot_plan, plot_replay_lifetimes
from .memory_map import plot_memory_map
from .timeline import plot_timeline
from .tune import plot_tune

__all__ = ["plot_bin_occupancy", "plot_memory_map", "plot_plan", "plot_replay_lifetimes",
           "plot_timeline", "plot_tune"]
