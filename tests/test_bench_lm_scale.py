"""The LM-scale grid (benchmarks/lm_scale.py): part names, deployed bytes, the rate choice and the merge."""

from __future__ import annotations

import importlib.util
import json
import math
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
    assert "decode_25M_w1_58a8_s0_vs_bfloat16" not in figures  # a line without the bfloat16 rate

    decoded |= {"bytes_per_s": 300.0, "bytes_per_s_bfloat16": 250.0, "repeats": 5}
    decoded |= {"device": "TPU v5 lite", "implementation": "automatic"}
    log.write_text("".join(json.dumps(x) + "\n" for x in [*lines, parity, decoded]))
    grid.merge(args)
    rate = load_results(tmp_path / "r" / "lm_scale.json")["figures"]["decode_25M_w1_58a8_s0_vs_bfloat16"]
    assert rate["text"] == "1.20×" and "TPU v5 lite" in rate["note"]

    lines[1]["corpus_sha256"] = {"train": "y"}
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    with pytest.raises(SystemExit, match="2 different corpora"):
        grid.merge(args)


def test_ternary_100m_beats_float_25m_only_below_every_float_seed(tmp_path):
    grid = _grid()
    log = tmp_path / "log.jsonl"
    refs = {
        "part": "references",
        "references": {"xz": {"bpb": 1.4}},
        "scored_bytes": 2 << 20,
        "corpus_sha256": {"train": "x"},
    }
    big = _run("100M-w1.58a8-s0", "w1.58a8", 1.015) | {"size": "100M", "deployed_bytes": 26_000_000}
    lines = [
        _run("25M-float-s0", "float", 1.010) | {"deployed_bytes": 48_000_000},
        _run("25M-float-s1", "float", 1.030) | {"deployed_bytes": 48_000_000},
        _run("100M-float-s0", "float", 0.98) | {"size": "100M"},
        big,
        refs,
    ]
    fields = {"log": [str(log)], "results": str(tmp_path / "r"), "plot": None, "conditions": None}
    args = type("A", (), fields | {"note": None, "older": None})
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    grid.merge(args)
    level = load_results(tmp_path / "r" / "lm_scale.json")["figures"]["w1_58a8_100M_vs_float_25M"]
    # Below the mean (1.020) but above the better float seed: level, not a win.
    assert (level["text"], level["met"]) == ("-0.49%", False)
    assert "26.0 MB" in level["note"] and "48.0 MB" in level["note"]
    big["bpb"] = 1.005
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    grid.merge(args)
    assert load_results(tmp_path / "r" / "lm_scale.json")["figures"]["w1_58a8_100M_vs_float_25M"]["met"] is True


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


def test_a_ptq_part_names_its_float_run():
    grid = _grid()
    part = grid._part("ptq-25M-s1")
    assert (part["size"], part["seed"], part["float_part"], part["ptq"]) == ("25M", 1, "25M-float-s1", True)
    assert part["bytes"] == grid.BYTES // 4
    assert grid._part("25M-float-s1").get("ptq") is None


def _tiny_grid(monkeypatch):
    import types

    import numpy as np

    from stejax.lm import LMConfig
    from stejax.lm import _model as lm_model

    grid = _grid()
    monkeypatch.setitem(lm_model.SIZES, "tiny", LMConfig(context=16, width=32, depth=1, heads=2, hidden=64, tied=True))
    for name, value in {
        "BATCH": 4,
        "BYTES": 640,
        "TEST_BYTES": 700,
        "VAL_BYTES": 500,
        "CALIBRATION_WINDOWS": 8,
    }.items():
        monkeypatch.setattr(grid, name, value)
    rng = np.random.default_rng(0)
    # Bytes with structure to learn: a repeated phrase with a few random bytes.
    text = np.frombuffer(b"the quick brown fox jumps over the lazy dog. " * 200, np.uint8).copy()
    text[rng.integers(0, text.size, 300)] = rng.integers(0, 256, 300)
    corpus = types.SimpleNamespace(
        data={"train": text[:6000], "validation": text[6000:7500], "test": text[7500:]}, sha256={"train": "x"}
    )
    monkeypatch.setattr("stejax.lm.build_corpus", lambda _: corpus)
    return grid


def test_a_ptq_part_scores_every_form_and_method_and_chooses_on_validation(monkeypatch, tmp_path):
    from stejax.lm import PTQ_FORMS

    grid = _tiny_grid(monkeypatch)
    log, checkpoints = tmp_path / "log.jsonl", tmp_path / "ckpt"
    grid.main(["run", "--corpus", "c", "--log", str(log), "--part", "tiny-float-s0", "--checkpoints", str(checkpoints)])
    (float_line,) = [json.loads(x) for x in log.read_text().splitlines()]
    grid.main(["run", "--corpus", "c", "--log", str(log), "--part", "ptq-tiny-s0", "--checkpoints", str(checkpoints)])
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [x["part"] for x in lines] == ["tiny-float-s0", "ptq-tiny-s0"]  # the float run is not trained again
    ptq = lines[1]
    # The float model is the float part's final one: the same test score, bit for bit.
    assert ptq["float"]["bpb"] == float_line["bpb"]
    assert list(ptq["forms"]) == list(PTQ_FORMS)
    for form, r in ptq["forms"].items():
        # SmoothQuant only where the inputs are quantised.
        assert set(r["methods"]) == {"rtn", "gptq", "awq"} | ({"smoothquant"} if PTQ_FORMS[form][2] else set()), form
        scores = {m: x["val_bpb"] for m, x in r["methods"].items()}
        assert r["best"] == min(scores, key=scores.get), form
        assert all(math.isfinite(x["bpb"]) and x["seconds"] > 0 for x in r["methods"].values())
    assert set(ptq["qat"]) == {"w4a8", "w1.58a8"}
    for config, r in ptq["qat"].items():
        assert r["from"] == ptq["forms"][config]["best"] and r["steps"] == 3 and math.isfinite(r["bpb"])
        assert r["learning_rate"] == grid.LEARNING_RATES[config]
    # Run again: it is in the log at the rates it takes now.
    grid.main(["run", "--corpus", "c", "--log", str(log), "--part", "ptq-tiny-s0", "--checkpoints", str(checkpoints)])
    assert len(log.read_text().splitlines()) == 2


def test_a_ptq_part_without_its_float_run_trains_and_logs_it(monkeypatch, tmp_path):
    grid = _tiny_grid(monkeypatch)
    monkeypatch.setattr(grid, "PTQ_METHODS", ("rtn",))
    monkeypatch.setattr(grid, "QAT_FROM_PTQ", ())
    log = tmp_path / "log.jsonl"
    grid.main(["run", "--corpus", "c", "--log", str(log), "--part", "ptq-tiny-s0", "--checkpoints", str(tmp_path)])
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [x["part"] for x in lines] == ["tiny-float-s0", "ptq-tiny-s0"]
    assert lines[1]["float"]["bpb"] == lines[0]["bpb"]


def _ptq_line(seed: int, float_bpb: float, w4_gptq: float, w4a8: dict, ternary: dict, qat: dict) -> dict:
    def form(methods: dict) -> dict:
        return {
            "methods": {m: {"bpb": b, "val_bpb": b} for m, b in methods.items()},
            "best": min(methods, key=methods.get),
        }

    forms = {"w4-g32": form({"rtn": 1.10, "gptq": w4_gptq}), "w4a8": form(w4a8), "w1.58a8": form(ternary)}
    return {
        "part": f"ptq-25M-s{seed}",
        "size": "25M",
        "config": "ptq",
        "seed": seed,
        "ptq": True,
        "sweep": False,
        "warm": False,
        "model": {"tied": True},
        "float": {"bpb": float_bpb},
        "forms": forms,
        "qat": {c: {"bpb": b, "train_bytes": 12_500_000} for c, b in qat.items()},
        "corpus_sha256": {"train": "x"},
        "conditions": _CONDITIONS,
    }


def test_merge_gives_the_ptq_figures_against_each_parts_float(tmp_path):
    grid = _grid()
    log = tmp_path / "log.jsonl"
    refs = {"part": "references", "references": {"xz": {"bpb": 1.4}}, "scored_bytes": 2 << 20}
    plain = [_run("25M-float-s0", "float", 1.00), refs | {"corpus_sha256": {"train": "x"}}]
    fields = {"log": [str(log)], "results": str(tmp_path / "r"), "plot": None, "conditions": None, "note": None}
    log.write_text("".join(json.dumps(x) + "\n" for x in plain))
    grid.merge(type("A", (), fields | {"older": None}))
    without = load_results(tmp_path / "r" / "lm_scale.json")
    assert not any(k.startswith(("ptq_", "qat_from_ptq")) for k in without["figures"])

    # Seed 0: GPTQ w4 g32 +1.0%, w4a8's best (gptq) +4%, QAT to +1% (75% closed); ternary's best (rtn) +100%,
    # QAT to +60% (40% closed). Seed 1 the same against a float of 2.0.
    lines = [
        _ptq_line(0, 1.0, 1.01, {"rtn": 1.08, "gptq": 1.04}, {"rtn": 2.0, "gptq": 2.2}, {"w4a8": 1.01, "w1.58a8": 1.6}),
        _ptq_line(1, 2.0, 2.02, {"rtn": 2.16, "gptq": 2.08}, {"rtn": 4.0, "gptq": 4.4}, {"w4a8": 2.02, "w1.58a8": 3.2}),
    ]
    log.write_text("".join(json.dumps(x) + "\n" for x in [*plain, *lines]))
    grid.merge(type("A", (), fields | {"older": None}))
    doc = load_results(tmp_path / "r" / "lm_scale.json")
    figures = doc["figures"]
    assert doc["rows"] == without["rows"]  # PTQ parts are figures, not rows
    w4 = figures["ptq_gptq_w4_g32_25M_gap"]
    assert (w4["text"], w4["target"], w4["met"]) == ("+1.00%", "≤ +1.5%", True)
    assert figures["ptq_w1_58a8_25M_gap"]["text"] == "+100.00%" and "(rtn)" in figures["ptq_w1_58a8_25M_gap"]["note"]
    w4a8, ternary = figures["qat_from_ptq_w4a8_25M_closed"], figures["qat_from_ptq_w1_58a8_25M_closed"]
    assert (w4a8["text"], w4a8["target"], w4a8["met"]) == ("75%", "≥ 50%", True)
    assert (ternary["text"], ternary["met"]) == ("40%", False)
    assert "2 seed(s)" in ternary["note"]
