"""TensorFlow's allocator framework: the interface, its attribute types, the
registry, the tracking allocator and the wrapper base of the adaptors."""

from .allocator import AllocationAttributes, Allocator, AllocatorAttributes
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
    "ENTRY_POINT_GROUP",
    "RegistryEntry",
    "TrackingAllocator",
    "global_registry",
    "register_allocator",
]
