"""TrackingAllocator, after TensorFlow's tracking_allocator_test.cc."""

import pytest

from numba_bfc import BFCAllocator, InvalidPointerError, OutOfMemoryError
from numba_bfc.backends import VirtualSubAllocator
from numba_bfc.framework import AllocatorWrapper, TrackingAllocator
from numba_bfc.framework.host import HostAllocator


class UntrackedHost(AllocatorWrapper):
    """Host memory from an allocator that does not track sizes (TF's cpu_allocator)."""

    def __init__(self):
        super().__init__(HostAllocator())

    def tracks_allocation_sizes(self):
        return False

    def requested_size(self, ptr):
        raise NotImplementedError


class NoMemory(HostAllocator):
    """Tracks sizes, never has memory (TF's NoMemoryAllocator)."""

    def allocate_raw(self, num_bytes, alignment=256, attributes=None):
        raise OutOfMemoryError("no memory", num_bytes=num_bytes)


def test_inner_without_size_tracking_counts_only_totals():
    inner = UntrackedHost()
    ta = TrackingAllocator(inner, track_sizes_locally=False)
    assert not ta.tracks_allocation_sizes()
    p1 = ta.allocate_raw(4, 4)
    ta.deallocate_raw(p1)
    p2 = ta.allocate_raw(12, 4)
    assert ta.get_sizes() == (16, 0, 0)
    ta.deallocate_raw(p2)
    assert [r.alloc_bytes for r in ta.get_records()] == [4, 12]
    assert inner.inner.get_stats().bytes_in_use == 0


def test_track_sizes_locally_when_the_inner_does_not():
    ta = TrackingAllocator(UntrackedHost(), track_sizes_locally=True)
    assert ta.tracks_allocation_sizes()
    p1 = ta.allocate_raw(4, 4)
    assert (ta.requested_size(p1), ta.allocated_size(p1), ta.allocation_id(p1)) == (4, 4, 1)
    ta.deallocate_raw(p1)
    p2 = ta.allocate_raw(12, 4)
    assert (ta.requested_size(p2), ta.allocated_size(p2), ta.allocation_id(p2)) == (12, 12, 2)
    assert ta.get_sizes() == (16, 12, 12)
    ta.deallocate_raw(p2)
    assert ta.get_sizes() == (16, 12, 0)
    assert [r.alloc_bytes for r in ta.get_records()] == [4, -4, 12, -12]
    with pytest.raises(InvalidPointerError):
        ta.requested_size(p2)


def test_inner_with_size_tracking_uses_its_allocated_sizes():
    bfc = BFCAllocator(VirtualSubAllocator(), memory_limit=1 << 20)
    ta = TrackingAllocator(bfc, track_sizes_locally=True)
    assert not ta.track_sizes_locally, "local tracking is only for inners that do not track"
    p1 = ta.allocate_raw(12)
    ta.deallocate_raw(p1)
    p2 = ta.allocate_raw(300)
    # BFC rounds to 256-byte chunks: 12 -> 256, 300 -> 512.
    assert ta.get_sizes() == (768, 512, 512)
    assert ta.allocation_id(p2) == bfc.allocation_id(p2) and ta.allocated_size(p2) == 512
    ta.deallocate_raw(p2)
    assert [r.alloc_bytes for r in ta.get_records()] == [256, -256, 512, -512]
    records = ta.get_records()
    assert all(a.alloc_micros <= b.alloc_micros for a, b in zip(records, records[1:]))
    assert ta.get_sizes() == (768, 512, 0)


def test_high_watermark_is_the_peak_of_live_bytes():
    ta = TrackingAllocator(HostAllocator())
    ps = [ta.allocate_raw(n) for n in (100, 200, 300)]
    ta.deallocate_raw(ps[1])
    ta.allocate_raw(50)
    assert ta.get_sizes() == (650, 600, 450)


def test_out_of_memory_propagates_and_records_nothing():
    ta = TrackingAllocator(NoMemory())
    with pytest.raises(OutOfMemoryError):
        ta.allocate_raw(12, 4)
    assert ta.get_sizes() == (0, 0, 0) and ta.get_records() == []


def test_freeing_null_is_a_no_op():
    ta = TrackingAllocator(NoMemory())
    ta.deallocate_raw(0)
    ta.deallocate_raw(None)
    assert ta.get_sizes() == (0, 0, 0) and ta.get_records() == []


def test_bad_frees_raise_and_change_nothing():
    ta = TrackingAllocator(HostAllocator())
    p = ta.allocate_raw(64)
    with pytest.raises(InvalidPointerError):
        ta.deallocate_raw(p + 8)
    ta.deallocate_raw(p)
    with pytest.raises(InvalidPointerError) as err:
        ta.deallocate_raw(p)
    assert err.value.kind == "double_free"
    with pytest.raises(TypeError):
        ta.allocate_raw("64")
    assert ta.get_sizes() == (64, 64, 0) and len(ta.get_records()) == 2


def test_stats_and_name_are_forwarded():
    host = HostAllocator()
    ta = TrackingAllocator(host)
    p = ta.allocate_raw(10)
    assert ta.get_stats() == host.get_stats() and ta.get_stats().bytes_in_use == 10
    assert ta.clear_stats() and host.get_stats().num_allocs == 0
    assert ta.name == "tracking(cpu)" and ta.host_accessible
    ta.deallocate_raw(p)
