"""The sub-allocator interface: where allocators get their regions from."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import NamedTuple

from sortedcontainers import SortedDict

from .ranges import play_log_on_ends

__all__ = ["SubAllocator", "AddressLease"]


class AddressLease(NamedTuple):
    """Where a backend's next regions would go, for an allocator that places
    them itself (a batch kernel) and records them afterwards
    (``SubAllocator.record_leased``).

    An ``alloc(nbytes, alignment)`` would return, while nothing else changes the
    backend: ``received = ceil(nbytes / granularity) * granularity`` bytes at
    ``ptr = align_up(top + gap, max(alignment, self.alignment))``, then ``top``
    moves to ``ptr + received``; it fails when ``received > room``. A ``free``
    moves ``top`` back to the end of the highest region still mapped, or to
    ``floor`` if none is, and gives its bytes back to ``room``.
    """

    top: int
    gap: int
    alignment: int
    granularity: int
    room: int
    floor: int


class SubAllocator(abc.ABC):
    """Source of large memory regions for a pooling allocator (TF's ``SubAllocator``).

    Subclasses implement ``_alloc`` / ``_free``; the public methods validate
    arguments and keep counters so every backend reports the same statistics.

    Attributes
    ----------
    supports_coalescing : bool
        True when consecutive regions may be adjacent in the address space and
        the allocator may treat them as one (contiguous virtual memory).
    supports_remap : bool
        True when the backend can also map memory at a chosen address of its
        range (``alloc_at``) and give back any whole granules of what it
        mapped (``free`` of part of an allocation): pages in the middle of a
        region can go back and be mapped again elsewhere.
    host_accessible : bool
        True when addresses are real host memory this process may read and write.
    device_memory : bool
        True when GPU work can use the memory (the CUDA backends): a block
        freed by the host may still be in use by queued device work.
    capacity : int or None
        Bytes this backend can hold at once, if bounded.
    """

    supports_coalescing: bool = False
    supports_remap: bool = False
    host_accessible: bool = False
    device_memory: bool = False
    capacity: int | None = None

    def __init__(self) -> None:
        self.num_allocs = 0
        self.num_frees = 0
        self.num_failed_allocs = 0
        self.bytes_held = 0
        self.peak_bytes_held = 0

    def alloc(self, nbytes: int, alignment: int = 256) -> tuple[int, int] | None:
        """Allocate a region of at least ``nbytes`` aligned to ``alignment``.

        Returns
        -------
        (ptr, received) or None
            The base address and the size actually granted (>= ``nbytes``), or
            None when the backend cannot provide the memory.
        """
        if nbytes <= 0:
            raise ValueError(f"backend alloc size must be > 0, got {nbytes}")
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"backend alignment must be a power of two, got {alignment}")
        result = self._alloc(int(nbytes), int(alignment))
        if result is None:
            self.num_failed_allocs += 1
            return None
        ptr, received = result
        self.num_allocs += 1
        self.bytes_held += received
        self.peak_bytes_held = max(self.peak_bytes_held, self.bytes_held)
        return ptr, received

    def alloc_at(self, ptr: int, nbytes: int) -> int | None:
        """Map ``nbytes`` at exactly ``ptr``, where nothing is mapped now
        (``supports_remap`` backends only; both multiples of ``granularity``).

        Returns
        -------
        int or None
            The bytes mapped (``nbytes``), or None when the backend cannot
            provide the memory (out of memory, or past the end of its range).

        Raises
        ------
        ValueError
            The range is misaligned, starts below the backend's range, or
            overlaps mapped memory.
        """
        if not self.supports_remap:
            raise NotImplementedError(f"{type(self).__name__} cannot map at a chosen address")
        if nbytes <= 0:
            raise ValueError(f"backend alloc size must be > 0, got {nbytes}")
        if self.capacity is not None and self.bytes_held + nbytes > self.capacity:
            self.num_failed_allocs += 1
            return None
        if not self._alloc_at(int(ptr), int(nbytes)):
            self.num_failed_allocs += 1
            return None
        self.num_allocs += 1
        self.bytes_held += nbytes
        self.peak_bytes_held = max(self.peak_bytes_held, self.bytes_held)
        return int(nbytes)

    def free(self, ptr: int, nbytes: int) -> None:
        """Give back ``nbytes`` starting at ``ptr``: one or more whole earlier
        allocations, or on a ``supports_remap`` backend any whole granules of
        mapped memory."""
        self._free(int(ptr), int(nbytes))
        self.num_frees += 1
        self.bytes_held -= nbytes

    def address_space(self) -> tuple[int, int | None]:
        """``(start, length)`` of the addresses ``alloc_at`` may map (``supports_remap``
        backends; ``length`` None: unbounded), for callers that lay out their own
        reservations in it (the caching policy's expandable segments)."""
        raise NotImplementedError(f"{type(self).__name__} cannot map at a chosen address")

    def total_memory(self) -> int | None:
        """Total bytes this backend could ever provide (``capacity``), None if unbounded."""
        return self.capacity

    def address_lease(self) -> AddressLease | None:
        """Where the next ``alloc`` calls would place their regions, if that is
        plain arithmetic (``AddressLease``); None (the default) otherwise.

        Whoever takes a lease makes no other call to this backend until it has
        given what it placed to ``record_leased``.
        """
        return None

    def record_leased(self, bases: Sequence[int], sizes: Sequence[int]) -> None:
        """Record what was done under ``address_lease``, in the order done: a
        positive size records a region placed, as if ``alloc`` (or ``alloc_at``)
        had returned ``(base, size)``; a negative one gives back one whole
        region placed before, as ``free(base, -size)`` would, or on a backend
        that remaps (``supports_remap``) any whole granules of mapped memory,
        as ``free`` may there.

        Raises
        ------
        ValueError
            A size of 0, or memory given back that is not one whole region
            held (on a backend that remaps: not whole granules inside mapped
            memory, and then also a region placed over mapped memory or off
            the granules); nothing is recorded.
        """
        raise NotImplementedError(f"{type(self).__name__} gives no address lease")

    @abc.abstractmethod
    def _alloc(self, nbytes: int, alignment: int) -> tuple[int, int] | None: ...

    @abc.abstractmethod
    def _free(self, ptr: int, nbytes: int) -> None: ...

    def _alloc_at(self, ptr: int, nbytes: int) -> bool:
        raise NotImplementedError


class _RangeMap:
    """``start -> end`` of the ranges mapped in one reserved address range.

    Adjacent ranges stay separate entries so that a backend without partial
    frees can check that a free covers whole earlier allocations.
    """

    def __init__(self) -> None:
        self._ranges: SortedDict = SortedDict()
        self._pending: list[tuple[Sequence[int], Sequence[int]]] = []

    @property
    def ranges(self) -> SortedDict:
        """The map, with the ranges ``add_later`` gave folded in."""
        ranges = self._ranges
        if self._pending:
            pending, self._pending = self._pending, []
            for starts, ends in pending:
                if len(starts) < 8:  # update() would sort the whole map again
                    for start, end in zip(starts, ends):
                        ranges[start] = end
                else:
                    ranges.update(zip(starts, ends))
        return ranges

    def add_later(self, starts: Sequence[int], ends: Sequence[int]) -> None:
        """``add`` each range, when the map is next read (a batch of regions
        recorded at once costs nothing until someone looks)."""
        self._pending.append((starts, ends))

    def top(self, default: int) -> int:
        """Where the highest mapped range ends (``default`` if none)."""
        ranges = self.ranges
        return ranges.peekitem(-1)[1] if ranges else default

    def overlaps(self, ptr: int, end: int) -> bool:
        ranges = self.ranges
        i = ranges.bisect_left(end) - 1
        return i >= 0 and ranges.peekitem(i)[1] > ptr

    def add(self, ptr: int, end: int) -> None:
        self.ranges[ptr] = end

    def covers(self, ptr: int, end: int) -> bool:
        """True if ``[ptr, end)`` is mapped without a gap."""
        i = self.ranges.bisect_right(ptr) - 1
        pos = ptr
        if i < 0:
            return False
        for start in self.ranges.islice(i):
            if start > pos or pos >= end:
                break
            pos = max(pos, self.ranges[start])
        return pos >= end

    def remove(self, ptr: int, end: int, partial: bool) -> None:
        """Unmap ``[ptr, end)``: a run of whole ranges, or with ``partial``
        any mapped span (ranges it cuts keep their outside parts).

        Raises ValueError, changing nothing, when the span is not mapped so.
        """
        if partial:
            if play_log_on_ends(self.ranges, [ptr], [ptr - end]) >= 0:
                raise ValueError(f"free({ptr:#x}, {end - ptr}): not inside mapped memory")
            return
        ranges = self.ranges
        pos, run = ptr, []
        while pos < end:
            if pos not in ranges:
                raise ValueError(
                    f"free({ptr:#x}, {end - ptr}): {pos:#x} is not the start of a mapped range")
            run.append(pos)
            if ranges[pos] <= pos:  # an empty range would never end the walk
                raise ValueError(f"free({ptr:#x}, {end - ptr}): empty mapped range at {pos:#x}")
            pos = ranges[pos]
        if pos != end:
            raise ValueError(f"free({ptr:#x}, {end - ptr}): size does not match mapped ranges")
        for start in run:
            del ranges[start]
