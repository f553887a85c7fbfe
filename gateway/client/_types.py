"""The SDK's small value types and their protobuf conversions (no I/O)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import pyarrow as pa

from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire.schema import parse_fields
from gateway.wire.types import AppendRange

__all__ = [
    "AppendRange",
    "RecordMetadata",
    "StartAt",
    "TableInfo",
    "TableRef",
    "ranges_from_pb",
    "table_fields",
    "timestamp_us",
]

#: Where a consumer starts in a partition without a committed offset.
StartAt = Literal["earliest", "latest"] | int | dt.datetime


class RecordMetadata(NamedTuple):
    """Where one produced record landed."""

    partition: int
    offset: int


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

    def __str__(self) -> str:
        return f"{self.namespace}.{self.name}"


@dataclass(frozen=True, slots=True)
class TableInfo:
    """What the producer and consumer need of a table (from ``DescribeTable``)."""

    ref: TableRef
    schema: pa.Schema
    partitions: int
    key_columns: tuple[str, ...]
    high_watermarks: tuple[int, ...] = ()
    earliest_offsets: tuple[int, ...] = ()

    @classmethod
    def from_pb(cls, info: pb.TableInfo) -> TableInfo:
        fields = [{"name": f.name, "type": f.type, "nullable": f.nullable} for f in info.fields]
        parts = sorted(info.partition_info, key=lambda p: p.partition)
        return cls(
            ref=TableRef(info.table.namespace, info.table.name),
            schema=parse_fields(fields),
            partitions=info.partitions,
            key_columns=tuple(info.key_columns),
            high_watermarks=tuple(p.high_watermark for p in parts),
            earliest_offsets=tuple(p.earliest_offset for p in parts),
        )


def table_fields(schema: Mapping[str, str] | Sequence[Mapping[str, Any]]) -> list[pb.Field]:
    if isinstance(schema, Mapping):
        return [pb.Field(name=k, type=v, nullable=True) for k, v in schema.items()]
    return [
        pb.Field(name=f["name"], type=f["type"], nullable=f.get("nullable", True)) for f in schema
    ]


def ranges_from_pb(response: pb.AppendResponse) -> list[AppendRange]:
    return [AppendRange(r.partition, r.base_offset, r.count, r.duplicate) for r in response.ranges]


def timestamp_us(when: dt.datetime | float | int) -> int:
    """Microseconds since the epoch of an aware datetime (naive means UTC) or epoch seconds."""
    if isinstance(when, dt.datetime):
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.UTC)
        delta = when - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return int(when * 1_000_000)
