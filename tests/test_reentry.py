"""A finalizer that calls an allocator in the middle of one of its operations.

The allocators' lock lets its holder's thread in again, and a garbage
collection can run at any Python allocation inside a multi-step operation (a
release, a growth, a table growth). A finalizer it ran that allocated or freed
found the tables, the backend or the façade's records half changed: blocks in
released regions, a pool past its limit, one address handed out twice, a
corrupted heap. Automatic collection now waits while an allocator's lock is
held (``allocators._tables.pause_gc``), so such a finalizer runs after the
operation, as if called after it. Each test leaves garbage whose finalizer
calls the allocator inside one such window, makes a collection due there, and
compares the outcome with the same two calls made one after the other.
"""

import gc
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _support import finalizer_inside

from numba_bfc import BFCAllocator, CachingAllocator, CompactAllocator
from numba_bfc._gc_pause import pause_gc, resume_gc
from numba_bfc.backends import VirtualSubAllocator
from numba_bfc.testing.invariants import check_invariants

KiB, MiB = 1 << 10, 1 << 20
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def eager_collection():
    """Automatic collection on, after every few container allocations."""
    thresholds, enabled = gc.get_threshold(), gc.isenabled()
    gc.collect()
    gc.enable()
    gc.set_threshold(10)
    yield
    gc.set_threshold(*thresholds)
    if not enabled:
        gc.disable()


def observed(a, extra=()):
    check_invariants(a)
    s = a.get_stats()
    return (s.bytes_in_use, s.bytes_reserved, a.regions(), *extra)


def _bfc_two_free_regions():
    backend = VirtualSubAllocator()
    a = BFCAllocator(backend, memory_limit=64 * MiB)
    p, q = a.allocate_raw(1 * MiB), a.allocate_raw(3 * MiB)  # regions of 2 and 4 MiB
    a.deallocate_raw(p)
    a.deallocate_raw(q)
    return a, backend


def test_bfc_release_of_free_regions(monkeypatch):
    """A block allocated by a finalizer during ``deallocate_free_regions`` is
    not in a region the release then takes away."""
    a, _ = _bfc_two_free_regions()
    released = a.deallocate_free_regions(0)
    expected = observed(a, (released, a.allocate_raw(1000)))

    a, backend = _bfc_two_free_regions()
    results = finalizer_inside(monkeypatch, backend, "free", lambda: a.allocate_raw(1000))
    released = a.deallocate_free_regions(0)
    assert results == []  # the collection waited for the operation
    gc.collect()
    assert observed(a, (released, *results)) == expected


# Growth at the limit: (allocator over a backend, remapping backend, the
# backend call growth makes, request size).
GROWTH = {
    "bfc": (lambda b: BFCAllocator(b, memory_limit=8 * MiB), False, "alloc", 3 * MiB),
    "compact": (lambda b: CompactAllocator(b, memory_limit=8 * MiB, page_size=64 * KiB),
                False, "alloc", 5 * MiB),
    "compact-remapping": (lambda b: CompactAllocator(b, memory_limit=8 * MiB,
                                                     page_size=64 * KiB),
                          True, "alloc_at", 5 * MiB),
}


@pytest.mark.parametrize("case", GROWTH)
def test_growth_stays_within_the_limit(monkeypatch, case):
    """A finalizer that allocates while the allocator asks the backend for
    memory does not take the pool past the limit, nor map over what is being
    mapped."""
    make, contiguous, asks, size = GROWTH[case]

    def start():
        backend = VirtualSubAllocator(contiguous=contiguous)
        a = make(backend)
        a.allocate_raw(1 * MiB)
        return a, backend

    a, _ = start()
    outer = a.allocate_raw(size)
    with pytest.raises(MemoryError):
        a.allocate_raw(size)
    expected = observed(a, (outer,))

    a, backend = start()
    results = finalizer_inside(monkeypatch, backend, asks, lambda: a.allocate_raw(size))
    outer = a.allocate_raw(size)
    gc.collect()
    assert len(results) == 1 and isinstance(results[0], MemoryError)
    assert observed(a, (outer,)) == expected


def _caching_two_free_segments():
    backend = VirtualSubAllocator()
    a = CachingAllocator(backend)
    x, y = a.allocate_raw(12 * MiB), a.allocate_raw(14 * MiB)
    a.deallocate_raw(x)
    a.deallocate_raw(y)
    return a, backend


def test_caching_empty_cache(monkeypatch):
    """A block allocated by a finalizer during ``empty_cache`` is not in a
    segment the release then gives back."""
    a, _ = _caching_two_free_segments()
    a.empty_cache()
    expected = observed(a, (a.allocate_raw(12 * MiB),))

    a, backend = _caching_two_free_segments()
    results = finalizer_inside(monkeypatch, backend, "free", lambda: a.allocate_raw(12 * MiB))
    a.empty_cache()
    gc.collect()
    assert observed(a, tuple(results)) == expected


def test_caching_new_segment_is_not_handed_out_twice(monkeypatch):
    """A finalizer that allocates between a new segment's creation and its first
    block being taken does not get the same block as the outer call."""
    a = CachingAllocator(VirtualSubAllocator())
    outer = a.allocate_raw(3 * MiB)
    expected = observed(a, (outer, a.allocate_raw(3 * MiB)))

    a = CachingAllocator(VirtualSubAllocator())
    results = finalizer_inside(monkeypatch, a, "_add_segment", lambda: a.allocate_raw(3 * MiB))
    outer = a.allocate_raw(3 * MiB)
    gc.collect()
    assert observed(a, (outer, *results)) == expected


def test_caching_batch_records_its_leased_segments_first(monkeypatch):
    """A finalizer that allocates while a batch hands the segments it placed
    under its address lease to the backend does not get one of their addresses."""
    a = CachingAllocator(VirtualSubAllocator())
    batch = a.run_batch([0], [0], [3 * MiB]).tolist()
    expected = observed(a, (batch, a.allocate_raw(30 * MiB)))

    backend = VirtualSubAllocator()
    a = CachingAllocator(backend)
    results = finalizer_inside(monkeypatch, backend, "record_leased",
                               lambda: a.allocate_raw(30 * MiB))
    batch = a.run_batch([0], [0], [3 * MiB]).tolist()
    gc.collect()
    assert observed(a, (batch, *results)) == expected


def test_compact_punch_keeps_live_blocks(monkeypatch):
    """A block allocated by a finalizer while ``empty_cache`` gives whole free
    pages back from the middle of a space is not in pages it then unmaps."""
    def start():
        backend = VirtualSubAllocator(contiguous=True)
        a = CompactAllocator(backend, memory_limit=64 * MiB, page_size=64 * KiB)
        blocks = [a.allocate_raw(n) for n in (1 * MiB, 64 * KiB, 1 * MiB, 64 * KiB)]
        a.deallocate_raw(blocks[0])
        a.deallocate_raw(blocks[2])
        return a, backend

    a, _ = start()
    released = a.empty_cache()
    expected = observed(a, (released, a.allocate_raw(1 * MiB)))

    a, backend = start()
    results = finalizer_inside(monkeypatch, backend, "free", lambda: a.allocate_raw(1 * MiB))
    released = a.empty_cache()
    gc.collect()
    assert observed(a, (released, *results)) == expected


def test_a_memory_map_is_one_moment(monkeypatch):
    """``memory_map`` reads the chunks, then the statistics, then the regions: a
    finalizer's allocation between the reads showed regions 6 MiB in all over
    chunks of 2 MiB. Now the map is of one moment, and the allocation after it."""
    a = BFCAllocator(VirtualSubAllocator(), memory_limit=64 * MiB)
    a.allocate_raw(1 * MiB)
    results = finalizer_inside(monkeypatch, a, "_stats_locked", lambda: a.allocate_raw(3 * MiB))
    m = a.memory_map()
    gc.collect()
    assert len(results) == 1 and not isinstance(results[0], Exception)
    assert sum(r["size"] for r in m["regions"]) == sum(c["size"] for c in m["chunks"])
    assert m["stats"]["bytes_reserved"] == sum(r["size"] for r in m["regions"]) == 2 * MiB
    assert m["stats"]["bytes_in_use"] == sum(c["size"] for c in m["chunks"] if c["in_use"])
    check_invariants(a)


def test_a_memory_snapshot_is_one_moment(monkeypatch):
    """Caching's ``memory_snapshot`` reads the blocks, then the segments: a
    finalizer's allocation of a new segment between the reads would show that
    segment without its block. Now the snapshot is of one moment, and the
    allocation after it."""
    a = CachingAllocator(VirtualSubAllocator())
    a.allocate_raw(1 * MiB)
    results = finalizer_inside(monkeypatch, a, "_segment_list", lambda: a.allocate_raw(30 * MiB))
    snapshot = a.memory_snapshot()
    gc.collect()
    assert len(results) == 1 and not isinstance(results[0], Exception)
    assert [s["total_size"] for s in snapshot] == [2 * MiB]
    for segment in snapshot + a.memory_snapshot():
        assert sum(b["size"] for b in segment["blocks"]) == segment["total_size"]
    assert sorted(s["total_size"] for s in a.memory_snapshot()) == [2 * MiB, 30 * MiB]
    check_invariants(a)


def test_a_finalizer_during_a_table_growth():
    """While a table grows, the state records the old table until the new one is
    in place: a finalizer's allocation there wrote past the old table's end
    (the process died of a corrupted heap). In a process of its own."""
    script = textwrap.dedent("""
        import gc
        import numba_bfc.kernels.layout as L
        from numba_bfc import BFCAllocator, CachingAllocator, CompactAllocator
        from numba_bfc.backends import VirtualSubAllocator
        from numba_bfc.testing.invariants import check_invariants

        makers = {
            "bfc": lambda: BFCAllocator(VirtualSubAllocator(), memory_limit=1 << 30),
            "caching": lambda: CachingAllocator(VirtualSubAllocator()),
            "compact": lambda: CompactAllocator(VirtualSubAllocator(contiguous=True),
                                                memory_limit=1 << 30, page_size=1 << 16),
        }
        grow_chunks = L.grow_chunks
        gc.set_threshold(10)
        for name, make in makers.items():
            a = make()
            inner = []

            class Garbage:
                def __init__(self):
                    self.cycle = self

                def __del__(self):
                    inner.append(a.allocate_raw(512))

            def grow_with_garbage(chunks, state):
                grown = grow_chunks(chunks, state)
                if not inner:
                    Garbage()
                    churn = [[] for _ in range(1000)]
                return grown

            L.grow_chunks = grow_with_garbage
            rows = a.tables["chunks"].shape[0]
            outer = []
            while a.tables["chunks"].shape[0] == rows:
                outer.append(a.allocate_raw(512))
            L.grow_chunks = grow_chunks
            gc.collect()
            assert len(inner) == 1 and inner[0] not in outer, name
            check_invariants(a)
            assert a.get_stats().bytes_in_use == 512 * (len(outer) + 1), name
            for p in outer + inner:
                a.deallocate_raw(p)
            check_invariants(a)
            print(name, "ok")
        """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split() == ["bfc", "ok", "caching", "ok", "compact", "ok"]


def test_collection_pauses_nest_and_restore_what_was_set():
    """Pauses from several allocators (or threads) nest; the last one restores
    automatic collection only if it was on when the first began."""
    assert gc.isenabled()
    pause_gc()
    pause_gc()
    assert not gc.isenabled()
    resume_gc()
    assert not gc.isenabled()
    resume_gc()
    assert gc.isenabled()
    gc.disable()
    pause_gc()
    resume_gc()
    assert not gc.isenabled()
    gc.enable()
    a = BFCAllocator(VirtualSubAllocator(), memory_limit=1 << 30)
    with a._lock:
        with a._lock:
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


# Non-reentrant locks: a finalizer run under one that calls back in deadlocked,
# so each runs in a process of its own with a timeout.
_GARBAGE_AT_FIRST = '''
import gc
import json
import sys

sys.path.insert(0, "tests")
from _support import leave_garbage

def garbage_at_first(base, method, action):
    """A subclass of ``base`` whose first ``method`` call leaves garbage whose
    finalizer runs ``action()`` and makes a collection due, then goes on."""
    def first_call(self, *args):
        if not hasattr(first_call, "fired"):
            first_call.fired = True
            leave_garbage(action)
        return getattr(base, method)(self, *args)

    gc.enable()
    gc.set_threshold(10)
    return type("Once" + base.__name__, (base,), {method: first_call})
'''


def _run_alone(script):
    done = subprocess.run([sys.executable, "-c", _GARBAGE_AT_FIRST + textwrap.dedent(script)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_a_finalizer_under_a_host_backends_map_lock():
    """``HostSubAllocator`` maps under a non-reentrant lock: a finalizer run
    there that freed a region of the same backend deadlocked the process."""
    out = _run_alone("""
        from numba_bfc.backends import HostSubAllocator
        b = HostSubAllocator()
        p, n = b.alloc(4096)
        mapped_then = []

        def free_p():
            mapped_then.append(len(b.mapped_ranges()))
            b.free(p, n)

        b._buffers = garbage_at_first(dict, "__setitem__", free_p)(b._buffers)
        q, m = b.alloc(8192)
        gc.collect()
        print(json.dumps([mapped_then, b.mapped_ranges() == [(q, m)]]))
    """)
    assert out == [[2], True]  # the finalizer ran once, after q was mapped


def test_a_finalizer_under_a_trace_recorders_lock():
    """``Trace.record`` appended rows under a non-reentrant lock: a finalizer run
    there that freed memory of the recorded allocator deadlocked the process.
    Now the free is recorded whole, before the allocation it interrupted."""
    out = _run_alone("""
        from numba_bfc import BFCAllocator
        from numba_bfc.backends import VirtualSubAllocator
        from numba_bfc.traces import Trace
        a = BFCAllocator(VirtualSubAllocator(), memory_limit=1 << 30)
        with Trace.record(a) as rec:
            p = a.allocate_raw(1000)
            rec._rows = garbage_at_first(list, "append", lambda: a.deallocate_raw(p))(rec._rows)
            a.allocate_raw(2000)
            gc.collect()
        t = rec.trace
        print(json.dumps([t.ops.tolist(), t.ids.tolist(), t.sizes.tolist()]))
    """)
    from numba_bfc.traces import _kernels as K

    assert out == [[K.ALLOC, K.FREE, K.ALLOC], [0, 0, 1], [1000, 1000, 2000]]


def test_a_finalizer_under_a_retrying_adaptors_lock():
    """``RetryingAllocator`` counts frees and wakes waiters under a lock that
    was not reentrant: a finalizer run there that freed through the adaptor
    deadlocked the process."""
    out = _run_alone("""
        import threading
        from numba_bfc.adaptors import RetryingAllocator
        from numba_bfc.framework import HostAllocator
        r = RetryingAllocator(HostAllocator(memory_limit=1 << 20), max_wait=1.0)
        p, q = r.allocate_raw(1000), r.allocate_raw(1000)
        r._freed = garbage_at_first(threading.Condition, "notify_all",
                                    lambda: r.deallocate_raw(q))(r._freed._lock)
        r.deallocate_raw(p)
        gc.collect()
        print(json.dumps([r._num_frees, r.get_stats().bytes_in_use]))
    """)
    assert out == [2, 0]
