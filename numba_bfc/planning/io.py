"""Read usage records from CSV.

Two layouts, told apart by the header line:

* ``size,first,last``: closed intervals, this package's own format (a file
  without a header is read this way too when its first line has three numbers);
* ``id,lower,upper,size``: MiniMalloc's buffers, half-open ``[lower, upper)``;
  extra MiniMalloc columns after these four (e.g. ``offset``) are ignored.

Blank lines and lines starting with ``#`` are skipped.
"""

from __future__ import annotations

import io
import os
from typing import TextIO

import numpy as np

from ..errors import InputError, reading_file
from .records import MAX_TOTAL_BYTES, RecordsLike, make_records, records_from_half_open

__all__ = ["read_records", "parse_records", "write_records"]

_PLAIN = ["size", "first", "last"]
_MINIMALLOC = ["id", "lower", "upper", "size"]


_INT64_MAX = (1 << 63) - 1


def _int(token: str, field: str, line: int) -> int:
    try:
        value = int(token)
    except ValueError:
        raise InputError(f"{field} {token[:100]!r} is not an integer", line=line,
                         field=field) from None
    if value < 0:
        raise InputError(f"{field} {value} is negative", line=line, field=field)
    if value > _INT64_MAX:
        raise InputError(f"{field} {value} does not fit in int64", line=line, field=field)
    return value


def _parse(lines) -> np.ndarray:
    layout = None
    rows: list[tuple[int, ...]] = []
    total = 0  # of the sizes so far, checked here to name the line
    for lineno, raw in enumerate(lines, start=1):
        # A byte-order mark (spreadsheets write one) opens the first line only.
        line = (raw.lstrip("\ufeff") if lineno == 1 else raw).strip()
        if not line or line.startswith("#"):
            continue
        cells = [c.strip() for c in line.split(",")]
        if layout is None:
            header = [c.lower() for c in cells]
            if header == _PLAIN:
                layout = "plain"
                continue
            if header[:4] == _MINIMALLOC:
                layout = "minimalloc"
                continue
            if len(cells) == 3 and all(c.lstrip("+-").isdigit() for c in cells):
                layout = "plain"
            else:
                raise InputError(f"unrecognised header {line[:200]!r}; expected "
                                 "'size,first,last' or 'id,lower,upper,size'", line=lineno)
        if layout == "plain":
            if len(cells) != 3:
                raise InputError(f"expected 3 fields (size,first,last), got {len(cells)}",
                                 line=lineno)
            size, first, last = (_int(cell, field, lineno)
                                 for cell, field in zip(cells, _PLAIN))
            if last < first:
                raise InputError(f"last task {last} is before first task {first}",
                                 line=lineno, field="last")
            rows.append((size, first, last))
        else:
            if len(cells) < 4:
                raise InputError("expected at least 4 fields (id,lower,upper,size), "
                                 f"got {len(cells)}", line=lineno)
            # MiniMalloc's ids are names (any text): only the numbers are read.
            lower, upper, size = (_int(cell, field, lineno)
                                  for cell, field in zip(cells[1:], _MINIMALLOC[1:]))
            if upper <= lower:
                raise InputError(f"upper {upper} must be greater than lower {lower}",
                                 line=lineno, field="upper")
            rows.append((size, lower, upper))
        total += rows[-1][0]
        if total >= MAX_TOTAL_BYTES:
            raise InputError(f"the sizes up to here sum to {total} bytes; plans need less "
                             "than 2**62 (int64 arithmetic)", line=lineno, field="size")
    if layout is None:
        raise InputError("no header and no records")
    arr = np.array(rows, dtype=np.int64).reshape(-1, 3)
    if layout == "plain":
        return make_records(arr[:, 0], arr[:, 1], arr[:, 2])
    return records_from_half_open(arr[:, 0], arr[:, 1], arr[:, 2])


def parse_records(text: str, name: str = "<string>") -> np.ndarray:
    """Parse CSV text (either layout) into usage records.

    Raises ``InputError`` (a ``ValueError``) naming ``name``, the line and
    the field of the first bad line.

    Examples
    --------
    >>> parse_records("id,lower,upper,size\\n0,0,2,16\\n").tolist()
    [(16, 0, 1)]
    """
    try:
        return _parse(io.StringIO(text))
    except InputError as e:
        raise e.located(name) from None


def read_records(source: str | os.PathLike | TextIO) -> np.ndarray:
    """Read usage records from a CSV file path or open text file.

    Returns
    -------
    numpy.ndarray
        Structured records (closed intervals; MiniMalloc's ``upper`` becomes
        ``last = upper - 1``).

    Raises
    ------
    InputError
        Unrecognised header, wrong field count, a field that is not an
        integer, negative or past int64, an empty lifetime, text that is not
        UTF-8 (a ``ValueError`` naming the file, line and field).
    OSError
        The file cannot be opened.
    """
    if hasattr(source, "read"):
        with reading_file(getattr(source, "name", "<stream>")):
            return _parse(source)
    with reading_file(source), open(source, encoding="utf-8") as fh:
        return _parse(fh)


def write_records(path: str | os.PathLike, records: RecordsLike) -> None:
    """Write 1-D records as ``size,first,last`` CSV."""
    from .records import as_records

    recs = as_records(records)
    if recs.dtype["size"].shape != ():
        raise ValueError("only 1-D sizes can be written as CSV")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("size,first,last\n")
        for s, f, la in zip(recs["size"], recs["first"], recs["last"], strict=True):
            fh.write(f"{int(s)},{int(f)},{int(la)}\n")
