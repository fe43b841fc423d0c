"""The Python façade: allocator classes holding the tables, a lock and the backend."""

from .bfc import BFCAllocator
from .bfc_base import SharedCounter
from .caching import CachingAllocator
from .compact import CompactAllocator

__all__ = ["POLICIES", "BFCAllocator", "CachingAllocator", "CompactAllocator", "SharedCounter"]

#: The policies by name: the one table replay, the Numba plugin, the demo and
#: the command line take their policy names from.
POLICIES: dict[str, type] = {
    "bfc": BFCAllocator,
    "caching": CachingAllocator,
    "compact": CompactAllocator,
}
