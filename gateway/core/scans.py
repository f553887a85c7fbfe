"""Table scans and read plans over one pinned view of both tiers."""

from __future__ import annotations

import datetime as dt
import functools
import logging
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from gateway.core.base import CoreBase
from gateway.core.names import parse_as_of
from gateway.core.views import HotRange, ReadPlan, ScanPart, ScanResult, TableView
from gateway.hot import PartitionId
from gateway.wire.changes import PrimaryKey, merge_snapshot
from gateway.wire.codec import decode_batch
from gateway.wire.errors import (
    InvalidRequest,
    OffsetOutOfRange,
    SnapshotNotFound,
    Unavailable,
    Unimplemented,
)
from gateway.wire.evolution import read_as
from gateway.wire.filters import And, Compare, Expr, In, Or, compile_filter, to_arrow
from gateway.wire.scans import check_limit, projection
from gateway.wire.schema import OFFSET_COLUMN, PARTITION_COLUMN, with_system_columns

if TYPE_CHECKING:
    from gateway.cold import ColdSnapshot, ColdTable, PlannedFile

__all__ = ["ScanOps"]

log = logging.getLogger(__name__)

#: Arrow data per part of a scan handed whole to Arrow's transport: small enough that
#: reading the next part overlaps sending this one from the start of the scan.
_PART_BYTES = 4 * 1024 * 1024

#: A read plan's lease lasts this many times ``cold.presign_expiry_s``, and the plans of
#: the same snapshot share it while at least ``presign_expiry_s`` of it is left: every plan
#: keeps its files at least that long, as with a lease of its own, and a table planned
#: again and again (engines polling, small client-side scans) commits a lease row once per
#: ``presign_expiry_s`` instead of once per plan.
_PLAN_LEASE_FACTOR = 2


class ScanOps(CoreBase):
    async def _filter(self, text: str | None, stored: pa.Schema) -> Expr | None:
        """The bound filter tree of a filter text (None: no filter). Parsed on the I/O
        pool, never on the event loop: the text is a tenant's input, bounded by
        ``server.max_filter_*``."""
        if text is not None and not isinstance(text, str):
            raise InvalidRequest("filter must be a string")
        if not text or not text.strip():
            return None
        return await self._run(compile_filter, text, stored, self._filter_limits)

    def _pin(
        self, table: TableView, when: int | dt.datetime | None
    ) -> tuple[ColdSnapshot | None, list[HotRange], dict[int, int]]:
        """Pin a snapshot ``S`` first, then per partition the earliest offset retention
        recorded and the hot range ``[max(T_S(p), earliest), HW(p))``: every retained
        record below HW is in exactly one of the two. The earliest offsets are read
        after ``S``, so they cover every removal ``S`` holds; rows of ``S`` below them
        (recorded, not yet removed) are left out by :func:`_retained`."""
        d = table.definition
        keyed = d.primary_key is not None
        snap: ColdSnapshot | None
        if when is not None:
            if self.cold is None:
                raise SnapshotNotFound("as_of needs the cold tier, which is disabled")
            snap = self._pinned_table(table).snapshot(when)
        else:
            snap = self._pinned_table(table).snapshot() if self.cold is not None else None
        earliest = (
            {
                p.partition: p.earliest_offset
                for p in self.meta.partitions(d.table_id)
                if p.earliest_offset > 0
            }
            if d.retention_set_at is not None  # else no partition has one (see reads)
            else {}
        )
        if when is not None:
            # A key table's state as of then: each partition's state rows, no changes.
            return snap, [HotRange(p, 0, 0) for p in range(d.partitions)] if keyed else [], earliest
        ranges = []
        parts = [PartitionId(d.tenant, d.table_id, p) for p in range(d.partitions)]
        for p, o in enumerate(self.hot.offsets_many(parts)):
            # A key table's snapshot is its state table's: it holds the changes below
            # A(p), the hot tier the rest.
            lo = o.low
            if snap is not None:
                lo = snap.applied_through(p) if keyed else snap.watermark(p)
            # The hot tier starts above T(p) only when it lost its state and was re-seeded
            # above it (it trims below committed watermarks only): the offsets in between
            # are lost, not to be read.
            lo = max(lo, earliest.get(p, 0), o.low)
            if o.high > lo:
                ranges.append(HotRange(p, lo, o.high))
            elif keyed:  # every partition's state rows are read with its range
                ranges.append(HotRange(p, lo, lo))
        return snap, ranges, earliest

    def _pinned_table(self, table: TableView) -> ColdTable:
        """The Iceberg table a scan pins: a key table's state table, else the table's."""
        if table.definition.primary_key is not None:
            return self._state_table(table)
        return self._cold_table(table)

    def _lease(
        self, table: TableView, snap: ColdSnapshot | None, kind: str, past: bool
    ) -> str | None:
        """Hold ``snap`` against snapshot expiry while a scan reads it or a plan's files
        may be read: a lease in the metadata store, for ``expiry.scan_lease_s`` (scans,
        released when they end) or ``cold.presign_expiry_s`` (plans: their URLs last that
        long). A time-travel snapshot (``past``) is checked again once leased: an expiry
        that committed between the pin and the lease would have removed it (the current
        snapshot is never expired)."""
        if snap is None or snap.snapshot_id is None:
            return None
        ttl = (
            self.settings.expiry.scan_lease_s
            if kind == "scan"
            else float(self.settings.cold.presign_expiry_s)
        )
        lease = self.meta.add_lease(table.definition.table_id, snap.snapshot_id, kind, ttl)
        if past:
            try:
                self._pinned_table(table).snapshot(snap.snapshot_id)
            except SnapshotNotFound:
                self.meta.release_lease(lease.lease_id)
                raise
        return lease.lease_id

    async def _plan_lease(self, table: TableView, snap: ColdSnapshot) -> None:
        """Hold the current snapshot ``snap`` against expiry for at least
        ``cold.presign_expiry_s`` from now: the lease this process took for an earlier
        plan of it when enough of it is left, else a new one (``_PLAN_LEASE_FACTOR``).
        Never released: a plan's reader tells nobody when it is done."""
        if snap.snapshot_id is None:
            return
        key = (table.definition.table_id, snap.snapshot_id)
        ttl = float(self.settings.cold.presign_expiry_s)
        start = time.monotonic()
        held = self._plan_leases.get(key)
        if held is not None and held - start >= ttl:
            return
        await self._run(self.meta.add_lease, key[0], key[1], "plan", ttl * _PLAN_LEASE_FACTOR)
        # From before the lease was written: what this process counts on, never more
        # than the lease row holds.
        self._plan_leases[key] = start + ttl * _PLAN_LEASE_FACTOR

    def _hot_rows(
        self, table: TableView, r: HotRange, arrow_filter: Any, names: list[str]
    ) -> Iterator[pa.RecordBatch]:
        d = table.definition
        part = PartitionId(d.tenant, d.table_id, r.partition)
        s = self.settings.server
        offset = r.from_offset
        while offset < r.to_offset:
            try:
                stored = self.hot.read(
                    part, offset, min(s.max_read_records, r.to_offset - offset), s.max_read_bytes
                )
            except OffsetOutOfRange:
                stored = []
            if not stored:
                # Below the high watermark when pinned, gone now: the hot tier lost it
                # (an emptied Redis) or it was trimmed. A new scan pins a new view.
                raise Unavailable(
                    f"partition {r.partition} of {d.namespace}.{d.name} no longer holds "
                    f"offsets {offset} to {r.to_offset} in the hot tier, which this scan "
                    "pinned (the hot tier lost or trimmed them meanwhile): scan again",
                    partition=r.partition,
                    offset=offset,
                )
            for sb in stored:
                rows = with_system_columns(
                    # The scan's schema is sent already: a batch of a schema newer than
                    # its view (changed after the scan read the table) is cast to it.
                    read_as(decode_batch(sb.payload), table.log_schema, strict=False),
                    part.partition,
                    sb.base_offset,
                    sb.timestamp_us,
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

    def _state_rows(
        self,
        table: TableView,
        r: HotRange,
        arrow_filter: Any,
        names: list[str],
        *,
        state: ColdTable | None = None,
        snap: ColdSnapshot | None = None,
        expr: Expr | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """A primary-key table's current state in one partition: the pinned state
        snapshot's rows of the partition (``snap`` of ``state``, pruned by ``expr``) with
        the partition's hot changes ``[A(p), HW(p))`` (``r``) merged over them (last-row:
        the log is resolved at write, docs/decisions/primary-keys.md), then filtered and
        projected. Pruning the state rows first is exact: a key the hot range changes
        takes its row from its last change there, whatever the state held. A partition's
        rows are held in memory for the merge."""
        pk = table.definition.primary_key
        assert pk is not None
        schema = table.scan_schema
        base = schema.empty_table()
        if state is not None and snap is not None and snap.snapshot_id is not None:
            where: Expr = Compare(PARTITION_COLUMN, "=", r.partition)
            found = list(state.scan(snap, None, where if expr is None else And((where, expr))))
            if found:
                base = pa.Table.from_batches(found).select(schema.names).cast(schema)
        log_names = list(table.stored_schema.names)
        changes = (
            list(self._hot_rows(table, r, None, log_names)) if r.to_offset > r.from_offset else []
        )
        rows = (
            merge_snapshot(base, pa.Table.from_batches(changes), PrimaryKey(pk.columns))
            if changes
            else base
        )
        if arrow_filter is not None:
            rows = rows.filter(arrow_filter)
        for b in rows.select(names).combine_chunks().to_batches():
            if b.num_rows:
                yield b

    async def scan_schema(
        self, tenant: str, namespace: str, name: str, columns: Sequence[str] | None = None
    ) -> pa.Schema:
        """The schema a scan of ``columns`` (every column by default) answers, without
        scanning.

        Raises:
            TableNotFound, InvalidRequest (bad columns).
        """
        table = await self.table(tenant, namespace, name, fresh=True)
        return pa.schema(
            [table.scan_schema.field(n) for n in projection(table.scan_schema, columns)]
        )

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
        table = await self.table(tenant, namespace, name, fresh=True)
        check_limit(limit)
        names = projection(table.scan_schema, columns)
        when = parse_as_of(as_of)
        expr = await self._filter(row_filter, table.scan_schema)
        arrow_filter = to_arrow(expr, table.scan_schema) if expr is not None else None
        schema = pa.schema([table.scan_schema.field(n) for n in names])
        snap, ranges, earliest = await self._run(self._pin, table, when)
        # A filter naming partitions reads no other partition's hot range (a Spark read of
        # a key table scans one partition per task, docs/decisions/primary-keys.md).
        named = _partitions_named(expr)
        ranges = [r for r in ranges if named is None or r.partition in named]
        keyed = table.definition.primary_key is not None
        # A key table's Iceberg side is merged partition by partition with its changes.
        cold = self._cold_table(table) if self.cold is not None and not keyed else None
        hot_rows: Any = self._hot_rows
        if keyed:
            hot_rows = functools.partial(
                self._state_rows,
                state=self._state_table(table) if self.cold is not None else None,
                snap=snap,
                expr=expr,
            )
        lease = await self._run(self._lease, table, snap, "scan", when is not None)
        cold_expr = _retained(expr, earliest, table.definition.partitions)

        def rows() -> Iterator[pa.RecordBatch]:
            left = limit
            if cold is not None and snap is not None:
                for b in cold.scan(snap, names, cold_expr, left):
                    if left is not None:
                        b = b.slice(0, left)
                        left -= b.num_rows
                    if b.num_rows:
                        yield b
                    if left == 0:
                        return
            for r in ranges:
                for b in hot_rows(table, r, arrow_filter, names):
                    if left is not None:
                        b = b.slice(0, left)
                        left -= b.num_rows
                    if b.num_rows:
                        yield b.cast(schema)
                    if left == 0:
                        return

        def release() -> None:
            if lease is not None:
                # Not awaited: the scan's answer is complete, and a lease that outlives
                # it by a moment only keeps a snapshot a moment longer.
                self._pool.submit(_release, self.meta.release_lease, lease)

        async def batches() -> AsyncIterator[pa.RecordBatch]:
            it = rows()
            try:
                while True:
                    try:
                        b = await self._run(next, it, None)
                    except Exception as exc:
                        raise await self._unless_dropped(table, exc) from None
                    if b is None:
                        return
                    yield b
            finally:
                release()

        part_bytes = min(_PART_BYTES, self.settings.server.max_read_bytes)

        async def parts() -> AsyncIterator[ScanPart]:
            """The same rows as ``batches`` (without a limit), as whole tables: the
            cold snapshot's slices (read by Arrow's C++), then the hot ranges' rows."""
            try:
                if cold is not None and snap is not None:
                    slices = await self._run(cold.scan_slices, snap, names, cold_expr, part_bytes)
                    for piece in slices:
                        yield ScanPart(piece.nbytes, piece.read)
                hot = _HotTables(hot_rows(table, r, arrow_filter, names) for r in ranges)
                while not hot.done:
                    yield ScanPart(part_bytes, lambda: hot.take(schema, part_bytes))
            finally:
                release()

        return ScanResult(
            schema,
            snap.snapshot_id if snap is not None else None,
            batches(),
            parts() if limit is None else None,
        )

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
        table = await self.table(tenant, namespace, name, fresh=True)
        if table.definition.primary_key is not None:
            # Its hot ranges hold changes, not rows: a planned reader would show every
            # version (the SDK's auto mode then scans on the gateway).
            raise Unimplemented(
                f"table {namespace}.{name} has a primary key: its current state is "
                "answered by the gateway's scan, not a read plan (scan with mode='server')"
            )
        when = parse_as_of(as_of)
        expr = await self._filter(row_filter, table.stored_schema)
        snap, ranges, earliest = await self._run(self._pin, table, when)
        files: list[PlannedFile] = []
        if self.cold is not None and snap is not None:
            if when is None:
                await self._plan_lease(table, snap)
            else:  # checked again once leased: a lease of its own
                await self._run(self._lease, table, snap, "plan", True)
            # Files wholly below a partition's earliest offset are pruned by their bounds.
            files = await self._run(
                self._cold_table(table).plan,
                snap,
                _retained(expr, earliest, table.definition.partitions),
            )
        return ReadPlan(
            snap.snapshot_id if snap is not None else None,
            files,
            ranges,
            table.stored_schema,
            earliest,
        )


class _HotTables:
    """The hot ranges' rows of a scan (decoded from their stored batches, which takes
    Python per stored batch) gathered into tables of about ``nbytes`` each."""

    def __init__(self, ranges: Iterator[Iterator[pa.RecordBatch]]) -> None:
        self._rows = (b for r in ranges for b in r)
        self.done = False

    def take(self, schema: pa.Schema, nbytes: int) -> pa.Table | None:
        out: list[pa.RecordBatch] = []
        size = 0
        while size < nbytes:
            b = next(self._rows, None)
            if b is None:
                self.done = True
                break
            out.append(b.cast(schema))
            size += b.nbytes
        return pa.Table.from_batches(out, schema) if out else None


def _release(release: Any, lease: str) -> None:
    """Release a scan's lease off the request path; one that fails expires on its own."""
    try:
        release(lease)
    except Exception:
        log.warning("could not release scan lease %s; it expires on its own", lease, exc_info=True)


def _partitions_named(expr: Expr | None) -> frozenset[int] | None:
    """The partitions a bound filter can keep, from its top-level conjuncts
    ``_partition = p`` and ``_partition in (...)`` (None: any partition)."""
    if expr is None:
        return None
    kept: frozenset[int] | None = None
    for leaf in expr.children if isinstance(expr, And) else (expr,):
        named: frozenset[int] | None = None
        if isinstance(leaf, Compare) and leaf.column == PARTITION_COLUMN and leaf.op == "=":
            named = frozenset((int(leaf.value),))
        elif isinstance(leaf, In) and leaf.column == PARTITION_COLUMN and not leaf.negated:
            named = frozenset(int(v) for v in leaf.values)
        if named is not None:
            kept = named if kept is None else kept & named
    return kept


def _retained(expr: Expr | None, earliest: dict[int, int], partitions: int) -> Expr | None:
    """``expr`` restricted to the rows retention keeps: in each partition with an
    earliest offset, ``_offset >= earliest`` (a bound tree: pushed down to the cold
    backend, which prunes the files wholly below it by partition value and offset
    bounds)."""
    if not earliest:
        return expr
    others = tuple(p for p in range(partitions) if p not in earliest)
    keep: list[Expr] = [
        And((Compare(PARTITION_COLUMN, "=", p), Compare(OFFSET_COLUMN, ">=", e)))
        for p, e in sorted(earliest.items())
    ]
    if others:
        keep.append(In(PARTITION_COLUMN, others))
    retained = keep[0] if len(keep) == 1 else Or(tuple(keep))
    return retained if expr is None else And((expr, retained))
