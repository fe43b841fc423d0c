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


# ---------------------------------------------------------------------- memory map, bins
from matplotlib.collections import PolyCollection  # noqa: E402

from numba_bfc import BFCAllocator, CachingAllocator, CompactAllocator  # noqa: E402
from numba_bfc.backends import VirtualSubAllocator  # noqa: E402
from numba_bfc.viz import (  # noqa: E402
    plot_bin_occupancy,
    plot_memory_map,
    plot_plan,
    plot_replay_lifetimes,
)

MiB = 1 << 20


def _busy_bfc():
    a = BFCAllocator(VirtualSubAllocator(), memory_limit=64 * MiB)
    ps = [a.allocate_raw(n) for n in (1000, 100_000, 300_000, 3 * MiB, 5000)]
    a.deallocate_raw(ps[1])
    return a


def _collections(ax):
    return {c.get_label(): c for c in ax.collections if isinstance(c, PolyCollection)}


def test_memory_map_draws_every_chunk_in_its_region_band():
    plt.switch_backend("Agg")
    a = _busy_bfc()
    fig = plot_memory_map(a)
    ax = fig.axes[0]
    recs, regions = a.chunks(), a.regions()
    used, free = recs[recs["in_use"]], recs[~recs["in_use"]]
    boxes = _collections(ax)
    assert len(boxes["requested"].get_paths()) == used.size
    padded = int((used["size"] > used["requested_size"]).sum())
    assert len(boxes["padding"].get_paths()) == padded
    assert len(boxes["free"].get_paths()) == free.size
    # Each box sits in its region's band and spans the chunk's bytes.
    row_of = {base: k for k, (base, _) in enumerate(regions)}
    for path, rec in zip(boxes["free"].get_paths(), free):
        base = max(b for b in row_of if b <= rec["address"])
        (x0, y0), (x1, y1) = path.vertices.min(0), path.vertices.max(0)
        assert np.isclose(x0, (rec["address"] - base) / MiB)
        assert np.isclose(x1 - x0, rec["size"] / MiB)
        assert np.isclose((y0 + y1) / 2, row_of[base])
    assert ax.get_xlim() == (0, max(s for _, s in regions) / MiB)
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"{b:#x}" for b, _ in regions]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend[:2] == ["in use: requested", "in use: rounding / unsplit"]
    assert legend[2:] == [f"free, bin {b}" for b in sorted(set(free["bin"].tolist()))]
    fig.canvas.draw()
    plt.close(fig)


def test_memory_map_of_caching_and_compact_and_an_empty_pool():
    plt.switch_backend("Agg")
    c = CachingAllocator(VirtualSubAllocator())
    c.allocate_raw(1000)
    c.allocate_raw(5 * MiB)
    fig = plot_memory_map(c)
    assert len(fig.axes[0].get_yticklabels()) == 2  # a small and a large segment
    plt.close(fig)
    empty = CompactAllocator(VirtualSubAllocator(contiguous=True), memory_limit=MiB)
    fig = plot_memory_map(empty)
    assert _collections(fig.axes[0]) == {} and fig.axes[0].get_title().endswith("0 chunks")
    plt.close(fig)


def test_bin_occupancy_bars_add_up_to_the_chunks():
    plt.switch_backend("Agg")
    a = _busy_bfc()
    fig = plot_bin_occupancy(a)
    ax = fig.axes[0]
    bars = {c.get_label(): c for c in ax.containers}
    recs = a.chunks()
    heights = {k: sum(r.get_height() for r in v) * MiB for k, v in bars.items()}
    used = recs[recs["in_use"]]
    assert np.isclose(heights["in use: requested"], used["requested_size"].sum())
    assert np.isclose(heights["in use: rounding / unsplit"],
                      (used["size"] - used["requested_size"]).sum())
    assert np.isclose(heights["free"], recs[~recs["in_use"]]["size"].sum())
    # Bars stack: each free bar starts where the bin's in-use bytes end.
    for req, pad, free in zip(*bars.values()):
        assert np.isclose(free.get_y(), req.get_height() + pad.get_height())
    plt.close(fig)


# ---------------------------------------------------------------------- lifetimes, plans
def test_replay_lifetimes_place_every_block_over_its_lifetime():
    plt.switch_backend("Agg")
    t = steady_state(iterations=2, layers=3)
    r = replay(t, "bfc")
    fig = plot_replay_lifetimes(t, r)
    ax = fig.axes[0]
    (blocks,) = [c for c in ax.collections if isinstance(c, PolyCollection)]
    allocs = np.flatnonzero(t.ops == 0)
    assert len(blocks.get_paths()) == allocs.size
    ends = t.partners()[allocs]
    for path, start, end, size in zip(blocks.get_paths(), allocs, ends, t.sizes[allocs]):
        (x0, y0), (x1, y1) = path.vertices.min(0), path.vertices.max(0)
        assert (x0, x1) == (start, end if end >= 0 else len(t))
        assert np.isclose(y1 - y0, size / MiB)
    # Blocks live at the same time never overlap on the squeezed address axis.
    boxes = [(p.vertices.min(0), p.vertices.max(0)) for p in blocks.get_paths()]
    for i, (lo, hi) in enumerate(boxes):
        for lo2, hi2 in boxes[i + 1:]:
            overlap_t = min(hi[0], hi2[0]) > max(lo[0], lo2[0])
            overlap_y = min(hi[1], hi2[1]) > max(lo[1], lo2[1]) + 1e-12
            assert not (overlap_t and overlap_y)
    peak = [ln for ln in ax.get_lines() if ln.get_label() == "peak requested"]
    assert np.isclose(peak[0].get_ydata()[0], t.peak_requested_bytes / MiB)
    plt.close(fig)
    with pytest.raises(ValueError, match="events"):
        plot_replay_lifetimes(steady_state(iterations=1, layers=2), r)


def test_plan_draws_tensors_arena_and_lower_bound():
    from numba_bfc.planning import assign_offsets, lower_bound

    plt.switch_backend("Agg")
    recs = [(32, 0, 1), (32, 1, 4), (8, 2, 5), (16, 3, 5), (8, 4, 5), (64, 5, 7)]
    plan = assign_offsets(recs, "greedy_by_size")
    fig = plot_plan(recs, plan)
    ax = fig.axes[0]
    (blocks,) = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(blocks.get_paths()) == len(recs)
    for path, (size, first, last), off in zip(blocks.get_paths(), recs, plan.offsets):
        (x0, y0), (x1, y1) = path.vertices.min(0), path.vertices.max(0)
        assert (x0, x1) == (first, last + 1)
        assert np.isclose(y0 * MiB, off) and np.isclose((y1 - y0) * MiB, size)
    lines = {ln.get_label().split()[0]: ln.get_ydata()[0] * MiB for ln in ax.get_lines()}
    assert np.isclose(lines["arena"], plan.total_size)
    assert np.isclose(lines["lower"], lower_bound(recs, "offsets"))
    plt.close(fig)


# ---------------------------------------------------------------------- rich displays
def test_html_displays_show_counters_and_strips():
    import re

    a = _busy_bfc()
    html = a._repr_html_()
    s = a.get_stats()
    assert "BFCAllocator" in html and "fragmentation" in html
    recs = a.chunks()
    # One grey background, then per in-use chunk its whole size and its requested part.
    assert len(re.findall("<rect", html)) == 1 + 2 * int(recs["in_use"].sum())
    assert len(re.findall("<line", html)) == len(a.regions()) - 1  # region seams
    stats = s._repr_html_()
    assert f"{s.bytes_in_use:,}" in stats and stats.count("<tr>") == len(s.to_dict())
    r = replay(steady_state(iterations=2, layers=3), "caching", series_points=40)
    rh = r._repr_html_()
    assert "replay of" in rh and f"{r.events:,}" in rh
    assert len(re.findall("<polyline", rh)) == 3
    points = re.findall("points='([^']*)'", rh)[0].split()
    assert len(points) == r.series.size
