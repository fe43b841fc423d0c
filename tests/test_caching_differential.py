"""Random programs on CachingAllocator and the reference oracle: same addresses,
same errors, same PyTorch statistics and snapshots, invariants after every step;
with and without expandable segments."""

import numpy as np
from _support import batch_program, pointer_step, single_calls
from hypothesis import given
from hypothesis import strategies as st

from numba_bfc import CachingAllocator, InvalidPointerError, OutOfMemoryError
from numba_bfc.backends import VirtualSubAllocator
from numba_bfc.policies.caching import LEASE_LOG_SIZE as C_LEASE_LOG_SIZE
from numba_bfc.testing import ReferenceCachingAllocator
from numba_bfc.testing.invariants import check_invariants
from numba_bfc.traces import Trace, replay

KiB, MiB = 1 << 10, 1 << 20

sizes = st.one_of(
    st.integers(1, 4 * KiB),  # small pool
    st.integers(1, 1 * MiB),  # small pool, several per segment
    st.integers(1 * MiB + 1, 12 * MiB),  # 20 MiB and rounded large segments
    st.integers(20 * MiB, 70 * MiB),  # oversize when max_split_size is set
    st.sampled_from([512, 1 * MiB, 1 * MiB + 1, 10 * MiB, 21 * MiB]),
)
ops = st.one_of(
    st.tuples(st.just("alloc"), sizes, st.sampled_from([512, 512, 1, 64, 256])),
    st.tuples(st.just("alloc"), sizes, st.just(512)),
    st.tuples(st.just("free"), st.integers(0, 1000), st.just(0)),
    st.tuples(st.just("free"), st.integers(0, 1000), st.just(0)),
    st.tuples(st.just("bad_free"), st.integers(0, 1000), st.sampled_from([0, 1, 512])),
    st.tuples(st.just("empty_cache"), st.just(0), st.just(0)),
    st.tuples(st.just("reset"), st.integers(0, 2), st.just(0)),
)
configs = st.fixed_dictionaries(
    {
        "memory_limit": st.sampled_from([None, None, 64 * MiB, 160 * MiB]),
        "max_split_size": st.sampled_from([None, None, 24 * MiB, 48 * MiB]),
        "roundup_power2_divisions": st.sampled_from([0, 0, 2, 4, {1: 8, 16: 2, ">": 4}]),
        "garbage_collection_threshold": st.sampled_from([0.0, 0.0, 0.3, 0.8]),
        "capacity": st.sampled_from([None, 96 * MiB, 200 * MiB]),
        "expandable_segments": st.sampled_from([False, False, True]),
    }
)


def _make(cls, config):
    cfg = dict(config)
    capacity = cfg.pop("capacity")
    if cfg["memory_limit"] is None:
        cfg["garbage_collection_threshold"] = 0.0  # PyTorch's collector needs a limit
    # Expandable segments map pages at chosen addresses: a contiguous space.
    return cls(VirtualSubAllocator(capacity, contiguous=cfg["expandable_segments"]), **cfg)


def _step(a, live, freed, op):
    kind, x, y = op
    try:
        done, outcome = pointer_step(a, live, freed, op, stray_step=512)
        if done:
            return outcome
        if kind == "empty_cache":
            return ("empty", a.empty_cache())
        if kind == "reset":
            if x == 0:
                a.reset_peak_memory_stats()
            elif x == 1:
                a.reset_accumulated_memory_stats()
            else:
                a.clear_stats()
            return "ok"
    except OutOfMemoryError as e:
        return ("oom", str(e), e.reason, e.rounded_bytes)
    except InvalidPointerError as e:
        return ("invalid", e.kind, str(e))
    raise AssertionError(kind)


def _observe(a):
    return (a.memory_stats(), a.memory_snapshot(), a.get_stats(), a._records().tolist(),
            a.backend.num_allocs, a.backend.num_frees)


@given(config=configs, program=st.lists(ops, max_size=60))
def test_numba_matches_reference(config, program):
    fast = _make(CachingAllocator, config)
    ref = _make(ReferenceCachingAllocator, config)
    live_f, live_r, freed_f, freed_r = [], [], [], []
    for op in program:
        out_f = _step(fast, live_f, freed_f, op)
        out_r = _step(ref, live_r, freed_r, op)
        assert out_f == out_r, op
        assert _observe(fast) == _observe(ref), op
        check_invariants(fast)
        check_invariants(ref)
    assert fast.memory_summary() == ref.memory_summary()


@given(program=st.lists(st.tuples(st.booleans(), st.one_of(st.integers(1, 300 * KiB),
                                                           st.integers(1, 30 * MiB)),
                                  st.integers(0, 99)), max_size=200))
def test_batch_matches_single_calls(program):
    """The batch entry point does exactly what one call per operation does."""
    ops, ids, szs = batch_program(program)
    a = CachingAllocator(VirtualSubAllocator())
    out = a.run_batch(np.array(ops), np.array(ids), np.array(szs))
    b = ReferenceCachingAllocator(VirtualSubAllocator())
    assert out.tolist() == single_calls(b, ops, ids, szs)
    assert a.memory_stats() == b.memory_stats()
    assert a.memory_snapshot() == b.memory_snapshot()
    check_invariants(a)


def _replay_outcome(trace, allocator, engine):
    try:
        r = replay(trace, allocator, engine=engine)
    except (RuntimeError, ValueError) as e:  # a backend granularity the policy refuses
        return (type(e).__name__, str(e))
    return r.addresses.tolist(), r.ooms, r.first_oom


@given(config=configs, granularity=st.sampled_from([1, 1, 2 * MiB, 3000]),
       program=st.lists(st.tuples(st.booleans(), sizes, st.integers(0, 99)), max_size=120))
def test_batch_under_an_address_lease_matches_the_reference(config, granularity, program):
    """A replay's batch makes new segments in the kernel where the backend's
    address lease allows (limits, capacity, granularity); everything else goes
    the façade's way, failures skipped and cached segments released on the way.
    Both must be exactly the reference's single calls: addresses, failures,
    statistics, snapshot, and the backend's own record, also after the leased
    segments go back to it."""
    ops, ids, szs = batch_program(program)
    trace = Trace.from_arrays(ops, ids, szs)

    def make(cls):
        cfg = dict(config)
        capacity = cfg.pop("capacity")
        if cfg["memory_limit"] is None:
            cfg["garbage_collection_threshold"] = 0.0
        backend = VirtualSubAllocator(capacity, contiguous=cfg["expandable_segments"],
                                      granularity=granularity)
        return cls(backend, **cfg)

    a, ref = make(CachingAllocator), make(ReferenceCachingAllocator)
    assert _replay_outcome(trace, a, "kernel") == _replay_outcome(trace, ref, "python")
    assert _observe(a) == _observe(ref)
    backends = [(b.bytes_held, b.peak_bytes_held, b.mapped_ranges(), b.num_allocs,
                 b.num_frees, b.num_failed_allocs) for b in (a.backend, ref.backend)]
    assert backends[0] == backends[1]
    check_invariants(a)
    assert a.empty_cache() == ref.empty_cache()
    assert _observe(a) == _observe(ref)
    assert a.backend.mapped_ranges() == ref.backend.mapped_ranges()


def test_a_batch_makes_its_segments_in_the_kernel_many_at_a_time():
    """More segments than one lease's log holds, none through the façade's slow
    path; the backend then holds exactly what the reference got."""
    n = 3 * C_LEASE_LOG_SIZE
    ops, ids, szs = [0] * n, list(range(n)), [(i % 7 + 1) * 3 * MiB for i in range(n)]
    a = CachingAllocator(VirtualSubAllocator())
    slow_calls = []
    a._malloc_slow = lambda n: slow_calls.append(n)
    out = a.run_batch(np.array(ops), np.array(ids), np.array(szs))
    assert slow_calls == []
    ref = ReferenceCachingAllocator(VirtualSubAllocator())
    assert out.tolist() == single_calls(ref, ops, ids, szs)
    assert _observe(a) == _observe(ref)
    assert a.backend.mapped_ranges() == ref.backend.mapped_ranges()
    assert a.memory_stats()["num_device_alloc"] > C_LEASE_LOG_SIZE


def test_a_lease_is_taken_afresh_after_a_failure_gave_segments_back():
    """A failed allocation releases the cached segment the kernel made, and the
    backend is back where it was when the lease began: the next segment goes
    where the backend says now, not where the old lease had got to."""
    trace = Trace.from_arrays([0, 1, 0, 1, 0, 1], [0, 0, 1, 1, 2, 2],
                              [1000, 0, 64 * MiB + 1, 0, 5000, 0])
    a = CachingAllocator(VirtualSubAllocator(), memory_limit=64 * MiB)
    ref = ReferenceCachingAllocator(VirtualSubAllocator(), memory_limit=64 * MiB)
    assert _replay_outcome(trace, a, "kernel") == _replay_outcome(trace, ref, "python")
    assert _observe(a) == _observe(ref)
    assert a.backend.mapped_ranges() == ref.backend.mapped_ranges()


def test_single_calls_past_the_first_region_table_match_the_reference():
    """More segments than the region table starts with (it doubles), made and
    given back by single calls."""
    n = 150  # > 2 x the 64 rows new tables have
    a = CachingAllocator(VirtualSubAllocator())
    ref = ReferenceCachingAllocator(VirtualSubAllocator())
    rows = a.tables["regions"].shape[0]
    sizes = [(i % 5 + 1) * 11 * MiB for i in range(n)]  # one large segment each
    ptrs = [a.allocate_raw(s) for s in sizes]
    assert ptrs == [ref.allocate_raw(s) for s in sizes]
    assert a.tables["regions"].shape[0] >= 2 * rows
    for p in ptrs[::2]:
        a.deallocate_raw(p)
        ref.deallocate_raw(p)
    a.empty_cache()
    ref.empty_cache()
    assert _observe(a) == _observe(ref)
    assert a.backend.mapped_ranges() == ref.backend.mapped_ranges()
    check_invariants(a)
