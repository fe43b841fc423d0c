"""The CUDA backends' bookkeeping, on CPU, against a fake driver.

``FakeDriver`` implements the driver functions the backends call, with the
call forms of numba-cuda's ``driver`` wrapper (results returned, failures
raised as ``CudaAPIError``), over an imaginary device: it checks that memory
is mapped before access is set, unmapped before release, never double freed,
and that a context is current. The real driver is exercised by tests/gpu.
"""

import types

import pytest

# numba's deprecated built-in CUDA target or numba-cuda: either runs these tests.
cuda = pytest.importorskip("numba.cuda")
if not hasattr(cuda, "HostOnlyCUDAMemoryManager"):
    pytest.skip("the CUDA simulator has no EMM interface", allow_module_level=True)

from numba.cuda.cudadrv.driver import CudaAPIError  # noqa: E402
from sortedcontainers import SortedDict  # noqa: E402

import numba_bfc.backends.cuda as cuda_backends  # noqa: E402
from numba_bfc.backends.cuda import CudaSubAllocator, CudaVirtualSubAllocator  # noqa: E402
from numba_bfc.integrations.numba_emm import (  # noqa: E402
    CudaOutOfMemoryError,
    NumbaBFCMemoryManager,
)
from numba_bfc.testing.invariants import check_invariants  # noqa: E402

MiB = 1 << 20
OOM = "CUDA_ERROR_OUT_OF_MEMORY"
CTX = 0x7000


class Handle(int):
    """Driver handles and pointers: int() gives the value, as with cuda.bindings types."""


def _binding():
    ns = types.SimpleNamespace
    return ns(
        CUresult=ns(CUDA_ERROR_OUT_OF_MEMORY=OOM),
        CUdevice_attribute=ns(
            CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED="vmm"),
        CUmemAllocationType=ns(CU_MEM_ALLOCATION_TYPE_PINNED="pinned"),
        CUmemLocationType=ns(CU_MEM_LOCATION_TYPE_DEVICE="device"),
        CUmemAccess_flags=ns(CU_MEM_ACCESS_FLAGS_PROT_READWRITE="rw"),
        CUmemAllocationGranularity_flags=ns(CU_MEM_ALLOC_GRANULARITY_RECOMMENDED="rec"),
        CUmemAllocationProp=lambda: ns(type=None, location=ns(type=None, id=None)),
        CUmemAccessDesc=lambda: ns(location=ns(type=None, id=None), flags=None),
    )


class FakeDriver:
    """An imaginary device of ``total`` bytes behind numba-cuda's driver call forms."""

    def __init__(self, total=256 * MiB, granularity=2 * MiB, vmm=True):
        self.total, self.used, self.granularity, self.vmm = total, 0, granularity, vmm
        self.current, self.stack, self.calls = Handle(CTX), [], []
        self.allocs = {}  # cuMemAlloc: ptr -> size
        self.reserved = {}  # VA ranges: base -> size
        self.handles = {}  # physical: handle -> size
        self.mapped = SortedDict()  # addr -> (size, handle)
        self.accessible = set()
        self.events = set()
        self.next_addr, self.next_handle = 1 << 36, 1
        self.fail_next = None

    def _log(self, name):
        self.calls.append(name)
        if self.fail_next == name:
            self.fail_next = None
            raise CudaAPIError("CUDA_ERROR_UNKNOWN", f"injected failure in {name}")

    def _need_context(self):
        assert int(self.current) == CTX, "no current context"

    def _take(self, size):
        if self.used + size > self.total:
            raise CudaAPIError(OOM, "out of memory")
        self.used += size

    def cuCtxGetCurrent(self):
        return self.current

    def cuCtxPushCurrent(self, handle):
        self.stack.append(self.current)
        self.current = handle

    def cuCtxPopCurrent(self):
        old, self.current = self.current, self.stack.pop()
        return old

    def cuMemGetInfo(self):
        self._need_context()
        return self.total - self.used, self.total

    def cuDeviceGetAttribute(self, attr, dev):
        assert attr == "vmm" and dev == 0
        return int(self.vmm)

    def cuMemGetAllocationGranularity(self, prop, flag):
        assert prop.location.type == "device" and flag == "rec"
        return self.granularity

    def cuMemAlloc(self, size):
        self._log("cuMemAlloc")
        self._need_context()
        self._take(size)
        ptr = self.next_addr + 512  # 512-aligned, like the real driver
        self.next_addr += size + 4 * MiB
        self.allocs[ptr] = size
        return Handle(ptr)

    def cuMemFree(self, ptr):
        self._log("cuMemFree")
        self._need_context()
        self.used -= self.allocs.pop(int(ptr))

    def cuMemAddressReserve(self, size, alignment, hint, flags):
        self._log("cuMemAddressReserve")
        base = (self.next_addr + alignment - 1) // alignment * alignment
        self.next_addr = base + size + 4 * MiB
        self.reserved[base] = size
        return Handle(base)

    def cuMemAddressFree(self, base, size):
        self._log("cuMemAddressFree")
        assert self.reserved.pop(int(base)) == size
        assert not any(int(base) <= a < int(base) + size for a in self.mapped)

    def cuMemCreate(self, size, prop, flags):
        self._log("cuMemCreate")
        self._need_context()
        assert size % self.granularity == 0 and prop.type == "pinned"
        self._take(size)
        h = Handle(self.next_handle)
        self.next_handle += 1
        self.handles[h] = size
        return h

    def cuMemMap(self, addr, size, offset, handle, flags):
        self._log("cuMemMap")
        assert handle in self.handles and self.handles[handle] == size
        assert any(b <= addr and addr + size <= b + s for b, s in self.reserved.items())
        for a, (n, _h) in self.mapped.items():
            assert addr + size <= a or addr >= a + n, "mapping overlaps"
        self.mapped[addr] = (size, handle)

    def cuMemSetAccess(self, addr, size, descs, count):
        self._log("cuMemSetAccess")
        # One call may span several adjacent mappings, which must tile the range.
        pos = addr
        while pos < addr + size:
            self.accessible.add(pos)
            pos += self.mapped[pos][0]
        assert pos == addr + size and count == len(descs) == 1
        assert descs[0].flags == "rw"

    def cuMemUnmap(self, addr, size):
        self._log("cuMemUnmap")
        assert self.mapped.pop(addr)[0] == size
        self.accessible.discard(addr)

    def cuMemRelease(self, handle):
        self._log("cuMemRelease")
        assert not any(h == handle for _n, h in self.mapped.values()), "released while mapped"
        self.used -= self.handles.pop(handle)

    def cuCtxSynchronize(self):
        self._log("cuCtxSynchronize")

    # Events: the work of this imaginary device is always done.
    def cuEventCreate(self, flags):
        self._log("cuEventCreate")
        self._need_context()
        self.next_handle += 1
        self.events.add(self.next_handle)
        return Handle(self.next_handle)

    def cuEventRecord(self, event, stream):
        self._log("cuEventRecord")
        self._need_context()
        assert int(event) in self.events

    def cuEventQuery(self, event):
        self._log("cuEventQuery")
        assert int(event) in self.events

    def cuEventSynchronize(self, event):
        self._log("cuEventSynchronize")
        assert int(event) in self.events

    def cuEventDestroy(self, event):
        self._log("cuEventDestroy")
        self.events.remove(int(event))

    def cuStreamGetFlags(self, stream):
        return 0


class FakeContext:
    def __init__(self):
        self.handle = Handle(CTX)
        self.device = types.SimpleNamespace(
            id=0, get_device_identity=lambda: {"pci_bus_id": 7})


@pytest.fixture
def fake_driver(monkeypatch):
    drv = FakeDriver()
    drvmod = types.SimpleNamespace(driver=drv, CudaAPIError=CudaAPIError)
    monkeypatch.setattr(cuda_backends, "cuda_driver", lambda: (drvmod, _binding()))
    return drv


# ---------------------------------------------------------------------- plain
def test_plain_backend_allocates_frees_and_reports(fake_driver):
    b = CudaSubAllocator(context=FakeContext())
    assert b.total_memory() == 256 * MiB and b.memory_info() == (256 * MiB, 256 * MiB)
    assert (b.supports_coalescing, b.ipc_capable, b.host_accessible) == (False, True, False)
    p, n = b.alloc(3 * MiB)
    assert n == 3 * MiB and p in fake_driver.allocs
    assert p % 512 == 0 and fake_driver.calls == ["cuMemAlloc"]  # no padding needed
    q, _ = b.alloc(MiB, alignment=4096)  # the address falls short: freed, then padded
    assert fake_driver.calls[1:] == ["cuMemAlloc", "cuMemFree", "cuMemAlloc"]
    assert q % 4096 == 0 and fake_driver.allocs[max(a for a in fake_driver.allocs)] == MiB + 4096
    assert b.memory_info()[0] == 256 * MiB - 4 * MiB - 4096
    b.free(q, MiB)
    with pytest.raises(ValueError):
        b.free(p, MiB)  # wrong size
    assert b.regions() == [(p, 3 * MiB)]
    b.close()
    assert fake_driver.allocs == {} and fake_driver.used == 0
    assert b.driver_calls == 6


def test_plain_backend_out_of_memory_returns_none(fake_driver):
    b = CudaSubAllocator(context=FakeContext())
    assert b.alloc(512 * MiB) is None
    assert b.num_failed_allocs == 1
    fake_driver.fail_next = "cuMemAlloc"
    with pytest.raises(CudaAPIError, match="injected"):
        b.alloc(MiB)  # other driver errors propagate


def test_calls_made_without_a_current_context_push_it(fake_driver):
    b = CudaSubAllocator(context=FakeContext())
    p, n = b.alloc(MiB)
    fake_driver.current = Handle(0)  # e.g. Numba's device reset popped every context
    b.free(p, n)
    assert int(fake_driver.current) == 0 and fake_driver.stack == []


def test_a_context_holding_a_binding_device_works(fake_driver):
    # numba-cuda's Context(CUdevice, handle) for a primary context retained by
    # other code: its .device is the binding's CUdevice (int(), no .id).
    ctx = FakeContext()
    ctx.device = Handle(0)
    for cls in (CudaSubAllocator, CudaVirtualSubAllocator):
        b = cls(context=ctx)
        assert b.device_id == 0
        p, n = b.alloc(MiB)
        b.free(p, n)


# ---------------------------------------------------------------------- virtual
def test_virtual_backend_maps_adjacent_regions_and_unmaps_unions(fake_driver):
    b = CudaVirtualSubAllocator(context=FakeContext())
    assert b.supports_coalescing and b.supports_remap and not b.ipc_capable
    assert b.granularity == 2 * MiB and b.va_size == 512 * MiB  # twice the memory
    p1, n1 = b.alloc(MiB)
    p2, n2 = b.alloc(3 * MiB)
    p3, n3 = b.alloc(2 * MiB)
    assert (n1, n2, n3) == (2 * MiB, 4 * MiB, 2 * MiB)
    assert p1 == b.va_base and p2 == p1 + n1 and p3 == p2 + n2
    # One physical allocation per granule, so any granule can be unmapped alone.
    assert sorted(fake_driver.mapped) == [p1, p2, p2 + 2 * MiB, p3]
    assert set(fake_driver.handles.values()) == {2 * MiB}
    assert fake_driver.accessible == set(fake_driver.mapped)
    assert fake_driver.calls.count("cuMemSetAccess") == 3  # one per alloc, over its range
    b.free(p1, n1 + n2)  # a coalescing allocator frees merged regions at once
    assert b.regions() == [(p3, n3)]
    assert fake_driver.calls[-7:] == ["cuCtxSynchronize"] + ["cuMemUnmap", "cuMemRelease"] * 3
    # The hole at the bottom of the range is reused first.
    p4, n4 = b.alloc(6 * MiB)
    assert (p4, n4) == (b.va_base, 6 * MiB)
    assert b.regions() == [(p4, n4 + n3)]  # adjacent granules read as one range
    with pytest.raises(ValueError):
        b.free(p3, 2 * n3)
    b.close()
    assert fake_driver.mapped == {} and fake_driver.reserved == {} and fake_driver.used == 0
    b.close()  # idempotent


def test_virtual_backend_unmaps_single_granules_and_maps_at_an_address(fake_driver):
    b = CudaVirtualSubAllocator(context=FakeContext())
    p, n = b.alloc(8 * MiB)
    b.free(p + 2 * MiB, 4 * MiB)  # the middle of a region: a hole
    assert b.regions() == [(p, 2 * MiB), (p + 6 * MiB, 2 * MiB)]
    assert fake_driver.used == 4 * MiB and b.bytes_held == 4 * MiB
    assert b.alloc_at(p + 2 * MiB, 2 * MiB) == 2 * MiB
    assert b.regions() == [(p, 4 * MiB), (p + 6 * MiB, 2 * MiB)]
    assert p + 2 * MiB in fake_driver.accessible
    for bad in ((p + 3 * MiB, 2 * MiB), (p + 4 * MiB, 3 * MiB)):  # misaligned
        with pytest.raises(ValueError, match="granules"):
            b.alloc_at(*bad)
    with pytest.raises(ValueError, match="overlaps"):
        b.alloc_at(p + 2 * MiB, 4 * MiB)
    assert b.alloc_at(b.va_base + b.va_size, 2 * MiB) is None  # past the range
    with pytest.raises(ValueError, match="reserved range"):
        b.alloc_at(b.va_base - 2 * MiB, 2 * MiB)
    with pytest.raises(ValueError, match="not mapped"):
        b.free(p + 2 * MiB, 4 * MiB)  # half of it is the hole
    assert b.bytes_held == 6 * MiB == fake_driver.used
    fake_driver.total = 6 * MiB
    assert b.alloc_at(p + 4 * MiB, 2 * MiB) is None  # cuMemCreate out of memory
    assert b.regions() == [(p, 4 * MiB), (p + 6 * MiB, 2 * MiB)]
    b.close()
    assert fake_driver.mapped == {} and fake_driver.used == 0


def test_virtual_backend_limits_and_failures(fake_driver):
    b = CudaVirtualSubAllocator(context=FakeContext(), va_size=8 * MiB)
    assert b.alloc(10 * MiB) is None  # beyond the reserved range
    fake_driver.total = 4 * MiB
    assert b.alloc(6 * MiB) is None  # cuMemCreate out of memory
    fake_driver.fail_next = "cuMemSetAccess"
    with pytest.raises(CudaAPIError):
        b.alloc(2 * MiB)
    # The failed extension was rolled back: nothing mapped, nothing held.
    assert fake_driver.mapped == {} and fake_driver.handles == {} and fake_driver.used == 0
    b.close()


def test_virtual_backend_needs_vmm_support(fake_driver):
    fake_driver.vmm = False
    with pytest.raises(cuda_backends.CudaUnavailableError, match="virtual memory"):
        CudaVirtualSubAllocator(context=FakeContext())


# ---------------------------------------------------------------------- the plugin over them
@pytest.mark.parametrize("backend", ["plain", "virtual"])
def test_plugin_over_cuda_backends(fake_driver, backend):
    mgr = NumbaBFCMemoryManager(context=FakeContext(), backend=backend)
    mgr.initialize()
    assert mgr.get_memory_info() == (256 * MiB, 256 * MiB)
    blocks = [mgr.memalloc(n) for n in (100, 5 * MiB, 70 * MiB, 3000)]
    info = mgr.get_memory_info()
    assert info.free == 256 * MiB - mgr.allocator.get_stats().bytes_in_use
    del blocks[1]
    with pytest.raises(CudaOutOfMemoryError):
        mgr.memalloc(300 * MiB)
    check_invariants(mgr.allocator)
    mgr.reset()
    # Everything went back to the driver, the virtual range included, and the
    # events that fenced the freed blocks were destroyed.
    assert fake_driver.used == 0 and fake_driver.allocs == {} and fake_driver.reserved == {}
    assert fake_driver.calls.count("cuEventRecord") >= 1 and fake_driver.events == set()
    again = mgr.memalloc(MiB)  # a new backend after the reset
    assert mgr.backend is not None and int(again.device_pointer_value) != 0
    mgr.reset()
    assert fake_driver.used == 0


def test_plugin_grows_to_the_device_limit_then_recovers(fake_driver):
    mgr = NumbaBFCMemoryManager(context=FakeContext(), backend="plain")
    held = []
    with pytest.raises(CudaOutOfMemoryError) as info:
        while True:
            held.append(mgr.memalloc(16 * MiB))
    assert info.value.reason in ("backend", "fragmentation", "exhausted")
    assert len(held) >= 15  # 256 MiB device, regions backed off to fit
    del held[::2]
    held += [mgr.memalloc(16 * MiB) for _ in range(len(held))]
    check_invariants(mgr.allocator)


def test_compact_remaps_granules_of_the_virtual_backend(fake_driver):
    """The compact policy at a tight limit on the real VMM backend code: granules are
    unmapped from the middle of the range and mapped again where growth wants them,
    and the driver's mappings always equal the allocator's record of pieces."""
    import random

    from numba_bfc import CompactAllocator, OutOfMemoryError

    b = CudaVirtualSubAllocator(context=FakeContext())
    a = CompactAllocator(b, memory_limit=48 * MiB)
    rng = random.Random(3)
    live, ooms = [], 0
    for step in range(1500):
        if live and (rng.random() < 0.5 or len(live) > 40):
            a.deallocate_raw(live.pop(rng.randrange(len(live))))
        else:
            try:
                live.append(a.allocate_raw(rng.randint(1, 5 * MiB)))
            except OutOfMemoryError:
                ooms += 1
        if step % 100 == 0:
            check_invariants(a)
            pieces = sorted((p, n) for p, (n, _) in a._pieces.items())
            mapped = sorted((p, n) for p, (n, _) in fake_driver.mapped.items())
            assert _merge(pieces) == _merge(mapped) == b.regions()
            assert fake_driver.used == b.bytes_held == a.get_stats().bytes_reserved
    assert a._punched and ooms > 0
    assert fake_driver.accessible == set(fake_driver.mapped)
    for p in live:
        a.deallocate_raw(p)
    a.empty_cache()
    assert fake_driver.mapped == {} and fake_driver.used == 0
    b.close()


def test_compact_grows_past_the_top_of_the_range_not_into_holes(fake_driver):
    """The driver's lowest-gap placement would put top growth into a hole: compact maps
    it where it wants it (alloc_at), as on the simulated backend."""
    from numba_bfc import CompactAllocator
    from numba_bfc.backends import VirtualSubAllocator

    results = []
    for b in (VirtualSubAllocator(contiguous=True, granularity=2 * MiB),
              CudaVirtualSubAllocator(context=FakeContext())):
        a = CompactAllocator(b, memory_limit=10 * MiB, page_size=2 * MiB, release_threshold=0)
        base = a.allocate_raw(2 * MiB)
        hole = a.allocate_raw(4 * MiB)
        a.allocate_raw(MiB)
        a.deallocate_raw(hole)
        assert a.empty_cache() == 4 * MiB
        p = a.allocate_raw(5 * MiB // 2)
        results.append((p - base, [(r - base, n) for r, n in a.regions()],
                        a.get_stats().bytes_reserved, b.num_frees))
        check_invariants(a)
    assert results[0] == results[1]
    assert results[0][1] == [(0, 2 * MiB), (6 * MiB, 4 * MiB)]


def _merge(ranges):
    out = []
    for p, n in ranges:
        if out and out[-1][0] + out[-1][1] == p:
            out[-1] = (out[-1][0], out[-1][1] + n)
        else:
            out.append((p, n))
    return out
