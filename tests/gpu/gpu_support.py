"""Helpers shared by the GPU tests: detection, managed contexts, data patterns,
driver-call counts.

Imported by the test modules in this directory (pytest puts it on ``sys.path``).
With ``NUMBA_BFC_FAKE_CUDA=1`` the tests run against ``fake_libcuda.c``, a
fake CUDA driver over host memory, loaded here before numba-cuda looks for the
driver: the real numba-cuda, cuda-bindings and numba_bfc code runs, and data
is written by host-to-device copies where a GPU would run a kernel.
"""

from __future__ import annotations

import contextlib
import gc

import fake_cuda
import numpy as np
import pytest

FAKE_DEVICE = fake_cuda.requested()
if FAKE_DEVICE:
    fake_cuda.preload()

from numba_bfc.backends.cuda import cuda_available  # noqa: E402


def can_launch_kernels() -> bool:
    """A real GPU and NVVM, so that Numba kernels compile and run."""
    if FAKE_DEVICE or not HAS_GPU:
        return False
    from numba import cuda

    return bool(cuda.is_available())


#: numba-cuda, a driver and a GPU (real, or the fake driver).
HAS_GPU = cuda_available()
KERNELS = can_launch_kernels()
#: Apply to every GPU test module: ``pytestmark = [pytest.mark.cuda, GPU_SKIP]``.
GPU_SKIP = pytest.mark.skipif(
    not HAS_GPU, reason="needs an NVIDIA GPU, its driver and numba-cuda "
                        "(or NUMBA_BFC_FAKE_CUDA=1 for the fake driver)")
#: For tests that cannot run without kernels.
KERNEL_SKIP = pytest.mark.skipif(
    not KERNELS, reason="launches Numba kernels: needs a real GPU and NVVM")

COMBINATIONS = [("bfc", "plain"), ("bfc", "virtual"), ("caching", "plain"),
                ("caching", "virtual"), ("compact", "virtual")]


def pattern(seed: int, n: int) -> np.ndarray:
    """``n`` uint32 values that differ for every seed and position."""
    return ((seed * 2654435761 + np.arange(n, dtype=np.int64)) & 0xFFFFFFFF).astype(np.uint32)


def _fill_kernel(cuda):
    @cuda.jit
    def fill(a, s):
        i = cuda.grid(1)
        if i < a.size:
            a[i] = (s * 2654435761 + i) & 0xFFFFFFFF  # int64 arithmetic, then wrap

    return fill


def _spin_kernel(cuda):
    @cuda.jit
    def spin(n):
        for _ in range(n):
            cuda.nanosleep(1000000)  # 1 ms at most per call

    return spin


_KERNEL_BUILDERS = {"fill": _fill_kernel, "spin": _spin_kernel}
#: Kernels compiled for the current context, by name; ``close_cuda`` empties it.
_kernels: dict = {}


def _kernel(name: str):
    """The test kernel ``name`` (``"fill"`` or ``"spin"``), compiled for the
    current context.

    numba-cuda keeps a compiled kernel's function per device, not per context, so
    one compiled before ``cuda.close()`` launches a function of an unloaded module
    (``CUDA_ERROR_INVALID_HANDLE`` on an H100); each context gets its own.
    """
    if name not in _kernels:
        from numba import cuda

        _kernels[name] = _KERNEL_BUILDERS[name](cuda)
    return _kernels[name]


def warm_kernels() -> None:
    """Compile the test kernels for the current context and launch each once.

    A kernel's first launch loads it, and CUDA's lazy loading may synchronize the
    context to do so: the likely reason why, on an H100, the fill kernel's first
    launch on one stream came after ``slow_fill``'s sleep on another and hid the
    hazard that the stream-safety tests build. Launched here, before a test
    queues any work, the kernels are loaded. Allocates nothing from the pool (an
    empty array).
    """
    if not KERNELS:
        return
    from numba import cuda

    _kernel("spin")[1, 1](0)
    _kernel("fill")[1, 1](cuda.device_array(0, dtype=np.uint32), 0)
    cuda.synchronize()


def write_pattern(arr, seed: int, stream=0) -> None:
    """Fill the uint32 device array ``arr`` with ``pattern(seed, arr.size)``, queued
    on ``stream``.

    On a GPU a Numba kernel writes it; on the fake driver a host-to-device copy.
    """
    if not KERNELS:
        arr.copy_to_device(pattern(seed, arr.size), stream=stream)
        return
    threads = 256
    _kernel("fill")[(arr.size + threads - 1) // threads, threads, stream](arr, seed)


def close_cuda() -> None:
    """``cuda.close()``, leaving the device usable by the next context Numba makes.

    numba-cuda takes the primary context through cuda.core, which retains it once
    and keeps the handle; ``cuda.close()`` releases and resets it. On an H100 the
    next context Numba made was then that destroyed handle (every driver call:
    ``CUDA_ERROR_CONTEXT_IS_DESTROYED``), whatever the memory manager. A retain
    brings the primary context back under the same handle. The test kernels are
    compiled again for the next context (``_kernel``).
    """
    from numba import cuda
    from numba.cuda.cudadrv.driver import driver

    gc.collect()
    cuda.close()
    _kernels.clear()
    _flags, active = driver.cuDevicePrimaryCtxGetState(0)
    if not active:
        driver.cuDevicePrimaryCtxRetain(0)


@contextlib.contextmanager
def numba_bfc_context(**options):
    """A fresh CUDA context whose memory manager is numba_bfc with ``options``.

    Closes Numba's contexts before and after (``close_cuda``), loads the test
    kernels (``warm_kernels``), and restores the memory manager that was
    selected before.
    """
    from numba import cuda
    from numba.cuda.cudadrv import driver as drv

    from numba_bfc.integrations.numba_emm import use_numba_bfc

    saved = drv._memory_manager
    close_cuda()
    try:
        cls = use_numba_bfc(**options)
        ctx = cuda.current_context()
        assert isinstance(ctx.memory_manager, cls)
        warm_kernels()
        yield ctx
    finally:
        close_cuda()
        drv._memory_manager = saved


@contextlib.contextmanager
def default_numba_context():
    """A fresh CUDA context with Numba's own memory manager."""
    from numba import cuda
    from numba.cuda.cudadrv import driver as drv

    saved = drv._memory_manager
    close_cuda()
    try:
        drv._memory_manager = drv.NumbaCUDAMemoryManager
        yield cuda.current_context()
    finally:
        close_cuda()
        drv._memory_manager = saved


# ---------------------------------------------------------------------- streams
FAKE_COUNTERS = ("live_events", "live_streams", "pending_ops", "executed_ops",
                 "illegal_accesses", "events_recorded", "event_queries", "event_syncs")


def fake_counters() -> dict:
    """The fake driver's counters (``numba_bfc_fake_counters``); fake driver only."""
    import ctypes

    out = (ctypes.c_longlong * len(FAKE_COUNTERS))()
    n = fake_cuda.preload().numba_bfc_fake_counters(out, len(FAKE_COUNTERS))
    return dict(zip(FAKE_COUNTERS[:n], out[:n]))


@contextlib.contextmanager
def fake_event_delay(queries: int):
    """Events recorded inside answer ``queries`` queries with NOT_READY before
    completing (a device lagging the host); a no-op on a real GPU."""
    if not FAKE_DEVICE:
        yield
        return
    lib = fake_cuda.preload()
    old = lib.numba_bfc_fake_set_event_delay(queries)
    try:
        yield
    finally:
        lib.numba_bfc_fake_set_event_delay(old)


@contextlib.contextmanager
def non_blocking_stream():
    """A Numba stream created with ``CU_STREAM_NON_BLOCKING`` (not ordered by the
    legacy default stream), destroyed on exit."""
    from numba import cuda
    from numba.cuda.cudadrv import driver as drv

    handle = drv.driver.cuStreamCreate(1)  # CU_STREAM_NON_BLOCKING
    try:
        yield cuda.external_stream(int(handle))
    finally:
        drv.driver.cuStreamSynchronize(handle)
        drv.driver.cuStreamDestroy(handle)


#: How long ``slow_fill``'s kernel sleeps, in ms: long past the host work a test
#: does between queuing it and looking (50 ms did not show the hazard on an H100).
SPIN_MS = 300


def slow_fill(arr, byte: int, stream) -> None:
    """Queue on ``stream`` work that writes ``byte`` over ``arr`` late.

    On a GPU a kernel first sleeps about ``SPIN_MS``, so the write lands long
    after work queued on other streams; on the fake driver queued work runs only
    when something waits for it, which is later still.
    """
    from numba.cuda.cudadrv import driver as drv

    if KERNELS:
        _kernel("spin")[1, 1, stream](SPIN_MS)
    drv.device_memset(arr, byte, arr.nbytes, stream=stream)


@contextlib.contextmanager
def count_driver_calls(names=("cuMemAlloc", "cuMemFree", "cuMemCreate", "cuMemMap",
                              "cuMemSetAccess", "cuMemUnmap", "cuMemRelease",
                              "cuMemAddressReserve", "cuMemAddressFree")):
    """Count calls of the memory-management driver functions, by name.

    Numba's own manager and numba_bfc's backends both call them through the
    ``driver`` singleton, whose bound functions are replaced for the duration.
    """
    from numba.cuda.cudadrv import driver as drv

    counts = dict.fromkeys(names, 0)
    originals = {}
    for name in names:
        fn = getattr(drv.driver, name)
        originals[name] = fn

        def counted(*args, _fn=fn, _name=name):
            counts[_name] += 1
            return _fn(*args)

        setattr(drv.driver, name, counted)
    try:
        yield counts
    finally:
        for name, fn in originals.items():
            setattr(drv.driver, name, fn)
