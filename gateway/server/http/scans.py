"""``/v1/tables/{namespace}/{name}/scan`` and ``.../plan``: table scans and read plans."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pyarrow as pa
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from gateway.core import ScanResult
from gateway.server.calls import DataCalls
from gateway.server.http.bodies import (
    END_OF_STREAM,
    batch_messages,
    body_model,
    iso,
    stream_header,
    wants_arrow,
)
from gateway.server.http.deps import Caller, CallerRoute, Name, Namespace
from gateway.server.http.models import (
    ARROW_BINARY,
    ARROW_STREAM,
    ERRORS,
    JSON,
    PlanRequest,
    ScanRequest,
)
from gateway.wire.jsonrows import batch_to_rows
from gateway.wire.schema import fields_to_json

__all__ = ["scans_router"]

#: Arrow data per chunk of a streamed Arrow scan.
_CHUNK_BYTES = 4 * 1024 * 1024


def _rows(batches: list[pa.RecordBatch]) -> tuple[list[dict[str, object]], int]:
    rows = batch_to_rows(batches)
    return rows, sum(b.nbytes for b in batches)


def scans_router(calls: DataCalls) -> APIRouter:
    router = APIRouter(
        prefix="/v1/tables/{namespace}/{name}", tags=["scans"], route_class=CallerRoute
    )
    limit = calls.service.settings.server.max_body_bytes

    async def arrow_body(tenant: str, result: ScanResult) -> AsyncIterator[bytes]:
        yield stream_header(result.schema)
        async for chunk in calls.scan_chunks(tenant, result, batch_messages, _CHUNK_BYTES):
            yield chunk
        yield END_OF_STREAM

    @router.post(
        "/scan",
        responses={200: {"content": {ARROW_STREAM: ARROW_BINARY}}, **ERRORS},
        summary="Scan the whole table (cold snapshot + hot tail) with projection and filter.",
        openapi_extra={
            "requestBody": {"content": {JSON: {"schema": ScanRequest.model_json_schema()}}}
        },
    )
    async def scan(request: Request, namespace: Namespace, name: Name, caller: Caller) -> Response:
        """Rows of one pinned view of the table: an Iceberg snapshot plus, per partition,
        the hot records above its tiered watermark. JSON ``{"rows": [...],
        "snapshot_id"}`` by default, an Arrow IPC stream with
        ``Accept: application/vnd.apache.arrow.stream`` (the snapshot id in the
        ``Tidegate-Snapshot-Id`` header). A bad filter or unknown column is 400, an
        unknown snapshot 404 ``SNAPSHOT_NOT_FOUND``."""
        req = await body_model(request, ScanRequest, limit)
        result = await calls.scan(
            caller.tenant,
            namespace,
            name,
            columns=req.columns,
            row_filter=req.filter,
            as_of=req.as_of,
            limit=req.limit,
        )
        headers = {"Tidegate-Snapshot-Id": str(result.snapshot_id or "")}
        if wants_arrow(request.headers.get("accept")):
            # Streamed chunk by chunk: a scan may be larger than memory.
            return StreamingResponse(
                arrow_body(caller.tenant, result), media_type=ARROW_STREAM, headers=headers
            )
        rows = [r async for chunk in calls.scan_chunks(caller.tenant, result, _rows, None)
                for r in chunk]  # fmt: skip
        return JSONResponse({"rows": rows, "snapshot_id": result.snapshot_id}, headers=headers)

    @router.post(
        "/plan",
        responses=ERRORS,
        summary="A read plan: the pinned snapshot's data files and the hot ranges.",
        openapi_extra={
            "requestBody": {"content": {JSON: {"schema": PlanRequest.model_json_schema()}}}
        },
    )
    async def plan(
        request: Request, namespace: Namespace, name: Name, caller: Caller
    ) -> JSONResponse:
        """The data files (presigned URLs on object storage, links through this gateway
        on a local warehouse) a scan of the pinned snapshot must read, plus the hot ranges
        ``[from_offset, to_offset)`` per partition to read through the records route."""
        req = await body_model(request, PlanRequest, limit)
        p = await calls.plan(
            caller.tenant,
            namespace,
            name,
            row_filter=req.filter,
            as_of=req.as_of,
            files_url=str(request.base_url),
        )
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
                        "expires_at": iso(f.expires_at) if f.expires_at else None,
                        "warehouse_path": f.warehouse_path,
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
                "earliest_offsets": {str(k): v for k, v in sorted(p.earliest.items())},
            }
        )

    return router
