"""The peers suite's rules and spiking groups, measured alone and written as results files.

Run from the repository root, after `make setup` (the peers extra: Qwix and Spyx):

    .venv/bin/python benchmarks/peers_results.py [--repeats 200] [--snn-repeats 60] [--warmup 3]

It runs the groups "int8 QAT step by rules" (the digits CNN and a transformer block, Qwix's
``quantize_model`` beside stejax's on the same unmodified NNX models) and the spiking groups (the two-layer
LIF step against Spyx at T = 8, 25 and 100) exactly as ``stejax bench --suite peers`` does, and writes
``DIR/rules_peers.json`` and ``DIR/snn_peers.json``: the p50 of the per-round ratio stejax / peer, wall
clock, with the machine and the load.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from stejax.bench.results import Figure, Recorder

RULES_TARGET = 0.95
SNN_TARGET = 0.9


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=200, help="interleaved timed rounds per rules group")
    parser.add_argument("--snn-repeats", type=int, default=60, help="interleaved timed rounds per spiking group")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls per variant first")
    parser.add_argument("--results", type=Path, default=Path("docs/results"), metavar="DIR", help="where to write")
    options = parser.parse_args(argv)
    command = (
        f"python benchmarks/peers_results.py --repeats {options.repeats} --snn-repeats {options.snn_repeats} "
        f"--warmup {options.warmup}"
    )

    from stejax.bench._peers_rules import rules_peer_groups

    recorder = Recorder("rules_peers", command=command)
    groups, _ = rules_peer_groups(repeats=options.repeats, warmup=options.warmup, quick=False)
    rows, figures = [], {}
    for group, key in zip(groups, ("cnn", "block"), strict=True):
        ratio = group["ratios"]["stejax int8/qwix int8"]
        model = group["info"]["model"]
        rows.append(
            {
                "model": f"{model}, input {tuple(group['info']['batch'])}",
                "ratio": round(ratio["p50"], 3),
                "p10": round(ratio["p10"], 3),
                "p90": round(ratio["p90"], 3),
                "target": f"≤ {RULES_TARGET}",
                "met": ratio["p50"] <= RULES_TARGET,
            }
        )
        met = ratio["p50"] <= RULES_TARGET
        figures[key] = Figure(round(ratio["p50"], 3), f"{ratio['p50']:.3f}×", target=f"≤ {RULES_TARGET}×", met=met)
    written = recorder.write(
        options.results / "rules_peers.json",
        rows=rows,
        columns=[
            ("model", "model"),
            ("ratio", "stejax / Qwix, p50", "{:.3f}"),
            ("p10", "p10", "{:.3f}"),
            ("p90", "p90", "{:.3f}"),
            ("target", "target"),
            ("met", "met"),
        ],
        figures=figures,
        notes=f"The same unmodified NNX models and the same int8 scheme on both sides (Qwix with per-tensor "
        f"activation scales too), on the CPU; wall-clock p50 of per-round ratios over {options.repeats} "
        f"interleaved rounds.",
    )

    from stejax.bench._peers_snn import snn_peer_groups

    recorder = Recorder("snn_peers", command=command)
    groups, _ = snn_peer_groups(repeats=options.snn_repeats, warmup=options.warmup, quick=False)
    rows, figures = [], {}
    for group in groups:
        steps = group["info"]["T"]
        ratio = group["ratios"]["stejax/spyx"]
        rows.append({"time_steps": steps, "ratio": round(ratio["p50"], 3)})
        figures[f"t{steps}"] = Figure(
            round(ratio["p50"], 3), f"{ratio['p50']:.3f}×", target=f"≤ {SNN_TARGET}×", met=ratio["p50"] <= SNN_TARGET
        )
    recorder.write(
        options.results / "snn_peers.json",
        commit=written["commit"],  # the tree both were measured at (the first file written is not a change to it)
        rows=rows,
        columns=[("time_steps", "time steps T"), ("ratio", "stejax / Spyx, p50", "{:.3f}")],
        figures=figures,
        notes="The two-layer training step at batch 64, the same work on both sides (the same rate draws inside "
        "the step, one Adam object, fixed thresholds, both donating), on the CPU; wall-clock p50 of per-round "
        f"ratios over {options.snn_repeats} interleaved rounds.",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
