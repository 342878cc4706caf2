"""The public API is typed: every public function and public method has complete annotations.

``make lint`` runs mypy over ``src/stejax``; this test holds the public surface
to the stricter rule (every parameter and the return annotated), which mypy
would apply with ``disallow_untyped_defs`` to private helpers too.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest

import stejax

SRC = Path(stejax.__file__).resolve().parent
# Every public package: a folder of src/stejax whose name has no leading underscore.
PACKAGES = sorted(
    f"stejax.{p.name}"
    for p in SRC.iterdir()
    if p.is_dir() and (p / "__init__.py").exists() and not p.name.startswith("_") and p.name != "cli"
)
PUBLIC = ["stejax", *PACKAGES]


def _unannotated(fn) -> list[str]:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    missing = [
        name
        for name, p in signature.parameters.items()
        if p.annotation is inspect.Parameter.empty and name not in ("self", "cls")
    ]
    if signature.return_annotation is inspect.Signature.empty and fn.__name__ != "__init__":
        missing.append("return")
    return missing


def _public_names(module) -> list[str]:
    """``__all__`` where given, else the explicit re-exports: every name without a leading underscore."""
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n in vars(module) if not n.startswith("_") and not inspect.ismodule(getattr(module, n))]
    return sorted(names)


def _public_functions(module):
    for name in _public_names(module):
        value = getattr(module, name)
        if inspect.isclass(value):
            for attr, member in vars(value).items():
                if attr.startswith("_") and attr != "__init__":
                    continue
                member = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
                if inspect.isfunction(member) and member.__module__.startswith("stejax"):
                    yield f"{name}.{attr}", member
        elif inspect.isfunction(value) and value.__module__.startswith("stejax"):
            yield name, value


def test_py_typed_ships():
    assert (SRC / "py.typed").is_file()


@pytest.mark.parametrize("package", PUBLIC)
def test_public_functions_are_annotated(package):
    module = importlib.import_module(package)
    problems = [
        f"{name}: {', '.join(missing)}" for name, fn in _public_functions(module) if (missing := _unannotated(fn))
    ]
    assert not problems, f"{package}: unannotated parameters or returns:\n  " + "\n  ".join(problems)
