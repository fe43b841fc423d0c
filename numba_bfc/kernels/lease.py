"""An address lease in the state: where a backend's next regions go.

A backend whose placement is plain arithmetic gives an ``AddressLease``
(``numba_bfc.backends``): ``(top, gap, alignment, granularity, room)``. The
façade writes it into ``LEASE_SLOTS`` consecutive state slots (in that
order), and a policy kernel then places new regions itself, as the backend's
``alloc`` would have, instead of a trip to Python per region. The façade
records what was placed with the backend afterwards.
"""

from __future__ import annotations

import numpy as np

from .jit import inner

LEASE_TOP = 0  # the next region starts above this...
LEASE_GAP = 1  # ...plus this gap...
LEASE_ALIGN = 2  # ...aligned to this (and to the caller's alignment)
LEASE_GRANULE = 3  # region sizes are rounded up to a multiple of this
LEASE_ROOM = 4  # bytes the backend can still grant
LEASE_SLOTS = 5

_INT64_MAX = np.int64(2**63 - 1)


@inner
def lease_next(state, at, nbytes, alignment):
    """``(ptr, received)`` that the backend's next ``alloc(nbytes, alignment)``
    would return under the lease at ``state[at:at + LEASE_SLOTS]``, or
    ``(-1, 0)`` if it would fail (past the room, or past the int64 address
    space). Changes nothing; ``lease_take`` commits it."""
    granule = state[at + LEASE_GRANULE]
    received = (nbytes + granule - 1) // granule * granule
    if received > state[at + LEASE_ROOM]:
        return np.int64(-1), np.int64(0)
    align = max(state[at + LEASE_ALIGN], alignment)
    ptr = (state[at + LEASE_TOP] + state[at + LEASE_GAP] + align - 1) // align * align
    if ptr > _INT64_MAX - received:
        return np.int64(-1), np.int64(0)
    return ptr, received


@inner
def lease_take(state, at, ptr, received):
    """Commit a placement from ``lease_next``: the backend's top and room move on."""
    state[at + LEASE_TOP] = ptr + received
    state[at + LEASE_ROOM] -= received
