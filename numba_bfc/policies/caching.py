"""PyTorch's CUDA caching-allocator policy, over the same tables and kernels as BFC.

The tables are BFC's: regions are PyTorch's segments (one backend allocation
each, never coalesced), and a region's ``bin`` fixes the pool of every block
in it, small or large. Each pool is ordered by ``(size, address)``, PyTorch's
``BlockComparatorSize`` for a single stream, as size bins of treaps
(``POOL_BINS`` per pool, as the compact policy's spaces): a walk of the pool's
bins from a size's up visits its blocks in that order (``pool_lower_bound``,
``pool_successor``), and each tree holds only the blocks of one power of two.
Split, merge, lookup and the pointer map are the shared kernels; this module
adds PyTorch's size rounding, the oversize rules of ``get_free_block``,
``should_split``, and the bookkeeping of its statistics.

Policy parameters and statistics live in the state array past the slots every
policy shares (``C_*`` below), so the kernels take the same five tables as BFC.
A free block's ``freed_at_count`` holds its pool's lookup count when it entered
the pool (PyTorch's ``gc_count_base``), the clock the garbage collector ages
blocks by.
"""

from __future__ import annotations

import numpy as np

from ..kernels.chunks import (
    IGNORE_TIMESTAMPS,
    add_separate_region,
    bin_for_size,
    count_pool_bytes,
    floor_log2,
    insert_free,
    largest_free_chunk,
    merge_chunks,
    next_nonempty_bin,
    open_region,
    region_in_use,
    release_row,
    remove_free,
    remove_region,
    room_for_operation,
    round_up,
    split_chunk,
    try_to_coalesce,
)
from ..kernels.fields import field, set_field
from ..kernels.guard import may_proceed, state_at, table_views
from ..kernels.jit import fast_operation, helper, inner, njit, operation
from ..kernels.layout import (
    FAILED_HERE,
    INVALID_POINTER,
    NEED_ROWS,
    NO_HANDLE,
    NOT_FOUND,
    S_FAIL_LIMIT,
    S_FAILED_LARGEST_FREE,
    S_FAILED_ROUNDED,
    S_FREE_ROWS,
    S_LARGEST_ALLOC_SIZE,
    S_MIN_ALLOCATION,
    S_NEXT_ALLOCATION_ID,
    S_NUM_REGIONS,
    S_POOL_BYTES,
    S_SPACE_BINS,
    STATE_SIZE,
    TABLES_BUSY,
    UNMAPPED,
)
from ..kernels.lease import (
    LEASE_SLOTS,
    lease_fall_back,
    lease_next,
    lease_next_after,
    lease_take,
)
from ..kernels.ptrmap import map_insert, map_remove
from ..kernels.tree import tree_lower_bound, tree_min, tree_successor

# PyTorch's constants (c10/cuda/CUDACachingAllocator.cpp).
MIN_BLOCK_SIZE = 512  # kMinBlockSize: every size is a multiple
SMALL_SIZE = 1 << 20  # kSmallSize: requests up to this go to the small pool
SMALL_BUFFER = 2 << 20  # kSmallBuffer: small-pool segment size
LARGE_BUFFER = 20 << 20  # kLargeBuffer: segment for requests in (1 MiB, 10 MiB)
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc: from here, segments are rounded to 2 MiB
ROUND_LARGE = 2 << 20  # kRoundLarge
ROUNDUP_INTERVALS = 16  # kRoundUpPowerOfTwoIntervals: 1 MiB .. 64 GiB

SMALL_POOL = 0  # a region's ``bin``: its pool
LARGE_POOL = 1
NUM_POOLS = 2
#: Size bins per pool (``S_SPACE_BINS``), from 512 bytes, one per power of two,
#: the last from 4 GiB up: a pool's free blocks are kept in the tree of their
#: size's bin, so each tree is smaller than one per pool, and the best fit is
#: the same (``pool_lower_bound``). Bin ``pool * POOL_BINS + k`` holds sizes in
#: ``[512 << k, 512 << (k + 1))``.
POOL_BINS = 24

# Statistics (PyTorch's DeviceStats), each a StatArray over [all, small, large]
# of [current, peak, allocated, freed]; the two oversize stats use "all" only.
# NumPy scalars, not ints: Numba compiles a callee once per distinct literal
# int argument, and ``stat_update`` is called with a dozen of them.
ALLOCATION = np.int64(0)
ALLOCATED_BYTES = np.int64(1)
SEGMENT = np.int64(2)
RESERVED_BYTES = np.int64(3)
ACTIVE = np.int64(4)
ACTIVE_BYTES = np.int64(5)
INACTIVE_SPLIT = np.int64(6)
INACTIVE_SPLIT_BYTES = np.int64(7)
REQUESTED_BYTES = np.int64(8)
OVERSIZE_ALLOCATIONS = np.int64(9)
OVERSIZE_SEGMENTS = np.int64(10)
NUM_STATS = 11
# Without streams PyTorch's active blocks are exactly the allocated ones: the
# kernels keep ALLOCATION and ALLOCATED_BYTES only, and the façade copies them
# into ACTIVE and ACTIVE_BYTES when it reads the statistics (a fifth less
# statistics work per operation).
MIRRORED_STATS = ((ALLOCATION, ACTIVE), (ALLOCATED_BYTES, ACTIVE_BYTES))
UP = np.int64(1)  # stat_update deltas of one
DOWN = np.int64(-1)
AGGREGATE_ONLY = np.int64(-1)  # stat_update's pool for the two oversize stats
STAT_NAMES = ("allocation", "allocated_bytes", "segment", "reserved_bytes", "active",
              "active_bytes", "inactive_split", "inactive_split_bytes", "requested_bytes",
              "oversize_allocations", "oversize_segments")

# Policy state slots.
C_MAX_SPLIT_SIZE = STATE_SIZE  # blocks this big are never split (int64 max: unlimited)
C_MAX_NON_SPLIT_ROUNDING = STATE_SIZE + 1  # how much bigger an oversize block may be
C_GC_ACTIVE = STATE_SIZE + 2  # 1: count lookups per pool (the GC age clock)
C_GC_CLOCK = STATE_SIZE + 3  # + pool: the pool's get_free_block call count
C_EXPANDABLE = STATE_SIZE + 5  # 1: expandable segments (PyTorch's expandable_segments:True)
C_DIVISIONS = STATE_SIZE + 8  # 16 roundup_power2_divisions entries
C_STATS = C_DIVISIONS + ROUNDUP_INTERVALS  # NUM_STATS * 3 * 4 statistics, to C_LEASE_ON
# An address lease (``lease_segment``): while the façade holds one, the kernel
# makes new segments itself where the backend would have put them, and may
# give cached ones back (``release_and_retry``).
C_LEASE_ON = C_STATS + NUM_STATS * 3 * 4  # 1 while a lease is held
C_LEASE_LIMIT = C_LEASE_ON + 1  # most reserved bytes (the memory limit; int64 max if none)
C_LEASE_ENTRIES = C_LEASE_ON + 2  # entries in the lease log...
C_LEASE = C_LEASE_ON + 3  # the lease (kernels.lease, LEASE_SLOTS slots)
C_LEASE_LOG = C_LEASE + LEASE_SLOTS  # ...(base, size) each, in the order done:
# size > 0 a segment made, size < 0 a segment of -size bytes given back
LEASE_LOG_SIZE = 64  # a full log asks for NEED_ROWS: the façade records, then leases again
# NumPy scalars, not Python literals: the lease kernels compile once for both policies.
_LEASE_AT = np.int64(C_LEASE)
_SEGMENT_ALIGNMENT = np.int64(MIN_BLOCK_SIZE)
# 1 while the kernel may release cached segments under the lease, as PyTorch's
# slow path does before its retry (``release_and_retry``): the lease's backend
# holds this allocator's segments and nothing else, and there is no
# ``max_split_size`` (whose oversize release would come first).
C_LEASE_RELEASES = C_LEASE_LOG + 2 * LEASE_LOG_SIZE
# Under the lease, the façade may also let the kernel fail an allocation
# itself where its slow path would fail it with only counters changed
# (``release_and_retry``): a replay's failures after its first.
C_FAIL_QUIETLY = C_LEASE_RELEASES + 1  # 1 while allowed
C_FAILED_HERE = C_FAIL_QUIETLY + 1  # how many the kernel failed (the façade counts them)
C_RETRIED = C_FAILED_HERE + 1  # how many it served after releasing the cache (likewise)
# Single calls the kernel failed itself (``caching_allocate_op``), counted apart
# from a batch's: the façade adds them to its counters when it reads them.
C_FAILED_ALONE = C_RETRIED + 1
CACHING_STATE_SIZE = C_FAILED_ALONE + 1


@inner
def roundup_power2_next_division(size, divisions):
    """Round ``size`` up to the next of ``divisions`` equal steps between powers of two."""
    if size & (size - 1) == 0:
        return size
    floor2 = 1 << floor_log2(size)
    step = floor2 >> floor_log2(divisions)
    if step == 0:
        return floor2 << 1
    rounded = size & ~(step - 1)
    return size if rounded == size else rounded + step


@helper
def round_size(size, state):
    """PyTorch's ``round_size``: at least 512, a multiple of 512, or the next
    power-of-two division when ``roundup_power2_divisions`` applies."""
    if size < MIN_BLOCK_SIZE:
        return MIN_BLOCK_SIZE
    interval = min(max(floor_log2(size) - 20, 0), ROUNDUP_INTERVALS - 1)
    divisions = state[C_DIVISIONS + interval]
    if divisions > 1 and size > MIN_BLOCK_SIZE * divisions:
        return roundup_power2_next_division(size, divisions)
    return round_up(size, MIN_BLOCK_SIZE)


@njit(cache=True, inline="always")
def pool_for_size(size):
    """Small pool for rounded sizes up to 1 MiB, large pool above."""
    return SMALL_POOL if size <= SMALL_SIZE else LARGE_POOL


@inner
def allocation_size(size):
    """PyTorch's ``get_allocation_size``: the segment to request for ``size``."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return round_up(size, ROUND_LARGE)


@njit(cache=True, inline="always")
def _stat_one(state, i, delta):
    state[i] += delta
    if delta > 0:
        if state[i] > state[i + 1]:
            state[i + 1] = state[i]
        state[i + 2] += delta
    else:
        state[i + 3] -= delta


@inner
def stat_update(state, stat, pool, delta):
    """PyTorch's ``update_stat`` on the aggregate and (if ``pool >= 0``) the pool entry."""
    if delta == 0:
        return
    _stat_one(state, C_STATS + stat * 12, delta)
    if pool >= 0:
        _stat_one(state, C_STATS + stat * 12 + 4 * (1 + pool), delta)


@njit(cache=True, inline="always")
def is_split(chunks, h):
    """True if block ``h`` shares its segment with another block."""
    return field(chunks, h, "prev") != NO_HANDLE or field(chunks, h, "next") != NO_HANDLE


@njit(cache=True, inline="always")
def is_expandable(chunks, regions, h):
    """True if block ``h`` lies in an expandable segment."""
    return field(regions, field(chunks, h, "region"), "page") > 0


@inner
def expandable_size(chunks, h):
    """What free block ``h`` can grow to: itself and the unmapped block after it."""
    nxt = field(chunks, h, "next")
    if nxt != NO_HANDLE and field(chunks, nxt, "allocation_id") == UNMAPPED:
        return field(chunks, h, "size") + field(chunks, nxt, "size")
    return field(chunks, h, "size")


@inner
def get_free_block(chunks, bins, regions, state, pool, size):
    """PyTorch's ``get_free_block``: the best fit in ``pool``, unless an oversize rule
    rejects it. Returns a handle or -1."""
    if state[C_GC_ACTIVE]:
        state[C_GC_CLOCK + pool] += 1
    h = pool_lower_bound(chunks, bins, state, pool, size)
    if h == NO_HANDLE:
        return NO_HANDLE
    # An expandable block counts as what it can grow to: walk on while the next
    # block in (size, address) order could grow to less (PyTorch's local walk).
    while is_expandable(chunks, regions, h):
        nxt = pool_successor(chunks, bins, state, h)
        if nxt == NO_HANDLE or expandable_size(chunks, nxt) >= expandable_size(chunks, h):
            break
        h = nxt
    found = field(chunks, h, "size")
    max_split = state[C_MAX_SPLIT_SIZE]
    # A normal request never takes an oversize block; an oversize request only
    # takes one that wastes less than the rounding allowance.
    if size < max_split and found >= max_split:
        return NO_HANDLE
    if size >= max_split and found >= size + state[C_MAX_NON_SPLIT_ROUNDING]:
        return NO_HANDLE
    return h


@inner
def pool_lower_bound(chunks, bins, state, pool, size):
    """The first free block of ``pool`` in ``(size, address)`` order with at
    least ``size`` bytes (PyTorch's ``pool.blocks.lower_bound``), or -1: the
    first found in the pool's bins from ``size``'s up."""
    per_pool = state[S_SPACE_BINS]
    stop = (pool + 1) * per_pool
    first = pool * per_pool + bin_for_size(size, state[S_MIN_ALLOCATION], per_pool)
    b = next_nonempty_bin(state, first, stop)
    while b < stop:
        h = tree_lower_bound(chunks, field(bins, b, "root"), size)
        if h != NO_HANDLE:
            return h
        b = next_nonempty_bin(state, b + 1, stop)
    return NO_HANDLE


@inner
def pool_successor(chunks, bins, state, h):
    """The next free block after ``h`` in its pool's ``(size, address)``
    order, or -1: in its bin's tree, else the first of the next bin with any."""
    nxt = np.int64(tree_successor(chunks, h))
    if nxt != NO_HANDLE:
        return nxt
    b = np.int64(field(chunks, h, "bin"))
    stop = (b // state[S_SPACE_BINS] + 1) * state[S_SPACE_BINS]
    later = next_nonempty_bin(state, b + 1, stop)
    if later == stop:
        return nxt
    return np.int64(tree_min(chunks, field(bins, later, "root")))


@njit(cache=True, inline="always")
def caching_should_split(state, pool, block_size, size):
    """PyTorch's ``should_split``."""
    remaining = block_size - size
    if pool == SMALL_POOL or state[C_EXPANDABLE]:
        return remaining >= MIN_BLOCK_SIZE
    return size < state[C_MAX_SPLIT_SIZE] and remaining > SMALL_SIZE


@inner
def pool_insert(chunks, bins, regions, state, h):
    """Put free block ``h`` into its pool, stamping the pool's GC clock on it."""
    pool = field(regions, field(chunks, h, "region"), "bin")
    set_field(chunks, h, "freed_at_count", state[C_GC_CLOCK + pool])
    insert_free(chunks, bins, regions, state, h)


@inner
def take_block(chunks, bins, regions, pmap, state, h, requested, size):
    """PyTorch's ``alloc_found_block``: hand out the front of free block ``h``
    for ``requested`` bytes, ``size`` after ``round_size``.

    The caller checked that rows and a pointer-map slot are available.
    """
    pool = field(regions, field(chunks, h, "region"), "bin")
    remove_free(chunks, bins, state, h)
    already_split = is_split(chunks, h)
    # PyTorch leaves expandable blocks out of inactive_split.
    counted = not is_expandable(chunks, regions, h)
    if caching_should_split(state, pool, field(chunks, h, "size"), size):
        rest = split_chunk(chunks, bins, regions, state, h, size)
        pool_insert(chunks, bins, regions, state, rest)
        if not counted:
            pass
        elif already_split:
            stat_update(state, INACTIVE_SPLIT_BYTES, pool, -size)
        else:
            stat_update(state, INACTIVE_SPLIT_BYTES, pool, field(chunks, rest, "size"))
            stat_update(state, INACTIVE_SPLIT, pool, UP)
    elif already_split and counted:
        stat_update(state, INACTIVE_SPLIT_BYTES, pool, -field(chunks, h, "size"))
        stat_update(state, INACTIVE_SPLIT, pool, DOWN)
    block = field(chunks, h, "size")
    set_field(chunks, h, "requested_size", requested)
    set_field(chunks, h, "allocation_id", state[S_NEXT_ALLOCATION_ID])
    state[S_NEXT_ALLOCATION_ID] += 1
    state[S_LARGEST_ALLOC_SIZE] = max(state[S_LARGEST_ALLOC_SIZE], block)
    stat_update(state, ALLOCATION, pool, UP)  # and ACTIVE (MIRRORED_STATS)
    stat_update(state, ALLOCATED_BYTES, pool, block)  # and ACTIVE_BYTES
    stat_update(state, REQUESTED_BYTES, pool, requested)
    if block >= state[C_MAX_SPLIT_SIZE]:
        stat_update(state, OVERSIZE_ALLOCATIONS, AGGREGATE_ONLY, UP)
    ptr = field(chunks, h, "ptr")
    map_insert(pmap, state, ptr, h)
    return ptr


@inner
def caching_allocate(chunks, bins, regions, pmap, state, requested):
    """Serve ``requested`` (> 0) bytes from the cached blocks, or under an
    address lease from a new segment (``lease_segment``), releasing the cached
    segments first where PyTorch's slow path would (``release_and_retry``).

    Returns the address, ``NOT_FOUND`` (the façade allocates a segment) or
    ``NEED_ROWS``; on either code no block has changed. Where the façade
    allows it, ``FAILED_HERE``: a failure as its slow path would end in,
    counted in ``state[C_FAILED_HERE]``.
    """
    if not room_for_operation(pmap, state):
        return NEED_ROWS
    size = round_size(requested, state)
    pool = pool_for_size(size)
    h = get_free_block(chunks, bins, regions, state, pool, size)
    if h == NO_HANDLE:
        if state[C_LEASE_ON] == 0:
            return NOT_FOUND
        r = lease_segment(chunks, bins, regions, state, size, pool)
        if r == NOT_FOUND:
            r = release_and_retry(chunks, bins, regions, state, size, pool)
        if r < 0:
            return r
        h = field(regions, r, "first")
    return take_block(chunks, bins, regions, pmap, state, h, requested, size)


@inner
def lease_segment(chunks, bins, regions, state, size, pool):
    """PyTorch's first ``alloc_block`` for a ``size``-byte block, when it succeeds,
    without a trip to the façade: the new segment goes where the backend's
    address lease (``SubAllocator.address_lease``) says its next region would.

    The façade holds a lease only when its own slow path would come to the same
    call first (no garbage collection, history or expandable segments), and
    records the segments made under it with the backend when it ends the lease.
    Returns the segment's region row, or ``NOT_FOUND`` / ``NEED_ROWS`` with
    nothing changed: its log full, over the memory limit or the backend's room, past the
    int64 address space, or a size the façade must refuse (its slow path then
    decides, as without a lease).
    """
    if state[C_LEASE_ENTRIES] == LEASE_LOG_SIZE:
        return NEED_ROWS
    alloc_size = allocation_size(size)
    if over_lease_limit(state, alloc_size, 0):
        return NOT_FOUND
    ptr, received = lease_next(state, _LEASE_AT, alloc_size, _SEGMENT_ALIGNMENT)
    if ptr < 0 or received % MIN_BLOCK_SIZE != 0:
        return NOT_FOUND
    r = caching_add_segment(chunks, bins, regions, state, ptr, received, pool)
    if r < 0:
        return r
    lease_take(state, _LEASE_AT, ptr, received)
    log_lease_entry(state, ptr, received)
    return r


@njit(cache=True, inline="always")
def log_lease_entry(state, base, size):
    """Append ``(base, size)`` to the lease log: a segment made (``size > 0``)
    or given back (``size < 0``). The caller checked there is room."""
    at = C_LEASE_LOG + 2 * state[C_LEASE_ENTRIES]
    state[at] = base
    state[at + 1] = size
    state[C_LEASE_ENTRIES] += 1


@njit(cache=True, inline="always")
def over_lease_limit(state, alloc_size, released):
    """True if a new segment of ``alloc_size`` bytes would take the reserved
    bytes, less ``released`` given back first, past the lease's limit
    (``_alloc_block``'s check)."""
    return alloc_size > state[C_LEASE_LIMIT] - (state[C_STATS + RESERVED_BYTES * 12] - released)


@njit(cache=True, inline="always")
def _released_before(regions, a, b):
    """PyTorch's release order of cached segments: the large pool first, then
    ``(size, address)``."""
    if field(regions, a, "bin") != field(regions, b, "bin"):
        return field(regions, a, "bin") > field(regions, b, "bin")
    if field(regions, a, "size") != field(regions, b, "size"):
        return field(regions, a, "size") < field(regions, b, "size")
    return field(regions, a, "base") < field(regions, b, "base")


@njit(cache=True, inline="always")
def nothing_cached(state):
    """True if every reserved byte is allocated: no free block anywhere."""
    return state[C_STATS + ALLOCATED_BYTES * 12] == state[C_STATS + RESERVED_BYTES * 12]


@inner
def nothing_to_release(chunks, regions, state):
    """True if PyTorch's release of the cached segments (``_release_cached_blocks``)
    finds none wholly free."""
    if nothing_cached(state):
        return True
    for r in range(regions.shape[0]):
        if field(regions, r, "size") > 0 and not region_in_use(chunks, regions, r):
            return False
    return True


@inner
def release_and_retry(chunks, bins, regions, state, size, pool):
    """The rest of the façade's slow path (``CachingBase._malloc_slow_held``)
    for a ``size``-byte block whose new segment is over the lease's limit:
    PyTorch's release of the cached segments (those wholly free,
    ``_release_cached_blocks``, in its order), then its retry of
    ``alloc_block``.

    Where the retry places its segment, releases them, logs each for the
    façade to give back to the backend before the new segment
    (``C_LEASE_LOG``), moves the lease back (``lease_fall_back``), makes the
    segment, counts the pass in ``state[C_RETRIED]`` and returns its region
    row. Where the retry is over the limit still and the façade allows it
    (``C_FAIL_QUIETLY``), releases them likewise, counts the failure in
    ``state[C_FAILED_HERE]`` and returns ``FAILED_HERE``. Otherwise returns
    ``NOT_FOUND`` (or ``NEED_ROWS`` for a full log) with nothing changed, and
    the façade's slow path decides: the first try failed at the backend,
    segments are cached but the kernel may not release them
    (``C_LEASE_RELEASES``), more would go than the log holds, the retry would
    ask the backend for what it cannot place, or the error must be built.
    """
    alloc_size = allocation_size(size)
    if not over_lease_limit(state, alloc_size, 0):
        return NOT_FOUND  # the backend refused the first try: the façade's
    # The cached segments (the log's free slots order their rows), and where
    # the highest segment that stays ends.
    first = C_LEASE_LOG + 2 * state[C_LEASE_ENTRIES]
    log_room = LEASE_LOG_SIZE - state[C_LEASE_ENTRIES]
    n = 0
    released = np.int64(0)  # not literals: lease_fall_back compiles once
    highest_end = np.int64(0)
    # Nothing cached (every failure of a replay past its prefill, often): no pass.
    for r in range(0 if nothing_cached(state) else regions.shape[0]):
        if field(regions, r, "size") <= 0:
            continue
        if region_in_use(chunks, regions, r):
            highest_end = max(highest_end, field(regions, r, "base") + field(regions, r, "size"))
            continue
        if n + 1 >= log_room:  # the frees and the new segment must fit in the log
            return NEED_ROWS if n + 2 <= LEASE_LOG_SIZE else NOT_FOUND
        j = n  # insertion into the log's free slots, in release order
        while j > 0 and _released_before(regions, r, state[first + 2 * (j - 1)]):
            state[first + 2 * j] = state[first + 2 * (j - 1)]
            j -= 1
        state[first + 2 * j] = r
        n += 1
        released += field(regions, r, "size")
    if n > 0 and state[C_LEASE_RELEASES] == 0:
        return NOT_FOUND
    fails = over_lease_limit(state, alloc_size, released)
    if fails:
        if state[C_FAIL_QUIETLY] == 0:
            return NOT_FOUND
    else:
        ptr, received = lease_next_after(state, _LEASE_AT, alloc_size, _SEGMENT_ALIGNMENT,
                                         highest_end, released)
        if ptr < 0 or received % MIN_BLOCK_SIZE != 0:
            return NOT_FOUND
    for k in range(n):
        row = state[first + 2 * k]
        base = field(regions, row, "base")
        log_lease_entry(state, base,
                        -caching_release_segment(chunks, bins, regions, state, row))
    if n > 0:
        lease_fall_back(state, _LEASE_AT, highest_end, released)
    if fails:
        state[C_FAILED_HERE] += 1
        return FAILED_HERE
    state[C_RETRIED] += 1
    return lease_segment(chunks, bins, regions, state, size, pool)


@inner
def caching_allocate_from_segment(chunks, bins, regions, pmap, state, r, requested):
    """Serve ``requested`` bytes from the fresh segment in region row ``r``."""
    if not room_for_operation(pmap, state):
        return NEED_ROWS
    return take_block(chunks, bins, regions, pmap, state, field(regions, r, "first"), requested,
                      round_size(requested, state))


@inner
def caching_deallocate(chunks, bins, regions, pmap, state, ptr):
    """PyTorch's ``free`` + ``free_block``: merge with free neighbours and cache.

    Returns the block's size or ``INVALID_POINTER``.
    """
    h = map_remove(pmap, state, ptr)
    if h == NO_HANDLE:
        return INVALID_POINTER
    pool = field(regions, field(chunks, h, "region"), "bin")
    size = field(chunks, h, "size")
    requested = field(chunks, h, "requested_size")
    stat_update(state, ALLOCATION, pool, DOWN)  # and ACTIVE (MIRRORED_STATS)
    stat_update(state, ALLOCATED_BYTES, pool, -size)  # and ACTIVE_BYTES
    if size >= state[C_MAX_SPLIT_SIZE]:
        stat_update(state, OVERSIZE_ALLOCATIONS, AGGREGATE_ONLY, DOWN)
    set_field(chunks, h, "allocation_id", -1)
    merged = 0
    nxt = field(chunks, h, "next")
    prv = field(chunks, h, "prev")
    if nxt != NO_HANDLE and field(chunks, nxt, "allocation_id") == -1:
        merged += 1
    if prv != NO_HANDLE and field(chunks, prv, "allocation_id") == -1:
        merged += 1
    # Timestamps are a BFC notion; the caching policy always merges.
    h = try_to_coalesce(chunks, bins, regions, state, h, IGNORE_TIMESTAMPS)
    net_blocks = -merged
    net_bytes = size - field(chunks, h, "size")
    if is_split(chunks, h):
        net_blocks += 1
        net_bytes += field(chunks, h, "size")
    pool_insert(chunks, bins, regions, state, h)
    if not is_expandable(chunks, regions, h):
        stat_update(state, INACTIVE_SPLIT, pool, net_blocks)
        stat_update(state, INACTIVE_SPLIT_BYTES, pool, net_bytes)
    stat_update(state, REQUESTED_BYTES, pool, -requested)
    return size


@inner
def caching_add_segment(chunks, bins, regions, state, ptr, size, pool):
    """Record a new segment from the backend; returns its region row or ``NEED_ROWS``."""
    r = add_separate_region(chunks, bins, regions, state, ptr, size, pool)
    if r < 0:
        return r
    stat_update(state, SEGMENT, pool, UP)
    stat_update(state, RESERVED_BYTES, pool, size)
    if size >= state[C_MAX_SPLIT_SIZE]:
        stat_update(state, OVERSIZE_SEGMENTS, AGGREGATE_ONLY, UP)
    return r


@inner
def caching_release_segment(chunks, bins, regions, state, r):
    """Forget the (entirely free) segment in region row ``r``; returns its size."""
    pool = field(regions, r, "bin")
    size = remove_region(chunks, bins, regions, state, r)
    stat_update(state, SEGMENT, pool, DOWN)
    stat_update(state, RESERVED_BYTES, pool, -size)
    if size >= state[C_MAX_SPLIT_SIZE]:
        stat_update(state, OVERSIZE_SEGMENTS, AGGREGATE_ONLY, DOWN)
    return size


# ---------------------------------------------------------------- expandable segments
@inner
def caching_add_expandable(chunks, regions, state, base, size, pool, page):
    """Record a new expandable segment: ``size`` bytes of address space at ``base``,
    one unmapped block, no memory (no stats change, as in PyTorch). Returns the
    region row or ``NEED_ROWS``."""
    if state[S_FREE_ROWS] < 1:
        return NEED_ROWS
    r, h = open_region(chunks, regions, state, base, size, pool)
    if r < 0:
        return NEED_ROWS
    set_field(regions, r, "page", page)
    set_field(chunks, h, "allocation_id", UNMAPPED)
    return r


@inner
def find_expandable_block(chunks, regions, r, size):
    """PyTorch's ``find_expandable_block`` within expandable region ``r``: the first
    unmapped block (by address), or the free block right before it, that starts
    a run of free or unmapped blocks of at least ``size`` bytes; -1 if none."""
    h = field(regions, r, "first")
    while h != NO_HANDLE:
        if field(chunks, h, "allocation_id") == UNMAPPED:
            c = h
            prv = field(chunks, h, "prev")
            if prv != NO_HANDLE and field(chunks, prv, "allocation_id") == -1:
                c = prv
            room = 0
            b = c
            while room < size and b != NO_HANDLE and field(chunks, b, "allocation_id") < 0:
                room += field(chunks, b, "size")
                b = field(chunks, b, "next")
            if room >= size:
                return c
        h = field(chunks, h, "next")
    return NO_HANDLE


@inner
def caching_map_block(chunks, bins, regions, state, h, nbytes):
    """PyTorch's ``map_block`` once the backend mapped the first ``nbytes`` (whole
    pages) of unmapped block ``h``: that part becomes free memory, merged with
    free neighbours, in its pool; the rest stays unmapped. Returns the free
    block's handle or ``NEED_ROWS`` (nothing changed)."""
    if state[S_FREE_ROWS] < 1:
        return NEED_ROWS
    pool = field(regions, field(chunks, h, "region"), "bin")
    if nbytes < field(chunks, h, "size"):
        rest = split_chunk(chunks, bins, regions, state, h, nbytes)
        set_field(chunks, rest, "allocation_id", UNMAPPED)
    set_field(chunks, h, "allocation_id", -1)
    h = try_to_coalesce(chunks, bins, regions, state, h, IGNORE_TIMESTAMPS)
    pool_insert(chunks, bins, regions, state, h)
    stat_update(state, RESERVED_BYTES, pool, nbytes)
    count_pool_bytes(state, nbytes)
    return h


@inner
def caching_unmap_block(chunks, bins, regions, state, h, start, nbytes):
    """PyTorch's ``unmap_block`` once the backend unmapped ``[start, start+nbytes)``,
    the whole pages inside free block ``h``: the pieces before and after stay
    free blocks; the middle becomes unmapped, merged with unmapped neighbours.
    Returns the unmapped block's handle or ``NEED_ROWS`` (nothing changed)."""
    if state[S_FREE_ROWS] < 2:
        return NEED_ROWS
    pool = field(regions, field(chunks, h, "region"), "bin")
    remove_free(chunks, bins, state, h)
    if start > field(chunks, h, "ptr"):
        middle = split_chunk(chunks, bins, regions, state, h, start - field(chunks, h, "ptr"))
        pool_insert(chunks, bins, regions, state, h)
        h = middle
    if field(chunks, h, "size") > nbytes:
        after = split_chunk(chunks, bins, regions, state, h, nbytes)
        pool_insert(chunks, bins, regions, state, after)
    set_field(chunks, h, "allocation_id", UNMAPPED)
    set_field(chunks, h, "freed_at_count", 0)
    nxt = field(chunks, h, "next")
    if nxt != NO_HANDLE and field(chunks, nxt, "allocation_id") == UNMAPPED:
        merge_chunks(chunks, regions, state, h, nxt)
    prv = field(chunks, h, "prev")
    if prv != NO_HANDLE and field(chunks, prv, "allocation_id") == UNMAPPED:
        merge_chunks(chunks, regions, state, prv, h)
        h = prv
    stat_update(state, RESERVED_BYTES, pool, -nbytes)
    state[S_POOL_BYTES] -= nbytes
    return h


@inner
def caching_release_expandable(chunks, regions, state, r):
    """PyTorch's ``release_expandable_segment``: forget region ``r``, one unmapped block."""
    release_row(chunks, state, field(regions, r, "first"))
    set_field(regions, r, "size", 0)
    set_field(regions, r, "first", NO_HANDLE)
    set_field(regions, r, "last", NO_HANDLE)
    set_field(regions, r, "bin", NO_HANDLE)
    set_field(regions, r, "page", 0)
    state[S_NUM_REGIONS] -= 1


@operation
def caching_add_expandable_op(state, base, size, pool, page):
    """``caching_add_expandable`` on the recorded tables (under the lock)."""
    chunks, _, regions, _, _, st = table_views(state)
    return caching_add_expandable(chunks, regions, st, base, size, pool, page)


@operation
def find_expandable_block_op(state, r, size):
    """``find_expandable_block`` on the recorded tables (under the lock)."""
    chunks, _, regions, _, _, _ = table_views(state)
    return find_expandable_block(chunks, regions, r, size)


@operation
def caching_map_block_op(state, h, nbytes):
    """``caching_map_block`` on the recorded tables (under the lock)."""
    chunks, bins, regions, _, _, st = table_views(state)
    return caching_map_block(chunks, bins, regions, st, h, nbytes)


@operation
def caching_unmap_block_op(state, h, start, nbytes):
    """``caching_unmap_block`` on the recorded tables (under the lock)."""
    chunks, bins, regions, _, _, st = table_views(state)
    return caching_unmap_block(chunks, bins, regions, st, h, start, nbytes)


@operation
def caching_release_expandable_op(state, r):
    """``caching_release_expandable`` on the recorded tables (under the lock)."""
    chunks, _, regions, _, _, st = table_views(state)
    caching_release_expandable(chunks, regions, st, r)
    return 0


@operation
def caching_take_block_op(state, h, requested):
    """``take_block`` of free block ``h`` (a grown expandable block; under the lock)."""
    chunks, bins, regions, pmap, _, st = table_views(state)
    if not room_for_operation(pmap, st):
        return NEED_ROWS
    return take_block(chunks, bins, regions, pmap, st, h, requested, round_size(requested, st))


@fast_operation
def caching_allocate_op(state_address, requested, locked):
    """``caching_allocate`` on the tables the state at ``state_address``
    records (``kernels.guard.state_at``). With ``locked`` false (a caller
    without the façade's lock) it answers ``TABLES_BUSY``, changing nothing,
    while the lock is held (``kernels.guard``), and while
    the GC age clock runs, because a missed lookup counts on it and the
    locked retry would count it twice.

    Where the façade allows it (``S_FAIL_LIMIT``: a memory limit, and no
    step in its slow path but PyTorch's new segment, release of the cached
    segments and retry), and the new segment is over the limit with no cached
    segment wholly free to release, it answers ``FAILED_HERE``: counted in
    ``state[C_FAILED_ALONE]``, the segment's
    size in ``state[S_FAILED_ROUNDED]`` and the largest free block in
    ``state[S_FAILED_LARGEST_FREE]``; nothing else changes.
    """
    state = state_at(state_address)
    if not locked and state[C_GC_ACTIVE]:
        return TABLES_BUSY
    if not may_proceed(state, locked):
        return TABLES_BUSY
    chunks, bins, regions, pmap, _, st = table_views(state)
    p = caching_allocate(chunks, bins, regions, pmap, st, requested)
    if p == NOT_FOUND and st[S_FAIL_LIMIT] > 0:
        alloc_size = allocation_size(round_size(requested, st))
        if (alloc_size > st[S_FAIL_LIMIT] - st[C_STATS + RESERVED_BYTES * 12]
                and nothing_to_release(chunks, regions, st)):
            st[C_FAILED_ALONE] += 1
            st[S_FAILED_LARGEST_FREE] = largest_free_chunk(chunks, bins)
            st[S_FAILED_ROUNDED] = alloc_size
            return FAILED_HERE
    return p


@fast_operation
def caching_deallocate_op(state_address, ptr, locked):
    """``caching_deallocate`` on the recorded tables; see ``caching_allocate_op``."""
    state = state_at(state_address)
    if not may_proceed(state, locked):
        return TABLES_BUSY
    chunks, bins, regions, pmap, _, st = table_views(state)
    return caching_deallocate(chunks, bins, regions, pmap, st, ptr)


@operation
def caching_allocate_from_segment_op(state, r, requested):
    """``caching_allocate_from_segment`` on the recorded tables (under the lock)."""
    chunks, bins, regions, pmap, _, st = table_views(state)
    return caching_allocate_from_segment(chunks, bins, regions, pmap, st, r, requested)


@operation
def caching_add_segment_op(state, ptr, size, pool):
    """``caching_add_segment`` on the recorded tables (under the lock)."""
    chunks, bins, regions, _, _, st = table_views(state)
    return caching_add_segment(chunks, bins, regions, st, ptr, size, pool)


@operation
def caching_release_segment_op(state, r):
    """``caching_release_segment`` on the recorded tables (under the lock)."""
    chunks, bins, regions, _, _, st = table_views(state)
    return caching_release_segment(chunks, bins, regions, st, r)
