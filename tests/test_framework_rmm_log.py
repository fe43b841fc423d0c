"""RMM's logging_resource_adaptor CSV: our writer, our reader, and RMM's own output."""

import datetime as dt
import io
import random

import numpy as np
import pytest

from numba_bfc.traces import (
    ACTIONS,
    HEADER,
    RmmLogEvent,
    RmmLogWriter,
    events_to_array,
    format_rmm_event,
    read_rmm_log,
    write_rmm_log,
)
from numba_bfc.traces import RMM_EVENT_DTYPE as EVENT_DTYPE

# As RMM 25+ writes it: spdlog "%t,%H:%M:%S.%f,%v", printf %p ("(nil)" for null),
# the stream through std::hex (libstdc++ prints a null handle as "0").
RMM_NEW = """Thread,Time,Action,Pointer,Size,Stream
2217651,09:41:07.000123,allocate,0x7f6e3a000000,1024,0
2217651,09:41:07.000131,allocate,0x7f6e3a000400,2048,0x55d0c8a1e2b0
2217652,09:41:07.000140,allocate failure,(nil),17179869184,0
2217651,23:59:59.999999,free,0x7f6e3a000000,1024,0
"""
# As fmt-based RMM (2020-2024) wrote it: fmt "{}" of a null pointer is 0x0, fmt::ptr of the
# default stream is 0x0; files written on Windows may end lines with CRLF.
RMM_OLD = ("Thread,Time,Action,Pointer,Size,Stream\r\n"
           "140213,14:03:22.123456,allocate,0x7f3a40000000,256,0x0\r\n"
           "140213,14:03:22.123502,allocate failure,0x0,512,0x0\r\n"
           "140213,14:03:22.123610,free,0x7f3a40000000,256,0x0\r\n")


def test_reads_rmm_25_logs():
    ev = read_rmm_log(io.StringIO(RMM_NEW))
    assert [e.action for e in ev] == ["allocate", "allocate", "allocate failure", "free"]
    assert ev[0] == RmmLogEvent(2217651, dt.time(9, 41, 7, 123), "allocate", 0x7F6E3A000000,
                                1024, 0)
    assert ev[1].stream == 0x55D0C8A1E2B0
    assert ev[2].pointer == 0 and ev[2].size == 1 << 34 and ev[2].thread == 2217652
    assert ev[3].time == dt.time(23, 59, 59, 999999)


def test_reads_older_fmt_based_rmm_logs_with_crlf(tmp_path):
    path = tmp_path / "old.csv"
    path.write_bytes(RMM_OLD.encode())
    ev = read_rmm_log(path)
    assert [(e.action, e.pointer, e.size, e.stream) for e in ev] == [
        ("allocate", 0x7F3A40000000, 256, 0), ("allocate failure", 0, 512, 0),
        ("free", 0x7F3A40000000, 256, 0)]
    assert ev[0].time == dt.time(14, 3, 22, 123456)


def test_we_write_what_rmm_writes():
    for line in RMM_NEW.splitlines()[1:]:
        assert format_rmm_event(read_rmm_log(io.StringIO(HEADER + "\n" + line))[0]) == line
    out = io.StringIO()
    write_rmm_log(out, read_rmm_log(io.StringIO(RMM_NEW)))
    assert out.getvalue() == RMM_NEW


def _random_events(seed, n=300):
    rng = random.Random(seed)
    return [RmmLogEvent(thread=rng.randrange(1 << 40),
                        time=dt.time(rng.randrange(24), rng.randrange(60), rng.randrange(60),
                                     rng.randrange(1_000_000)),
                        action=rng.choice(ACTIONS),
                        pointer=rng.choice([0, rng.randrange(1, 1 << 64)]),
                        size=rng.randrange(1 << 50),
                        stream=rng.choice([0, rng.randrange(1, 1 << 48)]))
            for _ in range(n)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_round_trip_is_identical(tmp_path, seed):
    events = _random_events(seed)
    path = tmp_path / "log.csv"
    write_rmm_log(path, events)
    assert read_rmm_log(path) == events
    assert path.read_text().splitlines()[0] == HEADER


def test_structured_array_view():
    events = read_rmm_log(io.StringIO(RMM_NEW))
    arr = events_to_array(events)
    assert arr.dtype == EVENT_DTYPE and arr.shape == (4,)
    assert arr["action"].tolist() == [0, 0, 2, 1]
    assert arr["time_us"][0] == (9 * 3600 + 41 * 60 + 7) * 10**6 + 123
    assert arr["pointer"][0] == 0x7F6E3A000000 and arr["size"].sum() == 1024 * 2 + 2048 + 2**34
    assert events_to_array([]).shape == (0,)
    assert np.array_equal(events_to_array(events), arr)


def test_columns_are_found_by_name_and_blank_lines_skipped():
    text = ("Action,Size,Pointer,Thread,Stream,Time\n\n"
            "free,64,0x1000,7,0,00:00:01.5\n")
    [e] = read_rmm_log(io.StringIO(text))
    assert e == RmmLogEvent(7, dt.time(0, 0, 1, 500000), "free", 0x1000, 64, 0)


@pytest.mark.parametrize("text, match", [
    ("", "no header"),
    ("Thread,Time,Action,Pointer,Size\n", "missing Stream"),
    (HEADER + "\n1,00:00:00.000001,deallocate,0x10,8,0\n", "line 2: unknown action"),
    (HEADER + "\n1,1634567890.123456,free,0x10,8,0\n", "line 2: bad time"),
    (HEADER + "\n1,25:00:00.000000,free,0x10,8,0\n", "line 2: bad time"),
    (HEADER + "\n1,00:00:00.000001,free,0xZZ,8,0\n", "line 2: bad pointer"),
    (HEADER + "\n1,00:00:00.000001,free,-0x10,8,0\n", "line 2: bad pointer"),
    (HEADER + "\n1,00:00:00.000001,free,0x10,8,stream\n", "line 2: bad stream"),
    (HEADER + "\n1,00:00:00.000001,free,0x10,-8,0\n", "line 2: Size must be a non-negative"),
    (HEADER + "\n1,00:00:00.000001,free,0x10,8\n", "line 2: 5 fields"),
])
def test_malformed_logs_name_the_line(text, match):
    with pytest.raises(ValueError, match=match):
        read_rmm_log(io.StringIO(text))


def test_writer_validates_and_owns_only_files_it_opened(tmp_path):
    buf = io.StringIO()
    w = RmmLogWriter(buf)
    with pytest.raises(ValueError, match="action"):
        w.write(RmmLogEvent(1, dt.time(), "deallocate", 1, 1))
    w.close()
    assert not buf.closed and buf.getvalue() == HEADER + "\n"
    with pytest.raises(ValueError, match="closed"):
        w.write(RmmLogEvent(1, dt.time(), "free", 1, 1))
    with pytest.raises(TypeError):
        RmmLogWriter(42)
    w = RmmLogWriter(tmp_path / "x.csv")
    w.close()
    assert w._file.closed
