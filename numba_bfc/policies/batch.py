"""One batch kernel for every policy: a whole array of operations in one call."""

from __future__ import annotations

from numba import njit

from ..kernels.layout import INVALID_POINTER
from .bfc import bfc_allocate, bfc_deallocate
from .caching import caching_allocate, caching_deallocate

BFC_POLICY = 0
CACHING_POLICY = 1


@njit(cache=True)
def run_batch(policy, chunks, bins, regions, pmap, state, ops, ids, sizes, alignment,
              id_ptr, out, start):
    """Run operations ``start..`` of a batch under ``policy`` (``BFC_POLICY`` or
    ``CACHING_POLICY``).

    ``ops[i]`` is 0 (allocate ``sizes[i]`` bytes for id ``ids[i]``) or 1 (free
    id ``ids[i]``); ``id_ptr`` maps ids to live addresses (-1: not live, 0: a
    zero-byte allocation) and ``out[i]`` receives the address each allocation
    got. Stops at the first operation the kernel cannot finish alone and
    returns ``(index, code)``: ``NEED_ROWS`` or ``NOT_FOUND`` (the façade grows
    or extends and resumes at ``index``), or ``INVALID_POINTER``. Returns
    ``(len(ops), 0)`` when done.
    """
    n = ops.shape[0]
    for i in range(start, n):
        if ops[i] == 0:
            if sizes[i] == 0:
                id_ptr[ids[i]] = 0
                out[i] = 0
                continue
            if policy == BFC_POLICY:
                p = bfc_allocate(chunks, bins, regions, pmap, state, sizes[i], alignment, 0)
            else:
                p = caching_allocate(chunks, bins, regions, pmap, state, sizes[i])
            if p < 0:
                return i, p
            id_ptr[ids[i]] = p
            out[i] = p
        else:
            p = id_ptr[ids[i]]
            out[i] = 0
            if p < 0:
                return i, INVALID_POINTER
            if p == 0:
                id_ptr[ids[i]] = -1
                continue
            if policy == BFC_POLICY:
                r = bfc_deallocate(chunks, bins, regions, pmap, state, p)
            else:
                r = caching_deallocate(chunks, bins, regions, pmap, state, p)
            if r < 0:
                return i, r
            id_ptr[ids[i]] = -1
    return n, 0
