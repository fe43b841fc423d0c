"""Bad input: a clear exception naming the problem, and the state unchanged."""

import numpy as np
import pytest

from numba_bfc import InvalidPointerError, OutOfMemoryError
from numba_bfc.backends import VirtualSubAllocator
from numba_bfc.testing.invariants import check_invariants

MiB = 1 << 20


@pytest.fixture
def busy(impl):
    a = impl(VirtualSubAllocator(), memory_limit=64 * MiB)
    ptrs = [a.allocate_raw(s) for s in (1000, 300000, 5000, 70)]
    a.deallocate_raw(ptrs[2])
    return a, ptrs


def _snapshot(a):
    return a.memory_map(), a.backend.num_allocs, a.backend.num_frees


@pytest.mark.parametrize(
    "size, exc, words",
    [
        (-1, ValueError, ">= 0"),
        (1.5, TypeError, "float"),
        (3.0, TypeError, "float"),
        ("100", TypeError, "str"),
        (None, TypeError, "NoneType"),
        (True, TypeError, "bool"),
        (np.bool_(True), TypeError, "bool"),
        (np.float64(8.0), TypeError, "float64"),
        (np.int8(-3), ValueError, ">= 0"),
        (64 * MiB + 1, OutOfMemoryError, "larger than the memory limit"),
        (1 << 70, OutOfMemoryError, "larger than the memory limit"),
    ],
)
def test_bad_sizes(busy, size, exc, words):
    a, _ = busy
    before = _snapshot(a)
    with pytest.raises(exc, match=words):
        a.allocate_raw(size)
    assert _snapshot(a) == before
    check_invariants(a)


@pytest.mark.parametrize("size", [np.int32(1000), np.uint64(1000), np.int64(1000)])
def test_numpy_integer_sizes_accepted(busy, size):
    a, _ = busy
    assert a.allocated_size(a.allocate_raw(size)) == 1024


@pytest.mark.parametrize(
    "alignment, exc", [(0, ValueError), (3, ValueError), (-256, ValueError), (384, ValueError),
                       (256.0, TypeError), ("256", TypeError), (1 << 63, ValueError)],
)
def test_bad_alignment(busy, alignment, exc):
    a, _ = busy
    before = _snapshot(a)
    with pytest.raises(exc, match="alignment"):
        a.allocate_raw(100, alignment=alignment)
    assert _snapshot(a) == before


def test_double_free_interior_and_unknown_pointers(busy):
    a, ptrs = busy
    before = _snapshot(a)
    with pytest.raises(InvalidPointerError, match="double free") as e:
        a.deallocate_raw(ptrs[2])
    assert e.value.kind == "double_free"
    with pytest.raises(InvalidPointerError, match="interior pointer") as e:
        a.deallocate_raw(ptrs[1] + 256)
    assert e.value.kind == "interior"
    for bogus in (12345, 1 << 62, ptrs[0] - 10 * MiB):
        with pytest.raises(InvalidPointerError, match="not allocated by this allocator"):
            a.deallocate_raw(bogus)
    for bad, exc in ((-5, ValueError), (1 << 64, ValueError), (1.0, TypeError)):
        with pytest.raises(exc, match="ptr"):
            a.deallocate_raw(bad)
    for query in (a.requested_size, a.allocated_size, a.allocation_id):
        with pytest.raises(InvalidPointerError):
            query(ptrs[2])
        with pytest.raises(InvalidPointerError):
            query(0)
    assert _snapshot(a) == before
    check_invariants(a)


def test_exhausted_memory(impl):
    a = impl(VirtualSubAllocator(), memory_limit=4 * MiB)
    a.allocate_raw(3 * MiB)
    before = _snapshot(a)
    with pytest.raises(OutOfMemoryError) as e:
        a.allocate_raw(2 * MiB)
    assert e.value.reason == "exhausted" and isinstance(e.value, MemoryError)
    assert e.value.num_bytes == 2 * MiB and e.value.stats.bytes_in_use >= 3 * MiB
    assert _snapshot(a) == before


def test_bad_options(impl, monkeypatch):
    backend = VirtualSubAllocator()
    with pytest.raises(ValueError, match="memory_limit is required"):
        impl(backend)
    for kw in ({"memory_limit": -1}, {"memory_limit": 0},
               {"memory_limit": MiB, "fragmentation_fraction": 1.5},
               {"memory_limit": "12 parsecs"}):
        with pytest.raises(ValueError):
            impl(backend, **kw)
    monkeypatch.setenv("NUMBA_BFC_CONF", "allow_growth:false,memory_limit:8MiB,name:env")
    a = impl(backend)
    assert (a.allow_growth, a.memory_limit, a.name) == (False, 8 * MiB, "env")
    b = impl(backend, memory_limit="1GiB", allow_growth=True)  # explicit wins
    assert (b.allow_growth, b.memory_limit, b.name) == (True, 1 << 30, "env")
    monkeypatch.setenv("NUMBA_BFC_CONF", "allow_growth:maybe")
    with pytest.raises(ValueError, match="allow_growth"):
        impl(backend, memory_limit=MiB)
    monkeypatch.setenv("NUMBA_BFC_CONF", "pool_size:1GiB")
    with pytest.raises(ValueError, match="unknown key 'pool_size'"):
        impl(backend, memory_limit=MiB)
