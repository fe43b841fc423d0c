"""Numba device allocation on a GPU: numba_bfc's plugin against the alternatives, side by side.

Each group compares, in one run: numba_bfc (BFC, caching and compact policies,
each with the default ``stream_safety="events"`` and with ``"off"``, so the
cost of event-gated reuse is read off one run), Numba's default manager
(``cuMemAlloc``/``cuMemFree`` per array),
RMM's Numba plugin over an RMM pool (if ``rmm`` is importable) and, for CuPy
arrays, CuPy's own pool (if ``cupy`` is importable). ``extra_info`` records
the memory-management driver calls per round and, for numba_bfc, the events
recorded and queried per round and the pool's reserved bytes. The
``*-interleaved`` groups instead run several managers on one context, taking
turns (``_interleave``), and give their figures in ``extra_info``.

Run: ``python -m pytest -m cuda benchmarks/gpu --benchmark-columns=min,median,mean,rounds
--benchmark-group-by=group`` (skipped without an NVIDIA GPU and numba-cuda). With
``NUMBA_BFC_FAKE_CUDA=1`` the allocation benchmarks run on the fake CUDA driver
(``tests/gpu/fake_libcuda.c``): their driver-call counts are what a GPU would
see, their times are not (the fake's driver calls cost next to nothing).
"""

import contextlib
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pytest

# Share the GPU tests' helpers (context switching, driver-call counting).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "gpu"))
from gpu_support import (  # noqa: E402
    GPU_SKIP,
    KERNEL_SKIP,
    close_cuda,
    count_driver_calls,
    default_numba_context,
    numba_bfc_context,
)

pytestmark = [pytest.mark.cuda, GPU_SKIP]

SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
CYCLES_PER_ROUND = 10  # passes over SIZES per benchmark round
KERNEL_STEPS = 200  # kernel-loop steps per round: two temporaries, two launches each
N = 1 << 20  # float32 elements per kernel temporary (4 MiB)


@contextlib.contextmanager
def rmm_context():
    """A fresh CUDA context whose memory manager is RMM's plugin over an RMM pool."""
    rmm = pytest.importorskip("rmm")
    from numba import cuda
    from numba.cuda.cudadrv import driver as drv
    from rmm.allocators.numba import RMMNumbaManager

    saved = drv._memory_manager
    close_cuda()
    rmm.reinitialize(pool_allocator=True, initial_pool_size=1 << 30)
    try:
        drv._memory_manager = RMMNumbaManager
        yield cuda.current_context()
    finally:
        close_cuda()
        drv._memory_manager = saved
        rmm.reinitialize()


MANAGERS = {
    "numba_bfc-bfc": lambda: numba_bfc_context(policy="bfc", backend="plain"),
    "numba_bfc-bfc-off": lambda: numba_bfc_context(policy="bfc", backend="plain",
                                                   stream_safety="off"),
    "numba_bfc-caching": lambda: numba_bfc_context(policy="caching", backend="plain"),
    "numba_bfc-caching-off": lambda: numba_bfc_context(policy="caching", backend="plain",
                                                       stream_safety="off"),
    "numba_bfc-compact": lambda: numba_bfc_context(policy="compact", backend="virtual"),
    "numba_bfc-compact-off": lambda: numba_bfc_context(policy="compact", backend="virtual",
                                                       stream_safety="off"),
    "numba-default": default_numba_context,
    "rmm-pool": rmm_context,
}


@pytest.fixture(params=list(MANAGERS), ids=list(MANAGERS))
def manager(request):
    with MANAGERS[request.param]() as ctx:
        yield ctx


def _run_rounds(benchmark, fn, rounds):
    from numba import cuda

    fn()  # warm-up: compile kernels, grow pools
    cuda.synchronize()
    mgr = cuda.current_context().memory_manager
    before = mgr.stream_safety_stats() if hasattr(mgr, "stream_safety_stats") else None
    with count_driver_calls() as calls:
        fn()
        cuda.synchronize()
    benchmark.extra_info["driver_calls_per_round"] = sum(calls.values())
    benchmark.extra_info["driver_calls"] = {k: v for k, v in calls.items() if v}
    if before is not None:
        after = mgr.stream_safety_stats()
        benchmark.extra_info["events_recorded_per_round"] = (after.events_recorded
                                                             - before.events_recorded)
        benchmark.extra_info["event_queries_per_round"] = (after.event_queries
                                                           - before.event_queries)
    benchmark.pedantic(fn, rounds=rounds, iterations=1, warmup_rounds=1)
    if before is not None:
        benchmark.extra_info["reserved_bytes"] = mgr.allocator.get_stats().bytes_reserved


@pytest.mark.benchmark(group="device_array-alloc-free-4KiB-64MiB")
def test_device_array_cycles(benchmark, manager):
    """``cuda.device_array`` then drop it, over 4 KiB - 64 MiB, ten passes per round."""
    from numba import cuda

    def cycles():
        for _ in range(CYCLES_PER_ROUND):
            for nbytes in SIZES:
                a = cuda.device_array(nbytes, dtype=np.uint8)
                del a

    benchmark.extra_info["allocations_per_round"] = CYCLES_PER_ROUND * len(SIZES)
    _run_rounds(benchmark, cycles, rounds=30)


@pytest.mark.benchmark(group="memalloc-free-4KiB-64MiB")
def test_memalloc_cycles(benchmark, manager):
    """The memory manager alone: ``Context.memalloc`` then drop the pointer (no array)."""

    def cycles():
        for _ in range(CYCLES_PER_ROUND):
            for nbytes in SIZES:
                p = manager.memalloc(nbytes)
                del p

    benchmark.extra_info["allocations_per_round"] = CYCLES_PER_ROUND * len(SIZES)
    _run_rounds(benchmark, cycles, rounds=30)


def _kernel_loop():
    """The kernel loop's steps: ``run(x, count)`` runs ``count`` steps from
    array ``x``, each allocating two temporaries (``t = 1.5 x + x``, then
    ``y = max(t, 0)``) and dropping ``t`` and the step's input; returns the
    last ``y``."""
    from numba import cuda

    @cuda.jit
    def axpy(x, y, out):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = 1.5 * x[i] + y[i]

    @cuda.jit
    def relu(x, out):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = max(x[i], np.float32(0.0))

    grid, block = (N + 255) // 256, 256

    def run(x, count):
        for _ in range(count):
            t = cuda.device_array(N, dtype=np.float32)
            axpy[grid, block](x, x, t)
            y = cuda.device_array(N, dtype=np.float32)
            relu[grid, block](t, y)
            del t
            x = y
        return x

    return run


@KERNEL_SKIP
@pytest.mark.benchmark(group="kernel-loop-with-temporaries")
def test_kernel_loop_with_temporaries(benchmark, manager):
    """Each step allocates two temporaries, launches two kernels and drops the inputs."""
    from numba import cuda

    run = _kernel_loop()
    state = {"x": cuda.to_device(np.linspace(-1, 1, N, dtype=np.float32))}

    def steps():
        state["x"] = run(state["x"], KERNEL_STEPS)
        cuda.synchronize()

    benchmark.extra_info["allocations_per_round"] = 2 * KERNEL_STEPS
    _run_rounds(benchmark, steps, rounds=10)


@pytest.mark.benchmark(group="cupy-empty-alloc-free-4KiB-64MiB")
@pytest.mark.parametrize("allocator", ["cupy-pool", "numba_bfc"])
def test_cupy_cycles(benchmark, allocator):
    """``cupy.empty`` then drop it: CuPy's default pool vs numba_bfc's shared pool."""
    cupy = pytest.importorskip("cupy")
    from numba_bfc.integrations.cupy import cupy_allocator

    def cycles():
        for _ in range(CYCLES_PER_ROUND):
            for nbytes in SIZES:
                a = cupy.empty(nbytes, dtype=cupy.uint8)
                del a

    with numba_bfc_context(policy="bfc", backend="plain"):
        if allocator == "numba_bfc":
            cupy.cuda.set_allocator(cupy_allocator)
        try:
            benchmark.extra_info["allocations_per_round"] = CYCLES_PER_ROUND * len(SIZES)
            _run_rounds(benchmark, cycles, rounds=30)
        finally:
            cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)
            cupy.get_default_memory_pool().free_all_blocks()


def _interleave(benchmark, ctx, managers, one_round, units, rounds, warmups):
    """Time ``one_round(name)`` under each of ``managers`` in turn, on one context.

    Each benchmark round runs every manager once: round ``k`` takes them in
    their order rotated by ``k // 2``, reversed when ``k`` is odd. So over any
    ``2 * len(managers)`` rounds in a row each one starts twice and follows each
    of its two neighbours: the GPU's and the host's drift, and what one manager
    leaves behind for the next, hit all of them alike, and their figures of
    one round can be paired.

    Parameters
    ----------
    benchmark
        pytest-benchmark's fixture; its timed figure is one whole round.
    ctx
        The CUDA context whose ``memory_manager`` each turn sets (what
        ``cuda.device_array`` allocates from); restored at the end.
    managers : dict
        The memory managers, by name.
    one_round : callable
        ``one_round(name)``: one manager's turn.
    units : int
        What one turn does (allocations), to give figures per unit.
    rounds, warmups : int
        Timed rounds, and untimed rounds before them (pools grown, kernels
        compiled). The timed rounds are balanced when ``warmups`` is even and
        ``rounds`` a multiple of ``2 * len(managers)``.

    Returns
    -------
    dict
        Each manager's microseconds per unit, one figure per timed round, in
        round order.
    """
    names = list(managers)
    per_unit = {name: [] for name in names}
    turns = iter(range(warmups + rounds))

    def one_rotation():
        k = next(turns)
        shift = k // 2 % len(names)
        order = names[shift:] + names[:shift]
        for name in order[::-1] if k % 2 else order:
            ctx.memory_manager = managers[name]
            t0 = time.perf_counter()
            one_round(name)
            per_unit[name].append((time.perf_counter() - t0) * 1e6 / units)

    saved = ctx.memory_manager
    try:
        for _ in range(warmups):
            one_rotation()
        for figures in per_unit.values():
            figures.clear()
        benchmark.pedantic(one_rotation, rounds=rounds, iterations=1)
    finally:
        ctx.memory_manager = saved
    return per_unit


def _bfc_managers(ctx, modes, policies=("bfc", "caching", "compact")):
    """numba_bfc's plugin on ``ctx``: one manager per policy and stream-safety
    mode, named ``"{policy}-{mode}"``."""
    from numba_bfc.integrations.numba_emm import NumbaBFCMemoryManager

    return {f"{policy}-{mode}": NumbaBFCMemoryManager(
                context=ctx, policy=policy, stream_safety=mode,
                backend="virtual" if policy == "compact" else "plain")
            for policy in policies for mode in modes}


@pytest.mark.benchmark(group="stream-safety-overhead-interleaved")
@pytest.mark.parametrize("policy", ["bfc", "caching", "compact"])
@pytest.mark.parametrize("path", ["memalloc", "device_array"])
def test_stream_safety_overhead_interleaved(benchmark, policy, path):
    """What ``stream_safety="events"`` adds per allocation, measured precisely:
    two managers on one context, ``"off"`` and ``"events"``, run the cycles of
    the groups above in turn (``_interleave``); ``extra_info`` holds each one's
    median and the median of the paired differences, per allocation, in
    microseconds."""
    from numba import cuda

    # The context's own manager only stands by: the measured ones take turns.
    with numba_bfc_context(policy="bfc", backend="plain") as ctx:
        mgrs = _bfc_managers(ctx, ("off", "events"), policies=(policy,))

        def one_round(name):
            mgr = mgrs[name]
            for _ in range(CYCLES_PER_ROUND):
                for nbytes in SIZES:
                    if path == "memalloc":
                        p = mgr.memalloc(nbytes)
                    else:
                        p = cuda.device_array(nbytes, dtype=np.uint8)
                    del p

        warmups = 6
        try:
            us = _interleave(benchmark, ctx, mgrs, one_round,
                             units=CYCLES_PER_ROUND * len(SIZES), rounds=100, warmups=warmups)
            off, events = us[f"{policy}-off"], us[f"{policy}-events"]
            diffs = [e - o for e, o in zip(events, off)]
            stats = mgrs[f"{policy}-events"].stream_safety_stats()
            benchmark.extra_info.update(
                off_us=round(statistics.median(off), 3),
                events_us=round(statistics.median(events), 3),
                added_us_median_paired=round(statistics.median(diffs), 3),
                added_us_mean=round(statistics.mean(diffs), 3),
                events_recorded_per_allocation=round(
                    stats.events_recorded / (warmups + len(diffs))
                    / (CYCLES_PER_ROUND * len(SIZES)),
                    4),
                reserved_mib={name: m.allocator.get_stats().bytes_reserved >> 20
                              for name, m in mgrs.items()})
        finally:
            for mgr in mgrs.values():
                mgr.reset()


@KERNEL_SKIP
@pytest.mark.benchmark(group="kernel-loop-interleaved")
def test_kernel_loop_interleaved(benchmark):
    """The kernel loop above with every manager on one context, taking turns
    (``_interleave``): numba_bfc's three policies, each with ``"events"`` and
    ``"off"``, and Numba's default manager. Sequential benchmark rows on a GPU
    drift by up to 2x within a minute; these figures share their minutes.
    ``extra_info``: each manager's median microseconds per allocation (one
    kernel launch for each) and the median of its paired ratios to Numba's default."""
    from numba import cuda
    from numba.cuda.cudadrv.driver import NumbaCUDAMemoryManager

    run = _kernel_loop()
    steps_per_round = KERNEL_STEPS // 4  # seven turns a round: about 60 ms on an H200
    with numba_bfc_context(policy="bfc", backend="plain") as ctx:
        mgrs = _bfc_managers(ctx, ("events", "off"))
        mgrs["numba-default"] = NumbaCUDAMemoryManager(context=ctx)
        # Numba initializes only the manager it made for the context: this one
        # learns the device's memory size here (when to flush its frees).
        mgrs["numba-default"].initialize()
        start = np.linspace(-1, 1, N, dtype=np.float32)
        inputs = {}

        def one_round(name):
            x = inputs.get(name)
            inputs[name] = run(cuda.to_device(start) if x is None else x, steps_per_round)
            cuda.synchronize()

        try:
            us = _interleave(benchmark, ctx, mgrs, one_round,
                             units=2 * steps_per_round, rounds=28, warmups=2)
            default = us["numba-default"]
            benchmark.extra_info.update(
                us_per_allocation={name: round(statistics.median(v), 2)
                                   for name, v in us.items()},
                ratio_to_numba_default={
                    name: round(statistics.median(a / d for a, d in zip(v, default)), 3)
                    for name, v in us.items() if name != "numba-default"})
        finally:
            inputs.clear()
            for mgr in mgrs.values():
                mgr.reset()  # Numba's own manager too: it runs the cuMemFree calls it queued
