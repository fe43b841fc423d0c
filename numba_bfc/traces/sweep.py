"""Sweeps: every (trace, policy, limit) replay, or every (trace, policy) smallest limit.

A sweep is a list of independent tasks, each a pure function of its trace and
settings, so they run anywhere in any order: ``sweep`` runs them here, one
after the other; ``numba_bfc.dask.sweep`` runs the same tasks on a Dask
cluster. Both return the results in the order of ``sweep_tasks``.

>>> from numba_bfc.traces import Trace, sweep
>>> t = Trace.from_arrays(op=[0, 0, 1, 1], id=[0, 1, 0, 1], size=[1000, 5000, 0, 0])
>>> [(r.policy, r.limit, r.ooms) for r in sweep([t], ["bfc", "caching"], limits=[None, 4096])]
[('bfc', None, 0), ('bfc', 4096, 1), ('caching', None, 0), ('caching', 4096, 2)]
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .replay import MAX_LIMIT, POLICIES, MinLimit, ReplayResult, replay
from .replay import min_limit as find_min_limit
from .trace import Trace

__all__ = ["SweepTask", "prepare_sweep", "run_sweep_task", "sweep", "sweep_tasks",
           "traces_on_cluster"]


@dataclass(frozen=True)
class SweepTask:
    """One replay of a sweep: ``traces[trace]`` through ``policy`` at ``limit``
    (None: no limit), or, with ``min_limit``, the bisection of its smallest limit."""

    trace: int
    policy: str
    limit: int | None
    min_limit: bool = False


def sweep_tasks(traces: Sequence[Trace], policies: Iterable[str],
                limits: Iterable[int | None] = (None,), *,
                min_limit: bool = False) -> list[SweepTask]:
    """The tasks of a sweep, trace by trace, then policy, then limit.

    Raises
    ------
    ValueError
        No trace or no policy, an unknown policy, a limit out of 1 to
        ``MAX_LIMIT``, or limits given with ``min_limit`` (it finds the limit).
    TypeError
        A limit that is not an int (or None), or a trace that is not a ``Trace``.
    """
    policies = list(policies)
    limits = list(limits)
    if not traces:
        raise ValueError("a sweep needs at least one trace")
    for trace in traces:
        if not isinstance(trace, Trace):
            raise TypeError(f"sweep traces must be Trace objects, not {type(trace).__name__} "
                            "(read files with Trace.read)")
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        raise ValueError(f"unknown policy {', '.join(map(repr, unknown)) or '(none)'} "
                         f"(expected some of {', '.join(POLICIES)})")
    if not limits:
        raise ValueError("limits is empty: give [None] for no limit")
    for limit in limits:
        if limit is None:
            continue
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise TypeError(f"a limit must be an int or None, not {type(limit).__name__}")
        if not 1 <= limit <= MAX_LIMIT:
            raise ValueError(f"a limit must be from 1 to 2**62 - 1 bytes, got {limit}")
    if min_limit:
        if limits != [None]:
            raise ValueError("min_limit finds the limit: give it or limits, not both")
        return [SweepTask(i, policy, None, True)
                for i in range(len(traces)) for policy in policies]
    return [SweepTask(i, policy, limit)
            for i in range(len(traces)) for policy in policies for limit in limits]


def _the_trace(trace: Trace) -> Trace:
    return trace


def traces_on_cluster(client: Any, traces: Sequence[Trace]) -> list[Any]:
    """Each trace as the result of a Dask task of its own, for the tasks that
    replay it to take as their argument (``run_sweep_task``).

    Not ``client.scatter``: the scheduler cannot compute scattered data again,
    and even data broadcast to every worker loses its copies to Dask's active
    memory manager (``ReduceReplicas``, on by default), which drops those no
    waiting task needs. A worker that dies may then take the last copy with it
    and fail the sweep. A task's result, lost with its worker, is computed
    again from the task: a worker that dies costs only the tasks it was
    running. Each worker fetches a trace once, when its first task needs it.

    Parameters
    ----------
    client : distributed.Client
    traces : sequence of Trace

    Returns
    -------
    list of distributed.Future
        One per trace, in order.
    """
    return [client.submit(_the_trace, trace, pure=False) for trace in traces]


def run_sweep_task(trace: Trace, task: SweepTask,
                   options: dict[str, Any]) -> ReplayResult | MinLimit:
    """Run one task on ``trace`` (``traces[task.trace]``); ``options`` go to
    ``replay`` (or ``min_limit``)."""
    if task.min_limit:
        return find_min_limit(trace, task.policy, **options)
    return replay(trace, task.policy, limit=task.limit, **options)


def sweep(traces: Sequence[Trace | str | os.PathLike], policies: Iterable[str] = ("bfc", "caching"),
          limits: Iterable[int | None] = (None,), *, min_limit: bool = False,
          **options: Any) -> list[ReplayResult | MinLimit]:
    """Replay every trace through every policy at every limit, in this process.

    Parameters
    ----------
    traces : sequence of Trace or path
        Paths are read with ``Trace.read``.
    policies : iterable of str
        ``POLICIES`` names.
    limits : iterable of int or None
        Memory limits in bytes (None: no limit).
    min_limit : bool
        Instead of replaying at ``limits``, bisect each (trace, policy)'s
        smallest limit with no OOM (``min_limit``).
    **options
        Passed to every ``replay`` (or ``min_limit``).

    Returns
    -------
    list of ReplayResult (or MinLimit)
        One per ``sweep_tasks(traces, policies, limits, min_limit=min_limit)``, in its order.
    """
    traces, tasks = prepare_sweep(traces, policies, limits, min_limit)
    return [run_sweep_task(traces[task.trace], task, options) for task in tasks]


def prepare_sweep(traces: Sequence[Trace | str | os.PathLike], policies: Iterable[str],
                  limits: Iterable[int | None], min_limit: bool = False
                  ) -> tuple[list[Trace], list[SweepTask]]:
    """The traces (paths read with ``Trace.read``) and the tasks of a sweep, checked
    before any replay runs (``sweep_tasks``)."""
    traces = [t if isinstance(t, Trace) else Trace.read(t) for t in traces]
    return traces, sweep_tasks(traces, policies, limits, min_limit=min_limit)
