"""What both compact implementations share: spaces, exact growth, giving back.

The compact policy keeps BFC's chunk machinery (best fit, coalescing, the
``BFCBase`` out-of-memory path) and changes four things:

* it splits a chunk down to the rounded request unless that would leave less
  than the request and less than 4 KiB (``MAX_INTERNAL_FRAGMENTATION``);
* requests below ``small_size`` live in a space of their own (a second
  backend, ``small_backend``), so short-lived small blocks do not pin holes
  between large ones;
* it grows a space by the pages a request is short of (at least
  ``GROWTH_PAGES`` pages or 1/``GROWTH_FRACTION`` of the pool, whichever is
  less, within the limit), on backends whose regions are adjacent
  (``supports_coalescing``: ``CudaVirtualSubAllocator``,
  ``VirtualSubAllocator(contiguous=True)``, ``HostSubAllocator(contiguous=True)``),
  so each space is one coalescible range instead of islands of doubling size;
* it gives whole backend pieces at the end of a region back once its free
  tail reaches ``release_threshold`` bytes, and all free tails (whole free
  regions included) on ``empty_cache()`` or before raising an out-of-memory
  error;
* on a backend that remaps (``supports_remap``), ``empty_cache()`` and the
  out-of-memory path give back every whole free page, in the middle of a
  region too (the region splits around the hole), and growth then maps new
  pages where they cost least: into a hole next to free bytes, or at the
  top (the defragmenting retry).

Subclasses (``CompactAllocator``, ``ReferenceCompactAllocator``) supply the
store-specific hooks at the end of the class.
"""

from __future__ import annotations

import abc
import contextlib
import itertools
import math
from collections.abc import Sequence

from sortedcontainers import SortedDict

from .._gc_pause import gc_paused
from ..backends.ranges import play_log_on_map
from ..policies.compact import (
    GROWTH_FRACTION,
    GROWTH_PAGES,
    LARGE_SPACE,
    MAX_INTERNAL_FRAGMENTATION,
    SMALL_SPACE,
)
from ._options import resolve_compact_options
from .bfc_base import MIN_ALLOCATION

#: Kernel logs the record of backend pieces keeps unplayed at most (a replay at
#: a tight limit leaves one or two per batch).
_MAX_UNPLAYED = 64


def _round_up(n: int, quantum: int) -> int:
    return -(-n // quantum) * quantum


def _piece_end(start: int, piece: tuple[int, int]) -> int:
    return start + piece[0]


class CompactGrowth:
    """Mixin placed before a BFC implementation (``BFCBase`` subclass) in the bases.

    It adds the compact policy's growth and give-back to a BFC chunk store;
    the store implements the abstract space and region hooks below
    (``CompactAllocator`` over the tables, ``ReferenceCompactAllocator`` over
    Python objects).
    """

    def __init__(self, backend, memory_limit=None, page_size=None, release_threshold=None,
                 small_size=None, small_backend=None, name=None) -> None:
        opts = resolve_compact_options(backend, memory_limit=memory_limit, page_size=page_size,
                                       release_threshold=release_threshold,
                                       small_size=small_size, name=name)
        if small_backend is not None and (bool(small_backend.supports_coalescing)
                                          != bool(backend.supports_coalescing)):
            raise ValueError("small_backend must coalesce regions exactly when backend does")
        if small_backend is backend:
            raise ValueError("small_backend must be a second backend, not backend itself")
        # Growth is always on demand; whole free regions go back on the OOM path.
        super().__init__(backend, opts.memory_limit, True, True, 0.0, opts.name)
        self.page_size = opts.page_size
        self.release_threshold = opts.release_threshold
        self.small_size = opts.small_size if small_backend is not None else 0
        self._space_backends = (backend, small_backend)
        self._max_internal_fragmentation = MAX_INTERNAL_FRAGMENTATION
        # Backend allocations: ptr -> (size, space) (see _pieces); and the span
        # each space has used.
        self._piece_map: SortedDict = SortedDict()
        # What batch kernels did to the pieces, in order, not yet played on
        # _piece_map: (space, bases, sizes) as in their log (``_log_pieces``).
        self._unplayed: list[tuple[int, list[int], list[int]]] = []
        self._hulls = [(1 << 63, 0), (1 << 63, 0)]
        # Set once a page has gone back from the middle of a space: from then
        # on growth also looks at the holes.
        self._punched = False
        self._remapping = [self._coalesce_regions and bool(getattr(b, "supports_remap", False))
                           for b in self._space_backends]
        self._quanta = [math.lcm(self.page_size, int(getattr(b, "granularity", 1) or 1))
                        for b in self._space_backends]
        self._configure_compact()

    @property
    def _pieces(self) -> SortedDict:
        """Backend allocations, ``ptr -> (size, space)``, with what batch kernels
        did to them (``_log_pieces``) played when first read."""
        if self._unplayed:
            self._play_unplayed()
        return self._piece_map

    def _play_unplayed(self) -> None:
        """Play the logs ``_log_pieces`` kept, in order, on the map. No garbage
        collection runs meanwhile, also where the map is read without the
        lock: a finalizer it ran could call the allocator and read the map
        half played (the queue is already empty)."""
        with gc_paused():
            self._play_queue()

    def _play_queue(self) -> None:
        unplayed, self._unplayed = self._unplayed, []
        pieces = self._piece_map
        gave_back = False
        for space, bases, sizes in unplayed:
            if min(sizes) < 0:
                gave_back = True
                bad = self._play_on_map(pieces, space, bases, sizes)
                if bad >= 0:
                    raise RuntimeError(f"the kernel's log entry ({bases[bad]:#x}, {sizes[bad]}) "
                                       "does not fit the record of backend pieces")
            elif len(bases) < 8:  # update() would sort the whole map again
                for ptr, size in zip(bases, sizes):
                    pieces[ptr] = (size, space)
            else:
                pieces.update(zip(bases, zip(sizes, itertools.repeat(space))))
        if gave_back:
            self._pieces_played_back()

    def _log_pieces(self, space: int, bases: list[int], sizes: list[int]) -> None:
        """Play a kernel's log for ``space`` (pieces placed, ``size > 0``, and page
        runs given back, ``size < 0``, in order) on ``_pieces`` when it is next
        read: a batch that nobody inspects afterwards never pays for it. At most
        ``_MAX_UNPLAYED`` logs wait."""
        if len(self._unplayed) >= _MAX_UNPLAYED:
            self._play_unplayed()
        self._unplayed.append((space, bases, sizes))

    def _pieces_played_back(self) -> None:
        """Called once ``_pieces`` has played a log that gave pages back."""

    @property
    def small_backend(self):
        """The backend of the small space (None: one space for every size)."""
        return self._space_backends[SMALL_SPACE]

    # ------------------------------------------------------------------ public API
    def deallocate_raw(self, ptr: int | None) -> None:
        """Free an address from ``allocate_raw`` (0 or None is a no-op); gives
        the free tail back when it has reached ``release_threshold``.

        Raises
        ------
        InvalidPointerError
            Double free, interior pointer or unknown pointer; state unchanged.
        """
        with self._lock:  # the give-back decision belongs to this free, atomically
            super().deallocate_raw(ptr)
            if self._release_pending():
                if self._giving_back:
                    self._deferred_release = True
                else:
                    self._release_due()

    def empty_cache(self) -> int:
        """Give every whole free backend piece at the end of a region back
        (on a backend that remaps: every whole free page); returns the bytes
        released."""
        with self._lock, self._give_back():
            return self._release_all_tails() + self._punch(self._punchable())

    # A free can re-enter while pages go back: a finalizer that a garbage
    # collection inside the backend's ``free`` runs. It frees its chunk (which
    # only grows the free runs being given back), but the give-back it may make
    # due waits until the one in progress has finished: it would cut regions
    # that the one in progress has planned to cut.
    _giving_back = 0
    _deferred_release = False

    @contextlib.contextmanager
    def _give_back(self):
        self._giving_back += 1
        try:
            yield
        finally:
            try:
                # Several deferred frees may each have made a tail due (the
                # state records one): look at every region, until no free
                # re-entered meanwhile.
                while self._giving_back == 1 and self._deferred_release:
                    self._deferred_release = False
                    self._take_release_due()
                    for base, _ in self._region_list():
                        if self._tail_is_due(base):
                            self._release_tail(base)
            finally:
                self._giving_back -= 1

    # ------------------------------------------------------------------ growth
    def _space_for(self, rounded: int) -> int:
        return SMALL_SPACE if rounded < self.small_size else LARGE_SPACE

    def _remaps(self, space: int) -> bool:
        return self._remapping[space]

    def _quantum(self, space: int) -> int:
        """What growth and giving back are counted in: whole pages that are
        whole backend granules too."""
        return self._quanta[space]

    def _extend(self, alignment: int, rounded: int) -> bool:
        """Grow the request's space by the whole pages ``rounded`` bytes (plus
        alignment slack) lack beyond the free tail of its highest region, or
        fewer by filling a hole next to free bytes."""
        space = self._space_for(rounded)
        need = rounded + max(alignment, MIN_ALLOCATION) - MIN_ALLOCATION
        end, tail = self._top_tail(space) if self._coalesce_regions else (0, 0)
        if end and self._remaps(space):
            return self._grow_in_place(space, need, end, tail)
        for shortfall in (need - tail, need) if tail else (need,):
            exact = _round_up(max(shortfall, 1), self.page_size)
            got = None
            for nbytes in self._growth_sizes(exact, self.page_size):
                got = self._get_piece(nbytes, space)
                if got is not None:
                    break
            if got is None:
                return False
            ptr, received = got
            if tail and ptr != end and received < need:
                # Not adjacent after all: the shortfall alone cannot hold the request.
                self._put_piece(ptr)
                continue
            self._add_region(ptr, received, space)
            return True
        return False

    def _growth_sizes(self, exact: int, quantum: int):
        """The sizes to ask for when ``exact`` bytes are lacking: with headroom
        (``GROWTH_PAGES`` pages or 1/``GROWTH_FRACTION`` of the pool, whichever
        is less, within the limit), then, if the backend cannot give that,
        exactly what is lacking."""
        pool = self._usage()[1]
        extra = min(GROWTH_PAGES * quantum, pool // GROWTH_FRACTION, self.memory_limit - pool)
        return dict.fromkeys((max(exact, extra // quantum * quantum), exact))

    def _grow_in_place(self, space: int, need: int, end: int, tail: int) -> bool:
        """Grow a space that remaps by mapping pages exactly where they serve
        ``need`` bytes: after its highest region, or into a hole (``_fills``),
        fewest new pages first, then the lowest address; the next choice is
        tried when the backend cannot map one (its range may end)."""
        quantum = self._quantum(space)
        top = _round_up(max(need - tail, 1), quantum)
        choices = [(top, end)] + (self._fills(space, need, quantum) if self._punched else [])
        for nbytes, ptr in sorted(choices):
            at_top = ptr == end  # nothing lies above the top: no region to join
            for size in self._growth_sizes(nbytes, quantum) if at_top else (nbytes,):
                if self._fill(ptr, size, space, join=not at_top):
                    return True
        return False

    def _fills(self, space: int, need: int, quantum: int) -> list[tuple[int, int]]:
        """``(bytes, address)`` of every hole fill that serves ``need`` bytes:
        one extending the free tail of the region below the hole, one the free
        head of the region above, and one filling the hole and joining both."""
        out = []
        regions = self._space_regions(space)
        for (a_base, a_size, a_tail, _), (b_base, _, _, b_head) in zip(regions, regions[1:]):
            a_end = a_base + a_size
            hole = b_base - a_end
            if hole <= 0:
                continue
            below = a_end - a_tail
            above = b_head - b_base
            left = _round_up(max(need - below, 1), quantum)
            right = _round_up(max(need - above, 1), quantum)
            if left < hole:
                out.append((left, a_end))
            if right < hole:
                out.append((right, b_base - right))
            if below + hole + above >= need:
                out.append((hole, a_end))
        return out

    def _fill(self, ptr: int, nbytes: int, space: int, join: bool) -> bool:
        """Map ``nbytes`` at ``ptr`` (past the top or inside a hole) and merge
        it with the region below and, with ``join``, the one above."""
        if self._get_piece(nbytes, space, at=ptr) is None:
            return False
        self._add_region(ptr, nbytes, space)
        if join and self._join_at(ptr + nbytes, space) and self.release_threshold > 0:
            # The region above may bring a free tail with it: once the request is
            # placed, the release rule decides on it as after a free.
            self._mark_release_due(ptr)
        return True

    def _get_piece(self, nbytes: int, space: int, at: int | None = None
                   ) -> tuple[int, int] | None:
        room = self.memory_limit - self._usage()[1]
        if nbytes > room:
            return None
        backend = self._space_backends[space]
        if at is None:
            got = backend.alloc(nbytes, MIN_ALLOCATION)
        else:
            mapped = backend.alloc_at(at, nbytes)
            got = None if mapped is None else (at, mapped)
        if got is None:
            self._backend_refused = True
            return None
        ptr, received = got
        if ptr <= 0 or ptr % MIN_ALLOCATION or received % MIN_ALLOCATION or received < nbytes:
            backend.free(ptr, received)
            raise RuntimeError(
                f"backend returned region ({ptr:#x}, {received}): must be 256-byte aligned "
                f"and a multiple of 256 of at least {nbytes} bytes")
        if self._clashes(ptr, received, space):
            backend.free(ptr, received)
            raise RuntimeError(f"backend returned region ({ptr:#x}, {received}), which overlaps "
                               "memory of the other space: the two backends share addresses")
        if received > room:
            # The backend rounded past the limit: the limit wins.
            backend.free(ptr, received)
            return None
        self._pieces[ptr] = (received, space)
        lo, hi = self._hulls[space]
        self._hulls[space] = (min(lo, ptr), max(hi, ptr + received))
        return ptr, received

    def _clashes(self, ptr: int, size: int, space: int) -> bool:
        """True if ``[ptr, ptr+size)`` overlaps a piece already held."""
        lo, hi = self._hulls[1 - space]
        if ptr + size <= lo or ptr >= hi:
            return False  # the usual case: the spaces' ranges lie apart
        i = self._pieces.bisect_left(ptr)
        below = self._pieces.peekitem(i - 1) if i > 0 else None
        return (i < len(self._pieces) and self._pieces.peekitem(i)[0] < ptr + size) or (
            below is not None and below[0] + below[1][0] > ptr)

    def _put_piece(self, ptr: int) -> None:
        size, space = self._pieces.pop(ptr)
        self._space_backends[space].free(ptr, size)

    # ------------------------------------------------------------------ giving back
    @abc.abstractmethod
    def _release_pending(self) -> bool:
        raise NotImplementedError

    def _release_due(self) -> None:
        base = self._take_release_due()
        if base is not None and self._tail_is_due(base):
            self._release_tail(base)

    def _tail_is_due(self, base: int) -> bool:
        """The release rule: the region's free tail has reached the threshold
        and covers the start of its newest backend piece."""
        end = base + dict(self._region_list())[base]
        start = self._tail_start(base, end)
        newest = self._pieces.peekitem(self._pieces.bisect_left(end) - 1)[0]
        return 0 < self.release_threshold <= end - start and start <= newest

    def _allocate_slow(self, n: int, alignment: int, freed_before: int,
                       extended: bool = False) -> int:
        try:
            return super()._allocate_slow(n, alignment, freed_before, extended)
        finally:
            if self._release_pending():  # set by a hole fill that joined regions
                self._release_due()

    def _releasable_pieces(self, base: int, size: int) -> list[int]:
        """Starts of the backend pieces inside the free tail of the region at ``base``."""
        end = base + size
        return list(self._pieces.irange(self._tail_start(base, end), end - 1))

    def _release_tail(self, base: int) -> int:
        """Give back the backend pieces inside the free tail of the region at ``base``."""
        end = base + dict(self._region_list())[base]
        released = self._releasable_pieces(base, end - base)
        if not released:
            return 0
        new_end = released[0]
        before = self._pieces.bisect_left(new_end) - 1
        last_piece = self._pieces.peekitem(before)[0] if before >= 0 else base
        self._cut_region(base, new_end, last_piece)
        for ptr in released:
            self._put_piece(ptr)
        return end - new_end

    def _release_all_tails(self) -> int:
        # Spaces that remap give back more, page by page (``_punch``).
        if all(self._remaps(sp) for sp in (LARGE_SPACE, SMALL_SPACE)):
            return 0
        return sum(self._release_tail(base) for base, _ in self._region_list()
                   if not self._remaps(self._space_of(base)))

    def _punchable(self) -> list[tuple[int, int, int, int]]:
        """``(space, region base, lo, hi)`` of every run of whole free pages
        in the spaces that remap."""
        ranges: list[tuple[int, int, int, int]] = []
        spaces = [sp for sp in (LARGE_SPACE, SMALL_SPACE) if self._remaps(sp)]
        # A whole free page needs a free chunk of at least a page: usually none
        # on the out-of-memory path, and this saves the pass over every chunk.
        if not spaces or self._largest_free() < min(self._quantum(sp) for sp in spaces):
            return ranges
        for sp in spaces:
            ranges += [(sp, base, lo, hi)
                       for base, lo, hi in self._page_runs(sp, self._quantum(sp))]
        return ranges

    def _punch(self, ranges: list[tuple[int, int, int, int]]) -> int:
        """Give the page runs from ``_punchable`` back; returns the bytes."""
        # Highest first: a region keeps its base while its upper parts are cut off.
        for space, base, lo, hi in sorted(ranges, key=lambda r: r[2], reverse=True):
            self._cut_pieces(lo, hi)
            below = self._pieces.bisect_left(lo) - 1
            left_last = self._pieces.peekitem(below)[0] if below >= 0 else base
            self._punch_region(base, lo, hi, left_last)
            self._space_backends[space].free(lo, hi - lo)
            self._punched = True
        return sum(hi - lo for _, _, lo, hi in ranges)

    def _cut_pieces(self, lo: int, hi: int) -> None:
        """Drop ``[lo, hi)`` (inside one region) from the record of backend
        pieces, keeping the outside parts of the pieces it cuts."""
        pieces = self._pieces
        holding = pieces.bisect_right(lo) - 1
        space = pieces.peekitem(holding)[1][1] if holding >= 0 else -1  # the region's space
        if self._play_on_pieces(space, [lo], [lo - hi]) >= 0:
            raise RuntimeError(f"[{lo:#x}, {hi:#x}) is not inside the backend pieces")

    def _play_on_pieces(self, space: int, bases: Sequence[int], sizes: Sequence[int]) -> int:
        """``play_log_on_map`` on the record of backend pieces: pieces placed
        and spans given back, all in ``space``; returns its answer."""
        return self._play_on_map(self._pieces, space, bases, sizes)

    @staticmethod
    def _play_on_map(pieces: SortedDict, space: int, bases: Sequence[int],
                     sizes: Sequence[int]) -> int:
        def value_of(start: int, end: int, old: tuple[int, int] | None) -> tuple[int, int]:
            return end - start, space if old is None else old[1]

        return play_log_on_map(pieces, bases, sizes, _piece_end, value_of)

    def _release_free_regions(self, rounded: int) -> bool:
        # BFC's garbage collection of whole free regions, generalised to free
        # tails and, where the backend remaps, to every whole free page; as
        # BFC's: nothing goes back when that cannot make room for ``rounded``
        # (with holes this check is necessary, not sufficient: a retry that
        # still fails leaves the pages given back).
        in_use, pool = self._usage()
        if rounded > self.memory_limit - in_use:
            return False  # no room even with every free byte given back: skip the passes
        tails = 0
        if not all(self._remaps(sp) for sp in (LARGE_SPACE, SMALL_SPACE)):
            tails = sum(self._pieces[p][0] for base, size in self._region_list()
                        if not self._remaps(self._space_of(base))
                        for p in self._releasable_pieces(base, size))
        ranges = self._punchable()
        releasable = tails + sum(hi - lo for _, _, lo, hi in ranges)
        # A hole fill can also use the free bytes that stay mapped next to the
        # hole, but never more than the limit leaves beside what is in use.
        usable = self.memory_limit - (in_use if ranges else pool - releasable)
        if releasable == 0 or rounded > usable:
            return False
        with self._give_back():
            return self._release_all_tails() + self._punch(ranges) > 0

    # ------------------------------------------------------------------ store hooks
    @abc.abstractmethod
    def _page_runs(self, space: int, quantum: int) -> list[Sequence[int]]:
        """``(region base, lo, hi)`` of every run of whole ``quantum``-byte pages
        inside the free chunks of ``space`` that could go back to the backend
        (free, binned and not waiting on a timing count), in any order (rows:
        tuples or lists)."""
        raise NotImplementedError

    @abc.abstractmethod
    def _configure_compact(self) -> None:
        raise NotImplementedError

    @abc.abstractmethod
    def _tail_start(self, base: int, end: int) -> int:
        """Where the region's releasable free tail starts (``end`` if none)."""
        raise NotImplementedError

    @abc.abstractmethod
    def _top_tail(self, space: int) -> tuple[int, int]:
        """(end, free tail bytes) of the space's highest region; (0, 0) without one."""
        raise NotImplementedError

    @abc.abstractmethod
    def _space_regions(self, space: int) -> list[Sequence[int]]:
        """``[(base, size, tail_start, head_end), ...]`` of the space's regions in
        address order: where each one's free tail starts (``_tail_start``) and
        where its free head ends (its base if none) (rows: tuples or lists)."""
        raise NotImplementedError

    @abc.abstractmethod
    def _punch_region(self, base: int, lo: int, hi: int, left_last_piece: int) -> None:
        """Cut ``[lo, hi)`` (inside one free chunk) out of the region at ``base``."""
        raise NotImplementedError

    @abc.abstractmethod
    def _join_at(self, seam: int, space: int) -> bool:
        """Join the space's regions that end and start at ``seam``, if both
        exist; True if they did."""
        raise NotImplementedError

    @abc.abstractmethod
    def _mark_release_due(self, ptr: int) -> None:
        """Let the release rule decide on the region holding ``ptr`` once the
        operation under way is done."""
        raise NotImplementedError

    @abc.abstractmethod
    def _space_of(self, base: int) -> int:
        raise NotImplementedError

    @abc.abstractmethod
    def _cut_region(self, base: int, new_end: int, last_piece: int) -> None:
        raise NotImplementedError

    @abc.abstractmethod
    def _take_release_due(self) -> int | None:
        raise NotImplementedError
