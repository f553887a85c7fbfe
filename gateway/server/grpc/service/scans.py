"""The servicer's scan and plan methods, and where the Flight edge is (GetGatewayInfo,
which bulk scans are sent to)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pyarrow as pa

from gateway.server.grpc.calls import current_call
from gateway.server.grpc.service.base import ServicerBase
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire.codec import encode_stream

__all__ = ["ScanMethods"]

#: Scan responses carry about this much Arrow data each.
_SCAN_CHUNK_BYTES = 4 * 1024 * 1024


class ScanMethods(ServicerBase):
    async def Scan(self, request: pb.ScanRequest, context: Any) -> AsyncIterator[pb.ScanResponse]:
        tenant = current_call().tenant
        result = await self.calls.scan(
            tenant,
            request.table.namespace,
            request.table.name,
            columns=list(request.columns) or None,
            row_filter=request.filter or None,
            as_of=request.as_of or None,
            limit=request.limit if request.HasField("limit") else None,
        )
        snapshot_id = result.snapshot_id or 0

        def message(batches: list[pa.RecordBatch]) -> tuple[pb.ScanResponse, int]:
            payload = encode_stream(batches, result.schema)
            return pb.ScanResponse(arrow_ipc=payload, snapshot_id=snapshot_id), len(payload)

        async for msg in self.calls.scan_chunks(
            tenant, result, message, _SCAN_CHUNK_BYTES, always_one=True
        ):
            yield msg

    async def GetGatewayInfo(
        self, request: pb.GetGatewayInfoRequest, context: Any
    ) -> pb.GatewayInfo:
        s = self.settings.server
        return pb.GatewayInfo(
            flight_port=s.flight_port,
            flight_location=s.flight_advertise,
            flight_appends=s.flight_port != 0,
        )

    async def PlanRead(self, request: pb.PlanReadRequest, context: Any) -> pb.PlanReadResponse:
        plan = await self.calls.plan(
            current_call().tenant,
            request.table.namespace,
            request.table.name,
            row_filter=request.filter or None,
            as_of=request.as_of or None,
            files_url=self.settings.http_url,
        )
        return pb.PlanReadResponse(
            snapshot_id=plan.snapshot_id or 0,
            files=[
                pb.PlannedDataFile(
                    url=f.url,
                    partition=f.file.partition,
                    record_count=f.file.record_count,
                    file_size_bytes=f.file.file_size_bytes,
                    min_offset=f.file.min_offset,
                    max_offset=f.file.max_offset,
                    expires_at_ms=int(f.expires_at.timestamp() * 1000) if f.expires_at else 0,
                    warehouse_path=f.warehouse_path or "",
                )
                for f in plan.files
            ],
            hot_ranges=[
                pb.HotRange(partition=r.partition, from_offset=r.from_offset, to_offset=r.to_offset)
                for r in plan.hot_ranges
            ],
            arrow_schema=encode_stream([], plan.schema),
            earliest_offsets=[
                pb.PartitionOffset(partition=p, offset=o) for p, o in sorted(plan.earliest.items())
            ],
        )
