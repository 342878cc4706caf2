"""Every catalog member through the same checks, driven by its catalog entry.

The family test modules compare each estimator with an independent NumPy
reference; this suite checks that every entry is truthful (the public function
equals its declared forward and derivative) and that every estimator composes
with jit, vmap, grad, jvp, vjp, jacfwd, jacrev, hessian, scan and checkpoint.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from stejax.estimators.catalog import CATALOG, FAMILIES

from helpers import assert_bitwise_equal

ENTRIES = list(CATALOG.values())
IDS = [e.name for e in ENTRIES]
KEY_SEED = 7


def _shape(entry, params):
    shape = tuple(entry.example_shape(**params)) if entry.example_shape else (5, 4)
    return shape if len(shape) >= 2 else (5, *shape)


def _case(entry, dtype, params=None, seed=0):
    """(fn, forward, derivative, tangent, x, args, params) for one entry, dtype and params."""
    params = entry.default_params() if params is None else params
    rng = np.random.default_rng(seed)
    shape = _shape(entry, params)
    x = (rng.standard_normal(shape) * 2.0).astype(dtype)
    args = tuple(jnp.asarray(a) for a in entry.example_args(rng, shape, dtype, params))
    bind = dict(params)
    if entry.random:
        bind["key"] = jax.random.key(KEY_SEED)
    fn = functools.partial(entry.fn, **bind)
    forward = functools.partial(entry.forward, **bind)
    derivative = functools.partial(entry.derivative, **bind) if entry.derivative else None
    tangent = functools.partial(entry.tangent, **bind) if entry.tangent else None
    return fn, forward, derivative, tangent, jnp.asarray(x), args


def _declared_tangent(entry, derivative, tangent, x, args, tangents):
    """The tangent the entry declares, computed from its derivative or tangent map."""
    primals = (x, *args)
    if tangent is not None:
        return tangent(*primals, tangents=tangents)
    partials = derivative(*primals)
    partials = partials if isinstance(partials, tuple) else (partials,)
    terms = [jnp.asarray(d, x.dtype) * t for d, t in zip(partials, tangents)]
    return functools.reduce(jnp.add, terms)


def _diff_tangents(entry, x, args, seed=1):
    rng = np.random.default_rng(seed)
    primals = (x, *args)
    return tuple(
        jnp.asarray(rng.standard_normal(np.shape(primals[i])).astype(primals[i].dtype)) for i in entry.diff_argnums
    )


def _jvp(entry, fn, x, args, tangents):
    primals = (x, *args)
    all_tangents = [jnp.zeros_like(p) for p in primals]
    for i, t in zip(entry.diff_argnums, tangents):
        all_tangents[i] = t
    return jax.jvp(fn, primals, tuple(all_tangents))


def _tol(dtype):
    return 4 * float(jnp.finfo(dtype).eps)


def test_catalog_covers_every_family():
    assert set(FAMILIES) == {e.family for e in ENTRIES}


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_entry_is_documented(entry):
    import stejax

    assert getattr(stejax, entry.fn.__name__) is entry.fn, f"stejax.{entry.fn.__name__} is not exported"
    doc = entry.fn.__doc__ or ""
    for needle in ("Forward", "Surrogate", "Reference"):
        assert needle in doc, f"{entry.name}: the docstring lacks a {needle!r} section"
    assert entry.forward_math and entry.derivative_math and entry.reference and entry.kinks


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_forward_equals_the_declared_forward(entry, dtype):
    cases = [(params, _case(entry, dtype, params)) for params in entry.param_grid()]
    # Every listed parameter set under one jit: one compiled program per entry and dtype.
    jitted = jax.jit(lambda inputs: [c[0](x, *args) for (_, c), (x, args) in zip(cases, inputs)])(
        [(c[4], c[5]) for _, c in cases]
    )
    for (params, (fn, forward, _, _, x, args)), y_jit in zip(cases, jitted, strict=True):
        expected = np.asarray(forward(x, *args))
        context = f"{entry.name}{params}"
        y = fn(x, *args)
        assert_bitwise_equal(y, expected, context=context)
        assert_bitwise_equal(y_jit, expected, context=f"jit {context}")
        assert y.dtype == dtype


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_tangent_is_the_declared_one(entry, dtype):
    fn, _, derivative, tangent, x, args = _case(entry, dtype)
    tangents = _diff_tangents(entry, x, args)
    y, ty = _jvp(entry, fn, x, args, tangents)
    assert ty.shape == y.shape and ty.dtype == y.dtype == dtype
    expected = _declared_tangent(entry, derivative, tangent, x, args, tangents)
    if derivative is not None and len(entry.diff_argnums) == 1:
        # One partial times one tangent: the same single rounding, so exact.
        assert_bitwise_equal(ty, np.asarray(expected, dtype), context=entry.name)
    else:
        np.testing.assert_allclose(
            np.asarray(ty, np.float32), np.asarray(expected, np.float32), rtol=_tol(dtype), atol=_tol(dtype)
        )


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_grad_is_the_transposed_tangent(entry):
    fn, _, derivative, tangent, x, args = _case(entry, np.float32)
    w = jnp.asarray(np.random.default_rng(3).standard_normal(fn(x, *args).shape).astype(np.float32))
    argnums = entry.diff_argnums
    grads = jax.grad(lambda *p: jnp.sum(fn(*p) * w), argnums=argnums)(x, *args)
    # Adjoint identity per argument: <grad_i, t_i> == <jvp(t_i), w>.
    tangents = _diff_tangents(entry, x, args, seed=5)
    for k, i in enumerate(argnums):
        only = tuple(t if j == k else jnp.zeros_like(t) for j, t in enumerate(tangents))
        _, ty = _jvp(entry, fn, x, args, only)
        lhs = float(jnp.sum(grads[k] * tangents[k]))
        rhs = float(jnp.sum(ty * w))
        assert grads[k].shape == (x, *args)[i].shape
        np.testing.assert_allclose(lhs, rhs, rtol=1e-4, atol=1e-4, err_msg=f"{entry.name} argument {i}")


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_compositions_agree_with_eager(entry):
    fn, _, _, _, xs, args = _case(entry, np.float32)
    eager = fn(xs, *args)
    w = jnp.asarray(np.random.default_rng(4).standard_normal(eager.shape).astype(np.float32))
    t = jnp.asarray(np.random.default_rng(6).standard_normal(xs.shape).astype(np.float32))
    in_axes = (0,) + (None,) * len(args)

    def row_loss(x, wi):
        return jnp.sum(fn(x, *args) * wi)

    def loss(xs):
        return jnp.sum(fn(xs, *args) * w)

    def body(total, xw):
        x, wi = xw
        return total + row_loss(x, wi), None

    def compositions(xs, w, t):
        # Every transformation in one jitted program, compiled once. (Op by op, eagerly, each
        # operation and shape compiles an executable of its own.)
        return {
            "forward": fn(xs, *args),
            "rows": jnp.stack([fn(x, *args) for x in xs]),
            "vmap": jax.vmap(fn, in_axes=in_axes)(xs, *args),
            "row grads": jnp.stack([jax.grad(row_loss)(x, wi) for x, wi in zip(xs, w)]),
            "vmap of grad": jax.vmap(jax.grad(row_loss))(xs, w),
            "grad of vmap": jax.grad(lambda xs: jnp.sum(jax.vmap(fn, in_axes=in_axes)(xs, *args) * w))(xs),
            "scan": jax.grad(lambda xs: jax.lax.scan(body, jnp.float32(0.0), (xs, w))[0])(xs),
            "checkpoint": jax.grad(lambda xs: jnp.sum(jax.checkpoint(fn)(xs, *args) * w))(xs),
            "grad": jax.grad(loss)(xs),
            "jvp": jax.jvp(lambda x: fn(x, *args), (xs,), (t,))[1],
        }

    out = jax.jit(compositions)(xs, w, t)

    # vmap over the leading axis against a loop over the rows, in one jitted program.
    assert_bitwise_equal(out["vmap"], np.asarray(out["rows"]), context="jit of vmap")
    looped_grads = out["row grads"]
    for name in ("vmap of grad", "grad of vmap", "scan"):
        np.testing.assert_allclose(out[name], looped_grads, rtol=1e-6, atol=1e-7, err_msg=name)
    np.testing.assert_array_equal(out["checkpoint"], out["grad"], err_msg="checkpoint")

    # Eagerly: the forward, the gradient (by vjp) and the jvp, against the jitted program. (Eager and
    # jitted forwards are compared for every dtype and parameter in test_forward_equals_the_declared_forward.)
    assert_bitwise_equal(out["forward"], np.asarray(eager), context="jit vs eager forward")
    _, pullback = jax.vjp(lambda x: fn(x, *args), xs)
    eager_grad = pullback(w)[0]
    np.testing.assert_array_equal(out["grad"], eager_grad, err_msg="jit of grad vs eager vjp")
    eager_jvp = jax.jvp(lambda x: fn(x, *args), (xs,), (t,))[1]
    np.testing.assert_array_equal(out["jvp"], eager_jvp, err_msg="jit of jvp")


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_jacobians_and_hessian(entry):
    fn, _, _, _, xs, args = _case(entry, np.float32)
    x = xs[0]
    row = lambda x: fn(x, *args)  # noqa: E731
    # One jitted program for the three: traced the same way as eagerly, compiled once.
    fwd, rev, hess = jax.jit(
        lambda x: (jax.jacfwd(row)(x), jax.jacrev(row)(x), jax.hessian(lambda x: jnp.sum(row(x)))(x))
    )(x)
    np.testing.assert_allclose(fwd, rev, rtol=1e-6, atol=1e-7)
    assert hess.shape == x.shape * 2 and hess.dtype == x.dtype


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
@pytest.mark.parametrize("bad_dtype", [jnp.int32, jnp.bool_])
def test_integer_and_boolean_inputs_are_rejected(entry, bad_dtype):
    fn, _, _, _, x, args = _case(entry, np.float32)
    with pytest.raises(TypeError, match="floating-point") as err:
        fn(jnp.zeros(x.shape, bad_dtype), *args)
    assert entry.name.split("_")[0] in str(err.value)


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_metadata_lists_every_parameter_of_the_signature(entry):
    import inspect

    parameters = inspect.signature(entry.fn).parameters.values()
    keywords = [p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name != "key"]
    positional = [p.name for p in parameters if p.kind is not inspect.Parameter.KEYWORD_ONLY][1:]
    assert sorted(p.name for p in entry.params) == sorted(keywords), f"{entry.name}: keyword parameters"
    assert [a.name for a in entry.args] == positional, f"{entry.name}: positional arrays"
    assert entry.random == ("key" in inspect.signature(entry.fn).parameters)


@pytest.mark.parametrize("name", ["fake_quant", "lsq", "lsq_plus"])
def test_per_channel_example_arrays_follow_the_axis(name):
    entry = CATALOG[name]
    params = {**entry.default_params(), "axis": 1}
    args = entry.example_args(np.random.default_rng(0), (3, 5), np.float32, params)
    assert all(a.shape == (5,) for a in args), [a.shape for a in args]
    # The channels' steps differ, so a value applied to the wrong channel changes the result.
    assert len(set(args[0].tolist())) > 1
    assert all(a.shape == () for a in entry.example_args(np.random.default_rng(0), (3, 5), np.float32, {"axis": None}))


def test_the_catalog_page_is_generated_from_the_current_catalog():
    # docs/estimators.md is docs/generate.py's output: a parameter added to the catalog must show there.
    from pathlib import Path

    from stejax.render import render_page

    page = Path(__file__).resolve().parents[1] / "docs" / "estimators.md"
    assert page.read_text(encoding="utf-8") == render_page(list(CATALOG.values())), "run docs/generate.py"
    assert "`stejax.lsq(x, step, bits=..., signed=..., grad_scale=..., axis=...)`" in page.read_text(encoding="utf-8")
