"""Flax NNX models quantised by rules as QDQ graphs: the model traced to a jaxpr, each quantiser marked, then lowered.

While the model is traced, every quantised operand of a site goes through one
marker primitive instead of its estimator; the marker carries what ONNX needs
(scale, zero point, grid, kind). Weights are constants of the trace: their
codes are computed from the fake-quantised values the model uses and checked to
dequantise back to them bit for bit. Everything else in the jaxpr is lowered op by
op; an operation or quantiser without a faithful ONNX form is refused by name.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from stejax.onnx._graph import Graph, OnnxExportError, save_model

__all__ = ["export_nnx"]

_SIGNS = ("sign_ste", "approx_sign", "swish_sign")


@dataclasses.dataclass(frozen=True)
class _Q:
    """One quantised operand: how ONNX computes it."""

    path: str  # the site's path and operand, for messages
    kind: str  # "uniform" | "sign" | "ternary" (thresholded)
    scale: Any  # float32 NumPy value, scalar or per channel along ``axis``
    zero_point: int
    lo: int
    hi: int
    axis: int | None = None
    clip: tuple[float, float] | None = None  # a float clip before QuantizeLinear (PACT's [0, alpha])
    threshold: float = 0.0
    codes: np.ndarray | None = None  # weights: the integer codes


_LOCK = threading.Lock()
_TRACE_LOCK = threading.Lock()  # one export at a time: the site method is swapped on the class
_SPECS: dict[int, _Q] = {}
_COUNTER = itertools.count()


def _marker():
    from jax.extend.core import Primitive

    p = Primitive("stejax_onnx_quant")
    p.def_abstract_eval(lambda x, *, key: jax.core.ShapedArray(x.shape, x.dtype))
    p.def_impl(lambda x, *, key: x)
    return p


_MARK = _marker()


def _fail(path: str, kind: str, why: str) -> OnnxExportError:
    return OnnxExportError(f"{path} ({kind}): {why}; it has no faithful ONNX form, so nothing was written.")


def _uniform_activation(path: str, quant: Any, learned: dict[str, Any]) -> _Q:
    name, params = quant.name, quant.params
    if quant.group_size is not None or quant.per_token:
        raise _fail(path, name, "group or per-token input scales are computed from each batch")
    if name == "fake_quant":
        if quant.scale_mode("activations") == "dynamic":
            raise _fail(path, name, "a dynamic input scale is computed from each batch")
        from stejax.estimators.uniform import integer_range

        scale = np.asarray(learned["scale"], np.float32)
        zp = np.asarray(learned["zero_point"], np.float32)
        if zp.ndim or scale.ndim or zp != np.round(zp):
            raise _fail(path, name, f"zero point {zp} (scale shape {scale.shape}) is not one integer")
        lo, hi = integer_range(params["bits"], params["signed"], params["narrow_range"])
        return _Q(path, "uniform", scale, int(zp), lo, hi)
    if name == "lsq":
        from stejax.estimators.uniform import lsq_levels

        step = np.asarray(learned["step"], np.float32)
        qn, qp = lsq_levels(params["bits"], params["signed"])
        return _Q(path, "uniform", step, 0, -qn, qp, axis=None if step.ndim == 0 else -1)
    if name == "pact":
        alpha = np.asarray(learned["alpha"], np.float32)
        bits = params["bits"]
        step = (alpha * np.float32(1 / (2**bits - 1))).astype(np.float32)  # PACT's own float32 product
        return _Q(path, "uniform", step, 0, 0, 2**bits - 1, clip=(0.0, float(alpha)))
    if name in _SIGNS:
        return _Q(path, "sign", np.float32(1), 0, -1, 1)
    if name == "ternary" and params.get("threshold") is not None:
        return _Q(path, "ternary", np.float32(1), 0, -1, 1, threshold=float(np.float32(params["threshold"])))
    why = {
        "stochastic_round": "stochastic rounding draws random numbers at inference",
        "ternary": "the data-dependent threshold (0.7 mean |x|) couples the examples of a batch",
        "lsq_plus": "LSQ+'s learned offset is not an integer zero point",
    }.get(name, "its forward is not a QuantizeLinear/DequantizeLinear pair")
    raise _fail(path, name, why)


def _weights(path: str, quant: Any, learned: dict[str, Any], w: np.ndarray, axis: int | None) -> _Q:
    """Codes and scales of a quantised constant ``w``, checked: DequantizeLinear gives the fake-quantised values."""
    name, params = quant.name, quant.params
    if quant.random:
        raise _fail(path, name, "stochastic rounding draws random numbers at inference")
    if quant.group_size is not None:
        raise _fail(path, name, "per-group weight scales are not exported")
    y = np.asarray(quant.apply(jnp.asarray(w), learned, role="weights", key=None, contraction_axis=axis), np.float32)
    ch = params.get("axis")
    scale: Any
    if name == "lsq":
        from stejax.estimators.uniform import lsq_levels

        scale = np.asarray(learned["step"], np.float32)
        qn, qp = lsq_levels(params["bits"], params["signed"])
        zp, lo, hi = 0, -qn, qp
    elif name == "fake_quant":
        from stejax.estimators.uniform import integer_range

        if quant.scale_mode("weights") == "dynamic":
            scale, zero = (np.asarray(a, np.float32) for a in quant._dynamic_args(jnp.asarray(w), axis=ch))
        else:
            scale, zero = (np.asarray(learned[k], np.float32) for k in ("scale", "zero_point"))
        if np.any(zero != 0):
            raise _fail(path, name, "weights with a non-zero zero point are not exported")
        zp = 0
        lo, hi = integer_range(params["bits"], params["signed"], params["narrow_range"])
    elif name in (*_SIGNS, "ternary", "absmean_ternary", "magnitude_aware_sign"):
        # +-1 (and 0) times a scale per tensor or per output channel (the last axis): the largest |y|.
        per = np.max(np.abs(y).reshape(-1, y.shape[-1]), axis=0)
        scale = per if np.unique(per).size > 1 else np.float32(per[0])
        scale = np.where(scale == 0, np.float32(1), scale).astype(np.float32)
        zp, lo, hi, ch = 0, -1, 1, (-1 if np.ndim(scale) else None)
    else:
        raise _fail(path, name, "its forward is not integer codes times a scale")
    ch = None if np.ndim(scale) == 0 else (ch if ch is not None else -1) % w.ndim
    scale_b = scale if ch is None else np.expand_dims(scale, [d for d in range(w.ndim) if d != ch])
    codes = np.round(y / scale_b) + zp
    back = ((codes - zp) * scale_b).astype(np.float32)
    same = (back == y) | ((back == 0) & (y == 0))
    if not same.all() or codes.min(initial=lo) < lo or codes.max(initial=hi) > hi:
        raise _fail(path, name, "its weights are not integer codes times the scale (they do not dequantise back)")
    return _Q(path, "uniform", np.asarray(scale, np.float32), zp, lo, hi, axis=ch, codes=codes.astype(np.int64))


def _mark(site: Any, i: int, x: Any) -> Any:
    """The replacement of a site's ``quantise`` while the model is traced for export."""
    op = site.operands[i]
    if op.quant is None:
        return x
    path = f"{site.row.path} ({'weights' if op.role == 'weights' else 'inputs'})"
    quant = op.quant
    if quant.entry is None:
        raise _fail(path, quant.name, "a custom callable quantiser")
    learned = {k: np.asarray(v) for k, v in site.learned(i).items()}
    if op.role == "weights":
        try:
            w = np.asarray(x, np.float32)
        except jax.errors.TracerArrayConversionError:
            raise _fail(path, quant.name, "the weights depend on the model's input") from None
        with jax.ensure_compile_time_eval():  # the fake-quantised weights as values, not traced
            spec = _weights(path, quant, learned, w, op.axis)
    else:
        spec = _uniform_activation(path, quant, learned)
    with _LOCK:
        key = next(_COUNTER)
        _SPECS[key] = spec
    return _MARK.bind(x, key=key)


def _trace(model: Any, example: Any, *, float_model: bool) -> Any:
    from stejax.flax import _rules

    original = _rules._Site.quantise
    patched: Callable[..., Any] = (lambda self, i, x: x) if float_model else _mark
    # The method is swapped on the class while this one trace runs (restored even on failure).
    _rules._Site.quantise = patched  # type: ignore[method-assign]
    try:
        return jax.make_jaxpr(lambda v: model(v))(example)
    finally:
        _rules._Site.quantise = original  # type: ignore[method-assign]


# ----------------------------------------------------------------------------- lowering


@dataclasses.dataclass
class _T:
    """A value of the jaxpr in the graph: an ONNX tensor name (with its static shape) or a constant."""

    name: str | None = None
    const: np.ndarray | None = None
    shape: tuple[int, ...] = ()
    quant: _Q | None = None  # a quantised constant (weights), not yet placed in the graph
    rank3: str | None = None  # a dequantised (batch, n) input as (batch, 1, n), made before its QuantizeLinear
    codes: tuple[str, str, _Q] | None = None  # a dequantised input's integer codes, zero point and quantiser


class _Lowering:
    def __init__(self, g: Graph, batch: int):
        self.g = g
        self.batch = batch
        self.integer_products = 0

    # -- values
    def tensor(self, v: _T, hint: str) -> str:
        if v.name is None and v.rank3 is not None:
            v.name = self.g.node("Reshape", [v.rank3, self.g.const(f"{hint}/rank2", [0, -1], np.int64)], f"{hint}/r2")
        if v.name is not None:
            return v.name
        if v.quant is not None:
            return self.dequantized_const(v.quant, None, hint)
        assert v.const is not None
        return self.g.const(hint, v.const)

    def dequantized_const(self, q: _Q, codes: np.ndarray | None, hint: str, axis: int | None = None) -> str:
        from onnx import TensorProto

        codes = q.codes if codes is None else codes
        assert codes is not None
        if q.lo >= -8 and q.hi <= 7 and (q.lo, q.hi) != (-1, 1):
            w = self.g.node("Cast", [self.g.const_int4(f"{hint}/w_int4", codes)], f"{hint}/w_int8", to=TensorProto.INT8)
        elif q.lo >= -128 and q.hi <= 127:
            w = self.g.const(f"{hint}/w_int8", codes, np.int8)
        else:
            raise _fail(q.path, "weights", f"codes in [{q.lo}, {q.hi}] do not fit int8")
        scale = self.g.const(f"{hint}/w_scale", q.scale, np.float32)
        return self.g.dequantize(w, scale, None, f"{hint}/w", axis=axis if q.scale.ndim else None)

    def qdq(self, x: str, q: _Q, hint: str, rank: int) -> _T:
        """QuantizeLinear -> DequantizeLinear of ``x``; a (batch, n) input is quantised as (batch, 1, n).

        A rank-2 MatMul would become a float Gemm (see :func:`_dot`), and ORT fuses an
        int8 DequantizeLinear into MatMulIntegerToFloat only when no Reshape stands
        between it and its QuantizeLinear: so the float input is reshaped first.
        """
        g = self.g
        if rank == 2:
            x = g.node("Reshape", [x, g.const(f"{hint}/rank3", [0, 1, -1], np.int64)], f"{hint}/rank3")
        dtype = _code_dtype(q.lo, q.hi, q.path)
        scale = g.const(f"{hint}/scale", q.scale, np.float32)
        zero = g.const(f"{hint}/zero", q.zero_point, dtype)
        if q.kind == "sign":
            x = g.node(
                "Where",
                [
                    g.node("Less", [x, g.const(f"{hint}/0", 0, np.float32)], f"{hint}/neg"),
                    g.const(f"{hint}/m1", -1.0, np.float32),
                    g.const(f"{hint}/p1", 1.0, np.float32),
                ],
                f"{hint}/sign",
            )
        elif q.kind == "ternary":
            t = g.const(f"{hint}/t", q.threshold, np.float32)
            mt = g.const(f"{hint}/mt", -q.threshold, np.float32)
            zero_f = g.const(f"{hint}/zf", 0.0, np.float32)
            lower = g.node(
                "Where",
                [g.node("Less", [x, mt], f"{hint}/below"), g.const(f"{hint}/m1", -1.0, np.float32), zero_f],
                f"{hint}/lower",
            )
            x = g.node(
                "Where",
                [g.node("Greater", [x, t], f"{hint}/above"), g.const(f"{hint}/p1", 1.0, np.float32), lower],
                f"{hint}/ternary",
            )
        else:
            info = np.iinfo(dtype)
            if q.clip is not None:
                bounds = q.clip
            elif (q.lo, q.hi) != (info.min, info.max):
                # fake_quant and LSQ round, then clip to the grid: the same codes as clipping first to the
                # grid's ends in float (a value past an end rounds to it either way).
                s = q.scale.astype(np.float32)
                bounds = (float(np.float32(q.lo - q.zero_point) * s), float(np.float32(q.hi - q.zero_point) * s))
            else:
                bounds = None
            if bounds is not None:
                lo_c, hi_c = (g.const(f"{hint}/{n}", b, np.float32) for n, b in (("lo", bounds[0]), ("hi", bounds[1])))
                x = g.node("Clip", [x, lo_c, hi_c], f"{hint}/grid")
        axis = None if q.scale.ndim == 0 else -1
        codes = g.quantize(x, scale, zero, hint, axis=axis)
        dq = g.dequantize(codes, scale, zero, hint, axis=axis)
        return _T(rank3=dq) if rank == 2 else _T(dq, codes=(codes, zero, q))


def _code_dtype(lo: int, hi: int, path: str) -> Any:
    for dtype in (np.int8, np.uint8, np.int16, np.uint16):
        info = np.iinfo(dtype)
        if info.min <= lo and hi <= info.max:
            return dtype
    raise _fail(path, "inputs", f"codes in [{lo}, {hi}] fit no QuantizeLinear type")


_ELEMENTWISE = {
    "add": "Add",
    "sub": "Sub",
    "mul": "Mul",
    "div": "Div",
    "max": "Max",
    "min": "Min",
    "pow": "Pow",
}
_UNARY = {
    "neg": "Neg",
    "exp": "Exp",
    "log": "Log",
    "tanh": "Tanh",
    "logistic": "Sigmoid",
    "sqrt": "Sqrt",
    "abs": "Abs",
    "erf": "Erf",
    "sin": "Sin",
    "cos": "Cos",
}
_COMPARE = {"lt": "Less", "gt": "Greater", "le": "LessOrEqual", "ge": "GreaterOrEqual", "eq": "Equal"}
_INLINE = ("pjit", "jit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call", "remat", "checkpoint")


def _where(eqn: Any) -> str:
    from jax._src import source_info_util

    return f"{eqn.primitive.name} at {source_info_util.summarize(eqn.source_info)}"


def _lower_jaxpr(low: _Lowering, jaxpr: Any, consts: list[Any], args: list[_T]) -> list[_T]:
    env: dict[Any, _T] = {}

    def read(v: Any) -> _T:
        if hasattr(v, "val"):  # a literal
            return _T(const=np.asarray(v.val), shape=tuple(np.shape(v.val)))
        return env[v]

    for var, c in zip(jaxpr.constvars, consts, strict=True):
        env[var] = _T(const=np.asarray(c), shape=tuple(np.shape(c)))
    for var, a in zip(jaxpr.invars, args, strict=True):
        env[var] = a
    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        outs = _lower_eqn(low, eqn, ins)
        for var, out in zip(eqn.outvars, outs, strict=True):
            env[var] = out
    return [read(v) for v in jaxpr.outvars]


def _lower_eqn(low: _Lowering, eqn: Any, ins: list[_T]) -> list[_T]:
    g, name, params = low.g, eqn.primitive.name, eqn.params
    shape = tuple(eqn.outvars[0].aval.shape) if eqn.outvars else ()
    hint = name
    if name == "stejax_onnx_quant":
        q = _SPECS[params["key"]]
        if ins[0].name is None and ins[0].rank3 is None:  # a quantised constant: the weights
            return [_T(shape=ins[0].shape, quant=q)]
        out = low.qdq(low.tensor(ins[0], "q"), q, f"q{params['key']}", len(shape))
        out.shape = shape
        return [out]
    if name in _INLINE:
        inner = params.get("jaxpr") or params.get("call_jaxpr") or params.get("fun_jaxpr")
        closed = inner if hasattr(inner, "consts") else None
        jx = closed.jaxpr if closed is not None else inner
        return _lower_jaxpr(low, jx, list(closed.consts) if closed is not None else [], ins)
    if all(v.name is None and v.quant is None for v in ins):  # constant folding
        vals = eqn.primitive.bind(*[jnp.asarray(v.const) for v in ins], **params)
        vals = vals if eqn.primitive.multiple_results else [vals]
        return [_T(const=np.asarray(v), shape=tuple(np.shape(v))) for v in vals]
    if name == "dot_general":
        return [_dot(low, eqn, ins, shape)]
    if name == "conv_general_dilated":
        return [_conv(low, eqn, ins, shape)]
    if name in _ELEMENTWISE:
        a, b = (low.tensor(v, f"{hint}/c") for v in ins)
        return [_T(g.node(_ELEMENTWISE[name], [a, b], hint), shape=shape)]
    if name in _UNARY:
        return [_T(g.node(_UNARY[name], [low.tensor(ins[0], hint)], hint), shape=shape)]
    if name in _COMPARE:
        a, b = (low.tensor(v, f"{hint}/c") for v in ins)
        return [_T(g.node(_COMPARE[name], [a, b], hint), shape=shape)]
    if name == "integer_pow":
        x = low.tensor(ins[0], hint)
        if params["y"] == 2:
            return [_T(g.node("Mul", [x, x], hint), shape=shape)]
    if name in ("convert_element_type", "copy", "copy_p", "stop_gradient", "optimization_barrier", "reduce_precision"):
        if name != "convert_element_type" or np.dtype(params["new_dtype"]) == np.float32:
            return ins[: len(eqn.outvars)]
    if name == "select_n" and len(ins) == 3:
        pred, on_false, on_true = (low.tensor(v, f"{hint}/c") for v in ins)
        return [_T(g.node("Where", [pred, on_true, on_false], hint), shape=shape)]
    if name == "broadcast_in_dim":
        v = ins[0]
        dims = params["broadcast_dimensions"]
        ones = [1] * len(shape)
        for d, size in zip(dims, v.shape, strict=True):
            ones[d] = size
        if v.const is not None:  # ONNX broadcasting does the rest
            return [_T(const=v.const.reshape(ones), shape=tuple(ones))]
        if v.quant is None and all(shape[i] == 1 or i in dims for i in range(len(shape))):
            target = g.const(f"{hint}/shape", _dynamic(ones, low.batch), np.int64)
            new = g.node("Reshape", [low.tensor(v, hint), target], hint)
            return [_T(new, shape=tuple(ones))]
    tensor_in = bool(ins) and ins[0].const is None and ins[0].quant is None
    if name == "reshape" and tensor_in:
        if shape and shape[0] == low.batch and ins[0].shape and ins[0].shape[0] == low.batch:
            keep_batch = g.const(f"{hint}/shape", [0, *shape[1:]], np.int64)
            return [_T(g.node("Reshape", [low.tensor(ins[0], hint), keep_batch], hint), shape=shape)]
    if name == "transpose" and tensor_in:
        perm = list(params["permutation"])
        return [_T(g.node("Transpose", [low.tensor(ins[0], hint)], hint, perm=perm), shape=shape)]
    if name in ("reduce_sum", "reduce_max", "reduce_min") and tensor_in:
        op = {"reduce_sum": "ReduceSum", "reduce_max": "ReduceMax", "reduce_min": "ReduceMin"}[name]
        axes = g.const(f"{hint}/axes", list(params["axes"]), np.int64)
        return [_T(g.node(op, [low.tensor(ins[0], hint), axes], hint, keepdims=0), shape=shape)]
    raise OnnxExportError(
        f"{_where(eqn)}: the operation {name!r} (on shapes {[v.shape for v in ins]}) is not lowered to ONNX; "
        "nothing was written."
    )


def _dynamic(dims: list[int], batch: int) -> list[int]:
    return [0 if i == 0 and d == batch else d for i, d in enumerate(dims)]


def _dot(low: _Lowering, eqn: Any, ins: list[_T], shape: tuple[int, ...]) -> _T:
    """A dot_general as an ONNX MatMul: the lhs contracted on its last axis, a rank-2 rhs, no batch axes."""
    g = low.g
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    lhs, rhs = ins
    if lb or rb or tuple(lc) != (len(lhs.shape) - 1,) or len(rhs.shape) != 2 or lhs.const is not None:
        raise OnnxExportError(
            f"{_where(eqn)}: a product with contraction {tuple(lc)} x {tuple(rc)} and batch axes {tuple(lb)} x "
            f"{tuple(rb)} is not a MatMul of activations by a matrix; nothing was written."
        )
    transpose = tuple(rc) == (1,)
    hint = "matmul"
    if rhs.quant is not None:
        q = rhs.quant
        assert q.codes is not None  # a quantised constant has its codes
        codes = q.codes.T if transpose else q.codes
        axis = None if q.axis is None else (1 - q.axis if transpose else q.axis)
        w = low.dequantized_const(q, codes, hint, axis=axis)
    elif rhs.const is not None:
        w = g.const(f"{hint}/w", rhs.const.T if transpose else rhs.const, np.float32)
    else:
        w = low.tensor(rhs, hint)
        w = w if not transpose else g.node("Transpose", [w], f"{hint}/wT", perm=[1, 0])
    if len(lhs.shape) == 2:
        # A rank-3 product: a rank-2 MatMul followed by an Add is fused into a float Gemm (ORT level 1)
        # before its QDQ fusion (level 2) could run it as an integer kernel. The codes are reshaped, before
        # their DequantizeLinear, so that DequantizeLinear -> MatMul stays adjacent.
        x3 = lhs.rank3 or g.node(
            "Reshape", [low.tensor(lhs, hint), g.const(f"{hint}/rank3", [0, 1, -1], np.int64)], f"{hint}/rank3"
        )
        y3 = g.node("MatMul", [x3, w], hint)
        return _T(g.node("Reshape", [y3, g.const(f"{hint}/rank2", [0, -1], np.int64)], f"{hint}/rank2"), shape=shape)
    return _T(g.node("MatMul", [low.tensor(lhs, hint), w], hint), shape=shape)


def _conv(low: _Lowering, eqn: Any, ins: list[_T], shape: tuple[int, ...]) -> _T:
    """A convolution of activations by a constant kernel as ONNX NCHW: transposed in, convolved, transposed back.

    With integer codes on both sides (int8/uint8 activations, int8 weights with zero
    point 0, one activation scale): ``ConvInteger`` into int32, then ``x (s_a s_w)`` in
    float32, since ORT fuses a QDQ ``Conv`` into an integer kernel only when a
    ``QuantizeLinear`` follows it. Otherwise the QDQ operands into a float ``Conv``.
    """
    from onnx import TensorProto

    g, params = low.g, eqn.params
    lhs, rhs = ins
    dn = params["dimension_numbers"]
    lhs_spec, rhs_spec, out_spec = (tuple(dn.lhs_spec), tuple(dn.rhs_spec), tuple(dn.out_spec))
    plain = (
        all(d == 1 for d in params["lhs_dilation"])
        and params["batch_group_count"] == 1
        and lhs.const is None
        and lhs.quant is None
        and rhs.name is None
        and rhs.rank3 is None
    )
    if not plain:
        raise OnnxExportError(
            f"{_where(eqn)}: only a convolution of activations by a constant kernel, without input dilation or "
            "batch groups, is lowered to ONNX; nothing was written."
        )
    attrs = {
        "strides": list(params["window_strides"]),
        "pads": [p[0] for p in params["padding"]] + [p[1] for p in params["padding"]],
        "dilations": list(params["rhs_dilation"]),
        "group": int(params["feature_group_count"]),
    }
    hint = "conv"
    back = [int(i) for i in np.argsort(out_spec)]
    q = rhs.quant
    w_codes = None if q is None or q.codes is None else np.transpose(q.codes, rhs_spec)
    w_axis = None if q is None or q.axis is None else rhs_spec.index(q.axis % len(rhs_spec))
    a = lhs.codes
    integer = (
        a is not None
        and q is not None
        and w_codes is not None
        and a[2].kind == "uniform"
        and np.ndim(a[2].scale) == 0
        and q.zero_point == 0
        and q.lo >= -128
        and q.hi <= 127
        and (w_axis is None or w_axis == 0)
    )
    if integer:
        assert a is not None and q is not None and w_codes is not None
        codes, zero, aq = a
        x = g.node("Transpose", [codes], f"{hint}/codes_nchw", perm=list(lhs_spec))
        w = g.const(f"{hint}/w_int8", w_codes, np.int8)
        acc = g.node("ConvInteger", [x, w, zero], hint, **attrs)
        scale = (np.float32(aq.scale) * np.asarray(q.scale, np.float32)).astype(np.float32)
        scale = scale.reshape(1, -1, *([1] * (len(shape) - 2))) if scale.ndim else scale
        y = g.node(
            "Mul",
            [g.node("Cast", [acc], f"{hint}/acc", to=TensorProto.FLOAT), g.const(f"{hint}/s", scale)],
            f"{hint}/rescale",
        )
        low.integer_products += 1
    else:
        x = g.node("Transpose", [low.tensor(lhs, hint)], f"{hint}/nchw", perm=list(lhs_spec))
        if q is not None:
            w = low.dequantized_const(q, w_codes, hint, axis=w_axis)
        else:
            assert rhs.const is not None
            w = g.const(f"{hint}/w", np.transpose(rhs.const, rhs_spec), np.float32)
        y = g.node("Conv", [x, w], hint, **attrs)
    return _T(g.node("Transpose", [y], f"{hint}/back", perm=back), shape=shape)


def _state_digest(model: Any) -> str:
    """The sha256 of the model's variables (names, dtypes, shapes and bytes, sorted by name): what was exported."""
    import hashlib

    from stejax.flax._saving import _variables

    digest = hashlib.sha256()
    for name, value in sorted(_variables(model).items()):
        array = np.ascontiguousarray(jax.device_get(value))
        digest.update(f"{name}|{array.dtype.str}|{array.shape}|".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def export_nnx(
    model: Any,
    example: Any,
    out: str | os.PathLike,
    *,
    float_model: bool = False,
    metadata: dict[str, str] | None = None,
) -> Path:
    r"""Write a Flax NNX model quantised by :func:`stejax.flax.quantize_model` as an ONNX file (QDQ form).

    The model is traced on ``example`` (one float32 array: ``(batch, ...)``; the
    file takes any batch size). Each quantised site becomes: its weights, integer
    codes (int8; grids within [-8, 7] as ONNX INT4; binary and ternary as int8)
    with their scale per tensor or per output channel, into ``DequantizeLinear``
    (the codes are checked to dequantise to the fake-quantised weights bit for
    bit); its input, ``QuantizeLinear``/``DequantizeLinear`` with the learned or
    calibrated scale and zero point (a grid narrower than the type clipped first,
    in float; sign and ternary inputs as a ``Where`` then scale 1). Products are
    ``MatMul`` (linear layers, einsums and dots that contract the activations'
    last axis with a matrix; ORT runs them as ``MatMulIntegerToFloat``) and
    convolutions (``nnx.Conv``: ``ConvInteger`` and a float32 rescale when both
    operands are integer codes, else a ``Conv`` on the dequantised operands).
    ``float_model=True`` writes the model with every quantiser off.

    Refused, with :class:`stejax.onnx.OnnxExportError` naming the site or the
    operation: stochastic rounding, custom callable quantisers, data-dependent
    input scales (dynamic, per token, ternary's mean threshold), LSQ+'s offset,
    per-group scales, and any operation this lowering does not know (e.g. a
    transposed convolution, attention, an embedding lookup).

    Args:
      model: a model returned by :func:`stejax.flax.quantize_model` (any NNX model with ``float_model``).
      example: one call's input.
      out: the ONNX file to create (never overwritten).
      float_model: trace with the quantisers off.
      metadata: extra ``metadata_props`` (the file always records ``stejax.sites`` and
        ``stejax.source_state_sha256``, the sha256 of the model's variables).

    Returns:
      The written path.
    """
    from onnx import TensorProto

    from stejax.flax import summary

    out = Path(out)
    if out.exists() or out.is_symlink():
        raise FileExistsError(f"{out} exists; an exported ONNX file is never overwritten.")
    rules = "float"
    if not float_model:
        rows = summary(model)
        rules = ", ".join(f"{r.path}:{r.bits}" for r in rows if r.kind != "float")
    example = jnp.asarray(example)
    if example.dtype != jnp.float32 or example.ndim < 2:
        raise OnnxExportError(
            f"export_nnx: the example must be a float32 array (batch, ...); got {example.dtype} {example.shape}."
        )
    with _TRACE_LOCK:  # one export traces and lowers at a time
        first = next(_COUNTER)  # the markers of this trace are numbered from here on
        try:
            closed = _trace(model, example, float_model=float_model)
            g = Graph("stejax_nnx_float" if float_model else "stejax_nnx_qdq")
            low = _Lowering(g, int(example.shape[0]))
            x = _T("input", shape=tuple(example.shape))
            (y,) = _lower_jaxpr(low, closed.jaxpr, list(closed.consts), [x])
        finally:
            with _LOCK:  # this export's quantiser records (weights' codes included) are no longer needed
                for key in [k for k in _SPECS if k >= first]:
                    del _SPECS[key]
    logits = g.node("Identity", [low.tensor(y, "output")], "output")
    meta = {
        "stejax.sites": rules,
        "stejax.graph": "float" if float_model else "qdq",
        "stejax.source_state_sha256": _state_digest(model),
        **(metadata or {}),
    }
    proto = g.model(
        [("input", TensorProto.FLOAT, ("batch", *example.shape[1:]))],
        [(logits, TensorProto.FLOAT, ("batch", *y.shape[1:]))],
        meta,
        doc="stejax: a Flax NNX model quantised by rules.",
    )
    return save_model(proto, out)
