"""The QAT step against Qwix's (issue 12), the peers suite's functional-pipeline group alone with more rounds.

The set-up is `stejax.bench._peers.mlp_calls` itself (the reference MLP 64-256-256-10, batch 64, the same optax
optimiser for every variant): stejax float, stejax w8a8 (LSQ) with and without its zero-gradient fractions, both as
`stejax.train.train` runs them (the train step, on every batch but an epoch's last), stejax int8 (Qwix's scheme from
the catalog; again with its products on int8 codes, `stejax.quantized_matmul`: "stejax int8 (integer products)"),
flax float and qwix int8 (one activation scale per tensor, as stejax int8), timed in interleaved rounds;
the ratios are the p50 (p10, p90) of the per-round ratios. Wall clock by default (`stejax.bench.compare`); with
`--cpu`, `time.process_time` per call (`--calls` calls per sample: time spent descheduled on a loaded machine is not
counted, the threads' work is).

    python benchmarks/qat_step_int8.py [--repeats 300] [--cpu [--calls 3]]
"""

import argparse
import json

from stejax.bench._measure import measure, ratio_stats
from stejax.bench._peers import mlp_calls, mlp_group

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--repeats", type=int, default=300, help="interleaved rounds (default 300)")
parser.add_argument("--warmup", type=int, default=10, help="untimed calls per variant first (default 10)")
parser.add_argument("--cpu", action="store_true", help="CPU time (time.process_time) instead of wall clock")
parser.add_argument("--calls", type=int, default=3, help="with --cpu: calls per sample (default 3)")
args = parser.parse_args()

if not args.cpu:
    group, notes, _ = mlp_group(repeats=args.repeats, warmup=args.warmup, quick=False)
    medians = {name: variant["stats_ms"]["p50_ms"] for name, variant in group["variants"].items()}
    ratios = group["ratios"]
    quantised_dots = group["info"]["qwix_quantised_dot_generals"]
    clock = "wall"
else:
    calls, pairs, info, notes, _ = mlp_calls(quick=False)
    quantised_dots = info["qwix_quantised_dot_generals"]
    measured = measure(calls, repeats=args.repeats, warmup=args.warmup, clock="cpu", calls_per_sample=args.calls)
    medians = {name: m["stats_ms"]["p50_ms"] for name, m in measured.items()}
    ratios = {f"{a}/{b}": ratio_stats(measured[a]["seconds"], measured[b]["seconds"]) for a, b in pairs}
    clock = "CPU"
for name, ms in medians.items():
    print(f"{name:30s} p50 {ms:.3f} ms {clock}")
for name, ratio in ratios.items():
    print(f"{name:55s} p50 {ratio['p50']:.3f} (p10 {ratio['p10']:.3f}, p90 {ratio['p90']:.3f})")
print(json.dumps({"qwix_quantised_dot_generals": quantised_dots}))
