"""Requested / in-use / reserved bytes over a replayed trace."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from ..traces import ReplayResult

from collections.abc import Sequence

from ._mpl import pyplot

_MIB = float(1 << 20)


def plot_timeline(results: Sequence[ReplayResult], axes: Sequence[Axes] | None = None) -> Figure:
    """Plot replay time series: one panel per trace, one line per policy.

    Parameters
    ----------
    results : ReplayResult or sequence of them
        Replays (``numba_bfc.traces.replay``) with a series.
    axes : matplotlib Axes or sequence of them, optional
        One per distinct trace; a new figure when None.

    Returns
    -------
    matplotlib.figure.Figure
        Per panel: the trace's requested bytes (black, the lower bound of any
        allocator), and per policy its reserved bytes (solid) and in-use bytes
        (dotted), in MiB against the event index.
    """
    plt = pyplot()
    if not isinstance(results, Sequence):
        results = [results]
    if not results:
        raise ValueError("nothing to plot: no replay results")
    names = list(dict.fromkeys(r.trace for r in results))
    if axes is None:
        fig, axes = plt.subplots(len(names), 1, figsize=(8, 2.8 * len(names)), squeeze=False)
        axes = list(axes[:, 0])
    else:
        axes = list(axes) if isinstance(axes, Sequence) else [axes]
        if len(axes) != len(names):
            raise ValueError(f"need {len(names)} axes (one per trace), got {len(axes)}")
        fig = axes[0].figure
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, name in zip(axes, names):
        mine = [r for r in results if r.trace == name]
        if any(r.series.size == 0 for r in mine):
            raise ValueError(f"{name}: a result has no series (replay with series_points > 0)")
        s = max(mine, key=lambda r: r.events).series
        ax.plot(s["event"], s["requested"] / _MIB, color="black", lw=1.2, label="requested")
        for k, r in enumerate(mine):
            c = colors[k % len(colors)]
            ax.plot(r.series["event"], r.series["reserved"] / _MIB, color=c, lw=1.5,
                    label=f"{r.policy} reserved")
            ax.plot(r.series["event"], r.series["in_use"] / _MIB, color=c, lw=1, ls=":",
                    label=f"{r.policy} in use")
        ax.set_title(name)
        ax.set_xlabel("event")
        ax.set_ylabel("MiB")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig
