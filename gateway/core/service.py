"""The stream-table service: every operation both edges (gRPC, HTTP) expose.

It talks to the hot log and the metadata store only through their interfaces and knows
nothing of wire formats: edges hand it Arrow batches and get Arrow batches back. Blocking
backend calls run on a dedicated thread pool so the event loop never waits on disk or
network I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

import pyarrow as pa

from gateway.config import Settings
from gateway.errors import (
    InvalidIdempotentAppend,
    InvalidPartition,
    InvalidRequest,
    InvalidSchema,
    OffsetOutOfRange,
)
from gateway.hot import HotLog, PartitionId, ProducerSequence, StoredBatch
from gateway.hot.codec import decode_batch, encode_batch
from gateway.meta import MetadataStore, TableDef
from gateway.routing import partition_for_key, route_by_key
from gateway.schema import (
    conform_batch,
    fields_to_json,
    parse_fields,
    system_schema,
    with_system_columns,
)

__all__ = ["AppendRange", "PartitionView", "ReadResult", "StreamTables", "TableView"]

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


@dataclass(frozen=True, slots=True)
class TableView:
    definition: TableDef
    schema: pa.Schema
    partitions: tuple[PartitionView, ...] = ()

    @property
    def stored_schema(self) -> pa.Schema:
        return system_schema(self.schema)


@dataclass(frozen=True, slots=True)
class AppendRange:
    partition: int
    base_offset: int
    count: int
    duplicate: bool = False


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

    def __init__(self, settings: Settings, meta: MetadataStore, hot: HotLog) -> None:
        self.settings = settings
        self.meta = meta
        self.hot = hot
        self._pool = ThreadPoolExecutor(settings.server.io_threads, thread_name_prefix="tg-io")
        self._tables: dict[tuple[str, str, str], tuple[float, TableView]] = {}
        self._round_robin: dict[str, itertools.count[int]] = {}
        self._notifier = _Notifier()

    async def _run(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(*args, **kwargs))

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.hot.close()
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
        await self._run(self.meta.ensure_tenant, tenant)
        await self._run(
            self.meta.create_table,
            tenant,
            namespace,
            name,
            fields_to_json(schema),
            partitions,
            keys,
        )
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
            for p in range(d.partitions):
                o = self.hot.offsets(PartitionId(d.tenant, d.table_id, p))
                tiered = cached[p].tiered_watermark if p in cached else 0
                views.append(PartitionView(p, o.low, o.high, tiered, o.size_bytes))
            self.meta.update_high_watermarks(
                d.table_id, {v.partition: v.high_watermark for v in views}
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

        def drop_logs() -> None:
            for p in range(d.partitions):
                self.hot.drop(PartitionId(d.tenant, d.table_id, p))

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

        async def store(p: int, rows: pa.RecordBatch) -> AppendRange:
            part = PartitionId(d.tenant, d.table_id, p)
            payload = encode_batch(rows, compression)
            res = await self._run(
                self.hot.append, part, payload, rows.num_rows, timestamp_us, producer
            )
            self._notifier.notify(part)
            return AppendRange(p, res.base_offset, res.count, res.duplicate)

        jobs = [store(p, batch if idx is None else batch.take(idx)) for p, idx in routes.items()]
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

    async def _read(
        self, table: TableView, part: PartitionId, offset: int, max_records: int, max_bytes: int
    ) -> ReadResult:
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            o = await self._run(self.hot.offsets, part)
            raise OffsetOutOfRange(
                f"offset {offset!r} is out of range [{o.low}, {o.high}]",
                offset=offset if isinstance(offset, int) else -1,
                earliest=o.low,
                latest=o.high,
            )

        def fetch() -> tuple[list[pa.RecordBatch], int, int]:
            # Decoding runs here, on the I/O pool, not on the event loop: pyarrow releases
            # the GIL while it decompresses.
            stored = self.hot.read(part, offset, max_records, max_bytes)
            high = self.hot.offsets(part).high
            return (*_slice_batches(stored, part.partition, offset, max_records), high)

        out, next_offset, high = await self._run(fetch)
        return ReadResult(out, next_offset, max(high, next_offset), table.stored_schema)

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
