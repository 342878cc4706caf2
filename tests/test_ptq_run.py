"""PTQ of the reference models and float runs: ``quantize_params``, ``stejax ptq``, the method in the manifest."""

from __future__ import annotations

import atexit
import functools
import json
import shutil
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from click.testing import CliRunner

from artifact_runs import run_dir, splits
from stejax.artifacts import ArtifactError, load_artifact, save_artifact
from stejax.artifacts._store import seal_manifest
from stejax.cli import main
from stejax.cli.ptq import _METHODS
from stejax.export import export_run, quantisation_method
from stejax.model import ConvConfig, MLPConfig, apply, init_params, preset
from stejax.model._spec import architecture
from stejax.ptq import (
    PTQ_METHODS,
    fold_channel_scales,
    form_config,
    gptq,
    layer_rows,
    quantize_params,
    read_ptq_record,
)
from stejax.train import load_run

CNN = ConvConfig(channels=(4, 8))
MLP = MLPConfig(hidden=(16, 12))


def _logits(params, x, model_config, qat_config):
    return jax.vmap(functools.partial(apply, model_config=model_config, qat_config=qat_config), in_axes=(None, 0))(
        params, x
    )


def _float_params(model_config, seed=0):
    return init_params(jax.random.key(seed), model_config, preset("float"))


def _features(n=64, seed=1):
    return jax.random.normal(jax.random.key(seed), (n, 64), jnp.float32)


def test_cli_methods_are_the_library_methods():
    assert _METHODS == PTQ_METHODS


@pytest.mark.parametrize(
    ("form", "hidden", "edge"),
    [
        ("w4a8", "weights 4-bit lsq (per channel), activations 8-bit lsq", "activations 8-bit lsq"),
        ("w2a32", "weights 2-bit lsq (per channel), activations float", "activations float"),
    ],
)
def test_form_config_names_weights_inputs_and_edges(form, hidden, edge):
    config = form_config(form)
    assert config.name == f"{form}_channel"
    assert config.layer(1, 3).describe() == hidden
    assert config.layer(0, 3).describe() == f"weights 8-bit lsq (per channel), {edge}"
    assert config.layer(2, 3) == config.layer(0, 3)


@pytest.mark.parametrize("form", ["w4", "w9a8", "w4a1", "W4A8", "w4a8 ", 48])
def test_form_config_refuses_other_forms(form):
    with pytest.raises(ValueError, match=r"form_config: a form is 'w<b>a<c>'.*got"):
        form_config(form)


@pytest.mark.parametrize("model_config", [CNN, MLP], ids=["cnn", "mlp"])
def test_layer_rows_times_the_flat_kernel_is_the_layer(model_config):
    params = _float_params(model_config)
    x = _features()
    u = x.reshape(-1, *architecture(model_config)[0].in_shape)
    for i, layer in enumerate(architecture(model_config)):
        w = params["layers"][i]["w"]
        got = layer_rows(layer, u) @ w.reshape(-1, layer.out_channels)
        if layer.kind == "conv":
            want = jax.lax.conv_general_dilated(
                u, w, (layer.stride,) * 2, "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"), precision="highest"
            )
        else:
            want = u.reshape(u.shape[0], -1) @ w
        np.testing.assert_allclose(got, want.reshape(-1, layer.out_channels), rtol=1e-5, atol=1e-5)
        b = params["layers"][i]["b"]
        u = jax.nn.relu(want + b.reshape((1,) * (want.ndim - 1) + (-1,)))


@pytest.mark.parametrize("model_config", [CNN, MLP], ids=["cnn", "mlp"])
def test_folding_channel_scales_keeps_the_float_function(model_config):
    params = _float_params(model_config)
    x = _features()
    want = _logits(params, x, model_config, preset("float"))
    folded = params
    for i, layer in enumerate(architecture(model_config)[:-1]):
        s = jnp.exp(jax.random.normal(jax.random.key(10 + i), (layer.out_channels,)))
        folded = fold_channel_scales(folded, s, model_config=model_config, index=i + 1)
    assert not np.allclose(folded["layers"][1]["w"], params["layers"][1]["w"])
    np.testing.assert_allclose(_logits(folded, x, model_config, preset("float")), want, rtol=1e-4, atol=1e-4)


def test_folding_refuses_the_first_layer_and_bad_scales():
    params = _float_params(CNN)
    with pytest.raises(ValueError, match=r"index must be a layer after the first, in \[1, 3\); got 0"):
        fold_channel_scales(params, jnp.ones(4), model_config=CNN, index=0)
    with pytest.raises(ValueError, match=r"layer 1 needs positive scales \(4,\).*layer 0; got float32 \(8,\)"):
        fold_channel_scales(params, jnp.ones(8), model_config=CNN, index=1)
    with pytest.raises(ValueError, match="positive scales"):
        fold_channel_scales(params, -jnp.ones(4), model_config=CNN, index=1)


@pytest.mark.parametrize("method", PTQ_METHODS)
def test_every_method_puts_the_kernels_on_the_steps_grid(method):
    out = quantize_params(_float_params(CNN), _features(), model_config=CNN, form="w4a8", method=method)
    for i, p in enumerate(out.params["layers"]):
        q_max = 7 if i == 1 else 127
        codes = np.asarray(p["w"]) / np.asarray(p["w_step"])
        np.testing.assert_allclose(codes, np.round(codes), atol=1e-4)
        assert np.abs(np.round(codes)).max() <= q_max
        assert float(p["a_step"]) > 0
    assert out.qat_config == form_config("w4a8")


def test_gptq_rounds_the_first_layer_on_its_patches():
    params, x = _float_params(CNN), _features()
    out = quantize_params(params, x, model_config=CNN, form="w4a8", method="gptq")
    layer = architecture(CNN)[0]
    rows = layer_rows(layer, x.reshape(-1, 8, 8, 1))
    want = gptq(params["layers"][0]["w"].reshape(-1, 4), rows, bits=8, name="layer 0")
    np.testing.assert_array_equal(out.params["layers"][0]["w"], want.kernel.reshape(layer.w_shape))
    np.testing.assert_array_equal(out.params["layers"][0]["w_step"], want.scales[0])


def test_awq_at_alpha_zero_alone_is_round_to_nearest():
    params, x = _float_params(CNN), _features()
    rtn = quantize_params(params, x, model_config=CNN, form="w4a8", method="rtn")
    awq = quantize_params(params, x, model_config=CNN, form="w4a8", method="awq", n_grid=1)
    for a, b in zip(awq.params["layers"], rtn.params["layers"], strict=True):
        for name in a:
            np.testing.assert_allclose(a[name], b[name], rtol=1e-6, err_msg=name)


def test_gptq_beats_round_to_nearest_on_the_output():
    params, x = _float_params(CNN), _features(256)
    want = _logits(params, x, CNN, preset("float"))
    error = {}
    for method in ("rtn", "gptq"):
        out = quantize_params(params, x, model_config=CNN, form="w4a32", method=method)
        error[method] = float(jnp.mean((_logits(out.params, x, CNN, out.qat_config) - want) ** 2))
    assert error["gptq"] < error["rtn"]


def test_quantize_params_refuses_bad_input():
    params, x = _float_params(CNN), _features()
    with pytest.raises(ValueError, match=r"method must be one of \['rtn', 'gptq', 'awq', 'smoothquant'\]; got 'hqq'"):
        quantize_params(params, x, model_config=CNN, form="w4a8", method="hqq")
    with pytest.raises(ValueError, match=r"smoothquant moves input outliers.*form 'w4a32' keeps the inputs in float"):
        quantize_params(params, x, model_config=CNN, form="w4a32", method="smoothquant")
    with pytest.raises(ValueError, match=r"calibration must be float32 \(N, 64\) with N >= 1; got float32 \(8, 63\)"):
        quantize_params(params, x[:8, :63], model_config=CNN, form="w4a8")
    w4a4 = init_params(jax.random.key(0), CNN, preset("w4a4"))
    with pytest.raises(ValueError, match=r"params: layers/0/\w_step is not a parameter"):
        quantize_params(w4a4, x, model_config=CNN, form="w4a8")


# ------------------------------------------------------------------------------------------ the command


def _ptq(tmp_path, *args, source=None):
    return CliRunner().invoke(main, ["ptq", str(source or run_dir("float")), *args], catch_exceptions=False)


def test_cli_writes_a_run_that_exports_with_its_method_in_the_manifest(tmp_path):
    out = tmp_path / "ptq"
    args = ["--form", "w4a8", "--method", "gptq", "--seed", "3", "--calibration-rows", "256"]
    result = _ptq(tmp_path, *args, "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "test accuracy" in result.output and f"wrote {out}" in result.output
    run = load_run(out)
    assert run.qat_config == form_config("w4a8") and run.config.preset == "w4a8_channel"
    record = read_ptq_record(out)
    assert record is not None
    assert record["method"] == "gptq" and record["form"] == "w4a8"
    assert record["calibration"]["seed"] == 3 and record["calibration"]["rows"] == 256
    assert record["options"] == {"damp": 0.01, "act_order": False}
    exported = export_run(out, splits=splits())
    assert exported.parity.passed
    assert exported.quantization["method"] == "gptq"
    assert exported.quantization["calibration"] == record["calibration"]
    artifact = save_artifact(exported, tmp_path / "artifact")
    assert artifact.method == "gptq"
    assert artifact.manifest["quantization"]["calibration"]["seed"] == 3
    verified = CliRunner().invoke(main, ["artifact", "verify", str(tmp_path / "artifact")])
    assert "quantised by: gptq, 256 train rows, seed 3" in verified.output, verified.output


@functools.cache
def _rtn_artifact() -> Path:
    """A w8a8 RTN run of the float MLP, exported and saved once per process; copy it before changing it."""
    root = Path(tempfile.mkdtemp(prefix="stejax-ptq-tests-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    result = _ptq(root, "--form", "w8a8", "--method", "rtn", "--seed", "0", "--out", str(root / "run"))
    assert result.exit_code == 0, result.output
    save_artifact(export_run(root / "run", splits=splits()), root / "artifact")
    return root


def _edited(tmp_path: Path, edit, *, reseal: bool) -> Path:
    root = tmp_path / "artifact"
    shutil.copytree(_rtn_artifact() / "artifact", root)
    manifest = json.loads((root / "manifest.json").read_text())
    edit(manifest["quantization"])
    (root / "manifest.json").write_text(json.dumps(seal_manifest(manifest) if reseal else manifest))
    return root


def test_the_method_is_covered_by_the_manifests_integrity(tmp_path):
    assert load_artifact(_rtn_artifact() / "artifact").method == "rtn"
    claim = _edited(tmp_path / "a", lambda q: q.update(method="qat"), reseal=False)  # training it never had
    with pytest.raises(ArtifactError, match="the manifest was edited after it was written"):
        load_artifact(claim)
    unknown = _edited(tmp_path / "b", lambda q: q.update(method="magic"), reseal=True)
    with pytest.raises(ArtifactError, match=r"quantization.method is 'magic'; expected one of \['float', 'qat'"):
        load_artifact(unknown)


def test_a_manifest_without_a_method_reads_as_qat_or_float(tmp_path):
    def older(quantization):
        for key in ("method", "calibration", "options"):
            quantization.pop(key)

    assert load_artifact(_edited(tmp_path, older, reseal=True)).method == "qat"
    assert quantisation_method({"preset": "float"}) == "float"
    assert quantisation_method({"preset": "w4a4"}) == "qat"


def test_the_calibration_draw_follows_the_seed(tmp_path):
    records = []
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        args = ["--form", "w4a32", "--method", "rtn", "--seed", str(seed), "--calibration-rows", "64"]
        assert _ptq(tmp_path, *args, "--out", str(tmp_path / name)).exit_code == 0
        records.append(read_ptq_record(tmp_path / name)["calibration"]["indices_sha256"])
    assert records[0] == records[1] != records[2]
    same = [load_run(tmp_path / n).params["layers"][1]["w"] for n in ("a", "b")]
    np.testing.assert_array_equal(*same)


def test_cli_refusals_name_what_was_expected_and_what_came(tmp_path):
    bad = _ptq(tmp_path, "--form", "w4a9", "--seed", "0", "--out", str(tmp_path / "x"))
    assert bad.exit_code == 2 and "Invalid value for '--form'" in bad.output and "got 'w4a9'" in bad.output
    source = _rtn_artifact() / "run"
    quantised = _ptq(tmp_path, "--form", "w4a8", "--seed", "0", "--out", str(tmp_path / "x"), source=source)
    assert quantised.exit_code == 2
    assert (
        "PTQ starts from a float run" in quantised.output
        and "is a w8a8_channel run, whose layer 0 is quantised" in (quantised.output.replace("\n", " "))
    )
    rows = _ptq(tmp_path, "--form", "w4a8", "--seed", "0", "--calibration-rows", "99999", "--out", str(tmp_path / "x"))
    assert rows.exit_code == 2 and "calibration_rows=99999 is more than the" in rows.output
    sq = _ptq(tmp_path, "--form", "w4a32", "--method", "smoothquant", "--seed", "0", "--out", str(tmp_path / "x"))
    assert sq.exit_code == 2 and "keeps the inputs in float" in sq.output
    (tmp_path / "exists").mkdir()
    exists = _ptq(tmp_path, "--form", "w4a8", "--seed", "0", "--out", str(tmp_path / "exists"))
    assert exists.exit_code == 2 and "exists; a run directory is never overwritten" in exists.output
    missing = CliRunner().invoke(main, ["ptq", str(run_dir("float")), "--form", "w4a8", "--out", str(tmp_path / "y")])
    assert missing.exit_code == 2 and "Missing option '--seed'" in missing.output
    assert not (tmp_path / "x").exists()
    shutil.rmtree(tmp_path / "exists")
