"""The latent family: FSQ, vector quantization, the rotation trick, straight-through Gumbel-softmax.

Every reference here is written from the formulas in NumPy (float64 unless a
per-op float32 mirror is needed), never by calling the library's private
functions.
"""

import functools
import math
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from stejax.estimators import latent
from stejax.estimators.latent import (
    VQResult,
    fsq,
    fsq_codes_to_indices,
    fsq_indices_to_codes,
    gumbel_softmax_st,
    rotation_trick,
    vq_quantize,
    vq_ste,
)

from helpers import CONTRACT, assert_bitwise_equal, assert_platform_equal, boundary_triplets, special_values

LEVELS = [(8, 5, 5, 5), (2, 3, 4), (5, 3), (7, 6)]
# The platform contract's absolute error of float32 tanh on results up to 1 (0 on CPU).
TANH_ERROR = CONTRACT.function_error("tanh")
ENTRIES = {e.name: e for e in latent.ENTRIES}
BF16 = np.dtype(ml_dtypes.bfloat16)
# Host arrays go to the device with jax.device_put, a transfer: jnp.asarray of a NumPy array compiles a program
# (`stage`) per shape and dtype, and on an accelerator every program costs a compilation.


def _zeros(shape, dtype=np.float32) -> jax.Array:
    """``jnp.zeros`` built on the host and transferred: no program to compile."""
    return jax.device_put(np.zeros(shape, dtype))


def _eps(dtype) -> float:
    return float(ml_dtypes.finfo(dtype).eps)


def _uint(a: np.ndarray) -> np.ndarray:
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


# --------------------------------------------------------------------------------------------
# FSQ
# --------------------------------------------------------------------------------------------


def _fsq_constants(levels):
    """The paper's constants from the formula, in float64: (h, o, s, w)."""
    lv = np.asarray(levels, np.float64)
    half_l = (lv - 1) * (1 + 1e-3) / 2
    offset = np.where(lv % 2 == 0, 0.5, 0.0)
    shift = np.arctanh(offset / half_l)
    half_width = np.floor(lv / 2)
    return half_l, offset, shift, half_width


def _fsq_numpy(z: np.ndarray, levels):
    """NumPy mirror of the documented float32 evaluation, with float64 tanh.

    Returns the output in z's dtype and the bounded value b computed wholly in
    float64, so the caller can tell where b is within reach of a rounding tie.
    """
    half_l, offset, shift, half_width = _fsq_constants(levels)
    f32 = np.float32
    u = z.astype(f32) + shift.astype(f32)
    th64 = np.tanh(u.astype(np.float64))
    bounded = (th64.astype(f32) - (offset / half_l).astype(f32)) * half_l.astype(f32)
    quantized = np.round(bounded)
    quantized[quantized == 0] = 0  # zero codes are +0.0
    out = (quantized * (1 / half_width).astype(f32)).astype(z.dtype)
    return out, th64 * half_l - offset


def _fsq_jnp(z: jax.Array, levels) -> jax.Array:
    """The documented evaluation written with jnp, independently of the library."""
    half_l, offset, shift, half_width = _fsq_constants(levels)
    shape = (1,) * (z.ndim - 1) + (-1,)

    def const(a):
        return jnp.asarray(a.reshape(shape), jnp.float32)

    th = jnp.tanh(z.astype(jnp.float32) + const(shift))
    quantized = jnp.round((th - const(offset / half_l)) * const(half_l))
    quantized = jnp.where(quantized == 0, 0, quantized)
    return (quantized * const(1 / half_width)).astype(z.dtype)


def _fsq_ties(levels) -> np.ndarray:
    """z where tanh(z + s) h - o = k + 1/2 for some channel's L."""
    points = []
    for level in sorted(set(levels)):
        half_l, offset, shift, _ = _fsq_constants((level,))
        for k in range(-level, level):
            t = k + 0.5
            if abs(t + offset[0]) < half_l[0]:
                points.append(np.arctanh((t + offset[0]) / half_l[0]) - shift[0])
    return np.sort(np.asarray(points))


# XLA's float32 tanh is within ~5 ulp (<= 3e-7 absolute) of the true tanh, and
# NumPy's is not the same function, so the float32 bounded value b can differ
# from NumPy's by a few ulp. round(b) then agrees except where b lies within that
# reach of a tie k + 1/2. The window is ~30 ulp of b: generous, and still far
# narrower than the spacing of any dtype's inputs around the tie.
def _tie_window(levels) -> np.ndarray:
    half_l, *_ = _fsq_constants(levels)
    # Widened by the platform contract's error of float32 tanh (0 on CPU): FSQ rounds the platform's own tanh.
    return 2.0**-18 * np.maximum(half_l, 1.0) + half_l * TANH_ERROR


def _assert_fsq_matches_numpy(actual, z, levels, context):
    expected, bounded = _fsq_numpy(z, levels)
    near_tie = np.abs(bounded - (np.floor(bounded) + 0.5)) <= _tie_window(levels)
    far = ~near_tie
    assert_bitwise_equal(np.asarray(actual)[far], expected[far], context=context)
    # Near a tie either neighbour is a faithful rounding; nothing else is.
    _, _, _, half_width = _fsq_constants(levels)
    lower = (np.floor(bounded) / half_width).astype(np.float64)
    got = np.asarray(actual).astype(np.float64)
    ok = np.isclose(got, lower, rtol=0, atol=1e-3) | np.isclose(got, lower + 1 / half_width, rtol=0, atol=1e-3)
    assert ok[near_tie].all(), f"{context}: a value near a tie is neither neighbour"
    return int(near_tie.sum())


def _fsq_inputs(levels, dtype, seed=0):
    n = len(levels)
    rng = np.random.default_rng(seed)
    random = (rng.standard_normal((40, n)) * 2.0).astype(dtype)
    ties = boundary_triplets(_fsq_ties(levels), dtype)
    specials = special_values(dtype)
    # Every tie and special value on every channel at once.
    on_all = np.repeat(np.concatenate([ties, specials])[:, None], n, axis=1)
    return np.concatenate([random, on_all]).astype(dtype)


@pytest.mark.parametrize("levels", LEVELS[:3], ids=str)
def test_fsq_forward(levels, dtype):
    z = _fsq_inputs(levels, dtype)
    zj = jax.device_put(z)
    run = functools.partial(fsq, levels=levels)
    eager = np.asarray(run(zj))
    assert eager.dtype == dtype and eager.shape == z.shape
    # Bit for bit: the documented formula written with jnp, eagerly and under jit.
    assert_bitwise_equal(eager, np.asarray(_fsq_jnp(zj, levels)), context="eager vs jnp formula")
    # Both jitted in one program, compiled once.
    jitted, formula_jit = jax.jit(lambda z: (run(z), _fsq_jnp(z, levels)))(zj)
    assert_bitwise_equal(np.asarray(jitted), np.asarray(formula_jit), context="jit vs jnp formula")
    assert_bitwise_equal(np.asarray(jitted), eager, context="jit vs eager")
    # Against NumPy, bit for bit away from the ties (see _tie_window).
    near = _assert_fsq_matches_numpy(eager, z, levels, f"fsq {levels}")
    if dtype != np.float32 and CONTRACT.bitwise:
        # A low-precision input sits at least half its own ulp away from a tie, far outside the window.
        assert near == 0


@pytest.mark.parametrize("levels", LEVELS, ids=str)
def test_fsq_takes_exactly_the_levels(levels):
    z = np.repeat(np.linspace(-10, 10, 4001, dtype=np.float32)[:, None], len(levels), axis=1)
    y = np.asarray(jax.jit(functools.partial(fsq, levels=levels))(jax.device_put(z)))  # one program, not op by op
    for i, level in enumerate(levels):
        half_width = level // 2
        grid = (np.arange(level) - half_width).astype(np.float32) * np.float32(1 / half_width)
        np.testing.assert_array_equal(np.unique(y[:, i]), grid, err_msg=f"channel {i}, L={level}")
    assert np.all(np.diff(y, axis=0) >= 0), "fsq must be monotone in z"


def test_fsq_zero_codes_are_positive_zero(dtype):
    z = np.array([[0.0, -0.0, -0.0], [-0.0, -0.1, -0.2], [1e-3, -1e-3, 0.1]], dtype)
    y = np.asarray(jax.jit(functools.partial(fsq, levels=(8, 5, 3)))(jax.device_put(z)))  # one program
    assert_bitwise_equal(y, np.zeros_like(z), context="zero codes")


def test_fsq_boundaries_are_the_ties():
    probes = []  # (level, point, [[below], [above]])
    for levels in [(8, 5, 5, 5), (2, 3, 4)]:
        declared = np.asarray(ENTRIES["fsq"].boundaries(levels=levels))
        np.testing.assert_allclose(declared, _fsq_ties(levels), rtol=1e-12, atol=1e-12)
        # The output of the matching channel jumps across each point.
        for level in set(levels):
            for point in _fsq_ties((level,)):
                # Far enough that the platform's tanh error (0 on CPU) cannot hide the jump.
                slope = 1 - np.tanh(point + _fsq_constants((level,))[2][0]) ** 2
                margin = max(1e-4, 4 * TANH_ERROR / slope)
                below, above = boundary_triplets([point - margin, point + margin], np.float32)[[1, 4]]
                probes.append((level, point, np.float32([[below], [above]])))
    # Every probe in one jitted program, not op by op.
    ys = jax.jit(lambda zs: [fsq(z, levels=(level,)) for (level, _, _), z in zip(probes, zs, strict=True)])(
        [jax.device_put(z) for _, _, z in probes]
    )
    for (level, point, _), y in zip(probes, ys, strict=True):
        y = np.asarray(y)
        assert y[1, 0] > y[0, 0], f"no jump at {point} for L={level}"


def _fsq_derivative_numpy(z, levels):
    half_l, _, shift, half_width = _fsq_constants(levels)
    return half_l * (1 - np.tanh(z.astype(np.float64) + shift) ** 2) / half_width


def _fsq_derivative_tolerance(levels, dtype):
    # The float32 tanh is within ~3e-7 of the truth and z + s is rounded to float32,
    # so 1 - tanh^2 is good to ~2e-6 absolute; the result is then rounded once to dtype.
    half_l, _, _, half_width = _fsq_constants(levels)
    # On other platforms the contract's error of float32 tanh comes on top, twice (1 - tanh^2; 0 on CPU).
    atol = (4e-6 + 2 * TANH_ERROR) * float(np.max(half_l / half_width))
    return {"rtol": _eps(dtype) * (1 + CONTRACT.ulps(dtype)), "atol": atol}


@pytest.mark.parametrize("levels", LEVELS[:2], ids=str)
def test_fsq_gradient_and_jvp(levels, dtype):
    rng = np.random.default_rng(1)
    z = (rng.standard_normal((16, len(levels))) * 2.0).astype(dtype)
    z[0] = 0.0
    t = rng.standard_normal(z.shape).astype(dtype)
    run = functools.partial(fsq, levels=levels)
    expected = _fsq_derivative_numpy(z, levels)
    tol = _fsq_derivative_tolerance(levels, dtype)

    # The gradient and the jvp in one jitted program, compiled once.
    grad, (_, ty) = jax.jit(lambda z, t: (jax.grad(lambda z: jnp.sum(run(z)))(z), jax.jvp(run, (z,), (t,))))(
        jax.device_put(z), jax.device_put(t)
    )
    grad = np.asarray(grad)
    assert grad.dtype == dtype
    np.testing.assert_allclose(grad.astype(np.float64), expected, **tol)

    assert ty.dtype == dtype
    # One rounding of d * t in dtype on top of the derivative's own.
    np.testing.assert_allclose(
        np.asarray(ty).astype(np.float64),
        expected * t.astype(np.float64),
        rtol=2 * _eps(dtype),
        atol=tol["atol"] * float(np.max(np.abs(t.astype(np.float64)))),
    )
    assert_platform_equal(np.asarray(ty), (grad * t).astype(dtype), context="jvp = derivative * t")


def test_fsq_derivative_at_specials(dtype):
    z = np.array([[np.inf, -np.inf, np.nan]], dtype)
    grad = np.asarray(jax.jit(jax.grad(lambda z: jnp.sum(fsq(z, levels=(8, 5, 3)))))(jax.device_put(z)))  # one program
    assert grad[0, 0] == 0 and grad[0, 1] == 0 and np.isnan(grad[0, 2].astype(np.float32))


@pytest.mark.parametrize(
    ("z_shape", "levels", "error", "match"),
    [
        ((3, 3), (8, 5, 5, 5), ValueError, r"fsq: .*len\(levels\) = 4.*\(3, 3\)"),
        ((), (8,), ValueError, r"fsq: .*at least one axis"),
        ((3, 0), (), ValueError, r"fsq: `levels` must name at least one channel"),
        ((3, 2), (8, 1), ValueError, r"fsq: .*>= 2; got 1"),
        ((3, 2), (8, 2.5), TypeError, r"fsq: .*int >= 2; got 2.5"),
        ((3, 2), (True, 5), TypeError, r"fsq: .*int >= 2; got True"),
        ((3, 1), 8, TypeError, r"fsq: `levels` must be a tuple of ints.*got 8"),
        ((3, 2), "85", TypeError, r"fsq: `levels` must be a tuple of ints"),
    ],
)
def test_fsq_errors(z_shape, levels, error, match):
    with pytest.raises(error, match=match):
        fsq(_zeros(z_shape, np.float32), levels=levels)


def test_fsq_rejects_integer_input():
    with pytest.raises(TypeError, match=r"fsq: .*floating-point"):
        fsq(_zeros((2, 2), np.int32), levels=(3, 3))


def test_fsq_levels_may_be_a_list():
    z = jax.device_put(np.float32([[0.3, -0.9]]))
    # Both in one jitted program (the same kind of program for the two sides), not op by op.
    from_list, from_tuple = jax.jit(lambda z: (fsq(z, levels=[8, 5]), fsq(z, levels=(8, 5))))(z)
    assert_bitwise_equal(from_list, np.asarray(from_tuple), context="list levels")


# FSQ codes and indices --------------------------------------------------------------------


def _indices_numpy(codes: np.ndarray, levels) -> np.ndarray:
    """Mixed radix, first channel least significant."""
    lv = np.asarray(levels)
    half_width = lv // 2
    digits = np.round(codes.astype(np.float64) * half_width).astype(np.int64) + half_width
    basis = np.concatenate(([1], np.cumprod(lv[:-1])))
    return (digits * basis).sum(-1)


@pytest.mark.parametrize("levels", LEVELS, ids=str)
def test_fsq_indices_round_trip(levels):
    size = math.prod(levels)
    indices = jax.device_put(np.arange(size, dtype=np.int32))

    def there_and_back(indices):  # one jitted program, not op by op
        codes = fsq_indices_to_codes(indices, levels=levels)
        return codes, fsq_codes_to_indices(codes, levels=levels)

    codes, back = jax.jit(there_and_back)(indices)
    assert codes.shape == (size, len(levels)) and codes.dtype == jnp.float32
    assert len(np.unique(np.asarray(codes), axis=0)) == size
    assert back.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(back), np.arange(size))
    np.testing.assert_array_equal(np.asarray(back), _indices_numpy(np.asarray(codes), levels))


@pytest.mark.parametrize("levels", LEVELS[:2], ids=str)
def test_fsq_codes_round_trip_bitwise(levels, dtype):
    z = jax.device_put((np.random.default_rng(2).standard_normal((64, len(levels))) * 2).astype(dtype))

    def round_trip(z):  # one jitted program, not op by op
        y = fsq(z, levels=levels)
        indices = fsq_codes_to_indices(y, levels=levels)
        return y, indices, fsq_indices_to_codes(indices, levels=levels, dtype=dtype)

    y, indices, codes = jax.jit(round_trip)(z)
    np.testing.assert_array_equal(np.asarray(indices), _indices_numpy(np.asarray(y), levels))
    assert_bitwise_equal(codes, np.asarray(y), context="fsq -> indices -> codes")


def test_fsq_indices_known_values_and_modulo():
    indices = jax.device_put(np.array([[0, 1], [39, 40]], np.int32))
    codes = jax.jit(functools.partial(fsq_indices_to_codes, levels=(8, 5)))(indices)  # one program, not op by op
    expected = np.float32([[[-1, -1], [-0.75, -1]], [[0.75, 1], [-1, -1]]])
    np.testing.assert_array_equal(np.asarray(codes), expected)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: fsq_codes_to_indices(_zeros((2, 2)), levels=(65536, 65536)), ValueError, r"int32"),
        (lambda: fsq_indices_to_codes(_zeros(2, np.int32), levels=(65536, 65536)), ValueError, r"int32"),
        (lambda: fsq_codes_to_indices(_zeros((2, 2), np.int32), levels=(3, 3)), TypeError, r"floating"),
        (lambda: fsq_codes_to_indices(_zeros((2, 3)), levels=(3, 3)), ValueError, r"len\(levels\) = 2"),
        (lambda: fsq_indices_to_codes(_zeros(2), levels=(3, 3)), TypeError, r"integer array"),
        (
            lambda: fsq_indices_to_codes(_zeros(2, np.int32), levels=(3, 3), dtype=jnp.int32),
            TypeError,
            "dtype",
        ),
        (lambda: fsq_indices_to_codes(_zeros(2, np.int32), levels=(3, 1)), ValueError, ">= 2"),
    ],
)
def test_fsq_index_helper_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()


# --------------------------------------------------------------------------------------------
# Vector quantization
# --------------------------------------------------------------------------------------------


def _distances_numpy(z: np.ndarray, codebook: np.ndarray) -> np.ndarray:
    diff = z.astype(np.float64)[..., None, :] - codebook.astype(np.float64)
    return (diff**2).sum(-1)


_vq_all = jax.jit(lambda z, c: (vq_ste(z, c), vq_quantize(z, c), rotation_trick(z, c)))
# vq_ste jitted, one program per shape and dtype (shared by the cases of a test), not op by op.
_vq_ste = jax.jit(vq_ste)


def test_vq_exact_distances_and_ties_match_numpy(dtype):
    # Small integers: every distance is exact in float32 in any summation order, so the
    # argmin (ties to the lowest index) must agree with NumPy's exactly. Ties abound.
    rng = np.random.default_rng(3)
    z = rng.integers(-3, 4, (200, 3)).astype(dtype)
    codebook = rng.integers(-3, 4, (9, 3)).astype(dtype)
    expected_idx = np.argmin(_distances_numpy(z, codebook), axis=-1)
    distances = _distances_numpy(z, codebook)
    assert (np.sort(distances, axis=-1)[:, 1] == distances.min(-1)).any(), "the data must contain ties"
    # The three estimators in one jitted program, not op by op.
    out, quantized, rotated = _vq_all(jax.device_put(z), jax.device_put(codebook))
    np.testing.assert_array_equal(np.asarray(out.indices), expected_idx)
    assert_bitwise_equal(out.quantized, codebook[expected_idx], context="vq_ste")
    assert_bitwise_equal(quantized, codebook[expected_idx])
    assert_bitwise_equal(rotated, codebook[expected_idx])


@pytest.mark.parametrize("order", [(0, 1, 2), (2, 1, 0), (1, 2, 0)])
def test_vq_exact_tie_goes_to_the_lowest_index(order):
    codes = np.float32([[0.0, 0.0], [1.0, 0.0], [0.5, 0.5]])[list(order)]
    z = np.float32([[0.5, 0.0]])  # 0.25 from each of the three codes
    out = _vq_ste(jax.device_put(z), jax.device_put(codes))
    assert int(np.asarray(out.indices)[0]) == 0
    assert_bitwise_equal(out.quantized, codes[[0]], context="tie")


def test_vq_random_matches_numpy_within_rounding(dtype):
    rng = np.random.default_rng(4)
    dim = 6
    z = rng.standard_normal((300, dim)).astype(dtype)
    codebook = rng.standard_normal((16, dim)).astype(dtype)
    distances = _distances_numpy(z, codebook)
    best = distances.min(-1)
    out = _vq_ste(jax.device_put(z), jax.device_put(codebook))
    idx = np.asarray(out.indices)
    chosen = distances[np.arange(len(z)), idx]
    # float32 evaluation of sum_d (z_d - c_d)^2: each distance is within (dim + 3) 2^-24 of
    # itself relative, so a different pick is allowed only between codes that close.
    bound = (dim + 3) * 2.0**-24 * (chosen + best)
    assert np.all(chosen - best <= bound)
    np.testing.assert_array_equal(idx, np.argmin(distances, -1))  # no such near-ties in this data
    assert_bitwise_equal(out.quantized, codebook[idx], context="quantized")


def test_vq_gradients_and_losses(dtype):
    rng = np.random.default_rng(5)
    z = rng.standard_normal((4, 5, 3)).astype(dtype)
    codebook = rng.standard_normal((7, 3)).astype(dtype)
    w = rng.standard_normal(z.shape).astype(dtype)
    zj, cj, wj = jax.device_put(z), jax.device_put(codebook), jax.device_put(w)
    idx = np.argmin(_distances_numpy(z, codebook), -1)
    q = codebook[idx].astype(np.float64)
    n = z.size

    def program(z, c):
        # Every gradient in one jitted program, compiled once.
        def grads(loss):
            return jax.grad(lambda z, c: loss(vq_ste(z, c)), argnums=(0, 1))(z, c)

        return {
            "quantized": grads(lambda out: jnp.sum(out.quantized * wj)),
            "jvp": jax.jvp(lambda z: vq_quantize(z, c), (z,), (wj,))[1],
            "commitment": grads(lambda out: out.commitment_loss),
            "codebook": grads(lambda out: out.codebook_loss),
            "out": vq_ste(z, c),
        }

    jitted = jax.jit(program)(zj, cj)

    # Straight through to z; the codebook is a constant of the quantized path.
    gz, gc = jitted["quantized"]
    assert_bitwise_equal(gz, w, context="dq/dz = I")
    assert_bitwise_equal(gc, np.zeros_like(codebook), context="no codebook gradient through q")
    assert_bitwise_equal(jitted["jvp"], w, context="jvp")

    out = jitted["out"]
    assert out.commitment_loss.dtype == out.codebook_loss.dtype == dtype
    assert out.commitment_loss.shape == ()
    loss = np.mean((z.astype(np.float64) - q) ** 2)
    # z - q and its square are each rounded in dtype, the mean accumulates in float32
    # (a few float32 roundings for 60 terms) and is rounded once to dtype.
    tol = {"rtol": 3 * _eps(dtype) + 16 * 2.0**-24, "atol": 0}
    np.testing.assert_allclose(float(out.commitment_loss), loss, **tol)
    np.testing.assert_allclose(float(out.codebook_loss), loss, **tol)

    # Commitment: gradient 2 (z - q) / N to z only.
    gz, gc = jitted["commitment"]
    grad_tol = {"rtol": 4 * _eps(dtype), "atol": 4 * _eps(dtype) / n}
    np.testing.assert_allclose(np.asarray(gz).astype(np.float64), 2 * (z - q) / n, **grad_tol)
    assert_bitwise_equal(gc, np.zeros_like(codebook), context="commitment -> codebook")

    # Codebook: gradient 2 (q - z) / N scattered onto the chosen codes, none to z.
    gz, gc = jitted["codebook"]
    expected = np.zeros(codebook.shape)
    np.add.at(expected, idx.reshape(-1), (2 * (q - z.astype(np.float64)) / n).reshape(-1, 3))
    np.testing.assert_allclose(np.asarray(gc).astype(np.float64), expected, **grad_tol)
    assert_bitwise_equal(gz, np.zeros_like(z), context="codebook loss -> z")


def test_vq_result_is_a_named_tuple():
    out = _vq_ste(jax.device_put(np.ones((2, 3), np.float32)), _zeros((4, 3)))  # jitted: a VQResult comes back too
    assert isinstance(out, VQResult)
    assert out._fields == ("quantized", "indices", "commitment_loss", "codebook_loss")
    assert out.indices.shape == (2,) and jnp.issubdtype(out.indices.dtype, jnp.integer)


def test_vq_vmap_with_a_shared_codebook():
    rng = np.random.default_rng(6)
    z = jax.device_put(rng.standard_normal((3, 5, 4)).astype(np.float32))
    codebook = jax.device_put(rng.standard_normal((6, 4)).astype(np.float32))
    fns = (vq_quantize, rotation_trick)
    # Mapped and unmapped, both estimators, in one jitted program, not op by op.
    results = jax.jit(lambda z, c: [(jax.vmap(fn, in_axes=(0, None))(z, c), fn(z, c)) for fn in fns])(z, codebook)
    for fn, (mapped, unmapped) in zip(fns, results, strict=True):
        assert_bitwise_equal(mapped, np.asarray(unmapped), context=fn.__name__)


@pytest.mark.parametrize("fn", [vq_quantize, rotation_trick, vq_ste], ids=lambda f: f.__name__)
@pytest.mark.parametrize(
    ("z_shape", "c_shape"),
    [((4, 3), (5,)), ((4, 3), (5, 2)), ((4, 3), (0, 3)), ((4, 3), (1, 5, 3)), ((), (5, 1))],
)
def test_vq_shape_errors(fn, z_shape, c_shape):
    if z_shape == ():
        match = rf"{fn.__name__}: the input z must have at least one axis"
    else:
        match = rf"{fn.__name__}: the codebook must have shape \(K, D\) .*" + re.escape(
            f"got z of shape {z_shape} and codebook of shape {c_shape}"
        )
    with pytest.raises(ValueError, match=match):
        fn(_zeros(z_shape), _zeros(c_shape))


@pytest.mark.parametrize("fn", [vq_quantize, vq_ste, rotation_trick])
def test_vq_dtype_errors(fn):
    name = {vq_ste: "vq_ste", vq_quantize: "vq_quantize", rotation_trick: "rotation_trick"}[fn]
    with pytest.raises(TypeError, match=rf"{name}: .*share one floating dtype"):
        fn(_zeros((2, 3), np.float32), _zeros((4, 3), BF16))
    with pytest.raises(TypeError, match=rf"{name}: .*floating-point"):
        fn(_zeros((2, 3), np.float32), _zeros((4, 3), np.int32))


# --------------------------------------------------------------------------------------------
# The rotation trick
# --------------------------------------------------------------------------------------------


def _rotation_numpy(z: np.ndarray, q: np.ndarray):
    """Per vector, in float64: (lambda, R, e, f)."""
    z, q = z.astype(np.float64), q.astype(np.float64)
    e = z / np.linalg.norm(z)
    f = q / np.linalg.norm(q)
    r = (e + f) / np.linalg.norm(e + f)
    eye = np.eye(len(z))
    return np.linalg.norm(q) / np.linalg.norm(z), eye - 2 * np.outer(r, r) + 2 * np.outer(f, e), e, f


def _rotation_case(dtype, seed=7, n=12, dim=4):
    rng = np.random.default_rng(seed)
    z = (rng.standard_normal((n, dim)) * 2).astype(dtype)
    codebook = rng.standard_normal((8, dim)).astype(dtype)
    q = codebook[np.argmin(_distances_numpy(z, codebook), -1)]
    return z, codebook, q


# Per-dtype tolerance on the rotated tangent, relative to lambda * |t|: float32 carries
# O(D) roundings through the norms and dot products; float16 and bfloat16 are computed
# in float32 and rounded once, so their own epsilon dominates.
def _rotation_tolerance(dtype) -> float:
    return 2e-6 if dtype == np.float32 else 2 * _eps(dtype)


def test_rotation_tangent_matches_numpy(dtype):
    z, codebook, q = _rotation_case(dtype)
    t = np.random.default_rng(8).standard_normal(z.shape).astype(dtype)
    # The jvp in one jitted program, not op by op.
    jvp = jax.jit(lambda z, c, t: jax.jvp(lambda z: rotation_trick(z, c), (z,), (t,)))
    y, ty = jvp(jax.device_put(z), jax.device_put(codebook), jax.device_put(t))
    assert_bitwise_equal(y, q, context="forward")
    assert ty.dtype == dtype
    ty_host = np.asarray(ty)
    tol = _rotation_tolerance(dtype)
    for i in range(len(z)):
        lam, rot, _, _ = _rotation_numpy(z[i], q[i])
        expected = lam * rot @ t[i].astype(np.float64)
        scale = lam * np.linalg.norm(t[i].astype(np.float64))
        np.testing.assert_allclose(ty_host[i].astype(np.float64), expected, rtol=0, atol=tol * scale)


def test_rotation_gradient_is_the_transpose(dtype):
    z, codebook, q = _rotation_case(dtype, seed=9)
    w = np.random.default_rng(10).standard_normal(z.shape).astype(dtype)

    def loss(z, c):
        return jnp.sum(rotation_trick(z, c) * jnp.asarray(w))

    # Both gradients in one jitted program, compiled once.
    grad, gc = jax.jit(jax.grad(loss, argnums=(0, 1)))(jax.device_put(z), jax.device_put(codebook))
    assert grad.dtype == dtype
    grad_host = np.asarray(grad)
    tol = _rotation_tolerance(dtype)
    for i in range(len(z)):
        lam, rot, _, _ = _rotation_numpy(z[i], q[i])
        expected = lam * rot.T @ w[i].astype(np.float64)
        scale = lam * np.linalg.norm(w[i].astype(np.float64))
        np.testing.assert_allclose(grad_host[i].astype(np.float64), expected, rtol=0, atol=tol * scale)
    assert_bitwise_equal(gc, np.zeros_like(codebook), context="no codebook gradient")


@pytest.mark.needs_float64
def test_rotation_is_orthogonal_and_maps_e_to_f_in_float64():
    # jax.enable_x64 is the x64 context manager of jax 0.10.2 (jax.experimental has none);
    # it restores the previous setting on exit.
    with jax.enable_x64(True):
        rng = np.random.default_rng(11)
        for _ in range(5):
            z = rng.standard_normal(5)
            codebook = rng.standard_normal((6, 5))
            jac = np.asarray(jax.jacfwd(rotation_trick)(jax.device_put(z), jax.device_put(codebook)))
            assert jac.dtype == np.float64
            q = codebook[np.argmin(_distances_numpy(z[None], codebook)[0])]
            lam, rot, e, f = _rotation_numpy(z, q)
            r_lib = jac / lam
            np.testing.assert_allclose(r_lib.T @ r_lib, np.eye(5), atol=1e-12)
            np.testing.assert_allclose(r_lib @ e, f, atol=1e-12)
            np.testing.assert_allclose(jac @ z, q, atol=1e-12)
            np.testing.assert_allclose(r_lib, rot, atol=1e-12)


def test_rotation_tangent_is_linear_and_per_vector():
    z, codebook, _ = _rotation_case(np.float32, seed=12, n=3)
    rng = np.random.default_rng(13)
    t1, t2 = (rng.standard_normal(z.shape).astype(np.float32) for _ in range(2))

    a, b = np.float32(0.75), np.float32(-1.5)

    def program(z, c, ts):  # the three tangents and the Jacobian in one jitted program, not op by op
        tangents = [jax.jvp(lambda z: rotation_trick(z, c), (z,), (t,))[1] for t in ts]
        return tangents, jax.jacfwd(lambda z: rotation_trick(z, c))(z)

    (t_combined, t_1, t_2), jac = jax.jit(program)(
        jax.device_put(z), jax.device_put(codebook), [jax.device_put(t) for t in (a * t1 + b * t2, t1, t2)]
    )
    np.testing.assert_allclose(np.asarray(t_combined), a * np.asarray(t_1) + b * np.asarray(t_2), rtol=1e-5, atol=1e-5)
    # The Jacobian couples the entries of one vector, never two vectors.
    jac = np.asarray(jac)
    for i in range(3):
        for j in range(3):
            if i != j:
                assert np.all(jac[i, :, j, :] == 0)
    assert np.any(jac[0, 0, 0, 1:] != 0), "the Jacobian is not diagonal"


def test_rotation_degenerate_cases(dtype):
    t = np.array([[0.5, -1.0, 2.0]], dtype)

    def tangent(z, codebook):
        fn = functools.partial(rotation_trick, codebook=jax.device_put(np.array(codebook, dtype)))
        return np.asarray(jax.jvp(lambda z: fn(z), (jax.device_put(np.array(z, dtype)),), (jax.device_put(t),))[1])

    # z = 0: the straight-through identity.
    assert_bitwise_equal(tangent([[0.0, 0.0, 0.0]], [[1.0, 0.0, 0.0]]), t, context="z = 0")
    # q = 0 != z: lambda = 0.
    assert_bitwise_equal(tangent([[1.0, 2.0, 0.0]], [[0.0, 0.0, 0.0]]), np.zeros_like(t), context="q = 0")
    # e = -f: r = 0, R = I - 2 e e^T (a reflection), lambda = 0.5.
    expected = np.array([[-0.25, -0.5, 1.0]], dtype)
    assert_bitwise_equal(tangent([[2.0, 0.0, 0.0]], [[-1.0, 0.0, 0.0]]), expected, context="e = -f")


def test_rotation_tangent_of_tiny_and_huge_vectors_is_finite():
    # The norms are scaled by max|z|, so squares neither underflow nor overflow.
    jvp = jax.jit(lambda z, c, t: jax.jvp(lambda z: rotation_trick(z, c), (z,), (t,)))  # one program, both scales
    for scale in (1e-30, 1e30):
        z = np.float32([[3.0, 4.0]]) * np.float32(scale)
        codebook = np.float32([[4.0, 3.0]]) * np.float32(scale)
        _, ty = jvp(jax.device_put(z), jax.device_put(codebook), jax.device_put(np.ones((1, 2), np.float32)))
        lam, rot, _, _ = _rotation_numpy(z[0], codebook[0])
        np.testing.assert_allclose(np.asarray(ty)[0], lam * rot @ np.ones(2), rtol=1e-6)


# --------------------------------------------------------------------------------------------
# Straight-through Gumbel-softmax
# --------------------------------------------------------------------------------------------


def _gumbel_noise(key, shape) -> np.ndarray:
    # The documented noise source: jax.random.gumbel in float32.
    return np.asarray(jax.random.gumbel(key, shape, jnp.float32))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_gumbel_forward_matches_numpy(dtype):
    key = jax.random.key(20)
    logits = (np.random.default_rng(21).standard_normal((64, 5)) * 2).astype(dtype)
    y = np.asarray(gumbel_softmax_st(jax.device_put(logits), key=key))
    assert y.dtype == dtype and y.shape == logits.shape
    # float32 sum, as documented; NumPy's float32 add rounds as XLA's does.
    perturbed = logits.astype(np.float32) + _gumbel_noise(key, logits.shape)
    expected = np.eye(5, dtype=dtype)[np.argmax(perturbed, -1)]
    assert_bitwise_equal(y, expected, context="one-hot sample")
    assert_bitwise_equal(np.asarray(jax.jit(functools.partial(gumbel_softmax_st, key=key))(logits)), expected)


def test_gumbel_sample_is_one_hot_and_keyed(dtype):
    logits = jax.device_put(np.zeros((200, 4), dtype))

    # One jitted program, run once per key (not op by op): a sample, and one with another tau.
    sample = jax.jit(
        lambda logits, key: (gumbel_softmax_st(logits, key=key), gumbel_softmax_st(logits, key=key, tau=0.3))
    )
    (a, with_tau), (b, _), (c, _) = (map(np.asarray, sample(logits, jax.random.key(seed))) for seed in (1, 1, 2))
    assert set(np.unique(a.astype(np.float32))) == {0.0, 1.0}
    np.testing.assert_array_equal(a.astype(np.float32).sum(-1), 1.0)
    assert_bitwise_equal(a, b, context="same key")
    assert (a != c).any()
    # tau shapes only the surrogate.
    assert_bitwise_equal(with_tau, a)


def test_gumbel_sample_frequencies_follow_softmax(dtype):
    n = 20000
    logits = np.array([1.0, 0.0, -1.0, 0.5, -2.0], dtype)
    # The keys and the samples in one jitted program, not op by op.
    sample = jax.jit(lambda x: jax.vmap(lambda k: gumbel_softmax_st(x, key=k))(jax.random.split(jax.random.key(3), n)))
    samples = sample(jax.device_put(logits))
    freq = np.asarray(samples).astype(np.float64).mean(0)
    p = _softmax(logits.astype(np.float64))
    # Five binomial standard deviations (seeded, so the outcome is fixed).
    np.testing.assert_array_less(np.abs(freq - p), 5 * np.sqrt(p * (1 - p) / n))


@pytest.mark.parametrize(
    ("dtype", "tau"),
    [(np.dtype(np.float32), 1.0), (np.dtype(np.float16), 0.5), (BF16, 2.0)],
    ids=["float32-1.0", "float16-0.5", "bfloat16-2.0"],
)
def test_gumbel_tangent_and_gradient_match_numpy(dtype, tau):
    key = jax.random.key(30)
    rng = np.random.default_rng(31)
    logits = rng.standard_normal((6, 5)).astype(dtype)
    t = rng.standard_normal(logits.shape).astype(dtype)
    soft = _softmax((logits.astype(np.float64) + _gumbel_noise(key, logits.shape)) / tau)
    t64 = t.astype(np.float64)
    expected = soft * (t64 - (soft * t64).sum(-1, keepdims=True)) / tau
    run = functools.partial(gumbel_softmax_st, key=key, tau=tau)

    def program(x, t):
        # The tangent and the gradient in one jitted program, compiled once.
        return jax.jvp(run, (x,), (t,))[1], jax.grad(lambda x: jnp.sum(run(x) * t))(x)

    ty, grad = jax.jit(program)(jax.device_put(logits), jax.device_put(t))
    assert ty.dtype == dtype
    # The softmax runs in float32 (exp to a few ulp); low-precision results are rounded once.
    tol = 1e-6 if dtype == np.float32 else 2 * _eps(dtype)
    scale = np.abs(t64).max() / tau
    np.testing.assert_allclose(np.asarray(ty).astype(np.float64), expected, rtol=0, atol=tol * scale)
    # The Jacobian (diag(s) - s s^T) / tau is symmetric: the gradient uses the same formula.
    np.testing.assert_allclose(np.asarray(grad).astype(np.float64), expected, rtol=0, atol=tol * scale)


def test_gumbel_tangent_is_not_diagonal():
    # One jitted program, not op by op.
    jac = jax.jit(lambda x: jax.jacfwd(functools.partial(gumbel_softmax_st, key=jax.random.key(0)))(x))(_zeros(3))
    assert np.all(np.asarray(jac)[~np.eye(3, dtype=bool)] != 0)


@pytest.mark.parametrize(
    ("tau", "error", "match"),
    [
        (0.0, ValueError, r"gumbel_softmax_st: `tau` must be a positive finite number; got 0.0"),
        (-1.0, ValueError, r"positive finite number; got -1.0"),
        (float("inf"), ValueError, r"positive finite number; got inf"),
        (float("nan"), ValueError, r"positive finite number; got nan"),
        ("1", TypeError, r"gumbel_softmax_st: `tau` must be a positive finite number.*got '1' of type str"),
        (True, TypeError, r"got True of type bool"),
    ],
)
def test_gumbel_tau_errors(tau, error, match):
    with pytest.raises(error, match=match):
        gumbel_softmax_st(_zeros(3), key=jax.random.key(0), tau=tau)


def test_gumbel_other_errors():
    with pytest.raises(TypeError, match=r"gumbel_softmax_st\(\) missing 1 required keyword-only argument: 'key'"):
        gumbel_softmax_st(_zeros(3))
    with pytest.raises(ValueError, match="gumbel_softmax_st: the logits must have at least one axis"):
        gumbel_softmax_st(_zeros(()), key=jax.random.key(0))
    with pytest.raises(TypeError, match=r"gumbel_softmax_st: .*floating-point"):
        gumbel_softmax_st(_zeros(3, np.int32), key=jax.random.key(0))


# --------------------------------------------------------------------------------------------
# Catalog entries and float64
# --------------------------------------------------------------------------------------------


def test_entries_are_the_latent_family():
    assert set(ENTRIES) == {"fsq", "vq_quantize", "rotation_trick", "gumbel_softmax_st"}
    assert all(e.family == "latent" and e.input_rank == 1 for e in ENTRIES.values())
    assert ENTRIES["fsq"].fn is fsq and ENTRIES["vq_quantize"].fn is vq_quantize
    assert ENTRIES["gumbel_softmax_st"].random and ENTRIES["gumbel_softmax_st"].tangent is not None
    assert ENTRIES["rotation_trick"].derivative is None and ENTRIES["rotation_trick"].tangent is not None


@pytest.mark.parametrize("name", ["vq_quantize", "rotation_trick"])
def test_codebook_argspec_is_truthful(name, dtype):
    entry = ENTRIES[name]
    (codebook,) = entry.example_args(np.random.default_rng(0), (3, 7), dtype, {})
    assert codebook.shape[1] == 7 and codebook.ndim == 2 and codebook.dtype == dtype
    assert entry.args[0].differentiable is False and entry.diff_argnums == (0,)


def test_fsq_example_shape_and_params_are_truthful():
    dtype = np.float32
    entry = ENTRIES["fsq"]

    def program(params, z, ones):  # both sides of each comparison in the same jitted program, not op by op
        _, ty = jax.jvp(functools.partial(entry.fn, **params), (z,), (ones,))
        return entry.fn(z, **params), entry.forward(z, **params), ty, entry.derivative(z, **params)

    for params in entry.param_grid():
        shape = entry.example_shape(**params)
        assert shape[-1] == len(params["levels"])
        z = np.random.default_rng(0).standard_normal(shape).astype(dtype)
        y, forward, ty, derivative = jax.jit(functools.partial(program, params))(
            jax.device_put(z), jax.device_put(np.ones(shape, dtype))
        )
        assert_bitwise_equal(y, np.asarray(forward), context=str(params))
        assert_bitwise_equal(ty, np.asarray(derivative), context=str(params))


@pytest.mark.needs_float64
def test_float64_is_kept_when_enabled():
    with jax.enable_x64(True):
        rng = np.random.default_rng(40)
        z = rng.standard_normal((8, 4)) * 2
        y = fsq(jax.device_put(z), levels=(8, 5, 5, 5))
        assert y.dtype == jnp.float64
        # The float64 path mirrors the float32 one in float64; tanh differs from NumPy's by ulps.
        half_l, offset, shift, half_width = _fsq_constants((8, 5, 5, 5))
        bounded = np.tanh(z + shift) * half_l - offset
        np.testing.assert_array_equal(np.asarray(y), np.round(bounded) / half_width)
        codebook = rng.standard_normal((5, 4))
        assert vq_quantize(jax.device_put(z), jax.device_put(codebook)).dtype == jnp.float64
        g = gumbel_softmax_st(jax.device_put(z), key=jax.random.key(0))
        assert g.dtype == jnp.float64
