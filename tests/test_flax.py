"""stejax.flax: NNX layers with catalog estimators, wrapping nnx.Linear/Conv, the digits CNN, conversion and export.

Golden values here are the estimators applied by hand (``entry.fn``) and the
products written with ``jax.lax``; the conversion is judged against
:func:`stejax.model.apply`, which shares no code with the layers. Forward values
are compared bit for bit when run eagerly (the same float32 operations in the
same order); the NNX model under ``nnx.jit`` against the functional model under
``jax.jit`` to rtol 2e-6 / atol 1e-6, because XLA compiles the two programs
separately and may reassociate (it moves a per-channel scale out of a product);
gradients to rtol 1e-5 / atol 1e-7, because a batched product and per-example
products under ``vmap`` may sum in a different order.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx

from stejax.data import load_digits, split
from stejax.estimators.catalog import CATALOG
from stejax.flax import Calibration, Quant, QuantConv, QuantLinear, functional_params, quant_of, quantize
from stejax.flax.example import DigitsCNN, fit, save_run
from stejax.model import PRESETS, ConvConfig, QATConfig, Quantizer, apply, init_params, preset
from stejax.train import TrainConfig

from helpers import assert_bitwise_equal

LAYER_ENTRIES = [e for e in CATALOG.values() if e.input_rank == 0]
LATENT = [e.name for e in CATALOG.values() if e.input_rank > 0]
GRAD_RTOL, GRAD_ATOL = 1e-5, 1e-7
JIT_RTOL, JIT_ATOL = 2e-6, 1e-6
SMALL = ConvConfig(channels=(4, 6))


def _x(shape, seed=0, dtype=np.float32):
    return jnp.asarray((np.random.default_rng(seed).standard_normal(shape) * 1.5).astype(dtype))


def _quant(entry) -> Quant:
    # fake_quant's scale as a variable (static), so every learned argument is checked the same way here;
    # dynamic scales (the default for weights) are tested in test_flax_scales.py.
    static = {"scale": "static"} if entry.name == "fake_quant" else {}
    return Quant(entry.name, **entry.default_params(), **static)


def _by_hand(quant: Quant, x, learned, key=None):
    """The estimator applied directly, as the layer should apply it (LSQ's input gradient scale aside)."""
    params = quant.params
    if quant.random:
        params["key"] = key
    return quant.entry.fn(x, *[learned[a.name].astype(x.dtype) for a in quant.entry.args], **params)


@functools.cache
def _splits():
    digits = load_digits()
    rows = np.sort(np.random.default_rng(0).choice(len(digits), 400, replace=False))
    return split(dataclasses.replace(digits, x=digits.x[rows], y=digits.y[rows], name="digits-400"), seed=0)


# ----------------------------------------------------------------------------- packaging


def test_importing_stejax_does_not_import_flax():
    code = "import sys, stejax, stejax.model, stejax.train, stejax.export; print('flax' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


# ----------------------------------------------------------------------------- Quant


def test_quant_fills_in_defaults_and_compares_by_value():
    assert Quant("lsq", bits=4) == Quant("lsq", bits=4, signed=True, grad_scale=None, axis=None)
    assert Quant(CATALOG["sign_ste"].fn) == Quant("sign_ste")
    assert hash(Quant("pact", bits=4)) == hash(Quant("pact", bits=4))
    assert Quant("lsq", bits=4) != Quant("lsq", bits=4, signed=False)
    assert repr(Quant("pact", bits=4, init={"alpha": 3})) == "Quant('pact', bits=4, init={'alpha': 3.0})"


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: Quant("lsqq"), ValueError, "unknown estimator 'lsqq'; the catalog has"),
        (lambda: Quant("lsq"), ValueError, "lsq needs bits=...; e.g. Quant('lsq', bits=8)"),
        (lambda: Quant("lsq", bits=4, width=2), ValueError, "lsq has no setting 'width'; its settings are"),
        (lambda: Quant("pact", bits=4, init={"step": 1}), ValueError, "init names ['step'], which pact does not take"),
        (lambda: Quant(abs, bits=4), ValueError, "settings ['bits'] are only for catalog estimators"),
        (lambda: Quant(3), TypeError, "estimator must be a catalog name or a callable; got 3"),
        (lambda: QuantLinear(2, 2, weights=3, rngs=nnx.Rngs(0)), TypeError, "QuantLinear: weights: expected a Quant"),
    ],
)
def test_quant_errors_say_what_was_expected(make, error, message):
    with pytest.raises(error, match=_literal(message)):
        make()


@pytest.mark.parametrize("name", LATENT)
def test_latent_estimators_are_refused_with_the_reason(name):
    with pytest.raises(ValueError, match="is a latent estimator: it quantises code vectors"):
        Quant(name, **CATALOG[name].default_params())


def _literal(text: str) -> str:
    import re

    return re.escape(text)


# ----------------------------------------------------------------------------- the layers, every estimator


@pytest.mark.parametrize("entry", LAYER_ENTRIES, ids=[e.name for e in LAYER_ENTRIES])
def test_quant_linear_applies_the_estimator_to_weights_and_inputs(entry):
    quant = _quant(entry)
    layer = QuantLinear(6, 3, weights=quant, activations=quant, rngs=nnx.Rngs(0, quant=1))
    x = _x((4, 6))
    learned_w = {a.name: getattr(layer, f"weight_{a.name}")[...] for a in entry.args}
    learned_a = {a.name: getattr(layer, f"input_{a.name}")[...] for a in entry.args}
    # A random estimator draws one key per call from the layer's stream: weights first, then inputs.
    stream = nnx.Rngs(0, quant=1)["quant"].fork()
    k_w = k_a = None
    if quant.random:
        k_a, k_w = stream(), stream()
    expected = jax.lax.dot_general(
        _by_hand(quant, x, learned_a, k_a), _by_hand(quant, layer.kernel[...], learned_w, k_w), (((1,), (0,)), ((), ()))
    ) + jnp.reshape(layer.bias[...], (1, -1))
    assert_bitwise_equal(layer(x), np.asarray(expected), context=entry.name)
    # Learned arguments are Params when the estimator differentiates them, Calibration otherwise.
    for position, arg in enumerate(entry.args, start=1):
        kind = nnx.Param if position in entry.diff_argnums else Calibration
        assert type(getattr(layer, f"weight_{arg.name}")) is kind


@pytest.mark.parametrize("entry", LAYER_ENTRIES, ids=[e.name for e in LAYER_ENTRIES])
def test_quant_layers_train_their_learned_arguments_under_jit(entry):
    quant = _quant(entry)
    model = QuantConv(2, 3, (3, 3), weights=quant, activations=quant, rngs=nnx.Rngs(0, quant=1))
    x = _x((2, 5, 5, 2), seed=1)

    def loss(model, x):
        return jnp.sum(model(x) * jnp.reshape(jnp.linspace(-1, 1, 3, dtype=jnp.float32), (1, 1, 1, 3)))

    grads = nnx.jit(nnx.grad(loss))(model, x)
    leaves = {jax.tree_util.keystr(p): np.asarray(v) for p, v in jax.tree_util.tree_flatten_with_path(grads)[0]}
    assert all(np.isfinite(v).all() for v in leaves.values()), leaves
    assert np.any(leaves["['kernel'].value"] != 0), f"{entry.name}: no gradient reaches the kernel"
    learned = [f"['{p}_{a.name}'].value" for a in entry.args for p in ("weight", "input")]
    assert {k for k in leaves if "_" in k} == {k for k, (a, p) in zip(learned, _pairs(entry)) if p}


def _pairs(entry):
    """(arg, differentiable) for each learned argument, weights then inputs, in the order of _learned names."""
    return [
        (a.name, position in entry.diff_argnums)
        for position, a in enumerate(entry.args, start=1)
        for _ in ("weight", "input")
    ]


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32], ids=["float16", "bfloat16", "float32"])
def test_outputs_follow_the_input_dtype(dtype):
    layer = QuantLinear(6, 3, weights=Quant("lsq", bits=4), activations=Quant("pact", bits=4), rngs=nnx.Rngs(0))
    conv = QuantConv(2, 3, (3, 3), weights=Quant("lsq", bits=4, axis=-1), activations="sign_ste", rngs=nnx.Rngs(0))
    assert layer(_x((2, 6), dtype=dtype)).dtype == dtype
    assert conv(_x((2, 4, 4, 2), dtype=dtype)).dtype == dtype
    grads = nnx.grad(lambda m, x: jnp.sum(m(x).astype(jnp.float32)))(layer, _x((2, 6), dtype=dtype))
    assert grads["weight_step"][...].dtype == jnp.float32 and grads["input_alpha"][...].dtype == jnp.float32


def test_learned_arguments_start_from_the_documented_values():
    kernel_init = lambda key, shape, dtype: _x(shape, seed=3)  # noqa: E731
    layer = QuantLinear(
        6,
        4,
        weights=Quant("lsq", bits=4, axis=-1),
        activations=Quant("lsq_plus", bits=4),
        kernel_init=kernel_init,
        rngs=nnx.Rngs(0),
    )
    w = np.asarray(_x((6, 4), seed=3))
    np.testing.assert_allclose(layer.weight_step[...], 2 * np.abs(w).mean(axis=0) / np.sqrt(7), rtol=1e-6)
    np.testing.assert_allclose(layer.input_step[...], 2 / np.sqrt(15), rtol=1e-6)
    assert float(layer.input_offset[...]) == 0.0
    fq = QuantLinear(
        6, 4, weights=Quant("fake_quant", bits=8, scale="static"), kernel_init=kernel_init, rngs=nnx.Rngs(0)
    )
    np.testing.assert_allclose(fq.weight_scale[...], np.abs(w).max() / 127, rtol=1e-6)
    pact = QuantLinear(6, 4, activations=Quant("pact", bits=4, init={"alpha": 3}), rngs=nnx.Rngs(0))
    assert float(pact.input_alpha[...]) == 3.0


def test_lsq_input_gradient_scale_counts_one_example():
    layer = QuantLinear(6, 3, activations=Quant("lsq", bits=4), rngs=nnx.Rngs(0))
    x = _x((5, 6), seed=2)
    got = nnx.grad(lambda m: jnp.sum(m(x)))(layer)["input_step"][...]
    step = layer.input_step[...]
    by_hand = jax.grad(
        lambda s: jnp.sum(
            jax.lax.dot_general(
                CATALOG["lsq"].fn(x, s, bits=4, grad_scale=1 / np.sqrt(6 * 7)),
                layer.kernel[...],
                (((1,), (0,)), ((), ())),
            )
        )
    )(step)
    np.testing.assert_allclose(got, by_hand, rtol=1e-6)


def test_random_estimators_need_a_key_stream():
    with pytest.raises(TypeError, match="stochastic_round draws random numbers; pass rngs"):
        QuantLinear(2, 2, weights="stochastic_round", rngs=nnx.Rngs(params=0))
    layer = QuantLinear(2, 2, activations="stochastic_round", rngs=nnx.Rngs(0))
    x = _x((64, 2))
    assert not np.array_equal(layer(x), layer(x)), "each call draws a new key"


def test_plain_callables_are_applied_as_they_are():
    layer = QuantLinear(3, 2, weights=jnp.tanh, activations=jnp.round, rngs=nnx.Rngs(0))
    x = _x((2, 3))
    expected = jnp.round(x) @ jnp.tanh(layer.kernel[...]) + jnp.reshape(layer.bias[...], (1, -1))
    np.testing.assert_allclose(layer(x), expected, rtol=1e-6)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: QuantLinear(3, 2, rngs=nnx.Rngs(0))(_x((2, 4))), ValueError, "shape (..., 3) (any rank >= 1"),
        (lambda: QuantLinear(3, 2, rngs=nnx.Rngs(0))(_x((4,))), ValueError, "features last); got shape (4,)"),
        (lambda: QuantLinear(3, 2, rngs=nnx.Rngs(0))(jnp.ones((2, 3), jnp.int32)), TypeError, "floating-point"),
        (lambda: QuantConv(2, 2, (3, 3), rngs=nnx.Rngs(0))(_x((4, 4, 2))), ValueError, "rank 4 with 2 features last"),
        (lambda: QuantConv(3, 2, 3, feature_group_count=2, rngs=nnx.Rngs(0)), ValueError, "multiple of"),
        (lambda: QuantConv(2, 2, 3, padding="CIRCULAR", rngs=nnx.Rngs(0)), ValueError, "padding must be 'SAME'"),
        (
            lambda: QuantLinear(3, 2, activations=Quant("lsq", bits=4, axis=0), rngs=nnx.Rngs(0)),
            ValueError,
            "per-channel input quantiser (lsq) needs axis=-1",
        ),
    ],
)
def test_layer_errors(call, error, message):
    with pytest.raises(error, match=_literal(message)):
        call()


# ----------------------------------------------------------------------------- wrapping nnx.Linear / nnx.Conv


def test_quantize_wraps_an_nnx_linear():
    dense = nnx.Linear(5, 3, rngs=nnx.Rngs(0))
    x = _x((4, 5))
    assert_bitwise_equal(quantize(dense)(x), np.asarray(dense(x)), context="no quantisers")
    q = quantize(dense, weights=Quant("lsq", bits=4), activations=Quant("pact", bits=4))
    assert isinstance(q, QuantLinear) and q.kernel[...] is dense.kernel[...]
    expected = jax.lax.dot_general(
        CATALOG["pact"].fn(x, q.input_alpha[...], bits=4),
        CATALOG["lsq"].fn(dense.kernel[...], q.weight_step[...], bits=4),
        (((1,), (0,)), ((), ())),
    ) + jnp.reshape(dense.bias[...], (1, -1))
    assert_bitwise_equal(q(x), np.asarray(expected), context="quantised")


def test_quantize_of_a_linear_takes_one_example_as_nnx_linear_does():
    dense = nnx.Linear(5, 3, rngs=nnx.Rngs(0))
    x = _x((5,))
    y = quantize(dense)(x)
    assert y.shape == (3,)
    assert_bitwise_equal(y, np.asarray(dense(x)), context="no quantisers, one example")
    q = quantize(dense, weights=Quant("lsq", bits=4), activations=Quant("pact", bits=4))
    assert_bitwise_equal(q(x), np.asarray(q(x[None])[0]), context="quantised: as a batch of one")


def test_conv_padding_forms_nnx_conv_does_not_take_are_refused_clearly():
    with pytest.raises(ValueError, match=_literal("per spatial axis (2) an int or a (low, high) pair of ints")):
        QuantConv(2, 2, (3, 3), padding=[1, 1, 1], rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=_literal("got [(1, 2, 3), 1]")):
        QuantConv(2, 2, (3, 3), padding=[(1, 2, 3), 1], rngs=nnx.Rngs(0))


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"strides": 2},
        {"padding": "VALID"},
        {"padding": ((1, 0), (0, 2))},
        {"padding": [1, 1]},  # one int per spatial axis
        {"padding": [(1, 0), 2]},  # a pair and an int
        {"padding": 1},
        {"kernel_dilation": 2},
        {"use_bias": False},
    ],
)
def test_quantize_wraps_an_nnx_conv(kwargs):
    conv = nnx.Conv(4, 6, (3, 3), rngs=nnx.Rngs(0), **kwargs)
    x = _x((2, 7, 7, 4))
    assert_bitwise_equal(quantize(conv)(x), np.asarray(conv(x)), context=str(kwargs))
    grouped = nnx.Conv(4, 6, 3, feature_group_count=2, rngs=nnx.Rngs(0))
    assert_bitwise_equal(QuantConv.from_conv(grouped)(_x((2, 5, 4))), np.asarray(grouped(_x((2, 5, 4)))))


@pytest.mark.parametrize(
    ("module", "error", "message"),
    [
        (lambda: nnx.Conv(2, 2, 3, padding="CIRCULAR", rngs=nnx.Rngs(0)), ValueError, "padding 'CIRCULAR'"),
        (lambda: nnx.Conv(2, 2, 3, input_dilation=2, rngs=nnx.Rngs(0)), ValueError, "input_dilation 2"),
        (lambda: nnx.Conv(2, 2, 3, mask=jnp.ones((3, 2, 2)), rngs=nnx.Rngs(0)), ValueError, "a mask"),
        (lambda: nnx.BatchNorm(2, rngs=nnx.Rngs(0)), TypeError, "expected an nnx.Linear or nnx.Conv; got BatchNorm"),
    ],
)
def test_quantize_refuses_what_it_cannot_keep(module, error, message):
    with pytest.raises(error, match=_literal(message)):
        quantize(module())


def test_quantize_needs_rngs_only_for_random_estimators():
    with pytest.raises(TypeError, match="stochastic_round draws random numbers"):
        quantize(nnx.Linear(2, 2, rngs=nnx.Rngs(0)), weights="stochastic_round")


# ----------------------------------------------------------------------------- the digits CNN and the functional model


# PACT inputs on the hidden layers (its first layer's signed features keep 8-bit LSQ).
PACT_QAT = QATConfig.from_dict(
    {
        "name": "w4pact4",
        "hidden": {"weights": {"method": "lsq", "bits": 4}, "activations": {"method": "pact", "bits": 4}},
        "first": {"weights": {"method": "lsq", "bits": 8}, "activations": {"method": "lsq", "bits": 8}},
    }
)


def _qat(name):
    return PACT_QAT if name == PACT_QAT.name else preset(name)


def _set_pact_alphas(model):
    """Clip levels that clip many of the test inputs (the starting 7.7 clips almost none), one per layer."""
    for i, layer in enumerate(model.layers):
        if layer.activations is not None and layer.activations.name == "pact":
            layer.input_alpha[...] = jnp.full_like(layer.input_alpha[...], 0.3 + 0.2 * i)


def test_digits_cnn_calibrate_sets_pact_clips_from_the_data_as_init_params_does():
    # init_params' rule: alpha = Q_P * 2<|u|>/sqrt(Q_P), Q_P = 2^b - 1, layer by layer on the calibrated inputs.
    model = DigitsCNN(PACT_QAT, SMALL, rngs=nnx.Rngs(0))
    x = _x((16, 64), seed=3)
    before = {i: float(layer.input_alpha[...]) for i, layer in enumerate(model.layers) if hasattr(layer, "input_alpha")}
    assert before, "the configuration has PACT inputs"
    model.calibrate(x)
    for i in before:
        mean_abs = float(jnp.mean(jnp.abs(model.layer_input(x, i))))
        alpha = model.layers[i].input_alpha[...]
        assert alpha.dtype == jnp.float32
        assert float(alpha) == np.float32(15 * (2.0 * mean_abs / math.sqrt(15))), i
        assert float(alpha) != before[i], i
    # The LSQ step of the first layer is calibrated too (8-bit signed: Q_P = 127).
    step = float(model.layers[0].input_step[...])
    assert step == np.float32(2.0 * float(jnp.mean(jnp.abs(model.layer_input(x, 0)))) / math.sqrt(127))


@pytest.mark.parametrize("name", [*(p for p in PRESETS if p != "w4a4_no_ste"), PACT_QAT.name])
def test_digits_cnn_gives_the_functional_models_logits_bit_for_bit(name):
    model = DigitsCNN(_qat(name), SMALL, rngs=nnx.Rngs(0))
    x = _x((6, 64), seed=4)
    model.calibrate(x)
    _set_pact_alphas(model)
    params = model.functional_params()
    one = functools.partial(apply, model_config=SMALL, qat_config=_qat(name))
    expected = jax.vmap(lambda xi: one(params, xi))(x)
    assert_bitwise_equal(model(x), np.asarray(expected), context=name)
    # Two separately compiled programs: XLA may reassociate (a scale moved out of a product).
    jitted = jax.jit(jax.vmap(lambda xi: one(params, xi)))(x)
    np.testing.assert_allclose(nnx.jit(lambda m, x: m(x))(model, x), jitted, rtol=JIT_RTOL, atol=JIT_ATOL)


@pytest.mark.parametrize("name", ["w4a4", "w1a1", PACT_QAT.name])
def test_digits_cnn_gradients_equal_the_functional_gradients(name):
    model = DigitsCNN(_qat(name), SMALL, rngs=nnx.Rngs(1))
    _set_pact_alphas(model)
    x, y = _x((6, 64), seed=5), jnp.arange(6, dtype=jnp.int32)
    import optax

    def nnx_loss(model):
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(model(x), y))

    def functional_loss(params):
        one = functools.partial(apply, model_config=SMALL, qat_config=_qat(name))
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(jax.vmap(lambda xi: one(params, xi))(x), y))

    got = nnx.jit(nnx.grad(nnx_loss))(model)
    expected = jax.jit(jax.grad(functional_loss))(model.functional_params())
    names = {"kernel": "w", "bias": "b", "weight_step": "w_step", "input_step": "a_step", "input_alpha": "a_alpha"}
    if name == PACT_QAT.name:
        # The clip levels must get a gradient here (some inputs above alpha), or the comparison proves little.
        assert all(float(layer["a_alpha"]) != 0 for layer in expected["layers"][1:]), expected
    for i, layer in enumerate(expected["layers"]):
        for nnx_name, name_ in names.items():
            if name_ in layer:
                g = np.reshape(np.asarray(got["layers"][i][nnx_name][...]), np.shape(layer[name_]))
                np.testing.assert_allclose(g, layer[name_], rtol=GRAD_RTOL, atol=GRAD_ATOL, err_msg=f"{i}/{name_}")


def test_quant_of_follows_the_functional_quantisers():
    assert quant_of(Quantizer("lsq", 4), "weights") == Quant("lsq", bits=4)
    assert quant_of(Quantizer("lsq", 4, "channel"), "weights") == Quant("lsq", bits=4, axis=-1)
    assert quant_of(Quantizer("lsq", 8), "activations", signed=False) == Quant("lsq", bits=8, signed=False)
    assert quant_of(Quantizer("sign", 1, "channel"), "weights") == Quant("magnitude_aware_sign")
    assert quant_of(Quantizer("sign", 1), "activations") == Quant("sign_ste")
    assert quant_of(None, "weights") is None
    pact = quant_of(Quantizer("pact", 4), "activations", signed=False)
    assert pact == Quant("pact", bits=4, init={"alpha": 2 * np.sqrt(15)})
    with pytest.raises(ValueError, match="PACT is a clipped ReLU; it quantises inputs only"):
        quant_of(Quantizer("pact", 4), "weights")
    with pytest.raises(ValueError, match=r"plain jnp\.round has a zero gradient"):
        quant_of(Quantizer("round_no_ste", 4), "weights")
    with pytest.raises(ValueError, match="per-tensor sign; use granularity 'channel'"):
        quant_of(Quantizer("sign", 1), "weights")
    with pytest.raises(ValueError, match="role must be one of"):
        quant_of(None, "bias")


def test_functional_params_names_the_mismatch():
    model = DigitsCNN(preset("w4a4"), SMALL, rngs=nnx.Rngs(0))
    layers = list(model.layers)
    with pytest.raises(ValueError, match="the model config has 3 weight layers; got 2"):
        functional_params(layers[:2], SMALL, preset("w4a4"))
    with pytest.raises(ValueError, match=r"layer 1 weights are quantised by Quant\('lsq'.*bits=4.*needs.*bits=2"):
        functional_params(layers, SMALL, preset("w2a2"))
    with pytest.raises(TypeError, match="layer 0 must be a QuantConv; got QuantLinear"):
        functional_params([layers[2], *layers[1:]], SMALL, preset("w4a4"))
    wide = ConvConfig(channels=(4, 6), strides=(1, 1))
    with pytest.raises(ValueError, match=r"layer 1: strides, padding, dilation and groups are \(\(2, 2\)"):
        functional_params(layers, wide, preset("w4a4"))


def test_functional_params_takes_pact_inputs_and_starts_where_init_params_does():
    model = DigitsCNN(PACT_QAT, SMALL, rngs=nnx.Rngs(0))
    reference = init_params(jax.random.key(0), SMALL, PACT_QAT)
    for i, (got, want) in enumerate(zip(model.functional_params()["layers"], reference["layers"], strict=True)):
        assert ("a_alpha" in got) == ("a_alpha" in want) == (i > 0)
        if "a_alpha" in want:
            assert_bitwise_equal(np.asarray(got["a_alpha"]), np.asarray(want["a_alpha"]), context=f"layer {i}")
    # A layer made by hand with the catalog's default start (alpha 6): the start is not compared.
    layers = list(model.layers)
    conv = dict(strides=2, padding="SAME", weights=Quant("lsq", bits=4), rngs=nnx.Rngs(0))
    layers[1] = QuantConv(4, 6, (3, 3), activations=Quant("pact", bits=4), **conv)
    assert float(functional_params(layers, SMALL, PACT_QAT)["layers"][1]["a_alpha"]) == 6.0
    layers[1] = QuantConv(4, 6, (3, 3), activations=Quant("pact", bits=2), **conv)
    with pytest.raises(ValueError, match=r"layer 1 inputs are quantised by Quant\('pact', bits=2"):
        functional_params(layers, SMALL, PACT_QAT)


# ----------------------------------------------------------------------------- training and export


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    config = TrainConfig(
        preset="w4a4",
        channels=SMALL.channels,
        strides=SMALL.strides,
        dropout=0.0,
        batch_size=32,
        epochs=3,
        schedule="constant",
        learning_rate=1e-2,
    )
    model = DigitsCNN(config.qat_config(), SMALL, rngs=nnx.Rngs(params=jax.random.key(0)))
    before = jax.tree.map(np.asarray, nnx.state(model, nnx.Param))
    result = fit(model, config, jax.random.key(1), splits=_splits())
    run_dir = save_run(model, config, result, tmp_path_factory.mktemp("nnx") / "run", splits=_splits())
    return model, config, result, before, run_dir


def test_fit_trains_weights_and_steps_with_nnx_optimizer(trained):
    model, _, result, before, _ = trained
    after = nnx.state(model, nnx.Param)
    assert not np.array_equal(before["layers"][1]["input_step"][...], after["layers"][1]["input_step"][...])
    assert not np.array_equal(before["layers"][0]["kernel"][...], after["layers"][0]["kernel"][...])
    assert result.history[-1]["val_accuracy"] > 0.5 and result.test_accuracy > 0.5, result
    assert len(result.history) == 3 and result.n_test == len(_splits().test)


def test_the_nnx_model_exports_through_the_functional_artifact_path(trained, tmp_path):
    from stejax.artifacts import load_artifact, save_artifact
    from stejax.export import export_run
    from stejax.train import load_run

    model, _, result, _, run_dir = trained
    run = load_run(run_dir)
    for got, want in zip(jax.tree.leaves(run.params), jax.tree.leaves(model.functional_params())):
        assert_bitwise_equal(np.asarray(got), np.asarray(want))
    assert run.report["test_accuracy"] == result.test_accuracy
    exported = export_run(run_dir, splits=_splits())
    assert exported.parity.passed, exported.parity.summary()
    artifact = save_artifact(exported, tmp_path / "artifact")
    loaded = load_artifact(tmp_path / "artifact")
    assert loaded.manifest == artifact.manifest


def test_save_run_refuses_a_config_of_another_model(trained, tmp_path):
    model, config, result, _, _ = trained
    with pytest.raises(ValueError, match="save_run: config describes w2a2"):
        save_run(model, dataclasses.replace(config, preset="w2a2"), result, tmp_path / "x", splits=_splits())


# ----------------------------------------------------------------------------- the example's recipe


def test_the_example_recipe_trains_float_quantises_calibrates_and_fine_tunes(tmp_path, capsys):
    # The example program end to end (the numerics of each of its steps are stejax.flax's, in test_flax_rules.py).
    from stejax.data import Normalizer
    from stejax.flax import load_quantized, summary
    from stejax.flax.example import W4A4_RULES, accuracy_of, main
    from stejax.flax.models import DigitsCNN as PlainCNN

    printed = main(["--float-steps", "3", "--qat-steps", "2", "--out", str(tmp_path)])
    assert "test_accuracy_ptq" in capsys.readouterr().out
    assert all(0 <= printed[f"test_accuracy_{k}"] <= 1 for k in ("float", "ptq", "qat_from_float"))
    splits = split(load_digits(), seed=0)
    norm = Normalizer.fit(splits.train.x)
    test_x = np.asarray(norm.apply(splits.test.x))
    test = (jax.device_put(test_x), jax.device_put(np.asarray(splits.test.y)))
    # 64 rows: the recipe's example shape, whose eager programs quantize_model built already.
    qat = load_quantized(PlainCNN(rngs=nnx.Rngs(1)), printed["saved"], jax.device_put(test_x[:64]))
    assert qat.stejax_rules == W4A4_RULES
    rows = {r.path: r for r in summary(qat)}
    assert (rows["conv1"].bits, rows["conv2"].bits, rows["head"].bits) == ("w8a8", "w4a4", "w4a4")
    assert round(accuracy_of(qat, test), 4) == printed["test_accuracy_qat_from_float"]  # the saved model is the one
