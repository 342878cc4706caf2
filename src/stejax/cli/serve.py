"""``stejax serve``: the HTTP inference service. Needs the extra ``stejax[serve]``."""

from __future__ import annotations

import signal
import socket
import threading
from pathlib import Path

import click
from rich.console import Console
from rich.text import Text

from stejax.cli._common import artifact_dir_argument, deprecated_option, directory, existing_file, registry_option

__all__ = ["serve_command"]

_ADMIN_TOKEN_ENV = "STEJAX_ADMIN_TOKEN"


@click.command("serve", short_help="Serve an artifact over HTTP, every batch size compiled first.")
@artifact_dir_argument(exists=True, optional=True)
@deprecated_option("--artifact", "artifact_dir", type=directory(exists=True))
@registry_option(
    required=False,
    exists=True,
    help="Serve this registry's current artifact; reloads promote through it, rollback rolls it back.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to bind.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True, help="The port to bind.")
@click.option(
    "--buckets",
    default="1,8,32,128",
    show_default=True,
    metavar="N,...",
    help="The batch sizes compiled at start-up; a request runs in the smallest bucket that holds it.",
)
@click.option(
    "--oversize",
    type=click.Choice(["split", "refuse"]),
    default="split",
    show_default=True,
    help="Requests above the largest bucket: run in chunks, or refuse with 413.",
)
@click.option(
    "--max-rows", type=click.IntRange(min=1), default=1024, show_default=True, help="The most rows in one request."
)
@click.option(
    "--max-body-bytes",
    type=click.IntRange(min=1),
    default=4 * 1024 * 1024,
    show_default=True,
    help="The largest request body in bytes; larger ones get 413.",
)
@click.option(
    "--batch-wait-ms",
    type=click.FloatRange(min=0),
    default=2.0,
    show_default=True,
    help="The longest a request waits for others to share its bucket.",
)
@click.option(
    "--micro-batching/--no-micro-batching",
    default=True,
    show_default=True,
    help="Gather concurrent requests into one bucket (waiting up to --batch-wait-ms), or run each on its own.",
)
@click.option(
    "--max-connections",
    type=click.IntRange(min=1),
    default=256,
    show_default=True,
    help="Concurrent connections; beyond them uvicorn answers 503.",
)
@click.option(
    "--admin-token-file",
    type=existing_file(),
    default=None,
    help=f"The admin bearer token (else ${_ADMIN_TOKEN_ENV}); without one the admin endpoints are off.",
)
@click.option(
    "--public-key",
    "public_keys",
    multiple=True,
    type=existing_file(),
    help="Serve only artifacts signed by this PEM public key (repeatable; checked at start-up and on every reload, "
    "before the gate; needs stejax[sign]).",
)
@deprecated_option("--trust-key", "public_keys", multiple=True, type=existing_file())
@click.option(
    "--log-level",
    type=click.Choice(["critical", "error", "warning", "info", "debug"]),
    default="info",
    show_default=True,
    help="The least severe log messages printed (the server's and the service's).",
)
def serve_command(
    artifact_dir: Path | None,
    registry_dir: Path | None,
    host: str,
    port: int,
    buckets: str,
    oversize: str,
    max_rows: int,
    max_body_bytes: int,
    batch_wait_ms: float,
    micro_batching: bool,
    max_connections: int,
    admin_token_file: Path | None,
    public_keys: tuple[Path, ...],
    log_level: str,
) -> None:
    """Serve a verified artifact over HTTP: POST /v1/predict, GET /v1/model, /metrics, /healthz, /readyz, /admin/*.

    Serves the artifact directory ARTIFACT, or the current artifact of
    --registry DIR (reloads then promote through it).

    Every bucket is compiled at start-up (no request ever compiles); /readyz
    answers 200 once that is done and the artifact passed its gate (which
    needs its regression set: stejax regress record ARTIFACT). GET /v1/model gives
    the live model's version, input contract and the service's bounds. Bound
    to 127.0.0.1 unless --host says otherwise; --port 0 takes a free port and
    prints it. The admin endpoints (reload, rollback, status) are on only with
    a token from --admin-token-file or $STEJAX_ADMIN_TOKEN.

    A start-up artifact that the gate refuses: without admin endpoints nothing
    could ever replace it, so serve exits with code 1 and the reason. With
    admin endpoints on, serve stays up and not ready (/healthz 200, /readyz 503
    with the reason) until POST /admin/reload brings an artifact that passes.
    """
    import logging
    import os

    import uvicorn

    from stejax.serve import ArtifactSource, RegistrySource, ServeConfig, create_app

    if (artifact_dir is None) == (registry_dir is None):
        raise click.UsageError("give exactly one of ARTIFACT or --registry DIR.")
    try:
        bucket_sizes = tuple(int(b) for b in buckets.split(","))
    except ValueError:
        raise click.BadParameter(f"expected comma-separated ints, e.g. 1,8,32,128; got {buckets!r}.") from None
    token: str | None
    if admin_token_file is not None:
        token = admin_token_file.read_text(encoding="utf-8").strip()
        if not token:
            raise click.BadParameter(f"{admin_token_file} is empty.", param_hint="--admin-token-file")
    else:
        token = os.environ.get(_ADMIN_TOKEN_ENV, "").strip() or None
    try:
        config = ServeConfig(
            buckets=bucket_sizes,
            oversize=oversize,
            max_rows=max_rows,
            max_body_bytes=max_body_bytes,
            micro_batching=micro_batching,
            batch_wait_ms=batch_wait_ms,
            admin_token=token,
        )
    except ValueError as error:
        raise click.BadParameter(str(error)) from None
    source: ArtifactSource | RegistrySource
    try:
        if artifact_dir is not None:
            source = ArtifactSource(artifact_dir, trusted_keys=public_keys)
        else:
            from stejax.artifacts import Registry

            assert registry_dir is not None  # exactly one of the two, checked above
            source = RegistrySource(Registry(registry_dir), trusted_keys=public_keys)
    except ValueError as error:  # a --public-key that is not an EC public key
        raise click.BadParameter(str(error), param_hint="--public-key") from None
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if port == 0:
        port = _free_port(host)
    console = Console()
    console.print(
        Text(
            f"stejax serve: {source.description} on http://{host}:{port} (buckets {list(config.buckets)}, "
            f"admin {'on' if token else 'off'}); /readyz turns 200 when every bucket is compiled"
        )
    )
    app = create_app(source, config)
    done = threading.Event()
    if token is None:
        # Without admin endpoints a refused start-up artifact can never be replaced: stop the server.
        threading.Thread(target=_stop_when_refused, args=(app.state.service, done), daemon=True).start()
    try:
        uvicorn.run(
            app,
            host=host,
            port=port,
            log_level=log_level,
            limit_concurrency=max_connections,
            server_header=False,
        )
    finally:
        done.set()
    failure = app.state.service.failure
    if token is None and failure:
        raise click.ClickException(
            f"{source.description} was refused at start-up: {failure.rstrip('.')}. No admin endpoint is on "
            "(no admin token), so nothing could replace it; exiting."
        )


def _free_port(host: str) -> int:
    """A port the OS reports free on ``host`` (``--port 0``), so that the banner can print it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _stop_when_refused(service, done: threading.Event) -> None:
    """Ask uvicorn to shut down gracefully once start-up has failed.

    While it runs, uvicorn's server handles SIGTERM with its ``handle_exit``; setting that
    server's ``should_exit`` is what the handler does, without a signal (which uvicorn
    would raise again after shutting down, and which would end the process there).
    """
    while not done.wait(0.05):
        if service.state == "failed":
            server = getattr(signal.getsignal(signal.SIGTERM), "__self__", None)
            if server is not None and hasattr(server, "should_exit"):
                server.should_exit = True
            return
