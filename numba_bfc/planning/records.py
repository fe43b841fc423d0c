"""Tensor usage records: ``(size, first, last)`` with closed intervals.

A record says a tensor of ``size`` bytes (or a 2-D/3-D/BHWC extent) is live from
task ``first`` through task ``last`` inclusive, TFLite's ``TensorUsageRecord``.
Two tensors conflict (may not share memory) iff
``first_a <= last_b and first_b <= last_a``; a producer whose last task is t and
a consumer whose first task is t never alias.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
from numpy.typing import ArrayLike

#: Usage records: a structured array of ``RECORD_DTYPE``, or ``(size, first,
#: last)`` rows (an ``(n, 3)`` integer array or a sequence of triples).
RecordsLike = np.ndarray | Sequence[tuple[int, int, int]]

__all__ = [
    "RECORD_DTYPE",
    "RecordsLike",
    "make_records",
    "as_records",
    "records_from_half_open",
    "record_dims",
]

#: dtype of 1-D usage records. Multi-dimensional records use a ``size`` field of
#: shape ``(d,)`` (see :func:`make_records`).
RECORD_DTYPE = np.dtype([("size", np.int64), ("first", np.int64), ("last", np.int64)])


def _records_dtype(dims: int) -> np.dtype:
    if dims == 1:
        return RECORD_DTYPE
    return np.dtype([("size", np.int64, (dims,)), ("first", np.int64), ("last", np.int64)])


def _as_int_array(values, name: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.dtype == np.bool_ or arr.dtype.kind not in "iuf":
        if arr.size == 0:
            return arr.astype(np.int64)
        raise TypeError(f"{name} must be integers, got dtype {arr.dtype}")
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)) or not np.all(arr == np.floor(arr)):
            raise TypeError(f"{name} must be integers, got non-integral floats")
    if arr.dtype.kind == "u" and arr.size and arr.max() > np.iinfo(np.int64).max:
        raise ValueError(f"{name} does not fit in int64")
    return arr.astype(np.int64)


#: Byte sums of the records' sizes stay below this, so that no offset, arena
#: size or bound a planner computes in int64 can wrap.
MAX_TOTAL_BYTES = 1 << 62


def _check(records: np.ndarray) -> np.ndarray:
    sizes = records["size"]
    neg = sizes < 0
    if neg.ndim > 1:
        neg = neg.any(axis=1)
    bad = np.flatnonzero(neg)
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"record {i}: negative size {records[i]['size'].tolist()}")
    n = sizes.shape[0]
    if n and int(sizes.max()) >= MAX_TOTAL_BYTES // n:  # else the sum cannot reach it
        columns = sizes.reshape(n, -1).T.tolist()
        total = max(sum(column) for column in columns)  # Python ints: exact
        if total >= MAX_TOTAL_BYTES:
            raise ValueError(f"the records' sizes sum to {total} bytes; plans need less than "
                             "2**62 (int64 arithmetic)")
    bad = np.flatnonzero(records["first"] < 0)
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"record {i}: negative first task {int(records['first'][i])}")
    bad = np.flatnonzero(records["last"] < records["first"])
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"record {i}: last task {int(records['last'][i])} is before "
            f"first task {int(records['first'][i])}"
        )
    return records


def make_records(sizes: ArrayLike, firsts: ArrayLike, lasts: ArrayLike) -> np.ndarray:
    """Build validated usage records from three columns.

    Parameters
    ----------
    sizes : array_like
        Shape ``(n,)`` for byte sizes, or ``(n, d)`` with ``d`` in 2, 3, 4 for
        2-D/3-D extents (TFLite ``uint2``/``uint3``) or ``BHWC`` shapes.
    firsts, lasts : array_like
        Shape ``(n,)``: first and last task using the tensor (inclusive).

    Returns
    -------
    numpy.ndarray
        Structured array with fields ``size``, ``first``, ``last``.

    Raises
    ------
    TypeError
        Non-integer values.
    ValueError
        Mismatched lengths, negative sizes or tasks, ``last < first``.

    Examples
    --------
    >>> r = make_records([16, 8], [0, 1], [1, 2])
    >>> r["size"].tolist(), r["last"].tolist()
    ([16, 8], [1, 2])
    """
    s = _as_int_array(sizes, "sizes")
    f = _as_int_array(firsts, "firsts").reshape(-1)
    la = _as_int_array(lasts, "lasts").reshape(-1)
    if s.ndim == 0 or s.ndim > 2:
        raise ValueError(f"sizes must have shape (n,) or (n, d), got {s.shape}")
    n = s.shape[0]
    if f.shape[0] != n or la.shape[0] != n:
        raise ValueError(
            f"sizes, firsts and lasts differ in length: {n}, {f.shape[0]}, {la.shape[0]}"
        )
    dims = 1 if s.ndim == 1 else s.shape[1]
    if dims not in (1, 2, 3, 4):
        raise ValueError(f"sizes must have 1 to 4 dimensions per record, got {dims}")
    out = np.empty(n, dtype=_records_dtype(dims))
    out["size"] = s
    out["first"] = f
    out["last"] = la
    return _check(out)


def as_records(records: RecordsLike) -> np.ndarray:
    """Coerce records to a validated structured array.

    Accepts a structured array with ``size``/``first``/``last`` fields, an
    ``(n, 3)`` integer array, or a sequence of ``(size, first, last)`` tuples
    where ``size`` may itself be a tuple (multi-dimensional sizes).

    Raises
    ------
    TypeError, ValueError
        Bad types, shapes, negative sizes or tasks, ``last < first``.
    """
    if isinstance(records, np.ndarray) and records.dtype.names is not None:
        missing = {"size", "first", "last"} - set(records.dtype.names)
        if missing:
            raise ValueError(f"records lack field(s) {sorted(missing)}")
        return make_records(records["size"], records["first"], records["last"])
    if isinstance(records, np.ndarray):
        if records.ndim != 2 or records.shape[1] != 3:
            if records.size == 0:
                return make_records([], [], [])
            raise ValueError(f"an array of records must have shape (n, 3), got {records.shape}")
        return make_records(records[:, 0], records[:, 1], records[:, 2])
    if isinstance(records, (str, bytes)) or not isinstance(records, Iterable):
        raise TypeError(f"records must be an array or a sequence of tuples, got {type(records)}")
    rows = list(records)
    if not rows:
        return make_records(np.zeros(0, dtype=np.int64), [], [])
    sizes, firsts, lasts = [], [], []
    for i, row in enumerate(rows):
        if not isinstance(row, (Sequence, np.ndarray, np.void)) or len(row) != 3:
            raise ValueError(f"record {i}: expected (size, first, last), got {row!r}")
        sizes.append(row[0])
        firsts.append(row[1])
        lasts.append(row[2])
    shapes = {np.shape(s) for s in sizes}
    if len(shapes) != 1:
        raise ValueError(f"records mix size shapes {sorted(shapes)}")
    return make_records(sizes, firsts, lasts)


def records_from_half_open(sizes: ArrayLike, lowers: ArrayLike,
                           uppers: ArrayLike) -> np.ndarray:
    """Records from half-open lifetimes ``[lower, upper)`` (MiniMalloc's convention).

    On integer times ``[lower, upper)`` is the closed ``[lower, upper - 1]``;
    conflicts are unchanged. Requires ``upper > lower``.
    """
    lo = _as_int_array(lowers, "lowers").reshape(-1)
    up = _as_int_array(uppers, "uppers").reshape(-1)
    bad = np.flatnonzero(up <= lo)
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"record {i}: upper {int(up[i])} must be greater than lower {int(lo[i])}")
    return make_records(sizes, lo, up - 1)


def record_dims(records: np.ndarray) -> int:
    """Number of size dimensions (1 for byte sizes)."""
    shape = records.dtype["size"].shape
    return 1 if shape == () else shape[0]
