"""What goes into the model and what comes out, as data with a check."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from jax.typing import ArrayLike

from stejax.model._config import ConvConfig, MLPConfig, ModelConfig

__all__ = ["InputContract", "OutputContract", "input_contract", "output_contract"]


@dataclass(frozen=True)
class InputContract:
    """The model's input: one example's shape and dtype, what each feature is, and the classes.

    Attributes:
      shape: one example's shape, e.g. ``(64,)``. A batch is ``(N, *shape)``.
      dtype: the dtype's name, ``"float32"``.
      feature_order: a sentence saying what feature ``j`` is.
      n_classes: the number of classes the labels range over.
    """

    shape: tuple[int, ...]
    dtype: str
    feature_order: str
    n_classes: int

    def check(self, x: ArrayLike) -> None:
        """Check one example (``shape``) or a batch (``(N, *shape)``) against the contract.

        Eager only (it reads the values). Returns None when ``x`` conforms.

        Raises:
          TypeError: ``x``'s dtype is not ``dtype`` (no silent casts).
          ValueError: the wrong number of features or the wrong shape, or a NaN or
            infinite value; the message gives what was expected, what came and, for
            a non-finite value, the first bad row and feature.
        """
        x = np.asarray(x)
        if x.dtype != np.dtype(self.dtype):
            raise TypeError(
                f"input: expected dtype {self.dtype}; got {x.dtype}. Cast explicitly, e.g. x.astype(np.{self.dtype})."
            )
        k = len(self.shape)
        if x.shape == self.shape:
            rows = x.reshape(1, -1)
            batch = False
        elif x.ndim == k + 1 and x.shape[1:] == self.shape:
            rows = x.reshape(x.shape[0], int(np.prod(self.shape)))
            batch = True
        else:
            n = int(np.prod(self.shape))
            got_n = x.shape[-1] if x.ndim else 0
            what = f"{n} features" if k == 1 else f"shape {self.shape}"
            raise ValueError(
                f"input: expected {what}: one example of shape {self.shape} or a batch of shape "
                f"(N, {', '.join(map(str, self.shape))}); got shape {x.shape}"
                + (f" ({got_n} features)." if k == 1 and x.ndim in (1, 2) else ".")
            )
        finite = np.isfinite(rows)
        if not finite.all():
            row, col = (int(i) for i in np.argwhere(~finite)[0])
            value = rows[row, col]
            place = f"row {row}" if batch else "the example"
            raise ValueError(
                f"input: expected finite values; {place} has {value} at feature {col} "
                f"({int((~finite.all(axis=1)).sum())} bad row(s) in all)."
            )


@dataclass(frozen=True)
class OutputContract:
    """The model's output: what the numbers mean.

    Attributes:
      shape: one example's output shape, ``(n_classes,)``.
      dtype: the dtype's name, ``"float32"``.
      kind: ``"logits"``.
      meaning: a sentence saying how to read the output.
      n_classes: the number of classes.
    """

    shape: tuple[int, ...]
    dtype: str
    kind: str
    meaning: str
    n_classes: int


def input_contract(model_config: ModelConfig, *, feature_order: str | None = None) -> InputContract:
    """The input contract of a model: a flat float32 feature vector per example.

    Both models take ``(in_features,)`` float32; the convolutional one reads it as
    an ``(H, W, C)`` image in row-major order (feature ``(r * W + c) * C + ch`` is
    pixel ``(r, c)``, channel ``ch``), as :class:`stejax.data.Dataset` stores images.

    Args:
      model_config: an :class:`MLPConfig` or :class:`ConvConfig`.
      feature_order: the data set's sentence on what feature ``j`` is (its
        ``Dataset.feature_order``); by default one derived from the model config.

    Returns:
      The :class:`InputContract`.

    Example:
      >>> import numpy as np
      >>> from stejax.model import MLPConfig, input_contract
      >>> c = input_contract(MLPConfig())
      >>> c.shape, c.dtype
      ((64,), 'float32')
      >>> c.check(np.zeros((3, 63), np.float32))  # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      ValueError: input: expected 64 features: ... got shape (3, 63) (63 features).
    """
    if isinstance(model_config, ConvConfig):
        h, w, c = model_config.image_shape
        default = (
            f"{model_config.in_features} features: an {h}x{w}x{c} image flattened in row-major (H, W, C) "
            f"order; feature (r * {w} + c) * {c} + ch is pixel (r, c), channel ch"
        )
    elif isinstance(model_config, MLPConfig):
        default = f"{model_config.in_features} features in the data set's column order"
    else:
        raise TypeError(f"input_contract: expected an MLPConfig or ConvConfig; got {model_config!r}.")
    return InputContract(
        shape=(model_config.in_features,),
        dtype="float32",
        feature_order=default if feature_order is None else feature_order,
        n_classes=model_config.n_classes,
    )


def output_contract(model_config: ModelConfig) -> OutputContract:
    """The output contract: float32 logits, one per class in label order.

    Example:
      >>> from stejax.model import MLPConfig, output_contract
      >>> output_contract(MLPConfig()).shape
      (10,)
    """
    if not isinstance(model_config, (MLPConfig, ConvConfig)):
        raise TypeError(f"output_contract: expected an MLPConfig or ConvConfig; got {model_config!r}.")
    n = model_config.n_classes
    return OutputContract(
        shape=(n,),
        dtype="float32",
        kind="logits",
        meaning=(
            f"unnormalised log-probabilities over the {n} classes, entry k for label k: "
            "softmax(logits)[k] is the model's probability of class k and argmax(logits) its prediction"
        ),
        n_classes=n,
    )
