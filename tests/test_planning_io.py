"""Records, CSV reading, bad input and the ``plan`` CLI."""

import io
import json
from pathlib import Path

import numpy as np
import pytest

from numba_bfc.cli.plan import main
from numba_bfc.planning import (
    RECORD_DTYPE,
    as_records,
    assign_objects,
    assign_offsets,
    lower_bound,
    make_records,
    parse_records,
    read_records,
    validate,
    write_records,
)

DATA = Path(__file__).parent / "data" / "planning"
COMPLEX = [(32, 0, 1), (32, 1, 4), (8, 2, 5), (16, 3, 5), (8, 4, 5),
           (64, 5, 7), (8, 6, 8), (8, 7, 8), (16, 8, 9)]  # fmt: skip


def test_record_constructors_agree():
    a = as_records(COMPLEX)
    b = as_records(np.array(COMPLEX))
    c = make_records(*zip(*COMPLEX, strict=True))
    d = as_records(a)
    assert a.dtype == RECORD_DTYPE
    for other in (b, c, d):
        assert other.tolist() == a.tolist()


def test_both_csv_layouts_give_the_same_records():
    plain = read_records(DATA / "complex.csv")
    mm = read_records(DATA / "complex_minimalloc.csv")
    assert plain.tolist() == COMPLEX
    assert mm.tolist() == COMPLEX  # [lower, upper) -> [lower, upper - 1]


def test_headerless_csv_and_streams():
    assert parse_records("16,0,1\n8,1,2\n").tolist() == [(16, 0, 1), (8, 1, 2)]
    text = "id,lower,upper,size,offset\n0,5,7,100,0\n"
    assert read_records(io.StringIO(text)).tolist() == [(100, 5, 6)]


def test_write_then_read(tmp_path):
    path = tmp_path / "r.csv"
    write_records(path, COMPLEX)
    assert read_records(path).tolist() == COMPLEX


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("size,first,last\n16,0,1\n-4,1,2\n", r"x\.csv: line 3: size -4 is negative"),
        ("size,first,last\n16,0,1\n\n8,3,2\n", r"x\.csv: line 4: last task 2 is before first"),
        ("size,first,last\n16,0\n", r"x\.csv: line 2: expected 3 fields"),
        ("size,first,last\n16,zero,1\n", r"x\.csv: line 2: first 'zero' is not an integer"),
        ("bytes,start,end\n16,0,1\n", r"x\.csv: line 1: unrecognised header"),
        ("id,lower,upper,size\n0,4,4,16\n", r"x\.csv: line 2: upper 4 must be greater than"),
        ("id,lower,upper,size\n0,1,2\n", r"x\.csv: line 2: expected at least 4 fields"),
        ("# only a comment\n", r"x\.csv: no header and no records"),
    ],
)
def test_bad_csv_names_the_line(text, message):
    with pytest.raises(ValueError, match=message):
        parse_records(text, "x.csv")


def test_bad_records_raise_clear_errors():
    with pytest.raises(ValueError, match="record 1: negative size"):
        as_records([(16, 0, 1), (-1, 0, 1)])
    with pytest.raises(ValueError, match="record 0: last task 0 is before first task 2"):
        as_records([(16, 2, 0)])
    with pytest.raises(ValueError, match="negative first task"):
        as_records([(16, -1, 0)])
    with pytest.raises(TypeError, match="integers"):
        as_records([(1.5, 0, 1)])
    with pytest.raises(TypeError, match="integers"):
        make_records(["a"], [0], [1])
    with pytest.raises(ValueError, match="differ in length"):
        make_records([1, 2], [0], [1, 2])
    with pytest.raises(ValueError, match=r"shape \(n, 3\)"):
        as_records(np.zeros((2, 4), dtype=np.int64))
    with pytest.raises(ValueError, match="expected \\(size, first, last\\)"):
        as_records([(1, 2)])
    with pytest.raises(TypeError):
        as_records(42)


def test_bad_strategy_and_arguments():
    with pytest.raises(ValueError, match="unknown strategy 'best_fit'"):
        assign_objects(COMPLEX, "best_fit")
    with pytest.raises(TypeError, match="strategy must be a string"):
        assign_objects(COMPLEX, 3)
    with pytest.raises(ValueError, match="alignment must be a power of two, got 0"):
        assign_offsets(COMPLEX, alignment=0)
    with pytest.raises(ValueError, match="alignment must be a power of two, got 3"):
        assign_offsets(COMPLEX, alignment=3)
    with pytest.raises(TypeError, match="alignment must be an int"):
        assign_offsets(COMPLEX, alignment=1.5)
    with pytest.raises(ValueError, match="kind must be"):
        lower_bound(COMPLEX, "arena")
    with pytest.raises(ValueError, match="only used by 'greedy_in_order'"):
        assign_objects(COMPLEX, "equality", reallocation_graph=[[]] * 9)
    with pytest.raises(ValueError, match="9 records"):
        assign_objects(COMPLEX, "greedy_in_order", reallocation_graph=[[]])
    with pytest.raises(TypeError, match="expected ObjectsAssignment"):
        validate(COMPLEX, [0] * 9)


def test_strategy_names_are_case_insensitive():
    a = assign_objects(COMPLEX, "GREEDY_BY_SIZE")
    assert a.object_ids.tolist() == [1, 0, 2, 1, 3, 0, 1, 2, 0]


def test_cli_text_output(capsys):
    assert main([str(DATA / "complex.csv")]) == 0
    out = capsys.readouterr().out
    assert "total size:  96" in out
    assert "lower bound: 96" in out
    assert "ratio:       1.0000" in out


def test_cli_json_objects(capsys):
    argv = [str(DATA / "complex_minimalloc.csv"), "--strategy", "greedy_by_breadth"]
    assert main([*argv, "--kind", "objects", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["total_size"] == 128 and out["lower_bound"] == 112
    assert out["object_ids"] == [0, 4, 2, 1, 3, 0, 2, 3, 1]
    assert out["ratio"] == pytest.approx(128 / 112)


def test_cli_json_offsets_with_alignment(tmp_path, capsys):
    path = tmp_path / "chain.csv"
    path.write_text("size,first,last\n16,0,1\n8,1,2\n64,2,3\n32,3,4\n8,4,5\n")
    assert main([str(path), "--alignment", "128", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["offsets"] == [0, 128, 0, 128, 0]
    assert out["total_size"] == 160


def test_cli_errors(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("size,first,last\n8,0,1\n8,5,2\n")
    assert main([str(bad)]) == 2
    assert capsys.readouterr().err == (f"numba-bfc plan: error: {bad}: line 3: last task 2 is "
                                       "before first task 5\n")
    assert main([str(tmp_path / "missing.csv")]) == 2
    assert "error:" in capsys.readouterr().err
    assert main([str(bad), "--strategy", "nope"]) == 2
    assert "invalid choice" in capsys.readouterr().err
    assert main([str(DATA / "complex.csv"), "--alignment", "0"]) == 2
