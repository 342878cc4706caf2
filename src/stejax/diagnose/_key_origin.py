"""Find PRNG keys that a function makes for itself instead of taking them from its arguments.

A ``forward`` that ignores its ``key`` and calls ``jax.random.key(0)`` runs, never
reuses a key in one call and gives finite values; but it draws the same
randomness (the same dropout mask) at every step. In the jaxpr such a key is a
``random_seed`` or ``random_wrap`` equation whose operands depend on none of the
function's arguments, or a key closed over as a constant. Dependence is followed
through the sub-jaxprs of ``jit``, custom rules and control flow; where a
sub-jaxpr's operands cannot be matched to the equation's, all of its inputs
count as dependent (so the walk may miss a key there, but never blames a good one).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from jax.extend import core as jex

from stejax.diagnose._nans import _user_frame

__all__ = ["constant_keys"]

# The primitives that turn non-key values into a key.
_MAKERS = ("random_seed", "random_wrap")


def constant_keys(fn: Callable[..., Any], *args: Any) -> list[str]:
    """Each key that ``fn(*args)`` builds from constants, as ``"<operation> at <file:line> (in <function>)"``."""
    closed = jax.make_jaxpr(fn)(*args)
    found: list[str] = []
    jaxpr = closed.jaxpr
    for v in jaxpr.constvars:
        if _is_key(v):
            eqn = next((e for e in _all_eqns(jaxpr) if v in e.invars), None)
            if eqn is not None:
                found.append(f"a key closed over as a constant, used by {_where(eqn)}")
    _walk(jaxpr, [True] * len(jaxpr.invars), found)
    return found


def _walk(jaxpr: Any, dependent_in: list[bool], found: list[str]) -> None:
    dependent = {v for v, d in zip(jaxpr.invars, dependent_in, strict=True) if d}
    for eqn in jaxpr.eqns:
        deps = [not isinstance(v, jex.Literal) and v in dependent for v in eqn.invars]
        if eqn.primitive.name in _MAKERS and not any(deps):
            found.append(_where(eqn))
        for sub, sub_deps in _subjaxprs(eqn, deps):
            _walk(sub, sub_deps, found)
        if any(deps):
            dependent.update(v for v in eqn.outvars if not isinstance(v, jex.DropVar))


def _subjaxprs(eqn: Any, deps: list[bool]) -> list[tuple[Any, list[bool]]]:
    found = []
    for value in eqn.params.values():
        for sub in value if isinstance(value, (tuple, list)) else (value,):
            jaxpr = sub.jaxpr if isinstance(sub, jex.ClosedJaxpr) else sub
            if not isinstance(jaxpr, jex.Jaxpr):
                continue
            n = len(jaxpr.invars)
            if n == len(deps):
                found.append((jaxpr, deps))
            elif eqn.primitive.name == "cond" and n == len(deps) - 1:  # operand 0 is the branch index
                found.append((jaxpr, deps[1:]))
            else:
                found.append((jaxpr, [True] * n))
    return found


def _all_eqns(jaxpr: Any):
    for eqn in jaxpr.eqns:
        yield eqn
        for sub, _ in _subjaxprs(eqn, [True] * len(eqn.invars)):
            yield from _all_eqns(sub)


def _is_key(v: Any) -> bool:
    dtype = getattr(v.aval, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _where(eqn: Any) -> str:
    frames = [(f.file_name, f.line_num, f.function_name) for f in eqn.source_info.traceback.frames]
    place = _user_frame(frames)
    return eqn.primitive.name + (f" at {place}" if place else "")
