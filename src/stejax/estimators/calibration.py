"""Scale calibration: choose :func:`~stejax.fake_quant`'s scale (and zero point) from data.

Pure functions of the data, with no custom gradients. Each returns arrays in
``x``'s dtype, at one of three granularities:

* per tensor (``axis=None``, the default): one scale, shape ``()``;
* per channel (``axis=k``): one scale per index along axis ``k``, reducing over
  the other axes, shape ``(x.shape[k],)``; apply with ``fake_quant(x, scale, axis=k)``;
* per group (``group_size=g``): one scale per run of ``g`` consecutive elements
  along the last axis, shape ``x.shape[:-1] + (x.shape[-1] // g,)``. Apply by
  viewing ``x`` as rows of ``g``::

      s = absmax_scale(w, bits=4, group_size=32)
      wq = fake_quant(w.reshape(-1, 32), s.reshape(-1), bits=4, axis=0).reshape(w.shape)

Every scale is floored at the smallest positive normal number of ``x``'s dtype
(``finfo(dtype).tiny``), so an all-zero (or all-subnormal) slice still gets a
positive scale and quantizes to zeros instead of dividing by zero. NaN in a slice
gives a NaN scale; the data should be finite.

As in :mod:`stejax.estimators.uniform`, the arithmetic runs in float32 (float64
for float64 inputs), divisions by a constant are multiplications by its rounded
reciprocal (``fl(1/q)``), and results are rounded to ``x``'s dtype at the end.
Each function compiles once per input shape, dtype and setting (the keyword
arguments are static) and can be called inside ``jit`` and ``vmap``.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from stejax.estimators.uniform import (
    _compute_dtype,
    _fake_quant_forward,
    check_axis,
    check_bits,
    check_flag,
    integer_range,
    rounded_product,
)

__all__ = ["absmax_scale", "minmax_scale", "mse_scale", "percentile_scale"]


def _floating_input(name: str, x: ArrayLike) -> jax.Array:
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(
            f"{name}: x must be a floating-point array (float16, bfloat16, float32 or float64); got dtype {x.dtype}."
        )
    if x.size == 0:
        raise ValueError(f"{name}: x must not be empty; got shape {x.shape}.")
    return x


def _granularity(name: str, x: jax.Array, axis: Any, group_size: Any) -> tuple[int | None, int | None]:
    """``axis`` and ``group_size`` checked against ``x`` (axis normalised)."""
    if axis is not None and group_size is not None:
        raise ValueError(
            f"{name}: give axis (per channel) or group_size (per group along the last axis), "
            f"not both; got axis={axis!r}, group_size={group_size!r}."
        )
    if group_size is not None:
        if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)):
            raise TypeError(
                f"{name}: group_size must be None or a positive int; got {group_size!r} "
                f"of type {type(group_size).__name__}."
            )
        if x.ndim == 0 or group_size < 1 or x.shape[-1] % group_size:
            raise ValueError(
                f"{name}: group_size must be a positive int dividing the last axis of x; "
                f"got group_size={group_size} for x of shape {x.shape}."
            )
        return None, int(group_size)
    return check_axis(name, axis, x.ndim), None


def _arrange(x: jax.Array, axis: int | None, group_size: int | None) -> jax.Array:
    """``x`` as ``scale_shape + (m,)``: each calibration slice is one row of the last axis."""
    if group_size is not None:
        return x.reshape((*x.shape[:-1], x.shape[-1] // group_size, group_size))
    if axis is None:
        return x.reshape(-1)
    return jnp.moveaxis(x, axis, 0).reshape(x.shape[axis], -1)


# The computations are jitted with their static parameters: one compilation per
# shape and setting serves every later call (mse_scale's search is a lax.scan,
# which would otherwise be traced and compiled again on each eager call).
_STATIC = ("axis", "group_size", "qmax")


@functools.partial(jax.jit, static_argnames=_STATIC)
def _absmax(x, *, axis, group_size, qmax):
    if axis is not None:
        # Per channel: reduce over the other axes where they lie. A max is exact in any
        # order, so this is _arrange's row max bit for bit, without the transposed copy of
        # x that moveaxis + reshape makes (one per weight matrix in a QAT step).
        # max|x| is taken as max(max x, -min x), equal for every input (negation is exact, NaN
        # propagates through both; a zero of either sign becomes the floor below): XLA:CPU hands
        # abs-then-reduce over the leading axes to a library kernel that measured ~2x slower than
        # the two plain reductions, and a QAT step takes one per weight matrix (int8 step -11% CPU).
        others = tuple(i for i in range(x.ndim) if i != axis)
        amax = jnp.maximum(jnp.max(x, axis=others), -jnp.min(x, axis=others)).astype(_compute_dtype(x.dtype))
        return _floor((amax * (1 / qmax)).astype(x.dtype))
    return _floor(_absmax_step(_arrange(x, axis, group_size), qmax).astype(x.dtype))


@functools.partial(jax.jit, static_argnames=_STATIC)
def _minmax(x, *, axis, group_size, qmax):
    xs = _arrange(x, axis, group_size)
    cdt = _compute_dtype(x.dtype)
    x_min = jnp.min(xs, axis=-1).astype(cdt)
    x_max = jnp.max(xs, axis=-1).astype(cdt)
    # Selects rather than min/max with 0: NaN propagates and the sign of zero is defined.
    lo = jnp.where(x_min > 0, 0, x_min)
    hi = jnp.where(x_max < 0, 0, x_max)
    scale = _floor(((hi - lo) * (1 / qmax)).astype(x.dtype))
    zero_point = jnp.abs(jnp.round(lo * (1 / scale.astype(cdt))))
    zero_point = jnp.where(zero_point > qmax, qmax, zero_point)
    return scale, zero_point.astype(x.dtype)


@functools.partial(jax.jit, static_argnames=(*_STATIC, "percentile"))
def _percentile(x, *, axis, group_size, qmax, percentile):
    a = jnp.sort(jnp.abs(_arrange(x, axis, group_size)).astype(_compute_dtype(x.dtype)), axis=-1)
    m = a.shape[-1]
    k = (m - 1) * (percentile / 100)
    i = min(math.floor(k), m - 1)
    value = a[..., i]
    if k > i:  # interpolate; at an exact index there is nothing to add
        value = value + rounded_product(a[..., min(i + 1, m - 1)] - value, k - i)
    return _floor((value * (1 / qmax)).astype(x.dtype))


@functools.partial(jax.jit, static_argnames=(*_STATIC, "bits", "signed", "candidates"))
def _mse(x, *, axis, group_size, qmax, bits, signed, candidates):
    xs = _arrange(x, axis, group_size)
    cdt = _compute_dtype(x.dtype)
    base = _absmax_step(xs, qmax)
    xs_c = xs.astype(cdt)

    def error(scale):
        q = _fake_quant_forward(xs, scale[..., None], 0, bits=bits, signed=signed)
        d = q.astype(cdt) - xs_c
        return jnp.sum(d * d, axis=-1)

    def better(best, fraction):
        best_scale, best_error = best
        scale = _floor((base * fraction).astype(x.dtype))
        e = error(scale)
        keep = ~(e < best_error)
        return (jnp.where(keep, best_scale, scale), jnp.where(keep, best_error, e)), None

    first = _floor(base.astype(x.dtype))
    fractions = (np.arange(candidates - 1, 0, -1, dtype=np.float64) / candidates).astype(cdt)
    (scale, _), _ = jax.lax.scan(better, (first, error(first)), fractions)
    return scale


def _floor(scale: jax.Array) -> jax.Array:
    tiny = jnp.finfo(scale.dtype).tiny
    return jnp.where(scale < tiny, tiny, scale)


def _absmax_step(xs: jax.Array, qmax: int) -> jax.Array:
    """max|x| * fl(1 / qmax) per slice, in the compute dtype (before the cast and the floor)."""
    amax = jnp.max(jnp.abs(xs), axis=-1).astype(_compute_dtype(xs.dtype))
    return amax * (1 / qmax)


def _symmetric_qmax(name: str, bits: Any, signed: Any) -> tuple[int, bool, int]:
    signed = check_flag(name, "signed", signed)
    bits = check_bits(name, bits, signed=signed)
    return bits, signed, integer_range(bits, signed)[1]


def absmax_scale(
    x: ArrayLike, *, bits: int, signed: bool = True, axis: int | None = None, group_size: int | None = None
) -> jax.Array:
    r"""The scale that maps the largest magnitude onto the top level.

    .. math::

       s = \max\!\Big(\max_{\text{slice}} |x| \cdot \operatorname{fl}(1/q_{\max}),\ \text{tiny}\Big),

    with :math:`q_{\max} = 2^{b-1} - 1` when ``signed``, :math:`2^b - 1` otherwise,
    so that ``fake_quant(x, s, bits=bits, signed=signed)`` does not clip.

    Args:
      x: floating-point array, not empty.
      bits: the bit width, as for :func:`~stejax.fake_quant`: [2, 16] signed,
        [1, 16] unsigned.
      signed: calibrate for a signed (default) or unsigned grid.
      axis: None (per tensor) or the channel axis.
      group_size: None, or the group length along the last axis.

    Returns:
      The scales, in ``x``'s dtype: shape ``()``, ``(x.shape[axis],)`` or
      ``x.shape[:-1] + (x.shape[-1] // group_size,)``.

    Raises:
      TypeError: a non-floating ``x`` or a parameter of the wrong type.
      ValueError: ``bits``, ``axis`` or ``group_size`` out of range, both ``axis``
        and ``group_size``, or an empty ``x``.

    Example:
      >>> import jax.numpy as jnp, stejax
      >>> x = jnp.array([[0.5, -2.54], [0.0, 0.0]])
      >>> stejax.absmax_scale(x, bits=8, axis=0).tolist()  # the zero row gets tiny
      [0.019999999552965164, 1.1754943508222875e-38]
    """
    x = _floating_input("absmax_scale", x)
    bits, signed, qmax = _symmetric_qmax("absmax_scale", bits, signed)
    axis, group_size = _granularity("absmax_scale", x, axis, group_size)
    return _absmax(x, axis=axis, group_size=group_size, qmax=qmax)


def minmax_scale(
    x: ArrayLike, *, bits: int, axis: int | None = None, group_size: int | None = None
) -> tuple[jax.Array, jax.Array]:
    r"""Asymmetric (unsigned) calibration: a scale and zero point covering [min, max].

    The range is widened to contain 0, so that 0 is exactly representable:
    :math:`\ell = \min(\min x, 0)`, :math:`h = \max(\max x, 0)`, and with
    :math:`n = 2^b - 1`,

    .. math::

       s = \max\!\big((h - \ell) \cdot \operatorname{fl}(1/n),\ \text{tiny}\big), \qquad
       z = \min\!\big(|\operatorname{round}(\ell \cdot s^{-1})|,\ n\big),

    :math:`s` rounded to ``x``'s dtype before :math:`z` is computed from it, round
    ties to even. :math:`z` is the textbook :math:`q_{\min} - \operatorname{round}(\ell /
    s)` with :math:`q_{\min} = 0` (an absolute value, as :math:`\ell \le 0`, so that
    it is never -0.0). Use with ``fake_quant(x, s, z, bits=bits, signed=False)``.
    bfloat16 holds integers exactly only up to 256, so for more than 8 bits a
    bfloat16 :math:`z` is the nearest bfloat16 integer.

    Args:
      x: floating-point array, not empty and finite.
      bits: the bit width, an int in [1, 16].
      axis: None (per tensor) or the channel axis.
      group_size: None, or the group length along the last axis.

    Returns:
      ``(scale, zero_point)``, both in ``x``'s dtype and of the granularity's shape.

    Raises:
      TypeError: a non-floating ``x`` or a parameter of the wrong type.
      ValueError: ``bits``, ``axis`` or ``group_size`` out of range, both ``axis``
        and ``group_size``, or an empty ``x``.

    Example:
      >>> import jax.numpy as jnp, stejax
      >>> s, z = stejax.minmax_scale(jnp.array([-1.0, 0.5, 3.0]), bits=2)
      >>> round(float(s), 4), float(z)
      (1.3333, 1.0)
    """
    x = _floating_input("minmax_scale", x)
    bits = check_bits("minmax_scale", bits, signed=False)
    qmax = 2**bits - 1
    axis, group_size = _granularity("minmax_scale", x, axis, group_size)
    return _minmax(x, axis=axis, group_size=group_size, qmax=qmax)


def _check_percentile(percentile: Any) -> float:
    if isinstance(percentile, bool) or not isinstance(percentile, (int, float, np.integer, np.floating)):
        raise TypeError(
            f"percentile_scale: percentile must be a float in (0, 100]; got {percentile!r} "
            f"of type {type(percentile).__name__}."
        )
    if not 0 < percentile <= 100:
        raise ValueError(f"percentile_scale: percentile must be in (0, 100]; got {percentile}.")
    return float(percentile)


def percentile_scale(
    x: ArrayLike,
    *,
    bits: int,
    percentile: float = 99.99,
    signed: bool = True,
    axis: int | None = None,
    group_size: int | None = None,
) -> jax.Array:
    r"""The scale that maps a percentile of :math:`|x|` onto the top level (outliers clip).

    With :math:`a_{(0)} \le \dots \le a_{(m-1)}` the sorted magnitudes of a slice,
    the percentile :math:`p` is interpolated linearly, as NumPy's default
    ``method="linear"``: :math:`k = (m - 1) \cdot p / 100` (in float64),
    :math:`i = \lfloor k \rfloor`, :math:`t = k - i` (rounded to the compute dtype),

    .. math::

       P = a_{(i)} + (a_{(i+1)} - a_{(i)}) \cdot t, \qquad
       s = \max\!\big(P \cdot \operatorname{fl}(1/q_{\max}),\ \text{tiny}\big),

    in float32 (float64 for float64 inputs), the product rounded before the sum;
    :math:`q_{\max}` as in :func:`absmax_scale`. ``percentile=100`` gives
    :func:`absmax_scale`'s scale. The magnitudes are used for unsigned grids too
    (meant for nonnegative data).

    Args:
      x: floating-point array, not empty and finite.
      bits: the bit width: [2, 16] signed, [1, 16] unsigned.
      percentile: :math:`p`, a float in (0, 100] (default 99.99).
      signed: calibrate for a signed (default) or unsigned grid.
      axis: None (per tensor) or the channel axis.
      group_size: None, or the group length along the last axis.

    Returns:
      The scales, in ``x``'s dtype, of the granularity's shape.

    Raises:
      TypeError: a non-floating ``x`` or a parameter of the wrong type.
      ValueError: ``bits``, ``percentile``, ``axis`` or ``group_size`` out of
        range, both ``axis`` and ``group_size``, or an empty ``x``.

    Example:
      >>> import jax.numpy as jnp, stejax
      >>> x = jnp.concatenate([jnp.linspace(-1.0, 1.0, 101), jnp.array([50.0])])
      >>> round(float(stejax.percentile_scale(x, bits=8, percentile=99.0)) * 127, 3)
      1.0
    """
    x = _floating_input("percentile_scale", x)
    percentile = _check_percentile(percentile)
    bits, signed, qmax = _symmetric_qmax("percentile_scale", bits, signed)
    axis, group_size = _granularity("percentile_scale", x, axis, group_size)
    return _percentile(x, axis=axis, group_size=group_size, qmax=qmax, percentile=percentile)


def mse_scale(
    x: ArrayLike,
    *,
    bits: int,
    signed: bool = True,
    axis: int | None = None,
    group_size: int | None = None,
    candidates: int = 100,
) -> jax.Array:
    r"""The scale, among fractions of the absmax scale, with the least squared quantization error.

    The candidates are :math:`s_j = \max(\operatorname{fl}(s_{\max} \cdot j / C),\
    \text{tiny})` for :math:`j = C, C-1, \dots, 1`, with :math:`s_{\max}` the
    :func:`absmax_scale` before its cast (so :math:`s_C` is exactly
    :func:`absmax_scale`'s result) and :math:`j / C` computed in float64 and
    rounded to the compute dtype. For each slice the scale minimising

    .. math::

       E(s) = \sum_{\text{slice}} \big(\operatorname{fake\_quant}(x, s) - x\big)^2

    is returned, with ``fake_quant``'s own forward (zero point 0, ``signed`` as
    given) in ``x``'s dtype and the error summed in float32. Ties keep the larger
    scale, so the result never has a larger error than :func:`absmax_scale`'s (up
    to the float32 summation). The search runs as a ``lax.scan`` over the
    candidates: memory stays that of one quantized copy of ``x``.

    Args:
      x: floating-point array, not empty and finite.
      bits: the bit width: [2, 16] signed, [1, 16] unsigned.
      signed: calibrate for a signed (default) or unsigned grid.
      axis: None (per tensor) or the channel axis.
      group_size: None, or the group length along the last axis.
      candidates: :math:`C`, the number of fractions tried, an int >= 1 (default 100).

    Returns:
      The scales, in ``x``'s dtype, of the granularity's shape.

    Raises:
      TypeError: a non-floating ``x`` or a parameter of the wrong type.
      ValueError: ``bits``, ``candidates``, ``axis`` or ``group_size`` out of
        range, both ``axis`` and ``group_size``, or an empty ``x``.

    Example:
      >>> import jax.numpy as jnp, stejax
      >>> x = jnp.linspace(-1.0, 1.0, 101) ** 3  # most of the mass near 0
      >>> float(stejax.mse_scale(x, bits=4)), float(stejax.absmax_scale(x, bits=4))
      (0.1300000101327896, 0.1428571492433548)
    """
    x = _floating_input("mse_scale", x)
    bits, signed, qmax = _symmetric_qmax("mse_scale", bits, signed)
    if isinstance(candidates, bool) or not isinstance(candidates, (int, np.integer)):
        raise TypeError(
            f"mse_scale: candidates must be a positive int; got {candidates!r} of type {type(candidates).__name__}."
        )
    if candidates < 1:
        raise ValueError(f"mse_scale: candidates must be a positive int; got {candidates}.")
    axis, group_size = _granularity("mse_scale", x, axis, group_size)
    return _mse(x, axis=axis, group_size=group_size, qmax=qmax, bits=bits, signed=signed, candidates=int(candidates))
