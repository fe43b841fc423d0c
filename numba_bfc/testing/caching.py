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
    LARGE_POOL,
    MIN_BLOCK_SIZE,
    NUM_STATS,
    OVERSIZE_ALLOCATIONS,
    OVERSIZE_SEGMENTS,
    REQUESTED_BYTES,
    RESERVED_BYTES,
    SEGMENT,
    SMALL_POOL,
    SMALL_SIZE,
)

__all__ = ["ReferenceCachingAllocator"]


class _Block:
    __slots__ = ("ptr", "size", "requested_size", "allocated", "pool", "prev", "next",
                 "segment", "gc_count_base", "allocation_id")

    def __init__(self, ptr: int, size: int, pool: int, segment) -> None:
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

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None


class _Segment:
    __slots__ = ("base", "size", "pool", "head")

    def __init__(self, base: int, size: int, pool: int) -> None:
        self.base = base
        self.size = size
        self.pool = pool
        self.head: _Block | None = None

    def blocks(self):
        b = self.head
        while b is not None:
            yield b
            b = b.next


def _key(b: _Block):
    return (b.size, b.ptr)


class ReferenceCachingAllocator(CachingBase):
    """PyTorch's caching policy in plain Python; see the module docstring."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._pools = [SortedKeyList(key=_key), SortedKeyList(key=_key)]
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
        if size < self.max_split_size and b.size >= self.max_split_size:
            return None
        if size >= self.max_split_size and b.size >= size + self.max_non_split_rounding:
            return None
        return b

    def _should_split(self, b: _Block, size: int) -> bool:
        remaining = b.size - size
        if b.pool == SMALL_POOL:
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
            if already_split:
                self._update(INACTIVE_SPLIT_BYTES, pool, -size)
            else:
                self._update(INACTIVE_SPLIT_BYTES, pool, rest.size)
                self._update(INACTIVE_SPLIT, pool, 1)
        elif already_split:
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
        if src is None or src.allocated:
            return 0
        self._pools[src.pool].remove(src)
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

    def _take_from_segment(self, segment: _Segment, n: int) -> int:
        return self._alloc_found_block(segment.head, n)

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
                      self._clock[pool] - b.gc_count_base)
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
        blocks = sorted((b for s in self._segments_by_base.values() for b in s.blocks()),
                        key=lambda b: b.ptr)
        rec = np.zeros(len(blocks), dtype=_report.RECORD_DTYPE)
        for i, b in enumerate(blocks):
            rec[i] = (b.ptr, b.size, b.requested_size if b.allocated else 0, b.pool,
                      b.allocated, b.allocation_id, 0 if b.allocated else b.gc_count_base)
        return rec

    def _segment_list(self) -> list[tuple[int, int, int]]:
        return sorted((s.base, s.size, s.pool) for s in self._segments_by_base.values())
