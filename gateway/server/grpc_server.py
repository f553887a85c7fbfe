"""The gRPC edge (grpc.aio): the Tidegate service, health and reflection.

Errors are translated once, in :class:`ErrorInterceptor`: a :class:`TidegateError` becomes
its gRPC status with a ``google.rpc.Status`` in the ``grpc-status-details-bin`` trailer
holding ``ErrorInfo`` (reason, domain, metadata) and, for retryable errors, ``RetryInfo``.

Callers are authenticated once, in :class:`gateway.server.grpc_auth.AuthInterceptor`
(inside the error interceptor, so its refusals are translated like any error); the
servicer learns the tenant from :func:`gateway.server.grpc_auth.current_tenant`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

import grpc
import pyarrow as pa
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from gateway import metrics
from gateway.config import Settings
from gateway.core import ReadResult, StreamTables, TableView
from gateway.server.grpc_auth import ADMIN_SERVICE_NAME, AuthInterceptor, current_tenant
from gateway.tenancy import Tenancy
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire._proto.tidegate.v1 import tidegate_pb2_grpc as pb_grpc
from gateway.wire.codec import decode_stream, encode_stream
from gateway.wire.errors import RequestTooLarge, TidegateError
from gateway.wire.status import STATUS_DETAILS_KEY, error_to_pb, error_to_status
from gateway.wire.types import AppendRange

__all__ = ["ErrorInterceptor", "GrpcEdge", "TidegateServicer"]

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Tidegate"].full_name
#: Bytes of Arrow data per Read response message.
_READ_CHUNK_BYTES = 1024 * 1024
#: Scan responses carry about this much Arrow data each.
_SCAN_CHUNK_BYTES = 4 * 1024 * 1024


async def _abort(context: grpc.aio.ServicerContext[Any, Any], err: TidegateError) -> None:
    status = error_to_status(err)
    await context.abort(
        err.grpc_code,
        err.message,
        trailing_metadata=((STATUS_DETAILS_KEY, status.SerializeToString()),),
    )


def _internal(exc: BaseException) -> TidegateError:
    log.exception("unexpected error in a gRPC call", exc_info=exc)
    return TidegateError("internal error; see the gateway log")


class ErrorInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Translates every escaping exception into a gRPC status, in one place."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or not method.startswith(
            (f"/{SERVICE_NAME}/", f"/{ADMIN_SERVICE_NAME}/")
        ):
            return handler
        if handler.unary_unary:
            inner_uu = handler.unary_unary

            async def unary_unary(request: Any, context: Any) -> Any:
                try:
                    return await inner_uu(request, context)
                except TidegateError as err:
                    await _abort(context, err)
                except (grpc.aio.AbortError, grpc.aio.UsageError):
                    raise
                except Exception as exc:
                    await _abort(context, _internal(exc))

            return grpc.unary_unary_rpc_method_handler(
                unary_unary, handler.request_deserializer, handler.response_serializer
            )
        inner_stream = handler.unary_stream or handler.stream_stream

        async def streaming(request: Any, context: Any) -> AsyncIterator[Any]:
            try:
                async for item in inner_stream(request, context):
                    yield item
            except TidegateError as err:
                await _abort(context, err)
            except (grpc.aio.AbortError, grpc.aio.UsageError):
                raise
            except Exception as exc:
                await _abort(context, _internal(exc))

        make = (
            grpc.unary_stream_rpc_method_handler
            if handler.unary_stream
            else grpc.stream_stream_rpc_method_handler
        )
        return make(streaming, handler.request_deserializer, handler.response_serializer)


# --------------------------------------------------------------------------------------
# Conversions
# --------------------------------------------------------------------------------------
def table_info(view: TableView) -> pb.TableInfo:
    d = view.definition
    return pb.TableInfo(
        table=pb.TableRef(namespace=d.namespace, name=d.name),
        table_id=d.table_id,
        fields=[pb.Field(name=f["name"], type=f["type"], nullable=f["nullable"]) for f in d.fields],
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
    )


def _ranges(ranges: Iterable[AppendRange]) -> pb.AppendResponse:
    return pb.AppendResponse(
        ranges=[
            pb.AppendRange(
                partition=r.partition,
                base_offset=r.base_offset,
                count=r.count,
                duplicate=r.duplicate,
            )
            for r in ranges
        ]
    )


def _pieces(batch: pa.RecordBatch, target_bytes: int) -> Iterable[pa.RecordBatch]:
    """``batch`` cut into zero-copy slices of about ``target_bytes`` each."""
    if batch.nbytes <= target_bytes or batch.num_rows <= 1:
        yield batch
        return
    rows = max(1, batch.num_rows * target_bytes // batch.nbytes)
    for start in range(0, batch.num_rows, rows):
        yield batch.slice(start, rows)


def _read_messages(result: ReadResult) -> Iterable[pb.ReadResponse]:
    """One ReadResponse per ~1 MiB of batches; the last carries the result's next offset."""
    pending: list[pa.RecordBatch] = []
    size = 0
    for i, b in enumerate(result.batches):
        pending.append(b)
        size += b.nbytes
        last = i == len(result.batches) - 1
        if size >= _READ_CHUNK_BYTES or last:
            next_offset = int(pending[-1].column("_offset")[-1].as_py()) + 1
            yield pb.ReadResponse(
                arrow_ipc=encode_stream(pending, result.schema),
                next_offset=next_offset,
                high_watermark=result.high_watermark,
            )
            pending, size = [], 0


class TidegateServicer(pb_grpc.TidegateServicer):  # type: ignore[misc]
    def __init__(
        self, service: StreamTables, settings: Settings, tenancy: Tenancy | None = None
    ) -> None:
        self.service = service
        self.settings = settings
        self.tenancy = tenancy

    def tenant(self, context: grpc.aio.ServicerContext[Any, Any]) -> str:
        """The tenant of a call, as the auth interceptor resolved it (``settings.tenant``
        on an edge built without tenancy)."""
        return current_tenant() or self.settings.tenant

    async def CreateTable(self, request: pb.CreateTableRequest, context: Any) -> pb.TableInfo:
        fields = [{"name": f.name, "type": f.type, "nullable": f.nullable} for f in request.fields]
        tenant = self.tenant(context)
        if self.tenancy is not None:
            await self.tenancy.check_create_table(tenant, request.partitions)
        view = await self.service.create_table(
            tenant,
            request.table.namespace,
            request.table.name,
            fields,
            request.partitions,
            list(request.key_columns),
        )
        context.set_code(grpc.StatusCode.OK)
        return table_info(view)

    async def DescribeTable(self, request: pb.DescribeTableRequest, context: Any) -> pb.TableInfo:
        view = await self.service.describe_table(
            self.tenant(context), request.table.namespace, request.table.name
        )
        return table_info(view)

    async def ListTables(
        self, request: pb.ListTablesRequest, context: Any
    ) -> pb.ListTablesResponse:
        views = await self.service.list_tables(self.tenant(context), request.namespace or None)
        return pb.ListTablesResponse(tables=[table_info(v) for v in views])

    async def DropTable(self, request: pb.DropTableRequest, context: Any) -> pb.DropTableResponse:
        await self.service.drop_table(
            self.tenant(context), request.table.namespace, request.table.name
        )
        return pb.DropTableResponse()

    async def _append(self, request: pb.AppendRequest, context: Any) -> pb.AppendResponse:
        # Each read of a protobuf bytes field returns a fresh copy: take the payload once.
        body = request.arrow_ipc
        nbytes = len(body)
        limit = self.settings.server.max_request_bytes
        if nbytes > limit:
            raise RequestTooLarge(
                f"the append carries {nbytes} bytes; the limit is {limit}",
                limit=limit,
            )
        tenant = self.tenant(context)
        charge = (
            self.tenancy.append_charge(tenant, nbytes)
            if self.tenancy is not None
            else contextlib.nullcontext()
        )
        async with charge:
            _, batches = decode_stream(body)
            ranges = await self.service.append(
                tenant,
                request.table.namespace,
                request.table.name,
                batches,
                partition=request.partition if request.HasField("partition") else None,
                producer_id=request.producer_id or None,
                sequence=request.sequence if request.HasField("sequence") else None,
            )
        records = sum(r.count for r in ranges)
        metrics.record_append(records, nbytes)
        if self.tenancy is not None:
            self.tenancy.record_append(tenant, records, nbytes)
        return _ranges(ranges)

    async def Append(self, request: pb.AppendRequest, context: Any) -> pb.AppendResponse:
        return await self._append(request, context)

    async def AppendStream(
        self, request_iterator: AsyncIterator[pb.AppendStreamRequest], context: Any
    ) -> AsyncIterator[pb.AppendStreamResponse]:
        async for req in request_iterator:
            try:
                ok = await self._append(req.append, context)
                yield pb.AppendStreamResponse(request_id=req.request_id, ok=ok)
            except TidegateError as err:
                yield pb.AppendStreamResponse(
                    request_id=req.request_id,
                    error=error_to_pb(err),
                )

    async def _check_read(self, tenant: str) -> None:
        if self.tenancy is not None:
            await self.tenancy.check_read(tenant)

    async def _messages(self, tenant: str, result: ReadResult) -> list[pb.ReadResponse]:
        metrics.record_read(result.num_records)
        msgs = await self.service.offload(lambda: list(_read_messages(result)))
        if self.tenancy is not None:
            nbytes = sum(len(m.arrow_ipc) for m in msgs)
            await self.tenancy.record_read(tenant, result.num_records, nbytes)
        return msgs

    async def Read(self, request: pb.ReadRequest, context: Any) -> AsyncIterator[pb.ReadResponse]:
        tenant = self.tenant(context)
        ns, name = request.table.namespace, request.table.name
        max_bytes = request.max_bytes or None
        await self._check_read(tenant)
        if request.follow:
            async for result in self.service.follow(
                tenant,
                ns,
                name,
                request.partition,
                request.offset,
                max_records=request.max_records or None,
                max_bytes=max_bytes,
            ):
                for msg in await self._messages(tenant, result):
                    yield msg
                await self._check_read(tenant)
            return
        wanted = request.max_records or self.settings.server.default_read_records
        offset, seen = request.offset, 0
        while True:
            if seen:
                await self._check_read(tenant)
            result = await self.service.read(
                tenant, ns, name, request.partition, offset, wanted - seen, max_bytes
            )
            msgs = await self._messages(tenant, result)
            if not result.num_records:
                if seen == 0:
                    # An empty read still tells the client where the log ends.
                    yield pb.ReadResponse(
                        next_offset=result.next_offset, high_watermark=result.high_watermark
                    )
                return
            for msg in msgs:
                yield msg
            seen += result.num_records
            offset = result.next_offset
            if seen >= wanted or offset >= result.high_watermark:
                return

    # Offsets and consumer groups ----------------------------------------------------------
    async def OffsetsForTimes(
        self, request: pb.OffsetsForTimesRequest, context: Any
    ) -> pb.OffsetsForTimesResponse:
        found = await self.service.offsets_for_times(
            self.tenant(context),
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
            self.tenant(context),
            request.group,
            request.table.namespace,
            request.table.name,
            {o.partition: o.offset for o in request.offsets},
        )
        return pb.CommitOffsetsResponse()

    async def FetchOffsets(
        self, request: pb.FetchOffsetsRequest, context: Any
    ) -> pb.FetchOffsetsResponse:
        found = await self.service.fetch_offsets(
            self.tenant(context),
            request.group,
            request.table.namespace,
            request.table.name,
            list(request.partitions),
        )
        return pb.FetchOffsetsResponse(offsets=_partition_offsets(found))

    async def Scan(self, request: pb.ScanRequest, context: Any) -> AsyncIterator[pb.ScanResponse]:
        tenant = self.tenant(context)
        await self._check_read(tenant)
        result = await self.service.scan(
            tenant,
            request.table.namespace,
            request.table.name,
            columns=list(request.columns) or None,
            row_filter=request.filter or None,
            as_of=request.as_of or None,
            limit=request.limit if request.HasField("limit") else None,
        )
        snapshot_id = result.snapshot_id or 0
        pending: list[pa.RecordBatch] = []
        size, sent = 0, False
        async for batch in result.batches:
            # A whole data file can come as one batch: cut it so that messages stay near
            # _SCAN_CHUNK_BYTES and the next is encoded while the last one is on the wire.
            for piece in _pieces(batch, _SCAN_CHUNK_BYTES):
                pending.append(piece)
                size += piece.nbytes
                if size >= _SCAN_CHUNK_BYTES:
                    yield await self._scan_message(tenant, pending, result.schema, snapshot_id)
                    pending, size, sent = [], 0, True
        if pending or not sent:
            yield await self._scan_message(tenant, pending, result.schema, snapshot_id)

    async def _scan_message(
        self, tenant: str, batches: list[pa.RecordBatch], schema: pa.Schema, snapshot_id: int
    ) -> pb.ScanResponse:
        payload = await self.service.offload(encode_stream, batches, schema)
        msg = pb.ScanResponse(arrow_ipc=payload, snapshot_id=snapshot_id)
        records = sum(b.num_rows for b in batches)
        metrics.record_read(records)
        if self.tenancy is not None:
            await self.tenancy.record_read(tenant, records, len(msg.arrow_ipc))
        return msg

    async def PlanRead(self, request: pb.PlanReadRequest, context: Any) -> pb.PlanReadResponse:
        tenant = self.tenant(context)
        await self._check_read(tenant)
        plan = await self.service.plan(
            tenant,
            request.table.namespace,
            request.table.name,
            row_filter=request.filter or None,
            as_of=request.as_of or None,
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
                )
                for f in plan.files
            ],
            hot_ranges=[
                pb.HotRange(partition=r.partition, from_offset=r.from_offset, to_offset=r.to_offset)
                for r in plan.hot_ranges
            ],
            arrow_schema=encode_stream([], plan.schema),
        )


def _partition_offsets(offsets: dict[int, int]) -> list[pb.PartitionOffset]:
    return [pb.PartitionOffset(partition=p, offset=o) for p, o in sorted(offsets.items())]


class GrpcEdge:
    """The grpc.aio server with the Tidegate service, health and reflection."""

    def __init__(
        self, service: StreamTables, settings: Settings, tenancy: Tenancy | None = None
    ) -> None:
        self.settings = settings
        max_message = settings.server.max_request_bytes + 1024 * 1024
        interceptors: list[grpc.aio.ServerInterceptor] = [ErrorInterceptor()]
        if tenancy is not None:
            interceptors.append(AuthInterceptor(tenancy))
        self.server = grpc.aio.server(
            interceptors=interceptors,
            options=[
                ("grpc.max_receive_message_length", max_message),
                ("grpc.max_send_message_length", 64 * 1024 * 1024),
                ("grpc.so_reuseport", 0),
            ],
        )
        pb_grpc.add_TidegateServicer_to_server(
            TidegateServicer(service, settings, tenancy), self.server
        )
        services = [SERVICE_NAME]
        if tenancy is not None:
            from gateway.server.grpc_admin import AdminServicer
            from gateway.wire._proto.tidegate.v1 import admin_pb2_grpc

            admin_pb2_grpc.add_AdminServicer_to_server(AdminServicer(tenancy), self.server)
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
