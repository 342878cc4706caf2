"""PTQ or QAT over seeds (benchmarks/ptq_vs_qat.py): means, ranges and the choices made on validation."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from helpers import benchmark_script


def _bench():
    return benchmark_script("ptq_vs_qat")


def _row(method, val, test, float_accuracy, **extra):
    return {
        "form": "w4",
        "method": method,
        "val_accuracy": val,
        "test_accuracy": test,
        "gap_points": test - float_accuracy,
        "ptq_seconds": None if method.startswith("qat") else 1.0,
        "qat_steps": 5 if method.startswith("qat") else None,
        "qat_seconds": 2.0 if method.startswith("qat") else None,
        "note": None,
        **extra,
    }


def _run(seed, float_accuracy, rtn, gptq, started_from):
    """A seed's rows: ``rtn`` and ``gptq`` are (validation %, test %)."""
    return {
        "seed": seed,
        "float_accuracy": float_accuracy,
        "rows": [
            _row("rtn", *rtn, float_accuracy),
            _row("gptq", *gptq, float_accuracy),
            _row("qat from best PTQ", 95.0, 96.0, float_accuracy, started_from=started_from),
        ],
    }


def test_rows_are_means_over_seeds_with_each_gap_against_its_own_float():
    bench = _bench()
    # GPTQ wins validation in seed 0 by a little and loses in seed 1 by a lot: RTN has the better mean.
    runs = [
        _run(0, 96.0, rtn=(98.0, 95.0), gptq=(98.5, 97.0), started_from="gptq"),
        _run(1, 92.0, rtn=(99.0, 93.0), gptq=(96.0, 91.0), started_from="rtn"),
    ]
    rows = {r["method"]: r for r in bench.aggregate(runs)}
    gptq = rows["gptq"]
    assert gptq["seeds"] == 2
    assert gptq["gap_points"] == pytest.approx(np.mean([97.0 - 96.0, 91.0 - 92.0]))  # each against its own float
    assert (gptq["gap_min"], gptq["gap_max"]) == (pytest.approx(-1.0), pytest.approx(1.0))
    assert gptq["test_accuracy"] == pytest.approx(94.0) and gptq["val_accuracy"] == pytest.approx(97.25)
    assert gptq["per_seed"]["seed"] == [0, 1] and gptq["per_seed"]["gap_points"] == [1.0, -1.0]
    assert gptq["ptq_seconds"] == pytest.approx(1.0) and gptq["qat_seconds"] is None
    started = rows["qat from best PTQ"]
    assert started["per_seed"]["started_from"] == ["gptq", "rtn"]
    assert started["note"] == "from gptq (1 of 2), rtn (1 of 2)"

    best = bench.best_ptq(bench.aggregate(runs), "w4")
    assert best["method"] == "rtn"  # the best mean validation accuracy, whatever the test split says
    figures = bench.figures(bench.aggregate(runs), runs)
    assert figures["w4_best_ptq"].value == pytest.approx(np.mean([95.0 - 96.0, 93.0 - 92.0]))
    assert figures["w4_best_ptq"].text == "0.0 points (\N{MINUS SIGN}1.0 to +1.0, 2 seeds; rtn)"
    assert figures["w4_gptq"].text == "0.0 points (\N{MINUS SIGN}1.0 to +1.0, 2 seeds)"
    assert figures["float_accuracy"].value == pytest.approx(94.0)
    assert figures["seeds"].value == 2


def test_a_form_the_reference_model_cannot_train_keeps_its_reason():
    bench = _bench()
    reason = "not run: the reference model's LSQ quantisers have no group scales to train"
    runs = [
        {
            "seed": s,
            "float_accuracy": 96.0,
            "rows": [
                _row("rtn", 97.0, 95.0, 96.0),
                {
                    **_row("qat", 0, 0, 0),
                    "val_accuracy": None,
                    "test_accuracy": None,
                    "gap_points": None,
                    "note": reason,
                },
            ],
        }
        for s in (0, 1)
    ]
    rows = bench.aggregate(runs)
    assert rows[1]["seeds"] is None and rows[1]["gap_points"] is None and rows[1]["note"] == reason
    assert "per_seed" not in rows[1]
    assert set(bench.figures(rows, runs)) == {"seeds", "float_accuracy", "w4_best_ptq", "w4_rtn"}


def test_two_tiny_seeds_end_to_end(tmp_path):
    bench = _bench()
    out = tmp_path / "results"
    args = ["--seeds", "0", "1", "--forms", "w4", "--epochs", "1", "--qat-steps", "2", "--calibration-rows", "64"]
    # optax's cosine schedule multiplies a Python float by its int32 step count: JAX's default promotion.
    with jax.numpy_dtype_promotion("standard"):
        bench.main([*args, "--results", str(out), "--plot", str(tmp_path / "plot.png")])
    doc = json.loads((out / "ptq_vs_qat.json").read_text("utf-8"))
    rows = {r["method"]: r for r in doc["rows"]}
    assert list(rows) == ["rtn", "gptq", "awq", "qat", "qat from best PTQ"]
    for row in rows.values():
        seeds = row["per_seed"]
        assert row["seeds"] == 2 and seeds["seed"] == [0, 1]
        assert row["gap_points"] == pytest.approx(np.mean(seeds["gap_points"]))
        assert row["test_accuracy"] == pytest.approx(np.mean(seeds["test_accuracy"]))
        assert (row["gap_min"], row["gap_max"]) == (min(seeds["gap_points"]), max(seeds["gap_points"]))
    ptq = ["rtn", "gptq", "awq"]
    # Each seed's QAT starts from its own best PTQ on validation (the first in method order on a tie).
    for k in range(2):
        validation = [rows[m]["per_seed"]["val_accuracy"][k] for m in ptq]
        assert rows["qat from best PTQ"]["per_seed"]["started_from"][k] == ptq[int(np.argmax(validation))]
    best = ptq[int(np.argmax([rows[m]["val_accuracy"] for m in ptq]))]
    assert doc["figures"]["w4_best_ptq"]["text"].endswith(f"2 seeds; {best})")
    assert doc["figures"]["w4_best_ptq"]["value"] == pytest.approx(rows[best]["gap_points"])
    assert "test split chose nothing" in doc["notes"]
    assert (tmp_path / "plot.png").stat().st_size > 0
