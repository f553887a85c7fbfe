"""The consumer's and scanner's pure helpers: start positions, progress, scan messages."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence

import pyarrow as pa

from gateway.client._types import StartAt, TableInfo, TableRef
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire.codec import decode_stream
from gateway.wire.errors import InvalidPartition, OffsetOutOfRange
from gateway.wire.schema import SYSTEM_COLUMNS
from gateway.wire.stored import HotPiece, piece_rows

__all__ = [
    "TIER_COLUMN",
    "label_tier",
    "mark_consumed",
    "read_response_batches",
    "reset_position",
    "scan_request",
    "scan_table",
    "skip_removed",
    "start_positions",
]

#: The column ``with_tier`` reads add: "iceberg" or "hot", the tier that served the record.
TIER_COLUMN = "_tier"


def label_tier(batches: list[pa.RecordBatch], tiered_watermark: int) -> list[pa.RecordBatch]:
    """``batches`` with :data:`TIER_COLUMN`: offsets below the read's tiered watermark came
    from the Iceberg table, the others from the hot tier."""
    import pyarrow.compute as pc

    out = []
    for b in batches:
        cold = pc.less(b.column("_offset"), pa.scalar(tiered_watermark, pa.int64()))
        tier = pc.if_else(cold, pa.scalar("iceberg"), pa.scalar("hot"))
        out.append(b.append_column(TIER_COLUMN, tier))
    return out


def read_response_batches(msg: pb.ReadResponse, partition: int) -> list[pa.RecordBatch]:
    """The records of one Read answer, user columns then system columns: those of its
    Arrow stream, then those of its hot batches as stored (read with ``raw_hot``), which
    are put in the table's schema (the stream's) and given their system columns here."""
    if not msg.arrow_ipc:
        return []
    schema, batches = decode_stream(msg.arrow_ipc)
    if msg.hot_batches:
        user = pa.schema([f for f in schema if f.name not in SYSTEM_COLUMNS])
        for hb in msg.hot_batches:
            piece = HotPiece(hb.arrow_ipc, hb.base_offset, hb.timestamp_us, hb.skip, hb.count)
            batches.extend(piece_rows(piece, user, partition))
    return batches


def mark_consumed(consumed: dict[int, int], batch: pa.RecordBatch) -> None:
    """Move ``consumed`` past ``batch`` (a batch of one partition, with system columns)."""
    p = batch.column("_partition")[0].as_py()
    consumed[p] = batch.column("_offset")[-1].as_py() + 1


def reset_position(err: OffsetOutOfRange, position: int, start: StartAt) -> int | None:
    """Where a consumer goes on when its position fell below the earliest offset
    (retention removed the records it had not read yet), as Kafka's
    ``auto.offset.reset`` does: the high watermark for a consumer started at
    ``"latest"``, else the earliest offset. None: the position is not below the earliest
    (past the end: the caller's error)."""
    try:
        earliest = int(err.details["earliest"])
        latest = int(err.details["latest"])
    except (KeyError, TypeError, ValueError):
        return None
    if position >= earliest:
        return None
    return latest if start == "latest" else earliest


def skip_removed(
    err: OffsetOutOfRange,
    partition: int,
    positions: dict[int, int],
    consumed: dict[int, int],
    start: StartAt,
) -> None:
    """Move a consumer of ``partition`` past records retention removed before it read
    them (see :func:`reset_position`), or raise ``err`` when that is not what it says."""
    moved = reset_position(err, positions[partition], start)
    if moved is None:
        raise err
    positions[partition] = consumed[partition] = moved


def start_positions(
    table: TableInfo,
    partitions: Sequence[int],
    committed: Mapping[int, int],
    start: StartAt,
    by_time: Mapping[int, int] | None,
) -> dict[int, int]:
    """Where each partition starts: its committed offset, else ``start``."""
    out: dict[int, int] = {}
    for p in partitions:
        if not 0 <= p < table.partitions:
            raise InvalidPartition(f"partition {p} does not exist in {table.ref}")
        if p in committed:
            out[p] = committed[p]
        elif start == "earliest":
            out[p] = table.earliest_offsets[p]
        elif start == "latest":
            out[p] = table.high_watermarks[p]
        elif isinstance(start, dt.datetime):
            assert by_time is not None
            out[p] = by_time[p]
        elif isinstance(start, int) and not isinstance(start, bool):
            out[p] = start
        else:
            raise ValueError(
                f"start must be 'earliest', 'latest', an offset or a datetime, not {start!r}"
            )
    return out


def scan_request(
    table: str | TableRef,
    columns: Sequence[str],
    filter: str,
    as_of: int | str | None,
    limit: int | None,
) -> pb.ScanRequest:
    return pb.ScanRequest(
        table=TableRef.parse(table).pb(),
        columns=list(columns),
        filter=filter,
        as_of="" if as_of is None else str(as_of),
        limit=limit,
    )


def scan_table(messages: Sequence[pb.ScanResponse]) -> pa.Table:
    """The rows of a Scan call's messages; the first message always carries the schema."""
    schema: pa.Schema | None = None
    batches: list[pa.RecordBatch] = []
    for msg in messages:
        reader = pa.ipc.open_stream(msg.arrow_ipc)
        schema = reader.schema
        batches.extend(reader)
    return pa.Table.from_batches(batches, schema)
