"""Backends ("sub-allocators"): where pooling allocators get their regions.

One small interface: ``alloc(nbytes, alignment) -> (ptr, received) or None``,
``free(ptr, nbytes)`` and ``supports_coalescing``; a backend whose placement is
plain arithmetic also gives an ``AddressLease`` (``address_lease``).
"""

from .base import AddressLease, SubAllocator
from .cuda import CudaSubAllocator, CudaUnavailableError, CudaVirtualSubAllocator, cuda_available
from .host import HostSubAllocator
from .virtual import VirtualSubAllocator

__all__ = [
    "SubAllocator", "AddressLease", "VirtualSubAllocator", "HostSubAllocator", "CudaSubAllocator",
    "CudaVirtualSubAllocator", "CudaUnavailableError", "cuda_available",
]
