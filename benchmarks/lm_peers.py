"""Training-step time of the LM under Qwix's QAT and stejax's rules: the LM group of ``stejax bench --suite peers``.

    .venv/bin/python benchmarks/lm_peers.py [--repeats 30] [--warmup 3] [--quick]

One :class:`stejax.lm.Transformer` (the quick tier's architecture, batch 16), quantised on
the block linears by each library (:mod:`stejax.bench._peers_lm`): ``qwix int8`` against
``stejax w8a8`` (int8 per-channel weights, int8 per-token activations), ``qwix int4
weight-only`` against ``stejax w4 weight-only`` (int4 per group of 32). Interleaved rounds;
prints the p10/p50/p90 of the per-round ratios and the load average.
"""

from __future__ import annotations

import argparse
import os

from stejax.bench._peers_lm import lm_peer_groups


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    options = parser.parse_args(argv)
    start = os.getloadavg()
    groups, _ = lm_peer_groups(repeats=options.repeats, warmup=options.warmup, quick=options.quick)
    print(f"load average at start {start}, at end {os.getloadavg()}; {options.repeats} interleaved rounds")
    for group in groups:
        print(group["name"])
        for name, variant in group["variants"].items():
            print(f"  {name:>24}: p50 {variant['stats_ms']['p50_ms']:8.2f} ms")
        for name, stats in group["ratios"].items():
            print(f"  {name:>44}: p50 {stats['p50']:.3f} (p10 {stats['p10']:.3f}, p90 {stats['p90']:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
