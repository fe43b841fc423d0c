"""The simulated backend: capacity, contiguity, granularity, failure injection."""

import pytest

from numba_bfc.backends import VirtualSubAllocator


def test_non_contiguous_regions_are_never_adjacent():
    b = VirtualSubAllocator()
    r = [b.alloc(1 << 20, 256) for _ in range(4)]
    assert all(p1 + n1 < p2 for (p1, n1), (p2, _) in zip(r, r[1:]))
    assert not b.supports_coalescing


def test_contiguous_ranges_abut_and_free_in_unions():
    b = VirtualSubAllocator(contiguous=True, granularity=2 << 20)
    (p1, n1), (p2, n2) = b.alloc(1, 256), b.alloc(3 << 20, 256)
    assert (n1, n2) == (2 << 20, 4 << 20) and p2 == p1 + n1 and b.supports_coalescing
    with pytest.raises(ValueError):
        b.free(p1, n1 + 1)
    b.free(p1, n1 + n2)  # one free covering both, as a coalesced region does
    assert b.mapped_ranges() == [] and b.bytes_held == 0
    assert b.alloc(256, 256)[0] == p1  # the space shrank back


def test_capacity_and_failure_injection():
    b = VirtualSubAllocator(capacity=1 << 20, fail_if=lambda n: n == 4096)
    assert b.alloc(4096) is None
    b.fail_next(2)
    assert b.alloc(256) is None and b.alloc(256) is None
    assert b.alloc(1 << 20) is not None
    assert b.alloc(256) is None
    assert b.num_failed_allocs == 4 and b.num_allocs == 1
    with pytest.raises(ValueError):
        b.alloc(0)
    with pytest.raises(ValueError):
        b.alloc(256, 3)
