"""The gRPC edge (grpc.aio): the Tidegate service, the admin service, health and reflection.

The servicer only turns messages into :class:`~gateway.server.calls.DataCalls` and their
answers back into messages; who is calling, admission and error translation are the
:class:`~gateway.server.grpc_calls.CallInterceptor`'s.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import grpc
import pyarrow as pa
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from gateway.config import Settings
from gateway.core import GroupView, MaintenanceView, ReadResult, StreamTables, TableView
from gateway.server.calls import DataCalls, append_response, pieces, wire_error
from gateway.server.grpc_calls import (
    ADMIN_SERVICE_NAME,
    SERVICE_NAME,
    CallInterceptor,
    current_call,
)
from gateway.tenancy import Gate, OpenGate, Tenancy
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire._proto.tidegate.v1 import tidegate_pb2_grpc as pb_grpc
from gateway.wire.codec import encode_stream
from gateway.wire.errors import PermissionDenied, Unauthenticated
from gateway.wire.status import error_to_pb

__all__ = ["GrpcEdge", "TidegateServicer"]

log = logging.getLogger(__name__)

#: Bytes of Arrow data per Read response message.
_READ_CHUNK_BYTES = 1024 * 1024
#: Scan responses carry about this much Arrow data each.
_SCAN_CHUNK_BYTES = 4 * 1024 * 1024


# --------------------------------------------------------------------------------------
# Conversions
# --------------------------------------------------------------------------------------
def table_info(view: TableView) -> pb.TableInfo:
    d = view.definition
    return pb.TableInfo(
        table=pb.TableRef(namespace=d.namespace, name=d.name),
        table_id=d.table_id,
        fields=[
            pb.Field(
                name=f["name"],
                type=f["type"],
                nullable=f["nullable"],
                doc=f.get("doc", ""),
                added=f.get("added", False),
            )
            for f in view.fields
        ],
        partitions=d.partitions,
        key_columns=d.key_columns,
        partition_info=[
            pb.PartitionInfo(
                partition=p.partition,
                earliest_offset=p.earliest_offset,
                high_watermark=p.high_watermark,
                tiered_watermark=p.tiered_watermark,
                hot_bytes=p.hot_bytes,
                lag_records=p.lag_records,
                lag_bytes=p.lag_bytes,
            )
            for p in view.partitions
        ],
        created_at_ms=int(d.created_at.timestamp() * 1000),
        iceberg_table=view.iceberg_table,
        iceberg_metadata=view.iceberg_metadata,
        schema_version=view.schema_version,
        iceberg_schema_id=view.iceberg_schema_id if view.iceberg_schema_id >= 0 else None,
        retention_ms=d.retention_ms,
        retention_records=d.retention_records,
        maintenance=_maintenance(view.maintenance),
    )


def _ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


def _maintenance(m: MaintenanceView | None) -> pb.TableMaintenance | None:
    if m is None:
        return None
    return pb.TableMaintenance(
        data_files=m.stats.data_files,
        small_files=m.stats.small_files,
        small_file_ratio=m.stats.small_file_ratio,
        data_bytes=m.stats.data_bytes,
        snapshots=m.stats.snapshots,
        leases=[
            pb.SnapshotLease(
                snapshot_id=lease.snapshot_id, kind=lease.kind, expires_at_ms=_ms(lease.expires_at)
            )
            for lease in m.leases
        ],
        last_runs={
            job: pb.JobRun(finished_at_ms=_ms(r.finished_at), outcome=r.outcome, detail=r.detail)
            for job, r in m.last_runs.items()
        },
    )


def _optional(message: Any, name: str) -> int | None:
    """An ``optional`` integer field: None when unset."""
    return int(getattr(message, name)) if message.HasField(name) else None


def _read_messages(result: ReadResult) -> tuple[list[pb.ReadResponse], int]:
    """One ReadResponse per ~1 MiB of batches (the last carries the result's next
    offset), then per ~1 MiB of hot batches as stored (each with the schema), and the
    bytes they carry; an empty result is one message without records, which still tells
    where the log ends."""
    if not result.batches and not result.pieces:
        empty = pb.ReadResponse(
            next_offset=result.next_offset,
            high_watermark=result.high_watermark,
            tiered_watermark=result.tiered_watermark,
        )
        return [empty], 0
    out: list[pb.ReadResponse] = []
    pending: list[pa.RecordBatch] = []
    size = nbytes = 0
    # A record batch larger than a message is cut, so no message outgrows a client's
    # receive limit (grpc's default is 4 MiB) whatever was appended.
    cut = [piece for b in result.batches for piece in pieces(b, _READ_CHUNK_BYTES)]
    for i, b in enumerate(cut):
        pending.append(b)
        size += b.nbytes
        if size >= _READ_CHUNK_BYTES or i == len(cut) - 1:
            next_offset = int(pending[-1].column("_offset")[-1].as_py()) + 1
            payload = encode_stream(pending, result.schema)
            nbytes += len(payload)
            out.append(
                pb.ReadResponse(
                    arrow_ipc=payload,
                    next_offset=next_offset,
                    high_watermark=result.high_watermark,
                    tiered_watermark=result.tiered_watermark,
                )
            )
            pending, size = [], 0
    if result.pieces:
        schema_only = encode_stream([], result.schema)
        group: list[pb.HotBatch] = []
        for i, p in enumerate(result.pieces):
            group.append(
                pb.HotBatch(
                    arrow_ipc=p.payload,
                    base_offset=p.base_offset,
                    timestamp_us=p.timestamp_us,
                    skip=p.skip,
                    count=p.count,
                )
            )
            size += len(p.payload)
            if size >= _READ_CHUNK_BYTES or i == len(result.pieces) - 1:
                nbytes += size + len(schema_only)
                out.append(
                    pb.ReadResponse(
                        arrow_ipc=schema_only,
                        next_offset=p.next_offset,
                        high_watermark=result.high_watermark,
                        tiered_watermark=result.tiered_watermark,
                        hot_batches=group,
                    )
                )
                group, size = [], 0
    return out, nbytes


def group_info(view: GroupView) -> pb.DescribeGroupResponse:
    return pb.DescribeGroupResponse(
        group=view.group,
        table=pb.TableRef(namespace=view.namespace, name=view.name),
        generation=view.generation,
        state=view.state,
        members=[
            pb.GroupMemberInfo(
                member_id=m.member_id,
                client_id=m.client_id,
                generation=m.generation,
                assigned=m.assigned,
                revoking=m.revoking,
                pending=m.pending,
                session_timeout_ms=m.session_timeout_ms,
                joined_at_ms=m.joined_ms,
                last_heartbeat_ms=m.last_heartbeat_ms,
            )
            for m in view.members
        ],
        partitions=[
            pb.GroupPartitionInfo(
                partition=p.partition,
                member_id=p.member_id or "",
                committed=p.committed,
                high_watermark=p.high_watermark,
                lag=p.lag,
            )
            for p in view.partitions
        ],
        lag=view.lag,
    )


def _partition_offsets(offsets: dict[int, int]) -> list[pb.PartitionOffset]:
    return [pb.PartitionOffset(partition=p, offset=o) for p, o in sorted(offsets.items())]


class TidegateServicer(pb_grpc.TidegateServicer):  # type: ignore[misc]
    def __init__(self, calls: DataCalls, settings: Settings) -> None:
        self.calls = calls
        self.service = calls.service
        self.settings = settings

    # Tables ------------------------------------------------------------------------------
    async def CreateTable(self, request: pb.CreateTableRequest, context: Any) -> pb.TableInfo:
        fields = [
            {
                "name": f.name,
                "type": f.type,
                "nullable": f.nullable,
                **({"doc": f.doc} if f.doc else {}),
            }
            for f in request.fields
        ]
        view = await self.calls.create_table(
            current_call().tenant,
            request.table.namespace,
            request.table.name,
            fields,
            request.partitions,
            list(request.key_columns),
            retention_ms=_optional(request, "retention_ms"),
            retention_records=_optional(request, "retention_records"),
        )
        return table_info(view)

    async def AlterTable(self, request: pb.AlterTableRequest, context: Any) -> pb.TableInfo:
        view = await self.service.set_retention(
            current_call().tenant,
            request.table.namespace,
            request.table.name,
            _optional(request, "retention_ms"),
            _optional(request, "retention_records"),
        )
        return table_info(view)

    async def DescribeTable(self, request: pb.DescribeTableRequest, context: Any) -> pb.TableInfo:
        view = await self.service.describe_table(
            current_call().tenant, request.table.namespace, request.table.name
        )
        return table_info(view)

    async def AlterSchema(self, request: pb.AlterSchemaRequest, context: Any) -> pb.TableInfo:
        changes = [
            {
                k: getattr(c, k)
                for k in ("op", "column", "type", "doc", "nullable")
                if k in ("op", "column") or c.HasField(k)
            }
            for c in request.changes
        ]
        view = await self.service.alter_schema(
            current_call().tenant, request.table.namespace, request.table.name, changes
        )
        return table_info(view)

    async def ListTables(
        self, request: pb.ListTablesRequest, context: Any
    ) -> pb.ListTablesResponse:
        page = await self.service.list_tables_page(
            current_call().tenant,
            request.namespace or None,
            request.page_size,
            request.page_token,
            request.name_contains,
        )
        return pb.ListTablesResponse(
            tables=[table_info(v) for v in page.items], next_page_token=page.next_page_token
        )

    async def ListSnapshots(
        self, request: pb.ListSnapshotsRequest, context: Any
    ) -> pb.ListSnapshotsResponse:
        snaps = await self.service.list_snapshots(
            current_call().tenant, request.table.namespace, request.table.name
        )
        return pb.ListSnapshotsResponse(
            snapshots=[
                pb.Snapshot(
                    snapshot_id=s.snapshot_id,
                    timestamp_ms=s.timestamp_ms,
                    operation=s.operation,
                    summary=dict(s.summary),
                )
                for s in snaps
            ]
        )

    async def DropTable(self, request: pb.DropTableRequest, context: Any) -> pb.DropTableResponse:
        await self.service.drop_table(
            current_call().tenant, request.table.namespace, request.table.name
        )
        return pb.DropTableResponse()

    # Appends -----------------------------------------------------------------------------
    async def _append(self, request: pb.AppendRequest) -> pb.AppendResponse:
        ranges = await self.calls.append_arrow(
            current_call().tenant,
            request.table.namespace,
            request.table.name,
            # Each read of a protobuf bytes field returns a fresh copy: take it once.
            request.arrow_ipc,
            partition=request.partition if request.HasField("partition") else None,
            producer_id=request.producer_id or None,
            sequence=request.sequence if request.HasField("sequence") else None,
        )
        return append_response(ranges)

    async def Append(self, request: pb.AppendRequest, context: Any) -> pb.AppendResponse:
        return await self._append(request)

    async def AppendStream(
        self, request_iterator: AsyncIterator[pb.AppendStreamRequest], context: Any
    ) -> AsyncIterator[pb.AppendStreamResponse]:
        """Appends answered in order. The stream holds one of the tenant's append-stream
        slots (the interceptor's); each message is a request of its own (its credential
        checked again, charged to requests/s, served under one of the tenant's in-flight
        slots), and a stream that sends nothing for ``server.stream_idle_s`` is ended."""
        caller = current_call()
        idle_s = self.settings.server.stream_idle_s
        messages = aiter(request_iterator)
        while True:
            try:
                req = await asyncio.wait_for(anext(messages, None), idle_s)
            except TimeoutError:
                log.debug("an append stream of tenant %s was idle for %ss", caller.tenant, idle_s)
                return
            if req is None:
                return
            try:
                async with self.calls.stream_message(caller.tenant, caller.authorization):
                    ok = await self._append(req.append)
                yield pb.AppendStreamResponse(request_id=req.request_id, ok=ok)
            except (Unauthenticated, PermissionDenied):
                raise  # a revoked key or a suspended tenant ends the stream
            except Exception as exc:
                # One refused request does not end the stream: it is answered in place.
                err = wire_error(exc, "AppendStream")
                yield pb.AppendStreamResponse(request_id=req.request_id, error=error_to_pb(err))

    # Reads -------------------------------------------------------------------------------
    async def Read(self, request: pb.ReadRequest, context: Any) -> AsyncIterator[pb.ReadResponse]:
        caller = current_call()
        ns, name = request.table.namespace, request.table.name
        max_bytes = request.max_bytes or None
        if request.follow:
            async for msgs in self.calls.follow(
                caller.tenant,
                ns,
                name,
                request.partition,
                request.offset,
                _read_messages,
                max_records=request.max_records or None,
                max_bytes=max_bytes,
                authorization=caller.authorization,
                raw_hot=request.raw_hot,
            ):
                for msg in msgs:
                    yield msg
            return
        wanted = request.max_records or self.settings.server.default_read_records
        offset, seen = request.offset, 0
        while True:
            msgs = await self.calls.read(
                caller.tenant, ns, name, request.partition, offset, wanted - seen, max_bytes,
                _read_messages, raw_hot=request.raw_hot,
            )  # fmt: skip
            last = msgs[-1]
            got = last.next_offset - offset  # offsets are dense
            if got == 0:
                if seen == 0:
                    yield last  # an empty read still tells where the log ends
                return
            for msg in msgs:
                yield msg
            seen += got
            offset = last.next_offset
            if seen >= wanted or offset >= last.high_watermark:
                return

    # Offsets and consumer groups ---------------------------------------------------------
    async def OffsetsForTimes(
        self, request: pb.OffsetsForTimesRequest, context: Any
    ) -> pb.OffsetsForTimesResponse:
        found = await self.calls.offsets_for_times(
            current_call().tenant,
            request.table.namespace,
            request.table.name,
            request.timestamp_us,
            list(request.partitions),
        )
        return pb.OffsetsForTimesResponse(offsets=_partition_offsets(found))

    async def CommitOffsets(
        self, request: pb.CommitOffsetsRequest, context: Any
    ) -> pb.CommitOffsetsResponse:
        await self.service.commit_offsets(
            current_call().tenant,
            request.group,
            request.table.namespace,
            request.table.name,
            {o.partition: o.offset for o in request.offsets},
            member_id=request.member_id,
            generation=request.generation,
        )
        return pb.CommitOffsetsResponse()

    async def FetchOffsets(
        self, request: pb.FetchOffsetsRequest, context: Any
    ) -> pb.FetchOffsetsResponse:
        found = await self.service.fetch_offsets(
            current_call().tenant,
            request.group,
            request.table.namespace,
            request.table.name,
            list(request.partitions),
        )
        return pb.FetchOffsetsResponse(offsets=_partition_offsets(found))

    async def ListGroups(
        self, request: pb.ListGroupsRequest, context: Any
    ) -> pb.ListGroupsResponse:
        ref = request.table if request.HasField("table") else None
        found = await self.service.list_groups(
            current_call().tenant, ref.namespace if ref else None, ref.name if ref else None
        )
        return pb.ListGroupsResponse(
            groups=[
                pb.GroupTable(group=g, table=pb.TableRef(namespace=ns, name=n))
                for g, ns, n in found
            ]
        )

    async def GroupHeartbeat(
        self, request: pb.GroupHeartbeatRequest, context: Any
    ) -> pb.GroupHeartbeatResponse:
        answer = await self.service.group_heartbeat(
            current_call().tenant,
            request.group,
            request.table.namespace,
            request.table.name,
            member_id=request.member_id,
            generation=request.generation,
            owned=list(request.owned),
            session_timeout_ms=request.session_timeout_ms,
            client_id=request.client_id,
            leave=request.leave,
        )
        return pb.GroupHeartbeatResponse(
            member_id=answer.member_id,
            generation=answer.generation,
            assigned=answer.assigned,
            pending=answer.pending,
            settling=answer.settling,
        )

    async def DescribeGroup(
        self, request: pb.DescribeGroupRequest, context: Any
    ) -> pb.DescribeGroupResponse:
        view = await self.service.describe_group(
            current_call().tenant, request.group, request.table.namespace, request.table.name
        )
        return group_info(view)

    # Scans and plans ---------------------------------------------------------------------
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


def _millis(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def server_options(settings: Settings, max_connections: int | None = None) -> list[tuple[str, int]]:
    """The grpc server's channel arguments: message limits, and bounds on connections that
    do nothing (a stranger's sockets, a vanished client's)."""
    s = settings.server
    options = [
        # 1 MiB more than the append limit, so that our check, with its clear reason,
        # answers an oversized append first.
        ("grpc.max_receive_message_length", s.max_request_bytes + 1024 * 1024),
        ("grpc.max_send_message_length", 64 * 1024 * 1024),
        ("grpc.so_reuseport", 0),
        # A connection that never finishes its HTTP/2 handshake (a bare TCP socket).
        ("grpc.server_handshake_timeout_ms", _millis(s.header_timeout_s)),
        ("grpc.max_allowed_incoming_connections", max_connections or s.max_connections),
        # One with no call for a while is closed; the client reconnects when it needs to.
        ("grpc.max_connection_idle_ms", _millis(s.grpc_max_connection_idle_s)),
        # A peer that vanished without closing is found by an unanswered ping.
        ("grpc.keepalive_time_ms", _millis(s.grpc_keepalive_s)),
        ("grpc.keepalive_timeout_ms", _millis(s.grpc_keepalive_timeout_s)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]
    if s.grpc_max_connection_age_s:
        options += [
            ("grpc.max_connection_age_ms", _millis(s.grpc_max_connection_age_s)),
            ("grpc.max_connection_age_grace_ms", _millis(s.shutdown_grace_s)),
        ]
    return options


class GrpcEdge:
    """The grpc.aio server with the Tidegate service, health and reflection (and the admin
    service when the gate is a :class:`Tenancy`)."""

    def __init__(
        self,
        service: StreamTables,
        settings: Settings,
        gate: Gate | None = None,
        calls: DataCalls | None = None,
        max_connections: int | None = None,
    ) -> None:
        self.settings = settings
        gate = gate or OpenGate(settings.tenant)
        calls = calls or DataCalls(service, gate)
        self.server = grpc.aio.server(
            interceptors=[CallInterceptor(gate)],
            options=server_options(settings, max_connections),
        )
        pb_grpc.add_TidegateServicer_to_server(TidegateServicer(calls, settings), self.server)
        services = [SERVICE_NAME]
        if isinstance(gate, Tenancy):
            from gateway.server.grpc_admin import AdminServicer
            from gateway.wire._proto.tidegate.v1 import admin_pb2_grpc

            admin_pb2_grpc.add_AdminServicer_to_server(AdminServicer(gate), self.server)
            services.append(ADMIN_SERVICE_NAME)
        self.health = HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            [
                *services,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ],
            self.server,
        )
        self.port = self.server.add_insecure_port(
            f"{settings.server.host}:{settings.server.grpc_port}"
        )

    async def start(self) -> None:
        await self.server.start()
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        await self.health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace: float) -> None:
        """Flip health to NOT_SERVING first, so balancers drain us, then stop."""
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)
