r"""int8 weights times int8 input codes, int32 accumulators: a Pallas TPU kernel and its pure-JAX reference.

For input codes :math:`q` ``(m, k)`` and weight codes :math:`c` ``(k, n)``, both
int8, the product is :math:`a_{mo} = \sum_i q_{mi} c_{io}` in int32, exact.
The int8 and ternary-int8 forms of :class:`stejax.lm.LowBitLinear` rescale it
afterwards (outside the kernel: an elementwise epilogue, the same either way).

:func:`int8_accumulate` runs the kernel (weights read from HBM block by block,
multiplied on the MXU) or the reference :func:`int8_accumulate_reference`
(``lax.dot_general`` with ``preferred_element_type=int32``), which is also what
runs wherever the kernel cannot. ``method="vpu"`` multiplies up to 8 rows on the
vector unit instead of the MXU (:mod:`stejax.lowbit.kernels._vpu`); the sums are the same.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from stejax.lowbit.kernels._skeleton import (
    Blocks,
    default_blocks,
    int8_dot,
    vmem_limit,
    write_accumulator,
    zero_accumulator,
)
from stejax.lowbit.kernels._vpu import VPU_MOST_ROWS, check_method, field_sums

__all__ = ["ROW_PAD", "int8_accumulate", "int8_accumulate_reference", "int8_kernel_fits"]

ROW_PAD = 32  # input rows are padded to a multiple of int8's sublane tiling
MOST_ROWS = 256  # more rows (a prefill): XLA's product is as good, and the row block stays one


def int8_accumulate_reference(q: jax.Array, codes: jax.Array) -> jax.Array:
    """Reference (pure JAX): ``q`` int8 ``(..., k)`` times ``codes`` int8 ``(k, n)``, int32 ``(..., n)``."""
    return jax.lax.dot_general(q, codes, (((q.ndim - 1,), (0,)), ((), ())), preferred_element_type=jnp.int32)


def int8_kernel_fits(rows: int, k: int, n: int) -> bool:
    """Whether the kernel takes this shape with its default blocks (never raises)."""
    if rows > MOST_ROWS:
        return False
    blocks = default_blocks(k, n)
    try:
        blocks.check(k, n, where="int8_accumulate")
    except ValueError:
        return False
    return blocks.block_k * blocks.block_n <= 8 * 1024 * 1024


def _body(x_ref: jax.Array, w_ref: jax.Array, out_ref: jax.Array, acc_ref: jax.Array) -> None:
    # x (rows, block_k) int8, w (block_k, block_n) int8, out and acc (rows, block_n) int32.
    zero_accumulator(acc_ref)

    acc_ref[...] += int8_dot(x_ref[...], w_ref[...])

    write_accumulator(acc_ref, out_ref)


def int8_accumulate(
    q: jax.Array,
    codes: jax.Array,
    *,
    blocks: Blocks | None = None,
    interpret: bool = False,
    method: str = "mxu",
) -> jax.Array:
    """``q`` int8 ``(..., k)`` times ``codes`` int8 ``(k, n)``: int32 ``(..., n)``, block by block.

    Args:
      q: input codes, any leading shape (flattened to rows; padded to a multiple of 32 for the MXU).
      codes: weight codes, resident as they are (never copied or padded).
      blocks: :class:`Blocks` (None: :func:`default_blocks`, or :func:`stejax.lowbit.kernels._vpu.vpu_blocks`).
      interpret: run the kernel in Pallas interpret mode (any backend).
      method: ``"mxu"`` (int8 products on the MXU), ``"vpu"`` (at most 8 rows on the vector unit; more rows
        on the MXU).

    Raises:
      ValueError: dtypes other than int8, mismatched contraction, an unknown method, or blocks that do not
        tile ``(k, n)``.
    """
    method = check_method(method, "int8_accumulate")
    return _int8_accumulate(q, codes, blocks=blocks, interpret=interpret, method=method)


@functools.partial(jax.jit, static_argnames=("blocks", "interpret", "method"))
def _int8_accumulate(
    q: jax.Array, codes: jax.Array, *, blocks: Blocks | None, interpret: bool, method: str
) -> jax.Array:
    if q.dtype != jnp.int8 or codes.dtype != jnp.int8:
        raise ValueError(f"int8_accumulate: expected int8 inputs and codes; got {q.dtype} and {codes.dtype}.")
    k, n = codes.shape
    if q.shape[-1] != k:
        raise ValueError(f"int8_accumulate: q's last axis ({q.shape[-1]}) must equal codes' rows ({k}).")
    lead = q.shape[:-1]
    x = q.reshape(-1, k)
    rows = x.shape[0]
    if method == "vpu" and rows <= VPU_MOST_ROWS:
        acc = field_sums(x, codes, per=1, bits=8, offset=0, blocks=blocks, interpret=interpret, where="int8_accumulate")
        return acc.reshape(*lead, n)
    blocks = default_blocks(k, n) if blocks is None else blocks
    blocks.check(k, n, where="int8_accumulate")
    padded = -(-rows // ROW_PAD) * ROW_PAD
    x = jnp.pad(x, ((0, padded - rows), (0, 0)))
    bk, bn = blocks.block_k, blocks.block_n
    out = pl.pallas_call(
        _body,
        grid=(n // bn, k // bk),
        in_specs=[pl.BlockSpec((padded, bk), lambda j, i: (0, i)), pl.BlockSpec((bk, bn), lambda j, i: (i, j))],
        out_specs=pl.BlockSpec((padded, bn), lambda j, i: (0, j)),
        out_shape=jax.ShapeDtypeStruct((padded, n), jnp.int32),
        scratch_shapes=[pltpu.VMEM((padded, bn), jnp.int32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary"),
            vmem_limit_bytes=vmem_limit(padded * bk, bk * bn, 8 * padded * bn),
        ),
        cost_estimate=pl.CostEstimate(
            flops=2 * padded * k * n, transcendentals=0, bytes_accessed=k * n + padded * k + 4 * padded * n
        ),
        interpret=interpret,
    )(x, codes)
    return out[:rows].reshape(*lead, n)
