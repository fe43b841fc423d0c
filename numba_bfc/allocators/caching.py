"""``CachingAllocator``: PyTorch's CUDA caching-allocator policy as Numba kernels."""

from __future__ import annotations

import sys

import numpy as np

from ..errors import OutOfMemoryError
from ..framework.validate import MAX_INT64
from ..kernels import layout as L
from ..policies import caching as C
from ..policies.batch import run_batch_caching
from ._fastcall import Kernel, fast_method
from ._options import UNLIMITED
from ._tables import LARGEST_FREE_CHUNK, TableStore
from .caching_base import FREE_BLOCK_DTYPE, ONE_EIB, CachingBase

__all__ = ["CachingAllocator"]

# Each serves a caller with or without the lock (the last argument).
_ALLOCATE = Kernel(C.caching_allocate_op)
_FAILED_HERE = L.FAILED_HERE
_DEALLOCATE = Kernel(C.caching_deallocate_op)
_ROUND_SIZE = Kernel(C.round_size)
_ADD_SEGMENT = Kernel(C.caching_add_segment_op)
_FROM_SEGMENT = Kernel(C.caching_allocate_from_segment_op)
_RELEASE_SEGMENT = Kernel(C.caching_release_segment_op)
_ADD_EXPANDABLE = Kernel(C.caching_add_expandable_op)
_FIND_EXPANDABLE = Kernel(C.find_expandable_block_op)
_MAP_BLOCK = Kernel(C.caching_map_block_op)
_UNMAP_BLOCK = Kernel(C.caching_unmap_block_op)
_RELEASE_EXPANDABLE = Kernel(C.caching_release_expandable_op)
_TAKE_BLOCK = Kernel(C.caching_take_block_op)


_RESERVED_SLOT = C.C_STATS + C.RESERVED_BYTES * 12  # reserved_bytes.all.current


class _Grown(int):
    """A free block handle that ``_try_allocate_expandable`` grew (not a region row)."""


class CachingAllocator(TableStore, CachingBase):
    """PyTorch's caching allocator policy (single stream), on the BFC kernels' tables.

    Parameters
    ----------
    backend : SubAllocator
        Where segments come from (``numba_bfc.backends``).
    memory_limit : int or str, optional
        Most bytes of segments held (PyTorch's per-process memory fraction,
        in bytes); checked before asking the backend. None: only the backend limits.
    max_split_size : int or str, optional
        Blocks at least this big are never split, and normal requests never
        take them (PyTorch's ``max_split_size_mb``, here in bytes; > 20 MiB).
    roundup_power2_divisions : int, dict or str, optional
        Round sizes up to one of N steps between powers of two: an int for
        every interval, ``{interval_mb: N, ">": N}`` or ``"[256:1,>:4]"``.
    garbage_collection_threshold : float, optional
        In (0, 1): before a new segment, release the oldest cached unsplit
        large segments until reserved memory is under ``threshold * limit``.
        Needs a limit, as in PyTorch.
    name : str, optional
    memory_fraction : float, optional
        The limit as a fraction of ``backend.total_memory()`` (instead of
        ``memory_limit``).
    max_non_split_rounding : int, optional
        How much bigger than an oversize request a cached oversize block may be
        and still serve it (default 20 MiB).

    Options not given are read from ``NUMBA_BFC_CONF`` (``max_split_size_mb``,
    ``roundup_power2_divisions``, ``garbage_collection_threshold``,
    ``memory_fraction``, ...), then defaults. Every operation is one kernel
    call, lock-free where it may be, else under the allocator's lock.

    Examples
    --------
    >>> from numba_bfc import CachingAllocator
    >>> from numba_bfc.backends import VirtualSubAllocator
    >>> c = CachingAllocator(VirtualSubAllocator())
    >>> p = c.allocate_raw(1000)
    >>> c.allocated_size(p), c.memory_stats()["reserved_bytes.all.current"]
    (1024, 2097152)
    >>> c.deallocate_raw(p)
    """

    _RUN_BATCH = Kernel(run_batch_caching)
    _ALLOCATE = _ALLOCATE  # as BFC's (TableStore._arm_fast_paths)
    _DEALLOCATE = _DEALLOCATE
    _IN_USE_SLOT = C.C_STATS + C.ALLOCATED_BYTES * 12  # allocated_bytes.all.current

    def __init__(self, backend, memory_limit=None, max_split_size=None,
                 roundup_power2_divisions=None, garbage_collection_threshold=None,
                 name=None, *, memory_fraction=None, max_non_split_rounding=None,
                 expandable_segments=None) -> None:
        super().__init__(backend, memory_limit, max_split_size, roundup_power2_divisions,
                         garbage_collection_threshold, name, memory_fraction=memory_fraction,
                         max_non_split_rounding=max_non_split_rounding,
                         expandable_segments=expandable_segments)
        self._adopt_tables(L.new_tables(C.NUM_POOLS * C.POOL_BINS, C.MIN_BLOCK_SIZE,
                                        state_size=C.CACHING_STATE_SIZE,
                                        space_bins=C.POOL_BINS))
        st = self._state
        st[C.C_MAX_SPLIT_SIZE] = self.max_split_size
        st[C.C_MAX_NON_SPLIT_ROUNDING] = self.max_non_split_rounding
        st[C.C_GC_ACTIVE] = int(self._gc_enabled)
        st[C.C_EXPANDABLE] = int(self.expandable_segments)
        st[C.C_DIVISIONS:C.C_DIVISIONS + C.ROUNDUP_INTERVALS] = self.roundup_power2_divisions
        self._stats = st[C.C_STATS:C.C_LEASE_ON].reshape(C.NUM_STATS, 3, 4)
        self._lease_inputs = None  # what _open_lease last wrote into the state
        st[L.S_FAIL_LIMIT] = self._fail_limit()
        self._arm()

    def _arm(self) -> None:
        # With a memory history every call takes the long way (it records each).
        on = self._history is None
        self._arm_fast_paths(ONE_EIB - 1 if on else 0, on)

    def _fail_limit(self) -> int:
        """``S_FAIL_LIMIT``: the memory limit where the slow path is PyTorch's
        new segment, release of the cached segments and retry, and nothing else
        (no garbage collection, oversize release, expandable segments or
        history), so that the kernel may fail what that path would; else 0."""
        if (self.memory_limit is None or self._gc_enabled or self.max_split_size != UNLIMITED
                or self.expandable_segments or self._history is not None):
            return 0
        return min(self.memory_limit, MAX_INT64)

    def record_memory_history(self, enabled: bool = True, max_entries: int = sys.maxsize,
                              clear_history: bool = False) -> None:
        super().record_memory_history(enabled, max_entries, clear_history)
        with self._lock:  # a failure recorded in the history is the slow path's
            self._state[L.S_FAIL_LIMIT] = self._fail_limit()
            self._arm()

    record_memory_history.__doc__ = CachingBase.record_memory_history.__doc__

    # Fast paths: one kernel call each, lock-free first (kernels.guard), then
    # under the lock; everything unusual goes to CachingBase. With the compiled
    # bridge (_fastcall.fast_method), as BFCAllocator's.
    def allocate_raw(self, num_bytes: int, alignment: int = C.MIN_BLOCK_SIZE,
                     attributes=None) -> int:
        address, call, largest = self._fast_allocate
        # The default alignment (the same object as MIN_BLOCK_SIZE) is tested first.
        if not (type(num_bytes) is int and 0 < num_bytes <= largest and attributes is None
                and (alignment is C.MIN_BLOCK_SIZE
                     or (type(alignment) is int and 0 < alignment <= C.MIN_BLOCK_SIZE
                         and not alignment & (alignment - 1)))):
            return super().allocate_raw(num_bytes, alignment, attributes)
        p = call(address, num_bytes, False)
        if p > 0:
            return p
        return self.__allocate_after(num_bytes, p)

    def __allocate_after(self, num_bytes: int, p: int) -> int:
        """The common request after the lock-free kernel answered ``p`` (not an address)."""
        if p == _FAILED_HERE:
            raise self._failed_here(num_bytes)
        address, call, _ = self._fast_allocate
        with self._lock:
            p = call(address, num_bytes, True)
            if p > 0:
                return p
            if p == _FAILED_HERE:
                raise self._failed_here(num_bytes)
            # NOT_FOUND already counted a lookup on the GC clock: do not look again.
            if p == L.NOT_FOUND:
                return self._malloc_slow(num_bytes)
            return self._malloc(num_bytes)

    allocate_raw.__doc__ = CachingBase.allocate_raw.__doc__
    allocate_raw = fast_method(allocate_raw, __allocate_after, "_allocate_entry")

    def deallocate_raw(self, ptr: int | None) -> None:
        address, call, largest = self._fast_deallocate
        if type(ptr) is not int or not 0 < ptr <= largest:
            return super().deallocate_raw(ptr)
        answer = call(address, ptr, False)
        if answer > 0:  # the freed size
            return
        self.__deallocate_after(ptr, answer)

    def __deallocate_after(self, ptr: int, answer: int) -> None:
        """The common free after the lock-free kernel answered ``answer`` (not a size)."""
        address, call, _ = self._fast_deallocate
        with self._lock:
            if self._deferred_frees is not None:
                return self._free(ptr)  # a free while the slow path holds blocks: later
            if call(address, ptr, True) < 0:
                self._free(ptr)  # not live: the base class names the problem

    deallocate_raw.__doc__ = CachingBase.deallocate_raw.__doc__
    deallocate_raw = fast_method(deallocate_raw, __deallocate_after, "_deallocate_entry",
                                 releases=True)

    # ------------------------------------------------------------------ table store
    def _open_lease(self, fail_quietly: bool = False) -> None:
        # Only where the slow path's first step would be the backend call the
        # kernel makes instead (caching_base._malloc_slow_held).
        if self._history is not None or self._gc_enabled or self.expandable_segments:
            return
        backend = self._backend
        lease = backend.address_lease()
        if lease is None:
            return
        st = self._state
        limit = MAX_INT64 if self.memory_limit is None else min(self.memory_limit, MAX_INT64)
        # With a max_split_size, the slow path may release oversize blocks first.
        unlimited_split = self.max_split_size == UNLIMITED
        # The kernel moves the lease back after releasing cached segments only
        # where they are all the backend holds (policies.caching.release_and_retry).
        releases = unlimited_split and backend.bytes_held == self._usage()[1]
        inputs = (lease, limit, fail_quietly and unlimited_split, releases)
        if inputs != self._lease_inputs:  # else the slots still hold them
            self._lease_inputs = inputs
            st[C.C_LEASE:C.C_LEASE_LOG] = lease
            st[C.C_LEASE_LIMIT] = limit
            st[C.C_FAIL_QUIETLY] = inputs[2]
            st[C.C_LEASE_RELEASES] = releases
        st[C.C_LEASE_ON] = 1

    def _close_lease(self) -> int:
        st = self._state
        if not st[C.C_LEASE_ON]:
            return 0
        st[C.C_LEASE_ON] = 0
        entries = int(st[C.C_LEASE_ENTRIES])
        if entries:
            st[C.C_LEASE_ENTRIES] = 0
            self._lease_inputs = None  # the slots moved on: write them afresh
            self._replay_lease_log(st[C.C_LEASE_LOG:C.C_LEASE_LOG + 2 * entries].tolist())
        retried = int(st[C.C_RETRIED])
        if retried:
            st[C.C_RETRIED] = 0
            self._events["num_alloc_retries"] += retried
            self._events["num_sync_all_streams"] += retried
        failed = int(st[C.C_FAILED_HERE])
        if failed:
            st[C.C_FAILED_HERE] = 0
            self._count_failures(failed)
        return failed

    def _replay_lease_log(self, log: list) -> None:
        """Do to the backend what the kernel did under the lease: segments
        made (size > 0) and given back (size < 0), in order."""
        sizes = log[1::2]
        self._backend.record_leased(log[::2], sizes)
        made = sum(1 for size in sizes if size > 0)
        self._events["num_device_alloc"] += made
        self._events["num_device_free"] += len(sizes) - made

    def _batch_alignment(self, alignment: int) -> int:
        return self._check_alignment(alignment)

    def _largest_request(self) -> int:
        return ONE_EIB - 1

    def _request_too_large(self, n: int, alignment: int):
        return self._beyond_one_eib(n)

    def _serve_not_found(self, n: int, alignment: int) -> int:
        return self._malloc_slow(n)

    # ------------------------------------------------------------------ block store
    def _round_size(self, n: int) -> int:
        return int(_ROUND_SIZE.call(n, self._state))

    def _find_block(self, n: int) -> int:
        p = self._until_room(_ALLOCATE.call, self._state_address, n, True)
        if p == _FAILED_HERE:
            raise self._failed_here(n)
        return p if p > 0 else 0

    def _failed_here(self, n: int) -> OutOfMemoryError:
        """The error for a request the kernel failed itself (``FAILED_HERE``,
        counted in ``C_FAILED_ALONE``): no lock needed, the counters are one
        read of the state."""
        st = self._state
        return self._failure(n, st.item(L.S_FAILED_ROUNDED), self._stat_rows(),
                             st.item(L.S_FAILED_LARGEST_FREE))

    def _fingerprint_snapshot(self) -> list:
        return self._snapshot_slots.tolist()

    def _fold_kernel_failures(self) -> None:
        st = self._state
        failed = st.item(C.C_FAILED_ALONE)
        if failed:
            st[C.C_FAILED_ALONE] = 0
            self._count_failures(failed)

    def _count_failures(self, failed: int) -> None:
        """Count ``failed`` failures a kernel decided, as ``_malloc_slow_held``
        counts each: a retry after releasing the cache (a sync of every
        stream), and the failure."""
        events = self._events
        events["num_alloc_retries"] += failed
        events["num_sync_all_streams"] += failed
        events["num_ooms"] += failed

    def _add_segment(self, ptr: int, size: int, pool: int) -> int:
        while True:
            r = _ADD_SEGMENT.call(self._state, ptr, size, pool)
            if r != L.NEED_ROWS:
                return int(r)
            self._grow_tables()

    def _take_from_segment(self, segment: int, n: int) -> int:
        if isinstance(segment, _Grown):
            return int(self._until_room(_TAKE_BLOCK.call, self._state, int(segment), n))
        return int(self._until_room(_FROM_SEGMENT.call, self._state, segment, n))

    def _release_segment(self, segment: int) -> tuple[int, int]:
        base = int(self._regions[segment]["base"])
        size = int(_RELEASE_SEGMENT.call(self._state, segment))
        return base, size

    def _free_block(self, ptr: int) -> int | None:
        r = _DEALLOCATE.call(self._state_address, ptr, True)
        return None if r < 0 else int(r)

    def _whole_free_segments(self) -> list[int]:
        # Far cheaper than _free_blocks on a big chunk table: a kernel finds
        # the free regions, and only those rows are sorted.
        rows = self._free_region_rows()
        if self.expandable_segments:
            rows = rows[self._regions["page"][rows] == 0]
        if rows.shape[0] <= 1:  # the usual case: nothing to order
            return rows.tolist()
        regions = self._regions[rows]
        # LARGE_POOL (1) before SMALL_POOL (0), then (size, address).
        return rows[np.lexsort((regions["base"], regions["size"], -regions["bin"]))].tolist()

    def _free_blocks(self, pool: int) -> np.ndarray:
        ch = self._chunks
        # A free block's bin is one of its pool's size bins (POOL_BINS each).
        rows = ch[(ch["size"] > 0) & (ch["allocation_id"] == -1)
                  & (ch["bin"] // C.POOL_BINS == pool)]
        rows = rows[np.lexsort((rows["ptr"], rows["size"]))]
        out = np.zeros(rows.shape[0], dtype=FREE_BLOCK_DTYPE)
        out["size"] = rows["size"]
        out["ptr"] = rows["ptr"]
        out["segment"] = rows["region"]
        out["split"] = (rows["prev"] != L.NO_HANDLE) | (rows["next"] != L.NO_HANDLE)
        out["gc_count"] = self._state[C.C_GC_CLOCK + pool] - rows["freed_at_count"]
        out["expandable"] = self._regions["page"][rows["region"]] > 0
        return out

    def _stat_array(self) -> np.ndarray:
        stats = self._stats
        for kept, mirror in C.MIRRORED_STATS:  # what the kernels leave out
            stats[mirror] = stats[kept]
        return stats

    def _stat_rows(self) -> list:
        # The rows of the first four statistics only: none is mirrored.
        return self._stats[:C.RESERVED_BYTES + 1, 0].tolist()

    def _usage(self) -> tuple[int, int]:
        st = self._state  # .item(): no 3-D indexing, no NumPy scalar in between
        return st.item(self._IN_USE_SLOT), st.item(_RESERVED_SLOT)

    def _largest_alloc(self) -> int:
        return int(self._state[L.S_LARGEST_ALLOC_SIZE])

    def _set_largest_alloc(self, value: int) -> None:
        self._state[L.S_LARGEST_ALLOC_SIZE] = value

    def _largest_free(self) -> int:
        return int(LARGEST_FREE_CHUNK.call(self._state))

    def _segment_list(self) -> list[tuple[int, int, int]]:
        live = self._live_regions()
        out = [(int(b), int(s), int(p)) for b, s, p, g in zip(
            live["base"], live["size"], live["bin"], live["page"]) if not g]
        if self.expandable_segments:
            # An expandable segment shows as its runs of mapped blocks, as in PyTorch.
            ch = self._chunks
            rows = ch[(ch["size"] > 0) & (ch["allocation_id"] != L.UNMAPPED)
                      & (self._regions["page"][ch["region"]] > 0)]
            rows = rows[np.argsort(rows["ptr"], kind="stable")]
            start = end = pool = run_region = None
            for ptr, size, region in zip(rows["ptr"].tolist(), rows["size"].tolist(),
                                         rows["region"].tolist()):
                if start is not None and ptr == end and region == run_region:
                    end += size
                    continue
                if start is not None:
                    out.append((start, end - start, pool))
                start, end, run_region = ptr, ptr + size, region
                pool = int(self._regions[region]["bin"])
            if start is not None:
                out.append((start, end - start, pool))
        return sorted(out)

    def _region_list(self) -> list[tuple[int, int]]:
        return [(b, s) for b, s, _ in self._segment_list()]

    # ------------------------------------------------------------------ expandable segments
    def _try_allocate_expandable(self, pool: int, size: int) -> _Grown | None:
        c = self._find_expandable_block(pool, size)
        if c is None:
            return None
        ch = self._chunks
        if ch[c]["allocation_id"] == L.UNMAPPED:
            c = self._map_block(c, min(int(ch[c]["size"]), size))
            if c is None:
                return None
        while int(self._chunks[c]["size"]) < size:
            # c is free and mapped, and an unmapped block follows it (find_expandable_block
            # found the room, or the new segment holds size).
            nxt = int(self._chunks[c]["next"])
            if nxt == L.NO_HANDLE or self._chunks[nxt]["allocation_id"] != L.UNMAPPED:
                raise AssertionError(f"expandable block {c} cannot grow to {size} bytes")
            c = self._map_block(nxt, min(size - int(self._chunks[c]["size"]),
                                         int(self._chunks[nxt]["size"])))
            if c is None:
                return None
        return _Grown(c)

    def _find_expandable_block(self, pool: int, size: int) -> int | None:
        regions = self._regions
        rows = np.flatnonzero((regions["size"] > 0) & (regions["page"] > 0)
                              & (regions["bin"] == pool))
        for r in rows[np.argsort(regions["base"][rows])].tolist():
            c = _FIND_EXPANDABLE.call(self._state, r, size)
            if c >= 0:
                return int(c)
        page = C.SMALL_BUFFER if pool == C.SMALL_POOL else C.LARGE_BUFFER
        reserved = self._reserve_address_space(page, size)
        if reserved is None:
            return None
        r = self._until_room(_ADD_EXPANDABLE.call, self._state, reserved[0], reserved[1], pool,
                             page)
        return int(self._regions[r]["first"])

    def _map_block(self, h: int, size: int) -> int | None:
        row = self._chunks[h]
        region = self._regions[row["region"]]
        base, page, ptr = int(region["base"]), int(region["page"]), int(row["ptr"])
        first = (ptr - base) // page
        last = -(-(ptr + size - base) // page)
        nbytes = (last - first) * page
        if not self._map_pages(ptr, nbytes):
            return None
        return int(self._until_room(_MAP_BLOCK.call, self._state, h, nbytes))

    def _unmap_free_blocks(self, pool: int, blocks: list[tuple[int, int]]) -> None:
        for size, ptr in blocks:
            ch = self._chunks
            h = int(np.flatnonzero((ch["ptr"] == ptr) & (ch["size"] == size)
                                   & (ch["allocation_id"] == -1))[0])
            r = int(ch[h]["region"])
            base, page = int(self._regions[r]["base"]), int(self._regions[r]["page"])
            first = -(-(ptr - base) // page)
            last = (ptr + size - base) // page
            if first >= last:
                continue  # no whole page inside
            start, nbytes = base + first * page, (last - first) * page
            self._unmap_pages(start, nbytes)
            u = int(self._until_room(_UNMAP_BLOCK.call, self._state, h, start, nbytes))
            if self._chunks[u]["prev"] == L.NO_HANDLE and self._chunks[u]["next"] == L.NO_HANDLE:
                _RELEASE_EXPANDABLE.call(self._state, r)  # nothing of it is mapped
                self._release_address_space(base)
