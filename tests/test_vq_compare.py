"""stejax vq compare: the report's shape on a tiny grid, compile once per shape, the targets' judging, the control."""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import pytest
from click.testing import CliRunner

from stejax.bench.results import load_results
from stejax.cli import main
from stejax.vq import VARIANTS, CompareSettings, fsq_levels_for, judge_targets
from stejax.vq._compare import _BY_NAME, _init, _loss, _model

from helpers import no_persistent_cache

# Two variants keep the module's set-up to two small compilations: dead-code replacement with EMA (the statistics,
# the replacement and the EMA codes inside the scan) and FSQ (the reference of MSE / FSQ).
CHOSEN = ("dead_ema", "fsq")
TINY = ["--seeds", "2", "--steps", "30", "--codebook-sizes", "16", "--code-dims", "4"]
ROW_KEYS = {
    "variant",
    "codebook_size",
    "code_dim",
    "seed",
    "bits",
    "usage",
    "batch_usage",
    "perplexity",
    "perplexity_over_k",
    "val_mse",
    "mse_over_fsq",
    "train_mse_end",
    "replaced",
}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("vq")
    args = ["vq", "compare", "--quick", *TINY, "--variants", ",".join(CHOSEN), "--out", str(out / "run")]
    with no_persistent_cache():  # the report counts compilations (test_every_program_compiles_once_and_not_again)
        result = CliRunner().invoke(main, [*args, "--results", str(out / "results"), "--figures", str(out / "img")])
    assert result.exit_code == 0, result.output
    return out, result.output


def test_report_has_one_row_per_variant_size_dim_and_seed(tiny_run):
    out, _ = tiny_run
    report = json.loads((out / "run" / "report.json").read_text())
    rows = report["rows"]
    assert [(r["variant"], r["seed"]) for r in rows] == [(v, s) for v in CHOSEN for s in (0, 1)]
    for r in rows:
        assert set(r) == ROW_KEYS
        assert (r["codebook_size"], r["code_dim"], r["bits"]) == (16, 4, 4.0)
        assert 0 < r["usage"] <= 1 and 0 < r["batch_usage"] <= r["usage"]
        assert math.isclose(r["perplexity_over_k"], r["perplexity"] / 16)
        assert math.isfinite(r["val_mse"]) and r["val_mse"] > 0
    fsq = [r for r in rows if r["variant"] == "fsq"]
    assert all(math.isclose(r["mse_over_fsq"], r["val_mse"] / (sum(f["val_mse"] for f in fsq) / 2)) for r in rows)
    assert [(e["variant"], e["seeds"]) for e in report["summary"]] == [(v, 2) for v in CHOSEN]
    assert report["data"]["val_tokens"] == report["data"]["val_distinct_tokens"] == 4096
    assert report["data"]["train_distinct_tokens"] == 30 * 256
    assert {t["key"] for t in report["targets"]} >= {"fsq_usage", "dead_ema_d4", "best_vs_fsq_d4"}


def test_every_program_compiles_once_and_not_again(tiny_run):
    out, output = tiny_run
    report = json.loads((out / "run" / "report.json").read_text())
    assert [p["compiles"] for p in report["programs"]] == [1, 1]
    assert report["programs"][0]["compiles_again"] == 0
    assert "2 compilations" in output and "in one process" in output


def test_results_file_plots_and_markdown(tiny_run):
    out, _ = tiny_run
    results = load_results(out / "results" / "vq_compare_quick.json")
    assert [r["variant"] for r in results["rows"]] == list(CHOSEN)
    assert "vq compare --out " in results["command"]
    assert "--quick --seeds 2 --steps 30" in results["command"]
    assert results["figures"]["fsq_usage"]["target"] == "FSQ usage >= 0.95 at every K"
    for name in ("usage_vs_k.png", "mse_vs_bits.png"):
        assert (out / "run" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (out / "img" / name).read_bytes() == (out / "run" / name).read_bytes()
    assert "| dead_ema | 16 | 4 |" in (out / "run" / "report.md").read_text()


def test_the_control_trains_the_codes_and_the_decoder_never_the_encoder():
    s = CompareSettings(seeds=(0,), hidden=8, batch_size=16, val_size=16)
    x = jax.random.normal(jax.random.key(1), (16, s.data_dim))
    for name in ("no_gradient", "ste"):
        m = _model(_BY_NAME[name], s, 16, 4)
        params, _ = _init(m, jax.random.key(0))
        grads = jax.jit(jax.grad(lambda p, m=m: _loss(m, p, x)[0]))(params)
        totals = {k: sum(float(jnp.abs(leaf).sum()) for leaf in jax.tree.leaves(g)) for k, g in grads.items()}
        assert totals["codebook"] > 0 and totals["decoder"] > 0
        assert (totals["encoder"] == 0) == (name == "no_gradient")


def test_variants_and_fsq_levels():
    names = [v.name for v in VARIANTS]
    assert names == [
        "ste",
        "rotation",
        "ema",
        "kmeans",
        "dead",
        "dead_ema",
        "dead_rotation",
        "cosine",
        "low_dim",
        "fsq",
        "no_gradient",
    ]
    assert [fsq_levels_for(k) for k in (64, 512, 4096, 16)] == [(4, 4, 4), (8, 8, 8), (8, 8, 8, 8), (8, 2)]
    assert all(math.prod(fsq_levels_for(k)) == k for k in (64, 512, 4096, 16, 32, 1024))
    with pytest.raises(ValueError, match="a power of two >= 4; got 100"):
        fsq_levels_for(100)
    with pytest.raises(ValueError, match=r"unknown variant\(s\) \['bogus'\]"):
        CompareSettings(variants=("bogus",))


def _entry(variant, k, d, usage, mse=1.0):
    return {"variant": variant, "codebook_size": k, "code_dim": d, "usage": usage, "val_mse": mse}


def test_targets_are_judged_on_the_means():
    s = CompareSettings(codebook_sizes=(64, 4096), code_dims=(8,))
    summary = [
        _entry("ste", 64, 8, 1.0, 0.10),
        _entry("rotation", 64, 8, 0.96, 0.10),
        _entry("fsq", 64, 8, 1.0, 0.09),
        _entry("no_gradient", 64, 8, 0.5, 0.30),
        _entry("ste", 4096, 8, 0.2, 0.05),
        _entry("rotation", 4096, 8, 0.3, 0.05),
        _entry("ema", 4096, 8, 0.75, 0.04),
        _entry("dead_ema", 4096, 8, 0.99, 0.03),
        _entry("fsq", 4096, 8, 0.97, 0.04),
        _entry("no_gradient", 4096, 8, 0.1, 0.05),
    ]
    got = {t["key"]: t["passed"] for t in judge_targets(summary, s)}
    assert got == {
        "k64_usage": True,
        "k64_rotation_noninferior": True,
        "ste_collapses_d8": True,
        "rotation_lifts": False,  # 0.3 < 0.2 + 0.2
        "dead_ema_d8": True,
        "ema_usage": True,
        "fsq_usage": True,
        "best_vs_fsq_d8": True,  # dead_ema 0.03 <= 1.1 x 0.04
        "ste_worse_than_fsq_d8": True,
        "control": False,  # 0.05 / 0.03 < 2 at K = 4096
    }


def test_bad_grids_are_refused():
    result = CliRunner().invoke(main, ["vq", "compare", "--codebook-sizes", "100", "--out", "x"])
    assert result.exit_code == 2 and "a power of two >= 4; got 100" in result.output
    result = CliRunner().invoke(main, ["vq", "compare", "--code-dims", "8,x", "--out", "x"])
    assert result.exit_code == 2 and "expected positive integers separated by commas" in result.output
    result = CliRunner().invoke(main, ["vq", "compare", "--variants", "vq_bogus", "--out", "x"])
    assert result.exit_code == 2 and "unknown configuration(s) ['vq_bogus']" in result.output
