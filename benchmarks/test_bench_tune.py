"""``numba-bfc tune`` on 20k-event traces: the whole search beside one candidate's replays.

Run: ``PYTHONPATH=. python -m pytest benchmarks/test_bench_tune.py -q
--benchmark-columns=min,median,rounds``. Warm: the kernels are loaded before
the clock starts. ``extra_info['candidates']`` is how many settings the
search replayed (each: an unlimited replay and a min-limit bisection).
"""

import pytest

from numba_bfc.traces.data import load_bundled
from numba_bfc.traces.synthetic import GENERATORS
from numba_bfc.tune import DEFAULTS, evaluate, tune

TRACES = {"generate_kv_large": lambda: load_bundled("generate_kv_large"),  # 19,692 events
          "bursty": lambda: GENERATORS["bursty"](bursts=50)}  # 19,935 events


@pytest.mark.parametrize("name", TRACES)
def test_tune_whole_search(benchmark, name):
    trace = TRACES[name]()
    benchmark.group = f"tune {name}"
    evaluate(trace, dict(DEFAULTS))  # load the kernels outside the timing
    result = benchmark.pedantic(tune, (trace,), rounds=3)
    benchmark.extra_info["events"] = len(trace)
    benchmark.extra_info["candidates"] = len(result.candidates)
    assert result.best.min_limit <= result.defaults.min_limit


@pytest.mark.parametrize("name", TRACES)
def test_tune_one_candidate(benchmark, name):
    trace = TRACES[name]()
    benchmark.group = f"tune {name}"
    evaluate(trace, dict(DEFAULTS))
    benchmark.pedantic(evaluate, (trace, dict(DEFAULTS)), rounds=5)
    benchmark.extra_info["events"] = len(trace)
