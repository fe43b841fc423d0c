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

from .records import make_records, records_from_half_open

__all__ = ["read_records", "parse_records", "write_records"]

_PLAIN = ["size", "first", "last"]
_MINIMALLOC = ["id", "lower", "upper", "size"]


def _int(token: str, what: str, where: str) -> int:
    try:
        return int(token.strip())
    except ValueError:
        raise ValueError(f"{where}: {what} {token.strip()!r} is not an integer") from None


def _parse(lines, name: str) -> np.ndarray:
    layout = None
    rows: list[tuple[int, ...]] = []
    linenos: list[int] = []
    for lineno, raw in enumerate(lines, start=1):
        # A byte-order mark (spreadsheets write one) opens the first line only.
        line = (raw.lstrip("\ufeff") if lineno == 1 else raw).strip()
        if not line or line.startswith("#"):
            continue
        where = f"{name}:{lineno}"
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
                raise ValueError(
                    f"{where}: unrecognised header {line!r}; expected "
                    f"'size,first,last' or 'id,lower,upper,size'"
                )
        if layout == "plain":
            if len(cells) != 3:
                raise ValueError(f"{where}: expected 3 fields (size,first,last), got {len(cells)}")
            size = _int(cells[0], "size", where)
            first = _int(cells[1], "first", where)
            last = _int(cells[2], "last", where)
            if size < 0:
                raise ValueError(f"{where}: negative size {size}")
            if first < 0:
                raise ValueError(f"{where}: negative first task {first}")
            if last < first:
                raise ValueError(f"{where}: last task {last} is before first task {first}")
            rows.append((size, first, last))
        else:
            if len(cells) < 4:
                raise ValueError(
                    f"{where}: expected at least 4 fields (id,lower,upper,size), got {len(cells)}"
                )
            _int(cells[0], "id", where)
            lower = _int(cells[1], "lower", where)
            upper = _int(cells[2], "upper", where)
            size = _int(cells[3], "size", where)
            if size < 0:
                raise ValueError(f"{where}: negative size {size}")
            if lower < 0:
                raise ValueError(f"{where}: negative lower {lower}")
            if upper <= lower:
                raise ValueError(f"{where}: upper {upper} must be greater than lower {lower}")
            rows.append((size, lower, upper))
        linenos.append(lineno)
    if layout is None:
        raise ValueError(f"{name}: no header and no records")
    arr = np.array(rows, dtype=np.int64).reshape(-1, 3)
    if layout == "plain":
        return make_records(arr[:, 0], arr[:, 1], arr[:, 2])
    return records_from_half_open(arr[:, 0], arr[:, 1], arr[:, 2])


def parse_records(text: str, name: str = "<string>") -> np.ndarray:
    """Parse CSV text (either layout) into usage records.

    Raises ``ValueError`` naming ``name:line`` for the first bad line.

    Examples
    --------
    >>> parse_records("id,lower,upper,size\\n0,0,2,16\\n").tolist()
    [(16, 0, 1)]
    """
    return _parse(io.StringIO(text), name)


def read_records(source: str | os.PathLike | TextIO) -> np.ndarray:
    """Read usage records from a CSV file path or open text file.

    Returns
    -------
    numpy.ndarray
        Structured records (closed intervals; MiniMalloc's ``upper`` becomes
        ``last = upper - 1``).

    Raises
    ------
    ValueError
        Unrecognised header, wrong field count, non-integer field, negative
        size or time, empty lifetime; the message starts with ``file:line``.
    """
    if hasattr(source, "read"):
        return _parse(source, getattr(source, "name", "<stream>"))
    with open(source, encoding="utf-8") as fh:
        return _parse(fh, os.fspath(source))


def write_records(path: str | os.PathLike, records) -> None:
    """Write 1-D records as ``size,first,last`` CSV."""
    from .records import as_records

    recs = as_records(records)
    if recs.dtype["size"].shape != ():
        raise ValueError("only 1-D sizes can be written as CSV")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("size,first,last\n")
        for s, f, la in zip(recs["size"], recs["first"], recs["last"], strict=True):
            fh.write(f"{int(s)},{int(f)},{int(la)}\n")
