"""The compact policy behind the Numba EMM plugin, on CPU (fake context,
simulated backends): two spaces, selection through ``NUMBA_BFC_CONF``, OOM
recovery, reset, and random churn."""

import random

import pytest

cuda = pytest.importorskip("numba.cuda")
if not hasattr(cuda, "HostOnlyCUDAMemoryManager"):
    pytest.skip("the CUDA simulator has no EMM interface", allow_module_level=True)

from _support import FakeContext, addr  # noqa: E402

from numba_bfc import CompactAllocator  # noqa: E402
from numba_bfc.backends import VirtualSubAllocator  # noqa: E402
from numba_bfc.integrations.numba_emm import (  # noqa: E402
    CudaOutOfMemoryError,
    NumbaBFCMemoryManager,
)
from numba_bfc.testing.invariants import check_invariants  # noqa: E402

KiB, MiB = 1 << 10, 1 << 20


def spaces(capacity=64 * MiB):
    """A backend factory as the plugin calls it: once per space, each a range of its own."""
    made = []

    def factory(context):
        made.append(VirtualSubAllocator(capacity=capacity, contiguous=True,
                                        base=(1 << 40) * (len(made) + 1)))
        return made[-1]

    return factory, made


def make_manager(limit=32 * MiB, **options):
    factory, made = spaces()
    mgr = NumbaBFCMemoryManager(context=FakeContext(), policy="compact", backend=factory,
                                memory_limit=limit, page_size=64 * KiB, **options)
    mgr.initialize()
    return mgr, made


def test_compact_gets_a_small_space_of_its_own():
    mgr, made = make_manager()
    big = mgr.memalloc(2 * MiB)
    small = [mgr.memalloc(1000) for _ in range(4)]
    alloc = mgr.allocator
    assert isinstance(alloc, CompactAllocator) and alloc.small_backend is not None
    # The small space's first growth takes 1/8 of the pool (4 pages) as headroom.
    assert len(made) == 2 and made[0].bytes_held == 2 * MiB and made[1].bytes_held == 256 * KiB
    assert addr(big) < 2 << 40 <= min(addr(m) for m in small)
    check_invariants(alloc)
    del big, small
    assert mgr.allocator.get_stats().bytes_in_use == 0


def test_numba_bfc_conf_selects_compact_on_virtual_memory(monkeypatch):
    monkeypatch.setenv("NUMBA_BFC_CONF", "policy:compact,page_size:4MiB")
    mgr = NumbaBFCMemoryManager(context=None)
    assert (mgr.policy, mgr._backend_spec) == ("compact", "virtual")
    monkeypatch.setenv("NUMBA_BFC_CONF", "policy:compact,backend:plain")
    assert NumbaBFCMemoryManager(context=None)._backend_spec == "plain"
    with pytest.raises(TypeError, match="compact"):
        NumbaBFCMemoryManager(context=None, policy="compact", allow_growth=True)


def test_an_instance_backend_gives_one_space():
    backend = VirtualSubAllocator(capacity=16 * MiB, contiguous=True)
    mgr = NumbaBFCMemoryManager(context=FakeContext(), policy="compact", backend=backend,
                                memory_limit=16 * MiB, page_size=64 * KiB)
    mp = mgr.memalloc(1000)
    assert mgr.allocator.small_backend is None and backend.bytes_held == 64 * KiB
    del mp
    mgr.reset()
    assert backend.bytes_held == 0


def test_oom_gives_the_other_space_its_free_tail_back():
    mgr, made = make_manager(limit=4 * MiB)
    tiny = [mgr.memalloc(4000) for _ in range(200)]  # ~800 KiB of small space
    del tiny
    assert made[1].bytes_held > 0  # kept: the release threshold is 0
    big = mgr.memalloc(4 * MiB - 64 * KiB)  # fits only once the small tail goes back
    assert made[1].bytes_held == 0 and addr(big) != 0
    with pytest.raises(CudaOutOfMemoryError):
        mgr.memalloc(MiB)
    check_invariants(mgr.allocator)


def test_reset_releases_both_spaces():
    mgr, made = make_manager()
    keep = [mgr.memalloc(3 * MiB), mgr.memalloc(100)]
    mgr.reset()
    assert [b.bytes_held for b in made] == [0, 0]
    assert addr(mgr.memalloc(256)) != 0
    del keep


def test_random_churn_keeps_blocks_disjoint_and_tables_consistent():
    mgr, made = make_manager(limit=48 * MiB)
    rng = random.Random(5)
    live = []
    for step in range(1500):
        if live and rng.random() < 0.48:
            live.pop(rng.randrange(len(live)))
        else:
            size = rng.choice([rng.randint(1, 8 * KiB), rng.randint(1, 3 * MiB)])
            try:
                live.append(mgr.memalloc(size))
            except CudaOutOfMemoryError:
                live = live[len(live) // 2:]
        if step % 300 == 0:
            spans = sorted((addr(m), addr(m) + m.size) for m in live)
            assert all(e <= s for (_, e), (s, _) in zip(spans, spans[1:]))
            check_invariants(mgr.allocator)
    held = sum(b.bytes_held for b in made)
    assert held == mgr.allocator.get_stats().bytes_reserved <= 48 * MiB


def test_reset_releases_the_small_space_even_if_the_large_one_fails():
    class Failing(VirtualSubAllocator):
        def _free(self, ptr, nbytes):
            raise RuntimeError("driver says no")

    made = []

    def factory(context):
        cls = Failing if not made else VirtualSubAllocator
        made.append(cls(capacity=64 * MiB, contiguous=True, base=(1 << 40) * (len(made) + 1)))
        return made[-1]

    mgr = NumbaBFCMemoryManager(context=FakeContext(), policy="compact", backend=factory,
                                memory_limit=32 * MiB, page_size=64 * KiB)
    keep = [mgr.memalloc(2 * MiB), mgr.memalloc(100)]
    with pytest.raises(RuntimeError, match="driver says no"):
        mgr.reset()
    assert made[1].bytes_held == 0 and made[0].bytes_held > 0
    del keep


def test_pages_unmapped_from_the_middle_are_tracked_and_reset_frees_the_rest():
    mgr, made = make_manager()
    a, b, c = (mgr.memalloc(2 * MiB) for _ in range(3))
    base = addr(a)
    del b
    assert mgr.allocator.empty_cache() == 2 * MiB  # a hole between a and c
    assert made[0].mapped_ranges() == [(base, 2 * MiB), (base + 4 * MiB, 2 * MiB)]
    check_invariants(mgr.allocator)
    again = mgr.memalloc(2 * MiB)  # the hole costs no more pages than the top
    assert addr(again) == base + 2 * MiB
    assert mgr.allocator.regions() == [(base, 6 * MiB)]
    mgr.reset()
    assert [x.bytes_held for x in made] == [0, 0] and made[0].mapped_ranges() == []
    del a, c, again


def test_caching_with_expandable_segments_grows_one_range_in_place(monkeypatch):
    backend = VirtualSubAllocator(capacity=256 * MiB, contiguous=True)
    mgr = NumbaBFCMemoryManager(context=FakeContext(), policy="caching", backend=backend,
                                expandable_segments=True)
    a = mgr.memalloc(30 * MiB)
    b = mgr.memalloc(30 * MiB)
    assert addr(b) == addr(a) + 30 * MiB  # one segment, grown by mapping pages
    stats = mgr.allocator.memory_stats()
    assert stats["segment.all.current"] == 0 and stats["reserved_bytes.all.current"] == 60 * MiB
    del a, b
    mgr.reset()
    assert backend.bytes_held == 0
    check_invariants(mgr.allocator)
    # Selected from the environment, expandable segments default to CUDA virtual memory.
    monkeypatch.setenv("NUMBA_BFC_CONF", "policy:caching,expandable_segments:true")
    assert NumbaBFCMemoryManager(context=None)._backend_spec == "virtual"
    assert NumbaBFCMemoryManager(context=None, policy="caching",
                                 expandable_segments=False)._backend_spec == "plain"
