"""benchmarks/speed_report.py: its passes keep each figure's least, and bad
options are refused (the measurements themselves are the benchmarks')."""

import importlib.util
import os
import time
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
    compiled = []
    monkeypatch.setattr(report, "_write_bytecode", compiled.append)
    first = report.start_section(None, 1)
    second = report.start_section(None, 1)
    assert compiled == [None, None]  # this tree's bytecode, before each pass's figures
    assert "| allocation | now | 0.30 | 5.00 | 0.20 |" in first
    assert "| allocation | now | 0.30 | 5.00 | 0.20 |" in second
    assert "| replay | now | 0.30 | 3.00 | 0.20 |" in second
    assert "| plan | now | 0.30 | 1.00 | 0.20 |" in second
    assert "taking turns" not in first[0]  # one code: nothing takes turns


def test_start_up_with_an_earlier_code_says_the_two_take_turns(report, monkeypatch, tmp_path):
    monkeypatch.setattr(report, "_python", lambda *args, **kwargs: ["0.3", "1.0"])
    monkeypatch.setattr(report, "_write_bytecode", lambda tree: None)
    lines = report.start_section(str(tmp_path), 2)
    assert lines[0].endswith("the least of 2 such runs, the two codes taking turns:")
    assert "| allocation | before | 0.30 | 1.00 | 1.00 |" in lines


def test_processes_read_and_write_bytecode_and_the_package_is_compiled(report, monkeypatch,
                                                                        tmp_path):
    """Start-up is measured as an installed package runs: bytecode written
    once, then read, whatever the environment says."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    code = "import os, sys; print(os.environ.get('PYTHONDONTWRITEBYTECODE', '-'), " \
           "int(sys.dont_write_bytecode))"
    assert report._python(code) == ["-", "0"]
    package = tmp_path / "numba_bfc"
    package.mkdir()
    (package / "__init__.py").write_text("VALUE = 1\n")
    report._write_bytecode(str(tmp_path))
    assert list((package / "__pycache__").glob("__init__.*.pyc"))


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


def test_the_readme_sentence_gives_each_ratio_range_and_whether_any_is_above_one(report):
    (free, _), (tight, _) = report.LIMITS
    ratios = {free: {"bfc": [0.3, 0.06], "caching": [0.72, 0.5]},
              tight: {"bfc": [0.61, 0.01], "caching": [0.04, 0.82]}}
    sentence = report.summary_sentence(ratios)
    assert sentence.startswith("Against those peers, their kernels take at most as long ")
    assert ("without a limit takes 0.06-0.30x the time of TF's BFC and 0.50-0.72x that of "
            "TinyTorch's cache, and at 1.25x their peak 0.01-0.61x and 0.04-0.82x") in sentence
    ratios[tight]["caching"].append(1.004)  # 1.00 as the sentence prints it
    assert "take at most as long per event" in report.summary_sentence(ratios)
    ratios[tight]["caching"].append(1.15)
    assert "take up to 1.15x as long per event" in report.summary_sentence(ratios)


def test_only_the_marked_text_is_replaced(report):
    begin, end = report.SUMMARY_BEGIN, report.SUMMARY_END
    page = f"intro {begin}old{end} rest {end}"
    assert report.replace_marked(page, begin, end, "new") == f"intro {begin}new{end} rest {end}"
    assert report.replace_marked("no markers", begin, end, "new") is None
    assert report.replace_marked(f"{end} then {begin}", begin, end, "new") is None


@pytest.mark.parametrize("args, problem", [
    (["--summary", "README.md"], "--summary needs --peers"),
    (["--write", "pyproject.toml"], "pyproject.toml has no <!-- speed-report:begin -->"),
    (["--peers", "P", "--summary", "no/such/README.md"], "cannot read no/such/README.md"),
])
def test_a_summary_without_peers_or_a_page_without_markers_is_refused_before_measuring(
        report, args, problem, capsys, monkeypatch):
    monkeypatch.chdir(_PATH.parents[1])
    monkeypatch.setattr(report, "replay_section", lambda *a: pytest.fail("measured"))
    with pytest.raises(SystemExit) as stop:
        report.main(args)
    assert stop.value.code == 2
    assert problem in capsys.readouterr().err


def test_the_readme_and_the_performance_page_carry_the_markers(report):
    root = _PATH.parents[1]
    for page, begin, end in (("README.md", report.SUMMARY_BEGIN, report.SUMMARY_END),
                             ("README.md", report.START_BEGIN, report.START_END),
                             ("docs/performance.md", report.BEGIN, report.END)):
        assert report.replace_marked((root / page).read_text(), begin, end, "") is not None


def test_a_run_rewrites_the_page_section_and_the_readme_sentence(report, tmp_path,
                                                                    monkeypatch):
    (free, _), (tight, _) = report.LIMITS
    page, readme = tmp_path / "performance.md", tmp_path / "README.md"
    page.write_text(f"# Speed\n{report.BEGIN}\nold tables\n{report.END}\nprose\n")
    readme.write_text(f"Intro. {report.SUMMARY_BEGIN}Old.{report.SUMMARY_END} More.\n"
                      f"Install. {report.START_BEGIN}Old start.{report.START_END} Cache.\n")

    def replays(*args):
        report._peer_ratios.update({free: {"bfc": [0.2], "caching": [0.5]},
                                    tight: {"bfc": [0.1], "caching": [0.9]}})
        return ["| replay table |", ""]

    monkeypatch.setattr(report, "replay_section", replays)
    _no_other_sections(report, monkeypatch)
    monkeypatch.setattr(report, "start_section", lambda *args: report._headlines.update(
        start={"now": {"allocation": 2.5, "replay": 3.5, "plan": 1.5, "warm": 0.25}}) or [])
    assert report.main(["--peers", "PEERS", "--write", str(page), "--summary",
                        str(readme)]) == 0
    text = page.read_text()
    assert "old tables" not in text and "| replay table |" in text
    assert text.startswith(f"# Speed\n{report.BEGIN}\n\nGenerated by ") and text.endswith(
        f"{report.END}\nprose\n")
    assert f"--write {page} --summary {readme}` on {time.strftime('%Y-%m-%d')}" in text
    sentence = readme.read_text()
    assert sentence.startswith(f"Intro. {report.SUMMARY_BEGIN}Against those peers")
    assert "takes 0.20x the time of TF's BFC" in sentence
    assert f"[Speed](docs/performance.md)).{report.SUMMARY_END} More.\n" in sentence
    # Both passages of the one page are rewritten, each between its markers.
    assert sentence.endswith(
        f"Install. {report.START_BEGIN}With an empty Numba cache the first run compiles the "
        f"kernels: on this {os.cpu_count()}-core machine 2.50 s to an allocator's first "
        f"allocation, 3.50 s to a first replay and 1.50 s to a first plan; with the cache, "
        f"0.25 s to the first allocation (measured {time.strftime('%Y-%m-%d')}, "
        f"[Speed](docs/performance.md)).{report.START_END} Cache.\n")


def test_the_readme_gives_failures_bisections_pairs_and_start_up_beside_the_earlier_code(
        report):
    headlines = {"failure": {"now": [1.84, 3.1, 2.0], "before": [390.0, 338.2, 477.4]},
                 "min_limit": {"now": [0.007, 0.004, 0.006], "before": [0.1, 0.066, 0.03]},
                 "pair": {"now": [0.73, 0.8, 0.75], "before": [1.24, 1.58, 1.3]},
                 "start": {"now": {"allocation": 2.26, "replay": 3.52, "plan": 2.18, "warm": 0.15},
                           "before": {"allocation": 7.64, "replay": 15.69, "plan": 5.4,
                                      "warm": 0.3}}}
    assert report.headline_sentence(headlines, "e972fc0") == (
        "A failed allocation, caught, takes 1.8-3.1 us, a `--min-limit` bisection of "
        "`gpt_train` or `generate_kv` 0.004-0.007 s and an allocate+free pair through the API "
        "0.73-0.80 us with 1,000 live; in the same run the code at e972fc0 took 338-477 us, "
        "0.030-0.100 s and 1.24-1.58 us.")
    assert "(the code at e972fc0, in the same run: 7.64, 15.69 and 5.40 s); with the cache, " \
           "0.15 s to the first allocation" in report.start_sentence(headlines, "e972fc0")
    for kind in headlines:  # without --before: this code's figures alone
        del headlines[kind]["before"]
    assert report.headline_sentence(headlines, "").endswith(
        "through the API 0.73-0.80 us with 1,000 live.")
    assert "in the same run" not in report.start_sentence(headlines, "")
    headlines["pair"]["now"] = [0.7, 0.7, 0.7]  # one figure, not a range of one
    assert "through the API 0.70 us" in report.headline_sentence(headlines, "")
    del headlines["pair"]  # a section not measured: no sentence
    assert report.headline_sentence(headlines, "") == ""


def _no_other_sections(report, monkeypatch):
    for section in ("turns_section", "warm_section", "oom_section", "pair_section",
                    "scaling_section", "start_section"):
        monkeypatch.setattr(report, section, lambda *args: [])


def test_a_page_that_lost_its_markers_during_the_run_leaves_every_page_as_it_was(
        report, tmp_path, monkeypatch, capsys):
    page, readme = tmp_path / "performance.md", tmp_path / "README.md"
    page.write_text(f"{report.BEGIN}old{report.END}")
    readme.write_text(f"{report.SUMMARY_BEGIN}Old.{report.SUMMARY_END}"
                      f"{report.START_BEGIN}Old start.{report.START_END}")

    def replays(*args):  # someone edits the README while the run measures
        readme.write_text("markers gone")
        report._peer_ratios.update({label: {"bfc": [0.5], "caching": [0.5]}
                                    for label, _ in report.LIMITS})
        return []

    monkeypatch.setattr(report, "replay_section", replays)
    _no_other_sections(report, monkeypatch)
    assert report.main(["--peers", "P", "--write", str(page), "--summary", str(readme)]) == 2
    assert "lost its markers" in capsys.readouterr().err
    assert page.read_text() == f"{report.BEGIN}old{report.END}"
    assert readme.read_text() == "markers gone"


def test_the_replay_tables_keep_the_ratios_to_the_peers_for_the_readme(report, monkeypatch):
    names = report.bundled_names()
    n = len(names)

    def rows(peers, factor, repeat, rounds):  # the peers twice as slow, caching 1.5x bfc
        return [{"trace": name, "policy": policy, "events": 1000, "identical": True,
                 "project_seconds": (2e-5 if policy == "bfc" else 3e-5) * (k + 1),
                 "peer_seconds": 4e-5 * (k + 1), "project_figures": {"ooms": 0}}
                for k, name in enumerate(names) for policy in ("bfc", "caching")]

    monkeypatch.setattr(report, "peer_rows", rows)
    monkeypatch.setattr(report, "_interleaved", lambda *args: {"now": [25.0] * n + [0] * n})
    report.replay_section("PEERS", 1, 1)
    for label, _ in report.LIMITS:
        assert report._peer_ratios[label]["bfc"] == pytest.approx([0.5] * n)
        assert report._peer_ratios[label]["caching"] == pytest.approx([0.75] * n)
    sentence = report.summary_sentence(report._peer_ratios)
    assert "takes 0.50x the time of TF's BFC and 0.75x that of TinyTorch's" in sentence


def test_a_passage_whose_figures_were_not_measured_stays_as_it_was(report, tmp_path,
                                                                   monkeypatch):
    page, readme = tmp_path / "performance.md", tmp_path / "README.md"
    page.write_text(f"{report.BEGIN}old{report.END}")
    readme.write_text(f"{report.SUMMARY_BEGIN}Old.{report.SUMMARY_END} "
                      f"{report.START_BEGIN}Old start.{report.START_END}")

    def replays(*args):
        report._peer_ratios.update({label: {"bfc": [0.5], "caching": [0.5]}
                                    for label, _ in report.LIMITS})
        return []

    monkeypatch.setattr(report, "replay_section", replays)
    _no_other_sections(report, monkeypatch)  # no start-up figures
    assert report.main(["--peers", "P", "--write", str(page), "--summary", str(readme)]) == 0
    text = readme.read_text()
    assert "Old." not in text and "Against those peers" in text
    assert text.endswith(f"{report.START_BEGIN}Old start.{report.START_END}")


def test_a_passage_inside_another_is_refused_before_measuring(report, tmp_path, monkeypatch,
                                                              capsys):
    readme = tmp_path / "README.md"  # writing the summary would take the start-up markers
    readme.write_text(f"{report.SUMMARY_BEGIN}Old. {report.START_BEGIN}Old start."
                      f"{report.START_END}{report.SUMMARY_END}")
    monkeypatch.setattr(report, "replay_section", lambda *a: pytest.fail("measured"))
    with pytest.raises(SystemExit) as stop:
        report.main(["--peers", "P", "--summary", str(readme)])
    assert stop.value.code == 2
    assert "has no <!-- speed-start:begin -->" in capsys.readouterr().err


def test_one_page_takes_every_passage_with_the_earlier_codes_figures(report, tmp_path,
                                                                     monkeypatch):
    """--write and --summary on one page; --before a folder that is no git
    checkout, so the sentences name the folder."""
    page = tmp_path / "page.md"
    page.write_text(f"A {report.BEGIN}x{report.END} B {report.SUMMARY_BEGIN}y"
                    f"{report.SUMMARY_END} C {report.START_BEGIN}z{report.START_END} D")
    old = tmp_path / "old"
    old.mkdir()

    def measured(*args):
        report._peer_ratios.update({label: {"bfc": [0.5], "caching": [0.6]}
                                    for label, _ in report.LIMITS})
        report._headlines.update(
            failure={"now": [2.0], "before": [300.0]}, min_limit={"now": [0.005],
                                                                   "before": [0.05]},
            pair={"now": [0.7], "before": [1.2]},
            start={label: {"allocation": a, "replay": 3.0, "plan": 1.0, "warm": 0.2}
                   for label, a in (("now", 2.0), ("before", 7.0))})
        return ["| tables |"]

    monkeypatch.setattr(report, "replay_section", measured)
    monkeypatch.setattr(report, "before_section", lambda *args: [])
    _no_other_sections(report, monkeypatch)
    assert report.main(["--peers", "P", "--before", str(old), "--write", str(page),
                        "--summary", str(page)]) == 0
    text = page.read_text()
    assert f'"before" is the code at {old}.' in text and "| tables |" in text
    assert ("[Speed](docs/performance.md)). A failed allocation, caught, takes 2.0 us, a "
            "`--min-limit` bisection of `gpt_train` or `generate_kv` 0.005 s") in text
    assert f"; in the same run the code at {old} took 300 us, 0.050 s and 1.20 us." in text
    assert f"(the code at {old}, in the same run: 7.00, 3.00 and 1.00 s)" in text
    assert text.startswith("A ") and text.endswith(f"{report.START_END} D")


def test_the_pair_at_scale_is_each_sides_replay_with_the_pairs_less_the_one_without(
        report, monkeypatch):
    small, big = report.PAIR_LIVE
    pairs = report.SCALING_PAIRS
    made, asked = [], []
    tiny = report.random_churn(3, 2)

    def churn(live, n):  # a small trace in the files' place: compare.py is faked too
        made.append((live, n))
        return tiny

    def rows(peers, factor, repeat, rounds, traces):
        asked.append((peers, factor, repeat, rounds, len(traces)))
        out = []
        for path in traces:
            assert os.path.exists(path)
            live, n = map(int, report._stem(path).split("_")[1:])
            for policy, per_pair in (("bfc", 100e-9), ("caching", 200e-9)):
                # A side's replay: its setup, then its pairs; the peer 3x slower per pair,
                # and a million live allocations make each pair 4x slower on both sides.
                each = per_pair * (4 if live == big else 1)
                out.append({"trace": report._stem(path), "policy": policy,
                            "identical": policy == "bfc" or n == 0,
                            "project_seconds": 0.5 + n * each,
                            "peer_seconds": 0.7 + n * 3 * each})
        return out

    monkeypatch.setattr(report, "random_churn", churn)
    monkeypatch.setattr(report, "peer_rows", rows)
    lines = report.scaling_section("PEERS")
    assert sorted(made) == sorted((live, n) for live in (small, big) for n in (0, pairs))
    assert asked == [("PEERS", None, report.SCALING_REPEAT, 1, 4)]
    table = [line for line in lines if line.startswith("| bfc") or line.startswith("| caching")]
    assert table == ["| bfc / TF BFC | 300 | 1200 | 4.00 | 100 | 400 | 4.00 |",
                     "| caching / TinyTorch | 600 | 2400 | 4.00 | 200 | 800 | 4.00 |"]
    assert "Identical decisions to the peers on these traces: 6 of 8." in lines


def test_the_pair_at_scale_is_measured_once_in_the_last_pass(report, monkeypatch, tmp_path):
    passes = []
    monkeypatch.setattr(report, "replay_section", lambda *args: passes.append("pass") or [])
    _no_other_sections(report, monkeypatch)
    monkeypatch.setattr(report, "scaling_section",
                        lambda peers: passes.append(f"scaling {peers}") or ["| scaled |"])
    page = tmp_path / "performance.md"
    page.write_text(f"{report.BEGIN}old{report.END}")
    assert report.main(["--peers", "PEERS", "--passes", "3", "--write", str(page)]) == 0
    assert passes == ["pass", "pass", "pass", "scaling PEERS"]
    assert "| scaled |" in page.read_text()
    passes.clear()
    assert report.main(["--passes", "2", "--write", str(page)]) == 0  # no peers: none
    assert passes == ["pass", "pass"]


def test_sections_measures_only_those_and_prints_them(report, monkeypatch, capsys):
    ran = []
    for name in report.SECTIONS:
        monkeypatch.setattr(report, f"{name}_section",
                            lambda *args, name=name: ran.append(name) or [f"| {name} table |"])
    assert report.main(["--peers", "PEERS", "--sections", "start,pair"]) == 0
    assert ran == ["pair", "start"]  # in the report's order, whatever the list's
    out = capsys.readouterr().out
    assert "--repeat 5 --rounds 3 --sections start,pair` on " in out  # the command that ran
    assert "| pair table |" in out and "| start table |" in out
    assert "| replay table |" not in out
    ran.clear()
    assert report.main(["--peers", "PEERS", "--passes", "2", "--sections", "oom"]) == 0
    assert ran == ["oom", "oom"]
    assert "The run measured its sections 2 times" in capsys.readouterr().out
    ran.clear()
    assert report.main(["--peers", "PEERS", "--before", "OLD"]) == 0  # without it: every one
    assert ran == list(report.SECTIONS)


@pytest.mark.parametrize("arguments, message", [
    (["--sections", "pair,speed"], "--sections: no section 'speed' (there are replay,"),
    (["--sections", "pair,"], "--sections: no section ''"),
    (["--sections", "pair", "--write", "PAGE"], "--write and --summary take all of it"),
    (["--sections", "pair", "--peers", "P", "--summary", "README"],
     "--write and --summary take all of it"),
    (["--sections", "pair,warm"], "--sections warm needs --peers"),
    (["--sections", "scaling"], "--sections scaling needs --peers"),
    (["--sections", "before", "--peers", "P"], "--sections before needs --before"),
])
def test_sections_refuses_unknown_names_and_a_page_to_write(report, arguments, message,
                                                            monkeypatch, capsys):
    monkeypatch.setattr(report, "pair_section", lambda *args: pytest.fail("measured"))
    with pytest.raises(SystemExit) as stop:
        report.main(arguments)
    assert stop.value.code == 2
    assert message in capsys.readouterr().err
