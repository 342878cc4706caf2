"""Latency and throughput of `stejax serve` against the bare jitted model, in one run.

Run from the repository root:

    .venv/bin/python benchmarks/serve.py [--artifact DIR] [--seconds 3] [--clients 1,8,64] [--rows 1] [--json PATH]

Without ``--artifact`` it first trains the digits MLP briefly (w8a8, 2 epochs)
and exports it to a temporary artifact. Then, in this order:

* bare: the artifact's ``apply`` under ``jax.jit`` on a ``(rows, 64)`` float32
  input, called back to back with ``block_until_ready`` (after a warm-up call);
  its p50 is the denominator of every ratio;
* the service: ``stejax serve DIR`` in a subprocess on loopback, once
  with micro-batching on (the default 2 ms wait) and once off; for each number
  of concurrent clients, that many keep-alive HTTP/1.1 connections each post one
  JSON request of ``rows`` rows at a time, as fast as answers come back, for
  ``--seconds`` (after a warm-up of a quarter of that, not counted).

The clients are a few lines of asyncio over raw sockets (not an HTTP library),
so that the load generator costs little next to the server; both share the
machine's cores, which the table's header states. Latency is from the first
byte sent to the last byte of the answer; throughput is answers per second.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import platform
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
from rich.console import Console
from rich.table import Table

_CONTENT_LENGTH = re.compile(rb"content-length:\s*(\d+)", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class Cell:
    """One measured configuration."""

    mode: str  # "bare", "batching on", "batching off"
    clients: int
    requests: int
    errors: int
    seconds: float
    p50_ms: float
    p90_ms: float
    p99_ms: float

    @property
    def throughput(self) -> float:
        return self.requests / self.seconds


def _cell(mode: str, clients: int, latencies: list[float], errors: int, seconds: float) -> Cell:
    ms = np.asarray(latencies) * 1e3
    p50, p90, p99 = np.percentile(ms, [50, 90, 99]) if len(ms) else (np.nan,) * 3
    return Cell(mode, clients, len(latencies), errors, seconds, float(p50), float(p90), float(p99))


def _make_artifact(workdir: Path) -> Path:
    from stejax import regress
    from stejax.artifacts import save_artifact
    from stejax.export import export_run
    from stejax.train import TrainConfig, train

    run = workdir / "run"
    train(TrainConfig(model="mlp", preset="w8a8", epochs=2, patience=None), out_dir=run)
    artifact = save_artifact(export_run(run), workdir / "artifact")
    regress.record(artifact.path)  # the gate that `stejax serve` runs at start-up asks for it
    return artifact.path


def _example_rows(artifact, rows: int) -> np.ndarray:
    from stejax.data import load_digits

    digits = load_digits()
    x = np.asarray(digits.x[:rows], np.float32)
    return x.reshape(rows, *artifact.model.input_shape)


def _bare(artifact, x: np.ndarray, seconds: float) -> Cell:
    model = artifact.model
    weights = jax.device_put(model.weights)
    fn = jax.jit(model.apply)
    device_x = jax.device_put(x)
    jax.block_until_ready(fn(weights, device_x))
    latencies = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        jax.block_until_ready(fn(weights, device_x))
        latencies.append(time.perf_counter() - t0)
    return _cell("bare jit", 1, latencies, 0, time.perf_counter() - start)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def _server(artifact_dir: Path, *, micro_batching: bool):
    port = _free_port()
    command = [
        sys.executable,
        "-c",
        "from stejax.cli import main; main()",
        "serve",
        str(artifact_dir),
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--micro-batching" if micro_batching else "--no-micro-batching",
    ]
    env = {k: v for k, v in os.environ.items() if k != "STEJAX_ADMIN_TOKEN"}
    process = subprocess.Popen(command, env=env)
    try:
        deadline = time.monotonic() + 300
        while not _ready(port):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"stejax serve did not become ready (exit code {process.poll()}).")
            time.sleep(0.2)
        yield port
    finally:
        process.terminate()
        process.wait(timeout=30)


def _ready(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(b"GET /readyz HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
            return sock.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


async def _client(port: int, request: bytes, warm_until: float, stop_at: float, latencies: list, errors: list):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while (now := time.perf_counter()) < stop_at:
            writer.write(request)
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            await reader.readexactly(int(_CONTENT_LENGTH.search(head)[1]))
            if now >= warm_until:
                latencies.append(time.perf_counter() - now)
                if not head.startswith(b"HTTP/1.1 200"):
                    errors.append(head.split(b"\r\n", 1)[0])
    finally:
        writer.close()
        await writer.wait_closed()


async def _load(port: int, request: bytes, clients: int, seconds: float) -> tuple[list[float], int, float]:
    latencies: list[float] = []
    errors: list[bytes] = []
    warm_until = time.perf_counter() + seconds / 4
    stop_at = warm_until + seconds
    await asyncio.gather(*(_client(port, request, warm_until, stop_at, latencies, errors) for _ in range(clients)))
    return latencies, len(errors), seconds


def _request(x: np.ndarray) -> bytes:
    body = json.dumps({"inputs": x.reshape(len(x), -1).tolist()}).encode()
    head = (
        f"POST /v1/predict HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--artifact", type=Path, default=None, help="An artifact directory (default: train one).")
    parser.add_argument("--seconds", type=float, default=3.0, help="Measured seconds per cell.")
    parser.add_argument("--clients", default="1,8,64", help="Concurrent clients, comma-separated.")
    parser.add_argument("--rows", type=int, default=1, help="Rows per request.")
    parser.add_argument("--json", type=Path, default=None, help="Also write the cells as JSON here.")
    args = parser.parse_args(argv)
    clients = [int(c) for c in args.clients.split(",")]

    from stejax.artifacts import load_artifact

    console = Console(width=150)
    with tempfile.TemporaryDirectory() as tmp:
        artifact_dir = args.artifact
        if artifact_dir is None:
            console.print("training and exporting the digits MLP (w8a8, 2 epochs) ...")
            artifact_dir = _make_artifact(Path(tmp))
        artifact = load_artifact(artifact_dir)
        x = _example_rows(artifact, args.rows)
        request = _request(x)
        bare = _bare(artifact, x, args.seconds)
        cells = [bare]
        for micro_batching in (True, False):
            mode = "batching on" if micro_batching else "batching off"
            with _server(artifact_dir, micro_batching=micro_batching) as port:
                for n in clients:
                    latencies, errors, seconds = asyncio.run(_load(port, request, n, args.seconds))
                    cells.append(_cell(mode, n, latencies, errors, seconds))

    table = Table(
        title=(
            f"stejax serve vs bare jit: {args.rows} row(s) per request, {artifact.model.input_shape} float32; "
            f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores shared by server and clients, "
            f"jax {jax.__version__} on {jax.default_backend()}"
        )
    )
    for column in ("mode", "clients", "requests", "errors", "req/s", "p50 ms", "p90 ms", "p99 ms", "p50 / bare p50"):
        table.add_column(column, justify="left" if column == "mode" else "right")
    for cell in cells:
        table.add_row(
            cell.mode,
            str(cell.clients),
            str(cell.requests),
            str(cell.errors),
            f"{cell.throughput:,.0f}",
            f"{cell.p50_ms:.3f}",
            f"{cell.p90_ms:.3f}",
            f"{cell.p99_ms:.3f}",
            f"{cell.p50_ms / bare.p50_ms:.1f}x",
        )
    console.print(table)
    if args.json is not None:
        rows = [{**dataclasses.asdict(c), "throughput": c.throughput, "ratio": c.p50_ms / bare.p50_ms} for c in cells]
        args.json.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
        console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
