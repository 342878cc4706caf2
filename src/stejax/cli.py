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
def train_command(
    preset_name: str | None,
    config_file: Path | None,
    epochs: int | None,
    seed: int | None,
    model: str | None,
    out: Path,
    debug_keys: int | None,
) -> None:
    """Train one model and write its run directory.

    OUT gets config.json, metrics.jsonl (one line per epoch), params.safetensors
    (the parameters with the best validation accuracy), normalizer.json and
    report.json (their test accuracy: the test split is used once, at the end).
    Give a preset (trained with the default recipe) or a config file.
    """
    from stejax.train import TrainConfig, train

    config = _train_config(TrainConfig, preset_name, config_file, epochs=epochs, seed=seed, model=model)
    console = Console()
    console.print(Text(f"training {config.preset} ({config.model}, seed {config.seed}, up to {config.epochs} epochs)"))
    with _progress(console) as progress:
        task = progress.add_task(config.preset, total=config.epochs)

        def on_epoch(record: Mapping[str, Any]) -> None:
            progress.update(task, advance=1, description=f"{config.preset} val {100 * record['val_accuracy']:.1f}%")

        result = _guarded(lambda: train(config, out_dir=out, debug_keys=debug_keys or 0, on_epoch=on_epoch))
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
