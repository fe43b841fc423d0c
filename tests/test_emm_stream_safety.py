"""Stream-safe reuse in the Numba EMM plugin, on CPU: a freed block goes back to
the pool only after the device work queued before its free has finished.

The manager runs over the simulated backend with a fake context and a
scripted device (``ScriptedDevice``, a ``FenceSource``) whose work the test
queues and completes explicitly, so every interleaving is reproducible. The
same code runs over CUDA events on the fake CUDA driver in
``tests/gpu/test_gpu_stream_safety.py``.
"""

import gc
import threading

import pytest

cuda = pytest.importorskip("numba.cuda")
if not hasattr(cuda, "HostOnlyCUDAMemoryManager"):
    pytest.skip("the CUDA simulator has no EMM interface", allow_module_level=True)

from _support import FakeContext, addr, make_manager  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from numba_bfc.backends import VirtualSubAllocator  # noqa: E402
from numba_bfc.integrations import stream_safety as ss  # noqa: E402
from numba_bfc.integrations.numba_emm import (  # noqa: E402
    CudaOutOfMemoryError,
    NumbaBFCMemoryManager,
    use_numba_bfc,
)
from numba_bfc.testing.invariants import check_invariants  # noqa: E402

MiB = 1 << 20
LEGACY, NON_BLOCKING_A, NON_BLOCKING_B, BLOCKING = 1, 0x5000, 0x6000, 0x7000


class ScriptedDevice:
    """A device whose streams run only when the test says (a ``FenceSource``).

    Blocking streams and the legacy stream share one queue (the legacy stream
    orders them); each non-blocking stream has its own. ``submit(stream)``
    queues work and returns its position; ``run(stream, upto)`` completes work
    up to a position. A token is complete once its queue has run past it;
    ``wait`` runs the queue that far, as a blocking wait on a GPU does.
    """

    def __init__(self, non_blocking=(NON_BLOCKING_A, NON_BLOCKING_B)):
        self.non_blocking = set(non_blocking)
        self.queued, self.done = {}, {}
        self.live, self.next_token = {}, 1
        self.records = self.queries = self.waits = self.recycled = 0
        self.closed = False

    def _queue(self, stream):
        return stream if stream in self.non_blocking else LEGACY

    def submit(self, stream=LEGACY):
        q = self._queue(stream)
        self.queued[q] = self.queued.get(q, 0) + 1
        return q, self.queued[q]

    def run(self, stream=LEGACY, upto=None):
        q = self._queue(stream)
        self.done[q] = self.queued.get(q, 0) if upto is None else upto

    def run_all(self):
        for q in self.queued:
            self.run(q)

    def pending(self, work):
        q, position = work
        return self.done.get(q, 0) < position

    # FenceSource
    def record(self, stream):
        assert not self.closed
        self.records += 1
        token = self.next_token
        self.next_token += 1
        q = self._queue(stream)
        self.live[token] = (q, self.queued.get(q, 0))
        return token

    def query(self, token):
        self.queries += 1
        return not self.pending(self.live[token])

    def wait(self, token):
        self.waits += 1
        q, position = self.live[token]
        self.done[q] = max(self.done.get(q, 0), position)

    def recycle(self, token):
        del self.live[token]
        self.recycled += 1

    def is_blocking(self, stream):
        return stream not in self.non_blocking

    def close(self):
        self.closed = True


def in_use(mgr):
    return mgr.allocator.get_stats().bytes_in_use


def check(mgr):
    if mgr.policy in ("bfc", "compact"):
        check_invariants(mgr.allocator)


def check_queue(mgr):
    """The pending-free queue's own bookkeeping (white box): fences cover a prefix
    of the queue, and their counts and bytes add up."""
    frees = mgr._frees
    entries = list(frees.entries)
    covered = sum(b[1] for b in frees._batches)
    assert covered == frees._fenced <= len(entries)
    assert frees.fenced_bytes() == sum(e[1] for e in entries[:covered])
    assert frees.reclaim_at == covered + ss.MAX_UNFENCED
    assert frees.pending_fences == len(frees._batches)


# ---------------------------------------------------------------------- the gate
def test_a_block_comes_back_only_after_its_work():
    dev = ScriptedDevice()
    mgr = make_manager(stream_safety=dev, capacity=4 * MiB, allow_growth=False)
    a = mgr.memalloc(3 * MiB)  # most of the only region
    first = addr(a)
    dev.submit()  # a kernel using a, still queued
    del a
    assert mgr.pending_frees == 1
    # 3 MiB do not fit next to the pending block: the manager fences it and
    # queries; the work has not run, so the request waits for it (OOM path).
    b = mgr.memalloc(3 * MiB)
    assert addr(b) == first and dev.waits == 1 and dev.queries == 1
    del b
    dev.submit()
    dev.run()  # the device caught up on its own: a query finds the fence complete
    c = mgr.memalloc(3 * MiB)
    assert addr(c) == first and dev.waits == 1
    check(mgr)


def test_pending_blocks_are_not_reused_while_the_pool_has_room():
    dev = ScriptedDevice()
    mgr = make_manager(stream_safety=dev)
    a = mgr.memalloc(MiB)
    work = dev.submit()
    old = addr(a)
    del a
    b = mgr.memalloc(MiB)  # the pool's region has room: no driver call at all
    assert addr(b) != old and dev.records == 0 and dev.queries == 0
    assert dev.pending(work) and mgr.pending_frees == 1
    assert mgr.stream_safety_stats().pending_bytes == MiB


def test_one_event_per_fence_and_none_per_free():
    dev = ScriptedDevice()
    mgr = make_manager(stream_safety=dev)
    blocks = [mgr.memalloc(4096) for _ in range(100)]
    del blocks
    assert mgr.pending_frees == 100 and dev.records == 0
    mgr.allocator  # noqa: B018 -- inspecting the pool returns what has completed
    assert dev.records == 1 and dev.queries == 1 and mgr.pending_frees == 0
    assert in_use(mgr) == 0 and dev.live == {} and dev.recycled == 1
    check(mgr)


def test_many_unfenced_frees_are_fenced_without_pressure():
    dev = ScriptedDevice()
    mgr = make_manager(stream_safety=dev)
    for _ in range(ss.MAX_UNFENCED + 1):
        mgr.memalloc(256)  # dropped at once
    assert dev.records == 0 and mgr.pending_frees == ss.MAX_UNFENCED + 1
    keep = mgr.memalloc(256)
    assert dev.records == 1 and mgr.pending_frees == 0 and addr(keep)


def test_fences_complete_oldest_first_and_stop_at_the_first_pending():
    dev = ScriptedDevice()
    mgr = make_manager(stream_safety=dev)
    a = mgr.memalloc(4096)
    w1 = dev.submit()
    del a
    mgr.allocator  # noqa: B018 -- fence 1, pending
    b = mgr.memalloc(4096)
    dev.submit()
    del b
    stats = mgr.stream_safety_stats()
    assert stats.fences == 1 and stats.pending_blocks == 2
    mgr.allocator  # noqa: B018 -- fence 2; fence 1 still pending: nothing comes back
    assert mgr.pending_frees == 2 and mgr.stream_safety_stats().fences == 2
    dev.run(upto=w1[1])  # the first kernel finished
    mgr.allocator  # noqa: B018
    assert mgr.pending_frees == 1
    dev.run()
    mgr.allocator  # noqa: B018
    assert mgr.pending_frees == 0 and in_use(mgr) == 0


def test_out_of_memory_with_pending_fences_waits_then_succeeds():
    dev = ScriptedDevice()
    mgr = make_manager(stream_safety=dev, capacity=8 * MiB, allow_growth=False)
    held = [mgr.memalloc(2 * MiB) for _ in range(4)]
    dev.submit()
    del held
    mgr.allocator  # noqa: B018 -- all four fenced, the device busy
    assert mgr.pending_frees == 4
    again = [mgr.memalloc(2 * MiB) for _ in range(4)]
    assert dev.waits >= 1 and mgr.pending_frees == 0
    assert mgr.memory_stats()["num_sync_all_streams"] == dev.waits
    with pytest.raises(CudaOutOfMemoryError):
        mgr.memalloc(2 * MiB)
    del again
    check(mgr)


def test_release_unused_waits_for_pending_blocks():
    dev = ScriptedDevice()
    mgr = make_manager(stream_safety=dev)
    a = mgr.memalloc(MiB)
    dev.submit()
    del a
    assert mgr.release_unused() is True  # waited, then the empty region went back
    assert mgr.pending_frees == 0 and mgr.backend.bytes_held == 0 and dev.waits == 1


def test_reset_with_pending_fences_waits_recycles_and_closes():
    dev = ScriptedDevice()
    mgr = make_manager(stream_safety=dev)
    backend = mgr.backend
    blocks = [mgr.memalloc(MiB) for _ in range(3)]
    dev.submit()
    del blocks
    mgr.allocator  # noqa: B018 -- fenced, pending
    assert dev.live
    mgr.reset()
    assert dev.live == {} and dev.closed and dev.waits >= 1
    assert backend.bytes_held == 0 and mgr.pending_frees == 0
    # A new allocator gets a fresh queue; the closed source is not used again
    # unless the spec hands it out again (here it does: a plain instance).
    dev.closed = False
    assert addr(mgr.memalloc(4096)) != 0


def test_defer_cleanup_holds_frees_unfenced():
    dev = ScriptedDevice()
    mgr = make_manager(stream_safety=dev, capacity=2 * MiB, allow_growth=False)
    with mgr.defer_cleanup():
        a = mgr.memalloc(MiB)
        old = addr(a)
        del a
        b = mgr.memalloc(512 * 1024)
        assert addr(b) != old and dev.records == 0
        with pytest.raises(CudaOutOfMemoryError):
            mgr.memalloc(MiB)  # no wait, no recovery inside
        assert dev.waits == 0
    assert dev.records == 1 and mgr.pending_frees == 0  # fenced and complete at exit


def test_frees_from_other_threads_while_allocating():
    dev = ScriptedDevice()
    mgr = make_manager(stream_safety=dev, capacity=32 * MiB)
    handoff, lock, stop = [], threading.Lock(), threading.Event()

    def dropper():
        while not stop.is_set() or handoff:
            with lock:
                batch = handoff[:]
                handoff.clear()
            del batch

    workers = [threading.Thread(target=dropper) for _ in range(3)]
    for t in workers:
        t.start()
    try:
        for step in range(3000):
            p = mgr.memalloc(1 + step * 7919 % (MiB // 2))
            dev.submit()
            if step % 5 == 0:
                dev.run()
            with lock:
                handoff.append(p)
            del p
    finally:
        stop.set()
        for t in workers:
            t.join()
    gc.collect()
    mgr.release_unused()
    assert mgr.pending_frees == 0 and in_use(mgr) == 0
    check(mgr)


# ---------------------------------------------------------------------- record_stream
def test_record_stream_on_a_non_blocking_stream_adds_an_event_there():
    dev = ScriptedDevice()
    mgr = make_manager(stream_safety=dev, capacity=4 * MiB, allow_growth=False)
    a = mgr.memalloc(3 * MiB)
    first = addr(a)
    assert mgr.record_stream(first, NON_BLOCKING_A) is True
    work = dev.submit(NON_BLOCKING_A)
    del a
    mgr.allocator  # noqa: B018
    assert dev.records == 2  # the legacy fence and one on the non-blocking stream
    assert mgr.pending_frees == 1  # the legacy queue is idle, the stream is not
    dev.run(NON_BLOCKING_A)
    mgr.allocator  # noqa: B018
    assert mgr.pending_frees == 0 and not dev.pending(work)
    assert addr(mgr.memalloc(3 * MiB)) == first


def test_record_stream_needs_nothing_for_blocking_streams():
    dev = ScriptedDevice()
    mgr = make_manager(stream_safety=dev)
    a = mgr.memalloc(4096)
    for stream in (0, LEGACY, 2, BLOCKING):
        assert mgr.record_stream(addr(a), stream) is False
    assert mgr.stream_safety_stats().recorded_streams == 0


class Stream:
    def __init__(self, handle):
        self.handle = handle


@pytest.mark.parametrize("stream, handle", [
    (NON_BLOCKING_A, NON_BLOCKING_A),
    (Stream(NON_BLOCKING_B), NON_BLOCKING_B),
    (type("S", (), {"__cuda_stream__": lambda self: (0, NON_BLOCKING_A)})(), NON_BLOCKING_A),
    (type("S", (), {"ptr": NON_BLOCKING_B})(), NON_BLOCKING_B),
])
def test_stream_handles_from_every_stream_kind(stream, handle):
    assert ss.stream_handle(stream) == handle


def test_record_stream_rejects_bad_input_and_changes_nothing():
    dev = ScriptedDevice()
    mgr = make_manager(stream_safety=dev)
    a = mgr.memalloc(4096)
    with pytest.raises(ValueError, match="not the start of a live block"):
        mgr.record_stream(addr(a) + 256, NON_BLOCKING_A)
    with pytest.raises(TypeError, match="not a CUDA stream"):
        mgr.record_stream(addr(a), "stream 7")
    with pytest.raises(TypeError, match="bool"):
        mgr.record_stream(addr(a), True)
    with pytest.raises(ValueError, match="negative"):
        mgr.record_stream(addr(a), -3)
    assert mgr.stream_safety_stats().recorded_streams == 0 and dev.records == 0


def test_record_stream_in_off_mode_parks_only_those_blocks():
    dev = ScriptedDevice()
    frees = ss.PendingFrees(dev, legacy_fence=False)
    returned = []
    frees.bind(returned.append)
    frees.entries.extend([(0x1000, 256), (0x2000, 256)])
    assert frees.record_stream(0x2000, NON_BLOCKING_A) is True
    assert frees.record_stream(0x1000, BLOCKING) is True  # off: every named stream counts
    frees.stream_uses.pop(0x1000)
    work = dev.submit(NON_BLOCKING_A)
    assert frees.drain() == 1 and returned == [0x1000] and len(frees) == 1
    assert frees.drain() == 0
    dev.run(NON_BLOCKING_A)
    assert frees.drain() == 1 and returned == [0x1000, 0x2000] and not dev.pending(work)
    assert dev.live == {}


# ---------------------------------------------------------------------- random sequences
def _program():
    op = st.one_of(
        st.tuples(st.just("alloc"), st.integers(1, 3 * MiB)),
        st.tuples(st.just("free"), st.integers(0, 1 << 30), st.sampled_from(
            [LEGACY, BLOCKING, NON_BLOCKING_A, NON_BLOCKING_B])),
        st.tuples(st.just("run"), st.sampled_from([LEGACY, NON_BLOCKING_A, NON_BLOCKING_B])),
        st.tuples(st.just("inspect")),
        st.tuples(st.just("release")),
    )
    return st.lists(op, max_size=80)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=_program(), policy=st.sampled_from(["bfc", "caching", "compact"]))
def test_no_block_is_handed_out_while_its_work_is_pending(program, policy):
    """Random allocations, frees after work on any stream (non-blocking ones
    recorded with record_stream), device progress, inspections and
    release_unused: no allocation overlaps a freed block whose work may still
    run, the tables stay valid, and at the end every block comes back."""
    dev = ScriptedDevice()
    options = {"page_size": 64 * 1024} if policy == "compact" else {}
    mgr = make_manager(stream_safety=dev, capacity=12 * MiB, policy=policy, **options)
    live, freed = [], []  # freed: (start, end, work)
    for step in program:
        kind = step[0]
        if kind == "alloc":
            try:
                p = mgr.memalloc(step[1])
            except CudaOutOfMemoryError:
                continue
            start = addr(p)
            for lo, hi, work in freed:
                if dev.pending(work):
                    assert start + step[1] <= lo or hi <= start, "a block reused too early"
            live.append(p)
            del p
        elif kind == "free" and live:
            p = live.pop(step[1] % len(live))
            stream = step[2]
            if stream in dev.non_blocking:
                mgr.record_stream(addr(p), stream)
            freed.append((addr(p), addr(p) + p.size, dev.submit(stream)))
            del p
        elif kind == "run":
            dev.run(step[1])
        elif kind == "inspect":
            check(mgr)
            check_queue(mgr)
        elif kind == "release":
            mgr.release_unused()
        freed = [f for f in freed if dev.pending(f[2])]
        check_queue(mgr)
    check(mgr)
    del live
    mgr.release_unused()
    assert mgr.pending_frees == 0 and in_use(mgr) == 0 and dev.live == {}


# ---------------------------------------------------------------------- configuration
def test_mode_none_without_device_memory(monkeypatch):
    monkeypatch.delenv("NUMBA_BFC_CONF", raising=False)
    mgr = NumbaBFCMemoryManager(context=FakeContext(), backend=VirtualSubAllocator(
        capacity=8 * MiB))
    assert mgr.stream_safety == "events"
    a = mgr.memalloc(4096)
    old = addr(a)
    del a
    assert addr(mgr.memalloc(4096)) == old  # simulated memory: no device work to wait for
    assert mgr.stream_safety == "none" and mgr.stream_safety_stats().mode == "none"


def test_stream_safety_from_the_environment_and_use_numba_bfc(monkeypatch):
    monkeypatch.setenv("NUMBA_BFC_CONF", "stream_safety:off")
    mgr = NumbaBFCMemoryManager(context=FakeContext(), backend=VirtualSubAllocator())
    assert mgr.stream_safety == "off"
    monkeypatch.setenv("NUMBA_BFC_CONF", "stream_safety:EVENTS")
    assert NumbaBFCMemoryManager(context=None).stream_safety == "events"
    monkeypatch.setenv("NUMBA_BFC_CONF", "stream_safety:sometimes")
    with pytest.raises(ValueError, match="stream_safety"):
        NumbaBFCMemoryManager(context=None)
    monkeypatch.delenv("NUMBA_BFC_CONF")
    with pytest.raises(TypeError, match="stream_safety"):
        NumbaBFCMemoryManager(context=None, stream_safety=3)
    from numba.cuda.cudadrv import driver as drv

    saved = drv._memory_manager
    try:
        cls = use_numba_bfc(stream_safety="off")
        assert cls(context=None).stream_safety == "off"
        with pytest.raises(ValueError, match="stream_safety"):
            use_numba_bfc(stream_safety="maybe")
    finally:
        drv._memory_manager = saved


def test_memory_stats_report_pending_frees():
    dev = ScriptedDevice()
    for policy in ("bfc", "caching"):
        mgr = make_manager(stream_safety=dev, policy=policy)
        a, b = mgr.memalloc(MiB), mgr.memalloc(3000)
        dev.submit()
        del a, b
        stats = mgr.memory_stats()
        assert stats["pending_free_bytes.all.current"] == MiB + 3000
        assert stats["pending_free_blocks.all.current"] == 2
        assert stats["allocated_bytes.all.current"] >= MiB + 3000  # pending count as in use
        assert stats["num_events_recorded"] == 1 and stats["pending_fences"] == 1
        mgr.release_unused()
        stats = mgr.memory_stats()
        assert stats["pending_free_bytes.all.current"] == 0
        assert stats["allocated_bytes.all.current"] == 0


def test_a_lagging_device_does_not_grow_the_pool_without_bound():
    """Temporaries freed while the device never catches up by itself: the pool
    grows to hold some of them (the host runs ahead), but once the pending ones
    are a quarter of the pool and 1/64 of the limit, a request waits for the
    oldest fence instead of growing the pool further."""
    dev = ScriptedDevice()
    mgr = make_manager(stream_safety=dev, capacity=2048 * MiB)  # run-ahead: 32 MiB
    for _ in range(200):
        t = mgr.memalloc(4 * MiB)
        dev.submit()  # a kernel that uses t, still queued
        del t
    check_queue(mgr)
    peak = mgr.backend.peak_bytes_held
    assert 32 * MiB <= peak <= 96 * MiB, peak
    assert 50 <= dev.waits < 200  # the first ones ran ahead without waiting
    check(mgr)


def test_module_level_record_stream_and_empty_cache(monkeypatch):
    """``numba_bfc.record_stream`` finds the block behind a Numba pointer (or a view,
    a CuPy-style array, an array interface) and its manager;
    ``numba_bfc.empty_cache`` waits for pending blocks and empties the pool."""
    import types

    import numba_bfc

    dev = ScriptedDevice()
    mgr = make_manager(stream_safety=dev)
    mgr.context.memory_manager = mgr
    monkeypatch.setattr(cuda, "current_context", lambda devnum=None: mgr.context)
    p = mgr.memalloc(MiB)
    view = p.view(4096)  # an OwnedPointer into the block, as a slice holds
    assert numba_bfc.record_stream(view, NON_BLOCKING_A) is True
    assert numba_bfc.record_stream(p, NON_BLOCKING_B) is True
    cupy_like = types.SimpleNamespace(data=types.SimpleNamespace(
        mem=types.SimpleNamespace(ptr=addr(p))))
    assert numba_bfc.record_stream(cupy_like, BLOCKING) is False  # blocking: nothing to do
    interface = types.SimpleNamespace(__cuda_array_interface__={"data": (addr(p) + 64, False)})
    with pytest.raises(ValueError, match="not the start of a live block"):
        numba_bfc.record_stream(interface, NON_BLOCKING_A)
    with pytest.raises(TypeError, match="not a device array"):
        numba_bfc.record_stream(object(), NON_BLOCKING_A)
    assert mgr.stream_safety_stats().recorded_streams == 1  # one block, two streams
    work = dev.submit(NON_BLOCKING_A), dev.submit(NON_BLOCKING_B)
    del p, view
    assert numba_bfc.empty_cache() is True  # waited on both streams, region back
    assert dev.records == 3 and not any(dev.pending(w) for w in work)
    assert mgr.pending_frees == 0 and mgr.backend.bytes_held == 0
