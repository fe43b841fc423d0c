"""The allocator interface every allocator here implements (TensorFlow's ``Allocator``).

Also the two attribute types TF passes around: ``AllocationAttributes`` (one
request) and ``AllocatorAttributes`` (what kind of memory a caller needs).
"""

from __future__ import annotations

import abc
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..stats import AllocatorStats

__all__ = ["Allocator", "AllocationAttributes", "AllocatorAttributes"]

# TF's kAllocatorAlignment: the default alignment of typed allocations.
DEFAULT_ALIGNMENT = 64


@dataclass(frozen=True)
class AllocationAttributes:
    """Per-request options (TF's ``AllocationAttributes``).

    Parameters
    ----------
    retry_on_failure : bool
        If True (default) a ``RetryingAllocator`` waits for frees on
        out-of-memory; if False it fails at once.
    allocation_will_be_logged : bool
        The caller logs this allocation itself, so adaptors need not.
    freed_before : int or callable, optional
        Do not reuse memory freed after this timing count (TF's
        ``freed_by_func``); a callable is called once per request.
    """

    retry_on_failure: bool = True
    allocation_will_be_logged: bool = False
    freed_before: int | Callable[[], int] = 0

    def freed_before_count(self) -> int:
        """``freed_before`` as a number (calls it if it is a function)."""
        fb = self.freed_before
        return int(fb()) if callable(fb) else fb


_ON_HOST = 1 << 0
_NIC_COMPATIBLE = 1 << 1
_GPU_COMPATIBLE = 1 << 2
_TRACK_SIZES = 1 << 3
_DEVICE_SHIFT = 24  # TF reserves the upper 8 bits of the value for devices
_MAX_VALUE = (1 << 32) - 1
_MAX_BYTES = (1 << 63) - 1  # sizes are int64 everywhere


class AllocatorAttributes:
    """What a caller needs from an allocator (TF's ``AllocatorAttributes``).

    A 32-bit set of flags: ``on_host`` (bit 0), ``nic_compatible`` (bit 1),
    ``gpu_compatible`` (bit 2), ``track_sizes`` (bit 3), and 8 device-specific
    bits at the top (``device_bits``). Instances are immutable; ``merge`` returns
    a new one.

    Examples
    --------
    >>> a = AllocatorAttributes(on_host=True)
    >>> b = AllocatorAttributes(on_host=True, gpu_compatible=True)
    >>> a.is_equal_or_less_restrictive_than(b), b.is_equal_or_less_restrictive_than(a)
    (True, False)
    """

    __slots__ = ("_value", "_scope_id")

    def __init__(self, *, on_host: bool = False, nic_compatible: bool = False,
                 gpu_compatible: bool = False, track_sizes: bool = False,
                 device_bits: int = 0, value: int = 0, scope_id: int = 0) -> None:
        if not 0 <= device_bits <= 0xFF:
            raise ValueError(f"device_bits must be in [0, 255], got {device_bits}")
        if not 0 <= value <= _MAX_VALUE:
            raise ValueError(f"value must be a 32-bit unsigned integer, got {value}")
        v = value | (device_bits << _DEVICE_SHIFT)
        v |= _ON_HOST if on_host else 0
        v |= _NIC_COMPATIBLE if nic_compatible else 0
        v |= _GPU_COMPATIBLE if gpu_compatible else 0
        v |= _TRACK_SIZES if track_sizes else 0
        self._value = v
        self._scope_id = int(scope_id)

    value = property(lambda self: self._value, doc="The raw 32-bit flag word.")
    scope_id = property(lambda self: self._scope_id, doc="TF's scope id (0: none).")
    on_host = property(lambda self: bool(self._value & _ON_HOST))
    nic_compatible = property(lambda self: bool(self._value & _NIC_COMPATIBLE))
    gpu_compatible = property(lambda self: bool(self._value & _GPU_COMPATIBLE))
    track_sizes = property(lambda self: bool(self._value & _TRACK_SIZES))
    device_bits = property(lambda self: self._value >> _DEVICE_SHIFT,
                           doc="The upper 8 bits, reserved for device-specific use.")

    def merge(self, other: AllocatorAttributes) -> AllocatorAttributes:
        """The union of both flag sets. Scope ids must agree unless one is 0."""
        if self._scope_id != other._scope_id and self._scope_id and other._scope_id:
            raise ValueError(
                "at least one scope_id should be zero to merge AllocatorAttributes, got "
                f"{self._scope_id} and {other._scope_id}")
        return AllocatorAttributes(value=self._value | other._value,
                                   scope_id=self._scope_id or other._scope_id)

    def is_equal_or_less_restrictive_than(self, other: AllocatorAttributes) -> bool:
        """True if every flag set here is also set in ``other``."""
        return (self._value | other._value) == other._value

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, AllocatorAttributes) and self._value == other._value
                and self._scope_id == other._scope_id)

    def __hash__(self) -> int:
        return hash((self._value, self._scope_id))

    def __repr__(self) -> str:
        names = [n for n in ("on_host", "nic_compatible", "gpu_compatible", "track_sizes")
                 if getattr(self, n)]
        extra = [f"device_bits={self.device_bits:#x}"] if self.device_bits else []
        extra += [f"scope_id={self._scope_id}"] if self._scope_id else []
        return f"AllocatorAttributes({', '.join([f'{n}=True' for n in names] + extra)})"


class _Allocation:
    """Owns one allocation behind an ``empty()`` array; frees it when collected.

    NumPy views keep their base alive, and the base of every view of the
    returned array is this object, so the memory lives exactly as long as some
    array uses it.
    """

    __slots__ = ("__array_interface__", "_finalizer", "__weakref__")

    def __init__(self, allocator: Allocator, ptr: int, shape: tuple, dtype: np.dtype) -> None:
        self.__array_interface__ = {
            "shape": shape, "typestr": dtype.str, "descr": dtype.descr,
            "data": (ptr, False), "version": 3,
        }
        self._finalizer = weakref.finalize(self, allocator.deallocate_raw, ptr)


class Allocator(abc.ABC):
    """Abstract allocator (TF's ``Allocator``).

    Subclasses implement ``name``, ``allocate_raw`` and ``deallocate_raw``; the
    size-tracking queries and stats have TF's defaults (not tracked, no stats).
    Every allocator in numba_bfc is thread-safe.
    """

    #: True when addresses are real host memory this process can read and write.
    host_accessible: bool = False

    @property
    @abc.abstractmethod
    def name(self) -> str:
        """The allocator's name."""

    @abc.abstractmethod
    def allocate_raw(self, num_bytes: int, alignment: int = 256,
                     attributes: AllocationAttributes | None = None) -> int:
        """Allocate ``num_bytes`` aligned to ``alignment``; return the address (0 for 0 bytes).

        Raises ``OutOfMemoryError`` when the memory is not there, and
        ``TypeError``/``ValueError`` for bad arguments, leaving the state unchanged.
        """

    @abc.abstractmethod
    def deallocate_raw(self, ptr: int | None) -> None:
        """Free ``ptr`` from ``allocate_raw``; 0 or None does nothing.

        Raises ``InvalidPointerError`` for a pointer that is not live.
        """

    def tracks_allocation_sizes(self) -> bool:
        """True if ``requested_size``/``allocated_size``/``allocation_id`` work."""
        return False

    def requested_size(self, ptr: int) -> int:
        """Bytes asked for at ``ptr`` (only if ``tracks_allocation_sizes()``)."""
        raise NotImplementedError(f"{self.name} does not track allocation sizes")

    def allocated_size(self, ptr: int) -> int:
        """Bytes actually reserved for ``ptr``; TF's default is ``requested_size``."""
        return self.requested_size(ptr)

    def allocation_id(self, ptr: int) -> int:
        """A unique id (> 0) for the allocation at ``ptr``; 0 if not tracked."""
        return 0

    def get_stats(self) -> AllocatorStats | None:
        """Current counters, or None if this allocator keeps none."""
        return None

    def clear_stats(self) -> bool:
        """Reset peak counters; False if this allocator has none to reset."""
        return False

    # ------------------------------------------------------------------ typed helpers
    def allocate(self, dtype, count: int,
                 attributes: AllocationAttributes | None = None) -> int:
        """Address of room for ``count`` elements of ``dtype`` (TF's ``Allocate<T>``).

        Aligned to ``max(64, dtype.alignment)``; 0 when ``count`` is 0.
        """
        dt = np.dtype(dtype)
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0:
            raise ValueError(f"count must be an integer >= 0, got {count!r}")
        nbytes = int(count) * dt.itemsize
        if nbytes > _MAX_BYTES:
            raise ValueError(f"{count} elements of {dt} is {nbytes} bytes, more than 2**63 - 1")
        return self.allocate_raw(nbytes, max(DEFAULT_ALIGNMENT, dt.alignment), attributes)

    def empty(self, shape, dtype=np.float64) -> np.ndarray:
        """An uninitialised NumPy array living in this allocator's memory.

        The memory goes back to the allocator when the array and every view of
        it are garbage-collected. Only for host-accessible allocators.
        """
        if not self.host_accessible:
            raise TypeError(
                f"{self.name}: empty() needs host-accessible memory; this allocator's "
                "addresses are not host memory (use a HostSubAllocator backend)")
        dt = np.dtype(dtype)
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        if any(isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 0
               for s in shape):
            raise ValueError(f"shape must be non-negative integers, got {shape!r}")
        count = int(np.prod(shape, dtype=object)) if shape else 1
        ptr = self.allocate(dt, max(count, 1))
        return np.asarray(_Allocation(self, ptr, tuple(int(s) for s in shape), dt))
