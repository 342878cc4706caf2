"""The Pallas low-bit products (interpret mode on CPU) against their pure-JAX references, and the choice of one."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from stejax.lm import LMConfig, LowBitLinear, Transformer, decode
from stejax.lm._lowbit import lowbit_linear
from stejax.lowbit import pack_groups
from stejax.lowbit.kernels import VERIFIED_ON, supports
from stejax.lowbit.kernels._fused import (
    FUSED_FORMS,
    GROUPED_FORMS,
    fused_blocks,
    fused_grouped_blocks,
    fused_grouped_fits,
    fused_grouped_linear,
    fused_grouped_reference,
    fused_kernel_fits,
    fused_linear,
    fused_linear_reference,
    grouped_multiplier,
    multiplier,
)
from stejax.lowbit.kernels._grouped import grouped_kernel_fits, grouped_sum, grouped_sum_reference
from stejax.lowbit.kernels._int8 import int8_accumulate, int8_accumulate_reference, int8_kernel_fits
from stejax.lowbit.kernels._skeleton import Blocks, default_blocks
from stejax.lowbit.kernels._ternary import ternary_accumulate, ternary_accumulate_reference, ternary_kernel_fits
from stejax.lowbit.kernels._vpu import vpu_blocks
from stejax.lowbit.nnx import with_kernel_method

from helpers import apply_split, apply_splits, per_byte_greedy

# Compiled Pallas TPU kernels need a TPU (v5e or newer: int8 on the MXU). Interpret mode stands in for them where
# there is none; on a TPU (`make test-device`) the compiled kernel is the case: it checks against the same
# references what interpret mode checks, on the chip's compiler and hardware (tests/test_tpu_compile.py compiles
# them for a TPU on any machine).
_ON_TPU = jax.default_backend() == "tpu"


@pytest.fixture(params=[not _ON_TPU], ids=["compiled" if _ON_TPU else "interpret"])
def interpret(request):
    """Each kernel test runs compiled on a TPU and in Pallas interpret mode elsewhere."""
    return request.param


SHAPES = [  # (rows, k, n, blocks): aligned tiles over a 2 x 2 grid, a partial row block, whole unaligned dimensions
    (3, 256, 256, Blocks(128, 128)),
    (1, 512, 128, None),
    (5, 96, 64, None),
    (8, 256, 384, Blocks(128, 384)),  # the vector unit's most rows, loops over row chunks and three lane tiles
    (9, 128, 128, None),  # more rows than the vector unit takes: method="vpu" multiplies on the MXU
]
# The MXU kernels, and the vector-unit product of a few rows (stejax.lowbit.kernels._vpu).
METHODS = ["mxu", "vpu"]


def _put(a: np.ndarray) -> jax.Array:
    """A host array on the device as it is: a transfer, no program (jnp.asarray stages one per shape and dtype)."""
    return jax.device_put(a)


def _inputs(rows: int, k: int, seed: int = 0) -> jax.Array:
    """int8 input codes with the extremes in the first two rows (-128 and 127 everywhere)."""
    rng = np.random.default_rng(seed)
    q = rng.integers(-128, 128, (rows, k))
    q[0] = -128
    if rows > 1:
        q[1] = 127
    return _put(q.astype(np.int8))


def _exact(q: jax.Array, codes: np.ndarray) -> np.ndarray:
    return np.asarray(q, np.int64) @ codes.astype(np.int64)


# The pure-JAX references of integer sums, compiled: one program a shape where run op by op each of their operations
# is one (integer arithmetic, and float32 sums of exact products or to float32 rounding: the same on any program).
_ternary_reference = jax.jit(ternary_accumulate_reference)
_grouped_sum_reference = jax.jit(grouped_sum_reference, static_argnames="bits")


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(("rows", "k", "n", "blocks"), SHAPES)
def test_int8_accumulators_equal_the_xla_integer_product(rows, k, n, blocks, interpret, method):
    rng = np.random.default_rng(1)
    codes = rng.integers(-128, 128, (k, n)).astype(np.int8)
    codes[:, 0] = -128  # the extreme code against the extreme inputs
    q, resident = _inputs(rows, k), _put(codes)
    got = int8_accumulate(q, resident, blocks=blocks, interpret=interpret, method=method)
    assert got.dtype == jnp.int32
    np.testing.assert_array_equal(got, int8_accumulate_reference(q, resident))
    np.testing.assert_array_equal(got, _exact(q, codes))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(("rows", "k", "n", "blocks"), SHAPES)
def test_ternary_2bit_accumulators_equal_the_xla_integer_product(rows, k, n, blocks, interpret, method):
    codes = np.random.default_rng(2).integers(-1, 2, (k, n))
    codes[:, 0] = 1  # every field of column 0's bytes at its top value: bytes 0xff, -1 as int8
    packed = _put(pack_groups(codes, k, 2))
    q = _inputs(rows, k)
    if blocks is not None:  # over the packed rows: a quarter of k
        blocks = Blocks(k // 4 // 2 if k // 4 // 2 % 128 == 0 else k // 4, blocks.block_n)
    got = ternary_accumulate(q, packed, blocks=blocks, interpret=interpret, method=method)
    np.testing.assert_array_equal(got, _ternary_reference(q, packed))
    np.testing.assert_array_equal(got, _exact(q, codes))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("bits", [4, 2])
@pytest.mark.parametrize(("rows", "k", "n"), [(3, 512, 256), (1, 96, 64), (9, 256, 128), (8, 256, 128)])
def test_grouped_sums_are_exact_and_match_the_reference(bits, rows, k, n, interpret, method):
    rng = np.random.default_rng(3)
    top = 1 << (bits - 1)
    codes = rng.integers(-top, top, (k, n))
    codes[:32, 0] = -top
    packed = _put(pack_groups(codes, 32, bits))
    q = _inputs(rows, k)
    # Unit scales: the float32 sum of exact int32 group sums is the integer product (|sum| < 2**24).
    ones = _put(np.ones((k // 32, n), np.float32))
    got = grouped_sum(q, packed, ones, bits=bits, interpret=interpret, method=method)
    np.testing.assert_array_equal(got, _exact(q, codes).astype(np.float32))
    np.testing.assert_array_equal(_grouped_sum_reference(q, packed, ones, bits=bits), got)
    # One group at a time: each group's sum lands on its own scale (a missing or doubled block would show).
    q_host = np.asarray(q)
    for g in (0, k // 32 - 1):
        only = np.zeros((k // 32, n), np.float32)
        only[g] = 1.0
        only = _put(only)
        want = _exact(q_host[:, g * 32 : (g + 1) * 32], codes[g * 32 : (g + 1) * 32]).astype(np.float32)
        got_g = grouped_sum(q, packed, only, bits=bits, interpret=interpret, method=method)
        np.testing.assert_array_equal(got_g, want)
    # Real scales: the same float32 products and sums, in the order of the groups, up to float32 rounding.
    scale = _put(rng.uniform(0.001, 0.1, (k // 32, n)).astype(np.float32))
    got = grouped_sum(q, packed, scale, bits=bits, interpret=interpret, method=method)
    want = np.asarray(_grouped_sum_reference(q, packed, scale, bits=bits))
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6 * float(np.abs(want).max()))


FUSED_SHAPES = [  # (rows, k, n, blocks over the (packed) codes): a 2 x 2 grid, one block, whole odd axes, 33 rows
    (3, 512, 256, Blocks(256, 128)),
    (1, 512, 128, None),
    (5, 96, 64, None),
    (33, 1024, 256, Blocks(128, 256)),
]


def _fused_layer(form: str, k: int, n: int, rng: np.random.Generator, bits: int = 8):
    """Codes, the exported scale and the multiplier the fused kernel takes, for ``form``."""
    if form == "int8":
        codes = rng.integers(-128, 128, (k, n)).astype(np.int8)
        codes[:, 0] = -128
        scale = rng.uniform(0.001, 0.05, n).astype(np.float32)
        resident = codes
    else:
        codes = rng.integers(-1, 2, (k, n)).astype(np.int8)
        codes[:, 0] = 1
        scale = np.float32(rng.uniform(20, 80))
        resident = pack_groups(codes, k, 2) if form == "ternary-2bit" else codes
    kind = "int8" if form == "int8" else "ternary"
    return codes, scale, _put(np.asarray(resident)), _put(np.asarray(multiplier(scale, kind, bits)))


def _fused_inputs(rows: int, k: int, rng: np.random.Generator) -> tuple[np.ndarray, jax.Array]:
    """Float rows with the quantiser's corner cases: exact halves (round half to even), a zero row, huge values;
    on the host, and on the device with a leading axis of 1 (the layer's batch)."""
    x = rng.normal(0, 2, (rows, k)).astype(np.float32)
    x[0, :8] = [127.0, 2.5, -2.5, 3.5, -0.5, 0.5, 126.5, -127.0]  # s_x = 1: the halves round to even
    if rows > 1:
        x[1] = 0.0  # absmax below the floor: every code 0
    if rows > 2:
        x[2] *= 1e6
    return x, _put(x[None])


# The layer's XLA path compiled as one program a shape, form and bits, its weights arguments (no constant for XLA's
# simplifier to fold into the rescale's products), as the model runs it and as the grouped layer's reference is
# checked bit for bit: the quantiser's division, the rounding and the integer sums in one program, the rescale's
# products of runtime values in the order written. Op by op, each of its operations is a program of its own.
_fused_linear_reference = jax.jit(fused_linear_reference, static_argnames=("form", "bits"))


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("form", FUSED_FORMS)
@pytest.mark.parametrize(("rows", "k", "n", "blocks"), FUSED_SHAPES)
def test_fused_layer_equals_the_xla_path_bit_for_bit(rows, k, n, blocks, form, bits, interpret):
    rng = np.random.default_rng(5)
    codes, scale, resident, mult = _fused_layer(form, k, n, rng, bits)
    x, x_batch = _fused_inputs(rows, k, rng)
    if form == "ternary-2bit" and blocks is not None:  # over the packed rows: a quarter of k
        blocks = Blocks(max(128, blocks.block_k // 4), blocks.block_n)
    got = fused_linear(x_batch, resident, mult, form=form, bits=bits, blocks=blocks, interpret=interpret)
    assert got.shape == (1, rows, n) and got.dtype == jnp.float32
    want = _fused_linear_reference(x_batch, resident, mult, form=form, bits=bits)
    got = np.asarray(got)
    np.testing.assert_array_equal(got, want)
    # The integer forward: the artifact's codes (round half to even), exact int32 sums, then s_o / s_x (int8) or
    # 1 / (s_x gamma^-1) (ternary), to float32 rounding of the rescale alone.
    top = 2 ** (bits - 1) - 1
    m = np.maximum(np.abs(x).max(-1, keepdims=True), np.float32(1e-5))
    q = np.clip(np.round(x * (np.float32(top) / m)), -top - 1, top).astype(np.int64)
    if bits == 8:
        np.testing.assert_array_equal(q[0, :8], [127, 2, -2, 4, 0, 0, 126, -127])
    acc = q @ codes.astype(np.int64)
    s_x = np.float64(top) / m.astype(np.float64)
    exact = acc * scale.astype(np.float64) / s_x if form == "int8" else acc / (s_x * np.float64(scale))
    np.testing.assert_allclose(np.asarray(got[0], np.float64), exact, rtol=1e-6, atol=1e-6 * np.abs(exact).max())
    if rows > 1:
        assert not np.any(np.asarray(got[0, 1]))  # the zero row


GROUPED_SHAPES = [  # (rows, k, n, blocks over the packed bytes): a 2 x 2 int4 grid, one block, 3 groups, 16 rows
    (3, 512, 256, Blocks(128, 128)),
    (1, 512, 128, None),
    (5, 96, 64, None),
    (16, 1024, 256, Blocks(128, 256)),
]


def _grouped_layer(form: str, k: int, n: int, rng: np.random.Generator, exact: bool):
    """Codes, group scales and the packed bytes of a grouped layer; ``exact``: powers of two (multipliers)."""
    bits = 4 if form == "int4" else 2
    top = 1 << (bits - 1)
    codes = rng.integers(-top, top, (k, n))
    codes[:32, 0] = -top
    if exact:
        scale = np.exp2(rng.integers(-12, -2, (k // 32, n))).astype(np.float32)
    else:
        scale = rng.uniform(0.001, 0.1, (k // 32, n)).astype(np.float32)
    return codes, scale, _put(pack_groups(codes, 32, bits))


# The grouped layer's XLA path compiled as one program, its weights arguments: one program a shape, form and bits,
# which both sets of scales (the same shapes) share.
_fused_grouped_reference = jax.jit(fused_grouped_reference, static_argnames=("form", "bits"))


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("form", GROUPED_FORMS)
@pytest.mark.parametrize(("rows", "k", "n", "blocks"), GROUPED_SHAPES)
def test_fused_grouped_layer_equals_the_xla_path(rows, k, n, blocks, form, bits, interpret):
    rng = np.random.default_rng(8)
    x, x_batch = _fused_inputs(rows, k, rng)
    # Scales that are powers of two: every product of a group sum and its scale is exact in float32, so a fused
    # multiply-add rounds as a product and a sum do, and the kernel equals the XLA path bit for bit (a wrong
    # arrangement, expansion or offset would show).
    codes, mult, packed = _grouped_layer(form, k, n, rng, exact=True)
    got = fused_grouped_linear(x_batch, packed, mult, form=form, bits=bits, blocks=blocks, interpret=interpret)
    assert got.shape == (1, rows, n) and got.dtype == jnp.float32
    np.testing.assert_array_equal(got, _fused_grouped_reference(x_batch, packed, mult, form=form, bits=bits))
    np.testing.assert_array_equal(got, fused_grouped_reference(x_batch, packed, mult, form=form, bits=bits))
    # Real scales: the same float32 products and sums in the same order, but XLA:CPU contracts a product and the
    # running sum into one fused multiply-add inside whichever fusion holds them, and the interpreted kernel and
    # the reference are fused apart: equal to float32 rounding.
    codes, scale, packed = _grouped_layer(form, k, n, rng, exact=False)
    mult = _put(np.asarray(grouped_multiplier(scale, bits)))
    got = fused_grouped_linear(x_batch, packed, mult, form=form, bits=bits, blocks=blocks, interpret=interpret)
    want = _fused_grouped_reference(x_batch, packed, mult, form=form, bits=bits)
    got, want = np.asarray(got), np.asarray(want)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6 * float(np.abs(want).max()))
    # The integer forward: the artifact's codes, exact int32 group sums, then sum_g s_g acc_g / s_x.
    top = 2 ** (bits - 1) - 1
    m = np.maximum(np.abs(x).max(-1, keepdims=True), np.float32(1e-5))
    q = np.clip(np.round(x * (np.float32(top) / m)), -top - 1, top).astype(np.int64)
    acc = np.stack([q[:, g * 32 : (g + 1) * 32] @ codes[g * 32 : (g + 1) * 32] for g in range(k // 32)])
    exact = np.einsum("grn,gn->rn", acc.astype(np.float64), scale.astype(np.float64)) * m / top
    np.testing.assert_allclose(np.asarray(got[0], np.float64), exact, rtol=1e-5, atol=1e-5 * np.abs(exact).max())
    if rows > 1:
        assert not np.any(np.asarray(got[0, 1]))  # the zero row


def test_a_fused_layer_is_one_kernel_call_and_bad_inputs_are_refused():
    from stejax.lm._configs import CONFIGS

    x_host = np.random.default_rng(6).normal(size=(1, 1, 256)).astype(np.float32)
    x = _put(x_host)
    for config, ternary in (("w8a8", "int8"), ("w1.58a8", "2bit"), ("w1.58a8", "int8")):
        scale = np.full(128, 0.01, np.float32) if config == "w8a8" else np.float32(3.0)
        codes = np.random.default_rng(7).integers(-1, 2, (256, 128)).astype(np.int8)
        layer = lowbit_linear(codes, scale, CONFIGS[config], ternary=ternary)
        model = with_kernel_method(layer, "mxu")
        model.interpret = True
        outer = jax.make_jaxpr(model)(x).jaxpr
        (call,) = [e for e in outer.eqns if e.primitive.name in ("pjit", "jit")]
        inner = {e.primitive.name for e in call.params["jaxpr"].jaxpr.eqns}
        # No XLA quantisation, padding or rescale around the kernel: only reshapes.
        assert inner <= {"pallas_call", "reshape"} and "pallas_call" in inner, (config, ternary, inner)
        # The layer's XLA path (no TPU it has been verified on).
        np.testing.assert_array_equal(apply_split(nnx.split(model), x), apply_split(nnx.split(layer), x))
    for config in ("w4a8", "w2a8", "w4a4"):  # grouped weights; multipliers that are powers of two: exact products
        bits = CONFIGS[config].weight_bits
        codes = np.random.default_rng(7).integers(-(1 << (bits - 1)), 1 << (bits - 1), (256, 128))
        layer = lowbit_linear(codes, np.ones((8, 128), np.float32), CONFIGS[config])
        layer.scale[...] = _put(np.exp2(np.random.default_rng(8).integers(-10, -2, (8, 128))).astype(np.float32))
        model = with_kernel_method(layer, "mxu")
        model.interpret = True
        outer = jax.make_jaxpr(model)(x).jaxpr
        (call,) = [e for e in outer.eqns if e.primitive.name in ("pjit", "jit")]
        inner = {e.primitive.name for e in call.params["jaxpr"].jaxpr.eqns}
        assert inner <= {"pallas_call", "reshape"} and "pallas_call" in inner, (config, inner)
        np.testing.assert_array_equal(apply_split(nnx.split(model), x), apply_split(nnx.split(layer), x))
    codes, scale = _put(np.zeros((256, 128), np.int8)), _put(np.ones(128, np.float32))
    with pytest.raises(
        ValueError, match=r"fused_linear: form must be one of \('int8', 'ternary-int8', 'ternary-2bit'\)"
    ):
        fused_linear(x, codes, scale, form="int4")
    with pytest.raises(
        ValueError,
        match=r"fused_linear: expected a scale of shape \(\) or \(128,\) or \(1, 128\) for ternary-int8; got \(64,\)",
    ):
        fused_linear(x, codes, scale[:64], form="ternary-int8")
    with pytest.raises(ValueError, match=r"fused_linear: expected a float input and int8 codes; got int8 and int8"):
        fused_linear(_put(x_host.astype(np.int8)), codes, scale, form="int8")
    with pytest.raises(ValueError, match=r"fused_linear: x's last axis \(255\) must equal the kernel's rows \(256\)"):
        fused_linear(_put(x_host[..., :255]), codes, scale, form="int8")
    with pytest.raises(ValueError, match=r"fused_linear: input bits must be 8 or 4; got 2"):
        fused_linear(x, codes, scale, form="int8", bits=2)
    packed, scales = _put(np.zeros((8, 16, 128), np.int8)), _put(np.ones((8, 128), np.float32))  # int4, groups of 32
    with pytest.raises(ValueError, match=r"fused_grouped_linear: form must be one of \('int4', 'int2'\); got 'int8'"):
        fused_grouped_linear(x, packed, scales, form="int8")
    with pytest.raises(ValueError, match=r"fused_grouped_linear: expected scales of shape \(8, 128\); got \(128,\)"):
        fused_grouped_linear(x, packed, _put(np.ones(128, np.float32)), form="int4")
    with pytest.raises(
        ValueError, match=r"fused_grouped_linear: x's last axis \(255\) must equal groups x group \(256\)"
    ):
        fused_grouped_linear(_put(x_host[..., :255]), packed, scales, form="int4")
    with pytest.raises(ValueError, match=r"fused_grouped_linear: input bits must be 8 or 4; got 2"):
        fused_grouped_linear(x, packed, scales, form="int4", bits=2)
    with pytest.raises(
        ValueError, match=r"fused_grouped_linear: expected packed bytes of shape \(groups, group / per, n\)"
    ):
        fused_grouped_linear(x, _put(np.zeros((16, 128), np.int8)), scales, form="int4")
    with pytest.raises(ValueError, match=r"fused_grouped_linear: a group's packed rows must be a power of two; got 24"):
        odd = _put(np.zeros((5, 24, 128), np.int8))
        fused_grouped_linear(_put(x_host[..., :240]), odd, _put(np.ones((5, 128), np.float32)), form="int4")
    with pytest.raises(
        ValueError, match=r"fused_grouped_linear: block_k=64 must be a multiple of 128 or equal packed rows"
    ):
        fused_grouped_linear(x, packed, scales, form="int4", blocks=Blocks(64, 128), interpret=True)


@pytest.mark.parametrize(
    ("blocks", "message"),
    [
        (Blocks(96, 128), r"int8_accumulate: block_k=96 must divide packed rows=256"),
        (Blocks(128, 100), r"int8_accumulate: block_n=100 must divide n=384"),
        (Blocks(64, 128), r"block_k=64 must be a multiple of 128 or equal packed rows=256 \(a TPU block's last"),
    ],
)
def test_blocks_that_break_the_tpu_rule_are_refused_naming_value_block_and_rule(blocks, message):
    q = _put(np.zeros((1, 256), np.int8))
    with pytest.raises(ValueError, match=message):
        int8_accumulate(q, _put(np.zeros((256, 384), np.int8)), blocks=blocks, interpret=True)


def test_grouped_blocks_must_hold_whole_groups():
    q = _put(np.zeros((1, 1024), np.int8))
    packed = _put(np.zeros((32, 16, 128), np.int8))  # int4: 512 packed rows, 16 a group
    with pytest.raises(ValueError, match=r"grouped_sum: block_k=136 must divide packed rows=512"):
        grouped_sum(q, packed, _put(np.ones((32, 128), np.float32)), bits=4, blocks=Blocks(136, 128), interpret=True)
    with pytest.raises(ValueError, match=r"Blocks: block_k must be an int >= 1; got 0"):
        Blocks(0, 128)


def test_an_unknown_method_and_shapes_the_vector_unit_does_not_take_are_refused():
    q = _put(np.zeros((1, 256), np.int8))
    with pytest.raises(ValueError, match=r"int8_accumulate: method must be one of \('mxu', 'vpu'\); got 'gpu'"):
        int8_accumulate(q, _put(np.zeros((256, 128), np.int8)), interpret=True, method="gpu")
    with pytest.raises(ValueError, match=r"int8_accumulate: method='vpu' needs packed rows a multiple of 8; got 12"):
        twelve = _put(np.zeros((12, 128), np.int8))
        int8_accumulate(_put(np.zeros((1, 12), np.int8)), twelve, interpret=True, method="vpu")
    packed = _put(np.zeros((2, 64, 128), np.int8))  # int4 groups of 128: 64 packed rows a group
    with pytest.raises(ValueError, match=r"grouped_sum: method='vpu' needs a group of 8, 16 or 32 packed rows"):
        grouped_sum(q, packed, _put(np.ones((2, 128), np.float32)), bits=4, interpret=True, method="vpu")


def _kernel_dots(fn) -> int:
    """How many dot_general equations the kernels that ``fn`` traces hold (the MXU's products)."""
    return str(jax.make_jaxpr(fn)()).count("dot_general")


def test_the_method_argument_and_the_layers_method_field_choose_the_product_when_traced():
    q, codes = _put(np.ones((1, 128), np.int8)), _put(np.ones((128, 128), np.int8))
    assert _kernel_dots(lambda: int8_accumulate(q, codes, interpret=True)) > 0  # "mxu" by default
    assert _kernel_dots(lambda: int8_accumulate(q, codes, interpret=True, method="vpu")) == 0
    wide = _put(np.ones((9, 128), np.int8))  # more rows than the vector unit takes: the MXU kernel
    assert _kernel_dots(lambda: int8_accumulate(wide, codes, interpret=True, method="vpu")) > 0
    from stejax.lm._configs import CONFIGS

    layer = lowbit_linear(np.ones((128, 128), np.int8), np.ones((128,), np.float32), CONFIGS["w8a8"])
    x = _put(np.ones((1, 128), np.float32))
    for method, dots in (("vpu", 0), ("mxu", 1)):
        model = with_kernel_method(layer, method)
        model.interpret = True
        assert model.implementation == "pallas" and model.method == method and type(model) is type(layer)
        assert (_kernel_dots(lambda model=model: model(x)) > 0) == bool(dots)
    assert layer.implementation is None and layer.method == "mxu"  # the original is left as it was
    # The method is a field of the layer's graph definition: a compiled step is cached per method.
    assert nnx.graphdef(with_kernel_method(layer, "vpu")) != nnx.graphdef(with_kernel_method(layer, "mxu"))
    with pytest.raises(ValueError, match=r"with_kernel_method: method must be one of \('mxu', 'vpu'\)"):
        with_kernel_method(layer, "VPU")
    with pytest.raises(ValueError, match=r"LowBitLinear: method must be one of \('mxu', 'vpu'\); got 'simd'"):
        lowbit_linear(np.ones((128, 128), np.int8), np.ones((128,), np.float32), CONFIGS["w8a8"]).__class__(
            "int8", codes, np.ones((128,), np.float32), in_features=128, out_features=128, input_bits=8, method="simd"
        )


def test_default_blocks_and_the_kernel_or_xla_predicates():
    assert default_blocks(2048, 5632) == Blocks(512, 2816)  # 1.4 MiB (1024 rows: 2.8 MiB, over 2); n up to 4096
    assert default_blocks(1376, 512) == Blocks(1376, 512)  # no multiple of 128 divides 1376: the whole axis
    assert default_blocks(2816, 2048, multiple_k=16, fewest_k=True) == Blocks(128, 2048)
    # The vector unit's blocks: the widest columns; rows within 2 MiB of bytes and 4 MiB of lane-broadcast
    # multipliers (512 bytes a packed row each).
    assert vpu_blocks(512, 5632, 4) == Blocks(512, 2816)
    assert vpu_blocks(2048, 2048, 8) == Blocks(1024, 2048)
    assert vpu_blocks(2048, 2048, 32) == Blocks(256, 2048)
    assert vpu_blocks(1024, 5632, 2, multiple_k=128) == Blocks(512, 2816)
    assert int8_kernel_fits(1, 2048, 5632) and not int8_kernel_fits(1024, 2048, 5632)
    assert ternary_kernel_fits(8, 2048, 5632) and not ternary_kernel_fits(8, 2046, 5632)
    assert grouped_kernel_fits(16, 2048, 5632, 32, 4) and not grouped_kernel_fits(17, 2048, 5632, 32, 4)
    # The fused layer's blocks: the largest of at most 3 MiB that leave two grid steps, ties to the longer block_k.
    assert fused_blocks(512, 2048) == Blocks(512, 1024)  # 2048 x 2048 ternary: two column blocks, not one
    assert fused_blocks(1408, 2048) == Blocks(1408, 1024)  # 5632 x 2048 ternary: no multiple of 128 below 1408
    assert fused_blocks(2048, 5632) == Blocks(2048, 1408)  # int8: 2.75 MiB, four steps
    assert fused_blocks(64, 128) == Blocks(64, 128)  # too small for two steps: one block
    assert fused_kernel_fits(1, 2048, 5632, "ternary-2bit") and not fused_kernel_fits(257, 2048, 5632, "int8")
    # Grouped weights: 16 groups a block (256 packed int4 rows, 128 int2 ones) by the widest columns within 2 MiB.
    assert fused_grouped_blocks(64, 32, 5632, "int4") == Blocks(256, 5632)
    assert fused_grouped_blocks(176, 32, 2048, "int4") == Blocks(256, 2048)  # 5632 x 2048
    assert fused_grouped_blocks(176, 32, 2048, "int2") == Blocks(128, 2048)
    assert fused_grouped_blocks(64, 32, 11264, "int4") == Blocks(256, 5632)  # 2.75 MiB whole: half the columns
    assert fused_grouped_blocks(8, 32, 128, "int4") == Blocks(128, 128)  # 8 groups: all there are
    assert fused_grouped_blocks(3, 32, 64, "int4") == Blocks(48, 64)  # no multiple of 128: the whole axes
    assert fused_grouped_fits(16, 2048, 5632, 32, "int4") and not fused_grouped_fits(17, 2048, 5632, 32, "int4")
    assert not fused_grouped_fits(1, 2048, 5632, 48, "int4")  # 24 packed rows a group: not a power of two


@pytest.mark.parametrize(
    ("device_kind", "kernels"),
    [
        ("TPU v5 lite", True),  # the TPU v5e: the device suite passed compiled, and the kernels decode faster
        (None, False),  # not a TPU: the CPU, a GPU
        ("TPU v5", False),  # v5p, v6e, v4: not verified; v4 and TPU7x cannot multiply int8 on the MXU
        ("TPU v6 lite", False),
        ("TPU v4", False),
        ("TPU7x", False),
    ],
)
def test_the_automatic_choice_takes_the_kernels_on_the_verified_chips_only(monkeypatch, device_kind, kernels):
    from stejax.lm._configs import CONFIGS
    from stejax.lowbit.kernels import _skeleton

    monkeypatch.setattr(_skeleton, "default_device_kind", lambda: device_kind)
    assert _skeleton.kernel_backend() is kernels
    assert set(VERIFIED_ON) == {"tpu v5 lite"}  # as docs/lm-decode.md states, with its evidence
    for config, codes, scale in (
        ("w8a8", np.ones((256, 128), np.int8), np.ones((128,), np.float32)),
        ("w1.58a8", np.ones((256, 128), np.int8), np.float32(2.0)),
        ("w4a8", np.ones((256, 128), np.int8), np.ones((8, 128), np.float32)),
    ):
        for ternary in ("int8", "2bit") if config == "w1.58a8" else ("int8",):
            auto = lowbit_linear(codes, scale, CONFIGS[config], ternary=ternary)
            assert auto._kernel(1) is kernels, (config, ternary)
            assert auto._kernel(1024) is False  # a prefill's rows: XLA's product wherever it runs
            assert lowbit_linear(codes, scale, CONFIGS[config], implementation="xla")._kernel(1) is False
            assert lowbit_linear(codes, scale, CONFIGS[config], implementation="pallas")._kernel(1) is True
    # On the verified chip the automatic layer traces the kernels (interpret mode here); elsewhere XLA's dot.
    layer = lowbit_linear(np.ones((256, 128), np.int8), np.ones((128,), np.float32), CONFIGS["w8a8"])
    layer.interpret = True
    jaxpr = str(jax.make_jaxpr(layer)(_put(np.ones((1, 256), np.float32))))
    assert ("pallas_call" in jaxpr) is kernels


def test_supports_answers_from_shapes_and_never_raises():
    assert supports("int8", rows=1, k=2048, n=5632) and supports("ternary-int8", rows=256, k=2048, n=5632)
    assert not supports("int8", rows=257, k=2048, n=5632)  # a prefill
    assert supports("ternary-2bit", rows=8, k=2048, n=5632) and not supports("ternary-2bit", rows=8, k=2046, n=5632)
    assert supports("int4", rows=16, k=2048, n=5632, group=32) and not supports(
        "int4", rows=17, k=2048, n=5632, group=32
    )
    assert supports("int2", rows=1, k=2048, n=5632, group=32)
    assert not supports("int4", rows=1, k=2048, n=5632)  # grouped weights without a group
    assert not supports("int4", rows=1, k=2048, n=5632, group=0) and not supports(
        "int4", rows=1, k=100, n=128, group=32
    )
    assert not supports("float32", rows=1, k=2048, n=5632)
    abstract = jax.ShapeDtypeStruct((1, 2048), jnp.float32)  # no device, no array: the static facts alone
    assert supports("int8", rows=abstract.shape[0], k=abstract.shape[1], n=5632)


def test_automatic_choice_is_xla_off_tpu_and_an_unknown_implementation_is_refused():
    from stejax.lm._configs import CONFIGS

    layer = lowbit_linear(np.ones((64, 32), np.int8), np.ones((32,), np.float32), CONFIGS["w8a8"])
    assert layer.implementation is None
    if jax.default_backend() != "tpu":
        assert layer._kernel(1) is False
    with pytest.raises(ValueError, match=r"implementation must be one of \(None, 'xla', 'pallas'\); got 'cuda'"):
        LowBitLinear(
            "int8",
            np.ones((4, 4), np.int8),
            np.ones(4),
            in_features=4,
            out_features=4,
            input_bits=8,
            implementation="cuda",
        )


# ----------------------------------------------------------------------------- whole models

TINY = LMConfig(context=80, width=32, depth=1, heads=2, hidden=64)
PROMPTS = (b"def main():", b"x = y + 1\n")


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    from stejax.lm._export import export_lm

    # Initialised as one compiled program (op by op, each initialiser's operations are programs of their own).
    model = nnx.jit(lambda: Transformer(TINY, rngs=nnx.Rngs(params=7)))()
    root = tmp_path_factory.mktemp("lm_kernels")
    return {c: export_lm(model, c, root / c) for c in ("w8a8", "w4a8", "w1.58a8")}


def _with_kernels(model: nnx.Module, method: str = "mxu") -> nnx.Module:
    """A copy whose low-bit layers run the Pallas kernels (by ``method``) in interpret mode, on any backend.

    What these tests check is the model's wiring (which layers call which kernel, with what) and that the logits
    and bytes follow; each kernel's compiled form is checked against its reference layer by layer above (compiled
    on a TPU), and in whole large models by ``benchmarks/lm_decode_device.sh``. Compiled on a TPU, a whole model's
    logits differ from the XLA path's in float32 rounding: its float parts (norms, attention) compile in two
    programs."""
    copy = nnx.clone(with_kernel_method(model, method))
    for _, module in nnx.iter_modules(copy):
        if isinstance(module, LowBitLinear):
            module.implementation, module.interpret = "pallas", True
    return copy


@pytest.mark.parametrize(
    ("config", "form"), [("w8a8", "int8"), ("w1.58a8", "2bit"), ("w1.58a8", "int8"), ("w4a8", "int8")]
)
def test_kernel_logits_equal_the_xla_integer_path(artifacts, config, form):
    from stejax.lm import load_lowbit

    xla = load_lowbit(artifacts[config], ternary=form, implementation="xla").model
    tokens = _put(np.random.default_rng(4).integers(0, 256, (2, 5)).astype(np.uint8))
    want = np.asarray(apply_split(nnx.split(xla), tokens))
    got = np.asarray(apply_split(nnx.split(_with_kernels(xla)), tokens))
    if config == "w4a8":  # group scales: float32 sums of the same terms, rounded apart
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    else:
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    ("config", "form"), [("w8a8", "int8"), ("w1.58a8", "2bit"), ("w1.58a8", "int8"), ("w4a8", "int8")]
)
def test_vector_unit_logits_equal_the_xla_integer_path(artifacts, config, form):
    from stejax.lm import load_lowbit

    xla = load_lowbit(artifacts[config], ternary=form, implementation="xla").model
    tokens = _put(np.random.default_rng(5).integers(0, 256, (1, 7)).astype(np.uint8))  # 7 rows: the vector unit
    x = _put(np.random.default_rng(6).normal(size=(1, 7, TINY.width)).astype(np.float32))
    vpu = _with_kernels(xla, "vpu")
    layers = [(a, b) for (_, a), (_, b) in zip(nnx.iter_modules(xla), nnx.iter_modules(vpu), strict=True)]
    layers = [(a, b) for a, b in layers if isinstance(a, LowBitLinear) and a.in_features == TINY.width]
    assert layers and all(b.method == "vpu" for _, b in layers)
    # Each layer: the same integer sums, the same float rescaling, bit for bit (every layer of both, one program).
    outputs = apply_splits([nnx.split(layer) for pair in layers for layer in pair], x)
    for want_layer, got_layer in zip(outputs[::2], outputs[1::2], strict=True):
        np.testing.assert_array_equal(np.asarray(got_layer), np.asarray(want_layer))
    want = np.asarray(apply_split(nnx.split(xla), tokens))
    got = np.asarray(apply_split(nnx.split(vpu), tokens))
    # The whole model: XLA:CPU compiles the float parts (norms, softmax) of the two programs apart, so a logit
    # may differ by float32 rounding although every layer's integer sums are the same.
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    ("config", "method"), [("w8a8", "mxu"), ("w4a8", "mxu"), ("w1.58a8", "mxu"), ("w1.58a8", "vpu")]
)  # float has no low-bit layer (test_lm_decode)
def test_greedy_bytes_with_kernels_equal_the_per_byte_loop(artifacts, config, method):
    from stejax.lm import load_lowbit

    loaded = load_lowbit(artifacts[config], ternary="2bit")
    want = per_byte_greedy(artifacts[config], loaded.reference, PROMPTS, 48)  # once per artifact
    got = decode(_with_kernels(loaded.model, method), list(PROMPTS), tokens=48, key=jax.random.key(0), temperature=0)
    assert got.texts == want


# ----------------------------------------------------------------------------- lowering for a TPU, on any machine


def _mosaic_modules(fn, *args) -> list[str]:
    """The Mosaic modules that ``fn`` lowers to for a TPU (exported, never run), as text."""
    import jax._src.tpu_custom_call as tpu_custom_call  # the Mosaic module before serialisation: a private hook

    seen: list[str] = []
    original = tpu_custom_call._lower_mosaic_module_to_asm

    def spy(module, *rest, **options):
        seen.append(str(module))
        return original(module, *rest, **options)

    specs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tpu_custom_call, "_lower_mosaic_module_to_asm", spy)
        jax.export.export(jax.jit(fn), platforms=["tpu"])(*specs)
    return seen


def _mosaic_matmuls(fn, *args) -> list[str]:
    """The ``tpu.matmul`` lines of the Mosaic modules that ``fn`` lowers to for a TPU."""
    return [line.strip() for text in _mosaic_modules(fn, *args) for line in text.splitlines() if "tpu.matmul" in line]


@pytest.mark.parametrize("precision", ["default", "highest"])
def test_kernels_lower_for_a_tpu_with_int8_matmuls_at_any_default_precision(precision):
    # Under "highest" a bare jnp.dot would carry contract_precision<fp32>, which Mosaic refuses for int8 operands
    # ("Bad lhs type") when it compiles on the chip.
    q = np.zeros((3, 256), np.int8)
    cases = {
        "int8": (int8_accumulate, q, np.zeros((256, 128), np.int8)),
        "ternary": (ternary_accumulate, q, np.zeros((1, 64, 128), np.int8)),
        "int4": (
            lambda q, p, s: grouped_sum(q, p, s, bits=4),
            q,
            np.zeros((8, 16, 128), np.int8),
            np.zeros((8, 128), np.float32),
        ),
    }
    with jax.default_matmul_precision(precision):
        for name, (fn, *args) in cases.items():
            matmuls = _mosaic_matmuls(fn, *args)
            assert matmuls, name
            for line in matmuls:
                assert "xi8>" in line and "xi32>" in line, (name, line)
                assert "fp32" not in line, (name, line)


@pytest.mark.parametrize(("rows", "k", "n"), [(1, 2048, 5632), (8, 256, 256), (5, 96, 64)])
def test_vector_unit_kernels_lower_for_a_tpu_without_a_matmul(rows, k, n):
    # The 1B model's widest layer (loops over row chunks, blocks of 2816 columns), the most rows, whole odd axes.
    q = np.zeros((rows, k), np.int8)
    cases = {
        "int8": (lambda q, c: int8_accumulate(q, c, method="vpu"), q, np.zeros((k, n), np.int8)),
        "ternary": (lambda q, p: ternary_accumulate(q, p, method="vpu"), q, np.zeros((1, k // 4, n), np.int8)),
        "int4": (
            lambda q, p, s: grouped_sum(q, p, s, bits=4, method="vpu"),
            q,
            np.zeros((k // 32, 16, n), np.int8),
            np.zeros((k // 32, n), np.float32),
        ),
        "int2": (
            lambda q, p, s: grouped_sum(q, p, s, bits=2, method="vpu"),
            q,
            np.zeros((k // 32, 8, n), np.int8),
            np.zeros((k // 32, n), np.float32),
        ),
    }
    for name, (fn, *args) in cases.items():
        modules = _mosaic_modules(fn, *args)
        assert len(modules) == 1, name
        assert "tpu.matmul" not in modules[0], name
        assert "arith.muli" in modules[0], name  # the products, on the vector unit
