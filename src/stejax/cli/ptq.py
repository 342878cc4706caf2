"""``stejax ptq``: post-training quantisation of a trained float run, ready for ``stejax export``.

Needs the extra ``stejax[train]``.
"""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from stejax.cli._common import directory, run_dir_argument

__all__ = ["ptq_command"]

# stejax.ptq.PTQ_METHODS, without importing the library at start-up (a test keeps them equal).
_METHODS = ("rtn", "gptq", "awq", "smoothquant")


def _form(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """The form, checked before any work: ``w<b>a<c>``."""
    from stejax.ptq import form_config

    try:
        form_config(value)
    except ValueError as error:
        raise click.BadParameter(str(error).removeprefix("form_config: "), ctx=ctx, param=param) from None
    return value


@click.command("ptq", short_help="Quantise a float run without training: RTN, GPTQ, AWQ, SmoothQuant.")
@run_dir_argument()
@click.option(
    "--form",
    required=True,
    callback=_form,
    metavar="wBaC",
    help="What to quantise: B-bit weights (one step per output channel) and C-bit inputs in the hidden layers, "
    "the first and last layers at 8 bits; C=32 keeps the inputs in float. E.g. w8a8, w4a8, w4a4, w4a32, w2a8 "
    "(ternary weights).",
)
@click.option(
    "--method",
    type=click.Choice(_METHODS),
    default="gptq",
    show_default=True,
    help="rtn: round to nearest. gptq: each rounding error compensated on the calibration inputs. awq: "
    "activation-aware channel scales, then rtn. smoothquant: input outliers moved into the weights, then rtn "
    "(needs quantised inputs).",
)
@click.option(
    "--seed",
    type=click.IntRange(min=0),
    required=True,
    help="The seed of the calibration rows' draw from the training split.",
)
@click.option(
    "--calibration-rows",
    type=click.IntRange(min=1),
    default=512,
    show_default=True,
    help="How many training rows calibrate.",
)
@click.option(
    "--damp",
    type=click.FloatRange(min=0.0, min_open=True),
    default=0.01,
    show_default=True,
    help="GPTQ's dampening, a fraction of the mean diagonal of the Hessian.",
)
@click.option("--act-order", is_flag=True, help="GPTQ: round input features in decreasing Hessian diagonal.")
@click.option(
    "--out",
    type=directory(),
    metavar="DIR",
    required=True,
    help="The quantised run directory to write; it must not exist. `stejax export DIR` exports it.",
)
def ptq_command(
    run_dir: Path,
    form: str,
    method: str,
    seed: int,
    calibration_rows: int,
    damp: float,
    act_order: bool,
    out: Path,
) -> None:
    """Quantise the trained float run RUN to --form by --method and write the run directory --out DIR.

    Calibration rows are drawn from RUN's training split by --seed; the
    quantised model is evaluated on the validation and test splits. DIR is a
    run directory as `stejax train` writes it, plus ptq.json (the method, the
    calibration and the options), which `stejax export` records in the
    artifact's manifest.
    """
    from stejax.cli._common import InputError
    from stejax.ptq import quantize_run

    if out.exists() or out.is_symlink():
        raise InputError(f"--out {out} exists; a run directory is never overwritten. Nothing was quantised.")
    try:
        result = quantize_run(
            run_dir,
            out,
            form=form,
            method=method,
            seed=seed,
            calibration_rows=calibration_rows,
            damp=damp,
            act_order=act_order,
        )
    except ValueError as error:
        raise InputError(f"{run_dir}: {error}") from None
    console = Console()
    table = Table(title=f"{method} {form} of {run_dir}")
    for column in ("layer", "kind", "weight bits", "input bits", "calibration rows", "detail"):
        table.add_column(column, justify="left" if column in ("kind", "detail") else "right")
    for layer in result.record["layers"]:
        detail = ", ".join(f"{k} {v:.3g}" for k, v in layer.items() if k.endswith("alpha"))
        table.add_row(
            Text(str(layer["index"])),
            Text(layer["kind"]),
            Text(str(layer["weight_bits"])),
            Text("float" if layer["input_bits"] is None else str(layer["input_bits"])),
            Text(str(layer["calibration_rows"])),
            Text(detail),
        )
    console.print(table)
    # Plain lines, not wrapped at the console's width: a long path stays whole for a reader and for a script.
    click.echo(
        f"test accuracy {100 * result.test_accuracy:.2f}% (float {100 * result.float_test_accuracy:.2f}%), "
        f"validation {100 * result.val_accuracy:.2f}%; quantised in {result.record['seconds']:.2f} s"
    )
    click.echo(f"wrote {out}; `stejax export {out} --out ARTIFACT` exports it")
