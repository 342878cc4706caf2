"""The uniform quantizers against independent NumPy references.

Every reference below is written from the documented formula, in the documented
operation order: float32 arithmetic (one IEEE rounding per operation, as NumPy
does it) and one cast to the input dtype at the end. Tangents are compared
against ``partial * tangent`` rounded once to the dtype, which is what XLA's
multiply in that dtype gives.

Inputs are padded to one length, so that the operations XLA compiles for one test
are reused by the next.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from stejax.estimators import uniform
from stejax.estimators._core import surrogate
from stejax.estimators.uniform import dorefa_activations, dorefa_weights, fake_quant, lsq, lsq_plus, pact

from helpers import assert_bitwise_equal, boundary_triplets, special_values

BF16 = np.dtype(ml_dtypes.bfloat16)
N = 192


# --- references --------------------------------------------------------------------------------


def _c(dtype):
    """The compute dtype of the documented arithmetic."""
    return np.float64 if np.dtype(dtype) == np.float64 else np.float32


def _flush(a):
    """XLA on CPU flushes subnormals to zero, in the inputs and results of its arithmetic.

    A bfloat16 or float32 subnormal (float16 subnormals are normal float32 numbers)
    enters every operation as a zero of its sign, and a subnormal float32 result
    leaves it as one; the boundary triplets around 0 contain such values.
    """
    a = np.asarray(a)
    return np.where(np.abs(a) < np.finfo(a.dtype).tiny, a * a.dtype.type(0), a)


def _up(x):
    return _flush(np.asarray(x).astype(_c(x.dtype)))


def _clip(v, lo, hi):
    return np.where(v < lo, lo, np.where(v > hi, hi, v))


def _grid(bits, signed, narrow_range=False):
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    return lo + int(narrow_range), hi


def _lsq_grid(bits, signed):
    return (2 ** (bits - 1), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)


@np.errstate(over="ignore", invalid="ignore")
def ref_fake_quant(x, scale, zero_point=0.0, *, bits, signed=True, narrow_range=False):
    """(y, dy/dx); scale and zero_point already broadcastable against x."""
    c = _c(x.dtype)
    qmin, qmax = _grid(bits, signed, narrow_range)
    s = np.asarray(scale).astype(c)
    z = np.asarray(zero_point).astype(c)
    r = np.round(_flush(_up(x) * (c(1) / s)))
    # The documented evaluation of (clip(r + z, qmin, qmax) - z) s: the bounds shift.
    lo, hi = c(qmin) - z, c(qmax) - z
    y = _flush(_clip(r, lo, hi) * s).astype(x.dtype)
    return y, ((r >= lo) & (r <= hi)).astype(x.dtype)


@np.errstate(over="ignore", invalid="ignore")
def ref_lsq(x, step, offset=None, *, bits, signed, grad_scale=None):
    """(y, dy/dx, dy/dstep[, dy/doffset]); step and offset broadcastable against x."""
    c = _c(x.dtype)
    qn, qp = _lsq_grid(bits, signed)
    s = np.asarray(step).astype(c)
    b = c(0) if offset is None else np.asarray(offset).astype(c)
    v = _flush((_up(x) - b) * (c(1) / s))
    y = _flush(np.round(_clip(v, c(-qn), c(qp))) * s)
    if offset is not None:
        y = y + b
        y = np.where(y == 0, c(0), y)  # documented: a zero result is +0.0
    g = grad_scale if grad_scale is not None else 1 / math.sqrt((x.size // np.size(step)) * qp)
    g = c(g)
    inside = (v >= -qn) & (v <= qp)
    # Documented: a NaN input has all partials 0.
    frac = np.where(np.isnan(v), c(0), np.round(v) - v)
    d_step = _flush(np.where(v < -qn, c(-qn), np.where(v > qp, c(qp), frac)) * g)
    out = [y.astype(x.dtype), inside.astype(x.dtype), d_step.astype(x.dtype)]
    if offset is not None:
        out.append(np.where(inside | np.isnan(v), c(0), g).astype(x.dtype))
    return tuple(out)


@np.errstate(over="ignore", invalid="ignore")
def ref_pact(x, alpha, *, bits):
    c = _c(x.dtype)
    a = np.asarray(alpha).astype(c)
    step = a * c(1 / (2**bits - 1))
    xc = _up(x)
    y = np.round(_clip(xc, c(0), a) * (c(1) / step)) * step
    return y.astype(x.dtype), ((xc >= 0) & (xc < a)).astype(x.dtype), (xc >= a).astype(x.dtype)


@np.errstate(over="ignore", invalid="ignore")
def ref_dorefa_activations(x, *, bits):
    c = _c(x.dtype)
    n = 2**bits - 1
    xc = _up(x)
    y = np.round(_clip(xc, c(0), c(1)) * c(n)) * c(1 / n)
    return y.astype(x.dtype), ((xc >= 0) & (xc <= 1)).astype(x.dtype)


@np.errstate(over="ignore", invalid="ignore")
def ref_dorefa_weights(w, t, *, bits):
    """DoReFa's weight transform given t = tanh(w) in the compute dtype."""
    c = _c(w.dtype)
    n = 2**bits - 1
    m = np.max(np.abs(t))
    m = c(1) if m == 0 else m
    u = (t + m) * (c(1) / (c(2) * m))
    y = (c(2) * np.round(u * c(n)) - c(n)) * c(1 / n)
    d = (c(1) - t) * (c(1) + t) * (c(1) / m)
    return y.astype(w.dtype), d.astype(w.dtype)


@np.errstate(over="ignore", invalid="ignore")
def ref_product(partial, tangent):
    """partial * tangent rounded once to their dtype (exact in float64 before the cast)."""
    dt = np.asarray(partial).dtype
    p = np.asarray(partial).astype(np.float64) * np.asarray(tangent).astype(np.float64)
    # XLA multiplies float16 and bfloat16 in float32, whose subnormal results it flushes.
    p = np.where(np.abs(p) < np.finfo(np.float32).tiny, p * 0, p)
    return p.astype(dt)


def assert_tangent_equal(actual, expected, *, context=""):
    """Bitwise, except that +0.0 and -0.0 are equal.

    Where a partial is a 0/1 mask, XLA may evaluate ``mask * tangent`` as a select
    under jit and give +0.0 where the product is -0.0; the sign of a zero tangent
    carries nothing.
    """
    actual = np.asarray(actual)
    expected = np.broadcast_to(np.asarray(expected, actual.dtype), actual.shape)
    expected = np.where((actual == 0) & (expected == 0), actual, expected).astype(actual.dtype)
    assert_bitwise_equal(actual, expected, context=context)


def assert_sum_close(actual, partials, *, context=""):
    """A gradient that XLA sums in the dtype, in an order of its choosing.

    Bound: n roundings of at most one unit (eps) of the running sum each, whose
    magnitude is at most the sum of the absolute terms.
    """
    p = np.asarray(partials).astype(np.float64)
    exact = p.sum()
    eps = float(ml_dtypes.finfo(np.asarray(partials).dtype).eps)
    bound = p.size * eps * np.abs(p).sum() + 1e-30
    assert abs(float(actual) - exact) <= bound, f"{context}: {float(actual)} vs {exact} (bound {bound})"


# --- helpers -----------------------------------------------------------------------------------


def _fixed(values, dtype):
    """``values`` in ``dtype``, padded with zeros to N elements."""
    x = np.asarray(values).astype(dtype).reshape(-1)
    assert x.size <= N
    return np.concatenate([x, np.zeros(N - x.size, dtype)])


def _randn(rng, dtype, scale=1.0, shape=(N,)):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def _triplets(units, scale, dtype, offset=0.0):
    return _fixed(boundary_triplets(offset + np.asarray(units) * scale, dtype), dtype)


def _jvp(fn, primal, tangent):
    return jax.jvp(fn, (primal,), (tangent,))[1]


def _grad(fn, primal):
    return jax.grad(lambda z: fn(z).astype(jnp.float32).sum())(primal)


def _arg(value, dtype):
    return np.asarray(value, dtype)


# --- fake_quant --------------------------------------------------------------------------------

_MODES = [(True, False), (True, True), (False, False)]


@pytest.mark.parametrize("bits", [3, 8])
@pytest.mark.parametrize(("signed", "narrow_range"), _MODES)
def test_fake_quant_matches_reference(dtype, bits, signed, narrow_range):
    rng = np.random.default_rng(bits)
    scale = _arg(0.13, dtype)
    x = _randn(rng, dtype, scale=0.6 * 2 ** (bits - 1) * 0.13)
    zp = _arg(0 if signed else 2 ** (bits - 1) - 1, dtype)
    params = dict(bits=bits, signed=signed, narrow_range=narrow_range)
    y_ref, d_ref = ref_fake_quant(x, scale, zp, **params)
    y = fake_quant(x, scale, zp, **params)
    assert y.dtype == dtype
    assert_bitwise_equal(y, y_ref)
    assert 0 < d_ref.astype(np.float32).mean() < 1, "the sample should be partly clipped"
    g = _grad(lambda x: fake_quant(x, scale, zp, **params), x)
    assert g.dtype == dtype
    assert_tangent_equal(g, d_ref, context="grad")
    t = _randn(rng, dtype)
    assert_tangent_equal(_jvp(lambda x: fake_quant(x, scale, zp, **params), x, t), ref_product(d_ref, t))


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize(("signed", "narrow_range"), _MODES)
def test_fake_quant_at_ties_and_clip_edges(dtype, bits, signed, narrow_range):
    qmin, qmax = _grid(bits, signed, narrow_range)
    zp = 0 if signed else 1
    params = dict(bits=bits, signed=signed, narrow_range=narrow_range)
    # Every level and every tie, one step beyond each end: the clip edges are the
    # ties (qmin - 1/2) and (qmax + 1/2) in grid units. Scale 1/4 puts them exactly
    # on representable numbers; 0.3 only near them.
    units = [k + h for k in range(qmin - zp - 2, qmax - zp + 2) for h in (0.0, 0.5)]
    for scale in (0.25, 0.3):
        x = _triplets(units, scale, dtype)
        s, z = _arg(scale, dtype), _arg(zp, dtype)
        y_ref, d_ref = ref_fake_quant(x, s, z, **params)
        assert_bitwise_equal(fake_quant(x, s, z, **params), y_ref, context=f"scale {scale}")
        g = _grad(lambda x, s=s, z=z: fake_quant(x, s, z, **params), x)
        assert_tangent_equal(g, d_ref, context=f"scale {scale}")


def test_fake_quant_clip_edge_convention():
    # bits=4 signed, scale 1/4: levels -8..7, so x in [-2, 1.75].
    f32 = np.float32
    x = np.array([1.875, np.nextafter(f32(1.875), f32(0)), -2.125, np.nextafter(f32(-2.125), f32(-3)), 1.8, -2.1], f32)
    y = fake_quant(x, 0.25, bits=4)
    g = jax.grad(lambda x: fake_quant(x, 0.25, bits=4).sum())(x)
    # 7.5 rounds to 8 (even), out of range: clipped, derivative 0; just below rounds to 7.
    # -8.5 rounds to -8 (even), in range: derivative 1; just below rounds to -9, clipped.
    # 7.2 rounds to the top level 7: the clip leaves it alone, derivative 1.
    assert y.tolist() == [1.75, 1.75, -2.0, -2.0, 1.75, -2.0]
    assert g.tolist() == [0.0, 1.0, 1.0, 0.0, 1.0, 1.0]


def test_fake_quant_special_values(dtype):
    x = _fixed(special_values(dtype), dtype)
    for signed in (True, False):
        s, z = _arg(0.5, dtype), _arg(0 if signed else 3, dtype)
        y_ref, d_ref = ref_fake_quant(x, s, z, bits=4, signed=signed)
        assert_bitwise_equal(fake_quant(x, s, z, bits=4, signed=signed), y_ref, context=f"signed={signed}")
        g = _grad(lambda x, s=s, z=z, signed=signed: fake_quant(x, s, z, bits=4, signed=signed), x)
        assert_tangent_equal(g, d_ref)
    y = np.asarray(fake_quant(x, _arg(0.5, dtype), bits=4)).astype(np.float64)
    assert y[2] == 3.5 and y[3] == -4.0 and np.isnan(y[4])  # +-inf saturate, NaN stays NaN


@pytest.mark.parametrize("jit", [False, True])
def test_fake_quant_keeps_the_sign_of_zero(jit):
    x = np.array([-0.0, 0.0, -0.1, 0.1], np.float32)

    def f(x):
        return fake_quant(x, 0.5, bits=8)

    assert np.signbit(np.asarray((jax.jit(f) if jit else f)(x))).tolist() == [True, False, True, False]


@pytest.mark.parametrize("axis", [0, -1])
def test_fake_quant_per_channel(dtype, axis):
    rng = np.random.default_rng(7)
    x = _randn(rng, dtype, scale=2.0, shape=(3, 4, 5))
    channels = x.shape[axis]
    scale = rng.uniform(0.05, 0.4, channels).astype(dtype)
    zp = np.arange(channels).astype(dtype)
    shape = [1, 1, 1]
    shape[axis] = channels
    y_ref, d_ref = ref_fake_quant(x, scale.reshape(shape), zp.reshape(shape), bits=4, signed=False)
    y0_ref, _ = ref_fake_quant(x, scale.reshape(shape), 0.0, bits=4)

    def program(x, scale, zp):
        # Everything in one jitted program, compiled once (eager per-channel calls are checked
        # against the declared forward and derivative in test_entry_is_truthful).
        return (
            fake_quant(x, scale, zp, bits=4, signed=False, axis=axis),
            _grad(lambda x: fake_quant(x, scale, zp, bits=4, signed=False, axis=axis), x),
            fake_quant(x, scale, bits=4, axis=axis),
        )

    y, g, y0 = jax.jit(program)(x, scale, zp)
    assert_bitwise_equal(y, y_ref)
    assert_tangent_equal(g, d_ref)
    # A scalar zero point with per-channel scales.
    assert_bitwise_equal(y0, y0_ref, context="scalar zero point")


def test_fake_quant_vmap_matches_scalar_calls():
    # A division by a broadcast scale is rewritten by XLA into a multiplication by
    # its reciprocal, but not a division between scalars; the documented
    # reciprocal keeps the batched and the scalar values identical.
    rng = np.random.default_rng(3)
    x = _randn(rng, np.float32, scale=20.0, shape=(48,))
    s = np.float32(0.0731)
    batched = jax.vmap(lambda x: fake_quant(x, s, bits=16))(x)
    one_by_one = np.stack([np.asarray(fake_quant(xi, s, bits=16)) for xi in x])
    assert_bitwise_equal(batched, one_by_one)
    scales = rng.uniform(0.01, 0.1, 48).astype(np.float32)
    batched = jax.vmap(lambda x, s: fake_quant(x, s, bits=16))(x, scales)
    one_by_one = np.stack([np.asarray(fake_quant(xi, si, bits=16)) for xi, si in zip(x, scales, strict=True)])
    assert_bitwise_equal(batched, one_by_one, context="batched scales")


def test_fake_quant_scale_gets_no_gradient():
    x = jnp.array([0.3, 1.4])
    assert float(jax.grad(lambda s: fake_quant(x, s, bits=4).sum())(0.5)) == 0.0


# --- LSQ and LSQ+ ------------------------------------------------------------------------------


@pytest.mark.parametrize("bits", [3, 8])
@pytest.mark.parametrize("signed", [True, False])
def test_lsq_matches_reference(dtype, bits, signed):
    rng = np.random.default_rng(bits + 10 * signed)
    qp = _lsq_grid(bits, signed)[1]
    step = _arg(0.11, dtype)
    x = _randn(rng, dtype, scale=0.7 * qp * 0.11)
    for grad_scale in (None, 0.5):

        def f(x, s, grad_scale=grad_scale):
            return lsq(x, s, bits=bits, signed=signed, grad_scale=grad_scale)

        y_ref, dx_ref, ds_ref = ref_lsq(x, step, bits=bits, signed=signed, grad_scale=grad_scale)
        y = f(x, step)
        assert y.dtype == dtype
        assert_bitwise_equal(y, y_ref)
        t = _randn(rng, dtype)
        assert_tangent_equal(_jvp(lambda x, f=f: f(x, step), x, t), ref_product(dx_ref, t), context="x")
        ts = _arg(-1.5, dtype)
        assert_tangent_equal(_jvp(lambda s, f=f: f(x, s), step, ts), ref_product(ds_ref, ts), context="step")
        gx, gs = jax.grad(lambda x, s, f=f: f(x, s).astype(jnp.float32).sum(), argnums=(0, 1))(x, step)
        assert gx.dtype == dtype and gs.dtype == dtype
        assert_tangent_equal(gx, dx_ref, context="grad x")
        assert_sum_close(gs, ds_ref, context="grad step")


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("signed", [True, False])
def test_lsq_at_ties_and_clip_edges(dtype, bits, signed):
    qn, qp = _lsq_grid(bits, signed)
    units = [k + h for k in range(-qn - 2, qp + 2) for h in (0.0, 0.5)]

    def f(x, s):
        return lsq(x, s, bits=bits, signed=signed)

    for step in (0.25, 0.3):
        x = _triplets(units, step, dtype)
        s = _arg(step, dtype)
        y_ref, dx_ref, ds_ref = ref_lsq(x, s, bits=bits, signed=signed)
        assert_bitwise_equal(f(x, s), y_ref)
        assert_tangent_equal(_grad(lambda x, s=s: f(x, s), x), dx_ref, context="x")
        assert_tangent_equal(_jvp(lambda s, x=x: f(x, s), s, _arg(1.0, dtype)), ds_ref, context="step")


def test_lsq_kink_convention():
    # bits=4 signed, step 1/4: v = x / s in [-8, 7]; grad_scale 1 to read the raw partials.
    f32 = np.float32
    x = np.array([-2.0, np.nextafter(f32(-2.0), f32(-3)), 1.75, np.nextafter(f32(1.75), f32(2)), 0.3], f32)
    gx, gs = jax.vmap(jax.grad(lambda x, s: lsq(x, s, bits=4, grad_scale=1.0), argnums=(0, 1)), in_axes=(0, None))(
        x, f32(0.25)
    )
    # At v = -8 and v = 7 exactly: inside (1, and round(v) - v = 0); just outside: 0, -Q_N or Q_P.
    assert gx.tolist() == [1.0, 0.0, 1.0, 0.0, 1.0]
    assert gs[:4].tolist() == [0.0, -8.0, 0.0, 7.0]
    assert gs[4] == f32(1.0) - f32(0.3) * f32(4.0)


def test_lsq_special_values(dtype):
    x = _fixed(special_values(dtype), dtype)
    s = _arg(0.5, dtype)
    y_ref, dx_ref, ds_ref = ref_lsq(x, s, bits=4, signed=True)
    assert_bitwise_equal(lsq(x, s, bits=4), y_ref)
    assert np.signbit(np.asarray(lsq(np.array([-0.0, -0.1], dtype), s, bits=4))).all()  # sign of zero kept
    assert_tangent_equal(_grad(lambda x: lsq(x, s, bits=4), x), dx_ref)
    assert_tangent_equal(_jvp(lambda s: lsq(x, s, bits=4), s, _arg(1.0, dtype)), ds_ref)


def test_lsq_default_grad_scale_counts_elements_per_step():
    x = jnp.full((6, 5), 100.0)  # all above the range: the step partial is Q_P g each
    g = jax.grad(lambda s: lsq(x, s, bits=4).sum())(jnp.float32(0.5))
    np.testing.assert_allclose(float(g), 30 * 7 * np.float32(1 / math.sqrt(30 * 7)), rtol=1e-6)  # 30-term sum
    per_channel = jax.grad(lambda s: lsq(x, s, bits=4, axis=1).sum())(jnp.full((5,), 0.5, jnp.float32))
    np.testing.assert_allclose(np.asarray(per_channel), 6 * 7 * np.float32(1 / math.sqrt(6 * 7)), rtol=1e-6)


@pytest.mark.parametrize("axis", [1, -1])
def test_lsq_per_channel(dtype, axis):
    rng = np.random.default_rng(11)
    x = _randn(rng, dtype, scale=1.5, shape=(3, 4, 5))
    channels = x.shape[axis]
    step = rng.uniform(0.1, 0.5, channels).astype(dtype)
    shape = [1, 1, 1]
    shape[axis] = channels
    y_ref, dx_ref, ds_ref = ref_lsq(x, step.reshape(shape), bits=3, signed=True)
    t = _randn(rng, dtype, shape=(channels,))

    def program(x, step, t):
        # Everything in one jitted program, compiled once (eager per-channel calls are checked
        # against the declared forward and derivative in test_entry_is_truthful).
        return (
            lsq(x, step, bits=3, axis=axis),
            _jvp(lambda s: lsq(x, s, bits=3, axis=axis), step, t),
            _grad(lambda s: lsq(x, s, bits=3, axis=axis), step),
            _grad(lambda x: lsq(x, step, bits=3, axis=axis), x),
        )

    y, tangent, gs, gx = jax.jit(program)(x, step, t)
    assert_bitwise_equal(y, y_ref)
    assert_tangent_equal(tangent, ref_product(ds_ref, t.reshape(shape)), context="step tangent")
    assert gs.shape == (channels,)
    for c in range(channels):
        assert_sum_close(gs[c], np.take(ds_ref, c, axis=axis), context=f"channel {c}")
    assert_tangent_equal(gx, dx_ref)


@pytest.mark.parametrize("bits", [3, 8])
@pytest.mark.parametrize("signed", [False, True])
def test_lsq_plus_matches_reference(dtype, bits, signed):
    rng = np.random.default_rng(bits + 5)
    qp = _lsq_grid(bits, signed)[1]
    step = _arg(0.17, dtype)
    offset = _arg(-0.3 * qp * 0.17 if not signed else 0.37, dtype)
    x = (_randn(rng, dtype, scale=0.8 * qp * 0.17).astype(np.float32) + 0.4).astype(dtype)
    y_ref, dx_ref, ds_ref, db_ref = ref_lsq(x, step, offset, bits=bits, signed=signed)
    y = lsq_plus(x, step, offset, bits=bits, signed=signed)
    assert y.dtype == dtype
    assert_bitwise_equal(y, y_ref)

    def f(x, s, b):
        return lsq_plus(x, s, b, bits=bits, signed=signed)

    t = _randn(rng, dtype)
    ts = _arg(0.75, dtype)
    zero, zero_s = np.zeros_like(x), np.zeros_like(step)

    def jvp(*tangents):
        return jax.jvp(f, (x, step, offset), tangents)[1]

    # One argument at a time, so that each declared partial is checked exactly.
    assert_tangent_equal(jvp(t, zero_s, zero_s), ref_product(dx_ref, t), context="x")
    assert_tangent_equal(jvp(zero, ts, zero_s), ref_product(ds_ref, ts), context="step")
    assert_tangent_equal(jvp(zero, zero_s, ts), ref_product(db_ref, ts), context="offset")
    gx, gs, gb = jax.grad(lambda *a: f(*a).astype(jnp.float32).sum(), argnums=(0, 1, 2))(x, step, offset)
    assert_tangent_equal(gx, dx_ref)
    assert_sum_close(gs, ds_ref, context="step")
    assert_sum_close(gb, db_ref, context="offset")


@pytest.mark.parametrize("signed", [False, True])
def test_lsq_plus_at_ties_and_clip_edges(dtype, signed):
    qn, qp = _lsq_grid(3, signed)
    units = [k + h for k in range(-qn - 2, qp + 2) for h in (0.0, 0.5)]
    x = _triplets(units, 0.25, dtype, offset=-0.75)
    s, b = _arg(0.25, dtype), _arg(-0.75, dtype)
    y_ref, dx_ref, ds_ref, db_ref = ref_lsq(x, s, b, bits=3, signed=signed)
    assert_bitwise_equal(lsq_plus(x, s, b, bits=3, signed=signed), y_ref)
    one = _arg(1.0, dtype)
    assert_tangent_equal(_grad(lambda x: lsq_plus(x, s, b, bits=3, signed=signed), x), dx_ref)
    assert_tangent_equal(_jvp(lambda s: lsq_plus(x, s, b, bits=3, signed=signed), s, one), ds_ref)
    assert_tangent_equal(_jvp(lambda b: lsq_plus(x, s, b, bits=3, signed=signed), b, one), db_ref)


def test_lsq_plus_special_values(dtype):
    x = _fixed(special_values(dtype), dtype)
    s, b = _arg(0.5, dtype), _arg(-1.0, dtype)
    y_ref, _, ds_ref, db_ref = ref_lsq(x, s, b, bits=4, signed=False)
    assert_bitwise_equal(lsq_plus(x, s, b, bits=4), y_ref)
    one = _arg(1.0, dtype)
    assert_tangent_equal(_jvp(lambda s: lsq_plus(x, s, b, bits=4), s, one), ds_ref)
    assert_tangent_equal(_jvp(lambda b: lsq_plus(x, s, b, bits=4), b, one), db_ref)


@pytest.mark.parametrize("jit", [False, True])
def test_lsq_plus_zero_results_are_positive(jit):
    x = np.array([-0.0, -0.1, 0.0, 0.1], np.float32)

    def f(x):
        return lsq_plus(x, 0.5, 0.0, bits=4, signed=True)

    assert not np.signbit(np.asarray((jax.jit(f) if jit else f)(x))).any()


def test_lsq_plus_per_channel_with_scalar_offset(dtype):
    rng = np.random.default_rng(5)
    x = _randn(rng, dtype, shape=(3, 4, 5))
    step = rng.uniform(0.1, 0.3, 4).astype(dtype)
    offset = _arg(-0.5, dtype)
    y_ref, *_ = ref_lsq(x, step.reshape(1, 4, 1), offset, bits=3, signed=False)
    assert_bitwise_equal(lsq_plus(x, step, offset, bits=3, axis=1), y_ref)
    assert _grad(lambda b: lsq_plus(x, step, b, bits=3, axis=1), offset).shape == ()


# --- PACT --------------------------------------------------------------------------------------


@pytest.mark.parametrize("bits", [1, 2, 8])
def test_pact_matches_reference(dtype, bits):
    rng = np.random.default_rng(bits)
    for alpha in (1.7, 6.0):
        x = _randn(rng, dtype, scale=alpha)
        a = _arg(alpha, dtype)
        y_ref, dx_ref, da_ref = ref_pact(x, a, bits=bits)
        y = pact(x, a, bits=bits)
        assert y.dtype == dtype
        assert_bitwise_equal(y, y_ref)
        gx, ga = jax.grad(lambda x, a: pact(x, a, bits=bits).astype(jnp.float32).sum(), argnums=(0, 1))(x, a)
        assert_tangent_equal(gx, dx_ref)
        assert_sum_close(ga, da_ref, context="alpha")
        t = _arg(2.0, dtype)
        assert_tangent_equal(_jvp(lambda a, x=x: pact(x, a, bits=bits), a, t), ref_product(da_ref, t))


@pytest.mark.parametrize("bits", [2, 3])
def test_pact_at_ties_and_clip_edges(dtype, bits):
    n = 2**bits - 1
    units = [k + h for k in range(-2, n + 2) for h in (0.0, 0.5)]
    for alpha in (n * 0.25, 1.3):  # n / 4: the step is 1/4 and the ties are representable
        x = _triplets(units, alpha / n, dtype)
        a = _arg(alpha, dtype)
        y_ref, dx_ref, da_ref = ref_pact(x, a, bits=bits)
        assert_bitwise_equal(pact(x, a, bits=bits), y_ref)
        assert_tangent_equal(_grad(lambda x, a=a: pact(x, a, bits=bits), x), dx_ref, context="x")
        one = _arg(1.0, dtype)
        assert_tangent_equal(_jvp(lambda a, x=x: pact(x, a, bits=bits), a, one), da_ref, context="a")


def test_pact_kink_convention():
    x = np.array([-1e-7, 0.0, 1.5, np.nextafter(np.float32(1.5), np.float32(0)), 2.0], np.float32)
    gx, ga = jax.vmap(jax.grad(lambda x, a: pact(x, a, bits=2), argnums=(0, 1)), in_axes=(0, None))(x, 1.5)
    assert gx.tolist() == [0.0, 1.0, 0.0, 1.0, 0.0]
    assert ga.tolist() == [0.0, 0.0, 1.0, 0.0, 1.0]


def test_pact_special_values(dtype):
    x = _fixed(special_values(dtype), dtype)
    a = _arg(2.0, dtype)
    y_ref, dx_ref, da_ref = ref_pact(x, a, bits=3)
    assert_bitwise_equal(pact(x, a, bits=3), y_ref)
    assert np.signbit(np.asarray(pact(np.array([-0.0], dtype), a, bits=3))).all()
    assert_tangent_equal(_grad(lambda x: pact(x, a, bits=3), x), dx_ref)
    assert_tangent_equal(_jvp(lambda a: pact(x, a, bits=3), a, _arg(1.0, dtype)), da_ref)


# --- DoReFa ------------------------------------------------------------------------------------


@pytest.mark.parametrize("bits", [1, 2, 8])
def test_dorefa_activations_matches_reference(dtype, bits):
    rng = np.random.default_rng(bits)
    n = 2**bits - 1
    units = [k + h for k in range(-1, n + 2) for h in (0.0, 0.5)] if bits <= 4 else [0, 0.5, n - 0.5, n]
    x = np.concatenate([boundary_triplets(np.array(units) / n, dtype), special_values(dtype)])
    x = np.concatenate([x, _randn(rng, dtype, 0.7, shape=(N - x.size,))]).astype(dtype)
    y_ref, d_ref = ref_dorefa_activations(x, bits=bits)
    y = dorefa_activations(x, bits=bits)
    assert y.dtype == dtype
    assert_bitwise_equal(y, y_ref)
    assert_tangent_equal(_grad(lambda x: dorefa_activations(x, bits=bits), x), d_ref)
    t = _randn(rng, dtype)
    assert_tangent_equal(_jvp(lambda x: dorefa_activations(x, bits=bits), x, t), ref_product(d_ref, t))


def test_dorefa_activations_levels_and_edges():
    f32 = np.float32
    x = np.array([-0.0, 0.0, 1.0, np.nextafter(f32(1.0), f32(2)), -1e-7, 0.5], f32)
    y = np.asarray(dorefa_activations(x, bits=2))
    assert y.tolist()[:4] == [0.0, 0.0, 1.0, 1.0] and np.signbit(y[0])
    assert y[5] == f32(2) * f32(1 / 3)  # 1.5 rounds to 2 (even)
    g = jax.grad(lambda x: dorefa_activations(x, bits=2).sum())(x)
    assert g.tolist() == [1.0, 1.0, 1.0, 0.0, 0.0, 1.0]
    top = [float(dorefa_activations(f32(1.0), bits=b)) for b in range(1, 17)]
    assert top == [1.0] * 16  # n * fl(1/n) is exactly 1


def _tanh_xla(w):
    """XLA's tanh, in the compute dtype: the primitive the library uses."""
    return np.asarray(jnp.tanh(jnp.asarray(w.astype(_c(w.dtype)))))


@pytest.mark.parametrize("bits", [1, 2, 8])
def test_dorefa_weights_matches_reference(dtype, bits):
    rng = np.random.default_rng(bits)
    w = _randn(rng, dtype, scale=0.8)
    y_ref, d_ref = ref_dorefa_weights(w, _tanh_xla(w), bits=bits)
    y = dorefa_weights(w, bits=bits)
    assert y.dtype == dtype
    assert_bitwise_equal(y, y_ref)
    assert_tangent_equal(_grad(lambda w: dorefa_weights(w, bits=bits), w), d_ref)
    t = _randn(rng, dtype)
    assert_tangent_equal(_jvp(lambda w: dorefa_weights(w, bits=bits), w, t), ref_product(d_ref, t))
    n = 2**bits - 1
    levels = ((2 * np.arange(n + 1) - n).astype(np.float32) * np.float32(1 / n)).astype(dtype)
    assert np.isin(np.asarray(y).astype(np.float64), levels.astype(np.float64)).all()


@pytest.mark.parametrize("bits", [2, 4])
def test_dorefa_weights_against_numpy_tanh(bits):
    # Against NumPy's float64 tanh: XLA's float32 tanh differs in the last bits, so
    # a level may differ only where the float64 pre-rounding value u n lies within
    # 1e-5 of a tie. The derivative (1 - t)(1 + t) / m carries tanh's absolute error
    # (a few float32 ulps of t, near 1: 1e-7) amplified by 1/m: atol 4 eps / m.
    rng = np.random.default_rng(0)
    w = rng.standard_normal(500).astype(np.float32)
    t = np.tanh(w.astype(np.float64))
    n = 2**bits - 1
    un = (t / (2 * np.abs(t).max()) + 0.5) * n
    expected = 2 * np.round(un) / n - 1
    near_tie = np.abs(un - np.floor(un) - 0.5) < 1e-5
    # The value and the gradient in one jitted program, compiled once.
    y, g = jax.jit(lambda w: (dorefa_weights(w, bits=bits), jax.grad(lambda w: dorefa_weights(w, bits=bits).sum())(w)))(
        w
    )
    y, g = np.asarray(y, np.float64), np.asarray(g)
    np.testing.assert_allclose(y[~near_tie], expected[~near_tie], rtol=1e-6)
    m = np.abs(t).max()
    np.testing.assert_allclose(g, (1 - t**2) / m, rtol=1e-6, atol=4 * np.finfo(np.float32).eps / m)


def test_dorefa_weights_all_zero_nan_and_inf():
    zeros = np.zeros(4, np.float32)
    # Normalised by 1: u = 1/2, a tie that rounds to even; derivative 1.
    assert np.asarray(dorefa_weights(zeros, bits=2)).tolist() == [np.float32(1) * np.float32(1 / 3)] * 4
    assert np.asarray(dorefa_weights(zeros, bits=1)).tolist() == [-1.0] * 4
    assert jax.grad(lambda w: dorefa_weights(w, bits=2).sum())(zeros).tolist() == [1.0] * 4
    assert np.isnan(np.asarray(dorefa_weights(np.array([0.5, np.nan, -0.2], np.float32), bits=2))).all()
    y = np.asarray(dorefa_weights(np.array([np.inf, -np.inf, 0.3], np.float32), bits=2))
    assert y[0] == 1.0 and y[1] == -1.0


def test_dorefa_weights_holds_the_maximum_constant():
    # The largest element gets (1 - tanh^2) / m, not the zero that differentiating
    # through the maximum would give it.
    w = jnp.array([0.2, -1.0, 0.5])
    g = jax.grad(lambda w: dorefa_weights(w, bits=4).sum())(w)
    m = np.tanh(np.float32(1.0))
    np.testing.assert_allclose(float(g[1]), (1 - m**2) / m, rtol=1e-6)


# --- compositions ------------------------------------------------------------------------------

_CALLS = {
    "fake_quant": (lambda x, s: fake_quant(x, s, bits=5), (0.21,)),
    "lsq": (lambda x, s: lsq(x, s, bits=5), (0.21,)),
    "lsq_plus": (lambda x, s, b: lsq_plus(x, s, b, bits=5), (0.21, -0.4)),
    "pact": (lambda x, a: pact(x, a, bits=5), (2.3,)),
    "dorefa_activations": (lambda x: dorefa_activations(x, bits=5), ()),
}


@pytest.mark.parametrize("name", list(_CALLS))
def test_jit_and_vmap_agree_with_eager(name, dtype):
    # Under jit XLA fuses a multiply feeding an add into an FMA and drops additions
    # of a constant zero; the documented operation orders keep the values identical.
    fn, arg_values = _CALLS[name]
    rng = np.random.default_rng(1)
    x = _randn(rng, dtype, scale=3.0)
    args = tuple(_arg(a, dtype) for a in arg_values)
    stacked = tuple(np.full(N, a, dtype) for a in args)
    primals = (x, *args)

    def tangents(primals):
        """The jvp along each argument in turn, with a tangent of ones."""
        out = []
        for k in range(len(primals)):

            def one(z, k=k):
                return fn(*primals[:k], z, *primals[k + 1 :])

            out.append(_jvp(one, primals[k], jnp.ones_like(primals[k])))
        return out

    def program(x, args, stacked):
        # Every jitted and vmapped form in one program, compiled once.
        return {
            "jit": fn(x, *args),
            "vmap": jax.vmap(fn, in_axes=(0, *[None] * len(args)))(x, *args),
            "vmap, batched arguments": jax.vmap(fn)(x, *stacked),
            "jvp": tangents((x, *args)),
        }

    jitted = jax.jit(program)(x, args, stacked)
    eager = fn(x, *args)
    for mode in ("jit", "vmap", "vmap, batched arguments"):
        assert_bitwise_equal(jitted[mode], eager, context=mode)
    loop = np.stack([np.asarray(fn(xi, *args)) for xi in x[:8]])
    assert_bitwise_equal(loop, np.asarray(eager)[:8], context="scalar calls")
    for k, (jitted_tangent, eager_tangent) in enumerate(zip(jitted["jvp"], tangents(primals), strict=True)):
        assert_tangent_equal(jitted_tangent, eager_tangent, context=f"jvp along argument {k}")


# --- float64 -----------------------------------------------------------------------------------


@pytest.mark.needs_float64
def test_float64_runs_in_float64():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(50) * 3
    with jax.enable_x64(True):
        s, b, a = np.float64(0.3), np.float64(-0.2), np.float64(2.5)

        def program(x, s, b, a):
            # All six in one jitted program, compiled once.
            return {
                "fake_quant": fake_quant(x, s, bits=12),
                "lsq": lsq(x, s, bits=12),
                "lsq_plus": lsq_plus(x, s, b, bits=12),
                "pact": pact(x, a, bits=12),
                "dorefa_activations": dorefa_activations(x, bits=12),
                "dorefa_weights": dorefa_weights(x, bits=12),
            }

        y = jax.jit(program)(x, s, b, a)
        assert_bitwise_equal(y["fake_quant"], ref_fake_quant(x, s, bits=12)[0], context="fake_quant")
        assert_bitwise_equal(y["lsq"], ref_lsq(x, s, bits=12, signed=True)[0], context="lsq")
        y_ref = ref_lsq(x, s, b, bits=12, signed=False)[0]
        assert_bitwise_equal(y["lsq_plus"], y_ref, context="lsq_plus")
        y_ref = ref_pact(x, a, bits=12)[0]
        assert_bitwise_equal(y["pact"], y_ref, context="pact")
        y_ref = ref_dorefa_activations(x, bits=12)[0]
        assert_bitwise_equal(y["dorefa_activations"], y_ref, context="dorefa_activations")
        y_ref = ref_dorefa_weights(x, _tanh_xla(x), bits=12)[0]
        assert_bitwise_equal(y["dorefa_weights"], y_ref, context="dorefa_weights")


# --- the catalog entries -----------------------------------------------------------------------

_CASES = [(e, p) for e in uniform.ENTRIES for p in e.param_grid()]


@pytest.mark.parametrize(("entry", "params"), _CASES, ids=[f"{e.name}-{i}" for i, (e, _) in enumerate(_CASES)])
def test_entry_is_truthful(entry, params, dtype):
    rng = np.random.default_rng(0)
    points = entry.boundaries(**params)
    x = boundary_triplets(points, dtype) if points else np.zeros(0, dtype)
    x = np.concatenate([x, _randn(rng, dtype, scale=1.5, shape=(N - x.size,))]).astype(dtype)
    args = entry.example_args(rng, x.shape, dtype, params)
    expected = entry.forward(x, *args, **params)
    assert_bitwise_equal(entry.fn(x, *args, **params), expected, context="fn vs forward")
    partials = entry.derivative(x, *args, **params)
    partials = partials if isinstance(partials, tuple) else (partials,)
    assert len(partials) == len(entry.diff_argnums)
    primals = (x, *args)
    for k, partial in zip(entry.diff_argnums, partials, strict=True):

        def f(z, k=k):
            return entry.fn(*primals[:k], z, *primals[k + 1 :], **params)

        t = np.full(np.shape(primals[k]), 1.25, dtype)
        assert_tangent_equal(_jvp(f, primals[k], t), ref_product(np.asarray(partial), t), context=f"arg {k}")


def test_entries_are_the_family():
    names = [e.name for e in uniform.ENTRIES]
    assert names == ["fake_quant", "lsq", "lsq_plus", "pact", "dorefa_weights", "dorefa_activations"]
    assert all(e.family == "uniform" for e in uniform.ENTRIES)


# --- errors ------------------------------------------------------------------------------------

X = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: fake_quant(X, 0.1, bits=8.0), TypeError, r"fake_quant: bits must be an int; got 8\.0"),
        (lambda: fake_quant(X, 0.1, bits=True), TypeError, r"fake_quant: bits must be an int"),
        (
            lambda: fake_quant(X, 0.1, bits=1),
            ValueError,
            r"fake_quant: bits must be an int in \[2, 16\].*got 1",
        ),
        (
            lambda: fake_quant(X, 0.1, bits=17),
            ValueError,
            r"for a signed range \(one bit is the sign\); got 17",
        ),
        (lambda: fake_quant(X, 0.1, bits=0, signed=False), ValueError, r"in \[1, 16\] for an unsigned"),
        (
            lambda: fake_quant(X, 0.1, bits=1, signed=False, narrow_range=True),
            ValueError,
            r"in \[2, 16\] for a narrow unsigned range; got 1",
        ),
        (
            lambda: fake_quant(X, 0.1, bits=8, signed=1),
            TypeError,
            r"fake_quant: signed must be a bool; got 1",
        ),
        (lambda: fake_quant(X, 0.1, bits=8, narrow_range="no"), TypeError, r"narrow_range must be a bool"),
        (
            lambda: fake_quant(X, 0.1, bits=8, axis=2),
            ValueError,
            r"axis must be None or an int in \[-2, 2\).*got 2",
        ),
        (lambda: fake_quant(X, 0.1, bits=8, axis=1.0), TypeError, r"fake_quant: axis must be None or an int"),
        (
            lambda: fake_quant(X, np.ones(3, np.float32), bits=8),
            ValueError,
            r"fake_quant: with axis=None .* scale must be a scalar; got shape \(3,\)",
        ),
        (
            lambda: fake_quant(X, np.ones(3, np.float32), bits=8, axis=1),
            ValueError,
            r"fake_quant: with axis=1, scale must have shape \(4,\).*x of shape \(3, 4\); got shape \(3,\)",
        ),
        (
            lambda: fake_quant(X, np.ones(4, np.float32), np.zeros(3, np.float32), bits=8, axis=1),
            ValueError,
            r"zero_point must have shape \(4,\) or \(\)",
        ),
        (
            lambda: fake_quant(X.astype(BF16), np.float32(0.1), bits=8),
            TypeError,
            r"fake_quant: positional arguments must share one floating dtype",
        ),
        (
            lambda: fake_quant(np.arange(3), 0.1, bits=8),
            TypeError,
            r"fake_quant: the input must be a floating",
        ),
        (lambda: lsq(X, 0.1, bits=1), ValueError, r"lsq: bits must be an int in \[2, 16\]"),
        (
            lambda: lsq(X, 0.1, bits=4, grad_scale=0.0),
            ValueError,
            r"lsq: grad_scale must be a positive finite",
        ),
        (
            lambda: lsq(X, 0.1, bits=4, grad_scale="1"),
            TypeError,
            r"lsq: grad_scale must be None or a positive",
        ),
        (lambda: lsq(X, np.ones(4, np.float32), bits=4), ValueError, r"lsq: with axis=None .* step must be"),
        (lambda: lsq(X, np.ones(3, np.float32), bits=4, axis=1), ValueError, r"step must have shape \(4,\)"),
        (lambda: lsq_plus(X, 0.1, 0.0, bits=0), ValueError, r"lsq_plus: bits must be an int in \[1, 16\]"),
        (
            lambda: lsq_plus(X, 0.1, np.zeros(2, np.float32), bits=4),
            ValueError,
            r"lsq_plus: with axis=None .* offset must be a scalar",
        ),
        (lambda: pact(X, np.ones(2, np.float32), bits=4), ValueError, r"pact: alpha must be a scalar"),
        (lambda: pact(X, 1.0, bits=17), ValueError, r"pact: bits must be an int in \[1, 16\]"),
        (lambda: dorefa_weights(X, bits=0), ValueError, r"dorefa_weights: bits must be an int in \[1, 16\]"),
        (lambda: dorefa_activations(X, bits="4"), TypeError, r"dorefa_activations: bits must be an int"),
        (lambda: dorefa_activations(np.arange(3), bits=4), TypeError, r"dorefa_activations: the input must"),
    ],
)
def test_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()


# --- non-positive scales, steps and clipping levels ---------------------------------------------

_NON_POSITIVE = [
    ("fake_quant", "scale", lambda v: fake_quant(X, v, bits=4)),
    ("lsq", "step", lambda v: lsq(X, v, bits=4)),
    ("lsq_plus", "step", lambda v: lsq_plus(X, v, 0.0, bits=4)),
    ("pact", "alpha", lambda v: pact(X, v, bits=4)),
]


@pytest.mark.parametrize(("name", "what", "call"), _NON_POSITIVE, ids=[n for n, _, _ in _NON_POSITIVE])
@pytest.mark.parametrize("value", [0.0, -0.0, -1.0, -0.1])
def test_concrete_non_positive_values_are_refused(name, what, call, value):
    with pytest.raises(ValueError, match=rf"^{name}: {what} must be positive \(> 0\); got {value!r}\."):
        call(value)
    # A JAX array and an eager jax.grad (a concrete tracer) are checked the same way.
    with pytest.raises(ValueError, match=rf"^{name}: {what} must be positive"):
        call(jnp.float32(value))
    with pytest.raises(ValueError, match=rf"^{name}: {what} must be positive"):
        jax.grad(lambda v: call(v).sum())(jnp.float32(value))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (
            lambda: fake_quant(X, np.array([1.0, 0.5, 0.0, -1.0], np.float32), bits=4, axis=1),
            r"fake_quant: scale must be positive \(> 0\); got 0\.0 at index 2 \(2 of 4 non-positive\)",
        ),
        (
            lambda: lsq(X, np.array([0.5, -0.25, 1.0], np.float32), bits=4, axis=0),
            r"lsq: step must be positive \(> 0\); got -0\.25 at index 1 \(1 of 3 non-positive\)",
        ),
    ],
)
def test_per_channel_non_positive_values_name_the_channel(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_traced_values_are_not_checked_and_follow_the_formula():
    # The documented behaviour under jit: no check (the value is abstract), the formula as written.
    x = jnp.array([-1.0, -0.3, 0.0, 0.3, 0.74, 2.0], jnp.float32)
    zero = jax.jit(lambda x, s: fake_quant(x, s, bits=4))(x, 0.0)
    assert np.isnan(np.asarray(zero)[2]) and np.all(np.asarray(zero)[[0, 1, 3, 4, 5]] == 0)
    assert float(jax.jit(lambda x, s: lsq(x, s, bits=4))(x, -0.1)[5]) == pytest.approx(0.8)
    assert np.all(np.asarray(jax.jit(lambda x, a: pact(x, a, bits=4))(x, -1.0))[2:] == -1.0)
    # vmap over the values is tracing too.
    assert jax.vmap(lambda s: fake_quant(x, s, bits=4))(jnp.array([0.5, -1.0])).shape == (2, 6)


def test_nan_scale_gives_nan_rather_than_an_error():
    assert np.isnan(np.asarray(fake_quant(X, np.float32("nan"), bits=4))).all()
    assert np.isnan(np.asarray(lsq(X, np.float32("nan"), bits=4))).all()


# --- the gradients against the declared formulas, written out comparison by comparison ----------
#
# The derivatives below restate the declared formulas on their own (r >= lo and r <= hi,
# v >= -Q_N and v <= Q_P, an isnan test, 0 <= x < alpha). The estimators' gradients, jitted,
# must equal the gradients these give bit for bit, at the kinks and special values too: a
# rewrite of a derivative for speed (reading a mask off the forward's clip, say) has to keep
# every value.


def _declared_fake_quant(x, scale, zero_point=0, *, bits, signed=True, narrow_range=False, axis=None):
    x = jnp.asarray(x)
    _, r, lo, hi = uniform._fake_quant_grid(x, scale, zero_point, bits, signed, narrow_range, axis)
    return ((r >= lo) & (r <= hi)).astype(x.dtype)


def _declared_step_partial(v, qn, qp, g):
    g = jnp.asarray(g, v.dtype)
    c = uniform._clip(v, -qn, qp)
    inside = jnp.where(jnp.isnan(v), 0, (jnp.round(c) - c) * g)
    return jnp.where(v < -qn, -qn * g, jnp.where(v > qp, qp * g, inside))


def _declared_lsq(x, step, *, bits, signed=True, grad_scale=None, axis=None):
    x = jnp.asarray(x)
    qn, qp = uniform.lsq_levels(bits, signed)
    _, _, v = uniform._lsq_grid(x, step, 0, axis)
    g = uniform._lsq_grad_scale(grad_scale, x, step, qp)
    inside = (v >= -qn) & (v <= qp)
    return inside.astype(x.dtype), _declared_step_partial(v, qn, qp, g).astype(x.dtype)


def _declared_lsq_plus(x, step, offset, *, bits, signed=False, grad_scale=None, axis=None):
    x = jnp.asarray(x)
    qn, qp = uniform.lsq_levels(bits, signed)
    _, _, v = uniform._lsq_grid(x, step, offset, axis)
    g = uniform._lsq_grad_scale(grad_scale, x, step, qp)
    inside = (v >= -qn) & (v <= qp)
    d_offset = jnp.where(inside | jnp.isnan(v), 0, jnp.asarray(g, v.dtype)).astype(x.dtype)
    return inside.astype(x.dtype), _declared_step_partial(v, qn, qp, g).astype(x.dtype), d_offset


def _declared_pact(x, alpha, *, bits):
    x = jnp.asarray(x)
    xc = x.astype(uniform._compute_dtype(x.dtype))
    a = jnp.asarray(alpha).astype(xc.dtype)
    return ((xc >= 0) & (xc < a)).astype(x.dtype), (xc >= a).astype(x.dtype)


def _declared_dorefa_activations(x, *, bits):
    x = jnp.asarray(x)
    xc = x.astype(uniform._compute_dtype(x.dtype))
    return ((xc >= 0) & (xc <= 1)).astype(x.dtype)


DECLARED = {
    "_fake_quant": surrogate(uniform._fake_quant_forward, _declared_fake_quant, name="fake_quant"),
    "_lsq": surrogate(uniform._lsq_forward, _declared_lsq, name="lsq", diff_argnums=(0, 1)),
    "_lsq_plus": surrogate(uniform._lsq_plus_forward, _declared_lsq_plus, name="lsq_plus", diff_argnums=(0, 1, 2)),
    "_pact": surrogate(uniform._pact_forward, _declared_pact, name="pact", diff_argnums=(0, 1)),
    "_dorefa_activations": surrogate(
        uniform._dorefa_activations_forward, _declared_dorefa_activations, name="dorefa_activations"
    ),
}

# (public function, its surrogate's name in the module, the differentiated arguments, keyword parameters)
DECLARED_CASES = (
    (fake_quant, "_fake_quant", (0.25,), {"bits": 4}),
    (fake_quant, "_fake_quant", (0.25, 8.0), {"bits": 4, "signed": False}),
    (fake_quant, "_fake_quant", (np.array([0.25, 0.5, 0.25], np.float32),), {"bits": 3, "axis": -1}),
    (lsq, "_lsq", (0.25,), {"bits": 4}),
    (lsq, "_lsq", (0.25,), {"bits": 2, "signed": False, "grad_scale": 0.5}),
    (lsq, "_lsq", (np.array([0.25, 0.5, 0.25], np.float32),), {"bits": 3, "axis": -1}),
    (lsq_plus, "_lsq_plus", (0.25, -1.0), {"bits": 3}),
    (lsq_plus, "_lsq_plus", (0.25, 0.5), {"bits": 4, "signed": True}),
    (pact, "_pact", (1.75,), {"bits": 3}),
    (dorefa_activations, "_dorefa_activations", (), {"bits": 2}),
)


def _kink_inputs(dtype):
    points = [k * 0.125 for k in range(-80, 81)] + [3.75 + 1e-3, -4.125, 8.125, 1.75, 1.0]
    x = np.concatenate([boundary_triplets(points, dtype), special_values(dtype)])
    return np.resize(x, (len(x) // 3 + 1, 3)).astype(dtype)


@pytest.mark.parametrize("case", range(len(DECLARED_CASES)))
def test_gradients_equal_the_declared_formulas_bit_for_bit(case, monkeypatch):
    fn, name, args, params = DECLARED_CASES[case]
    # bfloat16 for every other case: its float32 compute dtype is the same, its kinks fall elsewhere.
    dtype = BF16 if case % 2 else np.float32
    x = _kink_inputs(dtype)
    args = tuple(np.asarray(a, np.float32).astype(dtype) for a in args)
    argnums = tuple(range(1 + len(args)))
    cotangent = np.linspace(-2, 2, x.size).reshape(x.shape).astype(dtype)

    def grads(*a):
        def f(*a):
            return jnp.sum(fn(*a, **params) * cotangent)

        return jax.grad(f, argnums=argnums)(*a)

    def both(*a):
        # One jitted program, compiled once: the module's surrogate is swapped while it is traced.
        estimator = grads(*a)
        with monkeypatch.context() as patch:
            patch.setattr(uniform, name, DECLARED[name])
            declared = grads(*a)
        return estimator, declared

    estimator, declared = jax.jit(both)(x, *args)
    assert uniform.__dict__[name] is not DECLARED[name]
    for i, (a, b) in enumerate(zip(estimator, declared, strict=True)):
        assert_bitwise_equal(a, b, context=f"{name} {params} argument {i}")
