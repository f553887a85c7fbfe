"""Lake work driven by change (issue 30): which tables the lake jobs must visit.

Gateways mark the partitions they acknowledged appends to (``tier`` rows, with the time
of the oldest record not yet tiered and the highest offset acknowledged); a tiering
commit marks the table-level work it asks for later (``trim``, ``compact``, ``expire``,
``orphans``). A job reads the rows of its kind that are due (one indexed query, whatever
the number of tables) and deletes them once done: an idle table costs no query of its
own, no hot-tier call and no Iceberg metadata read.

Every mark is an upsert that only widens the work (the oldest ``since``, the earliest
``due_at``, the newest ``marked_at``, the highest ``high``), and every clear is
conditional (a ``tier`` row goes only when ``T(p)`` reached its ``high``; a table-level
row only when no mark came after the work it asked for), so a mark racing a job is never
lost.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Table, bindparam, case, delete, func, select, update
from sqlalchemy.dialects import postgresql, sqlite

from gateway.meta.base import MetaBase
from gateway.meta.models import LAKE_JOBS, LakeWork, PartitionRecord, TableRecord, utcnow
from gateway.meta.records import TableDef

__all__ = ["TABLE_LEVEL", "LakeWorkOps", "Mark"]

#: The ``partition`` of a table-level row (and of a ``tier`` row that asks to look at
#: every partition of the table, as after an upgrade or a restart).
TABLE_LEVEL = -1


@dataclass(frozen=True, slots=True)
class Mark:
    """One piece of lake work to record: ``job`` on ``table_id`` (``partition``, or
    :data:`TABLE_LEVEL`), due at ``due_at``; ``since`` the time of the oldest change it
    covers, ``high`` (``tier``) the highest offset + 1 acknowledged."""

    table_id: str
    partition: int
    job: str
    since: datetime
    due_at: datetime
    high: int = 0


def _table() -> Table:
    table = LakeWork.__table__
    assert isinstance(table, Table)
    return table


class LakeWorkOps(MetaBase):
    def mark_work(self, marks: Iterable[Mark]) -> None:
        """Record lake work (upserts that only widen it; see the module docstring).
        Marks of tables dropped meanwhile are ignored."""
        rows = sorted(
            (
                {
                    "table_id": m.table_id,
                    "partition": m.partition,
                    "job": m.job,
                    "since": m.since,
                    "marked_at": utcnow(),
                    "due_at": m.due_at,
                    "high": m.high,
                }
                for m in marks
            ),
            key=lambda r: (r["table_id"], r["partition"], r["job"]),  # one lock order
        )
        if not rows:
            return
        for row in rows:
            if row["job"] not in LAKE_JOBS:
                raise ValueError(f"unknown lake job {row['job']!r}")
        table = _table()
        with self._session(write=True) as session:
            stmt = (
                postgresql.insert(table)
                if session.get_bind().dialect.name == "postgresql"
                else sqlite.insert(table)
            )
            excluded = stmt.excluded
            stmt = stmt.on_conflict_do_update(
                index_elements=[table.c.table_id, table.c.partition, table.c.job],
                set_={
                    "since": case(
                        (table.c.since <= excluded.since, table.c.since), else_=excluded.since
                    ),
                    "due_at": case(
                        (table.c.due_at <= excluded.due_at, table.c.due_at),
                        else_=excluded.due_at,
                    ),
                    "marked_at": case(
                        (table.c.marked_at >= excluded.marked_at, table.c.marked_at),
                        else_=excluded.marked_at,
                    ),
                    "high": case(
                        (table.c.high >= excluded.high, table.c.high), else_=excluded.high
                    ),
                },
            )
            known = set(
                session.scalars(
                    select(TableRecord.id).where(
                        TableRecord.id.in_(sorted({r["table_id"] for r in rows}))
                    )
                )
            )
            live = [r for r in rows if r["table_id"] in known]
            if live:
                session.execute(stmt, live)

    def record_appends(self, marks: Mapping[str, Mapping[int, tuple[int, datetime]]]) -> None:
        """What a gateway acknowledged since it last said: table id -> partition ->
        (highest offset + 1, time of the first of those appends). Raises the cached high
        watermarks and marks the partitions for tiering, in one transaction."""
        if not marks:
            return
        self.mark_work(
            Mark(table_id, p, "tier", since=at, due_at=at, high=end)
            for table_id, parts in marks.items()
            for p, (end, at) in parts.items()
        )
        parts_table = PartitionRecord.__table__
        assert isinstance(parts_table, Table)
        stmt = (
            update(parts_table)
            .where(
                parts_table.c.table_id == bindparam("b_table_id"),
                parts_table.c.partition == bindparam("b_partition"),
                parts_table.c.high_watermark < bindparam("b_value"),
            )
            .values(high_watermark=bindparam("b_value"))
        )
        params = [
            {"b_table_id": table_id, "b_partition": p, "b_value": end}
            for table_id, parts in sorted(marks.items())
            for p, (end, _) in sorted(parts.items())  # one lock order: no deadlocks
        ]
        with self._session(write=True) as session:
            session.connection().execute(stmt, params)

    def mark_all_tables(self, job: str = "tier") -> int:
        """Ask ``job`` to visit every table once (a restart's sweep: appends acknowledged
        in the last moments before a crash may not have been marked). One statement;
        returns the tables marked."""
        now = utcnow()
        table = _table()
        with self._session(write=True) as session:
            have = select(table.c.table_id).where(
                table.c.partition == TABLE_LEVEL, table.c.job == job
            )
            ids = list(session.scalars(select(TableRecord.id).where(TableRecord.id.not_in(have))))
            if ids:
                session.execute(
                    table.insert(),
                    [
                        {
                            "table_id": i,
                            "partition": TABLE_LEVEL,
                            "job": job,
                            "since": now,
                            "marked_at": now,
                            "due_at": now,
                            "high": 0,
                        }
                        for i in ids
                    ],
                )
            session.execute(
                update(table)
                .where(table.c.partition == TABLE_LEVEL, table.c.job == job, table.c.due_at > now)
                .values(due_at=now)
            )
            return len(ids)

    def has_tables(self) -> bool:
        """Whether the store holds any table (one row looked at)."""
        with self._session(write=False) as session:
            return session.execute(select(TableRecord.id).limit(1)).first() is not None

    def due_tables(self, jobs: Sequence[str], now: datetime | None = None) -> list[TableDef]:
        """The tables with work of one of ``jobs`` due by ``now``, by tenant, namespace and
        name (one indexed query; tables with nothing due cost nothing)."""
        from gateway.meta.tables import _table_def

        now = now or utcnow()
        table = _table()
        due = (
            select(table.c.table_id)
            .where(table.c.job.in_(list(jobs)), table.c.due_at <= now)
            .distinct()
        )
        stmt = (
            select(TableRecord)
            .where(TableRecord.id.in_(due))
            .order_by(TableRecord.tenant_id, TableRecord.namespace, TableRecord.name)
        )
        with self._session(write=False) as session:
            return [_table_def(r) for r in session.scalars(stmt)]

    def tables_with_retention(self) -> list[TableDef]:
        """The tables that have a retention (what the retention job visits)."""
        from gateway.meta.tables import _table_def

        stmt = (
            select(TableRecord)
            .where(
                (TableRecord.retention_ms.is_not(None))
                | (TableRecord.retention_records.is_not(None))
            )
            .order_by(TableRecord.tenant_id, TableRecord.namespace, TableRecord.name)
        )
        with self._session(write=False) as session:
            return [_table_def(r) for r in session.scalars(stmt)]

    def finish_tiering(self, table_id: str, tiered: Mapping[int, int], started: datetime) -> None:
        """A tiering run of the table that started at ``started`` brought the partitions
        to ``tiered`` (partition -> ``T(p)``): delete the ``tier`` rows it covered (a
        partition's when ``T(p)`` reached its ``high``; the table-level one when it was
        marked before the run started)."""
        table = _table()
        with self._session(write=True) as session:
            for p, t in sorted(tiered.items()):
                session.execute(
                    delete(table).where(
                        table.c.table_id == table_id,
                        table.c.partition == p,
                        table.c.job == "tier",
                        table.c.high <= t,
                    )
                )
            session.execute(
                delete(table).where(
                    table.c.table_id == table_id,
                    table.c.partition == TABLE_LEVEL,
                    table.c.job == "tier",
                    table.c.marked_at <= started,
                )
            )

    def finish_work(self, table_id: str, job: str, done_before: datetime, delay_s: float) -> None:
        """``job`` was done on the table for every change marked up to ``done_before``:
        delete its row, unless a later mark asks for more (then it comes due ``delay_s``
        after that mark)."""
        table = _table()
        with self._session(write=True) as session:
            session.execute(
                delete(table).where(
                    table.c.table_id == table_id,
                    table.c.job == job,
                    table.c.partition == TABLE_LEVEL,
                    table.c.marked_at <= done_before,
                )
            )
            row = session.execute(
                select(table.c.marked_at).where(
                    table.c.table_id == table_id,
                    table.c.job == job,
                    table.c.partition == TABLE_LEVEL,
                )
            ).first()
            if row is not None:
                session.execute(
                    update(table)
                    .where(
                        table.c.table_id == table_id,
                        table.c.job == job,
                        table.c.partition == TABLE_LEVEL,
                    )
                    .values(due_at=row[0] + timedelta(seconds=delay_s))
                )

    def marked_partitions(self) -> list[tuple[str, str, int, int]]:
        """``(tenant, table id, partition, cached T(p))`` of every partition marked for
        tiering: what the tiering lag is measured over (the rest is tiered)."""
        table = _table()
        stmt = (
            select(
                TableRecord.tenant_id,
                table.c.table_id,
                table.c.partition,
                PartitionRecord.tiered_watermark,
            )
            .select_from(table)
            .join(TableRecord, TableRecord.id == table.c.table_id)
            .join(
                PartitionRecord,
                (PartitionRecord.table_id == table.c.table_id)
                & (PartitionRecord.partition == table.c.partition),
            )
            .where(table.c.job == "tier")
            .order_by(table.c.table_id, table.c.partition)
        )
        with self._session(write=False) as session:
            return [(t, i, int(p), int(w)) for t, i, p, w in session.execute(stmt)]

    def untiered(self) -> tuple[int, datetime | None]:
        """Records acknowledged and not yet tiered over every table, as the marks say
        (``high`` minus the cached ``T(p)``), and the time of the oldest: what the
        tiering lag metrics show, from the marked partitions only."""
        table = _table()
        stmt = (
            select(
                func.coalesce(
                    func.sum(
                        case(
                            (
                                table.c.high > PartitionRecord.tiered_watermark,
                                table.c.high - PartitionRecord.tiered_watermark,
                            ),
                            else_=0,
                        )
                    ),
                    0,
                ),
                func.min(table.c.since),
            )
            .select_from(table)
            .join(
                PartitionRecord,
                (PartitionRecord.table_id == table.c.table_id)
                & (PartitionRecord.partition == table.c.partition),
            )
            .where(table.c.job == "tier")
        )
        with self._session(write=False) as session:
            records, oldest = session.execute(stmt).one()
        return int(records or 0), oldest

    def pending_work(self) -> dict[str, int]:
        """Rows of lake work by job (what is waiting, due or not)."""
        table = _table()
        stmt = select(table.c.job, func.count()).group_by(table.c.job)
        with self._session(write=False) as session:
            return {job: int(n) for job, n in session.execute(stmt)}
