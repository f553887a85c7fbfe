"""HTTP bodies in and out: content negotiation, size limits, JSON and Arrow answers, and
the one JSON form of errors."""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import pyarrow as pa
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from gateway.core import ReadResult, TableView
from gateway.server.http.guard import check_declared_length
from gateway.server.http.models import (
    ARROW_STREAM,
    HEADER_HIGH_WATERMARK,
    HEADER_NEXT_OFFSET,
    HEADER_TIERED_WATERMARK,
    AppendRequest,
)
from gateway.wire.changes import engine_to_json
from gateway.wire.codec import encode_stream
from gateway.wire.errors import (
    InvalidRequest,
    MalformedPayload,
    RequestTooLarge,
    TidegateError,
)
from gateway.wire.jsonrows import batch_to_rows, parse_json, rows_to_batch
from gateway.wire.keywrites import blank_deletes
from gateway.wire.types import AppendRange

__all__ = [
    "END_OF_STREAM",
    "HTTP_REASONS",
    "batch_messages",
    "body_model",
    "describe",
    "error_response",
    "invalid",
    "iso",
    "json_rows",
    "media_type",
    "pick",
    "ranges",
    "read_body",
    "read_response",
    "stream_header",
    "wants_arrow",
]

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


def iso(value: datetime) -> str:
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def describe(view: TableView, *, with_partitions: bool) -> dict[str, Any]:
    d = view.definition
    out: dict[str, Any] = {
        "namespace": d.namespace,
        "name": d.name,
        "table_id": d.table_id,
        "schema": view.fields,
        "schema_version": view.schema_version,
        "partitions": d.partitions,
        "key_columns": list(d.key_columns),
        "primary_key": list(d.primary_key.columns) if d.primary_key else [],
        "merge_engine": engine_to_json(d.primary_key.engine) if d.primary_key else None,
        "created_at": iso(d.created_at),
        "retention_ms": d.retention_ms,
        "retention_records": d.retention_records,
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
        out["iceberg_table"] = view.iceberg_table
        out["iceberg_metadata"] = view.iceberg_metadata
        if view.iceberg_schema_id >= 0:
            out["iceberg_schema_id"] = view.iceberg_schema_id
    m = view.maintenance
    if with_partitions and m is not None:
        out["maintenance"] = {
            "data_files": m.stats.data_files,
            "small_files": m.stats.small_files,
            "small_file_ratio": round(m.stats.small_file_ratio, 4),
            "data_bytes": m.stats.data_bytes,
            "snapshots": m.stats.snapshots,
            "leases": [
                {
                    "snapshot_id": lease.snapshot_id,
                    "kind": lease.kind,
                    "expires_at": iso(lease.expires_at),
                }
                for lease in m.leases
            ],
            "last_runs": {
                job: {"finished_at": iso(r.finished_at), "outcome": r.outcome, "detail": r.detail}
                for job, r in sorted(m.last_runs.items())
            },
        }
    return out


def ranges(ranges: Sequence[AppendRange]) -> dict[str, Any]:
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


def media_type(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def wants_arrow(accept: str | None) -> bool:
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


def validation_details(errors: Sequence[Any]) -> list[dict[str, str]]:
    """Pydantic/FastAPI errors as JSON-safe ``{"loc", "message", "type"}`` (no inputs)."""
    out = []
    for e in errors:
        loc = ".".join(str(x) for x in e.get("loc", ()))
        out.append({"loc": loc, "message": str(e.get("msg", "")), "type": str(e.get("type", ""))})
    return out


def invalid(errors: Sequence[Any]) -> InvalidRequest:
    details = validation_details(errors)
    summary = "; ".join(
        f"{d['loc']}: {d['message']}" if d["loc"] else d["message"] for d in details
    )
    return InvalidRequest(f"invalid request: {summary}", errors=details)


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing more than ``limit`` bytes.

    A declared ``Content-Length`` over the limit is refused before any byte is read; a
    chunked body is refused as soon as it passes the limit.

    Raises:
        RequestTooLarge: over ``limit``.
        InvalidRequest: a Content-Length that is not a number.
    """
    check_declared_length(request, limit)
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


def pick(name: str, in_body: T | None, in_query: T | None) -> T | None:
    if in_body is not None and in_query is not None and in_body != in_query:
        raise InvalidRequest(
            f"{name!r} is given both in the body ({in_body!r}) and the query ({in_query!r})"
        )
    return in_body if in_body is not None else in_query


def json_rows(
    body: bytes, table_schema: pa.Schema, omittable: Collection[str] = ()
) -> tuple[pa.RecordBatch, AppendRequest]:
    parsed = parse_json(body)
    if not isinstance(parsed, dict):
        raise MalformedPayload("the JSON body must be an object with 'rows'")
    try:
        req = AppendRequest.model_validate(parsed)
    except ValidationError as exc:
        raise invalid(exc.errors(include_url=False, include_input=False)) from None
    rows = blank_deletes(req.rows, table_schema)  # a key table's delete names its key only
    return rows_to_batch(rows, table_schema, omittable=omittable), req


def read_response(result: ReadResult, arrow: bool) -> Response:
    headers = {
        HEADER_NEXT_OFFSET: str(result.next_offset),
        HEADER_HIGH_WATERMARK: str(result.high_watermark),
        HEADER_TIERED_WATERMARK: str(result.tiered_watermark),
    }
    if arrow:
        body = encode_stream(result.batches, result.schema)
        return Response(body, media_type=ARROW_STREAM, headers=headers)
    content = {
        "records": batch_to_rows(result.batches),
        "next_offset": result.next_offset,
        "high_watermark": result.high_watermark,
        "tiered_watermark": result.tiered_watermark,
    }
    return JSONResponse(content, headers=headers)


END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"


def stream_header(schema: pa.Schema) -> bytes:
    """The start of an Arrow IPC stream: its schema message. Batches follow as
    encapsulated messages (:func:`batch_messages`), then :data:`END_OF_STREAM`."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema):
        pass
    header = bytes(sink.getvalue().to_pybytes())
    assert header.endswith(END_OF_STREAM)
    return header[: -len(END_OF_STREAM)]


def batch_messages(batches: list[pa.RecordBatch]) -> tuple[bytes, int]:
    """Batches as encapsulated Arrow IPC messages of a stream, and their size."""
    out = b"".join(bytes(b.serialize().to_pybytes()) for b in batches)
    return out, len(out)


async def body_model(request: Request, model: type[M], limit: int) -> M:
    """A JSON body (of at most ``limit`` bytes; empty means ``{}``) as ``model``.

    Raises:
        RequestTooLarge, MalformedPayload, InvalidRequest (naming the fields).
    """
    return body_from(await read_body(request, limit), model)


def body_from(body: bytes, model: type[M]) -> M:
    """A JSON body read already (empty means ``{}``) as ``model``.

    Raises:
        MalformedPayload, InvalidRequest (naming the fields).
    """
    parsed = parse_json(body) if body.strip() else {}
    if not isinstance(parsed, dict):
        raise MalformedPayload("the JSON body must be an object")
    try:
        return model.model_validate(parsed)
    except ValidationError as exc:
        raise invalid(exc.errors(include_url=False, include_input=False)) from None


def error_response(err: TidegateError) -> JSONResponse:
    headers = {}
    retry_after_ms = getattr(err, "retry_after_ms", None)
    if retry_after_ms is not None:
        headers["Retry-After"] = str(max(0, math.ceil(retry_after_ms / 1000)))
    return JSONResponse({"error": err.to_dict()}, status_code=err.http_status, headers=headers)


HTTP_REASONS = {
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    406: "NOT_ACCEPTABLE",
    413: "REQUEST_TOO_LARGE",
    415: "UNSUPPORTED_MEDIA_TYPE",
}
