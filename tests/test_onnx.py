"""stejax.onnx: digits artifacts and rules-quantised NNX models in ONNX Runtime, against stejax's own forward."""

from __future__ import annotations

import dataclasses
import functools
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import pytest
from flax import nnx
from safetensors.numpy import load_file

import artifact_runs
import stejax.model
from artifact_runs import pristine
from stejax.artifacts import ArtifactError
from stejax.data import Normalizer
from stejax.export import export_model
from stejax.flax import Quant, Rule, calibrate, quantize_model
from stejax.onnx import (
    INTEGER_OPS,
    OnnxExportError,
    export_nnx,
    export_onnx,
    integer_op_count,
    open_runtime,
    optimized_ops,
)
from stejax.onnx._export import write_digits

# Products ONNX Runtime must run on integer kernels; float MatMul/Conv/Gemm must be gone from them.
FLOAT_PRODUCTS = ("MatMul", "Gemm", "Conv", "FusedConv", "FusedMatMul", "FusedGemm")


def _logits(art, x):
    return np.asarray(art.model.apply(art.model.weights, x))


def _integer_ops_only(path, model):
    ops = optimized_ops(path)
    assert integer_op_count(ops) == sum(layer.integer for layer in model.layers) == len(model.layers), ops
    assert not any(ops[op] for op in FLOAT_PRODUCTS), ops


@functools.cache
def _digits_cnn(preset: str):
    """The digits CNN of ``preset``, freshly initialised and exported, with its logits on the test split."""
    splits = artifact_runs.splits()
    model_config = dataclasses.replace(artifact_runs.TINY_CNN, preset=preset).model_config(splits.train)
    qc = stejax.model.preset(preset)
    params = stejax.model.init_params(jax.random.key(0), model_config, qc)
    model = export_model(params, model_config, qc, Normalizer.fit(splits.train.x))
    x = np.asarray(splits.test.x, np.float32)
    return model, x, np.asarray(model.apply(model.weights, x))


@pytest.mark.parametrize("preset", ["w8a8", "w4a4", "w1a1"])
def test_digits_cnn_parity_and_integer_kernels(tmp_path, preset):
    # Parity does not depend on training: freshly initialised weights, exported and checked bit for bit.
    model, x, want = _digits_cnn(preset)
    path = write_digits(model, tmp_path / "cnn.onnx", float_model=False, metadata={}, conv="integer")
    got = open_runtime(path).run(None, {"features": x})[0]
    assert (got.argmax(1) == want.argmax(1)).all()
    assert np.abs(got - want).max() == 0.0
    _integer_ops_only(path, model)


def test_digits_cnn_qlinear_convolutions(tmp_path):
    # conv="qlinear": ORT's QLinearConv (int32 bias codes, ORT's requantisation). These weights have a zero
    # bias (exact as int32 codes) and hit no rounding tie, so the logits are equal; in general a next-layer
    # code can differ by one near a tie, and parity is stated as argmax agreement.
    model, x, want = _digits_cnn("w8a8")
    path = write_digits(model, tmp_path / "cnn.onnx", float_model=False, metadata={}, conv="qlinear")
    got = open_runtime(path).run(None, {"features": x})[0]
    assert (got.argmax(1) == want.argmax(1)).all()
    ops = optimized_ops(path)
    assert ops["QLinearConv"] == 2 and ops["MatMulIntegerToFloat"] == 1, ops
    assert not any(ops[op] for op in FLOAT_PRODUCTS), ops
    with pytest.raises(ValueError, match="conv must be one of"):
        write_digits(model, tmp_path / "x.onnx", float_model=False, metadata={}, conv="fast")


@pytest.mark.parametrize("preset", ["w8a8", "w4a4"])
def test_the_default_cnn_export_runs_qlinearconv_within_its_stated_tolerance(tmp_path, preset):
    # A trained CNN artifact: by default each convolution the next layer quantises to 8 bits is ORT's
    # QLinearConv (its fast kernel); the export checked the logits against stejax's integer forward first.
    from stejax.onnx import LOGIT_TOLERANCE

    art = pristine(preset, "cnn", regression=False)
    out = export_onnx(art.path, tmp_path / "model.onnx")
    assert out.conv == "qlinear" and out.qlinear_convs, out
    ops = optimized_ops(out.path)
    assert ops["QLinearConv"] == len(out.qlinear_convs) and not any(ops[op] for op in FLOAT_PRODUCTS), ops
    parity = out.parity
    assert parity is not None and parity.passed and parity.examples == len(art.evidence.inputs)
    assert parity.tolerance == pytest.approx(LOGIT_TOLERANCE * parity.max_abs_logit)
    # The check is real: recomputed here from the file ONNX Runtime runs.
    x = np.asarray(art.evidence.inputs)
    got, want = open_runtime(out.path).run(None, {"features": x})[0], _logits(art, x)
    assert np.abs(got - want).max() == pytest.approx(parity.max_abs_diff)
    assert np.abs(got - want).max() <= parity.tolerance
    top2 = np.sort(want, axis=1)[:, -2:]
    differ = got.argmax(1) != want.argmax(1)
    assert (top2[differ, 1] - top2[differ, 0] <= 2 * parity.max_abs_diff).all()  # only near ties
    assert parity.agree == int((~differ).sum()) and parity.near_ties == int(differ.sum())
    props = {p.key: p.value for p in onnx.load(str(out.path)).metadata_props}
    assert props["stejax.conv"] == "qlinear" and props["stejax.parity"] == parity.summary()


@pytest.mark.parametrize("preset", ["w8a8", "w4a4", "w2a2", "w1a1", "w4a4_no_ste"])
def test_every_cnn_preset_runs_each_convolution_as_qlinearconv(tmp_path, preset):
    # The default graph: every convolution is ORT's QLinearConv (whatever grid the next layer reads: 8, 4 or
    # 2 bits, or sign), the dense layer MatMulIntegerToFloat; nothing runs as a float product, no ConvInteger.
    from stejax.onnx import LOGIT_TOLERANCE
    from stejax.onnx._digits import qlinear_convs

    model, x, want = _digits_cnn(preset)
    convs = [i for i, layer in enumerate(model.layers) if layer.kind == "conv"]
    assert qlinear_convs(model) == tuple(convs)
    path = write_digits(model, tmp_path / "cnn.onnx", float_model=False, metadata={}, conv="qlinear")
    ops = optimized_ops(path)
    assert ops["QLinearConv"] == len(convs) and ops["MatMulIntegerToFloat"] == 1, ops
    assert ops["ConvInteger"] == 0 and not any(ops[op] for op in FLOAT_PRODUCTS), ops
    assert ops["DequantizeLinear"] == 0, ops  # every QDQ pair was folded into an integer kernel
    # Parity within the tolerance the export checks (these zero biases are exact int32 codes; a trained
    # artifact's are not: see the next tests), a differing class only at a near tie.
    got = open_runtime(path).run(None, {"features": x})[0]
    diff = np.abs(got - want).max()
    assert diff <= LOGIT_TOLERANCE * np.abs(want).max(), (diff, np.abs(want).max())
    top2 = np.sort(want, axis=1)[:, -2:]
    differ = got.argmax(1) != want.argmax(1)
    assert (top2[differ, 1] - top2[differ, 0] <= 2 * diff).all()


def test_qlinearconv_writes_sign_codes_with_plus_one_at_zero(tmp_path):
    # w1a1: the first convolution's output becomes the next layer's sign codes inside ORT's requantisation.
    # Inputs at the normaliser's mean standardise to 0, so with zero biases the first convolution's output is
    # exactly 0 everywhere: stejax's sign is +1 there, and so must the graph's be (bit for bit, no tie).
    model, x, _ = _digits_cnn("w1a1")
    mean = np.asarray(model.weights["normalizer"]["mean"], np.float32)
    at_zero = np.concatenate([np.broadcast_to(mean, (4, mean.size)), x[:60]]).astype(np.float32)
    path = write_digits(model, tmp_path / "cnn.onnx", float_model=False, metadata={}, conv="qlinear")
    got = open_runtime(path).run(None, {"features": at_zero})[0]
    np.testing.assert_array_equal(got, np.asarray(model.apply(model.weights, at_zero)))


@pytest.mark.parametrize("preset", ["w4a4", "w1a1"])
def test_a_trained_low_bit_cnn_exports_every_convolution_as_qlinearconv(tmp_path, preset):
    # A trained 4-bit or binary CNN artifact, exported with the defaults: all its convolutions are QLinearConv,
    # the export's own parity check passed.
    art = pristine(preset, "cnn", regression=False)
    out = export_onnx(art.path, tmp_path / "model.onnx")
    convs = tuple(i for i, layer in enumerate(art.model.layers) if layer.kind == "conv")
    assert out.qlinear_convs == convs
    ops = optimized_ops(out.path)
    assert ops["QLinearConv"] == len(convs) and ops["ConvInteger"] == 0, ops
    assert not any(ops[op] for op in FLOAT_PRODUCTS), ops
    assert out.parity is not None and out.parity.passed and out.parity.tolerance > 0


def test_time_it_measures_the_file_against_its_float_graph(tmp_path):
    art = pristine("w8a8", "cnn", regression=False)
    out = export_onnx(art.path, tmp_path / "model.onnx", time_it=True)
    speed = out.speed
    assert speed is not None and speed.batch == len(art.evidence.inputs) and speed.threads == 2
    assert speed.quantised_ms > 0 and speed.float_ms > 0
    assert speed.float_over_quantised == speed.float_ms / speed.quantised_ms
    verdict = "faster than float" if speed.float_over_quantised >= 1 else "slower than float"
    assert speed.summary().endswith(verdict)
    assert export_onnx(art.path, tmp_path / "untimed.onnx").speed is None  # only when asked


def test_conv_integer_keeps_the_bit_exact_graph(tmp_path):
    art = pristine("w8a8", "cnn", regression=False)
    out = export_onnx(art.path, tmp_path / "model.onnx", conv="integer")
    assert out.qlinear_convs == () and out.parity is not None
    assert out.parity.tolerance == 0 and out.parity.max_abs_diff == 0 and out.parity.agree == out.parity.examples
    assert "bit for bit" in out.parity.summary()
    ops = optimized_ops(out.path)
    assert ops["ConvInteger"] == 2 and ops["QLinearConv"] == 0, ops
    x = np.asarray(art.evidence.inputs)
    np.testing.assert_array_equal(open_runtime(out.path).run(None, {"features": x})[0], _logits(art, x))
    with pytest.raises(ValueError, match=r"conv must be one of \['qlinear', 'integer'\]; got 'fast'"):
        export_onnx(art.path, tmp_path / "x.onnx", conv="fast")


def test_an_export_outside_its_tolerance_is_not_written(tmp_path, monkeypatch):
    import stejax.onnx._export

    art = pristine("w8a8", "cnn", regression=False)
    monkeypatch.setattr(stejax.onnx._export, "LOGIT_TOLERANCE", 0.0)  # a bound no QLinearConv graph keeps
    with pytest.raises(OnnxExportError, match=r"model.onnx: not written; parity with stejax's integer forward"):
        export_onnx(art.path, tmp_path / "model.onnx")
    assert list(tmp_path.iterdir()) == []  # no file, no hidden partial one
    with pytest.raises(OnnxExportError, match=r"conv='integer' \(--conv integer\) writes the bit-exact graph"):
        export_onnx(art.path, tmp_path / "model.onnx")


@pytest.mark.parametrize("preset", ["w4a4", "w2a2"])
def test_digits_parity_and_integer_kernels(tmp_path, preset):
    art, model = pristine(preset, "mlp"), "mlp"
    out = export_onnx(art.path, tmp_path / "model.onnx")
    run = open_runtime(out.path)
    # The test split (the artifact's parity evidence): bit for bit. Both run the same int32 accumulators
    # and the same float32 rescale (acc * (s_a * s_w) + b) and bias add.
    x = np.asarray(art.evidence.inputs)
    got, want = run.run(None, {"features": x})[0], _logits(art, x)
    assert (got.argmax(1) == want.argmax(1)).all()
    assert np.abs(got - want).max() == 0.0
    if model == "mlp":
        cases = load_file(str(art.path / "regression" / "regression.safetensors"))
        for name, xs in cases.items():
            if not name.endswith("/inputs") or name.startswith("invalid"):
                continue
            got, want = run.run(None, {"features": xs})[0], _logits(art, xs)
            assert (got.argmax(1) == want.argmax(1)).all(), name
            # Off rounding ties: bit for bit. The boundary case puts first-layer inputs exactly on ties
            # u = (k + 1/2) s: QuantizeLinear divides (u / s = k + 1/2, rounded to even), stejax multiplies by
            # fl(1/s) (an ulp off the tie, rounded the other way), so a first-layer code may differ by one
            # there; each such code moves a first-layer output by s_a * s_w * |q_w|. Stated bound: 0.5.
            assert np.abs(got - want).max() <= (0.5 if name.startswith("boundary") else 0.0), name
    _integer_ops_only(out.path, art.model)
    props = {p.key: p.value for p in onnx.load(str(out.path)).metadata_props}
    assert props["stejax.source_artifact"] == art.id
    assert props["stejax.source_weights_sha256"] == art.manifest["files"]["weights.safetensors"]["sha256"]


def test_digits_float_file_and_int4_codes(tmp_path):
    art = pristine("w2a2", "mlp")
    q = export_onnx(art.path, tmp_path / "q.onnx")
    f = export_onnx(art.path, tmp_path / "f.onnx", float_model=True)
    types = {t.name: t.data_type for t in onnx.load(str(q.path)).graph.initializer}
    assert types["layers_1_w_int4"] == onnx.TensorProto.INT4 and types["layers_0_w_int8"] == onnx.TensorProto.INT8
    assert all(t.data_type != onnx.TensorProto.INT8 for t in onnx.load(str(f.path)).graph.initializer)
    x = np.asarray(art.evidence.inputs)
    # The float file has the dequantised weights and float activations: close to, not equal to, the QAT model.
    logits = open_runtime(f.path).run(None, {"features": x})[0]
    assert (logits.argmax(1) == _logits(art, x).argmax(1)).mean() > 0.8
    with pytest.raises(FileExistsError, match="never overwritten"):
        export_onnx(art.path, q.path)


def test_tampered_artifact_is_refused(tmp_path):
    art = shutil.copytree(pristine("w4a4", "mlp").path, tmp_path / "art")
    weights = art / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="sha256"):
        export_onnx(art, tmp_path / "m.onnx")
    assert not (tmp_path / "m.onnx").exists()


class EinsumMLP(nnx.Module):
    """An unmodified user model: a Linear, an einsum in its own code, a Linear."""

    def __init__(self, width: int, *, rngs: nnx.Rngs):
        self.fc1 = nnx.Linear(64, width, rngs=rngs)
        self.mix = nnx.Param(jax.random.normal(rngs.params(), (width, width)) / np.sqrt(width))
        self.head = nnx.Linear(width, 10, rngs=rngs)

    def __call__(self, x):
        h = jax.nn.relu(self.fc1(x))
        h = jax.nn.relu(jnp.einsum("bi,io->bo", h, self.mix[...]))
        return self.head(h)


RULES = [
    Rule(r"fc1|head", kinds=("linear",), weights=Quant("lsq", bits=8, axis=-1), inputs=Quant("fake_quant", bits=8)),
    Rule(r"dot0", weights=Quant("lsq", bits=4), inputs=Quant("pact", bits=8)),
]


def _rules_model(width=128, rules=RULES):
    x = jax.random.normal(jax.random.key(1), (64, 64))
    model = EinsumMLP(width, rngs=nnx.Rngs(0))
    q = quantize_model(model, rules, x)
    calibrate(q, [x])
    return model, q, x


def test_rules_model_parity_integer_kernels_and_size(tmp_path):
    model, q, x = _rules_model()
    path = export_nnx(q, x, tmp_path / "q.onnx")
    float_path = export_nnx(q, x, tmp_path / "f.onnx", float_model=True)
    got = open_runtime(path).run(None, {"input": np.asarray(x)})[0]
    want = np.asarray(q(x))
    assert (got.argmax(1) == want.argmax(1)).all()
    # The same codes, summed in another order: ORT sums int32 exactly, the fake-quantised model sums
    # float32 products; the bound is float32 summation error over 128 terms of the logits' size.
    assert np.abs(got - want).max() <= 1e-5 * max(1.0, float(np.abs(want).max()))
    ops = optimized_ops(path)
    assert ops["MatMulIntegerToFloat"] == 3 and not any(ops[op] for op in FLOAT_PRODUCTS), ops
    assert set(INTEGER_OPS) >= {"MatMulIntegerToFloat", "QLinearConv", "ConvInteger"}
    assert path.stat().st_size <= 0.3 * float_path.stat().st_size
    props = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    assert len(props["stejax.source_state_sha256"]) == 64 and "dot0:w4a8" in props["stejax.sites"]
    float_out = open_runtime(float_path).run(None, {"input": np.asarray(x[:3])})[0]
    np.testing.assert_allclose(float_out, np.asarray(model(x[:3])), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("rule", "match"),
    [
        (Rule("fc1", weights=Quant("stochastic_round")), r"fc1 \(weights\) \(stochastic_round\): stochastic"),
        (Rule("fc1", inputs=Quant(lambda v: v * 2)), r"fc1 \(inputs\) \(<lambda>\): a custom callable"),
        (Rule("fc1", inputs=Quant("lsq_plus", bits=8)), r"fc1 \(inputs\) \(lsq_plus\): LSQ\+'s learned offset"),
        (Rule("fc1", inputs=Quant("fake_quant", bits=8, scale="dynamic")), r"dynamic input scale"),
    ],
)
def test_unfaithful_quantisers_are_refused_by_name(tmp_path, rule, match):
    x = jax.random.normal(jax.random.key(1), (8, 64))
    rngs = nnx.Rngs(0, quant=1)
    q = quantize_model(EinsumMLP(16, rngs=nnx.Rngs(0)), [rule], x, rngs=rngs)
    with pytest.raises(OnnxExportError, match=match):
        export_nnx(q, x, tmp_path / "m.onnx")
    assert not (tmp_path / "m.onnx").exists()


def test_rules_cnn_runs_convolutions_on_integer_kernels(tmp_path):
    class CNN(nnx.Module):
        def __init__(self, rngs):
            self.c1 = nnx.Conv(1, 8, (3, 3), rngs=rngs)
            self.c2 = nnx.Conv(8, 16, (3, 3), strides=2, rngs=rngs)
            self.fc = nnx.Linear(16 * 4 * 4, 10, rngs=rngs)

        def __call__(self, x):
            h = jax.nn.relu(self.c2(jax.nn.relu(self.c1(x))))
            return self.fc(h.reshape(h.shape[0], -1))

    x = jax.random.normal(jax.random.key(1), (16, 8, 8, 1))
    rules = [Rule(weights=Quant("lsq", bits=8, axis=-1), inputs=Quant("fake_quant", bits=8))]
    q = quantize_model(CNN(nnx.Rngs(0)), rules, x)
    calibrate(q, [x])
    path = export_nnx(q, x, tmp_path / "cnn.onnx")
    got, want = open_runtime(path).run(None, {"input": np.asarray(x)})[0], np.asarray(q(x))
    assert (got.argmax(1) == want.argmax(1)).all()
    assert np.abs(got - want).max() <= 1e-5 * max(1.0, float(np.abs(want).max()))
    ops = optimized_ops(path)
    assert ops["ConvInteger"] == 2 and ops["MatMulIntegerToFloat"] == 1, ops
    assert not any(ops[op] for op in FLOAT_PRODUCTS), ops


def test_unsupported_layer_is_refused_by_name(tmp_path):
    class Upsample(nnx.Module):
        def __init__(self, rngs):
            self.up = nnx.ConvTranspose(1, 4, (3, 3), strides=(2, 2), rngs=rngs)

        def __call__(self, x):
            return self.up(x).reshape(x.shape[0], -1)

    x = jnp.ones((2, 8, 8, 1))
    q = quantize_model(Upsample(nnx.Rngs(0)), [Rule(weights=Quant("lsq", bits=8))], x)
    with pytest.raises(OnnxExportError, match=r"conv_general_dilated at .*input dilation"):
        export_nnx(q, x, tmp_path / "m.onnx")
    assert not (tmp_path / "m.onnx").exists()


def test_cli_export_format_onnx(tmp_path):
    from click.testing import CliRunner

    from stejax.cli import main

    art = pristine("w4a4", "mlp")
    out = tmp_path / "model.onnx"
    result = CliRunner().invoke(main, ["export", "--format", "onnx", str(art.path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())  # the console wraps long lines
    assert "3 integer products" in text and art.id[:12] in text
    assert f"parity with stejax's integer forward on {len(art.evidence.inputs)} test inputs" in text
    assert "bit for bit" in text and "QLinearConv" not in text  # an MLP: no convolution
    again = CliRunner().invoke(main, ["export", "--format", "onnx", str(art.path), "--out", str(out)])
    assert again.exit_code == 1 and "never overwritten" in again.output
    wrong = CliRunner().invoke(main, ["export", "--float", str(art.path), "--out", str(tmp_path / "a")])
    assert wrong.exit_code == 2 and "go with --format onnx" in wrong.output
    wrong = CliRunner().invoke(main, ["export", "--conv", "integer", str(art.path), "--out", str(tmp_path / "a")])
    assert wrong.exit_code == 2 and "go with --format onnx" in wrong.output


def test_the_export_help_states_the_checked_tolerance():
    from click.testing import CliRunner

    from stejax.cli import main
    from stejax.onnx import LOGIT_TOLERANCE

    text = " ".join(CliRunner().invoke(main, ["export", "--help"]).output.split())
    assert f"within {LOGIT_TOLERANCE:.0%} of the largest |logit|" in text and "qlinear (default)" in text


def test_cli_export_cnn_says_what_its_default_graph_trades(tmp_path):
    from click.testing import CliRunner

    from stejax.cli import main

    art = pristine("w8a8", "cnn", regression=False)
    result = CliRunner().invoke(main, ["export", "--format", "onnx", str(art.path), "--out", str(tmp_path / "m.onnx")])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "QLinearConv x2" in text and "tolerance 5% of the largest |logit|" in text
    assert "2 convolution(s) run as ORT's QLinearConv" in text and "--conv integer writes ConvInteger" in text
    # the speed on this machine, against the float32 graph, whichever is faster
    assert f"ONNX Runtime on this machine (2 threads, a batch of {len(art.evidence.inputs)}):" in text
    assert "ms for this file" in text and "ms for the float32 graph" in text and "float's throughput" in text
    exact = CliRunner().invoke(
        main, ["export", "--format", "onnx", "--conv", "integer", str(art.path), "--out", str(tmp_path / "e.onnx")]
    )
    assert exact.exit_code == 0 and "ConvInteger x2" in exact.output and "bit for bit" in exact.output


def test_trusted_keys_export_only_signed_artifacts(tmp_path):
    from stejax.artifacts import SignatureError, keygen, sign_artifact

    private, public = keygen(tmp_path / "keys")
    art = shutil.copytree(pristine("w4a4", "mlp", regression=False).path, tmp_path / "art")
    with pytest.raises(SignatureError):
        export_onnx(art, tmp_path / "unsigned.onnx", trusted_keys=[public])
    sign_artifact(art, private)
    out = export_onnx(art, tmp_path / "signed.onnx", trusted_keys=[public])
    assert out.path.exists() and not (tmp_path / "unsigned.onnx").exists()


def test_a_run_is_exported_through_a_verified_artifact(tmp_path):
    art = pristine("w2a2", "mlp")
    out = export_onnx(artifact_runs.run_dir("w2a2"), tmp_path / "run.onnx")
    assert len(out.source_id) == 64 and out.metadata["stejax.source_artifact"] == out.source_id
    x = np.asarray(art.evidence.inputs)
    np.testing.assert_array_equal(open_runtime(out.path).run(None, {"features": x})[0], _logits(art, x))
    with pytest.raises(ValueError, match="a run directory carries no signature"):
        export_onnx(artifact_runs.run_dir("w2a2"), tmp_path / "signed.onnx", trusted_keys=[tmp_path / "k.pem"])


def test_open_runtime_can_keep_its_threads_from_spinning(tmp_path):
    # Timing several runtimes in one process (the export's speed check, the onnx bench): a pool left spinning
    # after its call takes the cores the next session runs on, so those runtimes sleep between calls.
    model, _, _ = _digits_cnn("w8a8")
    path = write_digits(model, tmp_path / "cnn.onnx", float_model=False, metadata={}, conv="qlinear")
    key = "session.intra_op.allow_spinning"
    quiet = open_runtime(path, allow_spinning=False).get_session_options()
    assert quiet.get_session_config_entry(key) == "0"
    with pytest.raises(RuntimeError, match="does not have configuration with key"):  # ORT's default: spin
        open_runtime(path).get_session_options().get_session_config_entry(key)
