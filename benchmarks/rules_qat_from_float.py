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
import numpy as np
import optax
from flax import nnx

from stejax.data import Normalizer, load_digits, split
from stejax.flax import Quant, Rule, calibrate, quantize_model
from stejax.flax.models import DigitsCNN
from stejax.train import paired_delta

W4A4 = [
    Rule(r"conv1", weights=Quant("lsq", bits=8), inputs=Quant("lsq", bits=8)),
    Rule(weights=Quant("lsq", bits=4, axis=-1), inputs=Quant("lsq", bits=4, signed=False)),
]


def _loss(model, x, y):
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(model(x), y))


@nnx.jit
def _step(model, optimizer, x, y):
    loss, grads = nnx.value_and_grad(_loss)(model, x, y)
    optimizer.update(model, grads)
    return loss


@nnx.jit
def _correct(model, x, y):
    return jnp.sum(jnp.argmax(model(x), axis=-1) == y)


def fit(model, data, steps: int, lr: float, seed: int) -> None:
    x, y = data
    optimizer = nnx.Optimizer(model, optax.adam(optax.cosine_decay_schedule(lr, steps)), wrt=nnx.Param)
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        rows = rng.choice(len(x), 64, replace=False)
        _step(model, optimizer, x[rows], y[rows])


def accuracy(model, data) -> float:
    x, y = data
    return int(_correct(model, x, y)) / len(y)


def run(seed: int, float_steps: int, qat_steps: int) -> dict[str, float]:
    splits = split(load_digits(), seed=seed)
    norm = Normalizer.fit(splits.train.x)
    train = (jnp.asarray(norm.apply(splits.train.x)), jnp.asarray(splits.train.y))
    test = (jnp.asarray(norm.apply(splits.test.x)), jnp.asarray(splits.test.y))
    calib = [train[0][i : i + 256] for i in range(0, 1024, 256)]

    model = DigitsCNN(rngs=nnx.Rngs(seed))
    fit(model, train, float_steps, 3e-3, seed)
    float_acc = accuracy(model, test)
    qat = quantize_model(model, W4A4, train[0][:64])
    calibrate(qat, calib)
    ptq_acc = accuracy(qat, test)
    fit(qat, train, qat_steps, 1e-3, seed + 1000)
    from_float = accuracy(qat, test)

    scratch = quantize_model(DigitsCNN(rngs=nnx.Rngs(seed)), W4A4, train[0][:64])
    calibrate(scratch, calib)
    fit(scratch, train, float_steps + qat_steps, 3e-3, seed)
    return {
        "float": float_acc,
        "ptq_w4a4": ptq_acc,
        "qat_from_float": from_float,
        "w4a4_scratch": accuracy(scratch, test),
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
