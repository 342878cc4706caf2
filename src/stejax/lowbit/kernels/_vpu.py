r"""The low-bit products on the TPU's vector unit (VPU) for a few rows: no MXU, exact int32 sums.

Why a second way to multiply. At batch 1 the MXU kernels push every 128 x 128 weight tile through a systolic
array for one useful input row (padded to 8 or 32). If loading a tile's weights into an MXU takes about 128
cycles, four MXUs at about 1.5 GHz take in some 7.7e11 weights a second whatever their packing: about 1.3 ms
for the 1e9 weights of the 1B model, against 0.31 ms for its 2-bit bytes over the HBM (819 GB/s) and 1.26 ms
for its int8 bytes. A product whose cost per weight is a few vector operations would then be bound by the
bytes instead.

The formulation (``method="vpu"``). The weights stay as they are resident: packed bytes ``(k / per, n)``,
contraction along sublanes, columns along lanes. For each input row :math:`r` the kernel makes one int32
multiplier per packed row and field from the input codes and broadcasts it along the 128 lanes once per block
(a sublane broadcast and a transpose of 128 x 128 words), so that a vreg of 8 packed rows x 128 columns is
multiplied element by element by a vreg of its 8 rows' multipliers and added into an ``(8, block_n)``
accumulator, whose 8 sublanes are added at the last block (an exact int32 sum). int8 and ternary calls run
nothing but the kernel around it: each small XLA operation around a kernel costs about a microsecond a layer
in the compiler's estimate, some 140 of them a step in the 1B model.

Fields without masks. A byte :math:`u` (0..255, the stored bits) holds ``per`` fields :math:`f_s` of ``b``
bits; with :math:`y_s = u \gg bs` (no mask: the higher fields ride along) and multipliers telescoped from
the inputs :math:`x_s` of the fields,

.. math::
    c_0 = x_0, \quad c_s = x_s - 2^b x_{s-1}, \qquad \sum_s c_s y_s = \sum_s x_s f_s

exactly (the higher fields' terms cancel). A field holds ``code + 2**(b-1)``: the offset is one integer per
input row (ternary: :math:`-2 \sum_i x_i`, added in the kernel) or per row and group (grouped, made by the
wrapper), subtracted exactly. int8 weights have one field: the byte's sign-extended value is the code.

Vector operations per weight, one input row (a VPU op processes one vreg of 8 x 128 32-bit words; v5e has no
int8 ALU, so bytes are widened first; a row more adds one multiply and one add per weight):

======================  ===========================================================  =============
form                    per byte-vreg of 1024 packed bytes                            ops / weight
======================  ===========================================================  =============
int8 (1 field)          widen 1, multiply 1, add 1                                    3.0
ternary 2-bit (4)       widen 1, mask 1, shift 3, multiply 4, add 4                   3.25
int4 grouped (2)        widen 1, mask 1, shift 1, multiply 2, add 2; per group of 32  3.5 + ~2.7
                        x 128: float32 sublane sum, scale, in-order add (~11 ops)
int2 grouped (4)        as ternary; per group of 32 x 128 as int4                      3.25 + ~2.7
======================  ===========================================================  =============

Other formulations weighed: masking each field (``(u >> bs) & 3``) costs one op more per weight than the
telescoped multipliers; reading a 32-bit word as 16 ternary codes saves the widening (0.25 op per weight) but
needs 15 shifts per 16 codes and products that wrap modulo :math:`2^{32}` (:math:`c \cdot u` with
:math:`u < 2^{32}`); selecting :math:`\pm x` by code needs a compare or a mask per weight as well; widening
to unsigned bytes compiles to the signed widening and a mask. A table per packed row (the 16 sums of a
nibble's two fields, gathered along lanes: 6 vector ops and 2 gathers per 1024 bytes) moves the work to the
cross-lane units, whose lane gathers the v5e compiler schedules at about 3.5 cycles each: slower than the
multiplies. Scalar multipliers from SMEM would need a vreg of one contraction index (one packed row x 1024
columns), which the resident ``(k / per, n)`` layout does not give without a copy. Making the weights the
streaming operand of the MXU (the transposed product) meets the same 128 values a cycle per MXU.

The v5e compiler's schedule (compiled deviceless for a v5e, ``benchmarks/lm_kernels_static.py``) issues four
vector ALU ops a cycle and keeps the inner loops ALU-bound: 32 packed rows x 2816 columns of ternary bytes
(360,448 weights) in 294 cycles, of int8 bytes (90,112 weights) in 77. At 1e9 weights (the 1B model) that is
about 0.55 ms of vector work for ternary and int8 alike, against 0.31 ms (ternary) and 1.26 ms (int8) of HBM
reading at 819 GB/s; the grouped forms add their group sums (about 2.7 ops a weight more). The same schedule
does not bear the premise out: it estimates the MXU kernels below the vector unit's for every form (ternary,
with its bytes unpacked four at a time in 32-bit words, at about 0.6 ms of kernels a step against 1.1 ms),
and its estimate for ternary bytes unpacked one by one (1.7 ms of layers a step, the attention besides) is
close to the step measured on a v5e with that unpacking (2.0 ms, ``docs/results/lm_decode_device.json``). The
vector unit stays a second product to measure, not the default: ``benchmarks/lm_decode_device.sh`` measures
both in one process.

Exactness. Every product and sum is int32: :math:`|c_s| \le 128 + 2^b \cdot 128`, :math:`y_s < 256`, and the
accumulated sums stay below :math:`2^{31}` for any contraction under :math:`2^{21}`. Grouped sums are added in
float32 after the sublane sum: a group's partial sums are integers below :math:`2^{24}` (groups of at most
8192), so their float32 sum is exact and equals the int32 group sum; the groups are then scaled and added in
order, as in the reference.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from stejax.lowbit._packing import arrange_input
from stejax.lowbit.kernels._skeleton import Blocks, default_blocks, first_step, last_step, zero_accumulator

__all__ = [
    "METHODS",
    "VPU_MOST_ROWS",
    "check_method",
    "field_sums",
    "grouped_vpu_sum",
    "vpu_blocks",
]

METHODS = ("mxu", "vpu")
VPU_MOST_ROWS = 8  # more rows: each adds a multiply and an add per weight; the MXU kernel takes them
_LANES = 128
_CHUNK = 32  # packed rows a step of the inner loop: one int8 tile
_MULTIPLIER_BYTES = 4 * 1024 * 1024  # the lane-broadcast multipliers of one block in VMEM
_BLOCK_BYTES = 2 * 1024 * 1024
_MOST_GROUP = 8192  # a group's partial sums below 2**24: exact in float32


def check_method(method: str, where: str) -> str:
    """``method`` if it is one of :data:`METHODS`.

    Raises:
      ValueError: a method other than ``"mxu"`` or ``"vpu"``.
    """
    if method not in METHODS:
        raise ValueError(f"{where}: method must be one of {METHODS}; got {method!r}.")
    return method


def vpu_blocks(rows_k: int, n: int, multipliers: int, *, multiple_k: int = 1) -> Blocks:
    """Blocks of the vector-unit product over ``(rows_k, n)`` packed bytes.

    ``block_n`` as :func:`default_blocks` (the widest, up to 4096: the lane broadcast of the multipliers is
    shared by more columns); ``block_k`` the largest multiple of 128 and of ``multiple_k`` dividing ``rows_k``
    whose bytes fit 2 MiB and whose ``multipliers`` lane-broadcast rows (int32, 512 bytes a packed row each)
    fit 4 MiB of VMEM, else the smallest such, else the whole ``rows_k``.
    """
    block_n = default_blocks(rows_k, n).block_n
    ks = [b for b in range(_LANES, rows_k + 1, _LANES) if rows_k % b == 0 and b % multiple_k == 0]
    if not ks:
        return Blocks(rows_k, block_n)
    fitting = [b for b in ks if b * block_n <= _BLOCK_BYTES and multipliers * b * 4 * _LANES <= _MULTIPLIER_BYTES]
    return Blocks(max(fitting) if fitting else min(ks), block_n)


def _telescoped(x: jax.Array, group: int, per: int, bits: int) -> jax.Array:
    """int32 ``(rows * per, rows_k)`` multipliers: row ``r * per + s`` holds :math:`c_s` of input row ``r``."""
    xs = arrange_input(x, group, per).astype(jnp.int32)  # (per, rows, rows_k)
    cs = [xs[0]] + [xs[s] - (xs[s - 1] << bits) for s in range(1, per)]
    rows, rows_k = x.shape[0], x.shape[1] // per
    return jnp.stack(cs, axis=1).reshape(rows * per, rows_k)


def _padded_multipliers(c: jax.Array, bk: int) -> tuple[jax.Array, int]:
    """Multipliers padded so that each block of ``bk`` packed rows is a multiple of 128 lanes (a whole block)."""
    if bk % _LANES == 0:
        return c, bk
    bkp = -(-bk // _LANES) * _LANES  # bk is the whole axis here: one block
    return jnp.pad(c, ((0, 0), (0, bkp - c.shape[1]))), bkp


def _broadcast_lanes(multipliers: Any, m_ref: Any) -> None:
    """``m_ref[q, j, :] = multipliers[q][0, j]``: each multiplier along the 128 lanes (sublane broadcast, transpose).

    ``multipliers``: a ref ``(q, bkp)`` or a list of ``(1, bkp)`` values, ``bkp`` a multiple of 128.
    """
    for q in range(len(multipliers) if isinstance(multipliers, list) else multipliers.shape[0]):
        for a in range(m_ref.shape[1] // _LANES):
            lanes = slice(a * _LANES, (a + 1) * _LANES)
            row = multipliers[q][:, lanes] if isinstance(multipliers, list) else multipliers[q : q + 1, lanes]
            m_ref[q, lanes, :] = jnp.broadcast_to(row, (_LANES, _LANES)).T


def _columns(bn: int) -> list[tuple[int, int]]:
    return [(c0, min(_LANES, bn - c0)) for c0 in range(0, bn, _LANES)]


def _aligned(t: Any, size: int) -> Any:
    """``t * size``: static where ``t`` is, else a traced multiple of ``size`` (an aligned dynamic offset)."""
    return t * size if isinstance(t, int) else pl.multiple_of(t * size, size)


def _loop(steps: int, step: Any) -> None:
    """``step(t, None)`` for ``t < steps``: a loop in the kernel, or one call with static offsets."""
    if steps == 1:
        step(0, None)
    else:
        jax.lax.fori_loop(0, steps, step, None)


def _fields(block: jax.Array, per: int, bits: int) -> list[jax.Array]:
    """int8 bytes -> the telescoped fields: the signed byte (one field), else ``u >> bits * s`` of ``u`` = 0..255."""
    words = block.astype(jnp.int32)
    if per == 1:
        return [words]
    u = words & 255
    return [u] + [u >> (bits * s) for s in range(1, per)]


def _fields_body(
    x_ref: Any,
    w_ref: Any,
    out_ref: Any,
    m_ref: Any,
    acc_ref: Any,
    *,
    rows: int,
    per: int,
    bits: int,
    chunk: int,
    offset: int,
) -> None:
    # x (per, rows, bkp) int8: the input codes of each field's packed rows; w (bk, bn) packed int8; out (rows,
    # bn) int32; m (rows * per, bkp, 128) int32: the multipliers along the lanes; acc (rows, 8, bn) int32.
    zero_accumulator(acc_ref)

    xs = x_ref[...].astype(jnp.int32)
    multipliers = []
    for r in range(rows):
        for s in range(per):
            here = xs[s, r : r + 1, :]
            multipliers.append(here if s == 0 else here - (xs[s - 1, r : r + 1, :] << bits))
    _broadcast_lanes(multipliers, m_ref)
    bk, bn = w_ref.shape
    if offset:  # each field holds code + offset: minus offset x the block's inputs, once per row
        for r in range(rows):
            total = jnp.zeros((1, 1), jnp.int32)
            for s in range(per):
                for a in range(0, xs.shape[2], _LANES):  # float32 sums of 128 codes: exact
                    lanes = xs[s, r : r + 1, a : a + _LANES].astype(jnp.float32)
                    total = total + jnp.sum(lanes, axis=1, keepdims=True).astype(jnp.int32)
            acc_ref[r, 0:1, :] += jnp.broadcast_to(-offset * total, (1, bn))

    def step(t: Any, carry: Any) -> Any:
        r0 = _aligned(t, chunk)
        mult = [m_ref[q, pl.ds(r0, chunk), :] for q in range(rows * per)]  # (chunk, 128) each
        for c0, width in _columns(bn):
            ys = _fields(w_ref[pl.ds(r0, chunk), c0 : c0 + width], per, bits)  # (chunk, width) each
            for r in range(rows):
                part = None
                for s in range(per):
                    term = ys[s] * mult[r * per + s][:, :width]
                    part = term if part is None else part + term
                assert part is not None
                folded = part[0:8]
                for u in range(8, chunk, 8):  # the chunk's sublane tiles onto one: 8 packed rows a sublane
                    folded = folded + part[u : u + 8]
                acc_ref[r, :, c0 : c0 + width] += folded
        return carry

    _loop(bk // chunk, step)

    @pl.when(last_step())
    def _() -> None:
        for r in range(rows):
            out_ref[r : r + 1, :] = jnp.sum(acc_ref[r], axis=0, keepdims=True)  # the 8 sublanes: exact int32


def field_sums(
    x: jax.Array,
    packed: jax.Array,
    *,
    per: int,
    bits: int,
    offset: int,
    blocks: Blocks | None,
    interpret: bool,
    where: str,
) -> jax.Array:
    r"""int32 ``(rows, n)``: :math:`\sum_j \sum_s x_{r, s R + j} (f_s(j, o) - \text{offset})`, packed bytes ``(R, n)``.

    ``R = k / per`` packed rows; ``f_s`` is the unsigned field ``s`` of each byte (``per`` > 1), or the signed
    byte (``per == 1``, ``offset`` 0). ``x``: int8 ``(rows, k)``, at most :data:`VPU_MOST_ROWS` rows. The
    multipliers, their lane broadcast and the offset's share are made in the kernel from the input codes.

    Raises:
      ValueError: more rows than :data:`VPU_MOST_ROWS`, packed rows not a multiple of 8, or blocks that do
        not tile the packed bytes.
    """
    rows, k = x.shape
    rows_k, n = packed.shape
    if rows > VPU_MOST_ROWS:
        raise ValueError(f"{where}: method='vpu' takes at most {VPU_MOST_ROWS} rows; got {rows}.")
    if rows_k % 8:
        raise ValueError(f"{where}: method='vpu' needs packed rows a multiple of 8; got {rows_k}.")
    q = rows * per
    blocks = vpu_blocks(rows_k, n, q) if blocks is None else blocks
    blocks.check(rows_k, n, where=where)
    bk, bn = blocks.block_k, blocks.block_n
    chunk = _CHUNK if bk % _CHUNK == 0 else bk
    xs = arrange_input(x, k, per)  # (per, rows, rows_k)
    bkp = bk if bk % _LANES == 0 else -(-bk // _LANES) * _LANES  # bk is the whole axis here: one block
    xs = jnp.pad(xs, ((0, 0), (0, 0), (0, bkp * (rows_k // bk) - rows_k)))
    return pl.pallas_call(
        functools.partial(_fields_body, rows=rows, per=per, bits=bits, chunk=chunk, offset=offset),
        grid=(n // bn, rows_k // bk),
        in_specs=[
            pl.BlockSpec((per, rows, bkp), lambda j, i: (0, 0, i)),
            pl.BlockSpec((bk, bn), lambda j, i: (i, j)),
        ],
        out_specs=pl.BlockSpec((rows, bn), lambda j, i: (0, j)),
        out_shape=jax.ShapeDtypeStruct((rows, n), jnp.int32),
        scratch_shapes=[pltpu.VMEM((q, bkp, _LANES), jnp.int32), pltpu.VMEM((rows, 8, bn), jnp.int32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary"),
            vmem_limit_bytes=_vmem(
                per * 32 * bkp, bk * bn, 4 * 8 * bn, scratch=4 * q * bkp * _LANES + 4 * rows * 8 * bn
            ),
        ),
        cost_estimate=pl.CostEstimate(
            flops=2 * rows * k * n, transcendentals=0, bytes_accessed=rows_k * n + rows * k + 4 * rows * n
        ),
        interpret=interpret,
    )(xs, packed)


def _vmem(*blocks: int, scratch: int) -> int:
    """Blocks double-buffered, the scratch once, and as much again for the widened temporaries."""
    return int(min(max(4 * sum(blocks) + 2 * scratch, 16 * 1024 * 1024), 100 * 1024 * 1024))


def _grouped_body(
    c_ref: Any,
    corr_ref: Any,
    w_ref: Any,
    s_ref: Any,
    out_ref: Any,
    m_ref: Any,
    *,
    rows: int,
    per: int,
    bits: int,
    per_group: int,
    tile_groups: int,
) -> None:
    # c (rows * per, bkp) int32; corr (rows, in_block, 128) float32: each group's offset term; w (bk, bn) packed
    # int8; s (in_block, bn) float32; out (rows, 1, bn) float32, resident over the contraction; m as above.
    @pl.when(first_step())
    def _() -> None:
        out_ref[...] = jnp.zeros_like(out_ref)

    _broadcast_lanes(c_ref, m_ref)
    bk, bn = w_ref.shape
    tile_rows = tile_groups * per_group  # packed rows of a step: `tile_groups` whole groups
    chunk = _CHUNK if tile_rows % _CHUNK == 0 else tile_rows  # rows widened at once: whole groups

    def step(t: Any, carry: Any) -> Any:
        base = _aligned(t, tile_rows)
        g0 = _aligned(t, tile_groups)
        corr = [corr_ref[r, pl.ds(g0, tile_groups), :] for r in range(rows)]  # (tile_groups, 128) each
        for a in range(0, tile_rows, chunk):
            mult = [m_ref[q, pl.ds(base + a, chunk), :] for q in range(rows * per)]
            for c0, width in _columns(bn):
                ys = _fields(w_ref[pl.ds(base + a, chunk), c0 : c0 + width], per, bits)
                scales = s_ref[pl.ds(g0, tile_groups), c0 : c0 + width]  # (tile_groups, width)
                for r in range(rows):
                    total = out_ref[r, :, c0 : c0 + width]  # (1, width) float32
                    for h in range(0, chunk, per_group):  # each group of the chunk, in order
                        g = (a + h) // per_group
                        part = None
                        for s in range(per):
                            term = ys[s][h : h + per_group] * mult[r * per + s][h : h + per_group, :width]
                            part = term if part is None else part + term
                        assert part is not None
                        folded = part[0:8]
                        for u in range(8, per_group, 8):
                            folded = folded + part[u : u + 8]
                        # Integers below 2**24: the float32 sublane sum is the exact group sum.
                        exact = jnp.sum(folded.astype(jnp.float32), axis=0, keepdims=True)
                        exact = exact + corr[r][g : g + 1, :width]
                        total = total + exact * scales[g : g + 1, :]
                    out_ref[r, :, c0 : c0 + width] = total
        return carry

    _loop(bk // tile_rows, step)


def grouped_vpu_sum(
    x: jax.Array,
    packed: jax.Array,
    scale: jax.Array,
    *,
    group: int,
    bits: int,
    blocks: Blocks | None,
    interpret: bool,
    where: str,
) -> jax.Array:
    r"""float32 ``(rows, n)``: :math:`\sum_g s_g \sum_{i \in g} x_i c_i`, groups in order, on the vector unit.

    ``x`` int8 ``(rows, k)`` (at most :data:`VPU_MOST_ROWS` rows), ``packed`` int8 ``(k / per, n)`` as
    :func:`stejax.lowbit.pack_groups` lays groups out, ``scale`` float32 ``(k / group, n)``.

    Raises:
      ValueError: more rows than :data:`VPU_MOST_ROWS`, a group whose packed rows are not 8, 16 or 32, a
        group over 8192, or blocks that do not tile the packed bytes in tiles of 8 groups.
    """
    rows, k = x.shape
    rows_k, n = packed.shape
    per = 8 // bits
    per_group = group // per
    groups = k // group
    if rows > VPU_MOST_ROWS:
        raise ValueError(f"{where}: method='vpu' takes at most {VPU_MOST_ROWS} rows; got {rows}.")
    if per_group not in (8, 16, 32) or group > _MOST_GROUP:
        raise ValueError(
            f"{where}: method='vpu' needs a group of 8, 16 or 32 packed rows (at most {_MOST_GROUP} codes); "
            f"got {per_group} packed rows ({group} codes)."
        )
    q = rows * per
    tile = 8 * per_group if groups % 8 == 0 else rows_k  # 8 groups a step (the scales' sublane tile) or all
    blocks = vpu_blocks(rows_k, n, q, multiple_k=tile) if blocks is None else blocks
    blocks.check(rows_k, n, where=where, multiple_k=tile)
    bk, bn = blocks.block_k, blocks.block_n
    in_block = bk // per_group
    tile_groups = tile // per_group
    c, bkp = _padded_multipliers(_telescoped(x, group, per, bits), bk)
    offset = 1 << (bits - 1)
    sums = x.astype(jnp.int32).reshape(rows, groups, group).sum(axis=-1)  # exact
    corr = jnp.broadcast_to((-offset * sums).astype(jnp.float32)[:, :, None], (rows, groups, _LANES))
    out = pl.pallas_call(
        functools.partial(_grouped_body, rows=rows, per=per, bits=bits, per_group=per_group, tile_groups=tile_groups),
        grid=(n // bn, rows_k // bk),
        in_specs=[
            pl.BlockSpec((q, bkp), lambda j, i: (0, i)),
            pl.BlockSpec((rows, in_block, _LANES), lambda j, i: (0, i, 0)),
            pl.BlockSpec((bk, bn), lambda j, i: (i, j)),
            pl.BlockSpec((in_block, bn), lambda j, i: (i, j)),
        ],
        out_specs=pl.BlockSpec((rows, 1, bn), lambda j, i: (0, 0, j)),
        out_shape=jax.ShapeDtypeStruct((rows, 1, n), jnp.float32),
        scratch_shapes=[pltpu.VMEM((q, bkp, _LANES), jnp.int32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary"),
            vmem_limit_bytes=_vmem(
                4 * q * bkp,
                4 * rows * in_block * _LANES,
                bk * bn,
                4 * in_block * bn,
                4 * rows * 8 * bn,
                scratch=4 * q * bkp * _LANES,
            ),
        ),
        cost_estimate=pl.CostEstimate(
            flops=2 * rows * k * n,
            transcendentals=0,
            bytes_accessed=rows_k * n + 4 * groups * n + 4 * q * rows_k + 512 * rows * groups + 4 * rows * n,
        ),
        interpret=interpret,
    )(c, corr, packed, scale.astype(jnp.float32))
    return out[:, 0, :]
