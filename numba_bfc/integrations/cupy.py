"""CuPy interop: CuPy arrays allocated from the same pool as Numba's.

Usage (GPU only)::

    import cupy, numba_bfc
    numba_bfc.use_numba_bfc()
    cupy.cuda.set_allocator(numba_bfc.cupy_allocator)

Each CuPy allocation is a block from the numba_bfc memory manager of Numba's
primary context for CuPy's current device; the returned memory owns the
block, so when CuPy drops the memory the block goes through the same queue of
pending frees as Numba's arrays. With the default ``stream_safety="events"``
it returns to the pool after the work queued on the legacy default stream and
on every blocking stream before the free; when CuPy's current stream at
allocation is a non-blocking one (``cupy.cuda.Stream(non_blocking=True)``),
the block also waits for that stream, as ``numba_bfc.record_stream`` would
make it (PyTorch ties a block to its allocation stream the same way).

The first allocation in a context checks it through Numba's
``current_context()`` (about 6 us on an H100 machine); later ones reuse the
manager found then until Numba resets it (``cuda.close()`` does), and the
next allocation checks the device's new context.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
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


class _PoolBlock:
    """Owns one pool block for CuPy: dropped, it queues the block's free.

    Lighter than a Numba ``MemoryPointer`` (no ``weakref.finalize``, no driver
    pointer object), which CuPy would only keep alive.
    """

    __slots__ = ("_release",)

    def __init__(self, release: Callable[[], None]) -> None:
        self._release = release

    def __del__(self) -> None:
        self._release()


def _never_checked() -> None:
    return None


# Per device: a weak reference to the manager of the last context found to be
# Numba's current one with a numba_bfc manager (a manager holds its context,
# and a closed context should not stay alive through this table), and that
# manager's reset count then. Numba resets a context's manager when it closes
# the context, so an unchanged count means the context checked is still the
# device's primary one.
_checked_managers: dict[int, tuple[Callable[[], Any], int]] = {}
_UNCHECKED = (_never_checked, -1)  # a device not checked yet (made once, not per call)


# numba.cuda, imported at the first check (an import statement at every
# allocation costs about 0.5 us here).
_numba_cuda: Any = None


def _check_manager(device_id: int) -> Any:
    """The numba_bfc manager of the primary context of ``device_id``, checked."""
    global _numba_cuda
    if _numba_cuda is None:
        from numba import cuda

        _numba_cuda = cuda
    ctx = _numba_cuda.gpus[device_id].get_primary_context()
    from .numba_emm import current_manager

    # CuPy's runtime calls make the device's primary context current, and
    # Numba's current_context() adopts the active primary context.
    mgr = current_manager()
    if mgr.context is not ctx:
        raise RuntimeError(
            f"numba_bfc.cupy_allocator: CuPy's current device is {device_id} but Numba's "
            f"current context is on device {int(mgr.context.device.id)}; select the same "
            "device in both")
    _checked_managers[device_id] = (weakref.ref(mgr), mgr.resets)
    return mgr


def cupy_allocator(nbytes: int) -> Any:
    """Allocate ``nbytes`` for CuPy from numba_bfc's pool (for ``cupy.cuda.set_allocator``).

    Parameters
    ----------
    nbytes : int

    Returns
    -------
    cupy.cuda.MemoryPointer
        Over ``cupy.cuda.UnownedMemory`` whose owner holds the block: the
        block returns to the pool when CuPy frees the memory.

    Raises
    ------
    RuntimeError
        Numba's context for CuPy's current device is not managed by numba_bfc
        (call ``numba_bfc.use_numba_bfc()`` before the first CUDA use), or
        Numba's current context is on another device.
    numba_bfc.integrations.numba_emm.CudaOutOfMemoryError
        The pool cannot serve the request.
    """
    cupy = _cupy()
    device_id = cupy.cuda.runtime.getDevice()
    manager_ref, resets = _checked_managers.get(device_id, _UNCHECKED)
    mgr = manager_ref()
    if mgr is None or mgr.resets != resets:
        mgr = _check_manager(device_id)
    address, release = mgr.allocate_block(nbytes)
    stream = cupy.cuda.get_current_stream()
    if address and stream.ptr not in (0, 1, 2) and mgr.stream_safety == "events":
        # Default streams need nothing: the legacy-stream event of every free
        # orders them; record_stream skips other blocking streams too.
        try:
            mgr.record_stream(address, stream)
        except BaseException:
            release()
            raise
    mem = cupy.cuda.UnownedMemory(address, nbytes, _PoolBlock(release), device_id=device_id)
    return cupy.cuda.MemoryPointer(mem, 0)
