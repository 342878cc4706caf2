"""The ``stejax`` command line: one thin module per command group.

Each module parses its options, calls library functions and prints; it imports
the library (and any optional extra) inside its command functions, so that
``stejax --help`` is fast and a missing extra gives a one-line hint:

============================  =====================================================
module                        commands
============================  =====================================================
:mod:`stejax.cli.catalog`     ``list``, ``show``, ``verify``
:mod:`stejax.cli.training`    ``train``, ``compare``, ``demo``
:mod:`stejax.cli.ptq`         ``ptq``
:mod:`stejax.cli.artifacts`   ``export``, ``artifact ...``, ``regress ...``
:mod:`stejax.cli.serve`       ``serve``
:mod:`stejax.cli.bench`       ``bench``, ``diagnose``
:mod:`stejax.cli.vq`          ``vq compare``
:mod:`stejax.cli.snn`         ``snn train``, ``snn compare``
:mod:`stejax.cli.lm`          ``lm train``, ``lm compare``, ``lm export``, ``lm sample``
============================  =====================================================

To add a command group: write ``stejax/cli/<group>.py`` defining a
``click.Group`` (or commands) with ``@click.group("<name>")``, then add it to
its task's section of ``_SECTIONS`` below (``stejax --help`` lists the commands
by these sections), one line. Old spellings of renamed options keep working for
one release through :func:`stejax.cli._common.deprecated_option`. Errors: a library refusal of a user's input
(a missing or malformed file, a bad value) becomes one line naming the file and
the problem and exit code 2 (see :data:`stejax.cli._common.INPUT_ERRORS`); a
missing optional dependency becomes the ``pip install 'stejax[extra]'`` line
and exit code 2. Neither prints a traceback.

Needs the optional extra ``stejax[cli]`` (click, rich, matplotlib); the
``stejax`` script itself is :func:`stejax.__main__.main`, which says so when it
is missing.
"""

from __future__ import annotations

import click

from stejax.cli import artifacts, bench, catalog, lm, ptq, serve, snn, training, vq
from stejax.cli._common import StejaxGroup

__all__ = ["main"]


@click.group(cls=StejaxGroup)
@click.version_option(package_name="stejax")
@click.option(
    "--compile-cache/--no-compile-cache",
    default=True,
    show_default=True,
    envvar="STEJAX_COMPILE_CACHE",
    help="Keep compiled XLA programs in JAX's persistent cache under the user's cache directory "
    "($XDG_CACHE_HOME/stejax/jax, else ~/.cache/stejax/jax; JAX_COMPILATION_CACHE_DIR wins), so that a repeated "
    "run compiles nothing. Also STEJAX_COMPILE_CACHE=0.",
)
def main(compile_cache: bool) -> None:
    """stejax: straight-through estimators and other surrogate gradients for JAX.

    Start with `stejax list` (the estimators) or `stejax demo` (quantisation-aware
    training end to end); `stejax COMMAND --help` tells more.
    """
    if compile_cache:
        from stejax._compile_cache import enable_compile_cache

        enable_compile_cache()


# The commands by task, in the order `stejax --help` lists them.
_SECTIONS: dict[str, tuple[click.Command, ...]] = {
    "Estimators": (catalog.list_command, catalog.show, catalog.verify_command),
    "Training": (training.train_command, training.compare_command, ptq.ptq_command),
    "Artifacts and serving": (
        artifacts.export_command,
        artifacts.artifact_group,
        artifacts.regress_group,
        serve.serve_command,
    ),
    "Measurement": (bench.bench_command, bench.diagnose_command),
    "Examples": (training.demo, lm.lm_group, snn.snn_group, vq.vq_group),
}
for _commands in _SECTIONS.values():
    for _command in _commands:
        main.add_command(_command)
assert isinstance(main, StejaxGroup)
main.sections = {title: tuple(str(c.name) for c in commands) for title, commands in _SECTIONS.items()}
