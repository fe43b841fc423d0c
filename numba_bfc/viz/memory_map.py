"""The memory map of an allocator: regions as bands, chunks coloured by state."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

import numpy as np

from ._mpl import pyplot

_MIB = float(1 << 20)
REQUESTED = "#1f77b4"  # bytes a client asked for
PADDING = "#ff7f0e"  # rounding, alignment and unsplit waste of in-use chunks
FREE_CMAP = "Greens"  # free chunks, darker for larger bins


def plot_memory_map(allocator: Any, ax: Axes | None = None, max_regions: int = 32) -> Figure:
    """Draw every region of ``allocator`` as a horizontal band of its chunks.

    Parameters
    ----------
    allocator : BFCAllocator, CachingAllocator, CompactAllocator or an oracle
        Anything with ``regions()`` and ``chunks()``.
    ax : matplotlib Axes, optional
        Where to draw; a new figure when None.
    max_regions : int
        Draw at most this many regions (the lowest addresses).

    Returns
    -------
    matplotlib.figure.Figure
        One band per region (y), offset in MiB from the region's base (x). An
        in-use chunk is blue over its requested bytes and orange over the rest
        (rounding, alignment, unsplit remainder); a free chunk is green, darker
        for a larger bin, with one legend entry per bin present.
    """
    plt = pyplot()
    from matplotlib.collections import PolyCollection
    from matplotlib.patches import Patch

    regions = allocator.regions()[:max_regions]
    records = allocator.chunks()
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 1.8 + 0.45 * max(len(regions), 1)))
    fig = ax.figure
    boxes: dict[str, list] = {"requested": [], "padding": [], "free": []}
    free_bins: list[int] = []
    for row, (base, size) in enumerate(regions):
        lo, hi = np.searchsorted(records["address"], [base, base + size])
        for rec in records[lo:hi]:
            x0 = (int(rec["address"]) - base) / _MIB
            width = int(rec["size"]) / _MIB
            if rec["in_use"]:
                asked = int(rec["requested_size"]) / _MIB
                boxes["requested"].append(_box(x0, asked, row))
                if width > asked:
                    boxes["padding"].append(_box(x0 + asked, width - asked, row))
            else:
                boxes["free"].append(_box(x0, width, row))
                free_bins.append(int(rec["bin"]))
    cmap = plt.get_cmap(FREE_CMAP)
    top_bin = max(free_bins, default=0)
    shade = [cmap(0.3 + 0.6 * b / max(top_bin, 1)) for b in free_bins]
    for key, color in (("requested", REQUESTED), ("padding", PADDING), ("free", shade)):
        if boxes[key]:
            ax.add_collection(PolyCollection(boxes[key], facecolors=color, edgecolors="white",
                                             linewidths=0.3, label=key))
    widest = max((size for _, size in regions), default=1 << 20) / _MIB
    ax.set_xlim(0, widest)
    ax.set_ylim(max(len(regions), 1) - 0.5, -0.5)
    ax.set_yticks(range(len(regions)))
    ax.set_yticklabels([f"{base:#x}" for base, _ in regions], fontsize="small")
    ax.set_xlabel("offset in region (MiB)")
    ax.set_title(f"{getattr(allocator, 'name', type(allocator).__name__)}: "
                 f"{len(regions)} region(s), {len(records)} chunks")
    handles = [Patch(color=REQUESTED, label="in use: requested"),
               Patch(color=PADDING, label="in use: rounding / unsplit")]
    handles += [Patch(color=cmap(0.3 + 0.6 * b / max(top_bin, 1)), label=f"free, bin {b}")
                for b in sorted(set(free_bins))]
    ax.legend(handles=handles, fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig


def _box(x0: float, width: float, row: int, height: float = 0.8) -> list[tuple[float, float]]:
    y0 = row - height / 2
    return [(x0, y0), (x0 + width, y0), (x0 + width, y0 + height), (x0, y0 + height)]
