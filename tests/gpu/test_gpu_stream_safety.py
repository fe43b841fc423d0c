"""Stream-safe reuse on a GPU (or the asynchronous fake driver): a block freed while
work on a stream still uses it is not handed to work that could overtake it.

The hazard: work W1 on stream s1 writes array A; A is dropped; B gets A's
memory; work W2 on another stream writes B; W1 runs after W2 and overwrites
B. On a GPU, W1 is a kernel that sleeps 50 ms and then a memset; on the fake
driver queued work runs only when something waits for it, so the memset runs
at the final synchronization unless the plugin waited for it first.
"""

import contextlib
import gc
import sys
import threading
import weakref
from pathlib import Path

import numpy as np
import pytest
from gpu_support import (
    COMBINATIONS,
    FAKE_DEVICE,
    GPU_SKIP,
    KERNELS,
    fake_counters,
    fake_event_delay,
    non_blocking_stream,
    numba_bfc_context,
    pattern,
    slow_fill,
    write_pattern,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the CuPy stand-in
from _support import fake_cupy  # noqa: E402

pytestmark = [pytest.mark.cuda, GPU_SKIP]

MiB = 1 << 20
N = 12 * MiB  # two of them do not fit under LIMIT: B must wait for A or fail
LIMIT = 16 * MiB
FAKE_ONLY = pytest.mark.skipif(not FAKE_DEVICE, reason="reads the fake driver's counters")


def _ptr(arr):
    return arr.device_ctypes_pointer.value


def _overwritten_after_reuse(writer_stream, *, record=False, sync_write=False):
    """A written late on ``writer_stream``, dropped; B of the same size written with
    a pattern; both streams synchronized. Returns (B reused A's memory, B's bytes
    equal the pattern)."""
    from numba import cuda

    import numba_bfc

    want = pattern(7, N // 4).view(np.uint8)  # before A's write: the host's work is short
    a = cuda.device_array(N, dtype=np.uint8)
    old = _ptr(a)
    slow_fill(a, 0xAA, writer_stream)
    if record:
        numba_bfc.record_stream(a, writer_stream)
    del a
    b = cuda.device_array(N, dtype=np.uint8)
    if sync_write:
        b.copy_to_device(want)  # the legacy default stream, synchronous
    else:
        # A kernel, not a copy: an H100 ran a pageable host-to-device copy on
        # another blocking stream only after the writer's work.
        other = cuda.stream()
        write_pattern(b.view(np.uint32), 7, stream=other)
        other.synchronize()
    writer_stream.synchronize()
    cuda.synchronize()
    return _ptr(b) == old, bool(np.array_equal(b.copy_to_host(), want))


def _takes_the_memory_and_keeps_its_bytes(old, seed, wait):
    """A new array of N bytes, written synchronously, then ``wait()``: it got the
    dropped array's memory at ``old``, and its pattern survived the old work."""
    from numba import cuda

    b = cuda.device_array(N, dtype=np.uint8)
    want = pattern(seed, N // 4).view(np.uint8)
    b.copy_to_device(want)
    wait()
    assert _ptr(b) == old and np.array_equal(b.copy_to_host(), want)


@pytest.mark.parametrize("policy, backend", COMBINATIONS, ids=["-".join(c) for c in COMBINATIONS])
def test_the_hazard_corrupts_with_stream_safety_off(policy, backend):
    """The old behaviour: B reuses A at once and A's late write lands in B."""
    from numba import cuda

    with numba_bfc_context(policy=policy, backend=backend, memory_limit=LIMIT,
                           stream_safety="off"):
        reused, intact = _overwritten_after_reuse(cuda.stream())
    assert reused and not intact


@pytest.mark.parametrize("delay", [0, 3])
@pytest.mark.parametrize("policy, backend", COMBINATIONS, ids=["-".join(c) for c in COMBINATIONS])
def test_the_hazard_never_corrupts_by_default(policy, backend, delay):
    """Events: B gets A's memory only once A's work has run (the OOM path waits
    for the pending fence), so B keeps its pattern."""
    from numba import cuda

    with fake_event_delay(delay), numba_bfc_context(policy=policy, backend=backend,
                                                    memory_limit=LIMIT) as ctx:
        reused, intact = _overwritten_after_reuse(cuda.stream())
        stats = ctx.memory_manager.stream_safety_stats()
    assert intact and reused  # it had to wait: the two do not fit side by side
    assert stats.mode == "events" and stats.events_recorded >= 1


def test_a_non_blocking_stream_needs_record_stream():
    """The legacy-stream event does not wait for a non-blocking stream: without
    record_stream the hazard is back; with it, B is safe."""
    with numba_bfc_context(policy="bfc", backend="plain", memory_limit=LIMIT):
        with non_blocking_stream() as s:
            reused, intact = _overwritten_after_reuse(s, sync_write=True)
        assert reused and not intact
    with numba_bfc_context(policy="bfc", backend="plain", memory_limit=LIMIT) as ctx:
        with non_blocking_stream() as s:
            reused, intact = _overwritten_after_reuse(s, record=True, sync_write=True)
        assert reused and intact
        assert ctx.memory_manager.stream_safety_stats().events_recorded >= 2


def test_record_stream_in_off_mode_protects_that_block():
    with numba_bfc_context(policy="bfc", backend="plain", memory_limit=LIMIT,
                           stream_safety="off"):
        with non_blocking_stream() as s:
            reused, intact = _overwritten_after_reuse(s, record=True, sync_write=True)
    assert reused and intact


def test_a_per_thread_default_stream_is_ordered_by_the_legacy_event():
    """Work queued from another thread on its per-thread default stream (a
    blocking stream) is waited for before its block is reused."""
    from numba import cuda

    with numba_bfc_context(policy="bfc", backend="plain", memory_limit=LIMIT) as ctx:
        a = cuda.device_array(N, dtype=np.uint8)
        old = _ptr(a)

        def writer(arr):
            assert cuda.current_context() is ctx  # made current in this thread
            slow_fill(arr, 0xAA, cuda.per_thread_default_stream())

        t = threading.Thread(target=writer, args=(a,))
        t.start()
        t.join()
        del a
        _takes_the_memory_and_keeps_its_bytes(old, 3, cuda.synchronize)


def test_defer_cleanup_still_holds_frees():
    from numba import cuda

    with numba_bfc_context(policy="bfc", backend="plain") as ctx:
        mgr = ctx.memory_manager
        s = cuda.stream()
        with cuda.defer_cleanup():
            a = cuda.device_array(MiB, dtype=np.uint8)
            old = _ptr(a)
            slow_fill(a, 0x11, s)
            owner = weakref.ref(a.gpu_data)
            del a
            held = owner()
            why = [type(r).__name__ for r in gc.get_referrers(held)] if held is not None else []
            b = cuda.device_array(MiB, dtype=np.uint8)
            assert _ptr(b) != old and mgr.pending_frees == 1, (held, why, mgr.deferred)
            assert mgr.stream_safety_stats().events_recorded == 0
        s.synchronize()
        mgr.release_unused()
        assert mgr.pending_frees == 0


@FAKE_ONLY
@pytest.mark.parametrize("policy, backend", COMBINATIONS, ids=["-".join(c) for c in COMBINATIONS])
def test_close_and_reset_with_pending_fences_lose_and_leak_nothing(policy, backend):
    """Frees waiting on a device that never catches up by itself: cuda.close()
    waits for them, destroys the events, and gives all memory back."""
    from numba import cuda
    from numba.cuda.cudadrv import driver as drv

    base = fake_counters()
    with fake_event_delay(1 << 30):
        with numba_bfc_context(policy=policy, backend=backend) as ctx:
            free0, _total = drv.driver.cuMemGetInfo()
            s = cuda.stream()
            for i in range(20):
                a = cuda.device_array(MiB + i * 4096, dtype=np.uint8)
                slow_fill(a, i, s)
                del a
            keep = cuda.device_array(MiB, dtype=np.uint8)
            ctx.memory_manager.allocator  # noqa: B018 -- fence them: pending
            stats = ctx.memory_manager.stream_safety_stats()
            assert stats.pending_blocks == 20 and stats.fences >= 1
            ctx.reset()  # what cuda.close() runs, context kept
            assert ctx.memory_manager.pending_frees == 0
            assert drv.driver.cuMemGetInfo()[0] >= free0
            del keep
            again = cuda.device_array(MiB, dtype=np.uint8)  # a fresh pool
            again.copy_to_device(np.full(MiB, 5, np.uint8))
            assert (again.copy_to_host() == 5).all()
            del again
    after = fake_counters()
    assert after["live_events"] == base["live_events"]
    assert after["illegal_accesses"] == base["illegal_accesses"]
    assert after["pending_ops"] == 0


@pytest.mark.parametrize("delay", [0, 2])
@pytest.mark.parametrize("policy, backend", COMBINATIONS, ids=["-".join(c) for c in COMBINATIONS])
def test_churn_on_several_streams_keeps_every_byte(policy, backend, delay):
    """Random arrays written asynchronously on the legacy stream, two blocking
    streams, a per-thread stream and a non-blocking one (recorded before the
    drop), dropped at random, under a tight limit: every live array keeps its
    pattern, the tables stay valid, and no queued write touches unmapped memory."""
    from numba import cuda

    from numba_bfc.testing.invariants import check_invariants

    rng = np.random.default_rng(11)
    base = fake_counters() if FAKE_DEVICE else None
    with fake_event_delay(delay), numba_bfc_context(
            policy=policy, backend=backend, memory_limit=48 * MiB) as ctx, \
            non_blocking_stream() as ns:
        import numba_bfc

        streams = [cuda.default_stream(), cuda.stream(), cuda.stream(),
                   cuda.per_thread_default_stream(), ns]
        live = {}
        for step in range(300):
            if live and rng.random() < 0.45:
                key = int(rng.choice(list(live)))
                arr, stream = live.pop(key)
                if stream is ns:
                    numba_bfc.record_stream(arr, ns)
                del arr
                continue
            n = int(rng.choice([rng.integers(1, 4096), rng.integers(4096, 1 << 16),
                                rng.integers(1 << 16, 1 << 18)]))
            arr = cuda.device_array(n, dtype=np.uint32)
            stream = streams[int(rng.integers(len(streams)))]
            arr.copy_to_device(pattern(step, n), stream=stream)
            live[step] = (arr, stream)
            if rng.random() < 0.1:
                streams[int(rng.integers(len(streams)))].synchronize()
        cuda.synchronize()
        ns.synchronize()
        for seed, (arr, _stream) in live.items():
            np.testing.assert_array_equal(arr.copy_to_host(), pattern(seed, arr.size))
        mgr = ctx.memory_manager
        if policy in ("bfc", "compact"):
            check_invariants(mgr.allocator)
        del live, arr
        gc.collect()
        mgr.release_unused()
        assert mgr.pending_frees == 0
    if base is not None:
        assert fake_counters()["illegal_accesses"] == base["illegal_accesses"]


@pytest.mark.parametrize("non_blocking", [True, False])
def test_cupy_allocations_wait_for_a_non_blocking_current_stream(monkeypatch, non_blocking):
    """CuPy memory from the shared pool, written on CuPy's current stream and
    dropped: when that stream is non-blocking the allocator recorded it, so the
    block is reused only after that work."""
    from numba import cuda
    from numba.cuda.cudadrv import driver as drv

    from numba_bfc.integrations.cupy import cupy_allocator

    with numba_bfc_context(policy="bfc", backend="plain", memory_limit=LIMIT) as ctx:
        with non_blocking_stream() if non_blocking else contextlib.nullcontext(cuda.stream()) as s:
            monkeypatch.setitem(sys.modules, "cupy", fake_cupy(int(s.handle or 0)))
            x = cupy_allocator(N)
            old = x.ptr
            stats = ctx.memory_manager.stream_safety_stats()
            assert stats.recorded_streams == (1 if non_blocking else 0)
            if KERNELS:
                slow_fill(cuda.as_cuda_array(_Interface(old, N)), 0xAA, s)
            else:
                drv.driver.cuMemsetD8Async(old, 0xAA, N, s.handle)
            del x
            _takes_the_memory_and_keeps_its_bytes(old, 5, s.synchronize)


class _Interface:
    def __init__(self, ptr, nbytes):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                         "data": (ptr, False), "version": 3}
