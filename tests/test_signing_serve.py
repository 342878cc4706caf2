"""A running service that trusts only named keys: untrusted candidates refused while the old model keeps serving.

One server per module (``stejax serve A --public-key ours.pub.pem``,
with an admin token), serving a signed artifact. Each tampered candidate of
:data:`signing_support.CASES` is refused by ``POST /admin/reload`` before the
gate runs, with its reason, counted as ``stejax_reloads_total{outcome="untrusted"}``,
while requests sent in a loop all along get answers from the old model.
"""

from __future__ import annotations

import threading

import httpx
import pytest

import serve_support as support
from serve_support import ADMIN
from signing_support import CASES, make_key, signed_copy
from stejax.artifacts import Registry
from stejax.serve import ArtifactSource, RegistrySource, ServeConfig, create_app

CONFIG = ServeConfig(buckets=(1,), max_rows=1, admin_token=support.ADMIN_TOKEN)


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    folder = tmp_path_factory.mktemp("keys")
    return {name: make_key(folder, name) for name in ("ours", "theirs")}


@pytest.fixture(scope="module")
def served(tmp_path_factory, keys):
    return signed_copy(tmp_path_factory.mktemp("served") / "a", keys["ours"][0])


@pytest.fixture(scope="module")
def server(served, keys):
    source = ArtifactSource(served, trusted_keys=[keys["ours"][1]])
    with support.serving(create_app(source, CONFIG)) as running:
        yield running


class Requests:
    """A thread posting one-row requests until stopped; keeps (status, version) of every answer."""

    def __init__(self, server):
        self.server, self.answers, self._stop = server, [], threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self):
        with httpx.Client(base_url=self.server.url, timeout=60) as client:
            while not self._stop.is_set():
                response = client.post("/v1/predict", json={"inputs": [[0.0] * 64]})
                self.answers.append((response.status_code, response.json().get("model_version")))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=60)


def test_each_untrusted_candidate_is_refused_while_the_old_model_serves(server, keys, tmp_path):
    # Whatever is live (the served artifact, or a trusted candidate swapped in by another test) stays live.
    version = server.service.live.version
    untrusted, refused = (server.metric("stejax_reloads_total", f'outcome="{o}"') for o in ("untrusted", "refused"))
    with Requests(server) as requests:
        for n, (case, (tamper, _, file, fragment)) in enumerate(CASES.items(), 1):
            candidate = signed_copy(tmp_path / f"candidate-{n}", keys["ours"][0], n=n)
            tamper(candidate, keys, tmp_path / f"t{n}")
            response = server.client.post("/admin/reload", json={"artifact": str(candidate)}, headers=ADMIN)
            assert response.status_code == 422, (case, response.text)
            body = response.json()
            assert body["status"] == "refused" and body["model_version"] == version, case
            (failure,) = body["failures"]
            assert failure.startswith(f"signature: {candidate}: {file}: ") and fragment in failure, (case, failure)
            assert server.metric("stejax_reloads_total", 'outcome="untrusted"') == untrusted + n
    assert len(requests.answers) > 5
    assert set(requests.answers) == {(200, version)}
    assert server.metric("stejax_reloads_total", 'outcome="refused"') == refused
    assert server.client.get("/readyz").json()["model_version"] == version


def test_a_candidate_signed_by_the_trusted_key_is_swapped(server, keys, tmp_path):
    live = server.service.live.version
    swapped = server.metric("stejax_reloads_total", 'outcome="swapped"')
    candidate = signed_copy(tmp_path / "good", keys["ours"][0], n=20)
    response = server.client.post("/admin/reload", json={"artifact": str(candidate)}, headers=ADMIN)
    assert response.status_code == 200, response.text
    assert response.json() == {
        "status": "swapped",
        "model_version": support.load(candidate).version,
        "previous_version": live,
    }
    assert support.load(candidate).version != live
    assert server.metric("stejax_reloads_total", 'outcome="swapped"') == swapped + 1


def test_an_unsigned_artifact_is_not_served_at_start_up(keys, tmp_path):
    from artifact_runs import copy_artifact

    root = copy_artifact("w4a4", tmp_path / "unsigned")
    source = ArtifactSource(root, trusted_keys=[keys["ours"][1]])
    with support.serving(create_app(source, CONFIG), expect_ready=False) as server:
        ready = server.client.get("/readyz")
        assert ready.status_code == 503 and ready.json()["status"] == "failed"
        assert f"{root}: model.sig: no signature" in ready.json()["detail"]


def test_a_file_that_is_not_a_public_key_fails_when_the_source_is_made(keys):
    with pytest.raises(ValueError, match=r"ours\.pem: expected a PEM public key \(that is a private key"):
        ArtifactSource("anywhere", trusted_keys=[keys["ours"][0]])


def test_registry_mode_refuses_what_the_registry_does_not_trust_and_rolls_back_only_to_eligible(keys, tmp_path):
    registry = Registry(tmp_path / "registry")
    registry.trust(keys["ours"][1])
    registry.trust(keys["theirs"][1])
    first = registry.promote(signed_copy(tmp_path / "a", keys["theirs"][0]), estimator_dtypes=("float32",))
    with support.serving(create_app(RegistrySource(registry), CONFIG)) as server:
        version_a = first.artifact.id
        assert server.client.get("/readyz").json()["model_version"] == version_a
        registry.untrust(keys["theirs"][1])

        # Signed by a key the registry no longer trusts: refused by its promote, before the gate, as untrusted.
        other = signed_copy(tmp_path / "b", keys["theirs"][0], n=31)
        response = server.client.post("/admin/reload", json={"artifact": str(other)}, headers=ADMIN)
        assert response.status_code == 422 and response.json()["model_version"] == version_a
        assert "which this policy does not trust" in response.json()["failures"][0]
        assert server.metric("stejax_reloads_total", 'outcome="untrusted"') == 1

        good = signed_copy(tmp_path / "c", keys["ours"][0], n=32)
        response = server.client.post("/admin/reload", json={"artifact": str(good)}, headers=ADMIN)
        assert response.status_code == 200, response.text
        version_c = response.json()["model_version"]

        # The previous artifact was signed by the removed key: rollback refuses and c keeps serving.
        response = server.client.post("/admin/rollback", headers=ADMIN)
        assert response.status_code == 422
        assert "is not eligible under the trust policy" in response.json()["failures"][0]
        assert server.client.get("/readyz").json()["model_version"] == version_c
        assert registry.current_id() == version_c
