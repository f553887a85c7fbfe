"""``/healthz``, ``/readyz`` and ``/metrics``."""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Callable

from fastapi import APIRouter, FastAPI, Request, Security
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from gateway import metrics
from gateway.config import ServerConfig
from gateway.server.http.deps import METRICS_TOKEN
from gateway.wire.errors import Unauthenticated

__all__ = ["endpoints_router", "health_router", "metrics_app", "metrics_router"]


def metrics_router(server: ServerConfig) -> APIRouter:
    """``GET /metrics``, behind ``server.metrics_token`` when it is set."""
    token = server.metrics_token
    # Declared in the OpenAPI document only when a token is required.
    router = APIRouter(
        tags=["health"], dependencies=[Security(METRICS_TOKEN)] if token is not None else []
    )

    @router.get(
        "/metrics",
        summary="Prometheus metrics (text exposition format).",
        response_class=Response,
        responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
    )
    async def prometheus(request: Request) -> Response:
        if token is not None:
            sent = request.headers.get("authorization", "")
            if not hmac.compare_digest(sent.encode(), f"Bearer {token}".encode()):
                raise Unauthenticated("/metrics needs 'authorization: Bearer <metrics token>'")
        await asyncio.to_thread(metrics.refresh)
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    return router


def metrics_app(server: ServerConfig) -> FastAPI:
    """The app of ``server.metrics_port``: /metrics alone."""
    from gateway.server.http.bodies import error_response
    from gateway.wire.errors import TidegateError

    app = FastAPI(title="Tidegate metrics", openapi_url=None, docs_url=None, redoc_url=None)

    async def handle(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, TidegateError)
        return error_response(exc)

    app.add_exception_handler(TidegateError, handle)
    app.include_router(metrics_router(server))
    return app


def health_router(is_ready: Callable[[], bool]) -> APIRouter:
    """``/healthz`` and ``/readyz``."""
    router = APIRouter(tags=["health"])

    @router.get("/healthz", summary="Liveness: the process answers.")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @router.get(
        "/readyz",
        summary="Readiness: 200 when serving, 503 while starting or draining.",
        responses={503: {"description": "Not ready"}},
    )
    async def readyz() -> Response:
        if is_ready():
            return JSONResponse({"status": "ready"})
        return JSONResponse({"status": "not ready"}, status_code=503)

    return router


def endpoints_router(server: ServerConfig) -> APIRouter:
    """``GET /v1/endpoints``: the gateway's other edges as the caller reaches them."""
    router = APIRouter(tags=["health"])

    @router.get(
        "/v1/endpoints",
        summary="The gRPC and Flight addresses of this gateway, for a client given its HTTP URL.",
    )
    async def endpoints(request: Request) -> dict[str, str | None]:
        """``{"grpc": "host:port", "flight": "grpc://host:port"}`` (null: edge disabled),
        on the host the caller dialled: a Spark job given the gateway's HTTP URL as its
        ``endpoint`` runs the JVM connector over HTTP or the Python source over gRPC with
        the same options. Public, as ``/healthz`` is: it names only addresses."""
        host = request.url.hostname or "127.0.0.1"
        shown = f"[{host}]" if ":" in host else host
        flight = server.flight_advertise or (
            f"grpc://{shown}:{server.flight_port}" if server.flight_port else None
        )
        return {
            "grpc": f"{shown}:{server.grpc_port}" if server.grpc_port else None,
            "flight": flight,
        }

    return router
