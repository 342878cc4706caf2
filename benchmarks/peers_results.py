"""The peers suite's rules and spiking groups, measured alone and written as results files.

Run from the repository root, after `make setup` (the peers extra: Qwix and Spyx):

    .venv/bin/python benchmarks/peers_results.py [--rounds 5] [--repeats 100] [--snn-repeats 30] [--warmup 3]

It runs the groups "int8 QAT step by rules" (the digits CNN and a transformer block, Qwix's
``quantize_model`` beside stejax's on the same unmodified NNX models) and the spiking groups (the two-layer
LIF step against Spyx at T = 8, 25 and 100) as ``stejax bench --suite peers`` does, in ``--rounds``
interleaved rounds after warm-up: each round times every group in turn, ``--repeats`` (spiking:
``--snn-repeats``) wall-clock calls of each step back to back, and gives each ratio stejax / peer one sample,
the round's median time of one over the round's median of the other. It writes ``DIR/rules_peers.json`` and
``DIR/snn_peers.json``: each ratio as the median over rounds with its spread
(:meth:`stejax.bench.results.Figure.ratio`: a spread that contains 1 reads "level with", and a target is met
only when every round meets it), the rounds' samples, the number of rounds, the machine and the load.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from stejax.bench.results import Figure, Recorder

RULES_TARGET = 0.95
SNN_TARGET = 0.9


def ratio_row(group: dict[str, Any], numerator: str, denominator: str, figure: Figure) -> dict[str, Any]:
    """One ratio's row: the median over rounds, its spread, each round's sample, the p50 times, the target."""
    samples = group["ratios"][f"{numerator}/{denominator}"]["rounds"]
    return {
        "ratio": statistics.median(samples),
        "min": min(samples),
        "max": max(samples),
        "rounds": samples,
        "stejax_ms": group["variants"][numerator]["stats_ms"]["p50_ms"],
        "peer_ms": group["variants"][denominator]["stats_ms"]["p50_ms"],
        "text": figure.text,
        "target": figure.target,
        "met": figure.met,
    }


def columns(peer: str) -> list[tuple[str, str]]:
    """The table's columns after the first: the figure's text (median and spread over rounds), times, target, met."""
    return [
        ("text", f"stejax / {peer}, median (min–max) over rounds"),
        ("stejax_ms", "stejax ms, p50", "{:.2f}"),
        ("peer_ms", f"{peer} ms, p50", "{:.2f}"),
        ("target", "target"),
        ("met", "met"),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds, one ratio sample each (default 5)")
    parser.add_argument(
        "--repeats", type=int, default=100, help="timed calls of each rules step per round (default 100)"
    )
    parser.add_argument(
        "--snn-repeats", type=int, default=30, help="timed calls of each spiking step per round (default 30)"
    )
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls per step first (default 3)")
    parser.add_argument("--results", type=Path, default=Path("docs/results"), metavar="DIR", help="where to write")
    options = parser.parse_args(argv)
    command = (
        f"python benchmarks/peers_results.py --rounds {options.rounds} --repeats {options.repeats} "
        f"--snn-repeats {options.snn_repeats} --warmup {options.warmup}"
    )

    from stejax.bench._peers_rules import rules_peer_groups

    recorder = Recorder("rules_peers", command=command)
    groups, _ = rules_peer_groups(repeats=options.repeats, warmup=options.warmup, quick=False, rounds=options.rounds)
    rows, figures = [], {}
    for group, key in zip(groups, ("cnn", "block"), strict=True):
        samples = group["ratios"]["stejax int8/qwix int8"]["rounds"]
        figures[key] = Figure.ratio(samples, bound=RULES_TARGET)
        model = group["info"]["model"]
        row = ratio_row(group, "stejax int8", "qwix int8", figures[key])
        rows.append({"model": f"{model}, input {tuple(group['info']['batch'])}", **row})
    written = recorder.write(
        options.results / "rules_peers.json",
        rows=rows,
        columns=[("model", "model"), *columns("Qwix")],
        figures=figures,
        notes=f"The same unmodified NNX models and the same int8 scheme on both sides (Qwix with per-tensor "
        f"activation scales too), on the CPU; stejax / Qwix in wall-clock time, one ratio per round (the round's "
        f"median times, {options.repeats} calls of each step) over {options.rounds} interleaved rounds.",
        rounds=options.rounds,
    )

    from stejax.bench._peers_snn import snn_peer_groups

    recorder = Recorder("snn_peers", command=command)
    groups, _ = snn_peer_groups(repeats=options.snn_repeats, warmup=options.warmup, quick=False, rounds=options.rounds)
    rows, figures = [], {}
    for group in groups:
        steps = group["info"]["T"]
        samples = group["ratios"]["stejax/spyx"]["rounds"]
        figures[f"t{steps}"] = Figure.ratio(samples, bound=SNN_TARGET)
        rows.append({"time_steps": steps, **ratio_row(group, "stejax", "spyx", figures[f"t{steps}"])})
    recorder.write(
        options.results / "snn_peers.json",
        commit=written["commit"],  # the tree both were measured at (the first file written is not a change to it)
        rows=rows,
        columns=[("time_steps", "time steps T"), *columns("Spyx")],
        figures=figures,
        notes="The two-layer training step at batch 64, the same work on both sides (the same rate draws inside "
        "the step, one Adam object, fixed thresholds, both donating), on the CPU; stejax / Spyx in wall-clock "
        f"time, one ratio per round (the round's median times, {options.snn_repeats} calls of each step) over "
        f"{options.rounds} interleaved rounds.",
        rounds=options.rounds,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
