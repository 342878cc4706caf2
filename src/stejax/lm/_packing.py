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


def unpack(stored: np.ndarray, container: str, n: int) -> np.ndarray:
    """The first ``n`` codes (``int8``) of ``stored``, the inverse of :func:`pack`.

    Raises:
      ValueError: an unknown container, too few bytes, or (trit5) a byte above 242.
    """
    if container not in CONTAINERS:
        raise ValueError(f"unpack: unknown container {container!r}; expected one of {sorted(CONTAINERS)}.")
    per, low, _ = CONTAINERS[container]
    stored = np.asarray(stored).reshape(-1)
    if stored.size != packed_bytes(container, n):
        raise ValueError(
            f"unpack: {stored.size} bytes hold {n} {container} codes only in {packed_bytes(container, n)}."
        )
    if container == "int8":
        return stored.astype(np.int8)
    values = stored.astype(np.int64)
    if container == "trit5" and values.size and values.max() > 242:
        raise ValueError(f"unpack: byte {values.max()} is not five trits (at most 3**5 - 1 = 242).")
    base = 3 if container == "trit5" else 1 << (8 // per)
    digits = (values[:, None] // base ** np.arange(per, dtype=np.int64)) % base
    return (digits.reshape(-1)[:n] + low).astype(np.int8)
