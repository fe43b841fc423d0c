"""The compact policy against BFC and caching on every bundled trace, side by side.

Run: ``PYTHONPATH=. python -m pytest benchmarks/test_bench_compact.py -q
--benchmark-columns=min,median,rounds``. Each group is one trace at one limit
(none, or 1.25x its peak live bytes, where the policies' out-of-memory paths
run: releases, defragmenting retries, failures); its rows are the policies,
each timing a whole ``replay()`` (a fresh allocator on a simulated address
space included, so the compact policy's page-by-page growth is in the
figure). ``extra_info`` holds events / median seconds, the failures, and the
ratio of this row's median to BFC's (BFC's median comes from the same run:
the BFC row of each group runs first).
"""

import pytest

from numba_bfc.traces import replay
from numba_bfc.traces.data import bundled_names, load_bundled

TRACES = {name: load_bundled(name) for name in bundled_names()}
POLICIES = ("bfc", "caching", "compact")
_BFC_MEDIAN: dict[str, float] = {}


@pytest.mark.parametrize("factor", [None, 1.25], ids=["unlimited", "1.25x"])
@pytest.mark.parametrize("name", TRACES)
@pytest.mark.parametrize("policy", POLICIES)
def test_replay(benchmark, name, factor, policy):
    trace = TRACES[name]
    limit = int(factor * int(trace.live_bytes().max())) if factor else None
    group = benchmark.group = f"{name} {'unlimited' if factor is None else f'{factor}x'}"
    replay(trace, policy, limit=limit)  # compile or load the kernels outside the timing
    result = benchmark(replay, trace, policy, limit=limit, series_points=1)
    assert result.events == len(trace)
    assert limit is not None or result.ooms == 0
    median = benchmark.stats["median"]
    benchmark.extra_info["mevents_per_s"] = round(len(trace) / median / 1e6, 2)
    benchmark.extra_info["ooms"] = result.ooms
    if policy == "bfc":
        _BFC_MEDIAN[group] = median
    elif group in _BFC_MEDIAN:
        benchmark.extra_info["vs_bfc"] = round(median / _BFC_MEDIAN[group], 2)
