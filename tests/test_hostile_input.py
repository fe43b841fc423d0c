"""Hostile input (issue 21): int64 boundaries, bad batch arrays, refusing and re-entrant backends.

The batch path (``run_batch``, ``replay``) must refuse what single calls
refuse, in the same place and with the same reason; no request, alignment,
byte sum or backend address may wrap int64 arithmetic or leak backend memory;
a backend that refuses or re-enters must not make a batch diverge from one
call per operation, or break a give-back in progress.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numba_bfc import (
    BFCAllocator,
    CachingAllocator,
    CompactAllocator,
    OutOfMemoryError,
)
from numba_bfc.backends import VirtualSubAllocator
from numba_bfc.testing import ReferenceBFCAllocator
from numba_bfc.testing.invariants import check_invariants
from numba_bfc.traces import Trace, make_allocator, replay

MiB = 1 << 20
MAX_INT64 = (1 << 63) - 1
LIMIT = 1 << 30
POLICIES = ["bfc", "caching", "compact"]
# Every size a kernel's arithmetic could wrap on, and the limits around them.
BOUNDARY_SIZES = [LIMIT - 1, LIMIT, LIMIT + 1, (1 << 60) - 1, 1 << 60, (1 << 62) - 1, 1 << 62,
                  MAX_INT64 - 511, MAX_INT64]


def _replay_both(trace, policy, limit):
    """Replay ``trace`` with the batch kernel and with one call per event."""
    results = []
    for engine in ("kernel", "python"):
        a = make_allocator(policy, limit)
        r = replay(trace, a, engine=engine)
        check_invariants(a)
        assert r.peak_in_use_bytes >= 0 and a.get_stats().bytes_in_use >= 0
        results.append((r.ooms, r.first_oom.reason if r.first_oom else None,
                        r.addresses.tolist(), a.get_stats().to_dict()))
    return results


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("huge", BOUNDARY_SIZES[2:])
def test_replay_refuses_a_huge_request_as_single_calls_do(policy, huge):
    # Live alone (the bytes live at once must fit in int64 for a trace to exist).
    trace = Trace.from_arrays([0, 1, 0, 1, 0, 1], [0, 0, 1, 1, 2, 2], [1000, 0, huge, 0, 5000, 0])
    kernel, python = _replay_both(trace, policy, LIMIT)
    assert kernel == python
    assert kernel[0] == 1 and kernel[1] == "limit"


@settings(max_examples=40, deadline=None)
@given(policy=st.sampled_from(POLICIES),
       sizes=st.lists(st.one_of(st.integers(1, 4 * MiB), st.sampled_from(BOUNDARY_SIZES)),
                      min_size=1, max_size=24),
       unlimited=st.booleans())
def test_boundary_sizes_in_a_replay_match_one_call_per_event(policy, sizes, unlimited):
    # Each size lives alone (a trace's bytes live at once must fit in int64).
    n = len(sizes)
    trace = Trace.from_arrays([0, 1] * n, [i for i in range(n) for _ in (0, 1)],
                              [x for size in sizes for x in (size, 0)])
    limit = None if unlimited and policy == "caching" else LIMIT
    kernel, python = _replay_both(trace, policy, limit)
    assert kernel == python


def _allocator(policy):
    if policy == "bfc":
        return BFCAllocator(VirtualSubAllocator(), memory_limit=LIMIT)
    if policy == "caching":
        return CachingAllocator(VirtualSubAllocator(), memory_limit=LIMIT)
    return CompactAllocator(VirtualSubAllocator(contiguous=True), memory_limit=LIMIT,
                            page_size=64 << 10)


BAD_BATCHES = [
    (([256], [0], [10]), ValueError),  # would narrow to int8 0: an allocation
    (([0], [0], [10.5]), TypeError),  # would truncate to 10
    (([0], [0.0], [10]), TypeError),
    (([True], [0], [10]), TypeError),
    (([0], [0], [1 << 64]), ValueError),  # above int64
    (([0], [0], [np.uint64(1 << 63)]), ValueError),
    (([0], [-1], [10]), ValueError),
    (([0], [0], [-10]), ValueError),
    (([0, 1], [0], [10, 0]), ValueError),  # lengths differ
    (([0], [0], ["10"]), TypeError),
]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("batch,error", BAD_BATCHES)
def test_run_batch_validates_before_it_converts(policy, batch, error):
    a = _allocator(policy)
    a.allocate_raw(1000)
    before = a.memory_map() if hasattr(a, "memory_map") else a.snapshot()
    with pytest.raises(error):
        a.run_batch(*batch)
    after = a.memory_map() if hasattr(a, "memory_map") else a.snapshot()
    assert after == before
    check_invariants(a)


@pytest.mark.parametrize("policy", POLICIES)
def test_run_batch_ids_are_only_labels(policy):
    """An id of 2**62 costs no table of that size, and pairs as any id does."""
    a, b = _allocator(policy), _allocator(policy)
    big = a.run_batch([0, 0, 1, 0], [1 << 62, 7, 1 << 62, 1 << 62], [1000, 2000, 0, 3000])
    small = b.run_batch([0, 0, 1, 0], [0, 1, 0, 0], [1000, 2000, 0, 3000])
    assert big.tolist() == small.tolist()


@pytest.mark.parametrize("policy", POLICIES)
def test_run_batch_applies_what_comes_before_a_request_above_the_limit(policy):
    a = _allocator(policy)
    with pytest.raises(OutOfMemoryError) as e:
        a.run_batch([0, 0, 0], [0, 1, 2], [1000, MAX_INT64, 2000])
    assert e.value.reason == "limit" and e.value.num_bytes == MAX_INT64
    assert a.get_stats().bytes_in_use > 0  # the first allocation stays, as documented
    check_invariants(a)


@pytest.mark.parametrize("cls", [BFCAllocator, ReferenceBFCAllocator])
def test_an_alignment_that_pushes_a_region_past_int64_leaks_nothing(cls):
    backend = VirtualSubAllocator()
    a = cls(backend, memory_limit=LIMIT)
    assert a.allocate_raw(1000, 1 << 62) == 1 << 62
    for _ in range(2):
        with pytest.raises(OutOfMemoryError) as e:
            a.allocate_raw(1000, 1 << 62)
        assert e.value.reason == "backend"
    assert backend.bytes_held == a.get_stats().bytes_reserved


def test_compact_with_a_huge_alignment_leaks_nothing():
    backend = VirtualSubAllocator(contiguous=True)
    a = CompactAllocator(backend, memory_limit=LIMIT, page_size=64 << 10)
    for _ in range(3):
        try:
            a.allocate_raw(1000, 1 << 62)
        except OutOfMemoryError:
            pass
    assert backend.bytes_held == a.get_stats().bytes_reserved
    check_invariants(a)


def test_caching_without_a_limit_stops_before_its_counters_wrap():
    """Segments of nearly 1 EiB from an unbounded backend: the eighth would take
    reserved bytes past int64, so it is refused as a full device would be."""
    backend = VirtualSubAllocator()
    a = CachingAllocator(backend)
    served = 0
    with pytest.raises(OutOfMemoryError):
        for _ in range(16):
            a.allocate_raw((1 << 60) - 1)
            served += 1
    stats = a.memory_stats()
    assert served == 7
    assert 0 < stats["reserved_bytes.all.current"] == backend.bytes_held <= MAX_INT64
    check_invariants(a)


@pytest.mark.parametrize("policy", POLICIES)
def test_small_misuses_raise_documented_errors_and_change_nothing(policy):
    a = _allocator(policy)
    a.allocate_raw(1000)
    snap = a.memory_map if hasattr(a, "memory_map") else a.snapshot
    before = snap()
    for width in (0, -3):
        with pytest.raises(ValueError, match="width"):
            a.render_occupancy(width)
    with pytest.raises(TypeError, match="width"):
        a.render_occupancy(10.0)
    with pytest.raises(TypeError, match="attributes"):
        a.allocate_raw(1000, 256, "junk")
    if hasattr(a, "set_timing_counter"):
        with pytest.raises(TypeError, match="counter"):
            a.set_timing_counter(object())
    assert snap() == before
    assert len(a.render_occupancy(1)) == 1
    a.deallocate_raw(a.allocate_raw(2000))  # the refused counter was not installed
    check_invariants(a)


@pytest.mark.parametrize("granularity", [768, 3, 1000, 4096])
def test_virtual_backend_rounds_to_any_granularity(granularity):
    backend = VirtualSubAllocator(granularity=granularity)
    for n in (1, granularity - 1 or 1, granularity, granularity + 1, 10 * granularity + 7):
        _, received = backend.alloc(n)
        assert received % granularity == 0 and n <= received < n + granularity


class _Refusing:
    """``fail_if`` for a backend: refuse the calls whose ordinal is in ``refused``."""

    def __init__(self, refused):
        self.refused, self.calls = set(refused), 0

    def __call__(self, nbytes):
        self.calls += 1
        return self.calls in self.refused


@settings(max_examples=30, deadline=None)
@given(policy=st.sampled_from(POLICIES),
       sizes=st.lists(st.integers(1, 3 * MiB), min_size=1, max_size=30),
       refused=st.sets(st.integers(1, 12), max_size=4))
def test_a_refusing_backend_gets_the_same_calls_from_a_batch(policy, sizes, refused):
    """Issue 21, defect 6: after a growth the backend refused, a batch goes on
    as one call per operation does, without asking the backend again."""
    n = len(sizes)
    trace = Trace.from_arrays([0] * n + [1] * n, list(range(n)) * 2, sizes + [0] * n)
    results = []
    for engine in ("kernel", "python"):
        backend = VirtualSubAllocator(contiguous=policy == "compact",
                                      fail_if=_Refusing(refused))
        a = make_allocator(policy, 16 * MiB, backend=backend)
        r = replay(trace, a, engine=engine)
        check_invariants(a)
        results.append((r.ooms, r.addresses.tolist(), backend.num_allocs,
                        backend.num_failed_allocs, backend.fail_if.calls))
    assert results[0] == results[1]


def _planning_entry_points():
    from numba_bfc.planning import STRATEGIES, assign_objects, assign_offsets, lower_bound

    calls = [lambda r, s=s: assign_offsets(r, s) for s in (*STRATEGIES, "search")]
    calls += [lambda r, s=s: assign_objects(r, s) for s in STRATEGIES]
    calls += [lambda r: lower_bound(r, "objects"), lambda r: lower_bound(r, "offsets")]
    return calls


@pytest.mark.parametrize("records", [
    [(1 << 62, 0, 1), (1 << 62, 0, 1)],  # wrapped to -2**63 before
    [(1 << 61, 0, 1), (1 << 61, 2, 3)],  # disjoint lifetimes, still a sum of 2**62
    [(MAX_INT64, 0, 0)],
    [((1 << 60), 0, 5)] * 4,
])
def test_planners_refuse_sizes_whose_sum_int64_cannot_hold(records):
    """Issue 21, defect 2: every planner and bound refuses, none wraps."""
    for plan in _planning_entry_points():
        with pytest.raises(ValueError, match="2\\*\\*62"):
            plan(records)


def test_planners_accept_sums_just_below_the_bound():
    from numba_bfc.planning import assign_offsets, validate

    records = [((1 << 61), 0, 1), ((1 << 61) - 1, 0, 1)]
    plan = assign_offsets(records, "greedy_by_size")
    assert plan.total_size == (1 << 62) - 1
    validate(records, plan)


def test_plan_cli_refuses_a_wrapping_sum_with_one_error_line(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "big.csv"
    path.write_text(f"size,first,last\n{1 << 62},0,1\n{1 << 62},0,1\n")
    r = subprocess.run([sys.executable, "-m", "numba_bfc", "plan", str(path)],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith("numba-bfc plan: error:") and "2**62" in r.stderr
    assert len(r.stderr.splitlines()) == 1


class _ReentrantBackend(VirtualSubAllocator):
    """A backend whose ``free`` runs queued callbacks, as a finalizer run by a
    garbage collection inside it would."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.on_free = []

    def _free(self, ptr, nbytes):
        super()._free(ptr, nbytes)
        if self.on_free:
            self.on_free.pop(0)()


@pytest.mark.parametrize("seed", range(60))
def test_frees_that_reenter_a_compact_give_back_break_nothing(seed):
    """Issue 21, defect 5: frees re-entering ``empty_cache`` (from the backend's
    ``free``) raised IndexError or looped forever; now every due tail still
    goes back and the tables stay consistent."""
    import random

    rng = random.Random(seed)
    backend = _ReentrantBackend(contiguous=rng.random() < 0.5)
    a = CompactAllocator(backend, memory_limit=64 * MiB, page_size=64 << 10,
                         release_threshold=rng.choice([0, 64 << 10, MiB]),
                         small_size=rng.choice([64 << 10, MiB]))
    live = [a.allocate_raw(rng.randint(1000, 600_000)) for _ in range(rng.randint(5, 30))]
    rng.shuffle(live)
    k = rng.randint(0, len(live))
    for p in live[:k]:
        a.deallocate_raw(p)
    rest = live[k:]
    backend.on_free = [lambda ps=rest[i::3]: [a.deallocate_raw(p) for p in ps] for i in range(3)]
    a.empty_cache()
    check_invariants(a)
    assert backend.bytes_held == a.get_stats().bytes_reserved


def test_a_trace_whose_live_bytes_pass_int64_is_refused_by_name():
    """Issue 21, defect 3: the live-bytes series and peak wrapped; a trace that
    cannot be counted in int64 is now a ``TraceError`` at the event."""
    from numba_bfc.traces import TraceError

    with pytest.raises(TraceError) as e:
        Trace.from_arrays([0, 0, 0, 1, 1, 1], [0, 1, 2, 0, 1, 2], [1 << 62, 5, 1 << 62, 0, 0, 0])
    assert e.value.index == 2 and e.value.problem == "live_bytes_overflow"
    assert "int64" in str(e.value)


def test_trace_totals_count_past_int64_without_wrapping():
    sizes = [1 << 62] * 3
    trace = Trace.from_arrays([0, 1] * 3, [0] * 6, [s for s in sizes for _ in (0, 1)])
    assert trace.peak_requested_bytes == 1 << 62
    assert trace.summary()["total_requested_bytes"] == 3 << 62  # more than int64 holds


@pytest.mark.parametrize("header", ["size,first,last", "id,lower,upper,size"])
def test_planner_files_may_open_with_a_byte_order_mark(tmp_path, header):
    """Issue 21, defect 12: the trace reader accepted a UTF-8 BOM, the planner's did not."""
    from numba_bfc.planning import parse_records, read_records

    row = "16,0,1" if header.startswith("size") else "0,0,2,16"
    path = tmp_path / "records.csv"
    path.write_text(f"\ufeff{header}\n{row}\n", encoding="utf-8")
    assert read_records(path).tolist() == [(16, 0, 1)]
    assert parse_records(f"\ufeff{header}\n{row}\n").tolist() == [(16, 0, 1)]
