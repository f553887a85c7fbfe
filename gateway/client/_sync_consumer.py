"""The sync consumer: reads partitions from start positions or a group's commits."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from gateway.client._reading import mark_consumed, skip_removed, start_positions
from gateway.client._types import (
    StartAt,
    TableRef,
)
from gateway.wire.errors import OffsetOutOfRange

if TYPE_CHECKING:
    from gateway.client._sync import Client

__all__ = ["Consumer"]


class Consumer:
    """Reads a table's partitions in offset order; optionally as a consumer group.

    Iterate records (dicts with the system columns) or :meth:`batches` (Arrow record
    batches). Each partition starts at the group's committed offset when there is one,
    else at ``start``: ``"earliest"``, ``"latest"``, an offset, or a datetime (the first
    record appended at or after it, via ``OffsetsForTimes``).

    Group membership is static: the caller chooses ``partitions`` (all by default), and
    several consumers of one group must be given disjoint partitions (no rebalancing).

    Args:
        group: consumer group whose committed offsets the gateway stores.
        partitions: the partitions to read (default all).
        start: where partitions without a committed offset begin.
        follow: keep waiting for new records (default); without it iteration ends at the
            high watermark seen.
        auto_commit_interval: with a group, commit the offsets of records already handed
            out every this many seconds (at the next fetch, so at-least-once); None to
            commit only by :meth:`commit`.
        max_records: records per fetch and partition.
        poll_interval: wait between polls while every partition is caught up.
        with_tier: add a ``_tier`` column ("iceberg" or "hot": the tier that served it).
    """

    def __init__(
        self,
        client: Client,
        table: str | TableRef,
        *,
        group: str | None = None,
        partitions: Sequence[int] | None = None,
        start: StartAt = "earliest",
        follow: bool = True,
        auto_commit_interval: float | None = 5.0,
        max_records: int = 10_000,
        poll_interval: float = 0.1,
        with_tier: bool = False,
    ) -> None:
        self.client = client
        self.table = client.table_info(table)
        self.ref = self.table.ref
        self.group = group
        self.partitions = (
            list(range(self.table.partitions)) if partitions is None else list(partitions)
        )
        self.follow = follow
        #: Where a position below the earliest offset goes (auto.offset.reset).
        self._reset: StartAt = "latest" if start == "latest" else "earliest"
        self.auto_commit_interval = auto_commit_interval
        self.max_records = max_records
        self.poll_interval = poll_interval
        self.with_tier = with_tier
        committed = client.fetch_offsets(group, self.ref, self.partitions) if group else {}
        by_time = (
            client.offsets_for_times(self.ref, start, self.partitions)
            if isinstance(start, dt.datetime)
            else None
        )
        self.positions = start_positions(self.table, self.partitions, committed, start, by_time)
        #: Next offset after the records handed out, per partition (what commit stores).
        self.consumed = dict(self.positions)
        self._committed = dict(committed)
        self._last_commit = time.monotonic()
        self._next = 0

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Commit what was handed out (with a group and auto-commit)."""
        if self.group and self.auto_commit_interval is not None:
            self.commit()

    def commit(self, offsets: Mapping[int, int] | None = None) -> None:
        """Commit ``offsets`` (default: past every record handed out) for the group."""
        if not self.group:
            raise ValueError("commit needs a consumer group")
        wanted = dict(self.consumed if offsets is None else offsets)
        changed = {p: o for p, o in wanted.items() if self._committed.get(p) != o}
        if changed:
            self.client.commit_offsets(self.group, self.ref, changed)
            self._committed.update(changed)
        self._last_commit = time.monotonic()

    def seek(self, partition: int, offset: int) -> None:
        self.positions[partition] = offset
        self.consumed[partition] = offset

    def poll(self, timeout: float | None = None) -> list[pa.RecordBatch]:
        """Batches from the partitions that have records (empty after ``timeout``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._maybe_auto_commit()
            out = self._fetch_round()
            for batch in out:  # handed out: what auto-commit and close() commit
                mark_consumed(self.consumed, batch)
            if out or (deadline is not None and time.monotonic() >= deadline):
                return out
            time.sleep(self.poll_interval)

    def _fetch_round(self) -> list[pa.RecordBatch]:
        out: list[pa.RecordBatch] = []
        n = len(self.partitions)
        for k in range(n):
            p = self.partitions[(self._next + k) % n]
            while True:
                try:
                    batches, nxt = self.client._read_once(
                        self.ref, p, self.positions[p], self.max_records, self.with_tier
                    )
                    break
                except OffsetOutOfRange as err:
                    # Retention removed records this consumer had not read: go on as
                    # Kafka's auto.offset.reset would.
                    skip_removed(err, p, self.positions, self.consumed, self._reset)
            out.extend(batches)
            self.positions[p] = nxt
        self._next = (self._next + 1) % max(1, n)
        return out

    def _maybe_auto_commit(self) -> None:
        if (
            self.group
            and self.auto_commit_interval is not None
            and time.monotonic() - self._last_commit >= self.auto_commit_interval
        ):
            self.commit()

    def batches(self) -> Iterator[pa.RecordBatch]:
        """Arrow record batches in offset order per partition."""
        while True:
            self._maybe_auto_commit()
            got = self._fetch_round()
            if not got:
                if not self.follow:
                    return
                time.sleep(self.poll_interval)
                continue
            for batch in got:
                mark_consumed(self.consumed, batch)
                yield batch

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch in self.batches():
            p = batch.column("_partition")[0].as_py()
            for row in batch.to_pylist():
                self.consumed[p] = row["_offset"] + 1
                yield row
