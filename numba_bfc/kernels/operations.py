"""Chunk-level operations the façade calls: ``state`` and scalars in, views inside.

Each is one helper of ``kernels.chunks`` or ``kernels.ptrmap`` run on the
tables the state records (``kernels.guard.table_views``), so the helpers are
compiled once, for the views' types, and pass no reference-counted arrays.
All are called with the façade's lock held, but ``live_chunk_op``: it takes
the state's address and runs lock-free first, as the single-call allocate
and free do (``kernels.guard``).
"""

from __future__ import annotations

from .chunks import (
    add_region,
    add_separate_region,
    free_region_rows,
    free_tail_start,
    join_regions,
    largest_free_chunk,
    merge_timestamped_chunks,
    page_runs,
    punch_region,
    region_holding,
    remove_region,
    space_regions,
    trim_region,
)
from .fields import field
from .guard import may_proceed, state_at, table_views
from .jit import operation
from .layout import INVALID_POINTER, NO_HANDLE, TABLES_BUSY
from .ptrmap import map_lookup, map_rehash


@operation
def add_region_op(state, ptr, size, pool_bin):
    """``chunks.add_region`` on the recorded tables."""
    chunks, bins, regions, _, _, st = table_views(state)
    return add_region(chunks, bins, regions, st, ptr, size, pool_bin)


@operation
def add_separate_region_op(state, ptr, size, pool_bin):
    """``chunks.add_separate_region`` on the recorded tables."""
    chunks, bins, regions, _, _, st = table_views(state)
    return add_separate_region(chunks, bins, regions, st, ptr, size, pool_bin)


@operation
def remove_region_op(state, r):
    """``chunks.remove_region`` on the recorded tables."""
    chunks, bins, regions, _, _, st = table_views(state)
    return remove_region(chunks, bins, regions, st, r)


@operation
def free_region_rows_op(state, out):
    """``chunks.free_region_rows`` on the recorded tables."""
    chunks, _, regions, _, _, _ = table_views(state)
    return free_region_rows(chunks, regions, out)


@operation
def space_regions_op(state, space, out):
    """``chunks.space_regions`` on the recorded tables."""
    chunks, _, regions, _, _, _ = table_views(state)
    return space_regions(chunks, regions, space, out)


@operation
def page_runs_op(state, space, quantum, out):
    """``chunks.page_runs`` on the recorded tables."""
    chunks, _, regions, _, _, _ = table_views(state)
    return page_runs(chunks, regions, space, quantum, out)


@operation
def region_holding_op(state, ptr, starting):
    """``chunks.region_holding`` on the recorded tables: a pass over the
    region table in the kernel, where NumPy's takes microseconds."""
    _, _, regions, _, _, _ = table_views(state)
    return region_holding(regions, ptr, starting)


@operation
def largest_free_chunk_op(state):
    """``chunks.largest_free_chunk`` on the recorded tables."""
    chunks, bins, _, _, _, _ = table_views(state)
    return largest_free_chunk(chunks, bins)


@operation
def merge_timestamped_op(state, required_bytes, safe_frontier, scratch):
    """``chunks.merge_timestamped_chunks`` on the recorded tables, with
    ``scratch`` (int64, a row per queued chunk, 4 columns) to work in."""
    chunks, bins, regions, _, tsq, st = table_views(state)
    return merge_timestamped_chunks(chunks, bins, regions, st, tsq, required_bytes,
                                    safe_frontier, scratch)


@operation
def free_tail_start_op(state, r):
    """``chunks.free_tail_start`` on the recorded tables."""
    chunks, _, regions, _, _, _ = table_views(state)
    return free_tail_start(chunks, regions, r)


@operation
def trim_region_op(state, r, new_end, last_piece):
    """``chunks.trim_region`` on the recorded tables."""
    chunks, bins, regions, _, _, st = table_views(state)
    return trim_region(chunks, bins, regions, st, r, new_end, last_piece)


@operation
def punch_region_op(state, r, lo, hi, left_last_piece):
    """``chunks.punch_region`` on the recorded tables."""
    chunks, bins, regions, _, _, st = table_views(state)
    return punch_region(chunks, bins, regions, st, r, lo, hi, left_last_piece)


@operation
def join_regions_op(state, ra, rb):
    """``chunks.join_regions`` on the recorded tables."""
    chunks, bins, regions, _, _, st = table_views(state)
    join_regions(chunks, bins, regions, st, ra, rb)


@operation
def live_chunk_op(state_address, ptr, locked):
    """``(status, requested_size, size, allocation_id)`` of the live allocation
    at ``ptr``, on the tables the state at ``state_address`` records (as the
    single-call allocate and free, ``kernels.guard.state_at``): status 0, or
    ``INVALID_POINTER`` (nothing live starts there), or ``TABLES_BUSY`` (with
    ``locked`` false, while the lock is held); the sizes are then 0. One call,
    lock-free where it may be, for ``allocated_size`` and its kin, which a
    limiting or tracking adaptor asks on every allocation."""
    state = state_at(state_address)
    if not may_proceed(state, locked):
        return TABLES_BUSY, 0, 0, 0
    chunks, _, _, pmap, _, _ = table_views(state)
    h = map_lookup(pmap, ptr)
    if h == NO_HANDLE:
        return INVALID_POINTER, 0, 0, 0
    return (0, field(chunks, h, "requested_size"), field(chunks, h, "size"),
            field(chunks, h, "allocation_id"))


@operation
def map_rehash_op(state, new):
    """``ptrmap.map_rehash`` from the recorded pointer map into the empty
    table ``new`` (the caller then records ``new`` in its place)."""
    _, _, _, old, _, st = table_views(state)
    map_rehash(old, new, st)
