"""Trace kernels: pairing frees with their allocations, in one pass."""

from __future__ import annotations

from ..kernels.jit import njit

ALLOC = 0
FREE = 1

# Event status codes; the names are in ``numba_bfc.traces.trace.PROBLEMS``.
OK = 0
UNKNOWN_FREE = 1
DOUBLE_FREE = 2
LIVE_ID_REUSED = 3
BAD_SIZE = 4
BAD_OP = 5
SIZE_MISMATCH = 6


@njit(cache=True)
def pair_events(ops, dense_ids, sizes, live, seen, status, partner, stop_at_first):
    """Pair every free with the allocation it frees.

    ``dense_ids`` are the events' ids renumbered ``0..num_ids-1``; ``live``
    (-1s) and ``seen`` (0s) have ``num_ids`` entries, ``status`` (0s) and
    ``partner`` (-1s) one per event: the caller makes them, so that no
    NumPy allocation is compiled into the kernel. Fills ``status[i]`` with
    ``OK`` or the problem code of event ``i`` (a bad event is ignored by the
    pairing, so later events are judged as if it were not there) and
    ``partner[i]`` with, for a good free, the index of its allocation and,
    for an allocation, the index of its free (-1 if never freed). Returns the
    index of the first bad event or -1. With ``stop_at_first`` the pass ends
    at the first bad event.
    """
    n = ops.shape[0]
    first_bad = -1
    for i in range(n):
        d = dense_ids[i]
        code = OK
        if ops[i] == ALLOC:
            if sizes[i] <= 0:
                code = BAD_SIZE
            elif live[d] >= 0:
                code = LIVE_ID_REUSED
            else:
                live[d] = i
                seen[d] = 1
        elif ops[i] == FREE:
            a = live[d]
            if a < 0:
                code = DOUBLE_FREE if seen[d] else UNKNOWN_FREE
            elif sizes[i] != 0 and sizes[i] != sizes[a]:
                code = SIZE_MISMATCH
            else:
                partner[i] = a
                partner[a] = i
                live[d] = -1
        else:
            code = BAD_OP
        if code != OK:
            status[i] = code
            if first_bad < 0:
                first_bad = i
                if stop_at_first:
                    break
    return first_bad
