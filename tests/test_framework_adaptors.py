"""Adaptors one by one (retry, limit, log, statistics) and composed in every order."""

import io
import itertools
import threading
import time

import pytest

from numba_bfc import BFCAllocator, InvalidPointerError, OutOfMemoryError
from numba_bfc.adaptors import (
    AllocatorWrapper,
    Counter,
    LimitingAllocator,
    LoggingAllocator,
    RetryingAllocator,
    StatisticsAllocator,
)
from numba_bfc.backends import VirtualSubAllocator
from numba_bfc.framework import AllocationAttributes
from numba_bfc.framework.host import HostAllocator
from numba_bfc.testing.invariants import check_invariants
from numba_bfc.traces import read_rmm_log

MiB = 1 << 20


def _bfc():
    return BFCAllocator(VirtualSubAllocator(), memory_limit=MiB)


def _free_later(allocator, ptr, delay):
    t = threading.Timer(delay, allocator.deallocate_raw, args=(ptr,))
    t.start()
    return t


# ---------------------------------------------------------------- AllocatorWrapper
def test_wrapper_forwards_everything():
    host = HostAllocator()
    w = AllocatorWrapper(host)
    p = w.allocate_raw(100, 64)
    assert p % 64 == 0 and host.requested_size(p) == 100
    assert (w.requested_size(p), w.allocated_size(p), w.allocation_id(p)) == (100, 100, 1)
    assert w.tracks_allocation_sizes() and w.host_accessible and w.get_stats() == host.get_stats()
    assert w.name == "wrapper(cpu)" and AllocatorWrapper(host, name="mine").name == "mine"
    w.deallocate_raw(p)
    assert host.get_stats().bytes_in_use == 0 and w.clear_stats()
    assert not AllocatorWrapper(_bfc()).host_accessible
    with pytest.raises(TypeError, match="Allocator"):
        AllocatorWrapper(object())


# ---------------------------------------------------------------- RetryingAllocator
def test_retry_succeeds_when_another_thread_frees_in_time():
    r = RetryingAllocator(HostAllocator(memory_limit=1000), max_wait=5.0)
    p = r.allocate_raw(800)
    t = _free_later(r, p, 0.1)
    start = time.monotonic()
    q = r.allocate_raw(800)
    waited = time.monotonic() - start
    t.join()
    assert 0.05 <= waited < 2.0, "must wake on the free, long before the deadline"
    assert r.num_retries >= 1 and r.num_failures == 0
    r.deallocate_raw(q)


def test_retry_gives_up_at_the_deadline_without_polling():
    r = RetryingAllocator(HostAllocator(memory_limit=1000), max_wait=0.3)
    p = r.allocate_raw(800)
    start = time.monotonic()
    with pytest.raises(OutOfMemoryError):
        r.allocate_raw(800)
    waited = time.monotonic() - start
    assert 0.3 <= waited < 2.0
    # No frees happened: one wait to the deadline, one last attempt. A polling loop
    # would have retried many times.
    assert r.num_retries == 1 and r.num_failures == 1
    r.deallocate_raw(p)


def test_retry_fails_when_the_freed_memory_is_not_enough():
    r = RetryingAllocator(HostAllocator(memory_limit=1000), max_wait=0.4)
    big, small = r.allocate_raw(600), r.allocate_raw(300)
    t = _free_later(r, small, 0.05)
    start = time.monotonic()
    with pytest.raises(OutOfMemoryError):
        r.allocate_raw(800)
    t.join()
    assert time.monotonic() - start >= 0.4
    assert r.num_retries == 2, "woken once by the free, once at the deadline"
    r.deallocate_raw(big)
    r.deallocate_raw(r.allocate_raw(800))


def test_retry_on_failure_false_fails_at_once():
    r = RetryingAllocator(HostAllocator(memory_limit=1000), max_wait=5.0)
    p = r.allocate_raw(800)
    start = time.monotonic()
    with pytest.raises(OutOfMemoryError):
        r.allocate_raw(800, attributes=AllocationAttributes(retry_on_failure=False))
    assert time.monotonic() - start < 0.5 and r.num_retries == 0 and r.num_failures == 1
    r.deallocate_raw(p)


def test_retry_does_not_retry_bad_arguments_or_bad_frees():
    r = RetryingAllocator(HostAllocator(), max_wait=5.0)
    start = time.monotonic()
    with pytest.raises(ValueError):
        r.allocate_raw(-5)
    with pytest.raises(InvalidPointerError):
        r.deallocate_raw(4096)
    assert time.monotonic() - start < 0.5 and r.num_retries == 0
    r.deallocate_raw(0)
    with pytest.raises(ValueError):
        RetryingAllocator(HostAllocator(), max_wait=-1)
    assert r.name == "retrying(cpu)"


# ---------------------------------------------------------------- LimitingAllocator
def test_limit_counts_requested_bytes_over_an_exact_allocator():
    lim = LimitingAllocator(HostAllocator(), "1KiB")
    p = lim.allocate_raw(600)
    with pytest.raises(OutOfMemoryError) as err:
        lim.allocate_raw(500)
    assert err.value.reason == "limit" and lim.allocated_bytes == 600
    lim.deallocate_raw(p)
    assert lim.allocated_bytes == 0
    lim.deallocate_raw(lim.allocate_raw(1024))


def test_limit_counts_the_inner_allocated_size_when_known():
    bfc = _bfc()
    lim = LimitingAllocator(bfc, 1000)
    p = lim.allocate_raw(300)  # a 512-byte chunk
    assert lim.allocated_bytes == 512
    # Reserved 300 fits (812), but the chunk would be 512: given back and refused.
    with pytest.raises(OutOfMemoryError) as err:
        lim.allocate_raw(300)
    assert err.value.rounded_bytes == 512
    assert lim.allocated_bytes == 512 and bfc.get_stats().bytes_in_use == 512
    with pytest.raises(OutOfMemoryError):  # refused before reaching BFC
        lim.allocate_raw(600)
    assert bfc.get_stats().num_allocs == 2
    lim.deallocate_raw(p)
    assert lim.allocated_bytes == 0 and bfc.get_stats().bytes_in_use == 0
    check_invariants(bfc)


def test_limit_rejects_bad_limits_and_keeps_state_on_bad_frees():
    for bad in ("lots", -1, True):
        with pytest.raises((TypeError, ValueError)):
            LimitingAllocator(HostAllocator(), bad)
    lim = LimitingAllocator(HostAllocator(), 100)
    p = lim.allocate_raw(50)
    with pytest.raises(InvalidPointerError):
        lim.deallocate_raw(p + 1)
    with pytest.raises(TypeError):
        lim.allocate_raw(5.0)
    assert lim.allocated_bytes == 50 and lim.num_live() == 1
    lim.deallocate_raw(p)
    assert lim.num_live() == 0


# ---------------------------------------------------------------- LoggingAllocator
def test_logging_writes_rmm_rows(tmp_path):
    path = tmp_path / "events.csv"
    with LoggingAllocator(HostAllocator(memory_limit=1000), path) as log:
        p = log.allocate_raw(700)
        with pytest.raises(OutOfMemoryError):
            log.allocate_raw(400)
        with pytest.raises(ValueError):
            log.allocate_raw(-1)  # bad arguments are not events
        with pytest.raises(InvalidPointerError):
            log.deallocate_raw(p + 1)  # nor are bad frees
        log.deallocate_raw(p)
        assert log.allocate_raw(0) == 0  # nothing allocated, nothing logged
    assert path.read_text().splitlines()[0] == "Thread,Time,Action,Pointer,Size,Stream"
    events = read_rmm_log(path)
    assert [(e.action, e.pointer, e.size, e.stream) for e in events] == [
        ("allocate", p, 700, 0), ("allocate failure", 0, 400, 0), ("free", p, 700, 0)]
    assert {e.thread for e in events} == {threading.get_native_id()}
    assert events[0].time <= events[2].time or events[2].time.hour == 0  # unless past midnight


def test_logging_after_close_refuses_allocations_but_still_frees():
    buf = io.StringIO()
    host = HostAllocator()
    log = LoggingAllocator(host, buf, auto_flush=True)
    p = log.allocate_raw(10)
    log.close()
    assert not buf.closed
    with pytest.raises(RuntimeError, match="closed"):
        log.allocate_raw(10)
    log.deallocate_raw(p)
    assert host.get_stats().bytes_in_use == 0
    assert [e.action for e in read_rmm_log(io.StringIO(buf.getvalue()))] == ["allocate"]


# ---------------------------------------------------------------- StatisticsAllocator
def test_statistics_counts_value_peak_total():
    s = StatisticsAllocator(HostAllocator(memory_limit=1000))
    a, b = s.allocate_raw(100), s.allocate_raw(200)
    s.deallocate_raw(a)
    with pytest.raises(OutOfMemoryError):
        s.allocate_raw(900)
    c = s.allocate_raw(50)
    assert s.bytes_counter == Counter(250, 300, 350)
    assert s.allocations_counter == Counter(2, 2, 3)
    s.deallocate_raw(b)
    s.deallocate_raw(c)
    assert s.bytes_counter == Counter(0, 300, 350) and s.allocations_counter.value == 0


def test_statistics_scopes_merge_like_rmm():
    s = StatisticsAllocator(HostAllocator())
    outer = s.allocate_raw(1000)
    assert s.push_counters() == (Counter(1000, 1000, 1000), Counter(1, 1, 1))
    assert s.depth == 1 and s.bytes_counter == Counter()
    x = s.allocate_raw(300)
    s.push_counters()
    y = s.allocate_raw(50)
    s.deallocate_raw(x)  # allocated in the enclosing scope: this scope goes negative
    inner = s.pop_counters()
    assert inner == (Counter(-250, 50, 50), Counter(0, 1, 1))
    assert s.bytes_counter == Counter(50, 350, 350)
    s.deallocate_raw(outer)
    middle = s.pop_counters()
    assert middle[0] == Counter(-950, 350, 350)
    # Merged into the base scope: its peak is its value then (1000) plus the scope's peak.
    assert s.bytes_counter == Counter(50, 1350, 1350)
    assert s.allocations_counter == Counter(1, 3, 3)
    with pytest.raises(IndexError, match="push_counters"):
        s.pop_counters()
    s.deallocate_raw(y)
    assert s.bytes_counter.value == 0 and s.depth == 0


# ---------------------------------------------------------------- composition
LAYERS = {
    "logging": lambda inner, ctx: LoggingAllocator(inner, ctx["log"]),
    "retrying": lambda inner, ctx: RetryingAllocator(inner, max_wait=3.0),
    "limiting": lambda inner, ctx: LimitingAllocator(inner, 4096),
    "statistics": lambda inner, ctx: StatisticsAllocator(inner),
}


def _stack(order, bfc, ctx):
    """``order`` lists layers outermost first."""
    top, layers = bfc, {}
    for kind in reversed(order):
        top = layers[kind] = LAYERS[kind](top, ctx)
    return top, layers


@pytest.mark.parametrize("order", list(itertools.permutations(LAYERS)),
                         ids=lambda o: ">".join(o))
def test_adaptors_compose_in_any_order(order):
    bfc = _bfc()
    buf = io.StringIO()
    top, layers = _stack(order, bfc, {"log": buf})
    retry_absorbs = order.index("retrying") < order.index("limiting")

    first = top.allocate_raw(3000)  # BFC chunk 3072; the limit counts 3072
    t = _free_later(top, first, 0.05)
    try:
        second = top.allocate_raw(2000)
    except OutOfMemoryError as e:
        assert not retry_absorbs and e.reason == "limit"
        second = 0
    else:
        assert retry_absorbs, "the limit must refuse unless a retry waits above it"
    t.join()
    top.deallocate_raw(second)

    check_invariants(bfc)
    assert bfc.get_stats().bytes_in_use == 0 and layers["limiting"].allocated_bytes == 0
    stats = layers["statistics"]
    assert stats.bytes_counter == Counter(0, 3000, 3000 + (2000 if second else 0))
    assert top.name.startswith(order[0] + "(") and top.name.endswith("(bfc)" + ")" * 3)

    log = layers["logging"]
    log.close()
    events = read_rmm_log(io.StringIO(buf.getvalue()))
    actions = [e.action for e in events]
    assert actions.count("allocate") == actions.count("free") == (2 if second else 1)
    live = set()
    for e in events:  # the log replays: every free names a live pointer
        if e.action == "allocate":
            live.add(e.pointer)
        elif e.action == "free":
            live.remove(e.pointer)
    assert not live
    below = order[order.index("logging") + 1:]
    sees_refusal = "limiting" in below and not (
        "retrying" in below and below.index("retrying") < below.index("limiting"))
    assert actions.count("allocate failure") == int(sees_refusal)
