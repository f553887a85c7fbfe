"""The synchronous client: :class:`Client`, :class:`Producer` and :class:`Consumer`.

Its twin :mod:`gateway.client.aio` has the same surface with ``async`` methods; both drive
the I/O-free modules of the package (``_batching``, ``_producer``, ``_reading``). Imports
neither the server nor Spark.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, cast

import grpc
import pyarrow as pa

from gateway.client._arrow import delete_ipc, dict_rows, ipc, rows_ipc
from gateway.client._calls import SyncCalls
from gateway.client._flight import flight_read, flight_scan, range_ended_early, throttle_wait
from gateway.client._lake_read import lake_read
from gateway.client._lake_scan import ScanMode, check_mode, lake_batches, lake_scan
from gateway.client._reading import label_tier, read_response_batches, scan_request, scan_table
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
from gateway.client._sync_consumer import Consumer
from gateway.client._sync_producer import Producer
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

__all__ = ["Client", "Consumer", "Producer"]

#: The first client's name for :func:`gateway.client._arrow.ipc` (tests use it).
_ipc = ipc


class Client(SyncCalls):
    """A connection to one gateway over gRPC.

    Args:
        endpoint: ``host:port``; a ``grpcs://`` or ``https://`` prefix turns TLS on.
        api_key: sent as ``authorization: Bearer <api_key>`` on every call.
        tls: use TLS (default: when ``root_certificates`` is given or the scheme says so).
        root_certificates: PEM roots to verify the gateway with (default: system roots).
        timeout: seconds per unary call.
        retry: policy for idempotent calls (describe, list, read, offsets); appends are
            retried only by the :class:`Producer`, whose batches are idempotent.
        connect_timeout: seconds to keep trying a gateway this client has never reached
            (nothing listens, a wrong address) before raising
            :class:`~gateway.wire.errors.Unavailable` naming the address; once reached,
            ``retry`` alone decides (a gateway restart is ridden out).
        flight: scans go over the gateway's Arrow Flight edge when it offers one (True,
            the default: asked once with ``GetGatewayInfo``), never (False), or over the
            Flight edge at this location (``grpc+tcp://host:port``, ``grpc+tls://...``).
        warehouse: the gateway's local warehouse folder as this host sees it (the folder,
            or a mount of it): client-side scans (``scan(mode=...)``) read the plan's
            data files there, at disk speed, instead of through the gateway's links.

    Example::

        with Client("127.0.0.1:50051") as c:
            c.create_table("shop.orders", {"id": "int64", "item": "string"}, partitions=4)
            c.append("shop.orders", [{"id": 1, "item": "kettle"}])
            print(c.read("shop.orders", partition=0, offset=0).to_pylist())
    """

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._close_readers()
        self._channel.close()

    # Tables ----------------------------------------------------------------------------
    def create_table(
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
        """Create a table; ``schema`` is ``{column: arrow type name}`` or a list of fields.

        With ``exist_ok``, a table of that name that exists already is described instead
        (its schema is not compared)."""
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
            return TableInfo.from_pb(self._call("CreateTable", request))
        except TableAlreadyExists:
            if not exist_ok:
                raise
        return self.describe_table(table)

    def alter_schema(
        self, table: str | TableRef, changes: Sequence[Mapping[str, Any]]
    ) -> TableInfo:
        """Evolve the table's schema by ``changes``, applied in order, all or none:

        - ``{"op": "add_column", "column": c, "type": t, "doc"?: d}``: a nullable column
          (rows written before read it as null; appends may leave it out);
        - ``{"op": "update_type", "column": c, "type": t}``: widen int32 to int64 or
          float32 to float64;
        - ``{"op": "make_optional", "column": c}``: let a required column hold nulls;
        - ``{"op": "update_doc", "column": c, "doc": d}``: set (or, with None, clear)
          the column's doc.

        Returns the table as described after the change (``schema_version`` raised by
        one).

        Raises:
            SchemaChangeRefused: any other change (drop, rename, narrowing, another type
                change); nothing changed.
            CommitConflict: a concurrent schema change won; describe and retry.
        """
        request = pb.AlterSchemaRequest(table=ref(table), changes=schema_changes(changes))
        return TableInfo.from_pb(self._call("AlterSchema", request))

    def alter_table(
        self,
        table: str | TableRef,
        *,
        retention_ms: int | None = None,
        retention_records: int | None = None,
    ) -> TableInfo:
        """Change the table's retention: a value given replaces it (0 removes that
        limit), None keeps it. The gateway's retention job applies it at its next run;
        records below each partition's ``earliest_offset`` are gone for good.

        Raises:
            InvalidRequest: a value that is not a retention (negative, not an integer).
        """
        request = alter_table_request(table, retention_ms, retention_records)
        return TableInfo.from_pb(self._call("AlterTable", request))

    def list_tables(self, namespace: str = "", *, name_contains: str = "") -> list[TableInfo]:
        """Every table of the tenant (of ``namespace`` only, when given) by namespace and
        name, whose name holds ``name_contains`` when given: page after page."""
        tables: list[TableInfo] = []
        token = ""
        while True:
            page, token = self.list_tables_page(
                namespace, page_token=token, name_contains=name_contains
            )
            tables.extend(page)
            if not token:
                return tables

    def list_tables_page(
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
        response = self._call("ListTables", request, idempotent=True)
        return [TableInfo.from_pb(t) for t in response.tables], response.next_page_token

    def list_snapshots(self, table: str | TableRef) -> list[Snapshot]:
        """The table's Iceberg snapshots, oldest first (what ``as_of`` can name)."""
        request = pb.ListSnapshotsRequest(table=ref(table))
        response = self._call("ListSnapshots", request, idempotent=True)
        return [Snapshot.from_pb(s) for s in response.snapshots]

    def drop_table(self, table: str | TableRef) -> None:
        self._call("DropTable", pb.DropTableRequest(table=ref(table)))

    # Tenants, keys and quotas arrive with the tenancy API: add their calls here, next to
    # the table admin calls, once the gateway serves them.

    # Writes ----------------------------------------------------------------------------
    def append_ipc(
        self,
        table: str | TableRef,
        arrow_ipc: bytes,
        *,
        partition: int | None = None,
        producer_id: str | None = None,
        sequence: int | None = None,
    ) -> list[AppendRange]:
        """Append an already encoded Arrow IPC stream (one unary call, no retry)."""
        request = append_request(table, arrow_ipc, partition, producer_id, sequence)
        return ranges_from_pb(self._call("Append", request))

    def append(
        self,
        table: str | TableRef,
        rows: Any,
        *,
        partition: int | None = None,
        producer_id: str | None = None,
        sequence: int | None = None,
        compression: Compression = "none",
    ) -> list[AppendRange]:
        """Append rows (an Arrow table or batch, a pandas frame, or a list of dicts) in one
        request; the gateway routes them. For batching and retries use :meth:`producer`.

        Dict rows are converted by the table's schema and take what the producer, HTTP
        JSON and the CLI take: an ``int`` for an ``int32`` column, an ISO-8601 string or a
        ``datetime`` for a timestamp, a string or a ``Decimal`` for a decimal."""
        rows_list = dict_rows(rows)
        if rows_list is None:
            return self.append_ipc(
                table,
                ipc(rows, compression),
                partition=partition,
                producer_id=producer_id,
                sequence=sequence,
            )
        # Dict rows are converted by the table's schema, as every other interface does.
        return self._known(
            table,
            lambda info: self.append_ipc(
                table,
                rows_ipc(rows_list, info.write_schema, info.write_omittable, compression),
                partition=partition,
                producer_id=producer_id,
                sequence=sequence,
            ),
        )

    def delete(
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
        return self._known(
            table,
            lambda info: self.append_ipc(
                table,
                delete_ipc(keys, info.schema, info.primary_key, str(info.ref)),
                producer_id=producer_id,
                sequence=sequence,
            ),
        )

    def get(self, table: str | TableRef, keys: Any) -> pa.Table:
        """Point lookups of a primary-key table: the live row of each key (a dict of the
        key's columns, or a list of them); keys not live are left out."""
        return self._known(
            table,
            lambda info: lookup_table(
                self._call("Lookup", lookup_request(table, keys, info), idempotent=True)
            ),
        )

    def producer(self, table: str | TableRef, **config: Any) -> Producer:
        """A :class:`Producer` for ``table``; keyword arguments as for :class:`Producer`."""
        return Producer(self, table, **config)

    # Reads -----------------------------------------------------------------------------
    def read_batches(
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
    ) -> Iterator[tuple[list[pa.RecordBatch], int, int]]:
        """``(batches, next_offset, high_watermark)`` per response message.

        With ``with_tier`` each batch has one more column, ``_tier``: "iceberg" or "hot",
        the tier that served the record.

        With ``follow`` the iterator waits for new records until ``max_records`` have
        arrived or ``timeout`` seconds pass (then it ends quietly).
        """
        request = read_request(table, partition, offset, max_records, max_bytes, follow)
        call = self._stub.Read(
            request,
            timeout=timeout if follow else (timeout or self.timeout),
            metadata=self.metadata,
        )
        try:
            for msg in call:
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

    def read_range(
        self, table: str | TableRef, *, partition: int, start: int, end: int
    ) -> Iterator[list[pa.RecordBatch]]:
        """Records ``[start, end)`` of a partition (below its high watermark), in order, in
        a few large reads: over the gateway's Arrow Flight edge when it offers one, else
        over gRPC. What a bulk reader (the Spark connector's hot ranges) wants."""
        flight = self._flight()
        offset = start
        started = time.monotonic()
        while offset < end:
            before = offset
            steps = (
                (
                    (b, n)
                    for b, n, _, _ in flight.read_steps(
                        flight_read(table, partition, offset, end - offset)
                    )
                )
                if flight is not None
                else (
                    (b, n)
                    for b, n, _ in self.read_batches(
                        table, partition=partition, offset=offset, max_records=end - offset
                    )
                )
            )
            try:
                for batches, next_offset in steps:
                    if batches:
                        yield batches
                    offset = max(offset, next_offset)
            except Throttled as exc:  # over the read quota: on from ``offset`` after a wait
                time.sleep(throttle_wait(exc, started))
                continue
            if offset == before:
                raise range_ended_early(table, partition, offset, start, end)

    def read(
        self,
        table: str | TableRef,
        *,
        partition: int,
        offset: int,
        max_records: int = 0,
        max_bytes: int = 0,
        mode: ScanMode = "auto",
    ) -> pa.Table:
        """Records of one partition from ``offset`` (user columns plus system columns).

        ``mode`` says who reads the records below the tiered watermark, as for
        :meth:`scan`: ``"auto"`` (this client reads them from the Iceberg files when it
        can reach them, the gateway the rest, stitched into one answer), ``"client"``
        (always this client for those) or ``"server"`` (the gateway reads everything);
        the same records either way (docs/client.md)."""
        batches, _ = lake_read(self, table, partition, offset, max_records, max_bytes, mode)
        return pa.Table.from_batches(batches) if batches else pa.table({})

    def fetch(
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
                    for chunk, next_offset, _ in self.read_batches(
                        ref, partition=partition, offset=offset, max_records=max_records,
                        with_tier=True,
                    ):  # fmt: skip
                        out.extend(b for b in chunk if b.num_rows)
                        nxt = max(nxt, next_offset)
                else:
                    out, nxt = lake_read(self, ref, partition, offset, max_records, 0, mode)
                self.reach.ok()
                return out, nxt
            except TidegateError as err:
                failures += 1
                delay = self.reach.next_delay(retry or self.retry, err, failures, started)
                if delay is None:
                    raise self.reach.explain(err) from None
                time.sleep(delay)

    def consumer(self, table: str | TableRef, **options: Any) -> Consumer:
        """A :class:`Consumer` of ``table``; keyword arguments as for :class:`Consumer`."""
        return Consumer(self, table, **options)

    # Scans -----------------------------------------------------------------------------
    def scan_batches(
        self,
        table: str | TableRef,
        *,
        columns: Sequence[str] = (),
        filter: str = "",
        as_of: int | str | None = None,
        limit: int | None = None,
        mode: ScanMode = "auto",
    ) -> Iterator[pa.RecordBatch]:
        """Batches of the whole table (cold snapshot plus hot tail, one consistent view)
        with a projection, a filter (``"v > 5 and tag is not null"``, see
        :mod:`gateway.wire.filters`) and a limit. With ``as_of`` (a snapshot id or an
        ISO-8601 time) only that Iceberg snapshot is read.

        ``mode`` says where the scan runs (see :meth:`scan`); a server-side scan goes over
        the gateway's Arrow Flight edge when it offers one (see ``flight``)."""
        check_mode(mode)
        if mode != "server":
            lake = lake_batches(self, table, columns, filter, as_of, limit, mode)
            if lake is not None:
                yield from lake
                return
        request = scan_request(table, columns, filter, as_of, limit)
        flight = self._flight()
        if flight is not None:  # its errors name the Flight edge, not the gRPC address
            yield from flight.scan_batches(flight_scan(request))
            return
        try:
            for msg in self._stub.Scan(request, timeout=self.timeout, metadata=self.metadata):
                yield from pa.ipc.open_stream(msg.arrow_ipc)
        except grpc.RpcError as exc:
            raise self.reach.explain(error_from_rpc(exc)) from None

    def scan(
        self,
        table: str | TableRef,
        *,
        columns: Sequence[str] = (),
        filter: str = "",
        as_of: int | str | None = None,
        limit: int | None = None,
        mode: ScanMode = "auto",
    ) -> pa.Table:
        """:meth:`scan_batches` as one ``pyarrow.Table`` (``.to_pandas()`` for pandas).

        ``mode`` says where the scan runs. ``"auto"`` (the default): this client asks the
        gateway for a read plan and reads its Parquet files itself (in ``warehouse`` when
        given and holding them, else through the plan's links: the gateway's file links
        on a local warehouse, presigned URLs on object storage), fetching only the hot
        ranges from the gateway; where it cannot reach the files, the gateway scans.
        ``"client"``: always itself, :class:`~gateway.wire.errors.Unavailable` when it
        cannot reach them. ``"server"``: the gateway reads and sends every row. All three
        answer the same rows of one pinned view (docs/client.md)."""
        check_mode(mode)
        if mode != "server":
            rows = lake_scan(self, table, columns, filter, as_of, limit, mode)
            if rows is not None:
                return rows
        request = scan_request(table, columns, filter, as_of, limit)
        flight = self._flight()
        if flight is not None:
            return flight.scan(flight_scan(request))
        try:
            messages = list(self._stub.Scan(request, timeout=self.timeout, metadata=self.metadata))
        except grpc.RpcError as exc:
            raise self.reach.explain(error_from_rpc(exc)) from None
        return scan_table(messages)

    def flight_location(self) -> str | None:
        """Where this client's scans go: the gateway's Arrow Flight edge (asked once, on
        first use), or None when they use gRPC (no Flight edge, or ``flight=False``)."""
        flight = self._flight()
        return flight.location if flight is not None else None

    def plan_read(
        self, table: str | TableRef, *, filter: str = "", as_of: int | str | None = None
    ) -> pb.PlanReadResponse:
        """A read plan: the pinned snapshot's data files (URLs readable without warehouse
        credentials) and the hot ranges per partition."""
        request = plan_request(table, filter, as_of)
        return cast(pb.PlanReadResponse, self._call("PlanRead", request, idempotent=True))

    # Offsets ---------------------------------------------------------------------------
    def offsets_for_times(
        self,
        table: str | TableRef,
        when: dt.datetime | float,
        partitions: Sequence[int] | None = None,
    ) -> dict[int, int]:
        """Per partition, the first offset appended at or after ``when`` (a datetime, or
        epoch seconds); the high watermark where nothing is that recent."""
        request = offsets_for_times_request(table, when, partitions)
        response = self._call("OffsetsForTimes", request, idempotent=True)
        return offsets_of(response)

    def commit_offsets(
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
        self._call("CommitOffsets", request, idempotent=True)

    def describe_group(self, group: str, table: str | TableRef) -> GroupInfo:
        """The group on ``table``: its generation and state, its live members and what
        each holds, and per partition its member, committed offset and lag."""
        request = pb.DescribeGroupRequest(group=group, table=ref(table))
        return GroupInfo.from_pb(self._call("DescribeGroup", request, idempotent=True))

    def list_groups(self, table: str | TableRef | None = None) -> list[tuple[str, TableRef]]:
        """``(group, table)`` for every consumer group with committed offsets (of ``table``
        only when given)."""
        request = list_groups_request(table)
        response = self._call("ListGroups", request, idempotent=True)
        return groups_of(response)

    def fetch_offsets(
        self, group: str, table: str | TableRef, partitions: Sequence[int] | None = None
    ) -> dict[int, int]:
        """``group``'s committed offsets; partitions never committed are absent."""
        request = fetch_offsets_request(group, table, partitions)
        response = self._call("FetchOffsets", request, idempotent=True)
        return offsets_of(response)


# --------------------------------------------------------------------------------------
# Producer
# --------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------
# Consumer
# --------------------------------------------------------------------------------------
