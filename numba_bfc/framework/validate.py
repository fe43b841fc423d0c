"""Argument checks shared by every allocator: clear errors before any state changes."""

from __future__ import annotations

import operator

import numpy as np

# Sizes, alignments and addresses live in int64 table fields.
MAX_INT64 = (1 << 63) - 1


def _as_int(value, what: str) -> int:
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{what} must be an integer, not bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an integer, not {type(value).__name__}") from None


def check_size(num_bytes) -> int:
    """``num_bytes`` as a Python int >= 0, or TypeError / ValueError naming the problem."""
    n = _as_int(num_bytes, "num_bytes")
    if n < 0:
        raise ValueError(f"num_bytes must be >= 0, got {n}")
    return n


def check_alignment(alignment) -> int:
    """A power of two >= 1, or TypeError / ValueError."""
    a = _as_int(alignment, "alignment")
    if a <= 0 or a & (a - 1) or a > (1 << 62):
        raise ValueError(f"alignment must be a power of two >= 1, got {a}")
    return a


def check_pointer(ptr) -> int:
    """An address as a Python int in ``[0, 2**63)``, or TypeError / ValueError."""
    p = _as_int(ptr, "ptr")
    if p < 0 or p > MAX_INT64:
        raise ValueError(f"ptr must be an address in [0, 2**63), got {p}")
    return p


def check_free_pointer(ptr) -> int:
    """``check_pointer`` for ``deallocate_raw``, where None means 0 (nothing to free)."""
    return 0 if ptr is None else check_pointer(ptr)


def check_count(value, what: str) -> int:
    """A non-negative integer counter value (timing counts, frontiers)."""
    v = _as_int(value, what)
    if v < 0 or v > MAX_INT64:
        raise ValueError(f"{what} must be in [0, 2**63), got {v}")
    return v
