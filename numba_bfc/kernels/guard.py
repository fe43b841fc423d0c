"""How a kernel called from Python reaches the tables, with or without the lock.

Every kernel the façade calls (an *operation*: ``*_op`` in ``policies`` and
``kernels.operations``) takes ``state`` and scalars only (the single-call
allocate and free and the lookup of a live allocation: the state's address,
below). The façade records
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

The single-call allocate and free of each policy, the calls a program makes
most, and the lookup of a live allocation (``kernels.operations.live_chunk_op``,
lock-free first too) take the state's data address instead of the state
(``state_at`` rebuilds it): Numba's wrapper unboxes an array argument into a
reference-counted structure on every call (an allocation, an atomic
increment and decrement, a free; about 50 ns of a 280-300 ns call here,
``docs/performance.md``), an int in a few ns. The façade creates the state
array once, keeps it for the allocator's life and never replaces it, so the
address it passes stays valid. A kernel given an address trusts it: only the
façade passes one. Given the array instead, the dispatcher fails at typing
(``_view`` takes integers only) and a compiled entry point raises
``TypeError`` when it unboxes the argument.
"""

from __future__ import annotations

import numpy as np
from numba import types
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
    S_STATE_SLOTS,
    S_TSQ_ADDR,
    S_TSQ_SLOTS,
)

INT64 = np.dtype(np.int64)


@intrinsic
def _view(typingctx, address, rows, cols, dtype):
    """The C-contiguous array of ``dtype`` items at ``address``, owning no
    memory: ``rows`` items, or ``rows`` x ``cols`` where ``cols`` is an int
    (not None). One intrinsic where ``numba.carray`` of a typed pointer costs
    an overload compiled per dtype and a dozen typed statements per view at a
    cold start."""
    if not isinstance(address, types.Integer) or not isinstance(rows, types.Integer):
        return None  # a typing error naming the arguments, not invalid machine code
    two_d = isinstance(cols, types.Integer)
    array_type = types.Array(dtype.dtype, 2 if two_d else 1, "C")
    sig = array_type(address, rows, cols, dtype)

    def codegen(context, builder, signature, args):
        # Imported when a kernel compiles: importing the package loads no Numba lowering.
        from numba.np.arrayobj import make_array, populate_array

        address, rows, cols = args[0], args[1], args[2]
        intp = context.get_value_type(types.intp)
        item = context.get_data_type(array_type.dtype)
        itemsize = intp(context.get_abi_sizeof(item))
        shape = [rows, cols] if two_d else [rows]
        strides = [builder.mul(cols, itemsize), itemsize] if two_d else [itemsize]
        view = make_array(array_type)(context, builder)
        populate_array(view, data=builder.inttoptr(address, item.as_pointer()),
                       shape=shape, strides=strides, itemsize=itemsize, meminfo=None)
        return view._getvalue()

    return sig, codegen


@njit(cache=True, inline="always")
def may_proceed(state, locked):
    """True if a kernel may touch the tables: its caller holds the façade's
    lock (``locked``), or no thread does."""
    return locked or state[S_LOCK_DEPTH] == 0


@njit(cache=True, inline="always")
def state_at(address):
    """The state array whose data starts at ``address``, owning no memory:
    its length is its slot ``S_STATE_SLOTS``."""
    slots = _view(address, S_STATE_SLOTS + 1, None, INT64)[S_STATE_SLOTS]
    return _view(address, slots, None, INT64)


@njit(cache=True, inline="always")
def table_views(state):
    """``(chunks, bins, regions, pmap, tsq, state)``: views of the tables the
    state records, and of the state itself.

    The views own no memory, so passing them from function to function costs
    no reference counting (an atomic add per array per call otherwise, most of
    a kernel's time), and every helper kernel is compiled for one set of
    argument types.
    """
    chunks = _view(state[S_CHUNKS_ADDR], state[S_CHUNK_ROWS], None, CHUNK_DTYPE)
    bins = _view(state[S_BINS_ADDR], state[S_NUM_BINS], None, BIN_DTYPE)
    regions = _view(state[S_REGIONS_ADDR], state[S_REGION_ROWS], None, REGION_DTYPE)
    pmap = _view(state[S_PMAP_ADDR], state[S_PMAP_SLOTS], 2, INT64)
    tsq = _view(state[S_TSQ_ADDR], state[S_TSQ_SLOTS], 2, INT64)
    own = _view(state.ctypes.data, state.shape[0], None, INT64)
    return chunks, bins, regions, pmap, tsq, own
