"""Real host memory: every live allocation keeps its own bytes through churn."""

import random

import numpy as np
import pytest

from numba_bfc.backends import HostSubAllocator
from numba_bfc.testing.invariants import check_invariants

MiB = 1 << 20


def _pattern(aid: int, n: int) -> np.ndarray:
    return ((np.arange(n, dtype=np.uint64) * 2654435761 + aid) % 251).astype(np.uint8)


@pytest.mark.parametrize("seed", [0, 1])
def test_patterns_survive_churn(impl, seed):
    backend = HostSubAllocator()
    a = impl(backend, memory_limit=48 * MiB, garbage_collection=True)
    rng = random.Random(seed)
    live = {}
    for step in range(1500):
        if live and rng.random() < 0.45:
            p = rng.choice(list(live))
            aid, n = live.pop(p)
            assert np.array_equal(backend.view(p, n), _pattern(aid, n)), f"corrupted at {p:#x}"
            a.deallocate_raw(p)
        else:
            n = rng.choice([rng.randint(1, 2000), rng.randint(1, 200_000), rng.randint(1, 3 * MiB)])
            align = rng.choice([256, 256, 4096])
            try:
                p = a.allocate_raw(n, alignment=align)
            except MemoryError:
                continue
            assert p % align == 0
            # The whole chunk is writable memory of ours, not only the request.
            backend.view(p, a.allocated_size(p))[:] = 0
            aid = a.allocation_id(p)
            backend.view(p, n)[:] = _pattern(aid, n)
            live[p] = (aid, n)
        if step % 250 == 0:
            check_invariants(a)
    spans = sorted((p, p + a.allocated_size(p)) for p in live)
    assert all(e <= s for (_, e), (s, _) in zip(spans, spans[1:])), "allocations overlap"
    for p, (aid, n) in live.items():
        assert np.array_equal(backend.view(p, n), _pattern(aid, n))
    for p in list(live):
        a.deallocate_raw(p)
    assert a.get_stats().bytes_in_use == 0
    assert a.deallocate_free_regions() and backend.bytes_held == 0


def test_host_backend_rejects_foreign_ranges():
    b = HostSubAllocator(capacity=MiB)
    p, n = b.alloc(4096, 4096)
    assert p % 4096 == 0 and n == 4096
    assert b.alloc(2 * MiB) is None and b.num_failed_allocs == 1
    with pytest.raises(ValueError):
        b.view(p + 4000, 200)
    with pytest.raises(ValueError):
        b.free(p, 100)
    b.free(p, 4096)
    assert b.bytes_held == 0
