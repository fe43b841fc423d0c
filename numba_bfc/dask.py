"""numba_bfc on every Dask worker, and the cluster's allocator statistics.

Needs the ``dask`` extra (``distributed``). Register the plugin once; Dask
runs it on every worker present and on every worker that joins later::

    from distributed import Client
    from numba_bfc.dask import NumbaBFCPlugin, cluster_stats, worker_status

    client = Client("tcp://scheduler:8786")
    client.register_plugin(NumbaBFCPlugin(policy="caching"))
    client.run(worker_status)   # what the plugin did on each worker
    cluster_stats(client)       # every worker's pools, and the totals

The plugin selects numba_bfc as Numba's memory manager in the worker process
(``use_numba_bfc``). It has to run before the worker's first CUDA context:
a worker that already made one (dask-cuda workers do at start-up) keeps its
manager for that context, and the status says so. Options the plugin is
not given come from the worker's ``NUMBA_BFC_CONF``, so workers started by
hand (``dask worker ...``) can be configured in their environment, with
``NUMBA_CUDA_MEMORY_MANAGER=numba_bfc`` alone selecting the pool. The plugin
sets that variable on the worker too, for the processes the worker starts.
A worker without a GPU (or without numba-cuda) keeps running; its status
says why no pool is active.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

try:
    from distributed import WorkerPlugin
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("numba_bfc.dask needs distributed: pip install 'numba_bfc[dask]'") from exc

from .allocators import POLICIES

_STATUS: dict[str, Any] = {"configured": False, "status": "numba_bfc plugin not run here"}
# Stats fields summed over the cluster; the rest (peaks of different
# processes, fragmentation, limits) do not add up.
SUMMED_FIELDS = ("num_allocs", "bytes_in_use", "bytes_reserved")


class NumbaBFCPlugin(WorkerPlugin):
    """Select numba_bfc as Numba's memory manager on every Dask worker.

    Parameters
    ----------
    policy : str, optional
        A name in ``numba_bfc.allocators.POLICIES`` (default: ``NUMBA_BFC_CONF``,
        else ``"bfc"``).
    backend, stream_safety, **options
        As for ``numba_bfc.use_numba_bfc``.

    Raises
    ------
    ValueError
        ``policy`` names no policy (raised here, before anything reaches a worker).

    Examples
    --------
    >>> NumbaBFCPlugin(policy="caching").conf
    {'policy': 'caching'}
    """

    name = "numba_bfc"

    def __init__(self, policy: str | None = None, backend: Any = None,
                 stream_safety: Any = None, **options: Any) -> None:
        if policy is not None and policy not in POLICIES:
            raise ValueError(f"NumbaBFCPlugin: unknown policy {policy!r} "
                             f"(known: {', '.join(POLICIES)})")
        given = dict(policy=policy, backend=backend, stream_safety=stream_safety, **options)
        self.conf = {k: v for k, v in given.items() if v is not None}

    def setup(self, worker: Any = None) -> None:
        configure_process(self.conf)


def configure_process(conf: dict[str, Any]) -> dict[str, Any]:
    """Select numba_bfc in this process with ``conf``; return (and keep) its status.

    What ``NumbaBFCPlugin.setup`` runs on each worker.
    """
    # Processes the worker starts follow it; options not in ``conf`` still come
    # from the worker's own NUMBA_BFC_CONF.
    os.environ["NUMBA_CUDA_MEMORY_MANAGER"] = "numba_bfc"
    status: dict[str, Any] = {"configured": False, "conf": dict(conf), "gpu": False}
    try:
        from .integrations.numba_emm import use_numba_bfc
    except ImportError as exc:
        status["status"] = f"numba_bfc not selected: {exc}"
        return _keep(status)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        use_numba_bfc(**conf)
    from numba import cuda

    status["configured"] = True
    status["gpu"] = bool(cuda.is_available())
    notes = [str(w.message) for w in caught]
    if not status["gpu"]:
        notes.append("no CUDA GPU on this worker: no pool is active")
    status["status"] = "numba_bfc selected" + ("; " + "; ".join(notes) if notes else "")
    return _keep(status)


def _keep(status: dict[str, Any]) -> dict[str, Any]:
    _STATUS.clear()
    _STATUS.update(status)
    return dict(status)


def worker_status() -> dict[str, Any]:
    """What the plugin did in this process (run it on workers with ``client.run``)."""
    return dict(_STATUS)


def local_stats() -> dict[int, dict[str, Any]]:
    """Allocator statistics of this process's numba_bfc pools, by CUDA device id.

    Empty where no CUDA context has a numba_bfc manager (no GPU, or no use yet).
    """
    try:
        from numba.cuda.cudadrv import driver

        from .integrations.numba_emm import NumbaBFCMemoryManager
    except ImportError:
        return {}
    out: dict[int, dict[str, Any]] = {}
    if not driver.driver.is_available:
        return out
    for dev_id, dev in list(driver.driver.devices.items()):
        ctx = getattr(dev, "primary_context", None)
        mgr = getattr(ctx, "memory_manager", None)
        if isinstance(mgr, NumbaBFCMemoryManager):
            out[int(dev_id)] = mgr.allocator.get_stats().to_dict()
    return out


def cluster_stats(client: Any) -> dict[str, Any]:
    """Every worker's numba_bfc statistics (per device) and the cluster totals.

    Returns
    -------
    dict
        ``{"workers": {address: {device: stats}}, "totals": {field: sum}}``, with
        the ``SUMMED_FIELDS`` summed over every worker and device, and
        ``"devices"``, the number of pools counted.
    """
    workers = client.run(local_stats)
    totals = dict.fromkeys(SUMMED_FIELDS, 0)
    devices = 0
    for per_device in workers.values():
        for stats in per_device.values():
            devices += 1
            for field in SUMMED_FIELDS:
                totals[field] += stats[field]
    totals["devices"] = devices
    return {"workers": workers, "totals": totals}
