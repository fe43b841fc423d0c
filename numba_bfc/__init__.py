"""numba_bfc: GPU memory allocators built on Numba.

TensorFlow's BFC allocator as ``@njit`` kernels over structured NumPy tables,
with simulated, host and (later) CUDA backends. Importing compiles nothing:
kernels are compiled (or loaded from Numba's cache) on first use.
"""

from .allocators import BFCAllocator, CachingAllocator, SharedCounter
from .errors import InvalidPointerError, OutOfMemoryError
from .stats import AllocatorStats

__version__ = "0.1.0"

__all__ = [
    "BFCAllocator",
    "CachingAllocator",
    "AllocatorStats",
    "OutOfMemoryError",
    "InvalidPointerError",
    "SharedCounter",
    "__version__",
]
