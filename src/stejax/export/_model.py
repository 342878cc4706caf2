"""The exported model: its static description (layers, formats) and the integer inference path."""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from stejax.estimators.uniform import lsq_levels
from stejax.lowbit._packing import CONTAINERS, container_for, packed_shape, unpack_codes
from stejax.model._spec import Layer

__all__ = ["ExportedModel", "InputFormat", "LayerSpec", "ModelSpec", "WeightFormat"]

_HIGHEST = lax.Precision.HIGHEST
_INT32_MAX = 2**31 - 1
# The zero point that moves an unsigned 8-bit input code (0 .. 255) into int8.
_ZERO_POINT = 128


@dataclasses.dataclass(frozen=True)
class WeightFormat:
    """How one layer's weights are stored.

    Attributes:
      method: ``"lsq"``, ``"round_no_ste"`` (LSQ's values), ``"sign"`` (binary) or
        ``"float"`` (not quantised: stored as float32).
      bits: the quantiser's bit width (1 for sign, 32 for float).
      granularity: ``"tensor"`` (one scale) or ``"channel"`` (one per output channel).
    """

    method: str
    bits: int
    granularity: str = "tensor"

    def __post_init__(self):
        if self.method not in ("lsq", "round_no_ste", "sign", "float"):
            raise ValueError(f"WeightFormat: method must be lsq, round_no_ste, sign or float; got {self.method!r}.")
        expected = {"sign": (1,), "float": (32,)}.get(self.method, tuple(range(2, 17)))
        if self.bits not in expected:
            raise ValueError(f"WeightFormat: {self.method} weights need bits in {list(expected)}; got {self.bits}.")
        if self.granularity not in ("tensor", "channel"):
            raise ValueError(f"WeightFormat: granularity must be 'tensor' or 'channel'; got {self.granularity!r}.")

    @property
    def quantised(self) -> bool:
        return self.method != "float"

    @property
    def container(self) -> str:
        """The storage container (``"int8"``, or the packed container of a narrower code), or ``"float32"``."""
        if not self.quantised:
            return "float32"
        return container_for(self.bits, binary=self.method == "sign")

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "container": self.container}


@dataclasses.dataclass(frozen=True)
class InputFormat:
    r"""How a layer's input is quantised.

    Attributes:
      method: None (a float input), ``"lsq"``, ``"round_no_ste"``, ``"sign"`` or
        ``"pact"``.
      bits: the bit width (None for a float input, 1 for sign).
      signed: LSQ's grid: signed :math:`[-2^{b-1}, 2^{b-1}-1]` for the first layer's
        standardised features, unsigned :math:`[0, 2^b-1]` after a ReLU. PACT is
        always unsigned.

    A PACT input is stored and run as an unsigned LSQ input whose step is PACT's
    :math:`s = \alpha \cdot \operatorname{fl}(1/(2^b-1))` (the tensor ``a_step``):
    for :math:`u \ge 0`, :math:`\operatorname{round}(\operatorname{clip}(u, 0,
    \alpha) \cdot s^{-1})` and :math:`\operatorname{round}(\operatorname{clip}(u
    \cdot s^{-1}, 0, 2^b-1))` are the same code (inside the range the products are
    the same float32 operation; above it, :math:`\alpha s^{-1}` is within a few ulps
    of :math:`2^b - 1`, which rounds to it), so the clip level becomes the input scale.
    """

    method: str | None = None
    bits: int | None = None
    signed: bool = False

    def __post_init__(self):
        if self.method not in (None, "lsq", "round_no_ste", "sign", "pact"):
            raise ValueError(f"InputFormat: method must be None, lsq, round_no_ste, sign or pact; got {self.method!r}.")
        if self.method == "pact" and self.signed:
            raise ValueError("InputFormat: pact inputs are unsigned (a clipped ReLU); got signed=True.")
        expected = {None: (None,), "sign": (1,)}.get(self.method, tuple(range(2, 17)))
        if self.bits not in expected:
            raise ValueError(f"InputFormat: {self.method} inputs need bits in {list(expected)}; got {self.bits}.")

    @property
    def quantised(self) -> bool:
        return self.method is not None

    @property
    def levels(self) -> tuple[int, int]:
        """(lowest, highest) code."""
        if self.method == "sign":
            return -1, 1
        qn, qp = lsq_levels(self.quantised_bits, self.signed)
        return -qn, qp

    @property
    def quantised_bits(self) -> int:
        """``bits`` of a quantised input (an unquantised one has none: ValueError)."""
        if self.bits is None:
            raise ValueError(f"InputFormat: {self.method!r} inputs are not quantised and have no bits.")
        return self.bits

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LayerSpec(Layer):
    """One exported layer: the model's layer geometry plus how it is stored and run.

    Attributes:
      kind, in_shape, w_shape, stride: the layer's geometry, as
        the model describes it (a conv is ``"SAME"``, NHWC/HWIO).
      relu: whether a ReLU turns the previous layer's output into this input
        (False for the first layer and for sign inputs, whose sign replaces it).
      weights: the :class:`WeightFormat`.
      inputs: the :class:`InputFormat`.
    """

    relu: bool
    weights: WeightFormat
    inputs: InputFormat

    def __post_init__(self):
        if self.kind not in ("dense", "conv"):
            raise ValueError(f"LayerSpec: kind must be 'dense' or 'conv'; got {self.kind!r}.")
        rank = {"dense": (1, 2), "conv": (3, 4)}[self.kind]
        if (len(self.in_shape), len(self.w_shape)) != rank or self.in_shape[-1] != self.w_shape[-2]:
            raise ValueError(
                f"LayerSpec: a {self.kind} layer needs an input of rank {rank[0]} and a weight of rank {rank[1]} "
                f"whose input axis matches; got in_shape {self.in_shape} and w_shape {self.w_shape}."
            )

    @property
    def integer(self) -> bool:
        """Whether the layer runs int8 x int8 -> int32: both sides quantised to at most 8 bits, no overflow."""
        if not (self.weights.quantised and self.inputs.quantised):
            return False
        if self.weights.bits > 8 or self.inputs.quantised_bits > 8:
            return False
        # A loose bound on |int32 accumulator|: fan_in * 2^a_bits * max|q_w| (the zero
        # point's correction included).
        w_max = 1 if self.weights.method == "sign" else 2 ** (self.weights.bits - 1)
        return self.fan_in * 2**self.inputs.quantised_bits * w_max <= _INT32_MAX

    @property
    def path(self) -> str:
        """The arithmetic this layer runs, in words."""
        if self.integer:
            zp = f" (inputs shifted by the zero point {_ZERO_POINT})" if self.inputs.levels[1] > 127 else ""
            return f"int8 x int8 -> int32{zp}, then x (input step * weight scale) + bias in float32"
        if self.weights.quantised:
            return "unpack, dequantise to float32, float32 product at HIGHEST precision"
        return "float32 product at HIGHEST precision (float weights)"

    def tensors(self, index: int) -> dict[str, tuple[tuple[int, ...], np.dtype, str]]:
        """The stored tensors: ``{name: (shape, dtype, role)}``."""
        out: dict[str, tuple[tuple[int, ...], np.dtype, str]] = {}
        wf = self.weights
        if wf.quantised:
            c = wf.container
            field, dtype, packed = CONTAINERS[c]
            what = f"{wf.bits}-bit {wf.method} weight codes" + (f", packed {8 // field} per byte" if packed else "")
            out[f"layers/{index}/w"] = (packed_shape(c, self.w_shape), dtype, f"{what} ({c})")
            scale_shape = (self.out_channels,) if wf.granularity == "channel" else ()
            scale_what = "mean |w| (binary scale)" if wf.method == "sign" else "LSQ weight step"
            out[f"layers/{index}/w_scale"] = (scale_shape, np.dtype(np.float32), f"{scale_what}, float32")
        else:
            out[f"layers/{index}/w"] = (self.w_shape, np.dtype(np.float32), "float32 weights (not quantised)")
        out[f"layers/{index}/b"] = ((self.out_channels,), np.dtype(np.float32), "bias, float32")
        if self.inputs.method in ("lsq", "round_no_ste"):
            out[f"layers/{index}/a_step"] = ((), np.dtype(np.float32), "LSQ input step, float32")
        elif self.inputs.method == "pact":
            role = "PACT input step alpha * fl(1/(2^b - 1)) (the clip level as a scale), float32"
            out[f"layers/{index}/a_step"] = ((), np.dtype(np.float32), role)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "in_shape": list(self.in_shape),
            "w_shape": list(self.w_shape),
            "stride": self.stride,
            "relu": self.relu,
            "weights": self.weights.to_dict(),
            "inputs": self.inputs.to_dict(),
            "path": self.path,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LayerSpec:
        w = {k: v for k, v in data["weights"].items() if k != "container"}
        return cls(
            kind=data["kind"],
            in_shape=tuple(int(v) for v in data["in_shape"]),
            w_shape=tuple(int(v) for v in data["w_shape"]),
            stride=int(data["stride"]),
            relu=bool(data["relu"]),
            weights=WeightFormat(**w),
            inputs=InputFormat(**data["inputs"]),
        )


def tensor_table(layers: tuple[LayerSpec, ...], in_features: int) -> dict[str, tuple[tuple[int, ...], np.dtype, str]]:
    """Every stored tensor of a model, in file order: the normaliser, then layer by layer."""
    f32 = np.dtype(np.float32)
    table: dict[str, tuple[tuple[int, ...], np.dtype, str]] = {
        "normalizer/mean": ((in_features,), f32, "training mean per feature, float32"),
        "normalizer/std": ((in_features,), f32, "training standard deviation per feature, float32"),
    }
    for i, layer in enumerate(layers):
        table.update(layer.tensors(i))
    return table


@dataclasses.dataclass(frozen=True, eq=False)
class ExportedModel:
    r"""A trained model with integer weights: pure :meth:`apply`, weights as a PyTree.

    :meth:`apply` maps raw float32 features ``(batch, *input_shape)`` to float32
    logits ``(batch, n_classes)``: it standardises them with the training
    normaliser, then runs each layer (see :attr:`LayerSpec.path`). A layer whose
    weights and inputs are both quantised to at most 8 bits runs

    .. math::

       z = \bigl(q_a \circledast q_w\bigr)_{\text{int32}} \cdot (s_a s_w) + b,

    with :math:`q_a = \operatorname{round}(\operatorname{clip}(u \cdot s_a^{-1}))`
    (or :math:`\operatorname{sign}(u)`, :math:`s_a = 1`) as int8 and :math:`q_w` the
    unpacked int8 weight codes, through ``lax.dot_general`` (or
    ``lax.conv_general_dilated``) with ``preferred_element_type=jnp.int32``. An
    unsigned 8-bit input (codes 0 .. 255) enters as :math:`q_a - 128` and the
    product gets :math:`128 \sum q_w` back, exactly. Other layers dequantise
    (:math:`q_w s_w`, bit for bit the fake-quantised weights) and multiply in float32.

    ``jax.jit(model.apply)`` compiles it; the layer formats are static (held by
    the model), the weights are the argument.

    Attributes:
      layers: the :class:`LayerSpec` of each layer, in order.
      weights: ``{"normalizer": {"mean", "std"}, "layers": ({"w", "w_scale"?, "b",
        "a_step"?}, ...)}``, jax arrays (see :meth:`tensors`).
      input_shape: one example's shape, ``(in_features,)``.
      n_classes: the number of logits.
      input_dtype: ``numpy.float32``.
    """

    layers: tuple[LayerSpec, ...]
    weights: Any
    input_shape: tuple[int, ...]
    n_classes: int

    def __post_init__(self):
        object.__setattr__(self, "layers", tuple(self.layers))
        object.__setattr__(self, "input_shape", tuple(int(v) for v in self.input_shape))
        if len(self.input_shape) != 1:
            raise ValueError(f"ExportedModel: input_shape must be (in_features,); got {self.input_shape}.")
        if not self.layers:
            raise ValueError("ExportedModel: needs at least one layer.")
        if math.prod(self.layers[0].in_shape) != self.input_shape[0]:
            raise ValueError(
                f"ExportedModel: the first layer takes {math.prod(self.layers[0].in_shape)} features; "
                f"input_shape is {self.input_shape}."
            )
        if self.layers[-1].out_channels != self.n_classes or self.layers[-1].kind != "dense":
            raise ValueError(
                f"ExportedModel: the last layer must be dense with n_classes={self.n_classes} outputs; "
                f"got a {self.layers[-1].kind} layer with {self.layers[-1].out_channels}."
            )
        check_weights(self.weights, self.tensors())

    @property
    def input_dtype(self) -> np.dtype:
        """The dtype :meth:`apply` takes: float32 (no silent casts)."""
        return np.dtype(np.float32)

    def tensors(self) -> dict[str, tuple[tuple[int, ...], np.dtype, str]]:
        """The stored tensors: ``{name: (shape, dtype, role)}``, names joining PyTree keys with ``/``."""
        return tensor_table(self.layers, self.input_shape[0])

    @property
    def spec(self) -> ModelSpec:
        """The static part (layers, input shape, classes): hashable, equal for models of one layout."""
        return ModelSpec(self.layers, self.input_shape, self.n_classes)

    def apply(self, weights: Any, inputs: jax.Array) -> jax.Array:
        """The float32 logits ``(batch, n_classes)`` of raw float32 features ``(batch, *input_shape)``.

        Raises:
          TypeError: ``inputs`` is not float32.
          ValueError: ``inputs`` is not ``(batch, *input_shape)``.
        """
        return self.spec.forward(weights, inputs, collect=False)[0]

    def trace(self, weights: Any, inputs: jax.Array) -> tuple[jax.Array, tuple[dict[str, jax.Array], ...]]:
        """:meth:`apply` and, per layer, ``{"u": input before quantisation, "v": u / s_a, "codes": int32}``.

        ``v`` and ``codes`` only for layers with quantised inputs (``v`` is ``u`` for sign inputs).
        """
        return self.spec.forward(weights, inputs, collect=True)

    def normalize(self, weights: Any, inputs: jax.Array) -> jax.Array:
        r"""The standardised features :math:`(x - \mu) / \sigma`, bit for bit :meth:`stejax.data.Normalizer.apply`."""
        return self.spec.normalize(weights, inputs)

    def compiled_apply(self, weights: Any, inputs: jax.Array) -> jax.Array:
        """:meth:`apply`, jitted once per process for each layout (every model of one layout shares the program)."""
        return _compiled_forward(self.spec, weights, inputs, False)[0]

    def compiled_trace(self, weights: Any, inputs: jax.Array) -> tuple[jax.Array, tuple[dict[str, jax.Array], ...]]:
        """:meth:`trace`, jitted once per process for each layout."""
        return _compiled_forward(self.spec, weights, inputs, True)

    def compiled_normalize(self, weights: Any, inputs: jax.Array) -> jax.Array:
        """:meth:`normalize`, jitted once per process for each layout."""
        return _compiled_normalize(self.spec, weights, inputs)


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """The static description of an exported model: what :meth:`ExportedModel.apply` closes over."""

    layers: tuple[LayerSpec, ...]
    input_shape: tuple[int, ...]
    n_classes: int

    def check_inputs(self, inputs: Any) -> jax.Array:
        dtype = getattr(inputs, "dtype", None)
        if dtype is None or np.dtype(dtype) != np.float32:
            got = f"dtype {dtype}" if dtype is not None else f"a {type(inputs).__name__}"
            raise TypeError(f"ExportedModel.apply: inputs must be a float32 array; got {got}.")
        shape = tuple(inputs.shape)
        if len(shape) != 1 + len(self.input_shape) or shape[1:] != self.input_shape:
            raise ValueError(
                f"ExportedModel.apply: inputs must have shape (batch, {', '.join(map(str, self.input_shape))}); "
                f"got shape {shape}."
            )
        return jnp.asarray(inputs)

    def normalize(self, weights: Any, inputs: Any) -> jax.Array:
        x = self.check_inputs(inputs)
        norm = weights["normalizer"]
        centred = x - norm["mean"][None, :]
        # XLA rewrites a division by a broadcast operand into a product with its
        # reciprocal (one more rounding); the barrier keeps NumPy's true quotient.
        return lax.div(centred, lax.optimization_barrier(jnp.broadcast_to(norm["std"][None, :], centred.shape)))

    def forward(self, weights: Any, inputs: Any, *, collect: bool):
        x = self.normalize(weights, inputs)
        batch = x.shape[0]
        z = x
        seen = []
        for layer, p in zip(self.layers, weights["layers"], strict=True):
            u = jax.nn.relu(z) if layer.relu else z
            u = jnp.reshape(u, (batch, *layer.in_shape))
            z, record = _layer(layer, p, u)
            seen.append(record if collect else {})
        return z, tuple(seen)


@functools.partial(jax.jit, static_argnums=(0, 3))
def _compiled_forward(spec: ModelSpec, weights: Any, inputs: jax.Array, collect: bool):
    return spec.forward(weights, inputs, collect=collect)


@functools.partial(jax.jit, static_argnums=(0,))
def _compiled_normalize(spec: ModelSpec, weights: Any, inputs: jax.Array) -> jax.Array:
    return spec.normalize(weights, inputs)


def _along_last(a: jax.Array, ndim: int) -> jax.Array:
    return a if a.ndim == 0 else jnp.reshape(a, (1,) * (ndim - 1) + (-1,))


def _is_negative(u: jax.Array) -> jax.Array:
    """``u < 0`` read from the sign bit, -0.0 excluded: XLA:CPU flushes subnormals to zero in comparisons."""
    i = lax.bitcast_convert_type(u, jnp.int32)
    return (i < 0) & (i != jnp.int32(np.iinfo(np.int32).min))


def input_codes(fmt: InputFormat, u: jax.Array, a_step: jax.Array | None) -> tuple[jax.Array, jax.Array]:
    """``(v, codes)``: the grid coordinate and the float32 integer codes of a quantised input.

    The same float32 operations as :func:`stejax.estimators.uniform.lsq`: ``v = u * (1/s)``,
    clip, round half to even; sign: -1 below zero, +1 at and above.
    """
    if fmt.method == "sign":
        return u, jnp.where(_is_negative(u), jnp.float32(-1), jnp.float32(1))
    if a_step is None:
        raise ValueError(f"input_codes: {fmt.method} inputs need their step a_step; got None.")
    lo, hi = fmt.levels
    v = u * (1 / a_step)
    return v, jnp.round(jnp.where(v < lo, jnp.float32(lo), jnp.where(v > hi, jnp.float32(hi), v)))


def dequantised_weights(fmt: WeightFormat, p: dict[str, jax.Array], w_shape: tuple[int, ...]) -> jax.Array:
    """The float32 weights the fake-quantised model uses: ``codes * scale``."""
    if not fmt.quantised:
        return p["w"]
    codes = unpack_codes(p["w"], fmt.container, w_shape).astype(jnp.float32)
    return codes * _along_last(p["w_scale"], len(w_shape))


def _product(layer: LayerSpec, a: jax.Array, w: jax.Array, **kwargs) -> jax.Array:
    if layer.kind == "dense":
        return lax.dot_general(a, w, (((1,), (0,)), ((), ())), **kwargs)
    return lax.conv_general_dilated(
        a,
        w,
        window_strides=(layer.stride, layer.stride),
        padding="SAME",
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
        **kwargs,
    )


def _layer(layer: LayerSpec, p: dict[str, jax.Array], u: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    record: dict[str, jax.Array] = {"u": u}
    a = u
    if layer.inputs.quantised:
        v, codes = input_codes(layer.inputs, u, p.get("a_step"))
        record["v"], record["codes"] = v, codes.astype(jnp.int32)
    rank = u.ndim
    bias = _along_last(p["b"], rank)
    if layer.integer:
        q_w = unpack_codes(p["w"], layer.weights.container, layer.w_shape).astype(jnp.int8)
        a_step = p["a_step"] if layer.inputs.method != "sign" else jnp.float32(1)
        if layer.inputs.levels[1] > 127:
            q_a = (codes.astype(jnp.int32) - jnp.int32(_ZERO_POINT)).astype(jnp.int8)
            acc = _product(layer, q_a, q_w, preferred_element_type=jnp.int32)
            ones = jnp.ones((1, *layer.in_shape), jnp.int8)
            acc = acc + jnp.int32(_ZERO_POINT) * _product(layer, ones, q_w, preferred_element_type=jnp.int32)
        else:
            acc = _product(layer, codes.astype(jnp.int8), q_w, preferred_element_type=jnp.int32)
        scale = _along_last(a_step * p["w_scale"], rank)
        return acc.astype(jnp.float32) * scale + bias, record
    if layer.inputs.quantised:
        a = codes if layer.inputs.method == "sign" else codes * p["a_step"]
    w = dequantised_weights(layer.weights, p, layer.w_shape)
    return _product(layer, a, w, precision=_HIGHEST) + bias, record


def check_weights(weights: Any, table: dict[str, tuple[tuple[int, ...], np.dtype, str]]) -> None:
    """Check an exported weight PyTree against its tensor table: every name, shape and dtype.

    Raises:
      ValueError: a missing or extra tensor, or a wrong shape (the name, expected and got).
      TypeError: a wrong dtype.
    """
    leaves = flatten_weights(weights)
    for name, (shape, dtype, _) in table.items():
        if name not in leaves:
            raise ValueError(f"exported weights: missing {name} (expected shape {shape}, {dtype.name}).")
        leaf = leaves[name]
        if tuple(leaf.shape) != tuple(shape):
            raise ValueError(f"exported weights: {name} has shape {tuple(leaf.shape)}; expected {tuple(shape)}.")
        if np.dtype(leaf.dtype) != dtype:
            raise TypeError(f"exported weights: {name} has dtype {np.dtype(leaf.dtype).name}; expected {dtype.name}.")
    extra = [n for n in leaves if n not in table]
    if extra:
        raise ValueError(f"exported weights: {extra[0]} is not a tensor of this model; expected only {list(table)}.")


def flatten_weights(weights: Any) -> dict[str, Any]:
    """``{"layers/0/w": array, ...}``: the PyTree's leaves named by their ``/``-joined paths."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(weights)[0]:
        parts = [str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path]
        out["/".join(parts)] = leaf
    return out


def unflatten_weights(tensors: dict[str, Any], n_layers: int) -> dict[str, Any]:
    """The weight PyTree from ``{name: array}`` (the inverse of :func:`flatten_weights`)."""
    layers: list[dict[str, Any]] = [{} for _ in range(n_layers)]
    normalizer: dict[str, Any] = {}
    for name, value in tensors.items():
        parts = name.split("/")
        if len(parts) == 2 and parts[0] == "normalizer":
            normalizer[parts[1]] = value
        elif len(parts) == 3 and parts[0] == "layers" and parts[1].isdigit() and int(parts[1]) < n_layers:
            layers[int(parts[1])][parts[2]] = value
        else:
            raise ValueError(f"exported weights: {name!r} is not a tensor name of a {n_layers}-layer model.")
    return {"normalizer": normalizer, "layers": tuple(layers)}
