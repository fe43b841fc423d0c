"""Bad input to the caching policy: a clear exception naming the problem, state unchanged."""

import numpy as np
import pytest

from numba_bfc import InvalidPointerError, OutOfMemoryError
from numba_bfc.backends import VirtualSubAllocator
from numba_bfc.testing.invariants import check_invariants

MiB = 1 << 20


@pytest.fixture
def busy(caching_impl):
    c = caching_impl(VirtualSubAllocator(capacity=256 * MiB), memory_limit=64 * MiB)
    ptrs = [c.allocate_raw(s) for s in (1000, 300000, 5000, 70, 3 * MiB)]
    c.deallocate_raw(ptrs[2])
    return c, ptrs


def _state(c):
    return (c.memory_stats(), c.memory_snapshot(), c.backend.num_allocs, c.backend.num_frees)


@pytest.mark.parametrize("size, exc, words", [
    (-1, ValueError, ">= 0"), (1.5, TypeError, "float"), ("100", TypeError, "str"),
    (None, TypeError, "NoneType"), (True, TypeError, "bool"), (np.float64(8.0), TypeError,
                                                               "float64"),
    (np.int8(-3), ValueError, ">= 0"), (1 << 60, OutOfMemoryError, "more than 1EB"),
    (1 << 70, OutOfMemoryError, "more than 1EB"),
])
def test_bad_sizes(busy, size, exc, words):
    c, _ = busy
    before = _state(c)
    with pytest.raises(exc, match=words):
        c.allocate_raw(size)
    assert _state(c) == before
    check_invariants(c)


@pytest.mark.parametrize("alignment, exc, words", [
    (0, ValueError, "power of two"), (3, ValueError, "power of two"),
    (1024, ValueError, "512 bytes"), (512.0, TypeError, "float"), ("8", TypeError, "str")])
def test_bad_alignment(busy, alignment, exc, words):
    c, _ = busy
    before = _state(c)
    with pytest.raises(exc, match=words):
        c.allocate_raw(100, alignment)
    assert _state(c) == before


@pytest.mark.parametrize("which, kind", [("double", "double_free"), ("interior", "interior"),
                                         ("unknown", "unknown")])
def test_bad_frees(busy, which, kind):
    c, ptrs = busy
    target = {"double": ptrs[2], "interior": ptrs[1] + 512, "unknown": 1 << 45}[which]
    before = _state(c)
    with pytest.raises(InvalidPointerError) as e:
        c.deallocate_raw(target)
    assert e.value.kind == kind and f"{target:#x}" in str(e.value)
    assert _state(c) == before
    for bad, exc in ((-5, ValueError), (1.0, TypeError), ("0x10", TypeError)):
        with pytest.raises(exc):
            c.deallocate_raw(bad)
    c.deallocate_raw(0)
    c.deallocate_raw(None)
    assert _state(c) == before
    check_invariants(c)


def test_lookups_of_dead_pointers(busy):
    c, ptrs = busy
    for f in (c.requested_size, c.allocated_size, c.allocation_id):
        with pytest.raises(InvalidPointerError):
            f(ptrs[2])


def test_exhausted_memory_leaves_live_blocks_alone(busy):
    c, ptrs = busy
    live = {p: c.allocated_size(p) for p in ptrs if p != ptrs[2]}
    with pytest.raises(OutOfMemoryError) as e:
        c.allocate_raw(63 * MiB)
    assert e.value.reason == "limit"
    assert {p: c.allocated_size(p) for p in live} == live
    assert c.memory_stats()["num_ooms"] == 1
    check_invariants(c)


def test_bad_options():
    from numba_bfc import CachingAllocator

    v = VirtualSubAllocator()
    for kwargs, words in (
        ({"memory_limit": -1}, ">= 0"), ({"memory_fraction": 1.5}, r"\(0, 1\]"),
        ({"memory_limit": MiB, "memory_fraction": 0.5}, "not both"),
        ({"max_split_size": "lots"}, "cannot parse"),
        ({"roundup_power2_divisions": 3}, "power of two"),
        ({"garbage_collection_threshold": -0.1}, r"\[0, 1\)"),
    ):
        with pytest.raises(ValueError, match=words):
            CachingAllocator(v, **kwargs)
    with pytest.raises(ValueError, match="known total memory"):
        CachingAllocator(VirtualSubAllocator(), memory_fraction=0.5)
