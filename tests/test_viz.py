"""Plots: rendered with Agg, checked by what they drew."""

import numpy as np
import pytest

from numba_bfc.traces import replay
from numba_bfc.traces.synthetic import growing_kv_cache, steady_state

plt = pytest.importorskip("matplotlib.pyplot")
from numba_bfc.viz import plot_timeline  # noqa: E402


def test_plot_timeline_draws_every_series():
    plt.switch_backend("Agg")
    a, b = steady_state(iterations=3, layers=4), growing_kv_cache(tokens=20, layers=2)
    results = [replay(t, p, series_points=50) for t in (a, b) for p in ("bfc", "caching")]
    fig = plot_timeline(results)
    axes = fig.axes
    assert [ax.get_title() for ax in axes] == [a.name, b.name]
    for ax, mine in zip(axes, (results[:2], results[2:])):
        labels = [line.get_label() for line in ax.get_lines()]
        assert labels == ["requested", "bfc reserved", "bfc in use", "caching reserved",
                          "caching in use"]
        reserved = ax.get_lines()[1]
        assert np.allclose(reserved.get_ydata(), mine[0].series["reserved"] / 2**20)
        assert np.array_equal(reserved.get_xdata(), mine[0].series["event"])
        top = max(r.peak_reserved_bytes for r in mine) / 2**20
        assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] >= top
    fig.canvas.draw()
    plt.close(fig)


def test_plot_timeline_needs_series():
    r = replay(steady_state(iterations=1, layers=2), "bfc", series_points=0)
    with pytest.raises(ValueError, match="no series"):
        plot_timeline(r)
    with pytest.raises(ValueError, match="nothing to plot"):
        plot_timeline([])
