"""An address lease in the state: where a backend's next regions go.

A backend whose placement is plain arithmetic gives an ``AddressLease``
(``numba_bfc.backends``): ``(top, gap, alignment, granularity, room,
floor)``. The façade writes it into ``LEASE_SLOTS`` consecutive state slots
(in that order), and a policy kernel then places new regions itself, as the
backend's ``alloc`` would have, instead of a trip to Python per region. The
façade records what was placed with the backend afterwards. Where the
holder's regions are all the backend holds, a kernel may also give regions
back and lease on (``lease_fall_back``): the façade then gives them back to
the backend in the same order.
"""

from __future__ import annotations

import numpy as np

from .jit import inner, njit

LEASE_TOP = 0  # the next region starts above this...
LEASE_GAP = 1  # ...plus this gap...
LEASE_ALIGN = 2  # ...aligned to this (and to the caller's alignment)
LEASE_GRANULE = 3  # region sizes are rounded up to a multiple of this
LEASE_ROOM = 4  # bytes the backend can still grant
LEASE_FLOOR = 5  # where the top falls back to once nothing is mapped
LEASE_SLOTS = 6

_INT64_MAX = np.int64(2**63 - 1)


@inner
def lease_place(state, at, nbytes, alignment, top, room):
    """``(ptr, received)`` that the backend's next ``alloc(nbytes, alignment)``
    would return under the lease at ``state[at:at + LEASE_SLOTS]`` with its
    top and room at ``top`` and ``room``, or ``(-1, 0)`` if it would fail
    (past the room, or past the int64 address space)."""
    granule = state[at + LEASE_GRANULE]
    received = (nbytes + granule - 1) // granule * granule
    if received > room:
        return np.int64(-1), np.int64(0)
    align = max(state[at + LEASE_ALIGN], alignment)
    ptr = (top + state[at + LEASE_GAP] + align - 1) // align * align
    if ptr > _INT64_MAX - received:
        return np.int64(-1), np.int64(0)
    return ptr, received


@njit(cache=True, inline="always")
def lease_next(state, at, nbytes, alignment):
    """``lease_place`` on the lease as it stands. Changes nothing;
    ``lease_take`` commits it."""
    return lease_place(state, at, nbytes, alignment, state[at + LEASE_TOP],
                       state[at + LEASE_ROOM])


@njit(cache=True, inline="always")
def _fallen_top(state, at, highest_end):
    # Where a free leaves the top: the highest region still held, or the floor.
    return max(state[at + LEASE_FLOOR], highest_end)


@njit(cache=True, inline="always")
def lease_next_after(state, at, nbytes, alignment, highest_end, released):
    """``lease_place`` on the lease as ``lease_fall_back(state, at,
    highest_end, released)`` would leave it. Changes nothing."""
    return lease_place(state, at, nbytes, alignment, _fallen_top(state, at, highest_end),
                       state[at + LEASE_ROOM] + released)


@inner
def lease_take(state, at, ptr, received):
    """Commit a placement from ``lease_next``: the backend's top and room move on."""
    state[at + LEASE_TOP] = ptr + received
    state[at + LEASE_ROOM] -= received


@inner
def lease_fall_back(state, at, highest_end, released):
    """The lease at ``state[at:at + LEASE_SLOTS]`` after its holder gave
    ``released`` bytes back to the backend, when the regions it still holds
    are all the backend holds and the highest ends at ``highest_end`` (0 if
    none): the top falls back to there (or to the floor), and the room grows
    by what was given back."""
    state[at + LEASE_TOP] = _fallen_top(state, at, highest_end)
    state[at + LEASE_ROOM] += released
