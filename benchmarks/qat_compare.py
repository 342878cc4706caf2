"""The digits QAT comparison of `stejax demo`, run and written as a results file.

Run from the repository root, after `make setup`:

    .venv/bin/python benchmarks/qat_compare.py [--out demo-out] [--results docs/results]

It runs ``stejax demo --out OUT`` (7 configurations × 10 seeds, each seed on its own split, every
configuration paired with float on the same seed) and writes ``DIR/qat_compare.json`` from
``OUT/report.json``: each configuration's mean test accuracy, the paired difference from float with its
standard error and 95% interval, and the comparison's own targets (``stejax.train``'s, judged in the report).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from stejax.bench.results import Figure, Recorder

MINUS = "\N{MINUS SIGN}"


def _signed(value: float, spec: str) -> str:
    return format(value, spec).replace("-", MINUS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("demo-out"), metavar="DIR", help="the demo's output folder")
    parser.add_argument("--results", type=Path, default=Path("docs/results"), metavar="DIR", help="where to write")
    options = parser.parse_args(argv)
    recorder = Recorder("qat_compare", command=f"python benchmarks/qat_compare.py --out {options.out}")
    done = subprocess.run([sys.executable, "-m", "stejax", "demo", "--out", str(options.out)], check=False)
    if done.returncode != 0:
        print(f"stejax demo failed (exit {done.returncode}); nothing written", file=sys.stderr)
        return done.returncode
    report = json.loads((options.out / "report.json").read_text("utf-8"))
    summary = report["summary"]
    targets = {t["preset"]: t for t in report["targets"] if "step" not in t["target"]}
    rows = []
    for name, row in summary.items():
        target = targets.get(name)
        text = None
        if target is not None:
            bound = target["target"].split()[-2] if "points" in target["target"] else None
            if name == "float":
                text = "≥ 98%"
            elif name.endswith("_no_ste"):
                text = "≤ 25%"
            elif bound is not None:
                text = f"≥ {_signed(float(bound), 'g')}"
        ci = row.get("delta_vs_float_ci95")
        rows.append(
            {
                "configuration": name,
                "accuracy_mean": round(100 * row["test_accuracy_mean"], 2),
                "accuracy_std": None if row["test_accuracy_std"] is None else round(100 * row["test_accuracy_std"], 2),
                "delta_mean": None if "delta_vs_float_mean" not in row else round(row["delta_vs_float_mean"], 2),
                "delta_se": None if row.get("delta_vs_float_se") is None else round(row["delta_vs_float_se"], 2),
                "delta_ci95": None if ci is None else f"[{ci[0]:+.2f}, {ci[1]:+.2f}]",
                "target": text,
                "met": None if target is None else target["met"],
            }
        )
    by_name = {r["configuration"]: r for r in rows}
    figures = {
        "float_accuracy": Figure(
            by_name["float"]["accuracy_mean"],
            f"{by_name['float']['accuracy_mean']:.2f}%",
            target="≥ 98%",
            met=targets["float"]["met"],
        ),
        "w4a4_delta": Figure(
            by_name["w4a4"]["delta_mean"],
            f"{_signed(by_name['w4a4']['delta_mean'], '.2f')} points",
            target=f"≥ {MINUS}0.3 points",
            met=targets["w4a4"]["met"],
        ),
        "w1a1_delta": Figure(
            by_name["w1a1"]["delta_mean"],
            f"{_signed(by_name['w1a1']['delta_mean'], '.2f')} points",
            target=f"≥ {MINUS}1.5 points",
            met=targets["w1a1"]["met"],
        ),
        "no_ste_accuracy": Figure(
            by_name["w4a4_no_ste"]["accuracy_mean"],
            f"{by_name['w4a4_no_ste']['accuracy_mean']:.2f}%",
            target="≤ 25%",
            met=targets["w4a4_no_ste"]["met"],
        ),
    }
    seeds = len(next(iter(summary.values()))["test_accuracy_per_seed"])
    recorder.write(
        options.results / "qat_compare.json",
        rows=rows,
        columns=[
            ("configuration", "configuration"),
            ("accuracy_mean", "test accuracy %", "{:.2f}"),
            ("accuracy_std", "± std", "{:.2f}"),
            ("delta_mean", "paired Δ vs float, points", "{:+.2f}"),
            ("delta_se", "± se", "{:.2f}"),
            ("delta_ci95", "95% CI"),
            ("target", "target (mean)"),
            ("met", "met"),
        ],
        figures=figures,
        notes=f"{seeds} seeds, each on its own stratified split; the default recipe (TrainConfig()). Each "
        "configuration is paired with float on the same seed and split: mean, standard error and Student-t 95% "
        "interval of the differences.",
    )
    print(f"wrote {options.results / 'qat_compare.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
