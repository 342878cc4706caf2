"""The binary family: sign with four surrogates, and ternarisation.

Forward values are compared bit for bit with NumPy, eagerly and under jit, on
random values, on float triplets around every tie and clip point, and on special
values. Piecewise surrogates are compared bit for bit with a NumPy emulation of
the documented float32 evaluation; SwishSign goes through ``exp`` and is compared
with the float64 formula of the paper within a stated tolerance.

The data-dependent scales (``magnitude_aware_sign``, ``ternary``'s default
threshold) are sums; inputs for bitwise checks are multiples of 1/64 below 4 in
magnitude, or pairs (v, -v), so that every partial sum is exact in float32 and the
reduction order cannot matter.
"""

import functools
import inspect
import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from stejax.estimators import binary
from stejax.estimators.binary import approx_sign, magnitude_aware_sign, sign_ste, swish_sign, ternary

from helpers import (
    CONTRACT,
    assert_bitwise_equal,
    assert_platform_equal,
    boundary_triplets,
    platform_reads,
    special_values,
)

# Host arrays go to the device with jax.device_put, a transfer: jnp.asarray of a NumPy array compiles a program
# (`stage`) per shape and dtype, and on an accelerator every program costs a compilation.
F32 = np.float32
TINY32 = np.finfo(np.float32).tiny
ENTRIES = {e.name: e for e in binary.ENTRIES}


# ----------------------------------------------------------------------------- NumPy references


def np_sign(x):
    """+1 for x >= 0 (both zeros), -1 for x < 0, NaN for NaN."""
    x64 = np.asarray(x).astype(np.float64)
    return np.where(np.isnan(x64), np.nan, np.where(x64 >= 0, 1.0, -1.0)).astype(x.dtype)


def np_clip_indicator(x, clip):
    """1[|x| <= clip], compared in float32 with clip rounded to float32; NaN at NaN."""
    ax = np.abs(x.astype(F32))
    d = np.where(ax <= F32(clip), 1.0, 0.0)
    return np.where(np.isnan(ax), np.nan, d).astype(x.dtype)


def np_approx_sign_derivative(x):
    ax = np.abs(x.astype(F32))
    with np.errstate(over="ignore"):
        d = np.where(ax < 1, F32(2) - F32(2) * ax, F32(0))
    return np.where(np.isnan(ax), np.nan, d).astype(x.dtype)


def swish_formula64(x, beta, cdt=F32):
    """BNN+'s derivative, beta (2 - z tanh(z/2)) / (1 + cosh z), in float64 at z = beta x."""
    # The product beta * x is taken as the library forms it, rounded to the compute
    # dtype: the derivative's relative sensitivity to z grows like |z| in the tails.
    with np.errstate(over="ignore"):
        z = (cdt(beta) * x.astype(cdt)).astype(np.float64)
    out = np.zeros_like(z)
    finite = np.abs(z) < 700  # cosh overflows float64 beyond; the exact value there is < 1e-290
    zf = z[finite]
    out[finite] = beta * (2 - zf * np.tanh(zf / 2)) / (1 + np.cosh(zf))
    return np.where(np.isnan(z), np.nan, out)


def _flush32(v):
    return np.where(np.abs(v) < TINY32, F32(0), v).astype(F32)


def _reduced_axes(x, axis):
    return None if x.ndim <= 1 else tuple(i for i in range(x.ndim) if i != axis % x.ndim)


def np_channel_scale(x, axis):
    """mean |x| over every axis but ``axis``: float32 sum (exact for the test data) times fl32(1/n)."""
    axes = _reduced_axes(x, axis)
    a = _flush32(np.abs(x.astype(F32)))
    n = x.size if axes is None else math.prod(x.shape[i] for i in axes)
    with np.errstate(over="ignore"):
        total = a.astype(np.float64).sum(axis=axes, keepdims=True).astype(F32)
    return _flush32(total * F32(1.0 / n)).astype(x.dtype)


def np_magnitude_aware_sign(x, axis):
    scale = np_channel_scale(x, axis).astype(np.float64)
    return (scale * np_sign(x).astype(np.float64)).astype(x.dtype)


def np_magnitude_aware_derivative(x, axis):
    scale = np.broadcast_to(np_channel_scale(x, axis), x.shape).astype(np.float64)
    d = np.where(np.abs(x.astype(np.float64)) <= 1, scale, 0.0)
    return np.where(np.isnan(x.astype(np.float64)), np.nan, d).astype(x.dtype)


def np_ternary_threshold(x):
    """0.7 mean|x| as the library forms it: float32 sum times fl32(0.7 / n), flushed."""
    a = _flush32(np.abs(x.astype(F32)))
    with np.errstate(over="ignore"):
        total = F32(a.astype(np.float64).sum())
    return _flush32(np.asarray(total * F32(0.7 / max(x.size, 1))))[()]


def np_ternary(x, threshold=None):
    x32 = x.astype(F32)
    t = np_ternary_threshold(x) if threshold is None else F32(threshold)
    y = np.where(x32 > t, 1.0, np.where(x32 < -t, -1.0, 0.0))
    return np.where(np.isnan(x32) | np.isnan(t), np.nan, y).astype(x.dtype)


# ----------------------------------------------------------------------------- inputs and modes


def _inputs(rng, dtype, points=()):
    """128 values: triplets around 0 and ``points``, specials, and random values over several scales.

    One length for every test, so that op-by-op (eager) executables compiled for
    one test are reused by the next.
    """
    fixed = np.concatenate([boundary_triplets((0.0, *points), dtype), special_values(dtype)])
    n = 128 - fixed.size
    rand = (rng.standard_normal(n) * rng.choice([1e-3, 0.1, 0.7, 2.0, 50.0], n)).astype(np.float32).astype(dtype)
    return np.concatenate([rand, fixed])


def _padded(values, dtype):
    """``values`` in ``dtype`` padded with zeros to the length of :func:`_inputs` (its eager executables)."""
    x = np.asarray(values).astype(dtype)
    return np.concatenate([x, np.zeros(128 - x.size, dtype)])


def _exact_sum_data(rng, shape, dtype):
    """Multiples of 1/64 in (-4, 4): exact in every dtype, with exact float32 partial sums."""
    return (rng.integers(-255, 256, shape) / 64).astype(dtype)


def _zeros(shape, dtype=np.float32):
    """``jnp.zeros`` built on the host and transferred: no program to compile."""
    return jax.device_put(np.zeros(shape, dtype))


@functools.cache
def _jitted(fn, params):
    """``fn`` with the keyword arguments ``params`` (pairs), jitted once for the module."""
    return jax.jit(functools.partial(fn, **dict(params)))


def _jit(f):
    """``f`` (a function, or a partial with keywords) under jit, its keyword defaults filled in.

    The same estimator with the same parameters is one jitted function for every test, so that a shape and dtype
    it was compiled for is compiled once (sign_ste and sign_ste(clip=1.0) are one program).
    """
    fn, params = (f.func, f.keywords) if isinstance(f, functools.partial) else (f, {})
    defaults = {
        k: p.default
        for k, p in inspect.signature(fn).parameters.items()
        if p.kind is p.KEYWORD_ONLY and p.default is not p.empty
    }
    return _jitted(fn, tuple(sorted({**defaults, **params}.items())))


def _both(f, *args, eager=True):
    """f(*args) under jit, and eagerly unless ``eager`` is False (op-by-op compiles cost time)."""
    return {"eager": f(*args), "jit": _jit(f)(*args)} if eager else {"jit": _jit(f)(*args)}


def _grad(fn):
    return jax.grad(lambda x: jnp.sum(fn(x)))


def _check_gradients(fn, x, expected, rng, context, *, forward=None, tangent=None, eager=True):
    """grad of sum (under jit, and eagerly) and jvp (under jit) bit for bit against ``expected``.

    With ``forward``, the value too (under jit, and eagerly). Returns the gradients by mode.
    """
    t = rng.standard_normal(x.shape).astype(x.dtype) if tangent is None else tangent
    return _check_many([(fn, x, expected, t, context, forward, eager)])[0]


def _check_many(cases):
    """:func:`_check_gradients` for several (fn, x, expected, tangent, context, forward, eager) cases.

    Everything jitted, for every case, is one program, compiled once.
    """

    def program(inputs):
        return [(c[0](x), _grad(c[0])(x), jax.jvp(c[0], (x,), (t,))) for c, (x, t) in zip(cases, inputs)]

    jitted = jax.jit(program)([(jax.device_put(c[1]), jax.device_put(c[3])) for c in cases])
    all_grads = []
    for (fn, x, expected, t, context, forward, eager), (y_jit, g_jit, (y, ty)) in zip(cases, jitted, strict=True):
        dtype = x.dtype
        xj = jax.device_put(x)
        grads = {"eager": _grad(fn)(xj), "jit": g_jit} if eager else {"jit": g_jit}
        for mode, g in grads.items():
            assert g.dtype == dtype, context
            assert_platform_equal(g, expected, context=f"grad {mode} {context}")
        if forward is not None:
            values = {"eager": fn(xj), "jit": y_jit} if eager else {"jit": y_jit}
            for mode, value in values.items():
                assert value.dtype == dtype and value.shape == x.shape, context
                assert_bitwise_equal(value, forward, context=f"{mode} {context}")
        assert y.dtype == ty.dtype == dtype, context
        # One product of two dtype values, rounded once (NumPy and ml_dtypes round likewise).
        assert_platform_equal(ty, expected * t, context=f"jvp {context}")
        all_grads.append(grads)
    return all_grads


# ----------------------------------------------------------------------------- sign


# The forward does not depend on the parameters; two clips give two sets of triplets.
SIGN_CASES = [
    (sign_ste, {"clip": 1.0}),
    (sign_ste, {"clip": 0.3}),
    (approx_sign, {}),
    (swish_sign, {"beta": 5.0}),
]
SIGN_IDS = [f"{f.__name__}-{next(iter(p.values()), '')}" for f, p in SIGN_CASES]


@pytest.mark.parametrize(("fn", "params"), SIGN_CASES, ids=SIGN_IDS)
def test_sign_forward_bit_for_bit(fn, params, dtype):
    rng = np.random.default_rng(0)
    points = [c for c in (params.get("clip", 1.0), -params.get("clip", 1.0)) if math.isfinite(c)]
    x = _inputs(rng, dtype, points)
    f = functools.partial(fn, **params)
    for mode, y in _both(f, jax.device_put(x)).items():
        assert y.dtype == dtype
        assert_bitwise_equal(y, np_sign(platform_reads(x)), context=f"{fn.__name__}{params} {mode}")
    assert_bitwise_equal(ENTRIES[fn.__name__].forward(jax.device_put(x), **params), np_sign(platform_reads(x)))


@pytest.mark.parametrize("fn", [sign_ste, approx_sign, swish_sign])
def test_sign_of_zeros_and_subnormals(fn, dtype):
    below, _, above = boundary_triplets([0.0], dtype)  # the smallest subnormals
    x = _padded(np.array([-0.0, 0.0, below, above, np.inf, -np.inf, np.nan], np.float64), dtype)
    expected = np.array([1.0, 1.0, -1.0, 1.0, 1.0, -1.0, np.nan]).astype(dtype)
    if dtype.name in CONTRACT.subnormal_inputs_read_as_zero:
        expected[2] = 1.0  # the negative subnormal is read as -0, whose sign is +1
    for mode, y in _both(fn, jax.device_put(x)).items():
        assert_bitwise_equal(np.asarray(y)[:7], expected, context=f"{fn.__name__} {mode}")


def test_sign_ste_gradient_is_the_clipped_indicator(dtype):
    cases = []
    for clip in (1.0, 2.0, 0.3, math.inf):
        rng = np.random.default_rng(1)
        x = _inputs(rng, dtype, [c for c in (-clip, clip) if math.isfinite(c)])
        expected = np_clip_indicator(x, clip)
        assert_bitwise_equal(ENTRIES["sign_ste"].derivative(jax.device_put(x), clip=clip), expected)
        t = rng.standard_normal(x.shape).astype(dtype)
        cases.append((functools.partial(sign_ste, clip=clip), x, expected, t, f"sign_ste clip={clip}", None, True))
    _check_many(cases)  # every clip in one jitted program


def test_sign_ste_band_is_closed_at_the_clip(dtype):
    below, at, above = boundary_triplets([1.0], dtype)
    g = _grad(sign_ste)(jax.device_put(_padded([below, at, above, -at, -above], dtype)))
    assert_bitwise_equal(np.asarray(g)[:5], np.array([1, 1, 0, 1, 0], dtype))


def test_approx_sign_gradient(dtype):
    rng = np.random.default_rng(2)
    x = _inputs(rng, dtype, (-1.0, 1.0, -0.5, 0.5))
    expected = np_approx_sign_derivative(x)
    assert_platform_equal(ENTRIES["approx_sign"].derivative(jax.device_put(x)), expected)
    _check_gradients(approx_sign, x, expected, rng, "approx_sign")
    # The documented values: a triangle of height 2 that reaches 0 at |x| = 1.
    g = _grad(approx_sign)(jax.device_put(_padded([0.0, 0.25, -0.75, 1.0, -1.5], dtype)))
    assert_bitwise_equal(np.asarray(g)[:5], np.array([2.0, 1.5, 0.5, 0.0, 0.0], dtype))


@pytest.mark.parametrize("beta", [5.0, 1.0])
def test_swish_sign_gradient_follows_the_paper(beta, dtype):
    rng = np.random.default_rng(3)
    x = _inputs(rng, dtype)
    # All 128 inputs (the length other tests compile for); the formula is compared where finite.
    finite = np.isfinite(x.astype(np.float64))
    exact = swish_formula64(x[finite], beta)
    # The library evaluates an overflow-free rewrite in float32 and rounds once to
    # the dtype. float32: exp and the rewrite are within a few float32 ulps, and
    # near the derivative's zero crossing (|beta x| ~ 2.4) two terms of about 4
    # cancel, so a few ulps of 4 * beta remain as an absolute error. float16 and
    # bfloat16: one ulp of the dtype on top. Values below the smallest normal
    # float32 are flushed to 0; float16's subnormal spacing is 2^-24.
    eps = float(ml_dtypes.finfo(dtype).eps)
    # The platform contract adds its own ulps to both (0 on CPU): of the value, and of the cancelling terms.
    platform_ulps = CONTRACT.ulps(dtype) * eps
    rtol = (16 * 2.0**-24 if dtype == np.float32 else eps) + platform_ulps
    atol = beta * 2.0**-21 + 4 * beta * platform_ulps + (2.0**-24 if dtype == np.float16 else beta * float(TINY32))
    f = functools.partial(swish_sign, beta=beta)
    d = np.asarray(ENTRIES["swish_sign"].derivative(jax.device_put(x), beta=beta))
    for mode, g in _check_gradients(f, x, d, rng, f"swish_sign beta={beta}").items():
        assert g.dtype == dtype
        np.testing.assert_allclose(np.asarray(g, np.float64)[finite], exact, rtol=rtol, atol=atol, err_msg=mode)
        zeros = np.asarray(x, np.float64) == 0
        assert zeros.any() and (np.asarray(g, np.float64)[zeros] == beta).all(), mode  # the peak


@pytest.mark.parametrize("beta", [5.0, 1e18])
def test_swish_sign_gradient_is_zero_at_huge_inputs(beta, dtype):
    info = ml_dtypes.finfo(dtype)
    # cosh(beta x) overflows float32 from |beta x| ~ 89 on; the derivative must go to 0.
    x = _padded(np.array([info.max, -info.max, np.inf, -np.inf, 100.0, -300.0, np.nan], np.float64), dtype)
    f = functools.partial(swish_sign, beta=beta)
    for mode, g in _both(_grad(f), jax.device_put(x)).items():
        g = np.asarray(g).astype(np.float64)
        np.testing.assert_array_equal(g[:6], 0.0, err_msg=mode)
        assert np.isnan(g[6]), mode


INTEGRAL_CASES = [(sign_ste, {"clip": 1.0}, 2.0), (sign_ste, {"clip": 0.5}, 1.0), (approx_sign, {}, 2.0)] + [
    (swish_sign, {"beta": b}, 2.0) for b in (1.0, 5.0, 10.0)
]


@functools.cache
def _integral_grid_and_derivatives():
    """The grid, and every case's declared derivative on it: one jitted program for all cases, not op by op."""
    grid = np.unique(
        np.concatenate([np.linspace(-200.0, 200.0, 400_001), boundary_triplets([-1, -0.5, 0.5, 1], F32)]).astype(F32)
    )
    derivatives = jax.jit(lambda g: [ENTRIES[f.__name__].derivative(g, **p) for f, p, _ in INTEGRAL_CASES])(
        jax.device_put(grid)
    )
    return grid, [np.asarray(d, np.float64) for d in derivatives]


@pytest.mark.parametrize(("fn", "params", "area"), INTEGRAL_CASES)
def test_surrogates_integrate_to_the_jump_of_the_forward(fn, params, area):
    grid, derivatives = _integral_grid_and_derivatives()
    d = derivatives[INTEGRAL_CASES.index((fn, params, area))]
    # Trapezoid rule, spacing 1e-3, on float32 values; the tails beyond +-200 are below e^-190.
    np.testing.assert_allclose(np.trapezoid(d, grid.astype(np.float64)), area, rtol=1e-5)


# ----------------------------------------------------------------------------- magnitude_aware_sign


MAS_CASES = [((), -1), ((7,), 0), ((3, 4), 0), ((2, 3, 4), 1)]


def test_magnitude_aware_sign_on_exact_sum_data(dtype):
    cases = []
    for shape, axis in MAS_CASES:
        rng = np.random.default_rng(4)
        x = _exact_sum_data(rng, shape, dtype)
        f = functools.partial(magnitude_aware_sign, axis=axis)
        # Under jit only: the boundary test below checks magnitude_aware_sign eagerly too (op by op), for every dtype
        # and at the specials; each eager shape here would add a dozen programs per dtype on an accelerator.
        # The scale is a constant: no term from d scale / d x.
        expected = np_magnitude_aware_derivative(x, axis)
        t = rng.standard_normal(x.shape).astype(dtype)
        context = f"magnitude_aware_sign {shape} axis={axis}"
        cases.append((f, x, expected, t, context, np_magnitude_aware_sign(x, axis), False))
    _check_many(cases)  # every shape in one jitted program


def test_magnitude_aware_sign_at_boundaries_and_specials(dtype):
    # Columns (v, -v) are channels with mean |v| exactly, so each column probes
    # one point: triplets around the sign tie 0 and the clip points +-1, and specials.
    info = ml_dtypes.finfo(dtype)
    points = np.concatenate(
        [
            boundary_triplets([-1.0, 0.0, 1.0], dtype),
            np.array([np.inf, np.nan, info.max, info.smallest_normal, 0.75], np.float64).astype(dtype),
        ]
    )
    x = np.stack([points, -points])
    # Tangents +-1, +-2: a product of the smallest normal scale with a random
    # tangent would be subnormal, which XLA:CPU flushes to zero and NumPy keeps.
    rng = np.random.default_rng(5)
    t = rng.choice([-2.0, -1.0, 1.0, 2.0], x.shape).astype(dtype)
    expected = np_magnitude_aware_derivative(platform_reads(x), -1)
    forward = np_magnitude_aware_sign(platform_reads(x), -1)
    _check_gradients(magnitude_aware_sign, x, expected, rng, "boundaries", forward=forward, tangent=t)


def test_magnitude_aware_sign_reduces_every_axis_but_the_channel_axis():
    def program(x, v, s):  # every call in one jitted program, not op by op
        return (
            magnitude_aware_sign(x),
            magnitude_aware_sign(x, axis=0),
            magnitude_aware_sign(v, axis=0),
            magnitude_aware_sign(s, axis=7),
        )

    x = np.array([[1.0, -4.0, 1.0], [-3.0, 5.0, -1.0]], F32)
    by_channel, by_row, vector, scalar = jax.jit(program)(*map(jax.device_put, (x, F32([1.0, -3.0]), F32(-0.5))))
    np.testing.assert_array_equal(by_channel, [[2.0, -4.5, 1.0], [-2.0, 4.5, -1.0]])
    np.testing.assert_array_equal(by_row, [[2.0, -2.0, 2.0], [-3.0, 3.0, -3.0]])
    # Rank 0 and 1: the whole tensor, whatever the axis.
    np.testing.assert_array_equal(vector, [2.0, -2.0])
    assert float(scalar) == -0.5


def test_magnitude_aware_sign_nan_poisons_only_its_channel():
    x = np.array([[1.0, np.nan], [-3.0, 0.5]], np.float32)
    y = np.asarray(jax.jit(magnitude_aware_sign)(jax.device_put(x)))  # one program, not op by op
    np.testing.assert_array_equal(y[:, 0], [2.0, -2.0])
    assert np.isnan(y[:, 1]).all()


# ----------------------------------------------------------------------------- ternary


TERNARY_THRESHOLDS = [0.0, 0.3, 0.5, 1.0]


def test_ternary_with_a_given_threshold(dtype):
    cases = []
    for threshold in TERNARY_THRESHOLDS:
        rng = np.random.default_rng(6)
        x = _inputs(rng, dtype, (-threshold, threshold, -1.0, 1.0))
        f = functools.partial(ternary, threshold=threshold)
        t = rng.standard_normal(x.shape).astype(dtype)
        context = f"ternary threshold={threshold}"
        read = platform_reads(x)
        cases.append((f, x, np_clip_indicator(read, 1.0), t, context, np_ternary(read, threshold), True))
    _check_many(cases)  # every threshold in one jitted program


def test_ternary_default_threshold_is_0p7_mean_abs(dtype):
    cases = []
    for shape in [(7,), (3, 4), (2, 3, 5)]:
        rng = np.random.default_rng(7)
        x = _exact_sum_data(rng, shape, dtype)
        # One eager case per dtype, of the shape that the value-at-the-threshold test below calls eagerly too (its
        # op-by-op programs are shared).
        eager = shape == (7,)
        # The same as passing that threshold explicitly (it is already a float32). With a given threshold ternary
        # is elementwise: x's values padded with +0 to the length of :func:`_inputs` (its eager executables).
        threshold = float(np_ternary_threshold(x))
        given = ternary(jax.device_put(_padded(x.reshape(-1), dtype)), threshold=threshold)
        assert_bitwise_equal(given, _padded(np_ternary(x).reshape(-1), dtype))
        t = rng.standard_normal(x.shape).astype(dtype)
        cases.append((ternary, x, np_clip_indicator(x, 1.0), t, f"ternary {shape}", np_ternary(x), eager))
    _check_many(cases)  # every shape in one jitted program


def test_ternary_value_at_the_threshold_is_zero(dtype):
    # sum|x| = 10 over n = 7: Delta = fl32(10 * fl32(0.1)) = 1.0 exactly.
    x = np.array([1, -1, 1, -1, 1, -1, 4], np.float64).astype(dtype)
    assert np_ternary_threshold(x) == 1.0
    expected = np.array([0, 0, 0, 0, 0, 0, 1], np.float64).astype(dtype)
    for mode, y in _both(ternary, jax.device_put(x)).items():
        assert_bitwise_equal(y, expected, context=mode)


def test_ternary_zero_code_is_plus_zero(dtype):
    # Padded with +0 to the length of :func:`_inputs` (its eager executables); every code is +0.
    x = _padded(np.array([-0.0, 0.0, -0.25, 0.25, -0.5, 0.5], np.float64), dtype)
    y = ternary(jax.device_put(x), threshold=0.5)
    assert_bitwise_equal(y, np.zeros(128, dtype))


def test_ternary_threshold_zero_splits_subnormals_by_sign(dtype):
    below, _, above = boundary_triplets([0.0], dtype)
    # Padded with +0 to the length of :func:`_inputs` (its eager executables); +0 is in the band.
    x = _padded(np.array([below, -0.0, 0.0, above], dtype), dtype)
    # Where the platform reads subnormal inputs as zero (bfloat16 on a TPU), they fall inside the band.
    expected = np.array([0, 0, 0, 0] if dtype.name in CONTRACT.subnormal_inputs_read_as_zero else [-1, 0, 0, 1], dtype)
    for mode, y in _both(functools.partial(ternary, threshold=0.0), jax.device_put(x)).items():
        assert_bitwise_equal(y, _padded(expected, dtype), context=mode)


def test_ternary_nan_and_inf_in_the_data():
    x = np.array([0.5, np.nan, -2.0], np.float32)
    # The three calls in one jitted program, not op by op.
    with_nan, given, with_inf = jax.jit(lambda x, x_inf: (ternary(x), ternary(x, threshold=1.0), ternary(x_inf)))(
        jax.device_put(x), jax.device_put(F32([0.5, np.inf, -2.0]))
    )
    # A NaN makes the data-dependent threshold NaN: every output is NaN.
    assert np.isnan(np.asarray(with_nan)).all()
    # With a given threshold only the NaN element is NaN.
    np.testing.assert_array_equal(np.asarray(given), [0.0, np.nan, -1.0])
    # An infinity makes the threshold infinite: everything maps to 0.
    assert_bitwise_equal(np.asarray(with_inf), np.zeros(3, np.float32))


# ----------------------------------------------------------------------------- float64


@pytest.mark.needs_float64
def test_float64_when_x64_is_on():
    # float64 inputs are evaluated in float64 throughout (clip and threshold too).
    rng = np.random.default_rng(8)
    f64 = np.dtype(np.float64)
    with jax.enable_x64(True):
        x = _inputs(rng, f64, (-1.0, 1.0, -0.3, 0.3))
        data = _exact_sum_data(rng, (3, 4), f64)
        calls = {
            "sign_ste": (sign_ste, x),
            "approx_sign": (approx_sign, x),
            "swish_sign": (swish_sign, x),
            "grad sign_ste": (_grad(functools.partial(sign_ste, clip=0.3)), x),
            "grad approx_sign": (_grad(approx_sign), x),
            "grad swish_sign": (_grad(swish_sign), x),
            "ternary": (functools.partial(ternary, threshold=0.3), x),
            "mas": (magnitude_aware_sign, data),
        }
        # Every jitted call in one program, compiled once; and each eagerly.
        jitted = jax.jit(lambda inputs: {k: f(inputs[k]) for k, (f, _) in calls.items()})(
            {k: jax.device_put(v) for k, (_, v) in calls.items()}
        )
        results = {k: {"eager": f(jax.device_put(v)), "jit": jitted[k]} for k, (f, v) in calls.items()}
        ax = np.abs(x)
        for fn in (sign_ste, approx_sign, swish_sign):
            for mode, y in results[fn.__name__].items():
                assert_bitwise_equal(y, np_sign(x), context=f"{mode} {fn.__name__}")
        clipped = np.where(np.isnan(x), np.nan, np.where(ax <= 0.3, 1.0, 0.0))
        for mode, g in results["grad sign_ste"].items():
            assert_bitwise_equal(g, clipped, context=f"{mode} sign_ste")
        with np.errstate(over="ignore"):
            triangle = np.where(np.isnan(x), np.nan, np.where(ax < 1, 2 - 2 * ax, 0.0))
        for mode, g in results["grad approx_sign"].items():
            assert_bitwise_equal(g, triangle, context=f"{mode} approx_sign")
        # SwishSign: a few float64 ulps, and an absolute error of a few ulps of
        # 4 * beta where two terms cancel; 0 at the largest value and at infinity.
        finite = np.isfinite(x)
        for mode, g in results["grad swish_sign"].items():
            g = np.asarray(g)
            exact = swish_formula64(x[finite], 5.0, np.float64)
            np.testing.assert_allclose(g[finite], exact, rtol=64 * 2.0**-53, atol=5.0 * 2.0**-48, err_msg=mode)
            np.testing.assert_array_equal(g[np.isinf(x)], 0.0)
            assert g[np.argmax(x == np.finfo(np.float64).max)] == 0.0
        ternary_expected = np.where(np.isnan(x), np.nan, np.where(x > 0.3, 1.0, np.where(x < -0.3, -1.0, 0.0)))
        for mode, y in results["ternary"].items():
            assert_bitwise_equal(y, ternary_expected, context=f"{mode} ternary")
        scale = np.abs(data).sum(axis=0, keepdims=True) * (1.0 / 3)
        for mode, y in results["mas"].items():
            assert_bitwise_equal(y, scale * np.where(data >= 0, 1.0, -1.0), context=f"{mode} mas")


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan])
def test_sign_ste_clip_must_be_positive(bad):
    with pytest.raises(ValueError, match=r"sign_ste: `clip` must be a number > 0; got"):
        sign_ste(_zeros(3), clip=bad)


@pytest.mark.parametrize("bad", ["1.0", True, None, jnp.float32(1.0)])
def test_sign_ste_clip_must_be_a_real_number(bad):
    with pytest.raises(TypeError, match=r"sign_ste: `clip` must be a real number .* got"):
        sign_ste(_zeros(3), clip=bad)


@pytest.mark.parametrize("bad", [0.0, -5.0, math.inf, math.nan, 1e19, 1e-19])
def test_swish_sign_beta_range(bad):
    with pytest.raises(ValueError, match=r"swish_sign: `beta` must be a finite number in \[1e-18, 1e18\]"):
        swish_sign(_zeros(3), beta=bad)


def test_swish_sign_beta_type():
    with pytest.raises(TypeError, match=r"swish_sign: `beta` must be a real number"):
        swish_sign(_zeros(3), beta="5")


@pytest.mark.parametrize(("shape", "axis"), [((3, 4), 2), ((3, 4), -3), ((2, 3, 4), 3)])
def test_magnitude_aware_sign_axis_out_of_range(shape, axis):
    with pytest.raises(ValueError, match=rf"magnitude_aware_sign: `axis` must lie in .*got {axis}"):
        magnitude_aware_sign(_zeros(shape), axis=axis)


@pytest.mark.parametrize("bad", [1.0, True, "0", None])
def test_magnitude_aware_sign_axis_type(bad):
    with pytest.raises(TypeError, match=r"magnitude_aware_sign: `axis` must be an int; got"):
        magnitude_aware_sign(_zeros((3, 4)), axis=bad)


@pytest.mark.parametrize("bad", [-0.1, -math.inf, math.nan])
def test_ternary_threshold_range(bad):
    with pytest.raises(ValueError, match=r"ternary: `threshold` must be a number >= 0; got"):
        ternary(_zeros(3), threshold=bad)


def test_ternary_threshold_and_clip_types_and_clip_range():
    with pytest.raises(TypeError, match=r"ternary: `threshold` must be a real number"):
        ternary(_zeros(3), threshold="0.5")
    with pytest.raises(TypeError, match=r"ternary: `clip` must be a real number"):
        ternary(_zeros(3), clip=[1.0])
    with pytest.raises(ValueError, match=r"ternary: `clip` must be a number > 0; got 0.0"):
        ternary(_zeros(3), clip=0.0)


@pytest.mark.parametrize("name", list(ENTRIES))
@pytest.mark.parametrize("bad_dtype", [np.int32, np.bool_])
def test_non_floating_inputs_are_rejected(name, bad_dtype):
    with pytest.raises(TypeError, match=rf"{name}: the input must be a floating-point array"):
        ENTRIES[name].fn(_zeros((2, 3), bad_dtype))


def test_python_and_numpy_scalars_are_accepted():
    # The scalars are the estimators' own arguments inside one jitted program (compiled once, not op by op).
    values = jax.jit(
        lambda: (
            sign_ste(-2.0, clip=np.float32(0.5)),
            ternary(0.75, threshold=np.float64(0.5)),
            magnitude_aware_sign(np.float32(-3.0), axis=np.int64(0)),
        )
    )()
    assert [float(v) for v in values] == [-1.0, 1.0, -3.0]
