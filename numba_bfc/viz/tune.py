"""What ``numba_bfc.tune`` found, drawn: memory needed per allocator setting, and the run."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._mpl import pyplot

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from ..traces import Trace
    from ..tune import TuneResult

_MIB = float(1 << 20)


def plot_tune(result: TuneResult, trace: Trace | None = None) -> Figure:
    """Plot a tune result.

    Parameters
    ----------
    result : TuneResult
        From ``numba_bfc.tune.tune``.
    trace : Trace, optional
        The trace tuned; with it, a second panel replays it (no limit) under
        PyTorch's defaults and under the recommended settings.

    Returns
    -------
    matplotlib.figure.Figure
        Left: the smallest no-OOM memory limit of each row of ``result.rows()``
        (the recommended settings first, the peak live bytes last), in MiB.
        Right: requested bytes (black) and the bytes reserved over the run by
        the defaults and the recommended settings.
    """
    plt = pyplot()
    panels = 2 if trace is not None else 1
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 3.6), squeeze=False)
    ax = axes[0, 0]
    rows = result.rows()
    limits = [result.best.min_limit, result.defaults.min_limit,
              *[b.min_limit for b in result.baselines], result.offline_plan_bytes,
              result.peak_requested_bytes]
    colors = ["tab:green", "tab:gray"] + ["tab:blue"] * len(result.baselines) + ["black"] * 2
    y = list(range(len(rows)))[::-1]
    ax.barh(y, [v / _MIB for v in limits], color=colors)
    ax.set_yticks(y, [r[0] for r in rows], fontsize="small")
    ax.set_xlabel("smallest memory limit with no OOM (MiB)")
    if result.limit is not None:
        ax.axvline(result.limit / _MIB, color="tab:red", ls="--", lw=1, label="--limit")
        ax.legend(fontsize="small")
    ax.set_title(f"{result.trace}: memory each setting needs")
    if trace is not None:
        from ..traces import replay
        from ..tune import caching_options

        ax = axes[0, 1]
        defaults = replay(trace, "caching")
        best = replay(trace, "caching", **{k: v for k, v in
                                           caching_options(result.best.settings).items()
                                           if k != "garbage_collection_threshold"})
        s = defaults.series
        ax.plot(s["event"], s["requested"] / _MIB, color="black", lw=1.2, label="requested")
        ax.plot(s["event"], s["reserved"] / _MIB, color="tab:gray", lw=1.5,
                label="reserved, defaults")
        ax.plot(best.series["event"], best.series["reserved"] / _MIB, color="tab:green",
                lw=1.5, label=f"reserved, {result.best.conf or 'defaults'}")
        ax.set_xlabel("event")
        ax.set_ylabel("MiB")
        ax.set_ylim(bottom=0)
        ax.set_title("the run with no limit")
        ax.legend(fontsize="x-small", loc="upper left")
    fig.tight_layout()
    return fig
