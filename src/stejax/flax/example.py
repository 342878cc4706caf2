"""The NNX digits example: QAT from a float checkpoint by rules, the everyday recipe; and the QAT layers.

**The recipe** (the default): train the plain NNX
:class:`stejax.flax.models.DigitsCNN` in float, quantise it with the w4a4 rules
(:data:`W4A4_RULES`, :func:`stejax.flax.quantize_model`), calibrate its input
steps on training rows (:func:`stejax.flax.calibrate`: the PTQ model), then
fine-tune for a few epochs (:func:`qat_from_float`)::

    python -m stejax.flax.example                     # float, PTQ w4a4, QAT from float: test accuracy
    python -m stejax.flax.example --out runs/nnx-rules   # also save_quantized(...) the result

**The layers**: :class:`DigitsCNN` below is the functional reference CNN
(:class:`stejax.model.ConvConfig` with a :class:`stejax.model.QATConfig`)
written as NNX QAT layers, so that :meth:`DigitsCNN.functional_params` hands its
trained parameters to :func:`stejax.model.apply` and everything downstream of
the functional model::

    python -m stejax.flax.example --layers --preset w4a4 --epochs 30 --out runs/nnx-w4a4
    stejax export runs/nnx-w4a4 --out artifacts/nnx-w4a4   # the functional model's export path

which trains it (the ``stejax train`` CNN, 32 and 64 channels, no dropout, cosine
schedule), prints the validation and test accuracy, checks that the functional
model gives the same test logits, and writes a run directory.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path
from typing import Any, NamedTuple, cast

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from stejax import keys
from stejax.data import Normalizer, Splits, batches
from stejax.estimators.uniform import lsq_levels
from stejax.flax._convert import functional_params, quant_of
from stejax.flax._layers import QuantConv, QuantLinear
from stejax.flax._quant import Quant
from stejax.flax._rules import Rule, calibrate, quantize_model
from stejax.model import ConvConfig, QATConfig, preset
from stejax.train import TrainConfig, load_splits, make_optimizer

__all__ = [
    "W4A4_RULES",
    "DigitsCNN",
    "FitResult",
    "accuracy_of",
    "adam_steps",
    "evaluate",
    "fit",
    "main",
    "qat_from_float",
    "save_run",
    "train_step",
]

_HIGHEST = jax.lax.Precision.HIGHEST


class DigitsCNN(nnx.Module):
    r"""The functional reference CNN as NNX layers: quantised 3x3 convolutions, ReLU, one dense layer.

    Layer :math:`i` of :math:`n` is a :class:`QuantConv` (``"SAME"``, the
    config's stride) or, last, a :class:`QuantLinear`, quantised as
    ``qat_config.layer(i, n)`` says (:func:`stejax.flax.quant_of`); between
    layers a ReLU (none before a sign input, which replaces it), and dropout on
    every layer's input after the first in training (before its quantiser; the
    functional model drops after it, so only evaluation is identical). Products
    at ``Precision.HIGHEST``, as in :func:`stejax.model.apply`.

    Args:
      qat_config: the quantisation (default: ``preset("w4a4")``).
      model_config: the architecture (default: ``ConvConfig()``, 8x8x1 digits).
      rngs: ``nnx.Rngs`` with streams ``params`` (He-normal kernels) and, with
        dropout, ``dropout``.

    Example:
      >>> import jax.numpy as jnp
      >>> from flax import nnx
      >>> from stejax.flax.example import DigitsCNN
      >>> model = DigitsCNN(rngs=nnx.Rngs(0))
      >>> model(jnp.zeros((2, 64))).shape
      (2, 10)
    """

    def __init__(self, qat_config: QATConfig | None = None, model_config: ConvConfig | None = None, *, rngs: nnx.Rngs):
        qat_config = preset("w4a4") if qat_config is None else qat_config
        model_config = ConvConfig() if model_config is None else model_config
        if not isinstance(model_config, ConvConfig):
            raise TypeError(f"DigitsCNN: model_config must be a ConvConfig; got {type(model_config).__name__}.")
        self.model_config, self.qat_config = model_config, qat_config
        n = model_config.n_layers
        init = nnx.initializers.variance_scaling(2.0, "fan_in", "normal")
        layers: list[QuantLinear | QuantConv] = []
        h, w, c = model_config.image_shape
        for i in range(n):
            lq = qat_config.layer(i, n)
            quant = {
                "weights": quant_of(lq.weights, "weights"),
                "activations": quant_of(lq.activations, "activations", signed=(i == 0)),
            }
            common: dict[str, Any] = dict(precision=_HIGHEST, kernel_init=init, rngs=rngs, **quant)
            if i < n - 1:
                out, stride = model_config.channels[i], model_config.strides[i]
                k = model_config.kernel_size
                layers.append(QuantConv(c, out, (k, k), strides=stride, padding="SAME", **common))
                h, w, c = -(-h // stride), -(-w // stride), out
            else:
                layers.append(QuantLinear(h * w * c, model_config.n_classes, **common))
        self.layers = nnx.List(layers)
        self.dropout = nnx.Dropout(model_config.dropout, rngs=rngs if model_config.dropout > 0 else None)

    def layer_input(self, x: jax.Array, index: int) -> jax.Array:
        """Layer ``index``'s input before its quantiser, for a batch ``x`` of flat images ``(N, H*W*C)``."""
        return self._run(x, stop_at=index)

    def __call__(self, x: jax.Array) -> jax.Array:
        """The logits ``(N, n_classes)`` of flat images ``x`` ``(N, H*W*C)``."""
        return self._run(x, stop_at=None)

    def _run(self, x: jax.Array, *, stop_at: int | None) -> jax.Array:
        n = len(self.layers)
        z = jnp.reshape(x, (x.shape[0], *self.model_config.image_shape))
        for i, layer in enumerate(self.layers):
            lq = self.qat_config.layer(i, n)
            sign_input = lq.activations is not None and lq.activations.method == "sign"
            u = z if (i == 0 or sign_input) else jax.nn.relu(z)
            if isinstance(layer, QuantLinear):
                u = jnp.reshape(u, (u.shape[0], -1))
            if stop_at == i:
                return u
            z = layer(self.dropout(u) if i > 0 else u)
        return z

    def calibrate(self, x: jax.Array) -> None:
        r"""Set each LSQ input step and PACT clip from data, layer by layer.

        As :func:`stejax.model.init_params` does with a calibration batch: LSQ's
        step :math:`2\langle|u|\rangle/\sqrt{Q_P}` (Esser et al.'s initialisation)
        and PACT's clip :math:`\alpha = Q_P \cdot 2\langle|u|\rangle/\sqrt{Q_P}`
        with :math:`Q_P = 2^b - 1`, the top of the range that step would give.
        Layer :math:`i`'s inputs :math:`u` go through layers :math:`0..i-1` with the
        values already set. A mean of 0 (or a non-finite one) keeps the value.
        """
        for i, layer in enumerate(self.layers):
            q = layer.activations
            if q is None or q.name not in ("lsq", "pact"):
                continue
            mean_abs = float(jnp.mean(jnp.abs(self.layer_input(x, i))))
            if not (math.isfinite(mean_abs) and mean_abs > 0):
                continue
            if q.name == "lsq":
                _, qp = lsq_levels(q.params["bits"], q.params["signed"])
                layer.input_step[...] = jnp.asarray(  # type: ignore[union-attr]
                    2.0 * mean_abs / math.sqrt(qp), jnp.float32
                )
            else:
                _, qp = lsq_levels(q.params["bits"], False)
                alpha = getattr(layer, "input_alpha")  # noqa: B009 (a variable the Quant declares)
                alpha[...] = jnp.full_like(alpha[...], qp * (2.0 * mean_abs / math.sqrt(qp)))

    def functional_params(self) -> dict[str, tuple[dict[str, jax.Array], ...]]:
        """The parameters as :func:`stejax.model.apply` takes them (:func:`stejax.flax.functional_params`)."""
        return functional_params(list(self.layers), self.model_config, self.qat_config)


def _loss(model: DigitsCNN, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(model(x), y))


@nnx.jit
def train_step(model: DigitsCNN, optimizer: nnx.Optimizer, x: jax.Array, y: jax.Array) -> jax.Array:
    """One Adam (or any optax) step on a batch, in place; returns the batch's mean cross-entropy before it."""
    value, grads = nnx.value_and_grad(_loss)(model, x, y)
    optimizer.update(model, grads)
    return value


@nnx.jit
def evaluate(model: DigitsCNN, x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The mean cross-entropy and the number of correct predictions on ``(x, y)``."""
    logits = model(x)
    value = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, y))
    return value, jnp.sum((jnp.argmax(logits, axis=-1) == y).astype(jnp.int32))


class FitResult(NamedTuple):
    """What :func:`fit` returns (the model itself is trained in place)."""

    normalizer: Normalizer  # the training split's standardisation
    history: tuple[dict[str, float], ...]  # per epoch: epoch, train_loss, val_loss, val_accuracy
    test_loss: float  # the final model's test cross-entropy
    test_accuracy: float  # the final model's test accuracy, a fraction
    n_test: int  # test examples
    seconds: float  # wall time of the fit


def fit(model: DigitsCNN, config: TrainConfig, key: jax.Array, *, splits: Splits | None = None) -> FitResult:
    """Train ``model`` in place with ``nnx.Optimizer`` by ``config``'s batch size, epochs and optimiser.

    The same recipe objects as :func:`stejax.train.train`: the digits split by
    ``config``, standardised on the training split, the LSQ input steps
    calibrated on its first 256 rows, ``make_optimizer(config, steps_per_epoch)``,
    one shuffle per epoch from ``key`` (``stejax.keys.split``); dropout draws from
    the model's own ``dropout`` stream. No early stopping: the final model is
    scored on the test split once.
    """
    keys.check_key(key, what="fit: key")
    started = time.perf_counter()
    splits = load_splits(config) if splits is None else splits
    normalizer = Normalizer.fit(splits.train.x)
    x_train, y_train = normalizer.apply(splits.train.x), np.asarray(splits.train.y)
    x_val, y_val = jnp.asarray(normalizer.apply(splits.val.x)), jnp.asarray(splits.val.y)
    steps_per_epoch = len(x_train) // config.batch_size
    model.calibrate(jnp.asarray(x_train[:256]))
    optimizer = nnx.Optimizer(model, make_optimizer(config, steps_per_epoch), wrt=nnx.Param)
    history = []
    for epoch in range(1, config.epochs + 1):
        key, k_shuffle = keys.split(key, where=f"fit: epoch {epoch}")
        order = np.asarray(jax.random.permutation(keys.consume(k_shuffle, where=f"fit: shuffle {epoch}"), len(x_train)))
        model.train()
        losses = [
            train_step(model, optimizer, jnp.asarray(xb), jnp.asarray(yb))
            for xb, yb in batches(x_train, y_train, batch_size=config.batch_size, order=order, drop_last=True)
        ]
        model.eval()
        val_loss, correct = evaluate(model, x_val, y_val)
        history.append(
            {
                "epoch": epoch,
                "train_loss": float(np.mean(jax.device_get(losses))),
                "val_loss": float(val_loss),
                "val_accuracy": int(correct) / len(y_val),
            }
        )
    model.eval()
    x_test, y_test = jnp.asarray(normalizer.apply(splits.test.x)), jnp.asarray(splits.test.y)
    test_loss, correct = evaluate(model, x_test, y_test)
    return FitResult(
        normalizer=normalizer,
        history=tuple(history),
        test_loss=float(test_loss),
        test_accuracy=int(correct) / len(y_test),
        n_test=len(y_test),
        seconds=time.perf_counter() - started,
    )


def save_run(
    model: DigitsCNN, config: TrainConfig, result: FitResult, out_dir: str | os.PathLike, *, splits: Splits
) -> Path:
    """Write the trained model as a :func:`stejax.train.save_run` run directory, the functional model's format.

    The parameters are :meth:`DigitsCNN.functional_params`, so ``stejax export``
    (:func:`stejax.export.export_run`) and the artifact store take the NNX model
    exactly as they take a functional run. The final epoch counts as the best.

    Raises:
      ValueError: ``config`` names another QAT preset or architecture than the model's.
    """
    from stejax.train import TrainResult
    from stejax.train import save_run as save_train_run

    if config.qat_config() != model.qat_config or config.model_config(splits.train) != model.model_config:
        raise ValueError(
            f"save_run: config describes {config.qat_config().name} on {config.model_config(splits.train)}; "
            f"the model is {model.qat_config.name} on {model.model_config}."
        )
    last = result.history[-1]
    run = TrainResult(
        config=config,
        model_config=model.model_config,
        qat_config=model.qat_config,
        params=model.functional_params(),
        normalizer=result.normalizer,
        history=result.history,
        best_epoch=int(last["epoch"]),
        best_val_accuracy=float(last["val_accuracy"]),
        test_loss=result.test_loss,
        test_accuracy=result.test_accuracy,
        n_test=result.n_test,
        stopped_early=False,
        seconds=result.seconds,
    )
    return save_train_run(run, out_dir, splits=splits)


W4A4_RULES: tuple[Rule, ...] = (
    Rule(r"conv1", weights=Quant("lsq", bits=8), inputs=Quant("lsq", bits=8)),  # signed pixels, first layer: 8 bits
    Rule(weights=Quant("lsq", bits=4, axis=-1), inputs=Quant("lsq", bits=4, signed=False)),
)
"""The w4a4 rules of the recipe: LSQ 4-bit weights per output channel and unsigned 4-bit LSQ inputs (after a
ReLU), the first convolution at 8 bits (its inputs are signed standardised pixels)."""


def _loss_of(model: nnx.Module, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(model(x), y))


@nnx.jit
def _adam_step(model: nnx.Module, optimizer: nnx.Optimizer, x: jax.Array, y: jax.Array) -> jax.Array:
    loss, grads = nnx.value_and_grad(_loss_of)(model, x, y)
    with jax.numpy_dtype_promotion("standard"):  # optax's schedule mixes Python floats with an int32 count
        optimizer.update(model, grads)
    return loss


@nnx.jit
def _correct(model: nnx.Module, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.sum(jnp.argmax(model(x), axis=-1) == y)


def adam_steps(model: nnx.Module, data: tuple[jax.Array, jax.Array], steps: int, lr: float, seed: int) -> float:
    """Train ``model`` in place: ``steps`` Adam steps, batch 64 drawn without replacement, cosine schedule from ``lr``.

    The batch order depends on ``seed`` only (NumPy), so two models trained with
    the same seed see the same batches. Returns the last loss.

    Raises:
      FloatingPointError: the last loss is not finite.
    """
    x, y = data
    optimizer = nnx.Optimizer(model, optax.adam(optax.cosine_decay_schedule(lr, steps)), wrt=nnx.Param)
    rng = np.random.default_rng(seed)
    last = jnp.asarray(jnp.nan)
    for _ in range(steps):
        rows = rng.choice(len(x), 64, replace=False)
        last = _adam_step(model, optimizer, x[rows], y[rows])
    loss = float(last)
    if not math.isfinite(loss):
        raise FloatingPointError(f"adam_steps: the last loss is {loss} after {steps} steps (seed {seed}).")
    return loss


def accuracy_of(model: nnx.Module, data: tuple[jax.Array, jax.Array]) -> float:
    """The fraction of ``data`` that ``model`` classifies right."""
    x, y = data
    return int(_correct(model, x, y)) / len(y)


def qat_from_float(
    seed: int = 0,
    *,
    float_steps: int = 600,
    qat_steps: int = 300,
    rules: tuple[Rule, ...] = W4A4_RULES,
    splits: Splits | None = None,
) -> tuple[nnx.Module, dict[str, float]]:
    """The recipe: train float, ``quantize_model``, ``calibrate``, fine-tune; returns the QAT model and accuracies.

    On the seed's own stratified split of the 8x8 digits (``split(seed=seed)``
    unless ``splits`` is given), standardised by the training split:

    1. train :class:`stejax.flax.models.DigitsCNN` (``nnx.Rngs(seed)``) in float,
       ``float_steps`` Adam steps from 3e-3 (:func:`adam_steps`);
    2. ``quantize_model(float_model, rules, x_train[:64])`` (the float model is
       left as it is);
    3. ``calibrate`` on 1024 training rows: the PTQ model;
    4. fine-tune ``qat_steps`` Adam steps from 1e-3.

    Returns:
      The fine-tuned quantised model, and ``{"float", "ptq", "qat_from_float"}``
      test accuracies.
    """
    from stejax.data import load_digits, split
    from stejax.flax.models import DigitsCNN as PlainCNN

    splits = split(load_digits(), seed=seed) if splits is None else splits
    norm = Normalizer.fit(splits.train.x)
    train = (jnp.asarray(norm.apply(splits.train.x)), jnp.asarray(splits.train.y))
    test = (jnp.asarray(norm.apply(splits.test.x)), jnp.asarray(splits.test.y))
    model = PlainCNN(rngs=nnx.Rngs(seed))
    adam_steps(model, train, float_steps, 3e-3, seed)
    out = {"float": accuracy_of(model, test)}
    qat = quantize_model(model, list(rules), train[0][:64])
    calibrate(qat, [train[0][i : i + 256] for i in range(0, 1024, 256)])
    out["ptq"] = accuracy_of(qat, test)
    adam_steps(qat, train, qat_steps, 1e-3, seed + 1000)
    out["qat_from_float"] = accuracy_of(qat, test)
    return qat, out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the example from the command line (the recipe, or ``--layers``); print and return its results."""
    parser = argparse.ArgumentParser(prog="python -m stejax.flax.example", description=__doc__.splitlines()[0])
    parser.add_argument("--layers", action="store_true", help="train the QAT-layer CNN (DigitsCNN) instead")
    parser.add_argument("--preset", default="w4a4", help="--layers: a QAT preset (stejax.model.PRESETS)")
    parser.add_argument("--epochs", type=int, default=30, help="--layers: epochs")
    parser.add_argument("--float-steps", type=int, default=600, help="the recipe: float Adam steps")
    parser.add_argument("--qat-steps", type=int, default=300, help="the recipe: QAT fine-tuning steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="also save the model here (recipe: a safetensors file's folder)")
    args = parser.parse_args(argv)
    if args.layers:
        return _main_layers(args)
    started = time.perf_counter()
    qat, result = qat_from_float(args.seed, float_steps=args.float_steps, qat_steps=args.qat_steps)
    summary: dict[str, Any] = {
        "recipe": "train float, quantize_model(W4A4_RULES), calibrate, fine-tune",
        "float_steps": args.float_steps,
        "qat_steps": args.qat_steps,
        **{f"test_accuracy_{k}": round(v, 4) for k, v in result.items()},
        "seconds": round(time.perf_counter() - started, 1),
    }
    if args.out is not None:
        from stejax.flax._saving import save_quantized

        summary["saved"] = str(save_quantized(qat, Path(args.out) / "model.safetensors"))
    print(summary)
    return summary


def _main_layers(args: argparse.Namespace) -> dict[str, Any]:
    from stejax.model import apply

    config = TrainConfig(preset=args.preset, epochs=args.epochs, seed=args.seed, dropout=0.0, schedule="cosine")
    splits = load_splits(config)
    k_params, k_fit = keys.split(jax.random.key(args.seed), where="example: seed -> params, fit")
    model_config = config.model_config(splits.train)
    assert isinstance(model_config, ConvConfig)  # the example's config is a CNN's
    model = DigitsCNN(config.qat_config(), model_config, rngs=nnx.Rngs(params=k_params))
    result = fit(model, config, k_fit, splits=splits)
    if args.out is not None:
        save_run(model, config, result, args.out, splits=splits)
    x_test = jnp.asarray(result.normalizer.apply(splits.test.x))
    params = model.functional_params()
    logits = jax.vmap(lambda x: apply(params, x, model_config=model.model_config, qat_config=model.qat_config))(x_test)
    same = bool(jnp.array_equal(cast(jax.Array, logits), model(x_test)))
    summary = {
        "preset": args.preset,
        "epochs": args.epochs,
        "val_accuracy": result.history[-1]["val_accuracy"],
        "test_accuracy": result.test_accuracy,
        "functional_logits_identical": same,
        "seconds": round(result.seconds, 1),
    }
    print(summary)
    return summary


if __name__ == "__main__":
    main()
