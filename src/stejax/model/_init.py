"""Parameter initialisation: He-normal weights, zero biases, LSQ steps from the data."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from stejax import keys
from stejax.estimators.uniform import lsq_levels
from stejax.model._config import ModelConfig, QATConfig
from stejax.model._contract import input_contract
from stejax.model._forward import run
from stejax.model._spec import CLIP_METHODS, STEP_METHODS, architecture, check_configs

__all__ = ["init_params"]


def init_params(
    key: jax.Array,
    model_config: ModelConfig,
    qat_config: QATConfig,
    *,
    calibration_batch: ArrayLike | None = None,
) -> dict[str, tuple[dict[str, jax.Array], ...]]:
    r"""Initialise the parameter PyTree ``{"layers": ({"w", "b", "w_step"?, "a_step"?, "a_alpha"?}, ...)}``.

    * ``w``: He normal, :math:`w \sim \mathcal{N}(0, 2/\text{fan\_in})` with
      fan_in = ``in`` for dense and ``k * k * in`` for conv kernels, in every layer
      (the output layer too). Layer ``i`` draws from the ``i``-th of
      ``n_layers`` subkeys of ``key`` (``stejax.keys.split``), so a layer's weights
      do not depend on the other layers' shapes.
    * ``b``: zeros.
    * ``w_step`` (LSQ and round_no_ste weights): LSQ's
      :math:`2\,\langle|w|\rangle/\sqrt{Q_P}` over the tensor, or per output
      channel, with :math:`Q_P = 2^{b-1}-1`.
    * ``a_step`` (LSQ and round_no_ste inputs): :math:`2\,\langle|u|\rangle/\sqrt{Q_P}`
      with :math:`Q_P` of the layer's grid (signed for layer 0, unsigned after a
      ReLU). Without ``calibration_batch`` :math:`\langle|u|\rangle` is taken as 1
      (standardised inputs); with one, it is the mean of :math:`|u|` over the batch
      (Esser et al.'s initialisation from the data), layer by layer: layer ``i``'s
      inputs are computed through layers ``0..i-1`` with their quantisers and the
      steps already calibrated. A mean of 0 keeps the fixed value.
    * ``a_alpha`` (PACT inputs): the clipping level at the top of the range LSQ's
      initial step would give, :math:`\alpha = Q_P \cdot 2\,\langle|u|\rangle/\sqrt{Q_P}
      = 2\,\langle|u|\rangle\sqrt{Q_P}` with :math:`Q_P = 2^b - 1` (7.7 at 4 bits for
      :math:`\langle|u|\rangle = 1`), :math:`\langle|u|\rangle` as for ``a_step``:
      1 without a calibration batch, the batch's mean of the ReLU output with one.
      The paper's fixed start (10) and L2 penalty on :math:`\alpha` are not used:
      the start follows the data, and the clip's gradient
      :math:`\mathbb{1}[u \ge \alpha]` alone trains it.

    All leaves are float32; :func:`param_spec` lists the paths and shapes.

    Args:
      key: a typed PRNG key (``jax.random.key``).
      model_config: an :class:`MLPConfig` or :class:`ConvConfig`.
      qat_config: a :class:`QATConfig`.
      calibration_batch: optional float32 features ``(N, in_features)`` that
        satisfy the model's :class:`InputContract`.

    Returns:
      The parameter PyTree. The same key gives the same parameters.

    Raises:
      TypeError: ``key`` is not a typed key, a config of the wrong type, or a
        calibration batch of the wrong dtype.
      ValueError: a calibration batch of the wrong shape or with NaN or inf.

    Example:
      >>> import jax
      >>> from stejax.model import MLPConfig, init_params, preset
      >>> p = init_params(jax.random.key(0), MLPConfig(hidden=(16, 12)), preset("w1a32"))
      >>> [sorted(layer) for layer in p["layers"]]
      [['b', 'w', 'w_step'], ['b', 'w'], ['b', 'w', 'w_step']]
    """
    check_configs("init_params", model_config, qat_config)
    keys.check_key(key, what="init_params: key")
    layers = architecture(model_config)
    n = len(layers)
    layer_keys = list(keys.split(key, n, where="init_params: one key per layer"))
    out = []
    for i, (layer, k) in enumerate(zip(layers, layer_keys, strict=True)):
        lq = qat_config.layer(i, n)
        std = np.float32(math.sqrt(2.0 / layer.fan_in))
        w = jax.random.normal(keys.consume(k, where=f"init_params: layer {i} weights"), layer.w_shape, jnp.float32)
        w = w * std
        p = {"w": w, "b": jnp.zeros((layer.out_channels,), jnp.float32)}
        if lq.weights is not None and lq.weights.method in STEP_METHODS:
            _, qp = lsq_levels(lq.weights.bits, True)
            axes = None if lq.weights.granularity == "tensor" else tuple(range(w.ndim - 1))
            p["w_step"] = jnp.mean(jnp.abs(w), axis=axes) * np.float32(2.0 / math.sqrt(qp))
        if lq.activations is not None and lq.activations.method in STEP_METHODS:
            p["a_step"] = jnp.asarray(_input_step(1.0, lq.activations.bits, signed=(i == 0)), jnp.float32)
        if lq.activations is not None and lq.activations.method in CLIP_METHODS:
            p["a_alpha"] = jnp.asarray(_clip_level(1.0, lq.activations.bits), jnp.float32)
        out.append(p)
    params = {"layers": tuple(out)}
    if calibration_batch is not None:
        params = _calibrate(params, calibration_batch, model_config, qat_config)
    return params


def _input_step(mean_abs: float, bits: int, *, signed: bool) -> float:
    _, qp = lsq_levels(bits, signed)
    return 2.0 * mean_abs / math.sqrt(qp)


def _clip_level(mean_abs: float, bits: int) -> float:
    _, qp = lsq_levels(bits, False)
    return qp * _input_step(mean_abs, bits, signed=False)


def _calibrate(params: Any, batch: ArrayLike, model_config: ModelConfig, qat_config: QATConfig) -> Any:
    contract = input_contract(model_config)
    contract.check(batch)
    xs = jnp.reshape(jnp.asarray(batch), (-1, *contract.shape))
    n = len(params["layers"])
    for i in range(n):
        q = qat_config.layer(i, n).activations
        if q is None or q.method not in STEP_METHODS + CLIP_METHODS:
            continue
        u = jax.vmap(lambda x, params=params, i=i: run(params, x, model_config, qat_config, stop_at=i))(xs)
        mean_abs = float(jnp.mean(jnp.abs(u)))
        if not (math.isfinite(mean_abs) and mean_abs > 0):
            continue
        layers = list(params["layers"])
        if q.method in CLIP_METHODS:
            layers[i] = dict(layers[i], a_alpha=jnp.asarray(_clip_level(mean_abs, q.bits), jnp.float32))
        else:
            layers[i] = dict(layers[i], a_step=jnp.asarray(_input_step(mean_abs, q.bits, signed=(i == 0)), jnp.float32))
        params = {"layers": tuple(layers)}
    return params
