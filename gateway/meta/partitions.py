"""Per-partition state in the metadata store: the partitions of a table, their earliest
readable offsets and the cached high and tiered watermarks (only ever raised). What
consumer groups commit is in :mod:`gateway.meta.groups`.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import Table, bindparam, func, select, update

from gateway.meta.base import MetaBase
from gateway.meta.models import LakeWork, MaintenanceRun, PartitionRecord, TableRecord
from gateway.meta.records import PartitionState, StorageMark

__all__ = ["PartitionOps"]


class PartitionOps(MetaBase):
    # Partitions -------------------------------------------------------------------------
    def partitions(self, table_id: str) -> list[PartitionState]:
        """The table's partitions in order; empty for an unknown (or dropped) table."""
        stmt = (
            select(PartitionRecord)
            .where(PartitionRecord.table_id == table_id)
            .order_by(PartitionRecord.partition)
        )
        with self._session(write=False) as session:
            return [
                PartitionState(
                    partition=r.partition,
                    high_watermark=r.high_watermark,
                    tiered_watermark=r.tiered_watermark,
                    shard=r.shard,
                    epoch=r.epoch,
                    earliest_offset=r.earliest_offset or 0,
                )
                for r in session.scalars(stmt)
            ]

    def storage_marks(self, tenant: str) -> dict[str, StorageMark]:
        """Table id -> its :class:`StorageMark`, for every table of the tenant (three
        indexed queries, whatever the number of tables): what a storage sample of a
        table is reused against while the table is idle."""
        parts = (
            select(
                PartitionRecord.table_id,
                func.count(),
                func.sum(PartitionRecord.high_watermark),
                func.sum(PartitionRecord.tiered_watermark),
                func.sum(PartitionRecord.earliest_offset),
            )
            .join(TableRecord, TableRecord.id == PartitionRecord.table_id)
            .where(TableRecord.tenant_id == tenant)
            .group_by(PartitionRecord.table_id)
        )
        work = (
            select(LakeWork.table_id, func.count(), func.max(LakeWork.marked_at))
            .join(TableRecord, TableRecord.id == LakeWork.table_id)
            .where(TableRecord.tenant_id == tenant)
            .group_by(LakeWork.table_id)
        )
        runs = (
            select(MaintenanceRun.table_id, func.max(MaintenanceRun.finished_at))
            .join(TableRecord, TableRecord.id == MaintenanceRun.table_id)
            .where(TableRecord.tenant_id == tenant)
            .group_by(MaintenanceRun.table_id)
        )
        with self._session(write=False) as session:
            pending = {t: (int(n), str(latest)) for t, n, latest in session.execute(work)}
            last_runs = {t: str(latest) for t, latest in session.execute(runs)}
            return {
                t: StorageMark(
                    int(n),
                    int(high or 0),
                    int(tiered or 0),
                    int(early or 0),
                    pending.get(t),
                    last_runs.get(t),
                )
                for t, n, high, tiered, early in session.execute(parts)
            }

    def earliest_offset(self, table_id: str, partition: int) -> int:
        """The partition's earliest readable offset (0 when retention never removed
        anything, or for an unknown partition): one primary-key lookup, made by every
        stream read so that a new earliest offset holds on every gateway at once."""
        stmt = select(PartitionRecord.earliest_offset).where(
            PartitionRecord.table_id == table_id, PartitionRecord.partition == partition
        )
        with self._session(write=False) as session:
            return int(session.execute(stmt).scalar() or 0)

    def raise_earliest_offsets(self, table_id: str, offsets: Mapping[int, int]) -> None:
        """Raise the partitions' earliest offsets (retention); a smaller value than the
        stored one leaves it unchanged, so the earliest offset never goes backwards."""
        self._raise_cached(table_id, "earliest_offset", offsets)

    def update_high_watermarks(self, table_id: str, watermarks: Mapping[int, int]) -> None:
        """Raise the cached high watermarks to the given values.

        A cached value is only ever raised: a smaller value (a stale observation, racing
        with a newer one) leaves it unchanged. Unknown partitions are ignored.
        """
        self._raise_cached(table_id, "high_watermark", watermarks)

    def update_tiered_watermarks(self, table_id: str, watermarks: Mapping[int, int]) -> None:
        """Raise the cached tiered watermarks (a cache of the Iceberg snapshot summary,
        which wins). Like :meth:`update_high_watermarks`, a value is only ever raised."""
        self._raise_cached(table_id, "tiered_watermark", watermarks)

    def _raise_cached(self, table_id: str, column: str, watermarks: Mapping[int, int]) -> None:
        """Raise a cached per-partition watermark column; never lower it (a smaller value
        is a stale observation racing a newer one). Unknown partitions are ignored."""
        if not watermarks:
            return
        table = PartitionRecord.__table__
        assert isinstance(table, Table)
        col = table.c[column]
        stmt = (
            update(table)
            .where(
                table.c.table_id == bindparam("b_table_id"),
                table.c.partition == bindparam("b_partition"),
                col < bindparam("b_value"),
            )
            .values({column: bindparam("b_value")})
        )
        params = [
            {"b_table_id": table_id, "b_partition": p, "b_value": v}
            for p, v in sorted(watermarks.items())  # one lock order: no deadlocks
        ]
        with self._session(write=True) as session:
            session.connection().execute(stmt, params)
