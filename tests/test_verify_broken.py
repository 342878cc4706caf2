"""Deliberately broken estimators, written as a user would, each caught by the check meant for it.

Every estimator here is a plain ``jax.custom_jvp`` function (or, for the
stop-gradient forms, no custom rule at all) with one bug. The test asserts
that the check meant to catch that class of bug fails with a readable detail,
and that the correct twin of the estimator passes that check.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from stejax.verify import check_surrogate
from stejax.verify._catalog import compile_workers

ROUND_TIES = (-2.5, -1.5, -0.5, 0.5, 1.5, 2.5)
CLIP_POINTS = (-1.0, 0.0, 1.0)
LSQ_LEVELS = 7.0  # clip to [-7, 7] steps, as a signed 4-bit LSQ


def ones(x):
    return jnp.ones_like(x)


def clip_mask(x):
    # The declaration: the derivative is 1 on the closed interval [-1, 1].
    return (jnp.abs(x) <= 1).astype(x.dtype)


# --- the estimators: one bug each ---------------------------------------------------------


@jax.custom_jvp
def scaled_tangent(x):
    return jnp.round(x)


@scaled_tangent.defjvp
def _scaled_tangent_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return scaled_tangent(x), 2 * t  # bug: the declaration says 1


@jax.custom_jvp
def affine_tangent(x):
    return jnp.round(x)


@affine_tangent.defjvp
def _affine_tangent_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return affine_tangent(x), t + 1  # bug: not linear in t


@jax.custom_jvp
def floor_in_rule(x):
    return jnp.round(x)


@floor_in_rule.defjvp
def _floor_in_rule_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return jnp.floor(x), t  # bug: the rule's primal is not fn's value


@jax.custom_jvp
def half_up(x):
    return jnp.floor(x + 0.5)  # bug: ties go up, the reference rounds half to even


@half_up.defjvp
def _half_up_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return half_up(x), t


def stop_gradient_round(x):
    # bug: x + (round(x) - x) loses -0.0, turns inf into NaN and rounds large values.
    return x + jax.lax.stop_gradient(jnp.round(x) - x)


@jax.custom_jvp
def cast_tangent(x):
    return jnp.round(x)


@cast_tangent.defjvp
def _cast_tangent_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return cast_tangent(x), t.astype(jnp.float32)  # bug: the tangent leaves the dtype


@jax.custom_jvp
def strict_clip(x):
    return jnp.clip(jnp.round(x), -1, 1)


@strict_clip.defjvp
def _strict_clip_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return strict_clip(x), jnp.where(jnp.abs(x) < 1, t, jnp.zeros_like(t))  # bug: < where <= is declared


@jax.custom_jvp
def unmasked_clip(x):
    return jnp.clip(jnp.round(x), -1, 1)


@unmasked_clip.defjvp
def _unmasked_clip_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return unmasked_clip(x), t  # bug: no clip mask


@jax.custom_jvp
def rank_dependent(x):
    return jnp.round(x)


@rank_dependent.defjvp
def _rank_dependent_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    # bug: a per-element rule that reads the rank; under vmap each row has rank 0.
    return rank_dependent(x), t if x.ndim >= 1 else 2 * t


@jax.custom_jvp
def nan_at_tie(x):
    return jnp.round(x)


@nan_at_tie.defjvp
def _nan_at_tie_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return nan_at_tie(x), jnp.where(x == 0.5, jnp.nan, 1).astype(t.dtype) * t  # bug: NaN at one point


@jax.custom_jvp
def eager_only(x):
    return jnp.round(x)


@eager_only.defjvp
def _eager_only_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    ones_np = np.ones(np.shape(x), np.asarray(x).dtype)  # bug: NumPy needs concrete values
    return eager_only(x), t * ones_np


def lsq_forward(x, step):
    return jnp.clip(jnp.round(x / step), -LSQ_LEVELS, LSQ_LEVELS) * step


def lsq_derivative(x, step):
    v = x / step
    inside = jnp.abs(v) <= LSQ_LEVELS
    d_x = inside.astype(x.dtype)
    d_step = jnp.where(inside, jnp.round(v) - v, jnp.clip(v, -LSQ_LEVELS, LSQ_LEVELS))
    return d_x, d_step


@jax.custom_jvp
def lsq_wrong_step(x, step):
    return lsq_forward(x, step)


@lsq_wrong_step.defjvp
def _lsq_wrong_step_jvp(primals, tangents):
    (x, step), (t_x, t_step) = primals, tangents
    d_x, d_step = lsq_derivative(x, step)
    # bug: the step's gradient has the wrong sign
    return lsq_wrong_step(x, step), d_x * t_x - d_step * t_step


@jax.custom_jvp
def lsq_right(x, step):
    return lsq_forward(x, step)


@lsq_right.defjvp
def _lsq_right_jvp(primals, tangents):
    (x, step), (t_x, t_step) = primals, tangents
    d_x, d_step = lsq_derivative(x, step)
    return lsq_right(x, step), d_x * t_x + d_step * t_step


@jax.custom_jvp
def round_right(x):
    return jnp.round(x)


@round_right.defjvp
def _round_right_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return round_right(x), t


@jax.custom_jvp
def clip_right(x):
    return jnp.clip(jnp.round(x), -1, 1)


@clip_right.defjvp
def _clip_right_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return clip_right(x), jnp.where(jnp.abs(x) <= 1, t, jnp.zeros_like(t))


def clip_reference(x):
    return jnp.clip(jnp.round(x), -1, 1)


LSQ_ARGS = (np.linspace(-3, 3, 16, dtype=np.float32), np.float32(0.25))
LSQ_TIES = (*((k + 0.5) * 0.25 for k in range(-8, 8)), -LSQ_LEVELS * 0.25, LSQ_LEVELS * 0.25)


class Case(NamedTuple):
    broken: Callable[..., Any]
    twin: Callable[..., Any]  # the same estimator without the bug
    keywords: dict[str, Any]  # for check_surrogate
    check: str  # the check that must fail
    dtype: str  # a dtype the bug shows in
    words: tuple[str, ...]  # in that check's detail


ROUND = dict(reference=jnp.round, derivative=ones, boundaries=ROUND_TIES)
CLIP = dict(reference=clip_reference, derivative=clip_mask, boundaries=CLIP_POINTS)
LSQ = dict(reference=lsq_forward, derivative=lsq_derivative, args=LSQ_ARGS, boundaries=LSQ_TIES)

CASES = {
    "tangent scaled by a constant": Case(
        scaled_tangent, round_right, ROUND, "tangent", "float32", ("differ from the declared value", "expected")
    ),
    "tangent not linear (t + 1)": Case(
        affine_tangent, round_right, ROUND, "linearity", "float32", ("2 jvp(t1) - jvp(t2)/2",)
    ),
    "rule's primal differs from the forward": Case(
        floor_in_rule, round_right, ROUND, "jvp_primal", "float32", ("differ bitwise", "the primal of jvp")
    ),
    "ties rounded half up": Case(half_up, round_right, ROUND, "forward_bitwise", "float32", ("differ bitwise",)),
    "stop_gradient form": Case(
        stop_gradient_round, round_right, ROUND, "forward_bitwise", "bfloat16", ("differ bitwise", "x=-0.0")
    ),
    "tangent cast to float32": Case(cast_tangent, round_right, ROUND, "tangent_structure", "bfloat16", ("float32",)),
    "strict clip edge where the declaration is inclusive": Case(
        strict_clip, clip_right, CLIP, "tangent", "float32", ("x=-1.0",)
    ),
    "missing clip mask": Case(unmasked_clip, clip_right, CLIP, "tangent", "float32", ("derivative 0.0",)),
    "rule depends on the rank": Case(rank_dependent, round_right, ROUND, "vmap", "float32", ("vmap",)),
    "tangent NaN at one point": Case(
        nan_at_tie, round_right, ROUND, "tangent", "float32", ("not finite where the declared value is", "x=0.5")
    ),
    "rule only works eagerly": Case(eager_only, round_right, ROUND, "jit", "float32", ("raised", "Tracer")),
    "wrong gradient for the step size": Case(lsq_wrong_step, lsq_right, LSQ, "tangent", "float32", ("argument 1",)),
}


def check_all(calls: list[tuple[Callable[..., Any], dict[str, Any], str]]) -> list[Any]:
    """``check_surrogate(fn, dtypes=(dtype,), **keywords)`` for each call, in order.

    Where the machine has cores to spare (as ``check_catalog`` counts them), several calls run at once in
    threads: each report is the one the call makes alone, and their compilations overlap.
    """

    def one(call):
        fn, keywords, dtype = call
        return check_surrogate(fn, dtypes=(dtype,), **keywords)

    workers = compile_workers()
    if workers == 1:
        return [one(call) for call in calls]
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, calls))


@pytest.fixture(scope="module")
def all_reports():
    """Each broken estimator checked once, in the dtype its bug shows in; each correct twin once per set of
    keywords and dtype it is used with."""
    twins: dict[Any, Any] = {}
    for c in CASES.values():
        twins.setdefault((c.twin.__name__, id(c.keywords), c.dtype), (c.twin, c.keywords, c.dtype))
    calls = [(c.broken, c.keywords, c.dtype) for c in CASES.values()] + list(twins.values())
    done = check_all(calls)
    broken = dict(zip(CASES, done[: len(CASES)], strict=True))
    twin = dict(zip(twins, done[len(CASES) :], strict=True))
    return broken, {name: twin[(c.twin.__name__, id(c.keywords), c.dtype)] for name, c in CASES.items()}


@pytest.fixture(scope="module")
def reports(all_reports):
    return all_reports[0]


@pytest.fixture(scope="module")
def twin_reports(all_reports):
    return all_reports[1]


@pytest.mark.parametrize("name", list(CASES))
def test_the_meant_check_catches_the_bug(reports, name):
    case, report = CASES[name], reports[name]
    check = f"{case.check}[{case.dtype}]"
    failed = {c.name: c for c in report.failures}
    assert check in failed, f"{name}: {check} passed; failures: {sorted(failed)}"
    detail = failed[check].detail
    assert 0 < len(detail) < 2000 and "Traceback" not in detail, detail
    for word in case.words:
        assert word in detail, f"{name}: {word!r} not in the detail: {detail}"
    assert not report.ok


@pytest.mark.parametrize("name", list(CASES))
def test_the_correct_twin_passes(twin_reports, name):
    report = twin_reports[name]
    assert report.ok, "\n".join(f"{c.name}: {c.detail}" for c in report.failures)
