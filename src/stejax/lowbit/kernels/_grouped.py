r"""Grouped int4 (or int2) weights times int8 input codes, scaled group by group: kernel and reference.

The codes of a ``(k, n)`` kernel, in groups of ``group`` rows along the
contraction axis, are resident packed ``per = 8 / bits`` to a byte as
``(k / group, group / per, n)`` (:func:`stejax.lowbit.pack_groups`), with a
float32 scale :math:`s_{go}` per group and column. The product is

.. math::
    y_{mo} = \sum_g s_{go} \sum_{i \in g} q_{mi} c_{io},

an exact int32 sum per group, then float32 products and sums over the groups
**in the order** :math:`g = 0, 1, \ldots` (the kernel and the reference add them
in that one order, so their results are identical, not merely close).

A block of whole int8 tiles (32 packed rows) is unpacked four bytes at a time:
its 32-bit words shifted and masked are a slice's unsigned fields as int8, in
place, and each group's offset is subtracted as the offset times the group's
input sum.

The MXU multiplies a block of rows at once, not one group: the wrapper expands
each input row into one row per group of the block (the row's codes in that
group's columns, zeros elsewhere), so that one int8 product gives every group's
int32 sum at once; the kernel then scales and adds them. The grid walks blocks
of 128 packed rows (eight int4 groups): few groups a block keep the expanded
rows few. :func:`grouped_sum_reference` is the test oracle and the fallback.
``method="vpu"`` multiplies up to 8 rows on the vector unit instead
(:mod:`stejax.lowbit.kernels._vpu`): the same exact group sums, scaled and added in
the same order.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from stejax.lowbit._packing import arrange_input, unpack_slices
from stejax.lowbit.kernels._skeleton import (
    Blocks,
    default_blocks,
    int8_dot,
    vmem_limit,
    write_accumulator,
    zero_accumulator,
)
from stejax.lowbit.kernels._vpu import VPU_MOST_ROWS, check_method, grouped_vpu_sum

__all__ = ["grouped_kernel_fits", "grouped_sum", "grouped_sum_reference"]

ROW_PAD = 8  # input rows: a multiple of the float32 sublane tiling (the group sums are sliced by rows)
_INT8_TILE = 32  # int8 rows of a vreg: a block of them is read as 32-bit words
MOST_ROWS = 16  # more rows: the expanded input grows with rows x groups; XLA's product is used


def _check(q: jax.Array, packed: jax.Array, scale: jax.Array, bits: int, where: str) -> tuple[int, int, int]:
    if bits not in (2, 4):
        raise ValueError(f"{where}: bits must be 4 or 2; got {bits!r}.")
    if q.dtype != jnp.int8 or packed.dtype != jnp.int8:
        raise ValueError(f"{where}: expected int8 input codes and packed bytes; got {q.dtype} and {packed.dtype}.")
    if packed.ndim != 3:
        raise ValueError(f"{where}: expected packed bytes of shape (groups, group / per, n); got {packed.shape}.")
    groups, per_group, n = packed.shape
    group = per_group * (8 // bits)
    if scale.shape != (groups, n):
        raise ValueError(f"{where}: expected scales of shape {(groups, n)}; got {scale.shape}.")
    if q.shape[-1] != groups * group:
        raise ValueError(f"{where}: q's last axis ({q.shape[-1]}) must equal groups x group ({groups * group}).")
    return groups, group, n


def grouped_sum_reference(q: jax.Array, packed: jax.Array, scale: jax.Array, *, bits: int) -> jax.Array:
    """Reference (pure JAX): :math:`\\sum_g s_g \\sum_{i \\in g} q_i c_i`, float32 ``(..., n)``, groups in order."""
    groups, group, n = _check(q, packed, scale, bits, "grouped_sum_reference")
    slices = unpack_slices(packed, bits)
    xq = q.reshape(*q.shape[:-1], groups, len(slices), group // len(slices))
    products = [
        jax.lax.dot_general(
            xq[..., s, :], c, (((xq.ndim - 2,), (1,)), ((xq.ndim - 3,), (0,))), preferred_element_type=jnp.int32
        )
        for s, c in enumerate(slices)
    ]  # each (groups, ..., n): dot_general puts the batch (group) axis first
    acc = functools.reduce(jnp.add, products).astype(jnp.float32)
    total = jnp.zeros(acc.shape[1:], jnp.float32)
    for g in range(groups):  # one order of float32 sums, the kernel's
        total = total + acc[g] * scale[g].reshape((1,) * (total.ndim - 1) + (n,))
    return total


def _blocks(groups: int, group: int, n: int, bits: int) -> Blocks:
    per_group = group // (8 // bits)
    return default_blocks(groups * per_group, n, multiple_k=per_group, fewest_k=True)


def grouped_kernel_fits(rows: int, k: int, n: int, group: int, bits: int) -> bool:
    """Whether the kernel takes this shape with its default blocks (never raises)."""
    if rows > MOST_ROWS or k % group:
        return False
    per_group = group // (8 // bits)
    blocks = _blocks(k // group, group, n, bits)
    try:
        blocks.check(k // group * per_group, n, where="grouped_sum", multiple_k=per_group)
    except ValueError:
        return False
    in_block = blocks.block_k // per_group
    return in_block * ROW_PAD <= 512 and blocks.block_k * blocks.block_n <= 4 * 1024 * 1024


def _body(
    x_ref: jax.Array, w_ref: jax.Array, s_ref: jax.Array, out_ref: jax.Array, acc_ref: jax.Array, *, bits: int
) -> None:
    # x (per, groups_in_block * rows, block_k) int8: row g * rows + r holds row r's codes of group g, else zeros;
    # w (block_k, block_n) packed int8; s (groups_in_block, block_n) float32; acc, out (rows, block_n) float32.
    zero_accumulator(acc_ref)

    per, bk = 8 // bits, w_ref.shape[0]
    sums = None
    if bk % _INT8_TILE == 0:
        # Four bytes a 32-bit word: one shift and one mask give a slice's fields (code + offset, unsigned) of four
        # bytes at once, in place, read back as int8; the offset of each group's fields is taken off below.
        words = pltpu.bitcast(w_ref[...], jnp.int32)
        mask = ((1 << bits) - 1) * 0x01010101
        for s in range(per):
            product = int8_dot(x_ref[s], pltpu.bitcast((words >> (bits * s)) & mask, jnp.int8))
            sums = product if sums is None else sums + product
        assert sums is not None
        offset = 1 << (bits - 1)
        for s in range(per):  # each expanded row holds one group's inputs: its sum times the offset
            xs = x_ref[s].astype(jnp.int32)
            for a in range(0, bk, 128):  # float32 sums of at most 128 codes: exact
                part = jnp.sum(xs[:, a : a + 128].astype(jnp.float32), axis=1, keepdims=True)
                sums = sums - offset * part.astype(jnp.int32)
    else:
        for s, codes in enumerate(unpack_slices(w_ref[...], bits)):
            product = int8_dot(x_ref[s], codes)
            sums = product if sums is None else sums + product
    assert sums is not None
    parts = sums.astype(jnp.float32)
    rows = acc_ref.shape[0]
    acc = acc_ref[...]
    for g in range(s_ref.shape[0]):  # the groups in order
        acc = acc + parts[g * rows : (g + 1) * rows] * s_ref[g : g + 1, :]
    acc_ref[...] = acc

    write_accumulator(acc_ref, out_ref)


def grouped_sum(
    q: jax.Array,
    packed: jax.Array,
    scale: jax.Array,
    *,
    bits: int,
    blocks: Blocks | None = None,
    interpret: bool = False,
    method: str = "mxu",
) -> jax.Array:
    """int8 ``q`` ``(..., k)`` times grouped codes packed ``(groups, group / per, n)`` with scales ``(groups, n)``.

    Returns float32 ``(..., n)``: :math:`\\sum_g s_g \\sum_{i \\in g} q_i c_i`, the groups added in order.

    Args:
      q: input codes, any leading shape (flattened to rows; at most 16 rows a call keep the expansion small).
      packed: the resident bytes (int8), read as they are.
      scale: float32 ``(groups, n)``.
      bits: 4 or 2.
      blocks: :class:`Blocks` over the packed ``(k / per, n)`` bytes; ``block_k`` a multiple of a group's packed
        rows, for ``"vpu"`` of eight groups' (None: 128 packed rows and the widest ``block_n``, or
        :func:`stejax.lowbit.kernels._vpu.vpu_blocks`).
      interpret: run the kernel in Pallas interpret mode (any backend).
      method: ``"mxu"`` (one expanded int8 product on the MXU), ``"vpu"`` (at most 8 rows on the vector unit;
        more rows on the MXU).

    Raises:
      ValueError: bits other than 4 or 2, dtypes other than int8, shapes that do not agree, an unknown method,
        or blocks that do not tile the packed bytes.
    """
    method = check_method(method, "grouped_sum")
    return _grouped_sum(q, packed, scale, bits=bits, blocks=blocks, interpret=interpret, method=method)


@functools.partial(jax.jit, static_argnames=("bits", "blocks", "interpret", "method"))
def _grouped_sum(
    q: jax.Array,
    packed: jax.Array,
    scale: jax.Array,
    *,
    bits: int,
    blocks: Blocks | None,
    interpret: bool,
    method: str,
) -> jax.Array:
    groups, group, n = _check(q, packed, scale, bits, "grouped_sum")
    per = 8 // bits
    per_group = group // per
    rows_k, k = groups * per_group, groups * group
    if method == "vpu" and math.prod(q.shape[:-1]) <= VPU_MOST_ROWS:
        total = grouped_vpu_sum(
            q.reshape(-1, k),
            packed.reshape(rows_k, n),
            scale.astype(jnp.float32),
            group=group,
            bits=bits,
            blocks=blocks,
            interpret=interpret,
            where="grouped_sum",
        )
        return total.reshape(*q.shape[:-1], n)
    blocks = _blocks(groups, group, n, bits) if blocks is None else blocks
    blocks.check(rows_k, n, where="grouped_sum", multiple_k=per_group)
    bk, bn = blocks.block_k, blocks.block_n
    in_block = bk // per_group  # groups in a block
    lead = q.shape[:-1]
    x = q.reshape(-1, k)
    rows = x.shape[0]
    padded = -(-rows // ROW_PAD) * ROW_PAD
    xs = arrange_input(jnp.pad(x, ((0, padded - rows), (0, 0))), group, per)  # (per, padded, rows_k)
    group_of = (jnp.arange(rows_k) // per_group) % in_block
    mine = group_of[None, :] == jnp.arange(in_block)[:, None]  # (in_block, rows_k)
    expanded = jnp.where(mine[None, :, None, :], xs[:, None, :, :], jnp.int8(0)).reshape(per, in_block * padded, rows_k)
    out = pl.pallas_call(
        functools.partial(_body, bits=bits),
        grid=(n // bn, rows_k // bk),
        in_specs=[
            pl.BlockSpec((per, in_block * padded, bk), lambda j, i: (0, 0, i)),
            pl.BlockSpec((bk, bn), lambda j, i: (i, j)),
            pl.BlockSpec((in_block, bn), lambda j, i: (i, j)),
        ],
        out_specs=pl.BlockSpec((padded, bn), lambda j, i: (0, j)),
        out_shape=jax.ShapeDtypeStruct((padded, n), jnp.float32),
        scratch_shapes=[pltpu.VMEM((padded, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary"),
            vmem_limit_bytes=vmem_limit(per * in_block * padded * bk, 3 * bk * bn, 8 * in_block * padded * bn),
        ),
        cost_estimate=pl.CostEstimate(
            flops=2 * in_block * padded * k * n,
            transcendentals=0,
            bytes_accessed=rows_k * n + 4 * groups * n + in_block * padded * k + 4 * padded * n,
        ),
        interpret=interpret,
    )(expanded, packed.reshape(rows_k, n), scale.astype(jnp.float32))
    return out[:rows].reshape(*lead, n)
