"""QAT and PTQ accuracy by rules against Qwix on the digits CNN, same scheme, paired over seeds.

For each seed ``s`` (its own stratified split, ``data_seed = s``), the plain NNX
:class:`stejax.flax.models.DigitsCNN` initialised from ``nnx.Rngs(s)`` is trained
``--steps`` Adam steps (batch 64, cosine schedule from 3e-3, the same batch
order for every arm) as:

* **float**;
* **QAT int8**, quantised before training by ``stejax.flax.quantize_model`` and
  by ``qwix.quantize_model`` with ``QtProvider``, one scheme: int8 absmax
  per-output-channel weights recomputed each step, int8 dynamic absmax
  activations **per tensor** (Qwix's provider is told so,
  :func:`stejax.bench._peers_rules.qwix_per_tensor_provider`: by default its dynamic
  activation scales are per example), straight-through backward;
* **QAT w4g32**, the same with int4 weights in groups of 32 along the
  contraction axis on the dense head (``group_size=32`` / ``tile_size=32``), the
  convolutions staying int8: Qwix refuses groups on a convolution, and its int4
  convolutions fail on XLA:CPU (``conv_general_dilated`` of int8 by int4);
* **PTQ int8 and w4g32**: the trained float model quantised as it is (no
  fine-tuning), by stejax's rules and by Qwix's ``PtqProvider``
  (``qwix.quantize_model`` on the float model; its dynamic activation scales stay per example,
  a refusal is reported as nan).

Prints per seed, and for each quantised configuration the mean test accuracy
and the paired difference stejax − Qwix (points; mean, standard error over
seeds, 95% Student-t interval: :func:`stejax.train.paired_delta`).

    nice -n 10 python benchmarks/rules_qwix_accuracy.py [--seeds 5] [--steps 600]
"""

from __future__ import annotations

import argparse
import statistics
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import qwix
from flax import nnx

from stejax.bench._peers_rules import qwix_per_tensor_provider
from stejax.data import Normalizer, load_digits, split
from stejax.flax import Quant, Rule, quantize_model
from stejax.flax.models import DigitsCNN
from stejax.train import paired_delta

ACTS = Quant("fake_quant", bits=8, scale="dynamic")
STEJAX = {
    "int8": [Rule(weights=Quant("fake_quant", bits=8, axis=-1), inputs=ACTS)],
    "w4g32": [
        Rule("head", weights=Quant("fake_quant", bits=4, group_size=32), inputs=ACTS),
        Rule(weights=Quant("fake_quant", bits=8, axis=-1), inputs=ACTS),
    ],
}
QWIX = {
    "int8": [dict(module_path=".*", weight_qtype=jnp.int8, act_qtype=jnp.int8)],
    "w4g32": [
        dict(module_path="head", weight_qtype=jnp.int4, act_qtype=jnp.int8, tile_size=32),
        dict(module_path=".*", weight_qtype=jnp.int8, act_qtype=jnp.int8),
    ],
}


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


def fit(model, data, steps: int, seed: int) -> None:
    """``steps`` Adam steps, batch 64, cosine schedule from 3e-3; the batch order depends on ``seed`` only."""
    x, y = data
    optimizer = nnx.Optimizer(model, optax.adam(optax.cosine_decay_schedule(3e-3, steps)), wrt=nnx.Param)
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        rows = rng.choice(len(x), 64, replace=False)
        loss = _step(model, optimizer, x[rows], y[rows])
    if not np.isfinite(float(loss)):
        raise FloatingPointError(f"fit: the last loss is {float(loss)} (seed {seed}).")


def accuracy(model, data) -> float:
    x, y = data
    return int(_correct(model, x, y)) / len(y)


def qwix_qat(model, scheme: str, x):
    return qwix.quantize_model(model, qwix_per_tensor_provider([qwix.QtRule(**r) for r in QWIX[scheme]]), x)


def qwix_ptq(float_model, scheme: str, x):
    """Qwix's PTQ of the trained float model (its NNX path quantises the weights of the model it is given)."""
    rules = [qwix.QuantizationRule(**r) for r in QWIX[scheme]]
    return qwix.quantize_model(float_model, qwix.PtqProvider(rules), x)


def run(seed: int, steps: int) -> dict[str, float]:
    splits = split(load_digits(), seed=seed)
    norm = Normalizer.fit(splits.train.x)
    train = (jnp.asarray(norm.apply(splits.train.x)), jnp.asarray(splits.train.y))
    test = (jnp.asarray(norm.apply(splits.test.x)), jnp.asarray(splits.test.y))
    example = train[0][:64]
    out: dict[str, float] = {}
    model = DigitsCNN(rngs=nnx.Rngs(seed))
    fit(model, train, steps, seed)
    out["float"] = accuracy(model, test)
    for scheme in STEJAX:
        out[f"stejax ptq {scheme}"] = accuracy(quantize_model(model, STEJAX[scheme], example), test)
        try:
            out[f"qwix ptq {scheme}"] = accuracy(qwix_ptq(model, scheme, example), test)
        except ValueError as e:  # Qwix's PTQ convolution needs act_qtype == weight_qtype
            print(f"seed {seed}: qwix ptq {scheme} refused: {e}", flush=True)
            out[f"qwix ptq {scheme}"] = float("nan")
    for scheme in STEJAX:
        stejax_model = quantize_model(DigitsCNN(rngs=nnx.Rngs(seed)), STEJAX[scheme], example)
        fit(stejax_model, train, steps, seed)
        out[f"stejax qat {scheme}"] = accuracy(stejax_model, test)
        qwix_model = qwix_qat(DigitsCNN(rngs=nnx.Rngs(seed)), scheme, example)
        fit(qwix_model, train, steps, seed)
        out[f"qwix qat {scheme}"] = accuracy(qwix_model, test)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=600)
    args = parser.parse_args()
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Flax warns while tracing Qwix's interception
        for seed in range(args.seeds):
            r = run(seed, args.steps)
            rows.append(r)
            print(f"seed {seed}: " + "  ".join(f"{k} {v:.4f}" for k, v in r.items()), flush=True)
    for k in rows[0]:
        values = [r[k] for r in rows]
        sd = statistics.stdev(values) if len(values) > 1 else float("nan")
        print(f"{k:18s} mean {statistics.mean(values):.4f}  sd {sd:.4f}  (n={len(values)})")
    for mode in ("qat", "ptq"):
        for scheme in STEJAX:
            a, b = f"stejax {mode} {scheme}", f"qwix {mode} {scheme}"
            if any(np.isnan(r[b]) for r in rows):
                print(f"{a} - {b}: not compared ({b} refused on some seed)")
                continue
            d = paired_delta([r[a] for r in rows], [r[b] for r in rows])
            se = "n/a" if d["se"] is None else f"{d['se']:.2f}"
            ci = "" if d["ci95"] is None else f"  95% [{d['ci95'][0]:+.2f}, {d['ci95'][1]:+.2f}]"
            print(f"{a} - {b}: {d['mean']:+.2f} points, se {se}{ci} (paired, n={len(rows)})")
    print(f"jax {jax.__version__}, qwix {qwix.__version__}, backend {jax.default_backend()}")


if __name__ == "__main__":
    main()
