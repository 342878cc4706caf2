"""stejax serve over real HTTP: uvicorn on loopback serving a real exported artifact.

Two servers per module: ``split`` (buckets 1, 4, 16; up to 40 rows, split into
chunks; micro-batching on) and ``refuse`` (the same buckets; more than 16 rows
refused; micro-batching off). Padded results are compared bit for bit with the
bare jitted model at the request's exact batch size: the artifact is a w4a4
export, whose layers run int8 x int8 -> int32 (exact at any batch size) and then
scale each element. (A float32 matmul would agree only to a few ulps: XLA's CPU
dot takes a matrix-vector kernel for a batch of one and a blocked one for more,
which sum in different orders.)
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import threading
import time

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import serve_support as support
from stejax.serve import ArtifactSource, ServeConfig, Service, compilations, compile_model, create_app

BUCKETS = (1, 4, 16)
MAX_ROWS = 40
MAX_BODY = 256 * 1024
EDGES = sorted({1, *(b - 1 for b in BUCKETS[1:]), *BUCKETS, *(b + 1 for b in BUCKETS), MAX_ROWS})


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    return support.build_artifacts(tmp_path_factory)


@pytest.fixture(scope="module")
def reference(artifacts):
    """The bare jitted model at the exact batch size: rows -> (logits, probabilities, classes)."""
    model = support.load(artifacts.a)
    fn = jax.jit(model.apply)
    out = {}
    for n in sorted({*EDGES, 7}):
        logits = np.asarray(fn(model.weights, artifacts.x[:n]))
        z = np.exp(logits - logits.max(axis=1, keepdims=True))
        out[n] = (logits, z / z.sum(axis=1, keepdims=True), logits.argmax(axis=1))
    return out


@pytest.fixture(scope="module")
def split(artifacts):
    config = ServeConfig(buckets=BUCKETS, max_rows=MAX_ROWS, max_body_bytes=MAX_BODY, batch_wait_ms=1.0)
    with support.serving(create_app(support.source(artifacts.a), config)) as running:
        yield running


@pytest.fixture(scope="module")
def refuse(artifacts):
    config = ServeConfig(buckets=BUCKETS, oversize="refuse", max_body_bytes=MAX_BODY, micro_batching=False)
    with support.serving(create_app(support.source(artifacts.a), config)) as running:
        yield running


def _post_json(server, inputs):
    return server.client.post("/v1/predict", json={"inputs": inputs})


def _npy(array) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _check_prediction(response, reference, n):
    assert response.status_code == 200, response.text
    body = response.json()
    logits, probabilities, classes = reference[n]
    np.testing.assert_array_equal(np.asarray(body["logits"], np.float32), logits)
    np.testing.assert_allclose(np.asarray(body["probabilities"], np.float32), probabilities, rtol=1e-6, atol=1e-7)
    assert body["classes"] == classes.tolist()
    assert set(body) == {"model_version", "logits", "probabilities", "classes"}


# ----------------------------------------------------------------------------- probes and contract


def test_probes_and_model_description(split, artifacts):
    assert split.client.get("/healthz").json() == {"status": "alive"}
    ready = split.client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    described = split.client.get("/v1/model").json()
    assert described["model_version"] == ready.json()["model_version"] == split.service.live.version
    assert described["input_shape"] == [64] and described["input_dtype"] == "float32"
    assert described["n_classes"] == 10 and described["buckets"] == list(BUCKETS) and described["max_rows"] == MAX_ROWS


# ----------------------------------------------------------------------------- bucket edges


@pytest.mark.parametrize("n", EDGES)
def test_every_bucket_edge_answers_and_padding_changes_nothing(split, reference, artifacts, n):
    _check_prediction(_post_json(split, artifacts.x[:n].tolist()), reference, n)
    response = split.client.post(
        "/v1/predict", content=_npy(artifacts.x[:n]), headers={"content-type": "application/x-npy"}
    )
    _check_prediction(response, reference, n)


def test_one_past_the_maximum_is_refused(split, refuse, artifacts, reference):
    response = _post_json(split, np.tile(artifacts.x[:1], (MAX_ROWS + 1, 1)).tolist())
    assert response.status_code == 413
    assert response.json() == {
        "error": f"inputs: {MAX_ROWS + 1} rows exceed the limit of {MAX_ROWS} rows per request; split the batch."
    }
    for n in (1, 3, 4, 5, 15, 16):
        _check_prediction(_post_json(refuse, artifacts.x[:n].tolist()), reference, n)
    response = _post_json(refuse, artifacts.x[:17].tolist())
    assert response.status_code == 413 and "17 rows exceed the limit of 16 rows" in response.json()["error"]


def test_the_compiled_model_pads_to_the_smallest_bucket(artifacts, reference):
    compiled = compile_model(support.load(artifacts.a), BUCKETS)
    for n, bucket in [(1, 1), (2, 4), (4, 4), (5, 16), (16, 16)]:
        prediction = compiled.predict(artifacts.x[:n])
        assert prediction.bucket == bucket and prediction.logits.shape == (n, 10)
    with pytest.raises(ValueError, match=r"expected 1 to 16 rows; got 17"):
        compiled.predict(artifacts.x[:17])


# ----------------------------------------------------------------------------- bad requests


def _row(last: str = "0.5", first: str = "0.5") -> str:
    return "[" + ", ".join([first, *["0.5"] * 62, last]) + "]"


ROW = _row()


@pytest.mark.parametrize(
    ("body", "content_type", "status", "message"),
    [
        (b'{"inputs": [[0.5, 1', "application/json", 422, "malformed JSON at byte"),
        (b"not json at all", "application/json", 422, "malformed JSON at byte 0"),
        (b'{"inputs": []}', "application/json", 422, "empty batch; expected 1 to 40 rows"),
        (b'{"inputs": [[1, 2, 3]]}', "application/json", 422, "row 0 has 3 values; expected 64 features"),
        (f'{{"inputs": [{ROW}, "row"]}}'.encode(), "application/json", 422, "row 1 is a string; expected each row"),
        (f'{{"inputs": [{_row("true")}]}}'.encode(), "application/json", 422, "row 0, feature 63 is a boolean"),
        (('{"inputs": [' + _row('"1"') + "]}").encode(), "application/json", 422, "row 0, feature 63 is a string"),
        (f'{{"inputs": [{_row("NaN")}]}}'.encode(), "application/json", 422, "row 0, feature 63 is NaN"),
        (
            f'{{"inputs": [{ROW}, {_row(first="Infinity")}]}}'.encode(),
            "application/json",
            422,
            "row 1, feature 0 is infinite",
        ),
        (
            f'{{"inputs": [{_row(first="-Infinity")}]}}'.encode(),
            "application/json",
            422,
            "row 0, feature 0 is infinite",
        ),
        (f'{{"inputs": [{_row(first="1e39")}]}}'.encode(), "application/json", 422, "outside it"),
        (b'{"inputs": [[1, 2, 3]]}', "text/plain", 415, "expected application/json or application/x-npy"),
        (_npy(np.zeros((2, 64))), "application/x-npy", 422, "dtype '<f8' (float64); expected float32"),
        (_npy(np.zeros((2, 63), np.float32)), "application/x-npy", 422, "shape (2, 63)"),
        (_npy(np.full((2, 64), np.nan, np.float32)), "application/x-npy", 422, "row 0, feature 0 is NaN"),
        (_npy(np.zeros((0, 64), np.float32)), "application/x-npy", 422, "empty batch"),
    ],
    ids=lambda v: None,
)
def test_bad_requests_get_a_message_of_what_was_expected(split, body, content_type, status, message):
    before = split.metric("stejax_invalid_inputs_total")
    response = split.client.post("/v1/predict", content=body, headers={"content-type": content_type})
    assert response.status_code == status
    assert message in response.json()["error"]
    assert split.metric("stejax_invalid_inputs_total") == before + 1


def test_an_oversized_body_is_refused_before_it_is_read(split):
    body = b'{"inputs": [' + b"0," * MAX_BODY + b"0]}"
    response = split.client.post("/v1/predict", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert response.json()["error"] == f"body: {len(body)} bytes exceed the limit of {MAX_BODY} bytes."

    def chunked():  # no Content-Length: counted while it streams
        for _ in range(MAX_BODY // 4096 + 2):
            yield b" " * 4096

    response = split.client.post("/v1/predict", content=chunked(), headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert response.json()["error"] == f"body: more than the limit of {MAX_BODY} bytes."
    assert split.client.get("/readyz").status_code == 200


_json_values = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=True) | st.integers() | st.text(max_size=5),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=20,
)


def _bad_bodies(valid_row: list) -> st.SearchStrategy:
    row = st.lists(st.floats(width=32) | st.integers(-(10**40), 10**40), min_size=0, max_size=70)
    return st.one_of(
        st.binary(max_size=300).map(lambda b: (b, "application/json")),
        st.binary(max_size=300).map(lambda b: (b"\x93NUMPY" + b, "application/x-npy")),
        _json_values.map(lambda v: (json.dumps(v).encode(), "application/json")),
        _json_values.map(lambda v: (json.dumps({"inputs": v}).encode(), "application/json")),
        st.lists(row, max_size=3).map(lambda rows: (json.dumps({"inputs": rows}).encode(), "application/json")),
        st.integers(0, 200).map(lambda cut: (json.dumps({"inputs": [valid_row]}).encode()[:cut], "application/json")),
        st.sampled_from(["text/html", "image/png", "", "application/x-npy; x=1"]).map(
            lambda ct: (json.dumps({"inputs": [valid_row]}).encode(), ct)
        ),
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture], derandomize=True)
@given(data=st.data())
def test_fuzzed_requests_never_get_a_5xx(split, data):
    body, content_type = data.draw(_bad_bodies([0.5] * 64))
    response = split.client.post("/v1/predict", content=body, headers={"content-type": content_type})
    assert response.status_code in (200, 413, 415, 422), response.text
    assert "error" in response.json() or response.status_code == 200


def test_the_service_still_answers_after_the_fuzz(split, reference, artifacts):
    assert split.client.get("/readyz").status_code == 200
    _check_prediction(_post_json(split, artifacts.x[:7].tolist()), reference, 7)


# ----------------------------------------------------------------------------- load, compilations, metrics


def _traffic(server, artifacts, reference, sizes, errors):
    import httpx

    with httpx.Client(base_url=server.url, timeout=60) as client:
        for i, n in enumerate(sizes):
            x = artifacts.x[:n]
            if i % 2:
                response = client.post("/v1/predict", content=_npy(x), headers={"content-type": "application/x-npy"})
            else:
                response = client.post("/v1/predict", json={"inputs": x.tolist()})
            try:
                _check_prediction(response, reference, n)
            except AssertionError as error:
                errors.append(error)


@pytest.mark.counts_compilations
def test_mixed_load_compiles_nothing_and_every_answer_is_right(split, artifacts, reference):
    sizes = [EDGES[i % len(EDGES)] for i in range(24)]
    before = compilations()
    metric_before = split.metric("stejax_compilations_total")
    requests_before = split.metric("stejax_requests_total", 'status="200"')
    errors: list = []
    threads = [
        threading.Thread(target=_traffic, args=(split, artifacts, reference, sizes[k:] + sizes[:k], errors))
        for k in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors[:3]
    assert compilations() == before
    assert split.metric("stejax_compilations_total") == metric_before
    assert split.metric("stejax_requests_total", 'status="200"') == requests_before + 8 * len(sizes)
    # The counter does count: a fresh function compiled in this process (where the server runs) shows up.
    assert int(jax.jit(lambda v: v * 3 + 1)(jnp.arange(5, dtype=jnp.int32))[4]) == 13
    assert compilations() > before
    assert split.metric("stejax_compilations_total") == metric_before + (compilations() - before)
    assert split.metric("stejax_request_latency_seconds_count") >= 8 * len(sizes)


def test_metrics_carry_the_documented_names_and_no_inputs(split, artifacts, caplog):
    caplog.set_level(logging.DEBUG)
    marker = 987654.25  # exact in float32; no port, count or timestamp prints it this way
    x = artifacts.x[:2].copy()
    x[0, 5] = marker
    assert _post_json(split, x.tolist()).status_code == 200
    assert _post_json(split, [[marker, "text"]]).status_code == 422
    text = split.client.get("/metrics").text
    for name in (
        "stejax_request_latency_seconds_bucket",
        "stejax_request_latency_seconds_count",
        'stejax_requests_total{status="200"}',
        'stejax_requests_total{status="422"}',
        "stejax_invalid_inputs_total",
        "stejax_nonfinite_outputs_total",
        "stejax_compilations_total",
        "stejax_batch_fill_ratio_bucket",
        f'stejax_model_info{{version="{split.service.live.version}"}} 1.0',
    ):
        assert name in text, name
    for shown in ("987654.25", "9.8765425e"):
        assert shown not in text and shown not in caplog.text


def test_admin_endpoints_are_off_without_a_token(split):
    assert split.client.post("/admin/reload", json={"artifact": "x"}).status_code == 404
    assert split.client.post("/admin/rollback").status_code == 404
    assert split.client.get("/admin/status").status_code == 404


# ----------------------------------------------------------------------------- micro-batching


def _batching_service(artifacts, wait_ms: float) -> Service:
    # Batching is under test here, not the gate.
    passed = type("Passed", (), {"passed": True, "failures": ()})()
    source = ArtifactSource(artifacts.a, gate=lambda path: passed)
    return Service(source, ServeConfig(buckets=(1, 8), max_rows=8, batch_wait_ms=wait_ms))


def _reader(body: bytes, delay: float = 0.0):
    async def read() -> bytes:
        await asyncio.sleep(delay)
        return body

    return read


def _batch_fill(service: Service, stat: str) -> float:
    """The ``_count`` (executions) or ``_sum`` (fill ratios) of ``stejax_batch_fill_ratio``."""
    return next(s.value for s in service.metrics.batch_fill.collect()[0].samples if s.name.endswith(stat))


def _with_ready(service: Service, scenario) -> None:
    async def run():
        await service.start()
        try:
            while not service.ready:
                assert service.state != "failed", service.failure
                await asyncio.sleep(0.02)
            await scenario()
        finally:
            await service.stop()

    asyncio.run(run())


@pytest.mark.parametrize("wait_ms", [1000.0, 0.0])
def test_requests_arriving_one_by_one_are_gathered_within_the_wait(artifacts, reference, wait_ms):
    # Six requests announced together whose bodies arrive 40 ms apart: with a 1 s wait the
    # first is held for the others (one execution of 6 rows in bucket 8); with no wait they are
    # not gathered into one (each goes alone unless a scheduling stall of 40 ms lets two queue).
    service = _batching_service(artifacts, wait_ms)
    bodies = [json.dumps({"inputs": artifacts.x[i : i + 1].tolist()}).encode() for i in range(6)]

    async def scenario():
        before = _batch_fill(service, "_count")
        readers = (_reader(body, 0.04 * i) for i, body in enumerate(bodies))
        results = await asyncio.gather(*(service.predict(read, "application/json") for read in readers))
        for i, (_, prediction) in enumerate(results):
            np.testing.assert_array_equal(prediction.logits, reference[7][0][i : i + 1])
        if wait_ms:
            assert [p.bucket for _, p in results] == [8] * 6
            assert _batch_fill(service, "_count") == before + 1
        else:
            assert _batch_fill(service, "_count") - before >= 2

    _with_ready(service, scenario)


def test_concurrent_requests_share_a_bucket_and_a_lone_one_does_not_wait(artifacts, reference):
    service = _batching_service(artifacts, 1000.0)
    bodies = [json.dumps({"inputs": artifacts.x[i : i + 1].tolist()}).encode() for i in range(6)]

    async def scenario():
        count = _batch_fill(service, "_count")
        results = await asyncio.gather(*(service.predict(_reader(b), "application/json") for b in bodies))
        for i, (_, prediction) in enumerate(results):
            assert prediction.bucket == 8
            np.testing.assert_array_equal(prediction.logits, reference[7][0][i : i + 1])
        assert _batch_fill(service, "_count") == count + 1
        assert _batch_fill(service, "_sum") == pytest.approx(6 / 8)
        start = time.perf_counter()
        _, prediction = await service.predict(_reader(bodies[0]), "application/json")
        assert prediction.bucket == 1 and time.perf_counter() - start < 0.5  # nobody else on the way

    _with_ready(service, scenario)
