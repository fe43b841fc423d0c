"""What every table-backed allocator shares: growing tables, records, batches.

``BFCAllocator``, ``CachingAllocator`` and ``CompactAllocator`` keep their
state in the same five tables (``numba_bfc.kernels.layout``); this mixin grows
them when a kernel answers ``NEED_ROWS``, turns them into records for
reporting, looks pointers up, and drives the batch kernel (or, while timed
frees are in play, one public call per operation). Policies supply
``_RUN_BATCH`` (their batch kernel), ``_serve_not_found`` (the slow
path for one allocation), and optionally ``_grow_for``, ``_serve_release_due``
and the serving of what a kernel under an address lease left undone.

Single public calls first try a lock-free kernel (``kernels.guard``): the
lock is a ``TableLock``, which keeps ``state[S_LOCK_DEPTH]`` non-zero while
held, and every table replacement records the new table's address.
"""

from __future__ import annotations

import sys
import threading
import weakref

import numpy as np

from .._gc_pause import pause_gc, resume_gc
from ..errors import InvalidPointerError, OutOfMemoryError
from ..framework.validate import MAX_INT64, check_alignment, check_pointer
from ..kernels import layout as L
from ..kernels.operations import (
    free_region_rows_op,
    largest_free_chunk_op,
    live_chunk_op,
    map_rehash_op,
    remove_region_op,
)
from ..policies.batch import (
    ALLOCATE,
    BAD_OP,
    BATCH_OK,
    FAILED,
    NEGATIVE_ID,
    NEGATIVE_SIZE,
    RELEASE_DUE,
    TOO_LARGE,
    batch_problem,
    sample_usage,
)
from . import report as _report
from ._fastcall import Kernel, KernelEntry, native_enabled

_NO_SERIES = np.zeros((0, 2), dtype=np.int64)


#: Ids below this many per operation (plus a floor) index ``run_batch``'s
#: pairing table as they are; larger ones are numbered first.
_DIRECT_IDS_PER_OPERATION = 4
_DIRECT_IDS_FLOOR = 1 << 16


def _pairing_slots(ids: np.ndarray, top: int) -> tuple[np.ndarray, int]:
    """``run_batch``'s non-negative ``ids`` (the largest ``top``) as indices
    into its pairing table (allocation slot per id), and the table's length:
    the ids themselves where that table stays small, else their rank among
    the distinct ids (a sort, about 70 ns per id for a million: more than the
    kernels take per operation), so that a large id costs no table of that
    size."""
    if not ids.size:
        return ids, 1
    if top < _DIRECT_IDS_PER_OPERATION * ids.size + _DIRECT_IDS_FLOOR:
        return ids, top + 1
    distinct, ranks = np.unique(ids, return_inverse=True)
    return ranks.astype(np.int64, copy=False).reshape(-1), distinct.size


def _integer_array(values, name: str) -> np.ndarray:
    """``values`` as a contiguous int64 array, refusing (before any conversion
    could change a value) anything but integers that int64 holds."""
    array = np.asarray(values)
    if array.dtype.kind == "i":  # the usual case: every signed width fits
        return np.asarray(array, dtype=np.int64, order="C")
    if array.size == 0:
        return np.zeros(array.shape, dtype=np.int64)
    if array.dtype.kind != "u":  # bools, floats, strings, objects
        if not (array.dtype == object and all(type(v) is int for v in array.flat)):
            raise TypeError(f"{name} must be integers, got {array.dtype} values")
        if min(array.flat) < -MAX_INT64 - 1 or max(array.flat) > MAX_INT64:
            raise ValueError(f"{name} must fit in int64")
    elif int(array.max()) > MAX_INT64:
        raise ValueError(f"{name} must fit in int64, got {int(array.max())}")
    # Not ascontiguousarray: it would make a 0-d value a batch of one.
    return np.asarray(array, dtype=np.int64, order="C")


# Each table's state slots: its data address and its length (None: fixed).
_TABLE_SLOTS = {
    "_chunks": (L.S_CHUNKS_ADDR, L.S_CHUNK_ROWS),
    "_bins": (L.S_BINS_ADDR, None),
    "_regions": (L.S_REGIONS_ADDR, L.S_REGION_ROWS),
    "_pmap": (L.S_PMAP_ADDR, L.S_PMAP_SLOTS),
    "_tsq": (L.S_TSQ_ADDR, L.S_TSQ_SLOTS),
}

_SAMPLE_USAGE = Kernel(sample_usage)
_BATCH_PROBLEM = Kernel(batch_problem)
_BATCH_PROBLEMS = {BAD_OP: "ops must contain only 0 (allocate) and 1 (free)",
                   NEGATIVE_ID: "ids must be >= 0", NEGATIVE_SIZE: "sizes must be >= 0"}
_LIVE_CHUNK = Kernel(live_chunk_op)
# Chunk-level operations every table-backed allocator calls.
REMOVE_REGION = Kernel(remove_region_op)
LARGEST_FREE_CHUNK = Kernel(largest_free_chunk_op)
_FREE_REGION_ROWS = Kernel(free_region_rows_op)


# Without a GIL two kernel calls can run at once, so nothing may go lock-free:
# the lock depth then never drops to 0 and every lock-free call steps aside.
LOCK_FREE_CALLS = getattr(sys, "_is_gil_enabled", lambda: True)()


# Automatic garbage collection waits while any allocator's lock is held
# (``_gc_pause``). The lock lets its holder's thread in again, and a collection
# can run at any Python allocation inside a multi-step operation (a slow path,
# a release, a table growth, a lease): a finalizer it ran that calls the
# allocator would find the tables, the backend or the façade's records half
# changed.


class TableLock:
    """A reentrant lock that marks the tables busy while held, with automatic
    garbage collection paused (``pause_gc``).

    ``state[S_LOCK_DEPTH]`` counts the holder's nesting, so lock-free kernel
    calls from other threads step aside until it is released. Supports
    ``with``, ``acquire`` and ``release`` like ``threading.RLock``.
    """

    __slots__ = ("_lock", "_state", "rest_depth")

    def __init__(self, state: np.ndarray) -> None:
        self._lock = threading.RLock()
        self._state = state
        self.rest_depth = 0 if LOCK_FREE_CALLS else 1  # the depth while nobody holds it
        state[L.S_LOCK_DEPTH] = self.rest_depth

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if not self._lock.acquire(blocking, timeout):
            return False
        depth = self._state[L.S_LOCK_DEPTH]  # only the holder changes it
        if depth == self.rest_depth:
            pause_gc()
        self._state[L.S_LOCK_DEPTH] = depth + 1
        return True

    __enter__ = acquire

    def release(self) -> None:
        depth = self._state[L.S_LOCK_DEPTH] - 1
        self._state[L.S_LOCK_DEPTH] = depth
        if depth == self.rest_depth:
            resume_gc()
        self._lock.release()

    def __exit__(self, *exc) -> None:
        self.release()


# The state slots a failure reads at once (one read of a memoryview is
# cheaper than an item each): the BFC counters, and the slots that make the
# report's fingerprint (``TableStore._fingerprint_from``).
SNAPSHOT_SLOTS = 1 + max(L.S_NEXT_ALLOCATION_ID, L.S_MAP_COUNT, L.S_POOL_BYTES,
                         L.S_NUM_REGIONS, L.S_TSQ_COUNT, L.S_NUM_ALLOCS, L.S_BYTES_IN_USE,
                         L.S_PEAK_BYTES_IN_USE, L.S_LARGEST_ALLOC_SIZE, L.S_PEAK_POOL_BYTES)


class TableStore:
    """Mixin over ``self._chunks, _bins, _regions, _pmap, _state, _tsq``; the
    caller holds ``self._lock`` for every method but ``run_batch`` and
    ``_live`` (lock-free first, ``kernels.guard``)."""

    def _adopt_tables(self, tables) -> None:
        """Take fresh tables from ``layout.new_tables`` and the lock that guards them."""
        (self._chunks, self._bins, self._regions, self._pmap, self._state,
         self._tsq) = tables
        self._lock = TableLock(self._state)
        # What the single-call allocate and free take (kernels.guard.state_at);
        # the state array is never replaced, so it stays valid.
        self._state_address = self._state.ctypes.data
        # A memoryview reads the slots into a list in half the time a slice does.
        self._snapshot_slots = memoryview(self._state)[:SNAPSHOT_SLOTS]
        self._note_table_addresses()

    def _arm(self) -> None:
        """Set the fast paths for the allocator's current options (``_arm_fast_paths``)."""
        raise NotImplementedError

    def _arm_fast_paths(self, largest_request: int, frees: bool) -> None:
        """What the public calls' lock-free fast paths read, one tuple each:
        the state's address, the kernel's call (``_fast_call``), and the largest request
        (``allocate_raw``) or pointer (``deallocate_raw``) the fast path takes,
        0 while it is off. One attribute read and an unpack cost less than
        reading what it holds attribute by attribute, and calling the entry
        point less than looking it up on the kernel handle (together about
        0.1 us of a 0.7 us allocate+free pair here). The compiled bridge
        (``_fastcall.fast_method``) reads a ``KernelEntry`` each instead
        (``_kernel_entry``), with the same largest value."""
        largest_pointer = MAX_INT64 if frees else 0
        # The bridge's entries first: a fast path turned off is off for it at once.
        self._allocate_entry = self._kernel_entry(self._ALLOCATE, largest_request)
        self._deallocate_entry = self._kernel_entry(self._DEALLOCATE, largest_pointer)
        self._fast_allocate = (self._state_address, self._fast_call(self._ALLOCATE),
                               largest_request)
        self._fast_deallocate = (self._state_address, self._fast_call(self._DEALLOCATE),
                                 largest_pointer)

    # What the public calls' compiled bridge reads (_fastcall.fast_method); None: not armed.
    _allocate_entry = _deallocate_entry = None

    def _kernel_entry(self, kernel: Kernel, largest: int):
        """The ``KernelEntry`` through which ``allocate_raw`` or ``deallocate_raw``
        calls ``kernel`` from C, for values up to ``largest``; None where there
        is no bridge, the kernel's C entry is not known yet (it is after the
        first call, which arms the fast paths again) or the fast path is off."""
        if not (largest and kernel.address and native_enabled()):
            return None
        return KernelEntry(kernel.address, self._state, largest)

    def _fast_call(self, kernel: Kernel):
        """``kernel.call`` once it is what later calls go through (the compiled
        entry point); until then, a call that makes it so (compiling the
        kernel) and then arms the fast paths again."""
        if kernel.resolved:
            return kernel.call
        owner = weakref.ref(self)  # the tuple holding this keeps no cycle alive

        def first_call(*args):
            result = kernel.call(*args)
            allocator = owner()
            if allocator is not None:
                allocator._arm()
            return result

        return first_call

    def _note_table_addresses(self, *names: str) -> None:
        """Record where the tables (or the ones named) are, for lock-free kernels
        (``kernels.guard``)."""
        st = self._state
        for name in names or _TABLE_SLOTS:
            table = getattr(self, name)
            address, length = _TABLE_SLOTS[name]
            st[address] = table.ctypes.data  # a few microseconds each
            if length is not None:
                st[length] = table.shape[0]

    # Every caller passes the same argument types (arrays made contiguous with
    # fixed dtypes), so the batch kernel can skip the dispatcher after first use.
    _RUN_BATCH: Kernel
    _LEASE_SLOW_PATH: Kernel  # the policy's slow path under a lease, if it has one
    _POOL_NAMES_BLOCKS = True  # records show a fixed-bin region's bin for in-use blocks too
    _IN_USE_SLOT: int  # the state slot counting bytes in use (policy's definition)

    def _free_region_rows(self) -> np.ndarray:
        """Rows of the regions with no chunk in use, in row order."""
        rows = np.empty(self._regions.shape[0], dtype=np.int64)
        return rows[:_FREE_REGION_ROWS.call(self._state, rows)]

    def _grow_tables(self) -> None:
        st = self._state
        grown = []
        if st[L.S_FREE_ROWS] < L.ROWS_PER_OPERATION:
            self._chunks = L.grow_chunks(self._chunks, st)
            grown.append("_chunks")
        if 2 * (st[L.S_MAP_COUNT] + 1) > self._pmap.shape[0]:
            pmap = np.zeros((2 * self._pmap.shape[0], 2), dtype=np.int64)
            map_rehash_op(st, pmap)
            self._pmap = pmap
            grown.append("_pmap")
        if st[L.S_NUM_REGIONS] >= self._regions.shape[0]:
            self._regions = L.grow_regions(self._regions)
            grown.append("_regions")
        if st[L.S_TSQ_COUNT] >= self._tsq.shape[0]:
            self._tsq = L.grow_queue(self._tsq, st)
            grown.append("_tsq")
        if grown:
            self._note_table_addresses(*grown)

    def _drive_single(self, ops, ids, sizes, alignment, id_ptr, out, start, stop, series,
                      stride, on_oom, labels=None) -> None:
        """``_drive_batch`` one public call per operation (same results, slower)."""
        for i in range(start, stop):
            if ops[i] == ALLOCATE:
                p = self._served(self.allocate_raw, i, sizes, alignment, on_oom) \
                    if sizes[i] else 0
                id_ptr[ids[i]] = p
                out[i] = max(p, 0)
            else:
                p = int(id_ptr[ids[i]])
                out[i] = 0
                if p < 0 and p != FAILED:
                    raise self._not_live(i, ids if labels is None else labels)
                if p > 0:
                    self.deallocate_raw(p)
                id_ptr[ids[i]] = -1
            if stride > 0:
                _SAMPLE_USAGE.call(series, stride, i, self._state, self._IN_USE_SLOT)

    @staticmethod
    def _served(serve, i: int, sizes, alignment: int, on_oom) -> int:
        """``serve(sizes[i], alignment)``; an out-of-memory error goes to ``on_oom``
        (which may raise) and gives ``FAILED``, or propagates without one."""
        try:
            return serve(int(sizes[i]), alignment)
        except OutOfMemoryError as e:
            if on_oom is None:
                raise
            on_oom(i, e)
            return FAILED

    def _not_live(self, i: int, ids) -> InvalidPointerError:
        return InvalidPointerError(
            f"{self._name}: batch operation {i} frees id {int(ids[i])}, which is not live in "
            "this batch", ptr=0, kind="unknown")

    def _open_lease(self, fail_quietly: bool = False) -> None:
        """Before a batch kernel call: let the kernel place new backend memory
        itself where it can (an address lease: the caching and compact
        policies), or nothing. With ``fail_quietly``, the kernel may also fail
        an allocation itself (``FAILED_HERE``) where the slow path would fail
        it with nothing changed but counters."""

    def _close_lease(self) -> int:
        """After a batch kernel call: record what ``_open_lease`` let it make,
        and count the failures it made; returns how many."""
        return 0

    def _grow_for(self, n: int, alignment: int) -> bool | None:
        """The slow path's first growth, so that the kernel can serve ``n``
        bytes when it retries: True if it grew, False if it tried and could
        not (then ``_serve_after_growth`` goes on), None to leave the whole
        request to ``_serve_not_found``."""
        return None

    def _serve_after_growth(self, n: int, alignment: int) -> int:
        """The slow path after ``_grow_for``'s growth and the kernel's retry."""
        raise NotImplementedError

    def _serve_after_lease_growth(self, n: int, alignment: int) -> int:
        """The slow path after the kernel grew for ``n`` bytes under an address
        lease (as ``_grow_for`` would) and its retry missed."""
        raise NotImplementedError

    def _lease_slow_path(self, i: int, ids, sizes, alignment: int, id_ptr, out, series,
                         stride: int) -> tuple[int, int]:
        """Under the lease, the policy's slow-path kernel (``_LEASE_SLOW_PATH``)
        for batch operation ``i`` (``LEASE_SLOW_PATH``): ``(i + 1, 0)`` when it
        served or failed it (recorded as the batch kernel records), else ``(i,
        code)`` for the façade."""
        p = int(self._LEASE_SLOW_PATH.call(self._state, int(sizes[i]), alignment))
        if p < 0 and p != L.FAILED_HERE:
            return i, p
        id_ptr[ids[i]] = p if p > 0 else FAILED  # a failure the kernel counted
        out[i] = max(p, 0)
        if stride > 0:
            _SAMPLE_USAGE.call(series, stride, i, self._state, self._IN_USE_SLOT)
        return i + 1, 0

    def _serve_after_release(self, n: int, alignment: int) -> int:
        """The slow path after the kernel gave memory back for ``n`` bytes
        under an address lease (as the slow path's release would) and could
        not serve them (``RELEASED_NOT_FOUND``)."""
        raise NotImplementedError

    def _refuse_too_large(self, n: int, alignment: int) -> int:
        """An allocation above ``_largest_request()``: refused, as a single call refuses it."""
        raise self._request_too_large(n, alignment)

    def _serve_release_due(self) -> None:
        """Give a free region tail back (policies whose kernels ask for it)."""
        raise NotImplementedError

    def _until_room(self, kernel, *args) -> int:
        """Call ``kernel(*args)``, growing the tables until it has room."""
        while True:
            r = kernel(*args)
            if r != L.NEED_ROWS:
                return r
            self._grow_tables()

    def _report_fingerprint(self) -> tuple[int, ...]:
        return self._fingerprint_from(self._snapshot_slots.tolist())

    @staticmethod
    def _fingerprint_from(snapshot: list) -> tuple[int, ...]:
        """The report's fingerprint from the first ``SNAPSHOT_SLOTS`` slots of
        the state (what an out-of-memory error keeps, ``report.Failure``):
        what changes whenever the chunks do. Every allocation takes a new id,
        every free shrinks the pointer map, and every other change to the
        chunks changes the pool, the regions or the timestamped queue."""
        return (snapshot[L.S_NEXT_ALLOCATION_ID], snapshot[L.S_MAP_COUNT],
                snapshot[L.S_POOL_BYTES], snapshot[L.S_NUM_REGIONS], snapshot[L.S_TSQ_COUNT])

    def _lookup(self, ptr: int):
        status, requested, size, allocation_id = _LIVE_CHUNK.call(self._state_address, ptr, True)
        return (requested, size, allocation_id) if status == 0 else None

    def _live(self, ptr) -> tuple[int, int, int]:
        # Lock-free first (kernels.guard): a live allocation's record is one
        # kernel call. Busy tables, and a pointer not live (its error reads
        # the tables), take the lock. The kernel is called here, not through
        # _lookup: that extra Python call measured 80-130 ns of a 0.6 us lookup.
        p = check_pointer(ptr)
        if p:
            status, requested, size, allocation_id = _LIVE_CHUNK.call(self._state_address, p,
                                                                      False)
            if status == 0:
                return requested, size, allocation_id
        return super()._live(p)

    def _records(self) -> np.ndarray:
        # Unmapped address space (expandable segments) is not memory: no record.
        rows = self._chunks[(self._chunks["size"] > 0)
                            & (self._chunks["allocation_id"] != L.UNMAPPED)]
        rows = rows[np.argsort(rows["ptr"], kind="stable")]
        rec = np.zeros(rows.shape[0], dtype=_report.RECORD_DTYPE)
        rec["address"] = rows["ptr"]
        rec["size"] = rows["size"]
        rec["in_use"] = rows["allocation_id"] != -1
        rec["requested_size"] = np.where(rec["in_use"], rows["requested_size"], 0)
        if self._POOL_NAMES_BLOCKS:
            # A region with a fixed bin (a caching pool) names it for every block.
            pool = self._regions["bin"][rows["region"]]
            rec["bin"] = np.where(pool >= 0, pool, rows["bin"])
        elif per_space := self._state.item(L.S_SPACE_BINS):
            # A free chunk's record names its space; the size bins within it are an index.
            rec["bin"] = np.where(rows["bin"] >= 0, rows["bin"] // per_space, rows["bin"])
        else:
            rec["bin"] = rows["bin"]
        rec["allocation_id"] = rows["allocation_id"]
        rec["freed_at_count"] = np.where(rec["in_use"], 0, rows["freed_at_count"])
        return rec

    def _live_regions(self) -> np.ndarray:
        live = self._regions[self._regions["size"] > 0]
        return live[np.argsort(live["base"])]

    def _region_list(self):
        live = self._live_regions()
        return [(int(b), int(s)) for b, s in zip(live["base"], live["size"])]

    @property
    def tables(self) -> dict[str, np.ndarray]:
        """The live tables (``chunks``, ``bins``, ``regions``, ``pointer_map``,
        ``state``), for inspection; do not modify them."""
        return {"chunks": self._chunks, "bins": self._bins, "regions": self._regions,
                "pointer_map": self._pmap, "state": self._state}

    def run_batch(self, ops, ids, sizes, alignment: int = 256) -> np.ndarray:
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
        alignment : int
            For every allocation of the batch.

        Returns
        -------
        numpy.ndarray of int64
            The address each allocation got (0 for frees).

        Raises
        ------
        OutOfMemoryError
            At the first allocation that cannot be served (one above the limit
            included, with ``reason`` ``"limit"``, as ``allocate_raw`` raises it);
            operations before it have been applied and allocations made so far
            stay live.
        TypeError
            An array holds anything but integers (floats, bools, strings), before
            anything changes.
        ValueError
            Values outside int64, ops other than 0 and 1, negative ids or sizes,
            arrays of different lengths; nothing changes.

        Notes
        -----
        Ids are labels only: any int64 value pairs a free with its allocation.
        Ids below four times the batch's length plus 65,536 index the pairing
        table as they are; a batch with a larger id has its ids numbered first,
        a sort (about 70 ns per operation for a million operations, twice
        what the kernels take), so number them from 0 where you can.
        The arrays must not change during the call (another thread writing
        to them): the kernels index the pairing table with the ids checked.
        """
        ops, ids, sizes = (_integer_array(x, name) for x, name in
                           ((ops, "ops"), (ids, "ids"), (sizes, "sizes")))
        alignment = self._batch_alignment(check_alignment(alignment))
        if not (ops.shape == ids.shape == sizes.shape and ops.ndim == 1):
            raise ValueError("ops, ids and sizes must be 1-D arrays of the same length")
        problem, top = _BATCH_PROBLEM.call(ops, ids, sizes)
        if problem != BATCH_OK:
            raise ValueError(_BATCH_PROBLEMS[problem])
        slots, num_slots = _pairing_slots(ids, top)
        id_ptr = np.full(num_slots, -1, dtype=np.int64)
        out = np.zeros(ops.shape[0], dtype=np.int64)
        with self._lock:
            self._drive_batch(ops.astype(np.int8), slots, sizes, alignment,
                              id_ptr, out, 0, ops.shape[0], labels=ids)
        return out

    def _drive_batch(self, ops, ids, sizes, alignment, id_ptr, out, start, stop,
                     series=_NO_SERIES, stride=0, on_oom=None, labels=None,
                     brief_after_first: bool = False, count_failures=None) -> None:
        """Run operations ``start..stop-1`` in the batch kernel, serving what it
        cannot alone (growing tables, extending the pool). An allocation that
        fails raises ``OutOfMemoryError``, or with ``on_oom`` is reported to
        ``on_oom(index, error)`` and skipped (its id marked ``FAILED``); with
        ``brief_after_first``, the errors after the first carry the request
        and the reason only (no stats, message or report to build: a replay
        that counts failures). With both, ``count_failures(k)`` may be told
        of ``k`` more failures after the first, failed in the kernel itself
        where the slow path would change nothing but counters (their ids
        marked ``FAILED``, no error built). ``labels``: the ids to name in
        errors, if ``ids`` renumbers them. The caller holds the lock."""
        if getattr(self, "_timestamps_used", False):
            # Timed frees and their merging happen per call; keep single-call semantics.
            return self._drive_single(ops, ids, sizes, alignment, id_ptr, out, start, stop,
                                      series, stride, on_oom, labels)
        try:
            self._drive_kernel(ops, ids, sizes, alignment, id_ptr, out, start, stop, series,
                               stride, on_oom, labels, brief_after_first, count_failures)
        finally:
            self._brief_oom = False

    def _drive_kernel(self, ops, ids, sizes, alignment, id_ptr, out, start, stop, series,
                      stride, on_oom, labels, brief_after_first, count_failures) -> None:
        i = start
        in_use = self._IN_USE_SLOT
        max_request = self._largest_request()
        grown_at = -1
        while True:
            # Past the first failure, those with nothing to report are the kernel's.
            self._open_lease(count_failures is not None and self._brief_oom)
            try:
                i, code = self._RUN_BATCH.call(self._state, ops, ids, sizes, alignment,
                                               max_request, id_ptr, out, i, stop, series,
                                               stride, in_use)
                while code == L.LEASE_SLOW_PATH:
                    i, code = self._lease_slow_path(i, ids, sizes, alignment, id_ptr, out,
                                                    series, stride)
                    if code == 0:  # served: the batch goes on under the lease
                        i, code = self._RUN_BATCH.call(self._state, ops, ids, sizes, alignment,
                                                       max_request, id_ptr, out, i, stop,
                                                       series, stride, in_use)
            finally:
                failed = self._close_lease()
            if failed:
                count_failures(failed)
            if code == 0:
                return
            if code == L.NEED_ROWS:
                self._grow_tables()
                continue
            if code == RELEASE_DUE:
                self._serve_release_due()
                if stride > 0:
                    _SAMPLE_USAGE.call(series, stride, i - 1, self._state, in_use)
                continue
            if code == TOO_LARGE:
                serve = self._refuse_too_large
            elif code == L.GREW_NOT_FOUND:  # the kernel's own growth, as _grow_for's
                grown_at = i
                serve = self._serve_after_lease_growth
            elif code == L.RELEASED_NOT_FOUND:  # the kernel's release, as _allocate_slow's
                serve = self._serve_after_release
            elif code == L.NOT_FOUND:
                if i != grown_at:
                    grown = self._grow_for(int(sizes[i]), alignment)
                    if grown is not None:
                        grown_at = i
                        if grown:
                            continue  # the kernel retries
                # Past a growth step, the slow path goes on from after it: one
                # backend call per step, as a single call makes.
                serve = self._serve_after_growth if grown_at == i else self._serve_not_found
            else:
                raise self._not_live(i, ids if labels is None else labels)
            p = self._served(serve, i, sizes, alignment, on_oom)
            if p == FAILED and brief_after_first:
                self._brief_oom = True
            id_ptr[ids[i]] = p
            out[i] = max(p, 0)
            if stride > 0:
                _SAMPLE_USAGE.call(series, stride, i, self._state, in_use)
            i += 1
