r"""Losses and metrics on time-major network outputs ``(T, B, C)`` and integer labels ``(B,)``.

The readout's membrane traces (from a :class:`stejax.snn.LeakyIntegrator`) or
output spikes are reduced over time in one of the usual ways. Each loss is the
mean over the batch, in float32.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

__all__ = [
    "accuracy_first_spike",
    "accuracy_rate",
    "activity_regularizer",
    "ce_mean_membrane",
    "ce_per_step",
    "ce_spike_count",
    "mse_count",
    "spike_stats",
]


def _check(outputs: jax.Array, labels: jax.Array, where: str) -> tuple[jax.Array, jax.Array]:
    if not isinstance(outputs, jax.Array) or outputs.ndim != 3:
        raise ValueError(
            f"{where}: outputs must be time-major (T, B, C); got shape {getattr(outputs, 'shape', type(outputs))}."
        )
    labels = jnp.asarray(labels)
    if labels.shape != outputs.shape[1:2] or not jnp.issubdtype(labels.dtype, jnp.integer):
        raise ValueError(
            f"{where}: labels must be integers of shape ({outputs.shape[1]},) for outputs {outputs.shape}; "
            f"got {labels.dtype} {labels.shape}."
        )
    return outputs.astype(jnp.float32), labels


def _ce(logits: jax.Array, labels: jax.Array) -> jax.Array:
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, labels[:, None], axis=-1)[:, 0]


def ce_mean_membrane(traces: jax.Array, labels: jax.Array) -> jax.Array:
    r"""Cross-entropy of the time-mean membrane: :math:`\text{CE}(\frac{1}{T}\sum_t v_t, y)`, batch mean.

    Example:
      >>> import jax.numpy as jnp
      >>> from stejax.snn import ce_mean_membrane
      >>> v = jnp.zeros((4, 1, 10))
      >>> round(float(ce_mean_membrane(v, jnp.array([3]))), 4)  # uniform: log 10
      2.3026
    """
    v, y = _check(traces, labels, "ce_mean_membrane")
    return jnp.mean(_ce(jnp.mean(v, axis=0), y))


def ce_spike_count(spikes: jax.Array, labels: jax.Array) -> jax.Array:
    r"""Cross-entropy of the spike counts: :math:`\text{CE}(\sum_t s_t, y)`, batch mean."""
    s, y = _check(spikes, labels, "ce_spike_count")
    return jnp.mean(_ce(jnp.sum(s, axis=0), y))


def ce_per_step(outputs: jax.Array, labels: jax.Array) -> jax.Array:
    r"""Per-step (rate) cross-entropy: :math:`\frac{1}{T}\sum_t \text{CE}(o_t, y)`, batch mean."""
    o, y = _check(outputs, labels, "ce_per_step")
    return jnp.mean(jax.vmap(lambda ot: _ce(ot, y))(o))


def mse_count(
    spikes: jax.Array, labels: jax.Array, *, correct_rate: float = 0.8, incorrect_rate: float = 0.2
) -> jax.Array:
    r"""Mean squared error of the spike counts against target counts.

    The target for the true class is ``correct_rate * T`` spikes, for the others
    ``incorrect_rate * T`` (snnTorch's ``mse_count_loss``); the mean is over
    batch and classes.
    """
    s, y = _check(spikes, labels, "mse_count")
    t = s.shape[0]
    target = jnp.where(jax.nn.one_hot(y, s.shape[-1], dtype=jnp.bool_), correct_rate * t, incorrect_rate * t)
    return jnp.mean((jnp.sum(s, axis=0) - target) ** 2)


def accuracy_rate(outputs: jax.Array, labels: jax.Array) -> jax.Array:
    """The fraction of the batch whose largest time-sum (spike count or summed membrane) is the label's."""
    o, y = _check(outputs, labels, "accuracy_rate")
    return jnp.mean(jnp.argmax(jnp.sum(o, axis=0), axis=-1) == y)


def accuracy_first_spike(spikes: jax.Array, labels: jax.Array) -> jax.Array:
    """The fraction of the batch whose first output spike is the label's.

    The prediction is the class that spiked earliest, ties to the lower class
    index; an example where no output neuron spiked counts as wrong.

    Example:
      >>> import jax.numpy as jnp
      >>> from stejax.snn import accuracy_first_spike
      >>> s = jnp.array([[[0, 0], [0, 0]], [[0, 1], [0, 0]], [[1, 1], [0, 0]]], jnp.float32)  # (T=3, B=2, C=2)
      >>> float(accuracy_first_spike(s, jnp.array([1, 0])))  # the second example never spikes
      0.5
    """
    s, y = _check(spikes, labels, "accuracy_first_spike")
    t = s.shape[0]
    steps = jnp.arange(t, dtype=jnp.int32)[:, None, None]
    first = jnp.min(jnp.where(s > 0, jnp.broadcast_to(steps, s.shape), t), axis=0)  # (B, C); T = never
    pred = jnp.argmin(first, axis=-1)
    fired = jnp.min(first, axis=-1) < t
    return jnp.mean(jnp.logical_and(pred == y, fired))


def spike_stats(spikes: jax.Array) -> dict[str, jax.Array]:
    """Spike rate and silent neurons of one layer's ``(T, B, n)`` spikes.

    Returns:
      ``{"rate": spikes per neuron per step (mean over time, batch and neurons),
      "silent_fraction": the fraction of the neurons that never spiked for any
      example of the batch}``, float32 scalars.
    """
    if not isinstance(spikes, jax.Array) or spikes.ndim != 3:
        raise ValueError(f"spike_stats: spikes must be (T, B, n); got shape {getattr(spikes, 'shape', None)}.")
    s = spikes.astype(jnp.float32)
    return {"rate": jnp.mean(s), "silent_fraction": jnp.mean(jnp.max(s, axis=(0, 1)) == 0)}


def activity_regularizer(
    spikes: Sequence[jax.Array], *, low: float = 0.0, high: float = 1.0, strength: float = 1.0
) -> jax.Array:
    r"""A penalty that keeps each layer's activity within bounds.

    For each layer's ``(T, B, n)`` spikes with per-neuron rates :math:`r_i`
    (mean over time and batch) and layer rate :math:`\bar r`:

    .. math:: \text{strength} \sum_\text{layers} \Big(\frac{1}{n}\sum_i \max(0, \text{low} - r_i)^2
              + \max(0, \bar r - \text{high})^2\Big)

    The first term revives silent neurons, the second caps the layer's rate
    (after Zenke & Vogels 2021).
    """
    total = jnp.zeros((), jnp.float32)
    for s in spikes:
        if not isinstance(s, jax.Array) or s.ndim != 3:
            raise ValueError(f"activity_regularizer: each layer's spikes must be (T, B, n); got {jnp.shape(s)}.")
        r = jnp.mean(s.astype(jnp.float32), axis=(0, 1))
        total = total + jnp.mean(jnp.maximum(low - r, 0) ** 2) + jnp.maximum(jnp.mean(r) - high, 0) ** 2
    return strength * total
