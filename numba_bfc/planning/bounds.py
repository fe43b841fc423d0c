"""Task profiles, positional maximums and lower bounds on memory use."""

from __future__ import annotations

import numpy as np

from . import _kernels as K
from .records import RecordsLike, as_records, record_dims
from .search import BOUND_NODE_LIMIT, resolve_budget, window_lower_bound

__all__ = ["calculate_task_profiles", "calculate_positional_maximums", "lower_bound"]


def _columns(records) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    recs = as_records(records)
    if record_dims(recs) != 1:
        raise ValueError("profiles and bounds need 1-D (byte) sizes")
    return (
        np.ascontiguousarray(recs["size"]),
        np.ascontiguousarray(recs["first"]),
        np.ascontiguousarray(recs["last"]),
    )


def calculate_task_profiles(records: RecordsLike) -> list[np.ndarray]:
    """Records live at each task (TFLite ``CalculateTaskProfiles``).

    Returns one int64 array per task ``0..max(last)``: the indices of the
    records live at that task, by size descending, ties by lower index.
    O(n log n + T + sum of interval lengths).

    Examples
    --------
    >>> [p.tolist() for p in calculate_task_profiles([(16, 0, 1), (8, 1, 2)])]
    [[0], [0, 1], [1]]
    """
    indptr, idx = K.task_profiles(*_columns(records))
    return [idx[indptr[t] : indptr[t + 1]] for t in range(indptr.shape[0] - 1)]


def calculate_positional_maximums(records: RecordsLike) -> np.ndarray:
    """``PM[k]`` = the largest k-th biggest live size over all tasks.

    TFLite ``CalculatePositionalMaximums``; non-increasing in ``k``. Computed
    from the live sets at start times only, O(n log n + P log P).

    Examples
    --------
    >>> calculate_positional_maximums([(16, 0, 1), (8, 1, 2), (64, 2, 3)]).tolist()
    [64, 8]
    """
    return K.positional_maximums(*_columns(records))


def lower_bound(records: RecordsLike, kind: str = "offsets", *, tight: bool = False,
                time_limit: float | None = None, node_limit: int | None = None) -> int:
    """A lower bound on the memory any plan needs.

    Parameters
    ----------
    records : array_like
        1-D usage records.
    kind : {"offsets", "objects"}
        ``"offsets"``: the most bytes live at one task (every single-arena
        plan needs at least that). ``"objects"``: the sum of positional
        maximums (every shared-objects plan's k-th largest object is at least
        ``PM[k]``). ``offsets <= objects`` always.
    tight : bool
        ``"offsets"`` only: raise the bound by exact searches on windows of
        consecutive time sections (the buffers live there, lifetimes clipped:
        a smaller instance whose optimum no plan of the whole can beat), for
        up to ``node_limit`` search nodes (default
        ``search.BOUND_NODE_LIMIT``): the same bound on every machine and
        run, unless ``time_limit`` seconds, an outer cap, end it first
        (compilation comes before the clock starts). Never below the plain
        bound, never above the optimum.

    Returns
    -------
    int

    Examples
    --------
    >>> recs = [(3, 5, 7), (2, 6, 8), (1, 2, 4), (1, 4, 5), (2, 1, 1), (3, 0, 3), (1, 2, 5)]
    >>> lower_bound(recs), lower_bound(recs, tight=True)
    (5, 6)
    """
    if kind not in ("offsets", "objects"):
        raise ValueError(f"kind must be 'offsets' or 'objects', got {kind!r}")
    if tight and kind != "offsets":
        raise ValueError("tight=True is for kind='offsets'")
    time_limit, node_limit = resolve_budget(time_limit, node_limit, BOUND_NODE_LIMIT)
    cols = _columns(records)
    if kind == "offsets":
        if tight:
            return int(window_lower_bound(*cols, time_limit=time_limit, node_limit=node_limit))
        return int(K.max_live_bytes(*cols))
    return int(K.positional_maximums(*cols).sum())
