"""PACT inputs in the functional model (stejax.model): config, parameters, forward, gradients, training.

PACT (a clipped ReLU with a learned clip level alpha, unsigned grid) quantises the
inputs of the layers after the first; the first layer keeps a signed quantiser.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from stejax.model import (
    LayerQuant,
    MLPConfig,
    QATConfig,
    Quantizer,
    apply,
    init_params,
    param_spec,
)

MLP = MLPConfig(hidden=(16, 12))
W4 = {"method": "lsq", "bits": 4}
EDGE = {"weights": {"method": "lsq", "bits": 8}, "activations": {"method": "lsq", "bits": 8}}
QAT = QATConfig.from_dict(
    {"name": "w4pact4", "hidden": {"weights": W4, "activations": {"method": "pact", "bits": 4}}, "first": EDGE}
)


def _data(seed: int, n: int = 8) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 64)).astype(np.float32), rng.integers(0, 10, n).astype(np.int32)


def _batched(mc, qc=QAT, **kw):
    return jax.vmap(functools.partial(apply, model_config=mc, qat_config=qc, **kw), in_axes=(None, 0))


# ----------------------------------------------------------------------------- the configuration


def test_pact_config_round_trips_through_a_dict():
    assert QATConfig.from_dict(QAT.to_dict()) == QAT
    assert QAT.layer(1, 3).describe() == "weights 4-bit lsq (per tensor), activations 4-bit pact"
    assert QAT.layer(2, 3).activations == Quantizer("pact", 4)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        # Layer 0 is `first`, or `hidden` when there is no `first`: signed features, never a clipped ReLU.
        (
            lambda: QATConfig("p", LayerQuant(None, Quantizer("pact", 4))),
            r"first layer's inputs are signed standardised features.*got hidden \(which the first layer uses",
        ),
        (
            lambda: QATConfig("p", LayerQuant(), first=LayerQuant(None, Quantizer("pact", 4))),
            r"zero every negative feature\); got first activations 'pact'",
        ),
        (lambda: LayerQuant(Quantizer("pact", 4)), "pact quantises activations .* not weights"),
        (lambda: Quantizer("pact", 1), r"method 'pact' needs bits in \[2, 16\]; got bits=1"),
        (lambda: LayerQuant(None, Quantizer("pact", 4, "channel")), "activations are quantised per tensor"),
    ],
)
def test_pact_config_errors(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_from_dict_names_the_refused_first_layer():
    data = {"name": "p", "hidden": {"weights": W4, "activations": {"method": "pact", "bits": 4}}}
    with pytest.raises(ValueError, match=r"\"first\": \{\"activations\": \{\"method\": \"lsq\", \"bits\": 8\}\}"):
        QATConfig.from_dict(data)


# ----------------------------------------------------------------------------- parameters


def test_param_spec_has_one_clip_level_per_pact_input():
    spec = param_spec(MLP, QAT)
    assert [p for p in spec if "a_" in p] == ["layers/0/a_step", "layers/1/a_alpha", "layers/2/a_alpha"]
    assert spec["layers/1/a_alpha"] == ((), np.dtype(np.float32))


def test_init_clip_level_is_the_top_of_lsqs_initial_range():
    params = init_params(jax.random.key(0), MLP, QAT)
    # <|u|> taken as 1 without data: alpha = Q_P * 2 / sqrt(Q_P) = 2 sqrt(15) at 4 bits.
    for layer in params["layers"][1:]:
        assert layer["a_alpha"].dtype == jnp.float32
        assert float(layer["a_alpha"]) == np.float32(2 * math.sqrt(15))
    xs, _ = _data(100, n=64)
    calibrated = init_params(jax.random.key(0), MLP, QAT, calibration_batch=xs)
    # Layer 1's input: relu of layer 0's output, through layer 0's 8-bit LSQ quantisers.
    p0 = {k: np.asarray(v) for k, v in calibrated["layers"][0].items()}

    def lsq(x, s, bits):
        qn, qp = 2 ** (bits - 1), 2 ** (bits - 1) - 1
        return np.round(np.clip(x * (np.float32(1) / s), -qn, qp)) * s

    u1 = np.maximum(lsq(xs, p0["a_step"], 8) @ lsq(p0["w"], p0["w_step"], 8) + p0["b"], 0)
    np.testing.assert_allclose(calibrated["layers"][1]["a_alpha"], 2 * np.abs(u1).mean() * math.sqrt(15), rtol=1e-4)
    assert float(calibrated["layers"][2]["a_alpha"]) != float(params["layers"][2]["a_alpha"])


# ----------------------------------------------------------------------------- forward and gradients


def _np_pact(u, alpha, bits):
    """The paper's formula, in NumPy float32, with the estimator's documented operation order."""
    step = np.float32(alpha) * np.float32(1 / (2**bits - 1))
    return (np.round(np.clip(u, np.float32(0), np.float32(alpha)) * (np.float32(1) / step)) * step).astype(np.float32)


def _with_alphas(params, alphas):
    layers = [dict(p, a_alpha=jnp.float32(a)) if "a_alpha" in p else p for p, a in zip(params["layers"], alphas)]
    return {"layers": tuple(layers)}


def test_forward_matches_a_numpy_reference():
    xs, _ = _data(1)
    # Clip levels low enough that the clip is active on many units.
    params = _with_alphas(init_params(jax.random.key(0), MLP, QAT), (None, 0.7, 0.9))
    p = [{k: np.asarray(v) for k, v in layer.items()} for layer in params["layers"]]
    qp8, qp4 = 127, 7

    def lsq(x, s, qn, qp):
        return np.round(np.clip(x * (np.float32(1) / s), -qn, qp)) * s

    logits, stats = jax.jit(_batched(MLP, return_stats=True))(params, xs)
    outside = {1: [], 2: []}
    for x, got in zip(xs, np.asarray(logits)):
        z = lsq(x, p[0]["a_step"], 128, qp8) @ lsq(p[0]["w"], p[0]["w_step"], 128, qp8) + p[0]["b"]
        for i in (1, 2):
            u = np.maximum(z, 0)
            outside[i].append(np.mean(u >= p[i]["a_alpha"]))
            z = _np_pact(u, p[i]["a_alpha"], 4) @ lsq(p[i]["w"], p[i]["w_step"], 8, qp4) + p[i]["b"]
        np.testing.assert_allclose(got, z, rtol=1e-5, atol=1e-5)
    # The statistics: the fraction of each PACT input at or above alpha (none is below 0 after the ReLU).
    for i in (1, 2):
        np.testing.assert_allclose(stats[f"layer_{i}"]["activations"], outside[i], atol=1e-6)
    assert min(np.mean(outside[1]), np.mean(outside[2])) > 0.05, outside


def test_clip_levels_get_the_gradient_of_the_clip():
    xs, ys = _data(3)
    params = _with_alphas(init_params(jax.random.key(0), MLP, QAT), (None, 0.5, 0.5))

    def loss(params):
        return optax.softmax_cross_entropy_with_integer_labels(_batched(MLP)(params, xs), ys).mean()

    grads = jax.jit(jax.grad(loss))(params)
    assert all(float(grads["layers"][i]["a_alpha"]) != 0 for i in (1, 2)), grads
    # Above every input, the clip is inactive: no gradient reaches alpha.
    high = jax.jit(jax.grad(loss))(_with_alphas(params, (None, 1e4, 1e4)))
    assert [float(high["layers"][i]["a_alpha"]) for i in (1, 2)] == [0.0, 0.0]


def test_a_concrete_non_positive_clip_level_is_refused():
    params = _with_alphas(init_params(jax.random.key(0), MLP, QAT), (None, -1.0, 1.0))
    with pytest.raises(ValueError, match="pact: alpha must be positive"):
        apply(params, jnp.zeros(64, jnp.float32), model_config=MLP, qat_config=QAT)
