r"""Encoders from static values (or a sequence) to spike trains, time-major ``(T, ...)``, with explicit keys."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from stejax import keys

__all__ = ["delta", "latency", "rate"]


def _check_steps(n_steps: Any, where: str) -> int:
    if isinstance(n_steps, bool) or not isinstance(n_steps, int | np.integer) or n_steps < 1:
        raise ValueError(f"{where}: n_steps must be a positive int; got {n_steps!r}.")
    return int(n_steps)


def _check_unit(x: jax.Array, where: str) -> None:
    """Values must be in [0, 1]; checked when they are concrete (under jit they are clipped)."""
    if isinstance(x, jax.core.Tracer):
        return
    a = np.asarray(x)
    bad = ~((a >= 0) & (a <= 1))
    if bad.any():
        raise ValueError(
            f"{where}: values must be intensities in [0, 1] (scale the data first); "
            f"got {float(a[bad].reshape(-1)[0])!r} at index {tuple(int(i) for i in np.argwhere(bad)[0])}."
        )


def _float_input(x: ArrayLike, where: str) -> jax.Array:
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{where}: x must be a floating-point array; got dtype {x.dtype}.")
    return x


def rate(x: ArrayLike, n_steps: int, *, key: jax.Array) -> jax.Array:
    r"""Rate (Bernoulli) coding: at every step each value fires with probability equal to it.

    .. math:: s_{t,i} = \mathbb{1}[u_{t,i} < x_i],\quad u_{t,i} \sim U[0, 1)\ \text{i.i.d.}

    so the expected count of value :math:`x_i` over :math:`T` steps is
    :math:`T x_i`; 0 never fires and 1 always does.

    Args:
      x: intensities in [0, 1], any shape; checked eagerly (a NaN or a value
        outside is an error), clipped to [0, 1] under jit.
      n_steps: :math:`T`.
      key: a typed PRNG key, consumed once.

    Returns:
      ``(T, *x.shape)`` spikes in ``x``'s dtype.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from stejax.snn import rate
      >>> s = rate(jnp.array([0.0, 0.5, 1.0]), 1000, key=jax.random.key(0))
      >>> s.shape, s.dtype, s[:, 0].sum(), s[:, 2].sum(), bool(400 < s[:, 1].sum() < 600)
      ((1000, 3), dtype('float32'), Array(0., dtype=float32), Array(1000., dtype=float32), True)
    """
    x = _float_input(x, "rate")
    n_steps = _check_steps(n_steps, "rate")
    _check_unit(x, "rate")
    keys.check_key(key, what="rate: key")
    u = jax.random.uniform(keys.consume(key, where="snn.rate"), (n_steps, *x.shape), jnp.float32)
    p = jnp.clip(x, 0, 1).astype(jnp.float32)
    return (u < jnp.broadcast_to(p, u.shape)).astype(x.dtype)


def latency(x: ArrayLike, n_steps: int, *, threshold: float = 0.01) -> jax.Array:
    r"""Latency coding: one spike per value, earlier for larger values; none at or below ``threshold``.

    Linear in the value: the spike of :math:`x_i > \text{threshold}` is at step
    :math:`t_i = \operatorname{round}((1 - x_i)(T - 1))`, so 1 fires at step 0
    and values near the threshold fire last. Deterministic (no key).

    Args:
      x: intensities in [0, 1] (checked eagerly).
      n_steps: :math:`T`.
      threshold: values at or below it do not fire (default 0.01).

    Returns:
      ``(T, *x.shape)`` spikes in ``x``'s dtype, at most one per value.

    Example:
      >>> import jax.numpy as jnp
      >>> from stejax.snn import latency
      >>> latency(jnp.array([1.0, 0.5, 0.0]), 5).T
      Array([[1., 0., 0., 0., 0.],
             [0., 0., 1., 0., 0.],
             [0., 0., 0., 0., 0.]], dtype=float32)
    """
    x = _float_input(x, "latency")
    n_steps = _check_steps(n_steps, "latency")
    _check_unit(x, "latency")
    xf = jnp.clip(x, 0, 1).astype(jnp.float32)
    when = jnp.round((1 - xf) * (n_steps - 1)).astype(jnp.int32)
    t = jnp.arange(n_steps, dtype=jnp.int32).reshape((n_steps,) + (1,) * x.ndim)
    fires = (t == jnp.broadcast_to(when, (n_steps, *x.shape))) & jnp.broadcast_to(xf > threshold, (n_steps, *x.shape))
    return fires.astype(x.dtype)


def delta(xs: ArrayLike, *, threshold: float, off_spikes: bool = True) -> jax.Array:
    r"""Delta (change) coding of a time-major sequence: spike where the value moved by at least ``threshold``.

    .. math:: d_t = x_t - x_{t-1}\ (x_{-1} = 0),\quad s_t = \mathbb{1}[d_t \ge \theta] - \mathbb{1}[d_t \le -\theta]

    (the second term only with ``off_spikes``; otherwise a fall gives no spike).

    Args:
      xs: ``(T, ...)`` floating values (NaN is an error when concrete).
      threshold: :math:`\theta > 0`.
      off_spikes: emit -1 on a fall (default True).

    Returns:
      ``(T, ...)`` in ``xs``'s dtype, values in {-1, 0, 1} (or {0, 1}).

    Example:
      >>> import jax.numpy as jnp
      >>> from stejax.snn import delta
      >>> delta(jnp.array([0.0, 0.5, 0.6, 0.1]), threshold=0.3)
      Array([ 0.,  1.,  0., -1.], dtype=float32)
    """
    xs = _float_input(xs, "delta")
    if xs.ndim < 1:
        raise ValueError(f"delta: xs must have a time axis (T, ...); got shape {xs.shape}.")
    if not isinstance(threshold, int | float) or not threshold > 0:
        raise ValueError(f"delta: threshold must be a positive number; got {threshold!r}.")
    if not isinstance(xs, jax.core.Tracer) and bool(jnp.isnan(xs).any()):
        raise ValueError("delta: xs holds NaN.")
    previous = jnp.concatenate([jnp.zeros_like(xs[:1]), xs[:-1]], axis=0)
    d = xs - previous
    on = (d >= threshold).astype(xs.dtype)
    if not off_spikes:
        return on
    return on - (d <= -threshold).astype(xs.dtype)
