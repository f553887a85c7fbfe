"""``/healthz``, ``/readyz`` and ``/metrics``."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

__all__ = ["health_router"]


def health_router(is_ready: Callable[[], bool]) -> APIRouter:
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

    @router.get(
        "/metrics",
        summary="Prometheus metrics (text exposition format).",
        response_class=Response,
        responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
    )
    async def prometheus() -> Response:
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    return router
