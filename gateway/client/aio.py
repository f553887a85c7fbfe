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
from gateway.client._arrow import delete_ipc, dict_rows, ipc, rows_ipc
from gateway.client._calls import AsyncCalls
from gateway.client._flight import flight_read, flight_scan, range_ended_early, throttle_wait
from gateway.client._lake_read import lake_read_async
from gateway.client._lake_scan import ScanMode, check_mode, lake_batches_async, lake_scan_async
from gateway.client._reading import (
    label_tier,
    read_response_batches,
    scan_request,
    scan_table,
)
from gateway.client._requests import (
    alter_table_request,
    append_request,
    commit_offsets_request,
    create_table_request,
    fetch_offsets_request,
    groups_of,
    list_groups_request,
    lookup_request,
    lookup_table,
    offsets_for_times_request,
    offsets_of,
    plan_request,
    read_request,
    ref,
)
from gateway.client._types import (
    AppendRange,
    GroupInfo,
    Snapshot,
    TableInfo,
    TableRef,
    ranges_from_pb,
    schema_changes,
)
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire.codec import Compression
from gateway.wire.errors import TableAlreadyExists, Throttled, TidegateError
from gateway.wire.retry import Retry
from gateway.wire.status import error_from_rpc

__all__ = ["AsyncClient", "AsyncConsumer", "AsyncProducer", "Client", "Consumer", "Producer"]


class AsyncClient(AsyncCalls):
    """A connection to one gateway over ``grpc.aio``; see :class:`gateway.client.Client`
    for the arguments. Create it inside the event loop that uses it."""

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        self._close_readers()
        await self._channel.close()

    # Tables ----------------------------------------------------------------------------
    async def create_table(
        self,
        table: str | TableRef,
        schema: Mapping[str, str] | Sequence[Mapping[str, Any]],
        *,
        partitions: int = 1,
        key_columns: Sequence[str] = (),
        exist_ok: bool = False,
        retention_ms: int | None = None,
        retention_records: int | None = None,
        primary_key: Sequence[str] = (),
        merge_engine: str | Mapping[str, str] | None = None,
    ) -> TableInfo:
        request = create_table_request(
            table,
            schema,
            partitions,
            key_columns,
            retention_ms,
            retention_records,
            primary_key,
            merge_engine,
        )
        try:
            return TableInfo.from_pb(await self._call("CreateTable", request))
        except TableAlreadyExists:
            if not exist_ok:
                raise
        return await self.describe_table(table)

    async def alter_schema(
        self, table: str | TableRef, changes: Sequence[Mapping[str, Any]]
    ) -> TableInfo:
        """Evolve the table's schema by ``changes``, in order, all or none (see
        :meth:`gateway.client.Client.alter_schema` for the changes and errors)."""
        request = pb.AlterSchemaRequest(table=ref(table), changes=schema_changes(changes))
        return TableInfo.from_pb(await self._call("AlterSchema", request))

    async def alter_table(
        self,
        table: str | TableRef,
        *,
        retention_ms: int | None = None,
        retention_records: int | None = None,
    ) -> TableInfo:
        """Change the table's retention (see :meth:`gateway.client.Client.alter_table`)."""
        request = alter_table_request(table, retention_ms, retention_records)
        return TableInfo.from_pb(await self._call("AlterTable", request))

    async def list_tables(self, namespace: str = "", *, name_contains: str = "") -> list[TableInfo]:
        """Every table of the tenant (of ``namespace`` only, when given) by namespace and
        name, whose name holds ``name_contains`` when given: page after page."""
        tables: list[TableInfo] = []
        token = ""
        while True:
            page, token = await self.list_tables_page(
                namespace, page_token=token, name_contains=name_contains
            )
            tables.extend(page)
            if not token:
                return tables

    async def list_tables_page(
        self,
        namespace: str = "",
        *,
        page_size: int = 0,
        page_token: str = "",
        name_contains: str = "",
    ) -> tuple[list[TableInfo], str]:
        """One page of tables by namespace and name (``page_size`` 0: the gateway's
        default, 1,000 at most) and the token of the next page ("" after the last)."""
        request = pb.ListTablesRequest(
            namespace=namespace,
            page_size=page_size,
            page_token=page_token,
            name_contains=name_contains,
        )
        response = await self._call("ListTables", request, idempotent=True)
        return [TableInfo.from_pb(t) for t in response.tables], response.next_page_token

    async def list_snapshots(self, table: str | TableRef) -> list[Snapshot]:
        """The table's Iceberg snapshots, oldest first (what ``as_of`` can name)."""
        request = pb.ListSnapshotsRequest(table=ref(table))
        response = await self._call("ListSnapshots", request, idempotent=True)
        return [Snapshot.from_pb(s) for s in response.snapshots]

    async def drop_table(self, table: str | TableRef) -> None:
        await self._call("DropTable", pb.DropTableRequest(table=ref(table)))

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
        request = append_request(table, arrow_ipc, partition, producer_id, sequence)
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
        rows_list = dict_rows(rows)
        if rows_list is None:
            return await self.append_ipc(
                table,
                ipc(rows, compression),
                partition=partition,
                producer_id=producer_id,
                sequence=sequence,
            )

        # Dict rows are converted by the table's schema, as every other interface does.
        async def call(info: TableInfo) -> list[AppendRange]:
            data = rows_ipc(rows_list, info.write_schema, info.write_omittable, compression)
            return await self.append_ipc(
                table, data, partition=partition, producer_id=producer_id, sequence=sequence
            )

        return await self._known(table, call)

    async def delete(
        self,
        table: str | TableRef,
        keys: Any,
        *,
        producer_id: str | None = None,
        sequence: int | None = None,
    ) -> list[AppendRange]:
        """Delete rows of a primary-key table by key (a dict of the key's columns, or a
        list of them): an append of deletes (``_change`` 3), answered with the ``-D``
        changes made (count 0 where no key was live). Raises SchemaMismatch for a key
        that does not name exactly the key's columns."""

        async def call(info: TableInfo) -> list[AppendRange]:
            data = delete_ipc(keys, info.schema, info.primary_key, str(info.ref))
            return await self.append_ipc(table, data, producer_id=producer_id, sequence=sequence)

        return await self._known(table, call)

    async def get(self, table: str | TableRef, keys: Any) -> pa.Table:
        """Point lookups of a primary-key table: the live row of each key (a dict of the
        key's columns, or a list of them); keys not live are left out."""

        async def call(info: TableInfo) -> pa.Table:
            request = lookup_request(table, keys, info)
            return lookup_table(await self._call("Lookup", request, idempotent=True))

        return await self._known(table, call)

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
        request = read_request(table, partition, offset, max_records, max_bytes, follow)
        call = self._stub.Read(
            request,
            timeout=timeout if follow else (timeout or self.timeout),
            metadata=self.metadata,
        )
        try:
            async for msg in call:
                batches = read_response_batches(msg, partition)
                if with_tier:
                    batches = label_tier(batches, msg.tiered_watermark)
                yield batches, msg.next_offset, msg.high_watermark
        except grpc.RpcError as exc:
            if follow and cast(grpc.Call, exc).code() is grpc.StatusCode.DEADLINE_EXCEEDED:
                return
            raise self.reach.explain(error_from_rpc(exc)) from None
        finally:
            call.cancel()

    async def read_range(
        self, table: str | TableRef, *, partition: int, start: int, end: int
    ) -> AsyncIterator[list[pa.RecordBatch]]:
        """Records ``[start, end)`` in a few large reads; see
        :meth:`gateway.client.Client.read_range`."""
        flight = await self._flight()
        offset = start
        started = time.monotonic()
        while offset < end:
            before = offset
            try:
                if flight is not None:
                    # Flight's client blocks: each step is received on a worker thread.
                    steps = flight.read_steps(flight_read(table, partition, offset, end - offset))
                    try:
                        while (step := await asyncio.to_thread(next, steps, None)) is not None:
                            if step[0]:
                                yield step[0]
                            offset = max(offset, step[1])
                    finally:
                        steps.close()
                else:
                    async for batches, next_offset, _ in self.read_batches(
                        table, partition=partition, offset=offset, max_records=end - offset
                    ):
                        if batches:
                            yield batches
                        offset = max(offset, next_offset)
            except Throttled as exc:  # over the read quota: on from ``offset`` after a wait
                await asyncio.sleep(throttle_wait(exc, started))
                continue
            if offset == before:
                raise range_ended_early(table, partition, offset, start, end)

    async def read(
        self,
        table: str | TableRef,
        *,
        partition: int,
        offset: int,
        max_records: int = 0,
        max_bytes: int = 0,
        mode: ScanMode = "auto",
    ) -> pa.Table:
        """Records of one partition from ``offset``; ``mode`` as for
        :meth:`gateway.client.Client.read`."""
        batches, _ = await lake_read_async(
            self, table, partition, offset, max_records, max_bytes, mode
        )
        return pa.Table.from_batches(batches) if batches else pa.table({})

    async def fetch(
        self,
        ref: TableRef,
        partition: int,
        offset: int,
        max_records: int,
        with_tier: bool = False,
        retry: Retry | None = None,
        mode: ScanMode = "server",
    ) -> tuple[list[pa.RecordBatch], int]:
        """One bounded read of a partition, as a consumer's poll makes it: at most
        ``max_records`` from ``offset``, retried on retryable errors within ``retry`` (else
        the client's policy); ``(non-empty batches, next offset)``. ``mode`` as for
        :meth:`read` (``with_tier`` reads are the gateway's)."""
        started = time.monotonic()
        failures = 0
        while True:
            try:
                if with_tier:
                    out: list[pa.RecordBatch] = []
                    nxt = offset
                    async for chunk, next_offset, _ in self.read_batches(
                        ref, partition=partition, offset=offset, max_records=max_records,
                        with_tier=True,
                    ):  # fmt: skip
                        out.extend(b for b in chunk if b.num_rows)
                        nxt = max(nxt, next_offset)
                else:
                    out, nxt = await lake_read_async(
                        self, ref, partition, offset, max_records, 0, mode
                    )
                self.reach.ok()
                return out, nxt
            except TidegateError as err:
                failures += 1
                delay = self.reach.next_delay(retry or self.retry, err, failures, started)
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
        mode: ScanMode = "auto",
    ) -> AsyncIterator[pa.RecordBatch]:
        """Batches of the whole table; see :meth:`gateway.client.Client.scan_batches`."""
        check_mode(mode)
        if mode != "server":
            lake = await lake_batches_async(self, table, columns, filter, as_of, limit, mode)
            if lake is not None:
                async for batch in lake:
                    yield batch
                return
        request = scan_request(table, columns, filter, as_of, limit)
        flight = await self._flight()
        if flight is not None:
            # Flight's client blocks: each batch is received on a worker thread.
            batches = flight.scan_batches(flight_scan(request))
            try:
                while (batch := await asyncio.to_thread(next, batches, None)) is not None:
                    yield batch
            finally:
                batches.close()
            return
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
        mode: ScanMode = "auto",
    ) -> pa.Table:
        """The whole table as one ``pyarrow.Table``; see :meth:`Client.scan`."""
        check_mode(mode)
        if mode != "server":
            rows = await lake_scan_async(self, table, columns, filter, as_of, limit, mode)
            if rows is not None:
                return rows
        request = scan_request(table, columns, filter, as_of, limit)
        flight = await self._flight()
        if flight is not None:
            return await asyncio.to_thread(flight.scan, flight_scan(request))
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

    async def flight_location(self) -> str | None:
        """Where scans go; see :meth:`gateway.client.Client.flight_location`."""
        flight = await self._flight()
        return flight.location if flight is not None else None

    async def plan_read(
        self, table: str | TableRef, *, filter: str = "", as_of: int | str | None = None
    ) -> pb.PlanReadResponse:
        """A read plan; see :meth:`gateway.client.Client.plan_read`."""
        request = plan_request(table, filter, as_of)
        return cast(pb.PlanReadResponse, await self._call("PlanRead", request, idempotent=True))

    async def offsets_for_times(
        self,
        table: str | TableRef,
        when: dt.datetime | float,
        partitions: Sequence[int] | None = None,
    ) -> dict[int, int]:
        request = offsets_for_times_request(table, when, partitions)
        response = await self._call("OffsetsForTimes", request, idempotent=True)
        return offsets_of(response)

    async def commit_offsets(
        self,
        group: str,
        table: str | TableRef,
        offsets: Mapping[int, int],
        *,
        member_id: str | None = None,
        generation: int = 0,
    ) -> None:
        """Store ``group``'s committed offsets: partition -> next offset to consume.

        As a member (``member_id`` and its ``generation``; a consumer with ``group=``
        does this itself) the commit is refused with
        :class:`~gateway.wire.errors.IllegalGeneration` or
        :class:`~gateway.wire.errors.UnknownMember` unless the member still holds the
        partitions; without one, with :class:`~gateway.wire.errors.GroupNotEmpty` while
        the group has live members."""
        request = commit_offsets_request(group, table, offsets, member_id, generation)
        await self._call("CommitOffsets", request, idempotent=True)

    async def describe_group(self, group: str, table: str | TableRef) -> GroupInfo:
        """The group on ``table``: its generation and state, its live members and what
        each holds, and per partition its member, committed offset and lag."""
        request = pb.DescribeGroupRequest(group=group, table=ref(table))
        return GroupInfo.from_pb(await self._call("DescribeGroup", request, idempotent=True))

    async def list_groups(self, table: str | TableRef | None = None) -> list[tuple[str, TableRef]]:
        """``(group, table)`` for every consumer group with committed offsets (of ``table``
        only when given)."""
        request = list_groups_request(table)
        response = await self._call("ListGroups", request, idempotent=True)
        return groups_of(response)

    async def fetch_offsets(
        self, group: str, table: str | TableRef, partitions: Sequence[int] | None = None
    ) -> dict[int, int]:
        request = fetch_offsets_request(group, table, partitions)
        response = await self._call("FetchOffsets", request, idempotent=True)
        return offsets_of(response)


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
