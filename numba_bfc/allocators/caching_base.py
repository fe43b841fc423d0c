"""What every caching-policy implementation shares: PyTorch's malloc order, the
out-of-memory path, garbage collection, statistics, snapshots and history.

PyTorch's ``DeviceCachingAllocator::malloc`` order lives here once: best fit
in the pool, then (with a limit and a threshold) garbage collection, then a
new segment, then freeing oversize cached blocks and a new segment, then
freeing every cached unsplit segment and a retry, then ``OutOfMemoryError``.
Subclasses supply the block store (``CachingAllocator``: Numba kernels over
tables; ``ReferenceCachingAllocator``: plain Python over ``sortedcontainers``).
Single stream: PyTorch's per-stream keys, events and graph pools do not apply.
"""

from __future__ import annotations

import abc
import collections
import contextlib
import sys
import threading
import time
import weakref

import numpy as np

from ..errors import OutOfMemoryError
from ..framework.allocator import AllocationAttributes
from ..framework.validate import MAX_INT64, check_alignment, check_free_pointer, check_size
from ..policies.caching import (
    ALLOCATED_BYTES,
    ALLOCATION,
    LARGE_BUFFER,
    LARGE_POOL,
    MIN_BLOCK_SIZE,
    MIN_LARGE_ALLOC,
    NUM_STATS,
    OVERSIZE_ALLOCATIONS,
    OVERSIZE_SEGMENTS,
    RESERVED_BYTES,
    ROUND_LARGE,
    SMALL_BUFFER,
    SMALL_POOL,
    SMALL_SIZE,
    STAT_NAMES,
)
from ..stats import AllocatorStats, format_bytes
from . import report as _report
from ._options import UNLIMITED, resolve_caching_options
from ._pooled import PooledAllocator

ONE_EIB = 1 << 60  # PyTorch rejects requests of 1 EiB or more up front
POOL_NAMES = ("small", "large")
_STAT_POOLS = ("all", "small_pool", "large_pool")
_STAT_FIELDS = ("current", "peak", "allocated", "freed")
# Indices into a stat's [pool][field] entries.
_ALL_POOLS = 0
_CURRENT, _PEAK, _ALLOCATED, _FREED = 0, 1, 2, 3
_COUNTER_NAMES = ("num_alloc_retries", "num_ooms", "num_sync_all_streams",
                  "num_device_alloc", "num_device_free")

# One row per free block in a pool, as PyTorch's ordered pool would list it.
FREE_BLOCK_DTYPE = np.dtype([("size", np.int64), ("ptr", np.int64), ("segment", np.int64),
                             ("split", np.bool_), ("gc_count", np.int64),
                             ("expandable", np.bool_)])
#: The device memory an expandable segment's address space is sized from when
#: neither the backend nor a limit bounds it (1 PiB, as ``UNLIMITED``).
UNBOUNDED_DEVICE = 1 << 50


def _oom_message(name: str, n: int, alloc_size: int, total: int | None,
                 device_free: int | None, limit: int | None, stats, reason: str,
                 split_unlimited: bool) -> str:
    """PyTorch's out-of-memory text, for ``OutOfMemoryError`` to format when shown
    (``stats``: an ``AllocatorStats`` or a callable that builds it)."""
    if callable(stats):
        stats = stats()
    allocated, reserved = stats.bytes_in_use, stats.bytes_reserved
    parts = [f"{name}: out of memory. Tried to allocate {format_bytes(alloc_size)} "
             f"(a segment for a request of {n} bytes)."]
    if total is not None:
        parts.append(f"The backend has a total capacity of {format_bytes(total)} of which "
                     f"{format_bytes(device_free)} is free.")
    if limit is not None:
        parts.append(f"{format_bytes(limit)} allowed.")
    largest = format_bytes(stats.largest_free_block_bytes)
    parts.append(f"Of the allocated memory {format_bytes(allocated)} is allocated by this "
                 f"allocator, and {format_bytes(reserved - allocated)} is reserved but "
                 f"unallocated; the largest free cached block is {largest}.")
    if reason == "limit":
        parts.append("The memory limit is what stops this request: raise memory_limit "
                     "or memory_fraction.")
    elif reason == "fragmentation":
        if split_unlimited:
            parts.append("If reserved but unallocated memory is large, try setting "
                         "max_split_size_mb to avoid fragmentation.")
        else:
            parts.append("Reserved but unallocated memory is fragmented: try a smaller "
                         "max_split_size_mb or roundup_power2_divisions.")
    else:
        parts.append("Free memory elsewhere, or allocate less.")
    return " ".join(parts)


def allocation_size(size: int) -> int:
    """PyTorch's ``get_allocation_size``: the segment to request for ``size`` bytes."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


class CachingBase(PooledAllocator):
    """PyTorch caching-allocator semantics over an abstract block store.

    The block store is the contract: the abstract methods (rounding, finding a
    block, adding, splitting and releasing segments, freeing, the stats array,
    the records), all called with the lock held. ``CachingAllocator``
    implements them over the kernels' tables, ``ReferenceCachingAllocator``
    over Python objects.
    """

    def __init__(self, backend, memory_limit=None, max_split_size=None,
                 roundup_power2_divisions=None, garbage_collection_threshold=None,
                 name=None, *, memory_fraction=None, max_non_split_rounding=None,
                 expandable_segments=None) -> None:
        opts = resolve_caching_options(
            backend, memory_limit=memory_limit, memory_fraction=memory_fraction,
            max_split_size=max_split_size, max_non_split_rounding=max_non_split_rounding,
            roundup_power2_divisions=roundup_power2_divisions,
            garbage_collection_threshold=garbage_collection_threshold,
            expandable_segments=expandable_segments, name=name)
        self._backend = backend
        self._name = opts.name
        self.memory_limit = opts.memory_limit
        self.max_split_size = opts.max_split_size
        self.max_non_split_rounding = opts.max_non_split_rounding
        self.roundup_power2_divisions = opts.roundup_power2_divisions
        self.garbage_collection_threshold = opts.garbage_collection_threshold
        self._gc_enabled = opts.memory_limit is not None and opts.garbage_collection_threshold > 0
        self.expandable_segments = opts.expandable_segments
        self._reservations: dict[int, int] = {}  # expandable segments' address ranges
        self._deferred_frees: list[int] | None = None  # see _holding_blocks
        # Reentrant: arrays from empty() free themselves from finalizers, which may
        # run on this thread while it holds the lock; tables are consistent
        # between kernel calls, so a nested free is safe.
        self._lock = threading.RLock()
        self._weak_self = weakref.ref(self)  # what its out-of-memory errors refer to
        self._events = dict.fromkeys(_COUNTER_NAMES, 0)
        self._history: collections.deque | None = None

    # ------------------------------------------------------------------ Allocator API
    def allocate_raw(self, num_bytes: int, alignment: int = MIN_BLOCK_SIZE,
                     attributes: AllocationAttributes | None = None) -> int:
        """Allocate ``num_bytes`` and return the address (0 for 0 bytes).

        Every block starts on a 512-byte boundary, so ``alignment`` may be any
        power of two up to 512; PyTorch's policy has no way to honour more.

        Raises
        ------
        OutOfMemoryError
            After PyTorch's whole recovery path (free oversize cached blocks,
            then every cached unsplit segment) failed. Cached segments it
            released stay released, as in PyTorch.
        TypeError, ValueError
            Bad arguments; the state is unchanged.
        """
        n = check_size(num_bytes)
        self._check_alignment(alignment)
        if attributes is not None and not isinstance(attributes, AllocationAttributes):
            raise TypeError("attributes must be an AllocationAttributes or None, got "
                            f"{type(attributes).__name__}")
        if n == 0:
            return 0
        if n >= ONE_EIB:
            raise self._beyond_one_eib(n)
        with self._lock:
            return self._malloc(n)

    def deallocate_raw(self, ptr: int | None) -> None:
        """Free an address from ``allocate_raw`` (the block goes back to the cache).

        Raises
        ------
        InvalidPointerError
            Double free, interior pointer or unknown pointer; state unchanged.
        """
        p = check_free_pointer(ptr)
        if not p:
            return
        with self._lock:
            self._free(p)

    def get_stats(self) -> AllocatorStats:
        """TF-style counters: ``num_allocs`` is ``allocation.all.allocated``,
        ``bytes_in_use`` is ``allocated_bytes.all.current``, ``bytes_reserved`` is
        ``reserved_bytes.all.current``; ``bytes_limit`` is 0 without a limit."""
        with self._lock:
            return self._allocator_stats()

    def clear_stats(self) -> bool:
        """Reset peaks and accumulated counts (``reset_peak_memory_stats`` plus
        ``reset_accumulated_memory_stats``) and the largest allocation size."""
        with self._lock:
            self._reset_peaks()
            self._reset_accumulated()
            self._set_largest_alloc(0)
        return True

    # ------------------------------------------------------------------ PyTorch API
    def memory_stats(self) -> dict[str, int]:
        """PyTorch's ``torch.cuda.memory_stats()``: a flat dict sorted by key.

        ``<stat>.{all,small_pool,large_pool}.{current,peak,allocated,freed}`` for
        allocation, allocated_bytes, segment, reserved_bytes, active,
        active_bytes, inactive_split, inactive_split_bytes and requested_bytes;
        ``oversize_allocations.*`` and ``oversize_segments.*``; the event counts
        ``num_alloc_retries``, ``num_ooms``, ``num_sync_all_streams``,
        ``num_device_alloc``, ``num_device_free``; and ``max_split_size`` (-1 when
        unlimited, as PyTorch reports ``SIZE_MAX``). Like PyTorch's own output
        (and unlike its docstring) the count of allocations is ``allocation.*``.
        """
        with self._lock:
            self._fold_kernel_failures()
            stats = self._stat_array().copy()
            events = dict(self._events)
        out: dict[str, int] = {}
        for s, stat in enumerate(STAT_NAMES):
            pools = (0,) if s in (OVERSIZE_ALLOCATIONS, OVERSIZE_SEGMENTS) else (0, 1, 2)
            for p in pools:
                prefix = stat if len(pools) == 1 else f"{stat}.{_STAT_POOLS[p]}"
                for f, field in enumerate(_STAT_FIELDS):
                    out[f"{prefix}.{field}"] = int(stats[s, p, f])
        out.update(events)
        out["max_split_size"] = -1 if self.max_split_size == UNLIMITED else self.max_split_size
        return dict(sorted(out.items()))

    def memory_allocated(self) -> int:
        """``allocated_bytes.all.current``."""
        return self._aggregate(ALLOCATED_BYTES, _CURRENT)

    def max_memory_allocated(self) -> int:
        """``allocated_bytes.all.peak``."""
        return self._aggregate(ALLOCATED_BYTES, _PEAK)

    def memory_reserved(self) -> int:
        """``reserved_bytes.all.current``."""
        return self._aggregate(RESERVED_BYTES, _CURRENT)

    def max_memory_reserved(self) -> int:
        """``reserved_bytes.all.peak``."""
        return self._aggregate(RESERVED_BYTES, _PEAK)

    def _aggregate(self, stat: int, field: int) -> int:
        with self._lock:
            return int(self._stat_array()[stat, _ALL_POOLS, field])

    def reset_peak_memory_stats(self) -> None:
        """Set every peak to its current value."""
        with self._lock:
            self._reset_peaks()

    def reset_accumulated_memory_stats(self) -> None:
        """Zero every ``allocated``/``freed`` total and the event counts."""
        with self._lock:
            self._reset_accumulated()

    def empty_cache(self) -> None:
        """Give every cached segment with no block in use back to the backend (with
        expandable segments: every whole free page)."""
        with self._lock, self._holding_blocks():
            self._release_cached_blocks()

    def memory_snapshot(self) -> list[dict]:
        """PyTorch's ``torch.cuda.memory_snapshot()``: segments in address order,
        each with its blocks (``address``, ``size``, ``requested_size``, ``state``
        of ``"active_allocated"`` or ``"inactive"``). Single device and stream:
        ``device`` and ``stream`` are 0; ``frames`` are empty."""
        with self._lock:
            return self._segments()

    def snapshot(self) -> dict:
        """PyTorch's ``torch.cuda.memory._snapshot()``: ``{"segments": ...,
        "device_traces": [history]}``, plus the allocator settings."""
        with self._lock:
            return {
                "segments": self._segments(),
                "device_traces": [list(self._history or ())],
                "allocator_settings": self._settings(),
            }

    def record_memory_history(self, enabled: bool = True, max_entries: int = sys.maxsize,
                              clear_history: bool = False) -> None:
        """Start (or stop) recording trace entries in a ring buffer of ``max_entries``.

        Entries are dicts with ``action`` (``alloc``, ``free_requested``,
        ``free_completed``, ``segment_alloc``, ``segment_free``, ``oom``),
        ``addr``, ``size``, ``stream`` (0), ``time_us`` and ``frames`` (empty),
        as PyTorch's ``_record_memory_history``; an ``oom`` entry's ``addr`` is
        the free bytes the backend reported, as in PyTorch. While recording,
        every operation takes the slower Python path.
        """
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ValueError(f"max_entries must be an integer >= 1, got {max_entries!r}")
        with self._lock:
            if not enabled:
                self._history = None
                return
            old = () if clear_history or self._history is None else self._history
            self._history = collections.deque(old, maxlen=max_entries)

    def memory_history(self) -> list[dict]:
        """The recorded trace entries, oldest first (empty when not recording)."""
        with self._lock:
            return list(self._history or ())

    def memory_summary(self) -> str:
        """A table like ``torch.cuda.memory_summary()``."""
        stats = self.memory_stats()
        rows = [
            ("Allocated memory", "allocated_bytes", True),
            ("Active memory", "active_bytes", True),
            ("Requested memory", "requested_bytes", True),
            ("Reserved memory", "reserved_bytes", True),
            ("Non-releasable memory", "inactive_split_bytes", True),
            ("Allocations", "allocation", False),
            ("Active allocs", "active", False),
            ("Reserved segments", "segment", False),
            ("Non-releasable allocs", "inactive_split", False),
        ]
        width = 75
        rule = "|" + "=" * width + "|"
        thin = "|" + "-" * width + "|"

        def fmt(v, as_bytes):
            return format_bytes(v) if as_bytes else str(v)

        title = f" numba_bfc caching allocator ({self._name}) memory summary"
        lines = [rule, f"|{title:<{width}}|",
                 thin,
                 f"|{'  retries: ' + str(stats['num_alloc_retries']):<37}|"
                 f"{'  OOMs: ' + str(stats['num_ooms']):<37}|",
                 rule,
                 f"|{'  Metric':<26}|{' Cur Usage':>12}|{' Peak Usage':>12}|"
                 f"{' Tot Alloc':>11}|{' Tot Freed':>11}|",
                 thin]
        for title, key, as_bytes in rows:
            for pool, label in (("all", title), ("large_pool", "  from large pool"),
                                ("small_pool", "  from small pool")):
                vals = [fmt(stats[f"{key}.{pool}.{f}"], as_bytes) for f in _STAT_FIELDS]
                lines.append(f"|{' ' + label:<26}|{vals[0]:>12}|{vals[1]:>12}|"
                             f"{vals[2]:>11}|{vals[3]:>11}|")
            lines.append(thin)
        for title, key in (("Oversize allocations", "oversize_allocations"),
                           ("Oversize segments", "oversize_segments")):
            vals = [str(stats[f"{key}.{f}"]) for f in _STAT_FIELDS]
            lines.append(f"|{' ' + title:<26}|{vals[0]:>12}|{vals[1]:>12}|"
                         f"{vals[2]:>11}|{vals[3]:>11}|")
        lines.append(rule)
        return "\n".join(lines)

    def render_occupancy(self, width: int = 100) -> str:
        """One line of ``width`` characters over all segments (``*`` used, ``_`` free)."""
        with self._lock:
            return _report.render_occupancy(self._records(), self._region_list(), width)

    def regions(self) -> list[tuple[int, int]]:
        """``[(base, size), ...]`` of the segments held, in address order."""
        with self._lock:
            return self._region_list()

    def __repr__(self) -> str:
        s = self.get_stats()
        return (f"{type(self).__name__}(name={self._name!r}, in_use={s.bytes_in_use}, "
                f"reserved={s.bytes_reserved}, limit={self.memory_limit})")

    # ------------------------------------------------------------------ orchestration
    def _check_alignment(self, alignment) -> int:
        a = check_alignment(alignment)
        if a > MIN_BLOCK_SIZE:
            raise ValueError(
                f"{self._name}: alignment {a} is not supported: the caching policy aligns "
                f"every block to {MIN_BLOCK_SIZE} bytes and no more")
        return a

    def _malloc(self, n: int) -> int:
        p = self._find_block(n)
        if not p:
            return self._malloc_slow(n)
        if self._history is not None:
            self._trace("alloc", p, n)
        return p

    @contextlib.contextmanager
    def _holding_blocks(self):
        """Around slow paths that keep blocks across Python code (expandable segments
        map, unmap and grow blocks step by step): a free reaching this thread
        meanwhile (a finalizer freeing an array, under the reentrant lock) would
        merge blocks under them, so it waits and runs after."""
        if self._deferred_frees is not None:
            yield
            return
        self._deferred_frees = []
        try:
            yield
        finally:
            deferred, self._deferred_frees = self._deferred_frees, None
            for p in deferred:
                self._free(p)

    def _malloc_slow(self, n: int) -> int:
        """Everything after the cache missed: GC, new segments, releases, OOM."""
        with self._holding_blocks():
            return self._malloc_slow_held(n)

    def _malloc_slow_held(self, n: int) -> int:
        size = self._round_size(n)
        pool = SMALL_POOL if size <= SMALL_SIZE else LARGE_POOL
        alloc_size = allocation_size(size)
        if self._gc_enabled:
            self._garbage_collect()
        segment = self._alloc_block(alloc_size, pool, False, size)
        if segment is None and self._release_available_cached_blocks(size, pool):
            segment = self._alloc_block(alloc_size, pool, False, size)
        if segment is None:
            self._release_cached_blocks()
            segment = self._alloc_block(alloc_size, pool, True, size)
        if segment is None:
            raise self._out_of_memory(n, alloc_size)
        p = self._take_from_segment(segment, n)
        if self._history is not None:
            self._trace("alloc", p, n)
        return p

    def _alloc_block(self, alloc_size: int, pool: int, is_retry: bool, size: int):
        """PyTorch's ``alloc_block``: a new segment of ``alloc_size`` bytes, or with
        expandable segments a free block of at least ``size`` bytes grown by mapping
        pages. The limit is checked against ``alloc_size`` either way, as PyTorch
        checks its memory fraction before it picks the expandable path."""
        if is_retry:
            self._events["num_alloc_retries"] += 1
        reserved = self._usage()[1]
        if self.memory_limit is not None and reserved + alloc_size > self.memory_limit:
            return None
        if reserved + alloc_size > MAX_INT64:
            return None  # the int64 statistics cannot count it: as if the device were full
        if self.expandable_segments:
            return self._try_allocate_expandable(pool, size)
        got = self._backend.alloc(alloc_size, MIN_BLOCK_SIZE)
        if got is None:
            return None
        ptr, received = got
        if ptr + received > MAX_INT64:
            self._backend.free(ptr, received)  # past the address space the tables hold
            return None
        if ptr <= 0 or ptr % MIN_BLOCK_SIZE or received % MIN_BLOCK_SIZE or received < alloc_size:
            self._backend.free(ptr, received)
            raise RuntimeError(
                f"backend returned segment ({ptr:#x}, {received}): must be 512-byte aligned "
                f"and a multiple of 512 of at least {alloc_size} bytes")
        self._events["num_device_alloc"] += 1
        if self._history is not None:
            self._trace("segment_alloc", ptr, received)
        return self._add_segment(ptr, received, pool)

    def _release(self, segment) -> None:
        """PyTorch's ``release_block``: one whole cached segment back to the backend."""
        ptr, size = self._release_segment(segment)
        self._backend.free(ptr, size)
        self._events["num_device_free"] += 1
        if self._history is not None:
            self._trace("segment_free", ptr, size)

    def _release_available_cached_blocks(self, size: int, pool: int) -> bool:
        """Free one oversize cached block big enough, or the largest ones until
        enough is freed (PyTorch's ``release_available_cached_blocks``)."""
        if self.max_split_size == UNLIMITED:
            return False
        blocks = self._free_blocks(pool)
        want = max(size, self.max_split_size)
        i = int(np.searchsorted(blocks["size"], want, side="left"))
        if i < blocks.shape[0] and not blocks[i]["expandable"]:
            self._release(int(blocks[i]["segment"]))
            return True
        released = 0
        # Expandable blocks cannot be released whole: they are passed over, as
        # since PyTorch's #134338 (before it, PyTorch asserted on them).
        for b in blocks[:i][::-1]:
            if released >= want or b["size"] < self.max_split_size:
                break
            if b["expandable"]:
                continue
            # Blocks this large are never split, so each is a whole segment.
            self._release(int(b["segment"]))
            released += int(b["size"])
        return released >= want

    def _release_cached_blocks(self) -> None:
        """Free every cached unsplit segment, large pool first (``empty_cache``)."""
        self._events["num_sync_all_streams"] += 1
        allocated, reserved = self._usage()
        if allocated == reserved:
            return  # every segment is wholly in use: no free block, no pass over them
        for segment in self._whole_free_segments():
            self._release(segment)
        if not self.expandable_segments:
            return
        for pool in (LARGE_POOL, SMALL_POOL):
            # Expandable blocks give back their whole free pages (PyTorch's
            # unmap_block), in the pool's (size, address) order.
            blocks = self._free_blocks(pool)
            expandable = blocks[blocks["expandable"]]
            if expandable.size:
                self._unmap_free_blocks(pool, list(zip(expandable["size"].tolist(),
                                                       expandable["ptr"].tolist())))

    def _whole_free_segments(self) -> list[int]:
        """The segments that are one free (unsplit, not expandable) block each,
        in the order PyTorch releases them: the large pool first, each pool in
        its (size, address) order."""
        out = []
        for pool in (LARGE_POOL, SMALL_POOL):
            blocks = self._free_blocks(pool)
            out += blocks["segment"][~blocks["split"] & ~blocks["expandable"]].tolist()
        return out

    def _garbage_collect(self) -> None:
        """PyTorch's ``garbage_collect_cached_blocks``: release the oldest unsplit
        large-pool blocks (by lookups since they were cached) until usage falls
        to ``threshold * limit``."""
        threshold = self.garbage_collection_threshold * self.memory_limit
        reserved = self._usage()[1]
        if reserved <= threshold:
            return
        target = reserved - threshold
        blocks = [b for b in self._free_blocks(LARGE_POOL)
                  if not b["split"] and not b["expandable"]]
        if not blocks:
            return
        total_age = float(sum(int(b["gc_count"]) for b in blocks))
        count = len(blocks)
        reclaimed = 0
        freed = True
        while reclaimed < target and freed and count > 0:
            age_threshold = total_age / count
            freed = False
            keep = []
            for b in blocks:
                if float(b["gc_count"]) >= age_threshold:
                    freed = True
                    reclaimed += int(b["size"])
                    total_age -= float(b["gc_count"])
                    count -= 1
                    self._release(int(b["segment"]))
                else:
                    keep.append(b)
            blocks = keep

    def _free(self, p: int) -> None:
        if self._deferred_frees is not None:  # inside _holding_blocks: later
            if self._lookup(p) is None or p in self._deferred_frees:
                raise self._invalid_pointer(p)
            self._deferred_frees.append(p)
            return
        # Trace entries carry the requested size, as PyTorch's do.
        info = self._lookup(p) if self._history is not None else None
        if self._free_block(p) is None:
            raise self._invalid_pointer(p)
        if info is not None:
            self._trace("free_requested", p, info[0])
            self._trace("free_completed", p, info[0])

    # ------------------------------------------------------------------ expandable segments
    def _reserve_address_space(self, page: int, size: int) -> tuple[int, int] | None:
        """Address space for a new expandable segment that will hold ``size`` bytes:
        PyTorch reserves 1 1/8 of the device memory (here: the backend's capacity,
        else the limit, else ``UNBOUNDED_DEVICE``) in whole pages. A bounded range
        gives each reservation at most half of it (room for both pools), and where
        no such gap is left, the largest gap of whole pages; None when no gap holds
        ``size``."""
        total = self._backend.total_memory() or self.memory_limit or UNBOUNDED_DEVICE
        least = -(-size // page) * page
        want = -(-(total + total // 8) // page) * page
        start, length = self._backend.address_space()
        end = None if length is None else start + length
        if length is not None:
            want = min(want, length // 2 // page * page)
        want = max(want, least)
        best: tuple[int, int] | None = None
        align = SMALL_BUFFER  # CUDA's granularity: where cuMemAddressReserve puts ranges
        pos = -(-start // align) * align
        for base in sorted(self._reservations) + [None]:
            gap_end = end if base is None else base
            room = None if gap_end is None else (gap_end - pos) // page * page
            if room is None or room >= want:
                best = (pos, want)
                break
            if room >= least and (best is None or room > best[1]):
                best = (pos, room)
            if base is None:
                break
            pos = -(-(base + self._reservations[base]) // align) * align
        if best is None or best[0] + best[1] > MAX_INT64:
            return None
        self._reservations[best[0]] = best[1]
        return best

    def _release_address_space(self, base: int) -> None:
        del self._reservations[base]

    def _map_pages(self, ptr: int, nbytes: int) -> bool:
        """Back ``[ptr, ptr+nbytes)`` (whole pages of a reservation) with memory:
        PyTorch's ``ExpandableSegment::map``; False when the backend is out of memory."""
        if self._backend.alloc_at(ptr, nbytes) is None:
            return False
        self._events["num_device_alloc"] += 1
        if self._history is not None:
            self._trace("segment_map", ptr, nbytes)
        return True

    def _unmap_pages(self, ptr: int, nbytes: int) -> None:
        """Give back the memory of whole pages (PyTorch's ``ExpandableSegment::unmap``)."""
        self._backend.free(ptr, nbytes)
        self._events["num_device_free"] += 1
        if self._history is not None:
            self._trace("segment_unmap", ptr, nbytes)

    def _out_of_memory(self, n: int, alloc_size: int) -> OutOfMemoryError:
        self._events["num_ooms"] += 1
        return self._failure(n, alloc_size, self._stat_rows(), None)

    def _failure(self, n: int, alloc_size: int, rows: list,
                 largest: int | None) -> OutOfMemoryError:
        """The error for a failed request of a segment of ``alloc_size`` bytes,
        given the statistics rows (``_stat_rows``) at the failure and the
        largest free block if known."""
        total = self._backend.total_memory()
        device_free = None if total is None else max(total - self._backend.bytes_held, 0)
        if self._history is not None:
            self._trace("oom", device_free or 0, alloc_size)
        allocated, reserved = rows[ALLOCATED_BYTES][0], rows[RESERVED_BYTES][0]
        cached = reserved - allocated
        limit = self.memory_limit
        if (limit is not None and reserved + alloc_size > limit
                and (device_free is None or device_free >= alloc_size)):
            reason = "limit"
        elif cached >= alloc_size or cached > allocated:
            reason = "fragmentation"
        else:
            reason = "exhausted" if total is not None and device_free < alloc_size else "backend"
        if self._brief_oom:
            return _report.brief_oom(self._name, n, alloc_size, MIN_BLOCK_SIZE, reason)
        # The stats, the message and the report are built when someone reads them.
        counters = (rows, self._largest_alloc(), total, device_free,
                    self.max_split_size == UNLIMITED)
        return OutOfMemoryError.deferred(
            _report.Failure(self, counters, self._fingerprint_snapshot(),
                            self._largest_free() if largest is None else largest, limit),
            self._name, n, alloc_size, MIN_BLOCK_SIZE, reason)

    @staticmethod
    def _bin_summary(records: np.ndarray) -> list[dict]:
        return []  # PyTorch's report has no size bins

    @classmethod
    def _failure_stats(cls, counters: tuple, largest: int, limit: int | None) -> AllocatorStats:
        rows, largest_alloc = counters[0], counters[1]
        return cls._stats_from(rows, largest, largest_alloc, limit or 0)

    @staticmethod
    def _failure_message(error: OutOfMemoryError, stats: AllocatorStats, counters: tuple,
                         limit: int | None) -> str:
        _, _, total, device_free, split_unlimited = counters
        return _oom_message(error.allocator_name, error.num_bytes, error.rounded_bytes, total,
                            device_free, limit, stats, error.reason, split_unlimited)

    def _fold_kernel_failures(self) -> None:
        """Add to the event counters the failures a kernel counted itself (none here)."""

    def _fingerprint_snapshot(self):
        """What ``report.Failure`` keeps to tell later whether the allocator
        changed (None: nothing, the report is built at once)."""
        return None

    def _trace(self, action: str, addr: int, size: int) -> None:
        self._history.append({"action": action, "addr": int(addr), "size": int(size),
                              "stream": 0, "time_us": time.time_ns() // 1000, "frames": []})

    def _beyond_one_eib(self, n: int) -> OutOfMemoryError:
        """PyTorch's up-front refusal of a request of 1 EiB or more."""
        return OutOfMemoryError(
            f"{self._name}: out of memory. Tried to allocate more than 1EB memory.",
            allocator_name=self._name, num_bytes=n, reason="limit")

    def _report_fingerprint(self):
        """Something that changes whenever the blocks do, cheap to take (None:
        no such thing, so an out-of-memory report is built at once)."""
        return None

    def _usage(self) -> tuple[int, int]:
        """(allocated bytes, reserved bytes), cheaply: what a replay samples per event."""
        st = self._stat_array()
        return (int(st[ALLOCATED_BYTES, _ALL_POOLS, _CURRENT]),
                int(st[RESERVED_BYTES, _ALL_POOLS, _CURRENT]))

    def _allocator_stats(self) -> AllocatorStats:
        return self._stats_from(self._stat_rows(), self._largest_free(), self._largest_alloc(),
                                self.memory_limit or 0)

    def _stat_rows(self) -> list:
        # The "all" entries of allocation, allocated_bytes and reserved_bytes,
        # read at once: [current, peak, allocated, freed] each.
        return self._stat_array()[:RESERVED_BYTES + 1, _ALL_POOLS].tolist()

    @staticmethod
    def _stats_from(rows: list, largest: int, largest_alloc: int, limit: int) -> AllocatorStats:
        """Stats from counters: static, so that a deferred build holds no allocator."""
        allocation, allocated = rows[ALLOCATION], rows[ALLOCATED_BYTES]
        reserved = rows[RESERVED_BYTES]
        free = reserved[0] - allocated[0]
        return AllocatorStats(
            num_allocs=allocation[2],
            bytes_in_use=allocated[0],
            peak_bytes_in_use=allocated[1],
            largest_alloc_size=largest_alloc,
            bytes_limit=limit,
            bytes_reserved=reserved[0],
            peak_bytes_reserved=reserved[1],
            largest_free_block_bytes=largest,
            fragmentation=(free - largest) / free if free > 0 else 0.0,
        )

    def _reset_peaks(self) -> None:
        st = self._stat_array()
        st[:, :, _PEAK] = st[:, :, _CURRENT]

    def _reset_accumulated(self) -> None:
        st = self._stat_array()
        st[:, :, _ALLOCATED] = 0
        st[:, :, _FREED] = 0
        self._fold_kernel_failures()  # before they are zeroed with the rest
        for k in self._events:
            self._events[k] = 0

    def _segments(self) -> list[dict]:
        records = self._records()
        out = []
        for base, size, pool in self._segment_list():
            lo = int(np.searchsorted(records["address"], base))
            hi = int(np.searchsorted(records["address"], base + size))
            blocks = [{
                "address": int(r["address"]), "size": int(r["size"]),
                "requested_size": int(r["requested_size"]),
                "state": "active_allocated" if r["in_use"] else "inactive", "frames": [],
            } for r in records[lo:hi]]
            used = [b for b in blocks if b["state"] == "active_allocated"]
            out.append({
                "device": 0, "address": base, "total_size": size,
                "allocated_size": sum(b["size"] for b in used),
                "active_size": sum(b["size"] for b in used),
                "requested_size": sum(b["requested_size"] for b in used),
                "stream": 0, "segment_type": POOL_NAMES[pool], "segment_pool_id": (0, 0),
                "is_expandable": self.expandable_segments, "frames": [], "blocks": blocks,
            })
        return out

    def _settings(self) -> dict:
        return {
            "memory_limit": self.memory_limit,
            "max_split_size": -1 if self.max_split_size == UNLIMITED else self.max_split_size,
            "max_non_split_rounding": self.max_non_split_rounding,
            "roundup_power2_divisions": list(self.roundup_power2_divisions),
            "garbage_collection_threshold": self.garbage_collection_threshold,
            "expandable_segments": self.expandable_segments,
        }

    def _region_list(self) -> list[tuple[int, int]]:
        return [(b, s) for b, s, _ in self._segment_list()]

    # ------------------------------------------------------------------ block store
    # Subclasses implement these; all are called with the lock held.
    @abc.abstractmethod
    def _round_size(self, n: int) -> int:
        raise NotImplementedError

    @abc.abstractmethod
    def _find_block(self, n: int) -> int:
        """Best fit from the cache (``get_free_block`` + ``alloc_found_block``), or 0."""
        raise NotImplementedError

    @abc.abstractmethod
    def _add_segment(self, ptr: int, size: int, pool: int):
        """Record a new segment (updating segment stats); returns its key."""
        raise NotImplementedError

    @abc.abstractmethod
    def _take_from_segment(self, segment, n: int) -> int:
        raise NotImplementedError

    @abc.abstractmethod
    def _release_segment(self, segment) -> tuple[int, int]:
        """Forget a free, unsplit segment (updating stats); returns ``(ptr, size)``."""
        raise NotImplementedError

    @abc.abstractmethod
    def _free_block(self, ptr: int) -> int | None:
        raise NotImplementedError

    def _try_allocate_expandable(self, pool: int, size: int):
        """PyTorch's ``try_allocate_expandable_block``: a free block of at least
        ``size`` bytes, mapping pages as needed; None when mapping fails."""
        raise NotImplementedError(f"{type(self).__name__} has no expandable segments")

    def _unmap_free_blocks(self, pool: int, blocks: list[tuple[int, int]]) -> None:
        """PyTorch's ``unmap_block`` on each free expandable block ``(size, ptr)``, and
        ``release_expandable_segment`` on every segment left with nothing mapped."""
        raise NotImplementedError(f"{type(self).__name__} has no expandable segments")

    @abc.abstractmethod
    def _free_blocks(self, pool: int) -> np.ndarray:
        """The pool's free blocks as ``FREE_BLOCK_DTYPE``, in ``(size, ptr)`` order."""
        raise NotImplementedError

    @abc.abstractmethod
    def _lookup(self, ptr: int) -> tuple[int, int, int] | None:
        raise NotImplementedError

    @abc.abstractmethod
    def _stat_array(self) -> np.ndarray:
        """The live ``(NUM_STATS, 3, 4)`` statistics array."""
        raise NotImplementedError

    @abc.abstractmethod
    def _largest_alloc(self) -> int:
        raise NotImplementedError

    @abc.abstractmethod
    def _set_largest_alloc(self, value: int) -> None:
        raise NotImplementedError

    @abc.abstractmethod
    def _largest_free(self) -> int:
        raise NotImplementedError

    @abc.abstractmethod
    def _records(self) -> np.ndarray:
        raise NotImplementedError

    @abc.abstractmethod
    def _segment_list(self) -> list[tuple[int, int, int]]:
        """``[(base, size, pool), ...]`` in address order."""
        raise NotImplementedError


assert NUM_STATS == len(STAT_NAMES)
