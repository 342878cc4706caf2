"""The train suite: one jitted training step of the reference pipeline, float and each QAT preset."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from stejax import keys
from stejax.bench._measure import compare
from stejax.data import Normalizer
from stejax.model import PRESETS, init_params, preset

__all__ = ["StepSetup", "step_setup", "train_suite"]

# The presets also timed with the zero-gradient fractions on the step (update(..., statistics=True)).
WITH_STATISTICS = ("float", "w8a8", "w4a4")


class StepSetup(NamedTuple):
    """What a timed training step of the reference pipeline needs (see :func:`step_setup`)."""

    config: Any  # stejax.train.TrainConfig: the recipe
    model_config: Any  # stejax.model.MLPConfig or ConvConfig
    batch: Any  # stejax.train.Batch: the first batch_size standardised training examples
    optimizer: Any  # optax.GradientTransformation: stejax.train.make_optimizer(config, steps per epoch)


def step_setup(*, quick: bool) -> StepSetup:
    """The recipe, model, batch and optimiser that :func:`train_suite` (and ``benchmarks/qat_step.py``) time.

    The default recipe of ``stejax compare`` (the CNN on the digits, batch 64, Adam
    with warm-up and cosine decay, dropout 0.2); ``quick``: a small MLP (one hidden
    layer of 16, batch 32). The batch is the first ``batch_size`` training examples,
    standardised with the training split's statistics.
    """
    from stejax.train import Batch, TrainConfig, load_splits, make_optimizer

    config = TrainConfig(model="mlp", hidden=(16,), batch_size=32) if quick else TrainConfig()
    splits = load_splits(config)
    normalizer = Normalizer.fit(splits.train.x)
    batch = Batch(
        jnp.asarray(normalizer.apply(splits.train.x[: config.batch_size])),
        jnp.asarray(splits.train.y[: config.batch_size]),
    )
    optimizer = make_optimizer(config, len(splits.train) // config.batch_size)
    return StepSetup(config, config.model_config(splits.train), batch, optimizer)


def train_suite(*, repeats: int, warmup: int, quick: bool, presets: Sequence[str] = PRESETS) -> dict[str, Any]:
    """Time the step :func:`stejax.train.train` takes, for each preset.

    The recipe is the default one of ``stejax compare`` (the CNN on the digits,
    batch 64, Adam with warm-up and cosine decay, dropout 0.2); ``quick`` uses a
    small MLP (one hidden layer of 16) instead. Every preset steps the same
    training batch from its own freshly initialised parameters, with a fresh
    dropout key per call; the parameters are not carried from call to call, so
    every call does the same work. Each preset's variant is
    :func:`stejax.train.compiled_train_step` with ``log`` False, the step
    ``train`` takes on every batch but an epoch's last (the update, the loss and
    the finite flag). ``float``, ``w8a8`` and ``w4a4`` are also timed as
    ``"<name> (with statistics)"``: ``update(..., statistics=True)``, the same
    step computing every quantiser's zero-gradient fraction as well, what they
    would cost on every step.

    Returns:
      ``{"config", "groups"}``: one group, the variants the presets, each
      compared with ``float`` as per-round ratios.
    """
    from stejax.train import compiled_train_step, compiled_update, needs_key

    config, model_config, batch, optimizer = step_setup(quick=quick)
    root = keys.split(jax.random.key(config.seed), len(presets), where="bench train: one key per preset")
    calls = {}
    for name, k in zip(presets, root, strict=True):
        qat_config = preset(name)
        k_init, k_steps = keys.split(k, where=f"bench train: {name}")
        params = init_params(k_init, model_config, qat_config)
        step = compiled_train_step(model_config, qat_config, optimizer)
        opt_state = optimizer.init(params)
        n = warmup + repeats
        step_keys = list(keys.split(k_steps, n)) if needs_key(model_config, train=True) else [None] * n
        stream = itertools.cycle(step_keys)
        calls[name] = lambda step=step, p=params, s=opt_state, it=stream: step(p, s, batch, next(it), False)
        if name in WITH_STATISTICS:
            full = compiled_update(model_config, qat_config, optimizer)
            stream = itertools.cycle(step_keys)
            calls[f"{name} (with statistics)"] = lambda step=full, p=params, s=opt_state, it=stream: step(
                p, s, batch, next(it)
            )
    baseline = "float" if "float" in calls else None
    model = (
        f"MLP {model_config.in_features} -> {' -> '.join(map(str, config.hidden))} -> {model_config.n_classes}"
        if config.model == "mlp"
        else f"CNN channels {list(config.channels)} strides {list(config.strides)} on 8x8x1"
    )
    info = {
        "model": model,
        "batch_size": config.batch_size,
        "optimizer": f"{config.optimizer}, {config.schedule}, lr {config.learning_rate}",
        "dropout": config.dropout,
        "what": "stejax.train.compiled_train_step with log False (update(..., statistics=False) jitted): forward, "
        "loss, gradient, optimiser step, finite flag",
        "presets": {name: preset(name).describe() for name in presets},
    }
    group = compare(
        f"train step ({config.model}, batch {config.batch_size})",
        calls,
        repeats=repeats,
        warmup=warmup,
        baseline=baseline,
        info=info,
    )
    return {"config": {"model": config.model, "batch_size": config.batch_size, "quick": quick}, "groups": [group]}
