"""The demo behind ``python -m numba_bfc demo``: a BFC allocator at work, on CPU."""

from __future__ import annotations

import random
import time

from . import BFCAllocator, OutOfMemoryError
from .allocators import POLICIES
from .backends import VirtualSubAllocator
from .stats import format_bytes


def _gpu_available() -> bool:
    try:
        from numba import cuda

        return bool(cuda.is_available())
    except Exception:  # no numba-cuda, no driver: CPU only
        return False


# An MNIST-sized convolutional net, batch 64, float32: (weight bytes, output
# activation bytes) per layer (conv 32, conv 64, max-pool, fc 128, fc 10).
_MNIST_LAYERS = (
    (32 * 1 * 3 * 3 * 4, 64 * 32 * 26 * 26 * 4),
    (64 * 32 * 3 * 3 * 4, 64 * 64 * 24 * 24 * 4),
    (0, 64 * 64 * 12 * 12 * 4),
    (9216 * 128 * 4, 64 * 128 * 4),
    (128 * 10 * 4, 64 * 10 * 4),
)
_MNIST_INPUT = 64 * 1 * 28 * 28 * 4


def training_workload(allocator, steps: int = 20, layers=_MNIST_LAYERS,
                      input_bytes: int = _MNIST_INPUT) -> int:
    """Drive ``allocator`` like a training loop; return how many allocations it made.

    Weights are allocated once and stay live. Each step allocates the input
    batch and every layer's activation (forward), then walks back allocating
    each gradient, freeing activations as they are consumed and weight
    gradients after the update, as a framework's autograd does.
    """
    requests = 0

    def alloc(n):
        nonlocal requests
        requests += 1
        return allocator.allocate_raw(n)

    for w, _ in layers:
        if w:
            alloc(w)
    for _ in range(steps):
        acts = [alloc(input_bytes)] + [alloc(a) for _, a in layers]
        grad_out = alloc(layers[-1][1])
        for i in range(len(layers) - 1, -1, -1):
            in_bytes = input_bytes if i == 0 else layers[i - 1][1]
            grad_w = alloc(layers[i][0]) if layers[i][0] else 0
            grad_in = alloc(in_bytes)
            allocator.deallocate_raw(acts[i + 1])
            allocator.deallocate_raw(grad_out)
            if grad_w:
                allocator.deallocate_raw(grad_w)
            grad_out = grad_in
        allocator.deallocate_raw(grad_out)
        allocator.deallocate_raw(acts[0])
    return requests


def _gpu_part() -> None:
    """Numba kernels on a numba_bfc pool: arrays, a kernel, the pool's stats."""
    import numpy as np
    from numba import cuda

    from .integrations.numba_emm import current_allocator, use_numba_bfc

    use_numba_bfc(policy="bfc", backend="virtual")
    cuda.close()  # contexts created from now on use the plugin

    @cuda.jit
    def axpy(out, a, x, y):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = a * x[i] + y[i]

    n = 1 << 22
    t0 = time.perf_counter()
    x = cuda.to_device(np.arange(n, dtype=np.float32))
    y = cuda.to_device(np.ones(n, dtype=np.float32))
    out = cuda.device_array_like(x)
    for _ in range(10):
        tmp = cuda.device_array(n // 2, dtype=np.float32)  # churn: freed at once
        del tmp
    axpy[(n + 255) // 256, 256](out, np.float32(2.0), x, y)
    result = out.copy_to_host()
    elapsed = time.perf_counter() - t0
    ok = bool(np.array_equal(result, 2.0 * np.arange(n, dtype=np.float32) + 1.0))
    alloc = current_allocator()
    print(f"axpy on {n} floats through the pool: {'correct' if ok else 'WRONG'} "
          f"({elapsed * 1e3:.0f} ms incl. compile)")
    print(alloc.get_stats().debug_string())
    print(alloc.render_occupancy(80))
    if not ok:
        raise RuntimeError("the kernel's result is wrong")


_POLICIES = tuple(POLICIES)
_GPU_SCALE = 64 << 20  # peak live bytes from which a 2 MiB page is a fair granularity


def _replay_part() -> None:
    """Bundled real traces through every policy: the comparison, the smallest
    workable memory limits, and the occupancy at a peak."""
    from .traces import Trace, make_allocator, min_limit, replay
    from .traces.data import bundled_names, load_bundled
    from .traces.tables import format_min_limits, format_table

    traces = [load_bundled(n) for n in bundled_names()]
    if not traces:  # a source checkout without the data files
        from .traces.synthetic import steady_state

        traces = [steady_state()]
    # Load (or compile) the kernels first, so the table's events/s are the replays'.
    t0 = time.perf_counter()
    for policy in _POLICIES:
        replay(traces[0], policy)
    print(f"first replays (compile or cache load): {time.perf_counter() - t0:.2f} s")
    results = [replay(t, p, offline=True) for t in traces for p in _POLICIES]
    print(format_table(results))
    print("(Mevents/s: one short replay each, noisy; see benchmarks/test_bench_compact.py)")
    big = [t for t in traces if t.peak_requested_bytes >= _GPU_SCALE]
    if big:
        t0 = time.perf_counter()
        found = [min_limit(t, p) for t in big for p in _POLICIES]
        print(f"\nSmallest memory limit with no OOM, by bisection "
              f"({time.perf_counter() - t0:.1f} s):")
        print(format_min_limits(found))
    trace = big[0] if big else traces[0]
    peak = int(trace.live_bytes().argmax())
    at_peak = Trace(trace.events[: peak + 1], trace.name)
    for policy in _POLICIES:
        alloc = make_allocator(policy)
        replay(at_peak, alloc)
        print(f"\n{trace.name} / {policy} at the trace's peak (event {peak}): "
              f"{format_bytes(alloc.get_stats().bytes_in_use)} in use of "
              f"{format_bytes(alloc.get_stats().bytes_reserved)} reserved")
        print(alloc.render_occupancy(80))


def run(num_ops: int = 20000, seed: int = 0, memory_limit: int = 256 << 20) -> int:
    """The README's main job: Numba kernels on the pool when there is a GPU;
    bundled real traces through both policies; a random BFC workload."""
    print("numba_bfc demo: TensorFlow's BFC and PyTorch's caching policy as Numba kernels")
    status = 0
    if _gpu_available():
        print("\n== GPU: Numba arrays and kernels on a numba_bfc pool ==")
        try:
            _gpu_part()
        except Exception as e:  # report it, and still show the CPU part
            print(f"GPU part failed: {type(e).__name__}: {e}")
            status = 1
    else:
        print("\nNo GPU: skipping the Numba-kernels part; everything below runs on the CPU "
              "(simulated address space).")
    print("\n== Real PyTorch traces replayed through the bfc, caching and compact policies ==")
    _replay_part()
    print("\n== A random workload on a BFC allocator ==")
    _random_part(num_ops, seed, memory_limit)
    return status


def _random_part(num_ops: int, seed: int, memory_limit: int) -> None:
    """Drive a BFC allocator on the simulated backend and print what it did."""
    alloc = BFCAllocator(VirtualSubAllocator(), memory_limit=memory_limit, name="demo")
    rng = random.Random(seed)
    live: list[int] = []
    t0 = time.perf_counter()
    alloc.allocate_raw(256)  # first call compiles or loads the kernels
    t_first = time.perf_counter() - t0
    ooms = 0
    t0 = time.perf_counter()
    for _ in range(num_ops):
        if live and rng.random() < 0.48:
            alloc.deallocate_raw(live.pop(rng.randrange(len(live))))
        else:
            size = int(rng.lognormvariate(10, 2.0)) + 1
            try:
                live.append(alloc.allocate_raw(size))
            except OutOfMemoryError:
                ooms += 1
    elapsed = time.perf_counter() - t0
    s = alloc.get_stats()
    print(f"first call (compile or cache load): {t_first * 1e3:.0f} ms")
    print(f"{num_ops} random allocate/free calls in {elapsed * 1e3:.0f} ms "
          f"({elapsed / num_ops * 1e6:.2f} us per call), {ooms} out-of-memory")
    print(f"live allocations: {len(live)}, regions: {len(alloc.regions())}")
    print(s.debug_string())
    print("occupancy ('*' requested, 'x' rounding/unsplit waste, '_' free):")
    print(alloc.render_occupancy())
    try:
        alloc.allocate_raw(memory_limit)
    except OutOfMemoryError as e:
        print(f"asking for the whole limit: OutOfMemoryError ({e.reason}); "
              f"largest free block {format_bytes(e.stats.largest_free_block_bytes)}")
