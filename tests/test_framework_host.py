"""HostAllocator: TF's CPU allocator semantics over real host memory."""

import ctypes

import numpy as np
import pytest

from numba_bfc import InvalidPointerError, OutOfMemoryError
from numba_bfc.framework.host import HostAllocator


def _bytes_at(ptr, n):
    return np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(ptr))


def test_memory_is_real_aligned_and_private():
    a = HostAllocator()
    ps = [a.allocate_raw(n, alignment) for n, alignment in
          [(1, 1), (100, 64), (4096, 4096), (77, 256)]]
    assert [p % al for p, al in zip(ps, [1, 64, 4096, 256])] == [0, 0, 0, 0]
    sizes = [1, 100, 4096, 77]
    for i, (p, n) in enumerate(zip(ps, sizes)):
        _bytes_at(p, n)[:] = i + 1
    for i, (p, n) in enumerate(zip(ps, sizes)):
        assert np.all(_bytes_at(p, n) == i + 1)
    spans = sorted((p, p + n) for p, n in zip(ps, sizes))
    assert all(e <= s for (_, e), (s, _) in zip(spans, spans[1:]))
    for p in ps:
        a.deallocate_raw(p)


def test_stats_follow_tf_cpu_allocator():
    a = HostAllocator(memory_limit="1MiB")
    p = a.allocate_raw(1000)
    q = a.allocate_raw(3000)
    a.deallocate_raw(p)
    s = a.get_stats()
    assert (s.num_allocs, s.bytes_in_use, s.peak_bytes_in_use, s.largest_alloc_size,
            s.bytes_limit) == (2, 3000, 4000, 3000, 1 << 20)
    assert a.tracks_allocation_sizes()
    assert (a.requested_size(q), a.allocated_size(q), a.allocation_id(q)) == (3000, 3000, 2)
    assert a.clear_stats()
    s = a.get_stats()
    assert (s.num_allocs, s.bytes_in_use, s.peak_bytes_in_use, s.largest_alloc_size) == (
        0, 3000, 3000, 0)
    a.deallocate_raw(q)
    assert a.allocate_raw(0) == 0 and a.get_stats().num_allocs == 0


def test_memory_limit_raises_out_of_memory_and_keeps_state():
    a = HostAllocator(memory_limit=4096)
    p = a.allocate_raw(3000)
    with pytest.raises(OutOfMemoryError) as err:
        a.allocate_raw(2000)
    assert err.value.reason == "exhausted" and err.value.num_bytes == 2000
    with pytest.raises(OutOfMemoryError) as err:
        a.allocate_raw(5000)
    assert err.value.reason == "limit" and err.value.allocator_name == "cpu"
    assert a.get_stats().bytes_in_use == 3000 and a.get_stats().num_allocs == 1
    a.deallocate_raw(p)
    a.deallocate_raw(a.allocate_raw(4096))


@pytest.mark.parametrize("args, exc", [
    ((-1,), ValueError), ((1.0,), TypeError), ((True,), TypeError), (("8",), TypeError),
    ((8, 3), ValueError), ((8, 0), ValueError), ((8, 2.0), TypeError),
])
def test_bad_requests_raise_and_change_nothing(args, exc):
    a = HostAllocator()
    with pytest.raises(exc):
        a.allocate_raw(*args)
    assert a.get_stats().num_allocs == 0


def test_bad_frees_say_what_is_wrong_and_change_nothing():
    a = HostAllocator()
    p = a.allocate_raw(128)
    q = a.allocate_raw(64)
    a.deallocate_raw(q)
    cases = [(q, "double_free"), (p + 16, "interior"), (12345, "unknown")]
    for ptr, kind in cases:
        with pytest.raises(InvalidPointerError) as err:
            a.deallocate_raw(ptr)
        assert err.value.kind == kind and err.value.ptr == ptr
    for bad, exc in [(-1, ValueError), ("p", TypeError), (1 << 64, ValueError)]:
        with pytest.raises(exc):
            a.deallocate_raw(bad)
    with pytest.raises(InvalidPointerError):
        a.requested_size(q)
    assert a.get_stats().bytes_in_use == 128
    a.deallocate_raw(0)
    a.deallocate_raw(None)
    a.deallocate_raw(p)
    assert a.get_stats().bytes_in_use == 0


def test_impossible_sizes_are_out_of_memory_not_crashes():
    a = HostAllocator()
    with pytest.raises(OutOfMemoryError) as err:
        a.allocate_raw(1 << 62)
    assert err.value.reason == "backend"
    assert a.get_stats().bytes_in_use == 0
