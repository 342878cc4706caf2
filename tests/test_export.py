"""Integer export (stejax.export): packing, the integer inference path, parity and the size report.

The exported digits models at 8, 4, 2 and 1 bits must predict the fake-quantised
model's class for every test example, with every logit within the stated bound,
and store their weights in exactly 1/4, 1/8, 1/16 and 1/32 of the float32
bytes, plus float32 scales.
"""

from __future__ import annotations

import json
import math
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from artifact_runs import exported, run_dir, splits
from stejax.data import Normalizer
from stejax.export import (
    CONTAINERS,
    ParityError,
    check_parity_set,
    export_model,
    export_run,
    pack_codes,
    parity,
    unpack_codes,
)
from stejax.export import _export as export_module
from stejax.export._parity import _tie
from stejax.model import ConvConfig, init_params, preset
from stejax.train import load_run

# bits per stored weight for the layer formats of the presets
FIELD_BITS = {"int8": 8, "int4x2": 4, "int2x4": 2, "bin1x8": 1, "float32": 32}


# ------------------------------------------------------------------------------ packing


def _golden_unpack(stored: np.ndarray, container: str, n: int) -> np.ndarray:
    """An independent reading of the documented layout, one field at a time."""
    field = CONTAINERS[container][0]
    out = []
    for byte in stored.astype(np.int64).tolist():
        for j in range(8 // field):
            bits = (byte >> (field * j)) & ((1 << field) - 1)
            if container == "bin1x8":
                out.append(1 if bits else -1)
            else:
                out.append(bits - (1 << field) if bits >= 1 << (field - 1) else bits)
    return np.array(out[:n], np.int64)


@pytest.mark.parametrize("container", ["bin1x8", "int2x4", "int4x2", "int8", "int16"])
@pytest.mark.parametrize("n", [1, 257])
def test_pack_unpack_round_trip(container, n):
    field = CONTAINERS[container][0]
    rng = np.random.default_rng(n)
    if container == "bin1x8":
        codes = rng.choice([-1, 1], n)
    else:
        lo, hi = -(2 ** (field - 1)), 2 ** (field - 1) - 1
        codes = rng.integers(lo, hi + 1, n)
        codes[: min(n, 2)] = [lo, hi][: min(n, 2)]  # the extremes
    stored = pack_codes(codes, container)
    if CONTAINERS[container][2]:
        assert stored.dtype == np.uint8 and stored.shape == (math.ceil(n * field / 8),)
        np.testing.assert_array_equal(_golden_unpack(stored, container, n), codes)
    shape = (n,)
    for fn in (unpack_codes, jax.jit(unpack_codes, static_argnums=(1, 2))):
        got = np.asarray(fn(jnp.asarray(stored), container, shape))
        np.testing.assert_array_equal(got.astype(np.int64), codes)


def test_pack_golden_bytes():
    # int4: -8 -> 0x8 (low nibble), 7 -> 0x7 (high): 0x78; int2: -2, 1, 0, -1 -> 10, 01, 00, 11 = 0b11000110
    assert pack_codes(np.array([-8, 7]), "int4x2").tolist() == [0x78]
    assert pack_codes(np.array([-2, 1, 0, -1]), "int2x4").tolist() == [0b11_00_01_10]
    assert pack_codes(np.array([1, -1, -1, -1, -1, -1, -1, 1]), "bin1x8").tolist() == [0b1000_0001]


@pytest.mark.parametrize(
    ("codes", "container", "message"),
    [
        ([0, 8], "int4x2", r"int4x2 holds codes in \[-8, 7\]; got 8 at flat index 1"),
        ([-3], "int2x4", r"int2x4 holds codes in \[-2, 1\]; got -3 at flat index 0"),
        ([1, 0], "bin1x8", r"bin1x8 holds codes -1 or \+1; got 0 at flat index 1"),
    ],
)
def test_pack_codes_refuses_codes_that_do_not_fit(codes, container, message):
    with pytest.raises(ValueError, match=message):
        pack_codes(np.array(codes), container)


# ------------------------------------------------------------------------------ export at 8, 4, 2, 1 bits


@pytest.mark.parametrize(("preset", "hidden_bits"), [("w8a8", 8), ("w4a4", 4), ("w2a2", 2), ("w1a1", 1)])
def test_digits_export_parity_and_size(preset, hidden_bits):
    result = exported(preset)
    report = result.parity
    n = len(splits().test)
    assert report.n_examples == n
    assert report.same_class == n, report.summary()  # 100% prediction parity
    assert report.bounded == report.within_tolerance == n, report.summary()
    assert report.drift_violations == 0 and report.flips == ()
    assert report.max_bound_ratio <= 1.0
    assert all(layer.weights_bit_exact for layer in report.layers)
    assert report.passed
    # Every layer's inputs are quantised here: the int8 x int8 -> int32 path, codes equal.
    assert all(layer.input_codes > 0 and layer.code_mismatches == 0 for layer in report.layers)
    assert [layer.integer for layer in result.model.layers] == [True, True, True]

    size = result.size
    expected_bits = [8, hidden_bits, 8]  # first and last layers stay at 8 bits in the presets
    for layer, bits in zip(size.layers, expected_bits):
        assert layer.bits == bits
        assert layer.weight_bytes * 32 == layer.float32_bytes * bits  # 1/4, 1/8, 1/16, 1/32 exactly
        assert layer.weight_bytes == layer.count * bits // 8
    hidden = size.layers[1]
    assert hidden.ratio == {8: 1 / 4, 4: 1 / 8, 2: 1 / 16, 1: 1 / 32}[hidden_bits]
    # Plus the scales: one float32 step per weight tensor and input, or one scale per channel (binary).
    for layer, spec in zip(size.layers, result.model.layers):
        channels = layer.weight_shape[-1] if spec.weights.granularity == "channel" else 1
        assert layer.scale_bytes == 4 * channels
        assert layer.step_bytes == (0 if spec.inputs.method == "sign" else 4)
        assert layer.bias_bytes == 4 * layer.weight_shape[-1]
    tensors = size.weight_bytes + size.scale_bytes + sum(r.bias_bytes for r in size.layers) + size.normalizer_bytes
    assert size.predicted_file_bytes == size.header_bytes + tensors
    assert size.predicted_file_bytes == size.actual_file_bytes == len(result.weights_file)


def test_cnn_export_runs_integer_convolutions_with_parity():
    # The convolutional digits model, initialised with data-calibrated LSQ steps (no
    # training: the convolutions' arithmetic is what is under test).
    test = splits().test
    mc, qc = ConvConfig(channels=(4, 8)), preset("w4a4")
    normalizer = Normalizer.fit(splits().train.x, per_feature=False)
    calibration = normalizer.apply(splits().train.x[:256])
    params = init_params(jax.random.key(0), mc, qc, calibration_batch=calibration)
    model = export_model(params, mc, qc, normalizer)
    report, _ = parity(model, params, mc, qc, normalizer, test.x, test.y)
    assert report.passed, report.summary()
    assert report.same_class == len(test) and report.within_tolerance == len(test)
    assert [layer.kind for layer in model.layers] == ["conv", "conv", "dense"]
    # Layers 1 and 2 take unsigned inputs after a ReLU: 4-bit codes 0..15 directly, 8-bit through the zero point.
    assert model.layers[1].inputs.levels == (0, 15) and model.layers[2].inputs.levels == (0, 255)
    assert all(layer.integer for layer in model.layers)
    assert all(layer.input_codes > 0 and layer.code_mismatches == 0 for layer in report.layers)
    assert model.weights["layers"][1]["w"].shape == (3 * 3 * 4 * 8 // 2,)  # int4, two per byte


def _int_dots(jaxpr) -> list[tuple[str, str, str]]:
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in ("dot_general", "conv_general_dilated"):
            found.append((eqn.primitive.name, str(eqn.invars[0].aval.dtype), str(eqn.outvars[0].aval.dtype)))
        for sub in jax.core.subjaxprs(eqn) if hasattr(jax.core, "subjaxprs") else ():
            found += _int_dots(sub)
    return found


def test_integer_layers_run_int8_products_into_int32():
    model = exported("w8a8").model
    x = jnp.asarray(splits().test.x[:4])
    jaxpr = jax.make_jaxpr(model.apply)(model.weights, x).jaxpr
    products = _int_dots(jaxpr)
    # One int8 product per layer, plus the zero point's correction for the unsigned 8-bit inputs of layers 1, 2.
    assert [p for p in products if p[1] != "int8"] == []
    assert all(p[2] == "int32" for p in products)
    assert len(products) == 3 + 2


def test_integer_path_matches_an_independent_numpy_model():
    result = exported("w4a4")
    model, weights = result.model, result.model.weights
    x = splits().test.x[:64]
    got = np.asarray(jax.jit(model.apply)(weights, jnp.asarray(x)))
    # NumPy: standardise, then per layer: codes, an int64 product, one scale, the bias.
    h = (x - np.asarray(weights["normalizer"]["mean"])) / np.asarray(weights["normalizer"]["std"])
    for i, spec in enumerate(model.layers):
        p = {k: np.asarray(v) for k, v in weights["layers"][i].items()}
        u = np.maximum(h, 0) if spec.relu else h
        lo, hi = spec.inputs.levels
        v = u * (np.float32(1) / p["a_step"])
        codes = np.round(np.clip(v, lo, hi)).astype(np.int64)
        n = math.prod(spec.w_shape)
        w_codes = (
            p["w"].astype(np.int64)
            if spec.weights.container == "int8"
            else np.asarray(unpack_codes(jnp.asarray(p["w"]), spec.weights.container, (n,))).astype(np.int64)
        ).reshape(spec.w_shape)
        acc = codes @ w_codes
        h = acc.astype(np.float32) * (p["a_step"] * p["w_scale"]) + p["b"]
    np.testing.assert_allclose(got, h, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(got.argmax(axis=1), h.argmax(axis=1))


def test_bit_exact_where_the_math_allows():
    # w1a32: binary weights, float inputs: the dequantised weights are the fake-quantised
    # ones bit for bit, and the same float32 product runs; the logits agree bit for bit.
    report = exported("w1a32").parity
    assert report.bit_exact == report.n_examples, report.summary()
    assert report.max_abs_diff == 0.0
    assert [layer.input_codes for layer in report.layers] == [0, 0, 0]
    assert "not bit for bit" not in report.layers[1].why
    # w8a8: the integer sum is exact, the fake-quantised float32 sum is not; the report says so.
    w8 = exported("w8a8").parity
    assert all("not bit for bit" in layer.why for layer in w8.layers)
    assert w8.max_abs_diff > 0 and w8.max_bound_ratio <= 1


def test_apply_checks_inputs_and_compiles_once():
    model = exported("w2a2").model
    apply = jax.jit(model.apply)
    x = jnp.asarray(splits().test.x[:8])
    first = apply(model.weights, x)
    again = apply(model.weights, x + 0)
    assert first.shape == (8, 10) and first.dtype == jnp.float32 and again.shape == (8, 10)
    assert apply._cache_size() == 1
    with pytest.raises(ValueError, match=r"inputs must have shape \(batch, 64\); got shape \(8, 63\)"):
        apply(model.weights, x[:, :63])
    with pytest.raises(TypeError, match="inputs must be a float32 array; got dtype int32"):
        apply(model.weights, x.astype(jnp.int32))
    assert model.input_shape == (64,) and model.n_classes == 10 and model.input_dtype == np.float32


def test_parity_catches_a_changed_weight():
    result = exported("w4a4")
    run = load_run(run_dir("w4a4"))
    # Flip every bit of the hidden layer's packed 4-bit codes: every code changes.
    layers = list(result.model.weights["layers"])
    layers[1] = {**layers[1], "w": layers[1]["w"] ^ jnp.uint8(0xFF)}
    broken = type(result.model)(
        layers=result.model.layers,
        weights={**result.model.weights, "layers": tuple(layers)},
        input_shape=result.model.input_shape,
        n_classes=result.model.n_classes,
    )
    test = splits().test
    report, _ = parity(broken, run.params, run.model_config, run.qat_config, run.normalizer, test.x, test.y)
    assert not report.passed
    assert not report.layers[1].weights_bit_exact
    # Layer 2's input codes now differ for (nearly) every example, and no float32 drift explains them.
    assert report.flips and not any(flip["explained"] for flip in report.flips)
    assert report.same_class < report.n_examples
    passed, detail = check_parity_set(broken, broken.weights, result.evidence)
    assert not passed and "example" in detail
    assert check_parity_set(result.model, result.model.weights, result.evidence)[0]


def test_export_model_refuses_weights_that_do_not_dequantise_back(monkeypatch):
    run = load_run(run_dir("w4a4"))
    from stejax.export import _convert

    real = _convert._codes

    def off_by_one(fmt, w, step, wq):
        codes, scale = real(fmt, w, step, wq)
        codes = codes.copy()
        codes.reshape(-1)[0] = codes.reshape(-1)[0] - 1 if codes.reshape(-1)[0] > -8 else -7
        return codes, scale

    monkeypatch.setattr(_convert, "_codes", off_by_one)
    with pytest.raises(_convert.ExportError, match=r"layer 0 \(lsq, 8 bits\): the dequantised weight at \(0, 0\)"):
        export_model(run.params, run.model_config, run.qat_config, run.normalizer)


def test_export_run_raises_on_failed_parity(monkeypatch):
    real = export_module.parity

    def failing(*args, **kwargs):
        report, evidence = real(*args, **kwargs)
        return type(report)(**{**report.__dict__, "same_class": report.same_class - 1}), evidence

    monkeypatch.setattr(export_module, "parity", failing)
    with pytest.raises(ParityError, match=r"parity FAILED: same class 268/269") as caught:
        export_run(run_dir("w8a8"), splits=splits())
    assert not caught.value.report.passed
    assert export_run(run_dir("w8a8"), splits=splits(), require_parity=False).parity.same_class == 268


def test_export_run_refuses_data_it_was_not_trained_on(tmp_path):
    run = shutil.copytree(run_dir("w8a8"), tmp_path / "run")
    config = json.loads((run / "config.json").read_text())
    config["data"]["name"] = "digits-400"
    (run / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"trained on data with name='digits-400'.*Pass that run's splits"):
        export_run(run)


def test_tie_between_two_grid_values():
    assert _tie(2.4999998, 2.5000002, sign=False) == 2.5
    assert _tie(-0.50000006, -0.49999997, sign=False) == -0.5
    assert _tie(-1e-8, 1e-8, sign=True) == 0.0


def test_a_code_flip_at_a_rounding_tie_is_found_and_explained():
    # Move layer 1's input step so that one exported grid value sits exactly on a tie
    # k + 1/2 whose round-half-to-even goes one way while the fake-quantised value, a
    # few ulps off (a float32 sum in another order), rounds the other way.
    from stejax.export._parity import _reference_inputs

    result, run, test = exported("w8a8"), load_run(run_dir("w8a8")), splits().test
    model = result.model
    _, records = model.compiled_trace(model.weights, jnp.asarray(test.x))
    u_exp = np.asarray(records[1]["u"])
    xn = jnp.asarray(run.normalizer.apply(test.x))
    u_ref = np.asarray(_reference_inputs(run.params, xn, run.model_config, run.qat_config, 3)[1])
    step = np.float32(np.asarray(model.weights["layers"][1]["a_step"]))
    found = None
    for e, k in np.argwhere((u_exp != u_ref) & (u_exp * (np.float32(1) / step) > 4)):
        ue, ur = u_exp[e, k], u_ref[e, k]
        v = float(ue / step)
        # The tie's even neighbour must lie away from the reference: below it when ur > ue.
        want_even_floor = ur > ue
        ties = [t + 0.5 for t in range(int(v) - 2, int(v) + 2) if (t % 2 == 0) == want_even_floor]
        tie = np.float32(min(ties, key=lambda t: abs(t - v)))
        s = np.float32(ue / tie)
        for _ in range(64):
            r = np.float32(1) / s
            if np.float32(ue * r) == tie and np.round(np.float32(ur * r)) != np.round(tie):
                found = (int(e), int(k), float(tie), s)
                break
            s = np.nextafter(s, np.float32(np.inf) if np.float32(ue * r) > tie else np.float32(-np.inf))
        if found:
            break
    assert found is not None, "no unit to put on a tie"
    e, k, tie, s = found
    layers = list(run.params["layers"])
    layers[1] = {**layers[1], "a_step": jnp.asarray(s)}
    params = {"layers": tuple(layers)}
    weights = dict(model.weights)
    weights["layers"] = tuple(
        {**p, "a_step": jnp.asarray(s)} if i == 1 else p for i, p in enumerate(model.weights["layers"])
    )
    moved = type(model)(layers=model.layers, weights=weights, input_shape=model.input_shape, n_classes=model.n_classes)
    report, evidence = parity(moved, params, run.model_config, run.qat_config, run.normalizer, test.x, test.y)
    flip = next(f for f in report.flips if f["example"] == e)
    assert (flip["layer"], flip["unit"], flip["tie"]) == (1, k, tie)
    assert flip["v_exported"] == tie and flip["v_fake_quant"] != tie and flip["explained"]
    assert abs(flip["v_fake_quant"] - tie) <= flip["drift_bound"]
    assert report.drift_violations == 0 and report.within_tolerance == report.bounded < report.n_examples
    flagged = np.isin(np.arange(len(test)), [f["example"] for f in report.flips])
    assert (
        flagged[e] and np.isinf(evidence.tolerance[flagged]).all() and np.isfinite(evidence.tolerance[~flagged]).all()
    )
    assert report.passed == (report.same_class == report.n_examples)
