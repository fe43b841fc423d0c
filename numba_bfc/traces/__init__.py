"""Allocation traces: record, read, write, replay through any policy, compare.

>>> from numba_bfc.traces import Trace, replay
>>> t = Trace.from_arrays(op=[0, 0, 1, 0, 1, 1], id=[0, 1, 0, 2, 1, 2],
...                       size=[1000, 5000, 0, 3000, 0, 0])
>>> r = replay(t, "caching")
>>> r.peak_requested_bytes, r.peak_in_use_bytes, r.backend_allocs
(8000, 8192, 1)
"""

from .formats import FORMATS, guess_format
from .replay import (
    MAX_LIMIT,
    POLICIES,
    SERIES_DTYPE,
    MinLimit,
    OOMEvent,
    ReplayResult,
    make_allocator,
    min_limit,
    replay,
)
from .rmm_log import (
    ACTIONS,
    HEADER,
    RmmLogEvent,
    RmmLogWriter,
    events_to_array,
    format_rmm_event,
    read_rmm_log,
    write_rmm_log,
)
from .rmm_log import (
    EVENT_DTYPE as RMM_EVENT_DTYPE,
)
from .sweep import (
    SweepTask,
    prepare_sweep,
    run_sweep_task,
    sweep,
    sweep_tasks,
    traces_on_cluster,
)
from .torch_io import assign_ids, capture_torch
from .trace import (
    EVENT_DTYPE,
    PROBLEMS,
    Trace,
    TraceError,
    TraceRecorder,
    read_trace,
    write_trace,
)

__all__ = [
    "ACTIONS",
    "EVENT_DTYPE",
    "FORMATS",
    "HEADER",
    "MAX_LIMIT",
    "MinLimit",
    "OOMEvent",
    "POLICIES",
    "PROBLEMS",
    "RMM_EVENT_DTYPE",
    "ReplayResult",
    "RmmLogEvent",
    "RmmLogWriter",
    "SERIES_DTYPE",
    "SweepTask",
    "Trace",
    "TraceError",
    "TraceRecorder",
    "events_to_array",
    "format_rmm_event",
    "guess_format",
    "assign_ids",
    "capture_torch",
    "make_allocator",
    "min_limit",
    "prepare_sweep",
    "read_rmm_log",
    "read_trace",
    "replay",
    "run_sweep_task",
    "sweep",
    "sweep_tasks",
    "traces_on_cluster",
    "write_rmm_log",
    "write_trace",
]
