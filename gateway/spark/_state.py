"""Batch reads of a primary-key table: its current state, one input partition per table
partition, each answered by the gateway's scan of that partition (the state table's rows
merged with the partition's hot changes; docs/decisions/primary-keys.md, "Spark reads of
a key table")."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from gateway.client._consuming import Outage
from gateway.spark._pushdown import OffsetBounds
from gateway.spark._splits import ReadSpec
from gateway.wire.errors import SchemaMismatch, TidegateError
from gateway.wire.filters import And, Compare, to_text
from gateway.wire.schema import PARTITION_COLUMN

__all__ = ["StateSplit", "read_state", "state_splits"]


@dataclass(frozen=True)
class StateSplit(InputPartition):
    """The current state of one partition of a key table, scanned by the gateway."""

    partition: int
    #: The state table's snapshot to read alone (``as_of``), or None: the current state.
    as_of: str | None = None


def state_splits(partitions: int, bounds: OffsetBounds, as_of: str | None) -> list[StateSplit]:
    """One split per table partition the filter can keep: a key's versions all live in
    its partition, so partitions are read apart and in parallel."""
    return [StateSplit(p, as_of) for p in range(partitions) if bounds.keeps(p)]


def read_state(spec: ReadSpec, split: StateSplit) -> Iterator[pa.RecordBatch]:
    """The partition's live rows the pushed filter keeps, as batches of ``spec.output``.

    The partition is fetched whole before its first row is handed on (the gateway holds
    it whole for its merge too), so a gateway outage is ridden by asking again, never by
    resuming a half-read answer."""
    where = Compare(PARTITION_COLUMN, "=", split.partition)
    text = to_text(where if spec.filter is None else And((where, spec.filter)))
    # A read of no column (a count) still needs rows: ask for one and drop it.
    columns = list(spec.columns) or [PARTITION_COLUMN]
    outage = Outage(
        spec.connection.endpoint,
        f"tidegate read of {spec.connection.table} partition {split.partition}",
        spec.reconnect_timeout,
    )
    while True:
        try:
            rows = spec.connection.shared().scan(
                spec.connection.table,
                columns=columns,
                filter=text,
                as_of=split.as_of,
                mode="server",
            )
            outage.ok()
            break
        except TidegateError as err:
            time.sleep(outage.failed(err))
    _check_types(spec, rows.schema)
    out = spec.output
    for batch in rows.select(list(spec.columns)).to_batches():
        if batch.num_rows:
            yield spec.conform(batch, out)


def _check_types(spec: ReadSpec, current: pa.Schema) -> None:
    """Refuse, in one sentence, a column whose type changed since the DataFrame was
    loaded (Spark's schema of the DataFrame is that one)."""
    for name in spec.columns:
        was, now = spec.stored.field(name).type, current.field(name).type
        if not now.equals(was):
            raise SchemaMismatch(
                f"tidegate: the schema of {spec.connection.table} changed since the "
                f"DataFrame was loaded (column {name!r} is {now} now, was {was}); load it again"
            )
