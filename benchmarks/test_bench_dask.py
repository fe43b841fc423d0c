"""A replay sweep on a Dask cluster of 2 local worker processes vs one process, side by side.

Run: ``PYTHONPATH=. python -m pytest benchmarks/test_bench_dask.py -q
--benchmark-columns=min,median,rounds``. Needs ``numba_bfc[dask]``.

Each group is one sweep, ``--min-limit`` over 3 policies:

* ``bundled``: the 8 bundled traces (24 tasks of 5-100 ms): small tasks,
  where Dask's per-task cost shows;
* ``synthetic``: the 4 synthetic workloads at 4-20x their default size
  (65k-160k events; 12 tasks of 0.05-0.6 s).

The cluster starts once, outside the timing, and every worker loads the
kernels (a first sweep) before the clock starts; the traces are sent to the
workers inside the timing, as ``numba_bfc.dask.sweep`` does on every call.
"""

import pytest

distributed = pytest.importorskip("distributed")

from numba_bfc.dask import sweep as dask_sweep  # noqa: E402
from numba_bfc.traces import sweep  # noqa: E402
from numba_bfc.traces.data import bundled_names, load_bundled  # noqa: E402
from numba_bfc.traces.synthetic import GENERATORS  # noqa: E402

POLICIES = ("bfc", "caching", "compact")
SWEEPS = {
    "bundled": lambda: [load_bundled(name) for name in bundled_names()],
    "synthetic": lambda: [GENERATORS["steady_state"](iterations=500),
                          GENERATORS["growing_kv_cache"](tokens=2048),
                          GENERATORS["bursty"](bursts=400),
                          GENERATORS["fragmenting"](pairs=640)],
}


@pytest.fixture(scope="module")
def client():
    with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                                  dashboard_address=":0") as cluster, \
            distributed.Client(cluster) as c:
        dask_sweep(c, SWEEPS["bundled"](), POLICIES)  # every worker loads the kernels
        yield c


def _extra(benchmark, traces):
    benchmark.extra_info["traces"] = len(traces)
    benchmark.extra_info["tasks"] = len(traces) * len(POLICIES)
    benchmark.extra_info["events"] = sum(len(t) for t in traces)


@pytest.mark.parametrize("name", SWEEPS)
def test_sweep_in_one_process(benchmark, name):
    traces = SWEEPS[name]()
    benchmark.group = f"min-limit sweep: {name}"
    sweep(traces, POLICIES)  # load the kernels outside the timing
    found = benchmark.pedantic(sweep, (traces, POLICIES), {"min_limit": True}, rounds=3)
    assert len(found) == len(traces) * len(POLICIES)
    _extra(benchmark, traces)


@pytest.mark.parametrize("name", SWEEPS)
def test_sweep_on_2_dask_workers(benchmark, client, name):
    traces = SWEEPS[name]()
    benchmark.group = f"min-limit sweep: {name}"
    found = benchmark.pedantic(dask_sweep, (client, traces, POLICIES), {"min_limit": True},
                               rounds=3)
    assert [m.limit for m in found] == [m.limit for m in sweep(traces, POLICIES,
                                                               min_limit=True)]
    _extra(benchmark, traces)
