r"""The spike function of a neuron: the catalog's Heaviside with a named surrogate, or your own.

A :class:`Spike` is a small frozen (hashable) description, so a neuron that holds
one can be a static argument of ``jax.jit``. Its names are the catalog's six
spiking surrogates (``fast_sigmoid``, ``atan``, ``sigmoid``, ``triangular``,
``boxcar``, ``superspike``; see :func:`stejax.heaviside`) and two references:

* ``identity``: the straight-through estimator, :math:`\partial H/\partial x = 1`
  everywhere;
* ``no_surrogate``: the true derivative of the step almost everywhere,
  :math:`\partial H/\partial x = 0`, so no gradient ever reaches the weights
  below a spiking layer (what training looks like without a surrogate).

All share the forward :math:`H(x) = \mathbb{1}[x > 0]` in ``x``'s dtype.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from stejax.estimators._core import surrogate
from stejax.estimators.spiking import heaviside

__all__ = ["REFERENCE_SPIKES", "SURROGATES", "Spike"]

SURROGATES = ("fast_sigmoid", "atan", "sigmoid", "triangular", "boxcar", "superspike")
"""The catalog's spiking surrogates, by the short names :func:`stejax.heaviside` takes."""

REFERENCE_SPIKES = ("identity", "no_surrogate")
"""The two reference spike functions: straight-through (derivative 1) and none (derivative 0)."""


def _step_forward(x):
    # The catalog's exact forward (read from the bits; NaN stays NaN), called for its value only.
    return jax.lax.stop_gradient(heaviside(x, "boxcar"))


_identity = surrogate(_step_forward, lambda x: jnp.ones_like(x), name="heaviside_identity")
_no_surrogate = surrogate(_step_forward, lambda x: jnp.zeros_like(x), name="heaviside_no_surrogate")


@dataclasses.dataclass(frozen=True)
class Spike:
    """A spike function: the Heaviside step and the surrogate gradient it carries.

    Attributes:
      surrogate: one of :data:`SURROGATES` or :data:`REFERENCE_SPIKES`
        (default ``"fast_sigmoid"``); ignored when ``fn`` is given.
      params: the surrogate's static parameters as ``(("slope", 100.0),)``
        (default: the catalog's defaults).
      fn: instead, your own spike function ``x -> spikes`` (for example a
        :func:`stejax.surrogate` you have checked with
        :func:`stejax.verify.check_surrogate`). It must return an array of
        ``x``'s shape and dtype.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from stejax.snn import Spike
      >>> spike = Spike("fast_sigmoid", (("slope", 100.0),))
      >>> spike(jnp.array([-0.5, 0.0, 0.5]))
      Array([0., 0., 1.], dtype=float32)
      >>> jax.grad(lambda x: Spike("identity")(x).sum())(jnp.array([-3.0, 3.0]))
      Array([1., 1.], dtype=float32)
    """

    surrogate: str = "fast_sigmoid"
    params: tuple[tuple[str, float], ...] = ()
    fn: Callable[[jax.Array], jax.Array] | None = None

    def __post_init__(self) -> None:
        if self.fn is not None:
            if not callable(self.fn):
                raise TypeError(f"Spike: fn must be callable (x -> spikes); got {type(self.fn).__name__}.")
            return
        known = SURROGATES + REFERENCE_SPIKES
        if self.surrogate not in known:
            raise ValueError(f"Spike: unknown surrogate {self.surrogate!r}; expected one of {known}.")
        if self.surrogate in REFERENCE_SPIKES and self.params:
            raise TypeError(f"Spike: {self.surrogate!r} takes no parameters; got {dict(self.params)}.")
        if not isinstance(self.params, tuple) or not all(
            isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) for p in self.params
        ):
            raise TypeError(f"Spike: params must be a tuple of (name, value) pairs; got {self.params!r}.")
        if self.surrogate in SURROGATES:
            heaviside(jnp.zeros((), jnp.float32), self.surrogate, **dict(self.params))  # checks the names and ranges

    @property
    def name(self) -> str:
        """The surrogate's short name, ``"custom"`` for a user function."""
        return "custom" if self.fn is not None else self.surrogate

    def __call__(self, x: jax.Array) -> jax.Array:
        if self.fn is not None:
            y = self.fn(x)
            if getattr(y, "shape", None) != x.shape or getattr(y, "dtype", None) != x.dtype:
                raise ValueError(
                    f"Spike: the spike function must keep its input's shape and dtype; "
                    f"got {getattr(y, 'shape', '?')} {getattr(y, 'dtype', '?')} from {x.shape} {x.dtype}."
                )
            return y
        if self.surrogate == "identity":
            return _identity(x)
        if self.surrogate == "no_surrogate":
            return _no_surrogate(x)
        return heaviside(x, self.surrogate, **dict(self.params))


def as_spike(spike: Any) -> Spike:
    """``spike`` as a :class:`Spike`: a Spike, a surrogate's name, or a callable."""
    if isinstance(spike, Spike):
        return spike
    if isinstance(spike, str):
        return Spike(spike)
    if callable(spike):
        return Spike(fn=spike)
    raise TypeError(f"spike must be a Spike, a surrogate name or a callable; got {type(spike).__name__}.")
