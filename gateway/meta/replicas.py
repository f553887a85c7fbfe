"""The live gateway replicas: each replica that serves Kafka over a shared metadata store
keeps a row (its node id and advertised address) under a lease it renews every few
seconds and deletes when it stops; a replica killed is gone once its lease ran out. The
replicas read the rows to answer Kafka clients as one cluster of brokers (docs/kafka.md).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from gateway.meta.base import MetaBase
from gateway.meta.models import ReplicaRecord, utcnow
from gateway.meta.records import Replica

__all__ = ["ReplicaOps"]


class ReplicaOps(MetaBase):
    def renew_replica(
        self, replica_id: str, node_id: int, host: str, port: int, lease_s: float
    ) -> list[Replica]:
        """Register or renew the replica ``replica_id`` (its node id and advertised
        address) for ``lease_s`` seconds from now, sweep the rows whose lease ran out,
        and return the live replicas, this one among them, by node id.

        Raises:
            sqlalchemy.exc.IntegrityError: another live replica holds ``node_id``.
        """
        now = utcnow()
        expires = now + timedelta(seconds=lease_s)
        with self._session(write=True) as session:
            session.execute(delete(ReplicaRecord).where(ReplicaRecord.expires_at <= now))
            row = session.get(ReplicaRecord, replica_id)
            if row is None:
                session.add(
                    ReplicaRecord(
                        replica_id=replica_id,
                        node_id=node_id,
                        host=host,
                        port=port,
                        started_at=now,
                        expires_at=expires,
                    )
                )
            else:
                row.node_id, row.host, row.port, row.expires_at = node_id, host, port, expires
            session.flush()
            return self._live(session, now)

    def live_replicas(self, *, at: datetime | None = None) -> list[Replica]:
        """The replicas whose lease runs at ``at`` (default: now), by node id."""
        with self._session(write=False) as session:
            return self._live(session, at or utcnow())

    def drop_replica(self, replica_id: str) -> None:
        """Remove a replica's row now (it stops); an unknown id is ignored."""
        with self._session(write=True) as session:
            session.execute(delete(ReplicaRecord).where(ReplicaRecord.replica_id == replica_id))

    @staticmethod
    def _live(session: Session, at: datetime) -> list[Replica]:
        stmt = (
            select(ReplicaRecord)
            .where(ReplicaRecord.expires_at > at)
            .order_by(ReplicaRecord.node_id)
        )
        return [
            Replica(r.replica_id, r.node_id, r.host, r.port, r.expires_at)
            for r in session.scalars(stmt)
        ]
