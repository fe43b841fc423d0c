"""Real GPU backends: device memory regions through Numba's CUDA driver bindings.

``CudaSubAllocator`` gives each region its own ``cuMemAlloc``;
``CudaVirtualSubAllocator`` reserves one large virtual address range and maps
physical memory into it on each extension, so regions are adjacent and a
coalescing allocator (BFC) can merge them, as TensorFlow's
``GpuVirtualMemAllocator`` and PyTorch's expandable segments do.

Importing this module needs neither a GPU nor numba-cuda: both are looked for
when a backend is constructed, and their absence raises
``CudaUnavailableError`` saying what is missing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from sortedcontainers import SortedDict

from .base import SubAllocator

__all__ = [
    "CudaUnavailableError",
    "CudaSubAllocator",
    "CudaVirtualSubAllocator",
    "context_pushed",
    "cuda_available",
    "cuda_driver",
]

# cuMemAlloc returns addresses aligned to at least 256 bytes (CUDA C Programming
# Guide, "Device Memory Accesses"); regions must be multiples of it.
_DRIVER_ALIGNMENT = 256


class CudaUnavailableError(RuntimeError):
    """No usable CUDA: no numba-cuda, the CUDA simulator, no driver or no GPU."""


def _align_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def cuda_driver() -> tuple[Any, Any]:
    """Numba's driver module and ``cuda.bindings.driver``, or ``CudaUnavailableError``.

    Returns
    -------
    (module, module)
        ``numba.cuda.cudadrv.driver`` (whose ``driver`` singleton wraps every
        driver function and raises ``CudaAPIError``) and the NVIDIA binding.
    """
    try:
        from numba import cuda
    except ImportError as e:  # a numba without its built-in target, and no numba-cuda
        raise CudaUnavailableError(f"numba.cuda cannot be imported: {e}") from e
    if not hasattr(cuda, "HostOnlyCUDAMemoryManager"):
        raise CudaUnavailableError(
            "NUMBA_ENABLE_CUDASIM=1 is set: the CUDA simulator has no device memory, so the "
            "numba_bfc CUDA backends cannot be used; unset it to run on a GPU")
    if getattr(cuda, "implementation", None) != "NVIDIA":
        # numba's own built-in CUDA target (deprecated) talks to the driver through
        # ctypes prototypes that lack the virtual memory management API.
        raise CudaUnavailableError(
            "the numba_bfc CUDA backends need the numba-cuda package "
            "(pip install 'numba-cuda[cu12]' or 'numba-cuda[cu13]', matching the driver); "
            "numba.cuda here is numba's deprecated built-in CUDA target")
    from numba.cuda.cudadrv import driver as drvmod

    drv = drvmod.driver
    try:
        available = drv.is_available
    except Exception as e:  # CudaSupportError from cuInit (e.g. no device)
        raise CudaUnavailableError(f"the CUDA driver cannot be initialised: {e}") from e
    if not available:
        reason = " ".join(str(drv.initialization_error).split())
        raise CudaUnavailableError(f"no usable CUDA driver or GPU: {reason}")
    return drvmod, drvmod.binding


def cuda_available() -> bool:
    """True when the CUDA backends can be constructed: numba-cuda, a driver and a GPU.

    Initialises the CUDA driver (``cuInit``) when numba-cuda is installed.
    """
    try:
        cuda_driver()
    except CudaUnavailableError:
        return False
    return True


@contextlib.contextmanager
def context_pushed(driver: Any, handle: Any) -> Iterator[None]:
    """Make the context ``handle`` current for the block (pushed, then popped,
    unless it is current already), through Numba's ``driver`` object."""
    if int(driver.cuCtxGetCurrent()) == int(handle):
        yield
        return
    driver.cuCtxPushCurrent(handle)
    try:
        yield
    finally:
        driver.cuCtxPopCurrent()


def _resolve_context(drvmod: Any, device: int | None, context: Any) -> Any:
    """The Numba ``Context`` regions are allocated in."""
    if context is not None:
        return context
    if device is None:
        from numba import cuda

        return cuda.current_context()
    # get_primary_context() retains the context without pushing it, so repeated
    # construction does not grow this thread's context stack.
    return drvmod.driver.get_device(int(device)).get_primary_context()


def _device_ordinal(ctx: Any) -> int:
    """The device ordinal of a Numba ``Context``.

    ``ctx.device`` is normally Numba's ``Device``, but a context built around
    a primary context that other code retained (``Context(CUdevice, handle)``,
    as numba-cuda's own tests do) holds the binding's ``CUdevice``, which has
    no ``id`` and converts with ``int()``.
    """
    device = ctx.device
    ordinal = getattr(device, "id", None)
    return int(device if ordinal is None else ordinal)


class _CudaBackend(SubAllocator):
    """What both CUDA backends share: the context, memory info and OOM detection."""

    host_accessible = False
    device_memory = True
    #: True when ``cuIpcGetMemHandle`` works on a region base (plain cuMemAlloc memory).
    ipc_capable = False

    def __init__(self, device: int | None = None, context: Any = None) -> None:
        super().__init__()
        drvmod, binding = cuda_driver()
        self._drvmod = drvmod
        self._binding = binding
        # Calls go through the singleton's attributes at call time (never cached
        # here) so that tools wrapping them, e.g. driver-call counters, see them.
        self._drv = drvmod.driver
        self._oom = binding.CUresult.CUDA_ERROR_OUT_OF_MEMORY
        ctx = _resolve_context(drvmod, device, context)
        self.device_id = _device_ordinal(ctx)
        self._ctx_handle = ctx.handle
        self.driver_calls = 0
        _free, total = self.memory_info()
        self.capacity = int(total)

    def _current(self) -> contextlib.AbstractContextManager:
        # Regions may be released with no context current: Numba's device reset
        # pops every context before calling the memory manager's reset().
        return context_pushed(self._drv, self._ctx_handle)

    def _call(self, name: str, *args: Any) -> Any:
        self.driver_calls += 1
        return getattr(self._drv, name)(*args)

    def _is_oom(self, err: Exception) -> bool:
        return getattr(err, "code", None) == self._oom

    def memory_info(self) -> tuple[int, int]:
        """``(free, total)`` bytes of the device, from ``cuMemGetInfo``."""
        with self._current():
            free, total = self._drv.cuMemGetInfo()
        return int(free), int(total)

    def total_memory(self) -> int:
        """The device's total memory in bytes."""
        return self.capacity


class CudaSubAllocator(_CudaBackend):
    """Device memory regions, one ``cuMemAlloc`` each.

    Parameters
    ----------
    device : int, optional
        Device ordinal; default: the device of Numba's current context
        (created if needed).
    context : numba.cuda.cudadrv.driver.Context, optional
        The Numba context to allocate in (overrides ``device``).

    Raises
    ------
    CudaUnavailableError
        numba-cuda is not installed, the CUDA simulator is on, or there is no
        driver or GPU.

    Notes
    -----
    Regions are separate driver allocations, so they never coalesce
    (``supports_coalescing`` is False), and ``cuIpcGetMemHandle`` works on
    their bases, so pooled sub-allocations can be shared between processes as
    base plus offset. Out of memory in the driver makes ``alloc`` return None.
    """

    supports_coalescing = False
    ipc_capable = True

    def __init__(self, device: int | None = None, context: Any = None) -> None:
        super().__init__(device, context)
        # aligned address -> (driver address, usable bytes)
        self._raw: dict[int, tuple[int, int]] = {}

    def _driver_alloc(self, nbytes: int) -> int | None:
        try:
            with self._current():
                return int(self._call("cuMemAlloc", nbytes))
        except self._drvmod.CudaAPIError as e:
            if self._is_oom(e):
                return None
            raise

    def _alloc(self, nbytes: int, alignment: int) -> tuple[int, int] | None:
        raw = self._driver_alloc(nbytes)
        if raw is not None and raw % alignment:
            # Only 256 bytes are guaranteed. Pad just when an address falls
            # short: padding every region would cost a whole page, since the
            # driver rounds large allocations up to 2 MiB.
            with self._current():
                self._call("cuMemFree", raw)
            raw = self._driver_alloc(nbytes + alignment)
        if raw is None:
            return None
        ptr = _align_up(raw, alignment)
        self._raw[ptr] = (raw, nbytes)
        return ptr, nbytes

    def _free(self, ptr: int, nbytes: int) -> None:
        entry = self._raw.get(ptr)
        if entry is None or entry[1] != nbytes:
            raise ValueError(f"free({ptr:#x}, {nbytes}): not a region of this backend")
        with self._current():
            self._call("cuMemFree", entry[0])
        del self._raw[ptr]

    def regions(self) -> list[tuple[int, int]]:
        """``[(ptr, size), ...]`` of the live regions, in address order."""
        return sorted((p, n) for p, (_raw, n) in self._raw.items())

    def close(self) -> None:
        """Free every region still held (the allocator using them must be discarded)."""
        for ptr, size in self.regions():
            self.free(ptr, size)


class CudaVirtualSubAllocator(_CudaBackend):
    """Regions mapped into one reserved virtual address range, so they coalesce.

    ``cuMemAddressReserve`` reserves ``va_size`` bytes of address space once;
    each ``alloc`` creates physical memory (``cuMemCreate``, one allocation
    per granule), maps it at the lowest free place in the range (``cuMemMap``)
    and makes it accessible (``cuMemSetAccess``). Regions allocated one after
    another are adjacent, so ``supports_coalescing`` is True and BFC merges
    them into one: a large request can use the tail of one region and the
    head of the next, which separate ``cuMemAlloc`` regions never allow.
    Because every granule is its own physical allocation, ``supports_remap``
    is True: ``free`` can unmap single granules from the middle of a region
    and ``alloc_at`` maps new ones at a chosen free address (the compact
    policy's defragmenting retry).

    Parameters
    ----------
    device : int, optional
        Device ordinal; default: the device of Numba's current context.
    context : numba.cuda.cudadrv.driver.Context, optional
        The Numba context to allocate in (overrides ``device``).
    va_size : int, optional
        Bytes of address space to reserve; default: twice the device's total
        memory, rounded up to the granularity (the pool never holds more than
        the memory; the rest is room for pages remapped past holes).
    granularity : int, optional
        Region size multiple; default: the driver's recommended granularity
        (``cuMemGetAllocationGranularity``, typically 2 MiB).

    Raises
    ------
    CudaUnavailableError
        As ``CudaSubAllocator``, or the device lacks virtual memory management.

    Notes
    -----
    The memory cannot be exported with ``cuIpcGetMemHandle`` (``ipc_capable``
    is False). Regions are released by unmapping after a context synchronize:
    unlike ``cuMemFree``, ``cuMemUnmap`` does not wait for work still using the
    memory (PyTorch's expandable segments synchronize for the same reason).
    Call ``close()`` to give the address range back.
    """

    supports_coalescing = True
    supports_remap = True
    ipc_capable = False

    def __init__(self, device: int | None = None, context: Any = None,
                 va_size: int | None = None, granularity: int | None = None) -> None:
        super().__init__(device, context)
        b = self._binding
        supported = self._drv.cuDeviceGetAttribute(
            b.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
            self.device_id)
        if not supported:
            raise CudaUnavailableError(
                f"device {self.device_id} does not support CUDA virtual memory management "
                "(cuMemCreate/cuMemMap); use the plain CudaSubAllocator")
        prop = b.CUmemAllocationProp()
        prop.type = b.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = b.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = self.device_id
        self._prop = prop
        access = b.CUmemAccessDesc()
        access.location.type = b.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        access.location.id = self.device_id
        access.flags = b.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        self._access = access
        if granularity is None:
            granularity = int(self._drv.cuMemGetAllocationGranularity(
                prop,
                b.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        if granularity <= 0 or granularity % _DRIVER_ALIGNMENT:
            raise ValueError(f"granularity must be a positive multiple of 256, got {granularity}")
        self.granularity = int(granularity)
        if va_size is None:
            va_size = 2 * self.capacity
        self.va_size = _align_up(int(va_size), self.granularity)
        with self._current():
            self.va_base = int(self._call("cuMemAddressReserve", self.va_size,
                                          self.granularity, 0, 0))
        # start -> (size, physical allocation handle) of every mapped piece
        self._pieces: SortedDict = SortedDict()
        self._closed = False

    def address_space(self) -> tuple[int, int | None]:
        """The reserved range: ``(va_base, va_size)``."""
        return self.va_base, self.va_size

    def _find_gap(self, size: int, alignment: int) -> int | None:
        # Lowest-address fit: regions freed in the middle (BFC's free-region
        # collection) leave holes that are reused before the range grows.
        pos = self.va_base
        for start, (length, _h) in self._pieces.items():
            cand = _align_up(pos, alignment)
            if cand + size <= start:
                return cand
            pos = start + length
        cand = _align_up(pos, alignment)
        return cand if cand + size <= self.va_base + self.va_size else None

    def _alloc(self, nbytes: int, alignment: int) -> tuple[int, int] | None:
        if self._closed:
            raise RuntimeError("CudaVirtualSubAllocator is closed")
        size = _align_up(nbytes, self.granularity)
        addr = self._find_gap(size, max(alignment, self.granularity))
        if addr is None or not self._map(addr, size):
            return None
        return addr, size

    def _alloc_at(self, ptr: int, nbytes: int) -> bool:
        if self._closed:
            raise RuntimeError("CudaVirtualSubAllocator is closed")
        g = self.granularity
        if ptr % g or nbytes % g or ptr < self.va_base:
            raise ValueError(f"alloc_at({ptr:#x}, {nbytes}): below the reserved range or "
                             f"not whole granules of {g} bytes")
        if ptr + nbytes > self.va_base + self.va_size:
            return False  # past the end of the reserved range
        i = self._pieces.bisect_left(ptr + nbytes) - 1
        if i >= 0 and self._pieces.peekitem(i)[0] + g > ptr:  # granules: one per piece
            raise ValueError(f"alloc_at({ptr:#x}, {nbytes}): overlaps mapped memory")
        return self._map(ptr, nbytes)

    def _map(self, addr: int, size: int) -> bool:
        """Back ``[addr, addr+size)`` with one physical allocation per granule,
        so that any granule can later be unmapped alone (``supports_remap``);
        False, with nothing mapped, when the device is out of memory."""
        CudaAPIError = self._drvmod.CudaAPIError
        g = self.granularity
        mapped: list[tuple[int, Any]] = []
        with self._current():
            try:
                for start in range(addr, addr + size, g):
                    handle = self._call("cuMemCreate", g, self._prop, 0)
                    try:
                        self._call("cuMemMap", start, g, 0, handle, 0)
                    except BaseException:
                        self._call("cuMemRelease", handle)
                        raise
                    mapped.append((start, handle))
                self._call("cuMemSetAccess", addr, size, [self._access], 1)
            except BaseException as e:
                for start, handle in mapped:
                    self._call("cuMemUnmap", start, g)
                    self._call("cuMemRelease", handle)
                if isinstance(e, CudaAPIError) and self._is_oom(e):
                    return False
                raise
        for start, handle in mapped:
            self._pieces[start] = (g, handle)
        return True

    def _free(self, ptr: int, nbytes: int) -> None:
        # Any run of mapped granules: a coalescing allocator frees merged
        # regions, and a remapping one single pages out of a region.
        g = self.granularity
        if ptr % g or nbytes % g:
            raise ValueError(f"free({ptr:#x}, {nbytes}): not whole granules of {g} bytes")
        run = list(range(ptr, ptr + nbytes, g))
        missing = next((pos for pos in run if pos not in self._pieces), None)
        if missing is not None:
            raise ValueError(f"free({ptr:#x}, {nbytes}): {missing:#x} is not mapped")
        with self._current():
            self._call("cuCtxSynchronize")
            for start in run:
                _size, handle = self._pieces.pop(start)
                self._call("cuMemUnmap", start, g)
                self._call("cuMemRelease", handle)

    def regions(self) -> list[tuple[int, int]]:
        """``[(ptr, size), ...]`` of the mapped ranges (adjacent granules
        merged), in address order."""
        out: list[tuple[int, int]] = []
        for start, (size, _h) in self._pieces.items():
            if out and out[-1][0] + out[-1][1] == start:
                out[-1] = (out[-1][0], out[-1][1] + size)
            else:
                out.append((start, size))
        return out

    def close(self) -> None:
        """Unmap every piece still mapped and give the address range back."""
        if self._closed:
            return
        for ptr, size in self.regions():
            self.free(ptr, size)
        with self._current():
            self._call("cuMemAddressFree", self.va_base, self.va_size)
        self._closed = True
