"""The real-data check of ``stejax vq compare``: a small convolutional VQ-VAE on scikit-learn's 8x8 digits.

Each image (pixels scaled to [0, 1]) is encoded to a 4x4 grid of ``d``-wide
latents, 16 tokens per image: a 3x3 convolution to 16 channels, a 4x4 convolution
of stride 2 to 32 channels (ReLU after each), a 1x1 convolution to ``d``. The
decoder mirrors it: a 1x1 convolution to 32 channels, nearest-neighbour upsampling
to 8x8, a 3x3 convolution to 16 channels, a 3x3 convolution to one channel (ReLU
between). Every VQ variant runs under the ``reference`` set-up (the quantiser
exactly as in the synthetic grid, one token per latent vector), FSQ with the same
number of codes; Adam on the reconstruction's mean squared error plus the
quantiser's loss, batches of 64 training images. The 1797 images are split once
(a fixed permutation): 1437 to train, 360 to test; usage, perplexity and MSE are
measured on the test images.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from stejax import keys

__all__ = ["digits_check"]

_TRAIN = 1437
_BATCH = 64  # images per step: 1024 tokens
_TOKENS = 16  # a 4x4 grid of latents per image


def _conv_init(key, size, c_in, c_out):
    w = jax.random.normal(keys.consume(key, where="vq digits: conv init"), (size, size, c_in, c_out), jnp.float32)
    return {"w": w * jnp.sqrt(2.0 / (size * size * c_in)), "b": jnp.zeros((c_out,), jnp.float32)}


def _conv(layer, x, stride=1, pad=None):
    """A 2-D convolution (NHWC, HWIO weights) as one matrix product over shifted slices of the padded input.

    Slices and a dot, not ``lax.conv_general_dilated``: XLA on CPU runs this small network's convolutions,
    and their gradients inside a ``lax.scan``, many times faster written so.
    """
    kh, kw, c_in, c_out = layer["w"].shape
    pad = (kh - 1) // 2 if pad is None else pad
    xp = jnp.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0))) if pad else x
    h = (xp.shape[1] - kh) // stride + 1
    w = (xp.shape[2] - kw) // stride + 1
    shifted = [
        xp[:, i : i + stride * (h - 1) + 1 : stride, j : j + stride * (w - 1) + 1 : stride, :]
        for i in range(kh)
        for j in range(kw)
    ]
    patches = jnp.concatenate(shifted, axis=-1) if len(shifted) > 1 else shifted[0]
    y = patches @ layer["w"].reshape(kh * kw * c_in, c_out)
    return y + layer["b"].reshape(1, 1, 1, -1)


def _encoder_init(key, d):
    k1, k2, k3 = keys.split(key, 3, where="vq digits: encoder layers")
    return {"c1": _conv_init(k1, 3, 1, 16), "c2": _conv_init(k2, 4, 16, 32), "c3": _conv_init(k3, 1, 32, d)}


def _decoder_init(key, d):
    k1, k2, k3 = keys.split(key, 3, where="vq digits: decoder layers")
    return {"c1": _conv_init(k1, 1, d, 32), "c2": _conv_init(k2, 3, 32, 16), "c3": _conv_init(k3, 3, 16, 1)}


def _encode(p, x):
    h = jax.nn.relu(_conv(p["c1"], x))
    h = jax.nn.relu(_conv(p["c2"], h, stride=2, pad=1))
    return _conv(p["c3"], h)  # (B, 4, 4, d)


def _decode(p, z):
    h = jax.nn.relu(_conv(p["c1"], z))
    h = jnp.repeat(jnp.repeat(h, 2, axis=1), 2, axis=2)
    h = jax.nn.relu(_conv(p["c2"], h))
    return _conv(p["c3"], h)


def _images() -> tuple[np.ndarray, np.ndarray]:
    from stejax.data import load_digits

    digits = load_digits()
    x = (digits.x / 16.0).reshape(-1, 8, 8, 1).astype(np.float32)
    order = np.random.default_rng(0).permutation(x.shape[0])
    return x[order[:_TRAIN]], x[order[_TRAIN:]]


def _run_one(m, key, x_train, x_test):
    """Train one seed of one variant; pure, so it vmaps over ``key``."""
    import optax

    from stejax.vq._compare import _quantize, _standard_promotion
    from stejax.vq._metrics import perplexity, usage

    s = m.settings
    adam = optax.adam(s.learning_rate)
    optimizer = optax.GradientTransformation(_standard_promotion(adam.init), _standard_promotion(adam.update))
    k_enc, k_dec, k_q, k_kmeans, k_run = keys.split(key, 5, where="vq digits: seed")
    params: dict[str, Any] = {"encoder": _encoder_init(k_enc, m.code_dim), "decoder": _decoder_init(k_dec, m.code_dim)}
    cb = m.codebook
    state = None
    if cb is not None:
        params["codebook"], state = cb.init(key=k_q)
        start = jnp.float32(_BATCH * _TOKENS / m.codebook_size)
        codes = cb.codes(params["codebook"]).astype(jnp.float32)
        state = state._replace(cluster_size=jnp.full((m.codebook_size,), start), embed_sum=codes * start)
        if m.variant.seeding == "kmeans++":
            z = _encode(params["encoder"], x_train).reshape(-1, m.code_dim)
            params["codebook"], _ = cb.kmeans_init(
                params["codebook"], state, cb.project(params["codebook"], z), key=k_kmeans, seeding="kmeans++"
            )
            state = state._replace(embed_sum=cb.codes(params["codebook"]).astype(jnp.float32) * start)
    else:
        from stejax.vq._compare import _linear

        k_in, k_out = keys.split(k_q, where="vq digits: fsq projections")
        params["fsq"] = {
            "project_in": _linear(k_in, m.code_dim, m.fsq.dim),
            "project_out": _linear(k_out, m.fsq.dim, m.code_dim),
        }

    def forward(p, x):
        z = _encode(p["encoder"], x)
        qz = _quantize(m, p, z.reshape(-1, m.code_dim))
        return _decode(p["decoder"], qz.latent.reshape(z.shape)), qz

    def loss(p, x):
        recon, qz = forward(p, x)
        mse = jnp.mean(jnp.square(recon - x))
        return mse + qz.aux_loss, qz

    opt_state = optimizer.init(params)
    track = cb is not None and (cb.update == "ema" or cb.dead_code_threshold > 0)

    def step(carry, k):
        p, o, st = carry
        k_x, k_dead = keys.split(k, where="vq digits: step -> batch, dead codes")
        idx = jax.random.choice(keys.consume(k_x, where="vq digits: batch"), x_train.shape[0], (_BATCH,))
        (_, qz), grads = jax.value_and_grad(loss, has_aux=True)(p, x_train[idx])
        updates, o = optimizer.update(grads, o, p)
        p = optax.apply_updates(p, updates)
        if cb is not None and track:
            p["codebook"], st = cb.update_state(p["codebook"], st, qz.out)
            if cb.dead_code_threshold > 0:
                p["codebook"], st, _ = cb.replace_dead(p["codebook"], st, qz.out.vectors, key=k_dead)
        return (p, o, st), None

    step_keys = keys.split(k_run, s.digits_steps, where="vq digits: one key per step")
    (params, _, _), _ = jax.lax.scan(step, (params, opt_state, state), step_keys)
    recon, qz = forward(params, x_test)
    return {
        "usage": usage(qz.indices, m.codebook_size),
        "perplexity": perplexity(qz.indices, m.codebook_size),
        "val_mse": jnp.mean(jnp.square(recon - x_test)),
    }


def digits_check(settings: Any, *, workers: int = 1, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Train the digits VQ-VAE for every variant of ``settings`` under the ``reference`` set-up, on every seed.

    Returns ``{"rows", "summary", "codebook_size", "code_dim", "steps", "programs", "data"}``: one row per
    variant and seed (``usage`` and ``perplexity`` over the test images' tokens, ``perplexity_over_k``,
    ``val_mse`` per pixel of [0, 1] images), the summary their means over seeds.
    """
    from concurrent.futures import ThreadPoolExecutor

    from stejax.vq._compare import _BY_NAME, _SETUP_BY_NAME, _model, _runs_in, summarize

    say = progress or (lambda _: None)
    k, d = settings.digits_codebook_size, settings.digits_code_dim
    # The quantiser's settings as in the grid, with this network's tokens per batch (dead-code thresholds).
    s = dataclasses.replace(settings, batch_size=_BATCH * _TOKENS, val_size=_BATCH * _TOKENS, codebook_sizes=(k,))
    reference = _SETUP_BY_NAME["reference"]
    names = [n for n in settings.variants if _runs_in(_BY_NAME[n], reference)]
    x_train, x_test = (jnp.asarray(a) for a in _images())
    seed_keys = jnp.stack([jax.random.key(seed) for seed in settings.seeds])

    def one(name):
        m = _model(_BY_NAME[name], s, k, d, reference)
        # The seeds one after another (lax.map): a convolution vmapped over its weights becomes a grouped
        # convolution, which XLA on CPU runs far slower.
        run = jax.jit(lambda ks: jax.lax.map(lambda key: _run_one(m, key, x_train, x_test), ks))
        t0 = time.perf_counter()
        out = jax.tree.map(np.asarray, run(seed_keys))
        seconds = time.perf_counter() - t0
        say(
            f"   digits {name:>15} K={k:<5} d={d:<3} usage {np.mean(out['usage']):.3f} "
            f"mse {np.mean(out['val_mse']):.4f} ({seconds:.1f} s)"
        )
        rows = []
        for i, seed in enumerate(settings.seeds):
            row = {
                "setup": "reference",
                "variant": name,
                "codebook_size": k,
                "code_dim": d,
                "seed": seed,
                **{key: float(out[key][i]) for key in ("usage", "perplexity", "val_mse")},
            }
            row["perplexity_over_k"] = row["perplexity"] / k
            row["batch_usage"] = row["train_mse_end"] = row["mse_over_fsq"] = None
            rows.append(row)
        return rows, {"variant": name, "seconds": seconds}

    if workers == 1:
        results = [one(n) for n in names]
    else:
        with ThreadPoolExecutor(workers) as pool:
            results = list(pool.map(one, names))
    rows = [r for rs, _ in results for r in rs]
    fsq = [r["val_mse"] for r in rows if r["variant"] == "fsq"]
    for r in rows:
        r["mse_over_fsq"] = r["val_mse"] / float(np.mean(fsq)) if fsq else None
    summary = [
        {
            key: e[key]
            for key in (
                "variant",
                "codebook_size",
                "code_dim",
                "usage",
                "usage_std",
                "perplexity",
                "perplexity_over_k",
                "val_mse",
                "val_mse_std",
                "mse_over_fsq",
                "seeds",
            )
        }
        for e in summarize(rows)
    ]
    return {
        "rows": rows,
        "summary": summary,
        "codebook_size": k,
        "code_dim": d,
        "steps": settings.digits_steps,
        "programs": [info for _, info in results],
        "data": {
            "source": "scikit-learn digits, 8x8 images scaled to [0, 1]",
            "train_images": int(x_train.shape[0]),
            "test_images": int(x_test.shape[0]),
            "test_tokens": int(x_test.shape[0]) * _TOKENS,
            "tokens_per_image": _TOKENS,
        },
    }
