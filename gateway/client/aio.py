"""The asyncio client: the twin of :mod:`gateway.client._sync` on ``grpc.aio``.

Same methods, same producer and consumer behaviour (both drive the I/O-free modules of
the package: ``_batching``, ``_producer``, ``_reading``), with ``async`` methods, awaitable
sends and ``async for`` iteration::

    async with AsyncClient("127.0.0.1:50051") as c:
        async with c.producer("shop.events") as p:
            fut = await p.send({"kind": "view", "n": 1})
        print(await fut)  # RecordMetadata(partition=0, offset=0)
        async with c.consumer("shop.events", follow=False) as consumer:
            async for record in consumer:
                print(record)
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, cast

import grpc
import grpc.aio
import pyarrow as pa

from gateway.client._aio_consumer import AsyncConsumer
from gateway.client._aio_producer import AsyncProducer
from gateway.client._arrow import decode, ipc
from gateway.client._channel import (
    DEFAULT_CONNECT_TIMEOUT,
    Reach,
    call_metadata,
    channel_credentials,
    channel_options,
    normalise_target,
)
from gateway.client._reading import label_tier, scan_request, scan_table
from gateway.client._types import (
    AppendRange,
    Snapshot,
    TableInfo,
    TableRef,
    ranges_from_pb,
    table_fields,
    timestamp_us,
)
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire._proto.tidegate.v1 import tidegate_pb2_grpc as pb_grpc
from gateway.wire.codec import Compression
from gateway.wire.errors import TableAlreadyExists, TidegateError
from gateway.wire.retry import Retry
from gateway.wire.status import error_from_rpc

__all__ = ["AsyncClient", "AsyncConsumer", "AsyncProducer", "Client", "Consumer", "Producer"]

DEFAULT_CALL_RETRY = Retry(timeout=30.0)


class AsyncClient:
    """A connection to one gateway over ``grpc.aio``; see :class:`gateway.client.Client`
    for the arguments. Create it inside the event loop that uses it."""

    def __init__(
        self,
        endpoint: str,
        *,
        api_key: str | None = None,
        tls: bool | None = None,
        root_certificates: bytes | None = None,
        timeout: float = 30.0,
        retry: Retry = DEFAULT_CALL_RETRY,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        target, scheme_tls = normalise_target(endpoint)
        self.timeout = timeout
        self.retry = retry
        self.reach = Reach(target, connect_timeout)
        self.metadata = call_metadata(api_key)
        creds = channel_credentials(tls if tls is not None else scheme_tls, root_certificates)
        opts = channel_options(options)
        self._channel = (
            grpc.aio.insecure_channel(target, options=opts)
            if creds is None
            else grpc.aio.secure_channel(target, creds, options=opts)
        )
        self._stub = pb_grpc.TidegateStub(self._channel)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    @property
    def stub(self) -> pb_grpc.TidegateStub:
        return self._stub

    async def _call(self, method: str, request: Any, *, idempotent: bool = False) -> Any:
        started = time.monotonic()
        failures = 0
        while True:
            try:
                answer = await getattr(self._stub, method)(
                    request, timeout=self.timeout, metadata=self.metadata
                )
            except grpc.RpcError as exc:
                err = error_from_rpc(exc)
                failures += 1
                delay = (
                    self.reach.next_delay(self.retry, err, failures, started)
                    if idempotent
                    else None
                )
                if delay is None:
                    raise self.reach.explain(err) from None
                await asyncio.sleep(delay)
            else:
                self.reach.ok()
                return answer

    # Tables ----------------------------------------------------------------------------
    async def create_table(
        self,
        table: str | TableRef,
        schema: Mapping[str, str] | Sequence[Mapping[str, Any]],
        *,
        partitions: int = 1,
        key_columns: Sequence[str] = (),
        exist_ok: bool = False,
    ) -> TableInfo:
        request = pb.CreateTableRequest(
            table=TableRef.parse(table).pb(),
            fields=table_fields(schema),
            partitions=partitions,
            key_columns=list(key_columns),
        )
        try:
            return TableInfo.from_pb(await self._call("CreateTable", request))
        except TableAlreadyExists:
            if not exist_ok:
                raise
        return await self.describe_table(table)

    async def describe_table(self, table: str | TableRef) -> TableInfo:
        request = pb.DescribeTableRequest(table=TableRef.parse(table).pb())
        return TableInfo.from_pb(await self._call("DescribeTable", request, idempotent=True))

    async def table_info(self, table: str | TableRef) -> TableInfo:
        return await self.describe_table(table)

    async def list_tables(self, namespace: str = "") -> list[TableInfo]:
        response = await self._call(
            "ListTables", pb.ListTablesRequest(namespace=namespace), idempotent=True
        )
        return [TableInfo.from_pb(t) for t in response.tables]

    async def list_snapshots(self, table: str | TableRef) -> list[Snapshot]:
        """The table's Iceberg snapshots, oldest first (what ``as_of`` can name)."""
        request = pb.ListSnapshotsRequest(table=TableRef.parse(table).pb())
        response = await self._call("ListSnapshots", request, idempotent=True)
        return [Snapshot.from_pb(s) for s in response.snapshots]

    async def drop_table(self, table: str | TableRef) -> None:
        await self._call("DropTable", pb.DropTableRequest(table=TableRef.parse(table).pb()))

    # Tenants, keys and quotas arrive with the tenancy API (see the sync client).

    # Writes ----------------------------------------------------------------------------
    async def append_ipc(
        self,
        table: str | TableRef,
        arrow_ipc: bytes,
        *,
        partition: int | None = None,
        producer_id: str | None = None,
        sequence: int | None = None,
    ) -> list[AppendRange]:
        request = pb.AppendRequest(
            table=TableRef.parse(table).pb(),
            arrow_ipc=arrow_ipc,
            partition=partition,
            producer_id=producer_id or "",
            sequence=sequence,
        )
        return ranges_from_pb(await self._call("Append", request))

    async def append(
        self,
        table: str | TableRef,
        rows: Any,
        *,
        partition: int | None = None,
        producer_id: str | None = None,
        sequence: int | None = None,
        compression: Compression = "none",
    ) -> list[AppendRange]:
        return await self.append_ipc(
            table,
            ipc(rows, compression),
            partition=partition,
            producer_id=producer_id,
            sequence=sequence,
        )

    def producer(self, table: str | TableRef, **config: Any) -> AsyncProducer:
        """An :class:`AsyncProducer` for ``table`` (it starts on ``async with`` or the first
        send)."""
        return AsyncProducer(self, table, **config)

    # Reads -----------------------------------------------------------------------------
    async def read_batches(
        self,
        table: str | TableRef,
        *,
        partition: int,
        offset: int,
        max_records: int = 0,
        max_bytes: int = 0,
        follow: bool = False,
        timeout: float | None = None,
        with_tier: bool = False,
    ) -> AsyncIterator[tuple[list[pa.RecordBatch], int, int]]:
        request = pb.ReadRequest(
            table=TableRef.parse(table).pb(),
            partition=partition,
            offset=offset,
            max_records=max_records,
            max_bytes=max_bytes,
            follow=follow,
        )
        call = self._stub.Read(
            request,
            timeout=timeout if follow else (timeout or self.timeout),
            metadata=self.metadata,
        )
        try:
            async for msg in call:
                batches = decode(msg.arrow_ipc)
                if with_tier:
                    batches = label_tier(batches, msg.tiered_watermark)
                yield batches, msg.next_offset, msg.high_watermark
        except grpc.RpcError as exc:
            if follow and cast(grpc.Call, exc).code() is grpc.StatusCode.DEADLINE_EXCEEDED:
                return
            raise self.reach.explain(error_from_rpc(exc)) from None
        finally:
            call.cancel()

    async def read(
        self,
        table: str | TableRef,
        *,
        partition: int,
        offset: int,
        max_records: int = 0,
        max_bytes: int = 0,
    ) -> pa.Table:
        batches: list[pa.RecordBatch] = []
        async for chunk, _, _ in self.read_batches(
            table, partition=partition, offset=offset, max_records=max_records, max_bytes=max_bytes
        ):
            batches.extend(chunk)
        if not batches:
            return pa.table({})
        return pa.Table.from_batches(batches)

    async def _read_once(
        self, ref: TableRef, partition: int, offset: int, max_records: int, with_tier: bool = False
    ) -> tuple[list[pa.RecordBatch], int]:
        started = time.monotonic()
        failures = 0
        while True:
            try:
                out: list[pa.RecordBatch] = []
                nxt = offset
                async for chunk, next_offset, _ in self.read_batches(
                    ref,
                    partition=partition,
                    offset=offset,
                    max_records=max_records,
                    with_tier=with_tier,
                ):
                    out.extend(b for b in chunk if b.num_rows)
                    nxt = max(nxt, next_offset)
                self.reach.ok()
                return out, nxt
            except TidegateError as err:
                failures += 1
                delay = self.reach.next_delay(self.retry, err, failures, started)
                if delay is None:
                    raise self.reach.explain(err) from None
                await asyncio.sleep(delay)

    def consumer(self, table: str | TableRef, **options: Any) -> AsyncConsumer:
        """An :class:`AsyncConsumer` of ``table`` (it starts on ``async with`` or the first
        read)."""
        return AsyncConsumer(self, table, **options)

    # Offsets ---------------------------------------------------------------------------
    async def scan_batches(
        self,
        table: str | TableRef,
        *,
        columns: Sequence[str] = (),
        filter: str = "",
        as_of: int | str | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[pa.RecordBatch]:
        """Batches of the whole table; see :meth:`gateway.client.Client.scan_batches`."""
        request = scan_request(table, columns, filter, as_of, limit)
        try:
            async for msg in self._stub.Scan(request, timeout=self.timeout, metadata=self.metadata):
                for batch in pa.ipc.open_stream(msg.arrow_ipc):
                    yield batch
        except grpc.RpcError as exc:
            raise self.reach.explain(error_from_rpc(exc)) from None

    async def scan(
        self,
        table: str | TableRef,
        *,
        columns: Sequence[str] = (),
        filter: str = "",
        as_of: int | str | None = None,
        limit: int | None = None,
    ) -> pa.Table:
        """The whole table as one ``pyarrow.Table``; see :meth:`Client.scan`."""
        request = scan_request(table, columns, filter, as_of, limit)
        try:
            messages = [
                m
                async for m in self._stub.Scan(
                    request, timeout=self.timeout, metadata=self.metadata
                )
            ]
        except grpc.RpcError as exc:
            raise self.reach.explain(error_from_rpc(exc)) from None
        return scan_table(messages)

    async def plan_read(
        self, table: str | TableRef, *, filter: str = "", as_of: int | str | None = None
    ) -> pb.PlanReadResponse:
        """A read plan; see :meth:`gateway.client.Client.plan_read`."""
        request = pb.PlanReadRequest(
            table=TableRef.parse(table).pb(),
            filter=filter,
            as_of="" if as_of is None else str(as_of),
        )
        return cast(pb.PlanReadResponse, await self._call("PlanRead", request, idempotent=True))

    async def offsets_for_times(
        self,
        table: str | TableRef,
        when: dt.datetime | float,
        partitions: Sequence[int] | None = None,
    ) -> dict[int, int]:
        request = pb.OffsetsForTimesRequest(
            table=TableRef.parse(table).pb(),
            timestamp_us=timestamp_us(when),
            partitions=list(partitions or ()),
        )
        response = await self._call("OffsetsForTimes", request, idempotent=True)
        return {o.partition: o.offset for o in response.offsets}

    async def commit_offsets(
        self, group: str, table: str | TableRef, offsets: Mapping[int, int]
    ) -> None:
        request = pb.CommitOffsetsRequest(
            group=group,
            table=TableRef.parse(table).pb(),
            offsets=[pb.PartitionOffset(partition=p, offset=o) for p, o in offsets.items()],
        )
        await self._call("CommitOffsets", request, idempotent=True)

    async def list_groups(self, table: str | TableRef | None = None) -> list[tuple[str, TableRef]]:
        """``(group, table)`` for every consumer group with committed offsets (of ``table``
        only when given)."""
        request = pb.ListGroupsRequest()
        if table is not None:
            request.table.CopyFrom(TableRef.parse(table).pb())
        response = await self._call("ListGroups", request, idempotent=True)
        return [(g.group, TableRef(g.table.namespace, g.table.name)) for g in response.groups]

    async def fetch_offsets(
        self, group: str, table: str | TableRef, partitions: Sequence[int] | None = None
    ) -> dict[int, int]:
        request = pb.FetchOffsetsRequest(
            group=group, table=TableRef.parse(table).pb(), partitions=list(partitions or ())
        )
        response = await self._call("FetchOffsets", request, idempotent=True)
        return {o.partition: o.offset for o in response.offsets}


# --------------------------------------------------------------------------------------
# Producer
# --------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------
# Consumer
# --------------------------------------------------------------------------------------


#: redis-py style names: ``from gateway.client import aio; aio.Client(...)``.
Client = AsyncClient
Producer = AsyncProducer
Consumer = AsyncConsumer
