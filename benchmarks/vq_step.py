"""The cost of each quantiser in a training step, and of mapping seeds with vmap, side by side in one process.

Run from the repository root:

    .venv/bin/python benchmarks/vq_step.py [--repeats 30] [--out FILE.json]

Part 1, quantisers: one jitted ``value_and_grad`` of ``sum(decoder(q(encoder(x)))^2)`` on a batch of
64 digits-sized inputs, 4 tokens, 64 codes, for the straight-through codebook, the rotation-trick
codebook, the same with EMA statistics updated in the step (plus dead-code replacement), and FSQ with
levels (4, 4, 4). Each is compiled and run once before timing; then rounds call every variant once
(the order rotating), and medians are compared as ratios to the straight-through codebook.

Part 2, seeds: ``stejax.vq.compare``'s program for one configuration (vq_ste-ema, 3 epochs) with 3
seeds as one ``jit(vmap(...))`` against 3 separate calls of the 1-seed program (each compiled once
before timing).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import stejax
from stejax.vq import FSQ, Codebook, CompareSettings


def _timed_rounds(fns: dict, repeats: int) -> dict[str, float]:
    times = {name: [] for name in fns}
    names = list(fns)
    for r in range(repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            t0 = time.perf_counter()
            jax.block_until_ready(fns[name]())
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(v) for name, v in times.items()}


def quantiser_steps(repeats: int) -> dict[str, float]:
    key = jax.random.key(0)
    k_x, k_enc, k_dec, k_cb = jax.random.split(key, 4)
    x = jax.random.uniform(k_x, (64, 64))
    w_enc = jax.random.normal(k_enc, (64, 32)) * 0.1
    w_dec = jax.random.normal(k_dec, (32, 64)) * 0.1
    w_enc_fsq = w_enc[:, :12]
    w_dec_fsq = w_dec[:12]

    def codebook_step(cb, with_state):
        params, state = cb.init(key=k_cb)

        def loss(p, we, wd):
            out = cb.quantize(p, x @ we)
            return jnp.sum(jnp.square(out.quantized @ wd)) + cb.loss(out), out

        @jax.jit
        def step(p, s, we, wd):
            (value, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(p, we, wd)
            if with_state:
                p, s = cb.update_state(p, s, out)
                p, s, _ = cb.replace_dead(p, s, out.vectors, key=k_cb)
            return value, grads, p, s

        return lambda: step(params, state, w_enc, w_dec)

    fsq = FSQ((4, 4, 4))

    @jax.jit
    def fsq_step(we, wd):
        def loss(we, wd):
            q = fsq((x @ we).reshape(64, 4, 3)).reshape(64, 12)
            return jnp.sum(jnp.square(q @ wd))

        return jax.value_and_grad(loss, argnums=(0, 1))(we, wd)

    fns = {
        "vq_ste": codebook_step(Codebook(64, 32, heads=4), False),
        "rotation_trick": codebook_step(Codebook(64, 32, heads=4, estimator=stejax.rotation_trick), False),
        "vq_ste + EMA + dead codes": codebook_step(
            Codebook(64, 32, heads=4, update="ema", dead_code_threshold=1.0), True
        ),
        "fsq": lambda: fsq_step(w_enc_fsq, w_dec_fsq),
    }
    for fn in fns.values():
        jax.block_until_ready(fn())
    return _timed_rounds(fns, repeats)


def seeds_vmap(repeats: int) -> dict[str, float]:
    from stejax.vq import CONFIGURATIONS
    from stejax.vq._compare import _load, _model, _run_one  # the comparison's own program

    settings = dataclasses.replace(CompareSettings(), epochs=3)
    config = next(c for c in CONFIGURATIONS if c.name == "vq_ste-ema")
    m = _model(config, settings)
    x_train, x_test = _load(settings)
    seed_keys = jnp.stack([jax.random.key(s) for s in settings.seeds])
    mapped = jax.jit(jax.vmap(lambda k, a, b: _run_one(m, k, a, b)))
    single = jax.jit(lambda k, a, b: _run_one(m, k, a, b))
    fns = {
        "3 seeds, jit(vmap)": lambda: mapped(seed_keys, x_train, x_test),
        "3 seeds, 3 calls": lambda: [single(seed_keys[i], x_train[i], x_test[i]) for i in range(3)],
    }
    for fn in fns.values():
        jax.block_until_ready(fn())
    return _timed_rounds(fns, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", default=None)
    options = parser.parse_args()
    steps = quantiser_steps(options.repeats)
    seeds = seeds_vmap(max(3, options.repeats // 10))
    base = steps["vq_ste"]
    print("one training step (batch 64, 4 tokens x 64 codes), median; ratio to vq_ste")
    for name, t in steps.items():
        print(f"  {name:28s} {t * 1e6:9.1f} us  x{t / base:.2f}")
    print("vq_ste-ema for 3 epochs, 3 seeds, median")
    for name, t in seeds.items():
        print(f"  {name:28s} {t:9.3f} s")
    print(f"  speed-up of vmap: x{seeds['3 seeds, 3 calls'] / seeds['3 seeds, jit(vmap)']:.2f}")
    print(f"load average: {os.getloadavg()}")
    if options.out:
        with open(options.out, "w") as f:
            json.dump({"steps_s": steps, "seeds_s": seeds, "loadavg": os.getloadavg()}, f, indent=2)


if __name__ == "__main__":
    np.set_printoptions(precision=4)
    main()
