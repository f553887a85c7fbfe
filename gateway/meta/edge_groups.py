"""Groups an edge's own protocol coordinates (Kafka's consumer groups, whose membership
lives in the replica that coordinates each group): the coordinating replica publishes its
groups here when they change and renews them under a lease; any replica reads the live
ones, so ``tidegate group describe`` and the console show their members wherever they ask.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import timedelta

from sqlalchemy import delete, or_, select

from gateway.meta.base import MetaBase
from gateway.meta.models import EdgeGroupRecord, utcnow
from gateway.meta.records import EdgeGroup, EdgeMember

__all__ = ["EdgeGroupOps"]


class EdgeGroupOps(MetaBase):
    def publish_edge_groups(
        self, coordinator: str, groups: Sequence[EdgeGroup], lease_s: float
    ) -> None:
        """Replace every group ``coordinator`` published with ``groups``, live for
        ``lease_s`` seconds from now, and sweep the rows whose lease ran out (an empty
        ``groups``: the replica coordinates none, or stops)."""
        now = utcnow()
        expires = now + timedelta(seconds=lease_s)
        with self._session(write=True) as session:
            session.execute(
                delete(EdgeGroupRecord).where(
                    or_(
                        EdgeGroupRecord.coordinator == coordinator,
                        EdgeGroupRecord.expires_at <= now,
                    )
                )
            )
            # Another replica's row for the same group and table: the group moved here
            # (its old coordinator died before its lease ran out): this one is current.
            for g in groups:
                session.execute(
                    delete(EdgeGroupRecord).where(
                        EdgeGroupRecord.tenant_id == g.tenant,
                        EdgeGroupRecord.group_id == g.group,
                        EdgeGroupRecord.namespace == g.namespace,
                        EdgeGroupRecord.name == g.name,
                    )
                )
            session.add_all(
                EdgeGroupRecord(
                    tenant_id=g.tenant,
                    group_id=g.group,
                    namespace=g.namespace,
                    name=g.name,
                    coordinator=coordinator,
                    protocol=g.protocol,
                    state=g.state,
                    generation=g.generation,
                    members_json=json.dumps([m.to_json() for m in g.members]),
                    expires_at=expires,
                )
                for g in groups
            )

    def edge_groups(
        self,
        tenant: str,
        group: str | None = None,
        namespace: str | None = None,
        name: str | None = None,
    ) -> list[EdgeGroup]:
        """The live groups of ``tenant`` (of one group and table when given)."""
        stmt = select(EdgeGroupRecord).where(
            EdgeGroupRecord.tenant_id == tenant, EdgeGroupRecord.expires_at > utcnow()
        )
        if group is not None:
            stmt = stmt.where(EdgeGroupRecord.group_id == group)
        if namespace is not None and name is not None:
            stmt = stmt.where(EdgeGroupRecord.namespace == namespace, EdgeGroupRecord.name == name)
        with self._session(write=False) as session:
            rows = list(session.scalars(stmt.order_by(EdgeGroupRecord.group_id)))
            return [
                EdgeGroup(
                    r.tenant_id,
                    r.group_id,
                    r.namespace,
                    r.name,
                    r.protocol,
                    r.state,
                    int(r.generation),
                    tuple(EdgeMember.from_json(m) for m in json.loads(r.members_json)),
                )
                for r in rows
            ]
