r"""PTQ of the reference models (:mod:`stejax.model`): a float run's parameters to a quantised form's.

A *form* names what is quantised: ``"w<b>a<c>"`` is ``b``-bit weights (one
step per output channel) and ``c``-bit inputs in the hidden layers, with the
first and last layers at 8 bits, as the QAT presets keep them; ``c = 32`` keeps
every input in float (weight-only). :func:`form_config` gives its
:class:`stejax.model.QATConfig`, whose LSQ steps :func:`quantize_params` fills:
the parameters it returns are those a QAT run of that configuration would
have, so :func:`stejax.model.apply`, the export and QAT take them unchanged.

Numerics: float32 throughout; products at ``Precision.HIGHEST``; GPTQ's
Hessian accumulated in float32 and dampened before its Cholesky factor
(:func:`stejax.ptq.gptq`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from stejax.estimators.calibration import mse_scale
from stejax.model import LayerQuant, ModelConfig, QATConfig, Quantizer, check_params, param_spec, preset
from stejax.model._forward import run
from stejax.model._spec import Layer, architecture
from stejax.ptq._awq import awq
from stejax.ptq._gptq import GPTQResult, gptq, round_to_nearest
from stejax.ptq._smoothquant import smoothquant_scales

__all__ = ["PTQ_METHODS", "PTQParams", "fold_channel_scales", "form_config", "layer_rows", "quantize_params"]

PTQ_METHODS = ("rtn", "gptq", "awq", "smoothquant")
_FORM = re.compile(r"w([2-8])a([2-8]|32)")
_HIGHEST = jax.lax.Precision.HIGHEST


class PTQParams(NamedTuple):
    """The quantised parameters, their configuration, and what was done to each layer."""

    params: Any  # the parameter PyTree of qat_config (stejax.model.param_spec), float32 leaves
    qat_config: QATConfig  # the form's configuration (form_config)
    layers: tuple[dict[str, Any], ...]  # per layer: index, kind, weight bits, input scale, method details


def form_config(form: str) -> QATConfig:
    r"""The QAT configuration of a PTQ form ``"w<b>a<c>"``, named ``"<form>_channel"``.

    Hidden layers: ``b``-bit LSQ weights with one step per output channel, and
    ``c``-bit LSQ inputs (none when ``c`` is 32). First and last layers: 8-bit
    weights per output channel, 8-bit inputs (float when ``c`` is 32). With
    ``b = 2`` PTQ writes ternary codes, :math:`\{-1, 0, 1\} \cdot s` (the
    symmetric grid of :func:`stejax.ptq.symmetric_grid`), which LSQ's signed
    2-bit grid :math:`\{-2, \dots, 1\}` contains.

    Raises:
      ValueError: a form outside that pattern; the message gives examples.

    Example:
      >>> form_config("w4a8").describe()
      'w4a8_channel: hidden layers weights 4-bit lsq (per channel), activations 8-bit lsq; first layer weights 8-bit lsq (per channel), activations 8-bit lsq; last layer weights 8-bit lsq (per channel), activations 8-bit lsq.'
    """  # noqa: E501 (a doctest's output line)
    match = _FORM.fullmatch(form) if isinstance(form, str) else None
    if match is None:
        raise ValueError(
            "form_config: a form is 'w<b>a<c>' with weight bits b in [2, 8] and input bits c in [2, 8], or 32 for "
            f"float inputs (weight-only): e.g. 'w8a8', 'w4a8', 'w4a4', 'w4a32', 'w2a8'; got {form!r}."
        )
    w_bits, a_bits = int(match[1]), int(match[2])

    def inputs(bits: int) -> Quantizer | None:
        return None if a_bits == 32 else Quantizer("lsq", bits)

    edge = LayerQuant(Quantizer("lsq", 8, "channel"), inputs(8))
    return QATConfig(f"{form}_channel", LayerQuant(Quantizer("lsq", w_bits, "channel"), inputs(a_bits)), edge, edge)


def layer_rows(layer: Layer, u: jax.Array) -> jax.Array:
    """A layer's inputs ``u`` (a batch of ``layer.in_shape``) as the rows its kernel, flattened to 2-D, multiplies.

    A dense layer's rows are its inputs. A convolution's are its patches
    (``"SAME"`` padding, the layer's stride), each ordered as the HWIO kernel's
    ``(kh, kw, in)`` axes flatten, so that ``rows @ w.reshape(-1, out)`` is the
    convolution's output, one row per output position.
    """
    if layer.kind == "dense":
        return jnp.reshape(u, (-1, layer.w_shape[0]))
    k, c = layer.w_shape[0], layer.w_shape[2]
    patches = jax.lax.conv_general_dilated_patches(
        u,
        (k, k),
        (layer.stride, layer.stride),
        "SAME",
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
        precision=_HIGHEST,
    )
    # The patch features come channel-major, (in, kh, kw); the kernel's rows are (kh, kw, in).
    patches = jnp.reshape(patches, (-1, c, k, k))
    return jnp.reshape(jnp.transpose(patches, (0, 2, 3, 1)), (-1, k * k * c))


def _per_channel(values: jax.Array, n: int, reduce: Callable[..., jax.Array]) -> jax.Array:
    """``reduce`` of ``values`` (one per kernel row, the channel fastest) over the rows of each of ``n`` channels."""
    return reduce(jnp.reshape(values, (-1, n)), axis=0)


@functools.partial(jax.jit, static_argnames=("model_config", "qat_config", "index"))
def _inputs(params: Any, x: jax.Array, *, model_config: ModelConfig, qat_config: QATConfig, index: int) -> jax.Array:
    """Layer ``index``'s inputs before its quantiser, for a batch ``x`` (layers before it as ``params`` say)."""

    def one(example: jax.Array) -> jax.Array:
        return run(params, example, model_config, qat_config, stop_at=index)

    return jax.vmap(one)(x)


def quantize_params(
    params: Any,
    calibration: Any,
    *,
    model_config: ModelConfig,
    form: str,
    method: str = "gptq",
    damp: float = 0.01,
    act_order: bool = False,
    alpha: float = 0.5,
    n_grid: int = 20,
) -> PTQParams:
    r"""Post-training quantisation of a float reference model's parameters to a form, with no training.

    ``method``:

    * ``"rtn"``: each kernel rounded to nearest on its grid (the baseline).
    * ``"gptq"``: each kernel rounded by :func:`stejax.ptq.gptq` on the rows it
      multiplies (a convolution's patches, :func:`layer_rows`), gathered with
      the layers before it already quantised, in order.
    * ``"awq"``: for every layer whose input is the ReLU of the previous
      layer's output, :func:`stejax.ptq.awq`'s channel scales :math:`s` are
      searched on the float model and folded: the kernel's rows times
      :math:`s`, the previous layer's output channels (kernel and bias) divided
      by :math:`s` (exact, since :math:`\operatorname{relu}(z/s) = \operatorname{relu}(z)/s`
      for :math:`s > 0`); the kernels are then rounded to nearest. A
      convolution's rows that read one channel, and a dense layer's inputs
      that come from one channel of a convolution, share one scale.
    * ``"smoothquant"``: the same folding with :func:`stejax.ptq.smoothquant_scales`
      (per input channel, over every row that reads it), then round-to-nearest;
      it moves input outliers into the weights, so it needs quantised inputs.

    The first layer's inputs are the standardised features, which no layer
    produces, so AWQ and SmoothQuant leave its scale at 1. The weight grid is
    symmetric, one step per output channel: :math:`s = \max|w| \cdot \operatorname{fl}(1/q_{\max})`,
    codes in :math:`[-q_{\max}, q_{\max}]`, :math:`q_{\max} = 2^{b-1} - 1`;
    ``w`` becomes ``codes * s`` and ``w_step`` becomes ``s``, so the LSQ
    forward gives that kernel back. Each input step is
    :func:`stejax.mse_scale` of the layer's calibration inputs (signed for the
    first layer, unsigned after a ReLU), set before the next layer's inputs
    are gathered.

    Args:
      params: a float model's parameters (``param_spec(model_config, preset("float"))``).
      calibration: standardised float32 features ``(N, in_features)``, N >= 1.
      model_config: the model.
      form: ``"w<b>a<c>"`` (:func:`form_config`).
      method: one of :data:`PTQ_METHODS`.
      damp: GPTQ's dampening, a fraction of the mean diagonal of the Hessian.
      act_order: GPTQ in decreasing Hessian diagonal.
      alpha: SmoothQuant's migration strength.
      n_grid: AWQ's number of exponents tried.

    Returns:
      A :class:`PTQParams`.

    Raises:
      ValueError: an unknown method or form, SmoothQuant with float inputs,
        parameters that are not a float model's (the message names the leaf),
        calibration features of the wrong shape, or a Hessian GPTQ cannot
        invert (the message names the layer).

    Example:
      >>> import jax
      >>> from stejax.model import MLPConfig, init_params, preset
      >>> mc = MLPConfig(hidden=(16,))
      >>> params = init_params(jax.random.key(0), mc, preset("float"))
      >>> x = jax.random.normal(jax.random.key(1), (128, 64))
      >>> out = quantize_params(params, x, model_config=mc, form="w4a8", method="gptq")
      >>> out.qat_config.name, sorted(out.params["layers"][0])
      ('w4a8_channel', ['a_step', 'b', 'w', 'w_step'])
    """
    if method not in PTQ_METHODS:
        raise ValueError(f"quantize_params: method must be one of {list(PTQ_METHODS)}; got {method!r}.")
    qat_config = form_config(form)
    if method == "smoothquant" and qat_config.hidden.activations is None:
        raise ValueError(
            f"quantize_params: smoothquant moves input outliers into the weights so that both quantise well; form "
            f"{form!r} keeps the inputs in float. Give a form with quantised inputs (e.g. 'w8a8')."
        )
    check_params(params, param_spec(model_config, preset("float")))
    x = jnp.asarray(calibration)
    if x.ndim != 2 or x.shape[1] != model_config.in_features or x.shape[0] == 0 or x.dtype != jnp.float32:
        raise ValueError(
            f"quantize_params: calibration must be float32 (N, {model_config.in_features}) with N >= 1; "
            f"got {x.dtype} {tuple(x.shape)}."
        )
    layers = architecture(model_config)
    n = len(layers)
    work = [{"w": jnp.asarray(p["w"], jnp.float32), "b": jnp.asarray(p["b"], jnp.float32)} for p in params["layers"]]
    records: list[dict[str, Any]] = [{"index": i, "kind": layer.kind} for i, layer in enumerate(layers)]
    if method in ("awq", "smoothquant"):
        float_config = preset("float")
        for i in range(1, n):
            u = _inputs({"layers": tuple(work)}, x, model_config=model_config, qat_config=float_config, index=i)
            weights = qat_config.layer(i, n).weights
            assert weights is not None  # every layer of a form quantises its weights
            rows = layer_rows(layers[i], u)
            c = layers[i - 1].out_channels
            s, detail = _channel_scales(layers[i], work[i]["w"], rows, c, method, weights.bits, alpha, n_grid, i)
            work = list(fold_channel_scales({"layers": tuple(work)}, s, model_config=model_config, index=i)["layers"])
            records[i].update(detail)
    done: list[dict[str, jax.Array]] = []
    for i, layer in enumerate(layers):
        lq = qat_config.layer(i, n)
        assert lq.weights is not None
        current = {"layers": (*done, *work[i:])}
        u = _inputs(current, x, model_config=model_config, qat_config=qat_config, index=i)
        rows = layer_rows(layer, u)
        w2d = jnp.reshape(work[i]["w"], (-1, layer.out_channels))
        where = f"layer {i} ({layer.kind} {tuple(layer.w_shape)})"
        out: GPTQResult
        if method == "gptq":
            out = gptq(w2d, rows, bits=lq.weights.bits, damp=damp, act_order=act_order, name=where)
        else:
            out = round_to_nearest(w2d, bits=lq.weights.bits)
        p = {"w": jnp.reshape(out.kernel, layer.w_shape), "b": work[i]["b"], "w_step": out.scales[0]}
        if lq.activations is not None:
            p["a_step"] = _input_step(u, lq.activations.bits, signed=i == 0)
        done.append(p)
        records[i].update(
            weight_bits=lq.weights.bits,
            input_bits=None if lq.activations is None else lq.activations.bits,
            calibration_rows=int(rows.shape[0]),
        )
    quantised = {"layers": tuple(done)}
    check_params(quantised, param_spec(model_config, qat_config))
    return PTQParams(quantised, qat_config, tuple(records))


def fold_channel_scales(params: Any, scales: Any, *, model_config: ModelConfig, index: int) -> Any:
    r"""Layer ``index``'s input channels scaled: its kernel rows times :math:`s`, layer ``index - 1``'s outputs over it.

    For a layer whose input is :math:`\operatorname{relu}(z)` of the previous
    layer's output :math:`z`, and positive :math:`s` (one per channel of
    :math:`z`), :math:`\operatorname{relu}(z / s) = \operatorname{relu}(z) / s`,
    so dividing the previous layer's kernel columns and bias by :math:`s` and
    multiplying every kernel row that reads channel :math:`c` by :math:`s_c`
    leaves the float model's function unchanged (up to float rounding). Only
    ``w`` and ``b`` of the two layers change; a new PyTree is returned.

    Raises:
      ValueError: ``index`` is not a layer after the first, or ``scales`` is
        not positive of shape ``(channels,)`` of layer ``index - 1``.
    """
    layers = architecture(model_config)
    if isinstance(index, bool) or not isinstance(index, int) or not 1 <= index < len(layers):
        raise ValueError(
            f"fold_channel_scales: index must be a layer after the first, in [1, {len(layers)}); got {index!r}."
        )
    s = jnp.asarray(scales, jnp.float32)
    c = layers[index - 1].out_channels
    if s.shape != (c,) or not bool(jnp.all(s > 0)):
        raise ValueError(
            f"fold_channel_scales: layer {index} needs positive scales ({c},), one per output channel of layer "
            f"{index - 1}; got {s.dtype} {tuple(s.shape)}."
        )
    layer = layers[index]
    out = [dict(p) for p in params["layers"]]
    out[index]["w"] = out[index]["w"] * jnp.reshape(_rows_of(s, layer), (*layer.w_shape[:-1], 1))
    previous = out[index - 1]["w"]
    out[index - 1]["w"] = previous * jnp.reshape(1 / s, (1,) * (previous.ndim - 1) + (-1,))
    out[index - 1]["b"] = out[index - 1]["b"] * (1 / s)
    return {"layers": tuple(out)}


def _rows_of(per_channel: jax.Array, layer: Layer) -> jax.Array:
    """A per-input-channel value for every kernel row (rows read channels in turn, the channel fastest)."""
    n_rows = int(np.prod(layer.w_shape[:-1]))
    return jnp.tile(per_channel, n_rows // per_channel.shape[0])


def _channel_scales(
    layer: Layer, w: jax.Array, rows: jax.Array, c: int, method: str, bits: int, alpha: float, n_grid: int, index: int
) -> tuple[jax.Array, dict[str, Any]]:
    """AWQ's or SmoothQuant's scale per channel ``c`` of the layer producing ``layer``'s inputs: ``(c,)``."""
    w2d = jnp.reshape(w, (-1, layer.out_channels))
    if method == "awq":
        mean_abs = _per_channel(jnp.mean(jnp.abs(rows), axis=0), c, jnp.mean)
        result = awq(w2d, rows, bits=bits, n_grid=n_grid, mean_abs=_rows_of(mean_abs, layer), name=f"layer {index}")
        return result.input_scales[:c], {"awq_alpha": result.alpha}
    absmax = _per_channel(jnp.max(jnp.abs(rows), axis=0), c, jnp.max)
    # The kernel with one row per input channel: every weight that multiplies that channel.
    by_channel = jnp.reshape(jnp.transpose(jnp.reshape(w2d, (-1, c, layer.out_channels)), (1, 0, 2)), (c, -1))
    return smoothquant_scales(absmax, by_channel, alpha=alpha), {"smoothquant_alpha": alpha}


def _input_step(u: jax.Array, bits: int, *, signed: bool) -> jax.Array:
    """The LSQ input step: :func:`stejax.mse_scale` of the inputs for the grid of that sign and width."""
    return jnp.asarray(mse_scale(jnp.reshape(u, (-1,)), bits=bits, signed=signed), jnp.float32)
