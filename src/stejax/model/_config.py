"""The model configurations (architecture) and the QAT configuration (what is quantised how).

All are frozen, hashable dataclasses, so they can be static arguments of ``jax.jit``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "PRESETS",
    "ConvConfig",
    "LayerQuant",
    "MLPConfig",
    "ModelConfig",
    "QATConfig",
    "Quantizer",
    "preset",
]

METHODS = ("lsq", "sign", "round_no_ste", "pact")
# Methods that quantise activations only.
INPUT_ONLY_METHODS = ("pact",)
GRANULARITIES = ("tensor", "channel")
MAX_BITS = 16


def _positive_int(where: str, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{where}: {name} must be an int; got {value!r} of type {type(value).__name__}.")
    if value < 1:
        raise ValueError(f"{where}: {name} must be a positive int; got {value}.")
    return int(value)


def _int_tuple(where: str, name: str, value: Any, *, allow_empty: bool) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)):
        raise TypeError(f"{where}: {name} must be a tuple of ints; got {value!r}.")
    out = tuple(_positive_int(where, f"{name}[{i}]", v) for i, v in enumerate(value))
    if not out and not allow_empty:
        raise ValueError(f"{where}: {name} must not be empty.")
    return out


def _dropout_rate(where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{where}: dropout must be a float in [0, 1); got {value!r}.")
    if not (math.isfinite(value) and 0.0 <= float(value) < 1.0):
        raise ValueError(f"{where}: dropout must be a float in [0, 1); got {value}.")
    return float(value)


@dataclass(frozen=True)
class MLPConfig:
    """A multilayer perceptron: ``in_features -> hidden... -> n_classes``, ReLU between layers.

    The default, ``64 -> 128 -> 128 -> 10``, fits the 8x8 digits.

    Attributes:
      in_features: the number of input features (default 64).
      hidden: the hidden layer widths, in order (default ``(128, 128)``; may be
        empty for a linear model).
      n_classes: the number of classes, the number of logits (default 10).
      dropout: the dropout rate on every hidden layer's input in training, in
        [0, 1) (default 0: off).
    """

    in_features: int = 64
    hidden: tuple[int, ...] = (128, 128)
    n_classes: int = 10
    dropout: float = 0.0

    def __post_init__(self):
        where = "MLPConfig"
        object.__setattr__(self, "in_features", _positive_int(where, "in_features", self.in_features))
        object.__setattr__(self, "hidden", _int_tuple(where, "hidden", self.hidden, allow_empty=True))
        object.__setattr__(self, "n_classes", _positive_int(where, "n_classes", self.n_classes))
        object.__setattr__(self, "dropout", _dropout_rate(where, self.dropout))

    @property
    def n_layers(self) -> int:
        """The number of weight layers (hidden layers + the output layer)."""
        return len(self.hidden) + 1


@dataclass(frozen=True)
class ConvConfig:
    """A small convolutional net: 3x3 convolutions with ReLU, then one dense layer to the logits.

    The input is the flat feature vector of an ``image_shape`` image in row-major
    ``(H, W, C)`` order (as :class:`stejax.data.Dataset` stores images); the model
    reshapes it. Each convolution uses ``"SAME"`` padding, layout NHWC for the
    activations and HWIO for the kernels. The default is
    ``8x8x1 -> conv 3x3 16 (stride 1) -> conv 3x3 32 (stride 2) -> 4*4*32 = 512 -> 10``.

    Attributes:
      image_shape: ``(H, W, C)`` of the input image (default ``(8, 8, 1)``).
      channels: the output channels of each convolution (default ``(16, 32)``).
      kernel_size: the side of every (square) kernel (default 3).
      strides: the stride of each convolution, one per entry of ``channels``
        (default ``(1, 2)``).
      n_classes: the number of classes (default 10).
      dropout: the dropout rate on the input of every layer after the first, in
        training, in [0, 1) (default 0: off).
    """

    image_shape: tuple[int, int, int] = (8, 8, 1)
    channels: tuple[int, ...] = (16, 32)
    kernel_size: int = 3
    strides: tuple[int, ...] = (1, 2)
    n_classes: int = 10
    dropout: float = 0.0

    def __post_init__(self):
        where = "ConvConfig"
        image_shape = _int_tuple(where, "image_shape", self.image_shape, allow_empty=False)
        if len(image_shape) != 3:
            raise ValueError(f"{where}: image_shape must be (H, W, C); got {image_shape}.")
        object.__setattr__(self, "image_shape", image_shape)
        object.__setattr__(self, "channels", _int_tuple(where, "channels", self.channels, allow_empty=False))
        object.__setattr__(self, "kernel_size", _positive_int(where, "kernel_size", self.kernel_size))
        strides = _int_tuple(where, "strides", self.strides, allow_empty=False)
        if len(strides) != len(self.channels):
            raise ValueError(
                f"{where}: strides must have one entry per convolution ({len(self.channels)}); got {len(strides)}."
            )
        object.__setattr__(self, "strides", strides)
        object.__setattr__(self, "n_classes", _positive_int(where, "n_classes", self.n_classes))
        object.__setattr__(self, "dropout", _dropout_rate(where, self.dropout))

    @property
    def in_features(self) -> int:
        """``H * W * C``, the length of the flat input."""
        return math.prod(self.image_shape)

    @property
    def n_layers(self) -> int:
        """The number of weight layers (convolutions + the output layer)."""
        return len(self.channels) + 1


ModelConfig = MLPConfig | ConvConfig


@dataclass(frozen=True)
class Quantizer:
    r"""One quantiser: the estimator, the bit width and (for weights) the granularity.

    Methods:

    * ``"lsq"``: learned step size quantisation (:func:`stejax.estimators.uniform.lsq`,
      Esser et al., ICLR 2020), :math:`y = \operatorname{round}(\operatorname{clip}(v/s,
      -Q_N, Q_P))\,s` with the step :math:`s` a trained parameter. Weights use the
      signed grid; activations the signed grid for the first layer (standardised
      features) and the unsigned grid after a ReLU.
    * ``"sign"``: binary, ``bits`` must be 1. Weights: :math:`\alpha\,\operatorname{sign}(w)`
      with :math:`\alpha` the mean :math:`|w|` per output channel (``"channel"``)
      or over the tensor (``"tensor"``), the XNOR-Net scale, via
      :func:`stejax.estimators.binary.magnitude_aware_sign` (the scale carries no
      gradient; the sign's is :math:`\mathbb{1}[|w| \le 1]`). Activations:
      :func:`stejax.estimators.binary.sign_ste` of the previous layer's
      pre-activation, which replaces its ReLU (the sign of a ReLU output would
      always be +1), as in BNNs (Hubara et al., 2016).
    * ``"pact"`` (activations only): PACT (:func:`stejax.estimators.uniform.pact`,
      Choi et al., 2018), a clipped ReLU with a learned clipping level :math:`\alpha`
      on the unsigned grid, :math:`y = \operatorname{round}(\operatorname{clip}(u, 0,
      \alpha)/s)\,s` with :math:`s = \alpha/(2^b - 1)`; :math:`\alpha` is a trained
      parameter (``a_alpha``) whose gradient is :math:`\mathbb{1}[u \ge \alpha]`. It
      is unsigned, so it quantises the input of a layer after a ReLU, never the
      first layer's signed standardised features (:class:`QATConfig` refuses that).
    * ``"round_no_ste"``: the LSQ forward written with plain ``jnp.round`` and
      ``jnp.clip``, no estimator: the same values as ``"lsq"``, but the gradient
      with respect to the quantised input is exactly zero (the step still gets
      the plain-autodiff gradient :math:`\operatorname{round}(\operatorname{clip}(v))`).
      The baseline that shows why an estimator is needed.

    Attributes:
      method: ``"lsq"``, ``"sign"``, ``"round_no_ste"`` or ``"pact"`` (activations only).
      bits: the bit width: 1 for ``"sign"``, an int in [2, 16] otherwise.
      granularity: ``"tensor"`` (default: one step or scale per tensor) or
        ``"channel"`` (one per output channel; weights only).
    """

    method: str
    bits: int
    granularity: str = "tensor"

    def __post_init__(self):
        where = "Quantizer"
        if self.method not in METHODS:
            raise ValueError(f"{where}: method must be one of {list(METHODS)}; got {self.method!r}.")
        if isinstance(self.bits, bool) or not isinstance(self.bits, numbers.Integral):
            raise TypeError(f"{where}: bits must be an int; got {self.bits!r} of type {type(self.bits).__name__}.")
        if self.method == "sign" and self.bits != 1:
            raise ValueError(f"{where}: method 'sign' is binary and needs bits=1; got bits={self.bits}.")
        if self.method != "sign" and not 2 <= self.bits <= MAX_BITS:
            raise ValueError(f"{where}: method {self.method!r} needs bits in [2, {MAX_BITS}]; got bits={self.bits}.")
        object.__setattr__(self, "bits", int(self.bits))
        if self.granularity not in GRANULARITIES:
            raise ValueError(f"{where}: granularity must be one of {list(GRANULARITIES)}; got {self.granularity!r}.")

    def describe(self) -> str:
        """A short text such as ``"4-bit lsq (per tensor)"``."""
        per = "per channel" if self.granularity == "channel" else "per tensor"
        return f"{self.bits}-bit {self.method} ({per})"


@dataclass(frozen=True)
class LayerQuant:
    """How one layer is quantised: its weights and its input activations (None: float).

    Attributes:
      weights: the weight quantiser, or None (default) for float weights.
      activations: the quantiser of the layer's input, or None (default) for a
        float input. Its granularity must be ``"tensor"``.
    """

    weights: Quantizer | None = None
    activations: Quantizer | None = None

    def __post_init__(self):
        for name in ("weights", "activations"):
            q = getattr(self, name)
            if q is not None and not isinstance(q, Quantizer):
                raise TypeError(f"LayerQuant: {name} must be a Quantizer or None; got {q!r}.")
        if self.weights is not None and self.weights.method in INPUT_ONLY_METHODS:
            raise ValueError(
                f"LayerQuant: {self.weights.method} quantises activations (a clipped ReLU on the unsigned grid), "
                "not weights; weights take 'lsq', 'sign' or 'round_no_ste'."
            )
        if self.activations is not None and self.activations.granularity != "tensor":
            raise ValueError(
                "LayerQuant: activations are quantised per tensor (one step per layer input); "
                f"got granularity {self.activations.granularity!r}."
            )

    def describe(self) -> str:
        """A short text such as ``"weights 4-bit lsq (per tensor), activations 4-bit lsq"``."""
        w = self.weights.describe() if self.weights else "float"
        a = f"{self.activations.bits}-bit {self.activations.method}" if self.activations else "float"
        return f"weights {w}, activations {a}"


@dataclass(frozen=True)
class QATConfig:
    """The quantisation-aware training configuration: a policy for the first, hidden and last layers.

    Layer ``i`` of ``n`` uses ``first`` when ``i == 0``, ``last`` when ``i == n - 1``
    (``first`` wins for a one-layer model), and ``hidden`` otherwise; a ``first``
    or ``last`` of None means "as ``hidden``". :meth:`layer` resolves it.

    Attributes:
      name: a short name for reports (the preset's name for presets).
      hidden: the quantisation of the middle layers (default: float).
      first: the first layer's, or None (default) for ``hidden``'s.
      last: the last layer's, or None (default) for ``hidden``'s.
    """

    name: str
    hidden: LayerQuant = field(default_factory=LayerQuant)
    first: LayerQuant | None = None
    last: LayerQuant | None = None

    def __post_init__(self):
        if not isinstance(self.name, str):
            raise TypeError(f"QATConfig: name must be a str; got {self.name!r}.")
        for name in ("hidden", "first", "last"):
            q = getattr(self, name)
            if not (isinstance(q, LayerQuant) or (q is None and name != "hidden")):
                raise TypeError(f"QATConfig: {name} must be a LayerQuant; got {q!r}.")
        # Layer 0 uses `first`, or `hidden` when `first` is None, whatever the depth.
        first = self.first if self.first is not None else self.hidden
        if first.activations is not None and first.activations.method in INPUT_ONLY_METHODS:
            where = "first" if self.first is not None else "hidden (which the first layer uses when first is None)"
            raise ValueError(
                f"QATConfig {self.name!r}: the first layer's inputs are signed standardised features, and "
                f"{first.activations.method} is a clipped ReLU on the unsigned grid (it would zero every negative "
                f"feature); got {where} activations {first.activations.method!r}. Give the first layer its own "
                "quantiser, e.g. first=LayerQuant(..., Quantizer('lsq', 8)) or "
                '"first": {"activations": {"method": "lsq", "bits": 8}} in a config file.'
            )

    def layer(self, index: int, n_layers: int) -> LayerQuant:
        """The quantisation of layer ``index`` of a model with ``n_layers`` layers."""
        if not 0 <= index < n_layers:
            raise ValueError(f"QATConfig.layer: index must be in [0, {n_layers}); got {index}.")
        if index == 0 and self.first is not None:
            return self.first
        if index == n_layers - 1 and self.last is not None:
            return self.last
        return self.hidden

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict that :meth:`from_dict` reads back (``None`` for float and "as hidden")."""

        def quantizer(q: Quantizer | None) -> dict[str, Any] | None:
            return None if q is None else {"method": q.method, "bits": q.bits, "granularity": q.granularity}

        def layer(lq: LayerQuant | None) -> dict[str, Any] | None:
            if lq is None:
                return None
            return {"weights": quantizer(lq.weights), "activations": quantizer(lq.activations)}

        return {"name": self.name, "hidden": layer(self.hidden), "first": layer(self.first), "last": layer(self.last)}

    @classmethod
    def from_dict(cls, data: Any) -> QATConfig:
        """A configuration from a mapping such as :meth:`to_dict` writes: any bits, methods and layer policy.

        ``{"name": "w3a3", "hidden": {"weights": {"method": "lsq", "bits": 3}, "activations":
        {"method": "lsq", "bits": 3}}, "first": {...}, "last": {...}}``; a quantiser's
        ``granularity`` defaults to ``"tensor"``; a missing or null quantiser is float, and a
        missing or null ``first``/``last`` means "as ``hidden``".

        Raises:
          ValueError: an unknown key (the message names where and lists the known ones) or an
            invalid quantiser.
          TypeError: a value of the wrong type.

        Example:
          >>> from stejax.model import QATConfig
          >>> w3 = {"weights": {"method": "lsq", "bits": 3}, "activations": {"method": "lsq", "bits": 3}}
          >>> QATConfig.from_dict({"name": "w3a3", "hidden": w3}).layer(1, 3).describe()
          'weights 3-bit lsq (per tensor), activations 3-bit lsq'
        """

        def mapping(where: str, value: Any, known: tuple[str, ...]) -> dict[str, Any]:
            if not isinstance(value, dict):
                raise TypeError(f"QATConfig.from_dict: {where} must be a mapping; got {value!r}.")
            unknown = [k for k in value if k not in known]
            if unknown:
                raise ValueError(f"QATConfig.from_dict: unknown key {unknown[0]!r} in {where}; known: {list(known)}.")
            return value

        def quantizer(where: str, value: Any) -> Quantizer | None:
            if value is None:
                return None
            q = mapping(where, value, ("method", "bits", "granularity"))
            missing = [k for k in ("method", "bits") if k not in q]
            if missing:
                raise ValueError(f"QATConfig.from_dict: {where} needs {missing[0]!r}; got {q!r}.")
            return Quantizer(q["method"], q["bits"], q.get("granularity", "tensor"))

        def layer(where: str, value: Any) -> LayerQuant | None:
            if value is None:
                return None
            lq = mapping(where, value, ("weights", "activations"))
            return LayerQuant(
                quantizer(f"{where}.weights", lq.get("weights")),
                quantizer(f"{where}.activations", lq.get("activations")),
            )

        d = mapping("the configuration", data, ("name", "hidden", "first", "last"))
        if not isinstance(d.get("name"), str) or not d["name"]:
            raise ValueError(f"QATConfig.from_dict: the configuration needs a non-empty 'name'; got {d.get('name')!r}.")
        return cls(
            d["name"],
            layer("hidden", d.get("hidden")) or LayerQuant(),
            layer("first", d.get("first")),
            layer("last", d.get("last")),
        )

    def describe(self) -> str:
        """One sentence for a report, naming the first/last layer policy."""
        text = f"{self.name}: hidden layers {self.hidden.describe()}"
        if self.first is not None:
            text += f"; first layer {self.first.describe()}"
        if self.last is not None:
            text += f"; last layer {self.last.describe()}"
        return text + "."


def _lsq(bits: int) -> Quantizer:
    return Quantizer("lsq", bits)


def _no_ste(bits: int) -> Quantizer:
    return Quantizer("round_no_ste", bits)


_SIGN_W = Quantizer("sign", 1, "channel")
_SIGN_A = Quantizer("sign", 1)
_EDGE_8 = LayerQuant(_lsq(8), _lsq(8))

_PRESETS: dict[str, QATConfig] = {
    "float": QATConfig("float"),
    "w8a8": QATConfig("w8a8", LayerQuant(_lsq(8), _lsq(8)), _EDGE_8, _EDGE_8),
    "w4a4": QATConfig("w4a4", LayerQuant(_lsq(4), _lsq(4)), _EDGE_8, _EDGE_8),
    "w2a2": QATConfig("w2a2", LayerQuant(_lsq(2), _lsq(2)), _EDGE_8, _EDGE_8),
    "w1a32": QATConfig("w1a32", LayerQuant(_SIGN_W, None), LayerQuant(_lsq(8)), LayerQuant(_lsq(8))),
    "w1a1": QATConfig("w1a1", LayerQuant(_SIGN_W, _SIGN_A), _EDGE_8, _EDGE_8),
    "w4a4_no_ste": QATConfig(
        "w4a4_no_ste",
        LayerQuant(_no_ste(4), _no_ste(4)),
        LayerQuant(_no_ste(8), _no_ste(8)),
        LayerQuant(_no_ste(8), _no_ste(8)),
    ),
}

PRESETS: tuple[str, ...] = tuple(_PRESETS)


def preset(name: str) -> QATConfig:
    """The named QAT preset.

    ==============  ==========================================  ==============================
    name            hidden layers                               first and last layers
    ==============  ==========================================  ==============================
    ``float``       float                                       float
    ``w8a8``        8-bit LSQ weights and inputs                8-bit LSQ weights and inputs
    ``w4a4``        4-bit LSQ weights and inputs                8-bit LSQ weights and inputs
    ``w2a2``        2-bit LSQ weights and inputs                8-bit LSQ weights and inputs
    ``w1a32``       binary weights (sign x mean|w| per          8-bit LSQ weights, float
                    output channel), float inputs               inputs
    ``w1a1``        binary weights, binary inputs (sign         8-bit LSQ weights and inputs
                    replaces the previous layer's ReLU)
    ``w4a4_no_ste`` as ``w4a4`` with plain ``jnp.round`` and    as ``w4a4`` (8-bit), plain
                    ``jnp.clip``: zero weight gradients         rounding
    ==============  ==========================================  ==============================

    LSQ steps are per tensor (one per weight matrix or kernel and one per layer
    input), as in the LSQ paper. Keeping the first and last layers at 8 bits is the
    usual practice since DoReFa-Net and XNOR-Net; ``QATConfig.describe()`` says it
    in one sentence for a report.

    Args:
      name: one of :data:`PRESETS`.

    Returns:
      The :class:`QATConfig`.

    Raises:
      ValueError: an unknown name; the message lists the presets.

    Example:
      >>> from stejax.model import preset
      >>> preset("w4a4").layer(1, 3).describe()
      'weights 4-bit lsq (per tensor), activations 4-bit lsq'
    """
    try:
        return _PRESETS[name]
    except (KeyError, TypeError):
        raise ValueError(f"preset: unknown QAT preset {name!r}; it needs to be one of {list(PRESETS)}.") from None
