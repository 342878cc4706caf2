r"""What the low-bit product kernels share: their block sizes, the rule those obey, and the kernel-or-XLA choice.

The kernels (:mod:`stejax.lm._kernel_int8`, :mod:`stejax.lm._kernel_ternary`,
:mod:`stejax.lm._kernel_int4`) multiply a few rows of int8 input codes by a
weight matrix kept in HBM as integer codes, packed ``per`` to a byte. They tile
the weights in blocks of ``block_k`` packed rows by ``block_n`` columns; the
rows of the input are one block (decoding multiplies few rows). The grid walks
the output columns ("parallel") and, last, the contraction ("arbitrary").

The TPU rule for a block: its last two dimensions are multiples of 8 and 128,
or equal the whole array's. The weight block is ``(block_k, block_n)`` and the
input block's last dimension is ``block_k``, so both must be multiples of 128
or the whole dimension. :class:`Blocks` checks it and says which value broke it.

Decoding sits far below the ridge of the MXU: its floor is the weights' bytes
over the HBM bandwidth, so blocks are chosen large (fewer grid steps, each of
about 0.35 µs fixed cost) within a VMEM budget.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

__all__ = [
    "IMPLEMENTATIONS",
    "VERIFIED_ON",
    "Blocks",
    "arrange_input",
    "default_blocks",
    "int8_dot",
    "kernel_backend",
    "unpack_slices",
    "vmem_limit",
]

IMPLEMENTATIONS = (None, "xla", "pallas")


def int8_dot(x: jax.Array, w: jax.Array) -> jax.Array:
    """``x`` int8 ``(m, k)`` times ``w`` int8 ``(k, n)`` inside a kernel: int32 ``(m, n)``, on the MXU.

    The precision is stated, not inherited: under ``jax.default_matmul_precision("highest")`` a bare
    ``jnp.dot`` asks Mosaic for a float32 contraction, which it refuses for int8 operands ("Bad lhs type").
    Integer products are exact at any precision.
    """
    return jax.lax.dot_general(
        x, w, (((1,), (0,)), ((), ())), precision=jax.lax.Precision.DEFAULT, preferred_element_type=jnp.int32
    )


_LANES = 128
# A weight block of at most this many bytes (packed): about 2.5 µs of HBM reading on a v5e, against about
# 0.35 µs of fixed cost per grid step.
_BLOCK_BYTES = 2 * 1024 * 1024
_WIDEST_N = 4096


@dataclasses.dataclass(frozen=True)
class Blocks:
    """Block sizes of a low-bit product kernel: ``block_k`` packed weight rows by ``block_n`` columns.

    Raises:
      ValueError: a block that is not a positive int.
    """

    block_k: int
    block_n: int

    def __post_init__(self) -> None:
        for name in ("block_k", "block_n"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Blocks: {name} must be an int >= 1; got {value!r}.")

    def check(self, rows_k: int, n: int, *, where: str, multiple_k: int = 1) -> None:
        """Refuse blocks that do not tile ``(rows_k, n)`` packed weights by the TPU rule.

        ``multiple_k``: ``block_k`` must also be a multiple of it (a group's packed rows).

        Raises:
          ValueError: naming the value, the block and the rule broken.
        """
        for name, block, dim, extent in (
            ("block_k", self.block_k, "packed rows", rows_k),
            ("block_n", self.block_n, "n", n),
        ):
            if extent % block:
                raise ValueError(f"{where}: {name}={block} must divide {dim}={extent}.")
            if block != extent and block % _LANES:
                raise ValueError(
                    f"{where}: {name}={block} must be a multiple of {_LANES} or equal {dim}={extent} "
                    "(a TPU block's last two dimensions are multiples of 8 and 128, or whole)."
                )
        if self.block_k % multiple_k:
            raise ValueError(
                f"{where}: block_k={self.block_k} must be a multiple of {multiple_k} (the packed rows of one group)."
            )


def _divisors_by_lanes(extent: int) -> list[int]:
    return [b for b in range(_LANES, extent + 1, _LANES) if extent % b == 0]


def default_blocks(rows_k: int, n: int, *, multiple_k: int = 1, fewest_k: bool = False) -> Blocks:
    """The default blocks for ``(rows_k, n)`` packed weights (int8 bytes).

    ``block_n``: the widest multiple of 128 dividing ``n`` up to 4096 (else the whole ``n``);
    ``block_k``: the largest multiple of 128 (and of ``multiple_k``) dividing ``rows_k`` whose block holds at
    most 2 MiB (else the whole ``rows_k``); with ``fewest_k``, the smallest such multiple (grouped products
    multiply one row per group in the block, so fewer groups a block keep the MXU's rows few).
    """
    ns = [b for b in _divisors_by_lanes(n) if b <= _WIDEST_N]
    block_n = max(ns) if ns else n
    ks = [b for b in _divisors_by_lanes(rows_k) if b % multiple_k == 0]
    if not ks:
        return Blocks(rows_k, block_n)
    if fewest_k:
        return Blocks(min(ks), block_n)
    fitting = [b for b in ks if b * block_n <= _BLOCK_BYTES]
    return Blocks(max(fitting) if fitting else min(ks), block_n)


# TPU generations on which the kernels have been compiled and have matched their references (the device run of
# tests/test_lm_kernels.py with compiled kernels). The automatic choice uses a kernel only there; until a chip has
# run them, None means XLA everywhere and ``implementation="pallas"`` asks for the kernels explicitly.
VERIFIED_ON: tuple[str, ...] = ()


def kernel_backend() -> bool:
    """Whether the default backend is a TPU whose MXU multiplies int8 by int8 (v5 and v6; not v4 or TPU7x) and
    on which the kernels have matched their references (:data:`VERIFIED_ON`)."""
    if jax.default_backend() != "tpu":
        return False
    kind = jax.devices()[0].device_kind.lower()
    return any(tag in kind for tag in ("v5", "v6")) and any(tag in kind for tag in VERIFIED_ON)


def vmem_limit(*buffers: int) -> int:
    """A VMEM limit for blocks of these bytes: each twice (double buffering), twice again for temporaries."""
    return int(min(max(4 * sum(buffers), 16 * 1024 * 1024), 100 * 1024 * 1024))


def unpack_slices(packed: jax.Array, bits: int) -> list[jax.Array]:
    """The ``8 // bits`` code slices of packed bytes (int8, any shape): slice ``k`` is bits ``k*bits ..``, int8.

    Shifts and masks in int32 (the TPU's vector unit works on 32-bit words); a field holds ``code + 2**(bits-1)``.
    The kernels and the references unpack with this one function.
    """
    words = packed.astype(jnp.int32)
    mask, offset = (1 << bits) - 1, 1 << (bits - 1)
    return [(((words >> (bits * k)) & mask) - offset).astype(jnp.int8) for k in range(8 // bits)]


def arrange_input(x: jax.Array, group: int, per: int) -> jax.Array:
    """Input codes ``(rows, k)`` in the order of packed rows: ``(per, rows, k // per)``.

    Packed row ``g * (group // per) + j`` holds, in slice ``s``, the code of row ``g * group + s * (group // per) + j``
    (:func:`stejax.lm._lowbit.pack_groups`); entry ``[s, r, g * (group // per) + j]`` is that row's input.
    """
    rows, k = x.shape
    return x.reshape(rows, k // group, per, group // per).transpose(2, 0, 1, 3).reshape(per, rows, k // per)
