"""What the lake's maintenance jobs keep in the metadata store: snapshot leases (snapshots
kept from expiry for open scans and read plans) and the last run of each job on a table.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from sqlalchemy import delete, select

from gateway.meta.base import MetaBase
from gateway.meta.models import MaintenanceRun, SnapshotLease, TableRecord, utcnow
from gateway.meta.records import JobRun, Lease

__all__ = ["MaintenanceOps"]


class MaintenanceOps(MetaBase):
    # Snapshot leases ----------------------------------------------------------------------
    def add_lease(self, table_id: str, snapshot_id: int, kind: str, ttl_s: float) -> Lease:
        """Keep ``snapshot_id`` of the table from expiry for ``ttl_s`` seconds (or until
        :meth:`release_lease`). Expired leases of the table are swept on the way."""
        now = utcnow()
        lease = Lease(
            uuid.uuid4().hex, table_id, int(snapshot_id), kind, now, now + timedelta(seconds=ttl_s)
        )
        with self._session(write=True) as session:
            session.execute(
                delete(SnapshotLease).where(
                    SnapshotLease.table_id == table_id, SnapshotLease.expires_at <= now
                )
            )
            session.add(
                SnapshotLease(
                    id=lease.lease_id,
                    table_id=table_id,
                    snapshot_id=lease.snapshot_id,
                    kind=kind,
                    created_at=now,
                    expires_at=lease.expires_at,
                )
            )
        return lease

    def release_lease(self, lease_id: str) -> None:
        """End a lease now (a scan that finished); an unknown id is ignored."""
        with self._session(write=True) as session:
            session.execute(delete(SnapshotLease).where(SnapshotLease.id == lease_id))

    def leases(self, table_id: str, *, at: datetime | None = None) -> list[Lease]:
        """The table's leases still running at ``at`` (default: now), oldest first."""
        at = at or utcnow()
        stmt = (
            select(SnapshotLease)
            .where(SnapshotLease.table_id == table_id, SnapshotLease.expires_at > at)
            .order_by(SnapshotLease.created_at, SnapshotLease.id)
        )
        with self._session(write=False) as session:
            return [
                Lease(r.id, r.table_id, int(r.snapshot_id), r.kind, r.created_at, r.expires_at)
                for r in session.scalars(stmt)
            ]

    # Maintenance runs ---------------------------------------------------------------------
    def record_run(self, table_id: str, job: str, outcome: str, detail: str = "") -> None:
        """Remember the last run of ``job`` on the table (replacing the previous one)."""
        with self._session(write=True) as session:
            row = session.get(MaintenanceRun, (table_id, job))
            if row is None:
                if session.get(TableRecord, table_id) is None:
                    return  # dropped meanwhile
                session.add(
                    MaintenanceRun(
                        table_id=table_id,
                        job=job,
                        finished_at=utcnow(),
                        outcome=outcome,
                        detail=detail[:2000],
                    )
                )
            else:
                row.finished_at = utcnow()
                row.outcome = outcome
                row.detail = detail[:2000]

    def last_runs(self, table_id: str) -> dict[str, JobRun]:
        """job -> the last run of that maintenance job on the table."""
        stmt = select(MaintenanceRun).where(MaintenanceRun.table_id == table_id)
        with self._session(write=False) as session:
            return {
                r.job: JobRun(r.job, r.finished_at, r.outcome, r.detail)
                for r in session.scalars(stmt)
            }
