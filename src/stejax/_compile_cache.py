"""JAX's persistent compilation cache for the command line's runs, under the user's cache directory.

A run of ``stejax demo`` or ``stejax compare`` compiles the same training steps
every time; with the cache, a repeated run reads the compiled programs from disk
instead of compiling them again. The command line turns it on (``stejax
--no-compile-cache`` or ``STEJAX_COMPILE_CACHE=0`` turns it off); the library
never does on its own.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

__all__ = ["cache_dir", "enable_compile_cache", "persistent_cache_off"]

# Programs that compile faster than this are not worth a disk entry (JAX's default is 1 s,
# which leaves out most of the training steps here).
MIN_COMPILE_SECONDS = 0.1


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CACHE_HOME/stejax/jax``, or ``~/.cache/stejax/jax`` when ``XDG_CACHE_HOME`` is unset or empty.

    Example:
      >>> from stejax._compile_cache import cache_dir
      >>> str(cache_dir({"XDG_CACHE_HOME": "/var/cache/me"}))
      '/var/cache/me/stejax/jax'
    """
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "stejax" / "jax"


def enable_compile_cache() -> Path:
    """Point JAX's persistent compilation cache at :func:`cache_dir` (unless one is already set) and return it.

    A directory already chosen (``JAX_COMPILATION_CACHE_DIR``, or
    ``jax.config.update("jax_compilation_cache_dir", ...)``) is kept. The
    environment variables are set too, so that the worker processes a comparison
    spawns use the same cache.
    """
    import jax

    chosen = getattr(jax.config, "jax_compilation_cache_dir", None) or os.environ.get("JAX_COMPILATION_CACHE_DIR")
    directory = Path(chosen) if chosen else cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = str(directory)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = str(MIN_COMPILE_SECONDS)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
    return directory


@contextlib.contextmanager
def persistent_cache_off() -> Iterator[None]:
    """JAX's persistent compilation cache off inside the block, as it was after: every program compiles there.

    For measurements of compilation (a program read from the cache is not compiled) and for programs
    compiled once, whose cache entry only costs its writing: on a TPU, compressing a large executable
    for the cache can take longer than compiling it.
    """
    import jax
    from jax._src import compilation_cache

    before = jax.config.jax_enable_compilation_cache  # type: ignore[attr-defined]  # a flag with a context manager
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", before)
        compilation_cache.reset_cache()
