"""Why stejax's spiking step costs what it does beside Spyx's: memory, loops, and CPU time against wall time.

For each T, builds the two training steps of ``stejax bench --suite peers`` (the same
two-layer LIF network, batch 64; :func:`stejax.bench._peers_snn.build_steps`) and prints:
the compiled program's temporary memory (XLA's memory analysis), its while loops and the
``(T, B, n)`` arrays each forward loop carries, then interleaved rounds of both steps with
the p50 of the per-round ratio stejax / Spyx in wall time and in the process's CPU time
(the latter is what a loaded machine distorts least: time spent waiting for a core is not
counted), and, over the values of T, the fit of the median step to fixed + per-step cost.
``--no-checkpoint`` builds stejax's network without its default checkpointing,
which shows what storing every step's intermediates costs; ``--spyx-plain-adam`` gives
Spyx ``optax.adam`` on its parameter tree (as a Spyx user writes it) instead of the same
optimiser object as stejax (Adam with flat moments). Both steps donate their parameters
and optimiser state, and each call passes on what the previous one returned.

Usage::

    .venv/bin/python benchmarks/snn_speed.py --steps 8 25 100 --rounds 20
    .venv/bin/python benchmarks/snn_speed.py --steps 1 2 4 8 --rounds 60
    .venv/bin/python benchmarks/snn_speed.py --steps 25 100 --rounds 20 --no-checkpoint

``XLA_FLAGS=--xla_cpu_multi_thread_eigen=false`` before the command runs XLA on one
thread: the CPU time then measures the work alone, without the threads' spinning.
"""

from __future__ import annotations

import argparse
import os
import re
import time

import jax
import numpy as np

from stejax.bench._peers_snn import _threaded, build_steps


def _loops(hlo: str, n_steps: int) -> list[int]:
    """For each while loop of the compiled program, how many (T, B, n>=64) float arrays its state carries."""
    shapes = re.findall(r"\n\s*%while[.\d]* = \(([^)]*)\) while\(", hlo)
    return [len(re.findall(rf"f32\[{n_steps},64,(?:64|128)\]", s)) for s in shapes]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="*", default=[8, 25, 100])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--no-checkpoint", action="store_true")
    parser.add_argument("--spyx-plain-adam", action="store_true")
    args = parser.parse_args()
    print(
        f"load average {os.getloadavg()}, checkpoint {not args.no_checkpoint}, "
        f"spyx optimiser {'optax.adam' if args.spyx_plain_adam else 'the same as stejax'}, "
        f"XLA_FLAGS {os.environ.get('XLA_FLAGS')!r}"
    )
    medians: dict[str, dict[str, list[float]]] = {"wall": {}, "cpu": {}}
    for n_steps in args.steps:
        steps, step_args, _ = build_steps(
            n_steps=n_steps, checkpoint=not args.no_checkpoint, spyx_flat_adam=not args.spyx_plain_adam
        )
        calls = {}
        for name, f in steps.items():
            compiled = f.lower(*step_args[name], jax.random.key(3)).compile()
            memory = compiled.memory_analysis()
            print(
                f"T={n_steps} {name}: temp {memory.temp_size_in_bytes / 2**20:.1f} MiB; "
                f"(T, B, n) arrays carried per while loop: {_loops(compiled.as_text(), n_steps)}"
            )
            # The same key sequence for both; state passed on from call to call (the steps donate it).
            keys = iter(jax.random.split(jax.random.key(n_steps), 3 + args.rounds))
            calls[name] = _threaded(f, step_args[name], keys)
            for _ in range(3):
                jax.block_until_ready(calls[name]())
        wall: dict[str, list[float]] = {n: [] for n in steps}
        cpu: dict[str, list[float]] = {n: [] for n in steps}
        for _ in range(args.rounds):
            for name, call in calls.items():
                w0, c0 = time.perf_counter(), time.process_time()
                jax.block_until_ready(call())
                wall[name].append(time.perf_counter() - w0)
                cpu[name].append(time.process_time() - c0)
        for label, t in (("wall", wall), ("cpu", cpu)):
            for name in t:
                medians[label].setdefault(name, []).append(float(np.median(t[name])))
            r = np.asarray(t["stejax"]) / np.asarray(t["spyx"])
            print(
                f"T={n_steps} {label}: stejax {1e3 * np.median(t['stejax']):.2f} ms, spyx "
                f"{1e3 * np.median(t['spyx']):.2f} ms; stejax/spyx p10 {np.percentile(r, 10):.3f} "
                f"p50 {np.median(r):.3f} p90 {np.percentile(r, 90):.3f}",
                flush=True,
            )
    if len(args.steps) >= 2:
        for label, by_name in medians.items():
            for name, m in by_name.items():
                per_step, fixed = np.polyfit(args.steps, m, 1)
                print(f"{label} fit {name}: {1e3 * fixed:.3f} ms fixed + {1e3 * per_step:.4f} ms per time step")
    print(f"load average after {os.getloadavg()}")


if __name__ == "__main__":
    main()
