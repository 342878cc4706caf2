"""Hot swap over real HTTP: a tampered candidate refused while traffic goes on, a good one swapped, rollback.

One server per module with an admin token, serving artifact ``a``. Traffic runs
in threads during every reload and rollback; every answer must be a 200 from a
model that was live at some point, and its logits must be that model's.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import NamedTuple

import httpx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import serve_support as support
from serve_support import ADMIN
from stejax.artifacts import Registry, gate
from stejax.serve import (
    ArtifactSource,
    Busy,
    RegistrySource,
    ServeConfig,
    ServedModel,
    Service,
    compilations,
    create_app,
)

BUCKETS = (1, 8)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    return support.build_artifacts(tmp_path_factory)


@pytest.fixture(scope="module")
def logits_of(artifacts):
    """version -> the bare jitted logits of the first 8 rows."""
    out = {}
    for path in (artifacts.a, artifacts.b):
        model = support.load(path)
        out[model.version] = np.asarray(jax.jit(model.apply)(model.weights, artifacts.x[:8]))
    return out


@pytest.fixture(scope="module")
def held_load():
    return HeldLoad()


@pytest.fixture(scope="module")
def server(artifacts, held_load):
    """``stejax serve --artifact a``: the real loader (whose check a test may hold) and the real release gate."""
    config = ServeConfig(buckets=BUCKETS, max_rows=16, batch_wait_ms=1.0, admin_token=support.ADMIN_TOKEN)
    with support.serving(create_app(ArtifactSource(artifacts.a, load=held_load), config)) as running:
        yield running


# Each traffic thread answers this many requests before the admin call, while the candidate is being checked
# (where the test holds the check) and after the call returned: counted, never a wall-clock window, so a
# slow or loaded machine only makes the test take longer. The timeout only bounds a server that hangs.
ANSWERS_EACH = 3
LIVENESS_TIMEOUT_S = 120.0


class Answer(NamedTuple):
    thread: int
    phase: int  # the traffic's phase when the request was sent (see Traffic.mark)
    status: int
    version: str | None
    logits: np.ndarray | None


class Traffic:
    """Threads posting requests until stopped; records every answer with the phase its request was sent in.

    Phase 0 is before the admin call; :meth:`mark` starts the next phase. Entering the block waits until
    every thread has had ``ANSWERS_EACH`` answers; leaving it starts a last phase (the admin call has
    returned) and waits until every thread has had ``ANSWERS_EACH`` answers to requests sent in it.
    """

    def __init__(self, server, x: np.ndarray, threads: int = 3):
        self.server, self.x, self.threads = server, x, threads
        self.answers: list[Answer] = []
        self.errors: list[BaseException] = []
        self.phase = 0
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(k,)) for k in range(threads)]

    def _run(self, k: int) -> None:
        with httpx.Client(base_url=self.server.url, timeout=60) as client:
            i = 0
            while not self._stop.is_set():
                n = 1 + (i + k) % 8
                i += 1
                phase = self.phase  # read before sending: a request sent after mark() belongs to the new phase
                try:
                    response = client.post("/v1/predict", json={"inputs": self.x[:n].tolist()})
                    body = response.json()
                    logits = np.asarray(body["logits"], np.float32) if response.status_code == 200 else None
                    answer = Answer(k, phase, response.status_code, body.get("model_version"), logits)
                except Exception as error:  # a transport error or a body that is not the API's: the check fails
                    with self._changed:
                        self.errors.append(error)
                        self._changed.notify_all()
                    continue
                with self._changed:
                    self.answers.append(answer)
                    self._changed.notify_all()

    def mark(self) -> int:
        """Start the next phase; requests sent from now on belong to it. Returns its number."""
        with self._changed:
            self.phase += 1
            return self.phase

    def count(self, phase: int) -> list[int]:
        """Per thread, the answers to requests sent in ``phase``."""
        return [sum(1 for a in self.answers if a.thread == k and a.phase == phase) for k in range(self.threads)]

    def answered_by(self, phase: int) -> list[list[str | None]]:
        """Per thread, in order, the versions that answered requests sent in ``phase``."""
        return [[a.version for a in self.answers if a.thread == k and a.phase == phase] for k in range(self.threads)]

    def wait(self, phase: int) -> None:
        """Until every thread has had ``ANSWERS_EACH`` answers to requests sent in ``phase``."""
        with self._changed:
            done = self._changed.wait_for(
                lambda: self.errors or min(self.count(phase)) >= ANSWERS_EACH, timeout=LIVENESS_TIMEOUT_S
            )
            counts = self.count(phase)
        assert not self.errors, self.errors[:3]
        assert done, f"phase {phase}: answers per thread {counts}; expected {ANSWERS_EACH} each"

    def __enter__(self):
        for thread in self._threads:
            thread.start()
        self.wait(0)  # some answers before the admin call
        return self

    def __exit__(self, exc_type, *exc):
        try:
            if exc_type is None:
                self.wait(self.mark())  # and some to requests sent after it returned
        finally:
            self._stop.set()
            for thread in self._threads:
                thread.join(timeout=60)

    def check(self, logits_of, versions: set[str], *, final: str) -> list[str]:
        """Every answer a 200 from one of ``versions`` with that version's logits; the versions in order seen.

        Each thread sends one request at a time, so its answers are in request
        order; across threads they are not (a request in flight at the swap
        finishes on the old model, possibly after another thread's first answer
        from the new one). Every thread must see the versions in one common order,
        and every request sent after the admin call returned is answered by ``final``.
        """
        assert not self.errors, self.errors[:3]
        for phase in (0, self.phase):
            assert min(self.count(phase)) >= ANSWERS_EACH, (phase, self.count(phase))
        per_thread: dict[int, list[str]] = {}
        for k, phase, status, version, logits in self.answers:
            assert status == 200 and version in versions, (status, version)
            np.testing.assert_array_equal(logits, logits_of[version][: len(logits)])
            if phase == self.phase:
                assert version == final, f"a request sent after the admin call returned was answered by {version}"
            seen = per_thread.setdefault(k, [])
            if not seen or seen[-1] != version:
                seen.append(version)
        longest = max(per_thread.values(), key=len)
        for seen in per_thread.values():
            start = longest.index(seen[0])
            assert seen == longest[start : start + len(seen)], per_thread
        return longest


class HeldLoad:
    """The real loader (:func:`serve_support.load`), which holds the check of a chosen candidate until traffic answered.

    ``hold(path, traffic)``: the next load of ``path`` (the first step of its check, in the service's admin
    thread) starts a new traffic phase and waits until every thread has had ``ANSWERS_EACH`` answers to
    requests sent in it, then loads: those answers were given while the candidate was being checked.
    """

    def __init__(self):
        self.held: tuple[Path, Traffic] | None = None
        self.phase: int | None = None

    def hold(self, path: Path, traffic: Traffic) -> None:
        self.held, self.phase = (Path(path), traffic), None

    def __call__(self, path):
        if self.held is not None and Path(path) == self.held[0]:
            traffic = self.held[1]
            self.held, self.phase = None, traffic.mark()
            try:
                traffic.wait(self.phase)
            except AssertionError:
                pass  # the test counts this phase's answers itself and fails with the counts
        return support.load(path)


def _status(server) -> dict:
    return server.client.get("/admin/status", headers=ADMIN).json()


def test_admin_needs_the_token(server):
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": support.ADMIN_TOKEN},
        {"Authorization": "Basic " + support.ADMIN_TOKEN},
    ):
        for method, path in (("POST", "/admin/reload"), ("POST", "/admin/rollback"), ("GET", "/admin/status")):
            response = server.client.request(method, path, headers=headers, json={"artifact": "x"})
            assert response.status_code == 401
            assert response.headers["www-authenticate"] == "Bearer"
            assert response.json() == {"error": "admin: expected Authorization: Bearer <admin token>."}


@pytest.mark.parametrize("body", [b"", b"{", b'{"path": "x"}', b'{"artifact": 3}', b'{"artifact": ""}', b"[]"])
def test_reload_needs_an_artifact_path(server, body):
    response = server.client.post("/admin/reload", content=body, headers=ADMIN)
    assert response.status_code == 422
    assert response.json() == {"error": 'admin/reload: expected {"artifact": "<artifact directory on the server>"}.'}


def test_reload_refuses_an_oversized_body_with_413_like_predict(server):
    body = json.dumps({"artifact": "x" * (64 * 1024)}).encode()
    response = server.client.post("/admin/reload", content=body, headers=ADMIN)
    assert response.status_code == 413
    assert response.json() == {"error": f"admin/reload: body: {len(body)} bytes exceed the limit of 65536 bytes."}


def test_tampered_refused_good_swapped_then_rolled_back_while_traffic_continues(
    server, artifacts, logits_of, held_load
):
    version_a = server.service.live.version
    version_b = support.load(artifacts.b).version
    assert version_a != version_b

    # A tampered candidate: refused with the reason, nothing changes, traffic never notices. Its check is
    # held until every traffic thread has had answers from a meanwhile: a keeps serving while it is refused.
    with Traffic(server, artifacts.x) as traffic:
        held_load.hold(artifacts.tampered, traffic)
        response = server.client.post("/admin/reload", json={"artifact": str(artifacts.tampered)}, headers=ADMIN)
    assert held_load.phase is not None, "the tampered candidate was never loaded"
    during = traffic.answered_by(held_load.phase)
    assert all(v[:ANSWERS_EACH] == [version_a] * ANSWERS_EACH for v in during), during
    assert response.status_code == 422
    refused = response.json()
    assert refused["status"] == "refused" and refused["model_version"] == version_a
    assert any("sha256" in failure for failure in refused["failures"]), refused
    assert traffic.check(logits_of, {version_a}, final=version_a) == [version_a]
    assert server.metric("stejax_reloads_total", 'outcome="refused"') == 1
    assert server.metric("stejax_model_info", f'version="{version_a}"') == 1
    assert _status(server)["last_swap"]["swapped"] is False

    # A missing directory: refused too.
    response = server.client.post("/admin/reload", json={"artifact": str(artifacts.a / "nope")}, headers=ADMIN)
    assert response.status_code == 422 and server.service.live.version == version_a

    # A good candidate: swapped atomically; a answers while b is checked, then answers switch to b once, never back.
    with Traffic(server, artifacts.x) as traffic:
        held_load.hold(artifacts.b, traffic)
        response = server.client.post("/admin/reload", json={"artifact": str(artifacts.b)}, headers=ADMIN)
    assert response.status_code == 200, response.text
    assert response.json() == {"status": "swapped", "model_version": version_b, "previous_version": version_a}
    during = traffic.answered_by(held_load.phase)
    assert all(v[:ANSWERS_EACH] == [version_a] * ANSWERS_EACH for v in during), during
    assert traffic.check(logits_of, {version_a, version_b}, final=version_b) == [version_a, version_b]
    assert server.metric("stejax_model_info", f'version="{version_b}"') == 1
    assert server.metric("stejax_model_info", f'version="{version_a}"') == 0
    assert _status(server)["previous_versions"] == [version_a]

    # Rollback: back to a, at once (a is still compiled), while traffic goes on.
    compiled = compilations()
    with Traffic(server, artifacts.x) as traffic:
        response = server.client.post("/admin/rollback", headers=ADMIN)
    assert response.status_code == 200
    assert response.json() == {"status": "swapped", "model_version": version_a, "previous_version": version_b}
    assert traffic.check(logits_of, {version_a, version_b}, final=version_a) == [version_b, version_a]
    assert compilations() == compiled
    assert server.metric("stejax_reloads_total", 'outcome="rolled_back"') == 1

    # Nothing further back: refused, a stays.
    response = server.client.post("/admin/rollback", headers=ADMIN)
    assert response.status_code == 422
    assert response.json()["failures"] == [f"no previous verified artifact: {version_a} is the first served"]
    assert server.metric("stejax_reloads_total", 'outcome="rollback_refused"') == 1
    assert server.client.get("/readyz").json()["model_version"] == version_a


# ----------------------------------------------------------------------------- the service, without HTTP


class _BlockingGate:
    """The real gate, its verdict held until released: a reload in progress for as long as the test wants."""

    def __init__(self):
        self.entered, self.release = threading.Event(), threading.Event()

    def __call__(self, path):
        report = gate(path)
        self.entered.set()
        assert self.release.wait(60)
        return report


def test_one_swap_at_a_time_and_in_flight_requests_finish_on_the_old_model(artifacts):
    blocking = _BlockingGate()
    first = {"done": False}

    def gate_after_start(path):
        if not first["done"]:
            first["done"] = True
            return gate(path)
        return blocking(path)

    config = ServeConfig(buckets=(1, 8), max_rows=8)
    service = Service(ArtifactSource(artifacts.a, gate=gate_after_start), config)
    body = json.dumps({"inputs": artifacts.x[:1].tolist()}).encode()

    async def at_once() -> bytes:
        return body

    async def scenario():
        # A slow upload: admitted (its model fixed) before the swap, its body complete only after it.
        uploaded = asyncio.Event()

        async def slow_upload() -> bytes:
            await uploaded.wait()
            return body

        await service.start()
        try:
            while not service.ready:
                assert service.state != "failed", service.failure
                await asyncio.sleep(0.02)
            version_a = service.live.version
            in_flight = asyncio.create_task(service.predict(slow_upload, "application/json"))
            reload = asyncio.create_task(service.reload(artifacts.b))
            while not blocking.entered.is_set():
                await asyncio.sleep(0.01)
            with pytest.raises(Busy, match="a reload or rollback is running"):
                await service.reload(artifacts.b)
            with pytest.raises(Busy, match="a reload or rollback is running"):
                await service.rollback()
            model, _ = await service.predict(at_once, "application/json")
            assert model.version == version_a  # the gate is still deciding
            blocking.release.set()
            result = await reload
            assert result.swapped and result.version != version_a
            model, _ = await service.predict(at_once, "application/json")
            assert model.version == result.version
            assert not in_flight.done()
            uploaded.set()
            model, prediction = await in_flight
            assert model.version == version_a and prediction.logits.shape == (1, 10)
        finally:
            await service.stop()

    asyncio.run(scenario())


def test_a_non_finite_output_is_refused_and_counted():
    # A model that overflows float32 for large inputs (the exported models clip, so they cannot).
    model = ServedModel("overflow", lambda w, x: jnp.exp(x[:, :3] * w), np.float32(1.0), (4,), 3)

    class _Source:
        description = "a synthetic model"

        def first(self):
            return model

    with support.serving(create_app(_Source(), ServeConfig(buckets=(2,), max_rows=2))) as server:
        ok = server.client.post("/v1/predict", json={"inputs": [[1.0] * 4]})
        assert ok.status_code == 200 and ok.json()["model_version"] == "overflow"
        response = server.client.post("/v1/predict", json={"inputs": [[1.0] * 4, [100.0] * 4]})
        assert response.status_code == 422
        assert response.json()["error"] == (
            "outputs: the model's logits are not finite for 1 row(s), the first row 1; "
            "expected inputs within the range the model was trained on."
        )
        assert server.metric("stejax_nonfinite_outputs_total") == 1
        assert server.metric("stejax_invalid_inputs_total") == 0


def test_a_failed_start_is_reported_by_readyz(artifacts):
    source = ArtifactSource(artifacts.tampered)
    app = create_app(source, ServeConfig(buckets=(1,), max_rows=1))
    with support.serving(app, expect_ready=False) as server:
        ready = server.client.get("/readyz")
        assert ready.status_code == 503 and ready.json()["status"] == "failed"
        assert "sha256" in ready.json()["detail"]
        assert server.client.get("/healthz").status_code == 200
        response = server.client.post("/v1/predict", json={"inputs": [[0.0] * 64]})
        assert response.status_code == 503 and response.headers["retry-after"] == "1"
        assert response.json() == {"error": "not ready: failed; see /readyz."}


# ----------------------------------------------------------------------------- registry mode


def test_registry_mode_promotes_refuses_and_rolls_back_through_the_registry(artifacts, tmp_path):
    registry = Registry(tmp_path / "registry")
    version_a = registry.promote(artifacts.a).artifact.id
    config = ServeConfig(buckets=(1, 8), max_rows=8, admin_token=support.ADMIN_TOKEN)
    with support.serving(create_app(RegistrySource(registry), config)) as server:
        assert server.client.get("/readyz").json()["model_version"] == version_a
        assert _status(server)["source"] == f"registry {tmp_path / 'registry'}"

        response = server.client.post("/admin/reload", json={"artifact": str(artifacts.tampered)}, headers=ADMIN)
        assert response.status_code == 422 and response.json()["model_version"] == version_a
        assert any("artifact" in failure and "sha256" in failure for failure in response.json()["failures"])
        assert registry.current_id() == version_a

        response = server.client.post("/admin/reload", json={"artifact": str(artifacts.b)}, headers=ADMIN)
        assert response.status_code == 200, response.text
        version_b = response.json()["model_version"]
        assert registry.current_id() == version_b != version_a
        assert server.service.live.model.path == registry.path_of(version_b)  # the registry's verified copy

        response = server.client.post("/admin/rollback", headers=ADMIN)
        assert response.status_code == 200 and response.json()["model_version"] == version_a
        assert registry.current_id() == version_a

        response = server.client.post("/admin/rollback", headers=ADMIN)
        assert response.status_code == 422 and "no previous artifact" in response.json()["failures"][0]
        assert server.client.get("/readyz").json()["model_version"] == version_a
        assert server.metric("stejax_reloads_total", 'outcome="refused"') == 1
        assert server.metric("stejax_reloads_total", 'outcome="rollback_refused"') == 1


def test_registry_mode_without_a_current_artifact_is_not_ready(tmp_path):
    app = create_app(RegistrySource(Registry(tmp_path / "empty")), ServeConfig(buckets=(1,), max_rows=1))
    with support.serving(app, expect_ready=False) as server:
        ready = server.client.get("/readyz")
        assert ready.status_code == 503
        assert "the registry has no current artifact; promote one first" in ready.json()["detail"]
