"""From the fake-quantised parameters to integer codes and scales, checked bit for bit."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from stejax.data import Normalizer
from stejax.estimators.uniform import lsq_levels
from stejax.export._model import ExportedModel, InputFormat, LayerSpec, WeightFormat, dequantised_weights
from stejax.lowbit._packing import pack_codes
from stejax.model import ModelConfig, QATConfig, Quantizer, check_params, param_spec
from stejax.model._quantize import pact_step, quantize_weights
from stejax.model._spec import architecture

__all__ = ["ExportError", "export_model", "layer_specs"]


class ExportError(ValueError):
    """The exported model would not be the trained one (a weight that does not dequantise back, bit for bit)."""


# One compiled program per layer rather than one per eager operation.
_quantize_weights = jax.jit(quantize_weights, static_argnums=(2,))
_dequantised_weights = jax.jit(dequantised_weights, static_argnums=(0, 2))


def _weight_format(q: Quantizer | None) -> WeightFormat:
    if q is None:
        return WeightFormat("float", 32)
    return WeightFormat(q.method, q.bits, q.granularity)


def _input_format(q: Quantizer | None, *, first: bool) -> InputFormat:
    if q is None:
        return InputFormat()
    return InputFormat(q.method, q.bits, signed=first and q.method != "sign")


def layer_specs(model_config: ModelConfig, qat_config: QATConfig) -> tuple[LayerSpec, ...]:
    """The exported layers of a model and QAT config (formats follow ``qat_config.layer(i, n)``)."""
    layers = architecture(model_config)
    out = []
    for i, layer in enumerate(layers):
        lq = qat_config.layer(i, len(layers))
        sign_input = lq.activations is not None and lq.activations.method == "sign"
        out.append(
            LayerSpec(
                kind=layer.kind,
                in_shape=layer.in_shape,
                w_shape=layer.w_shape,
                stride=layer.stride,
                relu=i > 0 and not sign_input,
                weights=_weight_format(lq.weights),
                inputs=_input_format(lq.activations, first=i == 0),
            )
        )
    return tuple(out)


def _codes(fmt: WeightFormat, w: np.ndarray, step: np.ndarray | None, wq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(integer codes, float32 scale) of one weight; ``wq`` is the fake-quantised weight."""
    if fmt.method == "sign":
        codes = np.where(np.signbit(w) & (w != 0), -1, 1)
        # The scale is |wq| of any element of the channel (tensor): wq = scale * (+-1) exactly.
        if fmt.granularity == "channel":
            scale = np.abs(wq.reshape(-1, wq.shape[-1])[0])
        else:
            scale = np.abs(wq.reshape(-1)[0])
        return codes, np.asarray(scale, np.float32)
    qn, qp = lsq_levels(fmt.bits, True)
    s = np.asarray(step, np.float32)
    s_b = s if s.ndim == 0 else s.reshape((1,) * (w.ndim - 1) + (-1,))
    v = w * (np.float32(1) / s_b)
    codes = np.round(np.where(v < -qn, np.float32(-qn), np.where(v > qp, np.float32(qp), v)))
    return codes.astype(np.int64), s


def export_model(
    params: Any, model_config: ModelConfig, qat_config: QATConfig, normalizer: Normalizer
) -> ExportedModel:
    """The :class:`ExportedModel` of trained fake-quantised parameters.

    For each layer the weight codes are computed from the float weights and the
    learned step (``round(clip(w * (1/s)))``, or the sign and ``mean |w|`` for
    binary weights), packed, and then unpacked and dequantised again and compared
    with :func:`stejax.model.apply`'s fake-quantised weights bit for bit (a zero
    counts as equal to a zero of the other sign: a code of 0 has no sign, and
    the sign of a zero weight changes no product's value).

    Raises:
      ExportError: a layer whose dequantised weights differ from the fake-quantised
        ones (the layer, the element and both values).
      ValueError, TypeError: parameters that do not fit the configs, or a
        normaliser of the wrong length.
    """
    check_params(params, param_spec(model_config, qat_config))
    if normalizer.mean.shape != (model_config.in_features,):
        raise ValueError(
            f"export_model: the normaliser has {normalizer.mean.shape[0]} features; the model takes "
            f"{model_config.in_features}."
        )
    specs = layer_specs(model_config, qat_config)
    n = len(specs)
    layers = []
    for i, (spec, p) in enumerate(zip(specs, params["layers"], strict=True)):
        w = np.asarray(jax.device_get(p["w"]), np.float32)
        wq, _ = _quantize_weights(p["w"], p.get("w_step"), qat_config.layer(i, n).weights)
        wq = np.asarray(jax.device_get(wq), np.float32)
        out: dict[str, jax.Array] = {}
        if spec.weights.quantised:
            step = None if p.get("w_step") is None else np.asarray(jax.device_get(p["w_step"]), np.float32)
            codes, scale = _codes(spec.weights, w, step, wq)
            out["w"] = jnp.asarray(pack_codes(codes, spec.weights.container))
            out["w_scale"] = jnp.asarray(scale)
        else:
            out["w"] = jnp.asarray(w)
        out["b"] = jnp.asarray(np.asarray(jax.device_get(p["b"]), np.float32))
        if "a_step" in p and spec.inputs.method in ("lsq", "round_no_ste"):
            out["a_step"] = jnp.asarray(np.asarray(jax.device_get(p["a_step"]), np.float32))
        elif spec.inputs.method == "pact":
            # The clip level becomes the integer path's input scale: PACT's own step, the same float32 product.
            out["a_step"] = jnp.asarray(np.asarray(jax.device_get(pact_step(p["a_alpha"], spec.inputs.quantised_bits))))
        _check_dequantised(i, spec, out, wq)
        layers.append(out)
    weights = {
        "normalizer": {"mean": jnp.asarray(normalizer.mean), "std": jnp.asarray(normalizer.std)},
        "layers": tuple(layers),
    }
    return ExportedModel(
        layers=specs, weights=weights, input_shape=(model_config.in_features,), n_classes=model_config.n_classes
    )


def _check_dequantised(i: int, spec: LayerSpec, p: dict[str, jax.Array], wq: np.ndarray) -> None:
    got = np.asarray(_dequantised_weights(spec.weights, p, spec.w_shape))
    # Bit for bit, except that an integer code cannot carry the sign of a zero:
    # fake quantisation gives -0.0 for small negative weights, the codes +0.0.
    same = (got.view(np.uint32) == wq.view(np.uint32)) | ((got == 0) & (wq == 0))
    if not same.all():
        where = tuple(int(k) for k in np.argwhere(~same)[0])
        raise ExportError(
            f"export: layer {i} ({spec.weights.method}, {spec.weights.bits} bits): the dequantised weight at "
            f"{where} is {got[where]!r}; the fake-quantised model uses {wq[where]!r} ({int((~same).sum())} of "
            f"{same.size} elements differ)."
        )
