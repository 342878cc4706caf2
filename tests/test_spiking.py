"""The spiking family: the Heaviside step and its surrogate gradients.

Forward values are compared bit for bit with NumPy. Rational surrogates are
compared bit for bit with a NumPy emulation of the documented float32 evaluation
(one rounding per operation, then one rounding to the input dtype), and with the
textbook formula in float64 within a few float32 ulps. The sigmoid surrogate
goes through ``exp``, whose last bit differs between XLA and NumPy; it is
compared with the float64 formula within a stated tolerance.
"""

import functools
import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from stejax.estimators import spiking
from stejax.estimators.spiking import (
    heaviside,
    heaviside_atan,
    heaviside_boxcar,
    heaviside_fast_sigmoid,
    heaviside_sigmoid,
    heaviside_superspike,
    heaviside_triangular,
)

from helpers import assert_bitwise_equal, boundary_triplets, special_values

F32 = np.float32
TINY32 = np.finfo(np.float32).tiny
ENTRIES = {e.name: e for e in spiking.ENTRIES}
PUBLIC = {
    "heaviside_fast_sigmoid": heaviside_fast_sigmoid,
    "heaviside_atan": heaviside_atan,
    "heaviside_sigmoid": heaviside_sigmoid,
    "heaviside_triangular": heaviside_triangular,
    "heaviside_boxcar": heaviside_boxcar,
    "heaviside_superspike": heaviside_superspike,
}
# The surrogate name under heaviside(x, surrogate=...) and its one parameter.
RULES = {
    "heaviside_fast_sigmoid": ("fast_sigmoid", "slope"),
    "heaviside_atan": ("atan", "alpha"),
    "heaviside_sigmoid": ("sigmoid", "slope"),
    "heaviside_triangular": ("triangular", "width"),
    "heaviside_boxcar": ("boxcar", "width"),
    "heaviside_superspike": ("superspike", "beta"),
}


def _cases():
    """(entry name, params) for the defaults and every listed parameter value."""
    return [(name, p) for name, e in ENTRIES.items() for p in e.param_grid()]


CASES = _cases()


def _defaults(name):
    return ENTRIES[name].default_params()


CASE_IDS = [f"{n}-{next(iter(p.values()))}" for n, p in CASES]


# ----------------------------------------------------------------------------- NumPy references


def np_heaviside(x):
    x64 = np.asarray(x).astype(np.float64)
    return np.where(np.isnan(x64), np.nan, np.where(x64 > 0, 1.0, 0.0)).astype(x.dtype)


def _flush(v, cdt=F32):
    v = np.asarray(v, cdt)
    return np.where(np.abs(v) < np.finfo(cdt).tiny, cdt(0), v).astype(cdt)


def np_inverse_square(x, k, cdt=F32):
    """1 / (k|x| + 1)^2 evaluated as documented: (r / (r + |x|))^2, r = 1/k, in ``cdt``."""
    r = cdt(1.0 / k)
    q = r / (r + np.abs(x.astype(cdt)))
    return _flush(q * q, cdt).astype(x.dtype)


def np_atan(x, alpha, cdt=F32):
    with np.errstate(over="ignore"):
        z = cdt(math.pi * alpha / 2) * x.astype(cdt)
        d = cdt(alpha / 2) / (cdt(1) + z * z)
    return _flush(d, cdt).astype(x.dtype)


def np_triangular(x, width, cdt=F32):
    d = np.maximum(cdt(width) - np.abs(x.astype(cdt)), cdt(0)) * cdt(1.0 / (width * width))
    return _flush(d, cdt).astype(x.dtype)


def np_boxcar(x, width, cdt=F32):
    ax = np.abs(x.astype(cdt))
    d = np.where(ax <= cdt(width), 1.0 / (2.0 * width), 0.0)
    return np.where(np.isnan(ax), np.nan, d).astype(x.dtype)


EMULATED = {
    "heaviside_fast_sigmoid": lambda x, p, cdt=F32: np_inverse_square(x, p["slope"], cdt),
    "heaviside_superspike": lambda x, p, cdt=F32: np_inverse_square(x, p["beta"], cdt),
    "heaviside_atan": lambda x, p, cdt=F32: np_atan(x, p["alpha"], cdt),
    "heaviside_triangular": lambda x, p, cdt=F32: np_triangular(x, p["width"], cdt),
    "heaviside_boxcar": lambda x, p, cdt=F32: np_boxcar(x, p["width"], cdt),
}


def formula64(name, x, p, cdt=F32):
    """The textbook derivative in float64 (no rewriting), for finite x."""
    x = np.asarray(x, np.float64)
    ax = np.abs(x)
    if name == "heaviside_fast_sigmoid":
        return 1.0 / (p["slope"] * ax + 1.0) ** 2
    if name == "heaviside_superspike":
        return 1.0 / (p["beta"] * ax + 1.0) ** 2
    if name == "heaviside_atan":
        return (p["alpha"] / 2) / (1.0 + (np.pi * p["alpha"] * x / 2) ** 2)
    if name == "heaviside_sigmoid":
        # exp amplifies the rounding of slope * x by |slope x|, so that product is
        # taken rounded to the compute dtype as the library forms it; the rest is exact.
        with np.errstate(over="ignore"):
            z = (cdt(p["slope"]) * x.astype(cdt)).astype(np.float64)
            # 1 - sigmoid(z) written as sigmoid(-z), so that float64 keeps the tails.
            s, one_minus_s = 1.0 / (1.0 + np.exp(-z)), 1.0 / (1.0 + np.exp(z))
        return p["slope"] * s * one_minus_s
    if name == "heaviside_triangular":
        return np.maximum(0.0, 1.0 - ax / p["width"]) / p["width"]
    if name == "heaviside_boxcar":
        return np.where(ax <= p["width"], 1.0 / (2 * p["width"]), 0.0)
    raise AssertionError(name)


def _inputs(rng, dtype, points=()):
    """128 values: triplets around 0 and ``points``, specials, and random values over several scales.

    One length for every test, so that op-by-op (eager) executables compiled for
    one test are reused by the next.
    """
    fixed = np.concatenate([boundary_triplets((0.0, *points), dtype), special_values(dtype)])
    n = 128 - fixed.size
    rand = (rng.standard_normal(n) * rng.choice([1e-3, 0.05, 0.5, 2.0, 50.0], n)).astype(np.float32).astype(dtype)
    return np.concatenate([rand, fixed])


def _both(f, *args):
    """f(*args) eagerly and under jit."""
    return {"eager": f(*args), "jit": jax.jit(f)(*args)}


def _grad(fn):
    return jax.grad(lambda x: jnp.sum(fn(x)))


# ----------------------------------------------------------------------------- forward


@pytest.mark.parametrize("name", list(ENTRIES))
def test_forward_is_the_heaviside_step_bit_for_bit(name, dtype):
    # The forward does not depend on the parameters; probe every listed kink point.
    rng = np.random.default_rng(0)
    entry = ENTRIES[name]
    points = sorted({p for params in entry.param_grid() for p in entry.boundaries(**params)})
    x = _inputs(rng, dtype, points)
    for mode, y in _both(PUBLIC[name], jnp.asarray(x)).items():
        assert y.dtype == dtype
        assert_bitwise_equal(y, np_heaviside(x), context=f"{name} {mode}")
    assert_bitwise_equal(entry.forward(jnp.asarray(x)), np_heaviside(x), context=f"{name} forward")


def test_zeros_map_to_plus_zero_and_subnormals_keep_their_side(dtype):
    below, zero, above = boundary_triplets([0.0], dtype)  # -min subnormal, +0.0, +min subnormal
    x = np.array([-0.0, zero, below, above, np.inf, -np.inf, np.nan], np.float64).astype(dtype)
    expected = np.array([0.0, 0.0, 0.0, 1.0, 1.0, 0.0, np.nan]).astype(dtype)
    for mode, y in _both(heaviside, jnp.asarray(x)).items():
        assert_bitwise_equal(y, expected, context=mode)


# ----------------------------------------------------------------------------- derivatives


@pytest.mark.parametrize("name", list(EMULATED))
def test_rational_surrogates_match_the_float32_emulation_bit_for_bit(name, dtype):
    entry = ENTRIES[name]
    cases = []
    for params in entry.param_grid():
        rng = np.random.default_rng(1)
        x = _inputs(rng, dtype, entry.boundaries(**params))
        t = rng.standard_normal(x.shape).astype(dtype)
        cases.append((params, functools.partial(PUBLIC[name], **params), x, t))

    def program(inputs):
        # Every listed parameter's gradient and jvp in one jitted program, compiled once.
        return [(_grad(fn)(x), jax.jvp(fn, (x,), (t,))) for (_, fn, _, _), (x, t) in zip(cases, inputs)]

    jitted = jax.jit(program)([(jnp.asarray(x), jnp.asarray(t)) for _, _, x, t in cases])
    for (params, fn, x, t), (g_jit, (y, ty)) in zip(cases, jitted, strict=True):
        expected = EMULATED[name](x, params)
        xj = jnp.asarray(x)
        context = f"{name}{params}"
        assert_bitwise_equal(entry.derivative(xj, **params), expected, context=f"derivative {context}")
        for mode, g in {"eager": _grad(fn)(xj), "jit": g_jit}.items():
            assert g.dtype == dtype
            assert_bitwise_equal(g, expected, context=f"grad {mode} {context}")
        assert ty.dtype == y.dtype == dtype
        # One product of two dtype values, rounded once (NumPy and ml_dtypes round likewise).
        assert_bitwise_equal(ty, expected * t, context=f"jvp {context}")


# The rational rules are checked bit for bit at every listed parameter above; here
# their defaults suffice. The sigmoid rule is checked only here, at every value.
TEXTBOOK = [
    (c, i) for c, i in zip(CASES, CASE_IDS, strict=True) if c[0] == "heaviside_sigmoid" or c[1] == _defaults(c[0])
]


@pytest.mark.parametrize(("name", "params"), [c for c, _ in TEXTBOOK], ids=[i for _, i in TEXTBOOK])
def test_surrogates_follow_the_textbook_formula(name, params, dtype):
    rng = np.random.default_rng(2)
    entry = ENTRIES[name]
    x = _inputs(rng, dtype, entry.boundaries(**params))
    # Evaluated on all 128 inputs (the length other tests compile for) and compared where finite.
    finite = np.isfinite(x.astype(np.float64))
    fn = functools.partial(PUBLIC[name], **params)
    exact = formula64(name, x[finite], params)
    # The library evaluates in float32 and rounds once to the dtype. float32: the
    # rewritten forms and XLA's exp are within a few float32 ulps of the exact
    # value (the rounded constants 1/k, pi*alpha/2 and 1/w^2 add one ulp each).
    # float16 and bfloat16: that float32 value, rounded once, is within one ulp
    # of the dtype of the exact value. atol covers float16's subnormal spacing and
    # results below the smallest normal float32, which are flushed to 0; the
    # sigmoid surrogate also flushes exp(-|kx|) there, so up to slope * that.
    eps = float(ml_dtypes.finfo(dtype).eps)
    rtol = 8 * 2.0**-24 if dtype == np.float32 else eps
    atol = float(TINY32) * params.get("slope", 1.0) if dtype != np.float16 else 2.0**-24
    for mode, g in _both(_grad(fn), jnp.asarray(x)).items():
        np.testing.assert_allclose(
            np.asarray(g, np.float64)[finite], exact, rtol=rtol, atol=atol, err_msg=f"{mode} {name}{params}"
        )


@pytest.mark.parametrize("name", list(ENTRIES))
def test_jvp_is_the_declared_derivative_times_the_tangent(name, dtype):
    rng = np.random.default_rng(3)
    x = jnp.asarray(_inputs(rng, dtype))
    t = jnp.asarray(rng.standard_normal(x.shape).astype(dtype))
    d = np.asarray(ENTRIES[name].derivative(x))
    assert d.dtype == dtype
    expected = d * np.asarray(t)
    ty = jax.jit(lambda x, t: jax.jvp(PUBLIC[name], (x,), (t,))[1])(x, t)
    assert_bitwise_equal(ty, expected, context=name)


@pytest.mark.parametrize("name", list(ENTRIES))
def test_huge_inputs_give_zero_gradients_and_nan_stays_nan(name, dtype):
    info = ml_dtypes.finfo(dtype)
    x = np.array([info.max, -info.max, np.inf, -np.inf, np.nan], np.float64).astype(dtype)
    x = np.concatenate([x, np.zeros(128 - x.size, dtype)])  # the length of _inputs: its executables
    for mode, g in _both(_grad(PUBLIC[name]), jnp.asarray(x)).items():
        g = np.asarray(g).astype(np.float64)
        np.testing.assert_array_equal(g[:4], 0.0, err_msg=f"{mode} {name}")
        assert np.isnan(g[4]), f"{mode} {name}: the gradient at NaN is {g[4]}, not NaN"


@pytest.mark.needs_float64
@pytest.mark.parametrize("name", list(ENTRIES))
def test_float64_when_x64_is_on(name):
    # float64 inputs are evaluated in float64 throughout.
    rng = np.random.default_rng(5)
    entry = ENTRIES[name]
    params = entry.default_params()
    with jax.enable_x64(True):
        x = _inputs(rng, np.dtype(np.float64), entry.boundaries(**params))
        xj = jnp.asarray(x)
        # The jitted value and gradient in one program, compiled once.
        y_jit, g_jit = jax.jit(lambda x: (PUBLIC[name](x), _grad(PUBLIC[name])(x)))(xj)
        for mode, y in {"eager": PUBLIC[name](xj), "jit": y_jit}.items():
            assert_bitwise_equal(y, np_heaviside(x), context=f"{mode} {name}")
        for mode, g in {"eager": _grad(PUBLIC[name])(xj), "jit": g_jit}.items():
            assert g.dtype == np.float64
            if name in EMULATED:
                assert_bitwise_equal(g, EMULATED[name](x, params, np.float64), context=f"{mode} {name}")
            else:  # exp: within a few float64 ulps; below the smallest normal, flushed
                finite = np.isfinite(x)
                exact = formula64(name, x[finite], params, np.float64)
                atol = params["slope"] * np.finfo(np.float64).tiny
                np.testing.assert_allclose(np.asarray(g)[finite], exact, rtol=64 * 2.0**-53, atol=atol)
        huge = jnp.asarray(np.array([np.finfo(np.float64).max, -np.inf]))
        np.testing.assert_array_equal(_grad(PUBLIC[name])(huge), [0.0, 0.0])


@pytest.mark.parametrize("name", list(ENTRIES))
def test_peak_values(name):
    peaks = {
        "heaviside_fast_sigmoid": 1.0,
        "heaviside_superspike": 1.0,
        "heaviside_atan": 1.0,  # alpha / 2
        "heaviside_sigmoid": 6.25,  # slope / 4
        "heaviside_triangular": 1.0,  # 1 / width
        "heaviside_boxcar": 1.0,  # 1 / (2 width)
    }
    g = _grad(PUBLIC[name])(jnp.array([0.0, -0.0], jnp.float32))
    np.testing.assert_array_equal(np.asarray(g), [peaks[name]] * 2)


# The area under each surrogate, in terms of its parameters, as the catalog states it.
INTEGRALS = {
    "heaviside_fast_sigmoid": ("2/slope", lambda p: 2.0 / p["slope"]),
    "heaviside_superspike": ("2/beta", lambda p: 2.0 / p["beta"]),
    "heaviside_atan": ("1", lambda p: 1.0),
    "heaviside_sigmoid": ("1", lambda p: 1.0),
    "heaviside_triangular": ("1", lambda p: 1.0),
    "heaviside_boxcar": ("1", lambda p: 1.0),
}


def _integration_grid(points):
    """A float32 grid over [-5e9, 5e9]: spacing 1.5e-7 at 0, growing like sinh; kink points added."""
    x = 1e-3 * np.sinh(np.linspace(-30.0, 30.0, 400_001))
    kinks = boundary_triplets(points, np.float32).astype(np.float64)
    return np.unique(np.concatenate([x, kinks]).astype(np.float32))


def _derivative_on(entry, grid, params):
    """The declared derivative on ``grid``, evaluated on one padded length for every grid (one set of executables)."""
    padded = np.concatenate([grid, np.zeros(400_100 - grid.size, np.float32)])
    return np.asarray(entry.derivative(jnp.asarray(padded), **params), np.float64)[: grid.size]


@pytest.mark.parametrize(("name", "params"), CASES, ids=CASE_IDS)
def test_surrogate_integrates_to_the_documented_area(name, params):
    entry = ENTRIES[name]
    text, area = INTEGRALS[name]
    assert entry.integral == text
    grid = _integration_grid(entry.boundaries(**params))
    d = _derivative_on(entry, grid, params)
    total = np.trapezoid(d, grid.astype(np.float64))
    # float32 derivative values (relative error ~1e-7) and the trapezoid rule on
    # this grid; the tails beyond 5e9 hold less than 1e-12 of the area.
    np.testing.assert_allclose(total, area(params), rtol=2e-6, err_msg=f"{name}{params}")


# ----------------------------------------------------------------------------- heaviside(x, surrogate=...)


@pytest.mark.parametrize("name", list(ENTRIES))
def test_heaviside_dispatches_to_the_named_surrogate(name):
    rule, param = RULES[name]
    value = ENTRIES[name].params[0].values[1]
    x = jnp.asarray(np.random.default_rng(4).standard_normal(16).astype(np.float32))
    direct = PUBLIC[name](x, **{param: value})
    via = heaviside(x, rule, **{param: value})
    assert_bitwise_equal(via, np.asarray(direct), context=name)
    g_direct = _grad(functools.partial(PUBLIC[name], **{param: value}))(x)
    g_via = _grad(lambda x: heaviside(x, surrogate=rule, **{param: value}))(x)
    assert_bitwise_equal(g_via, np.asarray(g_direct), context=name)


def test_heaviside_defaults_to_fast_sigmoid():
    x = jnp.linspace(-1.0, 1.0, 9)
    assert_bitwise_equal(_grad(heaviside)(x), np.asarray(_grad(heaviside_fast_sigmoid)(x)))


@pytest.mark.parametrize("bad", ["nope", "FastSigmoid", 3, None])
def test_unknown_surrogate_is_a_value_error_listing_the_known_ones(bad):
    with pytest.raises(ValueError, match=r"heaviside: unknown surrogate .*fast_sigmoid.*atan.*superspike"):
        heaviside(jnp.zeros(3), surrogate=bad)


def test_unknown_parameter_is_a_type_error_naming_it():
    with pytest.raises(TypeError, match=r"heaviside: surrogate 'atan' takes .*'alpha'.*unexpected 'slope'"):
        heaviside(jnp.zeros(3), surrogate="atan", slope=3.0)
    with pytest.raises(TypeError, match=r"'boxcar'.*unexpected 'beta', 'slope'"):
        heaviside(jnp.zeros(3), "boxcar", slope=1.0, beta=2.0)


@pytest.mark.parametrize("name", list(ENTRIES))
@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan, 1e19, 1e-19])
def test_out_of_range_parameters_are_value_errors(name, bad):
    _, param = RULES[name]
    with pytest.raises(ValueError, match=rf"{name}: `{param}` must be a finite number in \[1e-18, 1e\+18\]"):
        PUBLIC[name](jnp.zeros(3), **{param: bad})


@pytest.mark.parametrize("name", list(ENTRIES))
@pytest.mark.parametrize("bad", ["1.0", True, None, jnp.float32(2.0)])
def test_non_real_parameters_are_type_errors(name, bad):
    _, param = RULES[name]
    with pytest.raises(TypeError, match=rf"{name}: `{param}` must be a real number"):
        PUBLIC[name](jnp.zeros(3), **{param: bad})


def test_numpy_scalars_are_accepted_as_parameters():
    x = jnp.array([0.0, 0.1])
    assert_bitwise_equal(
        _grad(lambda x: heaviside_atan(x, alpha=np.float32(4.0)))(x),
        np.asarray(_grad(lambda x: heaviside_atan(x, alpha=4.0))(x)),
    )


@pytest.mark.parametrize("name", list(ENTRIES))
@pytest.mark.parametrize("bad_dtype", [np.int32, np.bool_])
def test_non_floating_inputs_are_rejected(name, bad_dtype):
    with pytest.raises(TypeError, match=rf"{name}: the input must be a floating-point array"):
        PUBLIC[name](jnp.zeros(3, bad_dtype))


def test_shapes_and_ranks_are_kept(dtype):
    for shape in [(), (3,), (2, 3, 4)]:
        x = jnp.zeros(shape, dtype)
        y = heaviside(x, "triangular")
        assert y.shape == shape and y.dtype == dtype
