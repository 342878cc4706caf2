"""Merge ``stejax vq compare`` runs of disjoint parts of one grid (here one per code dimension) into one report.

Run from the repository root after the parts, which can run side by side:

    stejax vq compare --code-dims 8 --workers 3 --out bench-out/vq-d8
    stejax vq compare --code-dims 32 --workers 3 --out bench-out/vq-d32
    .venv/bin/python benchmarks/vq_merge.py bench-out/vq-d8 bench-out/vq-d32 --out bench-out/vq-compare \\
        --results docs/results --figures docs/img/vq

The parts must share every setting but the grid; the merged report has all their per-seed rows, the summary and
MSE / FSQ recomputed, the targets judged on the whole grid, and the parts' programs, compilations and seconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path

from stejax.vq import CompareSettings, judge_targets, write_report
from stejax.vq._compare import _add_fsq_ratios, summarize
from stejax.vq._results import record

_GRID = ("codebook_sizes", "code_dims")


def merge(parts: list[dict]) -> dict:
    first = parts[0]["settings"]
    for p in parts[1:]:
        other = {k: v for k, v in p["settings"].items() if k not in _GRID}
        if other != {k: v for k, v in first.items() if k not in _GRID}:
            raise ValueError("vq_merge: the parts differ in a setting other than the grid.")
    rows = [r for p in parts for r in p["rows"]]
    _add_fsq_ratios(rows)
    grid = {key: tuple(sorted({v for p in parts for v in p["settings"][key]})) for key in _GRID}
    fields = {f.name for f in dataclasses.fields(CompareSettings)}
    settings = CompareSettings(**{k: tuple(v) if isinstance(v, list) else v for k, v in first.items() if k in fields})
    settings = dataclasses.replace(settings, **grid)
    summary = summarize(rows)
    summary.sort(key=lambda e: (e["code_dim"], e["codebook_size"], settings.variants.index(e["variant"])))
    return {
        "rows": rows,
        "summary": summary,
        "targets": judge_targets(summary, settings),
        "data": {**parts[0]["data"], "max_codebook_size": max(settings.codebook_sizes)},
        "programs": [q for p in parts for q in p["programs"]],
        "compiles": sum(p["compiles"] for p in parts),
        "seconds": max(p["seconds"] for p in parts),
        "wall_seconds": max(p.get("wall_seconds", p["seconds"]) for p in parts),
        "workers": [p["workers"] for p in parts],
        "settings": dataclasses.asdict(settings),
        "variants": parts[0]["variants"],
        "parts": [{"code_dims": p["settings"]["code_dims"], "wall_seconds": p.get("wall_seconds")} for p in parts],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("parts", nargs="+", help="The --out folders of the parts.")
    parser.add_argument("--out", required=True)
    parser.add_argument("--results", default=None)
    parser.add_argument("--figures", default=None)
    parser.add_argument("--command", required=True, help="The commands that produced the parts, for the file.")
    parser.add_argument("--date", default=None, help="When the parts started (ISO 8601).")
    parser.add_argument("--load-start", type=float, default=None, help="The load average when they started.")
    args = parser.parse_args()
    parts = [json.loads((Path(p) / "report.json").read_text()) for p in args.parts]
    report = merge(parts)
    write_report(report, args.out, figures_dir=args.figures)
    if args.results:
        provenance = {}
        if args.date:
            provenance["date"] = args.date
        if args.load_start is not None:
            provenance["load"] = {"start": args.load_start, "end": round(os.getloadavg()[0], 2)}
        record(report, Path(args.results) / "vq_compare.json", command=args.command, **provenance)
    for t in report["targets"]:
        print(f"{'MET' if t['passed'] else 'MISSED'} {t['name']}: {t['detail']}")


if __name__ == "__main__":
    main()
