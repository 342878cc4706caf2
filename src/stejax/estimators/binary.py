r"""Binarisation and ternarisation with surrogate gradients.

Members: ``sign_ste`` (the BNN hardtanh STE), ``approx_sign`` (Bi-Real Net),
``swish_sign`` (BNN+), ``magnitude_aware_sign`` (Bi-Real Net / larq) and
``ternary`` (ternary weight networks).

Conventions shared by the family:

* :math:`\operatorname{sign}(x) = +1` for :math:`x \ge 0` (both zeros), :math:`-1`
  for :math:`x < 0` (negative subnormals included) and NaN for NaN. The forward
  comparisons read the bit pattern, so they stay exact where XLA:CPU treats
  subnormal inputs as zero (under jit).
* Surrogate derivatives are evaluated in float32 (float64 for float64 inputs) and
  rounded once to the input dtype. Hyperparameters (``clip``, ``beta``) are rounded
  to that compute dtype. Derivative values that fall below the smallest normal
  number of the compute dtype are returned as 0, as XLA:CPU does under jit, so
  eager and jitted gradients agree bit for bit.
* The derivative at a NaN input is NaN: a NaN is never silenced into a zero
  gradient.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.typing import ArrayLike

from stejax.estimators._core import surrogate
from stejax.estimators._entry import Entry, ParamSpec

__all__ = ["ENTRIES", "approx_sign", "magnitude_aware_sign", "sign_ste", "swish_sign", "ternary"]

# TWN's rule of thumb for the threshold: Delta = 0.7 * E|w| (Li et al. 2016).
_TWN_FACTOR = 0.7


# ----------------------------------------------------------------------------- helpers


def _compute_dtype(x: jax.Array) -> Any:
    return jnp.float64 if x.dtype == jnp.float64 else jnp.float32


def _ordered_key(v: jax.Array) -> jax.Array:
    """Signed integers ordered as the floats in ``v`` are (with -0.0 just below +0.0).

    Read from the bits, so no comparison goes through the FPU: XLA:CPU flushes
    subnormal inputs to zero under jit, which would give sign(-tiny) = +1 there.
    Keys of NaN are meaningless; callers mask NaN first.
    """
    int_dtype = {2: jnp.int16, 4: jnp.int32, 8: jnp.int64}[v.dtype.itemsize]
    i = lax.bitcast_convert_type(v, int_dtype)
    # Negative floats have their magnitude bits reversed so that they order below.
    return i ^ ((i >> (8 * v.dtype.itemsize - 1)) & jnp.iinfo(int_dtype).max)


def _sign(x: jax.Array) -> jax.Array:
    """+1 for x >= 0 (both zeros), -1 for x < 0, NaN for NaN; exact for subnormals."""
    one = jnp.ones_like(x)
    # The key of -0.0 is -1; every negative number lies strictly below it.
    y = jnp.where(_ordered_key(x) < -1, -one, one)
    return jnp.where(jnp.isnan(x), x, y)


def _flush_subnormal(v: jax.Array) -> jax.Array:
    """``v`` with values below the smallest normal number set to +0.

    XLA:CPU flushes them under jit but not op by op; flushing always keeps eager
    and jitted results identical. NaN is kept.
    """
    return jnp.where(jnp.abs(v) < jnp.finfo(v.dtype).tiny, jnp.zeros_like(v), v)


def _keep_nan(x: jax.Array, d: jax.Array) -> jax.Array:
    return jnp.where(jnp.isnan(x), x, d)


def _clip_indicator(x: jax.Array, clip: float) -> jax.Array:
    """1 where |x| <= clip (compared in the compute dtype), else 0; NaN at NaN; in x's dtype."""
    inside = jnp.abs(x.astype(_compute_dtype(x))) <= clip
    return _keep_nan(x, jnp.where(inside, jnp.ones_like(x), jnp.zeros_like(x)))


def _real(estimator: str, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{estimator}: `{name}` must be a real number (a static Python float); "
            f"got {value!r} of type {type(value).__name__}."
        )
    return float(value)


def _positive(estimator: str, name: str, value: Any) -> float:
    value = _real(estimator, name, value)
    if not value > 0:
        raise ValueError(f"{estimator}: `{name}` must be a number > 0; got {value!r}.")
    return value


def _bounded(estimator: str, name: str, value: Any) -> float:
    """A finite value in [1e-18, 1e18], where the constants derived from it stay normal float32."""
    value = _real(estimator, name, value)
    if not 1e-18 <= value <= 1e18:
        raise ValueError(f"{estimator}: `{name}` must be a finite number in [1e-18, 1e18]; got {value!r}.")
    return value


def _nonnegative(estimator: str, name: str, value: Any) -> float:
    value = _real(estimator, name, value)
    if not value >= 0:
        raise ValueError(f"{estimator}: `{name}` must be a number >= 0; got {value!r}.")
    # -0.0 becomes +0.0: the exact (bit-pattern) comparisons x > t and x < -t
    # order -0.0 below +0.0, and both zeros must fall in the band.
    return value + 0.0


# ----------------------------------------------------------------------------- sign_ste


def _sign_forward(x, clip=1.0):
    del clip  # only the surrogate depends on it
    return _sign(x)


def _sign_ste_derivative(x, clip=1.0):
    return _clip_indicator(x, clip)


_sign_ste = surrogate(_sign_forward, _sign_ste_derivative, name="sign_ste")


def sign_ste(x: ArrayLike, *, clip: float = 1.0) -> jax.Array:
    r"""Binarise to :math:`\pm 1` with the clipped straight-through estimator of BNNs.

    Forward: :math:`y = \operatorname{sign}(x)`, with :math:`+1` for
    :math:`x \ge 0` (so ``sign(+0.0) = sign(-0.0) = +1``) and :math:`-1` for
    :math:`x < 0`, subnormals included; :math:`\pm\infty \mapsto \pm 1`, NaN stays
    NaN.

    Surrogate: the derivative of :math:`\operatorname{hardtanh}(x / c) \cdot c`,

    .. math:: \partial y / \partial x = \mathbb{1}[|x| \le c],

    with :math:`c` = ``clip``. At :math:`|x| = c` it is 1 (the band is closed);
    at NaN it is NaN.

    Args:
      x: floating-point array (float16, bfloat16, float32 or float64).
      clip: the half-width :math:`c > 0` of the band that passes gradients
        (default 1.0; ``inf`` passes every gradient). Rounded to float32
        (float64 for float64 inputs) for the comparison.

    Returns:
      An array of ``x``'s shape and dtype; the surrogate gradient has the same dtype.

    Raises:
      TypeError: ``x`` is not floating point, or ``clip`` is not a real number.
      ValueError: ``clip`` is not > 0.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from stejax.estimators.binary import sign_ste
      >>> sign_ste(jnp.array([-0.5, -0.0, 2.0]))
      Array([-1.,  1.,  1.], dtype=float32)
      >>> jax.grad(lambda x: sign_ste(x).sum())(jnp.array([-0.5, 1.0, 2.0]))
      Array([1., 1., 0.], dtype=float32)

    Reference:
      I. Hubara, M. Courbariaux, D. Soudry, R. El-Yaniv, Y. Bengio, "Binarized
      Neural Networks", NeurIPS 2016.
    """
    return _sign_ste(x, clip=_positive("sign_ste", "clip", clip))


# ----------------------------------------------------------------------------- approx_sign


def _approx_sign_forward(x):
    return _sign(x)


def _approx_sign_derivative(x):
    ax = jnp.abs(x.astype(_compute_dtype(x)))
    # 2 * ax is exact, so the result does not depend on whether the compiler
    # fuses the multiply and the subtraction.
    d = jnp.where(ax < 1, 2 - 2 * ax, jnp.zeros_like(ax))
    return _keep_nan(x, d.astype(x.dtype))


_approx_sign = surrogate(_approx_sign_forward, _approx_sign_derivative, name="approx_sign")


def approx_sign(x: ArrayLike) -> jax.Array:
    r"""Binarise to :math:`\pm 1` with Bi-Real Net's piecewise-quadratic ApproxSign gradient.

    Forward: :math:`y = \operatorname{sign}(x)` exactly as :func:`sign_ste`
    (:math:`+1` for :math:`x \ge 0`, :math:`-1` for :math:`x < 0`, NaN stays NaN).

    Surrogate: the derivative of the piecewise quadratic
    :math:`2x + x^2 \operatorname{sign}(-x)` on :math:`[-1, 1]`,

    .. math:: \partial y / \partial x = (2 - 2|x|)\, \mathbb{1}[|x| < 1],

    a triangle of height 2 at 0 that reaches 0 at :math:`|x| = 1` (continuous
    there, kinked at 0 and :math:`\pm 1`); it integrates to 2, the jump of the
    forward. NaN at NaN.

    Args:
      x: floating-point array.

    Returns:
      An array of ``x``'s shape and dtype.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from stejax.estimators.binary import approx_sign
      >>> jax.grad(lambda x: approx_sign(x).sum())(jnp.array([0.0, 0.25, -0.5, 1.0]))
      Array([2. , 1.5, 1. , 0. ], dtype=float32)

    Reference:
      Z. Liu, B. Wu, W. Luo, X. Yang, W. Liu, K.-T. Cheng, "Bi-Real Net: Enhancing
      the Performance of 1-bit CNNs with Improved Representational Capability and
      Advanced Training Algorithm", ECCV 2018.
    """
    return _approx_sign(x)


# ----------------------------------------------------------------------------- swish_sign

# Clamping |beta x| keeps inf * 0 out of the formula. At the clamp exp(-|beta x|) is
# exactly 0 in the compute dtype (float32: e^-200, float64: e^-800), so the
# derivative there, and beyond, is 0.
_SWISH_CLAMP = {jnp.dtype(jnp.float32): 200.0, jnp.dtype(jnp.float64): 800.0}


def _swish_sign_forward(x, beta=5.0):
    del beta  # only the surrogate depends on it
    return _sign(x)


def _swish_sign_derivative(x, beta=5.0):
    # beta (2 - z tanh(z/2)) / (1 + cosh z) with z = beta x, rewritten with
    # e = exp(-|z|) so that nothing overflows: 1 + cosh z = (1 + e)^2 / (2e) and
    # z tanh(z/2) = |z| (1 - e) / (1 + e), hence
    #     d = 2 beta e (2 (1 + e) - |z| (1 - e)) / (1 + e)^3.
    cdt = jnp.dtype(_compute_dtype(x))
    a = jnp.minimum(jnp.abs(beta * x.astype(cdt)), _SWISH_CLAMP[cdt])
    e = _flush_subnormal(jnp.exp(-a))
    p = 1 + e
    # max(., 0) is the identity here (the product is >= 0 and NaN passes), but it
    # keeps XLA:CPU from fusing the product into the subtraction (an FMA) under
    # jit only, which would make jitted and eager gradients differ in the last bit.
    num = 2 * p - jnp.maximum(a * (1 - e), 0)
    d = _flush_subnormal((2 * beta) * e * num / (p * p * p))
    return d.astype(x.dtype)


_swish_sign = surrogate(_swish_sign_forward, _swish_sign_derivative, name="swish_sign")


def swish_sign(x: ArrayLike, *, beta: float = 5.0) -> jax.Array:
    r"""Binarise to :math:`\pm 1` with the SwishSign gradient of BNN+.

    Forward: :math:`y = \operatorname{sign}(x)` exactly as :func:`sign_ste`
    (:math:`+1` for :math:`x \ge 0`, :math:`-1` for :math:`x < 0`, NaN stays NaN).

    Surrogate: the derivative of
    :math:`SS_\beta(x) = 2\sigma(\beta x)\,[1 + \beta x (1 - \sigma(\beta x))] - 1`,

    .. math::
        \partial y / \partial x
        = \frac{\beta\,\bigl(2 - \beta x \tanh(\beta x / 2)\bigr)}{1 + \cosh(\beta x)},

    smooth, :math:`\beta` at 0, negative for :math:`|\beta x| > 2.4` (SwishSign
    overshoots :math:`\pm 1`) and tending to 0; it integrates to 2. It is evaluated
    in the overflow-free form
    :math:`2\beta e\,(2(1+e) - |\beta x|(1-e)) / (1+e)^3` with
    :math:`e = e^{-|\beta x|}`, so huge inputs (up to the dtype's largest value and
    :math:`\pm\infty`) give 0, not NaN. NaN at NaN.

    Args:
      x: floating-point array.
      beta: the sharpness :math:`\beta`, in [1e-18, 1e18] (default 5.0; the peak of
        the derivative).

    Returns:
      An array of ``x``'s shape and dtype.

    Raises:
      TypeError: ``beta`` is not a real number.
      ValueError: ``beta`` is out of range.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from stejax.estimators.binary import swish_sign
      >>> g = jax.grad(lambda x: swish_sign(x).sum())(jnp.array([0.0, 1e30]))
      >>> [round(float(v), 4) for v in g]
      [5.0, 0.0]

    Reference:
      S. Darabi, M. Belbahri, M. Courbariaux, V. P. Nia, "BNN+: Improved Binary
      Network Training", arXiv:1812.11800, 2018.
    """
    return _swish_sign(x, beta=_bounded("swish_sign", "beta", beta))


# ----------------------------------------------------------------------------- magnitude_aware_sign


def _mean_abs(x: jax.Array, axes: tuple[int, ...] | None, *, keepdims: bool) -> tuple[jax.Array, float]:
    """sum |x| over ``axes`` (all when None) in the compute dtype, and 1/n: the mean is their product.

    XLA rewrites a division by the constant n into this product anyway; writing it
    so makes eager and jitted values the same. Subnormal terms and results are
    flushed to zero (as XLA:CPU does under jit).
    """
    cdt = _compute_dtype(x)
    ax = _flush_subnormal(jnp.abs(x).astype(cdt))
    n = math.prod(x.shape) if axes is None else math.prod(x.shape[i] for i in axes)
    total = jnp.sum(ax, axis=axes, keepdims=keepdims)
    return total, 1.0 / max(n, 1)


def _channel_scale(x: jax.Array, axis: int) -> jax.Array:
    """mean |x| over every axis except ``axis`` (the whole tensor for rank <= 1), in x's dtype."""
    axes = None if x.ndim <= 1 else tuple(i for i in range(x.ndim) if i != axis % x.ndim)
    total, inv_n = _mean_abs(x, axes, keepdims=True)
    return _flush_subnormal(total * inv_n).astype(x.dtype)


def _magnitude_aware_sign_forward(x, axis=-1):
    return _channel_scale(x, axis) * _sign(x)


def _magnitude_aware_sign_derivative(x, axis=-1):
    scale = _channel_scale(x, axis)
    d = jnp.where(jnp.abs(x) <= 1, jnp.broadcast_to(scale, x.shape), jnp.zeros_like(x))
    return _keep_nan(x, d)


_magnitude_aware_sign = surrogate(
    _magnitude_aware_sign_forward, _magnitude_aware_sign_derivative, name="magnitude_aware_sign"
)


def magnitude_aware_sign(x: ArrayLike, *, axis: int = -1) -> jax.Array:
    r"""Binarise weights to :math:`\pm` their per-output-channel mean magnitude.

    Forward: :math:`y = s \cdot \operatorname{sign}(x)` with
    :math:`s = \operatorname{mean}|x|` taken over every axis except ``axis``, the
    output-channel axis (the last one by default, as in Flax and Keras kernels
    ``(..., in, out)``; larq reduces the same axes). For inputs of rank 0 or 1 the
    mean is over the whole tensor and ``axis`` is ignored. ``sign`` is that of
    :func:`sign_ste` (:math:`+1` at :math:`\pm 0`). The mean is computed in float32
    (float64 for float64 inputs) as :math:`\sum|x| \cdot (1/n)` with subnormal terms
    and results flushed to zero, then rounded to ``x``'s dtype; :math:`y` is that
    scale times :math:`\pm 1`, exactly. A NaN (or infinity) in a channel makes that
    channel's scale NaN (infinite); so can an overflowing float32 sum, for float32
    or bfloat16 weights near the dtype's largest value (the scale is then inf).

    Surrogate: the scale is a constant for differentiation (``stop_gradient``, as
    in larq) and the sign has the clipped STE,

    .. math:: \partial y / \partial x = s \cdot \mathbb{1}[|x| \le 1].

    The band is closed at :math:`|x| = 1`; NaN at a NaN input.

    Args:
      x: floating-point array of any rank.
      axis: the output-channel axis, kept when averaging (default -1). For rank
        >= 2 it must lie in ``[-rank, rank)``.

    Returns:
      An array of ``x``'s shape and dtype.

    Raises:
      TypeError: ``axis`` is not an integer.
      ValueError: ``axis`` is out of range for ``x``.

    Example:
      >>> import jax.numpy as jnp
      >>> from stejax.estimators.binary import magnitude_aware_sign
      >>> magnitude_aware_sign(jnp.array([[1.0, -4.0], [-3.0, 2.0]]))
      Array([[ 2., -3.],
             [-2.,  3.]], dtype=float32)

    Reference:
      Z. Liu et al., "Bi-Real Net", ECCV 2018; larq's ``MagnitudeAwareSign``
      (L. Geiger, P. Team, "Larq: An Open-Source Library for Training Binarized
      Neural Networks", JOSS 2020).
    """
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
        raise TypeError(f"magnitude_aware_sign: `axis` must be an int; got {axis!r} of type {type(axis).__name__}.")
    rank = jnp.ndim(x)
    if rank >= 2 and not -rank <= axis < rank:
        raise ValueError(
            f"magnitude_aware_sign: `axis` must lie in [{-rank}, {rank}) for an input of rank {rank}; got {axis}."
        )
    return _magnitude_aware_sign(x, axis=int(axis))


# ----------------------------------------------------------------------------- ternary


def _ternary_forward(x, threshold=None, clip=1.0):
    del clip  # only the surrogate depends on it
    cdt = _compute_dtype(x)
    xc = x.astype(cdt)
    if threshold is None:
        total, inv_n = _mean_abs(x, None, keepdims=False)
        # One product by the constant 0.7 / n: no chain of constants for XLA to reassociate.
        t = _flush_subnormal(total * (_TWN_FACTOR * inv_n))
    else:
        t = jnp.asarray(threshold, cdt)
    key = _ordered_key(xc)
    one = jnp.ones_like(x)
    y = jnp.where(key > _ordered_key(t), one, jnp.where(key < _ordered_key(-t), -one, jnp.zeros_like(x)))
    # A NaN input, or a NaN threshold (a NaN anywhere in x), gives NaN.
    return jnp.where(jnp.isnan(xc) | jnp.isnan(t), jnp.full_like(x, jnp.nan), y)


def _ternary_derivative(x, threshold=None, clip=1.0):
    del threshold  # the threshold is a constant for differentiation
    return _clip_indicator(x, clip)


_ternary = surrogate(_ternary_forward, _ternary_derivative, name="ternary")


def ternary(x: ArrayLike, *, threshold: float | None = None, clip: float = 1.0) -> jax.Array:
    r"""Ternarise to :math:`\{-1, 0, +1\}` with a clipped straight-through gradient.

    Forward:

    .. math::
        y = \begin{cases} +1 & x > \Delta \\ -1 & x < -\Delta \\ 0 & |x| \le \Delta \end{cases}

    A value exactly at :math:`\pm\Delta` maps to 0, and the zero code is always
    ``+0.0`` (also for negative :math:`x` in the dead band, and for ``-0.0``): a
    ternary code carries no sign in its zero. With ``threshold=None``,
    :math:`\Delta = 0.7 \cdot \operatorname{mean}|x|` over the whole tensor (TWN's
    per-layer rule), computed from the data in float32 (float64 for float64
    inputs) as :math:`\sum|x| \cdot (0.7/n)` with subnormals flushed to zero; it is
    a constant for differentiation. A given ``threshold`` is rounded to that
    compute dtype. The comparisons are exact (subnormals included). NaN in
    ``x`` gives NaN there; with the data-dependent threshold a NaN anywhere makes
    :math:`\Delta` NaN and so the whole output NaN. An infinity makes
    :math:`\Delta` infinite, so that every element maps to 0. TWN's scaling factor
    :math:`\alpha` is not applied; multiply by it if wanted.

    Surrogate: the clipped identity,

    .. math:: \partial y / \partial x = \mathbb{1}[|x| \le c],

    with :math:`c` = ``clip``, closed at :math:`|x| = c`; NaN at NaN.

    Args:
      x: floating-point array.
      threshold: the static dead-band half-width :math:`\Delta \ge 0`, or ``None``
        (default) for :math:`0.7 \cdot \operatorname{mean}|x|`.
      clip: the half-width :math:`c > 0` of the band that passes gradients (default 1.0).

    Returns:
      An array of ``x``'s shape and dtype.

    Raises:
      TypeError: ``threshold`` or ``clip`` is not a real number.
      ValueError: ``threshold`` < 0 or ``clip`` <= 0.

    Example:
      >>> import jax.numpy as jnp
      >>> from stejax.estimators.binary import ternary
      >>> ternary(jnp.array([-2.0, -0.1, 0.0, 0.5, 3.0]))
      Array([-1.,  0.,  0.,  0.,  1.], dtype=float32)
      >>> ternary(jnp.array([-2.0, -0.1, 0.5]), threshold=0.25)
      Array([-1.,  0.,  1.], dtype=float32)

    Reference:
      F. Li, B. Zhang, B. Liu, "Ternary Weight Networks", arXiv:1605.04711, 2016.
    """
    if threshold is not None:
        threshold = _nonnegative("ternary", "threshold", threshold)
    return _ternary(x, threshold=threshold, clip=_positive("ternary", "clip", clip))


# ----------------------------------------------------------------------------- catalog


def _clip_points(clip=1.0, **_) -> tuple[float, ...]:
    return (-clip, 0.0, clip)


def _unit_points(**_) -> tuple[float, ...]:
    return (-1.0, 0.0, 1.0)


def _zero(**_) -> tuple[float, ...]:
    return (0.0,)


def _ternary_points(threshold=None, clip=1.0) -> tuple[float, ...]:
    # With the data-dependent threshold the ties +-Delta depend on the input, so
    # only the gradient's clip points (and 0) are listed.
    points = {-clip, 0.0, clip}
    if threshold is not None:
        points |= {-threshold, threshold}
    return tuple(sorted(points))


_CLIP = ParamSpec("clip", 1.0, (1.0, 0.5, 2.0), "Half-width of the band that passes gradients; > 0.")
_SIGN_MATH = r"y = \operatorname{sign}(x),\ \operatorname{sign}(\pm 0) = +1"
_SIGN_KINKS = "The forward jumps at 0, where sign(+-0) = +1."

ENTRIES = (
    Entry(
        name="sign_ste",
        family="binary",
        fn=sign_ste,
        forward=_sign_forward,
        derivative=_sign_ste_derivative,
        tangent=None,
        diff_argnums=(0,),
        boundaries=_clip_points,
        params=(_CLIP,),
        forward_math=_SIGN_MATH,
        derivative_math=r"\partial y/\partial x = \mathbb{1}[|x| \le c]",
        kinks=_SIGN_KINKS + " The derivative is 1 on the closed band |x| <= clip, 0 outside.",
        reference="Hubara, Courbariaux, Soudry, El-Yaniv, Bengio, NeurIPS 2016",
    ),
    Entry(
        name="approx_sign",
        family="binary",
        fn=approx_sign,
        forward=_approx_sign_forward,
        derivative=_approx_sign_derivative,
        tangent=None,
        diff_argnums=(0,),
        boundaries=_unit_points,
        forward_math=_SIGN_MATH,
        derivative_math=r"\partial y/\partial x = (2 - 2|x|)\,\mathbb{1}[|x| < 1]",
        kinks=_SIGN_KINKS + " The derivative peaks at 2 at x = 0 and is 0 for |x| >= 1 (continuous).",
        reference="Liu et al., Bi-Real Net, ECCV 2018",
    ),
    Entry(
        name="swish_sign",
        family="binary",
        fn=swish_sign,
        forward=_swish_sign_forward,
        derivative=_swish_sign_derivative,
        tangent=None,
        diff_argnums=(0,),
        boundaries=_zero,
        params=(ParamSpec("beta", 5.0, (5.0, 1.0, 10.0), "Sharpness; in [1e-18, 1e18]."),),
        forward_math=_SIGN_MATH,
        derivative_math=(r"\partial y/\partial x = \beta (2 - \beta x \tanh(\beta x/2)) / (1 + \cosh(\beta x))"),
        kinks=_SIGN_KINKS + " The derivative is smooth, beta at 0, and 0 at +-inf.",
        reference="Darabi, Belbahri, Courbariaux, Nia, BNN+, arXiv:1812.11800 (2018)",
    ),
    Entry(
        name="magnitude_aware_sign",
        family="binary",
        fn=magnitude_aware_sign,
        forward=_magnitude_aware_sign_forward,
        derivative=_magnitude_aware_sign_derivative,
        tangent=None,
        diff_argnums=(0,),
        boundaries=_unit_points,
        params=(ParamSpec("axis", -1, (-1, 0), "The output-channel axis kept by the mean."),),
        forward_math=(
            r"y = s \operatorname{sign}(x),\ s = \operatorname{mean}_{\neg\text{axis}} |x|"
            r"\ \text{(whole tensor for rank} \le 1)"
        ),
        derivative_math=r"\partial y/\partial x = s\, \mathbb{1}[|x| \le 1],\ s\ \text{constant}",
        kinks=_SIGN_KINKS + " The derivative is s on the closed band |x| <= 1, 0 outside.",
        reference="Liu et al., Bi-Real Net, ECCV 2018; larq MagnitudeAwareSign (Geiger & Team, JOSS 2020)",
    ),
    Entry(
        name="ternary",
        family="binary",
        fn=ternary,
        forward=_ternary_forward,
        derivative=_ternary_derivative,
        tangent=None,
        diff_argnums=(0,),
        boundaries=_ternary_points,
        params=(
            ParamSpec(
                "threshold",
                None,
                (None, 0.0, 0.5),
                "Dead-band half-width >= 0; None for 0.7 * mean|x| of the input.",
            ),
            _CLIP,
        ),
        forward_math=r"y = \mathbb{1}[x > \Delta] - \mathbb{1}[x < -\Delta],\ \Delta = 0.7\,\overline{|x|}",
        derivative_math=r"\partial y/\partial x = \mathbb{1}[|x| \le c]",
        kinks=(
            "The forward jumps at +-Delta, which map to +0.0 (the zero code is always +0.0). "
            "The derivative is 1 on the closed band |x| <= clip."
        ),
        reference="Li, Zhang, Liu, Ternary Weight Networks, arXiv:1605.04711 (2016)",
    ),
)
