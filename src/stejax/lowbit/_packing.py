r"""Integer codes in bytes: every stored and resident layout of stejax's low-bit weights, packed and unpacked.

Three layouts, each with its one packer and its readers:

**Two's-complement containers** (the integer export of a QAT run, its ONNX graphs; :func:`pack_codes`,
:func:`unpack_codes`, which is pure and jittable):

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

**Offset containers** (a language model's artifact, which its loaders and the GGUF export read; :func:`pack`,
:func:`unpack`, byte arithmetic on the host). Codes are flattened in C order and packed little-end first:

* ``int8``: one signed byte per code in [-128, 127].
* ``int4``: codes in [-8, 7], stored as :math:`c + 8`; byte :math:`j` holds code
  :math:`2j` in its low nibble and :math:`2j+1` in its high nibble.
* ``int2``: codes in [-2, 1], stored as :math:`c + 2`; byte :math:`j` holds codes
  :math:`4j .. 4j+3` in bits 0-1, 2-3, 4-5, 6-7.
* ``trit5``: ternary codes in {-1, 0, 1}, stored as trits :math:`t = c + 1`;
  byte :math:`j` is :math:`\sum_{i=0}^{4} t_{5j+i}\,3^i \in [0, 242]`, so five
  weights take one byte (1.6 bits per weight; :math:`3^5 = 243 \le 256`).
  Bytes 243-255 are never written and are refused on unpacking.

The last byte is padded with the code 0.

**Groups of resident weights** (:class:`stejax.lowbit.nnx.LowBitLinear` and the Pallas kernels;
:func:`pack_groups`, and :func:`unpack_slices` inside a step): a kernel ``(in, out)`` of 2- or 4-bit codes
stays two-dimensional, group by group along the contraction axis, so that unpacking one bit field of a block
of bytes gives a contiguous block of rows.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "CONTAINERS",
    "OFFSET_CONTAINERS",
    "arrange_input",
    "container_for",
    "offset_container_for",
    "pack",
    "pack_codes",
    "pack_groups",
    "packed_bytes",
    "packed_shape",
    "unpack",
    "unpack_codes",
    "unpack_slices",
]

# --- two's-complement containers ------------------------------------------------------------------------------

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


# --- offset containers ------------------------------------------------------------------------------------
# container: (codes per byte, least code, greatest code)
OFFSET_CONTAINERS = {"int8": (1, -128, 127), "int4": (2, -8, 7), "int2": (4, -2, 1), "trit5": (5, -1, 1)}


def offset_container_for(bits: float) -> str:
    """The offset container of a bit width: 8 -> int8, 4 -> int4, 2 -> int2, 1.58 -> trit5."""
    table = {8: "int8", 4: "int4", 2: "int2", 1.58: "trit5"}
    if bits not in table:
        raise ValueError(
            f"offset_container_for: no packed container for {bits!r} bits; expected one of {sorted(table)}."
        )
    return table[bits]


def packed_bytes(container: str, n: int) -> int:
    """Bytes that ``n`` codes take in ``container``."""
    return math.ceil(n / OFFSET_CONTAINERS[container][0])


def pack(codes: np.ndarray, container: str) -> np.ndarray:
    """Pack integer ``codes`` (any shape) into a 1-D ``uint8`` array (``int8`` for the int8 container).

    Raises:
      ValueError: an unknown container, or a code outside its range (the message gives the first).

    Example:
      >>> pack(np.array([-1, 0, 1, 1, -1]), "trit5")
      array([75], dtype=uint8)
    """
    if container not in OFFSET_CONTAINERS:
        raise ValueError(f"pack: unknown container {container!r}; expected one of {sorted(OFFSET_CONTAINERS)}.")
    per, low, high = OFFSET_CONTAINERS[container]
    flat = np.asarray(codes).reshape(-1)
    if flat.size and (flat.min() < low or flat.max() > high):
        bad = flat[(flat < low) | (flat > high)][0]
        raise ValueError(f"pack: code {bad} lies outside {container}'s range [{low}, {high}].")
    if container == "int8":
        return flat.astype(np.int8)
    digits = np.zeros(packed_bytes(container, flat.size) * per, np.int64)
    digits[: flat.size] = flat.astype(np.int64) - low
    groups = digits.reshape(-1, per)
    base = 3 if container == "trit5" else 1 << (8 // per)
    weights = base ** np.arange(per, dtype=np.int64)
    return (groups * weights).sum(axis=1).astype(np.uint8)


def unpack(stored: np.ndarray, container: str, n: int, *, context: str = "unpack") -> np.ndarray:
    """The first ``n`` codes (``int8``) of ``stored``, the inverse of :func:`pack`.

    ``stored`` holds bytes (``uint8`` or ``int8``; a wider integer array of byte values is read as bytes).
    Byte arithmetic only, so the temporaries are a few bytes a code: this is the one reading of the stored
    forms, used by every loader, including the one that streams an artifact tensor by tensor. For the ``int8``
    container the codes are a view of ``stored``'s bytes, not a copy.

    Args:
      stored: the packed bytes, any shape (read flattened in C order).
      container: one of :data:`OFFSET_CONTAINERS`.
      n: how many codes ``stored`` holds; the padding after them is dropped.
      context: the start of an error message, naming who reads the bytes and where (a loader passes its own
        name, the file and the tensor).

    Raises:
      ValueError: an unknown container, stored values that are not bytes, a byte count that does not hold
        ``n`` codes, or (trit5) a byte above 242; the message starts with ``context``.

    Example:
      >>> unpack(np.array([75], np.uint8), "trit5", 5)
      array([-1,  0,  1,  1, -1], dtype=int8)
    """
    if container not in OFFSET_CONTAINERS:
        raise ValueError(f"{context}: unknown container {container!r}; expected one of {sorted(OFFSET_CONTAINERS)}.")
    per, low, _ = OFFSET_CONTAINERS[container]
    raw = _bytes(np.asarray(stored), context)
    need = packed_bytes(container, n)
    if raw.size != need:
        raise ValueError(f"{context}: {raw.size} bytes; expected {need} for {n} {container} codes ({per} a byte).")
    if container == "int8":
        return raw.view(np.int8)
    out = np.empty((raw.size, per), np.int8)
    if container == "trit5":
        if raw.size and int(raw.max()) > 242:
            at = int(np.argmax(raw > 242))
            raise ValueError(
                f"{context}: byte {int(raw[at])} is not five trits (at offset {at} of {raw.size}); "
                "expected at most 3**5 - 1 = 242."
            )
        rest = raw.copy()
        for i in range(per):
            out[:, i] = rest % np.uint8(3)
            rest //= np.uint8(3)
    else:
        bits = 8 // per
        for i in range(per):
            out[:, i] = (raw >> np.uint8(bits * i)) & np.uint8((1 << bits) - 1)
    codes = out.reshape(-1)[:n]
    codes += np.int8(low)
    return codes


def _bytes(stored: np.ndarray, context: str) -> np.ndarray:
    """``stored`` flattened as ``uint8``: a view of a byte array, a checked cast of a wider integer one."""
    if stored.dtype.kind not in "iu":
        raise ValueError(f"{context}: stored codes of dtype {stored.dtype}; expected bytes (uint8 or int8).")
    flat = np.ascontiguousarray(stored).reshape(-1)
    if flat.dtype.itemsize == 1:
        return flat.view(np.uint8)
    if flat.size and (int(flat.min()) < -128 or int(flat.max()) > 255):
        bad = flat[(flat < -128) | (flat > 255)][0]
        raise ValueError(f"{context}: stored value {bad} is not a byte; expected values in [-128, 255].")
    return flat.astype(np.uint8)


# --- groups of resident weights -------------------------------------------------------------------------------


def pack_groups(codes: np.ndarray, group: int, bits: int) -> np.ndarray:
    """Codes ``(in, out)`` -> ``int8 (in // group, group // per, out)``, ``per = 8 // bits`` codes a byte.

    Byte ``j`` of group ``g`` holds rows ``g * group + k * (group // per) + j`` for
    ``k = 0 .. per-1``, each as ``code + 2**(bits-1)`` in bits ``k*bits .. k*bits+bits-1``:
    unpacking slice ``k`` gives a contiguous block of rows. The bytes are stored as int8 (the same bits): the
    TPU's vector unit and MXU take signed integers.
    """
    n_in, n_out = codes.shape
    per = 8 // bits
    if n_in % group or group % per:
        raise ValueError(f"lowbit: {bits}-bit groups of {group} do not tile a kernel of shape {codes.shape}.")
    offset = 1 << (bits - 1)
    # Byte arithmetic (no wider temporaries): each field is code + offset in [0, 2**bits).
    blocks = (np.asarray(codes, np.int8).view(np.uint8) + np.uint8(offset)).reshape(
        n_in // group, per, group // per, n_out
    )
    packed = blocks[:, 0].copy()
    for k in range(1, per):
        packed |= blocks[:, k] << np.uint8(bits * k)
    return packed.view(np.int8)


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
    (:func:`pack_groups`); entry ``[s, r, g * (group // per) + j]`` is that row's input.
    """
    rows, k = x.shape
    return x.reshape(rows, k // group, per, group // per).transpose(2, 0, 1, 3).reshape(per, rows, k // per)
