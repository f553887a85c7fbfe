"""Stream reads by offset, stitched across the tiers; follow; offsets for times."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Protocol

import pyarrow as pa

from gateway.core.base import CoreBase
from gateway.core.stitch import PartitionView, check_offset, stitch_cold
from gateway.core.views import UNCAPPED, ReadResult, TableView, hot_pieces, slice_batches
from gateway.hot import PartitionId, StoredBatch
from gateway.wire.errors import InvalidRequest
from gateway.wire.evolution import StaleSchema, read_as
from gateway.wire.splice import SplicedMessage, splice_piece
from gateway.wire.stored import HotPiece, schema_message

if TYPE_CHECKING:
    from gateway.cold import ColdSnapshot, ColdTable

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
        as_ipc: bool = False,
    ) -> ReadResult:
        """Records of one partition from ``offset`` in offset order; with ``raw_hot``, the
        hot-tier records as stored (``ReadResult.pieces``), for a reader that adds the
        system columns itself; with ``as_ipc``, the hot-tier records as IPC messages
        spliced into the stored bytes (``ReadResult.messages``) where the read allows it
        (see :meth:`_spliced`), for an edge that sends Arrow IPC.

        Raises:
            TableNotFound, InvalidPartition,
            OffsetOutOfRange: below the earliest offset or above the high watermark.
        """
        table = await self.table(tenant, namespace, name)
        part = self._part(table, partition)
        records, nbytes = self._limits(max_records, max_bytes)
        try:
            try:
                return await self._read(table, part, offset, records, nbytes, raw_hot, as_ipc)
            except StaleSchema:
                # Rows appended under a schema changed through another gateway: look again.
                table = await self.table(tenant, namespace, name, fresh=True)
                return await self._read(table, part, offset, records, nbytes, raw_hot, as_ipc)
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
        as_ipc: bool = False,
    ) -> ReadResult:
        """Stitched read: offsets below ``T(p)`` of the current snapshot come from its
        data files, offsets at or above it from the hot tier, in one ordered result."""
        cold = self._cold_table(table) if self.cold is not None else None

        def fetch() -> ReadResult:
            snap, tiered, recorded = self._tier_marks(table, part, cold)
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
            view = PartitionView(part.partition, tiered, recorded, o.low, o.high)
            start = check_offset(offset, view)
            taken = stitch_cold(
                view,
                start,
                max_records,
                max_bytes,
                (lambda lo, hi: cold.read_range(snap, part.partition, lo, hi))
                if cold is not None and snap is not None
                else None,
                lambda lo, hi: snap is not None and snap.lost_through(part.partition, lo, hi),
            )
            out, next_offset, nbytes = taken.batches, taken.next_offset, taken.nbytes
            pieces: list[HotPiece] = []
            messages: list[SplicedMessage] | None = None
            hot_from = taken.hot_from(view)
            if hot_from is not None:
                if early is not None and hot_from == start and not out:
                    stored = early  # read from here with these very limits
                else:
                    stored = self.hot.read(part, hot_from, taken.remaining, max_bytes - nbytes)
                if raw_hot:
                    pieces, next_offset = hot_pieces(
                        stored, hot_from, taken.remaining, max_bytes, nbytes
                    )
                    for piece in pieces:
                        self._check_stored_schema(table, piece.payload)
                elif as_ipc and (
                    spliced := self._spliced(
                        table, part, stored, hot_from, taken.remaining, max_bytes - nbytes
                    )
                ):
                    messages, next_offset = spliced
                else:
                    hot, next_offset = slice_batches(
                        stored,
                        part.partition,
                        hot_from,
                        taken.remaining,
                        max_bytes,
                        nbytes,
                        table.log_schema,
                    )
                    out.extend(hot)
            return ReadResult(
                out,
                next_offset,
                max(view.latest, next_offset),
                table.stored_schema,
                tiered,
                pieces,
                messages or [],
            )

        return await self._run(fetch)

    def _spliced(
        self,
        table: TableView,
        part: PartitionId,
        stored: Sequence[StoredBatch],
        offset: int,
        max_records: int,
        room: int,
    ) -> tuple[list[SplicedMessage], int] | None:
        """Records ``[offset, offset + max_records)`` of hot batches as IPC messages with
        the system columns (:func:`~gateway.wire.splice.splice_piece`), and the offset
        after them; None where the decoding read (:func:`slice_batches`) must answer: a
        payload stored under another schema, or Arrow bytes that might reach ``room``
        (the byte cap left), where the decoding read cuts at the cap by the rows' decoded
        sizes. Below it the two answer the same records."""
        pieces, next_offset = hot_pieces(stored, offset, max_records, UNCAPPED)
        out: list[SplicedMessage] = []
        for piece in pieces:
            spliced = splice_piece(piece, table.log_schema, part.partition)
            if spliced is None:
                return None
            out.extend(spliced)
        if not out or sum(m.nbytes for m in out) >= room:
            return None
        return out, next_offset

    def _tier_marks(
        self, table: TableView, part: PartitionId, cold: ColdTable | None
    ) -> tuple[ColdSnapshot | None, int, int]:
        """The snapshot a read of ``part`` uses, its ``T(p)``, and the earliest offset
        retention recorded."""
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
        return snap, tiered, recorded

    async def offset_bounds(
        self, tenant: str, namespace: str, name: str, partitions: Sequence[int] | None = None
    ) -> dict[int, tuple[int, int]]:
        """Per partition, the earliest offset a read may start at and the high watermark,
        across the tiers, as a read at that moment sees them.

        Raises:
            TableNotFound, InvalidPartition.
        """
        table = await self.table(tenant, namespace, name)
        wanted = self._partitions(table, partitions)
        cold = self._cold_table(table) if self.cold is not None else None

        def bounds(p: int) -> tuple[int, int]:
            part = self._part(table, p)
            _, tiered, recorded = self._tier_marks(table, part, cold)
            o = self.hot.offsets(part)
            if cold is not None and o.low > max(tiered, recorded):
                # Trimmed above the reused snapshot's watermark: look at the newest one.
                tiered = self._read_snapshot(table, cold, fresh=True).watermark(p)
            view = PartitionView(p, tiered, recorded, o.low, o.high)
            return view.earliest, view.latest

        return await self._run(lambda: {p: bounds(p) for p in wanted})

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
        as_ipc: bool = False,
        hold: FollowHold | None = None,
    ) -> AsyncIterator[ReadResult]:
        """Reads from ``offset`` that wait for new records instead of ending.

        Yields every non-empty result, each of at most ``server.follow_read_bytes`` (or
        ``max_bytes``, if smaller). With ``max_records`` the iteration ends once that many
        records were yielded; with ``max_wait_s`` it ends after waiting that long for a
        record (the HTTP long poll). Appends through this process wake followers at once;
        appends through other gateways are seen within ``follow_poll_ms``. ``raw_hot``
        and ``as_ipc`` shape each result's hot records as :meth:`read`'s do.

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
                result = await self._read(table, part, offset, want, nbytes, raw_hot, as_ipc)
            except StaleSchema:
                table = await self.table(tenant, namespace, name, fresh=True)
                result = await self._read(table, part, offset, want, nbytes, raw_hot, as_ipc)
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
            read_as(pa.RecordBatch.from_pylist([], schema=stored), table.log_schema)
        self._schemas_checked.add(key)
