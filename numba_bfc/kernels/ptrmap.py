"""Pointer -> chunk-handle map: open addressing with linear probing.

Keys are addresses of in-use chunks (never 0, which marks an empty slot).
Deletion shifts later entries back instead of leaving tombstones, so lookups
stay short however many frees happen. The façade keeps the load at or below
one half by doubling (``map_rehash``) before a kernel could overfill it.
"""

from __future__ import annotations

import numpy as np

from .jit import inner, njit
from .layout import NO_HANDLE, S_MAP_COUNT


@njit(cache=True, inline="always")
def _slot(ptr, mask):
    # Addresses share low zero bits (256-byte rounding): mix them out first.
    x = np.uint64(ptr) * np.uint64(0x9E3779B97F4A7C15)
    x = x ^ (x >> np.uint64(32))
    return np.int64(x & np.uint64(mask))


@inner
def map_insert(pmap, state, ptr, h):
    """Add ``ptr -> h`` (``ptr`` must not be present)."""
    mask = pmap.shape[0] - 1
    i = _slot(ptr, mask)
    while pmap[i, 0] != 0:
        i = (i + 1) & mask
    pmap[i, 0] = ptr
    pmap[i, 1] = h
    state[S_MAP_COUNT] += 1


@inner
def _find_slot(pmap, ptr):
    mask = pmap.shape[0] - 1
    i = _slot(ptr, mask)
    while True:
        k = pmap[i, 0]
        if k == ptr:
            return i
        if k == 0:
            return -1
        i = (i + 1) & mask


@inner
def map_lookup(pmap, ptr):
    """Handle of the in-use chunk at ``ptr``, or -1."""
    if ptr <= 0:
        return NO_HANDLE
    i = _find_slot(pmap, ptr)
    if i < 0:
        return NO_HANDLE
    return pmap[i, 1]


@inner
def map_remove(pmap, state, ptr):
    """Remove ``ptr``; returns its handle, or -1 if absent."""
    if ptr <= 0:
        return NO_HANDLE
    i = _find_slot(pmap, ptr)
    if i < 0:
        return NO_HANDLE
    h = pmap[i, 1]
    mask = pmap.shape[0] - 1
    j = i
    while True:
        j = (j + 1) & mask
        k = pmap[j, 0]
        if k == 0:
            break
        home = _slot(k, mask)
        # Keep entry j where it is if its home lies cyclically in (i, j].
        if i <= j:
            stays = i < home <= j
        else:
            stays = home > i or home <= j
        if stays:
            continue
        pmap[i, 0] = k
        pmap[i, 1] = pmap[j, 1]
        i = j
    pmap[i, 0] = 0
    pmap[i, 1] = 0
    state[S_MAP_COUNT] -= 1
    return h


@inner
def map_rehash(old, new, state):
    """Move every entry of ``old`` into the empty table ``new``."""
    state[S_MAP_COUNT] = 0
    for i in range(old.shape[0]):
        if old[i, 0] != 0:
            map_insert(new, state, old[i, 0], old[i, 1])
