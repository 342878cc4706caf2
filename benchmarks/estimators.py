"""Every catalog estimator against its stop_gradient form and the fused limit: the results file of the estimators suite.

Run from the repository root:

    .venv/bin/python benchmarks/estimators.py [--repeats 30] [--warmup 3] [--results docs/results]

It runs the same measurement as ``stejax bench --suite estimators`` (forward and
gradient of a float32 array of 2**18 values, interleaved rounds after warm-up,
the gradients of the three forms checked equal first) and writes
``DIR/estimators.json``: one row per estimator with its p50 times and the
medians of the per-round ratios, and the figures that the README and
docs/benchmarks.md cite.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from stejax.bench._estimators import TARGET_VS_STOP_GRADIENT, estimators_suite
from stejax.bench.results import Figure, Recorder
from stejax.estimators.catalog import CATALOG


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=30, help="interleaved timed rounds per estimator")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls per variant first")
    parser.add_argument("--results", type=Path, default=Path("docs/results"), metavar="DIR", help="where to write")
    parser.add_argument(
        "--name", default="estimators", help="the results file's name (e.g. estimators_tpu for an accelerator's file)"
    )
    options = parser.parse_args(argv)
    recorder = Recorder(
        options.name,
        command=f"python benchmarks/estimators.py --repeats {options.repeats} --warmup {options.warmup}"
        + ("" if options.name == "estimators" else f" --name {options.name}"),
    )
    suite = estimators_suite(repeats=options.repeats, warmup=options.warmup, size=2**18)
    rows = []
    for group in suite["groups"]:
        variants, ratios = group["variants"], group["ratios"]
        rows.append(
            {
                "estimator": group["name"],
                "family": CATALOG[group["name"]].family,
                "form": group["info"]["form"],
                "ours_ms": variants["ours"]["stats_ms"]["p50_ms"],
                "stop_gradient_ms": variants["stop_gradient"]["stats_ms"]["p50_ms"],
                "ours_vs_stop_gradient": ratios["ours/stop_gradient"]["p50"],
                "ours_vs_fused": ratios["ours/fused"]["p50"] if "ours/fused" in ratios else None,
                "gradients_equal": group["info"]["status"] == "ok",
            }
        )
    if any(not r["gradients_equal"] for r in rows):
        print("\n".join(suite["notes"]), file=sys.stderr)
        return 1
    vs_sg = [r["ours_vs_stop_gradient"] for r in rows]
    vs_fused = [r["ours_vs_fused"] for r in rows if r["ours_vs_fused"] is not None]
    faster = sum(v <= TARGET_VS_STOP_GRADIENT for v in vs_sg)
    median_sg = statistics.median(vs_sg)
    recorder.write(
        options.results / f"{options.name}.json",
        rows=rows,
        columns=[
            ("estimator", "estimator"),
            ("family", "family"),
            ("form", "stop_gradient form"),
            ("ours_ms", "ours ms", "{:.3f}"),
            ("stop_gradient_ms", "stop_gradient ms", "{:.3f}"),
            ("ours_vs_stop_gradient", "ours / stop_gradient", "{:.2f}"),
            ("ours_vs_fused", "ours / fused", "{:.2f}"),
        ],
        figures={
            "median_vs_stop_gradient": Figure(median_sg, f"{median_sg:.2f}×", target="≤ 0.90×", met=median_sg <= 0.9),
            "members_faster": Figure(faster, f"{faster} of {len(rows)}", target=f"≤ {TARGET_VS_STOP_GRADIENT}×"),
            "range_vs_fused": Figure(
                [min(vs_fused), max(vs_fused)], f"{min(vs_fused):.2f}–{max(vs_fused):.2f}×", target="≤ 1.10×"
            ),
        },
        notes=(
            "Forward and gradient of a float32 array of 2**18 values; p50 times, and medians of per-round ratios "
            "of variants timed in the same round. The stop_gradient form computes the same gradient (checked)."
        ),
    )
    print(f"wrote {options.results / (options.name + '.json')}: median ours/stop_gradient {median_sg:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
