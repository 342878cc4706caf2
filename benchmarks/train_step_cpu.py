"""The default recipe's CNN training step with and without its zero-gradient fractions, in CPU time (issue 12).

float, w8a8 and w4a4, each as `compiled_update` (with the fractions) and as `compiled_train_step(..., log=False)` (the
step `train` takes on every batch but an epoch's last), timed with `time.process_time` (robust to a loaded machine:
time spent descheduled is not counted), `--calls` calls per sample, interleaved rounds; ratios are the p50 (p10, p90)
of the per-round ratios.

    python benchmarks/train_step_cpu.py [--rounds 150] [--calls 3]
"""

import argparse

import jax

from stejax import keys
from stejax.bench._measure import measure, ratio_stats
from stejax.bench._train import step_setup
from stejax.model import init_params, preset
from stejax.train import compiled_train_step, compiled_update

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--rounds", type=int, default=150, help="interleaved rounds (default 150)")
parser.add_argument("--calls", type=int, default=3, help="calls per sample (default 3)")
args = parser.parse_args()

# The train suite's own set-up (stejax bench --suite train): the default recipe's CNN, batch and optimiser.
_, model_config, batch, optimizer = step_setup(quick=False)
step_keys = list(keys.split(jax.random.key(7), 64))
calls = {}
for name in ("float", "w8a8", "w4a4"):
    qat_config = preset(name)
    params = init_params(jax.random.key(0), model_config, qat_config)
    state = optimizer.init(params)
    with_fractions = compiled_update(model_config, qat_config, optimizer)
    train_step = compiled_train_step(model_config, qat_config, optimizer)
    calls[f"{name} stats"] = lambda f=with_fractions, p=params, s=state: f(p, s, batch, step_keys[0])
    calls[f"{name} train step"] = lambda f=train_step, p=params, s=state: f(p, s, batch, step_keys[0], False)
measured = measure(calls, repeats=args.rounds, warmup=3, clock="cpu", calls_per_sample=args.calls)
for name, m in measured.items():
    print(f"{name:18s} p50 {m['stats_ms']['p50_ms']:.3f} ms CPU")
pairs = [("w8a8 train step", "float train step"), ("w4a4 train step", "float train step")]
pairs += [(f"{q} train step", f"{q} stats") for q in ("float", "w8a8", "w4a4")]
for a, b in pairs:
    ratio = ratio_stats(measured[a]["seconds"], measured[b]["seconds"])
    print(f"{a:18s} / {b:18s} p50 {ratio['p50']:.3f} (p10 {ratio['p10']:.3f}, p90 {ratio['p90']:.3f})")
