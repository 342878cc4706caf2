"""What the command modules share: progress bars and turning the library's refusals into CLI errors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.progress import Progress

from stejax._files import InputFileError

T = TypeVar("T")


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
