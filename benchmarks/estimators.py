"""Every catalog estimator against its stop_gradient form and the fused limit: the results file of the estimators suite.

Run from the repository root:

    .venv/bin/python benchmarks/estimators.py [--rounds 5] [--repeats 60] [--warmup 3] [--results docs/results]

It runs the same measurement as ``stejax bench --suite estimators`` (forward and
gradient of a float32 array of 2**18 values, the gradients of the three forms
checked equal first) in ``--rounds`` interleaved rounds after warm-up: each round
times every estimator in turn, ``--repeats`` calls of each of its forms back to
back, and gives each ratio one sample, the round's median time of one form over
the round's median of the other. It writes ``DIR/estimators.json``: one row per
estimator with its p50 times and the median of its per-round ratios (each
round's ratio beside it), the number of rounds, and the figures that the README
and docs/explanation/stop-gradient.md cite. The catalog's figure is the median
over the catalog in each round, written as the median over rounds with its
spread (:meth:`stejax.bench.results.Figure.ratio`); a member counts as at or
below the target only when every round was.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from stejax.bench._estimators import TARGET_VS_STOP_GRADIENT, estimators_suite
from stejax.bench.results import Figure, Recorder
from stejax.estimators.catalog import CATALOG

SIZE = 2**18


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds, one ratio sample each (default 5)")
    parser.add_argument(
        "--repeats", type=int, default=60, help="timed calls of each form per estimator per round (default 60)"
    )
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls per form first (default 3)")
    parser.add_argument("--results", type=Path, default=Path("docs/results"), metavar="DIR", help="where to write")
    parser.add_argument(
        "--name", default="estimators", help="the results file's name (e.g. estimators_tpu for an accelerator's file)"
    )
    parser.add_argument(
        "--estimator", action="append", metavar="NAME", help="only this estimator (repeatable; default: the catalog)"
    )
    parser.add_argument("--size", type=int, default=SIZE, help=f"values per call (default {SIZE})")
    options = parser.parse_args(argv)
    command = (
        f"python benchmarks/estimators.py --rounds {options.rounds} --repeats {options.repeats} "
        f"--warmup {options.warmup}"
        + ("" if options.name == "estimators" else f" --name {options.name}")
        + "".join(f" --estimator {name}" for name in options.estimator or ())
        + ("" if options.size == SIZE else f" --size {options.size}")
    )
    recorder = Recorder(options.name, command=command)
    suite = estimators_suite(
        repeats=options.repeats,
        warmup=options.warmup,
        size=options.size,
        names=options.estimator,
        rounds=options.rounds,
    )
    rows = []
    for group in suite["groups"]:
        variants, ratios = group["variants"], group["ratios"]
        vs_sg = ratios["ours/stop_gradient"]["rounds"]
        vs_fused = ratios["ours/fused"]["rounds"] if "ours/fused" in ratios else None
        rows.append(
            {
                "estimator": group["name"],
                "family": CATALOG[group["name"]].family,
                "form": group["info"]["form"],
                "ours_ms": variants["ours"]["stats_ms"]["p50_ms"],
                "stop_gradient_ms": variants["stop_gradient"]["stats_ms"]["p50_ms"],
                "ours_vs_stop_gradient": statistics.median(vs_sg),
                "ours_vs_fused": None if vs_fused is None else statistics.median(vs_fused),
                "ours_vs_stop_gradient_rounds": vs_sg,
                "ours_vs_fused_rounds": vs_fused,
                "gradients_equal": group["info"]["status"] == "ok",
            }
        )
    if any(not r["gradients_equal"] for r in rows):
        print("\n".join(suite["notes"]), file=sys.stderr)
        return 1
    # One sample per round: the median over the catalog of that round's ratios.
    per_round = [statistics.median(r["ours_vs_stop_gradient_rounds"][k] for r in rows) for k in range(options.rounds)]
    median_sg = Figure.ratio(
        per_round,
        bound=TARGET_VS_STOP_GRADIENT,
        note=f"the median over the catalog in each of {options.rounds} rounds: median and spread over rounds.",
    )
    faster = sum(max(r["ours_vs_stop_gradient_rounds"]) <= TARGET_VS_STOP_GRADIENT for r in rows)
    vs_fused = [r["ours_vs_fused"] for r in rows if r["ours_vs_fused"] is not None]
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
            "median_vs_stop_gradient": median_sg,
            "members_faster": Figure(
                faster,
                f"{faster} of {len(rows)}",
                target=f"≤ {TARGET_VS_STOP_GRADIENT}×",
                note="members at or below the target in every round.",
            ),
            "range_vs_fused": Figure(
                [min(vs_fused), max(vs_fused)],
                f"{min(vs_fused):.2f}–{max(vs_fused):.2f}×",
                target="≤ 1.10×",
                note="the lowest and the highest member's median over rounds.",
            ),
        },
        notes=(
            f"Forward and gradient of a float32 array of {options.size:,} values, in {options.rounds} interleaved "
            f"rounds of {options.repeats} calls of each form per estimator; p50 times, and per estimator the median "
            "of its per-round ratios (each round: the median time of one form over the median of the other). The "
            "stop_gradient form computes the same gradient (checked)."
        ),
        rounds=options.rounds,
    )
    print(f"wrote {options.results / (options.name + '.json')}: ours/stop_gradient over the catalog {median_sg.text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
