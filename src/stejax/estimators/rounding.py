"""Rounding with the straight-through estimator: round, floor, ceil, stochastic."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from stejax.estimators._core import surrogate
from stejax.estimators._entry import Entry

__all__ = ["ENTRIES", "ceil_ste", "floor_ste", "round_ste", "stochastic_round"]


def _identity_derivative(x, **_):
    return jnp.ones_like(x)


def _round_forward(x):
    # jnp.round with its default decimals=0 left out, so nothing else is traced.
    return jnp.round(x)


def _floor_forward(x):
    return jnp.floor(x)


def _ceil_forward(x):
    return jnp.ceil(x)


def _stochastic_round_forward(x, *, key):
    # floor(x) + 1[u < x - floor(x)] equals floor(x + u) in exact arithmetic but
    # never rounds x + u in floating point, which would bias large or low-precision
    # inputs. The comparison runs in float32 (float64 for float64 inputs) so that the
    # probability of rounding up resolves to 2^-24 in every dtype.
    cmp_dtype = jnp.float64 if x.dtype == jnp.float64 else jnp.float32
    lower = jnp.floor(x)
    u = jax.random.uniform(key, x.shape, cmp_dtype)
    up = u < (x - lower).astype(cmp_dtype)
    return jnp.where(up, lower + 1, lower)


_round = surrogate(_round_forward, _identity_derivative, name="round_ste")
_floor = surrogate(_floor_forward, _identity_derivative, name="floor_ste")
_ceil = surrogate(_ceil_forward, _identity_derivative, name="ceil_ste")
_stochastic_round = surrogate(_stochastic_round_forward, _identity_derivative, name="stochastic_round", random=True)


def round_ste(x: ArrayLike) -> jax.Array:
    r"""Round to the nearest integer, ties to even, with a straight-through gradient.

    Forward: :math:`y = \operatorname{round}(x)`, exactly ``jnp.round(x)``: ties
    go to the even integer (0.5 -> 0, 1.5 -> 2, -2.5 -> -2), the sign of zero is
    kept (-0.3 -> -0.0), and infinities and NaN pass through.

    Surrogate: :math:`\partial y / \partial x = 1` everywhere (the STE of
    Bengio et al.), including at the ties :math:`k + 1/2`, at infinities and at NaN.

    Args:
      x: floating-point array (float16, bfloat16, float32 or float64).

    Returns:
      An array of ``x``'s shape and dtype.

    Raises:
      TypeError: ``x`` is an integer or boolean array.

    Example:
      >>> import jax, stejax
      >>> float(stejax.round_ste(1.7)), float(jax.grad(stejax.round_ste)(1.7))
      (2.0, 1.0)
      >>> float(jax.jvp(stejax.round_ste, (1.7,), (3.0,))[1])
      3.0

    Reference:
      Y. Bengio, N. Léonard, A. Courville, "Estimating or Propagating Gradients
      Through Stochastic Neurons for Conditional Computation", arXiv:1308.3432, 2013.
    """
    return _round(x)


def floor_ste(x: ArrayLike) -> jax.Array:
    r"""Floor with a straight-through gradient.

    Forward: :math:`y = \lfloor x \rfloor`, exactly ``jnp.floor(x)`` (-0.0 stays
    -0.0, -0.5 -> -1, infinities and NaN pass through).

    Subnormal inputs: XLA on CPU reads them as zero (flush to zero), so
    ``floor_ste(-1e-45)`` is ``-0.0`` there, exactly as ``jnp.floor`` gives it; the
    estimator follows ``jnp.floor`` bit for bit, not NumPy.

    Surrogate: :math:`\partial y / \partial x = 1` everywhere, including at the
    integers where the forward jumps.

    Args:
      x: floating-point array.

    Returns:
      An array of ``x``'s shape and dtype.

    Example:
      >>> import stejax
      >>> float(stejax.floor_ste(1.7))
      1.0

    Reference:
      Bengio et al., arXiv:1308.3432, 2013.
    """
    return _floor(x)


def ceil_ste(x: ArrayLike) -> jax.Array:
    r"""Ceiling with a straight-through gradient.

    Forward: :math:`y = \lceil x \rceil`, exactly ``jnp.ceil(x)`` (-0.5 -> -0.0,
    infinities and NaN pass through).

    Subnormal inputs: XLA on CPU reads them as zero (flush to zero), so
    ``ceil_ste(1e-45)`` is ``0.0`` there, exactly as ``jnp.ceil`` gives it; the
    estimator follows ``jnp.ceil`` bit for bit, not NumPy.

    Surrogate: :math:`\partial y / \partial x = 1` everywhere, including at the
    integers where the forward jumps.

    Args:
      x: floating-point array.

    Returns:
      An array of ``x``'s shape and dtype.

    Example:
      >>> import stejax
      >>> float(stejax.ceil_ste(1.2))
      2.0

    Reference:
      Bengio et al., arXiv:1308.3432, 2013.
    """
    return _ceil(x)


def stochastic_round(x: ArrayLike, *, key: jax.Array) -> jax.Array:
    r"""Unbiased stochastic rounding with a straight-through gradient.

    Forward: :math:`y = \lfloor x \rfloor + \mathbb{1}[u < x - \lfloor x \rfloor]`
    with :math:`u \sim U[0, 1)`, one draw per element. This is
    :math:`\lfloor x + u \rfloor` computed without rounding :math:`x + u`, so
    :math:`\mathbb{E}[y] = x`. Integers (and infinities) are returned unchanged;
    NaN stays NaN; the sign of zero is kept.

    Surrogate: :math:`\partial y / \partial x = 1` everywhere.

    Args:
      x: floating-point array.
      key: a PRNG key (required keyword). The same key gives the same draw.

    Returns:
      An array of ``x``'s shape and dtype.

    Example:
      >>> import jax, stejax
      >>> float(stejax.stochastic_round(2.0, key=jax.random.key(0)))
      2.0

    Reference:
      M. Gupta, A. Agrawal, K. Gopalakrishnan, P. Narayanan, "Deep Learning with
      Limited Numerical Precision", ICML 2015.
    """
    return _stochastic_round(x, key=key)


def _integer_ties(**_) -> tuple[float, ...]:
    return (-2.5, -1.5, -0.5, 0.5, 1.5, 2.5)


def _integers(**_) -> tuple[float, ...]:
    return (-2.0, -1.0, 0.0, 1.0, 2.0)


_REFERENCE_STE = "Bengio, Léonard, Courville, arXiv:1308.3432 (2013)"

ENTRIES = (
    Entry(
        name="round_ste",
        family="rounding",
        fn=round_ste,
        forward=_round_forward,
        derivative=_identity_derivative,
        tangent=None,
        diff_argnums=(0,),
        boundaries=_integer_ties,
        forward_math=r"y = \operatorname{round}(x)\ \text{(ties to even)}",
        derivative_math=r"\partial y/\partial x = 1",
        kinks="Ties k + 1/2 round to the even integer; the derivative is 1 there too.",
        reference=_REFERENCE_STE,
    ),
    Entry(
        name="floor_ste",
        family="rounding",
        fn=floor_ste,
        forward=_floor_forward,
        derivative=_identity_derivative,
        tangent=None,
        diff_argnums=(0,),
        boundaries=_integers,
        forward_math=r"y = \lfloor x \rfloor",
        derivative_math=r"\partial y/\partial x = 1",
        kinks="Jumps at the integers, where the value is the integer itself; derivative 1.",
        reference=_REFERENCE_STE,
    ),
    Entry(
        name="ceil_ste",
        family="rounding",
        fn=ceil_ste,
        forward=_ceil_forward,
        derivative=_identity_derivative,
        tangent=None,
        diff_argnums=(0,),
        boundaries=_integers,
        forward_math=r"y = \lceil x \rceil",
        derivative_math=r"\partial y/\partial x = 1",
        kinks="Jumps at the integers, where the value is the integer itself; derivative 1.",
        reference=_REFERENCE_STE,
    ),
    Entry(
        name="stochastic_round",
        family="rounding",
        fn=stochastic_round,
        forward=_stochastic_round_forward,
        derivative=_identity_derivative,
        tangent=None,
        diff_argnums=(0,),
        boundaries=_integers,
        random=True,
        forward_math=r"y = \lfloor x \rfloor + \mathbb{1}[u < x - \lfloor x \rfloor],\ u \sim U[0,1)",
        derivative_math=r"\partial y/\partial x = 1",
        kinks="Integers are fixed points; E[y] = x.",
        reference="Gupta et al., ICML 2015",
    ),
)
