"""``df.write.format("tidegate")`` and ``writeStream``: appends through the gateway's
idempotent producer, exactly once across task retries.

Each task appends as producer ``spark/<write id>/<Spark partition>`` (with the micro-batch
id in streaming), one sequence per batch and table partition from 0. The batches are cut
by rows and bytes only, never by time, so a retried attempt over the same input re-sends
the same batches with the same sequences and the gateway answers the ones it already
stored as duplicates (with their original offsets) instead of storing them twice. A
sequence older than the gateway's de-duplication window is refused with the producer's
last sequence, which proves it was stored: the writer skips it. Any other refusal of an
idempotent append (an unknown producer at a sequence above 0, after a hot tier lost its
producer state; another batch under a sequence already used) proves nothing, and fails
the write in one sentence.

The JVM connector's writer (``gateway/spark/jvm``: ``PartitionWriter``, ``KeyRouting``)
appends with the same producer ids, sequences and routing.

The write id is the ``write_id`` option, else, for a batch write, an id drawn on the driver
when the write is planned (shared by every task and attempt of that write), and for a
streaming write the query id (kept in the checkpoint) plus the micro-batch id, so a batch
replayed after a restart de-duplicates too.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from gateway.client import Client
from gateway.spark._options import Connection, Options, SparkOptionError, described
from gateway.wire.errors import InvalidIdempotentAppend, TidegateError
from gateway.wire.routing import route_by_key
from gateway.wire.schema import SYSTEM_COLUMNS, conform_batch

__all__ = ["TidegateStreamWriter", "TidegateWriter", "WriteReport", "check_mode"]


def check_mode(overwrite: bool) -> None:
    if overwrite:
        raise SparkOptionError(
            "tidegate: save mode 'overwrite' is not supported: a stream-table only grows; "
            "use mode('append')"
        )


@dataclass
class WriteReport(WriterCommitMessage):
    """What one task appended: rows stored, and rows the gateway already had."""

    producer_id: str
    appended: int = 0
    duplicates: int = 0
    batches: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class _Target:
    connection: Connection
    schema: pa.Schema
    partitions: int
    key_columns: tuple[str, ...]
    batch_rows: int
    batch_bytes: int
    #: Fault injection for tests: the first attempt of each task fails after appending
    #: this many batches (0: never).
    fail_after_batches: int = 0


def _target(options: Options, schema: StructType) -> _Target:
    """The table and its schema, checked against the DataFrame's on the driver, so a
    mismatch fails the write before any task appends."""
    connection = options.connection()
    info = connection.table_info()
    given = to_arrow_schema(schema, timezone="UTC")
    user = pa.schema([f for f in given if f.name not in SYSTEM_COLUMNS])
    try:
        conform_batch(_empty(user), info.schema)
    except TidegateError as err:
        raise described(err, f"writing to {connection.table}") from None
    return _Target(
        connection,
        info.schema,
        info.partitions,
        info.key_columns,
        options.integer("batch_rows", 10_000),
        options.integer("batch_bytes", 4 << 20),
        options.integer("test_fail_after_batches", 0, minimum=0),
    )


def _empty(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)


class _Appender:
    """One task's appends: per table partition, batches cut at ``batch_rows`` rows or
    ``batch_bytes`` bytes, each sent with the next sequence of this producer."""

    def __init__(
        self, target: _Target, client: Client, producer_id: str, spread: int, attempt: int
    ) -> None:
        self.target, self.client = target, client
        self.fail_after = target.fail_after_batches if attempt == 0 else 0
        self.report = WriteReport(producer_id)
        self.spread = spread % target.partitions
        self.pending: dict[int, list[pa.RecordBatch]] = {}
        self.sequences: dict[int, int] = {}

    def add(self, batch: pa.RecordBatch) -> None:
        user = pa.RecordBatch.from_arrays(
            [batch.column(batch.schema.get_field_index(f.name)) for f in self.target.schema],
            names=self.target.schema.names,
        )
        rows = conform_batch(user, self.target.schema)
        if self.target.key_columns:
            groups = route_by_key(rows, self.target.key_columns, self.target.partitions)
            for p, idx in groups.items():
                self._queue(p, rows.take(idx))
        else:
            # No key: all of a Spark partition's rows go to one partition (chosen by the
            # Spark partition, so the tasks of a write spread over the table).
            self._queue(self.spread, rows)

    def _queue(self, partition: int, rows: pa.RecordBatch) -> None:
        queue = self.pending.setdefault(partition, [])
        queue.append(rows)
        while True:
            count = sum(b.num_rows for b in queue)
            size = sum(b.nbytes for b in queue)
            if count < self.target.batch_rows and size < self.target.batch_bytes:
                return
            batch = pa.Table.from_batches(queue).combine_chunks().to_batches()
            merged = batch[0] if batch else _empty(self.target.schema)
            cut = self.target.batch_rows
            if size >= self.target.batch_bytes and merged.num_rows:
                per_row = max(1, size // merged.num_rows)
                cut = min(cut, max(1, self.target.batch_bytes // per_row))
            self._send(partition, merged.slice(0, cut))
            rest = merged.slice(cut)
            queue[:] = [rest] if rest.num_rows else []

    def flush(self) -> WriteReport:
        for p in sorted(self.pending):
            if self.pending[p]:
                self._send(
                    p, pa.Table.from_batches(self.pending[p]).combine_chunks().to_batches()[0]
                )
                self.pending[p] = []
        return self.report

    def _send(self, partition: int, rows: pa.RecordBatch) -> None:
        seq = self.sequences.get(partition, 0)
        self.sequences[partition] = seq + 1
        started, failures = time.monotonic(), 0
        while True:
            try:
                (result,) = self.client.append(
                    self.target.connection.table,
                    rows,
                    partition=partition,
                    producer_id=self.report.producer_id,
                    sequence=seq,
                    compression="zstd",
                )
            except InvalidIdempotentAppend as err:
                if not _stored(err, seq):
                    raise described(
                        err, f"appending to {self.target.connection.table}", _NOT_PROVEN
                    ) from None
                # Older than the window: the producer got past it, so it was stored.
                self.report.duplicates += rows.num_rows
                return
            except TidegateError as err:
                failures += 1
                delay = self.client.retry.next_delay(err, failures, started)
                if delay is None:
                    raise described(err, f"appending to {self.target.connection.table}") from None
                time.sleep(delay)
                continue
            if result.duplicate:
                self.report.duplicates += result.count
            else:
                self.report.appended += result.count
            self.report.batches[partition] = seq + 1
            if self.fail_after and sum(self.report.batches.values()) >= self.fail_after:
                raise RuntimeError(
                    f"tidegate: injected failure after {self.fail_after} batches "
                    "(option test_fail_after_batches)"
                )
            return


#: What a refused idempotent append that proves nothing adds to the gateway's words.
_NOT_PROVEN = (
    " (this does not prove the batch was stored, so the write stops: see what the table "
    "holds of it before writing it again)"
)


def _stored(err: InvalidIdempotentAppend, sequence: int) -> bool:
    """Whether a refused append proves its batch was stored: only a sequence older than the
    de-duplication window, refused with the producer's last sequence at or past it. An
    unknown producer at a sequence above 0 (``UNKNOWN_PRODUCER_ID``: a hot tier that lost
    its producer state), or another batch under a sequence already used, proves nothing."""
    if err.reason != InvalidIdempotentAppend.reason:
        return False
    last = err.details.get("last_sequence")
    try:
        return last is not None and int(last) >= sequence
    except (TypeError, ValueError):
        return False


def _write(target: _Target, write_id: str, batches: Iterator[pa.RecordBatch]) -> WriteReport:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    spark_partition = ctx.partitionId() if ctx is not None else 0
    attempt = ctx.attemptNumber() if ctx is not None else 0
    batch_id = ctx.getLocalProperty("streaming.sql.batchId") if ctx is not None else None
    parts = [write_id] if batch_id is None else [write_id, str(batch_id)]
    producer_id = "/".join(["spark", *parts, str(spark_partition)])
    with target.connection.client() as client:
        appender = _Appender(target, client, producer_id, spark_partition, attempt)
        for batch in batches:
            if batch.num_rows:
                appender.add(batch)
        return appender.flush()


class TidegateWriter(DataSourceArrowWriter):
    """Batch writes (``mode("append")``)."""

    def __init__(self, options: Options, schema: StructType) -> None:
        self.target = _target(options, schema)
        # Drawn once on the driver: every task and attempt of this write shares it.
        self.write_id = options.get("write_id") or uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteReport:
        return _write(self.target, self.write_id, iterator)


class TidegateStreamWriter(DataSourceStreamArrowWriter):
    """Streaming writes: the producer id carries the query id and the micro-batch id."""

    def __init__(self, options: Options, schema: StructType) -> None:
        self.target = _target(options, schema)
        self.write_id = options.get("write_id")

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteReport:
        from pyspark import TaskContext

        write_id = self.write_id
        if write_id is None:
            ctx = TaskContext.get()
            query = ctx.getLocalProperty("sql.streaming.queryId") if ctx is not None else None
            if query is None:
                raise SparkOptionError(
                    "tidegate: the streaming query has no id; give option 'write_id'"
                )
            write_id = query
        return _write(self.target, write_id, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to do: each append was acknowledged durable."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to undo: a replay of the micro-batch de-duplicates."""
