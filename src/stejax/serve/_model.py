"""The served model and its ahead-of-time compiled buckets."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["CompiledModel", "Prediction", "ServedModel", "compile_model", "served_model_from_artifact"]

_FLOAT32 = np.dtype(np.float32)


@dataclasses.dataclass(frozen=True, eq=False)
class ServedModel:
    """What the service needs of a model: a pure batched function, its weights and its contract.

    Attributes:
      version: the name the responses and ``stejax_model_info`` carry (an
        artifact's id).
      apply: ``apply(weights, inputs) -> logits``, pure and jittable; ``inputs``
        are raw ``(batch, *input_shape)`` values of ``input_dtype``, ``logits``
        float32 ``(batch, n_classes)``. Rows must not interact: each row's logits
        depend on that row alone (padding relies on it).
      weights: the PyTree ``apply`` takes.
      input_shape: one example's shape, e.g. ``(64,)``.
      n_classes: the number of logits per example.
      input_dtype: the inputs' dtype (default float32).
      path: where the model was loaded from, if anywhere.
    """

    version: str
    apply: Callable[[Any, jax.Array], jax.Array]
    weights: Any
    input_shape: tuple[int, ...]
    n_classes: int
    input_dtype: np.dtype = _FLOAT32  # any dtype-like; stored as np.dtype
    path: Path | None = None

    def __post_init__(self):
        object.__setattr__(self, "input_shape", tuple(int(d) for d in self.input_shape))
        object.__setattr__(self, "input_dtype", np.dtype(self.input_dtype))
        if not self.version or not isinstance(self.version, str):
            raise ValueError(f"ServedModel: version must be a non-empty string; got {self.version!r}.")
        if not self.input_shape or any(d < 1 for d in self.input_shape):
            raise ValueError(f"ServedModel: input_shape must be non-empty and positive; got {self.input_shape}.")
        if self.input_dtype.kind != "f":
            raise ValueError(f"ServedModel: input_dtype must be a float dtype; got {self.input_dtype}.")

    @property
    def n_features(self) -> int:
        """The number of values in one example."""
        return int(np.prod(self.input_shape))


def served_model_from_artifact(artifact: Any) -> ServedModel:
    """The :class:`ServedModel` of a loaded :class:`stejax.artifacts.Artifact` (its id is the version)."""
    model = artifact.model
    return ServedModel(
        version=str(artifact.id),
        apply=model.apply,
        weights=model.weights,
        input_shape=tuple(model.input_shape),
        n_classes=int(model.n_classes),
        input_dtype=np.dtype(getattr(model, "input_dtype", np.float32)),
        path=Path(artifact.path),
    )


class Prediction(NamedTuple):
    """One execution's results for the rows asked, padding removed.

    Fields:
      logits: float32 ``(rows, n_classes)``.
      probabilities: float32 ``(rows, n_classes)``, the softmax of the logits.
      classes: int32 ``(rows,)``, the argmax of the logits.
      bucket: the batch size that ran.
    """

    logits: np.ndarray
    probabilities: np.ndarray
    classes: np.ndarray
    bucket: int


def _outputs(apply: Callable[[Any, jax.Array], jax.Array], weights: Any, x: jax.Array):
    logits = apply(weights, x)
    return logits, jax.nn.softmax(logits, axis=-1), jnp.argmax(logits, axis=-1).astype(jnp.int32)


@dataclasses.dataclass(frozen=True, eq=False)
class CompiledModel:
    """A :class:`ServedModel` with one compiled executable per bucket; running it never compiles.

    Made by :func:`compile_model`. :meth:`predict` pads to the smallest bucket
    that holds the rows and calls that bucket's executable.
    """

    model: ServedModel
    buckets: tuple[int, ...]
    executables: Mapping[int, Any]  # bucket -> jax.stages.Compiled
    weights: Any  # the model's weights, on the device

    @property
    def version(self) -> str:
        return self.model.version

    def predict(self, x: np.ndarray) -> Prediction:
        """Logits, probabilities and classes of ``x`` (``(rows, *input_shape)``, rows <= the largest bucket).

        ``x`` must already be valid (shape, dtype, finite); the service checks
        that before it gets here.
        """
        rows = x.shape[0]
        bucket = next((b for b in self.buckets if rows <= b), None)
        if bucket is None or rows < 1:
            raise ValueError(f"predict: expected 1 to {self.buckets[-1]} rows; got {rows}.")
        if rows != bucket:
            padded = np.zeros((bucket, *x.shape[1:]), x.dtype)
            padded[:rows] = x
            x = padded
        logits, probabilities, classes = self.executables[bucket](self.weights, x)
        return Prediction(
            np.asarray(logits)[:rows], np.asarray(probabilities)[:rows], np.asarray(classes)[:rows], bucket
        )


def compile_model(model: ServedModel, buckets: tuple[int, ...]) -> CompiledModel:
    """Lower and compile ``model`` once per bucket, then run each once on zeros (warm-up).

    Raises:
      ValueError: ``model.apply`` does not map ``(bucket, *input_shape)`` inputs
        to float32 ``(bucket, n_classes)`` logits.
    """
    weights = jax.device_put(model.weights)
    jitted = jax.jit(lambda w, x: _outputs(model.apply, w, x))
    executables = {}
    for bucket in buckets:
        spec = jax.ShapeDtypeStruct((bucket, *model.input_shape), model.input_dtype)
        logits_shape = jax.eval_shape(model.apply, weights, spec)
        expected = jax.ShapeDtypeStruct((bucket, model.n_classes), jnp.float32)
        if (
            not isinstance(logits_shape, jax.ShapeDtypeStruct)
            or logits_shape.shape != expected.shape
            or logits_shape.dtype != expected.dtype
        ):
            raise ValueError(
                f"compile_model: {model.version}: expected apply to return float32 logits of shape "
                f"{expected.shape} for inputs {spec.shape}; got {logits_shape}."
            )
        executables[bucket] = jitted.lower(weights, spec).compile()
    compiled = CompiledModel(model=model, buckets=tuple(buckets), executables=executables, weights=weights)
    for bucket in buckets:
        jax.block_until_ready(executables[bucket](weights, np.zeros((bucket, *model.input_shape), model.input_dtype)))
    return compiled
