"""Table layouts shared by every kernel: structured dtypes and state slots.

The allocator's whole state lives in five NumPy arrays, so kernels take arrays
and scalars only and the Python façade can grow, copy or inspect them. The
state array itself is made once and never replaced: the single-call allocate
and free and the lookup of a live allocation are given its address
(``kernels.guard.state_at``).

Chunk table (``CHUNK_DTYPE``), one row per chunk; a row index is a chunk handle.
Unused rows are chained through ``next`` into a free-handle list.

=================  ======================================================
``size``           bytes covered by the chunk (a multiple of the rounding)
``ptr``            address of the chunk's first byte
``left``/``right``/``parent``  links in the owning bin's ordered free set
``bin``            bin holding the chunk while it is free, -1 otherwise
``priority``       treap priority (a hash of ``ptr``), for the ordered free sets
``prev``/``next``  address-adjacent chunks in the same region, -1 at the ends
``allocation_id``  > 0 while in use, -1 when free, ``UNMAPPED`` (-2) for
                   address space with no memory (the caching policy's
                   expandable segments)
``freed_at_count`` timing-counter tag of the last timestamped free, 0 if none
``requested_size`` bytes the client asked for (in-use chunks)
``region``         row in the region table
``generation``     bumped when the row is released, so queued handles can
                   tell a recycled row from the chunk they meant
=================  ======================================================

The fields a tree walk reads (the key, then the links) come first, in the
row's first 32 bytes. A row is 80 bytes and starts 0, 16, 32 or 48 bytes into
a 64-byte cache line, so for three rows in four a step of a walk touches one
line (``docs/performance.md``, "The chunk row's field order").

Bin table (``BIN_DTYPE``), one row per size class (per space, or per pool of
the caching policy, and size class with ``S_SPACE_BINS``): ``bin_size`` (smallest size
the bin holds) and ``root`` (root handle of its ordered free set, -1 if
empty). Nothing counts a bin's chunks or bytes: the trees change on most
operations, and what a report needs is summed from the chunk table when read.

Region table (``REGION_DTYPE``), one row per backend region (``size == 0``
marks an unused row): ``base``, ``size``, ``first`` and ``last`` chunk handles,
``bin``: -1 when free chunks go to the bin for their size (BFC), else the
region's space (the compact policy) or pool (the caching policy, where a
block's pool is fixed by its segment, not by its size), whose
``S_SPACE_BINS`` size bins its free chunks go to, and
``last_piece``: where the newest backend allocation merged into the region
starts (the compact policy can give back only whole backend allocations;
``UNKNOWN_PIECE`` where a kernel that gave pages back from the region's
middle could not know it, until the façade, which records the pieces, fills
it in), and
``page``: 0, or for an expandable segment of the caching policy (address space
mapped page by page, PyTorch's ``ExpandableSegment``) its page size.

Pointer map: ``int64[cap, 2]`` open-addressing hash table ``(ptr, handle)`` of
in-use chunks (key 0 = empty slot), so pointer -> chunk is O(1) and host
metadata stays O(number of chunks), unlike TF's one handle per 256 bytes.

State: ``int64[STATE_SIZE]`` of counters, indexed by the ``S_*`` constants.
"""

from __future__ import annotations

import functools

import numpy as np

CHUNK_DTYPE = np.dtype(
    [
        ("size", np.int64),
        ("ptr", np.int64),
        ("left", np.int32),
        ("right", np.int32),
        ("parent", np.int32),
        ("bin", np.int32),
        ("priority", np.int64),
        ("prev", np.int32),
        ("next", np.int32),
        ("allocation_id", np.int64),
        ("freed_at_count", np.int64),
        ("requested_size", np.int64),
        ("region", np.int32),
        ("generation", np.int32),
    ]
)

BIN_DTYPE = np.dtype(
    [
        ("bin_size", np.int64),
        ("root", np.int64),
    ]
)

REGION_DTYPE = np.dtype(
    [
        ("base", np.int64),
        ("size", np.int64),
        ("first", np.int64),
        ("last", np.int64),
        ("bin", np.int64),
        ("last_piece", np.int64),
        ("page", np.int64),
    ]
)

NO_HANDLE = -1
UNKNOWN_PIECE = -1  # a region's ``last_piece`` that only the façade knows (see above)

# An unused region row.
_EMPTY_REGION = np.zeros((), dtype=REGION_DTYPE)
for _field in ("first", "last", "bin"):
    _EMPTY_REGION[_field] = NO_HANDLE

# An unused chunk row, as bytes (its link, ``next``, is set where it is chained).
_UNUSED_ROW = np.zeros(1, dtype=CHUNK_DTYPE)
_UNUSED_ROW["allocation_id"] = -1
for _field in ("prev", "left", "right", "parent", "bin", "region"):
    _UNUSED_ROW[_field] = NO_HANDLE
_UNUSED_ROW.flags.writeable = False
_UNUSED_ROW_BYTES = _UNUSED_ROW.view(np.uint8)

#: ``allocation_id`` of a chunk of address space with no memory behind it (a
#: caching-policy expandable segment's unmapped block): neither free nor in use.
UNMAPPED = -2

# State slots.
S_NEXT_ALLOCATION_ID = 0
S_NUM_ALLOCS = 1
S_BYTES_IN_USE = 2
S_PEAK_BYTES_IN_USE = 3
S_LARGEST_ALLOC_SIZE = 4
S_POOL_BYTES = 5
S_PEAK_POOL_BYTES = 6
S_FREE_HEAD = 7  # head of the free-handle list
S_FREE_ROWS = 8  # rows on the free-handle list
S_MAP_COUNT = 9  # keys in the pointer map = allocations in use
# The largest free chunk when a single call's allocation kernel last failed
# the allocation itself (``FAILED_HERE``): what the error's stats report.
S_FAILED_LARGEST_FREE = 10
# The memory limit while a single call's allocation kernel may fail an
# allocation itself, where the façade's slow path could only fail, changing
# nothing (each policy says when: ``fails_without_growth`` in
# ``policies.bfc``, ``fails_whatever_given_back`` in ``policies.compact``);
# 0 while it may not.
S_FAIL_LIMIT = 11
# The size the kernel's ``FAILED_HERE`` failed, rounded as the policy's error
# reports it (the caching policy: the segment it would have needed).
S_FAILED_ROUNDED = 22
# The state's own length: a kernel given only the state's address
# (``kernels.guard.state_at``) reads it here.
S_STATE_SLOTS = 23
S_MAX_INTERNAL_FRAGMENTATION = 12  # BFC split threshold, bytes
S_MIN_ALLOCATION = 13  # rounding quantum (256 for BFC)
S_TSQ_HEAD = 14  # timestamped-chunk queue (ring buffer) head
S_TSQ_COUNT = 15
S_NUM_REGIONS = 16
S_NUM_BINS = 17
S_TSQ_ADDR = 18  # data address of the timestamped-chunk queue (see S_LOCK_DEPTH)
S_TSQ_SLOTS = 19
# N: a region's ``bin``, if not -1, is its space (the compact policy's spaces,
# the caching policy's pools) of N size bins: a free chunk of it goes to bin
# ``space * N + bin_for_size(size)``.
S_SPACE_BINS = 20
# Bit b set while bin b holds a free chunk: the search for a fit skips empty
# bins in one step (``kernels.chunks.next_nonempty_bin``). Hence ``MAX_BINS``.
S_NONEMPTY_BINS = 21
# Lock-free calls (``kernels.guard``): the façade's lock depth, and where the
# current tables are, so a kernel given only ``state`` can see them.
S_LOCK_DEPTH = 24  # > 0 while a thread holds the façade's lock
S_CHUNKS_ADDR = 25  # data address of the chunk table
S_CHUNK_ROWS = 26
S_BINS_ADDR = 27  # (rows: S_NUM_BINS)
S_REGIONS_ADDR = 28
S_REGION_ROWS = 29
S_PMAP_ADDR = 30
S_PMAP_SLOTS = 31
STATE_SIZE = 32  # slots from here on belong to the policy (see policies.caching)

#: The most bins a bin table has: one bit each in ``state[S_NONEMPTY_BINS]``.
MAX_BINS = 64

# Kernel status codes (allocation kernels return a pointer > 0 on success).
NEED_ROWS = -1  # a table is full: the façade grows it and calls again
NOT_FOUND = -2  # no free chunk fits: the façade extends the pool or fails
INVALID_POINTER = -3  # not a live allocation
TABLES_BUSY = -5  # a lock-free call stepped aside: the façade retries under its lock
GREW_NOT_FOUND = -7  # grown by the kernel under an address lease, and still no fit
#: The allocation fails, and the kernel failed it itself, where the façade's
#: slow path would change nothing but counters: in a batch, under a lease
#: that allows it (a replay's failures after its first; the kernel counts
#: them); in a single call, where the policy's state allows it (the façade
#: raises at once).
FAILED_HERE = -8
#: The kernel gave free pages back under an address lease (the compact
#: policy's out-of-memory release), and the allocation still has no fit: the
#: façade's slow path goes on from its growth after the release.
RELEASED_NOT_FOUND = -9
#: No fit, and the rest of the policy's slow path is a kernel of its own,
#: which the façade calls under the address lease (the compact policy's
#: ``compact_slow_path_op``).
LEASE_SLOW_PATH = -10

# Rows every mutating kernel may consume in one call (padding split,
# remainder split, one new region chunk); checked before anything changes.
ROWS_PER_OPERATION = 3


def new_tables(num_bins: int, min_allocation: int, chunk_rows: int = 1024,
               map_slots: int = 2048, region_rows: int = 64, queue_slots: int = 64,
               state_size: int = STATE_SIZE, space_bins: int = 0):
    """Fresh, empty tables: ``(chunks, bins, regions, pmap, state, tsq)``.
    ``min_allocation``, the rounding of every chunk, is a power of two (the
    kernels round with masks). With ``space_bins`` (``S_SPACE_BINS``), the
    bins are spaces of that many size bins each, from ``min_allocation`` up.

    The tables with contents are copies of a set made once per set of
    arguments: building them (the bins, the regions, 1,024 chained rows)
    took a third of an allocator's construction, which every ``replay()``
    pays."""
    chunks, bins, regions, state = (_byte_copy(table) for table in _pristine_tables(
        num_bins, min_allocation, chunk_rows, region_rows, state_size, space_bins))
    pmap = np.zeros((map_slots, 2), dtype=np.int64)
    tsq = np.zeros((queue_slots, 2), dtype=np.int64)
    return chunks, bins, regions, pmap, state, tsq


# NumPy copies a structured array field by field, 9-14 times slower than its
# bytes for the chunk rows: the tables are copied as bytes.
def _byte_copy(table: np.ndarray) -> np.ndarray:
    copy = np.empty_like(table)
    _copy_rows(copy, table)
    return copy


def _copy_rows(grown: np.ndarray, table: np.ndarray) -> None:
    """``grown[:len(table)] = table``, as bytes."""
    grown.view(np.uint8)[:table.nbytes] = table.view(np.uint8)


@functools.lru_cache(maxsize=16)
def _pristine_tables(num_bins: int, min_allocation: int, chunk_rows: int, region_rows: int,
                     state_size: int, space_bins: int):
    """``(chunks, bins, regions, state)`` as ``new_tables`` returns them, read-only."""
    if min_allocation <= 0 or min_allocation & (min_allocation - 1):
        raise ValueError(f"min_allocation must be a power of two, got {min_allocation}")
    if not 1 <= num_bins <= MAX_BINS:
        raise ValueError(f"num_bins must be from 1 to {MAX_BINS}, got {num_bins}")
    chunks = np.zeros(chunk_rows, dtype=CHUNK_DTYPE)
    bins = np.zeros(num_bins, dtype=BIN_DTYPE)
    bins["root"] = NO_HANDLE
    sizes_per_space = space_bins or num_bins
    bins["bin_size"] = min_allocation << (np.arange(num_bins, dtype=np.int64) % sizes_per_space)
    regions = np.full(region_rows, _EMPTY_REGION, dtype=REGION_DTYPE)
    state = np.zeros(max(state_size, STATE_SIZE), dtype=np.int64)
    state[S_NEXT_ALLOCATION_ID] = 1
    state[S_FREE_HEAD] = NO_HANDLE
    state[S_MIN_ALLOCATION] = min_allocation
    state[S_NUM_BINS] = num_bins
    state[S_SPACE_BINS] = space_bins
    state[S_STATE_SLOTS] = state.shape[0]
    _chain_rows(chunks, state, 0, chunk_rows)
    tables = chunks, bins, regions, state
    for table in tables:
        table.flags.writeable = False
    return tables


def _chain_rows(chunks: np.ndarray, state: np.ndarray, start: int, stop: int) -> None:
    """Make rows ``start..stop-1`` unused rows on the free-handle list
    (vectorised, no kernel): each row's bytes at once, then its link."""
    rows = chunks[start:stop]
    rows.view(np.uint8).reshape(stop - start, CHUNK_DTYPE.itemsize)[:] = _UNUSED_ROW_BYTES
    nxt = np.arange(start + 1, stop + 1, dtype=np.int32)
    nxt[-1] = state[S_FREE_HEAD]
    rows["next"] = nxt
    state[S_FREE_HEAD] = start
    state[S_FREE_ROWS] += stop - start


def grow_chunks(chunks: np.ndarray, state: np.ndarray) -> np.ndarray:
    """Double the chunk table; new rows join the free-handle list."""
    old = chunks.shape[0]
    grown = np.empty(2 * old, dtype=CHUNK_DTYPE)  # every byte is written below
    _copy_rows(grown, chunks)
    _chain_rows(grown, state, old, 2 * old)
    return grown


def grow_regions(regions: np.ndarray) -> np.ndarray:
    """Double the region table."""
    old = regions.shape[0]
    grown = np.empty(2 * old, dtype=REGION_DTYPE)
    _copy_rows(grown, regions)
    grown[old:] = _EMPTY_REGION  # one assignment, not one per field
    return grown


def grow_queue(tsq: np.ndarray, state: np.ndarray) -> np.ndarray:
    """Double the timestamped-chunk ring buffer, unrolling it to start at 0."""
    cap = tsq.shape[0]
    head, count = int(state[S_TSQ_HEAD]), int(state[S_TSQ_COUNT])
    order = (head + np.arange(count)) % cap
    grown = np.zeros((2 * cap, 2), dtype=np.int64)
    grown[:count] = tsq[order]
    state[S_TSQ_HEAD] = 0
    return grown
