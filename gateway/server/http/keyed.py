"""``/v1/tables/{namespace}/{name}/deletes`` and ``.../lookup``: a primary-key table's
deletes and point lookups by key (docs/decisions/primary-keys.md)."""

from __future__ import annotations

import pyarrow as pa
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from gateway.server.calls import OFFLOAD_BYTES, AppendBody, DataCalls
from gateway.server.http.bodies import body_from, ranges, read_body, wants_arrow
from gateway.server.http.deps import Caller, CallerRoute, Name, Namespace
from gateway.server.http.guard import allow_body
from gateway.server.http.models import (
    ARROW_BINARY,
    ARROW_STREAM,
    ERRORS,
    JSON,
    AppendResponse,
    DeleteRequest,
    ErrorResponse,
    LookupRequest,
)
from gateway.wire.codec import encode_stream
from gateway.wire.jsonrows import batch_to_rows
from gateway.wire.keywrites import delete_batch, key_batch

__all__ = ["keyed_router"]


def keyed_router(calls: DataCalls) -> APIRouter:
    router = APIRouter(
        prefix="/v1/tables/{namespace}/{name}", tags=["keys"], route_class=CallerRoute
    )
    _delete_route(router, calls)
    _lookup_route(router, calls)
    return router


def _delete_route(router: APIRouter, calls: DataCalls) -> None:
    service = calls.service
    server = service.settings.server

    @router.post(
        "/deletes",
        response_model=AppendResponse,
        responses={**ERRORS, 429: {"model": ErrorResponse, "description": "Throttled"}},
        summary="Delete rows of a primary-key table by key.",
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {JSON: {"schema": DeleteRequest.model_json_schema()}},
            }
        },
    )
    async def delete(
        request: Request, namespace: Namespace, name: Name, caller: Caller
    ) -> JSONResponse:
        """Delete keys from a primary-key table: ``{"keys": [{<key columns>}, ...],
        "producer_id"?, "sequence"?}``. Stored as the ``-D`` changes the deletes make
        (a key that is not live changes nothing: its range has count 0), exactly as an
        append of rows with ``_change`` 3. A key that does not name exactly the key's
        columns, or a table without a primary key, is refused and nothing is deleted.
        """
        calls.refuse_append_early(caller.tenant)  # before a byte of the body is read
        allow_body(request, server.max_request_bytes)
        raw = await read_body(request, server.max_request_bytes)
        body = await calls.offload(len(raw) >= OFFLOAD_BYTES, body_from, raw, DeleteRequest)

        async def decode() -> AppendBody:
            table = await service.table(caller.tenant, namespace, name)
            pk = table.definition.primary_key
            batch = delete_batch(
                body.keys, table.schema, pk.columns if pk else (), f"{namespace}.{name}"
            )
            return AppendBody([batch], None, body.producer_id, body.sequence)

        appended = await calls.append(caller.tenant, namespace, name, len(raw), decode)
        return JSONResponse(ranges(appended))


def _lookup_route(router: APIRouter, calls: DataCalls) -> None:
    service = calls.service
    server = service.settings.server

    @router.post(
        "/lookup",
        responses={200: {"content": {ARROW_STREAM: ARROW_BINARY}}, **ERRORS},
        summary="Point lookups of a primary-key table by key (JSON or Arrow).",
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {JSON: {"schema": LookupRequest.model_json_schema()}},
            }
        },
    )
    async def lookup(
        request: Request, namespace: Namespace, name: Name, caller: Caller
    ) -> Response:
        """The live row of each key of ``{"keys": [{<key columns>}, ...]}``, from the hot
        tier's key index: JSON ``{"rows": [...]}`` (the table's columns and the system
        columns of the change that made each row; keys not live are left out), or an
        Arrow IPC stream with ``Accept: application/vnd.apache.arrow.stream``."""
        allow_body(request, server.max_body_bytes)
        raw = await read_body(request, server.max_body_bytes)
        body = await calls.offload(len(raw) >= OFFLOAD_BYTES, body_from, raw, LookupRequest)
        table = await service.table(caller.tenant, namespace, name)
        pk = table.definition.primary_key
        keys = key_batch(body.keys, table.schema, pk.columns if pk else (), f"{namespace}.{name}")
        rows = await calls.get(caller.tenant, namespace, name, pa.Table.from_batches([keys]))
        if wants_arrow(request.headers.get("accept")):
            data = encode_stream(rows.to_batches(), rows.schema)
            return Response(data, media_type=ARROW_STREAM)
        return JSONResponse({"rows": batch_to_rows(rows.to_batches())})
