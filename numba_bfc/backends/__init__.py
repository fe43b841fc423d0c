"""Backends ("sub-allocators"): where pooling allocators get their regions.

One small interface: ``alloc(nbytes, alignment) -> (ptr, received) or None``,
``free(ptr, nbytes)`` and ``supports_coalescing``.
"""

from .base import SubAllocator
from .cuda import CudaSubAllocator, CudaUnavailableError, CudaVirtualSubAllocator, cuda_available
from .host import HostSubAllocator
from .virtual import VirtualSubAllocator

__all__ = [
    "SubAllocator", "VirtualSubAllocator", "HostSubAllocator", "CudaSubAllocator",
    "CudaVirtualSubAllocator", "CudaUnavailableError", "cuda_available",
]
