"""Appends: validate, route to partitions, store per partition with offsets."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import itertools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from gateway import metrics
from gateway.core.base import RESEED_WAIT_S, CoreBase
from gateway.core.keyed import check_writes, resolve
from gateway.core.names import INT64_MAX, check_text
from gateway.core.views import TableView
from gateway.hot import AppendResult, PartitionId, ProducerSequence
from gateway.wire.codec import (
    PAYLOAD_CHUNK_BYTES,
    Compression,
    StreamInfo,
    decode_valid,
    encode_batch,
)
from gateway.wire.errors import (
    CommitConflict,
    HighWatermarkMoved,
    HotStateLost,
    InvalidIdempotentAppend,
    InvalidRequest,
    SchemaMismatch,
    SnapshotNotFound,
    Unavailable,
)
from gateway.wire.routing import partition_for_key, route_by_key
from gateway.wire.schema import check_values, conform_batch
from gateway.wire.types import AppendRange

__all__ = ["AppendOps", "ClientStream"]


def now_utc() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


log = logging.getLogger(__name__)

#: How often a key table's write is resolved again when the high watermark moved.
RESOLVE_TRIES = 40


@dataclass(frozen=True, slots=True)
class _Prepared:
    """An append validated and routed on the I/O pool (and already stored, ``stored``,
    when it went as it came to one partition)."""

    conformed: list[pa.RecordBatch]
    routes: dict[int, pa.Array | None]
    stored: tuple[PartitionId, AppendResult] | None
    #: The rows as one batch, when they are several batches or go to several partitions.
    whole: pa.RecordBatch | None


@dataclass(frozen=True, slots=True)
class _Request:
    """What an append asks, as the worker hop that validates, routes and stores it gets
    it."""

    #: None: decoded from ``stream`` (and validated in full) in that hop.
    batches: Sequence[pa.RecordBatch] | None
    stream: ClientStream | None
    partition: int | None
    producer: ProducerSequence | None
    timestamp_us: int
    compression: Compression


def _producer(
    producer_id: str | None, sequence: int | None, counts_records: bool = False
) -> ProducerSequence | None:
    """The idempotent producer of an append, checked.

    Raises:
        InvalidIdempotentAppend: one without the other, or out of bounds.
    """
    if producer_id is None and sequence is None:
        return None
    if producer_id is None or sequence is None:
        raise InvalidIdempotentAppend("producer_id and sequence go together")
    if (
        not isinstance(sequence, int)
        or not 0 <= sequence <= INT64_MAX
        or not producer_id
        or len(producer_id) > 128
    ):
        raise InvalidIdempotentAppend(
            f"sequence must be an integer from 0 to {INT64_MAX} and producer_id 1 to 128 characters"
        )
    check_text("producer_id", producer_id, 128)
    return ProducerSequence(producer_id, sequence, counts_records)


@dataclass(frozen=True, slots=True)
class ClientStream:
    """The Arrow IPC stream an append's batches were decoded from, as the client sent
    it (already checked and validated in full by the edge), with what its metadata
    declares: stored as it came when it fits the table (see :meth:`AppendOps.append`)."""

    data: bytes
    info: StreamInfo


class AppendOps(CoreBase):
    async def append(
        self,
        tenant: str,
        namespace: str,
        name: str,
        batches: Sequence[pa.RecordBatch] | None,
        *,
        partition: int | None = None,
        producer_id: str | None = None,
        sequence: int | None = None,
        stream: ClientStream | None = None,
        sequence_counts_records: bool = False,
    ) -> list[AppendRange]:
        """Validate, route and store rows; one contiguous offset range per partition.

        Every check happens before anything is written: a request that fails validation
        stores nothing. A request whose rows span several partitions is stored per
        partition (not atomically across partitions, as in Kafka).

        ``stream``, the client's Arrow IPC stream ``batches`` were decoded from, is stored
        as it came (not combined nor compressed again) when its schema is exactly the
        table's (columns, order, types, nullability, no metadata), its rows go to one
        partition and its compression is the one ``compression`` asks (any, for
        ``producer``); its values are checked all the same.

        ``batches`` None: they are ``stream``'s, decoded and validated in full
        (:func:`~gateway.wire.codec.decode_valid`) in the same I/O pool hop that
        validates, routes and stores them, not in a hop of their own.

        ``sequence_counts_records``: the producer's sequences count records, Kafka's way
        (see :class:`~gateway.hot.ProducerSequence`), rather than batches.

        Raises:
            TableNotFound, SchemaMismatch, InvalidPartition, InvalidRequest,
            InvalidIdempotentAppend, OutOfOrderSequence, Unavailable.
        """
        table = await self.table(tenant, namespace, name)
        self._start_recording_marks()
        producer = _producer(producer_id, sequence, sequence_counts_records)
        if table.definition.primary_key is not None and producer is not None:
            if producer.counts_records:
                raise InvalidIdempotentAppend(
                    f"table {namespace}.{name} has a primary key; its idempotent producers "
                    "count sequences by batch, not by record (Kafka's way), since a write "
                    "is stored as the changes it makes; nothing was written"
                )
            # A retry is resolved again and may make another number of changes: the hot
            # tier recognises it by its sequence alone.
            producer = dataclasses.replace(producer, resolved=True)
        request = _Request(
            batches, stream, partition, producer, time.time_ns() // 1000, self._encoding()
        )
        try:
            prepared = await self._run(self._prepare, table, request)
        except SchemaMismatch as exc:
            if not exc.details.get("unexpected"):
                raise
            # Columns this gateway does not know may have been added by a schema change
            # through another gateway since it cached the table: look again, once.
            table = await self.table(tenant, namespace, name, fresh=True)
            prepared = await self._run(self._prepare, table, request)
        if prepared.stored is not None:
            part, res = prepared.stored
            self._notifier.notify(part)
            return [AppendRange(part.partition, res.base_offset, res.count, res.duplicate)]
        return await self._store(table, prepared, request)

    def _validate(self, table: TableView, r: _Request) -> tuple[list[pa.RecordBatch], bool]:
        """The rows in the table's schema (a key table's: its write schema, checked by
        :func:`~gateway.core.keyed.check_writes`), and whether the client's stream may be
        stored as it came."""
        if r.batches is not None:
            batches = r.batches
        elif r.stream is not None:
            batches = decode_valid(r.stream.data)[1]
        else:
            raise InvalidRequest("an append needs its record batches or its Arrow stream")
        pk = table.definition.primary_key
        if pk is not None:
            schema = table.write_schema
            omittable = table.write_omittable
            rows = [conform_batch(b, schema, omittable) for b in batches if b.num_rows]
            if rows:
                check_writes(pa.Table.from_batches(rows, schema), table.schema, pk)
            return rows, False
        if r.stream is not None and self._as_is(table, batches, r.stream):
            # Exactly the table's schema: only the values need checking, in place.
            kept = [b for b in batches if b.num_rows]
            for b in kept:
                check_values(b, table.schema)
            return kept, True
        return [
            conform_batch(b, table.schema, table.added_columns) for b in batches if b.num_rows
        ], False

    def _prepare(self, table: TableView, r: _Request) -> _Prepared:
        """Validate and route the rows, and store them at once when they go to one
        partition: CPU work and the write in one hop of the I/O pool, none of it on the
        event loop."""
        conformed, as_is = self._validate(table, r)
        if not conformed:
            raise InvalidRequest("an append needs at least one row")
        producer = r.producer
        routes = self._route(
            table,
            conformed,
            r.partition,
            producer.producer_id if producer is not None else None,
            producer.sequence if producer is not None else None,
        )
        if producer is not None and len(routes) != 1:
            raise InvalidIdempotentAppend(
                f"an idempotent append must target one partition, but its rows route to "
                f"{sorted(routes)}; set 'partition' or split the batch by key",
                partitions=",".join(str(p) for p in sorted(routes)),
            )
        d = table.definition
        if as_is and len(routes) == 1 and r.stream is not None:
            # The client's stream is stored as it came: its rows, in one partition.
            count = sum(b.num_rows for b in conformed)
            part = PartitionId(d.tenant, d.table_id, next(iter(routes)))
            res = self._hot_append(table, part, r.stream.data, count, r.timestamp_us, producer)
            return _Prepared(conformed, routes, (part, res), None)
        whole = None
        if len(routes) > 1 or len(conformed) > 1:
            # The rows as one batch, built once here for every partition's write.
            whole = (
                conformed[0]
                if len(conformed) == 1
                else pa.Table.from_batches(conformed, conformed[0].schema)
                .combine_chunks()
                .to_batches()[0]
            )
        if len(routes) == 1:
            # One partition: its write goes in this same hop.
            p, idx = next(iter(routes.items()))
            rows = whole if whole is not None else conformed[0]
            rows = rows if idx is None else rows.take(idx)
            part = PartitionId(d.tenant, d.table_id, p)
            if d.primary_key is not None:
                return _Prepared(
                    conformed, routes, (part, self._keyed_append(table, part, rows, r)), None
                )
            payload = encode_batch(rows, r.compression)
            res = self._hot_append(table, part, payload, rows.num_rows, r.timestamp_us, producer)
            return _Prepared(conformed, routes, (part, res), None)
        return _Prepared(conformed, routes, None, whole)

    async def _store(self, table: TableView, prepared: _Prepared, r: _Request) -> list[AppendRange]:
        """Store rows routed to several partitions: each partition's write (selecting and
        compressing its rows too) on the I/O pool, in parallel."""
        d = table.definition
        whole = prepared.whole if prepared.whole is not None else prepared.conformed[0]

        async def store(p: int, idx: pa.Array | None) -> AppendRange:
            part = PartitionId(d.tenant, d.table_id, p)

            def write() -> AppendResult:
                rows = whole if idx is None else whole.take(idx)
                if d.primary_key is not None:
                    return self._keyed_append(table, part, rows, r)
                payload = encode_batch(rows, r.compression)
                return self._hot_append(
                    table, part, payload, rows.num_rows, r.timestamp_us, r.producer
                )

            res = await self._run(write)
            self._notifier.notify(part)
            return AppendRange(p, res.base_offset, res.count, res.duplicate)

        return list(await asyncio.gather(*(store(p, idx) for p, idx in prepared.routes.items())))

    def _keyed_append(
        self, table: TableView, part: PartitionId, rows: pa.RecordBatch, r: _Request
    ) -> AppendResult:
        """Store a key table's writes to one partition as the changes they make: resolved
        against the hot tier (:func:`~gateway.core.keyed.resolve`), appended with their
        keys on the condition that the high watermark is still the one the resolution
        saw, resolved again when it moved (an append through this or another gateway
        came first). Writes that change nothing store no record; an idempotent
        producer's sequence still advances (an empty idempotent append).

        Raises:
            Unavailable: the partition's high watermark kept moving (writers racing on
                it) through every try; nothing was stored.
        """
        pk = table.definition.primary_key
        assert pk is not None
        writes = pa.Table.from_batches([rows])
        state = self._state_lookup(table)
        for attempt in range(RESOLVE_TRIES):
            try:
                got = resolve(self.hot, part, writes, pk, table.log_schema, self._recent, state)
                count = got.changes.num_rows
                if count == 0 and r.producer is None:
                    return AppendResult(got.high, 0)
                changes = (
                    got.changes.cast(table.log_schema).combine_chunks().to_batches()[0]
                    if count
                    else None
                )
                payload = encode_batch(changes, r.compression) if changes is not None else b""
                res = self._hot_append(
                    table,
                    part,
                    payload,
                    count,
                    r.timestamp_us,
                    r.producer,
                    keys=got.keys if count else None,
                    expect_high=got.high,
                )
                if changes is not None and not res.duplicate:
                    self._recent.add(
                        part, res.base_offset, changes, r.timestamp_us, got.incarnation
                    )
                return res
            except HighWatermarkMoved:
                time.sleep(min(0.0005 * (1 << min(attempt, 7)), 0.05))
        raise Unavailable(
            f"partition {part.partition} of {table.definition.qualified_name} kept taking "
            f"other writes while this one was resolved ({RESOLVE_TRIES} tries); nothing "
            "was stored, try again",
            retry_after_ms=50,
        )

    def _hot_append(
        self,
        table: TableView,
        part: PartitionId,
        payload: bytes,
        count: int,
        timestamp_us: int,
        producer: ProducerSequence | None,
        *,
        keys: list[bytes] | None = None,
        expect_high: int | None = None,
    ) -> AppendResult:
        """Store one batch in the hot tier (on an I/O thread), never at an offset the
        tier may have assigned before.

        The first append of this process to a partition checks that the hot tier's high
        watermark is not below the tiered watermark ``T(p)`` (a disk tier that lost
        unsynced writes, a Redis restored from an older snapshot). A hot tier that holds
        no state for the partition, or an older state than it was seen with, refuses the
        append (:class:`HotStateLost`): the partition is then re-seeded at the highest
        offset known to have been assigned, and the batch appended once more.
        """
        if part not in self._hot_checked:
            floor = self._tiered_floor(table, part, fresh=False)
            high = self.hot.offsets(part).high
            if high < floor:
                self._reseed(
                    table,
                    part,
                    f"the hot tier holds partition {part.path} up to offset {high}, below its "
                    f"tiered watermark {floor}: it lost writes",
                )
            self._hot_checked.add(part)
        try:
            res = self.hot.append(
                part,
                payload,
                count,
                timestamp_us,
                producer,
                floor=0,
                keys=keys,
                expect_high=expect_high,
            )
        except HotStateLost as exc:
            self._reseed(table, part, exc.message)
            res = self.hot.append(
                part,
                payload,
                count,
                timestamp_us,
                producer,
                floor=0,
                keys=keys,
                expect_high=expect_high,
            )
        end = res.base_offset + res.count
        if part not in self._marked:
            # This process's first append to the partition is marked before it is
            # acknowledged: a gateway killed at once leaves it marked for the lake jobs
            # (later appends are marked within a second, and a restart sweeps).
            try:
                self.meta.record_appends({part.table_id: {part.partition: (end, now_utc())}})
                self._marked.add(part)
            except Exception as exc:  # recorded with the others, once a second
                log.warning("marking %s for tiering failed (%s); later", part.path, exc)
        self._mark(part, end)
        return res

    def _tiered_floor(self, table: TableView, part: PartitionId, *, fresh: bool) -> int:
        """``T(p)`` of the partition, from the table's current (or cached) snapshot."""
        if self.cold is None:
            return 0
        cold = self._cold_table(table)
        try:
            return self._read_snapshot(table, cold, fresh=fresh).watermark(part.partition)
        except SnapshotNotFound:
            # No Iceberg table (yet: another gateway is creating it): nothing is tiered.
            return 0

    def _reseed(self, table: TableView, part: PartitionId, why: str) -> None:
        """Re-open a partition whose hot state was lost at the highest offset known to be
        assigned: the tiered watermark (fresh from the snapshot), the watermarks the
        metadata store last saw, and whatever the hot tier itself remembers.

        On a shared hot tier, another live gateway may have acknowledged offsets of the
        partition that it records only within ``MARKS_INTERVAL_S``: the watermarks are
        read after ``RESEED_WAIT_S``, so that those are above the new offsets, not reused
        (no append to the partition can be acknowledged meanwhile: its state is gone).
        What stays open is a gateway that died before it recorded them
        (docs/durability.md)."""
        d = table.definition
        if self.hot.shared:
            time.sleep(RESEED_WAIT_S)
        floor = self._tiered_floor(table, part, fresh=True)
        for state in self.meta.partitions(d.table_id):
            if state.partition == part.partition:
                floor = max(floor, state.high_watermark, state.tiered_watermark)
        hw = self.hot.open_partition(part, floor)
        self._recent.forget(part)
        metrics.record_hot_reseed()
        log.warning(
            "%s; re-seeded partition %d of %s.%s (tenant %s) at offset %d, the highest known "
            "to have been assigned: new records get offsets from there on (docs/durability.md "
            "says which hot-tier settings keep acknowledged records through such a loss)",
            why,
            part.partition,
            d.namespace,
            d.name,
            d.tenant,
            hw,
        )
        self._record_lost(table, part, hw)

    def _record_lost(self, table: TableView, part: PartitionId, start: int) -> None:
        """Record in the cold tier that the offsets between ``T(p)`` and ``start``, where
        the hot tier was re-seeded, are lost: tiering then goes on from ``start`` and
        reads pass over them. Tiering records it too when this does not get through."""
        if self.cold is None:
            return
        cold = self._cold_table(table)
        for _ in range(5):
            try:
                snap = self._read_snapshot(table, cold, fresh=True)
            except SnapshotNotFound:
                return  # no Iceberg table yet: nothing tiered, nothing to record
            tiered = snap.watermark(part.partition)
            if tiered >= start:
                return
            try:
                cold.commit_lost(part.partition, start, snap)
            except CommitConflict:
                continue
            self._snapshots.pop(table.definition.table_id, None)
            d = table.definition
            log.error(
                "records at offsets %d to %d of partition %d of %s.%s (tenant %s) were "
                "acknowledged, then lost with the hot tier's state before tiering moved "
                "them; those offsets are recorded as lost (snapshot property tidegate.lost) "
                "and are never assigned again",
                tiered,
                start - 1,
                part.partition,
                d.namespace,
                d.name,
                d.tenant,
            )
            return

    def _encoding(self) -> Compression:
        """How the gateway compresses a payload it encodes itself (``producer``, keeping a
        client's compression, has nothing to keep there: zstd)."""
        setting = self.settings.compression
        return "zstd" if setting == "producer" else setting

    def _as_is(
        self, table: TableView, batches: Sequence[pa.RecordBatch], stream: ClientStream
    ) -> bool:
        """Whether ``stream`` may be stored as it came: its compression is allowed and its
        schema is exactly the table's. A schema message found to match is remembered by
        its bytes, per table schema version, so a client's next request is not compared
        again."""
        setting = self.settings.compression
        if setting != "producer" and stream.info.compression != setting:
            return False
        if not batches or stream.info.largest_batch_bytes > 2 * PAYLOAD_CHUNK_BYTES:
            # A huge record batch is cut into chunks, so that a read of a few of its rows
            # decompresses only the chunks that hold them.
            return False
        d = table.definition
        key = ("append", d.table_id, d.schema_version, stream.info.schema_message)
        if key[3] and key in self._schemas_checked:
            return True
        if not batches[0].schema.equals(table.schema, check_metadata=True):
            return False
        if key[3]:
            self._schemas_checked.add(key)
        return True

    def _route(
        self,
        table: TableView,
        batches: Sequence[pa.RecordBatch],
        partition: int | None,
        producer_id: str | None,
        sequence: int | None,
    ) -> dict[int, pa.Array | None]:
        """Where the rows go: partition -> indices of the rows of ``batches`` (as one
        batch) it takes, None for all of them."""
        d = table.definition
        if partition is not None and d.primary_key is None:
            self._part(table, partition)
            return {partition: None}
        if partition is not None:
            # A key table's rows go where their key routes, so every version of a key
            # meets in one partition: a partition asked may only be that one.
            self._part(table, partition)
            at = 0
            for b in batches:
                routed = route_by_key(b, d.key_columns, d.partitions)
                other = next((p for p in sorted(routed) if p != partition), None)
                at += b.num_rows
                if other is not None:
                    row = at - b.num_rows + int(routed[other][0].as_py())
                    raise InvalidRequest(
                        f"row {row} of the append to {d.namespace}.{d.name} routes by its "
                        f"key to partition {other}, not {partition}; a primary-key table's "
                        "rows go to the partition their key routes to (leave partition "
                        "out), so nothing was written"
                    )
            return {partition: None}
        if d.key_columns:
            # Row indices over the batches in order, as if they were one.
            groups: dict[int, list[np.ndarray]] = {}
            at = 0
            for b in batches:
                for p, idx in route_by_key(b, d.key_columns, d.partitions).items():
                    groups.setdefault(p, []).append(idx.to_numpy() + at)
                at += b.num_rows
            if len(groups) == 1:
                return {next(iter(groups)): None}
            return {p: pa.array(np.concatenate(groups[p])) for p in sorted(groups)}
        if producer_id is not None:
            # Deterministic, so a retry lands where the first attempt did.
            return {partition_for_key([producer_id], d.partitions): None}
        counter = self._round_robin.setdefault(d.table_id, itertools.count())
        return {next(counter) % d.partitions: None}
