"""``BFCAllocator``: TensorFlow's BFC allocator as Numba kernels over NumPy tables."""

from __future__ import annotations

import numpy as np

from ..errors import InvalidPointerError
from ..kernels import layout as L
from ..kernels.chunks import (
    add_region,
    free_region_rows,
    largest_free_chunk,
    merge_timestamped_chunks,
    remove_region,
)
from ..kernels.ptrmap import map_rehash
from ..policies.bfc import (
    bfc_allocate,
    bfc_deallocate,
    bfc_deallocate_timestamped,
    bfc_lookup,
    bfc_run_batch,
)
from . import _report
from ._bfc_base import MIN_ALLOCATION, NUM_BINS, BFCBase
from ._fastcall import Kernel
from ._validate import MAX_INT64, check_alignment

__all__ = ["BFCAllocator"]

_ALLOCATE = Kernel(bfc_allocate)
_DEALLOCATE = Kernel(bfc_deallocate)

ALLOCATE = 0
FREE = 1


class BFCAllocator(BFCBase):
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
    memory_limit:8GiB"``), then defaults. Every operation is one kernel call
    under a lock; tables grow by doubling.

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
        (self._chunks, self._bins, self._regions, self._pmap, self._state,
         self._tsq) = L.new_tables(NUM_BINS, MIN_ALLOCATION)
        self._state[L.S_MAX_INTERNAL_FRAGMENTATION] = self._max_internal_fragmentation

    # Fast paths: one kernel call each; everything unusual goes to BFCBase.
    def allocate_raw(self, num_bytes: int, alignment: int = MIN_ALLOCATION,
                     attributes=None, *, freed_before: int = 0) -> int:
        if (type(num_bytes) is not int or not 0 < num_bytes <= self.memory_limit
                or alignment != MIN_ALLOCATION or type(alignment) is not int
                or freed_before or self._timestamps_used or attributes is not None):
            return super().allocate_raw(num_bytes, alignment, attributes,
                                        freed_before=freed_before)
        with self._lock:
            p = _ALLOCATE.call(self._chunks, self._bins, self._regions, self._pmap, self._state,
                               num_bytes, MIN_ALLOCATION, 0)
            if p > 0:
                return p
            if p == L.NEED_ROWS:
                p = self._try_allocate(num_bytes, MIN_ALLOCATION, 0)
                if p:
                    return p
            return self._allocate_slow(num_bytes, MIN_ALLOCATION, 0)

    def deallocate_raw(self, ptr: int | None) -> None:
        if (type(ptr) is not int or not 0 < ptr <= MAX_INT64
                or self._timing_counter is not None):
            return super().deallocate_raw(ptr)
        with self._lock:
            if _DEALLOCATE.call(self._chunks, self._bins, self._regions, self._pmap,
                                self._state, ptr) < 0:
                raise self._invalid_pointer(ptr)

    def run_batch(self, ops, ids, sizes, alignment: int = MIN_ALLOCATION) -> np.ndarray:
        """Run a whole array of operations inside the kernels.

        Parameters
        ----------
        ops : array of int
            0 = allocate, 1 = free.
        ids : array of int
            Allocation ids in ``[0, max_id]``: a free names the id of an earlier
            allocation in the same batch (ids may be reused once freed).
        sizes : array of int
            Bytes for each allocation (ignored for frees; 0 allocates nothing).

        Returns
        -------
        numpy.ndarray of int64
            The address each allocation got (0 for frees).

        Raises
        ------
        OutOfMemoryError
            At the first allocation that cannot be served; operations before it
            have been applied and allocations made so far stay live.
        """
        ops = np.ascontiguousarray(ops, dtype=np.int8)
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        sizes = np.ascontiguousarray(sizes, dtype=np.int64)
        alignment = check_alignment(alignment)
        if not (ops.shape == ids.shape == sizes.shape) or ops.ndim != 1:
            raise ValueError("ops, ids and sizes must be 1-D arrays of the same length")
        if ops.size and (((ops != ALLOCATE) & (ops != FREE)).any()):
            raise ValueError("ops must contain only 0 (allocate) and 1 (free)")
        if ids.size and ids.min() < 0:
            raise ValueError("ids must be >= 0")
        if sizes.size and sizes.min() < 0:
            raise ValueError("sizes must be >= 0")
        if sizes.size and int(sizes.max()) > self.memory_limit:
            i = int(np.argmax(sizes > self.memory_limit))
            with self._lock:
                raise self._out_of_memory(int(sizes[i]), 0, alignment, "limit")
        id_ptr = np.full(int(ids.max()) + 1 if ids.size else 1, -1, dtype=np.int64)
        out = np.zeros(ops.shape[0], dtype=np.int64)
        i = 0
        with self._lock:
            if self._timestamps_used:
                self._merge_timestamped(0, self._safe_frontier)
            while True:
                i, code = bfc_run_batch(self._chunks, self._bins, self._regions, self._pmap,
                                        self._state, ops, ids, sizes, alignment, id_ptr, out, i)
                if code == 0:
                    return out
                if code == L.NEED_ROWS:
                    self._grow_tables()
                elif code == L.NOT_FOUND:
                    p = self._allocate_slow(int(sizes[i]), alignment, 0)
                    id_ptr[ids[i]] = p
                    out[i] = p
                    i += 1
                else:
                    raise InvalidPointerError(
                        f"{self._name}: batch operation {i} frees id {int(ids[i])}, which is "
                        "not live in this batch", ptr=0, kind="unknown")

    @property
    def tables(self) -> dict[str, np.ndarray]:
        """The live tables (``chunks``, ``bins``, ``regions``, ``pointer_map``,
        ``state``), for inspection; do not modify them."""
        return {"chunks": self._chunks, "bins": self._bins, "regions": self._regions,
                "pointer_map": self._pmap, "state": self._state}

    # ------------------------------------------------------------------ chunk store
    def _grow_tables(self) -> None:
        st = self._state
        if st[L.S_FREE_ROWS] < L.ROWS_PER_OPERATION:
            self._chunks = L.grow_chunks(self._chunks, st)
        if 2 * (st[L.S_MAP_COUNT] + 1) > self._pmap.shape[0]:
            grown = np.zeros((2 * self._pmap.shape[0], 2), dtype=np.int64)
            map_rehash(self._pmap, grown, st)
            self._pmap = grown
        if st[L.S_NUM_REGIONS] >= self._regions.shape[0]:
            self._regions = L.grow_regions(self._regions)
        if st[L.S_TSQ_COUNT] >= self._tsq.shape[0]:
            self._tsq = L.grow_queue(self._tsq, st)

    def _try_allocate(self, n: int, alignment: int, freed_before: int) -> int:
        while True:
            p = _ALLOCATE.call(self._chunks, self._bins, self._regions, self._pmap, self._state,
                               n, alignment, freed_before)
            if p != L.NEED_ROWS:
                return p if p > 0 else 0
            self._grow_tables()

    def _add_region(self, ptr: int, size: int) -> None:
        while add_region(self._chunks, self._bins, self._regions, self._state, ptr, size,
                         self._coalesce_regions) == L.NEED_ROWS:
            self._grow_tables()

    def _deallocate_chunk(self, ptr: int, count: int) -> bool:
        while True:
            if count:
                r = bfc_deallocate_timestamped(self._chunks, self._bins, self._regions,
                                               self._pmap, self._state, self._tsq, ptr, count)
            else:
                r = _DEALLOCATE.call(self._chunks, self._bins, self._regions, self._pmap,
                                     self._state, ptr)
            if r != L.NEED_ROWS:
                return r > 0
            self._grow_tables()

    def _lookup(self, ptr: int):
        h = bfc_lookup(self._pmap, ptr)
        if h < 0:
            return None
        row = self._chunks[h]
        return int(row["requested_size"]), int(row["size"]), int(row["allocation_id"])

    def _has_timestamped(self) -> bool:
        return bool(self._state[L.S_TSQ_COUNT])

    def _merge_timestamped(self, required: int, frontier: int) -> bool:
        if not self._state[L.S_TSQ_COUNT]:
            return required == 0
        return bool(merge_timestamped_chunks(self._chunks, self._bins, self._regions,
                                             self._state, self._tsq, required, frontier))

    def _free_regions(self):
        rows = np.empty(self._regions.shape[0], dtype=np.int64)
        n = free_region_rows(self._chunks, self._regions, rows)
        return [(int(r), int(self._regions[r]["base"]), int(self._regions[r]["size"]))
                for r in rows[:n]]

    def _remove_region(self, key) -> None:
        remove_region(self._chunks, self._bins, self._regions, self._state, key)

    def _counters(self) -> dict:
        st = self._state
        return {
            "num_allocs": int(st[L.S_NUM_ALLOCS]),
            "bytes_in_use": int(st[L.S_BYTES_IN_USE]),
            "peak_bytes_in_use": int(st[L.S_PEAK_BYTES_IN_USE]),
            "largest_alloc_size": int(st[L.S_LARGEST_ALLOC_SIZE]),
            "pool_bytes": int(st[L.S_POOL_BYTES]),
            "peak_pool_bytes": int(st[L.S_PEAK_POOL_BYTES]),
        }

    def _clear_counters(self) -> None:
        st = self._state
        st[L.S_NUM_ALLOCS] = 0
        st[L.S_PEAK_BYTES_IN_USE] = st[L.S_BYTES_IN_USE]
        st[L.S_LARGEST_ALLOC_SIZE] = 0

    def _largest_free(self) -> int:
        return int(largest_free_chunk(self._chunks, self._bins))

    def _records(self) -> np.ndarray:
        rows = self._chunks[self._chunks["size"] > 0]
        rows = rows[np.argsort(rows["ptr"], kind="stable")]
        rec = np.zeros(rows.shape[0], dtype=_report.RECORD_DTYPE)
        rec["address"] = rows["ptr"]
        rec["size"] = rows["size"]
        rec["in_use"] = rows["allocation_id"] != -1
        rec["requested_size"] = np.where(rec["in_use"], rows["requested_size"], 0)
        rec["bin"] = rows["bin"]
        rec["allocation_id"] = rows["allocation_id"]
        rec["freed_at_count"] = np.where(rec["in_use"], 0, rows["freed_at_count"])
        return rec

    def _region_list(self):
        live = self._regions[self._regions["size"] > 0]
        live = live[np.argsort(live["base"])]
        return [(int(b), int(s)) for b, s in zip(live["base"], live["size"])]

