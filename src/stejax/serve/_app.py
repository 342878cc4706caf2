"""The HTTP face of :class:`Service`: a Starlette app with predict, probes, metrics and admin routes."""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import time
import traceback
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from stejax.serve._config import ServeConfig
from stejax.serve._inputs import RequestError
from stejax.serve._service import Busy, Service, SwapResult
from stejax.serve._sources import ModelSource

__all__ = ["create_app"]

logger = logging.getLogger("stejax.serve")


# An admin reload body is one short JSON object naming a directory.
_ADMIN_BODY_BYTES = 64 * 1024


def _error(status: int, message: str, **headers: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers or None)


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refusing (413) as soon as it is known to exceed ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise RequestError(400, f"Content-Length {declared[:32]!r}; expected a byte count.")
        if int(declared) > limit:
            raise RequestError(413, f"body: {int(declared)} bytes exceed the limit of {limit} bytes.")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(413, f"body: more than the limit of {limit} bytes.")
        chunks.append(chunk)
    return b"".join(chunks)


def create_app(source: ModelSource, config: ServeConfig | None = None) -> Starlette:
    """The ``stejax serve`` application for ``source`` under ``config`` (default :class:`ServeConfig`).

    Routes:
      ``POST /v1/predict``: JSON ``{"inputs": [[...], ...]}`` or a ``.npy`` body
        (``Content-Type: application/x-npy``); answers ``{"model_version",
        "logits", "probabilities", "classes"}``.
      ``GET /v1/model``: the live model's contract and the service's bounds.
      ``GET /healthz``: 200 while the process answers.
      ``GET /readyz``: 200 once every bucket is compiled and the model passed
        its gate, 503 before (or if start-up failed, with the reason).
      ``GET /metrics``: Prometheus text format.
      ``POST /admin/reload`` (``{"artifact": "DIR"}``), ``POST /admin/rollback``,
        ``GET /admin/status``: only when ``config.admin_token`` is set, with
        ``Authorization: Bearer TOKEN``.

    The service (``app.state.service``) starts with the app's lifespan: the
    first model is verified and compiled in the background while ``/healthz``
    already answers.
    """
    config = config if config is not None else ServeConfig()
    service = Service(source, config)
    metrics = service.metrics

    async def predict(request: Request) -> Response:
        start = time.perf_counter()
        try:
            model, prediction = await service.predict(
                lambda: _read_body(request, config.max_body_bytes), request.headers.get("content-type")
            )
            payload = {
                "model_version": model.version,
                "logits": prediction.logits.tolist(),
                "probabilities": prediction.probabilities.tolist(),
                "classes": prediction.classes.tolist(),
            }
            response = Response(json.dumps(payload, allow_nan=False), media_type="application/json")
        except RequestError as error:
            if error.invalid_input:
                metrics.invalid_inputs.inc()
            headers = {"Retry-After": "1"} if error.status == 503 else {}
            response = _error(error.status, error.message, **headers)
        except ClientDisconnect:
            response = Response(status_code=499)  # nobody reads it; counted so the totals add up
        except Exception as error:  # a bug, not the client's doing: say so without details
            # The type and the place only: an exception's message could quote the inputs.
            where = traceback.extract_tb(error.__traceback__)[-1]
            logger.error("/v1/predict failed: %s at %s:%d", type(error).__name__, where.filename, where.lineno)
            response = _error(500, "internal error; see the server log.")
        elapsed = time.perf_counter() - start
        metrics.requests.labels(status=str(response.status_code)).inc()
        metrics.latency.observe(elapsed)
        # Status, time and the refusal's message (which names positions and kinds, never values).
        if logger.isEnabledFor(logging.DEBUG):
            detail = (
                f": {json.loads(bytes(response.body))['error']}"
                if response.status_code >= 400 and response.body
                else ""
            )
            logger.debug("/v1/predict %d in %.2f ms%s", response.status_code, elapsed * 1e3, detail)
        return response

    async def model_info(request: Request) -> Response:
        return JSONResponse(service.describe())

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "alive"})

    async def readyz(request: Request) -> Response:
        live = service.live  # ready exactly when a model is live
        if live is not None:
            return JSONResponse({"status": "ready", "model_version": live.version})
        body: dict[str, Any] = {"status": service.state}
        if service.failure:
            body["detail"] = service.failure
        return JSONResponse(body, status_code=503)

    async def metrics_route(request: Request) -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    routes = [
        Route("/v1/predict", predict, methods=["POST"]),
        Route("/v1/model", model_info, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics_route, methods=["GET"]),
    ]
    if config.admin_token is not None:
        routes += _admin_routes(service, config.admin_token.encode())

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        await service.start()
        try:
            yield
        finally:
            await service.stop()

    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.service = service
    return app


def _admin_routes(service: Service, token: bytes) -> list[Route]:
    def authorized(request: Request) -> bool:
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        # compare_digest: the time taken does not tell how much of the token was right.
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token)

    def refused_auth() -> Response:
        return _error(401, "admin: expected Authorization: Bearer <admin token>.", **{"WWW-Authenticate": "Bearer"})

    def swap_response(result: SwapResult) -> Response:
        body: dict[str, str | list[str] | None] = {
            "status": "swapped" if result.swapped else "refused",
            "model_version": result.version,
            "previous_version": result.previous,
        }
        if not result.swapped:
            body["failures"] = list(result.failures)
        return JSONResponse(body, status_code=200 if result.swapped else 422)

    async def reload(request: Request) -> Response:
        if not authorized(request):
            return refused_auth()
        try:
            body = await _read_body(request, _ADMIN_BODY_BYTES)
        except RequestError as error:  # too large (413) or a bad Content-Length (400), as for predict
            return _error(error.status, f"admin/reload: {error}")
        try:
            document = json.loads(body)
        except (ValueError, RecursionError):
            document = None
        path = document.get("artifact") if isinstance(document, dict) else None
        if not isinstance(path, str) or not path:
            return _error(422, 'admin/reload: expected {"artifact": "<artifact directory on the server>"}.')
        try:
            return swap_response(await service.reload(path))
        except Busy as error:
            return _error(409 if service.ready else 503, f"admin/reload: {error}.")

    async def rollback(request: Request) -> Response:
        if not authorized(request):
            return refused_auth()
        try:
            return swap_response(await service.rollback())
        except Busy as error:
            return _error(409 if service.ready else 503, f"admin/rollback: {error}.")

    async def status(request: Request) -> Response:
        if not authorized(request):
            return refused_auth()
        last = service.last_swap
        return JSONResponse(
            {
                **service.describe(),
                "source": service.source.description,
                "previous_versions": [c.version for c in service.history],
                "last_swap": None
                if last is None
                else {
                    "swapped": last.swapped,
                    "model_version": last.version,
                    "previous_version": last.previous,
                    "failures": list(last.failures),
                },
            }
        )

    return [
        Route("/admin/reload", reload, methods=["POST"]),
        Route("/admin/rollback", rollback, methods=["POST"]),
        Route("/admin/status", status, methods=["GET"]),
    ]
