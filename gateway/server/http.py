"""The HTTP edge (FastAPI): the stream-table operations under ``/v1``, health and metrics.

Bodies are JSON or Arrow IPC streams (``application/vnd.apache.arrow.stream``), chosen by
``Content-Type`` on appends and by ``Accept`` on reads. Errors are translated once, by the
handlers installed in :func:`create_app`: a :class:`~gateway.wire.errors.TidegateError` becomes
``{"error": err.to_dict()}`` with its HTTP status (and ``Retry-After`` when it carries
``retry_after_ms``); request validation failures become 400 ``INVALID_REQUEST``; anything
unexpected is logged and answered 500 ``INTERNAL``.

Every request resolves to one tenant through a single dependency (``Tenant``): with a
:class:`~gateway.tenancy.Tenancy` it authenticates the ``authorization: Bearer <key>``
header, charges the tenant's requests/s and holds one of its in-flight slots for the
request; without one (in-process tests) it asks the app's ``tenant_of`` resolver.
``/healthz``, ``/readyz``, ``/metrics`` and the OpenAPI document stay open; ``/v1/admin``
needs the operator key (see :mod:`gateway.server.http_admin`).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

import pyarrow as pa
from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway import metrics
from gateway.config import Settings
from gateway.core import ReadResult, StreamTables, TableView
from gateway.tenancy import Tenancy
from gateway.wire.codec import decode_stream, encode_stream
from gateway.wire.errors import (
    InvalidRequest,
    MalformedPayload,
    RequestTooLarge,
    TidegateError,
    UnsupportedMediaType,
)
from gateway.wire.jsonrows import batch_to_rows, parse_json, rows_to_batch
from gateway.wire.schema import fields_to_json
from gateway.wire.types import AppendRange

__all__ = [
    "ARROW_STREAM",
    "HEADER_HIGH_WATERMARK",
    "HEADER_NEXT_OFFSET",
    "create_app",
    "default_tenant_of",
]

log = logging.getLogger(__name__)

ARROW_STREAM = "application/vnd.apache.arrow.stream"
JSON = "application/json"
HEADER_NEXT_OFFSET = "Tidegate-Next-Offset"
HEADER_HIGH_WATERMARK = "Tidegate-High-Watermark"

#: Bodies (and results) at least this large are (de)serialised on a worker thread so the
#: event loop keeps serving other requests meanwhile.
_OFFLOAD_BYTES = 256 * 1024
_OFFLOAD_RECORDS = 2_000

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

T = TypeVar("T")


# --------------------------------------------------------------------------------------
# Tenancy
# --------------------------------------------------------------------------------------
def default_tenant_of(settings: Settings) -> Callable[[Request], str]:
    """The tenant resolver used until authentication lands: every request is
    ``settings.tenant``. The tenancy work replaces this one function (or passes its own
    ``tenant_of`` to :func:`create_app`)."""

    def tenant_of(request: Request) -> str:
        return settings.tenant

    return tenant_of


def tenancy_tenant_of(tenancy: Tenancy) -> Callable[[Request], Awaitable[str]]:
    """The resolver of a served gateway: the tenant of the request's API key."""

    async def tenant_of(request: Request) -> str:
        return await tenancy.tenant_of(request.headers.get("authorization"))

    return tenant_of


async def _request_tenant(request: Request) -> AsyncIterator[str]:
    """The one place a route learns its tenant: the app's ``tenant_of`` resolver, then
    (with tenancy) an in-flight slot of the tenant held until the route returns."""
    resolver: Callable[[Request], str | Awaitable[str]] = request.app.state.tenant_of
    found = resolver(request)
    tenant = await found if inspect.isawaitable(found) else found
    tenancy: Tenancy | None = request.app.state.tenancy
    if tenancy is None:
        yield tenant
        return
    follow = request.query_params.get("follow", "").lower() in ("true", "1", "yes", "on")
    async with tenancy.admit(tenant, follow=follow):
        yield tenant


# Annotated parameter types shared by the routes (module level, so FastAPI resolves them).
Tenant = Annotated[str, Depends(_request_tenant)]
Namespace = Annotated[str, Path(description="Namespace of the table.")]
Name = Annotated[str, Path(description="Table name.")]


# --------------------------------------------------------------------------------------
# Wire models (OpenAPI). Request models forbid unknown keys and do not coerce types.
# --------------------------------------------------------------------------------------
class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class FieldSpec(_Request):
    """One column of a table schema."""

    name: str = Field(description="Column name: a letter, then letters, digits or '_'.")
    type: str = Field(
        description="Arrow type name: int64, string, timestamp[us, tz=UTC], "
        "decimal128(10, 2), list<int32>, struct<a: int32, b: string>..."
    )
    nullable: bool = Field(True, description="Whether the column admits nulls.")


class CreateTableRequest(_Request):
    """``POST /v1/tables``."""

    namespace: str = Field(description="Namespace of the table, within the tenant.")
    name: str = Field(description="Table name, unique within the namespace.")
    schema_: list[FieldSpec] | dict[str, str] = Field(
        alias="schema",
        description="A list of fields, or the shorthand {column: type} (all nullable).",
    )
    partitions: int = Field(description="Number of partitions, fixed for the table's life.")
    key_columns: list[str] = Field(
        default_factory=list,
        description="Columns whose stable hash routes a row to a partition; empty: "
        "round-robin per batch.",
    )


class AppendRequest(_Request):
    """The JSON body of ``POST /v1/tables/{namespace}/{name}/records``."""

    rows: list[dict[str, Any]] = Field(
        description="Rows as objects holding every column of the table schema. Timestamps "
        "are ISO-8601 strings (with an offset for zoned columns) or integer microseconds, "
        "decimals strings or numbers, binary base64."
    )
    partition: int | None = Field(None, description="Write every row to this partition.")
    producer_id: str | None = Field(
        None, description="Idempotent producer id; goes with 'sequence'."
    )
    sequence: int | None = Field(
        None, description="Per-partition batch sequence of the producer; goes with producer_id."
    )


class ScanRequest(_Request):
    """The JSON body of ``POST /v1/tables/{namespace}/{name}/scan``."""

    columns: list[str] | None = Field(
        None, description="Columns to return (user or system columns); default all."
    )
    filter: str | None = Field(
        None,
        description="Row filter (SQL-like; see the README), e.g. "
        "\"id > 5 and name = 'x'\", \"ts >= '2024-01-01T00:00:00+00:00'\", "
        '"tag is null", "id in (1, 2)", "name like \'pre%\'".',
    )
    as_of: int | str | None = Field(
        None,
        description="A snapshot id or an ISO-8601 time: read only that Iceberg snapshot "
        "(the hot tier keeps no history, so recent untiered records are not included).",
    )
    limit: int | None = Field(None, ge=0, description="At most this many rows.")


class PlanRequest(_Request):
    """The JSON body of ``POST /v1/tables/{namespace}/{name}/plan``."""

    filter: str | None = Field(None, description="Row filter (same syntax as scan).")
    as_of: int | str | None = Field(None, description="A snapshot id or an ISO-8601 time.")


class PartitionInfo(BaseModel):
    partition: int
    earliest_offset: int = Field(description="Earliest offset still readable.")
    high_watermark: int = Field(description="Next offset to be assigned.")
    tiered_watermark: int = Field(description="Every offset below this is in Iceberg.")
    hot_bytes: int = Field(description="Bytes held by the hot tier.")
    lag_records: int = Field(description="Records not yet tiered (HW - T).")
    lag_bytes: int = Field(description="Estimated hot bytes of the records not yet tiered.")


class TableDescription(BaseModel):
    namespace: str
    name: str
    table_id: str = Field(description="Unique for the table's lifetime.")
    schema_: list[dict[str, Any]] = Field(alias="schema", description="The user schema.")
    partitions: int
    key_columns: list[str]
    created_at: str = Field(description="ISO-8601, UTC.")
    partition_info: list[PartitionInfo] | None = Field(
        None, description="Live offsets per partition (describe and create only)."
    )


class TableList(BaseModel):
    tables: list[TableDescription]


class AppendedRange(BaseModel):
    partition: int
    base_offset: int = Field(description="Offset of the first record of the range.")
    count: int
    duplicate: bool = Field(description="A retried idempotent batch: original offsets.")


class AppendResponse(BaseModel):
    ranges: list[AppendedRange]


class ReadResponse(BaseModel):
    records: list[dict[str, Any]] = Field(
        description="Records in offset order: the user columns then _partition, _offset, "
        "_timestamp."
    )
    next_offset: int = Field(description="Offset to read from next.")
    high_watermark: int = Field(description="The partition's high watermark at the read.")


class PartitionOffset(_Request):
    partition: int = Field(description="Partition number, 0..N-1.")
    offset: int = Field(description="Next offset the group will consume.")


class CommitOffsetsRequest(_Request):
    """``POST /v1/groups/{group}/tables/{namespace}/{name}/offsets``."""

    offsets: list[PartitionOffset] = Field(description="Committed offsets per partition.")


class GroupOffsets(BaseModel):
    group: str
    namespace: str
    name: str
    offsets: list[dict[str, int]] = Field(
        description="[{partition, offset}] for every partition the group has committed."
    )


class ErrorBody(BaseModel):
    model_config = ConfigDict(extra="allow")

    reason: str = Field(description="Stable machine-readable reason, e.g. TABLE_NOT_FOUND.")
    message: str = Field("", description="Human-readable explanation.")


class ErrorResponse(BaseModel):
    error: ErrorBody


_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "Invalid request"},
    401: {"model": ErrorResponse, "description": "No valid 'authorization: Bearer <key>'"},
    403: {"model": ErrorResponse, "description": "Tenant suspended, or the operator key"},
    404: {"model": ErrorResponse, "description": "No such table"},
    429: {"model": ErrorResponse, "description": "Over a quota; see Retry-After"},
    503: {"model": ErrorResponse, "description": "A backend is unavailable"},
}
_ARROW_BINARY = {"schema": {"type": "string", "format": "binary"}}
_WATERMARK_HEADERS = {
    HEADER_NEXT_OFFSET: {"description": "Offset to read from next.", "schema": {"type": "integer"}},
    HEADER_HIGH_WATERMARK: {
        "description": "The partition's high watermark at the read.",
        "schema": {"type": "integer"},
    },
}


# --------------------------------------------------------------------------------------
# Conversions
# --------------------------------------------------------------------------------------
def _iso(value: datetime) -> str:
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _describe(view: TableView, *, with_partitions: bool) -> dict[str, Any]:
    d = view.definition
    out: dict[str, Any] = {
        "namespace": d.namespace,
        "name": d.name,
        "table_id": d.table_id,
        "schema": fields_to_json(view.schema),
        "partitions": d.partitions,
        "key_columns": list(d.key_columns),
        "created_at": _iso(d.created_at),
    }
    if with_partitions:
        out["partition_info"] = [
            {
                "partition": p.partition,
                "earliest_offset": p.earliest_offset,
                "high_watermark": p.high_watermark,
                "tiered_watermark": p.tiered_watermark,
                "hot_bytes": p.hot_bytes,
                "lag_records": p.lag_records,
                "lag_bytes": p.lag_bytes,
            }
            for p in view.partitions
        ]
    return out


def _ranges(ranges: Sequence[AppendRange]) -> dict[str, Any]:
    return {
        "ranges": [
            {
                "partition": r.partition,
                "base_offset": r.base_offset,
                "count": r.count,
                "duplicate": r.duplicate,
            }
            for r in ranges
        ]
    }


def _media_type(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def _wants_arrow(accept: str | None) -> bool:
    """Whether ``Accept`` asks for Arrow (with a non-zero quality) — JSON otherwise."""
    for part in (accept or "").split(","):
        media, *params = (p.strip() for p in part.split(";"))
        if media.lower() != ARROW_STREAM:
            continue
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    return float(value) > 0
                except ValueError:
                    return False
        return True
    return False


def _validation_details(errors: Sequence[Any]) -> list[dict[str, str]]:
    """Pydantic/FastAPI errors as JSON-safe ``{"loc", "message", "type"}`` (no inputs)."""
    out = []
    for e in errors:
        loc = ".".join(str(x) for x in e.get("loc", ()))
        out.append({"loc": loc, "message": str(e.get("msg", "")), "type": str(e.get("type", ""))})
    return out


def _invalid(errors: Sequence[Any]) -> InvalidRequest:
    details = _validation_details(errors)
    summary = "; ".join(
        f"{d['loc']}: {d['message']}" if d["loc"] else d["message"] for d in details
    )
    return InvalidRequest(f"invalid request: {summary}", errors=details)


async def _maybe_offload(big: bool, fn: Callable[..., T], *args: Any) -> T:
    if big:
        return await run_in_threadpool(fn, *args)
    return fn(*args)


async def _read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing more than ``limit`` bytes.

    A declared ``Content-Length`` over the limit is refused before any byte is read; a
    chunked body is refused as soon as it passes the limit.

    Raises:
        RequestTooLarge: over ``limit``.
        InvalidRequest: a Content-Length that is not a number.
    """
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            length = int(declared)
        except ValueError:
            raise InvalidRequest(f"Content-Length {declared!r} is not an integer") from None
        if length > limit:
            raise RequestTooLarge(
                f"the body has {length} bytes; the limit is {limit}", limit=limit, size=length
            )
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestTooLarge(
                f"the body passed the limit of {limit} bytes", limit=limit, size=size
            )
        chunks.append(chunk)
    return b"".join(chunks)


def _pick(name: str, in_body: T | None, in_query: T | None) -> T | None:
    if in_body is not None and in_query is not None and in_body != in_query:
        raise InvalidRequest(
            f"{name!r} is given both in the body ({in_body!r}) and the query ({in_query!r})"
        )
    return in_body if in_body is not None else in_query


def _json_rows(body: bytes, table_schema: pa.Schema) -> tuple[pa.RecordBatch, AppendRequest]:
    parsed = parse_json(body)
    if not isinstance(parsed, dict):
        raise MalformedPayload("the JSON body must be an object with 'rows'")
    try:
        req = AppendRequest.model_validate(parsed)
    except ValidationError as exc:
        raise _invalid(exc.errors(include_url=False, include_input=False)) from None
    return rows_to_batch(req.rows, table_schema), req


def _read_response(result: ReadResult, arrow: bool) -> Response:
    headers = {
        HEADER_NEXT_OFFSET: str(result.next_offset),
        HEADER_HIGH_WATERMARK: str(result.high_watermark),
    }
    if arrow:
        body = encode_stream(result.batches, result.schema)
        return Response(body, media_type=ARROW_STREAM, headers=headers)
    content = {
        "records": batch_to_rows(result.batches),
        "next_offset": result.next_offset,
        "high_watermark": result.high_watermark,
    }
    return JSONResponse(content, headers=headers)


_END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"


async def _arrow_chunks(
    schema: pa.Schema, batches: AsyncIterator[pa.RecordBatch]
) -> AsyncIterator[bytes]:
    """An Arrow IPC stream, one chunk per batch: the schema message, each batch as an
    encapsulated message, then the end-of-stream marker."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema):
        pass
    header = bytes(sink.getvalue().to_pybytes())
    assert header.endswith(_END_OF_STREAM)
    yield header[: -len(_END_OF_STREAM)]
    async for batch in batches:
        metrics.record_read(batch.num_rows)
        yield bytes(batch.serialize().to_pybytes())
    yield _END_OF_STREAM


# --------------------------------------------------------------------------------------
# Error translation and metrics (pure ASGI: no buffering, works with streaming bodies)
# --------------------------------------------------------------------------------------
def _error_response(err: TidegateError) -> JSONResponse:
    headers = {}
    retry_after_ms = getattr(err, "retry_after_ms", None)
    if retry_after_ms is not None:
        headers["Retry-After"] = str(max(0, math.ceil(retry_after_ms / 1000)))
    return JSONResponse({"error": err.to_dict()}, status_code=err.http_status, headers=headers)


_HTTP_REASONS = {
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    406: "NOT_ACCEPTABLE",
    413: "REQUEST_TOO_LARGE",
    415: "UNSUPPORTED_MEDIA_TYPE",
}


class _InternalErrors:
    """Answers 500 ``INTERNAL`` to anything that escaped the handlers, and logs it.

    Starlette's catch-all handler would sit outside every middleware (so the metrics
    middleware would never see the 500) and re-raise into the server; this one sits just
    outside the routing, under the metrics middleware.
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
        except Exception:
            log.exception("unexpected error in %s %s", scope.get("method"), scope.get("path"))
            if started:
                raise  # too late for an error body: let the server drop the connection
            response = JSONResponse(
                {"error": {"reason": "INTERNAL", "message": "internal error; see the gateway log"}},
                status_code=500,
            )
            await response(scope, receive, send)


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
# --------------------------------------------------------------------------------------
def create_app(
    service: StreamTables,
    settings: Settings,
    *,
    tenant_of: Callable[[Request], str | Awaitable[str]] | None = None,
    ready: Callable[[], bool] | None = None,
    tenancy: Tenancy | None = None,
) -> FastAPI:
    """The HTTP edge over ``service``.

    Args:
        service: the stream-table service both edges share.
        settings: gateway settings (request limits, long-poll wait, default tenant).
        tenant_of: resolves a request's tenant; default: the API key's tenant with
            ``tenancy``, else :func:`default_tenant_of`.
        ready: answers ``/readyz``; default always ready.
        tenancy: authentication, quotas, metering and the ``/v1/admin`` routes; served
            gateways always have it.
    """
    is_ready = ready or (lambda: True)
    server = settings.server

    app = FastAPI(
        title="Tidegate",
        summary="One stream-table over a hot log tier and cold Iceberg tables.",
        version="1",
        responses={500: {"model": ErrorResponse, "description": "Internal error"}},
    )
    if tenant_of is None:
        tenant_of = (
            tenancy_tenant_of(tenancy) if tenancy is not None else default_tenant_of(settings)
        )
    app.state.tenant_of = tenant_of
    app.state.tenancy = tenancy

    async def handle_tidegate_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, TidegateError)
        return _error_response(exc)

    async def handle_validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return _error_response(_invalid(exc.errors()))

    async def handle_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        reason = _HTTP_REASONS.get(exc.status_code, "INVALID_REQUEST")
        body = {"error": {"reason": reason, "message": str(exc.detail)}}
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    app.add_exception_handler(TidegateError, handle_tidegate_error)
    app.add_exception_handler(RequestValidationError, handle_validation_error)
    app.add_exception_handler(StarletteHTTPException, handle_http_error)
    app.add_middleware(_InternalErrors)
    app.add_middleware(_Metrics)

    # Health ----------------------------------------------------------------------------
    @app.get("/healthz", tags=["health"], summary="Liveness: the process answers.")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get(
        "/readyz",
        tags=["health"],
        summary="Readiness: 200 when serving, 503 while starting or draining.",
        responses={503: {"description": "Not ready"}},
    )
    async def readyz() -> Response:
        if is_ready():
            return JSONResponse({"status": "ready"})
        return JSONResponse({"status": "not ready"}, status_code=503)

    @app.get(
        "/metrics",
        tags=["health"],
        summary="Prometheus metrics (text exposition format).",
        response_class=Response,
        responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
    )
    async def prometheus() -> Response:
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    if tenancy is not None:
        from gateway.server.http_admin import admin_router

        app.include_router(admin_router(tenancy))

    # Tables ----------------------------------------------------------------------------
    @app.post(
        "/v1/tables",
        tags=["tables"],
        status_code=201,
        response_model=TableDescription,
        responses={**_ERRORS, 409: {"model": ErrorResponse, "description": "Name taken"}},
        summary="Create a table.",
    )
    async def create_table(body: CreateTableRequest, tenant: Tenant) -> JSONResponse:
        spec: Any = (
            dict(body.schema_)
            if isinstance(body.schema_, dict)
            else [f.model_dump() for f in body.schema_]
        )
        if tenancy is not None:
            await tenancy.check_create_table(tenant, body.partitions)
        view = await service.create_table(
            tenant, body.namespace, body.name, spec, body.partitions, body.key_columns
        )
        return JSONResponse(_describe(view, with_partitions=True), status_code=201)

    @app.get(
        "/v1/tables",
        tags=["tables"],
        response_model=TableList,
        responses=_ERRORS,
        summary="List the tenant's tables, optionally of one namespace.",
    )
    async def list_tables(
        tenant: Tenant,
        namespace: Annotated[str | None, Query(description="Only this namespace.")] = None,
    ) -> JSONResponse:
        views = await service.list_tables(tenant, namespace)
        return JSONResponse({"tables": [_describe(v, with_partitions=False) for v in views]})

    @app.get(
        "/v1/tables/{namespace}/{name}",
        tags=["tables"],
        response_model=TableDescription,
        responses=_ERRORS,
        summary="Describe a table with its live per-partition offsets.",
    )
    async def describe_table(namespace: Namespace, name: Name, tenant: Tenant) -> JSONResponse:
        view = await service.describe_table(tenant, namespace, name)
        return JSONResponse(_describe(view, with_partitions=True))

    @app.delete(
        "/v1/tables/{namespace}/{name}",
        tags=["tables"],
        status_code=204,
        response_class=Response,
        responses=_ERRORS,
        summary="Drop a table and its hot data.",
    )
    async def drop_table(namespace: Namespace, name: Name, tenant: Tenant) -> Response:
        await service.drop_table(tenant, namespace, name)
        return Response(status_code=204)

    # Records ---------------------------------------------------------------------------
    @app.post(
        "/v1/tables/{namespace}/{name}/records",
        tags=["records"],
        response_model=AppendResponse,
        responses={
            **_ERRORS,
            409: {"model": ErrorResponse, "description": "Out-of-order producer sequence"},
            413: {"model": ErrorResponse, "description": "Body over max_request_bytes"},
            415: {"model": ErrorResponse, "description": "Neither JSON nor Arrow"},
            429: {"model": ErrorResponse, "description": "Throttled; see Retry-After"},
        },
        summary="Append rows (JSON or an Arrow IPC stream).",
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    JSON: {"schema": AppendRequest.model_json_schema()},
                    ARROW_STREAM: _ARROW_BINARY,
                },
            }
        },
    )
    async def append(
        request: Request,
        namespace: Namespace,
        name: Name,
        tenant: Tenant,
        partition: Annotated[
            int | None, Query(description="Write every row to this partition.")
        ] = None,
        producer_id: Annotated[str | None, Query(description="Idempotent producer id.")] = None,
        sequence: Annotated[
            int | None, Query(description="Producer's per-partition batch sequence.")
        ] = None,
    ) -> JSONResponse:
        """Append rows; answers the offset range assigned in each partition written.

        With ``Content-Type: application/json`` the body is ``{"rows": [...],
        "partition"?, "producer_id"?, "sequence"?}``. With
        ``Content-Type: application/vnd.apache.arrow.stream`` the body is an Arrow IPC
        stream and ``partition``, ``producer_id``, ``sequence`` are query parameters (a
        JSON body may use either place, not both with different values).

        Validation happens before anything is stored: a rejected request writes nothing.
        """
        media = _media_type(request.headers.get("content-type"))
        if media not in (JSON, ARROW_STREAM):
            raise UnsupportedMediaType(
                f"Content-Type {media or '(none)'!r} is not supported; send {JSON!r} or "
                f"{ARROW_STREAM!r}",
                supported=f"{JSON},{ARROW_STREAM}",
            )
        body = await _read_body(request, server.max_request_bytes)
        charge = (
            tenancy.append_charge(tenant, len(body))
            if tenancy is not None
            else contextlib.nullcontext()
        )
        async with charge:
            big = len(body) >= _OFFLOAD_BYTES
            batches: list[pa.RecordBatch]
            if media == ARROW_STREAM:
                _, batches = await _maybe_offload(big, decode_stream, body)
            else:
                # The cached definition (no live offsets): JSON rows are typed by its schema.
                table = await service.table(tenant, namespace, name)
                batch, req = await _maybe_offload(big, _json_rows, body, table.schema)
                batches = [batch]
                partition = _pick("partition", req.partition, partition)
                producer_id = _pick("producer_id", req.producer_id, producer_id)
                sequence = _pick("sequence", req.sequence, sequence)
            ranges = await service.append(
                tenant,
                namespace,
                name,
                batches,
                partition=partition,
                producer_id=producer_id,
                sequence=sequence,
            )
        records = sum(r.count for r in ranges)
        metrics.record_append(records, len(body))
        if tenancy is not None:
            tenancy.record_append(tenant, records, len(body))
        return JSONResponse(_ranges(ranges))

    @app.get(
        "/v1/tables/{namespace}/{name}/partitions/{partition}/records",
        tags=["records"],
        response_model=ReadResponse,
        responses={
            200: {"content": {ARROW_STREAM: _ARROW_BINARY}, "headers": _WATERMARK_HEADERS},
            **_ERRORS,
            416: {
                "model": ErrorResponse,
                "description": "Offset out of range; the body carries earliest and latest",
            },
        },
        summary="Read one partition from an offset (JSON or Arrow; optional long poll).",
    )
    async def read(
        request: Request,
        namespace: Namespace,
        name: Name,
        partition: Annotated[int, Path(description="Partition number, 0..N-1.")],
        tenant: Tenant,
        offset: Annotated[int, Query(description="First offset to read.")] = 0,
        max_records: Annotated[
            int | None, Query(ge=1, description="At most this many records.")
        ] = None,
        max_bytes: Annotated[
            int | None, Query(ge=1, description="About this many payload bytes at most.")
        ] = None,
        follow: Annotated[
            bool, Query(description="Long poll: wait for records when none are available.")
        ] = False,
        wait_ms: Annotated[
            int | None,
            Query(ge=0, description="Longest wait of a follow read, capped by the server."),
        ] = None,
    ) -> Response:
        """Records of one partition from ``offset``, in offset order.

        JSON by default: ``{"records": [...], "next_offset", "high_watermark"}``. With
        ``Accept: application/vnd.apache.arrow.stream`` the body is an Arrow IPC stream
        whose schema is the user columns then ``_partition``, ``_offset``, ``_timestamp``,
        and the offsets travel in the ``Tidegate-Next-Offset`` and
        ``Tidegate-High-Watermark`` headers (sent with JSON too).

        ``follow=true`` is an HTTP **long poll**: the request returns as soon as at least
        one record at or after ``offset`` is available, or, after
        ``min(wait_ms, server.http_follow_wait_ms)`` milliseconds without one, with an
        empty result (``next_offset == offset``); the client then polls again from
        ``next_offset``. The gRPC ``Read`` keeps its stream open and pushes records
        instead; one HTTP response per batch of records keeps plain HTTP clients, proxies
        and their timeouts working.
        """
        arrow = _wants_arrow(request.headers.get("accept"))
        if tenancy is not None:
            await tenancy.check_read(tenant)
        if follow:
            cap = server.http_follow_wait_ms
            wait = cap if wait_ms is None else min(wait_ms, cap)
            results = service.follow(
                tenant,
                namespace,
                name,
                partition,
                offset,
                max_records=max_records,
                max_bytes=max_bytes,
                max_wait_s=wait / 1000,
            )
            try:
                # With a deadline, follow yields once: records, or the empty result.
                result = await anext(results, None)
            finally:
                aclose = getattr(results, "aclose", None)
                if aclose is not None:
                    await aclose()
            if result is None:  # pragma: no cover - follow yields once its deadline passes
                result = await service.read(
                    tenant, namespace, name, partition, offset, max_records, max_bytes
                )
        else:
            result = await service.read(
                tenant, namespace, name, partition, offset, max_records, max_bytes
            )
        metrics.record_read(result.num_records)
        response = await _maybe_offload(
            result.num_records >= _OFFLOAD_RECORDS, _read_response, result, arrow
        )
        if tenancy is not None:
            await tenancy.record_read(tenant, result.num_records, len(response.body))
        return response

    # Consumer groups -------------------------------------------------------------------
    def _group_offsets(group: str, namespace: str, name: str, got: dict[int, int]) -> JSONResponse:
        return JSONResponse(
            {
                "group": group,
                "namespace": namespace,
                "name": name,
                "offsets": [{"partition": p, "offset": o} for p, o in sorted(got.items())],
            }
        )

    @app.get(
        "/v1/groups/{group}/tables/{namespace}/{name}/offsets",
        tags=["groups"],
        response_model=GroupOffsets,
        responses=_ERRORS,
        summary="A consumer group's committed offsets for a table.",
    )
    async def fetch_offsets(
        group: Annotated[str, Path(description="Consumer group id.")],
        namespace: Namespace,
        name: Name,
        tenant: Tenant,
    ) -> JSONResponse:
        """Partitions the group never committed are absent."""
        got = await service.fetch_offsets(tenant, group, namespace, name)
        return _group_offsets(group, namespace, name, got)

    @app.post(
        "/v1/groups/{group}/tables/{namespace}/{name}/offsets",
        tags=["groups"],
        response_model=GroupOffsets,
        responses=_ERRORS,
        summary="Commit a consumer group's offsets for a table.",
    )
    async def commit_offsets(
        group: Annotated[str, Path(description="Consumer group id.")],
        namespace: Namespace,
        name: Name,
        body: CommitOffsetsRequest,
        tenant: Tenant,
    ) -> JSONResponse:
        """Store the next offset to consume per partition; answers every committed offset."""
        offsets: dict[int, int] = {}
        for o in body.offsets:
            if o.partition in offsets:
                raise InvalidRequest(f"partition {o.partition} is committed twice")
            offsets[o.partition] = o.offset
        await service.commit_offsets(tenant, group, namespace, name, offsets)
        got = await service.fetch_offsets(tenant, group, namespace, name)
        return _group_offsets(group, namespace, name, got)

    # Scans and read plans -------------------------------------------------------------
    async def _body_model(request: Request, model: type[T]) -> T:
        body = await _read_body(request, server.max_request_bytes)
        parsed = parse_json(body) if body.strip() else {}
        if not isinstance(parsed, dict):
            raise MalformedPayload("the JSON body must be an object")
        try:
            return model.model_validate(parsed)  # type: ignore[attr-defined, no-any-return]
        except ValidationError as exc:
            raise _invalid(exc.errors(include_url=False, include_input=False)) from None

    @app.post(
        "/v1/tables/{namespace}/{name}/scan",
        tags=["scans"],
        responses={
            200: {"content": {ARROW_STREAM: _ARROW_BINARY}},
            **_ERRORS,
        },
        summary="Scan the whole table (cold snapshot + hot tail) with projection and filter.",
        openapi_extra={
            "requestBody": {"content": {JSON: {"schema": ScanRequest.model_json_schema()}}}
        },
    )
    async def scan(request: Request, namespace: Namespace, name: Name, tenant: Tenant) -> Response:
        """Rows of one pinned view of the table: an Iceberg snapshot plus, per partition,
        the hot records above its tiered watermark. JSON ``{"rows": [...],
        "snapshot_id"}`` by default, an Arrow IPC stream with
        ``Accept: application/vnd.apache.arrow.stream`` (the snapshot id in the
        ``Tidegate-Snapshot-Id`` header). A bad filter or unknown column is 400, an
        unknown snapshot 404 ``SNAPSHOT_NOT_FOUND``."""
        req = await _body_model(request, ScanRequest)
        if tenancy is not None:
            await tenancy.check_read(tenant)
        result = await service.scan(
            tenant,
            namespace,
            name,
            columns=req.columns,
            row_filter=req.filter,
            as_of=req.as_of,
            limit=req.limit,
        )
        headers = {"Tidegate-Snapshot-Id": str(result.snapshot_id or "")}
        if _wants_arrow(request.headers.get("accept")):
            # Streamed batch by batch: a scan may be larger than memory.
            return StreamingResponse(
                _metered_chunks(tenant, result.schema, result.batches),
                media_type=ARROW_STREAM,
                headers=headers,
            )
        batches = [b async for b in result.batches]
        rows = sum(b.num_rows for b in batches)
        metrics.record_read(rows)
        out = await _maybe_offload(rows >= _OFFLOAD_RECORDS, batch_to_rows, batches)
        response = JSONResponse({"rows": out, "snapshot_id": result.snapshot_id}, headers=headers)
        if tenancy is not None:
            await tenancy.record_read(tenant, rows, len(response.body))
        return response

    async def _metered_chunks(
        tenant: str, schema: pa.Schema, batches: AsyncIterator[pa.RecordBatch]
    ) -> AsyncIterator[bytes]:
        """An Arrow scan body, metered (records and bytes) once it has been sent."""
        rows = nbytes = 0

        async def counted() -> AsyncIterator[pa.RecordBatch]:
            nonlocal rows
            async for b in batches:
                rows += b.num_rows
                yield b

        async for chunk in _arrow_chunks(schema, counted()):
            nbytes += len(chunk)
            yield chunk
        if tenancy is not None:
            await tenancy.record_read(tenant, rows, nbytes)

    @app.post(
        "/v1/tables/{namespace}/{name}/plan",
        tags=["scans"],
        responses=_ERRORS,
        summary="A read plan: the pinned snapshot's data files and the hot ranges.",
        openapi_extra={
            "requestBody": {"content": {JSON: {"schema": PlanRequest.model_json_schema()}}}
        },
    )
    async def plan(
        request: Request, namespace: Namespace, name: Name, tenant: Tenant
    ) -> JSONResponse:
        """The data files (presigned URLs on object storage, paths on a local warehouse)
        a scan of the pinned snapshot must read, plus the hot ranges
        ``[from_offset, to_offset)`` per partition to read through the records route."""
        req = await _body_model(request, PlanRequest)
        if tenancy is not None:
            await tenancy.check_read(tenant)
        p = await service.plan(tenant, namespace, name, row_filter=req.filter, as_of=req.as_of)
        return JSONResponse(
            {
                "snapshot_id": p.snapshot_id,
                "schema": fields_to_json(p.schema),
                "files": [
                    {
                        "url": f.url,
                        "partition": f.file.partition,
                        "record_count": f.file.record_count,
                        "file_size_bytes": f.file.file_size_bytes,
                        "min_offset": f.file.min_offset,
                        "max_offset": f.file.max_offset,
                        "expires_at": _iso(f.expires_at) if f.expires_at else None,
                    }
                    for f in p.files
                ],
                "hot_ranges": [
                    {
                        "partition": r.partition,
                        "from_offset": r.from_offset,
                        "to_offset": r.to_offset,
                    }
                    for r in p.hot_ranges
                ],
            }
        )

    return app
