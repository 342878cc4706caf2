"""The surrogate comparison on the digits: the library's ``stejax.snn.compare``, tier by tier.

Usage::

    .venv/bin/python benchmarks/snn_compare.py --out bench-out/snn-full            # the full grid
    .venv/bin/python benchmarks/snn_compare.py --out bench-out/snn-h1t25 --layers 1 --steps 25
    .venv/bin/python benchmarks/snn_compare.py --out bench-out/snn-quick --quick

``stejax snn compare`` runs the same function. Progress goes to stdout, one line per configuration.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

from stejax.snn import FULL, QUICK, compare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--layers", type=int, nargs="*", help="hidden layer counts (default: the tier's)")
    parser.add_argument("--steps", type=int, nargs="*", help="values of T (default: the tier's)")
    parser.add_argument("--configs", nargs="*", help="configuration names (default: the tier's)")
    args = parser.parse_args()
    tier = QUICK if args.quick else FULL
    if args.layers:
        tier = dataclasses.replace(tier, hidden_layers=tuple(args.layers))
    if args.steps:
        tier = dataclasses.replace(tier, steps=tuple(args.steps))
    if args.configs:
        tier = dataclasses.replace(tier, configs=tuple(args.configs))
    started = time.perf_counter()

    def show(event):
        rest = {k: v for k, v in event.items() if k not in ("event", "config")}
        print(f"[{time.perf_counter() - started:7.1f} s] {event['config']}: {json.dumps(rest)}", flush=True)

    report = compare(tier, out_dir=args.out, on_event=show)
    for t in report["targets"]:
        print(f"{t['target']}: {t['measured']} (met: {t['met']})")


if __name__ == "__main__":
    main()
