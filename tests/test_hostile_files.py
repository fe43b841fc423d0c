"""Hostile files and flags (issue 21): readers raise ``InputError`` naming file,
line and field; the commands answer bad input with one ``error:`` line and exit
status 2, never a traceback; a snapshot cannot make its reader work for
minutes; a host backend's views are safe while other threads map and unmap.
"""

import contextlib
import gzip
import importlib
import io
import json
import pickle
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numba_bfc import InputError, TraceError
from numba_bfc.__main__ import main as top_main
from numba_bfc.backends import HostSubAllocator
from numba_bfc.cli import replay as replay_cli
from numba_bfc.cli.plan import main as plan_main
from numba_bfc.planning import parse_records, read_records
from numba_bfc.planning import search as planning_search
from numba_bfc.planning.instances import gadget_instance
from numba_bfc.traces import (
    MAX_LIMIT,
    Trace,
    make_allocator,
    min_limit,
    read_rmm_log,
    replay,
    torch_io,
)

replay_module = importlib.import_module("numba_bfc.traces.replay")  # the name is a function too
POLICIES = ["bfc", "caching", "compact"]
RMM_HEADER = "Thread,Time,Action,Pointer,Size,Stream"
TOO_BIG = str(1 << 64)


def _replay_cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    code = replay_cli.main(list(argv), out, err)
    return code, out.getvalue(), err.getvalue()


def _plan_cli(capsys, *argv):
    code = plan_main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _one_error_line(err, command):
    """The last stderr line is the one error line (argparse's usage may come first)."""
    assert "Traceback" not in err and "np." not in err
    last = err.rstrip("\n").splitlines()[-1]
    assert last.startswith(f"numba-bfc {command}: error: ")
    return last


def _gz(data: bytes) -> bytes:
    return gzip.compress(data)


# ---------------------------------------------------------------------- readers
# (file name, content, line, field): what each reader must say about it.
BAD_TRACE_FILES = [
    ("size.csv", f"op,id,size\na,1,{TOO_BIG}\n".encode(), 2, "size"),
    ("id.csv", f"op,id,size\na,1,5\na,{TOO_BIG},5\n".encode(), 3, "id"),
    ("stream.csv", f"op,id,size,stream\na,1,5,-{TOO_BIG}\n".encode(), 2, "stream"),
    ("negid.csv", f"op,id,size\na,-{1 << 63 + 1},5\n".encode(), 2, "id"),
    ("op.csv", b"op,id,size\na,1,5\nz,1,5\n", 3, "op"),
    ("rmm_size.csv", f"{RMM_HEADER}\n1,00:00:00.1,allocate,0x10,{1 << 63},0\n".encode(), 2,
     "Size"),
    ("rmm_ptr.csv", f"{RMM_HEADER}\n1,00:00:00.1,allocate,0x1{'0' * 16},8,0\n".encode(), 2,
     "Pointer"),
    ("rmm_thread.csv", f"{RMM_HEADER}\n{TOO_BIG},00:00:00.1,allocate,0x10,8,0\n".encode(), 2,
     "Thread"),
    ("truncated.csv.gz", _gz(b"op,id,size\n" + b"a,1,10\nf,1,\n" * 500)[:-40], None, None),
    ("corrupt.csv.gz", _gz(b"op,id,size\na,1,10\n")[:12] + b"\xff" * 30, None, None),
    ("latin1.csv", b"op,id,size\na,1,\xe9\n", None, None),
    ("deep.json", b"[" * 100_000 + b"]" * 100_000, None, None),
    ("deep_events.json", b'{"traceEvents": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
     None, None),
    ("garbage.pickle", b"\x80\x04\x95garbage", None, None),
    ("event.csv", b"op,id,size\na,1,5\nf,2,\n", 3, "id"),  # frees an unknown id
]


@pytest.mark.parametrize("name,content,line,field", BAD_TRACE_FILES,
                         ids=[f[0] for f in BAD_TRACE_FILES])
def test_trace_readers_raise_input_error_naming_file_line_and_field(tmp_path, name, content,
                                                                     line, field):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(InputError) as e:
        Trace.read(path)
    assert isinstance(e.value, ValueError)
    assert e.value.path == str(path) and str(e.value).startswith(f"{path}: ")
    assert e.value.line == line and e.value.field == field
    if line is not None:
        assert str(e.value).startswith(f"{path}: line {line}: ")
    # The command line says the same in one line, exit status 2.
    code, out, err = _replay_cli(str(path), "--strict")
    assert code == 2 and out == ""
    assert _one_error_line(err, "replay").startswith(f"numba-bfc replay: error: {path}: ")


def test_a_bad_event_of_a_read_trace_is_a_trace_error_at_its_line(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("op,id,size\n\na,1,5\nf,1,\nf,1,\n")
    with pytest.raises(TraceError) as e:
        Trace.read(path)
    assert (e.value.path, e.value.line, e.value.index) == (str(path), 5, 2)
    assert (e.value.problem, e.value.field) == ("double_free", "id")
    assert "Trace.clean()" in str(e.value)  # the Python API names the Python fix
    code, _, err = _replay_cli(str(path), "--strict")
    line = _one_error_line(err, "replay")
    assert f"{path}: line 5: event 2 frees id 1" in line
    assert "run without --strict" in line and "Trace.clean" not in line


def test_input_errors_survive_pickling_with_their_attributes():
    error = TraceError("event 3 frees id 9", index=3, problem="unknown_free", path="t.csv",
                       line=7, hint="drop it")
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is TraceError and str(back) == str(error)
    assert (back.path, back.line, back.field, back.index, back.hint) == ("t.csv", 7, "id", 3,
                                                                         "drop it")
    with pytest.raises(TypeError, match="no attribute colour"):
        error.replace(colour="red")


def test_rmm_and_planner_readers_name_the_file(tmp_path):
    rmm = tmp_path / "log.csv"
    rmm.write_text(f"{RMM_HEADER}\n1,00:00:00.1,allocate,0xZZ,8,0\n")
    with pytest.raises(InputError) as e:
        read_rmm_log(rmm)
    assert (e.value.path, e.value.line, e.value.field) == (str(rmm), 2, "Pointer")
    with pytest.raises(InputError) as e:
        read_rmm_log(io.StringIO(f"{RMM_HEADER}\n1,00:00:00.1,free,0x10,8\n"))
    assert (e.value.path, e.value.line) == (None, 2)
    plan = tmp_path / "plan.csv"
    plan.write_text(f"size,first,last\n16,0,1\n16,0,{TOO_BIG}\n")
    with pytest.raises(InputError) as e:
        read_records(plan)
    assert (e.value.path, e.value.line, e.value.field) == (str(plan), 3, "last")
    plan.write_bytes(b"size,first,last\n16,0,\xff\n")
    with pytest.raises(InputError, match="not UTF-8"):
        read_records(plan)


def test_minimalloc_ids_are_names():
    """MiniMalloc reads ids as text: only the numbers must be integers."""
    assert parse_records("id,lower,upper,size\nconv1,0,2,16\n").tolist() == [(16, 0, 1)]


# Sizes at every int64 boundary, in every column of every text format.
_BOUNDARIES = [0, 1, (1 << 31) - 1, 1 << 32, (1 << 62) - 1, 1 << 62, (1 << 63) - 1, 1 << 63,
               1 << 64, -1, -(1 << 63), -(1 << 63) - 1]


@settings(max_examples=60, deadline=None)
@given(column=st.sampled_from(["id", "size", "stream"]), value=st.sampled_from(_BOUNDARIES),
       policy=st.sampled_from(POLICIES))
def test_trace_csv_boundaries_read_or_fail_as_input_errors(tmp_path_factory, column, value,
                                                           policy):
    cells = {"id": 1, "size": 4096, "stream": 0}
    cells[column] = value
    path = tmp_path_factory.mktemp("b") / "t.csv"
    path.write_text(f"op,id,size,stream\na,{cells['id']},{cells['size']},{cells['stream']}\n"
                    f"f,{cells['id']},,{cells['stream']}\n")
    try:
        trace = Trace.read(path)
    except InputError as e:
        assert e.path == str(path) and e.line in (2, 3) and e.field == column
        code, _, err = _replay_cli(str(path), "--strict", "-p", policy)
        assert code == 2
        _one_error_line(err, "replay")
        return
    assert -(1 << 63) <= value < 1 << 63  # read only when it fits
    result = replay(trace, policy, limit=1 << 30)
    assert result.events == 2 and result.ooms == (0 if trace.sizes[0] <= 1 << 30 else 1)
    code, out, err = _replay_cli(str(path), "-p", policy, "--limit", "1GiB", "--json")
    assert code == 0 and json.loads(out)[0]["events"] == 2


@settings(max_examples=40, deadline=None)
@given(column=st.sampled_from([0, 1, 2]), value=st.sampled_from(_BOUNDARIES))
def test_planner_boundaries_read_or_fail_as_input_errors(tmp_path_factory, column, value):
    cells = [16, 0, 5]
    cells[column] = value
    path = tmp_path_factory.mktemp("p") / "r.csv"
    path.write_text("size,first,last\n" + ",".join(map(str, cells)) + "\n")
    try:
        records = read_records(path)
    except InputError as e:
        assert e.path == str(path) and e.line == 2
        assert e.field in ("size", "first", "last")
        return
    assert records.tolist() == [tuple(cells)]


# ---------------------------------------------------------------------- snapshot bombs
def test_a_snapshot_whose_lists_repeat_one_object_is_refused_at_once(tmp_path):
    entry = {"action": "alloc", "addr": 4096, "size": 512, "stream": 0}
    inner = [entry] * 60_000
    path = tmp_path / "bomb.pickle"
    path.write_bytes(pickle.dumps({"device_traces": [inner] * 60_000, "segments": []}))
    assert path.stat().st_size < 1_000_000  # 3.6e9 entries in under a megabyte
    with pytest.raises(InputError, match="repeat shared objects") as e:
        Trace.read(path)
    assert e.value.path == str(path) and e.value.field == "device_traces"


def test_a_real_snapshot_of_distinct_entries_still_reads(tmp_path):
    entries = []
    for k in range(2000):
        entries.append({"action": "alloc", "addr": 4096 * (k + 1), "size": 512, "stream": 0})
        entries.append({"action": "free_completed", "addr": 4096 * (k + 1), "size": 512,
                        "stream": 0})
    path = tmp_path / "ok.pickle"
    path.write_bytes(pickle.dumps({"device_traces": [entries], "segments": []}))
    assert len(Trace.read(path)) == 4000
    assert len(torch_io.read_torch_snapshot(io.BytesIO(path.read_bytes()))["op"]) == 4000


# ---------------------------------------------------------------------- limits
@pytest.mark.parametrize("policy", POLICIES)
def test_a_zero_limit_means_the_same_for_every_policy(policy):
    with pytest.raises(ValueError, match=r"limit must be from 1 to 2\*\*62 - 1 bytes"):
        make_allocator(policy, 0)
    with pytest.raises(ValueError, match="limit must be from 1"):
        make_allocator(policy, MAX_LIMIT + 1)
    with pytest.raises(TypeError, match="limit must be an int"):
        make_allocator(policy, 1.5)
    code, out, err = _replay_cli("synthetic:bursty", "-p", policy, "--limit", "0")
    assert code == 2 and out == ""
    assert "--limit must be at least 1 byte (leave it out for no limit)" in _one_error_line(
        err, "replay")


@pytest.mark.parametrize("limit", ["99999999TiB", str(1 << 62), "12GB", "-5", "1.5"])
def test_limits_past_what_a_policy_takes_are_one_error_line(limit):
    code, out, err = _replay_cli("synthetic:bursty", "--limit", limit)
    assert code == 2 and out == ""
    assert "argument --limit/-l" in _one_error_line(err, "replay")


def test_min_limit_of_a_request_near_2_62_is_a_value_error(tmp_path):
    trace = Trace.from_arrays([0, 1], [1, 1], [1 << 62, 0])
    with pytest.raises(ValueError, match="at every limit it takes"):
        min_limit(trace, "bfc")
    path = tmp_path / "near.csv"
    trace.write(path)
    code, out, err = _replay_cli(str(path), "--min-limit", "-p", "caching")
    assert code == 2 and out == ""
    assert "caching runs out of memory on near at every limit" in _one_error_line(err, "replay")


# ---------------------------------------------------------------------- the commands
def test_a_trace_with_no_replayable_event_is_an_error_naming_the_flag(tmp_path):
    path = tmp_path / "frees.csv"
    path.write_text("op,id,size\nf,1,\nf,2,\n")
    code, out, err = _replay_cli(str(path))
    assert code == 2 and out == ""
    line = _one_error_line(err, "replay")
    assert "none of its events can be replayed (unknown_free: 2)" in line and "--strict" in line
    assert "Trace." not in line


def test_plot_without_matplotlib_fails_before_any_replay(monkeypatch, tmp_path):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real(name, *a))
    calls = []
    monkeypatch.setattr(replay_cli, "run_sweep_task", lambda *a, **k: calls.append(a))
    code, out, err = _replay_cli("synthetic:bursty", "--plot", str(tmp_path / "p.png"))
    assert code == 2 and out == "" and calls == []
    assert "--plot needs matplotlib" in _one_error_line(err, "replay")
    monkeypatch.undo()
    code, _, err = _replay_cli("synthetic:bursty", "--plot", str(tmp_path / "no" / "p.png"))
    assert code == 2 and "no such directory" in _one_error_line(err, "replay")


@pytest.mark.parametrize("argv,message", [
    (["--alignment", "3"], "3 is not a power of two"),
    (["--alignment", str(1 << 64)], "above the largest allowed"),
    (["--alignment", "0"], "below the smallest allowed"),
    (["--capacity", "1KB"], "is not a byte count"),
    (["-s", "search", "--time-limit", "-1"], "not a number above 0"),
    (["-s", "search", "--time-limit", "nan"], "not a number above 0"),
])
def test_plan_flags_are_checked_with_one_error_line(capsys, tmp_path, argv, message):
    path = tmp_path / "r.csv"
    path.write_text("size,first,last\n16,0,1\n8,1,2\n")
    code, out, err = _plan_cli(capsys, str(path), *argv)
    assert code == 2 and out == ""
    assert message in _one_error_line(err, "plan")


def test_plan_capacity_takes_the_units_limit_takes(capsys, tmp_path):
    path = tmp_path / "r.csv"
    path.write_text("size,first,last\n1024,0,0\n1024,1,1\n")
    code, out, _ = _plan_cli(capsys, str(path), "-s", "search", "--capacity", "1KiB", "--json")
    assert code == 0 and json.loads(out)["total_size"] == 1024


def test_help_texts_name_the_command_and_carry_no_markup(capsys):
    assert plan_main(["--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: numba-bfc plan")
    with pytest.raises(SystemExit) as e:
        top_main(["--help"])
    assert e.value.code == 0
    assert "``" not in capsys.readouterr().out


def test_search_starts_its_clock_after_compiling(monkeypatch):
    """A slow compile (a cold cache) must not eat the time limit."""
    monkeypatch.setattr(planning_search, "compile_kernels", lambda: _sleep_and_say(0.4))
    recs, _ = gadget_instance(60, 1 << 20, horizon=100, gadgets=2, scale=1 << 14, seed=1)
    cols = [np.ascontiguousarray(recs[f]) for f in ("size", "first", "last")]
    _, _, stats = planning_search.search_offsets(*cols, time_limit=0.3)
    assert stats.compile_seconds == 0.4 and stats.nodes > 0 and stats.optimal


def _sleep_and_say(seconds):
    threading.Event().wait(seconds)
    return seconds


def test_first_replay_times_compilation_apart(monkeypatch):
    monkeypatch.setattr(replay_module, "_warmed", set())
    trace = Trace.from_arrays([0, 0, 1, 1], [1, 2, 1, 2], [100, 5000, 0, 0])
    first = replay(trace, "compact")
    again = replay(trace, "compact")
    assert first.compile_seconds > 0 and again.compile_seconds == 0.0
    assert first.to_dict()["compile_seconds"] == first.compile_seconds
    assert (first.peak_reserved_bytes, first.addresses.tolist()) == (
        again.peak_reserved_bytes, again.addresses.tolist())


# ---------------------------------------------------------------------- host views
@pytest.mark.parametrize("contiguous", [False, True])
def test_host_views_are_safe_while_other_threads_map_and_unmap(contiguous):
    backend = HostSubAllocator(capacity=64 << 20, contiguous=contiguous)
    ptr, size = backend.alloc(1 << 16, 256)
    backend.view(ptr, size)[:] = 0xA5
    stop = threading.Event()
    errors = []

    def churn():
        held = []
        try:
            while not stop.is_set():
                got = backend.alloc(4096, 256)
                if got:
                    held.append(got)
                if len(held) > 64 or got is None:
                    # A contiguous backend frees from the top only when whole.
                    for p, n in reversed(held):
                        backend.free(p, n)
                    held.clear()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    workers = [threading.Thread(target=churn)]
    for w in workers:
        w.start()
    try:
        for _ in range(3000):
            view = backend.view(ptr, size)
            assert view.size == size and view[0] == 0xA5 and view[-1] == 0xA5
            backend.mapped_ranges()
    finally:
        stop.set()
        for w in workers:
            w.join()
    assert errors == []


_ALIGNMENTS = [1, 2, 3, 255, 256, 1 << 32, (1 << 40) + 1, 1 << 61, (1 << 62) - 1, 1 << 62,
               (1 << 63) - 1, 1 << 63, 1 << 64, 0, -1, -(1 << 63)]


@settings(max_examples=40, deadline=None)
@given(alignment=st.sampled_from(_ALIGNMENTS),
       sizes=st.lists(st.sampled_from([1, 255, 4096, 1 << 40, 1 << 61]), min_size=1, max_size=4))
def test_planner_alignments_near_every_boundary(tmp_path_factory, alignment, sizes):
    from numba_bfc.planning import assign_offsets, validate

    records = [(s, k, k + 1) for k, s in enumerate(sizes)]
    try:
        plan = assign_offsets(records, "greedy_by_size", alignment=alignment)
    except ValueError as e:
        assert "alignment" in str(e) or "2**62" in str(e)
    else:
        validate(records, plan)
        assert 0 <= plan.total_size < 1 << 62
        assert all(int(o) % alignment == 0 for o in plan.offsets)
    path = tmp_path_factory.mktemp("a") / "r.csv"
    path.write_text("size,first,last\n" + "".join(f"{s},{f},{la}\n" for s, f, la in records))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = plan_main([str(path), "--alignment", str(alignment)])
    assert code in (0, 2)
    if code == 2:
        _one_error_line(err.getvalue(), "plan")
