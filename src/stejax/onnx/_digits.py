"""The digits models (:class:`stejax.export.ExportedModel`) as QDQ graphs, and their float32 twins."""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np

from stejax.export import ExportedModel, LayerSpec
from stejax.export._model import flatten_weights
from stejax.lowbit._packing import unpack_codes
from stejax.onnx._graph import Graph, OnnxExportError

__all__ = ["CONVS", "digits_graph", "qlinear_convs", "weight_format_name"]


def weight_format_name(model: ExportedModel, *, float_model: bool) -> str:
    """``"float"``, ``"int4"`` (every quantised weight fits 4 bits) or ``"int8"``: the file's weight format."""
    if float_model:
        return "float"
    quantised = [layer.weights for layer in model.layers if layer.weights.quantised]
    if quantised and all(w.method != "sign" and w.bits <= 4 for w in quantised):
        return "int4"
    return "int8"


def _codes(layer: LayerSpec, p: dict[str, np.ndarray]) -> np.ndarray:
    return np.asarray(unpack_codes(jax.numpy.asarray(p["w"]), layer.weights.container, layer.w_shape), np.int64)


def _float_weights(layer: LayerSpec, p: dict[str, np.ndarray]) -> np.ndarray:
    """The weights stejax multiplies by in float: codes x scale (the same float32 product as DequantizeLinear)."""
    if not layer.weights.quantised:
        return np.asarray(p["w"], np.float32)
    # The scale (scalar or per output channel) broadcasts along the last axis, the output channels.
    return _codes(layer, p).astype(np.float32) * np.asarray(p["w_scale"], np.float32)


def _to_onnx_layout(layer: LayerSpec, w: np.ndarray, prev: LayerSpec | None) -> np.ndarray:
    """HWIO -> OIHW for a conv; for a dense layer after a conv, rows reordered from NHWC to NCHW flattening."""
    if layer.kind == "conv":
        return np.transpose(w, (3, 2, 0, 1))
    if prev is not None and prev.kind == "conv":
        h, w_, c = _conv_out_shape(prev)
        return w.reshape(h, w_, c, -1).transpose(2, 0, 1, 3).reshape(h * w_ * c, -1)
    return w


def _conv_out_shape(layer: LayerSpec) -> tuple[int, int, int]:
    h, w, _ = layer.in_shape
    return math.ceil(h / layer.stride), math.ceil(w / layer.stride), layer.out_channels


def _same_pads(layer: LayerSpec) -> list[int]:
    """XLA's "SAME" padding as ONNX pads (begin..., end...): the odd pixel at the end, as SAME_UPPER."""
    kh, kw = layer.w_shape[:2]
    begins, ends = [], []
    for size, k in zip(layer.in_shape[:2], (kh, kw), strict=True):
        out = math.ceil(size / layer.stride)
        total = max((out - 1) * layer.stride + k - size, 0)
        begins.append(total // 2)
        ends.append(total - total // 2)
    return begins + ends


def _check_exportable(model: ExportedModel) -> None:
    for i, layer in enumerate(model.layers):
        if layer.inputs.quantised and layer.inputs.method != "sign" and layer.inputs.quantised_bits > 16:
            raise OnnxExportError(
                f"layers/{i} ({layer.kind}): {layer.inputs.bits}-bit inputs have no ONNX integer type (at most 16)."
            )


CONVS = ("qlinear", "integer")


def qlinear_convs(model: ExportedModel) -> tuple[int, ...]:
    """The layers ``conv="qlinear"`` writes as ORT's QDQ convolution: integer convolutions followed by a layer
    whose inputs are 8-bit or narrower codes (any LSQ, round_no_ste or PACT grid, or sign); the others stay
    ``ConvInteger``."""
    layers = model.layers
    return tuple(
        i
        for i, layer in enumerate(layers)
        if layer.kind == "conv" and layer.integer and i + 1 < len(layers) and _byte_codes(layers[i + 1])
    )


def digits_graph(model: ExportedModel, *, float_model: bool, conv: str) -> tuple[Graph, str]:
    """The graph of ``model``: QDQ (``float_model=False``) or float32 weights and activations; and its output name.

    Input ``features`` (batch, in_features) float32, raw (the graph standardises
    them with the training normaliser); output ``logits`` (batch, n_classes).
    ``conv="qlinear"``: a convolution whose output the next layer quantises (to any
    unsigned grid of at most 8 bits, or sign: :func:`qlinear_convs`) is written in ORT's
    QDQ convolution pattern (fused into ``QLinearConv``), its output requantised straight
    into the next layer's uint8 codes (:func:`_requantise`): faster, but its bias is int32
    codes and its output requantised by ORT, so a code of the next layer can differ by
    one near a rounding tie. A dense layer after it reads those codes flattened in NHWC
    order, the layout ORT runs ``QLinearConv`` in. ``conv="integer"``: every integer
    convolution is ``ConvInteger`` and stejax's float32 rescale, bit for bit stejax's
    integer forward.
    """
    if conv not in CONVS:
        raise ValueError(f"digits_graph: conv must be one of {list(CONVS)}; got {conv!r}.")
    _check_exportable(model)
    qlinear = qlinear_convs(model)
    weights = {k: np.asarray(jax.device_get(v)) for k, v in flatten_weights(model.weights).items()}
    g = Graph("stejax_digits_float" if float_model else "stejax_digits_qdq")
    mean = g.const("normalizer/mean", weights["normalizer/mean"], np.float32)
    std = g.const("normalizer/std", weights["normalizer/std"], np.float32)
    x = g.node("Div", [g.node("Sub", ["features", mean], "normalize/centred"), std], "normalize/standardised")
    # Dense products run on rank-3 activations (batch, 1, features): a rank-2 MatMul followed by its bias Add
    # is fused into a float Gemm (ORT level 1) before the QDQ fusions (level 2) could make it an integer kernel.
    rank3 = g.const("shape/rank3", [0, -1] if float_model else [0, 1, -1], np.int64)
    z = x
    layout = "flat"  # flat (batch, n) | rank3 (batch, 1, n) | nchw
    pending: str | None = None  # this layer's input codes, when the previous conv's QuantizeLinear made them
    for i, layer in enumerate(model.layers):
        p = {k.split("/")[-1]: v for k, v in weights.items() if k.startswith(f"layers/{i}/")}
        prev = model.layers[i - 1] if i else None
        nxt = model.layers[i + 1] if i + 1 < len(model.layers) else None
        hint = f"layers/{i}"
        # ORT runs QLinearConv in NHWC: a dense layer after one flattens its codes in NHWC order (stejax's own),
        # so that this Transpose cancels the one ORT inserts after the convolution.
        nhwc_flat = pending is not None and layer.kind == "dense"
        codes_in: str | None
        if nhwc_flat:
            assert pending is not None
            nhwc = g.node("Transpose", [pending], f"{hint}/codes_nhwc", perm=[0, 2, 3, 1])
            codes_in = g.node("Reshape", [nhwc, rank3], f"{hint}/rank3")
        else:
            codes_in = None if pending is None else _to_layout(g, pending, layer, layout, rank3, hint)
        pending = None
        u = ""
        if codes_in is None:
            u = g.node("Relu", [z], f"{hint}/relu") if layer.relu else z
            u = _to_layout(g, u, layer, layout, rank3, hint)
        quantised = _q(layer, float_model)
        w_values = _codes(layer, p) if quantised else _float_weights(layer, p)
        w_onnx = _to_onnx_layout(layer, w_values, None if nhwc_flat else prev)
        b = np.asarray(p["b"], np.float32)
        if layer.kind == "conv" and layer.integer and not float_model:
            codes = codes_in if codes_in is not None else _quantise_input(g, layer, p, u, hint)
            if conv == "qlinear" and i in qlinear and nxt is not None:
                p_next = {k.split("/")[-1]: v for k, v in weights.items() if k.startswith(f"layers/{i + 1}/")}
                z, pending = _qlinear_conv(g, layer, p, codes, w_onnx, b, nxt, p_next, hint)
            else:
                z = _integer_conv(g, layer, p, codes, w_onnx, b, hint)
        else:
            if layer.inputs.quantised and not float_model:
                codes = codes_in if codes_in is not None else _quantise_input(g, layer, p, u, hint)
                a = g.dequantize(codes, *_input_qparams(g, layer, p, hint), hint=f"{hint}/input")
            else:
                a = u
            w = _dequantised_weights(g, layer, p, w_onnx, hint) if quantised else g.const(f"{hint}/w", w_onnx)
            if layer.kind == "conv":
                y = g.node("Conv", [a, w], f"{hint}/conv", pads=_same_pads(layer), strides=[layer.stride] * 2)
                z = g.node("Add", [y, g.const(f"{hint}/b", b.reshape(1, -1, 1, 1))], f"{hint}/bias")
            else:
                z = g.node("Add", [g.node("MatMul", [a, w], f"{hint}/matmul"), g.const(f"{hint}/b", b)], f"{hint}/bias")
        layout = "nchw" if layer.kind == "conv" else ("flat" if float_model else "rank3")
    if layout == "rank3":
        z = g.node("Reshape", [z, g.const("shape/logits", [0, -1], np.int64)], "logits/flat")
    logits = g.node("Identity", [z], "logits")
    return g, logits


def _byte_codes(layer: LayerSpec) -> bool:
    """A layer whose input codes ORT's QLinearConv can write: sign, or an unsigned grid of at most 8 bits (uint8,
    the type of the convolution's own input codes, clipped to a narrower grid)."""
    if layer.inputs.method == "sign":
        return True
    if not layer.inputs.quantised:
        return False
    lo, hi = layer.inputs.levels
    return lo >= 0 and hi <= 255


def _qlinear_conv(
    g: Graph,
    layer: LayerSpec,
    p: dict[str, np.ndarray],
    codes: str,
    w_codes: np.ndarray,
    b: np.ndarray,
    nxt: LayerSpec,
    p_next: dict[str, np.ndarray],
    hint: str,
) -> tuple[str, str]:
    """DequantizeLinear -> Conv (int32 bias codes) -> ReLU -> QuantizeLinear: ORT's QLinearConv.

    Returns the float output (unused by the next layer) and the next layer's input codes (:func:`_requantise`).
    """
    a = g.dequantize(codes, *_input_qparams(g, layer, p, hint), hint=f"{hint}/input")
    w = _dequantised_weights(g, layer, p, w_codes, hint)
    step = _accumulator_step(layer, p)
    if nxt.inputs.method == "sign":
        bias_codes = _sign_bias_codes(b, step)
    else:
        bias_codes = np.round(b.astype(np.float64) / step.astype(np.float64))
    if np.abs(bias_codes).max(initial=0) >= 2**31 - 1:
        raise OnnxExportError(f"{hint} (conv): the bias does not fit int32 codes of the step s_a * s_w.")
    bias_int32 = g.const(f"{hint}/b_int32", bias_codes, np.int32)
    bias = g.dequantize(bias_int32, g.const(f"{hint}/b_step", step), None, f"{hint}/b", axis=0)
    y = g.node("Conv", [a, w, bias], f"{hint}/conv", pads=_same_pads(layer), strides=[layer.stride] * 2)
    nhint = hint.rsplit("/", 1)[0] + f"/{int(hint.rsplit('/', 1)[1]) + 1}"
    return y, _requantise(g, nxt, p_next, y, step, nhint)


def _accumulator_step(layer: LayerSpec, p: dict[str, np.ndarray]) -> np.ndarray:
    """``s_a * s_w`` per output channel: the value of one unit of the int32 accumulator."""
    a_step = np.float32(1) if layer.inputs.method == "sign" else np.asarray(p["a_step"], np.float32)
    return (a_step * np.asarray(p["w_scale"], np.float32) * np.ones(layer.out_channels, np.float32)).astype(np.float32)


def _sign_bias_codes(b: np.ndarray, step: np.ndarray) -> np.ndarray:
    """int32 bias codes ``c`` with ``acc + c >= 0`` exactly where stejax's ``fl(fl(acc * step) + b) >= 0``.

    A convolution whose output only feeds a sign needs the sign of its output, not its
    value: per channel, the smallest accumulator ``a0`` whose float32 output is at least 0
    (a monotonic test, searched around ``ceil(-b / step)``), and ``c = -a0``. The sign of
    ``acc + c`` is then stejax's sign bit for bit, where rounding ``b / step`` would move
    outputs within half a step of zero to the other side.
    """
    b32, step32 = b.astype(np.float32), step.astype(np.float32)
    estimate = np.ceil(-b32.astype(np.float64) / step32.astype(np.float64))
    candidates = estimate[None, :] + np.arange(-2, 3)[:, None]
    nonnegative = candidates.astype(np.float32) * step32[None, :] + b32[None, :] >= 0
    if nonnegative[0].any() or not nonnegative[-1].all():
        raise OnnxExportError("conv: no int32 threshold reproduces the float32 sign of its output.")
    first = np.argmax(nonnegative, axis=0)
    return -candidates[first, np.arange(len(b32))]


def _requantise(g: Graph, nxt: LayerSpec, p_next: dict[str, np.ndarray], y: str, step: np.ndarray, hint: str) -> str:
    """The next layer's input codes from a convolution's output ``y``, in the pattern ORT folds into QLinearConv.

    A QuantizeLinear follows the convolution directly (a ReLU before an unsigned one is
    dropped by ORT: the saturation at 0 is the ReLU), and whatever the grid needs beyond
    the type's own saturation is done on the codes, after it:

    - an 8-bit grid: the QuantizeLinear's codes as they are;
    - a narrower grid (e.g. 4-bit, codes 0..15 in uint8): a ``Clip`` of the integer
      codes to ``[lo, hi]``, the same codes as LSQ's round-then-clip;
    - sign (uint8 codes 0 and 2, zero point 1: see :func:`_input_qparams`): QuantizeLinear
      with scale ``min(step) / 2`` and zero point 2, then ``Clip`` to [0, 2]. A nonzero
      accumulator ``n`` (in units of ``step``) becomes ``round(n r) + 2`` with ``r >= 2``:
      at most 0 below zero and at least 4 above, and 0 becomes 2, so the clipped code is
      stejax's sign (+1 at zero).
    """
    fmt = nxt.inputs
    if fmt.method == "sign":
        scale = g.const(f"{hint}/requant_step", np.float32(step.min() / 2), np.float32)
        q = g.quantize(y, scale, g.const(f"{hint}/requant_zero", 2, np.uint8), f"{hint}/input")
        bounds = [g.const(f"{hint}/{n}", v, np.uint8) for n, v in (("lo", 0), ("hi", 2))]
        return g.node("Clip", [q, *bounds], f"{hint}/sign")
    u = g.node("Relu", [y], f"{hint}/relu") if nxt.relu else y
    scale, zero = _input_qparams(g, nxt, p_next, hint)
    q = g.quantize(u, scale, zero, f"{hint}/input")
    lo, hi = fmt.levels
    dtype = _code_dtype(lo, hi)
    info = np.iinfo(dtype)
    if (lo, hi) == (info.min, info.max):
        return q
    bounds = [g.const(f"{hint}/{n}", v, dtype) for n, v in (("lo", lo), ("hi", hi))]
    return g.node("Clip", [q, *bounds], f"{hint}/levels")


def _integer_conv(
    g: Graph, layer: LayerSpec, p: dict[str, np.ndarray], codes: str, w_codes: np.ndarray, b: np.ndarray, hint: str
) -> str:
    """``ConvInteger(codes, w codes) -> int32``, then ``x (s_a * s_w) + b`` in float32, as stejax's integer path.

    Not ORT's QDQ convolution (QLinearConv): that adds the bias as int32 codes and
    requantises its output with its own rounding; stejax rescales the int32
    accumulator in float32, and so does this.
    """
    from onnx import TensorProto

    _, zero = _input_qparams(g, layer, p, hint)
    w = _weight_codes(g, layer, w_codes, hint)
    acc = g.node("ConvInteger", [codes, w, zero], f"{hint}/conv", pads=_same_pads(layer), strides=[layer.stride] * 2)
    a_step = np.float32(1) if layer.inputs.method == "sign" else np.asarray(p["a_step"], np.float32)
    scale = (a_step * np.asarray(p["w_scale"], np.float32)).astype(np.float32)  # the float32 product stejax uses
    scale = scale.reshape(1, -1, 1, 1) if scale.ndim else scale
    acc_f = g.node("Cast", [acc], f"{hint}/acc_float", to=TensorProto.FLOAT)
    y = g.node("Mul", [acc_f, g.const(f"{hint}/scale", scale)], f"{hint}/rescale")
    return g.node("Add", [y, g.const(f"{hint}/b", b.reshape(1, -1, 1, 1))], f"{hint}/bias")


def _q(layer: LayerSpec, float_model: bool) -> bool:
    return layer.weights.quantised and not float_model


def _input_qparams(g: Graph, layer: LayerSpec, p: dict[str, np.ndarray], hint: str) -> tuple[str, str]:
    """(scale, zero point) names of a quantised input: the step and 0 in the codes' type; sign: 1 and 1 in uint8.

    Sign codes are uint8 0 and 2 with zero point 1 (-1 and +1): unsigned like the codes
    after a ReLU, since ORT fuses a QDQ convolution only when its input and output codes
    have the same type.
    """
    fmt = layer.inputs
    if fmt.method == "sign":
        return g.const(f"{hint}/a_step", np.float32(1), np.float32), g.const(f"{hint}/a_zero", 1, np.uint8)
    step = np.asarray(p["a_step"], np.float32)
    lo, hi = fmt.levels
    dtype = _code_dtype(lo, hi)
    return g.const(f"{hint}/a_step", step, np.float32), g.const(f"{hint}/a_zero", 0, dtype)


def _code_dtype(lo: int, hi: int) -> Any:
    """The narrowest QuantizeLinear type of codes in [lo, hi], unsigned first (uint8 is MLAS's fast activation)."""
    for dtype in (np.uint8, np.int8, np.int16, np.uint16):
        info = np.iinfo(dtype)
        if info.min <= lo and hi <= info.max:
            return dtype
    raise OnnxExportError(f"codes in [{lo}, {hi}] fit no ONNX QuantizeLinear type (int8, uint8, int16, uint16).")


def _quantise_input(g: Graph, layer: LayerSpec, p: dict[str, np.ndarray], u: str, hint: str) -> str:
    """The integer codes of a layer's input ``u``: a ``QuantizeLinear`` whose output feeds the product.

    LSQ, round_no_ste and PACT: ``QuantizeLinear(u, s, 0)``, ``round_half_even(u / s)``
    saturated to the type (int8 for a signed grid, uint8 for an unsigned one); a grid
    narrower than the type is clipped first, in float, to ``[lo * s, hi * s]``
    (``round(fl(hi * s) / s)`` is ``hi``: the bound is a few ulps from ``hi``). sign:
    ``Where(u < 0, -1, 1)`` (``-0.0`` and ``0`` give ``+1``, as stejax's sign), then
    ``QuantizeLinear`` with scale 1 and zero point 1 (uint8 codes 0 and 2, exact). A ``Clip`` or ``Cast`` between the
    ``QuantizeLinear`` and the ``DequantizeLinear`` would keep ORT from fusing the product.
    """
    fmt = layer.inputs
    lo, hi = fmt.levels
    scale, zero = _input_qparams(g, layer, p, hint)
    if fmt.method == "sign":
        u = g.node(
            "Where",
            [
                g.node("Less", [u, g.const(f"{hint}/zero", 0, np.float32)], f"{hint}/negative"),
                g.const(f"{hint}/minus_one", -1, np.float32),
                g.const(f"{hint}/one", 1, np.float32),
            ],
            f"{hint}/sign",
        )
        return g.quantize(u, scale, zero, f"{hint}/input")
    info = np.iinfo(_code_dtype(lo, hi))
    if (lo, hi) != (info.min, info.max):
        step = np.asarray(p["a_step"], np.float32)
        bounds = [g.const(f"{hint}/{n}", np.float32(v) * step, np.float32) for n, v in (("lo", lo), ("hi", hi))]
        u = g.node("Clip", [u, *bounds], f"{hint}/levels")
    return g.quantize(u, scale, zero, f"{hint}/input")


def _to_layout(g: Graph, t: str, layer: LayerSpec, layout: str, rank3: str, hint: str) -> str:
    """``t`` reshaped for the layer's product: NCHW for a conv, (batch, 1, n) for a dense layer."""
    if layer.kind == "conv":
        if layout == "nchw":
            return t
        h, w, c = layer.in_shape
        nhwc = g.node("Reshape", [t, g.const(f"{hint}/nhwc", [0, h, w, c], np.int64)], f"{hint}/nhwc")
        return g.node("Transpose", [nhwc], f"{hint}/nchw", perm=[0, 3, 1, 2])
    if layout == "rank3":
        return t
    return g.node("Reshape", [t, rank3], f"{hint}/rank3")


def _dequantised_weights(g: Graph, layer: LayerSpec, p: dict[str, np.ndarray], codes: np.ndarray, hint: str) -> str:
    """Integer codes -> DequantizeLinear(scale per output channel or per tensor).

    2..4-bit codes are stored as ONNX INT4 and cast to int8 in the graph (ORT folds
    the cast of a constant, then fuses the int8 weights into its integer kernels);
    5..8-bit and binary codes are int8; 9..16-bit codes int16.
    """
    w = _weight_codes(g, layer, codes, hint)
    scale = np.asarray(p["w_scale"], np.float32)
    axis = None if scale.ndim == 0 else (0 if layer.kind == "conv" else 1)
    return g.dequantize(w, g.const(f"{hint}/w_scale", scale), None, f"{hint}/w", axis=axis)


def _weight_codes(g: Graph, layer: LayerSpec, codes: np.ndarray, hint: str) -> str:
    from onnx import TensorProto

    fmt = layer.weights
    if fmt.method != "sign" and fmt.bits <= 4:
        return g.node("Cast", [g.const_int4(f"{hint}/w_int4", codes)], f"{hint}/w_int8", to=TensorProto.INT8)
    if fmt.method == "sign" or fmt.bits <= 8:
        return g.const(f"{hint}/w_int8", codes, np.int8)
    return g.const(f"{hint}/w_int16", codes, np.int16)
