"""The layers a model config describes, and its parameter PyTree as data."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from stejax.model._config import ConvConfig, MLPConfig, ModelConfig, QATConfig

__all__ = ["check_params", "param_spec"]

# The quantisers that keep a learned step in the parameters.
STEP_METHODS = ("lsq", "round_no_ste")
# The quantisers that keep a learned clipping level in the parameters.
CLIP_METHODS = ("pact",)


@dataclass(frozen=True)
class Layer:
    """One weight layer of the architecture.

    Attributes:
      kind: ``"dense"`` or ``"conv"``.
      in_shape: the layer's input, one example: ``(F,)`` or ``(H, W, C)``.
      w_shape: the weight's shape, ``(in, out)`` or HWIO ``(kh, kw, in, out)``.
      stride: the convolution's stride (1 for dense).
    """

    kind: str
    in_shape: tuple[int, ...]
    w_shape: tuple[int, ...]
    stride: int = 1

    @property
    def fan_in(self) -> int:
        return math.prod(self.w_shape[:-1])

    @property
    def out_channels(self) -> int:
        return self.w_shape[-1]


def check_configs(where: str, model_config: Any, qat_config: Any) -> None:
    if not isinstance(model_config, (MLPConfig, ConvConfig)):
        raise TypeError(f"{where}: model_config must be an MLPConfig or ConvConfig; got {model_config!r}.")
    if not isinstance(qat_config, QATConfig):
        raise TypeError(
            f"{where}: qat_config must be a QATConfig (e.g. stejax.model.preset('w4a4')); got {qat_config!r}."
        )


def architecture(model_config: ModelConfig) -> tuple[Layer, ...]:
    """The weight layers of ``model_config``, in order."""
    if isinstance(model_config, MLPConfig):
        widths = (model_config.in_features, *model_config.hidden, model_config.n_classes)
        return tuple(Layer("dense", (a,), (a, b)) for a, b in itertools.pairwise(widths))
    h, w, c = model_config.image_shape
    k = model_config.kernel_size
    layers = []
    for out, stride in zip(model_config.channels, model_config.strides, strict=True):
        layers.append(Layer("conv", (h, w, c), (k, k, c, out), stride))
        # "SAME" padding: ceil(size / stride) outputs along each side.
        h, w, c = -(-h // stride), -(-w // stride), out
    layers.append(Layer("dense", (h * w * c,), (h * w * c, model_config.n_classes)))
    return tuple(layers)


def param_spec(model_config: ModelConfig, qat_config: QATConfig) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """The parameter PyTree's leaves as data: ``{path: (shape, dtype)}``, in layer order.

    Paths join the PyTree keys with ``/``: ``"layers/0/w"``. For layer ``i``:

    ==================  ==========================================  =======  ==================
    path                shape                                       dtype    present when
    ==================  ==========================================  =======  ==================
    ``layers/i/w``      ``(in, out)``; conv: HWIO ``(k, k, in, out)``  float32  always
    ``layers/i/b``      ``(out,)``                                  float32  always
    ``layers/i/w_step`` ``()`` per tensor, ``(out,)`` per channel   float32  weights lsq or
                                                                             round_no_ste
    ``layers/i/a_step`` ``()``                                      float32  input lsq or
                                                                             round_no_ste
    ``layers/i/a_alpha`` ``()``: PACT's clipping level              float32  input pact
    ==================  ==========================================  =======  ==================

    Args:
      model_config: an :class:`MLPConfig` or :class:`ConvConfig`.
      qat_config: a :class:`QATConfig`.

    Returns:
      An ordered dict from path to ``(shape, numpy dtype)``.

    Example:
      >>> from stejax.model import MLPConfig, param_spec, preset
      >>> spec = param_spec(MLPConfig(hidden=(8,)), preset("w4a4"))
      >>> [(p, s) for p, (s, _) in spec.items()][:4]
      [('layers/0/w', (64, 8)), ('layers/0/b', (8,)), ('layers/0/w_step', ()), ('layers/0/a_step', ())]
    """
    check_configs("param_spec", model_config, qat_config)
    f32 = np.dtype(np.float32)
    layers = architecture(model_config)
    spec: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    for i, layer in enumerate(layers):
        lq = qat_config.layer(i, len(layers))
        spec[f"layers/{i}/w"] = (layer.w_shape, f32)
        spec[f"layers/{i}/b"] = ((layer.out_channels,), f32)
        if lq.weights is not None and lq.weights.method in STEP_METHODS:
            per_channel = lq.weights.granularity == "channel"
            spec[f"layers/{i}/w_step"] = ((layer.out_channels,) if per_channel else (), f32)
        if lq.activations is not None and lq.activations.method in STEP_METHODS:
            spec[f"layers/{i}/a_step"] = ((), f32)
        if lq.activations is not None and lq.activations.method in CLIP_METHODS:
            spec[f"layers/{i}/a_alpha"] = ((), f32)
    return spec


def _key_name(k: Any) -> str:
    for attr in ("key", "idx", "name"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)  # pragma: no cover - every jax key type has one of the above


def check_params(params: Any, spec: dict[str, tuple[tuple[int, ...], Any]]) -> None:
    """Check a parameter PyTree against a :func:`param_spec`; raise at the first mismatch.

    Works on concrete arrays and on tracers (it reads shapes and dtypes only), so
    :func:`apply` calls it on every trace. Paths are checked in the spec's order,
    then any leaf the spec does not name.

    Raises:
      ValueError: a path is missing, has the wrong shape, or is not in the spec;
        the message names the path, the expected shape and the one that came.
      TypeError: a leaf has the wrong dtype or is not an array.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from stejax.model import MLPConfig, check_params, init_params, param_spec, preset
      >>> cfg, qat = MLPConfig(hidden=(16,)), preset("float")
      >>> params = init_params(jax.random.key(0), cfg, qat)
      >>> check_params(params, param_spec(cfg, qat))
      >>> bad = {"layers": (dict(params["layers"][0], b=jnp.zeros(9)), params["layers"][1])}
      >>> check_params(bad, param_spec(cfg, qat))
      Traceback (most recent call last):
      ...
      ValueError: params: layers/0/b has shape (9,); expected (16,).
    """
    leaves = {
        "/".join(_key_name(k) for k in path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
    }
    for path, (shape, dtype) in spec.items():
        if path not in leaves:
            raise ValueError(
                f"params: missing {path} (expected shape {tuple(shape)}, {np.dtype(dtype).name}); "
                f"got leaves {sorted(leaves)}."
            )
        leaf = leaves[path]
        if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
            raise TypeError(f"params: {path} must be an array; got {type(leaf).__name__}.")
        if tuple(leaf.shape) != tuple(shape):
            raise ValueError(f"params: {path} has shape {tuple(leaf.shape)}; expected {tuple(shape)}.")
        if np.dtype(leaf.dtype) != np.dtype(dtype):
            raise TypeError(f"params: {path} has dtype {leaf.dtype}; expected {np.dtype(dtype).name}.")
    extra = [p for p in leaves if p not in spec]
    if extra:
        raise ValueError(
            f"params: {extra[0]} is not a parameter of this model and QAT config; expected only {list(spec)}."
        )
