"""TensorFlow's allocator framework: the interface, its attribute types, the
argument checks every allocator shares, the host (``"cpu"``) allocator, the
registry, the tracking allocator and the wrapper base of the adaptors."""

from .allocator import AllocationAttributes, Allocator, AllocatorAttributes
from .host import HostAllocator
from .registry import (
    ENTRY_POINT_GROUP,
    AllocatorRegistry,
    AllocatorRegistryWarning,
    RegistryEntry,
    global_registry,
    register_allocator,
)
from .tracking import AllocRecord, TrackingAllocator
from .wrapper import AllocatorWrapper, BookkeepingWrapper

__all__ = [
    "Allocator",
    "AllocationAttributes",
    "AllocatorAttributes",
    "AllocatorRegistry",
    "AllocatorRegistryWarning",
    "AllocatorWrapper",
    "AllocRecord",
    "BookkeepingWrapper",
    "HostAllocator",
    "ENTRY_POINT_GROUP",
    "RegistryEntry",
    "TrackingAllocator",
    "global_registry",
    "register_allocator",
]
