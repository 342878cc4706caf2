r"""What the low-bit product kernels share: the accumulator, block sizes and their rule, the kernel-or-XLA choice.

The kernels (:mod:`stejax.lowbit.kernels._int8`, :mod:`stejax.lowbit.kernels._ternary`,
:mod:`stejax.lowbit.kernels._grouped`) multiply a few rows of int8 input codes by a
weight matrix kept in HBM as integer codes, packed ``per`` to a byte. They tile
the weights in blocks of ``block_k`` packed rows by ``block_n`` columns; the
rows of the input are one block (decoding multiplies few rows). The grid walks
the output columns ("parallel") and, last, the contraction ("arbitrary").

The TPU rule for a block: its last two dimensions are multiples of 8 and 128,
or equal the whole array's. The weight block is ``(block_k, block_n)`` and the
input block's last dimension is ``block_k``, so both must be multiples of 128
or the whole dimension. :class:`Blocks` checks it and says which value broke it.

Each kernel keeps an int32 accumulator in VMEM for its block of output columns: :func:`zero_accumulator` at the
first step of the contraction, :func:`write_accumulator` (or a kernel's own epilogue under :func:`last_step`) at
the last. The packed codes are unpacked by :func:`stejax.lowbit._packing.unpack_slices`, the inverse of the one
packer :func:`stejax.lowbit.pack_groups`.

Decoding sits far below the ridge of the MXU: its floor is the weights' bytes
over the HBM bandwidth, so blocks are chosen large (fewer grid steps, each of
about 0.35 µs fixed cost) within a VMEM budget.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

__all__ = [
    "IMPLEMENTATIONS",
    "VERIFIED_ON",
    "Blocks",
    "default_blocks",
    "default_device_kind",
    "first_step",
    "int8_dot",
    "kernel_backend",
    "last_step",
    "verified",
    "vmem_limit",
    "write_accumulator",
    "zero_accumulator",
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


def first_step() -> jax.Array:
    """Inside a kernel: whether this is the first step of the contraction (the grid's last axis, "arbitrary")."""
    return pl.program_id(1) == 0


def last_step() -> jax.Array:
    """Inside a kernel: whether this is the last step of the contraction."""
    return pl.program_id(1) == pl.num_programs(1) - 1


def zero_accumulator(acc_ref: jax.Array) -> None:
    """Inside a kernel: zero the int32 accumulator at the first step of the contraction.

    The accumulator is scratch (VMEM), kept across the contraction's steps for one block of output columns.
    """

    @pl.when(first_step())
    def _() -> None:
        acc_ref[...] = jnp.zeros_like(acc_ref)


def write_accumulator(acc_ref: jax.Array, out_ref: jax.Array) -> None:
    """Inside a kernel: copy the accumulator to the output block at the last step of the contraction."""

    @pl.when(last_step())
    def _() -> None:
        out_ref[...] = acc_ref[...]


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


# The TPU generations on which ``implementation=None`` chooses the kernels, by ``device_kind`` (lower case), each
# with its evidence. A generation joins when both hold there: the device suite (``make test-device``,
# benchmarks/device_suite.py) has run the kernel tests compiled on the chip, every one passing, and the kernels
# decode faster than XLA's product (benchmarks/lm_decode_device.sh). Elsewhere, the CPU included, None is XLA.
VERIFIED_ON: dict[str, str] = {
    "tpu v5 lite": (
        "TPU v5e. docs/results/device_suite.json: the kernel tests (tests/test_lowbit_kernels.py, then named "
        "tests/test_lm_kernels.py) 102 of 102 passed, compiled on the chip. docs/results/lm_decode_device.json: "
        "the 1B model at batch 1 steps in 933 µs with 2-bit ternary kernels, 2,432 µs with int8 kernels and "
        "2,632 µs with grouped int4 kernels, against 2,956 µs for its bfloat16 form on XLA."
    ),
}


def verified(device_kind: str) -> bool:
    """Whether a device of this kind (``jax.Device.device_kind``) is one of :data:`VERIFIED_ON`."""
    return device_kind.strip().lower() in VERIFIED_ON


def default_device_kind() -> str | None:
    """The ``device_kind`` of the default backend's first device where that backend is a TPU, else None."""
    if jax.default_backend() != "tpu":
        return None
    return jax.devices()[0].device_kind


def kernel_backend() -> bool:
    """Whether the default backend's first device is a TPU of a generation in :data:`VERIFIED_ON`.

    Read in Python when a layer is traced: a static fact, never a branch of the compiled program.
    """
    kind = default_device_kind()
    return kind is not None and verified(kind)


def vmem_limit(*buffers: int) -> int:
    """A VMEM limit for blocks of these bytes: each twice (double buffering), twice again for temporaries."""
    return int(min(max(4 * sum(buffers), 16 * 1024 * 1024), 100 * 1024 * 1024))
