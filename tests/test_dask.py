"""numba_bfc.dask with the real engine: a distributed.LocalCluster of 2 worker processes."""

import io
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

distributed = pytest.importorskip("distributed")

from numba_bfc.cli.replay import main as replay_main  # noqa: E402
from numba_bfc.dask import (  # noqa: E402
    NumbaBFCPlugin,
    cluster_snapshots,
    cluster_stats,
    sweep,
    worker_status,
)
from numba_bfc.traces import sweep as local_sweep  # noqa: E402
from numba_bfc.traces import traces_on_cluster  # noqa: E402
from numba_bfc.traces.data import bundled_names, load_bundled  # noqa: E402
from numba_bfc.traces.synthetic import GENERATORS  # noqa: E402

TIMINGS = ("seconds", "compile_seconds", "events_per_second")


def _manager_class_name():
    from numba.cuda.cudadrv import driver

    return driver._memory_manager.__name__ if driver._memory_manager else None


def _environment():
    import os

    return os.environ.get("NUMBA_CUDA_MEMORY_MANAGER")


@pytest.fixture(scope="module")
def client():
    with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                                  dashboard_address=":0") as cluster, \
            distributed.Client(cluster) as c:
        yield c


def test_plugin_selects_numba_bfc_on_every_worker_present_and_future(client):
    before = client.run(worker_status)
    assert all(not s["configured"] for s in before.values())
    client.register_plugin(NumbaBFCPlugin(policy="caching"))
    status = client.run(worker_status)
    assert len(status) == 2
    for s in status.values():
        assert s["configured"] and s["conf"] == {"policy": "caching"}
        assert not s["gpu"] and "no CUDA GPU on this worker" in s["status"]
    assert set(client.run(_manager_class_name).values()) == {"NumbaBFCMemoryManager"}
    assert set(client.run(_environment).values()) == {"numba_bfc"}
    # A worker that joins later is configured too.
    client.cluster.scale(3)
    client.wait_for_workers(3, timeout=60)
    status = client.run(worker_status)
    assert len(status) == 3 and all(s["configured"] for s in status.values())


def test_cluster_stats_without_a_gpu_has_every_worker_and_zero_totals(client, tmp_path):
    stats = cluster_stats(client)
    assert set(stats["workers"]) == set(client.scheduler_info()["workers"])
    assert all(per_device == {} for per_device in stats["workers"].values())
    assert stats["totals"] == {"num_allocs": 0, "bytes_in_use": 0, "bytes_reserved": 0,
                               "devices": 0}
    html = stats._repr_html_()
    assert all(address in html for address in stats["workers"])
    assert html.count("no pool") == len(stats["workers"])
    written = cluster_snapshots(client, tmp_path / "snaps")
    assert len(written) == len(stats["workers"])
    assert {json.loads(p.read_text())["worker"] for p in written} == set(stats["workers"])
    assert all(json.loads(p.read_text())["devices"] == {} for p in written)


def _same(got, expected):
    """Equal replays: every metric but the timings, and the series and addresses."""
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert type(a) is type(b)
        da, db = a.to_dict(), b.to_dict()
        assert {k: v for k, v in da.items() if k not in TIMINGS} == \
            {k: v for k, v in db.items() if k not in TIMINGS}
        if hasattr(a, "series"):
            assert np.array_equal(a.series, b.series)
            assert np.array_equal(a.addresses, b.addresses)


POLICIES = ["bfc", "caching", "compact"]


def test_sweep_of_the_bundled_traces_on_the_cluster_equals_the_local_sweep(client):
    traces = [load_bundled(name) for name in bundled_names()]
    limits = [None, 512 << 20, 64 << 20]
    expected = local_sweep(traces, POLICIES, limits)
    assert any(r.ooms for r in expected) and any(not r.ooms for r in expected)
    _same(sweep(client, traces, POLICIES, limits), expected)
    _same(sweep(client, traces, POLICIES, min_limit=True),
          local_sweep(traces, POLICIES, min_limit=True))


def _cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    code = replay_main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_cli_scheduler_gives_the_local_results_in_the_same_order(client):
    argv = ["bundled:lstm_train", "synthetic:bursty", "--policy", "bfc,compact",
            "--limit", "1GiB,200MiB", "--json"]
    code, out, err = _cli(*argv)
    assert code == 0, err
    expected = json.loads(out)
    for scheduler in (client.scheduler.address, "local:1"):
        code, out, err = _cli(*argv, "--scheduler", scheduler)
        assert code == 0, err
        got = json.loads(out)
        assert [{k: v for k, v in d.items() if k not in TIMINGS} for d in got] == \
            [{k: v for k, v in d.items() if k not in TIMINGS} for d in expected]
        assert "100% Completed" in err  # Dask's progress bar, on stderr
    code, _, err = _cli("bundled:lstm_train", "--scheduler", "tcp://127.0.0.1:9", "--no-progress")
    assert code == 2 and "cannot reach the scheduler" in err


def test_tune_on_the_cluster_equals_the_local_tune(client):
    from numba_bfc.tune import tune

    trace = load_bundled("lstm_train")
    here = tune(trace, knobs=("max_split_size_mb", "roundup_power2_divisions"))
    there = tune(trace, knobs=("max_split_size_mb", "roundup_power2_divisions"), client=client)
    assert there.best == here.best and there.defaults == here.defaults
    assert there.candidates == here.candidates and there.baselines == here.baselines
    assert there.conf == here.conf != "PYTORCH_CUDA_ALLOC_CONF="
    from numba_bfc.cli.tune import main as tune_main

    runs = []
    for extra in ([], ["--scheduler", client.scheduler.address]):
        out, err = io.StringIO(), io.StringIO()
        assert tune_main(["bundled:lstm_train", "--knobs", "expandable_segments", "--json",
                          "--no-progress", *extra], out=out, err=err) == 0, err.getvalue()
        data = json.loads(out.getvalue())
        runs.append((data["recommended"], data["best"]["min_limit"],
                     [c["min_limit"] for c in data["candidates"]]))
    assert runs[0] == runs[1]


async def _die():
    os._exit(1)  # the worker process ends at once, its running replay with it


def test_a_worker_killed_mid_sweep_costs_only_its_tasks(client):
    traces = [GENERATORS["steady_state"](iterations=200, seed=seed) for seed in range(6)]
    expected = local_sweep(traces, POLICIES, [None, 256 << 20])
    done = {}
    runner = threading.Thread(target=lambda: done.update(
        results=sweep(client, traces, POLICIES, [None, 256 << 20])))
    runner.start()
    deadline = time.monotonic() + 60
    busy = []
    while not busy and time.monotonic() < deadline:
        busy = [w for w, keys in client.processing().items()
                if any(str(k).startswith("replay-") for k in keys)]
    assert busy, "no worker ever ran a replay task"
    client.run(_die, workers=busy[:1], wait=False)
    assert "results" not in done  # the sweep was not over when its worker died
    runner.join(120)
    assert not runner.is_alive()
    _same(done["results"], expected)
    while busy[0] in client.scheduler_info()["workers"] and time.monotonic() < deadline:
        time.sleep(0.05)  # the nanny starts a new worker process, at a new address
    assert busy[0] not in client.scheduler_info()["workers"]


def test_a_trace_whose_only_copy_dies_with_its_worker_is_made_again(client):
    """Sweeps take their traces from ``traces_on_cluster``, not from scattered
    data: Dask's active memory manager leaves one copy of data that no waiting
    task needs (scattered data broadcast to every worker too), and a worker
    that dies with the last copy of scattered data loses it for good, failing
    every task that needs it (the flaky failures of the test above)."""
    trace = GENERATORS["steady_state"](iterations=20, seed=7)
    [future] = traces_on_cluster(client, [trace])
    distributed.wait(future)
    holders = list(client.who_has(future)[future.key])
    assert len(holders) == 1
    client.run(_die, workers=holders, wait=False)
    deadline = time.monotonic() + 60
    while holders[0] in client.scheduler_info()["workers"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert np.array_equal(future.result(timeout=60).ops, trace.ops)


def test_unknown_policy_is_refused_before_reaching_a_worker():
    with pytest.raises(ValueError, match="unknown policy 'best'"):
        NumbaBFCPlugin(policy="best")


_KEPT = []


def _allocate_on_device(nbytes):
    from numba import cuda

    _KEPT.append(cuda.device_array(nbytes, dtype="u1"))
    return cuda.current_context().device.id


def _prepend_to_path(folder):
    sys.path.insert(0, folder)


def _cupy_uses_the_pool():
    import cupy

    from numba_bfc import cupy_allocator

    return cupy.cuda.allocator is cupy_allocator


# Stands in for CuPy on the workers: records the allocator the plugin sets.
FAKE_CUPY = """
class _Cuda:
    allocator = None

    def set_allocator(self, allocator):
        self.allocator = allocator


cuda = _Cuda()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or not shutil.which("cc"),
                    reason="the fake CUDA driver needs Linux and a C compiler")
def test_workers_on_the_fake_driver_allocate_and_cluster_stats_counts_their_bytes(
        monkeypatch, tmp_path):
    pytest.importorskip("numba_cuda")
    gpu_dir = Path(__file__).parent / "gpu"
    (tmp_path / "cupy").mkdir()
    (tmp_path / "cupy" / "__init__.py").write_text(FAKE_CUPY)
    # Worker processes inherit the environment: the fake driver's folder and
    # the options a `dask worker` started by hand would have.
    monkeypatch.setenv("NUMBA_BFC_FAKE_CUDA_DIR", str(gpu_dir))
    monkeypatch.setenv("NUMBA_BFC_CONF", "policy:caching")
    monkeypatch.delenv("NUMBA_CUDA_MEMORY_MANAGER", raising=False)
    preload = str(gpu_dir / "dask_fake_cuda.py")
    with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                                  dashboard_address=":0", preload=[preload]) as cluster, \
            distributed.Client(cluster) as c:
        c.run(_prepend_to_path, str(tmp_path))  # the fake CuPy
        c.register_plugin(NumbaBFCPlugin())  # the policy comes from NUMBA_BFC_CONF
        status = c.run(worker_status)
        assert all(s["configured"] and s["gpu"] and s["cupy"] for s in status.values()), status
        assert all("CuPy allocates from the pool" in s["status"] for s in status.values())
        assert set(c.run(_cupy_uses_the_pool).values()) == {True}
        assert set(c.run(_allocate_on_device, 3 << 20).values()) == {0}
        stats = cluster_stats(c)
        assert stats["totals"]["devices"] == 2
        for per_device in stats["workers"].values():
            assert per_device[0]["policy"] == "caching"
            assert per_device[0]["bytes_in_use"] >= 3 << 20
            assert per_device[0]["num_allocs"] >= 1
        assert stats["totals"]["bytes_in_use"] == sum(
            d[0]["bytes_in_use"] for d in stats["workers"].values())
        html = stats._repr_html_()
        assert html.count("<td>caching</td>") == 2 and "total (2 workers)" in html
        written = cluster_snapshots(c, tmp_path / "snapshots")
        assert len(written) == 2
        for path in written:
            snapshot = json.loads(path.read_text())
            pool = snapshot["devices"]["0"]
            assert pool["policy"] == "caching" and pool["stats"]["bytes_in_use"] >= 3 << 20
            blocks = [b for seg in pool["memory"]["segments"] for b in seg["blocks"]]
            assert any(b["state"] == "active_allocated" and b["requested_size"] == 3 << 20
                       for b in blocks)
