"""``stejax train``, ``stejax compare`` and ``stejax demo``: the reference QAT pipeline."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from stejax.cli._common import (
    deprecated_option,
    epoch_line,
    guarded,
    progress_bar,
    repeats_option,
    warmup_option,
    workers_option,
)
from stejax.cli.catalog import _catalog_table, _plot
from stejax.estimators.catalog import CATALOG
from stejax.render import catalog_markdown

__all__ = ["compare_command", "demo", "train_command"]


_MODEL_CHOICE = click.Choice(["mlp", "cnn"])
# The QAT presets (stejax.model.PRESETS, without importing the model at start-up; a test keeps them equal).
_PRESETS = ("float", "w8a8", "w4a4", "w2a2", "w1a32", "w1a1", "w4a4_no_ste")
# How the quantised layers multiply (stejax.train.PRODUCTS; a test keeps them equal).
_PRODUCTS = ("fake-quant", "int8-forward", "int8")


def _configs_option(function):
    return click.option(
        "--configs",
        "configs",
        default=None,
        metavar="NAME,...",
        help=f"Only these QAT presets, comma-separated, from {', '.join(_PRESETS)} (default: all).",
    )(function)


def _split_option(function):
    return click.option(
        "--split",
        type=click.Choice(["per-seed", "fixed"]),
        default="per-seed",
        show_default=True,
        help="per-seed: seed s trains and is tested on its own split s; fixed: one split shared by every seed.",
    )(function)


@click.command("train")
@click.option(
    "--preset",
    "preset_name",
    type=click.Choice(_PRESETS),
    default=None,
    help="A QAT preset, trained with the default recipe: float, or weights/activations at 8, 4, 2 or 1 bits "
    "(w4a4_no_ste: w4a4 without the straight-through gradient, a control).",
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A JSON file of TrainConfig fields (any subset; the rest take their defaults).",
)
@click.option("--epochs", type=click.IntRange(min=1), default=None, help="Override the number of epochs.")
@click.option("--seed", type=click.IntRange(min=0), default=None, help="Override the training seed.")
@click.option("--model", type=_MODEL_CHOICE, default=None, help="Override the model: a multilayer perceptron or a CNN.")
@click.option(
    "--product",
    type=click.Choice(_PRODUCTS),
    default=None,
    help="How the quantised layers multiply (default: the config file's, else fake-quant). fake-quant: float "
    "products of the fake-quantised operands. int8-forward: int8 x int8 -> int32 forward products, float "
    "straight-through gradient. int8: the forward and both backward products in int8, the gradient's cotangent "
    "quantised per row and per column (a declared gradient, about 1% from the straight-through one). Integer "
    "products quantise with their own absmax scales (inputs per example, or per patch in a convolution; weights "
    "per output channel) in place of the LSQ steps, so they take w8a8 (8-bit weights and inputs in every "
    "quantised layer); they pay off on accelerators with fast int8 products (see docs/integer-training.md).",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    metavar="DIR",
    required=True,
    help="The run directory to write.",
)
@click.option(
    "--debug-keys",
    "debug_keys",
    type=click.IntRange(min=1),
    is_flag=False,
    flag_value=2,
    default=None,
    metavar="[N]",
    help="Run the first N steps (default 2) eagerly under the key ledger, proving no key is used twice.",
)
@click.option(
    "--devices",
    type=click.IntRange(min=1),
    default=None,
    help="Data parallel: split each batch over the first N devices (of all processes). On CPU, set "
    "XLA_FLAGS=--xla_force_host_platform_device_count=N first.",
)
@click.option(
    "--shard-params",
    is_flag=True,
    default=False,
    help="With a mesh, split parameters and optimiser state over the devices instead of replicating them.",
)
@click.option(
    "--coordinator",
    default=None,
    metavar="HOST:PORT",
    help="Multi-host: jax.distributed.initialize with this coordinator (process 0's address; 'auto' on a "
    "cluster JAX detects: SLURM, Open MPI, TPU pods), then train on every process's devices. With an address, "
    "give --num-processes and --process-id too.",
)
@click.option("--num-processes", type=click.IntRange(min=1), default=None, help="Multi-host: how many processes.")
@click.option("--process-id", type=click.IntRange(min=0), default=None, help="Multi-host: this process's index.")
def train_command(
    preset_name: str | None,
    config_file: Path | None,
    epochs: int | None,
    seed: int | None,
    model: str | None,
    product: str | None,
    out: Path,
    debug_keys: int | None,
    devices: int | None,
    shard_params: bool,
    coordinator: str | None,
    num_processes: int | None,
    process_id: int | None,
) -> None:
    """Train one model and write its run directory.

    OUT gets config.json, metrics.jsonl (one line per epoch), params.safetensors
    (the parameters with the best validation accuracy), normalizer.json and
    report.json (their test accuracy: the test split is used once, at the end;
    it and config.json record the product kind). Give a preset (trained with
    the default recipe) or a config file. With
    --devices or --coordinator the batch is split over a device mesh (same
    results up to reduction order); across processes only process 0 writes OUT.
    """
    from stejax.train import TrainConfig, train

    config = _train_config(TrainConfig, preset_name, config_file, epochs=epochs, seed=seed, model=model)
    config = _with_product(config, product)
    mesh = _data_mesh(config, devices, shard_params, debug_keys, coordinator, num_processes, process_id)
    parallel = {} if mesh is None else {"mesh": mesh, "param_sharding": "sharded" if shard_params else "replicated"}
    console = Console()
    products = "" if config.product == "fake-quant" else f", {config.product} products"
    console.print(
        Text(f"training {config.preset} ({config.model}, seed {config.seed}, up to {config.epochs} epochs{products})")
    )
    if mesh is not None:
        console.print(Text(f"data parallel over {mesh.size} devices, parameters {parallel['param_sharding']}"))
    with progress_bar(console) as progress:
        task = progress.add_task(config.preset, total=config.epochs)

        def on_epoch(record: Mapping[str, Any]) -> None:
            line = epoch_line(record, config.epochs)
            progress.update(task, advance=1, description=f"{config.preset} {line}")
            if progress.disable:  # no bar (not a terminal): one line per epoch instead
                console.print(Text(f"{config.preset} {line}"))

        result = guarded(lambda: train(config, out_dir=out, debug_keys=debug_keys or 0, on_epoch=on_epoch, **parallel))
    if result.key_check is not None:
        check = result.key_check
        console.print(
            Text(
                f"debug-keys: {check.steps} step(s) eagerly under the key ledger; {check.keys_recorded} keys "
                f"recorded, none consumed twice; made but unused: {len(check.unused)} "
                f"({'; '.join(check.unused) or 'none'})"
            )
        )
    console.print(
        Text(
            f"test accuracy {100 * result.test_accuracy:.2f}% (best epoch {result.best_epoch} of "
            f"{len(result.history)}, validation {100 * result.best_val_accuracy:.2f}%, "
            f"{result.seconds:.1f} s)"
        )
    )
    console.print(Text(f"run directory: {out.resolve()}"))


@click.command("compare", short_help="Train every QAT preset over seeds and compare with float.")
@click.option(
    "--seeds",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    help="Seeds 0..N-1, each preset trained once per seed.",
)
@_split_option
@click.option("--epochs", type=click.IntRange(min=1), default=None, help="Override the number of epochs.")
@click.option("--model", type=_MODEL_CHOICE, default=None, help="Override the model: a multilayer perceptron or a CNN.")
@_configs_option
@repeats_option("Interleaved timed rounds of the training steps.", default=200)
@deprecated_option("--timing-repeats", "repeats", type=click.IntRange(min=1))
@warmup_option("Untimed calls of each training step before the timed rounds.", default=10)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    metavar="DIR",
    required=True,
    help="Folder for report.md, report.json, plots/ and runs/.",
)
@workers_option()
def compare_command(
    seeds: int,
    split: str,
    epochs: int | None,
    model: str | None,
    configs: str | None,
    repeats: int,
    warmup: int,
    out: Path,
    workers: int,
) -> None:
    """Train every QAT preset over seeds, compare each with float and write the report.

    Trains float, w8a8, w4a4, w2a2, w1a32, w1a1 and w4a4_no_ste with the default
    recipe on the digits, times their jitted training steps side by side, and
    writes OUT/report.md (the targets and whether each is met), OUT/report.json
    and the plots. Each configuration is compared with float paired by seed:
    with --split per-seed (default) seed s trains and is tested on its own
    split s; --split fixed shares one split among all seeds.
    """
    _run_compare(
        Console(),
        out,
        seeds=seeds,
        split=split,
        epochs=epochs,
        model=model,
        configs=configs,
        repeats=repeats,
        warmup=warmup,
        workers=workers,
    )


@click.command(short_help="Train and compare every QAT preset on the digits (minutes).")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    metavar="DIR",
    default=Path("demo-out"),
    show_default=True,
    help="Folder for the demo's outputs.",
)
@click.option(
    "--seeds",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    help="Seeds 0..N-1, each preset trained once per seed.",
)
@_split_option
@click.option("--epochs", type=click.IntRange(min=1), default=None, help="Override the number of epochs.")
@_configs_option
@click.option(
    "--catalog/--no-catalog",
    default=False,
    show_default=True,
    help="Also draw every estimator into OUT/plots and write OUT/catalog.md (as in docs/).",
)
@workers_option(default=2)
def demo(
    out: Path, seeds: int, split: str, epochs: int | None, configs: str | None, catalog: bool, workers: int
) -> None:
    """Try stejax end to end: train every QAT preset on the digits and write the comparison to OUT.

    The same as `stejax compare --out OUT --workers 2` with the default recipe:
    every QAT preset over 10 seeds, a split per seed, then OUT/report.md,
    OUT/report.json and the plots. A few minutes on two CPU cores.
    """
    console = Console()
    out.mkdir(parents=True, exist_ok=True)
    if catalog:
        _demo_catalog(console, out)
    _run_compare(
        console,
        out,
        seeds=seeds,
        split=split,
        epochs=epochs,
        model=None,
        configs=configs,
        repeats=200,
        warmup=10,
        workers=workers,
    )


def _train_config(cls, preset_name, config_file, **overrides):
    if (preset_name is None) == (config_file is None):
        raise click.UsageError("give exactly one of --preset NAME or --config FILE.")
    try:
        if config_file is not None:
            return cls.from_file(config_file, **overrides)
        return cls.from_dict({"preset": preset_name}, **overrides)
    except (TypeError, ValueError) as error:
        hint = "--config" if config_file is not None else "--preset"
        raise click.BadParameter(str(error), param_hint=hint) from None


def _with_product(config, product):
    """``config`` with ``--product`` applied (None: the config's own), or a BadParameter naming what clashes."""
    if product is None or product == config.product:
        return config
    try:
        return dataclasses.replace(config, product=product)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--product") from None


def _data_mesh(config, devices, shard_params, debug_keys, coordinator, num_processes, process_id):
    """The train command's device mesh (None: one device), after jax.distributed.initialize when asked."""
    if coordinator is None and (num_processes is not None or process_id is not None):
        raise click.UsageError("--num-processes and --process-id need --coordinator HOST:PORT.")
    if coordinator is not None and coordinator != "auto":
        _check_coordinator(coordinator, num_processes, process_id)
    if devices is None and coordinator is None:
        if shard_params:
            raise click.UsageError("--shard-params needs a mesh: give --devices N (or --coordinator).")
        return None
    if debug_keys:
        raise click.UsageError("--debug-keys checks eager one-device steps; run it without --devices/--coordinator.")
    import jax

    from stejax.train import data_mesh

    if coordinator == "auto":
        jax.distributed.initialize()
    elif coordinator is not None:
        jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id)
    try:
        mesh = data_mesh(devices)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--devices") from None
    if config.batch_size % mesh.size:
        raise click.BadParameter(
            f"batch_size {config.batch_size} does not split evenly over {mesh.size} devices; "
            f"use a multiple of {mesh.size}.",
            param_hint="--devices",
        )
    return mesh


def _check_coordinator(coordinator, num_processes, process_id):
    """What jax.distributed.initialize needs with an explicit coordinator, checked before it is called."""
    host, _, port = coordinator.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise click.BadParameter(
            f"expected HOST:PORT (process 0's address, a port in 1..65535) or 'auto'; got {coordinator!r}.",
            param_hint="--coordinator",
        )
    if num_processes is None or process_id is None:
        missing = " and ".join(
            flag for flag, value in (("--num-processes", num_processes), ("--process-id", process_id)) if value is None
        )
        raise click.UsageError(
            f"--coordinator {coordinator} needs --num-processes N (how many processes) and --process-id I "
            f"(this process's index, 0..N-1); {missing} missing. Use --coordinator auto on a cluster that "
            "jax.distributed can detect."
        )
    if process_id >= num_processes:
        raise click.UsageError(
            f"--process-id must be in 0..{num_processes - 1} for --num-processes {num_processes}; got {process_id}."
        )


def _run_compare(
    console: Console,
    out: Path,
    *,
    seeds: int,
    split: str,
    epochs: int | None,
    model: str | None,
    configs: str | None,
    repeats: int,
    warmup: int,
    workers: int = 1,
) -> None:
    from stejax.model import PRESETS
    from stejax.train import TrainConfig, compare

    names = PRESETS if configs is None else tuple(c.strip() for c in configs.split(",") if c.strip())
    unknown = [n for n in names if n not in PRESETS]
    if unknown or not names:
        raise click.BadParameter(
            f"unknown configuration {unknown[0]!r}; choose from {', '.join(PRESETS)}."
            if unknown
            else "no configuration given.",
            param_hint="--configs",
        )
    base = TrainConfig.from_dict({}, epochs=epochs, model=model)
    console.print(
        Text(
            f"comparing {', '.join(names)} over {seeds} seed(s), {split} split, {base.model}, "
            f"up to {base.epochs} epochs"
        )
    )
    with progress_bar(console) as progress:
        task = progress.add_task("training", total=len(names) * seeds)

        def on_event(event: Mapping[str, Any]) -> None:
            if event["event"] == "epoch":
                record = event["record"]
                progress.update(task, description=f"{event['preset']} seed {event['seed']} epoch {record['epoch']}")
            elif event["event"] == "run":
                progress.update(task, advance=1)
            else:
                progress.update(task, description="timing the steps")

        report = guarded(
            lambda: compare(
                names,
                seeds=seeds,
                split=split,
                base=base,
                out_dir=out,
                timing_repeats=repeats,
                timing_warmup=warmup,
                on_event=on_event,
                workers=workers,
            )
        )
    console.print(_compare_table(report))
    for target in report["targets"]:
        if target["met"] is not None:
            mark = "met" if target["met"] else "MISSED"
            console.print(Text(f"  {mark:6s} {target['target']}: {target['measured']}"))
    console.print(Text(f"report: {(out / 'report.md').resolve()}"))


def _compare_table(report: Mapping[str, Any]) -> Table:
    table = Table(title="QAT comparison (test accuracy over seeds)")
    for column in ("configuration", "test accuracy %", "std", "delta vs float (se)", "step ms"):
        table.add_column(column, justify="left" if column == "configuration" else "right")
    for name, row in report["summary"].items():
        std = row["test_accuracy_std"]
        delta = row.get("delta_vs_float_mean")
        se = row.get("delta_vs_float_se")
        delta_text = "-" if delta is None else f"{delta:+.2f} ({'n/a' if se is None else f'{se:.2f}'})"
        table.add_row(
            Text(name),
            Text(f"{100 * row['test_accuracy_mean']:.2f}"),
            Text("n/a" if std is None else f"{100 * std:.2f}"),
            Text(delta_text),
            Text(f"{row['step_ms_median']:.3f}"),
        )
    return table


def _demo_catalog(console: Console, out: Path) -> None:
    entries = list(CATALOG.values())
    console.print(_catalog_table(entries))
    plots = out / "plots"
    for entry in entries:
        _plot(entry, plots / f"{entry.name}.png", entry.default_params(), user_params=False)
    console.print(Text(f"plots: {len(entries)} in {plots.resolve()}"))
    summary = out / "catalog.md"
    summary.write_text(catalog_markdown(entries, image_dir="plots"), encoding="utf-8")
    console.print(Text(f"summary: {summary.resolve()}"))
