"""``load_callable``: ``MODULE:FUNC`` strings to callables, for ``stejax verify MODULE:FUNC``."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["load_callable"]


def load_callable(spec: str, *, path: str | os.PathLike[str] | None = None) -> Callable[..., Any]:
    """The callable named by ``"package.module:attribute"`` or ``"path/to/file.py:attribute"``.

    The attribute may be dotted. A ``MODULE`` that ends in ``.py`` or contains a
    path separator is a Python file, loaded from that path (relative to
    ``path`` when given, else to the working directory) as a module of its own
    name; its directory is searched first for the modules it imports.

    Args:
      spec: ``MODULE:FUNC``, e.g. ``"mypkg.quant:ste_round"``,
        ``"mypkg.quant:Quantizer.apply"`` or ``"./mymod.py:f"``.
      path: a directory searched first for ``MODULE`` (the command line passes
        the working directory); ``sys.path`` is restored afterwards.

    Returns:
      The callable.

    Raises:
      ValueError: ``spec`` is not of the form ``MODULE:FUNC``.
      FileNotFoundError: a file ``MODULE`` that does not exist (the message names it).
      ImportError: the module cannot be imported (the message says which).
      AttributeError: the module has no such attribute.
      TypeError: the attribute is not callable.

    Example:
      >>> from stejax.verify import load_callable
      >>> load_callable("stejax:round_ste").__name__
      'round_ste'
    """
    module_name, sep, attribute = str(spec).rpartition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"expected MODULE:FUNC, e.g. 'mypkg.quant:ste_round' or './mymod.py:ste_round'; got {spec!r}.")
    if _is_file(module_name):
        obj: Any = _load_file(Path(path or ".") / module_name, spec)
    else:
        with _search_first(path):
            try:
                obj = importlib.import_module(module_name)
            except ImportError as e:
                raise ImportError(f"cannot import module {module_name!r} named in {spec!r}: {e}") from e
    for part in attribute.split("."):
        if not hasattr(obj, part):
            raise AttributeError(f"{spec!r}: {getattr(obj, '__name__', obj)!r} has no attribute {part!r}.")
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{spec!r} names a {type(obj).__name__}, not a callable.")
    return obj


def _is_file(module_name: str) -> bool:
    return module_name.endswith(".py") or "/" in module_name or os.sep in module_name


def _load_file(file: Path, spec: str) -> Any:
    """The module of a Python file, executed once under its own name (its directory searched first)."""
    if not file.is_file():
        what = "is a directory, not a Python file" if file.is_dir() else "does not exist"
        raise FileNotFoundError(f"{file}: {what} (named in {spec!r}).")
    name = file.stem
    module_spec = importlib.util.spec_from_file_location(name, file)
    if module_spec is None or module_spec.loader is None:
        raise ImportError(f"{file}: not a Python module that can be loaded (named in {spec!r}).")
    module = importlib.util.module_from_spec(module_spec)
    with _search_first(file.parent.resolve()):
        try:
            module_spec.loader.exec_module(module)
        except FileNotFoundError as e:
            raise ImportError(f"{file}: running it raised {type(e).__name__}: {e}") from e
        except SyntaxError as e:
            raise ImportError(f"{file}: not valid Python: {e.msg} (line {e.lineno}).") from e
    return module


@contextlib.contextmanager
def _search_first(path: str | os.PathLike[str] | None) -> Iterator[None]:
    if path is None:
        yield
        return
    entry = os.fspath(path)
    sys.path.insert(0, entry)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(entry)
