"""``BFCAllocator``: TensorFlow's BFC allocator as Numba kernels over NumPy tables."""

from __future__ import annotations

import numpy as np

from ..kernels import layout as L
from ..kernels.operations import (
    add_region_op,
    add_separate_region_op,
    merge_timestamped_op,
)
from ..policies.batch import run_batch_bfc
from ..policies.bfc import (
    bfc_allocate_aligned_op,
    bfc_allocate_op,
    bfc_deallocate_op,
    bfc_deallocate_timestamped_op,
)
from ..stats import AllocatorStats
from ._fastcall import Kernel, fast_method
from ._tables import LARGEST_FREE_CHUNK, REMOVE_REGION, TableStore
from .bfc_base import MIN_ALLOCATION, NUM_BINS, BFCBase, round_bytes

__all__ = ["BFCAllocator"]

_ADD_REGION = Kernel(add_region_op)
_ADD_SEPARATE_REGION = Kernel(add_separate_region_op)
_FAILED_HERE = L.FAILED_HERE
_DEALLOCATE_TIMESTAMPED = Kernel(bfc_deallocate_timestamped_op)
_MERGE_TIMESTAMPED = Kernel(merge_timestamped_op)


def _counters_of(st: list) -> dict:
    """``BFCBase._counters`` from the state's first ``SNAPSHOT_SLOTS`` slots."""
    return {
        "num_allocs": st[L.S_NUM_ALLOCS],
        "bytes_in_use": st[L.S_BYTES_IN_USE],
        "peak_bytes_in_use": st[L.S_PEAK_BYTES_IN_USE],
        "largest_alloc_size": st[L.S_LARGEST_ALLOC_SIZE],
        "pool_bytes": st[L.S_POOL_BYTES],
        "peak_pool_bytes": st[L.S_PEAK_POOL_BYTES],
    }


class BFCAllocator(TableStore, BFCBase):
    """TensorFlow's best-fit-with-coalescing allocator, with TF's exact semantics.

    Parameters
    ----------
    backend : SubAllocator
        Where regions come from (``numba_bfc.backends``).
    memory_limit : int or str, optional
        Most bytes held from the backend (e.g. ``1 << 30`` or ``"1GiB"``);
        defaults to the backend's total memory.
    allow_growth : bool, optional
        True (default): start with a 2 MiB region and double; False: one region
        of the whole limit at first use.
    garbage_collection : bool, optional
        On the out-of-memory path, give entirely free regions back and retry.
    fragmentation_fraction : float, optional
        If > 0, split a chunk whenever keeping it whole would waste at least
        ``fraction * memory_limit`` bytes (default threshold 128 MiB).
    name : str, optional

    Options not given are read from ``NUMBA_BFC_CONF`` (``"allow_growth:true,
    memory_limit:8GiB"``), then defaults. Every operation is one kernel call,
    lock-free while no other thread is inside a multi-step operation (see
    ``kernels.guard``); tables grow by doubling.

    Examples
    --------
    >>> from numba_bfc import BFCAllocator
    >>> from numba_bfc.backends import VirtualSubAllocator
    >>> a = BFCAllocator(VirtualSubAllocator(), memory_limit=1 << 30)
    >>> p = a.allocate_raw(1000)
    >>> a.allocated_size(p)
    1024
    >>> a.deallocate_raw(p)
    """

    def __init__(self, backend, memory_limit=None, allow_growth=None, garbage_collection=None,
                 fragmentation_fraction=None, name=None) -> None:
        super().__init__(backend, memory_limit, allow_growth, garbage_collection,
                         fragmentation_fraction, name)
        self._adopt_tables(L.new_tables(self._NUM_BINS, MIN_ALLOCATION,
                                        state_size=self._STATE_SIZE,
                                        space_bins=self._SPACE_BINS))
        self._state[L.S_MAX_INTERNAL_FRAGMENTATION] = self._max_internal_fragmentation
        # Garbage collection is the slow path's one step the kernel does not
        # take: without it, a kernel that finds no fit and no room to grow
        # fails the allocation itself (policies.bfc.fails_without_growth).
        self._state[L.S_FAIL_LIMIT] = 0 if self._garbage_collection else self._memory_limit
        self._merge_scratch = np.empty((0, 4), dtype=np.int64)  # _merge_timestamped's
        self._arm()

    def _arm(self) -> None:
        # Timed frees take the long way: tagging frees, merging before allocations.
        self._arm_fast_paths(0 if self._timestamps_used else self._memory_limit,
                             self._timing_counter is None)

    def set_timing_counter(self, counter) -> None:
        with self._lock:
            super().set_timing_counter(counter)
            self._arm()

    set_timing_counter.__doc__ = BFCBase.set_timing_counter.__doc__

    # Fast paths: one kernel call each, lock-free first (kernels.guard), then
    # under the lock; everything unusual goes to BFCBase. With the compiled
    # bridge (_fastcall.fast_method), a call with one int makes the lock-free
    # call from C and comes back only for the continuation (__*_after,
    # class-private: a subclass's continuation never stands in for this one).
    def allocate_raw(self, num_bytes: int, alignment: int = MIN_ALLOCATION,
                     attributes=None, *, freed_before: int = 0) -> int:
        address, call, largest = self._fast_allocate
        # The common call, tested cheapest first (a default or small-int 256 is
        # the same object as MIN_ALLOCATION; any other alignment goes the long way).
        if not (alignment is MIN_ALLOCATION and attributes is None and not freed_before
                and type(num_bytes) is int and 0 < num_bytes <= largest):
            return super().allocate_raw(num_bytes, alignment, attributes,
                                        freed_before=freed_before)
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
            if p == L.NEED_ROWS:
                p = self._try_allocate(num_bytes, MIN_ALLOCATION, 0)
                if p:
                    return p
            return self._allocate_slow(num_bytes, MIN_ALLOCATION, 0)

    allocate_raw.__doc__ = BFCBase.allocate_raw.__doc__
    allocate_raw = fast_method(allocate_raw, __allocate_after, "_allocate_entry")

    def _failed_here(self, n: int):
        """The error for a request the kernel failed itself (``FAILED_HERE``):
        no lock needed, the counters are one read of the state."""
        st = self._snapshot_slots.tolist()
        return self._failure(n, -(-n // MIN_ALLOCATION) * MIN_ALLOCATION, MIN_ALLOCATION, None,
                             st, st, st[L.S_BYTES_IN_USE], st[L.S_POOL_BYTES],
                             self._state.item(L.S_FAILED_LARGEST_FREE))

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
            if call(address, ptr, True) < 0:
                raise self._invalid_pointer(ptr)

    deallocate_raw.__doc__ = BFCBase.deallocate_raw.__doc__
    deallocate_raw = fast_method(deallocate_raw, __deallocate_after, "_deallocate_entry",
                                 releases=True)

    # ------------------------------------------------------------------ chunk store
    _RUN_BATCH = Kernel(run_batch_bfc)
    _IN_USE_SLOT = L.S_BYTES_IN_USE
    _STATE_SIZE = L.STATE_SIZE
    _NUM_BINS = NUM_BINS
    _SPACE_BINS = 0  # BFC's bins are size classes, no spaces
    # Each serves a caller with or without the lock (the last argument).
    _ALLOCATE = Kernel(bfc_allocate_op)  # the common request (as the caching policy's)
    _ALLOCATE_ALIGNED = Kernel(bfc_allocate_aligned_op)  # any alignment, timing count
    _DEALLOCATE = Kernel(bfc_deallocate_op)

    def _batch_alignment(self, alignment: int) -> int:
        return alignment

    def _largest_request(self) -> int:
        return self._memory_limit

    def _grow_for(self, n: int, alignment: int) -> bool | None:
        # A batch's common slow path, kept short: the slow path's first growth,
        # then the batch kernel retries (and a miss goes on with
        # ``_serve_after_growth``); so a replay never needs the single-call kernel.
        if self._timestamps_used:
            return None
        self._backend_refused = False
        return self._extend(max(alignment, MIN_ALLOCATION), round_bytes(n))

    def _serve_after_growth(self, n: int, alignment: int) -> int:
        return self._allocate_slow(n, alignment, 0, extended=True)

    def _request_too_large(self, n: int, alignment: int):
        return self._out_of_memory(n, 0, alignment, "limit")

    def _serve_not_found(self, n: int, alignment: int) -> int:
        return self._allocate_slow(n, alignment, 0)

    def _try_allocate(self, n: int, alignment: int, freed_before: int) -> int:
        # The kernels align to at least their quantum (MIN_ALLOCATION), so a smaller
        # alignment is the common request.
        if alignment <= MIN_ALLOCATION and not freed_before:
            p = self._until_room(self._ALLOCATE.call, self._state_address, n, True)
        else:
            p = self._until_room(self._ALLOCATE_ALIGNED.call, self._state, n, alignment,
                                 freed_before, True)
        return p if p > 0 else 0

    def _add_region(self, ptr: int, size: int, pool_bin: int = L.NO_HANDLE) -> None:
        # With no region to join, the kernel without the joining code: a
        # first allocation then compiles none of it.
        may_join = self._coalesce_regions and self._state[L.S_NUM_REGIONS] > 0
        add = _ADD_REGION if may_join else _ADD_SEPARATE_REGION
        while add.call(self._state, ptr, size, pool_bin) == L.NEED_ROWS:
            self._grow_tables()

    def _deallocate_chunk(self, ptr: int, count: int) -> bool:
        while True:
            if count:
                r = _DEALLOCATE_TIMESTAMPED.call(self._state, ptr, count)
            else:
                r = self._DEALLOCATE.call(self._state_address, ptr, True)
            if r != L.NEED_ROWS:
                return r > 0
            self._grow_tables()

    def _has_timestamped(self) -> bool:
        return bool(self._state[L.S_TSQ_COUNT])

    def _merge_timestamped(self, required: int, frontier: int) -> bool:
        queued = int(self._state[L.S_TSQ_COUNT])
        if not queued:
            return required == 0
        # The kernel's scratch space (a kernel makes no arrays, kernels.jit), kept:
        # with timing counts in use every allocation merges first.
        scratch = self._merge_scratch
        if len(scratch) < queued:
            scratch = self._merge_scratch = np.empty((max(queued, 2 * len(scratch)), 4),
                                                     dtype=np.int64)
        return bool(_MERGE_TIMESTAMPED.call(self._state, required, frontier, scratch))

    def _free_regions(self):
        return [(int(r), int(self._regions[r]["base"]), int(self._regions[r]["size"]))
                for r in self._free_region_rows()]

    def _remove_region(self, key) -> None:
        REMOVE_REGION.call(self._state, key)

    def _snapshot(self) -> tuple[list, list]:
        # One read of the state: the counters (a list until the stats are
        # built), which also hold the report's fingerprint.
        st = self._snapshot_slots.tolist()
        return st, st

    @staticmethod
    def _usage_from(counters: list) -> tuple[int, int]:
        return counters[L.S_BYTES_IN_USE], counters[L.S_POOL_BYTES]

    @staticmethod
    def _stats_from(counters: list, largest: int, limit: int) -> AllocatorStats:
        return BFCBase._stats_from(_counters_of(counters), largest, limit)

    def _counters(self) -> dict:
        return _counters_of(self._snapshot_slots.tolist())

    def _usage(self) -> tuple[int, int]:
        st = self._state  # .item(): a Python int without a NumPy scalar in between
        return st.item(L.S_BYTES_IN_USE), st.item(L.S_POOL_BYTES)

    def _clear_counters(self) -> None:
        st = self._state
        st[L.S_NUM_ALLOCS] = 0
        st[L.S_PEAK_BYTES_IN_USE] = st[L.S_BYTES_IN_USE]
        st[L.S_LARGEST_ALLOC_SIZE] = 0

    def _largest_free(self) -> int:
        return int(LARGEST_FREE_CHUNK.call(self._state))
