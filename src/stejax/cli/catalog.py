"""``stejax list``, ``stejax show`` and ``stejax verify``: the estimator catalog and the verifier."""

from __future__ import annotations

import ast
import difflib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from stejax.estimators._entry import Entry
from stejax.estimators.catalog import CATALOG, FAMILIES
from stejax.render import default_text, derivative_math, first_paragraph, input_text, plain_math, plain_roles

__all__ = ["list_command", "show", "verify_command"]


@click.command("list")
@click.option("--family", type=click.Choice(FAMILIES), default=None, help="Only the estimators of this family.")
@click.option(
    "--long", "long_", is_flag=True, help="A table with each one's forward, surrogate derivative and reference."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (plain text and LaTeX, parameters, arrays) instead.")
def list_command(family: str | None, long_: bool, as_json: bool) -> None:
    """List the estimators, one line each.

    One line per estimator: name, family and what it does (cut to the
    terminal's width; whole when piped or redirected). With --long, a
    table of each one's forward function, surrogate derivative (both in a
    plain-text reading of the LaTeX) and reference; with --json, a JSON array
    with the same and the LaTeX, the parameters and the extra positional
    arrays. `stejax show NAME` describes one estimator and plots it.
    """
    entries = [e for e in CATALOG.values() if family is None or e.family == family]
    if as_json:
        import json

        click.echo(json.dumps([_entry_record(e) for e in entries], indent=2))
        return
    console = Console()
    if long_:
        console.print(_catalog_table(entries))
    else:
        # A terminal's lines are cut to its width; piped or redirected output keeps every sentence whole.
        click.echo(_catalog_lines(entries, console.width if console.is_terminal else None))


def _catalog_lines(entries: Iterable[Entry], width: int | None) -> str:
    """One line per estimator: name, family and its docstring's first sentence, cut to ``width`` columns (None:
    not cut)."""
    entries = list(entries)
    names = max((len(e.name) for e in entries), default=4)
    families = max((len(e.family) for e in entries), default=6)
    lines = []
    for e in entries:
        summary = plain_roles(first_paragraph(e.fn))
        first = summary.split(". ")[0].rstrip(".") + "." if summary else ""
        line = f"{e.name:<{names}}  {e.family:<{families}}  {first}"
        lines.append(line if width is None or len(line) <= width else line[: max(width - 1, names)] + "…")
    return "\n".join(lines)


def _entry_record(entry: Entry) -> dict[str, Any]:
    """One catalog entry as JSON-ready data."""
    return {
        "name": entry.name,
        "family": entry.family,
        "forward": plain_math(entry.forward_math),
        "derivative": plain_math(derivative_math(entry)),
        "forward_latex": entry.forward_math,
        "derivative_latex": entry.derivative_math,
        "kinks": entry.kinks,
        "random": entry.random,
        "params": [
            {
                "name": p.name,
                "default": default_text(entry, p),
                "required": default_text(entry, p) is None,
                "values": [repr(v) for v in p.values],
                "doc": p.doc,
            }
            for p in entry.params
        ],
        "args": [{"name": a.name, "differentiable": a.differentiable, "doc": a.doc} for a in entry.args],
        "reference": entry.reference,
    }


@click.command()
@click.argument("name")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
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
    entry = lookup(name)
    params = _parse_params(entry, param_pairs)
    # Plot first: the estimator validates the parameters before anything is printed.
    out = out if out is not None else Path(f"{entry.name}.png")
    path = _plot(entry, out, params, user_params=bool(param_pairs))
    console = Console()
    _print_entry(console, entry)
    console.print(Text(f"plot: {path.resolve()}"))


@click.command("verify", short_help="Check estimators against their declared forward and derivative.")
@click.argument("target", required=False, metavar="[NAME | MODULE:FUNC]")
@click.option("--all", "verify_all", is_flag=True, help="Verify every catalog member.")
@click.option("--reference", metavar="MODULE:FUNC", help="The exact forward function (user estimators).")
@click.option("--derivative", metavar="MODULE:FUNC", help="The declared surrogate derivative (user estimators).")
@click.option("--boundary", "boundaries", type=float, multiple=True, help="A kink or tie of the first argument.")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    metavar="DIR",
    default=None,
    help="Also write verify-report.json and verify-report.md to this folder (default: print only).",
)
@click.option(
    "--long", "long_", is_flag=True, help="A table per dtype with every check and what it compared, not one line."
)
def verify_command(
    target: str | None,
    verify_all: bool,
    reference: str | None,
    derivative: str | None,
    boundaries: tuple[float, ...],
    out: Path | None,
    long_: bool,
) -> None:
    """Check estimators against their declarations; exit 0 only if every check passes.

    `stejax verify --all` checks the whole catalog; `stejax verify NAME` one
    member; `stejax verify MODULE:FUNC --reference MODULE:FUNC --derivative
    MODULE:FUNC [--boundary B ...]` a user's estimator, where MODULE is a module
    name or a Python file (`./mymod.py:f`). --reference, --derivative and
    --boundary are for a user's estimator only: a catalog member's come from
    the catalog. One line per dtype: checks passed and failed, and the first
    failure; with --long, a table per dtype with every check and its detail
    (with --all, only the failing estimators, and with --long their failing
    checks); with --out, the reports too.
    """
    import os

    from stejax import verify

    console = Console()
    if verify_all == (target is not None):
        raise click.UsageError("give exactly one of --all or a NAME / MODULE:FUNC.")
    user_options = [
        name
        for name, value in (("--reference", reference), ("--derivative", derivative), ("--boundary", boundaries))
        if value
    ]
    # From here on, `target is None` exactly when --all is given.
    if user_options and (target is None or ":" not in target):
        what = "--all" if target is None else f"the catalog estimator {target!r}"
        raise click.UsageError(
            f"{', '.join(user_options)} apply to a user's estimator (MODULE:FUNC) only; {what} is checked against "
            "the catalog's own forward, derivative and boundaries. Drop them, or verify a MODULE:FUNC."
        )
    report: verify.Report | verify.CatalogReport
    if target is None:
        report = verify.check_catalog()
    elif ":" in target:
        if reference is None or derivative is None:
            raise click.UsageError("a user estimator needs --reference MODULE:FUNC and --derivative MODULE:FUNC.")
        try:
            fn, ref, der = (verify.load_callable(spec, path=os.getcwd()) for spec in (target, reference, derivative))
        except (ValueError, ImportError, AttributeError, TypeError, OSError) as error:
            raise click.BadParameter(str(error)) from None
        report = verify.check_surrogate(fn, reference=ref, derivative=der, boundaries=boundaries)
    else:
        report = verify.check_estimator(lookup(target))
    reports = report.values() if isinstance(report, verify.CatalogReport) else (report,)
    for one in reports:
        if verify_all and one.ok:
            continue
        if long_:
            for table in _check_tables(one, failures_only=verify_all):
                console.print(table)
        else:
            for line in _check_lines(one):
                console.print(line)
    console.print(report.summary())
    env = report.environment
    console.print(f"platform: {env['platform']} ({env['device_kind']}), under its contract: {_contract_line(env)}")
    if out is not None:
        json_path, md_path = verify.write_report(report, out)
        console.print(f"wrote {json_path} and {md_path}")
    if not report.ok:
        raise SystemExit(1)


def _contract_line(env: Any) -> str:
    contract = env["platform_contract"]
    ulps = {d: n for d, n in contract["derivative_ulps"].items() if n}
    flushed = contract["subnormal_inputs_read_as_zero"]
    if not ulps and not flushed:
        return "elementwise functions bit for bit"
    parts = ["derivatives within " + ", ".join(f"{d} {n} ulp" for d, n in ulps.items())] if ulps else []
    if flushed:
        parts.append(f"subnormal {'/'.join(flushed)} inputs read as zero")
    return "; ".join(parts)


def _by_dtype(checks: Iterable[Any]) -> dict[str | None, list[Any]]:
    groups: dict[str | None, list[Any]] = {}
    for check in checks:
        groups.setdefault(check.dtype, []).append(check)
    return groups


def _check_lines(report: Any) -> list[Text]:
    """One line per dtype (and one for the checks tied to none): passed of all, and the first failure's detail."""
    lines = []
    for dtype, checks in _by_dtype(report.checks).items():
        where = dtype if dtype is not None else "checks tied to no dtype"
        failed = [c for c in checks if not c.passed]
        line = Text(f"{report.subject}, {where}: {len(checks) - len(failed)} of {len(checks)} passed")
        if failed:
            detail = failed[0].detail if len(failed[0].detail) <= 160 else failed[0].detail[:159] + "…"
            more = f" (and {len(failed) - 1} more failed)" if len(failed) > 1 else ""
            line.append(f", FAILED: {failed[0].name}: {detail}{more}", style="red")
        lines.append(line)
    return lines


def _check_tables(report: Any, *, failures_only: bool) -> list[Table]:
    """One table per dtype (and one for the checks tied to none), the names printed as they are."""
    groups = _by_dtype(c for c in report.checks if not (failures_only and c.passed))
    tables = []
    for dtype, checks in groups.items():
        ok = all(c.passed for c in checks)
        where = dtype if dtype is not None else "checks tied to no dtype"
        passed = sum(c.passed for c in checks)
        # Text, not markup: a check's name holds brackets ("tangent[float16]") that rich would eat.
        table = Table(
            title=Text(f"{report.subject}, {where}: {passed} of {len(checks)} passed{'' if ok else ', FAILED'}")
        )
        table.add_column("check")
        table.add_column("passed")
        table.add_column("detail", overflow="fold")
        for c in checks:
            table.add_row(Text(c.name), Text("yes") if c.passed else Text("no", style="red"), Text(c.detail))
        tables.append(table)
    return tables


def lookup(name: str) -> Entry:
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
            Text(plain_math(e.forward_math)),
            Text(plain_math(derivative_math(e))),
            Text(e.reference),
        )
    return table


def _print_entry(console: Console, entry: Entry) -> None:
    console.rule(Text(f"{entry.name}  ({entry.family})"))
    summary = plain_roles(first_paragraph(entry.fn))
    if summary:
        console.print(Text(summary))
    rows = [
        ("forward", plain_math(entry.forward_math)),
        ("  LaTeX", entry.forward_math),
        ("surrogate derivative", plain_math(derivative_math(entry))),
        ("  LaTeX", entry.derivative_math),
        ("kinks and ties", entry.kinks),
        ("integral of the surrogate", entry.integral),
        ("input", input_text(entry)),
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
            default = default_text(entry, p) or f"required (e.g. {p.values[0]!r})"
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
