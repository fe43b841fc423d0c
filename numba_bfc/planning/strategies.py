"""TFLite GPU memory-planning strategies over usage records.

Each strategy gives the same object ids, object sizes and offsets as TFLite's
``tflite/delegates/gpu/common/memory_management`` (tie-breaking included); the
work happens in the Numba kernels of :mod:`numba_bfc.planning._kernels`.

==================  ===========  ======================================  =======================
strategy            sizes        time (this package)                     TFLite
==================  ===========  ======================================  =======================
naive               1-D, d-D     O(n)                                    O(n)
equality            1-D, BHWC    O(n log n), LIFO per size               O(n log n)
equality            2-D, 3-D     O(n log n), lowest free id              O(n * k)
greedy_in_order     1-D          O(n log n)                              O(n log n)
  + realloc graph   1-D          O(n * k * log n)                        O(n * k * log n)
greedy_in_order     2-D, 3-D     O(n * k)                                O(n * k)
greedy_by_breadth   1-D          O(n log n + P log P + n * k * log n)    O(n * T + n * k log n)
greedy_by_size      1-D objects  O(n^2 + R * k), O(n * k) memory         same
greedy_by_size      1-D offsets  O(n log n + sum_r k_r log n)            O(n^2)
greedy_best         1-D          by_size + by_breadth                    same
mincostflow         1-D          O(n^4) worst, O(n^2) memory             same
==================  ===========  ======================================  =======================

n records, k objects, T tasks, P = sum of live-set sizes at the distinct start
times, k_r = placed tensors overlapping r in time, R = best-object recomputations.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from . import _kernels as K
from .records import MAX_TOTAL_BYTES, RecordsLike, as_records, record_dims

__all__ = [
    "STRATEGIES",
    "ObjectsAssignment",
    "OffsetsAssignment",
    "assign_objects",
    "assign_offsets",
    "objects_to_offsets",
]

#: Strategy names accepted by :func:`assign_objects` (TFLite ``MemoryStrategy``).
STRATEGIES = (
    "naive",
    "equality",
    "greedy_in_order",
    "greedy_by_breadth",
    "greedy_by_size",
    "greedy_best",
    "mincostflow",
)

# Which strategies TFLite offers for each size dimensionality (4 = BHWC).
_SUPPORTED = {
    1: set(STRATEGIES),
    2: {"naive", "equality", "greedy_in_order"},
    3: {"naive", "equality", "greedy_in_order"},
    4: {"naive", "equality"},
}

# Strategies that walk records in the given order and assume it is sorted by
# first task (the execution order of the graph).
_SCAN_STYLE = {"equality", "greedy_in_order", "mincostflow"}


class ObjectsAssignment(NamedTuple):
    """Tensors mapped to shared objects.

    Attributes
    ----------
    object_ids : numpy.ndarray
        ``object_ids[i]`` is the object of tensor ``i`` (int64, shape ``(n,)``).
    object_sizes : numpy.ndarray
        Size of each object: shape ``(k,)``, or ``(k, d)`` for d-D sizes.
    """

    object_ids: np.ndarray
    object_sizes: np.ndarray

    @property
    def total_size(self) -> int:
        """Sum of object sizes (bytes; 1-D sizes only)."""
        if self.object_sizes.ndim != 1:
            raise ValueError("total_size needs 1-D object sizes")
        return int(self.object_sizes.sum())


class OffsetsAssignment(NamedTuple):
    """Tensors placed at byte offsets in one arena.

    Attributes
    ----------
    offsets : numpy.ndarray
        ``offsets[i]`` is the byte offset of tensor ``i`` (int64).
    total_size : int
        Arena size: ``max(offset + size)`` (not rounded up to the alignment).
    search : SearchStats or None
        For the ``search`` strategy: whether the plan is proven optimal, the
        best lower bound, the greedy start and the search statistics.
    """

    offsets: np.ndarray
    total_size: int
    search: object = None


def _check_strategy(strategy: str, dims: int) -> str:
    if not isinstance(strategy, str):
        raise TypeError(f"strategy must be a string, got {type(strategy).__name__}")
    name = strategy.lower()
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}")
    if name not in _SUPPORTED[dims]:
        raise ValueError(
            f"strategy {name!r} does not support {dims}-D sizes; "
            f"use one of {', '.join(sorted(_SUPPORTED[dims]))}"
        )
    return name


def _csr_graph(graph, n: int) -> tuple[np.ndarray, np.ndarray]:
    if len(graph) != n:
        raise ValueError(f"reallocation_graph has {len(graph)} rows for {n} records")
    indptr = np.zeros(n + 1, dtype=np.int64)
    rows = []
    for i, row in enumerate(graph):
        r = np.unique(np.asarray(row, dtype=np.int64).reshape(-1))
        if r.size and (r[0] < 0 or r[-1] >= n):
            raise ValueError(f"reallocation_graph row {i} names a record outside 0..{n - 1}")
        rows.append(r)
        indptr[i + 1] = indptr[i] + r.size
    idx = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
    return indptr, idx.astype(np.int64)


def _dense_keys(sizes: np.ndarray) -> np.ndarray:
    """Equal sizes -> equal small integers (multi-dim sizes compared whole)."""
    if sizes.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    if sizes.ndim == 1:
        return np.unique(sizes, return_inverse=True)[1].astype(np.int64)
    return np.unique(sizes, axis=0, return_inverse=True)[1].reshape(-1).astype(np.int64)


def _objects_sorted(name, sizes, firsts, lasts, graph):
    dims = 1 if sizes.ndim == 1 else sizes.shape[1]
    if name == "equality":
        keys = _dense_keys(sizes)
        # TFLite hashes size_t and BHWC (LIFO reuse) but scans uint2/uint3
        # (lowest free id); the two give different ids on the same input.
        kernel = K.equality_lifo if dims in (1, 4) else K.equality_lowest_id
        ids, creator = kernel(keys, firsts, lasts)
        return ids, sizes[creator]
    if name == "greedy_in_order":
        if dims > 1:
            ids, creator = K.greedy_in_order_multidim(sizes, firsts, lasts)
            return ids, sizes[creator]
        if graph is None:
            empty = np.zeros(1, dtype=np.int64)
            return K.greedy_in_order(sizes, firsts, lasts, empty, empty, False)
        indptr, idx = graph
        return K.greedy_in_order(sizes, firsts, lasts, indptr, idx, True)
    return K.mincostflow(sizes, firsts, lasts)


def assign_objects(
    records: RecordsLike,
    strategy: str = "greedy_by_size",
    reallocation_graph: Sequence[Sequence[int]] | None = None,
) -> ObjectsAssignment:
    """Assign tensors to shared objects (TFLite ``AssignObjectsToTensors``).

    Parameters
    ----------
    records : array_like
        Usage records (see :func:`~numba_bfc.planning.as_records`).
    strategy : str
        One of :data:`STRATEGIES`. 2-D/3-D sizes support ``naive``,
        ``equality`` and ``greedy_in_order``; BHWC (4-D) ``naive`` and
        ``equality``.
    reallocation_graph : sequence of sequences of int, optional
        Only for ``greedy_in_order``: ``graph[j]`` lists the tensors allowed
        to reuse the memory of tensor ``j`` (TFLite's ``UsageGraph``).

    Returns
    -------
    ObjectsAssignment

    Notes
    -----
    ``equality``, ``greedy_in_order`` and ``mincostflow`` walk records in
    order of first task, as TFLite assumes its input is; records out of that
    order are visited in a stable sort by first task (results for sorted input
    are TFLite's exactly; TFLite itself would give overlapping tensors the
    same object on unsorted input).

    Examples
    --------
    >>> a = assign_objects([(16, 0, 1), (8, 1, 2), (64, 2, 3)], "greedy_in_order")
    >>> a.object_ids.tolist(), a.object_sizes.tolist()
    ([0, 1, 0], [64, 8])
    """
    recs = as_records(records)
    dims = record_dims(recs)
    name = _check_strategy(strategy, dims)
    if reallocation_graph is not None and name != "greedy_in_order":
        raise ValueError("reallocation_graph is only used by 'greedy_in_order'")
    sizes = np.ascontiguousarray(recs["size"])
    firsts = np.ascontiguousarray(recs["first"])
    lasts = np.ascontiguousarray(recs["last"])
    n = recs.shape[0]
    if name == "naive" or n == 0:
        return ObjectsAssignment(np.arange(n, dtype=np.int64), sizes.copy())
    if name in _SCAN_STYLE:
        graph = None
        order = None
        if np.any(firsts[1:] < firsts[:-1]):
            order = np.argsort(firsts, kind="stable")
            sizes, firsts, lasts = sizes[order], firsts[order], lasts[order]
        if reallocation_graph is not None:
            graph = _csr_graph(reallocation_graph, n)
            if order is not None:
                inv = np.empty(n, dtype=np.int64)
                inv[order] = np.arange(n)
                indptr, idx = graph
                rows = [np.sort(inv[idx[indptr[j] : indptr[j + 1]]]) for j in order]
                graph = _csr_graph(rows, n)
        ids, osizes = _objects_sorted(name, sizes, firsts, lasts, graph)
        if order is not None:
            unsorted = np.empty(n, dtype=np.int64)
            unsorted[order] = ids
            ids = unsorted
        return ObjectsAssignment(ids, osizes)
    if name == "greedy_by_breadth":
        return ObjectsAssignment(*K.greedy_by_breadth(sizes, firsts, lasts))
    by_size = ObjectsAssignment(*K.greedy_by_size_objects(sizes, firsts, lasts))
    if name == "greedy_by_size":
        return by_size
    # greedy_best: breadth-first wins only when strictly smaller.
    by_breadth = ObjectsAssignment(*K.greedy_by_breadth(sizes, firsts, lasts))
    if by_breadth.total_size < by_size.total_size:
        return by_breadth
    return by_size


def objects_to_offsets(assignment: ObjectsAssignment) -> OffsetsAssignment:
    """Lay objects back to back in id order (TFLite ``ObjectsToOffsets``).

    Object ``k`` starts at the sum of the sizes of objects ``0..k-1``; every
    tensor gets its object's offset; the total is the sum of object sizes.
    """
    ids = np.asarray(assignment.object_ids, dtype=np.int64)
    osizes = np.asarray(assignment.object_sizes, dtype=np.int64)
    if osizes.ndim != 1:
        raise ValueError("objects_to_offsets needs 1-D object sizes")
    if ids.size and (ids.min() < 0 or ids.max() >= osizes.shape[0]):
        raise ValueError("object_ids refer to objects outside object_sizes")
    starts = np.zeros(osizes.shape[0] + 1, dtype=np.int64)
    np.cumsum(osizes, out=starts[1:])
    return OffsetsAssignment(starts[ids], int(starts[-1]))


def _search(recs, time_limit, capacity, node_limit) -> OffsetsAssignment:
    from .search import resolve_budget, search_offsets

    time_limit, node_limit = resolve_budget(time_limit, node_limit)
    if capacity is not None:
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) \
                or capacity < 0:
            raise ValueError(f"capacity must be a non-negative int, got {capacity!r}")
    offsets, total, stats = search_offsets(
        np.ascontiguousarray(recs["size"]), np.ascontiguousarray(recs["first"]),
        np.ascontiguousarray(recs["last"]), time_limit, capacity, node_limit=node_limit)
    return OffsetsAssignment(offsets, int(total), stats)


def assign_offsets(
    records: RecordsLike, strategy: str = "greedy_by_size", alignment: int = 1, *,
    time_limit: float | None = None, capacity: int | None = None,
    node_limit: int | None = None,
) -> OffsetsAssignment:
    """Place tensors in one arena (TFLite ``AssignOffsetsToTensors``).

    Parameters
    ----------
    records : array_like
        1-D usage records.
    strategy : str
        ``greedy_by_size`` runs the best-fit-gap offsets algorithm; ``search``
        starts from the best of several greedy orders and improves it by
        branch and bound (``numba_bfc.planning.search``); any other strategy
        assigns objects and lays them out with :func:`objects_to_offsets`.
    alignment : int
        Base-address alignment of every gap start, a power of two
        (``greedy_by_size`` only; TFLite ignores it for the other strategies
        and so does this function).
    time_limit : float, optional
        ``search``: an outer cap in seconds (default
        ``search.DEFAULT_TIME_LIMIT``); compilation comes first and does not count.
    node_limit : int, optional
        ``search``: the most search nodes (default
        ``search.DEFAULT_NODE_LIMIT``): the same plan on every machine and run
        unless the time cap ends it first (``.search.stopped``).
    capacity : int, optional
        ``search`` stops at the first plan within this arena size.

    Returns
    -------
    OffsetsAssignment

    Examples
    --------
    >>> recs = [(16, 0, 1), (8, 1, 2), (64, 2, 3), (32, 3, 4), (8, 4, 5)]
    >>> a = assign_offsets(recs, "greedy_by_size", alignment=128)
    >>> a.offsets.tolist(), a.total_size
    ([0, 128, 0, 128, 0], 160)
    """
    if isinstance(alignment, bool) or not isinstance(alignment, (int, np.integer)):
        raise TypeError(f"alignment must be an int, got {type(alignment).__name__}")
    alignment = int(alignment)
    if alignment < 1 or alignment & (alignment - 1):
        raise ValueError(f"alignment must be a power of two, got {alignment}")
    recs = as_records(records)
    dims = record_dims(recs)
    if dims != 1:
        raise ValueError("offsets need 1-D (byte) sizes")
    # Each gap start rounds up by less than the alignment: bound the arena so.
    padded = int(recs["size"].sum(dtype=object)) + recs.shape[0] * (alignment - 1)
    if padded >= MAX_TOTAL_BYTES:
        raise ValueError(f"alignment {alignment} could take the arena past 2**62 bytes "
                         "(int64 arithmetic)")
    if strategy == "search":
        return _search(recs, time_limit, capacity, node_limit)
    name = _check_strategy(strategy, dims)
    if name != "greedy_by_size":
        return objects_to_offsets(assign_objects(recs, name))
    offsets, total = K.greedy_by_size_offsets(
        np.ascontiguousarray(recs["size"]),
        np.ascontiguousarray(recs["first"]),
        np.ascontiguousarray(recs["last"]),
        alignment,
    )
    return OffsetsAssignment(offsets, int(total))
