"""What the optimiser's layout and the threshold cost the spiking step: five steps at one T, interleaved.

The two-layer network of the Spyx comparison (``stejax bench --suite peers``; batch 64,
``64 -> 128 LIF -> 128 LIF -> 10``), one T (default 8), every step jitted with its
parameters and optimiser state donated and passed on from call to call:

- ``stejax``: the peers suite's step (Adam with flat moments, thresholds held at 1 as
  Spyx's are);
- ``stejax_learned_threshold``: the library's default network, thresholds learned;
- ``stejax_tree_adam``: that network with the step as it was before flat moments: Adam's
  moments one array per parameter array (``make_optimizer(flatten=False)``) and the
  finiteness check one reduction per gradient array;
- ``spyx``: the peers suite's Spyx step, with the same optimiser object as ``stejax``;
- ``spyx_tree_adam``: Spyx with ``optax.adam`` on its parameter tree, as a Spyx user
  writes it.

Prints each step's median in CPU time and wall time and the p50 of the per-round ratios
against both Spyx steps. Rounds rotate the order of the calls.

Usage::

    .venv/bin/python benchmarks/snn_optimizer.py --steps 8 --rounds 120
    XLA_FLAGS=--xla_cpu_multi_thread_eigen=false .venv/bin/python benchmarks/snn_optimizer.py --rounds 120
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from stejax.bench._peers_snn import _threaded, build_steps
from stejax.snn import NetConfig, SNNTrainConfig, forward, make_optimizer, make_train_step, rate
from stejax.snn._train import LOSSES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8, help="T")
    parser.add_argument("--rounds", type=int, default=120)
    args = parser.parse_args()
    n_steps = args.steps
    print(f"load average {os.getloadavg()}, T = {n_steps}, XLA_FLAGS {os.environ.get('XLA_FLAGS')!r}")
    same, same_args, _ = build_steps(n_steps=n_steps)
    tree, tree_args, _ = build_steps(n_steps=n_steps, spyx_flat_adam=False)
    config = SNNTrainConfig(n_steps=n_steps, batch_size=64)
    net = NetConfig(64, 10, hidden=(128, 128), spike="fast_sigmoid")
    params, _, x, y = same_args["stejax"]
    flat, tree_adam = make_optimizer(config, 20), make_optimizer(config, 20, flatten=False)

    def tree_step(p, opt_state, x, y, key):
        # The step before flat moments: per-array Adam, one finiteness reduction per gradient array.
        spikes_in = rate(x, n_steps, key=key)
        value, grads = jax.value_and_grad(lambda q: LOSSES["ce_mean_membrane"](forward(net, q, spikes_in).traces, y))(p)
        finite = jnp.all(jnp.array([jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads)]))
        updates, opt_state = tree_adam.update(grads, opt_state, p)
        return optax.apply_updates(p, updates), opt_state, value, finite

    def keys():
        return iter(jax.random.split(jax.random.key(n_steps), 3 + args.rounds))

    calls = {
        "stejax": _threaded(same["stejax"], same_args["stejax"], keys()),
        "stejax_learned_threshold": _threaded(
            jax.jit(make_train_step(net, config, flat), donate_argnums=(0, 1)),
            (params, flat.init(params), x, y),
            keys(),
        ),
        "stejax_tree_adam": _threaded(
            jax.jit(tree_step, donate_argnums=(0, 1)), (params, tree_adam.init(params), x, y), keys()
        ),
        "spyx": _threaded(same["spyx"], same_args["spyx"], keys()),
        "spyx_tree_adam": _threaded(tree["spyx"], tree_args["spyx"], keys()),
    }
    for call in calls.values():
        for _ in range(3):
            jax.block_until_ready(call())
    names = list(calls)
    cpu: dict[str, list[float]] = {n: [] for n in names}
    wall: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        for j in range(len(names)):
            name = names[(r + j) % len(names)]
            w0, c0 = time.perf_counter(), time.process_time()
            jax.block_until_ready(calls[name]())
            cpu[name].append(time.process_time() - c0)
            wall[name].append(time.perf_counter() - w0)
    for label, t in (("cpu", cpu), ("wall", wall)):
        for name in names:
            a = np.asarray(t[name])
            against = ", ".join(f"/{d} {np.median(a / np.asarray(t[d])):.3f}" for d in ("spyx", "spyx_tree_adam"))
            print(f"T={n_steps} {label} {name:25s} median {1e3 * np.median(a):.3f} ms; p50 of ratios {against}")
    print(f"load average after {os.getloadavg()}")


if __name__ == "__main__":
    main()
