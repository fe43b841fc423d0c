"""The simulated and host backends: capacity, contiguity, granularity, failure
injection, and remapping (partial frees, ``alloc_at``)."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from numba_bfc.backends import HostSubAllocator, VirtualSubAllocator


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


PAGE = 64 << 10


def _contiguous(kind):
    if kind == "virtual":
        return VirtualSubAllocator(contiguous=True, granularity=PAGE)
    return HostSubAllocator(64 * PAGE, contiguous=True)


@pytest.mark.parametrize("kind", ["virtual", "host"])
def test_contiguous_backends_unmap_part_of_a_range_and_map_at_an_address(kind):
    b = _contiguous(kind)
    assert b.supports_coalescing and b.supports_remap
    p, n = b.alloc(4 * PAGE, 256)
    b.free(p + PAGE, 2 * PAGE)  # the middle of an allocation: a hole
    assert b.mapped_ranges() == [(p, PAGE), (p + 3 * PAGE, PAGE)]
    assert b.bytes_held == 2 * PAGE and b.num_frees == 1
    assert b.alloc_at(p + PAGE, PAGE) == PAGE
    assert b.mapped_ranges() == [(p, PAGE), (p + PAGE, PAGE), (p + 3 * PAGE, PAGE)]
    assert b.bytes_held == 3 * PAGE and b.num_allocs == 2
    before = (b.mapped_ranges(), b.bytes_held, b.num_allocs, b.num_frees)
    for bad in [(p + 2 * PAGE, 2 * PAGE), (p, PAGE)]:  # overlaps mapped memory
        with pytest.raises(ValueError, match="overlaps"):
            b.alloc_at(*bad)
    with pytest.raises(ValueError, match="mapped"):
        b.free(p + PAGE, 2 * PAGE)  # half of it is the hole
    assert (b.mapped_ranges(), b.bytes_held, b.num_allocs, b.num_frees) == before
    # A new allocation still goes on top, past the hole.
    assert b.alloc(PAGE, 256)[0] == p + 4 * PAGE


def test_virtual_alloc_at_checks_granules_range_capacity_and_failures():
    b = VirtualSubAllocator(contiguous=True, granularity=PAGE, capacity=4 * PAGE)
    p, _ = b.alloc(PAGE, 256)
    with pytest.raises(ValueError, match="granularity"):
        b.alloc_at(p + PAGE + 256, PAGE)
    with pytest.raises(ValueError, match="granularity"):
        b.alloc_at(p - PAGE, PAGE)  # below the range
    with pytest.raises(ValueError, match="granules"):
        b.free(p, PAGE // 2)
    assert b.alloc_at(p + 2 * PAGE, 4 * PAGE) is None  # past the capacity
    b.fail_next()
    assert b.alloc_at(p + 2 * PAGE, PAGE) is None
    assert b.num_failed_allocs == 2 and b.bytes_held == PAGE
    assert b.alloc_at(p + 2 * PAGE, PAGE) == PAGE


def test_host_remapped_pages_keep_the_data_around_them():
    b = HostSubAllocator(8 * PAGE, contiguous=True)
    p, _ = b.alloc(4 * PAGE, 256)
    b.view(p, 4 * PAGE)[:] = 7
    b.free(p + PAGE, 2 * PAGE)
    with pytest.raises(ValueError, match="live"):
        b.view(p, 2 * PAGE)
    assert b.alloc_at(p + PAGE, 2 * PAGE) == 2 * PAGE
    assert (b.view(p, PAGE) == 7).all() and (b.view(p + 3 * PAGE, PAGE) == 7).all()
    # The buffer spans twice the capacity; past its end nothing can be mapped.
    assert b.alloc_at(p + 15 * PAGE, PAGE) == PAGE
    assert b.alloc_at(p + 16 * PAGE, PAGE) is None
    with pytest.raises(ValueError, match="below"):
        b.alloc_at(p - PAGE, PAGE)


def test_backends_that_cannot_remap_say_so():
    for b in (VirtualSubAllocator(), HostSubAllocator(1 << 20)):
        assert not b.supports_remap
        with pytest.raises(NotImplementedError, match="chosen address"):
            b.alloc_at(1 << 40, PAGE)
    b = VirtualSubAllocator()
    p, n = b.alloc(2 * PAGE, 256)
    with pytest.raises(ValueError):
        b.free(p, PAGE)  # part of a region: only whole allocations go back


@given(contiguous=st.booleans(), granularity=st.sampled_from([1, 512, 4096, 2 << 20, 3000]),
       capacity=st.sampled_from([None, 0, 64 << 20, 300 << 20]),
       calls=st.lists(st.tuples(st.integers(1, 50 << 20), st.sampled_from([1, 512, 4 << 20])),
                      max_size=12),
       free_first=st.booleans())
def test_address_lease_predicts_alloc_and_record_leased_is_alloc(contiguous, granularity,
                                                                 capacity, calls, free_first):
    """What a lease says is what alloc does; recording what it placed leaves the
    backend as those alloc calls would."""
    def align_up(x, a):
        return (x + a - 1) // a * a

    real = VirtualSubAllocator(capacity, contiguous=contiguous, granularity=granularity)
    leased = VirtualSubAllocator(capacity, contiguous=contiguous, granularity=granularity)
    for b in (real, leased):  # a freed top region first: the top moves back
        got = b.alloc(4 << 20, 512)
        if free_first and got and not (contiguous and got[0] % granularity):
            b.alloc(1 << 20, 512)
            b.free(*got)
    placed = []
    lease = leased.address_lease()
    top, room = lease.top, lease.room
    for nbytes, alignment in calls:
        got = real.alloc(nbytes, alignment)
        received = align_up(nbytes, lease.granularity)
        if received > room:
            assert got is None
            continue
        ptr = align_up(top + lease.gap, max(alignment, lease.alignment))
        assert got == (ptr, received)
        placed.append(got)
        top, room = ptr + received, room - received
    leased.record_leased([p for p, _ in placed], [n for _, n in placed])
    for name in ("num_allocs", "bytes_held", "peak_bytes_held"):
        assert getattr(leased, name) == getattr(real, name), name
    assert leased.mapped_ranges() == real.mapped_ranges()
    assert leased.address_lease() == real.address_lease()
    for p, n in placed:  # the recorded regions free as allocated ones do
        outcomes = []
        for b in (leased, real):
            try:
                b.free(p, n)
                outcomes.append(None)
            except ValueError as e:  # contiguous: not whole granules
                outcomes.append(str(e))
        assert outcomes[0] == outcomes[1]
    assert leased.mapped_ranges() == real.mapped_ranges()


def test_no_address_lease_while_failures_are_injected_or_a_subclass_places():
    b = VirtualSubAllocator()
    assert b.address_lease() is not None
    b.fail_next()
    assert b.address_lease() is None
    b.alloc(512)
    assert b.address_lease() is not None
    assert VirtualSubAllocator(fail_if=lambda n: False).address_lease() is None

    class Elsewhere(VirtualSubAllocator):
        def _alloc(self, nbytes, alignment):
            return super()._alloc(nbytes, alignment * 2)

    class Counted(VirtualSubAllocator):
        def alloc(self, nbytes, alignment=256):
            return super().alloc(nbytes, alignment)

    assert Elsewhere().address_lease() is None
    assert Counted().address_lease() is None
    assert HostSubAllocator().address_lease() is None
    with pytest.raises(NotImplementedError, match="no address lease"):
        HostSubAllocator().record_leased([1 << 20], [512])


def test_record_leased_refuses_an_empty_region():
    """An empty range would leave the map a walk that never ends (found when a
    policy recorded a segment it had already given back)."""
    b = VirtualSubAllocator()
    with pytest.raises(ValueError, match="sizes must not be 0"):
        b.record_leased([1 << 40, (1 << 40) + (2 << 20)], [2 << 20, 0])
    assert b.num_allocs == 0 and b.mapped_ranges() == []


def _record(b):
    return (b.num_allocs, b.num_frees, b.num_failed_allocs, b.bytes_held, b.peak_bytes_held,
            b.mapped_ranges(), b.address_lease())


@given(contiguous=st.booleans(), granularity=st.sampled_from([1, 512, 2 << 20]),
       capacity=st.sampled_from([None, 64 << 20]),
       held_before=st.integers(0, 3),
       steps=st.lists(st.tuples(st.booleans(), st.integers(1, 8 << 20), st.integers(0, 99)),
                      max_size=30))
def test_a_lease_log_that_gives_regions_back_is_alloc_and_free(contiguous, granularity,
                                                               capacity, held_before, steps):
    """A holder that gives regions back and leases on: the lease after the
    frees (``lease_fall_back``'s arithmetic: the top falls back to the highest
    region still held, or the floor, and the room grows) says where alloc puts
    the next region, and ``record_leased`` of the whole log, frees included,
    leaves the backend as the alloc and free calls would."""
    def align_up(x, a):
        return (x + a - 1) // a * a

    real = VirtualSubAllocator(capacity, contiguous=contiguous, granularity=granularity)
    leased = VirtualSubAllocator(capacity, contiguous=contiguous, granularity=granularity)
    held = []  # (base, size) of the holder's regions, in the order made
    for b in (real, leased):  # regions held before the lease
        for _ in range(held_before):
            b.alloc(1 << 20, 512)
    held = [(p, e - p) for p, e in ((p, p + n) for p, n in real.mapped_ranges())]
    lease = leased.address_lease()
    top, room, floor = lease.top, lease.room, lease.floor
    bases, sizes = [], []
    for make, nbytes, pick in steps:
        whole = [(p, n) for p, n in held
                 if not (contiguous and (p % granularity or n % granularity))]
        if not make and whole:
            p, n = whole[pick % len(whole)]
            held.remove((p, n))
            real.free(p, n)
            bases.append(p)
            sizes.append(-n)
            top = max([floor] + [q + m for q, m in held])  # lease_fall_back
            room += n
            continue
        got = real.alloc(nbytes, 512)
        received = align_up(nbytes, lease.granularity)
        if received > room:
            assert got is None
            continue
        ptr = align_up(top + lease.gap, max(512, lease.alignment))
        assert got == (ptr, received)
        held.append(got)
        bases.append(ptr)
        sizes.append(received)
        top, room = ptr + received, room - received
    failed = real.num_failed_allocs
    leased.record_leased(bases, sizes)
    leased.num_failed_allocs = failed  # the holder saw those failures, not the backend
    assert _record(leased)[:-1] == _record(real)[:-1]
    if capacity is not None:  # unbounded, the room is the lease's arithmetic limit
        assert leased.address_lease() == real.address_lease()
        assert (real.address_lease().top, real.address_lease().room) == (top, room)


def test_a_lease_log_refuses_to_give_back_what_is_not_one_whole_region():
    b = VirtualSubAllocator()
    p, n = b.alloc(4 << 20, 512)
    before = _record(b)
    lease = b.address_lease()
    q = lease.top + lease.gap  # where the next region goes
    for bases, sizes in (([p], [-(n // 2)]),  # part of a region
                         ([p, p], [-n, -n]),  # one region given back twice
                         ([q, q], [2 << 20, -(4 << 20)]),  # the wrong size
                         ([p + 512], [-n])):  # not a region's start
        with pytest.raises(ValueError, match="not one whole region held"):
            b.record_leased(bases, sizes)
        assert _record(b) == before
    b.record_leased([q, p], [2 << 20, -n])
    assert b.mapped_ranges() == [(q, 2 << 20)] and (b.num_allocs, b.num_frees) == (2, 1)


@given(granularity=st.sampled_from([1, 4096]), held_before=st.integers(0, 3),
       steps=st.lists(st.tuples(st.sampled_from(["alloc", "alloc_at", "free"]),
                                st.integers(1, 8), st.integers(0, 10**6)), max_size=40))
def test_a_lease_log_that_gives_granules_back_from_a_contiguous_space_is_the_calls(
        granularity, held_before, steps):
    """On a contiguous space a free in the log may cut mapped ranges, as
    ``free`` may (the compact policy's pages given back from the middle), and
    a region may be placed into a hole, as ``alloc_at`` does: ``record_leased``
    of such a log leaves the backend as the calls themselves."""
    g = 4096  # what both are counted in: whole granules of either granularity
    real, leased = (VirtualSubAllocator(contiguous=True, granularity=granularity)
                    for _ in range(2))
    for b in (real, leased):
        for _ in range(held_before):
            b.alloc(4 * g, 256)
    bases, sizes = [], []
    for kind, pages, pick in steps:
        mapped = real.mapped_ranges()
        holes = [(p + n, q - p - n) for (p, n), (q, _) in zip(mapped, mapped[1:]) if q > p + n]
        if kind == "free" and mapped:
            start, size = mapped[pick % len(mapped)]
            lo = start + (pick // 7 % (size // g)) * g
            hi = min(lo + pages * g, start + size)
            real.free(lo, hi - lo)
            bases.append(lo)
            sizes.append(lo - hi)
        elif kind == "alloc_at" and holes:
            at, room = holes[pick % len(holes)]
            n = min(pages * g, room)
            assert real.alloc_at(at, n) == n
            bases.append(at)
            sizes.append(n)
        else:
            ptr, received = real.alloc(pages * g, 256)
            bases.append(ptr)
            sizes.append(received)
    if bases:
        leased.record_leased(bases, sizes)
    assert _record(leased) == _record(real)


def test_a_contiguous_lease_log_refuses_to_give_back_what_is_not_mapped():
    b = VirtualSubAllocator(contiguous=True, granularity=4096)
    p, n = b.alloc(8 * 4096, 256)
    b.free(p + 4096, 4096)  # a hole
    before = _record(b)
    for bases, sizes, match in (([p], [-2 * 4096], "not inside mapped memory"),
                                ([p + 2 * 4096, p + 2 * 4096], [-4096, -2 * 4096],
                                 "not inside mapped memory"),  # the second meets the first
                                ([p + n], [-4096], "not inside mapped memory"),
                                ([p + 2 * 4096], [-100], "not whole granules")):
        with pytest.raises(ValueError, match=match):
            b.record_leased(bases, sizes)
        assert _record(b) == before
    b.record_leased([p + 4096, p + 2 * 4096], [4096, -2 * 4096])  # fill the hole, cut above
    assert b.mapped_ranges() == [(p, 4096), (p + 4096, 4096), (p + 4 * 4096, 4 * 4096)]


def test_a_contiguous_lease_log_refuses_regions_placed_over_mapped_memory():
    """Found in review: a placement in a log that also gives memory back went
    into the map unchecked, over mapped memory or off the granules."""
    b = VirtualSubAllocator(contiguous=True, granularity=4096)
    p, n = b.alloc(2 * 4096, 256)
    before = _record(b)
    for bases, sizes, match in (([p + 4096, p], [4096, -4096], "overlaps mapped memory"),
                                ([p + n + 100, p], [4096, -4096], "not whole granules"),
                                ([p - 4096, p], [4096, -4096], "not whole granules")):
        with pytest.raises(ValueError, match=match):
            b.record_leased(bases, sizes)
        assert _record(b) == before


def test_a_lease_log_of_int64_arrays_does_not_wrap():
    """Sizes and bases as int64 arrays are taken as Python ints: a region
    ending past 2**63 does not wrap the backend's top negative."""
    b = VirtualSubAllocator(contiguous=True)
    p, _ = b.alloc(8192, 256)
    b.record_leased(np.array([p, 2**62], dtype=np.int64),
                    np.array([-4096, 2**62], dtype=np.int64))
    assert b.mapped_ranges() == [(p + 4096, 4096), (2**62, 2**62)]
    assert type(b.bytes_held) is int and b.bytes_held == 4096 + 2**62
    assert b.address_lease() is None  # its top is past what a lease covers
