"""The ``compact`` policy: BFC's kernels tuned for the smallest footprint.

Two spaces, each with BFC's 21 size bins of its own (``SPACE_BINS``, the
state's ``S_SPACE_BINS``): requests smaller than ``state[S_SMALL_SIZE]`` are
served from the small space, the rest from the large one, so short-lived
small blocks do not pin holes between large ones. A region's space is its
``regions["bin"]``; its free chunks go to bin ``space * SPACE_BINS +
bin_for_size(size)``. Within a space the choice is BFC's best fit (smallest
chunk that fits, lowest address among equal sizes: the same chunk one ordered
set per space would give, found in smaller trees), handed out by BFC's
``take_chunk`` with a split threshold of ``MAX_INTERNAL_FRAGMENTATION`` (4 KiB,
where TF's is 128 MiB): a chunk is split down to the rounded request unless
what it would leave is less than the request and less than 4 KiB.

Growth and giving memory back need the backend and stay in the façade
(``numba_bfc.allocators.CompactAllocator``): it grows a space by the pages the
request is short of, and gives whole free backend pieces at the end of a
space back. The kernel's part of that is to notice, on a free, that the end
has become worth giving back, and, in a batch under an address lease
(``kernels.lease``), to grow a space at its top itself (``lease_growth``).
"""

from __future__ import annotations

import numpy as np

from ..kernels.chunks import (
    add_region,
    bin_for_size,
    free_head_end,
    free_tail_start,
    join_regions,
    largest_free_chunk,
    punch_region,
    region_holding,
    releasable,
    round_up,
    round_up_to_multiple,
    whole_pages,
)
from ..kernels.fields import field
from ..kernels.guard import may_proceed, state_at, table_views
from ..kernels.jit import fast_operation, inner, njit, operation
from ..kernels.layout import (
    FAILED_HERE,
    GREW_NOT_FOUND,
    LEASE_SLOW_PATH,
    NO_HANDLE,
    NOT_FOUND,
    RELEASED_NOT_FOUND,
    ROWS_PER_OPERATION,
    S_BYTES_IN_USE,
    S_FAIL_LIMIT,
    S_FAILED_LARGEST_FREE,
    S_FREE_ROWS,
    S_MIN_ALLOCATION,
    S_NUM_REGIONS,
    S_POOL_BYTES,
    S_SPACE_BINS,
    S_TSQ_COUNT,
    STATE_SIZE,
    TABLES_BUSY,
    UNKNOWN_PIECE,
)
from ..kernels.lease import (
    LEASE_GRANULE,
    LEASE_ROOM,
    LEASE_SLOTS,
    LEASE_TOP,
    lease_fall_back,
    lease_next,
    lease_take,
)
from .bfc import UNTAGGED, allocate_from_bins, free_and_coalesce, free_bytes

S_RELEASE_THRESHOLD = STATE_SIZE  # free tail bytes that trigger a release (0: never)
S_RELEASE_DUE = STATE_SIZE + 1  # region row + 1 whose tail is due, 0 if none
S_SMALL_SIZE = STATE_SIZE + 2  # requests below this go to the small space (0: one space)
# Address leases, one per space (``lease_growth``), while the façade holds them;
# the façade writes S_LEASE_LIMIT .. S_LEASE_PIECES - 1 in one go, in this order.
S_LEASE_ON = STATE_SIZE + 3  # 1 while the leases are held
S_LEASE_LIMIT = STATE_SIZE + 4  # the memory limit
S_QUANTA = STATE_SIZE + 5  # + space: its growth quantum (whole pages, whole granules)
S_HULLS = STATE_SIZE + 7  # + 2 * space: lowest and highest address its pieces have used
S_PAGE_SIZE = STATE_SIZE + 11  # the growth quantum of a space's first region
S_LEASES = STATE_SIZE + 12  # + LEASE_SLOTS * space: the space's lease (room -1: none)
S_LEASE_PIECES = S_LEASES + 2 * LEASE_SLOTS  # entries in the log of the leases...
S_LEASE_LOG = S_LEASE_PIECES + 1  # ...(space, address, size) each, in the order done
LEASE_LOG_PIECES = 128  # pieces placed (size > 0) and pages given back (size < 0)
# Under the leases, the façade may also let the kernel fail an allocation
# itself where its slow path would fail it with nothing changed (a replay's
# failures after its first; ``compact_allocate``).
S_FAIL_QUIETLY = S_LEASE_LOG + 3 * LEASE_LOG_PIECES  # 1 while allowed
S_FAILED_HERE = S_FAIL_QUIETLY + 1  # how many the kernel failed (the façade counts them)
# The smallest growth quantum when every space remaps (0 otherwise): a free
# chunk smaller holds no whole page, so the out-of-memory release has nothing
# to give back (``CompactGrowth._punchable``).
S_QUIET_PAGE = S_FAILED_HERE + 1
# Set once pages have gone back from the middle of a space (the façade's
# ``_punched``): growth then looks at the holes too.
S_PUNCHED = S_QUIET_PAGE + 1
# 1 while the backends hold nothing but this allocator's pieces and every space
# that remaps has a lease, so a kernel that gives pages back knows where their
# tops fall (``lease_fall_back``) and that the holes are unmapped.
S_SOLE_HOLDER = S_PUNCHED + 1
# 1 if the kernel grew after its release (``RELEASED_NOT_FOUND``).
S_GREW_AFTER_RELEASE = S_SOLE_HOLDER + 1
# What growth the batch kernel tried before ``LEASE_SLOW_PATH``.
S_BATCH_GROWTH = S_GREW_AFTER_RELEASE + 1
COMPACT_STATE_SIZE = S_BATCH_GROWTH + 1

LARGE_SPACE = 0  # the region ``bin`` of each space
SMALL_SPACE = 1
NUM_SPACES = 2
#: Size bins per space (BFC's): each bin's tree is smaller than one tree per
#: space, and the best fit is the same (measured: about a quarter less time
#: per event on the bundled traces).
SPACE_BINS = 21
NUM_COMPACT_BINS = NUM_SPACES * SPACE_BINS

#: Growth is by at least this many pages, or 1/``GROWTH_FRACTION`` of the
#: pool if less, and never past the limit (measured: about half the backend
#: round trips on growth-heavy replays, the smallest workable limits within
#: 0.006x, since the defragmenting retry gives unused pages back).
GROWTH_PAGES = 8
GROWTH_FRACTION = 8

#: The split rule's threshold (BFC's ``should_split``): a chunk is handed out
#: whole when a split would leave less than the request and less than this
#: many bytes, so an allocation holds at most 4 KiB - 256 bytes beyond its
#: rounded size, and less than that size. Measured against splitting every
#: chunk (one quantum) on the bundled traces: the same peak reserved bytes and
#: smallest workable limits, peak bytes in use at most 0.36% higher
#: (``generate_kv``), and 15% less time per event on ``gpt_train``
#: (docs/policies.md, "The compact policy").
MAX_INTERNAL_FRAGMENTATION = 4096


@njit(cache=True, inline="always")
def space_for(rounded, state):
    """The space a request of ``rounded`` bytes is served from."""
    return SMALL_SPACE if rounded < state[S_SMALL_SIZE] else LARGE_SPACE


# What ``lease_growth`` and ``lease_release`` did.
UNDECIDED = -1  # nothing changed: the façade decides
NO_GROWTH = 0  # every growth is over the limit / nothing to give back: the façade's fails too
GREW = 1
RELEASED = 2

_INT64_MAX = np.int64(2**63 - 1)
_STARTING = np.bool_(True)  # region_holding's flag: not literals (compiled once, as the op's)
_HOLDING = np.bool_(False)
_UNKNOWN_PIECE = np.int64(UNKNOWN_PIECE)
# compact_allocate's ``leased``: a batch's call (under its leases, if open) or a
# single call (never: one that re-enters during a batch must not use them).
IN_BATCH = np.bool_(True)
SINGLE_CALL = np.bool_(False)


@inner
def compact_allocate(chunks, bins, regions, pmap, state, num_bytes, alignment, freed_before,
                     leased):
    """Serve ``num_bytes`` (> 0) by best fit in its space.

    Returns the address (> 0), ``NOT_FOUND`` or ``NEED_ROWS``; on either code
    nothing has changed. In a batch (``leased``) under the address leases,
    also the façade's first growth at a space's top (``lease_growth``):
    ``GREW_NOT_FOUND`` if it grew and there is still no fit. Where the rest
    of the slow path can be the kernels' (``slow_path_is_kernels``),
    ``LEASE_SLOW_PATH`` instead of either, with ``state[S_BATCH_GROWTH]``
    saying what growth was tried: ``compact_slow_path_op`` goes on. And where
    the façade allows it, ``FAILED_HERE``, counted in ``state[S_FAILED_HERE]``
    (``fails_for_certain``).
    """
    rounded, space, alignment, need, first_bin, stop_bin = request_in_space(state, num_bytes,
                                                                            alignment)
    p = allocate_from_bins(chunks, bins, regions, pmap, state, num_bytes, rounded, alignment,
                           freed_before, first_bin, stop_bin)
    if p != NOT_FOUND or not leased or state[S_LEASE_ON] == 0:
        return p
    if (state[S_FAIL_QUIETLY] != 0 and state[S_RELEASE_DUE] == 0
            and fails_for_certain(chunks, bins, regions, state, space, rounded, need)):
        state[S_FAILED_HERE] += 1
        return FAILED_HERE
    grown = UNDECIDED  # with holes, growth is the slow path's (its fills)
    if state[S_PUNCHED] == 0:
        grown = lease_growth(chunks, bins, regions, state, space, need)
        if grown == UNDECIDED:
            return NOT_FOUND
        if grown == GREW:
            p = allocate_from_bins(chunks, bins, regions, pmap, state, num_bytes, rounded,
                                   alignment, freed_before, first_bin, stop_bin)
            if p != NOT_FOUND:
                return p
    if slow_path_is_kernels(state):
        state[S_BATCH_GROWTH] = grown
        return LEASE_SLOW_PATH
    return GREW_NOT_FOUND if grown == GREW else NOT_FOUND


@inner
def request_in_space(state, num_bytes, alignment):
    """``(rounded, space, alignment, need, first_bin, stop_bin)`` of a request:
    its size rounded to the quantum, its space, its alignment (at least the
    quantum), the bytes a free chunk needs to hold it aligned, and the bins
    of its space from its size's up."""
    quantum = state[S_MIN_ALLOCATION]
    rounded = round_up(num_bytes, quantum)
    space = space_for(rounded, state)
    alignment = max(alignment, quantum)
    per_space = state[S_SPACE_BINS]
    first_bin = space * per_space + bin_for_size(rounded, quantum, per_space)
    return (rounded, space, alignment, rounded + alignment - quantum, first_bin,
            (space + 1) * per_space)


@inner
def slow_path_is_kernels(state):
    """True where ``compact_slow_path_op`` can take the façade's slow path under
    the leases: the backends hold nothing but this allocator's pieces, every
    space remaps and no release threshold is set."""
    return (state[S_SOLE_HOLDER] != 0 and state[S_QUIET_PAGE] != 0
            and state[S_RELEASE_THRESHOLD] == 0)


@njit(cache=True, inline="always")
def no_room_whatever_given_back(state, rounded, limit):
    """True if a request of ``rounded`` bytes fits nowhere within ``limit``
    even with every free byte given back: the façade's growth is over the
    limit (its top's free tail plus any growth within the limit is at most
    ``limit`` less the bytes in use), and its release skips its passes
    (``_release_free_regions``)."""
    return rounded > limit - state[S_BYTES_IN_USE]


@njit(cache=True, inline="always")
def fails_whatever_given_back(state, rounded, freed_before):
    """A single call's ``fails_for_certain``, where the façade allows it
    (``S_FAIL_LIMIT``): no room whatever is given back, no timestamped chunk
    waits to be merged, and no give-back is due (the slow path would do it)."""
    limit = state[S_FAIL_LIMIT]
    return (limit > 0 and no_room_whatever_given_back(state, rounded, limit)
            and state[S_RELEASE_DUE] == 0 and (freed_before != 0 or state[S_TSQ_COUNT] == 0))


@inner
def fails_for_certain(chunks, bins, regions, state, space, rounded, need):
    """True if the façade's slow path would fail a request of ``rounded``
    bytes (``need`` with its alignment slack) and change nothing, found
    without a pass over the holes: not even every free byte given back makes
    room (``_release_free_regions`` skips its passes); or, with no holes, its
    growth (``CompactGrowth._extend``: the pages the space's top lacks, or a
    first region) is over the limit even without headroom, and with every
    space remapping (``S_QUIET_PAGE``) no free chunk holds a whole page, so
    its release finds nothing to give back.
    """
    if no_room_whatever_given_back(state, rounded, state[S_LEASE_LIMIT]):
        return True
    page = state[S_QUIET_PAGE]
    if page == 0 or state[S_PUNCHED] != 0:
        return False
    end, tail = top_region_tail(chunks, regions, state, space)
    quantum = state[S_QUANTA + space] if end != 0 else state[S_PAGE_SIZE]
    growth = round_up_to_multiple(max(need - tail, 1), quantum)
    if growth <= state[S_LEASE_LIMIT] - state[S_POOL_BYTES]:
        return False  # the growth may succeed
    return free_bytes(state) < page or largest_free_chunk(chunks, bins) < page


@inner
def lease_growth(chunks, bins, regions, state, space, need):
    """The façade's growth for ``need`` bytes (``CompactGrowth._extend`` on a
    space that remaps, with no holes): the space's first region, or the pages
    its highest region lacks, with the headroom, mapped at its top; placed
    where the space's address lease says the backend would put them.

    Returns ``GREW``; ``NO_GROWTH`` where it is over the limit (the façade
    fails without asking the backend); or ``UNDECIDED`` with nothing changed
    where the façade must decide (no lease for the space, its top elsewhere,
    over the backend's room, a clash with the other space, the log or a table
    full).
    """
    if no_room_to_grow(state):
        return UNDECIDED
    ptr, size, end = growth_at_top(chunks, regions, state, space, need)
    return grow_at(chunks, bins, regions, state, space, ptr, size, end)


@inner
def lease_growth_or_fill(chunks, bins, regions, state, space, need):
    """``lease_growth``, or once pages have gone back from the middle
    (``S_PUNCHED``, where the backends hold nothing but this allocator's
    pieces) the cheapest of its growth at the top and the hole fills
    (``CompactGrowth._grow_in_place``): fewest new pages, then the lowest
    address. Returns as ``lease_growth``."""
    if no_room_to_grow(state):
        return UNDECIDED
    ptr, size, end = growth_at_top(chunks, regions, state, space, need)
    if state[S_PUNCHED] != 0 and end != 0:
        if state[S_SOLE_HOLDER] == 0:
            return UNDECIDED  # something else may be mapped in the holes
        size, ptr = cheapest_fill(chunks, regions, space, need, state[S_QUANTA + space],
                                  state[S_LEASE_LIMIT] - state[S_POOL_BYTES], size, ptr)
        if ptr != end:  # a fill: within the limit
            if state[S_NUM_REGIONS] >= regions.shape[0]:
                return UNDECIDED
            return fill_hole(chunks, bins, regions, state, space, ptr, size)
    return grow_at(chunks, bins, regions, state, space, ptr, size, end)


@inner
def no_room_to_grow(state):
    """True if the leases' log or the chunk table is too full for a growth."""
    return state[S_LEASE_PIECES] == LEASE_LOG_PIECES or state[S_FREE_ROWS] <= ROWS_PER_OPERATION


@inner
def growth_at_top(chunks, regions, state, space, need):
    """``(ptr, bytes, end)``: the growth ``lease_growth`` would place for
    ``need`` bytes, with the space's highest region ending at ``end`` (0: a
    first region, placed by the lease's arithmetic); bytes ``_INT64_MAX``
    where the pages the top lacks are over the limit, ptr -1 where the façade
    must decide."""
    end, tail = top_region_tail(chunks, regions, state, space)
    pool = state[S_POOL_BYTES]
    room = state[S_LEASE_LIMIT] - pool
    if end != 0:  # pages mapped at the top (alloc_at; grow_at adds the headroom)
        size = round_up_to_multiple(max(need - tail, 1), state[S_QUANTA + space])
        return end, size if size <= room else _INT64_MAX, end
    if state[S_NUM_REGIONS] >= regions.shape[0]:  # a new region (alloc)
        return np.int64(-1), np.int64(0), end
    quantum = state[S_PAGE_SIZE]
    size = max(round_up_to_multiple(max(need, 1), quantum), headroom(pool, room, quantum))
    least = state[S_MIN_ALLOCATION]  # the alignment asked of the backend
    ptr, received = lease_next(state, S_LEASES + space * LEASE_SLOTS, size, least)
    if (size > room or ptr < 0 or received > room or ptr % least != 0
            or received % least != 0):
        return np.int64(-1), np.int64(0), end  # the façade gives it back or refuses it
    return ptr, received, end


@inner
def grow_at(chunks, bins, regions, state, space, ptr, size, end):
    """Map ``size`` bytes at ``ptr`` under the space's lease (``growth_at_top``'s
    choice): at the top of the space (``ptr == end``, joining its highest
    region, with headroom) or as its first region (``end == 0``). Returns
    ``GREW``; ``NO_GROWTH`` where the pages are over the limit
    (``_INT64_MAX`` bytes); or ``UNDECIDED`` with nothing changed where the
    façade must decide (ptr -1) or the backend would refuse it or place it
    elsewhere."""
    if ptr < 0:
        return UNDECIDED
    if size == _INT64_MAX:
        return NO_GROWTH
    at = S_LEASES + space * LEASE_SLOTS
    if ptr == end:
        pool = state[S_POOL_BYTES]
        size = max(size, headroom(pool, state[S_LEASE_LIMIT] - pool, state[S_QUANTA + space]))
        if end != state[at + LEASE_TOP] or end % state[at + LEASE_GRANULE] != 0:
            return UNDECIDED
    if not placeable(state, space, ptr, size):
        return UNDECIDED
    add_region(chunks, bins, regions, state, ptr, size, space)
    lease_take(state, at, ptr, size)
    record_growth(state, space, ptr, size)
    return GREW


@inner
def fill_hole(chunks, bins, regions, state, space, ptr, size):
    """Map ``size`` bytes at ``ptr``, inside a hole of the space, and join the
    regions on both sides. Returns as ``grow_at``."""
    if not placeable(state, space, ptr, size):
        return UNDECIDED
    add_region(chunks, bins, regions, state, ptr, size, space)
    state[S_LEASES + space * LEASE_SLOTS + LEASE_ROOM] -= size
    joined = join_at(chunks, bins, regions, state, ptr + size, space)
    if joined >= 0 and state[S_RELEASE_THRESHOLD] > 0:
        # The region above may bring a free tail: the release rule decides
        # once the request is placed, as after a free.
        state[S_RELEASE_DUE] = joined + 1
    record_growth(state, space, ptr, size)
    return GREW


@inner
def placeable(state, space, ptr, size):
    """True if the backend of ``space`` would map ``size`` bytes at ``ptr``
    under its lease: within its room and the int64 address space, and clear
    of the span the other space has used."""
    other = S_HULLS + 2 * (1 - space)
    return (size <= state[S_LEASES + space * LEASE_SLOTS + LEASE_ROOM]
            and ptr <= _INT64_MAX - size
            and not (ptr + size > state[other] and ptr < state[other + 1]))


@inner
def record_growth(state, space, ptr, size):
    """A growth placed: the span the space has used, and the leases' log."""
    own = S_HULLS + 2 * space
    state[own] = min(state[own], ptr)
    state[own + 1] = max(state[own + 1], ptr + size)
    log_lease_entry(state, space, ptr, size)


@njit(cache=True, inline="always")
def headroom(pool, room, quantum):
    """Growth beyond what a request lacks (``CompactGrowth._growth_sizes``):
    ``GROWTH_PAGES`` pages or 1/``GROWTH_FRACTION`` of the pool, whichever is
    less, within the ``room`` the limit leaves, in whole quanta."""
    return min(GROWTH_PAGES * quantum, pool // GROWTH_FRACTION, room) // quantum * quantum


@inner
def log_lease_entry(state, space, ptr, size):
    """Append ``(space, ptr, size)`` to the leases' log (the caller checked room)."""
    log = S_LEASE_LOG + 3 * state[S_LEASE_PIECES]
    state[log] = space
    state[log + 1] = ptr
    state[log + 2] = size
    state[S_LEASE_PIECES] += 1


@inner
def cheapest_fill(chunks, regions, space, need, quantum, room, best_size, best_ptr):
    """``(bytes, address)``: the least of ``(best_size, best_ptr)`` and every
    hole fill between two regions of ``space`` that serves ``need`` bytes
    within ``room`` (``CompactGrowth._fills``: extending the free tail of the
    region below, the free head of the region above, or filling the hole and
    joining both), fewest bytes first, then the lowest address."""
    for a in range(regions.shape[0]):
        if field(regions, a, "size") <= 0 or field(regions, a, "bin") != space:
            continue
        a_end = field(regions, a, "base") + field(regions, a, "size")
        b = np.int64(NO_HANDLE)
        for r in range(regions.shape[0]):  # the region above: a space has few
            if (field(regions, r, "size") > 0 and field(regions, r, "bin") == space
                    and field(regions, r, "base") >= a_end
                    and (b < 0 or field(regions, r, "base") < field(regions, b, "base"))):
                b = r
        if b < 0:
            continue
        b_base = field(regions, b, "base")
        hole = b_base - a_end
        if hole <= 0:
            continue
        below = a_end - free_tail_start(chunks, regions, a)
        above = free_head_end(chunks, regions, b) - b_base
        left = round_up_to_multiple(max(need - below, 1), quantum)
        right = round_up_to_multiple(max(need - above, 1), quantum)
        if left < hole:
            best_size, best_ptr = cheaper(left, a_end, room, best_size, best_ptr)
        if right < hole:
            best_size, best_ptr = cheaper(right, b_base - right, room, best_size, best_ptr)
        if below + hole + above >= need:
            best_size, best_ptr = cheaper(hole, a_end, room, best_size, best_ptr)
    return best_size, best_ptr


@inner
def cheaper(size, ptr, room, best_size, best_ptr):
    """The cheaper growth of ``(size, ptr)`` within ``room`` and ``(best_size,
    best_ptr)``: fewer bytes, then the lower address."""
    if size <= room and (size < best_size or (size == best_size and ptr < best_ptr)):
        return size, ptr
    return best_size, best_ptr


@inner
def join_at(chunks, bins, regions, state, seam, space):
    """Join the regions of ``space`` that end and start at ``seam``
    (``CompactAllocator._join_at``); returns the joined row, or -1 if there
    are not two such regions."""
    above = region_holding(regions, seam, _STARTING)
    below = region_holding(regions, seam - 1, _HOLDING)
    if (above < 0 or below < 0
            or field(regions, above, "bin") != space or field(regions, below, "bin") != space):
        return -1
    join_regions(chunks, bins, regions, state, below, above)
    return below


@inner
def lease_release(chunks, bins, regions, state, rounded):
    """The façade's release after its growth failed
    (``CompactGrowth._release_free_regions`` where every space remaps): every
    whole free page goes back, when ``compact_slow_path_op`` may run
    (``slow_path_is_kernels``).

    Gives the page runs back highest first (``_punch``), each logged with its
    size negated for the façade to give back to the backend, and moves the
    spaces' leases back. Returns ``RELEASED``; ``NO_GROWTH`` where nothing
    goes back (the façade's release returns False); or ``UNDECIDED`` with
    nothing changed (the log or a table would overflow).
    """
    if no_room_whatever_given_back(state, rounded, state[S_LEASE_LIMIT]):
        return NO_GROWTH
    if largest_free_chunk(chunks, bins) < state[S_QUIET_PAGE]:
        return NO_GROWTH  # no free chunk holds a whole page
    # The page runs (space, lo, hi), written where their log entries go.
    first = S_LEASE_LOG + 3 * state[S_LEASE_PIECES]
    n = 0
    for r in range(regions.shape[0]):
        if field(regions, r, "size") <= 0:
            continue
        space = field(regions, r, "bin")
        h = field(regions, r, "first")
        while h != NO_HANDLE:
            if releasable(chunks, h):
                lo, hi = whole_pages(chunks, h, state[S_QUANTA + space])
                if hi > lo:
                    if state[S_LEASE_PIECES] + n == LEASE_LOG_PIECES:
                        return UNDECIDED
                    state[first + 3 * n] = space
                    state[first + 3 * n + 1] = lo
                    state[first + 3 * n + 2] = hi
                    n += 1
            h = field(chunks, h, "next")
    if n == 0:
        return NO_GROWTH
    if (n > regions.shape[0] - state[S_NUM_REGIONS]
            or state[S_FREE_ROWS] < 2 * n + ROWS_PER_OPERATION + 1):
        return UNDECIDED
    # Highest first: a region keeps its base while its top is cut (insertion
    # sort on the entries, in place: a release has few runs).
    for k in range(1, n):
        j = k
        while j > 0 and state[first + 3 * (j - 1) + 1] < state[first + 3 * j + 1]:
            for f in range(3):
                e = first + 3 * j + f
                state[e], state[e - 3] = state[e - 3], state[e]
            j -= 1
    for k in range(n):
        e = first + 3 * k
        lo, hi = state[e + 1], state[e + 2]
        punch_region(chunks, bins, regions, state, region_holding(regions, lo, _HOLDING),
                     lo, hi, _UNKNOWN_PIECE)
        state[e + 2] = lo - hi  # the size given back, negated
    state[S_LEASE_PIECES] += n
    for space in range(NUM_SPACES):
        at = S_LEASES + space * LEASE_SLOTS
        released = np.int64(0)
        for k in range(n):
            if state[first + 3 * k] == space:
                released -= state[first + 3 * k + 2]
        if released > 0 and state[at + LEASE_ROOM] >= 0:  # room -1: no lease
            end, _ = top_region_tail(chunks, regions, state, space)
            lease_fall_back(state, at, end, released)
    state[S_PUNCHED] = 1
    return RELEASED


@inner
def tail_release_due(chunks, regions, state, r):
    """True if region ``r`` ends in a free chunk of at least the release
    threshold that covers its newest backend piece (so some can go back)."""
    threshold = state[S_RELEASE_THRESHOLD]
    if threshold <= 0:
        return False
    start = free_tail_start(chunks, regions, r)
    return (field(regions, r, "base") + field(regions, r, "size") - start >= threshold
            and start <= field(regions, r, "last_piece"))


@inner
def top_region_tail(chunks, regions, state, space):
    """``(end, free tail bytes)`` of the region of ``space`` that ends highest;
    ``(0, 0)`` if the space has none. Growth on a contiguous backend extends
    that region."""
    best = np.int64(NO_HANDLE)
    end = 0
    unseen = state[S_NUM_REGIONS]  # live rows: the pass stops at the last
    for r in range(regions.shape[0]):
        if unseen == 0:
            break
        if field(regions, r, "size") <= 0:
            continue
        unseen -= 1
        region_end = field(regions, r, "base") + field(regions, r, "size")
        if field(regions, r, "bin") == space and region_end > end:
            best = r
            end = region_end
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
        r = np.int64(field(chunks, h, "region"))
        if tail_release_due(chunks, regions, state, r):
            state[S_RELEASE_DUE] = r + 1
    return size


@fast_operation
def compact_allocate_op(state_address, num_bytes, locked):
    """``compact_allocate`` of ``num_bytes`` aligned to the quantum, with no
    timing count, on the tables the state at ``state_address`` records (as
    ``bfc_allocate_op``).
    With ``locked`` false (a caller without the façade's lock) it answers
    ``TABLES_BUSY``, changing nothing, while the lock is held
    (``kernels.guard``).

    Where no chunk fits and the slow path could only fail
    (``fails_whatever_given_back``), it answers ``FAILED_HERE`` and records
    the largest free chunk in ``state[S_FAILED_LARGEST_FREE]``; nothing else
    changes.
    """
    state = state_at(state_address)
    return _allocate_on_tables(state, num_bytes, state[S_MIN_ALLOCATION], UNTAGGED, locked)


@operation
def compact_allocate_aligned_op(state, num_bytes, alignment, freed_before, locked):
    """``compact_allocate_op`` with any ``alignment`` and timing count
    ``freed_before`` (as ``bfc_allocate_aligned_op``)."""
    return _allocate_on_tables(state, num_bytes, alignment, freed_before, locked)


@inner
def _allocate_on_tables(state, num_bytes, alignment, freed_before, locked):
    """Both allocation operations: the guard, ``compact_allocate``, and
    ``FAILED_HERE`` where the slow path could only fail."""
    if not may_proceed(state, locked):
        return TABLES_BUSY
    chunks, bins, regions, pmap, _, st = table_views(state)
    p = compact_allocate(chunks, bins, regions, pmap, st, num_bytes, alignment, freed_before,
                         SINGLE_CALL)
    if p == NOT_FOUND and fails_whatever_given_back(
            st, round_up(num_bytes, st[S_MIN_ALLOCATION]), freed_before):
        st[S_FAILED_LARGEST_FREE] = largest_free_chunk(chunks, bins)
        return FAILED_HERE
    return p


@operation
def compact_slow_path_op(state, num_bytes, alignment):
    """The façade's slow path for ``num_bytes`` after ``compact_allocate``
    answered ``LEASE_SLOW_PATH`` (``BFCBase._allocate_slow`` with
    ``CompactGrowth``'s growth and release), under the leases: the growth,
    with the hole fills, unless the batch tried it (``state[S_BATCH_GROWTH]``),
    and the retry; the release of every whole free page (``lease_release``),
    the growth after it and the retry.

    Returns the address; ``FAILED_HERE`` (counted) where the slow path fails
    and the façade allows it; otherwise ``NOT_FOUND`` or ``GREW_NOT_FOUND``
    (as ``compact_allocate``: the façade goes on) or ``RELEASED_NOT_FOUND``
    (pages given back, and grown after if ``state[S_GREW_AFTER_RELEASE]``: the
    façade goes on from there); or ``NEED_ROWS`` where a retry needs rows.

    A kernel of its own, on the recorded tables: the batch kernel does not
    compile it in.
    """
    chunks, bins, regions, pmap, _, state = table_views(state)
    if state[S_LEASE_ON] == 0:  # a call that re-entered settled the leases
        return GREW_NOT_FOUND if state[S_BATCH_GROWTH] == GREW else NOT_FOUND
    rounded, space, alignment, need, first_bin, stop_bin = request_in_space(state, num_bytes,
                                                                            alignment)
    grown = state[S_BATCH_GROWTH]
    grow = grown == UNDECIDED  # the batch did not try
    released = False
    state[S_GREW_AFTER_RELEASE] = 0
    for _ in range(2):  # before the release, then after it
        if grow:
            grown = lease_growth_or_fill(chunks, bins, regions, state, space, need)
            if grown == UNDECIDED:
                return RELEASED_NOT_FOUND if released else NOT_FOUND
            if grown == GREW:
                state[S_GREW_AFTER_RELEASE] = released
                p = allocate_from_bins(chunks, bins, regions, pmap, state, num_bytes, rounded,
                                       alignment, UNTAGGED, first_bin, stop_bin)
                if p != NOT_FOUND:
                    return p
        if released:
            break
        gave_back = lease_release(chunks, bins, regions, state, rounded)
        if gave_back == UNDECIDED:
            return GREW_NOT_FOUND if grown == GREW else NOT_FOUND
        if gave_back == NO_GROWTH:
            break
        released = True
        grow = True
    # The slow path fails here.
    if state[S_FAIL_QUIETLY] != 0:
        state[S_FAILED_HERE] += 1
        return FAILED_HERE
    if released:
        return RELEASED_NOT_FOUND
    return GREW_NOT_FOUND if grown == GREW else NOT_FOUND


@fast_operation
def compact_deallocate_op(state_address, ptr, locked):
    """``compact_deallocate`` on the tables the state at ``state_address``
    records (as ``bfc_deallocate_op``). With ``locked`` false it
    also steps aside when a free may make a give-back due (a release threshold
    is set), since that decision must stay under the lock with the free.
    (Timestamped frees are BFC's: ``bfc_deallocate_timestamped_op``.)"""
    state = state_at(state_address)
    if not locked and state[S_RELEASE_THRESHOLD] > 0:
        return TABLES_BUSY
    if not may_proceed(state, locked):
        return TABLES_BUSY
    chunks, bins, regions, pmap, _, st = table_views(state)
    return compact_deallocate(chunks, bins, regions, pmap, st, ptr)


@operation
def top_region_tail_op(state, space):
    """``top_region_tail`` on the recorded tables (under the lock)."""
    chunks, _, regions, _, _, st = table_views(state)
    return top_region_tail(chunks, regions, st, space)
