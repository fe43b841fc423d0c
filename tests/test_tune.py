"""numba_bfc.tune: recommendations checked by direct replay, each knob's effect, bad input."""

import io
import json

import pytest

from numba_bfc.cli.tune import main as tune_main
from numba_bfc.traces import Trace, min_limit, replay
from numba_bfc.traces.data import bundled_names, load_bundled
from numba_bfc.tune import (
    DEFAULTS,
    KNOBS,
    Candidate,
    caching_options,
    evaluate,
    knob_values,
    pytorch_conf,
    tune,
)

MIB = 1 << 20


@pytest.fixture(scope="module")
def tuned():
    return {name: tune(load_bundled(name)) for name in bundled_names()}


@pytest.mark.parametrize("name", bundled_names())
def test_the_recommendation_is_never_worse_and_equals_a_direct_replay(tuned, name):
    result = tuned[name]
    trace = load_bundled(name)
    best, defaults = result.best, result.defaults
    assert best.min_limit <= defaults.min_limit
    if best.min_limit == defaults.min_limit:
        assert best.peak_reserved_bytes <= defaults.peak_reserved_bytes
    # Every figure the search reports is what a replay with those settings gives.
    assert evaluate(trace, best.settings) == best
    options = caching_options(best.settings)
    assert min_limit(trace, "caching", **options).limit == best.min_limit
    assert replay(trace, "caching", limit=best.min_limit, **options).ooms == 0
    unlimited = {k: v for k, v in options.items() if k != "garbage_collection_threshold"}
    assert replay(trace, "caching", **unlimited).peak_reserved_bytes == best.peak_reserved_bytes
    assert evaluate(trace, dict(DEFAULTS)) == defaults
    assert result.saving_bytes == defaults.min_limit - best.min_limit
    # The offline figures bound every allocator from below.
    assert result.peak_requested_bytes == trace.peak_requested_bytes
    assert result.peak_requested_bytes <= result.offline_plan_bytes
    assert all(b.min_limit >= result.peak_requested_bytes for b in result.baselines)
    assert best.min_limit >= result.peak_requested_bytes


@pytest.mark.parametrize("name,knob,value", [
    ("resnet_train", "expandable_segments", True),
    ("lstm_train", "max_split_size_mb", 32),
    ("resnet_train", "roundup_power2_divisions", 4),
    ("gpt_train", "garbage_collection_threshold", 0.7),
])
def test_each_knob_alone_moves_when_replay_says_it_helps(name, knob, value):
    trace = load_bundled(name)
    result = tune(trace, knobs=(knob,))
    assert result.best.settings == {**DEFAULTS, knob: value}
    assert result.best.min_limit < result.defaults.min_limit - trace.peak_requested_bytes // 1000
    assert result.conf == f"PYTORCH_CUDA_ALLOC_CONF={knob}:{value}"
    tried = {c.settings[knob] for c in result.candidates}
    assert tried == set(knob_values(trace, knob, DEFAULTS))


def test_max_non_split_rounding_is_tried_only_with_a_max_split_size():
    trace = load_bundled("lstm_train")
    assert knob_values(trace, "max_non_split_rounding_mb", DEFAULTS) == [20]
    assert knob_values(trace, "max_non_split_rounding_mb",
                       {**DEFAULTS, "max_split_size_mb": 32}) == [20, 40, 80]
    result = tune(trace, knobs=[k for k in KNOBS if k != "expandable_segments"])
    assert result.best.settings["max_split_size_mb"] == 32
    roundings = {c.settings["max_non_split_rounding_mb"] for c in result.candidates
                 if c.settings["max_split_size_mb"] == 32}
    assert roundings == {20, 40, 80}
    assert {c.settings["max_non_split_rounding_mb"] for c in result.candidates
            if c.settings["max_split_size_mb"] is None} == {20}


def test_max_non_split_rounding_changes_what_an_oversize_request_reuses():
    # A 100 MiB block cached, then 70 MiB asked: with a 20 MiB rounding
    # allowance it may not take the block (100 >= 70 + 20) and reserves a
    # second segment; with 40 MiB it reuses the block.
    t = Trace.from_arrays(op=[0, 1, 0, 1], id=[0, 0, 1, 1], size=[100 * MIB, 0, 70 * MIB, 0])
    tight = evaluate(t, {"max_split_size_mb": 32, "max_non_split_rounding_mb": 20})
    loose = evaluate(t, {"max_split_size_mb": 32, "max_non_split_rounding_mb": 40})
    assert tight.peak_reserved_bytes == 170 * MIB
    assert loose.peak_reserved_bytes == 100 * MIB
    assert tight.fragmentation_at_peak == pytest.approx(100 / 170)  # the cached block
    assert loose.fragmentation_at_peak == 0.0
    # Near the limit the cached oversize block is freed first: both fit in
    # 100 MiB, to the bisection's precision (0.1% of the peak live bytes).
    assert abs(tight.min_limit - loose.min_limit) <= 100 * MIB // 1000


def test_limit_ranks_ooms_first_and_counts_them():
    trace = load_bundled("lstm_train")
    defaults = evaluate(trace, dict(DEFAULTS), limit=700 * MIB)
    assert defaults.ooms_at_limit == replay(trace, "caching", limit=700 * MIB).ooms > 0
    result = tune(trace, limit=700 * MIB, knobs=("max_split_size_mb",))
    assert result.best.ooms_at_limit == 0 and result.limit == 700 * MIB
    assert "OOMs at limit" in result.format()


def test_a_choice_made_for_fewer_ooms_says_what_it_costs(tuned):
    import dataclasses

    result = tuned["resnet_train"]
    worse = dataclasses.replace(result.best, min_limit=result.defaults.min_limit + MIB,
                                ooms_at_limit=1)
    odd = dataclasses.replace(result, limit=300 * MIB, best=worse,
                              defaults=dataclasses.replace(result.defaults, ooms_at_limit=5))
    assert odd.saving_bytes == -MIB
    assert "1 OOMs at the limit against 5 with PyTorch's defaults, though it needs 1.00MiB" \
        in odd.format()


def test_settings_map_to_options_and_pytorch_text():
    settings = {**DEFAULTS, "max_split_size_mb": 128, "roundup_power2_divisions": 4}
    assert pytorch_conf(settings) == "max_split_size_mb:128,roundup_power2_divisions:4"
    assert pytorch_conf(DEFAULTS) == ""
    assert pytorch_conf({**DEFAULTS, "expandable_segments": True}) == "expandable_segments:True"
    assert caching_options({"expandable_segments": True})["expandable_segments"] is True
    assert caching_options(settings) == {"max_split_size": 128 * MIB,
                                         "max_non_split_rounding": 20 * MIB,
                                         "roundup_power2_divisions": 4}
    with pytest.raises(ValueError, match="unknown setting expandable"):
        caching_options({"expandable": True})


def test_result_shows_as_text_json_and_html(tuned):
    result = tuned["lstm_train"]
    text = result.format()
    assert f"recommended: {result.conf}" in text and "less than PyTorch's defaults" in text
    assert "peak live bytes (no allocator does better)" in text
    data = json.loads(json.dumps(result.to_dict()))
    assert data["recommended"] == result.conf and data["saving_bytes"] == result.saving_bytes
    assert len(data["candidates"]) == len(result.candidates)
    html = result._repr_html_()
    assert "compact (numba_bfc)" in html and result.best.conf in html
    same = tuned["transformer_train"]
    assert same.best == same.defaults
    assert "recommended: PyTorch's defaults" in same.format()


def test_bad_input_is_refused():
    t = load_bundled("cnn_train")
    with pytest.raises(ValueError, match="unknown knob nope"):
        tune(t, knobs=("nope",))
    with pytest.raises(ValueError, match="allocates nothing"):
        tune(Trace.from_arrays(op=[], id=[], size=[]))
    for limit in (0, True, 1 << 62, 1.5):
        with pytest.raises(ValueError, match="limit must be"):
            tune(t, limit=limit)
    with pytest.raises(ValueError, match="max_rounds"):
        tune(t, max_rounds=0)
    with pytest.raises(ValueError, match="unknown knob"):
        knob_values(t, "nope", DEFAULTS)


def _cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    code = tune_main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_cli_prints_the_recommendation_and_json(tmp_path):
    code, out, err = _cli("bundled:resnet_train", "--knobs", "roundup_power2_divisions")
    assert code == 0
    assert "recommended: PYTORCH_CUDA_ALLOC_CONF=roundup_power2_divisions:4" in out
    # The defaults, 3 other allocators and 4 more divisions: 8 candidates.
    assert "tune resnet_train [" in err and err.rstrip().endswith("8/8")
    for name in ("t.csv", "snapshot.pickle"):  # our trace, a PyTorch memory snapshot
        path = tmp_path / name
        load_bundled("resnet_train").write(path)
        code, out, _ = _cli(str(path), "--knobs", "roundup_power2_divisions", "--json",
                            "--no-progress")
        assert code == 0 and json.loads(out)["best"]["settings"]["roundup_power2_divisions"] == 4


def test_cli_plot(tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "tune.png"
    code, _, _ = _cli("bundled:cnn_train", "--knobs", "roundup_power2_divisions",
                      "--no-progress", "--plot", str(png))
    assert code == 0 and png.read_bytes()[:4] == b"\x89PNG"


def test_cli_errors(tmp_path):
    code, _, err = _cli(str(tmp_path / "missing.csv"))
    assert code == 2 and err.startswith("numba-bfc tune: error:")
    code, _, err = _cli("bundled:cnn_train", "--knobs", "max_split_size_mb,nope")
    assert code == 2 and "unknown knob nope" in err
    code, _, err = _cli("bundled:cnn_train", "--limit", "0")
    assert code == 2 and "--limit" in err
    code, _, err = _cli("bundled:cnn_train", "--rounds", "0")
    assert code == 2 and "--rounds" in err
    code, _, err = _cli("bundled:cnn_train", "--plot", str(tmp_path / "no" / "p.png"))
    assert code == 2 and "no such directory" in err
    bad = tmp_path / "bad.csv"
    bad.write_text("op,id,size\nf,1,0\n")
    code, _, err = _cli(str(bad))
    assert code == 2 and "none of its events can be replayed" in err
    code, _, err = _cli(str(bad), "--strict")
    assert code == 2 and "frees id 1, which was never allocated" in err
    empty = tmp_path / "empty.csv"
    empty.write_text("op,id,size\n")
    code, _, err = _cli(str(empty))
    assert code == 2 and "allocates nothing" in err


def test_every_knob_is_known_to_the_defaults():
    assert set(KNOBS) == set(DEFAULTS)
    assert Candidate({}, 1, 1, 0.0, None, 0.0).changed == 0
