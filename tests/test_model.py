"""The reference QAT models (stejax.model): contracts, parameters, presets and the forward pass."""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from stejax import keys
from stejax.model import (
    PRESETS,
    ConvConfig,
    InputContract,
    LayerQuant,
    MLPConfig,
    QATConfig,
    Quantizer,
    apply,
    check_params,
    init_params,
    input_contract,
    output_contract,
    param_spec,
    preset,
)

# Small versions of both architectures keep the suite fast; the defaults are
# checked where only shapes matter.
MLP = MLPConfig(hidden=(16, 12))
CONV = ConvConfig(channels=(4, 6))
MODELS = {"mlp": MLP, "conv": CONV}
BATCH = 8


def _data(seed: int, n: int = BATCH, features: int = 64) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, features)).astype(np.float32), rng.integers(0, 10, n).astype(np.int32)


def _batched(model_config, qat_config, **kw):
    f = functools.partial(apply, model_config=model_config, qat_config=qat_config, **kw)
    return jax.vmap(f, in_axes=(None, 0))


@functools.cache
def _params(model: str, name: str, calibrated: bool = False):
    """Parameters for a model and preset (cached: init runs eagerly).

    Uncalibrated by default: the fixed activation steps suit these standard-normal
    inputs, and calibration (an eager pass per layer) is tested on its own.
    """
    xs, _ = _data(100)
    return init_params(jax.random.key(0), MODELS[model], preset(name), calibration_batch=xs if calibrated else None)


@functools.cache
def _offset_params(model: str, name: str):
    """:func:`_params` with every bias set to a fixed nonzero value, for the tests that compare forward passes.

    At initialisation the biases are zero, so a pre-activation of quantised inputs and weights is a sum of products
    on a grid, and such a sum is often exactly zero: XLA and NumPy then round it to tiny values of either sign in
    their own summation orders, and a ``sign`` activation after it (``w1a1``) turns that rounding noise into a
    difference of 2. With biases off the grid, the pre-activations of the seeded batch stay at least 0.006 away
    from zero in ``w1a1``, so the forward passes agree.
    """
    params = _params(model, name)
    rng = np.random.default_rng(1234)
    layers = []
    for layer in params["layers"]:
        b = layer["b"]
        offset = rng.choice([-1, 1], b.shape) * rng.uniform(0.01, 0.05, b.shape)
        layers.append({**layer, "b": jnp.asarray(offset, b.dtype)})
    return {**params, "layers": tuple(layers)}


class _Run(NamedTuple):
    """One training-step evaluation of :func:`_offset_params` on the seeded batch ``_data(1)``."""

    loss: jax.Array
    grads: dict
    logits: jax.Array  # (BATCH, 10)
    stats: dict  # leaves (BATCH,)


def _runs(model: str) -> dict[str, _Run]:
    """Loss, gradients, logits and statistics of every preset, from ONE jitted function per model.

    The loss is softmax cross-entropy written here with optax, over the vmapped model. The presets share one
    program (one compilation instead of seven); each preset's part is its own computation on its own parameters.
    """
    xs, ys = _data(1)
    mc = MODELS[model]

    def loss_of(qc):
        def loss(params):
            logits, stats = _batched(mc, qc, return_stats=True)(params, xs)
            return optax.softmax_cross_entropy_with_integer_labels(logits, ys).mean(), (logits, stats)

        return jax.value_and_grad(loss, has_aux=True)

    def every_preset(params):
        return [loss_of(preset(name))(p) for name, p in zip(PRESETS, params, strict=True)]

    out = jax.jit(every_preset)([_offset_params(model, name) for name in PRESETS])
    return {name: _Run(value, grads, logits, stats) for name, ((value, (logits, stats)), grads) in zip(PRESETS, out)}


@pytest.fixture(scope="module")
def runs() -> dict[tuple[str, str], _Run]:
    """``runs[model, preset]``: one training-step evaluation of ``_offset_params`` on the seeded batch ``_data(1)``."""
    return {(model, name): run for model in MODELS for name, run in _runs(model).items()}


# ----------------------------------------------------------------------------- an independent NumPy forward


def _np_lsq(x, s, bits, signed):
    qn, qp = (2 ** (bits - 1), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    s = np.asarray(s, np.float32)
    v = (x * (np.float32(1) / s)).astype(np.float32)
    return (np.round(np.clip(v, -qn, qp)) * s).astype(np.float32)


def _np_sign(x):
    return np.where(x >= 0, np.float32(1), np.float32(-1))


def _np_conv_same(a, w, stride):
    h, wd, _ = a.shape
    k, out = w.shape[0], w.shape[-1]
    ho, wo = -(-h // stride), -(-wd // stride)
    pad_h, pad_w = max((ho - 1) * stride + k - h, 0), max((wo - 1) * stride + k - wd, 0)
    ap = np.pad(a, ((pad_h // 2, pad_h - pad_h // 2), (pad_w // 2, pad_w - pad_w // 2), (0, 0)))
    y = np.zeros((ho, wo, out), np.float32)
    for i in range(ho):
        for j in range(wo):
            patch = ap[i * stride : i * stride + k, j * stride : j * stride + k, :]
            y[i, j] = np.tensordot(patch, w, axes=3)
    return y


def _np_forward(params, x, model_config, qat_config):
    layers = [{k: np.asarray(v) for k, v in p.items()} for p in params["layers"]]
    n = len(layers)
    conv = isinstance(model_config, ConvConfig)
    z = x.reshape(model_config.image_shape) if conv else x
    for i, p in enumerate(layers):
        lq = qat_config.layer(i, n)
        wq, aq = lq.weights, lq.activations
        u = z if (i == 0 or (aq is not None and aq.method == "sign")) else np.maximum(z, np.float32(0))
        if p["w"].ndim == 2:
            u = u.reshape(-1)
        if aq is None:
            a = u
        elif aq.method == "sign":
            a = _np_sign(u)
        else:  # lsq and round_no_ste share the forward
            a = _np_lsq(u, p["a_step"], aq.bits, signed=(i == 0))
        w = p["w"]
        if wq is not None and wq.method == "sign":
            axes = tuple(range(w.ndim - 1)) if wq.granularity == "channel" else None
            w = np.mean(np.abs(w), axis=axes, keepdims=True) * _np_sign(w)
        elif wq is not None:
            step = p["w_step"] if p["w_step"].ndim == 0 else p["w_step"].reshape((1,) * (w.ndim - 1) + (-1,))
            w = _np_lsq(w, step, wq.bits, signed=True)
        if w.ndim == 2:
            z = a @ w + p["b"]
        else:
            z = _np_conv_same(a, w, model_config.strides[i]) + p["b"]
    return z


# ----------------------------------------------------------------------------- presets and configs


def test_preset_names():
    assert PRESETS == ("float", "w8a8", "w4a4", "w2a2", "w1a32", "w1a1", "w4a4_no_ste")


def test_unknown_preset_lists_the_names():
    with pytest.raises(ValueError, match=r"unknown QAT preset 'w3a3'.*\['float', 'w8a8', .*'w4a4_no_ste'\]"):
        preset("w3a3")


LSQ8 = Quantizer("lsq", 8)
NO_STE8 = Quantizer("round_no_ste", 8)
SIGN_W = Quantizer("sign", 1, "channel")

# (first layer, hidden layers, last layer) of a three-layer model, as documented.
PRESET_TABLE = {
    "float": (LayerQuant(), LayerQuant(), LayerQuant()),
    "w8a8": (LayerQuant(LSQ8, LSQ8),) * 3,
    "w4a4": (
        LayerQuant(LSQ8, LSQ8),
        LayerQuant(Quantizer("lsq", 4), Quantizer("lsq", 4)),
        LayerQuant(LSQ8, LSQ8),
    ),
    "w2a2": (
        LayerQuant(LSQ8, LSQ8),
        LayerQuant(Quantizer("lsq", 2), Quantizer("lsq", 2)),
        LayerQuant(LSQ8, LSQ8),
    ),
    "w1a32": (LayerQuant(LSQ8), LayerQuant(SIGN_W), LayerQuant(LSQ8)),
    "w1a1": (LayerQuant(LSQ8, LSQ8), LayerQuant(SIGN_W, Quantizer("sign", 1)), LayerQuant(LSQ8, LSQ8)),
    "w4a4_no_ste": (
        LayerQuant(NO_STE8, NO_STE8),
        LayerQuant(Quantizer("round_no_ste", 4), Quantizer("round_no_ste", 4)),
        LayerQuant(NO_STE8, NO_STE8),
    ),
}


@pytest.mark.parametrize("name", PRESETS)
def test_preset_layer_policy(name):
    qc = preset(name)
    assert qc.name == name
    assert tuple(qc.layer(i, 3) for i in range(3)) == PRESET_TABLE[name]
    # A deeper model repeats the hidden policy in the middle.
    assert qc.layer(2, 5) == PRESET_TABLE[name][1]


def test_describe_says_first_and_last_layers_stay_8_bit():
    text = preset("w2a2").describe()
    assert text.startswith("w2a2: hidden layers weights 2-bit lsq (per tensor), activations 2-bit lsq")
    assert "first layer weights 8-bit lsq (per tensor), activations 8-bit lsq" in text
    assert "last layer weights 8-bit lsq (per tensor), activations 8-bit lsq" in text
    assert preset("float").describe() == "float: hidden layers weights float, activations float."


def test_qat_layer_index_out_of_range():
    with pytest.raises(ValueError, match=r"index must be in \[0, 3\); got 3"):
        preset("w4a4").layer(3, 3)


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (
            lambda: Quantizer("dorefa", 4),
            ValueError,
            r"method must be one of \['lsq', 'sign', 'round_no_ste', 'pact'\]; got 'dorefa'",
        ),
        (lambda: Quantizer("sign", 2), ValueError, "needs bits=1; got bits=2"),
        (lambda: Quantizer("lsq", 1), ValueError, r"needs bits in \[2, 16\]; got bits=1"),
        (lambda: Quantizer("lsq", 17), ValueError, r"needs bits in \[2, 16\]; got bits=17"),
        (lambda: Quantizer("lsq", 4.0), TypeError, "bits must be an int"),
        (lambda: Quantizer("lsq", 4, "row"), ValueError, "granularity must be one of"),
        (lambda: LayerQuant(activations=Quantizer("lsq", 4, "channel")), ValueError, "per tensor"),
        (lambda: LayerQuant(weights="lsq"), TypeError, "weights must be a Quantizer or None"),
        (lambda: QATConfig("x", hidden=None), TypeError, "hidden must be a LayerQuant"),
        (lambda: MLPConfig(dropout=1.0), ValueError, r"dropout must be a float in \[0, 1\); got 1.0"),
        (lambda: MLPConfig(hidden=(16, 0)), ValueError, r"hidden\[1\] must be a positive int; got 0"),
        (lambda: MLPConfig(in_features=64.0), TypeError, "in_features must be an int"),
        (lambda: ConvConfig(strides=(1,)), ValueError, r"one entry per convolution \(2\); got 1"),
        (lambda: ConvConfig(image_shape=(8, 8)), ValueError, r"image_shape must be \(H, W, C\)"),
    ],
)
def test_config_validation(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_configs_are_hashable_static_arguments():
    assert hash(MLPConfig()) == hash(MLPConfig(hidden=[128, 128]))
    assert hash(preset("w4a4")) == hash(preset("w4a4"))


# ----------------------------------------------------------------------------- parameters


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("model", [MLPConfig(), ConvConfig(), MLP, CONV], ids=["mlp", "conv", "mlp-s", "conv-s"])
def test_param_spec_matches_init(model, name):
    qc = preset(name)
    spec = param_spec(model, qc)
    # Shapes and dtypes only, without drawing: init traced abstractly.
    params = jax.eval_shape(lambda key: init_params(key, model, qc), jax.random.key(0))
    check_params(params, spec)
    flat = {
        "/".join(str(getattr(k, "key", getattr(k, "idx", None))) for k in path): leaf
        for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
    }
    assert set(flat) == set(spec)
    for path, (shape, dtype) in spec.items():
        assert flat[path].shape == shape and flat[path].dtype == dtype, path
    # A step exactly where an LSQ or round_no_ste quantiser is.
    n = model.n_layers
    for i in range(n):
        lq = qc.layer(i, n)
        has_w = lq.weights is not None and lq.weights.method != "sign"
        has_a = lq.activations is not None and lq.activations.method != "sign"
        assert (f"layers/{i}/w_step" in spec) == has_w
        assert (f"layers/{i}/a_step" in spec) == has_a


def test_param_spec_of_the_default_mlp():
    f32 = np.dtype(np.float32)
    assert param_spec(MLPConfig(), preset("w1a32")) == {
        "layers/0/w": ((64, 128), f32),
        "layers/0/b": ((128,), f32),
        "layers/0/w_step": ((), f32),
        "layers/1/w": ((128, 128), f32),
        "layers/1/b": ((128,), f32),
        "layers/2/w": ((128, 10), f32),
        "layers/2/b": ((10,), f32),
        "layers/2/w_step": ((), f32),
    }


def test_param_spec_of_the_default_conv():
    shapes = {p: s for p, (s, _) in param_spec(ConvConfig(), preset("float")).items()}
    assert shapes == {
        "layers/0/w": (3, 3, 1, 16),
        "layers/0/b": (16,),
        "layers/1/w": (3, 3, 16, 32),
        "layers/1/b": (32,),
        "layers/2/w": (4 * 4 * 32, 10),
        "layers/2/b": (10,),
    }


def test_per_channel_steps():
    q = Quantizer("lsq", 4, "channel")
    qc = QATConfig("w4-channel", LayerQuant(q, Quantizer("lsq", 4)))
    spec = param_spec(MLP, qc)
    assert spec["layers/0/w_step"][0] == (16,)
    assert spec["layers/0/a_step"][0] == ()
    params = init_params(jax.random.key(0), MLP, qc)
    w = np.asarray(params["layers"][0]["w"])
    expected = np.mean(np.abs(w), axis=0) * np.float32(2 / math.sqrt(7))
    np.testing.assert_allclose(params["layers"][0]["w_step"], expected, rtol=1e-6)


def _replace_leaf(params, layer, name, value):
    layers = list(params["layers"])
    layers[layer] = dict(layers[layer], **{name: value})
    return {"layers": tuple(layers)}


def test_check_params_errors_name_the_first_bad_path():
    qc = preset("w4a4")
    spec = param_spec(MLP, qc)
    params = _params("mlp", "w4a4")
    with pytest.raises(ValueError, match=r"params: layers/1/w has shape \(16, 13\); expected \(16, 12\)\."):
        check_params(_replace_leaf(params, 1, "w", jnp.zeros((16, 13))), spec)
    with pytest.raises(TypeError, match="params: layers/2/a_step has dtype float16; expected float32"):
        check_params(_replace_leaf(params, 2, "a_step", jnp.zeros((), jnp.float16)), spec)
    missing = {"layers": (params["layers"][0], {"w": params["layers"][1]["w"]}, params["layers"][2])}
    with pytest.raises(ValueError, match=r"params: missing layers/1/b \(expected shape \(12,\), float32\)"):
        check_params(missing, spec)
    with pytest.raises(ValueError, match="params: layers/0/extra is not a parameter of this model"):
        check_params(_replace_leaf(params, 0, "extra", jnp.zeros(())), spec)
    with pytest.raises(TypeError, match="params: layers/0/b must be an array; got str"):
        check_params(_replace_leaf(params, 0, "b", "zeros"), spec)


def test_init_is_deterministic_by_key():
    a = _params("conv", "w4a4")  # key 0
    b = init_params(jax.random.key(0), CONV, preset("w4a4"))
    c = init_params(jax.random.key(1), CONV, preset("w4a4"))
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a["layers"][0]["w"], c["layers"][0]["w"])


@pytest.mark.parametrize("model", ["mlp", "conv"])
@pytest.mark.parametrize("name", PRESETS)
def test_concrete_init_matches_the_spec(model, name):
    check_params(_params(model, name), param_spec(MODELS[model], preset(name)))


@pytest.mark.parametrize("model", ["mlp", "conv"])
def test_init_is_he_normal_from_one_subkey_per_layer(model):
    # Layer i's weights are N(0, 2 / fan_in) drawn with the i-th of n_layers
    # subkeys, whatever the other layers' shapes; biases are zero.
    params = _params(model, "float")
    subkeys = jax.random.split(jax.random.key(0), len(params["layers"]))
    for i, layer in enumerate(params["layers"]):
        shape = layer["w"].shape
        fan_in = math.prod(shape[:-1])  # in, or k * k * in for HWIO kernels
        expected = jax.random.normal(subkeys[i], shape, jnp.float32) * np.float32(math.sqrt(2 / fan_in))
        np.testing.assert_array_equal(layer["w"], expected, err_msg=f"layer {i}")
        np.testing.assert_array_equal(layer["b"], np.zeros(shape[-1], np.float32))
    assert [layer["w"].shape for layer in params["layers"]] == (
        [(64, 16), (16, 12), (12, 10)] if model == "mlp" else [(3, 3, 1, 4), (3, 3, 4, 6), (96, 10)]
    )


def test_init_every_key_is_consumed_once():
    # The ledger alone: JAX's flag would recompile every eager operation.
    with keys.checked(jax_check=False) as ledger:
        init_params(jax.random.key(0), CONV, preset("w4a4"))
    assert ledger.unused() == ()
    assert len(ledger) == 1 + CONV.n_layers


def test_init_steps_follow_lsq():
    params = _params("mlp", "w4a4")
    w0, w1 = (np.asarray(params["layers"][i]["w"]) for i in (0, 1))
    # 2 <|w|> / sqrt(Q_P): Q_P = 127 for the 8-bit first layer, 7 for the 4-bit hidden one.
    np.testing.assert_allclose(params["layers"][0]["w_step"], 2 * np.abs(w0).mean() / math.sqrt(127), rtol=1e-5)
    np.testing.assert_allclose(params["layers"][1]["w_step"], 2 * np.abs(w1).mean() / math.sqrt(7), rtol=1e-5)
    # Without a batch, inputs are taken to have <|u|> = 1: signed 8-bit in layer 0,
    # unsigned 4-bit (Q_P = 15) and 8-bit (Q_P = 255) after the ReLUs.
    assert float(params["layers"][0]["a_step"]) == np.float32(2 / math.sqrt(127))
    assert float(params["layers"][1]["a_step"]) == np.float32(2 / math.sqrt(15))
    assert float(params["layers"][2]["a_step"]) == np.float32(2 / math.sqrt(255))


def test_calibration_sets_activation_steps_from_the_batch():
    xs, _ = _data(100)
    params = _params("mlp", "w4a4", calibrated=True)
    np.testing.assert_allclose(params["layers"][0]["a_step"], 2 * np.abs(xs).mean() / math.sqrt(127), rtol=1e-5)
    # Layer 1's input is relu of layer 0's output, computed with layer 0's quantisers.
    p0 = {k: np.asarray(v) for k, v in params["layers"][0].items()}
    a0 = _np_lsq(xs, p0["a_step"], 8, True)
    z0 = a0 @ _np_lsq(p0["w"], p0["w_step"], 8, True) + p0["b"]
    u1 = np.maximum(z0, 0)
    np.testing.assert_allclose(params["layers"][1]["a_step"], 2 * np.abs(u1).mean() / math.sqrt(15), rtol=1e-4)
    # Weights and weight steps do not depend on the batch.
    uncalibrated = _params("mlp", "w4a4")
    np.testing.assert_array_equal(params["layers"][1]["w_step"], uncalibrated["layers"][1]["w_step"])


@pytest.mark.parametrize(
    ("batch", "error", "match"),
    [
        (np.zeros((4, 63), np.float32), ValueError, "expected 64 features"),
        (np.zeros((4, 64), np.float64), TypeError, "expected dtype float32; got float64"),
        (np.full((4, 64), np.nan, np.float32), ValueError, "row 0 has nan at feature 0"),
    ],
)
def test_calibration_batch_is_checked(batch, error, match):
    with pytest.raises(error, match=match):
        init_params(jax.random.key(0), MLP, preset("w4a4"), calibration_batch=batch)


def test_init_needs_a_typed_key():
    with pytest.raises(TypeError, match="init_params: key must be a typed PRNG key"):
        init_params(jax.random.PRNGKey(0), MLP, preset("float"))
    with pytest.raises(TypeError, match="model_config must be an MLPConfig or ConvConfig"):
        init_params(jax.random.key(0), "mlp", preset("float"))
    with pytest.raises(TypeError, match=r"qat_config must be a QATConfig \(e.g. stejax.model.preset"):
        init_params(jax.random.key(0), MLP, "w4a4")


# ----------------------------------------------------------------------------- contracts


def test_input_contract_fields():
    c = input_contract(MLPConfig())
    assert c == InputContract(
        shape=(64,), dtype="float32", feature_order="64 features in the data set's column order", n_classes=10
    )
    conv = input_contract(ConvConfig(), feature_order="8x8 digit pixels, row by row")
    assert conv.shape == (64,) and conv.feature_order == "8x8 digit pixels, row by row"
    assert "row-major (H, W, C)" in input_contract(ConvConfig()).feature_order
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.dtype = "float64"


def test_input_contract_accepts_an_example_and_a_batch():
    c = input_contract(MLP)
    assert c.check(np.zeros(64, np.float32)) is None
    assert c.check(np.zeros((3, 64), np.float32)) is None
    assert c.check(jnp.zeros((0, 64), jnp.float32)) is None


@pytest.mark.parametrize(
    ("x", "error", "match"),
    [
        (
            np.zeros((5, 63), np.float32),
            ValueError,
            r"expected 64 features: one example of shape \(64,\) or a batch of shape \(N, 64\); "
            r"got shape \(5, 63\) \(63 features\)",
        ),
        (np.zeros(65, np.float32), ValueError, r"got shape \(65,\) \(65 features\)"),
        (np.zeros((2, 8, 8), np.float32), ValueError, r"got shape \(2, 8, 8\)\.$"),
        (np.zeros((5, 64), np.float64), TypeError, "input: expected dtype float32; got float64"),
        (np.zeros((5, 64), np.int32), TypeError, "expected dtype float32; got int32"),
        (np.zeros((5, 64), np.float16), TypeError, "got float16"),
    ],
)
def test_input_contract_rejects(x, error, match):
    with pytest.raises(error, match=match):
        input_contract(MLP).check(x)


@pytest.mark.parametrize(("bad", "shown"), [(np.nan, "nan"), (np.inf, "inf"), (-np.inf, "-inf")])
def test_input_contract_names_the_first_non_finite_row(bad, shown):
    x = np.zeros((6, 64), np.float32)
    x[2, 17] = bad
    x[4, 3] = bad
    with pytest.raises(ValueError, match=rf"expected finite values; row 2 has {shown} at feature 17 \(2 bad row"):
        input_contract(MLP).check(x)
    with pytest.raises(ValueError, match=rf"the example has {shown} at feature 17"):
        input_contract(MLP).check(x[2])


def test_output_contract():
    out = output_contract(ConvConfig(n_classes=7))
    assert (out.shape, out.dtype, out.kind, out.n_classes) == ((7,), "float32", "logits", 7)
    assert "softmax(logits)[k]" in out.meaning and "argmax" in out.meaning


# ----------------------------------------------------------------------------- the forward pass


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("model", ["mlp", "conv"])
def test_forward_matches_a_numpy_reference(runs, model, name):
    xs, _ = _data(1)
    mc, qc = MODELS[model], preset(name)
    params = _offset_params(model, name)
    got = np.asarray(runs[model, name].logits)
    expected = np.stack([_np_forward(params, x, mc, qc) for x in xs])
    assert got.shape == (BATCH, 10) and got.dtype == np.float32
    # Matrix products accumulate in a different order in XLA and NumPy (float32).
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("model", "name"), [("mlp", "float"), ("mlp", "w1a1"), ("conv", "w4a4")])
def test_one_example_agrees_with_the_vmapped_batch(runs, model, name):
    xs, _ = _data(1)
    mc, qc = MODELS[model], preset(name)
    params = _offset_params(model, name)
    one = jax.jit(functools.partial(apply, model_config=mc, qat_config=qc))
    singles = np.stack([np.asarray(one(params, x)) for x in xs])
    batch = np.asarray(runs[model, name].logits)
    # Not bitwise: XLA:CPU runs one example's dense layer as a matrix-vector product
    # and the batch's as a matrix-matrix product, which sum in different orders
    # (observed differences ~1e-6 on logits of order 1).
    np.testing.assert_allclose(singles, batch, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("model", "name"), [("mlp", "w4a4"), ("mlp", "w1a1"), ("conv", "w4a4")])
def test_jit_agrees_with_eager_bitwise(model, name):
    x = _data(4)[0][0]
    mc, qc = MODELS[model], preset(name)
    params = _params(model, name)
    eager, eager_stats = apply(params, x, model_config=mc, qat_config=qc, return_stats=True)
    jitted = jax.jit(apply, static_argnames=("model_config", "qat_config", "train", "return_stats"))
    got, got_stats = jitted(params, x, model_config=mc, qat_config=qc, return_stats=True)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(eager))
    assert jax.tree.structure(got_stats) == jax.tree.structure(eager_stats)
    for a, b in zip(jax.tree.leaves(got_stats), jax.tree.leaves(eager_stats), strict=True):
        np.testing.assert_array_equal(a, b)


def test_jit_does_not_recompile():
    # Equal configs hash equal, so a new but equal config reuses the compiled step.
    def logits(params, x, mc, qc):
        return apply(params, x, model_config=mc, qat_config=qc)

    jitted = jax.jit(logits, static_argnums=(2, 3))
    params = _params("mlp", "w4a4")
    xs, _ = _data(5)
    jitted(params, xs[0], MLP, preset("w4a4"))
    jitted(params, xs[1], MLPConfig(hidden=[16, 12]), dataclasses.replace(preset("w4a4")))
    assert jitted._cache_size() == 1


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("model", ["mlp", "conv"])
def test_loss_and_gradients_are_finite(runs, model, name):
    loss, grads = runs[model, name][:2]
    assert np.isfinite(float(loss)) and 0 < float(loss) < 20
    assert jax.tree.structure(grads) == jax.tree.structure(_params(model, name))
    for g in jax.tree.leaves(grads):
        assert g.dtype == np.float32 and np.isfinite(np.asarray(g)).all()


@pytest.mark.parametrize("model", ["mlp", "conv"])
def test_no_ste_weight_gradients_are_exactly_zero(runs, model):
    no_ste, ste = runs[model, "w4a4_no_ste"].grads, runs[model, "w4a4"].grads
    for i, (g_plain, g_lsq) in enumerate(zip(no_ste["layers"], ste["layers"], strict=True)):
        np.testing.assert_array_equal(g_plain["w"], np.zeros_like(g_plain["w"]), err_msg=f"layer {i}")
        # Not all: rows of inputs that a ReLU zeroed get none, with an estimator or without.
        assert np.count_nonzero(g_lsq["w"]) > 0, f"layer {i}"
    # Nothing reaches the earlier layers through plain rounding of their outputs.
    np.testing.assert_array_equal(no_ste["layers"][0]["b"], np.zeros_like(no_ste["layers"][0]["b"]))
    assert np.count_nonzero(no_ste["layers"][-1]["b"]) > 0


@pytest.mark.parametrize("model", ["mlp", "conv"])
def test_no_ste_has_the_same_forward_as_lsq(runs, model):
    # Same parameters, same values: only the gradients differ.
    lsq_params, plain_params = _params(model, "w4a4"), _params(model, "w4a4_no_ste")
    for a, b in zip(jax.tree.leaves(lsq_params), jax.tree.leaves(plain_params), strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(runs[model, "w4a4"].logits, runs[model, "w4a4_no_ste"].logits)
    assert float(runs[model, "w4a4"].loss) == float(runs[model, "w4a4_no_ste"].loss)


@pytest.mark.parametrize("name", ["w8a8", "w4a4", "w2a2", "w1a32", "w1a1"])
@pytest.mark.parametrize("model", ["mlp", "conv"])
def test_lsq_steps_receive_gradients(runs, model, name):
    grads = runs[model, name].grads
    steps = {
        f"layers/{i}/{k}": np.asarray(v)
        for i, layer in enumerate(grads["layers"])
        for k, v in layer.items()
        if "step" in k
    }
    assert steps
    for path, g in steps.items():
        assert np.count_nonzero(g) > 0, path


@pytest.mark.parametrize("model", ["mlp", "conv"])
def test_binary_layers_pass_gradients_to_their_weights(runs, model):
    for name in ("w1a32", "w1a1"):
        grads = runs[model, name].grads
        assert np.count_nonzero(grads["layers"][1]["w"]) > 0, name


def test_gradient_with_respect_to_the_input():
    mc, qc = CONV, preset("w4a4")
    g = jax.jit(jax.grad(lambda x: apply(_params("conv", "w4a4"), x, model_config=mc, qat_config=qc)[3]))(
        _data(7)[0][0]
    )
    assert g.shape == (64,) and np.isfinite(np.asarray(g)).all() and np.count_nonzero(g) > 0


# ----------------------------------------------------------------------------- statistics


@pytest.mark.parametrize("name", PRESETS)
def test_stats_name_every_quantised_part(runs, name):
    stats = runs["mlp", name].stats
    expected = {}
    for i, lq in enumerate(PRESET_TABLE[name]):
        parts = {"weights": lq.weights, "activations": lq.activations}
        entry = sorted(k for k, q in parts.items() if q is not None)
        if entry:
            expected[f"layer_{i}"] = entry
    assert {k: sorted(v) for k, v in stats.items()} == expected
    for v in jax.tree.leaves(stats):
        assert v.shape == (BATCH,) and v.dtype == np.float32
        assert ((v >= 0) & (v <= 1)).all()
    if name == "w4a4_no_ste":
        for v in jax.tree.leaves(stats):
            np.testing.assert_array_equal(v, np.ones(BATCH, np.float32))


def test_stats_match_a_numpy_count():
    mc, qc = MLP, preset("w1a1")
    params = _replace_leaf(_params("mlp", "w1a1"), 0, "a_step", jnp.float32(0.01))
    params = _replace_leaf(params, 0, "w_step", jnp.float32(0.0005))
    x = _data(9)[0][0] * np.float32(3)
    _, stats = apply(params, x, model_config=mc, qat_config=qc, return_stats=True)
    p = [{k: np.asarray(v) for k, v in layer.items()} for layer in params["layers"]]
    v = x * (np.float32(1) / p[0]["a_step"])
    assert float(stats["layer_0"]["activations"]) == np.mean((v < -128) | (v > 127), dtype=np.float32)
    vw = p[0]["w"] * (np.float32(1) / p[0]["w_step"])
    assert float(stats["layer_0"]["weights"]) == np.float32(np.mean((vw < -128) | (vw > 127)))
    assert 0 < float(stats["layer_0"]["weights"]) < 1
    # The binary layer: |w| > 1 for the weights, |z_0| > 1 for its input (the sign of z_0).
    assert float(stats["layer_1"]["weights"]) == np.float32(np.mean(np.abs(p[1]["w"]) > 1))
    z0 = _np_lsq(x, p[0]["a_step"], 8, True) @ _np_lsq(p[0]["w"], p[0]["w_step"], 8, True) + p[0]["b"]
    assert float(stats["layer_1"]["activations"]) == np.float32(np.mean(np.abs(z0) > 1))


def test_stats_carry_no_gradient():
    mc, qc = MLP, preset("w4a4")
    params, x = _params("mlp", "w4a4"), _data(10)[0][0]

    def total_stats(p):
        return sum(jax.tree.leaves(apply(p, x, model_config=mc, qat_config=qc, return_stats=True)[1]))

    for g in jax.tree.leaves(jax.jit(jax.grad(total_stats))(params)):
        np.testing.assert_array_equal(g, np.zeros_like(g))


def test_float_model_has_no_stats():
    _, stats = apply(
        _params("mlp", "float"),
        _data(11)[0][0],
        model_config=MLP,
        qat_config=preset("float"),
        return_stats=True,
    )
    assert stats == {}


# ----------------------------------------------------------------------------- dropout and keys


DROP = MLPConfig(hidden=(16, 12), dropout=0.5)


def test_dropout_needs_a_key_only_in_training():
    params, x, qc = _params("mlp", "w4a4"), _data(12)[0][0], preset("w4a4")
    plain = apply(params, x, model_config=MLP, qat_config=qc)
    # Evaluation ignores the rate; a key is neither needed nor used.
    np.testing.assert_array_equal(apply(params, x, model_config=DROP, qat_config=qc), plain)
    with pytest.raises(TypeError, match=r"train=True with dropout 0\.5 needs a PRNG key"):
        apply(params, x, model_config=DROP, qat_config=qc, train=True)
    with pytest.raises(TypeError, match="apply: key must be a typed PRNG key"):
        apply(params, x, model_config=DROP, qat_config=qc, train=True, key=jax.random.PRNGKey(0))


def test_dropout_is_deterministic_by_key_and_scales_kept_values():
    params, qc = _params("mlp", "float"), preset("float")
    xs = _data(13)[0]
    train = jax.jit(_batched(DROP, qc, train=True))
    k1 = jax.random.split(jax.random.key(1), BATCH)
    k2 = jax.random.split(jax.random.key(2), BATCH)
    a = np.asarray(train(params, xs, key=k1))
    np.testing.assert_array_equal(a, np.asarray(train(params, xs, key=k1)))
    assert not np.array_equal(a, np.asarray(train(params, xs, key=k2)))
    # Inverted dropout with everything kept would be the evaluation output scaled
    # inside; here check against a NumPy forward with the same masks.
    x, key = xs[0], k1[0]
    sub = jax.random.split(key, 2)
    masks = [np.asarray(jax.random.bernoulli(sub[j], 0.5, (w,))) for j, w in enumerate((16, 12))]
    p = [{k: np.asarray(v) for k, v in layer.items()} for layer in params["layers"]]
    z = x @ p[0]["w"] + p[0]["b"]
    for j in (1, 2):
        u = np.where(masks[j - 1], np.maximum(z, 0) / np.float32(0.5), np.float32(0))
        z = u @ p[j]["w"] + p[j]["b"]
    np.testing.assert_allclose(a[0], z, rtol=1e-5, atol=1e-5)


def test_dropout_key_reuse_is_caught_in_debug_mode():
    params, x, qc = _params("mlp", "float"), _data(14)[0][0], preset("float")
    key = jax.random.key(3)
    # The ledger alone: JAX's flag would recompile every eager operation.
    with keys.checked(jax_check=False) as ledger:
        apply(params, x, model_config=DROP, qat_config=qc, train=True, key=key)
        assert ledger.unused() == ()
        with pytest.raises(
            keys.KeyReuseError,
            match="first at split at apply: dropout keys, again at split at apply: dropout keys",
        ):
            apply(params, x, model_config=DROP, qat_config=qc, train=True, key=key)


def test_jitted_training_passes_jax_key_reuse_check():
    params, qc = _params("mlp", "w4a4"), preset("w4a4")
    xs, ys = _data(16)

    def loss(p, key):
        k = jax.random.split(key, BATCH)
        logits = _batched(DROP, qc, train=True)(p, xs, key=k)
        return optax.softmax_cross_entropy_with_integer_labels(logits, ys).mean()

    with keys.checked():
        value, grads = jax.jit(jax.value_and_grad(loss))(params, jax.random.key(0))
    assert np.isfinite(float(value))
    assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))


# ----------------------------------------------------------------------------- argument checks


@pytest.mark.parametrize(
    ("x", "error", "match"),
    [
        (
            np.zeros((2, 64), np.float32),
            ValueError,
            r"one example of shape \(64,\); got shape \(2, 64\)\. A batch needs jax.vmap",
        ),
        (np.zeros(63, np.float32), ValueError, r"got shape \(63,\)\.$"),
        (np.zeros(64, np.float64), TypeError, "x must be a float32 array; got dtype float64"),
        (np.zeros(64, np.int32), TypeError, "x must be a float32 array; got dtype int32"),
        ([0.0] * 64, TypeError, "x must be a float32 array; got a list"),
    ],
)
def test_apply_rejects_bad_inputs(x, error, match):
    with pytest.raises(error, match=match):
        apply(_params("mlp", "float"), x, model_config=MLP, qat_config=preset("float"))


def test_apply_checks_params_against_the_config():
    with pytest.raises(ValueError, match="params: missing layers/0/w_step"):
        apply(_params("mlp", "float"), _data(15)[0][0], model_config=MLP, qat_config=preset("w4a4"))
