"""The pilot that picks the setting of ``stejax vq compare``: where plain straight-through VQ collapses at 4096 codes.

Run from the repository root (minutes; under ``nice`` on a shared machine):

    .venv/bin/python benchmarks/vq_pilot.py [--steps 1000] [--results docs/results]

Plain STE only (and dead-code replacement with EMA at one setting, as a check that replacement acts),
at K = 4096, code dimensions 8 and 32, codes N(0, s^2) for s in (1.0, 0.1) and Adam learning rates
1e-3 and 3e-3, on seed 100, which is not one of the comparison's seeds (0, 1, 2): the setting is chosen
here, the comparison's seeds never see a choice.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from stejax.vq import CompareSettings, compare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--results", default=None, help="Write the results file vq_pilot.json into this folder.")
    args = parser.parse_args()
    base = CompareSettings(
        seeds=(100,),
        codebook_sizes=(4096,),
        code_dims=(8, 32),
        steps=args.steps,
        variants=("ste",),
        setups=("wide-init",),
        digits=False,
    )
    rows = []
    for scale, lr in ((1.0, 1e-3), (1.0, 3e-3), (0.1, 1e-3)):
        s = dataclasses.replace(base, init_scale=scale, learning_rate=lr)
        t0 = time.perf_counter()
        report = compare(
            s, progress=lambda line, scale=scale, lr=lr: print(f"scale {scale} lr {lr}: {line}", flush=True)
        )
        for r in report["summary"]:
            rows.append({"init_scale": scale, "learning_rate": lr, **r})
        print(f"  {time.perf_counter() - t0:.0f} s", flush=True)
    check = dataclasses.replace(base, variants=("dead_ema",), code_dims=(8,))
    report = compare(check, progress=lambda line: print(f"check: {line}", flush=True))
    rows += [{"init_scale": 1.0, "learning_rate": 1e-3, **r} for r in report["summary"]]
    if args.results:
        write(rows, f"{args.results}/vq_pilot.json", command=f"python benchmarks/vq_pilot.py --steps {args.steps}")


COLUMNS = [
    ("variant", "variant"),
    ("init_scale", "code init σ"),
    ("learning_rate", "learning rate"),
    ("code_dim", "d"),
    ("usage", "usage at K = 4096", "{:.3f}"),
    ("batch_usage", "per-batch usage", "{:.4f}"),
    ("val_mse", "val MSE", "{:.4f}"),
]


def write(rows, path, *, command, **provenance):
    """The pilot's results file (``provenance``: a transcription's commit, date, machine, load)."""
    from stejax.bench.results import Recorder

    keep = [{key: r[key] for key, *_ in COLUMNS} for r in rows]
    Recorder("vq_pilot", command=command).write(path, rows=keep, columns=COLUMNS, **provenance)


if __name__ == "__main__":
    main()
