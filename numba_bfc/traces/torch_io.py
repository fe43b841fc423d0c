"""PyTorch allocation streams, read without importing torch.

Two PyTorch outputs carry an allocation stream:

* A CUDA memory snapshot, ``torch.cuda.memory._dump_snapshot(path)`` after
  ``torch.cuda.memory._record_memory_history()``: a pickled dict whose
  ``"device_traces"`` is one list of trace entries per device, each a dict::

      {"action": "alloc", "addr": 139637976727552, "size": 512, "stream": 0,
       "time_us": 1718000000123456, "frames": [...], ...}

  ``action`` is ``alloc``, ``free_requested``, ``free_completed``,
  ``segment_alloc``, ``segment_free``, ``segment_map``, ``segment_unmap``,
  ``snapshot`` or ``oom`` (which has ``device_free`` instead of ``addr``).
  As PyTorch's memory viz does, only ``alloc`` and ``free_completed`` count:
  a block is reusable only once its free has completed.
* The Chrome trace of ``torch.profiler.profile(profile_memory=True)``
  (``prof.export_chrome_trace(path)``, ``.json`` or ``.json.gz``): instant
  events named ``[memory]``::

      {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",
       "pid": 24109, "tid": 24109, "ts": 4472594901136.332,
       "args": {"Total Reserved": 0, "Total Allocated": 1048576,
                "Bytes": 1048576, "Device Id": -1, "Device Type": 0,
                "Addr": 140672592064576, "finished": false, "Ev Idx": 18}}

  ``Bytes`` is positive for an allocation and minus the block's size for a
  free; ``ts`` is microseconds; ``Device Type`` is c10's (0 CPU, 1 CUDA).

Every reader returns the events as a dict of equal-length NumPy arrays, in
event order: ``op`` (int8, ``ALLOC`` or ``FREE``), ``id`` (int64),
``size`` (int64 bytes, the freed block's size for frees), ``stream``
(int64, 0 if unknown) and ``time`` (float64 seconds since the first event,
NaN if unknown). Addresses become ids with ``assign_ids``: an address reused
after its free gets a new id, and a free of an address that is not live
(allocated before recording began) gets a fresh id of its own, which a
trace's cleaning step can then drop and count.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import pickle
import re
import tempfile
import zlib
from collections.abc import Callable, Mapping
from typing import IO, Any

import numpy as np

from ..errors import InputError, reading_file

__all__ = [
    "ALLOC",
    "FIELDS",
    "FREE",
    "assign_ids",
    "capture_torch",
    "read_profiler_trace",
    "read_torch_snapshot",
    "write_torch_snapshot",
]

ALLOC = 0
FREE = 1
#: The keys of an events dict, in column order.
FIELDS = ("op", "id", "size", "stream", "time")
_DTYPES = {"op": np.int8, "id": np.int64, "size": np.int64, "stream": np.int64,
           "time": np.float64}

_GZIP_MAGIC = b"\x1f\x8b"
# c10::DeviceType codes as the profiler writes them in "Device Type".
_DEVICE_TYPES = {"cpu": 0, "cuda": 1}
_DEVICE_NAMES = {v: k.upper() for k, v in _DEVICE_TYPES.items()}

# Synthetic addresses for write_torch_snapshot: where CUDA's first mappings
# usually land, and the caching allocator's 512-byte block granularity.
_SYNTHETIC_BASE = 0x7F0000000000
_SYNTHETIC_ALIGN = 512

Source = str | os.PathLike | IO[bytes]


def assign_ids(op: np.ndarray, addr: np.ndarray) -> np.ndarray:
    """Allocation ids for a stream of ``op``/``addr`` events.

    Each allocation gets the next id of a counter; a free takes the id of the
    live allocation at its address (the latest event there, if an
    allocation), else, as a free of memory allocated before recording, the
    next id too. So an address reused after its free gets a new id.

    Parameters
    ----------
    op : array of int
        ``ALLOC`` or ``FREE`` per event.
    addr : array of int
        The block's address per event.

    Returns
    -------
    numpy.ndarray
        int64 ids, one per event, counting from 0.
    """
    op = np.asarray(op)
    addr = np.asarray(addr)
    n = op.shape[0]
    # Vectorized replay of "live = {}; live[addr] = id / live.pop(addr)": in a
    # stable sort by address each event follows the previous event at the
    # same address, and a free pairs exactly when that event is an allocation.
    order = np.argsort(addr, kind="stable")
    prev = np.full(n, -1, dtype=np.int64)
    if n > 1:
        same = addr[order[1:]] == addr[order[:-1]]
        prev[order[1:][same]] = order[:-1][same]
    is_free = op == FREE
    paired = is_free & (prev >= 0)
    paired[paired] = op[prev[paired]] == ALLOC
    fresh = np.cumsum(~paired, dtype=np.int64) - 1
    ids = fresh
    ids[paired] = fresh[prev[paired]]
    return ids


def _make_events(op: list | np.ndarray, addr: list | np.ndarray, size: list | np.ndarray,
                 stream: list | np.ndarray, time_us: list | np.ndarray) -> dict[str, np.ndarray]:
    """The events dict: ids from addresses, zero-byte events dropped, microseconds
    made seconds since the first timed event."""
    op = np.asarray(op, dtype=np.int8)
    addr = _int_array(addr, "address")
    size = _int_array(size, "size")
    stream = _int_array(stream, "stream")
    time = np.asarray(time_us, dtype=np.float64)
    if np.any(size < 0):
        raise InputError(f"negative size {int(size[np.argmax(size < 0)])} in an event")
    # A zero-byte request reserves nothing (PyTorch hands back a null pointer),
    # so it is no allocation; its free, if recorded, is zero-byte too.
    keep = size > 0
    if not keep.all():
        op, addr, size, stream, time = op[keep], addr[keep], size[keep], stream[keep], time[keep]
    finite = np.flatnonzero(np.isfinite(time))
    # Rebase before scaling: epoch microseconds (~1.7e15) keep their last
    # digit in float64, epoch seconds would not.
    if finite.size:
        time = (time - time[finite[0]]) * 1e-6
    return {"op": op, "id": assign_ids(op, addr), "size": size, "stream": stream,
            "time": time}


def _int_array(values: list | np.ndarray, what: str) -> np.ndarray:
    """``values`` as int64; ValueError naming ``what`` unless all are 64-bit integers."""
    arr = np.asarray(values)
    if arr.dtype.kind == "i" or (arr.dtype.kind == "u" and not (arr >= 2**63).any()):
        return arr.astype(np.int64)
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    # Python ints past 64 bits come as uint64 or objects; floats, None, str as themselves.
    bad = next((v for v in arr.tolist() if not isinstance(v, int) or isinstance(v, bool)
                or not -2**63 <= v < 2**63), arr.tolist()[0])
    raise InputError(f"{what} must be 64-bit integers, got {bad!r}")


def _read_bytes(source: Source) -> bytes:
    """The content of a path or binary file, gunzipped if it is gzip."""
    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as f:
            data = f.read()
    else:
        data = source.read()
        if isinstance(data, str):
            raise ValueError("expected a binary file object, got a text one")
    if data[:2] == _GZIP_MAGIC:
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise InputError(f"corrupt or truncated gzip data ({exc})") from None
    return data


class _PlainUnpickler(pickle.Unpickler):
    """Unpickles plain data only: a snapshot is dicts, lists, tuples, str and
    numbers, and refusing every global keeps a hostile pickle from running code."""

    _ALLOWED = {("collections", "OrderedDict"), ("builtins", "set"),
                ("builtins", "frozenset")}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"refusing to load {module}.{name}: a memory snapshot holds plain data only")


def read_torch_snapshot(source: Source, device: int | None = None) -> dict[str, np.ndarray]:
    """Read the allocation stream of a PyTorch CUDA memory snapshot.

    Parameters
    ----------
    source : path or binary file
        A ``torch.cuda.memory._dump_snapshot`` pickle (gzip-compressed or not).
        Only plain data is unpickled; other objects are refused.
    device : int, optional
        Which device's trace to read; by default the only one with
        ``alloc``/``free_completed`` entries.

    Returns
    -------
    dict of numpy.ndarray
        ``op``, ``id``, ``size``, ``stream``, ``time`` (seconds since the first
        event with a ``time_us``), from the ``alloc`` and ``free_completed``
        entries in trace order.

    Raises
    ------
    InputError
        If the file is no snapshot or an entry lacks a field (a ``ValueError``
        naming the file when ``source`` is a path).
    ValueError
        If ``device`` is ambiguous or out of range.
    """
    with _errors_at(source):
        return _snapshot_events(_read_bytes(source), device)


def _errors_at(source: Source) -> contextlib.AbstractContextManager:
    """Errors of reading ``source`` name it, when it is a path."""
    if isinstance(source, (str, os.PathLike)):
        return reading_file(source)
    return contextlib.nullcontext()


def _snapshot_events(data: bytes, device: int | None) -> dict[str, np.ndarray]:
    try:
        snapshot = _PlainUnpickler(io.BytesIO(data)).load()
    except Exception as exc:  # pickle raises many types on garbage input
        raise InputError(f"not a snapshot pickle: {type(exc).__name__}: {exc}") from exc
    if isinstance(snapshot, list):
        raise InputError("this pickle is a list (torch.cuda.memory_snapshot()'s segments "
                         "only), not a snapshot dict with 'device_traces'; record with "
                         "torch.cuda.memory._record_memory_history() and dump with "
                         "torch.cuda.memory._dump_snapshot()")
    if not isinstance(snapshot, dict):
        raise InputError(f"a snapshot is a dict, got {type(snapshot).__name__}")
    if "device_traces" not in snapshot:
        raise InputError("snapshot has no 'device_traces' key (was memory history "
                         "recording on?); keys: " + ", ".join(map(repr, list(snapshot)[:20])))
    traces = snapshot["device_traces"]
    if not isinstance(traces, list) or not all(isinstance(t, list) for t in traces):
        raise InputError("snapshot 'device_traces' must be a list of lists of entries")
    # A pickle can repeat one list or entry by reference for a few bytes each,
    # so a small file can hold billions of entries; a real snapshot's entries
    # are distinct objects, each at least a byte of the file.
    total = sum(len(t) for t in traces)
    if total > len(data):
        raise InputError(f"snapshot has {total} trace entries in {len(data)} bytes: its "
                         "lists repeat shared objects, which a snapshot never does",
                         field="device_traces")

    wanted = {"alloc": ALLOC, "free_completed": FREE}
    for d, t in enumerate(traces):
        for i, e in enumerate(t):
            if not isinstance(e, dict):
                raise InputError(f"device {d} trace entry {i} is a "
                                 f"{type(e).__name__}, not a dict")
    if device is None:
        with_events = [i for i, t in enumerate(traces) if any(e.get("action") in wanted
                                                               for e in t)]
        if len(with_events) > 1:
            raise ValueError(f"snapshot has allocation events on devices {with_events}; "
                             "pass device= one of them")
        device = with_events[0] if with_events else None
    elif not 0 <= device < len(traces):
        raise ValueError(f"device {device} out of range: the snapshot has "
                         f"{len(traces)} device trace(s)")
    entries = traces[device] if device is not None else []

    op, addr, size, stream, time = [], [], [], [], []
    nan = float("nan")
    for i, e in enumerate(entries):
        code = wanted.get(e.get("action"))
        if code is None:
            continue
        try:
            addr.append(e["addr"])
            size.append(e["size"])
        except KeyError as exc:
            raise InputError(f"device {device} trace entry {i} ({e.get('action')}) "
                             f"has no {exc.args[0]!r}") from None
        op.append(code)
        stream.append(e.get("stream", 0))
        # Older PyTorch wrote no time_us; so does memory viz's profile converter.
        t = e.get("time_us")
        time.append(nan if t is None else t)
    return _make_events(op, addr, size, stream, time)


def _check_events(events: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """``events`` with every field as an array of one length; absent stream/time filled."""
    if not isinstance(events, Mapping):
        raise ValueError(f"events must be a dict of arrays, got {type(events).__name__}")
    missing = [k for k in ("op", "id", "size") if k not in events]
    if missing:
        raise ValueError(f"events lack {missing}")
    n = len(events["op"])
    out = {}
    for k in FIELDS:
        if k in events:
            arr = np.asarray(events[k])
            if arr.shape != (n,):
                raise ValueError(f"events[{k!r}] has shape {arr.shape}, expected ({n},)")
            out[k] = arr
    out.setdefault("stream", np.zeros(n, dtype=np.int64))
    out.setdefault("time", np.full(n, np.nan))
    bad = ~np.isin(out["op"], (ALLOC, FREE))
    if bad.any():
        raise ValueError(f"event {int(np.argmax(bad))} has op {out['op'][bad][0]!r}, "
                         f"not {ALLOC} (alloc) or {FREE} (free)")
    return out


def write_torch_snapshot(target: str | os.PathLike | IO[bytes], events: Mapping[str, Any],
                         device: int = 0) -> None:
    """Write ``events`` as a PyTorch memory snapshot pickle.

    The snapshot has no segments and one trace, ``device``'s: an ``alloc``
    entry per allocation and ``free_requested`` plus ``free_completed`` per
    free, at synthetic addresses that never overlap a live block (a freed
    block's address is reused for a later one of the same rounded size, as a
    caching allocator would). A free whose id is not live is written at an
    address that is not live either, so it reads back as one.

    Parameters
    ----------
    target : path or binary file
        Where to write (a path is created or truncated).
    events : dict of array_like
        ``op``, ``id``, ``size`` and optionally ``stream`` and ``time``
        (seconds; NaN writes no ``time_us``).
    device : int
        The device index whose trace holds the events.

    Raises
    ------
    ValueError
        If the events are malformed or allocate an id that is already live.
    """
    ev = _check_events(events)
    if device < 0:
        raise ValueError(f"device must be >= 0, got {device}")
    cached: dict[int, list[int]] = {}  # rounded size -> freed addresses (LIFO)
    live: dict[int, tuple[int, int]] = {}  # id -> (address, size)
    bump = _SYNTHETIC_BASE

    def rounded(size: int) -> int:
        return -(-max(size, 1) // _SYNTHETIC_ALIGN) * _SYNTHETIC_ALIGN

    def new_address(size: int) -> int:
        nonlocal bump
        pool = cached.get(rounded(size))
        if pool:
            return pool.pop()
        address, bump = bump, bump + rounded(size)
        return address

    trace = []
    for op, eid, size, stream, t in zip(ev["op"].tolist(), ev["id"].tolist(),
                                        ev["size"].tolist(), ev["stream"].tolist(),
                                        ev["time"].tolist()):
        entry = {"addr": 0, "size": size, "stream": stream, "frames": []}
        if t == t:  # not NaN
            entry["time_us"] = round(t * 1e6)
        if op == ALLOC:
            if eid in live:
                raise ValueError(f"id {eid} is allocated again while live")
            entry["addr"] = new_address(size)
            live[eid] = entry["addr"], size
            trace.append({"action": "alloc", **entry})
            continue
        address, alloc_size = live.pop(eid, (None, size))
        if address is None:
            # Not live: an address no live block has, so it reads back unpaired.
            address = new_address(size)
        # PyTorch's free entries carry the block's size; some traces leave it 0.
        entry["size"] = size if size > 0 else alloc_size
        entry["addr"] = address
        cached.setdefault(rounded(alloc_size), []).append(address)
        trace.append({"action": "free_requested", **entry})
        trace.append({"action": "free_completed", **entry})
    snapshot = {"segments": [], "device_traces": [[] for _ in range(device)] + [trace]}
    if isinstance(target, (str, os.PathLike)):
        with open(target, "wb") as f:
            pickle.dump(snapshot, f)
    else:
        pickle.dump(snapshot, target)


def _device_label(device_type: int, device_id: int) -> str:
    name = _DEVICE_NAMES.get(device_type, f"type {device_type}")
    return f"{name} (Device Type {device_type}, Device Id {device_id})"


# Kineto's layout of a [memory] event, from "name" to the end of the object. Most
# of a profiler trace is op events; finding the few memory events with this and
# JSON-decoding only them is ~5x faster than decoding the whole file.
_KINETO_MEMORY = re.compile(
    rb'"name":\s*"\[memory\]",\s*"pid":\s*-?\d+,\s*"tid":\s*-?\d+,\s*'
    rb'"ts":\s*([-+0-9.eE]+)\s*,\s*"args":\s*\{([^{}]*)\}\s*\}')


def _kineto_memory_events(data: bytes) -> tuple[list, list] | None:
    """The ``ts`` and the ``args`` of the [memory] events in file order, or None
    when the file is not laid out as kineto writes it (then decode it all)."""
    # A whole object (so not truncated), and every "[memory]" string inside a
    # matched event; anything else goes the slow, thorough way.
    head, tail = data[:4096].lstrip(), data[-16:].rstrip()
    if not (head[:1] == b"{" and tail[-1:] == b"}" and b'"traceEvents"' in head):
        return None
    found = _KINETO_MEMORY.findall(data)
    if not found or len(found) != data.count(b'"[memory]"'):
        return None
    try:
        ts = json.loads(b"[" + b",".join([t for t, _ in found]) + b"]")
        args = json.loads(b"[{" + b"},{".join([a for _, a in found]) + b"}]")
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return ts, args


def _json_memory_events(data: bytes) -> tuple[list, list]:
    """The ``ts`` and the ``args`` of the [memory] events in file order, decoding
    the whole JSON."""
    try:
        trace = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"not a JSON trace: {exc}") from None
    except RecursionError:
        raise InputError("not a JSON trace: nested too deeply to decode") from None
    # The Trace Event Format allows an object with "traceEvents" or a bare array.
    if isinstance(trace, dict):
        if "traceEvents" not in trace:
            raise InputError("JSON object has no 'traceEvents' key: not a Chrome trace")
        trace = trace["traceEvents"]
    if not isinstance(trace, list):
        raise InputError(f"'traceEvents' must be a list, got {type(trace).__name__}")
    mem = [e for e in trace if isinstance(e, dict) and e.get("name") == "[memory]"]
    for i, e in enumerate(mem):
        if "ts" not in e:
            raise InputError(f"[memory] event {i} has no 'ts': {e!r}"[:300])
    return [e["ts"] for e in mem], [e.get("args") for e in mem]


def read_profiler_trace(source: Source, device_type: int | str | None = None,
                        device_id: int | None = None) -> dict[str, np.ndarray]:
    """Read the allocation stream of a PyTorch profiler Chrome trace.

    Parameters
    ----------
    source : path or binary file
        JSON written by ``torch.profiler.profile(profile_memory=True)``'s
        ``export_chrome_trace``, plain or gzip-compressed (``.json.gz``).
    device_type : int or {"cpu", "cuda"}, optional
        Keep only ``[memory]`` events of this ``Device Type`` (0 is CPU, 1 is
        CUDA). By default the trace must hold one device's events only.
    device_id : int, optional
        Keep only events of this ``Device Id`` (-1 for the CPU).

    Returns
    -------
    dict of numpy.ndarray
        ``op``, ``id``, ``size``, ``stream`` (always 0: the profiler records
        none), ``time`` (seconds since the first event), ordered by timestamp.

    Raises
    ------
    InputError
        If the file is not a trace or a ``[memory]`` event lacks a field (a
        ``ValueError`` naming the file when ``source`` is a path).
    ValueError
        If several devices remain after filtering.
    """
    if isinstance(device_type, str):
        if device_type.lower() not in _DEVICE_TYPES:
            raise ValueError(f"device_type must be an int or one of {list(_DEVICE_TYPES)}, "
                             f"got {device_type!r}")
        device_type = _DEVICE_TYPES[device_type.lower()]
    with _errors_at(source):
        return _profiler_events(_read_bytes(source), device_type, device_id)


def _profiler_events(data: bytes, device_type: int | None,
                     device_id: int | None) -> dict[str, np.ndarray]:
    found = _kineto_memory_events(data)
    ts, args = found if found is not None else _json_memory_events(data)
    if not ts:
        return _make_events([], [], [], [], [])
    try:
        # Column by column: a comprehension per field beats a loop building rows.
        dev_type, dev_id, addr, nbytes = ([a[k] for a in args] for k in
                                          ("Device Type", "Device Id", "Addr", "Bytes"))
        ev_idx = [a.get("Ev Idx", i) for i, a in enumerate(args)]
    except (KeyError, TypeError, AttributeError):
        for i, a in enumerate(args):
            missing = ("args" if not isinstance(a, dict) else
                       next((repr(k) for k in ("Device Type", "Device Id", "Addr", "Bytes")
                             if k not in a), None))
            if missing:
                raise InputError(f"[memory] event {i} has no {missing}: "
                                 f"{{'ts': {ts[i]!r}, 'args': {a!r}}}"[:300]) from None
        raise
    dev_type = _int_array(dev_type, "Device Type")
    dev_id = _int_array(dev_id, "Device Id")
    try:
        ts = np.array(ts, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(f"[memory] event ts must be numbers, got {ts[:3]!r}...") from None
    keep = np.ones(ts.size, dtype=bool)
    if device_type is not None:
        keep &= dev_type == device_type
    if device_id is not None:
        keep &= dev_id == device_id
    devices = sorted(set(zip(dev_type[keep].tolist(), dev_id[keep].tolist())))
    if len(devices) > 1:
        labels = "; ".join(_device_label(*d) for d in devices)
        raise ValueError(f"trace has memory events of several devices: {labels}; pass "
                         "device_type= (and device_id=) to pick one")
    # Kineto writes the [memory] events after the op events, not in time
    # order; "Ev Idx" is the profiler's record index and breaks ties in ts.
    idx = np.flatnonzero(keep)
    idx = idx[np.lexsort((_int_array(ev_idx, "Ev Idx")[idx], ts[idx]))]
    nbytes = _int_array(nbytes, "Bytes")[idx]
    op = np.where(nbytes < 0, FREE, ALLOC).astype(np.int8)
    return _make_events(op, _int_array(addr, "Addr")[idx], np.abs(nbytes),
                        np.zeros(idx.size, dtype=np.int64), ts[idx])


def capture_torch(fn: Callable[..., Any], *args: Any, device: str = "cpu",
                  **kwargs: Any) -> dict[str, np.ndarray]:
    """Run ``fn(*args, **kwargs)`` under PyTorch's profiler and return its allocations.

    The profiler's ``[memory]`` events go through ``export_chrome_trace`` (a
    temporary file) and ``read_profiler_trace``: the in-memory events of the
    public API carry no addresses, so frees could not be paired. ``fn``'s
    result is dropped inside the profiled region, so the frees of tensors it
    returns are recorded too. Frees of memory allocated in an earlier profiled
    region appear as frees of unknown ids; memory allocated before any
    profiling is never reported freed (PyTorch does not know its size).

    Parameters
    ----------
    fn : callable
        The workload.
    *args, **kwargs
        Passed to ``fn``.
    device : {"cpu", "cuda"}
        Whose allocations to record.

    Returns
    -------
    dict of numpy.ndarray
        As ``read_profiler_trace``.
    """
    if device not in _DEVICE_TYPES:
        raise ValueError(f"device must be one of {list(_DEVICE_TYPES)}, got {device!r}")
    try:
        from torch.profiler import ProfilerActivity, profile
    except ImportError as exc:
        raise ImportError("capture_torch needs PyTorch: pip install 'numba_bfc[torch]' "
                          "(or install torch yourself)") from exc
    activities = [ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities, profile_memory=True) as prof:
        result = fn(*args, **kwargs)
        del result
    with tempfile.TemporaryDirectory(prefix="numba_bfc_trace_") as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        return read_profiler_trace(path, device_type=device)
