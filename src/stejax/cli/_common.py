"""What the command modules share: option decorators, progress bars and turning refusals into CLI errors."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.progress import Progress

from stejax._files import InputFileError

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

# ----------------------------------------------------------------------------- shared options
# One definition per recurring option, so that its name, type and wording agree in every command.


def directory(*, exists: bool = False) -> click.Path:
    """A directory path (``exists``: it must exist), given to the command as a ``Path``."""
    return click.Path(exists=exists, file_okay=False, path_type=Path)


def existing_file() -> click.Path:
    """A file that must exist, given to the command as a ``Path``."""
    return click.Path(exists=True, dir_okay=False, path_type=Path)


def artifact_dir_argument(*, exists: bool = False) -> Callable[[F], F]:
    """The ``ARTIFACT_DIR`` argument (``exists``: click checks it exists; otherwise the command says why not)."""
    return click.argument("artifact_dir", type=directory(exists=exists))


def run_dir_argument() -> Callable[[F], F]:
    """The ``RUN_DIR`` argument: a run directory (``stejax train --out DIR``) that must exist."""
    return click.argument("run_dir", type=directory(exists=True))


def registry_option(*, required: bool = True, exists: bool = False, help: str | None = None) -> Callable[[F], F]:
    """``--registry DIR``, passed as ``registry_dir``."""
    return click.option(
        "--registry", "registry_dir", type=directory(exists=exists), required=required, default=None, help=help
    )


def out_dir_option(help: str, *, required: bool = True) -> Callable[[F], F]:
    """``--out DIR``: the folder a command writes."""
    return click.option("--out", type=directory(), required=required, default=None, help=help)


def epochs_option() -> Callable[[F], F]:
    """``--epochs N``, overriding a configuration's number of epochs."""
    return click.option("--epochs", type=click.IntRange(min=1), default=None, help="Override the number of epochs.")


def seeds_option(help: str, *, default: int | None = None) -> Callable[[F], F]:
    """``--seeds N``: seeds ``0..N-1``."""
    return click.option(
        "--seeds", type=click.IntRange(min=1), default=default, show_default=default is not None, help=help
    )


def configuration_names(
    value: str | None, known: Sequence[str], *, option: str = "--configs"
) -> tuple[str, ...] | None:
    """A comma-separated list of configuration names, each one of ``known`` (None stays None).

    Raises:
      click.BadParameter: an unknown name, or no name at all, naming ``option`` and the known names.
    """
    if value is None:
        return None
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise click.BadParameter(
            f"unknown configuration(s) {unknown or value!r}; expected names from {', '.join(known)}.",
            param_hint=option,
        )
    return names


def guarded(run: Callable[[], T]) -> T:
    """Run a training job; its NaN guard and key checks become clean CLI errors."""
    from stejax.keys import KeyReuseError
    from stejax.train import NonFiniteError

    try:
        return run()
    except (NonFiniteError, KeyReuseError) as error:
        raise click.ClickException(f"{type(error).__name__}: {error}") from None


def epoch_line(record: Any, epochs: int) -> str:
    """One epoch of training in words: ``epoch 3/40 loss 0.4127 val 95.2%``."""
    return f"epoch {record['epoch']}/{epochs} loss {record['train_loss']:.4f} val {100 * record['val_accuracy']:.1f}%"


def progress_bar(console: Console) -> Progress:
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

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


class InputError(click.ClickException):
    """A user's input was refused: one line on stderr, exit code 2, no traceback."""

    exit_code = 2


# The library's refusals of a user's input that every command reports as one line (exit 2):
# missing, unreadable or malformed files. Errors of the library itself are not here: they keep
# their traceback, because they are bugs to report.
INPUT_ERRORS: tuple[type[BaseException], ...] = (
    FileNotFoundError,
    IsADirectoryError,
    NotADirectoryError,
    InputFileError,
)


class StejaxGroup(click.Group):
    """The root group: a missing optional extra or a refused input becomes one line and exit code 2."""

    def invoke(self, ctx: click.Context) -> Any:
        from stejax._extras import missing_extra_message

        try:
            return super().invoke(ctx)
        except ModuleNotFoundError as error:
            name = ctx.invoked_subcommand or "stejax"
            message = missing_extra_message(error, command=f"stejax {name}")
            if message is None:
                raise
            raise InputError(message) from None
        except INPUT_ERRORS as error:
            raise InputError(f"{type(error).__name__}: {error}") from None
