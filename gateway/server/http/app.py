"""The HTTP edge's application: error translation, metrics, and the routers.

Errors are translated once, here: a :class:`~gateway.wire.errors.TidegateError` becomes
``{"error": err.to_dict()}`` with its HTTP status (and ``Retry-After`` when it carries
``retry_after_ms``); request validation failures become 400 ``INVALID_REQUEST``; anything
unexpected is logged and answered 500 ``INTERNAL`` (:func:`gateway.server.calls.wire_error`).
The quota, metering and metrics work of each data-plane route is
:class:`~gateway.server.calls.DataCalls`', shared with the gRPC edge.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi_offline import FastAPIOffline
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway import metrics
from gateway.config import Settings
from gateway.core import StreamTables
from gateway.server.calls import DataCalls, wire_error
from gateway.server.http.bodies import HTTP_REASONS, error_response, invalid
from gateway.server.http.deps import TenantOf, gate_tenant_of
from gateway.server.http.groups import groups_router
from gateway.server.http.guard import BodyGuard
from gateway.server.http.health import endpoints_router, health_router, metrics_router
from gateway.server.http.iceberg import PREFIX as ICEBERG_PREFIX
from gateway.server.http.iceberg import iceberg_error
from gateway.server.http.keyed import keyed_router
from gateway.server.http.models import ErrorResponse
from gateway.server.http.records import records_router
from gateway.server.http.scans import scans_router
from gateway.server.http.tables import tables_router
from gateway.tenancy import Gate, OpenGate, Tenancy
from gateway.wire.errors import TidegateError

__all__ = ["CLIENT_CLOSED_REQUEST", "create_app"]

log = logging.getLogger("tidegate.server")

#: The status a request whose client went away before its body was read is counted
#: under (nginx's "client closed request"); no client ever receives it.
CLIENT_CLOSED_REQUEST = 499

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def _is_iceberg(path: str) -> bool:
    """Whether ``path`` is the Iceberg catalog's, whose errors have the Iceberg spec's shape."""
    return path == ICEBERG_PREFIX or path.startswith(ICEBERG_PREFIX + "/")


class _InternalErrors:
    """Answers 500 ``INTERNAL`` to anything that escaped the handlers, and logs it.

    Starlette's catch-all handler would sit outside every middleware (so the metrics
    middleware would never see the 500) and re-raise into the server; this one sits just
    outside the routing, under the metrics middleware.

    A client that disconnects before its body is read (Starlette's ``ClientDisconnect``)
    is not the gateway's error: nothing of the request was applied, there is nobody to
    answer, so it is one INFO line and the request is counted under
    :data:`CLIENT_CLOSED_REQUEST` (the server drops that answer: the connection is gone).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_wrapper(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        except ClientDisconnect:
            log.info(
                "the client of %s %s disconnected before its body was read; nothing applied",
                scope.get("method"),
                scope.get("path"),
            )
            if not started:
                gone = {"error": {"reason": "CLIENT_CLOSED_REQUEST", "message": "client gone"}}
                await JSONResponse(gone, CLIENT_CLOSED_REQUEST)(scope, receive, send)
        except Exception as exc:
            err = wire_error(exc, f"{scope.get('method')} {scope.get('path')}")
            if started:
                raise  # too late for an error body: let the server drop the connection
            if _is_iceberg(str(scope.get("path", ""))):
                await iceberg_error(err.http_status, err.message)(scope, receive, send)
                return
            await error_response(err)(scope, receive, send)


class _Metrics:
    """``tidegate_http_requests_total`` and the latency histogram, by route template."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or metrics.UNMATCHED_ROUTE
            method = str(scope.get("method", "")).upper()
            metrics.observe_http_request(
                template,
                method if method in _METHODS else "OTHER",
                status,
                time.perf_counter() - start,
            )


# --------------------------------------------------------------------------------------
# The application


def create_app(
    service: StreamTables,
    settings: Settings,
    *,
    tenant_of: TenantOf | None = None,
    ready: Callable[[], bool] | None = None,
    tenancy: Gate | None = None,
) -> FastAPI:
    """The HTTP edge over ``service``.

    Args:
        service: the stream-table service both edges share.
        settings: gateway settings (request limits, long-poll wait, default tenant).
        tenant_of: resolves a request's tenant; default: the gate's (the API key's tenant
            with a :class:`Tenancy`, ``settings.tenant`` without one).
        ready: answers ``/readyz``; default always ready.
        tenancy: authentication, quotas, metering and, for a :class:`Tenancy`, the
            ``/v1/admin`` routes; served gateways always have it. None: one open tenant.
    """
    gate = tenancy or OpenGate(settings.tenant)
    calls = DataCalls(service, gate)
    # /docs (Swagger UI) and /redoc with their scripts and styles served from the
    # fastapi-offline package (under /static-offline-docs), so they work with no internet;
    # validatorUrl=None keeps Swagger UI from sending the document to an online validator.
    app = FastAPIOffline(
        title="Tidegate",
        summary="One stream-table over a hot log tier and cold Iceberg tables.",
        version="1",
        responses={500: {"model": ErrorResponse, "description": "Internal error"}},
        swagger_ui_parameters={"validatorUrl": None},
    )
    app.state.tenant_of = tenant_of or gate_tenant_of(gate)
    app.state.gate = gate
    app.state.max_body_bytes = settings.server.max_body_bytes
    app.state.iceberg = False

    async def handle_tidegate_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, TidegateError)
        return error_response(exc)

    async def handle_validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return error_response(invalid(exc.errors()))

    async def handle_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        if _is_iceberg(request.url.path):
            # Unknown routes and methods of the catalog answer in the spec's shape too.
            what = f"{request.method} {request.url.path[:200]}"
            if not request.app.state.iceberg and exc.status_code == 404:
                message = (
                    f"this gateway serves no Iceberg catalog ({what}): it needs the cold "
                    "tier and cold.rest_catalog.enabled=true"
                )
                return iceberg_error(404, message, headers=exc.headers)
            message = {
                404: f"no such route in the Iceberg catalog: {what}; GET "
                f"{ICEBERG_PREFIX}/v1/config lists the endpoints served",
                405: f"method not allowed: {what}",
            }.get(exc.status_code, str(exc.detail))
            return iceberg_error(exc.status_code, message, headers=exc.headers)
        reason = HTTP_REASONS.get(exc.status_code, "INVALID_REQUEST")
        body = {"error": {"reason": reason, "message": str(exc.detail)}}
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    app.add_exception_handler(TidegateError, handle_tidegate_error)
    app.add_exception_handler(RequestValidationError, handle_validation_error)
    app.add_exception_handler(StarletteHTTPException, handle_http_error)
    app.add_middleware(_InternalErrors)
    app.add_middleware(BodyGuard)
    app.add_middleware(_Metrics)

    app.include_router(health_router(ready or (lambda: True)))
    app.include_router(endpoints_router(settings.server))
    if not settings.server.metrics_port:
        app.include_router(metrics_router(settings.server))
    if isinstance(gate, Tenancy):
        from gateway.server.http.admin import admin_router
        from gateway.server.http.console import add_console

        app.include_router(admin_router(gate))
        add_console(app, gate, calls)
        if service.cold is not None and settings.cold.rest_catalog.enabled:
            from gateway.server.http.iceberg import iceberg_router

            app.include_router(iceberg_router(gate, calls))
            app.state.iceberg = True
    for router in (tables_router, records_router, keyed_router, groups_router, scans_router):
        app.include_router(router(calls))
    if isinstance(gate, Tenancy) and service.cold is not None:
        from gateway.server.http.files import files_router

        app.include_router(files_router(calls))
    return app
