"""Allocation traces from other allocators' logs (for now: RMM's CSV log)."""

from .rmm_log import (
    ACTIONS,
    EVENT_DTYPE,
    HEADER,
    RmmLogEvent,
    RmmLogWriter,
    events_to_array,
    format_rmm_event,
    read_rmm_log,
    write_rmm_log,
)

__all__ = [
    "ACTIONS",
    "EVENT_DTYPE",
    "HEADER",
    "RmmLogEvent",
    "RmmLogWriter",
    "events_to_array",
    "format_rmm_event",
    "read_rmm_log",
    "write_rmm_log",
]
