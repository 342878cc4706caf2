r"""A feed-forward spiking network: dense layers of LIF neurons and a readout, spiking or not.

.. code-block:: text

   input spikes (T, B, F) -> [dense -> Leaky] x L -> dense -> Leaky           -> output spikes (T, B, C)
                                                    dense -> LeakyIntegrator -> readout membrane (T, B, C)

**The readout** (``NetConfig.readout``): ``"lif"`` is a spiking output layer of
the hidden layers' neuron, read by its spike counts (the loss
:func:`stejax.snn.ce_spike_count`); then every trainable weight sits behind a
spike, so without a surrogate (``no_surrogate``) no weight receives any
gradient and the network stays at its initialisation. ``"integrator"`` is the
non-spiking leaky integrator read by its membrane
(:func:`stejax.snn.ce_mean_membrane`): the output weights then learn even
when no gradient crosses a spike, a linear classifier on the hidden spikes.
The non-spiking reference (``spike=None``) always has the integrator readout.

The time loop runs **layer by layer**: a layer's input currents for all
:math:`T` steps are one matrix product ``(T*B, F) @ (F, n)``, and only the
neuron's elementwise step is scanned over time (:func:`stejax.snn.run`). For
a feed-forward network this is the same computation as scanning the whole
network step by step (each layer at step :math:`t` needs only the layer below
at step :math:`t`), with the products batched over time. The non-spiking
reference (``spike=None``) replaces each LIF by a ReLU of the same currents;
everything else (encoder, readout, loss, loop) is shared.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from stejax import keys
from stejax.snn._neurons import Leaky, LeakyIntegrator, LeakyParams
from stejax.snn._spike import Spike, as_spike
from stejax.snn._time import run

__all__ = ["READOUTS", "Dense", "NetConfig", "NetOutput", "NetParams", "forward", "init_net"]

READOUTS = ("integrator", "lif")
"""The readouts of :class:`NetConfig`: the non-spiking leaky integrator, or a spiking LIF layer."""


class Dense(NamedTuple):
    """One dense layer."""

    w: jax.Array  # float32 (fan_in, fan_out)
    b: jax.Array  # float32 (fan_out,)


class NetParams(NamedTuple):
    """The network's parameters: one dense layer and one neuron set per hidden layer, then the readout."""

    layers: tuple[Dense, ...]
    neurons: tuple[LeakyParams, ...]
    readout: Dense
    readout_neuron: LeakyParams


class NetOutput(NamedTuple):
    """What :func:`forward` returns, time-major."""

    traces: jax.Array  # (T, B, C): the readout membrane ("integrator") or the output spikes ("lif")
    spikes: tuple[jax.Array, ...]  # one (T, B, n) per hidden layer (ReLU activations for the reference)


@dataclasses.dataclass(frozen=True)
class NetConfig:
    r"""The network's shape and static choices (hashable: a static argument of ``jax.jit``).

    Attributes:
      in_features, n_classes: input and output widths.
      hidden: the hidden layers' widths (default one layer of 128).
      spike: the hidden neurons' spike function (a :class:`Spike`, a name or a
        callable), or None for the non-spiking reference (ReLU).
      reset, reset_grad: the LIF's reset (see :class:`Leaky`).
      decay, threshold: initial LIF decay and threshold (0.9, 1.0).
      readout: ``"integrator"`` (default: the non-spiking leaky integrator,
        read by its membrane) or ``"lif"`` (a spiking output layer of the hidden
        neuron, read by its spike counts); see the module. The non-spiking
        reference takes only ``"integrator"``.
      readout_decay: initial readout decay (0.9); the LIF readout's threshold is ``threshold``.
      readout_drive: the LIF readout's initial bias :math:`b`, as a fraction
        :math:`d` of the drive that holds a neuron at threshold: :math:`b = d\,
        \theta (1 - \beta)` (default :math:`d = 1`: each output neuron starts at its
        threshold on average, where every surrogate's gradient is largest;
        0 starts at rest). Unused by the
        integrator readout, whose bias starts at 0.
      per_neuron: one decay and threshold per neuron (default True) or one per layer.
      learn_decay, learn_threshold: whether they are trained (default True);
        if not, their gradient is stopped.
      weight_gain: weights are normal with standard deviation
        ``weight_gain / sqrt(fan_in)`` (default 1.0); biases start at 0.
      unroll, checkpoint, truncate: passed to :func:`stejax.snn.run`. ``checkpoint``
        defaults to True here: the backward pass recomputes each step from the
        stored membrane instead of loading three more stored ``(T, B, n)`` arrays
        per layer (the spikes again, the surrogate's derivative, the previous
        membrane), which on CPU is faster as well as smaller: the two-layer step
        of the Spyx comparison takes 20% less CPU time at T = 25 and 58% less at
        T = 100 (``docs/snn.md``, "Speed").
    """

    in_features: int
    n_classes: int
    hidden: tuple[int, ...] = (128,)
    spike: Spike | str | None = "fast_sigmoid"
    reset: str = "subtract"
    reset_grad: bool = False
    decay: float = 0.9
    threshold: float = 1.0
    readout: str = "integrator"
    readout_decay: float = 0.9
    readout_drive: float = 1.0
    per_neuron: bool = True
    learn_decay: bool = True
    learn_threshold: bool = True
    weight_gain: float = 1.0
    unroll: int = 1
    checkpoint: bool = True
    truncate: int | None = None

    def __post_init__(self) -> None:
        if self.spike is not None:
            object.__setattr__(self, "spike", as_spike(self.spike))
        for name in ("in_features", "n_classes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"NetConfig: {name} must be a positive int; got {v!r}.")
        if not isinstance(self.hidden, tuple) or not all(isinstance(h, int) and h >= 1 for h in self.hidden):
            raise ValueError(f"NetConfig: hidden must be a tuple of positive ints; got {self.hidden!r}.")
        if self.readout not in READOUTS:
            raise ValueError(f"NetConfig: readout must be one of {READOUTS}; got {self.readout!r}.")
        if self.spike is None and self.readout != "integrator":
            raise ValueError(
                f"NetConfig: the non-spiking reference (spike=None) has the 'integrator' readout; got {self.readout!r}."
            )
        self.neuron  # noqa: B018 - validates reset and reset_grad

    @property
    def neuron(self) -> Leaky | None:
        """The hidden layers' neuron, None for the non-spiking reference."""
        if self.spike is None:
            return None
        return Leaky(self.spike, self.reset, self.reset_grad)

    @property
    def widths(self) -> tuple[int, ...]:
        return (self.in_features, *self.hidden, self.n_classes)


def init_net(config: NetConfig, *, key: jax.Array) -> NetParams:
    """Initial parameters: one subkey per dense layer (split from ``key``)."""
    keys.check_key(key, what="init_net: key")
    widths = config.widths
    layer_keys = keys.split(key, len(widths) - 1, where="snn.init_net: one key per dense layer")
    dense = []
    for k, (fan_in, fan_out) in zip(layer_keys, itertools.pairwise(widths), strict=True):
        w = (config.weight_gain / math.sqrt(fan_in)) * jax.random.normal(
            keys.consume(k, where="snn.init_net"), (fan_in, fan_out), jnp.float32
        )
        dense.append(Dense(w, jnp.zeros((fan_out,), jnp.float32)))
    lif = Leaky()
    neurons = tuple(
        lif.init_params(n, decay=config.decay, threshold=config.threshold, per_neuron=config.per_neuron)
        for n in config.hidden
    )
    if config.readout == "lif":
        bias = config.readout_drive * config.threshold * (1.0 - config.readout_decay)
        dense[-1] = Dense(dense[-1].w, jnp.full((config.n_classes,), bias, jnp.float32))
        readout_neuron = lif.init_params(
            config.n_classes, decay=config.readout_decay, threshold=config.threshold, per_neuron=config.per_neuron
        )
    else:
        readout_neuron = LeakyIntegrator().init_params(
            config.n_classes, decay=config.readout_decay, per_neuron=config.per_neuron
        )
    return NetParams(tuple(dense[:-1]), neurons, dense[-1], readout_neuron)


def _currents(h: jax.Array, layer: Dense) -> jax.Array:
    t, b, f = h.shape
    z = jnp.matmul(h.reshape(t * b, f), layer.w.astype(h.dtype)).reshape(t, b, -1)
    return z + jnp.broadcast_to(layer.b.astype(h.dtype), z.shape)


def _trained(config: NetConfig, p: LeakyParams) -> LeakyParams:
    """``p`` with the gradient of the decay and threshold stopped where the config does not train them."""
    return LeakyParams(
        p.decay_logit if config.learn_decay else lax.stop_gradient(p.decay_logit),
        p.threshold if config.learn_threshold else lax.stop_gradient(p.threshold),
    )


def forward(config: NetConfig, params: NetParams, spikes_in: jax.Array) -> NetOutput:
    """The network on time-major input ``(T, B, in_features)``; outputs in the input's dtype.

    Raises:
      ValueError: the input is not ``(T, B, in_features)``.
    """
    if not isinstance(spikes_in, jax.Array) or spikes_in.ndim != 3 or spikes_in.shape[-1] != config.in_features:
        raise ValueError(
            f"forward: the input must be time-major (T, B, {config.in_features}); "
            f"got shape {getattr(spikes_in, 'shape', type(spikes_in))}."
        )
    h = spikes_in
    hidden_out = []
    loop = functools.partial(run, unroll=config.unroll, checkpoint=config.checkpoint, truncate=config.truncate)
    for layer, neuron_params in zip(params.layers, params.neurons, strict=True):
        z = _currents(h, layer)
        if config.neuron is None:
            h = jax.nn.relu(z)
        else:
            neuron = config.neuron
            p = _trained(config, neuron_params)
            _, h = loop(neuron.bind(p, z.shape[1:], z.dtype), neuron.init_state(z.shape[1:], z.dtype), z)
        hidden_out.append(h)
    readout: Leaky | LeakyIntegrator | None = config.neuron if config.readout == "lif" else LeakyIntegrator()
    assert readout is not None  # NetConfig refuses a LIF readout without a spike function
    rp = _trained(config, params.readout_neuron)
    z = _currents(h, params.readout)
    _, traces = loop(readout.bind(rp, z.shape[1:], z.dtype), readout.init_state(z.shape[1:], z.dtype), z)
    return NetOutput(traces, tuple(hidden_out))


def n_params(params: Any) -> int:
    """The number of scalars in a parameter tree."""
    return sum(int(a.size) for a in jax.tree.leaves(params))
