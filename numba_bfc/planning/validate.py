"""Check that an assignment never lets live tensors share memory."""

from __future__ import annotations

import numpy as np

from . import _kernels as K
from .records import RecordsLike, as_records
from .strategies import ObjectsAssignment, OffsetsAssignment

__all__ = ["validate", "is_valid"]


def _validate_objects(recs: np.ndarray, a: ObjectsAssignment) -> None:
    n = recs.shape[0]
    ids = np.asarray(a.object_ids)
    osizes = np.asarray(a.object_sizes)
    if ids.shape != (n,):
        raise ValueError(f"object_ids has shape {ids.shape}, expected ({n},)")
    if ids.dtype.kind not in "iu":
        raise TypeError(f"object_ids must be integers, got dtype {ids.dtype}")
    sizes = recs["size"]
    if osizes.shape[1:] != sizes.shape[1:]:
        raise ValueError(f"object_sizes has shape {osizes.shape}, sizes have {sizes.shape}")
    if n == 0:
        return
    if ids.min() < 0 or ids.max() >= osizes.shape[0]:
        raise ValueError("object_ids refer to objects outside object_sizes")
    small = (osizes[ids] < sizes).reshape(n, -1).any(axis=1)  # n > 0 here
    if small.any():
        i = int(np.flatnonzero(small)[0])
        raise ValueError(
            f"tensor {i} (size {sizes[i].tolist()}) does not fit object {int(ids[i])} "
            f"(size {osizes[ids[i]].tolist()})"
        )
    # Within one object, sorted by first task, each tensor must end before the
    # next one starts.
    order = np.lexsort((recs["first"], ids))
    same = ids[order][1:] == ids[order][:-1]
    clash = same & (recs["last"][order][:-1] >= recs["first"][order][1:])
    if clash.any():
        k = int(np.flatnonzero(clash)[0])
        i, j = int(order[k]), int(order[k + 1])
        raise ValueError(f"tensors {i} and {j} are live together but share object {int(ids[i])}")


def _validate_offsets(recs: np.ndarray, a: OffsetsAssignment) -> None:
    n = recs.shape[0]
    if recs.dtype["size"].shape != ():
        raise ValueError("offsets need 1-D (byte) sizes")
    offs = np.asarray(a.offsets)
    if offs.shape != (n,):
        raise ValueError(f"offsets has shape {offs.shape}, expected ({n},)")
    if offs.dtype.kind not in "iu":
        raise TypeError(f"offsets must be integers, got dtype {offs.dtype}")
    offs = offs.astype(np.int64)
    sizes = np.ascontiguousarray(recs["size"])
    if n and offs.min() < 0:
        raise ValueError(f"tensor {int(np.argmin(offs))} has a negative offset")
    ends = offs + sizes
    if n and ends.max() > a.total_size:
        i = int(np.argmax(ends))
        raise ValueError(f"tensor {i} ends at {int(ends[i])}, past total_size {a.total_size}")
    i, j = K.offsets_conflict(
        sizes, np.ascontiguousarray(recs["first"]), np.ascontiguousarray(recs["last"]), offs
    )
    if i >= 0:
        raise ValueError(f"tensors {i} and {j} are live together and their bytes overlap")


def validate(records: RecordsLike, assignment: ObjectsAssignment | OffsetsAssignment) -> None:
    """Raise ``ValueError`` unless ``assignment`` is a correct plan for ``records``.

    Correct means: every tensor fits (its object is at least as large in every
    dimension, or its bytes lie inside ``[0, total_size)``) and no two tensors
    live at the same task share an object or a byte. Zero-size tensors occupy
    no bytes. O(n log n).
    """
    recs = as_records(records)
    if isinstance(assignment, ObjectsAssignment):
        _validate_objects(recs, assignment)
    elif isinstance(assignment, OffsetsAssignment):
        _validate_offsets(recs, assignment)
    else:
        raise TypeError(
            f"expected ObjectsAssignment or OffsetsAssignment, got {type(assignment).__name__}"
        )


def is_valid(records: RecordsLike, assignment: ObjectsAssignment | OffsetsAssignment) -> bool:
    """``True`` if :func:`validate` accepts the assignment."""
    try:
        validate(records, assignment)
    except ValueError:
        return False
    return True
