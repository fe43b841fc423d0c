"""``search`` beside Google's MiniMalloc on hard instances, in the same run.

Run: ``../shared/peers/setup.sh`` once (builds ``bin/minimalloc_run``), then
``PYTHONPATH=. python -m pytest benchmarks/test_bench_planning_minimalloc.py -q
--benchmark-columns=min,rounds --benchmark-sort=name``. Without the binary the
MiniMalloc rows skip.

Instances: MiniMalloc's benchmark kind, 150-250 buffers with sizes and tasks
in units of 1 KiB, greedy plans 1.3-1.5x above the max-live bound:

* ``cut``: a full rectangle cut into buffers (``cut_instance``): the optimum
  is the max-live bound;
* ``gadget``: a cut with four copies of a 7-buffer gadget on top
  (``gadget_instance``): the optimum is 6 gadget units above the bound, 5;
* ``sliced``: long live ranges cut into slices along time
  (``sliced_instance``, 200 buffers): no known optimum, greedy 1.1-1.3x
  above the bound;
* ``packed``: random buffers packed first-fit into a 64 KiB x 200-task box
  (``packed_instance``, 100-200 buffers, occupancy 0.73-0.85): the box is
  the optimum when max-live reaches it (it did on all six), greedy 1.17-1.36x.

* with ``NUMBA_BFC_MINIMALLOC_INSTANCES=DIR``, also every ``*.csv`` there
  (``id,lower,upper,size``; MiniMalloc's own benchmark files, e.g. its
  ``benchmarks/asplos2024/A.1048576.csv``, whose name gives the capacity to
  decide at).

Each side gets 10 s. MiniMalloc answers "is there a plan within the max-live
bound?" (``--capacity``), the question that proves a cut instance optimal;
``search`` minimises with its default node budget under the same cap (its
section search and, beside it, its own offset-order search: MiniMalloc's
method). Figures: docs/planning.md, "Beside MiniMalloc".
``extra_info``: the arena size found, the bound, whether the plan is proven
optimal, and for ``search`` its nodes. Each is timed once (``rounds=1``):
the answer is deterministic, and MiniMalloc's start-up is in its time.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest

from numba_bfc.planning import assign_offsets, read_records
from numba_bfc.planning.bounds import lower_bound
from numba_bfc.planning.instances import (
    cut_instance,
    gadget_instance,
    packed_instance,
    sliced_instance,
)

KIB = 1 << 10
SECONDS = 10
PEERS = Path(__file__).resolve().parents[2] / "shared" / "peers"
MINIMALLOC = PEERS / "bin" / "minimalloc_run"


FILES = Path(os.environ.get("NUMBA_BFC_MINIMALLOC_INSTANCES", "/nonexistent"))


def _instance(family: str, n: int, seed: int):
    if family == "file":
        path = sorted(FILES.glob("*.csv"))[n]
        return read_records(path), None
    if family == "sliced":
        ranges, slices = {0: (10, 20), 1: (25, 8), 2: (40, 5)}[n]
        return sliced_instance(ranges, slices, seed=seed), None
    if family == "packed":
        recs, _ = packed_instance(n, seed=seed)
        box = 64 * KIB  # the packing fits it; when max-live reaches it, it is the optimum
        return recs, box if lower_bound(recs) == box else None
    if family == "cut":
        recs, _ = cut_instance(n, capacity=1024, horizon=1000, seed=seed)
        optimum = 1024 * KIB
    else:
        recs, _ = gadget_instance(n - 28, capacity=1024, horizon=1000, scale=32, seed=seed)
        optimum = (1024 + 6 * 32) * KIB
    recs = recs.copy()
    recs["size"] *= KIB  # bytes in 1 KiB units, as MiniMalloc's benchmarks
    return recs, optimum


CASES = [("cut", n, seed) for n in (150, 200, 250) for seed in (0, 1, 2)] + \
        [("gadget", 200, seed) for seed in (0, 1)] + \
        [("sliced", k, seed) for k in (0, 1, 2) for seed in (0, 1)] + \
        [("packed", n, seed) for n in (100, 150, 200) for seed in (0, 1)] + \
        [("file", k, 0) for k in range(len(sorted(FILES.glob("*.csv"))))]
IDS = [f"sliced{('10x20', '25x8', '40x5')[n]}-{s}" if f == "sliced" else
       f"{f}{n}-{s}" if f != "file" else sorted(FILES.glob("*.csv"))[n].name.split(".")[0]
       for f, n, s in CASES]


def _capacity(family: str, n: int, bound: int) -> int:
    """MiniMalloc's question: a plan within the file's capacity, else within the bound."""
    if family == "file":
        parts = sorted(FILES.glob("*.csv"))[n].name.split(".")
        if len(parts) == 3 and parts[1].isdigit():
            return int(parts[1])
    return bound


@pytest.fixture(scope="module", autouse=True)
def _compiled():
    recs, _ = _instance("cut", 40, 0)
    assign_offsets(recs, "search", node_limit=1000)  # compile outside the timing


@pytest.mark.parametrize("family,n,seed", CASES, ids=IDS)
def test_search(benchmark, family, n, seed):
    recs, optimum = _instance(family, n, seed)
    benchmark.group = IDS[CASES.index((family, n, seed))]
    plan = benchmark.pedantic(assign_offsets, (recs, "search"), {"time_limit": SECONDS},
                              rounds=1, iterations=1)
    stats = plan.search
    benchmark.extra_info.update(height=plan.total_size, bound=int(lower_bound(recs)),
                                optimum=optimum, proven=bool(stats.optimal),
                                nodes=int(stats.nodes), stopped=stats.stopped)
    assert optimum is None or plan.total_size >= optimum


def _minimalloc(path: Path, capacity: int) -> dict:
    done = subprocess.run([str(MINIMALLOC), f"--capacity={capacity}", f"--timeout={SECONDS}",
                           str(path)], capture_output=True, text=True, timeout=SECONDS + 60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.skipif(not MINIMALLOC.exists(), reason="run ../shared/peers/setup.sh first")
@pytest.mark.parametrize("family,n,seed", CASES, ids=IDS)
def test_minimalloc(benchmark, tmp_path, family, n, seed):
    recs, optimum = _instance(family, n, seed)
    benchmark.group = IDS[CASES.index((family, n, seed))]
    path = tmp_path / "buffers.csv"
    lines = ["id,lower,upper,size"] + [
        f"{i},{int(r['first'])},{int(r['last']) + 1},{int(r['size'])}"  # half-open
        for i, r in enumerate(recs)]
    path.write_text("\n".join(lines) + "\n")
    bound = int(lower_bound(recs))
    out = benchmark.pedantic(_minimalloc, (path, _capacity(family, n, bound)), rounds=1,
                             iterations=1)
    benchmark.extra_info.update(height=out.get("height"), bound=bound, optimum=optimum,
                                proven=bool(out.get("optimal_proven")),
                                solved=out["solved"], status=out.get("status", ""))
    assert out["max_live_lb"] == bound
    if out["solved"]:
        assert out["valid"] and out["height"] <= _capacity(family, n, bound)
