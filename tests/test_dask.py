"""numba_bfc.dask with the real engine: a distributed.LocalCluster of 2 worker processes."""

import shutil
import sys
from pathlib import Path

import pytest

distributed = pytest.importorskip("distributed")

from numba_bfc.dask import NumbaBFCPlugin, cluster_stats, worker_status  # noqa: E402


def _manager_class_name():
    from numba.cuda.cudadrv import driver

    return driver._memory_manager.__name__ if driver._memory_manager else None


def _environment():
    import os

    return os.environ.get("NUMBA_CUDA_MEMORY_MANAGER")


@pytest.fixture(scope="module")
def client():
    with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                                  dashboard_address=None) as cluster, \
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


def test_cluster_stats_without_a_gpu_has_every_worker_and_zero_totals(client):
    stats = cluster_stats(client)
    assert set(stats["workers"]) == set(client.scheduler_info()["workers"])
    assert all(per_device == {} for per_device in stats["workers"].values())
    assert stats["totals"] == {"num_allocs": 0, "bytes_in_use": 0, "bytes_reserved": 0,
                               "devices": 0}


def test_unknown_policy_is_refused_before_reaching_a_worker():
    with pytest.raises(ValueError, match="unknown policy 'best'"):
        NumbaBFCPlugin(policy="best")


_KEPT = []


def _allocate_on_device(nbytes):
    from numba import cuda

    _KEPT.append(cuda.device_array(nbytes, dtype="u1"))
    return cuda.current_context().device.id


@pytest.mark.skipif(not sys.platform.startswith("linux") or not shutil.which("cc"),
                    reason="the fake CUDA driver needs Linux and a C compiler")
def test_workers_on_the_fake_driver_allocate_and_cluster_stats_counts_their_bytes(monkeypatch):
    pytest.importorskip("numba_cuda")
    gpu_dir = Path(__file__).parent / "gpu"
    monkeypatch.setenv("NUMBA_BFC_FAKE_CUDA_DIR", str(gpu_dir))  # worker processes inherit it
    monkeypatch.delenv("NUMBA_CUDA_MEMORY_MANAGER", raising=False)
    monkeypatch.delenv("NUMBA_BFC_CONF", raising=False)
    preload = str(gpu_dir / "dask_fake_cuda.py")
    with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                                  dashboard_address=None, preload=[preload]) as cluster, \
            distributed.Client(cluster) as c:
        c.register_plugin(NumbaBFCPlugin(policy="bfc"))
        status = c.run(worker_status)
        assert all(s["configured"] and s["gpu"] for s in status.values()), status
        assert set(c.run(_allocate_on_device, 3 << 20).values()) == {0}
        stats = cluster_stats(c)
        assert stats["totals"]["devices"] == 2
        for per_device in stats["workers"].values():
            assert per_device[0]["bytes_in_use"] >= 3 << 20
            assert per_device[0]["num_allocs"] >= 1
        assert stats["totals"]["bytes_in_use"] == sum(
            d[0]["bytes_in_use"] for d in stats["workers"].values())
