"""The requests both client flavours send and what they read from the answers (no I/O):
one place for the protobuf of every call, so the sync and asyncio clients differ only in
how they wait."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from gateway.client._types import TableInfo, TableRef, table_fields, timestamp_us
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire.codec import decode_stream, encode_stream
from gateway.wire.keywrites import key_batch

__all__ = [
    "append_request",
    "commit_offsets_request",
    "create_table_request",
    "fetch_offsets_request",
    "groups_of",
    "list_groups_request",
    "offsets_for_times_request",
    "offsets_of",
    "plan_request",
    "read_request",
    "ref",
]


def ref(table: str | TableRef) -> pb.TableRef:
    return TableRef.parse(table).pb()


def create_table_request(
    table: str | TableRef,
    schema: Mapping[str, str] | Sequence[Mapping[str, Any]],
    partitions: int,
    key_columns: Sequence[str],
    retention_ms: int | None = None,
    retention_records: int | None = None,
    primary_key: Sequence[str] = (),
    merge_engine: str | Mapping[str, str] | None = None,
) -> pb.CreateTableRequest:
    engine = {"type": merge_engine} if isinstance(merge_engine, str) else merge_engine
    return pb.CreateTableRequest(
        table=ref(table),
        fields=table_fields(schema),
        partitions=partitions,
        key_columns=list(key_columns),
        retention_ms=retention_ms,
        retention_records=retention_records,
        primary_key=list(primary_key),
        merge_engine=pb.MergeEngine(**engine) if engine is not None else None,
    )


def alter_table_request(
    table: str | TableRef, retention_ms: int | None, retention_records: int | None
) -> pb.AlterTableRequest:
    return pb.AlterTableRequest(
        table=ref(table), retention_ms=retention_ms, retention_records=retention_records
    )


def append_request(
    table: str | TableRef,
    arrow_ipc: bytes,
    partition: int | None,
    producer_id: str | None,
    sequence: int | None,
) -> pb.AppendRequest:
    return pb.AppendRequest(
        table=ref(table),
        arrow_ipc=arrow_ipc,
        partition=partition,
        producer_id=producer_id or "",
        sequence=sequence,
    )


def read_request(
    table: str | TableRef,
    partition: int,
    offset: int,
    max_records: int,
    max_bytes: int,
    follow: bool,
) -> pb.ReadRequest:
    return pb.ReadRequest(
        table=ref(table),
        partition=partition,
        offset=offset,
        max_records=max_records,
        max_bytes=max_bytes,
        follow=follow,
        raw_hot=True,
    )


def plan_request(table: str | TableRef, filter: str, as_of: int | str | None) -> pb.PlanReadRequest:
    return pb.PlanReadRequest(
        table=ref(table), filter=filter, as_of="" if as_of is None else str(as_of)
    )


def offsets_for_times_request(
    table: str | TableRef, when: dt.datetime | float, partitions: Sequence[int] | None
) -> pb.OffsetsForTimesRequest:
    return pb.OffsetsForTimesRequest(
        table=ref(table), timestamp_us=timestamp_us(when), partitions=list(partitions or ())
    )


def commit_offsets_request(
    group: str,
    table: str | TableRef,
    offsets: Mapping[int, int],
    member_id: str | None = None,
    generation: int = 0,
) -> pb.CommitOffsetsRequest:
    return pb.CommitOffsetsRequest(
        group=group,
        table=ref(table),
        offsets=[pb.PartitionOffset(partition=p, offset=o) for p, o in offsets.items()],
        member_id=member_id or "",
        generation=generation,
    )


def fetch_offsets_request(
    group: str, table: str | TableRef, partitions: Sequence[int] | None
) -> pb.FetchOffsetsRequest:
    return pb.FetchOffsetsRequest(group=group, table=ref(table), partitions=list(partitions or ()))


def list_groups_request(table: str | TableRef | None) -> pb.ListGroupsRequest:
    request = pb.ListGroupsRequest()
    if table is not None:
        request.table.CopyFrom(ref(table))
    return request


def offsets_of(response: Any) -> dict[int, int]:
    """``{partition: offset}`` of an answer carrying ``PartitionOffset``s."""
    return {o.partition: o.offset for o in response.offsets}


def groups_of(response: pb.ListGroupsResponse) -> list[tuple[str, TableRef]]:
    return [(g.group, TableRef(g.table.namespace, g.table.name)) for g in response.groups]


def lookup_request(table: str | TableRef, keys: Any, info: TableInfo) -> pb.LookupRequest:
    """The point lookups of ``keys`` (one dict of the key's columns, a list of them, or an
    Arrow table or batch of the key's columns) in ``info``'s table.

    Raises:
        SchemaMismatch: no primary key, or a key not naming exactly its columns.
    """
    batch = key_batch(keys, info.schema, info.primary_key, str(info.ref))
    return pb.LookupRequest(table=ref(table), arrow_ipc=encode_stream([batch], batch.schema))


def lookup_table(response: pb.LookupResponse) -> pa.Table:
    """The rows a Lookup call found."""
    schema, batches = decode_stream(response.arrow_ipc)
    return pa.Table.from_batches(batches, schema)
