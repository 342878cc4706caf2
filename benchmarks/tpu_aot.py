"""Cost analysis of the ``train-step`` suite's programs compiled for a TPU, on a machine without one.

Deviceless ahead-of-time compilation: ``jax.experimental.topologies`` describes a
TPU topology (default a v5e 1x1) from ``libtpu`` alone, each variant's training
step (:func:`stejax.bench._train_step.step_function`, the suite's model at
``--width``, 16 x 512 tokens) is lowered with abstract arguments placed on that
topology's device and compiled by the TPU compiler, and the script prints, per
variant: XLA's cost analysis (flops, bytes accessed), the memory analysis
(temporary bytes), the TPU compiler's own cycle estimates summed over the
program's top-level instructions (``estimated_cycles`` in their backend
config; copies and slices the compiler schedules asynchronously carry none),
and counts from the optimised TPU HLO (int8 dots or convolutions, top-level
fusions, converts, transposes, copies). Nothing runs and nothing is timed: the
figures are the compiler's model, not a measurement; they show where one
program moves more bytes or holds more instructions than another.

Needs ``libtpu`` of the version jax pins (jax 0.10.2: libtpu 0.0.42), outside the
project's environment's import path (``make setup`` installs it in ``.venv/tpu-compiler``)::

    PYTHONPATH=.venv/tpu-compiler .venv/bin/python benchmarks/tpu_aot.py --width 1024

``--dump DIR`` writes each variant's optimised HLO text there.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")

import jax
import jax.numpy as jnp

jax.config.update("jax_platforms", "cpu")  # the model is built on the CPU; only the compiler is the TPU's


def _cycles(text: str) -> int:
    entry = text[text.rfind("\nENTRY ") :]
    return sum(int(c) for c in re.findall(r'"estimated_cycles":"(\d+)"', entry))


def _counts(text: str) -> dict[str, int]:
    from stejax.bench._train_step import int8_dot_count

    entry = text[text.rfind("\nENTRY ") :]
    return {
        "int8 dots": int8_dot_count(text),
        "fusions": len(re.findall(r"= (?:\(.*?\)|\S+) fusion\(", entry)),  # multi-output ones too
        "converts": len(re.findall(r" convert\(", text)),
        "transposes": len(re.findall(r" transpose\(", text)),
        "copies": len(re.findall(r" copy(?:-start)?\(", text)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--topology", default="v5e:1x1", help="a TPU topology name, e.g. v5e:1x1 (one chip)")
    parser.add_argument("--variants", nargs="*", default=None, help="names of the suite's variants (default all)")
    parser.add_argument("--dump", type=Path, default=None, help="write each variant's optimised HLO to this folder")
    args = parser.parse_args()

    from flax import nnx
    from jax.experimental import topologies
    from jax.sharding import SingleDeviceSharding

    from stejax.bench._measure import standard_promotion
    from stejax.bench._train_step import TPU_SHAPE, VARIANTS, model_config, step_function, variant_models
    from stejax.lm import Transformer

    topology = topologies.get_topology_desc(
        topology_name=args.topology, platform="tpu", chip_config_name="default", chips_per_host_bounds=(1, 1, 1)
    )
    place = SingleDeviceSharding(topology.devices[0])
    batch, context = TPU_SHAPE
    model = Transformer(model_config(args.width, context), rngs=nnx.Rngs(params=0))
    names = args.variants or [v for v in VARIANTS if v != "bfloat16"]
    header = f"{'variant':22} {'GFLOP':>8} {'GB accessed':>11} {'Mcycles':>8} {'temp MB':>8}"
    print(f"train step, width {args.width}, {batch}x{context} tokens, compiled for {topology.devices[0].device_kind}")
    print(header + "  HLO counts")
    for name, variant in variant_models(model, names).items():
        step, params, optimizer = step_function(variant, name)
        state = optimizer.init(params)

        def abstract(a):
            return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=place)

        x = jax.ShapeDtypeStruct((batch, context), jnp.uint8, sharding=place)
        y = jax.ShapeDtypeStruct((batch, context), jnp.int32, sharding=place)
        with standard_promotion():
            lowered = jax.jit(step).lower(jax.tree.map(abstract, params), jax.tree.map(abstract, state), x, y)
            compiled = lowered.compile()
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        text = compiled.as_text()
        if args.dump is not None:
            args.dump.mkdir(parents=True, exist_ok=True)
            (args.dump / f"{re.sub(r'[^a-z0-9]+', '_', name.lower())}_w{args.width}.hlo.txt").write_text(text)
        temp = compiled.memory_analysis().temp_size_in_bytes
        counts = ", ".join(f"{k} {v}" for k, v in _counts(text).items())
        print(
            f"{name:22} {cost['flops'] / 1e9:8.1f} {cost['bytes accessed'] / 1e9:11.2f} "
            f"{_cycles(text) / 1e6:8.1f} {temp / 1e6:8.1f}  {counts}",
            flush=True,
        )


if __name__ == "__main__":
    main()
