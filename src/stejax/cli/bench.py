"""``stejax bench`` and ``stejax diagnose``: measurements and fault localisation."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from stejax.cli._common import (
    deprecated_option,
    directory,
    out_dir_option,
    repeats_option,
    run_dir_argument,
    warmup_option,
)
from stejax.cli.catalog import lookup

__all__ = ["bench_command", "diagnose_command"]

_BENCH_SUITES = ("estimators", "train", "inference", "peers", "onnx", "lm-decode", "train-step", "all")
# What each suite needs beyond stejax[cli]: (the extra, the modules it brings that the suite imports).
_SUITE_NEEDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "estimators": ("cli", ()),
    "train": ("train", ("optax", "sklearn")),
    "inference": ("train", ("optax", "sklearn", "safetensors")),
    "peers": ("peers", ("flax", "qwix")),
    "onnx": ("onnx", ("flax", "onnx", "onnxruntime")),
    "lm-decode": ("flax", ("flax", "optax", "safetensors")),
    "train-step": ("flax", ("flax", "optax", "safetensors")),
}


def _missing_extra(suite: str) -> str | None:
    """The extra a suite needs that is not installed (None: it can run)."""
    import importlib.util

    extra, modules = _SUITE_NEEDS[suite]
    return extra if any(importlib.util.find_spec(m) is None for m in modules) else None


@click.command("bench", short_help="Time estimators, training steps, inference and peer libraries.")
@click.option(
    "--suite",
    "suites",
    multiple=True,
    type=click.Choice(_BENCH_SUITES),
    default=(),
    help="A suite to run (repeatable); all: every suite. Default: every suite whose extra is installed "
    "(estimators needs only stejax[cli]; train and inference stejax[train]; peers stejax[peers]; onnx "
    "stejax[onnx]; lm-decode stejax[flax]); the others are named with what to install.",
)
@out_dir_option("Folder for bench.json, bench.md and bench.png.")
@click.option(
    "--rounds",
    type=click.IntRange(min=1),
    default=None,
    help="Interleaved rounds (default 5; 1 with --quick). Each round times every variant --repeats times, "
    "and gives every ratio one sample: the round's median time of one variant over the round's median of the "
    "other. The results files' ratios are the median over rounds with its spread.",
)
@repeats_option("Timed calls of each variant per round (default 6; 5 with --quick).", default=None)
@warmup_option("Untimed calls per variant before the timed rounds (default 3; 1 with --quick).", default=None)
@click.option(
    "--quick",
    is_flag=True,
    help="A check that every suite runs, in seconds: 1 round of 5 timed calls, 1 warm-up call, and small models "
    "and inputs (2**12 values per estimator call, a 16-wide MLP instead of the CNN for training and inference).",
)
@click.option("--estimator", "estimators", multiple=True, metavar="NAME", help="Only this estimator (repeatable).")
@click.option(
    "--width",
    "widths",
    multiple=True,
    type=click.IntRange(min=32),
    help="train-step: an LM width to measure (repeatable; default 512, 1024 and 2048 on a TPU, 64 and 128 on "
    "a CPU). Each variant's step (float32, bfloat16, fake-quant, int8 forward, int8 forward and backward, "
    "Qwix int8, Qwix QT) is timed side by side at that width.",
)
@click.option(
    "--results",
    type=directory(),
    default=None,
    help="Also write the results files of the onnx, lm-decode and train-step suites into this folder: onnx.json, "
    "lm_decode.json, train_step.json (train_step_cpu.json on a CPU); not with --quick. The documentation's are in "
    "docs/results.",
)
@click.option(
    "--figures",
    type=directory(),
    default=None,
    help="Also draw the lm-decode suite's plot lm_decode.png into this folder; not with --quick.",
)
def bench_command(
    suites: tuple[str, ...],
    out: Path,
    rounds: int | None,
    repeats: int | None,
    warmup: int | None,
    quick: bool,
    estimators: tuple[str, ...],
    widths: tuple[int, ...],
    results: Path | None,
    figures: Path | None,
) -> None:
    """Time estimators, training steps, inference and peer libraries.

    Every call is waited for (block_until_ready) and repeated in interleaved
    rounds after warm-up and compilation; the report gives min, p50, p90, p99
    and max, compile counts, ratios of interleaved runs, the machine and the
    versions, in OUT/bench.json, OUT/bench.md and OUT/bench.png. Nothing is
    written outside OUT unless --results or --figures names a folder. Exit 1 if
    a suite fails or an estimator's forms compute different gradients.
    """
    from stejax.bench import BenchSettings, run_bench

    for name in estimators:
        lookup(name)
    settings = BenchSettings.make(quick=quick, repeats=repeats, warmup=warmup, rounds=rounds)
    console = Console()
    if not suites:
        from stejax.bench import SUITES

        left_out = {name: _missing_extra(name) for name in SUITES}
        suites = tuple(name for name, extra in left_out.items() if extra is None)
        for name, extra in left_out.items():
            if extra is not None:
                console.print(Text(f"not run: the {name} suite, which needs pip install 'stejax[{extra}]'."))

    def on_event(event: Mapping[str, Any]) -> None:
        console.print(Text(f"running the {event['suite']} suite ..."))

    report = run_bench(
        suites,
        out_dir=out,
        settings=settings,
        estimators=estimators or None,
        on_event=on_event,
        widths=widths or None,
        results_dir=results,
        figures_dir=figures,
    )
    for name, suite in report["suites"].items():
        if suite["status"] != "ok":
            console.print(Text(f"{name}: {suite['status']}: {suite['note']}"))
        else:
            console.print(_bench_estimators_table(suite) if name == "estimators" else _bench_table(name, suite))
        for note in suite.get("notes", []):
            console.print(Text(f"  note: {note}"))
    console.print(Text(f"{report['wall_seconds']:.1f} s; report: {(out / 'bench.md').resolve()}"))
    disagree = [
        g["name"]
        for g in report["suites"].get("estimators", {}).get("groups", [])
        if g.get("info", {}).get("status") == "failed"
    ]
    if disagree:
        console.print(Text(f"FAILED: gradients of the compared forms differ for {', '.join(disagree)}"))
    if disagree or any(s["status"] == "error" for s in report["suites"].values()):
        raise SystemExit(1)


def _bench_table(name: str, suite: Mapping[str, Any]) -> Table:
    table = Table(title=f"{name} ({suite['seconds']:.1f} s): ms per call")
    for column in ("group", "variant", "p50", "min", "p90", "p99", "max", "compiles", "ratio p50"):
        table.add_column(column, justify="left" if column in ("group", "variant") else "right")
    for group in suite["groups"]:
        for variant, m in group["variants"].items():
            s = m["stats_ms"]
            mine = [(k.partition("/")[2], r["p50"]) for k, r in group["ratios"].items() if k.startswith(f"{variant}/")]
            ratio = f"{mine[0][1]:.3f} vs {mine[0][0]}" if mine else ""
            table.add_row(
                Text(group["name"]),
                Text(variant),
                *(Text(f"{s[k]:.4f}") for k in ("p50_ms", "min_ms", "p90_ms", "p99_ms", "max_ms")),
                Text(f"{m['compiles_warmup']}/{m['compiles_timed']}"),
                Text(ratio),
            )
    return table


def _bench_estimators_table(suite: Mapping[str, Any]) -> Table:
    table = Table(title=f"estimators ({suite['seconds']:.1f} s): forward + gradient, ms p50")
    for column in ("estimator", "ours", "stop_gradient", "fused", "ours/sg", "ours/fused"):
        table.add_column(column, justify="left" if column == "estimator" else "right")
    for g in suite["groups"]:
        cells = [
            f"{g['variants'][v]['stats_ms']['p50_ms']:.4f}" if v in g["variants"] else "n/a"
            for v in ("ours", "stop_gradient", "fused")
        ]
        ratios = [
            f"{g['ratios'][r]['p50']:.3f}" if r in g["ratios"] else "n/a" for r in ("ours/stop_gradient", "ours/fused")
        ]
        table.add_row(Text(g["name"]), *(Text(c) for c in cells + ratios))
    return table


@click.command("diagnose", short_help="Find the first stage at which a training pipeline goes wrong.")
@run_dir_argument(optional=True)
@deprecated_option("--run", "run_dir", type=directory(exists=True))
@click.option(
    "--pipeline",
    "factory",
    metavar="MODULE:FACTORY",
    default=None,
    help="Instead of RUN: a function returning a Pipeline (MODULE is a module name or a Python file).",
)
@click.option("--examples", type=click.IntRange(min=1), default=2, show_default=True, help="Examples to run on.")
@out_dir_option("Also write diagnose.json and diagnose.md here.", required=False)
def diagnose_command(run_dir: Path | None, factory: str | None, examples: int, out: Path | None) -> None:
    """Find the first stage at which a training pipeline goes wrong; exit 1 if one does.

    Diagnoses the reference pipeline of the run directory RUN (stejax train
    --out RUN), or a pipeline of your own with --pipeline MODULE:FACTORY.

    Stages: data, keys, shapes, forward, loss, gradients, update (eagerly, jit
    disabled), then jit, vmap and grad added back one at a time and compared
    leaf by leaf with the eager results.
    """
    import os

    from stejax.cli._common import INPUT_ERRORS
    from stejax.diagnose import diagnose, load_pipeline, pipeline_from_run

    if (run_dir is None) == (factory is None):
        raise click.UsageError("give exactly one of RUN or --pipeline MODULE:FACTORY.")
    try:
        if run_dir is not None:
            pipeline = pipeline_from_run(run_dir)
        else:
            assert factory is not None  # exactly one of the two, checked above
            pipeline = load_pipeline(factory, path=os.getcwd())
    except INPUT_ERRORS:  # an unreadable file of the run: the root group's one line, exit code 2
        raise
    except (ValueError, ImportError, AttributeError, TypeError, FileNotFoundError) as error:
        hint = "RUN" if run_dir is not None else "--pipeline"
        raise click.BadParameter(str(error), param_hint=hint) from None
    except RuntimeError as error:
        raise click.ClickException(str(error)) from None
    report = diagnose(pipeline, examples=examples)
    console = Console()
    table = Table(title=f"diagnose {report.pipeline} ({report.examples} example(s))")
    for column in ("stage", "outcome", "found"):
        table.add_column(column, overflow="fold")
    for stage in report.stages:
        outcome = {"passed": "passed", "failed": "[red]FAILED[/red]"}.get(stage.status, stage.status)
        table.add_row(Text(stage.stage), outcome, Text(stage.why))
    console.print(table)
    console.print(Text(report.summary()))
    if out is not None:
        json_path, md_path = report.write(out)
        console.print(Text(f"wrote {json_path} and {md_path}"))
    if not report.ok:
        raise SystemExit(1)
