"""The training recipe as one frozen record, and the optax optimiser it describes."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import numbers
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import optax

from stejax.data import Dataset
from stejax.model import PRESETS, ConvConfig, MLPConfig, ModelConfig, QATConfig, preset
from stejax.train._products import PRODUCTS, with_product

__all__ = ["MODELS", "OPTIMIZERS", "PRODUCTS", "SCHEDULES", "TrainConfig", "make_optimizer"]

MODELS = ("mlp", "cnn")
OPTIMIZERS = ("adam", "adamw", "sgd", "momentum")
SCHEDULES = ("constant", "cosine", "warmup_cosine")
NORMALIZATIONS = ("global", "feature")


def _int(name: str, value: Any, *, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"TrainConfig: {name} must be an int; got {value!r} of type {type(value).__name__}.")
    if value < low:
        raise ValueError(f"TrainConfig: {name} must be an int >= {low}; got {value}.")
    return int(value)


def _float(name: str, value: Any, *, low: float, high: float, low_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"TrainConfig: {name} must be a float; got {value!r} of type {type(value).__name__}.")
    # Check the float that is stored: numbers.Real declares no comparisons.
    number = float(value)
    ok = math.isfinite(number) and (number > low if low_open else number >= low) and number < high
    if not ok:
        interval = f"{'(' if low_open else '['}{low}, {high})"
        raise ValueError(f"TrainConfig: {name} must be a float in {interval}; got {value}.")
    return number


def _choice(name: str, value: Any, options: tuple[str, ...]) -> str:
    if value not in options:
        raise ValueError(f"TrainConfig: {name} must be one of {list(options)}; got {value!r}.")
    return value


def _widths(name: str, value: Any) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)):
        raise TypeError(f"TrainConfig: {name} must be a tuple of ints; got {value!r}.")
    return tuple(_int(f"{name}[{i}]", v, low=1) for i, v in enumerate(value))


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """The whole recipe of one training run: data split, model, QAT preset, optimiser, schedule, seed.

    A frozen, hashable record; :meth:`to_dict` and :meth:`from_dict` write and read
    it as JSON (``stejax train --config FILE`` reads such a file, keys optional).
    The defaults are the recipe ``stejax compare`` uses on the 8x8 digits, chosen
    on the training and validation splits of ``data_seed=0`` alone, by repeated
    stratified holdout (``benchmarks/recipe_cv.py``); the test split played no part.

    Attributes:
      preset: the QAT preset, one of :data:`stejax.model.PRESETS` (default ``"float"``),
        or the name of ``qat`` when that is given.
      qat: any other QAT configuration (a :class:`stejax.model.QATConfig`; in a
        JSON file the mapping :meth:`stejax.model.QATConfig.from_dict` reads:
        method, bits and granularity of the weights and inputs of the hidden, first
        and last layers), or None (default) for the preset. Its name may not be a
        preset's unless it is that preset.
      model: ``"cnn"`` (default) or ``"mlp"``.
      hidden: the MLP's hidden widths (default ``(256, 256)``).
      channels: the CNN's convolution channels (default ``(32, 64)``).
      strides: the CNN's convolution strides, one per channel entry (default ``(1, 2)``).
      dropout: the dropout rate on every layer input after the first, in [0, 1)
        (default 0.2).
      optimizer: ``"adam"`` (default), ``"adamw"``, ``"sgd"`` or ``"momentum"``
        (SGD with Nesterov momentum 0.9).
      learning_rate: the peak learning rate, > 0 (default 3e-3).
      schedule: ``"constant"``, ``"cosine"`` (cosine decay to 0 over the run) or
        ``"warmup_cosine"`` (default: linear warm-up from 0 over ``warmup_epochs``,
        then cosine decay to 0).
      warmup_epochs: the warm-up length in epochs (default 2; ``warmup_cosine`` only).
      weight_decay: decoupled weight decay for ``"adamw"`` (default 0).
      batch_size: examples per step (default 64). Each epoch drops its last
        ``len(train) % batch_size`` shuffled examples, so every step has one shape
        and the jitted step compiles once.
      epochs: the most epochs to run (default 40).
      patience: stop after this many epochs in a row without a better validation
        result (a higher accuracy, or the same accuracy and a lower loss); default
        15; None never stops early.
      seed: the training seed (initialisation, shuffling, dropout), >= 0 (default 0).
      data_seed: the seed of the train/validation/test split (default 0). It is
        kept apart from ``seed`` so that every seed of a comparison meets the same
        test split.
      val_fraction: the validation fraction of each class (default 0.15).
      test_fraction: the test fraction of each class (default 0.15).
      normalize: ``"global"`` (default: one mean and standard deviation over all
        training pixels, the usual choice for images) or ``"feature"`` (one per
        feature); see :meth:`stejax.data.Normalizer.fit`. Fitted on the training
        split only either way.
      product: how the quantised layers multiply: ``"fake-quant"`` (default:
        float products of the fake-quantised operands), ``"int8-forward"``
        (:func:`stejax.integer_dot_general` forward, int8 x int8 -> int32, with
        the float straight-through gradient) or ``"int8"`` (the forward and both
        backward products in int8: the product's declared gradient). The integer
        products quantise with their own dynamic absmax scales (inputs per
        example, per patch in a convolution; weights per output channel) in
        place of the LSQ quantisers, so they take configurations whose quantised
        layers all have 8-bit LSQ weights and inputs (``w8a8``), and those layers
        keep no step parameters (see :class:`stejax.train.IntegerProducts`).
    """

    preset: str = "float"
    model: str = "cnn"
    hidden: tuple[int, ...] = (256, 256)
    channels: tuple[int, ...] = (32, 64)
    strides: tuple[int, ...] = (1, 2)
    dropout: float = 0.2
    optimizer: str = "adam"
    learning_rate: float = 3e-3
    schedule: str = "warmup_cosine"
    warmup_epochs: int = 2
    weight_decay: float = 0.0
    batch_size: int = 64
    epochs: int = 40
    patience: int | None = 15
    seed: int = 0
    data_seed: int = 0
    val_fraction: float = 0.15
    test_fraction: float = 0.15
    normalize: str = "global"
    qat: QATConfig | None = None
    product: str = "fake-quant"

    def __post_init__(self):
        set_ = functools.partial(object.__setattr__, self)
        if self.qat is None:
            if self.preset not in PRESETS:
                raise ValueError(
                    f"TrainConfig: preset must be one of {list(PRESETS)}; got {self.preset!r}. Any other "
                    "QAT configuration is given as qat (see stejax.model.QATConfig.from_dict)."
                )
        else:
            if not isinstance(self.qat, QATConfig):
                raise TypeError(f"TrainConfig: qat must be a QATConfig or None; got {type(self.qat).__name__}.")
            if self.preset != self.qat.name:
                raise ValueError(
                    f"TrainConfig: with qat given, preset names it and must be {self.qat.name!r}; got {self.preset!r}."
                )
            if self.qat.name in PRESETS and self.qat != preset(self.qat.name):
                raise ValueError(
                    f"TrainConfig: qat is named {self.qat.name!r} like a preset but differs from it; "
                    "give it a name of its own (reports and targets go by name)."
                )
        set_("model", _choice("model", self.model, MODELS))
        set_("hidden", _widths("hidden", self.hidden))
        set_("channels", _widths("channels", self.channels))
        set_("strides", _widths("strides", self.strides))
        if not self.channels:
            raise ValueError("TrainConfig: channels must not be empty.")
        if len(self.strides) != len(self.channels):
            raise ValueError(
                f"TrainConfig: strides must have one entry per channel entry ({len(self.channels)}); "
                f"got {len(self.strides)}."
            )
        set_("dropout", _float("dropout", self.dropout, low=0.0, high=1.0))
        set_("optimizer", _choice("optimizer", self.optimizer, OPTIMIZERS))
        set_("learning_rate", _float("learning_rate", self.learning_rate, low=0.0, high=math.inf, low_open=True))
        set_("schedule", _choice("schedule", self.schedule, SCHEDULES))
        set_("warmup_epochs", _int("warmup_epochs", self.warmup_epochs, low=0))
        set_("weight_decay", _float("weight_decay", self.weight_decay, low=0.0, high=math.inf))
        set_("batch_size", _int("batch_size", self.batch_size, low=1))
        set_("epochs", _int("epochs", self.epochs, low=1))
        if self.patience is not None:
            set_("patience", _int("patience", self.patience, low=1))
        set_("seed", _int("seed", self.seed, low=0))
        set_("data_seed", _int("data_seed", self.data_seed, low=0))
        set_("val_fraction", _float("val_fraction", self.val_fraction, low=0.0, high=1.0, low_open=True))
        set_("normalize", _choice("normalize", self.normalize, NORMALIZATIONS))
        set_("test_fraction", _float("test_fraction", self.test_fraction, low=0.0, high=1.0, low_open=True))
        if self.val_fraction + self.test_fraction >= 1:
            raise ValueError(
                "TrainConfig: val_fraction + test_fraction must be below 1 to leave training data; got "
                f"{self.val_fraction} + {self.test_fraction}."
            )
        set_("product", _choice("product", self.product, PRODUCTS))
        with_product(self._fake_quant_config(), self.product)  # raises for a configuration it cannot run

    def qat_config(self) -> QATConfig:
        """The QAT configuration: :attr:`qat` if given, else the preset's.

        With an integer :attr:`product`, that configuration made an
        :class:`stejax.train.IntegerProducts`.
        """
        return with_product(self._fake_quant_config(), self.product)

    def _fake_quant_config(self) -> QATConfig:
        return self.qat if self.qat is not None else preset(self.preset)

    def model_config(self, data: Dataset) -> ModelConfig:
        """The model for ``data``: its feature count and classes, this config's widths and dropout.

        Raises:
          ValueError: ``model="cnn"`` for a dataset without an image shape.
        """
        if self.model == "mlp":
            return MLPConfig(
                in_features=int(data.x.shape[1]),
                hidden=self.hidden,
                n_classes=data.n_classes,
                dropout=self.dropout,
            )
        if data.image_shape is None:
            raise ValueError(
                f"TrainConfig: model 'cnn' needs image data; dataset {data.name!r} has no image_shape. Use model 'mlp'."
            )
        return ConvConfig(
            image_shape=data.image_shape,
            channels=self.channels,
            strides=self.strides,
            n_classes=data.n_classes,
            dropout=self.dropout,
        )

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict (tuples become lists)."""
        out = {
            f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v for f in dataclasses.fields(self)
        }
        out["qat"] = None if self.qat is None else self.qat.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], **overrides: Any) -> TrainConfig:
        """Build a config from a mapping of field names (all optional), then apply ``overrides``.

        Lists become tuples. Overrides whose value is None are skipped, so a CLI can
        pass its unset options straight through.

        Raises:
          ValueError: an unknown key (the message lists the known ones), or an
            invalid value (see the class).
          TypeError: ``data`` is not a mapping, or a value of the wrong type.

        Example:
          >>> from stejax.train import TrainConfig
          >>> TrainConfig.from_dict({"preset": "w4a4", "hidden": [32]}, epochs=3).hidden
          (32,)
        """
        if not isinstance(data, Mapping):
            raise TypeError(f"TrainConfig.from_dict: expected a mapping of fields; got {type(data).__name__}.")
        known = [f.name for f in dataclasses.fields(cls)]
        merged = {**data, **{k: v for k, v in overrides.items() if v is not None}}
        unknown = [k for k in merged if k not in known]
        if unknown:
            raise ValueError(f"TrainConfig: unknown field {unknown[0]!r}; the fields are {known}.")
        fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in merged.items()}
        if isinstance(fields.get("qat"), Mapping):
            fields["qat"] = QATConfig.from_dict(dict(fields["qat"]))
        if isinstance(fields.get("qat"), QATConfig) and "preset" not in fields:
            fields["preset"] = fields["qat"].name
        return cls(**fields)

    @classmethod
    def from_file(cls, path: str | os.PathLike, **overrides: Any) -> TrainConfig:
        """Read a JSON file of fields (see :meth:`from_dict`).

        Raises:
          ValueError: the file is not valid JSON or holds an invalid config.
          OSError: the file cannot be read.
        """
        text = Path(path).read_text(encoding="utf-8")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"TrainConfig.from_file: {path} is not valid JSON ({e}).") from e
        return cls.from_dict(data, **overrides)


def make_optimizer(config: TrainConfig, steps_per_epoch: int) -> optax.GradientTransformation:
    """The optax optimiser of ``config`` for a run of ``config.epochs * steps_per_epoch`` steps.

    The transformation runs on the raveled parameter vector (``optax.flatten``):
    element for element the same update, in a few kernels rather than several per
    leaf. Cached: the same arguments return the same object, so a jitted step that takes
    the optimiser as a static argument compiles once per configuration, not once
    per seed.

    Args:
      config: the recipe.
      steps_per_epoch: optimiser steps per epoch, >= 1.

    Returns:
      An ``optax.GradientTransformation``.

    Example:
      >>> from stejax.train import TrainConfig, make_optimizer
      >>> make_optimizer(TrainConfig(), 19) is make_optimizer(TrainConfig(), 19)
      True
    """
    steps_per_epoch = _int("steps_per_epoch", steps_per_epoch, low=1)
    return _optimizer(
        config.optimizer,
        config.learning_rate,
        config.schedule,
        config.warmup_epochs * steps_per_epoch,
        config.epochs * steps_per_epoch,
        config.weight_decay,
    )


@functools.lru_cache(maxsize=64)
def _optimizer(
    name: str, lr: float, schedule: str, warmup_steps: int, total_steps: int, weight_decay: float
) -> optax.GradientTransformation:
    if schedule == "constant":
        rate: float | optax.Schedule = lr
    elif schedule == "cosine" or warmup_steps == 0:
        rate = optax.cosine_decay_schedule(lr, decay_steps=total_steps)
    else:
        warmup_steps = min(warmup_steps, max(total_steps - 1, 1))
        rate = optax.warmup_cosine_decay_schedule(
            0.0, lr, warmup_steps=warmup_steps, decay_steps=max(total_steps, warmup_steps + 1)
        )
    if name == "adam":
        inner = optax.adam(rate)
    elif name == "adamw":
        inner = optax.adamw(rate, weight_decay=weight_decay)
    elif name == "momentum":
        inner = optax.sgd(rate, momentum=0.9, nesterov=True)
    else:
        inner = optax.sgd(rate)
    # One raveled vector instead of one state per leaf: the same arithmetic, far
    # fewer small kernels per step (the LSQ steps are many scalar leaves).
    return _standard_promotion(optax.flatten(inner))


def _standard_promotion(tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """``tx`` with JAX's standard dtype promotion inside its ``init`` and ``update``.

    optax mixes Python floats with int32 step counts (``decay**count``), which
    strict promotion, as the stejax test suite runs, refuses; all values stay float32.
    """

    def init(params):
        with jax.numpy_dtype_promotion("standard"):
            return tx.init(params)

    def update(updates, state, params=None):
        with jax.numpy_dtype_promotion("standard"):
            return tx.update(updates, state, params)

    return optax.GradientTransformation(init, update)
