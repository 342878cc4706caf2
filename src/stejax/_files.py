"""Reading the files a user hands stejax: errors that name the file and say what is wrong with it.

The loaders of run directories (and anything else a user points stejax at) read
through these functions, so that a truncated, mistyped or misplaced file gives an
:class:`InputFileError` whose message starts with the file's path, never a
parser's own exception without it. The command line reports such an error as
one line and exit code 2.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["InputFileError", "read_bytes", "read_json", "read_json_lines", "read_safetensors"]


class InputFileError(ValueError):
    """A file or directory given to stejax that is not what it should be.

    The message starts with the path and says what was expected and what was
    found. A ``ValueError``, so existing ``except ValueError`` handlers still
    catch it.
    """


def read_bytes(path: str | os.PathLike, *, what: str) -> bytes:
    """The bytes of ``path``, which should hold ``what``.

    Raises:
      FileNotFoundError: no such file (the message names it and ``what``).
      InputFileError: a directory where a file is expected.
    """
    path = Path(path)
    if path.is_dir():
        raise InputFileError(f"{path}: a directory; expected {what}, a file.")
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such file; expected {what}.") from None


def read_json(path: str | os.PathLike, *, what: str) -> Any:
    """The JSON document in ``path`` (strict: no NaN or Infinity constants).

    Raises:
      FileNotFoundError: no such file.
      InputFileError: not UTF-8 JSON; the message gives the line and column.
    """
    data = read_bytes(path, what=what)
    try:
        return json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError as e:
        raise InputFileError(f"{path}: not UTF-8 text (byte {e.start}); expected {what} (JSON).") from None
    except json.JSONDecodeError as e:
        raise InputFileError(
            f"{path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}); expected {what}."
        ) from None
    except ValueError as e:  # a NaN or Infinity constant
        raise InputFileError(f"{path}: {e}; expected {what} (strict JSON).") from None


def read_json_lines(path: str | os.PathLike, *, what: str) -> list[Any]:
    """One JSON document per non-empty line of ``path``.

    Raises:
      FileNotFoundError: no such file.
      InputFileError: a line that is not JSON (the message gives its number).
    """
    data = read_bytes(path, what=what)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputFileError(f"{path}: not UTF-8 text (byte {e.start}); expected {what}.") from None
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line, parse_constant=_reject_constant))
        except ValueError as e:
            raise InputFileError(f"{path}: line {number} is not JSON ({e}); expected {what}.") from None
    return records


def read_safetensors(path: str | os.PathLike, *, what: str) -> dict[str, np.ndarray]:
    """The tensors of a safetensors file, after checks that name ``path`` when it is not one.

    A pickle is refused before anything is parsed (loading one can run code);
    a file shorter than its header says is reported as truncated.

    Raises:
      FileNotFoundError: no such file.
      InputFileError: not a safetensors file (a pickle, truncated, a malformed
        header), with the path and the reason.
    """
    data = read_bytes(path, what=what)
    size = len(data)
    # A pickle starts with PROTO (0x80) and its protocol; a header length may too, but then
    # the JSON header's '{' follows at byte 8.
    if size >= 2 and data[0] == 0x80 and 2 <= data[1] <= 5 and data[8:9] != b"{":
        raise InputFileError(
            f"{path}: a pickle (protocol {data[1]}), not safetensors; pickles can run code when loaded and are never "
            f"read. Expected {what}."
        )
    if size < 8:
        raise InputFileError(f"{path}: {size} bytes, too short for safetensors (an 8-byte header length); truncated?")
    n = int.from_bytes(data[:8], "little")
    if 8 + n > size:
        raise InputFileError(
            f"{path}: the safetensors header length is {n} bytes, past the end of the file ({size} bytes): "
            f"truncated, or not safetensors. Expected {what}."
        )
    from safetensors import SafetensorError
    from safetensors.numpy import load

    try:
        return load(data)
    except (SafetensorError, ValueError, TypeError) as e:
        raise InputFileError(f"{path}: not a valid safetensors file ({e}); expected {what}.") from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"the non-JSON constant {name}")
