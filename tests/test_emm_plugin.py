"""The Numba EMM plugin's interface, selection and configuration, on CPU.

The plugin runs over the simulated backend (``VirtualSubAllocator``) with a
fake context object: Numba's ``MemoryPointer``, ``DeviceNDArray`` and the
plugin-selection machinery work without a GPU; only driver calls do not.
"""

import gc
import inspect
import pickle
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

# numba's deprecated built-in CUDA target or numba-cuda: either runs these tests.
cuda = pytest.importorskip("numba.cuda")
if not hasattr(cuda, "HostOnlyCUDAMemoryManager"):
    pytest.skip("the CUDA simulator has no EMM interface", allow_module_level=True)

from _support import FakeContext, FakeDevice, addr, fake_cupy, make_manager  # noqa: E402
from numba.cuda.cudadrv import driver as drv  # noqa: E402

from numba_bfc.backends import VirtualSubAllocator  # noqa: E402
from numba_bfc.backends.cuda import (  # noqa: E402
    CudaSubAllocator,
    CudaUnavailableError,
    CudaVirtualSubAllocator,
)
from numba_bfc.errors import OutOfMemoryError  # noqa: E402
from numba_bfc.integrations import numba_emm  # noqa: E402
from numba_bfc.integrations.numba_emm import (  # noqa: E402
    BFCIpcHandle,
    CudaOutOfMemoryError,
    NumbaBFCMemoryManager,
    current_allocator,
    use_numba_bfc,
)

MiB = 1 << 20


@pytest.fixture
def fresh_numba_manager(monkeypatch):
    """Numba's module-global manager choice, restored after the test."""
    monkeypatch.setattr(drv, "_memory_manager", None)
    return drv


# ---------------------------------------------------------------------- the interface
def test_interface_is_complete_and_bases_are_in_numba_order():
    assert not inspect.isabstract(NumbaBFCMemoryManager)
    assert issubclass(NumbaBFCMemoryManager, cuda.BaseCUDAMemoryManager)
    mro = NumbaBFCMemoryManager.__mro__
    # The mixin must precede the host-only base, or get_ipc_handle stays abstract.
    assert mro.index(cuda.GetIpcHandleMixin) < mro.index(cuda.HostOnlyCUDAMemoryManager)
    for name in ("memalloc", "initialize", "get_ipc_handle", "get_memory_info", "reset",
                 "defer_cleanup"):
        assert name in NumbaBFCMemoryManager.__dict__, name
    assert isinstance(NumbaBFCMemoryManager.__dict__["interface_version"], property)
    mgr = NumbaBFCMemoryManager(context=None)
    assert mgr.interface_version == 1
    # set_memory_manager's throw-away instance touches nothing.
    assert mgr.backend is None and mgr.context is None
    mgr.initialize()
    with pytest.raises(RuntimeError, match="no CUDA context"):
        mgr.memalloc(16)


def test_set_memory_manager_accepts_the_plugin(fresh_numba_manager):
    cuda.set_memory_manager(NumbaBFCMemoryManager)
    assert drv._memory_manager is NumbaBFCMemoryManager
    assert numba_emm._numba_memory_manager is NumbaBFCMemoryManager


def test_use_numba_bfc_installs_a_configured_class(fresh_numba_manager):
    cls = use_numba_bfc(policy="bfc", memory_limit=8 * MiB, allow_growth=False)
    assert drv._memory_manager is cls
    assert issubclass(cls, NumbaBFCMemoryManager)
    mgr = cls(context=FakeContext(), backend=VirtualSubAllocator(capacity=16 * MiB))
    assert mgr.allocator.memory_limit == 8 * MiB
    assert mgr.allocator.allow_growth is False
    # Without options the plain class itself is installed (what the env var gives).
    assert use_numba_bfc() is NumbaBFCMemoryManager


def test_use_numba_bfc_rejects_bad_options_and_keeps_the_old_manager(fresh_numba_manager):
    with pytest.raises(TypeError, match="memory_limt"):
        use_numba_bfc(memory_limt=1 << 20)
    with pytest.raises(ValueError, match="policy"):
        use_numba_bfc(policy="tensorflow")
    with pytest.raises(ValueError, match="backend"):
        use_numba_bfc(backend="gpu")
    assert drv._memory_manager is None


def test_use_numba_bfc_warns_when_a_context_already_exists(fresh_numba_manager, monkeypatch):
    dev = types.SimpleNamespace(id=0, primary_context=FakeContext(memory_manager=object()))
    monkeypatch.setattr(drv.driver, "devices", {0: dev})
    with pytest.warns(RuntimeWarning, match=r"device\(s\) \[0\]"):
        use_numba_bfc()


def test_env_var_path_selects_the_plugin(fresh_numba_manager, monkeypatch):
    monkeypatch.setattr(drv.config, "CUDA_MEMORY_MANAGER", "numba_bfc.integrations.numba_emm")
    drv._ensure_memory_manager()
    assert drv._memory_manager is NumbaBFCMemoryManager


def test_env_var_path_with_the_package_name(fresh_numba_manager, monkeypatch):
    import numba_bfc

    if "_numba_memory_manager" not in dir(numba_bfc):
        pytest.skip("numba_bfc/__init__.py does not re-export _numba_memory_manager yet")
    monkeypatch.setattr(drv.config, "CUDA_MEMORY_MANAGER", "numba_bfc")
    drv._ensure_memory_manager()
    assert drv._memory_manager is NumbaBFCMemoryManager


def test_numba_bfc_conf_picks_policy_and_backend(monkeypatch):
    monkeypatch.setenv("NUMBA_BFC_CONF", "policy:bfc,backend:virtual,allow_growth:false")
    mgr = NumbaBFCMemoryManager(context=None)
    assert (mgr.policy, mgr._backend_spec) == ("bfc", "virtual")
    # The allocator reads its own keys from the same variable.
    mgr = NumbaBFCMemoryManager(context=FakeContext(),
                                backend=VirtualSubAllocator(capacity=8 * MiB))
    assert mgr.allocator.allow_growth is False
    # Constructor arguments beat the environment.
    monkeypatch.setenv("NUMBA_BFC_CONF", "policy:caching,backend:virtual")
    mgr = NumbaBFCMemoryManager(context=None, policy="bfc", backend="plain")
    assert (mgr.policy, mgr._backend_spec) == ("bfc", "plain")


def test_bad_numba_bfc_conf_fails_loudly(fresh_numba_manager, monkeypatch):
    monkeypatch.setenv("NUMBA_BFC_CONF", "policy:tensorflow")
    with pytest.raises(ValueError, match="policy"):
        NumbaBFCMemoryManager(context=None)
    monkeypatch.setattr(drv.config, "CUDA_MEMORY_MANAGER", "numba_bfc.integrations.numba_emm")
    with pytest.raises(RuntimeError, match="Failed to use memory manager"):
        drv._ensure_memory_manager()
    assert drv._memory_manager is None


# ---------------------------------------------------------------------- memalloc
def test_memalloc_returns_a_plain_memory_pointer():
    mgr = make_manager()
    mp = mgr.memalloc(1000)
    # Not an AutoFreePointer: its refcount starts at 0, so dropping one view
    # would free the block while the parent is still alive.
    assert type(mp) is drv.MemoryPointer
    assert mp.size == 1000 and mp.refct == 1
    a = addr(mp)
    assert a % 256 == 0
    assert mgr.allocator.allocated_size(a) == 1024
    (base, size), = mgr.backend.mapped_ranges()
    assert base <= a and a + 1000 <= base + size


def test_derived_pointer_refcounts_as_numba_expects():
    # numba-cuda's tests/cudadrv/test_cuda_memory.py::test_derived_pointer.
    mgr = make_manager()
    m = mgr.memalloc(1024)
    for offset in (0, 1):
        v1 = m.view(offset)
        assert addr(v1.owner) == addr(m)
        assert m.refct == 2
        assert addr(v1) - offset == addr(v1.owner)
        v2 = v1.view(offset)
        assert addr(v2.owner) == addr(m)
        assert addr(v2) - 2 * offset == addr(m)
        assert m.refct == 3
        del v2
        assert m.refct == 2
        del v1
        assert m.refct == 1
    assert mgr.pending_frees == 0


def test_zero_byte_allocation_is_null_and_owns_nothing():
    mgr = make_manager()
    mp = mgr.memalloc(0)
    assert addr(mp) == 0 and mp.size == 0
    del mp
    assert mgr.pending_frees == 0


def test_device_ndarray_over_the_pool():
    from numba.cuda.cudadrv.devicearray import DeviceNDArray

    mgr = make_manager()
    mp = mgr.memalloc(800)
    arr = DeviceNDArray(shape=(100,), strides=(8,), dtype=np.float64, gpu_data=mp)
    part = arr._do_getitem(slice(10, 20))
    assert part.device_ctypes_pointer.value == addr(mp) + 80
    del arr, mp
    assert mgr.pending_frees == 0  # the slice keeps the block
    del part
    assert mgr.pending_frees == 1
    assert mgr.allocator.get_stats().bytes_in_use == 0


# ---------------------------------------------------------------------- memory info
def test_get_memory_info_counts_pool_and_device_free():
    mgr = make_manager(capacity=64 * MiB)
    assert mgr.get_memory_info() == (64 * MiB, 64 * MiB)
    mp = mgr.memalloc(MiB)
    info = mgr.get_memory_info()
    assert info.total == 64 * MiB
    assert info.free == 63 * MiB  # a 2 MiB region: 1 MiB used, 1 MiB free in the pool
    del mp
    assert mgr.get_memory_info().free == 64 * MiB  # the pending free is applied first


def test_get_memory_info_respects_the_memory_limit():
    mgr = make_manager(capacity=64 * MiB, memory_limit=16 * MiB)
    assert mgr.get_memory_info() == (16 * MiB, 64 * MiB)
    keep = mgr.memalloc(4 * MiB)
    assert mgr.get_memory_info().free == 12 * MiB
    del keep


# ---------------------------------------------------------------------- IPC
class IpcCapableBackend(VirtualSubAllocator):
    ipc_capable = True  # like CudaSubAllocator: separate cuMemAlloc-style regions


def test_ipc_handle_is_region_base_plus_offset(monkeypatch):
    backend = IpcCapableBackend(capacity=64 * MiB)
    mgr = NumbaBFCMemoryManager(context=FakeContext(), backend=backend, memory_limit=64 * MiB)
    first = mgr.memalloc(4096)
    second = mgr.memalloc(4096)  # a pooled sub-allocation inside the same region
    (region, _size), = backend.mapped_ranges()
    seen = []

    def fake_handle(base):
        seen.append(base)
        return numba_emm._ipc_handle_from_bytes(bytes(range(64)))

    monkeypatch.setattr(numba_emm, "_allocation_base", lambda memory: region)
    monkeypatch.setattr(numba_emm, "_ipc_mem_handle", fake_handle)
    h = mgr.get_ipc_handle(second)
    assert seen == [region]
    assert isinstance(h, BFCIpcHandle)
    assert h.offset == addr(second) - region > 0
    assert h.size == 4096 and h.base is second
    assert h.source_info == FakeDevice().get_device_identity()
    # Pickles even where cuda-bindings >= 13.4 removed CUipcMemHandle.reserved.
    h2 = pickle.loads(pickle.dumps(h))
    assert type(h2) is BFCIpcHandle and h2.base is None
    assert (h2.size, h2.offset, h2.source_info) == (h.size, h.offset, h.source_info)
    assert numba_emm._ipc_handle_bytes(h2.handle) == bytes(range(64))
    del first


def test_ipc_is_refused_for_backends_that_cannot_export():
    mgr = make_manager(contiguous=True)
    mp = mgr.memalloc(4096)
    with pytest.raises(NotImplementedError, match="plain"):
        mgr.get_ipc_handle(mp)


# ---------------------------------------------------------------------- OOM error type
def test_out_of_memory_is_both_numba_and_numba_bfc_error():
    mgr = make_manager(capacity=8 * MiB)
    with pytest.raises(CudaOutOfMemoryError) as info:
        mgr.memalloc(9 * MiB)
    err = info.value
    assert isinstance(err, drv.CudaAPIError) and isinstance(err, OutOfMemoryError)
    assert err.code == numba_emm._CUDA_OOM
    assert err.num_bytes == 9 * MiB and err.reason == "limit"
    assert "CUDA_ERROR_OUT_OF_MEMORY" in str(err)


# ---------------------------------------------------------------------- helpers, interop
def test_current_allocator_follows_numba_current_context(monkeypatch):
    mgr = make_manager()
    ctx = mgr.context
    ctx.memory_manager = mgr
    monkeypatch.setattr(cuda, "current_context", lambda devnum=None: ctx)
    mp = mgr.memalloc(4096)
    del mp
    alloc = current_allocator()
    assert alloc is mgr.allocator
    assert alloc.get_stats().bytes_in_use == 0  # pending frees applied
    ctx.memory_manager = object()
    with pytest.raises(RuntimeError, match="use_numba_bfc"):
        current_allocator()


def _cupy_sees(monkeypatch, primary, current=None):
    """CuPy on device 0, whose primary context is ``primary``; Numba's current
    context is ``current`` (``primary`` if None). Counts current_context() calls."""
    calls = []

    def current_context(devnum=None):
        calls.append(devnum)
        return primary if current is None else current

    monkeypatch.setattr(cuda, "current_context", current_context)
    monkeypatch.setattr(cuda, "gpus", [types.SimpleNamespace(get_primary_context=lambda: primary)])
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy())
    return calls


@pytest.fixture
def fresh_cupy_checks(monkeypatch):
    """No manager checked for CuPy yet: this module's fake contexts come and go
    without the reset that Numba's ``cuda.close()`` gives a real one."""
    from numba_bfc.integrations import cupy as cupy_integration

    monkeypatch.setattr(cupy_integration, "_checked_managers", {})


def test_cupy_allocator_draws_from_the_numba_pool(monkeypatch, fresh_cupy_checks):
    from numba_bfc.integrations.cupy import cupy_allocator

    mgr = make_manager()
    ctx = mgr.context
    ctx.memory_manager = mgr
    _cupy_sees(monkeypatch, ctx)
    numba_block = mgr.memalloc(4096)
    cp_ptr = cupy_allocator(10000)
    assert cp_ptr.mem.device_id == 0 and cp_ptr.mem.size == 10000
    assert mgr.allocator.allocated_size(cp_ptr.ptr) == 10240
    assert mgr.allocator.get_stats().bytes_in_use == 4096 + 10240
    del cp_ptr  # CuPy dropping its memory returns the block to the shared pool
    assert mgr.allocator.get_stats().bytes_in_use == 4096
    empty = cupy_allocator(0)
    assert empty.ptr == 0 and empty.mem.size == 0
    del empty, numba_block
    assert mgr.allocator.get_stats().bytes_in_use == 0


def test_cupy_allocator_checks_each_new_context_once(monkeypatch, fresh_cupy_checks):
    """Numba's current_context() (microseconds on a GPU) runs at a context's first
    CuPy allocation only; after a reset of its manager (Numba's cuda.close() and
    Context.reset() do one) the next allocation checks again, and finds the
    device's new context, or the same one."""
    from numba_bfc.integrations.cupy import cupy_allocator

    first = make_manager()
    first.context.memory_manager = first
    calls = _cupy_sees(monkeypatch, first.context)
    blocks = [cupy_allocator(4096) for _ in range(3)]
    assert len(calls) == 1
    assert first.allocator.get_stats().bytes_in_use == 3 * 4096
    del blocks
    assert first.allocator.get_stats().bytes_in_use == 0

    first.reset()  # the context stays (Context.reset()): checked again, same manager
    blocks = [cupy_allocator(4096) for _ in range(2)]
    assert len(calls) == 2
    assert first.allocator.get_stats().bytes_in_use == 2 * 4096
    del blocks

    first.reset()  # cuda.close(): the device's next primary context has a new manager
    second = make_manager()
    second.context.memory_manager = second
    calls = _cupy_sees(monkeypatch, second.context)
    blocks = [cupy_allocator(4096) for _ in range(2)]
    assert len(calls) == 1
    assert second.allocator.get_stats().bytes_in_use == 2 * 4096
    assert first.allocator.get_stats().bytes_in_use == 0
    del blocks
    assert second.allocator.get_stats().bytes_in_use == 0


def test_cupy_allocator_keeps_no_manager_alive(monkeypatch, fresh_cupy_checks):
    """What the allocator remembers of a checked manager does not keep it (nor
    the context it holds) alive once Numba is done with the context."""
    from numba_bfc.integrations import cupy as cupy_integration

    mgr = make_manager()
    mgr.context.memory_manager = mgr
    _cupy_sees(monkeypatch, mgr.context)
    block = cupy_integration.cupy_allocator(4096)
    del block
    manager_ref, resets = cupy_integration._checked_managers[0]
    assert manager_ref() is mgr and resets == mgr.resets == 0
    mgr.context.memory_manager = None  # Numba lets go of the context and its manager
    del mgr
    gc.collect()
    assert manager_ref() is None


def test_cupy_allocator_checks_each_device_once(monkeypatch, fresh_cupy_checks):
    """Allocations that alternate between two devices check each device's
    context once, not at every switch."""
    from numba_bfc.integrations.cupy import cupy_allocator

    managers = [make_manager(), make_manager()]
    contexts = [m.context for m in managers]
    for m in managers:
        m.context.memory_manager = m
    calls = _cupy_sees(monkeypatch, contexts[0])
    device = [0]
    monkeypatch.setattr(cuda, "gpus", [types.SimpleNamespace(get_primary_context=lambda c=c: c)
                                       for c in contexts])
    monkeypatch.setattr(cuda, "current_context", lambda devnum=None: (
        calls.append(devnum), contexts[device[0]])[1])
    cupy = sys.modules["cupy"]
    monkeypatch.setattr(cupy.cuda.runtime, "getDevice", lambda: device[0])
    blocks = []
    for i in range(6):
        device[0] = i % 2
        blocks.append(cupy_allocator(4096))
    assert len(calls) == 2
    assert [m.allocator.get_stats().bytes_in_use for m in managers] == [3 * 4096, 3 * 4096]
    del blocks


def test_cupy_allocator_refuses_another_manager_or_device(monkeypatch, fresh_cupy_checks):
    from numba_bfc.integrations.cupy import cupy_allocator

    foreign = FakeContext(memory_manager=object())
    _cupy_sees(monkeypatch, foreign)
    with pytest.raises(RuntimeError, match="use_numba_bfc"):
        cupy_allocator(4096)
    with pytest.raises(RuntimeError, match="use_numba_bfc"):  # still refused: not cached
        cupy_allocator(4096)

    ours = make_manager()
    ours.context.memory_manager = ours
    other_device = FakeContext()
    _cupy_sees(monkeypatch, other_device, current=ours.context)
    with pytest.raises(RuntimeError, match="current device is 0 but Numba's current context"):
        cupy_allocator(4096)
    assert ours.allocator.get_stats().bytes_in_use == 0


def test_cupy_allocator_without_cupy_says_so(monkeypatch):
    from numba_bfc.integrations.cupy import cupy_allocator

    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(ImportError, match="needs CuPy"):
        cupy_allocator(16)


# ---------------------------------------------------------------------- CUDA backends
def test_cuda_backends_name_what_is_missing():
    for cls in (CudaSubAllocator, CudaVirtualSubAllocator):
        if getattr(cuda, "implementation", None) == "NVIDIA" and cuda.is_available():
            pytest.skip("a CUDA GPU is present; tests/gpu covers the backends")
        with pytest.raises(CudaUnavailableError, match="numba-cuda|driver|GPU|simulator"):
            cls()


def test_imports_need_no_gpu_and_compile_nothing():
    # The backends and the integrations package load numba.cuda only when used.
    code = ("import sys, numba_bfc.backends.cuda, numba_bfc.integrations;"
            "print('numba.cuda' in sys.modules)")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, cwd=root)
    assert out.stdout.strip() == "False"
