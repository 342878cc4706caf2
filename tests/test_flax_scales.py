"""stejax.flax: dynamic and static scales, per tensor, channel, group and token.

A weight quantiser's scale is recomputed from the current weights on every call
unless the Quant says ``scale="static"``; the training test trains a 16 -> 32
layer for 100 Adam steps at lr 3e-2, 4 bits, per channel: a scale fixed at
initialisation leaves about 40% of the weights outside its range. Golden values
are the estimator applied by hand with a scale from :func:`stejax.absmax_scale`.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from stejax.estimators.calibration import absmax_scale
from stejax.estimators.catalog import CATALOG
from stejax.flax import Calibration, Quant, QuantConv, QuantLinear

from helpers import assert_bitwise_equal

FQ = CATALOG["fake_quant"].fn


def _x(shape, seed=0, scale=1.5):
    return jnp.asarray((np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32))


def _train(layer, steps=100, lr=3e-2):
    x, target = _x((64, 16), seed=1), _x((64, 32), seed=2, scale=5.0)
    optimizer = nnx.Optimizer(layer, optax.adam(lr), wrt=nnx.Param)

    @nnx.jit
    def step(layer, optimizer):
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean(jnp.square(m(x) - target)))(layer)
        with jax.numpy_dtype_promotion("standard"):  # optax's Adam mixes Python ints into its bias correction
            optimizer.update(layer, grads)
        return loss

    for _ in range(steps):
        step(layer, optimizer)
    return layer


def _outside(kernel, scale, bits=4):
    """The fraction of weights beyond the last level's rounding interval, where fake_quant's gradient is 0."""
    top = (2 ** (bits - 1) - 1 + 0.5) * np.asarray(scale)
    return float(np.mean(np.abs(np.asarray(kernel)) > top))


def test_trained_weights_never_leave_a_dynamic_scales_range():
    layer = _train(QuantLinear(16, 32, weights=Quant("fake_quant", bits=4, axis=-1), rngs=nnx.Rngs(0)))
    kernel = layer.kernel[...]
    scale = absmax_scale(kernel, bits=4, axis=-1)
    assert _outside(kernel, scale) == 0.0
    # The largest quantised weight of each channel is that channel's largest weight (7 levels of its scale).
    np.testing.assert_allclose(np.max(np.abs(layer.quantized_kernel()), axis=0), 7 * np.asarray(scale), rtol=1e-6)
    np.testing.assert_allclose(
        np.max(np.abs(layer.quantized_kernel()), axis=0), np.max(np.abs(kernel), axis=0), rtol=1e-6
    )
    # Every weight still gets the straight-through gradient (none clipped).
    g = jax.grad(lambda w: jnp.sum(Quant("fake_quant", bits=4, axis=-1).apply(w, {}, role="weights", key=None)))(kernel)
    assert np.all(np.asarray(g) == 1.0)


def test_a_static_scale_is_kept_as_set_which_is_why_it_is_not_the_default():
    layer = QuantLinear(16, 32, weights=Quant("fake_quant", bits=4, axis=-1, scale="static"), rngs=nnx.Rngs(0))
    assert type(layer.weight_scale) is Calibration
    initial = np.asarray(layer.weight_scale[...])
    _train(layer)
    np.testing.assert_array_equal(layer.weight_scale[...], initial)
    assert _outside(layer.kernel[...], initial) > 0.2, "a static scale falls behind; kept only when asked for"


def test_a_dynamic_scale_follows_a_rescaled_kernel():
    layer = QuantLinear(16, 32, weights=Quant("fake_quant", bits=4, axis=-1), rngs=nnx.Rngs(0))
    layer.kernel[...] = layer.kernel[...] * 10
    true = float(jnp.max(jnp.abs(layer.kernel[...])))
    assert float(jnp.max(jnp.abs(layer.quantized_kernel()))) == pytest.approx(true, rel=1e-6)
    assert not hasattr(layer, "weight_scale"), "a dynamic scale is not a variable"


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_dynamic_per_tensor_and_per_channel_equal_fake_quant_by_hand(dtype):
    w = _x((6, 5), seed=3).astype(dtype)
    for axis in (None, -1, 0):
        got = Quant("fake_quant", bits=4, axis=axis).apply(w, {}, role="weights", key=None)
        want = FQ(w, absmax_scale(w, bits=4, axis=axis), bits=4, axis=axis)
        assert got.dtype == dtype
        assert_bitwise_equal(got, np.asarray(want), context=f"axis={axis}")


def test_dynamic_per_group_runs_along_the_contraction_axis():
    layer = QuantLinear(8, 3, weights=Quant("fake_quant", bits=4, group_size=4), rngs=nnx.Rngs(0))
    w = layer.kernel[...]  # (in=8, out=3): groups of 4 inputs for each output
    for o, g in ((0, 0), (2, 1)):
        block = w[4 * g : 4 * g + 4, o]
        want = FQ(block, absmax_scale(block, bits=4), bits=4)
        assert_bitwise_equal(layer.quantized_kernel()[4 * g : 4 * g + 4, o], np.asarray(want), context=f"{o}, {g}")
    conv = QuantConv(4, 3, (3, 3), weights=Quant("fake_quant", bits=4, group_size=2), rngs=nnx.Rngs(0))
    k = conv.kernel[...]  # HWIO: groups of 2 input channels
    block = k[1, 2, 2:4, 1]
    assert_bitwise_equal(
        conv.quantized_kernel()[1, 2, 2:4, 1], np.asarray(FQ(block, absmax_scale(block, bits=4), bits=4))
    )


def test_lsq_per_group_learns_one_step_per_group():
    layer = QuantLinear(8, 3, weights=Quant("lsq", bits=4, group_size=4), rngs=nnx.Rngs(0))
    w = layer.kernel[...]
    assert layer.weight_step.shape == (3, 2)  # (out, in // 4)
    np.testing.assert_allclose(
        layer.weight_step[...][1, 0], 2 * np.mean(np.abs(np.asarray(w[0:4, 1]))) / np.sqrt(7), rtol=1e-6
    )
    by_hand = CATALOG["lsq"].fn(w[4:8, 2], layer.weight_step[...][2, 1], bits=4)
    assert_bitwise_equal(layer.quantized_kernel()[4:8, 2], np.asarray(by_hand))
    grads = nnx.grad(lambda m: jnp.sum(jnp.square(m(_x((5, 8))))))(layer)
    assert np.all(np.asarray(grads["weight_step"][...]) != 0), "every group's step is trained"


def test_dynamic_per_token_input_scales():
    layer = QuantLinear(
        6, 2, activations=Quant("fake_quant", bits=8, scale="dynamic", per_token=True), rngs=nnx.Rngs(0)
    )
    x = _x((2, 3, 6), seed=4) * jnp.reshape(jnp.array([1.0, 10.0, 100.0]), (1, 3, 1))
    rows = jnp.reshape(x, (6, 6))  # one token per row: the catalog's per-channel form along axis 0
    want = jnp.reshape(FQ(rows, absmax_scale(rows, bits=8, axis=0), bits=8, axis=0), x.shape)
    assert_bitwise_equal(layer.quantized_input(x), np.asarray(want))
    assert_bitwise_equal(layer.quantized_input(x)[1, 2], np.asarray(FQ(x[1, 2], absmax_scale(x[1, 2], bits=8), bits=8)))
    per_tensor = QuantLinear(6, 2, activations=Quant("fake_quant", bits=8, scale="dynamic"), rngs=nnx.Rngs(0))
    assert_bitwise_equal(per_tensor.quantized_input(x), np.asarray(FQ(x, absmax_scale(x, bits=8), bits=8)))


def test_inputs_stay_static_by_default_and_a_dynamic_scale_has_no_gradient():
    layer = QuantLinear(6, 2, activations=Quant("fake_quant", bits=8), rngs=nnx.Rngs(0))
    assert type(layer.input_scale) is Calibration
    w = _x((6, 5), seed=5)
    # The scale depends on w but carries no gradient: the derivative is fake_quant's clipped identity only.
    g = jax.grad(lambda w: jnp.sum(Quant("fake_quant", bits=4).apply(w, {}, role="weights", key=None) * w))(w)
    q = FQ(w, absmax_scale(w, bits=4), bits=4)
    np.testing.assert_allclose(g, np.asarray(q + w), rtol=1e-6)


def test_jvp_and_jit_through_a_dynamic_scale():
    layer = QuantLinear(6, 4, weights=Quant("fake_quant", bits=4, group_size=3), rngs=nnx.Rngs(0))
    x = _x((2, 6))
    y, t = jax.jvp(lambda x: layer(x), (x,), (jnp.ones_like(x),))
    np.testing.assert_allclose(t, jnp.ones_like(x) @ layer.quantized_kernel(), rtol=1e-6)
    assert_bitwise_equal(nnx.jit(lambda m, x: m(x))(layer, x), np.asarray(y))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Quant("lsq", bits=4, scale="dynamic"), "scale='dynamic' is for estimators with a calibrated scale"),
        (lambda: Quant("fake_quant", bits=4, scale="fixed"), "scale must be one of ['dynamic', 'static']"),
        (lambda: Quant("fake_quant", bits=4, calibration="max"), "calibration must be one of"),
        (lambda: Quant("fake_quant", bits=4, axis=0, group_size=4), "give axis (per channel) or group_size"),
        (lambda: Quant("sign_ste", group_size=4), "group_size needs an estimator with a per-channel form"),
        (lambda: Quant("fake_quant", bits=8, per_token=True), "per_token=True needs scale='dynamic'"),
        (
            lambda: Quant("fake_quant", bits=4, scale="dynamic", init={"scale": 0.1}),
            "a dynamic scale has no initial value",
        ),
        (
            lambda: QuantLinear(6, 2, weights=Quant("fake_quant", bits=4, group_size=4), rngs=nnx.Rngs(0)),
            "QuantLinear: weights: Quant: group_size 4 does not divide the contraction axis (0) of the weights, "
            "of length 6",
        ),
        (
            lambda: QuantLinear(6, 2, activations=Quant("lsq", bits=4, group_size=2), rngs=nnx.Rngs(0)),
            "a static input quantiser (lsq) cannot have group_size",
        ),
        (
            lambda: QuantLinear(
                6, 2, weights=Quant("fake_quant", bits=8, scale="dynamic", per_token=True), rngs=nnx.Rngs(0)
            ),
            "per_token is for inputs",
        ),
    ],
)
def test_scale_option_errors(make, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        make()


def test_options_compare_and_print():
    assert Quant("fake_quant", bits=4) == Quant("fake_quant", bits=4, calibration="absmax", per_token=False)
    assert Quant("fake_quant", bits=4) != Quant("fake_quant", bits=4, scale="static")
    assert "group_size=32" in repr(Quant("lsq", bits=4, group_size=32))
