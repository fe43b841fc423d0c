"""Several threads of random allocate/free on every allocator and through every adaptor.

Each allocation is filled with a pattern unique to its thread and step and
verified before it is freed, so overlapping or reused-while-live memory is
caught; afterwards every counter must be back to zero and the BFC tables
consistent.
"""

import ctypes
import io
import random
import sys
import threading

import numpy as np
import pytest

from numba_bfc import BFCAllocator, CachingAllocator, CompactAllocator, OutOfMemoryError
from numba_bfc.adaptors import (
    AllocatorWrapper,
    LimitingAllocator,
    LoggingAllocator,
    RetryingAllocator,
    StatisticsAllocator,
)
from numba_bfc.backends import HostSubAllocator
from numba_bfc.framework import TrackingAllocator
from numba_bfc.framework.host import HostAllocator
from numba_bfc.testing.invariants import check_invariants
from numba_bfc.traces import read_rmm_log

MiB = 1 << 20
THREADS = 4
OPS_PER_THREAD = 400


@pytest.fixture(autouse=True)
def _switch_threads_often():
    """Make the interpreter switch threads every few bytecodes, not every 5 ms,
    so that the threads really interleave inside allocator calls."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def _bytes_at(ptr, n):
    return np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(ptr))


def _pattern(tag, n):
    return ((np.arange(n, dtype=np.uint64) * 2654435761 + tag) % 251).astype(np.uint8)


def _bfc():
    return BFCAllocator(HostSubAllocator(), memory_limit=32 * MiB, garbage_collection=True)


def _composed(bfc, log):
    return LoggingAllocator(RetryingAllocator(LimitingAllocator(StatisticsAllocator(
        TrackingAllocator(bfc)), 4 * MiB), max_wait=0.2), log)


def _composed_reverse(bfc, log):
    return TrackingAllocator(StatisticsAllocator(LimitingAllocator(RetryingAllocator(
        LoggingAllocator(bfc, log), max_wait=0.2), 4 * MiB)), track_sizes_locally=True)


STACKS = {
    "bfc": lambda bfc, log: bfc,
    "host": lambda bfc, log: HostAllocator(memory_limit=32 * MiB),
    "caching": lambda bfc, log: CachingAllocator(HostSubAllocator(), memory_limit=64 * MiB),
    "compact": lambda bfc, log: CompactAllocator(
        HostSubAllocator(64 * MiB, contiguous=True), memory_limit=64 * MiB,
        page_size=64 << 10, small_backend=HostSubAllocator(16 * MiB, contiguous=True)),
    "caching_composed": lambda bfc, log: _composed(
        CachingAllocator(HostSubAllocator(), memory_limit=64 * MiB), log),
    "tracking": lambda bfc, log: TrackingAllocator(bfc),
    "retrying": lambda bfc, log: RetryingAllocator(bfc, max_wait=0.2),
    "limiting": lambda bfc, log: LimitingAllocator(bfc, 4 * MiB),
    "logging": lambda bfc, log: LoggingAllocator(bfc, log),
    "statistics": lambda bfc, log: StatisticsAllocator(bfc),
    "composed": _composed,
    "composed_reverse": _composed_reverse,
}


def _hammer(allocator, seed):
    """Run the threads; return (errors, number of out-of-memory errors)."""
    errors, ooms = [], []
    start = threading.Barrier(THREADS)
    caching = any(isinstance(layer, CachingAllocator) for layer in _layers(allocator))

    def worker(tid):
        rng = random.Random(seed * 1000 + tid)
        live = []
        start.wait()
        try:
            for step in range(OPS_PER_THREAD):
                if live and (rng.random() < 0.45 or len(live) >= 24):
                    p, n, tag = live.pop(rng.randrange(len(live)))
                    if not np.array_equal(_bytes_at(p, n), _pattern(tag, n)):
                        errors.append(f"thread {tid}: allocation at {p:#x} was overwritten")
                    allocator.deallocate_raw(p)
                    continue
                n = rng.choice([rng.randint(1, 512), rng.randint(1, 16 << 10),
                                rng.randint(1, 300 << 10)])
                # The caching policy aligns blocks to 512 bytes and refuses more.
                alignment = rng.choice([64, 256, 512 if caching else 4096])
                try:
                    p = allocator.allocate_raw(n, alignment)
                except OutOfMemoryError:
                    ooms.append(tid)
                    continue
                if p % alignment:
                    errors.append(f"thread {tid}: {p:#x} not aligned to {alignment}")
                tag = tid * 1_000_003 + step
                _bytes_at(p, n)[:] = _pattern(tag, n)
                live.append((p, n, tag))
            for p, n, tag in live:
                if not np.array_equal(_bytes_at(p, n), _pattern(tag, n)):
                    errors.append(f"thread {tid}: allocation at {p:#x} was overwritten")
                allocator.deallocate_raw(p)
        except Exception as e:  # reported below rather than lost in the thread
            errors.append(f"thread {tid}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors, len(ooms)


def _layers(allocator):
    while True:
        yield allocator
        if not isinstance(allocator, AllocatorWrapper):
            return
        allocator = allocator.inner


@pytest.mark.parametrize("stack", list(STACKS))
def test_threads_of_random_allocate_free(stack):
    bfc, log = _bfc(), io.StringIO()
    top = STACKS[stack](bfc, log)
    errors, ooms = _hammer(top, seed=len(stack))
    assert not errors, errors[:5]
    # A refusal either reaches a thread or is cured by a retrying layer: which one
    # depends on thread timing, that one of them happens does not.
    refusals = ooms + sum(layer.num_retries for layer in _layers(top)
                          if isinstance(layer, RetryingAllocator))

    for layer in _layers(top):
        if isinstance(layer, (BFCAllocator, HostAllocator)):
            assert layer.get_stats().bytes_in_use == 0
            assert layer.get_stats().num_allocs > 0
        if isinstance(layer, (BFCAllocator, CachingAllocator)):  # compact is a BFCAllocator
            check_invariants(layer)
        if isinstance(layer, CachingAllocator):
            assert layer.memory_allocated() == 0
        if isinstance(layer, TrackingAllocator):
            total, high, live = layer.get_sizes()
            assert live == 0 and high > 0 and total >= high
            assert sum(r.alloc_bytes for r in layer.get_records()) == 0
        if isinstance(layer, StatisticsAllocator):
            assert layer.bytes_counter.value == 0 and layer.allocations_counter.value == 0
            assert layer.bytes_counter.peak > 0
        if isinstance(layer, LimitingAllocator):
            assert layer.allocated_bytes == 0 and refusals > 0, "a 4 MiB limit must bite"
        if isinstance(layer, LoggingAllocator):
            layer.close()
            events = read_rmm_log(io.StringIO(log.getvalue()))
            live = set()
            for e in events:  # the log replays in file order, across threads
                if e.action == "allocate":
                    assert e.pointer not in live
                    live.add(e.pointer)
                elif e.action == "free":
                    live.remove(e.pointer)
            assert not live and len({e.thread for e in events}) == THREADS
        if hasattr(layer, "num_live"):
            assert layer.num_live() == 0
