"""The live gateway replicas of a shared metadata store, as the Kafka edge registers and
reads them (:mod:`gateway.meta.replicas`): blocking store calls on the core's I/O pool."""

from __future__ import annotations

from gateway.core.base import CoreBase
from gateway.meta import Replica

__all__ = ["Replica", "ReplicaOps"]


class ReplicaOps(CoreBase):
    async def renew_replica(
        self, replica_id: str, node_id: int, host: str, port: int, lease_s: float
    ) -> list[Replica]:
        """Register or renew this replica for ``lease_s`` seconds; the live replicas, by
        node id (:meth:`gateway.meta.MetadataStore.renew_replica`)."""
        return await self._run(self.meta.renew_replica, replica_id, node_id, host, port, lease_s)

    async def drop_replica(self, replica_id: str) -> None:
        """Remove this replica's row (it stops)."""
        await self._run(self.meta.drop_replica, replica_id)
