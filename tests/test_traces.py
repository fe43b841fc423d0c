"""Traces: validation, formats, recording, replay through every policy, the CLI."""

import gzip
import io
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numba_bfc import BFCAllocator, CachingAllocator, OutOfMemoryError
from numba_bfc.adaptors import LoggingAllocator
from numba_bfc.backends import VirtualSubAllocator
from numba_bfc.cli.replay import main as replay_main
from numba_bfc.planning import validate
from numba_bfc.traces import (
    SERIES_DTYPE,
    Trace,
    TraceError,
    guess_format,
    make_allocator,
    min_limit,
    read_trace,
    replay,
    sweep,
    sweep_tasks,
)
from numba_bfc.traces.data import bundled_names, load_bundled
from numba_bfc.traces.synthetic import GENERATORS, random_churn

KIB, MIB = 1 << 10, 1 << 20


def small_trace():
    return Trace.from_arrays(op=[0, 0, 1, 0, 1, 1], id=[7, 9, 7, 7, 9, 7],
                             size=[1000, 5000, 0, 3000, 0, 0], name="small")


@st.composite
def traces(draw, max_events=120, max_size=8 * MIB):
    """Random valid traces: allocations of random sizes, frees of random live ids."""
    n = draw(st.integers(0, max_events))
    ops, ids, sizes, live = [], [], [], []
    next_id = 0
    for _ in range(n):
        if live and draw(st.booleans()):
            k = draw(st.integers(0, len(live) - 1))
            ops.append(1)
            ids.append(live.pop(k))
            sizes.append(0)
        else:
            ops.append(0)
            ids.append(next_id)
            sizes.append(draw(st.one_of(st.integers(1, 4096), st.integers(1, max_size))))
            live.append(next_id)
            next_id += 1
    return Trace.from_arrays(ops, ids, sizes, name="random")


# ---------------------------------------------------------------------- Trace
def test_free_sizes_and_pairing():
    t = small_trace()
    assert t.sizes.tolist() == [1000, 5000, 1000, 3000, 5000, 3000]
    assert t.slots().tolist() == [0, 1, 0, 2, 1, 2]
    assert t.partners().tolist() == [2, 4, 0, 5, 1, 3]
    assert t.live_bytes().tolist() == [1000, 6000, 5000, 8000, 3000, 0]
    assert t.peak_requested_bytes == 8000
    assert t.summary()["never_freed"] == 0


@pytest.mark.parametrize("op,id,size,index,problem", [
    ([0, 1, 1], [1, 1, 1], [10, 0, 0], 2, "double_free"),
    ([0, 1], [1, 2], [10, 0], 1, "unknown_free"),
    ([0, 0], [1, 1], [10, 20], 1, "live_id_reused"),
    ([0, 0], [1, 2], [10, 0], 1, "bad_size"),
    ([0, 0], [1, 2], [10, -5], 1, "bad_size"),
    ([0, 2], [1, 1], [10, 0], 1, "bad_op"),
    ([0, 1], [1, 1], [10, 11], 1, "size_mismatch"),
])
def test_validation_names_the_event(op, id, size, index, problem):
    with pytest.raises(TraceError) as e:
        Trace.from_arrays(op, id, size, name="t")
    assert e.value.index == index and e.value.problem == problem
    assert f"event {index}" in str(e.value) and str(e.value).startswith("t:")


def test_clean_drops_and_counts():
    raw = Trace.from_arrays([1, 0, 0, 1, 1, 0, 1], [5, 1, 1, 1, 1, 2, 2], [0, 10, 20, 0, 0, 0, 0],
                            validate=False)
    assert raw.problems() == {"unknown_free": 2, "live_id_reused": 1, "double_free": 1,
                              "bad_size": 1}
    clean = raw.clean()
    assert clean.dropped == {"unknown_free": 2, "live_id_reused": 1, "double_free": 1,
                             "bad_size": 1}
    assert clean.ops.tolist() == [0, 1] and clean.sizes.tolist() == [10, 10]
    with pytest.raises(TraceError, match="4 more bad events"):
        raw.validate()


def test_an_id_may_be_reused_after_its_free():
    t = Trace.from_arrays([0, 1, 0, 1], [3, 3, 3, 3], [10, 0, 20, 0])
    assert t.slots().tolist() == [0, 0, 1, 1] and t.sizes.tolist() == [10, 10, 20, 20]


def test_bad_columns():
    with pytest.raises(ValueError, match="shape"):
        Trace.from_arrays([0, 1], [1], [1, 1])
    with pytest.raises(TypeError, match="integers"):
        Trace.from_arrays([0], [1], [1.5])
    with pytest.raises(TypeError, match="op, id and size"):
        Trace(np.zeros(3, dtype=[("a", "i8")]))


@given(traces())
def test_lifetimes_conflict_exactly_when_live_together(t):
    rec = t.lifetimes()
    live = np.zeros((len(t), t.num_allocations), dtype=bool)
    slots = t.slots()
    state = np.zeros(t.num_allocations, dtype=bool)
    for i, (op, s) in enumerate(zip(t.ops, slots)):
        state[s] = op == 0
        live[i] = state
    together = (live[:, :, None] & live[:, None, :]).any(axis=0)
    first, last = rec["first"], rec["last"]
    conflict = (first[:, None] <= last[None, :]) & (first[None, :] <= last[:, None])
    assert np.array_equal(conflict, together)
    assert rec["size"].tolist() == t.sizes[t.ops == 0].tolist()


# ---------------------------------------------------------------------- formats
@given(traces())
def test_csv_round_trip(tmp_path_factory, t):
    path = tmp_path_factory.mktemp("csv") / "t.csv.gz"
    t.write(path)
    assert read_trace(path) == t
    with gzip.open(path, "rt") as f:
        assert f.readline().strip() == "op,id,size"


def test_csv_stream_time_and_extra_columns(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("note,op,size,id,stream,time\nhi,a,100,4,7,0.5\n,f,,4,7,1.25\n")
    t = Trace.read(path)
    assert t.ops.tolist() == [0, 1] and t.sizes.tolist() == [100, 100]
    assert t.streams.tolist() == [7, 7] and t.times.tolist() == [0.5, 1.25]
    t.write(tmp_path / "y.csv")
    assert (tmp_path / "y.csv").read_text().splitlines()[0] == "op,id,size,stream,time"
    assert Trace.read(tmp_path / "y.csv") == t


@pytest.mark.parametrize("text,match", [
    ("", "empty file"),
    ("op,size\na,1\n", "missing id"),
    ("op,id,size\nx,1,1\n", "line 2: op must be 'a' or 'f'"),
    ("op,id,size\na,1,1\na,2\n", "line 3: 2 fields"),
    ("op,id,size\na,1,1\na,zz,1\n", "line 3: bad id"),
    ("op,id,size\na,1,1\nf,1,0\nf,1,0\n", "event 2 frees id 1, which is already freed"),
])
def test_bad_csv(tmp_path, text, match):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        Trace.read(path)


def test_rmm_round_trip_and_failures(tmp_path):
    t = small_trace()
    path = tmp_path / "log.csv"
    t.write(path, "rmm")
    assert guess_format(path) == "rmm"
    back = Trace.read(path)
    assert back.ops.tolist() == t.ops.tolist() and back.sizes.tolist() == t.sizes.tolist()
    assert back.slots().tolist() == t.slots().tolist()
    lines = path.read_text().splitlines()
    lines.insert(2, "0,00:00:00.000000,allocate failure,(nil),99999999,0")
    path.write_text("\n".join(lines) + "\n")
    again = Trace.read(path)
    assert again.dropped == {"allocate_failure": 1} and len(again) == len(t)


def test_logging_allocator_log_replays(tmp_path):
    """The framework's RMM log of a real run reads back as the same request stream."""
    log = tmp_path / "run.csv"
    inner = BFCAllocator(VirtualSubAllocator(), memory_limit=64 * MIB, allow_growth=True)
    rng = np.random.default_rng(1)
    asked, live = [], []
    with LoggingAllocator(inner, log) as a:
        for _ in range(300):
            if live and rng.random() < 0.45:
                p, n = live.pop(int(rng.integers(len(live))))
                a.deallocate_raw(p)
                asked.append((1, n))
            else:
                n = int(rng.integers(1, 1 << 18))
                live.append((a.allocate_raw(n), n))
                asked.append((0, n))
    t = Trace.read(log)
    assert list(zip(t.ops.tolist(), t.sizes.tolist())) == asked
    # Addresses reused after a free became new ids.
    assert t.num_allocations == sum(1 for op, _ in asked if op == 0)


def test_guess_format(tmp_path):
    (tmp_path / "a.csv").write_text("op,id,size\n")
    (tmp_path / "b.json").write_text("{}")
    (tmp_path / "c.pickle").write_bytes(b"\x80\x04")
    assert [guess_format(tmp_path / f) for f in ("a.csv", "b.json", "c.pickle")] == [
        "csv", "torch_profiler", "torch_snapshot"]
    with pytest.raises(ValueError, match="unknown trace format"):
        read_trace(tmp_path / "a.csv", "xml")


# ---------------------------------------------------------------------- recording
def test_record_collects_events_and_restores():
    a = CachingAllocator(VirtualSubAllocator())
    with Trace.record(a, name="rec") as rec:
        p = a.allocate_raw(1000)
        q = a.allocate_raw(3 * MIB)
        a.deallocate_raw(p)
        with pytest.raises(RuntimeError, match="already being recorded"):
            with Trace.record(a):
                pass
    a.deallocate_raw(q)  # after the block: not recorded
    t = rec.trace
    assert t.name == "rec" and t.ops.tolist() == [0, 0, 1]
    assert t.sizes.tolist() == [1000, 3 * MIB, 1000] and np.all(np.diff(t.times) >= 0)
    assert "allocate_raw" not in vars(a)
    # Replaying the recording on a fresh allocator reproduces the addresses.
    r = replay(t, CachingAllocator(VirtualSubAllocator()))
    assert r.addresses[:2].tolist() == [p, q]


def test_record_a_free_whose_address_is_handed_out_again_at_once():
    """Another thread may be handed a freed address before the free is recorded:
    the free took the pointer's entry after freeing, which was then the new
    allocation's, so the trace freed the new block and never the old one. Here
    the backend's free itself allocates the same size again (same address)."""
    class ReallocatingFree(BFCAllocator):
        def deallocate_raw(self, ptr):
            super().deallocate_raw(ptr)
            self.again = self.allocate_raw(1000)  # the recorded method

    a = ReallocatingFree(VirtualSubAllocator(), memory_limit=1 << 30)
    with Trace.record(a) as rec:
        p = a.allocate_raw(1000)
        a.deallocate_raw(p)
    assert a.again == p
    t = rec.trace
    assert t.ops.tolist() == [0, 0, 1] and t.ids.tolist() == [0, 1, 0]


def test_record_a_free_that_raises_keeps_the_allocation_live():
    class FailsOnce(BFCAllocator):
        def deallocate_raw(self, ptr):
            if not hasattr(self, "failed"):
                self.failed = True
                raise RuntimeError("not this time")
            super().deallocate_raw(ptr)

    a = FailsOnce(VirtualSubAllocator(), memory_limit=1 << 30)
    with Trace.record(a) as rec:
        p = a.allocate_raw(1000)
        with pytest.raises(RuntimeError, match="not this time"):
            a.deallocate_raw(p)
        a.deallocate_raw(p)
    assert rec.trace.ops.tolist() == [0, 1] and rec.trace.ids.tolist() == [0, 0]


# ---------------------------------------------------------------------- replay
def _drive_by_hand(t, a, alignment=256):
    """The per-event Python loop that replay must match."""
    ptr = {}
    out = []
    for op, slot, size in zip(t.ops.tolist(), t.slots().tolist(), t.sizes.tolist()):
        if op == 0:
            ptr[slot] = a.allocate_raw(size, alignment)
            out.append(ptr[slot])
        else:
            a.deallocate_raw(ptr.pop(slot))
            out.append(0)
    return out


@pytest.mark.parametrize("policy", ["bfc", "caching"])
@given(t=traces())
def test_replay_matches_the_python_api(policy, t):
    by_hand = make_allocator(policy)
    expected = _drive_by_hand(t, by_hand)
    fast = make_allocator(policy)
    r = replay(t, fast, series_points=7)
    assert r.engine == "kernel" and r.addresses.tolist() == expected
    assert fast.get_stats() == by_hand.get_stats()
    assert fast.tables["chunks"].tobytes() == by_hand.tables["chunks"].tobytes()
    assert r.backend_allocs == by_hand.backend.num_allocs
    # Peaks are exact: every event is sampled, whatever the bucket count.
    slow = replay(t, make_allocator(policy), engine="python", series_points=0)
    assert (slow.peak_in_use_bytes, slow.peak_reserved_bytes) == (
        r.peak_in_use_bytes, r.peak_reserved_bytes)
    assert r.peak_requested_bytes == t.peak_requested_bytes
    if len(t):
        assert r.peak_in_use_bytes == by_hand.get_stats().peak_bytes_in_use
        assert r.peak_reserved_bytes == by_hand.get_stats().peak_bytes_reserved
        assert r.series.size <= 7 and r.series["event"][-1] == len(t) - 1
        assert r.series["requested"].max() == t.peak_requested_bytes


@pytest.mark.parametrize("policy", ["bfc", "caching"])
@given(t=traces(max_events=60))
def test_replay_matches_the_oracle(policy, t):
    fast = replay(t, policy)
    oracle = replay(t, policy + "-oracle")
    assert oracle.engine == "python"
    assert fast.addresses.tolist() == oracle.addresses.tolist()
    for key in ("peak_in_use_bytes", "peak_reserved_bytes", "backend_allocs", "backend_frees"):
        assert getattr(fast, key) == getattr(oracle, key), key
    assert np.array_equal(fast.series, oracle.series)


@pytest.mark.parametrize("policy", ["bfc", "caching"])
def test_limit_ooms_are_counted_and_skipped(policy):
    # 3 x 12 MiB live at once cannot fit in 32 MiB; the failed one's free is skipped.
    t = Trace.from_arrays([0, 0, 0, 1, 1, 1, 0, 1], [1, 2, 3, 1, 2, 3, 4, 4],
                          [12 * MIB] * 3 + [0] * 3 + [MIB, 0])
    r = replay(t, policy, limit=32 * MIB)
    assert r.ooms == 1 and r.first_oom.event == 2 and r.first_oom.size == 12 * MIB
    assert r.first_oom.reason and r.first_oom.message
    assert r.events == len(t) and r.addresses[2] == 0 and r.addresses[6] > 0
    assert r.peak_reserved_bytes <= 32 * MIB
    stop = replay(t, policy, limit=32 * MIB, stop_on_oom=True)
    assert stop.events == 3 and stop.ooms == 1
    python = replay(t, make_allocator(policy, 32 * MIB), engine="python")
    assert python.ooms == 1 and python.addresses.tolist() == r.addresses.tolist()


@pytest.mark.parametrize("policy", ["bfc", "caching", "compact"])
@settings(max_examples=40, deadline=None)
@given(t=traces(max_events=150, max_size=12 * MIB), limit_mib=st.integers(6, 40))
def test_failures_the_kernel_makes_leave_what_single_calls_leave(policy, t, limit_mib):
    """Past a replay's first failure, the caching and compact kernels fail
    allocations themselves where the slow path would change only counters
    (``FAILED_HERE``): the same failures, addresses, counters and tables as one
    API call per event."""
    fast_allocator, slow_allocator = (make_allocator(policy, limit_mib * MIB) for _ in range(2))
    fast = replay(t, fast_allocator, series_points=len(t))
    slow = replay(t, slow_allocator, engine="python", series_points=len(t))
    assert (fast.ooms, fast.first_oom) == (slow.ooms, slow.first_oom)
    assert fast.addresses.tolist() == slow.addresses.tolist()
    assert np.array_equal(fast.series, slow.series)
    assert (fast.backend_allocs, fast.backend_frees) == (slow.backend_allocs, slow.backend_frees)
    assert fast_allocator.get_stats() == slow_allocator.get_stats()
    if policy == "caching":
        assert fast_allocator.memory_stats() == slow_allocator.memory_stats()
    fast_backend, slow_backend = fast_allocator.backend, slow_allocator.backend
    assert fast_backend.mapped_ranges() == slow_backend.mapped_ranges()
    assert (fast_backend.num_allocs, fast_backend.num_frees, fast_backend.bytes_held) == (
        slow_backend.num_allocs, slow_backend.num_frees, slow_backend.bytes_held)
    for name, table in fast_allocator.tables.items():
        if name != "state":  # which holds the tables' addresses
            assert table.tobytes() == slow_allocator.tables[name].tobytes(), name
    # And the next single call fails or succeeds alike.
    outcomes = []
    for a in (fast_allocator, slow_allocator):
        try:
            outcomes.append(a.allocate_raw(limit_mib * MIB // 2))
        except OutOfMemoryError as e:
            outcomes.append(e.reason)
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize("policy", ["caching", "compact"])
def test_a_replay_builds_no_error_for_failures_the_kernel_makes(policy):
    n = 300
    t = Trace.from_arrays([0] * n + [1] * n, list(range(n)) * 2, [MIB] * n + [0] * n)
    allocator = make_allocator(policy, 32 * MIB)
    built = []
    out_of_memory = allocator._out_of_memory
    allocator._out_of_memory = lambda *args: built.append(args) or out_of_memory(*args)
    r = replay(t, allocator)
    assert r.ooms > 250 and len(built) == 1  # the first failure's error only
    assert r.first_oom.size == MIB
    if policy == "caching":
        stats = allocator.memory_stats()
        assert stats["num_ooms"] == stats["num_alloc_retries"] == r.ooms


@pytest.mark.parametrize("policy", ["caching", "compact"])
def test_after_failures_a_request_that_fits_exactly_is_served(policy):
    # 20 MiB live in 32 MiB: two more 20 MiB fail, 12 MiB fits to the byte,
    # then nothing fits until a free.
    t = Trace.from_arrays([0, 0, 0, 0, 0, 1, 0], [0, 1, 2, 3, 4, 0, 5],
                          [20 * MIB, 20 * MIB, 20 * MIB, 12 * MIB, 256, 0, 20 * MIB])
    fast = replay(t, make_allocator(policy, 32 * MIB))
    slow = replay(t, make_allocator(policy, 32 * MIB), engine="python")
    assert fast.addresses.tolist() == slow.addresses.tolist()
    assert fast.ooms == slow.ooms == 3
    assert [bool(a) for a in fast.addresses] == [True, False, False, True, False, False, True]


def test_after_a_failure_compact_gives_pages_back_to_serve_a_request():
    """Past the first failure, a request that growth alone cannot serve but
    giving a freed run of whole pages back can is not failed in the kernel:
    the slow path punches the pages out and grows."""
    # In 32 MiB: 8 + 8 + 8 + 6 live, 4 fails (the first); the second 8 goes;
    # 10 then fits only once its pages go back and the space grows at its top.
    t = Trace.from_arrays([0, 0, 0, 0, 0, 1, 0], [0, 1, 2, 3, 4, 1, 5],
                          [8 * MIB, 8 * MIB, 8 * MIB, 6 * MIB, 4 * MIB, 0, 10 * MIB])
    fast_allocator, slow_allocator = (make_allocator("compact", 32 * MIB) for _ in range(2))
    fast = replay(t, fast_allocator)
    slow = replay(t, slow_allocator, engine="python")
    assert fast.addresses.tolist() == slow.addresses.tolist() and fast.addresses[6] > 0
    assert fast.ooms == slow.ooms == 1
    assert fast_allocator.backend.mapped_ranges() == slow_allocator.backend.mapped_ranges()


def test_a_failure_after_releasing_the_cache_is_the_kernels_too():
    """Past the first failure, one that releases cached segments and still
    fails (PyTorch's release_cached_blocks, then the retry) happens in the
    kernel: the segments go back to the backend in PyTorch's order, and the
    next segment goes where the backend puts it after those frees."""
    MiB = MIB
    # In 48 MiB: 20 live; 30 fails (the first); a 20 MiB and a 2 MiB segment
    # come and go (cached); 30 then releases both and still fails; 4 takes a
    # new segment.
    ops = [0, 0, 0, 0, 1, 1, 0, 0]
    ids = [0, 1, 2, 3, 2, 3, 4, 5]
    sizes = [20 * MiB, 30 * MiB, 4 * MiB, 100_000, 0, 0, 30 * MiB, 4 * MiB]
    t = Trace.from_arrays(ops, ids, sizes)
    fast_allocator, slow_allocator = (make_allocator("caching", 48 * MiB) for _ in range(2))
    slow_paths = []
    malloc_slow = fast_allocator._malloc_slow
    fast_allocator._malloc_slow = lambda n: slow_paths.append(n) or malloc_slow(n)
    fast = replay(t, fast_allocator)
    slow = replay(t, slow_allocator, engine="python")
    assert slow_paths == [30 * MiB]  # only the first failure went through the façade
    assert fast.ooms == slow.ooms == 2
    assert fast.addresses.tolist() == slow.addresses.tolist() and fast.addresses[7] > 0
    stats = fast_allocator.memory_stats()
    assert stats == slow_allocator.memory_stats() and stats["num_device_free"] == 2
    assert fast_allocator.backend.mapped_ranges() == slow_allocator.backend.mapped_ranges()
    assert fast_allocator.backend.num_frees == 2


def _release_trace(segments):
    """``segments`` small-pool segments (2 MiB, two 1 MiB blocks each) made
    and cached, then 12 MiB, over the limit until they are released: the
    limit is what they and the 12 MiB segment's first try leave 2 MiB short."""
    n = 2 * segments
    ops = [0] * n + [1] * n + [0]
    ids = list(range(n)) * 2 + [n]
    sizes = [MIB] * n + [0] * n + [12 * MIB]
    return Trace.from_arrays(ops, ids, sizes), (2 * segments + 10) * MIB


def _same_as_single_calls(t, limit, backend=None, other_backend=None):
    """Replay ``t`` through the kernel and one API call per event; assert
    equal outcomes; return the kernel's allocator and its slow-path calls."""
    fast_allocator = make_allocator("caching", limit, backend=backend)
    slow_allocator = make_allocator("caching", limit, backend=other_backend)
    slow_paths = []
    malloc_slow = fast_allocator._malloc_slow
    fast_allocator._malloc_slow = lambda n: slow_paths.append(n) or malloc_slow(n)
    fast = replay(t, fast_allocator)
    slow = replay(t, slow_allocator, engine="python")
    assert fast.addresses.tolist() == slow.addresses.tolist()
    assert (fast.ooms, fast.first_oom) == (slow.ooms, slow.first_oom)
    assert fast_allocator.memory_stats() == slow_allocator.memory_stats()
    fast_backend, slow_backend = fast_allocator.backend, slow_allocator.backend
    assert fast_backend.mapped_ranges() == slow_backend.mapped_ranges()
    for name in ("num_allocs", "num_frees", "num_failed_allocs", "bytes_held",
                 "peak_bytes_held"):
        assert getattr(fast_backend, name) == getattr(slow_backend, name), name
    return fast_allocator, slow_paths


@pytest.mark.parametrize("segments, in_kernel", [(3, True), (40, True), (70, False)])
def test_a_retry_after_releasing_the_cache_is_the_kernels(segments, in_kernel):
    """A new segment over the limit until the cached segments go back: the
    kernel releases them, moves its lease back and makes the segment where
    the backend puts it after those frees, as PyTorch's slow path would
    (release_cached_blocks, then the retry), with no trip to the façade.
    40 segments do not fit beside the 80 already in the lease's log: the
    façade records it and the kernel goes on; 70 do not fit in any log:
    the façade's slow path releases them."""
    t, limit = _release_trace(segments)
    allocator, slow_paths = _same_as_single_calls(t, limit)
    assert slow_paths == ([] if in_kernel else [12 * MIB])
    stats = allocator.memory_stats()
    assert stats["num_device_free"] == segments and stats["num_alloc_retries"] == 1
    assert stats["num_ooms"] == 0 and stats["num_sync_all_streams"] == 1
    # Every segment went back, so the new one goes where a fresh backend puts its first.
    assert allocator.backend.mapped_ranges() == [VirtualSubAllocator().alloc(12 * MIB, 512)]


def test_a_backend_shared_with_others_keeps_releases_in_the_facade():
    """The kernel moves its lease back after a release only where this
    allocator's segments are all the backend holds: with memory of another
    user in it, the façade's slow path releases them, with the same result."""
    t, limit = _release_trace(3)
    backends = [VirtualSubAllocator() for _ in range(2)]
    for b in backends:
        b.alloc(4 * MIB, 512)  # someone else's
    _, slow_paths = _same_as_single_calls(t, limit, *backends)
    assert slow_paths == [12 * MIB]


def test_replay_result_metrics_and_offline():
    t = GENERATORS["steady_state"](iterations=3, layers=6)
    r = replay(t, "bfc", offline=True)
    d = r.to_dict()
    for key in ("peak_requested_bytes", "peak_in_use_bytes", "peak_reserved_bytes",
                "backend_allocs", "backend_frees", "ooms", "events", "seconds"):
        assert key in d
    assert json.loads(json.dumps(d)) == d
    assert r.peak_requested_bytes <= r.peak_in_use_bytes <= r.peak_reserved_bytes
    assert r.reserved_ratio == r.peak_reserved_bytes / r.peak_requested_bytes
    # The offline plan is valid, and never below the max-live lower bound.
    from numba_bfc.planning import assign_offsets
    plan = assign_offsets(t.lifetimes(), "greedy_by_size")
    validate(t.lifetimes(), plan)
    assert r.offline_bytes == plan.total_size >= t.peak_requested_bytes
    assert r.series.dtype == SERIES_DTYPE


def test_replay_rejects_bad_arguments():
    t = small_trace()
    with pytest.raises(ValueError, match="unknown policy"):
        replay(t, "best")
    with pytest.raises(ValueError, match="policy name"):
        replay(t, make_allocator("bfc"), limit=1)
    with pytest.raises(ValueError, match="engine"):
        replay(t, "bfc", engine="gpu")
    with pytest.raises(TypeError, match="no batch kernel"):
        replay(t, "bfc-oracle", engine="kernel")


def test_progress_reports():
    seen = []
    replay(small_trace(), "bfc", progress=lambda done, total: seen.append((done, total)))
    assert seen == [(6, 6)]


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_synthetic_generators_are_seeded(name):
    a, b, c = GENERATORS[name](seed=1), GENERATORS[name](seed=1), GENERATORS[name](seed=2)
    assert a == b and a != c and a.is_valid and len(a) > 1000


@given(live=st.integers(1, 40), pairs=st.integers(0, 200), seed=st.integers(0, 2**32 - 1),
       min_size=st.integers(1, 5000), spread=st.integers(0, 5000))
@settings(max_examples=60, deadline=None)
def test_random_churn_is_the_walk_it_describes(live, pairs, seed, min_size, spread):
    # The vectorised generator against the process written out step by step,
    # with the same draws: live allocations, then per pair the free of what
    # the picked slot holds and a new allocation in it.
    t = random_churn(live, pairs, min_size, min_size + spread, seed)
    rng = np.random.default_rng(seed)
    first = rng.integers(min_size, min_size + spread + 1, live)
    slot = rng.integers(0, live, pairs)
    later = rng.integers(min_size, min_size + spread + 1, pairs)
    holds = list(range(live))
    events = [(0, i, int(first[i])) for i in range(live)]
    for k in range(pairs):
        events += [(1, holds[slot[k]], None), (0, live + k, int(later[k]))]
        holds[slot[k]] = live + k
    assert [(op, i, size if op == 0 else None)
            for op, i, size in zip(t.ops.tolist(), t.ids.tolist(), t.sizes.tolist())] == events
    still_live = set(holds)
    assert t.is_valid and int(t.live_bytes()[-1]) == sum(
        size for op, i, size in events if op == 0 and i in still_live)


@pytest.mark.parametrize("bad", [dict(live=0), dict(pairs=-1), dict(min_size=0),
                                 dict(min_size=10, max_size=9)])
def test_random_churn_refuses_bad_arguments(bad):
    with pytest.raises(ValueError, match="random_churn needs"):
        random_churn(**bad)


def test_bundled_traces():
    names = bundled_names()
    assert len(names) >= 2
    for name in names:
        t = load_bundled(name)
        assert t.is_valid and len(t) > 100 and t.peak_requested_bytes > 0
        r = replay(t, "caching")
        assert r.events == len(t) and r.ooms == 0
    with pytest.raises(ValueError, match="no bundled trace"):
        load_bundled("nope")


# ---------------------------------------------------------------------- CLI
def _cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    code = replay_main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_cli_table_and_json(tmp_path):
    path = tmp_path / "t.csv"
    small_trace().write(path)
    code, out, _ = _cli(str(path), "synthetic:bursty", "--policy", "bfc,caching")
    assert code == 0
    rows = [line for line in out.splitlines() if line.startswith(("t ", "bursty"))]
    assert len(rows) == 4
    code, out, _ = _cli(str(path), "--json", "--limit", "1MiB", "--offline")
    data = json.loads(out)
    assert [d["policy"] for d in data] == ["bfc", "caching"]
    assert all(d["limit"] == MIB and d["events"] == 6 for d in data)
    assert data[0]["offline_bytes"] == 8000


def test_cli_errors(tmp_path):
    code, _, err = _cli(str(tmp_path / "missing.csv"))
    assert code == 2 and "error" in err
    code, _, err = _cli("synthetic:bursty", "--policy", "nope")
    assert code == 2 and "unknown policy nope" in err
    code, _, err = _cli("synthetic:bursty", "--limit", "12GB")
    assert code == 2 and "--limit" in err
    bad = tmp_path / "bad.csv"
    bad.write_text("op,id,size\nf,1,0\na,2,10\n")
    code, _, err = _cli(str(bad), "--strict")
    assert code == 2 and "event 0 frees id 1, which was never allocated" in err
    code, out, err = _cli(str(bad))
    assert code == 0 and "unknown_free: 1" in err


def test_sweep_is_every_replay_in_trace_policy_limit_order():
    traces = [small_trace(), GENERATORS["bursty"]()]
    limits = [None, 20 * MIB, 4096]
    results = sweep(traces, ["bfc", "compact"], limits)
    assert [(r.trace, r.policy, r.limit) for r in results] == [
        (t.name, p, lim) for t in traces for p in ("bfc", "compact") for lim in limits]
    for r in results:
        alone = replay(traces[0] if r.trace == traces[0].name else traces[1], r.policy,
                       limit=r.limit)
        assert (r.ooms, r.peak_reserved_bytes) == (alone.ooms, alone.peak_reserved_bytes)
        assert r.addresses.tolist() == alone.addresses.tolist()
    found = sweep(traces, ["caching"], min_limit=True)
    assert [m.limit for m in found] == [min_limit(t, "caching").limit for t in traces]


def test_sweep_refuses_bad_settings_before_replaying_anything():
    t = small_trace()
    with pytest.raises(ValueError, match="unknown policy 'tetris'"):
        sweep([t], ["bfc", "tetris"])
    with pytest.raises(ValueError, match="at least one trace"):
        sweep([], ["bfc"])
    with pytest.raises(ValueError, match="limits is empty"):
        sweep([t], ["bfc"], [])
    with pytest.raises(ValueError, match="from 1 to 2\\*\\*62 - 1"):
        sweep([t], ["bfc"], [1 << 62])
    with pytest.raises(ValueError, match="from 1 to"):
        sweep([t], ["bfc"], [0])
    with pytest.raises(TypeError, match="int or None, not float"):
        sweep([t], ["bfc"], [1e9])
    with pytest.raises(TypeError, match="int or None, not bool"):
        sweep([t], ["bfc"], [True])
    with pytest.raises(ValueError, match="min_limit finds the limit"):
        sweep([t], ["bfc"], [MIB], min_limit=True)
    with pytest.raises(TypeError, match="Trace objects, not dict"):
        sweep_tasks([{}], ["bfc"])


def test_cli_limits_sweep_has_a_limit_column():
    code, out, _ = _cli("synthetic:bursty", "--policy", "bfc", "--limit", "1GiB,4KiB")
    assert code == 0
    head, _, first, second = out.splitlines()[:4]
    assert head.split()[:3] == ["trace", "policy", "limit"]
    assert first.split()[:3] == ["bursty(seed=0)", "bfc", "1.00GiB"]
    assert second.split()[:3] == ["bursty(seed=0)", "bfc", "4.00KiB"]
    assert "bursty(seed=0)/bfc at 4.00KiB: first OOM at event" in out
    code, out, _ = _cli("synthetic:bursty", "--policy", "bfc", "--limit", "1GiB,4KiB", "--json")
    assert [d["limit"] for d in json.loads(out)] == [1 << 30, 4096]


def test_cli_scheduler_errors():
    code, _, err = _cli("synthetic:bursty", "--scheduler", "local:0")
    assert code == 2 and "expected local or local:N" in err
    code, _, err = _cli("synthetic:bursty", "--scheduler", "local:two")
    assert code == 2 and "expected local or local:N" in err
    code, _, err = _cli("synthetic:bursty", "--limit", "1GiB,", "--no-progress")
    assert code == 2 and "--limit" in err


def test_cli_plot(tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "p.png"
    code, _, _ = _cli("synthetic:growing_kv_cache", "--plot", str(png))
    assert code == 0 and png.read_bytes()[:4] == b"\x89PNG"


@given(traces(max_events=60))
def test_torch_snapshot_round_trip_through_trace(tmp_path_factory, t):
    path = tmp_path_factory.mktemp("snap") / "snapshot.pickle"
    t.write(path)
    assert guess_format(path) == "torch_snapshot"
    back = Trace.read(path)
    assert back.ops.tolist() == t.ops.tolist() and back.sizes.tolist() == t.sizes.tolist()
    assert back.slots().tolist() == t.slots().tolist()
    a, b = replay(t, "caching"), replay(back, "caching")
    assert a.addresses.tolist() == b.addresses.tolist()


def test_profiler_trace_through_trace_read(tmp_path):
    events = [{"ph": "i", "name": "[memory]", "ts": 10.0 + k,
               "args": {"Addr": addr, "Bytes": nbytes, "Device Type": 0, "Device Id": -1}}
              for k, (addr, nbytes) in enumerate([(64, 1000), (128, 500), (64, -1000),
                                                  (64, 2000), (999, -8), (128, -500)])]
    path = tmp_path / "prof.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    with pytest.raises(TraceError, match="event 4 frees id"):
        Trace.read(path)
    t = Trace.read(path, clean=True)
    assert t.dropped == {"unknown_free": 1}
    assert t.ops.tolist() == [0, 0, 1, 0, 1] and t.sizes.tolist() == [1000, 500, 1000, 2000, 500]
    assert t.slots().tolist() == [0, 1, 0, 2, 1]  # address 64 reused: a new allocation
