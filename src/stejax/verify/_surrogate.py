"""``check_surrogate``: the contract checks for any function with a declared surrogate."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from stejax.verify._checks import (
    DtypeRun,
    Subject,
    declared_partials,
    invalid_checks,
    kinds_for,
    run_checks,
)
from stejax.verify._inputs import finfo, generated_layout, is_floating_dtype, user_layout
from stejax.verify._report import Check, Report, environment
from stejax.verify._tolerance import Tolerance

__all__ = ["check_surrogate"]

Invalid = tuple[Any, type[BaseException]]


def check_surrogate(
    fn: Callable[..., Any],
    *,
    reference: Callable[..., Any],
    derivative: Callable[..., Any] | None = None,
    tangent_map: Callable[..., Any] | None = None,
    args: Sequence[Any] | None = None,
    boundaries: Iterable[float] = (),
    dtypes: Iterable[Any] | None = None,
    invalid: Iterable[Invalid] = (),
    diff_argnums: Sequence[int] | None = None,
    composition_dtypes: str | Iterable[Any] = "all",
    seed: int = 0,
    key: Any = None,
    params: Mapping[str, Any] | None = None,
    name: str | None = None,
) -> Report:
    r"""Check that ``fn`` computes ``reference`` exactly and differentiates as ``derivative`` declares.

    The checks, each reported per dtype as ``"<check>[<dtype>]"``:

    1. ``forward_bitwise``: ``fn`` equals ``reference`` bit for bit (signed
       zeros, infinities and NaN positions included), eagerly and under jit, on
       generated inputs: the special values, tiny to largest finite
       magnitudes, ordinary values and the float below, at and above every
       boundary.
    2. ``jvp_primal``: the primal ``jax.jvp`` returns equals ``fn(*args)``.
    3. ``tangent``: the tangent equals ``derivative * tangent`` for random
       tangents on each differentiable argument, and is finite wherever the
       declared derivative is (points where the declared derivative is not
       finite are skipped, and the detail says how many).
    4. ``linearity``: ``jvp(a t1 + b t2) = a jvp(t1) + b jvp(t2)``.
    5. ``tangent_structure``: the tangent has the primal's shape, dtype and
       pytree structure, each cotangent its argument's.
    6. ``adjoint``: :math:`\langle \mathrm{jvp}(t), c\rangle = \langle t,
       \mathrm{vjp}(c)\rangle`; ``grad``: the gradient of ``sum(fn)`` is the
       declared derivative.
    7. ``jit``, ``vmap`` (against a Python loop, and vmap of the JVP),
       ``grad_of_vmap``, ``vmap_of_grad``, ``jacfwd_jacrev``, ``scan`` and
       ``checkpoint``: under each, the value equals the reference under the
       same transformation, bit for bit, and the JVP and VJP equal the
       declaration under that transformation.
    8. ``invalid[i]``: ``fn(*arguments)`` raises the given exception.

    The tolerances are in the module docstring of :mod:`stejax.verify` and in
    ``report.environment["tolerances"]``. A check that fails or crashes is a
    failed check with a readable detail: ``check_surrogate`` does not raise
    because ``fn`` misbehaves. It raises only for invalid arguments of its own.

    Args:
      fn: the estimator under test, usually a ``jax.custom_jvp`` function.
      reference: the exact forward function with ``fn``'s signature, computed
        independently of ``fn`` (``lambda x: jnp.round(x)``).
      derivative: the declared surrogate with ``fn``'s signature: the
        elementwise partial derivative of the output with respect to each
        differentiable positional argument (an array for one, a tuple for
        several), broadcastable to the output's shape.
      tangent_map: instead of ``derivative``, for a surrogate whose Jacobian is
        not diagonal: ``tangent_map(args, tangents) -> output tangent``, linear
        in ``tangents`` (one per differentiable argument). Tangents are then
        compared within the tangent-map tolerance.
      args: example positional arguments. ``None`` (the default) when ``fn``
        takes one array: the inputs are generated. Otherwise the first
        argument's leading axis is filled with generated values (its trailing
        axes kept) and the other arguments keep their values in every dtype
        (cast to it when floating; tiled with the rows when their leading axis
        matches the first argument's).
      boundaries: the kinks and ties of the first argument (``k + 0.5`` for
        round; -1, 0 and 1 for a clipped sign).
      dtypes: the floating dtypes to try; default float16, bfloat16 and
        float32, and float64 when x64 is enabled.
      invalid: ``(arguments, exception type)`` pairs: ``fn(*arguments)`` must
        raise that exception.
      diff_argnums: the differentiable positional arguments; default
        ``fn.diff_argnums`` when ``fn`` has it (estimators made with
        :func:`stejax.surrogate` do), else as many leading arguments as
        ``derivative`` returns partials.
      composition_dtypes: the dtypes the compositions (check 7) run in:
        ``"all"`` (the default) for every dtype, ``"widest"`` for the widest
        one only, or dtypes. The compositions test how the rule behaves under
        transformations, which does not depend on the dtype, and cost most
        of the compilation.
      seed: seeds every generated input, tangent and cotangent.
      key: a PRNG key for a random ``fn`` (one made with
        ``stejax.surrogate(..., random=True)`` requires it). It is passed as
        ``key=`` to ``fn``, ``reference``, ``derivative`` and ``tangent_map``,
        the same key in every check, so that the draws agree.
      params: static keyword arguments (``{"bits": 4}``), passed to ``fn``,
        ``reference``, ``derivative`` and ``tangent_map`` alike.
      name: the report's subject; default the function's name (a lambda's
        ``<lambda>`` when it has no better one).

    Returns:
      A :class:`Report`: ``.ok``, ``.checks``, ``.environment``, ``.notes``
      and ``to_dict()``, ``to_json()``, ``to_markdown()``. When ``reference``
      is ``fn`` itself, the value checks compare ``fn`` with itself and prove
      nothing about its forward: the report says so in ``notes`` and its
      summary (the checks still run, and the derivative checks still count).

    Raises:
      TypeError: ``fn``, ``reference``, ``derivative`` or ``tangent_map`` is
        not callable, ``invalid`` is malformed, ``params`` is not a mapping of
        keywords, or a random ``fn`` without ``key``.
      ValueError: neither or both of ``derivative`` and ``tangent_map``; a
        dtype that is not floating, or float64 without x64; a boundary that is
        not finite.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from stejax.verify import check_surrogate
      >>> @jax.custom_jvp
      ... def ste_round(x):
      ...     return jnp.round(x)
      >>> @ste_round.defjvp
      ... def _(primals, tangents):
      ...     return ste_round(primals[0]), tangents[0]
      >>> report = check_surrogate(
      ...     ste_round, reference=jnp.round, derivative=jnp.ones_like,
      ...     boundaries=(-0.5, 0.5, 1.5), dtypes=("float32",))
      >>> report.ok
      True
    """
    _require_callable(fn=fn, reference=reference)
    if (derivative is None) == (tangent_map is None):
        raise ValueError(
            "check_surrogate: give exactly one of `derivative` (the elementwise partials) or "
            f"`tangent_map` (a linear map from tangents to the output tangent); got "
            f"derivative={derivative!r}, tangent_map={tangent_map!r}."
        )
    _require_callable(derivative=derivative, tangent_map=tangent_map)
    subject_title = _subject_title(fn, name)
    notes = _notes(fn, reference)
    diff_argnums = _declared_diff_argnums(fn, diff_argnums)
    fn, reference, derivative, tangent_map = _bind(fn, reference, derivative, tangent_map, key, params)
    dtypes = resolve_dtypes(dtypes)
    boundaries = _floats(boundaries)
    invalid = _invalid_pairs(invalid)
    if args is not None:
        args = tuple(args) if isinstance(args, tuple | list) else (args,)
        if not args:
            raise ValueError("check_surrogate: `args` must hold at least the first argument; got ().")
    diff = _diff_argnums(fn, derivative, args, diff_argnums)
    subject = make_subject(fn, reference, derivative, tangent_map, diff)
    layout = generated_layout() if args is None else user_layout(args)
    example = None if args is None else np.asarray(args[0])
    composed = resolve_composition_dtypes(composition_dtypes, dtypes)
    runs = [
        DtypeRun(subject, layout, d, boundaries, seed=seed, example=example, kinds=kinds_for(d, composed))
        for d in dtypes
    ]
    checks: list[Check] = run_checks(runs)
    checks += invalid_checks(fn, invalid)
    env = environment(
        dtypes,
        {d.name: Tolerance.of(d).to_dict() for d in dtypes},
        seed=seed,
        boundaries=list(boundaries),
        diff_argnums=list(diff),
        composition_dtypes=[d.name for d in composed],
        declaration="derivative" if derivative is not None else "tangent_map",
        params={k: repr(v) for k, v in (params or {}).items()},
        key=None if key is None else "given",
    )
    return Report(subject=subject_title, checks=tuple(checks), environment=env, notes=notes)


def make_subject(fn, reference, derivative, tangent_map, diff: tuple[int, ...]) -> Subject:
    partials = None if derivative is None else declared_partials(derivative, reference, len(diff))
    return Subject(fn=fn, reference=reference, partials=partials, tangent_map=tangent_map, diff_argnums=diff)


def resolve_dtypes(dtypes: Iterable[Any] | None) -> tuple[np.dtype, ...]:
    """The dtypes to check: the default set, or the given ones validated."""
    x64 = bool(jax.config.read("jax_enable_x64"))
    if dtypes is None:
        names = ["float16", "bfloat16", "float32"] + (["float64"] if x64 else [])
        return tuple(np.dtype(n) for n in names)
    if isinstance(dtypes, str):
        dtypes = (dtypes,)
    out = []
    for d in dtypes:
        try:
            dt = np.dtype(d)
        except TypeError:
            raise ValueError(f"check_surrogate: unknown dtype {d!r}.") from None
        if not is_floating_dtype(dt):
            raise ValueError(
                f"check_surrogate: dtypes must be floating (float16, bfloat16, float32, float64); got {dt.name}."
            )
        if dt == np.float64 and not x64:
            raise ValueError(
                "check_surrogate: float64 needs 64-bit JAX; enable it with "
                "jax.config.update('jax_enable_x64', True) or `with jax.enable_x64(True):`."
            )
        out.append(dt)
    if not out:
        raise ValueError("check_surrogate: `dtypes` is empty; give at least one floating dtype.")
    return tuple(dict.fromkeys(out))


def resolve_composition_dtypes(choice: str | Iterable[Any], dtypes: tuple[np.dtype, ...]) -> tuple[np.dtype, ...]:
    """``"all"``, ``"widest"`` (most bytes, then most significand bits) or a subset of ``dtypes``."""
    if isinstance(choice, str) and choice == "all":
        return dtypes
    if isinstance(choice, str) and choice == "widest":
        return (max(dtypes, key=lambda d: (d.itemsize, finfo(d).nmant)),)
    chosen = resolve_dtypes(choice)
    unknown = [d.name for d in chosen if d not in dtypes]
    if unknown:
        raise ValueError(
            f"check_surrogate: composition_dtypes must be 'all', 'widest' or among the dtypes checked "
            f"({', '.join(d.name for d in dtypes)}); got {', '.join(unknown)}."
        )
    return chosen


def subject_name(fn: Any) -> str:
    """The function's name: its qualified name, or its plain name where that says ``<locals>``."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    qualname = getattr(fn, "__qualname__", None)
    if qualname and "<locals>" not in qualname:
        return qualname
    return getattr(fn, "__name__", None) or qualname or type(fn).__name__


def _subject_title(fn: Any, name: str | None) -> str:
    if name is None:
        return subject_name(fn)
    if not isinstance(name, str) or not name.strip():
        raise TypeError(f"check_surrogate: `name` must be a non-empty string; got {name!r}.")
    return name


def _innermost(fn: Any) -> Any:
    """``fn`` without functools.partial and ``__wrapped__`` layers (jax.jit keeps the wrapped function there)."""
    seen = set()
    while id(fn) not in seen:
        seen.add(id(fn))
        if isinstance(fn, functools.partial):
            fn = fn.func
        elif getattr(fn, "__wrapped__", None) is not None:
            fn = fn.__wrapped__
    return fn


REFERENCE_IS_FN = (
    "the reference is the function under test itself, so forward_bitwise, jvp_primal and the value "
    "comparisons of the compositions compare it with itself and prove nothing about its forward; pass an "
    "independent reference (jnp.round, a NumPy formula, the estimator's `forward`)"
)


def _notes(fn: Any, reference: Any) -> tuple[str, ...]:
    return (REFERENCE_IS_FN,) if _innermost(reference) is _innermost(fn) else ()


def _declared_diff_argnums(fn: Any, diff_argnums: Sequence[int] | None) -> Sequence[int] | None:
    """``diff_argnums``, or the estimator's own (read before ``fn`` is wrapped by :func:`_bind`)."""
    if diff_argnums is None and getattr(fn, "diff_argnums", None) is not None:
        return tuple(fn.diff_argnums)
    return diff_argnums


def _bind(fn, reference, derivative, tangent_map, key, params):
    """The four functions with the static ``params`` and the ``key`` bound as keywords."""
    if params is None:
        params = {}
    if not isinstance(params, Mapping) or not all(isinstance(k, str) for k in params):
        raise TypeError(f"check_surrogate: `params` must be a mapping of keyword names to values; got {params!r}.")
    if "key" in params:
        raise TypeError("check_surrogate: pass the PRNG key as `key=`, not inside `params`.")
    if key is None and getattr(fn, "random", False):
        raise TypeError(
            f"check_surrogate: {subject_name(fn)} is random (made with random=True) and needs a PRNG key: pass "
            "key=jax.random.key(0); the same key is given to fn, reference and the declared rule."
        )
    bound = dict(params)
    if key is not None:
        bound["key"] = key
    if not bound:
        return fn, reference, derivative, tangent_map

    def with_bound(f):
        return None if f is None else functools.partial(f, **bound)

    return with_bound(fn), with_bound(reference), with_bound(derivative), with_bound(tangent_map)


def _require_callable(**named: Any) -> None:
    for name, value in named.items():
        if value is not None and not callable(value):
            raise TypeError(f"check_surrogate: `{name}` must be callable; got {type(value).__name__}.")


def _floats(values: Iterable[float]) -> tuple[float, ...]:
    try:
        floats = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        raise TypeError(f"check_surrogate: `boundaries` must be numbers; got {values!r}.") from None
    bad = [(i, v) for i, v in enumerate(floats) if not math.isfinite(v)]
    if bad:
        i, v = bad[0]
        raise ValueError(
            f"check_surrogate: `boundaries` must be finite numbers (the kinks and ties of the first argument); "
            f"got {v!r} at position {i}."
        )
    return floats


def _invalid_pairs(invalid: Iterable[Invalid]) -> tuple[Invalid, ...]:
    pairs = tuple(invalid)
    for pair in pairs:
        ok = (
            isinstance(pair, tuple | list)
            and len(pair) == 2
            and isinstance(pair[1], type)
            and issubclass(pair[1], BaseException)
        )
        if not ok:
            raise TypeError(
                "check_surrogate: each `invalid` entry must be (arguments, exception type), e.g. "
                f"((jnp.arange(3),), TypeError); got {pair!r}."
            )
    return pairs


def _diff_argnums(fn, derivative, args, diff_argnums) -> tuple[int, ...]:
    if diff_argnums is not None:
        diff = tuple(int(i) for i in diff_argnums)
    elif getattr(fn, "diff_argnums", None) is not None:
        diff = tuple(int(i) for i in fn.diff_argnums)
    elif args is None or len(args) == 1 or derivative is None:
        diff = (0,)
    else:
        # As many leading arguments as the declared derivative returns partials: its output's
        # structure, traced (nothing compiled), or from a call where it cannot be traced.
        try:
            d = jax.eval_shape(derivative, *args)
        except Exception:
            try:
                d = derivative(*args)
            except Exception:
                d = None
        diff = tuple(range(len(d))) if isinstance(d, tuple | list) else (0,)
    n_args = 1 if args is None else len(args)
    if not diff or len(set(diff)) != len(diff) or min(diff) < 0 or max(diff) >= n_args:
        raise ValueError(
            f"check_surrogate: diff_argnums must name distinct positional arguments among the "
            f"{n_args} given; got {diff}."
        )
    return diff
