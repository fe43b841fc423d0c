"""``ReferenceCompactAllocator``: the compact policy in plain Python (the test oracle).

``ReferenceBFCAllocator``'s chunk machinery under the same ``CompactGrowth``
orchestration as ``CompactAllocator``; only the space lookup and giving a
free tail back are written here again, over ``_Chunk`` objects instead of
table rows.
"""

from __future__ import annotations

from ..allocators.compact_base import CompactGrowth
from .bfc import ReferenceBFCAllocator, _Region

__all__ = ["ReferenceCompactAllocator"]


class ReferenceCompactAllocator(CompactGrowth, ReferenceBFCAllocator):
    """Plain-Python compact allocator with ``CompactAllocator``'s exact behaviour."""

    def __init__(self, backend, memory_limit=None, page_size=None, release_threshold=None,
                 small_size=None, small_backend=None, name=None) -> None:
        self._due: int | None = None
        super().__init__(backend, memory_limit, page_size, release_threshold, small_size,
                         small_backend, name)

    def _configure_compact(self) -> None:
        pass  # the split rule reads _max_internal_fragmentation directly

    def _candidates(self, rounded: int):
        # One ordered set per space: its best fit is what BFC's size bins give.
        return self._bins[self._space_for(rounded)].irange_key(min_key=(rounded, -1))

    def _last_chunk(self, base: int):
        c = self._region_map[base].first
        while c.next is not None:
            c = c.next
        return c

    @staticmethod
    def _releasable(c) -> bool:
        # Free, binned and not waiting on a timing count (a stream may still use it).
        return not c.in_use and c.bin != -1 and c.freed_at_count == 0

    def _tail_start(self, base: int, end: int) -> int:
        c = self._last_chunk(base)
        return c.ptr if self._releasable(c) else end

    def _top_tail(self, space: int) -> tuple[int, int]:
        mine = [(b, r) for b, r in self._region_map.items() if r.pool == space]
        if not mine:
            return 0, 0
        base, region = max(mine, key=lambda kv: kv[0] + kv[1].size)
        end = base + region.size
        return end, end - self._tail_start(base, end)

    def _space_of(self, base: int) -> int:
        return self._region_map[base].pool

    def _head_end(self, base: int) -> int:
        c = self._region_map[base].first
        return c.ptr + c.size if self._releasable(c) else base

    def _page_runs(self, space: int, quantum: int) -> list[tuple[int, int, int]]:
        runs = []
        for base, region in self._region_map.items():
            if region.pool != space:
                continue
            c = region.first
            while c is not None:
                lo = -(-c.ptr // quantum) * quantum
                hi = (c.ptr + c.size) // quantum * quantum
                if self._releasable(c) and hi > lo:
                    runs.append((base, lo, hi))
                c = c.next
        return runs

    def _space_regions(self, space: int) -> list[tuple[int, int, int, int]]:
        return [(b, r.size, self._tail_start(b, b + r.size), self._head_end(b))
                for b, r in self._region_map.items() if r.pool == space]

    def _punch_region(self, base: int, lo: int, hi: int, left_last_piece: int) -> None:
        region = self._region_map[base]
        end = base + region.size
        c = region.first
        while c.ptr + c.size <= lo:
            c = c.next
        self._remove(c)
        if c.ptr < lo:
            m = self._split(c, lo - c.ptr, False)
            self._insert(c)
            c = m
        if c.ptr + c.size > hi:
            self._split(c, hi - lo, True)
        if hi < end:  # what lies above the hole becomes a region of its own
            upper = _Region(hi, end - hi, region.pool)
            upper.first, c.next.prev, c.next = c.next, None, None
            for d in upper.chunks():
                d.region = upper
            region.size = hi - base
            self._region_map[hi] = upper
        c.alive = False
        if c is region.first:
            del self._region_map[base]
        else:
            c.prev.next = None
            region.size -= hi - lo
        self._c["pool_bytes"] -= hi - lo

    def _join_at(self, seam: int, space: int) -> bool:
        upper = self._region_map.get(seam)
        i = self._region_map.bisect_left(seam)
        if upper is None or upper.pool != space or i == 0:
            return False
        lower = self._region_map.peekitem(i - 1)[1]
        if lower.base + lower.size != seam or lower.pool != space:
            return False
        del self._region_map[seam]
        last = self._last_chunk(lower.base)
        first = upper.first
        last.next, first.prev = first, last
        for d in upper.chunks():
            d.region = lower
        lower.size += upper.size
        if not first.in_use and first.bin != -1:
            self._remove(first)
            self._insert(self._coalesce(first, False))
        return True

    def _mark_release_due(self, ptr: int) -> None:
        self._due = self._region_map.peekitem(self._region_map.bisect_right(ptr) - 1)[0]

    def _cut_region(self, base: int, new_end: int, last_piece: int) -> None:
        if new_end == base:
            self._remove_region(base)
            return
        region = self._region_map[base]
        c = self._last_chunk(base)
        cut = base + region.size - new_end
        self._remove(c)
        if new_end == c.ptr:
            c.prev.next = None
            c.alive = False
        else:
            c.size -= cut
            self._insert(c)
        region.size -= cut
        self._c["pool_bytes"] -= cut

    def _deallocate_chunk(self, ptr: int, count: int) -> bool:
        c = self._in_use.get(ptr)
        if not super()._deallocate_chunk(ptr, count):
            return False
        if count == 0 and self._tail_is_due(c.region.base):
            self._due = c.region.base
        return True

    def _release_pending(self) -> bool:
        return self._due is not None

    def _take_release_due(self) -> int | None:
        base, self._due = self._due, None
        return base if base in self._region_map else None
