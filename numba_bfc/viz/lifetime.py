"""Lifetime plots: every allocation as a time x address rectangle.

Like PyTorch's memory viewer: a replay puts each block at its address from
its allocation event to its free; a plan puts each tensor at its offset over
its task interval, with the lower bound no placement can beat.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from ..planning.records import RecordsLike
    from ..planning.strategies import OffsetsAssignment
    from ..traces import ReplayResult, Trace

import numpy as np

from ._mpl import pyplot

_MIB = float(1 << 20)


def plot_replay_lifetimes(trace: Trace, result: ReplayResult, ax: Axes | None = None) -> Figure:
    """Blocks of a replay: x = event index (allocation to free), y = address.

    Parameters
    ----------
    trace : Trace
        The trace that was replayed.
    result : ReplayResult
        Its replay (``addresses`` of every event).
    ax : matplotlib Axes, optional

    Returns
    -------
    matplotlib.figure.Figure
        One rectangle per allocation that got memory; the y axis is MiB into
        the address ranges the blocks used, laid end to end (the gaps between
        backend regions are squeezed out, and a dotted line marks each seam).
        The black line is the trace's peak requested bytes: no allocator's
        blocks can fit under it at every moment.
    """
    if result.events != len(trace):
        raise ValueError(f"result covers {result.events} events, the trace has {len(trace)}")
    idx = np.flatnonzero((trace.ops == 0) & (result.addresses > 0))
    end = trace.partners()[idx]
    end = np.where(end >= 0, end, len(trace))
    addr = result.addresses[idx]
    size = trace.sizes[idx]
    y, seams = _squeeze(addr, size)
    fig, ax = _draw(idx, end, y / _MIB, size / _MIB, ax)
    for s in seams:
        ax.axhline(s / _MIB, color="grey", lw=0.6, ls=":")
    ax.axhline(trace.peak_requested_bytes / _MIB, color="black", lw=1.2,
               label="peak requested")
    ax.set_xlabel("event")
    ax.set_ylabel("address (MiB, regions end to end)")
    ax.set_title(f"{result.trace} / {result.policy}: {idx.size} blocks")
    ax.legend(fontsize="small", loc="upper right")
    return fig


def plot_plan(records: RecordsLike, assignment: OffsetsAssignment,
              ax: Axes | None = None) -> Figure:
    """Tensors of an offsets plan: x = task interval, y = offset, with bounds.

    Parameters
    ----------
    records : usage records (``numba_bfc.planning``)
    assignment : OffsetsAssignment
    ax : matplotlib Axes, optional

    Returns
    -------
    matplotlib.figure.Figure
        One rectangle per tensor over tasks ``first..last`` at its offset; a
        solid line at the plan's arena size and a dashed one at
        ``lower_bound(records)`` (the most bytes live at one task).
    """
    from ..planning import as_records, lower_bound

    recs = as_records(records)
    offsets = np.asarray(assignment.offsets, dtype=np.int64)
    if offsets.shape[0] != recs.shape[0]:
        raise ValueError(f"{offsets.shape[0]} offsets for {recs.shape[0]} records")
    fig, ax = _draw(recs["first"], recs["last"] + 1, offsets / _MIB, recs["size"] / _MIB, ax)
    bound = lower_bound(recs, "offsets")
    ax.axhline(assignment.total_size / _MIB, color="black", lw=1.2,
               label=f"arena {assignment.total_size:,} B")
    ax.axhline(bound / _MIB, color="red", lw=1.2, ls="--", label=f"lower bound {bound:,} B")
    ax.set_xlabel("task")
    ax.set_ylabel("offset (MiB)")
    ax.set_title(f"{recs.shape[0]} tensors: {assignment.total_size / max(bound, 1):.3f}x "
                 "the lower bound")
    ax.legend(fontsize="small", loc="upper right")
    return fig


def _squeeze(addr: np.ndarray, size: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """Offsets of blocks in the union of their address ranges laid end to end,
    and where one range ends and the next begins."""
    if addr.size == 0:
        return np.zeros(0, dtype=np.int64), []
    order = np.argsort(addr, kind="stable")
    a, e = addr[order], (addr + size)[order]
    reach = np.maximum.accumulate(e)
    starts = np.ones(a.size, dtype=bool)
    starts[1:] = a[1:] > reach[:-1]  # a gap before this block: a new range
    group = np.cumsum(starts) - 1
    range_lo = a[starts]
    range_hi = np.maximum.reduceat(e, np.flatnonzero(starts))
    shift = np.concatenate(([0], np.cumsum(range_hi - range_lo)[:-1]))
    y = np.empty(addr.size, dtype=np.int64)
    y[order] = a - range_lo[group] + shift[group]
    return y, [int(s) for s in shift[1:]]


def _draw(x0, x1, y0, height, ax):
    plt = pyplot()
    from matplotlib.collections import PolyCollection

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 4))
    x0, x1 = np.asarray(x0, float), np.asarray(x1, float)
    y0, h = np.asarray(y0, float), np.asarray(height, float)
    verts = np.stack([np.stack([x0, y0], 1), np.stack([x1, y0], 1),
                      np.stack([x1, y0 + h], 1), np.stack([x0, y0 + h], 1)], 1)
    colors = plt.get_cmap("tab20")(np.arange(x0.size) % 20)
    ax.add_collection(PolyCollection(verts, facecolors=colors, edgecolors="none"))
    ax.set_xlim(0, max(float(x1.max()) if x1.size else 1.0, 1.0))
    ax.set_ylim(0, max(float((y0 + h).max()) if h.size else 1.0, 1e-9) * 1.08)
    return ax.figure, ax
