"""The ``search`` offsets strategy against greedy_by_size on cut instances (known optimum),
and on cut instances with gadgets, whose known optimum is above max-live.

Run: ``PYTHONPATH=. python -m pytest benchmarks/test_bench_planning_search.py -q -s
--benchmark-columns=min,median,rounds``. Each group is one instance family
(buffers x share of time cuts, several seeds); ``extra_info`` has the greedy and
search arena sizes over the optimum, the time to reach the optimum and whether
the search proved it. The summary line per family is printed with ``-s``.
"""

import numpy as np
import pytest

from numba_bfc.planning import assign_offsets, lower_bound
from numba_bfc.planning.instances import cut_instance, gadget_instance

CAPACITY = 1 << 20
FAMILIES = [(n, tc) for n in (200, 300, 450) for tc in (0.25, 0.5, 0.75)]
SEEDS = (0, 1, 2)
NODE_LIMIT = 10_000_000  # search budgets are nodes: the same plans on any machine
TIME_CAP = 60.0
GADGET_FAMILIES = [(n, 4) for n in (100, 200, 300)]
SCALE = CAPACITY >> 6  # optimum: CAPACITY + 6 * SCALE; max-live: CAPACITY + 5 * SCALE


@pytest.mark.parametrize("n,time_cuts", FAMILIES)
def test_greedy(benchmark, n, time_cuts):
    benchmark.group = f"n={n} time_cuts={time_cuts}"
    instances = [cut_instance(n, CAPACITY, time_cuts=time_cuts, seed=s)[0] for s in SEEDS]
    sizes = benchmark(lambda: [assign_offsets(r, "greedy_by_size").total_size
                               for r in instances])
    benchmark.extra_info["ratio"] = [round(x / CAPACITY, 3) for x in sizes]


@pytest.mark.parametrize("n,time_cuts", FAMILIES)
def test_search(benchmark, n, time_cuts):
    benchmark.group = f"n={n} time_cuts={time_cuts}"
    instances = [cut_instance(n, CAPACITY, time_cuts=time_cuts, seed=s)[0] for s in SEEDS]
    assign_offsets(instances[0][:20], "search")  # compile or load the kernels
    plans = benchmark.pedantic(
        lambda: [_search(r) for r in instances],
        rounds=1, iterations=1)
    _summarise(benchmark, plans, instances, CAPACITY)


@pytest.mark.parametrize("n,gadgets", GADGET_FAMILIES)
def test_search_gadgets(benchmark, n, gadgets):
    benchmark.group = f"gadgets n={n} k={gadgets}"
    optimum = CAPACITY + 6 * SCALE
    instances = [gadget_instance(n, CAPACITY, gadgets=gadgets, scale=SCALE, seed=s)[0]
                 for s in SEEDS]
    assign_offsets(instances[0][:20], "search")  # compile or load the kernels
    plans = benchmark.pedantic(
        lambda: [_search(r) for r in instances],
        rounds=1, iterations=1)
    live = [lower_bound(r) / optimum for r in instances]
    tight = [lower_bound(r, tight=True) / optimum for r in instances]
    _summarise(benchmark, plans, instances, optimum, max_live=live, tight_bound=tight)
    for p in plans:
        assert p.search.lower_bound <= optimum  # a bound above the known optimum: unsound


def _search(records):
    return assign_offsets(records, "search", node_limit=NODE_LIMIT, time_limit=TIME_CAP)


def _summarise(benchmark, plans, instances, optimum, **ratios):
    """Record and print each plan's greedy and search sizes over the optimum (and
    any other ``ratios``), the time to the optimum and the proofs; check that the
    search never ends above greedy_by_size."""
    ratios.update(greedy=[p.search.greedy_size / optimum for p in plans],
                  search=[p.total_size / optimum for p in plans])
    t_opt = [next((t for t, v in p.search.improvements if v == optimum), None) for p in plans]
    proven = [bool(p.search.optimal) for p in plans]
    benchmark.extra_info["nodes"] = [p.search.nodes for p in plans]
    benchmark.extra_info["stopped"] = [p.search.stopped for p in plans]
    benchmark.extra_info.update({k: [round(x, 3) for x in v] for k, v in ratios.items()})
    benchmark.extra_info.update(
        seconds_to_optimum=[None if t is None else round(t, 2) for t in t_opt], proven=proven)
    means = ", ".join(f"{k} {np.mean(v):.3f}" for k, v in ratios.items())
    print(f"\n{benchmark.group}: {means}, optimal {sum(p.total_size == optimum for p in plans)}/"
          f"{len(plans)} (proven {sum(proven)}), time to optimum "
          f"{benchmark.extra_info['seconds_to_optimum']}, nodes {benchmark.extra_info['nodes']}, "
          f"stopped {benchmark.extra_info['stopped']}")
    for p, r in zip(plans, instances):
        assert p.total_size <= assign_offsets(r, "greedy_by_size").total_size
