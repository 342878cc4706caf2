"""Why stejax's spiking step costs what it does beside Spyx's: memory, loops, and CPU time against wall time.

For each T, builds the two training steps of ``stejax bench --suite peers`` (the same
two-layer LIF network, batch 64; :func:`stejax.bench._peers_snn.build_steps`) and prints:
the compiled program's temporary memory (XLA's memory analysis), its while loops and the
``(T, B, n)`` arrays each forward loop carries, then interleaved rounds of both steps with
the p50 of the per-round ratio stejax / Spyx in wall time and in the process's CPU time
(the latter is what a loaded machine distorts least: time spent waiting for a core is not
counted). ``--no-checkpoint`` builds stejax's network without its default checkpointing,
which shows what storing every step's intermediates costs.

Usage::

    .venv/bin/python benchmarks/snn_speed.py --steps 8 25 100 --rounds 20
    .venv/bin/python benchmarks/snn_speed.py --steps 25 100 --rounds 20 --no-checkpoint
"""

from __future__ import annotations

import argparse
import os
import re
import time

import jax
import numpy as np

from stejax.bench._peers_snn import build_steps


def _loops(hlo: str, n_steps: int) -> list[int]:
    """For each while loop of the compiled program, how many (T, B, n>=64) float arrays its state carries."""
    shapes = re.findall(r"\n\s*%while[.\d]* = \(([^)]*)\) while\(", hlo)
    return [len(re.findall(rf"f32\[{n_steps},64,(?:64|128)\]", s)) for s in shapes]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="*", default=[8, 25, 100])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--no-checkpoint", action="store_true")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()}, checkpoint {not args.no_checkpoint}")
    key = jax.random.key(3)
    for n_steps in args.steps:
        steps, step_args, _ = build_steps(n_steps=n_steps, checkpoint=not args.no_checkpoint)
        for name, f in steps.items():
            compiled = f.lower(*step_args[name], key).compile()
            memory = compiled.memory_analysis()
            print(
                f"T={n_steps} {name}: temp {memory.temp_size_in_bytes / 2**20:.1f} MiB; "
                f"(T, B, n) arrays carried per while loop: {_loops(compiled.as_text(), n_steps)}"
            )
            for _ in range(3):
                jax.block_until_ready(f(*step_args[name], key))
        wall: dict[str, list[float]] = {n: [] for n in steps}
        cpu: dict[str, list[float]] = {n: [] for n in steps}
        for _ in range(args.rounds):
            for name, f in steps.items():
                w0, c0 = time.perf_counter(), time.process_time()
                jax.block_until_ready(f(*step_args[name], key))
                wall[name].append(time.perf_counter() - w0)
                cpu[name].append(time.process_time() - c0)
        for label, t in (("wall", wall), ("cpu", cpu)):
            r = np.asarray(t["stejax"]) / np.asarray(t["spyx"])
            print(
                f"T={n_steps} {label}: stejax {1e3 * np.median(t['stejax']):.2f} ms, spyx "
                f"{1e3 * np.median(t['spyx']):.2f} ms; stejax/spyx p10 {np.percentile(r, 10):.3f} "
                f"p50 {np.median(r):.3f} p90 {np.percentile(r, 90):.3f}",
                flush=True,
            )
    print(f"load average after {os.getloadavg()}")


if __name__ == "__main__":
    main()
