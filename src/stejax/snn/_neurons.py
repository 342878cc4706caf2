r"""Spiking neurons as pure step functions ``step(params, state, x) -> (state, out)``.

Each neuron is a frozen dataclass holding its static choices (spike function,
reset, whether the reset carries gradient), so it can be a static argument of
``jax.jit``; its parameters and state are NamedTuples of arrays. With the
parameters bound, ``functools.partial(neuron.step, params)`` is the
``(state, input) -> (state, spikes)`` function that :func:`stejax.snn.run`
scans over time.

Every spiking neuron integrates, fires, then resets, in one step:

.. math::

   v_t = \beta\, u_{t-1} + I_t, \qquad s_t = H(v_t - \theta), \qquad
   u_t = \begin{cases} v_t - \bar s_t\,\theta & \text{subtract} \\
                       v_t\,(1 - \bar s_t) & \text{zero} \\
                       v_t & \text{none} \end{cases}

where :math:`u` is the state carried to the next step and :math:`\bar s_t` is
:math:`s_t` with its gradient stopped unless ``reset_grad=True``. So a spike
answers the input of the same step (no step of delay).

**Decay.** :math:`\beta = \sigma(a)` with :math:`a` the learnable ``decay_logit``:
always in (0, 1), with a gradient everywhere (a clip to [0, 1], as Spyx and
snnTorch do, has none outside it). ``init_params(decay=0.9)`` sets
:math:`a = \log(0.9/0.1)`.

**Threshold.** :math:`\theta`, learnable as it is (keep it positive: a
non-positive threshold makes a resting neuron fire).

**Shared or per neuron.** Each parameter is a scalar (shared by the layer) or
has one entry per neuron (``per_neuron=True``); either broadcasts explicitly
against ``(..., n)`` inputs.

**The reset's gradient** (``reset_grad``, default False): by default the reset
is a constant for differentiation, :math:`\partial u_t/\partial v_t = 1` (for
``subtract``), so the surrogate enters the gradient only through the spike
output. Zenke & Vogels (Neural Computation 33(4), 2021) found that
differentiating through the reset slows or spoils learning, since the
surrogate then also pushes the membrane up whenever it is near threshold;
``reset_grad=True`` keeps that path (:math:`\partial u_t/\partial v_t =
1 - \theta\, H'(v_t - \theta)`).

**Dtypes.** The state and output take the input's dtype (float16, bfloat16,
float32, float64); float32 parameters are cast to it, so spikes are never
silently promoted.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from stejax.snn._spike import Spike, as_spike

__all__ = [
    "RESETS",
    "AdaptiveLeaky",
    "AdaptiveParams",
    "AdaptiveState",
    "Leaky",
    "LeakyIntegrator",
    "LeakyParams",
    "RecurrentLeaky",
    "RecurrentParams",
    "RecurrentState",
    "Synaptic",
    "SynapticParams",
    "SynapticState",
    "decay_logit",
]

RESETS = ("subtract", "zero", "none")

Step = Callable[[Any, jax.Array], tuple[Any, jax.Array]]
"""A bound neuron step ``(state, x) -> (state, out)``, as :meth:`Leaky.bind` returns."""


class LeakyParams(NamedTuple):
    """Parameters of :class:`Leaky` and :class:`LeakyIntegrator`."""

    decay_logit: jax.Array  # float32 () or (n,): beta = sigmoid(decay_logit)
    threshold: jax.Array  # float32 () or (n,); unused by LeakyIntegrator


class SynapticParams(NamedTuple):
    """Parameters of :class:`Synaptic`."""

    syn_decay_logit: jax.Array  # float32 () or (n,): alpha = sigmoid(syn_decay_logit)
    decay_logit: jax.Array  # float32 () or (n,): beta
    threshold: jax.Array  # float32 () or (n,)


class SynapticState(NamedTuple):
    """State of :class:`Synaptic`: the synaptic current and the membrane, each ``(..., n)``."""

    current: jax.Array
    membrane: jax.Array


class RecurrentParams(NamedTuple):
    """Parameters of :class:`RecurrentLeaky`."""

    decay_logit: jax.Array  # float32 () or (n,)
    threshold: jax.Array  # float32 () or (n,)
    recurrent: jax.Array  # float32 (n, n): the input to neuron j is sum_i s_i W[i, j]


class RecurrentState(NamedTuple):
    """State of :class:`RecurrentLeaky`: the membrane and the last step's spikes, each ``(..., n)``."""

    membrane: jax.Array
    spikes: jax.Array


class AdaptiveParams(NamedTuple):
    """Parameters of :class:`AdaptiveLeaky`."""

    decay_logit: jax.Array  # float32 () or (n,): beta
    threshold: jax.Array  # float32 () or (n,): the baseline threshold theta_0
    adapt_decay_logit: jax.Array  # float32 () or (n,): rho = sigmoid(adapt_decay_logit)
    adapt_strength: jax.Array  # float32 () or (n,): how far one unit of adaptation raises the threshold


class AdaptiveState(NamedTuple):
    """State of :class:`AdaptiveLeaky`: the membrane and the adaptation, each ``(..., n)``."""

    membrane: jax.Array
    adaptation: jax.Array


def decay_logit(decay: float) -> float:
    r"""The logit :math:`a = \log(\beta / (1 - \beta))` that gives decay :math:`\beta = \sigma(a)`.

    Example:
      >>> from stejax.snn import decay_logit
      >>> round(decay_logit(0.5), 6), round(decay_logit(0.9), 4)
      (0.0, 2.1972)
    """
    if not isinstance(decay, int | float) or not 0.0 < float(decay) < 1.0:
        raise ValueError(f"decay must be a number in (0, 1) (it is sigmoid(logit)); got {decay!r}.")
    return math.log(decay) - math.log1p(-decay)


def _param(value: float, n: int, per_neuron: bool) -> jax.Array:
    return jnp.full((n,) if per_neuron else (), value, jnp.float32)


def _full(p: jax.Array, shape: tuple[int, ...], dtype: Any) -> jax.Array:
    """``p`` cast to ``dtype`` and broadcast to ``shape``, explicitly."""
    p = jnp.asarray(p)
    if p.ndim not in (0, 1) or (p.ndim == 1 and p.shape[0] != shape[-1]):
        raise ValueError(
            f"a neuron parameter must be a scalar or have one entry per neuron ({shape[-1]}); got shape {p.shape}."
        )
    return jnp.broadcast_to(p.astype(dtype), shape)


def _decay(logit: jax.Array, shape: tuple[int, ...], dtype: Any) -> jax.Array:
    # sigmoid in float32 (or float64), then rounded once to the state's dtype.
    wide = jnp.float64 if dtype == jnp.float64 else jnp.float32
    return _full(jax.nn.sigmoid(jnp.asarray(logit).astype(wide)), shape, dtype)


def _check_input(x: Any, state: jax.Array, where: str) -> jax.Array:
    if not isinstance(x, jax.Array) or not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{where}: the input must be a floating-point jax array; got {type(x).__name__}.")
    if x.shape != state.shape or x.dtype != state.dtype:
        raise ValueError(
            f"{where}: the input and the state must have the same shape and dtype; "
            f"got input {x.shape} {x.dtype}, state {state.shape} {state.dtype}."
        )
    return x


def _flush_subnormal(z: jax.Array) -> jax.Array:
    """``z`` with subnormal values set to 0, gradient 1 everywhere.

    XLA:CPU flushes subnormal results in some compiled kernels and not in others,
    so an eager step and a jitted one could disagree on whether a membrane a
    subnormal above threshold spikes; flushing first makes them agree.
    """
    correction = jnp.where(jnp.abs(z) < jnp.finfo(z.dtype).tiny, -z, jnp.zeros_like(z))
    return z + lax.stop_gradient(correction)


def _fire_and_reset(
    spike: Spike, reset: str, reset_grad: bool, v: jax.Array, theta: jax.Array
) -> tuple[jax.Array, jax.Array]:
    s = spike(_flush_subnormal(v - theta))
    r = s if reset_grad else lax.stop_gradient(s)
    if reset == "subtract":
        u = v - r * theta
    elif reset == "zero":
        u = v * (1 - r)
    else:
        u = v
    return u, s


@dataclasses.dataclass(frozen=True)
class _SpikingNeuron:
    spike: Spike | str = "fast_sigmoid"
    reset: str = "subtract"
    reset_grad: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "spike", as_spike(self.spike))
        if self.reset not in RESETS:
            raise ValueError(f"{type(self).__name__}: reset must be one of {RESETS}; got {self.reset!r}.")
        if not isinstance(self.reset_grad, bool):
            raise TypeError(f"{type(self).__name__}: reset_grad must be a bool; got {self.reset_grad!r}.")

    def _fire(self, v: jax.Array, theta: jax.Array) -> tuple[jax.Array, jax.Array]:
        # ``spike`` is a Spike since __post_init__ (as_spike returns a Spike as it is): this only narrows its type.
        return _fire_and_reset(as_spike(self.spike), self.reset, self.reset_grad, v, theta)


@dataclasses.dataclass(frozen=True)
class Leaky(_SpikingNeuron):
    r"""The leaky integrate-and-fire neuron (LIF), first order.

    .. math:: v_t = \beta u_{t-1} + I_t,\quad s_t = H(v_t - \theta),\quad u_t = \text{reset}(v_t, s_t)

    Attributes:
      spike: the spike function (a :class:`Spike`, a surrogate's name or a callable).
      reset: ``"subtract"`` (default; :math:`u = v - s\theta`), ``"zero"``
        (:math:`u = v(1 - s)`) or ``"none"``.
      reset_grad: whether the reset carries gradient (default False; see the module).

    Example:
      >>> import jax.numpy as jnp
      >>> from stejax.snn import Leaky
      >>> lif = Leaky("atan")
      >>> params = lif.init_params(3, decay=0.5)
      >>> v, s = lif.step(params, lif.init_state((3,), jnp.float32), jnp.array([0.5, 1.5, 2.5]))
      >>> s, v
      (Array([0., 1., 1.], dtype=float32), Array([0.5, 0.5, 1.5], dtype=float32))
    """

    def init_params(
        self, n: int, *, decay: float = 0.9, threshold: float = 1.0, per_neuron: bool = False
    ) -> LeakyParams:
        """Parameters for ``n`` neurons: decay (via its logit) and threshold, shared or per neuron."""
        return LeakyParams(_param(decay_logit(decay), n, per_neuron), _param(threshold, n, per_neuron))

    def init_state(self, shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.Array:
        """The resting membrane: zeros of ``shape`` (``(..., n)``) and ``dtype``."""
        return jnp.zeros(shape, dtype)

    def bind(self, params: LeakyParams, shape: tuple[int, ...], dtype: Any = jnp.float32) -> Step:
        """The step ``(state, x) -> (state, spikes)`` for inputs of ``shape`` and ``dtype``, parameters prepared once.

        The decay and threshold are computed and broadcast to ``shape`` here, outside
        the time loop, so that :func:`stejax.snn.run` of the bound step does no
        per-step parameter work, and the backward pass accumulates their gradients
        elementwise and reduces them over the batch once. :meth:`step` is this.
        """
        beta, theta = _decay(params.decay_logit, shape, dtype), _full(params.threshold, shape, dtype)

        def step(state: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
            x = _check_input(x, state, "Leaky.step")
            return self._fire(beta * state + x, theta)

        return step

    def step(self, params: LeakyParams, state: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        """One time step: ``(membrane after reset, spikes)``, both of ``x``'s shape and dtype."""
        x = _check_input(x, state, "Leaky.step")
        return self.bind(params, x.shape, x.dtype)(state, x)


@dataclasses.dataclass(frozen=True)
class Synaptic(_SpikingNeuron):
    r"""The second-order (current-based) LIF: a leaky synaptic current feeds a leaky membrane.

    .. math:: i_t = \alpha i_{t-1} + I_t,\quad v_t = \beta u_{t-1} + i_t,\quad
              s_t = H(v_t - \theta),\quad u_t = \text{reset}(v_t, s_t)

    with :math:`\alpha = \sigma(a_{syn})`, :math:`\beta = \sigma(a)`. Attributes as :class:`Leaky`.
    """

    def init_params(
        self,
        n: int,
        *,
        syn_decay: float = 0.8,
        decay: float = 0.9,
        threshold: float = 1.0,
        per_neuron: bool = False,
    ) -> SynapticParams:
        """Parameters for ``n`` neurons."""
        return SynapticParams(
            _param(decay_logit(syn_decay), n, per_neuron),
            _param(decay_logit(decay), n, per_neuron),
            _param(threshold, n, per_neuron),
        )

    def init_state(self, shape: tuple[int, ...], dtype: Any = jnp.float32) -> SynapticState:
        """Zero current and membrane."""
        return SynapticState(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))

    def bind(self, params: SynapticParams, shape: tuple[int, ...], dtype: Any = jnp.float32) -> Step:
        """The step for inputs of ``shape`` and ``dtype``, parameters prepared once (see :meth:`Leaky.bind`)."""
        alpha, beta = _decay(params.syn_decay_logit, shape, dtype), _decay(params.decay_logit, shape, dtype)
        theta = _full(params.threshold, shape, dtype)

        def step(state: SynapticState, x: jax.Array) -> tuple[SynapticState, jax.Array]:
            x = _check_input(x, state.membrane, "Synaptic.step")
            i = alpha * state.current + x
            u, s = self._fire(beta * state.membrane + i, theta)
            return SynapticState(i, u), s

        return step

    def step(self, params: SynapticParams, state: SynapticState, x: jax.Array) -> tuple[SynapticState, jax.Array]:
        """One time step: ``(new state, spikes)``."""
        x = _check_input(x, state.membrane, "Synaptic.step")
        return self.bind(params, x.shape, x.dtype)(state, x)


@dataclasses.dataclass(frozen=True)
class RecurrentLeaky(_SpikingNeuron):
    r"""The LIF with recurrent connections inside the layer: last step's spikes feed back through ``W``.

    .. math:: v_t = \beta u_{t-1} + I_t + s_{t-1} W,\quad s_t = H(v_t - \theta),\quad u_t = \text{reset}(v_t, s_t)

    Attributes as :class:`Leaky`.
    """

    def init_params(
        self,
        n: int,
        *,
        key: jax.Array,
        decay: float = 0.9,
        threshold: float = 1.0,
        per_neuron: bool = False,
        scale: float | None = None,
    ) -> RecurrentParams:
        """Parameters for ``n`` neurons; ``W`` is normal with standard deviation ``scale`` (default 1/sqrt(n))."""
        from stejax import keys

        scale = 1.0 / math.sqrt(n) if scale is None else scale
        w = scale * jax.random.normal(keys.consume(key, where="RecurrentLeaky.init_params"), (n, n), jnp.float32)
        return RecurrentParams(_param(decay_logit(decay), n, per_neuron), _param(threshold, n, per_neuron), w)

    def init_state(self, shape: tuple[int, ...], dtype: Any = jnp.float32) -> RecurrentState:
        """Zero membrane and no spikes."""
        return RecurrentState(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))

    def bind(self, params: RecurrentParams, shape: tuple[int, ...], dtype: Any = jnp.float32) -> Step:
        """The step for inputs of ``shape`` and ``dtype``, parameters prepared once (see :meth:`Leaky.bind`)."""
        n = shape[-1]
        if params.recurrent.shape != (n, n):
            raise ValueError(
                f"RecurrentLeaky.step: recurrent weights must be ({n}, {n}); got {params.recurrent.shape}."
            )
        beta, theta = _decay(params.decay_logit, shape, dtype), _full(params.threshold, shape, dtype)
        w = params.recurrent.astype(dtype)

        def step(state: RecurrentState, x: jax.Array) -> tuple[RecurrentState, jax.Array]:
            x = _check_input(x, state.membrane, "RecurrentLeaky.step")
            v = beta * state.membrane + (x + jnp.matmul(state.spikes, w))
            u, s = self._fire(v, theta)
            return RecurrentState(u, s), s

        return step

    def step(self, params: RecurrentParams, state: RecurrentState, x: jax.Array) -> tuple[RecurrentState, jax.Array]:
        """One time step: ``(new state, spikes)``."""
        x = _check_input(x, state.membrane, "RecurrentLeaky.step")
        return self.bind(params, x.shape, x.dtype)(state, x)


@dataclasses.dataclass(frozen=True)
class AdaptiveLeaky(_SpikingNeuron):
    r"""The adaptive-threshold LIF (ALIF, Bellec et al. 2018): each spike raises the threshold for a while.

    .. math:: \Theta_t = \theta_0 + b\, a_{t-1},\quad v_t = \beta u_{t-1} + I_t,\quad
              s_t = H(v_t - \Theta_t),\quad u_t = \text{reset}_{\Theta_t}(v_t, s_t),\quad
              a_t = \rho a_{t-1} + (1 - \rho) s_t

    with :math:`\rho = \sigma(a_\rho)` and strength :math:`b`. The adaptation
    carries gradient (it is the neuron's memory); the reset follows ``reset_grad``.

    Reference:
      G. Bellec, D. Salaj, A. Subramoney, R. Legenstein, W. Maass, "Long
      short-term memory and learning-to-learn in networks of spiking neurons",
      NeurIPS 2018.
    """

    def init_params(
        self,
        n: int,
        *,
        decay: float = 0.9,
        threshold: float = 1.0,
        adapt_decay: float = 0.95,
        adapt_strength: float = 1.8,
        per_neuron: bool = False,
    ) -> AdaptiveParams:
        """Parameters for ``n`` neurons (Bellec et al.'s strength 1.8 by default)."""
        return AdaptiveParams(
            _param(decay_logit(decay), n, per_neuron),
            _param(threshold, n, per_neuron),
            _param(decay_logit(adapt_decay), n, per_neuron),
            _param(adapt_strength, n, per_neuron),
        )

    def init_state(self, shape: tuple[int, ...], dtype: Any = jnp.float32) -> AdaptiveState:
        """Zero membrane and adaptation."""
        return AdaptiveState(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))

    def bind(self, params: AdaptiveParams, shape: tuple[int, ...], dtype: Any = jnp.float32) -> Step:
        """The step for inputs of ``shape`` and ``dtype``, parameters prepared once (see :meth:`Leaky.bind`)."""
        theta0, strength = _full(params.threshold, shape, dtype), _full(params.adapt_strength, shape, dtype)
        beta, rho = _decay(params.decay_logit, shape, dtype), _decay(params.adapt_decay_logit, shape, dtype)

        def step(state: AdaptiveState, x: jax.Array) -> tuple[AdaptiveState, jax.Array]:
            x = _check_input(x, state.membrane, "AdaptiveLeaky.step")
            u, s = self._fire(beta * state.membrane + x, theta0 + strength * state.adaptation)
            return AdaptiveState(u, rho * state.adaptation + (1 - rho) * s), s

        return step

    def step(self, params: AdaptiveParams, state: AdaptiveState, x: jax.Array) -> tuple[AdaptiveState, jax.Array]:
        """One time step: ``(new state, spikes)``."""
        x = _check_input(x, state.membrane, "AdaptiveLeaky.step")
        return self.bind(params, x.shape, x.dtype)(state, x)


@dataclasses.dataclass(frozen=True)
class LeakyIntegrator:
    r"""The non-spiking leaky integrator, the usual readout: :math:`v_t = \beta v_{t-1} + I_t`, output :math:`v_t`.

    Its parameters are :class:`LeakyParams` (the threshold is unused).
    """

    def init_params(self, n: int, *, decay: float = 0.9, per_neuron: bool = False) -> LeakyParams:
        """Parameters for ``n`` neurons (threshold 0, unused)."""
        return LeakyParams(_param(decay_logit(decay), n, per_neuron), _param(0.0, n, per_neuron))

    def init_state(self, shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.Array:
        """Zero membrane."""
        return jnp.zeros(shape, dtype)

    def bind(self, params: LeakyParams, shape: tuple[int, ...], dtype: Any = jnp.float32) -> Step:
        """The step for inputs of ``shape`` and ``dtype``, the decay prepared once (see :meth:`Leaky.bind`)."""
        beta = _decay(params.decay_logit, shape, dtype)

        def step(state: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
            x = _check_input(x, state, "LeakyIntegrator.step")
            v = beta * state + x
            return v, v

        return step

    def step(self, params: LeakyParams, state: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        """One time step: ``(membrane, membrane)``."""
        x = _check_input(x, state, "LeakyIntegrator.step")
        return self.bind(params, x.shape, x.dtype)(state, x)
