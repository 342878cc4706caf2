r"""BitNet b1.58's weight quantiser: absmean scaling, ternary codes, identity straight-through gradient.

Member: ``absmean_ternary``. It differs from :func:`stejax.ternary` (ternary weight
networks) in three ways: the dead band is :math:`\gamma/2` with
:math:`\gamma = \operatorname{mean}|w|` (rounding of :math:`w/\gamma`) instead of
:math:`0.7\,\operatorname{mean}|w|`; the output is rescaled to
:math:`\{-\gamma, 0, +\gamma\}` instead of left at :math:`\{-1, 0, +1\}`; and the
gradient is the plain identity instead of the clipped one.

The arithmetic follows BitNet's published reference implementation step by step
(``WeightQuant.forward`` in Hugging Face transformers'
``integrations/bitnet.py``, the code released with the b1.58 training notes):
``s = 1 / clamp(mean|w|, min=eps)``; ``y = clamp(round(w * s), -1, 1) / s``, in
float32, cast back to the input dtype.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from stejax.estimators._core import surrogate
from stejax.estimators._entry import Entry, ParamSpec
from stejax.estimators.binary import _compute_dtype, _flush_subnormal, _keep_nan, _mean_abs, _positive

__all__ = ["ENTRIES", "absmean_ternary"]

# BitNet's clamp on the mean magnitude (the reference code's clamp_(min=1e-5)).
BITNET_EPS = 1e-5


def _absmean_scale(x: jax.Array, eps: float) -> jax.Array:
    """``s = 1 / max(mean|x|, eps)`` over the whole tensor, in the compute dtype; 0 where it would be subnormal."""
    total, inv_n = _mean_abs(x, None, keepdims=False)
    gamma = jnp.maximum(_flush_subnormal(total * inv_n), jnp.asarray(eps, total.dtype))
    # A mean above 1/tiny gives a subnormal s, which XLA:CPU flushes under jit
    # and not eagerly: flushing it always keeps both the same (and the output NaN).
    return _flush_subnormal(1 / gamma)


def _absmean_forward(x, eps=BITNET_EPS):
    xc = x.astype(_compute_dtype(x))
    s = _absmean_scale(x, eps)
    q = jnp.clip(jnp.round(xc * s), -1, 1)
    return (q / s).astype(x.dtype)


def _absmean_derivative(x, eps=BITNET_EPS):
    del eps  # nothing flows through the scale
    return _keep_nan(x, jnp.ones_like(x))


_absmean_ternary = surrogate(_absmean_forward, _absmean_derivative, name="absmean_ternary")


def absmean_ternary(x: ArrayLike, *, eps: float = BITNET_EPS) -> jax.Array:
    r"""Ternarise weights to :math:`\{-\gamma, 0, +\gamma\}`, BitNet b1.58's absmean quantiser.

    Forward (Ma et al. 2024, eqs. 1-3, as their reference code computes it):

    .. math::
        \gamma = \max\!\big(\tfrac{1}{n}\textstyle\sum_i |x_i|,\ \epsilon\big), \quad
        s = 1/\gamma, \quad
        y = \operatorname{clip}(\operatorname{round}(x s), -1, 1) / s .

    The mean is over the whole tensor (one scale per weight matrix), computed in
    float32 (float64 for float64 inputs) as :math:`\sum|x| \cdot (1/n)` with
    subnormal terms flushed to zero; ``round`` ties to even, so
    :math:`|x| = \gamma/2` exactly gives 0. The result is computed in that dtype
    and rounded once to ``x``'s dtype. A zero code keeps the sign of
    :math:`x s` (``-0.0`` for a small negative weight), as the reference does.
    Codes: ``clip(round(x s), -1, 1)`` are the integers :math:`\{-1, 0, +1\}`
    stored at 1.58 bits. A NaN or infinity anywhere makes :math:`\gamma` NaN or
    infinite and so the whole output NaN; so does a mean above
    :math:`1/\text{tiny}` (about :math:`8.5 \times 10^{37}` in float32), where
    :math:`s` would be subnormal: it is flushed to 0, eagerly and under jit alike.

    Surrogate: the identity (BitNet's straight-through estimator), with nothing
    through the scale (:math:`\gamma` is a constant for differentiation),

    .. math:: \partial y / \partial x = 1,

    everywhere, with no clipping band; NaN at a NaN input.

    Differs from :func:`stejax.ternary` (TWN): dead band :math:`\gamma/2`
    (not :math:`0.7\gamma`), rescaled output, unclipped gradient.

    Args:
      x: floating-point array (a weight tensor), any shape.
      eps: the least value of :math:`\gamma`, > 0 (default ``1e-5``, BitNet's);
        an all-zero tensor maps to zeros.

    Returns:
      An array of ``x``'s shape and dtype.

    Raises:
      TypeError: ``eps`` is not a real number.
      ValueError: ``eps`` <= 0.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from stejax.estimators.absmean import absmean_ternary
      >>> absmean_ternary(jnp.array([-2.0, -0.4, 0.1, 0.5, 1.0]))
      Array([-0.8, -0. ,  0. ,  0.8,  0.8], dtype=float32)
      >>> jax.grad(lambda w: absmean_ternary(w).sum())(jnp.array([-2.0, 3.0]))
      Array([1., 1.], dtype=float32)

    Reference:
      S. Ma, H. Wang, L. Ma, L. Wang, W. Wang, S. Huang, L. Dong, R. Wang, J. Xue,
      F. Wei, "The Era of 1-bit LLMs: All Large Language Models are in 1.58 Bits",
      arXiv:2402.17764, 2024; reference code: ``WeightQuant`` in Hugging Face
      transformers 4.57.1, ``transformers/integrations/bitnet.py``.
    """
    return _absmean_ternary(x, eps=_positive("absmean_ternary", "eps", eps))


def _zero(**_: Any) -> tuple[float, ...]:
    # The ties +-gamma/2 depend on the input; only 0 is a fixed point of interest.
    return (0.0,)


ENTRIES = (
    Entry(
        name="absmean_ternary",
        family="binary",
        fn=absmean_ternary,
        forward=_absmean_forward,
        derivative=_absmean_derivative,
        tangent=None,
        diff_argnums=(0,),
        boundaries=_zero,
        params=(ParamSpec("eps", BITNET_EPS, (BITNET_EPS, 1e-2), "Least value of mean|x|; > 0."),),
        forward_math=(
            r"y = \operatorname{clip}(\operatorname{round}(x/\gamma), -1, 1)\,\gamma,\ "
            r"\gamma = \max(\overline{|x|}, \epsilon)"
        ),
        derivative_math=r"\partial y/\partial x = 1",
        kinks=(
            "The forward jumps at +-gamma/2 (ties round to even, so exactly gamma/2 maps to 0), gamma = mean|x| "
            "over the tensor. The derivative is 1 everywhere; the scale carries no gradient."
        ),
        reference="Ma et al., The Era of 1-bit LLMs (BitNet b1.58), arXiv:2402.17764 (2024)",
    ),
)
