"""Consistency checks over an allocator's state, for tests and debugging.

``check_invariants(allocator)`` raises ``InvariantError`` naming the first
broken rule. For BFC: chunks tile each region, no two adjacent free chunks
unless timestamped frees were used, stats agree with the chunks. For the
caching policy: blocks tile segments, free neighbours are always merged, and
every PyTorch statistic equals what the segments show (PyTorch's own
consistency test). For the Numba allocators, also the tables themselves (bin
trees ordered and balanced as treaps, every free chunk in the right bin
exactly once, the pointer map exact, the free-handle list complete).
"""

from __future__ import annotations

import numpy as np

from ..allocators.bfc_base import MIN_ALLOCATION, NUM_BINS
from ..allocators.caching_base import CachingBase
from ..allocators.compact_base import CompactGrowth
from ..allocators.report import bin_of
from ..kernels import layout as L
from ..policies import caching as C

__all__ = ["InvariantError", "check_invariants"]


class InvariantError(AssertionError):
    """An allocator's state breaks one of its invariants."""


def _require(cond, message: str) -> None:
    if not cond:
        raise InvariantError(message)


def check_invariants(allocator) -> None:
    """Check ``allocator``: a BFC or caching allocator, Numba or reference."""
    with allocator._lock:
        records = allocator._records()
        regions = allocator._region_list()
        largest = allocator._largest_free()
        if isinstance(allocator, CachingBase):
            _check_tiling(records, regions, adjacent_free_allowed=False)
            _check_caching(allocator, records, largest)
        else:
            _check_tiling(records, regions, allocator._timestamps_used)
            _check_records(records, regions, allocator._counters(), largest,
                           allocator.memory_limit,
                           bins_by_size=not isinstance(allocator, CompactGrowth))
        if isinstance(allocator, CompactGrowth):
            _check_compact(allocator, records, regions)
        if hasattr(allocator, "_chunks"):
            _check_tables(allocator)


def _check_tiling(records, regions, adjacent_free_allowed) -> None:
    """Chunks tile every region exactly, in address order."""
    addresses = records["address"]
    _require(np.all(np.diff(addresses) > 0), "chunk addresses are not strictly increasing")
    total = 0
    for base, size in regions:
        lo = int(np.searchsorted(addresses, base))
        hi = int(np.searchsorted(addresses, base + size))
        part = records[lo:hi]
        _require(part.size > 0 and int(part["address"][0]) == base,
                 f"region {base:#x} does not start with a chunk")
        ends = part["address"] + part["size"]
        _require(np.array_equal(ends[:-1], part["address"][1:]),
                 f"chunks of region {base:#x} leave a gap or overlap")
        _require(int(ends[-1]) == base + size, f"chunks of region {base:#x} do not end at its end")
        # TF's TryToCoalesce merges one neighbour on each side, so once tagged
        # chunks pass the safe frontier a merged chunk can end up beside another
        # free chunk; that is TF's behaviour, and only possible after timestamps.
        if not adjacent_free_allowed:
            free = ~part["in_use"]
            _require(not np.any(free[:-1] & free[1:]),
                     f"two adjacent free chunks in region {base:#x}")
        total += hi - lo
    _require(total == records.shape[0], "a chunk lies outside every region")


def _check_records(records, regions, counters, largest, limit, bins_by_size=True) -> None:
    addresses = records["address"]
    _require(np.all(records["size"] % MIN_ALLOCATION == 0), "a chunk size is not a multiple of 256")
    _require(np.all(addresses % MIN_ALLOCATION == 0), "a chunk address is not 256-aligned")
    used = records["in_use"]
    _require(np.all(records["requested_size"][used] <= records["size"][used]),
             "an in-use chunk is smaller than its request")
    _require(np.all(records["requested_size"][used] > 0), "an in-use chunk has no request")
    expected_bins = np.array([bin_of(int(s), MIN_ALLOCATION, NUM_BINS) for s in records["size"]],
                             dtype=np.int64)
    _require(not bins_by_size or np.array_equal(records["bin"][~used], expected_bins[~used]),
             "a free chunk is not in the bin for its size")
    _require(np.all(records["bin"][used] == -1), "an in-use chunk is in a bin")
    ids = records["allocation_id"][used]
    _require(np.unique(ids).size == ids.size and np.all(ids > 0), "allocation ids not unique")
    in_use = int(records["size"][used].sum())
    _require(counters["bytes_in_use"] == in_use,
             f"bytes_in_use {counters['bytes_in_use']} != sum of in-use chunks {in_use}")
    pool = sum(s for _, s in regions)
    _require(counters["pool_bytes"] == pool,
             f"pool bytes {counters['pool_bytes']} != sum of regions {pool}")
    _require(pool <= limit, "pool exceeds the memory limit")
    _require(counters["peak_bytes_in_use"] >= in_use, "peak_bytes_in_use below bytes_in_use")
    _require(counters["peak_pool_bytes"] >= pool, "peak pool bytes below pool bytes")
    free_sizes = records["size"][~used]
    expect_largest = int(free_sizes.max()) if free_sizes.size else 0
    _require(largest == expect_largest, f"largest free {largest} != {expect_largest}")


def _merged(ranges) -> list[tuple[int, int]]:
    """``(start, size)`` ranges in address order with adjacent ones joined."""
    out: list[tuple[int, int]] = []
    for start, size in sorted(ranges):
        if out and out[-1][0] + out[-1][1] == start:
            out[-1] = (out[-1][0], out[-1][1] + size)
        else:
            out.append((start, size))
    return out


def _check_compact(a, records, regions) -> None:
    """Backend pieces tile the regions exactly; the release rule has been applied."""
    pieces = list(a._pieces.items())
    _require(sum(size for _, (size, _) in pieces) == a._counters()["pool_bytes"],
             "backend pieces do not add up to the pool")
    k = 0
    for base, size in regions:
        pos, newest = base, base
        while k < len(pieces) and pieces[k][0] < base + size:
            _require(pieces[k][0] == pos, f"backend pieces of region {base:#x} leave a gap")
            newest, pos = pieces[k][0], pieces[k][0] + pieces[k][1][0]
            k += 1
        _require(pos == base + size, f"backend pieces do not end where region {base:#x} ends")
        space = a._space_of(base)
        lo, hi = np.searchsorted(records["address"], [base, base + size])
        part = records[lo:hi]
        _require(np.all(part["bin"][~part["in_use"]] == space),
                 f"a free chunk of region {base:#x} is not in its space's bin {space}")
        _require(all(a._pieces[p][1] == space for p in a._pieces.irange(base, base + size - 1)),
                 f"region {base:#x} holds a piece of another space's backend")
        if hasattr(a, "_regions"):
            row = a._row(base)
            _require(int(a._regions[row]["last_piece"]) == newest,
                     f"region {base:#x}: last_piece is not its newest backend piece")
        tail = base + size - a._tail_start(base, base + size)
        _require(a.release_threshold == 0 or a._timestamps_used
                 or tail < a.release_threshold or a._tail_start(base, base + size) > newest,
                 f"region {base:#x} keeps a releasable free tail of {tail} bytes")
    _require(k == len(pieces), "a backend piece lies outside every region")
    # What the backends hold is exactly the pieces: a page given back from the
    # middle of a region (remapping) is unmapped there too.
    for space, backend in enumerate(a._space_backends):
        mapped = getattr(backend, "mapped_ranges", None)
        if mapped is None or not backend.supports_coalescing:
            continue
        held = _merged((p, s) for p, (s, sp) in pieces if sp == space)
        _require(held == _merged(mapped()),
                 f"space {space}: the backend's mapped ranges differ from the pieces")


def _check_caching(a, records, largest) -> None:
    """PyTorch's own consistency rule: every statistic equals what the segments show."""
    used = records["in_use"]
    _require(np.all(records["size"] % C.MIN_BLOCK_SIZE == 0),
             "a block size is not a multiple of 512")
    _require(np.all(records["requested_size"][used] <= records["size"][used]),
             "an in-use block is smaller than its request")
    ids = records["allocation_id"][used]
    _require(np.unique(ids).size == ids.size and np.all(ids > 0), "allocation ids not unique")
    expected = np.zeros((C.NUM_STATS, 3), dtype=np.int64)
    for seg in a._segments():
        pool = 1 + (0 if seg["segment_type"] == "small" else 1)
        blocks = seg["blocks"]
        split = len(blocks) > 1
        seg_records = records[(records["address"] >= seg["address"])
                              & (records["address"] < seg["address"] + seg["total_size"])]
        _require(np.all(seg_records["bin"] == pool - 1), "a block is not in its segment's pool")
        expandable = seg["is_expandable"]
        # An expandable segment's mapped runs are reserved bytes, but PyTorch
        # counts no segment for them and leaves their blocks out of inactive_split.
        rows = [(C.RESERVED_BYTES, seg["total_size"])]
        if not expandable:
            rows.append((C.SEGMENT, 1))
        if seg["total_size"] >= a.max_split_size and not expandable:
            expected[C.OVERSIZE_SEGMENTS, 0] += 1
        for b in blocks:
            if b["state"] == "active_allocated":
                rows += [(C.ALLOCATION, 1), (C.ALLOCATED_BYTES, b["size"]), (C.ACTIVE, 1),
                         (C.ACTIVE_BYTES, b["size"]), (C.REQUESTED_BYTES, b["requested_size"])]
                if b["size"] >= a.max_split_size:
                    expected[C.OVERSIZE_ALLOCATIONS, 0] += 1
            elif split and not expandable:
                rows += [(C.INACTIVE_SPLIT, 1), (C.INACTIVE_SPLIT_BYTES, b["size"])]
        for stat, amount in rows:
            expected[stat, 0] += amount
            expected[stat, pool] += amount
    stats = a._stat_array()
    for s in range(C.NUM_STATS):
        columns = (0,) if s in (C.OVERSIZE_ALLOCATIONS, C.OVERSIZE_SEGMENTS) else (0, 1, 2)
        for p in columns:
            _require(stats[s, p, 0] == expected[s, p],
                     f"{C.STAT_NAMES[s]}[{p}].current {stats[s, p, 0]} != {expected[s, p]}")
            _require(stats[s, p, 1] >= stats[s, p, 0], f"{C.STAT_NAMES[s]}[{p}]: peak < current")
    reserved = int(stats[C.RESERVED_BYTES, 0, 0])
    # Expandable segments map whole pages after a check of the segment size, so
    # PyTorch's reserved bytes may pass its memory fraction.
    _require(a.memory_limit is None or a.expandable_segments or reserved <= a.memory_limit,
             "reserved exceeds the limit")
    if a.expandable_segments:
        if hasattr(a, "_chunks"):
            _check_expandable_tables(a, reserved)
        else:
            _check_expandable(a, reserved)
    _require(a.backend.bytes_held >= reserved, "reserved bytes the backend does not hold")
    free_sizes = records["size"][~used]
    _require(largest == (int(free_sizes.max()) if free_sizes.size else 0), "largest free wrong")


def _check_expandable(a, reserved: int) -> None:
    """Expandable segments (the reference allocator's): blocks tile each reserved
    range; unmapped blocks are whole pages, never adjacent, and exactly the pool's
    unmapped set; free mapped blocks are exactly the pool's free set; the mapped
    bytes are the reserved bytes."""
    mapped = 0
    unmapped_blocks = [set(), set()]
    free_blocks = [set(), set()]
    for seg in a._segments_by_base.values():
        if not seg.page:
            free_blocks[seg.pool].update(id(b) for b in seg.blocks() if not b.allocated)
            mapped += seg.size
            continue
        _require(a._reservations.get(seg.base) == seg.size,
                 f"expandable segment {seg.base:#x} is not its reservation")
        pos, last = seg.base, None
        for b in seg.blocks():
            _require(b.ptr == pos, f"expandable segment {seg.base:#x}: a gap or overlap")
            pos += b.size
            if b.mapped:
                mapped += b.size
                if not b.allocated:
                    free_blocks[seg.pool].add(id(b))
            else:
                _require((b.ptr - seg.base) % seg.page == 0 and b.size % seg.page == 0,
                         f"unmapped block {b.ptr:#x} is not whole pages")
                _require(last is None or last.mapped, f"two adjacent unmapped blocks {b.ptr:#x}")
                unmapped_blocks[seg.pool].add(id(b))
            last = b
        _require(pos == seg.base + seg.size, f"expandable segment {seg.base:#x} not tiled")
    for pool in (C.SMALL_POOL, C.LARGE_POOL):
        _require({id(b) for b in a._unmapped[pool]} == unmapped_blocks[pool],
                 "the unmapped set is not the unmapped blocks")
        _require({id(b) for b in a._pools[pool]} == free_blocks[pool],
                 "a pool is not its free mapped blocks")
    _require(mapped == reserved, f"mapped bytes {mapped} are not the reserved bytes {reserved}")


def _check_expandable_tables(a, reserved: int) -> None:
    """Expandable segments in the tables: each is its reservation; unmapped
    chunks are whole pages and never adjacent; the pool bytes the batch kernel
    samples are the reserved bytes."""
    chunks, regions = a._chunks, a._regions
    mapped = 0
    for r in np.flatnonzero(regions["size"] > 0):
        base, page = int(regions[r]["base"]), int(regions[r]["page"])
        if not page:
            mapped += int(regions[r]["size"])
            continue
        _require(a._reservations.get(base) == int(regions[r]["size"]),
                 f"expandable region {base:#x} is not its reservation")
        h, last_unmapped = int(regions[r]["first"]), False
        while h != L.NO_HANDLE:
            unmapped = chunks[h]["allocation_id"] == L.UNMAPPED
            if unmapped:
                _require((int(chunks[h]["ptr"]) - base) % page == 0
                         and int(chunks[h]["size"]) % page == 0,
                         f"unmapped chunk {int(chunks[h]['ptr']):#x} is not whole pages")
                _require(not last_unmapped, "two adjacent unmapped chunks")
                _require(chunks[h]["bin"] == L.NO_HANDLE, "an unmapped chunk is in a pool")
            else:
                mapped += int(chunks[h]["size"])
            last_unmapped = unmapped
            h = int(chunks[h]["next"])
    _require(mapped == reserved == int(a._state[L.S_POOL_BYTES]),
             f"mapped bytes {mapped}, reserved {reserved} and pool bytes "
             f"{int(a._state[L.S_POOL_BYTES])} differ")


def _check_tree(chunks, bins, b) -> list[int]:
    """In-order handles of bin ``b``'s treap, checking links, order and heap property."""
    root = int(bins[b]["root"])
    out: list[int] = []
    if root == L.NO_HANDLE:
        return out
    _require(chunks[root]["parent"] == L.NO_HANDLE, f"bin {b}: root has a parent")
    stack, node = [], root
    while stack or node != L.NO_HANDLE:
        while node != L.NO_HANDLE:
            stack.append(node)
            for side in ("left", "right"):
                child = int(chunks[node][side])
                if child != L.NO_HANDLE:
                    _require(chunks[child]["parent"] == node, f"bin {b}: bad parent link")
                    _require(chunks[child]["priority"] <= chunks[node]["priority"],
                             f"bin {b}: heap order broken")
            node = int(chunks[node]["left"])
        node = stack.pop()
        out.append(node)
        _require(len(out) <= chunks.shape[0], f"bin {b}: cycle in tree")
        node = int(chunks[node]["right"])
    keys = [(int(chunks[h]["size"]), int(chunks[h]["ptr"])) for h in out]
    _require(all(x < y for x, y in zip(keys, keys[1:])), f"bin {b}: not in (size, ptr) order")
    return out


def _check_tables(a) -> None:
    chunks, bins, regions, pmap, st = a._chunks, a._bins, a._regions, a._pmap, a._state
    # Kernels find the tables through the state (kernels.guard), and lock-free
    # calls must see the lock held (by this check) exactly once more than at rest.
    for table, addr, rows in ((chunks, L.S_CHUNKS_ADDR, L.S_CHUNK_ROWS),
                              (bins, L.S_BINS_ADDR, L.S_NUM_BINS),
                              (regions, L.S_REGIONS_ADDR, L.S_REGION_ROWS),
                              (pmap, L.S_PMAP_ADDR, L.S_PMAP_SLOTS),
                              (a._tsq, L.S_TSQ_ADDR, L.S_TSQ_SLOTS)):
        _require(st[addr] == table.ctypes.data and st[rows] == table.shape[0],
                 "the state does not locate the current tables")
    # The single-call allocate and free find the state by its address (state_at).
    _require(st[L.S_STATE_SLOTS] == st.shape[0] and a._state_address == st.ctypes.data,
             "the state's recorded length or address is not the state's")
    _require(st[L.S_LOCK_DEPTH] == a._lock.rest_depth + 1,
             f"lock depth {st[L.S_LOCK_DEPTH]} while only the checker holds the lock")
    live = np.flatnonzero(chunks["size"] > 0)
    free_rows = np.flatnonzero(chunks["size"] == 0)
    # Free-handle list: exactly the unused rows.
    seen, h = set(), int(st[L.S_FREE_HEAD])
    while h != L.NO_HANDLE:
        _require(h not in seen, "cycle in the free-handle list")
        seen.add(h)
        h = int(chunks[h]["next"])
    _require(seen == set(free_rows.tolist()), "free-handle list != unused rows")
    _require(st[L.S_FREE_ROWS] == len(seen), "free-row count wrong")
    # Region walks cover every live row once, with consistent links.
    visited = 0
    for r in np.flatnonzero(regions["size"] > 0):
        h, prev = int(regions[r]["first"]), L.NO_HANDLE
        while h != L.NO_HANDLE:
            _require(chunks[h]["prev"] == prev, f"region {r}: bad prev link")
            _require(chunks[h]["region"] == r, f"region {r}: chunk has wrong region")
            visited += 1
            prev, h = h, int(chunks[h]["next"])
        _require(regions[r]["last"] == prev, f"region {r}: wrong last chunk")
    _require(visited == live.size, "live rows not reached from any region")
    _require(st[L.S_NUM_REGIONS] == int((regions["size"] > 0).sum()), "region count wrong")
    # Bins: every free chunk in its bin's tree exactly once; the bitmap of non-empty bins right.
    in_trees = []
    for b in range(bins.shape[0]):
        members = _check_tree(chunks, bins, b)
        _require(all(chunks[m]["bin"] == b for m in members), f"bin {b}: member has wrong bin")
        in_trees.extend(members)
    nonempty = sum(1 << b for b in range(bins.shape[0]) if bins[b]["root"] != L.NO_HANDLE)
    _require(int(st[L.S_NONEMPTY_BINS]) & ((1 << 64) - 1) == nonempty,
             "the bitmap of non-empty bins differs from the bins")
    free_live = live[chunks["allocation_id"][live] == -1]
    _require(sorted(in_trees) == sorted(free_live.tolist()),
             "free chunks and bin members differ")
    per_space = int(st[L.S_SPACE_BINS])
    if per_space:  # spaces of size bins (compact's spaces, caching's pools): the bin for the size
        for h in free_live.tolist():
            space = int(regions[chunks[h]["region"]]["bin"])
            size_bin = bin_of(int(chunks[h]["size"]), int(st[L.S_MIN_ALLOCATION]), per_space)
            _require(chunks[h]["bin"] == space * per_space + size_bin,
                     f"free chunk {h} is not in the bin for its size in space {space}")
    # Pointer map: exactly the in-use chunks.
    used = live[chunks["allocation_id"][live] > 0]
    keys = pmap[pmap[:, 0] != 0]
    _require(st[L.S_MAP_COUNT] == keys.shape[0] == used.size, "pointer map size wrong")
    mapping = dict(zip(keys[:, 0].tolist(), keys[:, 1].tolist()))
    for h in used.tolist():
        _require(mapping.get(int(chunks[h]["ptr"])) == h, "pointer map misses an in-use chunk")
        _require(a._lookup(int(chunks[h]["ptr"])) is not None, "pointer lookup fails")
