"""The Allocator interface's attribute types and its typed helpers (allocate, empty)."""

import gc

import numpy as np
import pytest

from numba_bfc import BFCAllocator
from numba_bfc.adaptors import LoggingAllocator, StatisticsAllocator
from numba_bfc.backends import HostSubAllocator, VirtualSubAllocator
from numba_bfc.framework import AllocationAttributes, AllocatorAttributes
from numba_bfc.framework.host import HostAllocator

MiB = 1 << 20


# ---------------------------------------------------------------- AllocatorAttributes
def test_attribute_bits_are_tf_values():
    assert AllocatorAttributes(on_host=True).value == 0x1
    assert AllocatorAttributes(nic_compatible=True).value == 0x2
    assert AllocatorAttributes(gpu_compatible=True).value == 0x4
    assert AllocatorAttributes(track_sizes=True).value == 0x8
    a = AllocatorAttributes(device_bits=0xAB)
    assert a.value == 0xAB << 24 and a.device_bits == 0xAB and not a.on_host


def test_merge_is_the_union_and_keeps_the_nonzero_scope():
    a = AllocatorAttributes(on_host=True, device_bits=0x01)
    b = AllocatorAttributes(gpu_compatible=True, device_bits=0x10, scope_id=7)
    m = a.merge(b)
    assert (m.on_host, m.gpu_compatible, m.nic_compatible) == (True, True, False)
    assert m.device_bits == 0x11 and m.scope_id == 7
    assert b.merge(a) == m
    assert a.value == 0x01 << 24 | 0x1, "merge must not change its operands"


def test_merge_refuses_two_different_scopes():
    with pytest.raises(ValueError, match="scope_id"):
        AllocatorAttributes(scope_id=1).merge(AllocatorAttributes(scope_id=2))
    assert AllocatorAttributes(scope_id=3).merge(AllocatorAttributes(scope_id=3)).scope_id == 3


def test_less_restrictive_is_a_subset_test():
    none = AllocatorAttributes()
    host = AllocatorAttributes(on_host=True)
    host_gpu = AllocatorAttributes(on_host=True, gpu_compatible=True)
    dev = AllocatorAttributes(on_host=True, device_bits=0x80)
    assert none.is_equal_or_less_restrictive_than(host)
    assert host.is_equal_or_less_restrictive_than(host)
    assert host.is_equal_or_less_restrictive_than(host_gpu)
    assert not host_gpu.is_equal_or_less_restrictive_than(host)
    assert host.is_equal_or_less_restrictive_than(dev)
    assert not dev.is_equal_or_less_restrictive_than(host_gpu)


def test_attributes_equality_hash_repr_and_bad_values():
    a = AllocatorAttributes(on_host=True, track_sizes=True)
    assert a == AllocatorAttributes(value=0x9) and hash(a) == hash(AllocatorAttributes(value=0x9))
    assert a != AllocatorAttributes(value=0x9, scope_id=1)
    assert repr(a) == "AllocatorAttributes(on_host=True, track_sizes=True)"
    for bad in ({"device_bits": 256}, {"device_bits": -1}, {"value": 1 << 32}, {"value": -1}):
        with pytest.raises(ValueError):
            AllocatorAttributes(**bad)


def test_allocation_attributes_defaults_and_freed_before():
    d = AllocationAttributes()
    assert d.retry_on_failure and not d.allocation_will_be_logged and d.freed_before_count() == 0
    calls = []
    attr = AllocationAttributes(freed_before=lambda: calls.append(1) or 42)
    assert attr.freed_before_count() == 42 and calls == [1]
    with pytest.raises(AttributeError):
        d.retry_on_failure = False  # frozen


def test_bfc_honours_freed_before_from_attributes():
    from numba_bfc import SharedCounter

    a = BFCAllocator(VirtualSubAllocator(), memory_limit=MiB, allow_growth=False)
    counter = SharedCounter()
    a.set_timing_counter(counter)
    p = a.allocate_raw(MiB)
    a.deallocate_raw(p)  # freed at count 1
    q = a.allocate_raw(MiB, attributes=AllocationAttributes(freed_before=0))  # 0: no filter
    a.deallocate_raw(q)  # freed at count 2
    with pytest.raises(MemoryError):
        a.allocate_raw(MiB, attributes=AllocationAttributes(freed_before=1))
    assert a.allocate_raw(MiB, attributes=AllocationAttributes(freed_before=lambda: 2))


# ---------------------------------------------------------------- typed helpers
@pytest.mark.parametrize("dtype, expect_align", [(np.uint8, 64), (np.float64, 64),
                                                 (np.dtype("c16"), 64)])
def test_allocate_sizes_and_aligns(dtype, expect_align):
    a = HostAllocator()
    p = a.allocate(dtype, 10)
    assert p % expect_align == 0
    assert a.requested_size(p) == 10 * np.dtype(dtype).itemsize
    a.deallocate_raw(p)
    assert a.allocate(dtype, 0) == 0


@pytest.mark.parametrize("count", [-1, 1.5, True, "3", None])
def test_allocate_rejects_bad_counts(count):
    a = HostAllocator()
    with pytest.raises(ValueError):
        a.allocate(np.float32, count)
    assert a.get_stats().num_allocs == 0


def test_allocate_rejects_counts_beyond_the_address_space():
    a = HostAllocator()
    with pytest.raises(ValueError, match="bytes"):
        a.allocate(np.float64, 1 << 61)
    assert a.get_stats().num_allocs == 0


def _host_allocators():
    backend = HostSubAllocator()
    bfc = BFCAllocator(backend, memory_limit=16 * MiB)
    return {"bfc": bfc, "host": HostAllocator()}


@pytest.mark.parametrize("kind", ["bfc", "host"])
def test_empty_array_lives_in_allocator_memory_and_returns_it(kind):
    a = _host_allocators()[kind]
    x = a.empty((100, 3), np.float32)
    assert x.shape == (100, 3) and x.dtype == np.float32 and x.flags.writeable
    x[:] = np.arange(300, dtype=np.float32).reshape(100, 3)
    p = x.ctypes.data
    assert a.requested_size(p) == 1200
    assert a.get_stats().bytes_in_use >= 1200
    del x
    gc.collect()
    assert a.get_stats().bytes_in_use == 0


@pytest.mark.parametrize("kind", ["bfc", "host"])
def test_a_view_outliving_the_array_keeps_the_memory(kind):
    a = _host_allocators()[kind]
    x = a.empty(1000, np.int64)
    x[:] = np.arange(1000)
    view = x[500:600]
    in_use = a.get_stats().bytes_in_use
    del x
    gc.collect()
    assert a.get_stats().bytes_in_use == in_use, "memory freed while a view still uses it"
    np.testing.assert_array_equal(view, np.arange(500, 600))
    del view
    gc.collect()
    assert a.get_stats().bytes_in_use == 0


def test_empty_of_zero_elements_and_scalars():
    a = HostAllocator()
    z = a.empty((0, 5))
    s = a.empty((), np.int32)
    assert z.shape == (0, 5) and s.shape == ()
    s[()] = 7
    assert int(s) == 7
    del z, s
    gc.collect()
    assert a.get_stats().bytes_in_use == 0


def test_empty_through_adaptors_frees_through_them(tmp_path):
    stats = StatisticsAllocator(LoggingAllocator(HostAllocator(), tmp_path / "log.csv"))
    x = stats.empty(10)
    assert stats.bytes_counter.value == 80
    del x
    gc.collect()
    assert stats.bytes_counter == (0, 80, 80)


def test_empty_refuses_memory_the_host_cannot_touch():
    a = BFCAllocator(VirtualSubAllocator(), memory_limit=MiB)
    with pytest.raises(TypeError, match="host"):
        a.empty(10)
    with pytest.raises(ValueError, match="shape"):
        HostAllocator().empty((-1, 2))
