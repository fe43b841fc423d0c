"""The Numba EMM plugin on a real GPU: data integrity, lifetime, contexts, OOM, IPC.

Every test runs in a fresh CUDA context whose memory manager is numba_bfc
(``bfc_context`` runs it under each policy and backend). Skipped without an
NVIDIA GPU, its driver and numba-cuda.
"""

import gc
import json
import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from gpu_support import (
    GPU_SKIP,
    KERNEL_SKIP,
    close_cuda,
    count_driver_calls,
    default_numba_context,
    numba_bfc_context,
    pattern,
    write_pattern,
)

pytestmark = [pytest.mark.cuda, GPU_SKIP]

MiB = 1 << 20
ROOT = Path(__file__).resolve().parents[2]


def _scale_kernel():
    from numba import cuda

    @cuda.jit
    def scale(arr, factor):
        i = cuda.grid(1)
        if i < arr.size:
            arr[i] *= factor

    return scale


def launch(kernel, arr, *args):
    threads = 256
    kernel[(arr.size + threads - 1) // threads, threads](arr, *args)


def span(arr):
    start = arr.device_ctypes_pointer.value
    return start, start + arr.nbytes


def check_tables(ctx):
    mgr = ctx.memory_manager
    if mgr.policy in ("bfc", "compact"):
        from numba_bfc.testing.invariants import check_invariants

        check_invariants(mgr.allocator)


# ---------------------------------------------------------------------- data integrity
def test_patterns_survive_churn(bfc_context):
    from numba import cuda

    rng = np.random.default_rng(7)
    live = {}
    for step in range(800):
        if live and rng.random() < 0.45:
            del live[int(rng.choice(list(live)))]
            continue
        n = int(rng.choice([rng.integers(1, 1024), rng.integers(1024, 1 << 16),
                            rng.integers(1 << 16, 1 << 18)]))
        arr = cuda.device_array(n, dtype=np.uint32)
        write_pattern(arr, step)
        live[step] = arr
    cuda.synchronize()
    spans = sorted(span(a) for a in live.values())
    assert all(e1 <= s2 for (_, e1), (s2, _) in zip(spans, spans[1:])), "blocks overlap"
    for seed, arr in live.items():
        np.testing.assert_array_equal(arr.copy_to_host(), pattern(seed, arr.size))
    check_tables(bfc_context)


def test_slices_keep_their_parent_alive(bfc_context):
    from numba import cuda

    parent = cuda.device_array(1 << 20, dtype=np.uint32)
    write_pattern(parent, 1)
    part = parent[1000:3000]
    del parent
    gc.collect()
    others = []
    for seed in range(2, 40):
        a = cuda.device_array(1 << 16, dtype=np.uint32)
        write_pattern(a, seed)
        others.append(a)
    np.testing.assert_array_equal(part.copy_to_host(), pattern(1, 1 << 20)[1000:3000])
    lo, hi = span(part)
    for a in others:
        s, e = span(a)
        assert e <= lo or s >= hi


def test_frees_from_other_threads(bfc_context):
    from numba import cuda

    handoff, lock, stop = [], threading.Lock(), threading.Event()

    def dropper():
        while not stop.is_set() or handoff:
            with lock:
                batch = handoff[:]
                handoff.clear()
            del batch  # finalizers run in this thread

    workers = [threading.Thread(target=dropper) for _ in range(3)]
    for t in workers:
        t.start()
    keep = []
    try:
        for step in range(600):
            a = cuda.device_array(int(1 + step * 977 % 200000), dtype=np.uint32)
            write_pattern(a, step)
            if step % 10 == 0:
                keep.append((step, a))
            else:
                with lock:
                    handoff.append(a)
            del a
    finally:
        stop.set()
        for t in workers:
            t.join()
    cuda.synchronize()
    for seed, a in keep:
        np.testing.assert_array_equal(a.copy_to_host(), pattern(seed, a.size))
    check_tables(bfc_context)


# ---------------------------------------------------------------------- contexts
def test_close_and_a_new_context(bfc_context):
    from numba import cuda

    old_mgr = bfc_context.memory_manager
    stale = cuda.device_array(1 << 16, dtype=np.uint32)
    write_pattern(stale, 3)
    cls = type(old_mgr)
    close_cuda()
    ctx = cuda.current_context()
    assert type(ctx.memory_manager) is cls and ctx.memory_manager is not old_mgr
    fresh = cuda.device_array(1 << 16, dtype=np.uint32)
    write_pattern(fresh, 4)
    del stale  # its finalizer belongs to the closed context: ignored
    gc.collect()
    again = cuda.device_array(1 << 16, dtype=np.uint32)
    write_pattern(again, 5)
    np.testing.assert_array_equal(fresh.copy_to_host(), pattern(4, 1 << 16))
    np.testing.assert_array_equal(again.copy_to_host(), pattern(5, 1 << 16))
    check_tables(ctx)


def test_current_allocator_reports_the_pool(bfc_context):
    from numba import cuda

    from numba_bfc.integrations.numba_emm import current_allocator

    arrays = [cuda.device_array(MiB, dtype=np.uint8) for _ in range(4)]
    alloc = current_allocator()
    assert alloc is bfc_context.memory_manager.allocator
    stats = alloc.get_stats()
    assert stats.bytes_in_use >= 4 * MiB
    assert len(alloc.render_occupancy(80)) == 80
    del arrays
    assert current_allocator().get_stats().bytes_in_use == 0


# ---------------------------------------------------------------------- memory info, OOM
def test_get_memory_info_is_device_free_plus_pool_free(bfc_context):
    from numba import cuda
    from numba.cuda.cudadrv import driver as drv

    dev_free, dev_total = drv.driver.cuMemGetInfo()
    info0 = bfc_context.get_memory_info()
    assert info0.total == dev_total
    assert abs(info0.free - dev_free) <= 4 * MiB
    a = cuda.device_array(256 * MiB, dtype=np.uint8)
    info1 = bfc_context.get_memory_info()
    assert abs((info0.free - info1.free) - 256 * MiB) <= 4 * MiB
    del a
    info2 = bfc_context.get_memory_info()  # the block is back in the pool: free again
    assert abs(info2.free - info0.free) <= 4 * MiB


def test_out_of_memory_and_recovery_near_the_device_limit(bfc_context):
    from numba import cuda
    from numba.cuda.cudadrv.driver import CudaAPIError

    from numba_bfc import OutOfMemoryError

    chunk = 1 << 30
    free0 = bfc_context.get_memory_info().free
    arrays = []
    with pytest.raises(CudaAPIError) as info:
        while True:
            arrays.append(cuda.device_array(chunk, dtype=np.uint8))
    assert isinstance(info.value, OutOfMemoryError)
    assert "OUT_OF_MEMORY" in str(info.value)
    n = len(arrays)
    assert n >= free0 // chunk - 2
    del arrays[::2]  # ceil(n / 2) chunks back in the pool
    # All but one are taken again; the small array is served from the last one
    # (the device itself may have less than a new segment left).
    refill = [cuda.device_array(chunk, dtype=np.uint8) for _ in range(n // 2 - 1)]
    small = cuda.device_array(1 << 20, dtype=np.uint32)
    write_pattern(small, 9)
    np.testing.assert_array_equal(small.copy_to_host(), pattern(9, 1 << 20))
    del arrays, refill, small
    bfc_context.memory_manager.release_unused()
    assert bfc_context.get_memory_info().free >= free0 - 64 * MiB


# ---------------------------------------------------------------------- IPC
_IPC_CHILD = """
import json, pickle, sys
import numpy as np
import gpu_support  # loads the fake driver when the parent runs on it
from numba import cuda

handle = pickle.loads(sys.stdin.buffer.read())
arr = handle.open()
host = arr.copy_to_host()
if gpu_support.KERNELS:
    @cuda.jit
    def double(a):
        i = cuda.grid(1)
        if i < a.size:
            a[i] *= 2

    double[(arr.size + 255) // 256, 256](arr)
else:
    arr.copy_to_device(2 * host)
cuda.synchronize()
handle.close()
print(json.dumps({"sum": float(host.sum()), "first": float(host[0])}))
"""


@pytest.mark.parametrize("policy", ["bfc", "caching"])
def test_ipc_of_a_pooled_block_into_a_child_process(policy):
    from numba import cuda

    with numba_bfc_context(policy=policy, backend="plain"):
        pad = cuda.device_array(1000, dtype=np.uint8)  # so the block sits at an offset
        data = np.arange(10000, dtype=np.float64)
        arr = cuda.to_device(data)
        ipc = arr.get_ipc_handle()
        assert ipc._ipc_handle.offset > 0
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(ROOT), str(ROOT / "tests" / "gpu"), os.environ.get("PYTHONPATH", "")]))
        out = subprocess.run([sys.executable, "-c", _IPC_CHILD], input=pickle.dumps(ipc),
                             capture_output=True, check=True, cwd=ROOT, env=env, timeout=300)
        seen = json.loads(out.stdout.decode().strip().splitlines()[-1])
        assert seen == {"sum": float(data.sum()), "first": 0.0}
        np.testing.assert_array_equal(arr.copy_to_host(), 2 * data)
        del pad


def test_ipc_is_refused_for_the_virtual_backend():
    from numba import cuda

    with numba_bfc_context(policy="bfc", backend="virtual"):
        arr = cuda.device_array(1000, dtype=np.float64)
        with pytest.raises(NotImplementedError, match="plain"):
            arr.get_ipc_handle()


# ---------------------------------------------------------------------- virtual backend
def _fragmenting_sequence():
    """Fill a 62 MiB pool with 1 MiB arrays (regions of 2, 4, 8, 16, 32 MiB), keep
    four of them, free the rest, then ask for 40 MiB."""
    from numba import cuda

    blocks = [cuda.device_array(MiB // 4, dtype=np.uint32) for _ in range(62)]
    keep = {i: blocks[i] for i in (0, 2, 9, 50)}
    for i, a in keep.items():
        write_pattern(a, i)
    del blocks
    big = cuda.device_array(10 * MiB, dtype=np.uint32)  # 40 MiB
    write_pattern(big, 99)
    cuda.synchronize()
    for i, a in keep.items():
        np.testing.assert_array_equal(a.copy_to_host(), pattern(i, MiB // 4))
    np.testing.assert_array_equal(big.copy_to_host(), pattern(99, 10 * MiB))
    return big


def test_virtual_backend_grows_without_fragmentation():
    from numba.cuda.cudadrv.driver import CudaAPIError

    with numba_bfc_context(policy="bfc", backend="plain", memory_limit=62 * MiB):
        with pytest.raises(CudaAPIError) as info:
            _fragmenting_sequence()
        assert info.value.reason == "fragmentation"
    with numba_bfc_context(policy="bfc", backend="virtual", memory_limit=62 * MiB) as ctx:
        mgr = ctx.memory_manager
        mgr.initialize()
        if mgr.backend.granularity != 2 * MiB:
            pytest.skip(f"the sequence assumes 2 MiB granularity, not {mgr.backend.granularity}")
        _fragmenting_sequence()
        (_base, size), = mgr.allocator.regions()  # the five regions coalesced into one
        assert size == 62 * MiB
        check_tables(ctx)


def test_compact_defragmenting_retry_keeps_data():
    """Granules go back from between live arrays and are mapped again elsewhere; the
    data around them, and in the newly mapped memory, stays right."""
    from numba import cuda

    import numba_bfc
    from numba_bfc.testing.invariants import check_invariants

    with numba_bfc_context(policy="compact", backend="virtual", memory_limit=16 * MiB) as ctx:
        mgr = ctx.memory_manager
        mgr.initialize()
        if mgr.backend.granularity != 2 * MiB:
            pytest.skip(f"the sequence assumes 2 MiB granularity, not {mgr.backend.granularity}")
        arrays = {}
        for seed, mib in ((1, 4), (2, 6), (3, 4)):
            arrays[seed] = cuda.device_array(mib * MiB // 4, dtype=np.uint32)
            write_pattern(arrays[seed], seed)
        cuda.synchronize()
        del arrays[2]
        alloc = numba_bfc.current_allocator()  # applies the pending free
        frees = mgr.backend.num_frees
        # 8 MiB fit only once the 6 MiB between the two live arrays are unmapped.
        d = cuda.device_array(8 * MiB // 4, dtype=np.uint32)
        write_pattern(d, 4)
        cuda.synchronize()
        assert mgr.backend.num_frees > frees and len(alloc.regions()) >= 2
        assert alloc.get_stats().bytes_reserved <= 16 * MiB
        for seed, a in arrays.items():
            np.testing.assert_array_equal(a.copy_to_host(), pattern(seed, a.size))
        np.testing.assert_array_equal(d.copy_to_host(), pattern(4, d.size))
        check_invariants(alloc)
        del d
        numba_bfc.current_allocator()
        e = cuda.device_array(4 * MiB // 4, dtype=np.uint32)  # from the freed 8 MiB
        write_pattern(e, 5)
        cuda.synchronize()
        np.testing.assert_array_equal(e.copy_to_host(), pattern(5, e.size))
        for seed, a in arrays.items():
            np.testing.assert_array_equal(a.copy_to_host(), pattern(seed, a.size))
        check_invariants(alloc)


# ---------------------------------------------------------------------- driver calls
def _cycles():
    from numba import cuda

    for _ in range(40):
        for nbytes in (4 << 10, 64 << 10, MiB, 16 * MiB, 64 * MiB):
            a = cuda.device_array(nbytes, dtype=np.uint8)
            del a
    cuda.synchronize()


@pytest.mark.parametrize("policy", ["bfc", "caching"])
def test_ten_times_fewer_driver_calls_than_numbas_manager(policy):
    with default_numba_context() as ctx:
        ctx.memory_manager.deallocations.clear()
        with count_driver_calls() as default_calls:
            _cycles()
            ctx.memory_manager.deallocations.clear()
    with numba_bfc_context(policy=policy, backend="plain"):
        with count_driver_calls() as ours:
            _cycles()
    assert sum(default_calls.values()) >= 10 * sum(ours.values()), (default_calls, ours)


# ---------------------------------------------------------------------- CuPy
@KERNEL_SKIP
def test_cupy_arrays_come_from_the_shared_pool():
    cupy = pytest.importorskip("cupy")
    from numba import cuda

    from numba_bfc.integrations.cupy import cupy_allocator

    scale = _scale_kernel()
    with numba_bfc_context(policy="bfc", backend="plain") as ctx:
        mgr = ctx.memory_manager
        cupy.cuda.set_allocator(cupy_allocator)
        try:
            # Filled by a copy, not a CuPy kernel: a CuPy kernel module in the
            # primary context that numba_bfc_context then resets makes the
            # interpreter fail at exit (docs/gpu.md), whichever manager is in use.
            x = cupy.empty(1 << 20, dtype=cupy.uint32)
            x.set(np.arange(1 << 20, dtype=np.uint32))
            assert mgr.allocator.allocated_size(int(x.data.ptr)) >= x.nbytes
            launch(scale, cuda.as_cuda_array(x), 3)  # a Numba kernel on CuPy memory
            cuda.synchronize()
            np.testing.assert_array_equal(cupy.asnumpy(x),
                                          3 * np.arange(1 << 20, dtype=np.uint32))
            in_use = mgr.allocator.get_stats().bytes_in_use
            del x
            assert mgr.allocator.get_stats().bytes_in_use <= in_use - (4 << 20)
        finally:
            cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)


def test_caching_expandable_segments_keep_data_across_unmapping_and_mapping():
    """PyTorch's expandable segments on CUDA virtual memory: blocks grow in place,
    empty_cache unmaps whole free pages, and mapping them again keeps every
    live array's data."""
    from numba import cuda

    import numba_bfc
    from numba_bfc.testing.invariants import check_invariants

    with numba_bfc_context(policy="caching", expandable_segments=True) as ctx:
        mgr = ctx.memory_manager
        mgr.initialize()
        if (20 * MiB) % mgr.backend.granularity:
            pytest.skip(f"pages of 20 MiB need a granularity dividing them, "
                        f"not {mgr.backend.granularity}")
        a = cuda.device_array(30 * MiB // 4, dtype=np.uint32)
        b = cuda.device_array(30 * MiB // 4, dtype=np.uint32)
        assert span(b)[0] == span(a)[1]  # one range, grown by mapping pages
        write_pattern(a, 1)
        write_pattern(b, 2)
        cuda.synchronize()
        del a
        alloc = numba_bfc.current_allocator()  # applies the pending free
        alloc.empty_cache()  # the first page is free and whole: unmapped
        assert alloc.memory_reserved() == 60 * MiB - 20 * MiB
        c = cuda.device_array(25 * MiB // 4, dtype=np.uint32)  # maps the page again
        write_pattern(c, 3)
        cuda.synchronize()
        np.testing.assert_array_equal(b.copy_to_host(), pattern(2, b.size))
        np.testing.assert_array_equal(c.copy_to_host(), pattern(3, c.size))
        stats = alloc.memory_stats()
        assert stats["segment.all.current"] == 0 and stats["num_device_free"] == 1
        check_invariants(alloc)
