"""From NNX layers to the functional model's parameter PyTree, and from its quantisers to Quant."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from stejax.estimators.uniform import lsq_levels
from stejax.flax._layers import QuantConv, QuantLinear
from stejax.flax._quant import ROLES, Quant
from stejax.model import ConvConfig, ModelConfig, QATConfig, Quantizer, check_params, param_spec

__all__ = ["functional_params", "quant_of"]


_NO_LAYER_FORM = {
    "round_no_ste": "plain jnp.round has a zero gradient; it exists only as the functional model's baseline.",
    "pact": "PACT is a clipped ReLU; it quantises inputs only.",
    "sign": "the functional model flattens the kernel for a per-tensor sign; use granularity 'channel'.",
}


def quant_of(quantizer: Quantizer | None, role: str, *, signed: bool = True) -> Quant | None:
    r"""The :class:`Quant` that computes what a functional model's :class:`stejax.model.Quantizer` computes.

    ``"lsq"`` is :func:`stejax.lsq`: weights on the signed grid (``axis=-1`` when
    per channel), inputs on the grid ``signed`` picks (True for the first
    layer's standardised features, False after a ReLU). ``"sign"`` is
    :func:`stejax.magnitude_aware_sign` per output channel for weights and
    :func:`stejax.sign_ste` for inputs. ``"pact"`` (inputs only) is
    :func:`stejax.pact` at the same bits, starting from the functional model's
    uncalibrated clip level :math:`2\sqrt{2^b - 1}` (:func:`stejax.model.init_params`).

    Args:
      quantizer: the functional quantiser, or None (float).
      role: ``"weights"`` or ``"activations"``.
      signed: the LSQ input grid (inputs only; default True).

    Raises:
      ValueError: ``"round_no_ste"`` (the baseline without an estimator), per-tensor
        sign weights (the functional model flattens the kernel first), ``"pact"``
        weights, or an unknown role.

    Example:
      >>> from stejax.flax import quant_of
      >>> from stejax.model import Quantizer
      >>> quant_of(Quantizer("lsq", 4), "activations", signed=False)
      Quant('lsq', axis=None, bits=4, grad_scale=None, signed=False)
    """
    if role not in ROLES:
        raise ValueError(f"quant_of: role must be one of {list(ROLES)}; got {role!r}.")
    if quantizer is None:
        return None
    weights = role == "weights"
    if quantizer.method == "lsq":
        axis = -1 if quantizer.granularity == "channel" else None
        return Quant("lsq", bits=quantizer.bits, signed=True if weights else signed, axis=axis)
    if quantizer.method == "pact" and not weights:
        # The functional model's starting clip level (stejax.model.init_params without calibration data).
        _, qp = lsq_levels(quantizer.bits, False)
        return Quant("pact", bits=quantizer.bits, init={"alpha": 2.0 * math.sqrt(qp)})
    if quantizer.method == "sign" and not weights:
        return Quant("sign_ste")
    if quantizer.method == "sign" and quantizer.granularity == "channel":
        return Quant("magnitude_aware_sign", axis=-1)
    raise ValueError(
        f"quant_of: {role} {quantizer.describe()} has no layer form: "
        + _NO_LAYER_FORM.get(quantizer.method, _NO_LAYER_FORM["sign"])
    )


def functional_params(
    layers: Sequence[QuantLinear | QuantConv], model_config: ModelConfig, qat_config: QATConfig
) -> dict[str, tuple[dict[str, jax.Array], ...]]:
    """The parameters of NNX layers as the functional model's PyTree, for :func:`stejax.model.apply` and export.

    ``layers`` are the model's weight layers in order, one per functional layer:
    a :class:`QuantConv` for each convolution of a :class:`stejax.model.ConvConfig`
    (its stride, ``"SAME"`` padding, no dilation or groups) and a
    :class:`QuantLinear` for each dense layer. Each layer must quantise as
    ``qat_config`` says for its position (:func:`quant_of`); the layer's kernel,
    bias, ``weight_step``, ``input_step`` and ``input_alpha`` (PACT's clip level) become
    ``w``, ``b``, ``w_step``, ``a_step`` and ``a_alpha`` (see
    :func:`stejax.model.param_spec`). A quantiser's starting value (``Quant(...,
    init=...)``) is not compared: it does not change what the layer computes. The result is checked
    against the spec. The functional model's forward uses the ReLU (or, before a
    sign input, nothing) between layers and reads a convolutional model's input
    as a flat image; a model that computes the same (as
    :class:`stejax.flax.example.DigitsCNN` does) gives the same logits.

    Args:
      layers: the NNX layers, in order.
      model_config: the functional architecture they implement.
      qat_config: its quantisation.

    Returns:
      ``{"layers": ({"w", "b", "w_step"?, "a_step"?, "a_alpha"?}, ...)}`` of float32 arrays.

    Raises:
      ValueError: a different number of layers, a layer of the wrong kind,
        geometry or shape, or quantised otherwise than ``qat_config`` says; the
        message names the layer.
      TypeError: a layer that is not a QuantLinear or QuantConv.
    """
    spec = param_spec(model_config, qat_config)
    n = model_config.n_layers
    if len(layers) != n:
        raise ValueError(f"functional_params: the model config has {n} weight layers; got {len(layers)} layers.")
    out = []
    for i, layer in enumerate(layers):
        where = f"functional_params: layer {i}"
        w_shape = spec[f"layers/{i}/w"][0]
        conv = len(w_shape) == 4
        expected_type = QuantConv if conv else QuantLinear
        if not isinstance(layer, expected_type):
            raise TypeError(f"{where} must be a {expected_type.__name__}; got {type(layer).__name__}.")
        if isinstance(layer, QuantConv):
            _check_conv(layer, model_config, i, where)
        kernel = layer.kernel[...]
        if tuple(kernel.shape) != tuple(w_shape):
            raise ValueError(f"{where}: kernel shape {tuple(kernel.shape)}; the model config needs {tuple(w_shape)}.")
        if layer.bias is None:
            raise ValueError(f"{where} has no bias; the functional model's layers all have one.")
        lq = qat_config.layer(i, n)
        _check_quant(layer.weights, quant_of(lq.weights, "weights"), kernel.ndim, f"{where} weights")
        _check_quant(layer.activations, quant_of(lq.activations, "activations", signed=(i == 0)), 1, f"{where} inputs")
        p = {"w": kernel, "b": layer.bias[...]}
        if lq.weights is not None and lq.weights.method == "lsq":
            p["w_step"] = getattr(layer, "weight_step")[...]  # noqa: B009 - made by the layer's Quant
        if lq.activations is not None and lq.activations.method == "lsq":
            p["a_step"] = jnp.reshape(getattr(layer, "input_step")[...], ())  # noqa: B009
        if lq.activations is not None and lq.activations.method == "pact":
            p["a_alpha"] = jnp.reshape(getattr(layer, "input_alpha")[...], ())  # noqa: B009
        out.append({k: jnp.asarray(v, jnp.float32) for k, v in p.items()})
    params = {"layers": tuple(out)}
    check_params(params, spec)
    return params


def _check_conv(layer: QuantConv, model_config: Any, i: int, where: str) -> None:
    assert isinstance(model_config, ConvConfig)
    stride = model_config.strides[i]
    geometry = (layer.strides, layer.padding, layer.kernel_dilation, layer.feature_group_count)
    wanted = ((stride, stride), "SAME", (1, 1), 1)
    if geometry != wanted:
        raise ValueError(
            f"{where}: strides, padding, dilation and groups are {geometry}; the functional model uses {wanted}."
        )


def _check_quant(got: Quant | None, wanted: Quant | None, ndim: int, where: str) -> None:
    if _normal(got, ndim) != _normal(wanted, ndim):
        raise ValueError(f"{where} are quantised by {got}; the QAT config needs {wanted}.")


def _normal(quant: Quant | None, ndim: int) -> Any:
    """A comparable form: the channel axis counted from the end (axis=1 of a matrix is axis=-1), no start value."""
    if quant is None:
        return None
    params = quant.params
    if isinstance(params.get("axis"), int):
        params["axis"] = params["axis"] % ndim - ndim
    return (quant.name, tuple(sorted(params.items())))
