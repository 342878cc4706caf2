"""stejax.vq: the codebook's updates against closed forms, its forward and gradient, FSQ, the metrics."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stejax
from stejax.testing import assert_surrogate
from stejax.vq import (
    FSQ,
    FSQ_LEVELS,
    Codebook,
    CodebookState,
    bits_per_sample,
    code_histogram,
    dead_codes,
    entropy_loss,
    kmeans,
    perplexity,
    quantization_error,
    usage,
)

from helpers import CONTRACT

# The platform's float32 log error on results below 4 and exp error on results below 1 (both 0 on XLA:CPU).
_LOG_ERROR_4 = CONTRACT.function_error("log", magnitude=4.0)
_EXP_ERROR = CONTRACT.function_error("exp")

CODES = np.array([[0.0, 0.0], [1.0, 1.0], [2.0, 0.0], [0.0, 2.0], [-1.5, 0.5]], np.float32)


def _codebook(**kw) -> tuple[Codebook, dict, CodebookState]:
    cb = Codebook(codebook_size=len(CODES), dim=2, **kw)
    params, state = cb.init(key=jax.random.key(0))
    return cb, {**params, "codes": jax.device_put(CODES)}, state


def _nearest_numpy(v: np.ndarray, codes: np.ndarray) -> np.ndarray:
    d = ((v[..., None, :].astype(np.float64) - codes.astype(np.float64)) ** 2).sum(-1)
    return np.argmin(d, axis=-1)


# ------------------------------------------------------------------------------------------------
# Forward: the nearest code, exactly; ties to the lowest index
# ------------------------------------------------------------------------------------------------


def test_forward_is_the_nearest_code_exactly():
    cb, params, _ = _codebook()
    z = np.asarray(jax.random.normal(jax.random.key(1), (200, 2)) * 2, np.float32)
    out = jax.jit(cb.quantize)(params, z)
    want = _nearest_numpy(z, CODES)
    np.testing.assert_array_equal(np.asarray(out.indices)[:, 0], want)
    np.testing.assert_array_equal(np.asarray(out.quantized), CODES[want])


def test_ties_go_to_the_lowest_index():
    cb, params, _ = _codebook()
    # (0.5, 0.5) is equally far from code 0 (0, 0) and code 1 (1, 1); (1, 0) from codes 0, 1 and 2.
    out = jax.jit(cb.quantize)(params, np.array([[0.5, 0.5], [1.0, 0.0]], np.float32))
    np.testing.assert_array_equal(np.asarray(out.indices)[:, 0], [0, 0])


def test_heads_share_the_codebook_and_index_separately():
    cb = Codebook(codebook_size=len(CODES), dim=4, heads=2)
    params, _ = cb.init(key=jax.random.key(0))
    params = {**params, "codes": jax.device_put(CODES)}
    z = np.array([[0.9, 1.1, 1.9, 0.2]], np.float32)
    out, decoded = jax.jit(lambda p, z: (o := cb.quantize(p, z), cb.decode(p, o.indices)))(params, z)
    np.testing.assert_array_equal(np.asarray(out.indices), [[1, 2]])
    np.testing.assert_array_equal(np.asarray(out.quantized), [[1.0, 1.0, 2.0, 0.0]])
    np.testing.assert_array_equal(np.asarray(decoded), np.asarray(out.quantized))


def test_projection_in_and_out():
    cb = Codebook(codebook_size=8, dim=6, codebook_dim=2, heads=2)
    assert cb.has_projection
    # One program for the initial parameters and the input (the initialisation's own tests are below).
    params, z = jax.jit(lambda k0, k1: (cb.init(key=k0)[0], jax.random.normal(k1, (5, 6))))(
        jax.random.key(0), jax.random.key(1)
    )
    assert params["project_in"]["w"].shape == (6, 4) and params["project_out"]["w"].shape == (4, 6)
    # One program: the forward and the gradient of a loss through it.
    out, g = jax.jit(
        lambda p, z: (cb.quantize(p, z), jax.grad(lambda p: jnp.sum(cb.quantize(p, z).quantized ** 2))(p))
    )(params, z)
    v = np.asarray(z) @ np.asarray(params["project_in"]["w"]) + np.asarray(params["project_in"]["b"])
    want = _nearest_numpy(v.reshape(5, 2, 2), np.asarray(params["codes"]))
    np.testing.assert_array_equal(np.asarray(out.indices), want)
    assert out.quantized.shape == (5, 6)
    # The projection out is trained through the quantiser: it gets a gradient.
    assert np.abs(np.asarray(g["project_in"]["w"])).sum() > 0 and np.abs(np.asarray(g["project_out"]["w"])).sum() > 0


def test_cosine_picks_the_largest_cosine_similarity():
    cb = Codebook(codebook_size=len(CODES), dim=2, distance="cosine")
    params, _ = cb.init(key=jax.random.key(0))
    codes = CODES[1:]  # no zero code: cosine similarity is undefined there
    cb = Codebook(codebook_size=len(codes), dim=2, distance="cosine")
    params = {"codes": jax.device_put(codes)}
    z = np.asarray(jax.random.normal(jax.random.key(2), (100, 2)), np.float32)
    out = jax.jit(cb.quantize)(params, z)
    unit = codes / np.linalg.norm(codes, axis=1, keepdims=True)
    cos = (z / np.linalg.norm(z, axis=1, keepdims=True)) @ unit.T
    np.testing.assert_array_equal(np.asarray(out.indices[:, 0]), np.argmax(cos, axis=1))
    np.testing.assert_allclose(np.linalg.norm(np.asarray(out.quantized), axis=1), 1.0, rtol=1e-6)


# ------------------------------------------------------------------------------------------------
# Gradient: the declared one, by the verifier
# ------------------------------------------------------------------------------------------------


def _reference_nearest(z, codes):
    """Nearest code, computed independently (brute force; D = 2, so the sum has one add)."""
    c = codes.astype(z.dtype)
    c32 = c.astype(jnp.float32).reshape((1,) * (z.ndim - 1) + c.shape)
    d = jnp.sum(jnp.square(z.astype(jnp.float32)[..., None, :] - c32), axis=-1)
    return jnp.take(c, jnp.argmin(d, axis=-1), axis=0)


def test_straight_through_codebook_passes_the_verifier():
    cb, params, _ = _codebook()
    codes = params["codes"]

    def fn(z):
        return cb.quantize(params, z).quantized

    assert_surrogate(
        fn,
        reference=jax.jit(lambda z: _reference_nearest(z, codes)),  # an exact selection: one program
        derivative=jnp.ones_like,
        args=(np.zeros((8, 2), np.float32),),
        dtypes=("float32",),
        diff_argnums=(0,),
    )


def test_rotation_trick_codebook_has_the_rotation_tangent():
    cb, params, _ = _codebook(estimator=stejax.rotation_trick)
    codes = params["codes"]

    def fn(z):
        return cb.quantize(params, z).quantized

    def tangent_map(args, tangents):
        (z,), (t,) = args, tangents
        return jax.jvp(lambda u: stejax.rotation_trick(u, codes.astype(u.dtype)), (z,), (t,))[1]

    assert_surrogate(
        fn,
        reference=lambda z: _reference_nearest(z, codes),
        tangent_map=tangent_map,
        args=(np.ones((8, 2), np.float32),),
        dtypes=("float32",),
        diff_argnums=(0,),
    )


def _rotate_to_vqp(src, tgt):
    """vector-quantize-pytorch 1.32.0's ``rotate_to`` (the paper's section 4.2 algorithm, contributed by its first
    author), ported line for line: ``.detach()`` -> ``stop_gradient``; ``l2norm`` and ``safe_div`` at these
    non-degenerate inputs are plain divisions."""
    sg = jax.lax.stop_gradient
    norm_src = jnp.linalg.norm(src, axis=-1, keepdims=True)
    norm_tgt = jnp.linalg.norm(tgt, axis=-1, keepdims=True)
    u, q, e = src / norm_src, tgt / norm_tgt, src
    w = sg((u + q) / jnp.linalg.norm(u + q, axis=-1, keepdims=True))
    rotated = e - 2 * jnp.sum(e * w, -1, keepdims=True) * w + 2 * jnp.sum(e * sg(u), -1, keepdims=True) * sg(q)
    return rotated * sg(norm_tgt / norm_src)


def test_rotation_trick_gradients_equal_the_reference_implementations():
    # The codebook's rotation-trick gradient, to the encoder and to the codes, against the reference code fed
    # the same nearest codes: the encoder gets lambda R^T g (not R g: the sign of the rotation matters), the
    # codes get nothing through the estimator (only through the codebook loss).
    cb, _, _ = _codebook(estimator=stejax.rotation_trick)

    def data(key):  # one program for the three draws
        k_z, k_c, k_g = jax.random.split(key, 3)
        return jax.random.normal(k_z, (64, 2)), jax.random.normal(k_c, (5, 2)) * 0.3, jax.random.normal(k_g, (64, 2))

    z, codes, g = (np.asarray(a) for a in jax.jit(data)(jax.random.key(3)))

    def ours(z, codes):
        return jnp.sum(g * cb.quantize({"codes": codes}, z).quantized)

    idx = _nearest_numpy(z, codes)  # the same nearest codes, fixed for differentiation

    def reference(z, codes):
        return jnp.sum(g * _rotate_to_vqp(z, codes[idx]))

    def everything(z, codes):  # one program: the lookup, the reference's forward and both gradients
        return (
            cb.quantize({"codes": codes}, z).indices,
            _rotate_to_vqp(z, codes[idx]),
            jax.grad(ours, argnums=(0, 1))(z, codes),
            jax.grad(reference, argnums=(0, 1))(z, codes),
        )

    indices, rotated, (gz, gc), (rz, rc) = jax.jit(everything)(z, codes)
    np.testing.assert_array_equal(np.asarray(indices)[:, 0], idx)
    np.testing.assert_allclose(
        np.asarray(rotated), codes[idx], rtol=1e-5, atol=1e-6
    )  # the reference's forward is the code too
    np.testing.assert_allclose(np.asarray(gz), np.asarray(rz), rtol=1e-5, atol=1e-6)
    assert np.abs(np.asarray(gc)).sum() == 0.0 and np.abs(np.asarray(rc)).sum() == 0.0
    # and it is not the straight-through gradient here (the codes are far from z, so R and lambda matter)
    assert np.abs(np.asarray(gz) - g).max() > 0.1


def test_a_user_estimator_is_used_for_the_gradient():
    # forward: the nearest code; gradient: 3 x identity
    scaled_ste = stejax.surrogate(
        lambda z, c: stejax.vq_quantize(z, c), lambda z, c: jnp.full_like(z, 3), diff_argnums=(0,)
    )

    cb, params, _ = _codebook(estimator=scaled_ste)
    g = jax.jit(jax.grad(lambda z: jnp.sum(cb.quantize(params, z).quantized)))(np.array([[0.2, 0.9]], np.float32))
    np.testing.assert_allclose(np.asarray(g), [[3.0, 3.0]], rtol=1e-6)


def test_losses_train_the_right_parameters():
    cb, params, _ = _codebook()
    z = np.array([[0.8, 0.9], [1.9, 0.3]], np.float32)
    g_codes, g_commit = jax.jit(
        lambda p: (
            jax.grad(lambda p: cb.quantize(p, z).codebook_loss)(p)["codes"],
            jax.grad(lambda p: cb.quantize(p, z).commitment_loss)(p)["codes"],
        )
    )(params)
    # Only the chosen codes (1 and 2) move, towards the vectors: grad = 2 (c - z) / (n * d).
    want = np.zeros_like(CODES)
    want[1] = 2 * (CODES[1] - np.array([0.8, 0.9])) / 4
    want[2] = 2 * (CODES[2] - np.array([1.9, 0.3])) / 4
    np.testing.assert_allclose(np.asarray(g_codes), want, rtol=1e-6)
    assert np.abs(np.asarray(g_commit)).sum() == 0
    cb_ema, params_ema, _ = _codebook(update="ema")
    out, g_ema = jax.jit(
        lambda p: (
            cb_ema.quantize(p, z),
            jax.grad(lambda p: jnp.sum(cb_ema.quantize(p, z).quantized) + cb_ema.loss(cb_ema.quantize(p, z)))(p),
        )
    )(params_ema)
    assert float(out.codebook_loss) == 0.0
    assert np.abs(np.asarray(g_ema["codes"])).sum() == 0  # EMA codes get no gradient at all


# ------------------------------------------------------------------------------------------------
# Updates: EMA closed form, k-means determinism, dead-code replacement
# ------------------------------------------------------------------------------------------------


def test_ema_update_equals_the_closed_form():
    decay, eps = 0.8, 1e-5
    cb, params, state = _codebook(update="ema", decay=decay, eps=eps)
    state = CodebookState(
        cluster_size=jax.device_put(np.array([2.0, 0.5, 1.0, 0.0, 3.0], np.float32)),
        embed_sum=jax.device_put((CODES * np.array([2.0, 0.5, 1.0, 0.0, 3.0])[:, None]).astype(np.float32)),
    )
    z = np.array([[0.1, 0.2], [-0.1, 0.0], [1.2, 0.8], [2.5, 0.1]], np.float32)  # codes 0, 0, 1, 2
    out, (new_params, new_state) = jax.jit(lambda p, s, z: (o := cb.quantize(p, z), cb.update_state(p, s, o)))(
        params, state, z
    )
    np.testing.assert_array_equal(np.asarray(out.indices)[:, 0], [0, 0, 1, 2])

    n = np.array([2, 1, 1, 0, 0], np.float64)
    s = np.zeros((5, 2))
    s[0] = z[0] + z[1]
    s[1] = z[2]
    s[2] = z[3]
    size = decay * np.array([2.0, 0.5, 1.0, 0.0, 3.0]) + (1 - decay) * n
    m = decay * CODES * np.array([2.0, 0.5, 1.0, 0.0, 3.0])[:, None] + (1 - decay) * s
    total = size.sum()
    smoothed = (size + eps) / (total + 5 * eps) * total
    np.testing.assert_allclose(np.asarray(new_state.cluster_size), size, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(new_state.embed_sum), m, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(new_params["codes"]), m / smoothed[:, None], rtol=1e-5, atol=1e-7)


def test_gradient_codebook_tracks_sizes_but_keeps_its_codes():
    cb, params, state = _codebook()
    new_params, new_state = jax.jit(lambda p, s, z: cb.update_state(p, s, cb.quantize(p, z)))(
        params, state, np.array([[0.1, 0.1]], np.float32)
    )
    np.testing.assert_array_equal(np.asarray(new_params["codes"]), CODES)
    np.testing.assert_allclose(np.asarray(new_state.cluster_size), 0.8 * 1 + 0.2 * np.array([1, 0, 0, 0, 0]), rtol=1e-6)


def test_kmeans_init_is_deterministic_for_a_key_and_fits_clusters():
    cb = Codebook(codebook_size=3, dim=2, update="ema")
    params, state = cb.init(key=jax.random.key(0))
    centres = np.array([[0.0, 0.0], [5.0, 5.0], [-5.0, 5.0]], np.float32)
    x = centres[np.arange(60) % 3] + 0.1 * np.random.default_rng(1).normal(size=(60, 2)).astype(np.float32)
    a = cb.kmeans_init(params, state, x, key=jax.random.key(7))
    b = cb.kmeans_init(params, state, x, key=jax.random.key(7))
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(u), np.asarray(v))
    found = np.asarray(a[0]["codes"])
    order = _nearest_numpy(centres, found)
    assert sorted(order.tolist()) == [0, 1, 2]
    np.testing.assert_allclose(found[order], centres, atol=0.1)
    np.testing.assert_array_equal(np.asarray(a[1].cluster_size), [20.0, 20.0, 20.0])
    means, counts = kmeans(x, 3, key=jax.random.key(7))
    np.testing.assert_array_equal(np.asarray(means), found)


def test_dead_code_replacement_replaces_exactly_the_codes_below_the_threshold():
    cb, params, state = _codebook(update="ema", dead_code_threshold=1.0)
    state = CodebookState(
        cluster_size=jax.device_put(np.array([3.0, 0.99, 1.0, 0.0, 5.0], np.float32)),
        embed_sum=jax.device_put(CODES * 2),
    )
    batch = np.random.default_rng(3).normal(size=(2, 8, 2)).astype(np.float32) + np.float32(10)
    new_params, new_state, replaced = jax.jit(lambda p, s, b, k: cb.replace_dead(p, s, b, key=k))(
        params, state, batch, jax.random.key(4)
    )
    np.testing.assert_array_equal(np.asarray(replaced), [False, True, False, True, False])
    codes = np.asarray(new_params["codes"])
    keep = [0, 2, 4]
    np.testing.assert_array_equal(codes[keep], CODES[keep])
    np.testing.assert_array_equal(np.asarray(new_state.cluster_size)[keep], [3.0, 1.0, 5.0])
    np.testing.assert_array_equal(np.asarray(new_state.embed_sum)[keep], CODES[keep] * 2)
    rows = batch.reshape(-1, 2)
    for k in (1, 3):
        assert any(np.array_equal(codes[k], r) for r in rows), f"code {k} is not a vector of the batch"
        assert np.asarray(new_state.cluster_size)[k] == 1.0
        np.testing.assert_array_equal(np.asarray(new_state.embed_sum)[k], codes[k] * 1.0)
    assert not np.array_equal(codes[1], codes[3])  # distinct rows


def test_no_replacement_when_every_code_is_alive():
    cb, params, state = _codebook(dead_code_threshold=0.5)
    new_params, _, replaced = jax.jit(lambda p, s, b, k: cb.replace_dead(p, s, b, key=k))(
        params, state, np.ones((4, 2), np.float32), jax.random.key(0)
    )
    assert not np.asarray(replaced).any()
    np.testing.assert_array_equal(np.asarray(new_params["codes"]), CODES)


# ------------------------------------------------------------------------------------------------
# Index round trips, FSQ presets
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", sorted(FSQ_LEVELS))
def test_fsq_round_trip_on_every_preset(size):
    q = FSQ.from_codebook_size(size)
    assert q.levels == FSQ_LEVELS[size]
    assert abs(math.log2(q.codebook_size) - math.log2(size)) < 0.1
    z = np.random.default_rng(size).normal(size=(64, q.dim)).astype(np.float32) * 2
    every = np.arange(q.codebook_size, dtype=np.int32)

    def round_trips(z, every):  # one program: the codes and both round trips
        codes = q(z)
        return codes, q.indices_to_codes(q.codes_to_indices(codes)), q.codes_to_indices(q.indices_to_codes(every))

    codes, codes_again, every_again = jax.jit(round_trips)(z, every)
    np.testing.assert_array_equal(np.asarray(codes_again), np.asarray(codes))
    np.testing.assert_array_equal(np.asarray(every_again), every)


def test_fsq_presets_are_the_papers():
    assert FSQ_LEVELS == {
        256: (8, 6, 5),
        1024: (8, 5, 5, 5),
        4096: (7, 5, 5, 5, 5),
        16384: (8, 8, 8, 6, 5),
        65536: (8, 8, 8, 5, 5, 5),
    }
    with pytest.raises(ValueError, match=r"presets are for 2\^8, 2\^10, 2\^12, 2\^14, 2\^16; got 1000"):
        FSQ.from_codebook_size(1000)
    with pytest.raises(ValueError, match="every level must be an int >= 2"):
        FSQ((4, 1))


def test_fsq_bounded_is_within_half_a_step_of_the_code():
    q = FSQ((4, 5, 8))
    z = np.random.default_rng(0).normal(size=(500, 3)).astype(np.float32) * 3
    bounded, codes = jax.jit(lambda z: (q.bounded(z), q(z)))(z)  # one program
    gap = np.abs(np.asarray(bounded) - np.asarray(codes))  # float32 subtraction, as on the device
    half_step = 0.5 / np.array([2, 2, 4])
    assert (gap <= half_step + 1e-6).all()


def test_codebook_round_trip():
    cb, params, _ = _codebook()
    z = np.random.default_rng(5).normal(size=(50, 2)).astype(np.float32) * 2
    every = np.arange(len(CODES), dtype=np.int32)

    def round_trips(p, z, every):  # one program: the codes and both round trips
        codes = cb.quantize(p, z).codes
        return (
            codes,
            cb.indices_to_codes(p, cb.codes_to_indices(p, codes)),
            cb.codes_to_indices(p, cb.indices_to_codes(p, every)),
        )

    codes, codes_again, every_again = jax.jit(round_trips)(params, z, every)
    np.testing.assert_array_equal(np.asarray(codes_again), np.asarray(codes))
    np.testing.assert_array_equal(np.asarray(every_again), every)


# ------------------------------------------------------------------------------------------------
# Metrics and the entropy term
# ------------------------------------------------------------------------------------------------


def test_metrics_against_numpy():
    rng = np.random.default_rng(0)
    idx = rng.integers(0, 40, (300,), dtype=np.int32)
    counts = np.bincount(idx, minlength=64)
    z = rng.normal(size=(4, 3, 5)).astype(np.float32)
    q = np.round(z)
    single = np.zeros(10, np.int32)

    def metrics(idx, z, q, single):  # every metric in one program
        return (
            code_histogram(idx, 64),
            usage(idx, 64),
            perplexity(idx, 64),
            dead_codes(idx, 64),
            quantization_error(z, q),
            perplexity(single, 8),
        )

    hist, used, perp, dead, error, perp_single = jax.jit(metrics)(idx, z, q, single)
    np.testing.assert_array_equal(np.asarray(hist), counts)
    assert float(used) == pytest.approx((counts > 0).mean())
    p = counts[counts > 0] / counts.sum()
    # exp of the entropy: the platform's exp error (0 on XLA:CPU) on top of float32 rounding.
    assert float(perp) == pytest.approx(math.exp(-(p * np.log(p)).sum()), rel=1e-5 + _EXP_ERROR)
    assert int(dead) == int((counts == 0).sum())
    assert float(error) == pytest.approx(((z - q) ** 2).sum(-1).mean(), rel=1e-5)
    assert bits_per_sample(64, tokens=4) == 24.0
    assert float(perp_single) == 1.0


def test_entropy_loss_closed_form():
    logits = np.array([[2.0, 0.0, -1.0], [0.0, 1.0, 0.0]])
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    h = -(p * np.log(p)).sum(1).mean()
    pm = p.mean(0)
    want = h - 0.5 * (-(pm * np.log(pm)).sum())
    # Each entropy sums p log p over logs of magnitude < 4 (log_softmax adds one more log): the platform's log and
    # exp errors (0 on XLA:CPU) bound how far the value may move, on top of float32 rounding.
    platform = (1 + 0.5) * (2 * _LOG_ERROR_4 + 4 * _EXP_ERROR)
    got = float(jax.jit(lambda logits: entropy_loss(logits, diversity_weight=0.5))(logits.astype(np.float32)))
    assert got == pytest.approx(want, rel=1e-5, abs=platform)


# ------------------------------------------------------------------------------------------------
# Errors say what, expected and got
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"distance": "manhattan"}, r"`distance` must be one of \('euclidean', 'cosine'\); got 'manhattan'"),
        ({"update": "sgd"}, r"`update` must be one of \('gradient', 'ema'\); got 'sgd'"),
        ({"decay": 1.0}, r"`decay` must be a float in \[0, 1\); got 1.0"),
        ({"dead_code_threshold": -1}, r"`dead_code_threshold` must be a float >= 0"),
        ({"heads": 3}, r"`dim` \(2\) must be divisible by `heads` \(3\)"),
        ({"codebook_size": 0}, r"`codebook_size` must be a positive int; got 0"),
        ({"code_init": "zeros"}, r"`code_init` must be one of \('normal', 'uniform', 'kaiming_uniform'\); got 'zeros'"),
        ({"init_scale": 0.5}, r"`init_scale` \(0.5\) sets the scale of code_init='normal' or 'uniform'"),
        ({"code_init": "normal", "init_scale": -1.0}, r"`init_scale` must be a positive float or None; got -1.0"),
    ],
)
def test_bad_configuration_is_refused(kw, match):
    args = {"codebook_size": 4, "dim": 2, **kw}
    with pytest.raises(ValueError, match=match):
        Codebook(**args)


def test_wrong_input_width_is_refused():
    cb, params, _ = _codebook()
    with pytest.raises(ValueError, match=r"shape \(\.\.\., dim=2\); got shape \(3, 4\)"):
        cb.quantize(params, jnp.zeros((3, 4)))
    with pytest.raises(ValueError, match=r"codebook_size` must be a positive int; got 0"):
        usage(jnp.zeros(3, jnp.int32), 0)


# ------------------------------------------------------------------------------------------------
# The matmul lookup for large codebooks, k-means++ seeding, per-batch usage
# ------------------------------------------------------------------------------------------------


def test_nearest_code_matmul_is_the_argmin_with_ties_to_the_lowest_index():
    codes = np.asarray(jax.random.normal(jax.random.key(0), (256, 4)), np.float32)
    v = np.asarray(jax.random.normal(jax.random.key(1), (3, 50, 4)), np.float32)
    nearest = jax.jit(stejax.vq.nearest_code_matmul)
    got = np.asarray(nearest(v, codes))
    np.testing.assert_array_equal(got, _nearest_numpy(v, codes))
    tied = codes.copy()
    tied[200] = tied[7]  # the same code in the first and the fourth block of 64
    got = np.asarray(nearest(tied[200:201] + 1e-3, tied))
    assert got.tolist() == [7]


@pytest.mark.parametrize("estimator", [stejax.vq_quantize, stejax.rotation_trick], ids=["ste", "rotation"])
def test_the_matmul_lookup_gives_the_exact_lookups_values_and_gradients(estimator):
    kw = {"codebook_size": 128, "dim": 6, "codebook_dim": 3, "estimator": estimator}
    exact, fast = Codebook(**kw), Codebook(**kw, lookup="matmul")
    params, _ = exact.init(key=jax.random.key(0))
    z = jax.random.normal(jax.random.key(1), (40, 6))

    def loss(cb, p, z):
        out = cb.quantize(p, z)
        return jnp.sum(jnp.sin(out.quantized)) + cb.loss(out), out

    def both(p, z):  # one program: the value and gradient of each lookup
        return tuple(
            jax.value_and_grad(lambda p, z, cb=cb: loss(cb, p, z), (0, 1), has_aux=True)(p, z) for cb in (exact, fast)
        )

    ((la, a), ga), ((lb, b), gb) = jax.jit(both)(params, z)
    np.testing.assert_array_equal(np.asarray(a.indices), np.asarray(b.indices))
    np.testing.assert_allclose(np.asarray(a.quantized), np.asarray(b.quantized), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(float(la), float(lb), rtol=1e-6)
    for x, y in zip(jax.tree.leaves(ga), jax.tree.leaves(gb), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"`lookup` must be one of \('exact', 'matmul'\); got 'fast'"):
        Codebook(codebook_size=4, dim=2, lookup="fast")


def test_kmeans_plus_plus_picks_rows_of_the_data_one_per_separated_cluster():
    centres = np.array([[0.0, 0.0], [100.0, 0.0], [0.0, 100.0]], np.float32)
    x = centres[np.arange(90) % 3] + 0.1 * np.random.default_rng(1).normal(size=(90, 2)).astype(np.float32)
    for seed in range(3):
        means = np.asarray(stejax.vq.kmeans_plus_plus(x, 3, key=jax.random.key(seed)))
        assert all(any(np.array_equal(m, r) for r in x) for m in means), "every seed is a row of the data"
        assert sorted(_nearest_numpy(means, centres).tolist()) == [0, 1, 2]
    a = stejax.vq.kmeans_plus_plus(x, 3, key=jax.random.key(5))
    np.testing.assert_array_equal(np.asarray(a), np.asarray(stejax.vq.kmeans_plus_plus(x, 3, key=jax.random.key(5))))
    # Fewer distinct rows than clusters: every D is 0 after the first draws, and the draws turn uniform (the
    # shape and cluster count of the seeding above: its program).
    same = np.ones_like(x)
    np.testing.assert_array_equal(np.asarray(stejax.vq.kmeans_plus_plus(same, 3, key=jax.random.key(0))), 1.0)
    means, counts = kmeans(x, 3, key=jax.random.key(0), seeding="kmeans++")
    assert sorted(counts.tolist()) == [30.0, 30.0, 30.0]
    with pytest.raises(ValueError, match=r"`seeding` must be one of \('random', 'kmeans\+\+'\); got 'pp'"):
        kmeans(x, 3, key=jax.random.key(0), seeding="pp")


def test_usage_batch_usage_and_perplexity_on_hand_made_assignments():
    idx = np.array([[0, 0, 1, 1], [2, 3, 4, 5], [0, 0, 0, 0]], np.int32)  # 8 codes; epoch uses 0..5
    used, batch_used, perp = jax.jit(
        lambda idx: (usage(idx, 8), stejax.vq.batch_usage(idx, 8), perplexity(idx, 8))  # one program
    )(idx)
    assert float(used) == 6 / 8
    assert float(batch_used) == pytest.approx((2 + 4 + 1) / 3 / 8)
    p = np.array([6, 2, 1, 1, 1, 1]) / 12
    # exp(-sum p log p): the logs (magnitude < 4) move the exponent, exp its result (0 on XLA:CPU).
    platform = _LOG_ERROR_4 + _EXP_ERROR
    assert float(perp) == pytest.approx(math.exp(-(p * np.log(p)).sum()), rel=1e-6 + platform)
    with pytest.raises(TypeError, match="batch_usage: `indices` must be integers"):
        stejax.vq.batch_usage(np.zeros((2, 2), np.float32), 8)


# ------------------------------------------------------------------------------------------------
# The defaults: small Kaiming-uniform codes, EMA decay 0.8, the initialisation recorded in the state
# ------------------------------------------------------------------------------------------------


def test_default_codes_are_kaiming_uniform_and_the_decay_is_0_8():
    cb = Codebook(codebook_size=256, dim=32)
    assert (cb.code_init, cb.decay, cb.init_scale) == ("kaiming_uniform", 0.8, None)
    params, state = cb.init(key=jax.random.key(0))
    codes = np.asarray(params["codes"])
    bound = math.sqrt(6 / (256 * 32))
    assert np.abs(codes).max() <= bound and np.abs(codes).max() > 0.95 * bound
    assert abs(codes.std() - bound / math.sqrt(3)) < 0.05 * bound  # the spread of U(-b, b)
    assert state.initialisation == "kaiming_uniform"
    np.testing.assert_array_equal(np.asarray(state.embed_sum), codes)


@pytest.mark.parametrize(
    ("kw", "spread"),
    [
        ({"code_init": "uniform"}, (1 / 64) / math.sqrt(3)),  # U(-1/K, 1/K), taming-transformers' start
        ({"code_init": "uniform", "init_scale": 0.5}, 0.5 / math.sqrt(3)),
        ({"code_init": "normal"}, 1.0),  # N(0, 1): the codes before the defaults changed
        ({"code_init": "normal", "init_scale": 0.1}, 0.1),
    ],
)
def test_other_initial_codes(kw, spread):
    cb = Codebook(codebook_size=64, dim=64, **kw)
    params, state = cb.init(key=jax.random.key(1))
    assert abs(float(jnp.std(params["codes"])) - spread) < 0.05 * spread
    assert state.initialisation == kw["code_init"]


def test_kmeans_init_records_its_initialisation():
    cb = Codebook(codebook_size=4, dim=2)
    params, state = cb.init(key=jax.random.key(0))
    x = np.random.default_rng(1).normal(size=(40, 2)).astype(np.float32)
    _, state = cb.kmeans_init(params, state, x, key=jax.random.key(2))
    assert state.initialisation == "kmeans"


def test_a_state_saved_without_its_initialisation_loads_and_trains_unchanged():
    # A state saved before the initialisation was recorded has two fields; it loads as it was and every
    # update keeps it so, with the same numbers as a state that records it.
    cb = Codebook(codebook_size=5, dim=2, update="ema", dead_code_threshold=0.5)
    _, params, state = _codebook(update="ema", dead_code_threshold=0.5)
    old = CodebookState(*tuple(state)[:2])
    assert old.code_init is None and old.initialisation is None
    out = jax.jit(cb.quantize)(params, CODES + 0.1)

    def train(params, state, out, key):  # an update and a dead-code replacement, one program per state layout
        params, state = cb.update_state(params, state, out)
        return cb.replace_dead(params, state, out.vectors, key=key)[:2]

    p_old, s_old = jax.jit(train)(params, old, out, jax.random.key(3))
    p_new, s_new = jax.jit(train)(params, state, out, jax.random.key(3))
    assert s_old.code_init is None and s_new.initialisation == "kaiming_uniform"
    np.testing.assert_array_equal(np.asarray(p_old["codes"]), np.asarray(p_new["codes"]))
    np.testing.assert_array_equal(np.asarray(s_old.cluster_size), np.asarray(s_new.cluster_size))
    # and under jit, where None is an empty subtree
    jitted = jax.jit(cb.update_state)(params, old, out)[1]
    assert jitted.code_init is None
