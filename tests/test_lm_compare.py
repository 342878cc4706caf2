"""stejax lm compare's report.json shape on a tiny setting, and the lm commands end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from stejax.bench._peers_lm import stejax_w4_weight_only
from stejax.cli import main
from stejax.lm import QUICK, LMConfig, compare_lm
from stejax.lm._compare import NO_STE_MARGIN_BPB, _targets
from stejax.lm._train import make_optimizer

TINY = LMConfig(context=16, width=32, depth=1, heads=2, hidden=64)


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(0)
    words = [b"def ", b"return ", b"x", b" = ", b"(", b")", b":\n", b"    ", b"jnp.", b"array"]
    for i in range(80):
        (root / f"m{i}.py").write_bytes(b"".join(words[j] for j in rng.integers(0, len(words), 300)))
    return root


# The tiny comparison's settings. The 1-byte prompt makes the sampler's prefill the shape of its per-byte step:
# one compiled program per model instead of two.
SETTINGS = QUICK.replace(
    model=TINY,
    float_steps=3,
    finetune_steps=2,
    configs=("float", "w4a8", "w4a8_no_ste"),
    scratch=("w1.58a8", "w4a8_no_ste"),
    batch_size=4,
    eval_bytes=512,
    eval_every=100,
    reference_context_bytes=4096,
    prompt="d",
    sample_tokens=3,
)
EXTRA = {"w4 weight-only": stejax_w4_weight_only}


@pytest.fixture(scope="module")
def comparison(tmp_path_factory, corpus_dir):
    """One tiny comparison in this process, shared: (settings, report, its folder). Seed 0 is also the serial
    reference of the run in worker processes."""
    out = tmp_path_factory.mktemp("comparison")
    return SETTINGS, compare_lm(SETTINGS, out_dir=out, corpus=corpus_dir, extra=EXTRA), out


def test_report_json_shape(comparison):
    """The report's fields; float_scratch is the baseline of every from-scratch row, seed by seed; the no-STE
    target row judges the from-scratch pairing and carries the checkpoint one; post-training quantisation rows;
    the weight decay's shrink of the zero-gradient block kernels."""
    settings, report, tmp_path = comparison
    on_disk = json.loads((tmp_path / "report.json").read_text())
    assert on_disk["summary"] == report["summary"]
    from_scratch = ["float_scratch", "w1.58a8_scratch", "w4a8_no_ste_scratch"]
    names = ["float", "w4a8", "w4a8_no_ste", "w4 weight-only", *from_scratch]  # the configurations, the extras, scratch
    assert list(report["summary"]) == names
    for row in report["summary"].values():
        assert set(row) == {
            "test_bpb_mean",
            "test_bpb_std",
            "test_bpb_min",
            "test_bpb_max",
            "baseline",
            "delta_pct",
            "delta_vs_float_pct",
            "step_ms_median",
        }
        assert all(np.isfinite(v) for k, v in row.items() if k != "baseline")
    s = report["summary"]
    assert s["float"]["delta_vs_float_pct"] == 0.0 and s["float_scratch"]["delta_pct"] == 0.0
    # Every from-scratch row is read against float trained from scratch, every other row against float.
    for name, row in s.items():
        base = "float_scratch" if name.endswith("_scratch") else "float"
        assert row["baseline"] == base
        b = s[base]["test_bpb_mean"]
        assert row["delta_pct"] == pytest.approx(100 * (row["test_bpb_mean"] - b) / b)
    assert set(report["paired"]) == {"w1.58a8_scratch", "w4a8_no_ste_scratch"}
    pair = report["paired"]["w1.58a8_scratch"]["per_seed"][0]
    assert pair["float_scratch_test_bpb"] == report["per_seed"]["float_scratch"][0]["test_bpb"]
    assert pair["delta_pct"] == pytest.approx(s["w1.58a8_scratch"]["delta_pct"])  # one seed: the mean is the pair
    assert [r["seed"] for r in report["per_seed"]["float"]] == [0]
    assert {"ngram-1", "ngram-2", "ngram-3", "ngram-4", "zlib", "bz2", "xz"} == set(report["references"])
    assert set(report["corpus"]["sha256"]) == {"train", "validation", "test"}
    assert sum(len(v) for v in report["corpus"]["files"].values()) == 80
    assert set(report["samples"]["text"]) == set(names)
    assert report["targets"]["judged"] is False
    rows = report["targets"]["rows"]
    key = "w4a8_no_ste >= every STE configuration + 0.2 bpb"
    ternary = "w1.58a8_scratch delta vs float_scratch <= 4.0%"
    assert set(rows) == {"float < ngram-3", "w4a8 delta <= 2.0%", ternary, key}
    assert rows[ternary]["measured"] == s["w1.58a8_scratch"]["delta_pct"] and rows[ternary]["stretch"] == 3.0
    row = rows[key]
    worst = "w1.58a8_scratch"  # the only STE configuration from scratch here; the choice among several: below
    assert row["pairing"].startswith("judged from scratch") and row["worst_ste"] == worst
    assert row["measured"] == s["w4a8_no_ste_scratch"]["test_bpb_mean"] - s[worst]["test_bpb_mean"]
    other = row["other_pairing"]
    assert other["pairing"] == "from the float checkpoint" and other["worst_ste"] == "w4a8"
    assert other["measured"] == s["w4a8_no_ste"]["test_bpb_mean"] - s["w4a8"]["test_bpb_mean"]
    # w4a8_no_ste's forward is w4a8's: post-training quantisation is scored once, under w4a8.
    assert set(report["ptq"]) == {"w4a8"} and len(report["ptq"]["w4a8"]["per_seed"]) == 1
    # Zero gradient, but AdamW's decoupled decay still shrinks the block kernels: by prod(1 - lr_t * wd).
    _, finetune, _ = settings.schedules()
    scratch = settings.scratch_for("w4a8_no_ste")
    for name, schedule in (("w4a8_no_ste", finetune), ("w4a8_no_ste_scratch", scratch)):
        lrs = make_optimizer(schedule)[1]
        shrink = float(np.prod([1 - float(lrs(t)) * schedule.weight_decay for t in range(schedule.steps)]))
        assert shrink < 1
        assert report["per_seed"][name][0]["block_kernel_norm_ratio"] == pytest.approx(shrink, rel=1e-5)
    assert {"python", "jax", "flax", "load_average_at_start"} <= set(report["environment"])
    md = (tmp_path / "report.md").read_text()
    assert "| `w1.58a8_scratch` |" in md and "| `w4 weight-only` |" in md and "ngram-3" in md
    assert "from the float checkpoint: w4a8_no_ste - w4a8" in md and "| `float_scratch` |" in md
    assert (tmp_path / "seed0" / "w4a8_no_ste_scratch" / "metrics.jsonl").exists()


def test_the_no_ste_row_takes_the_worst_of_several_ste_configurations():
    """The targets on a hand-made summary: the worst STE configuration is chosen among several, from scratch (the
    judged pairing) and from the float checkpoint; each bound is met or missed as stated."""
    means = {"float": 2.0, "w4a8": 2.03, "w1.58a8": 2.2, "w4a8_no_ste": 2.3}
    means |= {"float_scratch": 2.1, "w1.58a8_scratch": 2.18, "w4a8_scratch": 2.25, "w4a8_no_ste_scratch": 2.5}
    summary = {
        name: {
            "test_bpb_mean": bpb,
            "delta_pct": 100 * (bpb / means["float_scratch" if name.endswith("_scratch") else "float"] - 1),
        }
        for name, bpb in means.items()
    }
    settings = SETTINGS.replace(
        configs=("float", "w4a8", "w1.58a8", "w4a8_no_ste"), scratch=("w1.58a8", "w4a8", "w4a8_no_ste")
    )
    targets = _targets(summary, {"ngram-3": {"bpb": 2.5}}, settings)
    assert targets["judged"] is False
    assert _targets(summary, {}, settings.replace(tier="full", seeds=(0, 1)))["judged"] is True
    rows = targets["rows"]
    key = f"w4a8_no_ste >= every STE configuration + {NO_STE_MARGIN_BPB} bpb"
    ternary = "w1.58a8_scratch delta vs float_scratch <= 4.0%"
    assert set(rows) == {"float < ngram-3", "w4a8 delta <= 2.0%", "w1.58a8 delta <= 6.0%", ternary, key}
    assert rows["float < ngram-3"]["met"] and rows["w4a8 delta <= 2.0%"]["met"]
    assert not rows["w1.58a8 delta <= 6.0%"]["met"]  # 10%
    assert rows[ternary]["met"] and not rows[ternary]["stretch_met"]  # 3.8%: within 4%, not within 3%
    row = rows[key]
    assert (row["control"], row["worst_ste"]) == ("w4a8_no_ste_scratch", "w4a8_scratch")  # not w1.58a8_scratch
    assert row["measured"] == pytest.approx(0.25) and row["met"] is True and row["bound"] == NO_STE_MARGIN_BPB
    other = row["other_pairing"]
    assert (other["control"], other["worst_ste"]) == ("w4a8_no_ste", "w1.58a8")  # not w4a8
    assert other["measured"] == pytest.approx(0.1) and other["met"] is False


def test_train_export_sample_commands(tmp_path, corpus_dir):
    runner = CliRunner()
    shape = ["--context", "16", "--width", "32", "--depth", "1", "--heads", "2", "--hidden", "64"]
    run = tmp_path / "run"
    result = runner.invoke(
        main,
        [
            "lm",
            "train",
            "--out",
            str(run),
            "--preset",
            "w1.58a8",
            "--steps",
            "2",
            "--batch-size",
            "2",
            "--corpus",
            str(corpus_dir),
            *shape,
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads((run / "report.json").read_text())["config"] == "w1.58a8"
    art = tmp_path / "art"
    result = runner.invoke(main, ["lm", "export", str(run), "--out", str(art)])
    assert result.exit_code == 0, result.output
    size = (art / "weights.safetensors").stat().st_size
    assert f"weights.safetensors {size} bytes (predicted {size})" in result.output
    manifest = json.loads((art / "manifest.json").read_text())
    assert {e["container"] for e in manifest["quantised"].values()} == {"trit5"}
    result = runner.invoke(main, ["lm", "sample", str(art), "--prompt", "def ", "--tokens", "5"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("def ") and "bytes/s" in result.output
    result = runner.invoke(main, ["lm", "sample", str(art), "--prompt", "def ", "--tokens", "13"])
    assert result.exit_code == 2 and "expected at most 16 bytes in all, got 17" in result.output
    result = runner.invoke(main, ["lm", "compare", "--out", str(tmp_path / "c"), "--configs", "w3a3"])
    assert result.exit_code == 2 and "unknown configuration(s) ['w3a3']" in result.output


def test_seeds_in_worker_processes_give_the_same_figures_and_extras_are_fine_tuned(tmp_path, corpus_dir, comparison):
    """Two seeds in two worker processes; seed 0 against the comparison made in this process with the same
    schedules (its other configurations do not change float's keys: split keys do not depend on their number)."""
    _, serial, _ = comparison
    settings = SETTINGS.replace(seeds=(0, 1), configs=("float",), scratch=(), finetune_learning_rates={"w1.58a8": 5e-3})
    parallel = compare_lm(settings, out_dir=tmp_path / "p", corpus=corpus_dir, workers=2, extra=EXTRA)
    assert set(parallel["summary"]) == {"float", "w4 weight-only"}
    for name in ("float", "w4 weight-only"):
        assert [r["seed"] for r in parallel["per_seed"][name]] == [0, 1]
        assert parallel["per_seed"][name][0]["test_bpb"] == serial["per_seed"][name][0]["test_bpb"], name
    assert parallel["per_seed"]["float"][0]["test_bpb"] != parallel["per_seed"]["float"][1]["test_bpb"]
    assert parallel["settings"]["finetune_learning_rates"] == {"w1.58a8": 5e-3}
    with pytest.raises(ValueError, match="clash with configuration names"):
        compare_lm(settings, out_dir=tmp_path / "x", corpus=corpus_dir, extra={"w8a8": stejax_w4_weight_only})
    with pytest.raises(ValueError, match="finetune_learning_rates names"):
        settings.replace(finetune_learning_rates={"w9": 1e-3})
    with pytest.raises(ValueError, match="finetune_weight_decays must be >= 0"):
        settings.replace(finetune_weight_decays={"w1.58a8": -0.1})
    with pytest.raises(ValueError, match=r"finetune_min_lr_ratios must lie in \[0, 1\]"):
        settings.replace(finetune_min_lr_ratios={"w1.58a8": 1.5})
    recipe = settings.replace(finetune_weight_decays={"w1.58a8": 0.0}, finetune_min_lr_ratios={"w1.58a8": 0.0})
    tuned, other = (recipe.finetune_for(n, settings.schedules()[1]) for n in ("w1.58a8", "w4a8"))
    assert (tuned.weight_decay, tuned.learning_rate, tuned.min_lr_ratio) == (0.0, 5e-3, 0.0)
    assert (other.weight_decay, other.learning_rate, other.min_lr_ratio) == (0.1, 3e-3, 0.1)


def test_from_scratch_recipe_takes_effect():
    """BitNet b1.58's recipe parts as options: the rate drops at the midpoint, the decay is 0 from it on."""
    from stejax.lm import FULL, TrainSettings

    assert FULL.scratch_names[0] == "float" and "w1.58a8" in FULL.scratch_names and len(FULL.seeds) >= 3
    settings = QUICK.replace(
        scratch_recipe={"warmup_fraction": 0.3},
        scratch_recipes={
            "w1.58a8": {"learning_rate": 2e-2, "two_stage": True, "stage_two_weight_decay": 0.0, "min_lr_ratio": 0.0}
        },
    )
    ternary, flt = settings.scratch_for("w1.58a8"), settings.scratch_for("float")
    total = settings.float_steps + settings.finetune_steps
    assert ternary.steps == flt.steps == total and ternary.warmup == flt.warmup == int(0.3 * total)
    assert (flt.learning_rate, flt.two_stage, flt.stage_two_weight_decay) == (1e-2, False, None)
    assert settings.to_dict()["scratch_schedules"]["w1.58a8"]["two_stage"] is True
    _, lr = make_optimizer(ternary)
    mid = ternary.midpoint
    assert float(lr(mid - 1)) == pytest.approx(2e-2 * ternary.stage_one_end, rel=0.02)
    assert float(lr(mid)) == pytest.approx(2e-2 * ternary.stage_two_start)
    assert float(lr(total)) == pytest.approx(0.0, abs=1e-9)
    # With a zero gradient Adam's step is 0, so a matrix changes only by the decay: 1 - lr_t * wd before the
    # midpoint, not at all from it on; vectors never decay.
    small = TrainSettings(steps=8, warmup=2, weight_decay=0.5, stage_two_weight_decay=0.0, two_stage=True)
    tx, lr = make_optimizer(small)
    params = {"kernel": np.ones((2, 2), np.float32), "scale": np.ones(2, np.float32)}
    state = tx.init(params)
    for t in range(small.steps):
        updates, state = tx.update({k: np.zeros_like(v) for k, v in params.items()}, state, params)
        new = {k: params[k] + np.asarray(updates[k]) for k in params}
        expected = 1 - float(lr(t)) * 0.5 if t < small.midpoint else 1.0
        assert new["kernel"][0, 0] / params["kernel"][0, 0] == pytest.approx(expected, rel=1e-6), t
        assert (new["scale"] == params["scale"]).all()
        params = new
    with pytest.raises(ValueError, match="changes \\['momentum'\\]"):
        QUICK.replace(scratch_recipes={"w1.58a8": {"momentum": 0.9}})
    with pytest.raises(ValueError, match="scratch_recipes names \\['w9'\\]"):
        QUICK.replace(scratch_recipes={"w9": {}})
    with pytest.raises(ValueError, match="must end by the midpoint"):
        TrainSettings(steps=10, warmup=6, two_stage=True)


def test_comparison_runs_export(tmp_path, comparison):
    """Each run of a comparison has what `stejax lm export` reads; a folder without it gets a clear error."""
    _, _, folder = comparison
    runner = CliRunner()
    for run in ("w1.58a8_scratch", "w4a8", "float_base"):
        config = json.loads((folder / "seed0" / run / "config.json").read_text())
        assert config["config"] == run.removesuffix("_scratch").replace("float_base", "float")
        result = runner.invoke(main, ["lm", "export", str(folder / "seed0" / run), "--out", str(tmp_path / run)])
        assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "w1.58a8_scratch" / "manifest.json").read_text())
    assert {e["container"] for e in manifest["quantised"].values()} == {"trit5"}
    result = runner.invoke(main, ["lm", "export", str(folder), "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "has no config.json" in result.output
