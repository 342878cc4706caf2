"""Integer codes packed into bytes, and unpacked again under jit.

The containers, by the quantiser's bit width:

==========  ===================  ===========================================================
bits        container            layout
==========  ===================  ===========================================================
1 (sign)    ``bin1x8``           8 codes per byte; bit ``j`` of byte ``k`` is code ``8k + j``:
                                 1 for +1, 0 for -1 (``np.packbits(..., bitorder="little")``)
2           ``int2x4``           4 two's-complement 2-bit fields per byte, code ``4k + j`` in
                                 bits ``2j .. 2j+1``
3, 4        ``int4x2``           2 two's-complement nibbles per byte, code ``2k`` in the low one
5 .. 8      ``int8``             one int8 per code, in the weight's own shape
9 .. 16     ``int16``            one int16 per code, in the weight's own shape
==========  ===================  ===========================================================

Packed containers hold the codes of the weight flattened in row-major order, the
last byte padded with zero fields; they are 1-D ``uint8`` arrays of
``ceil(n * field_bits / 8)`` bytes.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["CONTAINERS", "container_for", "pack_codes", "packed_shape", "unpack_codes"]

# container name -> (field bits, storage dtype, packed)
CONTAINERS: dict[str, tuple[int, np.dtype, bool]] = {
    "bin1x8": (1, np.dtype(np.uint8), True),
    "int2x4": (2, np.dtype(np.uint8), True),
    "int4x2": (4, np.dtype(np.uint8), True),
    "int8": (8, np.dtype(np.int8), False),
    "int16": (16, np.dtype(np.int16), False),
}


def container_for(bits: int, *, binary: bool) -> str:
    """The container of a ``bits``-bit signed code (``binary``: the two codes are -1 and +1)."""
    if binary:
        return "bin1x8"
    if bits <= 2:
        return "int2x4"
    if bits <= 4:
        return "int4x2"
    if bits <= 8:
        return "int8"
    if bits <= 16:
        return "int16"
    raise ValueError(f"container_for: codes of {bits} bits do not fit a container; the widest is 16 bits.")


def packed_shape(container: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The stored array's shape for codes of ``shape`` in ``container``."""
    field, _, packed = CONTAINERS[container]
    if not packed:
        return tuple(shape)
    return (math.ceil(math.prod(shape) * field / 8),)


def pack_codes(codes: np.ndarray, container: str) -> np.ndarray:
    """Pack integer codes (NumPy) into ``container``; checks every code fits.

    Raises:
      ValueError: a code outside the container's range (the message gives the
        first one and its flat index).

    Example:
      >>> import numpy as np
      >>> pack_codes(np.array([-8, 7, 1]), "int4x2").tolist()  # 0x78, then 0x01 and a zero nibble
      [120, 1]
      >>> pack_codes(np.array([1, -1, -1, 1, 1, 1, 1, 1, -1]), "bin1x8").tolist()
      [249, 0]
    """
    field, dtype, packed = CONTAINERS[container]
    codes = np.asarray(codes)
    flat = codes.reshape(-1).astype(np.int64)
    if container == "bin1x8":
        bad = (flat != 1) & (flat != -1)
        lo, hi = -1, 1
    else:
        lo, hi = -(2 ** (field - 1)), 2 ** (field - 1) - 1
        bad = (flat < lo) | (flat > hi)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        allowed = "-1 or +1" if container == "bin1x8" else f"in [{lo}, {hi}]"
        raise ValueError(f"pack_codes: {container} holds codes {allowed}; got {flat[i]} at flat index {i}.")
    if not packed:
        return codes.astype(dtype)
    if container == "bin1x8":
        return np.packbits(flat > 0, bitorder="little")
    per = 8 // field
    fields = flat & ((1 << field) - 1)
    fields = np.concatenate([fields, np.zeros((-len(fields)) % per, np.int64)]).reshape(-1, per)
    shifts = np.arange(per, dtype=np.int64) * field
    return (fields << shifts).sum(axis=1).astype(np.uint8)


def unpack_codes(stored: jax.Array, container: str, shape: tuple[int, ...]) -> jax.Array:
    """The int8 (int16 for ``int16``) codes of ``shape`` from a stored container; pure, jittable.

    Example:
      >>> import jax.numpy as jnp
      >>> unpack_codes(jnp.array([120, 1], jnp.uint8), "int4x2", (3,)).tolist()
      [-8, 7, 1]
    """
    field, _, packed = CONTAINERS[container]
    if not packed:
        return jnp.reshape(stored, shape)
    n = math.prod(shape)
    per = 8 // field
    shifts = jnp.arange(per, dtype=jnp.uint8)[None, :] * jnp.uint8(field)
    fields = (stored[:, None] >> shifts) & jnp.uint8((1 << field) - 1)
    fields = jnp.reshape(fields, (-1,))[:n].astype(jnp.int8)
    if container == "bin1x8":
        codes = fields * jnp.int8(2) - jnp.int8(1)
    else:
        # Sign extension: flipping the field's top bit and subtracting it maps
        # 0 .. 2^(f-1)-1 to itself and 2^(f-1) .. 2^f-1 to -2^(f-1) .. -1.
        top = jnp.int8(1 << (field - 1))
        codes = (fields ^ top) - top
    return jnp.reshape(codes, shape)
