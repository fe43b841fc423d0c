"""``ReferenceBFCAllocator``: TF's BFC in plain, readable Python (the test oracle).

Same constructor, methods and semantics as ``BFCAllocator``, but chunks are
Python objects, each bin is a ``SortedKeyList`` ordered by ``(size, address)``
and pointers map to chunks through a dict. It shares ``BFCBase`` (options,
growth, OOM path, reporting) with the Numba version and re-implements only the
chunk machinery, which is what differential tests compare.
"""

from __future__ import annotations

from collections import deque

import numpy as np
from sortedcontainers import SortedDict, SortedKeyList

from ..allocators import report as _report
from ..allocators.bfc_base import MIN_ALLOCATION, NUM_BINS, BFCBase, round_bytes

__all__ = ["ReferenceBFCAllocator"]


def _bin_for_size(n: int) -> int:
    return _report.bin_of(n, MIN_ALLOCATION, NUM_BINS)


class _Chunk:
    __slots__ = ("ptr", "size", "requested_size", "allocation_id", "freed_at_count",
                 "prev", "next", "bin", "region", "alive")

    def __init__(self, ptr: int, size: int, region) -> None:
        self.ptr = ptr
        self.size = size
        self.requested_size = 0
        self.allocation_id = -1
        self.freed_at_count = 0
        self.prev: _Chunk | None = None
        self.next: _Chunk | None = None
        self.bin = -1
        self.region = region
        self.alive = True

    @property
    def in_use(self) -> bool:
        return self.allocation_id != -1


class _Region:
    __slots__ = ("base", "size", "first", "pool")

    def __init__(self, base: int, size: int, pool: int = -1) -> None:
        self.base = base
        self.size = size
        self.first: _Chunk | None = None
        self.pool = pool  # the one bin of all its free chunks, or -1: bin by size

    def chunks(self):
        c = self.first
        while c is not None:
            yield c
            c = c.next


class ReferenceBFCAllocator(BFCBase):
    """Plain-Python BFC allocator with ``BFCAllocator``'s exact behaviour (slow; for tests)."""

    def __init__(self, backend, memory_limit=None, allow_growth=None, garbage_collection=None,
                 fragmentation_fraction=None, name=None) -> None:
        super().__init__(backend, memory_limit, allow_growth, garbage_collection,
                         fragmentation_fraction, name)
        self._bins = [SortedKeyList(key=lambda c: (c.size, c.ptr)) for _ in range(NUM_BINS)]
        self._in_use: dict[int, _Chunk] = {}
        self._region_map: SortedDict = SortedDict()  # base -> _Region
        self._queue: deque[_Chunk] = deque()
        self._next_id = 1
        self._c = dict(num_allocs=0, bytes_in_use=0, peak_bytes_in_use=0, largest_alloc_size=0,
                       pool_bytes=0, peak_pool_bytes=0)

    # --- bins
    def _insert(self, c: _Chunk) -> None:
        c.bin = c.region.pool if c.region.pool >= 0 else _bin_for_size(c.size)
        self._bins[c.bin].add(c)

    def _remove(self, c: _Chunk) -> None:
        self._bins[c.bin].remove(c)
        c.bin = -1

    # --- split / merge
    def _split(self, c: _Chunk, nbytes: int, insert_remainder: bool) -> _Chunk:
        n = _Chunk(c.ptr + nbytes, c.size - nbytes, c.region)
        c.size = nbytes
        n.freed_at_count = c.freed_at_count
        n.prev, n.next = c, c.next
        if c.next is not None:
            c.next.prev = n
        c.next = n
        if insert_remainder:
            self._insert(n)
        return n

    def _merge(self, c1: _Chunk, c2: _Chunk) -> None:
        c1.next = c2.next
        if c2.next is not None:
            c2.next.prev = c1
        c1.size += c2.size
        c1.freed_at_count = max(c1.freed_at_count, c2.freed_at_count)
        c2.alive = False

    def _coalesce(self, c: _Chunk, ignore_freed_at: bool) -> _Chunk:
        if not ignore_freed_at and c.freed_at_count > 0:
            return c
        out = c
        n = c.next
        if n is not None and not n.in_use and (n.freed_at_count == 0 or ignore_freed_at):
            self._remove(n)
            self._merge(c, n)
        p = c.prev
        if p is not None and not p.in_use and (p.freed_at_count == 0 or ignore_freed_at):
            out = p
            self._remove(p)
            self._merge(p, c)
        return out

    # --- chunk store
    def _candidates(self, rounded: int):
        """Free chunks that may hold ``rounded`` bytes, in best-fit order."""
        for b in range(_bin_for_size(rounded), NUM_BINS):
            yield from self._bins[b].irange_key(min_key=(rounded, -1))

    def _try_allocate(self, n: int, alignment: int, freed_before: int) -> int:
        rounded = round_bytes(n)
        alignment = max(alignment, MIN_ALLOCATION)
        for c in self._candidates(rounded):
            if freed_before > 0 and freed_before < c.freed_at_count:
                continue
            pad = round_bytes(-c.ptr % alignment)
            if c.size < rounded + pad:
                continue
            self._remove(c)
            if pad:
                aligned = self._split(c, pad, insert_remainder=False)
                self._insert(c)
                c = aligned
            if c.size >= 2 * rounded or c.size - rounded >= self._max_internal_fragmentation:
                self._split(c, rounded, insert_remainder=True)
            c.requested_size = n
            c.allocation_id = self._next_id
            self._next_id += 1
            k = self._c
            k["num_allocs"] += 1
            k["bytes_in_use"] += c.size
            k["peak_bytes_in_use"] = max(k["peak_bytes_in_use"], k["bytes_in_use"])
            k["largest_alloc_size"] = max(k["largest_alloc_size"], c.size)
            self._in_use[c.ptr] = c
            return c.ptr
        return 0

    def _add_region(self, ptr: int, size: int, pool_bin: int = -1) -> None:
        c = _Chunk(ptr, size, None)
        region = None
        if self._coalesce_regions:
            i = self._region_map.bisect_left(ptr)
            if i > 0:
                prev = self._region_map.peekitem(i - 1)[1]
                if prev.base + prev.size == ptr and prev.pool == pool_bin:
                    region = prev
        if region is None:
            region = _Region(ptr, size, pool_bin)
            region.first = c
            self._region_map[ptr] = region
        else:
            last = region.first
            while last.next is not None:
                last = last.next
            last.next, c.prev = c, last
            region.size += size
        c.region = region
        self._c["pool_bytes"] += size
        self._c["peak_pool_bytes"] = max(self._c["peak_pool_bytes"], self._c["pool_bytes"])
        self._insert(self._coalesce(c, False))

    def _deallocate_chunk(self, ptr: int, count: int) -> bool:
        c = self._in_use.pop(ptr, None)
        if c is None:
            return False
        c.allocation_id = -1
        c.freed_at_count = count
        self._c["bytes_in_use"] -= c.size
        if count:
            self._insert(c)
            self._queue.append(c)
        else:
            self._insert(self._coalesce(c, False))
        return True

    def _lookup(self, ptr: int):
        c = self._in_use.get(ptr)
        return None if c is None else (c.requested_size, c.size, c.allocation_id)

    def _has_timestamped(self) -> bool:
        return bool(self._queue)

    def _merge_timestamped(self, required: int, frontier: int) -> bool:
        to_merge, keep = [], deque()
        while self._queue:
            c = self._queue.popleft()
            if not c.alive or c.in_use or c.bin == -1:
                continue
            if c.freed_at_count == 0:
                to_merge.append(c)
            elif c.freed_at_count < frontier:
                c.freed_at_count = 0
                to_merge.append(c)
            elif required > 0:
                to_merge.append(c)
            else:
                keep.append(c)
        self._queue = keep
        satisfied = required == 0
        for c in to_merge:
            if not c.alive:
                continue
            if required == 0 or not satisfied:
                self._remove(c)
                nc = self._coalesce(c, required > 0)
                self._insert(nc)
                if required > 0:
                    if nc is not c and nc.freed_at_count > 0:
                        self._queue.append(nc)
                    if nc.size >= required:
                        satisfied = True
            else:
                self._queue.append(c)
        return satisfied

    def _free_regions(self):
        return [(base, base, r.size) for base, r in self._region_map.items()
                if not any(c.in_use for c in r.chunks())]

    def _remove_region(self, key) -> None:
        r = self._region_map.pop(key)
        for c in r.chunks():
            if c.bin != -1:
                self._remove(c)
            c.alive = False
        self._c["pool_bytes"] -= r.size

    def _counters(self) -> dict:
        return dict(self._c)

    def _clear_counters(self) -> None:
        self._c["num_allocs"] = 0
        self._c["peak_bytes_in_use"] = self._c["bytes_in_use"]
        self._c["largest_alloc_size"] = 0

    def _largest_free(self) -> int:
        return max((b[-1].size for b in self._bins if b), default=0)

    def _records(self) -> np.ndarray:
        rows = [c for r in self._region_map.values() for c in r.chunks()]
        rec = np.zeros(len(rows), dtype=_report.RECORD_DTYPE)
        for i, c in enumerate(rows):
            rec[i] = (c.ptr, c.size, c.requested_size if c.in_use else 0, c.bin, c.in_use,
                      c.allocation_id, 0 if c.in_use else c.freed_at_count)
        return rec

    def _region_list(self):
        return [(b, r.size) for b, r in self._region_map.items()]
