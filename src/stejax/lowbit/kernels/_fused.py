r"""A whole low-bit linear layer in one Pallas call: input quantisation, integer product and rescale.

:class:`stejax.lm.LowBitLinear` quantises its float input row by row to int8
codes, multiplies them by the resident weight codes with int32 accumulation and
rescales the sums. Done as XLA operations around a product kernel, a decoding
step pays for each layer's absmax reduction, quantisation, row padding, input
arrangement and rescale as separate operations (a few µs each on a TPU, against
a few µs for the product itself). :func:`fused_linear` does them all inside the
kernel, in VMEM:

* at the first contraction block of each column block, the float rows
  (padded with zero rows in VMEM to the MXU's 32) are reduced to
  :math:`s_x = t / \max(\max_i |x_i|, 10^{-5})` (:math:`t = 2^{b-1} - 1` for
  ``b`` input bits) and quantised to
  :math:`q = \operatorname{clip}(\operatorname{round}(x s_x), -t - 1, t)`
  (round half to even), block by block into a VMEM buffer;
* each grid step multiplies a block of weight codes (int8, or ternary packed
  four to a byte and unpacked as :mod:`stejax.lowbit.kernels._ternary` does) by its
  block of input codes on the MXU, int32 accumulation;
* at the last contraction block the sums are rescaled in the layer's order of
  float32 operations (:func:`rescale`: products by the row maximum and a
  per-layer multiplier made on the host), and the real rows written.

The float operations are the layer's own, one by one in its order, so the result
equals the layer's XLA path wherever both lower them alike (interpret mode does,
and the tests check it bit for bit).

Grouped int4 and int2 weights (:func:`fused_grouped_linear`) take the same
course, and at the first step also arrange the input codes in VMEM as
:mod:`stejax.lowbit.kernels._grouped`'s wrapper does in XLA: in the packed rows' order
(a product by a 0/1 matrix, exact) and one row per group of a block, so that
one int8 product per packed slice gives every group's int32 sum; each step
scales the group sums (by :math:`s_{go} / t`, :func:`grouped_multiplier`) and
adds them in the order of the groups, and the last multiplies by the row maxima.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from stejax.lowbit._packing import unpack_slices
from stejax.lowbit.kernels._skeleton import Blocks, default_blocks, int8_dot, last_step, vmem_limit, zero_accumulator

__all__ = [
    "FUSED_FORMS",
    "GROUPED_FORMS",
    "fused_blocks",
    "fused_grouped_blocks",
    "fused_grouped_fits",
    "fused_grouped_linear",
    "fused_grouped_reference",
    "fused_kernel_fits",
    "fused_linear",
    "fused_linear_reference",
    "grouped_multiplier",
    "multiplier",
    "quantise_rows",
    "rescale",
]

FUSED_FORMS = ("int8", "ternary-int8", "ternary-2bit")
ROW_PAD = 32  # int8 rows of a vreg: the MXU's input rows
_INT8_TILE = 32
_TINY = 1e-5  # the input quantiser's floor under the absmax


def _per(form: str) -> int:
    return 4 if form == "ternary-2bit" else 1


def _check(x: jax.Array, codes: jax.Array, scale: jax.Array, form: str, bits: int, where: str) -> tuple[int, int]:
    if form not in FUSED_FORMS:
        raise ValueError(f"{where}: form must be one of {FUSED_FORMS}; got {form!r}.")
    if bits not in (4, 8):
        raise ValueError(f"{where}: input bits must be 8 or 4; got {bits!r}.")
    if not jnp.issubdtype(x.dtype, jnp.floating) or codes.dtype != jnp.int8:
        raise ValueError(f"{where}: expected a float input and int8 codes; got {x.dtype} and {codes.dtype}.")
    if form == "ternary-2bit":
        if codes.ndim != 3 or codes.shape[0] != 1:
            raise ValueError(f"{where}: expected packed bytes of shape (1, k / 4, n); got {codes.shape}.")
        k, n = 4 * codes.shape[1], codes.shape[2]
    else:
        if codes.ndim != 2:
            raise ValueError(f"{where}: expected int8 codes of shape (k, n); got {codes.shape}.")
        k, n = codes.shape
    want = ((n,), (1, n)) if form == "int8" else ((), (n,), (1, n))
    if scale.shape not in want:
        shapes = " or ".join(str(w) for w in want)
        raise ValueError(f"{where}: expected a scale of shape {shapes} for {form}; got {scale.shape}.")
    if x.shape[-1] != k:
        raise ValueError(f"{where}: x's last axis ({x.shape[-1]}) must equal the kernel's rows ({k}).")
    return k, n


def quantise_rows(x: jax.Array, bits: int) -> tuple[jax.Array, jax.Array]:
    """The layer's input quantiser on float32 rows ``(m, k)``: the clipped codes (as float32) and the row maxima.

    The row maximum :math:`m = \\max(\\max_i |x_i|, 10^{-5})` gives :math:`s_x = t / m` and the codes
    :math:`\\operatorname{clip}(\\operatorname{round}(x s_x), -t - 1, t)`, the artifact's; :func:`rescale`
    multiplies by :math:`m` (keepdims) where the layer divides by :math:`s_x`.
    """
    top = 2 ** (bits - 1) - 1
    m = jnp.maximum(jnp.max(jnp.abs(x), axis=-1, keepdims=True), jnp.float32(_TINY))
    return jnp.clip(jnp.round(x * (top / m)), -top - 1, top), m


def multiplier(scale: np.ndarray, form: str, bits: int) -> np.ndarray:
    """The weight side of the rescale, on the host (float32, IEEE): :math:`s_o \\operatorname{fl}(1/t)` for int8
    weights (per column), :math:`\\operatorname{fl}(1/\\gamma^{-1}) \\operatorname{fl}(1/t)` for ternary ones."""
    inv_top = np.float32(1) / np.float32(2 ** (bits - 1) - 1)
    scale = np.asarray(scale, np.float32)
    if form == "int8":
        return scale * inv_top
    return (np.float32(1) / scale) * inv_top


def rescale(acc: jax.Array, m: jax.Array, w: jax.Array, form: str) -> jax.Array:
    """The layer's rescale of int32 sums ``acc``: float32 ``acc * w * m`` (int8) or ``acc * (m * w)`` (ternary).

    ``m``: the row maxima (:func:`quantise_rows`), ``w``: :func:`multiplier`, so that the result is
    :math:`a\\,s_o / s_x` (int8) or :math:`a / (s_x \\gamma^{-1})` (ternary) to float32 rounding. Products of
    runtime values only, in this order: a division by a broadcast row scale, or a product with a constant, is
    what XLA's simplifier rewrites (into a product by a reciprocal, or reassociated) and a kernel compiler
    does not, so the layer's float operations here are the ones that every compiler keeps. The XLA path of
    :class:`stejax.lm.LowBitLinear` and the fused kernel both rescale with this function.
    """
    acc = acc.astype(jnp.float32)
    if form == "int8":
        return acc * w * m
    return acc * (m * w)


def fused_linear_reference(x: jax.Array, codes: jax.Array, scale: jax.Array, *, form: str, bits: int) -> jax.Array:
    """Reference (pure JAX): the layer's XLA path, float ``x`` ``(..., k)`` to float32 ``(..., n)``.

    ``scale``: :func:`multiplier` of the layer's scale, as for :func:`fused_linear`.
    """
    from stejax.lowbit.kernels._int8 import int8_accumulate_reference
    from stejax.lowbit.kernels._ternary import ternary_accumulate_reference

    _check(x, codes, scale, form, bits, "fused_linear_reference")
    qf, m = quantise_rows(x.astype(jnp.float32), bits)
    q = qf.astype(jnp.int8)
    if form == "ternary-2bit":
        acc = ternary_accumulate_reference(q, codes)
    else:
        acc = int8_accumulate_reference(q, codes)
    return rescale(acc, m, scale.reshape((1,) * (acc.ndim - scale.ndim) + scale.shape), form)


_BLOCK_BYTES = 3 * 1024 * 1024


def fused_blocks(rows_k: int, n: int) -> Blocks:
    """The fused kernel's blocks over ``(rows_k, n)`` (packed) codes: the largest of at most 3 MiB that leaves two
    grid steps or more (the next block's bytes are read while one is multiplied), ties to the longer
    ``block_k``; one block where no such pair exists.

    Picked by the TPU compiler's static estimates for the 1B model's shapes
    (``benchmarks/lm_kernels_static.py``): a grid step costs a fixed time, and a single block leaves the
    reading of the weights and the product in sequence.
    """
    ks = [b for b in range(128, rows_k + 1, 128) if rows_k % b == 0] or [rows_k]
    ns = [b for b in range(128, n + 1, 128) if n % b == 0] or [n]
    pairs = [(bk * bn, bk, bn) for bk in ks for bn in ns if bk * bn <= _BLOCK_BYTES and (rows_k // bk) * (n // bn) >= 2]
    if not pairs:
        return default_blocks(rows_k, n)
    _, bk, bn = max(pairs)
    return Blocks(bk, bn)


def fused_kernel_fits(rows: int, k: int, n: int, form: str) -> bool:
    """Whether the fused kernel takes this shape with its default blocks (never raises)."""
    per = _per(form)
    if rows > 256 or k % per:
        return False
    blocks = fused_blocks(k // per, n)
    try:
        blocks.check(k // per, n, where="fused_linear")
    except ValueError:
        return False
    return blocks.block_k * blocks.block_n <= (4 if per == 4 else 8) * 1024 * 1024


def _body(
    x_ref: jax.Array,
    w_ref: jax.Array,
    scale_ref: jax.Array,
    out_ref: jax.Array,
    xf_ref: jax.Array,
    q_ref: jax.Array,
    m_ref: jax.Array,
    offset_ref: jax.Array,
    acc_ref: jax.Array,
    *,
    form: str,
    bits: int,
) -> None:
    # x (rows, k) float, the whole input; w (block_k, block_n) int8 codes or packed bytes; scale (1, block_n)
    # float32 for int8 and per-column ternary, (1,) float32 in SMEM for one ternary scale; out (rows, block_n)
    # float32.
    # Scratch: xf (rows to a multiple of 8, k) float32; q (k blocks, per, rows to a multiple of 32, block_k) int8;
    # m (rows to 8, 1) float32, the row maxima; offset (k blocks, rows to 32, 1) int32, the ternary fields'
    # +2 times the block's input sums; acc (rows to 32, block_n) int32.
    per = _per(form)
    rows, few = x_ref.shape[0], xf_ref.shape[0]
    blocks_k, _, _, bk = q_ref.shape
    j, i = pl.program_id(0), pl.program_id(1)

    @pl.when(jnp.logical_and(j == 0, i == 0))
    def _quantise() -> None:
        # Once a call: the float rows (to 8, a float32 tile) to int8 codes in the MXU's rows (to 32, zeros).
        if rows != few:
            xf_ref[...] = jnp.zeros_like(xf_ref)
        xf_ref[0:rows, :] = x_ref[...].astype(jnp.float32)
        qf, m = quantise_rows(xf_ref[...], bits)
        m_ref[...] = m
        if few != q_ref.shape[2]:
            q_ref[...] = jnp.zeros_like(q_ref)
            offset_ref[...] = jnp.zeros_like(offset_ref)
        quarter = xf_ref.shape[1] // per  # the rows of one packed slice
        for b in range(blocks_k):
            total = None
            for p in range(per):
                block = qf[:, p * quarter + b * bk : p * quarter + (b + 1) * bk]
                q_ref[b, p, 0:few, :] = block.astype(jnp.int32).astype(jnp.int8)
                if per > 1:  # float32 sums of integer codes below 2**24: exact
                    part = jnp.sum(block, axis=1, keepdims=True)
                    total = part if total is None else total + part
            if total is not None:
                offset_ref[b, 0:few, :] = 2 * total.astype(jnp.int32)

    zero_accumulator(acc_ref)

    acc = acc_ref[...]
    if per == 1:
        acc += int8_dot(q_ref[i, 0], w_ref[...])
    elif w_ref.shape[0] % _INT8_TILE == 0:
        # As the ternary kernel: four fields a 32-bit word read as int8 (code + 2), the +2 taken off as 2 sum(q).
        words = pltpu.bitcast(w_ref[...], jnp.int32)
        for p in range(per):
            acc += int8_dot(q_ref[i, p], pltpu.bitcast((words >> (2 * p)) & 0x03030303, jnp.int8))
        acc -= offset_ref[i]
    else:
        for p, codes in enumerate(unpack_slices(w_ref[...], 2)):
            acc += int8_dot(q_ref[i, p], codes)
    acc_ref[...] = acc

    @pl.when(last_step())
    def _rescale() -> None:
        scale = scale_ref[0] if len(scale_ref.shape) == 1 else scale_ref[...]
        out_ref[...] = rescale(acc_ref[0:few, :], m_ref[...], scale, form)[0:rows]


def fused_linear(
    x: jax.Array,
    codes: jax.Array,
    scale: jax.Array,
    *,
    form: str,
    bits: int = 8,
    blocks: Blocks | None = None,
    interpret: bool = False,
) -> jax.Array:
    """A low-bit linear layer in one kernel: float ``x`` ``(..., k)`` to float32 ``(..., n)``.

    Args:
      x: the float input, any leading shape (flattened to rows; at most 256).
      codes: the resident codes: int8 ``(k, n)`` for ``"int8"`` and ``"ternary-int8"``, packed bytes
        ``(1, k / 4, n)`` for ``"ternary-2bit"``.
      scale: the weight side of the rescale, :func:`multiplier` of the layer's scale: float32 ``(n,)`` or
        ``(1, n)`` (a TPU keeps it in the layout of the kernel's block, uncopied) for ``"int8"``; ``()`` for
        ternary forms, or ``(n,)`` or ``(1, n)`` for ternary kernels side by side, each column with its own
        tensor's scale (the same float operations per column).
      form: ``"int8"``, ``"ternary-int8"`` or ``"ternary-2bit"``.
      bits: the input codes' bits (8 or 4).
      blocks: :class:`Blocks` over the (packed) ``(k / per, n)`` codes (None: :func:`fused_blocks`).
      interpret: run the kernel in Pallas interpret mode (any backend).

    Raises:
      ValueError: an unknown form, input bits other than 8 or 4, a non-float input or non-int8 codes, shapes
        that do not agree, or blocks that do not tile the codes.
    """
    return _fused_linear(x, codes, scale, form=form, bits=bits, blocks=blocks, interpret=interpret)


@functools.partial(jax.jit, static_argnames=("form", "bits", "blocks", "interpret"))
def _fused_linear(
    x: jax.Array,
    codes: jax.Array,
    scale: jax.Array,
    *,
    form: str,
    bits: int,
    blocks: Blocks | None,
    interpret: bool,
) -> jax.Array:
    k, n = _check(x, codes, scale, form, bits, "fused_linear")
    per = _per(form)
    rows_k = k // per
    lead = x.shape[:-1]
    xr = x.reshape(-1, k)
    rows = xr.shape[0]
    blocks = fused_blocks(rows_k, n) if blocks is None else blocks
    blocks.check(rows_k, n, where="fused_linear")
    padded = -(-rows // ROW_PAD) * ROW_PAD
    few = -(-rows // 8) * 8
    bk, bn = blocks.block_k, blocks.block_n
    if scale.ndim:  # per column: int8, or ternary kernels side by side
        scale_arg = scale.astype(jnp.float32).reshape(1, n)
        scale_spec = pl.BlockSpec((1, bn), lambda j, i: (0, j))
    else:
        scale_arg = scale.astype(jnp.float32).reshape(1)
        scale_spec = pl.BlockSpec(memory_space=pltpu.SMEM)
    out = pl.pallas_call(
        functools.partial(_body, form=form, bits=bits),
        grid=(n // bn, rows_k // bk),
        in_specs=[
            pl.BlockSpec((rows, k), lambda j, i: (0, 0)),
            pl.BlockSpec((bk, bn), lambda j, i: (i, j)),
            scale_spec,
        ],
        out_specs=pl.BlockSpec((rows, bn), lambda j, i: (0, j)),
        out_shape=jax.ShapeDtypeStruct((rows, n), jnp.float32),
        scratch_shapes=[
            pltpu.VMEM((few, k), jnp.float32),
            pltpu.VMEM((rows_k // bk, per, padded, bk), jnp.int8),
            pltpu.VMEM((few, 1), jnp.float32),
            pltpu.VMEM((rows_k // bk, padded, 1), jnp.int32),
            pltpu.VMEM((padded, bn), jnp.int32),
        ],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("arbitrary", "arbitrary"),  # the first step quantises the rows for all
            vmem_limit_bytes=vmem_limit(4 * few * k, 2 * padded * k, 3 * bk * bn, 8 * padded * bn),
        ),
        cost_estimate=pl.CostEstimate(
            flops=2 * padded * k * n,
            transcendentals=0,
            bytes_accessed=rows_k * n + 4 * rows * k + 4 * rows * n + (4 * n if scale.ndim else 4),
        ),
        interpret=interpret,
    )(xr, codes.reshape(rows_k, n), scale_arg)
    return out.reshape(*lead, n)


# ----------------------------------------------------------------------------- grouped int4 and int2 weights

GROUPED_FORMS = ("int4", "int2")
GROUPED_MOST_ROWS = 16  # more rows: the expanded input grows with rows x groups; the XLA path is used


def grouped_multiplier(scale: np.ndarray, bits: int) -> np.ndarray:
    """The weight side of a grouped layer's rescale, on the host (float32, IEEE): :math:`s_{go} \\operatorname{fl}(1/t)`
    for each group and column (``t = 2**(bits-1) - 1`` for ``bits`` input bits)."""
    return np.asarray(scale, np.float32) * (np.float32(1) / np.float32(2 ** (bits - 1) - 1))


def _check_grouped(x: jax.Array, packed: jax.Array, scale: jax.Array, form: str, bits: int, where: str) -> tuple:
    if form not in GROUPED_FORMS:
        raise ValueError(f"{where}: form must be one of {GROUPED_FORMS}; got {form!r}.")
    if bits not in (4, 8):
        raise ValueError(f"{where}: input bits must be 8 or 4; got {bits!r}.")
    if not jnp.issubdtype(x.dtype, jnp.floating) or packed.dtype != jnp.int8:
        raise ValueError(f"{where}: expected a float input and int8 packed bytes; got {x.dtype} and {packed.dtype}.")
    if packed.ndim != 3:
        raise ValueError(f"{where}: expected packed bytes of shape (groups, group / per, n); got {packed.shape}.")
    groups, per_group, n = packed.shape
    group = per_group * (4 if form == "int2" else 2)
    if scale.shape != (groups, n):
        raise ValueError(f"{where}: expected scales of shape {(groups, n)}; got {scale.shape}.")
    if x.shape[-1] != groups * group:
        raise ValueError(f"{where}: x's last axis ({x.shape[-1]}) must equal groups x group ({groups * group}).")
    return groups, group, n


def fused_grouped_reference(x: jax.Array, packed: jax.Array, scale: jax.Array, *, form: str, bits: int) -> jax.Array:
    """Reference (pure JAX): a grouped layer's XLA path, float ``x`` ``(..., k)`` to float32 ``(..., n)``.

    ``scale``: :func:`grouped_multiplier` of the layer's group scales: the group sums scaled and added in the
    order of the groups (:func:`stejax.lowbit.kernels._grouped.grouped_sum_reference`), then times the row maxima.
    """
    from stejax.lowbit.kernels._grouped import grouped_sum_reference

    _check_grouped(x, packed, scale, form, bits, "fused_grouped_reference")
    qf, m = quantise_rows(x.astype(jnp.float32), bits)
    total = grouped_sum_reference(qf.astype(jnp.int8), packed, scale, bits=4 if form == "int4" else 2)
    return total * m


def fused_grouped_blocks(groups: int, group: int, n: int, form: str) -> Blocks:
    """The fused grouped kernel's blocks over the packed ``(groups * group / per, n)`` bytes.

    ``block_k``: the fewest packed rows (a multiple of 128 dividing them) that hold 16 groups or more (256 for
    int4, 128 for int2), else the most; ``block_n``: the widest multiple of 128 dividing ``n`` whose block holds
    at most 2 MiB. Whole axes where no multiple of 128 divides them. Picked by the TPU compiler's static
    estimates for the 1B model's shapes (``benchmarks/lm_kernels_static.py``): each block of ``g`` groups
    multiplies ``g`` expanded rows per input row on the MXU, and each grid step costs a fixed time; 16 groups
    and whole columns balance the two.
    """
    per_group = group // (4 if form == "int2" else 2)
    rows_k = groups * per_group
    ks = [b for b in range(128, rows_k + 1, 128) if rows_k % b == 0 and b % per_group == 0]
    wide = [b for b in ks if b // per_group >= 16]
    block_k = min(wide) if wide else max(ks, default=rows_k)
    ns = [b for b in range(128, n + 1, 128) if n % b == 0]
    fitting = [b for b in ns if block_k * b <= 2 * 1024 * 1024]
    block_n = max(fitting) if fitting else min(ns, default=n)
    return Blocks(block_k, block_n)


def fused_grouped_fits(rows: int, k: int, n: int, group: int, form: str) -> bool:
    """Whether the fused grouped kernel takes this shape with its default blocks (never raises)."""
    per = 4 if form == "int2" else 2
    if rows > GROUPED_MOST_ROWS or k % group or group % per or (group // per) & (group // per - 1):
        return False
    per_group = group // per
    blocks = fused_grouped_blocks(k // group, group, n, form)
    try:
        blocks.check(k // group * per_group, n, where="fused_grouped_linear", multiple_k=per_group)
    except ValueError:
        return False
    few = -(-rows // 8) * 8
    return blocks.block_k // per_group * few <= 512 and blocks.block_k * blocks.block_n <= 4 * 1024 * 1024


def _grouped_body(
    x_ref: jax.Array,
    w_ref: jax.Array,
    s_ref: jax.Array,
    out_ref: jax.Array,
    xf_ref: jax.Array,
    q_ref: jax.Array,
    m_ref: jax.Array,
    offset_ref: jax.Array,
    acc_ref: jax.Array,
    *,
    bits: int,
    wbits: int,
    group: int,
) -> None:
    # x (rows, k) float, the whole input; w (block_k, block_n) packed bytes; s (groups in a block, block_n) float32
    # multipliers; out (rows, block_n) float32.
    # Scratch: xf (few = rows to 8, k) float32; q (k blocks, per, expanded rows to 32, block_k) int8: row
    # g * few + r of slice s holds row r's codes of the block's group g in that group's packed columns, zeros
    # elsewhere; m (few, 1) float32, the row maxima; offset (k blocks, expanded rows, 1) int32: the fields' offset
    # times each expanded row's input sum; acc (few, block_n) float32.
    per = 8 // wbits
    per_group = group // per
    rows, few = x_ref.shape[0], xf_ref.shape[0]
    blocks_k, _, expanded, bk = q_ref.shape
    in_block = bk // per_group
    j, i = pl.program_id(0), pl.program_id(1)
    shift = per_group.bit_length() - 1  # per_group is a power of two

    @pl.when(jnp.logical_and(j == 0, i == 0))
    def _quantise() -> None:
        # Once a call: the float rows to int8 codes, arranged in the packed rows' order and expanded by group.
        if rows != few:
            xf_ref[...] = jnp.zeros_like(xf_ref)
        xf_ref[0:rows, :] = x_ref[...].astype(jnp.float32)
        qf, m = quantise_rows(xf_ref[...], bits)
        m_ref[...] = m
        width = bk * per  # a block's input codes
        line = jax.lax.broadcasted_iota(jnp.int32, (width, bk), 0)
        column = jax.lax.broadcasted_iota(jnp.int32, (width, bk), 1)
        lane_group = jax.lax.broadcasted_iota(jnp.int32, (few, bk), 1) >> shift
        home = ((column >> shift) * group) + (column & (per_group - 1))  # slice 0's input of each packed column
        for b in range(blocks_k):
            codes = qf[:, b * width : (b + 1) * width]
            total = None
            for s in range(per):
                # A 0/1 matrix picks each packed column's input code: exact (one code, an integer below 2**8).
                pick = (line == home + s * per_group).astype(jnp.float32)
                arranged = jax.lax.dot_general(
                    codes,
                    pick,
                    (((1,), (0,)), ((), ())),
                    precision=jax.lax.Precision.DEFAULT,
                    preferred_element_type=jnp.float32,
                )
                parts = [jnp.where(lane_group == g, arranged, 0.0) for g in range(in_block)]
                if expanded != in_block * few:
                    parts.append(jnp.zeros((expanded - in_block * few, bk), jnp.float32))
                block = jnp.concatenate(parts, axis=0)
                q_ref[b, s] = block.astype(jnp.int32).astype(jnp.int8)
                part = jnp.sum(block, axis=1, keepdims=True)  # float32 sums of integer codes below 2**24: exact
                total = part if total is None else total + part
            assert total is not None
            offset_ref[b] = (1 << (wbits - 1)) * total.astype(jnp.int32)

    zero_accumulator(acc_ref)

    sums = None
    if bk % _INT8_TILE == 0:
        words = pltpu.bitcast(w_ref[...], jnp.int32)
        mask = ((1 << wbits) - 1) * 0x01010101
        for s in range(per):
            product = int8_dot(q_ref[i, s], pltpu.bitcast((words >> (wbits * s)) & mask, jnp.int8))
            sums = product if sums is None else sums + product
        assert sums is not None
        sums = sums - offset_ref[i]
    else:
        for s, codes in enumerate(unpack_slices(w_ref[...], wbits)):
            product = int8_dot(q_ref[i, s], codes)
            sums = product if sums is None else sums + product
    assert sums is not None
    parts = sums.astype(jnp.float32)
    acc = acc_ref[...]
    for g in range(in_block):  # the groups in order
        acc = acc + parts[g * few : (g + 1) * few] * s_ref[g : g + 1, :]
    acc_ref[...] = acc

    @pl.when(last_step())
    def _rescale() -> None:
        out_ref[...] = (acc_ref[...] * m_ref[...])[0:rows]


def fused_grouped_linear(
    x: jax.Array,
    packed: jax.Array,
    scale: jax.Array,
    *,
    form: str,
    bits: int = 8,
    blocks: Blocks | None = None,
    interpret: bool = False,
) -> jax.Array:
    """A grouped int4 or int2 layer in one kernel: float ``x`` ``(..., k)`` to float32 ``(..., n)``.

    At the first grid step the float rows are quantised (:func:`quantise_rows`) and their codes arranged in
    VMEM in the packed rows' order, one row per group of a block (a product by a 0/1 matrix on the MXU, exact),
    with each expanded row's input sum (the packed fields' offset is taken off as the offset times it). Each
    step multiplies a block of packed codes by them (int32, exact per group), scales each group's sums and adds
    them in the order of the groups; the last step multiplies by the row maxima. The float operations are
    :func:`fused_grouped_reference`'s, in its order.

    Args:
      x: the float input, any leading shape (flattened to rows; at most 16).
      packed: the resident bytes ``(groups, group / per, n)`` (:func:`stejax.lowbit.pack_groups`);
        ``group / per`` a power of two.
      scale: :func:`grouped_multiplier` of the group scales, float32 ``(groups, n)``.
      form: ``"int4"`` or ``"int2"``.
      bits: the input codes' bits (8 or 4).
      blocks: :class:`Blocks` over the packed ``(k / per, n)`` bytes, ``block_k`` a multiple of a group's packed
        rows (None: :func:`fused_grouped_blocks`).
      interpret: run the kernel in Pallas interpret mode (any backend).

    Raises:
      ValueError: an unknown form, input bits other than 8 or 4, a non-float input or non-int8 bytes, shapes
        that do not agree, groups whose packed rows are not a power of two, or blocks that do not tile the bytes.
    """
    return _fused_grouped_linear(x, packed, scale, form=form, bits=bits, blocks=blocks, interpret=interpret)


@functools.partial(jax.jit, static_argnames=("form", "bits", "blocks", "interpret"))
def _fused_grouped_linear(
    x: jax.Array,
    packed: jax.Array,
    scale: jax.Array,
    *,
    form: str,
    bits: int,
    blocks: Blocks | None,
    interpret: bool,
) -> jax.Array:
    groups, group, n = _check_grouped(x, packed, scale, form, bits, "fused_grouped_linear")
    wbits = 4 if form == "int4" else 2
    per = 8 // wbits
    per_group = group // per
    if per_group & (per_group - 1):
        raise ValueError(f"fused_grouped_linear: a group's packed rows must be a power of two; got {per_group}.")
    rows_k, k = groups * per_group, groups * group
    lead = x.shape[:-1]
    xr = x.reshape(-1, k)
    rows = xr.shape[0]
    blocks = fused_grouped_blocks(groups, group, n, form) if blocks is None else blocks
    blocks.check(rows_k, n, where="fused_grouped_linear", multiple_k=per_group)
    bk, bn = blocks.block_k, blocks.block_n
    in_block = bk // per_group
    few = -(-rows // 8) * 8
    expanded = -(-in_block * few // ROW_PAD) * ROW_PAD
    out = pl.pallas_call(
        functools.partial(_grouped_body, bits=bits, wbits=wbits, group=group),
        grid=(n // bn, rows_k // bk),
        in_specs=[
            pl.BlockSpec((rows, k), lambda j, i: (0, 0)),
            pl.BlockSpec((bk, bn), lambda j, i: (i, j)),
            pl.BlockSpec((in_block, bn), lambda j, i: (i, j)),
        ],
        out_specs=pl.BlockSpec((rows, bn), lambda j, i: (0, j)),
        out_shape=jax.ShapeDtypeStruct((rows, n), jnp.float32),
        scratch_shapes=[
            pltpu.VMEM((few, k), jnp.float32),
            pltpu.VMEM((rows_k // bk, per, expanded, bk), jnp.int8),
            pltpu.VMEM((few, 1), jnp.float32),
            pltpu.VMEM((rows_k // bk, expanded, 1), jnp.int32),
            pltpu.VMEM((few, bn), jnp.float32),
        ],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("arbitrary", "arbitrary"),  # the first step quantises the rows for all
            vmem_limit_bytes=vmem_limit(
                4 * few * k, 2 * per * expanded * rows_k, 3 * bk * bn, 4 * in_block * bn, 8 * expanded * bn
            ),
        ),
        cost_estimate=pl.CostEstimate(
            flops=2 * expanded * k * n,
            transcendentals=0,
            bytes_accessed=rows_k * n + 4 * groups * n + 4 * rows * k + 4 * rows * n,
        ),
        interpret=interpret,
    )(xr, packed.reshape(rows_k, n), scale.astype(jnp.float32))
    return out.reshape(*lead, n)
