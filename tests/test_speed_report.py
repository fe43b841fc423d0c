"""benchmarks/speed_report.py: its passes keep each figure's least, and bad
options are refused (the measurements themselves are the benchmarks')."""

import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "speed_report.py"


@pytest.fixture
def report(monkeypatch):
    """A fresh copy of the script's module (its pass records start empty)."""
    spec = importlib.util.spec_from_file_location("speed_report_under_test", _PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_figure_is_the_least_of_every_pass(report):
    assert report._least(("a",), [3.0, 1.0]) == [3.0, 1.0]
    assert report._least(("a",), [2.0, 5.0]) == [2.0, 1.0]
    assert report._least(("b",), [9.0, 9.0]) == [9.0, 9.0]  # another measurement: apart
    assert report._least(("a",), [4.0, 0.5]) == [2.0, 0.5]


def test_a_later_pass_writes_the_least_start_up_times(report, monkeypatch):
    # Three fresh processes per start-up figure (cold, then warm three times);
    # the second pass is slower except for one cold start.
    outputs = iter(["0.3 5.0"] + ["0.3 0.2"] * 3 + ["0.3 4.0"] + ["0.3 0.2"] * 3
                   + ["0.3 1.0"] + ["0.3 0.2"] * 3  # pass 1: allocation, replay, plan
                   + ["0.4 6.0"] + ["0.4 0.3"] * 3 + ["0.4 3.0"] + ["0.4 0.3"] * 3
                   + ["0.4 2.0"] + ["0.4 0.3"] * 3)  # pass 2
    monkeypatch.setattr(report, "_python", lambda *args, **kwargs: next(outputs).split())
    first = report.start_section(None, 1)
    second = report.start_section(None, 1)
    assert "| allocation | now | 0.30 | 5.00 | 0.20 |" in first
    assert "| allocation | now | 0.30 | 5.00 | 0.20 |" in second
    assert "| replay | now | 0.30 | 3.00 | 0.20 |" in second
    assert "| plan | now | 0.30 | 1.00 | 0.20 |" in second


@pytest.mark.parametrize("option", ["--passes", "--rounds", "--repeat"])
def test_fewer_than_one_pass_round_or_replay_is_refused(report, option, capsys):
    with pytest.raises(SystemExit) as stop:
        report.main([option, "0"])
    assert stop.value.code == 2
    assert "must be at least 1" in capsys.readouterr().err


def test_compact_against_bfc_takes_each_policys_least_process(report, monkeypatch):
    names = report.bundled_names()
    n = len(names)
    # Two processes per limit: bfc's figures, then compact's, trace by trace.
    outputs = iter([[40.0] * n + [50.0] * n, [30.0] * n + [60.0] * n,  # unlimited
                    [20.0] * n + [10.0] * n, [25.0] * n + [12.0] * n])  # 1.25x
    monkeypatch.setattr(report, "_python",
                        lambda *args, **kwargs: [str(x) for x in next(outputs)])
    lines = report.turns_section(repeat=3, rounds=2)
    assert f"| {names[0]} | 30 | 50 | 1.67 | 20 | 10 | 0.50 |" in lines
    assert sum(line.startswith("| ") for line in lines) == n + 1  # the head and each trace
