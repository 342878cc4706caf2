"""The digits autoencoder comparison: which quantiser and which codebook updates, at the same bits per image.

Every configuration encodes an 8x8 digit into ``tokens`` discrete codes, decodes
them back, and is trained with Adam on the reconstruction's mean squared error
(pixels scaled to [0, 1]). Each seed draws its own stratified split
(:func:`stejax.data.split`) and its own initialisation; the seeds of one
configuration run as one ``jit(vmap(...))`` program, whole epochs inside a
``lax.scan``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import platform
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from stejax import keys
from stejax.estimators.latent import gumbel_softmax_st, rotation_trick, vq_quantize
from stejax.vq._codebook import Codebook, CodebookState, _affine
from stejax.vq._fsq import FSQ
from stejax.vq._metrics import code_histogram, perplexity, quantization_error, usage

__all__ = [
    "CONFIGURATIONS",
    "QUICK",
    "AutoencoderConfig",
    "CompareSettings",
    "compare",
    "references",
]

QUANTIZERS = ("vq_ste", "rotation_trick", "fsq", "gumbel_softmax_st", "no_gradient")
CODEBOOKS = ("plain", "ema", "kmeans_dead_code", "none")
# The quantisers that use a Codebook (the others have no codes to initialise or replace).
CODEBOOK_QUANTIZERS = ("vq_ste", "rotation_trick", "no_gradient")


@dataclasses.dataclass(frozen=True)
class AutoencoderConfig:
    """One configuration of the comparison: a quantiser and how its codebook is kept.

    ``codebook``: ``"plain"`` (gradient-trained codes, codebook + commitment loss),
    ``"ema"`` (EMA codes, commitment loss only), ``"kmeans_dead_code"`` (EMA codes,
    k-means initialisation on the first examples, dead-code replacement), ``"none"`` (FSQ).
    """

    name: str
    quantizer: str
    codebook: str

    def __post_init__(self):
        if self.quantizer not in QUANTIZERS:
            raise ValueError(
                f"AutoencoderConfig {self.name!r}: quantizer must be one of {QUANTIZERS}; got {self.quantizer!r}."
            )
        if self.codebook not in CODEBOOKS:
            raise ValueError(
                f"AutoencoderConfig {self.name!r}: codebook must be one of {CODEBOOKS}; got {self.codebook!r}."
            )
        if self.codebook == "kmeans_dead_code" and self.quantizer not in CODEBOOK_QUANTIZERS:
            raise ValueError(
                f"AutoencoderConfig {self.name!r}: codebook 'kmeans_dead_code' needs a quantizer with a codebook, "
                f"one of {CODEBOOK_QUANTIZERS}; got {self.quantizer!r}."
            )


CONFIGURATIONS: tuple[AutoencoderConfig, ...] = (
    *(
        AutoencoderConfig(f"{q}-{c}", q, c)
        for q in ("vq_ste", "rotation_trick")
        for c in ("plain", "ema", "kmeans_dead_code")
    ),
    AutoencoderConfig("fsq", "fsq", "none"),
    AutoencoderConfig("gumbel_softmax_st", "gumbel_softmax_st", "plain"),
    AutoencoderConfig("no_gradient", "no_gradient", "plain"),
)


@dataclasses.dataclass(frozen=True)
class CompareSettings:
    """The comparison's fixed choices (defaults: the full tier).

    Every configuration has ``tokens * log2(codebook_size)`` bits per image (24):
    VQ and Gumbel use one shared codebook of ``codebook_size`` codes of
    ``code_dim`` entries; FSQ uses ``fsq_levels`` per token with
    ``prod(fsq_levels) == codebook_size``.

    The codes start at N(0, ``codebook_init_scale``²) (0.1: close to
    vector-quantize-pytorch's small uniform initialisation, standard deviation
    0.0625 for 64 x 8 codes; the encoder's initial outputs have ``||z||^2`` of 4
    to 6, about 0.8 per entry; at 1.0 a plain rotation-trick codebook collapses,
    its encoder's vectors shrinking to the origin). EMA decay ``decay``,
    dead-code threshold ``dead_code_threshold`` (vectors per step, of 256 per
    batch over 64 codes), Gumbel temperature annealed geometrically from
    ``tau_start`` to ``tau_end`` in ``tau_stages`` piecewise-constant stages.
    """

    seeds: tuple[int, ...] = (0, 1, 2)
    epochs: int = 150
    batch_size: int = 64
    hidden: int = 256
    tokens: int = 4
    codebook_size: int = 64
    code_dim: int = 8
    codebook_init_scale: float = 0.1
    fsq_levels: tuple[int, ...] = (4, 4, 4)
    learning_rate: float = 2e-3
    commitment_weight: float = 0.25
    decay: float = 0.95
    dead_code_threshold: float = 1.0
    kmeans_examples: int = 256
    kmeans_iters: int = 10
    tau_start: float = 1.0
    tau_end: float = 0.125
    tau_stages: int = 4
    pca_components: int = 8
    kmeans_reference_codes: int = 256
    n_pictures: int = 8

    def __post_init__(self):
        if math.prod(self.fsq_levels) != self.codebook_size:
            raise ValueError(
                f"CompareSettings: prod(fsq_levels) must equal codebook_size so every configuration has the same "
                f"bits; got fsq_levels={self.fsq_levels} (prod {math.prod(self.fsq_levels)}) and "
                f"codebook_size={self.codebook_size}."
            )
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"CompareSettings: `seeds` must be distinct ints, at least one; got {self.seeds!r}.")
        if self.epochs < 1:
            raise ValueError(f"CompareSettings: `epochs` must be >= 1; got {self.epochs!r}.")

    @property
    def bits_per_image(self) -> float:
        return self.tokens * math.log2(self.codebook_size)


# The smoke-test tier: two seeds (a standard deviation), two epochs.
QUICK = CompareSettings(seeds=(0, 1), epochs=2, kmeans_examples=128)


# ------------------------------------------------------------------------------------------------
# The network
# ------------------------------------------------------------------------------------------------


def _dense(key, fan_in, fan_out):
    w = jax.random.normal(keys.consume(key, where="vq compare: dense init"), (fan_in, fan_out), jnp.float32)
    return {"w": w * jnp.sqrt(2.0 / fan_in), "b": jnp.zeros((fan_out,), jnp.float32)}


def _mlp(params, x):
    h = jax.nn.relu(_affine(params["l1"], x))
    h = jax.nn.relu(_affine(params["l2"], h))
    return _affine(params["l3"], h)


def _mlp_init(key, sizes):
    ks = keys.split(key, 3, where="vq compare: mlp layers")
    return {f"l{i + 1}": _dense(ks[i], sizes[i], sizes[i + 1]) for i in range(3)}


def _no_gradient(z, codebook):
    """The nearest code with no gradient at all to ``z`` (the negative control)."""
    return jax.lax.stop_gradient(vq_quantize(z, codebook))


_ESTIMATORS: dict[str, Callable[..., jax.Array]] = {
    "vq_ste": vq_quantize,
    "rotation_trick": rotation_trick,
    "no_gradient": _no_gradient,
}


class _Model(NamedTuple):
    """The pieces of one configuration's autoencoder."""

    config: AutoencoderConfig
    settings: CompareSettings
    codebook: Codebook | None
    fsq: FSQ | None

    @property
    def latent_width(self) -> int:
        s = self.settings
        if self.config.quantizer == "fsq":
            return s.tokens * len(s.fsq_levels)
        if self.config.quantizer == "gumbel_softmax_st":
            return s.tokens * s.codebook_size
        return s.tokens * s.code_dim

    @property
    def decoder_width(self) -> int:
        s = self.settings
        return s.tokens * (len(s.fsq_levels) if self.config.quantizer == "fsq" else s.code_dim)


def _model(config: AutoencoderConfig, s: CompareSettings) -> _Model:
    codebook = None
    if config.quantizer in _ESTIMATORS:
        codebook = Codebook(
            codebook_size=s.codebook_size,
            dim=s.tokens * s.code_dim,
            heads=s.tokens,
            estimator=_ESTIMATORS[config.quantizer],
            update="ema" if config.codebook in ("ema", "kmeans_dead_code") else "gradient",
            decay=s.decay,
            dead_code_threshold=s.dead_code_threshold if config.codebook == "kmeans_dead_code" else 0.0,
            init_scale=s.codebook_init_scale,
        )
    return _Model(config, s, codebook, FSQ(s.fsq_levels) if config.quantizer == "fsq" else None)


def _init(m: _Model, key):
    s = m.settings
    k_enc, k_dec, k_q = keys.split(key, 3, where="vq compare: encoder, decoder, quantiser")
    params = {
        "encoder": _mlp_init(k_enc, (64, s.hidden, s.hidden, m.latent_width)),
        "decoder": _mlp_init(k_dec, (m.decoder_width, s.hidden, s.hidden, 64)),
    }
    state = CodebookState(jnp.zeros((0,)), jnp.zeros((0, 0)))
    if m.codebook is not None:
        params["codebook"], state = m.codebook.init(key=k_q)
    elif m.config.quantizer == "gumbel_softmax_st":
        e = jax.random.normal(keys.consume(k_q, where="vq compare: gumbel embedding"), (s.codebook_size, s.code_dim))
        params["embedding"] = e
    return params, state


class _Quantized(NamedTuple):
    latent: jax.Array  # (B, decoder_width): what the decoder reads
    indices: jax.Array  # (B, tokens) int32
    aux_loss: jax.Array  # ()
    error: jax.Array  # () quantisation error, mean over tokens of ||z - q||^2
    out: Any  # the CodebookOutput for VQ, else None
    norms: tuple[jax.Array, jax.Array]  # () each: mean over tokens of ||z||^2 and of ||q||^2 (the error's scale)


def _taus(s: CompareSettings) -> tuple[float, ...]:
    if s.tau_stages == 1:
        return (s.tau_start,)
    ratio = s.tau_end / s.tau_start
    return tuple(float(s.tau_start * ratio ** (i / (s.tau_stages - 1))) for i in range(s.tau_stages))


def _quantize(m: _Model, params, z, *, key=None, stage=None, train: bool) -> _Quantized:
    s = m.settings
    b = z.shape[0]
    if m.codebook is not None:
        out = m.codebook.quantize(params["codebook"], z)
        weight = 0.0 if m.config.quantizer == "no_gradient" else s.commitment_weight
        aux = m.codebook.loss(out, commitment_weight=weight)
        norms = (_mean_sq_norm(out.vectors), _mean_sq_norm(out.codes))
        return _Quantized(out.quantized, out.indices, aux, quantization_error(out.vectors, out.codes), out, norms)
    if m.fsq is not None:
        zt = z.reshape(b, s.tokens, len(s.fsq_levels))
        q = m.fsq(zt)
        bounded = jax.lax.stop_gradient(m.fsq.bounded(zt))
        err = quantization_error(bounded, q)
        norms = (_mean_sq_norm(bounded), _mean_sq_norm(q))
        return _Quantized(q.reshape(b, -1), m.fsq.codes_to_indices(q), jnp.zeros(()), err, None, norms)
    logits = z.reshape(b, s.tokens, s.codebook_size)
    embedding = params["embedding"]
    if train:
        branches = [(lambda lg, k, tau=tau: gumbel_softmax_st(lg, key=k, tau=tau)) for tau in _taus(s)]
        onehot = jax.lax.switch(stage, branches, logits, keys.consume(key, where="vq compare: gumbel noise"))
    else:  # evaluation: the most likely code, no noise
        onehot = jax.nn.one_hot(jnp.argmax(logits, axis=-1), s.codebook_size, dtype=logits.dtype)
    q = onehot @ embedding
    soft = jax.nn.softmax(logits, axis=-1) @ embedding
    err = quantization_error(jax.lax.stop_gradient(soft), jax.lax.stop_gradient(q))
    norms = (_mean_sq_norm(soft), _mean_sq_norm(q))
    indices = jnp.argmax(onehot, axis=-1).astype(jnp.int32)
    return _Quantized(q.reshape(b, -1), indices, jnp.zeros(()), err, None, norms)


def _mean_sq_norm(v):
    """Mean over vectors (the last axis is one vector) of ``||v||^2``, with no gradient: a statistic."""
    return jnp.mean(jnp.sum(jnp.square(jax.lax.stop_gradient(v)), axis=-1))


def _forward(m: _Model, params, x, **kw):
    z = _mlp(params["encoder"], x)
    qz = _quantize(m, params, z, **kw)
    recon = _mlp(params["decoder"], qz.latent)
    return recon, qz


# ------------------------------------------------------------------------------------------------
# Training: one seed, then vmapped over seeds
# ------------------------------------------------------------------------------------------------


def _loss(m: _Model, params, x, key, stage):
    """The training loss: reconstruction MSE plus the quantiser's auxiliary loss; ``(loss, (mse, quantized))``."""
    recon, qz = _forward(m, params, x, key=key, stage=stage, train=True)
    mse = jnp.mean(jnp.square(recon - x))
    return mse + qz.aux_loss, (mse, qz)


def _run_one(m: _Model, key, x_train, x_test):
    """Train one seed and evaluate it; pure, so it vmaps over (key, x_train, x_test)."""
    import optax

    s = m.settings
    adam = optax.adam(s.learning_rate)
    # optax mixes Python floats with int32 step counts (decay**count), which strict promotion refuses.
    optimizer = optax.GradientTransformation(_standard_promotion(adam.init), _standard_promotion(adam.update))
    k_init, k_kmeans, k_run = keys.split(key, 3, where="vq compare: seed -> init, kmeans, run")
    params, cb_state = _init(m, k_init)
    n = x_train.shape[0]
    n_batches = n // s.batch_size
    cb = m.codebook

    if m.config.codebook == "kmeans_dead_code":
        if cb is None:  # AutoencoderConfig allows kmeans_dead_code only with a codebook quantizer
            raise ValueError(f"vq compare: {m.config.name!r} uses kmeans_dead_code but has no codebook.")
        k_pick, k_means = keys.split(k_kmeans, where="vq compare: kmeans examples, means")
        first = x_train[jax.random.permutation(keys.consume(k_pick, where="vq compare: kmeans examples"), n)]
        first = first[: s.kmeans_examples]
        vectors = cb.project(params["codebook"], _mlp(params["encoder"], first))
        params["codebook"], cb_state = cb.kmeans_init(
            params["codebook"], cb_state, vectors, key=k_means, iters=s.kmeans_iters
        )
    opt_state = optimizer.init(params)

    def step(carry, inputs):
        p, o, st = carry
        x, k, stage = inputs
        k_q, k_dead = keys.split(k, where="vq compare: step -> quantiser, dead codes")
        (_, (mse, qz)), grads = jax.value_and_grad(_loss, argnums=1, has_aux=True)(m, p, x, k_q, stage)
        updates, o = optimizer.update(grads, o, p)
        p = optax.apply_updates(p, updates)
        replaced = jnp.zeros((), jnp.int32)
        if cb is not None:
            p["codebook"], st = cb.update_state(p["codebook"], st, qz.out)
            if cb.dead_code_threshold > 0:
                p["codebook"], st, dead = cb.replace_dead(p["codebook"], st, qz.out.vectors, key=k_dead)
                replaced = jnp.sum(dead).astype(jnp.int32)
        return (p, o, st), (mse, qz.indices, replaced)

    n_stages = s.tau_stages

    def epoch(carry, epoch_index):
        p, o, st, k = carry
        k, k_perm, k_steps = keys.split(k, 3, where="vq compare: epoch -> run, shuffle, steps")
        perm = jax.random.permutation(keys.consume(k_perm, where="vq compare: epoch shuffle"), n)
        perm = perm[: n_batches * s.batch_size]
        xb = x_train[perm].reshape(n_batches, s.batch_size, -1)
        step_keys = keys.split(k_steps, n_batches, where="vq compare: one key per step")
        stage = jnp.minimum(epoch_index * n_stages // s.epochs, n_stages - 1)
        stages = jnp.full((n_batches,), stage, jnp.int32)
        (p, o, st), (mse, idx, replaced) = jax.lax.scan(step, (p, o, st), (xb, step_keys, stages))
        hist = code_histogram(idx, s.codebook_size)
        per_epoch = {
            "train_mse": jnp.mean(mse),
            "usage": jnp.mean((hist > 0).astype(jnp.float32)),
            "dead_codes": jnp.sum(hist == 0).astype(jnp.int32),
            "replaced": jnp.sum(replaced),
        }
        return (p, o, st, k), per_epoch

    (params, _, cb_state, _), history = jax.lax.scan(epoch, (params, opt_state, cb_state, k_run), jnp.arange(s.epochs))
    recon, qz = _forward(m, params, x_test, train=False)
    return {
        "test_mse": jnp.mean(jnp.square(recon - x_test)),
        "usage": usage(qz.indices, s.codebook_size),
        "perplexity": perplexity(qz.indices, s.codebook_size),
        "quantization_error": qz.error,
        "latent_sq_norm": qz.norms[0],
        "code_sq_norm": qz.norms[1],
        "histogram": code_histogram(qz.indices, s.codebook_size),
        "reconstructions": recon[: s.n_pictures],
        "history": history,
    }


def _standard_promotion(fn):
    def wrapped(*args, **kwargs):
        with jax.numpy_dtype_promotion("standard"):
            return fn(*args, **kwargs)

    return wrapped


def _train_config(config: AutoencoderConfig, settings: CompareSettings, x_train, x_test) -> dict[str, np.ndarray]:
    m = _model(config, settings)
    seed_keys = jnp.stack([jax.random.key(s) for s in settings.seeds])
    run = jax.jit(jax.vmap(lambda k, a, b: _run_one(m, k, a, b)))
    return jax.tree.map(np.asarray, run(seed_keys, x_train, x_test))


# ------------------------------------------------------------------------------------------------
# References and data
# ------------------------------------------------------------------------------------------------


def _load(settings: CompareSettings, part: str = "test"):
    """``(x_train, x_eval)`` stacked over seeds; ``part="val"`` evaluates on the validation split (for tuning)."""
    from stejax.data import load_digits, split

    if part not in ("test", "val"):
        raise ValueError(f"vq compare: the evaluation part must be 'test' or 'val'; got {part!r}.")
    digits = load_digits()
    splits = [split(digits, seed=s) for s in settings.seeds]
    x_train = np.stack([sp.train.x / 16.0 for sp in splits]).astype(np.float32)
    x_eval = np.stack([getattr(sp, part).x / 16.0 for sp in splits]).astype(np.float32)
    return x_train, x_eval


def references(
    x_train: np.ndarray, x_test: np.ndarray, *, seed: int, pca_components: int = 8, kmeans_codes: int = 256
) -> dict[str, float]:
    """Test MSE of three non-learned-quantiser references fitted on one seed's training split.

    ``mean_image`` predicts the training mean; ``pca`` reconstructs from the top
    ``pca_components`` principal components (continuous); ``kmeans`` replaces an
    image by the nearest of ``kmeans_codes`` k-means centres (scikit-learn,
    k-means++, one initialisation, ``random_state=seed``): one token of
    ``log2(kmeans_codes)`` bits.
    """
    from sklearn.cluster import KMeans

    x_train, x_test = np.asarray(x_train, np.float64), np.asarray(x_test, np.float64)
    mean = x_train.mean(0)
    out = {"mean_image": float(np.mean((x_test - mean) ** 2))}
    _, _, vt = np.linalg.svd(x_train - mean, full_matrices=False)
    basis = vt[:pca_components]
    pca = (x_test - mean) @ basis.T @ basis + mean
    out["pca"] = float(np.mean((x_test - pca) ** 2))
    km = KMeans(kmeans_codes, n_init=1, random_state=seed).fit(x_train)
    out["kmeans"] = float(np.mean((x_test - km.cluster_centers_[km.predict(x_test)]) ** 2))
    return out


# ------------------------------------------------------------------------------------------------
# The comparison
# ------------------------------------------------------------------------------------------------


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    a = np.asarray(values, np.float64)
    return float(a.mean()), float(a.std(ddof=1)) if a.size > 1 else 0.0


def _targets(summary: dict[str, Any], per_seed: dict[str, Any], refs: dict[str, Any]) -> list[dict[str, Any]]:
    out = []

    def add(name, passed, detail):
        out.append({"name": name, "passed": bool(passed), "detail": detail})

    if "fsq" in summary:
        u = summary["fsq"]["usage_mean"]
        add("fsq usage >= 0.97", u >= 0.97, f"fsq usage {u:.4f}")
    for c in ("plain", "ema", "kmeans_dead_code"):
        a, b = f"rotation_trick-{c}", f"vq_ste-{c}"
        if a in per_seed and b in per_seed:
            pairs = [(r["usage"], s["usage"]) for r, s in zip(per_seed[a], per_seed[b], strict=True)]
            ok = all(r >= s for r, s in pairs)
            add(
                f"rotation_trick usage >= vq_ste usage, {c}, every seed",
                ok,
                "pairs (rotation, ste): " + ", ".join(f"({r:.3f}, {s:.3f})" for r, s in pairs),
            )
    learned = {k: v for k, v in summary.items() if v["quantizer"] != "no_gradient"}
    if learned:
        best = min(learned, key=lambda k: learned[k]["test_mse_mean"])
        mse = learned[best]["test_mse_mean"]
        for ref in ("kmeans", "pca"):
            r = refs[ref]["test_mse_mean"]
            add(f"best test MSE < {ref} reference", mse < r, f"{best}: {mse:.5f} vs {ref} {r:.5f}")
    for q in ("vq_ste", "rotation_trick"):
        name = f"{q}-kmeans_dead_code"
        if name in summary:
            u = summary[name]["usage_mean"]
            add(f"{name} usage >= 0.95", u >= 0.95, f"usage {u:.4f}")
    if "no_gradient" in summary:
        mse, ref = summary["no_gradient"]["test_mse_mean"], refs["mean_image"]["test_mse_mean"]
        # "near the mean image": within 25% of it (the decoder still learns the codes' averages).
        add("no_gradient MSE near the mean image (>= 0.75 x)", mse >= 0.75 * ref, f"{mse:.5f} vs mean image {ref:.5f}")
    return out


def _environment(settings: CompareSettings) -> dict[str, Any]:
    import jaxlib

    return {
        "platform": jax.default_backend(),
        "device": str(jax.devices()[0]),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "seeds": list(settings.seeds),
    }


def compare(
    settings: CompareSettings = CompareSettings(),
    *,
    configurations: Sequence[AutoencoderConfig] = CONFIGURATIONS,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Train every configuration on every seed and return the report (a JSON-ready dict).

    The report has ``summary`` (per configuration: ``quantizer``, ``codebook``,
    ``bits_per_image``, ``test_mse_mean``, ``test_mse_std``, ``usage_mean``,
    ``perplexity_mean``, ``quantization_error_mean``), ``references``
    (``mean_image``, ``pca``, ``kmeans``: ``test_mse_mean``, ``test_mse_std``,
    ``per_seed``), ``per_seed`` (per configuration, one entry per seed with the
    histories of usage and dead codes per epoch), ``targets``, ``settings`` and
    ``environment``, and ``pictures`` (arrays for :func:`write_report`, removed
    from the JSON).
    """
    import time

    say = progress or (lambda _: None)
    x_train, x_test = _load(settings)
    refs_per_seed = [
        references(
            x_train[i],
            x_test[i],
            seed=s,
            pca_components=settings.pca_components,
            kmeans_codes=settings.kmeans_reference_codes,
        )
        for i, s in enumerate(settings.seeds)
    ]
    refs = {}
    for name in ("mean_image", "pca", "kmeans"):
        values = [r[name] for r in refs_per_seed]
        mean, std = _mean_std(values)
        refs[name] = {"test_mse_mean": mean, "test_mse_std": std, "per_seed": values}
    refs["pca"]["components"] = settings.pca_components
    refs["kmeans"]["codes"] = settings.kmeans_reference_codes
    refs["kmeans"]["bits_per_image"] = math.log2(settings.kmeans_reference_codes)
    say("references: " + ", ".join(f"{k} {v['test_mse_mean']:.5f}" for k, v in refs.items()))

    summary, per_seed, pictures = {}, {}, {"originals": x_test[0, : settings.n_pictures], "reconstructions": {}}
    histories, histograms, timings = {}, {}, {}
    for config in configurations:
        t0 = time.perf_counter()
        r = _train_config(config, settings, x_train, x_test)
        seconds = time.perf_counter() - t0
        rows: list[dict[str, Any]] = []
        for i, seed in enumerate(settings.seeds):
            rows.append(
                {
                    "seed": seed,
                    "test_mse": float(r["test_mse"][i]),
                    "usage": float(r["usage"][i]),
                    "perplexity": float(r["perplexity"][i]),
                    "quantization_error": float(r["quantization_error"][i]),
                    "latent_sq_norm": float(r["latent_sq_norm"][i]),
                    "code_sq_norm": float(r["code_sq_norm"][i]),
                    "usage_per_epoch": [float(v) for v in r["history"]["usage"][i]],
                    "dead_codes_per_epoch": [int(v) for v in r["history"]["dead_codes"][i]],
                    "replaced_per_epoch": [int(v) for v in r["history"]["replaced"][i]],
                    "train_mse_per_epoch": [float(v) for v in r["history"]["train_mse"][i]],
                }
            )
        for row in rows:
            for key in ("test_mse", "quantization_error", "perplexity"):
                if not math.isfinite(row[key]):
                    raise FloatingPointError(
                        f"vq compare: configuration {config.name!r}, seed {row['seed']}: {key} is {row[key]}; "
                        f"training diverged."
                    )
        mse_mean, mse_std = _mean_std([row["test_mse"] for row in rows])
        summary[config.name] = {
            "quantizer": config.quantizer,
            "codebook": config.codebook,
            "bits_per_image": settings.bits_per_image,
            "test_mse_mean": mse_mean,
            "test_mse_std": mse_std,
            "usage_mean": float(np.mean([row["usage"] for row in rows])),
            "perplexity_mean": float(np.mean([row["perplexity"] for row in rows])),
            "quantization_error_mean": float(np.mean([row["quantization_error"] for row in rows])),
        }
        timings[config.name] = seconds
        per_seed[config.name] = rows
        pictures["reconstructions"][config.name] = r["reconstructions"][0]
        histories[config.name] = r["history"]["usage"].mean(0)
        histograms[config.name] = r["histogram"][0]
        say(
            f"{config.name}: test MSE {mse_mean:.5f} ± {mse_std:.5f}, usage {summary[config.name]['usage_mean']:.3f}, "
            f"{seconds:.1f} s"
        )
    pictures["usage_per_epoch"] = histories
    pictures["histograms"] = histograms
    settings_dict = dataclasses.asdict(settings)
    return {
        "summary": summary,
        "references": refs,
        "per_seed": per_seed,
        "targets": _targets(summary, per_seed, refs),
        "settings": settings_dict,
        "environment": {**_environment(settings), "seconds_per_configuration": timings},
        "pictures": pictures,
    }
