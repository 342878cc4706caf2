"""``stejax vq compare``: VQ variants against FSQ over a grid of codebook sizes and code dimensions."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console

from stejax.cli._common import (
    configuration_names,
    deprecated_option,
    directory,
    out_dir_option,
    seeds_option,
    workers_option,
)

__all__ = ["vq_group"]


def _int_list(value: str | None, option: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        values = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        values = ()
    if not values or any(v < 1 for v in values):
        raise click.BadParameter(f"expected positive integers separated by commas; got {value!r}.", param_hint=option)
    return values


@click.group("vq", short_help="Vector-quantised autoencoders: codebooks, FSQ, the rotation trick.")
def vq_group() -> None:
    """Vector-quantised autoencoders: codebooks, FSQ, the rotation trick."""


@vq_group.command("compare", short_help="Train every VQ variant and set-up, against FSQ, and judge.")
@out_dir_option("Folder for report.md, report.json and the two plots.")
@click.option(
    "--quick",
    is_flag=True,
    default=False,
    help="The speed run: K = 64, d = 8, 2 seeds, 200 steps, every set-up, no digits check.",
)
@seeds_option("Seeds 0..N-1 (default 3; 2 with --quick).")
@click.option("--steps", type=click.IntRange(min=1), default=None, help="Adam steps (default 1000; 200 with --quick).")
@click.option(
    "--codebook-sizes",
    default=None,
    metavar="K,...",
    help="Codebook sizes, powers of two (default 512,4096; 64 with --quick).",
)
@click.option("--code-dims", default=None, metavar="D,...", help="Code dimensions (default 32; 8 with --quick).")
@click.option(
    "--configs",
    default=None,
    metavar="NAME,...",
    help="Only these variants, comma-separated (default: all twelve).",
)
@deprecated_option("--variants", "configs")
@click.option(
    "--setups",
    default=None,
    metavar="NAME,...",
    help="Only these codebook set-ups, comma-separated (default: reference,gradient,wide-init).",
)
@click.option(
    "--digits/--no-digits",
    default=None,
    help="Also run the digits VQ-VAE under the reference set-up (default: yes; no with --quick).",
)
@click.option(
    "--digits-steps", type=click.IntRange(min=1), default=None, help="Adam steps of the digits VQ-VAE (default 800)."
)
@click.option(
    "--codebook-init-scale",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Replace every set-up's scale of the initial codes: the bound of uniform codes, "
    "the standard deviation of normal ones (default: the set-up's).",
)
@workers_option()
@click.option(
    "--results",
    type=directory(),
    default=None,
    help="Also write the results file vq_compare.json (vq_compare_quick.json with --quick) into this folder, "
    "and vq_digits.json with the digits check.",
)
@click.option(
    "--figures",
    type=directory(),
    default=None,
    help="Also copy the two plots into this folder (docs/img/vq for the documentation).",
)
def compare_command(
    out: Path,
    quick: bool,
    seeds: int | None,
    steps: int | None,
    codebook_sizes: str | None,
    code_dims: str | None,
    configs: str | None,
    setups: str | None,
    digits: bool | None,
    digits_steps: int | None,
    codebook_init_scale: float | None,
    workers: int,
    results: Path | None,
    figures: Path | None,
) -> None:
    """Train every VQ variant under every codebook set-up, against FSQ, and judge the targets.

    Set-ups: reference (EMA codes, decay 0.8, Kaiming-uniform initial codes,
    commitment weight 1), gradient (codes trained by the codebook loss from
    U(±1/K), taming-transformers' weights) and wide-init (N(0, 1) codes trained by
    the codebook loss). Variants: STE, rotation trick, EMA codes, k-means++
    initialisation (alone, with the rotation trick), dead-code replacement (alone,
    with EMA, with the rotation trick), l2-normalised codes, a low-dimensional
    lookup, FSQ with exactly K codes, and the negative control (no gradient to the
    encoder). One token per vector of an unlimited synthetic source; usage,
    perplexity / K, validation MSE and the collapse diagnostics before and after
    training; then a convolutional VQ-VAE on scikit-learn's digits. Writes
    OUT/report.json (one row per set-up, variant, K, d and seed), OUT/report.md,
    OUT/usage_vs_k.png and OUT/mse_vs_bits.png.
    """
    import dataclasses
    import time

    from stejax.vq import QUICK, SETUPS, VARIANTS, CompareSettings, compare, write_report

    t0 = time.perf_counter()
    started = {"date": _now(), "load_start": _load()}
    settings = QUICK if quick else CompareSettings()
    changes: dict[str, object] = {}
    if seeds is not None:
        changes["seeds"] = tuple(range(seeds))
    if steps is not None:
        changes["steps"] = steps
    if (sizes := _int_list(codebook_sizes, "--codebook-sizes")) is not None:
        changes["codebook_sizes"] = sizes
    if (dims := _int_list(code_dims, "--code-dims")) is not None:
        changes["code_dims"] = dims
    names = configuration_names(configs, [v.name for v in VARIANTS], option="--configs")
    if names is not None:
        changes["variants"] = names
    chosen = configuration_names(setups, [u.name for u in SETUPS], option="--setups")
    if chosen is not None:
        changes["setups"] = chosen
    if digits is not None:
        changes["digits"] = digits
    if digits_steps is not None:
        changes["digits_steps"] = digits_steps
    if codebook_init_scale is not None:
        changes["init_scale"] = codebook_init_scale
    try:
        settings = dataclasses.replace(settings, **changes)  # type: ignore[arg-type]
    except ValueError as error:
        raise click.UsageError(str(error)) from None
    console = Console()
    report = compare(settings, workers=workers, progress=lambda line: console.print(line, markup=False))
    report["wall_seconds"] = time.perf_counter() - t0  # the whole command in one process, compilations included
    paths = write_report(report, out, figures_dir=figures)
    for t in report["targets"]:
        console.print(f"{'MET' if t['passed'] else 'MISSED'} {t['name']}: {t['detail']}", markup=False)
    if results is not None:
        from stejax.vq._results import record

        ctx = click.get_current_context()
        root = ctx.find_root()
        cache = [] if root.params.get("compile_cache", True) else ["--no-compile-cache"]
        command = " ".join(["stejax", *cache, "vq compare", *_given_options(ctx)])
        name = "vq_compare_quick" if quick else "vq_compare"
        load = {"start": started["load_start"], "end": _load()}
        written = record(
            report, Path(results) / f"{name}.json", command=command, name=name, date=started["date"], load=load
        )
        console.print(f"wrote {written}", markup=False)
        if report.get("digits"):
            from stejax.vq._results import record_digits

            written = record_digits(
                report,
                Path(results) / f"{name.replace('compare', 'digits')}.json",
                command=command,
                name=name.replace("compare", "digits"),
                date=started["date"],
                load=load,
            )
            console.print(f"wrote {written}", markup=False)
    missed = sum(not t["passed"] for t in report["targets"])
    console.print(
        f"{len(report['rows'])} rows, {report['compiles']} compilations, "
        f"{report['wall_seconds']:.1f} s in one process; "
        f"wrote {paths['markdown']} and {paths['json']}" + (f"; {missed} target(s) missed" if missed else ""),
        markup=False,
    )


def _now() -> str:
    import datetime

    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _load() -> float | None:
    import os

    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None


def _given_options(ctx: click.Context) -> list[str]:
    """The options the user gave, spelled as on the command line (for the results file's command)."""
    parts = []
    for param in ctx.command.params:
        source = ctx.get_parameter_source(param.name) if param.name else None
        if param.name is None or source is None or source.name == "DEFAULT" or param.name.startswith("_deprecated"):
            continue
        flag = max(param.opts, key=len)
        value = ctx.params[param.name]
        parts.append(flag if getattr(param, "is_flag", False) else f"{flag} {value}")
    return parts
