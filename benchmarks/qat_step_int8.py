"""The QAT step against Qwix's (issue 12), the peers suite's functional-pipeline group alone with more rounds.

The set-up is `stejax.bench._peers.mlp_group` itself (the reference MLP 64-256-256-10, batch 64, the same optax
optimiser for every variant): stejax float, stejax w8a8 (LSQ) with and without its zero-gradient fractions,
stejax int8 (Qwix's scheme from the catalog), flax float and qwix int8, timed in interleaved rounds; the ratios are
the p50 (p10, p90) of the per-round ratios.

    python benchmarks/qat_step_int8.py [--repeats 300]
"""

import argparse
import json

from stejax.bench._peers import mlp_group

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--repeats", type=int, default=300, help="interleaved rounds (default 300)")
parser.add_argument("--warmup", type=int, default=10, help="untimed calls per variant first (default 10)")
args = parser.parse_args()

group, notes, _ = mlp_group(repeats=args.repeats, warmup=args.warmup, quick=False)
for name, variant in group["variants"].items():
    print(f"{name:30s} p50 {variant['stats_ms']['p50_ms']:.3f} ms")
for name, ratio in group["ratios"].items():
    print(f"{name:45s} p50 {ratio['p50']:.3f} (p10 {ratio['p10']:.3f}, p90 {ratio['p90']:.3f})")
print(json.dumps({"qwix_quantised_dot_generals": group["info"]["qwix_quantised_dot_generals"]}))
