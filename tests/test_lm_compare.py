"""stejax lm compare's report.json shape on a tiny setting, and the lm commands end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from stejax.cli import main
from stejax.lm import QUICK, LMConfig, compare_lm
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


def test_report_json_shape(tmp_path, corpus_dir):
    """The report's fields; the no-STE target row judges the checkpoint pairing and carries the from-scratch one;
    post-training quantisation rows; the weight decay's shrink of the zero-gradient block kernels."""
    settings = QUICK.replace(
        model=TINY,
        float_steps=3,
        finetune_steps=2,
        configs=("float", "w4a8", "w4a8_no_ste"),
        scratch=("w4a8", "w4a8_no_ste"),
        batch_size=4,
        eval_bytes=512,
        eval_every=100,
        reference_context_bytes=4096,
        sample_tokens=3,
    )
    report = compare_lm(settings, out_dir=tmp_path, corpus=corpus_dir)
    on_disk = json.loads((tmp_path / "report.json").read_text())
    assert on_disk["summary"] == report["summary"]
    names = {"float", "w4a8", "w4a8_no_ste", "w4a8_scratch", "w4a8_no_ste_scratch"}
    assert set(report["summary"]) == names
    for row in report["summary"].values():
        assert set(row) == {"test_bpb_mean", "test_bpb_std", "delta_vs_float_pct", "step_ms_median"}
        assert all(np.isfinite(v) for v in row.values())
    s = report["summary"]
    assert s["float"]["delta_vs_float_pct"] == 0.0
    assert [r["seed"] for r in report["per_seed"]["float"]] == [0]
    assert {"ngram-1", "ngram-2", "ngram-3", "ngram-4", "zlib", "bz2", "xz"} == set(report["references"])
    assert set(report["corpus"]["sha256"]) == {"train", "validation", "test"}
    assert sum(len(v) for v in report["corpus"]["files"].values()) == 80
    assert set(report["samples"]["text"]) == names
    assert report["targets"]["judged"] is False
    rows = report["targets"]["rows"]
    key = "w4a8_no_ste >= every STE configuration + 0.2 bpb"
    assert set(rows) == {"float < ngram-3", "w4a8 delta <= 2.0%", key}
    row = rows[key]
    assert row["pairing"].startswith("judged from the float checkpoint") and row["worst_ste"] == "w4a8"
    assert row["measured"] == s["w4a8_no_ste"]["test_bpb_mean"] - s["w4a8"]["test_bpb_mean"]
    other = row["other_pairing"]
    assert other["pairing"] == "from scratch" and other["worst_ste"] == "w4a8_scratch"
    assert other["measured"] == s["w4a8_no_ste_scratch"]["test_bpb_mean"] - s["w4a8_scratch"]["test_bpb_mean"]
    # w4a8_no_ste's forward is w4a8's: post-training quantisation is scored once, under w4a8.
    assert set(report["ptq"]) == {"w4a8"} and len(report["ptq"]["w4a8"]["per_seed"]) == 1
    # Zero gradient, but AdamW's decoupled decay still shrinks the block kernels: by prod(1 - lr_t * wd).
    _, finetune, scratch = settings.schedules()
    for name, schedule in (("w4a8_no_ste", finetune), ("w4a8_no_ste_scratch", scratch)):
        lrs = make_optimizer(schedule)[1]
        shrink = float(np.prod([1 - float(lrs(t)) * schedule.weight_decay for t in range(schedule.steps)]))
        assert shrink < 1
        assert report["per_seed"][name][0]["block_kernel_norm_ratio"] == pytest.approx(shrink, rel=1e-5)
    assert {"python", "jax", "flax", "load_average_at_start"} <= set(report["environment"])
    md = (tmp_path / "report.md").read_text()
    assert "| `w4a8_scratch` |" in md and "ngram-3" in md
    assert "from scratch: w4a8_no_ste_scratch - w4a8_scratch" in md
    assert (tmp_path / "seed0" / "w4a8_no_ste_scratch" / "metrics.jsonl").exists()


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
    result = runner.invoke(main, ["lm", "export", str(run), str(art)])
    assert result.exit_code == 0, result.output
    size = (art / "weights.safetensors").stat().st_size
    assert f"weights.safetensors {size} bytes (predicted {size})" in result.output
    manifest = json.loads((art / "manifest.json").read_text())
    assert {e["container"] for e in manifest["quantised"].values()} == {"trit5"}
    result = runner.invoke(main, ["lm", "sample", str(art), "--prompt", "def ", "--tokens", "5"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("def ") and "tokens/s" in result.output
    result = runner.invoke(main, ["lm", "sample", str(art), "--prompt", "def ", "--tokens", "13"])
    assert result.exit_code == 2 and "exceeds the model's context of 16" in result.output
    result = runner.invoke(main, ["lm", "compare", "--out", str(tmp_path / "c"), "--configs", "w3a3"])
    assert result.exit_code == 2 and "unknown configuration(s) ['w3a3']" in result.output


def test_seeds_in_worker_processes_give_the_same_figures_and_extras_are_fine_tuned(tmp_path, corpus_dir):
    from stejax.bench._peers_lm import stejax_w4_weight_only

    settings = QUICK.replace(
        model=TINY,
        float_steps=2,
        finetune_steps=2,
        seeds=(0, 1),
        configs=("float",),
        scratch=(),
        batch_size=2,
        eval_bytes=256,
        reference_context_bytes=2048,
        sample_tokens=2,
        finetune_learning_rates={"w1.58a8": 5e-3},
    )
    extra = {"w4 weight-only": stejax_w4_weight_only}
    parallel = compare_lm(settings, out_dir=tmp_path / "p", corpus=corpus_dir, workers=2, extra=extra)
    serial = compare_lm(settings.replace(seeds=(1,)), out_dir=tmp_path / "s", corpus=corpus_dir, extra=extra)
    assert set(parallel["summary"]) == {"float", "w4 weight-only"}
    for name in ("float", "w4 weight-only"):
        assert [r["seed"] for r in parallel["per_seed"][name]] == [0, 1]
        assert parallel["per_seed"][name][1]["test_bpb"] == serial["per_seed"][name][0]["test_bpb"]
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
