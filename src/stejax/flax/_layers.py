"""Dense and convolutional NNX layers that fake-quantise their weights and inputs with stejax estimators."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import jax
import jax.numpy as jnp
from flax import nnx

from stejax.flax._quant import Calibration, Quant, as_quant

__all__ = ["QuantConv", "QuantLinear", "quantize"]

QuantSpec = Quant | str | Callable[..., Any] | None

_DEFAULT_KERNEL_INIT = nnx.initializers.lecun_normal()
_ZEROS = nnx.initializers.zeros_init()


class _Quantised(nnx.Module):
    """What QuantLinear and QuantConv share: the kernel, the bias and the two quantisers."""

    def _setup(
        self,
        kernel: jax.Array,
        bias: jax.Array | None,
        weights: QuantSpec,
        activations: QuantSpec,
        *,
        in_features: int,
        dtype: Any,
        precision: Any,
        rngs: nnx.Rngs | None,
        where: str,
        contraction_axis: int,
    ) -> None:
        self.kernel = nnx.Param(kernel)
        self.contraction_axis = contraction_axis
        self.bias = nnx.Param(bias) if bias is not None else nnx.data(None)
        self.weights = as_quant(weights, where=f"{where}: weights")
        self.activations = as_quant(activations, where=f"{where}: activations")
        self.dtype = dtype
        self.precision = precision
        self.in_features = in_features
        for role, prefix, quant in (("weights", "weight", self.weights), ("activations", "input", self.activations)):
            if quant is None:
                continue
            where_q = f"{where}: {role}"
            try:
                learned = quant.learned(role, kernel=kernel, in_features=in_features, contraction_axis=contraction_axis)
            except ValueError as e:
                raise ValueError(f"{where_q}: {e}") from None
            for arg, (trainable, value) in learned.items():
                setattr(self, f"{prefix}_{arg}", (nnx.Param if trainable else Calibration)(value))
        random = [q.name for q in (self.weights, self.activations) if q is not None and q.random]
        streams = [s for s in ("quant", "default") if rngs is not None and s in rngs]
        if random and not streams:
            raise TypeError(
                f"{where}: {random[0]} draws random numbers; pass rngs=nnx.Rngs(...) with a 'quant' or default stream."
            )
        # One key stream for the random estimators, split on every call.
        self.quant_rngs = rngs[streams[0]].fork() if random and rngs is not None else nnx.data(None)

    def _learned(self, quant: Quant, prefix: str) -> dict[str, jax.Array]:
        entry = quant.entry
        role = "weights" if prefix == "weight" else "activations"
        if entry is None or quant.scale_mode(role) == "dynamic":
            return {}
        return {a.name: getattr(self, f"{prefix}_{a.name}")[...] for a in entry.args}

    def _key(self, quant: Quant) -> jax.Array | None:
        return cast(Any, self.quant_rngs)() if quant.random else None

    def quantized_input(self, x: jax.Array) -> jax.Array:
        """The layer's input as the layer uses it (``x`` itself without an input quantiser)."""
        if self.activations is None:
            return x
        return self.activations.apply(
            x, self._learned(self.activations, "input"), role="activations", key=self._key(self.activations)
        )

    def quantized_kernel(self) -> jax.Array:
        """The kernel as the layer uses it, in the parameters' dtype."""
        kernel = self.kernel[...]
        if self.weights is None:
            return kernel
        return self.weights.apply(
            kernel,
            self._learned(self.weights, "weight"),
            role="weights",
            key=self._key(self.weights),
            contraction_axis=self.contraction_axis,
        )

    def _operands(self, x: jax.Array, rank: int | None, where: str) -> tuple[jax.Array, jax.Array]:
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(f"{where}: x must be a floating-point array; got dtype {x.dtype}.")
        if rank is None and (x.ndim < 1 or x.shape[-1] != self.in_features):
            raise ValueError(
                f"{where}: x must have shape (..., {self.in_features}) (any rank >= 1, the features last); "
                f"got shape {x.shape}."
            )
        if rank is not None and (x.ndim != rank or x.shape[-1] != self.in_features):
            raise ValueError(
                f"{where}: x must have rank {rank} with {self.in_features} features last; got shape {x.shape}."
            )
        dtype = self.dtype if self.dtype is not None else x.dtype
        a = self.quantized_input(x.astype(dtype))
        return a, self.quantized_kernel().astype(dtype)

    def _add_bias(self, y: jax.Array) -> jax.Array:
        if self.bias is None:
            return y
        return y + jnp.reshape(self.bias[...].astype(y.dtype), (1,) * (y.ndim - 1) + (-1,))


class QuantLinear(_Quantised):
    r"""A dense layer, :math:`y = Q_a(x)\,Q_w(W) + b`, with any stejax estimator for :math:`Q_w` and :math:`Q_a`.

    The kernel has ``nnx.Linear``'s layout ``(in_features, out_features)`` and
    names (``kernel``, ``bias``); the product is ``jax.lax.dot_general`` over
    the last axis of ``x``. The weight quantiser sees the float kernel; the input
    quantiser sees ``x`` in the compute dtype. A quantiser's learned arguments are
    variables of the layer (``weight_step``, ``input_alpha`` ..., see
    :class:`Quant`), so ``nnx.Optimizer(model, tx, wrt=nnx.Param)`` trains LSQ
    steps and PACT clip levels with the weights.

    Args:
      in_features: the input width.
      out_features: the output width.
      weights: the weight quantiser: a :class:`Quant`, a catalog name, a
        callable, or None (default: float weights).
      activations: the input quantiser, likewise (default None: float input).
      use_bias: add a bias (default True).
      dtype: the compute dtype, or None (default) for ``x``'s: the output has it.
      param_dtype: the dtype of the kernel and bias (default float32).
      precision: ``jax.lax.Precision`` of the product (default None).
      kernel_init: the kernel initialiser (default LeCun normal, as ``nnx.Linear``).
      bias_init: the bias initialiser (default zeros).
      rngs: ``nnx.Rngs``; stream ``params`` initialises the kernel, stream
        ``quant`` (else ``default``) feeds a random estimator.

    Example:
      >>> import jax.numpy as jnp
      >>> from flax import nnx
      >>> from stejax.flax import Quant, QuantLinear
      >>> layer = QuantLinear(4, 2, weights=Quant("lsq", bits=4), activations="sign_ste", rngs=nnx.Rngs(0))
      >>> layer(jnp.ones((3, 4))).shape, layer.weight_step.shape
      ((3, 2), ())
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        weights: QuantSpec = None,
        activations: QuantSpec = None,
        use_bias: bool = True,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        precision: Any = None,
        kernel_init: Callable[..., jax.Array] = _DEFAULT_KERNEL_INIT,
        bias_init: Callable[..., jax.Array] = _ZEROS,
        rngs: nnx.Rngs,
    ):
        kernel = kernel_init(rngs.params(), (in_features, out_features), param_dtype)
        bias = bias_init(rngs.params(), (out_features,), param_dtype) if use_bias else None
        self.out_features = out_features
        self._setup(
            kernel,
            bias,
            weights,
            activations,
            in_features=in_features,
            dtype=dtype,
            precision=precision,
            rngs=rngs,
            where="QuantLinear",
            contraction_axis=0,
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        """``x``: ``(..., in_features)``, or one example ``(in_features,)`` as for ``nnx.Linear``.

        Returns ``(..., out_features)`` (``(out_features,)`` for one example).
        """
        if jnp.ndim(x) == 1 and jnp.shape(x)[0] == self.in_features:
            # One example: the quantisers see it as a batch of one, as for (1, in_features).
            return self(x[None])[0]
        a, w = self._operands(x, None, "QuantLinear")
        y = jax.lax.dot_general(a, w, (((a.ndim - 1,), (0,)), ((), ())), precision=self.precision)
        return self._add_bias(y)

    @classmethod
    def from_linear(
        cls,
        linear: nnx.Linear,
        *,
        weights: QuantSpec = None,
        activations: QuantSpec = None,
        rngs: nnx.Rngs | None = None,
    ) -> QuantLinear:
        """A :class:`QuantLinear` with ``linear``'s kernel, bias, dtype and precision, for QAT.

        ``rngs`` is needed only for a random estimator. Raises ValueError for an
        ``nnx.Linear`` with a custom ``dot_general`` or ``preferred_element_type``,
        which this layer would silently drop.
        """
        if not isinstance(linear, nnx.Linear):
            raise TypeError(f"QuantLinear.from_linear: expected an nnx.Linear; got {type(linear).__name__}.")
        if linear.dot_general is not jax.lax.dot_general or linear.preferred_element_type is not None:
            raise ValueError(
                "QuantLinear.from_linear: the nnx.Linear uses a custom dot_general or preferred_element_type; "
                "only the default product can be quantised."
            )
        kernel, bias = linear.kernel[...], (linear.bias[...] if linear.bias is not None else None)
        return cls(
            kernel.shape[0],
            kernel.shape[1],
            weights=weights,
            activations=activations,
            use_bias=bias is not None,
            dtype=linear.dtype,
            param_dtype=kernel.dtype,
            precision=linear.precision,
            kernel_init=lambda *_: kernel,
            bias_init=cast(Callable[..., jax.Array], lambda *_: bias),
            rngs=_rngs_for(rngs, weights, activations),
        )


class QuantConv(_Quantised):
    r"""A convolution, :math:`y = Q_a(x) \circledast Q_w(K) + b`, with any stejax estimator for each quantiser.

    Channels last, as ``nnx.Conv``: ``x`` is ``(batch, *spatial, in_features)``
    (NHWC in 2-D) and the kernel ``(*kernel_size, in_features // groups,
    out_features)`` (HWIO), computed by ``jax.lax.conv_general_dilated``.
    Quantisers and their variables as for :class:`QuantLinear`.

    Args:
      in_features, out_features: the channels in and out.
      kernel_size: an int or one int per spatial axis.
      strides: an int or one per spatial axis (default 1).
      padding: ``"SAME"`` (default), ``"VALID"``, an int, or one ``(low, high)``
        pair per spatial axis.
      kernel_dilation: an int or one per spatial axis (default 1).
      feature_group_count: the number of groups (default 1).
      weights, activations, use_bias, dtype, param_dtype, precision, kernel_init,
      bias_init, rngs: as for :class:`QuantLinear`.

    Example:
      >>> import jax.numpy as jnp
      >>> from flax import nnx
      >>> from stejax.flax import Quant, QuantConv
      >>> conv = QuantConv(1, 8, (3, 3), strides=2, weights=Quant("lsq", bits=4, axis=-1), rngs=nnx.Rngs(0))
      >>> conv(jnp.ones((2, 8, 8, 1))).shape, conv.weight_step.shape
      ((2, 4, 4, 8), (8,))
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        kernel_size: int | Sequence[int],
        *,
        strides: int | Sequence[int] = 1,
        padding: str | int | Sequence[tuple[int, int]] = "SAME",
        kernel_dilation: int | Sequence[int] = 1,
        feature_group_count: int = 1,
        weights: QuantSpec = None,
        activations: QuantSpec = None,
        use_bias: bool = True,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        precision: Any = None,
        kernel_init: Callable[..., jax.Array] = _DEFAULT_KERNEL_INIT,
        bias_init: Callable[..., jax.Array] = _ZEROS,
        rngs: nnx.Rngs,
    ):
        kernel_size = (kernel_size,) if isinstance(kernel_size, int) else tuple(kernel_size)
        nd = len(kernel_size)
        if in_features % feature_group_count:
            raise ValueError(
                f"QuantConv: in_features {in_features} must be a multiple of feature_group_count {feature_group_count}."
            )
        self.kernel_size = kernel_size
        self.strides = _per_axis(strides, nd, "strides")
        self.kernel_dilation = _per_axis(kernel_dilation, nd, "kernel_dilation")
        self.padding = _padding(padding, nd)
        self.feature_group_count = feature_group_count
        self.out_features = out_features
        shape = (*kernel_size, in_features // feature_group_count, out_features)
        kernel = kernel_init(rngs.params(), shape, param_dtype)
        bias = bias_init(rngs.params(), (out_features,), param_dtype) if use_bias else None
        self._setup(
            kernel,
            bias,
            weights,
            activations,
            in_features=in_features,
            dtype=dtype,
            precision=precision,
            rngs=rngs,
            where="QuantConv",
            contraction_axis=-2,
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        """``x``: ``(batch, *spatial, in_features)``. Returns ``(batch, *spatial_out, out_features)``."""
        nd = len(self.kernel_size)
        a, w = self._operands(x, nd + 2, "QuantConv")
        # Channels last: (N, spatial..., C) inputs and outputs, (spatial..., I, O) kernels.
        lhs = (0, nd + 1, *range(1, nd + 1))
        rhs = (nd + 1, nd, *range(nd))
        y = jax.lax.conv_general_dilated(
            a,
            w,
            window_strides=self.strides,
            padding=self.padding,
            rhs_dilation=self.kernel_dilation,
            dimension_numbers=jax.lax.ConvDimensionNumbers(lhs, rhs, lhs),
            feature_group_count=self.feature_group_count,
            precision=self.precision,
        )
        return self._add_bias(y)

    @classmethod
    def from_conv(
        cls,
        conv: nnx.Conv,
        *,
        weights: QuantSpec = None,
        activations: QuantSpec = None,
        rngs: nnx.Rngs | None = None,
    ) -> QuantConv:
        """A :class:`QuantConv` with ``conv``'s kernel, bias and geometry, for QAT.

        Raises ValueError for what this layer does not do: input dilation, a
        mask, ``CIRCULAR``/``REFLECT``/``CAUSAL`` padding, a custom
        ``conv_general_dilated`` or ``preferred_element_type``.
        """
        if not isinstance(conv, nnx.Conv):
            raise TypeError(f"QuantConv.from_conv: expected an nnx.Conv; got {type(conv).__name__}.")
        nd = len(conv.kernel_size)
        unsupported = []
        if any(d != 1 for d in _per_axis(conv.input_dilation or 1, nd, "input_dilation")):
            unsupported.append(f"input_dilation {conv.input_dilation}")
        if conv.mask is not None:
            unsupported.append("a mask")
        if isinstance(conv.padding, str) and conv.padding.upper() not in ("SAME", "VALID"):
            unsupported.append(f"padding {conv.padding!r}")
        if conv.conv_general_dilated is not jax.lax.conv_general_dilated or conv.preferred_element_type is not None:
            unsupported.append("a custom conv_general_dilated or preferred_element_type")
        if unsupported:
            raise ValueError(f"QuantConv.from_conv: the nnx.Conv uses {', '.join(unsupported)}; not supported.")
        kernel, bias = conv.kernel[...], (conv.bias[...] if conv.bias is not None else None)
        return cls(
            conv.in_features,
            conv.out_features,
            conv.kernel_size,
            strides=conv.strides if conv.strides is not None else 1,
            padding=conv.padding.upper() if isinstance(conv.padding, str) else cast(Any, conv.padding),
            kernel_dilation=conv.kernel_dilation if conv.kernel_dilation is not None else 1,
            feature_group_count=conv.feature_group_count,
            weights=weights,
            activations=activations,
            use_bias=bias is not None,
            dtype=conv.dtype,
            param_dtype=kernel.dtype,
            precision=conv.precision,
            kernel_init=lambda *_: kernel,
            bias_init=cast(Callable[..., jax.Array], lambda *_: bias),
            rngs=_rngs_for(rngs, weights, activations),
        )


def quantize(
    module: nnx.Linear | nnx.Conv,
    *,
    weights: QuantSpec = None,
    activations: QuantSpec = None,
    rngs: nnx.Rngs | None = None,
) -> QuantLinear | QuantConv:
    """Wrap an existing ``nnx.Linear`` or ``nnx.Conv`` for QAT: the same parameters, quantised.

    :meth:`QuantLinear.from_linear` or :meth:`QuantConv.from_conv`; without
    quantisers the new layer computes what ``module`` computes. Replace the
    module in its parent (``model.fc = quantize(model.fc, weights=...)``) to
    train the model with quantisation.

    Example:
      >>> import jax.numpy as jnp
      >>> from flax import nnx
      >>> from stejax.flax import Quant, quantize
      >>> dense = nnx.Linear(4, 2, rngs=nnx.Rngs(0))
      >>> q = quantize(dense, weights=Quant("lsq", bits=8), activations=Quant("pact", bits=8))
      >>> type(q).__name__, float(q.input_alpha[...])
      ('QuantLinear', 6.0)
    """
    if isinstance(module, nnx.Linear):
        return QuantLinear.from_linear(module, weights=weights, activations=activations, rngs=rngs)
    if isinstance(module, nnx.Conv):
        return QuantConv.from_conv(module, weights=weights, activations=activations, rngs=rngs)
    raise TypeError(f"quantize: expected an nnx.Linear or nnx.Conv; got {type(module).__name__}.")


def _rngs_for(rngs: nnx.Rngs | None, *specs: QuantSpec) -> nnx.Rngs:
    # The copied layer draws no parameter keys (its initialisers return the copied
    # arrays), so without a random estimator no key is needed and none is made up.
    if rngs is not None:
        return rngs
    for spec in specs:
        q = as_quant(spec, where="quantize")
        if q is not None and q.random:
            raise TypeError(f"quantize: {q.name} draws random numbers; pass rngs=nnx.Rngs(...) with a 'quant' stream.")
    return nnx.Rngs(params=0)


def _per_axis(value: Any, nd: int, name: str) -> tuple[int, ...]:
    out = (value,) * nd if isinstance(value, int) else tuple(value)
    if len(out) != nd or any(not isinstance(v, int) or v < 1 for v in out):
        raise ValueError(f"QuantConv: {name} must be a positive int or {nd} of them; got {value!r}.")
    return out


def _padding(padding: Any, nd: int) -> str | tuple[tuple[int, int], ...]:
    if isinstance(padding, str):
        if padding.upper() not in ("SAME", "VALID"):
            raise ValueError(
                "QuantConv: padding must be 'SAME', 'VALID', an int or per-axis pairs (nnx.Conv's 'CIRCULAR', "
                f"'CAUSAL' and 'REFLECT' are not supported); got {padding!r}."
            )
        return padding.upper()
    # The forms nnx.Conv takes: an int for every side, or per spatial axis an int or a (low, high) pair.
    if isinstance(padding, int) and not isinstance(padding, bool):
        return ((padding, padding),) * nd
    pairs = None
    if isinstance(padding, Sequence) and len(padding) == nd:
        pairs = tuple((p, p) if isinstance(p, int) else tuple(p) if isinstance(p, Sequence) else None for p in padding)
    if pairs is None or any(
        p is None or len(p) != 2 or any(isinstance(v, bool) or not isinstance(v, int) for v in p) for p in pairs
    ):
        raise ValueError(
            f"QuantConv: padding must be 'SAME', 'VALID', an int, or per spatial axis ({nd}) an int or a "
            f"(low, high) pair of ints; got {padding!r}."
        )
    return cast(tuple[tuple[int, int], ...], pairs)
