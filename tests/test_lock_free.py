"""The lock-free fast path (``numba_bfc.kernels.guard``).

Single allocate/free calls, and the lookups of a live allocation
(``allocated_size`` and its kin), first run a kernel without the façade's lock; it
must change nothing and step aside (``TABLES_BUSY``) while any thread holds
the lock, must always see the current tables (they are regrown under the
lock), and the façade must then finish the call under the lock.
"""

import sys
import threading
import time

import numpy as np
import pytest
from numba.core.registry import CPUDispatcher

import numba_bfc
from numba_bfc import BFCAllocator, CachingAllocator, CompactAllocator
from numba_bfc.allocators import _tables
from numba_bfc.backends import VirtualSubAllocator
from numba_bfc.kernels import layout as L
from numba_bfc.testing.invariants import check_invariants

MiB = 1 << 20


def _bfc():
    return BFCAllocator(VirtualSubAllocator(), memory_limit=1 << 40)


def _caching():
    return CachingAllocator(VirtualSubAllocator(), memory_limit=1 << 40)


def _compact():
    return CompactAllocator(VirtualSubAllocator(contiguous=True), memory_limit=1 << 40,
                            page_size=64 << 10)


FACTORIES = {"bfc": _bfc, "caching": _caching, "compact": _compact}


def _unlocked(a):
    """The policy's allocate and free kernels, called as by a caller without the lock."""
    return (lambda n: a._ALLOCATE.call(a._state_address, n, False),
            lambda p: a._DEALLOCATE.call(a._state_address, p, False))


def _snapshot(a):
    return [t.copy() for t in (a._chunks, a._bins, a._regions, a._pmap, a._state)]


@pytest.mark.parametrize("kind", list(FACTORIES))
def test_unlocked_kernels_step_aside_while_the_lock_is_held(kind):
    a = FACTORIES[kind]()
    ptrs = [a.allocate_raw(n) for n in (1000, 5000, 70_000)]
    alloc, free = _unlocked(a)
    with a._lock:
        before = _snapshot(a)
        assert alloc(4096) == L.TABLES_BUSY
        assert free(ptrs[0]) == L.TABLES_BUSY
        after = _snapshot(a)
        assert all(np.array_equal(x, y) for x, y in zip(before, after))
    # Released: the same calls go through without the façade.
    p = alloc(4096)
    assert p > 0 and a.requested_size(p) == 4096
    assert free(ptrs[0]) > 0
    assert a._lookup(ptrs[0]) is None
    check_invariants(a)


@pytest.mark.parametrize("kind", list(FACTORIES))
def test_the_lookup_of_a_live_allocation_is_lock_free_and_steps_aside(kind):
    """``allocated_size`` and its kin read a live allocation's record in one
    kernel call without the lock; while the lock is held that call steps aside
    and the façade answers under the lock (here the same thread's: the lock
    lets it in), and a pointer not live is named under the lock."""
    a = FACTORIES[kind]()
    p = a.allocate_raw(5000)

    def lookup(ptr):
        return _tables._LIVE_CHUNK.call(a._state_address, ptr, False)

    lock, taken = a._lock, []

    class CountingLock:  # the façade's lock, counting who takes it
        def __enter__(self):
            taken.append(1)
            return lock.__enter__()

        def __exit__(self, *exc):
            return lock.__exit__(*exc)

    a._lock = CountingLock()
    record = (a.requested_size(p), a.allocated_size(p), a.allocation_id(p))
    assert not taken  # three lookups, none took the lock
    with pytest.raises(numba_bfc.InvalidPointerError):
        a.allocated_size(p + 256)
    assert len(taken) == 1  # naming a pointer not live reads the tables under it
    a._lock = lock
    assert record[0] == 5000 and record[1] >= 5000 and record[2] > 0
    assert lookup(p) == (0, *record)
    with a._lock:
        before = _snapshot(a)
        assert lookup(p) == (L.TABLES_BUSY, 0, 0, 0)
        assert (a.requested_size(p), a.allocated_size(p), a.allocation_id(p)) == record
        assert all(np.array_equal(x, y) for x, y in zip(before, _snapshot(a)))
    assert lookup(p + 256) == (L.INVALID_POINTER, 0, 0, 0)
    with pytest.raises(numba_bfc.InvalidPointerError, match="interior pointer"):
        a.allocated_size(p + 256)
    a.deallocate_raw(p)
    assert lookup(p)[0] == L.INVALID_POINTER
    with pytest.raises(numba_bfc.InvalidPointerError):
        a.requested_size(p)


@pytest.mark.parametrize("kind", list(FACTORIES))
def test_a_call_waits_while_another_thread_holds_the_lock(kind):
    a = FACTORIES[kind]()
    p = a.allocate_raw(1000)  # the pool exists: the next allocation is a pure kernel call
    held, done = threading.Event(), []

    def holder():
        with a._lock:
            held.set()
            time.sleep(0.3)
            done.append(("released", time.perf_counter()))

    t = threading.Thread(target=holder)
    t.start()
    held.wait()
    assert a.allocated_size(p) >= 1000  # the lookup, too, waits for the lock
    done.append(("looked up", time.perf_counter()))
    q = a.allocate_raw(2000)
    done.append(("allocated", time.perf_counter()))
    a.deallocate_raw(p)
    done.append(("freed", time.perf_counter()))
    t.join()
    assert [what for what, _ in done] == ["released", "looked up", "allocated", "freed"]
    a.deallocate_raw(q)
    check_invariants(a)


@pytest.mark.parametrize("kind", list(FACTORIES))
def test_tables_regrow_under_concurrent_lock_free_calls(kind):
    """Four threads make thousands of live allocations, so the chunk table, the
    pointer map and the pool grow while other threads run lock-free calls."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    a = FACTORIES[kind]()
    rows_at_start = a._chunks.shape[0]
    results, errors = {}, []
    start = threading.Barrier(4)

    def worker(tid):
        rng = np.random.default_rng(tid)
        live = []
        start.wait()
        try:
            for _ in range(3000):
                if live and rng.random() < 0.3:
                    a.deallocate_raw(live.pop(int(rng.integers(len(live))))[0])
                else:
                    n = int(rng.integers(1, 64 << 10))
                    p = a.allocate_raw(n)
                    live.append((p, n))
                    if a.requested_size(p) != n:  # lock-free, while others regrow
                        errors.append(f"{tid}: requested_size({p:#x}) is not {n}")
            results[tid] = live
        except Exception as e:  # reported below rather than lost in the thread
            errors.append(f"{tid}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(before)
    assert not errors, errors
    assert a._chunks.shape[0] >= 8 * rows_at_start  # it really regrew, several times
    live = sorted(x for v in results.values() for x in v)
    starts = np.array([p for p, _ in live])
    ends = np.array([p + a.allocated_size(p) for p, _ in live])
    assert np.all(ends[:-1] <= starts[1:]), "two live allocations overlap"
    assert all(a.requested_size(p) == n for p, n in live)
    check_invariants(a)
    for p, _ in live:
        a.deallocate_raw(p)
    check_invariants(a)


def test_without_a_gil_every_call_takes_the_lock(monkeypatch):
    """On a free-threaded interpreter the lock depth never drops to 0, so the
    lock-free kernels always step aside, and the results are the same."""
    sizes = [1000, 300_000, 5 << 20, 256, 70_000, 3 << 20]
    normal = _bfc()
    expected = [normal.allocate_raw(n) for n in sizes]
    monkeypatch.setattr(_tables, "LOCK_FREE_CALLS", False)
    a = _bfc()
    assert a._state[L.S_LOCK_DEPTH] == 1
    got = [a.allocate_raw(n) for n in sizes]
    assert got == expected
    assert _unlocked(a)[0](1000) == L.TABLES_BUSY
    for p in got[::2]:
        a.deallocate_raw(p)
    assert a._state[L.S_LOCK_DEPTH] == 1
    check_invariants(a)


def test_caching_steps_aside_while_the_gc_clock_runs():
    """A missed lookup counts on the GC age clock, so the lock-free attempt must
    not count one before the locked retry counts it again."""
    a = CachingAllocator(VirtualSubAllocator(), memory_limit=64 * MiB,
                         garbage_collection_threshold=0.8)
    alloc, _ = _unlocked(a)
    a.deallocate_raw(a.allocate_raw(1000))
    assert alloc(1000) == L.TABLES_BUSY


def test_compact_free_steps_aside_when_a_give_back_may_be_due():
    a = CompactAllocator(VirtualSubAllocator(contiguous=True), memory_limit=64 * MiB,
                         page_size=64 << 10, release_threshold=64 << 10)
    p = a.allocate_raw(1000)
    assert _unlocked(a)[1](p) == L.TABLES_BUSY
    a.deallocate_raw(p)  # through the lock, which gives the tail back
    assert a.get_stats().bytes_reserved == 0


def test_no_kernel_releases_the_gil():
    """The lock-free path is sound only because a kernel call holds the GIL."""
    import importlib
    import pkgutil

    dispatchers = []
    for info in pkgutil.walk_packages(numba_bfc.__path__, "numba_bfc."):
        if info.name.split(".")[-1].startswith("test"):
            continue
        try:
            mod = importlib.import_module(info.name)
        except ImportError:  # optional dependencies (CUDA, torch, matplotlib)
            continue
        dispatchers += [v for v in vars(mod).values() if isinstance(v, CPUDispatcher)]
    assert len(dispatchers) > 30
    assert not [d for d in dispatchers if d.targetoptions.get("nogil")]
