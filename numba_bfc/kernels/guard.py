"""How a kernel called from Python reaches the tables, with or without the lock.

Every kernel the façade calls (an *operation*: ``*_op`` in ``policies`` and
``kernels.operations``) takes ``state`` and scalars only. The façade records
each table's data address and length in the state whenever it installs a
table (always under its lock), and ``table_views`` rebuilds the arrays from
them inside the kernel. So:

- a call passes one array instead of six (Numba unboxes every array argument
  on every call), and the views are the current tables by construction: a
  stale array cannot be handed in;
- the views own no memory, so the helper kernels they are passed to do no
  reference counting, and each helper is compiled for one set of types;
- one kernel serves both callers: with ``locked`` false it runs only while
  no thread holds the façade's lock.

A Numba kernel that does not release the GIL runs as one indivisible step for
every other Python thread, so one kernel call needs no lock of its own. What
it must not do is run while another thread is in the middle of a multi-call
operation under the lock (growing the pool or a table, a batch, a report).
The façade's lock therefore keeps ``state[S_LOCK_DEPTH]`` above 0 while held,
and an operation called with ``locked`` false proceeds only when it is 0,
else changes nothing and answers ``TABLES_BUSY`` (the façade then takes the
lock and calls again with ``locked`` true).

Kernels must therefore never be compiled with ``nogil=True``.
"""

from __future__ import annotations

import numpy as np
from numba import carray, types
from numba.core.extending import intrinsic

from .jit import njit
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
    S_TSQ_ADDR,
    S_TSQ_SLOTS,
)

INT64 = np.dtype(np.int64)


@intrinsic
def _pointer(typingctx, address, dtype):
    """``address`` (an int) as a typed pointer to ``dtype`` items."""
    item = dtype.dtype
    sig = types.CPointer(item)(address, dtype)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(types.CPointer(item)))

    return sig, codegen


@njit(cache=True, inline="always")
def may_proceed(state, locked):
    """True if a kernel may touch the tables: its caller holds the façade's
    lock (``locked``), or no thread does."""
    return locked or state[S_LOCK_DEPTH] == 0


@njit(cache=True, inline="always")
def table_views(state):
    """``(chunks, bins, regions, pmap, tsq, state)``: views of the tables the
    state records, and of the state itself.

    The views own no memory, so passing them from function to function costs
    no reference counting (an atomic add per array per call otherwise, most of
    a kernel's time), and every helper kernel is compiled for one set of
    argument types.
    """
    chunks = carray(_pointer(state[S_CHUNKS_ADDR], CHUNK_DTYPE), (state[S_CHUNK_ROWS],))
    bins = carray(_pointer(state[S_BINS_ADDR], BIN_DTYPE), (state[S_NUM_BINS],))
    regions = carray(_pointer(state[S_REGIONS_ADDR], REGION_DTYPE), (state[S_REGION_ROWS],))
    pmap = carray(_pointer(state[S_PMAP_ADDR], INT64), (state[S_PMAP_SLOTS], 2))
    tsq = carray(_pointer(state[S_TSQ_ADDR], INT64), (state[S_TSQ_SLOTS], 2))
    own = carray(_pointer(state.ctypes.data, INT64), (state.shape[0],))
    return chunks, bins, regions, pmap, tsq, own
