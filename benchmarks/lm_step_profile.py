"""Profile the LM's QAT training step: HLO op counts and CPU-time ratios of stejax w8a8, Qwix int8 and float.

    .venv/bin/python benchmarks/lm_step_profile.py [--rounds 30] [--calls 3]

The quick tier's transformer (batch 16), quantised on the block linears by each library as in
the LM group of ``stejax bench --suite peers`` (:mod:`stejax.bench._peers_lm`), plus ``stejax
w8a8 composed``: the same quantisers written as ``round_ste`` composed with ``jnp.clip`` and
the scale products (the form before the identity gradient was declared). Prints the counts of
chosen ops in each compiled step, then the p50 (p10, p90) of per-round CPU-time ratios
(``time.process_time``, interleaved rounds, ``--calls`` calls per round) and the load average.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from stejax.bench._nnx import nnx_steps
from stejax.bench._peers_lm import qwix_lm
from stejax.flax import Rule, quantize_model
from stejax.lm import QUICK, Transformer, quantize_lm
from stejax.lm._configs import SITES
from stejax.lm._quantisers import _int_weights, _per_token

OPS = ("dot", "reduce", "compare", "select", "round-nearest-even", "multiply", "divide", "convert", "copy", "fusion")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=3)
    options = parser.parse_args(argv)
    config = QUICK.model
    tokens = jax.random.randint(jax.random.key(0), (QUICK.batch_size, config.context + 1), 0, 256)
    x, y = tokens[:, :-1].astype(jnp.uint8), tokens[:, 1:].astype(jnp.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Flax warns while tracing Qwix's interception
        model = Transformer(config, rngs=nnx.Rngs(params=0))
        composed = Rule(
            SITES,
            kinds=("linear",),
            weights=functools.partial(_int_weights, bits=8, group=None, ste=True),
            inputs=functools.partial(_per_token, bits=8, ste=True),
        )
        models = {
            "flax float": model,
            "qwix int8": qwix_lm(model, "qwix int8"),
            "stejax w8a8": quantize_lm(model, "w8a8"),
            "stejax w8a8 composed": quantize_model(model, [composed], jnp.zeros((1, 8), jnp.uint8)),
        }
        compiled: dict[str, str] = {}
        calls = nnx_steps(nnx, optax, optax.adamw(1e-3), models, x, y, compiled=compiled)
    calls.pop("_quantised_dots")
    print("op".ljust(20) + "".join(name.rjust(22) for name in compiled))
    for op in OPS:
        pattern = re.compile(r"= \S+ " + re.escape(op) + r"\(")
        print(op.ljust(20) + "".join(str(len(pattern.findall(text))).rjust(22) for text in compiled.values()))
    int_dots = len(re.findall(r"= s32\[[0-9,]*\]\S* dot\(", compiled["qwix int8"]))
    print(f"qwix int8: {int_dots} int32-accumulating dots")
    for call in calls.values():
        for _ in range(3):
            jax.block_until_ready(call())
    start = os.getloadavg()
    cpu: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(options.rounds):
        for name, call in calls.items():
            tic = time.process_time()
            for _ in range(options.calls):
                out = call()
            jax.block_until_ready(out)
            cpu[name].append((time.process_time() - tic) / options.calls)
    print(f"load average at start {start}, at end {os.getloadavg()}; {options.rounds} interleaved rounds (CPU time)")
    for name, values in cpu.items():
        print(f"  {name:>22}: p50 {1000 * np.median(values):8.2f} ms")
    for a, b in (
        ("stejax w8a8", "qwix int8"),
        ("stejax w8a8 composed", "qwix int8"),
        ("stejax w8a8", "stejax w8a8 composed"),
        ("qwix int8", "flax float"),
        ("stejax w8a8", "flax float"),
    ):
        r = np.array(cpu[a]) / np.array(cpu[b])
        p10, p50, p90 = np.percentile(r, [10, 50, 90])
        print(f"  {a + ' / ' + b:>44}: p50 {p50:.3f} (p10 {p10:.3f}, p90 {p90:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
