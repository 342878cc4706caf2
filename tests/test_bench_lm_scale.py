"""The LM-scale grid (benchmarks/lm_scale.py): part names, deployed bytes, the rate choice and the merge."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from stejax.bench.results import load_results
from stejax.lm import lm_size, parameter_count


def _grid():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "lm_scale.py"
    spec = importlib.util.spec_from_file_location("lm_scale", path)
    assert spec is not None and spec.loader is not None
    grid = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(grid)
    return grid


def test_part_names_give_their_runs():
    grid = _grid()
    sweep = grid._part("sweep-25M-w1.58a8-lr1.5e-3")
    assert (sweep["size"], sweep["config"], sweep["learning_rate"], sweep["sweep"]) == ("25M", "w1.58a8", 1.5e-3, True)
    warm = grid._part("100M-w1.58a8-warm-s2")
    assert (warm["size"], warm["config"], warm["seed"], warm["warm"], warm["sweep"]) == (
        "100M",
        "w1.58a8",
        2,
        True,
        False,
    )
    assert grid._part("25M-float-s0")["bytes"] >= 50_000_000


def test_deployed_bytes_count_codes_scales_and_the_float_rest():
    grid = _grid()
    config = lm_size("25M")
    d, h, depth = config.width, config.hidden, config.depth
    linear = depth * (4 * d * d + 3 * d * h)
    rest = parameter_count(config) - linear
    assert grid.deployed_bytes(config, "float") == 2 * parameter_count(config)
    assert grid.deployed_bytes(config, "float", 4) == 4 * parameter_count(config)
    assert grid.deployed_bytes(config, "w1.58a8") == linear // 4 + depth * 7 * 4 + 2 * rest
    # int8: a float32 scale per output channel of each of the seven linears.
    assert grid.deployed_bytes(config, "w8a8") == linear + depth * 4 * (4 * d + 2 * h + d) + 2 * rest


def test_a_run_takes_the_sweeps_best_rate_on_validation():
    grid = _grid()
    logged = {
        "a": {"sweep": True, "size": "25M", "config": "w1.58a8", "learning_rate": 3e-3, "bpb": 1.30},
        "b": {"sweep": True, "size": "25M", "config": "w1.58a8", "learning_rate": 6e-3, "bpb": 1.70},
        "c": {"sweep": True, "size": "25M", "config": "float", "learning_rate": 2e-3, "bpb": 1.20},
    }
    assert grid.chosen_rate(logged, "25M", "w1.58a8")[0] == 3e-3
    assert grid.chosen_rate(logged, "25M", "w8a8")[0] == 2e-3  # not swept: float's
    assert grid.chosen_rate(logged, "100M", "float") == (grid.LEARNING_RATES["float"], "default (no sweep logged)")


def test_a_run_logged_at_another_rate_runs_again():
    grid = _grid()
    part = {**grid._part("100M-w1.58a8-s0"), "learning_rate": 2e-3}
    assert grid.already_run({"100M-w1.58a8-s0": {"learning_rate": 2e-3}}, part)
    assert not grid.already_run({"100M-w1.58a8-s0": {"learning_rate": 3e-3}}, part)
    assert not grid.already_run({}, part)


def _run(part: str, config: str, bpb: float, sha: str = "x") -> dict:
    return {
        "part": part,
        "size": "25M",
        "config": config,
        "seed": 0,
        "learning_rate": 1e-3,
        "score_split": "test",
        "bpb": bpb,
        "train_bytes": 50_000_000,
        "train_seconds": 120.0,
        "step_ms_median": 17.5,
        "deployed_bytes": 1_000_000,
        "deployed_bytes_float32": 2_000_000,
        "product": "int8",
        "precision": "bfloat16",
        "device": "TPU v5 lite",
        "warm": False,
        "sweep": False,
        "model": {"tied": True},
        "corpus_sha256": {"train": sha},
        "conditions": _CONDITIONS,
    }


_CONDITIONS = {
    "commit": {"id": "abc1234def56", "uncommitted_changes": False},
    "date": "2026-12-07T00:00:00+00:00",
    "machine": {"cpu": "not available", "cores": 13, "device": "TPU v5 lite", "jax": "0.10.2", "jaxlib": "0.10.2"},
    "load": {"start": None, "end": None, "note": "not available"},
}


def test_merge_writes_the_gaps_against_float_and_refuses_two_corpora(tmp_path):
    grid = _grid()
    log = tmp_path / "log.jsonl"
    refs = {"part": "references", "references": {"xz": {"bpb": 1.4}}, "scored_bytes": 2 << 20}
    lines = [
        _run("25M-float-s0", "float", 1.00),
        _run("25M-w1.58a8-s0", "w1.58a8", 1.03),
        refs | {"corpus_sha256": {"train": "x"}},
    ]
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    fields = {"log": [str(log)], "results": str(tmp_path / "r"), "plot": None, "conditions": None}
    args = type("A", (), fields | {"note": None, "older": None})
    grid.merge(args)
    doc = load_results(tmp_path / "r" / "lm_scale.json")
    gap = doc["figures"]["w1_58a8_25M_gap"]
    assert gap["text"] == "+3.00%" and gap["met"] is False and gap["target"] == "≤ +2.5%"
    assert doc["figures"]["float_25M_vs_xz"]["met"] is False  # 1.00 / 1.4 = 0.71 > 0.70

    parity = {"part": "llamacpp-25M-w1.58a8-s0", "architecture": "bitnet", "top1_agreement": 0.985}
    parity |= {"bpb_stejax": 1.0, "bpb_llamacpp": 1.004, "corpus_sha256": {"train": "x"}}
    decoded = {"part": "decode-25M-w1.58a8-s0", "prompts": 4, "rows_identical": 3, "tokens": 128, "ternary": "2bit"}
    log.write_text("".join(json.dumps(x) + "\n" for x in [*lines, parity, decoded]))
    grid.merge(args)
    figures = load_results(tmp_path / "r" / "lm_scale.json")["figures"]
    top1, bpb = figures["llamacpp_25M_w1_58a8_s0_top1"], figures["llamacpp_25M_w1_58a8_s0_bpb"]
    assert (top1["text"], top1["met"], bpb["text"], bpb["met"]) == ("98.5%", False, "+0.40%", True)
    rows = figures["decode_25M_w1_58a8_s0_rows"]
    assert (rows["text"], rows["met"]) == ("3 of 4", False)  # one row decoded another byte than the loop

    lines[1]["corpus_sha256"] = {"train": "y"}
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    with pytest.raises(SystemExit, match="2 different corpora"):
        grid.merge(args)


def test_merge_leaves_out_runs_without_conditions_and_needs_older_for_a_changed_tree(tmp_path):
    grid = _grid()
    log = tmp_path / "log.jsonl"
    refs = {"part": "references", "references": {"xz": {"bpb": 1.4}}, "scored_bytes": 2 << 20}
    old = {k: v for k, v in _run("25M-w8a8-s0", "w8a8", 1.01).items() if k != "conditions"}
    lines = [_run("25M-float-s0", "float", 1.00), old, refs | {"corpus_sha256": {"train": "x"}}]
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    fields = {"log": [str(log)], "results": str(tmp_path / "r"), "plot": None, "conditions": None, "note": "N."}
    grid.merge(type("A", (), fields | {"older": None}))
    doc = load_results(tmp_path / "r" / "lm_scale.json")
    assert [r["config"] for r in doc["rows"]] == ["float"]  # the run of an older tree stays in the log only
    assert "w8a8_25M_gap" not in doc["figures"] and doc["notes"].endswith(" N.")

    lines[0] = lines[0] | {"conditions": _CONDITIONS | {"commit": {"id": "abc1234def56", "uncommitted_changes": True}}}
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    with pytest.raises(SystemExit, match="uncommitted changes"):
        grid.merge(type("A", (), fields | {"older": None}))
    grid.merge(type("A", (), fields | {"older": "Measured at abc1234 plus a local change."}))
    assert load_results(tmp_path / "r" / "lm_scale.json")["older"] == "Measured at abc1234 plus a local change."


def test_merge_of_runs_at_two_commits_names_each_rows_and_the_newest(tmp_path):
    grid = _grid()
    log = tmp_path / "log.jsonl"
    refs = {"part": "references", "references": {"xz": {"bpb": 1.4}}, "scored_bytes": 2 << 20}
    later = _CONDITIONS | {"commit": {"id": "fedcba987654", "uncommitted_changes": False}, "date": "2026-12-08"}
    lines = [
        _run("25M-float-s0", "float", 1.00),
        _run("25M-w1.58a8-s0", "w1.58a8", 1.03) | {"conditions": later},
        refs | {"corpus_sha256": {"train": "x"}},
    ]
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    fields = {"log": [str(log)], "results": str(tmp_path / "r"), "plot": None, "conditions": None, "note": None}
    with pytest.raises(SystemExit, match="2 commits"):
        grid.merge(type("A", (), fields | {"older": None}))
    grid.merge(type("A", (), fields | {"older": "The ternary run is newer; training code unchanged."}))
    doc = load_results(tmp_path / "r" / "lm_scale.json")
    assert doc["commit"]["id"] == "fedcba987654"
    assert {r["config"]: r["commit"] for r in doc["rows"]} == {"float": "abc1234", "w1.58a8": "fedcba9"}
