"""Table retention without Spark, as Kafka's ``retention.ms`` / ``retention.records``.

A table may keep its records for ``retention_ms`` milliseconds after their append and/or
its last ``retention_records`` records per partition. Per table with a retention, the job:

1. computes per partition the earliest retained offset ``E(p)``: by count
   ``HW(p) - retention_records``; by time the first offset whose append time is within
   the window (the cold rows from the current earliest offset up in offset order, then a
   binary search over the hot tier's batches); with both, the larger; never below the
   earliest offset already recorded;
2. records ``E(p)`` in the metadata store (``earliest_offset``, only ever raised): from
   then on every read path refuses or leaves out the offsets below it, on every gateway,
   while the records are still stored;
3. commits one Iceberg snapshot that drops the data files wholly below ``E(p)``,
   rewrites the one file that straddles it and raises ``tidegate.watermarks`` to at
   least ``E(p)`` (:meth:`~gateway.cold.base.ColdTable.commit_retention`); a concurrent
   tiering or compaction commit makes it retry from the new snapshot;
4. trims the hot tier below ``E(p)`` (allowed: ``T(p) >= E(p)`` now).

A crash between the steps leaves the earliest offset recorded and the records below it
still stored but unreadable; the next run removes them.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.hot import PartitionId
from gateway.lake.components import Components
from gateway.lake.passes import RunReport, commit_retry, each_table, record_failure
from gateway.wire.errors import CommitConflict
from gateway.wire.schema import OFFSET_COLUMN, TIMESTAMP_COLUMN

if TYPE_CHECKING:
    from gateway.cold.base import ColdSnapshot, ColdTable
    from gateway.meta import TableDef
    from gateway.wire.retry import Retry

__all__ = ["RetentionResult", "earliest_offsets", "retain_all", "retain_table"]

log = logging.getLogger("tidegate.retention")


@dataclass(frozen=True, slots=True)
class RetentionResult:
    table: str
    tenant: str
    #: Partition -> the earliest offset recorded by this run (only partitions with one).
    earliest: dict[int, int] = field(default_factory=dict)
    #: Offsets this run made unreadable (the sum of the earliest offsets' rises).
    records: int = 0
    #: Rows removed from the Iceberg table, and hot-tier low marks after trimming.
    tiered_rows: int = 0
    trimmed: dict[int, int] = field(default_factory=dict)
    attempts: int = 0
    conflicts: int = 0
    snapshot_id: int | None = None


def _cold_first_at(
    cold: ColdTable, snap: ColdSnapshot, partition: int, start: int, cutoff_us: int
) -> int | None:
    """The first offset at or above ``start`` and below ``T(p)`` of ``snap`` whose append
    time is at or after ``cutoff_us``; None when every such row is older. Reads the rows
    in offset order and stops at the first recent one: what it reads is what retention
    is about to remove."""
    import pyarrow.compute as pc

    tiered = snap.watermark(partition)
    if snap.snapshot_id is None or start >= tiered:
        return None
    for batch in cold.read_range(snap, partition, start, tiered):
        ts = batch.column(TIMESTAMP_COLUMN).cast("int64")
        recent = pc.greater_equal(ts, cutoff_us)
        if pc.any(recent).as_py():
            idx = pc.index(recent, True).as_py()
            return int(batch.column(OFFSET_COLUMN)[idx].as_py())
    return None


def earliest_offsets(
    c: Components,
    d: TableDef,
    cold: ColdTable,
    snap: ColdSnapshot,
    *,
    now_ms: int | None = None,
) -> dict[int, int]:
    """Per partition, the earliest offset ``d``'s retention keeps (never below the one
    recorded); partitions where it is 0 are left out."""
    recorded = {p.partition: p.earliest_offset for p in c.meta.partitions(d.table_id)}
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    out: dict[int, int] = {}
    for p in range(d.partitions):
        part = PartitionId(d.tenant, d.table_id, p)
        o = c.hot.offsets(part)
        tiered = snap.watermark(p)
        high = max(o.high, tiered)
        current = recorded.get(p, 0)
        keep = [current]
        if d.retention_records:
            keep.append(high - d.retention_records)
        if d.retention_ms:
            cutoff_us = (now_ms - d.retention_ms) * 1000
            start = max(current, 0 if tiered > 0 else o.low)
            first = _cold_first_at(cold, snap, p, start, cutoff_us)
            if first is None:
                first = c.hot.offset_for_time(part, cutoff_us, max(start, tiered))
            keep.append(first)
        e = min(max(keep), high)
        if e > 0:
            out[p] = e
    return out


def _applied_first(c: Components, d: TableDef, earliest: dict[int, int]) -> dict[int, int]:
    """A primary-key table's earliest offsets kept at or below its state table's
    ``A(p)``: retention applies to the changelog only, and never removes a change before
    the state table holds it (docs/decisions/primary-keys.md)."""
    applied = c.cold.state_table(d).snapshot()
    out = {p: min(e, applied.applied_through(p)) for p, e in earliest.items()}
    return {p: e for p, e in out.items() if e > 0}


def _utc(when: dt.datetime) -> dt.datetime:
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)


def retain_table(
    c: Components, d: TableDef, *, retry: Retry | None = None, now_ms: int | None = None
) -> RetentionResult:
    """Apply ``d``'s retention once (see the module's steps).

    Raises:
        CommitConflict: still conflicting after ``retry.attempts`` tries (the earliest
            offsets stay recorded: the records below them stay unreadable and the next
            run removes them).
    """
    if not d.retention_ms and not d.retention_records:
        return RetentionResult(d.qualified_name, d.tenant)
    settle = c.settings.retention.settle_s
    if d.retention_set_at is not None and settle > 0:
        age = (dt.datetime.now(dt.UTC) - _utc(d.retention_set_at)).total_seconds()
        if age < settle:
            # A gateway may still hold a view of the table without its retention (and
            # would not look the earliest offset up): the next run applies it.
            return RetentionResult(d.qualified_name, d.tenant)
    retry = retry or commit_retry(c)
    cold = c.cold.table(d)
    before = {p.partition: p.earliest_offset for p in c.meta.partitions(d.table_id)}
    started = time.monotonic()
    conflicts = attempt = 0
    while True:
        attempt += 1
        snap = cold.snapshot()
        earliest = earliest_offsets(c, d, cold, snap, now_ms=now_ms)
        if d.primary_key is not None:
            earliest = _applied_first(c, d, earliest)
        if not earliest:
            return RetentionResult(d.qualified_name, d.tenant, attempts=attempt)
        # Recorded first: enforced by every read path before anything is removed.
        c.meta.raise_earliest_offsets(d.table_id, earliest)
        try:
            after, removed = cold.commit_retention(earliest)
        except CommitConflict as err:
            conflicts += 1
            delay = retry.next_delay(err, conflicts, started)
            if delay is None:
                raise
            log.info("%s: retention commit conflict, again (attempt %d)", d.qualified_name, attempt)
            time.sleep(delay)
            continue
        break
    c.meta.update_tiered_watermarks(d.table_id, dict(after.watermarks))
    trimmed = {}
    for p, e in earliest.items():
        part = PartitionId(d.tenant, d.table_id, p)
        if c.hot.needs_trim(part, e):
            trimmed[p] = c.hot.trim(part, e)
    result = RetentionResult(
        table=d.qualified_name,
        tenant=d.tenant,
        earliest=earliest,
        records=sum(max(0, e - before.get(p, 0)) for p, e in earliest.items()),
        tiered_rows=removed,
        trimmed=trimmed,
        attempts=attempt,
        conflicts=conflicts,
        snapshot_id=after.snapshot_id,
    )
    c.meta.record_run(
        d.table_id,
        "retention",
        "ok",
        f"removed {result.records} records ({removed} tiered); earliest offsets "
        + ", ".join(f"{p}:{e}" for p, e in sorted(earliest.items())),
    )
    if result.records:
        log.info("%s: retention removed %d records", d.qualified_name, result.records)
    return result


def retain_all(
    c: Components,
    *,
    tables: Iterable[TableDef] | None = None,
    retry: Retry | None = None,
    max_parallel_tenants: int = 4,
    on_table: Callable[[TableDef, RetentionResult | BaseException], None] | None = None,
) -> RunReport[RetentionResult]:
    """Apply every table's retention (tables without one are skipped), tenants side by
    side as the other lake jobs do."""
    return each_table(
        c,
        lambda d: retain_table(c, d, retry=retry),
        job="retention",
        tables=tables,
        max_parallel_tenants=max_parallel_tenants,
        on_table=on_table or record_failure(c, "retention"),
    )
