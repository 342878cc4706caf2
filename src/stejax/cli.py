"""The ``stejax`` command line: parses, calls library functions, prints.

Needs the optional extra ``stejax[cli]`` (click, rich, matplotlib).
"""

from __future__ import annotations

import ast
import difflib
import inspect
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from stejax.estimators._entry import Entry
from stejax.estimators.catalog import CATALOG, FAMILIES

__all__ = ["main"]


@click.group()
@click.version_option(package_name="stejax")
def main() -> None:
    """stejax: straight-through estimators and other surrogate gradients for JAX."""


@main.command("list")
@click.option("--family", type=click.Choice(FAMILIES), default=None, help="Only this family.")
def list_command(family: str | None) -> None:
    """List the estimators with their math and paper.

    One row per estimator: name, family, forward function, surrogate
    derivative (both in a plain-text reading of the LaTeX) and reference.
    """
    entries = [e for e in CATALOG.values() if family is None or e.family == family]
    Console().print(_catalog_table(entries))


@main.command()
@click.argument("name")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Where to write the plot (default: NAME.png in the working directory).",
)
@click.option(
    "--param",
    "param_pairs",
    multiple=True,
    metavar="KEY=VALUE",
    help="A hyperparameter, e.g. --param bits=4; VALUE is a Python literal (a bare word is a string).",
)
def show(name: str, out: Path | None, param_pairs: tuple[str, ...]) -> None:
    """Describe one estimator and plot it.

    Prints the forward function and surrogate derivative (plain text and
    LaTeX), kinks and ties, parameters, extra arrays, the reference and the
    docstring's summary, and writes a PNG of the forward function and the
    surrogate derivative.
    """
    entry = _lookup(name)
    params = _parse_params(entry, param_pairs)
    # Plot first: the estimator validates the parameters before anything is printed.
    out = out if out is not None else Path(f"{entry.name}.png")
    path = _plot(entry, out, params, user_params=bool(param_pairs))
    console = Console()
    _print_entry(console, entry)
    console.print(Text(f"plot: {path.resolve()}"))


_MODEL_CHOICE = click.Choice(["mlp", "cnn"])


def _configs_option(function):
    return click.option(
        "--configs",
        "configs",
        default=None,
        metavar="NAME,...",
        help="Only these QAT configurations, comma-separated (default: all seven).",
    )(function)


@main.command("verify")
@click.argument("target", required=False, metavar="[NAME | MODULE:FUNC]")
@click.option("--all", "verify_all", is_flag=True, help="Verify every catalog member.")
@click.option("--reference", metavar="MODULE:FUNC", help="The exact forward function (user estimators).")
@click.option("--derivative", metavar="MODULE:FUNC", help="The declared surrogate derivative (user estimators).")
@click.option("--boundary", "boundaries", type=float, multiple=True, help="A kink or tie of the first argument.")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    show_default=True,
    help="Folder for verify-report.json and verify-report.md.",
)
def verify_command(
    target: str | None,
    verify_all: bool,
    reference: str | None,
    derivative: str | None,
    boundaries: tuple[float, ...],
    out: Path,
) -> None:
    """Check estimators against their declarations; exit 0 only if every check passes.

    `stejax verify --all` checks the whole catalog; `stejax verify NAME` one
    member; `stejax verify MODULE:FUNC --reference MODULE:FUNC --derivative
    MODULE:FUNC [--boundary B ...]` a user's estimator.
    """
    import os

    from stejax import verify

    console = Console()
    if verify_all == (target is not None):
        raise click.UsageError("give exactly one of --all or a NAME / MODULE:FUNC.")
    if verify_all:
        report = verify.check_catalog()
    elif ":" in target:
        if reference is None or derivative is None:
            raise click.UsageError("a user estimator needs --reference MODULE:FUNC and --derivative MODULE:FUNC.")
        try:
            fn, ref, der = (verify.load_callable(spec, path=os.getcwd()) for spec in (target, reference, derivative))
        except (ValueError, ImportError, AttributeError, TypeError) as error:
            raise click.BadParameter(str(error)) from None
        report = verify.check_surrogate(fn, reference=ref, derivative=der, boundaries=boundaries)
    else:
        report = verify.check_estimator(_lookup(target))
    reports = report.values() if isinstance(report, verify.CatalogReport) else (report,)
    for one in reports:
        table = Table(title=f"{one.subject}: {'ok' if one.ok else 'FAILED'}")
        table.add_column("check")
        table.add_column("passed")
        table.add_column("detail", overflow="fold")
        for check in one.checks:
            if verify_all and check.passed:
                continue
            table.add_row(check.name, "yes" if check.passed else "[red]no[/red]", check.detail)
        if not verify_all or not one.ok:
            console.print(table)
    json_path, md_path = verify.write_report(report, out)
    console.print(report.summary())
    console.print(f"wrote {json_path} and {md_path}")
    if not report.ok:
        raise SystemExit(1)


@main.command("train")
@click.option("--preset", "preset_name", default=None, metavar="NAME", help="A QAT preset (see `compare`).")
@click.option(
    "--config",
    "config_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A JSON file of TrainConfig fields (any subset; the rest take their defaults).",
)
@click.option("--epochs", type=click.IntRange(min=1), default=None, help="Override the number of epochs.")
@click.option("--seed", type=click.IntRange(min=0), default=None, help="Override the training seed.")
@click.option("--model", type=_MODEL_CHOICE, default=None, help="Override the model: mlp or cnn.")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
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
    report.json (their test accuracy: the test split is used once, at the end).
    Give a preset (trained with the default recipe) or a config file. With
    --devices or --coordinator the batch is split over a device mesh (same
    results up to reduction order); across processes only process 0 writes OUT.
    """
    from stejax.train import TrainConfig, train

    config = _train_config(TrainConfig, preset_name, config_file, epochs=epochs, seed=seed, model=model)
    mesh = _data_mesh(config, devices, shard_params, debug_keys, coordinator, num_processes, process_id)
    parallel = {} if mesh is None else {"mesh": mesh, "param_sharding": "sharded" if shard_params else "replicated"}
    console = Console()
    console.print(Text(f"training {config.preset} ({config.model}, seed {config.seed}, up to {config.epochs} epochs)"))
    if mesh is not None:
        console.print(Text(f"data parallel over {mesh.size} devices, parameters {parallel['param_sharding']}"))
    with _progress(console) as progress:
        task = progress.add_task(config.preset, total=config.epochs)

        def on_epoch(record: Mapping[str, Any]) -> None:
            progress.update(task, advance=1, description=f"{config.preset} val {100 * record['val_accuracy']:.1f}%")

        result = _guarded(lambda: train(config, out_dir=out, debug_keys=debug_keys or 0, on_epoch=on_epoch, **parallel))
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


@main.command("compare")
@click.option("--seeds", type=click.IntRange(min=1), default=5, show_default=True, help="Seeds per configuration.")
@click.option("--epochs", type=click.IntRange(min=1), default=None, help="Override the number of epochs.")
@click.option("--model", type=_MODEL_CHOICE, default=None, help="Override the model: mlp or cnn.")
@_configs_option
@click.option(
    "--timing-repeats",
    type=click.IntRange(min=1),
    default=200,
    show_default=True,
    help="Interleaved rounds of step timing.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Folder for report.md, report.json, plots/ and runs/.",
)
def compare_command(
    seeds: int, epochs: int | None, model: str | None, configs: str | None, timing_repeats: int, out: Path
) -> None:
    """Compare the QAT configurations over seeds and write the report.

    Trains float, w8a8, w4a4, w2a2, w1a32, w1a1 and w4a4_no_ste with the default
    recipe on the digits, times their jitted training steps side by side, and
    writes OUT/report.md (the targets and whether each is met), OUT/report.json
    and the plots.
    """
    _run_compare(Console(), out, seeds=seeds, epochs=epochs, model=model, configs=configs, repeats=timing_repeats)


@main.command()
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("demo-out"),
    show_default=True,
    help="Folder for the demo's outputs.",
)
@click.option("--seeds", type=click.IntRange(min=1), default=5, show_default=True, help="Seeds per configuration.")
@click.option("--epochs", type=click.IntRange(min=1), default=None, help="Override the number of epochs.")
@_configs_option
@click.option(
    "--catalog/--no-catalog",
    default=False,
    show_default=True,
    help="Also draw every estimator into OUT/plots and write OUT/catalog.md (as in docs/).",
)
def demo(out: Path, seeds: int, epochs: int | None, configs: str | None, catalog: bool) -> None:
    """Run the main job: the QAT comparison on the digits, with its report in OUT.

    The same as `stejax compare --out OUT` with the default recipe: every QAT
    configuration over 5 seeds, then OUT/report.md, OUT/report.json and the
    plots. A few minutes on two CPU cores.
    """
    console = Console()
    out.mkdir(parents=True, exist_ok=True)
    if catalog:
        _demo_catalog(console, out)
    _run_compare(console, out, seeds=seeds, epochs=epochs, model=None, configs=configs, repeats=200)


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


def _guarded(run):
    """Run a training job; its NaN guard and key checks become clean CLI errors."""
    from stejax.keys import KeyReuseError
    from stejax.train import NonFiniteError

    try:
        return run()
    except (NonFiniteError, KeyReuseError) as error:
        raise click.ClickException(f"{type(error).__name__}: {error}") from None


def _progress(console: Console):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        # No bar when the output is not a terminal (pipes, CI, tests).
        disable=not console.is_terminal,
    )


def _run_compare(
    console: Console, out: Path, *, seeds: int, epochs: int | None, model: str | None, configs: str | None, repeats: int
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
    console.print(Text(f"comparing {', '.join(names)} over {seeds} seed(s), {base.model}, up to {base.epochs} epochs"))
    with _progress(console) as progress:
        task = progress.add_task("training", total=len(names) * seeds)

        def on_event(event: Mapping[str, Any]) -> None:
            if event["event"] == "epoch":
                record = event["record"]
                progress.update(task, description=f"{event['preset']} seed {event['seed']} epoch {record['epoch']}")
            elif event["event"] == "run":
                progress.update(task, advance=1)
            else:
                progress.update(task, description="timing the steps")

        report = _guarded(
            lambda: compare(names, seeds=seeds, base=base, out_dir=out, timing_repeats=repeats, on_event=on_event)
        )
    console.print(_compare_table(report))
    for target in report["targets"]:
        if target["met"] is not None:
            mark = "met" if target["met"] else "MISSED"
            console.print(Text(f"  {mark:6s} {target['target']}: {target['measured']}"))
    console.print(Text(f"report: {(out / 'report.md').resolve()}"))


def _compare_table(report: Mapping[str, Any]) -> Table:
    table = Table(title="QAT comparison (test accuracy over seeds)")
    for column in ("configuration", "test accuracy %", "std", "step ms"):
        table.add_column(column, justify="left" if column == "configuration" else "right")
    for name, row in report["summary"].items():
        table.add_row(
            Text(name),
            Text(f"{100 * row['test_accuracy_mean']:.2f}"),
            Text(f"{100 * row['test_accuracy_std']:.2f}"),
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
    summary.write_text(_catalog_markdown(entries, image_dir="plots"), encoding="utf-8")
    console.print(Text(f"summary: {summary.resolve()}"))


def _lookup(name: str) -> Entry:
    if name in CATALOG:
        return CATALOG[name]
    close = difflib.get_close_matches(name, list(CATALOG), n=5, cutoff=0.5)
    hint = f"did you mean: {', '.join(close)}?" if close else f"known: {', '.join(CATALOG)}."
    raise click.BadParameter(f"no estimator named {name!r}; {hint}", param_hint="NAME")


def _parse_params(entry: Entry, pairs: Iterable[str]) -> dict[str, Any]:
    """``KEY=VALUE`` strings to keyword arguments of ``entry``; VALUE through ``ast.literal_eval``."""
    known = [p.name for p in entry.params]
    params: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {pair!r}.", param_hint="--param")
        if key not in known:
            expected = ", ".join(known) if known else "none (it takes no parameters)"
            raise click.BadParameter(
                f"{entry.name} has no parameter {key!r}; its parameters: {expected}.", param_hint="--param"
            )
        try:
            params[key] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            if not raw.isidentifier():
                raise click.BadParameter(
                    f"{key}: expected a Python literal (4, 0.5, (3, 5), True, 'text'), got {raw!r}.",
                    param_hint="--param",
                ) from None
            params[key] = raw
    return params


def _plot(entry: Entry, out: Path, params: Mapping[str, Any], *, user_params: bool) -> Path:
    from stejax.plot import plot_estimator

    try:
        return plot_estimator(entry, out, params=params)
    except (ValueError, TypeError) as error:
        if not user_params:
            raise
        # The estimator rejected a value the user gave: a usage error, not a crash.
        raise click.BadParameter(str(error), param_hint="--param") from None


def _catalog_table(entries: Iterable[Entry]) -> Table:
    entries = list(entries)
    table = Table(title="stejax estimators", show_lines=False)
    width = max((len(e.name) for e in entries), default=4)
    table.add_column("name", no_wrap=True, min_width=width, style="bold")
    table.add_column("family", no_wrap=True)
    table.add_column("forward", overflow="fold")
    table.add_column("surrogate derivative", overflow="fold")
    table.add_column("reference", overflow="fold")
    for e in entries:
        table.add_row(
            Text(e.name),
            Text(e.family),
            Text(_plain_math(e.forward_math)),
            Text(_plain_math(_derivative_math(e))),
            Text(e.reference),
        )
    return table


def _print_entry(console: Console, entry: Entry) -> None:
    console.rule(Text(f"{entry.name}  ({entry.family})"))
    summary = _first_paragraph(entry.fn)
    if summary:
        console.print(Text(summary))
    rows = [
        ("forward", _plain_math(entry.forward_math)),
        ("  LaTeX", entry.forward_math),
        ("surrogate derivative", _plain_math(_derivative_math(entry))),
        ("  LaTeX", entry.derivative_math),
        ("kinks and ties", entry.kinks),
        ("integral of the surrogate", entry.integral),
        ("input", _input_text(entry)),
        ("random", "yes: needs key=<PRNG key>" if entry.random else ""),
        ("reference", entry.reference),
    ]
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold", no_wrap=True)
    facts.add_column(overflow="fold")
    for label, value in rows:
        if value:
            facts.add_row(Text(label), Text(value))
    console.print(facts)

    if entry.params:
        params = Table(title="parameters", title_justify="left")
        for column in ("name", "default", "values tried", "meaning"):
            params.add_column(column, overflow="fold")
        for p in entry.params:
            default = _default_text(entry, p)
            values = ", ".join(repr(v) for v in p.values)
            params.add_row(Text(p.name), Text(default), Text(values), Text(p.doc))
        console.print(params)
    if entry.args:
        args = Table(title="extra positional arrays", title_justify="left")
        for column in ("name", "differentiable", "meaning"):
            args.add_column(column, overflow="fold")
        for a in entry.args:
            args.add_row(Text(a.name), Text("yes" if a.differentiable else "no"), Text(a.doc))
        console.print(args)


# LaTeX commands and their plain-text (Unicode) reading, for the terminal.
# fmt: off
_SYMBOLS = {
    "lfloor": "⌊", "rfloor": "⌋", "lceil": "⌈", "rceil": "⌉", "partial": "∂", "sim": "~",
    "le": "≤", "leq": "≤", "ge": "≥", "geq": "≥", "ne": "≠", "neq": "≠", "approx": "≈",
    "cdot": "·", "times": "×", "in": "∈", "infty": "∞", "pm": "±", "mp": "∓", "to": "→",
    "mapsto": "↦", "sum": "Σ", "prod": "Π", "lVert": "‖", "rVert": "‖", "Vert": "‖", "|": "‖",
    "vert": "|", "lvert": "|", "rvert": "|", "langle": "⟨", "rangle": "⟩", "odot": "⊙",
    "alpha": "α", "beta": "β", "gamma": "γ", "delta": "δ", "Delta": "Δ", "epsilon": "ε",
    "varepsilon": "ε", "eta": "η", "theta": "θ", "lambda": "λ", "mu": "μ", "pi": "π",
    "sigma": "σ", "tau": "τ", "phi": "φ", "omega": "ω", "Theta": "Θ",
    "operatorname": "", "mathrm": "", "text": "", "mathbf": "", "mathit": "", "left": "", "right": "",
    "quad": "  ", "qquad": "   ", ",": " ", ";": " ", " ": " ", "!": "",
    **{f: f for f in ("tanh", "exp", "log", "ln", "sin", "cos", "max", "min", "sgn", "arg")},
}
# fmt: on
# Commands after which LaTeX's separating space is dropped: "\partial y" reads "∂y", "\alpha x" "αx".
_JOINED = {"partial", "operatorname", "mathrm", "text", "mathbf", "mathit", "left", "right"} | {
    name for name, char in _SYMBOLS.items() if len(char) == 1 and char.isalpha()
}


def _plain_math(latex: str) -> str:
    """A readable plain-text form of ``latex`` for the terminal; unknown commands stay as written."""
    text = latex.replace(r"\mathbb{1}", "𝟙")

    def symbol(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in _SYMBOLS:
            return match.group(0)
        space = "" if name in _JOINED else match.group(0)[len(name) + 1 :]
        return _SYMBOLS[name] + space

    # A command name ends at its first non-letter and may eat one space, as in LaTeX.
    text = re.sub(r"\\([A-Za-z]+) ?|\\([|,;! ])", symbol, text)
    # \frac{a}{b} -> a/b, parenthesised unless single tokens; nested fractions stay LaTeX.
    text = re.sub(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}", lambda m: f"{_atom(m[1])}/{_atom(m[2])}", text)
    if re.search(r"\\[A-Za-z]", text):
        # A command this reader does not know: the LaTeX as written is clearer than half a translation.
        return " ".join(latex.split())
    # Braces that only grouped (after \text, \operatorname, ...) go.
    text = re.sub(r"(?<!\\)[{}]", "", text)
    text = " ".join(text.split())
    return re.sub(r" ([⌋⌉⟩])", r"\1", re.sub(r"([⌊⌈⟨]) ", r"\1", text))


def _atom(text: str) -> str:
    return text if re.fullmatch(r"\w+", text) else f"({text})"


def _default_text(entry: Entry, spec) -> str:
    """The default as the signature has it: a ParamSpec default of None may mean required or None."""
    if spec.default is not None:
        return repr(spec.default)
    try:
        param = inspect.signature(entry.fn).parameters.get(spec.name)
    except (TypeError, ValueError):
        param = None
    if param is not None and param.default is not inspect.Parameter.empty:
        return repr(param.default)
    return f"required (e.g. {spec.values[0]!r})"


def _derivative_math(entry: Entry) -> str:
    if entry.derivative_math:
        return entry.derivative_math
    return "a tangent map (non-diagonal Jacobian)" if entry.tangent is not None else ""


def _input_text(entry: Entry) -> str:
    if entry.input_rank == 0:
        return ""
    return f"rank >= {entry.input_rank}; the last axis is the code (channel) dimension"


def _first_paragraph(fn: Any) -> str:
    doc = inspect.getdoc(fn) or ""
    return " ".join(doc.strip().split("\n\n")[0].split())


def _catalog_markdown(entries: Iterable[Entry], *, image_dir: str) -> str:
    """A Markdown summary table of ``entries``, each row linking to its plot in ``image_dir``."""
    lines = [
        "# stejax estimators",
        "",
        "| name | family | forward | surrogate derivative | reference | plot |",
        "|---|---|---|---|---|---|",
    ]
    for e in entries:
        cells = [
            f"`{e.name}`",
            e.family,
            _table_math(e.forward_math),
            _table_math(e.derivative_math) or _derivative_math(e),
            e.reference.replace("|", "/"),
            f"[png]({image_dir}/{e.name}.png)",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _table_math(latex: str) -> str:
    # A bare | ends a Markdown table cell; \vert and \Vert typeset the same bars.
    if not latex:
        return ""
    return "$" + latex.replace("\\|", "\\Vert ").replace("|", "\\vert ") + "$"


# ----------------------------------------------------------------------------- stejax serve
# The HTTP inference service (issue 6). Needs the extra stejax[serve].

_ADMIN_TOKEN_ENV = "STEJAX_ADMIN_TOKEN"


@main.command("serve")
@click.option(
    "--artifact",
    "artifact_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Serve this artifact directory.",
)
@click.option(
    "--registry",
    "registry_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Serve this registry's current artifact; reloads promote through it, rollback rolls it back.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to bind.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True, help="The port to bind.")
@click.option("--buckets", default="1,8,32,128", show_default=True, metavar="N,...", help="Batch buckets.")
@click.option(
    "--oversize",
    type=click.Choice(["split", "refuse"]),
    default="split",
    show_default=True,
    help="Requests above the largest bucket: run in chunks, or refuse with 413.",
)
@click.option("--max-rows", type=click.IntRange(min=1), default=1024, show_default=True, help="Rows per request.")
@click.option(
    "--max-body-bytes", type=click.IntRange(min=1), default=4 * 1024 * 1024, show_default=True, help="Body limit."
)
@click.option(
    "--batch-wait-ms",
    type=click.FloatRange(min=0),
    default=2.0,
    show_default=True,
    help="The longest a request waits for others to share its bucket.",
)
@click.option("--micro-batching/--no-micro-batching", default=True, show_default=True)
@click.option(
    "--max-connections",
    type=click.IntRange(min=1),
    default=256,
    show_default=True,
    help="Concurrent connections; beyond them uvicorn answers 503.",
)
@click.option(
    "--admin-token-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help=f"The admin bearer token (else ${_ADMIN_TOKEN_ENV}); without one the admin endpoints are off.",
)
@click.option(
    "--log-level",
    type=click.Choice(["critical", "error", "warning", "info", "debug"]),
    default="info",
    show_default=True,
)
def serve_command(
    artifact_dir: Path | None,
    registry_dir: Path | None,
    host: str,
    port: int,
    buckets: str,
    oversize: str,
    max_rows: int,
    max_body_bytes: int,
    batch_wait_ms: float,
    micro_batching: bool,
    max_connections: int,
    admin_token_file: Path | None,
    log_level: str,
) -> None:
    """Serve a verified artifact over HTTP: POST /v1/predict, /metrics, /healthz, /readyz, /admin/*.

    Every bucket is compiled at start-up (no request ever compiles); /readyz
    answers 200 once that is done and the artifact passed its gate. Bound to
    127.0.0.1 unless --host says otherwise. The admin endpoints (reload,
    rollback, status) are on only with a token from --admin-token-file or
    $STEJAX_ADMIN_TOKEN.
    """
    import logging
    import os

    import uvicorn

    from stejax.serve import ArtifactSource, RegistrySource, ServeConfig, create_app

    if (artifact_dir is None) == (registry_dir is None):
        raise click.UsageError("give exactly one of --artifact DIR or --registry DIR.")
    try:
        bucket_sizes = tuple(int(b) for b in buckets.split(","))
    except ValueError:
        raise click.BadParameter(f"expected comma-separated ints, e.g. 1,8,32,128; got {buckets!r}.") from None
    if admin_token_file is not None:
        token = admin_token_file.read_text(encoding="utf-8").strip()
        if not token:
            raise click.BadParameter(f"{admin_token_file} is empty.", param_hint="--admin-token-file")
    else:
        token = os.environ.get(_ADMIN_TOKEN_ENV, "").strip() or None
    try:
        config = ServeConfig(
            buckets=bucket_sizes,
            oversize=oversize,
            max_rows=max_rows,
            max_body_bytes=max_body_bytes,
            micro_batching=micro_batching,
            batch_wait_ms=batch_wait_ms,
            admin_token=token,
        )
    except ValueError as error:
        raise click.BadParameter(str(error)) from None
    if artifact_dir is not None:
        source = ArtifactSource(artifact_dir)
    else:
        from stejax.artifacts import Registry

        source = RegistrySource(Registry(registry_dir))
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    console = Console()
    console.print(
        Text(
            f"stejax serve: {source.description} on http://{host}:{port} (buckets {list(config.buckets)}, "
            f"admin {'on' if token else 'off'}); /readyz turns 200 when every bucket is compiled"
        )
    )
    uvicorn.run(
        create_app(source, config),
        host=host,
        port=port,
        log_level=log_level,
        limit_concurrency=max_connections,
        server_header=False,
    )


# ============================================================================= bench and diagnose
# `stejax bench` and `stejax diagnose`: measurements and fault localisation (one section, kept together).

_BENCH_SUITES = ("estimators", "train", "inference", "peers", "all")


@main.command("bench")
@click.option(
    "--suite",
    "suites",
    multiple=True,
    type=click.Choice(_BENCH_SUITES),
    default=("all",),
    show_default=True,
    help="A suite to run (repeatable).",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Folder for bench.json, bench.md and bench.png.",
)
@click.option(
    "--repeats", type=click.IntRange(min=1), default=None, help="Timed rounds per group (default 30; quick 5)."
)
@click.option(
    "--warmup", type=click.IntRange(min=1), default=None, help="Untimed calls per variant (default 3; quick 1)."
)
@click.option("--quick", is_flag=True, help="Small models and inputs: a check that every suite runs, in seconds.")
@click.option("--estimator", "estimators", multiple=True, metavar="NAME", help="Only this estimator (repeatable).")
def bench_command(
    suites: tuple[str, ...],
    out: Path,
    repeats: int | None,
    warmup: int | None,
    quick: bool,
    estimators: tuple[str, ...],
) -> None:
    """Measure: estimators, training steps, inference and peer libraries, after warm-up and compilation.

    Every call is waited for (block_until_ready) and repeated in interleaved
    rounds; the report gives min, p50, p90, p99 and max, compile counts, ratios
    of interleaved runs, the machine and the versions, in OUT/bench.json,
    OUT/bench.md and OUT/bench.png. Exit 1 if a suite fails or an estimator's forms compute different gradients.
    """
    from stejax.bench import BenchSettings, run_bench

    for name in estimators:
        _lookup(name)
    settings = BenchSettings.make(quick=quick, repeats=repeats, warmup=warmup)
    console = Console()

    def on_event(event: Mapping[str, Any]) -> None:
        console.print(Text(f"running the {event['suite']} suite ..."))

    report = run_bench(suites, out_dir=out, settings=settings, estimators=estimators or None, on_event=on_event)
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


@main.command("diagnose")
@click.option(
    "--run",
    "run_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="A run directory (stejax train --out DIR): diagnose its reference pipeline.",
)
@click.option("--pipeline", "factory", metavar="MODULE:FACTORY", default=None, help="A function returning a Pipeline.")
@click.option("--examples", type=click.IntRange(min=1), default=2, show_default=True, help="Examples to run on.")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Also write diagnose.json and diagnose.md here.",
)
def diagnose_command(run_dir: Path | None, factory: str | None, examples: int, out: Path | None) -> None:
    """Find the first stage at which a training pipeline goes wrong; exit 1 if one does.

    Stages: data, keys, shapes, forward, loss, gradients, update (eagerly, jit
    disabled), then jit, vmap and grad added back one at a time and compared
    leaf by leaf with the eager results.
    """
    import os

    from stejax.diagnose import diagnose, load_pipeline, pipeline_from_run

    if (run_dir is None) == (factory is None):
        raise click.UsageError("give exactly one of --run DIR or --pipeline MODULE:FACTORY.")
    try:
        if run_dir is not None:
            pipeline = pipeline_from_run(run_dir)
        else:
            pipeline = load_pipeline(factory, path=os.getcwd())
    except (ValueError, ImportError, AttributeError, TypeError, FileNotFoundError) as error:
        hint = "--run" if run_dir is not None else "--pipeline"
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


# ----------------------------------------------------------------------------- stejax export, artifact, regress
# Integer export, verified artifacts, the local registry and regression sets (issue 5).
# Needs the extra stejax[train].


def _artifact_errors(run):
    """Run a library call; its refusals (bad artifact, failed gate, existing target) become clean CLI errors."""
    try:
        return run()
    except (ValueError, FileExistsError, FileNotFoundError) as error:
        raise click.ClickException(f"{type(error).__name__}: {error}") from None


def _size_table(size) -> Table:
    table = Table(title="stored weights per layer")
    for column in ("layer", "shape", "stored as", "float32 B", "stored B", "ratio", "scales B", "bias B"):
        table.add_column(column, justify="left" if column in ("layer", "shape", "stored as") else "right")
    for row in size.layers:
        table.add_row(
            Text(str(row.index)),
            Text("x".join(map(str, row.weight_shape))),
            Text(row.container),
            Text(str(row.float32_bytes)),
            Text(str(row.weight_bytes)),
            Text(f"1/{round(1 / row.ratio)}" if row.ratio < 1 else "1"),
            Text(str(row.scale_bytes + row.step_bytes)),
            Text(str(row.bias_bytes)),
        )
    return table


def _parity_table(parity) -> Table:
    table = Table(title="parity with the fake-quantised model, per layer")
    for column in ("layer", "path", "codes differing", "outputs bitwise"):
        table.add_column(column, justify="left" if column in ("layer", "path") else "right")
    for row in parity.layers:
        table.add_row(
            Text(str(row.index)),
            Text(row.path),
            Text(f"{row.code_mismatches}/{row.input_codes}" if row.input_codes else "float input"),
            Text(f"{100 * row.output_bitwise:.1f}%"),
        )
    return table


def _checks_table(title: str, checks: Iterable[Any]) -> Table:
    table = Table(title=title)
    for column in ("check", "result", "detail"):
        table.add_column(column)
    for check in checks:
        table.add_row(Text(check.name), Text("passed" if check.passed else "FAILED"), Text(check.detail))
    return table


def _dtypes_option(function):
    return click.option(
        "--estimator-dtypes",
        default=None,
        metavar="DTYPE,...",
        help="The dtypes of the estimator checks (default: every dtype the verifier checks).",
    )(function)


def _split_dtypes(text: str | None) -> tuple[str, ...] | None:
    return None if text is None else tuple(d.strip() for d in text.split(",") if d.strip())


@main.command("export")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True, help="The artifact to write.")
@click.option("--parent", default=None, metavar="DIR|ID", help="The parent artifact (its directory or id).")
def export_command(run_dir: Path, out: Path, parent: str | None) -> None:
    """Export a trained QAT run to integer weights and write the artifact OUT.

    Weights become int8, int4 or int2 codes packed two or four to a byte, or
    binary codes packed eight to a byte, with float32 scales. The exported model
    is compared with the fake-quantised one on the test split; OUT is written
    (atomically) only when every prediction agrees and every logit is within
    the stated bound.
    """
    from stejax.artifacts import save_artifact
    from stejax.export import export_run

    if out.exists() or out.is_symlink():
        # Before minutes of export and parity: the artifact could not be written anyway.
        raise click.ClickException(f"--out {out} exists; artifacts are never overwritten. Nothing was exported.")
    console = Console()
    result = _artifact_errors(lambda: export_run(run_dir, require_parity=False))
    console.print(_size_table(result.size))
    size = result.size
    console.print(
        Text(
            f"weights {size.weight_bytes} B stored vs {size.float32_weight_bytes} B float32, "
            f"scales {size.scale_bytes} B; weights.safetensors predicted {size.predicted_file_bytes} B, "
            f"actual {size.actual_file_bytes} B ({'match' if size.matches else 'MISMATCH'}); the artifact also "
            f"ships parity.safetensors, {size.evidence_file_bytes} B of parity evidence (the test inputs)"
        )
    )
    console.print(_parity_table(result.parity))
    console.print(Text(result.parity.summary()))
    for flip in result.parity.flips:
        console.print(Text(f"  code flip: {flip}"))
    if not result.parity.passed:
        raise click.ClickException("parity failed; no artifact written.")
    artifact = _artifact_errors(lambda: save_artifact(result, out, parent=parent))
    on_disk = artifact.file_bytes()
    table = Table(title="artifact on disk")
    for column in ("file", "bytes", "holds"):
        table.add_column(column, justify="right" if column == "bytes" else "left")
    holds = {
        "weights.safetensors": "the integer weights and scales",
        "parity.safetensors": "parity evidence: the test inputs, fake-quant logits, bounds",
        "manifest.json": "contract, quantisation, hashes, metrics, verification",
    }
    for name, n in on_disk.items():
        table.add_row(Text(name), Text(str(n)), Text(holds.get(name, "")))
    console.print(table)
    total = sum(on_disk.values())
    console.print(Text(f"artifact {artifact.id} written to {artifact.path.resolve()}: {total} B on disk"))


@main.group("artifact")
def artifact_group() -> None:
    """Verify artifacts and manage a local registry (promote, rollback, current, list)."""


@artifact_group.command("verify")
@click.argument("artifact_dir", type=click.Path(file_okay=False, path_type=Path))
def artifact_verify(artifact_dir: Path) -> None:
    """Verify ARTIFACT_DIR: every file's sha256, the safetensors headers, the contract; non-zero exit on any problem."""
    from stejax.artifacts import load_artifact

    artifact = _artifact_errors(lambda: load_artifact(artifact_dir))
    console = Console()
    table = Table(title=f"artifact {artifact.short_id}")
    for column in ("file", "bytes", "sha256"):
        table.add_column(column, justify="right" if column == "bytes" else "left")
    for name, entry in artifact.manifest["files"].items():
        table.add_row(Text(name), Text(str(entry["bytes"])), Text(entry["sha256"]))
    console.print(table)
    quant = artifact.manifest["quantization"]
    console.print(Text(f"verified: {artifact.id} ({quant['preset']}: {quant['describe']})"))


@artifact_group.command("promote")
@click.argument("artifact_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--registry", "registry_dir", type=click.Path(file_okay=False, path_type=Path), required=True)
@_dtypes_option
def artifact_promote(artifact_dir: Path, registry_dir: Path, estimator_dtypes: str | None) -> None:
    """Run the gate on ARTIFACT_DIR and, if every check passes, make it the registry's current artifact."""
    from stejax.artifacts import Registry, RegistryError

    console = Console()
    try:
        promotion = Registry(registry_dir).promote(artifact_dir, estimator_dtypes=_split_dtypes(estimator_dtypes))
    except RegistryError as error:
        if error.report is not None:
            console.print(_checks_table("release gate", error.report.checks))
        raise click.ClickException(str(error)) from None
    except (ValueError, OSError) as error:
        raise click.ClickException(f"{type(error).__name__}: {error}") from None
    console.print(_checks_table("release gate", promotion.gate.checks))
    previous = promotion.previous_id[:12] if promotion.previous_id else "none"
    console.print(Text(f"current: {promotion.artifact.id} (previous: {previous})"))


@artifact_group.command("rollback")
@click.option("--registry", "registry_dir", type=click.Path(file_okay=False, path_type=Path), required=True)
def artifact_rollback(registry_dir: Path) -> None:
    """Make the previous verified artifact current again (nothing is deleted)."""
    from stejax.artifacts import Registry

    artifact = _artifact_errors(lambda: Registry(registry_dir).rollback())
    Console().print(Text(f"current: {artifact.id} (rolled back)"))


@artifact_group.command("current")
@click.option("--registry", "registry_dir", type=click.Path(file_okay=False, path_type=Path), required=True)
def artifact_current(registry_dir: Path) -> None:
    """Print the current artifact's id and directory (verified on the way)."""
    from stejax.artifacts import Registry

    artifact = _artifact_errors(lambda: Registry(registry_dir).current())
    if artifact is None:
        raise click.ClickException(f"{registry_dir}: nothing promoted yet.")
    Console().print(Text(f"{artifact.id} {artifact.path}"))


@artifact_group.command("list")
@click.option("--registry", "registry_dir", type=click.Path(file_okay=False, path_type=Path), required=True)
def artifact_list(registry_dir: Path) -> None:
    """List the registry's artifacts: id, status, when promoted, preset, parent.

    A torn last line of the event log (a crash mid-append) is named and ignored;
    the state does not depend on the log.
    """
    from stejax.artifacts import Registry

    registry = Registry(registry_dir)
    entries = _artifact_errors(registry.list)
    torn = _artifact_errors(registry.torn_tail)
    table = Table(title=f"registry {registry_dir}")
    for column in ("id", "status", "promoted", "preset", "parent"):
        table.add_column(column)
    for entry in entries:
        table.add_row(
            Text(entry.id[:12]),
            Text(entry.status),
            Text(entry.promoted or "-"),
            Text(entry.preset or "-"),
            Text(entry.parent[:12] if entry.parent else "-"),
        )
    Console().print(table)
    if torn is not None:
        Console().print(Text(f"note: {torn}"))


@main.group("regress")
def regress_group() -> None:
    """Record and check an artifact's regression set."""


@regress_group.command("record")
@click.argument("artifact_dir", type=click.Path(file_okay=False, path_type=Path))
def regress_record(artifact_dir: Path) -> None:
    """Store ARTIFACT_DIR/regression: fixed inputs (a batch, one example, zeros, ties, a bad shape) and outputs."""
    from stejax.regress import record

    path = _artifact_errors(lambda: record(artifact_dir))
    Console().print(Text(f"regression set written to {path.resolve()}"))


@regress_group.command("check")
@click.argument("artifact_dir", type=click.Path(file_okay=False, path_type=Path))
def regress_check(artifact_dir: Path) -> None:
    """Recompute ARTIFACT_DIR's regression set and compare at the stated per-dtype tolerances."""
    from stejax.regress import check

    report = _artifact_errors(lambda: check(artifact_dir))
    console = Console()
    console.print(_checks_table("regression set", report.cases))
    for problem in report.problems:
        console.print(Text(f"problem: {problem}"))
    console.print(Text(report.summary()))
    if not report.passed:
        raise SystemExit(1)
