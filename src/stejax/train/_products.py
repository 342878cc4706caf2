"""Integer products in the reference pipeline: the quantised layers multiply int8 x int8 -> int32.

A :class:`TrainConfig` with ``product="int8-forward"`` or ``"int8"`` trains the
same model with :func:`stejax.integer_dot_general` in place of the fake-quantised
float products of its 8-bit layers. The product brings its own quantisation
(dynamic absmax scales: one per example, or per convolution patch, for the
inputs; one per output channel for the weights), so those layers keep no LSQ
step: their parameters are a float layer's, ``w`` and ``b``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from stejax import keys
from stejax.lowbit._products import integer_dot_general
from stejax.model import LayerQuant, ModelConfig, QATConfig, check_params, param_spec
from stejax.model._spec import Layer, architecture

__all__ = ["PRODUCTS", "IntegerProducts", "integer_logits", "with_product"]

PRODUCTS = ("fake-quant", "int8-forward", "int8")
# The backward each integer kind gives integer_dot_general.
_BACKWARD = {"int8-forward": "float", "int8": "int8"}
_HIGHEST = jax.lax.Precision.HIGHEST


@dataclasses.dataclass(frozen=True)
class IntegerProducts(QATConfig):
    """A QAT configuration whose quantised layers multiply as integer products.

    Built by :func:`with_product` (``TrainConfig(product=...).qat_config()``), not by
    hand. ``hidden``, ``first`` and ``last`` are float :class:`stejax.model.LayerQuant`
    (so :func:`stejax.model.param_spec` gives those layers ``w`` and ``b`` only);
    the layers that ``source`` quantises run :func:`stejax.integer_dot_general`
    instead, with 8-bit absmax codes: one scale per example (per patch for a
    convolution) for the inputs and one per output channel for the weights.
    :func:`stejax.train.forward` runs such a configuration; :func:`stejax.model.apply`
    does not know it and would run every layer in float.

    Attributes:
      product: ``"int8-forward"`` (integer forward product, float straight-through
        gradient) or ``"int8"`` (the forward and both backward products in int8,
        the declared gradient of :func:`stejax.integer_dot_general`).
      source: the fake-quant configuration it was made from (its name and which
        layers are quantised).
    """

    product: str = "int8"
    source: QATConfig | None = None

    def __post_init__(self):
        super().__post_init__()
        if self.product not in _BACKWARD:
            raise ValueError(f"IntegerProducts: product must be one of {list(_BACKWARD)}; got {self.product!r}.")
        if not isinstance(self.source, QATConfig) or isinstance(self.source, IntegerProducts):
            raise TypeError(f"IntegerProducts: source must be a fake-quant QATConfig; got {self.source!r}.")

    def integer_layer(self, index: int, n_layers: int) -> bool:
        """Whether layer ``index`` of ``n_layers`` multiplies in integers (``source`` quantises it)."""
        return _quantised(self.source.layer(index, n_layers))  # type: ignore[union-attr]

    def describe(self) -> str:
        """One sentence for a report."""
        backward = "float straight-through gradient" if self.product == "int8-forward" else "int8 backward products"
        return (
            f"{self.name} with {self.product} products: each quantised layer multiplies int8 x int8 -> int32 "
            f"(absmax scales, inputs per example, weights per output channel; {backward})."
        )


def _quantised(lq: LayerQuant) -> bool:
    return lq.weights is not None or lq.activations is not None


def _layer_parts(qat: QATConfig) -> list[tuple[str, LayerQuant]]:
    parts = [("hidden layers", qat.hidden)]
    parts += [(f"{name} layer", lq) for name, lq in (("first", qat.first), ("last", qat.last)) if lq is not None]
    return parts


def _eight_bit_lsq(lq: LayerQuant) -> bool:
    return all(q is not None and q.method == "lsq" and q.bits == 8 for q in (lq.weights, lq.activations))


def with_product(qat: QATConfig, product: str) -> QATConfig:
    """``qat`` with the given product kind: ``qat`` itself for ``"fake-quant"``, else :class:`IntegerProducts`.

    Raises:
      ValueError: an unknown product, an :class:`IntegerProducts` ``qat``, or a
        configuration an integer product cannot run: one that quantises no layer,
        or a quantised layer whose weights and inputs are not both 8-bit LSQ (the
        message names the layers and the fix).

    Example:
      >>> from stejax.model import preset
      >>> from stejax.train._products import with_product
      >>> with_product(preset("w8a8"), "int8").hidden.describe()
      'weights float, activations float'
    """
    if product not in PRODUCTS:
        raise ValueError(f"TrainConfig: product must be one of {list(PRODUCTS)}; got {product!r}.")
    if isinstance(qat, IntegerProducts):
        raise ValueError(
            f"TrainConfig: qat must be a fake-quant configuration; got {qat.name!r} with {qat.product} products. "
            f"Give its source configuration as qat and product={qat.product!r}."
        )
    if product == "fake-quant":
        return qat
    what = (
        f"product {product!r} multiplies each quantised layer as int8 x int8 -> int32 on the product's own absmax "
        "grids (inputs per example or convolution patch, weights per output channel) in place of its LSQ "
        "quantisers, so it takes configurations whose quantised layers all have 8-bit LSQ weights and inputs "
        "(the preset w8a8)"
    )
    parts = _layer_parts(qat)
    if not any(_quantised(lq) for _, lq in parts):
        raise ValueError(
            f"TrainConfig: {what}; {qat.name!r} quantises no layer. Use preset w8a8 with product {product!r}, "
            "or product 'fake-quant'."
        )
    bad = [f"{where} with {lq.describe()}" for where, lq in parts if _quantised(lq) and not _eight_bit_lsq(lq)]
    if bad:
        raise ValueError(
            f"TrainConfig: {what}; {qat.name!r} has {'; '.join(bad)}. Use preset w8a8 with product {product!r}, "
            f"or product 'fake-quant' for {qat.name!r}."
        )
    float_layer = LayerQuant()
    return IntegerProducts(
        qat.name,
        float_layer,
        None if qat.first is None else float_layer,
        None if qat.last is None else float_layer,
        product=product,
        source=qat,
    )


def integer_logits(
    params: Any,
    x: jax.Array,
    *,
    model_config: ModelConfig,
    qat_config: IntegerProducts,
    example_keys: jax.Array | None,
) -> tuple[jax.Array, dict[str, dict[str, jax.Array]]]:
    r"""The logits of a batch with integer products in the quantised layers: ``(N, n_classes)``, and no statistics.

    The model of :func:`stejax.model.apply` (ReLU between layers, ``"SAME"``
    convolutions, dropout on every layer input after the first), computed on the
    whole batch at once so that each product is one ``dot_general`` over the batch:
    a dense layer multiplies ``(N, in) x (in, out)``, a convolution its patches
    ``(N, H', W', C k k) x (C k k, out)`` (``jax.lax.conv_general_dilated_patches``).
    A quantised layer uses :func:`stejax.integer_dot_general` with per-row input
    scales (per example, per patch) and per-column weight scales (per output
    channel); the other layers multiply in float at ``Precision.HIGHEST``. Dropout
    masks are those of :func:`stejax.model.apply` for the same per-example keys;
    the mask acts on the layer input before the product quantises it. Absmax scales
    never clip, so the integer layers have no zero-gradient region and report no
    fraction.
    """
    check_params(params, param_spec(model_config, qat_config))
    layers = architecture(model_config)
    n = len(layers)
    rate = model_config.dropout
    masks: Sequence[jax.Array] = ()
    if example_keys is not None and rate > 0 and n > 1:
        masks = jax.vmap(functools.partial(_dropout_masks, layers=layers, rate=rate))(example_keys)
    batch = x.shape[0]
    z = x
    for i, (layer, p) in enumerate(zip(layers, params["layers"], strict=True)):
        u = z if i == 0 else jax.nn.relu(z)
        u = jnp.reshape(u, (batch, *layer.in_shape))
        if masks and i > 0:
            u = jnp.where(masks[i - 1], u / (1.0 - rate), jnp.zeros_like(u))
        backward = _BACKWARD[qat_config.product] if qat_config.integer_layer(i, n) else None
        z = _product(layer, u, p["w"], backward) + jnp.reshape(p["b"], (1,) * len(layer.in_shape) + (-1,))
    return z, {}


def _dropout_masks(key: jax.Array, *, layers: Sequence[Layer], rate: float) -> list[jax.Array]:
    """One example's keep masks, drawn as :func:`stejax.model.apply` draws them (one subkey per layer input)."""
    dropout_keys = keys.split(key, len(layers) - 1, where="apply: dropout keys")
    return [
        jax.random.bernoulli(
            keys.consume(dropout_keys[i - 1], where=f"apply: dropout on layer {i}'s input"),
            1.0 - rate,
            layers[i].in_shape,
        )
        for i in range(1, len(layers))
    ]


def _product(layer: Layer, u: jax.Array, w: jax.Array, backward: str | None) -> jax.Array:
    """A batch's layer product; ``backward`` None: float, else integer_dot_general with that backward."""
    if layer.kind == "conv":
        kh, kw, cin, cout = layer.w_shape
        # Patches hold each window's features channel-major, (C, kh, kw): the kernel is laid out to match.
        u = jax.lax.conv_general_dilated_patches(
            u,
            (kh, kw),
            (layer.stride, layer.stride),
            "SAME",
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
            precision=_HIGHEST,
        )
        w = jnp.reshape(jnp.transpose(w, (2, 0, 1, 3)), (cin * kh * kw, cout))
    dims = (((u.ndim - 1,), (0,)), ((), ()))
    if backward is None:
        return jax.lax.dot_general(u, w, dims, precision=_HIGHEST)
    return integer_dot_general(u, w, dims, lhs_scale="row", rhs_scale="column", backward=backward)
