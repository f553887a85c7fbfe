"""Synchronous gRPC client. Imports neither the server nor Spark."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import grpc
import pyarrow as pa
from google.rpc import error_details_pb2, status_pb2

from gateway._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway._proto.tidegate.v1 import tidegate_pb2_grpc as pb_grpc
from gateway.errors import (
    OffsetOutOfRange,
    RetryableError,
    TidegateError,
    Unavailable,
    error_for_reason,
)

__all__ = ["AppendRange", "Client", "TableRef", "error_from_rpc"]

_MAX_MESSAGE = 128 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class AppendRange:
    partition: int
    base_offset: int
    count: int
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class TableRef:
    namespace: str
    name: str

    @classmethod
    def parse(cls, table: str | TableRef) -> TableRef:
        if isinstance(table, TableRef):
            return table
        namespace, sep, name = table.partition(".")
        if not sep:
            raise ValueError(f"name a table as 'namespace.name', got {table!r}")
        return cls(namespace, name)

    def pb(self) -> pb.TableRef:
        return pb.TableRef(namespace=self.namespace, name=self.name)


def _build(
    reason: str, message: str, metadata: Mapping[str, str], retry_ms: int | None
) -> TidegateError:
    cls = error_for_reason(reason)
    if cls is OffsetOutOfRange:
        return OffsetOutOfRange(
            message,
            offset=int(metadata.get("offset", -1)),
            earliest=int(metadata.get("earliest", -1)),
            latest=int(metadata.get("latest", -1)),
        )
    details: dict[str, Any] = dict(metadata)
    details.pop("retry_after_ms", None)
    if issubclass(cls, RetryableError):
        return cls(message, retry_after_ms=retry_ms, **details)
    err = cls(message, **details)
    return err


def error_from_rpc(exc: grpc.RpcError) -> TidegateError:
    """The typed error behind a failed call, from its rich status details."""
    call = cast(grpc.Call, exc)
    code = call.code()
    message = call.details() or code.name
    reason = ""
    metadata: dict[str, str] = {}
    retry_ms: int | None = None
    for key, value in call.trailing_metadata() or ():
        if key != "grpc-status-details-bin":
            continue
        status = status_pb2.Status.FromString(value)
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                reason, metadata = info.reason, dict(info.metadata)
            elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                retry = error_details_pb2.RetryInfo()
                detail.Unpack(retry)
                retry_ms = retry.retry_delay.seconds * 1000 + retry.retry_delay.nanos // 1_000_000
    if not reason:
        if code is grpc.StatusCode.UNAVAILABLE:
            return Unavailable(message)
        reason = code.name
    err = _build(reason, message, metadata, retry_ms)
    if type(err) is TidegateError:
        err.details.setdefault("grpc_code", code.name)
    return err


def _ipc(data: pa.Table | pa.RecordBatch | Sequence[Mapping[str, Any]]) -> bytes:
    if isinstance(data, pa.RecordBatch):
        table = pa.Table.from_batches([data])
    elif isinstance(data, pa.Table):
        table = data
    else:
        table = pa.Table.from_pylist(list(data))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def _batches(data: bytes) -> list[pa.RecordBatch]:
    if not data:
        return []
    return list(pa.ipc.open_stream(pa.py_buffer(data)))


class Client:
    """A connection to one gateway over gRPC.

    Example::

        with Client("127.0.0.1:50051") as c:
            c.create_table("shop.orders", {"id": "int64", "item": "string"}, partitions=4)
            c.append("shop.orders", [{"id": 1, "item": "kettle"}])
            print(c.read("shop.orders", partition=0, offset=0).to_pylist())
    """

    def __init__(self, target: str, *, timeout: float = 30.0) -> None:
        self.timeout = timeout
        self._channel = grpc.insecure_channel(
            target,
            options=[
                ("grpc.max_receive_message_length", _MAX_MESSAGE),
                ("grpc.max_send_message_length", _MAX_MESSAGE),
            ],
        )
        self._stub = pb_grpc.TidegateStub(self._channel)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def _call(self, method: str, request: Any) -> Any:
        try:
            return getattr(self._stub, method)(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None

    # Tables ----------------------------------------------------------------------------
    def create_table(
        self,
        table: str | TableRef,
        schema: Mapping[str, str] | Sequence[Mapping[str, Any]],
        *,
        partitions: int = 1,
        key_columns: Sequence[str] = (),
    ) -> pb.TableInfo:
        ref = TableRef.parse(table)
        if isinstance(schema, Mapping):
            fields = [pb.Field(name=k, type=v, nullable=True) for k, v in schema.items()]
        else:
            fields = [
                pb.Field(name=f["name"], type=f["type"], nullable=f.get("nullable", True))
                for f in schema
            ]
        return cast(
            pb.TableInfo,
            self._call(
                "CreateTable",
                pb.CreateTableRequest(
                    table=ref.pb(),
                    fields=fields,
                    partitions=partitions,
                    key_columns=list(key_columns),
                ),
            ),
        )

    def describe_table(self, table: str | TableRef) -> pb.TableInfo:
        request = pb.DescribeTableRequest(table=TableRef.parse(table).pb())
        return cast(pb.TableInfo, self._call("DescribeTable", request))

    def list_tables(self, namespace: str = "") -> list[pb.TableInfo]:
        return list(self._call("ListTables", pb.ListTablesRequest(namespace=namespace)).tables)

    def drop_table(self, table: str | TableRef) -> None:
        self._call("DropTable", pb.DropTableRequest(table=TableRef.parse(table).pb()))

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
        """Append an already encoded Arrow IPC stream."""
        request = pb.AppendRequest(
            table=TableRef.parse(table).pb(),
            arrow_ipc=arrow_ipc,
            partition=partition,
            producer_id=producer_id or "",
            sequence=sequence,
        )
        response = self._call("Append", request)
        return [
            AppendRange(r.partition, r.base_offset, r.count, r.duplicate) for r in response.ranges
        ]

    def append(
        self,
        table: str | TableRef,
        rows: pa.Table | pa.RecordBatch | Sequence[Mapping[str, Any]],
        *,
        partition: int | None = None,
        producer_id: str | None = None,
        sequence: int | None = None,
    ) -> list[AppendRange]:
        """Append rows (an Arrow table or batch, or a list of dicts)."""
        return self.append_ipc(
            table, _ipc(rows), partition=partition, producer_id=producer_id, sequence=sequence
        )

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
    ) -> Iterator[tuple[list[pa.RecordBatch], int, int]]:
        """``(batches, next_offset, high_watermark)`` per response message.

        With ``follow`` the iterator waits for new records until ``max_records`` have
        arrived or ``timeout`` seconds pass (then it ends quietly).
        """
        request = pb.ReadRequest(
            table=TableRef.parse(table).pb(),
            partition=partition,
            offset=offset,
            max_records=max_records,
            max_bytes=max_bytes,
            follow=follow,
        )
        call = self._stub.Read(request, timeout=timeout if follow else (timeout or self.timeout))
        try:
            for msg in call:
                yield _batches(msg.arrow_ipc), msg.next_offset, msg.high_watermark
        except grpc.RpcError as exc:
            if follow and cast(grpc.Call, exc).code() is grpc.StatusCode.DEADLINE_EXCEEDED:
                return
            raise error_from_rpc(exc) from None
        finally:
            call.cancel()

    def read(
        self,
        table: str | TableRef,
        *,
        partition: int,
        offset: int,
        max_records: int = 0,
        max_bytes: int = 0,
    ) -> pa.Table:
        """Records of one partition from ``offset`` (user columns plus system columns)."""
        batches: list[pa.RecordBatch] = []
        for chunk, _, _ in self.read_batches(
            table, partition=partition, offset=offset, max_records=max_records, max_bytes=max_bytes
        ):
            batches.extend(chunk)
        if not batches:
            return pa.table({})
        return pa.Table.from_batches(batches)

    # Scans -----------------------------------------------------------------------------
    def scan(
        self,
        table: str | TableRef,
        *,
        columns: Sequence[str] = (),
        filter: str = "",
        as_of: int | str | None = None,
        limit: int | None = None,
    ) -> pa.Table:
        """The whole table (cold snapshot plus hot tail, one consistent view) with a
        projection, a filter in pyiceberg's expression syntax (``"v > 5 and tag is not
        null"``) and a limit. With ``as_of`` (a snapshot id or an ISO-8601 time) only that
        Iceberg snapshot is read."""
        request = pb.ScanRequest(
            table=TableRef.parse(table).pb(),
            columns=list(columns),
            filter=filter,
            as_of="" if as_of is None else str(as_of),
            limit=limit,
        )
        schema: pa.Schema | None = None
        batches: list[pa.RecordBatch] = []
        try:
            for msg in self._stub.Scan(request, timeout=self.timeout):
                reader = pa.ipc.open_stream(msg.arrow_ipc)
                schema = reader.schema
                batches.extend(reader)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None
        return pa.Table.from_batches(batches, schema)

    def plan_read(
        self, table: str | TableRef, *, filter: str = "", as_of: int | str | None = None
    ) -> pb.PlanReadResponse:
        """A read plan: the pinned snapshot's data files (URLs readable without
        warehouse credentials) and the hot ranges per partition."""
        request = pb.PlanReadRequest(
            table=TableRef.parse(table).pb(),
            filter=filter,
            as_of="" if as_of is None else str(as_of),
        )
        return cast(pb.PlanReadResponse, self._call("PlanRead", request))
