"""The safetensors files of an artifact: written by the safetensors library, checked field by field on the way in.

A safetensors file is an 8-byte little-endian header length ``N``, ``N`` bytes of
JSON, then the tensor bytes. The JSON maps each tensor name to
``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets into the data that
follows the header) and may hold ``"__metadata__"``, a map of strings. Nothing in
it is executable. :func:`encode_safetensors` is the library's ``safetensors.numpy.save``;
:func:`header` lays the table out as the library does (tensors by dtype size,
in the library's dtype order, then by name; the JSON padded with spaces to a multiple of 8
bytes), so the file size follows from the table alone (:func:`safetensors_file_size`), and
a test holds the two to byte equality. :func:`decode_safetensors` trusts nothing before the
library reads the tensors: the header length is bounded, the JSON must be an
object without duplicate keys, every dtype known, every shape's byte count equal
to its offsets' span, and the spans must tile the data exactly: inside the file,
no overlap, no hole, nothing after the last tensor.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping

import numpy as np

__all__ = [
    "MAX_HEADER_BYTES",
    "SafetensorsError",
    "decode",
    "decode_safetensors",
    "encode",
    "encode_safetensors",
    "file_size",
    "header",
    "safetensors_file_size",
    "safetensors_layout",
]

# Far above any model here (a header entry is ~100 bytes), far below memory trouble.
MAX_HEADER_BYTES = 1 << 20

DTYPES: dict[str, np.dtype] = {
    "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "I16": np.dtype("<i2"),
    "I32": np.dtype("<i4"),
    "I64": np.dtype("<i8"),
}
_NAMES = {dtype: name for name, dtype in DTYPES.items()}
# The order of these dtypes in the library's ``Dtype`` enum (U8 < I8 < I16 < I32 <
# F32 < F64 < I64), which its writer sorts by, descending, before the names.
_WRITE_RANK = {"U8": 0, "I8": 1, "I16": 2, "I32": 3, "F32": 4, "F64": 5, "I64": 6}


class SafetensorsError(ValueError):
    """A file that is not a valid safetensors file; the message says what and where."""


def _dtype_name(dtype: np.dtype, where: str) -> str:
    name = _NAMES.get(np.dtype(dtype).newbyteorder("<") if np.dtype(dtype).itemsize > 1 else np.dtype(dtype))
    if name is None:
        raise SafetensorsError(f"{where}: dtype {np.dtype(dtype).name} is not stored; expected one of {list(DTYPES)}.")
    return name


def header(table: Mapping[str, tuple[tuple[int, ...], np.dtype]], metadata: Mapping[str, str] | None = None) -> bytes:
    """The padded JSON header for tensors ``{name: (shape, dtype)}`` laid out in order."""
    entries: dict[str, object] = {}
    if metadata:
        entries["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    # The library's order: by its dtype enum, last member first, then by name.
    order = sorted(table, key=lambda name: (-_WRITE_RANK[_dtype_name(table[name][1], name)], name))
    for name in order:
        shape, dtype = table[name]
        size = math.prod(shape) * np.dtype(dtype).itemsize
        entries[name] = {
            "dtype": _dtype_name(dtype, f"tensor {name!r}"),
            "shape": [int(s) for s in shape],
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(entries, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    return text + b" " * ((-(8 + len(text))) % 8)


def safetensors_file_size(
    table: Mapping[str, tuple[tuple[int, ...], np.dtype]], metadata: Mapping[str, str] | None = None
) -> int:
    """The size in bytes of :func:`encode_safetensors`'s file for tensors ``{name: (shape, dtype)}``, before writing it.

    Example:
      >>> import numpy as np
      >>> from stejax.export import encode_safetensors, safetensors_file_size
      >>> table = {"w": ((3, 2), np.dtype(np.float32))}
      >>> safetensors_file_size(table) == len(encode_safetensors({"w": np.zeros((3, 2), np.float32)}))
      True
    """
    data = sum(math.prod(shape) * np.dtype(dtype).itemsize for shape, dtype in table.values())
    return 8 + len(header(table, metadata)) + data


def encode_safetensors(tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None) -> bytes:
    """A safetensors file's bytes for ``{name: array}``, by ``safetensors.numpy.save`` (never a pickle).

    Only the dtypes float32, float64, int8, uint8, int16, int32 and int64 are stored;
    ``metadata`` values become strings in the header's ``__metadata__``.

    Raises:
      SafetensorsError: a tensor of another dtype (its name and dtype).
    """
    from safetensors.numpy import save

    for name, a in tensors.items():
        _dtype_name(np.asarray(a).dtype, f"tensor {name!r}")
    # np.array, not np.ascontiguousarray, which turns a 0-d scalar into shape (1,).
    arrays = {name: np.array(a, order="C") for name, a in tensors.items()}
    return save(arrays, metadata=None if not metadata else {str(k): str(v) for k, v in metadata.items()})


def _reject_duplicates(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise SafetensorsError(f"the header names {key!r} twice")
        seen[key] = value
    return seen


def _reject_constant(name):
    raise SafetensorsError(f"the header holds the non-JSON constant {name}")


def safetensors_layout(
    head: bytes, size: int, where: str
) -> tuple[int, list[tuple[int, int, str, np.dtype, tuple[int, ...]]], dict[str, str]]:
    """Check a safetensors header and return ``(data_start, spans, metadata)``, reading nothing past the header.

    ``head`` holds the file's first bytes (at least its 8-byte length and the header), ``size`` the whole
    file's length. ``spans`` are ``(begin, end, name, dtype, shape)`` sorted by offset, which tile the data
    section ``[data_start, size)`` exactly: a reader may then take the tensors one by one
    (:func:`decode_safetensors` checks the same before it makes any array).

    Raises:
      SafetensorsError: as :func:`decode_safetensors`.
    """
    data = head
    # A pickle starts with PROTO (0x80) and its protocol; so may a header length
    # (1152 is 80 04 00 ...), but then the JSON's '{' follows at byte 8.
    if size >= 2 and data[0] == 0x80 and 2 <= data[1] <= 5 and data[8:9] != b"{":
        raise SafetensorsError(
            f"{where}: this is a pickle (protocol {data[1]}), not safetensors; pickles can run code when loaded "
            "and are never read."
        )
    if size < 8:
        raise SafetensorsError(f"{where}: {size} bytes; a safetensors file starts with an 8-byte header length.")
    (n,) = struct.unpack("<Q", data[:8])
    if n > MAX_HEADER_BYTES:
        raise SafetensorsError(f"{where}: the header length is {n} bytes; at most {MAX_HEADER_BYTES} are accepted.")
    if 8 + n > size:
        raise SafetensorsError(
            f"{where}: the header length is {n} bytes, past the end of the file ({size} bytes): truncated?"
        )
    raw = data[8 : 8 + n]
    if not raw.startswith(b"{"):
        raise SafetensorsError(f"{where}: the header must be a JSON object starting with '{{'; got {raw[:16]!r}.")
    try:
        entries = json.loads(
            raw.decode("utf-8").rstrip(" "), object_pairs_hook=_reject_duplicates, parse_constant=_reject_constant
        )
    except SafetensorsError as e:
        raise SafetensorsError(f"{where}: {e}.") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{where}: the header is not UTF-8 JSON ({e}).") from None
    if not isinstance(entries, dict):
        raise SafetensorsError(f"{where}: the header must be a JSON object; got {type(entries).__name__}.")
    metadata = entries.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise SafetensorsError(f"{where}: __metadata__ must map strings to strings; got {metadata!r}.")
    buffer_len = size - 8 - n
    spans = []
    for name, entry in entries.items():
        at = f"{where}: tensor {name!r}"
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            got = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
            raise SafetensorsError(f"{at}: expected exactly the keys ['data_offsets', 'dtype', 'shape']; got {got}.")
        dtype = DTYPES.get(entry["dtype"]) if isinstance(entry["dtype"], str) else None
        if dtype is None:
            raise SafetensorsError(f"{at}: dtype {entry['dtype']!r} is not one of {list(DTYPES)}.")
        shape = entry["shape"]
        if not isinstance(shape, list) or not all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape
        ):
            raise SafetensorsError(f"{at}: shape must be a list of non-negative ints; got {shape!r}.")
        offsets = entry["data_offsets"]
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        ):
            raise SafetensorsError(f"{at}: data_offsets must be [begin, end] ints; got {offsets!r}.")
        begin, end = offsets
        if not 0 <= begin <= end <= buffer_len:
            raise SafetensorsError(
                f"{at}: data_offsets [{begin}, {end}] lie outside the data section [0, {buffer_len}] "
                f"(file of {size} bytes, header {n})."
            )
        expected = math.prod(shape) * dtype.itemsize
        if end - begin != expected:
            raise SafetensorsError(
                f"{at}: data_offsets [{begin}, {end}] span {end - begin} bytes; shape {shape} of {entry['dtype']} "
                f"needs {expected}."
            )
        spans.append((begin, end, name, dtype, tuple(shape)))
    spans.sort()
    cursor = 0
    previous = None
    for begin, end, name, _, _ in spans:
        if begin < cursor:
            raise SafetensorsError(
                f"{where}: tensor {name!r} at [{begin}, {end}] overlaps tensor {previous!r}, which ends at {cursor}."
            )
        if begin > cursor:
            raise SafetensorsError(
                f"{where}: a hole of {begin - cursor} bytes at [{cursor}, {begin}] before tensor {name!r}; "
                "the tensors must tile the data section."
            )
        cursor, previous = end, name
    if cursor != buffer_len:
        raise SafetensorsError(
            f"{where}: {buffer_len - cursor} bytes after the last tensor (data section [0, {buffer_len}], "
            f"tensors end at {cursor})."
        )
    return 8 + n, spans, metadata


def decode_safetensors(data: bytes, where: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Validate a safetensors file's bytes and return ``({name: array}, metadata)``, without the library.

    The header is checked here (its length, JSON without duplicates or NaN, every
    tensor's dtype, shape and offsets, contiguous and in bounds) before any array is
    made, so a truncated file or a pickle is refused with a message, never loaded.

    Arrays come in header order sorted by offset, read-only, native byte order.

    Raises:
      SafetensorsError: naming ``where``, the field or tensor, what was expected
        and what came.
    """
    _, spans, metadata = safetensors_layout(data, len(data), where)
    from safetensors.numpy import load

    loaded = load(bytes(data))
    arrays = {}
    for _, _, name, dtype, shape in spans:
        a = np.array(loaded[name], dtype=dtype.newbyteorder("="), copy=True).reshape(shape)
        a.flags.writeable = False
        arrays[name] = a
    return arrays, metadata


# The names this module's callers used before the public ones (stejax.export re-exports those).
decode = decode_safetensors
encode = encode_safetensors
file_size = safetensors_file_size
