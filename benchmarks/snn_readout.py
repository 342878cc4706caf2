"""The readout of the surrogate comparison, judged on the validation split only.

Trains every configuration of :data:`stejax.snn.CONFIGS` with a chosen readout
(``lif``: a spiking output layer read by its spike counts; ``integrator``: the
non-spiking leaky integrator read by its mean membrane) and prints, per
configuration, the best validation accuracy of each seed (the epoch the
comparison would select), the training loss at epochs 5 and 10, and the paired
difference to the non-spiking reference. The test split is never scored here.

Usage::

    .venv/bin/python benchmarks/snn_readout.py --readout lif --loss ce_spike_count --seeds 0 1 \\
        --out bench-out/snn-readout-lif.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path

import numpy as np

from stejax.snn import CONFIGS, NetConfig, SNNTrainConfig, load_seed_splits
from stejax.snn._train import train_seeds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readout", default="lif", choices=("lif", "integrator"))
    parser.add_argument("--loss", default="ce_spike_count")
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1])
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--threshold", type=float, default=1.0)
    parser.add_argument("--drive", type=float, default=1.0)
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    recipe = SNNTrainConfig(n_steps=args.steps, epochs=args.epochs, learning_rate=args.lr)
    splits = load_seed_splits(args.seeds, recipe)
    started = time.perf_counter()
    rows: dict[str, dict] = {}
    for name in args.configs:
        spike = CONFIGS[name]
        readout = "integrator" if spike is None else args.readout
        loss = "ce_mean_membrane" if spike is None else args.loss
        net = NetConfig(
            64,
            10,
            hidden=(128,) * args.layers,
            spike=spike,
            readout=readout,
            threshold=args.threshold,
            readout_drive=args.drive,
        )
        result = train_seeds(net, dataclasses.replace(recipe, loss=loss), args.seeds, splits=splits)
        best_val = result.val_accuracy.max(axis=1)
        rows[name] = {
            "readout": readout,
            "loss": loss,
            "val_best_per_seed": best_val.tolist(),
            "val_best_mean": float(best_val.mean()),
            "val_last_mean": float(result.val_accuracy[:, -1].mean()),
            "train_loss_epoch5": float(result.train_loss[:, 4].mean()) if args.epochs >= 5 else None,
            "train_loss_epoch10": float(result.train_loss[:, 9].mean()) if args.epochs >= 10 else None,
            "spike_rate": result.spike_rate.mean(axis=0).tolist(),
            "all_finite": bool(result.all_finite.all()),
            "seconds": result.seconds,
        }
        print(
            f"[{time.perf_counter() - started:6.0f} s] {name}: val best {100 * best_val.mean():.2f}% "
            f"({', '.join(f'{100 * v:.2f}' for v in best_val)}), loss ep5 {rows[name]['train_loss_epoch5']}, "
            f"ep10 {rows[name]['train_loss_epoch10']}",
            flush=True,
        )
    if "ann" in rows:
        ann = np.asarray(rows["ann"]["val_best_per_seed"])
        for row in rows.values():
            row["paired_gap_to_ann_points"] = float(100 * np.mean(ann - np.asarray(row["val_best_per_seed"])))
    record = {"args": vars(args) | {"out": str(args.out)}, "rows": rows, "load": os.getloadavg()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    for name, row in rows.items():
        print(f"{name:24s} val {100 * row['val_best_mean']:6.2f}%  gap to ann {row.get('paired_gap_to_ann_points')}")


if __name__ == "__main__":
    main()
