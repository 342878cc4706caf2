"""Choose the training recipe without the test split: repeated holdout inside train + validation.

The digits test split of ``data_seed`` stays untouched. The training and
validation parts are pooled and split again ``--repeats`` times (stratified, a
fresh seed each time) into train / validation / held-out parts; each candidate
recipe trains on every such split and is scored on its held-out part. The mean
held-out accuracy ranks the candidates.

    python benchmarks/recipe_cv.py --repeats 10        # every candidate: about 8 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

import numpy as np

from stejax.data import load_digits, split
from stejax.train import TrainConfig, train

CANDIDATES = {
    "cnn 32-64, per-feature standardisation": {"normalize": "feature"},
    "cnn 32-64, global standardisation (the default)": {},
    "cnn 32-64-64": {"channels": (32, 64, 64), "strides": (1, 2, 1)},
    "cnn 64-128": {"channels": (64, 128)},
    "cnn 64-128, dropout 0.3": {"channels": (64, 128), "dropout": 0.3},
    "dropout 0.1": {"dropout": 0.1},
    "dropout 0.3": {"dropout": 0.3},
    "adamw, weight decay 1e-2": {"optimizer": "adamw", "weight_decay": 1e-2},
    "learning rate 1e-3": {"learning_rate": 1e-3},
    "batch 32": {"batch_size": 32},
    "80 epochs, patience 30": {"epochs": 80, "patience": 30},
    "mlp 256-256, global standardisation": {"model": "mlp"},
}


def pooled(data_seed: int):
    """Train + validation of ``data_seed``'s split, as one dataset; the test part is left out."""
    digits = load_digits()
    parts = split(digits, seed=data_seed)
    rows = np.sort(np.concatenate([parts.train_index, parts.val_index]))
    return dataclasses.replace(digits, x=digits.x[rows], y=digits.y[rows], name="digits[train+val]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--preset", default="float")
    parser.add_argument("--only", action="append", default=None, metavar="NAME", help="only this candidate")
    args = parser.parse_args()
    data = pooled(args.data_seed)
    print(f"{len(data)} pooled examples; held-out accuracy % over {args.repeats} splits, preset {args.preset}")
    for name, fields in CANDIDATES.items():
        if args.only and name not in args.only:
            continue
        scores = []
        for r in range(args.repeats):
            splits = split(data, seed=1000 + r, val_fraction=0.15, test_fraction=0.2)
            result = train(TrainConfig(preset=args.preset, seed=r, **fields), splits=splits)
            scores.append(100 * result.test_accuracy)
        print(f"{name:40s} mean {statistics.mean(scores):6.2f}  std {statistics.stdev(scores):5.2f}  {scores}")


if __name__ == "__main__":
    main()
