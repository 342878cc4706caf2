"""Scale calibration against independent NumPy references.

The references follow the documented arithmetic: float32 operations (one IEEE
rounding each, as NumPy does them), the scale rounded to the input dtype and
floored at its smallest normal number.
"""

from __future__ import annotations

import math

import jax
import ml_dtypes
import numpy as np
import pytest

from stejax.estimators.calibration import absmax_scale, minmax_scale, mse_scale, percentile_scale
from stejax.estimators.uniform import fake_quant

from helpers import assert_bitwise_equal

F32 = np.float32


# --- references --------------------------------------------------------------------------------


def slices(x, axis=None, group_size=None):
    """x as scale_shape + (m,): one calibration slice per row of the last axis."""
    if group_size is not None:
        return x.reshape(*x.shape[:-1], x.shape[-1] // group_size, group_size)
    if axis is None:
        return x.reshape(1, -1)[0]
    return np.moveaxis(x, axis, 0).reshape(x.shape[axis], -1)


def floor_scale(scale_f32, dtype):
    s = scale_f32.astype(dtype)
    tiny = ml_dtypes.finfo(dtype).tiny
    return np.where(s.astype(np.float64) < float(tiny), np.asarray(tiny, dtype), s).astype(dtype)


def qmax_of(bits, signed):
    return 2 ** (bits - 1) - 1 if signed else 2**bits - 1


def ref_absmax(x, *, bits, signed=True, axis=None, group_size=None):
    amax = np.abs(slices(x, axis, group_size)).max(axis=-1).astype(F32)
    return floor_scale(amax * F32(1 / qmax_of(bits, signed)), x.dtype)


def ref_minmax(x, *, bits, axis=None, group_size=None):
    n = 2**bits - 1
    xs = slices(x, axis, group_size).astype(F32)
    lo = np.minimum(xs.min(axis=-1), F32(0))
    hi = np.maximum(xs.max(axis=-1), F32(0))
    scale = floor_scale((hi - lo) * F32(1 / n), x.dtype)
    zp = -np.round(lo * (F32(1) / scale.astype(F32)))
    return scale, np.minimum(zp, F32(n)).astype(x.dtype) + np.zeros((), x.dtype)


def ref_percentile(x, *, bits, percentile, signed=True, axis=None, group_size=None):
    a = np.sort(np.abs(slices(x, axis, group_size)).astype(F32), axis=-1)
    m = a.shape[-1]
    k = (m - 1) * (percentile / 100)
    i = min(math.floor(k), m - 1)
    value = a[..., i]
    if k > i:
        value = value + (a[..., min(i + 1, m - 1)] - value) * F32(k - i)
    return floor_scale(value * F32(1 / qmax_of(bits, signed)), x.dtype)


def ref_quantize(xs, scale, *, bits, signed):
    """fake_quant's forward with zero point 0; scale broadcastable against xs."""
    qmin, qmax = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    s = scale.astype(F32)
    r = np.round(xs.astype(F32) * (F32(1) / s))
    return (np.clip(r, qmin, qmax) * s).astype(xs.dtype)


def quantization_error(xs, scale, *, bits, signed):
    """Per-slice squared error of quantizing with ``scale``, in float64."""
    q = ref_quantize(xs, scale[..., None], bits=bits, signed=signed)
    return ((q.astype(np.float64) - xs.astype(np.float64)) ** 2).sum(axis=-1)


def mse_candidates(x, *, bits, signed, axis, group_size, candidates):
    """The candidate scales, largest first: shape (C,) + scale_shape."""
    amax = np.abs(slices(x, axis, group_size)).max(axis=-1).astype(F32)
    base = amax * F32(1 / qmax_of(bits, signed))
    fractions = (np.arange(candidates, 0, -1) / candidates).astype(F32)
    return np.stack([floor_scale(base * f, x.dtype) for f in fractions])


# --- granularity and values --------------------------------------------------------------------

GRANULARITIES = [
    pytest.param(None, None, (), id="per-tensor"),
    pytest.param(0, None, (4,), id="axis0"),
    pytest.param(-1, None, (12,), id="axis-1"),
    pytest.param(1, None, (3,), id="axis1"),
    pytest.param(None, 4, (4, 3, 3), id="groups-of-4"),
]


def _sample(dtype, seed=0, shape=(4, 3, 12)):
    rng = np.random.default_rng(seed)
    return (rng.standard_t(3, size=shape) * 0.7).astype(dtype)


@pytest.mark.parametrize(
    ("axis", "group_size", "shape", "bits", "signed"),
    [(*g.values, 8, True) for g in GRANULARITIES] + [(None, 4, (4, 3, 3), 4, False)],
    ids=[*(g.id for g in GRANULARITIES), "unsigned-groups"],
)
def test_absmax_scale(dtype, axis, group_size, shape, bits, signed):
    x = _sample(dtype)
    s = absmax_scale(x, bits=bits, signed=signed, axis=axis, group_size=group_size)
    assert s.shape == shape and s.dtype == dtype
    assert_bitwise_equal(s, ref_absmax(x, bits=bits, signed=signed, axis=axis, group_size=group_size))


@pytest.mark.parametrize(("axis", "group_size", "shape"), GRANULARITIES)
def test_minmax_scale(dtype, axis, group_size, shape):
    x = _sample(dtype, seed=1)
    x[0] = np.abs(x[0])  # one slice (or row of slices) without negative values: zero point 0
    s, z = minmax_scale(x, bits=4, axis=axis, group_size=group_size)
    assert s.shape == shape and z.shape == shape and s.dtype == dtype and z.dtype == dtype
    s_ref, z_ref = ref_minmax(x, bits=4, axis=axis, group_size=group_size)
    assert_bitwise_equal(s, s_ref, context="scale")
    assert_bitwise_equal(z, z_ref, context="zero point")
    assert not np.signbit(np.asarray(z)).any()
    # The calibrated grid covers [min, max] up to half a step at each end.
    xs = slices(x, axis, group_size).astype(np.float64)
    s64, z64 = np.asarray(s, np.float64), np.asarray(z, np.float64)
    assert (xs.min(axis=-1) >= (0 - z64 - 0.5) * s64 * (1 + 1e-2)).all()
    assert (xs.max(axis=-1) <= (15 - z64 + 0.5) * s64 * (1 + 1e-2)).all()


@pytest.mark.parametrize(
    ("axis", "group_size", "shape", "percentile"),
    [(*g.values, 99.0) for g in GRANULARITIES] + [(1, None, (3,), 50.0), (1, None, (3,), 100.0)],
    ids=[*(g.id for g in GRANULARITIES), "median", "max"],
)
def test_percentile_scale(dtype, axis, group_size, shape, percentile):
    x = _sample(dtype, seed=2)
    s = percentile_scale(x, bits=8, percentile=percentile, axis=axis, group_size=group_size)
    assert s.shape == shape and s.dtype == dtype
    ref = ref_percentile(x, bits=8, percentile=percentile, axis=axis, group_size=group_size)
    assert_bitwise_equal(s, ref)
    if percentile == 100.0:
        assert_bitwise_equal(s, absmax_scale(x, bits=8, axis=axis, group_size=group_size), context="100 = absmax")


def test_percentile_scale_agrees_with_numpy_percentile(dtype):
    # The interpolation runs in float32 with t rounded to float32, NumPy's in float64:
    # they agree to a few float32 ulps, at most one ulp of the dtype after the cast.
    x = _sample(dtype, seed=3, shape=(5, 37))
    s = np.asarray(percentile_scale(x, bits=8, percentile=99.0, axis=0)).astype(np.float64)
    expected = np.percentile(np.abs(x.astype(np.float64)), 99.0, axis=1, method="linear") / 127
    eps = float(ml_dtypes.finfo(dtype).eps)
    np.testing.assert_allclose(s, expected, rtol=eps + 1e-6)


@pytest.mark.parametrize(
    ("axis", "group_size", "shape", "bits", "signed"),
    [(*g.values, 4, True) for g in GRANULARITIES] + [(0, None, (4,), 3, False)],
    ids=[*(g.id for g in GRANULARITIES), "unsigned"],
)
def test_mse_scale(dtype, axis, group_size, shape, bits, signed):
    x = _sample(dtype, seed=4)
    if not signed:
        x = np.abs(x)
    s = mse_scale(x, bits=bits, signed=signed, axis=axis, group_size=group_size, candidates=40)
    assert s.shape == shape and s.dtype == dtype
    xs = slices(x, axis, group_size)
    cands = mse_candidates(x, bits=bits, signed=signed, axis=axis, group_size=group_size, candidates=40)
    errors = np.stack([quantization_error(xs, c, bits=bits, signed=signed) for c in cands])
    s64 = np.asarray(s).astype(np.float64)
    # The result is one of the candidates, and the best one: the library sums the
    # errors in float32 in XLA's order, so near-ties may resolve either way (rtol 1e-5).
    assert (cands.astype(np.float64) == s64).any(axis=0).all()
    chosen = quantization_error(xs, np.asarray(s), bits=bits, signed=signed)
    np.testing.assert_array_less(chosen, errors.min(axis=0) * (1 + 1e-5) + 1e-12)
    assert (chosen <= errors[0] * (1 + 1e-5) + 1e-12).all(), "never worse than absmax"


def test_mse_scale_beats_absmax_on_heavy_tails():
    rng = np.random.default_rng(5)
    x = rng.standard_t(2, size=(8, 256)).astype(F32)
    for bits in (3, 4):
        s_mse = mse_scale(x, bits=bits, axis=0)
        s_max = absmax_scale(x, bits=bits, axis=0)
        e_mse = quantization_error(x, np.asarray(s_mse), bits=bits, signed=True)
        e_max = quantization_error(x, np.asarray(s_max), bits=bits, signed=True)
        assert (e_mse <= e_max).all()
        assert e_mse.sum() < 0.9 * e_max.sum(), "clipping the tails should pay on a t(2) sample"
        assert (np.asarray(s_mse) <= np.asarray(s_max)).all()


def test_mse_scale_with_one_candidate_is_absmax(dtype):
    x = _sample(dtype, seed=6)
    assert_bitwise_equal(mse_scale(x, bits=4, axis=1, candidates=1), absmax_scale(x, bits=4, axis=1))


def test_mse_scale_under_jit_and_vmap():
    x = _sample(np.float32, seed=7)
    eager = mse_scale(x, bits=4, axis=0)
    jitted = jax.jit(lambda x: mse_scale(x, bits=4, axis=0))(x)
    np.testing.assert_array_equal(jitted, eager)
    batched = jax.vmap(lambda x: mse_scale(x, bits=4))(x)
    np.testing.assert_array_equal(batched, eager)


# --- floors and application --------------------------------------------------------------------


@pytest.mark.parametrize("name", ["absmax", "minmax", "percentile", "mse"])
def test_all_zero_slices_get_a_positive_scale(dtype, name):
    x = _sample(dtype, seed=8, shape=(3, 8))
    x[1] = 0
    x[2] = -0.0
    calibrate = {
        "absmax": lambda x: (absmax_scale(x, bits=8, axis=0), 0.0),
        "minmax": lambda x: minmax_scale(x, bits=8, axis=0),
        "percentile": lambda x: (percentile_scale(x, bits=8, axis=0), 0.0),
        "mse": lambda x: (mse_scale(x, bits=8, axis=0, candidates=10), 0.0),
    }[name]
    s, z = calibrate(x)
    tiny = np.asarray(ml_dtypes.finfo(dtype).tiny, dtype)
    assert_bitwise_equal(np.asarray(s)[1:], np.stack([tiny, tiny]))
    assert (np.asarray(s).astype(np.float64) > 0).all()
    signed = name != "minmax"
    y = np.asarray(fake_quant(x, s, z if np.ndim(z) else 0.0, bits=8, signed=signed, axis=0))
    assert np.isfinite(y.astype(np.float64)).all()
    assert (y[1:].astype(np.float64) == 0).all()


def test_group_scales_apply_through_a_reshape(dtype):
    x = _sample(dtype, seed=9, shape=(3, 16))
    s = absmax_scale(x, bits=4, group_size=8)
    assert s.shape == (3, 2)
    y = fake_quant(x.reshape(-1, 8), s.reshape(-1), bits=4, axis=0).reshape(x.shape)
    expected = ref_quantize(x.reshape(3, 2, 8), np.asarray(s)[..., None], bits=4, signed=True).reshape(3, 16)
    assert_bitwise_equal(y, expected)
    # absmax does not clip: every group's largest magnitude lands on a level within half a step.
    err = np.abs(np.asarray(y, np.float64) - x.astype(np.float64)).reshape(3, 2, 8)
    assert (err <= np.asarray(s, np.float64)[..., None] * 0.5 * (1 + 1e-2)).all()


def test_minmax_is_unsigned_and_covers_zero():
    x = np.array([2.0, 3.0, 5.0], F32)  # all positive: the range is widened to [0, 5]
    s, z = minmax_scale(x, bits=8)
    assert float(z) == 0.0 and not np.signbit(np.asarray(z))
    assert float(s) == np.float32(5.0) * np.float32(1 / 255)
    s, z = minmax_scale(-x, bits=8)  # all negative: [-5, 0], zero point at the top
    assert float(z) == 255.0


# --- errors ------------------------------------------------------------------------------------

X = np.ones((2, 6), F32)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (
            lambda: absmax_scale(X, bits=8, axis=2),
            ValueError,
            r"absmax_scale: axis must be None or an int in",
        ),
        (lambda: absmax_scale(X, bits=8, axis="0"), TypeError, r"absmax_scale: axis must be None or an int"),
        (lambda: absmax_scale(X, bits=1), ValueError, r"absmax_scale: bits must be an int in \[2, 16\]"),
        (lambda: absmax_scale(X, bits=8.0), TypeError, r"absmax_scale: bits must be an int"),
        (lambda: absmax_scale(X, bits=8, signed=None), TypeError, r"absmax_scale: signed must be a bool"),
        (
            lambda: absmax_scale(X, bits=8, group_size=4),
            ValueError,
            r"group_size must be a positive int dividing the last axis of x; got group_size=4 for x of shape",
        ),
        (lambda: absmax_scale(X, bits=8, group_size=0), ValueError, r"group_size must be a positive int"),
        (
            lambda: absmax_scale(X, bits=8, group_size=2.0),
            TypeError,
            r"group_size must be None or a positive",
        ),
        (lambda: absmax_scale(np.float32(1), bits=8, group_size=1), ValueError, r"shape \(\)"),
        (lambda: absmax_scale(X, bits=8, axis=0, group_size=2), ValueError, r"not both"),
        (lambda: absmax_scale(np.arange(4), bits=8), TypeError, r"absmax_scale: x must be a floating"),
        (lambda: absmax_scale(np.zeros((0, 3), F32), bits=8), ValueError, r"x must not be empty"),
        (lambda: minmax_scale(X, bits=0), ValueError, r"minmax_scale: bits must be an int in \[1, 16\]"),
        (lambda: minmax_scale(X, bits=8, axis=-3), ValueError, r"minmax_scale: axis must be"),
        (lambda: minmax_scale(X, bits=8, group_size=5), ValueError, r"minmax_scale: group_size must"),
        (lambda: percentile_scale(X, bits=8, percentile=0), ValueError, r"percentile must be in \(0, 100\]"),
        (lambda: percentile_scale(X, bits=8, percentile=101), ValueError, r"got 101"),
        (lambda: percentile_scale(X, bits=8, percentile="99"), TypeError, r"percentile must be a float"),
        (lambda: mse_scale(X, bits=8, candidates=0), ValueError, r"mse_scale: candidates must be a positive"),
        (
            lambda: mse_scale(X, bits=8, candidates=2.5),
            TypeError,
            r"mse_scale: candidates must be a positive",
        ),
        (lambda: mse_scale(X, bits=17), ValueError, r"mse_scale: bits must be an int in \[2, 16\]"),
    ],
)
def test_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()
