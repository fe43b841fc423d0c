"""PyTorch's caching-allocator rules, one by one, on the Numba allocator and the oracle."""

import numpy as np
import pytest
from _support import churn_with_patterns

from numba_bfc import BFCAllocator, OutOfMemoryError
from numba_bfc.allocators._options import parse_roundup_divisions
from numba_bfc.backends import HostSubAllocator, VirtualSubAllocator
from numba_bfc.testing.invariants import check_invariants

KiB, MiB = 1 << 10, 1 << 20


def test_round_size_and_pools(caching_impl):
    c = caching_impl(VirtualSubAllocator())
    cases = {1: 512, 512: 512, 513: 1024, 1000: 1024, MiB: MiB, MiB + 1: MiB + 512}
    for n, rounded in cases.items():
        p = c.allocate_raw(n)
        assert c.allocated_size(p) == rounded, n
        assert c.requested_size(p) == n
    s = c.memory_stats()
    # Everything up to 1 MiB shares one 2 MiB small segment; 1 MiB + 1 gets a 20 MiB one.
    assert s["segment.small_pool.current"] == 1
    assert s["reserved_bytes.small_pool.current"] == 2 * MiB
    assert s["segment.large_pool.current"] == 1
    assert s["reserved_bytes.large_pool.current"] == 20 * MiB
    check_invariants(c)


@pytest.mark.parametrize("request_bytes, segment", [
    (1, 2 * MiB), (MiB, 2 * MiB), (MiB + 1, 20 * MiB), (10 * MiB - 512, 20 * MiB),
    (10 * MiB - 1, 10 * MiB),
    (10 * MiB, 10 * MiB), (10 * MiB + 1, 12 * MiB), (33 * MiB, 34 * MiB)])
def test_segment_sizes(caching_impl, request_bytes, segment):
    c = caching_impl(VirtualSubAllocator())
    c.allocate_raw(request_bytes)
    assert c.regions()[0][1] == segment
    assert c.memory_stats()["num_device_alloc"] == 1


def test_roundup_power2_divisions(caching_impl):
    # PyTorch's documented example, at a size where its "size > 512 * d" guard passes:
    # 1200 MiB with 4 divisions rounds to 1280 MiB (steps 1024, 1280, 1536, 1792).
    c = caching_impl(VirtualSubAllocator(), roundup_power2_divisions=4)
    assert c.allocated_size(c.allocate_raw(1200 * MiB)) == 1280 * MiB
    assert c.allocated_size(c.allocate_raw(1024 * MiB)) == 1024 * MiB  # powers of two stay
    # Below the guard, plain 512-byte rounding: 1200 B with 4 divisions is 1536, not 1280.
    assert c.allocated_size(c.allocate_raw(1200)) == 1536
    assert c.allocated_size(c.allocate_raw(3000)) == 3072  # 2048 + one 1024 step


def test_roundup_divisions_table():
    assert parse_roundup_divisions(4) == (4,) * 16
    table = parse_roundup_divisions("[256:1,512:2,>:8]")
    # Intervals are indexed by log2(MiB): entries below 256 MiB take the first
    # value, and, as PyTorch's parser does, ">" fills from the last interval
    # named, overwriting its value (512 MiB gets 8, not 2).
    assert table[:9] == (1,) * 9 and table[9:] == (8,) * 7
    # Also PyTorch's: an entry at index 0 leaves "last index" at 0, so the next
    # entry fills everything below it again.
    assert parse_roundup_divisions("[1:4,64:2]")[:8] == (2,) * 7 + (0,)
    assert parse_roundup_divisions({1: 8, ">": 2}) == (2,) * 16  # the same quirk
    assert parse_roundup_divisions({2: 8, ">": 2}) == (8,) + (2,) * 15
    for bad in (3, "[3:2]", "[256:3]", "x", "[256:1", {256: 3}):
        with pytest.raises(ValueError):
            parse_roundup_divisions(bad)


def test_best_fit_by_size_then_address(caching_impl):
    c = caching_impl(VirtualSubAllocator())
    # Carve one small segment into blocks, then free three of different sizes.
    ps = [c.allocate_raw(n) for n in (4 * KiB, 512, 8 * KiB, 512, 4 * KiB, 512, 2 * KiB, 512)]
    for i in (0, 2, 4, 6):
        c.deallocate_raw(ps[i])
    # 3 KiB: the smallest fits are the two 4 KiB blocks; the lower address wins.
    assert c.allocate_raw(3 * KiB) == ps[0]
    assert c.allocate_raw(3 * KiB) == ps[4]
    assert c.allocate_raw(2 * KiB) == ps[6]
    check_invariants(c)


def test_split_rules(caching_impl):
    c = caching_impl(VirtualSubAllocator())
    # Small pool: any remainder of at least 512 B is split off.
    p = c.allocate_raw(MiB)
    assert c.allocated_size(p) == MiB
    # Large pool: a remainder must exceed 1 MiB to be split off.
    a = c.allocate_raw(19 * MiB)  # 20 MiB segment, remainder exactly 1 MiB: not split
    assert c.allocated_size(a) == 20 * MiB
    b = c.allocate_raw(18 * MiB + 512)  # new segment, remainder 1.5 MiB - 512 B > 1 MiB: split
    assert c.allocated_size(b) == 18 * MiB + 512
    s = c.memory_stats()
    assert s["inactive_split.large_pool.current"] == 1
    assert s["inactive_split_bytes.large_pool.current"] == 20 * MiB - (18 * MiB + 512)
    assert s["inactive_split.small_pool.current"] == 1
    check_invariants(c)


def test_free_merges_and_stats_return_to_zero(caching_impl):
    c = caching_impl(VirtualSubAllocator())
    ps = [c.allocate_raw(n) for n in (1000, 2000, 3000, 5 * MiB, 2 * MiB)]
    for p in (ps[1], ps[0], ps[2], ps[4], ps[3]):
        c.deallocate_raw(p)
    s = c.memory_stats()
    for key in ("allocation", "allocated_bytes", "active", "active_bytes", "inactive_split",
                "inactive_split_bytes", "requested_bytes"):
        assert s[f"{key}.all.current"] == 0, key
    assert s["allocation.all.allocated"] == s["allocation.all.freed"] == 5
    assert s["requested_bytes.all.allocated"] == 1000 + 2000 + 3000 + 7 * MiB
    assert s["segment.all.current"] == 2 and s["reserved_bytes.all.current"] == 22 * MiB
    snap = c.memory_snapshot()
    assert [len(seg["blocks"]) for seg in snap] == [1, 1]  # fully merged
    c.empty_cache()
    s = c.memory_stats()
    assert s["reserved_bytes.all.current"] == 0 and s["num_device_free"] == 2
    assert c.backend.bytes_held == 0


def test_cache_reuse_avoids_backend_calls(caching_impl):
    c = caching_impl(VirtualSubAllocator())
    for _ in range(50):
        ps = [c.allocate_raw(n) for n in (100, 300 * KiB, 4 * MiB, 12 * MiB)]
        for p in ps:
            c.deallocate_raw(p)
    # One small segment and one 20 MiB segment: 4 MiB and then 12 MiB are both
    # carved from the 20 MiB one (best fit takes the 16 MiB remainder).
    assert c.backend.num_allocs == 2
    assert c.memory_stats()["num_device_alloc"] == 2


def test_oversize_rules(caching_impl):
    c = caching_impl(VirtualSubAllocator(), max_split_size=40 * MiB)
    big = c.allocate_raw(50 * MiB)
    c.deallocate_raw(big)
    s = c.memory_stats()
    assert s["oversize_segments.current"] == 1 and s["oversize_allocations.allocated"] == 1
    assert s["max_split_size"] == 40 * MiB
    # Rule 1: a normal request never takes the cached oversize block.
    small = c.allocate_raw(5 * MiB)
    assert not (big <= small < big + 50 * MiB)
    # Rule 2: an oversize request takes it only if it wastes less than 20 MiB.
    assert c.allocate_raw(25 * MiB) != big  # 50 >= 25 + 20
    assert c.allocate_raw(45 * MiB) == big  # 50 < 45 + 20, and oversize blocks are not split
    assert c.allocated_size(big) == 50 * MiB
    check_invariants(c)


def test_oom_path_frees_cached_segments_and_retries(caching_impl):
    backend = VirtualSubAllocator(capacity=60 * MiB)
    c = caching_impl(backend)
    a, b = c.allocate_raw(20 * MiB), c.allocate_raw(20 * MiB)
    c.deallocate_raw(a)
    c.deallocate_raw(b)
    # 30 MiB does not fit the cache and the backend has only 20 MiB left: PyTorch
    # frees every cached unsplit segment, counts a retry and succeeds.
    p = c.allocate_raw(30 * MiB)
    s = c.memory_stats()
    assert s["num_alloc_retries"] == 1 and s["num_device_free"] == 2 and s["num_ooms"] == 0
    assert c.regions() == [(p, 30 * MiB)]
    check_invariants(c)


def test_release_available_cached_blocks_frees_oversize_first(caching_impl):
    backend = VirtualSubAllocator(capacity=80 * MiB)
    c = caching_impl(backend, max_split_size=30 * MiB)
    big, keep = c.allocate_raw(40 * MiB), c.allocate_raw(40 * MiB)
    c.deallocate_raw(big)
    # 34 MiB: the cached 40 MiB block is oversize but within rounding (40 < 34 + 20),
    # so it is reused without any backend call.
    assert c.allocate_raw(34 * MiB) == big
    c.deallocate_raw(big)
    # 5 MiB may not take the oversize block and the backend is full: freeing that
    # one oversize block makes room, with no retry of the whole cache.
    c.allocate_raw(5 * MiB)
    s = c.memory_stats()
    assert s["num_device_free"] == 1 and s["num_alloc_retries"] == 0
    assert sorted(size for _, size in c.regions()) == [20 * MiB, 40 * MiB]
    assert keep in [base for base, _ in c.regions()]
    check_invariants(c)


def test_release_available_walks_down_the_largest_oversize_blocks(caching_impl):
    c = caching_impl(VirtualSubAllocator(capacity=120 * MiB), max_split_size=30 * MiB)
    a, b, keep = (c.allocate_raw(40 * MiB) for _ in range(3))
    c.deallocate_raw(a)
    c.deallocate_raw(b)
    c.allocate_raw(70 * MiB)  # two 40 MiB oversize blocks freed, largest first
    s = c.memory_stats()
    assert s["num_device_free"] == 2 and s["num_alloc_retries"] == 0
    check_invariants(c)


def test_release_available_fails_when_oversize_blocks_are_not_enough(caching_impl):
    # PyTorch's walk needs the released total to reach max(size, max_split_size);
    # when it does not, it reports failure even though it freed blocks, and the
    # full release-and-retry path runs.
    c = caching_impl(VirtualSubAllocator(capacity=100 * MiB), max_split_size=30 * MiB)
    big, _ = c.allocate_raw(40 * MiB), c.allocate_raw(40 * MiB)
    c.deallocate_raw(big)
    c.allocate_raw(60 * MiB)
    s = c.memory_stats()
    assert s["num_device_free"] == 1 and s["num_alloc_retries"] == 1


def test_oom_raises_with_pytorch_facts_and_counts(caching_impl):
    c = caching_impl(VirtualSubAllocator(capacity=64 * MiB))
    ps = [c.allocate_raw(900 * KiB) for _ in range(60)]  # small segments, 2 per segment
    for p in ps[::2]:
        c.deallocate_raw(p)  # half free, but every segment still in use
    before = c.memory_stats()
    with pytest.raises(OutOfMemoryError) as e:
        c.allocate_raw(30 * MiB)
    msg = str(e.value)
    assert "Tried to allocate 30.00MiB" in msg and "reserved but unallocated" in msg
    assert "largest free cached block" in msg and "max_split_size_mb" in msg
    assert e.value.reason == "fragmentation"
    after = c.memory_stats()
    assert after["num_ooms"] == before["num_ooms"] + 1
    assert after["num_alloc_retries"] == before["num_alloc_retries"] + 1
    assert after["allocated_bytes.all.current"] == before["allocated_bytes.all.current"]
    check_invariants(c)


def test_memory_limit_checked_before_the_backend(caching_impl):
    backend = VirtualSubAllocator()
    c = caching_impl(backend, memory_limit=30 * MiB)
    c.allocate_raw(15 * MiB)  # a 16 MiB segment
    with pytest.raises(OutOfMemoryError) as e:
        c.allocate_raw(15 * MiB)
    assert e.value.reason == "limit" and "memory_limit" in str(e.value)
    assert backend.num_failed_allocs == 0  # never asked
    f = caching_impl(VirtualSubAllocator(capacity=100 * MiB), memory_fraction=0.25)
    assert f.memory_limit == 25 * MiB


def test_garbage_collection_releases_oldest_cached_segments(caching_impl):
    c = caching_impl(VirtualSubAllocator(), memory_limit=100 * MiB,
                     garbage_collection_threshold=0.5)
    old = [c.allocate_raw(20 * MiB) for _ in range(3)]  # three 20 MiB segments
    for p in old:
        c.deallocate_raw(p)
    for _ in range(5):  # age the cached blocks: lookups in the large pool
        c.deallocate_raw(c.allocate_raw(19 * MiB))
    # 60 MiB reserved > 50 MiB threshold: before a new segment, GC frees blocks
    # at least as old as the average until 10 MiB are reclaimed.
    c.allocate_raw(40 * MiB)
    s = c.memory_stats()
    assert s["num_device_free"] >= 1 and s["num_alloc_retries"] == 0
    assert s["reserved_bytes.all.current"] <= 100 * MiB
    check_invariants(c)


def test_gc_needs_a_limit():
    from numba_bfc import CachingAllocator
    with pytest.raises(ValueError, match="needs memory_limit"):
        CachingAllocator(VirtualSubAllocator(), garbage_collection_threshold=0.5)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        CachingAllocator(VirtualSubAllocator(), memory_limit=MiB, garbage_collection_threshold=1.5)
    with pytest.raises(ValueError, match="more than 20 MiB"):
        CachingAllocator(VirtualSubAllocator(), max_split_size=20 * MiB)


def test_stats_resets_and_keys(caching_impl):
    c = caching_impl(VirtualSubAllocator())
    p = c.allocate_raw(5 * MiB)
    c.deallocate_raw(p)
    s = c.memory_stats()
    assert list(s) == sorted(s)
    for stat in ("allocation", "allocated_bytes", "segment", "reserved_bytes", "active",
                 "active_bytes", "inactive_split", "inactive_split_bytes", "requested_bytes"):
        for pool in ("all", "small_pool", "large_pool"):
            for field in ("current", "peak", "allocated", "freed"):
                assert f"{stat}.{pool}.{field}" in s
    assert s["max_split_size"] == -1 and s["allocated_bytes.all.peak"] == 5 * MiB
    c.reset_peak_memory_stats()
    assert c.max_memory_allocated() == 0 and c.max_memory_reserved() == 20 * MiB
    c.reset_accumulated_memory_stats()
    s = c.memory_stats()
    assert s["allocation.all.allocated"] == 0 and s["num_device_alloc"] == 0
    assert s["segment.all.current"] == 1
    assert "Allocated memory" in c.memory_summary() and "from large pool" in c.memory_summary()


def test_snapshot_and_history(caching_impl):
    c = caching_impl(VirtualSubAllocator())
    c.record_memory_history(max_entries=4)
    p = c.allocate_raw(1000)
    c.deallocate_raw(p)
    c.empty_cache()
    actions = [e["action"] for e in c.memory_history()]
    # segment_alloc, alloc, free_requested, free_completed, segment_free: the ring
    # buffer keeps the last four.
    assert actions == ["alloc", "free_requested", "free_completed", "segment_free"]
    assert c.memory_history()[0]["size"] == 1000 and c.memory_history()[0]["addr"] == p
    snap = c.snapshot()
    assert snap["segments"] == [] and len(snap["device_traces"][0]) == 4
    c.record_memory_history(enabled=False)
    q = c.allocate_raw(3000)
    seg = c.memory_snapshot()[0]
    assert seg["segment_type"] == "small" and seg["total_size"] == 2 * MiB
    assert seg["allocated_size"] == 3072 and seg["requested_size"] == 3000
    assert seg["blocks"][0] == {"address": q, "size": 3072, "requested_size": 3000,
                                "state": "active_allocated", "frames": []}
    assert seg["blocks"][1]["state"] == "inactive"
    assert c.memory_history() == []


def test_conf_from_environment(monkeypatch, caching_impl):
    monkeypatch.setenv("NUMBA_BFC_CONF", "policy:caching,max_split_size_mb:64,"
                       "roundup_power2_divisions:[256:1,>:4],memory_limit:1GiB,"
                       "garbage_collection_threshold:0.5,allow_growth:true")
    c = caching_impl(VirtualSubAllocator())
    assert c.max_split_size == 64 * MiB and c.memory_limit == 1 << 30
    assert c.roundup_power2_divisions[7] == 1 and c.roundup_power2_divisions[8] == 4
    assert c.garbage_collection_threshold == 0.5
    # The same variable configures BFC, which ignores the caching keys.
    assert BFCAllocator(VirtualSubAllocator()).memory_limit == 1 << 30
    monkeypatch.setenv("NUMBA_BFC_CONF", "max_split_size_mb:10")
    with pytest.raises(ValueError, match="more than 20 MiB"):
        caching_impl(VirtualSubAllocator())
    monkeypatch.setenv("NUMBA_BFC_CONF", "max_split:64")
    with pytest.raises(ValueError, match="unknown key 'max_split'"):
        caching_impl(VirtualSubAllocator())


def test_host_memory_patterns_survive_churn(caching_impl):
    backend = HostSubAllocator()
    c = caching_impl(backend, memory_limit=96 * MiB, max_split_size=24 * MiB)
    rng = np.random.default_rng(0)
    churn_with_patterns(c, backend, 1500, lambda: int(rng.choice(
        [rng.integers(1, 8 * KiB), rng.integers(1, 3 * MiB), rng.integers(1, 30 * MiB)])), rng)
    check_invariants(c)


def test_training_like_workload_needs_few_backend_allocations(caching_impl):
    """A training loop allocates the same activation shapes every step: the cache
    serves all but the first step from segments it already holds."""
    from numba_bfc.demo import training_workload

    backend = VirtualSubAllocator()
    c = caching_impl(backend)
    requests = training_workload(c, steps=20)
    assert requests == 4 + 20 * 16
    # Every segment is allocated during the first step; uncached, each of the
    # 324 requests would be one backend allocation.
    first = caching_impl(VirtualSubAllocator())
    training_workload(first, steps=1)
    assert backend.num_allocs == first.backend.num_allocs <= 12
    assert c.memory_stats()["allocated_bytes.all.current"] > 0  # weights stay
