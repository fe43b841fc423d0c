"""Kernel calls without the façade's lock.

A Numba kernel that does not release the GIL runs as one indivisible step for
every other Python thread, so one kernel call needs no lock of its own. What
it must not do is run while another thread is in the middle of a multi-call
operation under the lock (growing the pool or a table, a batch, a report).
The façade's lock therefore keeps ``state[S_LOCK_DEPTH]`` above 0 while held,
and a lock-free kernel proceeds only when it is 0, else changes nothing and
answers ``TABLES_BUSY`` (the façade then takes the lock).

A lock-free kernel takes only ``state`` and scalars: the façade records each
table's data address and length in the state whenever it installs a table
(always under the lock), and ``table_views`` rebuilds the arrays from them.
Passing one array instead of five saves most of the call's cost (Numba wraps
every array argument on every call), and the views are the current tables
by construction: a stale array cannot be handed in.

Kernels must therefore never be compiled with ``nogil=True``.
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit, types
from numba.core.extending import intrinsic

from .layout import (
    BIN_DTYPE,
    CHUNK_DTYPE,
    REGION_DTYPE,
    S_BINS_ADDR,
    S_CHUNK_ROWS,
    S_CHUNKS_ADDR,
    S_LOCK_DEPTH,
    S_NUM_BINS,
    S_PMAP_ADDR,
    S_PMAP_SLOTS,
    S_REGION_ROWS,
    S_REGIONS_ADDR,
)

PMAP_DTYPE = np.dtype(np.int64)


@intrinsic
def _pointer(typingctx, address, dtype):
    """``address`` (an int) as a typed pointer to ``dtype`` items."""
    item = dtype.dtype
    sig = types.CPointer(item)(address, dtype)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(types.CPointer(item)))

    return sig, codegen


@njit(cache=True, inline="always")
def tables_idle(state):
    """True if no thread holds the façade's lock."""
    return state[S_LOCK_DEPTH] == 0


@njit(cache=True, inline="always")
def table_views(state):
    """``(chunks, bins, regions, pmap)``: the tables the state records."""
    chunks = carray(_pointer(state[S_CHUNKS_ADDR], CHUNK_DTYPE), (state[S_CHUNK_ROWS],))
    bins = carray(_pointer(state[S_BINS_ADDR], BIN_DTYPE), (state[S_NUM_BINS],))
    regions = carray(_pointer(state[S_REGIONS_ADDR], REGION_DTYPE), (state[S_REGION_ROWS],))
    pmap = carray(_pointer(state[S_PMAP_ADDR], PMAP_DTYPE), (state[S_PMAP_SLOTS], 2))
    return chunks, bins, regions, pmap
