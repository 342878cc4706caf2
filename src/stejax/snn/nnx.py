"""Flax NNX modules around the pure neuron steps of :mod:`stejax.snn` (needs ``stejax[flax]``).

Each module holds its neuron's parameters as ``nnx.Param`` (trained) or as
:class:`Fixed` variables (``learn_decay=False`` / ``learn_threshold=False``: not
``nnx.Param``, so an ``nnx.Optimizer(..., wrt=nnx.Param)`` leaves them alone),
and delegates to the pure step: ``module(state, x) -> (state, out)`` is exactly
``neuron.step(params, state, x)``, and ``module.run(xs)`` is
:func:`stejax.snn.run` over time.

Example:
  >>> import jax.numpy as jnp
  >>> from flax import nnx
  >>> from stejax.snn.nnx import Leaky
  >>> lif = Leaky(3, spike="atan", decay=0.5)
  >>> state, spikes = lif.run(jnp.full((4, 1, 3), 0.8))   # (T, B, n)
  >>> spikes[:, 0, 0]
  Array([0., 1., 0., 1.], dtype=float32)
  >>> sorted(nnx.state(lif, nnx.Param).keys())
  ['decay_logit', 'threshold']
"""

from __future__ import annotations

from typing import Any, Protocol

import jax
from flax import nnx

from stejax.snn import _neurons
from stejax.snn._spike import Spike
from stejax.snn._time import run as _run

__all__ = ["AdaptiveLeaky", "Fixed", "Leaky", "LeakyIntegrator", "RecurrentLeaky", "Synaptic"]


class Fixed(nnx.Variable):
    """A neuron parameter that is not trained (decay or threshold with ``learn_*=False``)."""


def _var(value: jax.Array, learn: bool) -> nnx.Variable:
    return nnx.Param(value) if learn else Fixed(value)


class _NeuronStep(Protocol):
    """What a module needs of its pure neuron (:class:`stejax.snn.Leaky` and the others)."""

    def init_state(self, shape: tuple[int, ...], dtype: Any = ...) -> Any: ...

    def step(self, params: Any, state: Any, x: jax.Array) -> tuple[Any, jax.Array]: ...

    def bind(self, params: Any, shape: tuple[int, ...], dtype: Any = ...) -> Any: ...


class _Neuron(nnx.Module):
    _params_type: Any = None
    neuron: _NeuronStep  # set by each subclass's __init__

    def _params(self) -> Any:
        return self._params_type(*(getattr(self, f)[...] for f in self._params_type._fields))

    def init_state(self, shape: tuple[int, ...], dtype: Any = jax.numpy.float32) -> Any:
        """The resting state for inputs of ``shape`` (``(..., n)``)."""
        return self.neuron.init_state(shape, dtype)

    def __call__(self, state: Any, x: jax.Array) -> tuple[Any, jax.Array]:
        """One time step, ``(state, x) -> (state, out)``."""
        return self.neuron.step(self._params(), state, x)

    def run(self, xs: jax.Array, *, state: Any = None, time_axis: int = 0, **loop: Any) -> tuple[Any, jax.Array]:
        """All time steps of ``xs`` (time on ``time_axis``); ``loop`` goes to :func:`stejax.snn.run`."""
        shape = xs.shape[1:] if time_axis == 0 else (xs.shape[0], *xs.shape[2:])
        if state is None:
            state = self.init_state(shape, xs.dtype)
        step = self.neuron.bind(self._params(), shape, xs.dtype)
        return _run(step, state, xs, time_axis=time_axis, **loop)


class Leaky(_Neuron):
    """:class:`stejax.snn.Leaky` (LIF) as an NNX module of ``n`` neurons."""

    _params_type = _neurons.LeakyParams

    def __init__(
        self,
        n: int,
        *,
        spike: Spike | str = "fast_sigmoid",
        reset: str = "subtract",
        reset_grad: bool = False,
        decay: float = 0.9,
        threshold: float = 1.0,
        per_neuron: bool = False,
        learn_decay: bool = True,
        learn_threshold: bool = True,
    ):
        self.neuron = _neurons.Leaky(spike, reset, reset_grad)
        p = self.neuron.init_params(n, decay=decay, threshold=threshold, per_neuron=per_neuron)
        self.decay_logit = _var(p.decay_logit, learn_decay)
        self.threshold = _var(p.threshold, learn_threshold)


class Synaptic(_Neuron):
    """:class:`stejax.snn.Synaptic` (second-order LIF) as an NNX module."""

    _params_type = _neurons.SynapticParams

    def __init__(
        self,
        n: int,
        *,
        spike: Spike | str = "fast_sigmoid",
        reset: str = "subtract",
        reset_grad: bool = False,
        syn_decay: float = 0.8,
        decay: float = 0.9,
        threshold: float = 1.0,
        per_neuron: bool = False,
        learn_decay: bool = True,
        learn_threshold: bool = True,
    ):
        self.neuron = _neurons.Synaptic(spike, reset, reset_grad)
        p = self.neuron.init_params(n, syn_decay=syn_decay, decay=decay, threshold=threshold, per_neuron=per_neuron)
        self.syn_decay_logit = _var(p.syn_decay_logit, learn_decay)
        self.decay_logit = _var(p.decay_logit, learn_decay)
        self.threshold = _var(p.threshold, learn_threshold)


class RecurrentLeaky(_Neuron):
    """:class:`stejax.snn.RecurrentLeaky` as an NNX module; ``rngs`` draws the recurrent weights."""

    _params_type = _neurons.RecurrentParams

    def __init__(
        self,
        n: int,
        *,
        rngs: nnx.Rngs,
        spike: Spike | str = "fast_sigmoid",
        reset: str = "subtract",
        reset_grad: bool = False,
        decay: float = 0.9,
        threshold: float = 1.0,
        per_neuron: bool = False,
        learn_decay: bool = True,
        learn_threshold: bool = True,
    ):
        self.neuron = _neurons.RecurrentLeaky(spike, reset, reset_grad)
        p = self.neuron.init_params(n, key=rngs.params(), decay=decay, threshold=threshold, per_neuron=per_neuron)
        self.decay_logit = _var(p.decay_logit, learn_decay)
        self.threshold = _var(p.threshold, learn_threshold)
        self.recurrent = nnx.Param(p.recurrent)


class AdaptiveLeaky(_Neuron):
    """:class:`stejax.snn.AdaptiveLeaky` (ALIF) as an NNX module."""

    _params_type = _neurons.AdaptiveParams

    def __init__(
        self,
        n: int,
        *,
        spike: Spike | str = "fast_sigmoid",
        reset: str = "subtract",
        reset_grad: bool = False,
        decay: float = 0.9,
        threshold: float = 1.0,
        adapt_decay: float = 0.95,
        adapt_strength: float = 1.8,
        per_neuron: bool = False,
        learn_decay: bool = True,
        learn_threshold: bool = True,
    ):
        self.neuron = _neurons.AdaptiveLeaky(spike, reset, reset_grad)
        p = self.neuron.init_params(
            n,
            decay=decay,
            threshold=threshold,
            adapt_decay=adapt_decay,
            adapt_strength=adapt_strength,
            per_neuron=per_neuron,
        )
        self.decay_logit = _var(p.decay_logit, learn_decay)
        self.threshold = _var(p.threshold, learn_threshold)
        self.adapt_decay_logit = _var(p.adapt_decay_logit, learn_decay)
        self.adapt_strength = _var(p.adapt_strength, learn_threshold)


class LeakyIntegrator(_Neuron):
    """:class:`stejax.snn.LeakyIntegrator` (non-spiking readout) as an NNX module."""

    _params_type = _neurons.LeakyParams

    def __init__(self, n: int, *, decay: float = 0.9, per_neuron: bool = False, learn_decay: bool = True):
        self.neuron = _neurons.LeakyIntegrator()
        p = self.neuron.init_params(n, decay=decay, per_neuron=per_neuron)
        self.decay_logit = _var(p.decay_logit, learn_decay)
        self.threshold = Fixed(p.threshold)
