"""The TPU compiler's static estimate of a decoding step at batch 1, 16 and 64, by attention form, no TPU needed.

Deviceless ahead-of-time compilation (``jax.experimental.topologies``, a v5e 1x1 from ``libtpu`` alone) of the
compiled decode loop of :func:`stejax.lm.decode` for a bfloat16 model of the 1B model's width (2048, 16 heads,
hidden 5632, context 320) with two blocks. The compiler writes its estimated cycles on each operation of the
compiled program; the sum over the operations of the loop's body is one decoding step's estimate. Both attention
forms of :func:`stejax.lm.decode` are compiled: ``"reduce"`` (a product and sum per head) and ``"matmul"`` (every
head of a row as one block-diagonal product); the operation that costs the most is printed with each.

Nothing runs and nothing is timed: these are the compiler's schedule, which models issue slots and memory traffic
but not every stall (its estimates of the weight products at one row are slower than a v5e measures, those of
memory reads faster), so ratios between rows are what it can show, and only a TPU run
(``benchmarks/lm_decode_device.sh``) decides.

Needs ``libtpu`` of the version jax pins, outside the environment's import path (``make setup`` installs it in
``.venv/tpu-compiler``)::

    PYTHONPATH=.venv/tpu-compiler .venv/bin/python benchmarks/lm_decode_static.py \
        --out docs/results/lm_decode_static.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")

import jax
import jax.numpy as jnp

jax.config.update("jax_platforms", "cpu")  # only the compiler is the TPU's

CLOCK_HZ = 1.5e9  # TPU v5e
BLOCKS = 2
_WHILE = re.compile(r"while\([^)]*\), condition=%[\w.\-]+, body=%([\w.\-]+)")
_CYCLES = re.compile(r'"estimated_cycles":"(\d+)"')


def body_estimate(hlo: str) -> tuple[int, str]:
    """Estimated cycles of the first while loop's body in compiled HLO text, and its costliest operation."""
    match = _WHILE.search(hlo)
    if match is None:
        raise ValueError("body_estimate: no while loop in the compiled program.")
    start = hlo.index(f"%{match.group(1)} ")
    body = hlo[start : hlo.index("\n}\n", start)]
    ops = []
    for line in body.splitlines():
        found = _CYCLES.search(line)
        if found:
            ops.append((int(found.group(1)), line.strip().split(" = ")[0].lstrip("%")))
    if not ops:
        raise ValueError("body_estimate: the loop's body carries no estimated cycles.")
    return sum(c for c, _ in ops), max(ops)[1]


def main() -> None:
    parser = argparse.ArgumentParser(prog="benchmarks/lm_decode_static.py", description=__doc__.splitlines()[0])
    parser.add_argument("--topology", default="v5e:1x1")
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--out", type=Path, default=None, help="write the rows as a results file here")
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # one batch, rows as JSON
    args = parser.parse_args()
    if args.one is None:
        # One process per batch, tried up to three times: the deviceless compiler now and then never finishes
        # a compilation of the loop.
        rows = []
        for batch in args.batches.split(","):
            command = [sys.executable, __file__, "--topology", args.topology, "--one", batch]
            for attempt in range(3):
                try:
                    done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=300)
                    break
                except subprocess.TimeoutExpired:
                    print(f"batch {batch}: no compilation within 300 s (attempt {attempt + 1} of 3)")
            else:
                raise SystemExit(f"batch {batch}: the compiler did not finish in three attempts")
            for line in done.stdout.splitlines():
                if line.startswith("{"):
                    rows.append(json.loads(line))
                else:
                    print(line)
        write(rows, args)
        return

    from flax import nnx
    from jax.experimental import topologies
    from jax.sharding import SingleDeviceSharding

    from stejax.bench._lm_decode import LARGE, random_model
    from stejax.lm import LMConfig, _decode

    topology = topologies.get_topology_desc(
        topology_name=args.topology, platform="tpu", chip_config_name="default", chips_per_host_bounds=(1, 1, 1)
    )
    place = SingleDeviceSharding(topology.devices[0])
    kind = topology.devices[0].device_kind
    config = LMConfig(**{**LARGE["1B"], "depth": BLOCKS})
    model, _ = random_model("1B", "bfloat16", config=config)
    graphdef, state = nnx.split(model)

    def spec(a: jax.Array) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=place)

    context, head = config.context, config.width // config.heads
    print(f"static estimates on {kind}: one decoding step of a bfloat16 model, width 2048, {BLOCKS} blocks")
    for batch in (args.one,):
        empty = jnp.zeros((batch, context, config.heads, head), jnp.bfloat16)
        cache = tuple(_decode.LayerCache(empty, empty) for _ in range(BLOCKS))
        keys = jax.random.split(jax.random.key(0), batch * context).reshape(batch, context)
        int_rows = jnp.zeros((batch,), jnp.int32)
        operands = (
            state,
            cache,
            int_rows,
            int_rows,
            jnp.int32(64),
            jnp.ones((batch,), bool),
            jnp.int32(64),
            keys,
            (jnp.float32(0), jnp.int32(256), jnp.float32(1)),
            jnp.zeros((_decode.STOP_SLOTS, _decode.STOP_WIDTH), jnp.uint8),
            jnp.zeros((_decode.STOP_SLOTS,), jnp.int32),
        )
        for attention in ("reduce", "matmul"):
            lowered = _decode._decode_loop.lower(graphdef, attention, *jax.tree.map(spec, operands))
            cycles, costliest = body_estimate(lowered.compile().as_text())
            step_us = 1e6 * cycles / CLOCK_HZ
            print(f"batch {batch:3d} {attention:7s} {step_us:8,.0f} µs a step   costliest: {costliest}")
            print(json.dumps({"batch": batch, "attention": attention, "step_us": round(step_us, 1), "kind": kind}))


def write(rows: list[dict], args: argparse.Namespace) -> None:
    """Each row's ratio to batch 1 of its form, and the results file when ``--out`` names one."""
    kind = rows[0].pop("kind") if rows else "unknown"
    for row in rows:
        row.pop("kind", None)
        one = [r for r in rows if r["batch"] == 1 and r["attention"] == row["attention"]]
        row["vs_batch_1"] = round(row["step_us"] / one[0]["step_us"], 2) if one else None
    if args.out is not None:
        from stejax.bench.results import Figure, Recorder, _machine

        command = f"PYTHONPATH=.venv/tpu-compiler .venv/bin/python benchmarks/lm_decode_static.py --out {args.out}"
        machine = {
            **_machine(),
            "estimates": f"the TPU compiler's static estimates for a {kind} ({args.topology}, {CLOCK_HZ / 1e9} GHz), "
            "compiled deviceless on this machine: not timings",
        }
        step = {(r["batch"], r["attention"]): r["step_us"] for r in rows}
        figures = {
            f"matmul_vs_reduce_b{b}": Figure(
                round(step[b, "reduce"] / step[b, "matmul"], 1),
                f"{step[b, 'reduce'] / step[b, 'matmul']:.1f}× less",
            )
            for b in sorted({r["batch"] for r in rows})
            if (b, "reduce") in step and (b, "matmul") in step
        }
        Recorder(args.out.stem, command=command).write(
            args.out,
            rows=rows,
            columns=[
                ("batch", "batch"),
                ("attention", "attention"),
                ("step_us", "step µs (estimate)", "{:,.0f}"),
                ("vs_batch_1", "vs batch 1", "{:.2f}×"),
            ],
            figures=figures,
            machine=machine,
            notes=(
                f"A bfloat16 model of the 1B model's width with {BLOCKS} blocks, context 320; the sum of the "
                "compiler's estimated cycles over the decode loop's body, at the chip's clock."
            ),
        )
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
