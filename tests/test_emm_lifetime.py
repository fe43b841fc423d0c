"""Block lifetime in the Numba EMM plugin, on CPU: finalizers, slices, OOM, reset,
deferred cleanup, frees from other threads and from inside ``memalloc``.

Each test drives ``NumbaBFCMemoryManager`` over the simulated backend with a
fake context, and checks the allocator's tables with ``check_invariants``.
"""

import gc
import random
import threading
import time
import weakref

import pytest

# numba's deprecated built-in CUDA target or numba-cuda: either runs these tests.
cuda = pytest.importorskip("numba.cuda")
if not hasattr(cuda, "HostOnlyCUDAMemoryManager"):
    pytest.skip("the CUDA simulator has no EMM interface", allow_module_level=True)

from _support import FakeContext, addr, make_manager  # noqa: E402
from numba.cuda.cudadrv import driver as drv  # noqa: E402

from numba_bfc.backends import VirtualSubAllocator  # noqa: E402
from numba_bfc.integrations.numba_emm import (  # noqa: E402
    CudaOutOfMemoryError,
    NumbaBFCMemoryManager,
)
from numba_bfc.testing.invariants import check_invariants  # noqa: E402

MiB = 1 << 20


def _caching_importable():
    try:
        from numba_bfc.allocators.caching import CachingAllocator  # noqa: F401
    except ImportError:
        return False
    return True


POLICIES = [
    "bfc",
    pytest.param("caching", marks=pytest.mark.skipif(
        not _caching_importable(), reason="numba_bfc.allocators.caching not importable yet")),
]


def in_use(mgr):
    return mgr.allocator.get_stats().bytes_in_use


def check(mgr):
    alloc = mgr.allocator  # applies pending frees
    if mgr.policy == "bfc":
        check_invariants(alloc)


def run_with_timeout(fn, seconds=60):
    """Run ``fn`` in a thread; a deadlock fails the test instead of hanging it."""
    errors = []

    def target():
        try:
            fn()
        except BaseException as e:  # re-raised in the test thread
            errors.append(e)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "deadlock: the operation did not finish"
    if errors:
        raise errors[0]


# ---------------------------------------------------------------------- finalizers
@pytest.mark.parametrize("policy", POLICIES)
def test_finalizers_return_blocks_to_the_pool(policy):
    mgr = make_manager(policy=policy)
    blocks = [mgr.memalloc(n) for n in (1000, 5000, 300000, 2 * MiB)]
    addresses = [addr(b) for b in blocks]
    assert len(set(addresses)) == 4
    assert mgr.pending_frees == 0
    del blocks
    # Finalizers only queue; the pool sees the frees at the next operation.
    assert mgr.pending_frees == 4
    assert in_use(mgr) == 0
    assert mgr.pending_frees == 0
    check(mgr)


def test_a_freed_block_is_reused():
    mgr = make_manager()
    a = mgr.memalloc(4096)
    first = addr(a)
    del a
    b = mgr.memalloc(4096)
    assert addr(b) == first
    assert mgr.backend.num_allocs == 1  # one region served both


def test_slices_keep_their_parent_alive():
    mgr = make_manager()
    parent = mgr.memalloc(8192)
    start = addr(parent)
    view = parent.view(1024, 2048)
    del parent
    gc.collect()
    assert mgr.pending_frees == 0
    # Later allocations must not land on the block the view still uses.
    others = [mgr.memalloc(4096) for _ in range(8)]
    for o in others:
        assert addr(o) + 4096 <= start or addr(o) >= start + 8192
    del view
    assert mgr.pending_frees == 1
    del others, o
    assert in_use(mgr) == 0
    check(mgr)


# ---------------------------------------------------------------------- out of memory
@pytest.mark.parametrize("policy", POLICIES)
def test_oom_applies_frees_held_by_reference_cycles_and_retries(policy):
    # 15 MiB blocks: one fits under the 24 MiB limit, two do not (BFC grows a
    # 16 MiB region; the caching policy rounds a 16 MiB segment). The device
    # is larger than the limit, so it is the limit that refuses.
    mgr = make_manager(capacity=64 * MiB, memory_limit=24 * MiB, policy=policy)
    gc.disable()  # keep the cycle alive until the plugin collects it
    try:
        block = mgr.memalloc(15 * MiB)
        cycle = [block]
        cycle.append(cycle)
        del block, cycle
        assert mgr.pending_frees == 0
        again = mgr.memalloc(15 * MiB)
    finally:
        gc.enable()
    assert in_use(mgr) >= 15 * MiB
    assert mgr.backend.bytes_held <= 24 * MiB
    del again
    check(mgr)


def test_oom_without_anything_to_free_raises_and_leaves_the_pool_intact():
    mgr = make_manager(capacity=8 * MiB)
    keep = mgr.memalloc(6 * MiB)
    with pytest.raises(CudaOutOfMemoryError) as info:
        mgr.memalloc(4 * MiB)
    assert info.value.stats.bytes_in_use >= 6 * MiB
    assert mgr.allocator.allocated_size(addr(keep)) >= 6 * MiB
    check(mgr)
    del keep
    assert mgr.memalloc(4 * MiB) is not None


def test_oom_gives_free_regions_back_so_the_pool_can_grow_one_big_region():
    mgr = make_manager(capacity=8 * MiB)
    a = mgr.memalloc(2 * MiB)  # region of 2 MiB
    b = mgr.memalloc(4 * MiB)  # region of 4 MiB
    del a, b
    assert mgr.backend.bytes_held == 6 * MiB
    # 7 MiB fits in neither region, and only 2 MiB remain below the limit:
    # the plugin returns both free regions and grows one 8 MiB region.
    big = mgr.memalloc(7 * MiB)
    assert mgr.backend.num_frees == 2
    assert mgr.allocator.regions() == [(addr(big), 8 * MiB)]
    check(mgr)


def _fragmenting_sequence(mgr):
    """Fill a 62 MiB limit with 1 MiB blocks (regions of 2, 4, 8, 16, 32 MiB),
    keep four, free the rest, then ask for 40 MiB."""
    blocks = [mgr.memalloc(MiB) for _ in range(62)]
    keep = [blocks[i] for i in (0, 2, 9, 50)]
    del blocks
    return keep, mgr.memalloc(40 * MiB)


def test_separate_regions_fragment_where_a_virtual_range_does_not():
    # Separate regions: the free space is split at region boundaries (31 MiB at
    # most), and no region is wholly free, so nothing can be released.
    plain = make_manager(capacity=62 * MiB)
    with pytest.raises(CudaOutOfMemoryError) as info:
        _fragmenting_sequence(plain)
    assert info.value.reason == "fragmentation"
    # One contiguous range: the regions coalesce into one, with a 40 MiB hole
    # from the tail of the 8 MiB region across the 16 MiB one into the 32 MiB one.
    virtual = make_manager(capacity=62 * MiB, contiguous=True, granularity=2 * MiB)
    keep, big = _fragmenting_sequence(virtual)
    (base, size), = virtual.allocator.regions()
    assert size == 62 * MiB
    assert addr(big) == base + 10 * MiB
    check(virtual)
    del keep, big


# ---------------------------------------------------------------------- reset
@pytest.mark.parametrize("policy", POLICIES)
def test_reset_frees_everything_and_ignores_stale_finalizers(policy):
    mgr = make_manager(policy=policy)
    backend = mgr.backend
    old = mgr.memalloc(4096)
    mgr.memalloc(MiB)  # freed at once: queued
    mgr.allocations["host"] = object()  # host-side state of Numba's base class
    mgr.reset()
    assert backend.bytes_held == 0 and backend.mapped_ranges() == []
    assert len(mgr.allocations) == 0  # super().reset() ran
    assert mgr.pending_frees == 0
    # The next block lands where the old one was; the old pointer's finalizer,
    # from before the reset, must not free it.
    new = mgr.memalloc(4096)
    assert addr(new) == addr(old)
    del old  # its finalizer appends to the queue of the allocator the reset discarded
    assert mgr.pending_frees == 0
    assert in_use(mgr) >= 4096  # the new block stays in use
    check(mgr)
    del new
    assert in_use(mgr) == 0


def test_reset_before_initialize_and_twice_is_harmless():
    mgr = NumbaBFCMemoryManager(context=FakeContext(),
                                backend=VirtualSubAllocator(capacity=8 * MiB))
    mgr.reset()
    mgr.reset()
    mp = mgr.memalloc(256)
    assert addr(mp) != 0


# ---------------------------------------------------------------------- defer_cleanup
def test_defer_cleanup_nests_and_holds_frees_until_the_outermost_exit():
    mgr = make_manager(capacity=8 * MiB)
    a = mgr.memalloc(4096)
    first = addr(a)
    with mgr.defer_cleanup():
        assert mgr.deferred and mgr.deallocations.is_disabled
        with mgr.defer_cleanup():
            del a
            b = mgr.memalloc(4096)
            assert addr(b) != first  # a's block is not reused while deferred
        assert mgr.deferred and mgr.pending_frees == 1
        assert mgr.release_unused() is False
        # Out of memory while deferred: frees stay queued, as in Numba's manager.
        with pytest.raises(CudaOutOfMemoryError):
            mgr.memalloc(7 * MiB)
        assert mgr.pending_frees == 1
    assert not mgr.deferred and not mgr.deallocations.is_disabled
    assert mgr.pending_frees == 0
    assert in_use(mgr) == 4096
    del b
    check(mgr)


def test_defer_cleanup_is_undone_when_the_block_raises():
    mgr = make_manager()
    with pytest.raises(KeyError), mgr.defer_cleanup():
        raise KeyError("x")
    assert not mgr.deferred


def test_release_unused_returns_free_regions_to_the_backend():
    mgr = make_manager()
    blocks = [mgr.memalloc(3 * MiB) for _ in range(4)]
    assert mgr.backend.bytes_held > 0
    del blocks
    assert mgr.release_unused() is True
    assert mgr.backend.bytes_held == 0
    check(mgr)


# ---------------------------------------------------------------------- threads, re-entry
@pytest.mark.parametrize("policy", POLICIES)
def test_frees_from_other_threads(policy):
    mgr = make_manager(capacity=256 * MiB, policy=policy)
    handoff = []
    lock = threading.Lock()
    stop = threading.Event()

    def dropper():
        # Drops the last reference in this thread: the finalizer runs here.
        while not stop.is_set() or handoff:
            with lock:
                batch = handoff[:]
                handoff.clear()
            if not batch:
                time.sleep(0.0005)
            del batch

    def allocator(seed):
        rng = random.Random(seed)
        for _ in range(300):
            mp = mgr.memalloc(rng.choice((256, 4096, 70000, MiB)))
            with lock:
                handoff.append(mp)
            del mp

    def scenario():
        droppers = [threading.Thread(target=dropper) for _ in range(2)]
        allocators = [threading.Thread(target=allocator, args=(s,)) for s in range(3)]
        for t in droppers + allocators:
            t.start()
        for t in allocators:
            t.join()
        stop.set()
        for t in droppers:
            t.join()

    run_with_timeout(scenario)
    assert in_use(mgr) == 0
    check(mgr)


def test_finalizer_fired_inside_memalloc_neither_deadlocks_nor_corrupts():
    victims = []

    def drop_victims(nbytes):
        # Called by the backend while the allocator's lock is held, like a
        # garbage collection triggered inside memalloc.
        victims.clear()
        gc.collect()
        return False

    backend = VirtualSubAllocator(capacity=64 * MiB, fail_if=drop_victims)
    mgr = NumbaBFCMemoryManager(context=FakeContext(), backend=backend,
                                memory_limit=64 * MiB)

    def scenario():
        victims.append(mgr.memalloc(MiB))  # first region: 2 MiB
        victims.append(mgr.memalloc(MiB // 2))
        cycle = [mgr.memalloc(4096)]
        cycle.append(cycle)
        del cycle
        big = mgr.memalloc(3 * MiB)  # needs a new region: the hook fires
        assert mgr.pending_frees == 3
        more = mgr.memalloc(MiB)  # drains them
        assert mgr.pending_frees == 0
        assert in_use(mgr) == mgr.allocator.allocated_size(addr(big)) + \
            mgr.allocator.allocated_size(addr(more))
        check(mgr)

    run_with_timeout(scenario)


def test_random_churn_keeps_blocks_disjoint_and_tables_consistent():
    rng = random.Random(1234)
    mgr = make_manager(capacity=128 * MiB, contiguous=True, granularity=2 * MiB)
    live, live_bytes, ooms = {}, 0, 0
    for step in range(1500):
        # Free at random, and always when near the limit, so that out-of-memory
        # (and its garbage collection) stays rare.
        if live and (rng.random() < 0.45 or live_bytes > 80 * MiB):
            live_bytes -= live.pop(rng.choice(list(live))).size
        else:
            size = rng.choice((rng.randrange(1, 4096), rng.randrange(4096, 1 << 20),
                               rng.randrange(1 << 20, 8 << 20)))
            try:
                live[step] = mgr.memalloc(size)
            except CudaOutOfMemoryError:  # fragmentation: possible, but rare here
                ooms += 1
                continue
            live_bytes += size
        if step % 250 == 0:
            check(mgr)
    spans = sorted((addr(m), addr(m) + m.size) for m in live.values())
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))
    check(mgr)
    assert ooms < 10
    live.clear()
    assert in_use(mgr) == 0


def test_manager_and_context_are_not_kept_alive_by_blocks():
    mgr = make_manager()
    mp = mgr.memalloc(4096)
    ref = weakref.ref(mgr)
    ctx_ref = weakref.ref(mgr.context)
    del mgr
    gc.collect()
    assert ref() is None and ctx_ref() is None
    del mp  # the finalizer of an orphaned block is harmless


def test_numba_context_attribute_is_a_weak_proxy():
    mgr = make_manager()
    mp = mgr.memalloc(256)
    assert mp.context.device.id == 0
    assert isinstance(mp.context, weakref.ProxyType)
    assert drv.MemoryPointer is type(mp)
