"""Shared by the test_serve* modules: real artifacts from tiny training runs, and uvicorn on loopback.

The artifacts are built once per test session (a cached builder, not a
fixture, so that every module gets the same directory): two tiny MLP runs
(seeds 0 and 1, one epoch each) exported with the real export path, and a
tampered copy of the first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import uvicorn

ADMIN_TOKEN = "test-admin-token-0123456789"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@dataclasses.dataclass(frozen=True)
class Running:
    """A live server: its base URL, a client bound to it, and the app (``app.state.service``)."""

    url: str
    client: httpx.Client
    app: object

    @property
    def service(self):
        return self.app.state.service

    def metric(self, name: str, labels: str = "") -> float:
        """One sample of ``GET /metrics``, e.g. ``metric("stejax_requests_total", 'status="200"')``; 0 if absent."""
        text = self.client.get("/metrics").text
        pattern = "^" + re.escape(name) + (r"\{" + re.escape(labels) + r"\}" if labels else "") + r" (\S+)$"
        found = re.search(pattern, text, re.MULTILINE)
        return float(found[1]) if found else 0.0


@contextlib.contextmanager
def serving(app, *, ready_timeout: float = 120.0, expect_ready: bool = True) -> Iterator[Running]:
    """Run ``app`` under uvicorn in a thread on a free loopback port until the block ends.

    Waits for /readyz to say ready (or, with ``expect_ready=False``, to say anything but "starting").
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="uvicorn-test", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    client = httpx.Client(base_url=url, timeout=60.0)
    try:
        wait_ready(client, ready_timeout, expect_ready)
        yield Running(url, client, app)
    finally:
        client.close()
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def wait_ready(client: httpx.Client, timeout: float, expect_ready: bool = True) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            response = client.get("/readyz")
            status = response.json().get("status")
            if status != "starting" and not expect_ready:
                return
            if status == "ready":
                return
            if status == "failed":
                raise AssertionError(f"the service failed to start: {response.json()}")
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"not ready after {timeout} s")
        time.sleep(0.05)


# ----------------------------------------------------------------------------- artifacts

import shutil  # noqa: E402

import numpy as np  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Artifacts:
    a: Path  # seed 0
    b: Path  # seed 1: a different, valid artifact
    tampered: Path  # a copy of a with one byte of its weights flipped
    x: np.ndarray  # raw float32 digits rows, (60, 64)


_BUILT: dict[str, Artifacts] = {}


def build_artifacts(tmp_path_factory) -> Artifacts:
    if "artifacts" not in _BUILT:
        root = tmp_path_factory.mktemp("serve-artifacts")
        a, b = (_exported(root, seed) for seed in (0, 1))
        tampered = root / "tampered"
        shutil.copytree(a, tampered)
        weights = tampered / "weights.safetensors"
        data = bytearray(weights.read_bytes())
        data[-3] ^= 0x01
        weights.write_bytes(bytes(data))
        from stejax.data import load_digits

        x = np.asarray(load_digits().x[:60], np.float32)
        _BUILT["artifacts"] = Artifacts(a, b, tampered, x)
    return _BUILT["artifacts"]


def _exported(root: Path, seed: int) -> Path:
    """A tiny w4a4 MLP trained for one epoch, exported, saved and given its regression set: the real path."""
    from stejax import regress
    from stejax.artifacts import save_artifact
    from stejax.export import export_run
    from stejax.train import TrainConfig, train

    run = root / f"run-seed{seed}"
    config = TrainConfig(model="mlp", preset="w4a4", hidden=(16,), dropout=0.1, batch_size=32, epochs=1, seed=seed)
    train(config, out_dir=run)
    out = root / f"artifact-seed{seed}"
    save_artifact(export_run(run), out)
    regress.record(out)
    return out


def load(path):
    """The served model of a verified artifact (:func:`stejax.artifacts.load_artifact`)."""
    from stejax.artifacts import load_artifact
    from stejax.serve import served_model_from_artifact

    return served_model_from_artifact(load_artifact(path))


def source(path):
    """The source ``stejax serve --artifact`` uses: the real loader and the real release gate."""
    from stejax.serve import ArtifactSource

    return ArtifactSource(path)
