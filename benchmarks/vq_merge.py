"""Merge ``stejax vq compare`` runs of disjoint parts of one grid (here one per set-up) into one report.

Run from the repository root after the parts, which can run side by side:

    stejax vq compare --setups reference --digits --workers 2 --out bench-out/vq-reference
    stejax vq compare --setups gradient --no-digits --workers 2 --out bench-out/vq-gradient
    stejax vq compare --setups wide-init --no-digits --workers 2 --out bench-out/vq-wide-init
    .venv/bin/python benchmarks/vq_merge.py bench-out/vq-reference bench-out/vq-gradient bench-out/vq-wide-init \\
        --out bench-out/vq-compare --results docs/results --figures docs/img/vq

The parts must share every setting but the grid (set-ups, codebook sizes, code dimensions, the digits check);
the merged report has all their per-seed rows, the summary and MSE / FSQ recomputed, the targets judged on the
whole grid (with the digits check of the part that ran it), and the parts' programs, compilations and seconds.
Writes vq_compare.json and, with a digits check, vq_digits.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from stejax.vq import CompareSettings, judge_targets, write_report
from stejax.vq._compare import _add_fsq_ratios, summarize
from stejax.vq._results import record, record_digits

_GRID = ("codebook_sizes", "code_dims", "setups", "digits")


def merge(parts: list[dict]) -> dict:
    first = parts[0]["settings"]
    for p in parts[1:]:
        other = {k: v for k, v in p["settings"].items() if k not in _GRID}
        if other != {k: v for k, v in first.items() if k not in _GRID}:
            raise ValueError("vq_merge: the parts differ in a setting other than the grid.")
    rows = [r for p in parts for r in p["rows"]]
    _add_fsq_ratios(rows)
    grid = {key: tuple(sorted({v for p in parts for v in p["settings"][key]})) for key in _GRID[:2]}
    grid["setups"] = tuple(u for p in parts for u in p["settings"]["setups"])
    digits = next((p["digits"] for p in parts if p.get("digits")), None)
    grid["digits"] = digits is not None
    fields = {f.name for f in dataclasses.fields(CompareSettings)}
    settings = CompareSettings(**{k: tuple(v) if isinstance(v, list) else v for k, v in first.items() if k in fields})
    settings = dataclasses.replace(settings, **grid)
    summary = summarize(rows)
    summary.sort(
        key=lambda e: (
            settings.setups.index(e["setup"]),
            e["code_dim"],
            e["codebook_size"],
            settings.variants.index(e["variant"]),
        )
    )
    return {
        "rows": rows,
        "summary": summary,
        "targets": judge_targets(summary, settings, digits=digits),
        "digits": digits,
        "data": {**parts[0]["data"], "max_codebook_size": max(settings.codebook_sizes)},
        "programs": [q for p in parts for q in p["programs"]],
        "compiles": sum(p["compiles"] for p in parts),
        "seconds": max(p["seconds"] for p in parts),
        "wall_seconds": max(p.get("wall_seconds", p["seconds"]) for p in parts),
        "workers": [p["workers"] for p in parts],
        "settings": dataclasses.asdict(settings),
        "variants": parts[0]["variants"],
        "setups": {k: v for p in parts for k, v in p["setups"].items()},
        "parts": [{"setups": p["settings"]["setups"], "wall_seconds": p.get("wall_seconds")} for p in parts],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("parts", nargs="+", help="The --out folders of the parts.")
    parser.add_argument("--out", required=True)
    parser.add_argument("--results", default=None)
    parser.add_argument("--figures", default=None)
    parser.add_argument(
        "--command",
        default=None,
        help="The commands that produced the parts, for the file (default: the parts' folders and this merge).",
    )
    parser.add_argument("--date", default=None, help="When the parts started (ISO 8601).")
    parser.add_argument("--load-start", type=float, default=None, help="The load average when they started.")
    args = parser.parse_args()
    parts = [json.loads((Path(p) / "report.json").read_text()) for p in args.parts]
    report = merge(parts)
    write_report(report, args.out, figures_dir=args.figures)
    if args.command is None:
        args.command = (
            f"stejax vq compare, one part per folder ({', '.join(args.parts)}), merged by "
            f"python benchmarks/vq_merge.py {' '.join(args.parts)} --out {args.out}"
        )
    if args.results:
        provenance = {}
        if args.date:
            provenance["date"] = args.date
        if args.load_start is not None:
            from stejax.bench._machine import load_average

            provenance["load"] = {"start": args.load_start, "end": load_average()}
        record(report, Path(args.results) / "vq_compare.json", command=args.command, **provenance)
        if report["digits"]:
            record_digits(
                report, Path(args.results) / "vq_digits.json", command=args.command, name="vq_digits", **provenance
            )
    for t in report["targets"]:
        print(f"{'MET' if t['passed'] else 'MISSED'} {t['name']}: {t['detail']}")


if __name__ == "__main__":
    main()
