"""stejax vq compare: the report's shape, from a --quick run of two configurations; what the control trains."""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import pytest
from click.testing import CliRunner

from stejax.cli import main
from stejax.vq import CONFIGURATIONS, AutoencoderConfig, CompareSettings
from stejax.vq._compare import _init, _loss, _model

SUMMARY_KEYS = {
    "quantizer",
    "codebook",
    "bits_per_image",
    "test_mse_mean",
    "test_mse_std",
    "usage_mean",
    "perplexity_mean",
    "quantization_error_mean",
}
# Two configurations keep the module's set-up to two compilations (each is most of the cost): the codebook path with
# k-means and dead-code replacement inside jit, and FSQ. The control's training is tested below without a run.
CHOSEN = ("vq_ste-kmeans_dead_code", "fsq")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("vq")
    result = CliRunner().invoke(main, ["vq", "compare", "--quick", "--configs", ",".join(CHOSEN), "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out, result.output


def test_report_json_has_the_documented_shape(quick_run):
    out, _ = quick_run
    report = json.loads((out / "report.json").read_text())
    assert set(report) >= {"summary", "references", "per_seed", "environment", "targets", "settings"}
    assert tuple(report["summary"]) == CHOSEN
    for name, entry in report["summary"].items():
        assert set(entry) == SUMMARY_KEYS, name
        assert entry["bits_per_image"] == 24.0
        assert 0 <= entry["usage_mean"] <= 1
        assert 1 <= entry["perplexity_mean"] <= 64
        for key in ("test_mse_mean", "test_mse_std", "quantization_error_mean"):
            assert math.isfinite(entry[key]) and entry[key] >= 0, (name, key)
    assert report["summary"]["vq_ste-kmeans_dead_code"]["quantizer"] == "vq_ste"
    assert report["summary"]["vq_ste-kmeans_dead_code"]["codebook"] == "kmeans_dead_code"
    assert (report["summary"]["fsq"]["quantizer"], report["summary"]["fsq"]["codebook"]) == ("fsq", "none")
    refs = report["references"]
    assert set(refs) == {"mean_image", "pca", "kmeans"}
    # The references are fitted, not copied: PCA with 8 components beats the mean image.
    assert refs["pca"]["test_mse_mean"] < refs["mean_image"]["test_mse_mean"]
    assert refs["pca"]["components"] == 8 and refs["kmeans"]["codes"] == 256
    for name in CHOSEN:
        rows = report["per_seed"][name]
        assert [r["seed"] for r in rows] == [0, 1]
        assert all(len(r["usage_per_epoch"]) == 2 and len(r["dead_codes_per_epoch"]) == 2 for r in rows)
    assert report["environment"]["seeds"] == [0, 1]


def test_markdown_pictures_and_printed_references(quick_run):
    out, output = quick_run
    for picture in ("reconstructions.png", "usage.png", "histogram.png"):
        assert (out / picture).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = (out / "report.md").read_text()
    for name in CHOSEN:
        assert f"| {name} |" in text
    assert "references: mean_image" in output and "pca" in output and "kmeans" in output


def test_every_configuration_has_24_bits():
    assert len(CONFIGURATIONS) == 9
    assert CompareSettings().bits_per_image == 24.0
    with pytest.raises(ValueError, match=r"prod\(fsq_levels\) must equal codebook_size"):
        CompareSettings(fsq_levels=(8, 8, 8))


def test_unknown_configuration_is_refused():
    result = CliRunner().invoke(main, ["vq", "compare", "--quick", "--configs", "vq_bogus", "--out", "x"])
    assert result.exit_code == 2
    assert "unknown configuration(s) ['vq_bogus']" in result.output


@pytest.mark.parametrize("quantizer", ["fsq", "gumbel_softmax_st"])
def test_kmeans_dead_code_needs_a_codebook_quantizer(quantizer):
    # Without a codebook there are no codes to initialise by k-means or replace: refused at construction
    # (it used to fail with an AttributeError on None deep inside the jitted training).
    with pytest.raises(ValueError, match="'kmeans_dead_code' needs a quantizer with a codebook"):
        AutoencoderConfig("bad", quantizer, "kmeans_dead_code")


@pytest.mark.parametrize("quantizer", ["no_gradient", "vq_ste"])
def test_the_control_trains_the_codes_and_the_decoder_never_the_encoder(quantizer):
    # The negative control: the encoder gets no gradient at all (not from the reconstruction through the
    # quantiser, not from a commitment loss), while the codebook loss still fits the codes to its vectors and the
    # decoder still learns what each code means. The straight-through configuration, same model, does train it.
    config = next(
        c for c in CONFIGURATIONS if c.name == ("no_gradient" if quantizer == "no_gradient" else "vq_ste-plain")
    )
    assert (config.quantizer, config.codebook) == (quantizer, "plain")
    m = _model(config, CompareSettings(seeds=(0,), hidden=16))
    params, _ = _init(m, jax.random.key(0))
    x = jax.random.uniform(jax.random.key(1), (32, 64))
    grads = jax.jit(jax.grad(lambda p: _loss(m, p, x, None, None)[0]))(params)  # one compilation, not one per op

    def total(tree):
        return sum(float(jnp.abs(leaf).sum()) for leaf in jax.tree.leaves(tree))

    assert total(grads["codebook"]) > 0 and total(grads["decoder"]) > 0
    assert (total(grads["encoder"]) == 0) == (quantizer == "no_gradient")


def test_the_evaluation_part_is_test_or_validation():
    from stejax.vq._compare import _load

    with pytest.raises(ValueError, match="the evaluation part must be 'test' or 'val'; got 'train'"):
        _load(CompareSettings(seeds=(0,)), "train")
