"""``stejax vq compare``: the vector-quantised digits autoencoders, side by side at 24 bits per image."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console

from stejax.cli._common import configuration_names, epochs_option, out_dir_option, seeds_option

__all__ = ["vq_group"]


@click.group("vq", short_help="Vector-quantised autoencoders: codebooks, FSQ, the rotation trick.")
def vq_group() -> None:
    """Vector-quantised autoencoders: codebooks, FSQ, the rotation trick."""


@vq_group.command("compare")
@out_dir_option("Folder for report.md, report.json and the pictures.")
@click.option("--quick", is_flag=True, default=False, help="The smoke-test tier: 2 seeds, 2 epochs.")
@seeds_option("Seeds 0..N-1 (default 3; 2 with --quick).")
@epochs_option()
@click.option(
    "--configs",
    default=None,
    metavar="NAME,...",
    help="Only these configurations, comma-separated, from vq_ste-plain, vq_ste-ema, vq_ste-kmeans_dead_code, "
    "rotation_trick-plain, rotation_trick-ema, rotation_trick-kmeans_dead_code, fsq, gumbel_softmax_st, no_gradient "
    "(default: all).",
)
@click.option(
    "--codebook-init-scale",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="The standard deviation of the initial codes (default 0.1).",
)
def compare_command(
    out: Path,
    quick: bool,
    seeds: int | None,
    epochs: int | None,
    configs: str | None,
    codebook_init_scale: float | None,
) -> None:
    """Train the digits autoencoders of every configuration and write the report.

    VQ with the straight-through estimator and with the rotation trick (each with
    a plain, an EMA, and a k-means-initialised EMA codebook with dead-code
    replacement), FSQ, straight-through Gumbel-softmax and a no-gradient control,
    all at 4 tokens x 64 codes = 24 bits per image. Prints the references (mean
    image, PCA with 8 components, k-means with 256 codes) beside the results and
    writes OUT/report.md, OUT/report.json and three pictures.
    """
    import dataclasses

    from stejax.vq import CONFIGURATIONS, QUICK, CompareSettings, compare, write_report

    settings = QUICK if quick else CompareSettings()
    if seeds is not None:
        settings = dataclasses.replace(settings, seeds=tuple(range(seeds)))
    if epochs is not None:
        settings = dataclasses.replace(settings, epochs=epochs)
    if codebook_init_scale is not None:
        settings = dataclasses.replace(settings, codebook_init_scale=codebook_init_scale)
    by_name = {c.name: c for c in CONFIGURATIONS}
    names = configuration_names(configs, list(by_name))
    chosen = CONFIGURATIONS if names is None else tuple(by_name[n] for n in names)
    console = Console()
    report = compare(settings, configurations=chosen, progress=console.print)
    paths = write_report(report, out)
    failed = [t for t in report["targets"] if not t["passed"]]
    for t in report["targets"]:
        console.print(f"{'PASS' if t['passed'] else 'FAIL'} {t['name']}: {t['detail']}", markup=False)
    console.print(
        f"wrote {paths['markdown']} and {paths['json']}" + (f"; {len(failed)} target(s) missed" if failed else "")
    )
