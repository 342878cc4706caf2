"""The QAT step against Qwix's (issue 12): stejax int8 (Qwix's scheme from the catalog) vs qwix int8, and the w8a8 step
with and without its statistics, on the reference MLP (64-256-256-10, batch 64), 200 interleaved rounds.

    python benchmarks/qat_step_int8.py
"""

import itertools
import json
import warnings

import jax
import jax.numpy as jnp
import optax
import qwix
from flax import nnx

from stejax.bench._measure import compare, standard_promotion
from stejax.bench._peers import _int8_step, _nnx_steps
from stejax.data import Normalizer
from stejax.model import init_params, preset
from stejax.train import Batch, TrainConfig, compiled_update, load_splits, make_optimizer

config = TrainConfig(model="mlp", dropout=0.0)
splits = load_splits(config)
normalizer = Normalizer.fit(splits.train.x)
x = jnp.asarray(normalizer.apply(splits.train.x[:64]))
y = jnp.asarray(splits.train.y[:64])
opt = make_optimizer(config, len(splits.train) // 64)
mc = config.model_config(splits.train)
sizes = (mc.in_features, *mc.hidden, mc.n_classes)
calls = {}
batch = Batch(x, y)
for name in ("float", "w8a8"):
    qc = preset(name)
    p = init_params(jax.random.key(0), mc, qc)
    st = opt.init(p)
    step = compiled_update(mc, qc, opt)
    calls[f"stejax {name}"] = lambda step=step, p=p, s=st: step(p, s, batch, None)
    if name == "w8a8":
        bare = compiled_update(mc, qc, opt, statistics=False)
        calls["stejax w8a8 (no statistics)"] = lambda step=bare, p=p, s=st: step(p, s, batch, None)
p8 = init_params(jax.random.key(0), mc, preset("float"))
s8 = opt.init(p8)
st8 = _int8_step(opt)
calls["stejax int8"] = lambda: st8(p8, s8, x, y)


class MLP(nnx.Module):
    def __init__(self, sizes, rngs):
        self.layers = nnx.List([nnx.Linear(a, b, rngs=rngs) for a, b in itertools.pairwise(sizes)])

    def __call__(self, h):
        for i, layer in enumerate(self.layers):
            h = layer(h)
            if i < len(self.layers) - 1:
                h = jax.nn.relu(h)
        return h


with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    with standard_promotion():
        fm = MLP(sizes, nnx.Rngs(0))
        qm = qwix.quantize_model(
            fm, qwix.QtProvider([qwix.QtRule(module_path=".*", weight_qtype=jnp.int8, act_qtype=jnp.int8)]), x
        )
    calls.update(_nnx_steps(nnx, optax, opt, {"qwix int8": qm}, x, y))
print("qwix quantised dots", calls.pop("_quantised_dots"))
g = compare(
    "int8",
    calls,
    repeats=200,
    warmup=10,
    ratios=[
        ("stejax int8", "qwix int8"),
        ("stejax w8a8", "stejax float"),
        ("stejax w8a8 (no statistics)", "stejax w8a8"),
        ("stejax w8a8 (no statistics)", "stejax float"),
    ],
    info={},
)
print(json.dumps(g.get("ratios"), indent=0))
for k, v in g.get("variants", g).items() if isinstance(g.get("variants"), dict) else []:
    print(k, v)
