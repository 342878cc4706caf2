"""The surrogate factory: the one place in stejax where ``jax.custom_jvp`` is used.

An estimator is built from two declared pieces:

* ``forward(*arrays, **params)``: the exact operation. The estimator returns its
  value bit for bit (the primal is never rewritten as ``x + stop_gradient(...)``).
* ``derivative(*arrays, **params)``: the declared surrogate partial derivative of
  the output with respect to each differentiable positional argument, elementwise
  (a diagonal Jacobian). One array for one differentiable argument, a tuple for
  several. A derivative for a scalar argument (a step size, say) is given per
  output element; the tangent rule broadcasts the argument's tangent against it.

  Some estimators have a surrogate Jacobian that is not diagonal (the
  straight-through Gumbel-softmax, the rotation trick). They declare instead
  ``tangent(arrays, tangents, **params)``, a map linear in ``tangents`` that
  returns the output tangent.

Positional arguments are arrays; those named by ``diff_argnums`` are
differentiable and the rest are treated as constants (their tangents are declared
zero). Keyword arguments are static hyperparameters (bits, slope, levels) and are
never traced. A random estimator takes its PRNG key as the required keyword
argument ``key``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

__all__ = ["surrogate"]

Derivative = Callable[..., Any]
Tangent = Callable[..., jax.Array]


def surrogate(
    forward: Callable[..., jax.Array],
    derivative: Derivative | None = None,
    *,
    tangent: Tangent | None = None,
    name: str | None = None,
    diff_argnums: Sequence[int] = (0,),
    random: bool = False,
) -> Callable[..., jax.Array]:
    """Build an estimator from its exact forward function and a declared surrogate.

    Args:
      forward: the exact operation, ``forward(*arrays, **params) -> Array``.
      derivative: the declared elementwise partial derivatives,
        ``derivative(*arrays, **params)``; one array per index in
        ``diff_argnums`` (a bare array when there is one). Each is broadcast
        against the output.
      tangent: instead of ``derivative``, a map ``tangent(arrays, tangents,
        **params) -> Array`` linear in ``tangents``, for surrogates whose
        Jacobian is not diagonal. ``tangents`` holds one tangent per index in
        ``diff_argnums``.
      name: the estimator's name, used in error messages.
      diff_argnums: the positional arguments that carry a surrogate gradient.
        Other positional arguments are constants for differentiation.
      random: whether the estimator needs a PRNG key. The key is then a
        required keyword argument ``key`` of the estimator and is passed on as
        ``key=`` to ``forward`` and to ``derivative`` or ``tangent``.

    Returns:
      ``estimator(*arrays, **params)``. Its value equals ``forward(*arrays,
      **params)`` exactly; its JVP is ``sum_i derivative_i * tangent_i``, cast
      to the output dtype and of the output shape. It composes with jit, vmap,
      grad, jvp, vjp, jacfwd, jacrev, hessian, scan and checkpoint.

    Example:
      >>> import jax, jax.numpy as jnp, stejax
      >>> ste_round = stejax.surrogate(jnp.round, lambda x: jnp.ones_like(x))
      >>> float(ste_round(1.7)), float(jax.grad(ste_round)(1.7))
      (2.0, 1.0)
    """
    default_name: str = getattr(forward, "__name__", "estimator")
    name = name or default_name
    for role, rule in (("forward", forward), ("derivative", derivative), ("tangent", tangent)):
        if (rule is not None or role == "forward") and not callable(rule):
            raise TypeError(f"surrogate ({name}): `{role}` must be a function; got {type(rule).__name__} {rule!r:.60}.")
    if (derivative is None) == (tangent is None):
        raise ValueError(
            "surrogate: give exactly one of `derivative` (elementwise partials) "
            f"or `tangent` (a linear tangent map); got derivative={derivative!r}, "
            f"tangent={tangent!r}."
        )
    diff_argnums = tuple(int(i) for i in diff_argnums)
    if not diff_argnums or len(set(diff_argnums)) != len(diff_argnums):
        raise ValueError(f"{name}: diff_argnums must name distinct positional arguments; got {diff_argnums}.")

    declared = {"forward": forward, "derivative": derivative, "tangent": tangent}
    rules = {role: rule for role, rule in declared.items() if rule is not None}

    def estimator(*args: ArrayLike, **params: Any) -> jax.Array:
        key = params.pop("key", None)
        if random and key is None:
            raise TypeError(
                f"{name}: this estimator is random and needs a PRNG key as the "
                "keyword argument `key` (for example key=jax.random.key(0))."
            )
        if not random and key is not None:
            raise TypeError(f"{name}: this estimator is deterministic and takes no `key`.")
        if len(args) <= max(diff_argnums):
            raise TypeError(
                f"{name}: expected at least {max(diff_argnums) + 1} positional array argument(s); got {len(args)}."
            )
        _check_params(name, params, len(args), rules)
        arrays = _as_floating_arrays(name, args, diff_argnums)
        fn = _custom_jvp_fn(name, forward, derivative, tangent, diff_argnums, random, params)
        return fn(key, *arrays) if random else fn(*arrays)

    estimator.__name__ = name
    estimator.__qualname__ = name
    estimator.forward = forward  # type: ignore[attr-defined]
    estimator.derivative = derivative  # type: ignore[attr-defined]
    estimator.tangent = tangent  # type: ignore[attr-defined]
    estimator.diff_argnums = diff_argnums  # type: ignore[attr-defined]
    estimator.random = random  # type: ignore[attr-defined]
    return estimator


def _custom_jvp_fn(name, forward, derivative, tangent, diff_argnums, random, params):
    """The custom_jvp function for one set of static ``params``."""

    def call(fn, args):
        # With a key, args[0] is the key; the estimator's arrays follow.
        if random:
            return fn(*args[1:], key=args[0], **params)
        return fn(*args, **params)

    offset = 1 if random else 0

    @jax.custom_jvp
    def fn(*args):
        return call(forward, args)

    @fn.defjvp
    def fn_jvp(primals, tangents):
        # The primal comes from `fn` itself, so higher-order derivatives also go
        # through the declared surrogate instead of the forward's true (zero)
        # derivative.
        y = fn(*primals)
        diff_tangents = tuple(tangents[offset + i] for i in diff_argnums)
        if derivative is not None:
            partials = call(derivative, primals)
            if not isinstance(partials, tuple):
                partials = (partials,)
            if len(partials) != len(diff_argnums):
                raise TypeError(
                    f"{name}: the declared derivative must return one partial per "
                    f"differentiable argument ({len(diff_argnums)}); got {len(partials)}."
                )
            for i, d, t in zip(diff_argnums, partials, diff_tangents, strict=True):
                _check_partial(name, i, d, t, y)
            pairs = zip(partials, diff_tangents, strict=True)
            terms = [jnp.asarray(d, y.dtype) * t.astype(y.dtype) for d, t in pairs]
            t_out = functools.reduce(jnp.add, terms)
        else:
            arrays = primals[offset:]
            t_out = (
                tangent(*arrays, tangents=diff_tangents, key=primals[0], **params)
                if random
                else tangent(*arrays, tangents=diff_tangents, **params)
            )
            t_out = jnp.asarray(t_out, y.dtype)
        return y, jnp.broadcast_to(t_out, y.shape)

    return fn


def _check_params(name: str, params: dict[str, Any], n_args: int, rules: dict[str, Callable[..., Any]]) -> None:
    """Keyword arguments are static hyperparameters that every declared rule accepts."""
    for keyword, value in params.items():
        if any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(value)):
            raise TypeError(
                f"{name}: keyword argument `{keyword}` is a static hyperparameter (a Python number, string or "
                f"tuple), never traced; got a traced array ({jax.typeof(jax.tree.leaves(value)[0])}), as under "
                "jit, grad or vmap. Pass an array that varies or is differentiated positionally, and name its "
                "position in diff_argnums to give it a surrogate gradient."
            )
    for role, rule in rules.items():
        try:
            accepted = _keywords(rule, n_args)
        except TypeError:  # an unhashable callable: read its signature without the cache
            accepted = _keywords.__wrapped__(rule, n_args)
        if accepted is None:
            continue
        accepted = accepted - {"key", "tangents"}
        unknown = sorted(set(params) - accepted)
        if unknown:
            raise TypeError(
                f"{name}: unknown keyword argument(s) {', '.join(map(repr, unknown))}: its {role} "
                f"{getattr(rule, '__name__', rule)!r} takes {', '.join(map(repr, sorted(accepted))) or 'none'}."
            )


@functools.lru_cache(maxsize=1024)
def _keywords(fn: Callable[..., Any], n_positional: int) -> frozenset[str] | None:
    """The names ``fn`` accepts as keywords after ``n_positional`` positional arguments (None: any)."""
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # no signature to read (a builtin): let the call say
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    names = set()
    for i, p in enumerate(parameters):
        if p.kind is inspect.Parameter.KEYWORD_ONLY:
            names.add(p.name)
        elif p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and i >= n_positional:
            names.add(p.name)
    return frozenset(names)


def _check_partial(name: str, i: int, d: Any, t: jax.Array, y: jax.Array) -> None:
    """A declared partial broadcasts, with its argument's tangent, to the output's shape."""
    shape = np.shape(d)
    try:
        ok = np.broadcast_shapes(shape, t.shape, y.shape) == y.shape
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(
            f"{name}: the declared derivative for positional argument {i} has shape {shape}; expected a shape "
            f"that broadcasts, with the argument's shape {t.shape}, to the output's shape {y.shape} (one partial "
            "per output element, or one that broadcasts to it)."
        )


def _as_floating_arrays(name: str, args: Sequence[Any], diff_argnums: tuple[int, ...]) -> list[jax.Array]:
    """Check the positional arguments and give them one floating dtype.

    The first argument must be a floating array (or a Python float). Other
    arrays must share its dtype; Python scalars (weakly typed) are cast to it.
    """
    arrays = [jnp.asarray(a) for a in args]
    strong = [a.dtype for a in arrays if not _is_weak(a)]
    for i, a in enumerate(arrays):
        is_scalar_literal = _is_weak(a) and i != 0
        if not jnp.issubdtype(a.dtype, jnp.floating) and not is_scalar_literal:
            role = "input" if i == 0 else f"positional argument {i}"
            raise TypeError(
                f"{name}: the {role} must be a floating-point array "
                f"(float16, bfloat16, float32 or float64); got dtype {a.dtype}. "
                "Cast it explicitly, e.g. x.astype(jnp.float32)."
            )
    dtype = strong[0] if strong else arrays[0].dtype
    for i, a in enumerate(arrays):
        if not _is_weak(a) and a.dtype != dtype:
            raise TypeError(
                f"{name}: positional arguments must share one floating dtype; "
                f"got {dtype} and, at position {i}, {a.dtype}. Cast explicitly."
            )
    return [a if (a.dtype == dtype) else a.astype(dtype) for a in arrays]


def _is_weak(a: jax.Array) -> bool:
    return bool(jax.typeof(a).weak_type)
