"""Chunk machinery shared by every policy: handles, bins, split, merge, regions.

These kernels keep the tables consistent; policies (``numba_bfc.policies``)
decide which chunk to use and when to split. Names follow TF's BFC allocator
(``SplitChunk``, ``Merge``, ``TryToCoalesce``, ``InsertFreeChunkIntoBin``).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.extending import intrinsic

from .fields import field, set_field
from .jit import inner, njit
from .layout import (
    NEED_ROWS,
    NO_HANDLE,
    ROWS_PER_OPERATION,
    S_FREE_HEAD,
    S_FREE_ROWS,
    S_MAP_COUNT,
    S_MIN_ALLOCATION,
    S_NONEMPTY_BINS,
    S_NUM_BINS,
    S_NUM_REGIONS,
    S_PEAK_POOL_BYTES,
    S_POOL_BYTES,
    S_SPACE_BINS,
    S_TSQ_COUNT,
    S_TSQ_HEAD,
    UNKNOWN_PIECE,
)
from .tree import tree_insert, tree_max, tree_remove

# NumPy scalars, not Python literals: Numba compiles a callee once per
# distinct literal argument.
HONOUR_TIMESTAMPS = np.bool_(False)  # try_to_coalesce: leave timestamped chunks alone
IGNORE_TIMESTAMPS = np.bool_(True)


@njit(cache=True, inline="always")
def round_up(n, quantum):
    """``n`` rounded up to a multiple of ``quantum``, a power of two (TF's
    ``RoundedBytes``). Masks, not a division: without the allocation path's
    divisions, replays ran 12-26% faster (``docs/performance.md``)."""
    return (n + quantum - 1) & -quantum


@njit(cache=True, inline="always")
def round_up_to_multiple(n, step):
    """``n`` rounded up to a multiple of any ``step`` > 0 (a growth quantum:
    whole pages that are whole backend granules, which need not be a power
    of two)."""
    return ((n + step - 1) // step) * step


@intrinsic
def floor_log2(typingctx, v):
    """``floor(log2(v))`` of an int64 ``v`` > 0, in one instruction (``ctlz``),
    as TF's ``Log2FloorNonZero``."""
    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        ctlz = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(i64, [i64, ir.IntType(1)]), "llvm.ctlz.i64")
        zeros = builder.call(ctlz, [args[0], ir.Constant(ir.IntType(1), 1)])
        return builder.sub(ir.Constant(i64, 63), zeros)

    return types.int64(types.int64), codegen


@inner
def bin_for_size(n, min_allocation, num_bins):
    """TF's ``BinNumForSize``: ``min(num_bins-1, floor(log2(max(n, min) / min)))``,
    for ``min_allocation`` a power of two (a difference of logarithms, not a
    division)."""
    return min(num_bins - 1, floor_log2(max(n, min_allocation)) - floor_log2(min_allocation))


@njit(cache=True, inline="always")
def room_for_operation(pmap, state):
    """True if one allocation can finish without growing the chunk table or pointer map."""
    return (state[S_FREE_ROWS] >= ROWS_PER_OPERATION
            and 2 * (state[S_MAP_COUNT] + 1) <= pmap.shape[0])


@inner
def new_row(chunks, state):
    """Take a row off the free-handle list (the caller checked one is there)."""
    h = state[S_FREE_HEAD]
    state[S_FREE_HEAD] = field(chunks, h, "next")
    state[S_FREE_ROWS] -= 1
    set_field(chunks, h, "prev", NO_HANDLE)
    set_field(chunks, h, "next", NO_HANDLE)
    set_field(chunks, h, "left", NO_HANDLE)
    set_field(chunks, h, "right", NO_HANDLE)
    set_field(chunks, h, "parent", NO_HANDLE)
    set_field(chunks, h, "bin", NO_HANDLE)
    set_field(chunks, h, "allocation_id", -1)
    set_field(chunks, h, "requested_size", 0)
    set_field(chunks, h, "freed_at_count", 0)
    return h


@inner
def release_row(chunks, state, h):
    """Return row ``h`` to the free-handle list (TF's ``DeleteChunk``)."""
    set_field(chunks, h, "size", 0)
    set_field(chunks, h, "ptr", 0)
    set_field(chunks, h, "allocation_id", -1)
    set_field(chunks, h, "bin", NO_HANDLE)
    set_field(chunks, h, "region", NO_HANDLE)
    set_field(chunks, h, "prev", NO_HANDLE)
    set_field(chunks, h, "generation", field(chunks, h, "generation") + 1)
    set_field(chunks, h, "next", state[S_FREE_HEAD])
    state[S_FREE_HEAD] = h
    state[S_FREE_ROWS] += 1


@inner
def insert_free(chunks, bins, regions, state, h):
    """Put free chunk ``h`` into the bin for its size, or where its region has
    a space (the compact policy's spaces, the caching policy's pools), into
    the bin for its size among that space's ``S_SPACE_BINS``."""
    b = field(regions, field(chunks, h, "region"), "bin")
    if b == NO_HANDLE:
        b = bin_for_size(field(chunks, h, "size"), state[S_MIN_ALLOCATION], state[S_NUM_BINS])
    else:
        per_space = state[S_SPACE_BINS]
        size_bin = bin_for_size(field(chunks, h, "size"), state[S_MIN_ALLOCATION], per_space)
        b = b * per_space + size_bin
    set_field(chunks, h, "bin", b)
    tree_insert(chunks, bins, b, h)
    state[S_NONEMPTY_BINS] |= np.int64(1) << b


@inner
def remove_free(chunks, bins, state, h):
    """Take free chunk ``h`` out of its bin."""
    b = np.int64(field(chunks, h, "bin"))
    tree_remove(chunks, bins, b, h)
    set_field(chunks, h, "bin", NO_HANDLE)
    if field(bins, b, "root") == NO_HANDLE:
        state[S_NONEMPTY_BINS] &= ~(np.int64(1) << b)


@inner
def next_nonempty_bin(state, b, stop):
    """The first bin from ``b`` up to ``stop`` (exclusive) that holds a free
    chunk, or ``stop``: one look at ``state[S_NONEMPTY_BINS]``, not a pass
    over the empty bins (``docs/performance.md``)."""
    if b >= stop:
        return stop
    above = state[S_NONEMPTY_BINS] & (np.int64(-1) << b)
    if above == 0:
        return stop
    first = floor_log2(above & -above)  # the lowest bit set
    return first if first < stop else stop


@inner
def split_chunk(chunks, bins, regions, state, h, nbytes):
    """Cut ``h`` (not in a bin) after ``nbytes``; return the new tail chunk.

    The tail inherits ``freed_at_count`` and is free, not yet in a bin.
    """
    n = new_row(chunks, state)
    set_field(chunks, n, "ptr", field(chunks, h, "ptr") + nbytes)
    set_field(chunks, n, "size", field(chunks, h, "size") - nbytes)
    set_field(chunks, h, "size", nbytes)
    set_field(chunks, n, "freed_at_count", field(chunks, h, "freed_at_count"))
    set_field(chunks, n, "region", field(chunks, h, "region"))
    nxt = field(chunks, h, "next")
    set_field(chunks, n, "prev", h)
    set_field(chunks, n, "next", nxt)
    set_field(chunks, h, "next", n)
    if nxt != NO_HANDLE:
        set_field(chunks, nxt, "prev", n)
    else:
        set_field(regions, field(chunks, h, "region"), "last", n)
    return n


@inner
def merge_chunks(chunks, regions, state, h1, h2):
    """Absorb ``h2`` (the chunk right after ``h1``) into ``h1``; both free, unbinned."""
    h3 = field(chunks, h2, "next")
    set_field(chunks, h1, "next", h3)
    if h3 != NO_HANDLE:
        set_field(chunks, h3, "prev", h1)
    else:
        set_field(regions, field(chunks, h1, "region"), "last", h1)
    set_field(chunks, h1, "size", field(chunks, h1, "size") + field(chunks, h2, "size"))
    latest_tag = max(field(chunks, h1, "freed_at_count"), field(chunks, h2, "freed_at_count"))
    set_field(chunks, h1, "freed_at_count", latest_tag)
    release_row(chunks, state, h2)


@inner
def try_to_coalesce(chunks, bins, regions, state, h, ignore_freed_at):
    """Merge free, unbinned ``h`` with free neighbours; return the surviving handle.

    As TF: a timestamped chunk (``freed_at_count > 0``) is left alone unless
    ``ignore_freed_at``; neighbours are merged only if untimestamped (or forced).
    """
    if (not ignore_freed_at) and field(chunks, h, "freed_at_count") > 0:
        return h
    out = h
    nxt = np.int64(field(chunks, h, "next"))
    if nxt != NO_HANDLE and field(chunks, nxt, "allocation_id") == -1:
        if field(chunks, nxt, "freed_at_count") == 0 or ignore_freed_at:
            remove_free(chunks, bins, state, nxt)
            merge_chunks(chunks, regions, state, h, nxt)
    prv = np.int64(field(chunks, h, "prev"))
    if prv != NO_HANDLE and field(chunks, prv, "allocation_id") == -1:
        if field(chunks, prv, "freed_at_count") == 0 or ignore_freed_at:
            out = prv
            remove_free(chunks, bins, state, prv)
            merge_chunks(chunks, regions, state, prv, h)
    return out


@njit(cache=True, inline="always")
def empty_region_row(regions):
    """The first unused row of the region table, -1 if it is full."""
    for i in range(regions.shape[0]):
        if field(regions, i, "size") == 0:
            return i
    return -1


@inner
def open_region(chunks, regions, state, ptr, size, pool_bin):
    """A new region row for ``[ptr, ptr+size)``, one chunk (not binned) covering it;
    returns ``(row, chunk)``, or row -1 with nothing changed when the region
    table is full. The caller checked that a chunk row is free."""
    r = empty_region_row(regions)
    if r < 0:
        return r, NO_HANDLE
    h = new_row(chunks, state)
    set_field(regions, r, "base", ptr)
    set_field(regions, r, "size", size)
    set_field(regions, r, "first", h)
    set_field(regions, r, "last", h)
    set_field(regions, r, "bin", pool_bin)
    set_field(regions, r, "last_piece", ptr)
    set_field(regions, r, "page", 0)
    state[S_NUM_REGIONS] += 1
    set_field(chunks, h, "ptr", ptr)
    set_field(chunks, h, "size", size)
    set_field(chunks, h, "region", r)
    return r, h


@njit(cache=True, inline="always")
def count_pool_bytes(state, size):
    """Count ``size`` more bytes in the pool, and the pool's peak."""
    state[S_POOL_BYTES] += size
    state[S_PEAK_POOL_BYTES] = max(state[S_PEAK_POOL_BYTES], state[S_POOL_BYTES])


@inner
def add_separate_region(chunks, bins, regions, state, ptr, size, pool_bin):
    """Add backend memory ``[ptr, ptr+size)`` as a region of its own, one free
    chunk (TF's ``Extend`` tail). ``pool_bin`` is the region's space (of
    ``S_SPACE_BINS`` size bins), or -1 for BFC's bins. Returns the region row, or ``NEED_ROWS``
    (nothing changed) when a table is full.

    The chunk has no neighbour to coalesce with, so this compiles none of
    ``add_region``'s joining (a first allocation compiles only this).
    """
    if state[S_FREE_ROWS] < 1:
        return NEED_ROWS
    r, h = open_region(chunks, regions, state, ptr, size, pool_bin)
    if r < 0:
        return NEED_ROWS
    count_pool_bytes(state, size)
    insert_free(chunks, bins, regions, state, h)
    return r


@inner
def add_region(chunks, bins, regions, state, ptr, size, pool_bin):
    """``add_separate_region``, except that memory starting exactly where a
    region with the same ``pool_bin`` ends extends that region, and may merge
    with its free tail."""
    r = -1
    for i in range(regions.shape[0]):
        region_size = field(regions, i, "size")
        if (region_size > 0 and field(regions, i, "base") + region_size == ptr
                and field(regions, i, "bin") == pool_bin):
            r = i
            break
    if r < 0:
        return add_separate_region(chunks, bins, regions, state, ptr, size, pool_bin)
    if state[S_FREE_ROWS] < 1:
        return NEED_ROWS
    h = new_row(chunks, state)
    last = field(regions, r, "last")
    set_field(chunks, h, "prev", last)
    set_field(chunks, last, "next", h)
    set_field(chunks, h, "ptr", ptr)
    set_field(chunks, h, "size", size)
    set_field(chunks, h, "region", r)
    set_field(regions, r, "size", field(regions, r, "size") + size)
    set_field(regions, r, "last", h)
    set_field(regions, r, "last_piece", ptr)
    count_pool_bytes(state, size)
    h = try_to_coalesce(chunks, bins, regions, state, h, HONOUR_TIMESTAMPS)
    insert_free(chunks, bins, regions, state, h)
    return r


@inner
def region_in_use(chunks, regions, r):
    """True if any chunk of region ``r`` is in use."""
    h = field(regions, r, "first")
    while h != NO_HANDLE:
        if field(chunks, h, "allocation_id") != -1:
            return True
        h = field(chunks, h, "next")
    return False


@inner
def free_region_rows(chunks, regions, out):
    """Write the rows of regions with no chunk in use into ``out``; return how many."""
    n = 0
    for r in range(regions.shape[0]):
        if field(regions, r, "size") > 0 and not region_in_use(chunks, regions, r):
            out[n] = r
            n += 1
    return n


@inner
def remove_region(chunks, bins, regions, state, r):
    """Drop region ``r`` and all its (free) chunks; return its size."""
    h = field(regions, r, "first")
    while h != NO_HANDLE:
        nxt = field(chunks, h, "next")
        if field(chunks, h, "bin") != NO_HANDLE:
            remove_free(chunks, bins, state, h)
        release_row(chunks, state, h)
        h = nxt
    size = field(regions, r, "size")
    state[S_POOL_BYTES] -= size
    state[S_NUM_REGIONS] -= 1
    set_field(regions, r, "size", 0)
    set_field(regions, r, "first", NO_HANDLE)
    set_field(regions, r, "last", NO_HANDLE)
    # an unused row's: a kernel's UNKNOWN_PIECE mark ends here
    set_field(regions, r, "last_piece", 0)
    set_field(regions, r, "bin", NO_HANDLE)
    return size


@njit(cache=True, inline="always")
def releasable(chunks, h):
    """True if chunk ``h``'s memory could go back to the backend: free, binned
    and not waiting on a timing count."""
    return (field(chunks, h, "allocation_id") == -1 and field(chunks, h, "bin") != NO_HANDLE
            and field(chunks, h, "freed_at_count") == 0)


@inner
def free_tail_start(chunks, regions, r):
    """Address of region ``r``'s last chunk if it could go back to the backend
    (``releasable``), else the region's end."""
    h = field(regions, r, "last")
    if not releasable(chunks, h):
        return field(regions, r, "base") + field(regions, r, "size")
    return field(chunks, h, "ptr")


@inner
def space_regions(chunks, regions, space, out):
    """The regions whose bin is ``space``, in address order: ``(base, size,
    free_tail_start, free_head_end)`` into the rows of ``out``. Returns how
    many, or -1 if ``out`` has too few rows."""
    n = 0
    for r in range(regions.shape[0]):
        if field(regions, r, "size") <= 0 or field(regions, r, "bin") != space:
            continue
        if n == out.shape[0]:
            return -1
        base = field(regions, r, "base")
        j = n  # insertion in address order: a space has few regions
        while j > 0 and out[j - 1, 0] > base:
            for k in range(4):
                out[j, k] = out[j - 1, k]
            j -= 1
        out[j, 0] = base
        out[j, 1] = field(regions, r, "size")
        out[j, 2] = free_tail_start(chunks, regions, r)
        out[j, 3] = free_head_end(chunks, regions, r)
        n += 1
    return n


@inner
def whole_pages(chunks, h, quantum):
    """``(lo, hi)``: the whole ``quantum``-byte pages inside chunk ``h``
    (``hi <= lo``: none)."""
    return (round_up_to_multiple(field(chunks, h, "ptr"), quantum),
            (field(chunks, h, "ptr") + field(chunks, h, "size")) // quantum * quantum)


@inner
def page_runs(chunks, regions, space, quantum, out):
    """The runs of whole ``quantum``-byte pages inside the ``releasable`` chunks
    of the regions whose bin is ``space``: ``(region base, lo, hi)`` into the
    rows of ``out``, in region-row then address order. Returns how many, or
    -1 if ``out`` has too few rows."""
    n = 0
    for r in range(regions.shape[0]):
        if field(regions, r, "size") <= 0 or field(regions, r, "bin") != space:
            continue
        h = field(regions, r, "first")
        while h != NO_HANDLE:
            if releasable(chunks, h):
                lo, hi = whole_pages(chunks, h, quantum)
                if hi > lo:
                    if n == out.shape[0]:
                        return -1
                    out[n, 0] = field(regions, r, "base")
                    out[n, 1] = lo
                    out[n, 2] = hi
                    n += 1
            h = field(chunks, h, "next")
    return n


@inner
def trim_region(chunks, bins, regions, state, r, new_end, last_piece):
    """Cut region ``r`` back to end at ``new_end``, inside its free last chunk
    and above its first byte; ``last_piece`` becomes the region's newest piece.
    Returns the bytes cut."""
    h = field(regions, r, "last")
    end = field(regions, r, "base") + field(regions, r, "size")
    cut = end - new_end
    remove_free(chunks, bins, state, h)
    if new_end == field(chunks, h, "ptr"):
        prv = field(chunks, h, "prev")
        set_field(chunks, prv, "next", NO_HANDLE)
        set_field(regions, r, "last", prv)
        release_row(chunks, state, h)
    else:
        set_field(chunks, h, "size", field(chunks, h, "size") - cut)
        insert_free(chunks, bins, regions, state, h)
    set_field(regions, r, "size", field(regions, r, "size") - cut)
    set_field(regions, r, "last_piece", last_piece)
    state[S_POOL_BYTES] -= cut
    return cut


@njit(cache=True, inline="always")  # see tree_max
def largest_free_chunk(chunks, bins):
    """Size of the largest free chunk in any bin (TF's ``LargestFreeChunk``).

    Every bin is looked at: the last bin of a space is not the largest of all
    (the compact policy's spaces, the caching policy's pools).
    """
    largest = 0
    for b in range(bins.shape[0]):
        root = field(bins, b, "root")
        if root != NO_HANDLE:
            largest = max(largest, field(chunks, tree_max(chunks, root), "size"))
    return largest


@njit(cache=True, inline="always")
def _queue_push(tsq, state, h, gen):
    cap = tsq.shape[0]
    i = (state[S_TSQ_HEAD] + state[S_TSQ_COUNT]) % cap
    tsq[i, 0] = h
    tsq[i, 1] = gen
    state[S_TSQ_COUNT] += 1


@inner
def queue_timestamped(chunks, state, tsq, h):
    """Append chunk ``h`` to the timestamped-chunk queue (caller checked room)."""
    _queue_push(tsq, state, h, field(chunks, h, "generation"))


@inner
def merge_timestamped_chunks(chunks, bins, regions, state, tsq, required_bytes, safe_frontier,
                             scratch):
    """TF's ``MergeTimestampedChunks``.

    With ``required_bytes == 0``: chunks whose tag is below ``safe_frontier``
    become ordinary free chunks and coalesce. Otherwise chunks are force-merged,
    in queue order, until one of at least ``required_bytes`` forms; returns
    whether that happened (always True for 0). ``scratch`` is int64 space of
    at least a row per queued chunk and 4 columns (a kernel makes no arrays,
    ``kernels.jit``).
    """
    n = state[S_TSQ_COUNT]
    cap = tsq.shape[0]
    head = state[S_TSQ_HEAD]
    merge_h = scratch[:n, 0]
    merge_g = scratch[:n, 1]
    keep_h = scratch[:n, 2]
    keep_g = scratch[:n, 3]
    nm = 0
    nk = 0
    for k in range(n):
        h = tsq[(head + k) % cap, 0]
        g = tsq[(head + k) % cap, 1]
        # A stale entry: the chunk was merged away, its region released, or reused.
        if field(chunks, h, "generation") != g:
            continue
        if field(chunks, h, "allocation_id") != -1 or field(chunks, h, "bin") == NO_HANDLE:
            continue
        if field(chunks, h, "freed_at_count") == 0:
            merge_h[nm] = h
            merge_g[nm] = g
            nm += 1
        elif field(chunks, h, "freed_at_count") < safe_frontier:
            set_field(chunks, h, "freed_at_count", 0)
            merge_h[nm] = h
            merge_g[nm] = g
            nm += 1
        elif required_bytes > 0:
            merge_h[nm] = h
            merge_g[nm] = g
            nm += 1
        else:
            keep_h[nk] = h
            keep_g[nk] = g
            nk += 1
    state[S_TSQ_HEAD] = 0
    state[S_TSQ_COUNT] = 0
    for k in range(nk):
        _queue_push(tsq, state, keep_h[k], keep_g[k])
    satisfied = required_bytes == 0
    force = required_bytes > 0
    for k in range(nm):
        h = merge_h[k]
        if field(chunks, h, "generation") != merge_g[k]:
            continue
        if required_bytes == 0 or not satisfied:
            remove_free(chunks, bins, state, h)
            nh = try_to_coalesce(chunks, bins, regions, state, h, force)
            insert_free(chunks, bins, regions, state, nh)
            if force:
                if nh != h and field(chunks, nh, "freed_at_count") > 0:
                    _queue_push(tsq, state, nh, field(chunks, nh, "generation"))
                if field(chunks, nh, "size") >= required_bytes:
                    satisfied = True
        else:
            _queue_push(tsq, state, h, merge_g[k])
    return satisfied


@inner
def _split_region_before(chunks, regions, state, r, h, r2):
    """Move chunk ``h`` (not region ``r``'s first) and every chunk after it
    into the empty region row ``r2``, which keeps ``r``'s newest piece (or
    starts it, if that piece was cut at ``h``; ``UNKNOWN_PIECE`` stays
    unknown)."""
    base2 = field(chunks, h, "ptr")
    end = field(regions, r, "base") + field(regions, r, "size")
    prv = field(chunks, h, "prev")
    set_field(chunks, prv, "next", NO_HANDLE)
    set_field(chunks, h, "prev", NO_HANDLE)
    set_field(regions, r2, "base", base2)
    set_field(regions, r2, "size", end - base2)
    set_field(regions, r2, "first", h)
    set_field(regions, r2, "last", field(regions, r, "last"))
    set_field(regions, r2, "bin", field(regions, r, "bin"))
    newest = field(regions, r, "last_piece")
    set_field(regions, r2, "last_piece", newest if newest == UNKNOWN_PIECE else max(newest, base2))
    set_field(regions, r, "size", base2 - field(regions, r, "base"))
    set_field(regions, r, "last", prv)
    state[S_NUM_REGIONS] += 1
    while h != NO_HANDLE:
        set_field(chunks, h, "region", r2)
        h = field(chunks, h, "next")


@inner
def punch_region(chunks, bins, regions, state, r, lo, hi, left_last_piece):
    """Give ``[lo, hi)`` of region ``r`` back: it lies inside one free,
    binned chunk. What lies below ``lo`` stays region ``r`` (its newest piece
    becomes ``left_last_piece``); what lies above ``hi`` becomes a region of
    its own. Returns ``hi - lo``, or ``NEED_ROWS`` (nothing changed) when a
    table is full."""
    r2 = -1
    if hi < field(regions, r, "base") + field(regions, r, "size"):
        r2 = empty_region_row(regions)
        if r2 < 0:
            return NEED_ROWS
    if state[S_FREE_ROWS] < 2:
        return NEED_ROWS
    h = field(regions, r, "first")
    while field(chunks, h, "ptr") + field(chunks, h, "size") <= lo:
        h = field(chunks, h, "next")
    remove_free(chunks, bins, state, h)
    if field(chunks, h, "ptr") < lo:
        m = split_chunk(chunks, bins, regions, state, h, lo - field(chunks, h, "ptr"))
        insert_free(chunks, bins, regions, state, h)
        h = m
    if field(chunks, h, "ptr") + field(chunks, h, "size") > hi:
        insert_free(chunks, bins, regions, state, split_chunk(chunks, bins, regions, state, h,
                                                              hi - lo))
    if r2 >= 0:
        _split_region_before(chunks, regions, state, r, field(chunks, h, "next"), r2)
    # ``h`` is now exactly [lo, hi) and region ``r``'s last chunk.
    if h == field(regions, r, "first"):
        remove_region(chunks, bins, regions, state, r)
    else:
        prv = field(chunks, h, "prev")
        set_field(chunks, prv, "next", NO_HANDLE)
        set_field(regions, r, "last", prv)
        release_row(chunks, state, h)
        set_field(regions, r, "size", field(regions, r, "size") - (hi - lo))
        set_field(regions, r, "last_piece", left_last_piece)
        state[S_POOL_BYTES] -= hi - lo
    return hi - lo


@inner
def region_holding(regions, ptr, starting):
    """The row of the live region that holds address ``ptr`` (with
    ``starting``: that starts at ``ptr``), or -1."""
    for r in range(regions.shape[0]):
        base = field(regions, r, "base")
        if field(regions, r, "size") > 0 and base <= ptr < base + field(regions, r, "size"):
            return r if base == ptr or not starting else -1
    return -1


@inner
def join_regions(chunks, bins, regions, state, ra, rb):
    """Append region ``rb``, which starts where ``ra`` ends, to ``ra``; the
    free chunks that meet at the seam merge. Frees row ``rb``."""
    h = field(regions, rb, "first")
    last = field(regions, ra, "last")
    set_field(chunks, last, "next", h)
    set_field(chunks, h, "prev", last)
    c = h
    while c != NO_HANDLE:
        set_field(chunks, c, "region", ra)
        c = field(chunks, c, "next")
    set_field(regions, ra, "size", field(regions, ra, "size") + field(regions, rb, "size"))
    set_field(regions, ra, "last", field(regions, rb, "last"))
    set_field(regions, ra, "last_piece", field(regions, rb, "last_piece"))
    set_field(regions, rb, "size", 0)
    set_field(regions, rb, "first", NO_HANDLE)
    set_field(regions, rb, "last", NO_HANDLE)
    set_field(regions, rb, "bin", NO_HANDLE)
    set_field(regions, rb, "last_piece", 0)
    state[S_NUM_REGIONS] -= 1
    if field(chunks, h, "allocation_id") == -1 and field(chunks, h, "bin") != NO_HANDLE:
        remove_free(chunks, bins, state, h)
        insert_free(chunks, bins, regions, state, try_to_coalesce(chunks, bins, regions,
                                                                  state, h, HONOUR_TIMESTAMPS))


@inner
def free_head_end(chunks, regions, r):
    """Where region ``r``'s first chunk ends if it is free, binned and not
    waiting on a timing count, else the region's base."""
    h = field(regions, r, "first")
    if not releasable(chunks, h):
        return field(regions, r, "base")
    return field(chunks, h, "ptr") + field(chunks, h, "size")
