"""The forward pass: logits for one example, pure, under jit, vmap and grad."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from stejax import keys
from stejax.model._config import ModelConfig, QATConfig
from stejax.model._quantize import quantize_input, quantize_weights
from stejax.model._spec import Layer, architecture, check_configs, check_params, param_spec

__all__ = ["apply"]

_HIGHEST = jax.lax.Precision.HIGHEST


def apply(
    params: Any,
    x: jax.Array,
    *,
    model_config: ModelConfig,
    qat_config: QATConfig,
    key: jax.Array | None = None,
    train: bool = False,
    return_stats: bool = False,
) -> jax.Array | tuple[jax.Array, dict[str, dict[str, jax.Array]]]:
    r"""The model's logits for ONE example, with fake quantisation as ``qat_config`` says.

    Layer :math:`i` of :math:`n` computes, with :math:`Q_w, Q_a` its weight and
    input quantisers (identity when float):

    .. math::

       u_0 = x, \qquad u_i = \begin{cases}
         z_{i-1} & \text{if } Q_a \text{ is sign (the sign replaces the ReLU)} \\
         \operatorname{relu}(z_{i-1}) & \text{otherwise,} \end{cases}

       z_i = Q_a(u_i) \circledast Q_w(w_i) + b_i, \qquad \text{logits} = z_{n-1},

    where :math:`\circledast` is a matrix product (dense) or a ``"SAME"``
    convolution (NHWC activations, HWIO kernels, ``jax.lax.conv_general_dilated``),
    both at ``Precision.HIGHEST``. The convolutional model reads ``x`` as its
    ``(H, W, C)`` image in row-major order and flattens before its dense layer.
    LSQ inputs use the signed grid in layer 0 and the unsigned grid after a ReLU;
    PACT inputs (never layer 0's) are the ReLU's output clipped to the learned
    :math:`[0, \alpha]` and rounded on the unsigned grid.

    Batches: map it, ``jax.vmap(functools.partial(apply, model_config=mc,
    qat_config=qc), in_axes=(None, 0))(params, xs)``; with dropout pass one key per
    example (``key=keys.split(k, len(xs))``; keyword arguments of a vmapped
    function are mapped over their leading axis). LSQ's default gradient scale
    :math:`1/\sqrt{N Q_P}` then counts :math:`N` per example, as in the paper.

    Args:
      params: the parameter PyTree (see :func:`param_spec`); checked by shape and
        dtype on every trace.
      x: one example, float32 of shape ``(in_features,)``.
      model_config: an :class:`MLPConfig` or :class:`ConvConfig`.
      qat_config: a :class:`QATConfig` (see :func:`preset`).
      key: a typed PRNG key, needed only when ``train`` is True and the model's
        dropout rate is positive (it is split into one subkey per layer input
        after the first); ignored otherwise.
      train: apply dropout (inverted: kept values are scaled by :math:`1/(1-p)`) to
        the quantised input of every layer after the first.
      return_stats: also return the saturation statistics.

    Returns:
      The float32 logits of shape ``(n_classes,)``; with ``return_stats``, the pair
      ``(logits, stats)`` where ``stats["layer_i"]`` holds, for each quantised part
      of layer ``i`` (``"weights"``, ``"activations"``), the float32 fraction of
      the quantiser's inputs in its zero-gradient region: :math:`v = u/s` outside
      :math:`[-Q_N, Q_P]` for LSQ, :math:`u` outside :math:`[0, \alpha)` for PACT,
      :math:`|u| > 1` for the sign, and 1 for
      ``round_no_ste`` (its input gradient is zero everywhere). Under ``vmap``
      each gets a batch axis; average it.

    Raises:
      TypeError: configs of the wrong type, ``x`` not float32, a parameter of the
        wrong dtype, or a missing or untyped ``key`` when dropout needs one.
      ValueError: ``x`` not one example of ``in_features`` features (a batch
        needs ``vmap``), or parameters of the wrong shape.

    Example:
      >>> import functools, jax, jax.numpy as jnp
      >>> from stejax.model import MLPConfig, apply, init_params, preset
      >>> mc, qc = MLPConfig(hidden=(16, 12)), preset("w4a4")
      >>> params = init_params(jax.random.key(0), mc, qc)
      >>> apply_stats = functools.partial(apply, model_config=mc, qat_config=qc, return_stats=True)
      >>> logits, stats = jax.jit(apply_stats)(params, jnp.zeros(64))
      >>> logits.shape, sorted(stats["layer_0"])
      ((10,), ['activations', 'weights'])
    """
    check_configs("apply", model_config, qat_config)
    check_params(params, param_spec(model_config, qat_config))
    x = _check_example(x, model_config.in_features)
    layers = architecture(model_config)
    dropout_keys: list[jax.Array] = []
    rate = model_config.dropout
    if train and rate > 0 and len(layers) > 1:
        if key is None:
            raise TypeError(f"apply: train=True with dropout {rate} needs a PRNG key as the keyword argument `key`.")
        keys.check_key(key, what="apply: key")
        dropout_keys = list(keys.split(key, len(layers) - 1, where="apply: dropout keys"))
    logits, stats = run(params, x, model_config, qat_config, dropout_keys=dropout_keys)
    return (logits, stats) if return_stats else logits


def run(
    params: Any,
    x: jax.Array,
    model_config: ModelConfig,
    qat_config: QATConfig,
    *,
    dropout_keys: Sequence[jax.Array] = (),
    stop_at: int | None = None,
):
    """The forward pass without argument checks; with ``stop_at=i``, layer i's input before quantisation."""
    layers = architecture(model_config)
    n = len(layers)
    rate = model_config.dropout
    stats: dict[str, dict[str, jax.Array]] = {}
    z = x
    for i, (layer, p) in enumerate(zip(layers, params["layers"], strict=True)):
        lq = qat_config.layer(i, n)
        sign_input = lq.activations is not None and lq.activations.method == "sign"
        u = z if (i == 0 or sign_input) else jax.nn.relu(z)
        u = jnp.reshape(u, layer.in_shape)
        if stop_at == i:
            return u
        a, a_frac = quantize_input(u, p.get("a_step"), lq.activations, signed=(i == 0), alpha=p.get("a_alpha"))
        if dropout_keys and i > 0:
            k = keys.consume(dropout_keys[i - 1], where=f"apply: dropout on layer {i}'s input")
            keep = jax.random.bernoulli(k, 1.0 - rate, a.shape)
            a = jnp.where(keep, a / (1.0 - rate), jnp.zeros_like(a))
        w, w_frac = quantize_weights(p["w"], p.get("w_step"), lq.weights)
        z = _linear(layer, a, w) + jnp.reshape(p["b"], (1,) * (len(layer.in_shape) - 1) + (-1,))
        layer_stats = {name: f for name, f in (("weights", w_frac), ("activations", a_frac)) if f is not None}
        if layer_stats:
            stats[f"layer_{i}"] = layer_stats
    return z, stats


def _linear(layer: Layer, a: jax.Array, w: jax.Array) -> jax.Array:
    if layer.kind == "dense":
        return jnp.dot(a, w, precision=_HIGHEST)
    y = jax.lax.conv_general_dilated(
        a[None],
        w,
        window_strides=(layer.stride, layer.stride),
        padding="SAME",
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
        precision=_HIGHEST,
    )
    return y[0]


def _check_example(x: Any, in_features: int) -> jax.Array:
    # The dtype is read before jnp.asarray, which would silently turn a float64
    # NumPy array into float32 when x64 is off.
    dtype = getattr(x, "dtype", None)
    if dtype is None or dtype != jnp.float32:
        got = f"dtype {dtype}" if dtype is not None else f"a {type(x).__name__}"
        raise TypeError(f"apply: x must be a float32 array; got {got}. Cast explicitly, e.g. x.astype(jnp.float32).")
    x = jnp.asarray(x)
    if x.shape != (in_features,):
        hint = " A batch needs jax.vmap over apply." if x.ndim == 2 and x.shape[-1] == in_features else ""
        raise ValueError(f"apply: x must be one example of shape ({in_features},); got shape {x.shape}.{hint}")
    return x
