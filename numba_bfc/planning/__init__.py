"""Offline memory planning: TFLite GPU strategies as Numba kernels.

Give every tensor ``(size, first, last)`` (closed task interval) and get either
shared objects (:func:`assign_objects`) or offsets in one arena
(:func:`assign_offsets`), with the same ids, sizes and offsets as TFLite's
``memory_management``. :func:`lower_bound` says how far from optimal a plan can
be; :func:`validate` checks a plan.

>>> from numba_bfc.planning import assign_offsets, lower_bound
>>> recs = [(32, 0, 1), (32, 1, 4), (8, 2, 5), (16, 3, 5), (8, 4, 5),
...         (64, 5, 7), (8, 6, 8), (8, 7, 8), (16, 8, 9)]
>>> plan = assign_offsets(recs, "greedy_by_size")
>>> plan.total_size, lower_bound(recs, "offsets")
(96, 96)
"""

from .bounds import calculate_positional_maximums, calculate_task_profiles, lower_bound
from .io import parse_records, read_records, write_records
from .records import (
    RECORD_DTYPE,
    as_records,
    make_records,
    record_dims,
    records_from_half_open,
)
from .strategies import (
    STRATEGIES,
    ObjectsAssignment,
    OffsetsAssignment,
    assign_objects,
    assign_offsets,
    objects_to_offsets,
)
from .validate import is_valid, validate

__all__ = [
    "RECORD_DTYPE",
    "STRATEGIES",
    "ObjectsAssignment",
    "OffsetsAssignment",
    "as_records",
    "assign_objects",
    "assign_offsets",
    "calculate_positional_maximums",
    "calculate_task_profiles",
    "is_valid",
    "lower_bound",
    "make_records",
    "objects_to_offsets",
    "parse_records",
    "read_records",
    "record_dims",
    "records_from_half_open",
    "validate",
    "write_records",
]
