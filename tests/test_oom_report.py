"""The out-of-memory report (bin summary, occupancy map) is built on first read.

A failure builds nothing but its message and stats; the first read of
``bin_summary`` or ``occupancy`` builds both from the allocator, which is the
allocator at the failure unless it changed in between (``report_stale``).
The plain-Python oracles build the report at once, so they are the reference
for what a deferred report must say.
"""

import gc
import pickle
import weakref

import pytest

from numba_bfc import (
    BFCAllocator,
    CachingAllocator,
    CompactAllocator,
    OutOfMemoryError,
)
from numba_bfc.allocators import report as _report
from numba_bfc.backends import VirtualSubAllocator
from numba_bfc.kernels import layout
from numba_bfc.testing import (
    ReferenceBFCAllocator,
    ReferenceCachingAllocator,
    ReferenceCompactAllocator,
)

MiB = 1 << 20

PAIRS = {
    "bfc": (BFCAllocator, ReferenceBFCAllocator, {}),
    "caching": (CachingAllocator, ReferenceCachingAllocator, {}),
    "compact": (CompactAllocator, ReferenceCompactAllocator, {"page_size": 64 << 10}),
}


def _fragmented(cls, **kw):
    """40 MiB allocated in 1 MiB pieces, every other one freed: a 48 MiB
    request into the 64 MiB limit fails."""
    a = cls(VirtualSubAllocator(contiguous=True), memory_limit=64 * MiB, **kw)
    live = [a.allocate_raw(MiB) for _ in range(40)]
    for p in live[::2]:
        a.deallocate_raw(p)
    return a, live[1::2]


def _failure(a) -> OutOfMemoryError:
    with pytest.raises(OutOfMemoryError) as e:
        a.allocate_raw(48 * MiB)
    return e.value


@pytest.mark.parametrize("policy", list(PAIRS))
def test_a_report_read_at_once_is_the_oracles(policy):
    cls, oracle_cls, kw = PAIRS[policy]
    a, _ = _fragmented(cls, **kw)
    oracle, _ = _fragmented(oracle_cls, **kw)
    err, expected = _failure(a), _failure(oracle)
    assert str(err) == str(expected) and err.reason == expected.reason
    assert err.bin_summary == expected.bin_summary
    assert err.occupancy == expected.occupancy and "*" in err.occupancy
    assert not err.report_stale and not expected.report_stale


@pytest.mark.parametrize("policy", list(PAIRS))
def test_a_failure_builds_no_report_until_read(policy, monkeypatch):
    cls, _, kw = PAIRS[policy]
    a, _ = _fragmented(cls, **kw)
    built = []
    render = _report.render_occupancy
    monkeypatch.setattr(_report, "render_occupancy",
                        lambda *args, **kws: built.append(1) or render(*args, **kws))
    err = _failure(a)
    str(err), err.stats, err.reason
    assert built == []
    occupancy = err.occupancy
    assert built == [1]
    assert err.occupancy is occupancy and err.bin_summary is err.bin_summary
    assert built == [1]  # built once


@pytest.mark.parametrize("policy", list(PAIRS))
def test_a_change_before_the_first_read_makes_the_report_stale(policy):
    cls, _, kw = PAIRS[policy]
    a, live = _fragmented(cls, **kw)
    err = _failure(a)
    a.deallocate_raw(live[0])
    assert err.report_stale
    assert err.occupancy == a.render_occupancy()  # the allocator as it is now
    # Read at once, a report stays the failure's whatever happens after.
    err = _failure(a)
    at_failure = err.occupancy
    a.deallocate_raw(live[1])
    assert not err.report_stale and err.occupancy == at_failure


@pytest.mark.parametrize("change", ["allocate", "free", "give back"])
def test_every_kind_of_change_is_seen(change):
    # Two free 2 MiB regions: 3 MiB fails, and either region can go back.
    a = BFCAllocator(VirtualSubAllocator(), memory_limit=4 * MiB)
    p1, p2 = a.allocate_raw(MiB), a.allocate_raw(2 * MiB)
    a.deallocate_raw(p2)
    with pytest.raises(OutOfMemoryError) as e:
        a.allocate_raw(3 * MiB)
    err = e.value
    if change == "allocate":
        a.allocate_raw(256)
    elif change == "free":
        a.deallocate_raw(p1)
    else:
        assert a.deallocate_free_regions()
    assert err.report_stale


def test_an_allocator_gone_before_the_read_leaves_an_empty_stale_report():
    a, _ = _fragmented(BFCAllocator)
    err = _failure(a).with_traceback(None)  # the traceback's frames hold the allocator
    del a
    gc.collect()
    assert err.report_stale and err.occupancy == "" and err.bin_summary == []


def test_the_error_pickles_with_its_report():
    a, _ = _fragmented(BFCAllocator)
    err = _failure(a)
    back = pickle.loads(pickle.dumps(err))
    assert str(back) == str(err) and back.reason == err.reason
    assert back.occupancy == err.occupancy and back.bin_summary == err.bin_summary


def test_the_cuda_error_keeps_the_report_deferred(monkeypatch):
    numba_emm = pytest.importorskip("numba_bfc.integrations.numba_emm")
    a, _ = _fragmented(BFCAllocator)
    built = []
    render = _report.render_occupancy
    monkeypatch.setattr(_report, "render_occupancy",
                        lambda *args, **kws: built.append(1) or render(*args, **kws))
    wrapped = numba_emm.CudaOutOfMemoryError(_failure(a))
    assert built == [] and isinstance(wrapped, OutOfMemoryError)
    assert wrapped.occupancy == a.render_occupancy() and built == [1, 1]


@pytest.mark.parametrize("policy", list(PAIRS))
def test_the_message_is_formatted_when_first_shown(policy, monkeypatch):
    from numba_bfc.allocators import caching_base

    cls, _, kw = PAIRS[policy]
    a, _ = _fragmented(cls, **kw)
    formatted = []
    for module, name in ((_report, "oom_message"), (caching_base, "_oom_message")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name,
                            lambda *args, _real=real: formatted.append(1) or _real(*args))
    err = _failure(a)
    assert formatted == [] and err.reason and err.stats.bytes_limit == 64 * MiB
    text = str(err)
    assert formatted == [1] and err.args == (text,) and text in repr(err)
    assert str(err) == text and formatted == [1]


@pytest.mark.parametrize("policy", list(PAIRS))
def test_stats_and_message_built_late_describe_the_failure(policy):
    """``stats`` (and the message made from them) are built on first read, from
    counters taken at the failure: changes after it do not show."""
    cls, oracle_cls, kw = PAIRS[policy]
    a, live = _fragmented(cls, **kw)
    oracle, _ = _fragmented(oracle_cls, **kw)
    err, expected = _failure(a), _failure(oracle)
    at_failure = a.get_stats()
    for p in live[:5]:
        a.deallocate_raw(p)
    a.allocate_raw(3 * MiB)
    assert a.get_stats() != at_failure
    assert err.stats == at_failure == expected.stats
    assert str(err) == str(expected)
    assert err.stats is err.stats  # built once


@pytest.mark.parametrize("policy", list(PAIRS))
def test_a_kept_error_keeps_no_allocator_alive(policy):
    cls, _, kw = PAIRS[policy]
    a, _ = _fragmented(cls, **kw)
    err = _failure(a).with_traceback(None)
    alive = weakref.ref(a)
    del a
    gc.collect()
    assert alive() is None
    assert err.stats.bytes_limit == 64 * MiB and "out of memory" in str(err)


@pytest.mark.parametrize("policy", ["bfc", "caching", "compact"])
def test_a_replay_reports_its_first_failure_in_full_and_counts_the_rest(policy):
    """Replays keep only the first failure's message: later errors are built
    brief, and the allocator builds full errors again afterwards."""
    from numba_bfc.traces import Trace, make_allocator, replay

    n = 200
    trace = Trace.from_arrays([0] * n + [1] * n, list(range(n)) * 2, [MiB] * n + [0] * n)
    kernel_allocator, python_allocator = (make_allocator(policy, 32 * MiB) for _ in range(2))
    kernel = replay(trace, kernel_allocator, engine="kernel")
    python = replay(trace, python_allocator, engine="python")
    assert kernel.ooms == python.ooms > 100
    assert kernel.first_oom == python.first_oom  # the message in full, as one call gives it
    assert "a batch reports" not in kernel.first_oom.message
    assert kernel_allocator.get_stats() == python_allocator.get_stats()
    with pytest.raises(OutOfMemoryError) as e:
        kernel_allocator.allocate_raw(64 * MiB)
    assert e.value.stats is not None and "a batch reports" not in str(e.value)


def _slow_path_calls(a, monkeypatch) -> list:
    """Count the façade's slow paths (``_allocate_slow``, the caching policy's
    ``_malloc_slow``) from now on."""
    calls = []
    name = "_malloc_slow" if isinstance(a, CachingAllocator) else "_allocate_slow"
    slow = getattr(type(a), name)
    monkeypatch.setattr(a, name, lambda *args: calls.append(args) or slow(a, *args))
    return calls


def _observed(a):
    """What a failure must leave as it was (the counters aside)."""
    if isinstance(a, CachingAllocator):
        return a.memory_snapshot(), a._records().tolist()
    return a.memory_map()


@pytest.mark.parametrize("hold_lock", [False, True])
@pytest.mark.parametrize("policy", list(PAIRS))
def test_a_failure_the_kernel_decides_is_the_slow_paths(policy, hold_lock, monkeypatch):
    """No fit and no room to grow (bfc), none whatever is given back
    (compact), or a new segment over the limit and none cached wholly free
    (caching): the kernel fails the allocation itself, lock-free or under the
    lock, and the error is the one the slow path gives (the oracle's), the
    allocator and its backend unchanged but for the counts of failures."""
    cls, oracle_cls, kw = PAIRS[policy]
    a, _ = _fragmented(cls, **kw)
    oracle, _ = _fragmented(oracle_cls, **kw)
    backend_calls = (a.backend.num_allocs, a.backend.num_frees)
    calls = _slow_path_calls(a, monkeypatch)
    before = _observed(a)
    for _ in range(2):
        if hold_lock:
            with a._lock:
                err = _failure(a)
        else:
            err = _failure(a)
        expected = _failure(oracle)
    assert calls == []
    assert (str(err), err.reason, err.rounded_bytes, err.alignment, err.num_bytes) == (
        str(expected), expected.reason, expected.rounded_bytes, expected.alignment,
        expected.num_bytes)
    assert err.stats == expected.stats == a.get_stats()
    assert err.occupancy == expected.occupancy and err.bin_summary == expected.bin_summary
    assert _observed(a) == before and not err.report_stale
    assert (a.backend.num_allocs, a.backend.num_frees) == backend_calls
    if policy == "caching":  # the two failures counted as the slow path counts them
        assert a.memory_stats() == oracle.memory_stats()
        assert a.memory_stats()["num_ooms"] == 2


@pytest.mark.parametrize("setting", ["history", "max_split_size", "garbage collection",
                                     "something cached"])
def test_the_caching_kernel_leaves_to_the_slow_path_what_is_not_only_a_failure(
        setting, monkeypatch):
    """A failure the slow path records (history), or that it may turn into
    success or a release (oversize blocks, garbage collection, segments cached
    wholly free), is not the kernel's to decide."""
    kw = {"max_split_size": 32 * MiB} if setting == "max_split_size" else {}
    if setting == "garbage collection":
        kw = {"garbage_collection_threshold": 0.5}
    a, live = _fragmented(CachingAllocator, **kw)
    if setting == "history":
        a.record_memory_history()
    if setting == "something cached":
        a.deallocate_raw(live[0])  # its segment (2 MiB, two 1 MiB blocks) is now wholly free
    calls = _slow_path_calls(a, monkeypatch)
    _failure(a)
    assert len(calls) == 1
    if setting == "history":
        assert a.memory_history()[-1]["action"] == "oom"
        a.record_memory_history(False)
        _failure(a)
        assert len(calls) == 1  # the kernel's again


@pytest.mark.parametrize("setup", ["garbage collection", "timestamped frees"])
def test_the_bfc_kernel_leaves_to_the_slow_path_what_could_succeed(setup, monkeypatch):
    """A failure the slow path could turn into success (free regions given back,
    timestamped chunks merged) is not the kernel's to decide."""
    from numba_bfc import SharedCounter

    if setup == "garbage collection":
        a, _ = _fragmented(BFCAllocator, garbage_collection=True)
    else:
        a, _ = _fragmented(BFCAllocator)
        counter = SharedCounter()
        a.set_timing_counter(counter)
        p = a.allocate_raw(MiB)
        a.deallocate_raw(p)  # queued, not merged: the slow path merges it
        a.set_timing_counter(None)
    with a._lock:  # the kernel itself leaves it to the slow path (and changes nothing)
        assert a._ALLOCATE.call(a._state_address, 48 * MiB, True) == layout.NOT_FOUND
    calls = _slow_path_calls(a, monkeypatch)
    _failure(a)
    assert len(calls) == 1


def test_the_limit_and_garbage_collection_are_fixed_at_construction():
    a = BFCAllocator(VirtualSubAllocator(), memory_limit=4 * MiB)
    with pytest.raises(AttributeError):
        a.memory_limit = 8 * MiB
    with pytest.raises(AttributeError):
        a.garbage_collection = True
    assert a.memory_limit == 4 * MiB and a.garbage_collection is False
