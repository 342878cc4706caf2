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


# Which parameter fields follow learn_decay and which learn_threshold; any other (the recurrent weights) trains.
_DECAYS = frozenset({"decay_logit", "syn_decay_logit", "adapt_decay_logit"})
_THRESHOLDS = frozenset({"threshold", "adapt_strength"})


class _NeuronStep(Protocol):
    """What a module needs of its pure neuron (:class:`stejax.snn.Leaky` and the others)."""

    def init_state(self, shape: tuple[int, ...], dtype: Any = ...) -> Any: ...

    def step(self, params: Any, state: Any, x: jax.Array) -> tuple[Any, jax.Array]: ...

    def bind(self, params: Any, shape: tuple[int, ...], dtype: Any = ...) -> Any: ...


class _Neuron(nnx.Module):
    _params_type: Any = None
    neuron: _NeuronStep  # set by each subclass's __init__

    def _setup(self, neuron: _NeuronStep, params: Any, learn_decay: bool, learn_threshold: bool) -> None:
        """Hold ``neuron`` and one variable per field of ``params``: trained or :class:`Fixed` by its kind."""
        self.neuron = neuron
        for field in self._params_type._fields:
            learn = learn_decay if field in _DECAYS else learn_threshold if field in _THRESHOLDS else True
            setattr(self, field, _var(getattr(params, field), learn))

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


class _Spiking(_Neuron):
    """The spiking modules' constructor: the pure neuron, its initial parameters, and which of them train."""

    _neuron_type: Any = None

    def __init__(
        self,
        n: int,
        *,
        spike: Spike | str = "fast_sigmoid",
        reset: str = "subtract",
        reset_grad: bool = False,
        per_neuron: bool = False,
        learn_decay: bool = True,
        learn_threshold: bool = True,
        **init: Any,
    ):
        neuron = self._neuron_type(spike, reset, reset_grad)
        self._setup(neuron, neuron.init_params(n, per_neuron=per_neuron, **init), learn_decay, learn_threshold)


class Leaky(_Spiking):
    """:class:`stejax.snn.Leaky` (LIF) as an NNX module of ``n`` neurons.

    Keywords: ``spike``, ``reset``, ``reset_grad`` (the neuron), ``decay``,
    ``threshold``, ``per_neuron`` (its :meth:`~stejax.snn.Leaky.init_params`),
    ``learn_decay``, ``learn_threshold`` (False: a :class:`Fixed` variable).
    """

    _neuron_type = _neurons.Leaky
    _params_type = _neurons.LeakyParams


class Synaptic(_Spiking):
    """:class:`stejax.snn.Synaptic` (second-order LIF) as an NNX module.

    Keywords as :class:`Leaky`, and ``syn_decay`` (trained with ``learn_decay``).
    """

    _neuron_type = _neurons.Synaptic
    _params_type = _neurons.SynapticParams


class RecurrentLeaky(_Spiking):
    """:class:`stejax.snn.RecurrentLeaky` as an NNX module; ``rngs`` draws the recurrent weights (always trained).

    Keywords as :class:`Leaky`, and ``scale`` (the recurrent weights' standard deviation).
    """

    _neuron_type = _neurons.RecurrentLeaky
    _params_type = _neurons.RecurrentParams

    def __init__(self, n: int, *, rngs: nnx.Rngs, **kwargs: Any):
        super().__init__(n, key=rngs.params(), **kwargs)


class AdaptiveLeaky(_Spiking):
    """:class:`stejax.snn.AdaptiveLeaky` (ALIF) as an NNX module.

    Keywords as :class:`Leaky`, and ``adapt_decay`` (trained with ``learn_decay``)
    and ``adapt_strength`` (trained with ``learn_threshold``).
    """

    _neuron_type = _neurons.AdaptiveLeaky
    _params_type = _neurons.AdaptiveParams


class LeakyIntegrator(_Neuron):
    """:class:`stejax.snn.LeakyIntegrator` (non-spiking readout) as an NNX module."""

    _params_type = _neurons.LeakyParams

    def __init__(self, n: int, *, decay: float = 0.9, per_neuron: bool = False, learn_decay: bool = True):
        neuron = _neurons.LeakyIntegrator()
        self._setup(neuron, neuron.init_params(n, decay=decay, per_neuron=per_neuron), learn_decay, False)
