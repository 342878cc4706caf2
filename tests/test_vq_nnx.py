"""stejax.vq.nnx: the NNX module computes what the pure Codebook methods compute, and trains the right variables."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from stejax.vq import Codebook
from stejax.vq.nnx import CodebookStat, VectorQuantizer


def _leaves_equal(a, b):
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(u), np.asarray(v))


def test_ema_step_in_place_equals_the_pure_update():
    cb = Codebook(codebook_size=8, dim=4, heads=2, update="ema", decay=0.9, dead_code_threshold=0.5)
    vq = VectorQuantizer(cb, rngs=nnx.Rngs(0))
    params, state = cb.init(key=nnx.Rngs(0).params())
    _leaves_equal(vq.params(), params)
    z = jax.random.normal(jax.random.key(1), (16, 4))
    out_pure = cb.quantize(params, z)
    params, state = cb.update_state(params, state, out_pure)
    params, state, _ = cb.replace_dead(params, state, out_pure.vectors, key=jax.random.key(2))
    out = vq(z, update=True, key=jax.random.key(2))
    _leaves_equal(out, out_pure)
    _leaves_equal(vq.params(), params)
    _leaves_equal(vq.state(), state)


def test_kmeans_init_in_place_equals_the_pure_one():
    cb = Codebook(codebook_size=4, dim=2, update="ema")
    vq = VectorQuantizer(cb, rngs=nnx.Rngs(0))
    z = jax.random.normal(jax.random.key(1), (40, 2))
    params, state = cb.kmeans_init(vq.params(), vq.state(), cb.project(vq.params(), z), key=jax.random.key(3))
    vq.kmeans_init(z, key=jax.random.key(3))
    _leaves_equal(vq.params(), params)
    _leaves_equal(vq.state(), state)


def test_the_optimizer_trains_params_only():
    ema = VectorQuantizer(Codebook(codebook_size=8, dim=6, codebook_dim=2, heads=2, update="ema"), rngs=nnx.Rngs(0))
    assert isinstance(ema.codes, CodebookStat)
    assert {"project_in", "project_out"} <= {str(p[0]) for p, _ in nnx.to_flat_state(nnx.state(ema, nnx.Param))}
    assert "codes" not in {str(p[0]) for p, _ in nnx.to_flat_state(nnx.state(ema, nnx.Param))}

    vq = VectorQuantizer(Codebook(codebook_size=8, dim=2, decay=0.5), rngs=nnx.Rngs(0))
    assert isinstance(vq.codes, nnx.Param)
    with jax.numpy_dtype_promotion("standard"):  # optax mixes Python scalars with int32 step counts
        optimizer = nnx.Optimizer(vq, optax.sgd(0.1), wrt=nnx.Param)
    z = jax.random.normal(jax.random.key(1), (32, 2))
    before = vq.params()["codes"]
    sizes_before = vq.state().cluster_size

    @nnx.jit
    def step(model, opt, z):
        def loss_fn(m):
            out = m(z, update=True)
            return m.config.loss(out)

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        with jax.numpy_dtype_promotion("standard"):
            opt.update(model, grads)
        return loss

    loss = step(vq, optimizer, z)
    assert np.isfinite(float(loss))
    after = vq.params()["codes"]
    chosen = np.unique(np.asarray(Codebook(codebook_size=8, dim=2).quantize({"codes": before}, z).indices))
    moved = np.any(np.asarray(after) != np.asarray(before), axis=1)
    np.testing.assert_array_equal(np.flatnonzero(moved), chosen)  # only the chosen codes learn
    assert not np.array_equal(np.asarray(vq.state().cluster_size), np.asarray(sizes_before))
    assert jnp.isfinite(after).all()
