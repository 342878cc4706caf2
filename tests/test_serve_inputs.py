"""stejax.serve without a server: the config's bounds, body parsing and its messages, buckets and chunks.

Every refusal message is matched: it says what was expected and what came, and
never repeats an input value.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from stejax.serve import RequestError, ServeConfig
from stejax.serve._inputs import parse_body, parse_json, parse_npy

SHAPE = (4,)
F32 = np.dtype(np.float32)


def _json(inputs) -> bytes:
    return json.dumps({"inputs": inputs}).encode()


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=True)
    return buffer.getvalue()


def _refused(status: int, match: str, fn, *args, **kwargs) -> RequestError:
    with pytest.raises(RequestError, match=match) as info:
        fn(*args, **kwargs)
    assert info.value.status == status
    return info.value


# ----------------------------------------------------------------------------- config


def test_config_defaults_and_bounds():
    config = ServeConfig()
    assert config.buckets == (1, 8, 32, 128) and config.max_bucket == 128
    assert config.oversize == "split" and config.max_rows == 1024
    assert config.max_queued_rows == 16 * 128
    assert [config.bucket_for(n) for n in (1, 2, 8, 9, 32, 33, 128)] == [1, 8, 8, 32, 32, 128, 128]
    assert config.chunks(128) == [128] and config.chunks(129) == [128, 1] and config.chunks(300) == [128, 128, 44]
    assert ServeConfig(oversize="refuse", max_rows=5000).max_rows == 128


def test_config_never_shows_the_admin_token():
    assert "s3cret" not in repr(ServeConfig(admin_token="s3cret"))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"buckets": ()}, r"buckets must be a non-empty tuple of ints; got \(\)"),
        ({"buckets": (8, 1)}, r"buckets must be strictly increasing; got \(8, 1\)"),
        ({"buckets": (1, 1)}, r"strictly increasing"),
        ({"buckets": (0, 4)}, r"buckets\[0\] must be an int >= 1; got 0"),
        ({"buckets": (1, 2.5)}, r"buckets\[1\] must be an int >= 1; got 2.5"),
        ({"oversize": "drop"}, r"oversize must be one of \['split', 'refuse'\]; got 'drop'"),
        ({"max_rows": 64}, r"max_rows must be at least the largest bucket \(128\); got 64"),
        ({"max_body_bytes": 0}, r"max_body_bytes must be an int >= 1; got 0"),
        ({"batch_wait_ms": -1.0}, r"batch_wait_ms must be a finite float >= 0; got -1.0"),
        ({"batch_wait_ms": float("nan")}, r"batch_wait_ms must be a finite float >= 0"),
        ({"micro_batching": 1}, r"micro_batching must be a bool; got 1"),
        ({"max_queued_rows": 10}, r"max_queued_rows must be at least max_rows \(1024\); got 10"),
        ({"admin_token": "  "}, r"admin_token must be a non-empty string or None"),
    ],
)
def test_config_refuses_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ServeConfig(**kwargs)


# ----------------------------------------------------------------------------- JSON


def test_json_rows_become_float32():
    x = parse_json(_json([[1, 2.5, -3, 0.0], [4, 5, 6, 7]]), SHAPE, F32, max_rows=8)
    assert x.dtype == np.float32 and x.shape == (2, 4)
    np.testing.assert_array_equal(x, np.array([[1, 2.5, -3, 0], [4, 5, 6, 7]], np.float32))


def test_json_images_may_be_nested_or_flat():
    nested = [[[1, 2], [3, 4]]]
    a = parse_json(_json(nested), (2, 2), F32, max_rows=2)
    b = parse_json(_json([[1, 2, 3, 4]]), (2, 2), F32, max_rows=2)
    assert a.shape == b.shape == (1, 2, 2)
    np.testing.assert_array_equal(a, b)
    _refused(
        422,
        r"row 0 has a dimension of length 3; expected shape \[2, 2\]",
        parse_json,
        _json([[[1, 2, 3], [3, 4]]]),
        (2, 2),
        F32,
        max_rows=2,
    )


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"{", 422, r"malformed JSON at byte 1; expected \{\"inputs\""),
        (b"", 422, r"malformed JSON at byte 0"),
        (b"\xff\xfe\x00", 422, r"malformed JSON"),
        (b"[" * 100_000, 422, r"JSON nested too deeply"),
        (b"[[1, 2, 3, 4]]", 422, r"body: a list without \"inputs\""),
        (b'{"input": [[1, 2, 3, 4]]}', 422, r"body: an object without \"inputs\""),
        (b'{"inputs": [[1, 2, 3, 4]], "extra": 1}', 422, r"unknown field\(s\) \['extra'\]; expected only \"inputs\""),
        (b'{"inputs": {"a": 1}}', 422, r"inputs: an object; expected a list of rows, each row a list of 4 numbers"),
        (b'{"inputs": "1,2,3,4"}', 422, r"inputs: a string; expected a list of rows"),
        (b'{"inputs": []}', 422, r"empty batch; expected 1 to 8 rows"),
        (b'{"inputs": [1, 2, 3, 4]}', 422, r"row 0 is a number; expected each row a list of 4 numbers"),
        (b'{"inputs": [[1, 2, 3]]}', 422, r"row 0 has 3 values; expected 4 features"),
        (b'{"inputs": [[1, 2, 3, 4], [1, 2, 3, 4, 5]]}', 422, r"row 1 has 5 values; expected 4 features"),
        (b'{"inputs": [[1, "2", 3, 4]]}', 422, r"row 0, feature 1 is a string; expected a number"),
        (b'{"inputs": [[1, 2, true, 4]]}', 422, r"row 0, feature 2 is a boolean; expected a number"),
        (b'{"inputs": [[1, 2, 3, null]]}', 422, r"row 0, feature 3 is null; expected a number"),
        (b'{"inputs": [[1, 2, 3, [4]]]}', 422, r"row 0, feature 3 is a list; expected a number"),
        (b'{"inputs": [[1, 2, 3, NaN]]}', 422, r"expected finite float32 values; row 0, feature 3 is NaN"),
        (b'{"inputs": [[1, 2, 3, 4], [Infinity, 0, 0, 0]]}', 422, r"row 1, feature 0 is infinite"),
        (b'{"inputs": [[-Infinity, 0, 0, 0]]}', 422, r"row 0, feature 0 is infinite"),
        (b'{"inputs": [[1e400, 0, 0, 0]]}', 422, r"row 0, feature 0 is infinite"),
        (b'{"inputs": [[0, 1e39, 0, 0]]}', 422, r"within the float32 range .*; row 0, feature 1 is outside it"),
        (b'{"inputs": [[0, 0, 1' + b"0" * 400 + b", 0]]}", 422, r"an integer too large for float32"),
        (_json([[0, 0, 0, 0]] * 9), 413, r"9 rows exceed the limit of 8 rows per request"),
    ],
    ids=lambda v: None,
)
def test_json_refusals_say_what_was_expected(body, status, message):
    error = _refused(status, message, parse_json, body, SHAPE, F32, max_rows=8)
    assert error.invalid_input


def test_refusals_never_echo_an_input_value():
    body = b'{"inputs": [[7654.321, "secret-987", 0, 0]]}'
    error = _refused(422, "feature 1 is a string", parse_json, body, SHAPE, F32, max_rows=8)
    assert "7654" not in error.message and "secret" not in error.message


# ----------------------------------------------------------------------------- .npy


@pytest.mark.parametrize(
    "array",
    [
        np.arange(8, dtype=np.float32).reshape(2, 4),
        np.asfortranarray(np.arange(8, dtype=np.float32).reshape(2, 4)),
        np.arange(8, dtype=">f4").reshape(2, 4),
    ],
    ids=["c-order", "fortran-order", "big-endian"],
)
def test_npy_bodies_are_read_exactly(array):
    x = parse_npy(_npy(array), SHAPE, F32, max_rows=8)
    assert x.dtype == np.float32 and x.flags.c_contiguous and x.flags.writeable
    np.testing.assert_array_equal(x, np.arange(8, dtype=np.float32).reshape(2, 4))


def test_npy_version_2_and_flat_images():
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, np.ones((3, 4), np.float32), version=(2, 0))
    assert parse_npy(buffer.getvalue(), (2, 2), F32, max_rows=8).shape == (3, 2, 2)


def _header_only(shape, descr="<f4") -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": descr, "fortran_order": False, "shape": shape})
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"PK\x03\x04 not a npy", 422, r"not a .npy file \(no \\x93NUMPY magic\)"),
        (_npy(np.ones((2, 4), np.float64)), 422, r"dtype '<f8' \(float64\); expected float32"),
        (_npy(np.ones((2, 4), np.int32)), 422, r"dtype '<i4' \(int32\); expected float32"),
        (_npy(np.ones((2, 4), np.float16)), 422, r"dtype '<f2' \(float16\); expected float32"),
        (_npy(np.array([[None, 1, 2, 3]], dtype=object)), 422, r"dtype '\|O' \(object\); expected float32"),
        (_npy(np.ones((2, 5), np.float32)), 422, r"shape \(2, 5\); expected a .npy array of dtype float32 and shape"),
        (_npy(np.ones(4, np.float32)), 422, r"shape \(4,\); expected"),
        (_npy(np.ones((0, 4), np.float32)), 422, r"empty batch"),
        (_npy(np.ones((9, 4), np.float32)), 413, r"9 rows exceed the limit of 8"),
        (
            _npy(np.ones((2, 4), np.float32))[:-1],
            422,
            r"31 bytes of data after the .npy header; its shape and dtype need 32",
        ),
        (_npy(np.ones((2, 4), np.float32)) + b"\0", 422, r"33 bytes of data"),
        (_header_only((10**12, 4)), 413, r"1000000000000 rows exceed the limit"),
        (_header_only((8, 4)), 422, r"0 bytes of data after the .npy header; its shape and dtype need 128"),
        (b"\x93NUMPY\x01\x00\x10\x00{'descr': <f4 }  \n", 422, r"a malformed .npy header"),
        (b"\x93NUMPY\x03\x00" + b"\0" * 8, 422, r"format version \(3, 0\); expected 1.0 or 2.0"),
        (_npy(np.array([[1, 2, 3, np.nan]], np.float32)), 422, r"finite float32 values; row 0, feature 3 is NaN"),
        (_npy(np.array([[1, 2, 3, 4], [np.inf, 2, 3, 4]], np.float32)), 422, r"row 1, feature 0 is infinite"),
    ],
    ids=lambda v: None,
)
def test_npy_refusals_say_what_was_expected(body, status, message):
    _refused(status, message, parse_npy, body, SHAPE, F32, max_rows=8)


def test_a_pickle_is_never_unpickled(monkeypatch):
    import pickle

    calls = []
    monkeypatch.setattr(pickle, "load", lambda *a, **k: calls.append(a))
    monkeypatch.setattr(pickle, "loads", lambda *a, **k: calls.append(a))
    _refused(422, r"\|O", parse_npy, _npy(np.array([[object()] * 4], dtype=object)), SHAPE, F32, max_rows=8)
    _refused(422, "no .x93NUMPY magic", parse_npy, pickle.dumps([[1.0, 2.0, 3.0, 4.0]]), SHAPE, F32, max_rows=8)
    assert not calls


# ----------------------------------------------------------------------------- media types


def test_media_types():
    array = np.ones((1, 4), np.float32)
    for content_type in ("application/json", "application/json; charset=utf-8", "application/vnd.x+json", None):
        assert parse_body(_json(array.tolist()), content_type, SHAPE, F32, max_rows=2).shape == (1, 4)
    for content_type in ("application/x-npy", "application/octet-stream", None):
        assert parse_body(_npy(array), content_type, SHAPE, F32, max_rows=2).shape == (1, 4)
    _refused(
        415,
        r"Content-Type 'text/plain'; expected application/json or application/x-npy",
        parse_body,
        b"1",
        "text/plain",
        SHAPE,
        F32,
        max_rows=2,
    )
