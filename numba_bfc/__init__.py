"""numba_bfc: GPU memory allocators built on Numba.

TensorFlow's BFC allocator and PyTorch's caching-allocator policy as ``@njit``
kernels over structured NumPy tables, TensorFlow's allocator framework with
RMM-style adaptors, simulated, host and CUDA backends, TFLite's offline
planner, and allocation traces replayed through any policy. Importing compiles
nothing: kernels are compiled (or loaded from Numba's cache) on first use.
"""

from .allocators import BFCAllocator, CachingAllocator, CompactAllocator, SharedCounter
from .errors import InputError, InvalidPointerError, OutOfMemoryError
from .framework.host import HostAllocator
from .stats import AllocatorStats

__version__ = "0.1.0"

# The allocators, the errors, the stats and the plugin entry points; the
# subsystems are subpackages (numba_bfc.traces, .planning, .framework,
# .adaptors, .backends, .viz), as RMM keeps its resources in rmm.mr.
__all__ = [
    "AllocatorStats",
    "BFCAllocator",
    "CachingAllocator",
    "CompactAllocator",
    "CudaOutOfMemoryError",
    "HostAllocator",
    "InputError",
    "InvalidPointerError",
    "NumbaBFCMemoryManager",
    "OutOfMemoryError",
    "SharedCounter",
    "TraceError",
    "cupy_allocator",
    "current_allocator",
    "current_manager",
    "empty_cache",
    "record_stream",
    "use_numba_bfc",
    "__version__",
]


# The Numba plugin and CuPy allocator import numba.cuda (and CuPy) on first
# use, so that importing numba_bfc stays fast and works without numba-cuda or
# under the CUDA simulator. NUMBA_CUDA_MEMORY_MANAGER=numba_bfc reads
# numba_bfc._numba_memory_manager through this hook.
_LAZY = {
    "NumbaBFCMemoryManager": "numba_bfc.integrations.numba_emm",
    "CudaOutOfMemoryError": "numba_bfc.integrations.numba_emm",
    "use_numba_bfc": "numba_bfc.integrations.numba_emm",
    "current_manager": "numba_bfc.integrations.numba_emm",
    "current_allocator": "numba_bfc.integrations.numba_emm",
    "record_stream": "numba_bfc.integrations.numba_emm",
    "empty_cache": "numba_bfc.integrations.numba_emm",
    "_numba_memory_manager": "numba_bfc.integrations.numba_emm",
    "cupy_allocator": "numba_bfc.integrations.cupy",
    # Imports the trace machinery, which a program that only allocates never needs.
    "TraceError": "numba_bfc.traces",
}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'numba_bfc' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
