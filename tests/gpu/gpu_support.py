"""Helpers shared by the GPU tests: detection, managed contexts, driver-call counts.

Imported by the test modules in this directory (pytest puts it on ``sys.path``).
"""

from __future__ import annotations

import contextlib
import gc

import pytest

from numba_bfc.backends.cuda import cuda_available


def has_cuda_gpu() -> bool:
    """numba-cuda, a driver, a GPU, and NVVM for compiling kernels."""
    if not cuda_available():
        return False
    from numba import cuda

    return bool(cuda.is_available())


HAS_GPU = has_cuda_gpu()
#: Apply to every GPU test module: ``pytestmark = [pytest.mark.cuda, GPU_SKIP]``.
GPU_SKIP = pytest.mark.skipif(
    not HAS_GPU, reason="needs an NVIDIA GPU, its driver and numba-cuda")

COMBINATIONS = [("bfc", "plain"), ("bfc", "virtual"), ("caching", "plain"),
                ("caching", "virtual"), ("compact", "virtual")]


@contextlib.contextmanager
def numba_bfc_context(**options):
    """A fresh CUDA context whose memory manager is numba_bfc with ``options``.

    Closes Numba's contexts before and after, and restores the memory manager
    that was selected before.
    """
    from numba import cuda
    from numba.cuda.cudadrv import driver as drv

    from numba_bfc.integrations.numba_emm import use_numba_bfc

    saved = drv._memory_manager
    gc.collect()
    cuda.close()
    try:
        cls = use_numba_bfc(**options)
        ctx = cuda.current_context()
        assert isinstance(ctx.memory_manager, cls)
        yield ctx
    finally:
        gc.collect()
        cuda.close()
        drv._memory_manager = saved


@contextlib.contextmanager
def default_numba_context():
    """A fresh CUDA context with Numba's own memory manager."""
    from numba import cuda
    from numba.cuda.cudadrv import driver as drv

    saved = drv._memory_manager
    gc.collect()
    cuda.close()
    try:
        drv._memory_manager = drv.NumbaCUDAMemoryManager
        yield cuda.current_context()
    finally:
        gc.collect()
        cuda.close()
        drv._memory_manager = saved


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
