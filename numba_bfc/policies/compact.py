"""The ``compact`` policy: BFC's kernels tuned for the smallest footprint.

Two spaces, each one ordered free set (bin) of its own: requests smaller
than ``state[S_SMALL_SIZE]`` are served from the small space, the rest from
the large one, so short-lived small blocks do not pin holes between large
ones. A region's space is its fixed bin (``regions["bin"]``, as the caching
policy's pools). Within a space the choice is BFC's best fit (smallest chunk
that fits, lowest address among equal sizes: one ordered set gives exactly
what BFC's size bins give), handed out by BFC's ``take_chunk`` with the split
threshold at one quantum, so a chunk is always split down to the rounded
request instead of handed out whole when it is less than twice the request.

Growth and giving memory back need the backend and stay in the façade
(``numba_bfc.allocators.CompactAllocator``): it grows a space by the pages the
request is short of, and gives whole free backend pieces at the end of a
space back. The kernel's part of that is to notice, on a free, that the end
has become worth giving back.
"""

from __future__ import annotations

import numpy as np

from ..kernels.chunks import free_tail_start, round_up
from ..kernels.guard import may_proceed, table_views
from ..kernels.jit import inner, njit, operation
from ..kernels.layout import NO_HANDLE, S_MIN_ALLOCATION, STATE_SIZE, TABLES_BUSY
from .bfc import allocate_from_bins, free_and_coalesce

S_RELEASE_THRESHOLD = STATE_SIZE  # free tail bytes that trigger a release (0: never)
S_RELEASE_DUE = STATE_SIZE + 1  # region row + 1 whose tail is due, 0 if none
S_SMALL_SIZE = STATE_SIZE + 2  # requests below this go to the small space (0: one space)
COMPACT_STATE_SIZE = STATE_SIZE + 3

LARGE_SPACE = 0  # the bin (and region ``bin``) of each space
SMALL_SPACE = 1
NUM_SPACES = 2


@njit(cache=True, inline="always")
def space_for(rounded, state):
    """The space a request of ``rounded`` bytes is served from."""
    return SMALL_SPACE if rounded < state[S_SMALL_SIZE] else LARGE_SPACE


@inner
def compact_allocate(chunks, bins, regions, pmap, state, num_bytes, alignment, freed_before):
    """Serve ``num_bytes`` (> 0) by best fit in its space.

    Returns the address (> 0), ``NOT_FOUND`` or ``NEED_ROWS``; on either code
    nothing has changed.
    """
    quantum = state[S_MIN_ALLOCATION]
    rounded = round_up(num_bytes, quantum)
    space = space_for(rounded, state)
    return allocate_from_bins(chunks, bins, regions, pmap, state, num_bytes, rounded,
                              max(alignment, quantum), freed_before, space, space + 1)


@inner
def tail_release_due(chunks, regions, state, r):
    """True if region ``r`` ends in a free chunk of at least the release
    threshold that covers its newest backend piece (so some can go back)."""
    threshold = state[S_RELEASE_THRESHOLD]
    if threshold <= 0:
        return False
    start = free_tail_start(chunks, regions, r)
    return (regions[r]["base"] + regions[r]["size"] - start >= threshold
            and start <= regions[r]["last_piece"])


@inner
def top_region_tail(chunks, regions, space):
    """``(end, free tail bytes)`` of the region of ``space`` that ends highest;
    ``(0, 0)`` if the space has none. Growth on a contiguous backend extends
    that region."""
    best = np.int64(NO_HANDLE)
    end = 0
    for r in range(regions.shape[0]):
        if (regions[r]["size"] > 0 and regions[r]["bin"] == space
                and regions[r]["base"] + regions[r]["size"] > end):
            best = r
            end = regions[r]["base"] + regions[r]["size"]
    if best < 0:
        return 0, 0
    return end, end - free_tail_start(chunks, regions, best)


@inner
def compact_deallocate(chunks, bins, regions, pmap, state, ptr):
    """Free ``ptr`` and coalesce, as ``bfc_deallocate``; returns its size or
    ``INVALID_POINTER``. Sets ``state[S_RELEASE_DUE]`` when the region's free
    tail should go back to the backend."""
    size, h = free_and_coalesce(chunks, bins, regions, pmap, state, ptr)
    if h != NO_HANDLE:
        r = np.int64(chunks[h]["region"])
        if tail_release_due(chunks, regions, state, r):
            state[S_RELEASE_DUE] = r + 1
    return size


@operation
def compact_allocate_op(state, num_bytes, alignment, freed_before, locked):
    """``compact_allocate`` on the tables the state records. With ``locked``
    false (a caller without the façade's lock) it answers ``TABLES_BUSY``,
    changing nothing, while the lock is held (``kernels.guard``)."""
    if not may_proceed(state, locked):
        return TABLES_BUSY
    chunks, bins, regions, pmap, _, st = table_views(state)
    return compact_allocate(chunks, bins, regions, pmap, st, num_bytes, alignment,
                            freed_before)


@operation
def compact_deallocate_op(state, ptr, locked):
    """``compact_deallocate`` on the recorded tables. With ``locked`` false it
    also steps aside when a free may make a give-back due (a release threshold
    is set), since that decision must stay under the lock with the free.
    (Timestamped frees are BFC's: ``bfc_deallocate_timestamped_op``.)"""
    if not locked and state[S_RELEASE_THRESHOLD] > 0:
        return TABLES_BUSY
    if not may_proceed(state, locked):
        return TABLES_BUSY
    chunks, bins, regions, pmap, _, st = table_views(state)
    return compact_deallocate(chunks, bins, regions, pmap, st, ptr)


@operation
def top_region_tail_op(state, space):
    """``top_region_tail`` on the recorded tables (under the lock)."""
    chunks, _, regions, _, _, _ = table_views(state)
    return top_region_tail(chunks, regions, space)
