"""stejax vq compare: the report's shape on a tiny grid, compile once per shape, the set-ups, the targets' judging,
the control, the digits VQ-VAE."""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import pytest
from click.testing import CliRunner

from stejax.bench.results import load_results
from stejax.cli import main
from stejax.vq import SETUPS, VARIANTS, CompareSettings, fsq_levels_for, judge_targets
from stejax.vq._compare import _BY_NAME, DIAGNOSTIC_KEYS, _init, _loss, _model, jobs_of

from helpers import no_persistent_cache

# Two variants in one set-up keep the module's set-up to two small compilations: dead-code replacement with EMA (the
# statistics, the replacement and the EMA codes inside the scan) and FSQ (the reference of MSE / FSQ).
CHOSEN = ("dead_ema", "fsq")
TINY = ["--seeds", "2", "--steps", "30", "--codebook-sizes", "16", "--code-dims", "4", "--setups", "gradient"]
ROW_KEYS = {
    "setup",
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
    *DIAGNOSTIC_KEYS,
}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("vq")
    args = ["vq", "compare", "--quick", *TINY, "--configs", ",".join(CHOSEN), "--out", str(out / "run")]
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
        assert (r["setup"], r["codebook_size"], r["code_dim"], r["bits"]) == ("gradient", 16, 4, 4.0)
        assert r["usage_end"] == r["usage"] and 0 < r["usage_start"] <= 1
        assert r["z_norm_start"] > 0 and r["z_norm_end"] > 0 and r["quant_error_end"] >= 0
        assert -1 <= r["cosine_start"] <= 1 and -1 <= r["cosine_end"] <= 1
        # FSQ's codes are a fixed grid: no codebook norms; a codebook's used codes are some of all of them
        if r["variant"] == "fsq":
            assert r["q_norm_all_end"] is None and r["q_norm_used_end"] is None
        else:
            assert r["q_norm_used_end"] > 0 and r["q_norm_all_end"] > 0
        assert 0 < r["usage"] <= 1 and 0 < r["batch_usage"] <= r["usage"]
        assert math.isclose(r["perplexity_over_k"], r["perplexity"] / 16)
        assert math.isfinite(r["val_mse"]) and r["val_mse"] > 0
    fsq = [r for r in rows if r["variant"] == "fsq"]
    assert all(math.isclose(r["mse_over_fsq"], r["val_mse"] / (sum(f["val_mse"] for f in fsq) / 2)) for r in rows)
    assert [(e["setup"], e["variant"], e["seeds"]) for e in report["summary"]] == [("gradient", v, 2) for v in CHOSEN]
    assert report["data"]["val_tokens"] == report["data"]["val_distinct_tokens"] == 4096
    assert report["data"]["train_distinct_tokens"] == 30 * 256
    assert {t["key"] for t in report["targets"]} == {"fsq_usage"}  # the others are judged in the reference set-up
    assert report["digits"] is None and list(report["setups"]) == ["gradient"]


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
    assert {r["setup"] for r in results["rows"]} == {"gradient"}
    for name in ("usage_vs_k.png", "mse_vs_bits.png"):
        assert (out / "run" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (out / "img" / name).read_bytes() == (out / "run" / name).read_bytes()
    assert "| gradient | dead_ema | 16 | 4 |" in (out / "run" / "report.md").read_text()


def test_the_control_trains_the_codes_and_the_decoder_never_the_encoder():
    s = CompareSettings(seeds=(0,), hidden=8, batch_size=16, val_size=16)
    x = jax.random.normal(jax.random.key(1), (16, s.data_dim))
    for name in ("no_gradient", "ste"):
        m = _model(_BY_NAME[name], s, 16, 4, "gradient")
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
        "kmeans_rotation",
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
    with pytest.raises(ValueError, match=r"unknown or repeated set-up\(s\) \['bogus'\]"):
        CompareSettings(setups=("bogus",))


def test_setups_and_their_programs():
    assert [u.name for u in SETUPS] == ["reference", "gradient", "wide-init"]
    reference, gradient, wide = SETUPS
    assert (reference.update, reference.decay, reference.code_init, reference.commitment_weight) == (
        "ema",
        0.8,
        "kaiming_uniform",
        1.0,
    )
    assert (gradient.update, gradient.code_init, gradient.commitment_weight) == ("gradient", "uniform", 0.25)
    assert (wide.update, wide.code_init, wide.init_scale) == ("gradient", "normal", 1.0)
    # Every variant under every set-up's codebook handling; an EMA variant in the EMA set-up is its STE twin and
    # does not run twice; FSQ, which has no codebook, runs once per K and d.
    s = CompareSettings(codebook_sizes=(16,), code_dims=(4,))
    jobs = jobs_of(s)
    assert ("reference", "ema", 16, 4) not in jobs and ("gradient", "ema", 16, 4) in jobs
    assert [j for j in jobs if j[1] == "fsq"] == [(None, "fsq", 16, 4)]
    assert len(jobs) == (len(VARIANTS) - 1) * 3 - 2 + 1
    # The set-up reaches the codebook: its codes, update, decay and loss weights
    for setup in SETUPS:
        cb = _model(_BY_NAME["ste"], s, 16, 4, setup.name).codebook
        assert (cb.update, cb.decay, cb.code_init) == (setup.update, setup.decay, setup.code_init)
        assert _model(_BY_NAME["ema"], s, 16, 4, setup.name).codebook.update == "ema"
    # --codebook-init-scale replaces every set-up's scale (Kaiming-uniform becomes uniform with that bound)
    scaled = CompareSettings(codebook_sizes=(16,), code_dims=(4,), init_scale=0.05)
    cb = _model(_BY_NAME["ste"], scaled, 16, 4, "reference").codebook
    assert (cb.code_init, cb.init_scale) == ("uniform", 0.05)


def _entry(variant, k, d, usage, mse=1.0, perplexity=1.0):
    return {
        "setup": "reference",
        "variant": variant,
        "codebook_size": k,
        "code_dim": d,
        "usage": usage,
        "val_mse": mse,
        "perplexity": perplexity,
    }


def test_targets_are_judged_on_the_means():
    s = CompareSettings(codebook_sizes=(512, 4096), code_dims=(32,))
    summary = [
        _entry("ste", 512, 32, 0.5, 0.25),
        _entry("rotation", 512, 32, 0.99, 0.22),
        _entry("fsq", 512, 32, 0.99, 0.30),
        _entry("no_gradient", 512, 32, 0.5, 0.60),
        _entry("ste", 4096, 32, 0.2, 0.20),
        _entry("rotation", 4096, 32, 0.3, 0.21),
        _entry("dead_rotation", 4096, 32, 0.97, 0.15),
        _entry("fsq", 4096, 32, 0.80, 0.20, perplexity=2000.0),
        _entry("no_gradient", 4096, 32, 0.1, 0.29),
        {**_entry("ste", 4096, 32, 0.1, 0.3), "setup": "wide-init"},
        {**_entry("rotation", 4096, 32, 0.01, 0.5), "setup": "wide-init"},
    ]
    targets = {t["key"]: t for t in judge_targets(summary, s)}
    assert {k: t["passed"] for k, t in targets.items()} == {
        "rotation_lifts": False,  # 0.3 < 0.2 + 0.2 at K = 4096
        "rotation_noninferior": True,
        "rotation_mse": False,  # 0.21 > 0.20 at K = 4096
        "dead_rotation_d32": True,
        "fsq_usage": False,
        "best_vs_fsq_d32": True,  # dead_rotation 0.15 <= 1.1 x 0.20
        "control": False,  # 0.29 / 0.15 < 2 at K = 4096
        "wide_init_collapse_d32": True,
    }
    assert "entropy of its codes 10.97 bits of 12" in targets["fsq_usage"]["detail"]
    digits = {
        "summary": [_entry("ste", 512, 16, 0.95, 0.010), _entry("fsq", 512, 16, 0.9, 0.012)],
        "codebook_size": 512,
    }
    got = {t["key"]: t["passed"] for t in judge_targets(summary, s, digits=digits) if t["key"].startswith("digits")}
    assert got == {"digits_usage": True, "digits_vs_fsq": True}


def test_bad_grids_are_refused():
    result = CliRunner().invoke(main, ["vq", "compare", "--codebook-sizes", "100", "--out", "x"])
    assert result.exit_code == 2 and "a power of two >= 4; got 100" in result.output
    result = CliRunner().invoke(main, ["vq", "compare", "--code-dims", "8,x", "--out", "x"])
    assert result.exit_code == 2 and "expected positive integers separated by commas" in result.output
    result = CliRunner().invoke(main, ["vq", "compare", "--configs", "vq_bogus", "--out", "x"])
    assert result.exit_code == 2 and "unknown configuration(s) ['vq_bogus']" in result.output
    assert "--configs" in result.output
    result = CliRunner().invoke(main, ["vq", "compare", "--setups", "reference,narrow", "--out", "x"])
    assert result.exit_code == 2 and "unknown configuration(s) ['narrow']" in result.output
    assert "reference, gradient, wide-init" in result.output


def test_the_digits_vq_vae_reports_usage_perplexity_and_mse_per_variant():
    from stejax.vq._digits import _conv, _conv_init, digits_check

    # Its convolutions (shifted slices and one product) are lax's.
    x = jax.random.normal(jax.random.key(0), (2, 8, 8, 3))
    for size, stride, pad in ((3, 1, 1), (4, 2, 1), (1, 1, 0)):
        layer = _conv_init(jax.random.key(size), size, 3, 4)
        want = jax.lax.conv_general_dilated(
            x, layer["w"], (stride, stride), ((pad, pad), (pad, pad)), dimension_numbers=("NHWC", "HWIO", "NHWC")
        )
        assert jnp.allclose(_conv(layer, x, stride, pad), want + layer["b"][None, None, None, :], atol=1e-5)
    s = CompareSettings(seeds=(0,), variants=("ste", "fsq"), digits_steps=3, digits_codebook_size=16)
    report = digits_check(s)
    assert [(e["variant"], e["codebook_size"], e["seeds"]) for e in report["summary"]] == [
        ("ste", 16, 1),
        ("fsq", 16, 1),
    ]
    assert report["data"]["test_tokens"] == 360 * 16 and report["steps"] == 3
    for e in report["summary"]:
        assert 0 < e["usage"] <= 1 and math.isclose(e["perplexity_over_k"], e["perplexity"] / 16)
        assert 0 < e["val_mse"] < 1
    assert report["summary"][1]["mse_over_fsq"] == 1.0
