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
says why no pool is active. Where CuPy is installed, the plugin also makes
CuPy allocate from the same pool (``cupy.cuda.set_allocator``).

``sweep`` runs a trace-replay sweep (``numba_bfc.traces.sweep``) on the
cluster: one Dask task per replay, each trace sent to every worker once.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import uuid
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, TextIO

try:
    import distributed
    from distributed import WorkerPlugin
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("numba_bfc.dask needs distributed: pip install 'numba_bfc[dask]'") from exc

from ._html import grid
from .allocators import POLICIES
from .stats import format_bytes
from .traces import (
    MinLimit,
    ReplayResult,
    Trace,
    prepare_sweep,
    run_sweep_task,
    traces_on_cluster,
)

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
    status["cupy"] = status["gpu"] and _use_pool_for_cupy()
    if status["cupy"]:
        notes.append("CuPy allocates from the pool")
    status["status"] = "numba_bfc selected" + ("; " + "; ".join(notes) if notes else "")
    return _keep(status)


def _use_pool_for_cupy() -> bool:
    """Point CuPy's allocator at the pool when CuPy is installed; True if it was."""
    if importlib.util.find_spec("cupy") is None:
        return False
    import cupy

    from .integrations.cupy import cupy_allocator

    cupy.cuda.set_allocator(cupy_allocator)
    return True


def _keep(status: dict[str, Any]) -> dict[str, Any]:
    _STATUS.clear()
    _STATUS.update(status)
    return dict(status)


def worker_status() -> dict[str, Any]:
    """What the plugin did in this process (run it on workers with ``client.run``)."""
    return dict(_STATUS)


def _managers() -> dict[int, Any]:
    """This process's numba_bfc memory managers, by CUDA device id."""
    try:
        from numba.cuda.cudadrv import driver

        from .integrations.numba_emm import NumbaBFCMemoryManager
    except ImportError:
        return {}
    if not driver.driver.is_available:
        return {}
    out = {}
    for dev_id, dev in list(driver.driver.devices.items()):
        ctx = getattr(dev, "primary_context", None)
        mgr = getattr(ctx, "memory_manager", None)
        if isinstance(mgr, NumbaBFCMemoryManager):
            out[int(dev_id)] = mgr
    return out


def local_stats() -> dict[int, dict[str, Any]]:
    """Allocator statistics of this process's numba_bfc pools, by CUDA device id:
    ``AllocatorStats.to_dict()`` plus ``"policy"``.

    Empty where no CUDA context has a numba_bfc manager (no GPU, or no use yet).
    """
    return {dev: {"policy": mgr.policy, **mgr.allocator.get_stats().to_dict()}
            for dev, mgr in _managers().items()}


class ClusterStats(dict):
    """``cluster_stats``'s plain dict, shown in Jupyter as a table: one row per
    worker and device, then the totals."""

    def _repr_html_(self) -> str:
        rows = [[address, str(device), stats["policy"], format_bytes(stats["bytes_in_use"]),
                 format_bytes(stats["bytes_reserved"]), f"{stats['num_allocs']:,}"]
                for address, per_device in sorted(self["workers"].items())
                for device, stats in sorted(per_device.items())]
        rows += [[address, "-", "no pool", "", "", ""]
                 for address, per_device in sorted(self["workers"].items()) if not per_device]
        totals = self["totals"]
        rows.append([f"total ({len(self['workers'])} workers)", str(totals["devices"]), "",
                     format_bytes(totals["bytes_in_use"]),
                     format_bytes(totals["bytes_reserved"]), f"{totals['num_allocs']:,}"])
        return grid(["worker", "device", "policy", "in use", "reserved", "allocations"], rows,
                    "numba_bfc pools on the cluster")


def cluster_stats(client: Any) -> ClusterStats:
    """Every worker's numba_bfc statistics (per device) and the cluster totals.

    Returns
    -------
    ClusterStats
        A dict: ``{"workers": {address: {device: stats}}, "totals": {field: sum}}``,
        each ``stats`` as ``local_stats`` gives it, with the ``SUMMED_FIELDS``
        summed over every worker and device, and ``"devices"``, the number of
        pools counted. In Jupyter it shows as a table.
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
    return ClusterStats(workers=workers, totals=totals)


def local_snapshot() -> dict[str, Any]:
    """A JSON-ready snapshot of this process's numba_bfc pools, by device id:
    each pool's ``policy``, ``stats`` and its memory, as PyTorch's
    ``torch.cuda.memory._snapshot()`` for ``caching`` (``snapshot()``) and as TF's
    memory map for ``bfc`` and ``compact`` (``memory_map()``)."""
    devices = {}
    for dev, mgr in _managers().items():
        allocator = mgr.allocator
        memory = (allocator.snapshot() if hasattr(allocator, "snapshot")
                  else allocator.memory_map())
        devices[str(dev)] = {"policy": mgr.policy, "stats": allocator.get_stats().to_dict(),
                             "memory": memory}
    return {"pid": os.getpid(), "devices": devices}


def cluster_snapshots(client: Any, path: str | os.PathLike) -> list[Path]:
    """Write one JSON snapshot per worker (``local_snapshot``) into the folder ``path``.

    Files are named after the worker's address (``tcp://10.0.0.5:4021`` gives
    ``10.0.0.5-4021.json``); the folder is made if missing.

    Returns
    -------
    list of Path
        The files written, in worker-address order.
    """
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for address, snapshot in sorted(client.run(local_snapshot).items()):
        name = address.split("://", 1)[-1].replace(":", "-").replace("/", "_")
        target = folder / f"{name}.json"
        target.write_text(json.dumps({"worker": address, **snapshot}, indent=1))
        written.append(target)
    return written


def sweep(client: Any, traces: Sequence[Trace | str | os.PathLike],
          policies: Iterable[str] = ("bfc", "caching"),
          limits: Iterable[int | None] = (None,), *, min_limit: bool = False,
          progress: bool | TextIO = False, **options: Any) -> list[ReplayResult | MinLimit]:
    """``numba_bfc.traces.sweep`` on a Dask cluster: every replay a task.

    Each trace is the result of a task of its own
    (``numba_bfc.traces.traces_on_cluster``), so a worker that dies takes no
    trace with it for good: Dask runs its unfinished tasks again on the
    others (and the trace task, if its result died with it), and the sweep
    completes.
    Replays are deterministic, so the results equal the local sweep's, in the
    same order; only the timings (``seconds``, ``compile_seconds``) differ.

    Parameters
    ----------
    client : distributed.Client
    traces, policies, limits, min_limit, **options
        As for ``numba_bfc.traces.sweep``.
    progress : bool or file
        Show Dask's progress bar (a widget in Jupyter, text elsewhere); a file
        gets the text bar instead of standard output.

    Returns
    -------
    list of ReplayResult (or MinLimit)
        One per ``sweep_tasks(traces, policies, limits, min_limit=min_limit)``, in its order.
    """
    traces, tasks = prepare_sweep(traces, policies, limits, min_limit)
    on_workers = traces_on_cluster(client, traces)
    run_id = uuid.uuid4().hex[:8]
    kind = "min_limit" if min_limit else "replay"
    futures = [client.submit(run_sweep_task, on_workers[task.trace], task, options,
                             key=f"{kind}-{run_id}-{n}", pure=False)
               for n, task in enumerate(tasks)]
    if progress is True:
        bar = distributed.progress(futures)  # a widget in Jupyter, else a text bar that waits
        if bar is not None:
            from IPython.display import display

            display(bar)
    elif progress:
        with contextlib.redirect_stdout(progress):
            distributed.progress(futures, notebook=False)
    return client.gather(futures)
