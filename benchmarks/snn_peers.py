"""Spyx beside stejax.snn: the two-layer LIF training step at T = 8, 25 and 100 (the spiking groups of the peers suite).

Usage::

    .venv/bin/python benchmarks/snn_peers.py --repeats 30 --warmup 3 --out bench-out/snn-peers.json

``stejax bench --suite peers`` runs the same groups after the Qwix one. Prints one line per T:
each variant's median step and the p10/p50/p90 of the per-round ratio stejax / Spyx.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from stejax.bench._peers_snn import snn_peer_groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    load_before = os.getloadavg()
    groups, notes = snn_peer_groups(repeats=args.repeats, warmup=args.warmup, quick=args.quick)
    for g in groups:
        medians = ", ".join(f"{k} {v['stats_ms']['p50_ms']:.3f} ms" for k, v in g["variants"].items())
        r = g["ratios"]["stejax/spyx"]
        print(f"{g['name']}: {medians}; stejax/spyx p10 {r['p10']:.3f} p50 {r['p50']:.3f} p90 {r['p90']:.3f}")
    for note in notes:
        print("note:", note)
    print(f"load average before {load_before}, after {os.getloadavg()}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        record = {"groups": groups, "notes": notes, "load": [load_before, os.getloadavg()]}
        args.out.write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
