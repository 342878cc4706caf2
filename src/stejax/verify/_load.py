"""``load_callable``: ``MODULE:FUNC`` strings to callables, for ``stejax verify MODULE:FUNC``."""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["load_callable"]


def load_callable(spec: str, *, path: str | os.PathLike[str] | None = None) -> Callable[..., Any]:
    """The callable named by ``"package.module:attribute"`` (the attribute may be dotted).

    Args:
      spec: ``MODULE:FUNC``, e.g. ``"mypkg.quant:ste_round"`` or
        ``"mypkg.quant:Quantizer.apply"``.
      path: a directory searched first for ``MODULE`` (the command line passes
        the working directory); ``sys.path`` is restored afterwards.

    Returns:
      The callable.

    Raises:
      ValueError: ``spec`` is not of the form ``MODULE:FUNC``.
      ImportError: the module cannot be imported (the message says which).
      AttributeError: the module has no such attribute.
      TypeError: the attribute is not callable.

    Example:
      >>> from stejax.verify import load_callable
      >>> load_callable("stejax:round_ste").__name__
      'round_ste'
    """
    module_name, sep, attribute = str(spec).partition(":")
    if not sep or not module_name or not attribute or ":" in attribute:
        raise ValueError(f"expected MODULE:FUNC, e.g. 'mypkg.quant:ste_round'; got {spec!r}.")
    with _search_first(path):
        try:
            obj: Any = importlib.import_module(module_name)
        except ImportError as e:
            raise ImportError(f"cannot import module {module_name!r} named in {spec!r}: {e}") from e
    for part in attribute.split("."):
        if not hasattr(obj, part):
            raise AttributeError(f"{spec!r}: {getattr(obj, '__name__', obj)!r} has no attribute {part!r}.")
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{spec!r} names a {type(obj).__name__}, not a callable.")
    return obj


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
