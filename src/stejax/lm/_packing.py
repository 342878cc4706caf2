r"""Packed integer codes: int8, int4 two per byte, int2 four per byte, ternary five trits per byte.

Codes are flattened in C order and packed little-end first:

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
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["CONTAINERS", "container_for", "pack", "packed_bytes", "unpack"]

# container: (codes per byte, least code, greatest code)
CONTAINERS = {"int8": (1, -128, 127), "int4": (2, -8, 7), "int2": (4, -2, 1), "trit5": (5, -1, 1)}


def container_for(bits: float) -> str:
    """The container of a bit width: 8 -> int8, 4 -> int4, 2 -> int2, 1.58 -> trit5."""
    table = {8: "int8", 4: "int4", 2: "int2", 1.58: "trit5"}
    if bits not in table:
        raise ValueError(f"container_for: no packed container for {bits!r} bits; expected one of {sorted(table)}.")
    return table[bits]


def packed_bytes(container: str, n: int) -> int:
    """Bytes that ``n`` codes take in ``container``."""
    return math.ceil(n / CONTAINERS[container][0])


def pack(codes: np.ndarray, container: str) -> np.ndarray:
    """Pack integer ``codes`` (any shape) into a 1-D ``uint8`` array (``int8`` for the int8 container).

    Raises:
      ValueError: an unknown container, or a code outside its range (the message gives the first).

    Example:
      >>> pack(np.array([-1, 0, 1, 1, -1]), "trit5")
      array([75], dtype=uint8)
    """
    if container not in CONTAINERS:
        raise ValueError(f"pack: unknown container {container!r}; expected one of {sorted(CONTAINERS)}.")
    per, low, high = CONTAINERS[container]
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
      container: one of :data:`CONTAINERS`.
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
    if container not in CONTAINERS:
        raise ValueError(f"{context}: unknown container {container!r}; expected one of {sorted(CONTAINERS)}.")
    per, low, _ = CONTAINERS[container]
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
