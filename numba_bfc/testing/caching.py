"""``ReferenceCachingAllocator``: PyTorch's caching policy in plain Python (the oracle).

Same constructor, methods and semantics as ``CachingAllocator``, written the
way PyTorch's ``DeviceCachingAllocator`` reads: blocks are Python objects with
``prev``/``next`` links, each pool is a ``SortedKeyList`` ordered by ``(size,
address)``, live blocks are in a dict, and statistics are updated as PyTorch's
``StatArray`` s are. It shares ``CachingBase`` (malloc order, OOM path, GC,
reporting) and re-implements the block store, which is what differential
tests compare against the kernels.
"""

from __future__ import annotations

import numpy as np
from sortedcontainers import SortedKeyList

from ..allocators import report as _report
from ..allocators.caching_base import FREE_BLOCK_DTYPE, CachingBase
from ..policies.caching import (
    ACTIVE,
    ACTIVE_BYTES,
    ALLOCATED_BYTES,
    ALLOCATION,
    INACTIVE_SPLIT,
    INACTIVE_SPLIT_BYTES,
    LARGE_BUFFER,
    LARGE_POOL,
    MIN_BLOCK_SIZE,
    NUM_STATS,
    OVERSIZE_ALLOCATIONS,
    OVERSIZE_SEGMENTS,
    REQUESTED_BYTES,
    RESERVED_BYTES,
    SEGMENT,
    SMALL_BUFFER,
    SMALL_POOL,
    SMALL_SIZE,
)

__all__ = ["ReferenceCachingAllocator"]


class _Block:
    __slots__ = ("ptr", "size", "requested_size", "allocated", "pool", "prev", "next",
                 "segment", "gc_count_base", "allocation_id", "mapped")

    def __init__(self, ptr: int, size: int, pool: int, segment, mapped: bool = True) -> None:
        self.ptr = ptr
        self.size = size
        self.requested_size = 0
        self.allocated = False
        self.pool = pool
        self.prev: _Block | None = None
        self.next: _Block | None = None
        self.segment = segment
        self.gc_count_base = 0
        self.allocation_id = -1
        self.mapped = mapped  # False: address space of an expandable segment, no memory

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    @property
    def expandable(self) -> bool:
        return self.segment.page > 0

    def splice_after(self, other: _Block) -> None:
        """Link ``other`` (a new block) right after this one."""
        other.prev, other.next = self, self.next
        if self.next is not None:
            self.next.prev = other
        self.next = other

    def splice_before(self, other: _Block) -> None:
        """Link ``other`` (a new block) right before this one."""
        other.prev, other.next = self.prev, self
        if self.prev is not None:
            self.prev.next = other
        else:
            self.segment.head = other
        self.prev = other


class _Segment:
    """A ``cudaMalloc`` segment, or (``page > 0``) an expandable segment: a range of
    address space whose blocks are mapped (memory) or not."""

    __slots__ = ("base", "size", "pool", "head", "page")

    def __init__(self, base: int, size: int, pool: int, page: int = 0) -> None:
        self.base = base
        self.size = size
        self.pool = pool
        self.head: _Block | None = None
        self.page = page

    def blocks(self):
        b = self.head
        while b is not None:
            yield b
            b = b.next


def _key(b: _Block):
    return (b.size, b.ptr)


def _address(b: _Block):
    return b.ptr


def _expandable_size(b: _Block) -> int:
    """What ``b`` can grow to: itself and the unmapped block after it."""
    nxt = b.next
    return b.size + (nxt.size if nxt is not None and not nxt.mapped else 0)


class ReferenceCachingAllocator(CachingBase):
    """PyTorch's caching policy in plain Python; see the module docstring."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._pools = [SortedKeyList(key=_key), SortedKeyList(key=_key)]
        # Per pool: the unmapped blocks of its expandable segments, by address.
        self._unmapped = [SortedKeyList(key=_address), SortedKeyList(key=_address)]
        self._clock = [0, 0]  # per pool: get_free_block calls (the GC age clock)
        self._active: dict[int, _Block] = {}
        self._segments_by_base: dict[int, _Segment] = {}
        self._stats = np.zeros((NUM_STATS, 3, 4), dtype=np.int64)
        self._next_id = 1
        self._largest = 0

    # ------------------------------------------------------------------ PyTorch's pieces
    def _update(self, stat: int, pool: int | None, amount: int) -> None:
        """``update_stat`` on the aggregate and the pool's entry."""
        for column in (0,) if pool is None else (0, 1 + pool):
            s = self._stats[stat, column]
            s[0] += amount
            if amount > 0:
                s[1] = max(s[1], s[0])
                s[2] += amount
            elif amount < 0:
                s[3] += -amount

    def _round_size(self, n: int) -> int:
        if n < MIN_BLOCK_SIZE:
            return MIN_BLOCK_SIZE
        index = min(max(n.bit_length() - 1 - 20, 0), 15)
        d = self.roundup_power2_divisions[index]
        if d > 1 and n > MIN_BLOCK_SIZE * d:
            if n & (n - 1) == 0:
                return n
            floor2 = 1 << (n.bit_length() - 1)
            step = floor2 >> (d.bit_length() - 1)
            if step == 0:
                return floor2 * 2
            down = n - n % step
            return n if down == n else down + step
        return -(-n // MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE

    def _insert_into_pool(self, b: _Block) -> None:
        b.gc_count_base = self._clock[b.pool]
        self._pools[b.pool].add(b)

    def _get_free_block(self, size: int, pool: int) -> _Block | None:
        if self._gc_enabled:
            self._clock[pool] += 1
        blocks = self._pools[pool]
        i = blocks.bisect_key_left((size, 0))
        if i == len(blocks):
            return None
        b = blocks[i]
        # A block of an expandable segment counts as what it can grow to: walk on
        # while the next block could grow to less (a local walk, as PyTorch's).
        while b.expandable and i + 1 < len(blocks) and \
                _expandable_size(blocks[i + 1]) < _expandable_size(b):
            i += 1
            b = blocks[i]
        if size < self.max_split_size and b.size >= self.max_split_size:
            return None
        if size >= self.max_split_size and b.size >= size + self.max_non_split_rounding:
            return None
        return b

    def _should_split(self, b: _Block, size: int) -> bool:
        remaining = b.size - size
        if b.pool == SMALL_POOL or self.expandable_segments:
            return remaining >= MIN_BLOCK_SIZE
        return size < self.max_split_size and remaining > SMALL_SIZE

    def _alloc_found_block(self, b: _Block, n: int) -> int:
        size = self._round_size(n)
        self._pools[b.pool].remove(b)
        already_split = b.is_split()
        pool = b.pool
        if self._should_split(b, size):
            # The front goes to the caller, the rest stays cached.
            rest = _Block(b.ptr + size, b.size - size, pool, b.segment)
            rest.next = b.next
            if rest.next is not None:
                rest.next.prev = rest
            rest.prev = b
            b.next = rest
            b.size = size
            self._insert_into_pool(rest)
            if b.expandable:
                pass  # PyTorch leaves expandable blocks out of inactive_split
            elif already_split:
                self._update(INACTIVE_SPLIT_BYTES, pool, -size)
            else:
                self._update(INACTIVE_SPLIT_BYTES, pool, rest.size)
                self._update(INACTIVE_SPLIT, pool, 1)
        elif already_split and not b.expandable:
            self._update(INACTIVE_SPLIT_BYTES, pool, -b.size)
            self._update(INACTIVE_SPLIT, pool, -1)
        b.allocated = True
        b.requested_size = n
        b.allocation_id = self._next_id
        self._next_id += 1
        self._largest = max(self._largest, b.size)
        self._active[b.ptr] = b
        for stat, amount in ((ALLOCATION, 1), (ALLOCATED_BYTES, b.size), (ACTIVE, 1),
                             (ACTIVE_BYTES, b.size), (REQUESTED_BYTES, n)):
            self._update(stat, pool, amount)
        if b.size >= self.max_split_size:
            self._update(OVERSIZE_ALLOCATIONS, None, 1)
        return b.ptr

    def _try_merge(self, dst: _Block, src: _Block | None) -> int:
        if src is None or src.allocated or src.mapped != dst.mapped:
            return 0
        (self._pools if src.mapped else self._unmapped)[src.pool].remove(src)
        if dst.prev is src:
            dst.ptr = src.ptr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
            else:
                dst.segment.head = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        return src.size

    # ------------------------------------------------------------------ block store
    def _find_block(self, n: int) -> int:
        size = self._round_size(n)
        pool = SMALL_POOL if size <= SMALL_SIZE else LARGE_POOL
        b = self._get_free_block(size, pool)
        return 0 if b is None else self._alloc_found_block(b, n)

    def _add_segment(self, ptr: int, size: int, pool: int) -> _Segment:
        seg = _Segment(ptr, size, pool)
        seg.head = _Block(ptr, size, pool, seg)
        self._insert_into_pool(seg.head)
        self._segments_by_base[ptr] = seg
        self._update(SEGMENT, pool, 1)
        self._update(RESERVED_BYTES, pool, size)
        if size >= self.max_split_size:
            self._update(OVERSIZE_SEGMENTS, None, 1)
        return seg

    def _release_segment(self, segment) -> tuple[int, int]:
        seg = segment if isinstance(segment, _Segment) else self._segments_by_base[segment]
        b = seg.head
        assert b is not None and not b.is_split() and not b.allocated
        self._pools[seg.pool].remove(b)
        del self._segments_by_base[seg.base]
        self._update(SEGMENT, seg.pool, -1)
        self._update(RESERVED_BYTES, seg.pool, -seg.size)
        if seg.size >= self.max_split_size:
            self._update(OVERSIZE_SEGMENTS, None, -1)
        return seg.base, seg.size

    def _free_block(self, ptr: int) -> int | None:
        b = self._active.pop(ptr, None)
        if b is None:
            return None
        pool, size, requested = b.pool, b.size, b.requested_size
        b.allocated = False
        b.allocation_id = -1
        self._update(ALLOCATION, pool, -1)
        self._update(ALLOCATED_BYTES, pool, -size)
        if size >= self.max_split_size:
            self._update(OVERSIZE_ALLOCATIONS, None, -1)
        net_blocks = net_bytes = 0
        for candidate in (b.prev, b.next):
            subsumed = self._try_merge(b, candidate)
            if subsumed:
                net_blocks -= 1
                net_bytes -= subsumed
        self._insert_into_pool(b)
        if b.is_split():
            net_blocks += 1
            net_bytes += b.size
        if not b.expandable:
            self._update(INACTIVE_SPLIT, pool, net_blocks)
            self._update(INACTIVE_SPLIT_BYTES, pool, net_bytes)
        self._update(ACTIVE, pool, -1)
        self._update(ACTIVE_BYTES, pool, -size)
        self._update(REQUESTED_BYTES, pool, -requested)
        return size

    def _free_blocks(self, pool: int) -> np.ndarray:
        blocks = list(self._pools[pool])
        out = np.zeros(len(blocks), dtype=FREE_BLOCK_DTYPE)
        for i, b in enumerate(blocks):
            out[i] = (b.size, b.ptr, b.segment.base, b.is_split(),
                      self._clock[pool] - b.gc_count_base, b.expandable)
        return out

    def _lookup(self, ptr: int):
        b = self._active.get(ptr)
        return None if b is None else (b.requested_size, b.size, b.allocation_id)

    def _stat_array(self) -> np.ndarray:
        return self._stats

    def _largest_alloc(self) -> int:
        return self._largest

    def _set_largest_alloc(self, value: int) -> None:
        self._largest = value

    def _largest_free(self) -> int:
        return max((p[-1].size for p in self._pools if len(p)), default=0)

    def _records(self) -> np.ndarray:
        blocks = sorted((b for s in self._segments_by_base.values() for b in s.blocks()
                         if b.mapped), key=lambda b: b.ptr)
        rec = np.zeros(len(blocks), dtype=_report.RECORD_DTYPE)
        for i, b in enumerate(blocks):
            rec[i] = (b.ptr, b.size, b.requested_size if b.allocated else 0, b.pool,
                      b.allocated, b.allocation_id, 0 if b.allocated else b.gc_count_base)
        return rec

    def _segment_list(self) -> list[tuple[int, int, int]]:
        out = []
        for s in self._segments_by_base.values():
            if not s.page:
                out.append((s.base, s.size, s.pool))
                continue
            # An expandable segment shows as its runs of mapped blocks, as in PyTorch's snapshot.
            start = end = None
            for b in s.blocks():
                if b.mapped and start is not None and b.ptr == end:
                    end += b.size
                elif b.mapped:
                    start, end = b.ptr, b.ptr + b.size
                if start is not None and (not b.mapped or b.next is None):
                    out.append((start, end - start, s.pool))
                    start = end = None
        return sorted(out)

    # ------------------------------------------------------------------ expandable segments
    def _find_expandable_block(self, pool: int, size: int) -> _Block | None:
        """PyTorch's ``find_expandable_block``: from the lowest-address unmapped
        block of any of the pool's segments (with the free block before it), the
        first run of free or unmapped blocks of ``size`` bytes; else a new segment."""
        for c in self._unmapped[pool]:
            if c.prev is not None and not c.prev.allocated:
                c = c.prev
            room, b = 0, c
            while room < size and b is not None and not b.allocated:
                room += b.size
                b = b.next
            if room >= size:
                return c
        page = SMALL_BUFFER if pool == SMALL_POOL else LARGE_BUFFER
        reserved = self._reserve_address_space(page, size)
        if reserved is None:
            return None
        seg = _Segment(reserved[0], reserved[1], pool, page)
        seg.head = _Block(seg.base, seg.size, pool, seg, mapped=False)
        self._segments_by_base[seg.base] = seg
        self._unmapped[pool].add(seg.head)
        return seg.head

    def _map_block(self, b: _Block, size: int) -> bool:
        """PyTorch's ``map_block``: map the pages holding the first ``size`` bytes of
        unmapped ``b``; the rest stays an unmapped block after it."""
        seg = b.segment
        first = (b.ptr - seg.base) // seg.page
        last = -(-(b.ptr + size - seg.base) // seg.page)
        mapped = (last - first) * seg.page
        if not self._map_pages(b.ptr, mapped):
            return False
        self._unmapped[b.pool].remove(b)
        b.mapped = True
        if mapped < b.size:
            rest = _Block(b.ptr + mapped, b.size - mapped, b.pool, seg, mapped=False)
            b.splice_after(rest)
            self._unmapped[b.pool].add(rest)
            b.size = mapped
        self._try_merge(b, b.prev)
        self._try_merge(b, b.next)
        self._insert_into_pool(b)
        self._update(RESERVED_BYTES, b.pool, mapped)
        return True

    def _try_allocate_expandable(self, pool: int, size: int) -> _Block | None:
        c = self._find_expandable_block(pool, size)
        if c is None:
            return None
        if not c.mapped and not self._map_block(c, min(c.size, size)):
            return None
        while c.size < size:
            # c is free and mapped, and an unmapped block follows it.
            nxt = c.next
            if not self._map_block(nxt, min(size - c.size, nxt.size)):
                return None
            c = nxt
        return c

    def _take_from_segment(self, segment, n: int) -> int:
        if isinstance(segment, _Block):  # a grown expandable block
            return self._alloc_found_block(segment, n)
        return self._alloc_found_block(segment.head, n)

    def _unmap_free_blocks(self, pool: int, blocks: list[tuple[int, int]]) -> None:
        free = self._pools[pool]
        for key in blocks:
            b = free[free.bisect_key_left(key)]
            self._unmap_block(b)
            if b.prev is None and b.next is None:  # nothing of the segment is mapped
                del self._segments_by_base[b.segment.base]
                self._unmapped[pool].remove(b)
                self._release_address_space(b.segment.base)

    def _unmap_block(self, b: _Block) -> None:
        """PyTorch's ``unmap_block``: give back the whole pages inside free ``b``;
        the partial pages at either end stay mapped, as free blocks."""
        seg = b.segment
        first = -(-(b.ptr - seg.base) // seg.page)
        last = (b.ptr + b.size - seg.base) // seg.page
        if first >= last:
            return
        start, nbytes = seg.base + first * seg.page, (last - first) * seg.page
        self._unmap_pages(start, nbytes)
        self._pools[b.pool].remove(b)
        if start > b.ptr:
            before = _Block(b.ptr, start - b.ptr, b.pool, seg)
            b.splice_before(before)
            self._insert_into_pool(before)
        after = b.ptr + b.size - (start + nbytes)
        if after > 0:
            tail = _Block(start + nbytes, after, b.pool, seg)
            b.splice_after(tail)
            self._insert_into_pool(tail)
        b.ptr, b.size, b.mapped = start, nbytes, False
        self._try_merge(b, b.prev)
        self._try_merge(b, b.next)
        self._unmapped[b.pool].add(b)
        self._update(RESERVED_BYTES, b.pool, -nbytes)
