"""numba_bfc: GPU memory allocators built on Numba.

TensorFlow's BFC allocator and PyTorch's caching-allocator policy as ``@njit``
kernels over structured NumPy tables, TensorFlow's allocator framework with
RMM-style adaptors, simulated, host and CUDA backends, and TFLite's offline
planner. Importing compiles nothing: kernels are compiled (or loaded from
Numba's cache) on first use.
"""

from .adaptors import LimitingAllocator, LoggingAllocator, RetryingAllocator, StatisticsAllocator
from .allocators import BFCAllocator, CachingAllocator, SharedCounter
from .allocators.host import HostAllocator
from .errors import InvalidPointerError, OutOfMemoryError
from .framework import (
    AllocationAttributes,
    Allocator,
    AllocatorAttributes,
    AllocatorRegistry,
    AllocatorRegistryWarning,
    AllocatorWrapper,
    AllocRecord,
    TrackingAllocator,
    global_registry,
    register_allocator,
)
from .stats import AllocatorStats
from .traces import RmmLogEvent, read_rmm_log

__version__ = "0.1.0"

__all__ = [
    "Allocator",
    "AllocationAttributes",
    "AllocatorAttributes",
    "AllocatorRegistry",
    "AllocatorRegistryWarning",
    "AllocatorWrapper",
    "AllocRecord",
    "AllocatorStats",
    "BFCAllocator",
    "CachingAllocator",
    "HostAllocator",
    "InvalidPointerError",
    "LimitingAllocator",
    "LoggingAllocator",
    "OutOfMemoryError",
    "RetryingAllocator",
    "RmmLogEvent",
    "SharedCounter",
    "StatisticsAllocator",
    "TrackingAllocator",
    "global_registry",
    "read_rmm_log",
    "register_allocator",
    "__version__",
]
