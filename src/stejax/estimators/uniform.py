"""Uniform quantizers: fixed-scale fake quantization, LSQ, LSQ+, PACT and DoReFa.

The conventions below make every value here the same eagerly, under ``jit`` and
under ``vmap``, bit for bit, and let an independent NumPy reference reproduce it.

* The arithmetic runs in float32 (float64 for float64 inputs) and the result is
  rounded to the input's dtype once, at the end. float16 holds integers exactly
  only up to 2048 and bfloat16 up to 256, so computing in the input dtype would
  put the integer grid itself out of reach for more than 8 (bfloat16) or 11
  (float16) bits.
* A division by a scale is a multiplication by its reciprocal: ``x / s`` is
  computed as ``x * (1 / s)`` and ``q / n`` as ``q * fl(1 / n)``. XLA rewrites a
  division by a broadcast operand into exactly this, but not a division between
  equal shapes, so the plain quotient would differ in the last bit between a
  scalar call, a batched call and a vmapped one.
* No inexact product feeds an addition directly (XLA's CPU backend fuses the two
  into one FMA under ``jit``, with a single rounding), and nothing adds a value
  that may be a constant zero to a result that may be -0.0 (XLA drops such an
  addition under ``jit``). Where the formula needs one, the docstring says how it
  is evaluated instead.
* Like XLA on CPU, the functions treat subnormal float32 and bfloat16 numbers as
  zeros of their sign (flush to zero).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from stejax.estimators._core import surrogate
from stejax.estimators._entry import ArgSpec, Entry, ParamSpec

__all__ = ["ENTRIES", "dorefa_activations", "dorefa_weights", "fake_quant", "lsq", "lsq_plus", "pact"]

MAX_BITS = 16


# --- shared pieces ---------------------------------------------------------------------------


def _compute_dtype(dtype) -> Any:
    return jnp.float64 if dtype == jnp.float64 else jnp.float32


def _clip(v, lo, hi):
    # Two selects rather than jnp.clip: NaN passes through and -0.0 keeps its sign
    # (XLA's max(-0.0, 0.0) is +0.0), so the value is defined bit for bit.
    return jnp.where(v < lo, lo, jnp.where(v > hi, hi, v))


def check_bits(name: str, bits: Any, *, signed: bool, narrow_range: bool = False) -> int:
    """Validate a bit width: an int in [2, 16] when signed or narrow, else in [1, 16]."""
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)):
        raise TypeError(f"{name}: bits must be an int; got {bits!r} of type {type(bits).__name__}.")
    least = 2 if (signed or narrow_range) else 1
    if not least <= bits <= MAX_BITS:
        why = (
            "a signed range (one bit is the sign)"
            if signed
            else ("a narrow unsigned range" if narrow_range else "an unsigned range")
        )
        raise ValueError(f"{name}: bits must be an int in [{least}, {MAX_BITS}] for {why}; got {bits}.")
    return int(bits)


def check_flag(name: str, flag: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: {flag} must be a bool; got {value!r} of type {type(value).__name__}.")
    return bool(value)


def check_axis(name: str, axis: Any, ndim: int) -> int | None:
    """``axis`` normalised to a non-negative int, or None."""
    if axis is None:
        return None
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"{name}: axis must be None or an int; got {axis!r} of type {type(axis).__name__}.")
    if not -ndim <= axis < ndim:
        raise ValueError(
            f"{name}: axis must be None or an int in [{-ndim}, {ndim}) for an input of rank {ndim}; got {axis}."
        )
    return int(axis) % ndim


def _check_grad_scale(name: str, grad_scale: Any) -> float | None:
    if grad_scale is None:
        return None
    if isinstance(grad_scale, bool) or not isinstance(grad_scale, (int, float, np.integer, np.floating)):
        raise TypeError(
            f"{name}: grad_scale must be None or a positive float; got {grad_scale!r} "
            f"of type {type(grad_scale).__name__}."
        )
    if not (math.isfinite(grad_scale) and grad_scale > 0):
        raise ValueError(f"{name}: grad_scale must be a positive finite float; got {grad_scale}.")
    return float(grad_scale)


def _concrete(a: Any) -> np.ndarray | None:
    """``a``'s value when it is known now: not under ``jit`` or ``vmap``, where it is abstract."""
    if isinstance(a, jax.core.Tracer):
        # An eager jax.grad or jax.jvp still knows the value (a concrete tracer); jit and vmap do not.
        to_concrete = getattr(a, "to_concrete_value", None)
        value = to_concrete() if to_concrete is not None else None
        return None if value is None else np.asarray(value)
    try:
        return np.asarray(a)
    except (TypeError, ValueError):
        return None


def check_positive(name: str, what: str, a: Any) -> None:
    """Raise ValueError when a concrete ``a`` holds a value <= 0; a traced ``a`` is not checked.

    NaN is let through: it makes the output NaN, which is visible, where a zero or
    negative scale gives plausible wrong numbers (zeros, ones, a mirrored grid).
    """
    v = _concrete(a)
    if v is None:
        return
    try:
        flat = v.astype(np.float64).reshape(-1)
    except (TypeError, ValueError):  # not numbers: the dtype check of the estimator says so
        return
    bad = flat <= 0
    if not bad.any():
        return
    i = int(np.argmax(bad))
    # A per-channel array is reshaped to broadcast against x: its flat index is the channel.
    where = f" at index {i} ({int(bad.sum())} of {flat.size} non-positive)" if flat.size > 1 or v.ndim else ""
    v = flat[i]
    raise ValueError(
        f"{name}: {what} must be positive (> 0); got {float(v)!r}{where}. A zero or negative {what} "
        "gives plausible but wrong values, so it is refused (checked when the value is concrete, "
        "not under jit or vmap)."
    )


def rounded_product(a, b):
    """``a * b``, rounded on its own even where an addition follows.

    Under jit, XLA's CPU backend contracts a multiply that feeds an add into one FMA
    (a single rounding), which eager mode, one operation at a time, never does. A
    select on the product that LLVM cannot see through (NaN stays NaN, every other
    value passes unchanged) keeps the two roundings, so jit and eager agree bit for bit.
    """
    p = a * b
    return jnp.where(jnp.isnan(p), jnp.nan, p)


def integer_range(bits: int, signed: bool, narrow_range: bool = False) -> tuple[int, int]:
    """(qmin, qmax) of a ``bits``-bit integer grid."""
    qmin, qmax = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    return qmin + int(narrow_range), qmax


def _along(a, axis, ndim):
    """``a``, one value per index along ``axis``, reshaped to broadcast against x explicitly.

    Idempotent: an ``a`` already of rank ``ndim`` keeps its shape.
    """
    if axis is None or np.ndim(a) == 0:
        return a
    shape = [1] * ndim
    shape[axis] = -1
    return jnp.reshape(a, shape)


def _per_channel(name: str, what: str, a: Any, x_shape: tuple[int, ...], axis: int | None, *, scalar_ok: bool):
    """Check ``a``'s shape against the granularity and reshape it to broadcast against x."""
    shape = np.shape(a)
    if axis is None:
        if shape != ():
            raise ValueError(
                f"{name}: with axis=None (one {what} for the whole input) {what} must be a scalar; "
                f"got shape {shape}. Pass axis=k for one {what} per index along axis k."
            )
        return a
    channels = x_shape[axis]
    if shape == (channels,) or (scalar_ok and shape == ()):
        return _along(a, axis, len(x_shape))
    also = " or ()" if scalar_ok else ""
    raise ValueError(
        f"{name}: with axis={axis}, {what} must have shape ({channels},){also}, one value per index "
        f"along axis {axis} of x of shape {x_shape}; got shape {shape}."
    )


# --- fake_quant --------------------------------------------------------------------------------


def _fake_quant_grid(x, scale, zero_point, bits, signed, narrow_range, axis):
    """The scale, round(x / scale) and the clip bounds shifted by the zero point, in the compute dtype.

    clip(r + z, qmin, qmax) - z is evaluated as clip(r, qmin - z, qmax - z), equal for
    integer z: under jit XLA drops the addition of a constant zero point 0, which would
    turn round(-0.3) + 0 = +0.0 into -0.0 and make jit and eager disagree on the sign.
    """
    cdt = _compute_dtype(x.dtype)
    qmin, qmax = integer_range(bits, signed, narrow_range)
    s = jnp.asarray(_along(scale, axis, x.ndim)).astype(cdt)
    zp = jnp.asarray(_along(zero_point, axis, x.ndim)).astype(cdt)
    r = jnp.round(x.astype(cdt) * (1 / s))
    return s, r, qmin - zp, qmax - zp


def _fake_quant_forward(x, scale, zero_point=0, *, bits, signed=True, narrow_range=False, axis=None):
    x = jnp.asarray(x)
    s, r, lo, hi = _fake_quant_grid(x, scale, zero_point, bits, signed, narrow_range, axis)
    return (_clip(r, lo, hi) * s).astype(x.dtype)


def _fake_quant_derivative(x, scale, zero_point=0, *, bits, signed=True, narrow_range=False, axis=None):
    x = jnp.asarray(x)
    _, r, lo, hi = _fake_quant_grid(x, scale, zero_point, bits, signed, narrow_range, axis)
    return ((r >= lo) & (r <= hi)).astype(x.dtype)


_fake_quant = surrogate(_fake_quant_forward, _fake_quant_derivative, name="fake_quant")


def fake_quant(
    x: ArrayLike,
    scale: ArrayLike,
    zero_point: ArrayLike = 0,
    *,
    bits: int,
    signed: bool = True,
    narrow_range: bool = False,
    axis: int | None = None,
) -> jax.Array:
    r"""Quantize to a fixed uniform integer grid and back, with a clipped straight-through gradient.

    Forward, with :math:`s` the scale and :math:`z` the zero point:

    .. math::

       r = \operatorname{round}(x \cdot s^{-1}), \qquad
       y = \big(\operatorname{clip}(r + z, q_{\min}, q_{\max}) - z\big)\, s,

    where round is ties to even and :math:`(q_{\min}, q_{\max}) = (-2^{b-1}, 2^{b-1}-1)`
    when ``signed``, :math:`(0, 2^b - 1)` otherwise; ``narrow_range`` raises
    :math:`q_{\min}` by one (the symmetric signed grid :math:`[-127, 127]` at 8 bits,
    and :math:`[1, 255]` unsigned, as TensorFlow's ``narrow_range``). The arithmetic
    runs in float32 (float64 for float64 inputs), :math:`s^{-1}` is computed once as
    ``1 / scale``, and the result is rounded to ``x``'s dtype at the end. The clip
    is evaluated as :math:`\operatorname{clip}(r, q_{\min} - z, q_{\max} - z)\, s`,
    equal for an integer :math:`z`; it never adds :math:`z` to :math:`r`, because
    XLA drops the addition of a constant 0 under ``jit`` and would change the sign
    of a zero.

    Surrogate (clipped straight-through estimator):

    .. math::

       \partial y / \partial x = \mathbb{1}[q_{\min} \le r + z \le q_{\max}],

    that is 1 exactly where the clip leaves the rounded value alone. An input that
    rounds onto the top level (up to :math:`(q_{\max} - z + 1/2)\, s`) still has
    derivative 1. At the tie :math:`(q_{\max} - z + 1/2)\, s` itself round-to-even
    decides: the input goes out of range (derivative 0) when :math:`q_{\max} - z` is
    odd, as it is with :math:`z = 0` for every unsigned grid and every signed grid;
    at the lower tie :math:`(q_{\min} - z - 1/2)\, s` it stays in range (derivative
    1) when :math:`q_{\min} - z` is even. ``scale`` and ``zero_point`` are
    calibration constants and get no gradient; to learn the step use :func:`lsq`.

    Special values: the sign of zero is kept (-0.0, and inputs that round to 0
    from below, give -0.0 when 0 is a level); :math:`\pm\infty` saturate to the
    end levels with derivative 0; NaN gives NaN with derivative 0.

    Invalid scales: a zero or negative ``scale`` raises ValueError when its value
    is concrete (an eager call, an eager ``jax.grad``). Under ``jit`` or ``vmap``
    the value is abstract and is not checked; the formula is then evaluated as
    written, which gives plausible wrong numbers (a zero scale gives zeros, NaN at
    0; a negative one mirrors the grid): check a traced scale yourself, or run
    ``stejax diagnose``, whose eager stages name it. A NaN or infinite scale gives
    NaN outputs (infinite: NaN times 0), visibly.

    Args:
      x: floating-point array.
      scale: the step between levels, in ``x``'s dtype (or a Python float). A
        scalar when ``axis`` is None; shape ``(x.shape[axis],)`` otherwise.
      zero_point: the integer that represents 0, as a float in ``x``'s dtype
        (default 0). A scalar, or shape ``(x.shape[axis],)`` with ``axis``. It
        should be an integer in :math:`[q_{\min}, q_{\max}]`; other values shift
        the grid. bfloat16 holds integers exactly only up to 256.
      bits: the bit width, an int in [2, 16] when signed (one bit is the sign),
        [1, 16] when unsigned ([2, 16] with ``narrow_range``). Required.
      signed: a signed (default) or unsigned grid.
      narrow_range: drop the lowest level (default False).
      axis: None (default) for one scale for the whole tensor, or an int for one
        scale per index along that axis (per-channel quantization). Group scales
        from :func:`stejax.absmax_scale` and friends apply to ``x.reshape(-1, g)``
        with ``axis=0``.

    Returns:
      An array of ``x``'s shape and dtype.

    Raises:
      TypeError: ``bits``, ``signed``, ``narrow_range`` or ``axis`` of the wrong
        type, or arrays of mixed or non-floating dtypes.
      ValueError: ``bits`` or ``axis`` out of range, a ``scale`` or
        ``zero_point`` whose shape does not fit ``axis``, or a concrete ``scale``
        with a value <= 0.

    Example:
      >>> import jax, jax.numpy as jnp, stejax
      >>> x = jnp.array([-1.0, 0.3, 0.74, 2.0])
      >>> stejax.fake_quant(x, 0.5, bits=2).tolist()
      [-1.0, 0.5, 0.5, 0.5]
      >>> jax.grad(lambda x: stejax.fake_quant(x, 0.5, bits=2).sum())(x).tolist()
      [1.0, 1.0, 1.0, 0.0]

    Reference:
      B. Jacob et al., "Quantization and Training of Neural Networks for Efficient
      Integer-Arithmetic-Only Inference", CVPR 2018.
    """
    signed = check_flag("fake_quant", "signed", signed)
    narrow_range = check_flag("fake_quant", "narrow_range", narrow_range)
    bits = check_bits("fake_quant", bits, signed=signed, narrow_range=narrow_range)
    x_shape = np.shape(x)
    axis = check_axis("fake_quant", axis, len(x_shape))
    scale = _per_channel("fake_quant", "scale", scale, x_shape, axis, scalar_ok=False)
    check_positive("fake_quant", "scale", scale)
    zero_point = _per_channel("fake_quant", "zero_point", zero_point, x_shape, axis, scalar_ok=True)
    return _fake_quant(x, scale, zero_point, bits=bits, signed=signed, narrow_range=narrow_range, axis=axis)


# --- LSQ and LSQ+ ------------------------------------------------------------------------------


def lsq_levels(bits: int, signed: bool) -> tuple[int, int]:
    """LSQ's (Q_N, Q_P): the grid is [-Q_N, Q_P]."""
    return (2 ** (bits - 1), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)


def _lsq_grid(x, step, offset, axis):
    """x, step and offset in the compute dtype, and v = (x - offset) / step."""
    cdt = _compute_dtype(x.dtype)
    s = jnp.asarray(_along(step, axis, x.ndim)).astype(cdt)
    b = jnp.asarray(_along(offset, axis, x.ndim)).astype(cdt)
    return s, b, (x.astype(cdt) - b) * (1 / s)


def _lsq_grad_scale(grad_scale, x, step, qp) -> float:
    if grad_scale is not None:
        return grad_scale
    # N is the number of elements that share one step (all of x per tensor, one
    # channel's worth per channel), as in the paper's g = 1 / sqrt(N Q_P).
    n = max(x.size // max(np.size(step), 1), 1)
    return 1.0 / math.sqrt(n * qp)


def _lsq_step_partial(v, qn, qp, g):
    """g * (-Q_N below, round(v) - v inside, Q_P above, 0 at NaN): the step's partial."""
    # Inside the closed range the partial is round(v) - v (0 at v = -Q_N and v = Q_P,
    # as autograd gives for round_pass(clamp(v, -Q_N, Q_P)) * s). A NaN input gets 0,
    # as for x: the factory adds partial * tangent over all arguments, so a NaN here
    # would poison the tangent of x even when the step's own tangent is zero.
    # Two guards against XLA's rewrites under jit, so that jit and eager agree bit for
    # bit: round(v) - v is taken of the clipped v (equal inside), whose selects keep
    # the product v = x * (1/s) from fusing with the subtraction into an FMA; and g
    # is applied inside the selects, so that the factory's `partial * tangent` cannot
    # be reassociated with it into `partial * (g * tangent)`.
    g = jnp.asarray(g, v.dtype)
    c = _clip(v, -qn, qp)
    inside = jnp.where(jnp.isnan(v), 0, (jnp.round(c) - c) * g)
    return jnp.where(v < -qn, -qn * g, jnp.where(v > qp, qp * g, inside))


def _lsq_forward(x, step, *, bits, signed=True, grad_scale=None, axis=None):
    x = jnp.asarray(x)
    qn, qp = lsq_levels(bits, signed)
    s, _, v = _lsq_grid(x, step, 0, axis)
    return (jnp.round(_clip(v, -qn, qp)) * s).astype(x.dtype)


def _lsq_derivative(x, step, *, bits, signed=True, grad_scale=None, axis=None):
    x = jnp.asarray(x)
    qn, qp = lsq_levels(bits, signed)
    _, _, v = _lsq_grid(x, step, 0, axis)
    g = _lsq_grad_scale(grad_scale, x, step, qp)
    inside = (v >= -qn) & (v <= qp)
    return inside.astype(x.dtype), _lsq_step_partial(v, qn, qp, g).astype(x.dtype)


def _lsq_plus_forward(x, step, offset, *, bits, signed=False, grad_scale=None, axis=None):
    x = jnp.asarray(x)
    qn, qp = lsq_levels(bits, signed)
    s, b, v = _lsq_grid(x, step, offset, axis)
    y = rounded_product(jnp.round(_clip(v, -qn, qp)), s) + b
    # A zero result is +0.0: under jit XLA drops the addition of a constant offset 0,
    # which would leave -0.0 where eager mode gives -0.0 + 0.0 = +0.0.
    return jnp.where(y == 0, 0, y).astype(x.dtype)


def _lsq_plus_derivative(x, step, offset, *, bits, signed=False, grad_scale=None, axis=None):
    x = jnp.asarray(x)
    qn, qp = lsq_levels(bits, signed)
    _, _, v = _lsq_grid(x, step, offset, axis)
    g = _lsq_grad_scale(grad_scale, x, step, qp)
    inside = (v >= -qn) & (v <= qp)
    d_step = _lsq_step_partial(v, qn, qp, g).astype(x.dtype)
    # NaN gets 0, as for x and the step.
    d_offset = jnp.where(inside | jnp.isnan(v), 0, jnp.asarray(g, v.dtype)).astype(x.dtype)
    return inside.astype(x.dtype), d_step, d_offset


_lsq = surrogate(_lsq_forward, _lsq_derivative, name="lsq", diff_argnums=(0, 1))
_lsq_plus = surrogate(_lsq_plus_forward, _lsq_plus_derivative, name="lsq_plus", diff_argnums=(0, 1, 2))


def lsq(
    x: ArrayLike,
    step: ArrayLike,
    *,
    bits: int,
    signed: bool = True,
    grad_scale: float | None = None,
    axis: int | None = None,
) -> jax.Array:
    r"""Learned step size quantization (LSQ): a uniform quantizer whose step is trained.

    Forward, with :math:`s` the step and :math:`(Q_N, Q_P) = (2^{b-1}, 2^{b-1}-1)`
    when ``signed``, :math:`(0, 2^b - 1)` otherwise:

    .. math::

       v = x \cdot s^{-1}, \qquad
       y = \operatorname{round}(\operatorname{clip}(v, -Q_N, Q_P))\, s,

    round ties to even, in float32 (float64 for float64 inputs), rounded to ``x``'s
    dtype at the end.

    Surrogate, with :math:`g` the gradient scale:

    .. math::

       \frac{\partial y}{\partial x} = \mathbb{1}[-Q_N \le v \le Q_P], \qquad
       \frac{\partial y}{\partial s} = g \cdot \begin{cases}
         -Q_N & v < -Q_N \\
         \operatorname{round}(v) - v & -Q_N \le v \le Q_P \\
         Q_P & v > Q_P. \end{cases}

    Kinks: at :math:`v = -Q_N` and :math:`v = Q_P` exactly the input is inside (its
    derivative is 1 and the step's is 0), which is what autograd gives for the
    paper's ``round_pass(clamp(x / s, -Q_N, Q_P)) * s``; the step's partial jumps to
    :math:`-Q_N` or :math:`Q_P` just outside. Ties :math:`v = k + 1/2` round to even.
    Special values: :math:`\pm\infty` saturate (derivative 0, step partial
    :math:`g Q_P` or :math:`-g Q_N`); NaN gives NaN with both partials 0 (a NaN
    partial would poison the tangent of the other argument); the sign of zero is
    kept. A concrete ``step`` <= 0 raises ValueError; a traced one (under
    ``jit`` or ``vmap``) is not checked and gives wrong values (``step = -0.1``
    gives ``0.8`` for ``x = 2`` at 4 bits), as :func:`fake_quant` says.

    Args:
      x: floating-point array.
      step: the learned step :math:`s`, in ``x``'s dtype. A scalar when ``axis`` is
        None; shape ``(x.shape[axis],)`` otherwise.
      bits: the bit width, an int in [2, 16] when signed, [1, 16] when unsigned.
      signed: the signed grid :math:`[-2^{b-1}, 2^{b-1}-1]` (default) or the
        unsigned :math:`[0, 2^b-1]` (for activations after a ReLU).
      grad_scale: :math:`g`. The default None is the paper's
        :math:`1/\sqrt{N Q_P}`, with :math:`N` the number of elements of ``x`` per
        step (all of ``x`` per tensor, one slice per channel), computed from the
        static shapes (per example under ``vmap``).
      axis: None (default) for one step, or an int for one step per index along
        that axis.

    Returns:
      An array of ``x``'s shape and dtype.

    Raises:
      TypeError: a parameter of the wrong type, or arrays of mixed or
        non-floating dtypes.
      ValueError: ``bits``, ``axis`` or ``grad_scale`` out of range, a ``step``
        whose shape does not fit ``axis``, or a concrete ``step`` with a value <= 0.

    Example:
      >>> import jax, jax.numpy as jnp, stejax
      >>> x = jnp.array([0.3, 5.0])
      >>> stejax.lsq(x, 0.25, bits=4).tolist()
      [0.25, 1.75]
      >>> gx, gs = jax.grad(lambda x, s: stejax.lsq(x, s, bits=4, grad_scale=1.0).sum(),
      ...                   argnums=(0, 1))(x, 0.25)
      >>> gx.tolist(), round(float(gs), 4)
      ([1.0, 0.0], 6.8)

    Reference:
      S. K. Esser, J. L. McKinstry, D. Bablani, R. Appuswamy, D. S. Modha,
      "Learned Step Size Quantization", ICLR 2020.
    """
    signed = check_flag("lsq", "signed", signed)
    bits = check_bits("lsq", bits, signed=signed)
    grad_scale = _check_grad_scale("lsq", grad_scale)
    x_shape = np.shape(x)
    axis = check_axis("lsq", axis, len(x_shape))
    # Reshaped before the estimator so that the factory's `partial * tangent`
    # broadcasts the step's tangent explicitly.
    step = _per_channel("lsq", "step", step, x_shape, axis, scalar_ok=False)
    check_positive("lsq", "step", step)
    return _lsq(x, step, bits=bits, signed=signed, grad_scale=grad_scale, axis=axis)


def lsq_plus(
    x: ArrayLike,
    step: ArrayLike,
    offset: ArrayLike,
    *,
    bits: int,
    signed: bool = False,
    grad_scale: float | None = None,
    axis: int | None = None,
) -> jax.Array:
    r"""LSQ+: learned step size quantization with a learned offset.

    Forward, with :math:`s` the step, :math:`\beta` the offset and :math:`(Q_N, Q_P)`
    as in :func:`lsq` (unsigned by default here):

    .. math::

       v = (x - \beta)\, s^{-1}, \qquad
       y = \operatorname{round}(\operatorname{clip}(v, -Q_N, Q_P))\, s + \beta,

    round ties to even, in float32 (float64 for float64 inputs), rounded to ``x``'s
    dtype at the end. The product is rounded before :math:`\beta` is added, under
    ``jit`` too (where XLA would otherwise fuse the two into one FMA).

    Surrogate (the derivative of the forward with round read as the identity):

    .. math::

       \frac{\partial y}{\partial x} = \mathbb{1}[-Q_N \le v \le Q_P], \quad
       \frac{\partial y}{\partial s} = g \cdot \begin{cases}
         -Q_N & v < -Q_N \\ \operatorname{round}(v) - v & \text{inside} \\
         Q_P & v > Q_P, \end{cases} \quad
       \frac{\partial y}{\partial \beta} = g \cdot \mathbb{1}[\text{not inside}].

    Inside the range the offset cancels (:math:`s \cdot (-1/s) + 1 = 0`); outside,
    the output is a constant level plus :math:`\beta`. The gradient scale
    :math:`g` multiplies both the step and the offset partials, as LSQ+ carries
    LSQ's scaling over to the offset. Kinks and special values are as in
    :func:`lsq`, shifted by :math:`\beta`; a NaN input gets NaN with all three
    partials 0. A zero result is +0.0 (under ``jit`` XLA drops the addition of a
    constant offset 0, which would otherwise keep the -0.0 that eager mode turns
    into +0.0).

    Args:
      x: floating-point array.
      step: the learned step :math:`s`, in ``x``'s dtype: a scalar, or shape
        ``(x.shape[axis],)`` with ``axis``. Must be positive: a concrete value
        <= 0 raises ValueError, a traced one is not checked (see :func:`fake_quant`).
      offset: the learned offset :math:`\beta`, in ``x``'s dtype: a scalar, or
        shape ``(x.shape[axis],)`` with ``axis``.
      bits: the bit width, an int in [2, 16] when signed, [1, 16] when unsigned.
      signed: False (default) for the grid :math:`[0, 2^b-1]`, True for
        :math:`[-2^{b-1}, 2^{b-1}-1]`.
      grad_scale: :math:`g`; None (default) is :math:`1/\sqrt{N Q_P}` with
        :math:`N` the number of elements per step, as in :func:`lsq`.
      axis: None (default) or the channel axis of ``step`` (and ``offset``).

    Returns:
      An array of ``x``'s shape and dtype.

    Raises:
      TypeError: a parameter of the wrong type, or arrays of mixed or
        non-floating dtypes.
      ValueError: ``bits``, ``axis`` or ``grad_scale`` out of range, a ``step``
        or ``offset`` whose shape does not fit ``axis``, or a concrete ``step``
        with a value <= 0.

    Example:
      >>> import jax, jax.numpy as jnp, stejax
      >>> x = jnp.array([-2.0, 0.1, 9.0])
      >>> stejax.lsq_plus(x, 0.5, -1.0, bits=2).tolist()
      [-1.0, 0.0, 0.5]
      >>> jax.grad(lambda b: stejax.lsq_plus(x, 0.5, b, bits=2, grad_scale=1.0).sum())(-1.0).item()
      2.0

    Reference:
      Y. Bhalgat, J. Lee, M. Nagel, T. Blankevoort, N. Kwak, "LSQ+: Improving
      Low-Bit Quantization Through Learnable Offsets and Better Initialization",
      CVPR Workshops 2020.
    """
    signed = check_flag("lsq_plus", "signed", signed)
    bits = check_bits("lsq_plus", bits, signed=signed)
    grad_scale = _check_grad_scale("lsq_plus", grad_scale)
    x_shape = np.shape(x)
    axis = check_axis("lsq_plus", axis, len(x_shape))
    step = _per_channel("lsq_plus", "step", step, x_shape, axis, scalar_ok=False)
    check_positive("lsq_plus", "step", step)
    offset = _per_channel("lsq_plus", "offset", offset, x_shape, axis, scalar_ok=True)
    return _lsq_plus(x, step, offset, bits=bits, signed=signed, grad_scale=grad_scale, axis=axis)


# --- PACT --------------------------------------------------------------------------------------


def _pact_forward(x, alpha, *, bits):
    x = jnp.asarray(x)
    cdt = _compute_dtype(x.dtype)
    a = jnp.asarray(alpha).astype(cdt)
    step = a * (1 / (2**bits - 1))
    return (jnp.round(_clip(x.astype(cdt), 0, a) * (1 / step)) * step).astype(x.dtype)


def _pact_derivative(x, alpha, *, bits):
    x = jnp.asarray(x)
    cdt = _compute_dtype(x.dtype)
    a = jnp.asarray(alpha).astype(cdt)
    xc = x.astype(cdt)
    return ((xc >= 0) & (xc < a)).astype(x.dtype), (xc >= a).astype(x.dtype)


_pact = surrogate(_pact_forward, _pact_derivative, name="pact", diff_argnums=(0, 1))


def pact(x: ArrayLike, alpha: ArrayLike, *, bits: int) -> jax.Array:
    r"""PACT: a clipped ReLU with a learned clipping level, quantized to ``bits`` bits.

    Forward, with :math:`n = 2^b - 1` levels above zero and :math:`\alpha` the
    clipping level:

    .. math::

       s = \alpha \cdot \operatorname{fl}(1/n), \qquad
       y = \operatorname{round}(\operatorname{clip}(x, 0, \alpha) \cdot s^{-1})\, s,

    the paper's :math:`\operatorname{round}(\operatorname{clip}(x, 0, \alpha)\, n /
    \alpha)\, \alpha / n` with this exact operation order: the step :math:`s` is
    :math:`\alpha` times the float32 reciprocal of :math:`n` (float64 for float64
    inputs), :math:`s^{-1}` is ``1 / s``, round is ties to even, and the result is
    rounded to ``x``'s dtype at the end.

    Surrogate:

    .. math::

       \frac{\partial y}{\partial x} = \mathbb{1}[0 \le x < \alpha], \qquad
       \frac{\partial y}{\partial \alpha} = \mathbb{1}[x \ge \alpha].

    The paper's :math:`\partial y / \partial \alpha` is the gradient of the clip
    alone; the quantization error term inside the range (which LSQ keeps) is left
    out, as in PACT. Kinks: at :math:`x = 0` the derivative is 1 (0 just below);
    at :math:`x = \alpha` it is 0 and the :math:`\alpha` partial is 1. Ties
    :math:`(k + 1/2)\, s` round to even. Special values: :math:`-\infty` gives 0
    and :math:`+\infty` gives the top level (derivative 0, :math:`\alpha` partial 1
    for :math:`+\infty`); NaN gives NaN with both partials 0; -0.0 stays -0.0.
    ``alpha`` must be positive: a concrete ``alpha`` <= 0 raises ValueError; a
    traced one (under ``jit`` or ``vmap``) is not checked, and a negative one gives
    negative outputs from this clipped ReLU (see :func:`fake_quant`).

    Args:
      x: floating-point array (the pre-activation).
      alpha: the learned clipping level :math:`\alpha`, a scalar in ``x``'s dtype.
      bits: the bit width, an int in [1, 16] (the grid is unsigned). Required.

    Returns:
      An array of ``x``'s shape and dtype.

    Raises:
      TypeError: ``bits`` not an int, or arrays of mixed or non-floating dtypes.
      ValueError: ``bits`` out of range, ``alpha`` not a scalar, or a concrete
        ``alpha`` <= 0.

    Example:
      >>> import jax, jax.numpy as jnp, stejax
      >>> x = jnp.array([-1.0, 0.4, 3.0])
      >>> stejax.pact(x, 1.5, bits=2).tolist()
      [0.0, 0.5, 1.5]
      >>> jax.grad(lambda a: stejax.pact(x, a, bits=2).sum())(1.5).item()
      1.0

    Reference:
      J. Choi, Z. Wang, S. Venkataramani, P. I.-J. Chuang, V. Srinivasan,
      K. Gopalakrishnan, "PACT: Parameterized Clipping Activation for Quantized
      Neural Networks", arXiv:1805.06085, 2018.
    """
    bits = check_bits("pact", bits, signed=False)
    if np.shape(alpha) != ():
        raise ValueError(f"pact: alpha must be a scalar (one clipping level); got shape {np.shape(alpha)}.")
    check_positive("pact", "alpha", alpha)
    return _pact(x, alpha, bits=bits)


# --- DoReFa ------------------------------------------------------------------------------------


def _dorefa_weights_terms(w):
    """tanh(w) in the compute dtype and the normaliser m = max|tanh(w)| (1 if that is 0)."""
    t = jnp.tanh(w.astype(_compute_dtype(w.dtype)))
    # The normaliser is held constant for the gradient, as larq does: through it,
    # the largest element would see tanh / tanh and get a zero gradient. Stopping
    # it here also keeps second derivatives consistent with that first-order choice.
    m = jax.lax.stop_gradient(jnp.max(jnp.abs(t)))
    # An all-zero w has nothing to normalise: divide by 1 instead of 0. NaN propagates.
    return t, jnp.where(m == 0, 1, m)


def _dorefa_weights_forward(w, *, bits):
    w = jnp.asarray(w)
    n = 2**bits - 1
    t, m = _dorefa_weights_terms(w)
    # u = tanh(w) / (2m) + 1/2 as (tanh(w) + m) * (1 / (2m)), and 2q - 1 as
    # (2 round(u n) - n) * fl(1/n): no inexact product feeds an addition, which XLA
    # would fuse into an FMA under jit and so round differently from eager mode.
    u = (t + m) * (1 / (2 * m))
    return ((2 * jnp.round(u * n) - n) * (1 / n)).astype(w.dtype)


def _dorefa_weights_derivative(w, *, bits):
    w = jnp.asarray(w)
    t, m = _dorefa_weights_terms(w)
    # 1 - tanh^2 as (1 - t)(1 + t): no product feeds a subtraction (see above).
    return ((1 - t) * (1 + t) * (1 / m)).astype(w.dtype)


def _dorefa_activations_forward(x, *, bits):
    x = jnp.asarray(x)
    n = 2**bits - 1
    xc = x.astype(_compute_dtype(x.dtype))
    return (jnp.round(_clip(xc, 0, 1) * n) * (1 / n)).astype(x.dtype)


def _dorefa_activations_derivative(x, *, bits):
    x = jnp.asarray(x)
    xc = x.astype(_compute_dtype(x.dtype))
    return ((xc >= 0) & (xc <= 1)).astype(x.dtype)


_dorefa_weights = surrogate(_dorefa_weights_forward, _dorefa_weights_derivative, name="dorefa_weights")
_dorefa_activations = surrogate(_dorefa_activations_forward, _dorefa_activations_derivative, name="dorefa_activations")


def dorefa_weights(w: ArrayLike, *, bits: int) -> jax.Array:
    r"""DoReFa-Net's weight quantizer: tanh, max-normalise, quantize to ``bits`` bits.

    Forward, with :math:`n = 2^k - 1` and :math:`m = \max_j |\tanh w_j|` over the
    whole array:

    .. math::

       u = \frac{\tanh(w)}{2m} + \frac{1}{2}, \qquad
       y = 2\, \frac{\operatorname{round}(u\, n)}{n} - 1.

    Operation order, in float32 (float64 for float64 inputs), rounded to ``w``'s
    dtype at the end: :math:`u = (\tanh(w) + m) \cdot (1 / (2m))` and
    :math:`y = (2 \operatorname{round}(u\, n) - n) \cdot \operatorname{fl}(1/n)`,
    with ``fl(1/n)`` the reciprocal rounded to that dtype and round ties to even.
    (Written this way no inexact product feeds an addition, which XLA fuses into
    an FMA under ``jit``; the value is then the same eagerly and under ``jit``.)
    The levels are :math:`(2i - n)/n`, symmetric and without 0 (at 2 bits:
    :math:`\pm 1/3, \pm 1`). ``bits=1`` uses the same formula, a sign with values
    :math:`\pm 1` where 0 goes to -1; the paper's 1-bit variant
    :math:`\operatorname{sign}(w)\, \mathbb{E}|w|` is not this function. An
    all-zero ``w`` is normalised by 1 instead of 0 (:math:`u = 1/2`, the tie
    between the two middle levels, which goes to even); NaN anywhere makes the
    whole output NaN; :math:`\pm\infty` act as :math:`\pm 1` through tanh.
    ``tanh`` is XLA's, which can differ from NumPy's in the last bit.

    Surrogate: straight through the rounding, through tanh and the normalisation,
    with :math:`m` held constant (larq stops the gradient there: through it the
    largest element would see :math:`\tanh / \tanh` and get nothing), so the
    Jacobian is diagonal:

    .. math::

       \frac{\partial y}{\partial w} = \frac{1 - \tanh^2 w}{m},

    computed as :math:`(1 - t)(1 + t) \cdot (1/m)` with :math:`t = \tanh w`; it is 1
    for an all-zero ``w`` (normalised by 1). It grows like :math:`1/m`: float16
    derivatives overflow to inf when :math:`\max|w|` is below about
    :math:`1.5 \cdot 10^{-5}`. Second derivatives also hold :math:`m` constant.

    Kinks: the level boundaries depend on :math:`m`, so on the whole array; the
    ties :math:`u\, n = i + 1/2` round to even. Under ``vmap`` the maximum is taken
    per example.

    Args:
      w: floating-point array of weights.
      bits: :math:`k`, an int in [1, 16]. Required.

    Returns:
      An array of ``w``'s shape and dtype.

    Raises:
      TypeError: ``bits`` not an int, or a non-floating ``w``.
      ValueError: ``bits`` out of range.

    Example:
      >>> import jax, jax.numpy as jnp, stejax
      >>> w = jnp.array([-2.0, 0.1, 2.0])
      >>> [round(v, 4) for v in stejax.dorefa_weights(w, bits=2).tolist()]
      [-1.0, 0.3333, 1.0]

    Reference:
      S. Zhou, Y. Wu, Z. Ni, X. Zhou, H. Wen, Y. Zou, "DoReFa-Net: Training Low
      Bitwidth Convolutional Neural Networks with Low Bitwidth Gradients",
      arXiv:1606.06160, 2016.
    """
    bits = check_bits("dorefa_weights", bits, signed=False)
    return _dorefa_weights(w, bits=bits)


def dorefa_activations(x: ArrayLike, *, bits: int) -> jax.Array:
    r"""DoReFa-Net's activation quantizer: clip to [0, 1], quantize to ``bits`` bits.

    Forward, with :math:`n = 2^k - 1`:

    .. math::

       y = \operatorname{round}(\operatorname{clip}(x, 0, 1)\, n) \cdot \operatorname{fl}(1/n),

    in float32 (float64 for float64 inputs; ``fl(1/n)`` is the reciprocal rounded
    to that dtype, and :math:`n \cdot \operatorname{fl}(1/n) = 1` exactly for
    every :math:`k \le 16`, so the top level is 1), round ties to even, rounded to
    ``x``'s dtype at the end.

    Surrogate: :math:`\partial y / \partial x = \mathbb{1}[0 \le x \le 1]`, the
    clip's derivative with both ends closed (1 at :math:`x = 0` and :math:`x = 1`,
    0 just outside). Ties :math:`(i + 1/2)/n` round to even. Special values:
    :math:`\pm\infty` saturate to 1 or 0 with derivative 0, NaN gives NaN with
    derivative 0, -0.0 stays -0.0 (derivative 1).

    Args:
      x: floating-point array.
      bits: :math:`k`, an int in [1, 16]. Required.

    Returns:
      An array of ``x``'s shape and dtype.

    Raises:
      TypeError: ``bits`` not an int, or a non-floating ``x``.
      ValueError: ``bits`` out of range.

    Example:
      >>> import jax, jax.numpy as jnp, stejax
      >>> x = jnp.array([-0.5, 0.3, 0.5, 2.0])
      >>> [round(v, 4) for v in stejax.dorefa_activations(x, bits=2).tolist()]
      [0.0, 0.3333, 0.6667, 1.0]
      >>> jax.grad(lambda x: stejax.dorefa_activations(x, bits=2).sum())(x).tolist()
      [0.0, 1.0, 1.0, 0.0]

    Reference:
      Zhou et al., "DoReFa-Net", arXiv:1606.06160, 2016.
    """
    bits = check_bits("dorefa_activations", bits, signed=False)
    return _dorefa_activations(x, bits=bits)


# --- catalog -----------------------------------------------------------------------------------

# Example arguments are fixed, exactly representable values (the step is 1/4 in
# every dtype), so that `boundaries` can name the kinks and ties of x exactly.
_EXAMPLE_STEP = 0.25
# Per channel (axis set), the channels' steps cycle through these powers of two, so that
# a value applied to the wrong channel changes the result; the boundaries are those of
# the first channel (step 1/4).
_CHANNEL_STEPS = (_EXAMPLE_STEP, 2 * _EXAMPLE_STEP)


def _per_channel_example(value, x_shape, dtype, params, *, cycle=None):
    """``value`` as a scalar (axis None), or one per index along ``params["axis"]`` of x."""
    axis = params.get("axis")
    if axis is None:
        return np.asarray(value, dtype)
    channels = x_shape[axis]
    if cycle is None:
        return np.full((channels,), value, np.float64).astype(dtype)
    return np.resize(np.asarray(cycle, np.float64), channels).astype(dtype)


def _example_step(rng, x_shape, dtype, params):
    return _per_channel_example(_EXAMPLE_STEP, x_shape, dtype, params, cycle=_CHANNEL_STEPS)


def _example_zero_point(rng, x_shape, dtype, params):
    zp = _fake_quant_example_zp(params.get("bits", 8), params.get("signed", True))
    return _per_channel_example(zp, x_shape, dtype, params)


def _fake_quant_example_zp(bits, signed):
    # Signed grids are symmetric about 0; an unsigned one gets its midpoint, a power of two.
    return 0 if signed else 2 ** (bits - 1)


def _example_offset(rng, x_shape, dtype, params):
    offset = _lsq_plus_example_offset(params.get("bits", 8), params.get("signed", False))
    return _per_channel_example(offset, x_shape, dtype, params)


def _lsq_plus_example_offset(bits, signed):
    return 2 * _EXAMPLE_STEP if signed else -(2 ** (bits - 1)) * _EXAMPLE_STEP


def _example_alpha(rng, x_shape, dtype, params):
    return np.asarray(_pact_example_alpha(params.get("bits", 8)), dtype)


def _pact_example_alpha(bits):
    # alpha = n / 4 makes PACT's step exactly 1/4.
    return (2**bits - 1) * _EXAMPLE_STEP


def _grid_points(lo: float, hi: float) -> list[float]:
    """The ends of a clip range [lo, hi] in grid units, and the ties near 0 and near both ends."""
    ties = {math.floor(lo + 0.5) + 0.5, math.ceil(hi - 0.5) - 0.5, -1.5, -0.5, 0.5, 1.5}
    return sorted({float(lo), float(hi)} | {t for t in ties if lo < t < hi})


def _fake_quant_boundaries(*, bits, signed=True, narrow_range=False, **_):
    # For the example scale 1/4 and zero point: the clip edges (the ties just
    # outside the range, where the derivative switches) and ties near 0 and both ends.
    qmin, qmax = integer_range(bits, signed, narrow_range)
    zp = _fake_quant_example_zp(bits, signed)
    units = _grid_points(qmin - zp - 0.5, qmax - zp + 0.5)
    return tuple(u * _EXAMPLE_STEP for u in units)


def _lsq_boundaries(*, bits, signed=True, **_):
    qn, qp = lsq_levels(bits, signed)
    return tuple(u * _EXAMPLE_STEP for u in _grid_points(-qn, qp))


def _lsq_plus_boundaries(*, bits, signed=False, **_):
    qn, qp = lsq_levels(bits, signed)
    offset = _lsq_plus_example_offset(bits, signed)
    return tuple(offset + u * _EXAMPLE_STEP for u in _grid_points(-qn, qp))


def _pact_boundaries(*, bits, **_):
    return tuple(u * _EXAMPLE_STEP for u in _grid_points(0, 2**bits - 1))


def _dorefa_activations_boundaries(*, bits, **_):
    n = 2**bits - 1
    return tuple(u / n for u in _grid_points(0, n))


def _no_fixed_boundaries(**_):
    # DoReFa's weight levels move with max|tanh(w)|, a property of the whole input.
    return ()


def _bits_param(values=(8, 4, 2), doc="the bit width"):
    return ParamSpec("bits", None, values, doc)


_SIGNED_DOC = "signed grid (True) or unsigned (False)"
_AXIS = ParamSpec(
    "axis",
    None,
    (None, -1),
    "None: one value for the whole input; k: one per index along axis k (per channel). Per group of g: "
    "reshape x to (-1, g) and use axis=0",
)
_GRAD_SCALE = ParamSpec("grad_scale", None, (None, 0.5), "step (and offset) gradient scale; None: 1/sqrt(N Q_P)")
_CLIP_STE = r"\partial y/\partial x = \mathbb{1}[q_{\min} \le r + z \le q_{\max}]"

ENTRIES = (
    Entry(
        name="fake_quant",
        family="uniform",
        fn=fake_quant,
        forward=_fake_quant_forward,
        derivative=_fake_quant_derivative,
        tangent=None,
        diff_argnums=(0,),
        boundaries=_fake_quant_boundaries,
        params=(
            _bits_param(doc="bit width: [2, 16] signed, [1, 16] unsigned"),
            ParamSpec("signed", True, (True, False), _SIGNED_DOC),
            ParamSpec("narrow_range", False, (False, True), "drop the lowest level"),
            _AXIS,
        ),
        args=(
            ArgSpec("scale", _example_step, False, "the step, a positive scalar (or (C,) with axis)"),
            ArgSpec(
                "zero_point", _example_zero_point, False, "the integer representing 0, as a float (or (C,) with axis)"
            ),
        ),
        forward_math=(
            r"r = \operatorname{round}(x s^{-1}),\ "
            r"y = (\operatorname{clip}(r + z, q_{\min}, q_{\max}) - z)\, s"
        ),
        derivative_math=_CLIP_STE,
        kinks=(
            "Derivative 1 exactly where the rounded value lands in [qmin, qmax]; at the tie just "
            "outside each end round-to-even decides. Ties round to even; the sign of zero is kept."
        ),
        reference="Jacob et al., CVPR 2018",
    ),
    Entry(
        name="lsq",
        family="uniform",
        fn=lsq,
        forward=_lsq_forward,
        derivative=_lsq_derivative,
        tangent=None,
        diff_argnums=(0, 1),
        boundaries=_lsq_boundaries,
        params=(
            _bits_param(doc="bit width: [2, 16] signed, [1, 16] unsigned"),
            ParamSpec("signed", True, (True, False), _SIGNED_DOC),
            _GRAD_SCALE,
            _AXIS,
        ),
        args=(ArgSpec("step", _example_step, True, "the learned step, a positive scalar (or (C,) with axis)"),),
        forward_math=r"v = x s^{-1},\ y = \operatorname{round}(\operatorname{clip}(v, -Q_N, Q_P))\, s",
        derivative_math=(
            r"\partial y/\partial x = \mathbb{1}[-Q_N \le v \le Q_P],\ "
            r"\partial y/\partial s = g\,(-Q_N \text{ below},\ \operatorname{round}(v) - v"
            r" \text{ inside},\ Q_P \text{ above})"
        ),
        kinks=(
            "v = -Q_N and v = Q_P are inside (x-derivative 1, step partial 0); just outside the "
            "step partial is -Q_N g or Q_P g. Ties round to even; NaN has both partials 0."
        ),
        reference="Esser et al., ICLR 2020",
    ),
    Entry(
        name="lsq_plus",
        family="uniform",
        fn=lsq_plus,
        forward=_lsq_plus_forward,
        derivative=_lsq_plus_derivative,
        tangent=None,
        diff_argnums=(0, 1, 2),
        boundaries=_lsq_plus_boundaries,
        params=(
            _bits_param(doc="bit width: [2, 16] signed, [1, 16] unsigned"),
            ParamSpec("signed", False, (False, True), _SIGNED_DOC),
            _GRAD_SCALE,
            _AXIS,
        ),
        args=(
            ArgSpec("step", _example_step, True, "the learned step, a positive scalar (or (C,) with axis)"),
            ArgSpec("offset", _example_offset, True, "the learned offset, a scalar (or (C,) with axis)"),
        ),
        forward_math=(
            r"v = (x - \beta) s^{-1},\ "
            r"y = \operatorname{round}(\operatorname{clip}(v, -Q_N, Q_P))\, s + \beta"
        ),
        derivative_math=(
            r"\partial y/\partial x = \mathbb{1}[\text{inside}],\ "
            r"\partial y/\partial s \text{ as LSQ},\ "
            r"\partial y/\partial \beta = g\, \mathbb{1}[\text{not inside}]"
        ),
        kinks="As lsq, shifted by the offset; a zero result is +0.0; NaN has all partials 0.",
        reference="Bhalgat et al., CVPR Workshops 2020",
    ),
    Entry(
        name="pact",
        family="uniform",
        fn=pact,
        forward=_pact_forward,
        derivative=_pact_derivative,
        tangent=None,
        diff_argnums=(0, 1),
        boundaries=_pact_boundaries,
        params=(_bits_param(doc="bit width, [1, 16]"),),
        args=(ArgSpec("alpha", _example_alpha, True, "the learned clipping level, a positive scalar"),),
        forward_math=(
            r"s = \alpha\,\operatorname{fl}(1/n),\ "
            r"y = \operatorname{round}(\operatorname{clip}(x, 0, \alpha)\, s^{-1})\, s"
        ),
        derivative_math=(
            r"\partial y/\partial x = \mathbb{1}[0 \le x < \alpha],\ "
            r"\partial y/\partial \alpha = \mathbb{1}[x \ge \alpha]"
        ),
        kinks="x = 0: derivative 1; x = alpha: derivative 0, alpha partial 1. Ties round to even.",
        reference="Choi et al., arXiv:1805.06085 (2018)",
    ),
    Entry(
        name="dorefa_weights",
        family="uniform",
        fn=dorefa_weights,
        forward=_dorefa_weights_forward,
        derivative=_dorefa_weights_derivative,
        tangent=None,
        diff_argnums=(0,),
        boundaries=_no_fixed_boundaries,
        params=(_bits_param((8, 4, 2, 1), doc="bit width, [1, 16]"),),
        forward_math=(
            r"u = \tanh(w)/(2\max|\tanh w|) + 1/2,\ "
            r"y = 2\operatorname{round}(u n)\operatorname{fl}(1/n) - 1"
        ),
        derivative_math=r"\partial y/\partial w = (1 - \tanh^2 w)/\max|\tanh w|\ (\text{max held constant})",
        kinks=(
            "Level boundaries depend on max|tanh(w)| over the whole input, so boundaries() is empty; "
            "ties round to even; all-zero w is normalised by 1 (u = 1/2, derivative 1)."
        ),
        reference="Zhou et al., arXiv:1606.06160 (2016)",
    ),
    Entry(
        name="dorefa_activations",
        family="uniform",
        fn=dorefa_activations,
        forward=_dorefa_activations_forward,
        derivative=_dorefa_activations_derivative,
        tangent=None,
        diff_argnums=(0,),
        boundaries=_dorefa_activations_boundaries,
        params=(_bits_param((8, 4, 2, 1), doc="bit width, [1, 16]"),),
        forward_math=r"y = \operatorname{round}(\operatorname{clip}(x, 0, 1)\, n)\operatorname{fl}(1/n)",
        derivative_math=r"\partial y/\partial x = \mathbb{1}[0 \le x \le 1]",
        kinks="Derivative 1 at x = 0 and x = 1, 0 just outside; ties (i + 1/2)/n round to even.",
        reference="Zhou et al., arXiv:1606.06160 (2016)",
    ),
)
