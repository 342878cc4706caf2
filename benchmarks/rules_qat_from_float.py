"""QAT from a float checkpoint against w4a4 from scratch, on the digits CNN, with quantize_model's rules.

For each seed, the same plain NNX model (:class:`stejax.flax.models.DigitsCNN`)
and the same total number of Adam steps (batch 64, cosine schedule):

* **from float**: train float for ``--float-steps``, ``quantize_model`` with
  the w4a4 rules, ``calibrate`` on 1024 training rows (the PTQ accuracy is
  measured here), then fine-tune for ``--qat-steps``;
* **from scratch**: ``quantize_model`` the freshly initialised model with the
  same rules, calibrate, train for ``--float-steps + --qat-steps``.

The w4a4 rules: LSQ per-channel 4-bit weights and unsigned 4-bit LSQ inputs,
the first convolution at 8 bits (its inputs are signed standardised pixels).
Each seed has its own stratified split (``data_seed = seed``), and both arms
run on it, so the comparison is paired: prints per seed, the mean and standard
deviation of each test accuracy, and the paired differences (points, mean,
standard error over seeds, 95% Student-t interval: :func:`stejax.train.paired_delta`)
of QAT from float against w4a4 from scratch and against float, and of PTQ against float.

    nice -n 10 python benchmarks/rules_qat_from_float.py [--seeds 5] [--float-steps 600] [--qat-steps 300]
"""

from __future__ import annotations

import argparse
import statistics

import jax
import jax.numpy as jnp
from flax import nnx

from stejax.data import Normalizer, load_digits, split
from stejax.flax import calibrate, quantize_model
from stejax.flax.example import W4A4_RULES, accuracy_of, adam_steps, qat_from_float
from stejax.flax.models import DigitsCNN
from stejax.train import paired_delta


def run(seed: int, float_steps: int, qat_steps: int) -> dict[str, float]:
    """Both arms on the seed's split: the recipe (:func:`stejax.flax.example.qat_from_float`) and w4a4 from scratch."""
    splits = split(load_digits(), seed=seed)
    _, result = qat_from_float(seed, float_steps=float_steps, qat_steps=qat_steps, splits=splits)
    norm = Normalizer.fit(splits.train.x)
    train = (jnp.asarray(norm.apply(splits.train.x)), jnp.asarray(splits.train.y))
    test = (jnp.asarray(norm.apply(splits.test.x)), jnp.asarray(splits.test.y))
    scratch = quantize_model(DigitsCNN(rngs=nnx.Rngs(seed)), list(W4A4_RULES), train[0][:64])
    calibrate(scratch, [train[0][i : i + 256] for i in range(0, 1024, 256)])
    adam_steps(scratch, train, float_steps + qat_steps, 3e-3, seed)
    return {
        "float": result["float"],
        "ptq_w4a4": result["ptq"],
        "qat_from_float": result["qat_from_float"],
        "w4a4_scratch": accuracy_of(scratch, test),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--float-steps", type=int, default=600)
    parser.add_argument("--qat-steps", type=int, default=300)
    args = parser.parse_args()
    rows = []
    for seed in range(args.seeds):
        r = run(seed, args.float_steps, args.qat_steps)
        rows.append(r)
        print(f"seed {seed}: " + "  ".join(f"{k} {v:.4f}" for k, v in r.items()), flush=True)
    for k in rows[0]:
        values = [r[k] for r in rows]
        sd = statistics.stdev(values) if len(values) > 1 else float("nan")
        print(f"{k:15s} mean {statistics.mean(values):.4f}  sd {sd:.4f}  (n={len(values)})")
    for a, b in (("qat_from_float", "w4a4_scratch"), ("qat_from_float", "float"), ("ptq_w4a4", "float")):
        d = paired_delta([r[a] for r in rows], [r[b] for r in rows])
        se = "n/a" if d["se"] is None else f"{d['se']:.2f}"
        ci = "" if d["ci95"] is None else f"  95% [{d['ci95'][0]:+.2f}, {d['ci95'][1]:+.2f}]"
        print(f"{a} - {b}: {d['mean']:+.2f} points, se {se}{ci} (paired, n={len(rows)})")
    print(f"jax {jax.__version__}, backend {jax.default_backend()}")


if __name__ == "__main__":
    main()
