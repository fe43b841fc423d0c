"""What both compact implementations share: spaces, exact growth, giving back.

The compact policy keeps BFC's chunk machinery (best fit, coalescing, the
``BFCBase`` out-of-memory path) and changes four things:

* it always splits a chunk down to the rounded request;
* requests below ``small_size`` live in a space of their own (a second
  backend, ``small_backend``), so short-lived small blocks do not pin holes
  between large ones;
* it grows a space by the pages a request is short of, on backends whose
  regions are adjacent (``supports_coalescing``: ``CudaVirtualSubAllocator``,
  ``VirtualSubAllocator(contiguous=True)``, ``HostSubAllocator(contiguous=True)``),
  so each space is one coalescible range instead of islands of doubling size;
* it gives whole backend pieces at the end of a region back once its free
  tail reaches ``release_threshold`` bytes, and all free tails (whole free
  regions included) on ``empty_cache()`` or before raising an out-of-memory
  error.

Subclasses (``CompactAllocator``, ``ReferenceCompactAllocator``) supply the
store-specific hooks at the end of the class.
"""

from __future__ import annotations

from sortedcontainers import SortedDict

from ..policies.compact import LARGE_SPACE, SMALL_SPACE
from ._bfc_base import MIN_ALLOCATION
from ._options import resolve_compact_options


def _round_up(n: int, quantum: int) -> int:
    return -(-n // quantum) * quantum


class CompactGrowth:
    """Mixin placed before a BFC implementation (``BFCBase`` subclass) in the bases."""

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
        # Split whenever the remainder is a chunk of its own.
        self._max_internal_fragmentation = MIN_ALLOCATION
        # Backend allocations: ptr -> (size, space); and the span each space has used.
        self._pieces: SortedDict = SortedDict()
        self._hulls = [(1 << 63, 0), (1 << 63, 0)]
        self._configure_compact()

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
                self._release_due()

    def empty_cache(self) -> int:
        """Give every whole free backend piece at the end of a region back;
        returns the bytes released."""
        with self._lock:
            return self._release_all_tails()

    # ------------------------------------------------------------------ growth
    def _space_for(self, rounded: int) -> int:
        return SMALL_SPACE if rounded < self.small_size else LARGE_SPACE

    def _extend(self, alignment: int, rounded: int) -> bool:
        """Grow the request's space by the whole pages ``rounded`` bytes (plus
        alignment slack) lack beyond the free tail of its highest region."""
        space = self._space_for(rounded)
        need = rounded + max(alignment, MIN_ALLOCATION) - MIN_ALLOCATION
        end, tail = self._top_tail(space) if self._coalesce_regions else (0, 0)
        for shortfall in (need - tail, need) if tail else (need,):
            nbytes = _round_up(max(shortfall, 1), self.page_size)
            got = self._get_piece(nbytes, space)
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

    def _get_piece(self, nbytes: int, space: int) -> tuple[int, int] | None:
        room = self.memory_limit - self._usage()[1]
        if nbytes > room:
            return None
        backend = self._space_backends[space]
        got = backend.alloc(nbytes, MIN_ALLOCATION)
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
    def _release_pending(self) -> bool:
        raise NotImplementedError

    def _release_due(self) -> None:
        base = self._take_release_due()
        if base is not None:
            self._release_tail(base)

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
        return sum(self._release_tail(base) for base, _ in self._region_list())

    def _release_free_regions(self, rounded: int) -> bool:
        # BFC's garbage collection of whole free regions, generalised to free tails,
        # and as BFC's: nothing goes back when that cannot make room for ``rounded``.
        releasable = sum(self._pieces[p][0] for base, size in self._region_list()
                         for p in self._releasable_pieces(base, size))
        if releasable == 0 or rounded > self.memory_limit - self._usage()[1] + releasable:
            return False
        return self._release_all_tails() > 0

    # ------------------------------------------------------------------ store hooks
    def _configure_compact(self) -> None:
        raise NotImplementedError

    def _tail_start(self, base: int, end: int) -> int:
        """Where the region's releasable free tail starts (``end`` if none)."""
        raise NotImplementedError

    def _top_tail(self, space: int) -> tuple[int, int]:
        """(end, free tail bytes) of the space's highest region; (0, 0) without one."""
        raise NotImplementedError

    def _space_of(self, base: int) -> int:
        raise NotImplementedError

    def _cut_region(self, base: int, new_end: int, last_piece: int) -> None:
        raise NotImplementedError

    def _take_release_due(self) -> int | None:
        raise NotImplementedError
