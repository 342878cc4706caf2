"""Name the operation that made the first NaN or infinity of a failing stage.

Two looks at the same computation:

* the operation that first turned finite inputs into a NaN or an infinity,
  found by evaluating the computation's jaxpr equation by equation (into the
  sub-jaxprs of ``jit`` calls and custom rules); this sees an infinity too
  (``log(0)``), and ignores infinities that enter as constants (the ``-inf``
  that starts a max reduction);
* the operation at which ``jax.debug_nans`` stops, as JAX itself reports the
  first NaN (under ``jit`` JAX re-runs the function op by op to find it).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.extend import core as jex

__all__ = ["nan_origin"]

_MESSAGE = re.compile(r"invalid value \((nan|inf)\) encountered in (\S+?)[.\s]")
_SKIP_DIRS = (str(Path(jax.__file__).parent) + os.sep, str(Path(__file__).parent) + os.sep)


def nan_origin(run: Callable[[], Any]) -> str | None:
    """Where the first NaN or infinity of ``run()`` comes from, in a sentence; None if it makes none.

    Example: ``"the first inf comes from log at model.py:12 (in loss), on finite
    inputs; under jax.debug_nans: no NaN"``.
    """
    producer = _first_producer(run)
    trapped = _debug_nans(run)
    parts = []
    if producer is not None:
        kind, where = producer
        parts.append(f"the first {kind} comes from {where}, on finite inputs")
    if trapped is not None and producer is not None and producer == ("NaN", trapped):
        parts[-1] += " (jax.debug_nans stops there too)"
    elif trapped is not None and producer is None:
        op, _, where = trapped.partition(" at ")
        parts.append(
            "no operation turned finite inputs into it: the NaN enters as a constant or an input"
            + (f" at {where}" if where else "")
            + f" (jax.debug_nans stops at {op})"
        )
    elif trapped is not None:
        parts.append(f"jax.debug_nans stops at {trapped}")
    elif producer is not None and producer[0] == "inf":
        parts.append("jax.debug_nans finds no NaN (the value is an infinity)")
    return "; ".join(parts) or None


# ----------------------------------------------------------------------------- jax.debug_nans


def _debug_nans(run: Callable[[], Any]) -> str | None:
    with contextlib.redirect_stdout(io.StringIO()), jax.debug_nans(True):
        try:
            jax.block_until_ready(run())
        except FloatingPointError as error:
            match = _MESSAGE.search(str(error) + " ")
            op = match.group(2) if match else "an operation"
            frames = [(f.filename, f.lineno, f.name) for f in traceback.extract_tb(error.__traceback__)]
            where = _user_frame(frames[::-1])
            return op + (f" at {where}" if where else "")
        except Exception:  # an error other than a NaN is the stage's own finding
            return None
    return None


# ----------------------------------------------------------------------------- the jaxpr walk


def _first_producer(run: Callable[[], Any]) -> tuple[str, str] | None:
    try:
        closed = jax.make_jaxpr(run)()
        return _walk(closed.jaxpr, closed.consts, [])
    except Exception:  # a primitive this walk cannot replay: debug_nans still answers
        return None


def _walk(jaxpr: Any, consts: list[Any], args: list[Any]) -> tuple[str, str] | None:
    env: dict[Any, Any] = {}

    def read(v: Any) -> Any:
        return v.val if isinstance(v, jex.Literal) else env[v]

    for v, c in zip(jaxpr.constvars, consts, strict=True):
        env[v] = c
    for v, a in zip(jaxpr.invars, args, strict=True):
        env[v] = a
    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        # jax < 0.9 returns (subfuns, params); later versions the params alone.
        bound = eqn.primitive.get_bind_params(eqn.params)
        subfuns, params = bound if isinstance(bound, tuple) else ((), bound)
        with eqn.ctx.manager:
            out = eqn.primitive.bind(*subfuns, *invals, **params)
        outs = list(out) if eqn.primitive.multiple_results else [out]
        made = [_kind(o) for o in outs]
        if any(made) and not any(_kind(i) for i in invals):
            for sub_jaxpr, sub_consts in _subjaxprs(eqn, len(invals)):
                inner = _walk(sub_jaxpr, sub_consts, invals)
                if inner is not None:
                    return inner
            kind = "NaN" if "NaN" in made else "inf"
            frames = [(f.file_name, f.line_num, f.function_name) for f in eqn.source_info.traceback.frames]
            where = _user_frame(frames)
            return kind, eqn.primitive.name + (f" at {where}" if where else "")
        for v, o in zip(eqn.outvars, outs, strict=True):
            if not isinstance(v, jex.DropVar):
                env[v] = o
    return None


def _subjaxprs(eqn: Any, n_args: int) -> list[tuple[Any, list[Any]]]:
    """The sub-jaxprs of a call-like equation that take exactly its operands (jit, custom rules)."""
    found = []
    for name in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        sub = eqn.params.get(name)
        if isinstance(sub, jex.ClosedJaxpr):
            jaxpr, consts = sub.jaxpr, list(sub.consts)
        elif isinstance(sub, jex.Jaxpr) and not sub.constvars:
            jaxpr, consts = sub, []
        else:
            continue
        if len(jaxpr.invars) == n_args:
            found.append((jaxpr, consts))
    return found


def _kind(value: Any) -> str | None:
    dtype = getattr(value, "dtype", None)
    if dtype is None or not jax.numpy.issubdtype(dtype, jax.numpy.inexact):
        return None
    a = np.asarray(value).astype(
        np.complex128 if jax.numpy.issubdtype(dtype, jax.numpy.complexfloating) else np.float64
    )
    if np.isnan(a).any():
        return "NaN"
    if np.isinf(a).any():
        return "inf"
    return None


def _user_frame(frames: Sequence[tuple[str, int | None, str]]) -> str | None:
    """The innermost frame (``frames`` run innermost first) outside JAX and this package: the user's line.

    A frame's line number is None where the traceback does not know it (it then shows as ``None``).
    """
    outside = [f for f in frames if not f[0].startswith(_SKIP_DIRS) and "jaxlib" not in f[0]]
    if not outside:
        return None
    path, line, name = outside[0]
    rel = os.path.relpath(path) if os.path.isabs(path) else path
    shown = path if rel.startswith("..") else rel
    return f"{shown}:{line} (in {name.rsplit('.', 1)[-1]})"
