"""``CompactAllocator``: the low-fragmentation policy as Numba kernels over tables."""

from __future__ import annotations

import operator

import numpy as np

from ..framework.validate import MAX_INT64
from ..kernels import layout as L
from ..kernels.operations import (
    free_tail_start_op,
    join_regions_op,
    page_runs_op,
    punch_region_op,
    region_holding_op,
    space_regions_op,
    trim_region_op,
)
from ..policies.batch import run_batch_compact
from ..policies.compact import (
    COMPACT_STATE_SIZE,
    NUM_COMPACT_BINS,
    NUM_SPACES,
    S_FAIL_QUIETLY,
    S_FAILED_HERE,
    S_GREW_AFTER_RELEASE,
    S_LEASE_LIMIT,
    S_LEASE_LOG,
    S_LEASE_ON,
    S_LEASE_PIECES,
    S_PUNCHED,
    S_QUIET_PAGE,
    S_RELEASE_DUE,
    S_RELEASE_THRESHOLD,
    S_SMALL_SIZE,
    S_SOLE_HOLDER,
    SPACE_BINS,
    compact_allocate_aligned_op,
    compact_allocate_op,
    compact_deallocate_op,
    compact_slow_path_op,
    top_region_tail_op,
)
from ._fastcall import Kernel, fast_method
from ._tables import REMOVE_REGION
from .bfc import BFCAllocator
from .bfc_base import MIN_ALLOCATION, round_bytes
from .compact_base import CompactGrowth

__all__ = ["CompactAllocator"]

_TOP_REGION_TAIL = Kernel(top_region_tail_op)
_FREE_TAIL_START = Kernel(free_tail_start_op)
_PUNCH_REGION = Kernel(punch_region_op)
_JOIN_REGIONS = Kernel(join_regions_op)
_TRIM_REGION = Kernel(trim_region_op)
_PAGE_RUNS = Kernel(page_runs_op)
_REGION_HOLDING = Kernel(region_holding_op)
_SPACE_REGIONS = Kernel(space_regions_op)


#: A space's lease slots where it has none: room -1, so nothing fits (alignment
#: and granule 1: no division by 0).
_NO_LEASE = (0, 0, 1, 1, -1, 0)


class CompactAllocator(CompactGrowth, BFCAllocator):
    """Best fit with coalescing, tuned for the smallest memory footprint.

    BFC's kernels and out-of-memory path with five changes (see README,
    "The compact policy"): a chunk is split down to the rounded request
    unless that would leave less than the request and less than 4 KiB;
    requests below ``small_size`` have a space (backend) of their
    own; a space grows by the pages a request is short of (at least
    min(8 pages, pool / 8) within the limit), as one contiguous range on a
    coalescing backend; whole free backend pieces at the end of a space go
    back once ``release_threshold`` bytes there are free; on a backend that
    remaps, ``empty_cache()`` and the out-of-memory path give every whole
    free page back, from the middle of a space too, and growth maps pages
    into such holes where that costs the fewest (the defragmenting retry).

    Parameters
    ----------
    backend : SubAllocator
        Best with ``supports_coalescing`` and ``supports_remap``
        (``CudaVirtualSubAllocator``, ``VirtualSubAllocator(contiguous=True)``,
        ``HostSubAllocator(contiguous=True)``); on other backends every growth
        is a separate region.
    memory_limit : int or str, optional
        Most bytes held from the backend; default: the backend's total memory.
    page_size : int or str, optional
        Growth quantum, a power of two >= 256; default: the backend's
        ``granularity`` if it has one, else 2 MiB.
    release_threshold : int or str, optional
        Free bytes at the end of the space that trigger giving whole pieces
        back; default 0: only on ``empty_cache()`` and on the out-of-memory
        path (measured best: giving back early changes later best-fit choices
        and costs a backend round trip per give-back).
    small_size : int or str, optional
        Requests (rounded) below this are served from ``small_backend``;
        default 1 MiB.
    small_backend : SubAllocator, optional
        The small space's backend: a second address range of the same kind
        as ``backend`` (e.g. another ``CudaVirtualSubAllocator``). None: one
        space for every size. ``memory_limit`` counts both.
    name : str, optional

    Options not given are read from ``NUMBA_BFC_CONF``, then defaults.

    Examples
    --------
    >>> from numba_bfc import CompactAllocator
    >>> from numba_bfc.backends import VirtualSubAllocator
    >>> a = CompactAllocator(VirtualSubAllocator(contiguous=True), memory_limit="64MiB",
    ...                      page_size="64KiB")
    >>> p = a.allocate_raw(100_000)
    >>> a.allocated_size(p), a.get_stats().bytes_reserved
    (100096, 131072)
    >>> a.deallocate_raw(p)
    """

    _RUN_BATCH = Kernel(run_batch_compact)
    _LEASE_SLOW_PATH = Kernel(compact_slow_path_op)
    _STATE_SIZE = COMPACT_STATE_SIZE
    _NUM_BINS = NUM_COMPACT_BINS
    _SPACE_BINS = SPACE_BINS
    _POOL_NAMES_BLOCKS = False
    _ALLOCATE = Kernel(compact_allocate_op)
    _ALLOCATE_ALIGNED = Kernel(compact_allocate_aligned_op)
    _DEALLOCATE = Kernel(compact_deallocate_op)

    def __init__(self, backend, memory_limit=None, page_size=None, release_threshold=None,
                 small_size=None, small_backend=None, name=None) -> None:
        super().__init__(backend, memory_limit, page_size, release_threshold, small_size,
                         small_backend, name)

    def deallocate_raw(self, ptr: int | None) -> None:
        # Lock-free first (the kernel steps aside when a give-back may become due).
        address, call, largest = self._fast_deallocate
        if type(ptr) is int and 0 < ptr <= largest and call(address, ptr, False) > 0:
            return
        super().deallocate_raw(ptr)

    def __deallocate_after(self, ptr: int, answer: int) -> None:
        """The free after the lock-free kernel answered ``answer`` (not a size):
        the give-back's way, under the lock."""
        super().deallocate_raw(ptr)

    deallocate_raw.__doc__ = CompactGrowth.deallocate_raw.__doc__
    deallocate_raw = fast_method(deallocate_raw, __deallocate_after, "_deallocate_entry",
                                 releases=True)

    def _serve_after_lease_growth(self, n: int, alignment: int) -> int:
        self._backend_refused = False  # the kernel's growth took its first try
        return self._serve_after_growth(n, alignment)

    _lease_inputs = None  # what _open_lease last wrote into the state

    def _configure_compact(self) -> None:
        self._state[L.S_MAX_INTERNAL_FRAGMENTATION] = self._max_internal_fragmentation
        self._state[S_RELEASE_THRESHOLD] = self.release_threshold
        self._state[S_SMALL_SIZE] = self.small_size
        self._runs_out = np.empty((64, 3), dtype=np.int64)  # _page_runs' rows, grown as needed
        self._regions_out = np.empty((0, 4), dtype=np.int64)  # _space_regions' rows, likewise
        # Its out-of-memory path always gives back (BFC's garbage collection),
        # which the kernel's check takes into account.
        self._state[L.S_FAIL_LIMIT] = self.memory_limit
        # S_QUIET_PAGE under the leases: the smallest growth quantum where every space remaps.
        large_remaps, small_remaps = self._remapping
        every_space_remaps = large_remaps and (self.small_backend is None or small_remaps)
        self._quiet_page = (min(q for q, r in zip(self._quanta, self._remapping) if r)
                            if every_space_remaps else 0)

    def _open_lease(self, fail_quietly: bool = False) -> None:
        # Only where _grow_for's growth is the kernel's: spaces that remap
        # (compact_base._extend, _grow_in_place). Once per batch call, and a
        # fresh allocator's replay pays it whole: written for few Python steps.
        if self._timestamps_used:
            return
        large, small = self._space_backends
        large_remaps, small_remaps = self._remapping
        large_lease = large.address_lease() if large_remaps else None
        small_lease = small.address_lease() if small_remaps else None
        if large_lease is None and small_lease is None:
            return
        st = self._state
        # The kernel may give pages back (and fill holes) where the backends hold
        # only the pieces and every space that remaps has a lease to follow.
        held = large.bytes_held if small is None else large.bytes_held + small.bytes_held
        sole = (held == st.item(L.S_POOL_BYTES) and (large_lease is not None or not large_remaps)
                and (small_lease is not None or not small_remaps))
        (large_lo, large_hi), (small_lo, small_hi) = self._hulls
        inputs = (large_lease, small_lease, large_lo, large_hi, small_lo, small_hi,
                  self.memory_limit, fail_quietly, self._punched, sole)
        if inputs != self._lease_inputs:  # else the slots still hold them
            self._lease_inputs = inputs
            st[S_FAIL_QUIETLY] = fail_quietly
            st[S_QUIET_PAGE] = self._quiet_page
            st[S_PUNCHED] = self._punched
            st[S_SOLE_HOLDER] = sole
            # The slots S_LEASE_LIMIT .. S_LEASE_PIECES - 1, in order, at once.
            st[S_LEASE_LIMIT:S_LEASE_PIECES] = (
                self.memory_limit, *self._quanta, min(large_lo, MAX_INT64), large_hi,
                min(small_lo, MAX_INT64), small_hi, self.page_size,
                *(large_lease or _NO_LEASE), *(small_lease or _NO_LEASE))
        st[S_LEASE_ON] = 1

    def _close_lease(self) -> int:
        st = self._state
        self._settle_lease()
        failed = int(st[S_FAILED_HERE])
        if failed:
            st[S_FAILED_HERE] = 0
            self._backend_refused = False  # as _grow_for leaves it on each
        return failed

    def _settle_lease(self) -> None:
        """End the leases and record what the kernels did under them. Also
        where a call re-enters while a batch holds them (a finalizer run
        between the batch's kernel calls) before it calls a backend itself;
        the batch's failures stay counted for the batch."""
        st = self._state
        st[S_LEASE_ON] = 0
        made = st.item(S_LEASE_PIECES)
        if not made:
            return
        st[S_LEASE_PIECES] = 0
        self._lease_inputs = None  # the slots moved on: write them afresh
        log = st[S_LEASE_LOG:S_LEASE_LOG + 3 * made].tolist()
        spaces = log[0::3]
        if spaces.count(spaces[0]) == made:  # one space: the usual batch
            self._record_leased(spaces[0], log[1::3], log[2::3])
            return
        entries = range(0, 3 * made, 3)
        for space in range(NUM_SPACES):
            bases = [log[i + 1] for i in entries if log[i] == space]
            if bases:
                self._record_leased(space, bases, [log[i + 2] for i in entries if log[i] == space])

    def _record_leased(self, space: int, bases: list[int], sizes: list[int]) -> None:
        """Record a space's entries of the leases' log: on its backend, in the
        pieces (when next read) and in the span it has used."""
        self._space_backends[space].record_leased(bases, sizes)
        self._log_pieces(space, bases, sizes)
        if min(sizes) < 0:
            self._punched = True
            placed = [(ptr, size) for ptr, size in zip(bases, sizes) if size > 0]
            if not placed:
                return
            bases, sizes = [ptr for ptr, _ in placed], [size for _, size in placed]
        lo, hi = self._hulls[space]
        self._hulls[space] = (min(lo, min(bases)), max(hi, max(map(operator.add, bases, sizes))))

    def _allocate_slow(self, n: int, alignment: int, freed_before: int,
                       extended: bool = False) -> int:
        self._settle_lease()  # a single call during a batch: no-op otherwise
        return super()._allocate_slow(n, alignment, freed_before, extended)

    def empty_cache(self) -> int:
        with self._lock:
            self._settle_lease()
            return super().empty_cache()

    empty_cache.__doc__ = CompactGrowth.empty_cache.__doc__

    def deallocate_free_regions(self, rounded_bytes: int = 0) -> bool:
        with self._lock:
            self._settle_lease()
            return super().deallocate_free_regions(rounded_bytes)

    deallocate_free_regions.__doc__ = BFCAllocator.deallocate_free_regions.__doc__

    def _release_due(self) -> None:
        self._settle_lease()
        super()._release_due()

    @property
    def tables(self) -> dict[str, np.ndarray]:
        """The live tables (``chunks``, ``bins``, ``regions``, ``pointer_map``,
        ``state``), for inspection; do not modify them. The regions' newest
        pieces that the kernels left to the record of backend pieces are
        filled in first."""
        if self._unplayed:
            self._play_unplayed()
        return super().tables

    def _pieces_played_back(self) -> None:
        """Fill in the newest piece of the regions a kernel cut while giving
        pages back (``policies.compact.lease_release`` marks it unknown), which
        only the pieces know."""
        pieces, regions = self._piece_map, self._regions
        for r in np.flatnonzero((regions["last_piece"] == L.UNKNOWN_PIECE)
                                & (regions["size"] > 0)).tolist():
            end = int(regions[r]["base"] + regions[r]["size"])
            regions[r]["last_piece"] = pieces.peekitem(pieces.bisect_left(end) - 1)[0]

    def _serve_after_release(self, n: int, alignment: int) -> int:
        """The slow path after the kernel gave pages back (``RELEASED_NOT_FOUND``,
        its log replayed): the growth after the release where the kernel left
        it to the façade, the retry, and the error where they fail."""
        self._backend_refused = False
        rounded = round_bytes(n)
        if not self._state[S_GREW_AFTER_RELEASE] and self._extend(max(alignment, MIN_ALLOCATION),
                                                                   rounded):
            p = self._try_allocate(n, alignment, 0)
            if p:
                return p
        raise self._out_of_memory(n, rounded, alignment,
                                  "backend" if self._backend_refused else None)

    def _row(self, base: int) -> int:
        return self._live_row(base, True)

    def _holding(self, ptr: int, starting: bool = False) -> int:
        """The row of the live region holding ``ptr`` (starting there, with
        ``starting``), or -1."""
        return int(_REGION_HOLDING.call(self._state, ptr, starting))

    def _live_row(self, ptr: int, starting: bool) -> int:
        """``_holding``, where no such region is a bug, not bad input."""
        r = self._holding(ptr, starting)
        if r < 0:
            raise RuntimeError(f"no region {'starts at' if starting else 'holds'} {ptr:#x}")
        return r

    def _tail_start(self, base: int, end: int) -> int:
        return int(_FREE_TAIL_START.call(self._state, self._row(base)))

    def _top_tail(self, space: int) -> tuple[int, int]:
        end, tail = _TOP_REGION_TAIL.call(self._state, space)
        return int(end), int(tail)

    def _space_of(self, base: int) -> int:
        return int(self._regions[self._row(base)]["bin"])

    # Rows as lists, not tuples: the callers only unpack them.
    def _page_runs(self, space: int, quantum: int) -> list[list[int]]:
        out = self._runs_out
        while (n := _PAGE_RUNS.call(self._state, space, quantum, out)) < 0:
            out = self._runs_out = np.empty((2 * out.shape[0], 3), dtype=np.int64)
        return out[:n].tolist()

    def _space_regions(self, space: int) -> list[list[int]]:
        out = self._regions_out
        if out.shape[0] < self._regions.shape[0]:  # the region table has grown
            out = self._regions_out = np.empty((self._regions.shape[0], 4), dtype=np.int64)
        return out[:_SPACE_REGIONS.call(self._state, space, out)].tolist()

    def _punch_region(self, base: int, lo: int, hi: int, left_last_piece: int) -> None:
        r = self._row(base)
        while _PUNCH_REGION.call(self._state, r, lo, hi, left_last_piece) == L.NEED_ROWS:
            self._grow_tables()

    def _join_at(self, seam: int, space: int) -> bool:
        regions = self._regions
        above, below = self._holding(seam, True), self._holding(seam - 1)
        if (above < 0 or below < 0
                or regions[above]["bin"] != space or regions[below]["bin"] != space):
            return False
        _JOIN_REGIONS.call(self._state, below, above)
        return True

    def _mark_release_due(self, ptr: int) -> None:
        self._state[S_RELEASE_DUE] = self._live_row(ptr, False) + 1

    def _cut_region(self, base: int, new_end: int, last_piece: int) -> None:
        r = self._row(base)
        if new_end == base:
            REMOVE_REGION.call(self._state, r)
        else:
            _TRIM_REGION.call(self._state, r, new_end, last_piece)

    def _release_pending(self) -> bool:
        return bool(self._state[S_RELEASE_DUE])

    def _take_release_due(self) -> int | None:
        r = int(self._state[S_RELEASE_DUE]) - 1
        self._state[S_RELEASE_DUE] = 0
        if r < 0 or self._regions[r]["size"] == 0:
            return None
        return int(self._regions[r]["base"])

    def _serve_release_due(self) -> None:
        self._release_due()
