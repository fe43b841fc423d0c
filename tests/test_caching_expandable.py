"""PyTorch's expandable segments in the caching policy, on the Numba allocator and the
reference oracle: one test per rule (``CUDACachingAllocator.cpp`` at eb42ad6, with
#134338's skips), invariants under random sequences, byte patterns on real host
memory. ``test_caching_differential.py`` compares the two step by step."""

import numpy as np
import pytest
from _support import churn_with_patterns
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from numba_bfc import CachingAllocator, InvalidPointerError, OutOfMemoryError
from numba_bfc.backends import HostSubAllocator, VirtualSubAllocator
from numba_bfc.testing import ReferenceCachingAllocator
from numba_bfc.testing.invariants import check_invariants
from numba_bfc.traces import Trace, replay

MIB = 1 << 20
PAGE = 20 * MIB  # the large pool's page; the small pool's is 2 MiB


@pytest.fixture(params=[CachingAllocator, ReferenceCachingAllocator], ids=["numba", "reference"])
def make(request):
    def build(**options):
        backend = options.pop("backend", None) or VirtualSubAllocator(contiguous=True)
        a = request.param(backend, expandable_segments=True, **options)
        a.record_memory_history()
        return a

    return build


def actions(a):
    return [(e["action"], e["addr"], e["size"]) for e in a.memory_history()]


def test_growth_maps_pages_of_one_segment_instead_of_new_segments(make):
    a = make()
    p1 = a.allocate_raw(3 * MIB)
    p2 = a.allocate_raw(30 * MIB)
    # One reserved range: the second request takes the 17 MiB left of the first
    # page and one more page, right after it.
    assert p2 == p1 + 3 * MIB
    base = p1
    assert [x for x in actions(a) if x[0] == "segment_map"] == [
        ("segment_map", base, PAGE), ("segment_map", base + PAGE, PAGE)]
    stats = a.memory_stats()
    assert stats["reserved_bytes.large_pool.current"] == 2 * PAGE
    assert stats["segment.all.current"] == 0 and stats["segment.all.allocated"] == 0
    assert stats["num_device_alloc"] == 2  # one per mapping, not per segment
    assert not [x for x in actions(a) if x[0] == "segment_alloc"]
    check_invariants(a)


def test_small_pool_pages_are_2_mib_in_their_own_range(make):
    a = make()
    large = a.allocate_raw(3 * MIB)
    small = a.allocate_raw(1000)
    assert abs(small - large) >= PAGE  # another reservation
    assert a.memory_stats()["reserved_bytes.small_pool.current"] == 2 * MIB
    check_invariants(a)


def test_large_blocks_split_down_to_512_bytes_whatever_max_split_size(make):
    a = make(max_split_size=32 * MIB)
    p = a.allocate_raw(45 * MIB)  # an oversize request on 3 pages: the rest splits off
    assert a.allocated_size(p) == 45 * MIB
    q = a.allocate_raw(15 * MIB - 1024)  # leaves 1024 bytes: split all the same
    assert q == p + 45 * MIB and a.allocated_size(q) == 15 * MIB - 1024
    assert a.get_stats().largest_free_block_bytes == 1024  # the bytes left, a block
    assert a.memory_stats()["reserved_bytes.all.current"] == 3 * PAGE
    check_invariants(a)


def test_expandable_blocks_stay_out_of_inactive_split(make):
    a = make()
    p = a.allocate_raw(3 * MIB)
    q = a.allocate_raw(3 * MIB)
    a.deallocate_raw(p)
    stats = a.memory_stats()
    assert stats["inactive_split.all.current"] == 0
    assert stats["inactive_split_bytes.all.current"] == 0
    assert stats["inactive_split.all.allocated"] == 0
    a.deallocate_raw(q)
    check_invariants(a)


def test_empty_cache_unmaps_only_whole_free_pages(make):
    a = make()
    p = a.allocate_raw(3 * MIB)
    q = a.allocate_raw(40 * MIB)  # ends 43 MiB in: the third page is partly used
    a.deallocate_raw(p)
    a.empty_cache()
    # [0, 3) MiB is free but no whole page: nothing to give back.
    assert a.memory_reserved() == 3 * PAGE
    a.deallocate_raw(q)
    a.empty_cache()
    assert a.memory_reserved() == 0
    unmaps = [x for x in actions(a) if x[0] == "segment_unmap"]
    assert unmaps == [("segment_unmap", p, 3 * PAGE)]
    assert a.memory_stats()["num_device_free"] == 1
    assert a.regions() == [] and a.memory_snapshot() == []
    assert a._reservations == {}  # the address space went back too
    check_invariants(a)


def test_partial_pages_at_the_ends_of_a_free_block_stay_mapped(make):
    a = make()
    p = a.allocate_raw(10 * MIB)
    q = a.allocate_raw(45 * MIB)  # [10, 55) MiB
    r = a.allocate_raw(5 * MIB)  # [55, 60) MiB: the third page is whole
    a.deallocate_raw(q)
    a.empty_cache()
    # Only the page [20, 40) MiB lies wholly in the free [10, 55) MiB.
    assert [x for x in actions(a) if x[0] == "segment_unmap"] == [
        ("segment_unmap", p + PAGE, PAGE)]
    assert a.memory_reserved() == 2 * PAGE
    snapshot = a.memory_snapshot()
    assert [(s["address"], s["total_size"]) for s in snapshot] == [(p, PAGE), (p + 2 * PAGE, PAGE)]
    assert all(s["is_expandable"] for s in snapshot)
    # The free pieces on either side are blocks of their own.
    assert [(b["address"], b["size"], b["state"]) for b in snapshot[0]["blocks"]] == [
        (p, 10 * MIB, "active_allocated"), (p + 10 * MIB, 10 * MIB, "inactive")]
    a.deallocate_raw(p)
    a.deallocate_raw(r)
    check_invariants(a)


def test_an_unmapped_hole_is_mapped_again_before_the_range_grows(make):
    a = make()
    p = a.allocate_raw(10 * MIB)
    q = a.allocate_raw(45 * MIB)
    a.allocate_raw(5 * MIB)
    a.deallocate_raw(q)
    a.empty_cache()  # unmaps [20, 40) MiB
    # 25 MiB: the lowest unmapped hole, with the free 10 MiB before it, has room.
    s = a.allocate_raw(25 * MIB)
    assert s == p + 10 * MIB
    assert actions(a)[-2] == ("segment_map", p + PAGE, PAGE)
    check_invariants(a)


def test_best_fit_counts_what_an_expandable_block_can_grow_to(make):
    a = make()
    x = a.allocate_raw(11 * MIB)  # [0, 11)
    a.allocate_raw(2 * MIB)  # [11, 13)
    a.allocate_raw(17 * MIB)  # [13, 30): two pages mapped, [30, 40) free before unmapped space
    a.deallocate_raw(x)
    # By size, 10 MiB fits the free tail (10 MiB) first; but the tail could grow
    # to the whole range and the 11 MiB block after it in size order only to
    # 11 MiB, so PyTorch's walk moves on and takes the 11 MiB block.
    assert a.allocate_raw(10 * MIB) == x
    # The tail is still there, whole, for a request it fits exactly.
    assert a.allocate_raw(10 * MIB) == x + 30 * MIB
    check_invariants(a)


def test_the_walk_past_expandable_blocks_goes_on_into_the_next_size_bin(make):
    # As above, with the block after the tail in size order a power of two
    # larger: in the next of the pool's size bins (CachingAllocator's POOL_BINS).
    a = make()
    x = a.allocate_raw(17 * MIB)  # [0, 17)
    a.allocate_raw(2 * MIB)  # [17, 19)
    a.allocate_raw(11 * MIB)  # [19, 30): [30, 40) free before unmapped space
    a.deallocate_raw(x)
    assert a.allocate_raw(10 * MIB) == x
    assert a.allocate_raw(10 * MIB) == x + 30 * MIB
    check_invariants(a)


def test_address_space_is_reserved_per_pool_and_fits_the_backend_range(make):
    backend = HostSubAllocator(capacity=512 * MIB, contiguous=True)  # 1 GiB of addresses
    a = make(backend=backend)
    a.allocate_raw(3 * MIB)
    a.allocate_raw(1000)
    # PyTorch reserves 1 1/8 of the device memory (576 MiB); a bounded range
    # gives each pool at most half of it, in whole pages: 500 MiB of 20 MiB
    # pages, 512 MiB of 2 MiB pages.
    assert sorted(a._reservations.values()) == [500 * MIB, 512 * MIB]
    start, length = backend.address_space()
    assert all(start <= b and b + n <= start + length for b, n in a._reservations.items())


def test_a_request_larger_than_a_reservation_gets_one_that_holds_it(make):
    backend = HostSubAllocator(capacity=64 * MIB, contiguous=True)  # 128 MiB of addresses
    a = make(backend=backend)
    a.allocate_raw(1000)  # the small pool reserves first
    p = a.allocate_raw(50 * MIB)
    assert a.allocated_size(p) == 50 * MIB
    with pytest.raises(OutOfMemoryError):
        a.allocate_raw(70 * MIB)  # no gap of the range holds it: out of memory
    unbounded = make()
    huge = unbounded.allocate_raw(2 << 50)  # more than the 1.125 PiB default reservation
    assert unbounded.allocated_size(huge) == 2 << 50
    check_invariants(a)


class _FreeingBackend(VirtualSubAllocator):
    """Frees ``victim`` from inside a mapping, as a finalizer freeing an array
    can on the thread that holds the allocator's (reentrant) lock."""

    allocator = victim = None

    def _alloc_at(self, ptr, nbytes):
        if self.victim is not None:
            victim, self.victim = self.victim, None
            self.allocator.deallocate_raw(victim)
        return super()._alloc_at(ptr, nbytes)


def test_a_free_arriving_while_a_block_grows_waits_for_it(make):
    backend = _FreeingBackend(contiguous=True)
    a = make(backend=backend)
    backend.allocator = a
    p1 = a.allocate_raw(3 * MIB)
    p2 = a.allocate_raw(3 * MIB)  # right before the free [6, 20) MiB that will grow
    backend.victim = p2  # freed while the next page is mapped
    q = a.allocate_raw(30 * MIB)
    assert q == p2 + 3 * MIB  # grown from [6, 20), as if p2 were freed after
    assert a.memory_allocated() == 3 * MIB + 30 * MIB
    with pytest.raises(InvalidPointerError):
        a.deallocate_raw(p2)  # it was freed
    a.deallocate_raw(p1)
    a.deallocate_raw(q)
    check_invariants(a)


def test_the_limit_is_checked_against_the_segment_size_then_whole_pages_map(make):
    # PyTorch checks its memory fraction with alloc_size (12 MiB here), then maps
    # a whole 20 MiB page: reserved bytes end above the limit.
    a = make(memory_limit=15 * MIB)
    a.allocate_raw(12 * MIB)
    assert a.memory_reserved() == PAGE > a.memory_limit
    with pytest.raises(OutOfMemoryError):
        a.allocate_raw(12 * MIB)  # 20 + 12 > 15: refused before any mapping
    check_invariants(a)


def test_the_oom_path_unmaps_free_pages_and_retries(make):
    a = make(memory_limit=45 * MIB)
    p = a.allocate_raw(30 * MIB)  # maps 2 pages
    small = a.allocate_raw(1000)  # the small pool: 2 MiB
    a.deallocate_raw(p)
    # 41 MiB: more than the free 40 MiB, and reserved 42 + 41 > 45, so the free
    # pages are unmapped; the retry (2 + 41 <= 45) maps three pages again.
    q = a.allocate_raw(41 * MIB)
    stats = a.memory_stats()
    assert stats["num_alloc_retries"] == 1 and stats["num_device_free"] == 1
    assert q == p and a.memory_reserved() == 3 * PAGE + 2 * MIB
    a.deallocate_raw(q)
    a.deallocate_raw(small)
    check_invariants(a)


def test_release_available_cached_blocks_passes_over_expandable_blocks(make):
    # Before PyTorch's #134338 this asserted (max_split_size_mb with expandable
    # segments); now the oversize release skips them and the OOM path goes on.
    a = make(memory_limit=70 * MIB, max_split_size=32 * MIB)
    p = a.allocate_raw(50 * MIB)
    a.deallocate_raw(p)
    q = a.allocate_raw(60 * MIB)  # the free 60 MiB mapped can serve it directly
    assert q == p
    a.deallocate_raw(q)
    check_invariants(a)


def test_a_failed_mapping_raises_and_keeps_what_was_mapped(make):
    backend = VirtualSubAllocator(contiguous=True)
    a = make(backend=backend)
    p = a.allocate_raw(30 * MIB)  # [0, 40) MiB mapped
    backend.fail_next(3)  # every mapping of this request, and of its retry
    with pytest.raises(OutOfMemoryError):
        a.allocate_raw(60 * MIB)
    assert a.memory_stats()["num_ooms"] == 1
    assert a.allocate_raw(60 * MIB)  # mapping works again
    a.deallocate_raw(p)
    check_invariants(a)


def test_needs_a_backend_that_maps_at_chosen_addresses(caching_impl):
    with pytest.raises(ValueError, match="supports_remap"):
        caching_impl(VirtualSubAllocator(), expandable_segments=True)
    with pytest.raises(ValueError, match="expected true or false"):
        caching_impl(VirtualSubAllocator(contiguous=True), expandable_segments="maybe")


def test_conf_and_settings(monkeypatch, caching_impl):
    monkeypatch.setenv("NUMBA_BFC_CONF", "expandable_segments:true")
    a = caching_impl(VirtualSubAllocator(contiguous=True))
    assert a.expandable_segments and a.snapshot()["allocator_settings"]["expandable_segments"]


@pytest.mark.parametrize("policy", ["caching", "caching-oracle"])
def test_replay_runs_them(policy):
    # Two 30 MiB blocks freed, then 60 MiB: separate segments cannot merge, so
    # the plain policy reserves a third; one expandable range can.
    t = Trace.from_arrays(op=[0, 0, 1, 1, 0, 1], id=[0, 1, 0, 1, 2, 2],
                          size=[30 * MIB, 30 * MIB, 0, 0, 60 * MIB, 0])
    plain = replay(t, policy)
    grown = replay(t, policy, expandable_segments=True)
    assert plain.peak_reserved_bytes == 120 * MIB
    assert grown.peak_reserved_bytes == 3 * PAGE
    assert grown.engine == ("kernel" if policy == "caching" else "python")


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # make: stateless
@given(ops=st.lists(st.tuples(st.sampled_from("aaaf"), st.integers(1, 48 * MIB),
                              st.integers(0, 30)), min_size=1, max_size=60),
       limit=st.sampled_from([None, 64 * MIB, 160 * MIB]))
def test_random_sequences_keep_every_invariant(make, ops, limit):
    a = make(memory_limit=limit)
    live = []
    for op, size, pick in ops:
        if op == "a":
            try:
                live.append(a.allocate_raw(size))
            except OutOfMemoryError:
                a.empty_cache()
        elif live:
            a.deallocate_raw(live.pop(pick % len(live)))
        if pick == 0:
            a.empty_cache()
        check_invariants(a)
    for p in live:
        a.deallocate_raw(p)
    a.empty_cache()
    check_invariants(a)
    assert a.memory_reserved() == 0 and a.backend.bytes_held == 0


def test_byte_patterns_survive_mapping_and_unmapping_on_host_memory(make):
    backend = HostSubAllocator(capacity=512 * MIB, contiguous=True)
    a = make(backend=backend)
    rng = np.random.default_rng(0)
    sizes = [700, 64 << 10, 3 * MIB, 11 * MIB, 25 * MIB]
    churn_with_patterns(a, backend, 300, lambda: int(rng.choice(sizes)), rng,
                        every=25, each=a.empty_cache)
    assert a.memory_stats()["num_device_free"] > 0  # pages went back and came again
    check_invariants(a)
