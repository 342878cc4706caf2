"""The PTQ side by side with qwix.contrib (benchmarks/ptq_peers.py), on a tiny MLP: same layers, same grid."""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("flax")
pytest.importorskip("qwix")

from flax import nnx


def _bench():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "ptq_peers.py"
    spec = importlib.util.spec_from_file_location("ptq_peers", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


@pytest.fixture(scope="module")
def tiny():
    bench = _bench()
    model = bench.MLP((8, 16, 4), rngs=nnx.Rngs(0))
    mix = jnp.eye(8) + 0.3 * jax.random.normal(jax.random.key(2), (8, 8))
    calibration = jax.random.normal(jax.random.key(1), (128, 8)) @ mix
    held_out = jax.random.normal(jax.random.key(3), (256, 8)) @ mix
    return bench, model, calibration, held_out


def _quantised(bench, model, calibration, method, form="w4", **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Flax warns while Qwix intercepts its modules
        s = bench.stejax_kernels(bench.stejax_quantise(model, calibration, form, method))
        # Qwix's calibration averages an int32 count into float statistics: it needs JAX's default promotion.
        with jax.numpy_dtype_promotion("standard"), jax.numpy_rank_promotion("allow"):
            q = bench.qwix_kernels(bench.qwix_quantise(model, calibration, form, method, **kwargs))
    return s, q


def test_rtn_on_the_matched_grid_is_the_same_kernel_in_both_libraries(tiny):
    bench, model, calibration, held_out = tiny
    s, q = _quantised(bench, model, calibration, "rtn")
    everything = ["layers/0", "layers/1"]
    assert bench.quantised_layers(model, s) == bench.quantised_layers(model, q) == everything
    for ks, kq, layer in zip(s, q, model.layers, strict=True):
        step = (jnp.max(jnp.abs(layer.kernel[...]), axis=0) / 7)[None, :]
        np.testing.assert_array_equal(np.round(ks / step), np.round(kq / step))  # the same codes
        np.testing.assert_allclose(ks, kq, rtol=1e-6, atol=1e-7)


def test_qwix_default_int4_grid_is_not_stejax_grid(tiny):
    bench, model, calibration, held_out = tiny
    s, q = _quantised(bench, model, calibration, "rtn", matched=False)
    w = model.layers[0].kernel[...]
    step = (jnp.max(jnp.abs(w), axis=0) / 7.5)[None, :]  # Qwix's default: max|w| / (q_max + 1/2), codes in [-8, 7]
    np.testing.assert_allclose(q[0], jnp.clip(jnp.round(w / step), -8, 7) * step, rtol=1e-6, atol=1e-7)
    assert not np.allclose(s[0], q[0])


def test_gptq_first_layer_agrees_and_both_beat_rtn(tiny):
    bench, model, calibration, held_out = tiny
    s, q = _quantised(bench, model, calibration, "gptq")
    rtn, _ = _quantised(bench, model, calibration, "rtn")
    # The first layer sees the same inputs in both (later ones differ: stejax gathers them through the layers
    # already rounded), with the same dampening, blocks and per-channel grid: the same kernel up to float rounding.
    step = (jnp.max(jnp.abs(model.layers[0].kernel[...]), axis=0) / 7)[None, :]
    same = np.mean(np.round(s[0] / step) == np.round(q[0] / step))
    assert same >= 0.99, same
    errors = {name: bench.layer_errors(model, k, held_out)[0] for name, k in (("s", s), ("q", q), ("rtn", rtn))}
    assert errors["s"] < errors["rtn"] and errors["q"] < errors["rtn"], errors
