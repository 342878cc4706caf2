"""Time the NNX digits CNN's training step: stejax QAT against the same model in float and against Qwix int8 QAT.

Run from the repository root:

    .venv/bin/python benchmarks/nnx_qat.py [--rounds 200] [--batch 64] [--json PATH]

The model is :class:`stejax.flax.example.DigitsCNN` with the ``stejax train``
CNN (8x8x1 -> conv 3x3 32 -> conv 3x3 64 stride 2 -> dense 10), one step being
:func:`stejax.flax.example.train_step` (``nnx.jit``: forward, ``nnx.value_and_grad``,
``nnx.Optimizer.update`` with Adam on the raveled parameters) on a fixed batch of
standardised digits. The variants, all in this one process:

* ``float``: the model with the ``float`` preset (no quantiser);
* ``stejax w8a8`` and ``stejax w4a4``: the QAT presets, LSQ on weights and layer
  inputs with learned steps (8-bit first and last layers);
* ``qwix int8`` (when Qwix is installed): the float model through
  ``qwix.quantize_model`` with ``QtProvider([QtRule(weight_qtype=int8,
  act_qtype=int8)])``, Qwix's quantised training (absmax-calibrated fake quant
  of both operands of every convolution and product, straight-through backward).

Each variant is compiled and run ``--warmup`` times first; then the timed calls
alternate between the variants in rotating order, round after round, each
waiting for its loss with ``block_until_ready``. The table gives the median,
10th and 90th percentile step time, and the medians of the per-round ratios to
float and to Qwix.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from stejax.data import Normalizer
from stejax.flax.example import DigitsCNN, train_step
from stejax.model import ConvConfig, preset
from stejax.train import TrainConfig, load_splits, make_optimizer

MODEL = ConvConfig(channels=(32, 64), strides=(1, 2))


def _variants(x: jax.Array) -> dict[str, DigitsCNN]:
    models = {
        "float": DigitsCNN(preset("float"), MODEL, rngs=nnx.Rngs(0)),
        "stejax w8a8": DigitsCNN(preset("w8a8"), MODEL, rngs=nnx.Rngs(0)),
        "stejax w4a4": DigitsCNN(preset("w4a4"), MODEL, rngs=nnx.Rngs(0)),
    }
    try:
        import qwix
    except ImportError:
        return models
    rule = qwix.QtRule(module_path=".*", weight_qtype=jnp.int8, act_qtype=jnp.int8)
    models["qwix int8"] = qwix.quantize_model(
        DigitsCNN(preset("float"), MODEL, rngs=nnx.Rngs(0)), qwix.QtProvider([rule]), x
    )
    return models


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200, help="timed rounds (one step of each variant per round)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps per variant after compiling")
    parser.add_argument("--batch", type=int, default=64, help="examples per step")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args()

    config = TrainConfig(schedule="constant", batch_size=args.batch)
    splits = load_splits(config)
    normalizer = Normalizer.fit(splits.train.x)
    x = jnp.asarray(normalizer.apply(splits.train.x[: args.batch]))
    y = jnp.asarray(splits.train.y[: args.batch])
    models = _variants(x)
    names = list(models)
    optimizers = {n: nnx.Optimizer(m, make_optimizer(config, 1), wrt=nnx.Param) for n, m in models.items()}

    def step(name: str) -> float:
        start = time.perf_counter()
        train_step(models[name], optimizers[name], x, y).block_until_ready()
        return time.perf_counter() - start

    compile_s = {n: step(n) for n in names}
    for _ in range(args.warmup):
        for n in names:
            step(n)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for n in order:
            times[n].append(step(n))

    ms = {n: np.asarray(t) * 1e3 for n, t in times.items()}
    results = []
    for n in names:
        row = {
            "variant": n,
            "median_ms": float(np.median(ms[n])),
            "p10_ms": float(np.percentile(ms[n], 10)),
            "p90_ms": float(np.percentile(ms[n], 90)),
            "vs_float": float(np.median(ms[n] / ms["float"])),
            "vs_qwix": float(np.median(ms[n] / ms["qwix int8"])) if "qwix int8" in ms else None,
            "compile_s": compile_s[n],
            "params": int(sum(np.size(v) for v in jax.tree.leaves(nnx.state(models[n], nnx.Param)))),
        }
        results.append(row)

    print(
        f"NNX digits CNN training step (batch {args.batch}, {args.rounds} interleaved rounds after "
        f"{args.warmup} warm-up steps; jax {jax.__version__} on {jax.devices()[0].platform}, "
        f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()})"
    )
    columns = ("median ms", "p10 ms", "p90 ms", "x float", "x qwix", "compile s")
    header = f"{'variant':<13} " + " ".join(f"{c:>9}" for c in columns)
    print(header)
    print("-" * len(header))
    for row in results:
        qwix_ratio = f"{row['vs_qwix']:9.2f}" if row["vs_qwix"] is not None else f"{'n/a':>9}"
        print(
            f"{row['variant']:<13} {row['median_ms']:9.3f} {row['p10_ms']:9.3f} {row['p90_ms']:9.3f} "
            f"{row['vs_float']:9.2f} {qwix_ratio} {row['compile_s']:9.2f}"
        )
    if "qwix int8" not in ms:
        print("Qwix is not installed (pip install 'stejax[peers]'): no Qwix row.")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"batch": args.batch, "rounds": args.rounds, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
