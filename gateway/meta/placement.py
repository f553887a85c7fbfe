"""Placement of partitions on hot-tier shards in the metadata store: the policy that places
new partitions (:func:`choose_shards`), each partition's chain of segments and the moves
between shards (compare-and-set on a placement epoch), and the shards reserved for a tenant.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Table, delete, exists, func, literal, select, update
from sqlalchemy.orm import Session

from gateway.meta.base import MetaBase
from gateway.meta.models import PartitionRecord, SegmentRecord, ShardPin, TableRecord, Tenant
from gateway.meta.records import Placement, SegmentRow
from gateway.wire.errors import InvalidRequest, TenantNotFound

__all__ = ["PlacementOps", "choose_shards", "shard_loads"]


def choose_shards(
    count: int,
    tenant: str,
    shards: Sequence[str],
    pins: Mapping[str, str],
    load: Mapping[str, int],
    tenant_load: Mapping[str, int],
) -> list[str]:
    """The placement policy of new partitions: a tenant with reserved shards goes only
    there; others go to shards nobody reserved. Among those, the shard holding the fewest
    of this tenant's partitions wins (spreading a tenant), then the least loaded overall.

    Raises:
        InvalidRequest: no shard may take the tenant's partitions.
    """
    own = [s for s in shards if pins.get(s) == tenant]
    candidates = own or [s for s in shards if s not in pins]
    if not candidates:
        raise InvalidRequest(
            f"every hot-tier shard is reserved for another tenant than {tenant!r}",
            tenant=tenant,
        )
    total = {s: load.get(s, 0) for s in candidates}
    mine = {s: tenant_load.get(s, 0) for s in candidates}
    out = []
    for _ in range(count):
        best = min(candidates, key=lambda s: (mine[s], total[s], s))
        out.append(best)
        mine[best] += 1
        total[best] += 1
    return out


def shard_loads(
    session: Session, tenant: str
) -> tuple[dict[str, str], dict[str, int], dict[str, int]]:
    """Pins, partitions per active shard, and the tenant's partitions per shard."""
    pins = {p.shard: p.tenant_id for p in session.scalars(select(ShardPin))}
    rows = session.execute(
        select(PartitionRecord.shard, TableRecord.tenant_id, func.count())
        .join(TableRecord, TableRecord.id == PartitionRecord.table_id)
        .group_by(PartitionRecord.shard, TableRecord.tenant_id)
    )
    load: dict[str, int] = {}
    mine: dict[str, int] = {}
    for shard, owner, n in rows:
        load[shard] = load.get(shard, 0) + n
        if owner == tenant:
            mine[shard] = mine.get(shard, 0) + n
    return pins, load, mine


def _segment_rows(rec: PartitionRecord, rows: Sequence[SegmentRecord]) -> list[SegmentRow]:
    """A partition's segments oldest first from its segment rows: with none, the one
    implicit segment ``0`` on its shard from offset 0."""
    if not rows:
        return [(0, rec.shard, 0, None)]
    return [(r.seq, r.shard, r.start_offset, r.end_offset) for r in rows]


class PlacementOps(MetaBase):
    def chain(self, table_id: str, partition: int) -> tuple[int, list[SegmentRow], str | None]:
        """A partition's placement: ``(epoch, segments, move_target)``, segments oldest
        first. A partition with no segment rows has one implicit segment ``0`` on its shard
        from offset 0. Raises KeyError for an unknown (or dropped) partition."""
        with self._session(write=False) as session:
            rec = session.get(PartitionRecord, (table_id, partition))
            if rec is None:
                raise KeyError(f"no partition {partition} of table {table_id}")
            return rec.epoch, self._segments(session, rec), rec.move_target

    def chains(self, table_id: str) -> dict[int, tuple[int, list[SegmentRow], str | None]]:
        """Every partition's placement of a table, as :meth:`chain` gives one, in two
        queries whatever the partition count (a new table's partitions, opened at once)."""
        with self._session(write=False) as session:
            recs = session.scalars(
                select(PartitionRecord).where(PartitionRecord.table_id == table_id)
            ).all()
            rows = session.scalars(
                select(SegmentRecord)
                .where(SegmentRecord.table_id == table_id)
                .order_by(SegmentRecord.partition, SegmentRecord.seq)
            ).all()
        by_partition: dict[int, list[SegmentRecord]] = {}
        for r in rows:
            by_partition.setdefault(r.partition, []).append(r)
        return {
            rec.partition: (
                rec.epoch,
                _segment_rows(rec, by_partition.get(rec.partition, [])),
                rec.move_target,
            )
            for rec in recs
        }

    @staticmethod
    def _segments(session: Session, rec: PartitionRecord) -> list[SegmentRow]:
        rows = session.scalars(
            select(SegmentRecord)
            .where(SegmentRecord.table_id == rec.table_id, SegmentRecord.partition == rec.partition)
            .order_by(SegmentRecord.seq)
        ).all()
        return _segment_rows(rec, rows)

    def replace_chain(
        self,
        table_id: str,
        partition: int,
        expected_epoch: int,
        segments: Sequence[SegmentRow],
        finish_move: bool,
    ) -> bool:
        """Compare-and-set a partition's chain: applied (and the epoch raised by one) only
        when the epoch is still ``expected_epoch``; ``finish_move`` clears the move target.
        Returns whether it was applied."""
        if not segments or segments[-1][3] is not None:
            raise ValueError("a chain ends with one active segment")
        table = PartitionRecord.__table__
        assert isinstance(table, Table)
        values: dict[str, Any] = {"epoch": expected_epoch + 1, "shard": segments[-1][1]}
        if finish_move:
            values["move_target"] = None
        with self._session(write=True) as session:
            done = session.execute(
                update(table)
                .where(
                    table.c.table_id == table_id,
                    table.c.partition == partition,
                    table.c.epoch == expected_epoch,
                )
                .values(values)
            )
            if done.rowcount != 1:  # type: ignore[attr-defined]
                return False
            session.execute(
                delete(SegmentRecord).where(
                    SegmentRecord.table_id == table_id, SegmentRecord.partition == partition
                )
            )
            session.add_all(
                SegmentRecord(
                    table_id=table_id,
                    partition=partition,
                    seq=seq,
                    shard=shard,
                    start_offset=start,
                    end_offset=end,
                )
                for seq, shard, start, end in segments
            )
            return True

    def begin_move(self, table_id: str, partition: int, target: str) -> str | None:
        """Record the intent to move a partition to ``target`` unless a move is already
        under way; returns the move under way afterwards (``target`` or the older one)."""
        table = PartitionRecord.__table__
        assert isinstance(table, Table)
        with self._session(write=True) as session:
            session.execute(
                update(table)
                .where(
                    table.c.table_id == table_id,
                    table.c.partition == partition,
                    table.c.move_target.is_(None),
                )
                .values(move_target=target)
            )
            rec = session.get(PartitionRecord, (table_id, partition))
            if rec is None:
                raise KeyError(f"no partition {partition} of table {table_id}")
            return rec.move_target

    def shard_counts(self) -> dict[str, tuple[int, int]]:
        """``shard -> (partitions, segments)``: partitions whose active segment is on the
        shard, and segments (active or sealed) it holds. Aggregates: a few queries
        whatever the number of partitions (a /metrics scrape asks)."""
        implicit = ~exists().where(
            SegmentRecord.table_id == PartitionRecord.table_id,
            SegmentRecord.partition == PartitionRecord.partition,
        )
        by_shard = PartitionRecord.shard
        counts: dict[str, list[int]] = {}
        with self._session(write=False) as session:
            for name, n in session.execute(select(by_shard, func.count()).group_by(by_shard)):
                counts.setdefault(name, [0, 0])[0] += n
            for name, n in session.execute(
                select(by_shard, func.count()).where(implicit).group_by(by_shard)
            ):
                counts.setdefault(name, [0, 0])[1] += n
            for name, n in session.execute(
                select(SegmentRecord.shard, func.count()).group_by(SegmentRecord.shard)
            ):
                counts.setdefault(name, [0, 0])[1] += n
        return {name: (a, b) for name, (a, b) in counts.items()}

    def all_segments(self) -> list[tuple[str, str, int, int, str]]:
        """``(tenant, table id, partition, seq, shard)`` of every segment, in two queries
        (a partition without segment rows has its implicit segment 0 on its shard)."""
        implicit = ~exists().where(
            SegmentRecord.table_id == PartitionRecord.table_id,
            SegmentRecord.partition == PartitionRecord.partition,
        )
        with self._session(write=False) as session:
            rows = list(
                session.execute(
                    select(
                        TableRecord.tenant_id,
                        SegmentRecord.table_id,
                        SegmentRecord.partition,
                        SegmentRecord.seq,
                        SegmentRecord.shard,
                    ).join(TableRecord, TableRecord.id == SegmentRecord.table_id)
                )
            )
            rows += session.execute(
                select(
                    TableRecord.tenant_id,
                    PartitionRecord.table_id,
                    PartitionRecord.partition,
                    literal(0),
                    PartitionRecord.shard,
                )
                .join(TableRecord, TableRecord.id == PartitionRecord.table_id)
                .where(implicit)
            ).all()
        return [(t, table_id, p, seq, shard) for t, table_id, p, seq, shard in rows]

    def placements(
        self, *, tenant: str | None = None, shard: str | None = None, moving: bool = False
    ) -> list[Placement]:
        """Every partition's placement (of one tenant, with an active segment or any segment
        on one shard, or with a move under way), by tenant, table and partition."""
        stmt = select(PartitionRecord, TableRecord).join(
            TableRecord, TableRecord.id == PartitionRecord.table_id
        )
        if tenant is not None:
            stmt = stmt.where(TableRecord.tenant_id == tenant)
        if moving:
            stmt = stmt.where(PartitionRecord.move_target.is_not(None))
        stmt = stmt.order_by(
            TableRecord.tenant_id,
            TableRecord.namespace,
            TableRecord.name,
            PartitionRecord.partition,
        )
        out = []
        with self._session(write=False) as session:
            for rec, t in session.execute(stmt):
                segments = tuple(self._segments(session, rec))
                if shard is not None and all(s[1] != shard for s in segments):
                    continue
                out.append(
                    Placement(
                        t.tenant_id,
                        t.id,
                        t.namespace,
                        t.name,
                        rec.partition,
                        rec.epoch,
                        segments,
                        rec.move_target,
                    )
                )
        return out

    def pin_shards(self, tenant: str, shards: Sequence[str]) -> None:
        """Reserve ``shards`` for ``tenant``: new partitions of the tenant go only there,
        nobody else's do, and rebalancing moves nobody else's partitions onto them.

        Raises:
            TenantNotFound: no such tenant.
            InvalidRequest: a shard is already reserved for another tenant.
        """
        with self._session(write=True) as session:
            if session.get(Tenant, tenant) is None:
                raise TenantNotFound(f"tenant {tenant!r} not found", tenant=tenant)
            for name in shards:
                pin = session.get(ShardPin, name)
                if pin is not None and pin.tenant_id != tenant:
                    raise InvalidRequest(
                        f"shard {name!r} is reserved for another tenant", shard=name
                    )
                if pin is None:
                    session.add(ShardPin(shard=name, tenant_id=tenant))

    def unpin_shards(self, shards: Sequence[str]) -> None:
        """Release reserved shards (their partitions stay where they are)."""
        with self._session(write=True) as session:
            session.execute(delete(ShardPin).where(ShardPin.shard.in_(list(shards))))

    def shard_pins(self) -> dict[str, str]:
        """Reserved shards: shard -> tenant."""
        with self._session(write=False) as session:
            return {p.shard: p.tenant_id for p in session.scalars(select(ShardPin))}
