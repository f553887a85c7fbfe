"""The stream-table service: every operation both edges (gRPC, HTTP) expose.

It talks to the hot log and the metadata store only through their interfaces and knows
nothing of wire formats: edges hand it Arrow batches and get Arrow batches back. Blocking
backend calls run on a dedicated thread pool so the event loop never waits on disk or
network I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import itertools
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import pyarrow as pa

from gateway.config import Settings
from gateway.hot import AppendResult, HotLog, PartitionId, ProducerSequence, StoredBatch
from gateway.meta import MetadataStore, TableDef
from gateway.wire.codec import decode_batch, encode_batch
from gateway.wire.errors import (
    InvalidIdempotentAppend,
    InvalidPartition,
    InvalidRequest,
    InvalidSchema,
    OffsetOutOfRange,
    SnapshotNotFound,
)
from gateway.wire.filters import Expr, FilterLimits, compile_filter, to_arrow
from gateway.wire.routing import partition_for_key, route_by_key
from gateway.wire.schema import (
    OFFSET_COLUMN,
    conform_batch,
    fields_to_json,
    parse_fields,
    system_schema,
    with_system_columns,
)
from gateway.wire.types import AppendRange

if TYPE_CHECKING:
    from gateway.cold import ColdSnapshot, ColdStore, ColdTable, PlannedFile

__all__ = [
    "AppendRange",
    "HotRange",
    "PartitionView",
    "ReadPlan",
    "ReadResult",
    "ScanResult",
    "StreamTables",
    "TableView",
]

P = ParamSpec("P")
R = TypeVar("R")

_IDENT_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_\-]{0,127}$")
_GROUP_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,254}$")
MAX_PARTITIONS = 4096
_TABLE_CACHE_TTL_S = 2.0


@dataclass(frozen=True, slots=True)
class PartitionView:
    partition: int
    earliest_offset: int
    high_watermark: int
    tiered_watermark: int
    hot_bytes: int

    @property
    def lag_records(self) -> int:
        """Records not yet tiered: ``HW(p) - T(p)``."""
        return max(0, self.high_watermark - self.tiered_watermark)

    @property
    def lag_bytes(self) -> int:
        """Estimated hot bytes of the records not yet tiered (pro rata of ``hot_bytes``)."""
        held = self.high_watermark - self.earliest_offset
        behind = self.high_watermark - max(self.tiered_watermark, self.earliest_offset)
        if held <= 0 or behind <= 0:
            return 0
        return self.hot_bytes * behind // held


@dataclass(frozen=True, slots=True)
class TableView:
    definition: TableDef
    schema: pa.Schema
    partitions: tuple[PartitionView, ...] = ()

    @property
    def stored_schema(self) -> pa.Schema:
        return system_schema(self.schema)


@dataclass(frozen=True, slots=True)
class ReadResult:
    #: Batches in offset order, user columns then the system columns.
    batches: list[pa.RecordBatch]
    next_offset: int
    high_watermark: int
    schema: pa.Schema = field(repr=False, default_factory=lambda: pa.schema([]))

    @property
    def num_records(self) -> int:
        return sum(b.num_rows for b in self.batches)


def _slice_batches(
    stored: Sequence[StoredBatch], partition: int, offset: int, max_records: int
) -> tuple[list[pa.RecordBatch], int]:
    """Decoded records ``[offset, offset + max_records)`` of hot batches, with system
    columns, and the offset after the last one."""
    out: list[pa.RecordBatch] = []
    remaining = max_records
    next_offset = offset
    for sb in stored:
        if remaining <= 0:
            break
        start = max(0, next_offset - sb.base_offset)
        length = min(sb.count - start, remaining)
        if length <= 0:
            continue
        rows = with_system_columns(
            decode_batch(sb.payload), partition, sb.base_offset, sb.timestamp_us
        )
        out.append(rows.slice(start, length))
        remaining -= length
        next_offset = sb.base_offset + start + length
    return out, next_offset


@dataclass(frozen=True, slots=True)
class HotRange:
    """Offsets ``[from_offset, to_offset)`` of a partition that a reader fetches from the
    gateway (not in the pinned snapshot)."""

    partition: int
    from_offset: int
    to_offset: int


@dataclass(frozen=True, slots=True)
class ReadPlan:
    """A pinned view of a table for engines that read in parallel: the snapshot's data
    files plus the hot ranges per partition. Together they hold every record once."""

    snapshot_id: int | None
    files: list[PlannedFile]
    hot_ranges: list[HotRange]
    schema: pa.Schema


@dataclass
class ScanResult:
    """A scan's schema, pinned view and batches (an async iterator, consumed once)."""

    schema: pa.Schema
    snapshot_id: int | None
    batches: AsyncIterator[pa.RecordBatch]


def _parse_as_of(as_of: Any) -> int | dt.datetime | None:
    """A snapshot id (int or digits) or an ISO-8601 time (UTC when naive)."""
    if as_of is None or as_of == "":
        return None
    if isinstance(as_of, bool):
        raise InvalidRequest(f"as_of must be a snapshot id or an ISO-8601 time, got {as_of!r}")
    if isinstance(as_of, int):
        return as_of
    if isinstance(as_of, str):
        text = as_of.strip()
        if text.lstrip("-").isdigit():
            return int(text)
        try:
            when = dt.datetime.fromisoformat(text)
        except ValueError:
            raise InvalidRequest(
                f"as_of {as_of!r} is neither a snapshot id nor an ISO-8601 time", as_of=as_of
            ) from None
        return when if when.tzinfo else when.replace(tzinfo=dt.UTC)
    raise InvalidRequest(f"as_of must be a snapshot id or an ISO-8601 time, got {as_of!r}")


def _check_ident(kind: str, value: str) -> None:
    if not isinstance(value, str) or not _IDENT_RE.match(value):
        raise InvalidRequest(
            f"{kind} {value!r} must start with a letter and hold only letters, digits, "
            "'_' and '-' (at most 128)"
        )


class _Notifier:
    """Wakes followers of a partition when this process appends to it."""

    def __init__(self) -> None:
        self._events: dict[PartitionId, asyncio.Event] = {}

    def event(self, part: PartitionId) -> asyncio.Event:
        ev = self._events.get(part)
        if ev is None:
            ev = self._events[part] = asyncio.Event()
        return ev

    def notify(self, part: PartitionId) -> None:
        ev = self._events.pop(part, None)
        if ev is not None:
            ev.set()


class StreamTables:
    """Create, describe, list, drop, append to and read stream-tables."""

    def __init__(
        self,
        settings: Settings,
        meta: MetadataStore,
        hot: HotLog,
        cold: ColdStore | None = None,
    ) -> None:
        self.settings = settings
        self.meta = meta
        self.hot = hot
        #: The Iceberg tier; None serves the hot tier alone (``cold.enabled=false``).
        self.cold = cold
        self._cold_tables: dict[str, ColdTable] = {}
        self._snapshots: dict[str, tuple[float, ColdSnapshot]] = {}
        self._pool = ThreadPoolExecutor(settings.server.io_threads, thread_name_prefix="tg-io")
        self._tables: dict[tuple[str, str, str], tuple[float, TableView]] = {}
        self._round_robin: dict[str, itertools.count[int]] = {}
        self._notifier = _Notifier()
        s = settings.server
        self._filter_limits = FilterLimits(
            s.max_filter_chars, s.max_filter_terms, s.max_filter_depth
        )

    async def _run(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(*args, **kwargs))

    async def offload(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Run CPU-heavy work of an edge (encoding a response) on the I/O pool, so that
        the event loop keeps serving other requests meanwhile."""
        return await self._run(fn, *args, **kwargs)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.hot.close()
        if self.cold is not None:
            self.cold.close()
        self.meta.close()

    # Tables ----------------------------------------------------------------------------
    async def create_table(
        self,
        tenant: str,
        namespace: str,
        name: str,
        fields: Any,
        partitions: int,
        key_columns: Sequence[str] = (),
    ) -> TableView:
        """Create a table.

        Raises:
            InvalidRequest: bad names or partition count.
            InvalidSchema: the schema or key columns cannot be stored.
            TableAlreadyExists: the name is taken in this tenant.
        """
        _check_ident("namespace", namespace)
        _check_ident("table name", name)
        if (
            isinstance(partitions, bool)
            or not isinstance(partitions, int)
            or not (1 <= partitions <= MAX_PARTITIONS)
        ):
            raise InvalidRequest(f"partitions must be an integer from 1 to {MAX_PARTITIONS}")
        schema = parse_fields(fields)
        keys = list(key_columns)
        for k in keys:
            if k not in schema.names:
                raise InvalidSchema(f"key column {k!r} is not a column of the schema")
        if len(set(keys)) != len(keys):
            raise InvalidSchema("a key column is named twice")
        cold = self.cold
        if cold is not None:
            # Before any metadata is written: an unstorable schema leaves nothing behind.
            cold.check_schema(schema)
        await self._run(self.meta.ensure_tenant, tenant)
        d = await self._run(
            self.meta.create_table,
            tenant,
            namespace,
            name,
            fields_to_json(schema),
            partitions,
            keys,
        )
        if cold is not None:
            try:
                await self._run(cold.create_table, d, schema)
            except BaseException:
                with contextlib.suppress(Exception):
                    await self._run(self.meta.drop_table, tenant, namespace, name)
                raise
        return await self.describe_table(tenant, namespace, name)

    async def table(self, tenant: str, namespace: str, name: str) -> TableView:
        """The table's definition and schema, cached for a moment (no live offsets).

        Raises:
            TableNotFound: no such table in this tenant.
        """
        key = (tenant, namespace, name)
        now = time.monotonic()
        hit = self._tables.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        definition = await self._run(self.meta.get_table, tenant, namespace, name)
        view = TableView(definition, parse_fields(definition.fields))
        self._tables[key] = (now + _TABLE_CACHE_TTL_S, view)
        return view

    def _part(self, table: TableView, partition: int) -> PartitionId:
        d = table.definition
        if (
            isinstance(partition, bool)
            or not isinstance(partition, int)
            or not (0 <= partition < d.partitions)
        ):
            raise InvalidPartition(
                f"partition {partition!r} does not exist in {d.namespace}.{d.name}, "
                f"which has partitions 0..{d.partitions - 1}",
                partitions=d.partitions,
            )
        return PartitionId(d.tenant, d.table_id, partition)

    async def describe_table(self, tenant: str, namespace: str, name: str) -> TableView:
        """The table with live per-partition offsets.

        Raises:
            TableNotFound: no such table in this tenant.
        """
        self._tables.pop((tenant, namespace, name), None)
        table = await self.table(tenant, namespace, name)
        d = table.definition

        def offsets() -> list[PartitionView]:
            views = []
            cached = {p.partition: p for p in self.meta.partitions(d.table_id)}
            # The snapshot summary is the source of truth of T(p); the store caches it.
            snap = self._cold_table(table).snapshot() if self.cold is not None else None
            for p in range(d.partitions):
                o = self.hot.offsets(PartitionId(d.tenant, d.table_id, p))
                if snap is not None:
                    tiered = snap.watermark(p)
                else:
                    tiered = cached[p].tiered_watermark if p in cached else 0
                earliest = 0 if tiered > 0 else o.low
                high = max(o.high, tiered)
                views.append(PartitionView(p, earliest, high, tiered, o.size_bytes))
            self.meta.update_high_watermarks(
                d.table_id, {v.partition: v.high_watermark for v in views}
            )
            if snap is not None:
                self.meta.update_tiered_watermarks(
                    d.table_id, {v.partition: v.tiered_watermark for v in views}
                )
            return views

        return TableView(d, table.schema, tuple(await self._run(offsets)))

    async def list_tables(self, tenant: str, namespace: str | None = None) -> list[TableView]:
        if namespace:
            _check_ident("namespace", namespace)
        defs = await self._run(self.meta.list_tables, tenant, namespace or None)
        return [TableView(d, parse_fields(d.fields)) for d in defs]

    async def drop_table(self, tenant: str, namespace: str, name: str) -> None:
        """Drop the table and its hot data.

        Raises:
            TableNotFound: no such table in this tenant.
        """
        d = await self._run(self.meta.drop_table, tenant, namespace, name)
        self._tables.pop((tenant, namespace, name), None)
        self._cold_tables.pop(d.table_id, None)
        cold = self.cold

        def drop_logs() -> None:
            for p in range(d.partitions):
                self.hot.drop(PartitionId(d.tenant, d.table_id, p))
            if cold is not None:
                cold.drop_table(d)

        await self._run(drop_logs)

    # Writes ----------------------------------------------------------------------------
    async def append(
        self,
        tenant: str,
        namespace: str,
        name: str,
        batches: Sequence[pa.RecordBatch],
        *,
        partition: int | None = None,
        producer_id: str | None = None,
        sequence: int | None = None,
    ) -> list[AppendRange]:
        """Validate, route and store rows; one contiguous offset range per partition.

        Every check happens before anything is written: a request that fails validation
        stores nothing. A request whose rows span several partitions is stored per
        partition (not atomically across partitions, as in Kafka).

        Raises:
            TableNotFound, SchemaMismatch, InvalidPartition, InvalidRequest,
            InvalidIdempotentAppend, OutOfOrderSequence, Unavailable.
        """
        table = await self.table(tenant, namespace, name)
        d = table.definition
        if (producer_id is None) != (sequence is None):
            raise InvalidIdempotentAppend("producer_id and sequence go together")
        if producer_id is not None and (
            not isinstance(sequence, int)
            or sequence < 0
            or not producer_id
            or len(producer_id) > 128
        ):
            raise InvalidIdempotentAppend(
                "sequence must be a non-negative integer and producer_id 1 to 128 characters"
            )
        conformed = [conform_batch(b, table.schema) for b in batches if b.num_rows]
        if not conformed:
            raise InvalidRequest("an append needs at least one row")
        batch = (
            conformed[0]
            if len(conformed) == 1
            else pa.Table.from_batches(conformed, table.schema).combine_chunks().to_batches()[0]
        )
        routes = self._route(table, batch, partition, producer_id, sequence)
        if producer_id is not None and len(routes) != 1:
            raise InvalidIdempotentAppend(
                f"an idempotent append must target one partition, but its rows route to "
                f"{sorted(routes)}; set 'partition' or split the batch by key",
                partitions=",".join(str(p) for p in sorted(routes)),
            )
        producer = (
            ProducerSequence(producer_id, sequence)
            if producer_id is not None and sequence is not None
            else None
        )
        timestamp_us = time.time_ns() // 1000
        compression = self.settings.compression

        async def store(p: int, idx: pa.Array | None) -> AppendRange:
            part = PartitionId(d.tenant, d.table_id, p)

            def write() -> AppendResult:
                # Selecting and compressing the rows run here, on the I/O thread, with the
                # write: off the event loop, and in parallel for several partitions.
                rows = batch if idx is None else batch.take(idx)
                payload = encode_batch(rows, compression)
                return self.hot.append(part, payload, rows.num_rows, timestamp_us, producer)

            res = await self._run(write)
            self._notifier.notify(part)
            return AppendRange(p, res.base_offset, res.count, res.duplicate)

        jobs = [store(p, idx) for p, idx in routes.items()]
        return list(await asyncio.gather(*jobs))

    def _route(
        self,
        table: TableView,
        batch: pa.RecordBatch,
        partition: int | None,
        producer_id: str | None,
        sequence: int | None,
    ) -> dict[int, pa.Array | None]:
        d = table.definition
        if partition is not None:
            self._part(table, partition)
            return {partition: None}
        if d.key_columns:
            groups = route_by_key(batch, d.key_columns, d.partitions)
            if len(groups) == 1:
                return {next(iter(groups)): None}
            return dict(groups)
        if producer_id is not None:
            # Deterministic, so a retry lands where the first attempt did.
            return {partition_for_key([producer_id], d.partitions): None}
        counter = self._round_robin.setdefault(d.table_id, itertools.count())
        return {next(counter) % d.partitions: None}

    # Reads -----------------------------------------------------------------------------
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
    ) -> ReadResult:
        """Records of one partition from ``offset`` in offset order.

        Raises:
            TableNotFound, InvalidPartition,
            OffsetOutOfRange: below the earliest offset or above the high watermark.
        """
        table = await self.table(tenant, namespace, name)
        part = self._part(table, partition)
        records, nbytes = self._limits(max_records, max_bytes)
        return await self._read(table, part, offset, records, nbytes)

    def _cold_table(self, table: TableView) -> ColdTable:
        """The table's cold handle, kept per table id (handles cache table metadata)."""
        assert self.cold is not None
        d = table.definition
        handle = self._cold_tables.get(d.table_id)
        if handle is None:
            if len(self._cold_tables) > 4096:
                self._cold_tables.clear()
            handle = self._cold_tables[d.table_id] = self.cold.table(d)
        return handle

    def _read_snapshot(
        self, table: TableView, cold: ColdTable, *, fresh: bool = False
    ) -> ColdSnapshot:
        """The current snapshot for a stream read, reused for ``cold.snapshot_cache_ms``
        unless ``fresh``.

        An older snapshot is still a consistent view: its ``T(p)`` is lower, and the hot
        tier keeps records below the newest ``T(p)`` for ``hot_retention``, so the read
        finds them there. A caller that finds the hot tier trimmed above the reused
        snapshot's ``T(p)`` (a retention shorter than the reuse) asks again with
        ``fresh``."""
        ttl = self.settings.cold.snapshot_cache_ms / 1000
        key = table.definition.table_id
        now = time.monotonic()
        hit = self._snapshots.get(key)
        if not fresh and hit is not None and hit[0] > now:
            return hit[1]
        snap = cold.snapshot()
        if ttl > 0:
            if len(self._snapshots) > 4096:
                self._snapshots.clear()
            self._snapshots[key] = (now + ttl, snap)
        return snap

    async def _read(
        self, table: TableView, part: PartitionId, offset: int, max_records: int, max_bytes: int
    ) -> ReadResult:
        """Stitched read: offsets below ``T(p)`` of the current snapshot come from its
        data files, offsets at or above it from the hot tier, in one ordered result."""
        cold = self._cold_table(table) if self.cold is not None else None

        def fetch() -> ReadResult:
            snap = self._read_snapshot(table, cold) if cold is not None else None
            tiered = snap.watermark(part.partition) if snap is not None else 0
            o = self.hot.offsets(part)
            if cold is not None and o.low > tiered:
                # Trimmed above the reused snapshot's watermark: look at the newest one.
                snap = self._read_snapshot(table, cold, fresh=True)
                tiered = snap.watermark(part.partition)
            earliest = 0 if tiered > 0 else o.low
            high = max(o.high, tiered)
            if (
                isinstance(offset, bool)
                or not isinstance(offset, int)
                or offset < earliest
                or offset > high
            ):
                raise OffsetOutOfRange(
                    f"offset {offset!r} is out of range [{earliest}, {high}]",
                    offset=offset if isinstance(offset, int) else -1,
                    earliest=earliest,
                    latest=high,
                )
            out: list[pa.RecordBatch] = []
            remaining, nbytes, next_offset = max_records, 0, offset
            if cold is not None and snap is not None and offset < tiered:
                stop = min(tiered, offset + max_records)
                for batch in cold.read_range(snap, part.partition, offset, stop):
                    first = batch.column(OFFSET_COLUMN)[0].as_py()
                    if first != next_offset:  # pragma: no cover - a broken snapshot
                        raise RuntimeError(
                            f"cold tier gap in partition {part.partition}: expected offset "
                            f"{next_offset}, found {first}"
                        )
                    out.append(batch)
                    remaining -= batch.num_rows
                    nbytes += batch.nbytes
                    next_offset += batch.num_rows
                    if nbytes >= max_bytes:
                        break
                if next_offset < stop and nbytes < max_bytes:  # pragma: no cover
                    raise RuntimeError(
                        f"cold tier is missing offsets {next_offset}..{stop - 1} of "
                        f"partition {part.partition}"
                    )
            if remaining > 0 and nbytes < max_bytes and next_offset < o.high:
                stored = self.hot.read(part, next_offset, remaining, max_bytes - nbytes)
                hot, next_offset = _slice_batches(stored, part.partition, next_offset, remaining)
                out.extend(hot)
            return ReadResult(out, next_offset, max(high, next_offset), table.stored_schema)

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
    ) -> AsyncIterator[ReadResult]:
        """Reads from ``offset`` that wait for new records instead of ending.

        Yields every non-empty result. With ``max_records`` the iteration ends once that
        many records were yielded; with ``max_wait_s`` it ends after waiting that long
        for a record (the HTTP long poll). Appends through this process wake followers at
        once; appends through other gateways are seen within ``follow_poll_ms``.
        """
        table = await self.table(tenant, namespace, name)
        part = self._part(table, partition)
        total = max_records or 0
        _, nbytes = self._limits(None, max_bytes)
        per_call = self.settings.server.max_read_records
        poll_s = self.settings.server.follow_poll_ms / 1000
        deadline = None if max_wait_s is None else time.monotonic() + max_wait_s
        seen = 0
        while True:
            event = self._notifier.event(part)
            want = per_call if total == 0 else min(per_call, total - seen)
            result = await self._read(table, part, offset, want, nbytes)
            if result.num_records:
                yield result
                seen += result.num_records
                offset = result.next_offset
                if total and seen >= total:
                    return
                if deadline is not None:
                    return
                continue
            timeout = poll_s
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    yield result
                    return
                timeout = min(timeout, left)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout)

    # Offsets ---------------------------------------------------------------------------
    def _partitions(self, table: TableView, partitions: Sequence[int] | None) -> list[int]:
        if not partitions:
            return list(range(table.definition.partitions))
        for p in partitions:
            self._part(table, p)
        return sorted(set(partitions))

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
            o = self.hot.offsets(part)
            # The answer lies in [lo, hi]; both stay on batch boundaries (or the log's ends).
            lo, hi = o.low, o.high
            while lo < hi:
                stored = self.hot.read(part, (lo + hi) // 2, 1, 1)
                if not stored:
                    break
                sb = stored[0]
                if sb.timestamp_us >= timestamp_us:
                    hi = max(lo, sb.base_offset)
                else:
                    lo = min(hi, sb.next_offset)
            return lo

        def run() -> dict[int, int]:
            return {p: search(p) for p in wanted}

        return await self._run(run)

    # Consumer groups -------------------------------------------------------------------
    async def commit_offsets(
        self, tenant: str, group: str, namespace: str, name: str, offsets: dict[int, int]
    ) -> None:
        """Store a group's committed offsets (partition -> next offset to consume).

        Raises:
            TableNotFound, InvalidPartition, InvalidRequest: a bad group name or a
            negative offset.
        """
        self._check_group(group)
        table = await self.table(tenant, namespace, name)
        for p, off in offsets.items():
            self._part(table, p)
            if isinstance(off, bool) or not isinstance(off, int) or off < 0:
                raise InvalidRequest(f"offset {off!r} of partition {p} must be >= 0")
        await self._run(
            self.meta.commit_offsets, tenant, group, table.definition.table_id, dict(offsets)
        )

    async def fetch_offsets(
        self,
        tenant: str,
        group: str,
        namespace: str,
        name: str,
        partitions: Sequence[int] | None = None,
    ) -> dict[int, int]:
        """A group's committed offsets; partitions without a commit are absent.

        Raises:
            TableNotFound, InvalidPartition, InvalidRequest: a bad group name.
        """
        self._check_group(group)
        table = await self.table(tenant, namespace, name)
        wanted = set(self._partitions(table, partitions))
        got = await self._run(self.meta.fetch_offsets, tenant, group, table.definition.table_id)
        return {p: o for p, o in sorted(got.items()) if p in wanted}

    @staticmethod
    def _check_group(group: str) -> None:
        if not isinstance(group, str) or not _GROUP_RE.match(group):
            raise InvalidRequest(
                f"group {group!r} must start with a letter or digit and hold only letters, "
                "digits, '_', '.' and '-' (at most 255)"
            )

    # Scans and read plans ------------------------------------------------------------------
    async def _filter(self, text: str | None, stored: pa.Schema) -> Expr | None:
        """The bound filter tree of a filter text (None: no filter). Parsed on the I/O
        pool, never on the event loop: the text is a tenant's input, bounded by
        ``server.max_filter_*``."""
        if text is not None and not isinstance(text, str):
            raise InvalidRequest("filter must be a string")
        if not text or not text.strip():
            return None
        return await self._run(compile_filter, text, stored, self._filter_limits)

    def _projection(self, table: TableView, columns: Sequence[str] | None) -> list[str]:
        stored = table.stored_schema
        if columns is None or len(columns) == 0:
            return list(stored.names)
        if isinstance(columns, str) or not all(isinstance(c, str) for c in columns):
            raise InvalidRequest("columns must be a list of column names")
        unknown = [c for c in columns if c not in stored.names]
        if unknown:
            raise InvalidRequest(
                f"unknown column(s) {unknown}; the table has {stored.names}",
                unknown=",".join(unknown),
            )
        if len(set(columns)) != len(columns):
            raise InvalidRequest("a column is named twice in columns")
        return list(columns)

    def _pin(
        self, table: TableView, when: int | dt.datetime | None
    ) -> tuple[ColdSnapshot | None, list[HotRange]]:
        """Pin a snapshot ``S`` first, then per partition the hot range
        ``[T_S(p), HW(p))``: every record below HW is in exactly one of the two."""
        d = table.definition
        if when is not None:
            if self.cold is None:
                raise SnapshotNotFound("as_of needs the cold tier, which is disabled")
            return self._cold_table(table).snapshot(when), []
        snap = self._cold_table(table).snapshot() if self.cold is not None else None
        ranges = []
        for p in range(d.partitions):
            o = self.hot.offsets(PartitionId(d.tenant, d.table_id, p))
            lo = snap.watermark(p) if snap is not None else o.low
            if o.high > lo:
                ranges.append(HotRange(p, lo, o.high))
        return snap, ranges

    def _hot_rows(
        self, table: TableView, r: HotRange, arrow_filter: Any, names: list[str]
    ) -> Iterator[pa.RecordBatch]:
        d = table.definition
        part = PartitionId(d.tenant, d.table_id, r.partition)
        s = self.settings.server
        offset = r.from_offset
        while offset < r.to_offset:
            stored = self.hot.read(
                part, offset, min(s.max_read_records, r.to_offset - offset), s.max_read_bytes
            )
            if not stored:  # pragma: no cover - the range was below HW when pinned
                raise RuntimeError(f"hot range {r} ended early at {offset}")
            for sb in stored:
                rows = with_system_columns(
                    decode_batch(sb.payload), part.partition, sb.base_offset, sb.timestamp_us
                )
                start = max(0, offset - sb.base_offset)
                length = min(rows.num_rows - start, r.to_offset - offset)
                if length <= 0:
                    continue
                rows = rows.slice(start, length)
                offset += length
                if arrow_filter is not None:
                    rows = pa.Table.from_batches([rows]).filter(arrow_filter).combine_chunks()
                    batches = rows.to_batches()
                    if not batches:
                        continue
                    rows = batches[0]
                if rows.num_rows:
                    yield rows.select(names)
                if offset >= r.to_offset:
                    break

    async def scan(
        self,
        tenant: str,
        namespace: str,
        name: str,
        columns: Sequence[str] | None = None,
        row_filter: str | None = None,
        as_of: Any = None,
        limit: int | None = None,
    ) -> ScanResult:
        """Rows of the whole table: ``scan(S) + hot ranges`` of one pinned view.

        ``row_filter`` is a filter text (:mod:`gateway.wire.filters`: ``a > 5 and
        b = 'x'``), parsed once; the cold backend prunes files with it and both tiers
        keep exactly the rows its Arrow form keeps.
        With ``as_of`` (a snapshot id or an ISO-8601 time) only that cold snapshot is
        read: the hot tier keeps no history. Rows come cold first, then hot, partition by
        partition; no row twice, none missing, whatever tiering commits meanwhile.

        Raises:
            TableNotFound, InvalidRequest (bad columns, filter, as_of or limit),
            SnapshotNotFound.
        """
        table = await self.table(tenant, namespace, name)
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 0
        ):
            raise InvalidRequest("limit must be a non-negative integer")
        names = self._projection(table, columns)
        when = _parse_as_of(as_of)
        expr = await self._filter(row_filter, table.stored_schema)
        arrow_filter = to_arrow(expr, table.stored_schema) if expr is not None else None
        schema = pa.schema([table.stored_schema.field(n) for n in names])
        snap, ranges = await self._run(self._pin, table, when)
        cold = self._cold_table(table) if self.cold is not None else None

        def rows() -> Iterator[pa.RecordBatch]:
            left = limit
            if cold is not None and snap is not None:
                for b in cold.scan(snap, names, expr, left):
                    if left is not None:
                        b = b.slice(0, left)
                        left -= b.num_rows
                    if b.num_rows:
                        yield b
                    if left == 0:
                        return
            for r in ranges:
                for b in self._hot_rows(table, r, arrow_filter, names):
                    if left is not None:
                        b = b.slice(0, left)
                        left -= b.num_rows
                    if b.num_rows:
                        yield b.cast(schema)
                    if left == 0:
                        return

        async def batches() -> AsyncIterator[pa.RecordBatch]:
            it = rows()
            while True:
                b = await self._run(next, it, None)
                if b is None:
                    return
                yield b

        return ScanResult(schema, snap.snapshot_id if snap is not None else None, batches())

    async def plan(
        self,
        tenant: str,
        namespace: str,
        name: str,
        row_filter: str | None = None,
        as_of: Any = None,
    ) -> ReadPlan:
        """The pinned view of :meth:`scan` as a plan: the snapshot's data files (presigned
        URLs on object storage) that ``row_filter`` may match, plus the hot ranges
        ``[T_S(p), HW(p))`` an executor reads through the gateway.

        Raises:
            TableNotFound, InvalidRequest, SnapshotNotFound.
        """
        table = await self.table(tenant, namespace, name)
        when = _parse_as_of(as_of)
        expr = await self._filter(row_filter, table.stored_schema)
        snap, ranges = await self._run(self._pin, table, when)
        files: list[PlannedFile] = []
        if self.cold is not None and snap is not None:
            files = await self._run(self._cold_table(table).plan, snap, expr)
        return ReadPlan(
            snap.snapshot_id if snap is not None else None, files, ranges, table.stored_schema
        )
