"""The NNX layer of low-bit products and its helpers (public face: :mod:`stejax.lowbit.nnx`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from stejax.lowbit.kernels._fused import (
    fused_grouped_fits,
    fused_grouped_linear,
    fused_kernel_fits,
    fused_linear,
    grouped_multiplier,
    multiplier,
    quantise_rows,
    rescale,
)
from stejax.lowbit.kernels._grouped import grouped_sum, grouped_sum_reference
from stejax.lowbit.kernels._int8 import int8_accumulate, int8_accumulate_reference
from stejax.lowbit.kernels._skeleton import IMPLEMENTATIONS
from stejax.lowbit.kernels._supports import use_kernels
from stejax.lowbit.kernels._ternary import ternary_accumulate, ternary_accumulate_reference
from stejax.lowbit.kernels._vpu import VPU_MOST_ROWS, check_method

__all__ = ["LowBitLinear", "Resident", "SplitLinear", "on_device", "with_kernel_method"]


class Resident(nnx.Variable):
    """A weight buffer kept as exported (integer codes, packed codes or their scales); never trained."""


def _lead(a: jax.Array, ndim: int) -> jax.Array:
    """``a`` with leading axes of size 1 up to ``ndim`` (broadcasting is explicit in this package)."""
    return a.reshape((1,) * (ndim - a.ndim) + a.shape)


def on_device(a: Any, dtype: Any = None) -> jax.Array:
    """``jnp.asarray(a, dtype)``, with a host array moved by ``jax.device_put`` (no compilation per shape).

    A copy is asked for (``may_alias=False``) and waited for: a caller that drops its host array frees it at
    once, so a load holds one tensor on the host at a time, not every one still in flight. (A CPU device may
    still keep a suitably aligned host array as its buffer; it is then the device's copy, not a second one.)
    """
    if isinstance(a, jax.Array):
        return a if dtype is None or a.dtype == dtype else a.astype(dtype)
    return jax.device_put(np.asarray(a, dtype), may_alias=False).block_until_ready()


class LowBitLinear(nnx.Module):
    """A bias-free linear layer whose kernel stays in its exported integer form.

    Args:
      form: ``"int8"``, ``"int4"``, ``"int2"``, ``"ternary-int8"`` or ``"ternary-2bit"``.
      codes: the resident codes: int8 ``(in, out)`` for int8 and ternary-int8, else packed by
        :func:`stejax.lowbit.pack_groups` (ternary-2bit as one group of the whole contraction).
      scale: float32: ``(out,)`` for int8, ``(groups, out)`` for int4 and int2, ``()`` for ternary, or ``(out,)``
        for ternary weights whose columns carry different tensor scales (several ternary kernels side by side,
        each column with its own tensor's scale; the arithmetic of each column is the one-scale layer's). For int8 and
        ternary weights the layer keeps the weight side of its rescale instead
        (:func:`stejax.lowbit.kernels._fused.multiplier`: :math:`s_o / t`, or :math:`1 / (\\gamma^{-1} t)`, made on the
        host): the step multiplies the int32 sums by it and by the input rows' maxima, where the formulas above
        divide by :math:`s_x` (the same value to float32 rounding). For int4 and int2 weights it keeps
        :math:`s_{go} / t` (:func:`stejax.lowbit.kernels._fused.grouped_multiplier`): the step scales each group's
        int32 sums by it, adds them in the order of the groups and multiplies by the row maxima.
      in_features, out_features: the kernel's shape.
      input_bits: 8 or 4: the per-token input codes.
      implementation: the integer product: ``"xla"`` (``lax.dot_general``), ``"pallas"`` (stejax's Pallas TPU
        kernels for int8, grouped int4 and int2, and 2-bit ternary weights; one kernel does the whole layer, the
        input's quantisation and the rescale included, :mod:`stejax.lowbit.kernels._fused`, where the shape suits
        it: grouped weights at most 16 rows), or None (automatic): the kernels where the default device is a TPU
        generation they are verified on (:data:`stejax.lowbit.kernels.VERIFIED_ON`: the TPU v5e) and
        :func:`stejax.lowbit.kernels.supports` the shape (a few rows, as in decoding), else XLA (on the CPU, and
        on every other chip). The two give the same int32 sums; int8 and ternary logits are identical, grouped
        int4 and int2 ones equal to float32 rounding (a CPU compiler may fuse a group scale's product and the
        running sum into one multiply-add in one program and not in the other).
      method: how the Pallas kernels multiply: ``"mxu"`` (int8 products on the MXU), or ``"vpu"`` (calls of at
        most :data:`stejax.lowbit.kernels._vpu.VPU_MOST_ROWS` rows on the vector unit, the separate product
        kernels; more rows on the MXU). A plain attribute: a model's compiled step is cached per method.
      interpret: run the kernels in Pallas interpret mode (any backend; for tests).

    Raises:
      ValueError: an unknown ``implementation`` or ``method``.
    """

    def __init__(
        self,
        form: str,
        codes: Any,
        scale: Any,
        *,
        in_features: int,
        out_features: int,
        input_bits: int,
        implementation: str | None = None,
        method: str = "mxu",
        interpret: bool = False,
    ) -> None:
        if implementation not in IMPLEMENTATIONS:
            raise ValueError(f"LowBitLinear: implementation must be one of {IMPLEMENTATIONS}; got {implementation!r}.")
        check_method(method, "LowBitLinear")
        self.form = form
        self.in_features = in_features
        self.out_features = out_features
        self.input_bits = input_bits
        self.implementation = implementation
        self.method = method
        self.interpret = interpret
        self.codes = Resident(on_device(codes))
        if form in ("int8", "ternary-int8", "ternary-2bit"):
            # The weight side of the rescale, made on the host (stejax.lowbit.kernels._fused.multiplier): the step
            # multiplies by it and the row maximum, a product every compiler keeps as written.
            scale = multiplier(np.asarray(scale, np.float32), "int8" if form == "int8" else "ternary", input_bits)
            if scale.ndim:  # (1, out): the kernel's block layout, which (out,) is not on a TPU
                scale = scale.reshape(1, out_features)
        elif form in ("int4", "int2"):  # s_go / t: the step multiplies the scaled group sums by the row maxima
            scale = grouped_multiplier(np.asarray(scale, np.float32), input_bits)
        self.scale = Resident(on_device(scale, jnp.float32))

    def _kernel(self, rows: int) -> bool:
        """Whether this call runs the Pallas kernels (chosen in Python, from static facts)."""
        group = self.in_features // self.codes.shape[0] if self.form in ("int4", "int2") else None
        return use_kernels(
            self.implementation, self.form, rows=rows, k=self.in_features, n=self.out_features, group=group
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        codes, scale = self.codes[...], self.scale[...]
        rows = math.prod(x.shape[:-1])
        kernel = self._kernel(rows)
        fused = self.form in ("int8", "ternary-int8", "ternary-2bit")
        if kernel and not (self.method == "vpu" and rows <= VPU_MOST_ROWS):
            # One kernel: the input's quantisation, the integer product and the rescale.
            k, n = self.in_features, self.out_features
            if fused and fused_kernel_fits(rows, k, n, self.form):
                return fused_linear(x, codes, scale, form=self.form, bits=self.input_bits, interpret=self.interpret)
            if not fused and fused_grouped_fits(rows, k, n, k // codes.shape[0], self.form):
                return fused_grouped_linear(
                    x, codes, scale, form=self.form, bits=self.input_bits, interpret=self.interpret
                )
        qf, m = quantise_rows(x.astype(jnp.float32), self.input_bits)
        q = qf.astype(jnp.int8)
        if self.form in ("int8", "ternary-int8"):
            acc = (
                int8_accumulate(q, codes, interpret=self.interpret, method=self.method)
                if kernel
                else int8_accumulate_reference(q, codes)
            )
            return rescale(acc, m, _lead(scale, acc.ndim), "int8" if self.form == "int8" else "ternary")
        if self.form == "ternary-2bit":
            acc = (
                ternary_accumulate(q, codes, interpret=self.interpret, method=self.method)
                if kernel
                else ternary_accumulate_reference(q, codes)
            )
            return rescale(acc, m, _lead(scale, acc.ndim) if scale.ndim else scale, "ternary")
        bits = 4 if self.form == "int4" else 2
        if kernel:
            return grouped_sum(q, codes, scale, bits=bits, interpret=self.interpret, method=self.method) * m
        return grouped_sum_reference(q, codes, scale, bits=bits) * m


class SplitLinear(nnx.Module):
    """Linear layers of one input side by side as one :class:`LowBitLinear`: one product, its columns split back.

    The kernels of the parts are concatenated along the output axis (codes and scales column by column; for
    ternary weights each column keeps its own tensor's scale), so that one call does the work of several. Each
    output column is computed by the same integer sum and the same float operations as in its own layer: the
    parts' outputs equal the separate layers' bit for bit. On a TPU at decoding's few rows a call costs a fixed
    time whatever its width, so fewer, wider calls make a faster step.

    Args:
      linear: the layer holding every part's columns, in order.
      widths: each part's output columns; they sum to ``linear.out_features``.

    Returns (called on ``x`` ``(..., in)``): a tuple of float32 ``(..., width)``, one per part.

    Raises:
      ValueError: widths that are not positive ints summing to the layer's output columns.
    """

    def __init__(self, linear: LowBitLinear, widths: Sequence[int]) -> None:
        widths = tuple(widths)
        if not widths or any(isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in widths):
            raise ValueError(f"SplitLinear: widths must be ints >= 1; got {widths!r}.")
        if sum(widths) != linear.out_features:
            raise ValueError(
                f"SplitLinear: widths {widths} sum to {sum(widths)}; expected the layer's {linear.out_features} "
                "output columns."
            )
        self.linear = linear
        self.widths = widths

    def __call__(self, x: jax.Array) -> tuple[jax.Array, ...]:
        y = self.linear(x)
        ends = np.cumsum(self.widths).tolist()
        return tuple(y[..., end - width : end] for width, end in zip(self.widths, ends, strict=True))


def with_kernel_method(model: Any, method: str) -> Any:
    """A copy of ``model`` whose :class:`LowBitLinear` layers run the Pallas kernels by ``method``.

    ``"vpu"``: the vector-unit product wherever a call has at most
    :data:`stejax.lowbit.kernels._vpu.VPU_MOST_ROWS` rows (decoding), the MXU kernel otherwise; ``"mxu"``: the MXU
    kernels. The layers' ``implementation`` is set to ``"pallas"`` (the kernels, not XLA's product). The weights
    are shared with ``model``, not copied.

    Raises:
      ValueError: a method other than ``"mxu"`` or ``"vpu"``.
    """
    check_method(method, "with_kernel_method")
    graphdef, state = nnx.split(model)
    copy = nnx.merge(graphdef, state)
    for _, module in nnx.iter_modules(copy):
        if isinstance(module, LowBitLinear):
            module.implementation = "pallas"
            module.method = method
    return copy
