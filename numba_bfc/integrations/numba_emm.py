"""Numba EMM plugin: every Numba device array and kernel temporary on a numba_bfc pool.

Select it before the first CUDA context exists, either with the environment
(``NUMBA_CUDA_MEMORY_MANAGER=numba_bfc``) or in code (``use_numba_bfc()``).
Numba then creates one ``NumbaBFCMemoryManager`` per CUDA context, and each
manager owns one allocator (BFC or caching policy) over one backend (plain
``cuMemAlloc`` regions or one virtual address range).

Design of frees. ``weakref.finalize`` callbacks run whenever Python collects
a ``MemoryPointer``: in any thread, and possibly inside our own ``memalloc``
while the allocator's (non-reentrant) lock is held. So a finalizer only
appends ``(address, nbytes)`` to a deque (``PendingFrees.entries``), which is
thread-safe and takes no lock; everything else runs under the manager's
``RLock``. One queue lives as long as one allocator, so finalizers of blocks
from before a ``reset()`` append to a queue nobody reads, and an address
handed out again after a reset is never freed by a stale finalizer.

Streams. The EMM interface passes no stream to ``memalloc`` or to
finalizers, and a finalizer may run while work using the block is still
queued. With ``stream_safety="events"`` (the default) queued frees return to
the pool only after a CUDA event recorded on the legacy default stream, which
waits for every blocking stream, has completed; ``record_stream`` adds
non-blocking streams (``stream_safety.py`` has the details). ``"off"`` reuses
blocks at once, as RMM's plugin does.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import gc
import inspect
import logging
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from numba import cuda

if not hasattr(cuda, "HostOnlyCUDAMemoryManager"):
    raise ImportError(
        "numba_bfc.integrations.numba_emm: NUMBA_ENABLE_CUDASIM=1 is set, and the CUDA "
        "simulator has no external memory management (EMM) interface; unset it to use "
        "the numba_bfc memory manager")

from numba.cuda import GetIpcHandleMixin, HostOnlyCUDAMemoryManager, IpcHandle, MemoryInfo
from numba.cuda.cudadrv import driver as _drv
from numba.cuda.cudadrv.driver import CudaAPIError, MemoryPointer

from .._config import conf_from_env, parse_bool, parse_str
from ..allocators import POLICIES as ALLOCATORS
from ..backends.base import SubAllocator, _RangeMap
from ..errors import InvalidPointerError, OutOfMemoryError
from .stream_safety import (
    CudaEventFences,
    FenceSource,
    PendingFrees,
    StreamSafetyStats,
    parse_stream_safety,
)

__all__ = [
    "NumbaBFCMemoryManager",
    "CudaOutOfMemoryError",
    "BFCIpcHandle",
    "use_numba_bfc",
    "current_allocator",
    "current_manager",
    "record_stream",
    "empty_cache",
]

_log = logging.getLogger("numba_bfc")

POLICIES = tuple(ALLOCATORS)
BACKENDS = ("plain", "virtual")
# Keys this plugin reads from NUMBA_BFC_CONF; the allocators read the others.
PLUGIN_CONF_KEYS = {"policy": parse_str, "backend": parse_str,
                    "stream_safety": parse_stream_safety}

# numba-cuda always uses the NVIDIA binding; numba's built-in target only when
# NUMBA_CUDA_USE_NVIDIA_BINDING=1. Device pointers must be of the matching type.
_NV_BINDING = bool(getattr(_drv, "USE_NV_BINDING", True))
if _NV_BINDING:
    _CUDA_OOM = _drv.binding.CUresult.CUDA_ERROR_OUT_OF_MEMORY

    def _device_ptr(addr: int) -> Any:
        return _drv.binding.CUdeviceptr(addr)
else:
    from numba.cuda.cudadrv import drvapi as _drvapi
    from numba.cuda.cudadrv import enums as _enums

    _CUDA_OOM = _enums.CUDA_ERROR_OUT_OF_MEMORY
    _device_ptr = ctypes.c_void_p

_IPC_HANDLE_BYTES = 64  # CU_IPC_HANDLE_SIZE


class CudaOutOfMemoryError(OutOfMemoryError, CudaAPIError):
    """``memalloc`` could not be served, even after applying pending frees.

    Both a ``numba_bfc.OutOfMemoryError`` (with the allocator's stats, bin
    summary and occupancy map) and a Numba ``CudaAPIError`` whose ``code`` is
    ``CUDA_ERROR_OUT_OF_MEMORY``, so code written for Numba's default memory
    manager catches it unchanged.
    """

    def __init__(self, err: OutOfMemoryError | str) -> None:
        if isinstance(err, OutOfMemoryError):
            OutOfMemoryError.__init__(
                self, str(err), allocator_name=err.allocator_name, num_bytes=err.num_bytes,
                rounded_bytes=err.rounded_bytes, alignment=err.alignment, stats=err.stats,
                reason=err.reason, **err.report_keywords())
        else:  # unpickling passes the message back
            OutOfMemoryError.__init__(self, str(err))
        self.code = _CUDA_OOM
        self.msg = str(err)

    def __str__(self) -> str:
        return f"[CUDA_ERROR_OUT_OF_MEMORY] {self.msg}"


# ---------------------------------------------------------------------------- IPC
def _ipc_handle_bytes(handle: Any) -> bytes:
    # cuda-bindings >= 13.4 no longer exposes CUipcMemHandle.reserved, which
    # Numba's IpcHandle.__reduce__ reads; the 64 bytes are read at getPtr().
    if hasattr(handle, "getPtr"):
        return ctypes.string_at(handle.getPtr(), _IPC_HANDLE_BYTES)
    return bytes(handle)  # ctypes array (numba's built-in ctypes binding)


def _ipc_handle_from_bytes(raw: bytes) -> Any:
    if _NV_BINDING:
        handle = _drv.binding.CUipcMemHandle()
        ctypes.memmove(handle.getPtr(), raw, _IPC_HANDLE_BYTES)
        return handle
    return _drvapi.cu_ipc_mem_handle.from_buffer_copy(raw)


def _rebuild_ipc_handle(raw: bytes, size: int, source_info: Any, offset: int) -> BFCIpcHandle:
    return BFCIpcHandle(None, _ipc_handle_from_bytes(raw), size, source_info, offset=offset)


class BFCIpcHandle(IpcHandle):
    """Numba's ``IpcHandle``, picklable with every cuda-bindings version.

    Opening it in another process (``open``, ``open_array``) is Numba's code;
    only serialisation differs: the handle's 64 bytes travel as ``bytes``.
    """

    def __reduce__(self):
        return (_rebuild_ipc_handle,
                (_ipc_handle_bytes(self.handle), self.size, self.source_info, self.offset))


def _allocation_base(memory: Any) -> int:
    """Base address of the driver allocation holding ``memory`` (``cuMemGetAddressRange``)."""
    base, _end = _drv.device_extents(memory)
    return int(base)


def _ipc_mem_handle(base: int) -> Any:
    return _drv.driver.cuIpcGetMemHandle(base)


def _address(memory: Any) -> int:
    return int(memory.device_pointer_value or 0)


# ---------------------------------------------------------------------------- backends
class _TrackedBackend(SubAllocator):
    """The real backend, plus a record of every region it granted.

    ``reset()`` must give all device memory back whatever the policy, and an
    allocator has no "free everything"; the record lets the manager free each
    region exactly as it was granted.
    """

    def __init__(self, inner: SubAllocator) -> None:
        super().__init__()
        self.inner = inner
        self.supports_coalescing = bool(inner.supports_coalescing)
        self.supports_remap = bool(getattr(inner, "supports_remap", False))
        self.host_accessible = bool(inner.host_accessible)
        self.device_memory = bool(inner.device_memory)
        self.capacity = inner.capacity
        if getattr(inner, "granularity", None):
            self.granularity = inner.granularity  # the compact policy's page size
        self._granted = _RangeMap()

    def total_memory(self) -> int | None:
        return self.inner.total_memory()

    def address_space(self) -> tuple[int, int | None]:
        return self.inner.address_space()

    def _alloc(self, nbytes: int, alignment: int) -> tuple[int, int] | None:
        got = self.inner.alloc(nbytes, alignment)
        if got is not None:
            self._granted.add(got[0], got[0] + got[1])
        return got

    def _alloc_at(self, ptr: int, nbytes: int) -> bool:
        if self.inner.alloc_at(ptr, nbytes) is None:
            return False
        self._granted.add(ptr, ptr + nbytes)
        return True

    def _free(self, ptr: int, nbytes: int) -> None:
        if not self._granted.covers(ptr, ptr + nbytes):
            raise ValueError(f"free({ptr:#x}, {nbytes}): not inside granted memory")
        self.inner.free(ptr, nbytes)
        # A coalescing allocator frees several granted regions in one call, a
        # remapping one part of a region.
        self._granted.remove(ptr, ptr + nbytes, partial=True)

    def release_all(self) -> int:
        """Free every region still granted; returns the bytes freed."""
        total = 0
        while self._granted.ranges:
            start, end = self._granted.ranges.peekitem(0)
            self.free(start, end - start)
            total += end - start
        return total


def _device_memory_info(backend: SubAllocator) -> tuple[int, int]:
    """``(free, total)`` of what ``backend`` draws from."""
    info = getattr(backend, "memory_info", None)
    if info is not None:
        free, total = info()
        return int(free), int(total)
    # Simulated backends: their capacity is the whole "device".
    total = backend.total_memory()
    if total is None:
        raise NotImplementedError(
            f"{type(backend).__name__} has neither memory_info() nor a capacity")
    return max(0, int(total) - int(backend.bytes_held)), int(total)


def _check_choice(value: Any, allowed: tuple[str, ...], what: str) -> str:
    v = str(value).strip().lower()
    if v not in allowed:
        raise ValueError(
            f"numba_bfc: unknown {what} {value!r} (choose one of {', '.join(allowed)})")
    return v


# ---------------------------------------------------------------------------- the plugin
class NumbaBFCMemoryManager(GetIpcHandleMixin, HostOnlyCUDAMemoryManager):
    """Numba External Memory Management plugin over a numba_bfc allocator.

    Numba creates one instance per CUDA context (``Manager(context=ctx)``);
    configure the class with ``use_numba_bfc(...)``, or with the
    ``NUMBA_BFC_CONF`` keys ``policy`` and ``backend`` when selected through
    ``NUMBA_CUDA_MEMORY_MANAGER=numba_bfc``.

    Parameters
    ----------
    context : numba.cuda.cudadrv.driver.Context or None
        The context this manager serves. ``None`` only for the throw-away
        instance ``set_memory_manager`` makes to read ``interface_version``;
        such an instance touches no driver and allocates nothing.
    policy : {"bfc", "caching", "compact"}, optional
        ``BFCAllocator`` (TensorFlow), ``CachingAllocator`` (PyTorch) or
        ``CompactAllocator`` (smallest footprint).
        Default: ``NUMBA_BFC_CONF`` key ``policy``, else ``"bfc"``.
    backend : {"plain", "virtual"} or SubAllocator or callable, optional
        ``"plain"``: ``CudaSubAllocator`` (``cuMemAlloc`` regions; IPC works);
        ``"virtual"``: ``CudaVirtualSubAllocator`` (one reserved address range,
        regions coalesce; no IPC). A ``SubAllocator`` instance is used as is
        (tests, simulations: one context only); a callable is called as
        ``backend(context)`` for each context. Default: ``NUMBA_BFC_CONF`` key
        ``backend``, else ``"virtual"`` for ``compact`` and ``"plain"`` otherwise.
        The compact policy's small space gets a second backend of the same
        spec (a second reserved range, or a second call of the callable); with
        an instance it has one space unless ``small_backend`` is given.
    va_size : int, optional
        Address space the virtual backend reserves (default: device memory).
    stream_safety : {"events", "off"} or FenceSource or callable, optional
        ``"events"`` (default): a freed block returns to the pool only after
        the device work queued before its free has finished (an event on the
        legacy default stream, plus events on streams named with
        ``record_stream``). ``"off"``: at once, as RMM's plugin does; safe when
        all work is ordered on one stream. A ``FenceSource`` (or a callable
        ``f(context)`` returning one) replaces CUDA events, for tests and
        simulations. Default: ``NUMBA_BFC_CONF`` key ``stream_safety``, else
        ``"events"``. With a backend that is not device memory (simulated,
        host) no device work can use a block, and blocks return at once.
    **allocator_options
        Passed to the policy's constructor (e.g. ``memory_limit``,
        ``allow_growth``, ``garbage_collection`` for BFC; ``max_split_size``,
        ``roundup_power2_divisions`` for caching; ``page_size``,
        ``release_threshold`` for compact). Options not given are read by
        the allocator from ``NUMBA_BFC_CONF``.

    Notes
    -----
    Out of memory: pending frees are waited for and returned, regions with
    nothing in use go back to the driver, and, last, ``gc.collect()`` frees
    arrays caught in reference cycles; the request is retried after each step
    that freed something, and a final failure raises
    ``CudaOutOfMemoryError``. Inside ``defer_cleanup()`` none of this happens,
    as with Numba's own manager.

    When pending frees come back (``stream_safety="events"``): a ``memalloc``
    fences the frees queued since the last fence (one ``cuEventRecord``) and
    returns the blocks of completed fences (``cuEventQuery``, oldest first)
    only when the request may not fit in the pool's free memory or more than
    ``MAX_UNFENCED`` frees are queued, because each driver call costs about as
    much as a pool allocation. If the request still may not fit, pending
    blocks would make room and they are a quarter of the pool and 1/64 of the
    memory limit, it waits for the oldest fence instead of growing the pool. ``get_memory_info``,
    ``allocator`` and the end of ``defer_cleanup()`` return completed blocks
    without blocking; out of memory, ``release_unused`` and ``reset`` wait for
    every pending fence.

    Attributes
    ----------
    resets : int
        How many times ``reset()`` has run (Numba resets a context's manager
        when it closes the context): a caller that keeps this manager for
        later can tell whether the context it checked may be gone.
    """

    #: Class-level options set by ``use_numba_bfc`` (constructor arguments win).
    _preset: dict[str, Any] = {}

    def __init__(self, *, context: Any, policy: str | None = None,
                 backend: str | SubAllocator | Callable[[Any], SubAllocator] | None = None,
                 va_size: int | None = None,
                 stream_safety: str | FenceSource | Callable[[Any], FenceSource] | None = None,
                 **allocator_options: Any) -> None:
        super().__init__(context=context)
        opts = dict(self._preset)
        opts.update({k: v for k, v in dict(policy=policy, backend=backend, va_size=va_size,
                                              stream_safety=stream_safety).items()
                     if v is not None})
        opts.update(allocator_options)
        env = conf_from_env(PLUGIN_CONF_KEYS)
        self.policy = _check_choice(opts.pop("policy", env.get("policy", "bfc")), POLICIES,
                                    "policy")
        # The compact policy, and expandable segments, map pages into reserved
        # address space: CUDA virtual memory.
        expandable = opts.get("expandable_segments")
        if expandable is None:
            expandable = conf_from_env({"expandable_segments": parse_bool}).get(
                "expandable_segments", False)
        mapped = self.policy == "compact" or (
            self.policy == "caching" and parse_bool(expandable, name="expandable_segments"))
        default_backend = "virtual" if mapped else "plain"
        spec = opts.pop("backend", env.get("backend", default_backend))
        if isinstance(spec, str):
            spec = _check_choice(spec, BACKENDS, "backend")
        elif not (isinstance(spec, SubAllocator) or callable(spec)):
            raise TypeError(
                f"numba_bfc: backend must be 'plain', 'virtual', a SubAllocator or a callable, "
                f"not {type(spec).__name__}")
        self._backend_spec = spec
        safety = opts.pop("stream_safety", env.get("stream_safety", "events"))
        if isinstance(safety, str):
            safety = parse_stream_safety(safety)
        elif not callable(getattr(safety, "record", None)) and not callable(safety):
            raise TypeError(
                f"numba_bfc: stream_safety must be 'events', 'off', a FenceSource or a "
                f"callable, not {type(safety).__name__}")
        self._stream_safety = safety
        self._va_size = opts.pop("va_size", None)
        cls = ALLOCATORS[self.policy]
        try:  # reject misspelt options now, not at the first allocation
            inspect.signature(cls).bind(None, **opts)
        except TypeError as e:
            raise TypeError(f"numba_bfc: bad option for policy {self.policy!r}: {e}") from None
        self._policy_cls = cls
        self._allocator_options = opts
        self._lock = threading.RLock()
        self._frees = PendingFrees()  # replaced with each allocator
        self._defer_depth = 0
        self._allocator: Any = None
        self._tracked: _TrackedBackend | None = None
        self._small: _TrackedBackend | None = None
        self._run_ahead = 0  # pending bytes a request need not wait for (limit / 64)
        self._all_tracked: list[tuple[_TrackedBackend, bool]] = []  # (backend, owned)
        self._owns_backend = False
        self._ctx_ref = None if context is None else _weak(context)
        self.resets = 0

    # ------------------------------------------------------------------ EMM interface
    @property
    def interface_version(self) -> int:
        """The EMM plugin interface implemented: 1."""
        return 1

    def initialize(self) -> None:
        """Create the backend and allocator; idempotent (Numba calls it on every push)."""
        if self._allocator is None and self.context is not None:
            with self._lock:
                self._ensure_allocator_locked()

    def memalloc(self, size: int) -> MemoryPointer:
        """Allocate ``size`` bytes of device memory from the pool.

        Returns
        -------
        numba.cuda.MemoryPointer
            Owns the block: when it (and every view of it) is collected, the
            block is queued for return to the pool. Raises as ``allocate_block``.
        """
        size = int(size)
        addr, release = self.allocate_block(size)
        return MemoryPointer(self._ctx_ref, _device_ptr(addr), size,
                             finalizer=release if addr else None)

    def allocate_block(self, size: int) -> tuple[int, Callable[[], None]]:
        """Allocate ``size`` bytes from the pool without a Numba ``MemoryPointer``.

        For libraries that wrap device memory in their own objects (the CuPy
        allocator does): ``memalloc`` is this plus the pointer object.

        Parameters
        ----------
        size : int
            Bytes; 0 gives address 0 and a release that does nothing.

        Returns
        -------
        address : int
            The block's device address.
        release : callable
            Call it exactly once, when nothing uses the block any more: it
            queues the free as a ``MemoryPointer``'s finalizer would (no lock
            taken, no Python code of ours run, safe in a finalizer).

        Raises
        ------
        CudaOutOfMemoryError
            The pool and the device cannot serve the request.
        """
        size = int(size)
        if size == 0:
            return 0, _release_nothing
        with self._lock:
            frees = self._frees
            if frees.entries and not self._defer_depth:
                # Inline: this runs at nearly every allocation, and a method call
                # costs as much as the test itself.
                if not frees.gated:
                    frees.drain()
                else:
                    held = self._tracked.bytes_held
                    if self._small is not None:
                        held += self._small.bytes_held
                    if size > held - frees.live_bytes or len(frees.entries) > frees.reclaim_at:
                        self._reclaim_for_locked(size)
            alloc = self._allocator
            if alloc is None:
                alloc = self._ensure_allocator_locked()
            try:
                addr = alloc.allocate_raw(size)
            except OutOfMemoryError as err:
                addr = self._allocate_after_oom_locked(alloc, size, err)
            frees = self._frees  # the first allocation made it
            frees.live_bytes += size + 511 & ~511
        # functools.partial of deque.append: the release runs no Python code
        # of ours, takes no lock, and keeps neither this manager nor the
        # context alive.
        return addr, functools.partial(frees.entries.append, (addr, size))

    def get_memory_info(self) -> MemoryInfo:
        """``(free, total)``: what this context can still allocate, and the device total.

        ``free`` is the pool's free bytes plus what the device can still give
        the pool (bounded by the allocator's memory limit); ``total`` is the
        device's total memory.
        """
        with self._lock:
            alloc = self._ensure_allocator_locked()
            self._reclaim_locked()
            dev_free, dev_total = _device_memory_info(self._tracked.inner)
            stats = alloc.get_stats()
            reserved = int(stats.bytes_reserved)
            pool_free = reserved - int(stats.bytes_in_use)
            limit = getattr(alloc, "memory_limit", None)
            headroom = dev_free if limit is None else min(dev_free, max(0, limit - reserved))
            return MemoryInfo(free=pool_free + headroom, total=dev_total)

    def get_ipc_handle(self, memory: MemoryPointer) -> BFCIpcHandle:
        """An IPC handle for ``memory``: its region's ``cuIpcGetMemHandle`` plus an offset.

        Raises
        ------
        NotImplementedError
            The backend's memory cannot be exported with ``cuIpcGetMemHandle``
            (the virtual backend maps ``cuMemCreate`` memory).
        """
        with self._lock:
            self._ensure_allocator_locked()
            inner = self._tracked.inner
        if not getattr(inner, "ipc_capable", False):
            raise NotImplementedError(
                f"numba_bfc: IPC handles need the 'plain' backend (cuMemAlloc regions); memory "
                f"from {type(inner).__name__} cannot be exported with cuIpcGetMemHandle")
        base = _allocation_base(memory)
        offset = _address(memory) - base
        source_info = self.context.device.get_device_identity()
        return BFCIpcHandle(memory, _ipc_mem_handle(base), memory.size, source_info,
                            offset=offset)

    def reset(self) -> None:
        """Free all device memory of this context and forget every block.

        Finalizers of blocks allocated before the reset are ignored afterwards.
        Regions go back to the driver (skipped at interpreter exit, when the
        driver frees everything itself).
        """
        with self._lock:
            self.resets += 1
            frees, self._frees = self._frees, PendingFrees()
            all_tracked = self._all_tracked
            self._allocator = None
            self._tracked = self._small = None
            self._all_tracked = []
            try:
                if not _drv.utils.shutting_down():
                    errors = []
                    try:  # no device work may still use the memory about to go back
                        frees.clear(wait=True)
                    except Exception as e:
                        errors.append(e)
                    if frees.fences is not None:
                        try:
                            frees.fences.close()
                        except Exception as e:
                            errors.append(e)
                    for tracked, owned in all_tracked:
                        try:  # every backend goes back, even if one fails
                            tracked.release_all()
                            if owned and hasattr(tracked.inner, "close"):
                                tracked.inner.close()
                        except Exception as e:
                            errors.append(e)
                    if errors:
                        raise errors[0]
            finally:
                super().reset()

    @contextlib.contextmanager
    def defer_cleanup(self) -> Iterator[None]:
        """Queue frees instead of applying them while active (nestable).

        Blocks freed inside are not reused until the outermost section ends,
        when the queue is processed as at a ``memalloc``, and the plugin gives
        no region back to the driver meanwhile (the caching policy's own
        out-of-memory path, which releases cached segments inside
        ``allocate_raw``, still may).
        Numba's host-side deferral (``super().defer_cleanup()``) is held too.
        """
        with self._lock:
            self._defer_depth += 1
        try:
            with super().defer_cleanup():
                yield
        finally:
            with self._lock:
                self._defer_depth -= 1
                if self._defer_depth == 0:
                    self._reclaim_locked()

    # ------------------------------------------------------------------ extras
    @property
    def allocator(self) -> Any:
        """This context's allocator, with the pending frees whose device work has
        finished returned first (without waiting for the rest): stats, memory
        maps, occupancy (``get_stats()``, ``memory_map()``, ``render_occupancy()``).
        Blocks still pending count as in use; ``stream_safety_stats()`` says how
        many."""
        with self._lock:
            alloc = self._ensure_allocator_locked()
            self._reclaim_locked()
            return alloc

    @property
    def backend(self) -> SubAllocator | None:
        """The backend regions come from (None before the first use)."""
        return None if self._tracked is None else self._tracked.inner

    @property
    def pending_frees(self) -> int:
        """Blocks collected by Python but not yet returned to the pool."""
        return len(self._frees)

    @property
    def stream_safety(self) -> str:
        """``"events"``, ``"off"``, or ``"none"`` (no device memory: nothing to wait
        for); ``"events"`` before the first use when events are asked for."""
        if self._allocator is None:
            spec = self._stream_safety
            return spec if isinstance(spec, str) else "events"
        return self._frees.mode

    def stream_safety_stats(self) -> StreamSafetyStats:
        """Pending frees and the driver calls spent on them (see ``StreamSafetyStats``)."""
        with self._lock:
            stats = self._frees.stats()
        if self._allocator is None:
            stats = dataclasses.replace(stats, mode=self.stream_safety)
        return stats

    def memory_stats(self) -> dict[str, int]:
        """PyTorch-style counters: the allocator's (``memory_stats()`` for the
        caching policy, else ``allocated_bytes``/``reserved_bytes`` from
        ``get_stats()``), plus the pending frees.

        The allocator counts a pending block in use (PyTorch's
        ``active_bytes`` does the same); ``pending_free_bytes.all.current``
        says how much of it is waiting for the device.
        """
        with self._lock:
            alloc = self._ensure_allocator_locked()
            self._reclaim_locked()
            if hasattr(alloc, "memory_stats"):
                out = dict(alloc.memory_stats())
            else:
                st = alloc.get_stats()
                out = {"allocated_bytes.all.current": int(st.bytes_in_use),
                       "allocated_bytes.all.peak": int(st.peak_bytes_in_use),
                       "reserved_bytes.all.current": int(st.bytes_reserved),
                       "reserved_bytes.all.peak": int(st.peak_bytes_reserved)}
            pending = self._frees.stats()
        out.update({
            "pending_free_bytes.all.current": pending.pending_bytes,
            "pending_free_blocks.all.current": pending.pending_blocks,
            "pending_free_blocks.all.peak": pending.peak_pending_blocks,
            "pending_fences": pending.fences,
            "num_events_recorded": pending.events_recorded,
            "num_event_queries": pending.event_queries,
            "num_sync_all_streams": pending.waits,
        })
        return out

    def record_stream(self, address: int, stream: Any) -> bool:
        """Make the free of the block at ``address`` wait for the work queued on
        ``stream`` until then (``numba_bfc.record_stream`` takes arrays).

        Returns
        -------
        bool
            False when the stream needs no event of its own: a blocking stream
            with ``stream_safety="events"`` (the legacy-stream event orders it),
            or a backend that is not device memory.

        Raises
        ------
        ValueError
            ``address`` is not the start of a block this manager handed out.
        """
        with self._lock:
            alloc = self._ensure_allocator_locked()
            try:
                alloc.allocated_size(int(address))
            except InvalidPointerError:
                raise ValueError(
                    f"numba_bfc.record_stream: {int(address):#x} is not the start of a live "
                    "block of this context's pool") from None
            return self._frees.record_stream(int(address), stream)

    @property
    def deferred(self) -> bool:
        """True inside ``defer_cleanup()``."""
        return self._defer_depth > 0

    def release_unused(self) -> bool:
        """Wait for the device work of every pending free, return those blocks, and
        give regions with nothing in use back to the driver (PyTorch's
        ``empty_cache``).

        Returns True if any memory went back. Does nothing inside ``defer_cleanup()``.
        """
        with self._lock:
            if self._allocator is None or self._defer_depth:
                return False
            self._frees.wait_all()
            return self._release_cached_locked(0)

    def __repr__(self) -> str:
        state = "unused" if self._allocator is None else repr(self._allocator)
        return (f"{type(self).__name__}(policy={self.policy!r}, "
                f"backend={self._backend_name()!r}, {state})")

    # ------------------------------------------------------------------ internals
    def _backend_name(self) -> str:
        spec = self._backend_spec
        return spec if isinstance(spec, str) else type(spec).__name__

    def _ensure_allocator_locked(self) -> Any:
        if self._allocator is not None:
            return self._allocator
        if self.context is None:
            raise RuntimeError(
                "numba_bfc: this memory manager has no CUDA context (it was created with "
                "context=None, as set_memory_manager() does to check the interface version)")
        options = dict(self._allocator_options)
        inner, owned = self._new_backend()
        made = [inner] if owned else []
        try:
            tracked = [_TrackedBackend(inner)]
            small = options.pop("small_backend", None)
            if small is None and self.policy == "compact" and owned:
                # The compact policy's small space: a second range of the same kind.
                small = self._new_backend()[0]
                made.append(small)
            if small is not None:
                tracked.append(_TrackedBackend(small))
                options["small_backend"] = tracked[1]
            alloc = self._policy_cls(tracked[0], **options)
            frees = self._new_pending_frees(alloc, tracked[0].device_memory)
        except BaseException:
            for backend in made:
                if hasattr(backend, "close"):
                    backend.close()
            raise
        self._tracked, self._owns_backend, self._allocator = tracked[0], owned, alloc
        self._small = tracked[1] if len(tracked) > 1 else None
        limit = getattr(alloc, "memory_limit", None) or tracked[0].total_memory() or 0
        self._run_ahead = int(limit) // 64
        self._all_tracked = [(t, t.inner in made) for t in tracked]
        self._frees = frees
        return alloc

    def _new_pending_frees(self, alloc: Any, device_memory: bool) -> PendingFrees:
        """The queue of this allocator's frees, with fences when device work can
        use its memory (or when a fence source was given)."""
        spec, fences = self._stream_safety, None
        if not isinstance(spec, str):
            fences = spec if callable(getattr(spec, "record", None)) else spec(self.context)
        elif device_memory:
            fences = CudaEventFences(self.context)
        frees = PendingFrees(fences, legacy_fence=spec != "off")
        frees.bind(alloc.deallocate_raw)
        return frees

    def _new_backend(self) -> tuple[SubAllocator, bool]:
        """A backend for this context from the spec, and whether the plugin owns it."""
        spec = self._backend_spec
        if spec == "plain":
            from ..backends.cuda import CudaSubAllocator

            return CudaSubAllocator(context=self.context), True
        if spec == "virtual":
            from ..backends.cuda import CudaVirtualSubAllocator

            return CudaVirtualSubAllocator(context=self.context, va_size=self._va_size), True
        if isinstance(spec, SubAllocator):
            return spec, False
        return spec(self.context), True

    def _held_bytes(self) -> int:
        """Bytes the pool's backends hold; less ``PendingFrees.live_bytes`` (the
        blocks handed out, pending ones included), what a request may fit in
        without waiting or growing."""
        held = self._tracked.bytes_held
        if self._small is not None:
            held += self._small.bytes_held
        return held

    def _reclaim_for_locked(self, size: int) -> None:
        """Before a request that may not fit: return the completed pending blocks.
        If it still may not fit, the pending ones would make room, and they are a
        quarter of the pool and 1/64 of the memory limit, wait for the oldest
        fence rather than grow: the host runs that far ahead of the device."""
        frees = self._frees
        frees.reclaim()
        held = self._held_bytes()
        free = held - frees.live_bytes
        if size > free and frees.pending_fences:
            pending = frees.fenced_bytes()
            if size <= free + pending and pending >= max(held // 4, self._run_ahead):
                frees.wait_oldest()

    def _reclaim_locked(self) -> int:
        """Return the pending blocks whose device work has finished (never blocks)."""
        if self._defer_depth or self._allocator is None:
            return 0
        return self._frees.reclaim()

    def _wait_pending_locked(self) -> int:
        """Wait for the device work of every pending block and return them all."""
        if self._defer_depth or self._allocator is None:
            return 0
        return self._frees.wait_all()

    def _release_cached_locked(self, nbytes: int) -> bool:
        alloc = self._allocator
        if hasattr(alloc, "deallocate_free_regions"):
            return bool(alloc.deallocate_free_regions(nbytes))
        if hasattr(alloc, "empty_cache"):
            held = sum(t.bytes_held for t, _ in self._all_tracked)
            alloc.empty_cache()
            return sum(t.bytes_held for t, _ in self._all_tracked) < held
        return False

    def _allocate_after_oom_locked(self, alloc: Any, size: int, err: OutOfMemoryError) -> int:
        """Serve ``size`` after ``alloc.allocate_raw`` failed with ``err``, or raise."""
        last = err
        limit = getattr(alloc, "memory_limit", None)
        if self._defer_depth or (limit is not None and size > limit):
            raise CudaOutOfMemoryError(last)
        # Cheapest remedy first (CuPy's order): every pending free, waiting for
        # its device work (PyTorch synchronizes its events here too); free
        # regions back to the driver, so that one region large enough can grow
        # (TF's DeallocateFreeRegions); a full garbage collection (tens of ms)
        # for arrays held only by reference cycles; regions once more.
        steps = (self._wait_pending_locked,
                 lambda: self._release_cached_locked(size),
                 self._collect_locked,
                 lambda: self._release_cached_locked(size))
        for step in steps:
            if not step():
                continue
            try:
                return alloc.allocate_raw(size)
            except OutOfMemoryError as err:
                last = err
        raise CudaOutOfMemoryError(last)

    def _collect_locked(self) -> int:
        gc.collect()  # finalizers only queue, so collecting under our lock is safe
        return self._wait_pending_locked()


def _release_nothing() -> None:
    """The release of an empty block."""


def _weak(context: Any) -> Any:
    # Numba's own manager hands pointers a proxy, so that pointers outliving a
    # context do not keep it (and its modules and streams) alive.
    try:
        return weakref.proxy(context)
    except TypeError:
        return context


_numba_memory_manager = NumbaBFCMemoryManager


# ---------------------------------------------------------------------------- helpers
def use_numba_bfc(policy: str | None = None,
                  backend: str | SubAllocator | Callable[[Any], SubAllocator] | None = None,
                  stream_safety: str | FenceSource | None = None,
                  **options: Any) -> type[NumbaBFCMemoryManager]:
    """Make Numba allocate device memory through numba_bfc (``cuda.set_memory_manager``).

    Call it before the first CUDA context is created (before any
    ``cuda.device_array`` or kernel launch), or follow it with ``cuda.close()``;
    existing contexts keep their manager.

    Parameters
    ----------
    policy, backend, stream_safety, **options
        As for ``NumbaBFCMemoryManager``; options not given fall back to
        ``NUMBA_BFC_CONF`` when each context's manager is created.

    Returns
    -------
    type
        The manager class installed (a configured subclass when options are given).
    """
    preset = {k: v for k, v in dict(policy=policy, backend=backend,
                                    stream_safety=stream_safety).items() if v is not None}
    preset.update(options)
    if preset:
        cls = type("NumbaBFCMemoryManager", (NumbaBFCMemoryManager,),
                   {"_preset": preset, "__module__": __name__,
                    "__doc__": NumbaBFCMemoryManager.__doc__})
    else:
        cls = NumbaBFCMemoryManager
    stale = [dev.id for dev in list(_drv.driver.devices.values())
             if getattr(dev, "primary_context", None) is not None
             and not isinstance(dev.primary_context.memory_manager, cls)]
    cuda.set_memory_manager(cls)  # validates the options via cls(context=None)
    if stale:
        warnings.warn(
            f"numba_bfc: CUDA context(s) for device(s) {stale} already exist and keep their "
            "memory manager; call use_numba_bfc() before the first CUDA use, or cuda.close() "
            "after it", RuntimeWarning, stacklevel=2)
    return cls


def current_manager() -> NumbaBFCMemoryManager:
    """The numba_bfc memory manager of Numba's current CUDA context (created if needed).

    Raises
    ------
    RuntimeError
        The current context uses another memory manager.
    """
    ctx = cuda.current_context()
    mgr = ctx.memory_manager
    if not isinstance(mgr, NumbaBFCMemoryManager):
        raise RuntimeError(
            f"numba_bfc: the current CUDA context uses {type(mgr).__name__}, not "
            "NumbaBFCMemoryManager; call numba_bfc.use_numba_bfc() (or set "
            "NUMBA_CUDA_MEMORY_MANAGER=numba_bfc) before the first CUDA use")
    return mgr


def current_allocator() -> Any:
    """The allocator behind Numba's current CUDA context, with pending frees applied.

    Use it for ``get_stats()``, ``memory_map()``, ``render_occupancy()`` and
    ``regions()``. Raises ``RuntimeError`` if the context is not managed by
    numba_bfc.
    """
    return current_manager().allocator


def _block_of(array: Any) -> tuple[NumbaBFCMemoryManager, int]:
    """The manager and block start address behind a Numba or CuPy array."""
    memory = getattr(array, "gpu_data", array)  # a DeviceNDArray's MemoryPointer
    owner = getattr(memory, "owner", None)  # the allocation a view keeps alive
    if owner is not None and owner is not array and not hasattr(owner, "device_pointer_value"):
        return _block_of(owner)  # another library's array (cuda.as_cuda_array of CuPy's)
    if owner is not None:
        mgr = getattr(getattr(owner, "context", None), "memory_manager", None)
        if not isinstance(mgr, NumbaBFCMemoryManager):
            raise ValueError(
                "numba_bfc.record_stream: this array's memory does not come from a numba_bfc "
                f"pool (its context's manager is {type(mgr).__name__})")
        return mgr, int(owner.device_pointer_value or 0)
    mem = getattr(getattr(array, "data", None), "mem", None)  # a CuPy ndarray
    if mem is not None and hasattr(mem, "ptr"):
        return current_manager(), int(mem.ptr)
    if hasattr(array, "__cuda_array_interface__"):
        return current_manager(), int(array.__cuda_array_interface__["data"][0])
    raise TypeError(
        f"numba_bfc.record_stream: {type(array).__name__} is not a device array (pass a Numba "
        "device array, a MemoryPointer, a CuPy array or an object with "
        "__cuda_array_interface__ whose pointer starts a block)")


def record_stream(array: Any, stream: Any) -> bool:
    """Make the free of ``array``'s memory wait for the work queued on ``stream``
    (PyTorch's ``Tensor.record_stream``).

    With ``stream_safety="events"`` a block freed by Python returns to the
    pool only after an event on the legacy default stream, which orders the
    legacy stream, ``cuda.stream()`` streams and per-thread default streams.
    Work on a non-blocking stream (``CU_STREAM_NON_BLOCKING``: CuPy's
    ``Stream(non_blocking=True)``, PyTorch's streams, external streams made
    that way) is not ordered by it: call this once the work using ``array``
    is queued on such a stream, before dropping the array. Blocking streams
    need no call (it returns False). With ``stream_safety="off"`` every stream
    named here is waited for.

    Parameters
    ----------
    array : device array
        A Numba device array or ``MemoryPointer``, a CuPy array (a view of
        the block is enough for both), or an object with
        ``__cuda_array_interface__`` whose pointer starts a block.
    stream : stream
        A Numba or CuPy stream, an object with ``__cuda_stream__``, or a
        ``CUstream`` handle as an int.

    Returns
    -------
    bool
        True if an event on ``stream`` will be waited for.

    Raises
    ------
    TypeError
        ``array`` is not a device array, or ``stream`` not a stream.
    ValueError
        The memory is not a live block of a numba_bfc pool.
    """
    mgr, address = _block_of(array)
    return mgr.record_stream(address, stream)


def empty_cache() -> bool:
    """``current_manager().release_unused()``: wait for pending frees and give
    unused regions back to the driver (PyTorch's ``torch.cuda.empty_cache``)."""
    return current_manager().release_unused()
