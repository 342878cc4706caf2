"""What the int8 step's integer products cost (issue 12): stejax int8's step with each product's variant, interleaved.

The MLP 64-256-256-10 (random weights, batch 64, Adam), each layer's product computed as: `fake_quant`
(`fake_quant(u) @ fake_quant(w)`, float32 products), `quantized_matmul` (int8 codes, int32 sums), the same without
its NaN check, with the NaN check as `isnan(codes).any()` (its first version), and with Qwix's backward (the float
product's gradient with the unquantised operands, no masks). Scales from `absmax_scale` (per tensor for the inputs,
per output column for the weights). CPU time (`time.process_time`, 3 calls per sample); ratios to `fake_quant` are
the p50 of per-round ratios. Then one 64x256 by 256x256 product in float32 and as int8 x int8 -> int32.

    python benchmarks/int8_products_ablation.py [--repeats 200]
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax

import stejax
from stejax.bench import measure
from stejax.estimators import products

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--repeats", type=int, default=200, help="interleaved rounds (default 200)")
args = parser.parse_args()


def integer_forward(nan_check):
    def forward(x, w, x_scale, w_scale, *, bits):
        qx = products._codes(x, x_scale, bits)[3]
        qw = products._codes(w, products._columns(w_scale, 2), bits)[3]
        dims = products._contract(x, w)
        acc = jax.lax.dot_general(qx.astype(jnp.int8), qw.astype(jnp.int8), dims, preferred_element_type=jnp.int32)
        y = acc.astype(jnp.float32) * x_scale * products._columns(w_scale, x.ndim)
        if nan_check == "any":
            y = jnp.where(jnp.isnan(qx).any(-1, keepdims=True) | jnp.isnan(qw).any(0)[None, :], jnp.nan, y)
        return y

    return forward


def unquantised_tangent(x, w, x_scale, w_scale, *, tangents, bits):
    tx, tw = tangents
    return tx @ w + x @ tw


def estimator(forward, tangent):
    fn = stejax.surrogate(forward, tangent=tangent, diff_argnums=(0, 1))
    return lambda x, w, sx, sw: fn(x, w, sx, sw, bits=8)


VARIANTS = {
    "fake_quant": lambda x, w, sx, sw: stejax.fake_quant(x, sx, bits=8) @ stejax.fake_quant(w, sw, bits=8, axis=1),
    "quantized_matmul": lambda x, w, sx, sw: stejax.quantized_matmul(x, w, sx, sw, bits=8),
    "no NaN check": estimator(integer_forward(None), products._quantized_matmul_tangent),
    "NaN check by any()": estimator(integer_forward("any"), products._quantized_matmul_tangent),
    "Qwix's backward": estimator(products._quantized_matmul_forward, unquantised_tangent),
}


def make_step(product, optimizer):
    def loss(params, x, y):
        h = x
        for i, layer in enumerate(params):
            sx, sw = stejax.absmax_scale(h, bits=8), stejax.absmax_scale(layer["w"], bits=8, axis=1)
            h = product(h, layer["w"], sx, sw) + layer["b"][None, :]
            if i < len(params) - 1:
                h = jax.nn.relu(h)
        return optax.softmax_cross_entropy_with_integer_labels(h, y).mean()

    def step(params, state, x, y):
        value, grads = jax.value_and_grad(loss)(params, x, y)
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    return jax.jit(step)


def interleaved(calls, repeats, per_sample):
    """CPU seconds per call, interleaved rounds after 10 warm-up calls (`stejax.bench.measure`)."""
    measured = measure(calls, repeats=repeats, warmup=10, clock="cpu", calls_per_sample=per_sample)
    return {name: np.array(m["seconds"]) for name, m in measured.items()}


sizes = (64, 256, 256, 10)
keys = jax.random.split(jax.random.key(0), len(sizes) + 1)
params = [
    {"w": 0.1 * jax.random.normal(k, (a, b)), "b": jnp.zeros(b)}
    for k, a, b in zip(keys, sizes[:-1], sizes[1:], strict=False)
]
x = jax.random.normal(keys[-2], (64, sizes[0]))
y = jax.random.randint(keys[-1], (64,), 0, sizes[-1])
optimizer = optax.adam(1e-3)
state = optimizer.init(params)
calls = {}
for name, product in VARIANTS.items():
    step = make_step(product, optimizer)
    calls[name] = lambda step=step: step(params, state, x, y)
    fusions = step.lower(params, state, x, y).compile().as_text().count("fusion(")
    print(f"{name:20s} {fusions} fusions in the compiled step")
seconds = interleaved(calls, args.repeats, 3)
for name, s in seconds.items():
    ratio = np.median(s / seconds["fake_quant"])
    print(f"{name:20s} p50 {1e3 * np.median(s):.3f} ms CPU, / fake_quant p50 {ratio:.3f}")

a = jax.random.normal(keys[0], (64, 256))
b = jax.random.normal(keys[1], (256, 256))
ai, bi = (30 * a).astype(jnp.int8), (30 * b).astype(jnp.int8)
float_dot = jax.jit(lambda a, b: a @ b)
int_dot = jax.jit(lambda a, b: jax.lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=jnp.int32))
dots = interleaved({"float32": lambda: float_dot(a, b), "int8 -> int32": lambda: int_dot(ai, bi)}, args.repeats, 20)
for name, s in dots.items():
    print(f"64x256 @ 256x256 {name:14s} p50 {1e6 * np.median(s):.1f} us CPU per call")
