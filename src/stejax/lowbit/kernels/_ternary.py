r"""Ternary weights packed four to a byte times int8 input codes, int32 accumulators: kernel and reference.

The codes :math:`c \in \{-1, 0, 1\}` of a ``(k, n)`` kernel are resident as
``(1, k / 4, n)`` bytes (:func:`stejax.lowbit.pack_groups` with one group of
``k``): bits :math:`2s .. 2s+1` of byte ``[0, j, o]`` hold :math:`c + 2` of row
:math:`s k / 4 + j`, so each of the four 2-bit slices is a contiguous quarter
of the rows. The product :math:`a_{mo} = \sum_i q_{mi} c_{io}` is exact in
int32; :class:`stejax.lm.LowBitLinear` divides it by the input and weight
scales afterwards.

The kernel reads a block of packed bytes from HBM (a quarter of the int8
form's bytes), unpacks the four slices in VMEM and multiplies each by its
quarter of the inputs on the MXU (int8 by int8, int32 accumulation). A block of
whole int8 tiles (32 rows) is unpacked four bytes at a time: its 32-bit words
shifted and masked (``(w >> 2s) & 0x03030303``) are the slice's fields as int8,
in place, and the fields' +2 is subtracted as :math:`2 \sum_i q_i`; other
blocks are widened to int32 and unpacked field by field. :func:`ternary_accumulate_reference` unpacks with the same
function and multiplies with ``lax.dot_general``: the test oracle and the
fallback wherever the kernel cannot run. ``method="vpu"`` multiplies up to 8
rows on the vector unit instead, reading the same bytes
(:mod:`stejax.lowbit.kernels._vpu`); the sums are the same.
"""

from __future__ import annotations

import functools

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
from stejax.lowbit.kernels._vpu import VPU_MOST_ROWS, check_method, field_sums

__all__ = ["ternary_accumulate", "ternary_accumulate_reference", "ternary_kernel_fits"]

PER = 4  # codes a byte
_INT8_TILE = 32  # int8 rows of a vreg: a block of them is read as 32-bit words
ROW_PAD = 32
MOST_ROWS = 256


def _check(q: jax.Array, packed: jax.Array, where: str) -> tuple[int, int]:
    if q.dtype != jnp.int8 or packed.dtype != jnp.int8:
        raise ValueError(f"{where}: expected int8 input codes and packed bytes; got {q.dtype} and {packed.dtype}.")
    if packed.ndim != 3 or packed.shape[0] != 1:
        raise ValueError(f"{where}: expected packed bytes of shape (1, k / 4, n); got {packed.shape}.")
    k, n = PER * packed.shape[1], packed.shape[2]
    if q.shape[-1] != k:
        raise ValueError(f"{where}: q's last axis ({q.shape[-1]}) must equal 4 x packed rows ({k}).")
    return k, n


def ternary_accumulate_reference(q: jax.Array, packed: jax.Array) -> jax.Array:
    """Reference (pure JAX): int8 ``q`` ``(..., k)`` times the packed ternary codes, int32 ``(..., n)``."""
    k, _ = _check(q, packed, "ternary_accumulate_reference")
    xq = q.reshape(*q.shape[:-1], PER, k // PER)
    products = [
        jax.lax.dot_general(xq[..., s, :], c[0], (((xq.ndim - 2,), (0,)), ((), ())), preferred_element_type=jnp.int32)
        for s, c in enumerate(unpack_slices(packed, 2))
    ]
    return functools.reduce(jnp.add, products)


def ternary_kernel_fits(rows: int, k: int, n: int) -> bool:
    """Whether the kernel takes this shape with its default blocks (never raises)."""
    if rows > MOST_ROWS or k % PER:
        return False
    blocks = default_blocks(k // PER, n)
    try:
        blocks.check(k // PER, n, where="ternary_accumulate")
    except ValueError:
        return False
    return blocks.block_k * blocks.block_n <= 4 * 1024 * 1024


def _body(x_ref: jax.Array, w_ref: jax.Array, out_ref: jax.Array, acc_ref: jax.Array) -> None:
    # x (4, rows, block_k) int8: the input of each slice; w (block_k, block_n) packed int8; acc, out int32.
    zero_accumulator(acc_ref)

    acc = acc_ref[...]
    bk = w_ref.shape[0]
    if bk % _INT8_TILE == 0:
        # Four bytes a 32-bit word: one shift and one mask give a slice's fields (code + 2, 1..3) of four bytes at
        # once, in place, read back as int8. The +2 of every field is taken off below.
        words = pltpu.bitcast(w_ref[...], jnp.int32)
        for s in range(PER):
            acc += int8_dot(x_ref[s], pltpu.bitcast((words >> (2 * s)) & 0x03030303, jnp.int8))
        for s in range(PER):
            xs = x_ref[s].astype(jnp.int32)
            for a in range(0, bk, 128):  # float32 sums of at most 128 codes: exact
                part = jnp.sum(xs[:, a : a + 128].astype(jnp.float32), axis=1, keepdims=True)
                acc -= 2 * part.astype(jnp.int32)
    else:
        for s, codes in enumerate(unpack_slices(w_ref[...], 2)):
            acc += int8_dot(x_ref[s], codes)
    acc_ref[...] = acc

    write_accumulator(acc_ref, out_ref)


def ternary_accumulate(
    q: jax.Array,
    packed: jax.Array,
    *,
    blocks: Blocks | None = None,
    interpret: bool = False,
    method: str = "mxu",
) -> jax.Array:
    """int8 ``q`` ``(..., k)`` times ternary codes packed ``(1, k / 4, n)``: int32 ``(..., n)``.

    Args:
      q: input codes, any leading shape (flattened to rows; padded to a multiple of 32 for the MXU).
      packed: the resident bytes (int8), read as they are.
      blocks: :class:`Blocks` over the packed ``(k / 4, n)`` bytes (None: :func:`default_blocks`, or
        :func:`stejax.lowbit.kernels._vpu.vpu_blocks`).
      interpret: run the kernel in Pallas interpret mode (any backend).
      method: ``"mxu"`` (the unpacked slices multiplied on the MXU), ``"vpu"`` (at most 8 rows on the vector
        unit; more rows on the MXU).

    Raises:
      ValueError: dtypes other than int8, a packed shape other than ``(1, k / 4, n)``, an unknown method, or
        blocks that do not tile the packed bytes.
    """
    method = check_method(method, "ternary_accumulate")
    return _ternary_accumulate(q, packed, blocks=blocks, interpret=interpret, method=method)


@functools.partial(jax.jit, static_argnames=("blocks", "interpret", "method"))
def _ternary_accumulate(
    q: jax.Array, packed: jax.Array, *, blocks: Blocks | None, interpret: bool, method: str
) -> jax.Array:
    k, n = _check(q, packed, "ternary_accumulate")
    rows_k = k // PER
    lead = q.shape[:-1]
    x = q.reshape(-1, k)
    rows = x.shape[0]
    if method == "vpu" and rows <= VPU_MOST_ROWS:
        # Each field holds code + 2: the kernel subtracts the offset's share (exact in int32).
        acc = field_sums(
            x,
            packed.reshape(rows_k, n),
            per=PER,
            bits=2,
            offset=2,
            blocks=blocks,
            interpret=interpret,
            where="ternary_accumulate",
        )
        return acc.reshape(*lead, n)
    blocks = default_blocks(rows_k, n) if blocks is None else blocks
    blocks.check(rows_k, n, where="ternary_accumulate")
    padded = -(-rows // ROW_PAD) * ROW_PAD
    xs = arrange_input(jnp.pad(x, ((0, padded - rows), (0, 0))), k, PER)  # (4, padded, k / 4)
    bk, bn = blocks.block_k, blocks.block_n
    out = pl.pallas_call(
        _body,
        grid=(n // bn, rows_k // bk),
        in_specs=[
            pl.BlockSpec((PER, padded, bk), lambda j, i: (0, 0, i)),
            pl.BlockSpec((bk, bn), lambda j, i: (i, j)),
        ],
        out_specs=pl.BlockSpec((padded, bn), lambda j, i: (0, j)),
        out_shape=jax.ShapeDtypeStruct((padded, n), jnp.int32),
        scratch_shapes=[pltpu.VMEM((padded, bn), jnp.int32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary"),
            # The unpacked int32 words and the four int8 slices live beside the packed block.
            vmem_limit_bytes=vmem_limit(PER * padded * bk, 3 * bk * bn, 8 * padded * bn),
        ),
        cost_estimate=pl.CostEstimate(
            flops=2 * padded * k * n, transcendentals=0, bytes_accessed=rows_k * n + padded * k + 4 * padded * n
        ),
        interpret=interpret,
    )(xs, packed.reshape(rows_k, n))
    return out[:rows].reshape(*lead, n)
