"""Stream reads by offset, stitched across the tiers; follow; offsets for times."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Protocol

import pyarrow as pa

from gateway.core.base import CoreBase
from gateway.core.views import ReadResult, TableView, fit_bytes, hot_pieces, slice_batches
from gateway.hot import PartitionId, StoredBatch
from gateway.wire.errors import InvalidRequest, OffsetOutOfRange
from gateway.wire.evolution import StaleSchema, read_as
from gateway.wire.schema import OFFSET_COLUMN
from gateway.wire.stored import HotPiece, schema_message

__all__ = ["FollowHold", "ReadOps"]


class FollowHold(Protocol):
    """What a follow stream's answers are held under while it runs (the edges' read
    budget, :class:`gateway.server.calls.DataCalls`): told before each read and when
    the stream has nothing to send."""

    async def reading(self, nbytes: int) -> None:
        """Before each read of at most ``nbytes`` bytes of data; may wait for room."""

    def idle(self) -> None:
        """The stream found nothing and waits: it holds no answer meanwhile."""


class ReadOps(CoreBase):
    def _limits(self, max_records: int | None, max_bytes: int | None) -> tuple[int, int]:
        s = self.settings.server
        records = max_records or s.default_read_records
        if records < 0 or (max_bytes is not None and max_bytes < 0):
            raise InvalidRequest("max_records and max_bytes must not be negative")
        return min(records, s.max_read_records), min(
            max_bytes or s.max_read_bytes, s.max_read_bytes
        )

    async def read(
        self,
        tenant: str,
        namespace: str,
        name: str,
        partition: int,
        offset: int,
        max_records: int | None = None,
        max_bytes: int | None = None,
        *,
        raw_hot: bool = False,
    ) -> ReadResult:
        """Records of one partition from ``offset`` in offset order; with ``raw_hot``, the
        hot-tier records as stored (``ReadResult.pieces``), for a reader that adds the
        system columns itself.

        Raises:
            TableNotFound, InvalidPartition,
            OffsetOutOfRange: below the earliest offset or above the high watermark.
        """
        table = await self.table(tenant, namespace, name)
        part = self._part(table, partition)
        records, nbytes = self._limits(max_records, max_bytes)
        try:
            try:
                return await self._read(table, part, offset, records, nbytes, raw_hot)
            except StaleSchema:
                # Rows appended under a schema changed through another gateway: look again.
                table = await self.table(tenant, namespace, name, fresh=True)
                return await self._read(table, part, offset, records, nbytes, raw_hot)
        except Exception as exc:
            raise await self._unless_dropped(table, exc) from None

    async def _read(
        self,
        table: TableView,
        part: PartitionId,
        offset: int,
        max_records: int,
        max_bytes: int,
        raw_hot: bool = False,
    ) -> ReadResult:
        """Stitched read: offsets below ``T(p)`` of the current snapshot come from its
        data files, offsets at or above it from the hot tier, in one ordered result."""
        cold = self._cold_table(table) if self.cold is not None else None

        def fetch() -> ReadResult:
            snap = self._read_snapshot(table, cold) if cold is not None else None
            tiered = snap.watermark(part.partition) if snap is not None else 0
            # Recorded by retention before it removes anything: enforced from that moment
            # on every gateway, whichever tier still holds the records below it. A table
            # that never had a retention has none (the retention job waits until every
            # gateway's view of the table knows it has one), so it is not looked up.
            recorded = (
                self.meta.earliest_offset(part.table_id, part.partition)
                if table.definition.retention_set_at is not None
                else 0
            )
            # A read above the tiered watermark (most are) gets the hot marks with its
            # batches, in one round trip; the batches serve when the read starts there.
            early: list[StoredBatch] | None = None
            if isinstance(offset, int) and not isinstance(offset, bool) and offset >= tiered:
                o, early = self.hot.read_at(part, offset, max_records, max_bytes)
            else:
                o = self.hot.offsets(part)
            if cold is not None and o.low > max(tiered, recorded):
                # Trimmed above the reused snapshot's watermark: look at the newest one.
                snap = self._read_snapshot(table, cold, fresh=True)
                tiered = snap.watermark(part.partition)
            earliest = max(recorded, 0 if tiered > 0 else o.low)
            high = max(o.high, tiered)
            if (
                isinstance(offset, bool)
                or not isinstance(offset, int)
                or offset < earliest
                or offset > high
            ):
                raise OffsetOutOfRange(
                    _out_of_range(offset, part.partition, earliest, high),
                    offset=offset if isinstance(offset, int) else -1,
                    earliest=earliest,
                    latest=high,
                )
            out: list[pa.RecordBatch] = []
            remaining, nbytes, next_offset = max_records, 0, offset
            full = False  # the byte cap is reached: stop here
            if cold is not None and snap is not None and offset < tiered:
                stop = min(tiered, offset + max_records)
                for batch in cold.read_range(snap, part.partition, offset, stop):
                    first = batch.column(OFFSET_COLUMN)[0].as_py()
                    if first > next_offset and snap.lost_through(
                        part.partition, next_offset, first
                    ):
                        next_offset = first  # offsets lost with a hot tier's state
                    if first != next_offset:  # pragma: no cover - a broken snapshot
                        raise RuntimeError(
                            f"cold tier gap in partition {part.partition}: expected offset "
                            f"{next_offset}, found {first}"
                        )
                    piece = fit_bytes(batch, max_bytes - nbytes, not out)
                    if piece.num_rows:
                        out.append(piece)
                        remaining -= piece.num_rows
                        nbytes += piece.nbytes
                        next_offset += piece.num_rows
                    if piece.num_rows < batch.num_rows or nbytes >= max_bytes:
                        full = True
                        break
                if not full and snap.lost_through(part.partition, next_offset, stop):
                    next_offset = stop
                if next_offset < stop and not full:  # pragma: no cover - a broken snapshot
                    raise RuntimeError(
                        f"cold tier is missing offsets {next_offset}..{stop - 1} of "
                        f"partition {part.partition}"
                    )
            pieces: list[HotPiece] = []
            if tiered <= next_offset < o.low and not full:
                # The hot tier was re-seeded above T(p) after it lost its state, and the
                # lost offsets are not recorded in the cold tier yet: pass over them.
                next_offset = o.low
            if remaining > 0 and not full and next_offset < o.high:
                if early is not None and next_offset == offset and not out:
                    stored = early  # read from here with these very limits
                else:
                    stored = self.hot.read(part, next_offset, remaining, max_bytes - nbytes)
                if raw_hot:
                    pieces, next_offset = hot_pieces(
                        stored, next_offset, remaining, max_bytes, nbytes
                    )
                    for piece in pieces:
                        self._check_stored_schema(table, piece.payload)
                else:
                    hot, next_offset = slice_batches(
                        stored,
                        part.partition,
                        next_offset,
                        remaining,
                        max_bytes,
                        nbytes,
                        table.schema,
                    )
                    out.extend(hot)
            return ReadResult(
                out, next_offset, max(high, next_offset), table.stored_schema, tiered, pieces
            )

        return await self._run(fetch)

    async def follow(
        self,
        tenant: str,
        namespace: str,
        name: str,
        partition: int,
        offset: int,
        max_records: int | None = None,
        max_bytes: int | None = None,
        max_wait_s: float | None = None,
        *,
        still_allowed: Callable[[], Awaitable[None]] | None = None,
        check_every_s: float = 1.0,
        raw_hot: bool = False,
        hold: FollowHold | None = None,
    ) -> AsyncIterator[ReadResult]:
        """Reads from ``offset`` that wait for new records instead of ending.

        Yields every non-empty result, each of at most ``server.follow_read_bytes`` (or
        ``max_bytes``, if smaller). With ``max_records`` the iteration ends once that many
        records were yielded; with ``max_wait_s`` it ends after waiting that long for a
        record (the HTTP long poll). Appends through this process wake followers at once;
        appends through other gateways are seen within ``follow_poll_ms``.

        ``hold`` is told before each read (with its byte cap) and whenever the stream
        waits for records, so the caller can hold each answer under a memory budget
        until it takes the next. ``still_allowed`` is awaited before
        every result and at least every ``check_every_s`` while waiting; what it raises
        (a revoked key, a suspended tenant) ends the stream.
        """
        table = await self.table(tenant, namespace, name)
        part = self._part(table, partition)
        total = max_records or 0
        s = self.settings.server
        _, nbytes = self._limits(None, max_bytes)
        nbytes = min(nbytes, s.follow_read_bytes)
        per_call = s.max_read_records
        poll_s = s.follow_poll_ms / 1000
        deadline = None if max_wait_s is None else time.monotonic() + max_wait_s
        checked = time.monotonic()
        seen = 0
        while True:
            event = self._notifier.event(part)
            want = per_call if total == 0 else min(per_call, total - seen)
            if hold is not None:
                await hold.reading(nbytes)
            try:
                result = await self._read(table, part, offset, want, nbytes, raw_hot)
            except StaleSchema:
                table = await self.table(tenant, namespace, name, fresh=True)
                result = await self._read(table, part, offset, want, nbytes, raw_hot)
            now = time.monotonic()
            if result.num_records or (deadline is not None and now >= deadline):
                if still_allowed is not None:
                    await still_allowed()
                    checked = time.monotonic()
                yield result
                if not result.num_records:
                    return
                seen += result.num_records
                offset = result.next_offset
                if (total and seen >= total) or deadline is not None:
                    return
                continue
            if hold is not None:
                hold.idle()
            timeout = poll_s
            if deadline is not None:
                timeout = min(timeout, max(0.0, deadline - time.monotonic()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout)
            if still_allowed is not None and time.monotonic() - checked >= check_every_s:
                await still_allowed()
                checked = time.monotonic()

    async def offsets_for_times(
        self,
        tenant: str,
        namespace: str,
        name: str,
        timestamp_us: int,
        partitions: Sequence[int] | None = None,
    ) -> dict[int, int]:
        """Per partition, the first offset appended at or after ``timestamp_us``.

        Over the hot tier: a binary search on batch offsets, reading one batch header per
        step (each batch carries one append timestamp, taken as non-decreasing along the
        log). A partition with no such record answers its high watermark; one whose every
        record is at or after the time answers its earliest offset.

        Raises:
            TableNotFound, InvalidPartition.
        """
        table = await self.table(tenant, namespace, name)
        wanted = self._partitions(table, partitions)

        def search(p: int) -> int:
            part = self._part(table, p)
            found = self.hot.offset_for_time(part, timestamp_us)
            if table.definition.retention_set_at is not None:
                # Never an offset retention has removed (or is about to).
                found = max(found, self.meta.earliest_offset(part.table_id, p))
            return found

        def run() -> dict[int, int]:
            return {p: search(p) for p in wanted}

        return await self._run(run)

    def _check_stored_schema(self, table: TableView, payload: bytes) -> None:
        """Make sure a hot payload sent as stored reads under ``table``'s schema (a reader
        converts it with :func:`~gateway.wire.evolution.read_as`), looking at its schema
        message only; schemas seen before are recognised by their bytes.

        Raises:
            StaleSchema: the payload was appended under a schema newer than ``table``'s.
        """
        key = ("read", table.definition.table_id, table.schema_version, schema_message(payload))
        if key in self._schemas_checked:
            return
        stored = pa.ipc.read_schema(pa.py_buffer(key[3])) if key[3] else None
        if stored is not None:
            read_as(pa.RecordBatch.from_pylist([], schema=stored), table.schema)
        self._schemas_checked.add(key)


def _out_of_range(offset: object, partition: int, earliest: int, high: int) -> str:
    """Why ``offset`` cannot be read, with what can."""
    span = (
        f"partition {partition} holds offsets {earliest} to {high - 1}"
        if high > earliest
        else f"partition {partition} holds no records yet"
    )
    where = f"{span}; reading at its high watermark {high} returns nothing until more arrive"
    if isinstance(offset, bool) or not isinstance(offset, int):
        return f"offset {offset!r} is not an integer offset: {where}"
    if offset < earliest:
        return f"offset {offset} is no longer kept (retention): {where}"
    return f"offset {offset} is past the end: {where}"
