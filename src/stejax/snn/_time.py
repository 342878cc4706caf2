r"""The time loop: ``jax.lax.scan`` of a step function over time, with checkpointing and truncated BPTT."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["run"]


def run(
    step: Callable[[Any, jax.Array], tuple[Any, Any]],
    state: Any,
    xs: jax.Array,
    *,
    time_axis: int = 0,
    unroll: int = 1,
    checkpoint: bool = False,
    truncate: int | None = None,
) -> tuple[Any, Any]:
    r"""Run ``step(state, x_t) -> (state, out_t)`` over the time axis of ``xs``.

    One ``jax.lax.scan``: the outputs are stacked on the same time axis as the
    input (time-major ``(T, B, ...)`` with ``time_axis=0``, batch-major
    ``(B, T, ...)`` with ``time_axis=1``). Everything is traceable, so a whole
    epoch of steps that call ``run`` jits as one program.

    **Truncated backpropagation through time** (``truncate=K``): the state is
    cut from the gradient (``jax.lax.stop_gradient``) at the start of steps
    :math:`K, 2K, \dots`, so the gradient of any output reaches back at most to
    the start of its window of :math:`K` steps: :math:`\partial\, \text{out}_t /
    \partial x_{t'} = 0` for :math:`\lfloor t'/K \rfloor < \lfloor t/K \rfloor`.
    The forward values are unchanged. ``truncate=None`` (default) is full BPTT.

    Args:
      step: the step function; with a neuron, ``functools.partial(neuron.step, params)``.
      state: the initial state (any pytree).
      xs: the inputs, a floating array with time on ``time_axis`` (a pytree of
        such arrays also works; all share the time axis).
      time_axis: 0 (time-major, default) or 1 (batch-major).
      unroll: ``jax.lax.scan``'s unrolling factor (default 1).
      checkpoint: recompute each step in the backward pass instead of storing
        its intermediates (``jax.checkpoint`` of the step): less memory, one
        more forward per step. Values and gradients are unchanged.
      truncate: the BPTT window :math:`K \ge 1`, or None.

    Returns:
      ``(final state, outputs)``, the outputs with time on ``time_axis``.

    Raises:
      ValueError: a bad ``time_axis``, ``unroll`` or ``truncate``, or inputs
        without that axis.

    Example:
      >>> import functools, jax.numpy as jnp
      >>> from stejax.snn import Leaky, run
      >>> lif = Leaky()
      >>> params = lif.init_params(2, decay=0.5)
      >>> xs = jnp.full((4, 2), 0.8)  # T = 4, two neurons
      >>> v, spikes = run(functools.partial(lif.step, params), lif.init_state((2,)), xs)
      >>> spikes[:, 0]
      Array([0., 1., 0., 1.], dtype=float32)
    """
    if time_axis not in (0, 1):
        raise ValueError(f"run: time_axis must be 0 (time-major) or 1 (batch-major); got {time_axis!r}.")
    if isinstance(unroll, bool) or not isinstance(unroll, int) or unroll < 1:
        raise ValueError(f"run: unroll must be a positive int; got {unroll!r}.")
    if truncate is not None and (isinstance(truncate, bool) or not isinstance(truncate, int) or truncate < 1):
        raise ValueError(f"run: truncate must be None or a positive int (the BPTT window); got {truncate!r}.")
    leaves = jax.tree.leaves(xs)
    if not leaves or any(jnp.ndim(a) <= time_axis for a in leaves):
        raise ValueError(f"run: the inputs need a time axis {time_axis}; got shapes {[jnp.shape(a) for a in leaves]}.")
    if time_axis == 1:
        xs = jax.tree.map(lambda a: jnp.swapaxes(a, 0, 1), xs)
    n_steps = leaves[0].shape[time_axis]

    body = jax.checkpoint(step) if checkpoint else step
    if truncate is None:
        final, outs = lax.scan(lambda c, x: body(c, x), state, xs, unroll=unroll)
    else:

        def truncated(c, tx):
            t, x = tx
            cut = jnp.logical_and(t > 0, t % truncate == 0)
            c = jax.tree.map(lambda a: jnp.where(cut, lax.stop_gradient(a), a), c)
            return body(c, x)

        final, outs = lax.scan(truncated, state, (jnp.arange(n_steps, dtype=jnp.int32), xs), unroll=unroll)
    if time_axis == 1:
        outs = jax.tree.map(lambda a: jnp.swapaxes(a, 0, 1), outs)
    return final, outs
