"""Where codebooks collapse: VQ variants against FSQ over a grid of codebook sizes and code dimensions.

Every variant runs under each named codebook set-up (:data:`SETUPS`: how the codes
start, how they learn, the loss weights), so that a variant is compared with the
others under the same codebook handling. Every variant trains the same small
autoencoder on an unlimited synthetic source (a fixed random MLP from 8-D
Gaussians to 16-D vectors, standardised), one token per vector: encoder,
quantiser, decoder, Adam on the reconstruction's mean squared error plus the
quantiser's own loss. Each step draws a fresh batch, so the number of distinct
training tokens is ``steps * batch_size`` and never caps the codes in use; the
validation epoch is a fixed set of ``val_size`` vectors.

For each set-up, codebook size ``K`` and code dimension ``d`` of the grid, the
seeds of one variant run as one ``jit(vmap(...))`` program (the collapse
diagnostics on the validation epoch, the whole training in a ``lax.scan``, then
the validation epoch again), compiled once. FSQ has no codebook: it runs once per
``K`` and ``d`` and its rows stand in every set-up's table.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from stejax import keys
from stejax.estimators.latent import rotation_trick, vq_quantize
from stejax.vq._codebook import CODE_INITS, Codebook, CodebookState, _affine
from stejax.vq._fsq import FSQ
from stejax.vq._metrics import batch_usage, perplexity, usage

__all__ = [
    "QUICK",
    "SETUPS",
    "VARIANTS",
    "CompareSettings",
    "Setup",
    "Variant",
    "fsq_levels_for",
    "judge_targets",
    "run_grid",
]


@dataclasses.dataclass(frozen=True)
class Setup:
    """How the codebook of every VQ variant starts and learns, and the loss weights.

    Attributes:
      name: the set-up's name in the report.
      code_init: the initial codes, :class:`~stejax.vq.Codebook`'s ``code_init``.
      init_scale: their scale (None: the default of ``code_init``).
      update: how the codes learn: ``"ema"`` (no codebook loss) or ``"gradient"``
        (the codebook loss, by the run's Adam). A variant that names its own
        update (``ema``, ``dead_ema``) keeps it.
      decay: the EMA decay of the statistics (codes and dead-code counts).
      eps: the Laplace smoothing of EMA codes.
      commitment_weight: :math:`\beta` of the commitment loss.
      codebook_weight: the weight of the codebook loss (gradient-trained codes).
      description: one line for the report.
    """

    name: str
    code_init: str
    init_scale: float | None
    update: str
    decay: float
    eps: float = 1e-5
    commitment_weight: float = 0.25
    codebook_weight: float = 1.0
    description: str = ""


SETUPS: tuple[Setup, ...] = (
    Setup(
        "reference",
        code_init="kaiming_uniform",
        init_scale=None,
        update="ema",
        decay=0.8,
        commitment_weight=1.0,
        description="EMA codes (decay 0.8, eps 1e-5), Kaiming-uniform initial codes, commitment weight 1.0: "
        "the rotation trick's authors and vector-quantize-pytorch",
    ),
    Setup(
        "gradient",
        code_init="uniform",
        init_scale=None,
        update="gradient",
        decay=0.8,
        commitment_weight=0.25,
        description="codes trained by the codebook loss, initial codes U(±1/K), codebook weight 1 and "
        "commitment weight 0.25: taming-transformers' VQGAN",
    ),
    Setup(
        "wide-init",
        code_init="normal",
        init_scale=1.0,
        update="gradient",
        decay=0.99,
        commitment_weight=0.25,
        description="codes drawn from N(0, 1), far from a d = 32 latent, trained by the codebook loss; "
        "EMA statistics with decay 0.99",
    ),
)
_SETUP_BY_NAME = {u.name: u for u in SETUPS}


@dataclasses.dataclass(frozen=True)
class Variant:
    """One way of training the quantiser.

    Attributes:
      name: the variant's name in the report.
      quantizer: ``"vq"`` (a :class:`~stejax.vq.Codebook`) or ``"fsq"``.
      estimator: ``"ste"`` (:func:`stejax.vq_quantize`), ``"rotation"``
        (:func:`stejax.rotation_trick`) or ``"none"`` (no gradient to the encoder at
        all, and no commitment loss: the negative control).
      update: ``None`` (the set-up's), ``"gradient"`` (codebook loss) or ``"ema"`` codes.
      seeding: ``"setup"`` (the set-up's initial codes) or ``"kmeans++"`` (k-means++
        then Lloyd on the initial encoder's vectors).
      dead_codes: replace codes whose EMA usage falls below the threshold.
      distance: ``"euclidean"`` or ``"cosine"`` (l2-normalised vectors and codes).
      low_dim: look codes up in ``CompareSettings.lookup_dim`` dimensions through a
        linear projection in and out (a factorised codebook).
      description: one line for the report.
    """

    name: str
    quantizer: str = "vq"
    estimator: str = "ste"
    update: str | None = None
    seeding: str = "setup"
    dead_codes: bool = False
    distance: str = "euclidean"
    low_dim: bool = False
    description: str = ""


VARIANTS: tuple[Variant, ...] = (
    Variant("ste", description="straight-through"),
    Variant("rotation", estimator="rotation", description="rotation trick"),
    Variant("ema", update="ema", description="straight-through, EMA codes whatever the set-up"),
    Variant("kmeans", seeding="kmeans++", description="straight-through, codes from k-means++ and Lloyd"),
    Variant("dead", dead_codes=True, description="straight-through, dead-code replacement"),
    Variant(
        "dead_ema", update="ema", dead_codes=True, description="EMA codes whatever the set-up, dead-code replacement"
    ),
    Variant(
        "dead_rotation", estimator="rotation", dead_codes=True, description="rotation trick, dead-code replacement"
    ),
    Variant(
        "kmeans_rotation",
        estimator="rotation",
        seeding="kmeans++",
        description="rotation trick, codes from k-means++ and Lloyd",
    ),
    Variant("cosine", distance="cosine", description="straight-through, l2-normalised vectors and codes"),
    Variant("low_dim", low_dim=True, description="straight-through, lookup in a low-dimensional projection"),
    Variant("fsq", quantizer="fsq", estimator="ste", description="FSQ at the same number of codes"),
    Variant("no_gradient", estimator="none", description="negative control: no gradient to the encoder"),
)
_BY_NAME = {v.name: v for v in VARIANTS}

# FSQ levels with exactly K codes for the grid's sizes (2^6, 2^9, 2^12).
_FSQ_MATCHED: dict[int, tuple[int, ...]] = {64: (4, 4, 4), 512: (8, 8, 8), 4096: (8, 8, 8, 8)}


def fsq_levels_for(codebook_size: int) -> tuple[int, ...]:
    """FSQ levels with exactly ``codebook_size`` codes: 2^6 (4, 4, 4), 2^9 (8, 8, 8), 2^12 (8, 8, 8, 8).

    Any other power of two ``2^n`` gets ``n // 3`` channels of 8 levels and one of
    ``2^(n mod 3)`` levels when that is not 1.

    Example:
      >>> from stejax.vq import fsq_levels_for
      >>> fsq_levels_for(4096), fsq_levels_for(128)
      ((8, 8, 8, 8), (8, 8, 2))
    """
    if codebook_size in _FSQ_MATCHED:
        return _FSQ_MATCHED[codebook_size]
    n = round(math.log2(codebook_size)) if codebook_size >= 2 else 0
    if codebook_size < 4 or 2**n != codebook_size:
        raise ValueError(f"fsq_levels_for: the codebook size must be a power of two >= 4; got {codebook_size!r}.")
    levels = (8,) * (n // 3) + ((2 ** (n % 3),) if n % 3 else ())
    return levels


@dataclasses.dataclass(frozen=True)
class CompareSettings:
    """The comparison's fixed choices (defaults: the full grid).

    The data: ``x = standardise(tanh(g W_1 + b_1) W_2)`` with ``g ~ N(0, I_8)`` and a
    fixed random ``W_1`` (8 x 64), ``b_1``, ``W_2`` (64 x 16) drawn from
    ``data_seed`` (the same source for every seed and variant). The network: an
    MLP encoder 16-``hidden``-``hidden``-``d``, the quantiser, an MLP decoder
    ``d``-``hidden``-``hidden``-16 (ReLU). Each set-up of ``setups`` (names from
    :data:`SETUPS`) fixes how the codes start, how they learn, the EMA decay and the
    loss weights; ``init_scale``, when given, replaces every set-up's scale of the
    initial codes (the bound of uniform codes, the deviation of normal ones). Adam
    at ``learning_rate`` trains the network (and gradient-trained codes). A code is
    dead when its EMA count falls below ``dead_fraction`` of the count it would
    have under uniform use (``dead_fraction * batch_size / K`` vectors per step);
    it is then replaced by a vector of the batch. k-means++ runs on
    ``kmeans_per_code * K`` vectors (at most ``kmeans_max``) of the initial
    encoder, then ``kmeans_iters`` Lloyd iterations. ``low_dim`` looks codes up in
    ``lookup_dim`` dimensions. FSQ projects the ``d``-wide latent linearly to
    ``len(levels)`` channels and back (:func:`fsq_levels_for`). ``repeat_first``
    runs the first program a second time to count its compilations on known
    shapes (none expected).

    ``digits`` adds the real-data check: a small
    convolutional VQ-VAE on scikit-learn's 8x8 digits with ``digits_codebook_size``
    codes of dimension ``digits_code_dim``, every VQ variant under the ``reference``
    set-up and FSQ at the same number of codes, ``digits_steps`` steps.
    """

    seeds: tuple[int, ...] = (0, 1, 2)
    codebook_sizes: tuple[int, ...] = (512, 4096)
    code_dims: tuple[int, ...] = (32,)
    variants: tuple[str, ...] = tuple(v.name for v in VARIANTS)
    setups: tuple[str, ...] = tuple(u.name for u in SETUPS)
    steps: int = 1000
    batch_size: int = 256
    hidden: int = 64
    source_dim: int = 8
    data_dim: int = 16
    data_seed: int = 20240
    val_size: int = 32768
    init_scale: float | None = None
    learning_rate: float = 1e-3
    dead_fraction: float = 0.1
    kmeans_per_code: int = 4
    kmeans_max: int = 16384
    kmeans_iters: int = 10
    lookup_dim: int = 4
    repeat_first: bool = True
    digits: bool = True
    digits_steps: int = 800
    digits_codebook_size: int = 512
    digits_code_dim: int = 16

    def __post_init__(self):
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"CompareSettings: `seeds` must be distinct ints, at least one; got {self.seeds!r}.")
        unknown = [v for v in self.variants if v not in _BY_NAME]
        if unknown or not self.variants:
            raise ValueError(
                f"CompareSettings: unknown variant(s) {unknown}; expected names from {', '.join(_BY_NAME)}."
            )
        unknown_setups = [u for u in self.setups if u not in _SETUP_BY_NAME]
        if unknown_setups or not self.setups or len(set(self.setups)) != len(self.setups):
            raise ValueError(
                f"CompareSettings: unknown or repeated set-up(s) {unknown_setups or list(self.setups)}; "
                f"expected distinct names from {', '.join(_SETUP_BY_NAME)}."
            )
        if self.init_scale is not None and not self.init_scale > 0:
            raise ValueError(f"CompareSettings: `init_scale` must be > 0 or None; got {self.init_scale!r}.")
        for k in self.codebook_sizes:
            fsq_levels_for(k)
        if not self.code_dims or any(d < 1 for d in self.code_dims):
            raise ValueError(f"CompareSettings: `code_dims` must be positive ints; got {self.code_dims!r}.")
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError(
                f"CompareSettings: `steps` and `batch_size` must be >= 1; got {self.steps!r}, {self.batch_size!r}."
            )
        if self.val_size < self.batch_size or self.val_size % self.batch_size:
            raise ValueError(
                f"CompareSettings: `val_size` must be a multiple of `batch_size` ({self.batch_size}); "
                f"got {self.val_size!r}."
            )


# The speed run: all variants and set-ups, K = 64, d = 8, two seeds, 200 steps, no digits check.
QUICK = CompareSettings(seeds=(0, 1), codebook_sizes=(64,), code_dims=(8,), steps=200, val_size=4096, digits=False)


# ------------------------------------------------------------------------------------------------
# The data: a fixed random MLP of Gaussians
# ------------------------------------------------------------------------------------------------


class Source(NamedTuple):
    """The synthetic source's fixed weights and its standardisation."""

    w1: jax.Array  # (source_dim, 64)
    b1: jax.Array  # (64,)
    w2: jax.Array  # (64, data_dim)
    mean: jax.Array  # (data_dim,)
    std: jax.Array  # (data_dim,)


def make_source(s: CompareSettings) -> Source:
    """The fixed random MLP of ``data_seed``, standardised on 65,536 of its samples."""
    k1, kb, k2, kn = keys.split(jax.random.key(s.data_seed), 4, where="vq compare: source weights")
    w1 = jax.random.normal(keys.consume(k1, where="source w1"), (s.source_dim, 64)) / math.sqrt(s.source_dim) * 2.0
    b1 = jax.random.normal(keys.consume(kb, where="source b1"), (64,)) * 0.5
    w2 = jax.random.normal(keys.consume(k2, where="source w2"), (64, s.data_dim)) / math.sqrt(64)
    raw = Source(w1, b1, w2, jnp.zeros((s.data_dim,)), jnp.ones((s.data_dim,)))
    x = sample(raw, kn, 65536, s.source_dim)
    return raw._replace(mean=jnp.mean(x, axis=0), std=jnp.std(x, axis=0))


def sample(source: Source, key: jax.Array, n: int, source_dim: int) -> jax.Array:
    """``n`` standardised vectors of the source."""
    g = jax.random.normal(keys.consume(key, where="vq compare: source draw"), (n, source_dim))
    x = jnp.tanh(g @ source.w1 + source.b1[None, :]) @ source.w2
    return (x - source.mean[None, :]) / source.std[None, :]


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
    "ste": vq_quantize,
    "rotation": rotation_trick,
    "none": _no_gradient,
}


class _Model(NamedTuple):
    variant: Variant
    setup: Setup
    settings: CompareSettings
    codebook_size: int
    code_dim: int
    codebook: Codebook | None
    fsq: FSQ | None


def _codebook_init(setup: Setup, s: CompareSettings) -> tuple[str, float | None]:
    """The set-up's ``code_init`` and ``init_scale``, with the settings' scale override."""
    if s.init_scale is None:
        return setup.code_init, setup.init_scale
    return ("uniform" if setup.code_init == "kaiming_uniform" else setup.code_init), s.init_scale


def _model(
    variant: Variant, s: CompareSettings, codebook_size: int, code_dim: int, setup: Setup | str = "reference"
) -> _Model:
    setup = _SETUP_BY_NAME[setup] if isinstance(setup, str) else setup
    if variant.quantizer == "fsq":
        return _Model(variant, setup, s, codebook_size, code_dim, None, FSQ(fsq_levels_for(codebook_size)))
    code_init, init_scale = _codebook_init(setup, s)
    codebook = Codebook(
        codebook_size=codebook_size,
        dim=code_dim,
        codebook_dim=min(s.lookup_dim, code_dim) if variant.low_dim else code_dim,
        distance=variant.distance,
        estimator=_ESTIMATORS[variant.estimator],
        update=variant.update or setup.update,
        decay=setup.decay,
        eps=setup.eps,
        dead_code_threshold=s.dead_fraction * s.batch_size / codebook_size if variant.dead_codes else 0.0,
        code_init=code_init,
        init_scale=init_scale,
        lookup="matmul",
    )
    return _Model(variant, setup, s, codebook_size, code_dim, codebook, None)


def _runs_in(variant: Variant, setup: Setup) -> bool:
    """Whether ``variant`` is a distinct run under ``setup``: an EMA variant in an EMA set-up is its STE twin."""
    return not (variant.update is not None and variant.update == setup.update)


def _init(m: _Model, key):
    s = m.settings
    k_enc, k_dec, k_q = keys.split(key, 3, where="vq compare: encoder, decoder, quantiser")
    params: dict[str, Any] = {
        "encoder": _mlp_init(k_enc, (s.data_dim, s.hidden, s.hidden, m.code_dim)),
        "decoder": _mlp_init(k_dec, (m.code_dim, s.hidden, s.hidden, s.data_dim)),
    }
    state = CodebookState(jnp.zeros((0,)), jnp.zeros((0, 0)), jnp.zeros((), jnp.int32))
    if m.codebook is not None:
        params["codebook"], state = m.codebook.init(key=k_q)
        # The statistics start at uniform use (batch / K per code and step), so that dead-code
        # replacement judges a code by its own use from the first steps on.
        start = jnp.float32(s.batch_size / m.codebook_size)
        codes = m.codebook.codes(params["codebook"]).astype(jnp.float32)
        state = state._replace(cluster_size=jnp.full((m.codebook_size,), start), embed_sum=codes * start)
    elif m.fsq is not None:
        k_in, k_out = keys.split(k_q, where="vq compare: fsq projections")
        params["fsq"] = {
            "project_in": _linear(k_in, m.code_dim, m.fsq.dim),
            "project_out": _linear(k_out, m.fsq.dim, m.code_dim),
        }
    return params, state


def _linear(key, fan_in, fan_out):
    w = jax.random.normal(keys.consume(key, where="vq compare: projection init"), (fan_in, fan_out), jnp.float32)
    return {"w": w / jnp.sqrt(jnp.float32(fan_in)), "b": jnp.zeros((fan_out,), jnp.float32)}


class _Quantized(NamedTuple):
    latent: jax.Array  # (B, d): what the decoder reads
    indices: jax.Array  # (B,) int32
    aux_loss: jax.Array  # ()
    out: Any  # the CodebookOutput for VQ, else None
    vectors: jax.Array  # (B, d'): what is quantised (projected, normalised for cosine)
    codes: jax.Array  # (B, d'): the code each vector got


def _quantize(m: _Model, params, z) -> _Quantized:
    if m.codebook is not None:
        out = m.codebook.quantize(params["codebook"], z)
        weight = 0.0 if m.variant.estimator == "none" else m.setup.commitment_weight
        aux = m.codebook.loss(out, commitment_weight=weight, codebook_weight=m.setup.codebook_weight)
        return _Quantized(out.quantized, out.indices[:, 0], aux, out, out.vectors[:, 0], out.codes[:, 0])
    if m.fsq is None:  # _model makes one or the other
        raise ValueError(f"vq compare: variant {m.variant.name!r} has neither a codebook nor FSQ.")
    v = _affine(params["fsq"]["project_in"], z)
    q = m.fsq(v)
    latent = _affine(params["fsq"]["project_out"], q)
    return _Quantized(latent, m.fsq.codes_to_indices(q), jnp.zeros(()), None, v, q)


def _forward(m: _Model, params, x):
    qz = _quantize(m, params, _mlp(params["encoder"], x))
    return _mlp(params["decoder"], qz.latent), qz


def _forward_with_latent(m: _Model, params, x):
    z = _mlp(params["encoder"], x)
    qz = _quantize(m, params, z)
    return _mlp(params["decoder"], qz.latent), qz, z


def _loss(m: _Model, params, x):
    """Reconstruction MSE plus the quantiser's auxiliary loss; ``(loss, (mse, quantized))``."""
    recon, qz = _forward(m, params, x)
    mse = jnp.mean(jnp.square(recon - x))
    return mse + qz.aux_loss, (mse, qz)


def _standard_promotion(fn):
    def wrapped(*args, **kwargs):
        with jax.numpy_dtype_promotion("standard"):
            return fn(*args, **kwargs)

    return wrapped


def _run_one(m: _Model, key, source: Source, x_val):
    """Train one seed and evaluate it on the validation epoch; pure, so it vmaps over ``key``."""
    import optax

    s = m.settings
    adam = optax.adam(s.learning_rate)
    # optax mixes Python floats with int32 step counts (decay**count), which strict promotion refuses.
    optimizer = optax.GradientTransformation(_standard_promotion(adam.init), _standard_promotion(adam.update))
    k_init, k_kmeans, k_run = keys.split(key, 3, where="vq compare: seed -> init, kmeans, run")
    params, cb_state = _init(m, k_init)
    cb = m.codebook
    if cb is not None and m.variant.seeding == "kmeans++":
        k_data, k_means = keys.split(k_kmeans, where="vq compare: kmeans data, seeding")
        n = min(s.kmeans_per_code * m.codebook_size, max(s.kmeans_max, m.codebook_size))
        vectors = cb.project(params["codebook"], _mlp(params["encoder"], sample(source, k_data, n, s.source_dim)))
        params["codebook"], _ = cb.kmeans_init(
            params["codebook"], cb_state, vectors, key=k_means, iters=s.kmeans_iters, seeding="kmeans++"
        )
        start = jnp.float32(s.batch_size / m.codebook_size)
        cb_state = cb_state._replace(
            embed_sum=cb.codes(params["codebook"]).astype(jnp.float32) * start,
            code_init=jnp.int32(CODE_INITS.index("kmeans")),
        )
    before = _evaluate(m, params, x_val)
    opt_state = optimizer.init(params)
    track = cb is not None and (cb.update == "ema" or cb.dead_code_threshold > 0)

    def step(carry, k):
        p, o, st = carry
        k_x, k_dead = keys.split(k, where="vq compare: step -> batch, dead codes")
        x = sample(source, k_x, s.batch_size, s.source_dim)
        (_, (mse, qz)), grads = jax.value_and_grad(_loss, argnums=1, has_aux=True)(m, p, x)
        updates, o = optimizer.update(grads, o, p)
        p = optax.apply_updates(p, updates)
        replaced = jnp.zeros((), jnp.int32)
        if cb is not None and track:
            p["codebook"], st = cb.update_state(p["codebook"], st, qz.out)
            if cb.dead_code_threshold > 0:
                p["codebook"], st, dead = cb.replace_dead(p["codebook"], st, qz.out.vectors, key=k_dead)
                replaced = jnp.sum(dead).astype(jnp.int32)
        return (p, o, st), (mse, replaced)

    step_keys = keys.split(k_run, s.steps, where="vq compare: one key per step")
    (params, _, _), (mse, replaced) = jax.lax.scan(step, (params, opt_state, cb_state), step_keys)
    after = _evaluate(m, params, x_val)
    return {
        **{key: after[key] for key in _END_ONLY},
        **{f"{key}_start": before[key] for key in _DIAGNOSTICS},
        **{f"{key}_end": after[key] for key in _DIAGNOSTICS},
        "train_mse_end": jnp.mean(mse[-max(1, s.steps // 10) :]),
        "replaced": jnp.sum(replaced),
    }


# The collapse diagnostics, measured before training and after it.
_DIAGNOSTICS = ("usage", "z_norm", "q_norm_used", "q_norm_all", "quant_error", "cosine")
_END_ONLY = ("usage", "batch_usage", "perplexity", "val_mse")


def _evaluate(m: _Model, params, x_val):
    """The validation epoch in batches of ``batch_size``: usage (whole epoch and per batch), perplexity, MSE and
    the collapse diagnostics (means over the epoch's vectors; a NaN where a diagnostic has no meaning)."""
    s = m.settings
    k = m.codebook_size
    batches = x_val.reshape(-1, s.batch_size, s.data_dim)

    def one(x):
        recon, qz, z = _forward_with_latent(m, params, x)
        v, q = qz.vectors.astype(jnp.float32), qz.codes.astype(jnp.float32)
        norm_v, norm_q = jnp.linalg.norm(v, axis=-1), jnp.linalg.norm(q, axis=-1)
        cos = jnp.sum(v * q, axis=-1) / jnp.maximum(norm_v * norm_q, 1e-12)
        sums = jnp.stack([jnp.sum(jnp.linalg.norm(z, axis=-1)), jnp.sum(jnp.linalg.norm(v - q, axis=-1)), jnp.sum(cos)])
        return qz.indices, jnp.sum(jnp.square(recon - x)), sums

    indices, err, sums = jax.lax.map(one, batches)
    n = x_val.shape[0]
    z_norm, quant_error, cosine = jnp.sum(sums, axis=0) / n
    if m.codebook is not None:
        norms = jnp.linalg.norm(m.codebook.codes(params["codebook"]).astype(jnp.float32), axis=-1)
        used = jnp.bincount(indices.reshape(-1), length=k) > 0
        q_norm_all = jnp.mean(norms)
        q_norm_used = jnp.sum(jnp.where(used, norms, 0.0)) / jnp.maximum(jnp.sum(used.astype(jnp.float32)), 1.0)
    else:  # FSQ's codes are a fixed grid: no codebook to measure
        q_norm_all = q_norm_used = jnp.float32(jnp.nan)
    return {
        "usage": usage(indices, k),
        "batch_usage": batch_usage(indices, k),
        "perplexity": perplexity(indices, k),
        "val_mse": jnp.sum(err) / x_val.size,
        "z_norm": z_norm,
        "q_norm_used": q_norm_used,
        "q_norm_all": q_norm_all,
        "quant_error": quant_error,
        "cosine": cosine,
    }


# ------------------------------------------------------------------------------------------------
# The comparison
# ------------------------------------------------------------------------------------------------


def _program(m: _Model):
    return jax.jit(jax.vmap(lambda k, src, xv: _run_one(m, k, src, xv), in_axes=(0, None, None)))


def data_cap(s: CompareSettings, x_val: np.ndarray) -> dict[str, Any]:
    """How many distinct tokens the data has: per validation epoch (counted) and in training (drawn fresh)."""
    distinct = int(np.unique(np.asarray(x_val), axis=0).shape[0])
    return {
        "source": f"tanh MLP {s.source_dim}-64-{s.data_dim} of N(0, I_{s.source_dim}), standardised",
        "val_tokens": int(x_val.shape[0]),
        "val_distinct_tokens": distinct,
        "train_tokens": s.steps * s.batch_size,
        "train_distinct_tokens": s.steps * s.batch_size,
        "max_codebook_size": max(s.codebook_sizes),
        "val_tokens_per_code": x_val.shape[0] / max(s.codebook_sizes),
    }


def jobs_of(s: CompareSettings) -> list[tuple[str | None, str, int, int]]:
    """The programs of a run, in order: ``(setup, variant, K, d)``; FSQ once per ``K`` and ``d`` (set-up None)."""
    jobs: list[tuple[str | None, str, int, int]] = []
    for setup in s.setups:
        for d in s.code_dims:
            for k in s.codebook_sizes:
                for name in s.variants:
                    variant = _BY_NAME[name]
                    if variant.quantizer == "fsq":
                        if setup == s.setups[0]:
                            jobs.append((None, name, k, d))
                    elif _runs_in(variant, _SETUP_BY_NAME[setup]):
                        jobs.append((setup, name, k, d))
    return jobs


def run_grid(
    settings: CompareSettings = CompareSettings(),
    *,
    workers: int = 1,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The synthetic grid of :func:`stejax.vq.compare`: its report, with ``digits`` None and the targets judged
    without the real-data check (``compare`` adds both)."""
    from concurrent.futures import ThreadPoolExecutor

    from stejax.bench import CompileCounter

    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"vq compare: `workers` must be a positive int; got {workers!r}.")
    say = progress or (lambda _: None)
    s = settings
    source = make_source(s)
    x_val = sample(source, jax.random.key(s.data_seed + 1), s.val_size, s.source_dim)
    x_val.block_until_ready()
    cap = data_cap(s, np.asarray(x_val))
    seed_keys = jnp.stack([jax.random.key(seed) for seed in s.seeds])
    jobs = jobs_of(s)

    def one(job, count: bool):
        setup, name, k, code_dim = job
        run = _program(_model(_BY_NAME[name], s, k, code_dim, setup or s.setups[0]))
        t0 = time.perf_counter()
        if count:
            with CompileCounter() as first:
                out = jax.tree.map(np.asarray, run(seed_keys, source, x_val))
        else:
            out = jax.tree.map(np.asarray, run(seed_keys, source, x_val))
        info: dict[str, Any] = {
            "setup": setup,
            "variant": name,
            "codebook_size": k,
            "code_dim": code_dim,
            "seconds": time.perf_counter() - t0,
            "compiles": first.count if count else None,
        }
        if count and s.repeat_first and job == jobs[0]:
            with CompileCounter() as again:  # the same shapes: the cached executable, no compilation
                jax.tree.map(np.asarray, run(seed_keys, source, x_val))
            info["compiles_again"] = again.count
        rows = _rows(setup, name, k, code_dim, s, out)
        say(
            f"{setup or 'any':>9} {name:>15} K={k:<5} d={code_dim:<3} usage {np.mean(out['usage']):.3f} "
            f"(start {np.mean(out['usage_start']):.3f}) mse {np.mean(out['val_mse']):.4f} "
            f"|z| {np.mean(out['z_norm_start']):.2f}->{np.mean(out['z_norm_end']):.2f} "
            f"({info['seconds']:.1f} s" + (f", {info['compiles']} compilation(s))" if count else ")")
        )
        return rows, info

    t_start = time.perf_counter()
    with CompileCounter() as total:
        if workers == 1:
            results = [one(job, True) for job in jobs]
        else:
            with ThreadPoolExecutor(workers) as pool:
                results = list(pool.map(lambda job: one(job, False), jobs))
    rows = share_fsq([r for rs, _ in results for r in rs], s.setups)
    _add_fsq_ratios(rows)
    summary = summarize(rows)
    digits = None
    return {
        "rows": rows,
        "summary": summary,
        "targets": judge_targets(summary, s, digits=digits),
        "digits": digits,
        "data": cap,
        "programs": [info for _, info in results],
        "compiles": total.count,
        "seconds": time.perf_counter() - t_start,
        "workers": workers,
        "settings": dataclasses.asdict(s),
        "variants": {v.name: v.description for v in VARIANTS if v.name in s.variants},
        "setups": {u.name: u.description for u in SETUPS if u.name in s.setups},
    }


def share_fsq(rows: list[dict[str, Any]], setups: Sequence[str]) -> list[dict[str, Any]]:
    """FSQ's rows (set-up None: it has no codebook) copied into every set-up, after the set-up's own rows."""
    out = []
    for setup in setups:
        out += [r for r in rows if r["setup"] == setup]
        out += [{**r, "setup": setup} for r in rows if r["setup"] is None]
    return out


def _rows(
    setup: str | None, name: str, k: int, code_dim: int, s: CompareSettings, out: dict[str, np.ndarray]
) -> list[dict[str, Any]]:
    rows = []
    extra = ("train_mse_end", *(f"{key}_{when}" for key in _DIAGNOSTICS for when in ("start", "end")))
    for i, seed in enumerate(s.seeds):
        row: dict[str, Any] = {
            "setup": setup,
            "variant": name,
            "codebook_size": k,
            "code_dim": code_dim,
            "seed": seed,
            "bits": math.log2(k),
            **{key: float(out[key][i]) for key in ("usage", "batch_usage", "perplexity", "val_mse")},
            **{key: _finite_or_none(out[key][i]) for key in extra},
            "replaced": int(out["replaced"][i]),
        }
        row["perplexity_over_k"] = row["perplexity"] / k
        for key in ("val_mse", "train_mse_end", "perplexity"):
            if row[key] is None or not math.isfinite(row[key]):
                raise FloatingPointError(
                    f"vq compare: set-up {setup!r}, variant {name!r}, K={k}, d={code_dim}, seed {seed}: "
                    f"{key} is {row[key]}; training diverged."
                )
        rows.append(row)
    return rows


def _finite_or_none(value: Any) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


def _add_fsq_ratios(rows: list[dict[str, Any]]) -> None:
    """``mse_over_fsq``: each row's MSE over FSQ's mean MSE (over seeds) at the same ``K`` and ``d``."""
    fsq: dict[tuple[Any, int, int], list[float]] = {}
    for r in rows:
        if r["variant"] == "fsq":
            fsq.setdefault((r.get("setup"), r["codebook_size"], r["code_dim"]), []).append(r["val_mse"])
    for r in rows:
        ref = fsq.get((r.get("setup"), r["codebook_size"], r["code_dim"]))
        r["mse_over_fsq"] = r["val_mse"] / float(np.mean(ref)) if ref else None


DIAGNOSTIC_KEYS = tuple(f"{key}_{when}" for key in _DIAGNOSTICS for when in ("start", "end"))
_MEAN_KEYS = (
    "usage",
    "batch_usage",
    "perplexity",
    "perplexity_over_k",
    "val_mse",
    "mse_over_fsq",
    "train_mse_end",
    *DIAGNOSTIC_KEYS,
)


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per set-up, variant, ``K`` and ``d``: the mean over seeds (``usage_std``, ``val_mse_std`` their
    spread)."""
    groups: dict[tuple[Any, str, int, int], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r.get("setup"), r["variant"], r["codebook_size"], r["code_dim"]), []).append(r)
    out = []
    for (setup, name, k, d), rs in groups.items():
        entry: dict[str, Any] = {"setup": setup, "variant": name, "codebook_size": k, "code_dim": d}
        entry["bits"] = math.log2(k)
        for key in _MEAN_KEYS:
            values = [r[key] for r in rs if r.get(key) is not None]
            entry[key] = float(np.mean(values)) if values else None
        entry["usage_std"] = float(np.std([r["usage"] for r in rs], ddof=1)) if len(rs) > 1 else 0.0
        entry["val_mse_std"] = float(np.std([r["val_mse"] for r in rs], ddof=1)) if len(rs) > 1 else 0.0
        entry["seeds"] = len(rs)
        out.append(entry)
    return out


# ------------------------------------------------------------------------------------------------
# Targets
# ------------------------------------------------------------------------------------------------

# The VQ variants that keep a codebook alive by some mechanism (the negative control is not one).
_VQ_METHODS = (
    "ste",
    "rotation",
    "ema",
    "kmeans",
    "dead",
    "dead_ema",
    "dead_rotation",
    "kmeans_rotation",
    "cosine",
    "low_dim",
)
_METHODS = (*_VQ_METHODS, "fsq")


def judge_targets(
    summary: Sequence[dict[str, Any]], s: CompareSettings, *, digits: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Judge the comparison's targets on the means over seeds; each ``{key, name, passed, value, detail}``.

    The targets hold in the ``reference`` set-up unless they name another; a
    target whose set-up, variants or sizes are not in the run is left out. Rows
    without a ``setup`` key count as ``reference``.
    """
    at = {(e.get("setup") or "reference", e["variant"], e["codebook_size"], e["code_dim"]): e for e in summary}
    out: list[dict[str, Any]] = []

    def add(key, name, passed, value, detail):
        out.append({"key": key, "name": name, "passed": bool(passed), "value": value, "detail": detail})

    def get(setup, v, k, d):
        return at.get((setup, v, k, d))

    ref = "reference"
    dims, sizes = s.code_dims, s.codebook_sizes
    kmax = max(sizes)
    big = [k for k in sizes if k >= 512] or list(sizes)
    pairs = [
        (get(ref, "rotation", k, d), get(ref, "ste", k, d), k, d)
        for d in dims
        for k in big
        if get(ref, "rotation", k, d) and get(ref, "ste", k, d)
    ]
    low = [(r["usage"], t["usage"], k, d) for r, t, k, d in pairs if t["usage"] < 0.6]
    if low:
        add(
            "rotation_lifts",
            "rotation usage >= STE + 0.2 wherever STE < 0.6 (K >= 512)",
            all(r >= t + 0.2 for r, t, _, _ in low),
            min(r - t for r, t, _, _ in low),
            "; ".join(f"K={k}, d={d}: {r:.3f} vs {t:.3f}" for r, t, k, d in low),
        )
    if pairs:
        gaps = [(r["usage"] - t["usage"], k, d) for r, t, k, d in pairs]
        add(
            "rotation_noninferior",
            "rotation usage >= STE - 0.05 (K >= 512)",
            all(g >= -0.05 for g, _, _ in gaps),
            min(g for g, _, _ in gaps),
            "; ".join(f"K={k}, d={d}: {r['usage']:.3f} vs {t['usage']:.3f}" for r, t, k, d in pairs),
        )
        ratios = [(r["val_mse"] / t["val_mse"], k, d) for r, t, k, d in pairs]
        add(
            "rotation_mse",
            "rotation MSE <= STE's (K >= 512)",
            all(x <= 1.0 for x, _, _ in ratios),
            max(x for x, _, _ in ratios),
            "; ".join(f"K={k}, d={d}: {r['val_mse']:.4f} vs {t['val_mse']:.4f}" for r, t, k, d in pairs),
        )
    for d in dims:
        if e := get(ref, "dead_rotation", kmax, d):
            u = e["usage"]
            add(f"dead_rotation_d{d}", f"K = {kmax}, d = {d}: dead_rotation usage >= 0.95", u >= 0.95, u, f"{u:.3f}")
    fsq = [(at[key]["usage"], at[key]["perplexity"], key[2], key[3]) for key in at if key[1] == "fsq"]
    if fsq:
        u, p, k, d = min(fsq)
        add(
            "fsq_usage",
            "FSQ usage >= 0.95 at every K",
            u >= 0.95,
            u,
            f"lowest: K={k}, d={d}: {u:.3f}; entropy of its codes {math.log2(p):.2f} bits of {math.log2(k):.0f}",
        )
    for d in dims:
        f = get(ref, "fsq", kmax, d)
        vq = [(e["val_mse"], v) for v in _VQ_METHODS if (e := get(ref, v, kmax, d))]
        if f and vq:
            best, v = min(vq)
            add(
                f"best_vs_fsq_d{d}",
                f"K = {kmax}, d = {d}: best VQ MSE <= 1.1 x FSQ",
                best <= 1.1 * f["val_mse"],
                best / f["val_mse"],
                f"{v}: {best:.4f} vs FSQ {f['val_mse']:.4f} ({best / f['val_mse']:.2f}x)",
            )
    ctl = []
    for d in dims:
        for k in sizes:
            c = get(ref, "no_gradient", k, d)
            best = min((e["val_mse"] for v in _METHODS if (e := get(ref, v, k, d))), default=None)
            if c and best is not None:
                ctl.append((c["val_mse"] / best, k, d))
    if ctl:
        r, k, d = min(ctl)
        add(
            "control",
            "negative control MSE >= 2 x the best variant's (every K, d)",
            r >= 2,
            r,
            f"lowest ratio: K={k}, d={d}: {r:.2f}x",
        )
    for d in dims:
        r, t = get("wide-init", "rotation", kmax, d), get("wide-init", "ste", kmax, d)
        if r and t:
            add(
                f"wide_init_collapse_d{d}",
                f"wide-init, K = {kmax}, d = {d}: rotation collapses (usage <= 0.25 and below STE's)",
                r["usage"] <= 0.25 and r["usage"] < t["usage"],
                r["usage"],
                f"rotation {r['usage']:.3f} vs STE {t['usage']:.3f}",
            )
    if digits:
        out += judge_digits(digits["summary"], digits["codebook_size"])
    return out


def judge_digits(summary: Sequence[dict[str, Any]], codebook_size: int) -> list[dict[str, Any]]:
    """The digits check's targets: the best VQ variant (lowest MSE) uses >= 90% of its codes, at FSQ's MSE or below."""
    vq = [e for e in summary if e["variant"] in _VQ_METHODS]
    fsq = [e for e in summary if e["variant"] == "fsq"]
    if not vq:
        return []
    best = min(vq, key=lambda e: e["val_mse"])
    out = [
        {
            "key": "digits_usage",
            "name": f"digits, K = {codebook_size}: the best VQ variant's usage >= 0.9",
            "passed": best["usage"] >= 0.9,
            "value": best["usage"],
            "detail": f"{best['variant']}: {best['usage']:.3f}",
        }
    ]
    if fsq:
        f = fsq[0]["val_mse"]
        out.append(
            {
                "key": "digits_vs_fsq",
                "name": f"digits, K = {codebook_size}: the best VQ variant's MSE <= FSQ's",
                "passed": best["val_mse"] <= f,
                "value": best["val_mse"] / f,
                "detail": f"{best['variant']}: {best['val_mse']:.4f} vs FSQ {f:.4f} ({best['val_mse'] / f:.2f}x)",
            }
        )
    return out
