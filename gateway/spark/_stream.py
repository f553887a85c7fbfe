"""``spark.readStream.format("tidegate")``: offsets ``{partition: next_offset}``.

A micro-batch ``[start, end)`` is planned like a batch read: the gateway pins a snapshot,
the cold part of each partition's range is read from the snapshot's data files and the
rest through the gateway. Offsets are all the state there is, so a query restarted from
its checkpoint re-plans the same ranges; ``commit()`` is not needed (Spark does not call it
for the last batch of ``Trigger.AvailableNow``). Through a gateway outage the driver's calls
and the tasks' hot-range reads wait and reconnect with backoff (one log line per outage)
for ``reconnectTimeout`` seconds (default: for ever), then go on where they were.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from gateway.client._consuming import Outage
from gateway.spark._options import Options, SparkOptionError
from gateway.spark._plan import fetch_plan
from gateway.spark._splits import plan_splits, read_spec, read_split
from gateway.wire.errors import TidegateError
from gateway.wire.filters import And, Compare, Expr, Or
from gateway.wire.schema import OFFSET_COLUMN, PARTITION_COLUMN

__all__ = ["TidegateStreamReader", "share_rows"]

T = TypeVar("T")


def share_rows(backlog: Mapping[int, int], max_rows: int) -> dict[int, int]:
    """How many of ``max_rows`` each partition gets: equal shares, and what a partition
    cannot use goes to the others (so a trigger reads ``min(max_rows, total)`` rows)."""
    given = dict.fromkeys(backlog, 0)
    left = max_rows
    pending = sorted(p for p, n in backlog.items() if n > 0)
    while left > 0 and pending:
        share = max(1, left // len(pending))
        for p in list(pending):
            take = min(share, backlog[p] - given[p], left)
            given[p] += take
            left -= take
            if given[p] == backlog[p]:
                pending.remove(p)
            if left == 0:
                break
    return given


def _offsets(raw: Mapping[str, Any]) -> dict[int, int]:
    return {int(p): int(o) for p, o in raw.items()}


def _ranges_filter(start: Mapping[int, int], end: Mapping[int, int]) -> Expr:
    """``(_partition = p and _offset >= s and _offset < e) or ...``: prunes the plan's
    files to those holding the micro-batch."""
    terms: list[Expr] = [
        And(
            (
                Compare(PARTITION_COLUMN, "=", p),
                Compare(OFFSET_COLUMN, ">=", start[p]),
                Compare(OFFSET_COLUMN, "<", hi),
            )
        )
        for p, hi in sorted(end.items())
        if start[p] < hi
    ]
    return terms[0] if len(terms) == 1 else Or(tuple(terms))


class TidegateStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over a table's partitions, in offset order per partition."""

    def __init__(self, options: Options, schema: StructType) -> None:
        spec, count = read_spec(options, schema)
        # A stream rides through gateway outages (a restart, a rolling deploy), on the
        # driver (offsets, plans) and in its tasks (hot ranges), for reconnectTimeout.
        timeout = options.reconnect_timeout()
        self.spec = replace(spec, reconnect_timeout=timeout)
        self.outage = Outage(
            spec.connection.endpoint, f"tidegate stream of {spec.connection.table}", timeout
        )
        self.parts = options.partitions(count) or list(range(count))
        self.starting = options.starting_offsets(self.parts)
        self.max_rows = options.integer("maxRecordsPerTrigger", 0, minimum=0)
        self.hot_split_records = options.integer("hot_split_records", 1_000_000)
        #: Trigger.AvailableNow's target: the high watermarks when the query started.
        self.target: dict[int, int] | None = None

    def _ride(self, call: Callable[[], T]) -> T:
        """``call()``, tried again with backoff while the gateway is away."""
        while True:
            try:
                got = call()
                self.outage.ok()
                return got
            except TidegateError as err:
                time.sleep(self.outage.failed(err))

    def _watermarks(self) -> tuple[dict[int, int], dict[int, int]]:
        info = self._ride(lambda: self.spec.connection.table_info(unretried=True))
        earliest = {p: info.earliest_offsets[p] for p in self.parts}
        return earliest, {p: info.high_watermarks[p] for p in self.parts}

    def initialOffset(self) -> dict[str, int]:
        earliest, high = self._watermarks()
        out = {}
        for p in self.parts:
            want = self.starting[p]
            if want == "earliest":
                out[str(p)] = earliest[p]
            elif want == "latest":
                out[str(p)] = high[p]
            else:
                assert isinstance(want, int)
                if not earliest[p] <= want <= high[p]:
                    raise SparkOptionError(
                        f"tidegate: startingOffsets gives partition {p} offset {want}; it "
                        f"holds offsets {earliest[p]}..{high[p]} (the high watermark)"
                    )
                out[str(p)] = want
        return out

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows) if self.max_rows else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._watermarks()[1]

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, int]:
        begin = _offsets(start)
        high = self.target if self.target is not None else self._watermarks()[1]
        backlog = {p: max(0, high[p] - begin.get(p, high[p])) for p in self.parts}
        if isinstance(limit, ReadMaxRows):
            backlog = share_rows(backlog, limit.max_rows)
        return {str(p): begin.get(p, high[p]) + backlog[p] for p in self.parts}

    def reportLatestOffset(self) -> dict[str, int]:
        return {str(p): o for p, o in self._watermarks()[1].items()}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin, stop = _offsets(start), _offsets(end)
        begin = {p: begin.get(p, stop[p]) for p in stop}
        if all(begin[p] >= stop[p] for p in stop):
            return []
        plan = self._ride(
            lambda: fetch_plan(self.spec.connection, _ranges_filter(begin, stop), None)
        )
        files, hot = plan.stream_slices(begin, stop)
        # One split per file: a micro-batch's files are few and already small.
        return plan_splits(
            files, hot, split_bytes=1, min_partitions=1, hot_split_records=self.hot_split_records
        )

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_split(self.spec, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the checkpoint's offsets are the only state."""
