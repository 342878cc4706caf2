r"""The spiking nonlinearity (a Heaviside step) with the surrogate gradients of SNN training.

Forward, shared by every member: :math:`H(x) = 1` for :math:`x > 0` and 0 otherwise,
so :math:`H(+0) = H(-0) = 0`, :math:`H(+\infty) = 1`, :math:`H(-\infty) = 0`, NaN
stays NaN; the output has ``x``'s dtype. The comparison reads the bit pattern, so
it stays exact for subnormal inputs where XLA:CPU treats them as zero (under jit).

Surrogates, one catalog entry each (``heaviside_<name>``), also reachable through
``heaviside(x, surrogate=<name>, **params)``:

==============  =====================================================  ==========  ============
name            :math:`\partial H / \partial x`                        default     integral
==============  =====================================================  ==========  ============
fast_sigmoid    :math:`1 / (k|x| + 1)^2`                               k = 25      2/k
atan            :math:`(\alpha/2) / (1 + (\pi \alpha x / 2)^2)`        alpha = 2   1
sigmoid         :math:`k\,s(1 - s)`, :math:`s = \sigma(k x)`           k = 25      1
triangular      :math:`\max(0, 1 - |x|/w) / w`                         w = 1       1
boxcar          :math:`\mathbb{1}[|x| \le w] / (2w)`                   w = 0.5     1
superspike      :math:`1 / (\beta|x| + 1)^2`                           beta = 100  2/beta
==============  =====================================================  ==========  ============

Numerics: derivatives are evaluated in float32 (float64 for float64 inputs) and
rounded once to ``x``'s dtype; values below the smallest normal number of the
compute dtype are returned as 0 (as XLA:CPU does under jit), and the formulas are
written so that jit cannot fuse a multiply into an add, so eager and jitted
gradients agree bit for bit. Huge inputs, up to the dtype's largest value and
:math:`\pm\infty`, give 0, never NaN or inf. The derivative at NaN is NaN.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.typing import ArrayLike

from stejax.estimators._core import surrogate
from stejax.estimators._entry import Entry, ParamSpec

__all__ = [
    "ENTRIES",
    "heaviside",
    "heaviside_atan",
    "heaviside_boxcar",
    "heaviside_fast_sigmoid",
    "heaviside_sigmoid",
    "heaviside_superspike",
    "heaviside_triangular",
]

# Parameters are kept where every constant derived from them (1/k, 1/w^2, ...) is a
# normal float32.
_PARAM_MIN, _PARAM_MAX = 1e-18, 1e18


# ----------------------------------------------------------------------------- helpers


def _compute_dtype(x: jax.Array) -> Any:
    return jnp.float64 if x.dtype == jnp.float64 else jnp.float32


def _flush_subnormal(v: jax.Array) -> jax.Array:
    """``v`` with values below the smallest normal number set to +0 (NaN kept).

    XLA:CPU flushes them under jit but not op by op; flushing always keeps eager
    and jitted results identical.
    """
    return jnp.where(jnp.abs(v) < jnp.finfo(v.dtype).tiny, jnp.zeros_like(v), v)


def _keep_nan(x: jax.Array, d: jax.Array) -> jax.Array:
    return jnp.where(jnp.isnan(x), x, d)


def _parameter(estimator: str, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{estimator}: `{name}` must be a real number (a static Python float); "
            f"got {value!r} of type {type(value).__name__}."
        )
    value = float(value)
    if not _PARAM_MIN <= value <= _PARAM_MAX:
        raise ValueError(
            f"{estimator}: `{name}` must be a finite number in [{_PARAM_MIN:g}, {_PARAM_MAX:g}]; got {value!r}."
        )
    return value


# ----------------------------------------------------------------------------- forward


def _heaviside_forward(x, **_):
    """1 where x > 0, 0 elsewhere (both zeros), NaN for NaN, in x's dtype."""
    int_dtype = {2: jnp.int16, 4: jnp.int32, 8: jnp.int64}[x.dtype.itemsize]
    # Read from the bits: positive floats, and only they, have a positive signed
    # integer pattern. XLA:CPU under jit would call the smallest subnormals zero.
    positive = lax.bitcast_convert_type(x, int_dtype) > 0
    y = jnp.where(positive, jnp.ones_like(x), jnp.zeros_like(x))
    return jnp.where(jnp.isnan(x), x, y)


# ----------------------------------------------------------------------------- derivatives


def _inverse_square_derivative(x, k):
    """1 / (k|x| + 1)^2, computed as (r / (r + |x|))^2 with r = 1/k.

    The form has no product feeding a sum, which jit would fuse into an FMA, and
    it is exactly 1 at x = 0.
    """
    r = 1.0 / k
    q = r / (r + jnp.abs(x.astype(_compute_dtype(x))))
    return _flush_subnormal(q * q).astype(x.dtype)


def _fast_sigmoid_derivative(x, slope=25.0):
    return _inverse_square_derivative(x, slope)


def _superspike_derivative(x, beta=100.0):
    return _inverse_square_derivative(x, beta)


def _atan_derivative(x, alpha=2.0):
    z = (math.pi * alpha / 2) * x.astype(_compute_dtype(x))
    # max(z^2, 0) is z^2 (NaN passes), but it keeps jit from fusing z*z + 1 into
    # an FMA, which op-by-op evaluation does not do.
    d = (alpha / 2) / (1 + jnp.maximum(z * z, 0))
    return _flush_subnormal(d).astype(x.dtype)


def _sigmoid_derivative(x, slope=25.0):
    # slope * sigmoid(k x) (1 - sigmoid(k x)) = slope * e / (1 + e)^2 with
    # e = exp(-|slope x|) <= 1: no overflow, and no cancellation in 1 - s.
    e = _flush_subnormal(jnp.exp(-jnp.abs(slope * x.astype(_compute_dtype(x)))))
    p = 1 + e
    return _flush_subnormal(slope * e / (p * p)).astype(x.dtype)


def _triangular_derivative(x, width=1.0):
    # max(0, 1 - |x|/w) / w = max(0, w - |x|) / w^2: one subtraction, then one product.
    ax = jnp.abs(x.astype(_compute_dtype(x)))
    d = jnp.maximum(width - ax, 0) * (1.0 / (width * width))
    return _flush_subnormal(d).astype(x.dtype)


def _boxcar_derivative(x, width=0.5):
    inside = jnp.abs(x.astype(_compute_dtype(x))) <= width
    height = jnp.full_like(x, 1.0 / (2.0 * width))
    return _keep_nan(x, jnp.where(inside, height, jnp.zeros_like(x)))


_fast_sigmoid = surrogate(_heaviside_forward, _fast_sigmoid_derivative, name="heaviside_fast_sigmoid")
_atan = surrogate(_heaviside_forward, _atan_derivative, name="heaviside_atan")
_sigmoid = surrogate(_heaviside_forward, _sigmoid_derivative, name="heaviside_sigmoid")
_triangular = surrogate(_heaviside_forward, _triangular_derivative, name="heaviside_triangular")
_boxcar = surrogate(_heaviside_forward, _boxcar_derivative, name="heaviside_boxcar")
_superspike = surrogate(_heaviside_forward, _superspike_derivative, name="heaviside_superspike")

# ----------------------------------------------------------------------------- public


def heaviside_fast_sigmoid(x: ArrayLike, *, slope: float = 25.0) -> jax.Array:
    r"""Heaviside step with snnTorch's fast-sigmoid surrogate gradient.

    Forward: :math:`H(x) = \mathbb{1}[x > 0]`: 1 for :math:`x > 0`, 0 for
    :math:`x \le 0` (so ``H(+0.0) = H(-0.0) = +0.0``), :math:`H(\pm\infty) = 1, 0`,
    NaN stays NaN; subnormals are compared exactly.

    Surrogate: the derivative of the fast sigmoid :math:`x / (1 + k|x|)`,

    .. math:: \partial H / \partial x = \frac{1}{(k|x| + 1)^2},

    with :math:`k` = ``slope``: 1 at 0, kinked there, and it integrates to
    :math:`2/k` over the real line (0.08 at the default), not to 1. It is computed
    as :math:`(r / (r + |x|))^2` with :math:`r = 1/k` (exactly 1 at 0). This is
    the form of SuperSpike (Zenke & Ganguli 2018; see
    :func:`heaviside_superspike`, the same rule with another default).

    Args:
      x: floating-point array (float16, bfloat16, float32 or float64).
      slope: :math:`k`, in [1e-18, 1e18] (default 25, as snnTorch).

    Returns:
      An array of ``x``'s shape and dtype; the surrogate gradient has the same dtype.

    Raises:
      TypeError: ``slope`` is not a real number.
      ValueError: ``slope`` is out of range.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from stejax.estimators.spiking import heaviside_fast_sigmoid
      >>> heaviside_fast_sigmoid(jnp.array([-1.0, 0.0, 0.5]))
      Array([0., 0., 1.], dtype=float32)
      >>> jax.grad(lambda x: heaviside_fast_sigmoid(x).sum())(jnp.array([0.0, 0.04]))
      Array([1.  , 0.25], dtype=float32)

    Reference:
      J. K. Eshraghian et al., "Training Spiking Neural Networks Using Lessons
      From Deep Learning", Proc. IEEE 2023 (snnTorch's ``fast_sigmoid``); the form
      is from F. Zenke, S. Ganguli, "SuperSpike", Neural Computation 2018.
    """
    return _fast_sigmoid(x, slope=_parameter("heaviside_fast_sigmoid", "slope", slope))


def heaviside_superspike(x: ArrayLike, *, beta: float = 100.0) -> jax.Array:
    r"""Heaviside step with the SuperSpike surrogate gradient.

    Forward: :math:`H(x) = \mathbb{1}[x > 0]`: 1 for :math:`x > 0`, 0 for
    :math:`x \le 0` (so ``H(+0.0) = H(-0.0) = +0.0``), :math:`H(\pm\infty) = 1, 0`,
    NaN stays NaN; subnormals are compared exactly.

    Surrogate: the normalised negative part of a fast sigmoid,

    .. math:: \partial H / \partial x = \frac{1}{(\beta|x| + 1)^2},

    1 at 0, kinked there, integrating to :math:`2/\beta` (0.02 at the default).
    This is the same function as :func:`heaviside_fast_sigmoid` (snnTorch took
    its fast sigmoid from SuperSpike); the two entries differ only in name,
    default steepness and reference. The default :math:`\beta = 100` follows
    SpyTorch, F. Zenke's reference implementation (its ``scale``); snnTorch's
    fast sigmoid defaults to 25.

    Args:
      x: floating-point array.
      beta: :math:`\beta`, in [1e-18, 1e18] (default 100).

    Returns:
      An array of ``x``'s shape and dtype.

    Raises:
      TypeError: ``beta`` is not a real number.
      ValueError: ``beta`` is out of range.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from stejax.estimators.spiking import heaviside_superspike
      >>> jax.grad(lambda x: heaviside_superspike(x).sum())(jnp.array([0.0, 0.01]))
      Array([1.  , 0.25], dtype=float32)

    Reference:
      F. Zenke, S. Ganguli, "SuperSpike: Supervised Learning in Multilayer Spiking
      Neural Networks", Neural Computation 30(6), 2018.
    """
    return _superspike(x, beta=_parameter("heaviside_superspike", "beta", beta))


def heaviside_atan(x: ArrayLike, *, alpha: float = 2.0) -> jax.Array:
    r"""Heaviside step with the arctangent surrogate gradient.

    Forward: :math:`H(x) = \mathbb{1}[x > 0]`: 1 for :math:`x > 0`, 0 for
    :math:`x \le 0` (so ``H(+0.0) = H(-0.0) = +0.0``), :math:`H(\pm\infty) = 1, 0`,
    NaN stays NaN; subnormals are compared exactly.

    Surrogate: the derivative of :math:`\tfrac{1}{\pi}\arctan(\tfrac{\pi}{2}\alpha x) + \tfrac12`,

    .. math:: \partial H / \partial x = \frac{\alpha / 2}{1 + (\pi \alpha x / 2)^2},

    smooth, :math:`\alpha/2` at 0, integrating to 1. The constants
    :math:`\pi\alpha/2` and :math:`\alpha/2` are rounded once to the compute dtype.

    Args:
      x: floating-point array.
      alpha: :math:`\alpha`, in [1e-18, 1e18] (default 2, as Fang et al. and
        SpikingJelly).

    Returns:
      An array of ``x``'s shape and dtype.

    Raises:
      TypeError: ``alpha`` is not a real number.
      ValueError: ``alpha`` is out of range.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from stejax.estimators.spiking import heaviside_atan
      >>> jax.grad(lambda x: heaviside_atan(x).sum())(jnp.array([0.0, 1e30]))
      Array([1., 0.], dtype=float32)

    Reference:
      W. Fang, Z. Yu, Y. Chen, T. Masquelier, T. Huang, Y. Tian, "Incorporating
      Learnable Membrane Time Constant to Enhance Learning of Spiking Neural
      Networks", ICCV 2021.
    """
    return _atan(x, alpha=_parameter("heaviside_atan", "alpha", alpha))


def heaviside_sigmoid(x: ArrayLike, *, slope: float = 25.0) -> jax.Array:
    r"""Heaviside step with the logistic-sigmoid surrogate gradient.

    Forward: :math:`H(x) = \mathbb{1}[x > 0]`: 1 for :math:`x > 0`, 0 for
    :math:`x \le 0` (so ``H(+0.0) = H(-0.0) = +0.0``), :math:`H(\pm\infty) = 1, 0`,
    NaN stays NaN; subnormals are compared exactly.

    Surrogate: the derivative of :math:`\sigma(kx)`,

    .. math::
        \partial H / \partial x = k\, \sigma(kx)\,(1 - \sigma(kx))
        = \frac{k\, e^{-k|x|}}{(1 + e^{-k|x|})^2},

    with :math:`k` = ``slope``: smooth, :math:`k/4` at 0, integrating to 1. The
    right-hand form is the one evaluated (no overflow, no cancellation); where
    :math:`e^{-k|x|}` falls below the smallest normal number of the compute dtype
    it is taken as 0, so the derivative is 0 below about :math:`k \cdot 10^{-38}`
    (float32).

    Args:
      x: floating-point array.
      slope: :math:`k`, in [1e-18, 1e18] (default 25, as snnTorch).

    Returns:
      An array of ``x``'s shape and dtype.

    Raises:
      TypeError: ``slope`` is not a real number.
      ValueError: ``slope`` is out of range.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from stejax.estimators.spiking import heaviside_sigmoid
      >>> jax.grad(lambda x: heaviside_sigmoid(x).sum())(jnp.array([0.0, -1e30]))
      Array([6.25, 0.  ], dtype=float32)

    Reference:
      E. O. Neftci, H. Mostafa, F. Zenke, "Surrogate Gradient Learning in Spiking
      Neural Networks", IEEE Signal Processing Magazine 36(6), 2019; snnTorch's
      ``sigmoid`` (Eshraghian et al., Proc. IEEE 2023).
    """
    return _sigmoid(x, slope=_parameter("heaviside_sigmoid", "slope", slope))


def heaviside_triangular(x: ArrayLike, *, width: float = 1.0) -> jax.Array:
    r"""Heaviside step with a triangular (piecewise-linear) surrogate gradient.

    Forward: :math:`H(x) = \mathbb{1}[x > 0]`: 1 for :math:`x > 0`, 0 for
    :math:`x \le 0` (so ``H(+0.0) = H(-0.0) = +0.0``), :math:`H(\pm\infty) = 1, 0`,
    NaN stays NaN; subnormals are compared exactly.

    Surrogate: a triangle of half-width :math:`w` = ``width`` and unit area,

    .. math:: \partial H / \partial x = \frac{\max(0,\ 1 - |x|/w)}{w},

    :math:`1/w` at 0, kinked at 0 and :math:`\pm w` (where it reaches 0), and it
    integrates to 1. It is evaluated as :math:`\max(0, w - |x|) \cdot (1/w^2)`.
    Bellec et al. use the same shape scaled by a dampening factor
    :math:`\gamma = 0.3` with :math:`w = 1`; here the area is 1.

    Args:
      x: floating-point array.
      width: :math:`w`, in [1e-18, 1e18] (default 1).

    Returns:
      An array of ``x``'s shape and dtype.

    Raises:
      TypeError: ``width`` is not a real number.
      ValueError: ``width`` is out of range.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from stejax.estimators.spiking import heaviside_triangular
      >>> jax.grad(lambda x: heaviside_triangular(x).sum())(jnp.array([0.0, 0.25, -1.0, 3.0]))
      Array([1.  , 0.75, 0.  , 0.  ], dtype=float32)

    Reference:
      G. Bellec, D. Salaj, A. Subramoney, R. Legenstein, W. Maass, "Long
      short-term memory and learning-to-learn in networks of spiking neurons",
      NeurIPS 2018.
    """
    return _triangular(x, width=_parameter("heaviside_triangular", "width", width))


def heaviside_boxcar(x: ArrayLike, *, width: float = 0.5) -> jax.Array:
    r"""Heaviside step with a rectangular (boxcar) surrogate gradient.

    Forward: :math:`H(x) = \mathbb{1}[x > 0]`: 1 for :math:`x > 0`, 0 for
    :math:`x \le 0` (so ``H(+0.0) = H(-0.0) = +0.0``), :math:`H(\pm\infty) = 1, 0`,
    NaN stays NaN; subnormals are compared exactly.

    Surrogate: a box of half-width :math:`w` = ``width`` and unit area,

    .. math:: \partial H / \partial x = \frac{\mathbb{1}[|x| \le w]}{2w},

    closed at :math:`|x| = w` (the value there is :math:`1/(2w)`; Wu et al. use
    the open box), 1 at the default :math:`w = 1/2`, and it integrates to 1.
    ``width`` is rounded to the compute dtype for the comparison; NaN at NaN.

    Args:
      x: floating-point array.
      width: :math:`w`, in [1e-18, 1e18] (default 0.5).

    Returns:
      An array of ``x``'s shape and dtype.

    Raises:
      TypeError: ``width`` is not a real number.
      ValueError: ``width`` is out of range.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from stejax.estimators.spiking import heaviside_boxcar
      >>> jax.grad(lambda x: heaviside_boxcar(x).sum())(jnp.array([0.0, 0.5, -0.75]))
      Array([1., 1., 0.], dtype=float32)

    Reference:
      Y. Wu, L. Deng, G. Li, J. Zhu, L. Shi, "Spatio-Temporal Backpropagation for
      Training High-Performance Spiking Neural Networks", Frontiers in
      Neuroscience 12, 2018.
    """
    return _boxcar(x, width=_parameter("heaviside_boxcar", "width", width))


# name -> (public function, its parameters)
_SURROGATES: dict[str, tuple[Callable[..., jax.Array], tuple[str, ...]]] = {
    "fast_sigmoid": (heaviside_fast_sigmoid, ("slope",)),
    "atan": (heaviside_atan, ("alpha",)),
    "sigmoid": (heaviside_sigmoid, ("slope",)),
    "triangular": (heaviside_triangular, ("width",)),
    "boxcar": (heaviside_boxcar, ("width",)),
    "superspike": (heaviside_superspike, ("beta",)),
}


def heaviside(x: ArrayLike, surrogate: str = "fast_sigmoid", **params: float) -> jax.Array:
    r"""Heaviside step, the spiking nonlinearity, with a chosen surrogate gradient.

    Forward: :math:`H(x) = \mathbb{1}[x > 0]`: 1 for :math:`x > 0`, 0 for
    :math:`x \le 0` (so ``H(+0.0) = H(-0.0) = +0.0``), :math:`H(\pm\infty) = 1, 0`,
    NaN stays NaN, in ``x``'s dtype.

    Surrogate: the one named by ``surrogate``; ``heaviside(x, "atan", alpha=4.0)``
    is ``heaviside_atan(x, alpha=4.0)``. Each rule, its parameters, defaults and
    what it integrates to are documented on its own function:

    * ``"fast_sigmoid"`` (:func:`heaviside_fast_sigmoid`, ``slope=25``):
      :math:`1/(k|x|+1)^2`, area :math:`2/k`.
    * ``"atan"`` (:func:`heaviside_atan`, ``alpha=2``):
      :math:`(\alpha/2)/(1+(\pi\alpha x/2)^2)`, area 1.
    * ``"sigmoid"`` (:func:`heaviside_sigmoid`, ``slope=25``):
      :math:`k\sigma(kx)(1-\sigma(kx))`, area 1.
    * ``"triangular"`` (:func:`heaviside_triangular`, ``width=1``):
      :math:`\max(0, 1-|x|/w)/w`, area 1.
    * ``"boxcar"`` (:func:`heaviside_boxcar`, ``width=0.5``):
      :math:`\mathbb{1}[|x| \le w]/(2w)`, area 1.
    * ``"superspike"`` (:func:`heaviside_superspike`, ``beta=100``):
      :math:`1/(\beta|x|+1)^2`, area :math:`2/\beta`.

    Args:
      x: floating-point array.
      surrogate: the surrogate's name (default ``"fast_sigmoid"``).
      **params: that surrogate's static parameters (see its function).

    Returns:
      An array of ``x``'s shape and dtype.

    Raises:
      ValueError: ``surrogate`` is not one of the names above, or a parameter is
        out of range.
      TypeError: a parameter that the surrogate does not take, or one that is not
        a real number.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from stejax.estimators.spiking import heaviside
      >>> heaviside(jnp.array([-0.0, 0.0, 1e-3]))
      Array([0., 0., 1.], dtype=float32)
      >>> float(jax.grad(lambda v: heaviside(v, "atan", alpha=4.0))(0.0))
      2.0

    Reference:
      E. O. Neftci, H. Mostafa, F. Zenke, "Surrogate Gradient Learning in Spiking
      Neural Networks", IEEE Signal Processing Magazine 36(6), 2019; the rules'
      own papers are cited on their functions.
    """
    if not isinstance(surrogate, str) or surrogate not in _SURROGATES:
        raise ValueError(f"heaviside: unknown surrogate {surrogate!r}; expected one of {tuple(_SURROGATES)}.")
    fn, names = _SURROGATES[surrogate]
    unknown = sorted(set(params) - set(names))
    if unknown:
        raise TypeError(
            f"heaviside: surrogate {surrogate!r} takes the parameter(s) {names}; "
            f"got unexpected {', '.join(repr(n) for n in unknown)}."
        )
    return fn(x, **params)


# ----------------------------------------------------------------------------- catalog


def _zero(**_) -> tuple[float, ...]:
    return (0.0,)


def _width_points(width, **_) -> tuple[float, ...]:
    return (-width, 0.0, width)


_FORWARD_MATH = r"H(x) = \mathbb{1}[x > 0],\ H(\pm 0) = 0"
_KINK_AT_ZERO = "The forward jumps at 0, where H(+-0) = 0."


def _entry(name, fn, derivative, params, boundaries, derivative_math, kinks, integral, reference):
    return Entry(
        name=name,
        family="spiking",
        fn=fn,
        forward=_heaviside_forward,
        derivative=derivative,
        tangent=None,
        diff_argnums=(0,),
        boundaries=boundaries,
        params=params,
        forward_math=_FORWARD_MATH,
        derivative_math=derivative_math,
        kinks=f"{_KINK_AT_ZERO} {kinks}",
        integral=integral,
        reference=reference,
    )


ENTRIES = (
    _entry(
        "heaviside_fast_sigmoid",
        heaviside_fast_sigmoid,
        _fast_sigmoid_derivative,
        (ParamSpec("slope", 25.0, (25.0, 5.0, 100.0), "k in 1/(k|x| + 1)^2; in [1e-18, 1e18]."),),
        _zero,
        r"\partial H/\partial x = 1/(k|x| + 1)^2",
        "The derivative is 1 at 0, where it has a kink.",
        "2/slope",
        "Eshraghian et al., Proc. IEEE 2023 (snnTorch fast_sigmoid); Zenke & Ganguli, Neural Comput. 2018",
    ),
    _entry(
        "heaviside_atan",
        heaviside_atan,
        _atan_derivative,
        (ParamSpec("alpha", 2.0, (2.0, 0.5, 8.0), "alpha; in [1e-18, 1e18]."),),
        _zero,
        r"\partial H/\partial x = (\alpha/2) / (1 + (\pi \alpha x / 2)^2)",
        "The derivative is smooth, alpha/2 at 0.",
        "1",
        "Fang et al., ICCV 2021",
    ),
    _entry(
        "heaviside_sigmoid",
        heaviside_sigmoid,
        _sigmoid_derivative,
        (
            ParamSpec(
                "slope",
                25.0,
                (25.0, 5.0, 100.0),
                "k in k s (1 - s), s = sigmoid(k x); in [1e-18, 1e18].",
            ),
        ),
        _zero,
        r"\partial H/\partial x = k\,\sigma(kx)(1 - \sigma(kx))",
        "The derivative is smooth, slope/4 at 0.",
        "1",
        "Neftci, Mostafa, Zenke, IEEE Signal Process. Mag. 2019; snnTorch sigmoid",
    ),
    _entry(
        "heaviside_triangular",
        heaviside_triangular,
        _triangular_derivative,
        (ParamSpec("width", 1.0, (1.0, 0.5, 2.0), "Half-width w of the triangle; in [1e-18, 1e18]."),),
        _width_points,
        r"\partial H/\partial x = \max(0, 1 - |x|/w) / w",
        "The derivative is 1/width at 0 and reaches 0 at +-width, with kinks at 0 and +-width.",
        "1",
        "Bellec et al., NeurIPS 2018 (normalised to unit area)",
    ),
    _entry(
        "heaviside_boxcar",
        heaviside_boxcar,
        _boxcar_derivative,
        (ParamSpec("width", 0.5, (0.5, 0.25, 1.0), "Half-width w of the box; in [1e-18, 1e18]."),),
        _width_points,
        r"\partial H/\partial x = \mathbb{1}[|x| \le w] / (2w)",
        "The derivative jumps at +-width; the box is closed there (value 1/(2 width)).",
        "1",
        "Wu et al., Front. Neurosci. 2018 (STBP rectangular surrogate)",
    ),
    _entry(
        "heaviside_superspike",
        heaviside_superspike,
        _superspike_derivative,
        (ParamSpec("beta", 100.0, (100.0, 10.0, 25.0), "beta in 1/(beta|x| + 1)^2; in [1e-18, 1e18]."),),
        _zero,
        r"\partial H/\partial x = 1/(\beta|x| + 1)^2",
        "The derivative is 1 at 0, where it has a kink (same form as heaviside_fast_sigmoid).",
        "2/beta",
        "Zenke & Ganguli, Neural Computation 30(6), 2018",
    ),
)
