"""PyTorch trace import (numba_bfc.traces.torch_io) and the bundled traces it captured."""

from __future__ import annotations

import gzip
import io
import json
import math
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from numba_bfc.traces import torch_io
from numba_bfc.traces.torch_io import (
    ALLOC,
    FIELDS,
    FREE,
    assign_ids,
    capture_torch,
    read_profiler_trace,
    read_torch_snapshot,
    write_torch_snapshot,
)

DATA = Path(__file__).resolve().parents[1] / "numba_bfc" / "traces" / "data"
BUNDLED = ("cnn_train", "transformer_train", "generate_kv")


def reference_ids(ops, addrs):
    """The pointer -> id rule spelled out with a dict, one event at a time."""
    live, ids, next_id = {}, [], 0
    for op, addr in zip(ops, addrs):
        if op == ALLOC:
            live[addr] = next_id
            ids.append(next_id)
            next_id += 1
        elif addr in live:
            ids.append(live.pop(addr))
        else:
            ids.append(next_id)
            next_id += 1
    return ids


def check_shape(ev):
    assert set(ev) == set(FIELDS)
    n = len(ev["op"])
    for k, dtype in zip(FIELDS, (np.int8, np.int64, np.int64, np.int64, np.float64)):
        assert ev[k].dtype == dtype and ev[k].shape == (n,), k


def pairs(ev):
    """(alloc index, free index) per freed id; asserts each id is allocated once."""
    first = {}
    out = []
    for i, (op, eid) in enumerate(zip(ev["op"].tolist(), ev["id"].tolist())):
        if op == ALLOC:
            assert eid not in first
            first[eid] = i
        elif eid in first:
            out.append((first[eid], i))
    return out


# ---------------------------------------------------------------------- ids
@given(st.lists(st.tuples(st.sampled_from([ALLOC, FREE]), st.integers(0, 5)), max_size=80))
def test_assign_ids_matches_the_dict_rule(events):
    ops = np.array([e[0] for e in events], dtype=np.int8)
    addrs = np.array([e[1] for e in events], dtype=np.int64)
    assert assign_ids(ops, addrs).tolist() == reference_ids(ops.tolist(), addrs.tolist())


def test_assign_ids_reuse_and_unknown_free():
    ops = [FREE, ALLOC, FREE, ALLOC, FREE, FREE]
    addrs = [7, 7, 7, 7, 7, 7]
    # unknown free, alloc, its free, reuse -> new id, its free, double free -> fresh
    assert assign_ids(np.array(ops), np.array(addrs)).tolist() == [0, 1, 1, 2, 2, 3]


# ---------------------------------------------------------------------- snapshots
def random_events(seed, n=300):
    """A valid alloc/free stream with address-like reuse, plus two unknown frees."""
    rng = np.random.default_rng(seed)
    op, ids, size, stream, time = [], [], [], [], []
    live = {}
    next_id = 0
    for i in range(n):
        if live and rng.random() < 0.45:
            eid = list(live)[rng.integers(len(live))]
            op.append(FREE), ids.append(eid), size.append(live.pop(eid))
        else:
            s = int(rng.choice([512, 1024, 4096, 1 << 20])) + int(rng.integers(0, 3))
            live[next_id] = s
            op.append(ALLOC), ids.append(next_id), size.append(s)
            next_id += 1
        stream.append(int(rng.integers(0, 2)) * 0x5555AAAA)
        time.append(i * 1e-3)
    for extra in (1_000_000, 1_000_001):  # frees of blocks allocated before recording
        op.append(FREE), ids.append(extra), size.append(2048), stream.append(0)
        time.append(n * 1e-3)
    return {"op": np.array(op, np.int8), "id": np.array(ids, np.int64),
            "size": np.array(size, np.int64), "stream": np.array(stream, np.int64),
            "time": np.array(time)}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_snapshot_round_trip(tmp_path, seed):
    ev = random_events(seed)
    path = tmp_path / "snap.pickle"
    write_torch_snapshot(path, ev)
    got = read_torch_snapshot(path)
    check_shape(got)
    assert got["op"].tolist() == ev["op"].tolist()
    assert got["size"].tolist() == ev["size"].tolist()
    assert got["stream"].tolist() == ev["stream"].tolist()
    np.testing.assert_allclose(got["time"], ev["time"], atol=1e-6)
    # Ids may be renumbered, but the pairing is the same: a bijection of ids
    # for everything allocated, and the unknown frees stay unpaired.
    mapping = {}
    for a, b in zip(ev["id"].tolist(), got["id"].tolist()):
        assert mapping.setdefault(a, b) == b
    assert len(set(mapping.values())) == len(mapping)
    assert pairs(got) == pairs(ev)
    unknown = got["id"][-2:]
    assert not np.isin(unknown, got["id"][got["op"] == ALLOC]).any()


def test_snapshot_written_is_format_faithful(tmp_path):
    ev = random_events(3, n=200)
    buf = io.BytesIO()
    write_torch_snapshot(buf, ev, device=1)
    snap = pickle.loads(buf.getvalue())
    assert snap["segments"] == [] and len(snap["device_traces"]) == 2
    assert snap["device_traces"][0] == []
    entries = snap["device_traces"][1]
    actions = [e["action"] for e in entries]
    assert actions.count("alloc") == int((ev["op"] == ALLOC).sum())
    assert actions.count("free_requested") == actions.count("free_completed") == int(
        (ev["op"] == FREE).sum())
    for e in entries:
        assert {"action", "addr", "size", "stream", "time_us", "frames"} <= set(e)
        assert isinstance(e["time_us"], int) and e["frames"] == []
    # Live blocks never overlap, and some address is reused after a free.
    live = {}
    for e in entries:
        if e["action"] == "alloc":
            for a, s in live.items():
                assert e["addr"] + e["size"] <= a or a + s <= e["addr"]
            live[e["addr"]] = e["size"]
        elif e["action"] == "free_completed":
            live.pop(e["addr"], None)
    addrs = [e["addr"] for e in entries if e["action"] == "alloc"]
    assert len(set(addrs)) < len(addrs)
    # File objects, gzip and the other device index all read back.
    got = read_torch_snapshot(io.BytesIO(gzip.compress(buf.getvalue())))
    assert got["size"].tolist() == ev["size"].tolist()
    with pytest.raises(ValueError, match="out of range"):
        read_torch_snapshot(io.BytesIO(buf.getvalue()), device=2)


def test_snapshot_writer_fills_zero_free_sizes_and_rejects_live_ids(tmp_path):
    ev = {"op": [ALLOC, FREE], "id": [4, 4], "size": [100, 0]}
    write_torch_snapshot(tmp_path / "s.pkl", ev)
    got = read_torch_snapshot(tmp_path / "s.pkl")
    assert got["size"].tolist() == [100, 100] and np.isnan(got["time"]).all()
    with pytest.raises(ValueError, match="allocated again while live"):
        write_torch_snapshot(io.BytesIO(), {"op": [0, 0], "id": [1, 1], "size": [8, 8]})
    with pytest.raises(ValueError, match="op"):
        write_torch_snapshot(io.BytesIO(), {"op": [0, 2], "id": [1, 2], "size": [8, 8]})
    with pytest.raises(ValueError, match="lack"):
        write_torch_snapshot(io.BytesIO(), {"op": [0], "size": [8]})


def entry(action, addr=None, size=0, stream=0, time_us=None, **extra):
    e = {"action": action, "size": size, "stream": stream, "frames": [], **extra}
    if action == "oom":
        e["device_free"] = 0
    else:
        e["addr"] = addr
    if time_us is not None:
        e["time_us"] = time_us
    return e


def hand_snapshot():
    base = 1_700_000_000_000_000  # epoch microseconds, as PyTorch writes them
    dev1 = [
        entry("segment_alloc", 0x1000, 2 << 20, time_us=base),
        entry("free_completed", 0x9000, 512, time_us=base + 5),  # allocated before recording
        entry("alloc", 0x1000, 512, stream=7, time_us=base + 10),
        entry("alloc", 0x1200, 1024, time_us=base + 20),
        entry("segment_map", 0x3000, 2 << 20, time_us=base + 25),
        entry("free_requested", 0x1000, 512, stream=7, time_us=base + 30),
        entry("snapshot", 0, 0, time_us=base + 35),
        entry("oom", size=1 << 40, time_us=base + 36),
        entry("free_completed", 0x1000, 512, stream=7, time_us=base + 40),
        entry("alloc", 0x1000, 256, time_us=base + 50),  # reused address: new id
        entry("segment_unmap", 0x3000, 2 << 20, time_us=base + 55),
        entry("free_requested", 0x1000, 256, time_us=base + 60),
        entry("free_completed", 0x1000, 256, time_us=base + 70),
        entry("segment_free", 0x1000, 2 << 20, time_us=base + 80),
    ]
    dev0 = [entry("segment_alloc", 0x5000, 2 << 20, time_us=base),
            entry("snapshot", 0, 0, time_us=base + 1)]
    return {"segments": [], "device_traces": [dev0, dev1, []],
            "allocator_settings": {}, "external_annotations": []}


def test_snapshot_actions_and_device_choice():
    snap = hand_snapshot()
    data = pickle.dumps(snap)
    got = read_torch_snapshot(io.BytesIO(data))  # device 1: the only one with allocations
    check_shape(got)
    assert got["op"].tolist() == [FREE, ALLOC, ALLOC, FREE, ALLOC, FREE]
    assert got["size"].tolist() == [512, 512, 1024, 512, 256, 256]
    assert got["id"].tolist() == [0, 1, 2, 1, 3, 3]
    assert got["stream"].tolist() == [0, 7, 0, 7, 0, 0]
    np.testing.assert_allclose(got["time"], [0, 5e-6, 15e-6, 35e-6, 45e-6, 65e-6])
    empty = read_torch_snapshot(io.BytesIO(data), device=0)
    assert all(len(v) == 0 for v in empty.values())
    check_shape(empty)

    snap["device_traces"][2] = [entry("alloc", 0x10, 64)]
    data = pickle.dumps(snap)
    with pytest.raises(ValueError, match=r"devices \[1, 2\]"):
        read_torch_snapshot(io.BytesIO(data))
    got2 = read_torch_snapshot(io.BytesIO(data), device=2)
    assert got2["op"].tolist() == [ALLOC] and np.isnan(got2["time"]).all()


@pytest.mark.parametrize("obj, match", [
    (42, "a snapshot is a dict, got int"),
    ([{"address": 0, "blocks": []}], "segments only"),
    ({"segments": []}, "no 'device_traces'"),
    ({"segments": [], "device_traces": {}}, "list of lists"),
    ({"segments": [], "device_traces": [["alloc"]]}, "entry 0 is a str"),
    ({"segments": [], "device_traces": [[{"action": "alloc", "size": 8}]]}, "has no 'addr'"),
    ({"segments": [], "device_traces": [[{"action": "alloc", "addr": 1.5, "size": 8}]]},
     "integers"),
])
def test_snapshot_malformed(obj, match):
    with pytest.raises(ValueError, match=match):
        read_torch_snapshot(io.BytesIO(pickle.dumps(obj)))


def test_snapshot_not_a_pickle_and_no_code(tmp_path):
    with pytest.raises(ValueError, match="not a snapshot pickle"):
        read_torch_snapshot(io.BytesIO(b"certainly not a pickle"))
    with pytest.raises(ValueError, match="corrupt or truncated gzip"):
        read_torch_snapshot(io.BytesIO(b"\x1f\x8b" + b"\x00" * 20))
    # A pickle naming a callable is refused before anything runs.
    with pytest.raises(ValueError, match="refusing to load"):
        read_torch_snapshot(io.BytesIO(pickle.dumps({"device_traces": [], "x": print})))
    with pytest.raises(ValueError, match="binary"):
        read_torch_snapshot(io.StringIO("text"))


# ---------------------------------------------------------------------- profiler traces
def mem_event(ts, addr, nbytes, idx, device_type=0, device_id=-1):
    return {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",
            "pid": 1, "tid": 1, "ts": ts,
            "args": {"Total Reserved": 0, "Total Allocated": 0, "Bytes": nbytes,
                     "Device Id": device_id, "Device Type": device_type, "Addr": addr,
                     "finished": False, "Ev Idx": idx}}


def hand_trace():
    t0 = 4472594901136.332
    mem = [
        mem_event(t0 + 0.0, 0xA0, -64, 10),          # freed, never allocated here
        mem_event(t0 + 1.0, 0xB0, 4096, 11),
        mem_event(t0 + 2.0, 0xC0, 16, 12),
        mem_event(t0 + 3.0, 0xB0, -4096, 13),
        mem_event(t0 + 4.0, 0xB0, 1024, 14),          # address reused: new id
        mem_event(t0 + 4.0, 0xB0, -1024, 15),         # same ts: Ev Idx orders
        mem_event(t0 + 5.0, 0xC0, -16, 16),
        mem_event(t0 + 6.0, 0xD0, 0, 17),             # zero bytes: no allocation
    ]
    ops = [{"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 1, "tid": 1,
            "ts": t0, "dur": 3.0, "args": {"Ev Idx": 1}},
           {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}}]
    # Kineto writes [memory] events after the ops and not necessarily in time order.
    return {"schemaVersion": 1, "traceEvents": ops + mem[::-1], "traceName": "x"}


def test_profiler_trace(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(hand_trace()))
    got = read_profiler_trace(path)
    check_shape(got)
    assert got["op"].tolist() == [FREE, ALLOC, ALLOC, FREE, ALLOC, FREE, FREE]
    assert got["id"].tolist() == [0, 1, 2, 1, 3, 3, 2]
    assert got["size"].tolist() == [64, 4096, 16, 4096, 1024, 1024, 16]
    assert got["stream"].tolist() == [0] * 7
    np.testing.assert_allclose(got["time"], [0, 1e-6, 2e-6, 3e-6, 4e-6, 4e-6, 5e-6],
                               atol=1e-9)
    gz = tmp_path / "trace.json.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    for source in (gz, io.BytesIO(gz.read_bytes())):
        again = read_profiler_trace(source)
        for k in FIELDS:
            np.testing.assert_array_equal(again[k], got[k])
    # The Trace Event Format's bare-array form.
    bare = read_profiler_trace(io.BytesIO(json.dumps(hand_trace()["traceEvents"]).encode()))
    assert bare["id"].tolist() == got["id"].tolist()


def kineto_text(trace):
    """``trace`` laid out as kineto's exporter writes it (memory events, at least)."""
    parts = []
    for e in trace["traceEvents"]:
        if e.get("name") != "[memory]":
            parts.append(json.dumps(e, indent=2))
            continue
        args = ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in e["args"].items())
        parts.append(f'  {{\n    "ph": "i",\n    "cat": "cpu_instant_event",\n    "s": "t",\n'
                     f'    "name": "[memory]",\n    "pid": {e["pid"]},\n    "tid": {e["tid"]},\n'
                     f'    "ts": {e["ts"]}\n    ,\n    "args": {{\n      {args}\n    }}\n  }}')
    return ('{\n  "schemaVersion": 1,\n  "traceEvents": [\n' + ",\n".join(parts)
            + '\n  ],"traceName": "x" }\n')


def test_profiler_trace_fast_and_thorough_paths_agree():
    text = kineto_text(hand_trace()).encode()
    assert torch_io._kineto_memory_events(text) is not None  # the fast path applies
    fast = read_profiler_trace(io.BytesIO(text))
    # Keys in another order, or a "[memory]" string elsewhere, take the full decode.
    reordered = hand_trace()
    reordered["traceEvents"] = [dict(reversed(list(e.items())))
                                for e in reordered["traceEvents"]]
    other = json.dumps(reordered).encode()
    assert torch_io._kineto_memory_events(other) is None
    mentioned = json.dumps({**hand_trace(), "note": "[memory]"}).encode()
    assert torch_io._kineto_memory_events(mentioned) is None
    for data in (other, mentioned, json.dumps(hand_trace()).encode()):
        slow = read_profiler_trace(io.BytesIO(data))
        for k in FIELDS:
            np.testing.assert_array_equal(slow[k], fast[k])
    # A truncated file is not taken for a complete one.
    with pytest.raises(ValueError, match="not a JSON trace"):
        read_profiler_trace(io.BytesIO(text[: len(text) // 2]))


def test_profiler_trace_devices():
    trace = hand_trace()
    trace["traceEvents"] += [mem_event(1.0, 0xF0, 512, 30, 1, 0),
                             mem_event(2.0, 0xF0, -512, 31, 1, 0)]
    data = json.dumps(trace).encode()
    with pytest.raises(ValueError, match=r"several devices: CPU .*CUDA"):
        read_profiler_trace(io.BytesIO(data))
    cpu = read_profiler_trace(io.BytesIO(data), device_type="cpu")
    assert len(cpu["op"]) == 7
    assert read_profiler_trace(io.BytesIO(data), device_type=0)["id"].tolist() == \
        cpu["id"].tolist()
    cuda = read_profiler_trace(io.BytesIO(data), device_type="cuda", device_id=0)
    assert cuda["op"].tolist() == [ALLOC, FREE] and cuda["size"].tolist() == [512, 512]
    none = read_profiler_trace(io.BytesIO(data), device_type=1, device_id=3)
    assert len(none["op"]) == 0
    with pytest.raises(ValueError, match="device_type must be"):
        read_profiler_trace(io.BytesIO(data), device_type="tpu")


def test_profiler_trace_without_memory_events():
    got = read_profiler_trace(io.BytesIO(b'{"traceEvents": []}'))
    check_shape(got)
    assert len(got["op"]) == 0


@pytest.mark.parametrize("text, match", [
    (b"{not json", "not a JSON trace"),
    (b"\xff\xfe\x00", "not a JSON trace"),
    (b'{"schemaVersion": 1}', "no 'traceEvents'"),
    (b"42", "must be a list, got int"),
    (b'{"traceEvents": 5}', "must be a list"),
    (b'[{"name": "[memory]", "ts": 1, "args": {"Addr": 1, "Device Type": 0,'
     b' "Device Id": -1}}]', "has no 'Bytes'"),
    (b'[{"name": "[memory]", "ts": 1}]', "has no args"),
    (b'[{"name": "[memory]", "ts": 1, "args": {"Addr": "0x10", "Bytes": 8,'
     b' "Device Type": 0, "Device Id": -1}}]', "Addr must be 64-bit integers"),
])
def test_profiler_trace_malformed(text, match):
    with pytest.raises(ValueError, match=match):
        read_profiler_trace(io.BytesIO(text))


# ---------------------------------------------------------------------- capture
def test_capture_without_torch_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setitem(sys.modules, "torch.profiler", None)
    with pytest.raises(ImportError, match=r"numba_bfc\[torch\]"):
        capture_torch(lambda: None)
    with pytest.raises(ValueError, match="device must be"):
        capture_torch(lambda: None, device="tpu")


def test_capture_torch_sees_a_mebibyte():
    torch = pytest.importorskip("torch")

    def work(n, scale=1.0):
        x = torch.ones(n)  # 1 MiB of float32
        y = (x * scale).sum()
        del x
        return y  # dropped inside the profiled region, so freed there too

    ev = capture_torch(work, 1 << 18, scale=2.0)
    check_shape(ev)
    big = np.flatnonzero((ev["op"] == ALLOC) & (ev["size"] >= 1 << 20))
    assert big.size >= 2  # the ones and the product
    for i in big:
        frees = np.flatnonzero((ev["op"] == FREE) & (ev["id"] == ev["id"][i]))
        assert frees.size == 1 and frees[0] > i and ev["size"][frees[0]] == ev["size"][i]
    # Everything allocated inside was freed inside, and nothing else was freed.
    assert len(pairs(ev)) * 2 == len(ev["op"])
    assert np.all(np.diff(ev["time"]) >= 0) and ev["time"][0] == 0


def test_capture_torch_matches_pytorch_memory_viz_snapshot(tmp_path):
    torch = pytest.importorskip("torch")
    profiler = pytest.importorskip("torch.profiler")
    try:
        from torch.cuda._memory_viz import _profile_to_snapshot  # private, may move
    except ImportError:
        pytest.skip("this torch has no _profile_to_snapshot")
    with profiler.profile(activities=[profiler.ProfilerActivity.CPU], profile_memory=True,
                          record_shapes=True, with_stack=True) as prof:
        x = torch.ones(1 << 18)
        y = x * 2
        del x
        z = y.sum()
        del y, z
    path = tmp_path / "viz.pickle"
    path.write_bytes(pickle.dumps(_profile_to_snapshot(prof)))
    got = read_torch_snapshot(path)  # a snapshot built by PyTorch itself
    check_shape(got)
    assert (got["size"][got["op"] == ALLOC] == 1 << 20).sum() == 2
    assert len(pairs(got)) * 2 == len(got["op"])
    trace_path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(trace_path))
    prof_ev = read_profiler_trace(trace_path)
    assert sorted(prof_ev["size"].tolist()) == sorted(got["size"].tolist())
    # PyTorch's own export takes the fast path, and it agrees with a full decode.
    raw = trace_path.read_bytes()
    assert torch_io._kineto_memory_events(raw) == torch_io._json_memory_events(raw)


# ---------------------------------------------------------------------- bundled traces
def read_bundled(name):
    with gzip.open(DATA / f"{name}.csv.gz", "rt", encoding="ascii", newline="") as f:
        lines = f.read().splitlines()
    return lines[0], [line.split(",") for line in lines[1:]]


@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_trace_is_well_formed(name):
    header, rows = read_bundled(name)
    assert header == "op,id,size,stream,time"
    assert 1000 <= len(rows) <= 200_000
    assert (DATA / f"{name}.csv.gz").stat().st_size < 1 << 20
    live = {}
    seen = set()
    last_time = -math.inf
    for row in rows:
        assert len(row) == 5
        op, eid, size, stream, t = row[0], int(row[1]), int(row[2]), int(row[3]), float(row[4])
        assert size > 0 and stream == 0 and t >= last_time
        last_time = t
        if op == "a":
            assert eid not in seen, f"id {eid} allocated twice"
            seen.add(eid)
            live[eid] = size
        else:
            assert op == "f"
            assert live.pop(eid) == size, f"free of id {eid} does not match its alloc"
