"""The integer product's declared gradient against the exact straight-through one: the results file.

Run from the repository root:

    .venv/bin/python benchmarks/int_gradient_error.py [--results docs/results]

Two measurements, both on CPU, seeded:

* random data: :func:`stejax.verify.check_integer_product` on a (4, 256, 512) x
  (512, 384) float32 product (standard normal operands and cotangent) for each
  scale granularity and rounding; every row also records that the forward and
  both declared cotangents equal the NumPy reference bit for bit;
* a real training batch: the LM (width 128, 2 blocks, context 128) with
  ``w8a8`` products, 32 windows of the LM corpus (the installed jax's .py
  files): the relative L2 error of the whole gradient with ``product="int8"``
  to ``product="int8-forward"`` (the same integer forward, float backward),
  at initialisation.

Writes ``DIR/int_gradient_error.json``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from stejax.bench.results import Figure, Recorder
from stejax.lm import LMConfig, Transformer, build_corpus, lm_quant, quantize_lm
from stejax.verify import check_integer_product, gradient_error

CASES = {
    "per token x per channel, nearest": {},
    "per token x per channel, stochastic": {"rounding": "stochastic", "key": jax.random.key(7)},
    "groups of 128, nearest": {"group_size": 128},
    "per tensor, nearest": {"lhs_scale": "tensor", "rhs_scale": "tensor"},
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=Path("docs/results"), metavar="DIR", help="where to write")
    options = parser.parse_args(argv)
    recorder = Recorder("int_gradient_error", command="python benchmarks/int_gradient_error.py")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 256, 512)).astype(np.float32)
    w = rng.standard_normal((512, 384)).astype(np.float32)
    rows = []
    for name, case in CASES.items():
        result = check_integer_product(x, w, (((2,), (0,)), ((), ())), seed=1, **case)
        rows.append(
            {
                "data": "random normal, (4, 256, 512) x (512, 384)",
                "case": name,
                "exact": result.ok,
                "input_grad_error": result.lhs_grad_error,
                "weight_grad_error": result.rhs_grad_error,
            }
        )
    config = LMConfig(context=128, width=128, depth=2, heads=2, hidden=352, norms="llama")
    model = Transformer(config, rngs=nnx.Rngs(params=0))
    stream = build_corpus().data["train"]
    starts = np.random.default_rng(2).integers(0, stream.size - config.context - 1, 32)
    batch = np.stack([stream[s : s + config.context + 1] for s in starts])
    tokens, labels = jnp.asarray(batch[:, :-1]), jnp.asarray(batch[:, 1:].astype(np.int32))

    def loss_for(product: str):
        graphdef, params, rest = nnx.split(quantize_lm(model, lm_quant("w8a8", product=product)), nnx.Param, ...)

        def loss(p):
            return optax.softmax_cross_entropy_with_integer_labels(nnx.merge(graphdef, p, rest)(tokens), labels).mean()

        return loss, params

    declared, params = loss_for("int8")
    lm = gradient_error(declared, loss_for("int8-forward")[0], params)
    rows.append(
        {
            "data": f"LM batch of 32 x {config.context} corpus bytes, width {config.width}, {config.depth} blocks",
            "case": "w8a8, every parameter's gradient",
            "exact": None,
            "input_grad_error": None,
            "weight_grad_error": None,
            "model_grad_error": lm["total"],
            "worst_leaf": lm["worst_leaf"],
        }
    )
    nearest = rows[0]
    recorder.write(
        options.results / "int_gradient_error.json",
        rows=rows,
        columns=[
            ("data", "data"),
            ("case", "scales, rounding"),
            ("exact", "bit for bit with the reference"),
            ("input_grad_error", "input gradient", "{:.2%}"),
            ("weight_grad_error", "weight gradient", "{:.2%}"),
            ("model_grad_error", "every parameter's gradient", "{:.2%}"),
        ],
        figures={
            "random_input": Figure(nearest["input_grad_error"], f"{nearest['input_grad_error']:.2%}"),
            "random_weight": Figure(nearest["weight_grad_error"], f"{nearest['weight_grad_error']:.2%}"),
            "lm_batch": Figure(lm["total"], f"{lm['total']:.2%}"),
            "lm_worst_leaf": Figure(lm["worst_leaf"], f"{lm['worst_leaf']:.2%}"),
        },
        notes=(
            "Relative L2 error ||declared - STE|| / ||STE|| of the int8 backward's cotangents to the exact "
            "straight-through gradient of the same integer forward (float backward products)."
        ),
    )
    for r in rows:
        print(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
