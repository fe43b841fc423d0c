"""Bin occupancy: bytes in use and free per size class."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

import numpy as np

from ..allocators.bfc_base import MIN_ALLOCATION, NUM_BINS
from ..allocators.report import bin_summary
from ..stats import format_bytes
from ._mpl import pyplot
from .memory_map import PADDING, REQUESTED

_MIB = float(1 << 20)


def plot_bin_occupancy(allocator: Any, ax: Axes | None = None) -> Figure:
    """Bar chart of each size class (TF's bins: 256 B << k): bytes in use and free.

    Parameters
    ----------
    allocator : any pooled allocator (``chunks()``)
    ax : matplotlib Axes, optional

    Returns
    -------
    matplotlib.figure.Figure
        One stacked bar per bin that holds a chunk: in-use bytes (requested in
        blue, the rest of in-use chunks in orange) under free bytes (green),
        in MiB, labelled by the bin's smallest size.
    """
    plt = pyplot()
    records = allocator.chunks()
    summary = [b for b in bin_summary(records, MIN_ALLOCATION, NUM_BINS)
               if b["total_chunks_in_bin"]]
    if ax is None:
        _, ax = plt.subplots(figsize=(max(4, 0.6 * len(summary) + 2), 3))
    x = np.arange(len(summary))
    requested = np.array([b["total_requested_bytes_in_use"] for b in summary]) / _MIB
    in_use = np.array([b["total_bytes_in_use"] for b in summary]) / _MIB
    free = np.array([b["total_bytes_in_bin"] - b["total_bytes_in_use"] for b in summary]) / _MIB
    ax.bar(x, requested, color=REQUESTED, label="in use: requested")
    ax.bar(x, in_use - requested, bottom=requested, color=PADDING,
           label="in use: rounding / unsplit")
    ax.bar(x, free, bottom=in_use, color="#2ca02c", label="free")
    ax.set_xticks(x)
    ax.set_xticklabels([format_bytes(b["bin_size"]) for b in summary], rotation=45,
                       ha="right", fontsize="small")
    ax.set_xlabel("bin (smallest chunk size)")
    ax.set_ylabel("MiB")
    ax.set_title(f"{getattr(allocator, 'name', type(allocator).__name__)}: bytes per bin")
    ax.legend(fontsize="small")
    ax.figure.tight_layout()
    return ax.figure
