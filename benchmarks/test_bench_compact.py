"""The compact policy against BFC and caching on every bundled trace, side by side.

Run: ``PYTHONPATH=. python -m pytest benchmarks/test_bench_compact.py -q
--benchmark-columns=min,median,rounds``. Each group is one trace; its rows are
the policies, each timing a whole ``replay()`` (a fresh allocator on a
simulated address space included, so the compact policy's page-by-page
growth is in the figure). ``extra_info`` holds events / median seconds and
the ratio of this row's median to BFC's (BFC's median comes from the same
run: the BFC row of each group runs first).
"""

import pytest

from numba_bfc.traces import replay
from numba_bfc.traces.data import bundled_names, load_bundled

TRACES = {name: load_bundled(name) for name in bundled_names()}
POLICIES = ("bfc", "caching", "compact")
_BFC_MEDIAN: dict[str, float] = {}


@pytest.mark.parametrize("name", TRACES)
@pytest.mark.parametrize("policy", POLICIES)
def test_replay(benchmark, name, policy):
    trace = TRACES[name]
    benchmark.group = name
    replay(trace, policy)  # compile or load the kernels outside the timing
    result = benchmark(replay, trace, policy, series_points=1)
    assert result.events == len(trace) and result.ooms == 0
    median = benchmark.stats["median"]
    benchmark.extra_info["mevents_per_s"] = round(len(trace) / median / 1e6, 2)
    if policy == "bfc":
        _BFC_MEDIAN[name] = median
    elif name in _BFC_MEDIAN:
        benchmark.extra_info["vs_bfc"] = round(median / _BFC_MEDIAN[name], 2)
