"""Bulk reads and appends over a gateway's Arrow Flight edge (see
``gateway/server/flight.py``).

Scans move as Flight ``DoGet`` streams: Arrow's C++ transport receives the batches
straight into Arrow memory, with no protobuf message per chunk and no Python-side IPC
decoding; a producer's appends may go as a ``DoPut`` stream the same way. A client finds
the edge with ``GetGatewayInfo`` and falls back to gRPC where a gateway has none (or, for
appends, where ``flight_appends`` is false: gateways older than Flight appends).
"""

from __future__ import annotations

import json
import time
from collections.abc import Generator
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl

from gateway.client._types import TableRef
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire.errors import OffsetOutOfRange, Throttled, TidegateError, Unavailable
from gateway.wire.status import build_error

__all__ = [
    "FlightReads",
    "error_from_flight",
    "flight_location",
    "flight_read",
    "flight_scan",
    "range_ended_early",
]


def flight_read(
    table: str | TableRef, partition: int, offset: int, max_records: int
) -> dict[str, Any]:
    """The Flight command of a stream read of ``max_records`` from ``offset``."""
    t = TableRef.parse(table)
    return {
        "read": {
            "namespace": t.namespace,
            "name": t.name,
            "partition": partition,
            "offset": offset,
            "max_records": max_records,
        }
    }


def range_ended_early(
    table: str | TableRef, partition: int, offset: int, start: int, end: int
) -> OffsetOutOfRange:
    """The error of a range read that found no record at ``offset`` before ``end``."""
    return OffsetOutOfRange(
        f"partition {partition} of {table} ended at offset {offset}, before {end}",
        offset=offset,
        earliest=start,
        latest=offset,
    )


#: How long a range read waits out the tenant's read quota in all before it gives up.
RANGE_THROTTLE_S = 60.0


def throttle_wait(exc: Throttled, started: float) -> float:
    """How long a range read that began at ``started`` (``time.monotonic``) waits, after
    ``exc`` (the tenant's read quota), before it reads on from where it was, as the SDK
    waits out a file link's 429; ``exc`` itself past :data:`RANGE_THROTTLE_S` in all."""
    wait = max(0.05, (exc.retry_after_ms or 1000) / 1000)
    if time.monotonic() + wait >= started + RANGE_THROTTLE_S:
        raise exc
    return wait


def flight_scan(request: pb.ScanRequest) -> dict[str, Any]:
    """The Flight command of a scan: the same fields as the gRPC ``ScanRequest``."""
    return {
        "scan": {
            "namespace": request.table.namespace,
            "name": request.table.name,
            "columns": list(request.columns) or None,
            "filter": request.filter or None,
            "as_of": request.as_of or None,
            "limit": request.limit if request.HasField("limit") else None,
        }
    }


def flight_location(info: pb.GatewayInfo, target: str, tls: bool) -> str | None:
    """Where the gateway's Flight edge is, from its ``GatewayInfo`` and the ``host:port``
    this client dialled; None when it has none."""
    if info.flight_location:
        return str(info.flight_location)
    if not info.flight_port:
        return None
    host = target.rsplit(":", 1)[0] if target.count(":") == 1 or "]" in target else target
    return f"{'grpc+tls' if tls else 'grpc+tcp'}://{host}:{info.flight_port}"


def error_from_flight(exc: fl.FlightError) -> TidegateError:
    """The typed error a Flight call failed with: the gateway's own error from the
    call's ``extra_info``; for the transport's own failures, :class:`Unavailable`."""
    raw = getattr(exc, "extra_info", None) or b""
    try:
        doc = json.loads(raw) if raw else None
    except ValueError:
        doc = None
    if isinstance(doc, dict) and "reason" in doc:
        return build_error(
            str(doc["reason"]),
            str(doc.get("message", "")),
            {str(k): str(v) for k, v in (doc.get("metadata") or {}).items()},
            doc.get("retry_after_ms"),
        )
    message = str(exc).split(". Detail:")[0]
    if isinstance(exc, (fl.FlightUnavailableError, fl.FlightTimedOutError)):
        return Unavailable(f"the Flight edge did not answer: {message}", transport=True)
    return TidegateError(f"the Flight call failed: {message}")


class FlightReads:
    """Scans of one gateway's tables over its Flight edge, with the client's key."""

    def __init__(
        self,
        location: str,
        authorization: str | None,
        *,
        timeout: float | None,
        root_certificates: bytes | None = None,
    ) -> None:
        self.location = location
        kwargs: dict[str, Any] = {}
        if root_certificates is not None:
            kwargs["tls_root_certs"] = root_certificates
        self._client = fl.FlightClient(location, **kwargs)
        headers = [(b"authorization", authorization.encode())] if authorization else []
        self._headers = headers
        self._options = fl.FlightCallOptions(headers=headers, timeout=timeout)
        #: Whether the edge takes appends (``GatewayInfo.flight_appends``).
        self.appends = False

    def close(self) -> None:
        self._client.close()

    def do_put(self, table: TableRef, schema: pa.Schema, compression: str) -> tuple[Any, Any]:
        """Open a ``DoPut`` of appends to ``table``: ``(writer, metadata reader)``, with no
        deadline (a producer's call lives as long as the producer), its batches compressed
        with ``compression`` (``zstd``, ``lz4`` or ``none``) by Arrow's C++."""
        where = fl.FlightDescriptor.for_path(table.namespace, table.name)
        codec = None if compression == "none" else compression
        options = fl.FlightCallOptions(
            headers=self._headers, write_options=pa.ipc.IpcWriteOptions(compression=codec)
        )
        try:
            return self._client.do_put(where, schema, options)  # type: ignore[no-any-return]
        except fl.FlightError as exc:
            raise error_from_flight(exc) from None

    def _get(self, command: dict[str, Any]) -> fl.FlightStreamReader:
        ticket = fl.Ticket(json.dumps(command).encode())
        return self._client.do_get(ticket, self._options)

    def scan_batches(self, command: dict[str, Any]) -> Generator[pa.RecordBatch, None, None]:
        try:
            reader = self._get(command)
            while True:
                try:
                    chunk = reader.read_chunk()
                except StopIteration:
                    return
                if chunk.data is not None:
                    yield chunk.data
        except fl.FlightError as exc:
            raise error_from_flight(exc) from None

    def scan(self, command: dict[str, Any]) -> pa.Table:
        try:
            return self._get(command).read_all()
        except fl.FlightError as exc:
            raise error_from_flight(exc) from None

    def read_steps(
        self, command: dict[str, Any]
    ) -> Generator[tuple[list[pa.RecordBatch], int, int, int], None, None]:
        """A stream read as ``(batches, next_offset, high_watermark, tiered_watermark)``
        per step of the gateway (each step's last batch carries those numbers)."""
        try:
            reader = self._get(command)
            pending: list[pa.RecordBatch] = []
            while True:
                try:
                    chunk = reader.read_chunk()
                except StopIteration:
                    return
                if chunk.data is not None and chunk.data.num_rows:
                    pending.append(chunk.data)
                if chunk.app_metadata is not None:
                    meta = json.loads(chunk.app_metadata.to_pybytes())
                    yield (
                        pending,
                        int(meta["next_offset"]),
                        int(meta["high_watermark"]),
                        int(meta["tiered_watermark"]),
                    )
                    pending = []
        except fl.FlightError as exc:
            raise error_from_flight(exc) from None
