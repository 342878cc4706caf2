"""The shape of the house: imports run one way, and a missing extra gives a hint, not a traceback."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import stejax
from stejax._extras import EXTRA_OF

SRC = Path(stejax.__file__).resolve().parent.parent


def _modules() -> dict[str, Path]:
    modules = {}
    for path in (SRC / "stejax").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module that ``import name`` (or ``from name import ...``) loads: the longest known prefix."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every stejax module ``module`` imports: at module level, inside functions and under TYPE_CHECKING."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    # A TYPE_CHECKING import is a dependency too (a circle there is one the types hide), except
    # where it only names a type of a module above this one: there is none in src/stejax.
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {_resolve(a.name, modules) for a in node.names if a.name.startswith("stejax")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package
                for _ in range(node.level - 1):
                    anchor = anchor.rpartition(".")[0]
                base = f"{anchor}.{base}" if base else anchor
            if base.startswith("stejax"):
                for a in node.names:
                    full = f"{base}.{a.name}"
                    found.add(full if full in modules else _resolve(base, modules))
    return found - {module, None}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_has_no_circle():
    modules = _modules()
    graph = {m: _imports(m, p, modules) for m, p in modules.items()}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_planted_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_the_import_reader_sees_function_level_and_relative_imports(tmp_path):
    package = tmp_path / "stejax" / "pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "one.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from stejax.pkg.three import T\n"
        "def f():\n    from . import two\n"
    )
    (package / "two.py").write_text("")
    (package / "three.py").write_text("")
    modules = {
        "stejax.pkg": package / "__init__.py",
        **{f"stejax.pkg.{n}": package / f"{n}.py" for n in ("one", "two", "three")},
    }
    assert _imports("stejax.pkg.one", package / "one.py", modules) == {"stejax.pkg.two", "stejax.pkg.three"}


# A stand-in for an uninstalled package: importing any of these names fails as if it were absent.
_BLOCK = """
import sys, importlib.abc
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition('.')[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Block())
"""


def _run_blocked(blocked: set[str], code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _BLOCK.format(blocked=blocked) + code], capture_output=True, text=True, timeout=120
    )


def test_the_script_without_the_cli_extra_says_which_extra_to_install():
    result = _run_blocked(
        {"click", "rich"}, "sys.argv = ['stejax', '--help']\nfrom stejax.__main__ import main\nmain()"
    )
    assert result.returncode == 2, result.stderr
    assert "stejax needs the extra 'cli': pip install 'stejax[cli]'" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(("command", "module"), [("serve", "starlette"), ("train", "optax")])
def test_a_command_without_its_extra_says_which_extra_to_install(tmp_path, command, module):
    args = {
        "serve": ["serve", str(tmp_path)],
        "train": ["train", "--preset", "w4a4", "--out", str(tmp_path / "run")],
    }[command]
    code = f"sys.argv = ['stejax', *{args!r}]\nfrom stejax.__main__ import main\nmain()"
    result = _run_blocked({module}, code)
    extra = EXTRA_OF[module]
    assert result.returncode == 2, result.stderr
    assert f"stejax {command} needs the extra {extra!r}: pip install 'stejax[{extra}]' (missing module: {module})" in (
        result.stderr
    )
    assert "Traceback" not in result.stderr


def test_the_core_package_imports_without_any_extra():
    result = _run_blocked(
        set(EXTRA_OF), "import stejax, stejax.verify, stejax.estimators; print(stejax.round_ste(1.5))"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "2.0"


def _package(module: str) -> str:
    """``stejax.lowbit.kernels._int8`` -> ``stejax.lowbit``; a top-level module is its own package."""
    return ".".join(module.split(".")[:2])


# The packages each package may import (beyond itself): the integer arithmetic of low-bit weights (stejax.lowbit)
# sits on the estimators and below everything that uses it (the language model, the exports, the NNX rules);
# the estimators import nothing of stejax's above them.
_MAY_IMPORT = {
    "stejax.estimators": set(),
    "stejax.lowbit": {"stejax.estimators"},
}


@pytest.mark.parametrize("package", sorted(_MAY_IMPORT))
def test_the_lower_packages_import_nothing_above_them(package):
    modules = _modules()
    found = {
        (m, d)
        for m, p in modules.items()
        if _package(m) == package
        for d in _imports(m, p, modules)
        if _package(d) not in _MAY_IMPORT[package] | {package}
    }
    assert found == set(), sorted(found)


def test_the_kernels_of_low_bit_products_live_in_one_package():
    modules = _modules()
    assert not [m for m in modules if m.startswith("stejax.lm._kernel")], "kernels belong in stejax.lowbit.kernels"
    packing = sorted(m for m in modules if m.rpartition(".")[2].lstrip("_") == "packing")
    assert packing == ["stejax.lowbit._packing"]
    users = {_package(m) for m, p in modules.items() if "stejax.lowbit._packing" in _imports(m, p, modules)}
    assert {"stejax.lm", "stejax.export", "stejax.lowbit"} <= users
