"""TensorFlow's allocator framework: the interface and its attribute types."""

from .allocator import AllocationAttributes, Allocator, AllocatorAttributes

__all__ = ["Allocator", "AllocationAttributes", "AllocatorAttributes"]
