"""The batch entry point: growth, extension and errors handled mid-batch."""

import numpy as np
import pytest
from _support import batch_program
from hypothesis import given, settings
from hypothesis import strategies as st

from numba_bfc import BFCAllocator, InvalidPointerError, OutOfMemoryError
from numba_bfc.backends import VirtualSubAllocator
from numba_bfc.policies.batch import (
    BAD_OP,
    BATCH_OK,
    NEGATIVE_ID,
    NEGATIVE_SIZE,
    batch_problem,
)
from numba_bfc.testing.invariants import check_invariants
from numba_bfc.traces import make_allocator

MiB = 1 << 20


def test_batch_grows_tables_and_extends_pool():
    n = 5000  # more chunks than the initial 1024-row table, several regions
    ops = np.repeat(np.array([0, 1], dtype=np.int8), n)
    ids = np.concatenate([np.arange(n), np.arange(n)[::-1]])
    a = BFCAllocator(VirtualSubAllocator(), memory_limit=1 << 30)
    out = a.run_batch(ops, ids, np.where(ops == 0, 10_000, 0))
    assert np.all(out[:n] > 0) and np.unique(out[:n]).size == n and np.all(out[n:] == 0)
    s = a.get_stats()
    # Region tails smaller than twice a request are handed out whole, so >=.
    assert s.num_allocs == n and s.peak_bytes_in_use >= n * 10240 and len(a.regions()) > 1
    assert s.bytes_in_use == 0
    check_invariants(a)


def test_batch_oom_stops_at_the_failing_operation():
    a = BFCAllocator(VirtualSubAllocator(), memory_limit=4 * MiB)
    with pytest.raises(OutOfMemoryError):
        a.run_batch(np.zeros(3, dtype=np.int8), np.arange(3), np.array([MiB, 2 * MiB, 2 * MiB]))
    assert a.get_stats().num_allocs == 2
    check_invariants(a)


def test_batch_rejects_bad_arrays():
    a = BFCAllocator(VirtualSubAllocator(), memory_limit=4 * MiB)
    with pytest.raises(ValueError, match="only 0"):
        a.run_batch(np.array([2]), np.array([0]), np.array([1]))
    with pytest.raises(ValueError, match="same length"):
        a.run_batch(np.array([0, 0]), np.array([0]), np.array([1]))
    with pytest.raises(ValueError, match="ids"):
        a.run_batch(np.array([0]), np.array([-1]), np.array([1]))
    with pytest.raises(OutOfMemoryError, match="larger than the memory limit"):
        a.run_batch(np.array([0]), np.array([0]), np.array([8 * MiB]))
    p = a.allocate_raw(1000)
    a.deallocate_raw(p)
    with pytest.raises(InvalidPointerError, match="operation 2 frees id 0"):
        # id 0 allocated then freed twice: the second free names a dead id
        a.run_batch(np.array([0, 1, 1]), np.array([0, 0, 0]), np.array([100, 0, 0]))
    with pytest.raises(InvalidPointerError, match="operation 0 frees id 5"):
        a.run_batch(np.array([1]), np.array([5]), np.array([0]))


@pytest.mark.parametrize("policy", ["bfc", "caching", "compact"])
@settings(max_examples=25, deadline=None)
@given(program=st.lists(st.tuples(st.booleans(), st.integers(1, 1 << 20), st.integers(0, 99)),
                        max_size=80),
       scatter=st.integers(0, 7), offset=st.sampled_from([0, 1 << 16, 1 << 40, (1 << 62) - 1]))
def test_ids_pair_the_same_whether_they_index_the_table_or_are_numbered_first(
        policy, program, scatter, offset):
    """``run_batch`` uses small ids as table indices and numbers large ones
    first (``_pairing_slots``): ids spread over any range, reused once freed,
    give the addresses of ids 0..k-1."""
    ops, ids, sizes = batch_program(program)
    spread = [offset + (i << scatter) for i in ids]  # in int64: at most 2**62 + 80 * 2**7
    dense, sparse = make_allocator(policy), make_allocator(policy)
    assert (sparse.run_batch(ops, spread, sizes).tolist()
            == dense.run_batch(ops, ids, sizes).tolist())
    check_invariants(sparse)


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(0, 1), st.integers(0, 1 << 40),
                               st.integers(0, 1 << 40)), max_size=30),
       spoilt=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 29),
                                 st.sampled_from([-(1 << 40), -2, -1, 2, 3])), max_size=3))
def test_the_batch_check_finds_what_numpy_finds(rows, spoilt):
    """``batch_problem`` (one pass in a kernel) answers what NumPy's checks
    answer, in their order: an op other than 0 and 1 first, then a negative
    id, then a negative size; and the largest id (at least -1). ``spoilt``
    puts a few bad values in a good batch, so that each kind is met alone
    and with the others."""
    columns = [np.array([r[k] for r in rows], dtype=np.int64) for k in range(3)]
    for column, row, value in spoilt if rows else ():
        columns[column][row % len(rows)] = value
    ops, ids, sizes = columns
    expected = (BAD_OP if ((ops != 0) & (ops != 1)).any() else
                NEGATIVE_ID if (ids < 0).any() else
                NEGATIVE_SIZE if (sizes < 0).any() else BATCH_OK)
    assert batch_problem(ops, ids, sizes) == (expected, max(ids.max(initial=-1), -1))


def test_a_batch_with_several_problems_is_refused_for_the_first_kind_and_changes_nothing():
    a = BFCAllocator(VirtualSubAllocator(), memory_limit=4 * MiB)
    before = a.get_stats()
    for batch, message in ((([0, 2], [-1, 0], [-5, 1]), "ops must contain only 0"),
                           (([0, 0], [0, -1], [-5, 1]), "ids must be >= 0"),
                           (([0, 0], [0, 1], [5, -1]), "sizes must be >= 0")):
        with pytest.raises(ValueError, match=message):
            a.run_batch(*(np.array(x) for x in batch))
        assert a.get_stats() == before
    check_invariants(a)


def test_a_batch_takes_any_one_dimensional_integer_arrays_and_refuses_other_shapes():
    """Lists, strided views, read-only arrays and narrower integer types give
    what int64 arrays give; an empty batch does nothing; a single value
    (0-d) or a 2-D array is refused, nothing changed."""
    ops, ids, sizes = np.array([0, 0, 1]), np.array([0, 1, 0]), np.array([1000, 2000, 0])
    expected = make_allocator("bfc").run_batch(ops, ids, sizes).tolist()
    strided = [np.repeat(x, 2)[::2] for x in (ops, ids, sizes)]
    read_only = [x.copy() for x in (ops, ids, sizes)]
    for x in read_only:
        x.flags.writeable = False
    for batch in ([x.tolist() for x in (ops, ids, sizes)], strided, read_only,
                  [ops.astype(np.int8), ids.astype(np.int32), sizes.astype(np.uint16)]):
        assert make_allocator("bfc").run_batch(*batch).tolist() == expected
    a = make_allocator("bfc")
    assert a.run_batch([], [], []).tolist() == []
    for batch in ((0, 0, 1000), (np.array(0), np.array([0]), np.array([1000])),
                  (ops.reshape(3, 1), ids.reshape(3, 1), sizes.reshape(3, 1))):
        with pytest.raises(ValueError, match="1-D arrays of the same length"):
            a.run_batch(*batch)
    assert a.get_stats().num_allocs == 0
    check_invariants(a)
