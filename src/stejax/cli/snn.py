"""``stejax snn train`` and ``stejax snn compare``: spiking networks on the digits with surrogate gradients."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console

from stejax.cli._common import deprecated_option, repeats_option, warmup_option, workers_option

__all__ = ["snn_group"]

# The configurations of the comparison (stejax.snn.CONFIGS, without importing it at start-up; a test keeps
# them equal): the six catalog surrogates, fast_sigmoid at slope 100, the identity straight-through
# estimator, no surrogate (zero gradient) and a ReLU network.
_CONFIGS = (
    "fast_sigmoid",
    "atan",
    "sigmoid",
    "triangular",
    "boxcar",
    "superspike",
    "fast_sigmoid_slope100",
    "identity",
    "no_surrogate",
    "ann",
)


@click.group("snn", short_help="Spiking networks trained with surrogate gradients.")
def snn_group() -> None:
    """Spiking networks trained with surrogate gradients (LIF neurons, rate-coded digits)."""


def _ints(text: str | None, option: str) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"expected comma-separated positive ints; got {text!r}.", param_hint=option) from None
    if not values or min(values) < 1:
        raise click.BadParameter(f"expected comma-separated positive ints; got {text!r}.", param_hint=option)
    return values


def _run(tier, out: Path, console: Console, workers: int = 1) -> None:
    from stejax.snn import compare

    def show(event):
        rest = ", ".join(
            f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}"
            for k, v in event.items()
            if k not in ("event", "config")
        )
        console.print(f"{event['config']}: {rest}", markup=False)

    report = compare(tier, out_dir=out, on_event=show, workers=workers)
    for t in report["targets"]:
        met = "n/a " if t["met"] is None else ("PASS" if t["met"] else "FAIL")
        console.print(f"{met} {t['target']}: {t['measured']}", markup=False)
    console.print(f"wrote {out / 'report.md'}, {out / 'report.json'} and {out / 'plots'}", markup=False)


_OUT = click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    metavar="DIR",
    required=True,
    help="Folder for report.md, report.json and plots/.",
)


@snn_group.command("compare", short_help="Train every surrogate over split seeds and compare them.")
@_OUT
@click.option(
    "--quick",
    is_flag=True,
    default=False,
    help="The quick tier: fast_sigmoid and the ANN, 2 seeds, one hidden layer of 16, T = 4, 10 epochs.",
)
@click.option(
    "--seeds", type=click.IntRange(min=1), default=None, help="Split seeds 0..N-1 (default 5; 2 with --quick)."
)
@click.option(
    "--epochs", type=click.IntRange(min=1), default=None, help="Training epochs (default 30; 10 with --quick)."
)
@click.option(
    "--configs",
    default=None,
    metavar="NAME,...",
    help=f"Only these configurations, comma-separated, from {', '.join(_CONFIGS)} (default: all).",
)
@click.option("--layers", default=None, metavar="L,...", help="Hidden layer counts (default 1,2).")
@click.option(
    "--time-steps", default=None, metavar="T,...", help="Spiking time steps per example, T (default 25,8; quick 4)."
)
@deprecated_option("--steps", "time_steps", metavar="T,...")
@repeats_option("Timed rounds of the training steps (default 30; quick 3).", default=None)
@warmup_option("Untimed calls of each training step before the timed rounds (default 3; quick 1).", default=None)
@workers_option()
def compare_command(
    out: Path,
    quick: bool,
    seeds: int | None,
    epochs: int | None,
    configs: str | None,
    layers: str | None,
    time_steps: str | None,
    repeats: int | None,
    warmup: int | None,
    workers: int,
) -> None:
    """Train every surrogate configuration over split seeds and write the report.

    The six catalog surrogates at their defaults, fast_sigmoid with slope 100,
    the identity straight-through estimator, no surrogate (zero gradient) and a
    ReLU network of the same shape, each with 1 and 2 hidden layers of 128 LIF
    neurons at T = 25 and 8 on rate-coded digits, every seed in one vmapped
    program. Writes OUT/report.json (after every group, so an interrupted run
    keeps what it finished), OUT/report.md and OUT/plots/.
    """
    import dataclasses

    from stejax.snn import CONFIGS, FULL, QUICK

    tier = QUICK if quick else FULL
    if seeds is not None:
        tier = dataclasses.replace(tier, seeds=tuple(range(seeds)))
    if epochs is not None:
        tier = dataclasses.replace(tier, epochs=epochs)
    if configs is not None:
        names = tuple(n.strip() for n in configs.split(",") if n.strip())
        unknown = [n for n in names if n not in CONFIGS]
        if unknown or not names:
            raise click.BadParameter(
                f"unknown configuration(s) {unknown or configs!r}; expected names from {', '.join(CONFIGS)}.",
                param_hint="--configs",
            )
        tier = dataclasses.replace(tier, configs=names)
    if (values := _ints(layers, "--layers")) is not None:
        tier = dataclasses.replace(tier, hidden_layers=values)
    if (values := _ints(time_steps, "--time-steps")) is not None:
        tier = dataclasses.replace(tier, steps=values)
    if repeats is not None:
        tier = dataclasses.replace(tier, timing_repeats=repeats)
    if warmup is not None:
        tier = dataclasses.replace(tier, timing_warmup=warmup)
    _run(tier, out, Console(), workers)


@snn_group.command("train", short_help="Train one spiking network on the rate-coded digits.")
@_OUT
@click.option(
    "--surrogate",
    type=click.Choice(_CONFIGS),
    default="fast_sigmoid",
    show_default=True,
    help="The spike's surrogate gradient: a configuration of `snn compare` (ann: a ReLU network instead).",
)
@click.option("--layers", type=click.IntRange(min=1), default=1, show_default=True, help="Hidden layers.")
@click.option("--width", type=click.IntRange(min=1), default=128, show_default=True, help="Neurons per hidden layer.")
@click.option(
    "--time-steps", type=click.IntRange(min=1), default=25, show_default=True, help="Spiking time steps per example, T."
)
@deprecated_option("--steps", "time_steps", type=click.IntRange(min=1))
@click.option("--seeds", type=click.IntRange(min=1), default=1, show_default=True, help="Split seeds 0..N-1.")
@click.option("--epochs", type=click.IntRange(min=1), default=30, show_default=True, help="Training epochs.")
def train_command(out: Path, surrogate: str, layers: int, width: int, time_steps: int, seeds: int, epochs: int) -> None:
    """Train one spiking network on the rate-coded digits and write its report and pictures."""
    from stejax.snn import Tier

    tier = Tier(
        (surrogate,), tuple(range(seeds)), (layers,), (time_steps,), width=width, epochs=epochs, timing_repeats=10
    )
    console = Console()
    _run(tier, out, console)
    summary = json.loads((out / "report.json").read_text(encoding="utf-8"))["summary"]
    for key, row in summary.items():
        console.print(f"{key}: test accuracy {100 * row['test_accuracy_mean']:.2f}%", markup=False)
