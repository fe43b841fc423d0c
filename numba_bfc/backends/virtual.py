"""A simulated address space: addresses without memory, for tests and replay."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .base import AddressLease, SubAllocator, _RangeMap
from .ranges import play_log_on_ends

__all__ = ["VirtualSubAllocator"]

# Simulated addresses start high and away from 0 so that a bug returning a
# small integer, or 0 (null), can never look like a valid pointer.
_BASE_ADDRESS = 1 << 40
# Non-contiguous mode leaves a guard gap between regions, like separate
# cudaMalloc calls, so that no two regions are ever adjacent by accident.
_GUARD = 2 << 20
# A lease is arithmetic for int64 kernels: no lease above this top (or room).
_LEASE_TOP_LIMIT = 1 << 62


def _align_up(x: int, a: int) -> int:
    return (x + a - 1) & ~(a - 1)


class VirtualSubAllocator(SubAllocator):
    """Simulated address space: hands out address ranges, no memory behind them.

    Parameters
    ----------
    capacity : int, optional
        Most bytes held at once; further ``alloc`` calls fail (return None).
    contiguous : bool
        If True, each region starts where the highest live one ends, like pages
        mapped into one reserved CUDA virtual range; ``supports_coalescing``
        and ``supports_remap`` are True (``alloc_at`` maps at a chosen free
        address, ``free`` may give back any whole granules). If False, regions
        are separated by a guard gap.
    granularity : int
        Granted sizes are rounded up to a multiple of this (e.g. 2 MiB, as
        ``cuMemGetAllocationGranularity`` would impose).
    fail_if : callable, optional
        Failure injection: ``fail_if(nbytes) -> bool``; True makes that call fail.
    base : int, optional
        Lowest address handed out (default 2**40); give two spaces that one
        allocator uses together different bases, e.g. ``base=2**44``.

    Notes
    -----
    ``fail_next(n)`` makes the next ``n`` calls fail, whatever their size.
    """

    def __init__(
        self,
        capacity: int | None = None,
        contiguous: bool = False,
        granularity: int = 1,
        fail_if: Callable[[int], bool] | None = None,
        base: int = _BASE_ADDRESS,
    ) -> None:
        super().__init__()
        if base <= 0 or base % (1 << 12) or base >= 1 << 60:
            raise ValueError(f"base must be a multiple of 4096 in (0, 2**60), got {base}")
        if capacity is not None and capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        if granularity <= 0:
            raise ValueError(f"granularity must be > 0, got {granularity}")
        self.capacity = capacity
        self.contiguous = bool(contiguous)
        self.supports_coalescing = self.supports_remap = self.contiguous
        self.granularity = int(granularity)
        self.fail_if = fail_if
        self._fail_next = 0
        self._mapped = _RangeMap()
        self._base = int(base)
        self._top = self._base
        self._lease_key: tuple | None = None
        self._lease: AddressLease | None = None

    def fail_next(self, n: int = 1) -> None:
        """Make the next ``n`` ``alloc`` calls fail."""
        self._fail_next += int(n)

    def _alloc(self, nbytes: int, alignment: int) -> tuple[int, int] | None:
        received = -(-nbytes // self.granularity) * self.granularity  # any granularity
        if self._fail_next > 0:
            self._fail_next -= 1
            return None
        if self.fail_if is not None and self.fail_if(nbytes):
            return None
        if self.capacity is not None and self.bytes_held + received > self.capacity:
            return None
        if self.contiguous:
            ptr = _align_up(self._top, alignment)
        else:
            ptr = _align_up(self._top + _GUARD, max(alignment, _GUARD))
        self._mapped.add(ptr, ptr + received)
        self._top = ptr + received
        return ptr, received

    def address_lease(self) -> AddressLease | None:
        """Where ``alloc`` would place the next regions (see ``SubAllocator``);
        None when failures are being injected, or a subclass places them (it
        overrides ``alloc`` or ``_alloc``).
        Computed again only when something it depends on has changed."""
        key = (self._top, self.bytes_held, self.capacity, self.granularity, self.contiguous,
               self.fail_if, self._fail_next)
        if key != self._lease_key:
            self._lease_key = key
            self._lease = self._new_lease()
        return self._lease

    def _new_lease(self) -> AddressLease | None:
        cls = type(self)
        if (cls._alloc is not VirtualSubAllocator._alloc or cls.alloc is not SubAllocator.alloc
                or self.fail_if is not None or self._fail_next > 0
                or self._top > _LEASE_TOP_LIMIT):
            return None
        room = _LEASE_TOP_LIMIT if self.capacity is None else self.capacity - self.bytes_held
        gap, alignment = (0, 1) if self.contiguous else (_GUARD, _GUARD)
        return AddressLease(self._top, gap, alignment, self.granularity,
                            max(0, min(room, _LEASE_TOP_LIMIT)), self._base)

    def record_leased(self, bases: Sequence[int], sizes: Sequence[int]) -> None:
        if not len(bases):
            return
        if type(bases) is not list or type(sizes) is not list:  # arrays: no int64 wrap
            bases, sizes = list(map(int, bases)), list(map(int, sizes))
        least = min(sizes)
        if least == 0:
            raise ValueError("record_leased: sizes must not be 0")
        if least > 0:  # regions placed, nothing given back: filed when next read
            ends = [b + s for b, s in zip(bases, sizes)]
            self._mapped.add_later(bases, ends)
            self._top = max(self._top, max(ends))  # a hole may be filled after the top
            self.num_allocs += len(bases)
            self.bytes_held += sum(sizes)
            self.peak_bytes_held = max(self.peak_bytes_held, self.bytes_held)
            return
        self._record_log(bases, sizes)

    def _record_log(self, bases: Sequence[int], sizes: Sequence[int]) -> None:
        """``record_leased`` of a log that gives memory back: the map of mapped
        ranges changes once the whole log has been checked."""
        if self.contiguous:
            self._map_remap_log(bases, sizes)
        else:
            self._map_region_log(bases, sizes)
        held, peak, made = self.bytes_held, self.peak_bytes_held, 0
        for size in sizes:
            held += size
            if size > 0:
                made += 1
                peak = max(peak, held)
        self._top = self._mapped.top(self._base)
        self.num_allocs += made
        self.num_frees += len(sizes) - made
        self.bytes_held = held
        self.peak_bytes_held = peak

    def _map_region_log(self, bases: Sequence[int], sizes: Sequence[int]) -> None:
        """Regions placed and whole regions given back: a region placed and
        given back within the log never enters the map."""
        ranges = self._mapped.ranges
        placed: dict[int, int] = {}  # start -> end, placed by this log and still held
        unmapped: dict[int, int] = {}  # start -> end, ranges of the map given back
        for base, size in zip(bases, sizes):
            if size > 0:
                placed[base] = base + size
                continue
            end = base - size
            if placed.get(base) == end:
                del placed[base]
            elif ranges.get(base) == end and base not in unmapped:
                unmapped[base] = end
            else:
                raise ValueError(f"record_leased: free({base:#x}, {-size}) is not one whole "
                                 "region held")
        for base in unmapped:
            del ranges[base]
        for base, end in placed.items():
            ranges[base] = end

    def _map_remap_log(self, bases: Sequence[int], sizes: Sequence[int]) -> None:
        """Regions placed and whole granules given back from a contiguous space,
        where a free may cut mapped ranges as ``free`` does: the log is played
        on the mapped ranges it may meet, taken out of the map as lists."""
        ranges = self._mapped.ranges
        granule = self.granularity
        for base, size in zip(bases, sizes):
            if base < self._base or base % granule or size % granule:
                what = "free" if size < 0 else "region"
                raise ValueError(f"record_leased: {what}({base:#x}, {abs(size)}): not whole "
                                 f"granules of {granule} bytes from {self._base:#x} up")
        bad = play_log_on_ends(ranges, bases, sizes)
        if bad >= 0:
            what = ("is not inside mapped memory" if sizes[bad] < 0
                    else "overlaps mapped memory")
            raise ValueError(f"record_leased: {'free' if sizes[bad] < 0 else 'region'}"
                             f"({bases[bad]:#x}, {abs(sizes[bad])}) {what}")

    def _alloc_at(self, ptr: int, nbytes: int) -> bool:
        if ptr < self._base or ptr % self.granularity or nbytes % self.granularity:
            raise ValueError(f"alloc_at({ptr:#x}, {nbytes}): outside the range or not a "
                             f"multiple of the granularity {self.granularity}")
        if self._mapped.overlaps(ptr, ptr + nbytes):
            raise ValueError(f"alloc_at({ptr:#x}, {nbytes}): overlaps mapped memory")
        if self._fail_next > 0:
            self._fail_next -= 1
            return False
        if self.fail_if is not None and self.fail_if(nbytes):
            return False
        self._mapped.add(ptr, ptr + nbytes)
        self._top = max(self._top, ptr + nbytes)
        return True

    def _free(self, ptr: int, nbytes: int) -> None:
        if self.contiguous and (ptr % self.granularity or nbytes % self.granularity):
            raise ValueError(f"free({ptr:#x}, {nbytes}): not whole granules of "
                             f"{self.granularity} bytes")
        self._mapped.remove(ptr, ptr + nbytes, partial=self.contiguous)
        # Let a contiguous space shrink back, as unmapping the tail of a VMM range does.
        self._top = self._mapped.top(self._base)

    def address_space(self) -> tuple[int, int | None]:
        """``(base, None)``: a contiguous space maps anywhere from its base up."""
        if not self.contiguous:
            return super().address_space()
        return self._base, None

    def mapped_ranges(self) -> list[tuple[int, int]]:
        """``[(start, size), ...]`` of every live range, in address order."""
        return [(s, e - s) for s, e in self._mapped.ranges.items()]
