"""What the command modules share.

One definition per recurring option (``--out``, ``--seeds``, ``--workers``, ``--repeats``...), the old
spellings kept for one release (:func:`deprecated_option`), progress bars, the root group that lists the
commands by task and turns refusals into one-line CLI errors.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import click
from rich.console import Console
from rich.progress import Progress

from stejax._files import InputFileError

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

# ----------------------------------------------------------------------------- shared options
# One definition per recurring option, so that its name, type and wording agree in every command.


def directory(*, exists: bool = False) -> click.Path:
    """A directory path (``exists``: it must exist), given to the command as a ``Path``; shown as ``DIR``."""
    path = click.Path(exists=exists, file_okay=False, path_type=Path)
    path.name = "dir"  # click's own metavar for a directory is DIRECTORY; every command says DIR
    return path


def existing_file() -> click.Path:
    """A file that must exist, given to the command as a ``Path``."""
    return click.Path(exists=True, dir_okay=False, path_type=Path)


def artifact_dir_argument(*, exists: bool = False, required: bool = True, optional: bool = False) -> Callable[[F], F]:
    """The ``ARTIFACT`` argument, an artifact directory, passed as ``artifact_dir``.

    ``exists``: click checks it exists (otherwise the command says why not). ``required=False``: click
    does not insist, because an old spelling still can stand in (see :func:`deprecated_option`);
    ``optional``: an option can stand in for it (``serve --registry``), and usage shows ``[ARTIFACT]``.
    """
    metavar = "[ARTIFACT]" if optional else "ARTIFACT"
    return click.argument(
        "artifact_dir", metavar=metavar, required=required and not optional, type=directory(exists=exists)
    )


def run_dir_argument(*, required: bool = True, optional: bool = False) -> Callable[[F], F]:
    """The ``RUN`` argument, a run directory (``stejax train --out DIR``) that must exist, passed as ``run_dir``.

    ``required`` and ``optional`` as for :func:`artifact_dir_argument`.
    """
    metavar = "[RUN]" if optional else "RUN"
    return click.argument("run_dir", metavar=metavar, required=required and not optional, type=directory(exists=True))


def registry_option(*, required: bool = True, exists: bool = False, help: str | None = None) -> Callable[[F], F]:
    """``--registry DIR``, passed as ``registry_dir``."""
    return click.option(
        "--registry",
        "registry_dir",
        type=directory(exists=exists),
        required=required,
        default=None,
        metavar="DIR",
        help=help or "The registry: a directory of promoted artifacts and its event log (`artifact promote` makes it).",
    )


def out_dir_option(help: str, *, required: bool = True) -> Callable[[F], F]:
    """``--out DIR``: the folder a command writes."""
    return click.option("--out", type=directory(), metavar="DIR", required=required, default=None, help=help)


def epochs_option() -> Callable[[F], F]:
    """``--epochs N``, overriding a configuration's number of epochs."""
    return click.option("--epochs", type=click.IntRange(min=1), default=None, help="Override the number of epochs.")


def seeds_option(help: str, *, default: int | None = None) -> Callable[[F], F]:
    """``--seeds N``: seeds ``0..N-1``."""
    return click.option(
        "--seeds", type=click.IntRange(min=1), default=default, show_default=default is not None, help=help
    )


def workers_option(*, default: int = 1) -> Callable[[F], F]:
    """``--workers N``: processes of a comparison that train at once (its results do not depend on it)."""
    return click.option(
        "--workers",
        type=click.IntRange(min=1),
        default=default,
        show_default=True,
        help="Processes that train at once (about one core each; the results do not depend on it).",
    )


def repeats_option(help: str, *, default: int | None) -> Callable[[F], F]:
    """``--repeats N``: timed rounds."""
    return click.option(
        "--repeats", type=click.IntRange(min=1), default=default, show_default=default is not None, help=help
    )


def warmup_option(help: str, *, default: int | None) -> Callable[[F], F]:
    """``--warmup N``: untimed calls before the timed rounds, at least one (the first call compiles)."""
    return click.option(
        "--warmup", type=click.IntRange(min=1), default=default, show_default=default is not None, help=help
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


def progress_bar(console: Console, *, rate: bool = False) -> Progress:
    """A bar for a job of known length; ``rate=True`` adds the task's ``rate`` field and the time left."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    extra = (TextColumn("{task.fields[rate]}"), TimeRemainingColumn()) if rate else ()
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        *extra,
        console=console,
        transient=True,
        # No bar when the output is not a terminal (pipes, CI, tests).
        disable=not console.is_terminal,
    )


# ----------------------------------------------------------------------------- deprecated spellings
# A renamed option, an option that became a positional argument, or a positional argument that became an
# option keeps its old spelling for one release: hidden from --help, forwarded to the new parameter, with one
# line on stderr naming the new spelling. The hidden parameter is named "_deprecated_<old>" (tests find every
# old spelling by it).


def deprecated_option(old: str, dest: str, *, required: bool | None = None, **attrs: Any) -> Callable[[F], F]:
    """Keep the old spelling ``old`` of the parameter ``dest`` working for one release.

    Put it among the command's options, below ``@click.command``; ``attrs`` are the old option's
    ``click.option`` arguments (its ``type``, ``is_flag``...). When the user gives ``old``, its value
    goes to ``dest`` and stderr gets one line naming the new spelling; giving both is a usage error.
    A positional argument that used to be an option is declared ``required=False`` (with a ``metavar``)
    and the helper is given ``required=True``: with neither spelling, click's "Missing argument" error.

    Example::

        @click.command("diagnose")
        @click.argument("run_dir", required=False, metavar="RUN", type=directory(exists=True))
        @deprecated_option("--run", "run_dir", required=True, type=directory(exists=True))
        def diagnose_command(run_dir: Path) -> None: ...

    The other way round, an option that used to be a positional argument, is
    :func:`deprecated_argument`.
    """
    hidden_name = "_deprecated_" + old.lstrip("-").replace("-", "_")
    option = click.option(old, hidden_name, hidden=True, help=f"Deprecated: the old spelling of {dest}.", **attrs)
    return _forwarding(old, hidden_name, dest, required=required, declare=option)


def deprecated_argument(old: str, dest: str, *, required: bool | None = None, **attrs: Any) -> Callable[[F], F]:
    """Keep the positional argument ``old`` (its metavar, ``"OUT"``) working for one release as the option ``dest``.

    Put it where the argument was, among the command's arguments; ``attrs`` are the old argument's
    ``click.argument`` arguments (its ``type``). The argument is left out of the usage line. When the user
    gives it, its value goes to ``dest`` and stderr gets one line naming the option; giving both is a usage
    error. The new option is declared ``required=False`` and the helper is given ``required=True``: with
    neither spelling, click's "Missing option" error.

    Example::

        @click.command("export")
        @click.argument("run_dir", metavar="RUN", type=directory(exists=True))
        @deprecated_argument("OUT", "out", required=True, type=click.Path(path_type=Path))
        @click.option("--out", type=click.Path(path_type=Path), default=None, help="What to write.")
        def export_command(run_dir: Path, out: Path) -> None: ...
    """
    hidden_name = "_deprecated_" + old.lower()
    argument = click.argument(hidden_name, cls=_UnlistedArgument, metavar=old, required=False, **attrs)
    return _forwarding(old, hidden_name, dest, required=required, declare=argument)


class _UnlistedArgument(click.Argument):
    """A positional argument left out of the usage line (click cannot hide an argument): an old spelling."""

    def get_usage_pieces(self, ctx: click.Context) -> list[str]:
        return []


def _forwarding(
    old: str, hidden_name: str, dest: str, *, required: bool | None, declare: Callable[[Any], Any]
) -> Callable[[F], F]:
    """Declare the old spelling (``declare``) and forward its value to ``dest``, saying so on stderr."""

    def decorate(function: F) -> F:
        @functools.wraps(function)
        def forward(*args: Any, **kwargs: Any) -> Any:
            ctx = click.get_current_context()
            value = kwargs.pop(hidden_name)
            target = next(p for p in ctx.command.params if p.name == dest)
            new = _spelling(target, ctx)
            if ctx.get_parameter_source(hidden_name) in _GIVEN:
                if ctx.get_parameter_source(dest) in _GIVEN:
                    raise click.UsageError(f"{old} is the old spelling of {new}; give {new} only.", ctx=ctx)
                kwargs[dest] = value
                path = _command_path(ctx)
                if isinstance(target, click.Argument):
                    was, now = old, f"the argument {new} ({path} {new})"
                elif old.startswith("-"):
                    was, now = old, new
                else:
                    was, now = f"{old} as an argument", f"{new} {old}"
                click.echo(
                    f"Deprecated: {path} {was} is now {now}; the old spelling stops working in the next release.",
                    err=True,
                )
            if required and kwargs.get(dest) is None:
                raise click.MissingParameter(ctx=ctx, param=target)
            return function(*args, **kwargs)

        return cast(F, declare(forward))

    return decorate


_GIVEN = (click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT)


def _spelling(param: click.Parameter, ctx: click.Context) -> str:
    """How the user writes ``param``: its longest flag (``--repeats``) or an argument's metavar (``RUN``)."""
    if isinstance(param, click.Argument):
        return param.make_metavar(ctx).strip("[]")
    return max(param.opts, key=len)


def _command_path(ctx: click.Context) -> str:
    """``stejax lm sample``, whatever the program was called (``python -m stejax``, a test runner)."""
    names = []
    while ctx.parent is not None:
        names.append(ctx.info_name or "")
        ctx = ctx.parent
    return " ".join(["stejax", *reversed(names)])


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
    """The root group: a missing optional extra or a refused input becomes one line and exit code 2.

    ``--help`` lists the commands by task, in the sections of :attr:`sections` (title: command names,
    in order); a command in no section is listed under "Other commands".
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sections: dict[str, tuple[str, ...]] = {}

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        commands = {name: self.get_command(ctx, name) for name in self.list_commands(ctx)}
        shown = {name: c for name, c in commands.items() if c is not None and not c.hidden}
        if not shown:
            return
        placed = {name for names in self.sections.values() for name in names}
        sections = [*self.sections.items(), ("Other commands", tuple(n for n in shown if n not in placed))]
        limit = max(formatter.width - 6 - max(len(name) for name in shown), 40)
        for title, names in sections:
            rows = [(name, shown[name].get_short_help_str(limit)) for name in names if name in shown]
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)

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
