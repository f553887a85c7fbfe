"""The asyncio consumer: reads partitions from start positions or a group's commits."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from gateway.client._reading import mark_consumed, skip_removed, start_positions
from gateway.client._types import (
    StartAt,
    TableRef,
)
from gateway.wire.errors import OffsetOutOfRange

if TYPE_CHECKING:
    from gateway.client.aio import AsyncClient

__all__ = ["AsyncConsumer"]


class AsyncConsumer:
    """The asyncio twin of :class:`gateway.client.Consumer`: ``async for`` records, or
    ``async for`` over :meth:`batches`. Get one with ``client.consumer(table, ...)``.
    """

    def __init__(
        self,
        client: AsyncClient,
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
        self._table_name = table
        self._started = False
        self.group = group
        self._partitions = partitions
        self._start = start
        self.follow = follow
        #: Where a position below the earliest offset goes (auto.offset.reset).
        self._reset: StartAt = "latest" if start == "latest" else "earliest"
        self.auto_commit_interval = auto_commit_interval
        self.max_records = max_records
        self.poll_interval = poll_interval
        self.with_tier = with_tier
        self.positions: dict[int, int] = {}
        self.consumed: dict[int, int] = {}
        self._committed: dict[int, int] = {}
        self._last_commit = time.monotonic()
        self._next = 0

    async def start(self) -> None:
        """Look the table and the group's commits up (idempotent)."""
        if self._started:
            return
        self._started = True
        self.table = await self.client.table_info(self._table_name)
        self.ref = self.table.ref
        self.partitions = (
            list(range(self.table.partitions))
            if self._partitions is None
            else list(self._partitions)
        )
        committed = (
            await self.client.fetch_offsets(self.group, self.ref, self.partitions)
            if self.group
            else {}
        )
        by_time = (
            await self.client.offsets_for_times(self.ref, self._start, self.partitions)
            if isinstance(self._start, dt.datetime)
            else None
        )
        self.positions = start_positions(
            self.table, self.partitions, committed, self._start, by_time
        )
        self.consumed = dict(self.positions)
        self._committed = dict(committed)

    async def __aenter__(self) -> AsyncConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._started and self.group and self.auto_commit_interval is not None:
            await self.commit()

    async def commit(self, offsets: Mapping[int, int] | None = None) -> None:
        if not self.group:
            raise ValueError("commit needs a consumer group")
        await self.start()
        wanted = dict(self.consumed if offsets is None else offsets)
        changed = {p: o for p, o in wanted.items() if self._committed.get(p) != o}
        if changed:
            await self.client.commit_offsets(self.group, self.ref, changed)
            self._committed.update(changed)
        self._last_commit = time.monotonic()

    def seek(self, partition: int, offset: int) -> None:
        self.positions[partition] = offset
        self.consumed[partition] = offset

    async def poll(self, timeout: float | None = None) -> list[pa.RecordBatch]:
        await self.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            await self._maybe_auto_commit()
            out = await self._fetch_round()
            for batch in out:  # handed out: what auto-commit and close() commit
                mark_consumed(self.consumed, batch)
            if out or (deadline is not None and time.monotonic() >= deadline):
                return out
            await asyncio.sleep(self.poll_interval)

    async def _fetch_round(self) -> list[pa.RecordBatch]:
        out: list[pa.RecordBatch] = []
        n = len(self.partitions)
        for k in range(n):
            p = self.partitions[(self._next + k) % n]
            while True:
                try:
                    batches, nxt = await self.client._read_once(
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

    async def _maybe_auto_commit(self) -> None:
        if (
            self.group
            and self.auto_commit_interval is not None
            and time.monotonic() - self._last_commit >= self.auto_commit_interval
        ):
            await self.commit()

    async def batches(self) -> AsyncIterator[pa.RecordBatch]:
        await self.start()
        while True:
            await self._maybe_auto_commit()
            got = await self._fetch_round()
            if not got:
                if not self.follow:
                    return
                await asyncio.sleep(self.poll_interval)
                continue
            for batch in got:
                mark_consumed(self.consumed, batch)
                yield batch

    async def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        async for batch in self.batches():
            p = batch.column("_partition")[0].as_py()
            for row in batch.to_pylist():
                self.consumed[p] = row["_offset"] + 1
                yield row
