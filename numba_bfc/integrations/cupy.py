"""CuPy interop: CuPy arrays allocated from the same pool as Numba's.

Usage (GPU only)::

    import cupy, numba_bfc
    numba_bfc.use_numba_bfc()
    cupy.cuda.set_allocator(numba_bfc.cupy_allocator)

Each CuPy allocation is a ``memalloc`` on the numba_bfc memory manager of
Numba's CUDA context for CuPy's current device; the returned memory owns the
Numba ``MemoryPointer``, so when CuPy drops the memory the block goes through
the same queue of pending frees as Numba's arrays. With the default
``stream_safety="events"`` it returns to the pool after the work queued on the
legacy default stream and on every blocking stream before the free; when
CuPy's current stream at allocation is a non-blocking one
(``cupy.cuda.Stream(non_blocking=True)``), the block also waits for that
stream, as ``numba_bfc.record_stream`` would make it (PyTorch ties a block to
its allocation stream the same way).
"""

from __future__ import annotations

from typing import Any

__all__ = ["cupy_allocator"]


def _cupy() -> Any:
    try:
        import cupy
    except ImportError as e:
        raise ImportError(
            "numba_bfc.cupy_allocator needs CuPy (pip install cupy-cuda12x or cupy-cuda13x)"
        ) from e
    return cupy


def cupy_allocator(nbytes: int) -> Any:
    """Allocate ``nbytes`` for CuPy from numba_bfc's pool (for ``cupy.cuda.set_allocator``).

    Parameters
    ----------
    nbytes : int

    Returns
    -------
    cupy.cuda.MemoryPointer
        Over ``cupy.cuda.UnownedMemory`` whose owner is the Numba
        ``MemoryPointer``: the block returns to the pool when CuPy frees it.

    Raises
    ------
    RuntimeError
        Numba's context for CuPy's current device is not managed by numba_bfc
        (call ``numba_bfc.use_numba_bfc()`` before the first CUDA use).
    numba_bfc.integrations.numba_emm.CudaOutOfMemoryError
        The pool cannot serve the request.
    """
    cupy = _cupy()
    from .numba_emm import current_manager

    device_id = cupy.cuda.runtime.getDevice()
    # CuPy's runtime calls make the device's primary context current, and
    # Numba's current_context() adopts the active primary context.
    mgr = current_manager()
    ctx_device = int(mgr.context.device.id)
    if ctx_device != device_id:
        raise RuntimeError(
            f"numba_bfc.cupy_allocator: CuPy's current device is {device_id} but Numba's "
            f"current context is on device {ctx_device}; select the same device in both")
    block = mgr.memalloc(nbytes)
    address = int(block.device_pointer_value or 0)
    stream = cupy.cuda.get_current_stream()
    if address and stream.ptr not in (0, 1, 2) and mgr.stream_safety == "events":
        # Default streams need nothing: the legacy-stream event of every free
        # orders them; record_stream skips other blocking streams too.
        mgr.record_stream(address, stream)
    mem = cupy.cuda.UnownedMemory(address, nbytes, block, device_id=device_id)
    return cupy.cuda.MemoryPointer(mem, 0)
