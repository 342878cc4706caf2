"""Request bodies to validated input arrays: JSON and .npy, with messages that say what was expected.

Nothing here logs or echoes input values: an error names the row and feature
and the kind of problem, never the number that was sent.
"""

from __future__ import annotations

import io
import json
import math
from typing import Any

import numpy as np

__all__ = ["NPY_MEDIA_TYPES", "RequestError", "parse_body", "parse_json", "parse_npy"]

JSON_MEDIA_TYPE = "application/json"
NPY_MEDIA_TYPES = ("application/x-npy", "application/octet-stream")
_NPY_MAGIC = b"\x93NUMPY"
_NUMBER_TYPES = frozenset({int, float})


class RequestError(Exception):
    """A request the service refuses: its HTTP status and a message for the client.

    Attributes:
      status: 413 (too large), 415 (media type), 422 (invalid input), 503 (not
        ready or overloaded).
      message: what was expected and what came (never an input value).
      invalid_input: whether ``stejax_invalid_inputs_total`` counts it.
    """

    def __init__(self, status: int, message: str, *, invalid_input: bool = True):
        super().__init__(message)
        self.status = status
        self.message = message
        self.invalid_input = invalid_input


def _expected(input_shape: tuple[int, ...]) -> str:
    n = math.prod(input_shape)
    if len(input_shape) == 1:
        return f"each row a list of {n} numbers"
    return f"each row {list(input_shape)} nested lists of numbers, or a flat list of {n}"


def _check_rows(n: int, max_rows: int) -> None:
    if n == 0:
        raise RequestError(422, f"inputs: empty batch; expected 1 to {max_rows} rows.")
    if n > max_rows:
        raise RequestError(413, f"inputs: {n} rows exceed the limit of {max_rows} rows per request; split the batch.")


def _check_finite(x: np.ndarray, what: str) -> None:
    flat = x.reshape(x.shape[0], -1)
    bad = ~np.isfinite(flat)
    if bad.any():
        row, feature = (int(i) for i in np.argwhere(bad)[0])
        kind = "NaN" if np.isnan(flat[row, feature]) else "infinite"
        raise RequestError(
            422,
            f"inputs: expected finite {what} values; row {row}, feature {feature} is {kind} "
            f"({int(bad.sum())} non-finite value(s) in all).",
        )


def _to_dtype(x64: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Cast to ``dtype``, refusing finite values that overflow it (1e39 is not a float32)."""
    _check_finite(x64, dtype.name)
    with np.errstate(over="ignore"):
        x = x64.astype(dtype)
    bad = ~np.isfinite(x.reshape(x.shape[0], -1))
    if bad.any():
        row, feature = (int(i) for i in np.argwhere(bad)[0])
        finfo = np.finfo(dtype)
        raise RequestError(
            422,
            f"inputs: expected values within the {dtype.name} range (magnitude at most {finfo.max:.6g}); "
            f"row {row}, feature {feature} is outside it.",
        )
    return x


def _row_values(row: Any, input_shape: tuple[int, ...], index: int) -> list:
    """The row's numbers in row-major order, flat or nested as ``input_shape`` says; RequestError otherwise."""
    n = math.prod(input_shape)
    if not isinstance(row, list):
        raise RequestError(422, f"inputs: row {index} is {_json_type(row)}; expected {_expected(input_shape)}.")
    if len(input_shape) > 1 and len(row) == input_shape[0] and row and isinstance(row[0], list):
        values: list = []
        _flatten(row, input_shape, index, values, input_shape)
    else:
        values = row
    if len(values) != n:
        raise RequestError(
            422,
            f"inputs: row {index} has {len(values)} values; expected {n} features ({_expected(input_shape)}).",
        )
    if not _NUMBER_TYPES.issuperset(map(type, values)):
        bad = next(i for i, v in enumerate(values) if type(v) not in _NUMBER_TYPES)
        raise RequestError(
            422,
            f"inputs: row {index}, feature {bad} is {_json_type(values[bad])}; expected a number.",
        )
    return values


def _flatten(nested: list, shape: tuple[int, ...], index: int, out: list, full: tuple[int, ...]) -> None:
    if len(nested) != shape[0]:
        raise RequestError(
            422, f"inputs: row {index} has a dimension of length {len(nested)}; expected shape {list(full)}."
        )
    if len(shape) == 1:
        out.extend(nested)
        return
    for part in nested:
        if not isinstance(part, list):
            raise RequestError(422, f"inputs: row {index} is not nested as {list(full)}; expected lists.")
        _flatten(part, shape[1:], index, out, full)


def _json_type(value: Any) -> str:
    """The JSON kind of ``value`` with its article: "a string", "an object", "null"."""
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
        type(None): "null",
    }.get(type(value), f"a {type(value).__name__}")


def parse_json(body: bytes, input_shape: tuple[int, ...], dtype: np.dtype, *, max_rows: int) -> np.ndarray:
    """``{"inputs": [[...], ...]}`` to a ``(rows, *input_shape)`` array of ``dtype``.

    Raises:
      RequestError: 422 for malformed JSON, a wrong structure or type, a wrong
        feature count, an empty batch, NaN, infinity or a value outside the
        dtype's range; 413 for more than ``max_rows`` rows.
    """
    try:
        document = json.loads(body)
    except RecursionError:
        raise RequestError(422, 'body: JSON nested too deeply; expected {"inputs": [[...], ...]}.') from None
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError
        position = f" at byte {error.pos}" if isinstance(error, json.JSONDecodeError) else ""
        raise RequestError(422, f'body: malformed JSON{position}; expected {{"inputs": [[...], ...]}}.') from None
    if not isinstance(document, dict) or "inputs" not in document:
        raise RequestError(422, f'body: {_json_type(document)} without "inputs"; expected {{"inputs": [[...], ...]}}.')
    unknown = sorted(set(document) - {"inputs"})
    if unknown:
        raise RequestError(422, f'body: unknown field(s) {unknown}; expected only "inputs".')
    rows = document["inputs"]
    if not isinstance(rows, list):
        raise RequestError(422, f"inputs: {_json_type(rows)}; expected a list of rows, {_expected(input_shape)}.")
    _check_rows(len(rows), max_rows)
    values = [_row_values(row, input_shape, i) for i, row in enumerate(rows)]
    try:
        x64 = np.array(values, dtype=np.float64)
    except OverflowError:
        raise RequestError(
            422, f"inputs: an integer too large for {dtype.name}; expected values within its range."
        ) from None
    return _to_dtype(x64, dtype).reshape(len(rows), *input_shape)


def parse_npy(body: bytes, input_shape: tuple[int, ...], dtype: np.dtype, *, max_rows: int) -> np.ndarray:
    """A ``.npy`` body (format 1.0 or 2.0) to a ``(rows, *input_shape)`` array of ``dtype``.

    The header is read and checked (dtype, shape, exact data length) before any
    data is touched, so a header that claims a huge shape allocates nothing, and
    pickled (object) arrays are refused as ``np.load(..., allow_pickle=False)``
    would. The data is then viewed with ``np.frombuffer`` and copied once.

    Raises:
      RequestError: 422 for a body that is not a .npy array, a dtype other than
        ``dtype`` (either byte order), a wrong shape, a data length that does not
        match the header, an empty batch or a non-finite value; 413 for more
        than ``max_rows`` rows.
    """
    n = math.prod(input_shape)
    expected = f"a .npy array of dtype {dtype.name} and shape (rows, {', '.join(map(str, input_shape))})"
    if not body.startswith(_NPY_MAGIC):
        raise RequestError(422, f"body: not a .npy file (no \\x93NUMPY magic); expected {expected}.")
    stream = io.BytesIO(body)
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, fortran_order, got = np.lib.format.read_array_header_1_0(stream)
        elif version == (2, 0):
            shape, fortran_order, got = np.lib.format.read_array_header_2_0(stream)
        else:
            raise RequestError(422, f"body: .npy format version {version}; expected 1.0 or 2.0.")
    except RequestError:
        raise
    except (ValueError, EOFError, SyntaxError, TypeError, OverflowError):
        raise RequestError(422, f"body: a malformed .npy header; expected {expected}.") from None
    if got.hasobject or got.kind != "f" or got.itemsize != dtype.itemsize or got.fields is not None:
        raise RequestError(422, f"inputs: dtype {got.str!r} ({got.name}); expected {dtype.name}, as {expected}.")
    if len(shape) == 0 or (tuple(shape[1:]) != tuple(input_shape) and tuple(shape[1:]) != (n,)):
        raise RequestError(422, f"inputs: shape {tuple(shape)}; expected {expected}.")
    _check_rows(shape[0], max_rows)
    offset = stream.tell()
    want = shape[0] * n * got.itemsize
    if len(body) - offset != want:
        raise RequestError(
            422, f"body: {len(body) - offset} bytes of data after the .npy header; its shape and dtype need {want}."
        )
    data = np.frombuffer(body, dtype=got, count=shape[0] * n, offset=offset)
    x = data.reshape(shape, order="F" if fortran_order else "C").astype(dtype, order="C")
    _check_finite(x, dtype.name)
    return x.reshape(shape[0], *input_shape)


def parse_body(
    body: bytes, content_type: str | None, input_shape: tuple[int, ...], dtype: np.dtype, *, max_rows: int
) -> np.ndarray:
    """Dispatch on the media type: JSON, or .npy (``application/x-npy`` or ``application/octet-stream``).

    Without a Content-Type a body that starts with the .npy magic is read as
    .npy and anything else as JSON.

    Raises:
      RequestError: 415 for any other media type; see :func:`parse_json` and
        :func:`parse_npy`.
    """
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if not media:
        media = NPY_MEDIA_TYPES[0] if body.startswith(_NPY_MAGIC) else JSON_MEDIA_TYPE
    if media == JSON_MEDIA_TYPE or media.endswith("+json"):
        return parse_json(body, input_shape, dtype, max_rows=max_rows)
    if media in NPY_MEDIA_TYPES:
        return parse_npy(body, input_shape, dtype, max_rows=max_rows)
    raise RequestError(415, f"Content-Type {media!r}; expected {JSON_MEDIA_TYPE} or {NPY_MEDIA_TYPES[0]}.")
