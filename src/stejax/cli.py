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


@main.command()
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("demo-out"),
    show_default=True,
    help="Folder for the demo's outputs.",
)
def demo(out: Path) -> None:
    """Run the demo, writing its outputs under --out.

    For now: the catalog, one plot per estimator in OUT/plots and a summary
    table in OUT/catalog.md.
    """
    console = Console()
    out.mkdir(parents=True, exist_ok=True)
    _demo_catalog(console, out)


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
