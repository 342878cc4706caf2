"""The IDX file format of MNIST: read and write one array, optionally gzip-compressed."""

from __future__ import annotations

import gzip
import os
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["read_idx", "write_idx"]

# IDX data type code -> big-endian NumPy dtype (LeCun & Cortes, the MNIST page).
_CODE_TO_DTYPE: dict[int, np.dtype[Any]] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_DTYPE_TO_CODE = {dtype.newbyteorder("="): code for code, dtype in _CODE_TO_DTYPE.items()}
_CODES = ", ".join(f"0x{code:02X} ({dtype.newbyteorder('=').name})" for code, dtype in _CODE_TO_DTYPE.items())
_GZIP_MAGIC = b"\x1f\x8b"


def _is_gzip_name(path: Path) -> bool:
    return path.suffix.lower() == ".gz"


def _read_bytes(path: Path) -> bytes:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such IDX file")
    if not _is_gzip_name(path):
        return path.read_bytes()
    try:
        with gzip.open(path, "rb") as f:
            return f.read()
    except gzip.BadGzipFile as e:
        raise ValueError(f"{path}: not a gzip file although its name ends in .gz ({e})") from e
    except (EOFError, zlib.error) as e:
        raise ValueError(f"{path}: truncated or corrupt gzip stream ({e})") from e


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read one array from an IDX file, the format of the MNIST files.

    The format: a 4-byte magic number ``0x00 0x00 T R`` where ``T`` is the data type
    code and ``R`` the rank; then ``R`` dimension sizes as big-endian unsigned 32-bit
    ints; then the data, row-major and big-endian. Type codes: 0x08 unsigned byte,
    0x09 signed byte, 0x0B int16, 0x0C int32, 0x0D float32, 0x0E float64. A file
    whose name ends in ``.gz`` is decompressed first.

    Args:
      path: the file.

    Returns:
      A native-byte-order array of the file's shape and dtype (uint8, int8, int16,
      int32, float32 or float64).

    Raises:
      FileNotFoundError: no such file.
      ValueError: a bad magic number, an unknown type code, rank 0, a header or data
        section shorter than the header declares (truncated), bytes after the data,
        or a broken gzip stream. The message names the file.

    Example:
      >>> import os, tempfile, numpy as np
      >>> from stejax.data import read_idx, write_idx
      >>> path = os.path.join(tempfile.mkdtemp(), "labels-idx1-ubyte.gz")
      >>> write_idx(path, np.array([3, 1, 4], np.uint8))
      >>> read_idx(path)
      array([3, 1, 4], dtype=uint8)

    Reference:
      Y. LeCun, C. Cortes, C. J. C. Burges, "The MNIST database of handwritten
      digits", http://yann.lecun.com/exdb/mnist/, 1998 (section "File formats").
    """
    path = Path(path)
    data = _read_bytes(path)
    if len(data) < 4:
        raise ValueError(f"{path}: truncated IDX file: the header needs 4 bytes, the file has {len(data)}")
    zero, code, rank = data[:2], data[2], data[3]
    if zero != b"\x00\x00":
        magic = struct.unpack(">I", data[:4])[0]
        hint = ""
        if data[:2] == _GZIP_MAGIC and not _is_gzip_name(path):
            hint = "; the file looks gzip-compressed: give it a .gz suffix"
        raise ValueError(
            f"{path}: bad IDX magic number 0x{magic:08X}: expected two zero bytes, then the type "
            f"code and the rank (0x0000TTRR){hint}"
        )
    if code not in _CODE_TO_DTYPE:
        raise ValueError(f"{path}: unknown IDX data type code 0x{code:02X}; expected one of {_CODES}")
    if rank == 0:
        raise ValueError(f"{path}: IDX rank 0 in the magic number; expected rank 1 or more")
    header = 4 + 4 * rank
    if len(data) < header:
        raise ValueError(
            f"{path}: truncated IDX file: a rank-{rank} header needs {header} bytes, the file has {len(data)}"
        )
    shape = struct.unpack(f">{rank}I", data[4:header])
    dtype = _CODE_TO_DTYPE[code]
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    found = len(data) - header
    if found < expected:
        per_item = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
        complete = found // per_item if per_item else 0
        raise ValueError(
            f"{path}: truncated IDX file: shape {shape} of {dtype.newbyteorder('=').name} needs "
            f"{expected} data bytes, found {found} (only the first {complete} of {shape[0]} "
            "items are complete)"
        )
    if found > expected:
        raise ValueError(
            f"{path}: {found - expected} unexpected bytes after the IDX data: shape {shape} of "
            f"{dtype.newbyteorder('=').name} needs {expected} data bytes, found {found}"
        )
    array = np.frombuffer(data, dtype=dtype, count=expected // dtype.itemsize, offset=header)
    return array.reshape(shape).astype(dtype.newbyteorder("="))


def write_idx(path: str | os.PathLike, array: ArrayLike) -> None:
    """Write one array to an IDX file (gzip-compressed when the name ends in ``.gz``).

    The inverse of :func:`read_idx`: the magic number ``0x00 0x00 T R``, the
    dimension sizes as big-endian uint32, then the data row-major and big-endian.
    Compressed files are written with a zero timestamp, so the same array always
    gives the same bytes.

    Args:
      path: the file to create or overwrite.
      array: an array of rank 1 to 255 and dtype uint8, int8, int16, int32,
        float32 or float64 (the six IDX types; cast other dtypes yourself, so that
        no value changes silently).

    Raises:
      TypeError: the dtype has no IDX type code.
      ValueError: rank 0 or above 255, or a dimension of 2**32 or more.
    """
    path = Path(path)
    array = np.asarray(array)
    code = _DTYPE_TO_CODE.get(array.dtype.newbyteorder("="))
    if code is None:
        raise TypeError(
            f"write_idx({str(path)!r}): IDX has no type code for dtype {array.dtype}; expected one of {_CODES}"
        )
    if not 1 <= array.ndim <= 255:
        raise ValueError(f"write_idx({str(path)!r}): IDX rank must be in [1, 255], got rank {array.ndim}")
    if any(s >= 2**32 for s in array.shape):
        raise ValueError(f"write_idx({str(path)!r}): IDX dimensions must be below 2**32, got {array.shape}")
    header = struct.pack(f">HBB{array.ndim}I", 0, code, array.ndim, *array.shape)
    body = np.ascontiguousarray(array, dtype=_CODE_TO_DTYPE[code]).tobytes()
    if _is_gzip_name(path):
        with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as f:
            f.write(header)
            f.write(body)
    else:
        path.write_bytes(header + body)
