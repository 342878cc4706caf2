"""The estimators suite: each catalog estimator against its hand-written stop_gradient form and the fused limit.

For every catalog estimator, jitted, on a float32 input of about ``size`` values
(rows of the entry's ``example_shape``, or of code dimension 4 for a rank-1 entry
without one) and a fixed random float32 cotangent ``w``:

* ``ours``: ``jax.value_and_grad`` of ``jnp.sum(fn(x, *args, **params) * w)`` with
  respect to every differentiable argument (``entry.diff_argnums``: the input and
  any trainable step, offset or clip), and so for every variant below;
* ``stop_gradient``: the same loss written with ``jax.lax.stop_gradient``, in the
  simplest form that gives the same gradient: ``x + sg(f(x) - x)`` when the
  declared derivative is 1 everywhere, ``clip(x, -c, c) + sg(f(x) - clip(x, -c, c))``
  when it is ``1[|x| <= c]``, and otherwise ``sg(f(x)) + (x - sg(x)) * sg(d(x))``
  from the entry's forward and derivative; each differentiable argument ``a``
  after the input adds ``(a - sg(a)) * sg(d_a(x))``. The form is detected from the declared
  derivative on the benchmark input, on 4x that input and on it scaled past the
  entry's outermost kink. An entry with a tangent map ``T`` (a non-diagonal
  Jacobian) uses ``sg(f(x)) + T(x - sg(x))``, ``T`` evaluated at ``sg(x)``;
* ``fused``: no autodiff, one jitted function returning
  ``(sum(forward(x) * w), derivative(x) * w)`` (a parameter's partials summed to
  its shape), the least work that gives the same value and gradient. Entries with
  a tangent map have no such form.

Before any time is taken the variants' gradients are compared with ours, within
:func:`grad_tolerance` (0 for elementwise derivatives); a variant beyond it marks
the estimator ``failed`` and no target counts as met.

The project's targets: ours <= 0.90 x stop_gradient and ours <= 1.10 x fused
(medians of the per-round ratios).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from stejax.bench._measure import CompileCounter, group_record, measure_rounds
from stejax.estimators.catalog import CATALOG

__all__ = [
    "TANGENT_GRAD_RTOL",
    "TARGET_VS_FUSED",
    "TARGET_VS_STOP_GRADIENT",
    "VARIANTS",
    "estimator_calls",
    "estimator_group",
    "estimators_suite",
    "grad_tolerance",
]

TARGET_VS_STOP_GRADIENT = 0.90
TARGET_VS_FUSED = 1.10
# Relative tolerance on the gradients of entries with a tangent map (see grad_tolerance).
TANGENT_GRAD_RTOL = 1e-6
VARIANTS = ("ours", "stop_gradient", "fused")


def estimators_suite(
    *, repeats: int, warmup: int, size: int, names: Sequence[str] | None = None, rounds: int = 1
) -> dict[str, Any]:
    """Time every catalog estimator (or ``names``) against its stop_gradient form and the fused limit.

    Every estimator's gradients are checked first (:func:`estimator_calls`); then the whole catalog is timed
    in ``rounds`` interleaved rounds (:func:`stejax.bench.measure_rounds`): each round times every estimator in
    turn, ``repeats`` passes over its variants, so each round gives every ratio one sample (the ``rounds`` of
    each ratio record).

    Returns:
      ``{"notes", "config", "targets", "groups", "skipped"}``: one group per estimator with
      the variants ``ours``, ``stop_gradient`` and (where one exists) ``fused``, the
      ratios ``ours/stop_gradient`` and ``ours/fused``, and in ``info`` the
      stop_gradient form, the input shape, the largest gradient differences,
      ``status`` (``"failed"`` when a variant's gradient differs from ours beyond
      the tolerance, with ``failure`` saying where) and whether the targets are
      met; ``notes`` names every failed estimator.

    Raises:
      ValueError: an unknown estimator name.
    """
    names = list(CATALOG) if names is None else list(names)
    unknown = [n for n in names if n not in CATALOG]
    if unknown:
        raise ValueError(f"estimators: no estimator named {unknown[0]!r}; known: {', '.join(CATALOG)}.")
    prepared, skipped = [], []
    for name in names:
        entry = CATALOG[name]
        reason = skip_reason(entry)
        if reason:
            skipped.append({"name": name, "reason": reason})
            continue
        prepared.append(estimator_calls(entry, size=size))
    measured = (
        measure_rounds({p["name"]: p["calls"] for p in prepared}, rounds=rounds, repeats=repeats, warmup=warmup)
        if prepared
        else {}
    )
    groups = [estimator_group(p, measured[p["name"]]) for p in prepared]
    failed = [g for g in groups if g["info"]["status"] == "failed"]
    return {
        "notes": [
            f"FAILED {g['name']}: gradients disagree, its times compare nothing: {g['info']['failure']}."
            for g in failed
        ],
        "config": {"size": size, "dtype": "float32", "rounds": rounds, "repeats": repeats, "warmup": warmup},
        "targets": {"ours/stop_gradient": TARGET_VS_STOP_GRADIENT, "ours/fused": TARGET_VS_FUSED},
        "groups": groups,
        "skipped": skipped,
    }


def skip_reason(entry) -> str:
    """Why an entry cannot be benchmarked here ("" when it can)."""
    if 0 not in entry.diff_argnums:
        return "its first argument carries no gradient"
    return ""


def input_shape(entry, params: dict[str, Any], size: int) -> tuple[int, ...]:
    """About ``size`` values in a valid shape: a leading batch axis before the row shape."""
    if entry.example_shape is not None:
        base = tuple(int(n) for n in entry.example_shape(**params))
        tail = base[1:] if len(base) > entry.input_rank else base
    else:
        tail = (4,) * entry.input_rank
    return (max(1, size // math.prod(tail)), *tail)


def estimator_calls(entry, *, size: int) -> dict[str, Any]:
    """One estimator's variants, compiled and their gradients checked, ready to time.

    Every variant computes the value and the gradient with respect to all the
    entry's differentiable arguments (``entry.diff_argnums``: the input and any
    trainable step, offset or clip). Their gradients are compared with ours
    before any time is taken: beyond :func:`grad_tolerance` the group's
    ``info["status"]`` is ``"failed"``, its targets count as not met, and
    ``info["failure"]`` says which variant and argument differ and by how much.

    Returns:
      ``{"name", "calls", "ratios", "info", "first_compiles", "failures"}``: ``calls`` the zero-argument
      calls to time, ``ratios`` the ``(numerator, denominator)`` pairs, ``first_compiles`` each variant's
      compilations (count, seconds) in its first call, made here.
    """
    params = entry.default_params()
    rng = np.random.default_rng(0)
    shape = input_shape(entry, params, size)
    x = jnp.asarray(rng.standard_normal(shape, np.float32))
    args = tuple(jnp.asarray(a) for a in entry.example_args(rng, shape, np.float32, params))
    key = jax.random.key(0)
    bind = dict(params)
    positions = (x, *args)
    names = ("x", *(a.name for a in entry.args))
    diff = tuple(positions[i] for i in entry.diff_argnums)
    fixed = tuple(a for i, a in enumerate(positions) if i not in entry.diff_argnums)

    def assemble(diff, fixed):
        """(x, args) from the differentiable and the fixed positional arguments."""
        d, f = iter(diff), iter(fixed)
        every = [next(d) if i in entry.diff_argnums else next(f) for i in range(len(positions))]
        return every[0], tuple(every[1:])

    def call(fn, x, args, key):
        return fn(x, *args, **bind, key=key) if entry.random else fn(x, *args, **bind)

    def partials(x, args, key):
        """The declared elementwise partials, one per differentiable argument, in the output's shape."""
        d = call(entry.derivative, x, args, key)
        d = d if isinstance(d, tuple) else (d,)
        return tuple(jnp.broadcast_to(jnp.asarray(p, x.dtype), x.shape) for p in d)

    def partial_x(x, args, key):
        return partials(x, args, key)[entry.diff_argnums.index(0)]

    out = jax.eval_shape(lambda x: call(entry.fn, x, args, key), x)
    if out.shape != x.shape:
        raise ValueError(f"{entry.name}: output shape {out.shape} differs from input shape {x.shape}")
    w = jnp.asarray(rng.standard_normal(shape, np.float32))

    if entry.derivative is not None:
        form, x_form = stop_gradient_form(entry, x, args, key, call, partial_x)
        others = [i for i in entry.diff_argnums if i != 0]

        def stop_gradient_forward(x, args, key):
            y = x_form(x, args, key)
            if others:
                d = jax.lax.stop_gradient(partials(x, args, key))
                for i in others:
                    a = args[i - 1]
                    moved = jnp.broadcast_to(a - jax.lax.stop_gradient(a), y.shape)
                    y = y + moved * d[entry.diff_argnums.index(i)]
            return y

        if others:
            form += " + " + " + ".join(f"({names[i]} - sg({names[i]})) * sg(d_{names[i]})" for i in others)
    else:
        form, stop_gradient_forward = tangent_form(entry, bind)

    def ours_loss(diff, w, fixed, key):
        x, args = assemble(diff, fixed)
        return jnp.sum(call(entry.fn, x, args, key) * w)

    def stop_gradient_loss(diff, w, fixed, key):
        x, args = assemble(diff, fixed)
        return jnp.sum(stop_gradient_forward(x, args, key) * w)

    def fused(diff, w, fixed, key):
        x, args = assemble(diff, fixed)
        y = call(entry.forward, x, args, key)
        grads = tuple(_sum_to(p * w, a.shape) for p, a in zip(partials(x, args, key), diff, strict=True))
        return jnp.sum(y * w), grads

    fns = {
        "ours": jax.jit(jax.value_and_grad(ours_loss)),
        "stop_gradient": jax.jit(jax.value_and_grad(stop_gradient_loss)),
    }
    if entry.derivative is not None:
        fns["fused"] = jax.jit(fused)
    inputs = (diff, w, fixed, key)
    # The gradients must agree before their times mean anything. These first calls
    # compile; their compilations count as warm-up.
    outputs, first_compiles = {}, {}
    for k, f in fns.items():
        with CompileCounter() as counter:
            outputs[k] = jax.block_until_ready(f(*inputs))
        first_compiles[k] = (counter.count, counter.seconds)
    grads_ours = [np.asarray(g, np.float64) for g in outputs["ours"][1]]
    tolerance = grad_tolerance(entry)
    max_grad_diff, failures = {}, []
    for k in fns:
        if k == "ours":
            continue
        worst = 0.0
        for i, g, g_ours in zip(entry.diff_argnums, outputs[k][1], grads_ours, strict=True):
            d = np.abs(np.asarray(g, np.float64) - g_ours)
            worst = max(worst, float(np.max(d, initial=0.0)))
            allowed = tolerance * np.maximum(1.0, np.abs(g_ours))
            if not np.all(d <= allowed):
                j = np.unravel_index(int(np.argmax(d - allowed)), d.shape) if d.ndim else ()
                failures.append(
                    f"{k}: the gradient with respect to {names[i]} differs from ours by {float(d[j]):.3g} at index "
                    f"{tuple(int(v) for v in j)} (ours {float(g_ours[j]):.6g}, {k} {float(np.asarray(g)[j]):.6g}); "
                    f"the tolerance is {tolerance:g} * max(1, |ours|)"
                )
        max_grad_diff[k] = worst

    calls = {k: (lambda f=f: f(*inputs)) for k, f in fns.items()}
    return {
        "name": entry.name,
        "calls": calls,
        "ratios": [("ours", other) for other in ("stop_gradient", "fused") if other in fns],
        "info": {
            "family": entry.family,
            "shape": list(shape),
            "form": form,
            "grad_wrt": [names[i] for i in entry.diff_argnums],
            "grad_tolerance": tolerance,
            "max_grad_diff": max_grad_diff,
            "max_abs_grad": max(float(np.max(np.abs(g), initial=0.0)) for g in grads_ours),
        },
        "first_compiles": first_compiles,
        "failures": failures,
    }


def estimator_group(prepared: dict[str, Any], measured: dict[str, Any]) -> dict[str, Any]:
    """The group record of one estimator from its :func:`estimator_calls` and its measured variants.

    The ratios' ``p50`` is the median of the per-sample ratios; ``rounds`` holds one ratio per round.
    """
    group = group_record(prepared["name"], measured, ratios=prepared["ratios"], info=prepared["info"])
    for k, (count, seconds) in prepared["first_compiles"].items():
        group["variants"][k]["compiles_warmup"] += count
        group["variants"][k]["compile_seconds"] += seconds
    vs_sg = group["ratios"]["ours/stop_gradient"]["p50"]
    vs_fused = group["ratios"].get("ours/fused", {}).get("p50")
    failures = prepared["failures"]
    agree = not failures
    group["info"]["status"] = "ok" if agree else "failed"
    group["info"]["failure"] = "; ".join(failures)
    # Times of variants that compute another gradient compare nothing: no target is met.
    group["info"]["meets_stop_gradient_target"] = agree and vs_sg <= TARGET_VS_STOP_GRADIENT
    group["info"]["meets_fused_target"] = None if vs_fused is None else agree and vs_fused <= TARGET_VS_FUSED
    return group


def grad_tolerance(entry) -> float:
    """How far a variant's gradient may be from ours, relative to max(1, |ours|).

    0 for entries with an elementwise derivative: every variant multiplies the
    same declared partials by the same cotangent. :data:`TANGENT_GRAD_RTOL` for
    entries with a tangent map, whose transposed linear map XLA may sum in
    another order.
    """
    return 0.0 if entry.derivative is not None else TANGENT_GRAD_RTOL


def _sum_to(g: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """``g`` summed over the axes that broadcasting ``shape`` to ``g.shape`` added or stretched."""
    lead = g.ndim - len(shape)
    g = jnp.sum(g, axis=tuple(range(lead))) if lead else g
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    return jnp.sum(g, axis=stretched, keepdims=True) if stretched else g


def stop_gradient_form(entry, x, args, key, call, partial_x):
    """The simplest stop_gradient form with the entry's derivative, and its name.

    The derivative is probed on x, 4x and x scaled past the entry's outermost
    kink, so that a clip outside the benchmark input's range is still seen.
    """
    sg = jax.lax.stop_gradient
    kinks = [abs(float(b)) for b in entry.boundaries(**entry.default_params()) if math.isfinite(float(b))]
    scales = (1.0, 4.0, max([4.0, *kinks]))
    inputs = [x * jnp.asarray(c, x.dtype) for c in scales]
    probes = [np.asarray(partial_x(p, args, key)) for p in inputs]
    magnitudes = [np.abs(np.asarray(p)) for p in inputs]

    if all(np.all(d == 1) for d in probes):

        def identity(x, args, key):
            return x + sg(call(entry.forward, x, args, key) - x)

        return "x + sg(f(x) - x)", identity

    if all(np.all((d == 0) | (d == 1)) for d in probes):
        for c in sorted({abs(float(b)) for b in entry.boundaries(**entry.default_params())} | {1.0}):
            if c > 0 and all(np.array_equal(d == 1, m <= c) for d, m in zip(probes, magnitudes, strict=True)):

                def hardtanh(x, args, key, c=c):
                    clipped = jnp.clip(x, -c, c)
                    return clipped + sg(call(entry.forward, x, args, key) - clipped)

                return f"clip(x, ±{c:g}) + sg(f(x) - clip(x, ±{c:g}))", hardtanh

    def general(x, args, key):
        return sg(call(entry.forward, x, args, key)) + (x - sg(x)) * sg(partial_x(x, args, key))

    return "sg(f(x)) + (x - sg(x)) * sg(d(x))", general


def tangent_form(entry, bind):
    """``sg(f(x)) + T(x - sg(x))``: the value f(x), the gradient T's transpose applied to w."""
    sg = jax.lax.stop_gradient

    def with_tangent_map(x, args, key):
        primals = tuple(sg(a) for a in (x, *args))
        tangents = tuple(a - sg(a) for a in (x, *args))
        tangents = tuple(tangents[i] for i in entry.diff_argnums)
        extra = {"key": key} if entry.random else {}
        t = entry.tangent(*primals, tangents=tangents, **bind, **extra)
        return sg(entry.forward(*primals, **bind, **extra)) + t

    return "sg(f(x)) + T(x - sg(x))", with_tangent_map
