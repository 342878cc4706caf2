"""Quantised products: a matrix product whose forward runs on integer codes.

:func:`quantized_matmul` is the product ``fake_quant(x) @ fake_quant(w)`` computed
the way an int8 accelerator (or a CPU with AVX-512 VNNI) computes it: the
operands' integer codes multiplied as ``int8 x int8 -> int32``, the sum rescaled
once. Its surrogate gradient is that of the fake-quant composition. The
conventions are those of :mod:`stejax.estimators.uniform`: the codes come from
``x * fl(1 / s)`` rounded half to even and clipped by two selects, in float32
(float64 for float64 inputs), and the result is rounded to ``x``'s dtype once.

:func:`stejax.integer_dot_general` (and :func:`stejax.integer_einsum`,
:mod:`stejax.lowbit._products`) is the training product: any ``dot_general``
with batch and contracting axes, dynamic absmax scales per token, per channel or
per group, and a declared gradient whose two backward products run on int8 codes
too, the cotangent quantised per row and per column (round to nearest, or
stochastic with an explicit key).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from stejax.estimators._core import surrogate
from stejax.estimators.uniform import (
    _clip,
    _compute_dtype,
    check_bits,
    check_positive,
    integer_range,
)

__all__ = ["quantized_matmul"]

MAX_PRODUCT_BITS = 8
_INT32_MAX = 2**31 - 1


def _codes(a, scale, bits):
    """``round(a * fl(1 / s))`` in the compute dtype, the clip bounds, and the clipped codes."""
    cdt = _compute_dtype(a.dtype)
    qmin, qmax = integer_range(bits, signed=True)
    r = jnp.round(a.astype(cdt) * (1 / jnp.asarray(scale).astype(cdt)))
    return r, qmin, qmax, _clip(r, qmin, qmax)


def _columns(a, ndim):
    """A per-column array of shape (N,) reshaped to broadcast explicitly against rank ``ndim``; a scalar as is."""
    a = jnp.asarray(a)
    return a if a.ndim == 0 else a.reshape((1,) * (ndim - 1) + (-1,))


def _contract(x, w):
    """The dimension numbers of ``x @ w`` for ``x`` of shape (..., K) and ``w`` of shape (K, N)."""
    return (((x.ndim - 1,), (0,)), ((), ()))


def _quantized_matmul_forward(x, w, x_scale, w_scale, *, bits):
    cdt = _compute_dtype(x.dtype)
    _, _, _, qx = _codes(x, x_scale, bits)
    _, _, _, qw = _codes(w, _columns(w_scale, 2), bits)
    # NaN has no integer code (its conversion is implementation-defined): a row of x or a column of
    # w holding NaN makes its outputs NaN, as in the fake-quant composition, instead of a plausible number.
    # The codes are bounded, so their sum is NaN exactly when one is; XLA:CPU runs this float sum
    # faster than isnan(...).any() (the int8 training step: 1.035 against 1.097 of fake_quant's).
    nan = jnp.isnan(jnp.sum(qx, axis=-1, keepdims=True)) | _columns(jnp.isnan(jnp.sum(qw, axis=0)), x.ndim)
    acc = jax.lax.dot_general(
        qx.astype(jnp.int8), qw.astype(jnp.int8), _contract(x, w), preferred_element_type=jnp.int32
    )
    y = acc.astype(cdt) * jnp.asarray(x_scale).astype(cdt) * _columns(w_scale, x.ndim).astype(cdt)
    return jnp.where(nan, jnp.nan, y).astype(x.dtype)


def _quantized_matmul_tangent(x, w, x_scale, w_scale, *, tangents, bits):
    tx, tw = tangents
    rx, lo, hi, qx = _codes(x, x_scale, bits)
    w_scale = _columns(w_scale, 2)
    rw, _, _, qw = _codes(w, w_scale, bits)
    dtype = x.dtype
    # fake_quant's outputs and clipped straight-through masks, in x's dtype as fake_quant returns them.
    deq_x = (qx * jnp.asarray(x_scale).astype(qx.dtype)).astype(dtype)
    deq_w = (qw * jnp.asarray(w_scale).astype(qw.dtype)).astype(dtype)
    m_x = ((rx >= lo) & (rx <= hi)).astype(dtype)
    m_w = ((rw >= lo) & (rw <= hi)).astype(dtype)
    dims = _contract(x, w)
    return jax.lax.dot_general(m_x * tx.astype(dtype), deq_w, dims) + jax.lax.dot_general(
        deq_x, m_w * tw.astype(dtype), dims
    )


_quantized_matmul = surrogate(
    _quantized_matmul_forward, tangent=_quantized_matmul_tangent, name="quantized_matmul", diff_argnums=(0, 1)
)


def quantized_matmul(
    x: ArrayLike,
    w: ArrayLike,
    x_scale: ArrayLike,
    w_scale: ArrayLike,
    *,
    bits: int = 8,
) -> jax.Array:
    r"""A quantised matrix product computed on integer codes, with the fake-quant composition's gradient.

    Forward, with :math:`s_x` the input's scale (one per tensor) and :math:`s_w`
    the weights' (one per output column, or one for all), both signed and
    symmetric as :func:`stejax.fake_quant` with ``signed=True``:

    .. math::

       q_x = \operatorname{clip}(\operatorname{round}(x \cdot s_x^{-1}), q_{\min}, q_{\max}), \qquad
       q_w = \operatorname{clip}(\operatorname{round}(w \cdot s_w^{-1}), q_{\min}, q_{\max}),

       y_{\dots n} = \Big(\big(\textstyle\sum_k q_{x,\dots k}\, q_{w,kn}\big)\, s_x\Big)\, s_{w,n},

    with :math:`(q_{\min}, q_{\max}) = (-2^{b-1}, 2^{b-1} - 1)`, round half to even.
    The codes are computed exactly as :func:`stejax.fake_quant` computes its rounded
    values (in float32, float64 for float64 inputs; :math:`s^{-1}` as ``1 / s``),
    cast to int8 and multiplied by ``jax.lax.dot_general(..., preferred_element_type=int32)``:
    the sum is an exact integer. It is converted to float32 (float64), multiplied
    by :math:`s_x` and then by :math:`s_{w,n}` (two roundings, in that order), and
    rounded to ``x``'s dtype.

    Relation to ``fake_quant(x, s_x, bits=b) @ fake_quant(w, s_w, bits=b, axis=1)``
    (for float32 inputs): the codes are the same, and so are the dequantised
    operands' products up to the scale, but the composition rounds each product
    :math:`(q_x s_x)(q_w s_w)` and the running float32 sum, while here the sum of
    code products is exact and only the final conversion and the two scale
    multiplications round. The two agree to a few float32 ulps of the result's
    magnitude terms: the difference is at most about
    :math:`(K + 3)\, 2^{-24} \sum_k |q_x q_w|\, s_x s_w` (the float32 sum's rounding
    bound), and it is zero whenever every partial sum fits float32's 24-bit
    significand and the scales are powers of two. The integer sum itself is
    converted exactly while :math:`|\sum_k q_x q_w| \le 2^{24}` (always for
    :math:`K \le 1024` at 8 bits); above, the conversion rounds once. Signed zeros
    differ: an integer sum of 0 gives +0.0 where the composition may give -0.0.

    Surrogate (the gradient of the fake-quant composition, a clipped
    straight-through estimator on each operand): for tangents :math:`t_x, t_w`,

    .. math::

       \dot y = (m_x \odot t_x)\, \hat w + \hat x\, (m_w \odot t_w),

    with :math:`\hat x = q_x s_x` and :math:`\hat w = q_w s_w` the dequantised
    operands (``fake_quant``'s outputs, in ``x``'s dtype) and :math:`m` fake_quant's
    clip mask, :math:`\mathbb{1}[q_{\min} \le \operatorname{round}(\cdot\, s^{-1})
    \le q_{\max}]`. It is linear in the tangents, so ``jax.grad`` is its transpose:
    :math:`\bar x = m_x \odot (\bar y\, \hat w^\top)`, :math:`\bar w = m_w \odot
    (\hat x^\top \bar y)`. The scales are calibration constants and get no gradient
    (as in :func:`stejax.fake_quant`); compute them with
    :func:`stejax.absmax_scale` (``axis=1`` for the weights' columns).

    Special values: :math:`\pm\infty` saturate to the end codes (mask 0); NaN in a
    row of ``x`` or a column of ``w`` makes that row's or column's outputs NaN
    (an integer code cannot hold it). A NaN scale gives NaN outputs.

    Invalid scales: a zero or negative scale raises ValueError when its value is
    concrete; under ``jit`` or ``vmap`` it is not checked (see
    :func:`stejax.fake_quant`).

    Args:
      x: floating-point array of shape ``(..., K)`` (float16, bfloat16, float32,
        float64 under x64).
      w: array of shape ``(K, N)`` in ``x``'s dtype.
      x_scale: the input's step, a scalar in ``x``'s dtype (or a Python float).
      w_scale: the weights' step, shape ``(N,)`` (one per output column) or ``()``.
      bits: the bit width of both operands' signed grid, an int in [2, 8] (the
        codes are int8). Wider grids: use :func:`stejax.fake_quant`.

    Returns:
      An array of shape ``(..., N)`` in ``x``'s dtype.

    Raises:
      TypeError: ``bits`` not an int; arrays of mixed or non-floating dtypes.
      ValueError: ``bits`` outside [2, 8]; ``x`` of rank 0 or ``w`` not of
        rank 2; ``x.shape[-1] != w.shape[0]``; a scale of the wrong shape; ``K``
        so large that the int32 sum could overflow; a concrete scale <= 0.

    Example:
      >>> import jax, jax.numpy as jnp, stejax
      >>> x = jnp.array([[0.5, -1.0, 0.26]])
      >>> w = jnp.array([[1.0, 0.5], [0.25, -2.0], [4.0, 1.0]])
      >>> stejax.quantized_matmul(x, w, 0.125, jnp.array([0.25, 0.125]), bits=8).tolist()
      [[1.25, 2.5]]
      >>> jax.grad(lambda x: stejax.quantized_matmul(x, w, 0.125, jnp.array([0.25, 0.125])).sum())(x).tolist()
      [[1.5, -1.75, 5.0]]

    Reference:
      B. Jacob et al., "Quantization and Training of Neural Networks for Efficient
      Integer-Arithmetic-Only Inference", CVPR 2018.
    """
    name = "quantized_matmul"
    if isinstance(bits, (int, np.integer)) and not isinstance(bits, bool) and bits > MAX_PRODUCT_BITS:
        raise ValueError(
            f"{name}: bits must be an int in [2, {MAX_PRODUCT_BITS}] (the codes are int8); got {bits}. "
            "For wider grids use stejax.fake_quant on each operand and a float product."
        )
    bits = check_bits(name, bits, signed=True)
    x_shape, w_shape = np.shape(x), np.shape(w)
    if len(x_shape) < 1:
        raise ValueError(f"{name}: x must have shape (..., K), rank >= 1; got shape {x_shape}.")
    if len(w_shape) != 2:
        raise ValueError(f"{name}: w must have shape (K, N), rank 2; got shape {w_shape}.")
    if x_shape[-1] != w_shape[0]:
        raise ValueError(
            f"{name}: x's last axis and w's first must match (x of shape (..., K), w of shape (K, N)); "
            f"got x of shape {x_shape} and w of shape {w_shape}."
        )
    if np.shape(x_scale) != ():
        raise ValueError(f"{name}: x_scale must be a scalar (one scale per tensor); got shape {np.shape(x_scale)}.")
    if np.shape(w_scale) not in ((), (w_shape[1],)):
        raise ValueError(
            f"{name}: w_scale must have shape ({w_shape[1]},) (one per output column of w of shape {w_shape}) "
            f"or (); got shape {np.shape(w_scale)}."
        )
    qmin, _ = integer_range(bits, signed=True)
    if w_shape[0] * qmin * qmin > _INT32_MAX:
        raise ValueError(
            f"{name}: K = {w_shape[0]} terms of up to {qmin * qmin} each could overflow the int32 sum; "
            f"K must be at most {_INT32_MAX // (qmin * qmin)} at {bits} bits."
        )
    check_positive(name, "x_scale", x_scale)
    check_positive(name, "w_scale", w_scale)
    return _quantized_matmul(x, w, x_scale, w_scale, bits=bits)
