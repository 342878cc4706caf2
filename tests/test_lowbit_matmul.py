"""quantized_matmul: integer-code products against a NumPy integer reference, fake_quant and the verifier."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import stejax
from stejax.lowbit import quantized_matmul
from stejax.verify import check_surrogate

DTYPES = ("float32", "bfloat16", "float16")


def reference(x, w, x_scale, w_scale, bits):
    """The forward in NumPy: float32 codes, an int64 sum of their products, two float32 scale products."""
    dtype = np.asarray(x).dtype
    qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1

    def codes(a, s):
        s = np.asarray(s).astype(np.float32)
        r = np.rint(np.asarray(a).astype(np.float32) * (np.float32(1) / s))
        return np.where(r < qmin, qmin, np.where(r > qmax, qmax, r))

    qx, qw = codes(x, x_scale), codes(w, w_scale)
    nan = np.isnan(qx).any(axis=-1, keepdims=True) | np.isnan(qw).any(axis=0)
    acc = np.nan_to_num(qx).astype(np.int64) @ np.nan_to_num(qw).astype(np.int64)
    y = acc.astype(np.float32) * np.asarray(x_scale).astype(np.float32) * np.asarray(w_scale).astype(np.float32)
    return np.where(nan, np.float32(np.nan), y).astype(dtype)


def composition(x, w, x_scale, w_scale, bits=8):
    return stejax.fake_quant(x, x_scale, bits=bits) @ stejax.fake_quant(w, w_scale, bits=bits, axis=1)


def same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def operands(dtype, *, shape=(2, 3, 24), n=5, seed=0):
    """Random x and w with scales from absmax, and the special values a grid meets: ties, saturation, inf, NaN."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0.0, 1.0, shape).astype(np.float32)
    w = rng.normal(0.0, 0.5, (shape[-1], n)).astype(np.float32)
    x_scale = np.float32(0.03125)
    w_scale = np.array([2.0**-6, 0.0125, 0.02, 2.0**-5, 0.01], np.float32)[:n]
    rows = x.reshape(-1, shape[-1])  # a view
    rows[0, :6] = np.array([0.5, 1.5, -2.5, 127.5, -128.5, 200.0]) * x_scale  # ties and clipping
    rows[1, :3] = [np.inf, -np.inf, 0.0]
    rows[-1, 4] = np.nan  # one NaN row
    w[3, 4] = np.nan  # one NaN column
    w[:4, 1] = np.array([0.5, -0.5, 127.5, -300.0]) * w_scale[1]
    cast = np.dtype(getattr(ml_dtypes, dtype) if dtype == "bfloat16" else dtype)
    return x.astype(cast), w.astype(cast), x_scale.astype(cast), w_scale.astype(cast)


_jitted_product = jax.jit(quantized_matmul, static_argnames="bits")  # one function for every case


# Every dtype at 8 bits; 4 bits (other clip bounds, the same code path once the codes are float32) in bfloat16,
# the dtype whose rounding of the scaled product is coarsest.
@pytest.mark.parametrize(("dtype", "bits"), [*((d, 8) for d in DTYPES), ("bfloat16", 4)])
def test_forward_equals_the_integer_reference_bit_for_bit(dtype, bits):
    x, w, sx, sw = operands(dtype)
    expected = reference(x, w, sx, sw, bits)
    operands_on_device = [jax.device_put(a) for a in (x, w, sx, sw)]  # transfers, not copy programs
    eager = quantized_matmul(*operands_on_device, bits=bits)
    jitted = _jitted_product(*operands_on_device, bits=bits)
    assert same_bits(eager, expected)
    assert same_bits(jitted, expected)
    nan_rows = np.isnan(np.asarray(expected, np.float32)).all(axis=-1)
    assert nan_rows[1, 2] and nan_rows.sum() == 1, "NaN in x must show in its row, and only there"
    assert np.isnan(np.asarray(expected, np.float32)[..., 4]).all(), "NaN in w must show in its column"


def test_the_int32_sum_is_exact_and_its_float32_conversion_rounds_once_above_two_to_the_24():
    # 2048 products of 127 * 127 and one odd term: 33032193, not a float32 (it rounds to 33032192).
    k = 2049
    x = np.full((1, k), 127.0, np.float32)
    w = np.full((k, 1), 127.0, np.float32)
    x[0, -1], w[-1, 0] = 1.0, 1.0
    y = np.asarray(jax.jit(quantized_matmul)(x, w, np.float32(1.0), np.ones(1, np.float32)))
    exact = 127 * 127 * 2048 + 1
    assert same_bits(y, reference(x, w, np.float32(1.0), np.ones(1, np.float32), 8))
    assert float(y[0, 0]) == float(np.float32(exact)) != exact


@pytest.fixture(scope="module")
def float32_case():
    x, w, _, _ = operands("float32", shape=(6, 64), n=16, seed=1)
    x, w = np.nan_to_num(x, nan=0.3, posinf=9.0, neginf=-9.0), np.nan_to_num(w, nan=0.1)
    x_scale = np.asarray(stejax.absmax_scale(x, bits=8)) * np.float32(0.5)  # half the range: the largest inputs clip
    w_scale = stejax.absmax_scale(w, bits=8, axis=1)
    return x, w, x_scale, w_scale


def test_close_to_the_fake_quant_composition_within_float32_summation_bound(float32_case):
    x, w, sx, sw = float32_case
    y, fq = np.asarray(quantized_matmul(x, w, sx, sw)), np.asarray(composition(x, w, sx, sw))
    qx = np.asarray(stejax.fake_quant(x, sx, bits=8)) / np.asarray(sx)
    qw = np.asarray(stejax.fake_quant(w, sw, bits=8, axis=1)) / np.asarray(sw)
    k = x.shape[-1]
    # The float32 sum of K rounded products, against the exact integer sum rescaled with three roundings.
    bound = (k + 3) * 2.0**-24 * (np.abs(qx) @ np.abs(qw)) * np.asarray(sx) * np.asarray(sw)
    assert np.all(np.abs(y - fq) <= bound), np.max(np.abs(y - fq) / bound)
    assert not np.array_equal(y, fq), "absmax scales are not powers of two: some sums should round differently"


def test_equal_to_the_composition_when_every_float_operation_is_exact():
    # Power-of-two scales and K * 128^2 < 2^24: every product and partial sum of the composition is exact.
    # The shapes of float32_case: the eager programs of the test above serve this one too.
    x, w, _, _ = operands("float32", shape=(6, 64), n=16, seed=2)
    x, w = np.nan_to_num(x, nan=0.0, posinf=1.0, neginf=-1.0), np.nan_to_num(w, nan=0.0)
    sx, sw = np.float32(2.0**-5), np.full(16, 2.0**-7, np.float32)
    zero = np.float32(0.0)  # + 0.0 turns -0.0 into +0.0 (exact, on the host)
    assert same_bits(np.asarray(quantized_matmul(x, w, sx, sw)) + zero, np.asarray(composition(x, w, sx, sw)) + zero)


def test_grad_equals_the_fake_quant_composition_exactly(float32_case):
    # The declared tangent is the composition's: the same dequantised operands, masks and float32 dots,
    # so the transposed rules run the same operations and agree bit for bit.
    x, w, sx, sw = float32_case
    cotangent = np.random.default_rng(3).normal(size=(x.shape[0], w.shape[1])).astype(np.float32)

    def loss(fn):
        return lambda x, w: jnp.sum(fn(x, w, sx, sw) * cotangent)

    for transform in (lambda f: f, jax.jit):
        got = transform(jax.grad(loss(quantized_matmul), argnums=(0, 1)))(x, w)
        want = transform(jax.grad(loss(composition), argnums=(0, 1)))(x, w)
        for g, h in zip(got, want, strict=True):
            assert same_bits(g, h)
    r = np.rint(x * (np.float32(1) / np.asarray(sx)))
    clipped = (r < -128) | (r > 127)
    assert clipped.any() and not np.asarray(got[0])[clipped].any(), "clipped inputs get no gradient"
    scale_grads = jax.jit(jax.grad(lambda sx, sw: jnp.sum(quantized_matmul(x, w, sx, sw)), argnums=(0, 1)))(sx, sw)
    assert all(not np.any(np.asarray(g)) for g in scale_grads), "scales are calibration constants"


def _reference_forward(x, w, x_scale, w_scale):
    # Independent of the estimator: float32 codes (a quotient, equal to x * (1 / s) for the power-of-two scales
    # used here) and a float32 product of codes, exact while K * 128^2 < 2^24.
    def codes(a, s):
        return jnp.clip(jnp.round(a.astype(jnp.float32) / s.astype(jnp.float32)), -128, 127)

    y = jnp.matmul(codes(x, x_scale), codes(w, w_scale[None, :]), precision="highest")
    w_scale = w_scale.reshape((1,) * (y.ndim - 1) + (-1,))
    return (y * x_scale.astype(jnp.float32) * w_scale.astype(jnp.float32)).astype(x.dtype)


def _composition_tangent(args, tangents):
    x, w, x_scale, w_scale = args
    return jax.jvp(lambda a, b: composition(a, b, x_scale, w_scale), (x, w), tuple(tangents))[1]


def test_check_surrogate_passes_with_the_composition_as_the_declared_tangent():
    x_scale = np.float32(0.125)
    w = (np.arange(-7.0, 8.0, dtype=np.float32).reshape(5, 3) * 0.1875).astype(np.float32)
    w_scale = np.array([0.0625, 0.125, 0.25], np.float32)
    report = check_surrogate(
        quantized_matmul,
        reference=jax.jit(_reference_forward),  # the same operations, one compiled program per dtype
        tangent_map=_composition_tangent,
        args=(np.zeros((4, 5), np.float32), w, x_scale, w_scale),
        boundaries=tuple((k + 0.5) * 0.125 for k in (-129, -128, -1, 0, 126, 127)),
        diff_argnums=(0, 1),
        composition_dtypes="widest",
    )
    assert report.ok, "\n".join(f"{c.name}: {c.detail}" for c in report.failures)
    assert report.environment["declaration"] == "tangent_map"


X, W, SX, SW = np.ones((2, 3), np.float32), np.ones((3, 4), np.float32), np.float32(0.1), np.full(4, 0.1, np.float32)


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((X, W, SX, SW), {"bits": 9}, ValueError, r"bits must be an int in \[2, 8\].*got 9"),
        ((X, W, SX, SW), {"bits": 1}, ValueError, r"bits must be an int in \[2, 16\].*got 1"),
        ((X, W, SX, SW), {"bits": 8.0}, TypeError, "bits must be an int"),
        ((X, W[0], SX, SW), {}, ValueError, r"w must have shape \(K, N\).*got shape \(4,\)"),
        ((np.float32(1), W, SX, SW), {}, ValueError, r"x must have shape \(\.\.\., K\).*got shape \(\)"),
        ((X, W[:2], SX, SW), {}, ValueError, r"must match.*\(2, 3\).*\(2, 4\)"),
        ((X, W, np.ones(1, np.float32), SW), {}, ValueError, r"x_scale must be a scalar.*\(1,\)"),
        ((X, W, SX, SW[:3]), {}, ValueError, r"w_scale must have shape \(4,\).*got shape \(3,\)"),
        ((X, W, np.float32(0), SW), {}, ValueError, r"x_scale must be positive.*0\.0"),
        ((X, W, SX, -SW), {}, ValueError, r"w_scale must be positive.*at index 0"),
        ((X.astype(np.int32), W, SX, SW), {}, TypeError, "must be a floating-point array.*int32"),
        ((X, W.astype(np.float16), SX, SW), {}, TypeError, "share one floating dtype"),
        (
            (np.zeros((1, 131073), np.float32), np.zeros((131073, 1), np.float32), SX, SW[:1]),
            {},
            ValueError,
            r"overflow the int32 sum.*at most 131071",
        ),
    ],
)
def test_bad_input_is_refused_with_a_clear_error(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        quantized_matmul(*args, **kwargs)
