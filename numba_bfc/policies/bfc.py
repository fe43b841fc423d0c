"""TensorFlow's BFC policy: best fit over size bins, split rule, one kernel per call.

``bfc_allocate`` is TF's ``FindChunkPtr`` + ``AllocateChunkFromLowEnd`` +
``FinishChunkAllocation``; ``bfc_deallocate`` is ``DeallocateRawInternal``
without a timing counter. Growth (``Extend``) needs the backend, so it stays
in the façade: a kernel answers ``NOT_FOUND`` and the façade extends and calls
again. The façade calls the ``*_op`` kernels, which take the state alone
(``kernels.guard``); the rest are helpers, inlined into them.
"""

from __future__ import annotations

import numpy as np

from ..kernels.chunks import (
    HONOUR_TIMESTAMPS,
    bin_for_size,
    insert_free,
    largest_free_chunk,
    next_nonempty_bin,
    queue_timestamped,
    remove_free,
    room_for_operation,
    round_up,
    split_chunk,
    try_to_coalesce,
)
from ..kernels.fields import field, set_field
from ..kernels.guard import may_proceed, state_at, table_views
from ..kernels.jit import fast_operation, inner, njit, operation
from ..kernels.layout import (
    FAILED_HERE,
    INVALID_POINTER,
    NEED_ROWS,
    NO_HANDLE,
    NOT_FOUND,
    S_BYTES_IN_USE,
    S_FAIL_LIMIT,
    S_FAILED_LARGEST_FREE,
    S_LARGEST_ALLOC_SIZE,
    S_MAX_INTERNAL_FRAGMENTATION,
    S_MIN_ALLOCATION,
    S_NEXT_ALLOCATION_ID,
    S_NUM_ALLOCS,
    S_NUM_BINS,
    S_PEAK_BYTES_IN_USE,
    S_POOL_BYTES,
    S_TSQ_COUNT,
    TABLES_BUSY,
)
from ..kernels.ptrmap import map_insert, map_remove
from ..kernels.tree import tree_lower_bound, tree_successor

UNTAGGED = np.int64(0)  # freed_before / freed_at_count: no timing count (not a literal 0,
# which Numba would compile the callee for separately)


@njit(cache=True, inline="always")
def alignment_padding(ptr, alignment, quantum):
    """Bytes to skip so an allocation at ``ptr`` starts aligned (a whole chunk)."""
    aligned = (ptr + alignment - 1) & ~(alignment - 1)
    return round_up(aligned - ptr, quantum)


@inner
def fit_in_tree(chunks, root, rounded, alignment, quantum, freed_before):
    """First chunk in ``(size, ptr)`` order of one ordered free set that holds
    ``rounded`` bytes after alignment padding (in ``quantum`` units) and is not
    tagged later than ``freed_before``. Returns a handle or -1."""
    h = tree_lower_bound(chunks, root, rounded)
    while h != NO_HANDLE:
        if freed_before > 0 and freed_before < field(chunks, h, "freed_at_count"):
            h = tree_successor(chunks, h)
            continue
        pad = alignment_padding(field(chunks, h, "ptr"), alignment, quantum)
        if field(chunks, h, "size") >= rounded + pad:
            return h
        h = tree_successor(chunks, h)
    return NO_HANDLE


@njit(cache=True, inline="always")
def find_fit(chunks, bins, state, rounded, alignment, freed_before, first_bin, stop_bin):
    """Best fit: first chunk in ``(size, ptr)`` order, in bins ``first_bin`` up to
    ``stop_bin`` (exclusive), that holds ``rounded`` bytes after alignment padding
    and is not tagged later than ``freed_before``. Returns a handle or -1.
    """
    quantum = state[S_MIN_ALLOCATION]
    b = next_nonempty_bin(state, first_bin, stop_bin)
    while b < stop_bin:
        h = fit_in_tree(chunks, field(bins, b, "root"), rounded, alignment, quantum, freed_before)
        if h != NO_HANDLE:
            return h
        b = next_nonempty_bin(state, b + 1, stop_bin)
    return NO_HANDLE


@njit(cache=True, inline="always")
def should_split(size, rounded, max_internal_fragmentation):
    """TF's rule: split if the chunk is at least twice the request, or keeping
    it whole would waste at least ``max_internal_fragmentation`` bytes."""
    return size >= rounded * 2 or size - rounded >= max_internal_fragmentation


@inner
def take_chunk(chunks, bins, regions, pmap, state, h, num_bytes, rounded, alignment):
    """Hand out free chunk ``h`` for ``num_bytes`` (TF's ``AllocateChunkFromLowEnd``
    + ``FinishChunkAllocation``): split off alignment padding before it and,
    by the split rule, the remainder after it. Returns the address."""
    quantum = state[S_MIN_ALLOCATION]
    remove_free(chunks, bins, state, h)
    pad = alignment_padding(field(chunks, h, "ptr"), alignment, quantum)
    if pad > 0:
        # The unaligned prefix stays behind as a free chunk of its own.
        aligned = split_chunk(chunks, bins, regions, state, h, pad)
        insert_free(chunks, bins, regions, state, h)
        h = aligned
    if should_split(field(chunks, h, "size"), rounded, state[S_MAX_INTERNAL_FRAGMENTATION]):
        insert_free(chunks, bins, regions, state,
                    split_chunk(chunks, bins, regions, state, h, rounded))
    size = field(chunks, h, "size")
    set_field(chunks, h, "requested_size", num_bytes)
    set_field(chunks, h, "allocation_id", state[S_NEXT_ALLOCATION_ID])
    state[S_NEXT_ALLOCATION_ID] += 1
    state[S_NUM_ALLOCS] += 1
    state[S_BYTES_IN_USE] += size
    state[S_PEAK_BYTES_IN_USE] = max(state[S_PEAK_BYTES_IN_USE], state[S_BYTES_IN_USE])
    state[S_LARGEST_ALLOC_SIZE] = max(state[S_LARGEST_ALLOC_SIZE], size)
    ptr = field(chunks, h, "ptr")
    map_insert(pmap, state, ptr, h)
    return ptr


@njit(cache=True, inline="always")
def free_bytes(state):
    """Bytes of the pool in no allocation: the sum of the free chunks' sizes,
    so no free chunk is larger (BFC's and compact's counters; the invariant
    checker holds them to the tables)."""
    return state[S_POOL_BYTES] - state[S_BYTES_IN_USE]


@njit(cache=True, inline="always")
def allocate_from_bins(chunks, bins, regions, pmap, state, num_bytes, rounded, alignment,
                       freed_before, first_bin, stop_bin):
    """Serve ``num_bytes`` (``rounded`` after rounding, ``alignment`` at least the
    quantum) by best fit in bins ``first_bin..stop_bin-1``.

    Returns the address (> 0), ``NOT_FOUND`` or ``NEED_ROWS``; on either code
    nothing has changed.
    """
    if free_bytes(state) < rounded:
        return NOT_FOUND  # no chunk can hold it: no pass over the bins (growth, failures)
    if not room_for_operation(pmap, state):
        return NEED_ROWS
    h = find_fit(chunks, bins, state, rounded, alignment, freed_before, first_bin, stop_bin)
    if h == NO_HANDLE:
        return NOT_FOUND
    return take_chunk(chunks, bins, regions, pmap, state, h, num_bytes, rounded, alignment)


@njit(cache=True, inline="always")
def bfc_allocate(chunks, bins, regions, pmap, state, num_bytes, alignment, freed_before):
    """Serve ``num_bytes`` (> 0) from the size bins, from the request's bin up.

    Returns the address (> 0), ``NOT_FOUND`` or ``NEED_ROWS``; on either code
    nothing has changed.
    """
    quantum = state[S_MIN_ALLOCATION]
    rounded = round_up(num_bytes, quantum)
    nbins = state[S_NUM_BINS]
    return allocate_from_bins(chunks, bins, regions, pmap, state, num_bytes, rounded,
                              max(alignment, quantum), freed_before,
                              bin_for_size(rounded, quantum, nbins), nbins)


@inner
def _mark_free(chunks, pmap, state, ptr, freed_at_count):
    h = map_remove(pmap, state, ptr)
    if h == NO_HANDLE:
        return NO_HANDLE
    set_field(chunks, h, "allocation_id", -1)
    set_field(chunks, h, "freed_at_count", freed_at_count)
    state[S_BYTES_IN_USE] -= field(chunks, h, "size")
    return h


@inner
def free_and_coalesce(chunks, bins, regions, pmap, state, ptr):
    """Free the allocation at ``ptr``, coalesce and bin it; returns ``(size,
    handle)``: its size and the free chunk it ended up in, or
    ``(INVALID_POINTER, -1)``."""
    h = _mark_free(chunks, pmap, state, ptr, UNTAGGED)
    if h == NO_HANDLE:
        return INVALID_POINTER, NO_HANDLE
    size = field(chunks, h, "size")
    h = try_to_coalesce(chunks, bins, regions, state, h, HONOUR_TIMESTAMPS)
    insert_free(chunks, bins, regions, state, h)
    return size, h


@inner  # a kernel of its own: the batch kernel takes it as a value (policies.batch)
def bfc_deallocate(chunks, bins, regions, pmap, state, ptr):
    """Free the allocation at ``ptr`` and coalesce; returns its size or ``INVALID_POINTER``."""
    return free_and_coalesce(chunks, bins, regions, pmap, state, ptr)[0]


@inner
def bfc_deallocate_timestamped(chunks, bins, regions, pmap, state, tsq, ptr, count):
    """Free ``ptr`` tagged with timing count ``count`` (> 0): binned but not
    coalesced, and queued until the safe frontier passes it."""
    if state[S_TSQ_COUNT] >= tsq.shape[0]:
        return NEED_ROWS
    h = _mark_free(chunks, pmap, state, ptr, count)
    if h == NO_HANDLE:
        return INVALID_POINTER
    insert_free(chunks, bins, regions, state, h)
    queue_timestamped(chunks, state, tsq, h)
    return field(chunks, h, "size")


@njit(cache=True, inline="always")
def fails_without_growth(state, rounded, freed_before):
    """True if the façade's slow path (``BFCBase._allocate_slow``) would fail a
    request of ``rounded`` bytes that no free chunk fits, changing nothing:
    the pool cannot grow by ``rounded`` bytes within the limit (TF's
    ``Extend`` refuses before it asks the backend) and no timestamped chunk
    waits to be merged. The façade allows it (``S_FAIL_LIMIT``) only without
    garbage collection, its one other step."""
    limit = state[S_FAIL_LIMIT]
    quantum = state[S_MIN_ALLOCATION]
    return (limit > 0 and rounded > (limit - state[S_POOL_BYTES]) // quantum * quantum
            and (freed_before != 0 or state[S_TSQ_COUNT] == 0))


@fast_operation
def bfc_allocate_op(state_address, num_bytes, locked):
    """``bfc_allocate`` of ``num_bytes`` aligned to the quantum, with no timing
    count (the façade's common request), on the tables the state at
    ``state_address`` records (``kernels.guard.state_at``). With ``locked``
    false (a caller without the façade's lock) it answers ``TABLES_BUSY``,
    changing nothing, while the lock is held (``kernels.guard``).

    Where no chunk fits and the slow path could only fail
    (``fails_without_growth``), it answers ``FAILED_HERE`` and records the
    largest free chunk in ``state[S_FAILED_LARGEST_FREE]``; nothing else
    changes.
    """
    state = state_at(state_address)
    return _allocate_on_tables(state, num_bytes, state[S_MIN_ALLOCATION], UNTAGGED, locked)


@operation
def bfc_allocate_aligned_op(state, num_bytes, alignment, freed_before, locked):
    """``bfc_allocate_op`` with any ``alignment`` and timing count
    ``freed_before``: a kernel of its own, so that the common request passes
    three arguments (about 20 ns less per allocate+free pair from Python),
    and a program that never asks for more never compiles it."""
    return _allocate_on_tables(state, num_bytes, alignment, freed_before, locked)


@inner
def _allocate_on_tables(state, num_bytes, alignment, freed_before, locked):
    """Both allocation operations: the guard, ``bfc_allocate``, and
    ``FAILED_HERE`` where the slow path could only fail."""
    if not may_proceed(state, locked):
        return TABLES_BUSY
    chunks, bins, regions, pmap, _, st = table_views(state)
    p = bfc_allocate(chunks, bins, regions, pmap, st, num_bytes, alignment, freed_before)
    if p == NOT_FOUND and fails_without_growth(st, round_up(num_bytes, st[S_MIN_ALLOCATION]),
                                               freed_before):
        st[S_FAILED_LARGEST_FREE] = largest_free_chunk(chunks, bins)
        return FAILED_HERE
    return p


@fast_operation
def bfc_deallocate_op(state_address, ptr, locked):
    """``bfc_deallocate`` on the recorded tables; see ``bfc_allocate_op`` for
    ``state_address`` and ``locked``."""
    state = state_at(state_address)
    if not may_proceed(state, locked):
        return TABLES_BUSY
    chunks, bins, regions, pmap, _, st = table_views(state)
    return bfc_deallocate(chunks, bins, regions, pmap, st, ptr)


@operation
def bfc_deallocate_timestamped_op(state, ptr, count):
    """``bfc_deallocate_timestamped`` on the recorded tables (under the lock).
    An operation of its own, so that only programs with timing counters
    compile it."""
    chunks, bins, regions, pmap, tsq, st = table_views(state)
    return bfc_deallocate_timestamped(chunks, bins, regions, pmap, st, tsq, ptr, count)
