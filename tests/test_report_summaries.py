"""The report's bin summary and occupancy map, computed over whole record
arrays, against chunk-by-chunk oracles: TF's ``get_bin_debug_info`` and
``RenderOccupancy`` as loops in plain Python integers."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from numba_bfc import BFCAllocator
from numba_bfc.allocators import report
from numba_bfc.backends import VirtualSubAllocator


def _records(rows) -> np.ndarray:
    """Records from ``(address, size, requested, in_use)``, in address order."""
    records = np.zeros(len(rows), dtype=report.RECORD_DTYPE)
    for k, (address, size, requested, in_use) in enumerate(sorted(rows)):
        records[k] = (address, size, requested, -1, in_use, k, 0)
    return records


def _summary_oracle(records, min_allocation, num_bins):
    out = [{"bin": b, "bin_size": min_allocation << b, "total_bytes_in_use": 0,
            "total_bytes_in_bin": 0, "total_chunks_in_use": 0, "total_chunks_in_bin": 0,
            "total_requested_bytes_in_use": 0} for b in range(num_bins)]
    for record in records:
        size = int(record["size"])
        row = out[report.bin_of(size, min_allocation, num_bins)]
        row["total_bytes_in_bin"] += size
        row["total_chunks_in_bin"] += 1
        if record["in_use"]:
            row["total_bytes_in_use"] += size
            row["total_chunks_in_use"] += 1
            row["total_requested_bytes_in_use"] += int(record["requested_size"])
    return out


def _occupancy_oracle(records, regions, width):
    total = sum(size for _, size in regions)
    if total == 0:
        return "<allocator contains no memory>"
    cells = ["_"] * width

    def paint(position, size, mark):
        for cell in range(position * width // total, (position + size - 1) * width // total + 1):
            cells[cell] = mark

    offset = 0
    for base, size in regions:  # in the order given, each region's chunks in address order
        for record in records:
            address = int(record["address"])
            if record["in_use"] and base <= address < base + size:
                position, requested = address - base + offset, int(record["requested_size"])
                if int(record["size"]) > requested:
                    paint(position + requested, int(record["size"]) - requested, "x")
                if requested > 0:
                    paint(position, requested, "*")
        offset += size
    return "".join(cells)


@st.composite
def layouts(draw):
    """Regions cut into chunks (in use or free, requested sizes that are not a
    multiple of anything, none or all of the chunk), empty regions, a chunk
    outside every region now and then, the regions listed in any order; units
    up to 2**45 bytes, so that a region's cells overflow int64 when computed as
    ``position * width``, and the whole layout at the top of the address space
    now and then, its last region or chunk ending at 2**63."""
    unit = draw(st.sampled_from([1, 256, 1 << 20, 1 << 45]))
    address = draw(st.integers(0, 1000)) * unit
    rows, regions = [], []
    for _ in range(draw(st.integers(0, 5))):
        address += draw(st.integers(0, 3)) * unit
        if draw(st.integers(0, 4)) == 0:
            regions.append((address, 0))  # empty: holds nothing, takes no cell
        base = address
        for length, in_use, part in draw(st.lists(
                st.tuples(st.integers(1, 60), st.booleans(), st.integers(0, 7)),
                min_size=1, max_size=8)):
            size = length * unit
            rows.append((address, size, size * part // 7 if in_use else 0, in_use))
            address += size
        regions.append((base, address - base))
        if draw(st.booleans()):  # not in any region: neither painted nor shifting a region
            rows.append((address, unit, unit, True))
            address += unit
    if draw(st.booleans()):  # ends at 2**63
        shift = (1 << 63) - address
        rows = [(a + shift, *rest) for a, *rest in rows]
        regions = [(base + shift, size) for base, size in regions]
    order = draw(st.permutations(range(len(regions))))
    return _records(rows), [regions[k] for k in order], draw(st.integers(1, 300))


@given(layouts())
def test_each_cell_shows_the_last_chunk_painted_over_it(layout):
    records, regions, width = layout
    assert report.render_occupancy(records, regions, width) == \
        _occupancy_oracle(records, regions, width)


@given(layouts(), st.sampled_from([(256, 21), (512, 4), (1, 64)]))
def test_each_chunk_counts_in_the_bin_for_its_size(layout, bins):
    records = layout[0]
    assert report.bin_summary(records, *bins) == _summary_oracle(records, *bins)


def test_an_allocators_report_matches_the_chunk_by_chunk_oracles():
    a = BFCAllocator(VirtualSubAllocator(), memory_limit=1 << 31)
    rng = np.random.default_rng(0)
    live = [a.allocate_raw(int(rng.integers(1, 1 << 20))) for _ in range(2000)]
    for p in live[::3]:
        a.deallocate_raw(p)
    records, regions = a.chunks(), a.regions()
    assert len(regions) > 1 and records["in_use"].any() and not records["in_use"].all()
    for width in (1, 100, 4096):
        assert report.render_occupancy(records, regions, width) == \
            _occupancy_oracle(records, regions, width)
    assert report.bin_summary(records, 256, 21) == _summary_oracle(records, 256, 21)


def test_the_bins_take_numpy_integers_and_refuse_no_bins_or_no_bin_size():
    records = _records([(0, (1 << 63) - 1, 1, True)])
    # A NumPy bin size would wrap when shifted: the largest chunk lands in bin 54, not 63.
    summary = report.bin_summary(records, np.int64(256), np.int64(64))
    assert summary == _summary_oracle(records, 256, 64) and summary[54]["total_chunks_in_bin"] == 1
    assert type(summary[63]["bin_size"]) is int
    for bins in ((256, 0), (0, 21)):
        with pytest.raises(ValueError, match="must be >= 1"):
            report.bin_summary(records, *bins)
