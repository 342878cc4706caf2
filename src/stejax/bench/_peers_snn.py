"""The spiking peers group: a Spyx training step (Flax NNX) beside stejax's, on the same two-layer LIF network.

Spyx is optional (``pip install 'stejax[peers]'``) and imported only here; without
it the groups are skipped with a note.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from stejax.bench._measure import group_record, measure_rounds, standard_promotion

__all__ = ["build_steps", "snn_peer_calls", "snn_peer_groups"]

_STEPS_FULL = (8, 25, 100)
_STEPS_QUICK = (8,)


def snn_peer_groups(
    *, repeats: int, warmup: int, quick: bool, rounds: int = 1
) -> tuple[list[dict[str, Any]], list[str]]:
    """Time one training step of a two-layer LIF network in stejax and in Spyx, interleaved, for each T.

    Every T's steps are built first, then timed together in ``rounds`` interleaved rounds
    (:func:`stejax.bench.measure_rounds`): each round times every T in turn, ``repeats`` calls of each step
    back to back, so each round gives each T's ratio one sample (its ``rounds``).

    The network: ``64 -> 128 LIF -> 128 LIF -> 10`` leaky-integrator readout
    (``quick``: hidden 32), batch 64 (``quick``: 32), T = 8, 25 and 100
    (``quick``: 8). Both steps take the same batch of digit intensities, rate-encode
    it with :func:`stejax.snn.rate` inside the step (the same draws), run the
    network, take the cross-entropy of the readout's membrane integrated over
    time, and apply the same optax Adam object (:func:`stejax.snn.make_optimizer`,
    whose moments are flat vectors: the same optimiser work on both sides). Both
    are jitted with their parameters and optimiser state donated
    (``donate_argnums``), and each call passes on what the previous one returned,
    as a training loop does. The spike function is the same
    rule in both: Spyx's default ``superspike(k=25)`` is ``1/(1 + 25|x|)^2``,
    stejax's ``fast_sigmoid`` (slope 25).

    Both learn a decay per neuron and hold the threshold at 1 (Spyx's LIF has no
    threshold parameter; stejax's ``learn_threshold=False``).

    Differences, stated: Spyx's LIF fires from the membrane of the previous step
    and differentiates through its reset; stejax's fires from the current
    membrane and stops the reset's gradient (its default). Spyx clips the decay to
    [0, 1], stejax takes a sigmoid of a logit. Spyx's loss sums the membrane over
    time, stejax's averages it (one division). Spyx runs its network step by step
    inside one scan; stejax scans each layer with its input products batched over
    time (:func:`stejax.snn.forward`), its parameters bound once outside the loop,
    and each step checkpointed (recomputed in the backward pass rather than
    stored: its default). Spyx runs under JAX's standard promotion.

    Returns:
      ``(groups, notes)``: one group per T with variants ``"stejax"`` and
      ``"spyx"`` and the ratio ``"stejax/spyx"``; no groups and a note when Spyx is
      missing.
    """
    if importlib.util.find_spec("spyx") is None:
        return [], ["Spyx not installed: pip install 'stejax[peers]' to time the spiking peer."]
    built, notes = snn_peer_calls(quick=quick, calls=warmup + rounds * repeats)
    measured = measure_rounds(
        {label: calls for label, calls, _ in built}, rounds=rounds, repeats=repeats, warmup=warmup
    )
    groups = [group_record(label, measured[label], ratios=[("stejax", "spyx")], info=info) for label, _, info in built]
    return groups, notes


def snn_peer_calls(*, quick: bool, calls: int) -> tuple[list[tuple[str, dict[str, Any], dict[str, Any]]], list[str]]:
    """The untimed steps of :func:`snn_peer_groups`, ``calls`` keys each: ``([(name, calls, info), ...], notes)``."""
    width, batch = (32, 32) if quick else (128, 64)
    built, notes = [], []
    for n_steps in _STEPS_QUICK if quick else _STEPS_FULL:
        # One fresh key per call, made before the timing; each variant draws the same sequence.
        key_pool = list(jax.random.split(jax.random.key(n_steps), calls))
        steps, args, caught = build_steps(n_steps=n_steps, width=width, batch=batch)
        notes += caught
        threaded = {name: _threaded(steps[name], args[name], iter(key_pool)) for name in ("stejax", "spyx")}
        built.append(
            (
                f"SNN training step, 2 x {width} LIF, batch {batch}, T = {n_steps}",
                threaded,
                {
                    "network": f"64 -> {width} LIF -> {width} LIF -> 10 leaky integrator",
                    "T": n_steps,
                    "batch_size": batch,
                    "spike function": "stejax fast_sigmoid(slope=25) == spyx superspike(k=25)",
                    "optimizer": "the same object on both sides: Adam with flat moments (stejax.snn.make_optimizer); "
                    "parameters and optimiser state donated and threaded from call to call",
                    "parameters": "both learn a decay per neuron; thresholds fixed at 1 on both sides",
                    "spyx": importlib.metadata.version("spyx"),
                    "differences": "Spyx fires from the previous step's membrane and differentiates its reset; "
                    "stejax fires from the current membrane, stops the reset's gradient, batches each "
                    "layer's input products over time and checkpoints each step; Spyx sums the membrane over "
                    "time, stejax averages it",
                },
            )
        )
    return built, notes


def _threaded(step: Any, args: tuple[Any, ...], keys: Any) -> Any:
    """A zero-argument call of a donating ``step``: each call passes on the parameters and state the last returned."""
    params, opt_state, x, y = args
    state = [jax.tree.map(jnp.copy, params), jax.tree.map(jnp.copy, opt_state)]

    def call() -> Any:
        out = step(state[0], state[1], x, y, next(keys))
        state[0], state[1] = out[0], out[1]
        return out

    return call


def build_steps(
    *,
    n_steps: int,
    width: int = 128,
    batch: int = 64,
    checkpoint: bool = True,
    spyx_flat_adam: bool = True,
    donate: bool = True,
) -> tuple[dict[str, Any], dict[str, tuple[Any, ...]], list[str]]:
    """The two jitted training steps ``step(params, opt_state, x, y, key)`` and their arguments but the key.

    Returns:
      ``(steps, args, notes)``: ``steps["stejax"]`` and ``steps["spyx"]`` (jitted),
      ``args[name] = (params, opt_state, x, y)``, and the warnings Spyx/Flax raised
      while building, as notes. ``checkpoint``: stejax's ``NetConfig.checkpoint``
      (default True, the library's default). ``spyx_flat_adam`` (default True):
      Spyx steps with the same optimiser object as stejax (Adam with flat moments);
      False gives it ``optax.adam`` on its parameter tree, as a Spyx user writes it.
      ``donate`` (default True): both steps donate their parameters and optimiser
      state, so a caller must pass on what each call returns (the arguments given
      here may be reused once: copy them). Needs Spyx.
    """
    import optax
    import spyx
    from flax import nnx

    from stejax.data import load_digits
    from stejax.snn import NetConfig, SNNTrainConfig, make_train_step, rate
    from stejax.snn._network import init_net
    from stejax.snn._train import make_optimizer

    digits = load_digits()
    x = jnp.asarray(np.clip(digits.x[:batch] / np.max(digits.x), 0, 1).astype(np.float32))
    y = jnp.asarray(digits.y[:batch].astype(np.int32))
    config = SNNTrainConfig(n_steps=n_steps, batch_size=batch)
    optimizer = make_optimizer(config, 20)
    # Spyx's LIF threshold is a constant (1.0), not a parameter: stejax's is held fixed too, so that
    # neither side computes a gradient the other does not. Both learn a decay per neuron.
    net = NetConfig(64, 10, hidden=(width, width), spike="fast_sigmoid", checkpoint=checkpoint, learn_threshold=False)
    params = init_net(net, key=jax.random.key(0))
    donated = (0, 1) if donate else ()
    ours = jax.jit(make_train_step(net, config, optimizer), donate_argnums=donated)
    spyx_optimizer = optimizer if spyx_flat_adam else make_optimizer(config, 20, flatten=False)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with standard_promotion():
            rngs = nnx.Rngs(0)
            model = spyx.nn.Sequential(
                nnx.Linear(64, width, rngs=rngs),
                spyx.nn.LIF((width,), rngs=rngs),
                nnx.Linear(width, width, rngs=rngs),
                spyx.nn.LIF((width,), rngs=rngs),
                nnx.Linear(width, 10, rngs=rngs),
                spyx.nn.LI((10,), rngs=rngs),
            )
        # nnx.split returns one State per filter: here two, though its annotation says "one or more".
        graphdef, spyx_params, *others = nnx.split(model, nnx.Param, ...)
        (rest,) = others
        # Spyx's readout decay starts weakly typed and leaves the first step strongly typed: fixed
        # here, or the second call would compile again.
        spyx_params = jax.tree.map(lambda a: jnp.asarray(a, dtype=a.dtype), spyx_params)
        loss_fn = spyx.fn.integral_crossentropy(smoothing=0.0, time_axis=0)

        def spyx_step(p, opt_state, x, y, key):
            spikes_in = rate(x, n_steps, key=key)
            with standard_promotion():

                def objective(p):
                    traces, _ = spyx.nn.run(nnx.merge(graphdef, p, rest), spikes_in)
                    return loss_fn(traces, y)

                value, grads = jax.value_and_grad(objective)(p)
                updates, opt_state = spyx_optimizer.update(grads, opt_state, p)
                return optax.apply_updates(p, updates), opt_state, value

        theirs = jax.jit(spyx_step, donate_argnums=donated)
        theirs.trace(spyx_params, spyx_optimizer.init(spyx_params), x, y, jax.random.key(2))
    notes = sorted({f"{w.category.__name__} from Spyx/Flax: {' '.join(str(w.message).split())}" for w in caught})
    steps = {"stejax": ours, "spyx": theirs}
    args = {
        "stejax": (params, optimizer.init(params), x, y),
        "spyx": (spyx_params, spyx_optimizer.init(spyx_params), x, y),
    }
    return steps, args, notes
