"""``/v1/tables/{namespace}/{name}/records`` and ``.../partitions/{p}/records``: appends
(JSON or Arrow) and stream reads (JSON or Arrow, with long polls)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse, Response

from gateway.core import ReadResult
from gateway.server.calls import OFFLOAD_BYTES, AppendBody, DataCalls
from gateway.server.http.bodies import (
    json_rows,
    media_type,
    pick,
    ranges,
    read_body,
    read_response,
    wants_arrow,
)
from gateway.server.http.deps import Caller, CallerRoute, Name, Namespace
from gateway.server.http.guard import allow_body
from gateway.server.http.models import (
    ARROW_BINARY,
    ARROW_STREAM,
    ERRORS,
    JSON,
    WATERMARK_HEADERS,
    AppendRequest,
    AppendResponse,
    ErrorResponse,
    ReadResponse,
)
from gateway.wire.errors import SchemaMismatch, UnsupportedMediaType

__all__ = ["records_router"]


def records_router(calls: DataCalls) -> APIRouter:
    router = APIRouter(
        prefix="/v1/tables/{namespace}/{name}", tags=["records"], route_class=CallerRoute
    )
    _append_route(router, calls)
    _read_route(router, calls)
    return router


def _append_route(router: APIRouter, calls: DataCalls) -> None:
    service = calls.service
    server = service.settings.server

    @router.post(
        "/records",
        response_model=AppendResponse,
        responses={
            **ERRORS,
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
                    ARROW_STREAM: ARROW_BINARY,
                },
            }
        },
    )
    async def append(
        request: Request,
        namespace: Namespace,
        name: Name,
        caller: Caller,
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
        media = media_type(request.headers.get("content-type"))
        if media not in (JSON, ARROW_STREAM):
            raise UnsupportedMediaType(
                f"Content-Type {media or '(none)'!r} is not supported; send {JSON!r} or "
                f"{ARROW_STREAM!r}",
                supported=f"{JSON},{ARROW_STREAM}",
            )
        calls.refuse_append_early(caller.tenant)  # before a byte of the body is read
        allow_body(request, server.max_request_bytes)
        body = await read_body(request, server.max_request_bytes)
        if media == ARROW_STREAM:
            appended = await calls.append_arrow(
                caller.tenant,
                namespace,
                name,
                body,
                partition=partition,
                producer_id=producer_id,
                sequence=sequence,
            )
            return JSONResponse(ranges(appended))
        big = len(body) >= OFFLOAD_BYTES

        async def decode() -> AppendBody:
            # The cached definition (no live offsets): JSON rows are typed by its schema.
            table = await service.table(caller.tenant, namespace, name)
            try:
                batch, req = await calls.offload(
                    big, json_rows, body, table.write_schema, table.write_omittable
                )
            except SchemaMismatch as exc:
                if not exc.details.get("unexpected"):
                    raise
                # A column added through another gateway since this one cached the table.
                table = await service.table(caller.tenant, namespace, name, fresh=True)
                batch, req = await calls.offload(
                    big, json_rows, body, table.write_schema, table.write_omittable
                )
            return AppendBody(
                [batch],
                pick("partition", req.partition, partition),
                pick("producer_id", req.producer_id, producer_id),
                pick("sequence", req.sequence, sequence),
            )

        appended = await calls.append(caller.tenant, namespace, name, len(body), decode)
        return JSONResponse(ranges(appended))


def _read_route(router: APIRouter, calls: DataCalls) -> None:
    server = calls.service.settings.server

    @router.get(
        "/partitions/{partition}/records",
        response_model=ReadResponse,
        responses={
            200: {"content": {ARROW_STREAM: ARROW_BINARY}, "headers": WATERMARK_HEADERS},
            **ERRORS,
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
        caller: Caller,
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
        arrow = wants_arrow(request.headers.get("accept"))

        def answer(result: ReadResult) -> tuple[Response, int]:
            response = read_response(result, arrow)
            return response, len(response.body)

        if not follow:
            return await calls.read(
                caller.tenant, namespace, name, partition, offset, max_records, max_bytes, answer
            )
        cap = server.http_follow_wait_ms
        wait = cap if wait_ms is None else min(wait_ms, cap)
        results = calls.follow(
            caller.tenant,
            namespace,
            name,
            partition,
            offset,
            answer,
            max_records=max_records,
            max_bytes=max_bytes,
            max_wait_s=wait / 1000,
            authorization=caller.authorization,
        )
        try:
            # With a deadline, follow yields once: records, or the empty result.
            response = await anext(results)
        finally:
            await results.aclose()  # type: ignore[attr-defined]
        return response
