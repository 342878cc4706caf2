"""The surrogate factory: exact forward, declared tangent, compositions, errors."""

import functools
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import stejax

from helpers import assert_bitwise_equal, boundary_triplets, special_values


# Host arrays go to the device with jax.device_put, a transfer: jnp.asarray of a NumPy array compiles a program
# (`stage`) per shape and dtype, and on an accelerator every program costs a compilation.
def _ones(shape, dtype=np.float32):
    """``jnp.ones`` built on the host and transferred: no program to compile."""
    return jax.device_put(np.ones(shape, dtype))


def _zeros(shape, dtype=np.float32):
    """``jnp.zeros`` built on the host and transferred."""
    return jax.device_put(np.zeros(shape, dtype))


def test_the_classic_example():
    # The README's example: value 2, gradient 1, tangent 3 carried through.
    # Compared on the host (float of a scalar array): an eager `==` would compile a program. The three calls in one
    # jitted program, compiled once, not op by op.
    value, grad, (primal, tangent) = jax.jit(
        lambda x, t: (stejax.round_ste(x), jax.grad(stejax.round_ste)(x), jax.jvp(stejax.round_ste, (x,), (t,)))
    )(1.7, 3.0)
    assert float(value) == 2
    assert float(grad) == 1
    assert float(primal) == 2
    assert float(tangent) == 3


def _stop_gradient_round(x):
    return x + jax.lax.stop_gradient(jnp.round(x) - x)


def test_forward_is_exact_where_the_stop_gradient_trick_drifts():
    # Values the one-line trick gets wrong (measured).
    cases = [
        (np.float32, [-0.3, np.inf, -np.inf]),
        (ml_dtypes.bfloat16, [-0.3, 258.0, -300.5]),
    ]
    for dtype, values in cases:
        x = jax.device_put(np.array(values, dtype))
        expected = np.round(np.array(values, dtype))
        assert_bitwise_equal(stejax.round_ste(x), expected, context=f"round_ste {dtype}")
        assert_bitwise_equal(jax.jit(stejax.round_ste)(x), expected, context=f"jit round_ste {dtype}")
    # And the trick really does drift there, so the comparison above can fail.
    drifted = np.asarray(_stop_gradient_round(jax.device_put(np.float32([-0.3, np.inf]))))
    assert np.signbit(drifted[0]) == np.False_ and np.isnan(drifted[1])


ROUNDINGS = [(stejax.round_ste, np.round), (stejax.floor_ste, np.floor), (stejax.ceil_ste, np.ceil)]
# The three estimators jitted in one program (shared by the dtypes' cases), compiled once per dtype.
_all_roundings = jax.jit(lambda x: [fn(x) for fn, _ in ROUNDINGS])


def test_forward_bitwise_on_specials_and_triplets(dtype):
    x = np.concatenate([special_values(dtype), boundary_triplets([-1.5, -0.5, 0.5, 1.5, 2.5], dtype)])
    jitted = _all_roundings(jax.device_put(x))
    for (fn, ref), y_jit in zip(ROUNDINGS, jitted, strict=True):
        expected = ref(x.astype(np.float64)).astype(dtype)
        assert_bitwise_equal(fn(jax.device_put(x)), expected, context=fn.__name__)
        assert_bitwise_equal(y_jit, expected, context=f"jit {fn.__name__}")


# jvp of round_ste in one jitted program, not op by op.
_jvp_round_ste = jax.jit(lambda x, t: jax.jvp(stejax.round_ste, (x,), (t,)))


def test_tangent_keeps_shape_and_dtype(dtype):
    x = jax.device_put(np.linspace(-3, 3, 12).reshape(3, 4).astype(dtype))
    t = jax.device_put(np.full((3, 4), 0.75, dtype))
    y, ty = _jvp_round_ste(x, t)
    assert y.dtype == ty.dtype == dtype
    assert y.shape == ty.shape == (3, 4)
    assert_bitwise_equal(ty, np.asarray(t), context="identity tangent")


def test_tangent_is_linear_in_the_tangent():
    # Multiples of 1/8 (jnp.linspace's values too): the combinations below are exact in float32, on the host.
    x = jax.device_put(np.linspace(-2.0, 2.0, 9, dtype=np.float32))
    t1, t2 = np.linspace(0.0, 1.0, 9, dtype=np.float32), np.linspace(-1.0, 3.0, 9, dtype=np.float32)
    slope = stejax.surrogate(jnp.round, lambda x: 2.0 * jnp.ones_like(x), name="double")

    tangent = jax.jit(lambda t: jax.jvp(slope, (x,), (t,))[1])  # one program for the three tangents

    def jvp(t):
        return np.asarray(tangent(jax.device_put(t)))

    combined = jvp(3.0 * t1 - 2.0 * t2)
    separate = 3.0 * jvp(t1) - 2.0 * jvp(t2)
    np.testing.assert_allclose(combined, separate, rtol=1e-6)


def _clipped_identity(x, *, clip):
    return jnp.where(jnp.abs(x) <= clip, 1.0, 0.0).astype(x.dtype)


def _sign(x, *, clip):
    del clip
    return jnp.where(x >= 0, 1.0, -1.0).astype(x.dtype)


clipped_sign = stejax.surrogate(_sign, _clipped_identity, name="clipped_sign")


def test_static_keyword_parameters_are_not_traced():
    # The value and the gradient in one jitted program.
    f = jax.jit(lambda x: (clipped_sign(x, clip=0.5), jax.grad(lambda x: clipped_sign(x, clip=0.5).sum())(x)))
    x = jax.device_put(np.array([-1.0, -0.5, 0.0, 0.4, 0.6], np.float32))
    y, g = f(x)
    np.testing.assert_array_equal(y, [-1, -1, 1, 1, 1])
    np.testing.assert_array_equal(g, [0, 1, 1, 1, 0])


def test_forward_with_keyword_defaults_works_under_jit():
    # jax.custom_jvp(jnp.round) traces `decimals` and fails under jit; the factory does not.
    est = stejax.surrogate(jnp.round, lambda x: jnp.ones_like(x), name="round")
    value, grad = jax.jit(lambda x: (est(x), jax.grad(est)(x)))(jax.device_put(np.float32(2.5)))
    assert float(value) == 2.0
    assert float(grad) == 1.0


def _scaled_round(x, step):
    return jnp.round(x / step) * step


def _scaled_round_partials(x, step):
    v = x / step
    return jnp.ones_like(x), jnp.round(v) - v


scaled_round = stejax.surrogate(_scaled_round, _scaled_round_partials, name="scaled_round", diff_argnums=(0, 1))


def test_several_differentiable_arguments():
    x = jax.device_put(np.array([0.26, -0.7, 1.3], np.float32))
    step = jax.device_put(np.float32(0.5))

    def program(x, step, tx, tstep):  # the gradient and the jvp in one jitted program, not op by op
        grads = jax.grad(lambda x, s: scaled_round(x, s).sum(), argnums=(0, 1))(x, step)
        return grads, jax.jvp(scaled_round, (x, step), (tx, tstep))[1]

    # jvp in the step direction alone.
    (gx, gstep), t = jax.jit(program)(x, step, _zeros(3), jax.device_put(np.float32(2.0)))
    v = np.asarray(x) / np.float32(0.5)
    np.testing.assert_array_equal(gx, np.ones(3, np.float32))
    np.testing.assert_allclose(gstep, np.sum(np.round(v) - v), rtol=1e-6)
    np.testing.assert_allclose(t, 2.0 * (np.round(v) - v), rtol=1e-6)


def test_vmap_with_unbatched_argument():
    def program(step):  # everything in one jitted program, not op by op; xs comes back for the reference
        xs = jnp.linspace(-2.0, 2.0, 12).reshape(4, 3)
        batched = jax.vmap(scaled_round, in_axes=(0, None))(xs, step)
        grad = jax.grad(lambda x, s: scaled_round(x, s).sum(), argnums=1)
        return xs, batched, scaled_round(xs, step), jax.vmap(grad, in_axes=(0, None))(xs, step)

    xs, batched, unbatched, per_example = jax.jit(program)(jax.device_put(np.float32(0.5)))
    np.testing.assert_array_equal(batched, unbatched)
    v = np.asarray(xs) / 0.5
    np.testing.assert_allclose(per_example, (np.round(v) - v).sum(axis=1), rtol=1e-5, atol=1e-6)


def test_python_scalars_take_the_array_dtype():
    x = jax.device_put(np.array([0.3, 0.8]).astype(ml_dtypes.bfloat16))
    y = jax.jit(lambda x: scaled_round(x, 0.25))(x)  # the scalar stays a Python number inside; one program
    assert y.dtype == jnp.bfloat16


def test_mismatched_array_dtypes_are_rejected():
    with pytest.raises(TypeError, match=r"scaled_round: .*share one floating dtype.*float32.*bfloat16"):
        scaled_round(_ones(2), jax.device_put(np.asarray(0.5, ml_dtypes.bfloat16)))


@pytest.mark.parametrize(
    "bad", [jax.device_put(np.arange(3, dtype=np.int32)), jax.device_put(np.array([True, False])), 2]
)
def test_integer_and_boolean_inputs_are_rejected_with_the_name(bad):
    with pytest.raises(TypeError, match=r"round_ste: the input must be a floating-point array.*got dtype"):
        stejax.round_ste(bad)


def test_random_estimator_requires_a_key():
    with pytest.raises(TypeError, match=r"stochastic_round\(\) missing 1 required keyword-only argument: 'key'"):
        stejax.stochastic_round(_ones(3))  # type: ignore[call-arg]
    noisy = stejax.surrogate(
        lambda x, *, key: x + jax.random.normal(key, x.shape),
        lambda x, **_: jnp.ones_like(x),
        name="noisy",
        random=True,
    )
    with pytest.raises(TypeError, match=r"noisy: this estimator is random and needs a PRNG key.*`key`"):
        noisy(_ones(3))
    assert noisy(_ones(3), key=jax.random.key(0)).shape == (3,)


def test_deterministic_estimator_refuses_a_key():
    est = stejax.surrogate(jnp.round, lambda x: jnp.ones_like(x), name="r")
    with pytest.raises(TypeError, match=r"r: this estimator is deterministic and takes no `key`"):
        est(_ones(3), key=jax.random.key(0))


def test_factory_needs_exactly_one_rule():
    with pytest.raises(ValueError, match=r"exactly one of `derivative`.*or `tangent`"):
        stejax.surrogate(jnp.round)
    with pytest.raises(ValueError, match=r"exactly one of"):
        stejax.surrogate(jnp.round, lambda x: x, tangent=lambda x, tangents: tangents[0])


def test_derivative_with_the_wrong_number_of_partials_is_reported():
    est = stejax.surrogate(_scaled_round, lambda x, s: jnp.ones_like(x), name="bad", diff_argnums=(0, 1))
    one = jax.device_put(np.float32(1.0))
    with pytest.raises(TypeError, match=r"bad: the declared derivative must return one partial per"):
        # Under jit: reported while tracing, before anything compiles.
        jax.jit(lambda x, s, tx, ts: jax.jvp(est, (x, s), (tx, ts)))(_ones(2), one, _ones(2), one)


def test_tangent_map_for_non_diagonal_jacobians():
    # y = sort(x) has a permutation Jacobian; declare it as a tangent map.
    def sort_tangent(x, *, tangents):
        (t,) = tangents
        return t[jnp.argsort(x)]

    est = stejax.surrogate(jnp.sort, tangent=sort_tangent, name="sort")
    x = jax.device_put(np.array([3.0, 1.0, 2.0], np.float32))
    # The jvp and both Jacobians in one jitted program (exact permutations), not op by op.
    t, rev, fwd = jax.jit(lambda x, t: (jax.jvp(est, (x,), (t,))[1], jax.jacrev(est)(x), jax.jacfwd(est)(x)))(
        x, jax.device_put(np.array([10.0, 20.0, 30.0], np.float32))
    )
    np.testing.assert_array_equal(t, [20.0, 30.0, 10.0])
    np.testing.assert_array_equal(np.asarray(rev), np.asarray(fwd))


def test_higher_order_goes_through_the_surrogate():
    # d/dx [round_ste(x)^2] = 2 round(x) * 1; its derivative again through the STE is 2.
    f = lambda x: stejax.round_ste(x) ** 2  # noqa: E731
    # The derivatives in one jitted program (exact small integers), not op by op.
    first, second, hessian = jax.jit(lambda x: (jax.grad(f)(x), jax.grad(jax.grad(f))(x), jax.hessian(f)(x)))(1.7)
    assert float(first) == 4.0
    assert float(second) == 2.0
    assert float(hessian) == 2.0


def test_scan_and_checkpoint():
    def body(carry, x):
        return carry + stejax.round_ste(x) * x, None

    def total(xs):
        return jax.lax.scan(jax.checkpoint(body), jnp.float32(0.0), xs)[0]

    xs = jax.device_put(np.array([0.4, 1.6, -2.2], np.float32))
    expected = np.round(np.asarray(xs)) + np.asarray(xs)  # d/dx [round(x) x] = 1 * x + round(x)
    np.testing.assert_allclose(jax.grad(total)(xs), expected, rtol=1e-6)
    np.testing.assert_allclose(jax.jit(jax.grad(total))(xs), expected, rtol=1e-6)


@pytest.mark.needs_float64
def test_float64_is_kept_when_enabled():
    with jax.enable_x64(True):
        x = jax.device_put(np.array([0.5, 1.5, -2.5, 1e300], np.float64))
        y, t = jax.jvp(stejax.round_ste, (x,), (_ones(4, np.float64),))
        assert y.dtype == t.dtype == jnp.float64
        assert_bitwise_equal(y, np.round(np.asarray(x)), context="float64 round")


def test_subnormals_follow_jax_not_numpy():
    # XLA on CPU flushes subnormal inputs to zero; the estimators follow jnp exactly.
    x = jax.device_put(np.array([-1e-45, 1e-45], np.float32))
    jitted = _all_roundings(x)  # the three jitted estimators in one program
    for (fn, _), ref, y_jit in zip(ROUNDINGS, (jnp.round, jnp.floor, jnp.ceil), jitted, strict=True):
        assert_bitwise_equal(fn(x), np.asarray(ref(x)), context=fn.__name__)
        assert_bitwise_equal(y_jit, np.asarray(ref(x)), context=fn.__name__)


# --- misuse of the factory: errors that name the estimator, what was expected and what came -----


def _slope_round(x, *, slope=1.0):
    return jnp.round(x)


def _slope_derivative(x, *, slope=1.0):
    return jnp.full_like(x, slope)


def test_rules_must_be_functions():
    with pytest.raises(TypeError, match=r"surrogate \(round\): `derivative` must be a function; got str 'x'"):
        stejax.surrogate(jnp.round, "x")
    with pytest.raises(TypeError, match=r"surrogate \(mine\): `tangent` must be a function; got int 3"):
        stejax.surrogate(jnp.round, tangent=3, name="mine")
    with pytest.raises(TypeError, match=r"surrogate \(estimator\): `forward` must be a function; got NoneType"):
        stejax.surrogate(None, jnp.ones_like)


def test_a_traced_array_as_a_keyword_hyperparameter_is_refused():
    est = stejax.surrogate(_slope_round, _slope_derivative, name="slope_round")
    x = jax.device_put(np.linspace(-1, 1, 5, dtype=np.float32))  # exactly jnp.linspace's values
    match = r"slope_round: keyword argument `slope` is a static hyperparameter .* got a traced array"
    with pytest.raises(TypeError, match=match):
        jax.grad(lambda s: est(x, slope=s).sum())(2.0)
    with pytest.raises(TypeError, match=match):
        jax.jit(lambda x, s: est(x, slope=s))(x, 2.0)
    # A Python number is what it takes, under jit too (the gradient jitted too: one program, not op by op).
    grad = jax.jit(jax.grad(lambda x: jax.jit(functools.partial(est, slope=2.0))(x).sum()))
    assert float(np.asarray(grad(x))[0]) == 2.0


def test_an_unknown_keyword_names_the_estimator_and_the_known_ones():
    est = stejax.surrogate(_slope_round, _slope_derivative, name="slope_round")
    with pytest.raises(TypeError, match=r"slope_round: unknown keyword argument\(s\) 'slop': its forward "):
        est(_ones(3), slop=2.0)
    # Accepted by the forward but not by the derivative: named before anything is traced.
    partial_rule = stejax.surrogate(_slope_round, lambda x: jnp.ones_like(x), name="half")
    with pytest.raises(TypeError, match=r"half: unknown keyword argument\(s\) 'slope': its derivative .* takes none"):
        partial_rule(_ones(3), slope=2.0)


@pytest.mark.parametrize("shape", [(2,), (3, 1), (4, 3)])
def test_a_derivative_of_the_wrong_shape_is_named(shape):
    est = stejax.surrogate(jnp.round, lambda x: jnp.ones(shape, x.dtype), name="wrong_shape")
    match = rf"wrong_shape: the declared derivative for positional argument 0 has shape {re.escape(str(shape))}; "
    with pytest.raises(ValueError, match=match + r"expected a shape that broadcasts.*output's shape \(3,\)"):
        jax.jit(jax.grad(lambda x: est(x).sum()))(_ones(3))  # reported while tracing, before anything compiles


def test_a_derivative_that_broadcasts_is_accepted():
    # One partial for all elements (shape ()) or per output element: both broadcast. Both gradients in one jitted
    # program, not op by op.
    rules = (lambda x: jnp.float32(0.5), lambda x: jnp.full_like(x, 0.5))
    ests = [stejax.surrogate(jnp.round, d, name="half_slope") for d in rules]
    grads = jax.jit(lambda x: [jax.grad(lambda x, est=est: est(x).sum())(x) for est in ests])(_ones(3))
    for g in grads:
        assert np.asarray(g).tolist() == [0.5] * 3


def test_an_unhashable_callable_rule_works():
    class Ones:
        __hash__ = None  # a callable object that cannot be a cache key

        def __call__(self, x):
            return jnp.ones_like(x)

    est = stejax.surrogate(jnp.round, Ones(), name="ones")
    assert jax.jit(jax.grad(lambda x: est(x).sum()))(_ones(2)).tolist() == [1.0, 1.0]  # one program
