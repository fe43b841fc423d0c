"""One batch kernel for every policy: a whole array of operations in one call."""

from __future__ import annotations

import numpy as np

from ..kernels.guard import table_views
from ..kernels.jit import inner, njit, operation
from ..kernels.layout import FAILED_HERE, INVALID_POINTER, S_POOL_BYTES
from .bfc import UNTAGGED, bfc_allocate, bfc_deallocate
from .caching import caching_allocate, caching_deallocate
from .compact import IN_BATCH, S_RELEASE_DUE, compact_allocate, compact_deallocate

#: A batch's operations (``ops[i]``).
ALLOCATE = 0
FREE = 1

#: ``run_batch`` code: the operation before the returned index freed memory
#: at the end of a region that the façade should give back to the backend.
RELEASE_DUE = -4

#: ``run_batch`` code: the allocation at the returned index asks for more than
#: ``max_request`` bytes; the façade refuses it as its single calls do.
TOO_LARGE = -6

#: ``id_ptr`` value of an allocation the façade could not serve (a replay goes
#: on past it); its free is skipped.
FAILED = -2


@njit(cache=True, inline="always")
def sample_usage(series, stride, i, state, in_use_slot):
    """Keep the most in-use and reserved bytes of event ``i``'s bucket."""
    b = i // stride
    u = state[in_use_slot]
    r = state[S_POOL_BYTES]
    if u > series[b, 0]:
        series[b, 0] = u
    if r > series[b, 1]:
        series[b, 1] = r


@inner
def run_batch(allocate, deallocate, releases, state, ops, ids, sizes, alignment, max_request,
              id_ptr, out, start, stop, series, stride, in_use_slot):
    """Run operations ``start..stop-1`` of a batch with one policy's
    ``allocate(chunks, bins, regions, pmap, state, nbytes, alignment)`` and
    ``deallocate(chunks, bins, regions, pmap, state, ptr)`` kernels.

    Numba compiles this once per pair of kernels (they are part of its
    argument types), so each policy's batch (``run_batch_bfc`` and the others)
    compiles only its own kernels, and only when first used.

    ``ops[i]`` is 0 (allocate ``sizes[i]`` bytes for id ``ids[i]``) or 1 (free
    id ``ids[i]``); ``id_ptr`` maps ids to live addresses (-1: not live, 0: a
    zero-byte allocation) and ``out[i]`` receives the address each allocation
    got (0 for one that failed: ``FAILED_HERE`` from ``allocate``, which
    marks its id ``FAILED``). Stops at the first operation the kernel cannot
    finish alone and returns ``(index, code)``: ``NEED_ROWS`` or ``NOT_FOUND``
    (the façade grows or extends and resumes at ``index``),
    ``INVALID_POINTER``, ``TOO_LARGE`` (above ``max_request`` bytes: no kernel
    arithmetic sees it), or (when ``releases``) ``RELEASE_DUE`` (operation
    ``index - 1``, a free or an allocation after a hole fill, was done but not
    sampled; the façade gives the free tail back, samples, and resumes at
    ``index``). Returns
    ``(stop, 0)`` when done. A free of an id whose ``id_ptr`` is ``FAILED``
    is skipped. With ``stride > 0``, row ``i // stride`` of ``series`` keeps
    the most bytes in use (``state[in_use_slot]``) and reserved after any
    operation ``i`` of its bucket.

    The caller holds the façade's lock; the tables are the ones ``state``
    records (``kernels.guard``).
    """
    chunks, bins, regions, pmap, _, state = table_views(state)
    for i in range(start, stop):
        if ops[i] == ALLOCATE:
            p = 0
            if sizes[i] != 0:
                if sizes[i] > max_request:
                    return i, TOO_LARGE
                p = allocate(chunks, bins, regions, pmap, state, sizes[i], alignment)
                if p == FAILED_HERE:
                    p = FAILED  # counted, and skipped as the façade skips a failure
                elif p < 0:
                    return i, p
            id_ptr[ids[i]] = p
            out[i] = max(p, 0)
        else:
            p = id_ptr[ids[i]]
            out[i] = 0
            if p < 0 and p != FAILED:
                return i, INVALID_POINTER
            if p > 0:
                r = deallocate(chunks, bins, regions, pmap, state, p)
                if r < 0:
                    return i, r
            id_ptr[ids[i]] = -1
        if releases and state[S_RELEASE_DUE] != 0:
            return i + 1, RELEASE_DUE  # the façade samples after giving back
        if stride > 0:
            sample_usage(series, stride, i, state, in_use_slot)
    return stop, 0


# Each policy's allocation kernel with the batch's signature.
@inner
def _bfc_allocate(chunks, bins, regions, pmap, state, nbytes, alignment):
    return bfc_allocate(chunks, bins, regions, pmap, state, nbytes, alignment, UNTAGGED)


@inner
def _caching_allocate(chunks, bins, regions, pmap, state, nbytes, alignment):
    return caching_allocate(chunks, bins, regions, pmap, state, nbytes)


@inner
def _compact_allocate(chunks, bins, regions, pmap, state, nbytes, alignment):
    return compact_allocate(chunks, bins, regions, pmap, state, nbytes, alignment, UNTAGGED,
                            IN_BATCH)


_NO_RELEASES = np.bool_(False)  # not literals: see kernels.chunks.HONOUR_TIMESTAMPS
_RELEASES = np.bool_(True)


@operation
def run_batch_bfc(state, ops, ids, sizes, alignment, max_request, id_ptr, out, start, stop,
                  series, stride, in_use_slot):
    """``run_batch`` with the BFC policy."""
    return run_batch(_bfc_allocate, bfc_deallocate, _NO_RELEASES, state, ops, ids, sizes,
                     alignment, max_request, id_ptr, out, start, stop, series, stride,
                     in_use_slot)


@operation
def run_batch_caching(state, ops, ids, sizes, alignment, max_request, id_ptr, out, start, stop,
                      series, stride, in_use_slot):
    """``run_batch`` with the caching policy."""
    return run_batch(_caching_allocate, caching_deallocate, _NO_RELEASES, state, ops, ids,
                     sizes, alignment, max_request, id_ptr, out, start, stop, series, stride,
                     in_use_slot)


@operation
def run_batch_compact(state, ops, ids, sizes, alignment, max_request, id_ptr, out, start, stop,
                      series, stride, in_use_slot):
    """``run_batch`` with the compact policy (whose frees may make a release due)."""
    return run_batch(_compact_allocate, compact_deallocate, _RELEASES, state, ops, ids, sizes,
                     alignment, max_request, id_ptr, out, start, stop, series, stride,
                     in_use_slot)


#: ``batch_problem``'s answers: the first kind of problem ``run_batch`` names.
BATCH_OK = 0
BAD_OP = 1  # an op other than 0 (allocate) and 1 (free)
NEGATIVE_ID = 2
NEGATIVE_SIZE = 3


@operation
def batch_problem(ops, ids, sizes):
    """``(problem, top_id)`` of a batch's int64 arrays (of one length): the
    first of ``BAD_OP``, ``NEGATIVE_ID``, ``NEGATIVE_SIZE`` that any entry
    has, in that order, or ``BATCH_OK``; and the largest id (at least -1).
    One pass: NumPy's checks took a pass and a temporary array each, about
    half of a batch of a few operations (``docs/performance.md``)."""
    bad_op = negative_id = negative_size = False
    top = np.int64(-1)
    for i in range(ops.shape[0]):
        bad_op |= ops[i] != ALLOCATE and ops[i] != FREE
        negative_id |= ids[i] < 0
        negative_size |= sizes[i] < 0
        top = max(top, ids[i])
    if bad_op:
        return BAD_OP, top
    if negative_id:
        return NEGATIVE_ID, top
    if negative_size:
        return NEGATIVE_SIZE, top
    return BATCH_OK, top
